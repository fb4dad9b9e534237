// `attnbench compare` (bench/lib/compare.hpp): the Mann-Whitney U p-value against scipy.stats.mannwhitneyu
// and against exact enumeration, then two synthetic results folders with known differences (a 2x slowdown,
// an unchanged point, a speed-up, points on one side only, a skipped point, rows without repetitions), in
// process and through the built CLI (Markdown, --json, --fail-above and the exit codes, bad input).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "bench/lib/compare.hpp"
#include "common/interface/util.hpp"
#include "common/support/error.hpp"
#include "tests/support/process.hpp"

using namespace attn;
using namespace attn::test;
using Catch::Matchers::Contains;

namespace {

// scipy.stats.mannwhitneyu(x, y, method=...) (scipy 1.10.1; "exact" or "asymptotic" with
// use_continuity=True): its statistic (U of x) and p-value.
struct ScipyCase {
  std::vector<double> x, y;
  double u, p;
  bool exact;
};

// Every rank split of n = n1 + n2 distinct values: the exact two-sided p-value of each arrangement by
// enumerating all C(n, n1) of them, against mann_whitney_u's.
void check_against_enumeration(int n1, int n2) {
  const int n = n1 + n2;
  std::vector<double> us;
  std::vector<std::vector<double>> xs, ys;
  for (unsigned mask = 0; mask < (1u << n); ++mask) {
    if (__builtin_popcount(mask) != n1) continue;
    std::vector<double> x, y;
    for (int r = 0; r < n; ++r) ((mask >> r) & 1u ? x : y).push_back(r + 1.0);
    double u = 0;
    for (double a : x)
      for (double b : y) u += a > b;
    us.push_back(u);
    xs.push_back(x);
    ys.push_back(y);
  }
  for (std::size_t k = 0; k < us.size(); ++k) {
    double at_most = 0, at_least = 0;
    for (double u : us) at_most += u <= us[k], at_least += u >= us[k];
    const double want = std::min(1.0, 2 * std::min(at_most, at_least) / static_cast<double>(us.size()));
    const MannWhitney got = mann_whitney_u(xs[k], ys[k]);
    INFO("n1 " << n1 << ", n2 " << n2 << ", arrangement " << k << ": U " << us[k]);
    CHECK(got.exact);
    CHECK(got.u == us[k]);
    CHECK(got.p_value == Approx(want).epsilon(1e-12));
  }
}

// The repetitions of the synthetic points: 9 values around 1 ms, all distinct, median 1.
const std::vector<double> kBase = {1.00, 1.01, 0.99, 1.02, 0.98, 1.005, 0.995, 1.015, 0.985};
// The same distribution drawn again: interleaved with kBase, no value shared.
const std::vector<double> kBaseAgain = {1.003, 0.993, 1.013, 0.983, 1.008, 0.998, 1.018, 0.988, 1.001};

std::vector<double> scaled(const std::vector<double>& v, double f) {
  std::vector<double> out;
  for (double x : v) out.push_back(x * f);
  return out;
}

ResultRow ok_row(const std::string& id, const std::string& variant, const std::vector<double>& samples_ms,
                 double max_abs_err, const std::string& isa = "avx2") {
  ResultRow r;
  r.id = id;
  r.variant = variant;
  r.threads = 2;
  r.isa = isa;
  r.status = "ok";
  r.attempts = 1;
  r.time_ms.samples = samples_ms;
  r.time_ms.reps = static_cast<int>(samples_ms.size());
  if (!samples_ms.empty()) {
    r.time_ms.median = percentile_linear(samples_ms, 0.5);
    r.time_ms.p10 = percentile_linear(samples_ms, 0.1);
    r.time_ms.p90 = percentile_linear(samples_ms, 0.9);
  }
  r.accuracy.reference = "full";
  r.accuracy.max_abs_err = max_abs_err;
  r.timestamp = "2026-12-01T10:00:00Z";
  return r;
}

ResultRow skipped_row(const std::string& id, const std::string& variant, const std::string& reason) {
  ResultRow r;
  r.id = id;
  r.variant = variant;
  r.threads = 2;
  r.status = "skipped";
  r.reason = reason;
  return r;
}

Json config_json(const Json& measure) {
  return {{"name", "cmp"},
          {"sweep", {{"seq_len", {1024, 4096, 8192}}, {"mask", "causal"}, {"threads", 2}}},
          {"variants", {"naive", "tiled", "linear", "sliding_window"}},
          {"measure", measure}};
}

Json meta_json(const Json& config, const std::string& hash, const std::string& commit, const std::string& cpu,
               const std::string& isa_option = "best") {
  return {{"config_name", "cmp"},
          {"config_path", "/tmp/cmp.json"},
          {"config_hash", hash},
          {"config", config},
          {"isa_option", isa_option},
          {"start_time", "2026-12-01T10:00:00Z"},
          {"end_time", "2026-12-01T10:05:00Z"},
          {"interrupted", false},
          {"system", {{"cpu_model", cpu}, {"git_commit", commit}, {"compiler", "g++ 12.2.0"}}}};
}

void write_folder(const fs::path& dir, const Json& meta, const std::vector<ResultRow>& rows) {
  fs::create_directories(dir);
  write_text(dir / "meta.json", meta.dump(2) + "\n");
  std::string jsonl;
  for (const ResultRow& r : rows) jsonl += to_json(r).dump() + "\n";
  write_text(dir / "results.jsonl", jsonl);
}

const std::string kTail = ":B=1,H=8,Lq=4096,Lkv=4096,D=64,causal,gaussian(std=1),T=2";
const std::string kSlower = "tiled{tile_q=0,tile_kv=0}" + kTail;                             // B: 2x slower
const std::string kSame = "naive:B=1,H=8,Lq=1024,Lkv=1024,D=64,causal,gaussian(std=1),T=2";  // B: unchanged
const std::string kFaster = "linear{feature_map=elu,chunk=64,eps=1e-06}" + kTail;            // B: 0.8x
const std::string kOnlyA = "sliding_window{window=128,dilation=1,global_tokens=0}" + kTail;
const std::string kOnlyB =
    "tiled{tile_q=0,tile_kv=0}:B=1,H=8,Lq=8192,Lkv=8192,D=64,causal,gaussian(std=1),T=2";
const std::string kSkippedB = "naive" + kTail;  // ok in A, over the memory budget in B
const std::string kOld = "naive:B=1,H=8,Lq=8192,Lkv=8192,D=64,causal,gaussian(std=1),T=2";  // no samples in A
const Json kMeasure = {{"min_reps", 9}, {"max_reps", 9}};

// A and B: the same config on the same CPU, B built from another commit.
void write_pair(const fs::path& a, const fs::path& b) {
  const Json config = config_json(kMeasure);
  ResultRow old_a = ok_row(kOld, "naive", {}, 3e-7);
  old_a.time_ms.median = 50.0;  // a row from before time_ms.samples: a median, no repetitions
  write_folder(a, meta_json(config, "c0ffee", "aaaa1111", "AMD EPYC"),
               {ok_row(kSlower, "tiled", kBase, 2.0e-7), ok_row(kSame, "naive", kBase, 3.0e-7),
                ok_row(kFaster, "linear", kBase, 0.5), ok_row(kOnlyA, "sliding_window", kBase, 0.8),
                ok_row(kSkippedB, "naive", kBase, 3.1e-7), old_a});
  ResultRow same_b = ok_row(kSame, "naive", kBaseAgain, 3.0e-7);
  same_b.noisy = true;
  write_folder(b, meta_json(config, "c0ffee", "bbbb2222", "AMD EPYC"),
               {ok_row(kSlower, "tiled", scaled(kBase, 2.0), 2.5e-7), same_b,
                ok_row(kFaster, "linear", scaled(kBase, 0.8), 0.5), ok_row(kOnlyB, "tiled", kBase, 2.0e-7),
                skipped_row(kSkippedB, "naive", "needs 9.000 GiB, over the memory budget of 8.000 GiB"),
                ok_row(kOld, "naive", scaled(kBase, 50.0), 3e-7)});
}

const PointComparison& point(const Comparison& c, const std::string& id) {
  for (const PointComparison& p : c.points)
    if (p.id == id) return p;
  FAIL("no compared point " << id);
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("compare: the Mann-Whitney U p-value matches scipy.stats.mannwhitneyu", "[compare]") {
  std::vector<double> lo50, hi50, lo60, hi60;
  for (int i = 1; i <= 50; ++i) lo50.push_back(i), hi50.push_back(i + 19.5);
  for (int i = 0; i < 60; ++i) lo60.push_back(i), hi60.push_back(i + 30.5);
  const std::vector<ScipyCase> cases = {
      // Fully separated, 5 vs 5: p = 2 / C(10, 5) = 2 / 252.
      {{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, 0, 2.0 / 252, true},
      {{1.1, 2.3, 3.5, 4.2, 5.9, 7.1}, {2.0, 4.0, 6.5, 8.0, 9.3, 10.4, 11.0}, 9, 0.10139860139860139, true},
      {{1, 3, 5, 7}, {2, 4, 6, 8}, 6, 0.6857142857142857, true},
      // 50 vs 50 without ties: still the exact distribution.
      {lo50, hi50, 465, 1.447938962240503e-08, true},
      // Ties: the normal approximation with tie and continuity corrections.
      {{1, 2, 2, 3, 4}, {2, 3, 3, 5, 6, 7}, 6, 0.11390314458853068, false},
      // More than 50 per side: normal, no ties.
      {lo60, hi60, 435, 7.964332670470499e-13, false},
      // Every value tied: no evidence of a difference.
      {{5, 5, 5}, {5, 5, 5}, 4.5, 1.0, false},
  };
  for (const ScipyCase& c : cases) {
    INFO("n1 " << c.x.size() << ", n2 " << c.y.size() << ", U " << c.u);
    const MannWhitney got = mann_whitney_u(c.x, c.y);
    CHECK(got.exact == c.exact);
    CHECK(got.u == c.u);
    CHECK(got.p_value == Approx(c.p).epsilon(1e-9));
    // Two-sided: the same p the other way round, and U of y is n1 n2 - U of x.
    const MannWhitney swapped = mann_whitney_u(c.y, c.x);
    CHECK(swapped.p_value == Approx(got.p_value).epsilon(1e-12));
    CHECK(swapped.u == static_cast<double>(c.x.size() * c.y.size()) - c.u);
  }
}

TEST_CASE("compare: the exact distribution equals enumerating every arrangement", "[compare]") {
  check_against_enumeration(1, 1);
  check_against_enumeration(1, 6);
  check_against_enumeration(3, 4);
  check_against_enumeration(4, 4);
  check_against_enumeration(5, 6);
}

TEST_CASE("compare: percentiles interpolate linearly between closest ranks, as numpy", "[compare]") {
  CHECK(percentile_linear({4, 1, 3, 2}, 0.1) == Approx(1.3));
  CHECK(percentile_linear({4, 1, 3, 2}, 0.5) == Approx(2.5));
  CHECK(percentile_linear({4, 1, 3, 2}, 0.9) == Approx(3.7));
  CHECK(percentile_linear({7}, 0.9) == 7);
}

TEST_CASE("compare: percentiles of the pairwise ratios equal those of every ratio formed", "[compare]") {
  // Unequal sizes, repeated values (equal ratios), a zero in b and 1 x 1.
  const std::vector<std::pair<std::vector<double>, std::vector<double>>> cases = {
      {{1.0, 1.5, 0.75, 1.0, 2.0, 0.5, 1.25},
       {2.0, 0.0, 1.0, 3.0, 1.0, 0.5, 2.5, 1.5, 2.0, 0.25, 4.0, 1.0, 0.75}},
      {kBase, scaled(kBase, 2.0)},
      {{3.0}, {1.5}},
  };
  for (const auto& [a, b] : cases) {
    std::vector<double> ratios;
    for (double x : a)
      for (double y : b) ratios.push_back(y / x);
    for (double q : {0.0, 0.1, 0.25, 0.5, 0.9, 1.0}) {
      INFO("n1 " << a.size() << ", n2 " << b.size() << ", q " << q);
      CHECK(pairwise_ratio_percentile(a, b, q) == Approx(percentile_linear(ratios, q)).epsilon(1e-15));
    }
  }
}

TEST_CASE("compare: a 2x slowdown is significant, an unchanged point is not, one-sided points are listed",
          "[compare]") {
  ScratchDir dir("compare");
  write_pair(dir.path() / "a", dir.path() / "b");
  const Comparison c =
      compare_results(load_results_folder(dir.file("a"), "A"), load_results_folder(dir.file("b"), "B"));

  REQUIRE(c.points.size() == 4);
  const PointComparison& slower = point(c, kSlower);
  CHECK(slower.ratio.value() == Approx(2.0).epsilon(1e-12));
  CHECK(slower.p_value.value() < 0.01);
  CHECK(slower.p_value.value() == Approx(2.0 / 48620).epsilon(1e-9));  // 9 vs 9 separated: 2 / C(18, 9)
  CHECK(slower.p_method == "exact");
  CHECK(slower.u.value() == 0);
  CHECK(slower.verdict == "slower");
  // numpy.percentile of the 81 ratios 2 b / a: 1.9507..., 2.0505...
  CHECK(slower.ratio_p10.value() == Approx(1.9507389162561577).epsilon(1e-12));
  CHECK(slower.ratio_p90.value() == Approx(2.05050505050505).epsilon(1e-12));
  CHECK(slower.max_abs_err_diff.value() == Approx(0.5e-7));

  const PointComparison& same = point(c, kSame);
  CHECK(same.ratio.value() == Approx(1.0).epsilon(0.01));
  CHECK(same.p_value.value() > 0.05);
  CHECK(same.verdict == "not significant");
  CHECK(same.noisy_b);
  CHECK(!same.noisy_a);
  CHECK_THAT(join(same.notes), Contains("noisy in B"));

  const PointComparison& faster = point(c, kFaster);
  CHECK(faster.ratio.value() == Approx(0.8));
  CHECK(faster.p_value.value() < 0.01);
  CHECK(faster.verdict == "faster");

  const PointComparison& old = point(c, kOld);
  CHECK(!old.p_value);
  CHECK(old.verdict == "no p-value");
  CHECK(old.ratio.value() == Approx(1.0));  // 50 ms recorded in A, the median of 50 x kBase in B
  CHECK_THAT(join(old.notes), Contains("A has no time_ms.samples"));

  CHECK(c.only_a == std::vector<std::string>{kOnlyA});
  CHECK(c.only_b == std::vector<std::string>{kOnlyB});
  REQUIRE(c.not_compared.size() == 1);
  CHECK(c.not_compared[0].id == kSkippedB);
  CHECK(c.not_compared[0].status_a == "ok");
  CHECK(c.not_compared[0].status_b == "skipped");
  CHECK_THAT(c.not_compared[0].reason_b, Contains("memory budget"));

  // The header: the commit differs; the config, CPU and the rows' isa and threads are the same.
  CHECK(c.config_same);
  CHECK(c.config_keys_differ.empty());
  REQUIRE(c.differences.size() == 1);
  CHECK(c.differences[0].field == "system.git_commit");
  CHECK(c.differences[0].a == "aaaa1111");
  CHECK(c.differences[0].b == "bbbb2222");
  std::vector<std::string> same_fields;
  for (const MetaField& f : c.same) same_fields.push_back(f.field);
  for (const char* f : {"config_hash", "system.cpu_model", "isa_option", "rows.isa", "rows.threads"})
    CHECK(std::find(same_fields.begin(), same_fields.end(), f) != same_fields.end());
  for (const char* f : {"start_time", "end_time", "interrupted"})
    CHECK(std::find(c.meta_not_compared.begin(), c.meta_not_compared.end(), f) != c.meta_not_compared.end());

  CHECK(regressions(c, 1.5).size() == 1);
  CHECK(regressions(c, 3).empty());
  const std::string md = comparison_markdown(c, 1.5);
  CHECK_THAT(md, Contains("| `" + kSlower + "` | 1 | 2 | 2.000 | 1.951–2.051 | 4.1e-05 | **slower** |"));
  CHECK_THAT(md, Contains("## Only in A (1)\n\n- `" + kOnlyA + "`"));
  CHECK_THAT(md, Contains("## Only in B (1)\n\n- `" + kOnlyB + "`"));
  CHECK_THAT(md, Contains("| `" + kSkippedB + "` | ok | skipped: needs 9.000 GiB"));
  CHECK_THAT(md, Contains("| `system.git_commit` | aaaa1111 | bbbb2222 |"));
  CHECK_THAT(md, Contains("- FAILED `" + kSlower + "`"));
}

// A row of results.mla.jsonl as `attnbench mla --sweep` writes it (the fields compare reads, and a few more).
Json mla_line(const std::string& form, int64_t context, const std::vector<double>& samples) {
  return {{"kind", "mla"},
          {"config", "cmp"},
          {"form", form},
          {"gqa", form == "gqa" ? Json{{"kv_heads", 8}, {"head_dim", 128}} : Json(nullptr)},
          {"preset", "deepseek_v2_lite"},
          {"shape", {{"d_model", 2048}, {"heads", 16}}},
          {"batch", 1},
          {"context", context},
          {"new_tokens", 1},
          {"variant", "tiled"},
          {"threads", 2},
          {"fma_peak", {{"gflops", 200.0}, {"isa", "avx3"}, {"threads", 2}}},
          {"median_ms", percentile_linear(samples, 0.5)},
          {"samples_ms", samples}};
}

TEST_CASE("compare: the MLA layer rows and the PyTorch peer rows beside results.jsonl are compared too",
          "[compare]") {
  ScratchDir dir("compare");
  write_pair(dir.path() / "a", dir.path() / "b");
  const std::string absorbed = "mla/absorbed:deepseek_v2_lite,B=1,T=4096,new=1,core=tiled,threads=2";
  const std::string gqa = "mla/gqa(kv=8,D=128):deepseek_v2_lite,B=1,T=4096,new=1,core=tiled,threads=2";
  const std::string naive_b = "mla/naive:deepseek_v2_lite,B=1,T=8192,new=1,core=tiled,threads=2";
  write_text(dir.path() / "a" / "results.mla.jsonl",
             mla_line("absorbed", 4096, kBase).dump() + "\n" + mla_line("gqa", 4096, kBase).dump() + "\n");
  write_text(dir.path() / "b" / "results.mla.jsonl", mla_line("absorbed", 4096, scaled(kBase, 2.0)).dump() +
                                                         "\n\n" + mla_line("gqa", 4096, kBaseAgain).dump() +
                                                         "\n" + mla_line("naive", 8192, kBase).dump() + "\n");
  const std::string peer = "peer/torch_sdpa:B=1,H=8,Lq=1024,Lkv=1024,D=64,gaussian(std=1),T=2";
  write_text(dir.path() / "a" / "results.peers.jsonl",
             to_json(ok_row(peer, "peer/torch_sdpa", kBase, 1e-7)).dump() + "\n");
  write_text(dir.path() / "b" / "results.peers.jsonl",
             to_json(ok_row(peer, "peer/torch_sdpa", scaled(kBase, 0.8), 1e-7)).dump() + "\n");
  const Comparison c =
      compare_results(load_results_folder(dir.file("a"), "A"), load_results_folder(dir.file("b"), "B"));
  CHECK(c.points.size() == 4 + 3);
  CHECK(point(c, absorbed).verdict == "slower");
  CHECK(point(c, absorbed).ratio.value() == Approx(2.0).epsilon(1e-12));
  CHECK(point(c, absorbed).isa_a == "avx3");
  CHECK(point(c, gqa).verdict == "not significant");
  CHECK(point(c, peer).verdict == "faster");
  CHECK(std::find(c.only_b.begin(), c.only_b.end(), naive_b) != c.only_b.end());
  CHECK(regressions(c, 1.5).size() == 2);  // the sweep's 2x point and the MLA one

  // A line that is not an MLA row: an error naming the file and line.
  write_text(dir.path() / "b" / "results.mla.jsonl",
             mla_line("absorbed", 4096, kBase).dump() + "\n{\"kind\": \"mla\", \"form\": 3}\n");
  try {
    (void)load_results_folder(dir.file("b"), "B");
    FAIL("a bad MLA row was accepted");
  } catch (const UsageError& e) {
    CHECK_THAT(e.what(),
               Contains("file '" + dir.file("b") + "/results.mla.jsonl' line 2: a field is missing"));
  }
  write_text(dir.path() / "b" / "results.mla.jsonl", "{\"kind\": \"peer\"}\n");
  CHECK_THROWS_WITH(load_results_folder(dir.file("b"), "B"),
                    Contains("line 1: not a JSON object with \"kind\": \"mla\""));
}

TEST_CASE("compare: mismatched configs, CPUs and --isa are explained and still matched", "[compare]") {
  ScratchDir dir("compare");
  // A: run with --isa avx2 (every id ends in ",isa=avx2"); B: another measure section, another CPU, --isa
  // avx3.
  const Json config_a = config_json(kMeasure), config_b = config_json({{"min_reps", 20}, {"max_reps", 40}});
  Json config_b2 = config_b;
  config_b2["description"] = "more repetitions";
  write_folder(dir.path() / "a", meta_json(config_a, "1111", "abc", "AMD EPYC", "avx2"),
               {ok_row(kSlower + ",isa=avx2", "tiled", kBase, 2e-7, "avx2")});
  write_folder(dir.path() / "b", meta_json(config_b2, "2222", "abc", "Intel Xeon", "avx3"),
               {ok_row(kSlower + ",isa=avx3", "tiled", scaled(kBase, 0.5), 2e-7, "avx3")});
  const Comparison c =
      compare_results(load_results_folder(dir.file("a"), "A"), load_results_folder(dir.file("b"), "B"));
  CHECK(!c.config_same);
  CHECK(c.config_keys_differ == std::vector<std::string>{"description", "measure"});
  std::vector<std::string> differ;
  for (const MetaField& f : c.differences) differ.push_back(f.field);
  CHECK(differ == std::vector<std::string>{"config_hash", "isa_option", "rows.isa", "system.cpu_model"});
  REQUIRE(c.points.size() == 1);
  CHECK(c.points[0].id == kSlower);
  CHECK(c.points[0].id_a == kSlower + ",isa=avx2");
  CHECK(c.points[0].id_b == kSlower + ",isa=avx3");
  CHECK(c.points[0].verdict == "faster");
  CHECK(c.only_a.empty());
  CHECK(c.only_b.empty());
  const std::string md = comparison_markdown(c, std::nullopt);
  CHECK_THAT(md, Contains("different (hash 1111 vs 2222); top-level keys whose values differ: `description`, "
                          "`measure`"));
  CHECK_THAT(md, Contains("| `system.cpu_model` | AMD EPYC | Intel Xeon |"));

  // A config with sweep.isa keeps the suffix: its ids differ by target within the folder.
  Json axis = config_a;
  axis["sweep"]["isa"] = {"avx2"};
  write_folder(dir.path() / "c", meta_json(axis, "3333", "abc", "AMD EPYC", "best"),
               {ok_row(kSlower + ",isa=avx2", "tiled", kBase, 2e-7, "avx2")});
  const Comparison axis_c =
      compare_results(load_results_folder(dir.file("c"), "A"), load_results_folder(dir.file("b"), "B"));
  CHECK(axis_c.points.empty());
  CHECK(axis_c.only_a == std::vector<std::string>{kSlower + ",isa=avx2"});
  CHECK(axis_c.only_b == std::vector<std::string>{kSlower + ",isa=avx3"});
}

TEST_CASE("compare: fewer than 2 repetitions give no p-value, with a note", "[compare]") {
  ScratchDir dir("compare");
  const Json meta = meta_json(config_json(kMeasure), "1", "abc", "AMD EPYC");
  write_folder(dir.path() / "a", meta, {ok_row(kSlower, "tiled", {1.0}, 2e-7)});
  write_folder(dir.path() / "b", meta, {ok_row(kSlower, "tiled", kBase, 2e-7)});
  const Comparison c =
      compare_results(load_results_folder(dir.file("a"), "A"), load_results_folder(dir.file("b"), "B"));
  REQUIRE(c.points.size() == 1);
  CHECK(!c.points[0].p_value);
  CHECK(c.points[0].ratio.value() == Approx(1.0));
  CHECK_THAT(join(c.points[0].notes), Contains("fewer than 2 repetitions (A 1, B 9)"));
  const Json j = comparison_json(c, std::nullopt);
  CHECK(j["points"][0]["p_value"].is_null());
  CHECK(j["points"][0]["p_method"].is_null());
}

TEST_CASE("compare: quality rows (a task block) show what each side learned beside the step times",
          "[compare]") {
  ScratchDir dir("compare");
  const Json meta = meta_json(config_json(kMeasure), "1", "abc", "AMD EPYC");
  const std::string id = "mqar:tiled:L=128,kv=8,V=512,d_model=64,layers=2,heads=1,lr=0.001,conv=0,seed=1";
  const auto trained = [&](const std::vector<double>& steps_ms, double accuracy, bool converged) {
    ResultRow r = ok_row(id, "tiled", steps_ms, 0);
    r.task.emplace();
    r.task->name = "mqar";
    r.task->best_accuracy = accuracy;
    r.task->best_loss = 0.05;
    r.task->steps = static_cast<int64_t>(steps_ms.size());
    r.task->converged = converged;
    return r;
  };
  write_folder(dir.path() / "a", meta, {trained(kBase, 0.995, true)});
  write_folder(dir.path() / "b", meta, {trained(scaled(kBaseAgain, 2), 0.71, false)});
  const Comparison c =
      compare_results(load_results_folder(dir.file("a"), "A"), load_results_folder(dir.file("b"), "B"));
  REQUIRE(c.points.size() == 1);
  CHECK(c.points[0].verdict == "slower");  // the training steps' times, as for any row
  const Json j = comparison_json(c, std::nullopt)["points"][0];
  CHECK(j["task_a"]["accuracy"] == 0.995);
  CHECK(j["task_b"]["accuracy"] == 0.71);
  CHECK(j["task_b"]["converged"] == false);
  const std::string md = comparison_markdown(c, std::nullopt);
  CHECK_THAT(md, Contains("## What the points learned (quality rows)"));
  CHECK_THAT(md, Contains("| 0.9950 | 0.7100 |"));
  CHECK_THAT(md, Contains("9 (not converged)"));
  // Sweep rows have no task block: no such section.
  write_folder(dir.path() / "c", meta, {ok_row(id, "tiled", kBase, 0)});
  const Comparison plain =
      compare_results(load_results_folder(dir.file("c"), "A"), load_results_folder(dir.file("c"), "B"));
  CHECK(comparison_json(plain, std::nullopt)["points"][0]["task_a"].is_null());
  CHECK(comparison_markdown(plain, std::nullopt).find("What the points learned") == std::string::npos);
}

TEST_CASE("attnbench compare: Markdown, --json, --fail-above and exit codes", "[compare][cli]") {
  ScratchDir dir("compare");
  write_pair(dir.path() / "a", dir.path() / "b");
  const std::string a = dir.file("a"), b = dir.file("b");

  const ProcResult md = run_attnbench({"compare", a, b}, dir.path());
  REQUIRE(md.code == 0);
  CHECK_THAT(md.out, Contains("| `" + kSlower + "` | 1 | 2 | 2.000 |"));
  CHECK_THAT(md.out, Contains("**slower**"));
  CHECK_THAT(md.out, Contains("**faster**"));

  const ProcResult js = run_attnbench({"compare", a, b, "--json"}, dir.path());
  REQUIRE(js.code == 0);
  Json j;
  REQUIRE_NOTHROW(j = Json::parse(js.out));
  CHECK(j["points"].size() == 4);
  CHECK(j["only_a"] == Json::array({kOnlyA}));
  CHECK(j["only_b"] == Json::array({kOnlyB}));
  CHECK(j["not_compared"][0]["id"] == kSkippedB);
  CHECK(j["summary"]["slower"] == 1);
  CHECK(j["summary"]["faster"] == 1);
  CHECK(j["summary"]["no_p_value"] == 1);
  CHECK(j["header"]["differences"][0]["field"] == "system.git_commit");
  CHECK(j["fail_above"].is_null());
  const Json& p0 = j["points"][0];
  CHECK(p0["id"] == kSlower);
  CHECK(p0["ratio"].get<double>() == Approx(2.0));
  CHECK(p0["p_value"].get<double>() < 0.01);
  CHECK(p0["significant"] == true);
  CHECK(p0["verdict"] == "slower");

  // The regression gate: the 2x point trips 1.5, not 3; --json stays one document either way.
  const ProcResult gate = run_attnbench({"compare", a, b, "--fail-above", "1.5"}, dir.path());
  CHECK(gate.code == 1);
  CHECK_THAT(gate.err, Contains("--fail-above 1.5"));
  CHECK_THAT(gate.err, Contains(kSlower));
  CHECK_THAT(gate.out, Contains("- FAILED `" + kSlower + "`"));
  const ProcResult gate_json = run_attnbench({"compare", a, b, "--json", "--fail-above", "1.5"}, dir.path());
  CHECK(gate_json.code == 1);
  REQUIRE_NOTHROW(j = Json::parse(gate_json.out));
  CHECK(j["fail_above"]["threshold"] == 1.5);
  CHECK(j["fail_above"]["tripped"][0]["id"] == kSlower);
  const ProcResult pass = run_attnbench({"compare", a, b, "--fail-above", "3"}, dir.path());
  CHECK(pass.code == 0);
  CHECK_THAT(pass.out, Contains("Passed: no point is significantly slower than 3x"));

  // Bad R: exit 2, the option, the value and what is allowed.
  for (const std::string bad : {"1", "0.5", "-2", "abc", "2x", "", "nan", "inf"}) {
    const ProcResult r = run_attnbench({"compare", a, b, "--fail-above", bad}, dir.path());
    INFO("--fail-above '" << bad << "'");
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains("--fail-above"));
    CHECK_THAT(r.err, Contains("greater than 1"));
    CHECK(r.out.empty());
  }
}

TEST_CASE("attnbench compare: bad folders exit 2 naming the folder or file", "[compare][cli]") {
  ScratchDir dir("compare");
  write_pair(dir.path() / "a", dir.path() / "b");
  const std::string a = dir.file("a");

  const ProcResult missing = run_attnbench({"compare", a, dir.file("nope")}, dir.path());
  CHECK(missing.code == 2);
  CHECK_THAT(missing.err, Contains("results folder B '" + dir.file("nope") + "' does not exist"));

  fs::create_directories(dir.path() / "empty");
  const ProcResult empty = run_attnbench({"compare", dir.file("empty"), a}, dir.path());
  CHECK(empty.code == 2);
  CHECK_THAT(empty.err, Contains("results folder A '" + dir.file("empty") + "' has no results.jsonl"));

  fs::create_directories(dir.path() / "badmeta");
  write_text(dir.path() / "badmeta" / "results.jsonl", "");
  write_text(dir.path() / "badmeta" / "meta.json", "{\"config\": ");
  const ProcResult bad_meta = run_attnbench({"compare", a, dir.file("badmeta")}, dir.path());
  CHECK(bad_meta.code == 2);
  CHECK_THAT(bad_meta.err, Contains("file '" + dir.file("badmeta") + "/meta.json' is not valid JSON"));

  fs::create_directories(dir.path() / "badrows");
  fs::copy_file(dir.path() / "a" / "meta.json", dir.path() / "badrows" / "meta.json");
  write_text(dir.path() / "badrows" / "results.jsonl",
             "{not json\n" + slurp(dir.path() / "a" / "results.jsonl"));
  const ProcResult bad_rows = run_attnbench({"compare", dir.file("badrows"), a}, dir.path());
  CHECK(bad_rows.code == 2);
  CHECK_THAT(bad_rows.err, Contains("file '" + dir.file("badrows") + "/results.jsonl': line 1"));

  const ProcResult one = run_attnbench({"compare", a}, dir.path());
  CHECK(one.code == 2);
}
