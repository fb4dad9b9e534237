// Per-target SIMD building blocks shared by every kernel file compiled through Highway's foreach_target.h
// (common/kernels/vmath.cpp, common/kernels/simd.cpp, variants/*/..._kernels.cpp): the float tag the kernels
// use and the exp2 polynomial of the softmax. Included once per target, inside that target's namespace: hence
// the toggle guard instead of #pragma once (Highway's convention for -inl headers).
#if defined(ATTN_COMMON_SIMD_INL_HPP_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_COMMON_SIMD_INL_HPP_
#undef ATTN_COMMON_SIMD_INL_HPP_
#else
#define ATTN_COMMON_SIMD_INL_HPP_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Kernels pad their lane dimension (queries in tiled's tiles) to kPadLanes = 16 floats. Vectors are at most
// that wide (CappedTag), so a vector's lane count (16 on avx3, 8 on avx2, 4 on sse4/neon, 4..16 on sve, 1 on
// scalar) always divides the padding.
inline constexpr int kPadLanes = 16;
using DF = hn::CappedTag<float, kPadLanes>;
using VF = hn::Vec<DF>;

// Coefficients of 2^f on [-1/2, 1/2]: degree 6, fitted for minimal relative error (Lawson iteration) and
// rounded to fp32.
inline constexpr float kExp2Coeffs[7] = {1.0f,           0.693147182f,   0.240226462f,   0.0555032864f,
                                         0.00961848907f, 0.00133999309f, 0.000153458008f};

// 2^x for x <= 0 (and NaN): the softmax exponential, with log2(e) folded into the logit scale.
// x = n + f with n = round-to-nearest(x) and f in [-1/2, 1/2] exact; 2^f by the polynomial above; 2^n built
// from its exponent bits (scalef on AVX-512). Error: <= 1.5 ulp of the true 2^x for x in [-126, 0]; results
// below the normal range (x < -126, true value < 2^-126) are flushed to 0, and 2^-inf = 0; NaN stays NaN.
// tests/test_tiled.cpp asserts all of this on a dense sample, for every target the CPU supports.
//
// Why flush: a softmax weight is divided by a sum >= 1 (the max element contributes 2^0), so an absolute
// error below 2^-126 is 2^-102 relative to the sum, far below fp32 resolution. It saves the work a denormal
// result needs (on Intel cores every underflowing lane costs a microcode assist, the measured cause of a slow
// causal softmax: masked keys are -inf) and lets 2^n be a single exponent field.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Exp2(D d, V x) {
  const auto tiny = hn::Lt(x, hn::Set(d, -126.0f));  // false for NaN: NaN lanes are computed and stay NaN
  x = hn::IfThenZeroElse(tiny, x);                   // computed at 0, zeroed at the end
  // Round to nearest by the 1.5 * 2^23 trick: for |x| < 2^22 the sum's low mantissa bits hold round(x) as an
  // integer and subtracting the constant back gives round(x) as a float, exactly. (Cheaper than Round plus
  // a float-to-int conversion on targets without AVX-512.)
  const V magic = hn::Set(d, 12582912.0f);
  const V shifted = hn::Add(x, magic);
  const V n = hn::Sub(shifted, magic);
  const V f = hn::Sub(x, n);
  V p = hn::Set(d, kExp2Coeffs[6]);
  p = hn::MulAdd(p, f, hn::Set(d, kExp2Coeffs[5]));
  p = hn::MulAdd(p, f, hn::Set(d, kExp2Coeffs[4]));
  p = hn::MulAdd(p, f, hn::Set(d, kExp2Coeffs[3]));
  p = hn::MulAdd(p, f, hn::Set(d, kExp2Coeffs[2]));
  p = hn::MulAdd(p, f, hn::Set(d, kExp2Coeffs[1]));
  p = hn::MulAdd(p, f, hn::Set(d, kExp2Coeffs[0]));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (sizeof(V) == 64) {
    // Masked form: GCC 12 warns (falsely) about the undefined pass-through of the unmasked intrinsic.
    V r;
    r.raw = _mm512_mask_scalef_ps(p.raw, 0xffff, p.raw, n.raw);
    return hn::IfThenZeroElse(tiny, r);
  }
#endif
  // 2^n for n in [-126, 0]: exponent field n + 127 = the shifted sum's integer bits minus the magic's, plus
  // 127. A NaN lane gives garbage bits here, but its p is NaN and NaN times anything is NaN.
  const hn::RebindToSigned<D> di;
  const auto bits = hn::Add(hn::BitCast(di, shifted), hn::Set(di, 127 - 0x4B400000));
  return hn::IfThenZeroElse(tiny, hn::Mul(p, hn::BitCast(d, hn::ShiftLeft<23>(bits))));
}

// tanh(x) with NaN kept as NaN: Highway's scalar-target Tanh converts its argument to an integer, undefined
// behaviour for NaN (UBSan flags it), so NaN lanes take tanh(0) and get their NaN back. Soft-capping's tanh
// (vmath, tiled's forward and backward).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V TanhKeepNaN(D d, V x) {
  const auto nan = hn::IsNaN(x);
  return hn::IfThenElse(nan, x, hn::Tanh(d, hn::IfThenZeroElse(nan, x)));
}

}  // namespace attn::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_COMMON_SIMD_INL_HPP_
