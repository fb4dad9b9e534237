// The fp64 definition of multi-head latent attention (MLA, DeepSeek-V2/V3): DeepSeek-V3 inference/model.py
// class MLA's naive path written directly in double, kept apart from the fp32 front end
// (common/frontends/mla.hpp) it checks. Also the sizes and weights both share.
#pragma once
#include <cstdint>
#include <string>

#include "common/support/tensor.hpp"

namespace attn {

// The sizes of one MLA layer (DeepSeek's ModelArgs names in the comments).
struct MlaShape {
  int64_t d_model = 0;       // dim
  int64_t heads = 0;         // n_heads
  int64_t q_lora_rank = 0;   // 0: q = x wq^T; else q = wq_b(q_norm(wq_a(x)))
  int64_t kv_lora_rank = 0;  // the latent's width
  int64_t qk_nope_dim = 0;   // qk_nope_head_dim
  int64_t qk_rope_dim = 0;   // qk_rope_head_dim (even: RoPE rotates pairs)
  int64_t v_head_dim = 0;
  double rope_base = 10000.0;  // rope_theta

  int64_t qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  int64_t latent_row() const {
    return kv_lora_rank + qk_rope_dim;
  }                              // the absorbed form's K row: [c_kv, k_pe]
  double softmax_scale() const;  // qk_head_dim^-0.5
  // Throws UsageError naming the field, its value and what is allowed.
  void validate() const;
  std::string str() const;  // "E=2048,H=16,q_lora=0,kv_lora=512,nope=128,rope=64,v=128,base=10000"
  bool operator==(const MlaShape&) const = default;
};

// The weights in torch.nn.Linear's layout ([out, in], y = x W^T, no biases, as DeepSeek's Linear) and the
// RMSNorm weights. wq is used when q_lora_rank == 0, wq_a / q_norm / wq_b otherwise (the others are empty).
struct MlaWeights {
  FloatArray wq;       // [H * (nope + rope), E]
  FloatArray wq_a;     // [q_lora, E]
  FloatArray q_norm;   // [q_lora]
  FloatArray wq_b;     // [H * (nope + rope), q_lora]
  FloatArray wkv_a;    // [kv_lora + rope, E]
  FloatArray kv_norm;  // [kv_lora]
  FloatArray
      wkv_b;      // [H * (nope + v), kv_lora]: head h's rows h*(nope+v) .. are its W_uk (nope rows), W_uv (v)
  FloatArray wo;  // [E, H * v]
  // Checks every tensor's shape against `shape` (and absent ones are empty) and that every value is finite;
  // UsageError naming the tensor, its shape and the expected one.
  void validate(const MlaShape& shape) const;
};

// The fp64 definition: DeepSeek's naive path in double from the same weights over every token of x_all
// [B, L, E] (a cache's history and the new tokens together, positions 0 .. L - 1, causal: token t attends
// tokens 0 .. t), returning y [B, L - first_row, E] for tokens first_row .. L - 1 (the keys and values of
// every token are computed; queries, attention and wo only for those rows). No YaRN mscale. The test
// oracle and `attnbench mla`'s accuracy figure. UsageError for a bad shape, weights or first_row.
DoubleArray mla_reference(const MlaShape& shape, const MlaWeights& weights, const FloatArray& x_all,
                          int64_t first_row = 0);

}  // namespace attn
