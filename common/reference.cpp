// fp64 reference attention, comparison metrics and derived tolerances.
#include "common/reference.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/alibi.hpp"
#include "common/dropout.hpp"
#include "common/half.hpp"
#include "common/mask.hpp"

namespace attn {

void reference_attention(const Problem& p, const AttentionInputs& in16, double* out,
                         const std::vector<int64_t>* rows) {
  check_inputs(p, in16, /*needs_out=*/false);  // the result goes to `out`; in.out is not used
  // bf16 / fp16 storage: the exact fp32 values of the stored inputs (widening is exact).
  const WideInputs wide(p, in16);
  const AttentionInputs& in = wide.get();
  const bool alibi = p.bias == Bias::alibi;
  const std::vector<double> slopes = alibi ? alibi_slopes(p, in) : std::vector<double>();
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv;
  const int64_t nrows = rows ? static_cast<int64_t>(rows->size()) : Lq;
  const double scale = p.effective_scale();
  // Parallel over (batch, head): each task writes its own rows, so the result is independent of threads.
  tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) {
    const int64_t b = bh / p.heads, h = bh % p.heads;
    std::vector<double> s(static_cast<std::size_t>(Lkv));
    const float* q = in.q + bh * Lq * D;
    const float* k = in.k + p.kv_block(b, h) * Lkv * D;  // grouped-query: the group's shared K/V head
    const float* v = in.v + p.kv_block(b, h) * Lkv * D;
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t i = rows ? (*rows)[static_cast<std::size_t>(r)] : r;
      double* o = out + (bh * nrows + r) * D;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < Lkv; ++j) {
        if (!key_allowed(p, in, b, i, j)) {
          s[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(q[i * D + d]) * k[j * D + d];
        s[j] = acc * scale;
        if (alibi) s[j] -= slopes[static_cast<std::size_t>(h)] * alibi_distance(p, i, j);
        mx = std::isnan(s[j]) || std::isnan(mx) ? std::numeric_limits<double>::quiet_NaN()
                                                : std::max(mx, s[j]);
      }
      std::fill(o, o + D, 0.0);
      // Fully masked row: zeros. (A NaN logit, from a NaN or Inf input, is not a mask: mx is NaN then, and
      // the NaN reaches the output row as it does in every variant.)
      if (mx == -std::numeric_limits<double>::infinity()) continue;
      double sum = 0;
      for (int64_t j = 0; j < Lkv; ++j) {
        s[j] = std::exp(s[j] - mx);  // exp(-inf) = 0 for masked keys
        sum += s[j];
      }
      const DropoutRow drop = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, b, h, i) : DropoutRow();
      for (int64_t j = 0; j < Lkv; ++j) {
        if (s[j] == 0) continue;
        double w = s[j] / sum;
        if (p.dropout > 0) w = drop.keep(j) ? w * (1.0 / (1.0 - p.dropout)) : 0.0;
        for (int64_t d = 0; d < D; ++d) o[d] += w * v[j * D + d];
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
//    few ulps for the exp itself (the exp2 polynomial of common/simd-inl.hpp: 1.5 ulp, plus |s_ij - max| * u
//    from the log2(e) multiply, <= 2 * S * u and so inside the first term; online-softmax rescales add one
//    rounding per key tile);
//  * the normaliser and the weighted sum of values accumulate Lkv terms each: Lkv * u relative, and the
//    weights sum to 1, so each adds Lkv * u * max|v| to the output error.
// Total |error| <= u * max|v| * (2 * D * S + 2 * Lkv + 16) / (1 - p) for dropout p; we allow 4x that, since
// the bound assumes worst-case accumulation only in magnitude while blocked BLAS reorders sums. A wrong mask,
// scale or index produces errors of order max|v|, far above this at every size we test.
//
// ALiBi adds -slope * dist to each logit, computed in fp32 by the variants: the product and the sum each
// round once, so a logit carries at most 2 * u * |bias| more; the weights sum to 1, so that is at most
// 2 * u * max|bias| * max|v| more in the output (max|bias| = max slope * (seq_q + seq_kv)).
double exact_abs_tolerance(const Problem& p, const AttentionInputs& in16) {
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
  const double kn = max_row_norm(in.k, bkv * p.seq_kv, p.head_dim);
  double vmax = 0;
  for (int64_t e = 0; e < p.kv_elements(); ++e) vmax = std::max(vmax, std::fabs((double)in.v[e]));
  const double u = std::ldexp(1.0, -24);
  const double S = p.effective_scale() * qn * kn;
  double bias_max = 0;
  if (p.bias == Bias::alibi)
    for (double sl : alibi_slopes(p, in))
      bias_max = std::max(bias_max, std::fabs(sl) * static_cast<double>(p.seq_q + p.seq_kv));
  const double bound =
      u * vmax * (2.0 * p.head_dim * S + 2.0 * p.seq_kv + 16.0 + 2.0 * bias_max) / (1.0 - p.dropout);
  return 4.0 * bound + std::numeric_limits<float>::min();
}

}  // namespace attn
