// The problem descriptor: one attention call, fully specified. Its canonical repro string, e.g.
//   sliding_window{window=128,dilation=1,global_tokens=0}:B=1,H=8,Lq=1024,Lkv=1024,D=64,causal
// is the result-row id, the Google Benchmark name and the CLI filter; parse_problem() reads it back.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/interface/params.hpp"

namespace attn {

// Which masks apply. They combine: a key may be attended iff every active mask allows it.
//   causal              query i may attend key j iff j <= i (upper-left aligned, as torch's tril mask).
//   causal_lower_right  query i may attend key j iff j <= i + (seq_kv - seq_q): the last query sees every
//                       key (PyTorch's causal_lower_right, FlashAttention >= 2.1; the KV-cache decode rule).
//                       Equal to causal when seq_q == seq_kv; with seq_q > seq_kv the first seq_q - seq_kv
//                       queries see no key.
//   boolean             an explicit [seq_q, seq_kv] mask, nonzero = may attend, shared by batch and heads.
//   key_padding         a [batch, seq_kv] mask, nonzero = padded key (never attended).
// Both causal kinds are "j <= i + c" rules, so together they are the one with the smaller c
// (causal_offset in mask.hpp); every variant applies that single offset.
// A query row with no allowed key produces a zero output row (never NaN).
struct MaskSpec {
  bool causal = false;
  bool boolean = false;
  bool key_padding = false;
  bool causal_lower_right = false;

  bool any() const { return causal || boolean || key_padding || causal_lower_right; }
  bool any_causal() const { return causal || causal_lower_right; }
  std::string str() const;  // "none", "causal", "causal+bool+pad", "causal_lower_right+pad", ...
  bool operator==(const MaskSpec&) const = default;
};

// Parses "none", "causal", "causal_lower_right", "bool", "pad" joined by '+'; throws UsageError naming
// `where`. With
// `pad_fraction` (the sweep's generated masks), "pad=F" (F in [0, 1]) is also allowed and stores F there
// ("pad" leaves it as it was), and "bool" is not (the sweep generates no boolean masks).
MaskSpec parse_mask(const std::string& text, const std::string& where, double* pad_fraction = nullptr);

// Storage precision of Q, K and V (common/interface/half.hpp): fp32, or bf16 / fp16 rounded from fp32 with
// round-to-nearest-even. Computation and accumulation are fp32 and the output is fp32 in every case.
enum class DType : uint8_t { fp32, bf16, fp16 };
const char* dtype_name(DType t);  // "fp32", "bf16", "fp16"
// Reads a dtype name; UsageError naming `where`, the value and the allowed names.
DType parse_dtype(const std::string& text, const std::string& where);
inline std::size_t dtype_bytes(DType t) {
  return t == DType::fp32 ? 4 : 2;
}

// A bias added to the logits (common/kernels/alibi.hpp). alibi: the logit of (i, j) gets -slope_h * (i' - j)
// under a causal mask and -slope_h * |i' - j| otherwise, i' = i + (seq_kv - seq_q) under causal_lower_right
// (the query's position in the key sequence) and i' = i otherwise; slopes per query head (the ALiBi paper's
// default, or the caller's AttentionInputs::alibi_slopes).
enum class Bias : uint8_t { none, alibi };
const char* bias_name(Bias b);  // "none", "alibi"
Bias parse_bias(const std::string& text, const std::string& where);

// The most elements one tensor of a problem (Q, K, V, the output) may hold: every byte count derived from the
// sizes (fp64 copies, sums over several tensors) then fits in 64 bits. Problem::validate enforces it.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 58;

struct Problem {
  std::string variant;
  Json params = Json::object();  // resolved: every parameter of the variant, defaults filled in
  // The variant's parameter names in its spec order, set where params are resolved against the specs
  // (make_problem, parse_problem): repro() lists parameters in this order (key order when it does not cover
  // `params`), so ids do not depend on JSON key order and this file needs no registry.
  std::vector<std::string> param_order;
  int64_t batch = 1;
  int64_t heads = 1;  // query heads
  // K/V heads (grouped-query attention): 0 means `heads` (multi-head attention); otherwise heads % kv_heads
  // must be 0, and query head h reads K/V head h / (heads / kv_heads), as PyTorch's enable_gqa and llama.cpp.
  // Use num_kv_heads() and kv_head_of(), never this field directly.
  int64_t kv_heads = 0;
  int64_t seq_q = 1;
  int64_t seq_kv = 1;
  int64_t head_dim = 64;  // d_k: the width of Q and K
  // d_v: the width of V and the output (and the second side of a recurrence's d_k x d_v state); 0 means
  // head_dim. Use value_dim(), never this field directly. Only variants with Capabilities::value_dim take
  // value_dim() != head_dim (e.g. DeepSeek's MLA heads: d_k 192, d_v 128).
  int64_t v_head_dim = 0;
  MaskSpec mask;
  std::optional<double> scale;  // default 1/sqrt(head_dim), i.e. 1/sqrt(d_k)
  double dropout = 0.0;         // probability of dropping an attention weight, in [0, 1)
  uint64_t seed = 0;            // dropout keep decisions (and nothing else) depend on it
  DType dtype = DType::fp32;    // storage of Q, K, V (AttentionInputs::q16 ... when not fp32)
  Bias bias = Bias::none;       // logit bias (ALiBi)
  // Logit soft-capping C (Gemma 2): every logit s (after the scale) becomes C tanh(s / C); unset: none.
  std::optional<double> softcap;
  bool sinks = false;          // learned sink logits, one per query head (AttentionInputs::sink_logits)
  bool initial_state = false;  // a recurrence starts from AttentionInputs::initial_state (else from 0)

  double effective_scale() const;
  int64_t num_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t group_size() const { return heads / num_kv_heads(); }  // query heads per K/V head
  int64_t kv_head_of(int64_t h) const { return h / group_size(); }
  // Index of the [seq_kv, head_dim] K/V block query head h of batch entry b reads (K and V are
  // [batch, kv_heads, seq_kv, head_dim]).
  int64_t kv_block(int64_t b, int64_t h) const { return b * num_kv_heads() + kv_head_of(h); }
  bool is_gqa() const { return num_kv_heads() != heads; }
  int64_t value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }  // d_v
  bool distinct_value_dim() const { return value_dim() != head_dim; }
  int64_t q_elements() const { return batch * heads * seq_q * head_dim; }
  int64_t kv_elements() const { return batch * num_kv_heads() * seq_kv * head_dim; }  // of K
  int64_t v_elements() const { return batch * num_kv_heads() * seq_kv * value_dim(); }
  int64_t out_elements() const { return batch * heads * seq_q * value_dim(); }  // of the output (and dO)
  // Of Q, K and V together (each at most 2^58 elements: the sum fits).
  int64_t qkv_elements() const { return q_elements() + kv_elements() + v_elements(); }
  // Of a recurrence's state [batch, heads, d_k, d_v] (not bounded by validate: saturate where it may be
  // huge).
  int64_t state_elements() const { return batch * heads * head_dim * value_dim(); }
  bool is_self_shaped() const { return seq_q == seq_kv; }

  // Typed access to resolved parameters (throws std::logic_error if absent: a variant bug).
  int64_t param_int(const std::string& name) const;
  double param_number(const std::string& name) const;
  std::string param_string(const std::string& name) const;
  const Json& param(const std::string& name) const;

  std::string repro() const;
  // Checks sizes (each in [1, 2^40], kv_heads dividing heads, every tensor at most kMaxTensorElements
  // elements, products computed without overflow), scale and dropout; throws UsageError naming the field and
  // the value.
  void validate() const;
};

// Reads the shape part of a repro string ("B=1,H=8,Hkv=2,Lq=16,Lkv=16,D=8,Dv=4,causal,alibi,dtype=bf16,
// scale=0.5"; softcap=C, sinks and state0 when set;
// Hkv only when it differs from H, Dv only when it differs from D, alibi only with that bias, dtype only when
// not fp32) into `p` (sizes, mask, scale, dropout, seed), then validates `p`; UsageError naming `where`.
// parse_problem (attention.hpp) reads a whole repro string, parameters included.
void parse_problem_shape(const std::string& shape, const std::string& where, Problem& p);

}  // namespace attn
