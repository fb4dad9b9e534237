// The C entry points of a plugin: compiled into each plugin exactly once (attnbench_add_variant generates a
// source file that includes this header; nothing else may include it). The loader (plugin_loader.hpp) reads
// the marker from the file before loading it, so a plugin built against another ABI is refused naming both
// versions instead of crashing; then it calls the functions below.
//
// The stable part, which no ABI version changes: the marker's text "attnbench-plugin-abi:<N>;attnbench=<V>;"
// and the three functions' C signatures.
#pragma once
#ifndef ATTNBENCH_PLUGIN
#error "plugin_entry.hpp belongs to plugins only (attnbench_add_variant defines ATTNBENCH_PLUGIN)"
#endif
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"

// The attnbench version the plugin is built against (attnbench_add_variant defines it from the package).
#ifndef ATTNBENCH_BUILT_AGAINST
#define ATTNBENCH_BUILT_AGAINST "unknown"
#endif
#define ATTNBENCH_STR_INNER(x) #x
#define ATTNBENCH_STR(x) ATTNBENCH_STR_INNER(x)
#define ATTNBENCH_PLUGIN_EXPORT __attribute__((visibility("default"), used))

namespace attn::plugin {
namespace {
std::vector<Factory>& factories() {
  static std::vector<Factory> list;
  return list;
}
thread_local std::string last_error;
}  // namespace

bool add_factory(Factory make) {
  factories().push_back(make);
  return true;
}
}  // namespace attn::plugin

extern "C" {
// Read from the file by the loader (never through dlsym): the ABI version and the attnbench version.
// `extern` on the definition itself gives the const array external linkage (a separate declaration made
// GCC ignore the attributes on one of the two).
ATTNBENCH_PLUGIN_EXPORT extern const char attnbench_plugin_marker[] =
    "attnbench-plugin-abi:" ATTNBENCH_STR(ATTNBENCH_ABI_VERSION) ";attnbench=" ATTNBENCH_BUILT_AGAINST ";";

ATTNBENCH_PLUGIN_EXPORT int attnbench_plugin_abi(void) {
  return ATTNBENCH_ABI_VERSION;
}

ATTNBENCH_PLUGIN_EXPORT int attnbench_plugin_variant_count(void) {
  return static_cast<int>(attn::plugin::factories().size());
}

// Creates variant i (0 <= i < count): returns an attn::Attention* the caller owns, or null with the reason
// in *error (a constructor that threw; the text lives until the thread's next call).
ATTNBENCH_PLUGIN_EXPORT void* attnbench_plugin_create_variant(int i, const char** error) {
  using attn::plugin::last_error;
  *error = nullptr;
  try {
    if (i < 0 || i >= attnbench_plugin_variant_count())
      throw std::out_of_range("no variant #" + std::to_string(i));
    return attn::plugin::factories()[static_cast<std::size_t>(i)]().release();
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "an exception that is not a std::exception";
  }
  *error = last_error.c_str();
  return nullptr;
}
}
