// Loading out-of-tree variants (plugins, issue #29): `attnbench --plugin PATH.so`,
// ATTNBENCH_PLUGINS=a.so:b.so, a sweep config's "plugins" list, attnbench.load_plugin(path) in Python. A
// plugin is a shared library built with attnbench_add_variant (README "Benchmark your own attention"); its
// variants join the registry under their own names and are listed, checked, swept, benchmarked, plotted and
// compared like built-in ones.
//
// What the loader refuses, each a UsageError naming the path (exit 2 from the CLI), leaving the registry as
// it was: a missing file; a file that is not a plugin (no ABI marker); a plugin built against another ABI
// (naming both versions; refused before the library is loaded); a library dlopen refuses; a plugin with no
// variant; a variant whose name is taken (naming both libraries) or whose defaults do not validate.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "common/interface/params.hpp"

namespace attn {

struct PluginInfo {
  std::string path;                   // absolute, symlinks resolved
  std::string hash;                   // "fnv1a64:<16 hex digits>" of the file's bytes
  int abi = 0;                        // the plugin ABI it was built against (== ATTNBENCH_ABI_VERSION)
  std::string built_against;          // the attnbench version it was built against, from its marker
  std::vector<std::string> variants;  // the names it registered, sorted
  double load_ms = 0;  // reading and hashing the file, dlopen, creating and registering the variants
};

// Loads the plugin at `path` (nothing happens when the same file is loaded already) and returns what it
// registered. `where` names the source in messages ("--plugin", "ATTNBENCH_PLUGINS", a config file's
// "plugins" ...). Every loaded plugin is appended to this process's ATTNBENCH_PLUGINS, so an attnbench
// started from this one (a shard, a worker) loads the same variants.
const PluginInfo& load_plugin(const std::string& path, const std::string& where = "--plugin");
// Loads each path of ATTNBENCH_PLUGINS (':'-separated; empty entries skipped).
void load_env_plugins();
// Every plugin loaded so far, in loading order.
std::vector<PluginInfo> loaded_plugins();
// The plugin `variant` came from; nullptr for a built-in variant (or an unknown name).
const PluginInfo* plugin_of(std::string_view variant);
// Where `variant` comes from, for rows and messages: "path (fnv1a64:...)" of its plugin, "" when built in.
std::string plugin_source(std::string_view variant);
// One plugin as meta.json and attnbench.load_plugin show it: {path, hash, abi, built_against, variants,
// load_ms}.
Json plugin_json(const PluginInfo& p);
// meta.json's "plugins": plugin_json of each loaded plugin (empty when none is loaded).
Json plugins_json();

}  // namespace attn
