// Timing statistics, sgemm calibration and the memory probe.
#include "bench/lib/measure.hpp"

#include <immintrin.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>

#include "common/aligned.hpp"
#include "common/random.hpp"
#include "common/runtime.hpp"

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
// 12 independent accumulators cover the FMA latency (4 cycles) times two FMA pipes with room to spare; the
// empty asm keeps the compiler from merging the chains or hoisting them out of the loop. Returns seconds.
template <class Vec, Vec (*Fma)(Vec, Vec, Vec), Vec (*Set)(float)>
double fma_chains(int64_t iterations) {
  Vec acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = Set(static_cast<float>(i) * 1e-3f);
  const Vec a = Set(0.999999f), b = Set(1e-7f);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = Fma(acc[i], a, b);
    for (int i = 0; i < 12; ++i) asm volatile("" : "+v"(acc[i]));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int i = 0; i < 12; ++i) asm volatile("" ::"v"(acc[i]));
  return s;
}

#if defined(__AVX512F__)
__m512 fma512(__m512 a, __m512 b, __m512 c) {
  return _mm512_fmadd_ps(a, b, c);
}
__m512 set512(float x) {
  return _mm512_set1_ps(x);
}
constexpr int kFmaLanes = 16;
constexpr const char* kFmaIsa = "avx512";
double fma_run(int64_t it) {
  return fma_chains<__m512, fma512, set512>(it);
}
#elif defined(__FMA__) && defined(__AVX2__)
__m256 fma256(__m256 a, __m256 b, __m256 c) {
  return _mm256_fmadd_ps(a, b, c);
}
__m256 set256(float x) {
  return _mm256_set1_ps(x);
}
constexpr int kFmaLanes = 8;
constexpr const char* kFmaIsa = "avx2";
double fma_run(int64_t it) {
  return fma_chains<__m256, fma256, set256>(it);
}
#else
constexpr int kFmaLanes = 0;
constexpr const char* kFmaIsa = "";
double fma_run(int64_t) {
  return 0;
}
#endif

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
  peak.isa = kFmaIsa;
  if (kFmaLanes == 0) return peak;
  // Size the run on one thread (about 0.1 s), then run it on every thread at once, twice, keeping the
  // faster round (the first may include frequency ramp-up).
  int64_t iterations = 1 << 20;
  while (fma_run(iterations) < 0.05) iterations *= 2;
  const double flops_per_thread = 2.0 * kFmaLanes * 12.0 * static_cast<double>(iterations);
  for (int round = 0; round < 2; ++round) {
    std::vector<double> seconds(static_cast<std::size_t>(threads));
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { seconds[t] = fma_run(iterations); });
    for (auto& th : pool) th.join();
    double gflops = 0;
    for (double sec : seconds) gflops += flops_per_thread / (sec * 1e9);
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
