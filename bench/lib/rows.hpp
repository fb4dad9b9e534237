// A result row's contents that do not depend on who measured the point, filled in one place for the local
// runner and attnbench_mpi's ring: the row a point starts as (base_row: identity, the estimates from the
// sizes) and its timing with the rates and fractions of a calibration (fill_timing). Accuracy is
// accuracy.hpp's.
#pragma once
#include <string>

#include "bench/lib/calibration.hpp"
#include "bench/lib/plan.hpp"
#include "bench/lib/result_row.hpp"
#include "bench/lib/stats.hpp"

namespace attn {

// The row a point starts as (identity and estimates filled, measurements null). `isa` is the target that
// runs it (simd::active_isa() under the point's simd::ScopedIsa).
ResultRow base_row(const SweepPoint& pt, const SweepConfig& resolved, const std::string& isa);

// The point as `run --dry-run --json` prints it: id, problem, inputs (regime, seed), mask, threads, isa,
// accuracy mode and rows, FLOPs, bytes moved, memory, skip reason and its base row.
Json point_json(const SweepPoint& pt, const SweepConfig& resolved);

// time_ms from `t`: median, percentiles, mean, cv, the repetitions and the median's interval (also the
// quality harness's training-step times, through the Python module's timing_summary).
TimingSummary time_summary(const TimingStats& t);

// time_ms from `t` (time_summary), flops and gflops, and the fractions: frac_sgemm and frac_peak of `cal` at
// the row's threads (and frac_peak at the row's isa), gbytes_per_s and frac_bandwidth from the row's bytes;
// `cal` null: no fractions (calibration null too).
void fill_timing(ResultRow& row, const TimingStats& t, double flops, const Calibration* cal);

}  // namespace attn
