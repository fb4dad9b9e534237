// `attnbench mla`: multi-head latent attention (DeepSeek-V2/V3, common/frontends/mla.hpp) in its naive and
// absorbed forms, one layer call of s new tokens after a KV cache of T: times, FLOPs, cache bytes per token,
// bytes read and the error against the fp64 definition, per form; optionally JSON lines (--out).
#include <tbb/global_control.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "bench/lib/calibration.hpp"
#include "bench/lib/command.hpp"
#include "bench/lib/compare.hpp"
#include "bench/lib/config.hpp"
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
  std::string sweep;  // --sweep CONFIG: its "mla" blocks instead of the flags' one point
  int64_t context = 1024, fresh = 1, batch = 1, seed = 0;
  int threads = 0, repeats = 10, warmup = 1;
  bool no_check = false, resume = false;
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

// One point's figures.
struct FormResult {
  MlaForm form = MlaForm::naive;
  bool gqa = false;  // the block's GQA core (form unused)
  int64_t context = 0, fresh = 1;
  TimingStats time;
  double core_median_ms = 0;  // the core variant's run() alone, median over the same calls
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

std::string error_text(const std::optional<double>& rel_l2, bool checked) {
  if (!rel_l2) return checked ? "?" : "not checked";
  char text[32];
  std::snprintf(text, sizeof text, "%.3e", *rel_l2);
  return text;
}

// The input tokens: token p of batch entry b is N(0, 1) from its own seed, so a long context is made piece by
// piece and any slice [from, from + n) equals the same tokens of the whole sequence.
FloatArray tokens(int64_t batch, int64_t from, int64_t n, int64_t d_model, uint64_t seed) {
  FloatArray x({batch, n, d_model});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i)
      fill_normal(
          x.ptr() + (b * n + i) * d_model, d_model,
          mix64(seed ^ 0x78 ^ mix64(static_cast<uint64_t>(b) << 40 ^ static_cast<uint64_t>(from + i))));
  return x;
}

// What one run measures: blocks of (preset, form, context, new) points, and where the rows go.
struct RunSpec {
  std::vector<MlaBlock> blocks;
  std::string config_name;  // --sweep: the config's name (rows carry it), else empty
  std::string weights_dir, out;
  uint64_t seed = 0;
  int threads = 0;
  bool resume = false;
  // --resume: the rows already in --out by their point id (mla_row_id), kept as written and not measured.
  std::map<std::string, std::string> kept;
};

// The fields that name a point (mla_row_id reads them): form ("naive", "absorbed" or "gqa"), the GQA core's
// shape, preset (null when the block gave the shape inline), shape, batch, context, new tokens, core
// variant and threads.
Json point_key(const MlaBlock& block, const std::string& preset, const MlaShape& s, const std::string& form,
               int64_t context, int64_t fresh, const std::string& variant, int threads) {
  Json shape = {{"d_model", s.d_model},         {"heads", s.heads},
                {"q_lora_rank", s.q_lora_rank}, {"kv_lora_rank", s.kv_lora_rank},
                {"qk_nope_dim", s.qk_nope_dim}, {"qk_rope_dim", s.qk_rope_dim},
                {"v_head_dim", s.v_head_dim},   {"rope_base", s.rope_base}};
  return {{"form", form},
          {"gqa", form == "gqa" ? Json{{"kv_heads", block.gqa_kv_heads}, {"head_dim", block.gqa_head_dim}}
                                : Json(nullptr)},
          {"preset", preset.empty() ? Json(nullptr) : Json(preset)},
          {"shape", shape},
          {"batch", block.batch},
          {"context", context},
          {"new_tokens", fresh},
          {"variant", variant},
          {"threads", threads}};
}

Json result_row(const RunSpec& spec, const MlaBlock& block, const std::string& preset, const MlaShape& s,
                const FormResult& r, const std::string& variant, int threads, const FmaPeak& peak) {
  const double seconds = r.time.median_ms * 1e-3;
  Json row = point_key(block, preset, s, r.gqa ? "gqa" : mla_form_name(r.form), r.context, r.fresh, variant,
                       threads);
  row.update(
      Json{{"kind", "mla"},
           {"config", spec.config_name.empty() ? Json(nullptr) : Json(spec.config_name)},
           {"core", r.core},
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
           {"core_median_ms", r.core_median_ms},
           {"repeats", r.time.reps},
           {"samples_ms", r.time.samples_ms},
           {"rel_l2", r.rel_l2 ? Json(*r.rel_l2) : Json(nullptr)},
           {"machine", {{"cpu_model", cpu_model()}, {"isa", isa_json()}, {"blas", blas_json()}}},
           {"timestamp", now_iso8601()}});
  return row;
}

// Weights plus every form's cache at the block's longest context, and (when a point is checked) the
// fp64 reference's K and V of every token: what one preset of the block holds at once.
double block_bytes(const MlaBlock& b, const MlaShape& s) {
  const int64_t tokens_max = b.context.back() + b.fresh.back();
  int64_t per_token = 0;
  for (MlaForm f : b.forms) per_token += mla_cache_elements_per_token(s, f);  // both caches are kept
  double weights = 0;
  const double E = static_cast<double>(s.d_model), H = static_cast<double>(s.heads),
               qk = static_cast<double>(s.qk_head_dim()), lat = static_cast<double>(s.latent_row());
  weights += s.q_lora_rank == 0
                 ? E * H * qk
                 : E * static_cast<double>(s.q_lora_rank) + static_cast<double>(s.q_lora_rank) * H * qk;
  weights += E * lat +
             static_cast<double>(s.kv_lora_rank) * H * static_cast<double>(s.qk_nope_dim + s.v_head_dim) +
             H * static_cast<double>(s.v_head_dim) * E;
  double checked = 0;
  const int64_t check_tokens = std::min(tokens_max, b.check_max_context);
  if (check_tokens > 0)
    checked = static_cast<double>(b.batch * check_tokens) * H *
              static_cast<double>(s.qk_head_dim() + s.v_head_dim) * 8.0;
  per_token += 2 * b.gqa_kv_heads * b.gqa_head_dim;  // the GQA core's K and V (0 without)
  return weights * 4.0 + static_cast<double>(b.batch * tokens_max * per_token) * 4.0 + checked;
}

uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

std::string block_name(const RunSpec& spec, std::size_t bi) {
  return "mla" + std::string(spec.blocks.size() > 1 ? "[" + std::to_string(bi) + "]" : "");
}

// Everything that can be checked before anything is measured: threads and footprints.
void check_blocks(const RunSpec& spec, int all_threads) {
  for (std::size_t bi = 0; bi < spec.blocks.size(); ++bi) {
    const MlaBlock& b = spec.blocks[bi];
    if (b.threads > all_threads)
      throw UsageError(block_name(spec, bi) + ".threads " + std::to_string(b.threads) + ": more than the " +
                       std::to_string(all_threads) + " threads available here");
    const uint64_t budget = b.memory_budget_bytes.value_or(physical_memory() / 2);
    for (const auto& [name, s] : b.presets) {
      const double need = block_bytes(b, s);
      if (budget > 0 && need > static_cast<double>(budget))
        throw UsageError(block_name(spec, bi) + ": preset '" + name + "' needs " +
                         std::to_string(static_cast<int64_t>(need / (1 << 20))) + " MiB at context " +
                         std::to_string(b.context.back()) + " + " + std::to_string(b.fresh.back()) +
                         " (weights, caches" + (b.check_max_context > 0 ? ", fp64 check" : "") +
                         "), over the memory budget of " + std::to_string(budget >> 20) +
                         " MiB: lower the largest context, or raise memory_budget");
    }
  }
}

// The block's GQA core (its "gqa"): the preset's query heads on kv_heads K/V heads of head_dim, K and V
// [B, kv_heads, capacity, head_dim] random and read in place by the MLA core's variant.
class GqaCore {
 public:
  GqaCore(const MlaBlock& b, const MlaLayer& layer, const MlaCall& call, uint64_t seed)
      : b_(b), heads_(layer.shape().heads), capacity_(b.context.back() + b.fresh.back()), seed_(seed) {
    template_ = layer.core_problem(MlaForm::naive, call, b.batch, b.fresh[0], b.context[0]);
    template_.kv_heads = b.gqa_kv_heads;
    template_.head_dim = b.gqa_head_dim;
    template_.v_head_dim = 0;
    template_.scale = 1.0 / std::sqrt(static_cast<double>(b.gqa_head_dim));
    for (int64_t T : b.context)  // refused up front, before anything is filled
      for (int64_t n : b.fresh) (void)problem(T, n);
    k_ = FloatArray({b.batch, b.gqa_kv_heads, capacity_, b.gqa_head_dim});
    v_ = FloatArray({b.batch, b.gqa_kv_heads, capacity_, b.gqa_head_dim});
    fill_normal(k_.ptr(), static_cast<int64_t>(k_.numel()), mix64(seed ^ 0x6b));
    fill_normal(v_.ptr(), static_cast<int64_t>(v_.numel()), mix64(seed ^ 0x76));
  }

  Problem problem(int64_t T, int64_t n) const {
    Problem p = template_;
    p.seq_q = n;
    p.seq_kv = T + n;
    p.validate();
    if (const std::string why = Registry::instance().get(p.variant).unsupported_reasons_text(p); !why.empty())
      throw NotSupported(p.repro() + ": " + why);
    return p;
  }

  // One decode call of n queries after T cached tokens, timed alone (the core is the whole call).
  FormResult measure(int64_t T, int64_t n) const {
    const Problem p = problem(T, n);
    const Attention& v = Registry::instance().get(p.variant);
    const int64_t d = b_.gqa_head_dim;
    FloatArray q({b_.batch, heads_, n, d}), o({b_.batch, heads_, n, d});
    fill_normal(q.ptr(), static_cast<int64_t>(q.numel()), mix64(seed_ ^ 0x71 ^ static_cast<uint64_t>(T)));
    AttentionInputs in{};
    in.q = q.ptr();
    in.k = k_.ptr();
    in.v = v_.ptr();
    in.out = o.ptr();
    in.kv_capacity = capacity_;
    std::vector<double> samples;
    for (int rep = 0; rep < b_.warmup + b_.repeats; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      v.run(p, in);
      const auto t1 = std::chrono::steady_clock::now();
      if (rep >= b_.warmup) samples.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    FormResult r;
    r.gqa = true;
    r.context = T;
    r.fresh = n;
    r.core = p.repro();
    r.time = summarize(samples);
    r.core_median_ms = r.time.median_ms;
    r.flops = v.flops(p);
    r.cache_elements_per_token = 2 * b_.gqa_kv_heads * d;
    r.cache_bytes_per_token = static_cast<std::size_t>(r.cache_elements_per_token) * sizeof(float);
    r.bytes_read =
        static_cast<double>(b_.batch * (T + n) * r.cache_elements_per_token + 2 * b_.batch * heads_ * n * d) *
        sizeof(float);
    return r;
  }

 private:
  const MlaBlock& b_;
  int64_t heads_, capacity_;
  uint64_t seed_;
  Problem template_;
  FloatArray k_, v_;
};

// One MLA layer call of n new tokens after the cache's T tokens, timed `repeats` times from the same T
// (the cache is truncated back to T before each call and after the last).
FormResult measure_point(const MlaBlock& b, const MlaLayer& layer, const MlaCall& call, MlaCache& cache,
                         int64_t T, int64_t n, uint64_t seed, FloatArray& y) {
  FormResult r;
  r.form = cache.form();
  r.context = T;
  r.fresh = n;
  r.core = layer.core_problem(r.form, call, b.batch, n, T).repro();
  const FloatArray fresh = tokens(b.batch, T, n, layer.shape().d_model, seed);
  std::vector<double> samples, core;
  for (int rep = 0; rep < b.warmup + b.repeats; ++rep) {
    cache.truncate(T);
    double core_ms = 0;
    const auto t0 = std::chrono::steady_clock::now();
    y = layer.forward(fresh, cache, call, &core_ms);
    const auto t1 = std::chrono::steady_clock::now();
    if (rep < b.warmup) continue;
    samples.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    core.push_back(core_ms);
  }
  cache.truncate(T);
  r.time = summarize(samples);
  r.core_median_ms = summarize(core).median_ms;
  r.flops = layer.flops(r.form, call, b.batch, n, T);
  r.bytes_read = layer.bytes_read(r.form, b.batch, n, T);
  r.cache_elements_per_token = mla_cache_elements_per_token(layer.shape(), r.form);
  r.cache_bytes_per_token = cache.bytes_per_token();
  return r;
}

void print_point(const FormResult& r, bool checked, const FmaPeak& peak) {
  const double sec = r.time.median_ms * 1e-3;
  std::printf(
      "  %-8s context %6lld  new %5lld  median %10.4f ms (p10 %.4f, p90 %.4f, %d reps)  core %.4f ms  %.4g "
      "GFLOP  %8.2f GFLOP/s (%.2f of peak)  cache %zu B/token  read %.4g MB (%.2f GB/s)  rel_l2 %s\n",
      r.gqa ? "gqa core" : mla_form_name(r.form), static_cast<long long>(r.context),
      static_cast<long long>(r.fresh), r.time.median_ms, r.time.p10_ms, r.time.p90_ms, r.time.reps,
      r.core_median_ms, r.flops * 1e-9, r.flops / sec * 1e-9,
      peak.gflops > 0 ? r.flops / sec * 1e-9 / peak.gflops : 0.0, r.cache_bytes_per_token,
      r.bytes_read * 1e-6, r.bytes_read / sec * 1e-9, error_text(r.rel_l2, checked).c_str());
  std::fflush(stdout);
}

void print_ratios(const std::map<std::pair<int64_t, int64_t>, std::vector<FormResult>>& by_point) {
  for (const auto& entry : by_point) {
    const auto& point = entry.first;
    const std::vector<FormResult>& rs = entry.second;  // a plain reference: clang 14 cannot capture a binding
    const auto of = [&rs](MlaForm f) {
      return std::find_if(rs.begin(), rs.end(), [f](const FormResult& r) { return r.form == f; });
    };
    const auto nv = of(MlaForm::naive), ab = of(MlaForm::absorbed);
    if (nv == rs.end() || ab == rs.end()) continue;
    std::printf(
        "  context %lld new %lld: naive / absorbed time %.3fx, cache bytes per token %.3fx\n",
        static_cast<long long>(point.first), static_cast<long long>(point.second),
        nv->time.median_ms / ab->time.median_ms,
        static_cast<double>(nv->cache_bytes_per_token) / static_cast<double>(ab->cache_bytes_per_token));
  }
}

// Every point of one preset of a block: context by context (ascending, each cache filled on from the last),
// the forms one after the other (the two forms of a point are measured minutes apart at most, under the same
// conditions), then the GQA core. Rows are appended to `lines` and written out after each point.
std::string core_variant_name(const MlaBlock& b) {
  return Registry::instance().get(b.variant.empty() ? default_core_variant() : b.variant).name();
}

// The point ids of one preset of a block in the order run_preset measures them: context by context, each
// form's new-token counts, then the GQA core's.
std::vector<std::string> preset_ids(const MlaBlock& b, const std::string& preset, const MlaShape& s,
                                    int threads) {
  const std::string variant = core_variant_name(b);
  std::vector<std::string> ids;
  for (int64_t T : b.context) {
    for (MlaForm form : b.forms)
      for (int64_t n : b.fresh)
        ids.push_back(mla_row_id(point_key(b, preset, s, mla_form_name(form), T, n, variant, threads)));
    if (b.gqa_kv_heads > 0)
      for (int64_t n : b.fresh)
        ids.push_back(mla_row_id(point_key(b, preset, s, "gqa", T, n, variant, threads)));
  }
  return ids;
}

// Every point of one preset of a block: context by context (ascending, each cache filled on from the last),
// the forms one after the other (the two forms of a point are measured minutes apart at most, under the same
// conditions), then the GQA core. Rows are appended to `lines` and written out after each point; a point
// kept from --out (--resume) is appended as it was, and a cache whose later points are all kept is not
// filled further.
void run_preset(const RunSpec& spec, const MlaBlock& b, const std::string& preset, const MlaShape& s,
                int threads, const FmaPeak& peak, std::string& lines) {
  const std::string variant = core_variant_name(b);
  auto write = [&] {
    if (!spec.out.empty()) write_file_atomic(spec.out, lines);  // an interrupted run keeps what it measured
  };
  auto kept = [&](const std::string& form, int64_t T, int64_t n) {
    const auto it = spec.kept.find(mla_row_id(point_key(b, preset, s, form, T, n, variant, threads)));
    if (it == spec.kept.end()) return false;
    std::printf("  kept     %s (already in --out: --resume)\n", it->first.c_str());
    lines += it->second + "\n";
    write();
    return true;
  };
  const std::vector<std::string> ids = preset_ids(b, preset, s, threads);
  if (std::all_of(ids.begin(), ids.end(), [&](const std::string& id) { return spec.kept.count(id) > 0; })) {
    std::printf("%s  batch %lld: every point already in --out (--resume)\n", s.str().c_str(),
                static_cast<long long>(b.batch));
    for (const std::string& id : ids) lines += spec.kept.at(id) + "\n";
    write();
    return;
  }
  const MlaCall call{b.variant, b.params};
  const MlaLayer layer(
      s, spec.weights_dir.empty() ? random_mla_weights(s, spec.seed) : load_mla_weights(spec.weights_dir, s));
  std::printf("%s  batch %lld  core %s\n", s.str().c_str(), static_cast<long long>(b.batch), variant.c_str());
  // Refuses a core that cannot run a point up front, before any cache is filled.
  for (MlaForm form : b.forms)
    for (int64_t T : b.context)
      for (int64_t n : b.fresh) (void)layer.core_problem(form, call, b.batch, n, T);
  std::optional<GqaCore> gqa;
  if (b.gqa_kv_heads > 0) gqa.emplace(b, layer, call, spec.seed);
  std::vector<MlaCache> caches;
  std::vector<int64_t> last_measured(b.forms.size(),
                                     -1);  // per form: the last context with a point to measure
  for (std::size_t f = 0; f < b.forms.size(); ++f) {
    caches.emplace_back(s, b.forms[f], b.batch, b.context.back() + b.fresh.back());
    for (int64_t T : b.context)
      for (int64_t n : b.fresh)
        if (!spec.kept.count(
                mla_row_id(point_key(b, preset, s, mla_form_name(b.forms[f]), T, n, variant, threads))))
          last_measured[f] = T;
  }
  std::map<std::pair<int64_t, int64_t>, DoubleArray> want;  // (context, new) -> fp64 output, for every form
  std::map<std::pair<int64_t, int64_t>, std::vector<FormResult>> by_point;
  auto emit = [&](const FormResult& r, bool checked) {
    print_point(r, checked, peak);
    lines += result_row(spec, b, preset, s, r, variant, threads, peak).dump() + "\n";
    write();
  };
  for (int64_t T : b.context) {
    for (std::size_t f = 0; f < b.forms.size(); ++f) {
      MlaCache& cache = caches[f];
      // The context, appended through the layer's cache path in pieces (not timed): the rows a prefill
      // writes, without its attention.
      if (T <= last_measured[f])
        for (int64_t at = cache.length(); at < T; at += kPrefillChunk)
          layer.append(tokens(b.batch, at, std::min(kPrefillChunk, T - at), s.d_model, spec.seed), cache);
      for (int64_t n : b.fresh) {
        if (kept(mla_form_name(b.forms[f]), T, n)) continue;
        FloatArray y;
        FormResult r = measure_point(b, layer, call, cache, T, n, spec.seed, y);
        const bool checked = T + n <= b.check_max_context;
        if (checked) {
          auto it = want.find({T, n});
          if (it == want.end())
            it = want.emplace(std::pair{T, n},
                              mla_reference(s, layer.weights(),
                                            tokens(b.batch, 0, T + n, s.d_model, spec.seed), T))
                     .first;
          r.rel_l2 = rel_l2(y, it->second);
        }
        emit(r, checked);
        by_point[{T, n}].push_back(r);
      }
    }
    if (gqa)
      for (int64_t n : b.fresh)
        if (!kept("gqa", T, n)) emit(gqa->measure(T, n), false);
  }
  print_ratios(by_point);
}

// --resume: the rows already in spec.out, by point id. Refused (UsageError: nothing measured or written) when
// a line is not an MLA row, or a row is of another config, another CPU, or a point the config no longer has:
// resuming would mix those into this run's rows.
void load_kept(RunSpec& spec, int all_threads) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(spec.out, ec)) return;
  std::set<std::string> plan;
  for (const MlaBlock& b : spec.blocks)
    for (const auto& [preset, s] : b.presets)
      for (const std::string& id : preset_ids(b, preset, s, b.threads > 0 ? b.threads : all_threads))
        plan.insert(id);
  const std::string again = " (give another --out, or run without --resume to measure every point again)";
  std::istringstream in(read_file_bytes(spec.out));
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "--resume: '" + spec.out + "' line " + std::to_string(n);
    Json j;
    std::string id;
    try {
      j = Json::parse(line);
      if (!j.is_object() || j.value("kind", "") != "mla")
        throw UsageError(where + ": not a row of `attnbench mla`");
      id = mla_row_id(j);
    } catch (const Json::exception& e) {
      throw UsageError(where + ": not a row of `attnbench mla --sweep` (" + e.what() + ")");
    }
    if (j.value("config", Json()) != Json(spec.config_name))
      throw UsageError(where + ": a row of config " + j.value("config", Json()).dump() + ", not \"" +
                       spec.config_name + "\"" + again);
    const Json machine = j.value("machine", Json::object());
    const std::string cpu = machine.is_object() ? machine.value("cpu_model", "") : "";
    if (cpu != cpu_model())
      throw UsageError(where + ": measured on \"" + cpu + "\", this machine is \"" + cpu_model() + "\"" +
                       again);
    if (!plan.count(id))
      throw UsageError(where + ": point " + id + " is not in the config's \"mla\" blocks" + again);
    spec.kept[id] = line;
  }
}

int run_blocks(RunSpec spec) {
  std::optional<ThreadScope> scope;  // --threads after the subcommand; else the global --threads is in force
  if (spec.threads > 0) scope.emplace(spec.threads);
  const int all_threads =
      static_cast<int>(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
  check_blocks(spec, all_threads);
  if (spec.resume) load_kept(spec, all_threads);
  std::printf("mla: %zu block(s)  cpu %s\n", spec.blocks.size(), cpu_model().c_str());
  std::string lines;
  std::map<int, FmaPeak> peaks;  // per thread count, measured once
  for (const MlaBlock& b : spec.blocks) {
    std::optional<ThreadScope> block_scope;
    if (b.threads > 0) block_scope.emplace(b.threads);
    const int threads = b.threads > 0 ? b.threads : all_threads;
    // The absorbed form's decode is compute-bound (fp32 cache: ~15 FLOP per byte at 16 heads, ~120 at V3's
    // 128): its GFLOP/s reads against the fp32 FMA peak of the same threads and SIMD target, measured here.
    if (!peaks.count(threads)) {
      peaks[threads] = calibrate_fma_peak(threads);
      std::printf("threads %d: FMA peak %.1f GFLOP/s (%s)\n", threads, peaks[threads].gflops,
                  peaks[threads].isa.c_str());
    }
    for (const auto& [preset, s] : b.presets) run_preset(spec, b, preset, s, threads, peaks[threads], lines);
  }
  return 0;
}

int run_mla(const MlaOptions& o) {
  simd::select_isa(o.isa, "--isa");
  if (o.threads < 0) throw UsageError("--threads " + std::to_string(o.threads) + ": must be >= 1");
  RunSpec spec;
  spec.seed = static_cast<uint64_t>(o.seed);
  spec.threads = o.threads;
  spec.out = o.out;
  spec.weights_dir = o.weights;
  spec.resume = o.resume;
  if (o.resume && (o.sweep.empty() || o.out.empty()))
    throw UsageError("--resume: needs --sweep CONFIG and --out FILE (it keeps the points already in FILE)");
  if (!o.sweep.empty()) {
    for (const auto& [flag, given] : {std::pair{"--preset", !o.preset.empty()},
                                      {"--config", !o.config.empty()},
                                      {"--form", o.form != "both"},
                                      {"--context", o.context != 1024},
                                      {"--new", o.fresh != 1},
                                      {"--batch", o.batch != 1},
                                      {"--variant", !o.variant.empty()},
                                      {"--repeats", o.repeats != 10},
                                      {"--warmup", o.warmup != 1},
                                      {"--no-check", o.no_check},
                                      {"--weights", !o.weights.empty()}})
      if (given)
        throw UsageError(std::string(flag) +
                         ": not with --sweep (the config's \"mla\" blocks set the points)");
    const SweepConfig c = load_sweep_config(o.sweep);
    if (c.mla.empty())
      throw UsageError("--sweep '" + o.sweep + "': the config has no \"mla\" section (configs/README.md)");
    spec.blocks = c.mla;
    spec.config_name = c.name;
    return run_blocks(spec);
  }
  const MlaShape s = shape_from(o);
  if (o.context < 0)
    throw UsageError("--context " + std::to_string(o.context) + ": must be >= 0 (cached tokens)");
  if (o.fresh < 1)
    throw UsageError("--new " + std::to_string(o.fresh) + ": must be >= 1 (1 = one decode step)");
  if (o.batch < 1) throw UsageError("--batch " + std::to_string(o.batch) + ": must be >= 1");
  if (o.repeats < 1 || o.warmup < 0)
    throw UsageError("--repeats " + std::to_string(o.repeats) + " / --warmup " + std::to_string(o.warmup) +
                     ": repeats must be >= 1 and warmup >= 0");
  MlaBlock b;
  b.presets = {{o.preset, s}};
  if (o.form == "both")
    b.forms = {MlaForm::naive, MlaForm::absorbed};
  else
    b.forms = {parse_mla_form(o.form, "--form (naive, absorbed or both)")};
  b.context = {o.context};
  b.fresh = {o.fresh};
  b.batch = o.batch;
  b.repeats = o.repeats;
  b.warmup = o.warmup;
  b.check_max_context = o.no_check ? 0 : o.context + o.fresh;
  b.variant = o.variant;
  if (!o.variant.empty()) b.params = parse_cli_params(Registry::instance().get(o.variant), o.params);
  b.memory_budget_bytes = 0;  // one point the user asked for: no budget
  spec.blocks = {b};
  return run_blocks(spec);
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
      sub.add_option("--sweep", o->sweep,
                     "a sweep config with an \"mla\" section (configs/dsa.json): measure its blocks' points "
                     "(preset x form x context x new) instead of the flags' one point");
      sub.add_option("--out", o->out,
                     "write one JSON line per point to this file (rewritten atomically after each point)");
      sub.add_flag("--resume", o->resume,
                   "with --sweep and --out: keep the points already in --out (same config and CPU) and "
                   "measure the others; a row of another config, CPU or point is refused (exit 2)");
      return std::function<int()>([o] { return attn::cli::run_mla(*o); });
    })
