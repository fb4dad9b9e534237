// A recurrence's decode point (seq_q < seq_kv under causal_lower_right, Capabilities::decode and state)
// runs from a state, as a KV-cache decode runs from its cache: the sweep's input preparation (untimed, not
// part of the variant's time) makes it by a chunkwise prefill of the context, one call of the variant's
// chunk form on the first seq_kv - seq_q tokens with final_state, and the timed call is the decode step
// alone (O(d_k d_v) per token and head, whatever the context). The prefill's queries do not reach the state:
// they are zeros. It runs in fp32 on the fp32 inputs whatever the point's dtype (the state is fp32 anyway).
#pragma once
#include <map>
#include <string>

#include "bench/lib/plan.hpp"
#include "common/interface/attention.hpp"
#include "common/support/tensor.hpp"

namespace attn {

// Whether `p` is a recurrence at a decode shape: the sweep gives it an initial state (plan.cpp sets
// Problem::initial_state) that DecodeStates makes.
bool decode_from_prefill(const Problem& p);

// The prefill of decode point `p`: its variant and parameters with form=chunk, seq_q = seq_kv = seq_kv -
// p.seq_q, the causal mask, fp32, no initial state.
Problem prefill_problem(const Problem& p);

// The states of an input set's decode points, one per prefill problem (points of one interleaved group may
// be several recurrences on the same inputs); clear() when the inputs change.
class DecodeStates {
 public:
  // Makes the state of decode point `pt` from the full-context fp32 inputs `in` (K, V and the g / beta the
  // variant reads, [.., seq_kv, ..]) unless it is there already, at the point's threads.
  void prepare(const SweepPoint& pt, const AttentionInputs& in);
  // The state of `p` ([batch, heads, head_dim, head_dim]); null when `p` is not a decode point or it was
  // not prepared.
  const float* state_for(const Problem& p) const;
  void clear() { states_.clear(); }

 private:
  std::map<std::string, FloatArray> states_;  // by prefill_problem(p).repro()
};

}  // namespace attn
