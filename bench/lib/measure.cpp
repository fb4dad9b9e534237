// Timing statistics, the sgemm calibration, the per-target FMA peak (common/simd.hpp) and the memory probe.
#include "bench/lib/measure.hpp"

#include <malloc.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <latch>
#include <numeric>
#include <string>
#include <thread>

#include "common/aligned.hpp"
#include "common/random.hpp"
#include "common/runtime.hpp"
#include "common/simd.hpp"

namespace attn {

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

namespace {
// time_repeated's stopping rule for one call's samples so far.
struct RepState {
  std::vector<double> samples;
  double total_s = 0;
  bool left = false;  // reached max_reps / max_time_s, or failed

  bool capped(const MeasureSettings& s) const {
    return static_cast<int>(samples.size()) >= s.max_reps || total_s >= s.max_time_s;
  }
  bool satisfied(const MeasureSettings& s) const {
    const int n = static_cast<int>(samples.size());
    if (n < s.min_reps) return false;
    if (s.target_rel_ci <= 0) return total_s >= s.min_time_s;
    const MedianInterval ci = median_interval(samples);
    if (!ci.ok) return false;
    std::vector<double> sorted = samples;
    std::nth_element(sorted.begin(), sorted.begin() + n / 2, sorted.end());
    const double median = sorted[static_cast<std::size_t>(n / 2)];
    return median > 0 && std::max(ci.hi - median, median - ci.lo) <= s.target_rel_ci * median;
  }
};
}  // namespace

InterleavedTiming time_interleaved(const std::vector<std::function<double()>>& calls,
                                   const MeasureSettings& s, const std::function<bool()>& stop,
                                   const std::vector<bool>& followers) {
  const std::size_t k = calls.size();
  if (!followers.empty() && followers.size() != k)
    throw std::logic_error("time_interleaved: one follower flag per call");
  InterleavedTiming out;
  std::vector<RepState> st(k);
  out.failed.assign(k, false);
  auto call = [&](std::size_t i, bool timed) {
    const double ms = calls[i]();
    if (ms < 0) {
      out.failed[i] = true;
      st[i].left = true;
      return;
    }
    if (!timed) return;
    st[i].samples.push_back(ms);
    st[i].total_s += ms / 1000.0;
    if (st[i].capped(s)) st[i].left = true;
  };
  auto round = [&](bool timed, bool reverse) {
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t i = reverse ? k - 1 - j : j;
      if (!st[i].left) call(i, timed);
    }
  };
  bool reverse = false;
  for (int w = 0; w < s.warmup; ++w, reverse = !reverse) round(false, reverse);
  while (true) {
    bool more = false;
    for (std::size_t i = 0; i < k; ++i)
      more |= !(followers.empty() ? false : followers[i]) && !st[i].left &&
              (st[i].samples.empty() || !st[i].satisfied(s));
    if (!more) break;
    if (stop && stop()) {
      out.interrupted = true;
      break;
    }
    round(true, reverse);
    reverse = !reverse;
    ++out.rounds;
  }
  for (RepState& r : st) out.stats.push_back(summarize(std::move(r.samples)));
  return out;
}

TimingStats time_repeated(const std::function<void()>& fn, const MeasureSettings& s) {
  using clock = std::chrono::steady_clock;
  const std::function<double()> timed = [&] {
    const auto t0 = clock::now();
    fn();
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  };
  return std::move(time_interleaved({timed}, s).stats[0]);
}

SgemmBench::SgemmBench(int64_t size)
    : size_(size),
      a_(static_cast<std::size_t>(size * size)),
      b_(static_cast<std::size_t>(size * size)),
      c_(static_cast<std::size_t>(size * size)) {
  fill_normal(a_.data(), size * size, 11);
  fill_normal(b_.data(), size * size, 12);
}

double SgemmBench::call_ms(int threads) {
  ThreadScope scope(threads);
  const int slabs = scope.threads();
  const auto t0 = std::chrono::steady_clock::now();
  tbb::parallel_for(
      tbb::blocked_range<int>(0, slabs, 1),
      [&](const tbb::blocked_range<int>& r) {
        for (int i = r.begin(); i != r.end(); ++i) {
          const int64_t row0 = size_ * i / slabs, rows = size_ * (i + 1) / slabs - row0;
          sgemm(false, false, rows, size_, size_, 1.0f, a_.data() + row0 * size_, size_, b_.data(), size_,
                0.0f, c_.data() + row0 * size_, size_);
        }
      },
      tbb::static_partitioner());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

SgemmCalibration calibrate_sgemm(int threads, int64_t size, int reps) {
  SgemmCalibration c;
  c.threads = threads;
  c.size = size;
  SgemmBench bench(size);
  MeasureSettings ms;
  ms.warmup = 1;
  ms.min_reps = reps;
  ms.max_reps = reps;
  ms.min_time_s = 0;
  ms.max_time_s = 60;
  c.timing = std::move(time_interleaved({[&] { return bench.call_ms(threads); }}, ms).stats[0]);
  c.gflops = bench.flops() / (c.timing.median_ms * 1e6);
  return c;
}

namespace {
int64_t status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = key;
  while (std::getline(f, line))
    if (line.compare(0, k.size(), k) == 0) return std::stoll(line.substr(k.size() + 1));
  return -1;
}
}  // namespace

FmaPeak calibrate_fma_peak(int threads) {
  FmaPeak peak;
  peak.threads = threads;
  peak.isa = simd::active_isa();
  // Size the run on one thread: double until it takes 50 ms, then scale to about 0.1 s.
  int64_t iterations = 1 << 16;
  simd::FmaRun probe = simd::fma_chains(iterations);
  while (probe.seconds < 0.05 && iterations < (int64_t{1} << 40)) {
    iterations *= 2;
    probe = simd::fma_chains(iterations);
  }
  iterations = std::max<int64_t>(
      1, static_cast<int64_t>(static_cast<double>(iterations) * 0.1 / std::max(probe.seconds, 1e-9)));
  peak.lanes = probe.lanes;
  // Every thread at once (a latch releases them together), twice, keeping the faster round: the first may
  // include frequency ramp-up.
  for (int round = 0; round < 2; ++round) {
    std::vector<simd::FmaRun> runs(static_cast<std::size_t>(threads));
    std::latch start(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        start.arrive_and_wait();
        runs[static_cast<std::size_t>(t)] = simd::fma_chains(iterations);
      });
    for (auto& th : pool) th.join();
    double gflops = 0;
    for (const simd::FmaRun& r : runs) gflops += r.flops / (r.seconds * 1e9);
    peak.gflops = std::max(peak.gflops, gflops);
  }
  return peak;
}

int64_t current_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return -1;
  return resident * 4096;
}

int64_t peak_rss_bytes() {
  const int64_t kib = status_kib("VmHWM:");
  return kib < 0 ? -1 : kib * 1024;
}

MemoryProbe::MemoryProbe() {
  std::ofstream f("/proc/self/clear_refs");
  supported_ = static_cast<bool>(f << "5" << std::flush) && peak_rss_bytes() >= 0;
}

void MemoryProbe::reset() {
  malloc_trim(0);
  if (supported_) {
    std::ofstream f("/proc/self/clear_refs");
    f << "5" << std::flush;
  }
  base_ = current_rss_bytes();
}

int64_t MemoryProbe::peak_increase() const {
  if (!supported_) return -1;
  // VmHWM is updated lazily by the kernel from RSS counters; take the larger of it and the current RSS.
  const int64_t peak = std::max(peak_rss_bytes(), current_rss_bytes());
  return std::max<int64_t>(0, peak - base_);
}

}  // namespace attn
