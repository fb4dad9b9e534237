// The plugin ABI version (common/interface/plugin_abi.hpp) moves with the headers a plugin compiles against.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "common/interface/plugin_abi.hpp"
#include "common/io/npy.hpp"
#include "common/support/hash.hpp"

namespace {

// The headers a plugin compiles against, in a fixed order.
const char* const kAbiHeaders[] = {"attention.hpp", "problem.hpp",    "params.hpp", "half.hpp",
                                   "util.hpp",      "plugin_abi.hpp", "plugin.hpp", "plugin_entry.hpp"};

uint64_t abi_headers_hash() {
  uint64_t h = attn::kFnvOffsetBasis;
  for (const char* name : kAbiHeaders)
    h = attn::fnv1a64(attn::read_file_bytes(std::string(ATTN_SOURCE_DIR) + "/common/interface/" + name), h);
  return h;
}

}  // namespace

TEST_CASE("the plugin ABI version is bumped when the plugin-facing headers change", "[plugin]") {
  // Update both together: the version in plugin_abi.hpp (bump) and this hash (the value printed on failure).
  // An edit that changes no layout, signature or exported symbol (a comment; plugin_entry.hpp's marker
  // declared once instead of twice, for GCC's -Wattributes) stores the new hash alone, and its commit says
  // so.
  constexpr int kVersion = 3;
  constexpr uint64_t kHeadersHash = 0x39f2220686583669ULL;
  char printed[32];
  std::snprintf(printed, sizeof printed, "0x%016llx", static_cast<unsigned long long>(abi_headers_hash()));
  INFO("the headers hash to " << printed << ": bump ATTNBENCH_ABI_VERSION and store the new hash here");
  CHECK(ATTNBENCH_ABI_VERSION == kVersion);
  CHECK(abi_headers_hash() == kHeadersHash);
}
