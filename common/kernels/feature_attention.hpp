// The engine of kernelised ("feature map") attention, shared by linear and performer: out_i =
// φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / (φ(q_i)ᵀ Σ_j φ(k_j) + eps_i) computed by associativity in O(n·m·d) for a feature
// map φ: R^d -> R^m given as a strategy (FeatureMap). Non-causal: one m×(d+1) state [φ(K)ᵀV | φ(K)ᵀ1] per
// K/V head; causal: chunks with the masked quadratic form inside and a running state across. The backward
// (feature_attention_backward) has the same structure: global states, or a forward prefix for dQ and a
// reverse prefix for dK and dV.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/interface/attention.hpp"

namespace attn {

// Rows per task when applying the non-causal state to the queries, and keys per block when building it:
// large enough for BLAS to run near peak, small enough that a block of φ stays in L2.
inline constexpr int64_t kFeatureQueryRows = 256;
inline constexpr int64_t kFeatureKeyRows = 512;

// A block of consecutive rows of Q (query head `head`) or K (K/V block `kv`), all of batch entry `b`.
struct FeatureRows {
  int64_t b = 0;     // batch entry
  int64_t head = 0;  // query rows: the query head (0 .. heads-1); key rows: unused (-1)
  int64_t kv = 0;    // the K/V block b * kv_heads + kv head these rows read or attend to (Problem::kv_block)
  int64_t row0 = 0;  // index of the first row in the sequence
  int64_t rows = 0;
  const float* src = nullptr;  // rows × head_dim, contiguous
};

// The feature map φ, a strategy called from several TBB tasks at once (so const and thread-safe). Features
// must be finite and >= 0 for the error analysis of the callers' tolerances (both maps here are positive);
// the engine zeroes the rows of padded keys after keys() returns, so what keys() writes there is ignored.
class FeatureMap {
 public:
  virtual ~FeatureMap() = default;
  virtual int64_t features() const = 0;  // m
  // dst (rows × m, contiguous) = φ of the query rows. row_eps[r] holds the problem's eps on entry; a map
  // that rescales its features per row (a stabiliser) rescales row r's eps the same way, so that eps keeps
  // its meaning in the unscaled denominator. Only written when scales_eps().
  virtual void queries(const FeatureRows& rows, float* dst, float* row_eps) const = 0;
  virtual void keys(const FeatureRows& rows, float* dst) const = 0;
  // True when queries() may change row_eps: the engine then keeps one eps per query row (a little more
  // workspace); false passes the constant eps and row_eps is unused.
  virtual bool scales_eps() const { return false; }
  // The backward through φ: dx (rows × head_dim, contiguous) = the gradient with respect to the input rows
  // (rows.src) of a loss whose gradient with respect to their features is d_features (rows × m), at the
  // features queries() / keys() wrote for the same rows (`features`; rows.head says which, -1 for keys). A
  // per-row or per-head constant factor the map applies (a stabiliser) is held fixed: the engine's output
  // does not depend on it (eps is rescaled with it), so its derivative would cancel. The map may overwrite
  // d_features (scratch). The engine passes zero d_features rows for padded keys.
  virtual void input_gradient(const FeatureRows& rows, const float* features, float* d_features,
                              float* dx) const = 0;
};

// The fp64 counterpart, for reference_forward: the exact quadratic definition w_ij = φ(q_i)·φ(k_j) over the
// allowed keys, out_i = Σ w_ij v_j / (Σ w_ij + eps_i), without reordering.
class FeatureMapFp64 {
 public:
  virtual ~FeatureMapFp64() = default;
  virtual int64_t features() const = 0;
  // dst (m values) = φ(q_i) of query row i of head bh = b * heads + h; returns the row's eps (given `eps`).
  virtual double query(int64_t b, int64_t h, int64_t i, const float* q, double* dst, double eps) const = 0;
  // dst (m values) = φ(k_j) of key row j of K/V block kv (batch entry b).
  virtual void key(int64_t b, int64_t kv, int64_t j, const float* k, double* dst) const = 0;
  // dx (head_dim values) = Σ_e d_features[e] ∂φ_e/∂x at the input row x (a query or a key row) whose features
  // query() / key() returned as `features`, the stabilisers held fixed (see FeatureMap::input_gradient).
  virtual void input_gradient(const float* x, const double* features, const double* d_features,
                              double* dx) const = 0;
  // For the gradient tolerance: err (head_dim values) = a bound on |dx_fp32 - dx| for FeatureMap::
  // input_gradient on this row when the fp32 d_features it is given are within d_err[e] of d_features[e]
  // and the fp32 features within feature_err (relative) of `features`, the map's own rounding included.
  virtual void input_gradient_error(const float* x, const double* features, const double* d_features,
                                    const double* d_err, double feature_err, double* err) const = 0;
};

// Writes in.out with causal / lower-right causal / key padding / grouped-query / cross-attention as `p` says
// (the caller's capabilities exclude the rest). Q, K and V must be fp32 in in.q, in.k, in.v whatever
// p.dtype says: a bf16 / fp16 caller widens them first (common/interface/half.hpp WideInputs);
// std::logic_error if one is null. `chunk`: causal positions per chunk. Deterministic for any thread count
// (work units fixed by the problem). `saved` (optional, feature_attention_saved_floats(p) floats): the state
// the backward needs.
void feature_attention_forward(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, float eps,
                               int64_t chunk, float* saved = nullptr);

// The forward's saved state: per query row [batch, heads, seq_q], the factor 1 / (denominator + eps) it
// multiplied the row's numerator by (in the map's stabilised units: the row's own eps). O and this give the
// backward every per-row quantity without rebuilding the denominators.
std::size_t feature_attention_saved_floats(const Problem& p);
inline constexpr const char* kFeatureSavedDescription =
    "1 / (denominator + eps) of each query row, the factor its numerator was multiplied by ([batch, heads, "
    "seq_q])";

// dQ, dK, dV of the forward's definition for L = sum(dO * O), from Q, K, V (fp32, as for the forward), the
// forward's O and saved state (g.out, g.saved), dO (g.d_out), with the same `phi` (bitwise the forward's
// features) and `chunk`. With r_i = 1 / (den_i + eps_i), Ẽ_i = r_i [dO_i | −dO_i·O_i] and Ṽ_j = [v_j | 1],
// the weight w_ij = φ(q_i)·φ(k_j) of every allowed pair has dL/dw_ij = Ṽ_j·Ẽ_i, so
//   dφ(q_i) = Σ_j φ(k_j) (Ṽ_j·Ẽ_i),  dφ(k_j) = Σ_i φ(q_i) (Ṽ_j·Ẽ_i),  dv_j = Σ_i w_ij r_i dO_i,
// each a sum over the allowed pairs that factorises as the forward's does: non-causal through the state
// [φ(K)ᵀV | φ(K)ᵀ1] per K/V head and U = Σ_i φ(q_i) Ẽ_iᵀ (m×(d+1)) summed over the K/V head's query heads;
// causal in chunks, dQ from a forward prefix of the state and dK, dV from a reverse prefix of U, with the
// masked quadratic forms inside each chunk. Then each map's input_gradient. Deterministic for any thread
// count (units fixed by the problem, every reduction in a fixed order).
void feature_attention_backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g,
                                const FeatureMap& phi, int64_t chunk);

// The fp64 quadratic definition (see FeatureMapFp64) into out [B, H, seq_q, head_dim]; Q, K, V fp32 as for
// feature_attention_forward.
void feature_attention_reference(const Problem& p, const AttentionInputs& in, const FeatureMapFp64& phi,
                                 double eps, double* out);

// The fp64 gradient of feature_attention_reference for L = sum(d_out * O), from the quadratic definition
// (every allowed pair, no reordering) through phi.input_gradient: dq [B, H, seq_q, D], dk and dv [B, Hkv,
// seq_kv, D] (grouped-query heads summed). Parallel over (batch, K/V head); independent of the thread count.
void feature_attention_reference_backward(const Problem& p, const AttentionInputs& in,
                                          const FeatureMapFp64& phi, double eps, const float* d_out,
                                          double* dq, double* dk, double* dv);

// Relative error bounds of the fp32 features the variant's FeatureMap computes against its FeatureMapFp64
// (the variant's own derivation, the same one its forward tolerance uses): query and key features. A factor
// common to a query row or to every key of a head (a stabiliser's rounding) cancels and is not counted.
struct FeatureErrors {
  double query = 0, key = 0;
};

// Bounds on |grad_fp32 - grad_fp64| for feature_attention_backward against
// feature_attention_reference_backward on these inputs and this dO: a first-order running error analysis
// element by element (derivation in the .cpp), 2x, max over elements. Q, K, V fp32 as for the reference.
GradientTolerance feature_attention_grad_tolerance(const Problem& p, const AttentionInputs& in,
                                                   const FeatureMapFp64& phi, double eps, const float* d_out,
                                                   FeatureErrors feature_err);

// The engine's FLOPs, m features: per query head, building the state φ(K)ᵀV (2·Lkv·m·d), applying it
// (2·Lq·m·(d+1)) and, causal, the lower triangle of each chunk's φ(Q_c)φ(K_c)ᵀ (≈ Lq·(C+1)·m) and its
// product with V (≈ Lq·(C+1)·d). The feature map itself, the masked upper triangles and the division are
// not counted (the caller adds what its map costs).
double feature_attention_flops(const Problem& p, int64_t m, int64_t chunk);

// The backward's matmul FLOPs, m features (derivation next to the definition): the states rebuilt, dφ(Q),
// U, dφ(K), dV and, causal, the masked chunk products, in the forward's conventions (lower triangles only;
// the feature map, its input_gradient and elementwise work not counted: the caller adds its map's cost from
// feature_attention_backward_rows).
double feature_attention_backward_flops(const Problem& p, int64_t m, int64_t chunk);

// Rows the backward evaluates φ on (queries, keys: it recomputes the features instead of keeping them) and
// passes through input_gradient (query rows, key rows).
struct FeatureBackwardRows {
  double query_features = 0, key_features = 0, query_gradients = 0, key_gradients = 0;
};
FeatureBackwardRows feature_attention_backward_rows(const Problem& p);

// Bytes the engine allocates at `threads` threads for m features (per_row_eps: the map scales_eps()).
// Saturating: also the estimate of problems far too large to run.
std::size_t feature_attention_workspace_bytes(const Problem& p, int64_t m, int64_t chunk, int threads,
                                              bool per_row_eps);

// Bytes feature_attention_backward allocates at `threads` threads (saturating, as above).
std::size_t feature_attention_backward_workspace_bytes(const Problem& p, int64_t m, int64_t chunk,
                                                       int threads, bool per_row_eps);

}  // namespace attn
