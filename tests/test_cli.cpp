// The built `attnbench` executable, run as a user would: list, eval (bitwise equal to calling naive
// directly), eval --compare, check, and every error path (exit code 2, a message naming the option or file
// and value, and no output file written or clobbered).
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "common/attention.hpp"
#include "common/npy.hpp"
#include "common/random.hpp"
#include "common/reference.hpp"

using namespace attn;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test case, removed with its contents at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("attn_cli_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

struct RunResult {
  int code = -1;
  std::string out, err;
};

// Runs `attnbench ARGS` with stdout and stderr captured in files of `dir`.
RunResult run_attnbench(const TempDir& dir, const std::string& args) {
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  const std::string cmd = std::string("'") + ATTNBENCH_EXE + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file_bytes(out);
  r.err = read_file_bytes(err);
  return r;
}

// Q, K, V (and masks) written to .npy files, with the problem they describe for the in-process call.
struct EvalFiles {
  Problem p;
  FloatArray q, k, v;
  ByteArray mask, pad;
  std::string q_path, k_path, v_path, mask_path, pad_path;

  EvalFiles(const TempDir& dir, int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_kv, int64_t head_dim,
            const std::string& tag = "")
      : p(make_problem("naive")) {
    p.batch = batch, p.heads = heads, p.seq_q = seq_q, p.seq_kv = seq_kv, p.head_dim = head_dim;
    q = FloatArray({batch, heads, seq_q, head_dim});
    k = FloatArray({batch, heads, seq_kv, head_dim});
    v = FloatArray({batch, heads, seq_kv, head_dim});
    fill_normal(q.ptr(), q.numel(), 1);
    fill_normal(k.ptr(), k.numel(), 2);
    fill_normal(v.ptr(), v.numel(), 3);
    // Mask: random, with query row 0 fully masked. Padding: batch 0 pads its last key, others pad none.
    mask = ByteArray({seq_q, seq_kv});
    Rng rng(4);
    for (auto& m : mask.data) m = rng.uniform() < 0.7 ? 1 : 0;
    std::fill_n(mask.ptr(), seq_kv, uint8_t{0});
    pad = ByteArray({batch, seq_kv});
    pad.data[seq_kv - 1] = 1;
    q_path = dir.file("q" + tag + ".npy"), k_path = dir.file("k" + tag + ".npy");
    v_path = dir.file("v" + tag + ".npy");
    mask_path = dir.file("mask" + tag + ".npy"), pad_path = dir.file("pad" + tag + ".npy");
    write_npy(q_path, q);
    write_npy(k_path, k);
    write_npy(v_path, v);
    write_mask(mask_path, mask);
    write_mask(pad_path, pad);
  }
  // Masks as float32 0/1 (a dtype read_npy_mask accepts; write_npy has no integer overload).
  static void write_mask(const std::string& path, const ByteArray& m) {
    FloatArray f(m.shape);
    for (std::size_t e = 0; e < m.numel(); ++e) f.data[e] = m.data[e];
    write_npy(path, f);
  }
  std::string qkv_args() const { return "--q '" + q_path + "' --k '" + k_path + "' --v '" + v_path + "'"; }

  FloatArray run_naive(const Problem& problem) {
    FloatArray out({problem.batch, problem.heads, problem.seq_q, problem.head_dim}, std::nanf(""));
    Registry::instance().get("naive").run(problem, inputs(problem, out));
    return out;
  }
  AttentionInputs inputs(const Problem& problem, FloatArray& out) {
    return {q.ptr(),
            k.ptr(),
            v.ptr(),
            problem.mask.boolean ? mask.ptr() : nullptr,
            problem.mask.key_padding ? pad.ptr() : nullptr,
            out.ptr()};
  }
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("attnbench list names every registered variant; --json is valid and complete", "[cli]") {
  TempDir dir;
  const RunResult text = run_attnbench(dir, "list");
  REQUIRE(text.code == 0);
  for (const auto& name : Registry::instance().names()) CHECK(contains(text.out, name + ": "));

  const RunResult js = run_attnbench(dir, "list --json");
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
  TempDir dir;
  EvalFiles self(dir, 2, 3, 9, 9, 17);
  EvalFiles cross(dir, 1, 2, 7, 12, 5, "_cross");
  struct Config {
    EvalFiles* files;
    std::string args;
    std::function<void(Problem&)> set;
  };
  // Each file argument alone once, then everything combined, dropout, and cross-attention.
  const std::vector<Config> configs = {
      {&self, "", [](Problem&) {}},
      {&self, "--mask '" + self.mask_path + "'", [](Problem& p) { p.mask.boolean = true; }},
      {&self, "--causal --mask '" + self.mask_path + "' --key-padding '" + self.pad_path + "' --scale 0.3",
       [](Problem& p) { p.mask = parse_mask("causal+bool+pad", ""), p.scale = 0.3; }},
      {&self, "--causal --dropout 0.2 --seed 7",
       [](Problem& p) { p.mask.causal = true, p.dropout = 0.2, p.seed = 7; }},
      {&cross, "--key-padding '" + cross.pad_path + "'", [](Problem& p) { p.mask.key_padding = true; }},
  };
  for (const Config& c : configs) {
    INFO("eval " << c.args);
    const std::string out = dir.file("O.npy");
    fs::remove(out);
    const RunResult r = run_attnbench(
        dir, "eval --variant naive " + c.files->qkv_args() + " " + c.args + " --out '" + out + "'");
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.empty());  // without --compare, nothing on stdout
    Problem p = c.files->p;
    c.set(p);
    const FloatArray want = c.files->run_naive(p);
    const FloatArray got = read_npy_float(out);
    REQUIRE(got.shape == want.shape);
    CHECK(std::memcmp(got.ptr(), want.ptr(), want.numel() * sizeof(float)) == 0);
    CHECK_FALSE(fs::exists(out + ".tmp"));
  }
}

TEST_CASE("attnbench eval --compare prints accuracy against the fp64 reference as JSON", "[cli]") {
  TempDir dir;
  EvalFiles f(dir, 2, 2, 11, 11, 24);
  const RunResult r = run_attnbench(
      dir, "eval --variant naive " + f.qkv_args() + " --causal --compare --out '" + dir.file("O.npy") + "'");
  INFO(r.err);
  REQUIRE(r.code == 0);
  Json j;
  REQUIRE_NOTHROW(j = Json::parse(r.out));
  Problem p = f.p;
  p.mask.causal = true;
  FloatArray out({2, 2, 11, 24});
  CHECK(j.at("id") == p.repro());
  CHECK(j.at("nan_count") == 0);
  CHECK(j.at("inf_count") == 0);
  CHECK(j.at("max_abs_err").get<double>() <= exact_abs_tolerance(p, f.inputs(p, out)));
  CHECK(j.at("rel_l2_err").get<double>() < 1e-5);
  CHECK(j.at("mean_cosine").get<double>() > 1 - 1e-6);
}

TEST_CASE("attnbench check --variant naive --quiet passes and prints the summary", "[cli]") {
  TempDir dir;
  const RunResult r = run_attnbench(dir, "check --variant naive --quiet");
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex(R"((\d+) passed, 0 failed, (\d+) skipped\n$)")));
  CHECK(std::stoi(m[1]) >= 20);
  CHECK_FALSE(contains(r.out, "PASSED"));  // --quiet prints only failures, skips and the summary

  const RunResult bad = run_attnbench(dir, "check --variant naiv");
  CHECK(bad.code == 2);
  CHECK(contains(bad.err, "unknown variant 'naiv'"));
  CHECK(contains(bad.err, "did you mean 'naive'?"));
}

TEST_CASE("attnbench eval errors exit 2, name the option or file and the value, and write no output",
          "[cli]") {
  TempDir dir;
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
  const std::string qkv = f.qkv_args(), missing = dir.file("missing_q.npy");

  struct ErrorCase {
    std::string args;
    std::vector<std::string> parts;  // all must appear in stderr
  };
  const std::vector<ErrorCase> cases = {
      {"--variant naive --q '" + missing + "' --k '" + f.k_path + "' --v '" + f.v_path + "'",
       {"missing_q.npy", "cannot open"}},
      {"--variant naive --q '" + q3 + "' --k '" + f.k_path + "' --v '" + f.v_path + "'",
       {"--q", "q_rank3.npy", "rank 3", "[2, 6, 8]"}},
      {"--variant naive --q '" + f.q_path + "' --k '" + k9 + "' --v '" + f.v_path + "'",
       {"--k", "k_d9.npy", "[2, 2, 6, 9]"}},
      {"--variant naive --q '" + f.q_path + "' --k '" + f.k_path + "' --v '" + v5 + "'",
       {"--v", "v_seq5.npy", "[2, 2, 5, 8]"}},
      {"--variant naive " + qkv + " --mask '" + m65 + "'", {"--mask", "mask_6x5.npy", "[6, 5]", "[6, 6]"}},
      {"--variant naive " + qkv + " --key-padding '" + p62 + "'", {"--key-padding", "pad_6x2.npy", "[6, 2]"}},
      {"--variant naiv " + qkv, {"unknown variant 'naiv'", "did you mean 'naive'?"}},
      {"--variant naive --param blok=3 " + qkv, {"--param", "unknown parameter 'blok'"}},
      {"--variant naive --param blok " + qkv, {"--param", "'blok'", "NAME=VALUE"}},
      {"--variant naive --dropout 1.5 " + qkv, {"dropout", "1.5"}},
      {"--variant naive --scale -1 " + qkv, {"scale", "-1"}},
      {"--variant naive --q '" + f.q_path + "' --k '" + f.k_path + "'",
       {"--v"}},  // a required option missing
  };
  for (const auto& c : cases) {
    INFO("eval " << c.args);
    const std::string out = dir.file("O_new.npy");
    const RunResult r = run_attnbench(dir, "eval " + c.args + " --out '" + out + "'");
    INFO("stderr: " << r.err);
    CHECK(r.code == 2);
    for (const auto& part : c.parts) CHECK(contains(r.err, part));
    CHECK_FALSE(fs::exists(out));
    CHECK_FALSE(fs::exists(out + ".tmp"));
  }

  // An existing output file is left exactly as it was, whether the error is in a file, a shape or a value.
  for (std::size_t i : {std::size_t{0}, std::size_t{4}, std::size_t{9}}) {
    INFO("eval " << cases[i].args);
    const std::string keep = dir.file("O_keep.npy");
    write_file_atomic(keep, "not overwritten");
    CHECK(run_attnbench(dir, "eval " + cases[i].args + " --out '" + keep + "'").code == 2);
    CHECK(read_file_bytes(keep) == "not overwritten");
  }

  // An output directory that does not exist: exit 2 naming the file.
  const RunResult nodir =
      run_attnbench(dir, "eval --variant naive " + qkv + " --out '" + dir.file("no_dir/O.npy") + "'");
  CHECK(nodir.code == 2);
  CHECK(contains(nodir.err, "no_dir/O.npy"));
}

TEST_CASE("attnbench without a known subcommand exits 2", "[cli]") {
  TempDir dir;
  CHECK(run_attnbench(dir, "").code == 2);
  const RunResult unknown = run_attnbench(dir, "frobnicate");
  CHECK(unknown.code == 2);
  CHECK(contains(unknown.err, "frobnicate"));
}
