// Rows' accuracy (accuracy.hpp).
#include "bench/lib/accuracy.hpp"

#include <algorithm>

#include "common/interface/half.hpp"
#include "common/interface/util.hpp"

namespace attn {

void fill_accuracy(AccuracySummary& a, const ErrorMetrics& m, int64_t rows) {
  a.rows = rows;
  a.max_abs_err = m.max_abs_err;
  a.rel_l2_err = m.rel_l2_err;
  a.mean_cosine = m.mean_cosine;
  a.nan_count = m.nan_count;
  a.inf_count = m.inf_count;
}

DoubleArray reference_rows(const double* ref, const Problem& p, const std::vector<int64_t>& rows) {
  const int64_t bh = p.batch * p.heads, D = p.value_dim();  // output rows are d_v wide
  const auto n = static_cast<int64_t>(rows.size());
  DoubleArray out({p.batch, p.heads, n, D});
  for (int64_t x = 0; x < bh; ++x)
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(ref + (x * p.seq_q + rows[static_cast<std::size_t>(r)]) * D, D,
                  out.ptr() + (x * n + r) * D);
  return out;
}

DoubleArray accuracy_reference(const Problem& p, const AttentionInputs& in, const std::vector<int64_t>& rows,
                               bool all_rows) {
  const Attention& variant = Registry::instance().get(p.variant);
  AttentionInputs x = in;
  x.out = nullptr;
  if (variant.capabilities().own_definition) {
    // Its reference_forward writes every row.
    DoubleArray all({p.batch, p.heads, p.seq_q, p.value_dim()});
    variant.reference_forward(p, x, all.ptr());
    return reference_rows(all.ptr(), p, rows);
  }
  DoubleArray ref({p.batch, p.heads, static_cast<int64_t>(rows.size()), p.value_dim()});
  reference_attention(p, x, ref.ptr(), all_rows ? nullptr : &rows);
  return ref;
}

GradientBlocks reference_gradient_blocks(const Problem& p, const AttentionInputs& in, const float* d_out,
                                         const std::vector<int64_t>& blocks) {
  const int64_t G = p.group_size(), n = static_cast<int64_t>(blocks.size());
  const int64_t qblock = G * p.seq_q * p.head_dim, kblock = p.seq_kv * p.head_dim,
                vblock = p.seq_kv * p.value_dim();
  GradientBlocks r{DoubleArray({n, G, p.seq_q, p.head_dim}), DoubleArray({n, p.seq_kv, p.head_dim}),
                   DoubleArray({n, p.seq_kv, p.value_dim()})};
  AttentionInputs x = in;
  x.out = nullptr;
  const Attention& variant = Registry::instance().get(p.variant);
  if (!variant.capabilities().own_definition) {
    reference_attention_backward(p, x, d_out, r.dq.ptr(), r.dk.ptr(), r.dv.ptr(), &blocks);
    return r;
  }
  // Block bkv = b * kv_heads + K/V head holds query heads bkv * G .. bkv * G + G - 1 (heads = kv_heads * G):
  // every block in order is the whole gradient, written in place; a subset is gathered from it.
  bool every = n == p.batch * p.num_kv_heads();
  for (int64_t i = 0; every && i < n; ++i) every = blocks[static_cast<std::size_t>(i)] == i;
  if (every) {
    variant.reference_gradients(p, x, d_out,
                                Fp64Gradients{.dq = r.dq.ptr(), .dk = r.dk.ptr(), .dv = r.dv.ptr()});
    return r;
  }
  DoubleArray dq({p.batch, p.heads, p.seq_q, p.head_dim});
  DoubleArray dk({p.batch, p.num_kv_heads(), p.seq_kv, p.head_dim});
  DoubleArray dv({p.batch, p.num_kv_heads(), p.seq_kv, p.value_dim()});
  variant.reference_gradients(p, x, d_out, Fp64Gradients{.dq = dq.ptr(), .dk = dk.ptr(), .dv = dv.ptr()});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t bkv = blocks[static_cast<std::size_t>(i)];
    std::copy_n(dq.ptr() + bkv * qblock, qblock, r.dq.ptr() + i * qblock);
    std::copy_n(dk.ptr() + bkv * kblock, kblock, r.dk.ptr() + i * kblock);
    std::copy_n(dv.ptr() + bkv * vblock, vblock, r.dv.ptr() + i * vblock);
  }
  return r;
}

namespace {
// What soft-capping and sink logits add to a reference's cache key (the sinks themselves come with the
// inputs).
std::string logit_key(const Problem& p) {
  return (p.softcap ? "softcap=" + std::to_string(*p.softcap) : std::string("nocap")) +
         (p.sinks ? ",sinks" : "");
}
}  // namespace

void AccuracyReferences::forward_reference(const Problem& p, const AttentionInputs& in,
                                           const std::string& mode, const std::string& key,
                                           std::string& have_key, DoubleArray& ref) {
  if (have_key == key) return;
  have_key.clear();
  ref = DoubleArray();
  ref = DoubleArray({p.batch, p.heads, static_cast<int64_t>(rows_.size()), p.value_dim()});
  reference_attention(p, in, ref.ptr(), mode == "full" ? nullptr : &rows_);
  have_key = key;
}

void AccuracyReferences::fill_forward(const SweepPoint& pt, const AttentionInputs& fp32,
                                      const AttentionInputs& stored_in, const float* out, ResultRow& row) {
  const Problem& p = pt.problem;
  // Against exact softmax attention in fp64 (same masks, bias and dropout), on all or sampled rows: on the
  // inputs the variant read (`accuracy`) and on the fp32 inputs before rounding (`accuracy_e2e`; for fp32
  // one reference serves both).
  const std::string mode = row.accuracy.reference;
  if (mode == "none") return;
  rows_ = accuracy_rows(p, settings_);
  // The input key leaves out causality (causal and non-causal twins share their inputs): the mask is part of
  // the reference's key.
  const std::string key = pt.input_key + "|" + pt.mask.label() + "|" + mode + "|" +
                          std::to_string(p.dropout) + "|" + std::to_string(p.seed) + "|" + bias_name(p.bias) +
                          "|" + logit_key(p);
  AttentionInputs in32 = fp32;
  in32.out = nullptr;
  forward_reference(WideInputs::as_fp32(p), in32, mode, key, key_, reference_);
  if (p.dtype == DType::fp32) {
    stored_key_.clear();  // points of one dtype are adjacent: free it for the fp32 points
    stored_reference_ = DoubleArray();
  } else {
    AttentionInputs stored = stored_in;
    stored.out = nullptr;
    forward_reference(p, stored, mode, key + "|" + dtype_name(p.dtype), stored_key_, stored_reference_);
  }
  const int64_t bh = p.batch * p.heads, dv = p.value_dim();  // the output's rows are d_v wide
  const auto got = mode == "full" ? std::vector<float>(out, out + bh * p.seq_q * dv)
                                  : gather_rows(out, bh, p.seq_q, dv, rows_);
  const auto rows = static_cast<int64_t>(rows_.size());
  const int64_t nrows = bh * rows;
  const ErrorMetrics soft_e2e = compare_outputs(got.data(), reference_.ptr(), nrows, dv);
  const ErrorMetrics soft =
      p.dtype == DType::fp32 ? soft_e2e : compare_outputs(got.data(), stored_reference_.ptr(), nrows, dv);
  row.accuracy_vs_softmax.max_abs_err = soft.max_abs_err;
  row.accuracy_vs_softmax.rel_l2_err = soft.rel_l2_err;
  const Attention& variant = Registry::instance().get(p.variant);
  if (!variant.capabilities().own_definition) {
    fill_accuracy(row.accuracy_e2e, soft_e2e, rows);
    fill_accuracy(row.accuracy, soft, rows);
    return;
  }
  // Not softmax attention: `accuracy` is against the variant's own fp64 definition on the inputs it read,
  // `accuracy_e2e` on the fp32 inputs. The reference is the variant's (every row), keyed by the whole problem
  // (its repro: variant, parameters, shapes, mask, dtype, initial state) on this input set.
  const std::string own_key = pt.input_key + "|" + p.repro();
  AttentionInputs fp32_in = fp32;
  fp32_in.out = nullptr;
  own_reference(variant, WideInputs::as_fp32(p), fp32_in, own_key + "|fp32", own_key_, own_reference_);
  const ErrorMetrics own_e2e = compare_outputs(got.data(), own_rows(own_reference_, p).ptr(), nrows, dv);
  fill_accuracy(row.accuracy_e2e, own_e2e, rows);
  if (p.dtype == DType::fp32) {
    own_stored_key_.clear();
    own_stored_reference_ = DoubleArray();
    fill_accuracy(row.accuracy, own_e2e, rows);
  } else {
    AttentionInputs stored = stored_in;
    stored.out = nullptr;
    own_reference(variant, p, stored, own_key, own_stored_key_, own_stored_reference_);
    fill_accuracy(row.accuracy,
                  compare_outputs(got.data(), own_rows(own_stored_reference_, p).ptr(), nrows, dv), rows);
  }
}

void AccuracyReferences::own_reference(const Attention& variant, const Problem& p, const AttentionInputs& in,
                                       const std::string& key, std::string& have_key, DoubleArray& ref) {
  if (have_key == key) return;
  have_key.clear();
  ref = DoubleArray();
  ref = DoubleArray({p.batch, p.heads, p.seq_q, p.value_dim()});
  variant.reference_forward(p, in, ref.ptr());
  have_key = key;
}

void AccuracyReferences::fill_backward(const SweepPoint& pt, const AttentionInputs& stored,
                                       const float* d_out, const float* dq, const float* dk, const float* dv,
                                       ResultRow& row) {
  const Problem& p = pt.problem;
  const std::vector<int64_t> blocks = grad_reference_blocks(p, settings_);
  row.grad_accuracy.blocks = static_cast<int64_t>(blocks.size());
  if (blocks.empty()) return;
  const int64_t G = p.group_size(), n = static_cast<int64_t>(blocks.size());
  // Exact softmax attention's gradient is shared by every variant on the input set (and mask, dropout, bias,
  // dtype, scale, logits); a variant's own definition is its alone: keyed by the whole problem (its repro:
  // variant, parameters, shapes, mask, dtype, initial state).
  const Attention& variant = Registry::instance().get(p.variant);
  const std::string key = variant.capabilities().own_definition
                              ? pt.input_key + "|" + p.repro() + "|" + row.grad_accuracy.reference
                              : pt.input_key + "|" + pt.mask.label() + "|" + row.grad_accuracy.reference +
                                    "|" + std::to_string(p.dropout) + "|" + std::to_string(p.seed) + "|" +
                                    bias_name(p.bias) + "|" + dtype_name(p.dtype) + "|" +
                                    std::to_string(p.effective_scale()) + "|" + logit_key(p);
  if (grad_key_ != key) {
    grad_key_.clear();
    grad_ = GradientBlocks();
    grad_ = reference_gradient_blocks(p, stored, d_out, blocks);
    grad_key_ = key;
  }
  // The fp32 gradients of the same blocks, in the reference's compact layout.
  const int64_t qblock = G * p.seq_q * p.head_dim, kblock = p.seq_kv * p.head_dim,
                vblock = p.seq_kv * p.value_dim();
  std::vector<float> gq(static_cast<std::size_t>(n * qblock)), gk(static_cast<std::size_t>(n * kblock)),
      gv(static_cast<std::size_t>(n * vblock));
  for (int64_t x = 0; x < n; ++x) {
    const int64_t bkv = blocks[static_cast<std::size_t>(x)], b = bkv / p.num_kv_heads();
    const int64_t h0 = b * p.heads + (bkv % p.num_kv_heads()) * G;
    std::copy_n(dq + h0 * p.seq_q * p.head_dim, qblock, gq.data() + x * qblock);
    std::copy_n(dk + bkv * kblock, kblock, gk.data() + x * kblock);
    std::copy_n(dv + bkv * vblock, vblock, gv.data() + x * vblock);
  }
  auto fill = [&](GradAccuracySummary::Part& part, const std::vector<float>& got, const DoubleArray& want,
                  int64_t width) {
    const ErrorMetrics m =
        compare_outputs(got.data(), want.ptr(), static_cast<int64_t>(got.size()) / width, width);
    part.max_abs_err = m.max_abs_err;
    part.rel_l2_err = m.rel_l2_err;
    part.nan_count = m.nan_count;
    part.inf_count = m.inf_count;
  };
  fill(row.grad_accuracy.dq, gq, grad_.dq, p.head_dim);
  fill(row.grad_accuracy.dk, gk, grad_.dk, p.head_dim);
  fill(row.grad_accuracy.dv, gv, grad_.dv, p.value_dim());
}

}  // namespace attn
