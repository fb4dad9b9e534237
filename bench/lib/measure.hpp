// Measurement primitives: repetition timing with robust statistics, the OpenBLAS sgemm calibration, and the
// per-point resident-memory high-water mark.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "bench/lib/sweep_config.hpp"

namespace attn {

struct TimingStats {
  double median_ms = 0, p10_ms = 0, p90_ms = 0, mean_ms = 0, cv = 0;  // cv = stddev / mean
  int reps = 0;
  std::vector<double> samples_ms;
};

TimingStats summarize(std::vector<double> samples_ms);

// Runs `fn` settings.warmup times, then repeats until min_reps and min_time_s are both reached, or max_reps or
// max_time_s is (at least one measured repetition always).
TimingStats time_repeated(const std::function<void()>& fn, const MeasureSettings& settings);

struct SgemmCalibration {
  int threads = 1;
  int64_t size = 0;  // M = N = K
  double gflops = 0;
  TimingStats timing;
};

// Square sgemm through OpenBLAS with its own `threads` threads (restored to 1 after).
SgemmCalibration calibrate_sgemm(int threads, int64_t size = 2048, int reps = 5);

// Resident memory: the process high-water mark is reset (Linux /proc/self/clear_refs "5") before a point,
// so the peak read after it belongs to that point alone. Large allocations are served by mmap (threshold fixed
// at 1 MiB) and returned on free, so earlier points' memory neither lingers nor gets reused unseen.
class MemoryProbe {
 public:
  MemoryProbe();               // fixes the malloc mmap threshold
  void reset();                // trims the heap, resets the high-water mark, records the current RSS
  int64_t peak_increase() const;  // high-water mark now minus the RSS at reset(); -1 if unsupported
  bool supported() const { return supported_; }

 private:
  int64_t base_ = 0;
  bool supported_ = false;
};

int64_t current_rss_bytes();
int64_t peak_rss_bytes();  // VmHWM

}  // namespace attn
