// tiled's dot-product score kernel, per SIMD target: shared by the forward's decode tiles
// (tiled_kernels.cpp) and the backward (tiled_backward.cpp), which recomputes exactly the logits the forward
// summed for the rows it scored this way. Included once per target inside attn::tiled::HWY_NAMESPACE (after
// common/kernels/simd-inl.hpp); hence the toggle guard (Highway's convention for -inl headers).
#if defined(ATTN_TILED_DOT_SCORES_INL_HPP_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_TILED_DOT_SCORES_INL_HPP_
#undef ATTN_TILED_DOT_SCORES_INL_HPP_
#else
#define ATTN_TILED_DOT_SCORES_INL_HPP_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "common/kernels/simd-inl.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::tiled::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#define ATTN_DOT_ACC8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define ATTN_DOT_SCORE_DECLARE(i) simd::HWY_NAMESPACE::VF a##i = hn::Zero(d);

// Scores of KB keys x NR rows (KB * NR <= 8 accumulators, enough independent FMA chains to hide latency):
// s[r * lds + kk] = qs[r] . k[kk] over head_dim D, vector part in lanes then a scalar tail, summed in a
// fixed order (so results depend on the SIMD target only).
template <int NR, int KB>
HWY_NOINLINE void DotScores(const float* HWY_RESTRICT k, int64_t D, const float* HWY_RESTRICT qs,
                            float* HWY_RESTRICT s, int64_t lds) {
  static_assert(NR * KB <= 8);
  const simd::HWY_NAMESPACE::DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), Dv = D / N * N;
  ATTN_DOT_ACC8(ATTN_DOT_SCORE_DECLARE)
  for (int64_t e = 0; e < Dv; e += N) {
#define ATTN_DOT_FMA(i)      \
  if constexpr (i < NR * KB) \
    a##i = hn::MulAdd(hn::LoadU(d, k + (i / NR) * D + e), hn::LoadU(d, qs + (i % NR) * D + e), a##i);
    ATTN_DOT_ACC8(ATTN_DOT_FMA)
#undef ATTN_DOT_FMA
  }
#define ATTN_DOT_STORE(i)                                                                \
  if constexpr (i < NR * KB) {                                                           \
    float tail = 0.0f;                                                                   \
    for (int64_t e = Dv; e < D; ++e) tail += k[(i / NR) * D + e] * qs[(i % NR) * D + e]; \
    s[(i % NR) * lds + i / NR] = hn::GetLane(hn::SumOfLanes(d, a##i)) + tail;            \
  }
  ATTN_DOT_ACC8(ATTN_DOT_STORE)
#undef ATTN_DOT_STORE
}

#undef ATTN_DOT_SCORE_DECLARE
#undef ATTN_DOT_ACC8

}  // namespace attn::tiled::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_TILED_DOT_SCORES_INL_HPP_
