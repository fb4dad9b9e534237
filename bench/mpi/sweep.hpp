// `attnbench_mpi run CONFIG`: a sweep config's points measured with ring attention (ring.hpp). It reuses the
// config parser and the plan of bench/lib (the same points, ids and inputs as `attnbench run`) and writes its
// own results folder: results.jsonl (one result_row per point, to_json, plus `ranks`, `bytes_sent_per_rank`
// and the per-rank statistics under `ring`), results.csv (the result_row columns) and meta.json.
// Scope: variant tiled, fp32, mask none or causal, self-attention, no RoPE or bias or dropout; any other
// point is a "skipped" row saying why.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace attn::ring {

struct SweepOptions {
  std::string config, out, isa = "best", filter;
  bool force = false, resume = false;
};
void add_sweep_options(CLI::App& sub, SweepOptions& o);
// Collective. `threads` is the --threads value in force (a point's own thread count is set per point).
int run_sweep(const SweepOptions& o, int threads);

}  // namespace attn::ring
