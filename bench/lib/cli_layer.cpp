// `attnbench layer`: a multi-head attention layer (torch.nn.MultiheadAttention layout, batch_first) on .npy
// inputs, with any registered variant as the core operator; writes Y.npy (float32, [batch, seq_q, E]).
#include <cmath>
#include <iostream>

#include "bench/lib/command.hpp"
#include "common/frontends/multihead.hpp"
#include "common/io/npy.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/error.hpp"

namespace attn::cli {
namespace {

struct LayerOptions {
  std::string x, context, weights, variant, key_padding, out, isa = "best";
  std::vector<std::string> params;
  int64_t heads = 0;
  bool causal = false, residual = false;
  std::string rope = "none";
  double rope_base = 10000.0;
  CLI::Option* rope_base_opt = nullptr;
};

// Loads a rank-3 [batch, seq, E] input; names the option and file on any mismatch.
FloatArray read_sequence(const std::string& option, const std::string& path, int64_t d_model) {
  FloatArray t = read_npy_float(path);
  if (t.rank() != 3 || t.shape[2] != d_model)
    throw UsageError(option + " '" + path + "': shape " + t.shape_str() + "; expected [batch, seq, " +
                     std::to_string(d_model) + "] (E = " + std::to_string(d_model) + " from the weights)");
  if (t.shape[0] < 1 || t.shape[1] < 1)
    throw UsageError(option + " '" + path + "': shape " + t.shape_str() +
                     " is empty; batch and seq must be >= 1");
  for (std::size_t e = 0; e < t.numel(); ++e)
    if (!std::isfinite(t.data[e]))
      throw UsageError(option + " '" + path + "': non-finite value at flat index " + std::to_string(e) +
                       "; inputs must be finite");
  return t;
}

int run_layer(const LayerOptions& o) {
  simd::select_isa(o.isa, "--isa");
  const Attention& variant =
      o.variant.empty() ? Registry::instance().baseline() : Registry::instance().get(o.variant);
  MultiHeadCall call;
  call.variant = variant.name();
  call.params = parse_cli_params(variant, o.params);
  call.causal = o.causal;
  call.residual = o.residual;
  call.rope.mode = parse_rope_mode(o.rope, "--rope");
  call.rope.base = o.rope_base;
  validate_rope(call.rope, 2, "--rope-base");  // the base; head_dim is checked once the weights are read
  if (o.rope_base_opt->count() && !call.rope.on())
    throw UsageError("--rope-base " + shortest_double_text(o.rope_base) +
                     " needs --rope normal or --rope neox (it is the base of the rotary angles)");
  MultiHeadWeights weights = load_multihead_weights(o.weights);
  const int64_t E = weights.d_model(), Eqk = weights.qk_width();
  if (o.heads < 1 || E % o.heads != 0 || Eqk % o.heads != 0)
    throw UsageError("--heads " + std::to_string(o.heads) + ": must be >= 1 and divide E = " +
                     std::to_string(E) + " (from '" + o.weights + "/w_v.npy')" +
                     (Eqk != E ? " and E_qk = " + std::to_string(Eqk) + " (from '" + o.weights + "/w_q.npy')"
                               : std::string()));
  validate_rope(call.rope, Eqk / o.heads,
                "--rope " + o.rope + " (head_dim = E_qk / heads = " + std::to_string(Eqk) + " / " +
                    std::to_string(o.heads) + ")");
  const MultiHeadLayer layer(std::move(weights), o.heads);
  const FloatArray x = read_sequence("--x", o.x, E);
  FloatArray context;
  if (!o.context.empty()) {
    context = read_sequence("--context", o.context, E);
    if (context.shape[0] != x.shape[0])
      throw UsageError("--context '" + o.context + "': batch " + std::to_string(context.shape[0]) +
                       " differs from --x batch " + std::to_string(x.shape[0]) + "; they must be equal");
  }
  const int64_t seq_kv = o.context.empty() ? x.shape[1] : context.shape[1];
  ByteArray pad;
  if (!o.key_padding.empty()) {
    pad = read_npy_mask(o.key_padding);
    const std::vector<int64_t> want = {x.shape[0], seq_kv};
    if (pad.shape != want)
      throw UsageError("--key-padding '" + o.key_padding + "': shape " + pad.shape_str() + "; expected " +
                       FloatArray::shape_to_string(want) + " [batch, seq_kv] (nonzero/True = padded key)");
    call.key_padding = &pad;
  }
  const FloatArray y = layer.forward(x, o.context.empty() ? nullptr : &context, call);
  write_npy(o.out, y);
  return 0;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND(
    "layer",
    "multi-head attention layer on .npy inputs (torch.nn.MultiheadAttention(E, H, batch_first=True) layout) "
    "with "
    "any variant as the core; writes Y.npy [batch, seq_q, E]",
    [](CLI::App& sub) {
      auto o = std::make_shared<attn::cli::LayerOptions>();
      sub.add_option("--x", o->x, "queries' input .npy, float32/64 [batch, seq_q, E]")->required();
      sub.add_option(
          "--context", o->context,
          "keys'/values' input .npy [batch, seq_kv, E] for cross-attention (default: --x, self-attention)");
      sub.add_option(
             "--weights", o->weights,
             "directory with w_q.npy w_k.npy w_v.npy w_o.npy ([E, E], torch.nn.Linear layout [out, in], "
             "y = x W^T + b; w_q and w_k may be [E_qk, E] for head_dim = E_qk / heads != d_v = E / heads) "
             "and optional b_q.npy b_k.npy b_v.npy b_o.npy ([E]; b_q, b_k [E_qk])")
          ->required();
      sub.add_option("--heads", o->heads,
                     "number of heads; must divide E (d_v = E / heads) and E_qk (head_dim = E_qk / heads)")
          ->required();
      sub.add_option("--variant", o->variant,
                     "core attention variant (see `attnbench list`; default: the exact baseline)");
      sub.add_option("--param", o->params, "variant parameter NAME=VALUE (repeatable)");
      sub.add_flag("--causal", o->causal, "causal mask (query i attends keys j <= i)");
      sub.add_option(
          "--key-padding", o->key_padding,
          "key padding .npy [batch, seq_kv], nonzero/True = padded (torch's key_padding_mask); a query "
          "with no allowed key gets output b_o, not NaN");
      sub.add_flag("--residual", o->residual, "add the input: Y = X + attention(X, context)");
      sub.add_option("--rope", o->rope,
                     "rotary position embedding of each head's projected q and k before the core: none "
                     "(default), normal (pairs 2i, 2i+1) or neox (pairs i, i + head_dim/2); positions 0 .. "
                     "L-1 for queries and for keys; head_dim must be even");
      o->rope_base_opt = sub.add_option("--rope-base", o->rope_base,
                                        "with --rope: base of the angles pos * base^(-2i/head_dim) (default "
                                        "10000)");
      attn::cli::add_isa_option(sub, o->isa);
      sub.add_option("--out", o->out, "output .npy, float32 [batch, seq_q, E] (written only on success)")
          ->required();
      return std::function<int()>([o] { return attn::cli::run_layer(*o); });
    })
