// Decode states by chunkwise prefill (decode_state.hpp).
#include "bench/lib/decode_state.hpp"

#include <algorithm>

#include "common/support/runtime.hpp"

namespace attn {

bool decode_from_prefill(const Problem& p) {
  const Attention* v = Registry::instance().find(p.variant);
  return v && v->capabilities().state && v->capabilities().decode && is_decode_shape(p);
}

Problem prefill_problem(const Problem& p) {
  Problem pre = p;
  pre.seq_q = pre.seq_kv = p.seq_kv - p.seq_q;
  pre.mask = MaskSpec{};
  pre.mask.causal = true;
  pre.dtype = DType::fp32;
  pre.initial_state = false;
  if (pre.params.contains("form")) pre.params["form"] = "chunk";
  return pre;
}

void DecodeStates::prepare(const SweepPoint& pt, const AttentionInputs& in) {
  const Problem& p = pt.problem;
  if (!decode_from_prefill(p)) return;
  const Problem pre = prefill_problem(p);
  const std::string key = pre.repro();
  if (states_.count(key)) return;
  const Attention& variant = Registry::instance().get(p.variant);
  const Capabilities caps = variant.capabilities();
  const int64_t B = p.batch, H = p.heads, KV = p.num_kv_heads(), D = p.head_dim, Dv = p.value_dim();
  const int64_t n = p.seq_kv, P = pre.seq_q;
  // The first P tokens of every K/V head (and of g and beta, per query head), contiguous as the prefill's
  // own [.., P, ..] tensors.
  auto prefix = [&](const float* x, int64_t blocks, int64_t width) {
    FloatArray y({blocks, P * width});
    for (int64_t b = 0; b < blocks; ++b) std::copy_n(x + b * n * width, P * width, y.ptr() + b * P * width);
    return y;
  };
  const FloatArray k = prefix(in.k, B * KV, D), v = prefix(in.v, B * KV, Dv);
  FloatArray g, beta;
  if (caps.gate != Gate::none) g = prefix(in.g, B * H, caps.gate == Gate::vector ? D : 1);
  if (caps.beta) beta = prefix(in.beta, B * H, 1);
  FloatArray q({B, H, P, D}), out({B, H, P, Dv});  // zeros: the queries do not reach the state
  FloatArray state({B, H, D, Dv});
  AttentionInputs pin;
  pin.q = q.ptr(), pin.k = k.ptr(), pin.v = v.ptr(), pin.out = out.ptr();
  pin.g = g.numel() ? g.ptr() : nullptr;
  pin.beta = beta.numel() ? beta.ptr() : nullptr;
  pin.final_state = state.ptr();
  {
    ThreadScope scope(pt.threads);
    variant.run(pre, pin);
  }
  states_[key] = std::move(state);
}

const float* DecodeStates::state_for(const Problem& p) const {
  if (!decode_from_prefill(p)) return nullptr;
  const auto it = states_.find(prefill_problem(p).repro());
  return it == states_.end() ? nullptr : it->second.ptr();
}

}  // namespace attn
