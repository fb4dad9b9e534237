// Row kernels with AVX-512 intrinsics and SLEEF where available; scalar fallbacks elsewhere.
#include "common/vmath.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#include <sleef.h>
#define ATTN_HAVE_AVX512 1
// GCC 12's own _mm512_undefined_ps (`__m512 __Y = __Y;`) trips -Wmaybe-uninitialized inside the header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace attn {

#ifdef ATTN_HAVE_AVX512
namespace {
// Horizontal reductions through memory: GCC 12's _mm512_reduce_* trip -Wuninitialized inside its own header.
float hmax(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float m = lanes[0];
  for (int i = 1; i < 16; ++i) m = std::max(m, lanes[i]);
  return m;
}
float hsum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float s = 0;
  for (int i = 0; i < 16; ++i) s += lanes[i];
  return s;
}
}  // namespace
#endif

float row_max(const float* x, int64_t n) {
  // max() drops a NaN operand or keeps it depending on the order, so NaN is tracked apart: a row of NaN
  // scores (a NaN query) next to masked -inf entries must not come out as -inf, the mark of a fully masked
  // row.
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  int64_t j = 0;
#ifdef ATTN_HAVE_AVX512
  __m512 vm = _mm512_set1_ps(m);
  __mmask16 unordered = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    vm = _mm512_max_ps(vm, v);
  }
  m = hmax(vm);
  nan = unordered != 0;
#endif
  for (; j < n; ++j) {
    nan = nan || std::isnan(x[j]);
    m = std::max(m, x[j]);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

float exp_sub_sum(float* x, int64_t n, float m) {
  float sum = 0;
  int64_t j = 0;
#ifdef ATTN_HAVE_AVX512
  const __m512 vm = _mm512_set1_ps(m);
  __m512 vs = _mm512_setzero_ps();
  for (; j + 16 <= n; j += 16) {
    __m512 e = Sleef_expf16_u10(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm));
    _mm512_storeu_ps(x + j, e);
    vs = _mm512_add_ps(vs, e);
  }
  if (j < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - j)) - 1);
    __m512 in = _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), tail, x + j);
    __m512 e = Sleef_expf16_u10(_mm512_sub_ps(in, vm));
    _mm512_mask_storeu_ps(x + j, tail, e);
    vs = _mm512_add_ps(vs, e);
    j = n;
  }
  sum = hsum(vs);
#endif
  for (; j < n; ++j) {
    x[j] = std::exp(x[j] - m);
    sum += x[j];
  }
  return sum;
}

void scale_row(float* x, int64_t n, float s) {
  int64_t j = 0;
#ifdef ATTN_HAVE_AVX512
  const __m512 vs = _mm512_set1_ps(s);
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), vs));
#endif
  for (; j < n; ++j) x[j] *= s;
}

void exp_inplace(float* x, int64_t n) {
  int64_t j = 0;
#ifdef ATTN_HAVE_AVX512
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, Sleef_expf16_u10(_mm512_loadu_ps(x + j)));
#endif
  for (; j < n; ++j) x[j] = std::exp(x[j]);
}

}  // namespace attn
