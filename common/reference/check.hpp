// Registry-wide equivalence checks: every registered variant against its fp64 oracle, plus the properties
// its capabilities claim. The same code runs in the test suite and in `attnbench check`, so a new variant is
// checked with no new test code. Each case ends PASSED, FAILED (with what was seen) or SKIPPED (with why).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"

namespace attn {

enum class CheckStatus { passed, failed, skipped };
std::string check_status_name(CheckStatus s);

struct CheckResult {
  std::string check;  // which property, e.g. "reference", "permutation", "causal-future"
  std::string id;     // the repro string of the problem
  CheckStatus status = CheckStatus::passed;
  std::string detail;  // the error seen and the bound, or why skipped
};

// Runs every check for `variant`; `on_result` (optional) sees each result as it completes.
// A share of the cases: case k (in the fixed order run_checks makes them, counted per variant) runs when
// k % count == index. The shards of one count together run every case once (scripts/cross-test runs two
// emulated processes side by side); {0, 1} is all of them.
struct CheckShard {
  int index = 0;
  int count = 1;
};

std::vector<CheckResult> run_checks(const Attention& variant,
                                    const std::function<void(const CheckResult&)>& on_result = {},
                                    CheckShard shard = {});

}  // namespace attn
