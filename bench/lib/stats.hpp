// The statistics of the harness, in one place: the median and its distribution-free confidence interval,
// percentiles, the summary of a point's repetitions (measure.hpp times them), and the two-sample tests
// `attnbench compare` runs (the Mann-Whitney U test, the spread of pairwise ratios).
#pragma once
#include <cstdint>
#include <vector>

namespace attn {

// The distribution-free confidence interval of the median of n samples: [x(l), x(n+1-l)] (1-based order
// statistics) with l the largest rank whose coverage 1 - 2 P(Binomial(n, 1/2) <= l - 1) is at least
// `level`. No assumption on the distribution (timings are skewed and heavy-tailed). ok = false below 6
// samples at 95%, where even [min, max] covers less (1 - 2^(1-n)).
struct MedianInterval {
  bool ok = false;
  double lo = 0, hi = 0;
  double level = 0;  // the exact coverage of the chosen ranks
  int rank = 0;      // l
};
MedianInterval median_interval(std::vector<double> samples, double level = 0.95);
// The coverage of ranks [l, n+1-l] for n samples (exact binomial up to n = 4096, normal beyond).
double order_statistic_coverage(int64_t n, int64_t l);

struct TimingStats {
  double median_ms = 0, p10_ms = 0, p90_ms = 0, mean_ms = 0, cv = 0;  // cv = stddev / mean
  int reps = 0;
  std::vector<double> samples_ms;
  MedianInterval ci;  // 95%
};

TimingStats summarize(std::vector<double> samples_ms);

// The exact null distribution of U is used up to this many samples on each side (and without ties).
inline constexpr int kExactMannWhitneyMax = 50;

struct MannWhitney {
  double u = 0;        // U of the first sample: pairs (x_i, y_j) with x_i > y_j, a tie counting 1/2
  double p_value = 1;  // two-sided
  bool exact = false;  // exact null distribution (else the normal approximation)
};

// The two-sided Mann-Whitney U test of x against y: the p-value of scipy.stats.mannwhitneyu(x, y,
// method="exact") when no value is tied and neither side has more than kExactMannWhitneyMax values, else of
// method="asymptotic" (use_continuity=True). Both need at least one value.
MannWhitney mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y);

// The q-quantile (q in [0, 1]) by linear interpolation between closest ranks (numpy's default, as the rows'
// p10 / p90 in bench/lib/measure.cpp).
double percentile_linear(std::vector<double> values, double q);

// The q-quantile (as percentile_linear) of the n1 n2 pairwise ratios b_j / a_i, found without forming them (a
// point may have up to 100,000 repetitions a side). Every a_i > 0, every b_j >= 0, both finite and non-empty.
double pairwise_ratio_percentile(const std::vector<double>& a, const std::vector<double>& b, double q);

}  // namespace attn
