// `attnbench merge OUT`: joins the shards of a sharded sweep (OUT/shards/I-of-N, written by `run --shard`)
// into OUT/results.jsonl, results.csv and meta.json (configs/README.md, "Sharded sweeps"). The shards must
// agree on N, the config hash, `run --isa` and the plan; every planned point must appear exactly once. Points
// nobody measured are listed (by id and the shard that should have measured them) and the merged files are
// still written, marked incomplete. Rows keep what their shard measured: frac_sgemm, frac_peak and
// frac_bandwidth are divided by that shard's own calibration.
#pragma once
#include <string>
#include <vector>

#include "common/interface/params.hpp"

namespace attn {

struct MergeMissing {
  std::string id;
  int shard = 0;  // the shard the plan gives the point to
};

struct MergeResult {
  int shard_count = 0;                // N
  std::vector<int> present;           // shards with a folder holding meta.json, ascending
  std::size_t planned = 0;            // points in the plan
  std::size_t rows = 0;               // rows written to OUT/results.jsonl
  std::vector<MergeMissing> missing;  // in plan order
  std::vector<std::string> notes;     // absent or unfinished shards, other CPU models, other builds
  Json meta;                          // OUT/meta.json as written
  bool complete() const { return missing.empty(); }
};

// Checks the shards under `out_dir`/shards and writes the merged files, each atomically (temporary file and
// rename), after every check passed. UsageError (nothing written, earlier merged files untouched): no shard
// folders, folders of different N, a meta.json that is not JSON or names another shard, shards whose config
// hash, `--isa` or plan differ (listing which shard has which), a point measured twice or by a shard the plan
// does not give it to or not in the plan at all (naming the ids), or OUT holding the results of an unsharded
// run (merge replaces only an earlier merge).
MergeResult merge_shards(const std::string& out_dir);

}  // namespace attn
