// dsa through the harness: `attnbench run` draws the index inputs, and the rows carry the phase split. Its
// own file because it starts the attnbench executable: tests/test_dsa.cpp stays in-process, so the TSan run
// (scripts/sanitize) covers dsa's TBB-parallel code.
#include <catch2/catch.hpp>
#include <sstream>
#include <string>

#include "common/interface/params.hpp"
#include "tests/support/process.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace attn;
using namespace attn::test;

TEST_CASE("the sweep draws dsa's index inputs and its rows split the time into phases", "[dsa][sweep]") {
  // Two decode points (lower-right causal, MQA, d_v != d_k) through `attnbench run`: the index inputs are
  // drawn by the harness, the row carries phase_ms, flops and bytes, and the output is accurate against
  // exact attention where topk covers the context.
  ScratchDir dir("dsa-sweep");
  const Json config = {
      {"name", "dsa_sweep"},
      {"variants",
       {{{"name", "dsa"}, {"params", {{"topk", {16, 256}}, {"index_heads", 4}, {"index_dim", 8}}}}}},
      {"sweep",
       {{"batch", 1},
        {"heads", 4},
        {"kv_heads", 1},
        {"head_dim", 24},
        {"v_head_dim", 16},
        {"seq_q", {1}},
        {"seq_kv", {200}},
        {"mask", "causal_lower_right"},
        {"threads", 1}}},
      {"measure",
       {{"warmup", 0},
        {"min_reps", 1},
        {"max_reps", 2},
        {"min_time_s", 0},
        {"max_time_s", 1},
        {"max_interference", 1},
        {"calibrate_every", 0}}},
      {"accuracy", {{"reference", "full"}}},
      {"memory_budget", "1GiB"},
      {"seed", 5}};
  const std::string cfg = dir.write("dsa.json", config.dump());
  const ProcResult r = run_attnbench({"run", cfg, "--out", dir.file("out"), "--plain"}, dir.path());
  INFO(r.err);
  REQUIRE(r.code == 0);
  std::istringstream lines(slurp(dir.path() / "out" / "results.jsonl"));
  int rows = 0;
  for (std::string line; std::getline(lines, line); ++rows) {
    const Json row = Json::parse(line);
    INFO(row.dump());
    REQUIRE(row.at("status") == "ok");
    const Json& phases = row.at("phase_ms");
    REQUIRE(phases.is_object());
    for (const char* name : {"indexer", "selection", "attention"}) CHECK(phases.at(name).get<double>() >= 0);
    CHECK(row.at("flops").get<double>() > 0);
    CHECK(row.at("bytes").get<double>() > 0);
    if (row.at("params").at("topk") == 256)  // covers all 200 keys: exact attention
      CHECK(row.at("accuracy").at("rel_l2_err").get<double>() <= 1e-5);
  }
  CHECK(rows == 2);
}
