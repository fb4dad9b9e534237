// Vectorised row kernels shared by the softmax-based variants: max, exp(x - m) with sum, scaling.
// exp is SLEEF's Sleef_expf16_u10 (max error 1.0 ulp, documented by SLEEF) on AVX-512, else std::exp.
#pragma once
#include <cstdint>

namespace attn {

float row_max(const float* x, int64_t n);  // -inf for n == 0; NaN if any element is NaN
// x[j] = exp(x[j] - m) in place, returns the sum (in fp32, accumulated in 16 lanes). -inf entries give 0.
float exp_sub_sum(float* x, int64_t n, float m);
void scale_row(float* x, int64_t n, float s);  // x *= s
void exp_inplace(float* x, int64_t n);         // x = exp(x), for tests of the exp itself

}  // namespace attn
