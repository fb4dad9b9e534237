// The "tokens" input regime: real text through the shared front ends. Whitespace tokens of the text (repeated
// when shorter than needed) -> a seeded embedding of the text's own vocabulary (d_model = heads x head_dim)
// + sinusoidal positions -> seeded multi-head projections (torch.nn.MultiheadAttention's init) -> Q, K, V.
// Batch b reads the text from token b * seq_q on; for cross-attention, keys and values come from the seq_kv
// tokens that follow the queries' tokens. Grouped-query attention (kv_heads < heads): K and V are the
// projections' heads 0, G, 2G, ... (G = heads / kv_heads), the first head of each group, i.e. W_k and W_v
// restricted to kv_heads x head_dim output rows, as a GQA layer's own K/V projection is shaped.
#include <algorithm>
#include <unordered_set>

#include "bench/lib/inputs.hpp"
#include "common/frontends/embedding.hpp"
#include "common/frontends/multihead.hpp"
#include "common/frontends/positional.hpp"
#include "common/support/error.hpp"

namespace attn {

namespace {

// [B, L, E] from `tokens` (cycled), starting at offset(b) for batch b.
FloatArray embed_batch(const TokenEmbedding& table, const std::vector<std::string>& tokens, int64_t batch,
                       int64_t length, int64_t first, int64_t stride) {
  const int64_t E = table.d_model();
  FloatArray out({batch, length, E});
  const FloatArray positions = sinusoidal_encoding(length, E);
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<std::string> window;
    for (int64_t t = 0; t < length; ++t)
      window.push_back(
          tokens[static_cast<std::size_t>((first + b * stride + t) % static_cast<int64_t>(tokens.size()))]);
    const FloatArray rows = table.lookup(table.tokenize(window).ids);
    const FloatArray with_pos =
        combine_positional(rows, positions, PositionalCombine::add, "sinusoidal encoding");
    std::copy(with_pos.data.begin(), with_pos.data.end(), out.data.begin() + b * length * E);
  }
  return out;
}

// [B, H, L, D] -> [B, kv_heads, L, D]: head g * group_size() of each group g (a no-op without GQA).
FloatArray first_head_of_each_group(FloatArray x, const Problem& p) {
  if (!p.is_gqa()) return x;
  const int64_t H = p.heads, KV = p.num_kv_heads(), G = p.group_size();
  const int64_t L = x.shape.at(2), D = x.shape.at(3);
  FloatArray out({p.batch, KV, L, D});
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t g = 0; g < KV; ++g) {
      const auto src = x.data.begin() + ((b * H + g * G) * L) * D;
      std::copy(src, src + L * D, out.data.begin() + ((b * KV + g) * L) * D);
    }
  return out;
}

}  // namespace

PointInputs make_token_inputs(const SweepPoint& pt) {
  const Problem& p = pt.problem;
  const std::vector<std::string> tokens = read_tokens(pt.regime.text);
  const int64_t E = p.heads * p.head_dim;
  const std::unordered_set<std::string> distinct(tokens.begin(), tokens.end());
  TokenEmbedding table =
      TokenEmbedding::seeded(static_cast<int64_t>(distinct.size()), E, pt.input_seed * 5 + 1);
  table.assign_words(tokens);
  const MultiHeadLayer layer(random_multihead_weights(E, pt.input_seed * 5 + 2, false), p.heads);
  const FloatArray x = embed_batch(table, tokens, p.batch, p.seq_q, 0, p.seq_q);
  MultiHeadLayer::HeadsQkv qkv;
  if (pt.problem.seq_q == pt.problem.seq_kv) {
    qkv = layer.project(x, nullptr);
  } else {
    const FloatArray context = embed_batch(table, tokens, p.batch, p.seq_kv, p.seq_q, p.seq_q);
    qkv = layer.project(x, &context);
  }
  PointInputs in;
  in.q = std::move(qkv.q);
  in.k = first_head_of_each_group(std::move(qkv.k), p);
  in.v = first_head_of_each_group(std::move(qkv.v), p);
  return in;
}

}  // namespace attn
