// The generic contract: every registered variant passes the registry-wide checks (common/check.cpp), so a new
// variant is tested with no new test code.
#include <catch2/catch.hpp>

#include "common/check.hpp"

using namespace attn;

TEST_CASE("every registered variant passes the equivalence checks", "[registry][check]") {
  REQUIRE(!Registry::instance().all().empty());
  REQUIRE(Registry::instance().find("naive") != nullptr);
  for (const Attention* v : Registry::instance().all()) {
    int passed = 0;
    for (const CheckResult& r : run_checks(*v)) {
      INFO(v->name() << " " << r.check << " " << r.id << ": " << r.detail);
      CHECK(r.status != CheckStatus::failed);
      passed += r.status == CheckStatus::passed;
    }
    INFO(v->name());
    CHECK(passed >= 20);  // a variant that skips everything proves nothing
  }
}
