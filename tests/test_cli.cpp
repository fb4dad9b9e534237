// The built `attnbench` executable, run as a user would: list, eval (bitwise equal to calling naive
// directly), eval --compare, check, and every error path (exit code 2, a message naming the option or file
// and value, and no output file written or clobbered).
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "common/attention.hpp"
#include "common/npy.hpp"
#include "common/reference.hpp"
#include "common/util.hpp"
#include "tests/support/attention_case.hpp"
#include "tests/support/process.hpp"

using namespace attn;
using namespace attn::test;

namespace {

using Args = std::vector<std::string>;

Args operator+(Args a, const Args& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Runs `attnbench ARGS` in `dir` (spawned directly, no shell), with stdout and stderr captured.
ProcResult attnbench(const ScratchDir& dir, const Args& args) {
  return run_attnbench(args, dir.path());
}

// Q, K, V and masks written to .npy files, with the case they describe for the in-process call. Mask: random,
// with query row 0 fully masked. Padding: batch 0 pads its last key, others pad none.
struct EvalFiles {
  AttentionCase c;
  CaseFiles files;

  EvalFiles(const ScratchDir& dir, int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_kv,
            int64_t head_dim, const std::string& tag = "")
      : c(make_test_problem("naive", batch, heads, seq_q, seq_kv, head_dim), 1) {
    c.random_mask(4, 0.7, {0});
    c.pad_keys([&](int64_t b, int64_t j) { return b == 0 && j == seq_kv - 1; });
    files = c.write_files(dir, tag);
  }
  Args qkv_args() const { return {"--q", files.q, "--k", files.k, "--v", files.v}; }
};

}  // namespace

TEST_CASE("attnbench list names every registered variant, and --json is valid and complete", "[cli]") {
  ScratchDir dir("cli");
  const ProcResult text = attnbench(dir, {"list"});
  REQUIRE(text.code == 0);
  for (const auto& name : Registry::instance().names()) CHECK(contains(text.out, name + ": "));

  const ProcResult js = attnbench(dir, {"list", "--json"});
  REQUIRE(js.code == 0);
  Json all;
  REQUIRE_NOTHROW(all = Json::parse(js.out));
  REQUIRE(all.is_array());
  std::vector<std::string> listed;
  for (const auto& v : all) listed.push_back(v.at("name").get<std::string>());
  CHECK(listed == Registry::instance().names());
  for (const auto& entry : all) {
    const Attention& v = Registry::instance().get(entry.at("name").get<std::string>());
    INFO(v.name());
    CHECK(entry.at("description") == v.description());
    CHECK(entry.at("capabilities") == capabilities_json(v.capabilities()));
    CHECK(entry.at("params").size() == v.param_specs().size());
  }
}

TEST_CASE("attnbench eval writes exactly what the naive variant computes in process", "[cli]") {
  ScratchDir dir("cli");
  EvalFiles self(dir, 2, 3, 9, 9, 17);
  EvalFiles cross(dir, 1, 2, 7, 12, 5, "_cross");
  struct Config {
    EvalFiles* files;
    Args args;
    std::function<void(Problem&)> set;
  };
  // Each file argument alone once, then everything combined, dropout, and cross-attention.
  const std::vector<Config> configs = {
      {&self, {}, [](Problem&) {}},
      {&self, {"--mask", self.files.mask}, [](Problem& p) { p.mask.boolean = true; }},
      {&self,
       {"--causal", "--mask", self.files.mask, "--key-padding", self.files.pad, "--scale", "0.3"},
       [](Problem& p) { p.mask = parse_mask("causal+bool+pad", ""), p.scale = 0.3; }},
      {&self,
       {"--causal", "--dropout", "0.2", "--seed", "7"},
       [](Problem& p) { p.mask.causal = true, p.dropout = 0.2, p.seed = 7; }},
      {&cross, {"--key-padding", cross.files.pad}, [](Problem& p) { p.mask.key_padding = true; }},
  };
  for (const Config& c : configs) {
    INFO("eval " << join(c.args, " "));
    const std::string out = dir.file("O.npy");
    fs::remove(out);
    const ProcResult r = attnbench(
        dir, Args{"eval", "--variant", "naive"} + c.files->qkv_args() + c.args + Args{"--out", out});
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.empty());  // without --compare, nothing on stdout
    Problem p = c.files->c.p;
    c.set(p);
    const FloatArray want = c.files->c.run(p);
    const FloatArray got = read_npy_float(out);
    REQUIRE(got.shape == want.shape);
    CHECK(std::memcmp(got.ptr(), want.ptr(), want.numel() * sizeof(float)) == 0);
    CHECK_FALSE(fs::exists(out + ".tmp"));
  }
}

TEST_CASE("attnbench eval --compare prints accuracy against the fp64 reference as JSON", "[cli]") {
  ScratchDir dir("cli");
  EvalFiles f(dir, 2, 2, 11, 11, 24);
  const ProcResult r = attnbench(dir, Args{"eval", "--variant", "naive"} + f.qkv_args() +
                                          Args{"--causal", "--compare", "--out", dir.file("O.npy")});
  INFO(r.err);
  REQUIRE(r.code == 0);
  Json j;
  REQUIRE_NOTHROW(j = Json::parse(r.out));
  Problem p = f.c.p;
  p.mask.causal = true;
  CHECK(j.at("id") == p.repro());
  CHECK(j.at("nan_count") == 0);
  CHECK(j.at("inf_count") == 0);
  CHECK(j.at("max_abs_err").get<double>() <= exact_abs_tolerance(p, f.c.inputs(nullptr, &p)));
  CHECK(j.at("rel_l2_err").get<double>() < 1e-5);
  CHECK(j.at("mean_cosine").get<double>() > 1 - 1e-6);
}

TEST_CASE("attnbench check --variant naive --quiet passes and prints the summary", "[cli]") {
  ScratchDir dir("cli");
  const ProcResult r = attnbench(dir, {"check", "--variant", "naive", "--quiet"});
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex(R"((\d+) passed, 0 failed, (\d+) skipped\n$)")));
  CHECK(std::stoi(m[1]) >= 20);
  CHECK_FALSE(contains(r.out, "PASSED"));  // --quiet prints only failures, skips and the summary

  const ProcResult bad = attnbench(dir, {"check", "--variant", "naiv"});
  CHECK(bad.code == 2);
  CHECK(contains(bad.err, "unknown variant 'naiv'"));
  CHECK(contains(bad.err, "did you mean 'naive'?"));
}

TEST_CASE("attnbench eval errors exit 2, name the option or file and the value, and write no output",
          "[cli]") {
  ScratchDir dir("cli");
  EvalFiles f(dir, 2, 2, 6, 6, 8);
  FloatArray rank3({2, 6, 8}), k_other_dim({2, 2, 6, 9}), v_other_seq({2, 2, 5, 8}), mask_wrong({6, 5}),
      pad_wrong({6, 2});
  const std::string q3 = dir.file("q_rank3.npy"), k9 = dir.file("k_d9.npy"), v5 = dir.file("v_seq5.npy"),
                    m65 = dir.file("mask_6x5.npy"), p62 = dir.file("pad_6x2.npy");
  write_npy(q3, rank3);
  write_npy(k9, k_other_dim);
  write_npy(v5, v_other_seq);
  write_npy(m65, mask_wrong);
  write_npy(p62, pad_wrong);
  const Args qkv = f.qkv_args();
  const std::string missing = dir.file("missing_q.npy");
  const CaseFiles& files = f.files;

  struct ErrorCase {
    Args args;
    std::vector<std::string> parts;  // all must appear in stderr
  };
  const std::vector<ErrorCase> cases = {
      {{"--variant", "naive", "--q", missing, "--k", files.k, "--v", files.v},
       {"missing_q.npy", "cannot open"}},
      {{"--variant", "naive", "--q", q3, "--k", files.k, "--v", files.v},
       {"--q", "q_rank3.npy", "rank 3", "[2, 6, 8]"}},
      {{"--variant", "naive", "--q", files.q, "--k", k9, "--v", files.v},
       {"--k", "k_d9.npy", "[2, 2, 6, 9]"}},
      {{"--variant", "naive", "--q", files.q, "--k", files.k, "--v", v5},
       {"--v", "v_seq5.npy", "[2, 2, 5, 8]"}},
      {Args{"--variant", "naive"} + qkv + Args{"--mask", m65},
       {"--mask", "mask_6x5.npy", "[6, 5]", "[6, 6]"}},
      {Args{"--variant", "naive"} + qkv + Args{"--key-padding", p62},
       {"--key-padding", "pad_6x2.npy", "[6, 2]"}},
      {Args{"--variant", "naiv"} + qkv, {"unknown variant 'naiv'", "did you mean 'naive'?"}},
      {Args{"--variant", "naive", "--param", "blok=3"} + qkv, {"--param", "unknown parameter 'blok'"}},
      {Args{"--variant", "naive", "--param", "blok"} + qkv, {"--param", "'blok'", "NAME=VALUE"}},
      {Args{"--variant", "naive", "--dropout", "1.5"} + qkv, {"dropout", "1.5"}},
      {Args{"--variant", "naive", "--scale", "-1"} + qkv, {"scale", "-1"}},
      {{"--variant", "naive", "--q", files.q, "--k", files.k}, {"--v"}},  // a required option missing
  };
  for (const auto& c : cases) {
    INFO("eval " << join(c.args, " "));
    const std::string out = dir.file("O_new.npy");
    const ProcResult r = attnbench(dir, Args{"eval"} + c.args + Args{"--out", out});
    INFO("stderr: " << r.err);
    CHECK(r.code == 2);
    for (const auto& part : c.parts) CHECK(contains(r.err, part));
    CHECK_FALSE(fs::exists(out));
    CHECK_FALSE(fs::exists(out + ".tmp"));
  }

  // An existing output file is left exactly as it was, whether the error is in a file, a shape or a value.
  for (std::size_t i : {std::size_t{0}, std::size_t{4}, std::size_t{9}}) {
    INFO("eval " << join(cases[i].args, " "));
    const std::string keep = dir.file("O_keep.npy");
    write_file_atomic(keep, "not overwritten");
    CHECK(attnbench(dir, Args{"eval"} + cases[i].args + Args{"--out", keep}).code == 2);
    CHECK(read_file_bytes(keep) == "not overwritten");
  }

  // An output directory that does not exist: exit 2 naming the file.
  const ProcResult nodir =
      attnbench(dir, Args{"eval", "--variant", "naive"} + qkv + Args{"--out", dir.file("no_dir/O.npy")});
  CHECK(nodir.code == 2);
  CHECK(contains(nodir.err, "no_dir/O.npy"));
}

TEST_CASE("attnbench without a known subcommand exits 2", "[cli]") {
  ScratchDir dir("cli");
  CHECK(attnbench(dir, {}).code == 2);
  const ProcResult unknown = attnbench(dir, {"frobnicate"});
  CHECK(unknown.code == 2);
  CHECK(contains(unknown.err, "frobnicate"));
}
