// Catch2 entry point for the attnbench test suite.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
