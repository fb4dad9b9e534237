// Catch2 entry point for the attnbench test suite: registers the per-variant test cases
// (tests/support/variant_tests.hpp) once every variant has registered, then runs Catch. Also holds the rule
// every test case name follows so that ctest runs it (catch_discover_tests in CMakeLists.txt).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <iostream>
#include <string>

#include "common/interface/attention.hpp"
#include "common/support/runtime.hpp"
#include "tests/support/variant_tests.hpp"

int main(int argc, char* argv[]) {
  attn::reexec_with_blas_core(argv);  // the suite's sgemm at this CPU's width (tests run naive a lot)
  // --list-variants: the registered variants, one per line (scripts/sanitize takes the TSan run's tags from
  // them: the TSan build has no attnbench executable to ask).
  if (argc == 2 && std::string(argv[1]) == "--list-variants") {
    for (const std::string& name : attn::Registry::instance().names()) std::cout << name << '\n';
    return 0;
  }
  attn::test::register_variant_tests();
  return Catch::Session().run(argc, argv);
}

TEST_CASE("every test case name can be run by name from ctest", "[suite]") {
  // catch_discover_tests turns each name into a ctest test that runs `attn_tests NAME` (escaping ',', '['
  // and ']'). A ';' splits the name in two (CMake's list separator), a '\' escapes the next character for
  // Catch, and a leading '-' or '~' or "exclude:" makes it an option or a negation: such a test would match
  // nothing and never run (ctest passes --warn NoTests, so it would fail instead). Write ',' or "and".
  for (const Catch::TestCase& t : Catch::getRegistryHub().getTestCaseRegistry().getAllTests()) {
    const std::string& name = t.getTestCaseInfo().name;
    INFO("test case '" << name << "'");
    CHECK(name.find_first_of(";\\") == std::string::npos);
    CHECK_FALSE(name.empty());
    if (!name.empty()) CHECK(name.front() != '-');
    if (!name.empty()) CHECK(name.front() != '~');
    CHECK(name.rfind("exclude:", 0) != 0);
  }
}
