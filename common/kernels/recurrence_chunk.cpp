// The chunkwise-parallel form's forward (common/kernels/recurrence.hpp); the form, its overflow argument and
// the shared per-target pieces are in recurrence_chunk-inl.hpp. Compiled once per Highway target
// (foreach_target.h): the elementwise loops vectorise for the CPU's SIMD target, and so do the products (gemm
// below; TBB runs one task per (batch, head)).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/kernels/recurrence_chunk.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // must come first: it re-includes this file once per target
// clang-format on
#include <hwy/highway.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/kernels/recurrence.hpp"
#include "common/kernels/recurrence_chunk-inl.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::chunk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using simd::HWY_NAMESPACE::DF;
using simd::HWY_NAMESPACE::Exp2;
using simd::HWY_NAMESPACE::kPadLanes;

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

// U = (I + M)^-1 R in place (M strictly lower triangular, L x L row-major; U L x d holding R on entry).
void forward_substitute(const float* m, int64_t L, float* U, int64_t d) {
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
void delta_values(const HeadInputs& hi, int64_t t0, int64_t L, ChunkBuffers& cb) {
  const int64_t d = hi.d;
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

// O rows = scale (inter + intra), then the state moves to the chunk's end.
void finish_chunk(const HeadInputs& hi, const RecurrenceKind& kind, int64_t L, const float* U, float* out,
                  ChunkBuffers& cb) {
  const int64_t d = hi.d;
  const float* q = cb.qp;
  const float scale = static_cast<float>(hi.scale);
  if (kind.gate == Gate::vector) {  // (Q ⊙ e^Gamma) S_0
    for (int64_t t = 0; t < L; ++t)
      mul_exp_diff(cb.gam.data() + t * d, nullptr, q + t * d, cb.qg.data() + t * d, d, cb.xd.data());
    gemm({.a = cb.qg.data(),
          .ars = d,
          .acs = 1,
          .b = cb.s.data(),
          .ldb = d,
          .c = out,
          .ldc = d,
          .m = L,
          .n = d,
          .k = d,
          .alpha = scale});
  } else {
    if (!kind.delta)  // the delta rule computed [K; Q] S_0 before its solve
      gemm({.a = q,
            .ars = d,
            .acs = 1,
            .b = cb.s.data(),
            .ldb = d,
            .c = cb.x.data() + L * d,
            .ldc = d,
            .m = L,
            .n = d,
            .k = d});
    const float* qs = cb.x.data() + L * d;
    for (int64_t t = 0; t < L; ++t) {
      const float f = scale * cb.ed[t];
      for (int64_t j = 0; j < d; ++j) out[t * d + j] = f * qs[t * d + j];
    }
  }
  gemm({.a = cb.a.data(),
        .ars = L,
        .acs = 1,
        .b = U,
        .ldb = d,
        .c = out,
        .ldc = d,
        .m = L,
        .n = d,
        .k = L,
        .alpha = scale,
        .accumulate = true,
        .lower_a = true});
  carry_state(kind, L, d, U, cb);
}

void ChunkHead(const HeadInputs& hi, const RecurrenceKind& kind, int64_t C, float* out, float* final_state) {
  const int64_t n = hi.n, d = hi.d;
  ChunkBuffers cb(std::min(C, n), d);
  if (hi.s0) std::copy_n(hi.s0, d * d, cb.s.begin());
  for (int64_t t0 = 0; t0 < n; t0 += C) {
    const int64_t L = std::min(C, n - t0);
    load_rows(hi, kind, t0, L, cb);
    load_gammas(hi, kind, t0, L, cb);
    if (kind.gate == Gate::vector)
      vector_scores(L, d, cb);
    else
      scalar_scores(kind, L, d, cb);
    if (kind.delta) {  // [K; Q] S_0, then the solve
      gemm({.a = cb.qk.data(),
            .ars = d,
            .acs = 1,
            .b = cb.s.data(),
            .ldb = d,
            .c = cb.x.data(),
            .ldc = d,
            .m = 2 * L,
            .n = d,
            .k = d});
      delta_values(hi, t0, L, cb);
    }
    finish_chunk(hi, kind, L, kind.delta ? cb.u.data() : hi.v + t0 * d, out + t0 * d, cb);
  }
  if (final_state) std::copy_n(cb.s.data(), d * d, final_state);
}

}  // namespace attn::chunk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace chunk {
HWY_EXPORT(ChunkHead);
void chunk_head(const HeadInputs& hi, const RecurrenceKind& kind, int64_t C, float* out, float* final_state) {
  HWY_DYNAMIC_DISPATCH(ChunkHead)(hi, kind, C, out, final_state);
}
}  // namespace chunk

void recurrence_chunk_forward(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg) {
  const int64_t n = p.seq_q, d = p.head_dim;
  tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) {
    const HeadInputs hi = head_inputs(p, in, cfg.kind, bh / p.heads, bh % p.heads);
    chunk::chunk_head(hi, cfg.kind, cfg.chunk, in.out + bh * n * d,
                      in.final_state ? in.final_state + bh * d * d : nullptr);
  });
}
}  // namespace attn
#endif  // HWY_ONCE
