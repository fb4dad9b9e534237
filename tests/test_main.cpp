// Catch2 entry point for the attnbench test suite: registers the per-variant test cases
// (tests/support/variant_tests.hpp) once every variant has registered, then runs Catch.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/support/variant_tests.hpp"

int main(int argc, char* argv[]) {
  attn::test::register_variant_tests();
  return Catch::Session().run(argc, argv);
}
