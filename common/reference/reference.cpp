// fp64 reference attention, comparison metrics and derived tolerances.
#include "common/reference/reference.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "common/interface/half.hpp"
#include "common/kernels/alibi.hpp"
#include "common/kernels/dropout.hpp"
#include "common/kernels/mask.hpp"
#include "common/support/random.hpp"

namespace attn {

namespace {
// The unit roundoff of the precision weights are rounded to (0 for fp32: the fp32 bounds already hold its
// roundings): round to nearest even leaves a relative error of at most 2^-8 in bf16 (8 significant bits)
// and 2^-11 in fp16 (11). Weights are at most 1 and, after the variants' flush to zero, 0 or normal in fp32;
// in fp16 a weight below 2^-14 is subnormal and keeps an absolute error up to 2^-25 instead, which the
// bounds below do not cover (no variant rounds weights to fp16 today).
double weight_unit(DType t) {
  switch (t) {
    case DType::bf16:
      return std::ldexp(1.0, -8);
    case DType::fp16:
      return std::ldexp(1.0, -11);
    case DType::fp32:
      break;
  }
  return 0.0;
}
}  // namespace

void reference_attention(const Problem& p, const AttentionInputs& in16, double* out,
                         const std::vector<int64_t>* rows, DType weights) {
  check_inputs(p, in16, /*needs_out=*/false);  // the result goes to `out`; in.out is not used
  // bf16 / fp16 storage: the exact fp32 values of the stored inputs (widening is exact).
  const WideInputs wide(p, in16);
  const AttentionInputs& in = wide.get();
  const bool alibi = p.bias == Bias::alibi;
  const std::vector<double> slopes = alibi ? alibi_slopes(p, in) : std::vector<double>();
  const int64_t D = p.head_dim, Dv = p.value_dim(), Lq = p.seq_q, Lkv = p.seq_kv;
  const int64_t nrows = rows ? static_cast<int64_t>(rows->size()) : Lq;
  const double scale = p.effective_scale();
  // Parallel over (batch, head): each task writes its own rows, so the result is independent of threads.
  tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    std::vector<double> s(static_cast<std::size_t>(Lkv));
    const float* q = in.q + bh * Lq * D;
    // Grouped-query: the group's shared K/V head; a reserved cache or strided V read in place
    // (AttentionInputs::kv_capacity, v_row_stride).
    const int64_t block_rows = kv_block_rows(p, in), ldv = v_row_stride(p, in);
    const float* k = in.k + p.kv_block(b, h) * block_rows * D;
    const float* v = in.v + p.kv_block(b, h) * block_rows * ldv;
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t i = rows ? (*rows)[static_cast<std::size_t>(r)] : r;
      double* o = out + (bh * nrows + r) * Dv;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < Lkv; ++j) {
        if (!key_allowed(p, in, b, i, j)) {
          s[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(q[i * D + d]) * k[j * D + d];
        s[j] = acc * scale;
        if (p.softcap) s[j] = *p.softcap * std::tanh(s[j] / *p.softcap);
        if (alibi) s[j] -= slopes[static_cast<std::size_t>(h)] * alibi_distance(p, i, j);
        mx = std::isnan(s[j]) || std::isnan(mx) ? std::numeric_limits<double>::quiet_NaN()
                                                : std::max(mx, s[j]);
      }
      std::fill(o, o + Dv, 0.0);
      // Fully masked row: zeros. (A NaN logit, from a NaN or Inf input, is not a mask: mx is NaN then, and
      // the NaN reaches the output row as it does in every variant.)
      if (mx == -std::numeric_limits<double>::infinity()) continue;
      // A sink logit joins the denominator only.
      const double sink = p.sinks ? static_cast<double>(in.sink_logits[h]) : 0.0;
      if (p.sinks && !std::isnan(mx)) mx = std::max(mx, sink);
      double sum = p.sinks ? std::exp(sink - mx) : 0.0;
      for (int64_t j = 0; j < Lkv; ++j) {
        s[j] = std::exp(s[j] - mx);  // exp(-inf) = 0 for masked keys
        sum += s[j];
      }
      const DropoutRow drop = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, b, h, i) : DropoutRow();
      for (int64_t j = 0; j < Lkv; ++j) {
        if (s[j] == 0) continue;
        double w = s[j] / sum;
        if (weights != DType::fp32) w = widen(weights, round_to(weights, static_cast<float>(w)));
        if (p.dropout > 0) w = drop.keep(j) ? w * (1.0 / (1.0 - p.dropout)) : 0.0;
        for (int64_t d = 0; d < Dv; ++d) o[d] += w * v[j * ldv + d];
      }
    }
  });
}

ErrorMetrics compare_outputs(const float* got, const double* want, int64_t rows, int64_t dim) {
  ErrorMetrics m;
  m.rows = rows;
  double diff2 = 0, want2 = 0, cos_sum = 0;
  bool nonfinite = false;
  for (int64_t r = 0; r < rows; ++r) {
    double gg = 0, ww = 0, gw = 0;
    bool row_bad = false;
    for (int64_t d = 0; d < dim; ++d) {
      const float g = got[r * dim + d];
      const double w = want[r * dim + d];
      if (std::isnan(g)) ++m.nan_count;
      if (std::isinf(g)) ++m.inf_count;
      if (!std::isfinite(g)) {
        row_bad = true;
        if (std::isfinite(w)) nonfinite = true;
        continue;
      }
      const double e = std::fabs(g - w);
      m.max_abs_err = std::max(m.max_abs_err, e);
      diff2 += e * e;
      want2 += w * w;
      gg += static_cast<double>(g) * g;
      ww += w * w;
      gw += g * w;
    }
    if (row_bad) continue;  // contributes cosine 0
    if (gg == 0 && ww == 0)
      cos_sum += 1;
    else if (gg > 0 && ww > 0)
      cos_sum += gw / std::sqrt(gg * ww);
  }
  m.rel_l2_err = want2 > 0 ? std::sqrt(diff2 / want2) : std::sqrt(diff2);
  m.mean_cosine = rows > 0 ? cos_sum / static_cast<double>(rows) : 1.0;
  if (nonfinite) {
    m.max_abs_err = std::numeric_limits<double>::infinity();
    m.rel_l2_err = std::numeric_limits<double>::infinity();
  }
  return m;
}

std::vector<int64_t> sample_rows(int64_t seq_q, int64_t count) {
  std::vector<int64_t> rows;
  if (count >= seq_q || count <= 0) {
    for (int64_t i = 0; i < seq_q; ++i) rows.push_back(i);
    return rows;
  }
  if (count == 1) return {seq_q - 1};
  for (int64_t r = 0; r < count; ++r) rows.push_back(r * (seq_q - 1) / (count - 1));
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

std::vector<float> gather_rows(const float* x, int64_t bh, int64_t seq, int64_t dim,
                               const std::vector<int64_t>& rows) {
  std::vector<float> out(static_cast<std::size_t>(bh) * rows.size() * dim);
  for (int64_t h = 0; h < bh; ++h)
    for (std::size_t r = 0; r < rows.size(); ++r)
      std::copy_n(x + (h * seq + rows[r]) * dim, dim, out.data() + (h * rows.size() + r) * dim);
  return out;
}

// Why this bound. With u = 2^-24 (fp32 unit roundoff), S = scale * max_i ||q_i|| * max_j ||k_j||:
//  * a logit s_ij = scale * sum_d q_id k_jd accumulates D products: |error| <= D * u * S (Cauchy-Schwarz
//    bounds sum_d |q_id k_jd| by ||q_i|| ||k_j||), plus one rounding for the scale;
//  * exp(s_ij - max) then carries a relative error of about 2 * D * u * S (both s_ij and the max move) plus a
//    few ulps for the exp itself (the exp2 polynomial of common/kernels/simd-inl.hpp: 1.5 ulp, plus |s_ij -
//    max| * u from the log2(e) multiply, <= 2 * S * u and so inside the first term; online-softmax rescales
//    add one rounding per key tile);
//  * the normaliser and the weighted sum of values accumulate Lkv terms each, and the weights sum to 1, so
//    each adds A(Lkv) * u * max|v| to the output error, A(n) the growth factor of an n-term sum. Its worst
//    case is n (every rounding the same way), but then the bound grows like Lkv * u * max|v| while the
//    output change of a dropped key shrinks like max|v| / Lkv: at Lkv = 4096 = u^-1/2 a kernel one key off
//    passed (tests/test_tolerance.cpp). Rounding errors of independent sign grow like sqrt(n): Higham and
//    Mary (SIAM J. Sci. Comput. 41(5), 2019, Thm 2.4) bound an n-term sum's error by lambda sqrt(n) u
//    sum|x_i| with probability at least 1 - 2n exp(-lambda^2 (1 - u)^2 / 2). We take A(n) = min(n,
//    kLambda sqrt(n)), lambda = 8: a failure probability under 1e-10 per sum at n = 4096, and the worst
//    case itself up to n = 64. The model's exception is stagnation (many terms each under u of the running
//    sum, all rounded away): with weights that needs logits spread by ln(1/u) ~ 17 (S >= 8), where the
//    logit term 2 D S and the 4x margin below cover the worst case for D >= 64 up to Lkv = 4096.
// Total |error| <= u * max|v| * (2 * D * S + 2 * A(Lkv) + 16) / (1 - p) for dropout p; we allow 4x that,
// since the bound assumes worst-case accumulation only in magnitude while blocked BLAS reorders sums. A wrong
// mask, scale or index produces errors of order max|v| / Lkv or more, above this at every size we test (one
// key off and a 2% scale error at n = 4096: tests/test_tolerance.cpp).
//
// ALiBi adds -slope * dist to each logit, computed in fp32 by the variants: the product and the sum each
// round once, so a logit carries at most 2 * u * |bias| more; the weights sum to 1, so that is at most
// 2 * u * max|bias| * max|v| more in the output (max|bias| = max slope * (seq_q + seq_kv)).
//
// Weights rounded to bf16 before P V (weights != fp32, unit roundoff u_w = 2^-8): with the normaliser summed
// from the same rounded values (as tiled does), weight w_j becomes w_j (1 + d_j) / (1 + d) with |d_j| <= u_w
// and d = sum_j w_j d_j, so sum_j |w~_j - w_j| <= 2 u_w / (1 - u_w), and the output moves by at most that
// times max|v| (over the kept weights, / (1 - p) with dropout). A baseline that rounds the normalised
// weights without renormalising (reference_attention's `weights`) moves by u_w max|v| at most.
double sum_growth(int64_t n) {
  constexpr double kLambda = 8.0;  // see exact_abs_tolerance's derivation above
  const double len = static_cast<double>(n);
  return std::min(len, kLambda * std::sqrt(len));
}

double exact_abs_tolerance(const Problem& p, const AttentionInputs& in16, DType weights) {
  const WideInputs wide(p, in16);
  const AttentionInputs& in = wide.get();
  auto max_row_norm = [](const float* x, int64_t rows, int64_t dim) {
    double best = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t d = 0; d < dim; ++d) s += static_cast<double>(x[r * dim + d]) * x[r * dim + d];
      best = std::max(best, s);
    }
    return std::sqrt(best);
  };
  const int64_t bh = p.batch * p.heads, bkv = p.batch * p.num_kv_heads();
  const double qn = max_row_norm(in.q, bh * p.seq_q, p.head_dim);
  // K and V through their layout (a reserved cache of kv_block_rows rows per block, V rows v_row_stride
  // apart, e.g. MLA's latent inside K): only the seq_kv rows and d_v values the attention reads.
  const int64_t rows = kv_block_rows(p, in), ldv = v_row_stride(p, in), dv = p.value_dim();
  double kn = 0, vmax = 0;
  for (int64_t kb = 0; kb < bkv; ++kb) {
    kn = std::max(kn, max_row_norm(in.k + kb * rows * p.head_dim, p.seq_kv, p.head_dim));
    for (int64_t j = 0; j < p.seq_kv; ++j) {
      const float* v = in.v + (kb * rows + j) * ldv;
      for (int64_t e = 0; e < dv; ++e) vmax = std::max(vmax, std::fabs(static_cast<double>(v[e])));
    }
  }
  const double u = std::ldexp(1.0, -24);
  const double S = p.effective_scale() * qn * kn;
  double bias_max = 0;
  if (p.bias == Bias::alibi)
    for (double sl : alibi_slopes(p, in))
      bias_max = std::max(bias_max, std::fabs(sl) * static_cast<double>(p.seq_q + p.seq_kv));
  // Soft-capping adds the tanh's and the products' rounding, 8 u C per logit at most; a sink logit (one
  // rounding in base 2) moves every weight by at most 2 u |sink| relative.
  const double cap = p.softcap ? 8.0 * *p.softcap : 0.0;
  double sink_max = 0;
  if (p.sinks)
    for (int64_t h = 0; h < p.heads; ++h) sink_max = std::max(sink_max, std::fabs((double)in.sink_logits[h]));
  const double uw = weight_unit(weights);
  const double bound = (u * vmax *
                            (2.0 * p.head_dim * S + 2.0 * sum_growth(p.seq_kv) + 16.0 + 2.0 * bias_max +
                             2 * cap + 2.0 * sink_max) +
                        2.0 * uw / (1.0 - uw) * vmax) /
                       (1.0 - p.dropout);
  return 4.0 * bound + std::numeric_limits<float>::min();
}

}  // namespace attn

// ---- The backward pass ----

namespace attn {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// What the fp64 gradient and its error bound share: the widened inputs, the logits in double, dropout.
class Fp64Softmax {
 public:
  Fp64Softmax(const Problem& p, const AttentionInputs& in16)
      : p_(p), wide_(p, in16), in_(wide_.get()), scale_(p.effective_scale()) {
    if (p.bias == Bias::alibi) slopes_ = alibi_slopes(p, in_);
  }
  const Problem& p() const { return p_; }
  const AttentionInputs& in() const { return in_; }
  double scale() const { return scale_; }
  double keep_scale() const { return p_.dropout > 0 ? 1.0 / (1.0 - p_.dropout) : 1.0; }
  // Q rows of query head h of batch entry b, and the K, V rows of K/V block bkv.
  const float* q(int64_t b, int64_t h) const { return in_.q + (b * p_.heads + h) * p_.seq_q * p_.head_dim; }
  const float* k(int64_t bkv) const { return in_.k + bkv * p_.seq_kv * p_.head_dim; }
  const float* v(int64_t bkv) const { return in_.v + bkv * p_.seq_kv * p_.value_dim(); }
  // The logit of query row i of head h against key j (the bias included), or -inf where masked; `mag`, if
  // given, receives scale * sum_d |q_id k_jd| (the error analysis' magnitude of the sum) and `bias` the bias.
  // `cap`, if given, receives d(capped logit)/d(raw logit) = 1 - tanh^2 (1 without soft-capping).
  double logit(int64_t b, int64_t h, const float* q, const float* k, int64_t i, int64_t j,
               double* mag = nullptr, double* bias = nullptr, double* cap = nullptr) const {
    if (!key_allowed(p_, in_, b, i, j)) return -kInf;
    const int64_t D = p_.head_dim;
    double acc = 0, m = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double t = static_cast<double>(q[i * D + d]) * k[j * D + d];
      acc += t, m += std::fabs(t);
    }
    if (mag) *mag = m * scale_;
    double s = acc * scale_;
    if (p_.softcap) {
      const double t = std::tanh(s / *p_.softcap);
      s = *p_.softcap * t;
      if (cap) *cap = 1 - t * t;
    } else if (cap) {
      *cap = 1;
    }
    const double bb = slopes_.empty() ? 0.0 : slopes_[static_cast<std::size_t>(h)] * alibi_distance(p_, i, j);
    if (bias) *bias = bb;
    return s - bb;
  }
  // Query head h's sink logit (only with Problem::sinks).
  double sink(int64_t h) const { return static_cast<double>(in_.sink_logits[h]); }
  // Row i's weights w = softmax(logits) into `w` (the logits on entry, -inf where masked), with the sink
  // logit `sink` in the denominator when `with_sink`; returns the row's log-sum-exp (the sink included), +inf
  // for a row with no allowed key (w all 0), NaN when a logit is NaN.
  static double softmax(std::vector<double>& w, bool with_sink = false, double sink = 0) {
    double mx = -kInf;
    bool nan = false;
    for (double x : w) nan = nan || std::isnan(x), mx = std::max(mx, x);
    if (nan) mx = std::numeric_limits<double>::quiet_NaN();
    if (mx == -kInf) {
      std::fill(w.begin(), w.end(), 0.0);
      return kInf;
    }
    if (with_sink && !nan) mx = std::max(mx, sink);
    double sum = with_sink ? std::exp(sink - mx) : 0.0;
    for (double& x : w) sum += (x = std::exp(x - mx));
    for (double& x : w) x /= sum;
    return mx + std::log(sum);
  }

 private:
  const Problem& p_;
  const WideInputs wide_;
  const AttentionInputs& in_;
  double scale_;
  std::vector<double> slopes_;
};

// The fp64 gradient of one (batch, K/V head) block: pass 1 over its query rows (dQ, each row's log-sum-exp
// and delta = dO . O), pass 2 over its keys (dK, dV), each parallel with every output element summed by one
// task in a fixed order.
class BlockGradient {
 public:
  BlockGradient(const Fp64Softmax& f, const float* d_out, int64_t bkv)
      : f_(f),
        p_(f.p()),
        d_out_(d_out),
        bkv_(bkv),
        b_(bkv / p_.num_kv_heads()),
        kvh_(bkv % p_.num_kv_heads()) {
    const std::size_t rows = static_cast<std::size_t>(p_.group_size() * p_.seq_q);
    lse_.resize(rows), delta_.resize(rows), sink_grad_.assign(rows, 0.0);
    if (p_.dropout > 0) drops_.resize(rows);
  }
  // dq: the block's query heads [group][seq_q][D].
  void query_pass(double* dq) {
    tbb::parallel_for(int64_t{0}, p_.group_size() * p_.seq_q, [&](int64_t hi) { query_row(hi, dq); });
  }
  // dk, dv: the block's [seq_kv][D] and [seq_kv][Dv].
  // Adds this block's sink-logit gradients into d_sinks[h] (rows in order).
  void add_sink_gradients(double* d_sinks) const {
    for (int64_t g = 0; g < p_.group_size(); ++g)
      for (int64_t i = 0; i < p_.seq_q; ++i)
        d_sinks[head(g)] += sink_grad_[static_cast<std::size_t>(g * p_.seq_q + i)];
  }
  void key_pass(double* dk, double* dv) const {
    tbb::parallel_for(int64_t{0}, p_.seq_kv,
                      [&](int64_t j) { key_row(j, dk + j * p_.head_dim, dv + j * p_.value_dim()); });
  }

 private:
  int64_t head(int64_t g) const { return kvh_ * p_.group_size() + g; }
  const float* d_out(int64_t h) const { return d_out_ + (b_ * p_.heads + h) * p_.seq_q * p_.value_dim(); }

  // Row hi = g * seq_q + i: weights w, w~ = w after dropout, O = sum w~ v, delta = dO . O, dS = w (dP' -
  // delta) with dP' = dO . v (times keep / (1 - p)), and dQ = scale sum dS k.
  void query_row(int64_t hi, double* dq) {
    const int64_t D = p_.head_dim, Dv = p_.value_dim(), Lkv = p_.seq_kv, g = hi / p_.seq_q, i = hi % p_.seq_q,
                  h = head(g);
    const float *q = f_.q(b_, h), *k = f_.k(bkv_), *v = f_.v(bkv_), *go = d_out(h) + i * Dv;
    double* dqi = dq + hi * D;
    std::fill(dqi, dqi + D, 0.0);
    std::vector<double> w(static_cast<std::size_t>(Lkv)), o(static_cast<std::size_t>(Dv), 0.0);
    std::vector<double> cap(static_cast<std::size_t>(Lkv), 1.0);
    for (int64_t j = 0; j < Lkv; ++j) w[j] = f_.logit(b_, h, q, k, i, j, nullptr, nullptr, &cap[j]);
    lse_[hi] = Fp64Softmax::softmax(w, p_.sinks, p_.sinks ? f_.sink(h) : 0.0);
    delta_[hi] = 0;
    if (p_.dropout > 0) drops_[hi] = DropoutRow(p_.dropout, p_.seed, b_, h, i);
    if (lse_[hi] == kInf) return;  // no allowed key: O = 0 and no gradient
    for (int64_t j = 0; j < Lkv; ++j)
      if (const double wd = weight_after_dropout(hi, j, w[j]); wd != 0)
        for (int64_t d = 0; d < Dv; ++d) o[d] += wd * v[j * Dv + d];
    double dl = 0;
    for (int64_t d = 0; d < Dv; ++d) dl += static_cast<double>(go[d]) * o[d];
    delta_[hi] = dl;
    // The sink's weight takes no value: its dS is p_sink (0 - delta).
    if (p_.sinks) sink_grad_[hi] = -std::exp(f_.sink(h) - lse_[hi]) * dl;
    for (int64_t j = 0; j < Lkv; ++j) {
      if (w[j] == 0) continue;  // a masked key (weight exactly 0) receives nothing from this row
      const double ds = f_.scale() * cap[j] * w[j] * (dp_after_dropout(hi, j, go, v + j * Dv) - dl);
      for (int64_t d = 0; d < D; ++d) dqi[d] += ds * k[j * D + d];
    }
  }

  // Key j: dK_j = scale sum_{h, i} dS_ij q_i and dV_j = sum w~_ij dO_i over the group's query rows in order,
  // the weights recomputed from the rows' log-sum-exp.
  void key_row(int64_t j, double* dkj, double* dvj) const {
    const int64_t D = p_.head_dim, Dv = p_.value_dim();
    const float *k = f_.k(bkv_), *v = f_.v(bkv_);
    std::fill(dkj, dkj + D, 0.0);
    std::fill(dvj, dvj + Dv, 0.0);
    for (int64_t g = 0; g < p_.group_size(); ++g) {
      const int64_t h = head(g);
      const float* q = f_.q(b_, h);
      for (int64_t i = 0; i < p_.seq_q; ++i) {
        const int64_t hi = g * p_.seq_q + i;
        double cap = 1;
        const double w =
            std::exp(f_.logit(b_, h, q, k, i, j, nullptr, nullptr, &cap) - lse_[hi]);  // 0: masked
        if (w == 0) continue;
        const float* go = d_out(h) + i * Dv;
        const double ds = f_.scale() * cap * w * (dp_after_dropout(hi, j, go, v + j * Dv) - delta_[hi]);
        const double wd = weight_after_dropout(hi, j, w);
        for (int64_t d = 0; d < D; ++d) dkj[d] += ds * q[i * D + d];
        for (int64_t d = 0; d < Dv; ++d) dvj[d] += wd * go[d];
      }
    }
  }

  double weight_after_dropout(int64_t hi, int64_t j, double w) const {
    if (p_.dropout == 0) return w;
    return drops_[static_cast<std::size_t>(hi)].keep(j) ? w * f_.keep_scale() : 0.0;
  }
  double dp_after_dropout(int64_t hi, int64_t j, const float* go, const float* vj) const {
    double dp = 0;
    for (int64_t d = 0; d < p_.value_dim(); ++d) dp += static_cast<double>(go[d]) * vj[d];
    return weight_after_dropout(hi, j, dp);
  }

  const Fp64Softmax& f_;
  const Problem& p_;
  const float* d_out_;
  int64_t bkv_, b_, kvh_;
  std::vector<double> lse_, delta_, sink_grad_;
  std::vector<DropoutRow> drops_;
};

}  // namespace

void reference_attention_backward(const Problem& p, const AttentionInputs& in16, const float* d_out,
                                  double* dq, double* dk, double* dv, const std::vector<int64_t>* kv_blocks,
                                  double* d_sinks) {
  check_inputs(p, in16, /*needs_out=*/false);
  const Fp64Softmax f(p, in16);
  const int64_t D = p.head_dim, Dv = p.value_dim(), G = p.group_size(), Hkv = p.num_kv_heads();
  if (d_sinks) std::fill(d_sinks, d_sinks + p.heads, 0.0);
  std::vector<int64_t> blocks;
  if (kv_blocks)
    blocks = *kv_blocks;
  else
    for (int64_t x = 0; x < p.batch * Hkv; ++x) blocks.push_back(x);
  for (std::size_t n = 0; n < blocks.size(); ++n) {
    const int64_t bkv = blocks[n], b = bkv / Hkv, kvh = bkv % Hkv;
    // Outputs: in place for the whole problem, compact per listed block otherwise.
    const int64_t at = static_cast<int64_t>(n);
    double* dqb = kv_blocks ? dq + at * G * p.seq_q * D : dq + (b * p.heads + kvh * G) * p.seq_q * D;
    double* dkb = kv_blocks ? dk + at * p.seq_kv * D : dk + bkv * p.seq_kv * D;
    double* dvb = kv_blocks ? dv + at * p.seq_kv * Dv : dv + bkv * p.seq_kv * Dv;
    BlockGradient g(f, d_out, bkv);
    g.query_pass(dqb);
    g.key_pass(dkb, dvb);
    if (d_sinks && p.sinks) g.add_sink_gradients(d_sinks);
  }
}

// Why these bounds: a running error analysis of the backward, element by element, in fp64 from the inputs
// (the magnitudes actually met, not their maxima), with u = 2^-24 and gamma_n = n u the bound of an n-term
// fp32 sum of products (any order, so any blocking or thread split): |fl(sum a_t b_t) - sum a_t b_t| <=
// gamma_n sum |a_t b_t|. For row i of query head h and key j (p = dropout, kd = 1 / (1 - p)):
//  * the logit s_ij = scale q_i . k_j (+ bias): err_s <= (D + 1) u (D = d_k; D_v = d_v below) scale sum_d
//  |q_id k_jd| + 2 u |bias|;
//  * the log-sum-exp lse_i (the forward's, or recomputed): max_j err_s + (L + 2) u (an L-term sum of positive
//    terms is off by L u relative, so its log by L u absolute) + the exp's few ulps;
//  * a weight P_ij = exp(s_ij - lse_i) recomputed from them: relative error eps_ij = err_s + err_lse +
//    2 u (|s_ij| + |lse_i|) (the rounding of the exponent's argument) + 4 u (the exp polynomial);
//  * dP_ij = dO_i . v_j (times keep kd): err <= (D_v + 1) u sum_d |dO_id v_jd|; delta_i = dO_i . O_i:
//    (D_v + 1) u sum_d |dO_id O_id| + sum_d |dO_id| err(O_id), with err(O_id) <= sum_j P~_ij |v_jd| (eps_ij +
//    (L + 1) u) the forward's own (P~ = P after dropout);
//  * dS_ij = P_ij (dP_ij - delta_i): err <= P_ij (err_dP + err_delta + 2 u |dP_ij - delta_i|) + P_ij eps_ij
//    |dP_ij - delta_i|;
//  * dQ_id = scale sum_j dS_ij k_jd: sum_j err_dS |k_jd| + (L + 1) u sum_j |dS_ij k_jd|, times scale;
//    dK_jd = scale sum_{h in group, i} dS_ij q_id and dV_jd = sum P~_ij dO_id likewise over the M' = group *
//    seq_q rows that feed them (dV: P~_ij eps_ij |dO_id| for the weight's error).
//  * weights rounded before P V in the forward (weight_dtype, unit roundoff u_w): the saved normaliser is a
//    sum of rounded weights, off by u_w relative, so err_lse grows by u_w; and O, from the rounded weights,
//    by sum_j P_ij |v_jd| 2 u_w / (1 - u_w) at most (exact_abs_tolerance): eps_ij grows by u_w more (it
//    enters err(O) as that sum, and overstates the recomputed weights' error by u_w, which is safe).
// Each gradient's tolerance is twice the largest elementwise bound (the analysis counts first-order terms;
// the factor covers the products of two small errors it drops), plus the smallest normal float. Worst-case
// accumulation is about sqrt(n) above what random rounding gives, so the bound is tight enough that a wrong
// weight, mask or scale on a single key, far below the gradient's size, still exceeds it.
namespace {

// The running error analysis above for one (batch, K/V head) block: per query row the bound of every dQ
// element (the largest kept), and per key the sums that bound dK and dV.
class BlockBound {
 public:
  BlockBound(const Fp64Softmax& f, const float* d_out, int64_t bkv, double uw)
      : uw_(uw / (1 - uw)),
        f_(f),
        p_(f.p()),
        d_out_(d_out),
        bkv_(bkv),
        b_(bkv / p_.num_kv_heads()),
        kvh_(bkv % p_.num_kv_heads()),
        ek_(static_cast<std::size_t>(p_.seq_kv * p_.head_dim), 0.0),
        ev_(static_cast<std::size_t>(p_.seq_kv * p_.value_dim()), 0.0) {}
  // The block's largest bounds on dq, dk, dv (before the safety factor).
  GradientTolerance run() {
    for (int64_t g = 0; g < p_.group_size(); ++g)
      for (int64_t i = 0; i < p_.seq_q; ++i) row(kvh_ * p_.group_size() + g, i);
    GradientTolerance t;
    t.dq = wq_;
    for (double e : ek_) t.dk = std::max(t.dk, e);
    for (double e : ev_) t.dv = std::max(t.dv, e);
    return t;
  }

 private:
  void row(int64_t h, int64_t i) {
    const int64_t D = p_.head_dim, Dv = p_.value_dim(), Lkv = p_.seq_kv;
    const double u = std::ldexp(1.0, -24), kd = f_.keep_scale();
    const float *q = f_.q(b_, h), *k = f_.k(bkv_), *v = f_.v(bkv_);
    const float* g = d_out_ + ((b_ * p_.heads + h) * p_.seq_q + i) * Dv;
    // Logits and their errors (err_s), the log-sum-exp and its error (err_lse), then eps_ij.
    std::vector<double> w(static_cast<std::size_t>(Lkv)), es(w.size(), 0.0), ds(w.size()), eds(w.size());
    std::vector<double> cap(w.size(), 1.0);
    double es_max = 0;
    for (int64_t j = 0; j < Lkv; ++j) {
      double mag = 0, bias = 0;
      w[j] = f_.logit(b_, h, q, k, i, j, &mag, &bias, &cap[j]);
      if (w[j] == -kInf) continue;
      // Soft-capping scales the raw logit's error by its derivative (<= 1) and adds the division by C, the
      // tanh (a few ulps) and the product by C: 8 u |capped logit| covers them.
      const double capped = p_.softcap ? 8 * u * std::fabs(w[j] + bias) : 0.0;
      es[j] = cap[j] * (D + 1) * u * mag + capped + 2 * u * std::fabs(bias);
      es_max = std::max(es_max, es[j]);
    }
    std::vector<double> s = w;
    const double sink = p_.sinks ? f_.sink(h) : 0.0;
    const double lse = Fp64Softmax::softmax(w, p_.sinks, sink);
    if (!std::isfinite(lse)) return;  // no allowed key (nothing to bound) or NaN (no bound)
    // A sink logit enters in base 2 (one rounding of sink log2(e)).
    const double e_lse = es_max + (Lkv + 4) * u + 2 * u * std::fabs(sink) + uw_;
    const DropoutRow drop = p_.dropout > 0 ? DropoutRow(p_.dropout, p_.seed, b_, h, i) : DropoutRow();
    auto kept = [&](int64_t j) { return p_.dropout == 0 || drop.keep(j); };
    std::vector<double> o(static_cast<std::size_t>(Dv), 0.0), eo(o.size(), 0.0);
    for (int64_t j = 0; j < Lkv; ++j) {
      if (w[j] == 0) continue;
      es[j] += e_lse + 2 * u * (std::fabs(s[j]) + std::fabs(lse)) + 4 * u + uw_;  // eps_ij, relative
      const double wd = kept(j) ? w[j] * kd : 0.0;
      for (int64_t d = 0; d < Dv; ++d) {
        o[d] += wd * v[j * Dv + d];
        eo[d] += wd * std::fabs(v[j * Dv + d]) * (es[j] + (Lkv + 1) * u);
      }
    }
    // dO . O and dO . v_j are d_v-term sums (the logits' are d_k-term: D above).
    double delta = 0, e_delta = 0;
    for (int64_t d = 0; d < Dv; ++d) {
      delta += static_cast<double>(g[d]) * o[d];
      e_delta += (Dv + 1) * u * std::fabs(g[d] * o[d]) + std::fabs(g[d]) * eo[d];
    }
    for (int64_t j = 0; j < Lkv; ++j) {
      if (w[j] == 0) continue;
      double acc = 0, mag = 0;
      for (int64_t d = 0; d < Dv; ++d) {
        const double t = static_cast<double>(g[d]) * v[j * Dv + d];
        acc += t, mag += std::fabs(t);
      }
      const double keep = kept(j) ? kd : 0.0, diff = acc * keep - delta;
      // With soft-capping dS carries the factor 1 - tanh^2, itself off by about 2 |tanh| err(tanh) + u <= 9
      // u.
      ds[j] = cap[j] * w[j] * diff;
      eds[j] = cap[j] * (w[j] * ((Dv + 1) * u * mag * keep + e_delta + 2 * u * std::fabs(diff)) +
                         w[j] * es[j] * std::fabs(diff)) +
               (p_.softcap ? 9 * u * w[j] * std::fabs(diff) : 0.0);
    }
    accumulate(w, ds, eds, es, q + i * D, g, [&](int64_t j) { return kept(j) ? w[j] * kd : 0.0; });
    if (p_.sinks) {  // d sink_h = -sum over rows of p_sink delta: p_sink's relative error as a weight's
      const double ps = std::exp(sink - lse);
      const double eps = e_lse + 2 * u * (std::fabs(sink) + std::fabs(lse)) + 4 * u;
      sink_err_[static_cast<std::size_t>(h - kvh_ * p_.group_size())] +=
          ps * (eps * std::fabs(delta) + e_delta) + (p_.batch * p_.seq_q + 1) * u * ps * std::fabs(delta);
    }
  }

  // dQ's bound for this row, and its terms of every key's dK and dV bounds.
  template <class WeightAfterDropout>
  void accumulate(const std::vector<double>& w, const std::vector<double>& ds, const std::vector<double>& eds,
                  const std::vector<double>& es, const float* qi, const float* g, WeightAfterDropout wd) {
    const int64_t D = p_.head_dim, Dv = p_.value_dim(), Lkv = p_.seq_kv;
    const double u = std::ldexp(1.0, -24), scale = f_.scale();
    const double rows_in = static_cast<double>(p_.group_size() * p_.seq_q);  // terms of one dK / dV sum
    const float* k = f_.k(bkv_);
    for (int64_t d = 0; d < D; ++d) {
      double e = 0;
      for (int64_t j = 0; j < Lkv; ++j)
        if (w[j] != 0)
          e += eds[j] * std::fabs(k[j * D + d]) + (Lkv + 1) * u * std::fabs(ds[j] * k[j * D + d]);
      wq_ = std::max(wq_, scale * e);
    }
    for (int64_t j = 0; j < Lkv; ++j) {
      if (w[j] == 0) continue;
      for (int64_t d = 0; d < D; ++d) {
        const double qa = std::fabs(qi[d]);
        ek_[j * D + d] += scale * (eds[j] * qa + (rows_in + 1) * u * std::fabs(ds[j]) * qa);
      }
      for (int64_t d = 0; d < Dv; ++d)
        ev_[j * Dv + d] += wd(j) * std::fabs(g[d]) * (es[j] + (rows_in + 1) * u);
    }
  }

  const double uw_;  // the weights' rounding in the forward, u_w / (1 - u_w) (0: none)
  const Fp64Softmax& f_;
  const Problem& p_;
  const float* d_out_;
  int64_t bkv_, b_, kvh_;
  double wq_ = 0;
  std::vector<double> ek_, ev_;

 public:
  // Per query head of the group: the bound's terms of that head's sink-logit gradient (summed over blocks).
  std::vector<double> sink_err_ = std::vector<double>(static_cast<std::size_t>(p_.group_size()), 0.0);
};

}  // namespace

GradientTolerance exact_grad_tolerance(const Problem& p, const AttentionInputs& in16, const float* d_out,
                                       DType weights) {
  const Fp64Softmax f(p, in16);
  const int64_t blocks = p.batch * p.num_kv_heads();
  std::vector<GradientTolerance> per_block(static_cast<std::size_t>(blocks));
  std::vector<std::vector<double>> sink_err(static_cast<std::size_t>(blocks));
  tbb::parallel_for(int64_t{0}, blocks, [&](int64_t bkv) {
    BlockBound bound(f, d_out, bkv, weight_unit(weights));
    per_block[bkv] = bound.run();
    sink_err[bkv] = bound.sink_err_;
  });
  GradientTolerance t;
  for (const GradientTolerance& b : per_block)
    t.dq = std::max(t.dq, b.dq), t.dk = std::max(t.dk, b.dk), t.dv = std::max(t.dv, b.dv);
  if (p.sinks) {  // a head's sink gradient sums its rows over every batch entry
    std::vector<double> per_head(static_cast<std::size_t>(p.heads), 0.0);
    for (int64_t bkv = 0; bkv < blocks; ++bkv)
      for (int64_t g = 0; g < p.group_size(); ++g)
        per_head[(bkv % p.num_kv_heads()) * p.group_size() + g] += sink_err[bkv][g];
    for (double e : per_head) t.d_sink_logits = std::max(t.d_sink_logits, 2 * e);
    t.d_sink_logits += std::numeric_limits<float>::min();
  }
  // Twice the analysis (first-order terms only), plus the smallest normal float.
  const double tiny = std::numeric_limits<float>::min();
  t.dq = 2 * t.dq + tiny, t.dk = 2 * t.dk + tiny, t.dv = 2 * t.dv + tiny;
  return t;
}

DirectionalCheck check_reference_gradient(const Attention& variant, const Problem& p,
                                          const AttentionInputs& in, const float* d_out, int directions,
                                          uint64_t seed) {
  if (p.dtype != DType::fp32) throw std::logic_error("check_reference_gradient: fp32 problems only");
  // Multiples of 2^-8 with |x| in [1/8, 16): x +- h U for h = 2^-9, 2^-10 and U a multiple of 2^-8 with |U| <
  // 8 is a multiple of 2^-18 below 2^4 in magnitude: at most 22 significant bits, exact in fp32.
  auto quantise = [](const float* x, int64_t n) {
    std::vector<float> out(static_cast<std::size_t>(n));
    for (int64_t e = 0; e < n; ++e) {
      float v = std::nearbyint(std::clamp(x[e], -15.0f, 15.0f) * 256.0f) / 256.0f;
      if (std::fabs(v) < 0.125f) v = v < 0 ? -0.125f : 0.125f;
      out[e] = v;
    }
    return out;
  };
  const int64_t nq = p.q_elements(), nkv = p.kv_elements(), nv = p.v_elements(), no = p.out_elements();
  std::vector<float> q = quantise(in.q, nq), k = quantise(in.k, nkv), v = quantise(in.v, nv);
  AttentionInputs x = in;
  x.q = q.data(), x.k = k.data(), x.v = v.data(), x.out = nullptr;
  std::vector<double> gq(static_cast<std::size_t>(nq)), gk(static_cast<std::size_t>(nkv)),
      gv(static_cast<std::size_t>(nv));
  variant.reference_backward(p, x, d_out, gq.data(), gk.data(), gv.data());
  std::vector<double> o(static_cast<std::size_t>(no));
  auto loss = [&](const AttentionInputs& at) {
    variant.reference_forward(p, at, o.data());
    double l = 0;
    for (int64_t e = 0; e < no; ++e) l += static_cast<double>(d_out[e]) * o[e];
    return l;
  };
  double gnorm2 = 0;
  for (double g : gq) gnorm2 += g * g;
  for (double g : gk) gnorm2 += g * g;
  for (double g : gv) gnorm2 += g * g;
  const double n_total = static_cast<double>(nq + nkv + nv);
  Rng rng(seed);
  DirectionalCheck res;
  std::vector<float> uq(q.size()), uk(k.size()), uv(v.size()), pq(q.size()), pk(k.size()), pv(v.size());
  for (int dir = 0; dir < directions; ++dir) {
    auto draw = [&](std::vector<float>& u) {
      for (float& e : u) e = std::nearbyint(std::clamp(rng.normal(), -7.9, 7.9) * 256.0) / 256.0f;
    };
    draw(uq), draw(uk), draw(uv);
    double analytic = 0, unorm2 = 0;
    for (std::size_t e = 0; e < uq.size(); ++e) analytic += gq[e] * uq[e], unorm2 += double(uq[e]) * uq[e];
    for (std::size_t e = 0; e < uk.size(); ++e) analytic += gk[e] * uk[e], unorm2 += double(uk[e]) * uk[e];
    for (std::size_t e = 0; e < uv.size(); ++e) analytic += gv[e] * uv[e], unorm2 += double(uv[e]) * uv[e];
    // The central difference at step h: (L(x + hU) - L(x - hU)) / 2h, every perturbed value exact.
    auto central = [&](float h) {
      double l[2];
      for (int side = 0; side < 2; ++side) {
        const float sh = side == 0 ? h : -h;
        for (std::size_t e = 0; e < q.size(); ++e) pq[e] = q[e] + sh * uq[e];
        for (std::size_t e = 0; e < k.size(); ++e) pk[e] = k[e] + sh * uk[e];
        for (std::size_t e = 0; e < v.size(); ++e) pv[e] = v[e] + sh * uv[e];
        AttentionInputs at = x;
        at.q = pq.data(), at.k = pk.data(), at.v = pv.data();
        l[side] = loss(at);
      }
      return (l[0] - l[1]) / (2.0 * h);
    };
    // Richardson: the central difference is g.U + c h^2 + O(h^4); (4 D(h/2) - D(h)) / 3 removes the h^2 term.
    // Steps of 2^-9, 2^-10 (not 2^-6, 2^-7): the O(h^4) remainder of a strongly curved definition (nystrom's
    // six pinv iterations: up to 7e-4 relative at 2^-6) falls by 2^12, and a perturbation of at most 2^-7 per
    // entry rarely crosses a kink of a piecewise-smooth one (nystrom's max column sum); fp64 rounding over h
    // stays near 1e-12.
    const double fd = (4.0 * central(1.0f / 1024) - central(1.0f / 512)) / 3.0;
    const double typical = std::sqrt(gnorm2 * unorm2 / n_total);  // the size of g.U for a random U
    const double rel = std::fabs(fd - analytic) / std::max({std::fabs(analytic), typical, 1e-300});
    if (dir == 0 || !(rel <= res.worst_rel)) res.worst_rel = rel, res.fd = fd, res.analytic = analytic;
    ++res.directions;
  }
  return res;
}

}  // namespace attn
