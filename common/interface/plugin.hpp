// Registration inside a plugin: an out-of-tree variant library built with attnbench_add_variant (issue #29,
// README "Benchmark your own attention"). attention.hpp includes this header when ATTNBENCH_PLUGIN is
// defined, so a plugin's source is written exactly as a built-in variant's: one class, one
// ATTN_REGISTER_VARIANT(Class) line.
//
// In a plugin the macro does not touch attnbench's registry: it records a factory in the plugin's own list
// (hidden, so two plugins never share it). attnbench's loader (plugin_loader.hpp) first reads the plugin's
// ABI marker from the file, refuses a plugin built against another ABI before running any of its code
// beyond static initialisers, then creates the variants through the C entry points (plugin_entry.hpp) and
// registers them under their own names, refusing a name that is already taken.
#pragma once
#include <memory>

#include "common/interface/plugin_abi.hpp"

namespace attn {
class Attention;
namespace plugin {
using Factory = std::unique_ptr<Attention> (*)();
// Appends a factory to this plugin's list (defined in plugin_entry.hpp, compiled once into each plugin).
__attribute__((visibility("hidden"))) bool add_factory(Factory make);
}  // namespace plugin
}  // namespace attn

#define ATTN_REGISTER_VARIANT(Class)                                                                 \
  namespace {                                                                                        \
  [[maybe_unused]] const bool ATTN_CONCAT(attn_registered_, __LINE__) = ::attn::plugin::add_factory( \
      []() -> std::unique_ptr<::attn::Attention> { return std::make_unique<Class>(); });             \
  }
