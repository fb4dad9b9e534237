// Stage 3 of a sweep (config -> plan -> runner -> store): measures one point. Per point, in order: support
// and memory-budget check (skip_reason), inputs (made once per input set), timing with the resident-memory
// probe, output sanity (NaN/Inf from finite inputs fails the point), accuracy against the fp64 exact softmax
// reference (computed once per input set and shared by every variant measured on it). Also the calibration
// whose results are the rows' denominators (sgemm and the fp32 FMA peak per thread count and SIMD target,
// and the memory bandwidth per thread count).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "bench/lib/inputs.hpp"
#include "bench/lib/measure.hpp"
#include "bench/lib/plan.hpp"
#include "bench/lib/result_row.hpp"
#include "common/tensor.hpp"

namespace attn {

struct Calibration {
  std::map<int, double> sgemm_gflops;                        // threads -> GFLOP/s
  std::map<std::pair<int, std::string>, double> fma_gflops;  // (threads, SIMD target that ran) -> GFLOP/s
  std::map<int, double> bandwidth_gbytes_per_s;              // threads -> GB/s (best streaming read)
};

// Measures what `meta` (a resumed sweep's meta.json) does not already hold, for every thread count and
// target of the config, prints each figure, and records them in meta ("sgemm_calibration", "fma_peak",
// "memory_bandwidth", "blas_note"). It runs before the first point is timed, never during one. Stops
// measuring when `stop()` turns true (the caller's interrupt flag).
Calibration calibrate(const SweepConfig& resolved, Json& meta, const std::function<bool()>& stop);

class PointRunner {
 public:
  explicit PointRunner(const SweepConfig& resolved);
  void set_calibration(Calibration calibration) { calibration_ = std::move(calibration); }
  // The point's row: status "ok", "skipped" (with the reason) or "failed" (an exception, NaN/Inf output).
  ResultRow measure(const SweepPoint& pt);
  bool memory_probe_supported() const { return probe_.supported(); }

 private:
  void time_and_compare(const SweepPoint& pt, const Attention& variant, ResultRow& row);

  const SweepConfig& config_;
  Calibration calibration_;
  MemoryProbe probe_;
  // Inputs and the fp64 reference of the last input set: points sharing inputs are adjacent in the plan.
  PointInputs inputs_;
  std::string inputs_key_;
  std::string reference_key_;
  std::vector<int64_t> reference_rows_;
  DoubleArray reference_;
};

}  // namespace attn
