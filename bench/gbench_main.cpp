// attnbench_gbench: Google Benchmark driver over the registry. Registers one benchmark per (variant, problem)
// of a sweep config (default configs/gbench.json), named by the point's id (with ",Hkv=N" for grouped-query
// points), with GFLOP/s and GB/s (the variant's bytes_moved) counters, so
// --benchmark_filter, --benchmark_out and Google Benchmark's compare.py work as usual. --isa NAME (default
// best) picks the SIMD target, as in `attnbench run`: every point of a config without sweep.isa runs on it;
// each benchmark's label names the target that ran.
//   attnbench_gbench [--config=PATH] [--isa=NAME] [--benchmark_* flags]
#include <benchmark/benchmark.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "bench/lib/inputs.hpp"
#include "bench/lib/plan.hpp"
#include "common/error.hpp"
#include "common/half.hpp"
#include "common/runtime.hpp"
#include "common/simd.hpp"

namespace {

void run_point(benchmark::State& state, const attn::SweepPoint& pt) {
  const attn::Attention& variant = attn::Registry::instance().get(pt.problem.variant);
  const attn::PointInputs inputs = attn::make_inputs(pt);
  // O has the query heads; K and V (in `inputs`) kv_heads.
  attn::FloatArray out({pt.problem.batch, pt.problem.heads, pt.problem.seq_q, pt.problem.head_dim});
  // A bf16 / fp16 point (sweep.dtype) reads its inputs rounded from the fp32 ones, as in `attnbench run`.
  const attn::StoredInputs stored(pt.problem, inputs.view(nullptr));
  attn::AttentionInputs in = stored.get();
  in.out = out.ptr();
  const attn::simd::ScopedIsa isa(pt.isa, "sweep.isa");
  attn::ThreadScope scope(pt.threads);
  state.SetLabel("isa=" + attn::simd::active_isa());
  for (auto _ : state) {
    variant.run(pt.problem, in);
    benchmark::DoNotOptimize(out.ptr());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(variant.flops(pt.problem) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // The variant's own traffic count (bytes_moved, the sweep rows' `bytes`) per second: the roofline's x/y.
  if (const auto bytes = attn::point_bytes(pt))
    state.counters["GB/s"] = benchmark::Counter(*bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = pt.threads;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path = std::string(ATTN_SOURCE_DIR) + "/configs/gbench.json";
  std::string isa = "best";
  std::vector<char*> args;
  // Our options are taken out before Google Benchmark sees (and refuses) them.
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--config=", 9) == 0) {
      config_path = argv[i] + 9;
    } else if (std::strncmp(argv[i], "--isa=", 6) == 0) {
      isa = argv[i] + 6;
    } else if (std::strcmp(argv[i], "--isa") == 0) {
      if (i + 1 == argc) {
        std::cerr << "attnbench_gbench: error: --isa needs a value: best or a SIMD target name\n";
        return 2;
      }
      isa = argv[++i];
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;
  try {
    attn::simd::select_isa(isa, "--isa");
    const attn::Plan plan = attn::load_plan(config_path, isa);
    for (const attn::SweepPoint& pt : plan.points) {
      // The same skip decision (unsupported, or over the config's memory budget) as `attnbench run`.
      if (const std::string why = attn::skip_reason(pt, plan.config); !why.empty()) {
        std::cerr << "SKIPPED " << pt.id << ": " << why << "\n";
        continue;
      }
      benchmark::RegisterBenchmark(pt.id.c_str(), run_point, pt)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    benchmark::AddCustomContext("attnbench_git_commit", ATTN_GIT_COMMIT);
    benchmark::AddCustomContext("attnbench_build_type", ATTN_BUILD_TYPE);
    benchmark::AddCustomContext("attnbench_config", config_path);
    benchmark::AddCustomContext("attnbench_threads_available", std::to_string(attn::available_threads()));
    std::string supported;
    for (const auto& name : attn::simd::isa_info().supported)
      supported += (supported.empty() ? "" : ",") + name;
    benchmark::AddCustomContext("attnbench_isa_option", isa);
    benchmark::AddCustomContext("attnbench_isa_supported", supported);
  } catch (const attn::UsageError& e) {
    std::cerr << "attnbench_gbench: error: " << e.what() << "\n";
    return 2;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
