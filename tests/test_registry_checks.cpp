// The generic contract: every registered variant passes the registry-wide checks (common/reference/check.cpp)
// on every SIMD target this CPU supports, so a new variant, and a new target, is tested with no new test
// code. One test case per variant (tests/support/variant_tests.hpp): `ctest -R tiled` runs tiled's checks
// alone.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/kernels/simd.hpp"
#include "common/reference/check.hpp"
#include "tests/support/variant_tests.hpp"

using namespace attn;

namespace {
constexpr const char* kChecksTitle = "{} passes the equivalence checks on every supported SIMD target";
}

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
  for (const std::string& isa : simd::isa_info().supported) {
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
