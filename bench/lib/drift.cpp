// The drift model: seeded pre-norm transformer blocks, their fp32 forward with a variant as the attention
// core, the same stack in fp64 with exact softmax attention, and the per-layer comparison (see drift.hpp).
#include "bench/lib/drift.hpp"

#include <cblas.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/frontends/positional.hpp"
#include "common/interface/attention.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/hash.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"

namespace attn {
namespace {

// Rows per GEMM / LayerNorm task and query rows per reference attention task: fixed by the problem, never by
// the thread count, so 1 and 2 threads compute every element with the same operations (bitwise equal).
constexpr int64_t kRowsPerTask = 64;
constexpr int64_t kQueryRowsPerTask = 128;

// Stream keys of the per-layer weights: one stream per (seed, layer, tensor), apart from the MHA's own
// (random_multihead_weights mixes its seed again per tensor) and from the embedding table's seed.
uint64_t layer_seed(uint64_t seed, int64_t layer, uint64_t tensor) {
  return mix64(mix64(seed ^ 0x6472696674ULL) ^ mix64(static_cast<uint64_t>(layer) * 16 + tensor));
}

FloatArray uniform(std::vector<int64_t> shape, uint64_t seed, double bound) {
  FloatArray t(std::move(shape));
  fill_uniform(t.ptr(), static_cast<int64_t>(t.numel()), seed, -bound, bound);
  return t;
}

DoubleArray widen(const FloatArray& t) {
  DoubleArray out(t.shape);
  std::copy(t.data.begin(), t.data.end(), out.data.begin());
  return out;
}

// ---- fp32 pieces
// -------------------------------------------------------------------------------------------

// y[rows, out] = x[rows, in] W^T + b, W [out, in] (torch.nn.Linear), parallel over fixed row blocks.
void linear_f32(const float* x, int64_t rows, const FloatArray& w, const FloatArray& b, float* y) {
  const int64_t out = w.shape[0], in = w.shape[1];
  const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  tbb::parallel_for(int64_t{0}, tasks, [&](int64_t task) {
    const int64_t r0 = task * kRowsPerTask, nr = std::min(kRowsPerTask, rows - r0);
    for (int64_t r = 0; r < nr; ++r) std::copy_n(b.ptr(), out, y + (r0 + r) * out);
    sgemm(false, true, nr, out, in, 1.0f, x + r0 * in, in, w.ptr(), in, 1.0f, y + r0 * out, out);
  });
}

// LayerNorm of each row, in T arithmetic throughout (two passes: mean, then the mean square deviation).
template <class T>
void layer_norm(const T* x, int64_t rows, int64_t d, T* y) {
  const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  tbb::parallel_for(int64_t{0}, tasks, [&](int64_t task) {
    const int64_t r1 = std::min(rows, (task + 1) * kRowsPerTask);
    for (int64_t r = task * kRowsPerTask; r < r1; ++r) {
      const T* xr = x + r * d;
      T sum = 0;
      for (int64_t c = 0; c < d; ++c) sum += xr[c];
      const T mean = sum / static_cast<T>(d);
      T sq = 0;
      for (int64_t c = 0; c < d; ++c) sq += (xr[c] - mean) * (xr[c] - mean);
      const T rstd = T(1) / std::sqrt(sq / static_cast<T>(d) + static_cast<T>(kDriftLayerNormEps));
      for (int64_t c = 0; c < d; ++c) y[r * d + c] = (xr[c] - mean) * rstd;
    }
  });
}

template <class T>
void gelu_inplace(T* x, std::size_t n) {
  const T inv_sqrt2 = static_cast<T>(0.70710678118654752440);
  for (std::size_t i = 0; i < n; ++i) x[i] = T(0.5) * x[i] * (T(1) + std::erf(x[i] * inv_sqrt2));
}

// The first non-finite element of t as "N non-finite values, the first at [token t, column c] = nan".
std::string nonfinite_text(const FloatArray& t, int64_t d) {
  int64_t count = 0;
  std::size_t first = 0;
  for (std::size_t e = 0; e < t.numel(); ++e)
    if (!std::isfinite(t.data[e]) && count++ == 0) first = e;
  if (!count) return {};
  const float v = t.data[first];
  return std::to_string(count) + " non-finite value(s), the first at [token " +
         std::to_string(static_cast<int64_t>(first) / d) + ", column " +
         std::to_string(static_cast<int64_t>(first) % d) + "] = " +
         (std::isnan(v) ? "nan"
          : v > 0       ? "inf"
                        : "-inf");
}

// ---- fp64 pieces
// -------------------------------------------------------------------------------------------

void linear_f64(const double* x, int64_t rows, const DoubleArray& w, const DoubleArray& b, double* y) {
  const int64_t out = w.shape[0], in = w.shape[1];
  const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  tbb::parallel_for(int64_t{0}, tasks, [&](int64_t task) {
    const int64_t r0 = task * kRowsPerTask, nr = std::min(kRowsPerTask, rows - r0);
    for (int64_t r = 0; r < nr; ++r) std::copy_n(b.ptr(), out, y + (r0 + r) * out);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(nr), static_cast<blasint>(out),
                static_cast<blasint>(in), 1.0, x + r0 * in, static_cast<blasint>(in), w.ptr(),
                static_cast<blasint>(in), 1.0, y + r0 * out, static_cast<blasint>(out));
  });
}

// Exact softmax attention in fp64 on [n, d] projections, head h = columns [h D, (h+1) D) (MultiHeadLayer's
// split), scale 1/sqrt(D), optional causal mask (key j <= query i); writes the merged heads to o [n, d].
void attention_f64(const DoubleArray& q, const DoubleArray& k, const DoubleArray& v, int64_t heads,
                   bool causal, double* o) {
  const int64_t n = q.shape[0], d = q.shape[1], D = d / heads;
  const int64_t blocks = (n + kQueryRowsPerTask - 1) / kQueryRowsPerTask;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  tbb::parallel_for(int64_t{0}, heads * blocks, [&](int64_t task) {
    const int64_t h = task / blocks, i0 = (task % blocks) * kQueryRowsPerTask;
    const int64_t rows = std::min(kQueryRowsPerTask, n - i0);
    std::vector<double> s(static_cast<std::size_t>(rows * n));
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows), static_cast<blasint>(n),
                static_cast<blasint>(D), scale, q.ptr() + i0 * d + h * D, static_cast<blasint>(d),
                k.ptr() + h * D, static_cast<blasint>(d), 0.0, s.data(), static_cast<blasint>(n));
    for (int64_t r = 0; r < rows; ++r) {
      double* sr = s.data() + r * n;
      const int64_t end = causal ? i0 + r + 1 : n;  // keys [0, end) allowed; every row has key 0
      const double mx = *std::max_element(sr, sr + end);
      double sum = 0;
      for (int64_t j = 0; j < end; ++j) sum += (sr[j] = std::exp(sr[j] - mx));
      for (int64_t j = 0; j < end; ++j) sr[j] /= sum;
      std::fill(sr + end, sr + n, 0.0);
    }
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(rows),
                static_cast<blasint>(D), static_cast<blasint>(n), 1.0, s.data(), static_cast<blasint>(n),
                v.ptr() + h * D, static_cast<blasint>(d), 0.0, o + i0 * d + h * D, static_cast<blasint>(d));
  });
}

// The sinusoidal encoding in fp64 (the formula of sinusoidal_encoding, not rounded to fp32).
DoubleArray sinusoidal_f64(int64_t n, int64_t d) {
  DoubleArray pe({n, d});
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < d; ++c) {
      const double inv_freq =
          1.0 / std::pow(10000.0, 2.0 * static_cast<double>(c / 2) / static_cast<double>(d));
      const double angle = static_cast<double>(t) * inv_freq;
      pe.data[static_cast<std::size_t>(t * d + c)] = c % 2 == 0 ? std::sin(angle) : std::cos(angle);
    }
  return pe;
}

void require_finite_f64(const DoubleArray& t, int64_t layer) {
  for (double x : t.data)
    if (!std::isfinite(x))
      throw std::runtime_error("drift: the fp64 reference's hidden state after layer " +
                               std::to_string(layer) +
                               " holds a non-finite value (inputs or weights beyond double range)");
}

}  // namespace

DriftBlockWeights drift_block_weights(int64_t d_model, uint64_t seed, int64_t layer) {
  const int64_t d = d_model, hidden = kDriftFfnMultiplier * d_model;
  DriftBlockWeights w;
  w.attention = random_multihead_weights(d, layer_seed(seed, layer, 0), /*with_bias=*/true);
  const double a1 = 1.0 / std::sqrt(static_cast<double>(d)),
               a2 = 1.0 / std::sqrt(static_cast<double>(hidden));
  w.w1 = uniform({hidden, d}, layer_seed(seed, layer, 1), a1);
  w.b1 = uniform({hidden}, layer_seed(seed, layer, 2), a1);
  w.w2 = uniform({d, hidden}, layer_seed(seed, layer, 3), a2);
  w.b2 = uniform({d}, layer_seed(seed, layer, 4), a2);
  return w;
}

DriftModel::DriftModel(FloatArray token_rows, int64_t heads, int64_t layers, uint64_t seed, bool causal)
    : rows_(std::move(token_rows)), heads_(heads), seed_(seed), causal_(causal) {
  if (rows_.rank() != 2 || rows_.shape[0] < 1 || rows_.shape[1] < 1)
    throw UsageError("drift: token rows " + rows_.shape_str() + "; expected [tokens, d_model], both >= 1");
  const int64_t n = rows_.shape[0], d = rows_.shape[1];
  if (n > DriftLimits::kMaxTokens)
    throw UsageError("--max-tokens: " + std::to_string(n) + " tokens; at most " +
                     std::to_string(DriftLimits::kMaxTokens) + " (use --max-tokens N to keep the first N)");
  if (d > DriftLimits::kMaxDModel)
    throw UsageError("--d-model: " + std::to_string(d) + "; at most " +
                     std::to_string(DriftLimits::kMaxDModel));
  if (n * d > DriftLimits::kMaxElements)
    throw UsageError(
        "tokens x d_model = " + std::to_string(n) + " x " + std::to_string(d) + " = " +
        std::to_string(n * d) + " values per hidden state; at most " +
        std::to_string(DriftLimits::kMaxElements) +
        " (2^21: the reference keeps every layer's state in fp64); lower --max-tokens or --d-model");
  if (layers < 1 || layers > DriftLimits::kMaxLayers)
    throw UsageError("--layers " + std::to_string(layers) + ": must be in [1, " +
                     std::to_string(DriftLimits::kMaxLayers) + "]");
  if (heads < 1 || d % heads != 0)
    throw UsageError("--heads " + std::to_string(heads) + ": must be >= 1 and divide d_model " +
                     std::to_string(d) + " (head_dim = d_model / heads)");
  for (std::size_t e = 0; e < rows_.numel(); ++e)
    if (!std::isfinite(rows_.data[e]))
      throw UsageError("drift: embedding row of token " + std::to_string(static_cast<int64_t>(e) / d) +
                       " holds a non-finite value");
  for (int64_t l = 1; l <= layers; ++l) {
    blocks_.push_back(drift_block_weights(d, seed, l));
    attention_.emplace_back(blocks_.back().attention, heads);
  }
}

Problem DriftModel::core_problem(const std::string& variant, const Json& params) const {
  MultiHeadCall call;
  call.variant = variant;
  call.params = params;
  call.causal = causal_;
  return attention_.front().core_problem(call, 1, tokens(), tokens());
}

void DriftModel::forward_impl(const std::string& variant, const Json& params,
                              const std::function<void(int64_t, const FloatArray&)>& on_state) const {
  const int64_t n = tokens(), d = d_model(), hidden = kDriftFfnMultiplier * d;
  const Problem p = core_problem(variant, params);  // NotSupported with every reason if it cannot run
  const Attention& core = Registry::instance().get(p.variant);
  auto check = [&](const FloatArray& t, int64_t layer, const std::string& step) {
    if (const std::string what = nonfinite_text(t, t.shape.back()); !what.empty())
      throw DriftNonFinite(
          variant, layer,
          "variant '" + variant + "': layer " + std::to_string(layer) + " (" + step + "): " + what +
              " in the fp32 stack; its error is not reported (a mean over NaN is meaningless)");
  };
  PositionalSpec pos;
  pos.kind = PositionalKind::sinusoidal;
  FloatArray h = apply_positional(rows_, pos);  // fl(row + fl(PE)), as `attnbench embed` writes it
  check(h, 0, "embedding + positions");
  on_state(0, h);
  FloatArray normed({1, n, d}), ffn_hidden({n, hidden}), ffn_out({n, d});
  for (int64_t l = 1; l <= layers(); ++l) {
    const DriftBlockWeights& w = blocks_[static_cast<std::size_t>(l - 1)];
    const MultiHeadLayer& mha = attention_[static_cast<std::size_t>(l - 1)];
    layer_norm(h.ptr(), n, d, normed.ptr());
    check(normed, l, "LayerNorm before attention");
    MultiHeadLayer::HeadsQkv qkv = mha.project(normed, nullptr);
    FloatArray heads_out({1, heads_, n, d / heads_});
    AttentionInputs in;
    in.q = qkv.q.ptr();
    in.k = qkv.k.ptr();
    in.v = qkv.v.ptr();
    in.out = heads_out.ptr();
    core.run(p, in);
    check(heads_out, l, "attention core output, before W_o");
    const FloatArray y = mha.output_projection(heads_out);
    for (std::size_t e = 0; e < h.numel(); ++e) h.data[e] += y.data[e];
    check(h, l, "after the attention residual");
    layer_norm(h.ptr(), n, d, normed.ptr());
    check(normed, l, "LayerNorm before the feed-forward");
    linear_f32(normed.ptr(), n, w.w1, w.b1, ffn_hidden.ptr());
    gelu_inplace(ffn_hidden.ptr(), ffn_hidden.numel());
    linear_f32(ffn_hidden.ptr(), n, w.w2, w.b2, ffn_out.ptr());
    for (std::size_t e = 0; e < h.numel(); ++e) h.data[e] += ffn_out.data[e];
    check(h, l, "after the feed-forward residual");
    on_state(l, h);
  }
}

DriftStates DriftModel::reference() const {
  const int64_t n = tokens(), d = d_model(), hidden = kDriftFfnMultiplier * d;
  DriftStates states;
  DoubleArray h = sinusoidal_f64(n, d);
  for (std::size_t e = 0; e < h.numel(); ++e) h.data[e] += static_cast<double>(rows_.data[e]);
  require_finite_f64(h, 0);
  states.push_back(h);
  DoubleArray normed({n, d}), q({n, d}), k({n, d}), v({n, d}), o({n, d}), y({n, d}), ffn_hidden({n, hidden});
  for (int64_t l = 1; l <= layers(); ++l) {
    const DriftBlockWeights& w = blocks_[static_cast<std::size_t>(l - 1)];
    const MultiHeadWeights& a = w.attention;
    layer_norm(h.ptr(), n, d, normed.ptr());
    linear_f64(normed.ptr(), n, widen(a.w_q), widen(a.b_q), q.ptr());
    linear_f64(normed.ptr(), n, widen(a.w_k), widen(a.b_k), k.ptr());
    linear_f64(normed.ptr(), n, widen(a.w_v), widen(a.b_v), v.ptr());
    attention_f64(q, k, v, heads_, causal_, o.ptr());
    linear_f64(o.ptr(), n, widen(a.w_o), widen(a.b_o), y.ptr());
    for (std::size_t e = 0; e < h.numel(); ++e) h.data[e] += y.data[e];
    layer_norm(h.ptr(), n, d, normed.ptr());
    linear_f64(normed.ptr(), n, widen(w.w1), widen(w.b1), ffn_hidden.ptr());
    gelu_inplace(ffn_hidden.ptr(), ffn_hidden.numel());
    linear_f64(ffn_hidden.ptr(), n, widen(w.w2), widen(w.b2), y.ptr());
    for (std::size_t e = 0; e < h.numel(); ++e) h.data[e] += y.data[e];
    require_finite_f64(h, l);
    states.push_back(h);
  }
  return states;
}

DriftLayerMetrics drift_compare(int64_t layer, const FloatArray& got, const DoubleArray& want) {
  if (got.numel() != want.numel() || got.rank() < 1)
    throw std::logic_error("drift_compare: shapes " + got.shape_str() + " and " + want.shape_str() +
                           " differ");
  const int64_t dim = got.shape.back(), rows = static_cast<int64_t>(got.numel()) / dim;
  const ErrorMetrics m = compare_outputs(got.ptr(), want.ptr(), rows, dim);
  DriftLayerMetrics out;
  out.layer = layer;
  out.rel_l2 = m.rel_l2_err;
  out.max_abs_err = m.max_abs_err;
  // 1 - cos(a, b) = |a/|a| - b/|b||^2 / 2: no cancellation, so a cosine within 1e-16 of 1 keeps its digits
  // (1 - gw / sqrt(gg ww) would be rounding noise at the fp32 baseline's level). Two zero rows agree (0); one
  // zero row against a nonzero one is orthogonal (1).
  double ss = 0, one_minus_sum = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = got.ptr() + r * dim;
    const double* w = want.ptr() + r * dim;
    double gg = 0, ww = 0;
    for (int64_t c = 0; c < dim; ++c) gg += static_cast<double>(g[c]) * g[c], ww += w[c] * w[c];
    ss += ww;
    if (gg == 0 || ww == 0) {
      one_minus_sum += (gg == 0 && ww == 0) ? 0.0 : 1.0;
      continue;
    }
    const double ig = 1.0 / std::sqrt(gg), iw = 1.0 / std::sqrt(ww);
    double dd = 0;
    for (int64_t c = 0; c < dim; ++c) {
      const double e = static_cast<double>(g[c]) * ig - w[c] * iw;
      dd += e * e;
    }
    one_minus_sum += 0.5 * dd;
  }
  out.one_minus_cosine = rows ? one_minus_sum / static_cast<double>(rows) : 0.0;
  out.mean_cosine = 1.0 - out.one_minus_cosine;
  out.ref_rms = std::sqrt(ss / static_cast<double>(want.numel()));
  return out;
}

}  // namespace attn
