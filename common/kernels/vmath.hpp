// Vectorised row kernels shared by the variants: max, exp(x - m) with its sum, scaling, 2^x over an array
// and linear attention's feature maps. Each dispatches at run time to the SIMD target selected in
// common/kernels/simd.hpp (Highway); results are deterministic for a given target and length.
#pragma once
#include <cstdint>

namespace attn {

float row_max(const float* x, int64_t n);  // -inf for n == 0; NaN if any element is NaN
// x[j] = exp(x[j] - m) in place, returns the sum (fp32, accumulated in vector lanes). -inf entries give 0.
// exp(t) is computed as 2^(t log2 e) by the exp2 polynomial of common/kernels/simd-inl.hpp (<= 1.5 ulp); the
// max is subtracted before the log2(e) multiply, so that multiply's rounding changes a weight w = exp(x - m)
// by at most w |x - m| 2^-24 <= 2^-24 / e in absolute terms.
float exp_sub_sum(float* x, int64_t n, float m);
void scale_row(float* x, int64_t n, float s);          // x *= s
void exp2_array(const float* x, float* y, int64_t n);  // y = 2^x (the polynomial itself; x <= 0 or NaN)
// dst = elu(src) + 1 (src + 1 above 0, exp(src) at or below; exp is Highway's, <= 1 ulp) and dst = relu(src).
// A NaN input stays NaN in both.
void elu_plus_one(const float* src, float* dst, int64_t n);
void relu(const float* src, float* dst, int64_t n);
// x = cap * tanh(x / cap) in place (logit soft-capping, Highway's Tanh). -inf becomes -cap (tanh saturates),
// so masks that write -inf go after it; NaN stays NaN.
void softcap(float* x, int64_t n, float cap);
// Rows picked by index (sparse attention over selected keys, without copying them): s[j] = scale * (q .
// rows[idx[j]
// * ld .. + d)) for j < n, each dot in vector lanes then a scalar tail, in a fixed order; and out[0..d) +=
// sum_j w[j] rows[idx[j] * ld ..] (out read and written once per call, the sum over j in order).
void gathered_dots(const float* q, const float* rows, int64_t ld, int64_t d, const int32_t* idx, int64_t n,
                   float scale, float* s);
void gathered_axpy(const float* w, const float* rows, int64_t ld, int64_t d, const int32_t* idx, int64_t n,
                   float* out);

}  // namespace attn
