// A multi-head attention layer in torch.nn.MultiheadAttention's layout around any registered variant:
// project to Q, K, V, split heads, run the variant as the core operator, merge heads, project out, residual.
#pragma once
#include <cstdint>
#include <string>

#include "common/interface/params.hpp"
#include "common/interface/problem.hpp"
#include "common/kernels/rope.hpp"
#include "common/support/tensor.hpp"

namespace attn {

// Projection weights in the torch.nn.Linear layout: W is [out, in] and y = x W^T + b.
// torch.nn.MultiheadAttention(E, H) holds in_proj_weight = cat(w_q, w_k, w_v), in_proj_bias =
// cat(b_q, b_k, b_v), out_proj.weight = w_o, out_proj.bias = b_o, all [E, E]. w_q and w_k may instead be
// [E_qk, E] with E_qk != E: queries and keys of head_dim E_qk / heads against values (and outputs) of
// d_v = E / heads, as DeepSeek's MLA heads (192 / 128) or any d_k != d_v design; torch's module has no such
// option. An empty bias (numel 0) means none.
struct MultiHeadWeights {
  FloatArray w_q, w_k;  // [E_qk, E] (E_qk = E for torch's layer)
  FloatArray w_v, w_o;  // [E, E]
  FloatArray b_q, b_k;  // [E_qk] or empty
  FloatArray b_v, b_o;  // [E] or empty

  int64_t d_model() const { return w_v.rank() == 2 ? w_v.shape[0] : 0; }
  int64_t qk_width() const { return w_q.rank() == 2 ? w_q.shape[0] : 0; }  // E_qk = heads * head_dim
  // Checks every shape (w_v and w_o [E, E], w_q and w_k one [E_qk, E], biases [E_qk] / [E]) and that every
  // value is finite; throws UsageError naming the tensor, its shape and what is expected.
  void validate() const;
};

// The file names of a weights directory: w_q.npy, w_k.npy, w_v.npy, w_o.npy are required, b_q.npy, b_k.npy,
// b_v.npy, b_o.npy optional (float32 or float64). Any other w_*.npy or b_*.npy file is rejected as a likely
// typo (it would otherwise be silently ignored); other files are ignored.
MultiHeadWeights load_multihead_weights(const std::string& dir);
void save_multihead_weights(const std::string& dir, const MultiHeadWeights& weights);

// Seeded weights with torch.nn.MultiheadAttention's init distributions: w_q, w_k, w_v uniform in [-a, a] with
// a = sqrt(6 / (E + 3E)) (xavier-uniform over the stacked [3E, E] in_proj_weight), w_o uniform in
// [-1/sqrt(E), 1/sqrt(E)] (nn.Linear's default). with_bias: every bias uniform in [-1/sqrt(E), 1/sqrt(E)]
// (nn.Linear's bias init; torch's MHA zeroes its biases, which would leave the bias path unexercised).
// qk_width > 0: w_q, w_k (and b_q, b_k) get qk_width rows (heads * head_dim with head_dim != d_v), the
// xavier bound over the stacked [2 qk_width + E, E]; 0 keeps torch's square layout.
MultiHeadWeights random_multihead_weights(int64_t d_model, uint64_t seed, bool with_bias,
                                          int64_t qk_width = 0);

// One call of the layer: the core operator and the masks.
struct MultiHeadCall {
  std::string variant{};                   // any registered variant; empty: the registry's baseline
  Json params = Json::object();            // its parameters (validated, defaults filled by make_problem)
  bool causal = false;                     // query i attends keys j <= i (torch's attn_mask = triu(ones, 1))
  const ByteArray* key_padding = nullptr;  // [B, Lkv], nonzero = padded (torch key_padding_mask True)
  bool residual = false;  // return x + attention(x, context) instead of attention(x, context)
  // Rotary position embedding of each head's projected q and k before the core operator
  // (common/kernels/rope.hpp): keys at positions 0 .. Lkv-1 and queries at 0 .. Lq-1 (offset by
  // rope_query_offset of the core problem, i.e. Lkv - Lq under a lower-right causal mask), self- and
  // cross-attention alike. head_dim must be even.
  RopeSpec rope{};
};

class MultiHeadLayer {
 public:
  // Validates the weights; throws UsageError unless heads >= 1 divides d_model and E_qk.
  MultiHeadLayer(MultiHeadWeights weights, int64_t heads);

  int64_t d_model() const { return weights_.d_model(); }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return weights_.qk_width() / heads_; }  // d_k of Q and K
  int64_t value_dim() const { return weights_.d_model() / heads_; }  // d_v of V and the heads' outputs
  const MultiHeadWeights& weights() const { return weights_; }

  // Head h of a projection is its columns [h * width, (h + 1) * width), as in torch (width head_dim for
  // q and k, value_dim for v).
  struct HeadsQkv {
    FloatArray q;  // [B, H, Lq, head_dim]
    FloatArray k;  // [B, H, Lkv, head_dim]
    FloatArray v;  // [B, H, Lkv, value_dim]
  };
  // x: [B, Lq, E]; context: nullptr for self-attention (keys and values from x) or [B, Lkv, E].
  HeadsQkv project(const FloatArray& x, const FloatArray* context) const;

  // heads_out [B, H, Lq, value_dim] -> merge heads to [B, Lq, E] -> merged W_o^T + b_o.
  FloatArray output_projection(const FloatArray& heads_out) const;

  // The attention problem forward() hands to the core operator for these shapes (validated, and
  // NotSupported with every reason if the variant cannot run it, e.g. a head_dim != value_dim the variant
  // cannot take; UsageError for a RoPE spec head_dim cannot take). Scale: the default 1/sqrt(head_dim).
  Problem core_problem(const MultiHeadCall& call, int64_t batch, int64_t seq_q, int64_t seq_kv) const;

  // x [B, Lq, E], context nullptr or [B, Lkv, E] -> [B, Lq, E]: project, RoPE (call.rope), core, output
  // projection, residual. Inputs must be finite (UsageError naming the
  // tensor and index otherwise); a non-finite output (e.g. overflow in an approximate variant) throws
  // std::runtime_error rather than being returned. A query row with no allowed key gets a zero attention
  // row, so its output is b_o (plus x with the residual); torch 1.13 returns NaN there.
  FloatArray forward(const FloatArray& x, const FloatArray* context, const MultiHeadCall& call) const;

 private:
  MultiHeadWeights weights_;
  int64_t heads_;
};

}  // namespace attn
