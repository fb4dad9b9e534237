// Timing statistics, the sgemm calibration, the per-target FMA peak (common/simd.hpp) and the memory probe.
#include "bench/lib/measure.hpp"

#include <malloc.h>

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

TimingStats summarize(std::vector<double> samples) {
  TimingStats t;
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

TimingStats time_repeated(const std::function<void()>& fn, const MeasureSettings& s) {
  using clock = std::chrono::steady_clock;
  for (int i = 0; i < s.warmup; ++i) fn();
  std::vector<double> samples;
  double total = 0;
  while (true) {
    const auto t0 = clock::now();
    fn();
    const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    samples.push_back(ms);
    total += ms / 1000.0;
    const int n = static_cast<int>(samples.size());
    if (n >= s.max_reps || total >= s.max_time_s) break;
    if (n >= s.min_reps && total >= s.min_time_s) break;
  }
  return summarize(std::move(samples));
}

SgemmCalibration calibrate_sgemm(int threads, int64_t size, int reps) {
  SgemmCalibration c;
  c.threads = threads;
  c.size = size;
  const std::size_t n = static_cast<std::size_t>(size * size);
  AlignedVector<float> a(n), b(n), out(n);
  fill_normal(a.data(), static_cast<int64_t>(n), 11);
  fill_normal(b.data(), static_cast<int64_t>(n), 12);
  set_blas_threads(threads);
  MeasureSettings ms;
  ms.warmup = 1;
  ms.min_reps = reps;
  ms.max_reps = reps;
  ms.min_time_s = 0;
  ms.max_time_s = 60;
  c.timing = time_repeated(
      [&] {
        sgemm(false, false, size, size, size, 1.0f, a.data(), size, b.data(), size, 0.0f, out.data(), size);
      },
      ms);
  set_blas_threads(1);
  c.gflops = 2.0 * static_cast<double>(size) * size * size / (c.timing.median_ms * 1e6);
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
