// `attnbench run`: drives the sweep's stages (config -> plan -> runner -> store) over a plan: --filter,
// --shard (one shard of the plan into OUT/shards/I-of-N), --dry-run (text or --json), interrupt handling
// (SIGINT/SIGTERM end in a folder --resume accepts), the calibration, progress and the closing summary.
#pragma once
#include <string>

#include "bench/lib/plan.hpp"
#include "bench/lib/shard.hpp"

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
  std::string shard;         // `run --shard I/N` or `slurm/N` (parse_shard); "" = the whole plan
};

// The Slurm job facts of this process (SLURM_JOB_ID, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID,
// SLURM_NODELIST, SLURM_CLUSTER_NAME, SLURM_JOB_PARTITION) as strings; an empty object outside Slurm.
Json slurm_environment();

// The points of `plan` whose id contains `filter` (all when empty); UsageError when it matches none.
std::vector<SweepPoint> filter_points(const Plan& plan, const std::string& filter);

// Returns the exit code: 0 all points ok or skipped, 1 some point failed, 130 interrupted (SIGINT/SIGTERM).
// SIGINT and SIGTERM get the sweep's handler while it runs (a Ctrl-C stops after the current point), and the
// previous handlers are restored after exactly as they were (sigaction: handler, mask and flags), so the
// Python module's run() gives the interpreter its own handler back.
int run_sweep(const Plan& plan, const SweepOptions& options);
// The same with the points measured by `executor` (run_sweep above uses the local PointRunner).
class Executor;
int run_sweep(const Plan& plan, const SweepOptions& options, Executor& executor);

// What `attnbench run CONFIG` does, for the CLI and the Python module's run(): checks the options (--resume
// with --force, --json without --dry-run; UsageError), selects options.isa for the duration (restored
// after), loads and plans the config, then run_sweep. Everything is validated before the output folder is
// touched.
int run_sweep_config(const std::string& config_path, const SweepOptions& options);

}  // namespace attn
