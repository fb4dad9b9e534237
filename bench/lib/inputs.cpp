// Input generation for sweep points.
#include "bench/lib/inputs.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/kernels/rope.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"

namespace attn {

std::size_t PointInputs::bytes() const {
  return (q.numel() + k.numel() + v.numel() + g.numel() + g_vector.numel() + beta.numel() + index_q.numel() +
          index_k.numel() + index_w.numel()) *
             sizeof(float) +
         key_padding.numel();
}

AttentionInputs PointInputs::view(const Problem& p, float* out) const {
  AttentionInputs in;
  in.q = q.ptr();
  in.k = k.ptr();
  in.v = v.ptr();
  in.key_padding = key_padding.numel() ? key_padding.ptr() : nullptr;
  in.sink_logits = sink_logits.numel() ? sink_logits.ptr() : nullptr;
  in.g = gate_for(p);
  in.beta = beta.numel() ? beta.ptr() : nullptr;
  in.index_q = index_q.numel() ? index_q.ptr() : nullptr;
  in.index_k = index_k.numel() ? index_k.ptr() : nullptr;
  in.index_w = index_w.numel() ? index_w.ptr() : nullptr;
  in.out = out;
  return in;
}

PointInputs make_token_inputs(const SweepPoint& point);  // inputs_tokens.cpp

void apply_point_rope(const SweepPoint& pt, float* q, float* k) {
  const Problem& p = pt.problem;
  const RopeSpec& r = pt.regime.rope;
  if (!r.on()) return;
  apply_rope_qk(r, p, q, k);
}

namespace {
// g and beta come from their own streams (input_seed * 3 + 1 or + 2 offset by a constant, apart from every
// seed's Q, K, V and dO streams): z = mean + std * N(0, 1) from the regime's distribution (inputs[].g,
// inputs[].beta; default N(0, 1)), then g by the distribution's parametrisation (logsigmoid(z) by default),
// beta = sigmoid(z). The same N(0, 1) draws serve
// every distribution of an input seed.
constexpr uint64_t kGateStream = 0x9e3779b97f4a7c15ULL;
// An indexer's inputs: input_seed * 3 + 1 .. 3 offset by another constant (apart from the gate streams).
constexpr uint64_t kIndexStream = 0xd1b54a32d192ed03ULL;

void draw_normal(FloatArray& x, std::vector<int64_t> shape, uint64_t seed) {
  if (x.shape == shape) return;
  x = FloatArray(std::move(shape));
  fill_normal(x.ptr(), static_cast<int64_t>(x.numel()), seed);
}

void draw_into(FloatArray& x, std::vector<int64_t> shape, uint64_t seed, const GateDistribution& dist,
               bool logsigmoid) {
  x = FloatArray(std::move(shape));
  fill_normal(x.ptr(), static_cast<int64_t>(x.numel()), seed);
  for (float& e : x.data) {
    const double z = dist.mean + dist.std * static_cast<double>(e);
    if (logsigmoid) {  // g by its parametrisation (GateDistribution::g_of: finite, <= 0)
      e = static_cast<float>(dist.g_of(z));
    } else {
      // sigmoid(z) in (0, 1]; below z = -87 it would round to a float32 subnormal or 0, so it is raised to
      // float32's smallest normal: every beta stays in (0, 1].
      e = std::max(static_cast<float>(1.0 / (1.0 + std::exp(-z))), std::numeric_limits<float>::min());
    }
  }
}
}  // namespace

void fill_recurrence_inputs(const SweepPoint& pt, PointInputs& in) {
  const Problem& p = pt.problem;
  const Attention* variant = Registry::instance().find(p.variant);
  if (!variant) return;
  const Capabilities caps = variant->capabilities();
  // One per key token (a decode point's context included; the call reads the tokens it consumes).
  const std::vector<int64_t> tokens{p.batch, p.heads, p.seq_kv};
  if (caps.gate == Gate::scalar && in.g.shape != tokens)
    draw_into(in.g, tokens, pt.input_seed * 3 + 1 + kGateStream, pt.regime.g, true);
  const std::vector<int64_t> channels{p.batch, p.heads, p.seq_kv, p.head_dim};
  if (caps.gate == Gate::vector && in.g_vector.shape != channels)
    draw_into(in.g_vector, channels, pt.input_seed * 3 + 1 + kGateStream, pt.regime.g, true);
  if (caps.beta && in.beta.shape != tokens)
    draw_into(in.beta, tokens, pt.input_seed * 3 + 2 + kGateStream, pt.regime.beta, false);
  if (caps.indexer) {
    const IndexerShape ix(p);
    draw_normal(in.index_q, {p.batch, p.seq_q, ix.heads, ix.dim}, pt.input_seed * 3 + 1 + kIndexStream);
    draw_normal(in.index_k, {p.batch, p.seq_kv, ix.dim}, pt.input_seed * 3 + 2 + kIndexStream);
    draw_normal(in.index_w, {p.batch, p.seq_q, ix.heads}, pt.input_seed * 3 + 3 + kIndexStream);
  }
}

const float* PointInputs::gate_for(const Problem& p) const {
  const Attention* variant = Registry::instance().find(p.variant);
  const Gate gate = variant ? variant->capabilities().gate : Gate::none;
  const FloatArray& x = gate == Gate::vector ? g_vector : g;
  return gate != Gate::none && x.numel() ? x.ptr() : nullptr;
}

PointInputs make_inputs(const SweepPoint& pt) {
  const Problem& p = pt.problem;
  PointInputs in;
  if (pt.regime.kind == "tokens") {
    in = make_token_inputs(pt);
  } else {
    in.q = FloatArray({p.batch, p.heads, p.seq_q, p.head_dim});
    // K and V hold kv_heads heads (grouped-query attention; = heads otherwise, so the draws do not depend on
    // it).
    in.k = FloatArray({p.batch, p.num_kv_heads(), p.seq_kv, p.head_dim});
    in.v = FloatArray({p.batch, p.num_kv_heads(), p.seq_kv, p.value_dim()});
    fill_normal(in.q.ptr(), static_cast<int64_t>(in.q.numel()), pt.input_seed * 3 + 1, pt.regime.std);
    fill_normal(in.k.ptr(), static_cast<int64_t>(in.k.numel()), pt.input_seed * 3 + 2, pt.regime.std);
    fill_normal(in.v.ptr(), static_cast<int64_t>(in.v.numel()), pt.input_seed * 3 + 3, 1.0);
  }
  validate_rope(pt.regime.rope, p.head_dim, "inputs.rope");  // the config checked it; a direct caller too
  apply_point_rope(pt, in.q.ptr(), in.k.ptr());
  // From their own stream of the input seed (Q, K, V: * 3 + 1 .. 3, dO: * 3 + 4), so points with and without
  // sinks read the same Q, K, V.
  in.sink_logits = FloatArray({p.heads});
  fill_normal(in.sink_logits.ptr(), p.heads, pt.input_seed * 3 + 5, 1.0);
  if (p.mask.key_padding) {
    in.key_padding = ByteArray({p.batch, p.seq_kv});
    const int64_t padded = std::llround(pt.mask.pad_fraction * static_cast<double>(p.seq_kv));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t j = p.seq_kv - padded; j < p.seq_kv; ++j) in.key_padding.data[b * p.seq_kv + j] = 1;
  }
  fill_recurrence_inputs(pt, in);
  return in;
}

FloatArray make_d_out(const SweepPoint& pt) {
  const Problem& p = pt.problem;
  FloatArray d({p.batch, p.heads, p.seq_q, p.value_dim()});
  fill_normal(d.ptr(), static_cast<int64_t>(d.numel()), pt.input_seed * 3 + 4);
  return d;
}

}  // namespace attn
