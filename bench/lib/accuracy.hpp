// A row's accuracy against fp64 exact softmax attention, the same whoever measured the point (the local
// runner, attnbench_mpi's ring): the forward's `accuracy` (on the inputs the variant read) and
// `accuracy_e2e` (on the fp32 inputs before rounding to the storage dtype), and backward rows'
// `grad_accuracy` (dQ, dK, dV against the fp64 gradient of the blocks grad_reference_blocks names). The
// softmax references are computed once per input set (and mask, dropout, bias, dtype) and shared by every
// point on it: the plan keeps those points adjacent. A variant that is not softmax attention
// (Capabilities::own_definition: the recurrences) has `accuracy`, `accuracy_e2e` and `grad_accuracy`
// against its own fp64 definition (Attention::reference_forward, Attention::reference_gradients, keyed by
// the whole problem: it is that variant's alone), and the shared softmax reference gives
// `accuracy_vs_softmax`, the informative distance between the two operators (for softmax variants it
// repeats `accuracy`'s figures).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/lib/config.hpp"
#include "bench/lib/plan.hpp"
#include "bench/lib/result_row.hpp"
#include "common/interface/attention.hpp"
#include "common/reference/reference.hpp"
#include "common/support/tensor.hpp"

namespace attn {

// The metrics of a comparison into a row's summary.
void fill_accuracy(AccuracySummary& a, const ErrorMetrics& m, int64_t rows);

// Rows `rows` of every (batch, head) of a whole [batch, heads, seq_q, d_v] reference `ref`: [batch,
// heads, rows.size(), d_v].
DoubleArray reference_rows(const double* ref, const Problem& p, const std::vector<int64_t>& rows);

// The fp64 reference `accuracy` compares with, on `rows` of every (batch, head) ([batch, heads, rows.size(),
// d_v]; `rows` are all of them when `all_rows`), for problem `p` on `in` (the inputs the kernel read,
// with the g, beta, sink logits and initial state its variant reads): the variant's own definition
// (reference_forward) for a variant with Capabilities::own_definition, exact softmax attention otherwise.
DoubleArray accuracy_reference(const Problem& p, const AttentionInputs& in, const std::vector<int64_t>& rows,
                               bool all_rows);

// The fp64 gradients `grad_accuracy` compares with: of problem `p` on `in` (the inputs the kernel read, with
// the g in the shape its variant reads, beta, sink logits and initial state) for dO `d_out`, on the
// (batch * kv_heads + K/V head) `blocks` in the compact layout reference_attention_backward(..., &blocks)
// writes: dq [n, group, seq_q, head_dim], dk [n, seq_kv, head_dim] and dv [.., d_v] (n = blocks.size(), the
// blocks in their order). A variant with Capabilities::own_definition: the gradient of its own definition
// (Attention::reference_gradients over the whole tensors, then these blocks); any other: exact softmax
// attention's (same masks, bias, scale, dropout, sinks). The runner's grad_accuracy and `attnbench inputs`'
// grad_*.npy both come from here.
struct GradientBlocks {
  DoubleArray dq, dk, dv;
};
GradientBlocks reference_gradient_blocks(const Problem& p, const AttentionInputs& in, const float* d_out,
                                         const std::vector<int64_t>& blocks);

class AccuracyReferences {
 public:
  explicit AccuracyReferences(const AccuracySettings& settings) : settings_(settings) {}
  // `out` is the point's whole output [B, H, seq_q, D]; `fp32` the input set's fp32 Q, K, V (and masks);
  // `stored` what the variant read (fp32, or q16 / k16 / v16 of the point's dtype). Does nothing when the
  // row's accuracy.reference is "none".
  void fill_forward(const SweepPoint& pt, const AttentionInputs& fp32, const AttentionInputs& stored,
                    const float* out, ResultRow& row);
  // The whole dQ, dK, dV of a backward point against reference_gradient_blocks on `stored` (the inputs the
  // kernel read, with the g, beta and initial state its variant reads) for dO `d_out`, on the blocks
  // grad_reference_blocks gives (grad_accuracy.blocks = how many).
  void fill_backward(const SweepPoint& pt, const AttentionInputs& stored, const float* d_out, const float* dq,
                     const float* dk, const float* dv, ResultRow& row);

 private:
  // The fp64 forward reference of `p` on `in` under `key` into `ref` (kept while the key stays the same).
  void forward_reference(const Problem& p, const AttentionInputs& in, const std::string& mode,
                         const std::string& key, std::string& have_key, DoubleArray& ref);

  // A variant's own fp64 definition (reference_forward, every row) of `p` on `in` under `key` into `ref`.
  void own_reference(const Attention& variant, const Problem& p, const AttentionInputs& in,
                     const std::string& key, std::string& have_key, DoubleArray& ref);
  // The compared rows (rows_) of a whole [batch, heads, seq_q, d_v] reference, in the compact order.
  DoubleArray own_rows(const DoubleArray& ref, const Problem& p) const {
    return reference_rows(ref.ptr(), p, rows_);
  }

  const AccuracySettings& settings_;
  std::vector<int64_t> rows_;
  // On the fp32 inputs (the end-to-end reference; the only one of fp32 points) and on the rounded ones.
  std::string key_, stored_key_;
  DoubleArray reference_, stored_reference_;
  // Own-definition references (Capabilities::own_definition), on the fp32 and on the rounded inputs.
  std::string own_key_, own_stored_key_;
  DoubleArray own_reference_, own_stored_reference_;
  std::string grad_key_;
  GradientBlocks grad_;
};

}  // namespace attn
