// Test plugin (tests/test_plugins.cpp): three variants that misbehave, each of which the runner must turn
// into a failed row naming what happened while the sweep goes on:
//   plugin_throws  its forward throws std::runtime_error (the row's reason is the message);
//   plugin_nan     writes NaN into the output from finite inputs;
//   plugin_oob     writes the correct output, then one float past the end of O (the guard regions of
//                  bench/lib/guarded.hpp; under AddressSanitizer the process stops at the write).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/kernels/mask.hpp"  // exact_attention_flops

namespace {

// Exact softmax attention without masks (what plugin_oob writes before its stray float).
void softmax_attention(const attn::Problem& p, const attn::AttentionInputs& in) {
  const int64_t d = p.head_dim, lq = p.seq_q, lkv = p.seq_kv;
  const float scale = static_cast<float>(p.effective_scale());
  std::vector<float> scores(static_cast<std::size_t>(lkv));
  float* s = scores.data();
  for (int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    const float* q = in.q + bh * lq * d;
    const float* k = in.k + p.kv_block(b, h) * lkv * d;
    const float* v = in.v + p.kv_block(b, h) * lkv * d;
    for (int64_t i = 0; i < lq; ++i) {
      float m = -INFINITY, sum = 0.0f;
      for (int64_t j = 0; j < lkv; ++j) {
        float dot = 0.0f;
        for (int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
        m = std::max(m, s[j] = dot * scale);
      }
      for (int64_t j = 0; j < lkv; ++j) sum += (s[j] = std::exp(s[j] - m));
      float* oi = in.out + (bh * lq + i) * d;
      for (int64_t c = 0; c < d; ++c) oi[c] = 0.0f;
      for (int64_t j = 0; j < lkv; ++j)
        for (int64_t c = 0; c < d; ++c) oi[c] += s[j] / sum * v[j * d + c];
    }
  }
}

class Hostile : public attn::Attention {
 public:
  attn::Capabilities capabilities() const override { return {.exact = true}; }
  double flops(const attn::Problem& p) const override { return attn::exact_attention_flops(p); }
  std::size_t workspace_bytes(const attn::Problem& p, int) const override {
    return static_cast<std::size_t>(p.seq_kv) * sizeof(float);
  }
};

class PluginThrows final : public Hostile {
 public:
  std::string name() const override { return "plugin_throws"; }
  std::string description() const override { return "test plugin: its forward throws"; }

 protected:
  void forward(const attn::Problem&, const attn::AttentionInputs&) const override {
    throw std::runtime_error("plugin_throws: deliberate failure in the hostile test plugin");
  }
};

class PluginNan final : public Hostile {
 public:
  std::string name() const override { return "plugin_nan"; }
  std::string description() const override { return "test plugin: writes NaN into its output"; }

 protected:
  void forward(const attn::Problem& p, const attn::AttentionInputs& in) const override {
    softmax_attention(p, in);
    in.out[p.batch * p.heads * p.seq_q * p.head_dim / 2] = std::numeric_limits<float>::quiet_NaN();
  }
};

class PluginOob final : public Hostile {
 public:
  std::string name() const override { return "plugin_oob"; }
  std::string description() const override { return "test plugin: writes one float past the end of O"; }

 protected:
  void forward(const attn::Problem& p, const attn::AttentionInputs& in) const override {
    softmax_attention(p, in);
    const int64_t numel = p.batch * p.heads * p.seq_q * p.head_dim;
    in.out[numel] = 1.0f;
  }
};

}  // namespace

ATTN_REGISTER_VARIANT(PluginThrows)
ATTN_REGISTER_VARIANT(PluginNan)
ATTN_REGISTER_VARIANT(PluginOob)
