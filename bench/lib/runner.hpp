// Stage 3 of a sweep (config -> plan -> runner -> store): measures one point. Per point, in order: support
// and memory-budget check (skip_reason), inputs (fp32, with RoPE applied, made once per input set; rounded to
// the point's bf16 / fp16 once per input set and dtype), the RoPE timing (rope_ms, once per input set, thread
// count and target), timing with the resident-memory probe, output sanity (NaN/Inf from finite inputs fails
// the point), accuracy against the fp64 exact softmax reference on the rounded inputs (`accuracy`) and on the
// fp32 ones (`accuracy_e2e`), each computed once per input set, bias (and dtype) and shared by every variant
// measured on it. Also the calibration
// whose results are the rows' denominators (sgemm and the fp32 FMA peak per thread count and SIMD target,
// and the memory bandwidth per thread count).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "bench/lib/inputs.hpp"
#include "bench/lib/measure.hpp"
#include "bench/lib/plan.hpp"
#include "bench/lib/result_row.hpp"
#include "common/half.hpp"
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
  void time_rope(const SweepPoint& pt, ResultRow& row);
  // The fp64 reference of `p` on `in` under `key` into `ref` (kept while the key stays the same).
  void reference_for(const Problem& p, const AttentionInputs& in, const std::string& mode,
                     const std::string& key, std::string& have_key, DoubleArray& ref);

  const SweepConfig& config_;
  Calibration calibration_;
  MemoryProbe probe_;
  // Inputs and the fp64 references of the last input set: points sharing inputs are adjacent in the plan.
  PointInputs inputs_;  // fp32, RoPE applied
  std::string inputs_key_;
  std::unique_ptr<StoredInputs> stored_;  // inputs_ rounded to stored_dtype_ (bf16 / fp16 points)
  DType stored_dtype_ = DType::fp32;
  std::map<std::string, double> rope_ms_;  // "threads|isa" -> median ms, for inputs_key_
  std::vector<int64_t> reference_rows_;
  // On the fp32 inputs (the end-to-end reference; the only one of fp32 points) and on the rounded ones.
  std::string reference_key_, stored_reference_key_;
  DoubleArray reference_, stored_reference_;
};

}  // namespace attn
