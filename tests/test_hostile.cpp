// Hostile inputs through the real user surfaces (the built `attnbench`: run, eval, layer, embed) and the
// in-process Problem checks. Each case asserts the exact outcome: the exit code, a message naming the field
// or file, the value and what is allowed, and that nothing was written (no output folder or file, earlier
// results untouched). Absurd sizes run under an address-space limit (RLIMIT_AS) to prove they are refused
// from their byte count, before anything is allocated. NaN/Inf inputs are counted and reported, never crash,
// and stay in their own rows. (test_cli.cpp, test_sweep_config.cpp, test_sweep_run.cpp and test_npy.cpp hold
// the simpler cases; this file does not repeat them.)
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bench/lib/plan.hpp"
#include "common/interface/attention.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/support/error.hpp"
#include "common/support/runtime.hpp"
#include "tests/support/attention_case.hpp"
#include "tests/support/process.hpp"
#include "tests/support/variant_tests.hpp"

using namespace attn;
using namespace attn::test;
using Catch::Matchers::Contains;

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// The dict NumPy writes, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }.
std::string npy_dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

// A version 1.0 .npy image: magic, header padded to 64 bytes, then `data`.
std::string npy_image(const std::string& dict, const std::string& data) {
  std::string padded = dict;
  padded.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
  padded.push_back('\n');
  std::string out = "\x93NUMPY\x01";
  out.push_back('\0');
  const uint16_t len = static_cast<uint16_t>(padded.size());
  out.append(reinterpret_cast<const char*>(&len), 2);
  return out + padded + data;
}

// A refusal: exit 2 (not a signal), every part in stderr, nothing on stdout.
void check_refused(const ProcResult& r, const std::vector<std::string>& parts) {
  INFO("exit " << r.code << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK_FALSE(r.signaled);
  CHECK(r.code == 2);
  for (const auto& part : parts) CHECK_THAT(r.err, Contains(part));
  CHECK(r.out.empty());
}

// A small valid sweep config; cases change one thing.
Json sweep_config() {
  return Json::parse(R"({
    "name": "hostile",
    "variants": ["naive"],
    "sweep": {"batch": 1, "heads": 2, "head_dim": 8, "seq_len": 16, "threads": 1},
    "measure": {"warmup": 0, "min_reps": 1, "max_reps": 1, "min_time_s": 0, "max_time_s": 1},
    "accuracy": {"reference": "full"},
    "memory_budget": "1GiB"
  })");
}

std::string sweep_config_text() {
  return sweep_config().dump(2) + "\n";
}

}  // namespace

TEST_CASE("run: malformed JSON exits 2 naming the file, line and column, and nothing is created",
          "[hostile]") {
  ScratchDir dir("hostile-json");
  const std::string good = sweep_config_text();
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  struct Case {
    std::string what, text;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"empty file", "", {"invalid JSON at line 1, column 1", "unexpected end of input"}},
      {"only whitespace", "\n\n  \n", {"invalid JSON at line 4, column 1"}},
      {"cut mid-object",
       good.substr(0, good.find("\"sweep\"")),
       {"invalid JSON at line 14, column 3", "unexpected end of input"}},
      {"trailing comma", "{\"name\": \"x\",\n}", {"invalid JSON at line 2, column 1"}},
      {"NaN literal", "{\"name\": \"x\",\n \"seed\": NaN}", {"invalid JSON at line 2, column 10"}},
      {"number out of range",
       "{\"name\": \"x\", \"seed\": 1e400}",
       {"invalid JSON: [json.exception.out_of_range.406] number overflow parsing '1e400'"}},
      {"binary bytes", std::string("\x93NUMPY\x01\x00{'descr'", 16), {"invalid JSON at line 1, column 1"}},
      {"two documents", "{}\n{}", {"invalid JSON at line 2, column 1"}},
      {"top-level array", "[1, 2]", {"config: must be an object, got [1,2]"}},
      {"top-level string", "\"all\"", {"config: must be an object, got \"all\""}},
      {"100000 nested arrays",
       "{\"name\": \"x\", \"variants\": " + deep + "}",
       {"JSON nested more than 64 levels deep (a config needs at most 6)"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string cfg = dir.file("config.json");
    write_text(cfg, c.text);
    const ProcResult r = run_attnbench({"run", cfg, "--out", dir.file("out")}, dir.path());
    std::vector<std::string> parts = c.parts;
    parts.push_back("'" + cfg + "'");
    check_refused(r, parts);
    CHECK(r.err.size() < 2000);  // a value is shown, not echoed whole
    CHECK_FALSE(fs::exists(dir.path() / "out"));
    CHECK_FALSE(fs::exists(dir.path() / "results"));
  }
}

namespace {

struct ConfigErrorCase {
  std::string what;
  std::function<void(Json&)> change;
  std::vector<std::string> parts;
};

// Wrong JSON types and values out of range in the config's own fields.
std::vector<ConfigErrorCase> config_type_and_range_cases() {
  const std::string max_size = "2^40 = 1099511627776";
  return {
      {"name of the wrong type", [](Json& j) { j["name"] = 5; }, {"name: must be 1-64 characters", "got 5"}},
      {"variants a number", [](Json& j) { j["variants"] = 5; }, {"variants: must be \"all\" or", "got 5"}},
      {"variant entry a number",
       [](Json& j) {
         j["variants"] = {"naive", 3};
       },
       {"variants[1]: must be a variant name or", "got 3"}},
      {"sweep a list", [](Json& j) { j["sweep"] = Json::array(); }, {"sweep: must be an object, got []"}},
      {"seq_len a boolean",
       [](Json& j) { j["sweep"]["seq_len"] = true; },
       {"sweep.seq_len: must be a positive integer, got true"}},
      {"seq_len null",
       [](Json& j) { j["sweep"]["seq_len"] = nullptr; },
       {"sweep.seq_len: must be a positive integer, got null"}},
      {"seq_len a string",
       [](Json& j) {
         j["sweep"]["seq_len"] = {16, "32"};
       },
       {"sweep.seq_len[1]: must be a positive integer, got \"32\""}},
      {"seq_len 2^41",
       [](Json& j) { j["sweep"]["seq_len"] = int64_t{1} << 41; },
       {"sweep.seq_len: must be a positive integer at most " + max_size + ", got 2199023255552"}},
      {"head_dim 1e300",
       [](Json& j) { j["sweep"]["head_dim"] = 1e300; },
       {"sweep.head_dim: must be a positive integer at most " + max_size + ", got 1e+300"}},
      {"heads 2^64 - 1",
       [](Json& j) { j["sweep"]["heads"] = std::numeric_limits<uint64_t>::max(); },
       {"sweep.heads: must be a positive integer at most " + max_size + ", got 18446744073709551615"}},
      {"batch -1",
       [](Json& j) { j["sweep"]["batch"] = -1; },
       {"sweep.batch: must be a positive integer, got -1"}},
      // Parsing refuses what no machine allows; the plan then refuses more threads than this one has.
      {"threads 0",
       [](Json& j) { j["sweep"]["threads"] = 0; },
       {"sweep.threads: must be a positive integer, got 0"}},
      {"threads above the cores available",
       [](Json& j) { j["sweep"]["threads"] = available_threads() + 1; },
       {"sweep.threads: must be an integer in [1, " + std::to_string(available_threads()) + "]",
        "(the cores available), got " + std::to_string(available_threads() + 1)}},
      {"dropout 1",
       [](Json& j) { j["sweep"]["dropout"] = 1.0; },
       {"sweep.dropout: must be a probability in [0, 1), got 1.0"}},
      {"seed -1", [](Json& j) { j["seed"] = -1; }, {"seed: must be an integer in [0, 2^53], got -1"}},
      {"seed 0.5", [](Json& j) { j["seed"] = 0.5; }, {"seed: must be an integer in [0, 2^53], got 0.5"}},
      {"memory_budget 0",
       [](Json& j) { j["memory_budget"] = 0; },
       {"memory_budget: must be ", "bytes", "got 0"}},
      {"memory_budget in furlongs",
       [](Json& j) { j["memory_budget"] = "8 furlongs"; },
       {"memory_budget: must be bytes as a number or a string like", "got \"8 furlongs\""}},
      {"accuracy.rows 0",
       [](Json& j) { j["accuracy"]["rows"] = 0; },
       {"accuracy.rows: must be an integer in [1, 1048576], got 0"}},
      {"std 0",
       [](Json& j) {
         j["inputs"] = {{"regime", "gaussian"}, {"std", 0}};
       },
       {"inputs.std: must be a standard deviation in [1e-6, 1000], got 0"}},
  };
}

// Unknown variants and parameters, parameter values, and sizes no machine can hold.
std::vector<ConfigErrorCase> config_variant_and_size_cases() {
  return {
      {"unknown variant",
       [](Json& j) { j["variants"] = {"flash"}; },
       {"variants[0]: unknown variant 'flash'", "registered: "}},
      {"unknown parameter",
       [](Json& j) { j["variants"] = Json::parse(R"([{"name": "linear", "params": {"chunks": 8}}])"); },
       {"variants[0].params: unknown parameter 'chunks'", "did you mean 'chunk'?"}},
      {"window -1",
       [](Json& j) {
         j["variants"] = Json::parse(R"([{"name": "sliding_window", "params": {"window": -1}}])");
       },
       {"variants[0].params.window", "must be an integer in [0, 1073741824], got -1"}},
      {"dilation 0",
       [](Json& j) {
         j["variants"] = Json::parse(R"([{"name": "sliding_window", "params": {"dilation": 0}}])");
       },
       {"variants[0].params.dilation", "must be an integer in [1, 1073741824], got 0"}},
      {"duplicate global tokens",
       [](Json& j) {
         j["variants"] = Json::parse(
             R"(["naive", {"name": "sliding_window", "params": {"global_tokens": [[3, 1, 3]]}}])");
       },
       {"variants[1].params", "parameter 'global_tokens': index 3 is listed more than once",
        "list each global position once"}},
      // batch x heads x seq x head_dim = 2^20 x 2^20 x 2^20 x 16 = 2^64: wraps to 0 in 64-bit arithmetic.
      {"element count 2^64",
       [](Json& j) {
         j["sweep"]["batch"] = 1 << 20, j["sweep"]["heads"] = 1 << 20, j["sweep"]["seq_len"] = 1 << 20;
         j["sweep"]["head_dim"] = 16;
       },
       {"sweep: point 'naive:B=1048576,H=1048576,Lq=1048576,Lkv=1048576,D=16",
        "batch x heads x seq_q x head_dim (the elements of Q and the output) = 1048576 x 1048576 x 1048576 x "
        "16",
        "must be at most 2^58"}},
      {"element count 2^160",
       [](Json& j) {
         j["sweep"]["batch"] = int64_t{1} << 40, j["sweep"]["heads"] = int64_t{1} << 40;
         j["sweep"]["seq_q"] = 1, j["sweep"]["seq_kv"] = int64_t{1} << 40,
         j["sweep"]["head_dim"] = int64_t{1} << 40;
         j["sweep"].erase("seq_len");
         j["variants"] = {"linear"};
       },
       {"batch x heads x seq_q x head_dim (the elements of Q and the output) = 1099511627776 x 1099511627776 "
        "x 1 x "
        "1099511627776",
        "must be at most 2^58 = 288230376151711744"}},
  };
}

}  // namespace

TEST_CASE(
    "run: wrong types and out-of-range values name the JSON path, the value and what is allowed, "
    "nothing is created and earlier results survive --force",
    "[hostile]") {
  ScratchDir dir("hostile-config");
  // Earlier results in the output folder: a refused config must leave them exactly as they were, even with
  // --force (validation comes before the folder is touched).
  const fs::path out = dir.path() / "out";
  fs::create_directories(out);
  write_text(out / "results.jsonl", "{\"id\": \"earlier\", \"status\": \"ok\"}\n");
  write_text(out / "meta.json", "{\"config_hash\": \"0\"}\n");
  const auto before = snapshot(out);

  std::vector<ConfigErrorCase> cases = config_type_and_range_cases();
  for (ConfigErrorCase& c : config_variant_and_size_cases()) cases.push_back(std::move(c));
  for (const ConfigErrorCase& c : cases) {
    INFO(c.what);
    Json j = sweep_config();
    c.change(j);
    const std::string cfg = dir.file("config.json");
    write_text(cfg, j.dump(2) + "\n");
    const ProcResult r = run_attnbench({"run", cfg, "--out", out.string(), "--force"}, dir.path());
    std::vector<std::string> parts = c.parts;
    parts.push_back("attnbench: error: config '" + cfg + "': ");
    check_refused(r, parts);
    CHECK(snapshot(out) == before);
    CHECK_FALSE(fs::exists(dir.path() / "results"));
  }
}

TEST_CASE("run: seq_len 10^12 is skipped with the bytes it needs, before allocating (address space capped)",
          "[hostile]") {
  ScratchDir dir("hostile-huge-sweep");
  Json j = sweep_config();
  j["variants"] = "all";
  j["sweep"] = {{"batch", 1}, {"heads", 8}, {"head_dim", 64}, {"seq_len", 1000000000000LL}, {"threads", 1}};
  j["accuracy"] = {{"reference", "auto"}, {"rows", 64}};
  j.erase("memory_budget");  // the default: half the physical memory
  const std::string cfg = dir.file("huge.json");
  write_text(cfg, j.dump(2) + "\n");
  const fs::path out = dir.path() / "out";
  // 4 GiB of address space: enough for the sgemm calibration and the libraries, nothing like the 6 PB of
  // these inputs. An allocation attempt would end in std::bad_alloc ("failed" rows) or the OOM killer.
  const ProcResult r = run_attnbench({"run", cfg, "--out", out.string()}, ProcOptions{dir.path(), 4 * kGiB});
  INFO("exit " << r.code << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK_FALSE(r.signaled);
  REQUIRE(r.code == 0);
  const SweepConfig config = load_sweep_config(cfg);
  const std::vector<SweepPoint> plan = make_plan(config).points;
  REQUIRE(plan.size() == Registry::instance().all().size());
  std::map<std::string, Json> rows;
  for (const auto& line : [&] {
         std::vector<std::string> v;
         std::istringstream in(slurp(out / "results.jsonl"));
         for (std::string l; std::getline(in, l);) v.push_back(l);
         return v;
       }())
    rows[Json::parse(line).at("id").get<std::string>()] = Json::parse(line);
  REQUIRE(rows.size() == plan.size());
  const uint64_t q = uint64_t{8} * 64 * 1000000000000ULL;  // elements of Q, K, V and the output
  for (const SweepPoint& pt : plan) {
    const Json& row = rows.at(pt.id);
    INFO(row.dump(2));
    CHECK(row.at("status") == "skipped");
    const Json& mem = row.at("memory");
    CHECK(mem.at("inputs_bytes") == 3 * q * 4);
    // 64 sampled rows in fp64 + fp32; a variant compared with its own definition (the recurrences) also holds
    // that definition's every output row in fp64.
    const Attention& variant = Registry::instance().get(pt.problem.variant);
    const uint64_t reference =
        uint64_t{8} * 64 * 64 * 12 + (variant.capabilities().own_definition ? q * sizeof(double) : 0);
    CHECK(mem.at("reference_bytes") == reference);
    const uint64_t workspace = variant.workspace_bytes(pt.problem, 1);
    CHECK(mem.at("workspace_bytes") == workspace);
    uint64_t need = 0;
    // Besides Q, K, V, O, the reference and the workspace: the per-head sink logits every point draws (fp32).
    const uint64_t sinks = 8 * sizeof(float);
    const bool wraps = __builtin_add_overflow(3 * q * 4 + q * 4 + reference + sinks, workspace, &need);
    const std::string reason = row.at("reason");
    // A variant that cannot run the problem at all (the recurrences need the causal mask) says so first.
    if (const std::string why = variant.unsupported_reasons_text(pt.problem); !why.empty()) {
      CHECK_THAT(reason, Contains(why));
      continue;
    }
    CHECK_THAT(reason, Contains((wraps ? "needs at least " + std::to_string(UINT64_MAX)
                                       : "needs " + std::to_string(need)) +
                                " bytes ("));
    CHECK_THAT(reason, Contains("inputs 5.457 PiB"));
    CHECK_THAT(reason, Contains(") > memory_budget "));
    CHECK(row.at("time_ms").at("median").is_null());
  }
}

TEST_CASE("eval: .npy headers claiming absurd sizes are refused with the bytes they need, before allocating",
          "[hostile]") {
  ScratchDir dir("hostile-huge-eval");
  const FloatArray small = normal_tensor({1, 1, 4, 1}, 1);
  const std::string k = dir.file("k.npy"), v = dir.file("v.npy"), o = dir.file("o.npy");
  write_npy(k, small);
  write_npy(v, small);
  struct Case {
    std::string what, shape;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      // seq 10^12 with head_dim 1: 4 TB of float32 data the file does not hold.
      {"seq 10^12",
       "(1, 1, 1000000000000, 1)",
       {"truncated: shape [1, 1, 1000000000000, 1] of <f4 needs 4000000000000 data bytes, the file has 0"}},
      // 8 x 64 x 10^12 elements: over the reader's 2^40-element limit, refused from the header alone.
      {"seq 10^12, 8 heads of 64",
       "(1, 8, 1000000000000, 64)",
       {"shape (1, 8, 1000000000000, 64) is absurdly large", "512000000000000 elements",
        "2048000000000000 bytes of <f4", "at most 2^40 = 1099511627776 elements"}},
      // 2^32 x 2^32 x 2^32 x 2^32 wraps to 0 in 64-bit arithmetic.
      {"element count 2^128", "(4294967296, 4294967296, 4294967296, 4294967296)", {"is absurdly large"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string q = dir.file("q_huge.npy");
    write_text(q, npy_image(npy_dict("<f4", c.shape), ""));
    write_text(o, "earlier output");
    const ProcResult r =
        run_attnbench({"eval", "--variant", "tiled", "--q", q, "--k", k, "--v", v, "--out", o, "--compare"},
                      ProcOptions{dir.path(), 1 * kGiB});
    std::vector<std::string> parts = c.parts;
    parts.push_back("file '" + q + "'");
    check_refused(r, parts);
    CHECK(slurp(o) == "earlier output");
  }
}

TEST_CASE("eval: a quadratic workspace beyond physical memory is refused with its bytes, before allocating",
          "[hostile]") {
  // Q, K, V of 2^20 positions with head_dim 1 are 4 MiB files; naive's score buffer for them is 4 TiB.
  ScratchDir dir("hostile-quadratic");
  const int64_t n = int64_t{1} << 20;
  const FloatArray x = normal_tensor({1, 1, n, 1}, 2);
  const std::string qkv = dir.file("x.npy"), o = dir.file("o.npy");
  write_npy(qkv, x);
  Problem p = make_problem("naive");
  p.batch = p.heads = p.head_dim = 1;
  p.seq_q = p.seq_kv = n;
  const std::size_t workspace = Registry::instance().get("naive").workspace_bytes(p, 1);
  const std::size_t need = workspace + static_cast<std::size_t>(n) * (4 + 8);
  const std::size_t physical =
      static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::size_t>(sysconf(_SC_PAGE_SIZE));
  REQUIRE(need > physical);
  const ProcResult r = run_attnbench({"--threads", "1", "eval", "--variant", "naive", "--q", qkv, "--k", qkv,
                                      "--v", qkv, "--out", o, "--compare"},
                                     ProcOptions{dir.path(), 2 * kGiB});
  check_refused(r, {"attnbench: not supported: naive:B=1,H=1,Lq=1048576,Lkv=1048576,D=1: needs " +
                        std::to_string(need) + " bytes (",
                    "output 4.000 MiB, workspace 4.000 TiB, fp64 reference 8.000 MiB) beyond the inputs",
                    "more than the " + std::to_string(physical) + " bytes"});
  CHECK_FALSE(fs::exists(o));
}

TEST_CASE("eval: truncated, foreign, empty and mismatched .npy inputs exit 2 naming the option or file",
          "[hostile]") {
  ScratchDir dir("hostile-npy");
  const AttentionCase base(make_test_problem("tiled", 2, 2, 6, 6, 8), 3);
  const CaseFiles files = base.write_files(dir);
  const std::string qp = files.q, kp = files.k, vp = files.v;
  const std::string whole = npy_bytes(base.k);
  auto file = [&](const std::string& name, const std::string& bytes) {
    write_text(dir.path() / name, bytes);
    return dir.file(name);
  };
  auto array_file = [&](const std::string& name, std::vector<int64_t> shape) {
    write_npy(dir.file(name), normal_tensor(std::move(shape), 6));
    return dir.file(name);
  };
  std::vector<double> big(96, 0.5);
  big[17] = 1e39;
  const std::string f8_overflow =
      file("q_f8.npy", npy_image(npy_dict("<f8", "(2, 2, 6, 4)"),
                                 std::string(reinterpret_cast<const char*>(big.data()), big.size() * 8)));
  struct Case {
    std::string what;
    std::vector<std::string> args, parts;
  };
  const std::string f4_data(2 * 2 * 6 * 8 * 4, '\0');
  const std::vector<Case> cases = {
      {"K cut mid-data",
       {"--k", file("k_cut.npy", whole.substr(0, whole.size() - 100))},
       {"k_cut.npy", "truncated: shape [2, 2, 6, 8] of <f4 needs 768 data bytes, the file has 668"}},
      {"V cut inside the header",
       {"--v", file("v_cut.npy", whole.substr(0, 30))},
       {"v_cut.npy", "truncated .npy header"}},
      {"Q an empty file", {"--q", file("q_empty.npy", "")}, {"q_empty.npy", "not a .npy file"}},
      {"Q of int32",
       {"--q", file("q_i4.npy", npy_image(npy_dict("<i4", "(2, 2, 6, 8)"), f4_data))},
       {"q_i4.npy", "dtype '<i4' is not allowed here (float32 '<f4' or float64 '<f8')"}},
      {"Q of float16",
       {"--q", file("q_f2.npy", npy_image(npy_dict("<f2", "(2, 2, 6, 8)"), f4_data))},
       {"q_f2.npy", "dtype '<f2' (float16)", "needs --dtype fp16", "got --dtype fp32"}},
      {"K big-endian",
       {"--k", file("k_be.npy", npy_image(npy_dict(">f4", "(2, 2, 6, 8)"), f4_data))},
       {"k_be.npy", "big-endian"}},
      {"V in Fortran order",
       {"--v", file("v_f.npy", npy_image(npy_dict("<f4", "(2, 2, 6, 8)", true), f4_data))},
       {"v_f.npy", "Fortran order"}},
      {"Q float64 beyond float32", {"--q", f8_overflow}, {"q_f8.npy", "element 17", "overflows float32"}},
      {"Q of rank 5",
       {"--q", array_file("q5.npy", {1, 2, 2, 6, 8})},
       {"--q '" + dir.file("q5.npy") +
        "': rank 5 [1, 2, 2, 6, 8]; expected rank 4 [batch, heads, seq_q, head_dim]"}},
      {"Q a scalar", {"--q", array_file("q0.npy", {})}, {"--q '" + dir.file("q0.npy") + "': rank 0 []"}},
      {"K of rank 2",
       {"--k", array_file("k2.npy", {12, 8})},
       {"--k '" + dir.file("k2.npy") +
        "': rank 2 [12, 8]; expected rank 4 [batch, kv_heads, seq_kv, head_dim]"}},
      {"Q with no rows",
       {"--q", array_file("q_seq0.npy", {2, 2, 0, 8})},
       {"--q '" + dir.file("q_seq0.npy") +
        "': shape [2, 2, 0, 8] is empty; every extent of [batch, heads, seq_q, head_dim] must be >= 1"}},
      {"K with head_dim 0",
       {"--k", array_file("k_d0.npy", {2, 2, 6, 0}), "--v", array_file("v_d0.npy", {2, 2, 6, 0})},
       {"--k '" + dir.file("k_d0.npy") + "': shape [2, 2, 6, 0] is empty"}},
      {"K of another batch",
       {"--k", array_file("k_b1.npy", {1, 2, 6, 8})},
       {"--k '" + dir.file("k_b1.npy") + "': shape [1, 2, 6, 8] does not fit --q '" + qp +
        "' shape [2, 2, 6, 8]: batch 1 != Q's batch 2; K must be [batch, kv_heads, seq_kv, head_dim] "
        "with Q's batch 2 and head_dim 8, and kv_heads dividing Q's heads 2 (1 or 2); V [batch, kv_heads, "
        "seq_kv, d_v]"}},
      {"K with heads not dividing Q's",
       {"--k", array_file("k_h3.npy", {2, 3, 6, 8})},
       {"--k '" + dir.file("k_h3.npy") + "': shape [2, 3, 6, 8] does not fit --q '" + qp +
        "' shape [2, 2, 6, 8]: kv_heads 3 does not divide Q's heads 2"}},
      {"V of another batch",
       {"--v", array_file("v_b3.npy", {3, 2, 6, 8})},
       {"--v '" + dir.file("v_b3.npy") + "': shape [3, 2, 6, 8] does not fit --k '" + kp +
        "' shape [2, 2, 6, 8] (V must be [batch, kv_heads, seq_kv, d_v] with K's first three extents"}},
      {"V of another head_dim for a variant without value_dim",
       {"--variant", "sliding_window", "--v", array_file("v_d4.npy", {2, 2, 6, 4})},
       {"not supported: sliding_window", "needs V as wide as Q and K (got v_head_dim 4 != head_dim 8)"}},
      {"K and V longer than Q for a self-attention-only variant",
       {"--variant", "sliding_window", "--k", array_file("k_7.npy", {2, 2, 7, 8}), "--v",
        array_file("v_7.npy", {2, 2, 7, 8})},
       {"attnbench: not supported: sliding_window",
        "sliding_window does not support cross-attention (seq_q 6 != seq_kv 7)"}},
  };
  const std::string out = dir.file("o.npy");
  for (const Case& c : cases) {
    INFO(c.what);
    // Defaults, overridden by the case's own --variant/--q/--k/--v.
    std::map<std::string, std::string> opt = {{"--variant", "tiled"}, {"--q", qp}, {"--k", kp}, {"--v", vp}};
    for (std::size_t i = 0; i + 1 < c.args.size(); i += 2) opt[c.args[i]] = c.args[i + 1];
    std::vector<std::string> args{"eval"};
    for (const auto& [k_, v_] : opt) args.insert(args.end(), {k_, v_});
    args.insert(args.end(), {"--out", out, "--compare"});
    write_text(out, "earlier output");
    check_refused(run_attnbench(args, dir.path()), c.parts);
    CHECK(slurp(out) == "earlier output");
    CHECK_FALSE(fs::exists(out + ".tmp"));
  }
}

TEST_CASE("eval: variant parameters out of range, window 0, dilation 0 and duplicate global tokens",
          "[hostile]") {
  ScratchDir dir("hostile-params");
  const AttentionCase base(make_test_problem("naive", 1, 2, 6, 6, 8), 7);
  const CaseFiles files = base.write_files(dir);
  const FloatArray& v = base.v;
  const std::string qp = files.q, kp = files.k, vp = files.v, out = dir.file("o.npy");
  auto eval = [&](const std::string& variant, const std::vector<std::string>& params) {
    std::vector<std::string> args{"eval", "--variant", variant, "--q",   qp, "--k",
                                  kp,     "--v",       vp,      "--out", out};
    for (const auto& kv : params) args.insert(args.end(), {"--param", kv});
    return run_attnbench(args, dir.path());
  };
  const std::string sw = "--param for variant 'sliding_window': parameter ";
  struct Case {
    std::string variant;
    std::vector<std::string> params, parts;
  };
  const std::vector<Case> cases = {
      {"sliding_window", {"window=-1"}, {sw + "'window': must be an integer in [0, 1073741824], got -1"}},
      {"sliding_window",
       {"window=1073741825"},
       {sw + "'window': must be an integer in [0, 1073741824], got 1073741825"}},
      {"sliding_window",
       {"window=99999999999999999999"},
       {sw + "'window': must be an integer in [0, 1073741824], got 1e+20"}},
      {"sliding_window", {"window=wide"}, {sw + "'window': must be an integer, got 'wide'"}},
      {"sliding_window", {"dilation=0"}, {sw + "'dilation': must be an integer in [1, 1073741824], got 0"}},
      {"sliding_window",
       {"global_tokens=3,1,3"},
       {"variant 'sliding_window': parameter 'global_tokens': index 3 is listed more than once; list each "
        "global "
        "position once"}},
      {"sliding_window",
       {"global_tokens=1;-2"},
       {sw + "'global_tokens'[1]: must be an integer >= 0, got -2"}},
      {"sliding_window",
       {"global_tokens=0,9"},
       {"attnbench: not supported: ",
        "sliding_window: global_tokens index 9 is not a position of a 6-long sequence "
        "(indices must be < seq)"}},
      {"sliding_window", {"window=2", "window=3"}, {"--param: 'window' given twice"}},
      {"linear",
       {"feature_map=tanh"},
       {"--param for variant 'linear': parameter 'feature_map': must be one of {", "got \"tanh\""}},
      {"naive", {"window=4"}, {"unknown parameter 'window'; this variant takes no parameters"}},
      {"flash", {}, {"unknown variant 'flash'", "registered: "}},
  };
  for (const Case& c : cases) {
    INFO(c.variant << " " << Json(c.params).dump());
    write_text(out, "earlier output");
    check_refused(eval(c.variant, c.params), c.parts);
    CHECK(slurp(out) == "earlier output");
  }

  SECTION("window 0 is allowed: each position attends only itself, so the output is V exactly") {
    fs::remove(out);
    const ProcResult r = eval("sliding_window", {"window=0"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    const FloatArray o = read_npy_float(out);
    REQUIRE(o.shape == v.shape);
    CHECK(std::memcmp(o.ptr(), v.ptr(), v.numel() * sizeof(float)) == 0);
  }
  SECTION("window 0 in a sweep runs (status ok) and is measured against its own exact definition") {
    Json j = sweep_config();
    j["variants"] = Json::parse(R"([{"name": "sliding_window", "params": {"window": 0}}])");
    const std::string cfg = dir.file("w0.json");
    write_text(cfg, j.dump());
    const ProcResult r = run_attnbench({"run", cfg, "--out", dir.file("w0")}, dir.path());
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    const Json row = Json::parse(slurp(dir.path() / "w0" / "results.jsonl"));
    CHECK(row.at("status") == "ok");
    CHECK(row.at("accuracy").at("nan_count") == 0);
    CHECK(row.at("accuracy").at("max_abs_err").get<double>() > 0);  // one key per row is far from softmax
  }
}

TEST_CASE("layer and embed: heads not dividing d_model, absurd sizes and non-finite inputs", "[hostile]") {
  ScratchDir dir("hostile-frontends");
  const std::string weights = dir.file("w");
  fs::create_directories(weights);
  for (const char* name : {"w_q", "w_k", "w_v", "w_o"})
    write_npy(dir.file(std::string("w/") + name + ".npy"), normal_tensor({8, 8}, 10));
  FloatArray x = normal_tensor({1, 5, 8}, 11);
  const std::string xp = dir.file("x.npy"), out = dir.file("y.npy"), text = dir.file("t.txt");
  write_npy(xp, x);
  x.data[13] = std::numeric_limits<float>::quiet_NaN();
  const std::string xnan = dir.file("x_nan.npy");
  write_npy(xnan, x);
  write_text(text, "the cat sat on the mat\n");
  struct Case {
    std::string what;
    std::vector<std::string> args, parts;
  };
  const std::vector<Case> cases = {
      {"3 heads for E = 8",
       {"layer", "--x", xp, "--weights", weights, "--heads", "3"},
       {"--heads 3: must be >= 1 and divide E = 8 (from '" + weights + "/w_v.npy')"}},
      {"0 heads",
       {"layer", "--x", xp, "--weights", weights, "--heads", "0"},
       {"--heads 0: must be >= 1 and divide E = 8"}},
      {"NaN in x",
       {"layer", "--x", xnan, "--weights", weights, "--heads", "2"},
       {"--x '" + xnan + "': non-finite value at flat index 13; inputs must be finite"}},
      {"unknown core variant",
       {"layer", "--x", xp, "--weights", weights, "--heads", "2", "--variant", "flash"},
       {"unknown variant 'flash'"}},
      {"d_model 10^12",
       {"embed", "--text", text, "--vocab-size", "10", "--d-model", "1000000000000", "--seed", "1"},
       {"seeded embedding: a table of 11 x 1000000000000 values is outside the allowed 1 .. 2^30 elements"}},
      {"vocab 10^12",
       {"embed", "--text", text, "--vocab-size", "1000000000000", "--d-model", "64", "--seed", "1"},
       {"seeded embedding: a table of 1073741825 x 64 values is outside the allowed 1 .. 2^30 elements"}},
      {"d_model 0",
       {"embed", "--text", text, "--vocab-size", "10", "--d-model", "0", "--seed", "1"},
       {"--d-model 0: must be >= 1"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--out", out});
    const ProcResult r = run_attnbench(args, ProcOptions{dir.path(), 2 * kGiB});
    check_refused(r, c.parts);
    CHECK_FALSE(fs::exists(out));
  }
}

TEST_CASE("Problem::validate refuses size products that overflow 64 bits instead of wrapping", "[hostile]") {
  auto refused = [](Problem p) -> std::string {
    try {
      p.validate();
    } catch (const UsageError& e) {
      return e.what();
    }
    return "accepted";
  };
  Problem p = make_problem("naive");
  p.batch = p.heads = p.seq_q = p.seq_kv = int64_t{1} << 20;
  p.head_dim = 16;  // 2^64 elements: exactly 0 after wrapping
  CHECK_THAT(refused(p),
             Contains("batch x heads x seq_q x head_dim (the elements of Q and the output) = 1048576 x "
                      "1048576 x 1048576 x 16 = 1.84467e+19: must be at most 2^58"));
  p.seq_q = 1;  // Q is small; K and V still 2^64
  CHECK_THAT(refused(p),
             Contains("batch x heads x seq_kv x head_dim (the elements of K and V) = 1048576 x 1048576 x "
                      "1048576 x 16"));
  // The limit itself: 2^58 elements pass, one more row does not.
  p = make_problem("naive");
  p.batch = 1, p.heads = 1, p.seq_q = p.seq_kv = int64_t{1} << 40, p.head_dim = int64_t{1} << 18;
  CHECK(refused(p) == "accepted");
  p.heads = 2;
  CHECK_THAT(refused(p), Contains("must be at most 2^58 = 288230376151711744"));
  // seq_len 10^12 at 8 heads of 64 is a valid problem: the memory budget, not validation, refuses it.
  p = make_problem("naive");
  p.heads = 8, p.head_dim = 64, p.seq_q = p.seq_kv = 1000000000000;
  CHECK(refused(p) == "accepted");
  CHECK(p.q_elements() == 512000000000000);
  // Repro strings (the gbench names, --filter ids) go through the same check.
  CHECK_THROWS_WITH(parse_problem("naive:B=1048576,H=1048576,Lq=1048576,Lkv=1048576,D=16"),
                    Contains("must be at most 2^58"));
}

namespace {

constexpr int64_t kNanB = 2, kNanH = 2, kNanL = 40, kNanD = 16, kPadded = 35;  // batch 0 pads keys 35..39

struct Poison {
  std::string what;
  char tensor;  // 'q', 'k' or 'v'
  int64_t b, h, row, d;
  float value;
};

std::size_t nan_at(int64_t b, int64_t h, int64_t i, int64_t d) {
  return static_cast<std::size_t>(((b * kNanH + h) * kNanL + i) * kNanD + d);
}

// Row by row: non-finite where the poison reaches, bitwise unchanged (against o_clean) where it must not.
void check_poison_reach(const FloatArray& o, const FloatArray& o_clean, const Poison& p,
                        const std::string& mask, bool mixes_queries) {
  const int64_t B = kNanB, H = kNanH, L = kNanL, D = kNanD;
  auto at = nan_at;
  const bool padded = mask == "pad" && p.b == 0 && p.row >= kPadded;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        const bool same_slice = b == p.b && h == p.h;
        bool reached = false, untouched = !same_slice;
        // An infinite query component need not give NaN: linear's feature map sends -Inf to 0.
        if (same_slice && p.tensor == 'q')
          reached = i == p.row && std::isnan(p.value), untouched = i != p.row && !mixes_queries;
        if (same_slice && p.tensor == 'k') {
          reached = !padded && (mask != "causal" || i >= p.row);
          untouched = !reached;
        }
        if (same_slice && p.tensor == 'v') reached = !padded && (mask != "causal" || i >= p.row);
        bool finite = true;
        for (int64_t d = 0; d < D; ++d) finite = finite && std::isfinite(o.data[at(b, h, i, d)]);
        INFO("output row [" << b << ", " << h << ", " << i << "]");
        if (reached) CHECK_FALSE(finite);
        if (untouched)
          CHECK(std::memcmp(o.ptr() + at(b, h, i, 0), o_clean.ptr() + at(b, h, i, 0), D * sizeof(float)) ==
                0);
      }
}

}  // namespace

TEST_CASE("eval --compare with NaN/Inf inputs: counts reported, no crash, the poison stays where documented",
          "[hostile]") {
  // docs/numerics.md, "Non-finite inputs": a NaN/Inf in query row i makes output row i NaN and nothing else;
  // in key j, exactly the rows that may attend j (causal: rows >= j; a padded key: none); in value j, rows of
  // its own (batch, head) only. Every registered variant, unmasked, causal and with key padding where
  // supported.
  ScratchDir dir("hostile-nan");
  const int64_t B = kNanB, H = kNanH, L = kNanL, D = kNanD;
  AttentionCase base(make_test_problem("naive", B, H, L, L, D), 21);
  base.pad_keys([&](int64_t b, int64_t j) { return b == 0 && j >= kPadded; });
  const CaseFiles files = base.write_files(dir);
  const FloatArray &q = base.q, &k = base.k, &v = base.v;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto at = nan_at;
  const std::string qp = files.q, kp = files.k, vp = files.v, padp = files.pad;
  const std::vector<Poison> poisons = {
      {"NaN in query row 7", 'q', 1, 0, 7, 3, nan},           {"+Inf in query row 0", 'q', 0, 1, 0, 0, inf},
      {"-Inf in query row 39", 'q', 0, 0, 39, 15, -inf},      {"NaN in key 5", 'k', 0, 1, 5, 2, nan},
      {"NaN in (padded) key 35", 'k', 0, 1, kPadded, 0, nan}, {"-Inf in value 9", 'v', 1, 1, 9, 4, -inf},
      {"NaN in (padded) value 37", 'v', 0, 0, 37, 1, nan},
  };
  int checked = 0, expected = 0;
  for (const Attention* variant : Registry::instance().all()) {
    const Capabilities caps = variant->capabilities();
    // The recurrences (gate / beta / state) are left out: a NaN in key or value j reaches every later row
    // through their state, a rule docs/numerics.md does not state for them (the refusals of their own inputs,
    // eval --g / --beta / --initial-state, are the last test case here).
    if (caps.state || caps.gate != Gate::none || caps.beta) continue;
    // An indexer reads index inputs of its own (eval --index-q/k/w): tests/test_determinism.cpp runs it
    // through eval, tests/test_dsa.cpp and `attnbench check` on its own inputs.
    if (caps.indexer) continue;
    // Every variant runs the poisons with no mask, and with causal and key padding where it claims them.
    expected += static_cast<int>(poisons.size()) * (1 + caps.causal + caps.key_padding);
    for (const std::string mask : {"none", "causal", "pad"}) {
      if ((mask == "causal" && !caps.causal) || (mask == "pad" && !caps.key_padding)) continue;
      auto eval = [&](const std::string& qf, const std::string& kf, const std::string& vf,
                      const std::string& of) {
        std::vector<std::string> args{"eval", "--variant", variant->name(), "--q", qf,         "--k", kf,
                                      "--v",  vf,          "--out",         of,    "--compare"};
        if (mask == "causal") args.push_back("--causal");
        if (mask == "pad") args.insert(args.end(), {"--key-padding", padp});
        return run_attnbench(args, dir.path());
      };
      const ProcResult clean = eval(qp, kp, vp, dir.file("o_clean.npy"));
      REQUIRE(clean.code == 0);
      CHECK(Json::parse(clean.out).at("nonfinite_inputs") == 0);
      const FloatArray o_clean = read_npy_float(dir.file("o_clean.npy"));
      // Does an output row depend on other query rows (nystrom's landmarks are means of query segments)? A
      // finite change of one query element answers it; such a variant's query poison may reach every row of
      // its (batch, head) slice, and only the other slices must stay bitwise unchanged.
      bool mixes_queries = false;
      {
        FloatArray nudged = q;
        nudged.data[at(1, 0, 7, 3)] += 0.5f;
        const std::string nf = dir.file("q_nudged.npy");
        write_npy(nf, nudged);
        REQUIRE(eval(nf, kp, vp, dir.file("o_nudged.npy")).code == 0);
        const FloatArray on = read_npy_float(dir.file("o_nudged.npy"));
        for (int64_t i = 0; i < L; ++i)
          if (i != 7 &&
              std::memcmp(on.ptr() + at(1, 0, i, 0), o_clean.ptr() + at(1, 0, i, 0), D * sizeof(float)) != 0)
            mixes_queries = true;
      }
      for (const Poison& p : poisons) {
        INFO(variant->name() << " mask " << mask << ": " << p.what);
        FloatArray poisoned = p.tensor == 'q' ? q : p.tensor == 'k' ? k : v;
        poisoned.data[at(p.b, p.h, p.row, p.d)] = p.value;
        const std::string bad = dir.file(std::string("bad_") + p.tensor + ".npy");
        write_npy(bad, poisoned);
        const ProcResult r = eval(p.tensor == 'q' ? bad : qp, p.tensor == 'k' ? bad : kp,
                                  p.tensor == 'v' ? bad : vp, dir.file("o_bad.npy"));
        INFO("stdout: " << r.out << "\nstderr: " << r.err);
        CHECK_FALSE(r.signaled);
        REQUIRE(r.code == 0);
        ++checked;
        const FloatArray o = read_npy_float(dir.file("o_bad.npy"));
        int64_t nans = 0, infs = 0;
        for (float x : o.data) nans += std::isnan(x), infs += std::isinf(x);
        const Json j = Json::parse(r.out);
        CHECK(j.at("nonfinite_inputs") == 1);
        CHECK(j.at("nonfinite_q") == (p.tensor == 'q' ? 1 : 0));
        CHECK(j.at("nonfinite_k") == (p.tensor == 'k' ? 1 : 0));
        CHECK(j.at("nonfinite_v") == (p.tensor == 'v' ? 1 : 0));
        CHECK(j.at("nan_count") == nans);
        CHECK(j.at("inf_count") == infs);
        for (const char* metric : {"max_abs_err", "rel_l2_err", "mean_cosine"})  // a number or "inf"/"nan"
          CHECK((j.at(metric).is_number() || j.at(metric) == "inf" || j.at(metric) == "nan"));
        if (nans + infs > 0)
          CHECK_THAT(r.err, Contains("the output holds " + std::to_string(nans + infs) +
                                     " NaN/Inf values (the inputs held 1)"));
        else
          CHECK(r.err.empty());
        check_poison_reach(o, o_clean, p, mask, mixes_queries);
      }
    }
  }
  CHECK(checked == expected);
}

TEST_CASE("eval with a NaN key: sliding_window's output is NaN in exactly the rows whose band holds it",
          "[hostile]") {
  ScratchDir dir("hostile-nan-band");
  const int64_t B = 2, H = 2, L = 40, D = 16;
  AttentionCase base(make_test_problem("naive", B, H, L, L, D), 21);
  const CaseFiles files = base.write_files(dir);
  const std::string qp = files.q, kp = files.k, vp = files.v;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto at = [&](int64_t b, int64_t h, int64_t i, int64_t d) {
    return static_cast<std::size_t>(((b * H + h) * L + i) * D + d);
  };
  // A key outside a row's band is never attended: sliding_window with w = 3 and a NaN in key 20 turns exactly
  // rows 17..23 NaN (dilation 2: the even rows 14..26; two global tokens: rows 0 and 1 as well).
  struct Band {
    std::vector<std::string> params;
    std::vector<int64_t> rows;
  };
  const std::vector<Band> bands = {{{"window=3"}, {17, 18, 19, 20, 21, 22, 23}},
                                   {{"window=3", "dilation=2"}, {14, 16, 18, 20, 22, 24, 26}},
                                   {{"window=3", "global_tokens=2"}, {0, 1, 17, 18, 19, 20, 21, 22, 23}}};
  FloatArray k_nan = base.k;
  k_nan.data[at(0, 1, 20, 2)] = nan;
  write_npy(dir.file("k_nan.npy"), k_nan);
  for (const Band& band : bands) {
    INFO("sliding_window " << Json(band.params).dump());
    std::vector<ProcResult> results;
    for (const std::string& kf : {kp, dir.file("k_nan.npy")}) {
      std::vector<std::string> args{"eval",
                                    "--variant",
                                    "sliding_window",
                                    "--q",
                                    qp,
                                    "--k",
                                    kf,
                                    "--v",
                                    vp,
                                    "--out",
                                    dir.file(kf == kp ? "o_clean.npy" : "o_bad.npy")};
      for (const auto& kv : band.params) args.insert(args.end(), {"--param", kv});
      results.push_back(run_attnbench(args, dir.path()));
      REQUIRE(results.back().code == 0);
    }
    const FloatArray clean = read_npy_float(dir.file("o_clean.npy")),
                     bad = read_npy_float(dir.file("o_bad.npy"));
    std::vector<int64_t> changed;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < L; ++i)
          if (std::memcmp(bad.ptr() + at(b, h, i, 0), clean.ptr() + at(b, h, i, 0), D * sizeof(float)) != 0) {
            CHECK((b == 0 && h == 1));
            changed.push_back(i);
            for (int64_t d = 0; d < D; ++d) CHECK(std::isnan(bad.data[at(b, h, i, d)]));
          }
    CHECK(changed == band.rows);
  }
}

// Every variant's size arithmetic on the largest problems Problem::validate accepts (each size up to 2^40,
// each tensor up to 2^58 elements), with its parameters at their defaults, their minima and their maxima:
// the estimates must saturate, never wrap. The config fuzzer found linear's head_dim² wrapping (UBSan: signed
// overflow at head_dim 2^40); under scripts/sanitize this test fails on any such overflow, and in a release
// build the monotonicity checks fail where a wrapped product comes out small.
TEST_CASE_PER_VARIANT("{} size estimates saturate on the largest valid problems", "[hostile]") {
  const std::vector<ParamSpec> specs = variant.param_specs();
  std::vector<Json> param_sets{Json::object()};
  for (const bool at_max : {false, true}) {
    Json set = Json::object();
    for (const ParamSpec& s : specs) {
      const std::optional<double> bound = at_max ? s.max : s.min;
      if (bound && s.type == ParamType::integer) set[s.name] = static_cast<int64_t>(*bound);
      if (bound && s.type == ParamType::number) set[s.name] = *bound;
    }
    param_sets.push_back(set);
  }
  struct Shape {
    int64_t B, H, Hkv, Lq, Lkv, D;
  };
  constexpr int64_t k40 = int64_t{1} << 40, k18 = int64_t{1} << 18;
  const std::vector<Shape> shapes{{1, 1, 0, 1, 1, k40},     {1, 1, 0, k40, k40, k18},
                                  {1, 1, 0, 1, k40, k18},   {1, 1, 0, k40, 1, k18},
                                  {1, k40, 0, k18, k18, 1}, {1, k40, 1, k18, k18, 1},
                                  {k40, 1, 0, k18, k18, 1}, {1, 1, 0, k18, k18, k40 >> 18}};
  MaskSpec causal, lower_right, bool_pad;
  causal.causal = true;
  lower_right.causal_lower_right = true;
  bool_pad.boolean = bool_pad.key_padding = true;
  int estimated = 0;
  for (const Json& params : param_sets) {
    Problem base;
    try {
      base = make_problem(variant.name(), params);
    } catch (const UsageError&) {
      continue;  // a combination of extremes the variant refuses is not a size question
    }
    for (const Shape& s : shapes)
      for (const MaskSpec& mask : {MaskSpec{}, causal, lower_right, bool_pad})
        for (const DType dtype : {DType::fp32, DType::bf16})
          for (const double dropout : {0.0, 0.1}) {
            Problem p = base;
            p.batch = s.B, p.heads = s.H, p.kv_heads = s.Hkv, p.seq_q = s.Lq, p.seq_kv = s.Lkv,
            p.head_dim = s.D;
            p.mask = mask, p.dtype = dtype, p.dropout = dropout;
            p.validate();  // the shapes are the limits themselves: each one is valid
            if (!variant.unsupported_reasons_text(p).empty()) continue;
            INFO(variant.name() << " " << p.repro() << " params " << params.dump());
            const double flops = variant.flops(p), bytes = variant.bytes_moved(p);
            CHECK((std::isfinite(flops) && flops >= 0));
            CHECK((std::isfinite(bytes) && bytes >= 0));
            const MemoryEstimate one = variant.estimate_memory(p, 1), many = variant.estimate_memory(p, 256);
            CHECK(one.total() >= one.inputs);
            CHECK(many.workspace >= one.workspace);  // more threads never need less scratch
            // A larger head_dim never needs less: a wrapped product (linear's head_dim² at 2^40 wrapped to
            // 2^40) breaks this.
            if (s.D > 2) {
              Problem smaller = p;
              smaller.head_dim = s.D / 2;
              CHECK(variant.estimate_memory(smaller, 2).total() <= variant.estimate_memory(p, 2).total());
            }
            if (variant.capabilities().backward && variant.backward_unsupported_reasons_text(p).empty()) {
              const MemoryEstimate b1 = variant.estimate_backward_memory(p, 1),
                                   b256 = variant.estimate_backward_memory(p, 256);
              CHECK(b1.total() >= b1.inputs);
              CHECK(b256.workspace >= b1.workspace);
              if (s.D > 2) {
                Problem smaller = p;
                smaller.head_dim = s.D / 2;
                CHECK(variant.estimate_backward_memory(smaller, 2).total() <=
                      variant.estimate_backward_memory(p, 2).total());
              }
              const double bflops = variant.backward_flops(p);
              CHECK((std::isfinite(bflops) && bflops >= 0));
            }
            ++estimated;
          }
  }
  CHECK(estimated > 0);
}

namespace {

// Well-formed and broken inputs of a recurrence for eval, written once per test case.
struct RecurrenceEvalFiles {
  static constexpr int64_t B = 1, H = 2, L = 6, D = 8;
  ScratchDir dir{"hostile-recurrence"};
  CaseFiles files;
  std::string g, gv, beta, s0, d_out, g_pos, g_nan, g_inf, g_big, beta0, beta15, beta_tiny, s0_shape, s0_nan,
      out, fin;
  std::vector<std::string> grads;

  RecurrenceEvalFiles() {
    AttentionCase base(make_test_problem("naive", B, H, L, L, D), 5);
    files = base.write_files(dir);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    g = npy("g.npy", {B, H, L}, -0.5f), gv = npy("g_vec.npy", {B, H, L, D}, -0.5f);
    beta = npy("beta.npy", {B, H, L}, 0.5f), s0 = npy("s0.npy", {B, H, D, D}, 0.25f);
    d_out = npy("d_out.npy", {B, H, L, D}, 1.0f);
    // Element [0, 1, 3] of [1, 2, 6] is flat index 9; [0, 0, 2] is 2; [0, 1, 7, 5] of [1, 2, 8, 8] is 125.
    g_pos = npy("g_pos.npy", {B, H, L}, -0.5f, {{9, 0.25f}});
    g_nan = npy("g_nan.npy", {B, H, L}, -0.5f, {{9, nan}});
    g_inf = npy("g_inf.npy", {B, H, L, D}, -0.5f, {{3, -inf}});
    g_big = npy64("g_big.npy", {B, H, L}, -0.5, 2, -1e300);
    beta0 = npy("beta0.npy", {B, H, L}, 0.5f, {{2, 0.0f}});
    beta15 = npy("beta15.npy", {B, H, L}, 0.5f, {{9, 1.5f}});
    beta_tiny = npy64("beta_tiny.npy", {B, H, L}, 0.5, 2, 1e-50);
    s0_shape = npy("s0_87.npy", {B, H, D, D - 1}, 0.25f);
    s0_nan = npy("s0_nan.npy", {B, H, D, D}, 0.25f, {{125, nan}});
    out = dir.file("O.npy"), fin = dir.file("S_final.npy");
    grads = {"--grad-output",   d_out, "--dq", dir.file("dq.npy"), "--dk", dir.file("dk.npy"), "--dv",
             dir.file("dv.npy")};
  }
  std::string npy(const std::string& name, std::vector<int64_t> shape, float fill,
                  std::optional<std::pair<std::size_t, float>> at = std::nullopt) const {
    FloatArray x(std::move(shape), fill);
    if (at) x.data[at->first] = at->second;
    const std::string path = dir.file(name);
    write_npy(path, x);
    return path;
  }
  std::string npy64(const std::string& name, std::vector<int64_t> shape, double fill, std::size_t e,
                    double v) const {
    DoubleArray x(std::move(shape), fill);
    x.data[e] = v;
    const std::string path = dir.file(name);
    write_npy(path, x);
    return path;
  }
  std::vector<std::string> args(const std::string& variant, std::vector<std::string> extra,
                                bool causal = true) const {
    std::vector<std::string> a{"eval", "--variant", variant, "--q", files.q, "--k", files.k, "--v", files.v};
    if (causal) a.push_back("--causal");
    a.insert(a.end(), extra.begin(), extra.end());
    a.insert(a.end(), {"--out", out});
    return a;
  }
};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct RefusalCase {
  std::vector<std::string> args;
  std::vector<std::string> parts;
};

// Each case exits 2 naming every part, and writes nothing (neither O, the final state nor a gradient).
void check_recurrence_refusals(const RecurrenceEvalFiles& f, const std::vector<RefusalCase>& cases) {
  for (const RefusalCase& c : cases) {
    INFO(join(c.args, " "));
    const ProcResult r = run_attnbench(c.args, f.dir.path());
    check_refused(r, c.parts);
    CHECK_FALSE(fs::exists(f.out));
    CHECK_FALSE(fs::exists(f.fin));
    for (const char* name : {"dq.npy", "dg.npy", "db.npy", "ds0.npy"})
      CHECK_FALSE(fs::exists(f.dir.file(name)));
  }
}

}  // namespace

// A variant given an input it does not read, or lacking one it needs, exits 2 naming both; g > 0, beta
// outside (0, 1] and non-finite values name the file, the first offending element's index and value.
TEST_CASE("eval: a recurrence's g, beta and states: unused, missing or misshapen", "[hostile]") {
  const RecurrenceEvalFiles f;
  check_recurrence_refusals(
      f,
      {
          // An input the variant does not read: the option, the file, the variant and those that read it.
          {f.args("naive", {"--g", f.g}, false),
           {"--g '" + f.g + "'", "variant 'naive' reads no gate g", "simple_gla", "gla", "gated_delta_rule"}},
          {f.args("delta_rule", {"--g", f.g, "--beta", f.beta}),
           {"--g '" + f.g + "'", "variant 'delta_rule' reads no gate g"}},
          {f.args("simple_gla", {"--g", f.g, "--beta", f.beta}),
           {"--beta '" + f.beta + "'", "variant 'simple_gla' reads no beta", "delta_rule"}},
          {f.args("naive", {"--initial-state", f.s0}),
           {"--initial-state '" + f.s0 + "'", "variant 'naive' keeps no recurrent state", "retention"}},
          {f.args("tiled", {"--final-state", f.fin}),
           {"--final-state '" + f.fin + "'", "variant 'tiled' keeps no recurrent state"}},
          // A needed input missing: the variant and the option, with the shape and values allowed.
          {f.args("gla", {}), {"variant 'gla' needs --g G.npy", "[batch, heads, seq, head_dim]", "<= 0"}},
          {f.args("gated_delta_rule", {"--g", f.g}),
           {"variant 'gated_delta_rule' needs --beta B.npy", "[batch, heads, seq]", "(0, 1]"}},
          {f.args("delta_rule", {}), {"variant 'delta_rule' needs --beta B.npy"}},
          // Shapes: a scalar gate for gla's per-channel one, a state of the wrong shape.
          {f.args("gla", {"--g", f.g}),
           {"--g '" + f.g + "'", "shape [1, 2, 6]", "does not match [1, 2, 6, 8]",
            "per-channel gate of gla"}},
          {f.args("simple_gla", {"--g", f.gv}),
           {"--g '" + f.gv + "'", "shape [1, 2, 6, 8]", "does not match [1, 2, 6]"}},
          {f.args("simple_gla", {"--g", f.g, "--initial-state", f.s0_shape}),
           {"--initial-state '" + f.s0_shape + "'", "[1, 2, 8, 7]", "does not match [1, 2, 8, 8]",
            "[batch, heads, head_dim, d_v]", "d_v 8 from V"}},
      });
}

TEST_CASE(
    "eval: a recurrence's g, beta and states: out of range or non-finite, gradients of inputs not given",
    "[hostile]") {
  const RecurrenceEvalFiles f;
  check_recurrence_refusals(
      f,
      {
          // Values: the first offending element's index and value, and what is allowed.
          {f.args("simple_gla", {"--g", f.g_pos}),
           {"--g '" + f.g_pos + "'", "element [0, 1, 3]", "= 0.25", "finite and <= 0"}},
          {f.args("simple_gla", {"--g", f.g_nan}), {"--g '" + f.g_nan + "'", "element [0, 1, 3]", "is NaN"}},
          {f.args("gla", {"--g", f.g_inf}),
           {"--g '" + f.g_inf + "'", "element [0, 0, 0, 3]", "= -inf", "not a finite float32"}},
          {f.args("simple_gla", {"--g", f.g_big}),
           {"--g '" + f.g_big + "'", "element [0, 0, 2]", "-1e+300", "float32"}},
          {f.args("delta_rule", {"--beta", f.beta0}),
           {"--beta '" + f.beta0 + "'", "element [0, 0, 2]", "= 0 ", "(0, 1]"}},
          {f.args("gated_delta_rule", {"--g", f.g, "--beta", f.beta15}),
           {"--beta '" + f.beta15 + "'", "element [0, 1, 3]", "= 1.5", "(0, 1]"}},
          {f.args("delta_rule", {"--beta", f.beta_tiny}),
           {"--beta '" + f.beta_tiny + "'", "element [0, 0, 2]", "1e-50 (0 as a float32)", "(0, 1]"}},
          {f.args("retention", {"--initial-state", f.s0_nan}),
           {"--initial-state '" + f.s0_nan + "'", "element [0, 1, 7, 5]", "is NaN", "finite"}},
          // The backward's gradient outputs: only with --grad-output, and only of an input given.
          {f.args("simple_gla", {"--g", f.g, "--dg", f.dir.file("dg.npy")}), {"--dg", "needs --grad-output"}},
          {f.args("retention", with(f.grads, {"--dg", f.dir.file("dg.npy")})), {"--dg", "needs --g G.npy"}},
          {f.args("simple_gla", with(f.grads, {"--g", f.g, "--dbeta", f.dir.file("db.npy")})),
           {"--dbeta", "needs --beta B.npy"}},
          {f.args("simple_gla", with(f.grads, {"--g", f.g, "--d-initial-state", f.dir.file("ds0.npy")})),
           {"--d-initial-state", "needs --initial-state S0.npy"}},
          {f.args("simple_gla",
                  with(f.grads, {"--g", f.g, "--final-state", f.fin, "--forward-output", f.out})),
           {"--final-state", "--forward-output", "no forward runs"}},
      });
  // The same files, well formed, run (so the refusals above are the inputs', not the files').
  const ProcResult ok = run_attnbench(
      f.args("gated_delta_rule",
             {"--g", f.g, "--beta", f.beta, "--initial-state", f.s0, "--final-state", f.fin, "--compare"}),
      f.dir.path());
  INFO(ok.err);
  REQUIRE(ok.code == 0);
  const Json j = Json::parse(ok.out);
  CHECK(j.at("accuracy").at("reference").get<std::string>().find("gated_delta_rule") != std::string::npos);
  CHECK(j.at("final_state_accuracy").at("rel_l2_err").get<double>() <= 1e-5);
  CHECK(j.contains("accuracy_vs_softmax"));
  CHECK(read_npy_float(f.fin).shape == std::vector<int64_t>{f.B, f.H, f.D, f.D});
}
