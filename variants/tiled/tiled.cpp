// tiled: exact softmax attention, FlashAttention-style: query x key tiles, a running max and sum per query,
// the output rescaled when the max moves and divided once at the end. O(n) memory, no score matrix.
#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <utility>

#include "common/aligned.hpp"
#include "common/attention.hpp"
#include "common/dropout.hpp"
#include "common/mask.hpp"
#include "variants/tiled/kernels.hpp"

namespace attn::tiled {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Register blocking of the two micro-kernels (kernels.hpp): 8 rows x 2 vectors of 16 queries = 16
// accumulators, enough to cover FMA latency x throughput (4 cycles x two 512-bit FMAs per cycle on this
// machine's cores, measured). 8 rows divide head_dim 64 and key tiles of 512 exactly, so no tail kernels run
// on the common shapes; in isolation (L2-resident 128 x 512 x 64 tiles, one thread) this ran 2-3% faster
// than 6 x 4 plus its tails, at 206-215 GFLOP/s per core.
constexpr int kScoreRows = 8, kScoreVecs = 2;
constexpr int kPvRows = 8, kPvVecs = 2;

using ScoreFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, float*);
using PvFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, const float*);

// Kernel tables indexed [vectors - 1][rows - 1], so row and lane tails use a kernel of exactly their size.
template <int NV, int... R>
constexpr std::array<ScoreFn, sizeof...(R)> score_row(std::integer_sequence<int, R...>) {
  return {&score_kernel<R + 1, NV>...};
}
template <int... V>
constexpr auto score_table(std::integer_sequence<int, V...>) {
  return std::array{score_row<V + 1>(std::make_integer_sequence<int, kScoreRows>())...};
}
template <int NV, int... R>
constexpr std::array<PvFn, sizeof...(R)> pv_row(std::integer_sequence<int, R...>) {
  return {&pv_kernel<R + 1, NV>...};
}
template <int... V>
constexpr auto pv_table(std::integer_sequence<int, V...>) {
  return std::array{pv_row<V + 1>(std::make_integer_sequence<int, kPvRows>())...};
}
constexpr auto kScoreKernels = score_table(std::make_integer_sequence<int, kScoreVecs>());
constexpr auto kPvKernels = pv_table(std::make_integer_sequence<int, kPvVecs>());

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// The L2 size in bytes (1 MiB if the system does not say): the working set of one query tile is sized to it.
int64_t l2_bytes() {
  static const int64_t bytes = [] {
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? static_cast<int64_t>(v) : int64_t{1} << 20;
  }();
  return bytes;
}

struct Tiles {
  int64_t q, kv;
};

// Tile sizes: the user's, or ONNX Runtime MLAS's rule from the cache size (ANCHORS.md): key tile =
// L2 / 4 bytes / 4 / (dk + dv), query tile = min(key tile, dk + dv) capped at 128. For d = 64 and a 1 MiB L2
// that is 128 x 512: the score tile (256 KiB), the K and V tiles (128 KiB each) and Q^T, O^T (32 KiB each)
// stay in L2, and the 8 KiB Q^T panel one micro-kernel sweep reads stays in L1. Both are clipped to the
// sequence so short problems do not pad.
Tiles choose_tiles(const Problem& p) {
  const int64_t dkv = 2 * p.head_dim;
  int64_t kv = p.param_int("tile_kv"), q = p.param_int("tile_q");
  if (kv == 0) kv = std::clamp<int64_t>(l2_bytes() / 16 / dkv / kLanes * kLanes, 32, 2048);
  if (q == 0) q = std::clamp<int64_t>(round_up(std::min(kv, dkv), kLanes), kLanes, 128);
  return {std::min(q, p.seq_q), std::min(kv, p.seq_kv)};
}

// Per-thread scratch for one query tile (ld = the tile's query count rounded up to 16 lanes).
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

// S^T (nk x ld) = K_tile Q^T; colmax (if given) receives the per-query maxima.
void score_tile(const float* k, int64_t dim, const float* qt, int64_t ld, int64_t nk, float* s,
                float* colmax) {
  for (int64_t c0 = 0; c0 < ld; c0 += kScoreVecs * kLanes) {
    const int64_t nv = std::min<int64_t>(kScoreVecs, (ld - c0) / kLanes);
    for (int64_t r0 = 0; r0 < nk; r0 += kScoreRows) {
      const int64_t mr = std::min<int64_t>(kScoreRows, nk - r0);
      kScoreKernels[nv - 1][mr - 1](k + r0 * dim, dim, qt + c0, ld, dim, s + r0 * ld + c0, ld,
                                    colmax ? colmax + c0 : nullptr);
    }
  }
}

// O^T (dim x ld) = alpha * O^T + V_tile^T P^T.
void pv_tile(const float* v, int64_t dim, const float* s, int64_t ld, int64_t nk, float* ot,
             const float* alpha) {
  for (int64_t c0 = 0; c0 < ld; c0 += kPvVecs * kLanes) {
    const int64_t nv = std::min<int64_t>(kPvVecs, (ld - c0) / kLanes);
    for (int64_t d0 = 0; d0 < dim; d0 += kPvRows) {
      const int64_t mr = std::min<int64_t>(kPvRows, dim - d0);
      kPvKernels[nv - 1][mr - 1](v + d0, dim, s + c0, ld, nk, ot + d0 * ld + c0, ld, alpha + c0);
    }
  }
}

// Sets masked scores of one tile to -inf: keys [j0, j0 + nk) against queries [i0, i0 + nq).
void mask_tile(const Context& c, int64_t b, int64_t i0, int64_t nq, int64_t j0, int64_t nk, float* s,
               int64_t ld) {
  const Problem& p = c.p;
  if (p.mask.causal && j0 + nk - 1 > i0) {
    // Key j is hidden from queries i < j: lanes [0, j - i0) of row j.
    for (int64_t j = 0; j < nk; ++j) {
      const int64_t hidden = j0 + j - i0;
      for (int64_t c0 = 0; c0 < ld && c0 < hidden; c0 += kLanes)
        v_store(s + j * ld + c0, v_set_low_lanes(v_load(s + j * ld + c0), hidden - c0, kNegInf));
    }
  }
  if (p.mask.key_padding) {
    const uint8_t* pad = c.in.key_padding + b * p.seq_kv + j0;
    for (int64_t j = 0; j < nk; ++j)
      if (pad[j]) std::fill(s + j * ld, s + (j + 1) * ld, kNegInf);
  }
  if (p.mask.boolean) {
    for (int64_t i = 0; i < nq; ++i) {
      const uint8_t* allowed = c.in.mask + (i0 + i) * p.seq_kv + j0;
      for (int64_t j = 0; j < nk; ++j)
        if (!allowed[j]) s[j * ld + i] = kNegInf;
    }
  }
}

// The online-softmax step for one key tile: new running max, rescale factor alpha = 2^(m_old - m_new),
// s = 2^(s - m_new) in place, l = alpha * l + row sums. A query with no allowed key so far keeps m = -inf and
// uses 0 in its place, so its masked scores give 2^-inf = 0 and nothing becomes NaN.
void softmax_update(float* s, int64_t ld, int64_t nk, float* m, float* l, const float* tile_max,
                    float* alpha) {
  for (int64_t c0 = 0; c0 < ld; c0 += kLanes) {
    const V16 m_old = v_load(m + c0);
    const V16 m_new = v_max(m_old, v_load(tile_max + c0));
    const V16 m_use = v_replace_neg_inf(m_new, 0.0f);
    const V16 a = v_exp2(v_sub(m_old, m_use));
    V16 sum0 = v_zero(), sum1 = v_zero();  // two chains, so the adds do not serialise on latency
    int64_t j = 0;
    for (; j + 2 <= nk; j += 2) {
      const V16 e0 = v_exp2(v_sub(v_load(s + j * ld + c0), m_use));
      const V16 e1 = v_exp2(v_sub(v_load(s + (j + 1) * ld + c0), m_use));
      v_store(s + j * ld + c0, e0);
      v_store(s + (j + 1) * ld + c0, e1);
      sum0 = v_add(sum0, e0);
      sum1 = v_add(sum1, e1);
    }
    if (j < nk) {
      const V16 e0 = v_exp2(v_sub(v_load(s + j * ld + c0), m_use));
      v_store(s + j * ld + c0, e0);
      sum0 = v_add(sum0, e0);
    }
    v_store(m + c0, m_new);
    v_store(alpha + c0, a);
    v_store(l + c0, v_fma(v_load(l + c0), a, v_add(sum0, sum1)));
  }
}

// Column maxima of a masked score tile (unmasked tiles get them from the score kernel).
void tile_max_pass(const float* s, int64_t ld, int64_t nk, float* tile_max) {
  for (int64_t c0 = 0; c0 < ld; c0 += kLanes) {
    V16 mx = v_set1(kNegInf);
    for (int64_t j = 0; j < nk; ++j) mx = v_max(mx, v_load(s + j * ld + c0));
    v_store(tile_max + c0, mx);
  }
}

// One work unit: query tile `qi` of head `bh`, every key tile it may see.
void run_query_tile(const Context& c, int64_t bh, int64_t qi, Scratch& w) {
  const Problem& p = c.p;
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv;
  const int64_t b = bh / p.heads, h = bh % p.heads;
  const int64_t i0 = qi * c.tiles.q, nq = std::min(c.tiles.q, Lq - i0), ld = round_up(nq, kLanes);
  const bool dropout = p.dropout > 0;
  w.ensure(ld, c.tiles.kv, D, dropout);
  float *qt = w.qt.data(), *s = w.s.data(), *ot = w.ot.data();
  float *m = w.stats.data(), *l = m + ld, *tile_max = l + ld, *alpha = tile_max + ld;

  const float* q = c.in.q + (bh * Lq + i0) * D;
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t i = 0; i < nq; ++i) qt[d * ld + i] = q[i * D + d] * c.q_scale;
    std::fill(qt + d * ld + nq, qt + (d + 1) * ld, 0.0f);  // padding lanes: finite, ignored
  }
  std::fill(ot, ot + D * ld, 0.0f);
  std::fill(m, m + ld, kNegInf);
  std::fill(l, l + ld, 0.0f);
  if (dropout)
    for (int64_t i = 0; i < nq; ++i) w.drop[i] = DropoutRow(p.dropout, p.seed, b, h, i0 + i);

  const float* k = c.in.k + bh * Lkv * D;
  const float* v = c.in.v + bh * Lkv * D;
  // Causal: keys beyond the tile's last query are hidden from all of it, so those key tiles are skipped.
  const int64_t kv_end = p.mask.causal ? std::min(Lkv, i0 + nq) : Lkv;
  for (int64_t j0 = 0; j0 < kv_end; j0 += c.tiles.kv) {
    const int64_t nk = std::min(c.tiles.kv, kv_end - j0);
    const bool masked = (p.mask.causal && j0 + nk - 1 > i0) || p.mask.boolean || p.mask.key_padding;
    if (!masked) std::fill(tile_max, tile_max + ld, kNegInf);
    score_tile(k + j0 * D, D, qt, ld, nk, s, masked ? nullptr : tile_max);
    if (masked) {
      mask_tile(c, b, i0, nq, j0, nk, s, ld);
      tile_max_pass(s, ld, nk, tile_max);
    }
    softmax_update(s, ld, nk, m, l, tile_max, alpha);
    if (dropout) {
      // The sums above keep every weight (dropout acts after normalisation); dropped weights leave P here.
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t j = 0; j < nk; ++j)
          if (!w.drop[i].keep(j0 + j)) s[j * ld + i] = 0.0f;
    }
    pv_tile(v + j0 * D, D, s, ld, nk, ot, alpha);
  }

  // The one division: O = O^T / l, transposed back. A query with no allowed key has l = 0 and gets zeros;
  // a NaN anywhere in its inputs leaves l NaN, and so its output, visible.
  const float keep_scale = dropout ? DropoutRow(p.dropout, p.seed, 0, 0, 0).scale() : 1.0f;
  float* o = c.in.out + (bh * Lq + i0) * D;
  for (int64_t i = 0; i < nq; ++i) {
    const float li = l[i];
    if (li == 0.0f) {
      std::fill(o + i * D, o + (i + 1) * D, 0.0f);
      continue;
    }
    const float inv = keep_scale / li;
    for (int64_t d = 0; d < D; ++d) o[i * D + d] = ot[d * ld + i] * inv;
  }
}

class Tiled final : public Attention {
 public:
  std::string name() const override { return "tiled"; }
  std::string description() const override {
    return "exact softmax attention, FlashAttention-style query x key tiles with online softmax, O(n) memory";
  }
  Capabilities capabilities() const override {
    return {.exact = true,
            .causal = true,
            .boolean_mask = true,
            .key_padding = true,
            .cross = true,
            .dropout = true,
            .permutation_equivariant = true};
  }
  std::vector<ParamSpec> param_specs() const override {
    return {{.name = "tile_q",
             .type = ParamType::integer,
             .default_value = 0,
             .help = "queries per tile (0: from the L2 size, 128 for head_dim 64)",
             .min = 0,
             .max = 1 << 16,
             .choices = {}},
            {.name = "tile_kv",
             .type = ParamType::integer,
             .default_value = 0,
             .help = "keys per tile (0: from the L2 size, 512 for head_dim 64)",
             .min = 0,
             .max = 1 << 16,
             .choices = {}}};
  }
  std::vector<Json> test_param_sets() const override {
    // Tiny tiles (and tile_q != tile_kv) so the multi-tile, tail and diagonal paths run on small inputs.
    return {Json::object(),
            {{"tile_q", 4}, {"tile_kv", 8}},
            {{"tile_q", 3}, {"tile_kv", 5}},
            {{"tile_q", 33}, {"tile_kv", 16}}};
  }
  double flops(const Problem& p) const override {
    // The shared exact-attention count (common/mask.hpp): causal counts the pairs below the diagonal only.
    // The diagonal tiles compute some masked pairs too; those, and the exponentials, are not counted.
    return exact_attention_flops(p);
  }
  std::size_t workspace_bytes(const Problem& p, int threads) const override {
    const Tiles t = choose_tiles(p);
    return static_cast<std::size_t>(std::max(threads, 1)) *
           Scratch::bytes(round_up(t.q, kLanes), t.kv, p.head_dim, p.dropout > 0);
  }

  void forward(const Problem& p, const AttentionInputs& in) const override {
    check_inputs(p, in);
    const Context c{p, in, choose_tiles(p), static_cast<float>(p.effective_scale() * std::numbers::log2e)};
    const int64_t q_tiles = (p.seq_q + c.tiles.q - 1) / c.tiles.q;
    tbb::enumerable_thread_specific<Scratch> scratch;
    // Work units (head, query tile) are fixed by the problem; each writes only its own output rows, by the
    // same sequence of operations on any thread, so results are bitwise independent of the thread count.
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, p.batch * p.heads * q_tiles),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        Scratch& w = scratch.local();
                        for (int64_t t = r.begin(); t < r.end(); ++t)
                          run_query_tile(c, t / q_tiles, t % q_tiles, w);
                      });
  }
};

}  // namespace
}  // namespace attn::tiled

ATTN_REGISTER_VARIANT(attn::tiled::Tiled)
