// `attnbench run`: drives the sweep's stages (config -> plan -> runner -> store) over a plan: --filter,
// --dry-run (text or --json), interrupt handling (SIGINT/SIGTERM end in a folder --resume accepts), the
// calibration, progress and the closing summary.
#pragma once
#include <string>

#include "bench/lib/plan.hpp"

namespace attn {

struct SweepOptions {
  std::string out_dir;       // default results/<config name>
  bool resume = false;       // continue an interrupted sweep in out_dir (the config must be unchanged)
  bool force = false;        // replace existing results in out_dir
  std::string filter;        // only points whose id contains this substring
  bool dry_run = false;      // print the plan (with skip reasons and memory estimates); write nothing
  bool json = false;         // with dry_run: one JSON object per point (plan.hpp point_json), one per line
  bool progress_tty = true;  // one rewriting progress line on a terminal (else one plain line per point)
  std::string isa = "best";  // `run --isa`, already applied to the plan; kept in meta.json for --resume
};

// The points of `plan` whose id contains `filter` (all when empty); UsageError when it matches none.
std::vector<SweepPoint> filter_points(const Plan& plan, const std::string& filter);

// Returns the exit code: 0 all points ok or skipped, 1 some point failed, 130 interrupted (SIGINT/SIGTERM).
int run_sweep(const Plan& plan, const SweepOptions& options);

}  // namespace attn
