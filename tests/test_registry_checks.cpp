// The generic contract: every registered variant passes the registry-wide checks (common/check.cpp) on every
// SIMD target this CPU supports, so a new variant, and a new target, is tested with no new test code.
#include <catch2/catch.hpp>

#include "common/check.hpp"
#include "common/simd.hpp"

using namespace attn;

TEST_CASE("every registered variant passes the equivalence checks on every supported SIMD target",
          "[registry][check]") {
  REQUIRE(!Registry::instance().all().empty());
  REQUIRE(Registry::instance().find("naive") != nullptr);
  for (const std::string& isa : simd::isa_info().supported) {
    for (const Attention* v : Registry::instance().all()) {
      DYNAMIC_SECTION(v->name() << " on " << isa) {
        const simd::ScopedIsa scoped(isa);
        REQUIRE(simd::active_isa() == isa);  // the kernels really run on that target
        int passed = 0;
        for (const CheckResult& r : run_checks(*v)) {
          INFO(v->name() << " [" << isa << "] " << r.check << " " << r.id << ": " << r.detail);
          CHECK(r.status != CheckStatus::failed);
          passed += r.status == CheckStatus::passed;
        }
        INFO(v->name() << " [" << isa << "]");
        CHECK(passed >= 20);  // a variant that skips everything proves nothing
      }
    }
  }
}
