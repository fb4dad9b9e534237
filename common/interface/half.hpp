// Storage precisions of Q, K and V (Problem::dtype): fp32, bf16 and fp16, and the conversions between them.
// Inputs are made (or read) in fp32 and rounded to the storage type with round-to-nearest-even, as a user
// converting fp32 weights would; the kernels read the 16-bit values and compute and accumulate in fp32, and
// the output is fp32. Every bf16 and fp16 value is exactly an fp32 value, so widening is exact.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"

namespace attn {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// fp32 -> bf16, round to nearest even. NaN stays NaN (quiet, sign kept); values past the largest bf16 round
// to +-Inf as IEEE rounding says; subnormals round like any other value (bf16 has fp32's exponent range).
inline uint16_t bf16_from_float(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

// fp32 -> fp16 (IEEE binary16), round to nearest even, with fp16 subnormals, overflow to +-Inf (from 65520
// up) and NaN kept as the quiet NaN 0x7e00 with the sign. The float-arithmetic formulation of Maratyszcza's
// FP16 library: the two scalings let the FPU do the rounding, including at the subnormal boundary.
inline uint16_t fp16_from_float(float f) {
  const float scale_to_inf = 0x1.0p+112f, scale_to_zero = 0x1.0p-110f;
  float base = (f < 0 ? -f : f) * scale_to_inf * scale_to_zero;
  const uint32_t w = float_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = bits_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = float_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007c00u, mantissa_bits = bits & 0x00000fffu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
}
inline float fp16_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16, sign = w & 0x80000000u, two_w = w + w;
  const float normalized = bits_float((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
  const float denormalized = bits_float((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t r = two_w < (1u << 27) ? float_bits(denormalized) : float_bits(normalized);
  return bits_float(sign | r);
}

inline uint16_t round_to(DType t, float f) {
  return t == DType::bf16 ? bf16_from_float(f) : fp16_from_float(f);
}
inline float widen(DType t, uint16_t h) {
  return t == DType::bf16 ? bf16_to_float(h) : fp16_to_float(h);
}

// Elementwise over n values (t must be bf16 or fp16). Parallel for large n.
void round_tensor(DType t, const float* x, int64_t n, uint16_t* out);
void widen_tensor(DType t, const uint16_t* x, int64_t n, float* out);
// x rounded to t and widened back: the fp32 values a t-storage kernel sees (x itself for fp32).
std::vector<float> rounded_values(DType t, const float* x, int64_t n);

// Q, K and V of `in` as fp32, for code that computes on fp32 inputs whatever the storage (the fp64 reference,
// naive, tolerances): for an fp32 problem it points at in's own tensors; otherwise it owns widened copies
// (exact). get() is `in` with q, k, v pointing at fp32 and the 16-bit pointers cleared; masks, ALiBi slopes
// and out are in's.
class WideInputs {
 public:
  WideInputs(const Problem& p, const AttentionInputs& in);
  const AttentionInputs& get() const { return in_; }
  // `p` as the fp32 problem these inputs form (dtype fp32, everything else the same).
  static Problem as_fp32(const Problem& p);

 private:
  std::vector<float> q_, k_, v_;
  AttentionInputs in_;
};

// Q, K and V of the fp32 inputs `in` rounded to storage type `t` (bf16, fp16), for callers holding fp32
// tensors (the sweep, eval, check): get() is `in` with q16, k16, v16 set and q, k, v cleared. For fp32 it
// is `in` unchanged.
class StoredInputs {
 public:
  StoredInputs(const Problem& p, const AttentionInputs& in);
  const AttentionInputs& get() const { return in_; }

 private:
  std::vector<uint16_t> q_, k_, v_;
  AttentionInputs in_;
};

}  // namespace attn
