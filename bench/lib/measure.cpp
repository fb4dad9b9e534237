// Repetition timing, the sgemm calibration, the per-target FMA peak (common/kernels/simd.hpp) and the memory
// probe.
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

#include "common/kernels/simd.hpp"
#include "common/support/aligned.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"

namespace attn {

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
