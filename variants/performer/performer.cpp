// performer: FAVOR+ (Choromanski et al. 2020) — softmax attention approximated by positive random features
// φ(x) = exp(W x' − ‖x'‖²/2) / √m with x' = x·√scale, so E[φ(q)·φ(k)] = exp(scale · q·k), then computed in
// O(n·m·d) by linear attention's engine (common/kernels/feature_attention.hpp) with m features instead of d.
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <tuple>

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/feature_attention.hpp"
#include "common/kernels/mask.hpp"
#include "common/kernels/vmath.hpp"
#include "common/support/aligned.hpp"
#include "common/support/error.hpp"
#include "common/support/runtime.hpp"
#include "variants/performer/random_features.hpp"

namespace attn {
namespace {

constexpr int64_t kMaxFeatures = 65536;

double squared_norm(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

// The kernel's projection P = √scale · W in fp32 (m × d, row-major): P x = W x'. W is a pure function of
// (m, d, orthogonal, seed) and P of those and the scale, so P is drawn once and kept, as a model keeps its
// feature matrix (the draw, O(m·d²) in fp64 for orthogonal blocks, would otherwise dominate small calls).
// The last kCachedProjections distinct ones are kept; every call with the same parameters gets the same bits.
constexpr std::size_t kCachedProjections = 16;

std::shared_ptr<const std::vector<float>> projection(const Problem& p) {
  using Key = std::tuple<int64_t, int64_t, bool, int64_t, double>;
  const Key key{p.param_int("features"), p.head_dim, p.param_int("orthogonal") != 0, p.param_int("seed"),
                p.effective_scale()};
  static std::mutex mutex;
  static std::vector<std::pair<Key, std::shared_ptr<const std::vector<float>>>> cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [k, proj] : cache)
      if (k == key) return proj;
  }
  const auto [m, d, orthogonal, seed, scale] = key;
  const std::vector<double> w = draw_random_features(m, d, orthogonal, static_cast<uint64_t>(seed));
  auto proj = std::make_shared<std::vector<float>>(w.size());
  const double root = std::sqrt(scale);
  for (std::size_t e = 0; e < w.size(); ++e) (*proj)[e] = static_cast<float>(root * w[e]);
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= kCachedProjections) cache.erase(cache.begin());
  cache.emplace_back(key, proj);
  return proj;
}

// Keys [0, seen_keys(p)) are the ones some query may attend (all of them without a causal mask).
int64_t seen_keys(const Problem& p) {
  return causal_key_end(p, p.seq_q - 1);
}

// The stabilisers. A key's exponent is z = (P k)_e − scale‖k‖²/2; one constant s_k per (batch entry, K/V
// head), the max of z over the features of every unpadded key some query sees (padded keys would only push
// the others towards underflow; a causal problem still uses one constant for all positions: it cancels
// exactly, below, so in exact arithmetic the future does not leak through it; in fp32 a later key ~87
// e-folds stronger than every earlier one would flush the earlier keys' features to 0, the same limit a
// non-causal head has). A query's s_q is the max of its own row of exponents. Features are exp(z − s), at
// most 1; multiplying φ(q_i) by e^{−s_q} and every φ(k_j) of a head by e^{−s_k} scales row i's numerator and
// denominator by the same e^{−s_q − s_k}, which cancels exactly in num/den; eps is therefore scaled with them
// (eps·m·e^{−s_q−s_k}, the m from leaving 1/√m out of both features), so the output is that of the
// unstabilised definition and does not depend on s_q or s_k. Computed from the fp32 projections (one pass
// over the keys before the state is built), kept in fp64.
std::vector<double> key_stabilisers(const Problem& p, const AttentionInputs& in, const float* proj) {
  const int64_t D = p.head_dim, M = p.param_int("features"), Lkv = p.seq_kv, seen = seen_keys(p);
  const int64_t BKV = p.batch * p.num_kv_heads();
  const double half_scale = 0.5 * p.effective_scale();
  std::vector<double> shift(static_cast<std::size_t>(BKV), 0.0);
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;
  tbb::parallel_for(int64_t{0}, BKV, [&](int64_t kv) {
    AlignedVector<float>& buf = scratch.local();
    if (static_cast<int64_t>(buf.size()) < kFeatureKeyRows * M) buf.resize(kFeatureKeyRows * M);
    const int64_t b = kv / p.num_kv_heads();
    double s = -std::numeric_limits<double>::infinity();
    for (int64_t j0 = 0; j0 < seen; j0 += kFeatureKeyRows) {
      const int64_t rows = std::min(kFeatureKeyRows, seen - j0);
      const float* k = in.k + (kv * Lkv + j0) * D;
      sgemm(false, true, rows, M, D, 1.0f, k, D, proj, D, 0.0f, buf.data(), M);
      for (int64_t r = 0; r < rows; ++r) {
        if (p.mask.key_padding && in.key_padding[b * Lkv + j0 + r]) continue;
        // A NaN key fails the comparison and leaves s finite; its own features are NaN and reach the output.
        const double z =
            static_cast<double>(row_max(buf.data() + r * M, M)) - half_scale * squared_norm(k + r * D, D);
        if (z > s) s = z;
      }
    }
    shift[kv] = std::isfinite(s) ? s : 0.0;  // no key to see: any constant (every feature row is zeroed)
  });
  return shift;
}

// eps·m·e^{−s_q−s_k} as a float: at least FLT_MIN, so a row with no allowed key (numerator and denominator
// exactly 0) still gives 0, and +inf past FLT_MAX (a denominator that small against eps gives 0, as the
// unstabilised definition does). NaN (from a NaN query) stays NaN.
float scaled_eps(double e) {
  if (std::isnan(e)) return std::numeric_limits<float>::quiet_NaN();
  if (e < FLT_MIN) return FLT_MIN;
  if (e > FLT_MAX) return std::numeric_limits<float>::infinity();
  return static_cast<float>(e);
}

// φ in fp32 for the engine: one GEMM per block of rows (P x for every feature), then per row one vectorised
// exp(z − shift) pass (common/kernels/vmath.hpp: exp_sub_sum, ≤ 1.5 ulp plus the rounding of z − shift).
class PositiveRandomFeatures final : public FeatureMap {
 public:
  PositiveRandomFeatures(const Problem& p, const float* proj, const std::vector<double>& key_shift)
      : p_(p),
        proj_(proj),
        key_shift_(key_shift),
        m_(p.param_int("features")),
        half_scale_(0.5 * p.effective_scale()) {}
  int64_t features() const override { return m_; }
  bool scales_eps() const override { return true; }

  void queries(const FeatureRows& rows, float* dst, float* row_eps) const override {
    const int64_t D = p_.head_dim;
    sgemm(false, true, rows.rows, m_, D, 1.0f, rows.src, D, proj_, D, 0.0f, dst, m_);
    for (int64_t r = 0; r < rows.rows; ++r) {
      float* z = dst + r * m_;
      const float top = row_max(z, m_);
      exp_sub_sum(z, m_, top);
      const double s_q = static_cast<double>(top) - half_scale_ * squared_norm(rows.src + r * D, D);
      row_eps[r] = scaled_eps(static_cast<double>(row_eps[r]) * static_cast<double>(m_) *
                              std::exp(-(s_q + key_shift_[rows.kv])));
    }
  }

  void keys(const FeatureRows& rows, float* dst) const override {
    const int64_t D = p_.head_dim;
    sgemm(false, true, rows.rows, m_, D, 1.0f, rows.src, D, proj_, D, 0.0f, dst, m_);
    for (int64_t r = 0; r < rows.rows; ++r)
      exp_sub_sum(dst + r * m_, m_,
                  static_cast<float>(half_scale_ * squared_norm(rows.src + r * D, D) + key_shift_[rows.kv]));
  }

  // φ_e(x) = exp(P_e·x − scale‖x‖²/2 − s) with the stabiliser s held fixed, so ∂φ_e/∂x = φ_e (P_e − scale·x)
  // and dx = (dφ ⊙ φ) P − scale·x Σ_e dφ_e φ_e: one GEMM per block (the same for queries and keys).
  void input_gradient(const FeatureRows& rows, const float* features, float* d_features,
                      float* dx) const override {
    const int64_t D = p_.head_dim, n = rows.rows * m_;
    const float scale = static_cast<float>(2.0 * half_scale_);
    for (int64_t e = 0; e < n; ++e) d_features[e] *= features[e];
    sgemm(false, false, rows.rows, D, m_, 1.0f, d_features, m_, proj_, D, 0.0f, dx, D);
    for (int64_t r = 0; r < rows.rows; ++r) {
      float sum = 0;
      for (int64_t e = 0; e < m_; ++e) sum += d_features[r * m_ + e];
      const float* x = rows.src + r * D;
      for (int64_t c = 0; c < D; ++c) dx[r * D + c] -= scale * x[c] * sum;
    }
  }

 private:
  const Problem& p_;
  const float* proj_;
  const std::vector<double>& key_shift_;
  int64_t m_;
  double half_scale_;
};

// The same φ in fp64 from the same P (cast to double) for the quadratic reference; its stabilisers are
// recomputed in fp64 (mathematically they do not change the result: see key_stabilisers).
class PositiveRandomFeaturesFp64 final : public FeatureMapFp64 {
 public:
  PositiveRandomFeaturesFp64(const Problem& p, const AttentionInputs& in, const std::vector<float>& proj)
      : p_(p),
        proj_(proj.begin(), proj.end()),
        m_(p.param_int("features")),
        half_scale_(0.5 * p.effective_scale()) {
    const int64_t D = p.head_dim, Lkv = p.seq_kv;
    std::vector<double> z(static_cast<std::size_t>(m_));
    for (int64_t kv = 0; kv < p.batch * p.num_kv_heads(); ++kv) {
      double s = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < seen_keys(p); ++j) {
        if (p.mask.key_padding && in.key_padding[kv / p.num_kv_heads() * Lkv + j]) continue;
        s = std::max(s, exponents(in.k + (kv * Lkv + j) * D, z.data()));
      }
      key_shift_.push_back(std::isfinite(s) ? s : 0.0);
    }
  }
  int64_t features() const override { return m_; }

  double query(int64_t b, int64_t h, int64_t, const float* q, double* dst, double eps) const override {
    const double s_q = exponents(q, dst);  // the row's stabiliser: its largest exponent
    for (int64_t e = 0; e < m_; ++e) dst[e] = std::exp(dst[e] - s_q);
    return eps * static_cast<double>(m_) * std::exp(-(s_q + key_shift_[p_.kv_block(b, h)]));
  }

  void key(int64_t, int64_t kv, int64_t, const float* k, double* dst) const override {
    exponents(k, dst);
    for (int64_t e = 0; e < m_; ++e) dst[e] = std::exp(dst[e] - key_shift_[kv]);
  }

  // dx = Σ_e dφ_e φ_e (P_e − scale·x), the stabilisers held fixed (the definition does not depend on them).
  void input_gradient(const float* x, const double* features, const double* d_features,
                      double* dx) const override {
    const int64_t D = p_.head_dim;
    std::fill(dx, dx + D, 0.0);
    double sum = 0;
    for (int64_t e = 0; e < m_; ++e) {
      const double t = d_features[e] * features[e];
      sum += t;
      for (int64_t c = 0; c < D; ++c) dx[c] += t * proj_[e * D + c];
    }
    for (int64_t c = 0; c < D; ++c) dx[c] -= 2.0 * half_scale_ * static_cast<double>(x[c]) * sum;
  }
  // The fp32 input_gradient: t_e = dφ_e φ_e rounded once (|Δt_e| ≤ d_err_e φ_e + |dφ_e| φ_e (feature_err +
  // u)), then Σ_e t_e P_ec (m terms; P is the same fp32 P in both) and scale·x_c·Σ_e t_e (m terms, the fp32
  // scale, two products), then their difference: |Δdx_c| ≤ Σ_e (|Δt_e| + (m + 4) u |t_e|)(|P_ec| +
  // scale|x_c|).
  void input_gradient_error(const float* x, const double* features, const double* d_features,
                            const double* d_err, double feature_err, double* err) const override {
    const int64_t D = p_.head_dim;
    const double u = std::ldexp(1.0, -24), scale = 2.0 * half_scale_;
    std::fill(err, err + D, 0.0);
    double sum = 0;
    for (int64_t e = 0; e < m_; ++e) {
      const double a = features[e] * (d_err[e] + std::fabs(d_features[e]) *
                                                     (feature_err + static_cast<double>(m_ + 5) * u));
      sum += a;
      for (int64_t c = 0; c < D; ++c) err[c] += a * std::fabs(proj_[e * D + c]);
    }
    for (int64_t c = 0; c < D; ++c) err[c] += scale * std::fabs(static_cast<double>(x[c])) * sum;
  }

 private:
  // z_e = (P x)_e − scale‖x‖²/2 into z; returns max_e z_e.
  double exponents(const float* x, double* z) const {
    const int64_t D = p_.head_dim;
    const double n2 = half_scale_ * squared_norm(x, D);
    double top = -std::numeric_limits<double>::infinity();
    for (int64_t e = 0; e < m_; ++e) {
      double s = 0;
      for (int64_t c = 0; c < D; ++c) s += proj_[e * D + c] * static_cast<double>(x[c]);
      z[e] = s - n2;
      top = std::max(top, z[e]);
    }
    return top;
  }
  const Problem& p_;
  std::vector<double> proj_;
  std::vector<double> key_shift_;
  int64_t m_;
  double half_scale_;
};

class Performer final : public Attention {
 public:
  std::string name() const override { return "performer"; }
  std::string description() const override {
    return "Performer FAVOR+: softmax kernel by m positive (orthogonal) random features "
           "exp(Wx'-|x'|^2/2)/sqrt(m), "
           "linear attention's engine, O(n·m·d)";
  }
  Capabilities capabilities() const override {
    // What the shared engine gives (see linear): masks that factorise (causal, key padding), grouped-query
    // and cross-attention. No boolean mask, dropout or ALiBi (weights are never formed). bf16 / fp16:
    // widened to fp32 up front (WideInputs, counted in workspace_bytes).
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
    return {
        {.name = "features",
         .type = ParamType::integer,
         .default_value = 256,
         .help = "m, random features per query/key (the approximation error falls as 1/sqrt(m))",
         .min = 1,
         .max = static_cast<double>(kMaxFeatures)},
        {.name = "orthogonal",
         .type = ParamType::integer,
         .default_value = 1,
         .help = "1: blocks of head_dim orthogonal rows with chi(d) norms (FAVOR+); 0: iid Gaussian rows",
         .min = 0,
         .max = 1},
        {.name = "seed",
         .type = ParamType::integer,
         .default_value = 0,
         .help = "seed of the random projection W (one W per call, shared by every head and batch entry)",
         .min = 0,
         .max = 9007199254740992.0},
        {.name = "chunk",
         .type = ParamType::integer,
         .default_value = 64,
         .help = "causal only: positions per chunk (masked quadratic form inside, m x d state across)",
         .min = 1,
         .max = 65536},
        {.name = "eps",
         .type = ParamType::number,
         .default_value = 1e-6,
         .help = "added to every denominator phi(q).sum_j phi(k_j) (of the unstabilised features), so rows "
                 "with no allowed key give 0, not NaN",
         .min = 1e-30,
         .max = 1.0}};
  }
  std::vector<Json> test_param_sets() const override {
    // Few features (8 < most check head dims: one truncated orthogonal block; 17 and 40: several blocks, the
    // last truncated), iid rows, and chunks of 1, 5 and 16 so the multi-chunk causal path runs on seq 7..130.
    return {Json::object(),
            {{"features", 8}, {"chunk", 5}},
            {{"features", 17}, {"chunk", 1}, {"orthogonal", 0}, {"seed", 3}},
            {{"features", 40}, {"chunk", 16}, {"eps", 1e-3}, {"seed", 12345}}};
  }

  double flops(const Problem& p) const override {
    // The engine's multiply-adds with m features (feature_attention_flops: φ(K)ᵀV 2·Lkv·m·d, φ(Q) times the
    // m×(d+1) state 2·Lq·m·(d+1) and the causal intra-chunk terms ≈ Lq·(C+1)·(m+d), per query head) plus the
    // feature GEMMs, 2·m·d per projected row: every query row; the keys any query sees once for the
    // stabiliser pass and once more for the features (non-causal once per K/V head, into the shared state;
    // causal once per query head, chunk by chunk). The exp (m per row), the row maxima, the norms ‖x‖² and
    // the division are not counted; nor is the draw of W (done once per parameter set, see projection()).
    const int64_t M = p.param_int("features");
    const double md2 = 2.0 * static_cast<double>(M) * static_cast<double>(p.head_dim);
    const double seen = static_cast<double>(seen_keys(p));
    const double bkv = static_cast<double>(p.batch * p.num_kv_heads()),
                 bh = static_cast<double>(p.batch * p.heads);
    const double key_rows =
        bkv * seen + (p.mask.any_causal() ? bh * seen : bkv * static_cast<double>(p.seq_kv));
    return feature_attention_flops(p, M, p.param_int("chunk")) +
           md2 * (bh * static_cast<double>(p.seq_q) + key_rows);
  }

  std::size_t workspace_bytes(const Problem& p, int threads) const override {
    // P (m×d floats, kept in the cache), the key stabilisers (one double per K/V head), and the larger of the
    // stabiliser pass's per-thread block of projections and the engine's own workspace (the pass frees its
    // buffers before the engine runs); bf16 / fp16 add fp32 copies of Q, K and V, alive throughout.
    // Saturating.
    const std::size_t M = to_size(p.param_int("features")), T = to_size(std::max(threads, 1));
    const std::size_t proj = sat_mul(M, to_size(p.head_dim), sizeof(float));
    const std::size_t shifts = sat_mul(to_size(p.batch * p.num_kv_heads()), sizeof(double));
    const std::size_t pass = sat_mul(T, kFeatureKeyRows, M, sizeof(float));
    const std::size_t engine =
        feature_attention_workspace_bytes(p, p.param_int("features"), p.param_int("chunk"), threads, true);
    const std::size_t widened =
        p.dtype == DType::fp32
            ? 0
            : sat_mul(sat_add(to_size(p.q_elements()), sat_mul(2, to_size(p.kv_elements()))), sizeof(float));
    return sat_add(proj, shifts, std::max(pass, engine), widened);
  }

  // ---- Training ----
  // The engine's state: 1 / (denominator + eps) per query row, in the stabilised units of the row's own eps
  // (feature_attention.hpp). The key stabilisers are recomputed by the backward (the same pass, the same
  // bits), so the features it rebuilds are bitwise the forward's.
  std::size_t saved_floats(const Problem& p) const override { return feature_attention_saved_floats(p); }
  std::string saved_description() const override { return kFeatureSavedDescription; }

  double backward_flops(const Problem& p) const override {
    // The engine's backward matmuls with m features (feature_attention_backward_flops) plus this map's GEMMs,
    // 2·m·d per row: the stabiliser pass again (the keys any query sees, once per K/V head), every row the
    // backward recomputes features for and every row it passes through input_gradient ((dφ ⊙ φ) P), as
    // feature_attention_backward_rows counts them. The exp, the norms and the elementwise work are not
    // counted, as in flops().
    const int64_t M = p.param_int("features"), chunk = p.param_int("chunk");
    const FeatureBackwardRows rows = feature_attention_backward_rows(p);
    const double md2 = 2.0 * static_cast<double>(M) * static_cast<double>(p.head_dim);
    const double pass = static_cast<double>(p.batch * p.num_kv_heads()) * static_cast<double>(seen_keys(p));
    return feature_attention_backward_flops(p, M, chunk) +
           md2 * (pass + rows.query_features + rows.key_features + rows.query_gradients + rows.key_gradients);
  }

  std::size_t backward_workspace_bytes(const Problem& p, int threads) const override {
    // As workspace_bytes with the engine's backward buffers, and no fp32 copies (run_backward widens bf16 /
    // fp16 itself and counts them).
    const std::size_t M = to_size(p.param_int("features")), T = to_size(std::max(threads, 1));
    const std::size_t proj = sat_mul(M, to_size(p.head_dim), sizeof(float));
    const std::size_t shifts = sat_mul(to_size(p.batch * p.num_kv_heads()), sizeof(double));
    const std::size_t pass = sat_mul(T, kFeatureKeyRows, M, sizeof(float));
    const std::size_t engine = feature_attention_backward_workspace_bytes(
        p, p.param_int("features"), p.param_int("chunk"), threads, true);
    return sat_add(proj, shifts, std::max(pass, engine));
  }

  void forward(const Problem& p, const AttentionInputs& stored) const override {
    forward_impl(p, stored, nullptr);
  }
  void forward_saving(const Problem& p, const AttentionInputs& stored, float* saved) const override {
    forward_impl(p, stored, saved);
  }
  void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const override {
    const auto proj = projection(p);
    const std::vector<double> key_shift = key_stabilisers(p, in, proj->data());
    feature_attention_backward(p, in, g, PositiveRandomFeatures(p, proj->data(), key_shift),
                               p.param_int("chunk"));
  }

  // The exact quadratic definition in fp64 with the same W (the kernel's fp32 P = √scale·W cast to double):
  // w_ij = φ(q_i)·φ(k_j) over allowed keys, out_i = Σ w_ij v_j / (Σ w_ij + eps), computed with fp64
  // stabilisers (equal to the unstabilised form, see key_stabilisers, and free of its overflow). bf16 / fp16:
  // on the stored values widened (exactly) to fp32, what the kernel computes on.
  void reference_forward(const Problem& p, const AttentionInputs& stored, double* out) const override {
    const WideInputs wide(p, stored);
    const AttentionInputs& in = wide.get();
    feature_attention_reference(p, in, PositiveRandomFeaturesFp64(p, in, *projection(p)),
                                p.param_number("eps"), out);
  }

  // Why this bound. With u = 2^-24, the stabilised features φ̃ = exp(t) with t = z − shift ≤ 0 (queries) or
  // ≈ ≤ 0 (keys), and S = max over rows x and features e of Σ_c |P_ec||x_c| (queries: S_q, keys: S_k):
  //  * z = (P x)_e by sgemm is within d·u·S of its exact value (a d-term dot product);
  //  * queries: t = z − top, where top is one of the computed z: its error is common to the row, scales
  //    numerator and denominator alike and cancels (eps is scaled by the same computed top); z − top is
  //    rounded once, the log2(e) multiply once, and exp2 is within 1.5 ulp, so φ̃(q) is within
  //    ε_q = u (d·S_q + 2|t| + 2) ≤ u ((d + 4) S_q + 2) relative (|t| ≤ 2 S_q);
  //  * keys: t = z − shift with shift = scale‖k‖²/2 + s_k rounded to fp32 (error u|shift|, per key so not
  //    common); |s_k| ≤ S_k + scale K²/2 with K = max‖k‖, so |shift| ≤ S_k + scale K², |t| ≤ 2 S_k + scale K²
  //    and ε_k = u ((d + 5) S_k + 3 scale K² + 2);
  //  * from there as linear's bound: each product φ̃(q)_e φ̃(k)_e is within ε_q + ε_k + u, the m·L-term
  //    nonnegative sums add (m + L) u of their magnitude, and |Δout| ≤ 2 (ε_q + ε_k + (m + L + 8) u) max|v|
  //    (the fp32 rounding of the scaled eps is inside the 8).
  // We allow 4x that, as linear and softmax do. S is large when inputs are (S_q ≈ ‖P_e‖‖q‖, about 40 at d =
  // 64 with unit Gaussian inputs), so this is looser than linear's; a wrong mask, chunk boundary or state
  // update still moves outputs by a fraction of max|v|, far above it at the check's sizes. Assumed: a row's
  // stabilised denominator is far above m·L·2^-126 (exp2 flushes features below 2^-126 to 0), i.e. its
  // allowed keys are not all ~87 e-folds below the head's strongest key.
  double abs_tolerance(const Problem& p, const AttentionInputs& stored) const override {
    const WideInputs wide(p, stored);  // the values the kernel was given
    const AttentionInputs& in = wide.get();
    double vmax = 0;
    for (int64_t e = 0; e < p.kv_elements(); ++e)
      vmax = std::max(vmax, std::fabs(static_cast<double>(in.v[e])));
    const FeatureErrors fe = feature_errors(p, in);
    const double u = std::ldexp(1.0, -24);
    return 4.0 * 2.0 * (fe.query + fe.key + static_cast<double>(p.param_int("features") + p.seq_kv + 8) * u) *
               vmax +
           1e-30;
  }

  // The gradient of the quadratic definition (feature_attention_reference_backward) through ∂φ_e/∂x = φ_e
  // (P_e − scale·x): the stabilisers get none (the definition does not depend on them) and neither does W
  // (fixed by the seed).
  void reference_backward(const Problem& p, const AttentionInputs& stored, const float* d_out, double* dq,
                          double* dk, double* dv) const override {
    const WideInputs wide(p, stored);
    const AttentionInputs& in = wide.get();
    feature_attention_reference_backward(p, in, PositiveRandomFeaturesFp64(p, in, *projection(p)),
                                         p.param_number("eps"), d_out, dq, dk, dv);
  }

  // Why this bound: the engine's running error analysis (feature_attention_grad_tolerance, derived there)
  // with the features' relative errors ε_q and ε_k derived for abs_tolerance (feature_errors: the projection
  // GEMM, the stabiliser's rounding for keys, exp2), and the map's input_gradient_error for (dφ ⊙ φ) P −
  // scale·x Σ dφ φ. The query stabiliser's rounding is common to the row and cancels in the gradients too
  // (it scales φ(q_i) by c and r_i by 1/c), as does a K/V head's s_k.
  GradientTolerance grad_tolerance(const Problem& p, const AttentionInputs& stored,
                                   const float* d_out) const override {
    const WideInputs wide(p, stored);
    const AttentionInputs& in = wide.get();
    return feature_attention_grad_tolerance(p, in, PositiveRandomFeaturesFp64(p, in, *projection(p)),
                                            p.param_number("eps"), d_out, feature_errors(p, in));
  }

 private:
  void forward_impl(const Problem& p, const AttentionInputs& stored, float* saved) const {
    if (auto reasons = not_supported_reasons(p); !reasons.empty())
      throw NotSupported("performer: " + reasons.front());
    const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
    const AttentionInputs& in = wide.get();
    const auto proj = projection(p);
    const std::vector<double> key_shift = key_stabilisers(p, in, proj->data());
    feature_attention_forward(p, in, PositiveRandomFeatures(p, proj->data(), key_shift),
                              static_cast<float>(p.param_number("eps")), p.param_int("chunk"), saved);
  }

  // The relative errors of the fp32 stabilised features (the derivation above abs_tolerance): ε_q = u ((d +
  // 4) S_q + 2) and ε_k = u ((d + 5) S_k + 3 scale K² + 2), with S the largest Σ_c |P_ec||x_c| over the
  // rows and features and K the largest key norm. fp32 inputs.
  static FeatureErrors feature_errors(const Problem& p, const AttentionInputs& in) {
    const int64_t D = p.head_dim, M = p.param_int("features");
    const auto proj = projection(p);
    std::vector<double> abs_proj(proj->size());
    for (std::size_t e = 0; e < proj->size(); ++e) abs_proj[e] = std::fabs(static_cast<double>((*proj)[e]));
    auto max_abs_projection = [&](const float* x, int64_t rows) {
      double s = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t e = 0; e < M; ++e) {
          double t = 0;
          for (int64_t c = 0; c < D; ++c)
            t += abs_proj[e * D + c] * std::fabs(static_cast<double>(x[r * D + c]));
          s = std::max(s, t);
        }
      return s;
    };
    const double s_q = max_abs_projection(in.q, p.batch * p.heads * p.seq_q);
    const double s_k = max_abs_projection(in.k, p.batch * p.num_kv_heads() * p.seq_kv);
    double k2 = 0;
    for (int64_t j = 0; j < p.batch * p.num_kv_heads() * p.seq_kv; ++j)
      k2 = std::max(k2, squared_norm(in.k + j * D, D));
    const double dd = static_cast<double>(D), u = std::ldexp(1.0, -24);
    return {.query = u * ((dd + 4) * s_q + 2),
            .key = u * ((dd + 5) * s_k + 3 * p.effective_scale() * k2 + 2)};
  }
};

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::Performer)
