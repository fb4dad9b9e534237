// The seam between the one sweep driver (sweep.hpp run_sweep: filter, shard, dry run, signals, the results
// folder, progress and summary) and what measures points: the local PointRunner (runner.hpp) in
// `attnbench run` and the Python module, or attnbench_mpi's ring across ranks (bench/mpi/sweep.cpp). Every
// executor starts a point's row from base_row and fills its timing and accuracy with the shared fillers
// (rows.hpp, accuracy.hpp), so a row means the same whoever measured it.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/lib/plan.hpp"
#include "bench/lib/result_row.hpp"

namespace attn {

class Executor {
 public:
  virtual ~Executor() = default;

  // Facts meta.json records beside the system ("memory_probe", "ranks", "program" ...).
  virtual Json machine_facts() const = 0;
  // After the results folder is opened: what --resume must also find unchanged (UsageError otherwise; the
  // ring: the rank count). `meta` is the folder's meta.json (the resumed run's when resuming).
  virtual void check_resume(const Json& meta) const { (void)meta; }
  // Before the first point: the calibrations the rows are divided by, recorded in `meta` (may record
  // nothing). Stops early when `stop()` turns true.
  virtual void prepare(Json& meta, const std::function<bool()>& stop) = 0;
  // Between groups (e.g. a recalibration); returns whether `meta` changed. `rows_written` counts the rows in
  // the folder so far.
  virtual bool between_groups(Json& meta, int64_t rows_written, const std::function<bool()>& stop) {
    (void)meta, (void)rows_written, (void)stop;
    return false;
  }
  // Whether the points of one input set are measured together (measure.interleave): the driver then hands
  // them over as one group.
  virtual bool groups_input_sets(const SweepConfig& config) const = 0;
  // The id the point's row gets (the ring appends ",ranks=P"): what --resume looks for.
  virtual std::string row_id(const SweepPoint& pt) const { return pt.id; }
  // The rows of `group` (points in plan order; each ends ok, skipped with the reason, or failed). `stop()`
  // is asked between timed rounds: when it turns true, `interrupted` is set and no rows are returned.
  virtual std::vector<ResultRow> measure(const std::vector<SweepPoint>& group,
                                         const std::function<bool()>& stop, bool& interrupted) = 0;
};

}  // namespace attn
