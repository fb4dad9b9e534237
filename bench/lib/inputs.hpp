// Input tensors for a sweep point, made from its regime and seed: the same point always gets the same inputs.
#pragma once
#include "bench/lib/plan.hpp"
#include "common/attention.hpp"
#include "common/tensor.hpp"

namespace attn {

struct PointInputs {
  FloatArray q, k, v;
  ByteArray key_padding;  // [batch, seq_kv] when the mask pads keys
  std::size_t bytes() const;
  AttentionInputs view(float* out) const;
};

// Q is [batch, heads, seq_q, head_dim]; K and V are [batch, kv_heads, seq_kv, head_dim]
// (Problem::num_kv_heads). gaussian: Q, K ~ N(0, std^2), V ~ N(0, 1). A larger std makes attention more
// peaked (logit spread ~ std^2). tokens: see make_token_inputs. Key padding pads the trailing round(fraction
// * seq_kv) keys of every batch.
PointInputs make_inputs(const SweepPoint& point);

}  // namespace attn
