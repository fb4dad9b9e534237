// Determinism: the same config and seed give the same results across runs and across thread counts.
//  * Sweeps (every registered variant, with its defaults and with each of its test parameter sets; both input
//    regimes, masks, dropout, cross-attention), run twice with threads [1, 2]:
//    every row field is identical except the ones listed in kRunVolatile (timing, the sgemm-relative speed,
//    the resident-memory peak, the timestamp); a point at 1 and at 2 threads differs only in those, its id
//    and threads, and the per-thread workspace estimate (kThreadDependent). meta.json differs only in its
//    times and calibrations (kMetaVolatile).
//  * `attnbench eval` for every registered variant and each of its test parameter sets, with and without
//    masks and dropout: output .npy files bitwise equal across runs and across --threads 1 and 2, and the
//    --compare figures identical.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/lib/plan.hpp"
#include "common/interface/attention.hpp"
#include "common/io/npy.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"
#include "tests/support/attention_case.hpp"
#include "tests/support/process.hpp"

using namespace attn;
using namespace attn::test;

namespace {

// Row fields that may differ between two runs of one config (JSON pointers). Everything else must match.
const std::vector<std::string> kRunVolatile = {
    "/time_ms",            // wall-clock timing, its repetitions, samples and interval
    "/interference",       // what else ran on the machine meanwhile
    "/attempts",           // re-measurements after interference
    "/noisy",              // whether every attempt saw interference
    "/calibration",        // which calibration ran clean depends on interference too
    "/interleave",         // the timed rounds depend on timing; the place in the group on the thread count
    "/gflops",             // flops / measured time
    "/frac_sgemm",         // gflops over the sgemm calibration, itself a timing
    "/frac_peak",          // gflops over the in-run peak-FLOP calibration, a timing too
    "/gbytes_per_s",       // bytes / measured time
    "/frac_bandwidth",     // gbytes_per_s over the in-run memory-bandwidth calibration, a timing too
    "/group_bandwidth",    // the streaming read timed in the group's rounds (measure.group_bandwidth)
    "/memory/peak_bytes",  // resident-memory high-water mark: page-level, depends on the allocator's state
    "/timestamp",          // when the row was written
    "/phase_ms",           // a variant's per-phase wall times (dsa), timings too
};
// meta.json fields that may differ between two runs: when they ran, and the in-run calibrations (timings).
const std::vector<std::string> kMetaVolatile = {"/start_time", "/end_time",         "/sgemm_calibration",
                                                "/fma_peak",   "/memory_bandwidth", "/calibrations"};
// Fields that also differ between the same point at 1 and at 2 threads.
const std::vector<std::string> kThreadDependent = {
    "/id",                      // ends in ",T=<threads>"
    "/threads",                 // the thread count itself
    "/memory/workspace_bytes",  // variants with per-thread scratch (tiled, sliding_window, causal linear)
    "/memory/estimated_bytes",  // output + workspace
};

Json without(Json row, const std::vector<std::string>& pointers) {
  for (const auto& p : pointers) {
    const Json::json_pointer ptr(p);
    if (row.contains(ptr)) row[ptr.parent_pointer()].erase(ptr.back());
  }
  return row;
}

std::vector<Json> read_rows(const fs::path& jsonl) {
  std::vector<Json> rows;
  std::istringstream in(slurp(jsonl));
  for (std::string line; std::getline(in, line);) rows.push_back(Json::parse(line));
  return rows;
}

std::map<std::string, Json> by_id(const std::vector<Json>& rows) {
  std::map<std::string, Json> m;
  for (const Json& r : rows) m[r.at("id").get<std::string>()] = r;
  return m;
}

// Sweeps a config twice (separate output folders) and checks rows across runs and across thread counts.
void check_sweep_determinism(const Json& config, const ScratchDir& dir) {
  const std::string cfg = dir.file(config.at("name").get<std::string>() + ".json");
  write_text(cfg, config.dump(2) + "\n");
  const SweepConfig parsed = load_sweep_config(cfg);
  std::map<std::string, SweepPoint> points;
  for (const SweepPoint& pt : make_plan(parsed).points) points[pt.id] = pt;

  std::vector<std::map<std::string, Json>> runs;
  std::vector<Json> metas;
  for (const char* out : {"run1", "run2"}) {
    const ProcResult r = run_attnbench({"run", cfg, "--out", dir.file(out), "--plain"}, dir.path());
    INFO("exit " << r.code << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
    REQUIRE(r.code == 0);
    runs.push_back(by_id(read_rows(dir.path() / out / "results.jsonl")));
    REQUIRE(runs.back().size() == points.size());
    metas.push_back(without(Json::parse(slurp(dir.path() / out / "meta.json")), kMetaVolatile));
  }
  CHECK(metas[0].dump() == metas[1].dump());

  int ok = 0, compared_threads = 0;
  for (const auto& [id, first] : runs[0]) {
    INFO(id);
    REQUIRE(runs[1].count(id) == 1);
    const Json& second = runs[1].at(id);
    // Across runs: identical but for the volatile fields.
    CHECK(without(first, kRunVolatile).dump() == without(second, kRunVolatile).dump());
    ok += first.at("status") == "ok";
    if (first.at("status") == "ok") {  // the volatile fields exist and are measurements, not placeholders
      CHECK(first.at("time_ms").at("median").is_number());
      CHECK(first.at("gflops").is_number());
    }
    // The workspace estimate is the variant's own for the point's thread count.
    const SweepPoint& pt = points.at(id);
    CHECK(first.at("memory").at("workspace_bytes") ==
          Registry::instance().get(pt.problem.variant).workspace_bytes(pt.problem, pt.threads));
    // Across threads: the same point at T=1 and T=2 differs only in the thread-dependent fields.
    const std::string suffix = ",T=1";
    if (id.size() > suffix.size() && id.compare(id.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string id2 = id.substr(0, id.size() - 1) + "2";
      if (runs[0].count(id2)) {
        ++compared_threads;
        std::vector<std::string> volatile_fields = kRunVolatile;
        volatile_fields.insert(volatile_fields.end(), kThreadDependent.begin(), kThreadDependent.end());
        CHECK(without(first, volatile_fields).dump() == without(runs[0].at(id2), volatile_fields).dump());
        CHECK(runs[0].at(id2).at("threads") == 2);
      }
    }
  }
  CHECK(ok > 0);
  if (available_threads() >= 2) CHECK(compared_threads * 2 == static_cast<int>(points.size()));
}

// Correctness sweeps: no re-measuring under the interference of tests running beside them, and no
// recalibration (tests/test_interference.cpp covers both).
Json fast_measure() {
  return {{"warmup", 0},     {"min_reps", 1},         {"max_reps", 2},       {"min_time_s", 0},
          {"max_time_s", 1}, {"max_interference", 1}, {"calibrate_every", 0}};
}

Json thread_axis() {
  return available_threads() >= 2 ? Json::array({1, 2}) : Json::array({1});
}

// The sweep's variants: every registered variant once per parameter set of its test_param_sets() (the small
// values that force its tiles, chunks, bands and globals), each value as an axis of one value (a bare list
// would be an axis of counts for a list-typed parameter such as global_tokens). Different sets give different
// point ids, so a variant may appear several times.
Json test_param_variants() {
  Json variants = Json::array();
  for (const Attention* v : Registry::instance().all())
    for (const Json& set : v->test_param_sets()) {
      Json params = Json::object();
      for (auto it = set.begin(); it != set.end(); ++it) params[it.key()] = Json::array({it.value()});
      variants.push_back({{"name", v->name()}, {"params", params}});
    }
  return variants;
}

}  // namespace

TEST_CASE("sweep: identical rows across runs and thread counts, only timing fields differ", "[determinism]") {
  ScratchDir dir("determinism-sweep");
  write_text(dir.path() / "text.txt",
             "the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat and the bird "
             "sings a song of the morning to the sleepy town below the hill\n");
  SECTION("every variant, gaussian and tokens inputs, masks, full and sampled references") {
    const Json config = {
        {"name", "det"},
        {"variants", "all"},
        {"sweep",
         {{"batch", 2},
          {"heads", 2},
          {"head_dim", 24},
          {"seq_len", {33, 100}},
          {"mask", {"none", "causal+pad=0.25"}},
          {"threads", thread_axis()}}},
        {"inputs",
         Json::parse(R"([{"regime": "gaussian", "std": [1, 3]}, {"regime": "tokens", "text": "text.txt"}])")},
        {"measure", fast_measure()},
        {"accuracy", {{"reference", "auto"}, {"rows", 40}}},  // 33: full, 100: 40 sampled rows
        {"memory_budget", "1GiB"},
        {"seed", 11}};
    check_sweep_determinism(config, dir);
  }
  SECTION("dropout, cross-attention and every variant's test parameter sets") {
    const Json config = {{"name", "det_dropout"},
                         {"variants", test_param_variants()},
                         {"sweep",
                          {{"batch", 1},
                           {"heads", 3},
                           {"head_dim", 16},
                           {"seq_q", {48, 70}},
                           {"seq_kv", {70}},
                           {"mask", "causal"},
                           {"dropout", 0.2},
                           {"threads", thread_axis()}}},
                         {"measure", fast_measure()},
                         {"accuracy", {{"reference", "full"}}},
                         {"memory_budget", "1GiB"},
                         {"seed", 5}};
    check_sweep_determinism(config, dir);
  }
}

TEST_CASE("eval: every variant's output is bitwise identical across runs and at 1 and 2 threads",
          "[determinism]") {
  ScratchDir dir("determinism-eval");
  const int64_t B = 2, H = 3, L = 75, D = 20;
  AttentionCase inputs(make_test_problem("naive", B, H, L, L, D), 31, 1.5);
  inputs.pad_keys([&](int64_t b, int64_t j) { return b == 1 && j >= L - 9; });  // batch 1 pads 9 keys
  inputs.random_mask(34, 0.8);
  const CaseFiles files = inputs.write_files(dir);
  const std::string qp = files.q, kp = files.k, vp = files.v, padp = files.pad, maskp = files.mask;
  // A recurrence's inputs (eval --g, --beta, --initial-state): g = logsigmoid(N(0, 1)) per token or per key
  // channel, beta = sigmoid(N(0, 1)), an N(0, 1/4) initial state; an indexer's inputs N(0, 1) (kind 3).
  auto drawn = [&](const std::string& name, std::vector<int64_t> shape, uint64_t seed, int kind) {
    FloatArray x(std::move(shape));
    fill_normal(x.ptr(), static_cast<int64_t>(x.numel()), seed, kind == 2 ? 0.5 : 1.0);
    for (float& e : x.data)
      if (kind == 0)
        e = static_cast<float>(-std::log1p(std::exp(-static_cast<double>(e))));
      else if (kind == 1)
        e = static_cast<float>(1 / (1 + std::exp(-static_cast<double>(e))));
    write_npy(dir.file(name), x);
    return dir.file(name);
  };
  const std::string gp = drawn("g.npy", {B, H, L}, 41, 0), gvp = drawn("g_vector.npy", {B, H, L, D}, 42, 0),
                    betap = drawn("beta.npy", {B, H, L}, 43, 1), s0p = drawn("s0.npy", {B, H, D, D}, 44, 2);

  int runs = 0;
  for (const Attention* variant : Registry::instance().all()) {
    const Capabilities caps = variant->capabilities();
    // A recurrence reads its g, beta and an initial state, and needs a causal mask: --causal unmasked,
    // --causal-lower-right (the same mask at seq_q == seq_kv) masked.
    const bool recurrence = caps.state || caps.gate != Gate::none || caps.beta;
    std::vector<std::string> extra;
    if (caps.gate != Gate::none) extra.insert(extra.end(), {"--g", caps.gate == Gate::vector ? gvp : gp});
    if (caps.beta) extra.insert(extra.end(), {"--beta", betap});
    if (caps.state) extra.insert(extra.end(), {"--initial-state", s0p});
    for (const Json& params : variant->test_param_sets()) {
      std::vector<std::string> index_args;  // an indexer's index inputs, sized by this parameter set
      if (caps.indexer) {
        const IndexerShape ix(make_problem(variant->name(), params));
        index_args = {"--index-q", drawn("index_q.npy", {B, L, ix.heads, ix.dim}, 45, 3),
                      "--index-k", drawn("index_k.npy", {B, L, ix.dim}, 46, 3),
                      "--index-w", drawn("index_w.npy", {B, L, ix.heads}, 47, 3)};
      }
      for (const bool masked : {false, true}) {
        std::vector<std::string> args{"eval", "--variant", variant->name(), "--q", qp,
                                      "--k",  kp,          "--v",           vp,    "--compare"};
        args.insert(args.end(), extra.begin(), extra.end());
        args.insert(args.end(), index_args.begin(), index_args.end());
        if (recurrence) args.push_back(masked ? "--causal-lower-right" : "--causal");
        for (auto it = params.begin(); it != params.end(); ++it)
          args.insert(args.end(), {"--param", it.key() + "=" + param_value_text(it.value())});
        if (masked) {
          if (caps.causal && !recurrence) args.push_back("--causal");
          if (caps.key_padding) args.insert(args.end(), {"--key-padding", padp});
          if (caps.boolean_mask) args.insert(args.end(), {"--mask", maskp});
          if (caps.dropout) args.insert(args.end(), {"--dropout", "0.15", "--seed", "9"});
        }
        std::string first_json, first_out;
        int i = 0;
        for (const char* threads : {"1", "1", "2"}) {
          std::vector<std::string> a{"--threads", threads};
          a.insert(a.end(), args.begin(), args.end());
          const std::string out = dir.file("o" + std::to_string(i++) + ".npy");
          a.insert(a.end(), {"--out", out});
          const ProcResult r = run_attnbench(a, dir.path());
          INFO(variant->name() << " " << params.dump() << (masked ? " masked" : "") << " --threads "
                               << threads << "\nstderr: " << r.err);
          REQUIRE(r.code == 0);
          ++runs;
          const std::string bytes = slurp(out);
          REQUIRE(bytes.size() > 128);
          if (first_out.empty()) {
            first_out = bytes, first_json = r.out;
            CHECK(Json::parse(r.out).at("nan_count") == 0);
          } else {
            CHECK(bytes == first_out);
            CHECK(r.out == first_json);
          }
        }
      }
    }
  }
  CHECK(runs >= 3 * 2 * static_cast<int>(Registry::instance().all().size()));
}
