// End-to-end sweeps through the built attnbench executable: output files and row schema, skipped and failed
// points, refusing to overwrite, --force, --resume (finished, changed config, torn line, after kill -9, with
// --filter), SIGINT (mid-run and during the calibration), --dry-run and --filter.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/lib/bandwidth.hpp"
#include "bench/lib/config.hpp"
#include "bench/lib/inputs.hpp"
#include "bench/lib/plan.hpp"
#include "bench/lib/runner.hpp"
#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/io/npy.hpp"
#include "common/kernels/simd.hpp"
#include "common/reference/reference.hpp"
#include "tests/support/process.hpp"

using namespace attn;
using namespace attn::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// Every run's working directory is a ScratchDir, so a default results/ folder would land there.
using RunResult = ProcResult;

pid_t spawn_attnbench(const std::vector<std::string>& args, const fs::path& cwd, const std::string& log) {
  return attn::test::spawn_attnbench(args, ProcOptions{cwd, std::nullopt}, log);
}

std::size_t count_complete_lines(const fs::path& p);

// Waits until `jsonl` holds more than `rows` complete rows while `pid` still runs (a signal sent then lands
// mid-run). Fails the test with the child's output if it exits first or nothing appears within a minute.
void wait_for_rows(pid_t pid, std::size_t rows, const fs::path& jsonl, const fs::path& cwd,
                   const std::string& log) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (count_complete_lines(jsonl) <= rows) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid)
      FAIL("attnbench exited (status " << status << ") before writing row " << rows + 1 << "\nstdout:\n"
                                       << slurp(cwd / (log + ".out")) << "\nstderr:\n"
                                       << slurp(cwd / (log + ".err")));
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL("no new row within 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Waits until `file` exists while `pid` still runs.
void wait_for_file(pid_t pid, const fs::path& file, const fs::path& cwd, const std::string& log) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(file)) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid)
      FAIL("attnbench exited (status " << status << ") before creating " << file << "\nstdout:\n"
                                       << slurp(cwd / (log + ".out")) << "\nstderr:\n"
                                       << slurp(cwd / (log + ".err")));
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL(file << " not created within 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::size_t count_complete_lines(const fs::path& p) {
  const std::string t = slurp(p);
  return static_cast<std::size_t>(std::count(t.begin(), t.end(), '\n'));
}

// Every line of results.jsonl must be one JSON object (a torn line would make this fail).
std::vector<Json> read_rows(const fs::path& jsonl) {
  const std::string text = slurp(jsonl);
  REQUIRE((text.empty() || text.back() == '\n'));
  std::vector<Json> rows;
  for (const auto& line : lines_of(text)) {
    INFO("line: " << line);
    Json row;
    REQUIRE_NOTHROW(row = Json::parse(line));
    REQUIRE(row.is_object());
    rows.push_back(row);
  }
  return rows;
}

std::map<std::string, int> id_counts(const std::vector<Json>& rows) {
  std::map<std::string, int> counts;
  for (const Json& r : rows) ++counts[r.at("id").get<std::string>()];
  return counts;
}

// RFC 4180 records (quoted fields may hold commas, quotes and newlines).
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> rec;
  std::string field;
  bool quoted = false, any = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"')
        field += '"', ++i;
      else if (c == '"')
        quoted = false;
      else
        field += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rec.push_back(field), field.clear();
    } else if (c == '\n') {
      rec.push_back(field), field.clear();
      records.push_back(rec), rec.clear();
      any = false;
      continue;
    } else {
      field += c;
    }
    any = true;
  }
  REQUIRE_FALSE(quoted);  // an unterminated quoted field
  if (any) rec.push_back(field), records.push_back(rec);
  return records;
}

// results.csv: a header and one record per row of results.jsonl, in the same order, every record as wide as
// the header.
void check_csv_matches(const fs::path& dir, const std::vector<Json>& rows) {
  REQUIRE(fs::exists(dir / "results.csv"));
  const auto records = parse_csv(slurp(dir / "results.csv"));
  REQUIRE(records.size() == rows.size() + 1);
  const auto& header = records[0];
  const auto id_col = std::find(header.begin(), header.end(), "id") - header.begin();
  REQUIRE(id_col < static_cast<std::ptrdiff_t>(header.size()));
  for (const char* col : {"status", "reason", "variant", "seq_q", "memory.estimated_bytes"})
    CHECK(std::find(header.begin(), header.end(), col) != header.end());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    CHECK(records[i + 1].size() == header.size());
    CHECK(records[i + 1][static_cast<std::size_t>(id_col)] == rows[i]["id"].get<std::string>());
  }
}

Json read_json(const fs::path& p) {
  REQUIRE(fs::exists(p));
  Json j;
  REQUIRE_NOTHROW(j = Json::parse(slurp(p)));
  return j;
}

// Correctness sweeps: no re-measuring under the interference of tests running beside them, and no
// recalibration (tests/test_interference.cpp covers both).
Json measure_fast() {
  return {{"warmup", 0},     {"min_reps", 1},         {"max_reps", 2},       {"min_time_s", 0},
          {"max_time_s", 1}, {"max_interference", 1}, {"calibrate_every", 0}};
}

// Four tiny naive points (two lengths x two masks).
Json small_config() {
  return {{"name", "small"},
          {"variants", {"naive"}},
          {"sweep",
           {{"batch", 1},
            {"heads", 2},
            {"head_dim", 8},
            {"seq_len", {16, 32}},
            {"mask", {"none", "causal"}},
            {"threads", 1}}},
          {"measure", measure_fast()},
          {"accuracy", {{"reference", "full"}}},
          {"memory_budget", "1GiB"},
          {"seed", 3}};
}

// Forty naive points of ~50 ms each: long enough that a signal sent after the first row lands mid-run.
Json slow_config() {
  Json lens = Json::array();
  for (int n = 16; n < 56; ++n) lens.push_back(n);
  return {{"name", "slow"},
          {"variants", {"naive"}},
          {"sweep", {{"batch", 1}, {"heads", 1}, {"head_dim", 8}, {"seq_len", lens}, {"threads", 1}}},
          {"measure",
           {{"warmup", 0},
            {"min_reps", 1},
            {"max_reps", 100000},
            {"min_time_s", 0.05},
            {"max_time_s", 1},
            {"max_interference", 1},
            {"calibrate_every", 0}}},
          {"accuracy", {{"reference", "full"}}},
          {"memory_budget", "1GiB"}};
}

std::string write_config(const ScratchDir& dir, const std::string& name, const Json& config) {
  const std::string path = dir.file(name);
  write_text(path, config.dump(2) + "\n");
  return path;
}

// The ids the sweep should produce for a config file, from the library itself.
std::set<std::string> planned_ids(const std::string& config_path) {
  std::set<std::string> ids;
  for (const auto& pt : make_plan(load_sweep_config(config_path)).points) ids.insert(pt.id);
  return ids;
}

// A sweep with ok, skipped (memory budget, cross-attention) and failed (unusable tokens file) points, run
// once and shared by the tests that inspect its output.
struct MixedRun {
  ScratchDir dir{"sweeprun"};
  std::string config_path;
  Json config;
  RunResult result;
  fs::path out;
  std::vector<Json> rows;
};

const MixedRun& mixed_run() {
  static const std::unique_ptr<MixedRun> run = [] {
    auto m = std::make_unique<MixedRun>();
    write_text(m->dir.path() / "empty.txt", "");
    m->config = {
        {"name", "mixed"},
        {"variants",
         Json::parse(R"(["naive", {"name": "sliding_window", "params": {"window": 4}}, "linear"])")},
        {"sweep",
         {{"batch", 1},
          {"heads", 2},
          {"head_dim", 16},
          {"seq_q", 16},
          {"seq_kv", {16, 24, 4096}},
          {"threads", 1}}},
        // The tokens regime on an empty file cannot make inputs: those points fail, then the gaussian
        // points still run.
        {"inputs", Json::parse(R"([{"regime": "tokens", "text": "empty.txt"}, {"regime": "gaussian"}])")},
        {"measure", measure_fast()},
        {"accuracy", {{"reference", "full"}}},
        // The seq_kv 4096 points need about 1 MiB of inputs alone.
        {"memory_budget", "256KiB"},
        {"seed", 1}};
    m->config_path = write_config(m->dir, "mixed.json", m->config);
    m->out = m->dir.path() / "out";
    m->result = wait_attnbench(
        spawn_attnbench({"run", m->config_path, "--out", m->out.string()}, m->dir.path(), "mixed"),
        m->dir.path(), "mixed");
    if (fs::exists(m->out / "results.jsonl")) m->rows = read_rows(m->out / "results.jsonl");
    return m;
  }();
  return *run;
}

// small_config() run once with --force over stale results; tests copy its output folder before changing
// anything.
struct SmallRun {
  ScratchDir dir{"sweeprun"};
  RunResult result;
  fs::path out;
  std::vector<Json> rows;
};

const SmallRun& small_run() {
  static const std::unique_ptr<SmallRun> run = [] {
    auto m = std::make_unique<SmallRun>();
    const std::string cfg = write_config(m->dir, "small.json", small_config());
    m->out = m->dir.path() / "out";
    // Stale results from an older sweep, for --force to replace.
    fs::create_directories(m->out);
    write_text(m->out / "results.jsonl", R"({"id": "stale", "status": "ok"})"
                                         "\n");
    write_text(m->out / "meta.json", R"({"config_hash": "0", "resumed_at": ["then"]})"
                                     "\n");
    write_text(m->out / "results.csv", "id,status\nstale,ok\n");
    m->result = run_attnbench({"run", cfg, "--out", m->out.string(), "--force"}, m->dir.path());
    if (fs::exists(m->out / "results.jsonl")) m->rows = read_rows(m->out / "results.jsonl");
    return m;
  }();
  return *run;
}

const Json* find_row(const std::vector<Json>& rows, const std::string& variant, int64_t seq_kv,
                     const std::string& kind) {
  for (const Json& r : rows)
    if (r["variant"] == variant && r["seq_kv"] == seq_kv &&
        r["regime"].get<std::string>().rfind(kind, 0) == 0)
      return &r;
  return nullptr;
}

bool is_count(const Json& v) {
  return v.is_number_integer() && v.get<int64_t>() >= 0;
}

}  // namespace

TEST_CASE("an invalid config exits 2 and creates no output folder", "[sweep][run]") {
  ScratchDir dir{"sweeprun"};
  Json bad = small_config();
  bad["sweep"]["seq_len"] = {64, 128, -5};
  const std::string cfg = write_config(dir, "bad.json", bad);
  const RunResult r = run_attnbench({"run", cfg, "--out", dir.file("out")}, dir.path());
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Contains("sweep.seq_len[2]: must be a positive integer, got -5"));
  CHECK_FALSE(fs::exists(dir.path() / "out"));
  // Nor the default folder (results/<name> under the working directory).
  const RunResult r2 = run_attnbench({"run", cfg}, dir.path());
  CHECK(r2.code == 2);
  CHECK_FALSE(fs::exists(dir.path() / "results"));

  bad = small_config();
  bad["sweeep"] = bad["sweep"];
  write_config(dir, "bad.json", bad);
  const RunResult r3 = run_attnbench({"run", cfg, "--out", dir.file("out")}, dir.path());
  CHECK(r3.code == 2);
  CHECK_THAT(r3.err, Contains("did you mean 'sweep'?"));
  CHECK_FALSE(fs::exists(dir.path() / "out"));
}

TEST_CASE("a sweep writes one row per point to results.jsonl, results.csv and meta.json", "[sweep][run]") {
  const MixedRun& m = mixed_run();
  INFO("stdout:\n" << m.result.out << "\nstderr:\n" << m.result.err);
  CHECK(m.result.code == 1);  // some points failed (the tokens ones)
  const std::set<std::string> planned = planned_ids(m.config_path);
  REQUIRE(planned.size() == 2 * 3 * 3);  // regimes x variants x seq_kv
  REQUIRE(m.rows.size() == planned.size());
  const auto counts = id_counts(m.rows);
  for (const auto& id : planned) CHECK(counts.count(id) == 1);

  check_csv_matches(m.out, m.rows);

  const Json meta = read_json(m.out / "meta.json");
  CHECK(meta.at("config") == m.config);
  CHECK(meta.at("config_hash").is_string());
  CHECK(meta.at("config_hash") == load_sweep_config(m.config_path).hash());
  CHECK(meta.at("system").is_object());
  REQUIRE(meta.at("sgemm_calibration").is_array());
  REQUIRE(meta["sgemm_calibration"].size() == 1);
  CHECK(meta["sgemm_calibration"][0].at("threads") == 1);
  CHECK(meta["sgemm_calibration"][0].at("gflops").get<double>() > 0);
  // One FMA peak per (threads, SIMD target): here the best target only (the config has no sweep.isa).
  REQUIRE(meta.at("fma_peak").is_array());
  REQUIRE(meta["fma_peak"].size() == 1);
  CHECK(meta["fma_peak"][0].at("threads") == 1);
  CHECK(meta["fma_peak"][0].at("isa") == simd::isa_info().best);
  CHECK(meta["fma_peak"][0].at("gflops").get<double>() > 0);
  CHECK(meta["fma_peak"][0].at("lanes").get<int>() >= 1);
  // The memory-bandwidth calibration, keyed by thread count.
  REQUIRE(meta.at("memory_bandwidth").is_object());
  REQUIRE(meta["memory_bandwidth"].size() == 1);
  const Json& bw = meta["memory_bandwidth"].at("1");
  CHECK(bw.at("gbytes_per_s").get<double>() > 0);
  CHECK(bw.at("median").get<double>() > 0);
  CHECK(bw.at("median").get<double>() <= bw.at("gbytes_per_s").get<double>());
  // The buffer this build's attnbench reads (a sanitizer build's is capped: bandwidth_buffer_bytes).
  CHECK(bw.at("buffer_bytes").get<uint64_t>() == bandwidth_buffer_bytes() / sizeof(float) * sizeof(float));
  if (!kSanitizerBuild) CHECK(bw.at("buffer_bytes").get<uint64_t>() >= (uint64_t{512} << 20));
  CHECK(meta.at("isa_option") == "best");
  CHECK(meta.at("system").at("isa").at("best") == simd::isa_info().best);
  CHECK(meta.at("start_time").is_string());
  CHECK(meta.at("end_time").is_string());
  CHECK(meta.at("interrupted") == false);
  CHECK(meta.at("rows") == m.rows.size());
}

TEST_CASE("ok rows hold every documented field with its type", "[sweep][run]") {
  const MixedRun& m = mixed_run();
  const bool probe_supported = read_json(m.out / "meta.json").value("memory_probe", "") != "unsupported";
  int ok = 0;
  for (const Json& r : m.rows) {
    if (r.value("status", "") != "ok") continue;
    ++ok;
    INFO(r.dump(2));
    CHECK(r.at("id").is_string());
    CHECK(r.at("variant").is_string());
    CHECK(r.at("params").is_object());
    for (const char* k : {"batch", "heads", "seq_q", "seq_kv", "head_dim", "threads"})
      CHECK(r.at(k).is_number_integer());
    CHECK(r.at("mask") == "none");
    CHECK(r.at("regime").is_string());
    CHECK(r.at("reason") == "");
    const Json& t = r.at("time_ms");
    for (const char* k : {"median", "p10", "p90"}) CHECK(t.at(k).is_number());
    CHECK(t.at("reps").is_number_integer());
    CHECK(t.at("reps").get<int>() >= 1);
    CHECK(t.at("reps").get<int>() <= 2);  // measure.max_reps
    CHECK(t["p10"].get<double>() <= t["median"].get<double>());
    CHECK(t["median"].get<double>() <= t["p90"].get<double>());
    // the repetitions themselves, one attempt (max_interference 1 here), the probe's readings.
    CHECK(t.at("samples").size() == t["reps"].get<std::size_t>());
    CHECK(r.at("attempts") == 1);
    CHECK(r.at("noisy") == false);
    CHECK(r.at("calibration") == 0);
    CHECK(r.at("interference").at("window_s").get<double>() > 0);
    CHECK(r["interference"].at("score").get<double>() >= 0);
    CHECK(r["memory"].at("peak_note").is_string());
    CHECK(r.at("gflops").is_number());
    CHECK(r["gflops"].get<double>() > 0);
    CHECK(r.at("frac_sgemm").is_number());
    CHECK(r["frac_sgemm"].get<double>() > 0);
    // No kernel can outrun the FMA units: frac_peak is a fraction (the sweep's tiny shapes are far below 1).
    // The probe runs on every target through run-time dispatch, so this holds whatever the build flags.
    CHECK(r.at("frac_peak").is_number());
    CHECK(r["frac_peak"].get<double>() > 0);
    CHECK(r["frac_peak"].get<double>() < 1.0);
    CHECK(r.at("isa") == simd::isa_info().best);  // no sweep.isa: the best target ran
    // Bandwidth: K/V heads = heads here; bytes at least Q, K, V and O once.
    CHECK(r.at("kv_heads") == r["heads"]);
    CHECK(r.at("bytes").is_number());
    CHECK(r["bytes"].get<double>() >= 4.0 * 4 * 16 * 16 * 2 - 1);
    CHECK(r.at("gbytes_per_s").is_number());
    CHECK(r["gbytes_per_s"].get<double>() ==
          Approx(r["bytes"].get<double>() / (t["median"].get<double>() * 1e6)));
    CHECK(r.at("frac_bandwidth").is_number());
    CHECK(r["frac_bandwidth"].get<double>() > 0);
    const Json& mem = r.at("memory");
    CHECK((mem.at("peak_bytes").is_null() || is_count(mem["peak_bytes"])));
    if (probe_supported) CHECK(is_count(mem["peak_bytes"]));
    CHECK(is_count(mem.at("estimated_bytes")));
    const Json& a = r.at("accuracy");
    CHECK(a.at("reference") == "full");
    CHECK(a.at("rows") == r["seq_q"]);
    for (const char* k : {"max_abs_err", "rel_l2_err", "mean_cosine"}) CHECK(a.at(k).is_number());
    if (r["variant"] == "naive") {  // exact attention: fp32 rounding only
      CHECK(a["max_abs_err"].get<double>() < 1e-4);
      CHECK(a["mean_cosine"].get<double>() > 0.9999);
    }
  }
  CHECK(ok == 5);  // gaussian: naive and linear at seq_kv 16 and 24, sliding_window at 16
}

TEST_CASE("points over the memory budget or unsupported are skipped with the reason, and the sweep goes on",
          "[sweep][run]") {
  const MixedRun& m = mixed_run();
  SECTION("over the memory budget: the reason gives the bytes") {
    for (const char* variant : {"naive", "linear"}) {
      const Json* r = find_row(m.rows, variant, 4096, "gaussian");
      REQUIRE(r != nullptr);
      INFO(r->dump(2));
      CHECK(r->at("status") == "skipped");
      const std::string reason = r->at("reason");
      // The budget covers the inputs, the variant's output + workspace estimate, the accuracy reference and
      // the per-head sink logits every point draws (fp32, `heads` of them: the reason names them).
      const uint64_t need = r->at("memory").at("inputs_bytes").get<uint64_t>() +
                            r->at("memory").at("estimated_bytes").get<uint64_t>() +
                            r->at("memory").at("reference_bytes").get<uint64_t>() +
                            r->at("heads").get<uint64_t>() * sizeof(float);
      CHECK(need > 256 * 1024);
      CHECK_THAT(reason, Contains("needs " + std::to_string(need) + " bytes"));
      CHECK_THAT(reason, Contains("memory_budget 256.000 KiB"));
    }
  }
  SECTION("unsupported by the variant: its own reason") {
    for (int64_t kv : {24, 4096}) {
      const Json* r = find_row(m.rows, "sliding_window", kv, "gaussian");
      REQUIRE(r != nullptr);
      INFO(r->dump(2));
      CHECK(r->at("status") == "skipped");
      CHECK_THAT(r->at("reason").get<std::string>(),
                 Contains("sliding_window does not support cross-attention"));
    }
  }
  SECTION("failed points have status failed and a reason") {
    int failed = 0;
    for (const Json& r : m.rows)
      if (r["status"] == "failed") {
        ++failed;
        CHECK(r["regime"].get<std::string>().rfind("tokens", 0) == 0);
        CHECK_FALSE(r["reason"].get<std::string>().empty());
      }
    // tokens: every variant at seq_kv 16, naive and linear at 24 (the rest are skipped before inputs are
    // made).
    CHECK(failed == 5);
  }
  SECTION("ok rows follow skipped and failed ones in the file") {
    std::size_t first_skip = m.rows.size(), first_fail = m.rows.size(), last_ok = 0;
    for (std::size_t i = 0; i < m.rows.size(); ++i) {
      const std::string s = m.rows[i]["status"];
      if (s == "skipped") first_skip = std::min(first_skip, i);
      if (s == "failed") first_fail = std::min(first_fail, i);
      if (s == "ok") last_ok = i;
    }
    CHECK(first_skip < last_ok);
    CHECK(first_fail < last_ok);
  }
}

TEST_CASE("skipped and failed rows carry every documented field (null where nothing was measured)",
          "[sweep][run]") {
  // The issue: "Each row has at least: id, ..., time_ms {median, p10, p90, reps}, gflops, frac_sgemm, memory
  // {peak_bytes, estimated_bytes}, accuracy {reference, rows, max_abs_err, rel_l2_err, mean_cosine}".
  const MixedRun& m = mixed_run();
  const std::vector<std::string> paths{"/id",
                                       "/variant",
                                       "/params",
                                       "/batch",
                                       "/heads",
                                       "/seq_q",
                                       "/seq_kv",
                                       "/head_dim",
                                       "/mask",
                                       "/regime",
                                       "/threads",
                                       "/isa",
                                       "/status",
                                       "/reason",
                                       "/time_ms/median",
                                       "/time_ms/p10",
                                       "/time_ms/p90",
                                       "/time_ms/reps",
                                       "/gflops",
                                       "/frac_sgemm",
                                       "/frac_peak",
                                       "/memory/peak_bytes",
                                       "/memory/estimated_bytes",
                                       "/accuracy/reference",
                                       "/accuracy/rows",
                                       "/accuracy/max_abs_err",
                                       "/accuracy/rel_l2_err",
                                       "/accuracy/mean_cosine"};
  int checked = 0;
  for (const Json& r : m.rows) {
    if (r.value("status", "") == "ok") continue;
    ++checked;
    std::string missing;
    for (const auto& p : paths)
      if (!r.contains(Json::json_pointer(p))) missing += " " + p;
    INFO(r.dump());
    CHECK(missing == "");
  }
  CHECK(checked == 13);
}

TEST_CASE("a finished sweep run with --force: the stale row dropped, CSV and meta.json agree",
          "[sweep][run]") {
  const SmallRun& pristine = small_run();
  REQUIRE(pristine.result.code == 0);
  REQUIRE(pristine.rows.size() == 4);  // --force dropped the stale row
  for (const Json& row : pristine.rows) CHECK(row["id"] != "stale");
  check_csv_matches(pristine.out, pristine.rows);
  {
    const Json meta = read_json(pristine.out / "meta.json");
    CHECK_FALSE(meta.contains("resumed_at"));
    CHECK(meta.at("rows") == 4);
    CHECK(meta.at("config") == small_config());
  }
}

TEST_CASE("rerun, --force, --resume and torn lines on one output folder", "[sweep][run]") {
  // Each section works on its own copy of one finished sweep (Catch2 reruns the case per section).
  const SmallRun& pristine = small_run();
  REQUIRE(pristine.result.code == 0);
  const std::vector<Json>& first = pristine.rows;

  ScratchDir dir{"sweeprun"};
  const std::string cfg = write_config(dir, "small.json", small_config());
  const fs::path out = dir.path() / "out";
  fs::copy(pristine.out, out, fs::copy_options::recursive);
  const std::vector<std::string> base{"run", cfg, "--out", out.string()};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const std::set<std::string> planned = planned_ids(cfg);
  REQUIRE(planned.size() == 4);

  SECTION("a rerun without --resume or --force exits 2 and touches nothing") {
    const auto before = snapshot(out);
    const RunResult r = run_attnbench(base, dir.path());
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains("already holds results"));
    CHECK(snapshot(out) == before);
  }

  SECTION("--resume and --force together exit 2 and touch nothing") {
    const auto before = snapshot(out);
    CHECK(run_attnbench(with({"--resume", "--force"}), dir.path()).code == 2);
    CHECK(snapshot(out) == before);
  }

  SECTION("--resume on a finished sweep measures nothing new") {
    const std::string jsonl = slurp(out / "results.jsonl");
    const RunResult r = run_attnbench(with({"--resume"}), dir.path());
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Contains("4 already done"));
    CHECK(slurp(out / "results.jsonl") == jsonl);
    check_csv_matches(out, first);
    const Json meta = read_json(out / "meta.json");
    CHECK(meta.at("rows") == 4);
    CHECK(meta.at("resumed_at").size() == 1);
  }

  SECTION("--resume with a changed config exits 2 and touches nothing") {
    Json changed = small_config();
    changed["seed"] = 4;
    write_config(dir, "small.json", changed);
    const auto before = snapshot(out);
    const RunResult r = run_attnbench(with({"--resume"}), dir.path());
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains("config changed"));
    CHECK(snapshot(out) == before);
  }

  SECTION("a torn last line is cut and its point measured again, once") {
    std::vector<std::string> lines = lines_of(slurp(out / "results.jsonl"));
    REQUIRE(lines.size() == 4);
    const std::string torn_id = Json::parse(lines.back())["id"];
    std::string text;
    for (std::size_t i = 0; i + 1 < lines.size(); ++i) text += lines[i] + "\n";
    text += lines.back().substr(0, lines.back().size() / 2);  // a write cut mid-line, no newline
    write_text(out / "results.jsonl", text);

    const RunResult r = run_attnbench(with({"--resume"}), dir.path());
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Contains("3 already done"));
    const std::vector<Json> rows = read_rows(out / "results.jsonl");
    REQUIRE(rows.size() == 4);
    for (std::size_t i = 0; i + 1 < lines.size(); ++i) CHECK(rows[i] == Json::parse(lines[i]));  // kept as is
    CHECK(rows.back()["id"] == torn_id);
    const auto counts = id_counts(rows);
    for (const auto& id : planned) CHECK(counts.count(id) == 1);
    check_csv_matches(out, rows);
  }

  SECTION("a bad line that is not the last one is an error naming the line, not silently dropped") {
    std::vector<std::string> lines = lines_of(slurp(out / "results.jsonl"));
    lines[1] = "{not json";
    std::string text;
    for (const auto& l : lines) text += l + "\n";
    write_text(out / "results.jsonl", text);
    const auto before = snapshot(out);
    const RunResult r = run_attnbench(with({"--resume"}), dir.path());
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains("line 2"));
    CHECK(snapshot(out) == before);
  }

  SECTION("--resume --filter measures only the missing points that match") {
    write_text(out / "results.jsonl", "");  // as if killed right after the calibration
    const RunResult r = run_attnbench(with({"--resume", "--filter", "causal"}), dir.path());
    CHECK(r.code == 0);
    const std::vector<Json> rows = read_rows(out / "results.jsonl");
    CHECK(rows.size() == 2);
    for (const Json& row : rows) CHECK_THAT(row["id"].get<std::string>(), Contains("causal"));
    check_csv_matches(out, rows);
  }
}

TEST_CASE("run with a filter that matches nothing exits 2 and writes nothing", "[sweep][run]") {
  ScratchDir dir{"sweeprun"};
  const std::string cfg = write_config(dir, "small.json", small_config());
  const RunResult r =
      run_attnbench({"run", cfg, "--out", dir.file("out"), "--filter", "no-such-point"}, dir.path());
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Contains("no-such-point"));
  CHECK_FALSE(fs::exists(dir.path() / "out"));
}

TEST_CASE("a dry run lists every point with skip reasons and writes nothing", "[sweep][run]") {
  ScratchDir dir{"sweeprun"};
  Json c = small_config();
  c["variants"] = {"naive", "linear"};
  c["sweep"]["dropout"] = 0.1;  // linear forms no weights to drop: every linear point is skipped
  const std::string cfg = write_config(dir, "dry.json", c);
  const RunResult r = run_attnbench({"run", cfg, "--out", dir.file("out"), "--dry-run"}, dir.path());
  CHECK(r.code == 0);
  CHECK_FALSE(fs::exists(dir.path() / "out"));
  CHECK_FALSE(fs::exists(dir.path() / "results"));
  const std::set<std::string> planned = planned_ids(cfg);
  REQUIRE(planned.size() == 8);
  std::set<std::string> listed;
  int skipped = 0;
  for (const auto& line : lines_of(r.out)) {
    for (const auto& id : planned)
      if (line.rfind(id + "  ", 0) == 0) listed.insert(id);
    if (line.find("SKIP: linear does not support dropout") != std::string::npos) ++skipped;
  }
  CHECK(listed == planned);
  CHECK(skipped == 4);
  CHECK_THAT(r.out, Contains("8 points"));

  // --filter narrows the listed plan to the ids containing the text.
  const RunResult f =
      run_attnbench({"run", cfg, "--out", dir.file("out"), "--dry-run", "--filter", "linear"}, dir.path());
  CHECK(f.code == 0);
  CHECK_THAT(f.out, Contains("4 points"));
  for (const auto& id : planned)
    CHECK((f.out.find(id + "  ") != std::string::npos) == (id.find("linear") != std::string::npos));
  CHECK_FALSE(fs::exists(dir.path() / "out"));

  // Points over the memory budget are listed as skipped with the bytes they need, as the run would skip them.
  Json big = small_config();
  big["variants"] = {"naive"};
  big["memory_budget"] = "1KiB";
  const std::string big_cfg = write_config(dir, "dry_budget.json", big);
  const RunResult b = run_attnbench({"run", big_cfg, "--out", dir.file("out"), "--dry-run"}, dir.path());
  CHECK(b.code == 0);
  int over = 0;
  for (const auto& line : lines_of(b.out))
    if (line.find("SKIP: needs ") != std::string::npos &&
        line.find("> memory_budget 1.000 KiB") != std::string::npos)
      ++over;
  CHECK(over == static_cast<int>(planned_ids(big_cfg).size()));
  CHECK(over > 0);
  CHECK_FALSE(fs::exists(dir.path() / "out"));
}

TEST_CASE("kill -9 mid-run, --resume, SIGINT mid-resume (exit 130), --resume: every point exactly once",
          "[sweep][run]") {
  // One sequence so the sgemm calibration runs once: resumed runs reuse the one in meta.json.
  ScratchDir dir{"sweeprun"};
  const std::string cfg = write_config(dir, "slow.json", slow_config());
  const fs::path out = dir.path() / "out", jsonl = out / "results.jsonl";
  const std::vector<std::string> resume{"run", cfg, "--out", out.string(), "--resume"};
  const std::set<std::string> planned = planned_ids(cfg);
  REQUIRE(planned.size() == 40);

  // kill -9 after the first row.
  pid_t pid = spawn_attnbench({"run", cfg, "--out", out.string()}, dir.path(), "killed");
  wait_for_rows(pid, 0, jsonl, dir.path(), "killed");
  REQUIRE(::kill(pid, SIGKILL) == 0);
  const RunResult killed = wait_attnbench(pid, dir.path(), "killed");
  INFO("killed run stdout:\n" << killed.out << "\nstderr:\n" << killed.err);
  REQUIRE(killed.code == 128 + SIGKILL);
  const std::vector<Json> after_kill = read_rows(jsonl);
  CHECK(after_kill.size() >= 1);
  CHECK(after_kill.size() < planned.size());  // it died mid-run

  // --resume, interrupted with SIGINT once it has added a row: it finishes that point and exits 130.
  pid = spawn_attnbench(resume, dir.path(), "interrupted");
  wait_for_rows(pid, after_kill.size(), jsonl, dir.path(), "interrupted");
  REQUIRE(::kill(pid, SIGINT) == 0);
  const RunResult stopped = wait_attnbench(pid, dir.path(), "interrupted");
  INFO("interrupted run stdout:\n" << stopped.out << "\nstderr:\n" << stopped.err);
  CHECK(stopped.code == 130);
  CHECK_THAT(stopped.out, Contains(std::to_string(after_kill.size()) + " already done"));
  const std::vector<Json> partial = read_rows(jsonl);
  CHECK(partial.size() > after_kill.size());
  CHECK(partial.size() < planned.size());
  for (std::size_t i = 0; i < after_kill.size() && i < partial.size(); ++i)
    CHECK(partial[i] == after_kill[i]);
  check_csv_matches(out, partial);
  Json meta = read_json(out / "meta.json");
  CHECK(meta.at("interrupted") == true);
  CHECK(meta.at("rows") == partial.size());
  CHECK(meta.at("end_time").is_string());

  // --resume completes it.
  const RunResult r = run_attnbench(resume, dir.path());
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains(std::to_string(partial.size()) + " already done"));
  const std::vector<Json> rows = read_rows(jsonl);
  CHECK(rows.size() == planned.size());
  const auto counts = id_counts(rows);
  for (const auto& id : planned) CHECK(counts.count(id) == 1);
  for (const auto& [id, n] : counts) CHECK((n == 1 && planned.count(id)));
  for (std::size_t i = 0; i < partial.size() && i < rows.size(); ++i)
    CHECK(rows[i] == partial[i]);  // kept as is
  check_csv_matches(out, rows);
  meta = read_json(out / "meta.json");
  CHECK(meta.at("interrupted") == false);
  CHECK(meta.at("rows") == planned.size());
  CHECK(meta.at("resumed_at").size() == 2);
  CHECK(meta.at("sgemm_calibration").size() == 1);  // resumed runs keep the first calibration
}

TEST_CASE("kill -9 during the sgemm calibration (before any row), then --resume finishes the sweep",
          "[sweep][run]") {
  // The calibration takes a second or more, so a crash or kill there is likely; it must not leave a folder
  // that both a plain rerun ("already holds results") and --resume ("no meta.json") refuse.
  ScratchDir dir{"sweeprun"};
  const std::string cfg = write_config(dir, "small.json", small_config());
  const fs::path out = dir.path() / "out";
  const pid_t pid = spawn_attnbench({"run", cfg, "--out", out.string()}, dir.path(), "early");
  wait_for_file(pid, out / "results.jsonl", dir.path(), "early");  // created just before the calibration
  REQUIRE(::kill(pid, SIGKILL) == 0);
  const RunResult killed = wait_attnbench(pid, dir.path(), "early");
  REQUIRE(killed.code == 128 + SIGKILL);

  const RunResult r = run_attnbench({"run", cfg, "--out", out.string(), "--resume"}, dir.path());
  CHECK(r.code == 0);
  if (r.code == 0) {
    const std::vector<Json> rows = read_rows(out / "results.jsonl");
    CHECK(id_counts(rows).size() == 4);
    CHECK(rows.size() == 4);
  }
}

TEST_CASE("SIGINT during the sgemm calibration stops cleanly: exit 130, meta.json and results.csv written",
          "[sweep][run]") {
  ScratchDir dir{"sweeprun"};
  const std::string cfg = write_config(dir, "small.json", small_config());
  const fs::path out = dir.path() / "out";
  const pid_t pid = spawn_attnbench({"run", cfg, "--out", out.string()}, dir.path(), "early");
  wait_for_file(pid, out / "results.jsonl", dir.path(), "early");  // created just before the calibration
  REQUIRE(::kill(pid, SIGINT) == 0);
  const RunResult r = wait_attnbench(pid, dir.path(), "early");
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK_FALSE(r.signaled);  // not killed by the default SIGINT action
  CHECK(r.code == 130);
  CHECK(fs::exists(out / "results.csv"));
  REQUIRE(fs::exists(out / "meta.json"));
  CHECK(read_json(out / "meta.json").value("interrupted", false) == true);
}

namespace {

// Two variants, one with BLAS GEMMs (naive) and one with its own SIMD kernels (tiled), at one small shape.
Json isa_config() {
  return {{"name", "isa"},
          {"variants", {"naive", "tiled"}},
          {"sweep", {{"batch", 1}, {"heads", 2}, {"head_dim", 16}, {"seq_len", 33}, {"threads", 1}}},
          {"measure", measure_fast()},
          {"accuracy", {{"reference", "full"}}},
          {"memory_budget", "1GiB"}};
}

// "best, avx3, ..., scalar": what every --isa / sweep.isa error lists.
std::string supported_isas() {
  std::string s = "best";
  for (const auto& n : simd::isa_info().supported) s += ", " + n;
  return s;
}

}  // namespace

TEST_CASE("sweep.isa [best, scalar]: rows name the target that ran, fma_peak and frac_peak are per target",
          "[sweep][run][isa]") {
  ScratchDir dir{"sweeprun"};
  Json config = isa_config();
  config["sweep"]["isa"] = {"best", "scalar"};
  const std::string cfg = write_config(dir, "isa.json", config);
  const fs::path out = dir.path() / "out";
  const RunResult r = run_attnbench({"run", cfg, "--out", out.string()}, dir.path());
  REQUIRE(r.code == 0);
  const std::vector<Json> rows = read_rows(out / "results.jsonl");
  REQUIRE(rows.size() == 4);  // variants x isa
  const std::string best = simd::isa_info().best;
  const Json meta = read_json(out / "meta.json");
  // One peak per (threads, target that ran): "best" resolves to this CPU's best target.
  std::map<std::string, double> peak;
  for (const Json& p : meta.at("fma_peak")) {
    CHECK(p.at("threads") == 1);
    CHECK(p.at("gflops").get<double>() > 0);
    CHECK(p.at("lanes").get<int>() >= 1);
    peak[p.at("isa").get<std::string>()] = p["gflops"].get<double>();
  }
  CHECK(peak.size() == (best == "scalar" ? 1u : 2u));
  CHECK(peak.count(best));
  CHECK(peak.count("scalar"));
  std::map<std::string, int> per_isa;
  for (const Json& row : rows) {
    INFO(row.dump());
    CHECK(row.at("status") == "ok");
    const std::string id = row.at("id");
    // The requested "best" adds nothing to the id (as without sweep.isa); other names end it with ",isa=".
    const bool scalar = id.size() > 11 && id.substr(id.size() - 11) == ",isa=scalar";
    CHECK((scalar || id.find("isa=") == std::string::npos));
    CHECK(row.at("isa") == (scalar ? "scalar" : best));
    ++per_isa[row["isa"].get<std::string>()];
    // frac_peak is over the peak of the row's own target.
    CHECK(row.at("frac_peak").get<double>() ==
          Approx(row.at("gflops").get<double>() / peak.at(row["isa"].get<std::string>())).epsilon(1e-9));
    CHECK(row.at("accuracy").at("max_abs_err").get<double>() < 1e-4);
  }
  CHECK(per_isa["scalar"] == 2);
  if (best != "scalar") CHECK(per_isa[best] == 2);
  check_csv_matches(out, rows);
  const auto records = parse_csv(slurp(out / "results.csv"));
  const auto col = std::find(records[0].begin(), records[0].end(), "isa") - records[0].begin();
  REQUIRE(col < static_cast<std::ptrdiff_t>(records[0].size()));
  for (std::size_t i = 0; i < rows.size(); ++i)
    CHECK(records[i + 1][static_cast<std::size_t>(col)] == rows[i]["isa"].get<std::string>());

  // --filter selects by target.
  const RunResult dry = run_attnbench({"run", cfg, "--dry-run", "--filter", "isa=scalar"}, dir.path());
  CHECK(dry.code == 0);
  CHECK_THAT(dry.out, Contains("2 points"));
}

TEST_CASE("a bad sweep.isa is refused (exit 2, path, value, supported targets) before anything is written",
          "[sweep][run][isa]") {
  ScratchDir dir{"sweeprun"};
  const fs::path out = dir.path() / "out";
  // An earlier sweep's folder, which --force would replace: it stays exactly as it was.
  fs::create_directories(out);
  write_text(out / "results.jsonl", R"({"id": "old", "status": "ok"})"
                                    "\n");
  write_text(out / "meta.json", R"({"config_hash": "0"})"
                                "\n");
  const auto before = snapshot(dir.path());
  struct Case {
    Json isa;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"nosuch", {"sweep.isa 'nosuch'", "supported: " + supported_isas()}},
      {{"best", "nosuch"}, {"sweep.isa[1] 'nosuch'", "supported: " + supported_isas()}},
      {{"scalar", 3}, {"sweep.isa[1]: must be a SIMD target name", "got 3"}},
      {Json::array(), {"sweep.isa: must not be an empty list"}},
      {{"scalar", "scalar"}, {"same id"}},
  };
  for (const Case& c : cases) {
    Json config = isa_config();
    config["sweep"]["isa"] = c.isa;
    const std::string cfg = write_config(dir, "bad.json", config);
    const auto snap = snapshot(dir.path());
    const RunResult r = run_attnbench({"run", cfg, "--out", out.string(), "--force"}, dir.path());
    INFO("sweep.isa " << c.isa.dump());
    CHECK(r.code == 2);
    for (const auto& part : c.parts) CHECK_THAT(r.err, Contains(part));
    CHECK(snapshot(dir.path()) == snap);
    CHECK_FALSE(fs::exists(dir.path() / "results"));
  }
  fs::remove(dir.path() / "bad.json");
  CHECK(snapshot(dir.path()) == before);
}

TEST_CASE("run --isa: the target of a config without sweep.isa, refused next to one, kept for --resume",
          "[sweep][run][isa]") {
  ScratchDir dir{"sweeprun"};
  const std::string cfg = write_config(dir, "isa.json", isa_config());
  const fs::path out = dir.path() / "out";
  const RunResult r = run_attnbench({"run", cfg, "--out", out.string(), "--isa", "scalar"}, dir.path());
  REQUIRE(r.code == 0);
  const std::vector<Json> rows = read_rows(out / "results.jsonl");
  REQUIRE(rows.size() == 2);
  for (const Json& row : rows) {
    CHECK(row.at("isa") == "scalar");
    CHECK_THAT(row.at("id").get<std::string>(), Contains(",isa=scalar"));
  }
  const Json meta = read_json(out / "meta.json");
  CHECK(meta.at("isa_option") == "scalar");
  bool scalar_peak = false;
  for (const Json& p : meta.at("fma_peak")) scalar_peak |= p.at("isa") == "scalar";
  CHECK(scalar_peak);

  // --resume with another --isa would mix targets in one folder: refused, naming both.
  const auto snap = snapshot(dir.path());
  const RunResult resume = run_attnbench({"run", cfg, "--out", out.string(), "--resume"}, dir.path());
  CHECK(resume.code == 2);
  CHECK_THAT(resume.err, Contains("--isa scalar"));
  CHECK_THAT(resume.err, Contains("--isa best"));
  CHECK(snapshot(dir.path()) == snap);
  const RunResult same =
      run_attnbench({"run", cfg, "--out", out.string(), "--resume", "--isa", "scalar"}, dir.path());
  CHECK(same.code == 0);

  // A config with sweep.isa and a different --isa contradict each other.
  Json with_axis = isa_config();
  with_axis["sweep"]["isa"] = "best";
  const std::string cfg2 = write_config(dir, "axis.json", with_axis);
  const RunResult both =
      run_attnbench({"run", cfg2, "--out", dir.file("out2"), "--isa", "scalar"}, dir.path());
  CHECK(both.code == 2);
  CHECK_THAT(both.err, Contains("--isa 'scalar'"));
  CHECK_THAT(both.err, Contains("sets sweep.isa"));
  CHECK_FALSE(fs::exists(dir.path() / "out2"));
}

TEST_CASE("grouped-query sweep: kv_heads < heads rows carry kv_heads and bytes, and inputs K/V have kv_heads",
          "[sweep][run][gqa]") {
  ScratchDir dir{"sweeprun"};
  write_text(dir.path() / "words.txt", "the cache holds keys and values for every past token of the text\n");
  const Json config = {
      {"name", "gqa"},
      {"variants", {"naive", "tiled"}},
      {"sweep",
       {{"batch", 1},
        {"heads", 4},
        {"kv_heads", {4, 2, 1}},
        {"head_dim", 8},
        {"seq_q", 4},
        {"seq_kv", 40},
        {"mask", {"none", "causal_lower_right"}},
        {"threads", 1}}},
      {"inputs", Json::parse(R"([{"regime": "gaussian"}, {"regime": "tokens", "text": "words.txt"}])")},
      {"measure", measure_fast()},
      {"accuracy", {{"reference", "full"}}},
      {"memory_budget", "1GiB"},
      {"seed", 5}};
  const std::string cfg = write_config(dir, "gqa.json", config);
  const fs::path out = dir.path() / "out";
  const RunResult r = run_attnbench({"run", cfg, "--out", out.string(), "--plain"}, dir.path());
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK_THAT(r.out, Contains("memory bandwidth (streaming read of"));
  CHECK(r.code == 0);
  const std::vector<Json> rows = read_rows(out / "results.jsonl");
  REQUIRE(rows.size() == 2 * 3 * 2 * 2);  // variants x kv_heads x masks x regimes
  std::set<int64_t> kv_seen;
  int gqa_ok = 0;
  for (const Json& row : rows) {
    INFO(row.dump(2));
    const int64_t kv = row.at("kv_heads").get<int64_t>();
    kv_seen.insert(kv);
    CHECK((row["id"].get<std::string>().find(",Hkv=" + std::to_string(kv) + ",") != std::string::npos) ==
          (kv != 4));
    REQUIRE(row.at("bytes").is_number());
    // Compulsory traffic: Q and O with 4 heads, K and V with kv heads (fp32).
    const double compulsory = 4.0 * (2 * 4 * 4 * 8 + 2 * kv * 40 * 8);
    CHECK(row["bytes"].get<double>() >= compulsory);
    const Attention& v = Registry::instance().get(row["variant"].get<std::string>());
    const bool supported =
        (kv == 4 || v.capabilities().gqa) && (row["mask"] == "none" || v.capabilities().causal_lower_right);
    if (!supported) {
      CHECK(row["status"] == "skipped");
      if (kv != 4 && !v.capabilities().gqa) CHECK_THAT(row["reason"].get<std::string>(), Contains("grouped"));
      CHECK(row["frac_bandwidth"].is_null());
      continue;
    }
    CHECK(row["status"] == "ok");
    CHECK(row["frac_bandwidth"].is_number());
    CHECK(row["frac_bandwidth"].get<double>() > 0);
    CHECK(row["accuracy"]["max_abs_err"].get<double>() < 1e-4);  // exact variants against the fp64 reference
    if (kv != 4) ++gqa_ok;
  }
  CHECK(kv_seen == std::set<int64_t>{1, 2, 4});
  const bool any_gqa = Registry::instance().get("naive").capabilities().gqa ||
                       Registry::instance().get("tiled").capabilities().gqa;
  CHECK((gqa_ok > 0) == any_gqa);

  // `attnbench inputs` writes K and V with kv_heads heads, in both regimes.
  for (const std::string regime : {"gaussian(std=1)", "tokens(words.txt)"}) {
    const std::string id = "naive:B=1,H=4,Hkv=2,Lq=4,Lkv=40,D=8," + regime + ",T=1";
    const fs::path in_dir = dir.path() / ("inputs_" + regime.substr(0, 6));
    const RunResult ri = run_attnbench({"inputs", cfg, "--filter", id, "--out", in_dir.string()}, dir.path());
    INFO("inputs stdout:\n" << ri.out << "\nstderr:\n" << ri.err);
    REQUIRE(ri.code == 0);
    CHECK(read_npy_float((in_dir / "q.npy").string()).shape == std::vector<int64_t>{1, 4, 4, 8});
    CHECK(read_npy_float((in_dir / "k.npy").string()).shape == std::vector<int64_t>{1, 2, 40, 8});
    CHECK(read_npy_float((in_dir / "v.npy").string()).shape == std::vector<int64_t>{1, 2, 40, 8});
    const Json point = read_json(in_dir / "point.json");
    CHECK(point["problem"]["kv_heads"] == 2);
    CHECK(point["row"]["kv_heads"] == 2);
  }
}

TEST_CASE("precision and position: bf16 + ALiBi + RoPE rows carry dtype, bias, rope, rope_ms, accuracy_e2e",
          "[sweep][run][dtype]") {
  ScratchDir dir{"sweeprun"};
  const Json config = {{"name", "precision"},
                       {"variants", {"naive", "linear"}},
                       {"sweep",
                        {{"batch", 1},
                         {"heads", 2},
                         {"head_dim", 16},
                         {"seq_len", 32},
                         {"dtype", {"fp32", "bf16"}},
                         {"bias", {"none", "alibi"}},
                         {"threads", 1}}},
                       {"inputs", Json::parse(R"({"regime": "gaussian", "rope": ["none", "normal"]})")},
                       {"measure", measure_fast()},
                       {"accuracy", {{"reference", "full"}}},
                       {"memory_budget", "1GiB"},
                       {"seed", 2}};
  const std::string cfg = write_config(dir, "precision.json", config);
  const fs::path out = dir.path() / "out";
  const RunResult r = run_attnbench({"run", cfg, "--out", out.string(), "--plain"}, dir.path());
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.code == 0);
  const std::vector<Json> rows = read_rows(out / "results.jsonl");
  REQUIRE(rows.size() == 2 * 2 * 2 * 2);  // variants x dtype x bias x rope
  CHECK(id_counts(rows).size() == rows.size());
  check_csv_matches(out, rows);
  int naive_bf16 = 0, linear_bf16 = 0;
  std::map<std::string, double> linear_workspace;  // by dtype and rope
  for (const Json& row : rows) {
    INFO(row.dump(2));
    const std::string dtype = row.at("dtype"), bias = row.at("bias"), rope = row.at("rope");
    CHECK((dtype == "fp32" || dtype == "bf16"));
    CHECK((bias == "none" || bias == "alibi"));
    CHECK((rope == "none" || rope == "normal"));
    CHECK((row["id"].get<std::string>().find(",dtype=bf16,") != std::string::npos) == (dtype == "bf16"));
    CHECK((row["id"].get<std::string>().find(",alibi,") != std::string::npos) == (bias == "alibi"));
    CHECK((row["id"].get<std::string>().find("rope=normal") != std::string::npos) == (rope == "normal"));
    if (row["variant"] == "linear" && bias != "none") {  // linear takes bf16 (widened), not ALiBi
      CHECK(row["status"] == "skipped");
      CHECK_THAT(row["reason"].get<std::string>(), Contains("ALiBi"));
      CHECK_THAT(row["reason"].get<std::string>(), !Contains("dtype"));
      CHECK(row["rope_ms"].is_null());
      CHECK(row["accuracy_e2e"]["max_abs_err"].is_null());
      continue;
    }
    REQUIRE(row["status"] == "ok");
    // rope_ms: a positive time with RoPE on, null without.
    if (rope == "normal") {
      REQUIRE(row["rope_ms"].is_number());
      CHECK(row["rope_ms"].get<double>() > 0);
    } else {
      CHECK(row["rope_ms"].is_null());
    }
    const Json &a = row.at("accuracy"), &e = row.at("accuracy_e2e");
    CHECK(e.at("reference") == "full");
    CHECK(e.at("rows") == 32);
    for (const char* k : {"max_abs_err", "rel_l2_err", "mean_cosine"}) {
      REQUIRE(a.at(k).is_number());
      REQUIRE(e.at(k).is_number());
      CHECK(std::isfinite(e[k].get<double>()));
    }
    CHECK(e["max_abs_err"].get<double>() >= 0);
    // 16-bit inputs: half the bytes of fp32.
    CHECK(row["memory"]["inputs_bytes"] == (dtype == "bf16" ? 2 : 4) * 3 * 2 * 32 * 16);
    if (row["variant"] == "linear") linear_workspace[dtype + "/" + rope] = row["memory"]["workspace_bytes"];
    if (dtype == "fp32") {
      CHECK(e == a);  // one reference serves both
    } else if (row["variant"] == "naive") {
      ++naive_bf16;
      // The kernel on the rounded inputs is fp32-exact; rounding the inputs to bf16 (8 bits of mantissa)
      // costs far more end to end.
      CHECK(a["max_abs_err"].get<double>() < 1e-5);
      CHECK(e["max_abs_err"].get<double>() > 1e-4);
    } else {
      ++linear_bf16;
    }
  }
  CHECK(naive_bf16 == 4);
  CHECK(linear_bf16 == 2);  // bias none, with and without RoPE
  // linear widens bf16 to fp32 up front: its workspace holds fp32 copies of Q, K and V (4 bytes each).
  for (const char* rope : {"none", "normal"}) {
    INFO("rope " << rope);
    REQUIRE(linear_workspace.count(std::string("bf16/") + rope) == 1);
    CHECK(linear_workspace[std::string("bf16/") + rope] - linear_workspace[std::string("fp32/") + rope] ==
          4 * 3 * 2 * 32 * 16);
  }
}

TEST_CASE("RoPE: the sweep's inputs are the fp32 draws rotated, with the same seed as without RoPE",
          "[sweep][run][rope]") {
  Json j = small_config();
  j["sweep"]["seq_len"] = 16;
  j["sweep"]["mask"] = "none";
  j["inputs"] = Json::parse(R"({"regime": "gaussian", "rope": ["none", "neox"]})");
  const Plan plan = make_plan(parse_sweep_config(j, "cfg.json"));
  REQUIRE(plan.points.size() == 2);
  const PointInputs plain = make_inputs(plan.points[0]), rotated = make_inputs(plan.points[1]);
  REQUIRE(plan.points[1].regime.rope.on());
  FloatArray q = plain.q, k = plain.k;
  apply_point_rope(plan.points[1], q.ptr(), k.ptr());
  CHECK(q.data == rotated.q.data);
  CHECK(k.data == rotated.k.data);
  CHECK(plain.v.data == rotated.v.data);
  CHECK(plain.q.data != rotated.q.data);
}

namespace {

// Largest |a - b| over n values, and ||a - b|| / ||b||.
double max_diff(const double* a, const double* b, std::size_t n) {
  double m = 0;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
double rel_diff(const double* a, const double* b, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

// The point of `plan` with this variant, seq_q, dtype, pass and sinks.
const SweepPoint& find_point(const Plan& plan, const std::string& variant, int64_t seq_q, DType dtype,
                             Pass pass, bool sinks = false) {
  for (const SweepPoint& pt : plan.points)
    if (pt.problem.variant == variant && pt.problem.seq_q == seq_q && pt.problem.dtype == dtype &&
        pt.pass == pass && pt.problem.sinks == sinks)
      return pt;
  FAIL("no point " << variant << " seq_q " << seq_q);
  return plan.points.front();
}

}  // namespace

TEST_CASE(
    "backward rows of a recurrence: grad_accuracy against its own fp64 gradient (full and sampled blocks)",
    "[sweep][backward][recurrent]") {
  for (const std::string mode : {"full", "sampled"}) {
    // gla (a gate per channel) and gated_delta_rule (scalar gate, beta) on one input set, beside exact
    // attention: each against its own definition, none reusing another's gradient.
    const std::string text = R"({"name": "rec-bwd",
      "variants": [{"name": "gla", "params": {"chunk": 8}}, {"name": "gated_delta_rule", "params": {"chunk": 8}},
                   "naive"],
      "sweep": {"batch": 2, "heads": 4, "kv_heads": 2, "head_dim": 8, "seq_len": 20, "mask": "causal",
                "threads": 1, "pass": ["backward", "forward_backward"], "dtype": ["fp32", "bf16"]},
      "measure": {"warmup": 0, "min_reps": 1, "max_reps": 2, "min_time_s": 0, "max_time_s": 1,
                  "max_interference": 1, "calibrate_every": 0},
      "accuracy": {"reference": ")" +
                             mode + R"(", "rows": 8}, "memory_budget": "1GiB", "seed": 3})";
    const Plan plan = make_plan(parse_sweep_config_text(text, "rec-bwd.json"));
    REQUIRE(plan.points.size() == 12);
    PointRunner runner(plan.config);
    Calibration cal;
    cal.sgemm_gflops[1] = 1;
    runner.set_calibration(cal);
    std::vector<ResultRow> rows;
    bool interrupted = false;
    for (std::size_t i = 0; i < plan.points.size();) {  // the input sets' groups, as the sweep measures them
      std::size_t j = i;
      while (j < plan.points.size() && plan.points[j].input_key == plan.points[i].input_key) ++j;
      const std::vector<SweepPoint> group(plan.points.begin() + i, plan.points.begin() + j);
      for (ResultRow& r : runner.measure_group(
               group, [] { return false; }, interrupted))
        rows.push_back(r);
      i = j;
    }
    REQUIRE(rows.size() == plan.points.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const ResultRow& row = rows[i];
      INFO(mode << " " << row.id << ": " << row.reason);
      REQUIRE(row.status == "ok");
      CHECK(row.grad_accuracy.reference == mode);
      CHECK(row.grad_accuracy.blocks == (mode == "full" ? 4 : 2));
      for (const GradAccuracySummary::Part* part :
           {&row.grad_accuracy.dq, &row.grad_accuracy.dk, &row.grad_accuracy.dv}) {
        REQUIRE(part->rel_l2_err);
        CHECK(*part->rel_l2_err < 1e-5);
        CHECK(*part->nan_count == 0);
      }
      // The sampled blocks of an own definition are gathered from its whole gradient: counted in the
      // reference's memory.
      if (mode == "sampled" && plan.points[i].problem.variant != "naive") {
        const SweepPoint& exact =
            find_point(plan, "naive", 20, plan.points[i].problem.dtype, plan.points[i].pass);
        CHECK(point_memory(plan.points[i], plan.config).grad_reference >
              point_memory(exact, plan.config).grad_reference);
      }
    }
  }
}

TEST_CASE(
    "attnbench inputs: the g, beta, sink logits and initial state a point reads, and its own references",
    "[sweep][inputs][recurrent]") {
  ScratchDir dir("recinputs");
  const std::string text = R"({"name": "rec-inputs",
    "variants": [{"name": "gla", "params": {"chunk": 8}}, {"name": "gated_delta_rule", "params": {"chunk": 8}},
                 "naive"],
    "sweep": {"batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 8, "seq_q": [2, 24], "seq_kv": 24,
              "mask": "causal_lower_right", "sinks": [false, true], "threads": 1,
              "pass": ["forward", "backward"], "dtype": ["fp32", "bf16"]},
    "accuracy": {"reference": "full"}, "memory_budget": "1GiB", "seed": 7})";
  const std::string cfg = dir.write("c.json", text);
  const Plan plan = make_plan(parse_sweep_config_text(text, cfg));
  // The files of point `pt` (its `attnbench inputs` folder) and point.json's "files".
  auto fetch = [&](const SweepPoint& pt, const std::string& name) {
    const fs::path out = dir.path() / name;
    const RunResult r = run_attnbench({"inputs", cfg, "--filter", pt.id, "--out", out.string()}, dir.path());
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    const Json files = read_json(out / "point.json").at("files");
    for (const auto& [key, file] : files.items()) CHECK(fs::exists(out / file.get<std::string>()));
    return std::make_pair(out, files);
  };
  // The inputs of a point from its files, as the kernel reads them (rounded to the point's dtype).
  struct Loaded {
    FloatArray q, k, v, g, beta, state;
    AttentionInputs fp32;
  };
  auto load = [](const fs::path& out, const Json& files) {
    auto opt = [&](const char* key) {
      return files.contains(key) ? read_npy_float((out / files[key].get<std::string>()).string())
                                 : FloatArray();
    };
    Loaded l{opt("q"), opt("k"), opt("v"), opt("g"), opt("beta"), opt("initial_state"), {}};
    l.fp32.q = l.q.ptr(), l.fp32.k = l.k.ptr(), l.fp32.v = l.v.ptr();
    l.fp32.g = l.g.numel() ? l.g.ptr() : nullptr;
    l.fp32.beta = l.beta.numel() ? l.beta.ptr() : nullptr;
    l.fp32.initial_state = l.state.numel() ? l.state.ptr() : nullptr;
    return l;
  };
  const Attention& gla = Registry::instance().get("gla");
  const Attention& gdr = Registry::instance().get("gated_delta_rule");

  SECTION("gla, bf16: g per channel [b, h, n, d]; reference.npy and reference_e2e.npy its own definition") {
    const SweepPoint& pt = find_point(plan, "gla", 24, DType::bf16, Pass::forward);
    const auto [out, files] = fetch(pt, "gla");
    const Problem& p = pt.problem;
    CHECK_FALSE(files.contains("beta"));
    CHECK_FALSE(files.contains("sink_logits"));
    CHECK_FALSE(files.contains("initial_state"));
    Loaded l = load(out, files);
    REQUIRE(l.g.shape == std::vector<int64_t>{1, 4, 24, 8});
    CHECK(l.g.data == make_inputs(pt).g_vector.data);
    const DoubleArray ref = read_npy_double((out / "reference.npy").string());
    const DoubleArray e2e = read_npy_double((out / "reference_e2e.npy").string());
    REQUIRE(ref.shape == std::vector<int64_t>{1, 4, 24, 8});
    REQUIRE(e2e.shape == ref.shape);
    DoubleArray want(ref.shape), want_e2e(ref.shape), softmax(ref.shape);
    const StoredInputs stored(p, l.fp32);
    gla.reference_forward(p, stored.get(), want.ptr());
    gla.reference_forward(WideInputs::as_fp32(p), l.fp32, want_e2e.ptr());
    reference_attention(p, stored.get(), softmax.ptr());
    CHECK(max_diff(ref.ptr(), want.ptr(), ref.numel()) <= 1e-12);
    CHECK(max_diff(e2e.ptr(), want_e2e.ptr(), e2e.numel()) <= 1e-12);
    CHECK(max_diff(ref.ptr(), e2e.ptr(), ref.numel()) > 0);        // bf16 rounding
    CHECK(rel_diff(ref.ptr(), softmax.ptr(), ref.numel()) > 0.1);  // another operator
  }
  SECTION("gated_delta_rule backward: scalar g and beta; grad_*.npy the gradient of its own definition") {
    const SweepPoint& pt = find_point(plan, "gated_delta_rule", 24, DType::fp32, Pass::backward);
    const auto [out, files] = fetch(pt, "gdr");
    const Problem& p = pt.problem;
    Loaded l = load(out, files);
    REQUIRE(l.g.shape == std::vector<int64_t>{1, 4, 24});
    REQUIRE(l.beta.shape == std::vector<int64_t>{1, 4, 24});
    const FloatArray d_out = read_npy_float((out / "d_out.npy").string());
    DoubleArray dq({1, 4, 24, 8}), dk({1, 2, 24, 8}), dv(dk.shape);
    gdr.reference_gradients(p, l.fp32, d_out.ptr(),
                            Fp64Gradients{.dq = dq.ptr(), .dk = dk.ptr(), .dv = dv.ptr()});
    // Every block ("full"): the compact layout is the whole gradient's.
    const DoubleArray gq = read_npy_double((out / "grad_dq.npy").string());
    const DoubleArray gk = read_npy_double((out / "grad_dk.npy").string());
    const DoubleArray gv = read_npy_double((out / "grad_dv.npy").string());
    CHECK(gq.shape == std::vector<int64_t>{2, 2, 24, 8});
    CHECK(gk.shape == std::vector<int64_t>{2, 24, 8});
    REQUIRE(gq.numel() == dq.numel());
    REQUIRE(gk.numel() == dk.numel());
    REQUIRE(gv.numel() == dv.numel());
    CHECK(max_diff(gq.ptr(), dq.ptr(), dq.numel()) <= 1e-12);
    CHECK(max_diff(gk.ptr(), dk.ptr(), dk.numel()) <= 1e-12);
    CHECK(max_diff(gv.ptr(), dv.ptr(), dv.numel()) <= 1e-12);
    CHECK(read_npy_double((out / "reference.npy").string()).shape == std::vector<int64_t>{1, 4, 24, 8});
  }
  SECTION("gla decode: initial_state.npy, the reference from it equals the whole context's last rows") {
    const SweepPoint& pt = find_point(plan, "gla", 2, DType::fp32, Pass::forward);
    const auto [out, files] = fetch(pt, "decode");
    const Problem& p = pt.problem;
    REQUIRE(p.initial_state);
    Loaded l = load(out, files);
    REQUIRE(l.state.shape == std::vector<int64_t>{1, 4, 8, 8});
    const DoubleArray ref = read_npy_double((out / "reference.npy").string());
    REQUIRE(ref.shape == std::vector<int64_t>{1, 4, 2, 8});
    DoubleArray want(ref.shape);
    gla.reference_forward(p, l.fp32, want.ptr());
    CHECK(max_diff(ref.ptr(), want.ptr(), ref.numel()) <= 1e-12);
    // The state is the prefill of the first 22 tokens: from it, the decode's rows are the last two of the
    // 24-token sequence (fp32 prefill: up to its rounding).
    Problem whole = p;
    whole.seq_q = 24, whole.initial_state = false;
    whole.mask = MaskSpec{};
    whole.mask.causal = true;
    FloatArray q({1, 4, 24, 8});
    for (int64_t h = 0; h < 4; ++h) std::copy_n(l.q.ptr() + h * 2 * 8, 2 * 8, q.ptr() + (h * 24 + 22) * 8);
    AttentionInputs all = l.fp32;
    all.q = q.ptr(), all.initial_state = nullptr;
    DoubleArray full({1, 4, 24, 8});
    gla.reference_forward(whole, all, full.ptr());
    std::vector<double> last(4 * 2 * 8);
    for (int64_t h = 0; h < 4; ++h)
      std::copy_n(full.ptr() + (h * 24 + 22) * 8, 2 * 8, last.data() + h * 2 * 8);
    CHECK(rel_diff(ref.ptr(), last.data(), last.size()) <= 1e-5);
  }
  SECTION("naive with sink logits: sink_logits.npy [heads], no g or beta") {
    const SweepPoint& pt = find_point(plan, "naive", 24, DType::fp32, Pass::forward, true);
    const auto [out, files] = fetch(pt, "sinks");
    CHECK_FALSE(files.contains("g"));
    CHECK_FALSE(files.contains("beta"));
    REQUIRE(files.contains("sink_logits"));
    const FloatArray sinks = read_npy_float((out / "sink_logits.npy").string());
    CHECK(sinks.shape == std::vector<int64_t>{4});
    CHECK(sinks.data == make_inputs(pt).sink_logits.data);
  }
}

TEST_CASE(
    "d_v != d_k sweep: Dv in the ids, rows with v_head_dim, forward and backward accuracy, inputs' shapes",
    "[sweep][run][value_dim]") {
  ScratchDir dir{"sweeprun"};
  const Json config = {{"name", "dv"},
                       {"variants", {"naive", "tiled", "gated_delta_rule"}},
                       {"sweep",
                        {{"batch", 1},
                         {"heads", 2},
                         {"head_dim", 16},
                         {"v_head_dim", {16, 24}},
                         {"seq_len", 32},
                         {"mask", "causal"},
                         {"pass", {"forward", "backward"}},
                         {"threads", 1}}},
                       {"measure", measure_fast()},
                       {"accuracy", {{"reference", "full"}}},
                       {"memory_budget", "1GiB"},
                       {"seed", 3}};
  const std::string cfg = write_config(dir, "dv.json", config);
  const fs::path out = dir.path() / "out";
  const RunResult r = run_attnbench({"run", cfg, "--out", out.string(), "--plain"}, dir.path());
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.code == 0);
  const std::vector<Json> rows = read_rows(out / "results.jsonl");
  REQUIRE(rows.size() == 3 * 2 * 2);  // variants x v_head_dim x passes
  int distinct_ok = 0;
  for (const Json& row : rows) {
    INFO(row.dump(2));
    const int64_t dv = row.at("v_head_dim").get<int64_t>();
    CHECK(row.at("head_dim") == 16);
    CHECK((row["id"].get<std::string>().find(",D=16,Dv=24,") != std::string::npos) == (dv == 24));
    const Attention& v = Registry::instance().get(row["variant"].get<std::string>());
    if (dv == 24 && !v.capabilities().value_dim) {
      CHECK(row["status"] == "skipped");
      CHECK_THAT(row["reason"].get<std::string>(), Contains("needs V as wide as Q and K"));
      continue;
    }
    REQUIRE(row["status"] == "ok");
    // K at d_k and V at d_v, fp32.
    CHECK(row["memory"]["kv_cache_bytes"] == 4 * 32 * 2 * (16 + dv));
    if (row["pass"] == "forward") {
      CHECK(row["accuracy"]["max_abs_err"].get<double>() < 1e-4);
      CHECK(row["accuracy"]["rows"] == 32);
    } else {
      for (const char* g : {"dq", "dk", "dv"})
        CHECK(row["grad_accuracy"][g]["rel_l2_err"].get<double>() < 1e-4);
    }
    if (dv == 24) ++distinct_ok;
  }
  // naive and tiled take d_v != d_k (forward and backward); the recurrences do where they claim it.
  const auto claims = [](const char* v) {
    return Registry::instance().get(v).capabilities().value_dim ? 2 : 0;
  };
  CHECK(distinct_ok == claims("naive") + claims("tiled") + claims("gated_delta_rule"));

  // `attnbench inputs` writes V, dO and the references d_v wide.
  const std::string id = "naive:B=1,H=2,Lq=32,Lkv=32,D=16,Dv=24,causal,gaussian(std=1),T=1,pass=backward";
  const fs::path in_dir = dir.path() / "inputs";
  const RunResult ri = run_attnbench({"inputs", cfg, "--filter", id, "--out", in_dir.string()}, dir.path());
  INFO("inputs stdout:\n" << ri.out << "\nstderr:\n" << ri.err);
  REQUIRE(ri.code == 0);
  CHECK(read_npy_float((in_dir / "q.npy").string()).shape == std::vector<int64_t>{1, 2, 32, 16});
  CHECK(read_npy_float((in_dir / "k.npy").string()).shape == std::vector<int64_t>{1, 2, 32, 16});
  CHECK(read_npy_float((in_dir / "v.npy").string()).shape == std::vector<int64_t>{1, 2, 32, 24});
  CHECK(read_npy_float((in_dir / "d_out.npy").string()).shape == std::vector<int64_t>{1, 2, 32, 24});
  CHECK(read_json(in_dir / "point.json")["problem"]["v_head_dim"] == 24);
}
