// Multi-head latent attention (MLA, DeepSeek-V2/V3) around any registered variant as the core: DeepSeek-V3's
// inference/model.py class MLA in both of its forms, with a KV cache, for prefill and decode.
//   naive     per head K = [k_nope (from wkv_b), k_pe (shared, broadcast)], V from wkv_b: multi-head
//   attention
//             with head_dim nope + rope and v_head_dim v; the cache holds every head's K and V.
//   absorbed  q_nope of each head times W_uk (wkv_b's first nope rows of that head) -> kv_lora_rank, query
//             [that, q_pe]; multi-query attention (one K/V head) over K = [latent c_kv after kv_norm, k_pe]
//             with V the latent (the first kv_lora_rank columns of K, read in place), then each head's output
//             times W_uv^T (wkv_b's last v rows of that head); the cache holds kv_lora_rank + rope per token.
// Both use softmax_scale = (nope + rope)^-0.5. Not modelled: YaRN's mscale factor on the scale and its
// frequency interpolation (DeepSeek applies them when max_seq_len > original_seq_len), fp8 weights, tensor
// parallelism. RoPE is DeepSeek's apply_rotary_emb (view_as_complex over adjacent pairs: RopeMode::normal).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/interface/params.hpp"
#include "common/interface/problem.hpp"
#include "common/reference/mla_reference.hpp"
#include "common/support/tensor.hpp"

namespace attn {

// Named shapes: "deepseek_v3" (7168, 128 heads, q_lora 1536, kv_lora 512, nope 128, rope 64, v 128),
// "deepseek_v2_lite" (2048, 16 heads, q_lora 0, kv_lora 512, 128, 64, 128) and "tiny" (tests: 32, 4 heads,
// q_lora 12, kv_lora 16, nope 8, rope 4, v 6). UsageError naming `where` and the known names otherwise.
MlaShape mla_preset(const std::string& name, const std::string& where = "preset");
std::vector<std::string> mla_preset_names();
// A shape from JSON {"d_model", "heads", "q_lora_rank", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim",
// "v_head_dim", "rope_base" (optional, 10000)}, validated; UsageError naming `where`, the key and the value.
MlaShape mla_shape_from_json(const Json& j, const std::string& where);
Json mla_shape_json(const MlaShape& s);
// The presets of a config file {"presets": {NAME: shape, ...}, ...} (configs/mla.json), by name.
std::vector<std::pair<std::string, MlaShape>> load_mla_presets(const std::string& path);

// Seeded weights: every Linear uniform in [-1/sqrt(in), 1/sqrt(in)] (nn.Linear's default), RMSNorm weights
// uniform in [0.5, 1.5] (not DeepSeek's ones, so a dropped norm weight shows in the tests).
MlaWeights random_mla_weights(const MlaShape& shape, uint64_t seed);
// A folder of .npy files named as the members (wq.npy or wq_a.npy + q_norm.npy + wq_b.npy; wkv_a.npy,
// kv_norm.npy, wkv_b.npy, wo.npy), float32 or float64, checked against `shape`.
MlaWeights load_mla_weights(const std::string& dir, const MlaShape& shape);
void save_mla_weights(const std::string& dir, const MlaWeights& weights, const MlaShape& shape);

enum class MlaForm : uint8_t { naive, absorbed };
const char* mla_form_name(MlaForm f);  // "naive", "absorbed"
MlaForm parse_mla_form(const std::string& text, const std::string& where);

// Cache elements (fp32) one token adds: absorbed kv_lora_rank + rope (576 at DeepSeek's widths); naive
// heads * (nope + rope + v) (40,960 at V3's 128 heads).
int64_t mla_cache_elements_per_token(const MlaShape& shape, MlaForm form);
// The core variant when MlaCall::variant is empty: the exact variant that reads the cache in place
// (strided_kv) and is not the baseline (the baseline materialises the score matrix); the baseline when no
// other qualifies.
std::string default_core_variant();

// The KV cache of one form, reserved for `capacity` tokens per batch entry and read in place by the core
// (AttentionInputs::kv_capacity): absorbed kv [B, capacity, kv_lora + rope], rows [c_kv | k_pe(rope'd)];
// naive k [B, H, capacity, nope + rope] and v [B, H, capacity, v]. length() tokens are filled.
class MlaCache {
 public:
  MlaCache(const MlaShape& shape, MlaForm form, int64_t batch, int64_t capacity);
  MlaForm form() const { return form_; }
  const MlaShape& shape() const { return shape_; }
  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }
  int64_t elements_per_token() const { return mla_cache_elements_per_token(shape_, form_); }
  std::size_t bytes_per_token() const {
    return static_cast<std::size_t>(elements_per_token()) * sizeof(float);
  }
  // The filled rows' bytes over the batch: what a decode step reads.
  std::size_t bytes() const;
  // Forgets the tokens past `length` (<= length()): the next forward() overwrites them. A benchmark repeats
  // one call from the same context this way.
  void truncate(int64_t length);

  FloatArray kv;    // absorbed
  FloatArray k, v;  // naive

 private:
  friend class MlaLayer;
  MlaShape shape_;
  MlaForm form_;
  int64_t batch_, capacity_, length_ = 0;
};

// One call's core operator.
struct MlaCall {
  // Any registered variant that can take the problem; empty: the exact variant that reads a reserved cache
  // in place (strided_kv) and is not the baseline (today tiled), else the baseline.
  std::string variant;
  Json params = Json::object();  // its parameters (validated, defaults filled)
};

class MlaLayer {
 public:
  // Validates the shape and the weights (UsageError).
  MlaLayer(MlaShape shape, MlaWeights weights);
  const MlaShape& shape() const { return shape_; }
  const MlaWeights& weights() const { return weights_; }

  // The core attention problem for `form` with seq_q new tokens after a cache of `context` tokens:
  // causal_lower_right (query i sees keys j <= context + i), scale (nope + rope)^-0.5; naive: heads H,
  // head_dim nope + rope, d_v v; absorbed: kv_heads 1, head_dim kv_lora + rope, d_v kv_lora. NotSupported
  // with every reason if the variant cannot run it.
  Problem core_problem(MlaForm form, const MlaCall& call, int64_t batch, int64_t seq_q,
                       int64_t context) const;

  // x [B, s, E], the s tokens after the cache's length() T: appends their keys and values to the cache
  // (positions T .. T + s - 1) and returns y [B, s, E], the layer's output for them. Prefill is s = the
  // prompt (T = 0, or more for a prompt in pieces), decode s = 1 or a few. UsageError for a wrong shape, a
  // cache of another shape, form or batch, or no room for s more tokens.
  // core_ms, when given, receives the wall time of the core variant's run() alone (the rest of the call is
  // projections, absorption products, cache writes and wo).
  FloatArray forward(const FloatArray& x, MlaCache& cache, const MlaCall& call,
                     double* core_ms = nullptr) const;
  // The cache rows of x's tokens (positions length() ..) without attention or output: what forward() writes
  // into the cache, computed by the same code, at the cost of wkv_a (and wkv_b in the naive form) only. A
  // benchmark fills a long context this way. Same UsageErrors as forward().
  void append(const FloatArray& x, MlaCache& cache) const;

  // FLOPs of forward() for s new tokens after T cached ones: the projections, the absorption products
  // (absorbed form), the core (the variant's flops()) and wo; 2 per multiply-add, norms and RoPE not counted.
  double flops(MlaForm form, const MlaCall& call, int64_t batch, int64_t s, int64_t context) const;
  // Bytes forward() must read: the weights it uses, the cache rows the core reads (T + s tokens per batch
  // entry) and x, each once.
  double bytes_read(MlaForm form, int64_t batch, int64_t s, int64_t context) const;

 private:
  void check_call(const FloatArray& x, const MlaCache& cache) const;
  MlaShape shape_;
  MlaWeights weights_;
};

}  // namespace attn
