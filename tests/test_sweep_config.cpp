// Sweep config schema: every validation rule (error text names the JSON path, what is allowed and the value),
// plan expansion counts and ordering, byte sizes, and file-level errors of load_sweep_config.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "bench/lib/inputs.hpp"
#include "bench/lib/plan.hpp"
#include "bench/lib/rows.hpp"
#include "common/interface/attention.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/error.hpp"
#include "common/support/runtime.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace attn;
using attn::test::ScratchDir;
using Catch::Matchers::Contains;

namespace {

// A minimal valid config; each test changes one thing so the error it expects is the only one.
Json base_config() {
  return Json::parse(R"({
    "name": "t",
    "variants": ["naive"],
    "sweep": {"batch": 1, "heads": 1, "head_dim": 16, "seq_len": [16, 32], "threads": 1},
    "measure": {"warmup": 0, "min_reps": 1, "max_reps": 2, "min_time_s": 0, "max_time_s": 1},
    "memory_budget": "1GiB"
  })");
}

// The UsageError text parsing `j` and making its plan for this machine throws (the test fails if it throws
// nothing or another type).
std::string config_error(const Json& j, const std::string& source = "/nonexistent/dir/cfg.json") {
  try {
    (void)make_plan(parse_sweep_config(j, source));
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected a UsageError, got another exception: " << e.what());
  }
  FAIL("expected a UsageError for config " << j.dump());
  return "";
}

}  // namespace

TEST_CASE("the base config used by these tests is valid", "[sweep][config]") {
  const SweepConfig c = parse_sweep_config(base_config(), "cfg.json");
  CHECK(c.name == "t");
  CHECK(c.memory_budget_bytes == (uint64_t{1} << 30));
  CHECK(c.measure.max_reps == 2);
  CHECK(make_plan(c).points.size() == 2);
}

TEST_CASE("unknown keys are rejected with their path and a did-you-mean", "[sweep][config]") {
  SECTION("top level") {
    Json j = base_config();
    j["sweeep"] = j["sweep"];
    j.erase("sweep");
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("sweeep: unknown key 'sweeep'"));
    CHECK_THAT(e, Contains("did you mean 'sweep'?"));
    CHECK_THAT(e, Contains("allowed: "));
  }
  SECTION("in sweep") {
    Json j = base_config();
    j["sweep"]["maks"] = "causal";
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("sweep.maks: unknown key 'maks'"));
    CHECK_THAT(e, Contains("did you mean 'mask'?"));
  }
  SECTION("in measure") {
    Json j = base_config();
    j["measure"]["min_rep"] = 2;
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("measure.min_rep: unknown key 'min_rep'"));
    CHECK_THAT(e, Contains("did you mean 'min_reps'?"));
  }
  SECTION("in accuracy") {
    Json j = base_config();
    j["accuracy"] = {{"refrence", "full"}};
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("accuracy.refrence: unknown key 'refrence'"));
    CHECK_THAT(e, Contains("did you mean 'reference'?"));
  }
}

TEST_CASE("sizes must be positive integers, named by their index", "[sweep][config]") {
  SECTION("negative value in a list") {
    Json j = base_config();
    j["sweep"]["seq_len"] = {64, 128, -5};
    CHECK(config_error(j) == "sweep.seq_len[2]: must be a positive integer, got -5");
  }
  SECTION("zero as a single value") {
    Json j = base_config();
    j["sweep"]["heads"] = 0;
    CHECK(config_error(j) == "sweep.heads: must be a positive integer, got 0");
  }
  SECTION("fractional value") {
    Json j = base_config();
    j["sweep"]["head_dim"] = {16, 1.5};
    CHECK(config_error(j) == "sweep.head_dim[1]: must be a positive integer, got 1.5");
  }
}

TEST_CASE("a string where a number is expected names the path and shows the string", "[sweep][config]") {
  SECTION("size axis") {
    Json j = base_config();
    j["sweep"]["batch"] = "2";
    CHECK(config_error(j) == "sweep.batch: must be a positive integer, got \"2\"");
  }
  SECTION("measure setting") {
    Json j = base_config();
    j["measure"]["min_time_s"] = "0.1";
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("measure.min_time_s: must be seconds in [0, 3600]"));
    CHECK_THAT(e, Contains("got \"0.1\""));
  }
}

TEST_CASE("an empty axis list is rejected", "[sweep][config]") {
  Json j = base_config();
  j["sweep"]["heads"] = Json::array();
  CHECK(config_error(j) == "sweep.heads: must not be an empty list");
}

TEST_CASE("sequence lengths: seq_len or seq_q with seq_kv", "[sweep][config]") {
  SECTION("seq_len together with seq_q") {
    Json j = base_config();
    j["sweep"]["seq_q"] = 16;
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("sweep.seq_len: give either seq_len"));
    CHECK_THAT(e, Contains("not both"));
  }
  SECTION("seq_q without seq_kv") {
    Json j = base_config();
    j["sweep"].erase("seq_len");
    j["sweep"]["seq_q"] = {16, 32};
    CHECK_THAT(config_error(j), Contains("sweep.seq_kv: missing: seq_q and seq_kv go together"));
  }
  SECTION("seq_kv without seq_q") {
    Json j = base_config();
    j["sweep"].erase("seq_len");
    j["sweep"]["seq_kv"] = 16;
    CHECK_THAT(config_error(j), Contains("sweep.seq_q: missing: seq_q and seq_kv go together"));
  }
  SECTION("no lengths at all") {
    Json j = base_config();
    j["sweep"].erase("seq_len");
    CHECK_THAT(config_error(j), Contains("sweep.seq_len: missing"));
  }
}

TEST_CASE("masks: unknown names and padding fractions", "[sweep][config]") {
  SECTION("unknown mask") {
    Json j = base_config();
    j["sweep"]["mask"] = {"none", "casual"};
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("sweep.mask[1]: unknown mask 'casual'"));
    CHECK_THAT(e, Contains("allowed: none, or causal, causal_lower_right, pad"));
  }
  SECTION("pad fraction above 1") {
    Json j = base_config();
    j["sweep"]["mask"] = "causal+pad=1.5";
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("sweep.mask: padding fraction must be in [0, 1]"));
    CHECK_THAT(e, Contains("'1.5'"));
  }
  SECTION("pad fraction that is not a number") {
    Json j = base_config();
    j["sweep"]["mask"] = "pad=half";
    CHECK_THAT(config_error(j), Contains("sweep.mask: padding fraction in 'pad=half' is not a number"));
  }
  SECTION("mask that is not a string") {
    Json j = base_config();
    j["sweep"]["mask"] = {"none", 3};
    CHECK_THAT(config_error(j), Contains("sweep.mask[1]: must be a mask string"));
  }
  SECTION("valid masks parse into their spec and fraction") {
    Json j = base_config();
    j["sweep"]["mask"] = {"none", "causal", "pad", "causal+pad=0.5"};
    const SweepConfig c = parse_sweep_config(j, "cfg.json");
    REQUIRE(c.masks.size() == 4);
    CHECK(!c.masks[0].spec.any());
    CHECK(c.masks[1].spec.causal);
    CHECK(c.masks[2].spec.key_padding);
    CHECK(c.masks[2].pad_fraction == 0.25);
    CHECK(c.masks[3].spec.causal);
    CHECK(c.masks[3].pad_fraction == 0.5);
    CHECK(c.masks[3].label() == "causal+pad=0.5");
  }
}

TEST_CASE("threads above the available cores are rejected", "[sweep][config]") {
  const int avail = available_threads();
  Json j = base_config();
  j["sweep"]["threads"] = {1, avail + 1};
  const std::string e = config_error(j);
  CHECK_THAT(e, Contains("sweep.threads[1]: must be an integer in [1, " + std::to_string(avail) + "]"));
  CHECK_THAT(e, Contains("got " + std::to_string(avail + 1)));
}

TEST_CASE("unknown variants are rejected with a did-you-mean", "[sweep][config]") {
  SECTION("as a name") {
    Json j = base_config();
    j["variants"] = {"naive", "naiv"};
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("variants[1]: unknown variant 'naiv'"));
    CHECK_THAT(e, Contains("did you mean 'naive'?"));
    CHECK_THAT(e, Contains("registered: "));
  }
  SECTION("as an object") {
    Json j = base_config();
    j["variants"] = Json::array({{{"name", "naiive"}}});
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("variants[0].name: unknown variant 'naiive'"));
    CHECK_THAT(e, Contains("did you mean 'naive'?"));
  }
  SECTION("an unknown key in a variant object") {
    Json j = base_config();
    j["variants"] = Json::array({{{"name", "naive"}, {"param", Json::object()}}});
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("variants[0].param: unknown key 'param'"));
    CHECK_THAT(e, Contains("did you mean 'params'?"));
  }
  SECTION("an empty list") {
    Json j = base_config();
    j["variants"] = Json::array();
    CHECK_THAT(config_error(j), Contains("variants: must be \"all\" or a non-empty list"));
  }
}

TEST_CASE("variant parameters: unknown names and out-of-range values name their path", "[sweep][config]") {
  REQUIRE(Registry::instance().find("sliding_window") != nullptr);
  SECTION("unknown parameter") {
    Json j = base_config();
    j["variants"] = Json::parse(R"([{"name": "sliding_window", "params": {"windw": 64}}])");
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("variants[0].params"));
    CHECK_THAT(e, Contains("unknown parameter 'windw'"));
    CHECK_THAT(e, Contains("did you mean 'window'?"));
  }
  SECTION("window -1") {
    Json j = base_config();
    j["variants"] = Json::parse(R"([{"name": "sliding_window", "params": {"window": -1}}])");
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("variants[0].params.window"));
    CHECK_THAT(e, Contains("must be an integer"));
    CHECK_THAT(e, Contains("got -1"));
  }
  SECTION("dilation 0 inside an axis names the index") {
    Json j = base_config();
    j["variants"] = Json::parse(R"(["naive", {"name": "sliding_window", "params": {"dilation": [1, 0]}}])");
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("variants[1].params.dilation[1]"));
    CHECK_THAT(e, Contains("got 0"));
  }
  SECTION("wrong type") {
    Json j = base_config();
    j["variants"] = Json::parse(R"([{"name": "sliding_window", "params": {"window": "wide"}}])");
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("variants[0].params.window"));
    CHECK_THAT(e, Contains("got \"wide\""));
  }
}

TEST_CASE("the config name must be safe as a folder name", "[sweep][config]") {
  for (const char* bad : {"a/b", "../up", ".hidden", ""}) {
    Json j = base_config();
    j["name"] = bad;
    const std::string e = config_error(j);
    CHECK_THAT(e, Contains("name: must be 1-64 characters"));
    CHECK_THAT(e, Contains("got " + Json(bad).dump()));
  }
  Json j = base_config();
  j.erase("name");
  CHECK_THAT(config_error(j), Contains("name: missing"));
  j["name"] = 42;
  CHECK_THAT(config_error(j), Contains("name: must be 1-64 characters"));
}

TEST_CASE("memory_budget takes byte sizes with units", "[sweep][config]") {
  Json j = base_config();
  j["memory_budget"] = "8GiB";
  CHECK(parse_sweep_config(j, "cfg.json").memory_budget_bytes == (uint64_t{8} << 30));
  j["memory_budget"] = "8 parsecs";
  const std::string e = config_error(j);
  CHECK_THAT(e, Contains("memory_budget: must be bytes as a number or a string like \"8GiB\""));
  CHECK_THAT(e, Contains("got \"8 parsecs\""));
}

TEST_CASE("measure: max_reps below min_reps is rejected", "[sweep][config]") {
  Json j = base_config();
  j["measure"]["min_reps"] = 5;
  j["measure"]["max_reps"] = 2;
  CHECK(config_error(j) == "measure.max_reps: must be >= measure.min_reps (5), got 2");
  j["measure"]["min_reps"] = 0;
  CHECK_THAT(config_error(j), Contains("measure.min_reps: must be an integer in [1, 100000], got 0"));
}

TEST_CASE("accuracy.reference must be a known mode", "[sweep][config]") {
  Json j = base_config();
  j["accuracy"] = {{"reference", "exact"}};
  CHECK(config_error(j) == "accuracy.reference: must be one of auto, full, sampled, none, got \"exact\"");
  j["accuracy"] = {{"reference", "sampled"}, {"rows", 0}};
  CHECK_THAT(config_error(j), Contains("accuracy.rows: must be an integer in [1, 1048576], got 0"));
}

TEST_CASE("inputs: regimes and the tokens file", "[sweep][config]") {
  SECTION("tokens with a missing file: resolved against the config's folder and named") {
    Json j = base_config();
    j["inputs"] = {{"regime", "tokens"}, {"text", "no_such_text.txt"}};
    const std::string e = config_error(j, "/nonexistent/dir/cfg.json");
    CHECK_THAT(e, Contains("inputs.text: file '/nonexistent/dir/no_such_text.txt' does not exist"));
  }
  SECTION("tokens with an existing file") {
    ScratchDir dir("sweepcfg");
    dir.write("sample.txt", "the quick brown fox\n");
    Json j = base_config();
    j["inputs"] = {{"regime", "tokens"}, {"text", "sample.txt"}};
    const SweepConfig c = parse_sweep_config(j, dir.file("cfg.json"));
    REQUIRE(c.regimes.size() == 1);
    CHECK(c.regimes[0].kind == "tokens");
    CHECK(c.regimes[0].label() == "tokens(sample.txt)");
  }
  SECTION("unknown regime") {
    Json j = base_config();
    j["inputs"] = {{"regime", "uniform"}};
    CHECK_THAT(config_error(j), Contains("inputs.regime: must be 'gaussian' or 'tokens', got 'uniform'"));
  }
  SECTION("std out of range inside a list of regimes") {
    Json j = base_config();
    j["inputs"] = Json::parse(R"([{"regime": "gaussian", "std": [1, 0]}])");
    CHECK_THAT(config_error(j), Contains("inputs[0].std[1]: must be a standard deviation"));
  }
}

TEST_CASE("plan expansion: variants x params x batch x heads x head_dim x seq x mask x regime x threads",
          "[sweep][config]") {
  const int avail = available_threads();
  Json j = base_config();
  j["variants"] =
      Json::parse(R"(["naive", {"name": "sliding_window", "params": {"window": [64, 128, 256]}}])");
  j["sweep"] = {{"batch", {1, 2}},
                {"heads", {1, 2, 4}},
                {"head_dim", {16, 32}},
                {"seq_len", {16, 32, 48}},
                {"mask", {"none", "causal"}},
                {"threads", avail >= 2 ? Json{1, 2} : Json{1}}};
  j["inputs"] = Json::parse(R"([{"regime": "gaussian", "std": [0.5, 2]}, {"regime": "gaussian"}])");
  const SweepConfig c = parse_sweep_config(j, "cfg.json");
  const std::size_t threads = avail >= 2 ? 2 : 1;
  REQUIRE(c.variants.size() == 2);
  CHECK(c.variants[0].param_sets.size() == 1);
  CHECK(c.variants[1].param_sets.size() == 3);  // the window axis
  CHECK(c.regimes.size() == 3);
  const auto plan = make_plan(c).points;
  CHECK(plan.size() == (1 + 3) * 2 * 3 * 2 * 3 * 2 * 3 * threads);

  std::set<std::string> ids;
  for (const auto& pt : plan) ids.insert(pt.id);
  CHECK(ids.size() == plan.size());

  // Every resolved parameter set carries the variant's defaults for the parameters not given.
  std::set<int64_t> windows;
  for (const auto& pt : plan)
    if (pt.problem.variant == "sliding_window") {
      windows.insert(pt.problem.param_int("window"));
      CHECK(pt.problem.param_int("dilation") == 1);
    }
  CHECK(windows == std::set<int64_t>{64, 128, 256});
}

TEST_CASE("plan expansion: two parameter axes multiply", "[sweep][config]") {
  Json j = base_config();
  j["variants"] =
      Json::parse(R"([{"name": "sliding_window", "params": {"window": [4, 8], "dilation": [1, 2, 3]}}])");
  const SweepConfig c = parse_sweep_config(j, "cfg.json");
  REQUIRE(c.variants.size() == 1);
  std::set<std::pair<int64_t, int64_t>> combos;
  for (const Json& p : c.variants[0].param_sets)
    combos.insert({p["window"].get<int64_t>(), p["dilation"].get<int64_t>()});
  CHECK(combos.size() == 6);
  CHECK(make_plan(c).points.size() == 6 * 2);  // x two sequence lengths
}

TEST_CASE("plan expansion: cross-attention is seq_q x seq_kv", "[sweep][config]") {
  Json j = base_config();
  j["sweep"].erase("seq_len");
  j["sweep"]["seq_q"] = {16, 32};
  j["sweep"]["seq_kv"] = {8, 24, 40};
  const SweepConfig c = parse_sweep_config(j, "cfg.json");
  CHECK_FALSE(c.self_attention);
  const auto plan = make_plan(c).points;
  REQUIRE(plan.size() == 6);
  std::set<std::pair<int64_t, int64_t>> pairs;
  for (const auto& pt : plan) pairs.insert({pt.problem.seq_q, pt.problem.seq_kv});
  CHECK(pairs ==
        std::set<std::pair<int64_t, int64_t>>{{16, 8}, {16, 24}, {16, 40}, {32, 8}, {32, 24}, {32, 40}});
}

TEST_CASE("plan expansion: \"all\" covers every registered variant with its defaults", "[sweep][config]") {
  Json j = base_config();
  j["variants"] = "all";
  const SweepConfig c = parse_sweep_config(j, "cfg.json");
  const auto plan = make_plan(c).points;
  const auto names = Registry::instance().names();
  REQUIRE(!names.empty());
  CHECK(plan.size() == names.size() * 2);
  std::set<std::string> seen;
  for (const auto& pt : plan) {
    seen.insert(pt.problem.variant);
    CHECK(pt.problem.params == make_problem(pt.problem.variant).params);
  }
  CHECK(seen == std::set<std::string>(names.begin(), names.end()));
  // Leaving "variants" out means all of them too.
  j.erase("variants");
  CHECK(make_plan(parse_sweep_config(j, "cfg.json")).points.size() == plan.size());
}

TEST_CASE("plan expansion: ids are unique and points sharing inputs are adjacent", "[sweep][config]") {
  Json j = base_config();
  j["variants"] = "all";
  j["sweep"] = Json::parse(R"({"batch": [1, 2], "heads": 2, "head_dim": [8, 16], "seq_q": [16, 32],
                               "seq_kv": [16, 24], "mask": ["none", "causal", "pad=0.25", "pad=0.5"],
                               "threads": 1})");
  j["inputs"] = Json::parse(R"({"regime": "gaussian", "std": [0.5, 1, 3]})");
  const auto plan = make_plan(parse_sweep_config(j, "cfg.json")).points;
  REQUIRE(plan.size() == Registry::instance().names().size() * 2 * 2 * 4 * 4 * 3);

  std::set<std::string> ids;
  for (const auto& pt : plan) ids.insert(pt.id);
  CHECK(ids.size() == plan.size());

  // Each input key forms one contiguous run; every point of the run has the same shape, key padding, regime
  // and seed (causal and non-causal points share their inputs).
  std::set<std::string> finished_keys;
  std::map<uint64_t, std::string> key_of_seed;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const SweepPoint& pt = plan[i];
    INFO(pt.id);
    if (i == 0 || plan[i - 1].input_key != pt.input_key) {
      CHECK(finished_keys.insert(pt.input_key).second);  // a key seen before would be a second run
      const auto [it, fresh] = key_of_seed.emplace(pt.input_seed, pt.input_key);
      CHECK((fresh || it->second == pt.input_key));  // distinct inputs get distinct seeds
      continue;
    }
    const SweepPoint& prev = plan[i - 1];
    CHECK(prev.input_seed == pt.input_seed);
    CHECK(prev.problem.batch == pt.problem.batch);
    CHECK(prev.problem.heads == pt.problem.heads);
    CHECK(prev.problem.seq_q == pt.problem.seq_q);
    CHECK(prev.problem.seq_kv == pt.problem.seq_kv);
    CHECK(prev.problem.head_dim == pt.problem.head_dim);
    CHECK(prev.problem.mask.key_padding == pt.problem.mask.key_padding);
    CHECK(prev.mask.pad_fraction == pt.mask.pad_fraction);
    CHECK(prev.regime.std == pt.regime.std);
  }
  // One run per (batch, head_dim, seq_q x seq_kv, key padding, regime): "none" and "causal" are one.
  CHECK(finished_keys.size() == 2u * 2 * 4 * 3 * 3);
}

TEST_CASE("plan expansion: causal points share their non-causal twin's inputs and group with it",
          "[sweep][config]") {
  Json j = base_config();
  j["variants"] = Json::array({"naive", "tiled"});
  j["sweep"] = Json::parse(R"({"seq_len": 32, "mask": ["causal", "pad=0.25", "none", "causal+pad=0.25"],
                               "threads": 1})");
  const auto plan = make_plan(parse_sweep_config(j, "cfg.json")).points;
  REQUIRE(plan.size() == 8);
  // Masks in the order of their inputs part, first appearance first: causal, none, pad, causal+pad.
  const std::vector<std::string> masks{"causal",   "causal",          "none",           "none", "pad=0.25",
                                       "pad=0.25", "causal+pad=0.25", "causal+pad=0.25"};
  for (std::size_t i = 0; i < plan.size(); ++i) CHECK(plan[i].mask.label() == masks[i]);
  CHECK(plan[0].input_key == plan[3].input_key);
  CHECK(plan[0].input_seed == plan[3].input_seed);
  CHECK(plan[4].input_key == plan[7].input_key);
  CHECK(plan[4].input_seed == plan[7].input_seed);
  CHECK(plan[0].input_key != plan[4].input_key);
  CHECK(plan[0].input_seed != plan[4].input_seed);
}

TEST_CASE("plan expansion: repeated axis values do not produce two points with one id", "[sweep][config]") {
  // Two points with one id would collide in --resume (one counts as the other's result) and in the reader
  // (which keeps one row per id). Either the config is rejected or the ids differ.
  auto ids_unique_or_rejected = [](const Json& j) {
    std::vector<SweepPoint> plan;
    try {
      plan = make_plan(parse_sweep_config(j, "cfg.json")).points;
    } catch (const UsageError&) {
      return true;
    }
    std::set<std::string> ids;
    for (const auto& pt : plan) ids.insert(pt.id);
    return ids.size() == plan.size();
  };
  SECTION("the same length twice") {
    Json j = base_config();
    j["sweep"]["seq_len"] = {16, 16};
    CHECK(ids_unique_or_rejected(j));
  }
  SECTION("the same variant twice") {
    Json j = base_config();
    j["variants"] = {"naive", "naive"};
    CHECK(ids_unique_or_rejected(j));
  }
  SECTION("standard deviations that differ beyond the label's 6 digits") {
    Json j = base_config();
    j["inputs"] = Json::parse(R"({"regime": "gaussian", "std": [1, 1.0000001]})");
    CHECK(ids_unique_or_rejected(j));
  }
}

TEST_CASE("plan expansion: more than 10000 points or parameter combinations are refused before expanding",
          "[sweep][config]") {
  // A fuzz_config timeout: three 199-value axes (8 million points) made validation run for minutes.
  Json j = base_config();
  j["sweep"]["seq_len"] = Json::array();
  j["sweep"]["batch"] = Json::array();
  for (int i = 1; i <= 101; ++i) j["sweep"]["seq_len"].push_back(i);
  for (int i = 1; i <= 100; ++i) j["sweep"]["batch"].push_back(i);
  CHECK_THAT(config_error(j), Contains("config: ") && Contains("more than 10000 points"));
  j["sweep"]["batch"] = 1;
  j["variants"] = Json::parse(R"([{"name": "sliding_window", "params": {"window": [], "dilation": []}}])");
  for (int i = 0; i <= 200; ++i) j["variants"][0]["params"]["window"].push_back(i);
  for (int i = 1; i <= 60; ++i) j["variants"][0]["params"]["dilation"].push_back(i);
  CHECK_THAT(config_error(j), Contains("variants[0].params") && Contains("more than 10000 combinations"));
}

TEST_CASE("sweep.isa: an axis of SIMD targets, validated against this CPU, and 'best' keeps the ids",
          "[sweep][config][isa]") {
  const std::string best = simd::isa_info().best;
  std::string supported = "best";
  for (const auto& n : simd::isa_info().supported) supported += ", " + n;
  SECTION("default: best, and ids as before the axis existed") {
    const SweepConfig c = parse_sweep_config(base_config(), "cfg.json");
    CHECK(c.isas == std::vector<std::string>{"best"});
    CHECK_FALSE(c.isa_from_config);
    for (const auto& pt : make_plan(c).points) {
      CHECK(pt.isa == "best");
      CHECK(pt.id.find("isa") == std::string::npos);
      CHECK(pt.id.substr(pt.id.size() - 4) == ",T=1");
    }
  }
  SECTION("a list multiplies the points; the points of one input share its inputs and are adjacent") {
    Json j = base_config();
    j["sweep"]["isa"] = {"best", "scalar"};
    const SweepConfig c = parse_sweep_config(j, "cfg.json");
    CHECK(c.isa_from_config);
    const auto plan = make_plan(c).points;
    const auto plain = make_plan(parse_sweep_config(base_config(), "cfg.json")).points;
    REQUIRE(plan.size() == 2 * plain.size());
    for (std::size_t i = 0; i < plain.size(); ++i) {
      // "best" gives exactly the id the same point has without sweep.isa; other names add ",isa=NAME".
      CHECK(plan[2 * i].isa == "best");
      CHECK(plan[2 * i].id == plain[i].id);
      CHECK(plan[2 * i + 1].isa == "scalar");
      CHECK(plan[2 * i + 1].id == plain[i].id + ",isa=scalar");
      CHECK(plan[2 * i + 1].input_key == plan[2 * i].input_key);
      CHECK(plan[2 * i + 1].input_seed == plan[2 * i].input_seed);
    }
  }
  SECTION("a single name, including the best target by its own name") {
    Json j = base_config();
    j["sweep"]["isa"] = best;
    const auto plan = make_plan(parse_sweep_config(j, "cfg.json")).points;
    for (const auto& pt : plan) CHECK_THAT(pt.id, Contains(",isa=" + best));
  }
  SECTION("errors name the path, the value and the supported targets") {
    Json j = base_config();
    j["sweep"]["isa"] = "avx9";
    CHECK_THAT(config_error(j), Contains("sweep.isa 'avx9'") && Contains("supported: " + supported));
    j["sweep"]["isa"] = {"scalar", "AVX2"};  // names are lower case
    CHECK_THAT(config_error(j), Contains("sweep.isa[1] 'AVX2'") && Contains("supported: " + supported));
    j["sweep"]["isa"] = {"scalar", nullptr};
    CHECK_THAT(config_error(j), Contains("sweep.isa[1]: must be a SIMD target name") && Contains("got null"));
    j["sweep"]["isa"] = Json::array();
    CHECK_THAT(config_error(j), Contains("sweep.isa: must not be an empty list"));
    j["sweep"]["isa"] = {"best", "best"};
    CHECK_THAT(config_error(j), Contains("same id"));
    j["sweep"]["iza"] = "best";
    j["sweep"].erase("isa");
    CHECK_THAT(config_error(j), Contains("did you mean 'isa'?"));
  }
  SECTION("apply_isa_option (run --isa): sets the axis of a config without sweep.isa, refuses a conflict") {
    SweepConfig c = parse_sweep_config(base_config(), "cfg.json");
    apply_isa_option(c, "best");
    CHECK(c.isas == std::vector<std::string>{"best"});
    apply_isa_option(c, "scalar");
    CHECK(c.isas == std::vector<std::string>{"scalar"});
    CHECK_THROWS_WITH(apply_isa_option(c, "nosuch"), Contains("--isa 'nosuch'") && Contains(supported));
    Json j = base_config();
    j["sweep"]["isa"] = {"best", "scalar"};
    SweepConfig with_axis = parse_sweep_config(j, "cfg.json");
    apply_isa_option(with_axis, "best");  // the default: the config's axis stands
    CHECK(with_axis.isas == std::vector<std::string>{"best", "scalar"});
    CHECK_THROWS_AS(apply_isa_option(with_axis, "scalar"), UsageError);
    CHECK_THROWS_WITH(apply_isa_option(with_axis, "scalar"), Contains("--isa 'scalar'") &&
                                                                 Contains("sets sweep.isa") &&
                                                                 Contains(R"(["best","scalar"])"));
  }
}

TEST_CASE("parse_bytes and format_bytes", "[sweep][config]") {
  CHECK(parse_bytes("8GiB", "b") == (uint64_t{8} << 30));
  CHECK(parse_bytes("512 MiB", "b") == (uint64_t{512} << 20));
  CHECK(parse_bytes("1.5G", "b") == (uint64_t{3} << 29));
  CHECK(parse_bytes("64KiB", "b") == 65536);
  CHECK(parse_bytes("100", "b") == 100);
  CHECK(parse_bytes("7B", "b") == 7);
  CHECK(parse_bytes(Json(1073741824), "b") == 1073741824);
  CHECK(parse_bytes("16777215 TiB", "b") == (uint64_t{16777215} << 40));  // just below 2^64
  for (const Json& bad :
       {Json("8 parsecs"), Json(""), Json(-1), Json(0), Json(true), Json("GiB"), Json("0.1B"),
        // fuzz_config findings: at or above 2^64 bytes the conversion to uint64_t was undefined behaviour,
        // and 309+ digits made std::stod throw std::out_of_range instead of a UsageError.
        Json(1e300), Json(18446744073709551616.0), Json("99999999999999 TiB"), Json(std::string(400, '9'))}) {
    INFO(bad.dump());
    try {
      (void)parse_bytes(bad, "where.x");
      FAIL("no error for " << bad.dump());
    } catch (const UsageError& e) {
      CHECK_THAT(std::string(e.what()), Contains("where.x: must be"));
      CHECK_THAT(std::string(e.what()), Contains(bad.dump()));
    }
  }
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1.000 KiB");
  CHECK(format_bytes(1.5 * 1024 * 1024) == "1.500 MiB");
  CHECK(format_bytes(static_cast<double>(uint64_t{8} << 30)) == "8.000 GiB");
}

TEST_CASE("load_sweep_config: file errors name the file, JSON errors the line", "[sweep][config]") {
  ScratchDir dir("sweepcfg");
  SECTION("syntax error on line 4") {
    const std::string path = dir.write(
        "broken.json",
        "{\n  \"name\": \"t\",\n  \"variants\": [\"naive\"],\n  \"sweep\": {\"seq_len\": [16,]}\n}\n");
    try {
      (void)load_sweep_config(path);
      FAIL("no error for a syntax error");
    } catch (const UsageError& e) {
      CHECK_THAT(std::string(e.what()), Contains(path));
      CHECK_THAT(std::string(e.what()), Contains("line 4"));
    }
  }
  SECTION("a number beyond the double range is a JSON error naming the file (found by fuzzing)") {
    // nlohmann::json throws out_of_range (not parse_error) for it, which used to escape as a crash.
    const std::string path = dir.write("huge.json", R"({"name": "t", "seed": 1e400})");
    try {
      (void)load_sweep_config(path);
      FAIL("no error for 1e400");
    } catch (const UsageError& e) {
      CHECK_THAT(std::string(e.what()), Contains(path) && Contains("invalid JSON") && Contains("1e400"));
    }
  }
  SECTION("missing file") {
    const std::string path = dir.file("absent.json");
    try {
      (void)load_sweep_config(path);
      FAIL("no error for a missing file");
    } catch (const UsageError& e) {
      CHECK_THAT(std::string(e.what()), Contains(path));
    }
  }
  SECTION("a validation error is prefixed with the file") {
    Json j = base_config();
    j["sweep"]["seq_len"] = {64, 128, -5};
    const std::string path = dir.write("bad.json", j.dump(2));
    try {
      (void)load_sweep_config(path);
      FAIL("no error for an invalid config");
    } catch (const UsageError& e) {
      CHECK_THAT(std::string(e.what()), Contains(path));
      CHECK_THAT(std::string(e.what()), Contains("sweep.seq_len[2]: must be a positive integer, got -5"));
    }
  }
  SECTION("the shipped configs load and expand") {
    for (const char* name : {"smoke.json", "default.json"}) {
      INFO(name);
      // default.json asks for 2 threads, which a 1-core machine rightly rejects.
      if (std::string(name) == "default.json" && available_threads() < 2) continue;
      const SweepConfig c = load_sweep_config(std::string(ATTN_SOURCE_DIR) + "/configs/" + name);
      CHECK(!make_plan(c).points.empty());
    }
  }
}

TEST_CASE("plan: the machine's defaults and limits are resolved after parsing, from the Machine given",
          "[sweep][config][plan]") {
  Json j = base_config();
  j["sweep"].erase("threads");
  j.erase("memory_budget");
  const SweepConfig parsed = parse_sweep_config(j, "cfg.json");
  CHECK(parsed.threads.empty());  // parsing reads no machine
  CHECK_FALSE(parsed.memory_budget_bytes.has_value());
  CHECK_THROWS_AS(expand_plan(parsed), std::logic_error);  // unresolved: only make_plan expands

  Machine m;
  m.threads = 5;
  m.physical_bytes = uint64_t{10} << 30;
  m.isas = {"scalar"};
  const Plan plan = make_plan(parsed, "best", m);
  CHECK(plan.config.threads == std::vector<int>{5});
  CHECK(plan.config.memory_budget_bytes == (uint64_t{5} << 30));  // half the physical memory
  for (const SweepPoint& pt : plan.points) CHECK(pt.threads == 5);
  m.physical_bytes = 0;  // unknown: 8 GiB
  CHECK(make_plan(parsed, "best", m).config.memory_budget_bytes == (uint64_t{8} << 30));

  j["sweep"]["threads"] = {1, 6};
  CHECK_THROWS_WITH(make_plan(parse_sweep_config(j, "cfg.json"), "best", m),
                    Contains("sweep.threads[1]: must be an integer in [1, 5] (the cores available), got 6"));
  j["sweep"]["threads"] = 1;
  j["sweep"]["isa"] = {"scalar", simd::isa_info().compiled.front()};
  if (simd::isa_info().compiled.front() != "scalar")  // a build with more than the fallback
    CHECK_THROWS_WITH(make_plan(parse_sweep_config(j, "cfg.json"), "best", m),
                      Contains("sweep.isa[1] '" + simd::isa_info().compiled.front() +
                               "': this CPU does not support that target; supported: best, scalar"));
}

TEST_CASE("sweep.kv_heads: a grouped-query axis whose values divide every heads value",
          "[sweep][config][gqa]") {
  SECTION("default: every point's kv_heads is its heads, and ids carry no Hkv") {
    Json j = base_config();
    j["sweep"]["heads"] = {2, 4};
    const SweepConfig c = parse_sweep_config(j, "cfg.json");
    CHECK(c.kv_heads.empty());
    const auto plan = make_plan(c).points;
    REQUIRE(plan.size() == 4);
    for (const SweepPoint& pt : plan) {
      CHECK(pt.problem.num_kv_heads() == pt.problem.heads);
      CHECK(!pt.problem.is_gqa());
      CHECK(pt.id.find("Hkv") == std::string::npos);
      CHECK(pt.input_key.find("Hkv") == std::string::npos);
      CHECK(point_json(pt, c)["problem"]["kv_heads"] == pt.problem.heads);
    }
  }
  SECTION("a valid list expands the points; ids and input keys carry Hkv when it differs from H") {
    Json j = base_config();
    j["sweep"]["heads"] = {4, 8};
    j["sweep"]["kv_heads"] = {4, 2, 1};
    const SweepConfig c = parse_sweep_config(j, "cfg.json");
    CHECK(c.kv_heads == std::vector<int64_t>{4, 2, 1});
    const auto plan = make_plan(c).points;
    REQUIRE(plan.size() == 2 * 3 * 2);  // heads x kv_heads x seq_len
    std::set<std::pair<int64_t, int64_t>> shapes;
    std::set<std::string> keys;
    for (const SweepPoint& pt : plan) {
      const Problem& p = pt.problem;
      shapes.insert({p.heads, p.num_kv_heads()});
      keys.insert(pt.input_key);
      const bool gqa = p.num_kv_heads() != p.heads;
      CHECK(p.is_gqa() == gqa);
      CHECK((pt.id.find(",Hkv=" + std::to_string(p.num_kv_heads()) + ",") != std::string::npos) == gqa);
      CHECK((pt.input_key.find("Hkv=") != std::string::npos) == gqa);
      // The id reads back as the same problem (repro).
      CHECK(parse_problem(pt.id.substr(0, pt.id.find(",gaussian"))).num_kv_heads() == p.num_kv_heads());
      const Json pj = point_json(pt, c);
      CHECK(pj["problem"]["kv_heads"] == p.num_kv_heads());
      CHECK(pj["row"]["kv_heads"] == p.num_kv_heads());
      CHECK(pj["bytes"].is_number());
      CHECK(pj["row"]["bytes"] == pj["bytes"]);
      // The variant's own traffic count, at least Q, K, V (kv_heads heads) and O once.
      CHECK(pj["bytes"].get<double>() == Registry::instance().get(p.variant).bytes_moved(p));
      CHECK(pj["bytes"].get<double>() >= compulsory_bytes(p));
    }
    CHECK(shapes == std::set<std::pair<int64_t, int64_t>>{{4, 4}, {4, 2}, {4, 1}, {8, 4}, {8, 2}, {8, 1}});
    CHECK(keys.size() == plan.size());  // every (H, Hkv, L) its own inputs
  }
  SECTION("one value") {
    Json j = base_config();
    j["sweep"]["heads"] = 8;
    j["sweep"]["kv_heads"] = 2;
    const auto plan = make_plan(parse_sweep_config(j, "cfg.json")).points;
    REQUIRE(plan.size() == 2);
    CHECK(plan[0].problem.num_kv_heads() == 2);
    CHECK_THAT(plan[0].id, Contains("H=8,Hkv=2,"));
  }
  SECTION("a value that does not divide a heads value names its index, the value and the heads") {
    Json j = base_config();
    j["sweep"]["heads"] = {8, 12};
    j["sweep"]["kv_heads"] = {4, 8};
    CHECK(
        config_error(j) ==
        "sweep.kv_heads[1]: must divide every value of sweep.heads (query heads per K/V head), got 8, which "
        "does not divide heads 12");
  }
  SECTION("a single non-dividing value has no index") {
    Json j = base_config();
    j["sweep"]["heads"] = 8;
    j["sweep"]["kv_heads"] = 3;
    CHECK(config_error(j) ==
          "sweep.kv_heads: must divide every value of sweep.heads (query heads per K/V head), got 3, which "
          "does not divide heads 8");
  }
  SECTION("kv_heads above heads does not divide it") {
    Json j = base_config();
    j["sweep"]["heads"] = 2;
    j["sweep"]["kv_heads"] = 4;
    CHECK_THAT(config_error(j), Contains("sweep.kv_heads: must divide every value of sweep.heads"));
  }
  SECTION("kv_heads must be a positive integer") {
    Json j = base_config();
    j["sweep"]["kv_heads"] = {1, 0};
    CHECK(config_error(j) == "sweep.kv_heads[1]: must be a positive integer, got 0");
    j["sweep"]["kv_heads"] = "2";
    CHECK_THAT(config_error(j), Contains("sweep.kv_heads: must be a positive integer, got \"2\""));
    j["sweep"]["kv_heads"] = Json::array();
    CHECK(config_error(j) == "sweep.kv_heads: must not be an empty list");
  }
  SECTION("a repeated value is two points with one id") {
    Json j = base_config();
    j["sweep"]["heads"] = 4;
    j["sweep"]["kv_heads"] = {2, 2};
    CHECK_THAT(config_error(j), Contains("two points have the same id"));
  }
}

TEST_CASE("masks: causal_lower_right parses alone and with padding", "[sweep][config][gqa]") {
  Json j = base_config();
  j["sweep"]["mask"] = {"causal_lower_right", "causal_lower_right+pad=0.25", "causal+causal_lower_right"};
  const SweepConfig c = parse_sweep_config(j, "cfg.json");
  REQUIRE(c.masks.size() == 3);
  CHECK(c.masks[0].spec.causal_lower_right);
  CHECK(!c.masks[0].spec.causal);
  CHECK(c.masks[0].label() == "causal_lower_right");
  CHECK(c.masks[1].spec.causal_lower_right);
  CHECK(c.masks[1].spec.key_padding);
  CHECK(c.masks[1].pad_fraction == 0.25);
  CHECK(c.masks[1].label() == "causal_lower_right+pad=0.25");
  CHECK(c.masks[2].label() == "causal+causal_lower_right");
  const auto plan = make_plan(c).points;
  REQUIRE(plan.size() == 6);
  std::set<std::string> ids;
  for (const SweepPoint& pt : plan) {
    ids.insert(pt.id);
    CHECK(pt.problem.mask.causal_lower_right);
    CHECK(point_json(pt, c)["problem"]["causal_lower_right"] == true);
    CHECK(point_json(pt, c)["mask"]["label"] == pt.mask.label());
  }
  CHECK(ids.size() == 6);
  // The message for a bad mask lists it.
  j["sweep"]["mask"] = "causal_lower_rite";
  CHECK_THAT(config_error(j), Contains("causal_lower_right"));
}

TEST_CASE("sweep.dtype and sweep.bias: axes of storage precision and logit bias", "[sweep][config][dtype]") {
  SECTION("defaults: fp32, no bias, and the ids they had before the axes existed") {
    const SweepConfig c = parse_sweep_config(base_config(), "cfg.json");
    CHECK(c.dtypes == std::vector<DType>{DType::fp32});
    CHECK(c.biases == std::vector<Bias>{Bias::none});
    const Plan plan = make_plan(c);
    REQUIRE(plan.points.size() == 2);
    CHECK(plan.points[0].id == "naive:B=1,H=1,Lq=16,Lkv=16,D=16,gaussian(std=1),T=1");
  }
  SECTION("a string or a list; every combination is a point, the ids carry dtype and alibi") {
    Json j = base_config();
    j["sweep"]["dtype"] = {"fp32", "bf16", "fp16"};
    j["sweep"]["bias"] = {"none", "alibi"};
    const Plan plan = make_plan(parse_sweep_config(j, "cfg.json"));
    CHECK(plan.points.size() == 2 * 3 * 2);
    std::set<std::string> ids;
    std::map<std::string, std::set<std::string>> dtypes_per_key;
    for (const SweepPoint& pt : plan.points) {
      ids.insert(pt.id);
      CHECK((pt.id.find(",dtype=bf16,") != std::string::npos) == (pt.problem.dtype == DType::bf16));
      CHECK((pt.id.find(",dtype=fp16,") != std::string::npos) == (pt.problem.dtype == DType::fp16));
      CHECK((pt.id.find(",alibi,") != std::string::npos) == (pt.problem.bias == Bias::alibi));
      // dtype and bias leave the fp32 inputs as they are: one input key (and seed) for all of them.
      dtypes_per_key[pt.input_key].insert(std::string(dtype_name(pt.problem.dtype)) +
                                          bias_name(pt.problem.bias));
      // the id reads back to the same problem
      const std::string repro = pt.id.substr(0, pt.id.find(",gaussian"));
      const Problem back = parse_problem(repro);
      CHECK(back.dtype == pt.problem.dtype);
      CHECK(back.bias == pt.problem.bias);
    }
    CHECK(ids.size() == plan.points.size());
    CHECK(dtypes_per_key.size() == 2);  // the two lengths
    for (const auto& [key, set] : dtypes_per_key) CHECK(set.size() == 6);
    Json one = base_config();
    one["sweep"]["dtype"] = "bf16";
    one["sweep"]["bias"] = "alibi";
    const Plan p1 = make_plan(parse_sweep_config(one, "cfg.json"));
    REQUIRE(p1.points.size() == 2);
    CHECK(p1.points[0].id == "naive:B=1,H=1,Lq=16,Lkv=16,D=16,alibi,dtype=bf16,gaussian(std=1),T=1");
  }
  SECTION("the same fp32 inputs: the input seed does not depend on dtype or bias") {
    Json j = base_config();
    const uint64_t seed0 = make_plan(parse_sweep_config(j, "cfg.json")).points[0].input_seed;
    j["sweep"]["dtype"] = "fp16";
    j["sweep"]["bias"] = "alibi";
    CHECK(make_plan(parse_sweep_config(j, "cfg.json")).points[0].input_seed == seed0);
  }
}

TEST_CASE("sweep.dtype and sweep.bias: bad values, and variants that lack the bias",
          "[sweep][config][dtype]") {
  SECTION("unknown values name the path, the value and the allowed names") {
    Json j = base_config();
    j["sweep"]["dtype"] = {"fp32", "fp8"};
    std::string e = config_error(j);
    CHECK_THAT(e, Contains("sweep.dtype[1]"));
    CHECK_THAT(e, Contains("'fp8'"));
    CHECK_THAT(e, Contains("fp32, bf16, fp16"));
    j = base_config();
    j["sweep"]["dtype"] = 16;
    e = config_error(j);
    CHECK_THAT(e, Contains("sweep.dtype: must be a storage dtype (fp32, bf16, fp16), got 16"));
    j = base_config();
    j["sweep"]["bias"] = "alibi2";
    e = config_error(j);
    CHECK_THAT(e, Contains("sweep.bias"));
    CHECK_THAT(e, Contains("'alibi2'"));
    CHECK_THAT(e, Contains("none, alibi"));
    j = base_config();
    j["sweep"]["bias"] = Json::array();
    CHECK_THAT(config_error(j), Contains("sweep.bias: must not be an empty list"));
    j = base_config();
    j["sweep"]["dtype"] = {"bf16", "bf16"};
    CHECK_THAT(config_error(j), Contains("the same id"));
  }
  SECTION("variants without ALiBi are skipped with the reason, any dtype runs; memory counts 16-bit inputs") {
    Json j = base_config();
    j["variants"] = {"naive", "linear"};
    j["sweep"]["dtype"] = {"fp32", "bf16"};
    j["sweep"]["bias"] = {"none", "alibi"};
    const Plan plan = make_plan(parse_sweep_config(j, "cfg.json"));
    int skipped = 0;
    for (const SweepPoint& pt : plan.points) {
      const std::string why = skip_reason(pt, plan.config);
      const bool linear = pt.problem.variant == "linear";
      // linear takes bf16 by widening it (as every variant takes both storage dtypes), but not ALiBi.
      if (linear && pt.problem.bias == Bias::alibi) CHECK_THAT(why, Contains("ALiBi"));
      CHECK_THAT(why, !Contains("dtype"));
      if (!linear || pt.problem.bias == Bias::none) CHECK(why.empty());
      skipped += !why.empty();
      const PointMemory m = point_memory(pt, plan.config);
      const std::size_t qkv =
          static_cast<std::size_t>(pt.problem.q_elements() + 2 * pt.problem.kv_elements());
      if (pt.problem.dtype == DType::bf16) {
        CHECK(m.fp32_inputs == qkv * 4);
        CHECK(m.call.inputs == qkv * 2);
      } else {
        CHECK(m.fp32_inputs == 0);
        CHECK(m.call.inputs == qkv * 4);
      }
      const Json pj = point_json(pt, plan.config);
      CHECK(pj["problem"]["dtype"] == dtype_name(pt.problem.dtype));
      CHECK(pj["problem"]["bias"] == bias_name(pt.problem.bias));
      CHECK(pj["row"]["dtype"] == dtype_name(pt.problem.dtype));
      CHECK(pj["row"]["memory"]["inputs_bytes"] == m.call.inputs);
    }
    CHECK(skipped == 2 * 2);  // linear with alibi, fp32 and bf16, at two lengths
  }
}

TEST_CASE("inputs.rope and inputs.rope_base: RoPE in either regime, in the label and the id",
          "[sweep][config][rope]") {
  ScratchDir dir{"sweepcfg"};
  attn::test::write_text(dir.path() / "words.txt", "a few words of text for the tokens regime\n");
  const std::string cfg = dir.file("cfg.json");
  SECTION("default none: the labels and ids of before") {
    const SweepConfig c = parse_sweep_config(base_config(), cfg);
    REQUIRE(c.regimes.size() == 1);
    CHECK(!c.regimes[0].rope.on());
    CHECK(c.regimes[0].label() == "gaussian(std=1)");
  }
  SECTION(
      "a mode or a list of modes in both regimes; the label, id and input key say it, the seed does not") {
    Json j = base_config();
    j["inputs"] = Json::parse(R"([{"regime": "gaussian", "rope": ["none", "normal"]},
                                  {"regime": "tokens", "text": "words.txt", "rope": "neox", "rope_base": 500000}])");
    const SweepConfig c = parse_sweep_config(j, cfg);
    REQUIRE(c.regimes.size() == 3);
    CHECK(c.regimes[0].label() == "gaussian(std=1)");
    CHECK(c.regimes[1].label() == "gaussian(std=1,rope=normal)");
    CHECK(c.regimes[1].rope.mode == RopeMode::normal);
    CHECK(c.regimes[1].rope.base == 10000.0);
    CHECK(c.regimes[2].label() == "tokens(words.txt,rope=neox,base=5e+05)");
    CHECK(c.regimes[2].rope.base == 500000.0);
    const Plan plan = make_plan(c);
    CHECK(plan.points.size() == 2 * 3);
    std::map<std::string, uint64_t> seed_of;
    std::set<std::string> keys;
    for (const SweepPoint& pt : plan.points) {
      CHECK_THAT(pt.id, Contains(pt.regime.label()));
      keys.insert(pt.input_key);
      if (pt.regime.kind == "gaussian") {
        const std::string shape = pt.id.substr(0, pt.id.find(",gaussian"));
        if (seed_of.count(shape))
          CHECK(seed_of[shape] == pt.input_seed);  // with and without RoPE: the same draws
        else
          seed_of[shape] = pt.input_seed;
      }
      CHECK(base_row(pt, plan.config, "scalar").rope == pt.regime.rope.str());
      const Json pj = point_json(pt, plan.config);
      CHECK(pj["inputs"]["rope"] == pt.regime.rope.str());
      CHECK(pj["inputs"]["rope_query_offset"] == 0);
    }
    CHECK(keys.size() == plan.points.size());  // RoPE on and off are different inputs
  }
  SECTION("errors name the field and the value") {
    Json j = base_config();
    j["inputs"] = {{"regime", "gaussian"}, {"rope", "rotary"}};
    std::string e = config_error(j, cfg);
    CHECK_THAT(e, Contains("inputs.rope"));
    CHECK_THAT(e, Contains("'rotary'"));
    CHECK_THAT(e, Contains("none, normal, neox"));
    j["inputs"] = {{"regime", "gaussian"}, {"rope", {"none", 3}}};
    CHECK_THAT(config_error(j, cfg),
               Contains("inputs.rope[1]: must be a RoPE mode (none, normal, neox), got 3"));
    for (const Json& bad : {Json(0), Json(-1.5), Json("10000")}) {
      j["inputs"] = {{"regime", "gaussian"}, {"rope", "normal"}, {"rope_base", bad}};
      CHECK_THAT(config_error(j, cfg), Contains("inputs.rope_base: must be a finite number > 0"));
    }
    j["inputs"] = {{"regime", "gaussian"}, {"rope_base", 500000}};
    CHECK_THAT(config_error(j, cfg),
               Contains("inputs.rope_base: only applies with inputs.rope normal or neox"));
    j["inputs"] = {{"regime", "gaussian"}, {"rope_frequency", 500000}};
    CHECK_THAT(config_error(j, cfg), Contains("unknown key 'rope_frequency'"));
  }
  SECTION("an odd head_dim with RoPE on is a config error naming the field and the value") {
    Json j = base_config();
    j["sweep"]["head_dim"] = {16, 63};
    j["inputs"] = Json::parse(
        R"([{"regime": "gaussian"}, {"regime": "tokens", "text": "words.txt", "rope": "normal"}])");
    const std::string e = config_error(j, cfg);
    CHECK_THAT(e, Contains("inputs[1].rope"));
    CHECK_THAT(e, Contains("'normal'"));
    CHECK_THAT(e, Contains("even head_dim"));
    CHECK_THAT(e, Contains("sweep.head_dim[1] = 63"));
    // without RoPE the odd head_dim is fine
    j["inputs"] = {{"regime", "gaussian"}, {"rope", "none"}};
    CHECK_NOTHROW(make_plan(parse_sweep_config(j, cfg)));
  }
  SECTION("causal_lower_right: the queries' RoPE positions start at seq_kv - seq_q") {
    Json j = base_config();
    j["sweep"].erase("seq_len");
    j["sweep"]["seq_q"] = 4;
    j["sweep"]["seq_kv"] = 32;
    j["sweep"]["mask"] = "causal_lower_right";
    j["inputs"] = {{"regime", "gaussian"}, {"rope", "normal"}};
    const Plan plan = make_plan(parse_sweep_config(j, cfg));
    REQUIRE(plan.points.size() == 1);
    CHECK(point_json(plan.points[0], plan.config)["inputs"]["rope_query_offset"] == 28);
  }
}

TEST_CASE("sweep.softcap and sweep.sinks: axes of logit soft-capping and learned sink logits",
          "[sweep][config]") {
  SECTION("defaults: neither, and the ids they had before the axes existed") {
    const SweepConfig c = parse_sweep_config(base_config(), "cfg.json");
    CHECK(c.softcaps == std::vector<double>{0.0});
    CHECK(c.sinks == std::vector<bool>{false});
    CHECK(make_plan(c).points[0].id == "naive:B=1,H=1,Lq=16,Lkv=16,D=16,gaussian(std=1),T=1");
  }
  SECTION("every combination is a point with one input key; ids read back; skips name the capability") {
    Json j = base_config();
    j["variants"] = {"naive", "linear"};
    j["sweep"]["softcap"] = {0, 30};
    j["sweep"]["sinks"] = {false, true};
    const Plan plan = make_plan(parse_sweep_config(j, "cfg.json"));
    CHECK(plan.points.size() == 2 * 2 * 2 * 2);
    std::set<std::string> ids, keys;
    for (const SweepPoint& pt : plan.points) {
      ids.insert(pt.id);
      keys.insert(pt.input_key);
      const Problem& p = pt.problem;
      CHECK((pt.id.find(",softcap=30,") != std::string::npos) == p.softcap.has_value());
      CHECK((pt.id.find(",sinks,") != std::string::npos) == p.sinks);
      const Problem back = parse_problem(pt.id.substr(0, pt.id.find(",gaussian")));
      CHECK(back.softcap == p.softcap);
      CHECK(back.sinks == p.sinks);
      const std::string why = skip_reason(pt, plan.config);
      if (p.variant == "linear" && p.softcap) CHECK_THAT(why, Contains("soft-capping"));
      if (p.variant == "linear" && p.sinks) CHECK_THAT(why, Contains("sink logits"));
      if (p.variant == "naive") CHECK(why.empty());
      const Json pj = point_json(pt, plan.config);
      CHECK(pj["problem"]["sinks"] == p.sinks);
      CHECK(pj["row"]["sinks"] == p.sinks);
      CHECK(pj["row"]["softcap"] == (p.softcap ? Json(*p.softcap) : Json(nullptr)));
    }
    CHECK(ids.size() == plan.points.size());
    CHECK(keys.size() == 2);  // the two lengths: the cap and the sinks leave Q, K, V as they are
  }
  SECTION("bad values name the path, the value and what is allowed") {
    Json j = base_config();
    j["sweep"]["softcap"] = {30, -1};
    std::string e = config_error(j);
    CHECK_THAT(e, Contains("sweep.softcap[1]"));
    CHECK_THAT(e, Contains("-1"));
    CHECK_THAT(e, Contains("or 0 for no soft-capping"));
    j = base_config();
    j["sweep"]["sinks"] = "yes";
    e = config_error(j);
    CHECK_THAT(e, Contains("sweep.sinks: must be true"));
    CHECK_THAT(e, Contains("\"yes\""));
  }
}

TEST_CASE("inputs.g and inputs.beta: the recurrences' gate distributions, in the label and the input key",
          "[sweep][config]") {
  SECTION(
      "absent or stated as the default: N(0, 1) for both, and the ids they had before the fields existed") {
    const SweepConfig c = parse_sweep_config(base_config(), "cfg.json");
    CHECK(c.regimes[0].g.is_default());
    CHECK(c.regimes[0].beta.is_default());
    Json j = base_config();
    j["inputs"] =
        Json::parse(R"({"regime": "gaussian", "g": {"dist": "logsigmoid_normal", "mean": 0, "std": 1},
                                  "beta": {"dist": "sigmoid_normal"}})");
    const SweepConfig stated = parse_sweep_config(j, "cfg.json");
    CHECK(stated.regimes.size() == 1);
    CHECK(stated.regimes[0].label() == "gaussian(std=1)");
    CHECK(make_plan(stated).points[0].id == make_plan(c).points[0].id);
  }
  SECTION("a list is an axis; other distributions change the label, the id and the input key, not the seed") {
    Json j = base_config();
    j["variants"] = {"simple_gla", "gated_delta_rule"};
    j["sweep"]["seq_len"] = 16;
    j["sweep"]["mask"] = "causal";
    j["inputs"] = Json::parse(R"({"regime": "gaussian",
        "g": [{"dist": "logsigmoid_normal"}, {"dist": "logsigmoid_normal", "mean": -2, "std": 0}],
        "beta": [{"dist": "sigmoid_normal"}, {"dist": "sigmoid_normal", "mean": -100, "std": 0}]})");
    const Plan plan = make_plan(parse_sweep_config(j, "cfg.json"));
    REQUIRE(plan.config.regimes.size() == 4);
    CHECK(plan.config.regimes[0].label() == "gaussian(std=1)");
    CHECK(plan.config.regimes[1].label() == "gaussian(std=1,beta=sigmoid(N(-100,0)))");
    CHECK(plan.config.regimes[2].label() == "gaussian(std=1,g=logsigmoid(N(-2,0)))");
    CHECK(plan.config.regimes[3].label() == "gaussian(std=1,g=logsigmoid(N(-2,0)),beta=sigmoid(N(-100,0)))");
    REQUIRE(plan.points.size() == 2 * 4);
    std::set<std::string> ids, keys;
    std::set<uint64_t> seeds;
    for (const SweepPoint& pt : plan.points) {
      ids.insert(pt.id);
      keys.insert(pt.input_key);
      seeds.insert(pt.input_seed);
      CHECK_THAT(pt.id, Contains(pt.regime.label()));
      CHECK(skip_reason(pt, plan.config).empty());
    }
    CHECK(ids.size() == plan.points.size());
    CHECK(keys.size() == 4);   // one input set per distribution pair: they never share drawn inputs
    CHECK(seeds.size() == 1);  // Q, K, V are the same draws
    // The draws follow the stated distribution: std 0 makes every value the transform of the mean.
    const float g_mean = static_cast<float>(-std::log1p(std::exp(2.0)));  // logsigmoid(-2)
    for (const SweepPoint& pt : plan.points) {
      if (pt.problem.variant != "gated_delta_rule") continue;
      const PointInputs in = make_inputs(pt);
      REQUIRE(in.g.shape == std::vector<int64_t>{1, 1, 16});
      REQUIRE(in.beta.shape == std::vector<int64_t>{1, 1, 16});
      const bool g_const = !pt.regime.g.is_default(), beta_const = !pt.regime.beta.is_default();
      for (std::size_t e = 0; e < in.g.numel(); ++e) {
        CHECK(in.g.data[e] <= 0);
        CHECK(in.beta.data[e] > 0);
        CHECK(in.beta.data[e] <= 1);
        if (g_const) CHECK(in.g.data[e] == g_mean);
        // sigmoid(-100) ~ 3.7e-44 is below float32's normals: raised to the smallest normal.
        if (beta_const) CHECK(in.beta.data[e] == std::numeric_limits<float>::min());
      }
      if (!g_const) CHECK(std::set<float>(in.g.data.begin(), in.g.data.end()).size() > 1);
    }
  }
  SECTION(
      "KDA's gates (flash-linear-attention): -scale softplus(z) and lower_bound sigmoid(z), from the same "
      "z") {
    Json j = base_config();
    j["variants"] = {"kda"};
    j["sweep"]["seq_len"] = 16;
    j["sweep"]["mask"] = "causal";
    j["inputs"] = Json::parse(R"({"regime": "gaussian",
        "g": [{"dist": "logsigmoid_normal"}, {"dist": "softplus_normal"}, {"dist": "softplus_normal", "scale": 4},
              {"dist": "lower_bound_sigmoid_normal"}, {"dist": "lower_bound_sigmoid_normal", "lower_bound": -2}]})");
    const Plan plan = make_plan(parse_sweep_config(j, "cfg.json"));
    REQUIRE(plan.points.size() == 5);
    const char* labels[] = {"gaussian(std=1)", "gaussian(std=1,g=-softplus(N(0,1)))",
                            "gaussian(std=1,g=-4*softplus(N(0,1)))", "gaussian(std=1,g=-5*sigmoid(N(0,1)))",
                            "gaussian(std=1,g=-2*sigmoid(N(0,1)))"};
    std::vector<PointInputs> in;
    for (std::size_t i = 0; i < 5; ++i) {
      CHECK(plan.points[i].regime.label() == labels[i]);
      in.push_back(make_inputs(plan.points[i]));
      REQUIRE(in[i].g_vector.shape == std::vector<int64_t>{1, 1, 16, plan.points[i].problem.head_dim});
    }
    // The same z behind every parametrisation: with s = sigmoid(z) = exp(logsigmoid(z)), softplus(z) =
    // -log(1 - s); float32 rounding of g0 = logsigmoid(z) bounds the agreement (relative 1e-5, and s not near
    // 1).
    for (std::size_t e = 0; e < in[0].g_vector.numel(); ++e) {
      const double g0 = in[0].g_vector.data[e], sig = std::exp(g0);
      for (std::size_t i = 1; i < 5; ++i) CHECK(in[i].g_vector.data[e] <= 0);
      CHECK(in[3].g_vector.data[e] == Approx(-5 * sig).epsilon(1e-5));
      CHECK(in[4].g_vector.data[e] == Approx(-2 * sig).epsilon(1e-5));
      CHECK(in[3].g_vector.data[e] > -5);
      if (sig > 0.99) continue;
      CHECK(in[1].g_vector.data[e] == Approx(std::log1p(-sig)).epsilon(1e-4));
      CHECK(in[2].g_vector.data[e] == Approx(4 * std::log1p(-sig)).epsilon(1e-4));
    }
    auto error_for = [&](const char* inputs) {
      Json b = base_config();
      b["inputs"] = Json::parse(inputs);
      return config_error(b);
    };
    std::string e = error_for(R"({"regime": "gaussian", "g": {"dist": "softplus_normal", "scale": 0}})");
    CHECK_THAT(e, Contains("inputs.g.scale: must be a number in [1e-6, 100] (exp(A_log)), got 0"));
    e = error_for(R"({"regime": "gaussian", "g": {"dist": "lower_bound_sigmoid_normal", "lower_bound": 5}})");
    CHECK_THAT(e, Contains("inputs.g.lower_bound: must be a number in [-100, -1e-6], got 5"));
    e = error_for(R"({"regime": "gaussian", "g": {"dist": "logsigmoid_normal", "scale": 2}})");
    CHECK_THAT(e, Contains("inputs.g.scale: unknown key 'scale'"));
    e = error_for(R"({"regime": "gaussian", "beta": {"dist": "softplus_normal"}})");
    CHECK_THAT(e, Contains("inputs.beta.dist: must be 'sigmoid_normal'"));
  }
  SECTION("bad distributions name the path, the value and what is allowed") {
    auto error_for = [&](const char* inputs) {
      Json j = base_config();
      j["inputs"] = Json::parse(inputs);
      return config_error(j);
    };
    std::string e = error_for(R"({"regime": "gaussian", "g": 0.5})");
    CHECK_THAT(e, Contains("inputs.g: must be a distribution {\"dist\": \"logsigmoid_normal\""));
    CHECK_THAT(e, Contains("got 0.5"));
    e = error_for(R"({"regime": "gaussian", "g": {"mean": -1}})");
    CHECK_THAT(e, Contains("inputs.g: missing key 'dist'"));
    CHECK_THAT(e, Contains("logsigmoid(z), z ~ N(mean, std^2)"));
    e = error_for(R"({"regime": "gaussian", "g": [{"dist": "logsigmoid_normal"}, {"dist": "normal"}]})");
    CHECK_THAT(e, Contains("inputs.g[1].dist: must be 'logsigmoid_normal'"));
    CHECK_THAT(e, Contains("got \"normal\""));
    e = error_for(R"({"regime": "gaussian", "beta": {"dist": "logsigmoid_normal"}})");
    CHECK_THAT(e, Contains("inputs.beta.dist: must be 'sigmoid_normal'"));
    e = error_for(R"({"regime": "gaussian", "g": {"dist": "logsigmoid_normal", "mean": 1000}})");
    CHECK_THAT(e, Contains("inputs.g.mean: must be a number in [-100, 100], got 1000"));
    e = error_for(R"({"regime": "gaussian", "beta": {"dist": "sigmoid_normal", "std": -1}})");
    CHECK_THAT(e, Contains("inputs.beta.std: must be a number in [0, 100], got -1"));
    e = error_for(R"({"regime": "gaussian", "g": {"dist": "logsigmoid_normal", "sd": 1}})");
    CHECK_THAT(e, Contains("inputs.g.sd: unknown key 'sd'"));
    CHECK_THAT(e, Contains("did you mean 'std'?"));
    e = error_for(
        R"([{"regime": "gaussian"}, {"regime": "gaussian", "beta": {"dist": "sigmoid_normal", "mean": "x"}}])");
    CHECK_THAT(e, Contains("inputs[1].beta.mean: must be a number in [-100, 100], got \"x\""));
  }
}

TEST_CASE("grad_accuracy_mode prices a recurrence's own fp64 gradient as O(n d^2), softmax's as O(n^2 d)",
          "[sweep][recurrent]") {
  using namespace attn;
  AccuracySettings a;  // grad_max_work 2^36
  // n = 16384, H = 8, d = 64: softmax's reference is 6 n^2 d = 1.0e11 per head (over the budget even for the
  // two sampled blocks); the delta rule's about 20 n d^2 = 1.3e9 per head, 1.1e10 for all eight.
  const std::string shape = ":B=1,H=8,Lq=16384,Lkv=16384,D=64,causal";
  CHECK(grad_accuracy_mode(parse_problem("naive" + shape), a) == "none");
  for (const char* v : {"retention", "simple_gla", "gla", "delta_rule", "gated_delta_rule"}) {
    INFO(v);
    CHECK(grad_accuracy_mode(parse_problem(v + shape), a) == "full");
    AccuracySettings sampled = a;
    sampled.reference = "sampled";
    CHECK(grad_accuracy_mode(parse_problem(v + shape), sampled) == "sampled");
    AccuracySettings small = a;
    small.grad_max_work = 1e10;  // below 20 n d^2 H = 1.07e10
    CHECK(grad_accuracy_mode(parse_problem(v + shape), small) == "none");
    small.grad_max_work = 1.1e10;
    CHECK(grad_accuracy_mode(parse_problem(v + shape), small) == "full");
  }
}

TEST_CASE("plan expansion: v_head_dim is an axis crossed with head_dim, equal widths are one point",
          "[sweep][config][value_dim]") {
  Json j = base_config();
  j["sweep"]["head_dim"] = {16, 32};
  j["sweep"]["v_head_dim"] = {16, 8};
  const auto plan = make_plan(parse_sweep_config(j, "cfg.json")).points;
  REQUIRE(plan.size() == 2 * 2 * 2);  // head_dim x v_head_dim x seq_len
  std::set<std::string> ids, keys;
  for (const auto& pt : plan) {
    ids.insert(pt.id);
    keys.insert(pt.input_key);
    const Problem& p = pt.problem;
    // v_head_dim equal to head_dim is stored as 0: the same point (and id) as without the axis.
    CHECK((p.v_head_dim == 0) == (p.value_dim() == p.head_dim));
    CHECK((pt.id.find(",Dv=") != std::string::npos) == p.distinct_value_dim());
    CHECK(parse_problem(p.repro()).value_dim() == p.value_dim());
  }
  CHECK(ids.size() == plan.size());
  CHECK(keys.size() == plan.size());  // another d_v is another input set (V's shape)
  CHECK(ids.count("naive:B=1,H=1,Lq=16,Lkv=16,D=16,gaussian(std=1),T=1") == 1);
  CHECK(ids.count("naive:B=1,H=1,Lq=16,Lkv=16,D=32,Dv=16,gaussian(std=1),T=1") == 1);

  SECTION("a bad value names its index") {
    Json k = base_config();
    k["sweep"]["v_head_dim"] = {8, 0};
    CHECK_THAT(config_error(k), Contains("sweep.v_head_dim[1]"));
  }
  SECTION("the tokens regime makes V head_dim wide: another d_v is a config error") {
    ScratchDir dir("sweepcfg");
    dir.write("sample.txt", "the quick brown fox\n");
    Json k = base_config();
    k["sweep"]["v_head_dim"] = 8;
    k["inputs"] = {{"regime", "tokens"}, {"text", "sample.txt"}};
    const std::string e = config_error(k, dir.file("cfg.json"));
    CHECK_THAT(e, Contains("sweep.v_head_dim"));
    CHECK_THAT(e, Contains("regime 'tokens'"));
    CHECK_THAT(e, Contains("v_head_dim 8"));
  }
}

TEST_CASE("memory: a recurrence's per-token inputs and a decode point's prefill count against memory_budget",
          "[sweep][config][recurrent]") {
  Json j = base_config();
  j["variants"] = {"gated_delta_rule"};
  j["sweep"] = {{"batch", 1},
                {"heads", 2},
                {"head_dim", 16},
                {"v_head_dim", 24},
                {"seq_q", 1},
                {"seq_kv", 4096},
                {"mask", "causal_lower_right"},
                {"threads", 1}};
  const SweepConfig c = parse_sweep_config(j, "cfg.json");
  const Plan plan = make_plan(c);
  REQUIRE(plan.points.size() == 1);
  const SweepPoint& pt = plan.points[0];
  REQUIRE(pt.problem.initial_state);  // a decode point runs from the state its prefill makes
  const PointMemory m = point_memory(pt, plan.config);
  // g and beta over the 4096 context tokens of 2 heads, 2 sink logits, the 16 x 24 state per head (fp32).
  CHECK(m.extra_inputs == (2 * 4096 + 2 * 4096 + 2 + 2 * 16 * 24) * sizeof(float));
  // The prefill of 4095 tokens holds at least its K (d 16), V (d 24), zero Q and output, g and beta.
  CHECK(m.prefill >= (4095 * 2 * (16 + 24) + 4095 * 2 * (16 + 24) + 2 * 4095 * 2) * sizeof(float));
  CHECK(m.need() >= m.call.total() + m.extra_inputs + m.prefill);
  // A budget that holds the call but not the prefill skips the point, naming the prefill.
  SweepConfig tight = plan.config;
  tight.memory_budget_bytes = m.need() - 1;
  const std::string why = skip_reason(pt, tight);
  CHECK_THAT(why, Contains("the decode state's prefill"));
  CHECK_THAT(why, Contains("per-token inputs"));
  tight.memory_budget_bytes = m.need();
  CHECK(skip_reason(pt, tight).empty());
}
