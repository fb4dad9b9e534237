// The gated and delta-rule linear recurrences of issue 32 ("route 2"), five variants on one engine
// (common/recurrence.hpp): retention (RetNet), simple_gla (Mamba-2's SSD, a scalar gate), gla (a gate per key
// channel), delta_rule (DeltaNet) and gated_delta_rule (Gated DeltaNet). Each takes form=chunk|recurrent and
// chunk=C; the delta rules also normalize_keys. They are not softmax attention: their exact baseline is their
// own fp64 recurrence (reference_forward), and they need causal self-attention.
#include <cmath>
#include <string>
#include <vector>

#include "common/attention.hpp"
#include "common/half.hpp"
#include "common/recurrence.hpp"
#include "common/util.hpp"

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
           "backward: both forms through the recurrent reverse pass (checkpoints every C tokens)";
  }
  Capabilities capabilities() const override {
    // Causal self-attention only (the base refuses non-causal and cross problems for a recurrence);
    // lower-right causal equals causal when seq_q == seq_kv. bf16 / fp16: widened to fp32 up front.
    return {.exact = false,
            .causal = true,
            .causal_lower_right = true,
            .gqa = true,
            .bf16 = true,
            .fp16 = true,
            .backward = true,
            .gate = spec_.kind.gate,
            .beta = spec_.kind.delta,
            .state = true};
  }
  std::vector<ParamSpec> param_specs() const override {
    std::vector<ParamSpec> specs = {
        {.name = "form",
         .type = ParamType::string,
         .default_value = "chunk",
         .help = "chunk: chunkwise-parallel (intra-chunk C x C products, state carried across chunks); "
                 "recurrent: the definition token by token",
         .choices = {"chunk", "recurrent"}},
        {.name = "chunk",
         .type = ParamType::integer,
         .default_value = 64,
         .help = "tokens per chunk (chunk form), and the backward's checkpoint interval",
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
    const int64_t nq = p.q_elements(), nkv = p.kv_elements();
    // recurrence_reference_backward always writes dq, dk, dv: scratch for those not wanted.
    std::vector<double> sq(fg.dq ? 0 : nq), sk(fg.dk ? 0 : nkv), sv(fg.dv ? 0 : nkv);
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
    const WideInputs wide(p, stored);
    check_recurrence_inputs(p, wide.get(), spec_.kind);
    recurrence_forward(p, wide.get(), config(p));
  }
  void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const override {
    check_recurrence_inputs(p, in, spec_.kind);
    RecurrenceGrads<float> rg;
    rg.dq = g.dq, rg.dk = g.dk, rg.dv = g.dv, rg.dg = g.dg, rg.dbeta = g.dbeta;
    rg.d_initial_state = g.d_initial_state;
    recurrence_backward(p, in, config(p), g.d_out, rg);
  }

  // retention reads neither g nor beta, so the base class does not know it is a recurrence: refuse what it
  // refuses for the others.
  std::vector<std::string> extra_not_supported_reasons(const Problem& p) const override {
    std::vector<std::string> r;
    if (spec_.kind.gate != Gate::none || spec_.kind.delta) return r;
    if (!p.mask.any_causal())
      r.push_back(name() + " is a causal recurrence: it needs the causal mask (got mask " + p.mask.str() +
                  ")");
    if (p.seq_q != p.seq_kv)
      r.push_back(name() + " is a recurrence over one sequence: it needs seq_q == seq_kv (got " +
                  std::to_string(p.seq_q) + " and " + std::to_string(p.seq_kv) + ")");
    return r;
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
  static std::size_t widened_bytes(const Problem& p) {
    return p.dtype == DType::fp32
               ? 0
               : sat_mul(sat_add(to_size(p.q_elements()), sat_mul(2, to_size(p.kv_elements()))),
                         sizeof(float));
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
  };
  for (const auto& s : specs) attn::Registry::instance().add(std::make_unique<attn::Recurrent>(s));
  return true;
}
[[maybe_unused]] const bool registered = register_recurrences();
}  // namespace
