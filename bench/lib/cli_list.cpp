// `attnbench list [--json]`: every registered variant with its capabilities and parameters (and, for a
// plugin's variant, the plugin's file and hash).
#include <iostream>

#include "bench/lib/command.hpp"

namespace attn::cli {
namespace {

int list_variants(bool as_json) {
  const Json all = variants_json();
  if (as_json) {
    std::cout << all.dump(2) << "\n";
    return 0;
  }
  for (const auto& v : all) {
    std::cout << v["name"].get<std::string>() << ": " << v["description"].get<std::string>()
              << "\n  supports:";
    for (auto it = v["capabilities"].begin(); it != v["capabilities"].end(); ++it)
      if (it.value().is_boolean() ? it.value().get<bool>() : it.value() != "none")
        std::cout << " " << it.key() << (it.value().is_boolean() ? "" : "=" + it.value().get<std::string>());
    std::cout << "\n";
    if (const std::string plugin = v.value("plugin", ""); !plugin.empty())
      std::cout << "  plugin: " << plugin << "\n";
    for (const auto& p : v["params"])
      std::cout << "  --param " << p["name"].get<std::string>() << "=<" << p["type"].get<std::string>()
                << "> (default " << p["default"].dump() << "): " << p["help"].get<std::string>() << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND("list", "list registered variants with capabilities and parameters", [](CLI::App& sub) {
  auto as_json = std::make_shared<bool>(false);
  sub.add_flag("--json", *as_json, "machine-readable output");
  return std::function<int()>([as_json] { return attn::cli::list_variants(*as_json); });
})
