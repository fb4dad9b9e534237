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
namespace attn::chunk::HWY_NAMESPACE {  // hn, DF, Exp2, kPadLanes: recurrence_chunk-inl.hpp

// O rows (L x d_v) = scale (inter + intra), then the state moves to the chunk's end. U: L x d_v.
void finish_chunk(const HeadInputs& hi, const RecurrenceKind& kind, int64_t L, const float* U, float* out,
                  ChunkBuffers& cb) {
  const int64_t dk = hi.dk, dv = hi.dv;
  const float* q = cb.qp;
  const float scale = static_cast<float>(hi.scale);
  if (kind.gate == Gate::vector) {  // (Q ⊙ e^Gamma) S_0
    for (int64_t t = 0; t < L; ++t)
      mul_exp_diff(cb.gam.data() + t * dk, nullptr, q + t * dk, cb.qg.data() + t * dk, dk, cb.xd.data());
    times_state(cb.qg.data(), L, dk, dv, out, cb, scale);
  } else {
    if (!kind.delta)  // the delta rule computed [K; Q] S_0 before its solve
      times_state(q, L, dk, dv, cb.x.data() + L * dv, cb);
    const float* qs = cb.x.data() + L * dv;
    for (int64_t t = 0; t < L; ++t) {
      const float f = scale * cb.ed[t];
      for (int64_t j = 0; j < dv; ++j) out[t * dv + j] = f * qs[t * dv + j];
    }
  }
  gemm({.a = cb.a.data(),
        .ars = L,
        .acs = 1,
        .b = U,
        .ldb = dv,
        .c = out,
        .ldc = dv,
        .m = L,
        .n = dv,
        .k = L,
        .alpha = scale,
        .accumulate = true,
        .lower_a = true});
  carry_state(kind, L, dk, dv, U, cb);
}

void ChunkHead(const HeadInputs& hi, const RecurrenceKind& kind, int64_t C, float* out, float* final_state) {
  const int64_t n = hi.n, dk = hi.dk, dv = hi.dv;
  ChunkBuffers cb(std::min(C, n), dk, dv);
  if (hi.s0) std::copy_n(hi.s0, dk * dv, cb.s.begin());
  for (int64_t t0 = 0; t0 < n; t0 += C) {
    const int64_t L = std::min(C, n - t0);
    load_rows(hi, kind, t0, L, cb);
    load_gammas(hi, kind, t0, L, cb);
    if (kind.gate == Gate::vector && kind.delta)  // KDA: both score matrices and U
      vector_delta_values(hi, t0, L, cb);
    else if (kind.gate == Gate::vector)
      vector_scores(L, dk, cb);
    else
      scalar_scores(kind, L, dk, cb);
    if (kind.delta && kind.gate != Gate::vector) {  // [K; Q] S_0 (2L x d_v), then the solve
      times_state(cb.qk.data(), 2 * L, dk, dv, cb.x.data(), cb);
      delta_values(hi, t0, L, cb);
    }
    finish_chunk(hi, kind, L, kind.delta ? cb.u.data() : hi.v + t0 * dv, out + t0 * dv, cb);
  }
  if (final_state) std::copy_n(cb.s.data(), dk * dv, final_state);
}

// The recurrent form's fp32 forward of one head (recurrence_recurrent_head): the definition token by token
// with the value columns in SIMD lanes. Per token the delta rule's p = (k ⊙ a) S is one pass over S, then S =
// diag(a) S + kᵀ u and o = scale q S share a second one. Every sum over the key channels runs c = 0 .. d_k -
// 1 in order, as the scalar definition's, each value column in its own lane; the decays are exp_row's (a
// vector exp; scalar gates and retention one std::exp per token).
void RecurrentHead(const HeadInputs& hi, const RecurrenceKind& kind, float* S, float* out) {
  const int64_t n = hi.n, dk = hi.dk, dv = hi.dv;
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  std::vector<float> a(dk), kb(dk), ka(dk), qs(dk), u(dv), p(dv);
  const float scale = static_cast<float>(hi.scale);
  for (int64_t t = 0; t < n; ++t) {
    const float* k = hi.k + t * dk;
    float inv = 1.0f;
    if (kind.normalize_keys) {  // k / ||k|| (a zero key stays zero), as load_key
      float s2 = 0;
      for (int64_t c = 0; c < dk; ++c) s2 += k[c] * k[c];
      const float r = std::sqrt(s2);
      inv = r > 0 ? 1.0f / r : 0.0f;
    }
    for (int64_t c = 0; c < dk; ++c) kb[c] = k[c] * inv;
    if (kind.gate == Gate::vector) {
      exp_row(hi.g + t * dk, a.data(), dk);
    } else {
      const float x = kind.gate == Gate::scalar ? std::exp(hi.g[t])
                      : kind.retention          ? static_cast<float>(std::exp(hi.log_gamma))
                                                : 1.0f;
      std::fill(a.begin(), a.end(), x);
    }
    const float* v = hi.v + t * dv;
    if (kind.delta) {
      for (int64_t c = 0; c < dk; ++c) ka[c] = kb[c] * a[c];
      const float beta = hi.beta[t];
      int64_t j = 0;
      for (; j + 2 * N <= dv; j += 2 * N) {
        auto p0 = hn::Zero(d), p1 = hn::Zero(d);
        for (int64_t c = 0; c < dk; ++c) {
          const auto kc = hn::Set(d, ka[c]);
          p0 = hn::MulAdd(kc, hn::LoadU(d, S + c * dv + j), p0);
          p1 = hn::MulAdd(kc, hn::LoadU(d, S + c * dv + j + N), p1);
        }
        hn::StoreU(p0, d, p.data() + j);
        hn::StoreU(p1, d, p.data() + j + N);
      }
      for (; j < dv; ++j) {
        float acc = 0;
        for (int64_t c = 0; c < dk; ++c) acc = std::fma(ka[c], S[c * dv + j], acc);
        p[j] = acc;
      }
      for (int64_t jj = 0; jj < dv; ++jj) u[jj] = beta * (v[jj] - p[jj]);
    } else {
      std::copy_n(v, dv, u.data());
    }
    const float* q = hi.q + t * dk;
    for (int64_t c = 0; c < dk; ++c) qs[c] = q[c] * scale;
    float* o = out + t * dv;
    int64_t j = 0;
    for (; j + N <= dv; j += N) {
      const auto uj = hn::LoadU(d, u.data() + j);
      auto acc = hn::Zero(d);
      for (int64_t c = 0; c < dk; ++c) {
        float* row = S + c * dv + j;
        const auto s = hn::MulAdd(hn::Set(d, kb[c]), uj, hn::Mul(hn::Set(d, a[c]), hn::LoadU(d, row)));
        hn::StoreU(s, d, row);
        acc = hn::MulAdd(hn::Set(d, qs[c]), s, acc);
      }
      hn::StoreU(acc, d, o + j);
    }
    for (; j < dv; ++j) {
      float acc = 0;
      for (int64_t c = 0; c < dk; ++c) {
        float& s = S[c * dv + j];
        s = std::fma(kb[c], u[j], a[c] * s);
        acc = std::fma(qs[c], s, acc);
      }
      o[j] = acc;
    }
  }
}

}  // namespace attn::chunk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace chunk {
HWY_EXPORT(ChunkHead);
HWY_EXPORT(RecurrentHead);
void chunk_head(const HeadInputs& hi, const RecurrenceKind& kind, int64_t C, float* out, float* final_state) {
  HWY_DYNAMIC_DISPATCH(ChunkHead)(hi, kind, C, out, final_state);
}
}  // namespace chunk

void recurrence_recurrent_head(const HeadInputs& hi, const RecurrenceKind& kind, float* S, float* out) {
  HWY_DYNAMIC_DISPATCH(chunk::RecurrentHead)(hi, kind, S, out);
}

void recurrence_chunk_forward(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg) {
  const int64_t n = p.seq_q, dv = p.value_dim(), dd = p.head_dim * dv;
  tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) {
    const HeadInputs hi = head_inputs(p, in, cfg.kind, bh / p.heads, bh % p.heads);
    chunk::chunk_head(hi, cfg.kind, cfg.chunk, in.out + bh * n * dv,
                      in.final_state ? in.final_state + bh * dd : nullptr);
  });
}
}  // namespace attn
#endif  // HWY_ONCE
