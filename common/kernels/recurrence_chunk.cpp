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
