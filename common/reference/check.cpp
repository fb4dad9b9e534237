// The registry-wide checks. Inputs are seeded gaussians; masks are chosen to leave some rows fully masked.
#include "common/reference/check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "common/interface/half.hpp"
#include "common/kernels/mask.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"
#include "common/support/tensor.hpp"

namespace attn {

std::string check_status_name(CheckStatus s) {
  switch (s) {
    case CheckStatus::passed:
      return "PASSED";
    case CheckStatus::failed:
      return "FAILED";
    case CheckStatus::skipped:
      return "SKIPPED";
  }
  return "?";
}

namespace {

// Inputs for one problem, owned together so AttentionInputs can point into them.
struct CaseData {
  FloatArray q, k, v, out;
  ByteArray mask, key_padding;
  FloatArray g, beta;                    // recurrences only (fill_recurrence_inputs)
  FloatArray index_q, index_k, index_w;  // an indexer's only (fill_recurrence_inputs)

  CaseData(const Problem& p, uint64_t seed, double logit_scale = 1.0) {
    q = FloatArray({p.batch, p.heads, p.seq_q, p.head_dim});
    k = FloatArray({p.batch, p.num_kv_heads(), p.seq_kv, p.head_dim});
    v = FloatArray({p.batch, p.num_kv_heads(), p.seq_kv, p.value_dim()});
    out = FloatArray({p.batch, p.heads, p.seq_q, p.value_dim()}, std::nanf(""));  // unwritten rows show up
    fill_normal(q.ptr(), q.numel(), seed * 3 + 1, logit_scale);
    fill_normal(k.ptr(), k.numel(), seed * 3 + 2, logit_scale);
    fill_normal(v.ptr(), v.numel(), seed * 3 + 3);
    if (p.sinks) {
      // One learned sink logit per query head, std 2 against logits of std ~1: some heads' sinks dominate
      // their rows, others barely take part.
      sinks.resize(static_cast<std::size_t>(p.heads));
      fill_normal(sinks.data(), p.heads, seed * 3 + 11, 2.0);
    }
    if (p.mask.boolean) {
      // Random pattern (70% allowed), with query row 0 fully masked when there are at least 2 rows.
      mask = ByteArray({p.seq_q, p.seq_kv});
      Rng rng(seed * 7 + 5);
      for (auto& m : mask.data) m = rng.uniform() < 0.7 ? 1 : 0;
      if (p.seq_q >= 2) std::fill_n(mask.ptr(), p.seq_kv, uint8_t{0});
    }
    if (p.mask.key_padding) {
      // Batch b pads its last (b * seq_kv / 3) keys; with batch >= 4 the last batch pads every key.
      key_padding = ByteArray({p.batch, p.seq_kv});
      for (int64_t b = 0; b < p.batch; ++b) {
        const int64_t padded = b >= 3 ? p.seq_kv : b * p.seq_kv / 3;
        for (int64_t j = p.seq_kv - padded; j < p.seq_kv; ++j) key_padding.data[b * p.seq_kv + j] = 1;
      }
    }
    fill_recurrence_inputs(p, seed);
  }
  // The per-token inputs of a recurrence, only for a variant whose capabilities read them: g =
  // logsigmoid(N(0, 1)) ([b, h, n] or [b, h, n, d] by Capabilities::gate) and beta = sigmoid(N(0, 1)).
  void fill_recurrence_inputs(const Problem& p, uint64_t seed) {
    const Attention* variant = Registry::instance().find(p.variant);
    if (!variant) return;
    const Capabilities caps = variant->capabilities();
    const int64_t tokens = p.batch * p.heads * p.seq_q;
    if (caps.gate != Gate::none) {
      g = caps.gate == Gate::vector ? FloatArray({p.batch, p.heads, p.seq_q, p.head_dim})
                                    : FloatArray({p.batch, p.heads, p.seq_q});
      fill_normal(g.ptr(), static_cast<int64_t>(g.numel()), seed * 11 + 3);
      for (float& x : g.data) x = static_cast<float>(-std::log1p(std::exp(-static_cast<double>(x))));
    }
    if (caps.beta) {
      beta = FloatArray({p.batch, p.heads, p.seq_q});
      fill_normal(beta.ptr(), tokens, seed * 11 + 4);
      for (float& x : beta.data) x = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x))));
    }
    if (caps.indexer) {
      // A lightning indexer's inputs (Capabilities::indexer), N(0, 1) each: index weights of both signs, as a
      // learned projection gives.
      const IndexerShape ix(p);
      index_q = FloatArray({p.batch, p.seq_q, ix.heads, ix.dim});
      index_k = FloatArray({p.batch, p.seq_kv, ix.dim});
      index_w = FloatArray({p.batch, p.seq_q, ix.heads});
      fill_normal(index_q.ptr(), ix.q_elements(p), seed * 11 + 5);
      fill_normal(index_k.ptr(), ix.k_elements(p), seed * 11 + 6);
      fill_normal(index_w.ptr(), ix.w_elements(p), seed * 11 + 7);
    }
  }
  // The fp32 tensors as the problem's storage: for bf16 / fp16, Q, K and V rounded
  // (common/interface/half.hpp) when first asked for; the tensors must not change after that.
  AttentionInputs inputs(const Problem& p) {
    AttentionInputs in = fp32_inputs();
    if (p.dtype == DType::fp32) return in;
    if (!stored) stored = std::make_unique<StoredInputs>(p, in);
    return stored->get();
  }
  AttentionInputs fp32_inputs() {
    AttentionInputs in;
    in.q = q.ptr();
    in.k = k.ptr();
    in.v = v.ptr();
    in.out = out.ptr();
    in.mask = mask.numel() ? mask.ptr() : nullptr;
    in.key_padding = key_padding.numel() ? key_padding.ptr() : nullptr;
    in.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
    in.sink_logits = sinks.empty() ? nullptr : sinks.data();
    in.g = g.numel() ? g.ptr() : nullptr;
    in.beta = beta.numel() ? beta.ptr() : nullptr;
    in.index_q = index_q.numel() ? index_q.ptr() : nullptr;
    in.index_k = index_k.numel() ? index_k.ptr() : nullptr;
    in.index_w = index_w.numel() ? index_w.ptr() : nullptr;
    return in;
  }
  std::vector<float> slopes;  // ALiBi slopes given by the caller (empty: the defaults)
  std::vector<float> sinks;   // sink logits [heads] when the problem has them
  std::unique_ptr<StoredInputs> stored;
};

std::string fmt(double x) {
  std::ostringstream s;
  s.precision(3);
  s << x;
  return s.str();
}

// Describes the worst element for a failure message: index, expected, got.
std::string worst_element(const float* got, const double* want, std::size_t n, int64_t dim) {
  std::size_t worst = 0;
  double werr = -1;
  for (std::size_t e = 0; e < n; ++e) {
    double err = std::isfinite(got[e]) ? std::fabs(got[e] - want[e]) : INFINITY;
    if (err > werr) werr = err, worst = e;
  }
  std::ostringstream s;
  s << "worst at row " << worst / dim << " col " << worst % dim << ": expected " << want[worst] << ", got "
    << got[worst];
  return s.str();
}

class Checker {
 public:
  Checker(const Attention& v, const std::function<void(const CheckResult&)>& cb, CheckShard shard)
      : v_(v), cb_(cb), shard_(shard) {}
  std::vector<CheckResult> results;

  // Whether the next case is this shard's (every case method asks first).
  bool mine() { return case_++ % shard_.count == shard_.index; }

  void report(CheckResult r) {
    if (cb_) cb_(r);
    results.push_back(std::move(r));
  }

  // Skips with the variant's reasons when unsupported; returns false then.
  bool supported(const std::string& check, const Problem& p) {
    const std::string why = v_.unsupported_reasons_text(p);
    if (why.empty()) return true;
    report({check, p.repro(), CheckStatus::skipped, why});
    return false;
  }

  bool run(const Problem& p, CaseData& data, const std::string& check) {
    try {
      v_.run(p, data.inputs(p));
      return true;
    } catch (const std::exception& e) {
      report({check, p.repro(), CheckStatus::failed, std::string("forward threw: ") + e.what()});
      return false;
    }
  }

  // forward vs the variant's own fp64 oracle, with the derived tolerance.
  // `slopes`: ALiBi slopes to pass explicitly (empty: the defaults). For bf16 / fp16 problems the oracle
  // sees the rounded inputs (what the kernel was given), and the error must also stay within 2x that of
  // the baseline (naive) on the same rounded inputs: the FlashAttention test rule.
  void against_reference(const Problem& p, uint64_t seed, double logit_scale, const std::string& check,
                         const std::vector<float>& slopes = {}) {
    if (!mine() || !supported(check, p)) return;
    CaseData data(p, seed, logit_scale);
    data.slopes = slopes;
    if (!run(p, data, check)) return;
    DoubleArray want(data.out.shape);
    v_.reference_forward(p, data.inputs(p), want.ptr());
    const int64_t rows = p.batch * p.heads * p.seq_q;
    const ErrorMetrics m = compare_outputs(data.out.ptr(), want.ptr(), rows, p.value_dim());
    const double tol = v_.abs_tolerance(p, data.inputs(p));
    std::string detail =
        "max_abs_err " + fmt(m.max_abs_err) + " (bound " + fmt(tol) + "), rel_l2 " + fmt(m.rel_l2_err);
    if (p.dtype != DType::fp32 && v_.capabilities().exact && !v_.capabilities().baseline) {
      const Attention& base = Registry::instance().baseline();
      FloatArray base_out(data.out.shape);
      AttentionInputs bin = data.inputs(p);
      bin.out = base_out.ptr();
      base.run(p, bin);
      // A variant computing P V in 16-bit arithmetic (weight_dtype) is held to the baseline in that
      // arithmetic, as FlashAttention's test holds its kernel to the reference run in the same dtype: the
      // baseline's definition with its weights rounded likewise (computed in fp64 otherwise, so only the
      // weights' rounding counts; reference.hpp).
      const DType wt = v_.weight_dtype(p);
      if (wt != DType::fp32) {
        DoubleArray rounded(data.out.shape);
        reference_attention(p, data.inputs(p), rounded.ptr(), nullptr, wt);
        for (std::size_t e = 0; e < rounded.numel(); ++e)
          base_out.data[e] = static_cast<float>(rounded.data[e]);
      }
      const ErrorMetrics mb = compare_outputs(base_out.ptr(), want.ptr(), rows, p.value_dim());
      // 2x the baseline's error, plus 4 fp32 ulps of the largest |v| (2^-22 max|v|): on tiny problems the
      // baseline can be exact (one key: the output is that value), and a 1-ulp difference is no failure.
      double vmax = 0;
      for (float x : data.v.data) vmax = std::max(vmax, std::fabs(static_cast<double>(x)));
      const double limit = 2.0 * mb.max_abs_err + std::ldexp(vmax, -22);
      detail += "; " + base.name() +
                (wt != DType::fp32 ? " with " + std::string(dtype_name(wt)) + " weights" : "") +
                " on the same rounded inputs " + fmt(mb.max_abs_err) + " (limit " + fmt(limit) + ")";
      if (!(m.max_abs_err <= limit)) {
        report({check, p.repro(), CheckStatus::failed, detail + ": more than 2x the baseline's error"});
        return;
      }
    }
    if (m.nan_count || m.inf_count) {
      report({check, p.repro(), CheckStatus::failed,
              std::to_string(m.nan_count) + " NaN and " + std::to_string(m.inf_count) +
                  " Inf in the output; " +
                  worst_element(data.out.ptr(), want.ptr(), data.out.numel(), p.value_dim())});
    } else if (!(m.max_abs_err <= tol)) {
      report({check, p.repro(), CheckStatus::failed,
              detail + "; " + worst_element(data.out.ptr(), want.ptr(), data.out.numel(), p.value_dim())});
    } else {
      report({check, p.repro(), CheckStatus::passed, detail});
    }
  }

  // Permuting keys+values leaves the output unchanged; permuting queries permutes it.
  void permutation(const Problem& p, uint64_t seed) {
    const std::string check = "permutation";
    if (!mine()) return;
    if (!v_.capabilities().permutation_equivariant) {
      report({check, p.repro(), CheckStatus::skipped, "capabilities do not claim permutation equivariance"});
      return;
    }
    if (!supported(check, p)) return;
    CaseData base(p, seed), perm(p, seed);
    if (!run(p, base, check)) return;
    Rng rng(seed);
    auto shuffled = [&](int64_t n) {
      std::vector<int64_t> idx(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) idx[i] = i;
      for (int64_t i = n - 1; i > 0; --i) std::swap(idx[i], idx[static_cast<int64_t>(rng.next() % (i + 1))]);
      return idx;
    };
    const auto pq = shuffled(p.seq_q), pk = shuffled(p.seq_kv);
    const int64_t D = p.head_dim, Dv = p.value_dim();
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
      for (int64_t i = 0; i < p.seq_q; ++i)
        std::memcpy(&perm.q.data[(bh * p.seq_q + i) * D], &base.q.data[(bh * p.seq_q + pq[i]) * D], D * 4);
    for (int64_t bh = 0; bh < p.batch * p.num_kv_heads(); ++bh) {
      for (int64_t j = 0; j < p.seq_kv; ++j) {
        std::memcpy(&perm.k.data[(bh * p.seq_kv + j) * D], &base.k.data[(bh * p.seq_kv + pk[j]) * D], D * 4);
        std::memcpy(&perm.v.data[(bh * p.seq_kv + j) * Dv], &base.v.data[(bh * p.seq_kv + pk[j]) * Dv],
                    Dv * 4);
      }
    }
    if (!run(p, perm, check)) return;
    // Expected: perm.out[i] == base.out[pq[i]], up to summation order (keys are visited in another order).
    DoubleArray want(base.out.shape);
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t d = 0; d < Dv; ++d)
          want.data[(bh * p.seq_q + i) * Dv + d] = base.out.data[(bh * p.seq_q + pq[i]) * Dv + d];
    const ErrorMetrics m = compare_outputs(perm.out.ptr(), want.ptr(), p.batch * p.heads * p.seq_q, Dv);
    const double tol = 2 * v_.abs_tolerance(p, base.inputs(p));  // two fp32 results, each within the bound
    const bool ok = m.nan_count == 0 && m.max_abs_err <= tol;
    report({check, p.repro(), ok ? CheckStatus::passed : CheckStatus::failed,
            "max_abs_err " + fmt(m.max_abs_err) + " (bound " + fmt(tol) + ")"});
  }

  // Causal: changing keys/values/queries after position t leaves outputs 0..t bitwise... within tolerance.
  void causal_future(const Problem& p, uint64_t seed) {
    const std::string check = "causal-future";
    if (!mine() || !supported(check, p)) return;
    CaseData base(p, seed), changed(p, seed);
    if (!run(p, base, check)) return;
    const int64_t t = p.seq_q / 2, D = p.head_dim, Dv = p.value_dim();
    Rng rng(seed + 99);
    // Keys after t + causal_offset are hidden from rows 0..t (the offset is 0 for causal, positive for
    // lower-right with more keys than queries).
    const int64_t kfirst = std::clamp<int64_t>(t + 1 + causal_offset(p), 0, p.seq_kv);
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
      for (int64_t i = t + 1; i < p.seq_q; ++i)
        for (int64_t d = 0; d < D; ++d)
          changed.q.data[(bh * p.seq_q + i) * D + d] = 10.0f * (float)rng.normal();
    for (int64_t bh = 0; bh < p.batch * p.num_kv_heads(); ++bh) {
      for (int64_t j = kfirst; j < p.seq_kv; ++j) {
        for (int64_t d = 0; d < D; ++d)
          changed.k.data[(bh * p.seq_kv + j) * D + d] = 10.0f * (float)rng.normal();
        for (int64_t d = 0; d < Dv; ++d)
          changed.v.data[(bh * p.seq_kv + j) * Dv + d] = 1e3f * (float)rng.normal();
      }
    }
    if (!run(p, changed, check)) return;
    double worst = 0;
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
      for (int64_t i = 0; i <= t; ++i)
        for (int64_t d = 0; d < Dv; ++d) {
          const std::size_t e = static_cast<std::size_t>((bh * p.seq_q + i) * Dv + d);
          worst = std::max(worst, std::isfinite(changed.out.data[e])
                                      ? (double)std::fabs(changed.out.data[e] - base.out.data[e])
                                      : INFINITY);
        }
    const double tol = 2 * v_.abs_tolerance(p, base.inputs(p));
    report({check, p.repro(), worst <= tol ? CheckStatus::passed : CheckStatus::failed,
            "rows 0.." + std::to_string(t) + " moved by " + fmt(worst) + " (bound " + fmt(tol) +
                ") after changing every later position"});
  }

  // The same call twice, and at 1 and 2 threads, gives bitwise identical output.
  void determinism(const Problem& p, uint64_t seed) {
    const std::string check = "determinism";
    if (!mine() || !supported(check, p)) return;
    CaseData one(p, seed), two(p, seed), again(p, seed);
    {
      ThreadScope scope(1);
      if (!run(p, one, check)) return;
    }
    {
      ThreadScope scope(2);
      if (!run(p, two, check) || !run(p, again, check)) return;
    }
    const std::size_t bytes = one.out.numel() * sizeof(float);
    const bool same_threads = std::memcmp(one.out.ptr(), two.out.ptr(), bytes) == 0;
    const bool same_run = std::memcmp(two.out.ptr(), again.out.ptr(), bytes) == 0;
    report({check, p.repro(), same_threads && same_run ? CheckStatus::passed : CheckStatus::failed,
            std::string("1 vs 2 threads ") + (same_threads ? "bitwise equal" : "DIFFER") + ", repeat " +
                (same_run ? "bitwise equal" : "DIFFERS")});
  }

  // ---- Backward ----

  bool backward_supported(const std::string& check, const Problem& p) {
    const std::string why = v_.backward_unsupported_reasons_text(p);
    if (why.empty()) return true;
    report({check, p.repro(), CheckStatus::skipped, why});
    return false;
  }

  // One training step on `data`: the saving forward (its O must equal run()'s bitwise: training and
  // inference forwards are one computation), then the backward with `d_out`. Fills out, dq, dk, dv.
  struct Grads {
    FloatArray out, dq, dk, dv, d_sink;  // d_sink: [heads] when the problem has sink logits
  };
  bool train(const Problem& p, CaseData& data, const FloatArray& d_out, Grads& gr, const std::string& check,
             const Attention& variant) {
    try {
      AttentionInputs in = data.inputs(p);
      gr.out = FloatArray(data.out.shape, std::nanf(""));
      in.out = gr.out.ptr();
      std::vector<float> saved(variant.saved_floats(p), std::nanf(""));
      variant.run_saving(p, in, saved.empty() ? nullptr : saved.data());
      gr.dq = FloatArray(data.q.shape, std::nanf(""));
      gr.dk = FloatArray(data.k.shape, std::nanf(""));
      gr.dv = FloatArray(data.v.shape, std::nanf(""));
      GradientArgs g;
      g.out = gr.out.ptr();
      g.saved = saved.empty() ? nullptr : saved.data();
      g.d_out = d_out.ptr();
      g.dq = gr.dq.ptr(), g.dk = gr.dk.ptr(), g.dv = gr.dv.ptr();
      if (p.sinks) {
        gr.d_sink = FloatArray({p.heads}, std::nanf(""));
        g.d_sink_logits = gr.d_sink.ptr();
      }
      variant.run_backward(p, in, g);
      return true;
    } catch (const std::exception& e) {
      report({check, p.repro(), CheckStatus::failed, variant.name() + " training step threw: " + e.what()});
      return false;
    }
  }

  static FloatArray make_d_out(const Problem& p, uint64_t seed) {
    FloatArray d({p.batch, p.heads, p.seq_q, p.value_dim()});
    fill_normal(d.ptr(), d.numel(), seed * 3 + 7);
    return d;
  }

  // backward vs the variant's fp64 gradient (reference_backward) with grad_tolerance, for dq, dk, dv; the
  // saving forward's O bitwise equal to run()'s; exact non-baseline variants also within 2x the baseline's
  // norm-wise gradient error on the same inputs (the FlashAttention rule).
  void gradient(const Problem& p, uint64_t seed, double logit_scale, const std::string& check,
                const std::vector<float>& slopes = {}) {
    if (!mine() || !backward_supported(check, p)) return;
    CaseData data(p, seed, logit_scale);
    data.slopes = slopes;
    if (!run(p, data, check)) return;
    const FloatArray d_out = make_d_out(p, seed);
    Grads gr;
    if (!train(p, data, d_out, gr, check, v_)) return;
    if (std::memcmp(gr.out.ptr(), data.out.ptr(), data.out.numel() * sizeof(float)) != 0) {
      report({check, p.repro(), CheckStatus::failed,
              "the training forward's O differs from run()'s (they must be bitwise equal)"});
      return;
    }
    const AttentionInputs in = data.inputs(p);
    DoubleArray wq(data.q.shape), wk(data.k.shape), wv(data.v.shape);
    v_.reference_backward(p, in, d_out.ptr(), wq.ptr(), wk.ptr(), wv.ptr());
    const GradientTolerance tol = v_.grad_tolerance(p, in, d_out.ptr());
    struct Part {
      const char* name;
      const FloatArray& got;
      const DoubleArray& want;
      double tol;
      int64_t width;  // the tensor's last extent: head_dim, or d_v for dv
    };
    const Part parts[] = {{"dq", gr.dq, wq, tol.dq, p.head_dim},
                          {"dk", gr.dk, wk, tol.dk, p.head_dim},
                          {"dv", gr.dv, wv, tol.dv, p.value_dim()}};
    ErrorMetrics m[3];
    std::string detail;
    for (int i = 0; i < 3; ++i) {
      const Part& pt = parts[i];
      m[i] = compare_outputs(pt.got.ptr(), pt.want.ptr(), static_cast<int64_t>(pt.got.numel() / pt.width),
                             pt.width);
      detail += std::string(i ? "; " : "") + pt.name + " max_abs_err " + fmt(m[i].max_abs_err) + " (bound " +
                fmt(pt.tol) + ")";
    }
    for (int i = 0; i < 3; ++i) {
      const Part& pt = parts[i];
      if (m[i].nan_count || m[i].inf_count || !(m[i].max_abs_err <= pt.tol)) {
        report({check, p.repro(), CheckStatus::failed,
                detail + "; " + pt.name + ": " + std::to_string(m[i].nan_count) + " NaN, " +
                    std::to_string(m[i].inf_count) + " Inf, " +
                    worst_element(pt.got.ptr(), pt.want.ptr(), pt.got.numel(), pt.width)});
        return;
      }
    }
    if (p.sinks && !sink_gradient_ok(p, in, d_out, gr, tol, check, detail)) return;
    if (v_.capabilities().exact && !v_.capabilities().baseline) {
      const Attention& base = Registry::instance().baseline();
      if (v_.weight_dtype(p) != DType::fp32) {
        // Weights rounded to 16 bits in the forward (weight_dtype): its O and saved normaliser carry that
        // rounding into every gradient, which no baseline computes in the same arithmetic; the bound above
        // (grad_tolerance) includes it, and the backward's own arithmetic is fp32, held to the rule on the
        // fp32 cases.
        detail += "; 2x-baseline rule not applied (" + std::string(dtype_name(v_.weight_dtype(p))) +
                  " weights in the forward)";
      } else if (base.backward_unsupported_reasons_text(p).empty()) {
        Grads bg;
        if (!train(p, data, d_out, bg, check, base)) return;
        const FloatArray* base_parts[] = {&bg.dq, &bg.dk, &bg.dv};
        for (int i = 0; i < 3; ++i) {
          const Part& pt = parts[i];
          const ErrorMetrics mb = compare_outputs(base_parts[i]->ptr(), pt.want.ptr(),
                                                  static_cast<int64_t>(pt.got.numel() / pt.width), pt.width);
          // The rule on the norm-wise error, plus 2^-22 relative: at these sizes both gradients sit a few
          // ulps from fp64, where the largest single-element error of two correct implementations differs by
          // 1.5-2.2x from seed to seed (measured for tiled vs naive over 20 seeds), while the norm-wise
          // error, summed over every element, is stable (ratio 0.8-1.5). A systematically less accurate
          // algorithm shows in it; noise does not.
          const double limit = 2.0 * mb.rel_l2_err + std::ldexp(1.0, -22);
          if (!(m[i].rel_l2_err <= limit)) {
            report({check, p.repro(), CheckStatus::failed,
                    detail + "; " + pt.name + " rel_l2 " + fmt(m[i].rel_l2_err) + " is more than 2x " +
                        base.name() + "'s " + fmt(mb.rel_l2_err) + " (limit " + fmt(limit) + ")"});
            return;
          }
        }
        detail += "; rel_l2 within 2x " + base.name() + "'s";
      }
    }
    report({check, p.repro(), CheckStatus::passed, detail});
  }

  // d sink logits against reference_gradients' fp64 ones, within grad_tolerance's d_sink_logits.
  bool sink_gradient_ok(const Problem& p, const AttentionInputs& in, const FloatArray& d_out, const Grads& gr,
                        const GradientTolerance& tol, const std::string& check, std::string& detail) {
    std::vector<double> want(static_cast<std::size_t>(p.heads));
    Fp64Gradients fg;
    fg.d_sink_logits = want.data();
    v_.reference_gradients(p, in, d_out.ptr(), fg);
    double worst = 0;
    int64_t at = 0;
    bool finite = true;
    for (int64_t h = 0; h < p.heads; ++h) {
      const double e = std::fabs(static_cast<double>(gr.d_sink.data[h]) - want[h]);
      finite = finite && std::isfinite(gr.d_sink.data[h]);
      if (e > worst) worst = e, at = h;
    }
    detail += "; d_sink max_abs_err " + fmt(worst) + " (bound " + fmt(tol.d_sink_logits) + ")";
    if (finite && worst <= tol.d_sink_logits) return true;
    report({check, p.repro(), CheckStatus::failed,
            detail + "; d_sink[" + std::to_string(at) + "] = " + fmt(gr.d_sink.data[at]) + ", fp64 " +
                fmt(want[at])});
    return false;
  }

  // The backward twice and at 1 and 2 threads: bitwise identical gradients.
  void gradient_determinism(const Problem& p, uint64_t seed) {
    const std::string check = "grad-determinism";
    if (!mine() || !backward_supported(check, p)) return;
    CaseData data(p, seed);
    const FloatArray d_out = make_d_out(p, seed);
    Grads one, two, again;
    {
      ThreadScope scope(1);
      if (!train(p, data, d_out, one, check, v_)) return;
    }
    {
      ThreadScope scope(2);
      if (!train(p, data, d_out, two, check, v_) || !train(p, data, d_out, again, check, v_)) return;
    }
    auto same = [](const Grads& a, const Grads& b) {
      auto eq = [](const FloatArray& x, const FloatArray& y) {
        return x.numel() == y.numel() &&
               (x.numel() == 0 || std::memcmp(x.ptr(), y.ptr(), x.numel() * sizeof(float)) == 0);
      };
      return eq(a.dq, b.dq) && eq(a.dk, b.dk) && eq(a.dv, b.dv) && eq(a.d_sink, b.d_sink);
    };
    const bool threads_ok = same(one, two), repeat_ok = same(two, again);
    report({check, p.repro(), threads_ok && repeat_ok ? CheckStatus::passed : CheckStatus::failed,
            std::string("dq, dk, dv at 1 vs 2 threads ") + (threads_ok ? "bitwise equal" : "DIFFER") +
                ", repeat " + (repeat_ok ? "bitwise equal" : "DIFFERS")});
  }

  // reference_gradients' d sink logits against Richardson-extrapolated central differences of
  // reference_forward in each head's sink: the worst error relative to the largest |d sink|.
  double sink_definition_error(const Problem& p, CaseData& data, const FloatArray& d_out) {
    std::vector<double> want(static_cast<std::size_t>(p.heads));
    Fp64Gradients fg;
    fg.d_sink_logits = want.data();
    AttentionInputs in = data.inputs(p);
    v_.reference_gradients(p, in, d_out.ptr(), fg);
    std::vector<float> sinks = data.sinks;
    in.sink_logits = sinks.data();
    DoubleArray o(data.out.shape);
    auto loss = [&] {
      v_.reference_forward(p, in, o.ptr());
      double l = 0;
      for (std::size_t e = 0; e < o.numel(); ++e) l += static_cast<double>(d_out.data[e]) * o.data[e];
      return l;
    };
    // The actual fp32 step (s + h) - (s - h) is the denominator, so rounding the perturbed sink costs
    // nothing.
    auto central = [&](int64_t h, float step) {
      const float s0 = sinks[h], up = s0 + step, down = s0 - step;
      sinks[h] = up;
      const double lu = loss();
      sinks[h] = down;
      const double ld = loss();
      sinks[h] = s0;
      return (lu - ld) / (static_cast<double>(up) - down);
    };
    double scale = 0, worst = 0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (int64_t h = 0; h < p.heads; ++h) {
      const double fd = (4.0 * central(h, 0x1p-11f) - central(h, 0x1p-10f)) / 3.0;
      worst = std::max(worst, std::fabs(fd - want[h]) / std::max(scale, 1e-300));
    }
    return worst;
  }

  // reference_backward against central differences of reference_forward (check_reference_gradient): the
  // fp64 gradient the other backward checks trust is itself the derivative of the definition.
  void gradient_definition(const Problem& p, uint64_t seed) {
    const std::string check = "grad-definition";
    if (!mine() || !backward_supported(check, p)) return;
    CaseData data(p, seed);
    const FloatArray d_out = make_d_out(p, seed);
    try {
      const DirectionalCheck r = check_reference_gradient(v_, p, data.inputs(p), d_out.ptr(), 3, seed);
      // Richardson-extrapolated central differences of exact fp32 perturbations agree with a correct gradient
      // to O(h^4) ~ 1e-10 (h = 2^-10 against unit-scale inputs) plus fp64 rounding amplified by 1/h; 1e-6
      // leaves room for curvature while any formula error of 1e-6 of the gradient's size fails.
      bool ok = r.worst_rel <= 1e-6;
      std::string detail = "central difference " + fmt(r.fd) + " vs <reference_backward, U> " +
                           fmt(r.analytic) + ", relative " + fmt(r.worst_rel) + " (bound 1e-06) over " +
                           std::to_string(r.directions) + " directions";
      if (p.sinks) {
        const double worst = sink_definition_error(p, data, d_out);
        ok = ok && worst <= 1e-6;
        detail += "; d sink logits vs central differences: relative " + fmt(worst) + " (bound 1e-06)";
      }
      report({check, p.repro(), ok ? CheckStatus::passed : CheckStatus::failed, detail});
    } catch (const std::exception& e) {
      report({check, p.repro(), CheckStatus::failed, std::string("threw: ") + e.what()});
    }
  }

 private:
  const Attention& v_;
  const std::function<void(const CheckResult&)>& cb_;
  CheckShard shard_;
  int64_t case_ = 0;
};

struct Shape {
  int64_t batch, heads, seq_q, seq_kv, head_dim;
};

// Forward vs the oracle over sizes that hit SIMD and tile tails and every mask kind; cross-attention both
// ways, an overridden scale, dropout.
void run_shape_checks(Checker& c, const Problem& base, uint64_t& seed) {
  // Sizes that hit SIMD and tile tails: 1, 7, 17, 130; head dims 1, 17, 33 and 64.
  const Shape shapes[] = {
      {1, 1, 1, 1, 1}, {1, 2, 7, 7, 17}, {2, 3, 17, 17, 8}, {4, 2, 33, 33, 64}, {1, 1, 130, 130, 33}};
  const char* masks[] = {"none", "causal", "bool", "pad", "causal+pad", "causal+bool+pad"};
  for (const Shape& s : shapes) {
    for (const char* mask : masks) {
      Problem p = base;
      p.batch = s.batch, p.heads = s.heads, p.seq_q = s.seq_q, p.seq_kv = s.seq_kv, p.head_dim = s.head_dim;
      p.mask = parse_mask(mask, "check");
      c.against_reference(p, ++seed, 1.0, "reference");
    }
  }
  // Cross-attention (seq_q != seq_kv, both ways), an overridden scale, dropout.
  for (const char* mask : {"none", "pad", "causal"}) {
    for (auto [lq, lkv] : {std::pair<int64_t, int64_t>{7, 19}, {33, 5}}) {
      Problem p = base;
      p.batch = 2, p.heads = 2, p.seq_q = lq, p.seq_kv = lkv, p.head_dim = 16;
      p.mask = parse_mask(mask, "check");
      c.against_reference(p, ++seed, 1.0, "cross");
    }
  }
  {
    Problem p = base;
    p.batch = 1, p.heads = 2, p.seq_q = p.seq_kv = 40, p.head_dim = 24, p.scale = 0.3;
    c.against_reference(p, ++seed, 1.0, "scale");
    p.scale.reset();
    p.dropout = 0.25, p.seed = 1234;
    c.against_reference(p, ++seed, 1.0, "dropout");
    p.mask.causal = true;
    c.against_reference(p, ++seed, 1.0, "dropout");
  }
}

// Logits near the exp overflow point, grouped-query heads, lower-right causal, decode.
void run_edge_checks(Checker& c, const Problem& base, uint64_t& seed) {
  // Logits near +-88 (the fp32 exp overflow point): q, k scaled so |scale * q.k| reaches ~90.
  {
    Problem p = base;
    p.batch = 1, p.heads = 2, p.seq_q = p.seq_kv = 65, p.head_dim = 16;
    for (const char* mask : {"none", "causal"}) {
      p.mask = parse_mask(mask, "check");
      c.against_reference(p, ++seed, 4.6, "large-logits");
    }
  }
  // Grouped-query attention: kv_heads = heads, heads / 2 and 1, and an odd group (6 query heads on 3 K/V
  // heads), with every mask kind; query head h must read K/V head h / (heads / kv_heads).
  {
    const char* gqa_masks[] = {"none", "causal",          "causal_lower_right",    "bool",
                               "pad",  "causal+bool+pad", "causal_lower_right+pad"};
    for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {4, 1}, {6, 3}}) {
      for (const char* mask : gqa_masks) {
        Problem p = base;
        p.batch = 2, p.heads = heads, p.kv_heads = kv_heads, p.seq_q = p.seq_kv = 19, p.head_dim = 12;
        p.mask = parse_mask(mask, "check");
        c.against_reference(p, ++seed, 1.0, "gqa");
      }
    }
  }
  // Lower-right causal (j <= i + seq_kv - seq_q) with fewer queries than keys (the decode shape, down to
  // one query) and more (the first seq_q - seq_kv rows see no key and must be zeros), alone and with
  // padding, a boolean mask, upper-left causal and grouped-query heads.
  for (const char* mask : {"causal_lower_right", "causal_lower_right+pad", "causal_lower_right+bool",
                           "causal+causal_lower_right"}) {
    for (auto [lq, lkv] : {std::pair<int64_t, int64_t>{5, 37}, {1, 300}, {37, 5}, {4, 4}}) {
      Problem p = base;
      p.batch = 2, p.heads = 4, p.kv_heads = 2, p.seq_q = lq, p.seq_kv = lkv, p.head_dim = 16;
      p.mask = parse_mask(mask, "check");
      c.against_reference(p, ++seed, 1.0, "lower-right");
    }
  }
  {
    // Decode: one query per head against a long KV cache, multi-query (the split-KV path of tiled) and
    // one K/V head per query head.
    for (int64_t kv_heads : {1, 4}) {
      Problem p = base;
      p.batch = 1, p.heads = 4, p.kv_heads = kv_heads, p.seq_q = 1, p.seq_kv = 2500, p.head_dim = 32;
      p.mask = parse_mask("causal_lower_right", "check");
      c.against_reference(p, ++seed, 1.0, "decode");
      c.determinism(p, ++seed);
    }
  }
}

// bf16 / fp16 storage and the ALiBi bias.
void run_storage_checks(Checker& c, const Problem& base, uint64_t& seed) {
  // Storage precisions: bf16 and fp16 inputs (the oracle on the rounded values), on the GEMM tiles (head
  // dims 64 and 32, even: tiled's vdpbf16ps path where the CPU has it), an odd head_dim (converted), masks,
  // grouped-query heads and the decode shape (dot-product kernels, split-KV).
  for (DType t : {DType::bf16, DType::fp16}) {
    struct DtypeCase {
      Shape s;
      int64_t kv_heads;
      const char* mask;
    };
    const DtypeCase cases[] = {{{1, 2, 7, 7, 17}, 0, "none"},
                               {{2, 3, 33, 33, 64}, 0, "none"},
                               {{2, 3, 33, 33, 64}, 0, "causal+pad"},
                               {{1, 4, 130, 130, 32}, 2, "causal"},
                               {{1, 4, 1, 600, 32}, 1, "causal_lower_right"},
                               {{2, 2, 40, 40, 24}, 0, "bool"}};
    for (const DtypeCase& dc : cases) {
      Problem p = base;
      p.batch = dc.s.batch, p.heads = dc.s.heads, p.kv_heads = dc.kv_heads, p.seq_q = dc.s.seq_q,
      p.seq_kv = dc.s.seq_kv, p.head_dim = dc.s.head_dim;
      p.mask = parse_mask(dc.mask, "check");
      p.dtype = t;
      c.against_reference(p, ++seed, 1.0, "dtype");
    }
  }
  // ALiBi: default slopes for a power-of-two and an odd head count, given slopes, every causal alignment
  // (cross shapes both ways), padding, grouped-query heads, decode, and with bf16 storage.
  {
    struct AlibiCase {
      Shape s;
      int64_t kv_heads;
      const char* mask;
      bool given_slopes;
      DType dtype;
    };
    const AlibiCase cases[] = {
        {{2, 8, 33, 33, 16}, 0, "none", false, DType::fp32},
        {{2, 3, 33, 33, 16}, 0, "causal", false, DType::fp32},
        {{1, 4, 19, 19, 12}, 2, "causal+pad", false, DType::fp32},
        {{1, 4, 130, 130, 32}, 0, "none", true, DType::fp32},
        {{2, 4, 5, 37, 16}, 2, "causal_lower_right", false, DType::fp32},
        {{2, 4, 37, 5, 16}, 0, "causal_lower_right", false, DType::fp32},
        {{2, 2, 7, 19, 16}, 0, "none", false, DType::fp32},
        {{1, 4, 1, 600, 32}, 1, "causal_lower_right", false, DType::fp32},
        {{1, 4, 130, 130, 64}, 0, "causal", false, DType::bf16},
        {{1, 2, 33, 33, 17}, 0, "none", true, DType::fp16},
    };
    for (const AlibiCase& ac : cases) {
      Problem p = base;
      p.batch = ac.s.batch, p.heads = ac.s.heads, p.kv_heads = ac.kv_heads, p.seq_q = ac.s.seq_q,
      p.seq_kv = ac.s.seq_kv, p.head_dim = ac.s.head_dim;
      p.mask = parse_mask(ac.mask, "check");
      p.bias = Bias::alibi;
      p.dtype = ac.dtype;
      std::vector<float> slopes;
      for (int64_t h = 0; ac.given_slopes && h < p.heads; ++h) slopes.push_back(0.05f + 0.3f * (float)h);
      c.against_reference(p, ++seed, 1.0, "alibi", slopes);
    }
  }
}

// Logit soft-capping and learned sink logits (capabilities softcap, sinks), alone and together: every mask
// kind (row 0 of "bool" fully masked: the sink is the whole denominator), large logits that the cap bends
// (std 4.6: |s| up to ~20 against C = 5), grouped-query heads, cross and decode shapes, ALiBi, bf16.
void run_logit_checks(Checker& c, const Problem& base, uint64_t& seed) {
  struct LogitCase {
    Shape s;
    int64_t kv_heads;
    const char* mask;
    double cap;  // 0: no softcap
    bool sinks;
    double logit_scale;
    DType dtype;
    bool alibi;
  };
  const LogitCase cases[] = {
      {{2, 3, 33, 33, 16}, 0, "none", 5.0, false, 4.6, DType::fp32, false},
      {{1, 4, 130, 130, 32}, 2, "causal+pad", 5.0, false, 4.6, DType::fp32, false},
      {{2, 2, 7, 19, 16}, 0, "causal_lower_right", 30.0, false, 1.0, DType::fp32, false},
      {{1, 4, 1, 600, 32}, 1, "causal_lower_right", 5.0, false, 4.6, DType::fp32, false},
      {{2, 3, 33, 33, 16}, 0, "none", 0.0, true, 1.0, DType::fp32, false},
      {{4, 2, 40, 40, 24}, 0, "causal+bool+pad", 0.0, true, 1.0, DType::fp32, false},
      {{1, 4, 130, 130, 32}, 2, "causal", 0.0, true, 4.6, DType::fp32, false},
      {{1, 4, 1, 600, 32}, 1, "causal_lower_right", 0.0, true, 1.0, DType::fp32, false},
      {{2, 4, 33, 33, 16}, 2, "causal+pad", 5.0, true, 4.6, DType::fp32, true},
      {{1, 4, 130, 130, 64}, 0, "causal", 5.0, true, 1.0, DType::bf16, false},
  };
  for (const LogitCase& lc : cases) {
    Problem p = base;
    p.batch = lc.s.batch, p.heads = lc.s.heads, p.kv_heads = lc.kv_heads, p.seq_q = lc.s.seq_q,
    p.seq_kv = lc.s.seq_kv, p.head_dim = lc.s.head_dim;
    p.mask = parse_mask(lc.mask, "check");
    if (lc.cap > 0) p.softcap = lc.cap;
    p.sinks = lc.sinks;
    p.dtype = lc.dtype;
    if (lc.alibi) p.bias = Bias::alibi;
    c.against_reference(p, ++seed, lc.logit_scale,
                        lc.sinks ? (lc.cap > 0 ? "sinks+softcap" : "sinks") : "softcap");
  }
}

// Permutation equivariance, causal future-independence, bitwise determinism.
void run_property_checks(Checker& c, const Problem& base, uint64_t& seed) {
  {
    Problem p = base;
    p.batch = 2, p.heads = 2, p.seq_q = p.seq_kv = 37, p.head_dim = 20;
    c.permutation(p, ++seed);
    p.heads = 4, p.kv_heads = 2;
    c.permutation(p, ++seed);
    p.heads = 2, p.kv_heads = 0;
    p.mask.causal = true;
    c.causal_future(p, ++seed);
    p.mask.causal = false;
    p.mask.causal_lower_right = true;
    p.seq_q = 20, p.heads = 4, p.kv_heads = 1;
    c.causal_future(p, ++seed);
    p.mask.causal_lower_right = false;
    p.heads = 2, p.kv_heads = 0, p.seq_q = 37;
    p.batch = 1, p.heads = 3, p.seq_q = p.seq_kv = 300;
    c.determinism(p, ++seed);
  }
}

// V (and the output) of another width than Q and K (Capabilities::value_dim; others skip with the
// reason): narrower and wider than head_dim, odd widths against SIMD tails, every mask kind the variant
// takes, grouped-query heads, cross and decode shapes, its gradients and their definition.
void run_value_dim_checks(Checker& c, const Problem& base, uint64_t& seed) {
  struct Case {
    Shape s;
    int64_t kv_heads, v_head_dim;
    const char* mask;
  };
  const Case cases[] = {
      {{1, 2, 7, 7, 16}, 0, 24, "none"},       {{2, 3, 17, 17, 32}, 0, 8, "causal"},
      {{1, 2, 130, 130, 20}, 0, 33, "causal"}, {{2, 4, 19, 19, 12}, 2, 40, "causal+pad"},
      {{2, 2, 7, 19, 16}, 0, 5, "none"},       {{1, 4, 1, 300, 24}, 1, 16, "causal_lower_right"}};
  for (const Case& x : cases) {
    Problem p = base;
    p.batch = x.s.batch, p.heads = x.s.heads, p.kv_heads = x.kv_heads, p.seq_q = x.s.seq_q,
    p.seq_kv = x.s.seq_kv, p.head_dim = x.s.head_dim, p.v_head_dim = x.v_head_dim;
    p.mask = parse_mask(x.mask, "check");
    c.against_reference(p, ++seed, 1.0, "value-dim");
    c.gradient(p, ++seed, 1.0, "grad-value-dim");
  }
  Problem p = base;
  p.batch = 1, p.heads = 2, p.seq_q = p.seq_kv = 9, p.head_dim = 6, p.v_head_dim = 3;
  p.mask = parse_mask("causal", "check");
  c.gradient_definition(p, ++seed);
}

// The backward checks (capabilities().backward): fp32 gradients against reference_backward over the mask,
// shape, cross, grouped-query, dropout, ALiBi, large-logit, storage and decode cases (a smaller set than
// the forward's: every kernel path, not every combination), bitwise determinism, and reference_backward
// itself against central differences of reference_forward.
void run_gradient_checks(Checker& c, const Problem& base, uint64_t& seed) {
  auto shaped = [&](Shape s, int64_t kv_heads, const char* mask) {
    Problem p = base;
    p.batch = s.batch, p.heads = s.heads, p.kv_heads = kv_heads, p.seq_q = s.seq_q, p.seq_kv = s.seq_kv,
    p.head_dim = s.head_dim;
    p.mask = parse_mask(mask, "check");
    return p;
  };
  const Shape shapes[] = {{1, 1, 1, 1, 1}, {1, 2, 7, 7, 17}, {2, 3, 17, 17, 8}, {1, 1, 130, 130, 33}};
  for (const Shape& s : shapes)
    for (const char* mask : {"none", "causal", "bool", "pad", "causal+bool+pad"})
      c.gradient(shaped(s, 0, mask), ++seed, 1.0, "grad");
  for (const char* mask : {"none", "causal"})
    for (auto [lq, lkv] : {std::pair<int64_t, int64_t>{7, 19}, {33, 5}})
      c.gradient(shaped({2, 2, lq, lkv, 16}, 0, mask), ++seed, 1.0, "grad-cross");
  for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{4, 2}, {6, 3}})
    for (const char* mask : {"causal", "bool", "causal_lower_right+pad"})
      c.gradient(shaped({2, heads, 19, 19, 12}, kv_heads, mask), ++seed, 1.0, "grad-gqa");
  for (auto [lq, lkv] : {std::pair<int64_t, int64_t>{5, 37}, {37, 5}})
    c.gradient(shaped({2, 4, lq, lkv, 16}, 2, "causal_lower_right"), ++seed, 1.0, "grad-lower-right");
  {
    Problem p = shaped({1, 2, 40, 40, 24}, 0, "none");
    p.scale = 0.3;
    c.gradient(p, ++seed, 1.0, "grad-scale");
    p.scale.reset();
    p.dropout = 0.25, p.seed = 1234;
    c.gradient(p, ++seed, 1.0, "grad-dropout");
    p.mask.causal = true;
    c.gradient(p, ++seed, 1.0, "grad-dropout");
  }
  for (const char* mask : {"none", "causal"})
    c.gradient(shaped({1, 2, 65, 65, 16}, 0, mask), ++seed, 4.6, "grad-large-logits");
  {
    Problem p = shaped({2, 4, 33, 33, 16}, 2, "causal+pad");
    p.bias = Bias::alibi;
    c.gradient(p, ++seed, 1.0, "grad-alibi");
    p = shaped({2, 2, 7, 19, 16}, 0, "none");
    p.bias = Bias::alibi;
    c.gradient(p, ++seed, 1.0, "grad-alibi", {0.25f, 0.5f});
  }
  for (DType t : {DType::bf16, DType::fp16}) {
    Problem p = shaped({1, 4, 130, 130, 32}, 2, "causal");
    p.dtype = t;
    c.gradient(p, ++seed, 1.0, "grad-dtype");
  }
  c.gradient(shaped({1, 4, 1, 600, 32}, 1, "causal_lower_right"), ++seed, 1.0, "grad-decode");
  {
    // Soft-capping (large logits: the cap's derivative 1 - (s/C)^2 far from 1) and sink logits, apart and
    // together with dropout and ALiBi, grouped-query heads, a fully masked row and a decode row.
    Problem p = shaped({1, 2, 65, 65, 16}, 0, "causal");
    p.softcap = 5.0;
    c.gradient(p, ++seed, 4.6, "grad-softcap");
    p = shaped({2, 4, 19, 19, 12}, 2, "bool");
    p.softcap = 5.0;
    c.gradient(p, ++seed, 4.6, "grad-softcap");
    p = shaped({4, 2, 40, 40, 24}, 0, "causal+bool+pad");
    p.sinks = true;
    c.gradient(p, ++seed, 1.0, "grad-sinks");
    p = shaped({1, 4, 1, 600, 32}, 1, "causal_lower_right");
    p.sinks = true;
    c.gradient(p, ++seed, 1.0, "grad-sinks");
    p = shaped({2, 4, 33, 33, 16}, 2, "causal+pad");
    p.sinks = true, p.softcap = 5.0, p.bias = Bias::alibi, p.dropout = 0.25, p.seed = 99;
    c.gradient(p, ++seed, 4.6, "grad-sinks+softcap");
  }
  c.gradient_determinism(shaped({1, 3, 300, 300, 64}, 0, "causal"), ++seed);
  c.gradient_determinism(shaped({2, 4, 150, 150, 24}, 2, "pad"), ++seed);
  {
    Problem p = shaped({1, 3, 300, 300, 64}, 0, "causal");
    p.sinks = true, p.softcap = 5.0;
    c.gradient_determinism(p, ++seed);
  }
  // reference_backward is the derivative of reference_forward: small problems (each direction costs four
  // fp64 forwards), every mask kind, grouped-query heads, cross shapes, dropout, ALiBi.
  c.gradient_definition(shaped({1, 2, 7, 7, 5}, 0, "none"), ++seed);
  c.gradient_definition(shaped({2, 2, 9, 9, 4}, 0, "causal+pad"), ++seed);
  c.gradient_definition(shaped({1, 1, 9, 9, 6}, 0, "bool"), ++seed);
  c.gradient_definition(shaped({1, 4, 6, 6, 3}, 2, "causal_lower_right"), ++seed);
  c.gradient_definition(shaped({1, 2, 5, 8, 4}, 0, "none"), ++seed);
  {
    Problem p = shaped({1, 2, 8, 8, 4}, 0, "causal");
    p.dropout = 0.3, p.seed = 77;
    c.gradient_definition(p, ++seed);
    p.dropout = 0;
    p.bias = Bias::alibi;
    c.gradient_definition(p, ++seed);
    p.bias = Bias::none;
    p.softcap = 2.0;
    c.gradient_definition(p, ++seed);
    p.softcap.reset();
    p.sinks = true;
    p.mask = parse_mask("causal+bool+pad", "check");
    c.gradient_definition(p, ++seed);
  }
}

}  // namespace

std::vector<CheckResult> run_checks(const Attention& variant,
                                    const std::function<void(const CheckResult&)>& on_result,
                                    CheckShard shard) {
  if (shard.count < 1 || shard.index < 0 || shard.index >= shard.count)
    throw std::invalid_argument("check shard " + std::to_string(shard.index) + "/" +
                                std::to_string(shard.count) +
                                ": the index must be in [0, count) and count >= 1");
  Checker c(variant, on_result, shard);
  uint64_t seed = 1;
  for (const Json& params : variant.test_param_sets()) {
    const Problem base = make_problem(variant.name(), params);
    run_shape_checks(c, base, seed);
    run_edge_checks(c, base, seed);
    run_storage_checks(c, base, seed);
    run_logit_checks(c, base, seed);
    run_property_checks(c, base, seed);
    run_gradient_checks(c, base, seed);
    run_value_dim_checks(c, base, seed);
  }
  return std::move(c.results);
}

}  // namespace attn
