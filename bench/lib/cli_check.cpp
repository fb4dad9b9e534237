// `attnbench check [--variant NAME]...`: the registry-wide equivalence checks, one line per case.
#include <iostream>
#include <stdexcept>
#include <string>

#include "bench/lib/command.hpp"
#include "common/kernels/simd.hpp"
#include "common/reference/check.hpp"
#include "common/support/error.hpp"

namespace attn::cli {
namespace {

// "I/N" with 0 <= I < N: the cases k with k % N == I (common/reference/check.hpp CheckShard).
CheckShard parse_shard(const std::string& text) {
  CheckShard s;
  const auto slash = text.find('/');
  std::size_t used_i = 0, used_n = 0;
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no slash");
    s.index = std::stoi(text.substr(0, slash), &used_i);
    s.count = std::stoi(text.substr(slash + 1), &used_n);
  } catch (const std::exception&) {
    used_i = used_n = std::string::npos;
  }
  if (slash == std::string::npos || used_i != slash || used_n != text.size() - slash - 1 || s.count < 1 ||
      s.count > 1000 || s.index < 0 || s.index >= s.count)
    throw UsageError("--shard '" + text + "': expected I/N with 1 <= N <= 1000 and 0 <= I < N, e.g. 0/2");
  return s;
}

int run_check(const std::vector<std::string>& names, bool verbose, const std::string& isa,
              const std::string& shard_text) {
  const CheckShard shard = shard_text.empty() ? CheckShard{} : parse_shard(shard_text);
  simd::select_isa(isa, "--isa");
  std::vector<const Attention*> variants;
  for (const auto& n : names) variants.push_back(&Registry::instance().get(n));
  if (variants.empty()) variants = Registry::instance().all();
  int passed = 0, failed = 0, skipped = 0;
  for (const Attention* v : variants) {
    run_checks(
        *v,
        [&](const CheckResult& r) {
          (r.status == CheckStatus::passed ? passed : r.status == CheckStatus::failed ? failed : skipped)++;
          if (r.status == CheckStatus::passed && !verbose) return;
          std::cout << check_status_name(r.status) << "  " << r.check << "  " << r.id << "  " << r.detail
                    << "\n";
        },
        shard);
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
                        auto shard = std::make_shared<std::string>();
                        sub.add_option("--variant", *names, "check only this variant (repeatable)");
                        sub.add_flag("--quiet", *quiet,
                                     "print only FAILED and SKIPPED cases and the summary");
                        sub.add_option("--shard", *shard,
                                       "I/N: only the cases k with k % N == I, so N processes side by side "
                                       "run every case once (scripts/cross-test under qemu)");
                        attn::cli::add_isa_option(sub, *isa);
                        return std::function<int()>([names, quiet, isa, shard] {
                          return attn::cli::run_check(*names, !*quiet, *isa, *shard);
                        });
                      })
