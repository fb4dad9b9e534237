// The gated and delta-rule linear recurrences ("route 2" around the quadratic cost), six variants on one
// engine (common/kernels/recurrence.hpp): retention (RetNet), simple_gla (Mamba-2's SSD, a scalar gate), gla
// (a gate per key channel), delta_rule (DeltaNet), gated_delta_rule (Gated DeltaNet) and kda (Kimi Delta
// Attention: the gated delta rule with a gate per key channel). Each takes
// form=chunk|recurrent and chunk=C; the delta rules also normalize_keys. They are not softmax attention:
// their exact baseline is their own fp64 recurrence (reference_forward), and they need causal self-attention.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/recurrence.hpp"

namespace attn {
namespace {

struct RecurrentSpec {
  const char* name;
  const char* what;
  RecurrenceKind kind;
};

class Recurrent final : public Attention {
 public:
  explicit Recurrent(RecurrentSpec spec) : spec_(spec) {}
  std::string name() const override { return spec_.name; }
  std::string description() const override {
    return std::string(spec_.what) +
           "; form=chunk (masked C x C products, state across chunks) or recurrent (token by token); "
           "backward: each form its own (chunkwise products, or token by token from checkpoints every C "
           "tokens)";
  }
  Capabilities capabilities() const override {
    // Causal self-attention only (the base refuses non-causal and cross problems for a recurrence);
    // lower-right causal equals causal when seq_q == seq_kv. Decode (seq_q < seq_kv under causal_lower_right)
    // from an initial state: the state after the first seq_kv - seq_q tokens, whose K, V, g, beta are then
    // not read; without an initial state such a problem is refused (the base says why), never run over the
    // whole context behind the caller's back. bf16 / fp16: widened to fp32 up front (a decode widens only
    // the tokens it reads: forward()). V may be of another width d_v than Q and K (value_dim): the state is
    // d_k x d_v, the output d_v wide.
    return {.exact = false,
            .causal = true,
            .causal_lower_right = true,
            .gqa = true,
            .bf16 = true,
            .fp16 = true,
            .backward = true,
            .gate = spec_.kind.gate,
            .beta = spec_.kind.delta,
            .state = true,
            .decode = true,
            .own_definition = true,
            .value_dim = true};
  }
  std::vector<ParamSpec> param_specs() const override {
    std::vector<ParamSpec> specs = {
        {.name = "form",
         .type = ParamType::string,
         .default_value = "chunk",
         .help = "chunk: chunkwise-parallel (intra-chunk C x C products, state carried across chunks); "
                 "recurrent: the definition token by token",
         .choices = {"chunk", "recurrent"}},
        // 32 by default: per token the chunk form does 2 d_k d_v multiply-adds on the state whatever C (Q S_0
        // and Kᵀ U; the delta rule adds K S_0) and about C (d_k + d_v) / 2 inside the chunk (the masked
        // scores and their product; the delta rule's K Kᵀ and solve as much again), so a larger C only adds
        // work unless it makes the products faster, which on a CPU it did not: at d_k = d_v = 64, n = 16384,
        // one thread, C = 64 took 5-15% longer than 32 for every variant, C = 16 was within the noise of 32,
        // and C = 8 up to twice as long (vectors of 16 lanes left part empty). GPU kernels take 64 to fill
        // their tensor-core tiles.
        {.name = "chunk",
         .type = ParamType::integer,
         .default_value = 32,
         .help = "tokens per chunk (chunk form: forward and backward); the recurrent form's backward "
                 "checkpoint interval",
         .min = 1,
         .max = 4096}};
    if (spec_.kind.delta)
      specs.push_back({.name = "normalize_keys",
                       .type = ParamType::integer,
                       .default_value = 1,
                       .help =
                           "1: L2-normalise every key before the recurrence (as the published layers do); "
                           "0: raw keys (the delta rule's transition can then grow without bound)",
                       .min = 0,
                       .max = 1});
    return specs;
  }
  std::vector<Json> test_param_sets() const override {
    // Chunks of 5 and 1 (not dividing the check lengths), 16, the default, and the recurrent form.
    return {Json::object(), {{"chunk", 5}}, {{"chunk", 1}}, {{"chunk", 16}}, {{"form", "recurrent"}}};
  }

  double flops(const Problem& p) const override { return recurrence_flops(p, config(p)); }
  double backward_flops(const Problem& p) const override { return recurrence_backward_flops(p, config(p)); }
  std::size_t workspace_bytes(const Problem& p, int threads) const override {
    return sat_add(recurrence_workspace_bytes(p, config(p), threads), widened_bytes(p));
  }
  std::size_t backward_workspace_bytes(const Problem& p, int threads) const override {
    return recurrence_backward_workspace_bytes(p, config(p), threads);
  }
  // The d_k x d_v fp32 state per (batch, query head): what a decode keeps, whatever the context. Each width
  // is its own factor: head_dim * value_dim overflows int64 at the largest widths a config may name.
  std::size_t decode_state_bytes(const Problem& p) const override {
    return sat_mul(to_size(p.batch * p.heads), to_size(p.head_dim), to_size(p.value_dim()), sizeof(float));
  }
  // Q and O (fp32, d_v wide) once, K and V of the tokens read (a decode's last seq_q only; d_k and d_v wide),
  // g and beta of those tokens, and the initial state read once when there is one (the final state, written
  // only when asked for, is not counted: the problem does not say).
  double bytes_moved(const Problem& p) const override {
    const double w = static_cast<double>(dtype_bytes(p.dtype)), tokens = static_cast<double>(p.seq_q);
    const double q = static_cast<double>(p.q_elements()), o = static_cast<double>(p.out_elements());
    const double kv = static_cast<double>(p.batch * p.num_kv_heads()) *
                      static_cast<double>(p.head_dim + p.value_dim()) * tokens;
    const double heads = static_cast<double>(p.batch * p.heads);
    const double gates = heads * tokens *
                         ((spec_.kind.gate == Gate::vector   ? static_cast<double>(p.head_dim)
                           : spec_.kind.gate == Gate::scalar ? 1.0
                                                             : 0.0) +
                          (spec_.kind.delta ? 1.0 : 0.0));
    return (q + kv) * w + o * 4.0 + gates * 4.0 +
           (p.initial_state ? static_cast<double>(decode_state_bytes(p)) : 0.0);
  }

  void reference_forward(const Problem& p, const AttentionInputs& stored, double* out) const override {
    const WideInputs wide(p, stored);
    recurrence_reference(p, wide.get(), config(p).kind, out);
  }
  void reference_forward_state(const Problem& p, const AttentionInputs& stored, double* out,
                               double* final_state) const override {
    const WideInputs wide(p, stored);
    recurrence_reference(p, wide.get(), config(p).kind, out, final_state);
  }
  double abs_tolerance(const Problem& p, const AttentionInputs& stored) const override {
    const WideInputs wide(p, stored);
    return recurrence_abs_tolerance(p, wide.get(), config(p));
  }
  void reference_backward(const Problem& p, const AttentionInputs& stored, const float* d_out, double* dq,
                          double* dk, double* dv) const override {
    const WideInputs wide(p, stored);
    RecurrenceGrads<double> g;
    g.dq = dq, g.dk = dk, g.dv = dv;
    recurrence_reference_backward(p, wide.get(), config(p).kind, d_out, g);
  }
  // Every fp64 gradient of the definition: dq, dk, dv and, where asked, dg, dbeta, d initial state.
  void reference_gradients(const Problem& p, const AttentionInputs& stored, const float* d_out,
                           const Fp64Gradients& fg) const override {
    const WideInputs wide(p, stored);
    const int64_t nq = p.q_elements(), nk = p.kv_elements(), nv = p.v_elements();
    // recurrence_reference_backward always writes dq, dk, dv: scratch for those not wanted.
    std::vector<double> sq(fg.dq ? 0 : nq), sk(fg.dk ? 0 : nk), sv(fg.dv ? 0 : nv);
    RecurrenceGrads<double> g;
    g.dq = fg.dq ? fg.dq : sq.data(), g.dk = fg.dk ? fg.dk : sk.data(), g.dv = fg.dv ? fg.dv : sv.data();
    g.dg = spec_.kind.gate != Gate::none ? fg.dg : nullptr;
    g.dbeta = spec_.kind.delta ? fg.dbeta : nullptr;
    g.d_initial_state = p.initial_state ? fg.d_initial_state : nullptr;
    recurrence_reference_backward(p, wide.get(), config(p).kind, d_out, g);
  }
  GradientTolerance grad_tolerance(const Problem& p, const AttentionInputs& stored,
                                   const float* d_out) const override {
    const WideInputs wide(p, stored);
    return recurrence_grad_tolerance(p, wide.get(), config(p), d_out);
  }

 protected:
  void forward(const Problem& p, const AttentionInputs& stored) const override {
    if (p.dtype != DType::fp32 && p.seq_q < p.seq_kv) {
      decode16(p, stored);
      return;
    }
    const WideInputs wide(p, stored);
    check_recurrence_inputs(p, wide.get(), spec_.kind);
    recurrence_forward(p, wide.get(), config(p));
  }
  // A 16-bit decode step: the tokens it reads (the last seq_q of every K/V head, and their g and beta) as a
  // self-shaped problem of seq_q tokens from the same state, widened to fp32 (O(seq_q (d_k + d_v)) whatever
  // the context, where WideInputs would widen the whole K/V).
  void decode16(const Problem& p, const AttentionInputs& stored) const {
    Problem step = p;
    step.seq_kv = p.seq_q;
    const int64_t n = p.seq_q, skip = p.seq_kv - p.seq_q, d = p.head_dim, dv = p.value_dim();
    auto tail = [&](const auto* x, int64_t blocks, int64_t width) {  // rows [skip, seq_kv) of every block
      std::vector<std::remove_const_t<std::remove_pointer_t<decltype(x)>>> y(to_size(blocks * n * width));
      for (int64_t b = 0; b < blocks; ++b)
        std::copy_n(x + (b * p.seq_kv + skip) * width, n * width, y.data() + b * n * width);
      return y;
    };
    const int64_t kv = p.batch * p.num_kv_heads(), bh = p.batch * p.heads;
    const std::vector<uint16_t> k = tail(stored.k16, kv, d), v = tail(stored.v16, kv, dv);
    std::vector<float> g, beta;
    if (spec_.kind.gate != Gate::none) g = tail(stored.g, bh, spec_.kind.gate == Gate::vector ? d : 1);
    if (spec_.kind.delta) beta = tail(stored.beta, bh, 1);
    AttentionInputs in = stored;
    in.k16 = k.data(), in.v16 = v.data();
    in.g = g.empty() ? nullptr : g.data();
    in.beta = beta.empty() ? nullptr : beta.data();
    const WideInputs wide(step, in);
    check_recurrence_inputs(step, wide.get(), spec_.kind);
    recurrence_forward(step, wide.get(), config(step));
  }
  void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const override {
    check_recurrence_inputs(p, in, spec_.kind);
    RecurrenceGrads<float> rg;
    rg.dq = g.dq, rg.dk = g.dk, rg.dv = g.dv, rg.dg = g.dg, rg.dbeta = g.dbeta;
    rg.d_initial_state = g.d_initial_state;
    recurrence_backward(p, in, config(p), g.d_out, rg);
  }

  // The backward covers one whole sequence (dK, dV of every key); a decode step has none here.
  std::vector<std::string> extra_backward_not_supported_reasons(const Problem& p) const override {
    if (p.seq_q == p.seq_kv) return {};
    return {name() + ": no backward for a decode problem (seq_q " + std::to_string(p.seq_q) + " < seq_kv " +
            std::to_string(p.seq_kv) + ")"};
  }

 private:
  RecurrenceConfig config(const Problem& p) const {
    RecurrenceConfig cfg;
    cfg.kind = spec_.kind;
    if (spec_.kind.delta) cfg.kind.normalize_keys = p.param_int("normalize_keys") != 0;
    cfg.form = p.param_string("form") == "recurrent" ? RecurrenceForm::recurrent : RecurrenceForm::chunk;
    cfg.chunk = p.param_int("chunk");
    return cfg;
  }
  // bf16 / fp16: fp32 copies of Q, K, V; a decode (decode16) widens only the seq_q tokens it reads, after
  // gathering their 16-bit K, V rows (d_k + d_v per token and K/V head) and their g and beta.
  static std::size_t widened_bytes(const Problem& p) {
    if (p.dtype == DType::fp32) return 0;
    if (p.seq_q == p.seq_kv) return sat_mul(to_size(p.qkv_elements()), sizeof(float));
    const std::size_t kv =
        sat_mul(to_size(p.batch * p.num_kv_heads()), to_size(p.head_dim + p.value_dim()), to_size(p.seq_q));
    const std::size_t tokens = to_size(p.batch * p.heads * p.seq_q);
    return sat_add(sat_mul(sat_add(to_size(p.q_elements()), kv), sizeof(float)),
                   sat_mul(kv, sizeof(uint16_t)), sat_mul(tokens, to_size(p.head_dim + 1), sizeof(float)));
  }
  RecurrentSpec spec_;
};

}  // namespace
}  // namespace attn

namespace {
using attn::Gate;
using attn::RecurrenceKind;
bool register_recurrences() {
  const attn::RecurrentSpec specs[] = {
      {"retention",
       "RetNet retention: S_t = gamma_h S_{t-1} + k_t^T v_t, gamma_h = 1 - 2^(-5-h); o_t = scale q_t S_t",
       RecurrenceKind{.gate = Gate::none, .retention = true}},
      {"simple_gla",
       "scalar-gated linear attention (Mamba-2 SSD): S_t = exp(g_t) S_{t-1} + k_t^T v_t, g [b,h,n]",
       RecurrenceKind{.gate = Gate::scalar}},
      {"gla", "gated linear attention: S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t, g [b,h,n,d_k]",
       RecurrenceKind{.gate = Gate::vector}},
      {"delta_rule", "DeltaNet: S_t = S_{t-1} + beta_t k_t^T (v_t - k_t S_{t-1}), keys L2-normalised",
       RecurrenceKind{.delta = true, .normalize_keys = true}},
      {"gated_delta_rule",
       "Gated DeltaNet: S_t = exp(g_t) S_{t-1} + beta_t k_t^T (v_t - exp(g_t) k_t S_{t-1}), keys "
       "L2-normalised",
       RecurrenceKind{.gate = Gate::scalar, .delta = true, .normalize_keys = true}},
      {"kda",
       "Kimi Delta Attention (Kimi-Linear): S_t = (I - beta_t k_t^T k_t) diag(exp(g_t)) S_{t-1} + beta_t "
       "k_t^T v_t, g [b,h,n,d_k] (a decay per key channel), keys L2-normalised; the chunk form's backward is "
       "the token-by-token one",
       RecurrenceKind{.gate = Gate::vector, .delta = true, .normalize_keys = true}},
  };
  for (const auto& s : specs) attn::Registry::instance().add(std::make_unique<attn::Recurrent>(s));
  return true;
}
[[maybe_unused]] const bool registered = register_recurrences();
}  // namespace
