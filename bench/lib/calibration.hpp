// The calibrations a sweep's rows are divided by: the OpenBLAS sgemm (frac_sgemm), the fp32 FMA peak of each
// SIMD target (frac_peak) and the streaming-read memory bandwidth (frac_bandwidth), per thread count,
// measured before the first point (and again between points, runner.hpp), and recorded in meta.json's
// "calibrations".
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "bench/lib/config.hpp"
#include "bench/lib/interference.hpp"
#include "bench/lib/measure.hpp"
#include "common/interface/params.hpp"

namespace attn {

struct SgemmCalibration {
  int threads = 1;
  int64_t size = 0;  // M = N = K
  double gflops = 0;
  TimingStats timing;
};

// The sgemm size of the calibration (and of the groups' sgemm): large enough to run near the BLAS's peak.
inline constexpr int64_t kCalibrationSgemmSize = 2048;

// SgemmBench on `threads` threads: one warm-up call, then `reps` timed ones; gflops from the median.
SgemmCalibration calibrate_sgemm(int threads, int64_t size = kCalibrationSgemmSize, int reps = 5);

// The machine's fp32 FMA throughput on `threads` cores for the active SIMD target (simd::active_isa(); run it
// under simd::ScopedIsa to measure another): each thread runs simd::fma_chains (12 independent chains of the
// target's full-width FMA, held in registers) for about 0.1 s, all threads at once, twice; gflops is the
// better round's sum of the threads' rates (2 FLOPs per lane per FMA). It bounds what any fp32 kernel on
// that target can reach, whichever BLAS is installed: rows report frac_peak = gflops / the peak of their own
// target and thread count. It does not depend on the compiler's -march flags.
struct FmaPeak {
  int threads = 1;
  std::string isa;  // the target that ran, e.g. "avx3", "avx2", "neon", "scalar"
  double gflops = 0;
  int lanes = 0;  // fp32 lanes per vector on that target
};
FmaPeak calibrate_fma_peak(int threads);

struct Calibration {
  std::map<int, double> sgemm_gflops;                        // threads -> GFLOP/s
  std::map<std::pair<int, std::string>, double> fma_gflops;  // (threads, SIMD target that ran) -> GFLOP/s
  std::map<int, double> bandwidth_gbytes_per_s;              // threads -> GB/s (best streaming read)
  int64_t index = 0;  // the entry of meta.json "calibrations" the sgemm and FMA figures come from
};

// One measurement of the compute denominators: sgemm per thread count and the FMA peak per thread count and
// target, with the interference seen while it ran (a calibration is timed like a point).
struct ComputeCalibration {
  std::map<int, double> sgemm_gflops;
  std::map<std::pair<int, std::string>, double> fma_gflops;
  Json sgemm = Json::array(), fma = Json::array();  // meta.json's entries
  std::string best_isa;
  InterferenceSummary interference;
};
ComputeCalibration measure_compute_calibration(const SweepConfig& resolved, const std::function<bool()>& stop,
                                               bool print);
// Appends `c` to meta["calibrations"] as {index, timestamp, after_points, reason, used, interference, sgemm,
// fma_peak}.
void record_calibration(Json& meta, const ComputeCalibration& c, const std::string& reason,
                        int64_t after_points, bool used);

// The calibration at the start of a run, for every thread count and target of the config: prints each
// figure and records it in meta ("calibrations"; the first run's also as "sgemm_calibration" and
// "fma_peak"; "memory_bandwidth" when not already there; "blas_note"). It runs before the first point is
// timed, never during one. Stops measuring when `stop()` turns true (the caller's interrupt flag).
Calibration calibrate(const SweepConfig& resolved, Json& meta, const std::function<bool()>& stop);

}  // namespace attn
