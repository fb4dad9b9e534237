// linformer's fixed random projections E, F ∈ R^(k×n): entries N(0, 1/k) (the paper's experiments), drawn
// with common/support/random.hpp from the variant's `seed`. Shared by the variant, its fp64 reference and its
// tests, so all three see the same fp32 values.
#pragma once
#include <tbb/parallel_for.h>

#include <cmath>
#include <cstdint>

#include "common/support/hash.hpp"
#include "common/support/random.hpp"

namespace attn::linformer {

// E projects the keys, F the values: different streams of the same seed.
enum class Stream : uint64_t { keys = 0, values = 1 };

// Every row of E and F has its own Rng stream, so rows are drawn in parallel (fixed units: one row each) and
// row r is the same whatever the thread count, k or n (a longer sequence extends each row, it does not
// reshuffle the draws).
inline uint64_t row_seed(uint64_t seed, Stream stream, int64_t row) {
  return mix64(mix64(mix64(seed ^ 0x4c696e666f726d65ULL) ^ static_cast<uint64_t>(stream)) ^
               static_cast<uint64_t>(row));
}

// out[r * n + j] = E_rj (or F_rj) for r < k, j < n, as fp32 (the fp64 draw times 1/sqrt(k), rounded once).
inline void fill_projection(uint64_t seed, Stream stream, int64_t k, int64_t n, float* out) {
  const double stddev = 1.0 / std::sqrt(static_cast<double>(k));
  tbb::parallel_for(int64_t{0}, k, [&](int64_t r) {
    Rng rng(row_seed(seed, stream, r));
    float* row = out + r * n;
    for (int64_t j = 0; j < n; ++j) row[j] = static_cast<float>(stddev * rng.normal());
  });
}

}  // namespace attn::linformer
