// Vector kernels of the tiled variant: a 16-lane float vector (AVX-512, or a portable fallback), exp2 by a
// documented polynomial, and the two register-blocked GEMM micro-kernels, all with query rows in the lanes.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace attn::tiled {

inline constexpr int kLanes = 16;

#if defined(__AVX512F__)
using V16 = __m512;
inline V16 v_load(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void v_store(float* p, V16 x) {
  _mm512_storeu_ps(p, x);
}
inline V16 v_set1(float x) {
  return _mm512_set1_ps(x);
}
inline V16 v_zero() {
  return _mm512_setzero_ps();
}
inline V16 v_fma(V16 a, V16 b, V16 c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline V16 v_add(V16 a, V16 b) {
  return _mm512_add_ps(a, b);
}
inline V16 v_sub(V16 a, V16 b) {
  return _mm512_sub_ps(a, b);
}
inline V16 v_mul(V16 a, V16 b) {
  return _mm512_mul_ps(a, b);
}
// max(a, b) returns b when either is NaN (vmaxps semantics), so v_max(bound, x) keeps a NaN x. The masked
// form avoids GCC 12's false -Wmaybe-uninitialized on _mm512_max_ps's undefined pass-through operand.
inline V16 v_max(V16 a, V16 b) {
  return _mm512_mask_max_ps(a, 0xffff, a, b);
}
// Lanes whose value equals -inf are replaced by `value` (a fully masked running max becomes 0).
inline V16 v_replace_neg_inf(V16 x, float value) {
  const __mmask16 m =
      _mm512_cmp_ps_mask(x, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
  return _mm512_mask_mov_ps(x, m, _mm512_set1_ps(value));
}
// Lanes [0, count) set to `value` (count clamped to [0, 16]).
inline V16 v_set_low_lanes(V16 x, int64_t count, float value) {
  if (count <= 0) return x;
  const __mmask16 m = count >= kLanes ? __mmask16(0xffff) : static_cast<__mmask16>((1u << count) - 1);
  return _mm512_mask_mov_ps(x, m, _mm512_set1_ps(value));
}
#else
// Portable fallback with the same semantics (one lane at a time); attnbench is built -march=native, so this
// only serves machines without AVX-512.
struct V16 {
  float f[kLanes];
};
inline V16 v_load(const float* p) {
  V16 r;
  for (int i = 0; i < kLanes; ++i) r.f[i] = p[i];
  return r;
}
inline void v_store(float* p, V16 x) {
  for (int i = 0; i < kLanes; ++i) p[i] = x.f[i];
}
inline V16 v_set1(float x) {
  V16 r;
  for (float& e : r.f) e = x;
  return r;
}
inline V16 v_zero() {
  return v_set1(0.0f);
}
#define ATTN_TILED_LANEWISE(name, expr)   \
  inline V16 name(V16 a, V16 b) {         \
    V16 r;                                \
    for (int i = 0; i < kLanes; ++i) {    \
      const float x = a.f[i], y = b.f[i]; \
      r.f[i] = (expr);                    \
    }                                     \
    return r;                             \
  }
ATTN_TILED_LANEWISE(v_add, x + y)
ATTN_TILED_LANEWISE(v_sub, x - y)
ATTN_TILED_LANEWISE(v_mul, x* y)
ATTN_TILED_LANEWISE(v_max, x > y ? x : y)  // b when either is NaN, as vmaxps
#undef ATTN_TILED_LANEWISE
inline V16 v_fma(V16 a, V16 b, V16 c) {
  V16 r;
  for (int i = 0; i < kLanes; ++i) r.f[i] = std::fma(a.f[i], b.f[i], c.f[i]);
  return r;
}
inline V16 v_replace_neg_inf(V16 x, float value) {
  for (float& e : x.f)
    if (e == -std::numeric_limits<float>::infinity()) e = value;
  return x;
}
inline V16 v_set_low_lanes(V16 x, int64_t count, float value) {
  for (int64_t i = 0; i < count && i < kLanes; ++i) x.f[i] = value;
  return x;
}
#endif

// 2^x for x <= 0 (and NaN), the softmax exponential with log2(e) folded into the logit scale.
// x = n + f with n = round(x), f in [-1/2, 1/2] exact; 2^f by a degree-6 polynomial fitted for minimal
// relative error on [-1/2, 1/2] (Lawson iteration, coefficients rounded to fp32); 2^n applied exactly by
// scalef. Error: <= 1.5 ulp of the true 2^x for x in [-126, 0] (normal results), <= 2^-149 absolute below
// (denormal results, rounded by scalef); 2^-inf = 0 and NaN stays NaN. tests/test_tiled.cpp asserts all of
// this on a dense sample. Inputs are clamped at -160 first so -inf gives exactly 0 (2^-160 underflows).
inline constexpr float kExp2Coeffs[7] = {1.0f,           0.693147182f,   0.240226462f,   0.0555032864f,
                                         0.00961848907f, 0.00133999309f, 0.000153458008f};
inline V16 v_exp2(V16 x) {
#if defined(__AVX512F__)
  x = v_max(_mm512_set1_ps(-160.0f), x);  // operand order keeps NaN
  // Masked forms of roundscale and scalef: see v_max on GCC 12's false warning.
  const __m512 n = _mm512_mask_roundscale_ps(x, 0xffff, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(kExp2Coeffs[6]);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Coeffs[5]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Coeffs[4]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Coeffs[3]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Coeffs[2]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Coeffs[1]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Coeffs[0]));
  return _mm512_mask_scalef_ps(p, 0xffff, p, n);
#else
  V16 r;
  for (int i = 0; i < kLanes; ++i) {
    const float xi = x.f[i];
    if (std::isnan(xi)) {
      r.f[i] = xi;
      continue;
    }
    const float c = xi > -160.0f ? xi : -160.0f;
    const float n = std::nearbyint(c), f = c - n;
    float p = kExp2Coeffs[6];
    for (int k = 5; k >= 0; --k) p = std::fma(p, f, kExp2Coeffs[k]);
    r.f[i] = std::ldexp(p, static_cast<int>(n));
  }
  return r;
#endif
}

// Elementwise y = 2^x over an array (tests and scalar tails); n need not be a multiple of 16.
inline void exp2_array(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) v_store(y + i, v_exp2(v_load(x + i)));
  if (i < n) {
    float buf[kLanes] = {};
    for (int64_t t = i; t < n; ++t) buf[t - i] = x[t];
    v_store(buf, v_exp2(v_load(buf)));
    for (int64_t t = i; t < n; ++t) y[t] = buf[t - i];
  }
}

// Score micro-kernel: an MR x (16 NV) block of S^T = K Q^T, keys in rows and queries in lanes.
//   k:  MR key rows, row stride ldk (the K tensor itself: no packing);
//   qt: Q^T, [d][ldq], already multiplied by scale * log2(e);
//   s:  output rows, stride lds;
//   colmax (optional): per query lane, max'ed with the column maxima of this block.
// Sums over d run in order 0..D-1 for every element, whatever the tiling or thread.
template <int MR, int NV>
void score_kernel(const float* k, int64_t ldk, const float* qt, int64_t ldq, int64_t depth, float* s,
                  int64_t lds, float* colmax) {
  V16 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = v_zero();
  for (int64_t d = 0; d < depth; ++d) {
    V16 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = v_load(qt + d * ldq + v * kLanes);
    for (int r = 0; r < MR; ++r) {
      const V16 a = v_set1(k[r * ldk + d]);
      for (int v = 0; v < NV; ++v) acc[r][v] = v_fma(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) v_store(s + r * lds + v * kLanes, acc[r][v]);
  if (colmax) {
    for (int v = 0; v < NV; ++v) {
      V16 m = v_load(colmax + v * kLanes);
      for (int r = 0; r < MR; ++r) m = v_max(m, acc[r][v]);
      v_store(colmax + v * kLanes, m);
    }
  }
}

// Output micro-kernel: an MR x (16 NV) block of O^T = alpha * O^T + V^T P^T, value dims in rows, queries in
// lanes. The running output is rescaled by alpha (per query) as it is loaded, the step that keeps the
// online softmax exact when the running max moves.
//   v:  value rows j = 0..nk-1 (stride ldv), starting at the block's first dim;
//   p:  P^T, [j][ldp], the tile's unnormalised probabilities;
//   ot: running O^T rows, stride ldo;  alpha: per query lane.
template <int MR, int NV>
void pv_kernel(const float* v, int64_t ldv, const float* p, int64_t ldp, int64_t nk, float* ot, int64_t ldo,
               const float* alpha) {
  V16 acc[MR][NV];
  V16 a[NV];
  for (int c = 0; c < NV; ++c) a[c] = v_load(alpha + c * kLanes);
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = v_mul(v_load(ot + r * ldo + c * kLanes), a[c]);
  for (int64_t j = 0; j < nk; ++j) {
    V16 b[NV];
    for (int c = 0; c < NV; ++c) b[c] = v_load(p + j * ldp + c * kLanes);
    for (int r = 0; r < MR; ++r) {
      const V16 x = v_set1(v[j * ldv + r]);
      for (int c = 0; c < NV; ++c) acc[r][c] = v_fma(x, b[c], acc[r][c]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NV; ++c) v_store(ot + r * ldo + c * kLanes, acc[r][c]);
}

}  // namespace attn::tiled
