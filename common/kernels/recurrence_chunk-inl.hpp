// Per-target building blocks of the chunkwise form, shared by its forward (recurrence_chunk.cpp) and backward
// (recurrence_chunk_backward.cpp): the chunk buffers, the register-blocked product, the decayed exponentials
// and the intra-chunk scores. Included once per target inside that target's namespace (Highway's toggle
// guard).
//
// The chunkwise-parallel form of the gated / delta-rule recurrences (common/kernels/recurrence.hpp). Per
// (batch, head), chunks of C tokens in order, the state S (d_k x d_v, fp32) carried across. Inside a chunk,
// with Gamma_t = sum of the log decays from the chunk's start to token t (inclusive), and u_t the value row
// each token adds (v_t, or the delta rule's beta_t (v_t - exp(g_t) k_t S_{t-1})):
//
//   S_t = exp(Gamma_t) S_0 + sum_{s <= t} exp(Gamma_t - Gamma_s) k_sᵀ u_s        (scalar gates)
//   o_t = scale (exp(Gamma_t) q_t S_0 + sum_{s <= t} exp(Gamma_t - Gamma_s) (q_t . k_s) u_s)
//
// i.e. O = scale (diag(e^Gamma) Q S_0 + (Q Kᵀ ⊙ D) U) with D_ts = exp(Gamma_t - Gamma_s) below the diagonal,
// and S_C = e^Gamma_C S_0 + (diag(e^(Gamma_C - Gamma)) K)ᵀ U. The scores Q Kᵀ (C x C) are sums over d_k; U,
// the products with U and S's columns are d_v wide. Vector gates (gla) make every exponent per key channel
// (d_k of them). The delta rule's U (C x d_v) solves (I + A) U = diag(beta) (V - diag(e^Gamma) K S_0) with
// A_ts = beta_t D_ts (k_t . k_s) strictly below the diagonal: the UT transform of DeltaNet / Gated DeltaNet
// (Yang et al. 2024; flash-linear-attention's chunk_delta_rule computes T = (I + A)^-1 and W = T diag(beta)
// K, U = T diag(beta) V to run chunks in parallel; here chunks run in order with the state known, so one
// forward substitution on the combined right-hand side replaces T, W and U).
//
// Overflow and underflow: every exponential taken is of Gamma_t - Gamma_s with s <= t (or of Gamma_t,
// Gamma_C - Gamma_s, relative to the chunk start or end), all <= 0, so no factor exceeds 1; the cumulative
// sums are kept in fp64 (with g >= -30 a step they reach -1920 inside a chunk of 64, and an fp32 sum would
// lose the small differences between large sums), and each difference is rounded once to fp32 before its
// exponential. Entries with s > t are never exponentiated (exp(+1920) would overflow, and inf * 0 is NaN);
// a decay below fp32's normal range is 0, the correct limit. gla never factors exp(Gamma_t - Gamma_s) into
// exp(Gamma_t) exp(-Gamma_s) across a chunk: inside a chunk it works by blocks of kGlaBlock tokens, splits
// exp(Gamma_t - Gamma_s) for s in an earlier block into three factors <= 1 at the blocks' ends (see
// vector_scores), and takes the diagonal blocks elementwise.
//
// The exponentials are the softmax's exp2 polynomial (common/kernels/simd-inl.hpp: <= 1.5 ulp, 0 below
// 2^-126) of x log2(e), x the fp32 difference (std::exp for the last columns when d_k is not a multiple of
// the vector): rounding x and the log2(e) multiply change e^x by at most e^x |x| 2^-24 <= 2^-24 / e in
// absolute terms, as the factors multiply quantities they are bounded against.
#if defined(ATTN_COMMON_RECURRENCE_CHUNK_INL_HPP_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_COMMON_RECURRENCE_CHUNK_INL_HPP_
#undef ATTN_COMMON_RECURRENCE_CHUNK_INL_HPP_
#else
#define ATTN_COMMON_RECURRENCE_CHUNK_INL_HPP_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/kernels/recurrence.hpp"
#include "common/kernels/simd-inl.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::chunk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using simd::HWY_NAMESPACE::DF;
using simd::HWY_NAMESPACE::Exp2;
using simd::HWY_NAMESPACE::kPadLanes;

constexpr int64_t kGlaBlock = 16;  // gla's intra-chunk block of query rows (see above)
constexpr float kLog2e = 1.4426950408889634f;

// One head's buffers for one chunk (at most C rows), d_k the width of Q, K and the gates, d_v of V.
struct ChunkBuffers {
  // qk: [K; Q] (2C x d_k: the chunk's normalised keys, then its queries; the delta rule); kt: Kᵀ (d_k x C);
  // x: [K; Q] S_0 (2C x d_v; gla: the d_k x C scratch of vector_scores); bp: [K; Q] Kᵀ (2C x C); a: the
  // masked, decayed scores (C x C); dm: D (C x C, scalar gates); u: the delta rule's U (C x d_v; gla: a row
  // of d_k scratch); kd, qg: C x d_k (gla's off-diagonal blocks keep kd transposed, d_k x C); s: the state
  // (d_k x d_v); xd: exponent differences (C x d_k + d_k).
  std::vector<float> qk, kt, x, bp, a, dm, u, kd, qg, s, xd;
  std::vector<double> gam;                   // C (scalar) or C x d_k (vector) cumulative log decays
  const float *kp = nullptr, *qp = nullptr;  // the chunk's keys and queries (load_rows)
  std::vector<float> ed, el;                 // C: e^Gamma_t, e^(Gamma_C - Gamma_t) (scalar gates)
  ChunkBuffers(int64_t c, int64_t dk, int64_t dv)
      : qk(2 * c * dk),
        kt(c * dk),
        x(c * std::max(2 * dv, dk)),
        bp(2 * c * c),
        a(c * c),
        dm(c * c),
        u(std::max(c * dv, dk)),
        kd(c * dk),
        qg(c * dk),
        s(dk * dv),
        xd(c * dk + dk),
        gam(c * dk),
        ed(c),
        el(c) {}
};

// The chunk's products, C (m x n, row-major, ldc) = alpha A B (+ C when accumulating), B row-major (k x n,
// ldb) and A(i, p) = a[i * ars + p * acs] (so A or Aᵀ of a row-major matrix). A register-blocked micro-kernel
// (MR rows x NV vectors of C in registers, B's row vectors loaded and A's elements broadcast, as tiled's
// micro-kernels): at d = C = 64 the products are too small for OpenBLAS to reach its large-matrix speed (and
// OPENBLAS_CORETYPE may hold it to AVX2), while these run on the CPU's own SIMD target. Every sum runs over
// p = 0 .. k - 1 in order, whatever the blocking: results do not depend on threads.
//   lower_a: A is lower triangular (A(i, p) = 0 for p > i, and zero in memory there): a block of rows sums
//            only up to its last row.
//   lower_c: only C(i, j) with j <= i is wanted: column blocks wholly above a block of rows are skipped
//            (left as they were).
// AVX-512, SVE and NEON (32 registers): 8 x 2 accumulators; AVX2 and older x86 (16 registers): 4 x 2.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr int kGemmRows = 4;
#else
constexpr int kGemmRows = 8;
#endif
struct Gemm {
  const float* a;
  int64_t ars, acs;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc, m, n, k;
  float alpha = 1.0f;
  bool accumulate = false, lower_a = false, lower_c = false;
};

// Accumulators in named variables (SVE vectors are sizeless and cannot be array elements); rows past MR and
// the second vector when NV == 1 are never touched.
#define ATTN_RC_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define ATTN_RC_DECLARE(r) auto acc##r##_0 = hn::Zero(df), acc##r##_1 = hn::Zero(df);
#define ATTN_RC_FMA(r)                                                \
  if constexpr (r < MR) {                                             \
    const auto x = hn::Set(df, ap[r * ars]);                          \
    acc##r##_0 = hn::MulAdd(x, b0, acc##r##_0);                       \
    if constexpr (NV > 1) acc##r##_1 = hn::MulAdd(x, b1, acc##r##_1); \
  }
#define ATTN_RC_STORE(r)                                                                               \
  if constexpr (r < MR) {                                                                              \
    float* cr = c + r * ldc;                                                                           \
    if (accumulate) {                                                                                  \
      hn::StoreU(hn::MulAdd(va, acc##r##_0, hn::LoadU(df, cr)), df, cr);                               \
      if constexpr (NV > 1) hn::StoreU(hn::MulAdd(va, acc##r##_1, hn::LoadU(df, cr + N)), df, cr + N); \
    } else {                                                                                           \
      hn::StoreU(hn::Mul(va, acc##r##_0), df, cr);                                                     \
      if constexpr (NV > 1) hn::StoreU(hn::Mul(va, acc##r##_1), df, cr + N);                           \
    }                                                                                                  \
  }

template <int MR, int NV>
HWY_NOINLINE void gemm_kernel(const float* HWY_RESTRICT a, int64_t ars, int64_t acs,
                              const float* HWY_RESTRICT b, int64_t ldb, float* HWY_RESTRICT c, int64_t ldc,
                              int64_t k, float alpha, bool accumulate) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  ATTN_RC_ROWS(ATTN_RC_DECLARE)
  for (int64_t p = 0; p < k; ++p) {
    const float* ap = a + p * acs;
    const auto b0 = hn::LoadU(df, b + p * ldb);
    auto b1 = b0;
    if constexpr (NV > 1) b1 = hn::LoadU(df, b + p * ldb + N);
    ATTN_RC_ROWS(ATTN_RC_FMA)
  }
  const auto va = hn::Set(df, alpha);
  ATTN_RC_ROWS(ATTN_RC_STORE)
}
#undef ATTN_RC_ROWS
#undef ATTN_RC_DECLARE
#undef ATTN_RC_FMA
#undef ATTN_RC_STORE

// One block of mr <= kGemmRows rows at row i0 and NV vectors of columns at j0.
template <int NV>
void gemm_block(const Gemm& g, int64_t i0, int64_t mr, int64_t j0, int64_t k) {
  const float* a = g.a + i0 * g.ars;
  const float* b = g.b + j0;
  float* c = g.c + i0 * g.ldc + j0;
  switch (mr) {
#define ATTN_RC_CASE(r)                                                                  \
  case r:                                                                                \
    if constexpr (r <= kGemmRows)                                                        \
      gemm_kernel<r, NV>(a, g.ars, g.acs, b, g.ldb, c, g.ldc, k, g.alpha, g.accumulate); \
    break;
    ATTN_RC_CASE(1)
    ATTN_RC_CASE(2)
    ATTN_RC_CASE(3)
    ATTN_RC_CASE(4)
    ATTN_RC_CASE(5)
    ATTN_RC_CASE(6)
    ATTN_RC_CASE(7)
    ATTN_RC_CASE(8)
#undef ATTN_RC_CASE
    default:
      break;
  }
}

inline void gemm(const Gemm& g) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t i0 = 0; i0 < g.m; i0 += kGemmRows) {
    const int64_t mr = std::min<int64_t>(kGemmRows, g.m - i0);
    const int64_t k = g.lower_a ? std::min(g.k, i0 + mr) : g.k;
    const int64_t jend = g.lower_c ? std::min(g.n, i0 + mr) : g.n;  // columns wanted: j < jend
    int64_t j0 = 0;
    for (; j0 < jend && j0 + 2 * N <= g.n; j0 += 2 * N) gemm_block<2>(g, i0, mr, j0, k);
    for (; j0 < jend && j0 + N <= g.n; j0 += N) gemm_block<1>(g, i0, mr, j0, k);
    for (int64_t i = i0; i < i0 + mr; ++i)  // the last columns (fewer than a vector), element by element
      for (int64_t j = j0; j < jend; ++j) {
        float acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += g.a[i * g.ars + p * g.acs] * g.b[p * g.ldb + j];
        float& cij = g.c[i * g.ldc + j];
        cij = g.accumulate ? cij + g.alpha * acc : g.alpha * acc;
      }
  }
}

// Calls op(vector, offset) over [0, n) in vectors, the tail (fewer than a vector) through a buffer padded
// with `pad`; op returns the vector to store at dst + offset.
template <class Op>
HWY_INLINE void map_lanes(const float* src, float* dst, int64_t n, float pad, Op op) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + N <= n; j += N) hn::StoreU(op(hn::LoadU(d, src + j), j), d, dst + j);
  if (j < n) {
    HWY_ALIGN float buf[kPadLanes];
    std::fill(buf, buf + kPadLanes, pad);
    std::copy(src + j, src + n, buf);
    hn::Store(op(hn::Load(d, buf), j), d, buf);
    std::copy(buf, buf + (n - j), dst + j);
  }
}

// y = exp(x) for x <= 0 (fp32, see the file comment).
inline void exp_row(const float* x, float* y, int64_t n) {
  const DF d;
  map_lanes(x, y, n, 0.0f, [d](auto v, int64_t) { return Exp2(d, hn::Mul(v, hn::Set(d, kLog2e))); });
}

// y = x ⊙ exp(hi - lo) (hi - lo <= 0 elementwise; lo null: 0), the differences in fp64, rounded once. y may
// be x.
inline void mul_exp_diff(const double* hi, const double* lo, const float* x, float* y, int64_t n, float* xd) {
  for (int64_t c = 0; c < n; ++c) xd[c] = static_cast<float>(lo ? hi[c] - lo[c] : hi[c]);
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    const auto e = Exp2(d, hn::Mul(hn::LoadU(d, xd + j), hn::Set(d, kLog2e)));
    hn::StoreU(hn::Mul(e, hn::LoadU(d, x + j)), d, y + j);
  }
  for (; j < n; ++j) y[j] = x[j] * std::exp(xd[j]);
}

// sum_c x_c y_c, in vector lanes.
inline float dot(const float* x, const float* y, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  int64_t j = 0;
  for (; j + N <= n; j += N) acc = hn::MulAdd(hn::LoadU(d, x + j), hn::LoadU(d, y + j), acc);
  float s = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; j < n; ++j) s += x[j] * y[j];
  return s;
}

// out[s - s0] = sum_c q_c k_sc exp(gt_c - g_sc) for s in [s0, s1) (gt <= g_s elementwise; k and g rows of
// d = d_k), the differences in fp64, rounded once (into xd, (s1 - s0) x d). Four keys at a time: four
// independent chains of exponentials and sums.
inline void decayed_row(const float* q, const float* k, const double* gt, const double* g, int64_t s0,
                        int64_t s1, int64_t d, float* xd, float* out) {
  for (int64_t s = s0; s < s1; ++s)
    for (int64_t c = 0; c < d; ++c) xd[(s - s0) * d + c] = static_cast<float>(gt[c] - g[s * d + c]);
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto log2e = hn::Set(df, kLog2e);
  const int64_t dv = d - d % N;  // columns in whole vectors; the rest element by element
  auto term = [&](int64_t s, int64_t j, auto acc) {
    const auto e = Exp2(df, hn::Mul(hn::LoadU(df, xd + (s - s0) * d + j), log2e));
    return hn::MulAdd(hn::Mul(hn::LoadU(df, q + j), hn::LoadU(df, k + s * d + j)), e, acc);
  };
  auto tail = [&](int64_t s) {
    float r = 0;
    for (int64_t c = dv; c < d; ++c) r += q[c] * k[s * d + c] * std::exp(xd[(s - s0) * d + c]);
    return r;
  };
  int64_t s = s0;
  for (; s + 4 <= s1; s += 4) {
    auto a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < dv; j += N) {
      a0 = term(s, j, a0), a1 = term(s + 1, j, a1);
      a2 = term(s + 2, j, a2), a3 = term(s + 3, j, a3);
    }
    out[s - s0] = hn::GetLane(hn::SumOfLanes(df, a0)) + tail(s);
    out[s + 1 - s0] = hn::GetLane(hn::SumOfLanes(df, a1)) + tail(s + 1);
    out[s + 2 - s0] = hn::GetLane(hn::SumOfLanes(df, a2)) + tail(s + 2);
    out[s + 3 - s0] = hn::GetLane(hn::SumOfLanes(df, a3)) + tail(s + 3);
  }
  for (; s < s1; ++s) {
    auto a0 = hn::Zero(df);
    for (int64_t j = 0; j < dv; j += N) a0 = term(s, j, a0);
    out[s - s0] = hn::GetLane(hn::SumOfLanes(df, a0)) + tail(s);
  }
}

// Tokens t0 .. t0 + L - 1: cb.kp, cb.qp point to their keys (L2-normalised per token when asked) and queries,
// [K; Q] in cb.qk for the delta rule (else the inputs themselves), and Kᵀ into cb.kt (but for gla).
inline void load_rows(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t0, int64_t L,
                      ChunkBuffers& cb) {
  const int64_t d = hi.dk;
  cb.kp = hi.k + t0 * d, cb.qp = hi.q + t0 * d;
  if (kind.delta) {  // one product over [K; Q] each for [K; Q] Kᵀ and [K; Q] S_0
    for (int64_t i = 0; i < L; ++i) {
      const float* k = cb.kp + i * d;
      const float r = kind.normalize_keys ? std::sqrt(dot(k, k, d)) : 1.0f;
      const float inv = r > 0 ? 1.0f / r : 0.0f;
      for (int64_t c = 0; c < d; ++c) cb.qk[i * d + c] = k[c] * inv;
    }
    std::copy_n(cb.qp, L * d, cb.qk.data() + L * d);
    cb.kp = cb.qk.data(), cb.qp = cb.qk.data() + L * d;
  }
  if (kind.gate != Gate::vector)  // gla transposes its decayed keys instead (vector_scores)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t c = 0; c < d; ++c) cb.kt[c * L + i] = cb.kp[i * d + c];
}

// Gamma_t (fp64) for the chunk; width 1 (scalar, retention, none) or d_k (vector). Scalar gates: also
// e^Gamma_t, e^(Gamma_C - Gamma_t) and D (zero above the diagonal).
inline void load_gammas(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t0, int64_t L,
                        ChunkBuffers& cb) {
  const int64_t w = kind.gate == Gate::vector ? hi.dk : 1;
  double* gam = cb.gam.data();
  if (kind.gate == Gate::vector) {
    const float* g = hi.g + t0 * w;
    for (int64_t c = 0; c < w; ++c) gam[c] = g[c];
    for (int64_t i = 1; i < L; ++i)
      for (int64_t c = 0; c < w; ++c) gam[i * w + c] = gam[(i - 1) * w + c] + double(g[i * w + c]);
    return;
  }
  for (int64_t i = 0; i < L; ++i)
    gam[i] = (i ? gam[i - 1] : 0.0) + (kind.gate == Gate::scalar ? double(hi.g[t0 + i]) : hi.log_gamma);
  for (int64_t i = 0; i < L; ++i) {
    cb.ed[i] = static_cast<float>(std::exp(gam[i]));
    cb.el[i] = static_cast<float>(std::exp(gam[L - 1] - gam[i]));
  }
  for (int64_t t = 0; t < L; ++t) {
    float* row = cb.dm.data() + t * L;
    for (int64_t s = 0; s <= t; ++s) cb.xd[s] = static_cast<float>(gam[t] - gam[s]);
    exp_row(cb.xd.data(), row, t + 1);
    std::fill(row + t + 1, row + L, 0.0f);
  }
}

// The lower triangle of cb.bp = [K; Q] Kᵀ (K Kᵀ's only for the delta rule), then cb.a (L x L) = Q Kᵀ ⊙ D,
// zero above the diagonal (scalar gates). d: d_k (the scores' sums).
inline void scalar_scores(const RecurrenceKind& kind, int64_t L, int64_t d, ChunkBuffers& cb) {
  for (int64_t half = kind.delta ? 0 : 1; half < 2; ++half)
    gemm({.a = half ? cb.qp : cb.kp,
          .ars = d,
          .acs = 1,
          .b = cb.kt.data(),
          .ldb = L,
          .c = cb.bp.data() + half * L * L,
          .ldc = L,
          .m = L,
          .n = L,
          .k = d,
          .lower_c = true});
  const float* p = cb.bp.data() + L * L;
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t s = 0; s <= t; ++s) cb.a[t * L + s] = p[t * L + s] * cb.dm[t * L + s];
    std::fill(cb.a.data() + t * L + t + 1, cb.a.data() + (t + 1) * L, 0.0f);
  }
}

// cb.a (L x L) = sum_c q_tc k_sc exp(Gamma_tc - Gamma_sc) for s <= t, 0 above (vector gates), by blocks of
// kGlaBlock tokens (see the file comment). For t in block i and s in an earlier block j, with e_j the last
// token of block j and r = e_(i-1) the token before block i (s <= e_j <= r < t):
//   exp(Gamma_t - Gamma_s) = exp(Gamma_t - Gamma_r) exp(Gamma_r - Gamma_(e_j)) exp(Gamma_(e_j) - Gamma_s),
// every factor <= 1: q~_t = q_t ⊙ the first (once per query row), k~_s = k_s ⊙ the third (once per key row,
// kept transposed in cb.kd), the middle one (d values per pair of blocks, 1 when j = i - 1) scales k~'s
// columns of block j, and block row i is one product Q~_i [k~ of blocks 0 .. i-1]ᵀ. The diagonal blocks are
// elementwise. (A factor below fp32's normal range is 0: the true product is smaller still.) d: d_k.
inline void vector_scores(int64_t L, int64_t d, ChunkBuffers& cb) {
  const float* k = cb.kp;
  const float* q = cb.qp;
  const double* gam = cb.gam.data();
  float* xd = cb.xd.data();
  float* row = cb.u.data();  // a row of scratch, free until finish_chunk (gla has no delta-rule U)
  std::fill(cb.a.begin(), cb.a.begin() + L * L, 0.0f);
  for (int64_t s = 0; s < L; ++s) {
    const int64_t e = std::min(L, (s / kGlaBlock + 1) * kGlaBlock) - 1;  // the last token of s's block
    mul_exp_diff(gam + e * d, gam + s * d, k + s * d, row, d, xd);
    for (int64_t c = 0; c < d; ++c) cb.kd[c * L + s] = row[c];
  }
  for (int64_t i0 = 0; i0 < L; i0 += kGlaBlock) {
    const int64_t i1 = std::min(L, i0 + kGlaBlock);
    for (int64_t t = i0; t < i1; ++t)  // the diagonal block, elementwise
      decayed_row(q + t * d, k, gam + t * d, gam, i0, t + 1, d, xd, cb.a.data() + t * L + i0);
    if (i0 == 0) continue;
    const double* ref = gam + (i0 - 1) * d;  // Gamma_r, r = i0 - 1
    for (int64_t t = i0; t < i1; ++t)
      mul_exp_diff(gam + t * d, ref, q + t * d, cb.qg.data() + (t - i0) * d, d, xd);
    // B = [k~ of blocks 0 .. i-1]ᵀ (d x i0), block j's columns times exp(Gamma_r - Gamma_(e_j)).
    float* B = cb.x.data();  // free: gla computes no [K; Q] S_0
    for (int64_t j0 = 0; j0 < i0; j0 += kGlaBlock) {
      const int64_t ej = j0 + kGlaBlock - 1;
      if (ej == i0 - 1) {
        for (int64_t c = 0; c < d; ++c) std::copy_n(cb.kd.data() + c * L + j0, kGlaBlock, B + c * i0 + j0);
        continue;
      }
      std::fill(row, row + d, 1.0f);
      mul_exp_diff(ref, gam + ej * d, row, row, d, xd);
      for (int64_t c = 0; c < d; ++c)
        for (int64_t s = j0; s < j0 + kGlaBlock; ++s) B[c * i0 + s] = cb.kd[c * L + s] * row[c];
    }
    gemm({.a = cb.qg.data(),
          .ars = d,
          .acs = 1,
          .b = B,
          .ldb = i0,
          .c = cb.a.data() + i0 * L,
          .ldc = L,
          .m = i1 - i0,
          .n = i0,
          .k = d});
  }
}

// Columns j0 .. j0 + NV N - 1 of the forward substitution u_t = r_t - sum_{s < t} m_ts u_s (U holds R on
// entry), t in order: each row's sum in NV vector registers, two interleaved chains so the FMAs do not wait
// on each other's latency.
template <int NV>
HWY_INLINE void substitute_columns(const float* m, int64_t L, float* U, int64_t d, int64_t j0) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t t = 1; t < L; ++t) {
    const float* mt = m + t * L;
    float* ut = U + t * d + j0;
    auto a0 = hn::LoadU(df, ut), a1 = a0, a2 = a0, a3 = a0;
    auto b0 = hn::Zero(df), b1 = b0, b2 = b0, b3 = b0;
    if constexpr (NV > 1)
      a1 = hn::LoadU(df, ut + N), a2 = hn::LoadU(df, ut + 2 * N), a3 = hn::LoadU(df, ut + 3 * N);
    int64_t s = 0;
    for (; s + 2 <= t; s += 2) {
      const float* u0 = U + s * d + j0;
      const float* u1 = u0 + d;
      const auto c0 = hn::Set(df, mt[s]), c1 = hn::Set(df, mt[s + 1]);
      a0 = hn::NegMulAdd(c0, hn::LoadU(df, u0), a0);
      b0 = hn::NegMulAdd(c1, hn::LoadU(df, u1), b0);
      if constexpr (NV > 1) {
        a1 = hn::NegMulAdd(c0, hn::LoadU(df, u0 + N), a1);
        b1 = hn::NegMulAdd(c1, hn::LoadU(df, u1 + N), b1);
        a2 = hn::NegMulAdd(c0, hn::LoadU(df, u0 + 2 * N), a2);
        b2 = hn::NegMulAdd(c1, hn::LoadU(df, u1 + 2 * N), b2);
        a3 = hn::NegMulAdd(c0, hn::LoadU(df, u0 + 3 * N), a3);
        b3 = hn::NegMulAdd(c1, hn::LoadU(df, u1 + 3 * N), b3);
      }
    }
    if (s < t) {
      const float* u0 = U + s * d + j0;
      const auto c0 = hn::Set(df, mt[s]);
      a0 = hn::NegMulAdd(c0, hn::LoadU(df, u0), a0);
      if constexpr (NV > 1) {
        a1 = hn::NegMulAdd(c0, hn::LoadU(df, u0 + N), a1);
        a2 = hn::NegMulAdd(c0, hn::LoadU(df, u0 + 2 * N), a2);
        a3 = hn::NegMulAdd(c0, hn::LoadU(df, u0 + 3 * N), a3);
      }
    }
    hn::StoreU(hn::Add(a0, b0), df, ut);
    if constexpr (NV > 1) {
      hn::StoreU(hn::Add(a1, b1), df, ut + N);
      hn::StoreU(hn::Add(a2, b2), df, ut + 2 * N);
      hn::StoreU(hn::Add(a3, b3), df, ut + 3 * N);
    }
  }
}

// U = (I + M)^-1 R in place (M strictly lower triangular, L x L row-major; U L x d holding R on entry, d its
// columns: d_v for the delta rule's U).
inline void forward_substitute(const float* m, int64_t L, float* U, int64_t d) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t j0 = 0;
  for (; j0 + 4 * N <= d; j0 += 4 * N) substitute_columns<4>(m, L, U, d, j0);
  for (; j0 + N <= d; j0 += N) substitute_columns<1>(m, L, U, d, j0);
  for (int64_t t = 1; t < L && j0 < d; ++t)  // the last columns (fewer than a vector)
    for (int64_t s = 0; s < t; ++s)
      for (int64_t j = j0; j < d; ++j) U[t * d + j] -= m[t * L + s] * U[s * d + j];
}

// The delta rule's U into cb.u: (I + A) U = diag(beta) (V - diag(e^Gamma) K S_0), A_ts = beta_t D_ts k_t.k_s
// (s < t), by forward substitution. cb.x holds [K; Q] S_0 and cb.bp [K; Q] Kᵀ (its first L rows become A).
inline void delta_values(const HeadInputs& hi, int64_t t0, int64_t L, ChunkBuffers& cb) {
  const int64_t d = hi.dv;  // U, R, V and K S_0 are L x d_v
  const float* v = hi.v + t0 * d;
  const float* beta = hi.beta + t0;
  for (int64_t t = 0; t < L; ++t) {
    float* ut = cb.u.data() + t * d;
    const float* xt = cb.x.data() + t * d;
    const float b = beta[t], e = cb.ed[t];
    for (int64_t j = 0; j < d; ++j) ut[j] = b * (v[t * d + j] - e * xt[j]);
    float* at = cb.bp.data() + t * L;
    const float* dm = cb.dm.data() + t * L;
    for (int64_t s = 0; s < t; ++s) at[s] *= b * dm[s];
  }
  forward_substitute(cb.bp.data(), L, cb.u.data(), d);
}

// c (m x d_v, row-major) = alpha A S_0, A m x d_k row-major and S_0 the state in cb.s: the chunk's reads of
// the state it starts from.
inline void times_state(const float* a, int64_t m, int64_t dk, int64_t dv, float* c, const ChunkBuffers& cb,
                        float alpha = 1.0f) {
  gemm({.a = a,
        .ars = dk,
        .acs = 1,
        .b = cb.s.data(),
        .ldb = dv,
        .c = c,
        .ldc = dv,
        .m = m,
        .n = dv,
        .k = dk,
        .alpha = alpha});
}

// KDA (a gate per key channel with the delta rule): U into cb.u, (I + diag(beta) A) U = diag(beta) (V - (K ⊙
// e^Gamma) S_0) with A_ts = sum_c k_tc k_sc e^(Gamma_tc - Gamma_sc) (s < t; unrolling S_{t-1} within the
// chunk, as delta_values does with one decay per token). A is gla's decayed scores of the keys against
// themselves (vector_scores with the keys as queries), copied into cb.bp's first L rows; then cb.a gets the
// queries' scores (vector_scores again, before U: it uses cb.u and cb.x as scratch). cb.qg holds K ⊙ e^Gamma
// and cb.x (K ⊙ e^Gamma) S_0 on the way.
inline void vector_delta_values(const HeadInputs& hi, int64_t t0, int64_t L, ChunkBuffers& cb) {
  const int64_t dk = hi.dk, dv = hi.dv;
  const float* q = cb.qp;
  cb.qp = cb.kp;
  vector_scores(L, dk, cb);
  std::copy_n(cb.a.data(), L * L, cb.bp.data());
  cb.qp = q;
  vector_scores(L, dk, cb);
  for (int64_t t = 0; t < L; ++t)
    mul_exp_diff(cb.gam.data() + t * dk, nullptr, cb.kp + t * dk, cb.qg.data() + t * dk, dk, cb.xd.data());
  times_state(cb.qg.data(), L, dk, dv, cb.x.data(), cb);
  const float* v = hi.v + t0 * dv;
  const float* beta = hi.beta + t0;
  for (int64_t t = 0; t < L; ++t) {
    float* ut = cb.u.data() + t * dv;
    const float* xt = cb.x.data() + t * dv;
    const float b = beta[t];
    for (int64_t j = 0; j < dv; ++j) ut[j] = b * (v[t * dv + j] - xt[j]);
    float* at = cb.bp.data() + t * L;
    for (int64_t s = 0; s < t; ++s) at[s] *= b;
  }
  forward_substitute(cb.bp.data(), L, cb.u.data(), dv);
}

// cb.kd (L x d, d = d_k) = K ⊙ e^(Gamma_C - Gamma): each key row decayed to the chunk's end (per channel for
// gla).
inline void decayed_keys(const RecurrenceKind& kind, int64_t L, int64_t d, ChunkBuffers& cb) {
  const double* last = cb.gam.data() + (L - 1) * d;
  for (int64_t t = 0; t < L; ++t) {
    if (kind.gate == Gate::vector)
      mul_exp_diff(last, cb.gam.data() + t * d, cb.kp + t * d, cb.kd.data() + t * d, d, cb.xd.data());
    else
      for (int64_t c = 0; c < d; ++c) cb.kd[t * d + c] = cb.kp[t * d + c] * cb.el[t];
  }
}

// The state (d_k x d_v) from the chunk's start to its end: S = diag(e^Gamma_C) S + (K ⊙ e^(Gamma_C -
// Gamma))ᵀ U (U: the value rows the tokens add, L x d_v).
inline void carry_state(const RecurrenceKind& kind, int64_t L, int64_t dk, int64_t dv, const float* U,
                        ChunkBuffers& cb) {
  decayed_keys(kind, L, dk, cb);
  float* xd = cb.xd.data();
  if (kind.gate == Gate::vector) {
    const double* last = cb.gam.data() + (L - 1) * dk;
    for (int64_t c = 0; c < dk; ++c) xd[c] = static_cast<float>(last[c]);
    exp_row(xd, xd, dk);
    for (int64_t c = 0; c < dk; ++c)
      for (int64_t j = 0; j < dv; ++j) cb.s[c * dv + j] *= xd[c];
  } else {
    const float decay = cb.ed[L - 1];
    for (int64_t e = 0; e < dk * dv; ++e) cb.s[e] *= decay;
  }
  gemm({.a = cb.kd.data(),
        .ars = 1,
        .acs = dk,
        .b = U,
        .ldb = dv,
        .c = cb.s.data(),
        .ldc = dv,
        .m = dk,
        .n = dv,
        .k = L,
        .accumulate = true});
}

}  // namespace attn::chunk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // the toggle guard
