// The SIMD-target choice as a user meets it: `--isa NAME` on eval, check, layer, run and
// attnbench_gbench (an unsupported name exits 2 naming --isa, the value and the supported targets, and writes
// nothing), `eval --isa scalar` against the fp64 reference and against `--isa best`, and `attnbench info`.
// Sweeps over sweep.isa are tested in tests/test_sweep_run.cpp, its parsing in tests/test_sweep_config.cpp.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/kernels/simd.hpp"
#include "common/reference/reference.hpp"
#include "common/support/runtime.hpp"
#include "tests/support/attention_case.hpp"
#include "tests/support/process.hpp"

using namespace attn;
using namespace attn::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// "best, avx3, avx2, ..., scalar": how every --isa / sweep.isa error lists what may be chosen.
std::string supported_list() {
  std::string s = "best";
  for (const auto& n : simd::isa_info().supported) s += ", " + n;
  return s;
}

// An error for `--isa nosuch`: exit 2, naming the option, the value and the supported targets.
void check_isa_refused(const ProcResult& r, const std::string& what = "--isa") {
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Contains(what + " 'nosuch'"));
  CHECK_THAT(r.err, Contains("supported: " + supported_list()));
}

// Seeded Q, K, V for `variant` (batch 2, 3 heads) written to q.npy, k.npy and v.npy in `dir`.
struct QkvFiles {
  AttentionCase c;
  QkvFiles(const ScratchDir& dir, const std::string& variant, int64_t seq, int64_t head_dim)
      : c(make_test_problem(variant, 2, 3, seq, seq, head_dim), 21) {
    c.write_files(dir);
  }
  std::vector<std::string> eval_args(const std::string& variant, const std::string& out) const {
    return {"eval",  "--variant", variant, "--q",   "q.npy", "--k",
            "k.npy", "--v",       "v.npy", "--out", out,     "--compare"};
  }
};

}  // namespace

TEST_CASE("an unsupported --isa name exits 2 naming --isa, the value and the supported targets",
          "[cli][isa]") {
  ScratchDir dir("isa-cli");
  REQUIRE_FALSE(simd::isa_info().supported.empty());
  SECTION("eval, before reading any file or writing the output") {
    const QkvFiles f(dir, "naive", 8, 8);
    std::vector<std::string> args = f.eval_args("naive", "O.npy");
    args.insert(args.end(), {"--isa", "nosuch"});
    check_isa_refused(run_attnbench(args, dir.path()));
    CHECK_FALSE(fs::exists(dir.path() / "O.npy"));
  }
  SECTION("check") {
    check_isa_refused(run_attnbench({"check", "--variant", "naive", "--isa", "nosuch"}, dir.path()));
  }
  SECTION("layer, before writing the output") {
    check_isa_refused(run_attnbench(
        {"layer", "--x", "x.npy", "--weights", ".", "--heads", "2", "--out", "Y.npy", "--isa", "nosuch"},
        dir.path()));
    CHECK_FALSE(fs::exists(dir.path() / "Y.npy"));
  }
  SECTION("run, before the output folder is created") {
    write_text(dir.path() / "c.json",
               R"({"name": "c", "variants": ["naive"], "sweep": {"seq_len": 8, "threads": 1}})");
    check_isa_refused(run_attnbench({"run", "c.json", "--out", "out", "--isa", "nosuch"}, dir.path()));
    CHECK_FALSE(fs::exists(dir.path() / "out"));
    CHECK_FALSE(fs::exists(dir.path() / "results"));
  }
  SECTION("a name compiled in but not supported by this CPU says so") {
    std::string unsupported;
    for (const auto& n : simd::isa_info().compiled)
      if (std::find(simd::isa_info().supported.begin(), simd::isa_info().supported.end(), n) ==
          simd::isa_info().supported.end())
        unsupported = n;
    if (unsupported.empty()) {
      SUCCEED("this CPU supports every compiled target");
    } else {
      const ProcResult r = run_attnbench({"check", "--variant", "naive", "--isa", unsupported}, dir.path());
      CHECK(r.code == 2);
      CHECK_THAT(r.err, Contains("--isa '" + unsupported + "'"));
      CHECK_THAT(r.err, Contains("does not support"));
      CHECK_THAT(r.err, Contains("supported: " + supported_list()));
    }
  }
}

TEST_CASE("attnbench_gbench --isa: an unsupported name exits 2 before any benchmark runs", "[cli][isa]") {
  const fs::path gbench = fs::path(ATTNBENCH_EXE).parent_path() / "attnbench_gbench";
  if (!fs::exists(gbench)) {
    WARN("attnbench_gbench not built (ATTN_BUILD_GBENCH=OFF): skipped");
    return;
  }
  ScratchDir dir("isa-gbench");
  for (const std::vector<std::string>& isa :
       {std::vector<std::string>{"--isa=nosuch"}, {"--isa", "nosuch"}}) {
    std::vector<std::string> args{"--benchmark_list_tests=true"};
    args.insert(args.end(), isa.begin(), isa.end());
    const ProcResult r = run_process(gbench, args, ProcOptions{dir.path(), std::nullopt});
    INFO(gbench.string() << " " << join(args, " ") << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
    check_isa_refused(r);
    CHECK(r.out.empty());  // nothing listed
  }
}

TEST_CASE("eval --isa scalar matches the fp64 reference and --isa best, for every registered variant",
          "[cli][isa]") {
  ScratchDir dir("isa-eval");
  const std::string best = simd::isa_info().best;
  for (const Attention* variant : Registry::instance().all()) {
    const Capabilities caps = variant->capabilities();
    // The recurrences (gate / beta / state) need g, beta and files of their own for each: `attnbench check
    // --isa` (test_registry_checks) and tests/test_recurrent.cpp cover them on every target.
    if (caps.state || caps.gate != Gate::none || caps.beta) continue;
    // An indexer reads index inputs of its own (eval --index-q/k/w): tests/test_determinism.cpp runs it
    // through eval, tests/test_dsa.cpp and `attnbench check` on its own inputs.
    if (caps.indexer) continue;
    for (const bool causal : {false, true}) {
      const std::string name = variant->name();
      // Odd sizes: every kernel's vector tails and remainders run.
      const QkvFiles f(dir, name, 37, 24);
      Problem p = f.c.p;
      p.mask.causal = causal;
      if (!variant->not_supported_reasons(p).empty()) continue;
      INFO(name << (causal ? " causal" : ""));
      FloatArray out[2];
      Json report[2];
      const std::vector<std::string> isas{"scalar", "best"};
      for (std::size_t i = 0; i < 2; ++i) {
        const std::string o = "O_" + isas[i] + ".npy";
        std::vector<std::string> args = f.eval_args(name, o);
        args.insert(args.end(), {"--isa", isas[i]});
        if (causal) args.push_back("--causal");
        const ProcResult r = run_attnbench(args, dir.path());
        REQUIRE(r.code == 0);
        REQUIRE_NOTHROW(report[i] = Json::parse(r.out));
        out[i] = read_npy_float(dir.file(o));
      }
      // The target that ran, not the name asked for: "best" resolves to this CPU's best target.
      CHECK(report[0].at("isa") == "scalar");
      CHECK(report[1].at("isa") == best);
      const AttentionInputs in = f.c.inputs(nullptr, &p);
      if (variant->capabilities().exact) {
        // Both targets within the derived fp32 bound of exact attention in fp64.
        const double tol = exact_abs_tolerance(p, in);
        CHECK(report[0].at("max_abs_err").get<double>() <= tol);
        CHECK(report[1].at("max_abs_err").get<double>() <= tol);
      }
      CHECK(report[0].at("nan_count") == 0);
      // Scalar and vector code differ only in fp32 rounding (summation order, the exp polynomial's lanes):
      // outputs are O(1) (V ~ N(0, 1)), so 1e-4 is far above rounding and far below any real bug.
      REQUIRE(out[0].shape == out[1].shape);
      double max_diff = 0;
      for (std::size_t e = 0; e < out[0].numel(); ++e)
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(out[0].data[e] - out[1].data[e])));
      CHECK(max_diff <= 1e-4);
    }
  }
}

TEST_CASE("check --isa scalar runs the registry checks on the scalar target and says so", "[cli][isa]") {
  ScratchDir dir("isa-check");
  const ProcResult r =
      run_attnbench({"check", "--variant", "naive", "--quiet", "--isa", "scalar"}, dir.path());
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("SIMD target: scalar (--isa scalar)"));
  CHECK_THAT(r.out, Contains(" passed, 0 failed"));
}

TEST_CASE("attnbench info: CPU, SIMD targets, BLAS and core, TBB, threads, and --json parses with every key",
          "[cli][isa]") {
  ScratchDir dir("isa-info");
  const simd::IsaInfo& isa = simd::isa_info();
  const ProcResult j = run_attnbench({"--threads", "1", "info", "--json"}, dir.path());
  REQUIRE(j.code == 0);
  Json info;
  REQUIRE_NOTHROW(info = Json::parse(j.out));
  CHECK(info.at("cpu_model").is_string());
  CHECK(info.at("isa").at("compiled") == Json(isa.compiled));
  CHECK(info.at("isa").at("supported") == Json(isa.supported));
  CHECK(info.at("isa").at("best") == isa.best);
  CHECK(info.at("isa").at("supported").back() == info["isa"]["compiled"].back());  // the fallback
  CHECK_THAT(info.at("blas").at("library").get<std::string>(), Contains("OpenBLAS"));
  CHECK_FALSE(info.at("blas").at("core").get<std::string>().empty());
  CHECK((info.at("blas").at("coretype_env").is_null() || info["blas"]["coretype_env"].is_string()));
  CHECK(info.at("blas").at("note").is_string());
  CHECK_FALSE(info.at("tbb").at("version").get<std::string>().empty());
  CHECK(info.at("threads") == 1);  // --threads 1
  CHECK(info.at("cores_available").get<int>() >= 1);
  // The kernels variants pick here (Attention::kernels): tiled's bf16 kernel, one line each in the text.
  CHECK(info.at("kernels").at("tiled").at("bf16") == Registry::instance().get("tiled").kernels().at("bf16"));

  const ProcResult h = run_attnbench({"info"}, dir.path());
  REQUIRE(h.code == 0);
  CHECK_THAT(h.out, Contains("best " + isa.best));
  CHECK_THAT(h.out, Contains("supported: " + supported_list().substr(6)));  // without "best, "
  CHECK_THAT(h.out, Contains("core: " + info["blas"]["core"].get<std::string>()));
  CHECK_THAT(h.out, Contains("tbb:"));
  CHECK_THAT(h.out, Contains("threads:"));
  CHECK_THAT(h.out,
             Contains("kernels:   tiled bf16: " + info["kernels"]["tiled"]["bf16"].get<std::string>()));
}

TEST_CASE(
    "OpenBLAS kernels narrower than the CPU that OpenBLAS fell back to are replaced, unless "
    "ATTN_BLAS_AUTOCORE=0",
    "[isa][cli]") {
  // The pick: the CPU's width when OpenBLAS's core has narrower kernels; its own choice otherwise.
  CHECK(blas_fallback_core("Prescott", true, true) == "SkylakeX");  // Emerald Rapids on OpenBLAS 0.3.21
  CHECK(blas_fallback_core("Prescott", false, true) == "Haswell");
  CHECK(blas_fallback_core("Nehalem", false, true) == "Haswell");
  CHECK(blas_fallback_core("Prescott", false, false).empty());  // an SSE-only CPU: nothing wider to run
  CHECK(blas_fallback_core("SkylakeX", true, true).empty());
  CHECK(blas_fallback_core("SapphireRapids", true, true).empty());
  CHECK(blas_fallback_core("Zen", true, true).empty());  // OpenBLAS's own choice for Zen 4: not a fallback
  CHECK(blas_fallback_core("Haswell", false, true).empty());

  // End to end, from an environment without OPENBLAS_CORETYPE (the suite itself may run re-executed with
  // it): the core attnbench reports is never one OpenBLAS fell back to on this CPU; when attnbench replaced
  // one it says which, and ATTN_BLAS_AUTOCORE=0 keeps OpenBLAS's pick.
  ScratchDir dir("blas-autocore");
  const std::vector<std::string> clean = {"-u", "OPENBLAS_CORETYPE", "-u", "ATTN_BLAS_AUTOCORE_FROM"};
  auto info = [&](const std::vector<std::string>& env) {
    std::vector<std::string> args = clean;
    args.insert(args.end(), env.begin(), env.end());
    args.insert(args.end(), {ATTNBENCH_EXE, "info", "--json"});
    const ProcResult r = run_process("/usr/bin/env", args, ProcOptions{dir.path(), std::nullopt});
    REQUIRE(r.code == 0);
    return Json::parse(r.out).at("blas");
  };
  const Json own = info({"ATTN_BLAS_AUTOCORE=0"});
  CHECK(own.at("coretype_env").is_null());
  CHECK(own.at("autocore_from").is_null());
  const Json fixed = info({});
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const std::string want = blas_fallback_core(own.at("core").get<std::string>(), avx512, avx2);
  INFO("OpenBLAS's own pick " << own.dump() << ", attnbench's " << fixed.dump());
  if (want.empty()) {  // OpenBLAS knows this CPU: nothing changed
    CHECK(fixed.at("core") == own.at("core"));
    CHECK(fixed.at("autocore_from").is_null());
  } else {
    CHECK(fixed.at("core") == want);
    CHECK(fixed.at("coretype_env") == want);
    CHECK(fixed.at("autocore_from") == own.at("core"));
  }
#else
  CHECK(fixed.at("core") == own.at("core"));
#endif
}
