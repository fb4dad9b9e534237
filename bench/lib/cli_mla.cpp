// `attnbench mla`: multi-head latent attention (DeepSeek-V2/V3, common/frontends/mla.hpp) in its naive and
// absorbed forms, one layer call of s new tokens after a KV cache of T: times, FLOPs, cache bytes per token,
// bytes read and the error against the fp64 definition, per form; optionally JSON lines (--out).
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>

#include "bench/lib/calibration.hpp"
#include "bench/lib/command.hpp"
#include "bench/lib/stats.hpp"
#include "bench/lib/sysinfo.hpp"
#include "common/frontends/mla.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"

namespace attn::cli {
namespace {

// Tokens per prefill call while the cache is filled (outside the timed region): bounds the core's
// workspace whatever the context.
constexpr int64_t kPrefillChunk = 512;

struct MlaOptions {
  std::string preset, config, form = "both", variant, out, weights, isa = "best";
  std::vector<std::string> params;
  std::optional<int64_t> d_model, heads, q_lora, kv_lora, nope, rope, v_dim;
  std::optional<double> rope_base;
  int64_t context = 1024, fresh = 1, batch = 1, seed = 0;
  int threads = 0, repeats = 10, warmup = 1;
  bool no_check = false;
};

MlaShape shape_from(const MlaOptions& o) {
  MlaShape s;
  if (!o.config.empty()) {
    if (o.preset.empty())
      throw UsageError("--config '" + o.config + "' needs --preset NAME (one of its presets)");
    const auto presets = load_mla_presets(o.config);
    std::vector<std::string> names;
    for (const auto& [name, shape] : presets) names.push_back(name);
    const auto it =
        std::find_if(presets.begin(), presets.end(), [&](const auto& p) { return p.first == o.preset; });
    if (it == presets.end())
      throw UsageError("--preset '" + o.preset + "': not in --config '" + o.config +
                       "' (its presets: " + join(names, ", ") + ")");
    s = it->second;
  } else if (!o.preset.empty()) {
    s = mla_preset(o.preset, "--preset");
  } else {
    std::string missing;
    for (auto [given, flag] : {std::pair{o.d_model.has_value(), "--d-model"},
                               {o.heads.has_value(), "--heads"},
                               {o.kv_lora.has_value(), "--kv-lora-rank"},
                               {o.nope.has_value(), "--qk-nope-dim"},
                               {o.rope.has_value(), "--qk-rope-dim"},
                               {o.v_dim.has_value(), "--v-head-dim"}})
      if (!given) missing += std::string(missing.empty() ? "" : ", ") + flag;
    if (!missing.empty())
      throw UsageError("mla: without --preset the shape needs " + missing +
                       " (or --preset deepseek_v3 | deepseek_v2_lite | tiny, which flags then override)");
  }
  if (o.d_model) s.d_model = *o.d_model;
  if (o.heads) s.heads = *o.heads;
  if (o.q_lora) s.q_lora_rank = *o.q_lora;
  if (o.kv_lora) s.kv_lora_rank = *o.kv_lora;
  if (o.nope) s.qk_nope_dim = *o.nope;
  if (o.rope) s.qk_rope_dim = *o.rope;
  if (o.v_dim) s.v_head_dim = *o.v_dim;
  if (o.rope_base) s.rope_base = *o.rope_base;
  s.validate();
  return s;
}

// One form's figures.
struct FormResult {
  MlaForm form;
  TimingStats time;
  double flops = 0, bytes_read = 0;
  std::optional<double> rel_l2;
  int64_t cache_elements_per_token = 0;
  std::size_t cache_bytes_per_token = 0;
  std::string core;  // the core problem's repro string
};

double rel_l2(const FloatArray& got, const DoubleArray& want) {
  double num = 0, den = 0;
  for (std::size_t e = 0; e < got.numel(); ++e) {
    const double d = got.data[e] - want.data[e];
    num += d * d;
    den += want.data[e] * want.data[e];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Tokens [from, from + n) of x [B, L, E].
FloatArray slice(const FloatArray& x, int64_t from, int64_t n) {
  const int64_t B = x.shape[0], L = x.shape[1], E = x.shape[2];
  FloatArray out({B, n, E});
  for (int64_t b = 0; b < B; ++b) std::copy_n(x.ptr() + (b * L + from) * E, n * E, out.ptr() + b * n * E);
  return out;
}

std::string error_text(const std::optional<double>& rel_l2) {
  if (!rel_l2) return "skipped (--no-check)";
  char text[32];
  std::snprintf(text, sizeof text, "%.3e", *rel_l2);
  return text;
}

FormResult measure_form(const MlaOptions& o, const MlaLayer& layer, MlaForm form, const MlaCall& call,
                        const FloatArray& x, const DoubleArray* want) {
  const int64_t B = o.batch, T = o.context, s = o.fresh;
  FormResult r;
  r.form = form;
  r.core = layer.core_problem(form, call, B, s, T).repro();  // refuses a core that cannot run it, up front
  MlaCache cache(layer.shape(), form, B, T + s);
  // The context, prefilled through the layer in chunks (not timed).
  for (int64_t at = 0; at < T; at += kPrefillChunk)
    layer.forward(slice(x, at, std::min(kPrefillChunk, T - at)), cache, call);
  const FloatArray fresh = slice(x, T, s);
  FloatArray y;
  std::vector<double> samples;
  for (int rep = 0; rep < o.warmup + o.repeats; ++rep) {
    cache.truncate(T);  // every call appends the same s tokens after the same T
    const auto t0 = std::chrono::steady_clock::now();
    y = layer.forward(fresh, cache, call);
    const auto t1 = std::chrono::steady_clock::now();
    if (rep >= o.warmup) samples.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  r.time = summarize(samples);
  r.flops = layer.flops(form, call, B, s, T);
  r.bytes_read = layer.bytes_read(form, B, s, T);
  r.cache_elements_per_token = mla_cache_elements_per_token(layer.shape(), form);
  r.cache_bytes_per_token = cache.bytes_per_token();
  if (want) r.rel_l2 = rel_l2(y, *want);
  return r;
}

Json result_row(const MlaOptions& o, const MlaShape& s, const FormResult& r, const std::string& variant,
                int threads, const FmaPeak& peak) {
  Json shape = {{"d_model", s.d_model},         {"heads", s.heads},
                {"q_lora_rank", s.q_lora_rank}, {"kv_lora_rank", s.kv_lora_rank},
                {"qk_nope_dim", s.qk_nope_dim}, {"qk_rope_dim", s.qk_rope_dim},
                {"v_head_dim", s.v_head_dim},   {"rope_base", s.rope_base}};
  const double seconds = r.time.median_ms * 1e-3;
  return {{"kind", "mla"},
          {"form", mla_form_name(r.form)},
          {"preset", o.preset.empty() ? Json(nullptr) : Json(o.preset)},
          {"shape", shape},
          {"batch", o.batch},
          {"context", o.context},
          {"new_tokens", o.fresh},
          {"variant", variant},
          {"core", r.core},
          {"threads", threads},
          {"cache_elements_per_token", r.cache_elements_per_token},
          {"cache_bytes_per_token", r.cache_bytes_per_token},
          {"flops", r.flops},
          {"gflops_per_s", r.flops / seconds * 1e-9},
          {"fma_peak", {{"gflops", peak.gflops}, {"isa", peak.isa}, {"threads", peak.threads}}},
          {"frac_peak", peak.gflops > 0 ? Json(r.flops / seconds * 1e-9 / peak.gflops) : Json(nullptr)},
          {"bytes_read", r.bytes_read},
          {"gb_per_s", r.bytes_read / seconds * 1e-9},
          {"median_ms", r.time.median_ms},
          {"p10_ms", r.time.p10_ms},
          {"p90_ms", r.time.p90_ms},
          {"repeats", r.time.reps},
          {"samples_ms", r.time.samples_ms},
          {"rel_l2", r.rel_l2 ? Json(*r.rel_l2) : Json(nullptr)},
          {"machine", {{"cpu_model", cpu_model()}, {"isa", isa_json()}, {"blas", blas_json()}}},
          {"timestamp", now_iso8601()}};
}

int run_mla(const MlaOptions& o) {
  simd::select_isa(o.isa, "--isa");
  const MlaShape s = shape_from(o);
  if (o.context < 0)
    throw UsageError("--context " + std::to_string(o.context) + ": must be >= 0 (cached tokens)");
  if (o.fresh < 1)
    throw UsageError("--new " + std::to_string(o.fresh) + ": must be >= 1 (1 = one decode step)");
  if (o.batch < 1) throw UsageError("--batch " + std::to_string(o.batch) + ": must be >= 1");
  if (o.threads < 0) throw UsageError("--threads " + std::to_string(o.threads) + ": must be >= 1");
  if (o.repeats < 1 || o.warmup < 0)
    throw UsageError("--repeats " + std::to_string(o.repeats) + " / --warmup " + std::to_string(o.warmup) +
                     ": repeats must be >= 1 and warmup >= 0");
  std::vector<MlaForm> forms;
  if (o.form == "both")
    forms = {MlaForm::naive, MlaForm::absorbed};
  else
    forms = {parse_mla_form(o.form, "--form (naive, absorbed or both)")};
  std::optional<ThreadScope> scope;  // --threads after the subcommand; else the global --threads is in force
  if (o.threads > 0) scope.emplace(o.threads);
  const int threads =
      static_cast<int>(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
  MlaCall call;
  call.variant = o.variant;
  if (!o.variant.empty()) call.params = parse_cli_params(Registry::instance().get(o.variant), o.params);
  MlaLayer layer(s, o.weights.empty() ? random_mla_weights(s, static_cast<uint64_t>(o.seed))
                                      : load_mla_weights(o.weights, s));
  const std::string variant =
      Registry::instance()
          .get(layer.core_problem(forms[0], call, o.batch, o.fresh, o.context).variant)
          .name();
  FloatArray x({o.batch, o.context + o.fresh, s.d_model});
  fill_normal(x.ptr(), static_cast<int64_t>(x.numel()), mix64(static_cast<uint64_t>(o.seed) ^ 0x78));
  std::optional<DoubleArray> want;
  if (!o.no_check) want = mla_reference(s, layer.weights(), x, o.context);
  // The absorbed form's decode is compute-bound (fp32 cache: ~15 FLOP per byte at 16 heads, ~120 at V3's
  // 128): its GFLOP/s reads against the machine's fp32 FMA peak on the same threads and SIMD target, measured
  // here.
  const FmaPeak peak = calibrate_fma_peak(threads);
  std::printf(
      "mla %s  batch %lld  context %lld  new %lld  core %s  threads %d  cpu %s  FMA peak %.1f GFLOP/s (%s)\n",
      s.str().c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.context),
      static_cast<long long>(o.fresh), variant.c_str(), threads, cpu_model().c_str(), peak.gflops,
      peak.isa.c_str());
  std::string lines;
  std::vector<FormResult> results;
  for (MlaForm form : forms) {
    const FormResult r = measure_form(o, layer, form, call, x, want ? &*want : nullptr);
    const double sec = r.time.median_ms * 1e-3;
    std::printf(
        "  %-8s median %10.4f ms (p10 %.4f, p90 %.4f, %d reps)  %.4g GFLOP  %8.2f GFLOP/s (%.2f of peak)  "
        "cache %zu B/token  read %.4g MB (%.2f GB/s)  rel_l2 %s\n",
        mla_form_name(form), r.time.median_ms, r.time.p10_ms, r.time.p90_ms, r.time.reps, r.flops * 1e-9,
        r.flops / sec * 1e-9, peak.gflops > 0 ? r.flops / sec * 1e-9 / peak.gflops : 0.0,
        r.cache_bytes_per_token, r.bytes_read * 1e-6, r.bytes_read / sec * 1e-9,
        error_text(r.rel_l2).c_str());
    lines += result_row(o, s, r, variant, threads, peak).dump() + "\n";
    results.push_back(r);
  }
  if (results.size() == 2)
    std::printf("  naive / absorbed: time %.3fx, cache bytes per token %.3fx\n",
                results[0].time.median_ms / results[1].time.median_ms,
                static_cast<double>(results[0].cache_bytes_per_token) /
                    static_cast<double>(results[1].cache_bytes_per_token));
  if (!o.out.empty()) write_file_atomic(o.out, lines);
  return 0;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND(
    "mla",
    "multi-head latent attention (DeepSeek-V2/V3) in its naive and absorbed forms: one layer call of --new "
    "tokens after a KV cache of --context, timed, with FLOPs, cache bytes per token and the error against "
    "the fp64 definition",
    [](CLI::App& sub) {
      auto o = std::make_shared<attn::cli::MlaOptions>();
      sub.add_option("--preset", o->preset,
                     "deepseek_v3, deepseek_v2_lite or tiny; shape flags override its fields");
      sub.add_option(
          "--config", o->config,
          "a file of presets ({\"presets\": {NAME: {d_model, heads, q_lora_rank, kv_lora_rank, qk_nope_dim, "
          "qk_rope_dim, v_head_dim, rope_base}}}, e.g. configs/mla.json): --preset names one of them");
      sub.add_option("--d-model", o->d_model, "model width E (dim)");
      sub.add_option("--heads", o->heads, "attention heads H");
      sub.add_option("--q-lora-rank", o->q_lora, "query compression rank (0: none, q = x wq^T; default 0)");
      sub.add_option("--kv-lora-rank", o->kv_lora, "latent width (kv_lora_rank)");
      sub.add_option("--qk-nope-dim", o->nope, "per-head query/key width without RoPE");
      sub.add_option("--qk-rope-dim", o->rope, "per-head query/key width with RoPE (even)");
      sub.add_option("--v-head-dim", o->v_dim, "per-head value width");
      sub.add_option("--rope-base", o->rope_base, "RoPE base (rope_theta; default 10000)");
      sub.add_option("--form", o->form, "naive, absorbed or both (default both)");
      sub.add_option("--context", o->context, "cached tokens T before the timed call (default 1024)");
      sub.add_option("--new", o->fresh, "new tokens per timed call (1 = a decode step; default 1)");
      sub.add_option("--batch", o->batch, "sequences per call (default 1)");
      sub.add_option("--variant", o->variant,
                     "core attention variant; it must read a reserved cache in place (`attnbench list`: "
                     "strided_kv; default: the exact one that is not the baseline)");
      sub.add_option("--param", o->params, "core variant parameter NAME=VALUE (repeatable)");
      sub.add_option("--threads", o->threads,
                     "worker threads for this command (default: the global --threads, else all)");
      sub.add_option("--repeats", o->repeats, "timed calls per form (default 10); the median is reported");
      sub.add_option("--warmup", o->warmup, "untimed calls before them (default 1)");
      sub.add_option("--seed", o->seed, "seed of the random weights and tokens (default 0)");
      sub.add_option(
          "--weights", o->weights,
          "directory of .npy weights (wq or wq_a, q_norm, wq_b; wkv_a, kv_norm, wkv_b, wo; torch.nn.Linear "
          "layout) instead of random ones");
      sub.add_flag("--no-check", o->no_check, "skip the fp64 definition (slow at large shapes and contexts)");
      attn::cli::add_isa_option(sub, o->isa);
      sub.add_option("--out", o->out, "write one JSON line per form to this file (replaced atomically)");
      return std::function<int()>([o] { return attn::cli::run_mla(*o); });
    })
