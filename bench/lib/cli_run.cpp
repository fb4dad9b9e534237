// `attnbench run CONFIG.json`: the sweep (configs/README.md documents the schema); bench/lib/sweep.hpp drives
// its stages.
#include "bench/lib/command.hpp"
#include "bench/lib/sweep.hpp"

namespace attn::cli {
namespace {

struct RunOptions {
  std::string config;
  SweepOptions sweep;
  bool plain = false;
};

int run_config(RunOptions& o) {
  o.sweep.progress_tty = !o.plain;
  return run_sweep_config(o.config, o.sweep);
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND(
    "run", "run a sweep from a JSON config; writes results.jsonl, results.csv, meta.json", [](CLI::App& sub) {
      auto o = std::make_shared<attn::cli::RunOptions>();
      sub.add_option("config", o->config, "sweep config (JSON), see configs/README.md")->required();
      sub.add_option("--out", o->sweep.out_dir, "output folder (default results/<config name>)");
      sub.add_flag("--resume", o->sweep.resume, "finish an interrupted sweep: measure only missing points");
      sub.add_flag("--force", o->sweep.force, "replace results already in the output folder");
      sub.add_option("--filter", o->sweep.filter, "only points whose id contains this text");
      sub.add_flag("--dry-run", o->sweep.dry_run, "print the plan with skip reasons; write nothing");
      sub.add_flag(
          "--json", o->sweep.json,
          "with --dry-run: one JSON object per point (id, problem, inputs, FLOPs, memory, skip reason, "
          "accuracy rows, base result row)");
      sub.add_option(
          "--shard", o->sweep.shard,
          "I/N: measure only shard I of N (0 <= I < N) into OUT/shards/I-of-N (the plan's points, or "
          "its input sets with measure.interleave, dealt round-robin); slurm/N takes I from "
          "SLURM_ARRAY_TASK_ID. `attnbench merge OUT` joins the shards");
      sub.add_flag("--plain", o->plain, "one plain line per point even on a terminal");
      attn::cli::add_isa_option(sub, o->sweep.isa)
          ->description(
              "SIMD target of every point when the config has no sweep.isa (a config that has one refuses "
              "any "
              "other value than the default, best); kept in meta.json, --resume needs the same. Targets: "
              "see `attnbench info`");
      return std::function<int()>([o] { return attn::cli::run_config(*o); });
    })
