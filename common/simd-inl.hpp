// Per-target SIMD building blocks shared by every kernel file compiled through Highway's foreach_target.h
// (common/vmath.cpp, common/simd.cpp, variants/*/..._kernels.cpp): the float tag the kernels use and the
// exp2 polynomial of the softmax. Included once per target, inside that target's namespace: hence the
// toggle guard instead of #pragma once (Highway's convention for -inl headers).
#if defined(ATTN_COMMON_SIMD_INL_HPP_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_COMMON_SIMD_INL_HPP_
#undef ATTN_COMMON_SIMD_INL_HPP_
#else
#define ATTN_COMMON_SIMD_INL_HPP_
#endif

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
// x = n + f with n = round(x), f in [-1/2, 1/2] exact; 2^f by the polynomial above; 2^n applied exactly
// (scalef on AVX-512, two exact power-of-two multiplies elsewhere, the second of which is the only rounding
// of a denormal result). Error: <= 1.5 ulp of the true 2^x for x in [-126, 0] (normal results), <= 2^-149
// absolute below (denormal results); 2^-inf = 0 and NaN stays NaN. tests/test_tiled.cpp asserts all of this
// on a dense sample, for every target the CPU supports.
//
// Lanes with x < -150 (a masked key's -inf, or a weight below half the smallest denormal) are computed at 0
// and zeroed after: their true result rounds to 0 anyway, and computing an underflow there would cost a
// microcode assist per lane on Intel cores (the measured cause of a slow causal softmax).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Exp2(D d, V x) {
  const auto tiny = hn::Lt(x, hn::Set(d, -150.0f));  // false for NaN: NaN lanes are computed and stay NaN
  x = hn::IfThenZeroElse(tiny, x);
  const V n = hn::Round(x);
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
  // 2^n = 2^n1 * 2^n2 with n1 = floor(n / 2): both factors are normal for n in [-150, 128], so p * 2^n1 is
  // exact and only the second product rounds. NaN lanes use n = 0 (their p is NaN already), which keeps the
  // integer conversion defined.
  const hn::RebindToSigned<D> di;
  const auto ni = hn::ConvertTo(di, hn::IfThenZeroElse(hn::IsNaN(n), n));
  const auto n1 = hn::ShiftRight<1>(ni);
  const auto n2 = hn::Sub(ni, n1);
  const auto bias = hn::Set(di, 127);
  const V s1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  const V s2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n2, bias)));
  return hn::IfThenZeroElse(tiny, hn::Mul(hn::Mul(p, s1), s2));
}

}  // namespace attn::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_COMMON_SIMD_INL_HPP_
