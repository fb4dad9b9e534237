// The CLI driver: global options, subcommand dispatch, and the mapping of errors to exit codes.
#include "bench/lib/command.hpp"

#include <algorithm>
#include <iostream>
#include <map>

#include "common/interface/plugin_loader.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/error.hpp"
#include "common/support/runtime.hpp"

namespace attn::cli {

std::vector<Command>& commands() {
  static std::vector<Command> list;
  return list;
}

bool register_command(std::string name, std::string help, CommandSetup setup) {
  commands().push_back({std::move(name), std::move(help), std::move(setup)});
  return true;
}

CLI::Option* add_isa_option(CLI::App& sub, std::string& name) {
  std::string supported;
  for (const auto& n : simd::isa_info().supported) supported += ", " + n;
  return sub.add_option("--isa", name,
                        "SIMD target the kernels run on: best (default; " + simd::isa_info().best + " here)" +
                            supported + " (see `attnbench info`)");
}

Json parse_cli_params(const Attention& variant, const std::vector<std::string>& kvs) {
  const auto specs = variant.param_specs();
  const std::string where = "--param for variant '" + variant.name() + "'";
  Json given = Json::object();
  for (const auto& kv : kvs) {
    const std::size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--param: expected NAME=VALUE, got '" + kv + "'");
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (given.contains(k)) throw UsageError("--param: '" + k + "' given twice");
    const auto it = std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == k; });
    given[k] = it == specs.end() ? Json(v) : parse_param_value(*it, v, where + ": parameter '" + k + "'");
  }
  return resolve_params(specs, given, where);
}

namespace {
// The --plugin paths among the global options (those before the subcommand).
std::vector<std::string> global_plugin_args(int argc, const char* const* argv) {
  std::vector<std::string> paths;
  for (int a = 1; a < argc; ++a) {
    const std::string word = argv[a];
    if (word == "--plugin" && a + 1 < argc) {
      paths.push_back(argv[++a]);
    } else if (word.rfind("--plugin=", 0) == 0) {
      paths.push_back(word.substr(9));
    } else if (word == "--threads") {
      ++a;
    } else if (!word.empty() && word[0] != '-') {
      break;  // the subcommand: global options come before it
    }
  }
  return paths;
}
}  // namespace

int run_cli(int argc, const char* const* argv) {
  CLI::App app{"attnbench: benchmark and research harness for attention variants"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads, "worker threads (default: all available)")->check(CLI::Range(0, 4096));
  std::vector<std::string> plugin_paths;
  app.add_option("--plugin", plugin_paths,
                 "load out-of-tree variants from a plugin's shared library (repeatable; also "
                 "ATTNBENCH_PLUGINS=a.so:b.so and a config's \"plugins\")");
  // Plugins load before the subcommands are set up, so their variants are known to every option and check.
  try {
    load_env_plugins();
    for (const std::string& path : global_plugin_args(argc, argv)) load_plugin(path, "--plugin");
  } catch (const std::exception& e) {
    std::cerr << "attnbench: error: " << e.what() << "\n";
    return 2;
  }
  std::map<CLI::App*, std::function<int()>> actions;
  auto& list = commands();
  std::sort(list.begin(), list.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  for (const auto& c : list) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    actions[sub] = c.setup(*sub);
  }
  // CLI11 reports an unknown subcommand only as "a subcommand is required": name it, with a suggestion.
  for (int a = 1; a < argc; ++a) {
    const std::string word = argv[a];
    if (word == "--threads" || word == "--plugin") {
      ++a;
      continue;
    }
    if (word.empty() || word[0] == '-') continue;
    std::vector<std::string> names;
    for (const auto& c : list) names.push_back(c.name);
    if (std::find(names.begin(), names.end(), word) != names.end()) break;
    std::string msg = "attnbench: error: unknown subcommand '" + word + "'";
    if (auto m = did_you_mean(word, names)) msg += " (did you mean '" + *m + "'?)";
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    std::cerr << msg << "; known: " << known << "\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    ThreadScope scope(threads);
    for (auto& [sub, action] : actions)
      if (sub->parsed()) return action();
  } catch (const UsageError& e) {
    std::cerr << "attnbench: error: " << e.what() << "\n";
    return 2;
  } catch (const NotSupported& e) {
    std::cerr << "attnbench: not supported: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "attnbench: failed: " << e.what() << "\n";
    return 1;
  }
  return 2;
}

}  // namespace attn::cli
