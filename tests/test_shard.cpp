// Sharded sweeps: `run --shard I/N` partitions the plan (points, or input sets with measure.interleave) for
// several N, refuses bad values, records the plan and the Slurm ids, resumes per shard; `attnbench merge`
// joins complete, incomplete and mixed-CPU shards and refuses duplicates, mismatched hashes or N, plans, and
// an unsharded folder, leaving earlier merged files untouched. tests/slurm runs the same under a real Slurm.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/lib/plan.hpp"
#include "bench/lib/sweep.hpp"
#include "common/support/error.hpp"
#include "tests/support/process.hpp"

using namespace attn;
using namespace attn::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// Eight tiny points: two variants on four input sets (two lengths x two masks); correctness, not timing.
Json shard_config(bool interleave) {
  return {{"name", "shardtest"},
          {"variants", {"naive", "tiled"}},
          {"sweep",
           {{"batch", 1},
            {"heads", 2},
            {"head_dim", 8},
            {"seq_len", {16, 24}},
            {"mask", {"none", "pad=0.25"}},
            {"threads", 1}}},
          {"measure",
           {{"warmup", 0},
            {"min_reps", 1},
            {"max_reps", 2},
            {"min_time_s", 0},
            {"max_time_s", 1},
            {"max_interference", 1},
            {"calibrate_every", 0},
            {"interleave", interleave}}},
          {"accuracy", {{"reference", "full"}}},
          {"memory_budget", "1GiB"},
          {"seed", 5}};
}

std::string write_config(const ScratchDir& dir, const std::string& name, const Json& config) {
  const std::string path = dir.file(name);
  write_text(path, config.dump(2) + "\n");
  return path;
}

Json read_json(const fs::path& p) {
  REQUIRE(fs::exists(p));
  Json j;
  REQUIRE_NOTHROW(j = Json::parse(slurp(p)));
  return j;
}

std::vector<std::string> row_ids(const fs::path& jsonl) {
  std::vector<std::string> ids;
  std::istringstream in(slurp(jsonl));
  for (std::string line; std::getline(in, line);)
    ids.push_back(Json::parse(line).at("id").get<std::string>());
  return ids;
}

// The ids `run --dry-run` lists (with extra arguments such as --shard I/N).
std::vector<std::string> dry_run_ids(const std::string& cfg, const fs::path& cwd,
                                     const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"run", cfg, "--dry-run", "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  const ProcResult r = run_attnbench(args, cwd);
  REQUIRE(r.code == 0);
  std::vector<std::string> ids;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    ids.push_back(Json::parse(line).at("id").get<std::string>());
  return ids;
}

// Two shards of shard_config(true), measured once and copied by the tests that change them. Shard 1 runs as
// a Slurm array task would (--shard slurm/2 with the SLURM_* variables set).
struct ShardRuns {
  ScratchDir dir{"shard"};
  std::string cfg;
  fs::path out;
  ProcResult r0, r1;
  std::vector<std::string> plan;  // the plan's ids in order
};

const ShardRuns& shard_runs() {
  static const std::unique_ptr<ShardRuns> runs = [] {
    auto m = std::make_unique<ShardRuns>();
    m->cfg = write_config(m->dir, "shard.json", shard_config(true));
    m->out = m->dir.path() / "out";
    m->plan = dry_run_ids(m->cfg, m->dir.path());
    // Shard 0 runs outside Slurm even when the tests themselves run in a Slurm job.
    for (const char* k : {"SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_NODELIST",
                          "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION"})
      ::unsetenv(k);
    m->r0 = run_attnbench({"run", m->cfg, "--out", m->out.string(), "--shard", "0/2"}, m->dir.path());
    const std::map<std::string, std::string> slurm = {{"SLURM_JOB_ID", "4242"},
                                                      {"SLURM_ARRAY_JOB_ID", "4240"},
                                                      {"SLURM_ARRAY_TASK_ID", "1"},
                                                      {"SLURM_NODELIST", "node[07]"}};
    for (const auto& [k, v] : slurm) ::setenv(k.c_str(), v.c_str(), 1);
    m->r1 = run_attnbench({"run", m->cfg, "--out", m->out.string(), "--shard", "slurm/2"}, m->dir.path());
    for (const auto& [k, v] : slurm) ::unsetenv(k.c_str());
    return m;
  }();
  return *runs;
}

// A copy of the two shard folders (only those listed in `shards`) under a fresh OUT.
fs::path copy_shards(const ScratchDir& dir, const std::vector<int>& shards) {
  const ShardRuns& runs = shard_runs();
  REQUIRE(runs.r0.code == 0);
  REQUIRE(runs.r1.code == 0);
  const fs::path out = dir.path() / "out";
  fs::create_directories(out / "shards");
  for (int i : shards)
    fs::copy(runs.out / "shards" / (std::to_string(i) + "-of-2"),
             out / "shards" / (std::to_string(i) + "-of-2"), fs::copy_options::recursive);
  return out;
}

void edit_meta(const fs::path& shard, const std::function<void(Json&)>& edit) {
  Json meta = read_json(shard / "meta.json");
  edit(meta);
  write_text(shard / "meta.json", meta.dump(2) + "\n");
}

}  // namespace

TEST_CASE("shards partition the plan for several N, with and without interleaved input sets",
          "[shard][plan]") {
  ScratchDir dir{"shard"};
  for (const bool interleave : {true, false}) {
    const std::string cfg = write_config(dir, "c.json", shard_config(interleave));
    const Plan plan = make_plan(load_sweep_config(cfg));
    REQUIRE(plan.points.size() == 8);
    const ShardUnits units = shard_units(plan.points, interleave);
    // Two variants share each input set: four units with interleave, eight points without.
    CHECK(units.units == (interleave ? 4 : 8));
    for (const int n : {1, 2, 3, 4, 5, 8, 9, 50}) {
      INFO("interleave " << interleave << ", N = " << n);
      std::map<std::string, int> owner;
      for (std::size_t i = 0; i < plan.points.size(); ++i) {
        const int s = units.shard_of(i, n);
        REQUIRE(s >= 0);
        REQUIRE(s < n);
        owner[plan.points[i].id] = s;
      }
      CHECK(owner.size() == plan.points.size());  // every point has exactly one shard
      // An input set never spans two shards when interleaved (its rows pair up round by round).
      for (std::size_t i = 1; interleave && i < plan.points.size(); ++i)
        if (plan.points[i].input_key == plan.points[i - 1].input_key)
          CHECK(owner[plan.points[i].id] == owner[plan.points[i - 1].id]);
      // Round-robin: the shards' unit counts differ by at most one.
      std::map<int, std::set<int64_t>> units_of;
      for (std::size_t i = 0; i < plan.points.size(); ++i)
        units_of[units.shard_of(i, n)].insert(units.unit[i]);
      std::size_t lo = plan.points.size(), hi = 0;
      for (int s = 0; s < n; ++s)
        lo = std::min(lo, units_of[s].size()), hi = std::max(hi, units_of[s].size());
      CHECK(hi - lo <= 1);
    }
    // The CLI deals the same: the dry runs of shards 0..2 of 3 list every planned id exactly once, each in
    // the shard shard_units gives it.
    std::map<std::string, std::size_t> index_of;
    for (std::size_t i = 0; i < plan.points.size(); ++i) index_of[plan.points[i].id] = i;
    std::vector<std::string> all;
    for (int i = 0; i < 3; ++i) {
      const auto ids = dry_run_ids(cfg, dir.path(), {"--shard", std::to_string(i) + "/3"});
      for (const auto& id : ids) CHECK(units.shard_of(index_of.at(id), 3) == i);
      all.insert(all.end(), ids.begin(), ids.end());
    }
    std::multiset<std::string> got(all.begin(), all.end()), want;
    for (const auto& p : plan.points) want.insert(p.id);
    CHECK(got == want);
  }
  // The plan order (and so the partition) does not depend on the machine beyond what the config leaves
  // to it: the same config planned for another machine gives the same ids in the same order.
  const std::string cfg = write_config(dir, "c.json", shard_config(true));
  Machine other;
  other.threads = 64;
  other.physical_bytes = uint64_t{1} << 40;
  other.isas = {"scalar"};
  const Plan here = make_plan(load_sweep_config(cfg)),
             there = make_plan(load_sweep_config(cfg), "best", other);
  CHECK(shard_plan_hash(here.points) == shard_plan_hash(there.points));
}

TEST_CASE("run --shard refuses bad values naming the flag, the value and what is allowed", "[shard][cli]") {
  CHECK(parse_shard("0/1", nullptr).folder() == "0-of-1");
  CHECK(parse_shard("3/4", nullptr).index == 3);
  CHECK(parse_shard("slurm/4", "2").index == 2);
  CHECK(parse_shard("slurm/4", "2").count == 4);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"4/4", "the shard index I must be an integer in [0, 3]"},
      {"-1/4", "the shard index I must be an integer in [0, 3]"},
      {"x/4", "the shard index I must be an integer in [0, 3]"},
      {" 1/4", "the shard index I must be an integer in [0, 3]"},
      {"1/0", "the shard count N must be an integer in [1, 100000]"},
      {"1/", "the shard count N must be an integer in [1, 100000]"},
      {"0/100001", "the shard count N must be an integer in [1, 100000]"},
      {"0/4/", "the shard count N must be an integer in [1, 100000]"},
      {"3", "expected I/N with 0 <= I < N"},
      {"", "expected I/N with 0 <= I < N"}};
  for (const auto& [text, why] : bad) {
    INFO("--shard '" << text << "'");
    try {
      (void)parse_shard(text, nullptr);
      FAIL("accepted");
    } catch (const UsageError& e) {
      CHECK_THAT(e.what(), Contains("--shard '" + text + "'") && Contains(why));
    }
  }
  CHECK_THROWS_WITH(parse_shard("slurm/4", nullptr),
                    Contains("SLURM_ARRAY_TASK_ID is not set") && Contains("--shard I/4"));
  CHECK_THROWS_WITH(parse_shard("slurm/4", "4"),
                    Contains("SLURM_ARRAY_TASK_ID '4'") && Contains("[0, 3]") && Contains("--array=0-3"));
  CHECK_THROWS_WITH(parse_shard("slurm/4", "two"), Contains("SLURM_ARRAY_TASK_ID 'two'"));

  // Through the CLI: exit 2, the message on stderr, nothing written; --filter with --shard is refused.
  ScratchDir dir{"shard"};
  const std::string cfg = write_config(dir, "c.json", shard_config(true));
  const ProcResult r = run_attnbench({"run", cfg, "--out", dir.file("out"), "--shard", "2/2"}, dir.path());
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Contains("--shard '2/2'") && Contains("[0, 1]"));
  const ProcResult f = run_attnbench(
      {"run", cfg, "--out", dir.file("out"), "--shard", "0/2", "--filter", "naive"}, dir.path());
  CHECK(f.code == 2);
  CHECK_THAT(f.err, Contains("--filter and --shard exclude each other"));
  CHECK_FALSE(fs::exists(dir.path() / "out"));
}

TEST_CASE("a shard writes its folder with the plan, machine and Slurm ids, and merge joins complete shards",
          "[shard][merge]") {
  const ShardRuns& runs = shard_runs();
  REQUIRE(runs.r0.code == 0);
  REQUIRE(runs.r1.code == 0);
  const Json m0 = read_json(runs.out / "shards/0-of-2/meta.json");
  const Json m1 = read_json(runs.out / "shards/1-of-2/meta.json");
  CHECK(m0["shard"]["index"] == 0);
  CHECK(m1["shard"]["index"] == 1);  // from SLURM_ARRAY_TASK_ID
  CHECK(m0["shard"]["by"] == "input set");
  CHECK(m0["shard"]["plan"]["ids"].get<std::vector<std::string>>() == runs.plan);
  CHECK(m0["shard"]["plan"]["hash"] == m1["shard"]["plan"]["hash"]);
  CHECK_FALSE(m0.contains("slurm"));
  CHECK(m1["slurm"] == Json({{"SLURM_JOB_ID", "4242"},
                             {"SLURM_ARRAY_JOB_ID", "4240"},
                             {"SLURM_ARRAY_TASK_ID", "1"},
                             {"SLURM_NODELIST", "node[07]"}}));
  CHECK(m1["system"].contains("cpu_model"));
  CHECK(m1["system"]["isa"].contains("best"));
  CHECK(m1["calibrations"].size() == 1);
  // Each shard holds exactly its own points: the ones its dry run lists.
  for (int i = 0; i < 2; ++i) {
    auto ids = row_ids(runs.out / "shards" / (std::to_string(i) + "-of-2") / "results.jsonl");
    auto want = dry_run_ids(runs.cfg, runs.dir.path(), {"--shard", std::to_string(i) + "/2"});
    CHECK(ids == want);
    CHECK(ids.size() == 4);  // two of the four input sets, two variants each
  }

  ScratchDir dir{"shard"};
  const fs::path out = copy_shards(dir, {0, 1});
  write_text(out / "REPORT.md", "stale report of an earlier merge\n");
  write_text(out / "meta.json", R"({"merged": true})"
                                "\n");
  const ProcResult r = run_attnbench({"merge", out.string()}, dir.path());
  CHECK(r.code == 0);
  CHECK_THAT(r.out,
             Contains("2 of 2 shard(s) present") && Contains("merged 8 of 8") && Contains("(complete)"));
  CHECK(row_ids(out / "results.jsonl") == runs.plan);  // every point once, in plan order
  CHECK_FALSE(fs::exists(out / "REPORT.md"));          // derived from the results replaced
  const Json meta = read_json(out / "meta.json");
  CHECK(meta["merged"] == true);
  CHECK(meta["complete"] == true);
  CHECK(meta["missing"].empty());
  CHECK(meta["points_planned"] == 8);
  CHECK(meta["rows"] == 8);
  CHECK(meta["config_hash"] == m0["config_hash"]);
  CHECK(meta["shard_count"] == 2);
  REQUIRE(meta["shards"].size() == 2);
  CHECK(meta["shards"][1]["slurm"]["SLURM_ARRAY_TASK_ID"] == "1");
  CHECK(meta["shards"][1]["cpu_model"] == m1["system"]["cpu_model"]);
  CHECK(meta["shards"][1]["isa"] == m1["system"]["isa"]);
  CHECK(meta["shards"][0]["rows"] == 4);
  CHECK(meta["mixed_cpu_models"] == false);
  CHECK(meta["sgemm_calibration"] == m0["sgemm_calibration"]);
  // The calibrations of both shards, renumbered; each row points at its own shard's.
  REQUIRE(meta["calibrations"].size() == 2);
  CHECK(meta["calibrations"][1]["shard"] == 1);
  CHECK(meta["calibrations"][1]["index"] == 1);
  CHECK(meta["calibrations"][1]["shard_calibration_index"] == 0);
  std::istringstream rows(slurp(out / "results.jsonl"));
  const std::vector<std::string> shard1 = dry_run_ids(runs.cfg, runs.dir.path(), {"--shard", "1/2"});
  for (std::string line; std::getline(rows, line);) {
    const Json row = Json::parse(line);
    const bool from1 = std::find(shard1.begin(), shard1.end(), row["id"]) != shard1.end();
    CHECK(row["calibration"] == (from1 ? 1 : 0));
  }
  CHECK(fs::exists(out / "results.csv"));
}

TEST_CASE(
    "merge with a shard missing or cut short lists the missing ids, exits 1 and writes incomplete files",
    "[shard][merge]") {
  const ShardRuns& runs = shard_runs();
  ScratchDir dir{"shard"};
  const fs::path out = copy_shards(dir, {0});
  const std::vector<std::string> shard1 = dry_run_ids(runs.cfg, runs.dir.path(), {"--shard", "1/2"});
  const ProcResult r = run_attnbench({"merge", out.string()}, dir.path());
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("(absent: 1)") && Contains("4 of 8 planned point(s) missing") &&
                        Contains("shard 1-of-2: 4 point(s)") && Contains("shards/1-of-2 does not exist"));
  for (const auto& id : shard1) CHECK_THAT(r.out, Contains("missing: " + id + "\n"));
  const Json meta = read_json(out / "meta.json");
  CHECK(meta["complete"] == false);
  CHECK(meta["interrupted"] == true);
  REQUIRE(meta["missing"].size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(meta["missing"][i]["id"] == shard1[i]);
    CHECK(meta["missing"][i]["shard"] == 1);
  }
  CHECK(meta["shards"][1]["present"] == false);
  CHECK(row_ids(out / "results.jsonl").size() == 4);

  // Shard 1 cut short (an interrupted task): its measured row is kept, the other three are missing; then
  // --resume of that shard alone finishes it and the merge is complete.
  fs::copy(runs.out / "shards/1-of-2", out / "shards/1-of-2", fs::copy_options::recursive);
  const fs::path jsonl = out / "shards/1-of-2/results.jsonl";
  const std::string first_line = slurp(jsonl).substr(0, slurp(jsonl).find('\n') + 1);
  write_text(jsonl, first_line);
  edit_meta(out / "shards/1-of-2", [](Json& m) { m["interrupted"] = true; });
  const ProcResult cut = run_attnbench({"merge", out.string()}, dir.path());
  CHECK(cut.code == 1);
  CHECK_THAT(cut.out,
             Contains("3 of 8 planned point(s) missing") && Contains("shards/1-of-2 was interrupted"));
  const ProcResult resume =
      run_attnbench({"run", runs.cfg, "--out", out.string(), "--shard", "1/2", "--resume"}, dir.path());
  CHECK(resume.code == 0);
  CHECK_THAT(resume.out, Contains("1 already done"));
  CHECK(row_ids(jsonl).size() == 4);
  CHECK(read_json(out / "shards/1-of-2/meta.json")["shard"]["runs"].size() == 2);
  const ProcResult done = run_attnbench({"merge", out.string()}, dir.path());
  CHECK(done.code == 0);
  CHECK(row_ids(out / "results.jsonl") == runs.plan);
  CHECK(read_json(out / "meta.json")["complete"] == true);
  // --resume refuses a folder of another shard's plan.
  edit_meta(out / "shards/1-of-2", [](Json& m) { m["shard"]["plan"]["hash"] = "0"; });
  const ProcResult changed =
      run_attnbench({"run", runs.cfg, "--out", out.string(), "--shard", "1/2", "--resume"}, dir.path());
  CHECK(changed.code == 2);
  CHECK_THAT(changed.err, Contains("the plan of shard 1/2") && Contains("sweep.threads"));
}

TEST_CASE(
    "merge refuses duplicates, mismatched config hashes, N or plans, and unsharded results: nothing written",
    "[shard][merge]") {
  const ShardRuns& runs = shard_runs();
  ScratchDir dir{"shard"};
  const fs::path out = copy_shards(dir, {0, 1});
  REQUIRE(run_attnbench({"merge", out.string()}, dir.path()).code == 0);
  const std::string jsonl = slurp(out / "results.jsonl"), meta = slurp(out / "meta.json"),
                    csv = slurp(out / "results.csv");
  const auto untouched = [&] {
    CHECK(slurp(out / "results.jsonl") == jsonl);
    CHECK(slurp(out / "meta.json") == meta);
    CHECK(slurp(out / "results.csv") == csv);
  };

  SECTION("a point in two shards") {
    const fs::path j1 = out / "shards/1-of-2/results.jsonl";
    const std::string row0 = slurp(out / "shards/0-of-2/results.jsonl");
    const std::string first = row0.substr(0, row0.find('\n') + 1);
    write_text(j1, slurp(j1) + first);
    const std::string id = Json::parse(first)["id"];
    const ProcResult r = run_attnbench({"merge", out.string()}, dir.path());
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains("measured more than once: " + id + " (shards 0, 1)") &&
                          Contains("planned for shard 0"));
    untouched();
  }
  SECTION("config hashes differ") {
    edit_meta(out / "shards/1-of-2", [](Json& m) { m["config_hash"] = "feedface"; });
    const ProcResult r = run_attnbench({"merge", out.string()}, dir.path());
    CHECK(r.code == 2);
    const std::string h0 = read_json(out / "shards/0-of-2/meta.json")["config_hash"];
    CHECK_THAT(r.err, Contains("the shards differ in config hash") && Contains("0-of-2: " + h0) &&
                          Contains("1-of-2: feedface"));
    untouched();
  }
  SECTION("plans differ") {
    edit_meta(out / "shards/0-of-2", [](Json& m) { m["shard"]["plan"]["hash"] = "abc"; });
    const ProcResult r = run_attnbench({"merge", out.string()}, dir.path());
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains("the shards differ in plan") && Contains("0-of-2: 8 points, hash abc") &&
                          Contains("sweep.threads"));
    untouched();
  }
  SECTION("shards of another N") {
    fs::copy(out / "shards/0-of-2", out / "shards/0-of-3", fs::copy_options::recursive);
    const ProcResult r = run_attnbench({"merge", out.string()}, dir.path());
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains("disagree on N (N=2: 0-of-2, 1-of-2; N=3: 0-of-3)"));
    untouched();
  }
  SECTION("a meta.json naming another shard") {
    edit_meta(out / "shards/1-of-2", [](Json& m) { m["shard"]["index"] = 0; });
    const ProcResult r = run_attnbench({"merge", out.string()}, dir.path());
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains("does not describe shard 1-of-2"));
    untouched();
  }
  SECTION("an unsharded run's results in OUT") {
    write_text(out / "meta.json", R"({"config_hash": "1234"})"
                                  "\n");
    const ProcResult r = run_attnbench({"merge", out.string()}, dir.path());
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains("is not from an earlier `attnbench merge`"));
    CHECK(slurp(out / "results.jsonl") == jsonl);
  }
  SECTION("no shards at all") {
    const ProcResult r = run_attnbench({"merge", dir.file("nothing")}, dir.path());
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains("holds no shards/ folder"));
  }
  (void)runs;
}

TEST_CASE("merge keeps points measured on a different CPU model and says so", "[shard][merge]") {
  ScratchDir dir{"shard"};
  const fs::path out = copy_shards(dir, {0, 1});
  const Json m1 = read_json(out / "shards/1-of-2/meta.json");
  edit_meta(out / "shards/1-of-2", [](Json& m) { m["system"]["cpu_model"] = "Other CPU 9000"; });
  const ProcResult r = run_attnbench({"merge", out.string()}, dir.path());
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("measured on a different CPU model") && Contains("Other CPU 9000: shard(s) 1") &&
                        Contains("their own shard's calibration"));
  const Json meta = read_json(out / "meta.json");
  CHECK(meta["mixed_cpu_models"] == true);
  CHECK(meta["cpu_models"].size() == 2);
  CHECK(meta["rows"] == 8);
  // No single machine's ceilings stand for both: each row keeps its own shard's fractions.
  CHECK_FALSE(meta.contains("sgemm_calibration"));
  CHECK_THAT(meta["system"]["cpu_model"].get<std::string>(), Contains("Other CPU 9000 (shards 1)"));
  std::istringstream rows(slurp(out / "results.jsonl"));
  std::map<std::string, Json> merged;
  for (std::string line; std::getline(rows, line);) merged[Json::parse(line)["id"]] = Json::parse(line);
  std::istringstream own(slurp(out / "shards/1-of-2/results.jsonl"));
  for (std::string line; std::getline(own, line);) {
    const Json row = Json::parse(line);
    CHECK(merged.at(row["id"])["frac_sgemm"] == row["frac_sgemm"]);
  }
  (void)m1;
}
