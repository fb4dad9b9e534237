// The backward pass beyond what the registry-wide gradient checks (common/reference/check.cpp)
// hold for every variant: the checked entry points' refusals, storage widening, O(n) memory of tiled's
// backward by its own estimate, `attnbench eval --grad-output` (bitwise what the API computes, the
// saved-state round trip, hostile inputs: exit 2, a message naming the file and shape, no output file), and a
// sweep with the pass axis (rows per pass, ids, the FLOP convention, gradient errors).
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/lib/config.hpp"
#include "bench/lib/plan.hpp"
#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/kernels/mask.hpp"
#include "common/support/error.hpp"
#include "tests/support/attention_case.hpp"
#include "tests/support/process.hpp"

using namespace attn;
using namespace attn::test;
namespace fs = std::filesystem;

namespace {

// A training step of `p` on case `c` through the checked entry points: O, the saved state, dQ, dK, dV.
struct Step {
  FloatArray out, dq, dk, dv;
  std::vector<float> saved;
};
Step train(const AttentionCase& c, const Problem& p, const FloatArray& d_out) {
  const Attention& v = Registry::instance().get(p.variant);
  Step s;
  s.out = FloatArray({p.batch, p.heads, p.seq_q, p.head_dim});
  s.saved.assign(v.saved_floats(p), 0.0f);
  AttentionInputs in = c.inputs(s.out.ptr(), &p);
  v.run_saving(p, in, s.saved.empty() ? nullptr : s.saved.data());
  s.dq = FloatArray(c.q.shape), s.dk = FloatArray(c.k.shape), s.dv = FloatArray(c.v.shape);
  GradientArgs g;
  g.out = s.out.ptr();
  g.saved = s.saved.empty() ? nullptr : s.saved.data();
  g.d_out = d_out.ptr();
  g.dq = s.dq.ptr(), g.dk = s.dk.ptr(), g.dv = s.dv.ptr();
  v.run_backward(p, in, g);
  return s;
}

bool bitwise_equal(const FloatArray& a, const FloatArray& b) {
  return a.shape == b.shape && std::memcmp(a.ptr(), b.ptr(), a.numel() * sizeof(float)) == 0;
}

// A variant with no backward, unregistered (the registry-wide checks must not see it).
class ForwardOnly final : public Attention {
 public:
  std::string name() const override { return "forward_only"; }
  std::string description() const override { return "test stand-in without a backward"; }
  Capabilities capabilities() const override { return {.causal = true}; }
  double flops(const Problem& p) const override { return exact_attention_flops(p); }
  std::size_t workspace_bytes(const Problem&, int) const override { return 0; }

 protected:
  void forward(const Problem&, const AttentionInputs&) const override {}
};

}  // namespace

TEST_CASE("backward: the checked entry points refuse what they cannot run, naming it", "[backward]") {
  const ForwardOnly stand_in;
  Problem p = make_test_problem("naive", 1, 2, 5, 5, 8);
  CHECK_THAT(stand_in.backward_unsupported_reasons_text(p),
             Catch::Contains("forward_only has no backward pass"));
  AttentionCase c(p, 3);
  FloatArray out(c.q.shape), saved({1});
  CHECK_THROWS_WITH(stand_in.run_saving(p, c.inputs(out.ptr()), nullptr),
                    Catch::Contains("forward_only has no backward pass"));

  // tiled keeps a state: a backward without it (or without dO, O or a gradient) names what is missing.
  const Attention& tiled = Registry::instance().get("tiled");
  Problem tp = c.for_variant("tiled");
  REQUIRE(tiled.saved_floats(tp) == 2u * 2 * 5);
  const FloatArray d_out = normal_tensor(c.q.shape, 9);
  FloatArray dq(c.q.shape), dk(c.k.shape), dv(c.v.shape);
  GradientArgs g;
  g.out = out.ptr(), g.d_out = d_out.ptr(), g.dq = dq.ptr(), g.dk = dk.ptr(), g.dv = dv.ptr();
  CHECK_THROWS_WITH(tiled.run_backward(tp, c.inputs(out.ptr(), &tp), g),
                    Catch::Contains("missing the forward's saved state (20 floats"));
  std::vector<float> state(20);
  g.saved = state.data();
  g.d_out = nullptr;
  g.dk = nullptr;
  CHECK_THROWS_WITH(tiled.run_backward(tp, c.inputs(out.ptr(), &tp), g),
                    Catch::Contains("dO (the gradient of the output)") && Catch::Contains("dk"));
  CHECK_THROWS_WITH(tiled.run_saving(tp, c.inputs(out.ptr(), &tp), nullptr),
                    Catch::Contains("needs a buffer for its saved state (20 floats"));
}

TEST_CASE("backward: bf16 / fp16 storage gives the gradients of the widened values, bitwise", "[backward]") {
  for (const char* variant : {"naive", "tiled"}) {
    for (DType t : {DType::bf16, DType::fp16}) {
      INFO(variant << " " << dtype_name(t));
      AttentionCase c(make_test_problem(variant, 1, 4, 40, 40, 32, "causal"), 5);
      c.p.kv_heads = 2;
      c.k = normal_tensor({1, 2, 40, 32}, 6);
      c.v = normal_tensor({1, 2, 40, 32}, 7);
      Problem p16 = c.p;
      p16.dtype = t;
      // The fp32 values the 16-bit storage holds, as an fp32 problem.
      const StoredInputs stored(p16, c.inputs(nullptr));
      const WideInputs wide(p16, stored.get());
      AttentionCase w(c.p);
      std::copy_n(wide.get().q, w.q.numel(), w.q.ptr());
      std::copy_n(wide.get().k, w.k.numel(), w.k.ptr());
      std::copy_n(wide.get().v, w.v.numel(), w.v.ptr());
      const FloatArray d_out = normal_tensor(c.q.shape, 8);
      const Step widened = train(w, c.p, d_out);
      // The 16-bit problem: its forward reads q16 / k16 / v16.
      const Attention& v = Registry::instance().get(variant);
      FloatArray out(c.q.shape), dq(c.q.shape), dk(c.k.shape), dv(c.v.shape);
      std::vector<float> saved(v.saved_floats(p16));
      AttentionInputs in = stored.get();
      in.out = out.ptr();
      v.run_saving(p16, in, saved.empty() ? nullptr : saved.data());
      GradientArgs g;
      g.out = out.ptr(), g.saved = saved.empty() ? nullptr : saved.data(), g.d_out = d_out.ptr();
      g.dq = dq.ptr(), g.dk = dk.ptr(), g.dv = dv.ptr();
      v.run_backward(p16, in, g);
      // naive widens up front, and tiled's fp16 forward widens each tile to the same fp32 values: the same
      // forward, so the same state and gradients. tiled's bf16 forward may run its native kernels where the
      // CPU has vdpbf16ps (another summation order, and P rounded to bf16: weight_dtype), so there only the
      // tolerance below holds, the 16-bit problem's (it adds that rounding).
      const bool same = std::string(variant) == "naive" || t == DType::fp16;
      if (same) {
        CHECK(bitwise_equal(out, widened.out));
        CHECK(bitwise_equal(dq, widened.dq));
        CHECK(bitwise_equal(dk, widened.dk));
        CHECK(bitwise_equal(dv, widened.dv));
      }
      const GradientTolerance tol = v.grad_tolerance(p16, stored.get(), d_out.ptr());
      DoubleArray wq(c.q.shape), wk(c.k.shape), wv(c.v.shape);
      v.reference_backward(c.p, w.inputs(nullptr), d_out.ptr(), wq.ptr(), wk.ptr(), wv.ptr());
      for (std::size_t e = 0; e < dq.numel(); ++e) REQUIRE(std::fabs(dq.data[e] - wq.data[e]) <= tol.dq);
      for (std::size_t e = 0; e < dk.numel(); ++e) REQUIRE(std::fabs(dk.data[e] - wk.data[e]) <= tol.dk);
    }
  }
}

TEST_CASE("backward: tiled's memory is O(n) (its estimate at n = 32768 is under 1/8 of one score matrix)",
          "[backward]") {
  const Attention& tiled = Registry::instance().get("tiled");
  const Attention& naive = Registry::instance().get("naive");
  Problem p = make_test_problem("tiled", 1, 8, 32768, 32768, 64);
  const double score_matrix = 32768.0 * 32768.0 * sizeof(float);
  const MemoryEstimate m = tiled.estimate_backward_memory(p, 2);
  CHECK(static_cast<double>(m.workspace) <= score_matrix / 8);
  // Doubling n doubles it (plus the per-thread blocks, which do not grow).
  Problem p2 = p;
  p2.seq_q = p2.seq_kv = 65536;
  CHECK(static_cast<double>(tiled.backward_workspace_bytes(p2, 2)) <=
        2.05 * static_cast<double>(tiled.backward_workspace_bytes(p, 2)));
  // naive's backward keeps P and dS of a head: quadratic.
  Problem np = p;
  np.variant = "naive";
  np.params = make_problem("naive").params;
  np.param_order.clear();
  CHECK(static_cast<double>(naive.backward_workspace_bytes(np, 2)) >= 2 * score_matrix);
}

TEST_CASE("attnbench eval --grad-output writes the API's gradients bitwise, and the saved state round-trips",
          "[backward][cli]") {
  ScratchDir dir("bwd");
  AttentionCase c(make_test_problem("tiled", 2, 4, 33, 33, 16, "causal+pad"), 11);
  c.p.kv_heads = 2;
  c.k = normal_tensor({2, 2, 33, 16}, 12);
  c.v = normal_tensor({2, 2, 33, 16}, 13);
  c.pad_keys([](int64_t b, int64_t j) { return b == 1 && j >= 30; });
  const CaseFiles f = c.write_files(dir);
  const FloatArray d_out = normal_tensor(c.q.shape, 14);
  const std::string dfile = dir.file("do.npy");
  write_npy(dfile, d_out);
  for (const char* variant : {"naive", "tiled"}) {
    INFO(variant);
    const Problem p = c.for_variant(variant);
    const Step want = train(c, p, d_out);
    const ProcResult r = run_attnbench({"eval",
                                        "--variant",
                                        variant,
                                        "--q",
                                        f.q,
                                        "--k",
                                        f.k,
                                        "--v",
                                        f.v,
                                        "--causal",
                                        "--key-padding",
                                        f.pad,
                                        "--out",
                                        dir.file("o.npy"),
                                        "--grad-output",
                                        dfile,
                                        "--dq",
                                        dir.file("dq.npy"),
                                        "--dk",
                                        dir.file("dk.npy"),
                                        "--dv",
                                        dir.file("dv.npy"),
                                        "--save-state",
                                        dir.file("s.npy"),
                                        "--compare"},
                                       dir.path());
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(bitwise_equal(read_npy_float(dir.file("o.npy")), want.out));
    CHECK(bitwise_equal(read_npy_float(dir.file("dq.npy")), want.dq));
    CHECK(bitwise_equal(read_npy_float(dir.file("dk.npy")), want.dk));
    CHECK(bitwise_equal(read_npy_float(dir.file("dv.npy")), want.dv));
    const Json j = Json::parse(r.out);
    for (const char* t : {"dq", "dk", "dv"}) {
      CHECK(j.at("grad_accuracy").at(t).at("rel_l2_err").get<double>() < 1e-5);
      CHECK(j.at("grad_accuracy_exact").at(t).at("rel_l2_err").get<double>() < 1e-5);
    }
    // The backward alone from that O and state gives the same gradients.
    const ProcResult r2 = run_attnbench({"eval",
                                         "--variant",
                                         variant,
                                         "--q",
                                         f.q,
                                         "--k",
                                         f.k,
                                         "--v",
                                         f.v,
                                         "--causal",
                                         "--key-padding",
                                         f.pad,
                                         "--forward-output",
                                         dir.file("o.npy"),
                                         "--saved-state",
                                         dir.file("s.npy"),
                                         "--grad-output",
                                         dfile,
                                         "--dq",
                                         dir.file("dq2.npy"),
                                         "--dk",
                                         dir.file("dk2.npy"),
                                         "--dv",
                                         dir.file("dv2.npy")},
                                        dir.path());
    INFO(r2.err);
    REQUIRE(r2.code == 0);
    CHECK(bitwise_equal(read_npy_float(dir.file("dq2.npy")), want.dq));
    CHECK(bitwise_equal(read_npy_float(dir.file("dk2.npy")), want.dk));
  }
}

TEST_CASE("attnbench eval --grad-output: hostile inputs exit 2, name the file and shape, and write nothing",
          "[backward][cli]") {
  ScratchDir dir("bwdbad");
  AttentionCase c(make_test_problem("tiled", 1, 2, 9, 9, 8), 21);
  const CaseFiles f = c.write_files(dir);
  const std::string good = dir.file("do.npy"), shape = dir.file("do_shape.npy"), nan = dir.file("do_nan.npy"),
                    ints = dir.file("do_int.npy");
  write_npy(good, normal_tensor(c.q.shape, 1));
  write_npy(shape, normal_tensor({1, 2, 9, 4}, 1));
  FloatArray with_nan = normal_tensor(c.q.shape, 1);
  with_nan.data[2 * 8 + 5] = std::nanf("");  // [0, 0, 2, 5]
  write_npy(nan, with_nan);
  write_npy(ints, NdArray<int64_t>({1, 2, 9, 8}, 1));
  const std::vector<std::string> qkv{"--q", f.q, "--k", f.k, "--v", f.v};
  const std::vector<std::string> outs{"--out", dir.file("o.npy"),  "--dq", dir.file("dq.npy"),
                                      "--dk",  dir.file("dk.npy"), "--dv", dir.file("dv.npy")};
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> parts;
  };
  auto with = [&](std::vector<std::string> a) {
    std::vector<std::string> all{"eval", "--variant", "tiled"};
    all.insert(all.end(), qkv.begin(), qkv.end());
    all.insert(all.end(), a.begin(), a.end());
    return all;
  };
  auto plus_outs = [&](std::vector<std::string> a) {
    a.insert(a.end(), outs.begin(), outs.end());
    return with(a);
  };
  const std::vector<Case> cases = {
      {plus_outs({"--grad-output", shape}),
       {"--grad-output", "do_shape.npy", "[1, 2, 9, 4]", "[1, 2, 9, 8]"}},
      {plus_outs({"--grad-output", nan}), {"--grad-output", "do_nan.npy", "element [0, 0, 2, 5]", "NaN"}},
      {plus_outs({"--grad-output", ints}), {"--grad-output", "do_int.npy", "'<i8'", "[1, 2, 9, 8]"}},
      {plus_outs({"--grad-output", dir.file("missing.npy")}), {"--grad-output", "missing.npy"}},
      {with({"--out", dir.file("o.npy"), "--grad-output", good, "--dq", dir.file("dq.npy")}),
       {"--grad-output", "--dk is missing"}},
      {with({"--out", dir.file("o.npy"), "--dq", dir.file("dq.npy")}), {"--dq", "needs --grad-output"}},
      // An earlier forward's O without the state tiled keeps.
      {with({"--grad-output", good, "--forward-output", good, "--dq", dir.file("dq.npy"), "--dk",
             dir.file("dk.npy"), "--dv", dir.file("dv.npy")}),
       {"--forward-output", "saved state (36 floats", "--saved-state"}},
      {with({"--grad-output", good, "--forward-output", good, "--saved-state", good, "--dq",
             dir.file("dq.npy"), "--dk", dir.file("dk.npy"), "--dv", dir.file("dv.npy")}),
       {"--saved-state", "do.npy", "[1, 2, 9, 8]", "[36]"}},
  };
  for (const Case& k : cases) {
    const ProcResult r = run_attnbench(k.args, dir.path());
    INFO(join(k.args, " ") << "\n" << r.err);
    CHECK(r.code == 2);
    for (const std::string& part : k.parts) CHECK(contains(r.err, part));
    for (const char* out : {"o.npy", "dq.npy", "dk.npy", "dv.npy"}) CHECK_FALSE(fs::exists(dir.file(out)));
  }
}

TEST_CASE("sweep.pass: rows per pass with the FLOP convention, their own peak memory and gradient errors",
          "[backward][sweep]") {
  ScratchDir dir("bwdsweep");
  const std::string config = dir.write("c.json", R"({
    "name": "bwd", "variants": ["naive", "tiled"],
    "sweep": {"batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 16, "seq_len": [48], "mask": ["none", "causal"],
              "threads": 1, "pass": ["forward", "backward", "forward_backward"]},
    "measure": {"warmup": 0, "min_reps": 1, "max_reps": 2, "min_time_s": 0, "max_time_s": 1,
                "max_interference": 1, "calibrate_every": 0},
    "seed": 5})");
  const ProcResult r = run_attnbench({"run", config, "--out", dir.file("out")}, dir.path());
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  std::ifstream in(dir.file("out/results.jsonl"));
  std::map<std::string, Json> rows;
  for (std::string line; std::getline(in, line);) {
    const Json j = Json::parse(line);
    rows[j.at("id").get<std::string>()] = j;
  }
  REQUIRE(rows.size() == 2 * 2 * 3);
  for (const char* variant : {"naive", "tiled{tile_q=0,tile_kv=0,bf16_kernel=auto}"}) {
    for (const char* mask : {"", ",causal"}) {
      const std::string base =
          std::string(variant) + ":B=1,H=4,Hkv=2,Lq=48,Lkv=48,D=16" + mask + ",gaussian(std=1),T=1";
      INFO(base);
      REQUIRE(rows.count(base));
      REQUIRE(rows.count(base + ",pass=backward"));
      REQUIRE(rows.count(base + ",pass=forward_backward"));
      const Json &f = rows[base], &b = rows[base + ",pass=backward"],
                 &fb = rows[base + ",pass=forward_backward"];
      CHECK(f.at("pass") == "forward");
      CHECK(b.at("pass") == "backward");
      CHECK(fb.at("pass") == "forward_backward");
      for (const Json* x : {&f, &b, &fb}) CHECK(x->at("status") == "ok");
      const double ff = f.at("flops").get<double>();
      CHECK(b.at("flops").get<double>() == Approx(2.5 * ff));
      CHECK(fb.at("flops").get<double>() == Approx(3.5 * ff));
      CHECK(f.at("grad_accuracy").at("reference") == "none");
      for (const Json* x : {&b, &fb}) {
        CHECK(x->at("grad_accuracy").at("reference") == "full");
        CHECK(x->at("grad_accuracy").at("blocks") == 2);
        for (const char* t : {"dq", "dk", "dv"}) {
          CHECK(x->at("grad_accuracy").at(t).at("rel_l2_err").get<double>() < 1e-5);
          CHECK(x->at("grad_accuracy").at(t).at("nan_count") == 0);
        }
        CHECK(x->at("memory").at("peak_bytes").is_number());
        // The backward's inputs include O and dO, its output dQ, dK, dV.
        CHECK(x->at("memory").at("inputs_bytes").get<uint64_t>() >
              f.at("memory").at("inputs_bytes").get<uint64_t>());
      }
      // The forward rows' accuracy is computed for every pass (the training forward is the forward).
      CHECK(b.at("accuracy").at("max_abs_err") == f.at("accuracy").at("max_abs_err"));
    }
  }
}
