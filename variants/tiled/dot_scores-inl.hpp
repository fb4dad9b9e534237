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
  static constexpr bool kEvenOdd = false;
  static HWY_INLINE simd::HWY_NAMESPACE::VF Load(simd::HWY_NAMESPACE::DF d, const float* HWY_RESTRICT p) {
    return hn::LoadU(d, p);
  }
  static HWY_INLINE float Scalar(const float* p) { return *p; }
};
struct RowsBf16 {
  using T = uint16_t;
  static constexpr bool kEvenOdd = false;
  static HWY_INLINE simd::HWY_NAMESPACE::VF Load(simd::HWY_NAMESPACE::DF d, const uint16_t* HWY_RESTRICT p) {
    const hn::Rebind<uint16_t, simd::HWY_NAMESPACE::DF> d16;
    const hn::RebindToUnsigned<simd::HWY_NAMESPACE::DF> du;
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
  }
  static HWY_INLINE float Scalar(const uint16_t* p) { return bits_float(static_cast<uint32_t>(*p) << 16); }
};
struct RowsF16 {
  using T = uint16_t;
  static constexpr bool kEvenOdd = false;
  static HWY_INLINE simd::HWY_NAMESPACE::VF Load(simd::HWY_NAMESPACE::DF d, const uint16_t* HWY_RESTRICT p) {
    const hn::Rebind<hwy::float16_t, simd::HWY_NAMESPACE::DF> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(p)));
  }
  static HWY_INLINE float Scalar(const uint16_t* p) { return fp16_to_float(*p); }
};

// bf16 rows read as 32-bit words, two values each: the even-indexed values are the words shifted left by 16,
// the odd ones the words with their low half cleared, one instruction per vector of fp32 where widening
// half a vector takes two (a zero-extension, a shuffle, and a shift). The kernels reading rows this way
// (DotScoresEO, DotPvEO in tiled_kernels.cpp) hold each chunk of 2N head_dim values as [N even | N odd]:
// the query rows so permuted, the output rows permuted back at the end.
struct RowsBf16EvenOdd {
  using T = uint16_t;
  static constexpr bool kEvenOdd = true;
  static HWY_INLINE hn::Vec<hn::RebindToUnsigned<simd::HWY_NAMESPACE::DF>> Words(
      simd::HWY_NAMESPACE::DF d, const uint16_t* HWY_RESTRICT p) {
    const hn::RebindToUnsigned<decltype(d)> du;
    return hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  }
  static HWY_INLINE simd::HWY_NAMESPACE::VF Even(simd::HWY_NAMESPACE::DF d, const uint16_t* HWY_RESTRICT p) {
    return hn::BitCast(d, hn::ShiftLeft<16>(Words(d, p)));
  }
  static HWY_INLINE simd::HWY_NAMESPACE::VF Odd(simd::HWY_NAMESPACE::DF d, const uint16_t* HWY_RESTRICT p) {
    const hn::RebindToUnsigned<decltype(d)> du;
    return hn::BitCast(d, hn::And(Words(d, p), hn::Set(du, 0xFFFF0000u)));
  }
  static HWY_INLINE float Scalar(const uint16_t* p) { return bits_float(static_cast<uint32_t>(*p) << 16); }
};

// out[0..3] = the lane sums of a0..a3, the four reduced together ("transposed"): within each 128-bit block
// lanes 0 + 2 and 1 + 3 (InterleaveLower/Upper of two accumulators), then those two pair sums (the same on
// 64-bit halves of four), which leaves every block holding its partial sums of a0..a3; then the blocks, in a
// fixed order. Each accumulator's lanes are summed in the same order whatever its companions (zeros
// included), so a score does not depend on which kernel shape computed it: the backward's DotScores<1, 8> /
// <1, 1> recompute bitwise what the forward's DotScores<NR, KB> summed. About 9 shuffles and adds for four
// sums instead of a horizontal reduction per accumulator (~10 each on AVX-512): with head_dim 64 on 16 lanes
// the per-key reductions had cost more than the FMAs they closed.
HWY_INLINE void SumLanes4(simd::HWY_NAMESPACE::VF a0, simd::HWY_NAMESPACE::VF a1, simd::HWY_NAMESPACE::VF a2,
                          simd::HWY_NAMESPACE::VF a3, float* HWY_RESTRICT out) {
  const simd::HWY_NAMESPACE::DF d;
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  out[0] = hn::GetLane(a0), out[1] = hn::GetLane(a1), out[2] = hn::GetLane(a2), out[3] = hn::GetLane(a3);
#else
  using VF = simd::HWY_NAMESPACE::VF;
  const hn::Repartition<uint64_t, decltype(d)> d64;
  const VF t01 = hn::Add(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const VF t23 = hn::Add(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const auto w01 = hn::BitCast(d64, t01), w23 = hn::BitCast(d64, t23);
  const VF u = hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, w01, w23)),
                       hn::BitCast(d, hn::InterleaveUpper(d64, w01, w23)));
  const hn::FixedTag<float, 4> d4;
#if HWY_HAVE_SCALABLE
  // Blocks in order 0, 1, 2, ... (the vector length is known at run time only).
  HWY_ALIGN float blocks[simd::HWY_NAMESPACE::kPadLanes];
  hn::Store(u, d, blocks);
  auto sum = hn::Load(d4, blocks);
  for (size_t b = 4; b < hn::Lanes(d); b += 4) sum = hn::Add(sum, hn::Load(d4, blocks + b));
  hn::StoreU(sum, d4, out);
#else
  // Halves: 4 blocks as (0 + 2) + (1 + 3), 2 as 0 + 1, in registers.
  static_assert(hn::MaxLanes(d) == 4 || hn::MaxLanes(d) == 8 || hn::MaxLanes(d) == 16,
                "a fixed-width float vector of 4, 8 or 16 lanes");
  if constexpr (hn::MaxLanes(d) == 16) {
    const hn::Half<decltype(d)> d8;
    const hn::Half<decltype(d8)> d4h;
    const auto h = hn::Add(hn::LowerHalf(d8, u), hn::UpperHalf(d8, u));
    hn::StoreU(hn::Add(hn::LowerHalf(d4h, h), hn::UpperHalf(d4h, h)), d4h, out);
  } else if constexpr (hn::MaxLanes(d) == 8) {
    const hn::Half<decltype(d)> d4h;
    hn::StoreU(hn::Add(hn::LowerHalf(d4h, u), hn::UpperHalf(d4h, u)), d4h, out);
  } else {
    (void)d4;
    hn::StoreU(u, d, out);
  }
#endif
#endif
}

// Scores of KB keys x NR rows (KB * NR <= 8 accumulators, enough independent FMA chains to hide latency):
// s[r * lds + kk] = qs[r] . k[kk] over head_dim D, vector part in lanes (summed by SumLanes4) then a scalar
// tail, in a fixed order (so results depend on the SIMD target only). Rows: how K is stored (RowsF32 /
// RowsBf16 / RowsF16).
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
  float sums[8];
  SumLanes4(a0, a1, a2, a3, sums);
  if constexpr (NR * KB > 4) SumLanes4(a4, a5, a6, a7, sums + 4);
#define ATTN_DOT_STORE(i)                                                                               \
  if constexpr (i < NR * KB) {                                                                          \
    float tail = 0.0f;                                                                                  \
    for (int64_t e = Dv; e < D; ++e) tail += Rows::Scalar(k + (i / NR) * D + e) * qs[(i % NR) * D + e]; \
    s[(i % NR) * lds + i / NR] = sums[i] + tail;                                                        \
  }
  ATTN_DOT_ACC8(ATTN_DOT_STORE)
#undef ATTN_DOT_STORE
}

#undef ATTN_DOT_SCORE_DECLARE
#undef ATTN_DOT_ACC8

}  // namespace attn::tiled::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_TILED_DOT_SCORES_INL_HPP_
