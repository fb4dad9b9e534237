// Interleaved timing: time_interleaved's round order, its stopping rule per call, a call that
// fails or an interrupt, the drift it cancels (on a made-up clock, so no assertion is on a real time), and a
// sweep's rows naming their group with samples that pair up round by round.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench/lib/config.hpp"
#include "bench/lib/measure.hpp"
#include "tests/support/process.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace attn;
using namespace attn::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

MeasureSettings settings(int warmup, int min_reps, int max_reps, double min_time_s, double max_time_s) {
  MeasureSettings s;
  s.warmup = warmup;
  s.min_reps = min_reps;
  s.max_reps = max_reps;
  s.min_time_s = min_time_s;
  s.max_time_s = max_time_s;
  return s;
}

double median_of(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

}  // namespace

TEST_CASE("time_interleaved: warm-up and timed rounds alternate their order, one call of each per round",
          "[interleave]") {
  std::vector<int> order;
  std::vector<std::function<double()>> calls;
  for (int i = 0; i < 3; ++i)
    calls.push_back([&order, i] {
      order.push_back(i);
      return 1.0;
    });
  // min_time 0: every call is done at min_reps = 3, so 3 timed rounds after the warm-up round.
  const InterleavedTiming t = time_interleaved(calls, settings(1, 3, 50, 0, 100));
  CHECK(order == std::vector<int>{0, 1, 2, /* timed: */ 2, 1, 0, 0, 1, 2, 2, 1, 0});
  CHECK(t.rounds == 3);
  CHECK_FALSE(t.interrupted);
  REQUIRE(t.stats.size() == 3);
  for (const TimingStats& s : t.stats) CHECK(s.reps == 3);
}

TEST_CASE("time_interleaved: a call that is done keeps taking part until the others are, a capped one leaves",
          "[interleave]") {
  // Call 0 takes 10 ms: min_time_s 0.05 is met after 5 calls, max_time_s 0.15 caps it at 15. Call 1 takes
  // 1 ms and would need 50 calls for min_time_s; max_reps caps it at 20. So the rounds run 20 times, call 0
  // leaves after round 15 and call 1 after round 20: sample r of both comes from round r.
  std::vector<std::pair<int, int>> log;  // (call, its own call number)
  int n0 = 0, n1 = 0;
  const std::vector<std::function<double()>> calls = {[&] {
                                                        log.emplace_back(0, n0++);
                                                        return 10.0;
                                                      },
                                                      [&] {
                                                        log.emplace_back(1, n1++);
                                                        return 1.0;
                                                      }};
  const InterleavedTiming t = time_interleaved(calls, settings(0, 3, 20, 0.05, 0.15));
  CHECK(t.rounds == 20);
  CHECK(t.stats[0].reps == 15);
  CHECK(t.stats[1].reps == 20);
  // Round r: both calls while call 0 is in, alternating which goes first.
  for (int r = 0; r < 15; ++r) {
    const auto first = log[2 * static_cast<std::size_t>(r)],
               second = log[2 * static_cast<std::size_t>(r) + 1];
    CHECK(first.first == (r % 2 ? 1 : 0));
    CHECK(second.first == (r % 2 ? 0 : 1));
    CHECK(first.second == r);
    CHECK(second.second == r);
  }
  CHECK(log.size() == 15 * 2 + 5);
}

TEST_CASE("time_interleaved: the stopping rules are time_repeated's for a single call", "[interleave]") {
  int calls = 0;
  auto fn = [&calls] {
    ++calls;
    return 2.0;
  };
  // min_reps 4 and min_time 0.01 s (5 calls of 2 ms): 5; max_reps 3 caps below min_reps: 3.
  CHECK(time_interleaved({fn}, settings(2, 4, 100, 0.01, 10)).stats[0].reps == 5);
  CHECK(calls == 7);
  CHECK(time_interleaved({fn}, settings(0, 4, 3, 0.01, 10)).stats[0].reps == 3);
  // max_time_s below one call: exactly one measured call.
  CHECK(time_interleaved({fn}, settings(0, 4, 100, 0, 0.001)).stats[0].reps == 1);
  // target_rel_ci: identical samples have a zero-width interval once there are 6 (the interval's minimum).
  MeasureSettings ci = settings(0, 2, 100, 100, 1000);
  ci.target_rel_ci = 0.01;
  CHECK(time_interleaved({fn}, ci).stats[0].reps == 6);
}

TEST_CASE("time_interleaved: a failing call leaves with its earlier samples, and stop() ends the rounds",
          "[interleave]") {
  int n1 = 0;
  const std::vector<std::function<double()>> calls = {[] { return 1.0; },
                                                      [&n1] { return ++n1 == 3 ? -1.0 : 1.0; }};
  const InterleavedTiming t = time_interleaved(calls, settings(0, 5, 5, 0, 100));
  CHECK(t.failed == std::vector<bool>{false, true});
  CHECK(t.stats[0].reps == 5);
  CHECK(t.stats[1].reps == 2);
  CHECK(t.rounds == 5);

  int rounds_seen = 0;
  const InterleavedTiming s =
      time_interleaved({[&rounds_seen] {
                         ++rounds_seen;
                         return 1.0;
                       }},
                       settings(0, 100, 100, 0, 100), [&rounds_seen] { return rounds_seen >= 4; });
  CHECK(s.interrupted);
  CHECK(s.rounds == 4);
}

TEST_CASE(
    "time_interleaved: a steady drift of the machine's speed cancels in the ratio, unlike one call after "
    "the other",
    "[interleave]") {
  // A made-up clock: every call takes base x (1 + 5% per call made so far), a machine slowing down steadily
  // (the VM this was written on drifted by tens of percent between minutes). A is twice as slow as B.
  int made = 0;
  auto timed = [&made](double base) { return [&made, base] { return base * (1.0 + 0.05 * made++); }; };
  const MeasureSettings s = settings(0, 9, 9, 0, 1000);
  const InterleavedTiming t = time_interleaved({timed(2.0), timed(1.0)}, s);
  const double interleaved = t.stats[0].median_ms / t.stats[1].median_ms;
  // The paired ratios, round by round: A and B are neighbours in every round.
  std::vector<double> paired;
  for (std::size_t r = 0; r < 9; ++r) paired.push_back(t.stats[0].samples_ms[r] / t.stats[1].samples_ms[r]);
  // One after the other: B's calls all come after A's, 9 calls x 5% slower.
  made = 0;
  std::vector<std::function<double()>> a = {timed(2.0)}, b = {timed(1.0)};
  const double ma = time_interleaved(a, s).stats[0].median_ms, mb = time_interleaved(b, s).stats[0].median_ms;
  const double sequential = ma / mb;
  INFO("interleaved " << interleaved << ", paired " << median_of(paired) << ", sequential " << sequential);
  // Interleaved, the medians are 1 call apart: within 5% / (1 + 0.05 * 8) = 3.6% of 2; paired, each ratio is
  // within that of 2 and they alternate around it. Sequential: 9 calls apart, (1.4 / 1.85) x 2 = 1.51.
  CHECK(std::abs(interleaved / 2.0 - 1.0) < 0.04);
  CHECK(std::abs(median_of(paired) / 2.0 - 1.0) < 0.04);
  CHECK(std::abs(sequential / 2.0 - 1.0) > 0.2);
}

TEST_CASE("sweep: the points sharing an input set are timed as one interleaved group, named in their rows",
          "[interleave][sweep]") {
  ScratchDir dir{"interleave"};
  // Two shapes x two variants x two thread counts: two groups of four (the shape changes the inputs).
  const std::string body = R"("variants": ["naive", "tiled"],
    "sweep": {"batch": 1, "heads": 2, "head_dim": 16, "seq_len": [24, 40], "threads": [1, 2]},
    "accuracy": {"reference": "none"}, "memory_budget": "1GiB", "seed": 1)";
  const std::string measure =
      R"("warmup": 1, "min_reps": 5, "max_reps": 5, "min_time_s": 0, "max_time_s": 60, "max_interference": 1,
         "calibrate_every": 0)";
  auto run = [&](const std::string& name, bool interleave) {
    const std::string cfg =
        dir.write(name + ".json", R"({"name": ")" + name + R"(", )" + body + R"(, "measure": {)" + measure +
                                      R"(, "interleave": )" + (interleave ? "true" : "false") + "}}");
    const fs::path out = dir.path() / name;
    const ProcResult r = run_attnbench({"run", cfg, "--out", out.string()}, dir.path());
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    std::vector<Json> rows;
    std::ifstream f(out / "results.jsonl");
    for (std::string line; std::getline(f, line);) rows.push_back(Json::parse(line));
    return rows;
  };
  const std::vector<Json> rows = run("together", true);
  REQUIRE(rows.size() == 8);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    INFO(rows[i].at("id"));
    REQUIRE(rows[i].at("status") == "ok");
    const Json& g = rows[i].at("interleave");
    const std::size_t first = i / 4 * 4;
    CHECK(g.at("group") == rows[first].at("id"));
    CHECK(g.at("points") == 4);
    CHECK(g.at("position") == i % 4);
    CHECK(g.at("rounds") == 5);  // max_reps 5 = min_reps: every point took part in every round
    CHECK(rows[i].at("time_ms").at("samples").size() == 5);
    CHECK(rows[i].at("seq_kv") == (i < 4 ? 24 : 40));
  }
  for (const Json& row : run("alone", false)) {
    INFO(row.at("id"));
    CHECK(row.at("interleave").at("group").is_null());
    CHECK(row.at("time_ms").at("reps") == 5);
  }
}

TEST_CASE("measure.interleave must be a boolean, and the error names the field and the choices",
          "[interleave][config]") {
  try {
    parse_sweep_config_text(
        R"({"name": "x", "variants": ["naive"], "sweep": {"seq_len": 8}, "measure": {"interleave": "yes"}})",
        "x.json");
    FAIL("accepted");
  } catch (const std::exception& e) {
    CHECK_THAT(std::string(e.what()), Contains("measure.interleave"));
    CHECK_THAT(std::string(e.what()), Contains("\"yes\""));
    CHECK_THAT(std::string(e.what()), Contains("true"));
  }
}
