// Merging the shards of a sharded sweep: checks, the merged rows in plan order, the merged meta.json.
#include "bench/lib/merge.hpp"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "bench/lib/result_row.hpp"
#include "bench/lib/store.hpp"
#include "bench/lib/sysinfo.hpp"
#include "common/io/npy.hpp"
#include "common/support/error.hpp"

namespace fs = std::filesystem;

namespace attn {
namespace {

// Lists in error messages and notes stop here ("... and K more"): a sweep of thousands of points.
constexpr std::size_t kListed = 20;

struct Shard {
  int index = 0, count = 0;
  std::string name;  // "I-of-N"
  fs::path dir;
  bool present = false;  // holds meta.json
  Json meta;
  std::vector<ResultRow> rows;
};

// A decimal number of at most 9 digits, or -1. (An int, not an optional: GCC 12 reads optionals as maybe
// uninitialised once inlined into map::operator[].)
int parse_uint(const std::string& s) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoi(s);
}

std::string listed(const std::vector<std::string>& items, const std::string& sep = ", ") {
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < kListed; ++i) out += (i ? sep : "") + items[i];
  if (items.size() > kListed) out += sep + "... and " + std::to_string(items.size() - kListed) + " more";
  return out;
}

std::string str_or(const Json& j, const char* key, const std::string& fallback) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

// The shards grouped by what `value` says of them; a UsageError listing the groups when there is more than
// one (`what` names the value, `hint` says what to do).
void require_same(const std::vector<const Shard*>& shards, const std::string& what,
                  const std::function<std::string(const Shard&)>& value, const std::string& hint) {
  std::map<std::string, std::vector<std::string>> groups;
  for (const Shard* s : shards) groups[value(*s)].push_back(s->name);
  if (groups.size() < 2) return;
  std::vector<std::string> parts;
  for (const auto& [v, names] : groups) parts.push_back(listed(names) + ": " + v);
  throw UsageError("merge: the shards differ in " + what + " (" + listed(parts, "; ") + "); " + hint);
}

Shard read_shard(const fs::path& dir, int index, int count) {
  Shard s;
  s.index = index, s.count = count, s.dir = dir, s.name = dir.filename().string();
  const fs::path meta_path = dir / "meta.json";
  if (!fs::exists(meta_path)) return s;
  try {
    s.meta = Json::parse(read_file_bytes(meta_path.string()));
  } catch (const Json::exception& e) {
    throw UsageError("merge: '" + meta_path.string() + "' is not valid JSON (" + e.what() + ")");
  }
  const Json shard = s.meta.is_object() ? s.meta.value("shard", Json()) : Json();
  if (!shard.is_object() || shard.value("index", -1) != index || shard.value("count", -1) != count)
    throw UsageError(
        "merge: '" + meta_path.string() + "' does not describe shard " + s.name + " (its \"shard\" is " +
        (shard.is_object()
             ? Json{{"index", shard.value("index", Json())}, {"count", shard.value("count", Json())}}.dump()
             : std::string("missing")) +
        "): only `attnbench run --shard` writes these folders");
  const Json plan = shard.value("plan", Json());
  if (!plan.is_object() || !plan.value("ids", Json()).is_array() ||
      !plan.value("shards", Json()).is_array() || plan["ids"].size() != plan["shards"].size() ||
      !plan.value("hash", Json()).is_string())
    throw UsageError("merge: '" + meta_path.string() +
                     "': shard.plan must hold ids, shards (as many) and hash");
  s.present = true;
  if (fs::exists(dir / "results.jsonl")) s.rows = read_results_jsonl((dir / "results.jsonl").string(), false);
  return s;
}

// Refuses to replace results that are not an earlier merge's.
void check_replaceable(const fs::path& root) {
  const fs::path meta = root / "meta.json";
  if (fs::exists(meta)) {
    Json old;
    try {
      old = Json::parse(read_file_bytes(meta.string()));
    } catch (const Json::exception&) {
      old = nullptr;
    }
    if (old.is_object() && old.value("merged", false) == true) return;
    throw UsageError(
        "merge: '" + meta.string() +
        "' is not from an earlier `attnbench merge` (an unsharded run's results?); merge does not "
        "replace them: move them away, or keep the shards under another folder");
  }
  if (fs::exists(root / "results.jsonl"))
    throw UsageError("merge: '" + (root / "results.jsonl").string() +
                     "' exists without a merged meta.json; merge does not replace it: move it away");
}

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

namespace {

// The plan every shard recorded: the ids in order, the shard each belongs to, each id's position.
struct PlanIds {
  std::vector<std::string> ids;
  std::vector<int> owner;
  std::map<std::string, std::size_t> position;
};

// One merge, stage by stage (merge_shards below): find and read the shard folders, check they belong
// together, place every row by the plan, then the merged rows and meta.json.
class ShardMerger {
 public:
  explicit ShardMerger(const std::string& out_dir) : root_(out_dir), shards_dir_(root_ / "shards") {}

  MergeResult run() {
    if (!fs::is_directory(shards_dir_))
      throw UsageError("merge: '" + root_.string() +
                       "' holds no shards/ folder; run `attnbench run CONFIG --shard I/N --out " +
                       root_.string() +
                       "` for every I (scripts/slurm/submit does it as a Slurm array) first");
    check_replaceable(root_);
    read_shards(find_folders());
    check_agree();
    read_plan();
    place_rows();
    merge_calibrations();
    merge_rows();
    describe_machines();
    result_.meta = merged_meta();
    write_file_atomic((root_ / "results.jsonl").string(), jsonl_);
    write_file_atomic((root_ / "results.csv").string(), results_csv(merged_));
    write_file_atomic((root_ / "meta.json").string(), result_.meta.dump(2) + "\n");
    remove_derived_files(root_.string());
    return result_;
  }

 private:
  // The folders "I-of-N" (anything else under shards/ is not ours and is left alone), all of one N.
  std::vector<std::pair<int, fs::path>> find_folders() {
    std::map<int, std::vector<std::string>> by_count;
    std::vector<std::pair<int, fs::path>> folders;
    for (const auto& entry : fs::directory_iterator(shards_dir_)) {
      const std::string name = entry.path().filename().string();
      const std::size_t of = name.find("-of-");
      const int index = of == std::string::npos ? -1 : parse_uint(name.substr(0, of));
      const int count = of == std::string::npos ? -1 : parse_uint(name.substr(of + 4));
      if (!entry.is_directory() || index < 0 || count < 1 || index >= count) {
        result_.notes.push_back("ignored shards/" + name + " (not a shard folder I-of-N with I < N)");
        continue;
      }
      by_count[count].push_back(name);
      folders.emplace_back(index, entry.path());
    }
    if (folders.empty())
      throw UsageError("merge: '" + shards_dir_.string() + "' holds no shard folder (I-of-N)");
    if (by_count.size() > 1) {
      std::vector<std::string> parts;
      for (auto& [n, names] : by_count) {
        std::sort(names.begin(), names.end());
        parts.push_back("N=" + std::to_string(n) + ": " + listed(names));
      }
      throw UsageError(
          "merge: the shard folders under '" + shards_dir_.string() + "' disagree on N (" +
          listed(parts, "; ") +
          "); the shards of one sweep share N: move the other sweep's folders to their own folder");
    }
    count_ = by_count.begin()->first;
    result_.shard_count = count_;
    std::sort(folders.begin(), folders.end());
    return folders;
  }

  void read_shards(const std::vector<std::pair<int, fs::path>>& folders) {
    shards_.resize(static_cast<std::size_t>(count_));
    for (int i = 0; i < count_; ++i) {
      shards_[i].index = i, shards_[i].count = count_;
      shards_[i].name = std::to_string(i) + "-of-" + std::to_string(count_);
      shards_[i].dir = shards_dir_ / shards_[i].name;
    }
    for (const auto& [index, dir] : folders)
      shards_[static_cast<std::size_t>(index)] = read_shard(dir, index, count_);
    for (const Shard& s : shards_)
      if (s.present) {
        present_.push_back(&s);
        result_.present.push_back(s.index);
      }
    if (present_.empty())
      throw UsageError("merge: no shard folder under '" + shards_dir_.string() +
                       "' holds a meta.json (every task stopped before its sweep started); nothing to merge");
  }

  void check_agree() const {
    require_same(
        present_, "config hash",
        [](const Shard& s) {
          return str_or(s.meta, "config_hash", "?") + " (" + str_or(s.meta, "config_path", "?") + ")";
        },
        "one sweep's shards run one config: rerun the odd ones with the others' config (scripts/slurm/submit "
        "--array LIST), or give them their own --out");
    require_same(
        present_, "`run --isa`", [](const Shard& s) { return str_or(s.meta, "isa_option", "best"); },
        "rerun the odd ones with the others' --isa");
    require_same(
        present_, "plan",
        [](const Shard& s) {
          const Json& plan = s.meta["shard"]["plan"];
          return plan["ids"].size() == 1 ? "1 point, hash " + plan["hash"].get<std::string>()
                                         : std::to_string(plan["ids"].size()) + " points, hash " +
                                               plan["hash"].get<std::string>();
        },
        "the same config planned other points on their machines: it leaves sweep.threads to the machine (the "
        "cores available, which differ between the nodes or the tasks' CPU allocations); set sweep.threads "
        "in "
        "the config and rerun");
  }

  void read_plan() {
    const Json& plan = present_.front()->meta["shard"]["plan"];
    for (std::size_t i = 0; i < plan["ids"].size(); ++i) {
      plan_.ids.push_back(plan["ids"][i].get<std::string>());
      plan_.owner.push_back(plan["shards"][i].get<int>());
      plan_.position[plan_.ids.back()] = i;
    }
    result_.planned = plan_.ids.size();
  }

  // Every row: in the plan, from the shard the plan gives it to, once.
  void place_rows() {
    found_.resize(plan_.ids.size());
    std::vector<std::string> unknown, misplaced, duplicated;
    for (const Shard* s : present_)
      for (const ResultRow& row : s->rows) {
        const auto it = plan_.position.find(row.id);
        if (it == plan_.position.end()) {
          unknown.push_back(row.id + " (shards/" + s->name + ")");
          continue;
        }
        if (plan_.owner[it->second] != s->index)
          misplaced.push_back(row.id + " (in shards/" + s->name + ", planned for shard " +
                              std::to_string(plan_.owner[it->second]) + ")");
        found_[it->second].emplace_back(s->index, &row);
      }
    for (std::size_t i = 0; i < plan_.ids.size(); ++i)
      if (found_[i].size() > 1) {
        std::vector<int> where;
        for (const auto& [k, row] : found_[i]) where.push_back(k);
        duplicated.push_back(plan_.ids[i] + " (shards " + join_ints(where) + ")");
      }
    std::vector<std::string> errors;
    if (!duplicated.empty())
      errors.push_back(std::to_string(duplicated.size()) +
                       " point(s) measured more than once: " + listed(duplicated));
    if (!misplaced.empty())
      errors.push_back(std::to_string(misplaced.size()) +
                       " point(s) measured by a shard the plan does not give them to: " + listed(misplaced));
    if (!unknown.empty())
      errors.push_back(std::to_string(unknown.size()) +
                       " row(s) of points not in the plan: " + listed(unknown));
    if (!errors.empty())
      throw UsageError("merge: " + listed(errors, "; ") +
                       "; every planned point must come from its own shard exactly once (were folders copied "
                       "between sweeps?)");
  }

  // Each shard's calibrations are appended to the merged list; its rows' calibration index moves with them.
  void merge_calibrations() {
    for (const Shard* s : present_) {
      calibration_offset_[s->index] = static_cast<int64_t>(calibrations_.size());
      const Json list = s->meta.value("calibrations", Json::array());
      for (std::size_t i = 0; list.is_array() && i < list.size(); ++i) {
        Json c = list[i];
        c["shard"] = s->index;
        c["shard_calibration_index"] = c.value("index", Json(static_cast<int64_t>(i)));
        c["index"] = calibrations_.size();
        calibrations_.push_back(c);
      }
    }
  }

  void merge_rows() {
    for (std::size_t i = 0; i < plan_.ids.size(); ++i) {
      if (found_[i].empty()) {
        result_.missing.push_back({plan_.ids[i], plan_.owner[i]});
        continue;
      }
      const auto& [k, source] = found_[i].front();
      ResultRow row = *source;
      if (row.calibration) *row.calibration += calibration_offset_[k];
      jsonl_ += to_json(row).dump() + "\n";
      merged_.push_back(std::move(row));
      ++rows_by_shard_[k];
    }
    result_.rows = merged_.size();
  }

  // The machines: one CPU model per shard (the first run's; a --resume on another model is noted), and the
  // builds.
  void describe_machines() {
    std::map<std::string, std::size_t> rows_by_model;
    for (const Shard* s : present_) {
      const std::string model = str_or(s->meta.value("system", Json()), "cpu_model", "unknown CPU");
      shards_by_model_[model].push_back(s->index);
      rows_by_model[model] += rows_by_shard_[s->index];
      std::set<std::string> run_models;
      for (const Json& run : s->meta["shard"].value("runs", Json::array()))
        run_models.insert(str_or(run, "cpu_model", model));
      if (run_models.size() > 1)
        result_.notes.push_back(
            "shards/" + s->name + " ran on several CPU models (" +
            listed(std::vector<std::string>(run_models.begin(), run_models.end()), "; ") +
            ": --resume on another node); its rows are divided by the calibration of the run "
            "that measured them");
    }
    std::string main_model;
    std::size_t main_rows = 0;
    for (const auto& [model, n] : rows_by_model)
      if (main_model.empty() || n > main_rows) main_model = model, main_rows = n;
    for (const auto& [model, list] : shards_by_model_) {
      cpu_models_.push_back({{"cpu_model", model}, {"shards", list}, {"rows", rows_by_model[model]}});
      if (model != main_model && rows_by_model[model] > 0)
        result_.notes.push_back(
            std::to_string(rows_by_model[model]) + " point(s) were measured on a different CPU model (" +
            model + ": shard(s) " + join_ints(list) + ") from the others (" + main_model +
            "); they are kept, and their frac_sgemm, frac_peak and frac_bandwidth are divided "
            "by their own shard's calibration");
    }
    std::map<std::string, std::vector<int>> by_commit;
    for (const Shard* s : present_)
      by_commit[str_or(s->meta.value("system", Json()), "git_commit", "?")].push_back(s->index);
    if (by_commit.size() > 1) {
      std::vector<std::string> parts;
      for (const auto& [c, list] : by_commit) parts.push_back(c + ": shard(s) " + join_ints(list));
      result_.notes.push_back("the shards ran different attnbench builds (" + listed(parts, "; ") + ")");
    }
  }

  // One shard's entry in meta.json's "shards", with the notes on a missing or unfinished shard; widens the
  // merge's start and end times.
  Json shard_entry(const Shard& s) {
    std::size_t planned = 0;
    for (int o : plan_.owner) planned += o == s.index;
    Json e = {
        {"index", s.index}, {"folder", "shards/" + s.name}, {"present", s.present}, {"points", planned}};
    if (!s.present) {
      if (planned)
        result_.notes.push_back(
            "shards/" + s.name + (fs::exists(s.dir) ? " has no meta.json" : " does not exist") + ": its " +
            std::to_string(planned) +
            " point(s) are missing (the task never ran its sweep: cancelled, failed, or not "
            "submitted)");
      return e;
    }
    const Json sys = s.meta.value("system", Json::object());
    Json cal_indices = Json::array();
    const Json list = s.meta.value("calibrations", Json::array());
    for (std::size_t i = 0; list.is_array() && i < list.size(); ++i)
      cal_indices.push_back(calibration_offset_[s.index] + static_cast<int64_t>(i));
    e.update({{"rows", rows_by_shard_[s.index]},
              {"cpu_model", sys.value("cpu_model", Json())},
              {"hostname", sys.value("hostname", Json())},
              {"cores_available", sys.value("cores_available", Json())},
              {"isa", sys.value("isa", Json())},
              {"git_commit", sys.value("git_commit", Json())},
              {"slurm", s.meta.value("slurm", Json::object())},
              {"runs", s.meta["shard"].value("runs", Json::array())},
              {"start_time", s.meta.value("start_time", Json())},
              {"end_time", s.meta.value("end_time", Json())},
              {"interrupted", s.meta.value("interrupted", Json())},
              {"sgemm_calibration", s.meta.value("sgemm_calibration", Json())},
              {"fma_peak", s.meta.value("fma_peak", Json())},
              {"memory_bandwidth", s.meta.value("memory_bandwidth", Json())},
              {"calibrations", cal_indices}});
    const std::string st = str_or(s.meta, "start_time", ""), en = str_or(s.meta, "end_time", "");
    if (!st.empty() && (start_time_.empty() || st < start_time_)) start_time_ = st;
    if (en.empty()) all_ended_ = false;
    if (!en.empty() && en > end_time_) end_time_ = en;
    if (en.empty() || s.meta.value("interrupted", false) == true) {
      std::size_t left = 0;
      for (const MergeMissing& m : result_.missing) left += m.shard == s.index;
      result_.notes.push_back(
          "shards/" + s.name +
          (en.empty() ? " has not finished (still running, or killed)" : " was interrupted") +
          (left ? ": " + std::to_string(left) + " of its points are missing; rerun it (it resumes)" : ""));
    }
    return e;
  }

  // What plot.py and the report read (system, the calibrations, config) from the first present shard, the
  // machine table naming every CPU model and host when they differ.
  Json merged_system() const {
    Json system = present_.front()->meta.value("system", Json::object());
    if (shards_by_model_.size() > 1) {
      std::vector<std::string> parts;
      for (const auto& [model, list] : shards_by_model_)
        parts.push_back(model + " (shards " + join_ints(list) + ")");
      system["cpu_model"] = listed(parts, "; ");
    }
    std::set<std::string> hosts;
    for (const Shard* s : present_) hosts.insert(str_or(s->meta.value("system", Json()), "hostname", "?"));
    system["hostname"] = listed(std::vector<std::string>(hosts.begin(), hosts.end()));
    return system;
  }

  Json merged_meta() {
    Json shard_list = Json::array();
    for (const Shard& s : shards_) shard_list.push_back(shard_entry(s));
    Json missing = Json::array();
    for (const MergeMissing& m : result_.missing) missing.push_back({{"id", m.id}, {"shard", m.shard}});
    const Shard& first = *present_.front();
    const bool mixed = shards_by_model_.size() > 1;
    Json meta = {{"merged", true},
                 {"merged_at", now_iso8601()},
                 {"complete", result_.complete()},
                 {"missing", missing},
                 {"points_planned", result_.planned},
                 {"rows", result_.rows},
                 {"config_name", first.meta.value("config_name", Json())},
                 {"config_path", first.meta.value("config_path", Json())},
                 {"config_hash", first.meta.value("config_hash", Json())},
                 {"config", first.meta.value("config", Json())},
                 {"baseline", first.meta.value("baseline", Json())},
                 {"isa_option", first.meta.value("isa_option", Json("best"))},
                 {"shard_count", count_},
                 {"shard_by", first.meta["shard"].value("by", Json())},
                 {"plan_hash", first.meta["shard"]["plan"]["hash"]},
                 {"shards", shard_list},
                 {"cpu_models", cpu_models_},
                 {"mixed_cpu_models", mixed},
                 {"system", merged_system()},
                 {"memory_probe", first.meta.value("memory_probe", Json())},
                 {"start_time", start_time_.empty() ? Json() : Json(start_time_)},
                 {"end_time", all_ended_ && !end_time_.empty() ? Json(end_time_) : Json()},
                 {"interrupted", !result_.complete()},
                 {"calibrations", calibrations_},
                 {"notes", result_.notes}};
    // The machine-level ceilings (roofline, peer rows' frac_sgemm) only when every shard ran on one CPU
    // model: then the first shard's stand for all (each row keeps its own shard's fractions either way).
    if (!mixed) {
      for (const char* key : {"sgemm_calibration", "fma_peak", "memory_bandwidth", "blas_note"})
        if (first.meta.contains(key)) meta[key] = first.meta[key];
      meta["calibration_source"] = "shards/" + first.name;
    } else {
      meta["calibration_source"] = nullptr;
    }
    return meta;
  }

  fs::path root_, shards_dir_;
  MergeResult result_;
  int count_ = 0;
  std::vector<Shard> shards_;
  std::vector<const Shard*> present_;
  PlanIds plan_;
  std::vector<std::vector<std::pair<int, const ResultRow*>>> found_;
  std::map<int, int64_t> calibration_offset_;
  Json calibrations_ = Json::array(), cpu_models_ = Json::array();
  std::string jsonl_;
  std::vector<ResultRow> merged_;
  std::map<int, std::size_t> rows_by_shard_;
  std::map<std::string, std::vector<int>> shards_by_model_;
  std::string start_time_, end_time_;
  bool all_ended_ = true;
};

}  // namespace

MergeResult merge_shards(const std::string& out_dir) {
  return ShardMerger(out_dir).run();
}

}  // namespace attn
