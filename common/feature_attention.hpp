// The engine of kernelised ("feature map") attention, shared by linear and performer: out_i =
// φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / (φ(q_i)ᵀ Σ_j φ(k_j) + eps_i) computed by associativity in O(n·m·d) for a feature
// map φ: R^d -> R^m given as a strategy (FeatureMap). Non-causal: one m×(d+1) state [φ(K)ᵀV | φ(K)ᵀ1] per
// K/V head; causal: chunks with the masked quadratic form inside and a running state across.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/attention.hpp"

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
};

// Writes in.out with causal / lower-right causal / key padding / grouped-query / cross-attention as `p` says
// (the caller's capabilities exclude the rest). Q, K and V must be fp32 in in.q, in.k, in.v whatever
// p.dtype says: a bf16 / fp16 caller widens them first (common/half.hpp WideInputs); std::logic_error if one
// is null. `chunk`: causal positions per chunk. Deterministic for any thread count (work units fixed by the
// problem).
void feature_attention_forward(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, float eps,
                               int64_t chunk);

// The fp64 quadratic definition (see FeatureMapFp64) into out [B, H, seq_q, head_dim]; Q, K, V fp32 as for
// feature_attention_forward.
void feature_attention_reference(const Problem& p, const AttentionInputs& in, const FeatureMapFp64& phi,
                                 double eps, double* out);

// The engine's FLOPs, m features: per query head, building the state φ(K)ᵀV (2·Lkv·m·d), applying it
// (2·Lq·m·(d+1)) and, causal, the lower triangle of each chunk's φ(Q_c)φ(K_c)ᵀ (≈ Lq·(C+1)·m) and its
// product with V (≈ Lq·(C+1)·d). The feature map itself, the masked upper triangles and the division are
// not counted (the caller adds what its map costs).
double feature_attention_flops(const Problem& p, int64_t m, int64_t chunk);

// Bytes the engine allocates at `threads` threads for m features (per_row_eps: the map scales_eps()).
// Saturating: also the estimate of problems far too large to run.
std::size_t feature_attention_workspace_bytes(const Problem& p, int64_t m, int64_t chunk, int threads,
                                              bool per_row_eps);

}  // namespace attn
