// Test support: the one seeded test-case builder: a Problem with its Q, K, V, masks and output, the
// AttentionInputs that point into them, runs of any variant, the fp64 reference and the derived tolerance,
// and the same tensors written to .npy files for the CLI. Header-only.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/io/npy.hpp"
#include "common/reference/reference.hpp"
#include "common/support/random.hpp"
#include "common/support/tensor.hpp"
#include "tests/support/scratch_dir.hpp"

namespace attn::test {

// A resolved problem for `variant` (parameters `params` validated, defaults filled) with these sizes and
// masks ("none", "causal", "causal_lower_right", "bool", "pad", joined by '+').
inline Problem make_test_problem(const std::string& variant, int64_t batch, int64_t heads, int64_t seq_q,
                                 int64_t seq_kv, int64_t head_dim, const std::string& mask = "none",
                                 const Json& params = Json::object()) {
  Problem p = make_problem(variant, params);
  p.batch = batch, p.heads = heads, p.seq_q = seq_q, p.seq_kv = seq_kv, p.head_dim = head_dim;
  p.mask = parse_mask(mask, "test");
  return p;
}

// A float32 tensor of N(0, stddev^2) draws from `seed`.
inline FloatArray normal_tensor(std::vector<int64_t> shape, uint64_t seed, double stddev = 1.0) {
  FloatArray a(std::move(shape));
  fill_normal(a.ptr(), static_cast<int64_t>(a.numel()), seed, stddev);
  return a;
}

// The paths AttentionCase::write_files wrote (mask and pad empty when the case has none).
struct CaseFiles {
  std::string q, k, v, mask, pad;
};

// One problem with its tensors. Q is [batch, heads, seq_q, head_dim], K and V [batch, kv_heads, seq_kv,
// head_dim]; out starts as NaN (and every run
// starts from NaN) so a row a variant forgets to write shows up; the boolean mask is [seq_q, seq_kv]
// (nonzero = may attend), the key padding [batch, seq_kv] (nonzero = padded).
struct AttentionCase {
  Problem p;
  FloatArray q, k, v, out;
  ByteArray mask, pad;

  // Zero Q, K, V sized for `problem`, and the masks it names allowing every key (mask all 1, padding all 0).
  explicit AttentionCase(Problem problem) : p(std::move(problem)) {
    q = FloatArray({p.batch, p.heads, p.seq_q, p.head_dim});
    k = FloatArray({p.batch, p.num_kv_heads(), p.seq_kv, p.head_dim});
    v = FloatArray({p.batch, p.num_kv_heads(), p.seq_kv, p.head_dim});
    out = FloatArray(q.shape, std::nanf(""));
    if (p.mask.boolean) mask = ByteArray({p.seq_q, p.seq_kv}, 1);
    if (p.mask.key_padding) pad = ByteArray({p.batch, p.seq_kv}, 0);
  }
  // The same with Q, K, V filled by fill_normal (below).
  AttentionCase(Problem problem, uint64_t seed, double logit_std = 1.0) : AttentionCase(std::move(problem)) {
    fill_normal(seed, logit_std);
  }

  // Q, K, V ~ N(0, 1) from seeds `seed`, `seed + 1`, `seed + 2`; Q and K scaled by `logit_std` (the logits
  // then have standard deviation logit_std^2 at the default scale).
  AttentionCase& fill_normal(uint64_t seed, double logit_std = 1.0) {
    attn::fill_normal(q.ptr(), static_cast<int64_t>(q.numel()), seed, logit_std);
    attn::fill_normal(k.ptr(), static_cast<int64_t>(k.numel()), seed + 1, logit_std);
    attn::fill_normal(v.ptr(), static_cast<int64_t>(v.numel()), seed + 2);
    return *this;
  }
  // A [seq_q, seq_kv] boolean mask allowing each (i, j) with probability `keep` (draws from Rng(seed) in
  // row-major order), then allowing no key to the query rows `empty_rows`.
  AttentionCase& random_mask(uint64_t seed, double keep, const std::vector<int64_t>& empty_rows = {}) {
    mask = ByteArray({p.seq_q, p.seq_kv});
    Rng rng(seed);
    for (auto& m : mask.data) m = rng.uniform() < keep ? 1 : 0;
    for (int64_t i : empty_rows) std::fill_n(mask.ptr() + i * p.seq_kv, p.seq_kv, uint8_t{0});
    return *this;
  }
  // A [batch, seq_kv] key padding: batch b pads key j iff padded(b, j).
  AttentionCase& pad_keys(const std::function<bool(int64_t b, int64_t j)>& padded) {
    pad = ByteArray({p.batch, p.seq_kv});
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t j = 0; j < p.seq_kv; ++j) pad.data[b * p.seq_kv + j] = padded(b, j) ? 1 : 0;
    return *this;
  }

  // Pointers for `problem` (default p) into these tensors: the boolean mask and the padding only when the
  // problem uses them (`mask_override`, if given, replaces the boolean mask), the output `o`.
  AttentionInputs inputs(float* o, const Problem* problem = nullptr,
                         const uint8_t* mask_override = nullptr) const {
    const Problem& pr = problem ? *problem : p;
    const uint8_t* m =
        mask_override ? mask_override : (pr.mask.boolean && mask.numel() ? mask.ptr() : nullptr);
    return {q.ptr(), k.ptr(), v.ptr(), m, pr.mask.key_padding && pad.numel() ? pad.ptr() : nullptr, o};
  }
  AttentionInputs inputs() { return inputs(out.ptr()); }

  // This case's sizes, masks, scale, dropout and seed as a problem of `variant` with `params`.
  Problem for_variant(const std::string& variant, const Json& params = Json::object()) const {
    Problem vp = make_problem(variant, params);
    vp.batch = p.batch, vp.heads = p.heads, vp.kv_heads = p.kv_heads, vp.seq_q = p.seq_q,
    vp.seq_kv = p.seq_kv, vp.head_dim = p.head_dim;
    vp.mask = p.mask, vp.scale = p.scale, vp.dropout = p.dropout, vp.seed = p.seed;
    return vp;
  }

  // Runs problem.variant on `problem` (default p; `mask_override` as in inputs) through Attention::run into
  // `out`, reset to NaN first, and returns a copy of it.
  FloatArray run(const Problem& problem, const uint8_t* mask_override = nullptr) {
    out = FloatArray({problem.batch, problem.heads, problem.seq_q, problem.head_dim}, std::nanf(""));
    Registry::instance().get(problem.variant).run(problem, inputs(out.ptr(), &problem, mask_override));
    return out;
  }
  FloatArray run() { return run(p); }
  // Runs `variant` with `params` on this case's problem (for_variant).
  FloatArray run_as(const std::string& variant, const Json& params = Json::object()) {
    return run(for_variant(variant, params));
  }

  // The fp64 exact softmax attention of p (reference_attention) on these inputs.
  DoubleArray reference() const {
    DoubleArray want({p.batch, p.heads, p.seq_q, p.head_dim});
    reference_attention(p, inputs(nullptr), want.ptr());
    return want;
  }
  // The bound on |fp32 output - fp64 oracle| p's variant derives for these inputs (Attention::abs_tolerance:
  // exact_abs_tolerance unless the variant overrides it).
  double tolerance() const { return Registry::instance().get(p.variant).abs_tolerance(p, inputs(nullptr)); }

  int64_t rows() const { return p.batch * p.heads * p.seq_q; }
  // Element (bh, row, d) of a tensor, bh = b * heads + h for Q and b * kv_heads + h for K and V.
  float& q_at(int64_t bh, int64_t i, int64_t d) { return q.data[(bh * p.seq_q + i) * p.head_dim + d]; }
  float& k_at(int64_t bh, int64_t j, int64_t d) { return k.data[(bh * p.seq_kv + j) * p.head_dim + d]; }
  float& v_at(int64_t bh, int64_t j, int64_t d) { return v.data[(bh * p.seq_kv + j) * p.head_dim + d]; }
  float out_at(int64_t bh, int64_t i, int64_t d) const {
    return out.data[(bh * p.seq_q + i) * p.head_dim + d];
  }

  // Writes q<tag>.npy, k<tag>.npy, v<tag>.npy and, when the case has them, mask<tag>.npy and pad<tag>.npy
  // into `dir`. Masks are written as float32 0/1 (a dtype read_npy_mask accepts, as NumPy users pass them).
  CaseFiles write_files(const ScratchDir& dir, const std::string& tag = "") const {
    CaseFiles f{dir.file("q" + tag + ".npy"), dir.file("k" + tag + ".npy"), dir.file("v" + tag + ".npy"), "",
                ""};
    write_npy(f.q, q);
    write_npy(f.k, k);
    write_npy(f.v, v);
    auto as_float = [](const ByteArray& m) {
      FloatArray x(m.shape);
      for (std::size_t e = 0; e < m.numel(); ++e) x.data[e] = m.data[e];
      return x;
    };
    if (mask.numel()) write_npy(f.mask = dir.file("mask" + tag + ".npy"), as_float(mask));
    if (pad.numel()) write_npy(f.pad = dir.file("pad" + tag + ".npy"), as_float(pad));
    return f;
  }
};

}  // namespace attn::test
