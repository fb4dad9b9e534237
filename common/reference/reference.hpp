// The fp64 oracle: exact softmax attention computed straightforwardly in double, kept apart from every
// variant, and the comparison metrics used by tests, `attnbench check` and the sweep.
#pragma once
#include <cstdint>
#include <vector>

#include "common/interface/attention.hpp"

namespace attn {

// out[b,h,r,:] = sum_j w_rj v_j with w = softmax over allowed j of scale * q_r . k_j, then dropout (same
// counter-based decisions as the variants). A row with no allowed key is all zeros.
// rows == nullptr: every query row, out is [B,H,seq_q,Dv]. Otherwise only those query rows (in that order),
// out is [B,H,rows.size(),Dv] (Dv = p.value_dim(), V's width). in.out is not used (may be null).
// weights = bf16 / fp16: every normalised weight rounded to that precision (round to nearest even) before it
// multiplies V, the rest exact: the baseline's definition in 16-bit arithmetic (PyTorch's
// softmax(S).to(torch.bfloat16) @ V), what the checks' 2x-baseline rule compares a variant with whose
// weight_dtype is not fp32 (the FlashAttention test rule measures against the reference in the same dtype).
void reference_attention(const Problem& p, const AttentionInputs& in, double* out,
                         const std::vector<int64_t>* rows = nullptr, DType weights = DType::fp32);

struct ErrorMetrics {
  double max_abs_err =
      0;                  // over finite pairs; +inf if any output is non-finite where the reference is finite
  double rel_l2_err = 0;  // ||got - want||_F / ||want||_F (absolute ||got - want||_F when ||want|| = 0)
  double mean_cosine = 1;  // mean over rows of cos(got_row, want_row); two zero rows count as 1
  int64_t nan_count = 0;   // NaNs in the output
  int64_t inf_count = 0;   // infinities in the output
  int64_t rows = 0;        // rows compared
};

// got and want are `rows` rows of `dim` values each.
ErrorMetrics compare_outputs(const float* got, const double* want, int64_t rows, int64_t dim);

// Picks `count` query rows spread evenly over [0, seq_q) (all rows if count >= seq_q), always including
// the first and last: the rows most often wrong in windowed and causal code.
std::vector<int64_t> sample_rows(int64_t seq_q, int64_t count);

// Gathers rows `rows` of every (b, h) of a [B,H,seq,D] fp32 tensor into [B,H,rows.size(),D].
std::vector<float> gather_rows(const float* x, int64_t bh, int64_t seq, int64_t dim,
                               const std::vector<int64_t>& rows);

// Derived bound on |out_fp32 - out_fp64| for exact softmax attention computed in fp32 (derivation next to
// its definition in reference.cpp). weights: the precision the weights are rounded to before P V
// (Attention::weight_dtype; fp32: none).
double exact_abs_tolerance(const Problem& p, const AttentionInputs& in, DType weights = DType::fp32);
// The growth factor of an n-term fp32 sum's error the exact tolerance allows, in units of u * sum|x_i|:
// min(n, 8 sqrt(n)) (probabilistic for n > 64; reference.cpp says why).
double sum_growth(int64_t n);

// The fp64 gradient of exact softmax attention (reference_attention, same masks, bias, scale and dropout
// keep decisions) for L = sum(d_out * O): dq [B,H,seq_q,D], dk [B,Hkv,seq_kv,D] and dv [..,Dv]
// (grouped-query: summed over the group's query heads). Computed in double from Q, K, V and dO alone (P
// recomputed, no state of any variant): a pass over query rows (dQ, each row's log-sum-exp and dO . O), then
// a pass over keys (dK, dV), each parallel with every output element summed by one task in a fixed order, so
// the result is independent of the thread count. The ALiBi bias depends on neither Q nor K and has no
// gradient. A row with no allowed key contributes nothing. kv_blocks: only those (batch * kv_heads + K/V
// head) blocks, written compactly in that order: dq [n][group][seq_q][D] (the block's query heads), dk
// [n][seq_kv][D] and dv [n][seq_kv][Dv] (the sweep's sampled gradient accuracy); null: every block, in place.
// d_sinks (Problem::sinks): dL/d sink_logits [heads], summed over the batch (the covered blocks).
void reference_attention_backward(const Problem& p, const AttentionInputs& in, const float* d_out, double* dq,
                                  double* dk, double* dv, const std::vector<int64_t>* kv_blocks = nullptr,
                                  double* d_sinks = nullptr);

// Derived bounds on |grad_fp32 - grad_fp64| for exact softmax attention's backward in fp32 (derivation next
// to its definition in reference.cpp). Reads Q, K, V and dO (and computes the fp64 attention weights' largest
// column sum, which bounds how many rows feed one dK / dV row).
// weights as for exact_abs_tolerance: the forward that made O and the saved state rounded its weights so.
GradientTolerance exact_grad_tolerance(const Problem& p, const AttentionInputs& in, const float* d_out,
                                       DType weights = DType::fp32);

// Central differences of a variant's fp64 definition along random directions, held against its
// reference_backward (the registry-wide "grad-definition" check). Inputs and directions are quantised so
// every perturbed tensor is exact in fp32 (reference_forward reads fp32), Richardson extrapolation over two
// step sizes cancels the h^2 term, and the result is the relative discrepancy of the worst direction (see
// the .cpp for the definition). A gradient formula off by more than ~1e-6 of its size fails.
struct DirectionalCheck {
  double worst_rel = 0;  // |fd - <grad, U>| / max(|<grad, U>|, ||grad|| ||U|| / sqrt(n)), worst direction
  double fd = 0;         // the worst direction's extrapolated central difference
  double analytic = 0;   // and its <grad, U>
  int directions = 0;
};
// `p` must be fp32. The inputs (Q, K, V of `in`, masks and slopes as given) are quantised to multiples of
// 2^-8, kept at least 1/8 from zero (elementwise kinks such as relu's stay off the path), in copies.
DirectionalCheck check_reference_gradient(const Attention& variant, const Problem& p,
                                          const AttentionInputs& in, const float* d_out, int directions,
                                          uint64_t seed);

}  // namespace attn
