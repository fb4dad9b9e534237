// `attnbench check [--variant NAME]...`: the registry-wide equivalence checks, one line per case.
#include <iostream>

#include "bench/lib/command.hpp"
#include "common/check.hpp"
#include "common/simd.hpp"

namespace attn::cli {
namespace {

int run_check(const std::vector<std::string>& names, bool verbose, const std::string& isa) {
  simd::select_isa(isa, "--isa");
  std::vector<const Attention*> variants;
  for (const auto& n : names) variants.push_back(&Registry::instance().get(n));
  if (variants.empty()) variants = Registry::instance().all();
  int passed = 0, failed = 0, skipped = 0;
  for (const Attention* v : variants) {
    run_checks(*v, [&](const CheckResult& r) {
      (r.status == CheckStatus::passed ? passed : r.status == CheckStatus::failed ? failed : skipped)++;
      if (r.status == CheckStatus::passed && !verbose) return;
      std::cout << check_status_name(r.status) << "  " << r.check << "  " << r.id << "  " << r.detail << "\n";
    });
  }
  std::cout << "SIMD target: " << simd::active_isa() << " (--isa " << isa << ")\n";
  std::cout << passed << " passed, " << failed << " failed, " << skipped << " skipped\n";
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND("check",
                      "run the registry-wide equivalence checks (PASSED / FAILED / SKIPPED per case)",
                      [](CLI::App& sub) {
                        auto names = std::make_shared<std::vector<std::string>>();
                        auto quiet = std::make_shared<bool>(false);
                        auto isa = std::make_shared<std::string>("best");
                        sub.add_option("--variant", *names, "check only this variant (repeatable)");
                        sub.add_flag("--quiet", *quiet,
                                     "print only FAILED and SKIPPED cases and the summary");
                        attn::cli::add_isa_option(sub, *isa);
                        return std::function<int()>(
                            [names, quiet, isa] { return attn::cli::run_check(*names, !*quiet, *isa); });
                      })
