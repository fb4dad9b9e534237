// The engine of the gated and delta-rule linear recurrences ("route 2" around the quadratic cost): retention,
// simple_gla, gla, delta_rule, gated_delta_rule and kda are one recurrence over a d_k x d_v state S per
// (batch, query head), with row vectors, S_0 = 0 or the given initial state:
//
//   S'_t = diag(a_t) S_{t-1}                      a_t = exp(g_t) (scalar: every row; vector: per key channel;
//                                                 retention: gamma_h = 1 - 2^(-5-h); none: 1)
//   plain:  S_t = S'_t + k_tᵀ v_t
//   delta:  S_t = S'_t + k_tᵀ u_t,  u_t = beta_t (v_t - k_t S'_t)
//   o_t = scale · q_t S_t
//
// Two forms compute it: `recurrent`, the definition token by token (fp32 state, L1-resident), and `chunk`,
// the chunkwise-parallel form (masked C x C products on a register-blocked SIMD kernel inside a chunk, the
// state carried across chunks; for the delta rule the UT transform, a C x C unit lower-triangular solve per
// chunk). The fp64 reference is the definition token by token in double; the backward is reverse mode through
// the recurrence, recomputing the states of each chunk of C tokens from a checkpoint kept every C tokens.
//
// Layout, with d_k = p.head_dim and d_v = p.value_dim(): q [batch, heads, seq, d_k], k [batch, kv_heads, seq,
// d_k], v [batch, kv_heads, seq, d_v], the output (and dO) [batch, heads, seq, d_v], g [batch, heads, seq]
// (scalar) or [batch, heads, seq, d_k] (vector: one decay per key channel, i.e. per row of S), beta [batch,
// heads, seq], states [batch, heads, d_k, d_v]. Grouped-query heads read K/V head p.kv_head_of(h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/interface/attention.hpp"

namespace attn {

// What distinguishes the six recurrences.
struct RecurrenceKind {
  Gate gate = Gate::none;       // g's shape (AttentionInputs::g)
  bool retention = false;       // fixed decay per head, gamma_h = 1 - 2^(-5-h) (with gate none)
  bool delta = false;           // the delta rule (reads beta)
  bool normalize_keys = false;  // keys L2-normalised per token before the recurrence
};

enum class RecurrenceForm { chunk, recurrent };

struct RecurrenceConfig {
  RecurrenceKind kind;
  RecurrenceForm form = RecurrenceForm::chunk;
  int64_t chunk = 32;  // the chunk form's C (default: variants/recurrent); also the backward's checkpoints
};

// log(gamma_h) of retention's head h, computed in double (log1p(-2^(-5-h))).
double retention_log_gamma(int64_t head);

// UsageError when g > 0 or non-finite, beta outside (0, 1] or non-finite, or the initial state non-finite.
void check_recurrence_inputs(const Problem& p, const AttentionInputs& in, const RecurrenceKind& kind);

// fp32 forward in the configured form: writes in.out and, when not null, in.final_state. Deterministic
// (one TBB task per (batch, query head)). Q, K, V fp32 in in.q, in.k, in.v.
void recurrence_forward(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg);

// The fp64 definition, token by token: out [batch, heads, seq, d_v]; final_state [batch, heads, d_k, d_v]
// when not null.
void recurrence_reference(const Problem& p, const AttentionInputs& in, const RecurrenceKind& kind,
                          double* out, double* final_state = nullptr);

// Gradients of L = sum(d_out * O) (no gradient flows into the final state). Null pointers: not wanted
// (dq, dk, dv are always written). dq: Q's shape; dk, dv: K's and V's shapes, summed over each grouped-query
// group; dg: g's shape; dbeta: beta's; d_initial_state: [batch, heads, d_k, d_v]. d_out: the output's shape.
template <class T>
struct RecurrenceGrads {
  T* dq = nullptr;
  T* dk = nullptr;
  T* dv = nullptr;
  T* dg = nullptr;
  T* dbeta = nullptr;
  T* d_initial_state = nullptr;
};

// fp32 backward of the configured form: the chunk form's reverse mode through its chunkwise products
// (recurrence_chunk_backward.cpp), the recurrent form's token by token (checkpoints every C tokens).
void recurrence_backward(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg,
                         const float* d_out, const RecurrenceGrads<float>& g);
// fp64 gradient of recurrence_reference.
void recurrence_reference_backward(const Problem& p, const AttentionInputs& in, const RecurrenceKind& kind,
                                   const float* d_out, const RecurrenceGrads<double>& g);

// Derived bounds (derivations next to the definitions in recurrence.cpp).
double recurrence_abs_tolerance(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg);
// Bound on every element of |S_t(fp32) - S_t| over tokens and heads (the Frobenius bound e_t of the same
// derivation), for checks of the final state.
double recurrence_state_tolerance(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg);
GradientTolerance recurrence_grad_tolerance(const Problem& p, const AttentionInputs& in,
                                            const RecurrenceConfig& cfg, const float* d_out);

// FLOPs of one forward / backward in the configured form, and workspace bytes at `threads` threads.
double recurrence_flops(const Problem& p, const RecurrenceConfig& cfg);
double recurrence_backward_flops(const Problem& p, const RecurrenceConfig& cfg);
std::size_t recurrence_workspace_bytes(const Problem& p, const RecurrenceConfig& cfg, int threads);
std::size_t recurrence_backward_workspace_bytes(const Problem& p, const RecurrenceConfig& cfg, int threads);

// The recurrent form's fp32 forward of one head from S (d_k x d_v, holding S_0; left holding S_n), writing
// its n x d_v output rows (recurrence_chunk.cpp, per SIMD target); recurrence_forward runs it.
struct HeadInputs;
void recurrence_recurrent_head(const HeadInputs& hi, const RecurrenceKind& kind, float* S, float* out);

// The chunk form's forward (recurrence_chunk.cpp); recurrence_forward dispatches to it.
void recurrence_chunk_forward(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg);

// One (batch, query head)'s view of the inputs, shared by both forms (internal, but both .cpp files use it).
// dk: the width of q, k and a vector gate (the state's rows); dv: of v and the output (the state's columns).
struct HeadInputs {
  int64_t n = 0, dk = 0, dv = 0;
  const float* q = nullptr;     // n x dk
  const float* k = nullptr;     // n x dk (the K/V head's rows)
  const float* v = nullptr;     // n x dv
  const float* g = nullptr;     // n (scalar) or n x dk (vector); null: no gate input
  const float* beta = nullptr;  // n; null unless delta
  const float* s0 = nullptr;    // dk x dv or null
  double log_gamma = 0;         // retention's constant log decay (0 otherwise)
  double scale = 1;
};
HeadInputs head_inputs(const Problem& p, const AttentionInputs& in, const RecurrenceKind& kind, int64_t b,
                       int64_t h);

// The chunk form's backward of one (batch, head) (recurrence_chunk_backward.cpp): g's pointers are that
// head's rows (dq, dk, dv always; dg, dbeta, d_initial_state when not null); d_out: its n x dv rows.
void recurrence_chunk_head_backward(const HeadInputs& hi, const RecurrenceKind& kind, int64_t chunk,
                                    const float* d_out, const RecurrenceGrads<float>& g);
// Whether the configured form's backward is the chunkwise one.
bool recurrence_chunkwise_backward(const RecurrenceConfig& cfg);

}  // namespace attn
