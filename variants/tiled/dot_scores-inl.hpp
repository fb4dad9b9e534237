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

#include "common/interface/half.hpp"
#include "common/kernels/simd-inl.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::tiled::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#define ATTN_DOT_ACC8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define ATTN_DOT_SCORE_DECLARE(i) simd::HWY_NAMESPACE::VF a##i = hn::Zero(d);

// How the dot-product kernels read K and V rows: fp32 in place, or 16-bit storage widened in registers
// (exact: the same fp32 values a widening pass into scratch would give, so the sums are bitwise those).
struct RowsF32 {
  using T = float;
  static HWY_INLINE simd::HWY_NAMESPACE::VF Load(simd::HWY_NAMESPACE::DF d, const float* HWY_RESTRICT p) {
    return hn::LoadU(d, p);
  }
  static HWY_INLINE float Scalar(const float* p) { return *p; }
};
struct RowsBf16 {
  using T = uint16_t;
  static HWY_INLINE simd::HWY_NAMESPACE::VF Load(simd::HWY_NAMESPACE::DF d, const uint16_t* HWY_RESTRICT p) {
    const hn::Rebind<uint16_t, simd::HWY_NAMESPACE::DF> d16;
    const hn::RebindToUnsigned<simd::HWY_NAMESPACE::DF> du;
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
  }
  static HWY_INLINE float Scalar(const uint16_t* p) { return bits_float(static_cast<uint32_t>(*p) << 16); }
};
struct RowsF16 {
  using T = uint16_t;
  static HWY_INLINE simd::HWY_NAMESPACE::VF Load(simd::HWY_NAMESPACE::DF d, const uint16_t* HWY_RESTRICT p) {
    const hn::Rebind<hwy::float16_t, simd::HWY_NAMESPACE::DF> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(p)));
  }
  static HWY_INLINE float Scalar(const uint16_t* p) { return fp16_to_float(*p); }
};

// Scores of KB keys x NR rows (KB * NR <= 8 accumulators, enough independent FMA chains to hide latency):
// s[r * lds + kk] = qs[r] . k[kk] over head_dim D, vector part in lanes then a scalar tail, summed in a
// fixed order (so results depend on the SIMD target only). Rows: how K is stored (RowsF32 / RowsBf16 /
// RowsF16).
template <int NR, int KB, class Rows = RowsF32>
HWY_NOINLINE void DotScores(const typename Rows::T* HWY_RESTRICT k, int64_t D, const float* HWY_RESTRICT qs,
                            float* HWY_RESTRICT s, int64_t lds) {
  static_assert(NR * KB <= 8);
  const simd::HWY_NAMESPACE::DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), Dv = D / N * N;
  ATTN_DOT_ACC8(ATTN_DOT_SCORE_DECLARE)
  for (int64_t e = 0; e < Dv; e += N) {
#define ATTN_DOT_FMA(i)      \
  if constexpr (i < NR * KB) \
    a##i = hn::MulAdd(Rows::Load(d, k + (i / NR) * D + e), hn::LoadU(d, qs + (i % NR) * D + e), a##i);
    ATTN_DOT_ACC8(ATTN_DOT_FMA)
#undef ATTN_DOT_FMA
  }
#define ATTN_DOT_STORE(i)                                                                               \
  if constexpr (i < NR * KB) {                                                                          \
    float tail = 0.0f;                                                                                  \
    for (int64_t e = Dv; e < D; ++e) tail += Rows::Scalar(k + (i / NR) * D + e) * qs[(i % NR) * D + e]; \
    s[(i % NR) * lds + i / NR] = hn::GetLane(hn::SumOfLanes(d, a##i)) + tail;                           \
  }
  ATTN_DOT_ACC8(ATTN_DOT_STORE)
#undef ATTN_DOT_STORE
}

#undef ATTN_DOT_SCORE_DECLARE
#undef ATTN_DOT_ACC8

}  // namespace attn::tiled::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_TILED_DOT_SCORES_INL_HPP_
