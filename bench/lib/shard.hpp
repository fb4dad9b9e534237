// Sharding a plan (`run --shard I/N`, Slurm array jobs, `attnbench merge`): how the points are dealt to the
// shards, the --shard option, and what a shard's meta.json records so the merge can check the shards
// belong together.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/lib/plan.hpp"

namespace attn {

// Sharding a plan (`run --shard I/N`, Slurm array jobs). The plan order is deterministic: expand_plan is
// nested loops over the config's axes in the order the config lists their values, and nothing in it reads
// the clock, the environment or a random source; the only machine facts it uses are the ones make_plan
// resolves (the default sweep.threads and the memory budget, which changes skip reasons, not points). So
// every shard of one config on machines that resolve it alike computes the same list, and the shards below
// partition it. shard_plan_hash() lets the merge check that they did (a node with a different core count
// plans other T= points when the config leaves sweep.threads to the machine).
//
// The unit dealt out is the point, or with measure.interleave the input set: the maximal run of adjacent
// points sharing one input_key, which the runner times together in interleaved rounds. Unit u goes to shard
// u mod N, so a group is never split across shards and its rows stay paired round by round.
struct ShardUnits {
  bool by_input_set = false;  // measure.interleave: units are input sets, else points
  std::vector<int64_t> unit;  // per point of the plan, its unit's index (in plan order)
  int64_t units = 0;          // how many units the plan has
  int shard_of(std::size_t point, int count) const { return static_cast<int>(unit[point] % count); }
};
ShardUnits shard_units(const std::vector<SweepPoint>& points, bool by_input_set);
// FNV-1a over the plan's ids in order (hex), what every shard of one sweep must agree on.
std::string shard_plan_hash(const std::vector<SweepPoint>& points);

// One shard of a plan: the units (plan.hpp ShardUnits) whose index is congruent to `index` modulo `count`.
struct ShardSpec {
  int index = 0;
  int count = 1;
  std::string folder() const;  // "I-of-N", the shard's folder under OUT/shards/
};
constexpr int kMaxShards = 100000;
// `--shard I/N` with 0 <= I < N <= kMaxShards, or `--shard slurm/N`: I is then the environment's
// SLURM_ARRAY_TASK_ID (`slurm_task_id`, nullptr when unset), so one batch script serves every array task.
// UsageError naming --shard, the value and what is allowed.
ShardSpec parse_shard(const std::string& text, const char* slurm_task_id);

// The shard's points of `plan`, and in `meta` what meta.json records of the shard: its index and count, the
// unit dealt, and the whole plan's ids and owners (so `merge` knows every point and who should have
// measured it without planning again).
std::vector<SweepPoint> shard_points(const Plan& plan, const ShardSpec& shard, Json& meta);

// --resume of a shard: the folder (`dir`, its meta.json's "shard" `old`) must hold the same shard of the
// same plan as `now` (shard_points' meta); UsageError naming both otherwise.
void check_resumed_shard(const Json& old, const Json& now, const std::string& dir);

}  // namespace attn
