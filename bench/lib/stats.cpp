// The statistics (stats.hpp).
#include "bench/lib/stats.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace attn {
namespace {

// The exact null distribution of U without ties: the number of orderings of n1 x's and n2 y's (all
// C(n1 + n2, n1) equally likely under H0) with U = u, for u = 0 .. n1 n2. Conditioning on the largest of the
// n1 + n2 values (an x beats all j y's, a y beats none) gives Mann & Whitney's (1947) recursion
//   count(i, j, u) = count(i - 1, j, u - j) + count(i, j - 1, u),  count(0, j, 0) = count(i, 0, 0) = 1,
// computed row by row in i. The counts reach C(100, 50) ~ 1e29: doubles, sums of positive terms only.
std::vector<double> u_distribution(int n1, int n2) {
  std::vector<std::vector<double>> prev(n2 + 1, std::vector<double>{1.0}), cur(n2 + 1);
  for (int i = 1; i <= n1; ++i) {
    cur[0] = {1.0};
    for (int j = 1; j <= n2; ++j) {
      std::vector<double>& c = cur[j];
      c.assign(static_cast<std::size_t>(i * j + 1), 0.0);
      for (int u = 0; u <= i * j; ++u) {
        double v = 0;
        if (u >= j && u - j <= (i - 1) * j) v += prev[j][u - j];  // the largest is an x
        if (u <= i * (j - 1)) v += cur[j - 1][u];                 // the largest is a y
        c[u] = v;
      }
    }
    std::swap(prev, cur);
  }
  return prev[n2];
}

// The k-th smallest (from 0) of the ratios b_j / a_i (a and b sorted): the smallest double t with more than k
// ratios <= t. Non-negative doubles order as their bit patterns, so a bisection over the patterns between the
// smallest and the largest ratio ends on a ratio itself, exactly, in at most 64 steps of n1 log n2 each.
// Rounded division is monotone in b_j, so counting by binary search agrees with the ratios as computed.
double kth_pairwise_ratio(const std::vector<double>& a, const std::vector<double>& b, uint64_t k) {
  const auto count_at_most = [&](double t) {
    uint64_t n = 0;
    for (double x : a)
      n += static_cast<uint64_t>(
          std::partition_point(b.begin(), b.end(), [&](double y) { return y / x <= t; }) - b.begin());
    return n;
  };
  uint64_t lo = std::bit_cast<uint64_t>(b.front() / a.back()),
           hi = std::bit_cast<uint64_t>(b.back() / a.front());
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (count_at_most(std::bit_cast<double>(mid)) > k)
      hi = mid;
    else
      lo = mid + 1;
  }
  return std::bit_cast<double>(lo);
}

}  // namespace

double order_statistic_coverage(int64_t n, int64_t l) {
  if (n <= 0 || l < 1 || 2 * l > n + 1) return 0;
  if (n > 4096) {  // normal approximation with continuity correction: P(B <= l - 1)
    const double z = (static_cast<double>(l) - 0.5 - 0.5 * static_cast<double>(n)) /
                     (0.5 * std::sqrt(static_cast<double>(n)));
    return 1.0 - std::erfc(-z / std::sqrt(2.0));
  }
  // P(B <= l - 1) = sum_{k < l} C(n, k) 2^-n, each term in log space (2^-n underflows beyond n = 1074).
  double cdf = 0;
  const double log_half_n = static_cast<double>(n) * std::log(0.5);
  for (int64_t k = 0; k < l; ++k)
    cdf += std::exp(std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(k) + 1) -
                    std::lgamma(static_cast<double>(n - k) + 1) + log_half_n);
  return std::max(0.0, 1.0 - 2.0 * cdf);
}

MedianInterval median_interval(std::vector<double> samples, double level) {
  MedianInterval ci;
  const int64_t n = static_cast<int64_t>(samples.size());
  if (n == 0) return ci;
  // Coverage falls as l grows: the largest l whose coverage is still >= level. Up to 4096 samples the
  // binomial CDF is accumulated term by term (one pass); beyond, a binary search on the normal form.
  int64_t l = 0;
  double coverage = 0;
  if (n <= 4096) {
    const double log_half_n = static_cast<double>(n) * std::log(0.5);
    double cdf = 0;  // P(B <= cand - 1)
    for (int64_t cand = 1; 2 * cand <= n + 1; ++cand) {
      cdf += std::exp(std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(cand)) -
                      std::lgamma(static_cast<double>(n - cand + 1) + 1) + log_half_n);  // C(n, cand-1) 2^-n
      const double c = std::max(0.0, 1.0 - 2.0 * cdf);
      if (c < level) break;
      l = cand;
      coverage = c;
    }
  } else {
    int64_t good = 0, bad = (n + 1) / 2 + 1;
    while (bad - good > 1) {
      const int64_t mid = (good + bad) / 2;
      (order_statistic_coverage(n, mid) >= level ? good : bad) = mid;
    }
    l = good;
    coverage = l ? order_statistic_coverage(n, l) : 0;
  }
  if (l == 0) return ci;
  std::sort(samples.begin(), samples.end());
  ci.ok = true;
  ci.rank = static_cast<int>(l);
  ci.level = coverage;
  ci.lo = samples[static_cast<std::size_t>(l - 1)];
  ci.hi = samples[static_cast<std::size_t>(n - l)];
  return ci;
}

TimingStats summarize(std::vector<double> samples) {
  TimingStats t;
  t.ci = median_interval(samples);
  t.reps = static_cast<int>(samples.size());
  t.samples_ms = samples;
  if (samples.empty()) return t;
  std::sort(samples.begin(), samples.end());
  // Linear interpolation between closest ranks (numpy's default percentile).
  auto pct = [&](double q) {
    const double pos = q * static_cast<double>(samples.size() - 1);
    const std::size_t lo = static_cast<std::size_t>(std::floor(pos)),
                      hi = std::min(lo + 1, samples.size() - 1);
    return samples[lo] + (samples[hi] - samples[lo]) * (pos - static_cast<double>(lo));
  };
  t.median_ms = pct(0.5);
  t.p10_ms = pct(0.1);
  t.p90_ms = pct(0.9);
  t.mean_ms = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  double var = 0;
  for (double s : samples) var += (s - t.mean_ms) * (s - t.mean_ms);
  t.cv = samples.size() > 1 && t.mean_ms > 0
             ? std::sqrt(var / static_cast<double>(samples.size() - 1)) / t.mean_ms
             : 0;
  return t;
}

MannWhitney mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.empty() || y.empty()) throw std::invalid_argument("mann_whitney_u: both samples need a value");
  const std::size_t n1 = x.size(), n2 = y.size(), n = n1 + n2;
  std::vector<std::pair<double, bool>> all;  // (value, from x)
  for (double v : x) all.emplace_back(v, true);
  for (double v : y) all.emplace_back(v, false);
  std::sort(all.begin(), all.end(), [](const auto& l, const auto& r) { return l.first < r.first; });
  // Mid-ranks (1-based); tie_term = sum over groups of tied values of t^3 - t.
  double rank_sum_x = 0, tie_term = 0;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && all[j].first == all[i].first) ++j;
    const double mid_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2, t = double(j - i);
    for (std::size_t k = i; k < j; ++k)
      if (all[k].second) rank_sum_x += mid_rank;
    tie_term += t * t * t - t;
    i = j;
  }
  const double dn1 = static_cast<double>(n1), dn2 = static_cast<double>(n2), dn = static_cast<double>(n);
  MannWhitney r;
  r.u = rank_sum_x - dn1 * (dn1 + 1) / 2;
  const bool ties = tie_term > 0;
  if (!ties && n1 <= static_cast<std::size_t>(kExactMannWhitneyMax) &&
      n2 <= static_cast<std::size_t>(kExactMannWhitneyMax)) {
    const std::vector<double> count = u_distribution(static_cast<int>(n1), static_cast<int>(n2));
    const auto u = static_cast<std::size_t>(std::llround(r.u));
    double total = 0, at_most = 0, at_least = 0;
    for (std::size_t k = 0; k < count.size(); ++k) {
      total += count[k];
      if (k <= u) at_most += count[k];
      if (k >= u) at_least += count[k];
    }
    r.exact = true;
    r.p_value = std::min(1.0, 2 * std::min(at_most, at_least) / total);
    return r;
  }
  // The normal approximation (Mann & Whitney 1947) with the variance corrected for ties (Lehmann,
  // "Nonparametrics: Statistical Methods Based on Ranks", 1975, ch. 1) and a continuity correction of 1/2,
  // as scipy.stats.mannwhitneyu(method="asymptotic", use_continuity=True):
  //   mu = n1 n2 / 2,  sigma^2 = n1 n2 / 12 * ((n + 1) - sum_k (t_k^3 - t_k) / (n (n - 1))),
  //   z = (|U - mu| - 1/2) / sigma,  p = 2 (1 - Phi(z)) = erfc(z / sqrt(2)),
  // t_k the size of the k-th group of tied values, n = n1 + n2. Every value tied (sigma = 0): p = 1.
  const double mu = dn1 * dn2 / 2;
  const double var = dn1 * dn2 / 12 * ((dn + 1) - tie_term / (dn * (dn - 1)));
  r.exact = false;
  if (var <= 0) {
    r.p_value = 1;
    return r;
  }
  const double z = (std::fabs(r.u - mu) - 0.5) / std::sqrt(var);
  r.p_value = std::min(1.0, std::erfc(z / std::sqrt(2.0)));
  return r;
}

double percentile_linear(std::vector<double> values, double q) {
  if (values.empty()) throw std::invalid_argument("percentile_linear: no values");
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

double pairwise_ratio_percentile(const std::vector<double>& a, const std::vector<double>& b, double q) {
  if (a.empty() || b.empty()) throw std::invalid_argument("pairwise_ratio_percentile: no values");
  std::vector<double> as = a, bs = b;
  std::sort(as.begin(), as.end());
  std::sort(bs.begin(), bs.end());
  const uint64_t n = static_cast<uint64_t>(as.size()) * bs.size();
  const double pos = q * static_cast<double>(n - 1);
  const auto lo = static_cast<uint64_t>(std::floor(pos));
  const double v_lo = kth_pairwise_ratio(as, bs, lo);
  const double v_hi = lo + 1 < n ? kth_pairwise_ratio(as, bs, lo + 1) : v_lo;
  return v_lo + (v_hi - v_lo) * (pos - static_cast<double>(lo));
}

}  // namespace attn
