// Sharding (shard.hpp).
#include "bench/lib/shard.hpp"

#include <optional>
#include <sstream>

#include "common/support/error.hpp"
#include "common/support/hash.hpp"

namespace attn {
namespace {

// A non-negative decimal integer (digits only, at most 9 of them: no sign, no blanks, no overflow).
std::optional<int> parse_count(const std::string& s) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoi(s);
}

}  // namespace

ShardUnits shard_units(const std::vector<SweepPoint>& points, bool by_input_set) {
  ShardUnits s;
  s.by_input_set = by_input_set;
  s.unit.reserve(points.size());
  for (std::size_t i = 0; i < points.size(); ++i) {
    // The runner's grouping (sweep.cpp): a new group starts where the input key changes.
    const bool same_group = by_input_set && i > 0 && points[i].input_key == points[i - 1].input_key;
    if (!same_group) ++s.units;
    s.unit.push_back(s.units - 1);
  }
  return s;
}

std::string shard_plan_hash(const std::vector<SweepPoint>& points) {
  uint64_t h = kFnvOffsetBasis;
  for (const SweepPoint& pt : points) h = fnv1a64(pt.id + "\n", h);
  std::ostringstream s;
  s << std::hex << h;
  return s.str();
}

std::string ShardSpec::folder() const {
  return std::to_string(index) + "-of-" + std::to_string(count);
}

ShardSpec parse_shard(const std::string& text, const char* slurm_task_id) {
  const std::string allowed = "expected I/N with 0 <= I < N <= " + std::to_string(kMaxShards) +
                              " (shard I of N), or slurm/N (I from SLURM_ARRAY_TASK_ID)";
  const std::size_t slash = text.find('/');
  if (slash == std::string::npos) throw UsageError("--shard '" + text + "': " + allowed);
  const std::string head = text.substr(0, slash);
  const std::optional<int> count = parse_count(text.substr(slash + 1));
  if (!count || *count < 1 || *count > kMaxShards)
    throw UsageError("--shard '" + text + "': the shard count N must be an integer in [1, " +
                     std::to_string(kMaxShards) + "]; " + allowed);
  ShardSpec s;
  s.count = *count;
  std::optional<int> index;
  if (head == "slurm") {
    if (!slurm_task_id)
      throw UsageError(
          "--shard '" + text +
          "': SLURM_ARRAY_TASK_ID is not set (not a Slurm array task); give the index: --shard I/" +
          std::to_string(s.count));
    index = parse_count(slurm_task_id);
    if (!index || *index >= s.count)
      throw UsageError("--shard '" + text + "': SLURM_ARRAY_TASK_ID '" + slurm_task_id +
                       "' is not a shard index in [0, " + std::to_string(s.count - 1) +
                       "]; submit the array as --array=0-" + std::to_string(s.count - 1));
  } else {
    index = parse_count(head);
    if (!index || *index >= s.count)
      throw UsageError("--shard '" + text + "': the shard index I must be an integer in [0, " +
                       std::to_string(s.count - 1) + "]; " + allowed);
  }
  s.index = *index;
  return s;
}

// The shard's points, and what meta.json records of the shard (the whole plan's ids and owners, so `merge`
// knows every point and who should have measured it without planning again).
std::vector<SweepPoint> shard_points(const Plan& plan, const ShardSpec& shard, Json& meta) {
  const ShardUnits units = shard_units(plan.points, plan.config.measure.interleave);
  std::vector<SweepPoint> mine;
  Json ids = Json::array(), owners = Json::array();
  for (std::size_t i = 0; i < plan.points.size(); ++i) {
    const int owner = units.shard_of(i, shard.count);
    if (owner == shard.index) mine.push_back(plan.points[i]);
    ids.push_back(plan.points[i].id);
    owners.push_back(owner);
  }
  meta = {{"index", shard.index},
          {"count", shard.count},
          {"by", units.by_input_set ? "input set" : "point"},
          {"points", mine.size()},
          {"plan",
           {{"points", plan.points.size()},
            {"units", units.units},
            {"hash", shard_plan_hash(plan.points)},
            {"ids", ids},
            {"shards", owners}}},
          {"runs", Json::array()}};
  return mine;
}

void check_resumed_shard(const Json& old, const Json& now, const std::string& dir) {
  if (!old.is_object() || old.value("count", -1) != now["count"] || old.value("index", -1) != now["index"])
    throw UsageError("--resume: '" + dir + "' does not hold shard " + now["index"].dump() + "/" +
                     now["count"].dump() + " (its meta.json has " +
                     (old.is_object() ? old.dump() : "no shard") +
                     "); rerun without --resume (and --force) or use another --out");
  const Json old_plan = old.value("plan", Json::object());
  const std::string was = old_plan.value("hash", "?"), is = now["plan"]["hash"].get<std::string>();
  if (was != is)
    throw UsageError("--resume: the plan of shard " + now["index"].dump() + "/" + now["count"].dump() +
                     " in '" + dir + "' changed (" + old_plan.value("points", Json(0)).dump() +
                     " points, hash " + was + " then; " + now["plan"]["points"].dump() + " points, hash " +
                     is +
                     " now) although the config did not: it leaves something to the machine (sweep.threads "
                     "defaults to the cores available); set it in the config, or rerun with --force");
}

}  // namespace attn
