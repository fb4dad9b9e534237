// Test plugin (tests/test_plugins.cpp): one correct exact variant, plugin_good_exact: softmax attention one
// query row at a time in plain C++ (scores, max, exp, sum, weighted V), forward only, with the causal mask
// and grouped-query heads. Built with attn_add_plugin (tests/plugins/plugins.cmake).
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/kernels/mask.hpp"  // causal_key_end, exact_attention_flops

namespace {

class PluginGoodExact final : public attn::Attention {
 public:
  std::string name() const override { return "plugin_good_exact"; }
  std::string description() const override {
    return "test plugin: exact softmax attention row by row (tests/plugins/plugin_good.cpp)";
  }
  attn::Capabilities capabilities() const override { return {.exact = true, .causal = true, .gqa = true}; }
  double flops(const attn::Problem& p) const override { return attn::exact_attention_flops(p); }
  std::size_t workspace_bytes(const attn::Problem& p, int) const override {
    return static_cast<std::size_t>(p.seq_kv) * sizeof(float);
  }

 protected:
  void forward(const attn::Problem& p, const attn::AttentionInputs& in) const override {
    const int64_t d = p.head_dim, lq = p.seq_q, lkv = p.seq_kv;
    const float scale = static_cast<float>(p.effective_scale());
    std::vector<float> scores(static_cast<std::size_t>(lkv));
    float* s = scores.data();
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
      const int64_t b = bh / p.heads, h = bh % p.heads;
      const float* q = in.q + bh * lq * d;
      const float* k = in.k + p.kv_block(b, h) * lkv * d;
      const float* v = in.v + p.kv_block(b, h) * lkv * d;
      float* o = in.out + bh * lq * d;
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t end = attn::causal_key_end(p, i);
        float* oi = o + i * d;
        for (int64_t c = 0; c < d; ++c) oi[c] = 0.0f;
        if (end <= 0) continue;
        float m = -INFINITY;
        for (int64_t j = 0; j < end; ++j) {
          float dot = 0.0f;
          for (int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
          s[j] = dot * scale;
          m = std::max(m, dot * scale);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < end; ++j) sum += (s[j] = std::exp(s[j] - m));
        for (int64_t j = 0; j < end; ++j) {
          const float w = s[j] / sum;
          for (int64_t c = 0; c < d; ++c) oi[c] += w * v[j * d + c];
        }
      }
    }
  }
};

}  // namespace

ATTN_REGISTER_VARIANT(PluginGoodExact)
