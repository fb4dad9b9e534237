// `attnbench_mpi run CONFIG`: a sweep config's points measured with ring attention (ring.hpp), through the
// one sweep driver of bench/lib (run_sweep) with the ring as its executor: the same plan, ids and inputs as
// `attnbench run`, the same results folder (meta.json, results.jsonl, results.csv, --resume / --force), rows
// filled the same way plus the ring's figures (`ranks`, `bytes_sent_per_rank`, `rank0_whole_tensors_bytes`,
// the per-rank statistics under `ring`; ids end in ",ranks=P").
// Scope: variants claiming block partials, fp32, mask none or causal, self-attention, forward, no RoPE, bias
// or dropout; any other point is a "skipped" row saying why.
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
