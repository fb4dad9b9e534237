// Measurement primitives: repetition timing (its statistics are stats.hpp's), the OpenBLAS sgemm yardstick
// and the FMA peak, and the per-point resident-memory high-water mark.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/lib/stats.hpp"
#include "common/support/aligned.hpp"

namespace attn {

struct MeasureSettings {
  int warmup = 1;
  int min_reps = 3;
  int max_reps = 50;
  double min_time_s = 0.2;  // keep repeating until this much time has been measured...
  double max_time_s = 10;   // ...but stop after this much (at least one measured repetition)
  // > 0: stop as soon as min_reps are in and the 95% interval of the median is within ± target_rel_ci ×
  // median, even before min_time_s; a wider interval keeps repeating up to max_reps / max_time_s. 0: off.
  double target_rel_ci = 0;
  // Interference (bench/lib/interference.hpp): a point whose score exceeds max_interference is measured
  // again, up to max_remeasure more times, keeping the cleanest; the sgemm / FMA-peak calibration is
  // measured again every calibrate_every points (0: only at the start) and after interference was seen.
  double max_interference = 0.05;
  int max_remeasure = 2;
  int calibrate_every = 20;
  // The points of a sweep that share one input set are timed together, in rounds (time_interleaved), so a
  // drift in the machine's speed lands on all of them alike and their ratios keep; false: one after another.
  bool interleave = true;
  // The calibration's sgemm call joins the rounds of each timed group (one point when interleave is off), one
  // call per thread count of its points, when it costs at most half a round; the group's rows divide by it
  // (ResultRow::group_sgemm): frac_sgemm then follows the machine's speed while the group runs.
  bool group_sgemm = true;
  // A streaming read of a memory-bound point's own K and V (as stored) joins its group's rounds as a
  // follower, one per point left of the calibration's ridge (flops / bytes below FMA peak / bandwidth; for
  // 16-bit K/V 16 times that, room for a matrix engine such as AMX), when
  // it costs at most twice a round; the row's frac_bandwidth divides by it round by round
  // (ResultRow::group_bandwidth): it then follows the machine's memory speed while the group runs, for the
  // level of the hierarchy that holds that many bytes.
  bool group_bandwidth = true;
};

// Runs `fn` settings.warmup times, then repeats until min_reps and min_time_s are both reached (or, with
// target_rel_ci, min_reps and a tight enough interval), or max_reps or max_time_s is (at least one measured
// repetition always). time_interleaved with one call timed by the clock around `fn`.
TimingStats time_repeated(const std::function<void()>& fn, const MeasureSettings& settings);

// Several calls timed together, each returning the milliseconds it measured itself (so set-up such as
// a thread-count scope stays outside the time) or a negative value when it failed. `settings.warmup` untimed
// rounds, then timed rounds: each round makes one call of every call still taking part, in alternating order
// (0 .. k-1, then k-1 .. 0), so a change in the machine's speed during the rounds reaches every call alike
// and a trend within a round cancels over two. A call leaves when it reaches its own max_reps or max_time_s
// or fails; the rounds end when every call has either left or met time_repeated's stopping rule (calls that
// met it keep taking part while others have not, which is what keeps the calls' samples side by side). So
// sample r of every call was taken in round r: samples of two calls pair up round by round. `stop()` is
// asked between rounds; when it turns true the timing ends early with interrupted set.
struct InterleavedTiming {
  std::vector<TimingStats> stats;  // per call; a call that failed has the samples before it failed
  std::vector<bool> failed;
  int rounds = 0;  // timed rounds
  bool interrupted = false;
};
// `followers` (optional, one flag per call): a follower takes part in every round like the others (until its
// own max_reps / max_time_s) but never keeps the rounds going: the rounds end when the other calls are done.
InterleavedTiming time_interleaved(const std::vector<std::function<double()>>& calls,
                                   const MeasureSettings& settings,
                                   const std::function<bool()>& stop = nullptr,
                                   const std::vector<bool>& followers = {});

// Square fp32 C = A·B with its operands allocated and filled once: the compute yardstick of the sgemm
// calibration and of the interleaved groups. A call on t threads splits C's rows into t slabs, each one
// single-threaded OpenBLAS sgemm, run as TBB tasks under a ThreadScope of t: the way the BLAS-based variants
// run, so no OpenBLAS thread pool is left spinning on the cores the next timed call uses.
class SgemmBench {
 public:
  explicit SgemmBench(int64_t size = 2048);
  double call_ms(int threads);  // one timed call (the ThreadScope outside the time)
  int64_t size() const { return size_; }
  double flops() const { return flops_of(size_); }
  static double flops_of(int64_t size) {
    const auto n = static_cast<double>(size);
    return 2.0 * n * n * n;
  }

 private:
  int64_t size_;
  AlignedVector<float> a_, b_, c_;
};

// Resident memory: the process high-water mark is reset (Linux /proc/self/clear_refs "5") before a point,
// so the peak read after it belongs to that point alone. malloc_trim(0) first returns the free memory of
// every malloc arena to the system, so an earlier point's freed memory is not silently reused (it would not
// show in the high-water mark). glibc's allocation policy is left alone: a variant that reuses its workspace
// across calls is timed as it would run in an application.
class MemoryProbe {
 public:
  MemoryProbe();                  // checks that the high-water mark can be reset
  void reset();                   // trims the heap, resets the high-water mark, records the current RSS
  int64_t peak_increase() const;  // high-water mark now minus the RSS at reset(); -1 if unsupported
  bool supported() const { return supported_; }

 private:
  int64_t base_ = 0;
  bool supported_ = false;
};

int64_t current_rss_bytes();
int64_t peak_rss_bytes();  // VmHWM

}  // namespace attn
