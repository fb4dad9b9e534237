// Registry-wide equivalence checks: every registered variant against its fp64 oracle, plus the properties
// its capabilities claim. The same code runs in the test suite and in `attnbench check`, so a new variant is
// checked with no new test code. Each case ends PASSED, FAILED (with what was seen) or SKIPPED (with why).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "common/attention.hpp"

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
std::vector<CheckResult> run_checks(const Attention& variant,
                                    const std::function<void(const CheckResult&)>& on_result = {});

}  // namespace attn
