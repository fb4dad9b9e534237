// `attnbench mla` end to end: both forms on the tiny preset from a cache, their rows (--out) with the FLOPs,
// the FMA peak measured in the same run and the fraction of it, cache bytes per token and the error against
// the fp64 definition; bad flags exit 2 naming the flag. (A file of its own: it starts the attnbench
// executable, and tests/test_mla.cpp stays in-process.)
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/lib/compare.hpp"
#include "common/interface/params.hpp"
#include "tests/support/process.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace attn;
using namespace attn::test;

TEST_CASE("attnbench mla: both forms' rows carry FLOPs, the FMA peak and their fraction of it",
          "[mla][cli]") {
  ScratchDir dir("mla-cli");
  const ProcResult r =
      run_attnbench({"mla", "--preset", "tiny", "--context", "40", "--new", "1", "--form", "both",
                     "--repeats", "3", "--warmup", "1", "--threads", "1", "--out", dir.file("mla.jsonl")},
                    dir.path());
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(contains(r.out, "FMA peak"));
  CHECK(contains(r.out, "of peak"));
  std::istringstream lines(slurp(dir.path() / "mla.jsonl"));
  int rows = 0;
  for (std::string line; std::getline(lines, line); ++rows) {
    const Json row = Json::parse(line);
    INFO(row.dump());
    CHECK(row.at("kind") == "mla");
    const double gflops = row.at("gflops_per_s").get<double>(),
                 peak = row.at("fma_peak").at("gflops").get<double>();
    REQUIRE(gflops > 0);
    REQUIRE(peak > 0);
    CHECK(row.at("fma_peak").at("threads") == 1);
    CHECK_FALSE(row.at("fma_peak").at("isa").get<std::string>().empty());
    // The fraction is the row's own GFLOP/s over the peak; a layer call this small is far below it, and never
    // above it by more than the peak's own measurement noise.
    CHECK(row.at("frac_peak").get<double>() == Approx(gflops / peak).epsilon(1e-12));
    CHECK(row.at("frac_peak").get<double>() < 1.5);
    CHECK(row.at("rel_l2").get<double>() <= 1e-5);
    CHECK(row.at("cache_bytes_per_token").get<int64_t>() > 0);
  }
  CHECK(rows == 2);
  const ProcResult bad = run_attnbench({"mla", "--preset", "tiny", "--new", "0"}, dir.path());
  CHECK(bad.code == 2);
  CHECK(contains(bad.err, "--new 0"));
}

// A sweep config's "mla" blocks (`attnbench mla --sweep`, scripts/run's MLA step): every (preset, form,
// context, new) point is one row, the contexts filled incrementally through the cache path (MlaLayer::append)
// and checked against the fp64 definition up to check_max_context.
TEST_CASE(
    "attnbench mla --sweep: one row per point of the config's mla blocks, checked up to check_max_context",
    "[mla][cli]") {
  ScratchDir dir("mla-sweep");
  const std::string config = dir.file("c.json");
  {
    std::ofstream f(config);
    f << R"({"name": "mla_sweep", "variants": ["naive"], "sweep": {"seq_len": 8},
             "mla": [{"presets": "tiny", "context": [5, 30], "new": [1, 3], "repeats": 2, "threads": 1,
                      "check_max_context": 10, "gqa": {"kv_heads": 2, "head_dim": 8}},
                     {"presets": {"small": {"d_model": 24, "heads": 2, "q_lora_rank": 0, "kv_lora_rank": 8,
                                            "qk_nope_dim": 4, "qk_rope_dim": 2, "v_head_dim": 6}},
                      "forms": "absorbed", "context": 0, "new": 2, "repeats": 1}]})";
  }
  const ProcResult r = run_attnbench({"mla", "--sweep", config, "--out", dir.file("mla.jsonl")}, dir.path());
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  std::istringstream lines(slurp(dir.path() / "mla.jsonl"));
  std::vector<Json> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(Json::parse(line));
  // tiny: (2 forms + the GQA core) x 2 contexts x 2 new; small: 1 point
  REQUIRE(rows.size() == 3 * 2 * 2 + 1);
  for (const Json& row : rows) {
    INFO(row.dump());
    if (row.at("form") == "gqa") {  // the GQA core alone: 4 query heads on 2 K/V heads of 8, no fp64 check
      CHECK(row.at("gqa") == Json{{"kv_heads", 2}, {"head_dim", 8}});
      CHECK(row.at("cache_bytes_per_token") == 2 * 2 * 8 * 4);
      CHECK(row.at("core_median_ms") == row.at("median_ms"));
      CHECK(contains(row.at("core").get<std::string>(), "Hkv=2"));
      CHECK(row.at("rel_l2").is_null());
      continue;
    }
    CHECK(row.at("config") == "mla_sweep");
    const int64_t context = row.at("context"), fresh = row.at("new_tokens");
    // Checked where context + new <= check_max_context (10 in the first block, the default 1024 in the
    // second).
    if (row.at("preset") == "small" || context + fresh <= 10) {
      REQUIRE(row.at("rel_l2").is_number());
      CHECK(row.at("rel_l2").get<double>() <= 1e-5);
    } else {
      CHECK(row.at("rel_l2").is_null());
    }
    CHECK(row.at("core_median_ms").get<double>() > 0);
    CHECK(row.at("core_median_ms").get<double>() <= row.at("p90_ms").get<double>());
    if (row.at("preset") == "tiny") CHECK(row.at("threads") == 1);  // the block's threads
  }
  CHECK(rows.back().at("preset") == "small");
  CHECK(rows.back().at("form") == "absorbed");

  // Bad blocks exit 2 naming the field, before anything is measured or written.
  auto refused = [&](const std::string& mla, const std::string& needle) {
    const std::string bad = dir.file("bad.json");
    std::ofstream(bad) << R"({"name": "b", "variants": ["naive"], "sweep": {"seq_len": 8}, "mla": )" << mla
                       << "}";
    const ProcResult b = run_attnbench({"mla", "--sweep", bad, "--out", dir.file("bad.jsonl")}, dir.path());
    INFO(mla << "\n" << b.out << b.err);
    CHECK(b.code == 2);
    CHECK(contains(b.err, needle));
    CHECK_FALSE(std::filesystem::exists(dir.path() / "bad.jsonl"));
  };
  refused(R"({"presets": "tiny", "contxt": [4]})", "mla.contxt");
  refused(R"({"presets": "tiny", "context": [8, 4]})", "mla.context[1]");
  refused(R"({"presets": "tiniest", "context": 4})", "mla.presets");
  refused(R"([{"presets": "tiny", "context": 4, "forms": ["naive", "naive"]}])", "mla[0].forms[1]");
  refused(R"({"presets": "tiny", "context": 4, "variant": "linear"})", "strided_kv");
  refused(R"({"presets": "tiny", "context": 4, "gqa": {"kv_heads": 3, "head_dim": 8}})", "mla.gqa.kv_heads");
  refused(R"({"presets": "deepseek_v3", "context": 65536, "memory_budget": "1GiB"})", "memory budget");
  const ProcResult none =
      run_attnbench({"mla", "--sweep", std::string(ATTN_SOURCE_DIR) + "/configs/smoke.json"}, dir.path());
  CHECK(none.code == 2);
  CHECK(contains(none.err, "no \"mla\" section"));
  const ProcResult both = run_attnbench({"mla", "--sweep", config, "--preset", "tiny"}, dir.path());
  CHECK(both.code == 2);
  CHECK(contains(both.err, "--preset: not with --sweep"));
}

// `mla --sweep --resume` (scripts/run's rerun of its MLA step): the points already in --out are kept as
// written and not measured; an interrupted file is finished; rows of another config are refused.
TEST_CASE("attnbench mla --sweep --resume keeps the points already written and measures the rest",
          "[mla][cli]") {
  ScratchDir dir("mla-resume");
  const std::string config = dir.file("c.json"), out = dir.file("mla.jsonl");
  std::ofstream(config) << R"({"name": "mla_resume", "variants": ["naive"], "sweep": {"seq_len": 8},
      "mla": {"presets": "tiny", "context": [5, 30], "new": 1, "repeats": 2, "threads": 1,
              "check_max_context": 10, "gqa": {"kv_heads": 2, "head_dim": 8}}})";
  const ProcResult first = run_attnbench({"mla", "--sweep", config, "--out", out}, dir.path());
  INFO(first.out << first.err);
  REQUIRE(first.code == 0);
  const std::string full = slurp(dir.path() / "mla.jsonl");
  std::vector<std::string> lines;
  {
    std::istringstream in(full);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  REQUIRE(lines.size() == 6);  // (naive, absorbed, gqa) x 2 contexts

  // Everything there: nothing measured, the file as it was.
  const ProcResult again = run_attnbench({"mla", "--sweep", config, "--out", out, "--resume"}, dir.path());
  INFO(again.out << again.err);
  REQUIRE(again.code == 0);
  CHECK(contains(again.out, "every point already in --out"));
  CHECK_FALSE(contains(again.out, "median"));
  CHECK(slurp(dir.path() / "mla.jsonl") == full);

  // Interrupted after the first context's three rows: those kept byte for byte, the other three measured.
  write_text(dir.path() / "mla.jsonl", lines[0] + "\n" + lines[1] + "\n" + lines[2] + "\n");
  const ProcResult rest = run_attnbench({"mla", "--sweep", config, "--out", out, "--resume"}, dir.path());
  INFO(rest.out << rest.err);
  REQUIRE(rest.code == 0);
  std::vector<std::string> now;
  {
    std::istringstream in(slurp(dir.path() / "mla.jsonl"));
    for (std::string l; std::getline(in, l);) now.push_back(l);
  }
  REQUIRE(now.size() == 6);
  for (int i = 0; i < 3; ++i) CHECK(now[i] == lines[i]);
  for (int i = 3; i < 6; ++i) {
    CHECK(now[i] != lines[i]);  // measured again (its timestamp and samples differ)
    CHECK(mla_row_id(Json::parse(now[i])) == mla_row_id(Json::parse(lines[i])));
  }
  CHECK(contains(rest.out, "kept"));

  // Rows of another config, or a line that is not a row: exit 2 naming file and line, the file untouched.
  Json other = Json::parse(lines[0]);
  other["config"] = "elsewhere";
  const std::string mixed = lines[0] + "\n" + other.dump() + "\n";
  write_text(dir.path() / "mla.jsonl", mixed);
  const ProcResult refused = run_attnbench({"mla", "--sweep", config, "--out", out, "--resume"}, dir.path());
  CHECK(refused.code == 2);
  CHECK(contains(refused.err, "line 2: a row of config \"elsewhere\", not \"mla_resume\""));
  CHECK(slurp(dir.path() / "mla.jsonl") == mixed);
  write_text(dir.path() / "mla.jsonl", lines[0] + "\n{\"kind\": \"mla\"}\n");
  const ProcResult bad = run_attnbench({"mla", "--sweep", config, "--out", out, "--resume"}, dir.path());
  CHECK(bad.code == 2);
  CHECK(contains(bad.err, "line 2: not a row of `attnbench mla --sweep`"));
  const ProcResult no_out = run_attnbench({"mla", "--sweep", config, "--resume"}, dir.path());
  CHECK(no_out.code == 2);
  CHECK(contains(no_out.err, "--resume: needs --sweep CONFIG and --out FILE"));
}
