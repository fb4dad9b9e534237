// The checks of one attention call on caller-given tensors, shared by `attnbench eval` (tensors from .npy
// files) and the Python module's forward(), backward(), reference() and reference_backward() (numpy arrays):
// the same rules and the same messages. Each message names the input as the caller calls it: `what` is "--k
// 'k.npy'" for the CLI (option and file) and "k" for the module (the argument).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"

namespace attn {

// Refuses a storage dtype or bias the variant cannot run (UsageError with the variant's own reasons and the
// variants that can). `dtype_text` and `alibi_text` name the options ("--dtype bf16", "--alibi").
void check_storage(const Attention& variant, const Json& params, DType dtype, Bias bias,
                   const std::string& dtype_text, const std::string& alibi_text);

// A rank-4 tensor with every extent >= 1, or a UsageError naming `what`, the shape and `layout`.
void require_rank4(const std::string& what, const std::vector<int64_t>& shape, const std::string& layout);

// K must be [Q's batch, kv_heads, seq_kv, Q's head_dim] with kv_heads dividing Q's heads, and V must have K's
// first three extents (its last, d_v, is free: the variant refuses d_v != head_dim unless it takes it);
// otherwise a UsageError naming both inputs, both shapes and what is allowed.
void check_kv_shapes(const std::string& q_what, const std::vector<int64_t>& q, const std::string& k_what,
                     const std::vector<int64_t>& k, const std::string& v_what, const std::vector<int64_t>& v);

// Sets the problem's sizes from the checked shapes of Q [B, H, Lq, D], K [B, Hkv, Lkv, D] and V [.., Dv].
void set_shape(Problem& p, const std::vector<int64_t>& q, const std::vector<int64_t>& k,
               const std::vector<int64_t>& v);

// UsageError unless `got` is `want`: "WHAT: shape [..] does not match [..] MEANING".
void require_shape(const std::string& what, const std::vector<int64_t>& got, const std::vector<int64_t>& want,
                   const std::string& meaning);

// The ALiBi slopes as float32, one per query head: `values` must be [p.heads] finite float32 values
// (UsageError naming `what`; `q_option` names where heads came from, "--q").
// One finite float32 value per query head ([heads]) from a float64 array read from a file (ALiBi slopes,
// sink logits), or a UsageError naming `what`, the shape or the value.
std::vector<float> checked_head_values(const std::string& what, const std::string& q_option,
                                       const std::string& noun, const std::vector<int64_t>& shape,
                                       const double* values, const Problem& p);
std::vector<float> checked_alibi_slopes(const std::string& what, const std::string& q_option,
                                        const std::vector<int64_t>& shape, const double* values,
                                        const Problem& p);

// ---- Inputs beyond Q, K, V: a recurrence's gate g, beta and states ----

// A variant that is not softmax attention (Capabilities::own_definition: the recurrences): its exact baseline
// is its own fp64 definition (Attention::reference_forward), not exact softmax attention.
bool is_recurrence(const Capabilities& c);

// What one call gives beyond Q, K, V, each as its caller names it ("--g 'g.npy'" for the CLI, "g" for the
// module; empty: not given), and how to give the ones a variant needs (g_how "--g G.npy", "g="). final_state
// names the request for the final state ("--final-state 'S.npy'", "return_final_state=True").
struct ExtraInputNames {
  std::string g, beta, initial_state, final_state;
  std::string g_how, beta_how;
};

// Before any file or array is read: a UsageError naming the variant and the input when the variant is given
// one it does not read (g without a gate, beta without the delta rule, a state without Capabilities::state;
// with the variants that do read it), or lacks one it needs (gla without g: naming both, the shape and the
// values allowed).
void check_extra_inputs_given(const Attention& variant, const ExtraInputNames& given);

// The gate g as the variant reads it (float32, one value per element): `shape` must be [batch, heads, seq_kv]
// for a scalar gate and [batch, heads, seq_kv, head_dim] for a per-channel one (one per key token: a decode
// problem's cover its context, of which it reads the last seq_q; sizes from `q_what` and K), and
// every value finite and <= 0 as a float32 (a decay exp(g) in (0, 1]). Otherwise a UsageError naming `what`,
// the shape and what is allowed, or the first offending element's index and value.
std::vector<float> checked_gate(const std::string& what, const std::string& q_what,
                                const std::vector<int64_t>& shape, const double* values, const Problem& p,
                                Gate gate);
// beta: [batch, heads, seq_q], every value in (0, 1] as a float32 (checked as checked_gate checks g).
std::vector<float> checked_beta(const std::string& what, const std::string& q_what,
                                const std::vector<int64_t>& shape, const double* values, const Problem& p);
// An initial state: [batch, heads, head_dim, head_dim] (d_k x d_v per query head), every value a finite
// float32.
std::vector<float> checked_initial_state(const std::string& what, const std::string& q_what,
                                         const std::vector<int64_t>& shape, const double* values,
                                         const Problem& p);
// The shapes of g (by the variant's gate), beta and a state for `p`.
std::vector<int64_t> gate_shape(const Problem& p, Gate gate);
std::vector<int64_t> beta_shape(const Problem& p);
std::vector<int64_t> state_shape(const Problem& p);

// "final_state_accuracy" of `eval --compare`: a run's fp32 final state against the fp64 final state of the
// variant's own definition (reference_state), [batch, heads, head_dim, head_dim], as the output's metrics
// (max_abs_err, rel_l2_err, mean_cosine over the state's rows, nan_count, inf_count) with "reference".
Json final_state_comparison(const Problem& p, const float* got, const double* reference_state);

// Problem::validate, then the variant's unsupported reasons (NotSupported: "ID: reasons"), then memory: the
// output, the workspace at `threads` threads and (with_reference) an fp64 reference must fit in physical
// memory (NotSupported naming the bytes). backward: the backward's reasons and memory too (a training step:
// O, the saved state, dO, dQ, dK, dV, the larger workspace, and with_reference the fp64 gradients).
void check_runnable(const Attention& variant, const Problem& p, int threads, bool with_reference,
                    bool backward = false);

// Non-finite values in the inputs as the variant read them (bf16 / fp16 storage counted as stored: rounding
// to fp16 turns |x| >= 65520 into Inf) and in the output `in.out` written by a run of `p`.
struct NonfiniteCounts {
  int64_t q = 0, k = 0, v = 0, out = 0;
  int64_t inputs() const { return q + k + v; }
};
NonfiniteCounts count_nonfinite_values(const Problem& p, const AttentionInputs& in);
// "the output holds N NaN/Inf values (the inputs held M)" when the output holds any, else "".
std::string nonfinite_output_note(const NonfiniteCounts& counts);

// ---- The backward (`eval --grad-output`, the module's backward()) ----

// A backward input (dO, an earlier training forward's O or its saved state): `shape` must be `want`
// (require_shape's message, with `meaning`) and every value finite, else a UsageError naming `what`, the
// first non-finite element's index and the shape. allow_infinite: only NaN is refused (a saved state holds
// +inf for a query row with no allowed key: naive's and tiled's log-sum-exp).
void check_backward_input(const std::string& what, const std::vector<int64_t>& shape, const float* values,
                          const std::vector<int64_t>& want, const std::string& meaning,
                          bool allow_infinite = false);
// The `meaning` of dO (`q_what` names where Q's shape came from: "--q", "q"), of the forward's O and of
// the variant's saved state.
std::string d_out_meaning(const std::string& q_what);
std::string forward_output_meaning();
std::string saved_state_meaning(const Attention& variant);

// A saved state given without the O of its forward (`state_what` names the state, `out_text` the O it
// needs, `caller` who runs the training forward without them: "eval", "backward()"): UsageError.
void check_state_needs_out(const std::string& state_what, const std::string& out_text,
                           const std::string& caller);
// With an earlier training forward's O (`out_what`), the state must be given exactly when the variant keeps
// one: UsageError naming what is missing (and `give_state`: how to give it) or what is not needed (and
// `drop_state`: "drop the option"). Returns saved_floats(p).
std::size_t check_saved_state_given(const Attention& variant, const Problem& p, bool state_given,
                                    const std::string& out_what, const std::string& state_what,
                                    const std::string& give_state, const std::string& drop_state);
// Asking for the training forward's state (`what`: "--save-state 'S.npy'", "save_state=True") of a variant
// without a backward: UsageError.
void check_save_state_has_backward(const Attention& variant, const std::string& what);

// NaN/Inf values in dQ (Q's shape), dK and dV (K's shape) of a backward of `p`, and the warning text
// ("the gradients hold N NaN/Inf values"; "" when there are none).
int64_t count_nonfinite_gradients(const Problem& p, const float* dq, const float* dk, const float* dv);
std::string nonfinite_gradients_note(int64_t count);

// The errors `eval --grad-output --compare` prints for fp32 gradients dq, dk, dv of a backward of `p` on
// `in` (the inputs the variant read) and `d_out`: "grad_accuracy" against the fp64 gradient of the variant's
// own definition (reference_backward: what a correct implementation must match), "grad_accuracy_exact"
// against exact softmax attention's (how far an approximate variant's gradient lands from exact
// attention's), each with "reference" and per gradient max_abs_err, rel_l2_err, nan_count, inf_count; and
// "nonfinite_gradients" (count_nonfinite_gradients). d_sink (sink logits' gradient, [heads]; null: none)
// adds grad_accuracy.d_sink_logits; dg, dbeta and d_initial_state (their inputs' shapes; null: none) add
// grad_accuracy.dg, .dbeta, .d_initial_state against the fp64 gradients of the definition
// (reference_gradients).
struct ExtraGradients {
  const float* d_sink = nullptr;
  const float* dg = nullptr;
  const float* dbeta = nullptr;
  const float* d_initial_state = nullptr;
};
Json gradient_comparison(const Attention& variant, const Problem& p, const AttentionInputs& in,
                         const float* d_out, const float* dq, const float* dk, const float* dv,
                         const ExtraGradients& extra = {});

}  // namespace attn
