// Timings on a shared machine: the interference probe's parsers and score, the distribution-free
// interval of the median (exact coverage and its coverage on synthetic samples), the interval stopping rule,
// a point measured under a deliberate load (flagged or re-measured) and without one (not flagged), the
// interleaved calibration in meta.json, and `attnbench doctor` on made-up /sys trees. Correctness only: no
// assertion is on a time.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/lib/doctor.hpp"
#include "bench/lib/interference.hpp"
#include "bench/lib/measure.hpp"
#include "bench/lib/plan.hpp"
#include "bench/lib/runner.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/runtime.hpp"
#include "tests/support/process.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace attn;
using namespace attn::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// Processes that spin on a core until killed, or at most `seconds` (so a crashed test leaves nothing behind).
struct BusyLoops {
  std::vector<pid_t> pids;
  BusyLoops(int n, double seconds) {
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        volatile uint64_t x = 0;
        while (std::chrono::steady_clock::now() < end)
          for (int k = 0; k < 100000; ++k) x = x + k;
        _exit(0);
      }
      if (pid > 0) pids.push_back(pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let them reach the run queue
  }
  ~BusyLoops() {
    for (pid_t p : pids) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  }
};

// One tiled point at 2 threads, timed for about 0.4 s per attempt, with the given threshold.
ResultRow measure_loaded_point(double max_interference, int max_remeasure) {
  const std::string text = R"({"name": "noise", "variants": ["tiled"],
    "sweep": {"batch": 1, "heads": 4, "head_dim": 64, "seq_len": 512, "threads": 2},
    "measure": {"warmup": 1, "min_reps": 3, "max_reps": 100000, "min_time_s": 0.4, "max_time_s": 5,
                "max_interference": )" +
                           std::to_string(max_interference) + R"(, "max_remeasure": )" +
                           std::to_string(max_remeasure) + R"(},
    "accuracy": {"reference": "none"}, "memory_budget": "1GiB", "seed": 1})";
  const Plan plan = make_plan(parse_sweep_config_text(text, "noise.json"));
  REQUIRE(plan.points.size() == 1);
  PointRunner runner(plan.config);
  Calibration cal;  // the denominators do not matter here
  cal.sgemm_gflops[2] = 1;
  runner.set_calibration(cal);
  return runner.measure(plan.points[0]);
}

// Why the machine is too busy for a measurement that must come out clean ("" when it is quiet): the other
// processes' CPU time and the hypervisor's steal over `seconds` of this process doing nothing, read by the
// same probe the sweep uses. Busy means over `limit` of the cores we may run on.
std::string machine_busy(double seconds, double limit) {
  InterferenceProbe probe;
  probe.start();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const InterferenceSummary s = probe.stop(1);
  if (s.other_cpu_frac + s.steal_frac <= limit) return "";
  return "other processes used " + std::to_string(100 * s.other_cpu_frac) + "% and steal took " +
         std::to_string(100 * s.steal_frac) + "% of the cores over " + std::to_string(seconds) +
         " s with this test idle (more than " + std::to_string(100 * limit) + "%; load average " +
         std::to_string(s.loadavg_1m) + ")";
}

}  // namespace

TEST_CASE("interference: /proc/stat lines are summed over the requested CPUs only", "[interference]") {
  const std::string stat =
      "cpu  300 0 30 900 9 0 3 12 0 0\n"
      "cpu0 100 1 10 300 3 0 1 4 0 0\n"
      "cpu1 100 2 10 300 3 5 1 4 0 0\n"
      "cpu2 100 0 10 300 3 0 1 4 0 0\n"
      "cpu3 7\n"  // too short: not a stat line
      "intr 12345 0 0\n"
      "ctxt 999\n";
  const CpuTicks two = parse_proc_stat(stat, {0, 1});
  CHECK(two.cpus == 2);
  CHECK(two.busy == (100 + 1 + 10 + 0 + 1) + (100 + 2 + 10 + 5 + 1));  // user nice system irq softirq
  CHECK(two.idle == 2 * (300 + 3));
  CHECK(two.steal == 8);
  const CpuTicks all = parse_proc_stat(stat, {});
  CHECK(all.cpus == 3);  // the aggregate line and the short line are not CPUs
  CHECK(all.steal == 12);
  CHECK(parse_proc_stat(stat, {7}).cpus == 0);
  CHECK(parse_proc_stat("", {0}).busy == 0);
}

TEST_CASE("interference: schedstat wait and loadavg parse, and junk reads as nothing", "[interference]") {
  CHECK(parse_schedstat_wait_ns("123456 7890 42\n") == 7890);
  CHECK_FALSE(parse_schedstat_wait_ns("").has_value());
  CHECK_FALSE(parse_schedstat_wait_ns("abc def").has_value());
  CHECK(parse_loadavg("2.55 1.20 0.80 2/82 11635\n") == Approx(2.55));
  CHECK_FALSE(parse_loadavg("x").has_value());
}

TEST_CASE(
    "interference: the score is steal plus the larger of run-queue wait and foreign CPU beyond resolution",
    "[interference]") {
  InterferenceSummary s;
  s.window_s = 1.0;  // resolution at 100 ticks/s: 2 / 100 = 0.02
  s.steal_frac = 0.01;
  s.other_cpu_frac = 0.10;
  s.runq_wait_frac = 0.03;
  CHECK(interference_score(s, 100) == Approx(0.01 + 0.08));
  s.runq_wait_frac = 0.5;
  CHECK(interference_score(s, 100) == Approx(0.51));
  // A window far shorter than a tick: /proc/stat cannot tell, only the run-queue wait counts.
  s.window_s = 0.001;
  s.runq_wait_frac = 0;
  s.other_cpu_frac = 1.0;
  CHECK(interference_score(s, 100) == Approx(0.01));
}

TEST_CASE("median interval: ranks and exact coverage against the binomial", "[interference][ci]") {
  // Below 6 samples no pair of order statistics covers the median with 95%: 1 - 2 / 2^5 = 0.9375 < 0.95.
  CHECK_FALSE(median_interval({1, 2, 3, 4, 5}).ok);
  CHECK(order_statistic_coverage(5, 1) == Approx(0.9375));
  // n = 6: [min, max], coverage 1 - 2/64.
  MedianInterval six = median_interval({6, 1, 5, 2, 4, 3});
  REQUIRE(six.ok);
  CHECK(six.rank == 1);
  CHECK(six.lo == 1);
  CHECK(six.hi == 6);
  CHECK(six.level == Approx(1 - 2.0 / 64));
  // n = 10: l = 2, coverage 1 - 2 (1 + 10) / 1024 = 0.978515625 (l = 3 would give 0.890625).
  std::vector<double> ten{10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  MedianInterval t = median_interval(ten);
  CHECK(t.rank == 2);
  CHECK(t.lo == 2);
  CHECK(t.hi == 9);
  CHECK(t.level == Approx(0.978515625));
  CHECK(order_statistic_coverage(10, 3) == Approx(0.890625));
  // n = 20: l = 6 (coverage 0.9586...), l = 7 falls below (0.8846...).
  std::vector<double> twenty(20);
  for (int i = 0; i < 20; ++i) twenty[static_cast<std::size_t>(i)] = i;
  CHECK(median_interval(twenty).rank == 6);
  CHECK(order_statistic_coverage(20, 6) == Approx(0.958610535));
  CHECK(order_statistic_coverage(20, 7) < 0.95);
  // The exact sum and the normal form agree where they meet (n = 4096 exact, 4097 normal).
  const MedianInterval big_exact = median_interval(std::vector<double>(4096, 1.0));
  const MedianInterval big_normal = median_interval(std::vector<double>(4097, 1.0));
  CHECK(big_exact.level >= 0.95);
  CHECK(big_normal.level >= 0.95);
  CHECK(std::abs(big_exact.rank - big_normal.rank) <= 1);
}

TEST_CASE("median interval: its coverage on synthetic samples is within a few percent of 95%",
          "[interference][ci]") {
  // Skewed and heavy-tailed distributions with a known median; the interval is distribution-free, so its
  // coverage is the binomial figure (>= 95%, a little above because ranks are discrete) whatever the shape.
  std::mt19937_64 rng(2026);
  std::lognormal_distribution<double> lognormal(0.0, 0.5);  // median 1
  std::exponential_distribution<double> exponential(1.0);   // median ln 2
  std::cauchy_distribution<double> cauchy(3.0, 1.0);        // median 3
  struct Case {
    const char* name;
    std::function<double()> draw;
    double median;
  };
  const std::vector<Case> cases{{"lognormal", [&] { return lognormal(rng); }, 1.0},
                                {"exponential", [&] { return exponential(rng); }, std::log(2.0)},
                                {"cauchy", [&] { return cauchy(rng); }, 3.0}};
  for (const int n : {8, 15, 40}) {
    for (const Case& c : cases) {
      constexpr int kTrials = 4000;
      int covered = 0;
      double level = 0;
      for (int trial = 0; trial < kTrials; ++trial) {
        std::vector<double> x(static_cast<std::size_t>(n));
        for (double& v : x) v = c.draw();
        const MedianInterval ci = median_interval(x);
        REQUIRE(ci.ok);
        level = ci.level;
        covered += ci.lo <= c.median && c.median <= ci.hi;
      }
      const double coverage = static_cast<double>(covered) / kTrials;
      INFO(c.name << " n=" << n << ": coverage " << coverage << ", exact " << level);
      // 4000 trials: the standard error of a 96% coverage is 0.3%; 2% is over six of them.
      CHECK(std::abs(coverage - level) < 0.02);
      CHECK(coverage > 0.93);
      CHECK(coverage < 0.995);
    }
  }
}

TEST_CASE("time_repeated with target_rel_ci stops once the interval is tight, else runs to max_reps",
          "[interference][ci]") {
  MeasureSettings m;
  m.warmup = 0;
  m.min_reps = 1;
  m.max_reps = 12;
  m.min_time_s = 100;  // never reached: only the interval (or max_reps) stops these
  m.max_time_s = 100;
  auto nap = [] { std::this_thread::sleep_for(std::chrono::microseconds(200)); };
  m.target_rel_ci = 1e9;  // any interval is tight: stops at the first n with one (6)
  CHECK(time_repeated(nap, m).reps == 6);
  m.target_rel_ci = 1e-12;  // no interval of real sleeps is this tight: runs to max_reps
  const TimingStats t = time_repeated(nap, m);
  CHECK(t.reps == 12);
  CHECK(t.samples_ms.size() == 12);
  REQUIRE(t.ci.ok);
  CHECK(t.ci.lo <= t.median_ms);
  CHECK(t.ci.hi >= t.median_ms);
  m.target_rel_ci = 0;  // off: min_reps and min_time_s (0 here)
  m.min_time_s = 0;
  m.min_reps = 3;
  CHECK(time_repeated(nap, m).reps == 3);
}

TEST_CASE("the quiet-machine check sees a load it makes itself and no load when there is none",
          "[interference][load][serial]") {
  if (available_threads() < 2) {
    WARN("needs 2 cores; this machine has " << available_threads());
    return;
  }
  // The detector the quiet half below relies on must itself be right: two spinners are "busy"...
  {
    const BusyLoops load(2, 30.0);
    CHECK_FALSE(machine_busy(0.5, 0.25).empty());
  }
  // ...and once they are gone it reads quiet unless something else runs (then it says what, and the
  // quiet half would skip).
  const std::string busy = machine_busy(0.5, 0.25);
  if (!busy.empty()) WARN("the machine is busy without our load: " << busy);
}

TEST_CASE(
    "a point timed while two busy processes load the cores is flagged noisy or re-measured, and "
    "without them it is not flagged",
    "[interference][load][serial]") {
  if (available_threads() < 2) {
    WARN("needs 2 cores; this machine has " << available_threads());
    return;
  }
  // Margin on both sides: two spinners next to our two threads on two cores take about half of every
  // core (run-queue wait and foreign CPU near 0.5); a quiet (or merely busy-looking) CI machine stays far
  // below 0.25. The assertion is on the flag and the probe's readings, never on a time.
  constexpr double kThreshold = 0.25;
  {
    const BusyLoops load(2, 60.0);
    const ResultRow row = measure_loaded_point(kThreshold, 1);
    INFO("loaded: score " << (row.interference ? row.interference->score : -1) << ", runq_wait "
                          << (row.interference ? row.interference->runq_wait_frac : -1) << ", other_cpu "
                          << (row.interference ? row.interference->other_cpu_frac : -1));
    REQUIRE(row.status == "ok");
    REQUIRE(row.interference);
    CHECK((row.noisy || row.attempts > 1));
    CHECK(row.attempts == 2);  // the load never left: re-measured once (max_remeasure 1), still noisy
    CHECK(row.noisy);
    CHECK(row.interference->score > kThreshold);
    CHECK(row.interference->window_s > 0.3);
  }
  // Without the spinners: up to 3 re-measurements ride out a passing burst from the rest of the machine
  // (ctest runs this test case alone: [serial]). Only on a quiet machine: other processes using the cores
  // (another job on a shared CI host) make any point noisy, which is the probe working, not failing. The
  // check is the sweep's own probe over an idle second, and is itself tested above.
  if (const std::string busy = machine_busy(1.0, kThreshold / 2); !busy.empty()) {
    WARN("skipped the quiet half: " << busy);
    return;
  }
  const ResultRow quiet = measure_loaded_point(kThreshold, 3);
  INFO("quiet: score " << (quiet.interference ? quiet.interference->score : -1));
  REQUIRE(quiet.interference);
  if (quiet.noisy) {
    // The machine turned busy while we measured, or the probe is wrong: look again.
    if (const std::string busy = machine_busy(1.0, kThreshold / 2); !busy.empty()) {
      WARN("skipped the quiet half: the machine turned busy while it was measured: " << busy);
      return;
    }
  }
  CHECK_FALSE(quiet.noisy);
  CHECK(quiet.interference->score <= kThreshold);
  CHECK(quiet.time_ms.samples.size() == static_cast<std::size_t>(quiet.time_ms.reps));
}

TEST_CASE("time_interleaved: a follower takes part in every round but never keeps the rounds going",
          "[interference]") {
  MeasureSettings m;
  m.warmup = 1;
  m.min_reps = 3;
  m.max_reps = 1000;
  m.min_time_s = 0.01;  // 10 ms of samples
  m.max_time_s = 100;
  // The calls report made-up times: the leader 5 ms a call (done after its 3 rounds), the other 0.1 ms (it
  // would need 100 rounds to reach 10 ms).
  int leader_calls = 0, other_calls = 0;
  const std::vector<std::function<double()>> calls{[&] { return ++leader_calls, 5.0; },
                                                   [&] { return ++other_calls, 0.1; }};
  const InterleavedTiming as_follower = time_interleaved(calls, m, nullptr, {false, true});
  CHECK(as_follower.rounds == 3);
  CHECK(as_follower.stats[1].reps == 3);  // one sample per round, paired with the leader's
  CHECK(other_calls == 4);                // and the warm-up round
  const InterleavedTiming as_peer = time_interleaved(calls, m);
  // As a peer it keeps the rounds going until its 10 ms (100 samples, or 101 when the summed 0.1 ms rounds
  // to just below 10 ms).
  CHECK(as_peer.rounds >= 100);
  CHECK(as_peer.rounds <= 101);
  CHECK(as_peer.stats[0].reps == as_peer.rounds);
  CHECK_THROWS_AS(time_interleaved(calls, m, nullptr, {true}), std::logic_error);
}

TEST_CASE("the calibration's sgemm joins a group's rounds when it costs at most half a round",
          "[interference][sweep]") {
  auto config = [](bool group_sgemm) {
    return R"({"name": "gs", "variants": ["tiled", "naive"],
      "sweep": {"batch": 1, "heads": 2, "head_dim": 32, "seq_len": 256, "threads": 1},
      "measure": {"warmup": 1, "min_reps": 6, "max_reps": 6, "min_time_s": 0, "max_time_s": 30,
                  "max_interference": 1, "group_sgemm": )" +
           std::string(group_sgemm ? "true" : "false") + R"(},
      "accuracy": {"reference": "none"}, "memory_budget": "1GiB", "seed": 1})";
  };
  auto measure = [&](bool group_sgemm, double calibration_gflops) {
    const Plan plan = make_plan(parse_sweep_config_text(config(group_sgemm), "gs.json"));
    REQUIRE(plan.points.size() == 2);
    PointRunner runner(plan.config);
    Calibration cal;
    cal.sgemm_gflops[1] = calibration_gflops;
    runner.set_calibration(cal);
    bool interrupted = false;
    std::vector<ResultRow> rows = runner.measure_group(plan.points, nullptr, interrupted);
    REQUIRE_FALSE(interrupted);
    REQUIRE(rows.size() == 2);
    for (const ResultRow& r : rows) REQUIRE(r.status == "ok");
    return rows;
  };
  // A calibration that makes the sgemm look free: it joins, one call per round, beside both points.
  for (const ResultRow& r : measure(true, 1e12)) {
    INFO(r.id);
    REQUIRE(r.group_sgemm);
    CHECK(r.group_sgemm->reps == 6);
    CHECK(r.group_sgemm->gflops > 0);
    CHECK(r.group_sgemm->gflops < 1e12);  // timed, not the calibration's figure
    REQUIRE(r.frac_sgemm);
    // The median of the per-round ratios, next to the ratio of the medians (they differ under noise only).
    CHECK(*r.frac_sgemm > 0.5 * *r.gflops / r.group_sgemm->gflops);
    CHECK(*r.frac_sgemm < 2.0 * *r.gflops / r.group_sgemm->gflops);
    REQUIRE(r.group_sgemm->frac_ci_lo);  // 6 paired rounds: [min, max] at 96.9%
    CHECK(*r.group_sgemm->frac_ci_lo <= *r.frac_sgemm);
    CHECK(*r.group_sgemm->frac_ci_hi >= *r.frac_sgemm);
  }
  // The sgemm would cost more than half a round: the rows divide by the calibration.
  for (const ResultRow& r : measure(true, 1e-3)) {
    CHECK_FALSE(r.group_sgemm);
    CHECK(*r.frac_sgemm == Approx(*r.gflops / 1e-3));
  }
  // measure.group_sgemm false: never.
  for (const ResultRow& r : measure(false, 1e12)) {
    CHECK_FALSE(r.group_sgemm);
    CHECK(*r.frac_sgemm == Approx(*r.gflops / 1e12));
  }
}

TEST_CASE(
    "a streaming read of a memory-bound point's K and V joins its rounds and frac_bandwidth divides by it",
    "[interference][sweep]") {
  // Decode (one query against 4096 keys): flops / bytes is about 0.5, far left of any real ridge. Two fp32
  // points read one K/V (they share one read), the bf16 point its own half-size copy.
  auto config = [](bool on) {
    return R"({"name": "gb", "variants": ["tiled", "naive"],
      "sweep": {"batch": 1, "heads": 2, "head_dim": 64, "seq_q": 1, "seq_kv": 4096, "mask": "causal_lower_right",
                "dtype": ["fp32", "bf16"], "threads": 1},
      "measure": {"warmup": 1, "min_reps": 6, "max_reps": 6, "min_time_s": 0, "max_time_s": 30,
                  "max_interference": 1, "group_sgemm": false, "group_bandwidth": )" +
           std::string(on ? "true" : "false") + R"(},
      "accuracy": {"reference": "none"}, "memory_budget": "1GiB", "seed": 1})";
  };
  auto measure = [&](bool on, double peak_gflops, double bandwidth) {
    const Plan plan = make_plan(parse_sweep_config_text(config(on), "gb.json"));
    PointRunner runner(plan.config);
    Calibration cal;
    cal.sgemm_gflops[1] = 1e12;
    cal.bandwidth_gbytes_per_s[1] = bandwidth;
    cal.fma_gflops[{1, simd::isa_info().best}] = peak_gflops;
    runner.set_calibration(cal);
    bool interrupted = false;
    std::vector<ResultRow> rows = runner.measure_group(plan.points, nullptr, interrupted);
    REQUIRE_FALSE(interrupted);
    for (const ResultRow& r : rows) REQUIRE(r.status == "ok");
    return std::make_pair(plan, rows);
  };
  // Ridge 1e6 / 1e3 = 1000 FLOP per byte: memory-bound; a read of 4 MiB at 1000 GB/s looks free.
  const auto [plan, rows] = measure(true, 1e6, 1e3);
  REQUIRE(rows.size() >= 3);
  std::map<std::string, double> fp32_read;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const ResultRow& r = rows[i];
    const Problem& p = plan.points[i].problem;
    INFO(r.id);
    REQUIRE(r.group_bandwidth);
    CHECK(r.group_bandwidth->reps == 6);
    const double elt = p.dtype == DType::fp32 ? 4 : 2;
    CHECK(r.group_bandwidth->bytes == Approx(elt * static_cast<double>(p.kv_elements() + p.v_elements())));
    CHECK(r.group_bandwidth->gbytes_per_s > 0);
    CHECK(r.group_bandwidth->gbytes_per_s < 1e5);  // timed, not the calibration's figure
    REQUIRE(r.frac_bandwidth);
    REQUIRE(r.gbytes_per_s);
    // The median of the per-round ratios, next to the ratio of the medians (they differ under noise only).
    CHECK(*r.frac_bandwidth > 0.5 * *r.gbytes_per_s / r.group_bandwidth->gbytes_per_s);
    CHECK(*r.frac_bandwidth < 2.0 * *r.gbytes_per_s / r.group_bandwidth->gbytes_per_s);
    REQUIRE(r.group_bandwidth->frac_ci_lo);  // 6 paired rounds: [min, max] at 96.9%
    CHECK(*r.group_bandwidth->frac_ci_lo <= *r.frac_bandwidth);
    CHECK(*r.group_bandwidth->frac_ci_hi >= *r.frac_bandwidth);
    if (p.dtype == DType::fp32) fp32_read[r.variant] = r.group_bandwidth->gbytes_per_s;
  }
  // tiled and naive at fp32 read the same K/V at the same thread count: one read, one figure.
  REQUIRE(fp32_read.size() == 2);
  CHECK(fp32_read["tiled"] == fp32_read["naive"]);
  // Ridge 1e-3 FLOP per byte: every point is compute-bound, no read; frac_bandwidth divides by the
  // calibration.
  for (const ResultRow& r : measure(true, 1.0, 1e3).second) {
    CHECK_FALSE(r.group_bandwidth);
    CHECK(*r.frac_bandwidth == Approx(*r.gbytes_per_s / 1e3));
  }
  // Ridge 0.2 FLOP per byte: the fp32 points (~0.5) are compute-bound, the bf16 one (~1) is within the 16x
  // room a matrix engine gives 16-bit K/V (AMX), so it alone gets its read.
  for (const ResultRow& r : measure(true, 200, 1e3).second) {
    INFO(r.id);
    CHECK(static_cast<bool>(r.group_bandwidth) == (r.dtype == "bf16"));
  }
  // A read that would cost more than twice a round (4 MiB at 1e-6 GB/s): none.
  for (const ResultRow& r : measure(true, 1e6, 1e-6).second) CHECK_FALSE(r.group_bandwidth);
  // measure.group_bandwidth false: never.
  for (const ResultRow& r : measure(false, 1e6, 1e3).second) {
    CHECK_FALSE(r.group_bandwidth);
    CHECK(*r.frac_bandwidth == Approx(*r.gbytes_per_s / 1e3));
  }
}

TEST_CASE("the sgemm / FMA-peak calibration is measured again every calibrate_every points, in meta.json",
          "[interference][sweep]") {
  ScratchDir dir{"recal"};
  // 7 points at 1 thread, a calibration every 3: at the start, after 3 and after 6 points timed.
  const std::string cfg = dir.write("recal.json", R"({"name": "recal", "variants": ["tiled"],
    "sweep": {"batch": 1, "heads": 1, "head_dim": 16, "seq_len": [8, 9, 10, 11, 12, 13, 14], "threads": 1},
    "measure": {"warmup": 0, "min_reps": 1, "max_reps": 1, "min_time_s": 0, "max_time_s": 1,
                "calibrate_every": 3, "max_interference": 1},
    "accuracy": {"reference": "none"}, "memory_budget": "1GiB", "seed": 1})");
  const fs::path out = dir.path() / "out";
  const ProcResult r = run_attnbench({"run", cfg, "--out", out.string()}, dir.path());
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  std::ifstream mf(out / "meta.json");
  const Json meta = Json::parse(mf);
  const Json& cals = meta.at("calibrations");
  REQUIRE(cals.size() == 3);
  for (std::size_t i = 0; i < cals.size(); ++i) {
    CHECK(cals[i].at("index") == i);
    CHECK(cals[i].at("used") == true);  // max_interference 1: every calibration counts as clean
    CHECK(cals[i].at("sgemm").at(0).at("gflops").get<double>() > 0);
    CHECK(cals[i].at("fma_peak").at(0).at("gflops").get<double>() > 0);
    CHECK(cals[i].at("interference").at("window_s").get<double>() > 0);
  }
  CHECK(cals[0].at("reason") == "start");
  CHECK(cals[1].at("reason") == "cadence");
  CHECK(cals[1].at("after_points") == 3);
  CHECK(cals[2].at("after_points") == 6);
  // Each row names the calibration it was divided by: the latest one before it.
  std::ifstream rf(out / "results.jsonl");
  std::vector<int64_t> used;
  for (std::string line; std::getline(rf, line);)
    used.push_back(Json::parse(line).at("calibration").get<int64_t>());
  CHECK(used == std::vector<int64_t>{0, 0, 0, 1, 1, 1, 2});
  // The first calibration stays where older readers look for it.
  CHECK(meta.at("sgemm_calibration") == cals[0].at("sgemm"));
  CHECK(meta.at("doctor").is_array());
}

TEST_CASE("measure settings: bad interference, cadence and interval values name the field and the range",
          "[interference][config]") {
  auto error_of = [](const std::string& measure) -> std::string {
    try {
      parse_sweep_config_text(
          R"({"name": "x", "variants": ["naive"], "sweep": {"seq_len": 8}, "measure": )" + measure + "}",
          "x.json");
    } catch (const std::exception& e) {
      return e.what();
    }
    return "accepted";
  };
  CHECK_THAT(error_of(R"({"max_interference": 1.5})"), Contains("measure.max_interference"));
  CHECK_THAT(error_of(R"({"max_interference": 1.5})"), Contains("[0, 1]"));
  CHECK_THAT(error_of(R"({"max_remeasure": -1})"), Contains("measure.max_remeasure"));
  CHECK_THAT(error_of(R"({"calibrate_every": "often"})"), Contains("measure.calibrate_every"));
  CHECK_THAT(error_of(R"({"target_rel_ci": 2})"), Contains("measure.target_rel_ci"));
  CHECK_THAT(error_of(R"({"group_sgemm": "yes"})"), Contains("measure.group_sgemm"));
  CHECK_THAT(error_of(R"({"group_sgemm": "yes"})"), Contains("\"yes\""));
  CHECK(
      error_of(
          R"({"target_rel_ci": null, "max_interference": 0.1, "max_remeasure": 0, "calibrate_every": 0})") ==
      "accepted");
}

namespace {
void put(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}
std::string status_of(const DoctorFinding& f) {
  return f.status;
}
}  // namespace

TEST_CASE("doctor: governor, turbo, SMT and huge pages read from a made-up /sys, each warning with a fix",
          "[doctor]") {
  ScratchDir dir{"doctor"};
  const std::string sys = (dir.path() / "sys").string();
  // Nothing exposed: unknown, not ok.
  CHECK(status_of(check_governor(sys, {0, 1})) == "unknown");
  CHECK(status_of(check_turbo(sys)) == "unknown");
  CHECK(status_of(check_smt(sys, {0, 1}, 2)) == "unknown");
  CHECK(status_of(check_thp(sys)) == "unknown");

  put(dir.path() / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", "performance\n");
  put(dir.path() / "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "powersave\n");
  DoctorFinding g = check_governor(sys, {0, 1});
  CHECK(g.status == "warn");
  CHECK_THAT(g.observed, Contains("powersave (1 CPUs)"));
  CHECK_THAT(g.fix, Contains("performance"));
  put(dir.path() / "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "performance\n");
  CHECK(status_of(check_governor(sys, {0, 1})) == "ok");

  put(dir.path() / "sys/devices/system/cpu/cpufreq/boost", "1\n");
  CHECK(status_of(check_turbo(sys)) == "warn");
  put(dir.path() / "sys/devices/system/cpu/intel_pstate/no_turbo", "1\n");  // intel_pstate wins when present
  CHECK(status_of(check_turbo(sys)) == "ok");
  put(dir.path() / "sys/devices/system/cpu/intel_pstate/no_turbo", "0\n");
  CHECK_THAT(check_turbo(sys).fix, Contains("no_turbo"));

  // CPUs 0 and 2 are siblings of one core, 1 and 3 of another.
  for (const auto& [cpu, sib] :
       std::vector<std::pair<int, std::string>>{{0, "0,2"}, {1, "1,3"}, {2, "0,2"}, {3, "1,3"}})
    put(dir.path() / ("sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list"),
        sib);
  DoctorFinding smt = check_smt(sys, {0, 1, 2, 3}, 2);
  CHECK(smt.status == "warn");
  CHECK_THAT(smt.observed, Contains("4 CPUs allowed on 2 physical core(s)"));
  CHECK_THAT(smt.fix, Contains("taskset -c 0,1"));
  CHECK_THAT(check_smt(sys, {0, 1, 2, 3}, 4).fix, Contains("--threads <= 2"));
  CHECK(status_of(check_smt(sys, {0, 1}, 2)) == "ok");  // one CPU per core allowed

  put(dir.path() / "sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]\n");
  CHECK(status_of(check_thp(sys)) == "warn");
  put(dir.path() / "sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n");
  put(dir.path() / "sys/kernel/mm/transparent_hugepage/defrag", "[always] defer madvise never\n");
  CHECK_THAT(check_thp(sys).fix, Contains("defrag"));
  put(dir.path() / "sys/kernel/mm/transparent_hugepage/defrag", "always defer [madvise] never\n");
  CHECK(status_of(check_thp(sys)) == "ok");
}

TEST_CASE("doctor: steal, foreign load, OPENBLAS_CORETYPE and the BLAS kernel core", "[doctor]") {
  CpuTicks before, after;
  before.cpus = after.cpus = 2;
  after.steal = 10;  // 0.1 s of 2 CPU-seconds: 5%
  CHECK(status_of(steal_finding(before, after, 1.0, 100)) == "warn");
  after.steal = 2;  // 1%
  CHECK(status_of(steal_finding(before, after, 1.0, 100)) == "ok");
  after.busy = 120;  // 1.2 CPU-seconds busy, 0.2 of them ours: 50% foreign
  CHECK(status_of(load_finding(before, after, 1.0, 100, 0.2)) == "warn");
  CHECK(status_of(load_finding(before, after, 1.0, 100, 1.15)) == "ok");
  CHECK(status_of(check_openblas_coretype(nullptr, "Prescott", "avx3")) == "ok");  // blas_core says the rest
  const DoctorFinding forced = check_openblas_coretype("Haswell", "Haswell", "avx3");  // AVX2 on AVX-512
  CHECK(forced.status == "warn");
  CHECK_THAT(forced.fix, Contains("unset OPENBLAS_CORETYPE"));
  CHECK(status_of(check_openblas_coretype("SkylakeX", "SkylakeX", "avx3")) == "ok");  // forced to the best
  CHECK_THAT(check_openblas_coretype("SkylakeX", "SkylakeX", "avx3").observed,
             Contains("OPENBLAS_CORETYPE=SkylakeX"));
  CHECK(status_of(check_blas_core("SkylakeX", "avx3")) == "ok");
  CHECK_THAT(check_blas_core("Prescott", "avx3").fix, Contains("OPENBLAS_CORETYPE=SkylakeX"));
  CHECK_THAT(check_blas_core("Prescott", "avx2").fix, Contains("OPENBLAS_CORETYPE=Haswell"));
  CHECK(status_of(check_blas_core("Haswell", "avx2")) == "ok");
  CHECK(status_of(check_blas_core("ARMV8SVE", "sve")) == "ok");
}

TEST_CASE("attnbench doctor --json names every check with a status and, for warnings, a fix",
          "[doctor][cli]") {
  ScratchDir dir{"doctorcli"};
  const ProcResult r = run_attnbench({"doctor", "--json", "--seconds", "0.2"}, dir.path());
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const Json j = Json::parse(r.out);
  std::vector<std::string> names;
  for (const Json& c : j.at("checks")) {
    names.push_back(c.at("check"));
    const std::string status = c.at("status");
    CHECK((status == "ok" || status == "warn" || status == "unknown"));
    CHECK_FALSE(c.at("observed").get<std::string>().empty());
    if (status == "warn") CHECK_FALSE(c.at("fix").get<std::string>().empty());
  }
  CHECK(names == std::vector<std::string>{"governor", "turbo", "smt", "steal", "load", "openblas_coretype",
                                          "blas_core", "thp", "sgemm_spread"});
}
