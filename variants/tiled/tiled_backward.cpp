// tiled's backward pass on one SIMD target: FlashAttention-2's algorithm. A task owns one (batch, K/V head)
// and a chunk of its key blocks; for each key block it keeps dK and dV of those keys in registers-sized
// accumulators and visits every query block that may see them (every query head of the group): it recomputes
// the probabilities P = 2^(scale log2(e) Q K^T + bias - lse) from the forward's saved row max and sum (base
// 2), forms dP = dO V^T and dS = P (dP - delta) with delta = rowsum(dO * O), and accumulates
//   dV += P^T dO,   dK += dS^T Q,   dQ_chunk += dS K       (five GEMMs per block pair; the forward has two).
// dQ rows are written by every chunk of key blocks, so each chunk adds into its own copy and the copies are
// summed afterwards in chunk order: no atomics, and the same inputs give bitwise the same gradients at any
// thread count. Memory beyond the gradients: delta (one float per query row) and the chunk copies of dQ.
// Compiled once per Highway target (foreach_target.h); tiled.cpp chooses the tiles and runs the tasks.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "variants/tiled/tiled_backward.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // must come first: it re-includes this file once per target
// clang-format on
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "common/kernels/mask.hpp"
#include "common/kernels/simd-inl.hpp"
#include "variants/tiled/dot_scores-inl.hpp"
#include "variants/tiled/tiled.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::tiled::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using simd::HWY_NAMESPACE::DF;
using simd::HWY_NAMESPACE::Exp2;
using simd::HWY_NAMESPACE::TanhKeepNaN;
using simd::HWY_NAMESPACE::VF;

// Register blocking of the one GEMM micro-kernel all five products use (as the forward's, see
// tiled_kernels.cpp): MR rows x NV vectors of accumulators, enough independent FMA chains for two FMA pipes
// of latency 4, within the register file.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kMR = 8, kNV = 2;
#elif HWY_ARCH_X86
constexpr int kMR = 4, kNV = 3;
#else
constexpr int kMR = 8, kNV = 2;
#endif
static_assert(kMR <= 8 && kNV <= 3);

// C (MR x NV vectors) = alpha * A B, or C += A B (ACC), over `depth`: row r of A is read with stride sa_k
// from a + r * sa_m (so A can be a row-major matrix or the transpose of one, read in place), B row t is
// b + t * ldb (NV vectors). Every element sums over t = 0 .. depth-1 in order. Accumulators are named
// variables, not arrays (SVE vectors are sizeless).
#define ATTN_BW_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
template <int MR, int NV, bool ACC>
HWY_NOINLINE void GemmKernel(const float* HWY_RESTRICT a, int64_t sa_m, int64_t sa_k,
                             const float* HWY_RESTRICT b, int64_t ldb, int64_t depth, float* HWY_RESTRICT c,
                             int64_t ldc, float alpha) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
#define ATTN_BW_DECLARE(r)                                                         \
  VF acc##r##_0 = hn::Zero(d), acc##r##_1 = hn::Zero(d), acc##r##_2 = hn::Zero(d); \
  const float* a##r = a + (r < MR ? r : 0) * sa_m;                                 \
  (void)a##r;
  ATTN_BW_ROWS(ATTN_BW_DECLARE)
#undef ATTN_BW_DECLARE
  for (int64_t t = 0; t < depth; ++t) {
    const float* bt = b + t * ldb;
    const VF b0 = hn::LoadU(d, bt);
    VF b1 = b0, b2 = b0;
    if constexpr (NV > 1) b1 = hn::LoadU(d, bt + N);
    if constexpr (NV > 2) b2 = hn::LoadU(d, bt + 2 * N);
    const int64_t at = t * sa_k;
#define ATTN_BW_FMA(r)                                                \
  if constexpr (r < MR) {                                             \
    const VF x = hn::Set(d, a##r[at]);                                \
    acc##r##_0 = hn::MulAdd(x, b0, acc##r##_0);                       \
    if constexpr (NV > 1) acc##r##_1 = hn::MulAdd(x, b1, acc##r##_1); \
    if constexpr (NV > 2) acc##r##_2 = hn::MulAdd(x, b2, acc##r##_2); \
  }
    ATTN_BW_ROWS(ATTN_BW_FMA)
#undef ATTN_BW_FMA
  }
  const VF va = hn::Set(d, alpha);
  // ACC: C += this call's sum, added once at the end (not C loaded into the accumulators): dK and dV sum over
  // every query row of a K/V head's group (G * seq_q terms) one query tile per call, so each element is a
  // chain of tile_q products plus one add per tile instead of one chain of G * seq_q, and its rounding error
  // grows with tile_q + tiles rather than G * seq_q (measured: 3.3x naive's at n 2048, GQA 8 -> 2, before).
#define ATTN_BW_OUT(r, v, off) \
  hn::StoreU(ACC ? hn::Add(hn::LoadU(d, c + r * ldc + off), v) : hn::Mul(v, va), d, c + r * ldc + off)
#define ATTN_BW_STORE(r)                                     \
  if constexpr (r < MR) {                                    \
    ATTN_BW_OUT(r, acc##r##_0, 0);                           \
    if constexpr (NV > 1) ATTN_BW_OUT(r, acc##r##_1, N);     \
    if constexpr (NV > 2) ATTN_BW_OUT(r, acc##r##_2, 2 * N); \
  }
  ATTN_BW_ROWS(ATTN_BW_STORE)
#undef ATTN_BW_STORE
#undef ATTN_BW_OUT
}
#undef ATTN_BW_ROWS

using GemmFn = void (*)(const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t,
                        float);
template <int NV, bool ACC, int... R>
constexpr std::array<GemmFn, sizeof...(R)> GemmRow(std::integer_sequence<int, R...>) {
  return {&GemmKernel<R + 1, NV, ACC>...};
}
template <bool ACC, int... V>
constexpr auto GemmTable(std::integer_sequence<int, V...>) {
  return std::array{GemmRow<V + 1, ACC>(std::make_integer_sequence<int, kMR>())...};
}

// C (M x N) = alpha A B or C += A B, N a multiple of the vector width (the buffers pad to kLanes), A read
// through (sa_m, sa_k) as above. Column panels of B outermost, so a panel (depth x NV vectors) stays in L1
// while every row block of A passes over it.
void Gemm(bool acc, int64_t M, int64_t Ncols, int64_t depth, const float* a, int64_t sa_m, int64_t sa_k,
          const float* b, int64_t ldb, float* c, int64_t ldc, float alpha) {
  static constexpr auto seq = std::make_integer_sequence<int, kNV>();
  static constexpr std::array kernels{GemmTable<false>(seq), GemmTable<true>(seq)};
  const auto& table = kernels[acc ? 1 : 0];
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  for (int64_t c0 = 0; c0 < Ncols; c0 += kNV * N) {
    const int64_t nv = std::min<int64_t>(kNV, (Ncols - c0) / N);
    for (int64_t r0 = 0; r0 < M; r0 += kMR) {
      const int64_t mr = std::min<int64_t>(kMR, M - r0);
      table[nv - 1][mr - 1](a + r0 * sa_m, sa_m, sa_k, b + c0, ldb, depth, c + r0 * ldc + c0, ldc, alpha);
    }
  }
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// rows x cols of src (row stride lds) into dst transposed ([cols][ldd]), columns beyond `rows` zero.
void Transpose(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst, int64_t ldd) {
  for (int64_t e = 0; e < cols; ++e) {
    float* out = dst + e * ldd;
    for (int64_t r = 0; r < rows; ++r) out[r] = src[r * lds + e];
    std::fill(out + rows, out + ldd, 0.0f);
  }
}

// rows x cols of src (stride lds) into dst with row stride ldd, columns beyond `cols` zero.
void PadRows(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(src + r * lds, src + r * lds + cols, dst + r * ldd);
    std::fill(dst + r * ldd + cols, dst + (r + 1) * ldd, 0.0f);
  }
}

// One row of a block pair: the scores s (already scale log2(e) q.k) become P = 2^(s + bias - m - log2 l) (0
// for a masked key) and dp (dO . v) becomes dS = P (dp' - delta), dp' = dp with dropout's keep and 1 / (1 -
// p); with dropout, s ends as P after dropout (what multiplies dO into dV). Keys [0, seen) of the block
// starting at j0 pass the causal rule; lanes from `seen` up to nkp are zeroed.
void BlockRow(const BackwardContext& c, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t nkp,
              int64_t seen, const float* padv, float* s, float* dp, float* capf) {
  const Problem& p = c.p;
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t row = (b * p.heads + h) * p.seq_q + i, rows = p.batch * p.heads * p.seq_q;
  const float delta = c.delta[row];
  const VF vmax = hn::Set(d, c.g.saved[row]), vlog = hn::Set(d, c.g.saved[rows + row]);
  const VF vdelta = hn::Set(d, delta), zero = hn::Zero(d);
  const bool alibi = c.bias_kind != 0, dropout = p.dropout > 0;
  const VF slope = hn::Set(d, alibi ? c.alibi_l2e[static_cast<std::size_t>(h)] : 0.0f);
  const VF pos = hn::Set(d, static_cast<float>(i + c.alibi_shift));
  const bool capped = c.cap2 > 0;
  const VF cap = hn::Set(d, c.cap2), inv_cap = hn::Set(d, capped ? 1.0f / c.cap2 : 0.0f),
           one = hn::Set(d, 1.0f);
  for (int64_t j = 0; j < seen; j += N) {  // may run past `seen` by less than a vector (cleared below)
    VF x = hn::LoadU(d, s + j);
    VF factor = one;  // d(capped logit) / d(logit)
    if (capped) {     // the forward's SoftcapValues, then the bias: the same logits bitwise
      const VF t = TanhKeepNaN(d, hn::Mul(x, inv_cap));
      x = hn::Mul(cap, t);
      factor = hn::NegMulAdd(t, t, one);
      if (dropout) hn::StoreU(factor, d, capf + j);
    }
    if (alibi) {
      VF dist = hn::Sub(pos, hn::Iota(d, static_cast<float>(j0 + j)));
      if (c.bias_kind == 2) dist = hn::Abs(dist);
      x = hn::MulAdd(slope, dist, x);
    }
    if (padv) x = hn::Add(x, hn::LoadU(d, padv + j));
    // P = 2^((s - m) - log2 l): s - m is exact for the large weights (Sterbenz), so only small terms round.
    // P <= 1: the exponent is <= 0 but for rounding. A row with no allowed key has m = +inf and gets 0.
    const VF prob = Exp2(d, hn::Min(hn::Sub(hn::Sub(x, vmax), vlog), zero));
    hn::StoreU(prob, d, s + j);
    if (!dropout)
      hn::StoreU(hn::Mul(hn::Mul(prob, hn::Sub(hn::LoadU(d, dp + j), vdelta)), factor), d, dp + j);
  }
  std::fill(s + seen, s + nkp, 0.0f);
  std::fill(dp + seen, dp + nkp, 0.0f);
  if (p.mask.boolean) {
    const uint8_t* allowed = c.in.mask + i * p.seq_kv + j0;
    for (int64_t t = 0; t < seen; ++t)
      if (!allowed[t]) s[t] = dp[t] = 0.0f;
  }
  if (dropout) {  // the same keep decisions as the forward, from the seed
    const DropoutRow drop(p.dropout, p.seed, b, h, i);
    const float kd = drop.scale();
    for (int64_t t = 0; t < seen; ++t) {
      const bool kept = drop.keep(j0 + t);
      const float prob = s[t];
      dp[t] = prob * ((kept ? dp[t] * kd : 0.0f) - delta) * (capped ? capf[t] : 1.0f);
      s[t] = kept ? prob * kd : 0.0f;
    }
  }
}

// The task's work: every key block of its chunk against every query block (and query head of the group)
// that may see it. See the file comment.
void BackwardTask(const BackwardContext& c, int64_t task, BackwardScratch& w) {
  const Problem& p = c.p;
  const BackwardSchedule& sc = c.sched;
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv, G = p.group_size(), Hkv = p.num_kv_heads();
  const int64_t V = p.value_dim();  // V, dO and dV rows; Q, K, dQ and dK rows are D wide
  const int64_t Bq = sc.tile_q, Bk = sc.tile_kv, dp = sc.dp, dpv = sc.dpv, BH = p.batch * p.heads;
  const int64_t bkv = task / sc.chunks, chunk = task % sc.chunks, b = bkv / Hkv, kvh = bkv % Hkv;
  const bool padded = D != dp;     // head_dim not a multiple of kLanes: B operands go through padded copies
  const bool padded_v = V != dpv;  // the same for value_dim (dO)
  w.ensure(sc, D, V);
  const int64_t off = p.mask.any_causal() ? causal_offset(p) : 0;
  float *s = w.s.data(), *dpb = w.dp.data(), *kt = w.kt.data(), *vt = w.vt.data();
  for (int64_t jb = chunk; jb < sc.kv_blocks; jb += sc.chunks) {
    const int64_t j0 = jb * Bk, nk = std::min(Bk, Lkv - j0), nkp = round_up(nk, kLanes);
    const float* kj = c.in.k + (bkv * Lkv + j0) * D;
    const float* vj = c.in.v + (bkv * Lkv + j0) * V;
    Transpose(kj, nk, D, D, kt, nkp);
    Transpose(vj, nk, V, V, vt, nkp);
    const float* kb = kj;
    if (padded) {
      PadRows(kj, nk, D, D, w.kpad.data(), dp);
      kb = w.kpad.data();
    }
    std::fill(w.dk.begin(), w.dk.begin() + nk * dp, 0.0f);
    std::fill(w.dv.begin(), w.dv.begin() + nk * dpv, 0.0f);
    const float* padv = nullptr;
    if (p.mask.key_padding) {
      const uint8_t* pad = c.in.key_padding + b * Lkv + j0;
      for (int64_t t = 0; t < nkp; ++t) w.padv[t] = t < nk && pad[t] ? kNegInf : 0.0f;
      padv = w.padv.data();
    }
    // Causal: query i sees key j0 iff j0 <= i + off; earlier query blocks see none of this key block.
    const int64_t i_first = p.mask.any_causal() ? std::clamp<int64_t>(j0 - off, 0, Lq) : 0;
    for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
      const int64_t bh = b * p.heads + h;
      for (int64_t i0 = i_first / Bq * Bq; i0 < Lq; i0 += Bq) {
        const int64_t nq = std::min(Bq, Lq - i0);
        const float* qi = c.in.q + (bh * Lq + i0) * D;
        const float* gi = c.g.d_out + (bh * Lq + i0) * V;
        // S = (scale log2(e) Q) K^T, Q scaled first and every sum in order 0..D-1 by FMAs, as the forward's
        // GEMM path scores: the recomputed logits are then bitwise the forward's (and P consistent with the
        // saved log-sum-exp) wherever the forward took that path.
        float* qs = w.qs.data();
        for (int64_t x = 0; x < nq * D; ++x) qs[x] = qi[x] * c.q_scale;
        Gemm(false, nq, nkp, D, qs, D, 1, kt, nkp, s, nkp, 1.0f);
        Gemm(false, nq, nkp, V, gi, V, 1, vt, nkp, dpb, nkp, 1.0f);  // dP = dO V^T
        // Rows the forward scored with its dot-product kernels (decode-sized tiles) get those kernels' sums
        // instead, so the logits match the saved row max bitwise there too.
        for (int64_t r = 0; r < nq; ++r) {
          if (!c.forward_dot_row(i0 + r)) continue;
          float* sr = s + r * nkp;
          int64_t j = 0;
          for (; j + 8 <= nk; j += 8) DotScores<1, 8>(kj + j * D, D, qs + r * D, sr + j, 1);
          for (; j < nk; ++j) DotScores<1, 1>(kj + j * D, D, qs + r * D, sr + j, 1);
        }
        for (int64_t r = 0; r < nq; ++r) {
          const int64_t i = i0 + r;
          const int64_t seen = p.mask.any_causal() ? std::clamp<int64_t>(i + off + 1 - j0, 0, nk) : nk;
          BlockRow(c, b, h, i, j0, nkp, seen, padv, s + r * nkp, dpb + r * nkp, w.capf.data());
        }
        const float *qb = qi, *gb = gi;
        if (padded) {
          PadRows(qi, nq, D, D, w.qpad.data(), dp);
          qb = w.qpad.data();
        }
        if (padded_v) {
          PadRows(gi, nq, V, V, w.gpad.data(), dpv);
          gb = w.gpad.data();
        }
        Gemm(true, nk, dpv, nq, s, 1, nkp, gb, dpv, w.dv.data(), dpv, 1.0f);  // dV += P^T dO
        Gemm(true, nk, dp, nq, dpb, 1, nkp, qb, dp, w.dk.data(), dp, 1.0f);   // dK += dS^T Q
        float* dq = c.dq_part + ((chunk * BH + bh) * Lq + i0) * dp;
        Gemm(true, nq, dp, nk, dpb, nkp, 1, kb, dp, dq, dp, 1.0f);  // dQ (this chunk's copy) += dS K
      }
    }
    for (int64_t t = 0; t < nk; ++t) {
      float* dk = c.g.dk + (bkv * Lkv + j0 + t) * D;
      float* dv = c.g.dv + (bkv * Lkv + j0 + t) * V;
      for (int64_t e = 0; e < D; ++e) dk[e] = c.scale * w.dk[t * dp + e];
      for (int64_t e = 0; e < V; ++e) dv[e] = w.dv[t * dpv + e];
    }
  }
}

}  // namespace attn::tiled::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::tiled {
HWY_EXPORT(BackwardTask);

void run_backward_task(const BackwardContext& c, int64_t task, BackwardScratch& w) {
  HWY_DYNAMIC_DISPATCH(BackwardTask)(c, task, w);
}
}  // namespace attn::tiled
#endif  // HWY_ONCE
