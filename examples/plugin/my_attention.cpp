// my_attention: exact softmax attention, one query row at a time (scores, max, exp, sum, weighted V), with
// the causal masks and grouped-query heads. Written as any variant inside attnbench is (variants/README.md),
// built outside it as a plugin: it uses attnbench's shared row kernels (row_max, exp_sub_sum, which dispatch
// to the best SIMD target of the CPU) and TBB, and registers with one ATTN_REGISTER_VARIANT line.
#include <tbb/parallel_for.h>

#include <vector>

#include "common/interface/attention.hpp"
#include "common/kernels/mask.hpp"   // causal_key_end, exact_attention_flops
#include "common/kernels/vmath.hpp"  // row_max, exp_sub_sum

namespace {

class MyAttention final : public attn::Attention {
 public:
  std::string name() const override { return "my_attention"; }
  std::string description() const override {
    return "example plugin: exact softmax attention row by row (examples/plugin)";
  }
  attn::Capabilities capabilities() const override {
    return {.exact = true, .causal = true, .causal_lower_right = true, .gqa = true, .cross = true};
  }
  double flops(const attn::Problem& p) const override { return attn::exact_attention_flops(p); }
  // One score row per query row, per thread.
  std::size_t workspace_bytes(const attn::Problem& p, int threads) const override {
    return static_cast<std::size_t>(threads) * static_cast<std::size_t>(p.seq_kv) * sizeof(float);
  }

 protected:
  void forward(const attn::Problem& p, const attn::AttentionInputs& in) const override {
    const int64_t d = p.head_dim, lq = p.seq_q, lkv = p.seq_kv;
    const float scale = static_cast<float>(p.effective_scale());
    // One task per (batch, head): work units fixed by the problem, so every thread count gives the same bits.
    tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) {
      const int64_t b = bh / p.heads, h = bh % p.heads;
      const float* q = in.q + bh * lq * d;
      const float* k = in.k + p.kv_block(b, h) * lkv * d;
      const float* v = in.v + p.kv_block(b, h) * lkv * d;
      float* o = in.out + bh * lq * d;
      std::vector<float> s(static_cast<std::size_t>(lkv));
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t end = attn::causal_key_end(p, i);  // keys [0, end) are allowed
        float* oi = o + i * d;
        for (int64_t c = 0; c < d; ++c) oi[c] = 0.0f;
        if (end <= 0) continue;  // no allowed key: a zero row, never NaN
        for (int64_t j = 0; j < end; ++j) {
          float dot = 0.0f;
          for (int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
          s[static_cast<std::size_t>(j)] = dot * scale;
        }
        const float m = attn::row_max(s.data(), end);
        const float sum = attn::exp_sub_sum(s.data(), end, m);
        for (int64_t j = 0; j < end; ++j) {
          const float w = s[static_cast<std::size_t>(j)] / sum;
          for (int64_t c = 0; c < d; ++c) oi[c] += w * v[j * d + c];
        }
      }
    });
  }
};

}  // namespace

ATTN_REGISTER_VARIANT(MyAttention)
