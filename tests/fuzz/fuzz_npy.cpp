// libFuzzer target: the .npy reader (common/io/npy.cpp) on arbitrary bytes, through every public parse
// function (float32, float64-as-double, mask). A UsageError is the expected answer to a bad file; any other
// exception, a crash, a sanitizer report or an allocation beyond -malloc_limit_mb is a finding. A file that
// parses as float must also survive a write/read round trip unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/io/npy.hpp"
#include "common/support/error.hpp"

namespace {

// A broken invariant (not a rejected input): abort so libFuzzer keeps the input as a crash.
void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_npy: invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const std::string what = "fuzz.npy";
  try {
    const attn::NpyHeader h = attn::parse_npy_header(bytes, what);
    require(h.data_offset <= bytes.size(), "data offset inside the file");
  } catch (const attn::UsageError&) {
  }
  try {
    const attn::FloatArray a = attn::parse_npy_float(bytes, what);
    require(a.numel() == attn::FloatArray::count(a.shape), "element count matches the shape");
    // What we write must read back to the same shape and bits.
    const attn::FloatArray b = attn::parse_npy_float(attn::npy_bytes(a), "round trip");
    require(b.shape == a.shape, "round trip keeps the shape");
    require(a.numel() == 0 || std::memcmp(a.ptr(), b.ptr(), a.numel() * sizeof(float)) == 0,
            "round trip keeps the values");
  } catch (const attn::UsageError&) {
  }
  try {
    const attn::DoubleArray a = attn::parse_npy_double(bytes, what);
    require(a.numel() == attn::DoubleArray::count(a.shape), "element count matches the shape");
  } catch (const attn::UsageError&) {
  }
  try {
    const attn::ByteArray m = attn::parse_npy_mask(bytes, what);
    require(m.numel() == attn::ByteArray::count(m.shape), "element count matches the shape");
    for (std::size_t i = 0; i < m.numel(); ++i) require(m.data[i] <= 1, "mask values are 0 or 1");
  } catch (const attn::UsageError&) {
  }
  return 0;
}
