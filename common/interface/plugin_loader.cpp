// The plugin loader (plugin_loader.hpp): marker check, dlopen, the C entry points, registration.
#include "common/interface/plugin_loader.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>

#include "common/interface/attention.hpp"
#include "common/interface/plugin_abi.hpp"
#include "common/io/npy.hpp"
#include "common/support/error.hpp"
#include "common/support/hash.hpp"

#ifndef ATTN_PROJECT_VERSION
#define ATTN_PROJECT_VERSION "unknown"
#endif

namespace attn {
namespace {

// Loaded plugins never move (plugin_of hands out pointers) and are never unloaded: their code backs
// registered variants until the process ends.
struct Loaded {
  std::mutex mutex;
  std::deque<PluginInfo> plugins;
};
Loaded& loaded() {
  static Loaded l;
  return l;
}

// The marker plugin_entry.hpp puts into every plugin: "attnbench-plugin-abi:<N>;attnbench=<V>;". The key is
// assembled at run time so that this library's own bytes never contain it (attnbench itself is no plugin).
struct Marker {
  bool found = false;
  int abi = -1;
  std::string version;
};
Marker find_marker(const std::string& bytes) {
  const std::string key = std::string("attnbench-plugin") + "-abi:";
  Marker m;
  for (std::size_t at = bytes.find(key); at != std::string::npos; at = bytes.find(key, at + 1)) {
    std::size_t i = at + key.size();
    int abi = 0, digits = 0;
    while (i < bytes.size() && bytes[i] >= '0' && bytes[i] <= '9' && digits < 9)
      abi = abi * 10 + (bytes[i++] - '0'), ++digits;
    const std::string tag = ";attnbench=";
    if (digits == 0 || bytes.compare(i, tag.size(), tag) != 0) continue;
    const std::size_t end = bytes.find(';', i + tag.size());
    if (end == std::string::npos || end - (i + tag.size()) > 200) continue;
    m.found = true;
    m.abi = abi;
    m.version = bytes.substr(i + tag.size(), end - (i + tag.size()));
    return m;
  }
  return m;
}

// The file that holds the built-in variants: this executable, or the Python module.
std::string builtin_library() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&builtin_library), &info) && info.dli_fname && *info.dli_fname) {
    std::error_code ec;
    const auto p = std::filesystem::canonical(info.dli_fname, ec);
    return ec ? std::string(info.dli_fname) : p.string();
  }
  return "attnbench";
}

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool valid_variant_name(const std::string& n) {
  return !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

void append_to_env(const std::string& path) {
  const char* cur = std::getenv("ATTNBENCH_PLUGINS");
  std::string list = cur ? cur : "";
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(':', start), list.size());
    if (list.compare(start, end - start, path) == 0 && end - start == path.size()) return;
    start = end + 1;
  }
  setenv("ATTNBENCH_PLUGINS", (list.empty() ? path : list + ":" + path).c_str(), 1);
}

using AbiFn = int (*)();
using CountFn = int (*)();
using CreateFn = void* (*)(int, const char**);

// The variants of a dlopen'ed plugin, created and checked (names, defaults) before any is registered, so a
// refused plugin registers nothing.
std::vector<std::unique_ptr<Attention>> create_variants(void* handle, const std::string& where) {
  const auto abi = reinterpret_cast<AbiFn>(dlsym(handle, "attnbench_plugin_abi"));
  const auto count = reinterpret_cast<CountFn>(dlsym(handle, "attnbench_plugin_variant_count"));
  const auto create = reinterpret_cast<CreateFn>(dlsym(handle, "attnbench_plugin_create_variant"));
  if (!abi || !count || !create)
    throw UsageError(where +
                     ": not an attnbench plugin (it has the ABI marker but lacks the entry points "
                     "attnbench_plugin_abi, attnbench_plugin_variant_count, "
                     "attnbench_plugin_create_variant; build it with attnbench_add_variant)");
  if (abi() != ATTNBENCH_ABI_VERSION)
    throw UsageError(where + ": its entry point reports plugin ABI " + std::to_string(abi()) +
                     ", this attnbench has ABI " + std::to_string(ATTNBENCH_ABI_VERSION) + ": rebuild it");
  const int n = count();
  if (n <= 0)
    throw UsageError(where + ": the plugin registers no variant (no ATTN_REGISTER_VARIANT(Class) line was " +
                     "linked into it)");
  std::vector<std::unique_ptr<Attention>> made;
  for (int i = 0; i < n; ++i) {
    const char* error = nullptr;
    std::unique_ptr<Attention> v(static_cast<Attention*>(create(i, &error)));
    if (!v)
      throw UsageError(where + ": creating its variant #" + std::to_string(i) +
                       " failed: " + (error ? error : "no reason given"));
    made.push_back(std::move(v));
  }
  const std::string builtin = builtin_library();
  for (std::size_t i = 0; i < made.size(); ++i) {
    const std::string name = made[i]->name();
    if (!valid_variant_name(name))
      throw UsageError(where + ": variant name '" + name +
                       "' is not allowed (1 to 64 characters from A-Z a-z 0-9 _ - .)");
    for (std::size_t j = 0; j < i; ++j)
      if (made[j]->name() == name) throw UsageError(where + ": registers variant '" + name + "' twice");
    if (Registry::instance().find(name)) {
      const PluginInfo* other = plugin_of(name);
      throw UsageError(where + ": variant '" + name + "' clashes with the variant of that name " +
                       (other ? "from plugin '" + other->path + "'" : "built into '" + builtin + "'") +
                       "; rename the plugin's variant (Attention::name())");
    }
    try {
      resolve_params(made[i]->param_specs(), Json::object(), "variant '" + name + "' defaults");
    } catch (const std::exception& e) {
      throw UsageError(where + ": " + e.what());
    }
  }
  return made;
}

}  // namespace

const PluginInfo& load_plugin(const std::string& given, const std::string& where_prefix) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string where = where_prefix + " '" + given + "'";
  std::error_code ec;
  if (given.empty()) throw UsageError(where_prefix + ": empty plugin path");
  if (!std::filesystem::is_regular_file(given, ec))
    throw UsageError(where +
                     ": no such file (expected the path of a plugin's shared library, e.g. libmyattn.so)");
  const std::string path = std::filesystem::canonical(given, ec).string();
  if (ec) throw UsageError(where + ": cannot resolve the path (" + ec.message() + ")");
  // The whole file is read (for the marker and the hash): a shared library of a variant is far below this.
  constexpr std::uintmax_t kMaxBytes = std::uintmax_t{1} << 30;
  if (const auto size = std::filesystem::file_size(path, ec); ec || size > kMaxBytes)
    throw UsageError(where + ": " +
                     (ec ? "cannot read its size (" + ec.message() + ")"
                         : std::to_string(size) + " bytes, above the 1 GiB a plugin may have"));
  Loaded& l = loaded();
  std::lock_guard lock(l.mutex);
  for (const PluginInfo& p : l.plugins)
    if (p.path == path) return p;
  const std::string bytes = read_file_bytes(path);
  const Marker m = find_marker(bytes);
  if (!m.found)
    throw UsageError(where + ": not an attnbench plugin (no plugin ABI marker in the file; build it with " +
                     "attnbench_add_variant: README, 'Benchmark your own attention')");
  if (m.abi != ATTNBENCH_ABI_VERSION)
    throw UsageError(where + ": built against attnbench " + m.version + " (plugin ABI " +
                     std::to_string(m.abi) + "); this is attnbench " + ATTN_PROJECT_VERSION +
                     " (plugin ABI " + std::to_string(ATTNBENCH_ABI_VERSION) +
                     "): rebuild the plugin against this attnbench");
  // RTLD_LOCAL: a plugin's own symbols stay its own (two plugins may define the same helper); it binds to
  // attnbench's exported symbols (the registry, the kernels) for what it uses of ours.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    throw UsageError(where + ": cannot load it (" + std::string(err ? err : "dlopen failed") +
                     "); a symbol missing here usually means it was built against another attnbench");
  }
  std::vector<std::unique_ptr<Attention>> made;
  try {
    made = create_variants(handle, where);
  } catch (...) {
    // Its variants are gone (their destructors ran above); nothing of it is registered, so it may go.
    dlclose(handle);
    throw;
  }
  PluginInfo info;
  info.path = path;
  info.hash = "fnv1a64:" + hex64(fnv1a64(bytes));
  info.abi = m.abi;
  info.built_against = m.version;
  for (auto& v : made) {
    info.variants.push_back(v->name());
    Registry::instance().add(std::move(v));
  }
  std::sort(info.variants.begin(), info.variants.end());
  info.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  l.plugins.push_back(std::move(info));
  append_to_env(path);
  return l.plugins.back();
}

void load_env_plugins() {
  const char* env = std::getenv("ATTNBENCH_PLUGINS");
  if (!env) return;
  const std::string list = env;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(':', start), list.size());
    if (end > start) load_plugin(list.substr(start, end - start), "ATTNBENCH_PLUGINS");
    start = end + 1;
  }
}

std::vector<PluginInfo> loaded_plugins() {
  Loaded& l = loaded();
  std::lock_guard lock(l.mutex);
  return {l.plugins.begin(), l.plugins.end()};
}

const PluginInfo* plugin_of(std::string_view variant) {
  for (const PluginInfo& p : loaded().plugins)
    if (std::find(p.variants.begin(), p.variants.end(), variant) != p.variants.end()) return &p;
  return nullptr;
}

std::string plugin_source(std::string_view variant) {
  const PluginInfo* p = plugin_of(variant);
  return p ? p->path + " (" + p->hash + ")" : "";
}

Json plugin_json(const PluginInfo& p) {
  return {{"path", p.path},         {"hash", p.hash},      {"abi", p.abi}, {"built_against", p.built_against},
          {"variants", p.variants}, {"load_ms", p.load_ms}};
}

Json plugins_json() {
  Json list = Json::array();
  for (const PluginInfo& p : loaded_plugins()) list.push_back(plugin_json(p));
  return list;
}

}  // namespace attn
