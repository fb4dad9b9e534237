// What tiled.cpp (the variant: tile sizes, work split) shares with tiled_kernels.cpp (the per-SIMD-target
// work of one query tile): the call context and the per-thread scratch.
#pragma once
#include <cstdint>
#include <vector>

#include "common/aligned.hpp"
#include "common/attention.hpp"
#include "common/dropout.hpp"

namespace attn::tiled {

// Queries are padded to a multiple of this many lanes in every tile buffer (common/simd-inl.hpp kPadLanes):
// every target's vector width divides it.
inline constexpr int64_t kLanes = 16;

inline int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

struct Tiles {
  int64_t q, kv;
};

// Per-thread scratch for one query tile (ld = the tile's query count rounded up to kLanes).
struct Scratch {
  AlignedVector<float> qt;     // [D][ld]   Q^T of the tile, times scale * log2(e)
  AlignedVector<float> s;      // [tile_kv][ld]  scores, then unnormalised probabilities
  AlignedVector<float> ot;     // [D][ld]   running output, transposed
  AlignedVector<float> stats;  // [4][ld]   running max, running sum, tile max, rescale factor
  std::vector<DropoutRow> drop;

  void ensure(int64_t ld, int64_t tile_kv, int64_t dim, bool dropout) {
    auto grow = [](AlignedVector<float>& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
    };
    grow(qt, dim * ld);
    grow(s, tile_kv * ld);
    grow(ot, dim * ld);
    grow(stats, 4 * ld);
    if (dropout) drop.resize(static_cast<std::size_t>(ld));
  }
  static std::size_t bytes(int64_t ld, int64_t tile_kv, int64_t dim, bool dropout) {
    return static_cast<std::size_t>((2 * dim + tile_kv + 4) * ld) * sizeof(float) +
           (dropout ? static_cast<std::size_t>(ld) * sizeof(DropoutRow) : 0) + sizeof(Scratch);
  }
};

// Everything one forward call shares between its tasks.
struct Context {
  const Problem& p;
  const AttentionInputs& in;
  Tiles tiles;
  float q_scale;  // scale * log2(e): the kernels exponentiate with 2^x
};

// One work unit: query tile `qi` of head `bh` against every key tile it may see, on the selected SIMD target.
void run_query_tile(const Context& c, int64_t bh, int64_t qi, Scratch& w);

}  // namespace attn::tiled
