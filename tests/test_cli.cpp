// The built `attnbench` executable, run as a user would: list, eval (bitwise equal to calling naive
// directly; K/V with fewer heads than Q, lower-right causal), eval --compare, check, and every error path
// (exit code 2, a message naming the option or file and value, and no output file written or clobbered).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/reference/reference.hpp"
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

namespace {

// K or V [B, H, Lkv, D] of multi-head attention equal to the grouped [B, Hkv, Lkv, D] `kv`: query head h gets
// K/V head h / (H / Hkv) (Problem::kv_head_of), written out independently of it.
FloatArray repeat_kv_heads(const FloatArray& kv, int64_t heads) {
  const int64_t B = kv.shape[0], Hkv = kv.shape[1], L = kv.shape[2], D = kv.shape[3], group = heads / Hkv;
  FloatArray out({B, heads, L, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      std::copy_n(kv.ptr() + (b * Hkv + h / group) * L * D, L * D, out.ptr() + (b * heads + h) * L * D);
  return out;
}

}  // namespace

TEST_CASE(
    "attnbench eval with K and V of fewer heads than Q (grouped-query attention) and lower-right causal",
    "[cli]") {
  ScratchDir dir("cli");
  const Attention& naive = Registry::instance().get("naive");
  const Capabilities caps = naive.capabilities();
  struct Shape {
    int64_t heads, kv_heads, seq_q, seq_kv;
  };
  // GQA groups of 4, 2 and all heads in one; decode (seq_q 1), seq_q < seq_kv and seq_q > seq_kv.
  const std::vector<Shape> shapes = {{8, 2, 5, 9}, {6, 3, 9, 5}, {4, 1, 1, 12}, {2, 2, 4, 11}};
  const std::vector<Args> masks = {{}, {"--causal-lower-right"}, {"--causal", "--causal-lower-right"}};
  uint64_t seed = 40;
  for (const Shape& s : shapes) {
    const int64_t B = 2, D = 7;
    const FloatArray q = normal_tensor({B, s.heads, s.seq_q, D}, ++seed),
                     k = normal_tensor({B, s.kv_heads, s.seq_kv, D}, ++seed),
                     v = normal_tensor({B, s.kv_heads, s.seq_kv, D}, ++seed);
    const std::string tag = std::to_string(s.heads) + "_" + std::to_string(s.kv_heads);
    const std::string fq = dir.file("gq" + tag + ".npy"), fk = dir.file("gk" + tag + ".npy"),
                      fv = dir.file("gv" + tag + ".npy");
    write_npy(fq, q);
    write_npy(fk, k);
    write_npy(fv, v);
    for (const Args& mask : masks) {
      Problem p = make_test_problem("naive", B, s.heads, s.seq_q, s.seq_kv, D);
      p.kv_heads = s.kv_heads;
      p.mask.causal = std::find(mask.begin(), mask.end(), "--causal") != mask.end();
      p.mask.causal_lower_right = !mask.empty();
      const std::string id = p.repro();
      INFO("eval " << id);
      CHECK(contains(id, "H=" + std::to_string(s.heads) +
                             (p.is_gqa() ? ",Hkv=" + std::to_string(s.kv_heads) : "") + ",Lq="));
      CHECK(contains(id, "causal_lower_right") == p.mask.causal_lower_right);
      const std::string out = dir.file("gO.npy");
      fs::remove(out);
      const ProcResult r =
          attnbench(dir, Args{"eval", "--variant", "naive", "--q", fq, "--k", fk, "--v", fv} + mask +
                             Args{"--compare", "--out", out});
      INFO("stderr: " << r.err);
      if ((p.is_gqa() && !caps.gqa) || (p.mask.causal_lower_right && !caps.causal_lower_right)) {
        // A variant without the capability refuses, naming the problem (its repro id) and what it lacks.
        CHECK(r.code == 2);
        CHECK(contains(r.err, "not supported: " + id + ": "));
        if (p.is_gqa() && !caps.gqa) CHECK(contains(r.err, "grouped-query attention"));
        if (p.mask.causal_lower_right && !caps.causal_lower_right)
          CHECK(contains(r.err, "causal_lower_right"));
        CHECK_FALSE(fs::exists(out));
        continue;
      }
      REQUIRE(r.code == 0);
      Json j;
      REQUIRE_NOTHROW(j = Json::parse(r.out));
      CHECK(j.at("id") == id);
      CHECK(j.at("nan_count") == 0);
      const FloatArray got = read_npy_float(out);
      REQUIRE(got.shape == std::vector<int64_t>{B, s.heads, s.seq_q, D});
      // Exactly what naive computes in process on the same grouped inputs...
      FloatArray want(got.shape, std::nanf(""));
      naive.run(p, {q.ptr(), k.ptr(), v.ptr(), nullptr, nullptr, want.ptr()});
      CHECK(std::memcmp(got.ptr(), want.ptr(), want.numel() * sizeof(float)) == 0);
      // ... and, within the fp32 bound, the fp64 reference of multi-head attention on K/V with every head
      // repeated for its group.
      Problem mha = p;
      mha.kv_heads = 0;
      const FloatArray k_rep = repeat_kv_heads(k, s.heads), v_rep = repeat_kv_heads(v, s.heads);
      const AttentionInputs in_rep{q.ptr(), k_rep.ptr(), v_rep.ptr(), nullptr, nullptr, nullptr};
      DoubleArray ref(got.shape);
      reference_attention(mha, in_rep, ref.ptr());
      const ErrorMetrics m = compare_outputs(got.ptr(), ref.ptr(), B * s.heads * s.seq_q, D);
      CHECK(m.max_abs_err <= exact_abs_tolerance(mha, in_rep));
      CHECK(j.at("max_abs_err").get<double>() == Approx(m.max_abs_err).margin(1e-12));
      // seq_q > seq_kv under lower-right causal: the first seq_q - seq_kv query rows see no key and are zero.
      if (p.mask.causal_lower_right && s.seq_q > s.seq_kv)
        for (int64_t bh = 0; bh < B * s.heads; ++bh)
          for (int64_t i = 0; i < s.seq_q - s.seq_kv; ++i)
            for (int64_t d = 0; d < D; ++d) CHECK(got.data[(bh * s.seq_q + i) * D + d] == 0.0f);
    }
  }
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

namespace {

struct EvalErrorCase {
  Args args;
  std::vector<std::string> parts;  // all must appear in stderr
};

// Each case exits 2 with every part in stderr and leaves no output (nor its temporary) behind.
void check_eval_errors(const ScratchDir& dir, const std::vector<EvalErrorCase>& cases) {
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
}

}  // namespace

TEST_CASE("attnbench eval errors exit 2, name the option or file and the value, and write no output",
          "[cli]") {
  ScratchDir dir("cli");
  EvalFiles f(dir, 2, 2, 6, 6, 8);
  FloatArray rank3({2, 6, 8}), k_other_dim({2, 2, 6, 9}), v_other_seq({2, 2, 5, 8}), mask_wrong({6, 5}),
      pad_wrong({6, 2}), k_heads3({2, 3, 6, 8}), k_heads4({2, 4, 6, 8}), k_batch1({1, 2, 6, 8}),
      kv_heads1({2, 1, 6, 8});
  const std::string q3 = dir.file("q_rank3.npy"), k9 = dir.file("k_d9.npy"), v5 = dir.file("v_seq5.npy"),
                    m65 = dir.file("mask_6x5.npy"), p62 = dir.file("pad_6x2.npy"), kh3 = dir.file("k_h3.npy"),
                    kh4 = dir.file("k_h4.npy"), kb1 = dir.file("k_b1.npy"), kh1 = dir.file("k_h1.npy"),
                    vh1 = dir.file("v_h1.npy");
  write_npy(q3, rank3);
  write_npy(k9, k_other_dim);
  write_npy(v5, v_other_seq);
  write_npy(m65, mask_wrong);
  write_npy(p62, pad_wrong);
  write_npy(kh3, k_heads3);
  write_npy(kh4, k_heads4);
  write_npy(kb1, k_batch1);
  write_npy(kh1, kv_heads1);
  write_npy(vh1, kv_heads1);
  const Args qkv = f.qkv_args();
  const std::string missing = dir.file("missing_q.npy");
  const CaseFiles& files = f.files;

  const std::vector<EvalErrorCase> cases = {
      {{"--variant", "naive", "--q", missing, "--k", files.k, "--v", files.v},
       {"missing_q.npy", "cannot open"}},
      {{"--variant", "naive", "--q", q3, "--k", files.k, "--v", files.v},
       {"--q", "q_rank3.npy", "rank 3", "[2, 6, 8]"}},
      {{"--variant", "naive", "--q", files.q, "--k", k9, "--v", files.v},
       {"--k", "k_d9.npy", "[2, 2, 6, 9]", "head_dim 9 != Q's head_dim 8"}},
      {{"--variant", "naive", "--q", files.q, "--k", files.k, "--v", v5},
       {"--v", "v_seq5.npy", "[2, 2, 5, 8]", "--k '" + files.k + "' shape [2, 2, 6, 8]",
        "with K's first three extents"}},
      // K/V heads (grouped-query attention): they must divide Q's heads; batch and head_dim must be Q's.
      {{"--variant", "naive", "--q", files.q, "--k", kh3, "--v", kh3},
       {"--k '" + kh3 + "'", "[2, 3, 6, 8]", "--q '" + files.q + "' shape [2, 2, 6, 8]",
        "kv_heads 3 does not divide Q's heads 2", "kv_heads dividing Q's heads 2 (1 or 2)"}},
      {{"--variant", "naive", "--q", files.q, "--k", kh4, "--v", kh4},
       {"--k '" + kh4 + "'", "[2, 4, 6, 8]", "kv_heads 4 does not divide Q's heads 2"}},
      {{"--variant", "naive", "--q", files.q, "--k", kb1, "--v", kb1},
       {"--k '" + kb1 + "'", "[1, 2, 6, 8]", "[2, 2, 6, 8]", "batch 1 != Q's batch 2", "with Q's batch 2"}},
      {{"--variant", "naive", "--q", files.q, "--k", kh1, "--v", files.v},
       {"--v '" + files.v + "'", "[2, 2, 6, 8]", "--k '" + kh1 + "' shape [2, 1, 6, 8]",
        "with K's first three extents"}},
      {{"--variant", "naive", "--q", files.q, "--k", files.k, "--v", vh1},
       {"--v '" + vh1 + "'", "[2, 1, 6, 8]", "--k '" + files.k + "' shape [2, 2, 6, 8]"}},
      {{"--variant", "naive", "--q", files.q, "--k", files.k, "--v", q3}, {"--v", "q_rank3.npy", "rank 3"}},
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
  check_eval_errors(dir, cases);

  // An existing output file is left exactly as it was, whether the error is in a file, a shape or a value.
  for (std::size_t i : {std::size_t{0}, std::size_t{4}, std::size_t{10}, std::size_t{15}}) {
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

TEST_CASE("attnbench eval errors in storage dtype, ALiBi and RoPE exit 2 and write no output", "[cli]") {
  ScratchDir dir("cli");
  EvalFiles f(dir, 2, 2, 6, 6, 8);
  const Args qkv = f.qkv_args();
  // ALiBi slopes of the wrong length (Q has 2 heads), and Q, K, V with an odd head_dim for RoPE.
  const std::string s3 = dir.file("slopes3.npy");
  write_npy(s3, FloatArray({3}, 0.5f));
  EvalFiles odd(dir, 1, 2, 4, 4, 7, "_odd");
  check_eval_errors(
      dir,
      {
          {Args{"--variant", "naive", "--dtype", "fp8"} + qkv,
           {"--dtype", "unknown dtype 'fp8'", "fp32, bf16, fp16"}},
          // Every variant takes bf16 and fp16 (widened, if not natively): the refusal is the bias's.
          {Args{"--variant", "linear", "--dtype", "bf16", "--alibi"} + qkv,
           {"--dtype bf16 with --alibi", "variant 'linear'", "does not support the ALiBi bias", "naive"}},
          {Args{"--variant", "naive", "--alibi-slopes", s3} + qkv,
           {"--alibi-slopes", "slopes3.npy", "needs --alibi"}},
          {Args{"--variant", "naive", "--alibi", "--alibi-slopes", s3} + qkv,
           {"--alibi-slopes", "slopes3.npy", "shape [3]", "[2]", "[heads]"}},
          {Args{"--variant", "naive", "--rope", "neox"} + odd.qkv_args(),
           {"--rope neox", "_odd", "head_dim must be even, got 7"}},
          {Args{"--variant", "naive", "--rope", "sideways"} + qkv,
           {"--rope", "'sideways'", "none, normal, neox"}},
          {Args{"--variant", "naive", "--rope-base", "500"} + qkv, {"--rope-base 500", "needs --rope"}},
          {Args{"--variant", "naive", "--rope", "normal", "--rope-base", "-2"} + qkv, {"--rope-base", "-2"}},
      });
}

TEST_CASE("attnbench without a known subcommand exits 2", "[cli]") {
  ScratchDir dir("cli");
  CHECK(attnbench(dir, {}).code == 2);
  const ProcResult unknown = attnbench(dir, {"frobnicate"});
  CHECK(unknown.code == 2);
  CHECK(contains(unknown.err, "frobnicate"));
}

TEST_CASE(
    "attnbench eval with V of another width (d_v != d_k): O, dO and dV d_v wide, and a variant without "
    "value_dim exits 2",
    "[cli][value_dim]") {
  ScratchDir dir("cli");
  // Q, K [1, 2, 9, 8] and V [1, 2, 9, 5], from the test's own draws.
  FloatArray q({1, 2, 9, 8}), k({1, 2, 9, 8}), v({1, 2, 9, 5}), d_out({1, 2, 9, 5});
  fill_normal(q.ptr(), static_cast<int64_t>(q.numel()), 11);
  fill_normal(k.ptr(), static_cast<int64_t>(k.numel()), 12);
  fill_normal(v.ptr(), static_cast<int64_t>(v.numel()), 13);
  fill_normal(d_out.ptr(), static_cast<int64_t>(d_out.numel()), 14);
  for (const auto& [name, t] :
       {std::pair<const char*, const FloatArray*>{"q", &q}, {"k", &k}, {"v", &v}, {"do", &d_out}})
    write_npy(dir.file(std::string(name) + ".npy"), *t);
  const Args qkv{"--q", dir.file("q.npy"), "--k", dir.file("k.npy"), "--v", dir.file("v.npy")};
  const ProcResult r =
      attnbench(dir, Args{"eval", "--variant", "naive", "--causal", "--compare", "--out", dir.file("O.npy"),
                          "--grad-output", dir.file("do.npy"), "--dq", dir.file("dq.npy"), "--dk",
                          dir.file("dk.npy"), "--dv", dir.file("dv.npy")} +
                         qkv);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const Json j = Json::parse(r.out);
  CHECK(j.at("id") == "naive:B=1,H=2,Lq=9,Lkv=9,D=8,Dv=5,causal");
  CHECK(j.at("rel_l2_err").get<double>() < 1e-6);
  for (const char* g : {"dq", "dk", "dv"}) CHECK(j["grad_accuracy"][g]["rel_l2_err"].get<double>() < 1e-5);
  CHECK(read_npy_float(dir.file("O.npy")).shape == std::vector<int64_t>{1, 2, 9, 5});
  CHECK(read_npy_float(dir.file("dq.npy")).shape == std::vector<int64_t>{1, 2, 9, 8});
  CHECK(read_npy_float(dir.file("dk.npy")).shape == std::vector<int64_t>{1, 2, 9, 8});
  CHECK(read_npy_float(dir.file("dv.npy")).shape == std::vector<int64_t>{1, 2, 9, 5});
  // The output against an fp64 softmax written out here: o_i = sum_j softmax(q_i . k_j / sqrt(8)) v_j, j <=
  // i.
  const FloatArray o = read_npy_float(dir.file("O.npy"));
  double worst = 0;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 9; ++i) {
      std::vector<double> w(static_cast<std::size_t>(i + 1));
      double mx = -1e300, sum = 0;
      for (int64_t jj = 0; jj <= i; ++jj) {
        double s = 0;
        for (int64_t d = 0; d < 8; ++d)
          s += double(q.data[(h * 9 + i) * 8 + d]) * k.data[(h * 9 + jj) * 8 + d];
        w[jj] = s / std::sqrt(8.0), mx = std::max(mx, w[jj]);
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < 5; ++d) {
        double acc = 0;
        for (int64_t jj = 0; jj <= i; ++jj) acc += w[jj] / sum * v.data[(h * 9 + jj) * 5 + d];
        worst = std::max(worst, std::fabs(acc - o.data[(h * 9 + i) * 5 + d]));
      }
    }
  CHECK(worst < 1e-5);
  // dO of Q's width instead of V's: the shape error names both.
  write_npy(dir.file("do_q.npy"), q);
  const ProcResult bad_do =
      attnbench(dir, Args{"eval", "--variant", "naive", "--out", dir.file("O2.npy"), "--grad-output",
                          dir.file("do_q.npy"), "--dq", dir.file("dq2.npy"), "--dk", dir.file("dk2.npy"),
                          "--dv", dir.file("dv2.npy")} +
                         qkv);
  CHECK(bad_do.code == 2);
  CHECK(contains(bad_do.err, "[1, 2, 9, 8]"));
  CHECK(contains(bad_do.err, "[1, 2, 9, 5]"));
  CHECK_FALSE(std::filesystem::exists(dir.file("O2.npy")));
  // sliding_window needs V as wide as Q and K: exit 2 with the reason, nothing written.
  const ProcResult t =
      attnbench(dir, Args{"eval", "--variant", "sliding_window", "--out", dir.file("O3.npy")} + qkv);
  CHECK(t.code == 2);
  CHECK(contains(t.err, "needs V as wide as Q and K (got v_head_dim 5 != head_dim 8)"));
  CHECK_FALSE(std::filesystem::exists(dir.file("O3.npy")));
}
