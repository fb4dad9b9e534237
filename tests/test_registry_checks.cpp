// The generic contract: every registered variant passes the registry-wide checks (common/reference/check.cpp)
// on every SIMD target this CPU supports, so a new variant, and a new target, is tested with no new test
// code. One test case per variant (tests/support/variant_tests.hpp): `ctest -R tiled` runs tiled's checks
// alone.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/kernels/simd.hpp"
#include "common/reference/check.hpp"
#include "tests/support/variant_tests.hpp"

using namespace attn;

namespace {
constexpr const char* kChecksTitle = "{} passes the equivalence checks on every supported SIMD target";

// The targets to run: every supported one, or the one ATTN_TEST_ISA names ("best": the best supported).
// scripts/sanitize's TSan run sets it to best: the kernels' parallel loops (what TSan checks) are the same on
// every target, and TSan runs each target's checks ~5x slower than release.
std::vector<std::string> isas_to_check() {
  const char* only = std::getenv("ATTN_TEST_ISA");
  if (only == nullptr || *only == '\0') return simd::isa_info().supported;
  const std::string name = std::string(only) == "best" ? simd::isa_info().best : std::string(only);
  const auto& supported = simd::isa_info().supported;
  if (std::find(supported.begin(), supported.end(), name) == supported.end())
    FAIL("ATTN_TEST_ISA=" << only << " is not a target this CPU supports (best or one of the supported)");
  return {name};
}
}  // namespace

TEST_CASE("the registry holds the variants, and each has its own equivalence-check test case", "[registry]") {
  REQUIRE(!Registry::instance().all().empty());
  REQUIRE(Registry::instance().find("naive") != nullptr);
  // register_variant_tests() (called by main) made one test case per registered variant.
  std::vector<std::string> tests;
  for (const Catch::TestCase& t : Catch::getRegistryHub().getTestCaseRegistry().getAllTests())
    tests.push_back(t.getTestCaseInfo().name);
  for (const std::string& name : Registry::instance().names()) {
    INFO(name);
    CHECK(std::count(tests.begin(), tests.end(), test::variant_test_name(kChecksTitle, name)) == 1);
  }
}

TEST_CASE_PER_VARIANT(kChecksTitle, "[registry][check]") {
  for (const std::string& isa : isas_to_check()) {
    DYNAMIC_SECTION(variant.name() << " on " << isa) {
      const simd::ScopedIsa scoped(isa);
      REQUIRE(simd::active_isa() == isa);  // the kernels really run on that target
      int passed = 0;
      for (const CheckResult& r : run_checks(variant)) {
        INFO(variant.name() << " [" << isa << "] " << r.check << " " << r.id << ": " << r.detail);
        CHECK(r.status != CheckStatus::failed);
        passed += r.status == CheckStatus::passed;
      }
      INFO(variant.name() << " [" << isa << "]");
      CHECK(passed >= 20);  // a variant that skips everything proves nothing
    }
  }
}
