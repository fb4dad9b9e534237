// tiled's per-query-tile work on one SIMD target: the two register-blocked GEMM micro-kernels (queries in the
// vector lanes), masking, and the online-softmax update. Compiled once per Highway target (foreach_target.h)
// and dispatched at run time to the target common/simd.hpp selected; run_query_tile at the bottom is the
// entry point tiled.cpp calls.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "variants/tiled/tiled_kernels.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // must come first: it re-includes this file once per target
// clang-format on
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

#include "common/simd-inl.hpp"
#include "variants/tiled/tiled.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::tiled::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using simd::HWY_NAMESPACE::DF;
using simd::HWY_NAMESPACE::Exp2;
using simd::HWY_NAMESPACE::VF;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Register blocking of the two micro-kernels: MR rows x NV vectors of queries = MR * NV accumulators, which
// must cover FMA latency x throughput (4 cycles x 2 FMA pipes = 8 in flight on current x86 and Arm cores)
// and, with NV loads of Q^T and one broadcast, fit the register file.
// - AVX-512 (32 registers): 8 x 2 = 16 accumulators. 8 rows divide head_dim 64 and key tiles of 512, so no
//   tail kernel runs on the common shapes; in isolation (L2-resident 128 x 512 x 64 tiles, one Zen 5 thread)
//   this ran 2-3% faster than 6 x 4 plus its tails, at 206-215 GFLOP/s per core.
// - AVX2 and SSE4 (16 registers): 4 x 3 = 12 accumulators + 3 operands + 1 broadcast = 16 registers; 4 rows
//   divide 64 and 512, and 3 vectors of 8 leave one 8-lane tail vector per 128-query tile.
// - NEON, SVE (32 registers) and the rest: 8 x 2 as on AVX-512.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kScoreRows = 8, kScoreVecs = 2, kPvRows = 8, kPvVecs = 2;
#elif HWY_ARCH_X86
constexpr int kScoreRows = 4, kScoreVecs = 3, kPvRows = 4, kPvVecs = 3;
#else
constexpr int kScoreRows = 8, kScoreVecs = 2, kPvRows = 8, kPvVecs = 2;
#endif

// The micro-kernels keep their MR x NV accumulators in named variables, not arrays: SVE vectors are sizeless
// types, which cannot be array elements. ATTN_ROWS expands a row macro for rows 0..7; rows and vectors past
// MR and NV are never touched (if constexpr) and the compiler drops them.
static_assert(kScoreRows <= 8 && kScoreVecs <= 3 && kPvRows <= 8 && kPvVecs <= 3);
#define ATTN_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define ATTN_DECLARE(r) VF acc##r##_0 = hn::Zero(d), acc##r##_1 = hn::Zero(d), acc##r##_2 = hn::Zero(d);
// acc[r][c] += a * b[c] for the NV vectors of row r, a = the row's broadcast scalar `x`.
#define ATTN_FMA_ROW(r, x)                                            \
  if constexpr (r < MR) {                                             \
    const VF a = hn::Set(d, x);                                       \
    acc##r##_0 = hn::MulAdd(a, b0, acc##r##_0);                       \
    if constexpr (NV > 1) acc##r##_1 = hn::MulAdd(a, b1, acc##r##_1); \
    if constexpr (NV > 2) acc##r##_2 = hn::MulAdd(a, b2, acc##r##_2); \
  }
#define ATTN_STORE_ROW(r, out, ld)                                            \
  if constexpr (r < MR) {                                                     \
    hn::Store(acc##r##_0, d, (out) + r * (ld));                               \
    if constexpr (NV > 1) hn::Store(acc##r##_1, d, (out) + r * (ld) + N);     \
    if constexpr (NV > 2) hn::Store(acc##r##_2, d, (out) + r * (ld) + 2 * N); \
  }

// Score micro-kernel: an MR x (NV vectors) block of S^T = K Q^T, keys in rows and queries in lanes.
//   k:  MR key rows, row stride ldk (the K tensor itself: no packing);
//   qt: Q^T, [d][ldq], already multiplied by scale * log2(e);
//   s:  output rows, stride lds;
//   colmax (optional): per query lane, max'ed with the column maxima of this block.
// Sums over d run in order 0..D-1 for every element, whatever the tiling or thread.
template <int MR, int NV>
HWY_NOINLINE void ScoreKernel(const float* HWY_RESTRICT k, int64_t ldk, const float* HWY_RESTRICT qt,
                              int64_t ldq, int64_t depth, float* HWY_RESTRICT s, int64_t lds,
                              float* HWY_RESTRICT colmax) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  ATTN_ROWS(ATTN_DECLARE)
  for (int64_t e = 0; e < depth; ++e) {
    const float* qe = qt + e * ldq;
    const VF b0 = hn::Load(d, qe);
    VF b1 = b0, b2 = b0;
    if constexpr (NV > 1) b1 = hn::Load(d, qe + N);
    if constexpr (NV > 2) b2 = hn::Load(d, qe + 2 * N);
#define ATTN_SCORE_ROW(r) ATTN_FMA_ROW(r, k[r * ldk + e])
    ATTN_ROWS(ATTN_SCORE_ROW)
#undef ATTN_SCORE_ROW
  }
#define ATTN_SCORE_STORE(r) ATTN_STORE_ROW(r, s, lds)
  ATTN_ROWS(ATTN_SCORE_STORE)
#undef ATTN_SCORE_STORE
  if (colmax) {
    VF m0 = hn::Load(d, colmax);
    VF m1 = m0, m2 = m0;
    if constexpr (NV > 1) m1 = hn::Load(d, colmax + N);
    if constexpr (NV > 2) m2 = hn::Load(d, colmax + 2 * N);
#define ATTN_MAX_ROW(r)                                 \
  if constexpr (r < MR) {                               \
    m0 = hn::Max(m0, acc##r##_0);                       \
    if constexpr (NV > 1) m1 = hn::Max(m1, acc##r##_1); \
    if constexpr (NV > 2) m2 = hn::Max(m2, acc##r##_2); \
  }
    ATTN_ROWS(ATTN_MAX_ROW)
#undef ATTN_MAX_ROW
    hn::Store(m0, d, colmax);
    if constexpr (NV > 1) hn::Store(m1, d, colmax + N);
    if constexpr (NV > 2) hn::Store(m2, d, colmax + 2 * N);
  }
}

// Output micro-kernel: an MR x (NV vectors) block of O^T = alpha * O^T + V^T P^T, value dims in rows, queries
// in lanes. The running output is rescaled by alpha (per query) as it is loaded, the step that keeps the
// online softmax exact when the running max moves.
//   v:  value rows j = 0..nk-1 (stride ldv), starting at the block's first dim;
//   p:  P^T, [j][ldp], the tile's unnormalised probabilities;
//   ot: running O^T rows, stride ldo;  alpha: per query lane.
template <int MR, int NV>
HWY_NOINLINE void PvKernel(const float* HWY_RESTRICT v, int64_t ldv, const float* HWY_RESTRICT p, int64_t ldp,
                           int64_t nk, float* HWY_RESTRICT ot, int64_t ldo, const float* HWY_RESTRICT alpha) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  ATTN_ROWS(ATTN_DECLARE) {
    const VF a0 = hn::Load(d, alpha);
    VF a1 = a0, a2 = a0;
    if constexpr (NV > 1) a1 = hn::Load(d, alpha + N);
    if constexpr (NV > 2) a2 = hn::Load(d, alpha + 2 * N);
#define ATTN_PV_INIT(r)                                                                \
  if constexpr (r < MR) {                                                              \
    acc##r##_0 = hn::Mul(hn::Load(d, ot + r * ldo), a0);                               \
    if constexpr (NV > 1) acc##r##_1 = hn::Mul(hn::Load(d, ot + r * ldo + N), a1);     \
    if constexpr (NV > 2) acc##r##_2 = hn::Mul(hn::Load(d, ot + r * ldo + 2 * N), a2); \
  }
    ATTN_ROWS(ATTN_PV_INIT)
#undef ATTN_PV_INIT
  }
  for (int64_t j = 0; j < nk; ++j) {
    const float* pj = p + j * ldp;
    const VF b0 = hn::Load(d, pj);
    VF b1 = b0, b2 = b0;
    if constexpr (NV > 1) b1 = hn::Load(d, pj + N);
    if constexpr (NV > 2) b2 = hn::Load(d, pj + 2 * N);
#define ATTN_PV_ROW(r) ATTN_FMA_ROW(r, v[j * ldv + r])
    ATTN_ROWS(ATTN_PV_ROW)
#undef ATTN_PV_ROW
  }
#define ATTN_PV_STORE(r) ATTN_STORE_ROW(r, ot, ldo)
  ATTN_ROWS(ATTN_PV_STORE)
#undef ATTN_PV_STORE
}
#undef ATTN_STORE_ROW
#undef ATTN_FMA_ROW
#undef ATTN_DECLARE
#undef ATTN_ROWS

using ScoreFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, float*);
using PvFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, const float*);

// Kernel tables indexed [vectors - 1][rows - 1], so row and lane tails use a kernel of exactly their size.
template <int NV, int... R>
constexpr std::array<ScoreFn, sizeof...(R)> ScoreRow(std::integer_sequence<int, R...>) {
  return {&ScoreKernel<R + 1, NV>...};
}
template <int... V>
constexpr auto ScoreTable(std::integer_sequence<int, V...>) {
  return std::array{ScoreRow<V + 1>(std::make_integer_sequence<int, kScoreRows>())...};
}
template <int NV, int... R>
constexpr std::array<PvFn, sizeof...(R)> PvRow(std::integer_sequence<int, R...>) {
  return {&PvKernel<R + 1, NV>...};
}
template <int... V>
constexpr auto PvTable(std::integer_sequence<int, V...>) {
  return std::array{PvRow<V + 1>(std::make_integer_sequence<int, kPvRows>())...};
}

// S^T (nk x ld) = K_tile Q^T; colmax (if given) receives the per-query maxima.
void ScoreTile(const float* k, int64_t dim, const float* qt, int64_t ld, int64_t nk, float* s,
               float* colmax) {
  static constexpr auto kernels = ScoreTable(std::make_integer_sequence<int, kScoreVecs>());
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  for (int64_t c0 = 0; c0 < ld; c0 += kScoreVecs * N) {
    const int64_t nv = std::min<int64_t>(kScoreVecs, (ld - c0) / N);
    for (int64_t r0 = 0; r0 < nk; r0 += kScoreRows) {
      const int64_t mr = std::min<int64_t>(kScoreRows, nk - r0);
      kernels[nv - 1][mr - 1](k + r0 * dim, dim, qt + c0, ld, dim, s + r0 * ld + c0, ld,
                              colmax ? colmax + c0 : nullptr);
    }
  }
}

// O^T (dim x ld) = alpha * O^T + V_tile^T P^T.
void PvTile(const float* v, int64_t dim, const float* s, int64_t ld, int64_t nk, float* ot,
            const float* alpha) {
  static constexpr auto kernels = PvTable(std::make_integer_sequence<int, kPvVecs>());
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  for (int64_t c0 = 0; c0 < ld; c0 += kPvVecs * N) {
    const int64_t nv = std::min<int64_t>(kPvVecs, (ld - c0) / N);
    for (int64_t d0 = 0; d0 < dim; d0 += kPvRows) {
      const int64_t mr = std::min<int64_t>(kPvRows, dim - d0);
      kernels[nv - 1][mr - 1](v + d0, dim, s + c0, ld, nk, ot + d0 * ld + c0, ld, alpha + c0);
    }
  }
}

// Sets masked scores of one tile to -inf: keys [j0, j0 + nk) against queries [i0, i0 + nq).
void MaskTile(const Context& c, int64_t b, int64_t i0, int64_t nq, int64_t j0, int64_t nk, float* s,
              int64_t ld) {
  const Problem& p = c.p;
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  if (p.mask.causal && j0 + nk - 1 > i0) {
    // Key j is hidden from queries i < j: lanes [0, j - i0) of row j.
    for (int64_t j = 0; j < nk; ++j) {
      const int64_t hidden = j0 + j - i0;
      for (int64_t c0 = 0; c0 < ld && c0 < hidden; c0 += N) {
        const auto low = hn::FirstN(d, static_cast<size_t>(std::min(hidden - c0, N)));
        hn::Store(hn::IfThenElse(low, hn::Set(d, kNegInf), hn::Load(d, s + j * ld + c0)), d, s + j * ld + c0);
      }
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
void SoftmaxUpdate(float* s, int64_t ld, int64_t nk, float* m, float* l, const float* tile_max,
                   float* alpha) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t c0 = 0; c0 < ld; c0 += N) {
    const VF m_old = hn::Load(d, m + c0);
    const VF m_new = hn::Max(m_old, hn::Load(d, tile_max + c0));
    const VF m_use = hn::IfThenZeroElse(hn::Eq(m_new, hn::Set(d, kNegInf)), m_new);
    const VF a = Exp2(d, hn::Sub(m_old, m_use));
    VF sum0 = hn::Zero(d), sum1 = hn::Zero(d);  // two chains, so the adds do not serialise on latency
    int64_t j = 0;
    for (; j + 2 <= nk; j += 2) {
      const VF e0 = Exp2(d, hn::Sub(hn::Load(d, s + j * ld + c0), m_use));
      const VF e1 = Exp2(d, hn::Sub(hn::Load(d, s + (j + 1) * ld + c0), m_use));
      hn::Store(e0, d, s + j * ld + c0);
      hn::Store(e1, d, s + (j + 1) * ld + c0);
      sum0 = hn::Add(sum0, e0);
      sum1 = hn::Add(sum1, e1);
    }
    if (j < nk) {
      const VF e0 = Exp2(d, hn::Sub(hn::Load(d, s + j * ld + c0), m_use));
      hn::Store(e0, d, s + j * ld + c0);
      sum0 = hn::Add(sum0, e0);
    }
    hn::Store(m_new, d, m + c0);
    hn::Store(a, d, alpha + c0);
    hn::Store(hn::MulAdd(hn::Load(d, l + c0), a, hn::Add(sum0, sum1)), d, l + c0);
  }
}

// Column maxima of a masked score tile (unmasked tiles get them from the score kernel).
void TileMaxPass(const float* s, int64_t ld, int64_t nk, float* tile_max) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t c0 = 0; c0 < ld; c0 += N) {
    VF mx = hn::Set(d, kNegInf);
    for (int64_t j = 0; j < nk; ++j) mx = hn::Max(mx, hn::Load(d, s + j * ld + c0));
    hn::Store(mx, d, tile_max + c0);
  }
}

void RunQueryTile(const Context& c, int64_t bh, int64_t qi, Scratch& w) {
  const Problem& p = c.p;
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv;
  const int64_t b = bh / p.heads, h = bh % p.heads;
  const int64_t i0 = qi * c.tiles.q, nq = std::min(c.tiles.q, Lq - i0), ld = round_up(nq, kLanes);
  const bool dropout = p.dropout > 0;
  w.ensure(ld, c.tiles.kv, D, dropout);
  float *qt = w.qt.data(), *s = w.s.data(), *ot = w.ot.data();
  float *m = w.stats.data(), *l = m + ld, *tile_max = l + ld, *alpha = tile_max + ld;

  const float* q = c.in.q + (bh * Lq + i0) * D;
  for (int64_t e = 0; e < D; ++e) {
    for (int64_t i = 0; i < nq; ++i) qt[e * ld + i] = q[i * D + e] * c.q_scale;
    std::fill(qt + e * ld + nq, qt + (e + 1) * ld, 0.0f);  // padding lanes: finite, ignored
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
    ScoreTile(k + j0 * D, D, qt, ld, nk, s, masked ? nullptr : tile_max);
    if (masked) {
      MaskTile(c, b, i0, nq, j0, nk, s, ld);
      TileMaxPass(s, ld, nk, tile_max);
    }
    SoftmaxUpdate(s, ld, nk, m, l, tile_max, alpha);
    if (dropout) {
      // The sums above keep every weight (dropout acts after normalisation); dropped weights leave P here.
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t j = 0; j < nk; ++j)
          if (!w.drop[i].keep(j0 + j)) s[j * ld + i] = 0.0f;
    }
    PvTile(v + j0 * D, D, s, ld, nk, ot, alpha);
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
    for (int64_t e = 0; e < D; ++e) o[i * D + e] = ot[e * ld + i] * inv;
  }
}

}  // namespace attn::tiled::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::tiled {
HWY_EXPORT(RunQueryTile);

void run_query_tile(const Context& c, int64_t bh, int64_t qi, Scratch& w) {
  HWY_DYNAMIC_DISPATCH(RunQueryTile)(c, bh, qi, w);
}
}  // namespace attn::tiled
#endif  // HWY_ONCE
