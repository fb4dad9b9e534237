// tiled's per-query-tile work on one SIMD target: the two register-blocked GEMM micro-kernels (queries in the
// vector lanes), masking, and the online-softmax update. Compiled once per Highway target (foreach_target.h)
// and dispatched at run time to the target common/kernels/simd.hpp selected; run_query_tile at the bottom is
// the entry point tiled.cpp calls.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "variants/tiled/tiled_kernels.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // must come first: it re-includes this file once per target
// clang-format on
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "common/interface/half.hpp"
#include "common/kernels/alibi.hpp"
#include "common/kernels/mask.hpp"
#include "common/kernels/simd-inl.hpp"
#include "common/kernels/simd.hpp"
#include "variants/tiled/dot_scores-inl.hpp"
#include "variants/tiled/tiled.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::tiled::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using simd::HWY_NAMESPACE::DF;
using simd::HWY_NAMESPACE::Exp2;
using simd::HWY_NAMESPACE::TanhKeepNaN;
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
//   bias (BK = LaneBias::kind, 0: none): ALiBi added to every score before the store and the maxima, key row
//   r being key j0 + r (the bias costs 2-3 vector ops per accumulator here and no pass over memory).
template <int MR, int NV, int BK>
HWY_NOINLINE void ScoreKernel(const float* HWY_RESTRICT k, int64_t ldk, const float* HWY_RESTRICT qt,
                              int64_t ldq, int64_t depth, float* HWY_RESTRICT s, int64_t lds,
                              float* HWY_RESTRICT colmax, const LaneBias& bias, int64_t j0) {
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
  if constexpr (BK != 0) {
    const VF p0 = hn::LoadU(d, bias.pos), s0 = hn::LoadU(d, bias.slope);
    VF p1 = p0, p2 = p0, s1 = s0, s2 = s0;
    if constexpr (NV > 1) p1 = hn::LoadU(d, bias.pos + N), s1 = hn::LoadU(d, bias.slope + N);
    if constexpr (NV > 2) p2 = hn::LoadU(d, bias.pos + 2 * N), s2 = hn::LoadU(d, bias.slope + 2 * N);
    auto dist = [&](VF pos, VF j) {
      const VF x = hn::Sub(pos, j);
      if constexpr (BK == 2) return hn::Abs(x);
      return x;
    };
#define ATTN_BIAS_ROW(r)                                                        \
  if constexpr (r < MR) {                                                       \
    const VF j = hn::Set(d, static_cast<float>(j0 + r));                        \
    acc##r##_0 = hn::MulAdd(s0, dist(p0, j), acc##r##_0);                       \
    if constexpr (NV > 1) acc##r##_1 = hn::MulAdd(s1, dist(p1, j), acc##r##_1); \
    if constexpr (NV > 2) acc##r##_2 = hn::MulAdd(s2, dist(p2, j), acc##r##_2); \
  }
    ATTN_ROWS(ATTN_BIAS_ROW)
#undef ATTN_BIAS_ROW
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

using ScoreFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, float*,
                         const LaneBias&, int64_t);
using PvFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, const float*);

// Kernel tables indexed [vectors - 1][rows - 1], so row and lane tails use a kernel of exactly their size.
template <int NV, int BK, int... R>
constexpr std::array<ScoreFn, sizeof...(R)> ScoreRow(std::integer_sequence<int, R...>) {
  return {&ScoreKernel<R + 1, NV, BK>...};
}
template <int BK, int... V>
constexpr auto ScoreTable(std::integer_sequence<int, V...>) {
  return std::array{ScoreRow<V + 1, BK>(std::make_integer_sequence<int, kScoreRows>())...};
}
template <int NV, int... R>
constexpr std::array<PvFn, sizeof...(R)> PvRow(std::integer_sequence<int, R...>) {
  return {&PvKernel<R + 1, NV>...};
}
template <int... V>
constexpr auto PvTable(std::integer_sequence<int, V...>) {
  return std::array{PvRow<V + 1>(std::make_integer_sequence<int, kPvRows>())...};
}

// S^T (nk x ld) = K_tile Q^T (+ the ALiBi bias, keys j0 ..); colmax (if given) receives the per-query maxima.
void ScoreTile(const float* k, int64_t dim, const float* qt, int64_t ld, int64_t nk, float* s, float* colmax,
               const LaneBias& bias, int64_t j0) {
  static constexpr auto seq = std::make_integer_sequence<int, kScoreVecs>();
  static constexpr std::array kernels{ScoreTable<0>(seq), ScoreTable<1>(seq), ScoreTable<2>(seq)};
  const auto& table = kernels[static_cast<std::size_t>(bias.kind)];
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  for (int64_t c0 = 0; c0 < ld; c0 += kScoreVecs * N) {
    const int64_t nv = std::min<int64_t>(kScoreVecs, (ld - c0) / N);
    const LaneBias lb{bias.kind, bias.kind ? bias.pos + c0 : nullptr, bias.kind ? bias.slope + c0 : nullptr};
    for (int64_t r0 = 0; r0 < nk; r0 += kScoreRows) {
      const int64_t mr = std::min<int64_t>(kScoreRows, nk - r0);
      table[nv - 1][mr - 1](k + r0 * dim, dim, qt + c0, ld, dim, s + r0 * ld + c0, ld,
                            colmax ? colmax + c0 : nullptr, lb, j0 + r0);
    }
  }
}

// bf16 / fp16 storage: n values widened to fp32 (exact), vectorised (fp16 through the CPU's conversion
// instructions where Highway has them: F16C on x86, FCVTL on Arm).
void WidenValues(DType t, const uint16_t* HWY_RESTRICT x, int64_t n, float* HWY_RESTRICT out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (t == DType::bf16) {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::RebindToUnsigned<DF> du;
    for (; i + N <= n; i += N)
      hn::StoreU(hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, x + i)))), d, out + i);
    for (; i < n; ++i) out[i] = bits_float(static_cast<uint32_t>(x[i]) << 16);
  } else {
    const hn::Rebind<hwy::float16_t, DF> d16;
    const auto* xh = reinterpret_cast<const hwy::float16_t*>(x);
    for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(d16, xh + i)), d, out + i);
    for (; i < n; ++i) out[i] = fp16_to_float(x[i]);
  }
}

// O^T (dim x ld) = alpha * O^T + V_tile^T P^T.
void PvTile(const float* v, int64_t dim, int64_t ldv, const float* s, int64_t ld, int64_t nk, float* ot,
            const float* alpha) {
  static constexpr auto kernels = PvTable(std::make_integer_sequence<int, kPvVecs>());
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  for (int64_t c0 = 0; c0 < ld; c0 += kPvVecs * N) {
    const int64_t nv = std::min<int64_t>(kPvVecs, (ld - c0) / N);
    for (int64_t d0 = 0; d0 < dim; d0 += kPvRows) {
      const int64_t mr = std::min<int64_t>(kPvRows, dim - d0);
      kernels[nv - 1][mr - 1](v + d0, ldv, s + c0, ld, nk, ot + d0 * ld + c0, ld, alpha + c0);
    }
  }
}

// The rows of one task: query positions [i0, i0 + np) of the `group` query heads of K/V head `kvh`,
// position-major (row r: position i0 + r / group, head kvh * group + r % group), and its keys [ja, jb).
struct TileRows {
  int64_t b, kvh, i0, np, nr, ja, jb;
  int64_t group;
  int64_t pos(int64_t r) const { return i0 + r / group; }
  int64_t head(int64_t r) const { return kvh * group + r % group; }
  // Rows [0, hidden_rows(j)) may not see key j under the causal rule j <= i + off (capped at `cap`).
  int64_t hidden_rows(int64_t j, int64_t off, int64_t cap) const {
    const int64_t x = j - off - i0;  // positions i0 .. i0 + x - 1 are hidden
    if (x <= 0) return 0;
    if (x >= cap) return cap;
    return std::min(x * group, cap);
  }
};

// Sets masked scores of one GEMM-path tile to -inf: keys [j0, j0 + nk) against the tile's rows (lanes).
void MaskTile(const Context& c, const TileRows& t, int64_t j0, int64_t nk, float* s, int64_t ld) {
  const Problem& p = c.p;
  if (p.mask.any_causal()) {
    const int64_t off = causal_offset(p);
    for (int64_t j = 0; j < nk; ++j)
      std::fill(s + j * ld, s + j * ld + t.hidden_rows(j0 + j, off, ld), kNegInf);
  }
  if (p.mask.key_padding) {
    const uint8_t* pad = c.in.key_padding + t.b * p.seq_kv + j0;
    for (int64_t j = 0; j < nk; ++j)
      if (pad[j]) std::fill(s + j * ld, s + (j + 1) * ld, kNegInf);
  }
  if (p.mask.boolean) {
    for (int64_t r = 0; r < t.nr; ++r) {
      const uint8_t* allowed = c.in.mask + t.pos(r) * p.seq_kv + j0;
      for (int64_t j = 0; j < nk; ++j)
        if (!allowed[j]) s[j * ld + r] = kNegInf;
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

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// The native bf16 P V (GemmRows with native_bf16, this target only): SoftmaxUpdate with every probability
// rounded to bf16 by vcvtne2ps2bf16 (round to nearest even: relative error at most 2^-8, the unit roundoff
// of bf16's 8-bit significand; NaN stays NaN) and packed as key pairs into p2 ([(nk + 1) / 2][ld] words:
// key 2 j2 in the low half, 2 j2 + 1 in the high half, a missing last key 0) for vdpbf16ps. The running sum
// l adds the ROUNDED values, the very words P V multiplies (one vdpbf16ps per pair against (1, 1): exact
// products, fp32 sums), so up to fp32 rounding the output is a convex combination of V's rows with the
// rounded weights: each normalised weight moves by at most 2^-7 / (1 - 2^-8) of itself (2^-8 from its own
// rounding, up to 2^-8 from the sum's), the weights still sum to one, and the output moves by at most that
// times max|v| (exact_abs_tolerance's weight term; the checks hold it to 2x naive with bf16 weights).
// The target adds AVX512_BF16 to this target's own (Highway 1.0 has no target with it); the caller runs it
// only where bf16_dot_supported(). Clang applies HWY_BEFORE_NAMESPACE's target to every function in the
// region and lets it replace a function's own, so these two leave the region and name their whole target.
HWY_POP_ATTRIBUTES
#define ATTN_TILED_BF16_TARGET __attribute__((target(HWY_TARGET_STR ",avx512bf16")))
// 16-bit lanes [b0 .. b15, a0 .. a15] of vcvtne2ps2bf16(a, b) to [b0, a0, b1, a1, ...]: word c = key pair
// (e0's key in the low half).
ATTN_TILED_BF16_TARGET inline __m512i PackPairWords(__m512 e0, __m512 e1) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                              23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
}

ATTN_TILED_BF16_TARGET void SoftmaxUpdatePairs(const float* s, int64_t ld, int64_t nk, float* m, float* l,
                                               const float* tile_max, float* alpha, uint32_t* p2) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  static_assert(sizeof(hn::Vec<DF>) == sizeof(__m512));
  // The pair's words; the sum adds both rounded values of each word with one vdpbf16ps against (1, 1).
  const __m512bh ones = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  for (int64_t c0 = 0; c0 < ld; c0 += N) {
    const VF m_old = hn::Load(d, m + c0);
    const VF m_new = hn::Max(m_old, hn::Load(d, tile_max + c0));
    const VF m_use = hn::IfThenZeroElse(hn::Eq(m_new, hn::Set(d, kNegInf)), m_new);
    const VF a = Exp2(d, hn::Sub(m_old, m_use));
    __m512 sum = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 2 <= nk; j += 2) {
      const VF e0 = Exp2(d, hn::Sub(hn::Load(d, s + j * ld + c0), m_use));
      const VF e1 = Exp2(d, hn::Sub(hn::Load(d, s + (j + 1) * ld + c0), m_use));
      const __m512i w = PackPairWords(e0.raw, e1.raw);
      _mm512_store_si512(p2 + j / 2 * ld + c0, w);
      sum = _mm512_dpbf16_ps(sum, (__m512bh)w, ones);
    }
    if (j < nk) {
      const __m512i w =
          PackPairWords(Exp2(d, hn::Sub(hn::Load(d, s + j * ld + c0), m_use)).raw, _mm512_setzero_ps());
      _mm512_store_si512(p2 + j / 2 * ld + c0, w);
      sum = _mm512_dpbf16_ps(sum, (__m512bh)w, ones);
    }
    hn::Store(m_new, d, m + c0);
    hn::Store(a, d, alpha + c0);
    hn::Store(hn::MulAdd(hn::Load(d, l + c0), a, VF{sum}), d, l + c0);
  }
}

// The native bf16 dot path's probabilities of one row (DotSoftmax with p16): 2^(s - m) of its nkv scores
// (a multiple of the vector width, padding -inf), each rounded to bf16 as SoftmaxUpdatePairs rounds them and
// stored as 16-bit values in key order (so the 32-bit word at an even key holds that key and the next, the
// pair vdpbf16ps takes); returns the sum of the ROUNDED values (one vdpbf16ps against (1, 1) per 32).
ATTN_TILED_BF16_TARGET HWY_NOINLINE float ExpRowBf16(const float* sr, int64_t nkv, float m_use,
                                                     uint16_t* p16) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF vm = hn::Set(d, m_use);
  const __m512bh ones = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 2 * N <= nkv; j += 2 * N) {
    const VF e0 = Exp2(d, hn::Sub(hn::Load(d, sr + j), vm));
    const VF e1 = Exp2(d, hn::Sub(hn::Load(d, sr + j + N), vm));
    const __m512bh w = _mm512_cvtne2ps_pbh(e1.raw, e0.raw);  // keys j .. j + 31 in order
    _mm512_storeu_si512(p16 + j, (__m512i)w);
    sum = _mm512_dpbf16_ps(sum, w, ones);
  }
  if (j < nkv) {
    const __m512bh w =
        _mm512_cvtne2ps_pbh(_mm512_setzero_ps(), Exp2(d, hn::Sub(hn::Load(d, sr + j), vm)).raw);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p16 + j), _mm512_castsi512_si256((__m512i)w));
    sum = _mm512_dpbf16_ps(sum, w, ones);
  }
  return _mm512_reduce_add_ps(sum);
}
#undef ATTN_TILED_BF16_TARGET
HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR)
#endif

// Logit soft-capping of n logits in base 2 (scale log2(e) q.k), in place: x = C2 tanh(x / C2) with C2 = C
// log2(e), the same map as C tanh(s / C) on natural logits. tiled_backward.cpp applies the identical
// operations, so the backward's recomputed logits are the forward's bitwise.
void SoftcapValues(float* x, int64_t n, float cap2) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF c = hn::Set(d, cap2), inv = hn::Set(d, 1.0f / cap2);
  int64_t j = 0;
  for (; j + N <= n; j += N)
    hn::StoreU(hn::Mul(c, TanhKeepNaN(d, hn::Mul(hn::LoadU(d, x + j), inv))), d, x + j);
  for (; j < n; ++j) {
    const VF v = hn::Mul(c, TanhKeepNaN(d, hn::Mul(hn::Set(d, x[j]), inv)));
    x[j] = hn::GetLane(v);
  }
}

// ALiBi added to a GEMM-path score tile after soft-capping (ScoreKernel adds it itself when there is no
// cap): rows are keys j0 .. j0 + nk - 1, lanes the tile's queries.
void AddBiasTile(float* s, int64_t ld, int64_t nk, const LaneBias& bias, int64_t j0) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t c0 = 0; c0 < ld; c0 += N) {
      VF dist = hn::Sub(hn::LoadU(d, bias.pos + c0), hn::Set(d, static_cast<float>(j0 + j)));
      if (bias.kind == 2) dist = hn::Abs(dist);
      hn::StoreU(hn::MulAdd(hn::LoadU(d, bias.slope + c0), dist, hn::LoadU(d, s + j * ld + c0)), d,
                 s + j * ld + c0);
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

// ---- Dot-product kernels: tiles of at most kDotRows rows (decode), head_dim in the vector lanes. ----
// With one or a few query rows per K/V head, the GEMM kernels above would fill 1 to 8 of their 16 query
// lanes; these instead stream K and V rows once per tile with full vectors along head_dim and reuse each
// loaded K/V vector for every row of the tile (every query head of the group).

#define ATTN_ACC8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define ATTN_DOT_DECLARE(i) VF a##i = hn::Zero(d);

// DotScores (the scores of KB keys x NR rows) is in dot_scores-inl.hpp, shared with the backward.

// O rows += P V for CV vectors of head_dim starting at e0 (CV * NR <= 8): o[r] = alpha[r] * o[r] +
// sum_j p[r * lds + j] v[j], keys j = 0..nk-1 in order. V rows are ldv elements apart, o rows D.
template <int NR, int CV, class Rows>
HWY_NOINLINE void DotPv(const typename Rows::T* HWY_RESTRICT v, int64_t ldv, int64_t D, int64_t nk,
                        const float* HWY_RESTRICT p, int64_t lds, float* HWY_RESTRICT o,
                        const float* HWY_RESTRICT alpha, int64_t e0) {
  static_assert(NR * CV <= 8);
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  ATTN_ACC8(ATTN_DOT_DECLARE)
#define ATTN_PV_LOAD(i)      \
  if constexpr (i < NR * CV) \
    a##i = hn::Mul(hn::LoadU(d, o + (i / CV) * D + e0 + (i % CV) * N), hn::Set(d, alpha[i / CV]));
  ATTN_ACC8(ATTN_PV_LOAD)
#undef ATTN_PV_LOAD
  for (int64_t j = 0; j < nk; ++j) {
    const typename Rows::T* vj = v + j * ldv + e0;
#define ATTN_PV_FMA(i)       \
  if constexpr (i < NR * CV) \
    a##i = hn::MulAdd(hn::Set(d, p[(i / CV) * lds + j]), Rows::Load(d, vj + (i % CV) * N), a##i);
    ATTN_ACC8(ATTN_PV_FMA)
#undef ATTN_PV_FMA
  }
#define ATTN_PV_SAVE(i) \
  if constexpr (i < NR * CV) hn::StoreU(a##i, d, o + (i / CV) * D + e0 + (i % CV) * N);
  ATTN_ACC8(ATTN_PV_SAVE)
#undef ATTN_PV_SAVE
}
// DotScores and DotPv on bf16 rows read by RowsBf16EvenOdd: head_dim and d_v multiples of 2N, the query rows
// qs and the output rows o in its [N even | N odd] order per chunk of 2N values. Each score sums, per lane,
// the even then the odd product of a chunk, chunks in order (so not bitwise what DotScores sums; the
// backward's recomputed logits for such rows agree within the bf16 tolerance, as for the AMX rows). Each
// output value sums its keys in order, as DotPv.
template <int NR, int KB, class Rows>
HWY_NOINLINE void DotScoresEO(const uint16_t* HWY_RESTRICT k, int64_t D, const float* HWY_RESTRICT qs,
                              float* HWY_RESTRICT s, int64_t lds) {
  static_assert(NR * KB <= 8);
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  ATTN_ACC8(ATTN_DOT_DECLARE)
  for (int64_t e = 0; e < D; e += 2 * N) {
#define ATTN_EO_FMA(i)                                               \
  if constexpr (i < NR * KB) {                                       \
    const uint16_t* kr = k + (i / NR) * D + e;                       \
    const float* qr = qs + (i % NR) * D + e;                         \
    a##i = hn::MulAdd(Rows::Even(d, kr), hn::LoadU(d, qr), a##i);    \
    a##i = hn::MulAdd(Rows::Odd(d, kr), hn::LoadU(d, qr + N), a##i); \
  }
    ATTN_ACC8(ATTN_EO_FMA)
#undef ATTN_EO_FMA
  }
  float sums[8];
  SumLanes4(a0, a1, a2, a3, sums);
  if constexpr (NR * KB > 4) SumLanes4(a4, a5, a6, a7, sums + 4);
#define ATTN_EO_STORE(i) \
  if constexpr (i < NR * KB) s[(i % NR) * lds + i / NR] = sums[i];
  ATTN_ACC8(ATTN_EO_STORE)
#undef ATTN_EO_STORE
}

template <int Half, class Rows>
HWY_INLINE VF EvenOrOdd(DF d, const uint16_t* HWY_RESTRICT p) {
  if constexpr (Half == 0)
    return Rows::Even(d, p);
  else
    return Rows::Odd(d, p);
}

// Accumulator i: row i / (2 CP), chunk (i / 2) % CP, even (i even) or odd half.
template <int NR, int CP, class Rows>
HWY_NOINLINE void DotPvEO(const uint16_t* HWY_RESTRICT v, int64_t ldv, int64_t D, int64_t nk,
                          const float* HWY_RESTRICT p, int64_t lds, float* HWY_RESTRICT o,
                          const float* HWY_RESTRICT alpha, int64_t e0) {
  static_assert(2 * NR * CP <= 8);
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  ATTN_ACC8(ATTN_DOT_DECLARE)
#define ATTN_EO_AT(i) ((i) / (2 * CP)) * D + e0 + (((i) / 2) % CP) * 2 * N + ((i) % 2) * N
#define ATTN_EO_LOAD(i)          \
  if constexpr (i < 2 * NR * CP) \
    a##i = hn::Mul(hn::LoadU(d, o + ATTN_EO_AT(i)), hn::Set(d, alpha[i / (2 * CP)]));
  ATTN_ACC8(ATTN_EO_LOAD)
#undef ATTN_EO_LOAD
  for (int64_t j = 0; j < nk; ++j) {
    const uint16_t* vj = v + j * ldv + e0;
#define ATTN_EO_FMA(i)                                                                               \
  if constexpr (i < 2 * NR * CP) {                                                                   \
    const uint16_t* vc = vj + ((i / 2) % CP) * 2 * N;                                                \
    a##i = hn::MulAdd(hn::Set(d, p[(i / (2 * CP)) * lds + j]), EvenOrOdd<i % 2, Rows>(d, vc), a##i); \
  }
    ATTN_ACC8(ATTN_EO_FMA)
#undef ATTN_EO_FMA
  }
#define ATTN_EO_SAVE(i) \
  if constexpr (i < 2 * NR * CP) hn::StoreU(a##i, d, o + ATTN_EO_AT(i));
  ATTN_ACC8(ATTN_EO_SAVE)
#undef ATTN_EO_SAVE
#undef ATTN_EO_AT
}

// Rows of `n` floats in [N even | N odd] order per chunk of 2N, put in order (to == true) or the other way.
void EvenOddOrder(float* rows, int64_t nrows, int64_t n, int64_t ld, bool to_dims) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  std::vector<float> tmp(static_cast<std::size_t>(2 * N));
  for (int64_t r = 0; r < nrows; ++r)
    for (int64_t c = 0; c < n; c += 2 * N) {
      float* x = rows + r * ld + c;
      for (int64_t i = 0; i < N; ++i) {
        if (to_dims) {
          tmp[2 * i] = x[i], tmp[2 * i + 1] = x[N + i];
        } else {
          tmp[i] = x[2 * i], tmp[N + i] = x[2 * i + 1];
        }
      }
      std::copy(tmp.begin(), tmp.end(), x);
    }
}
#undef ATTN_DOT_DECLARE
#undef ATTN_ACC8

template <class Rows>
using DotScoreFn = void (*)(const typename Rows::T*, int64_t, const float*, float*, int64_t);
template <class Rows>
using DotPvFn = void (*)(const typename Rows::T*, int64_t, int64_t, int64_t, const float*, int64_t, float*,
                         const float*, int64_t);
template <class Rows, int NR, int KB>
constexpr DotScoreFn<Rows> ScoreEntry() {
  if constexpr (Rows::kEvenOdd)
    return &DotScoresEO<NR, KB, Rows>;
  else
    return &DotScores<NR, KB, Rows>;
}
template <class Rows, int... R>
constexpr std::array<DotScoreFn<Rows>, sizeof...(R)> DotScoreBlocks(std::integer_sequence<int, R...>) {
  return {ScoreEntry<Rows, R + 1, 8 / (R + 1)>()...};
}
template <class Rows, int... R>
constexpr std::array<DotScoreFn<Rows>, sizeof...(R)> DotScoreSingles(std::integer_sequence<int, R...>) {
  return {ScoreEntry<Rows, R + 1, 1>()...};
}
// P V kernels by rows NR (1..8) and column vectors CV (1..8 / NR; nullptr beyond): a tile whose d_v holds
// fewer vectors than 8 / NR (head_dim 64 on 16 lanes: 4) still gets that many independent accumulator chains,
// not one (each output element sums its keys in the same order whatever CV is: bitwise the same results).
// Even/odd rows (RowsBf16EvenOdd): C counts chunks of 2N values, two accumulators each, rows 1..4 only.
template <class Rows, int NR, int C>
constexpr DotPvFn<Rows> PvEntry() {
  if constexpr (Rows::kEvenOdd) {
    if constexpr (2 * NR * C <= 8) return &DotPvEO<NR, C, Rows>;
    return nullptr;
  } else {
    if constexpr (NR * C <= 8) return &DotPv<NR, C, Rows>;
    return nullptr;
  }
}
template <class Rows, int NR, int... C>
constexpr std::array<DotPvFn<Rows>, 8> DotPvRow(std::integer_sequence<int, C...>) {
  return {PvEntry<Rows, NR, C + 1>()...};
}
template <class Rows, int... R>
constexpr std::array<std::array<DotPvFn<Rows>, 8>, sizeof...(R)> DotPvTable(
    std::integer_sequence<int, R...>) {
  return {DotPvRow<Rows, R + 1>(std::make_integer_sequence<int, 8>())...};
}
static_assert(kDotRows == 8, "the dot-product kernel tables cover 1..8 rows");
constexpr int64_t kPvKeys = 16;  // keys per P V block of the dot-product path
// Software prefetch of K and V rows this far ahead of their use (the decode kernels stream them once; the
// hardware prefetcher alone left the K/V stream well below the machine's read bandwidth).
constexpr int64_t kPrefetchRows = 16;
template <class T>
void PrefetchRows(const T* rows, int64_t n, int64_t D) {
  const char* p = reinterpret_cast<const char*>(rows);
  const int64_t bytes = n * D * static_cast<int64_t>(sizeof(T));
  for (int64_t o = 0; o < bytes; o += 64) hwy::Prefetch(p + o);
}
// Prefetch of one range into L2 spread over a loop: `calls` calls of step() cover it, each an equal slice.
// The decode kernels on 16-bit K/V bring the next key tile this way while the current one is computed:
// their widening keeps the core busy longer per byte than fp32, and with only the L1 prefetch a few rows
// ahead the memory idled through the softmax and the pass changes. With and without, interleaved in one run,
// three runs (32 query heads x 128, 32K keys, bf16 cache, 2 threads, Intel Xeon model 207): one query head
// per K/V head 30.7-33.4 -> 25.1-28.6 ms, four per K/V head 7.6-11.1 -> 6.8-10.4 ms. On fp32 (half the work
// per byte) it measured 2-10% slower, so fp32 keeps the L1 prefetch alone.
struct L2Pump {
  const char* p = nullptr;
  int64_t bytes = 0, step = 0, done = 0;
  L2Pump(const void* base, int64_t nbytes, int64_t calls)
      : p(static_cast<const char*>(base)),
        bytes(nbytes),
        step(calls > 0 ? (nbytes / calls + 64) / 64 * 64 : 0) {}
  void operator()() {
    const int64_t end = std::min(done + step, bytes);
    for (int64_t o = done; o < end; o += 64) __builtin_prefetch(p + o, 0, 1);  // locality 1: x86 prefetcht2
    done = end;
  }
};

// The tile's unnormalised probabilities of one key tile: masks, the online-softmax update of row r's
// running max m[r] and sum l[r] (alpha[r] = the rescale factor of its output), dropout. Rows are s[r * lds],
// keys 0..nk-1, padded with -inf to whole vectors (2^-inf = 0 adds nothing). p16 (the native bf16 dot path,
// AVX-512 target only): the probabilities go there instead, rounded to bf16 (ExpRowBf16), rows p16[r * lds],
// and l sums the rounded values.
void DotSoftmax(const Context& c, const TileRows& t, int64_t j0, int64_t nk, float* s, int64_t lds, float* m,
                float* l, float* alpha, const std::vector<DropoutRow>& drop, const float* bias_pos,
                const float* bias_slope, uint16_t* p16 = nullptr) {
  const Problem& p = c.p;
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), nkv = round_up(nk, N);
  const int64_t off = p.mask.any_causal() ? causal_offset(p) : 0;
  (void)p16;  // used on the AVX-512 target only
  const uint8_t* pad = p.mask.key_padding ? c.in.key_padding + t.b * p.seq_kv + j0 : nullptr;
  for (int64_t r = 0; r < t.nr; ++r) {
    float* sr = s + r * lds;
    if (c.cap2 > 0) SoftcapValues(sr, nk, c.cap2);
    std::fill(sr + nk, sr + nkv, kNegInf);
    if (p.mask.any_causal()) {  // keys j > pos + off are hidden from this row
      const int64_t seen = std::clamp<int64_t>(t.pos(r) + off + 1 - j0, 0, nk);
      std::fill(sr + seen, sr + nk, kNegInf);
    }
    if (pad)
      for (int64_t j = 0; j < nk; ++j)
        if (pad[j]) sr[j] = kNegInf;
    if (p.mask.boolean) {
      const uint8_t* allowed = c.in.mask + t.pos(r) * p.seq_kv + j0;
      for (int64_t j = 0; j < nk; ++j)
        if (!allowed[j]) sr[j] = kNegInf;
    }
    VF mx = hn::Set(d, kNegInf);
    if (c.bias_kind) {  // ALiBi, in the max pass (masked and padding scores stay -inf)
      const VF pos = hn::Set(d, bias_pos[r]), slope = hn::Set(d, bias_slope[r]);
      for (int64_t j = 0; j < nkv; j += N) {
        VF dist = hn::Sub(pos, hn::Iota(d, static_cast<float>(j0 + j)));
        if (c.bias_kind == 2) dist = hn::Abs(dist);
        const VF x = hn::MulAdd(slope, dist, hn::Load(d, sr + j));
        hn::Store(x, d, sr + j);
        mx = hn::Max(mx, x);
      }
    } else {
      for (int64_t j = 0; j < nkv; j += N) mx = hn::Max(mx, hn::Load(d, sr + j));
    }
    const float m_new = std::max(m[r], hn::GetLane(hn::MaxOfLanes(d, mx)));
    const float m_use = m_new == kNegInf ? 0.0f : m_new;  // no allowed key yet: 2^(-inf - 0) = 0
    const float a = hn::GetLane(Exp2(d, hn::Set(d, m[r] - m_use)));
    m[r] = m_new;
    alpha[r] = a;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if (p16) {
      uint16_t* pr = p16 + r * lds;
      l[r] = l[r] * a + ExpRowBf16(sr, nkv, m_use, pr);
      if (p.dropout > 0)
        for (int64_t jj = 0; jj < nk; ++jj)
          if (!drop[r].keep(j0 + jj)) pr[jj] = 0;
      continue;
    }
#endif
    const VF vm = hn::Set(d, m_use);
    VF sum0 = hn::Zero(d), sum1 = hn::Zero(d);
    int64_t j = 0;
    for (; j + 2 * N <= nkv; j += 2 * N) {
      const VF e0 = Exp2(d, hn::Sub(hn::Load(d, sr + j), vm));
      const VF e1 = Exp2(d, hn::Sub(hn::Load(d, sr + j + N), vm));
      hn::Store(e0, d, sr + j);
      hn::Store(e1, d, sr + j + N);
      sum0 = hn::Add(sum0, e0);
      sum1 = hn::Add(sum1, e1);
    }
    if (j < nkv) {
      const VF e0 = Exp2(d, hn::Sub(hn::Load(d, sr + j), vm));
      hn::Store(e0, d, sr + j);
      sum0 = hn::Add(sum0, e0);
    }
    l[r] = l[r] * a + hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
    if (p.dropout > 0)  // the sum above keeps every weight (dropout acts after normalisation)
      for (int64_t jj = 0; jj < nk; ++jj)
        if (!drop[r].keep(j0 + jj)) sr[jj] = 0.0f;
  }
}

// The K and V of one K/V head: fp32 in place, or 16-bit rows widened tile by tile into the scratch (the
// tensors stay 16-bit in memory; a tile is converted once per query tile, nk * D conversions against the
// 2 * nk * D * rows FLOPs that use it).
struct KvSource {
  const float* k = nullptr;
  const float* v = nullptr;
  const uint16_t* k16 = nullptr;
  const uint16_t* v16 = nullptr;
  DType dtype = DType::fp32;
  int64_t dim = 0, dv = 0;  // row widths of K (head_dim) and V (value_dim)
  // Floats from one V row to the next as the kernels read them: dv, or AttentionInputs::v_row_stride for
  // fp32 V read in place (V as a view of wider rows, e.g. MLA's latent within K); widened tiles are dv.
  int64_t ldv = 0;
  bool wide() const { return dtype != DType::fp32; }
  int64_t v_ld() const { return wide() ? dv : ldv; }
  const float* k_rows(int64_t j0, int64_t n, Scratch& w) const {
    if (!wide()) return k + j0 * dim;
    WidenValues(dtype, k16 + j0 * dim, n * dim, w.kt.data());
    return w.kt.data();
  }
  const float* v_rows(int64_t j0, int64_t n, Scratch& w) const {
    if (!wide()) return v + j0 * ldv;
    WidenValues(dtype, v16 + j0 * dv, n * dv, w.vt.data());
    return w.vt.data();
  }
};

// Where a dot-path tile's K and V rows come from. InPlace: the K/V head's rows in their storage type,
// 16-bit ones widened in registers (RowsBf16 / RowsF16), prefetched ahead in software. Widened: a 16-bit
// tile widened into the scratch first (KvSource), left to the hardware prefetcher; used when head_dim or
// d_v is not a multiple of the vector width, where the in-register kernels' scalar tails would not sum
// bitwise as the backward recomputes them (it scores widened fp32 rows).
template <class Rows>
struct InPlaceRows {
  const typename Rows::T *k, *v;
  int64_t D, ldv;  // K rows D apart, V rows ldv (d_v, or AttentionInputs::v_row_stride for fp32 V)
  static constexpr bool kPrefetch = true;
  const typename Rows::T* k_tile(int64_t j0, int64_t, Scratch&) const { return k + j0 * D; }
  const typename Rows::T* v_tile(int64_t j0, int64_t, Scratch&) const { return v + j0 * ldv; }
  int64_t v_ld() const { return ldv; }
};
struct WidenedRows {
  const KvSource& src;
  static constexpr bool kPrefetch = false;
  const float* k_tile(int64_t j0, int64_t n, Scratch& w) const { return src.k_rows(j0, n, w); }
  const float* v_tile(int64_t j0, int64_t n, Scratch& w) const { return src.v_rows(j0, n, w); }
  int64_t v_ld() const { return src.v_ld(); }
};

// Rows of a dot-path tile against keys [t.ja, t.jb): leaves m, l in w.stats and the unnormalised output
// rows in w.ot ([nr][V], V = value_dim). Rows: how K and V are stored where the kernels read them; Tiles
// (InPlaceRows / WidenedRows): where each key tile's rows are. Reading bf16 rows in place instead of a
// widening pass per tile: decode at 32K keys (8 heads of 64, bf16 cache) 4.93 -> 2.33 ms, 0.33 -> 0.74 of
// the in-run bandwidth (AMD EPYC, 2 threads, one run each; fp32 on the same cache: 3.2-3.7 ms).
template <class Rows, class Tiles>
void DotRows(const Context& c, const TileRows& t, Scratch& w, const Tiles& tiles) {
  static constexpr auto score_blocks = DotScoreBlocks<Rows>(std::make_integer_sequence<int, kDotRows>());
  static constexpr auto score_singles = DotScoreSingles<Rows>(std::make_integer_sequence<int, kDotRows>());
  static constexpr auto pv_table = DotPvTable<Rows>(std::make_integer_sequence<int, kDotRows>());
  const Problem& p = c.p;
  const int64_t D = p.head_dim, V = p.value_dim(), nr = t.nr, ld = round_up(nr, kLanes);
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF())), Vv = V / N * N;
  const int64_t lds = round_up(c.sched.tiles.kv, kLanes);
  float *qs = w.qt.data(), *s = w.s.data(), *o = w.ot.data();
  float *m = w.stats.data(), *l = m + ld, *alpha = l + 2 * ld;
  // P V column chunks: cv of W values per call (even/odd rows: chunks of 2N, two accumulators each).
  const int64_t kb = 8 / nr, cv = Rows::kEvenOdd ? 4 / nr : 8 / nr, W = Rows::kEvenOdd ? 2 * N : N;
  if constexpr (Rows::kEvenOdd) EvenOddOrder(qs, nr, D, D, /*to_dims=*/false);
  for (int64_t j0 = t.ja; j0 < t.jb; j0 += c.sched.tiles.kv) {
    const int64_t nk = std::min(c.sched.tiles.kv, t.jb - j0);
    const typename Rows::T* kt = tiles.k_tile(j0, nk, w);
    constexpr bool prefetch = Tiles::kPrefetch;
    int64_t j = 0;
    // K rows kPrefetchRows ahead, on into the next key tile of this task; before the P V pass, the first
    // V rows it reads (the later ones are prefetched block by block there).
    const int64_t k_left = t.jb - j0;
    // 16-bit rows in place: the next key tile's K during this score pass, its V during the P V pass (L2Pump).
    constexpr bool pump = prefetch && sizeof(typename Rows::T) == 2;
    const int64_t next = pump ? std::min(c.sched.tiles.kv, k_left - nk) : 0;
    const int64_t row_bytes = static_cast<int64_t>(sizeof(typename Rows::T));
    L2Pump k_pump(kt + nk * D, next * D * row_bytes, nk / kb);
    for (; j + kb <= nk; j += kb) {
      if (prefetch && j + kPrefetchRows < k_left)
        PrefetchRows(kt + (j + kPrefetchRows) * D, std::min(kb, k_left - j - kPrefetchRows), D);
      if constexpr (pump) k_pump();
      score_blocks[nr - 1](kt + j * D, D, qs, s + j, lds);
    }
    for (; j < nk; ++j) score_singles[nr - 1](kt + j * D, D, qs, s + j, lds);
    const typename Rows::T* vtile = tiles.v_tile(j0, nk, w);
    const int64_t ldv = tiles.v_ld();
    if (prefetch) PrefetchRows(vtile, std::min(kPvKeys, nk), ldv);
    L2Pump v_pump(vtile + nk * ldv, next * ldv * row_bytes, (nk + kPvKeys - 1) / kPvKeys);
    DotSoftmax(c, t, j0, nk, s, lds, m, l, alpha, w.drop, w.bias.data(), w.bias.data() + ld);
    // P V in blocks of kPvKeys keys, every head_dim chunk of a block before the next block: each V row is
    // then read whole while it is fresh (sweeping the tile once per chunk would fetch it from memory in
    // strided pieces, which measured at half the bandwidth of one sequential pass). alpha rescales the
    // running output once, on the first block.
    static const float kOnes[kDotRows] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (int64_t b0 = 0; b0 < nk; b0 += kPvKeys) {
      const int64_t nb = std::min(kPvKeys, nk - b0);
      const typename Rows::T* vt = vtile + b0 * ldv;
      const float* sb = s + b0;
      const float* scale = b0 == 0 ? alpha : kOnes;
      if (prefetch && b0 + kPvKeys < nk)
        PrefetchRows(vt + kPvKeys * ldv, std::min(kPvKeys, nk - b0 - kPvKeys), ldv);
      if constexpr (pump) v_pump();
      for (int64_t e = 0; e < Vv;) {
        const int64_t chunk = std::min(cv, (Vv - e) / W);
        pv_table[nr - 1][chunk - 1](vt, ldv, V, nb, sb, lds, o, scale, e);
        e += chunk * W;
      }
      for (int64_t r = 0; r < nr; ++r)  // value_dim tail (V not a multiple of the vector width)
        for (int64_t et = Vv; et < V; ++et) {
          float acc = o[r * V + et] * scale[r];
          for (int64_t jj = 0; jj < nb; ++jj) acc += sb[r * lds + jj] * Rows::Scalar(vt + jj * ldv + et);
          o[r * V + et] = acc;
        }
    }
  }
  if constexpr (Rows::kEvenOdd) EvenOddOrder(o, nr, V, V, /*to_dims=*/true);
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// ---- The native bf16 dot path: decode tiles (at most kDotRows rows) with vdpbf16ps (Context::bf16_dot) ----
// On bf16 storage the widening dot kernels spend two conversion instructions per 16 K or V values besides
// their FMAs, and decode is then bound by those instructions, not by memory. vdpbf16ps multiplies 32 bf16
// pairs exactly and adds them in fp32 (as the GEMM path's native kernels, tiled_bf16.cpp): the scores use K
// in place and the query rows as exact bf16 pairs (unscaled; the sums are scaled after), P V uses the
// probabilities rounded to bf16 (ExpRowBf16, the rounding SoftmaxUpdatePairs documents) against two V rows
// interleaved in registers. Needs head_dim and d_v multiples of 32 (RunQueryTile falls back otherwise).
HWY_POP_ATTRIBUTES
#define ATTN_TILED_BF16_TARGET __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

// Scores of KB keys x NR rows as DotScores: k rows D apart in place, q2 rows of D / 2 pair words.
template <int NR, int KB>
ATTN_TILED_BF16_TARGET HWY_NOINLINE void DotScoresPairs(const uint16_t* HWY_RESTRICT k, int64_t D,
                                                        const uint32_t* HWY_RESTRICT q2, float scale,
                                                        float* HWY_RESTRICT s, int64_t lds) {
  static_assert(NR * KB <= 8);
  __m512 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
  const int64_t D2 = D / 2;
  for (int64_t e2 = 0; e2 < D2; e2 += 16) {
    __m512i kv[KB], qv[NR];
    for (int b = 0; b < KB; ++b) kv[b] = _mm512_loadu_si512(k + b * D + 2 * e2);
    for (int r = 0; r < NR; ++r) qv[r] = _mm512_loadu_si512(q2 + r * D2 + e2);
    for (int b = 0; b < KB; ++b)
      for (int r = 0; r < NR; ++r)
        acc[b * NR + r] = _mm512_dpbf16_ps(acc[b * NR + r], (__m512bh)kv[b], (__m512bh)qv[r]);
  }
  float sums[8];
  SumLanes4(VF{acc[0]}, VF{acc[1]}, VF{acc[2]}, VF{acc[3]}, sums);
  if constexpr (NR * KB > 4) SumLanes4(VF{acc[4]}, VF{acc[5]}, VF{acc[6]}, VF{acc[7]}, sums + 4);
  for (int b = 0; b < KB; ++b)
    for (int r = 0; r < NR; ++r) s[r * lds + b] = sums[b * NR + r] * scale;
}

// The partner of an odd last key: zeros for up to 4 chunks of 32 values (its probability is 0 too).
alignas(64) constexpr uint16_t kZeroPairRow[128] = {};

// O rows (V apart) = alpha * O + P V for CV chunks of 32 value dims from e0 over keys 0..nk-1 in pairs: p16
// rows lds apart (the word at an even key holds it and the next), V rows ldv apart. vpunpck{l,h}wd pair the
// two V rows per 128-bit block, so a chunk's two accumulators hold dims 0-3, 8-11, 16-19, 24-27 and 4-7,
// 12-15, 20-23, 28-31: O stays in that order while the tile runs (PairOrderToDims puts it back).
template <int NR, int CV>
ATTN_TILED_BF16_TARGET HWY_NOINLINE void DotPvPairs(const uint16_t* HWY_RESTRICT v, int64_t ldv, int64_t V,
                                                    int64_t nk, const uint16_t* HWY_RESTRICT p16, int64_t lds,
                                                    float* HWY_RESTRICT o, const float* HWY_RESTRICT alpha,
                                                    int64_t e0) {
  static_assert(NR * CV <= 8 && CV <= 4);
  __m512 acc[NR][2 * CV];
  for (int r = 0; r < NR; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
    for (int c = 0; c < 2 * CV; ++c) acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * V + e0 + 16 * c), a);
  }
  for (int64_t j = 0; j < nk; j += 2) {
    const uint16_t* v0 = v + j * ldv + e0;
    const uint16_t* v1 = j + 1 < nk ? v0 + ldv : kZeroPairRow;
    __m512i lo[CV], hi[CV];
    for (int c = 0; c < CV; ++c) {
      const __m512i x0 = _mm512_loadu_si512(v0 + 32 * c), x1 = _mm512_loadu_si512(v1 + 32 * c);
      lo[c] = _mm512_unpacklo_epi16(x0, x1);
      hi[c] = _mm512_unpackhi_epi16(x0, x1);
    }
    for (int r = 0; r < NR; ++r) {
      uint32_t word;
      std::memcpy(&word, p16 + r * lds + j, sizeof word);
      const __m512bh pw = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(word));
      for (int c = 0; c < CV; ++c) {
        acc[r][2 * c] = _mm512_dpbf16_ps(acc[r][2 * c], (__m512bh)lo[c], pw);
        acc[r][2 * c + 1] = _mm512_dpbf16_ps(acc[r][2 * c + 1], (__m512bh)hi[c], pw);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < 2 * CV; ++c) _mm512_storeu_ps(o + r * V + e0 + 16 * c, acc[r][c]);
}

// Each 32-value chunk of `row` (n values) from DotPvPairs' order back to dims in order.
ATTN_TILED_BF16_TARGET void PairOrderToDims(float* row, int64_t n) {
  alignas(64) static constexpr int32_t kFirst[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static constexpr int32_t kSecond[16] = {8,  9,  10, 11, 24, 25, 26, 27,
                                                      12, 13, 14, 15, 28, 29, 30, 31};
  const __m512i first = _mm512_load_si512(kFirst), second = _mm512_load_si512(kSecond);
  for (int64_t e = 0; e < n; e += 32) {
    const __m512 a = _mm512_loadu_ps(row + e), b = _mm512_loadu_ps(row + e + 16);
    _mm512_storeu_ps(row + e, _mm512_permutex2var_ps(a, first, b));
    _mm512_storeu_ps(row + e + 16, _mm512_permutex2var_ps(a, second, b));
  }
}

using DotScoresPairsFn = void (*)(const uint16_t*, int64_t, const uint32_t*, float, float*, int64_t);
using DotPvPairsFn = void (*)(const uint16_t*, int64_t, int64_t, int64_t, const uint16_t*, int64_t, float*,
                              const float*, int64_t);
template <int... R>
constexpr std::array<DotScoresPairsFn, sizeof...(R)> PairScoreBlocks(std::integer_sequence<int, R...>) {
  return {&DotScoresPairs<R + 1, 8 / (R + 1)>...};
}
template <int... R>
constexpr std::array<DotScoresPairsFn, sizeof...(R)> PairScoreSingles(std::integer_sequence<int, R...>) {
  return {&DotScoresPairs<R + 1, 1>...};
}
// By rows NR (1..8) and 32-value chunks CV (1..4, NR * CV <= 8; nullptr beyond).
template <int NR, int... C>
constexpr std::array<DotPvPairsFn, 4> PairPvRow(std::integer_sequence<int, C...>) {
  return {(NR * (C + 1) <= 8 ? &DotPvPairs<NR, (NR * (C + 1) <= 8 ? C + 1 : 1)> : nullptr)...};
}
template <int... R>
constexpr std::array<std::array<DotPvPairsFn, 4>, sizeof...(R)> PairPvTable(
    std::integer_sequence<int, R...>) {
  return {PairPvRow<R + 1>(std::make_integer_sequence<int, 4>())...};
}
#undef ATTN_TILED_BF16_TARGET
HWY_PUSH_ATTRIBUTES(HWY_TARGET_STR)

// DotRows on bf16 K and V rows (k rows D apart, v rows d_v apart) with the kernels above: the query rows
// are in w.qt2 as pair words ([nr][D / 2], unscaled), the probabilities in w.p2 as 16-bit rows.
void DotRowsPairs(const Context& c, const TileRows& t, Scratch& w, const uint16_t* k, const uint16_t* v) {
  static constexpr auto score_blocks = PairScoreBlocks(std::make_integer_sequence<int, kDotRows>());
  static constexpr auto score_singles = PairScoreSingles(std::make_integer_sequence<int, kDotRows>());
  static constexpr auto pv_table = PairPvTable(std::make_integer_sequence<int, kDotRows>());
  const Problem& p = c.p;
  const int64_t D = p.head_dim, V = p.value_dim(), nr = t.nr, ld = round_up(nr, kLanes);
  const int64_t lds = round_up(c.sched.tiles.kv, kLanes);
  const uint32_t* q2 = w.qt2.data();
  float *s = w.s.data(), *o = w.ot.data();
  float *m = w.stats.data(), *l = m + ld, *alpha = l + 2 * ld;
  uint16_t* p16 = reinterpret_cast<uint16_t*>(w.p2.data());
  const int64_t kb = 8 / nr, cv = std::min<int64_t>(4, 8 / nr);
  static const float kOnes[kDotRows] = {1, 1, 1, 1, 1, 1, 1, 1};
  for (int64_t j0 = t.ja; j0 < t.jb; j0 += c.sched.tiles.kv) {
    const int64_t nk = std::min(c.sched.tiles.kv, t.jb - j0), k_left = t.jb - j0;
    const uint16_t* kt = k + j0 * D;
    int64_t j = 0;
    for (; j + kb <= nk; j += kb) {  // K rows kPrefetchRows ahead, as DotRows
      if (j + kPrefetchRows < k_left)
        PrefetchRows(kt + (j + kPrefetchRows) * D, std::min(kb, k_left - j - kPrefetchRows), D);
      score_blocks[nr - 1](kt + j * D, D, q2, c.q_scale, s + j, lds);
    }
    for (; j < nk; ++j) score_singles[nr - 1](kt + j * D, D, q2, c.q_scale, s + j, lds);
    const uint16_t* vtile = v + j0 * V;
    PrefetchRows(vtile, std::min(kPvKeys, nk), V);
    DotSoftmax(c, t, j0, nk, s, lds, m, l, alpha, w.drop, w.bias.data(), w.bias.data() + ld, p16);
    for (int64_t b0 = 0; b0 < nk; b0 += kPvKeys) {  // as DotRows: blocks of keys, every chunk of a block
      const int64_t nb = std::min(kPvKeys, nk - b0);
      const uint16_t* vt = vtile + b0 * V;
      if (b0 + kPvKeys < nk) PrefetchRows(vt + kPvKeys * V, std::min(kPvKeys, nk - b0 - kPvKeys), V);
      for (int64_t e = 0; e < V;) {
        const int64_t chunk = std::min(cv, (V - e) / 32);
        pv_table[nr - 1][chunk - 1](vt, V, V, nb, p16 + b0, lds, o, b0 == 0 ? alpha : kOnes, e);
        e += chunk * 32;
      }
    }
  }
  for (int64_t r = 0; r < nr; ++r) PairOrderToDims(o + r * V, V);
}

// DotRows on AMX (tiled_amx.cpp; Context::amx): per key tile the scores from amx_scores, as DotSoftmax's rows
// and scaled there (the query pairs in w.qt2, [D / 2][16], are unscaled), probabilities
// rounded to bf16 into w.p2 as 16-bit rows zero-padded to whole 32-key blocks, V packed into key pairs, the
// tile's P V from amx_pv added to alpha times the running output, which stays in the packing's value order
// until the end (PairOrderToDims).
void DotRowsAmx(const Context& c, const TileRows& t, Scratch& w, const uint16_t* k, const uint16_t* v) {
  const Problem& p = c.p;
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t D = p.head_dim, V = p.value_dim(), nr = t.nr, ld = round_up(nr, kLanes);
  const int64_t lds = Scratch::round32(c.sched.tiles.kv);
  float *s = w.s.data(), *o = w.ot.data(), *part = w.opart.data();
  float *m = w.stats.data(), *l = m + ld, *alpha = l + 2 * ld;
  uint16_t* p16 = reinterpret_cast<uint16_t*>(w.p2.data());
  for (int64_t j0 = t.ja; j0 < t.jb; j0 += c.sched.tiles.kv) {
    const int64_t nk = std::min(c.sched.tiles.kv, t.jb - j0);
    amx_scores(k + j0 * D, v + j0 * V, D, V, nk, t.jb - j0, w.qt2.data(), nr, c.q_scale, s, lds,
               w.ktail.data(), w.vt2.data());
    DotSoftmax(c, t, j0, nk, s, lds, m, l, alpha, w.drop, w.bias.data(), w.bias.data() + ld, p16);
    const int64_t filled = round_up(nk, N), n32 = Scratch::round32(nk);
    for (int64_t r = 0; r < nr; ++r) std::fill(p16 + r * lds + filled, p16 + r * lds + n32, uint16_t{0});
    const int64_t next = std::min(c.sched.tiles.kv, t.jb - j0 - nk);  // the next tile's keys, prefetched
    amx_pv(w.vt2.data(), V, nk, p16, lds, nr, part, k + (j0 + nk) * D, next * D * 2, v + (j0 + nk) * V,
           next * V * 2);
    for (int64_t r = 0; r < nr; ++r) {
      const VF a = hn::Set(d, alpha[r]);
      float *orow = o + r * V, *prow = part + r * V;
      for (int64_t e = 0; e < V; e += N)
        hn::StoreU(hn::MulAdd(a, hn::LoadU(d, orow + e), hn::LoadU(d, prow + e)), d, orow + e);
    }
  }
  for (int64_t r = 0; r < nr; ++r) PairOrderToDims(o + r * V, V);
}
#endif

// Rows of a GEMM-path tile against keys [t.ja, t.jb): leaves m, l in w.stats and the unnormalised output
// transposed in w.ot ([V][ld], V = value_dim).
// native_bf16: score with vdpbf16ps on the bf16 K tile in place and the bf16 pairs of Q^T in w.qt2, and
// P V with vdpbf16ps on P rounded to bf16 and the V tile packed as key pairs (tiled_bf16.cpp); otherwise
// the fp32 kernels on K and V (widened per tile for 16-bit storage) and w.qt.
void GemmRows(const Context& c, const TileRows& t, Scratch& w, const KvSource& src, bool native_bf16) {
  const Problem& p = c.p;
  const int64_t D = p.head_dim, V = p.value_dim(), ld = round_up(t.nr, kLanes);
  float *qt = w.qt.data(), *s = w.s.data(), *ot = w.ot.data();
  float *m = w.stats.data(), *l = m + ld, *tile_max = l + ld, *alpha = tile_max + ld;
  const int64_t off = p.mask.any_causal() ? causal_offset(p) : 0;
  const LaneBias bias{c.bias_kind, w.bias.data(), w.bias.data() + ld};
  for (int64_t j0 = t.ja; j0 < t.jb; j0 += c.sched.tiles.kv) {
    const int64_t nk = std::min(c.sched.tiles.kv, t.jb - j0);
    // Soft-capping comes between the scores and the bias: the kernels score without the bias, the cap and
    // the bias follow, and the maxima are taken in a pass of their own.
    const bool capped = c.cap2 > 0;
    const bool masked =
        capped || (p.mask.any_causal() && j0 + nk - 1 > t.i0 + off) || p.mask.boolean || p.mask.key_padding;
    const LaneBias score_bias = capped ? LaneBias{} : bias;
    if (!masked) std::fill(tile_max, tile_max + ld, kNegInf);
    if (native_bf16)
      bf16_score_tile(src.k16 + j0 * D, D, w.qt2.data(), ld, nk, s, masked ? nullptr : tile_max, c.q_scale,
                      score_bias, j0);
    else
      ScoreTile(src.k_rows(j0, nk, w), D, qt, ld, nk, s, masked ? nullptr : tile_max, score_bias, j0);
    if (capped) {
      SoftcapValues(s, nk * ld, c.cap2);
      if (bias.kind) AddBiasTile(s, ld, nk, bias, j0);
    }
    if (masked) {
      MaskTile(c, t, j0, nk, s, ld);
      TileMaxPass(s, ld, nk, tile_max);
    }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if (native_bf16) {
      uint32_t* p2 = w.p2.data();
      SoftmaxUpdatePairs(s, ld, nk, m, l, tile_max, alpha, p2);
      if (p.dropout > 0)  // as below, on the packed halves
        for (int64_t r = 0; r < t.nr; ++r)
          for (int64_t j = 0; j < nk; ++j)
            if (!w.drop[r].keep(j0 + j)) p2[j / 2 * ld + r] &= j % 2 ? 0x0000ffffu : 0xffff0000u;
      // V as key pairs, packed per tile (once per call per K/V head measured no faster at n = 4096 and
      // would make the workspace grow with seq_kv).
      bf16_pack_pairs(src.v16 + j0 * V, nk, V, w.vt2.data());
      bf16_pv_tile(w.vt2.data(), V, p2, ld, (nk + 1) / 2, ot, alpha);
      continue;
    }
#endif
    SoftmaxUpdate(s, ld, nk, m, l, tile_max, alpha);
    if (p.dropout > 0) {
      // The sums above keep every weight (dropout acts after normalisation); dropped weights leave P here.
      for (int64_t r = 0; r < t.nr; ++r)
        for (int64_t j = 0; j < nk; ++j)
          if (!w.drop[r].keep(j0 + j)) s[j * ld + r] = 0.0f;
    }
    PvTile(src.v_rows(j0, nk, w), V, src.v_ld(), s, ld, nk, ot, alpha);
  }
}

// The training forward's saved state of a row (Context::lse): its running max m (base 2) and log2 of its
// sum l, kept apart so the backward's 2^((s - m) - log2 l) never rounds m + log2 l (at |m| ~ 100 that sum
// would lose the ~1e-6 a near one-hot row's log2 l holds). No allowed key: m = +inf (the backward's weights
// are 2^-inf = 0); a NaN in the row stays NaN.
void SaveRowState(const Context& c, const TileRows& t, int64_t r, float m, float l) {
  const Problem& p = c.p;
  const int64_t rows = p.batch * p.heads * p.seq_q, row = (t.b * p.heads + t.head(r)) * p.seq_q + t.pos(r);
  const bool empty = l == 0.0f;
  c.lse[row] = empty ? std::numeric_limits<float>::infinity() : m;
  c.lse[rows + row] = empty ? 0.0f : std::log2(l);
}

TileRows unit_rows(const Context& c, int64_t unit) {
  const Problem& p = c.p;
  const Schedule& sc = c.sched;
  const int64_t per_batch = p.num_kv_heads() * sc.q_tiles;
  TileRows t{};
  t.b = unit / per_batch;
  t.kvh = unit % per_batch / sc.q_tiles;
  t.i0 = unit % sc.q_tiles * sc.tiles.q;
  t.np = std::min(sc.tiles.q, p.seq_q - t.i0);
  t.group = sc.group;
  t.nr = t.np * sc.group;
  return t;
}

float* out_row(const Context& c, const TileRows& t, int64_t r) {
  const Problem& p = c.p;
  return c.in.out + ((t.b * p.heads + t.head(r)) * p.seq_q + t.pos(r)) * p.value_dim();
}

void RunQueryTile(const Context& c, int64_t unit, int64_t split, Scratch& w) {
  const Problem& p = c.p;
  const Schedule& sc = c.sched;
  const int64_t D = p.head_dim, V = p.value_dim();
  TileRows t = unit_rows(c, unit);
  const int64_t nr = t.nr, ld = round_up(nr, kLanes);
  const bool dropout = p.dropout > 0, dot = nr <= kDotRows;
  // bf16 with vdpbf16ps (Context::bf16_dot), on the AVX-512 target only: GEMM-path tiles (native_bf16),
  // and dot-path (decode) tiles whose head_dim and d_v are multiples of 32 (native_dot); other tiles and
  // the other targets widen and use fp32 FMAs.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  const bool amx_dot = c.amx && amx_tile_rows(nr);
  const bool native_bf16 = c.bf16_dot && !dot && !amx_dot;
  const bool native_dot = !amx_dot && c.bf16_dot && dot && D % 32 == 0 && V % 32 == 0;
#else
  const bool native_bf16 = false, native_dot = false, amx_dot = false;
#endif
  const bool row_major = dot || amx_dot;  // ot as [rows][V] (else [V][ld])
  const bool wide = p.dtype != DType::fp32;
  w.ensure(ld, sc.tiles.kv, D, V, dropout, wide, native_bf16 || native_dot || amx_dot);
  float *qt = w.qt.data(), *ot = w.ot.data();
  float *m = w.stats.data(), *l = m + ld;

  // Causal: keys beyond the last row's limit are hidden from all of the tile, so they are never visited.
  const int64_t kv_end = causal_key_end(p, t.i0 + t.np - 1);
  if (sc.splits > 1) {
    // This split's part of the unit's keys: equal parts in whole key tiles (some may be empty).
    const int64_t part = round_up((kv_end + sc.splits - 1) / sc.splits, sc.tiles.kv);
    t.ja = std::min(kv_end, split * part);
    t.jb = std::min(kv_end, t.ja + part);
  } else {
    t.ja = 0;
    t.jb = kv_end;
  }

  for (int64_t r = 0; r < nr; ++r) {
    const int64_t at = ((t.b * p.heads + t.head(r)) * p.seq_q + t.pos(r)) * D;
    if (native_bf16 || native_dot || amx_dot) {  // Q as bf16 pairs, unscaled (exact); the kernels scale
      const uint16_t* q = c.in.q16 + at;         // their sums
      const int64_t at2 = native_dot ? r * (D / 2) : r, step = native_dot ? 1 : ld;
      for (int64_t e2 = 0; e2 < D / 2; ++e2)
        w.qt2[at2 + e2 * step] = static_cast<uint32_t>(q[2 * e2]) | static_cast<uint32_t>(q[2 * e2 + 1])
                                                                        << 16;
      continue;
    }
    auto q_at = [&](int64_t e) { return wide ? widen(p.dtype, c.in.q16[at + e]) : c.in.q[at + e]; };
    if (dot) {
      for (int64_t e = 0; e < D; ++e) qt[r * D + e] = q_at(e) * c.q_scale;
    } else {
      for (int64_t e = 0; e < D; ++e) qt[e * ld + r] = q_at(e) * c.q_scale;
    }
  }
  if (native_bf16 || amx_dot)  // the zero columns past nr (AMX: ld is 16, its B tile's width)
    for (int64_t e2 = 0; e2 < D / 2; ++e2) std::fill(&w.qt2[e2 * ld + nr], &w.qt2[e2 * ld] + ld, 0u);
  else if (!row_major)
    for (int64_t e = 0; e < D; ++e) std::fill(qt + e * ld + nr, qt + (e + 1) * ld, 0.0f);  // padding lanes
  if (c.bias_kind) {  // ALiBi lane vectors: query position in the key sequence, -slope * log2(e)
    float *bpos = w.bias.data(), *bslope = bpos + ld;
    const int64_t shift = alibi_query_offset(p);
    for (int64_t r = 0; r < ld; ++r) {
      bpos[r] = r < nr ? static_cast<float>(t.pos(r) + shift) : 0.0f;
      bslope[r] = r < nr ? c.alibi_l2e[static_cast<std::size_t>(t.head(r))] : 0.0f;
    }
  }
  std::fill(ot, ot + V * ld, 0.0f);
  std::fill(m, m + ld, kNegInf);
  std::fill(l, l + ld, 0.0f);
  // Sink logits: each row's softmax starts with its sink (running max the sink, sum 2^0 = 1, no value); with
  // split-KV only the first split carries it.
  if (p.sinks && split == 0)
    for (int64_t r = 0; r < nr; ++r) {
      m[r] = c.sink_l2e[static_cast<std::size_t>(t.head(r))];
      l[r] = 1.0f;
    }
  if (dropout)
    for (int64_t r = 0; r < nr; ++r) w.drop[r] = DropoutRow(p.dropout, p.seed, t.b, t.head(r), t.pos(r));

  // Grouped-query attention: every row of the tile reads the one K/V head they share, in place.
  // A reserved cache (AttentionInputs::kv_capacity) and strided V (v_row_stride) are read in place; both are
  // fp32 only (Attention::run refuses them otherwise), so the 16-bit offsets keep the contiguous layout.
  const int64_t block_rows = kv_block_rows(p, c.in), ldv = v_row_stride(p, c.in);
  const int64_t kv_rows = (t.b * p.num_kv_heads() + t.kvh) * block_rows, k_at = kv_rows * D,
                v_at = kv_rows * (wide ? V : ldv);
  KvSource src;
  src.dtype = p.dtype;
  src.dim = D;
  src.dv = V;
  src.ldv = ldv;
  if (wide) {
    src.k16 = c.in.k16 + k_at;
    src.v16 = c.in.v16 + v_at;
  } else {
    src.k = c.in.k + k_at;
    src.v = c.in.v + v_at;
  }
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DF()));
  const bool whole_vectors = D % lanes == 0 && V % lanes == 0;
  if (amx_dot || native_dot) {  // false on the other targets
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if (amx_dot)
      DotRowsAmx(c, t, w, src.k16, src.v16);
    else
      DotRowsPairs(c, t, w, src.k16, src.v16);
#endif
  } else if (dot && !wide) {
    DotRows<RowsF32>(c, t, w, InPlaceRows<RowsF32>{src.k, src.v, D, src.v_ld()});
  } else if (dot && whole_vectors && p.dtype == DType::bf16 && t.nr <= 4 && D % (2 * lanes) == 0 &&
             V % (2 * lanes) == 0) {
    DotRows<RowsBf16EvenOdd>(c, t, w, InPlaceRows<RowsBf16EvenOdd>{src.k16, src.v16, D, V});
  } else if (dot && whole_vectors && p.dtype == DType::bf16) {
    DotRows<RowsBf16>(c, t, w, InPlaceRows<RowsBf16>{src.k16, src.v16, D, V});
  } else if (dot && whole_vectors && p.dtype == DType::fp16) {
    DotRows<RowsF16>(c, t, w, InPlaceRows<RowsF16>{src.k16, src.v16, D, V});
  } else if (dot) {
    DotRows<RowsF32>(c, t, w, WidenedRows{src});
  } else {
    GemmRows(c, t, w, src, native_bf16);
  }

  auto o_at = [&](int64_t r, int64_t e) { return row_major ? ot[r * V + e] : ot[e * ld + r]; };
  if (sc.splits > 1 || c.partial_out) {
    // Partial rows: running max, sum and the unnormalised output, merged by MergeSplits.
    const int64_t stride = sc.partial_stride(p);
    float* part = c.partials + ((unit * sc.splits + split) * sc.rows) * stride;
    for (int64_t r = 0; r < nr; ++r) {
      float* pr = part + r * stride;
      pr[0] = m[r];
      pr[1] = l[r];
      for (int64_t e = 0; e < V; ++e) pr[2 + e] = o_at(r, e);
    }
    return;
  }
  // The one division: O = O / l. A query with no allowed key has l = 0 and gets zeros; a NaN anywhere in
  // its inputs leaves l NaN, and so its output, visible.
  const float keep_scale = dropout ? DropoutRow(p.dropout, p.seed, 0, 0, 0).scale() : 1.0f;
  if (c.lse)
    for (int64_t r = 0; r < nr; ++r) SaveRowState(c, t, r, m[r], l[r]);
  for (int64_t r = 0; r < nr; ++r) {
    float* o = out_row(c, t, r);
    const float li = l[r];
    if (li == 0.0f) {
      std::fill(o, o + V, 0.0f);
      continue;
    }
    const float inv = keep_scale / li;
    for (int64_t e = 0; e < V; ++e) o[e] = o_at(r, e) * inv;
  }
}

// Split-KV merge of one unit, splits in order: M = max_s m_s, w_s = 2^(m_s - M), out = sum_s w_s o_s /
// sum_s w_s l_s (the online-softmax rule, with log2(e) already in the logits). Splits that saw no allowed
// key have m = -inf and weigh 0; a row no split saw gets zeros; a NaN max or sum stays NaN.
void MergeSplits(const Context& c, int64_t unit) {
  const Problem& p = c.p;
  const Schedule& sc = c.sched;
  const DF d;
  const int64_t D = p.value_dim(), stride = sc.partial_stride(p);  // D: the output width d_v
  const TileRows t = unit_rows(c, unit);
  const float keep_scale = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, 0, 0, 0).scale() : 1.0f;
  const float* part = c.partials + unit * sc.splits * sc.rows * stride;
  for (int64_t r = 0; r < t.nr; ++r) {
    float mx = kNegInf;
    bool nan = false;
    for (int64_t s = 0; s < sc.splits; ++s) {
      const float ms = part[(s * sc.rows + r) * stride];
      nan = nan || std::isnan(ms);
      mx = std::max(mx, ms);
    }
    float* o = out_row(c, t, r);
    if (nan) {
      std::fill(o, o + D, std::numeric_limits<float>::quiet_NaN());
      if (c.lse) SaveRowState(c, t, r, std::numeric_limits<float>::quiet_NaN(), 1.0f);
      continue;
    }
    std::fill(o, o + D, 0.0f);
    if (mx == kNegInf) {  // no split saw an allowed key
      if (c.lse) SaveRowState(c, t, r, mx, 0.0f);
      continue;
    }
    float sum = 0.0f;
    for (int64_t s = 0; s < sc.splits; ++s) {
      const float* pr = part + (s * sc.rows + r) * stride;
      const float ws = hn::GetLane(Exp2(d, hn::Set(d, pr[0] - mx)));  // 2^-inf = 0 for empty splits
      if (ws == 0.0f) continue;
      sum += ws * pr[1];
      for (int64_t e = 0; e < D; ++e) o[e] += ws * pr[2 + e];
    }
    const float inv = sum == 0.0f ? 0.0f : keep_scale / sum;
    for (int64_t e = 0; e < D; ++e) o[e] = sum == 0.0f ? 0.0f : o[e] * inv;
    if (std::isnan(sum))
      for (int64_t e = 0; e < D; ++e) o[e] = std::numeric_limits<float>::quiet_NaN();
    if (c.lse) SaveRowState(c, t, r, mx, sum);
  }
}

// Block partials (accumulate_block, tiled.hpp): merges the partial rows of `unit` (its splits, in order) into
// the running state with the online-softmax rule of MergeSplits, the state acting as one more split ahead of
// them: M = max(m, m_s), a = 2^(m - M), w_s = 2^(m_s - M), l = a l + sum_s w_s l_s, o = a o + sum_s w_s o_s.
// Nothing is divided. A row that has seen no allowed key keeps m = -inf, l = 0, o = 0; a NaN max or sum
// (a NaN in the inputs) makes the row's m and l NaN for good, so FinishState writes NaN.
void MergeIntoState(const Context& c, int64_t unit, const PartialState& st) {
  const Problem& p = c.p;
  const Schedule& sc = c.sched;
  const DF d;
  const int64_t D = p.value_dim(), stride = sc.partial_stride(p);  // D: the output width d_v
  const TileRows t = unit_rows(c, unit);
  const float* part = c.partials + unit * sc.splits * sc.rows * stride;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t r = 0; r < t.nr; ++r) {
    const int64_t row = (t.b * p.heads + t.head(r)) * p.seq_q + t.pos(r);
    float &m = st.m[row], &l = st.l[row];
    float* o = st.o + row * D;
    bool bad = std::isnan(m) || std::isnan(l);
    float mx = m;
    for (int64_t s = 0; s < sc.splits; ++s) {
      const float* pr = part + (s * sc.rows + r) * stride;
      bad = bad || std::isnan(pr[0]) || std::isnan(pr[1]);
      mx = std::max(mx, pr[0]);
    }
    if (bad) {
      m = l = nan;
      continue;
    }
    if (mx == kNegInf) continue;                               // nothing allowed yet
    const float a = hn::GetLane(Exp2(d, hn::Set(d, m - mx)));  // 2^-inf = 0 for a fresh row
    l *= a;
    for (int64_t e = 0; e < D; ++e) o[e] *= a;
    for (int64_t s = 0; s < sc.splits; ++s) {
      const float* pr = part + (s * sc.rows + r) * stride;
      const float ws = hn::GetLane(Exp2(d, hn::Set(d, pr[0] - mx)));  // 0 for a split with no allowed key
      if (ws == 0.0f) continue;
      l += ws * pr[1];
      for (int64_t e = 0; e < D; ++e) o[e] += ws * pr[2 + e];
    }
    m = mx;
  }
}

// Whether this target runs the native bf16 kernels (tiled_bf16.cpp is called from the AVX-512 target only).
bool NativeBf16Target() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return true;
#else
  return false;
#endif
}

}  // namespace attn::tiled::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::tiled {
HWY_EXPORT(RunQueryTile);
HWY_EXPORT(MergeSplits);
HWY_EXPORT(MergeIntoState);
HWY_EXPORT(NativeBf16Target);

std::string native_bf16_unavailable() {
  if (std::string why = bf16_dot_missing(); !why.empty()) return why;
  if (!HWY_DYNAMIC_DISPATCH(NativeBf16Target)())
    return "the selected SIMD target " + simd::active_isa() + " is not AVX-512 (avx3)";
  return "";
}
std::string amx_unavailable() {
  if (std::string why = amx_missing(); !why.empty()) return why;
  if (!HWY_DYNAMIC_DISPATCH(NativeBf16Target)())
    return "the selected SIMD target " + simd::active_isa() + " is not AVX-512 (avx3)";
  return "";
}

void run_query_tile(const Context& c, int64_t unit, int64_t split, Scratch& w) {
  HWY_DYNAMIC_DISPATCH(RunQueryTile)(c, unit, split, w);
}
void merge_splits(const Context& c, int64_t unit) {
  HWY_DYNAMIC_DISPATCH(MergeSplits)(c, unit);
}
void merge_into_state(const Context& c, int64_t unit, const PartialState& st) {
  HWY_DYNAMIC_DISPATCH(MergeIntoState)(c, unit, st);
}
}  // namespace attn::tiled
#endif  // HWY_ONCE
