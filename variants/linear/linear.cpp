// linear: kernelised attention (Katharopoulos et al. 2020), φ(Q)(φ(K)ᵀV) / (φ(Q)(φ(K)ᵀ1) + eps) in O(n·d²)
// time by associativity; causal runs in chunks with a running d×d state. The engine is shared with performer
// (common/kernels/feature_attention.hpp); this file is the feature map (m = d, elementwise) and the
// parameters.
#include <algorithm>
#include <cmath>

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/feature_attention.hpp"
#include "common/kernels/vmath.hpp"
#include "common/support/error.hpp"

namespace attn {
namespace {

enum class FeatureKind { elu, relu };

FeatureKind feature_kind_of(const Problem& p) {
  return p.param_string("feature_map") == "relu" ? FeatureKind::relu : FeatureKind::elu;
}

// φ applied elementwise (m = d), one vectorised pass on the selected SIMD target (common/kernels/vmath.hpp).
// elu(x) + 1 is x + 1 for x > 0 and exp(x) for x <= 0 (so φ > 0 always); relu(x) = max(x, 0) can be 0 for a
// whole row, which eps then guards. A NaN input stays NaN in both.
class ElementwiseMap final : public FeatureMap {
 public:
  ElementwiseMap(FeatureKind kind, int64_t head_dim) : kind_(kind), head_dim_(head_dim) {}
  int64_t features() const override { return head_dim_; }
  void queries(const FeatureRows& rows, float* dst, float*) const override { apply(rows, dst); }
  void keys(const FeatureRows& rows, float* dst) const override { apply(rows, dst); }
  // φ' is 1 above 0 for both maps; at or below 0 it is exp(x) = φ(x) itself for elu + 1 (so the feature the
  // forward computed serves) and 0 for relu. Selects, not branches: the signs of x are random, and a branch
  // per element mispredicted half the time cost a quarter of the backward.
  void input_gradient(const FeatureRows& rows, const float* features, float* d_features,
                      float* dx) const override {
    const float* __restrict x = rows.src;
    const float* __restrict f = features;
    const float* __restrict dphi = d_features;
    float* __restrict out = dx;
    const int64_t n = rows.rows * head_dim_;
    // Every operand loaded unconditionally, so the compiler can if-convert (compare and blend) and vectorise.
    if (kind_ == FeatureKind::relu) {
      for (int64_t e = 0; e < n; ++e) {
        const float d = dphi[e];
        out[e] = x[e] > 0 ? d : 0.0f;
      }
    } else {
      for (int64_t e = 0; e < n; ++e) {
        const float phi = f[e], slope = x[e] > 0 ? 1.0f : phi;  // a select, then an unconditional multiply
        out[e] = dphi[e] * slope;
      }
    }
  }

 private:
  void apply(const FeatureRows& rows, float* dst) const {
    if (kind_ == FeatureKind::relu)
      relu(rows.src, dst, rows.rows * head_dim_);
    else
      elu_plus_one(rows.src, dst, rows.rows * head_dim_);
  }
  FeatureKind kind_;
  int64_t head_dim_;
};

class ElementwiseMapFp64 final : public FeatureMapFp64 {
 public:
  ElementwiseMapFp64(FeatureKind kind, int64_t head_dim) : kind_(kind), head_dim_(head_dim) {}
  int64_t features() const override { return head_dim_; }
  double query(int64_t, int64_t, int64_t, const float* q, double* dst, double eps) const override {
    apply(q, dst);
    return eps;
  }
  void key(int64_t, int64_t, int64_t, const float* k, double* dst) const override { apply(k, dst); }
  void input_gradient(const float* x, const double* features, const double* d_features,
                      double* dx) const override {
    for (int64_t d = 0; d < head_dim_; ++d)
      dx[d] = x[d] > 0 ? d_features[d] : (kind_ == FeatureKind::relu ? 0.0 : d_features[d] * features[d]);
  }
  // The fp32 input_gradient: above 0 it passes dφ through (exactly); at or below 0, relu gives exactly 0 and
  // elu + 1 one product dφ·φ of the fp32 feature (within feature_err) and dφ, rounded once.
  void input_gradient_error(const float* x, const double* features, const double* d_features,
                            const double* d_err, double feature_err, double* err) const override {
    const double u = std::ldexp(1.0, -24);
    for (int64_t d = 0; d < head_dim_; ++d)
      err[d] = x[d] > 0 ? d_err[d]
                        : (kind_ == FeatureKind::relu
                               ? 0.0
                               : features[d] * (d_err[d] + std::fabs(d_features[d]) * (feature_err + u)));
  }

 private:
  void apply(const float* x, double* dst) const {
    for (int64_t d = 0; d < head_dim_; ++d) {
      const double v = x[d];
      dst[d] = kind_ == FeatureKind::relu ? std::max(v, 0.0) : (v > 0 ? v + 1.0 : std::exp(v));
    }
  }
  FeatureKind kind_;
  int64_t head_dim_;
};

class Linear final : public Attention {
 public:
  std::string name() const override { return "linear"; }
  std::string description() const override {
    return "linear attention phi(Q)(phi(K)^T V) / phi(Q)(phi(K)^T 1), phi = elu+1 or relu; causal in chunks, "
           "O(n·d²)";
  }
  Capabilities capabilities() const override {
    // Arbitrary boolean masks would need the quadratic form (the reordering needs a mask that factorises:
    // causal and key padding do), so they are not supported; nor is dropout on weights it never forms.
    // bf16 / fp16: widened to fp32 up front (WideInputs, counted in workspace_bytes).
    return {.exact = false,
            .causal = true,
            .causal_lower_right = true,
            .gqa = true,
            .boolean_mask = false,
            .key_padding = true,
            .cross = true,
            .dropout = false,
            .bf16 = true,
            .fp16 = true,
            .permutation_equivariant = true,
            .backward = true};
  }
  std::vector<ParamSpec> param_specs() const override {
    return {{.name = "feature_map",
             .type = ParamType::string,
             .default_value = "elu",
             .help = "phi applied to queries and keys: elu (elu(x)+1, always > 0) or relu",
             .choices = {"elu", "relu"}},
            {.name = "chunk",
             .type = ParamType::integer,
             .default_value = 64,
             .help = "causal only: positions per chunk (masked quadratic form inside, d x d state across)",
             .min = 1,
             .max = 65536},
            {.name = "eps",
             .type = ParamType::number,
             .default_value = 1e-6,
             .help = "added to every denominator phi(q).sum_j phi(k_j), so rows whose weights are all 0 "
                     "(relu, or every key masked) give 0, not NaN",
             .min = 1e-30,
             .max = 1.0}};
  }
  std::vector<Json> test_param_sets() const override {
    // Chunks of 1, 5 (not dividing any check length) and 16 run the multi-chunk causal path on seq 7..130.
    return {Json::object(),
            {{"chunk", 5}},
            {{"chunk", 1}, {"feature_map", "relu"}},
            {{"chunk", 16}, {"feature_map", "relu"}, {"eps", 1e-3}}};
  }

  double flops(const Problem& p) const override {
    // Per head, the multiply-adds that matter: φ(K)ᵀV (2·Lkv·d²), φ(Q) times the d×(d+1) state
    // (2·Lq·d·(d+1)), and, causal, the lower triangle of each chunk's φ(Q)φ(K)ᵀ and its product with V (≈
    // 2·Lq·(C+1)·d): feature_attention_flops with m = d. The feature map, the masked upper triangles and the
    // final division are not counted.
    return feature_attention_flops(p, p.head_dim, p.param_int("chunk"));
  }

  std::size_t workspace_bytes(const Problem& p, int threads) const override {
    // The engine's buffers; bf16 / fp16 add fp32 copies of Q, K and V (saturating,
    // common/interface/util.hpp).
    const std::size_t widened =
        p.dtype == DType::fp32
            ? 0
            : sat_mul(sat_add(to_size(p.q_elements()), sat_mul(2, to_size(p.kv_elements()))), sizeof(float));
    return sat_add(feature_attention_workspace_bytes(p, p.head_dim, p.param_int("chunk"), threads, false),
                   widened);
  }

  // ---- Training ----
  // The engine's state: 1 / (denominator + eps) per query row (feature_attention.hpp).
  std::size_t saved_floats(const Problem& p) const override { return feature_attention_saved_floats(p); }
  std::string saved_description() const override { return kFeatureSavedDescription; }
  double backward_flops(const Problem& p) const override {
    // The engine's backward matmuls with m = d (feature_attention_backward_flops: the state rebuilt, dφ(Q),
    // U, dφ(K), dV and, causal, the chunks' masked products over their lower triangles): without a causal
    // mask n·d·(10d + 6) per head against the forward's n·d·(4d + 2), about 2.5x. The map, its derivative and
    // the elementwise work are not counted, as in flops().
    return feature_attention_backward_flops(p, p.head_dim, p.param_int("chunk"));
  }
  std::size_t backward_workspace_bytes(const Problem& p, int threads) const override {
    // The engine's buffers only: run_backward widens bf16 / fp16 itself (and counts it).
    return feature_attention_backward_workspace_bytes(p, p.head_dim, p.param_int("chunk"), threads, false);
  }

  void forward(const Problem& p, const AttentionInputs& stored) const override {
    forward_impl(p, stored, nullptr);
  }
  void forward_saving(const Problem& p, const AttentionInputs& stored, float* saved) const override {
    forward_impl(p, stored, saved);
  }
  void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const override {
    feature_attention_backward(p, in, g, ElementwiseMap(feature_kind_of(p), p.head_dim),
                               p.param_int("chunk"));
  }

  // The fp64 quadratic definition: w_ij = φ(q_i)·φ(k_j) over allowed keys (causal, padding), out_i =
  // Σ w_ij v_j / (Σ w_ij + eps). No reordering, so it checks the associativity and the chunking.
  // bf16 / fp16: on the stored values widened (exactly) to fp32, what the kernel computes on.
  void reference_forward(const Problem& p, const AttentionInputs& stored, double* out) const override {
    const WideInputs wide(p, stored);
    const AttentionInputs& in = wide.get();
    feature_attention_reference(p, in, ElementwiseMapFp64(feature_kind_of(p), p.head_dim),
                                p.param_number("eps"), out);
  }

  // Why this bound. With u = 2^-24, L = the keys a row sums over (≤ seq_kv) and w_ij = φ(q_i)·φ(k_j):
  //  * φ in fp32 is within 2u relative (one rounding for x + 1; Highway's exp is within 1 ulp), so each
  //  product
  //    φ(q)_e φ(k)_e is within 5u relative;
  //  * every term of the numerator, φ(q_i)_e φ(k_j)_e v_jd, and of the denominator is a product of those, and
  //    however the sums are associated (per key, per feature, chunk by chunk through the state) a sum of
  //    d·L terms has error ≤ (d + L) u times the sum of their magnitudes (pairwise-or-better in BLAS is even
  //    smaller); φ ≥ 0, so those magnitudes sum to Σ_j w_ij |v_jd| ≤ max|v| Σ_j w_ij for the numerator and to
  //    the denominator itself;
  //  * out = num / (den + eps): |Δout| ≤ |Δnum| / den + |out| |Δden| / den ≤ 2 (d + L + 8) u max|v|.
  // We allow 4x that, as the softmax bound does, since blocked BLAS orders sums differently from the
  // analysis. A wrong mask, chunk boundary or state update moves outputs by a fraction of max|v|, far above
  // this.
  double abs_tolerance(const Problem& p, const AttentionInputs& stored) const override {
    const WideInputs wide(p, stored);  // max|v| of the values the kernel was given
    const AttentionInputs& in = wide.get();
    double vmax = 0;
    for (int64_t e = 0; e < p.kv_elements(); ++e)
      vmax = std::max(vmax, std::fabs(static_cast<double>(in.v[e])));
    const double u = std::ldexp(1.0, -24);
    return 4.0 * 2.0 * static_cast<double>(p.head_dim + p.seq_kv + 8) * u * vmax + 1e-30;
  }

  // The gradient of the quadratic definition above (feature_attention_reference_backward): dL/dw_ij over the
  // allowed pairs, through φ' (1 above 0; exp(x) for elu + 1 and 0 for relu at or below). relu's kink at 0
  // is not differentiable; the check's inputs stay away from it.
  void reference_backward(const Problem& p, const AttentionInputs& stored, const float* d_out, double* dq,
                          double* dk, double* dv) const override {
    const WideInputs wide(p, stored);
    feature_attention_reference_backward(p, wide.get(), ElementwiseMapFp64(feature_kind_of(p), p.head_dim),
                                         p.param_number("eps"), d_out, dq, dk, dv);
  }

  // Why this bound: the engine's running error analysis (feature_attention_grad_tolerance, derived there)
  // with the fp32 features within 2u relative of the fp64 ones, the same fact abs_tolerance starts from (one
  // rounding for x + 1, Highway's exp within 1 ulp, relu exact); φ' adds its own rounding in the map's
  // input_gradient_error.
  GradientTolerance grad_tolerance(const Problem& p, const AttentionInputs& stored,
                                   const float* d_out) const override {
    const WideInputs wide(p, stored);
    const double u = std::ldexp(1.0, -24);
    return feature_attention_grad_tolerance(p, wide.get(), ElementwiseMapFp64(feature_kind_of(p), p.head_dim),
                                            p.param_number("eps"), d_out, {.query = 2 * u, .key = 2 * u});
  }

 protected:
  std::vector<std::string> extra_not_supported_reasons(const Problem& p) const override {
    // φ(q)·φ(k) is not a logit, so there is no temperature to set; ignoring a requested scale would hide it.
    if (p.scale)
      return {
          "linear attention has no logit scale (phi(q).phi(k) is not a softmax logit); leave scale unset"};
    return {};
  }

 private:
  void forward_impl(const Problem& p, const AttentionInputs& stored, float* saved) const {
    if (auto reasons = not_supported_reasons(p); !reasons.empty())
      throw NotSupported("linear: " + reasons.front());
    const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
    const AttentionInputs& in = wide.get();
    feature_attention_forward(p, in, ElementwiseMap(feature_kind_of(p), p.head_dim),
                              static_cast<float>(p.param_number("eps")), p.param_int("chunk"), saved);
  }
};

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::Linear)
