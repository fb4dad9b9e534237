// attnbench_gbench: Google Benchmark driver over the registry. Registers one benchmark per (variant, problem,
// pass) of a sweep config (default configs/gbench.json), named by the point's id (with ",Hkv=N" for
// grouped-query points and ",pass=NAME" for backward passes), with GFLOP/s and GB/s (the variant's
// bytes_moved) counters, so
// --benchmark_filter, --benchmark_out and Google Benchmark's compare.py work as usual. --isa NAME (default
// best) picks the SIMD target, as in `attnbench run`: every point of a config without sweep.isa runs on it;
// each benchmark's label names the target that ran.
// --plugin PATH (repeatable, or ATTNBENCH_PLUGINS, or the config's "plugins") adds out-of-tree variants.
//   attnbench_gbench [--config=PATH] [--isa=NAME] [--plugin=PATH ...] [--benchmark_* flags]
#include <benchmark/benchmark.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "bench/lib/decode_state.hpp"
#include "bench/lib/inputs.hpp"
#include "bench/lib/plan.hpp"
#include "common/interface/half.hpp"
#include "common/interface/plugin_loader.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/error.hpp"
#include "common/support/runtime.hpp"
#include ATTN_GIT_COMMIT_HEADER  // ATTN_GIT_COMMIT, stamped at build time (cmake/git_commit.cmake)

namespace {

void time_point(benchmark::State& state, const attn::SweepPoint& pt) {
  const attn::Attention& variant = attn::Registry::instance().get(pt.problem.variant);
  const attn::PointInputs inputs = attn::make_inputs(pt);
  // O has the query heads, d_v wide; K and V (in `inputs`) kv_heads.
  attn::FloatArray out({pt.problem.batch, pt.problem.heads, pt.problem.seq_q, pt.problem.value_dim()});
  // What `attnbench run` gives the kernel (PointRunner::inputs_for): the gate its variant reads, a decode
  // point's state by the same untimed chunkwise prefill, and for a bf16 / fp16 point (sweep.dtype) Q, K, V
  // rounded from the fp32 ones.
  attn::AttentionInputs fp32 = inputs.view(pt.problem, nullptr);
  attn::DecodeStates states;
  states.prepare(pt, fp32);
  fp32.initial_state = states.state_for(pt.problem);
  const attn::StoredInputs stored(pt.problem, fp32);
  attn::AttentionInputs in = stored.get();
  in.out = out.ptr();
  const attn::simd::ScopedIsa isa(pt.isa, "sweep.isa");
  attn::ThreadScope scope(pt.threads);
  state.SetLabel("isa=" + attn::simd::active_isa() + ",pass=" + attn::pass_name(pt.pass));
  if (pt.pass == attn::Pass::forward) {
    for (auto _ : state) {
      variant.run(pt.problem, in);
      benchmark::DoNotOptimize(out.ptr());
      benchmark::ClobberMemory();
    }
  } else {
    // sweep.pass: the training forward once (untimed) for the backward's O and state, then per iteration
    // the backward alone, or a whole training step, as `attnbench run` times them.
    const attn::Problem& p = pt.problem;
    std::vector<float> saved(variant.saved_floats(p));
    variant.run_saving(p, in, saved.empty() ? nullptr : saved.data());
    const attn::FloatArray d_out = attn::make_d_out(pt);
    attn::FloatArray dq({p.batch, p.heads, p.seq_q, p.head_dim});
    attn::FloatArray dk({p.batch, p.num_kv_heads(), p.seq_kv, p.head_dim});
    attn::FloatArray dv({p.batch, p.num_kv_heads(), p.seq_kv, p.value_dim()});
    attn::GradientArgs g;
    g.out = out.ptr(), g.saved = saved.empty() ? nullptr : saved.data(), g.d_out = d_out.ptr();
    g.dq = dq.ptr(), g.dk = dk.ptr(), g.dv = dv.ptr();
    for (auto _ : state) {
      if (pt.pass == attn::Pass::forward_backward)
        variant.run_saving(p, in, saved.empty() ? nullptr : saved.data());
      variant.run_backward(p, in, g);
      benchmark::DoNotOptimize(dq.ptr());
      benchmark::ClobberMemory();
    }
  }
  // The pass's FLOPs (point_flops: the backward by the FlashAttention-2 convention unless the variant counts
  // its own).
  state.counters["GFLOP/s"] =
      benchmark::Counter(attn::point_flops(pt) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // The variant's own traffic count (bytes_moved, the sweep rows' `bytes`) per second: the roofline's x/y.
  if (const auto bytes = attn::point_bytes(pt))
    state.counters["GB/s"] = benchmark::Counter(*bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = pt.threads;
}

// A point whose variant throws (a missing input, a plugin's bug) is reported as this benchmark's error, and
// the others run: Google Benchmark names it with error_occurred and the message.
void run_point(benchmark::State& state, const attn::SweepPoint& pt) {
  try {
    time_point(state, pt);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  attn::reexec_with_blas_core(argv);  // OpenBLAS's kernels for this CPU when it fell back to narrower ones
  std::string config_path = std::string(ATTN_SOURCE_DIR) + "/configs/gbench.json";
  std::string isa = "best";
  std::vector<char*> args;
  std::vector<std::string> plugins;
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
    } else if (std::strncmp(argv[i], "--plugin=", 9) == 0) {
      plugins.emplace_back(argv[i] + 9);
    } else if (std::strcmp(argv[i], "--plugin") == 0) {
      if (i + 1 == argc) {
        std::cerr << "attnbench_gbench: error: --plugin needs the path of a plugin's shared library\n";
        return 2;
      }
      plugins.emplace_back(argv[++i]);
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;
  try {
    // Plugins (as in attnbench): ATTNBENCH_PLUGINS, then each --plugin; a config's "plugins" load with it.
    attn::load_env_plugins();
    for (const std::string& path : plugins) attn::load_plugin(path, "--plugin");
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
