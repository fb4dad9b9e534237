// Input tensors for a sweep point, made from its regime and seed: the same point always gets the same inputs.
#pragma once
#include "bench/lib/plan.hpp"
#include "common/interface/attention.hpp"
#include "common/support/tensor.hpp"

namespace attn {

struct PointInputs {
  FloatArray q, k, v;
  ByteArray key_padding;  // [batch, seq_kv] when the mask pads keys
  // A recurrence's per-token inputs (Capabilities::gate, beta), only for a variant that reads them:
  // g = logsigmoid(N(mean, std^2)) ([batch, heads, seq] or [.., head_dim]) and beta = sigmoid(N(mean, std^2))
  // ([batch, heads, seq]) with the regime's distributions (inputs[].g, inputs[].beta; the documented default
  // N(0, 1) for both), from their own streams of the input seed.
  // g_vector is the per-channel gate ([.., head_dim]); gate_for() picks the one a variant reads.
  FloatArray g, g_vector, beta;
  // The gate `p`'s variant reads (g, g_vector or null).
  const float* gate_for(const Problem& p) const;
  FloatArray sink_logits;  // [heads], N(0, 1): read only by points with sink logits (Problem::sinks)
  // A lightning indexer's inputs (Capabilities::indexer), only for a variant that reads them: index_q
  // [batch, seq_q, index_heads, index_dim], index_k [batch, seq_kv, index_dim], index_w [batch, seq_q,
  // index_heads] (IndexerShape), each N(0, 1) from its own stream of the input seed.
  FloatArray index_q, index_k, index_w;
  std::size_t bytes() const;
  // Pointers to every tensor here, with the gate `p`'s variant reads (gate_for): what its kernel is given
  // (every caller once had to remember to pick the gate; one did not, and a per-channel gate went missing).
  AttentionInputs view(const Problem& p, float* out) const;
};

// Q is [batch, heads, seq_q, head_dim]; K is [batch, kv_heads, seq_kv, head_dim] and V [.., d_v]
// (Problem::num_kv_heads, Problem::value_dim). gaussian: Q, K ~ N(0, std^2), V ~ N(0, 1). A larger std makes
// attention more peaked (logit spread ~ std^2). tokens: see make_token_inputs. Key padding pads the trailing
// round(fraction
// * seq_kv) keys of every batch. With the regime's RoPE on, Q and K are rotated (apply_point_rope) before
// they are returned. Always fp32: a bf16 / fp16 point rounds them (StoredInputs, common/interface/half.hpp).
PointInputs make_inputs(const SweepPoint& point);

// Draws in.g, in.g_vector and in.beta where the point's variant reads them and they are not there yet (points
// sharing inputs may be variants with a scalar and a per-channel gate); the draws depend on the input seed
// alone, so every point of an input set sees the same g and beta. Likewise an indexer's index_q, index_k and
// index_w (redrawn when a point's index_heads or index_dim give them another shape).
void fill_recurrence_inputs(const SweepPoint& point, PointInputs& in);

// Backward points' dO, [batch, heads, seq_q, d_v]: N(0, 1) from its own stream of the input seed (Q, K
// and V use input_seed * 3 + 1 .. 3, dO input_seed * 3 + 4), so every point of an input set, and the
// PyTorch peer through `attnbench inputs`, start their backward from the same dO.
FloatArray make_d_out(const SweepPoint& point);

// The regime's RoPE on fp32 Q and K in place (nothing when off): keys at positions 0 .. seq_kv - 1, queries
// from rope_query_offset(problem) on. q and k have the point's Q and K shapes (or are copies of them).
void apply_point_rope(const SweepPoint& point, float* q, float* k);

}  // namespace attn
