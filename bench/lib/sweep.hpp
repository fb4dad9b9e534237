// The sweep runner: measures every point of a plan (speed, memory, accuracy against the fp64 exact reference)
// and writes results that survive a crash: results.jsonl (one flushed, fsynced line per point), meta.json,
// and results.csv (written atomically at the end). --resume measures only what is missing.
#pragma once
#include <string>
#include <vector>

#include "bench/lib/sweep_config.hpp"

namespace attn {

struct SweepOptions {
  std::string out_dir;       // default results/<config name>
  bool resume = false;       // continue an interrupted sweep in out_dir (the config must be unchanged)
  bool force = false;        // replace existing results in out_dir
  std::string filter;        // only points whose id contains this substring
  bool dry_run = false;      // print the plan (with skip reasons and memory estimates); write nothing
  bool progress_tty = true;  // one rewriting progress line on a terminal (else one plain line per point)
  std::string isa = "best";  // `run --isa`: the target of every point when the config has no sweep.isa
                             // (apply_isa_option); kept in meta.json, --resume requires the same
};

// Returns the exit code: 0 all points ok or skipped, 1 some point failed, 130 interrupted (SIGINT/SIGTERM).
int run_sweep(const SweepConfig& config, const SweepOptions& options);

// Reads results.jsonl. A torn last line (a crash mid-write) is dropped and, if `repair`, cut from the file;
// a bad line anywhere else is an error naming the line.
std::vector<nlohmann::json> read_results_jsonl(const std::string& path, bool repair);

// The CSV view of the rows (one column per scalar field, nested fields flattened with '.').
std::string results_csv(const std::vector<nlohmann::json>& rows);

}  // namespace attn
