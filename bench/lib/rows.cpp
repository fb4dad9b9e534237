// Rows (rows.hpp).
#include "bench/lib/rows.hpp"

#include <algorithm>
#include <cstdint>

#include "common/interface/util.hpp"
#include "common/kernels/simd.hpp"

namespace attn {

ResultRow base_row(const SweepPoint& pt, const SweepConfig& c, const std::string& isa) {
  const Problem& p = pt.problem;
  const Attention& v = Registry::instance().get(p.variant);
  ResultRow r;
  r.id = pt.id;
  r.variant = p.variant;
  r.params = p.params;
  r.batch = p.batch, r.heads = p.heads, r.kv_heads = p.num_kv_heads(), r.seq_q = p.seq_q, r.seq_kv = p.seq_kv,
  r.head_dim = p.head_dim, r.v_head_dim = p.value_dim();
  r.mask = pt.mask.label();
  r.regime = pt.regime.label();
  r.threads = pt.threads;
  r.isa = isa;
  r.dropout = p.dropout;
  r.dtype = dtype_name(p.dtype);
  r.bias = bias_name(p.bias);
  r.softcap = p.softcap;
  r.sinks = p.sinks;
  r.rope = pt.regime.rope.str();
  r.pass = pass_name(pt.pass);
  r.exact = v.capabilities().exact;
  r.accuracy.reference = accuracy_mode(p, c.accuracy);
  r.accuracy_e2e.reference = r.accuracy.reference;
  const PointMemory m = point_memory(pt, c);
  r.memory.estimated_bytes = m.call.beyond_inputs();
  r.memory.inputs_bytes = m.call.inputs;
  r.memory.workspace_bytes = m.call.workspace;
  r.memory.reference_bytes = sat_add(m.reference, m.grad_reference);
  r.memory.state_bytes = static_cast<int64_t>(std::min<std::size_t>(v.decode_state_bytes(p), INT64_MAX));
  r.memory.kv_cache_bytes = static_cast<int64_t>(std::min<std::size_t>(kv_cache_bytes(p), INT64_MAX));
  if (pt.pass != Pass::forward) r.grad_accuracy.reference = grad_accuracy_mode(p, c.accuracy);
  // From the sizes alone, like the memory estimates: skipped rows carry it too (`run --dry-run --json`).
  r.bytes = point_bytes(pt);
  return r;
}

namespace {
Json json_or_null(const std::optional<double>& x) {
  return x ? Json(*x) : Json(nullptr);
}
}  // namespace

Json point_json(const SweepPoint& pt, const SweepConfig& c) {
  const Problem& p = pt.problem;
  const simd::ScopedIsa scope(pt.isa, "sweep.isa");
  const std::string skip = skip_reason(pt, c);
  const PointMemory m = point_memory(pt, c);
  Json j = {
      {"id", pt.id},
      {"config", c.name},
      {"variant", p.variant},
      {"params", p.params},
      {"problem",
       {{"batch", p.batch},
        {"heads", p.heads},
        {"kv_heads", p.num_kv_heads()},
        {"seq_q", p.seq_q},
        {"seq_kv", p.seq_kv},
        {"head_dim", p.head_dim},
        {"v_head_dim", p.value_dim()},
        {"scale", p.effective_scale()},
        {"causal", p.mask.causal},
        {"causal_lower_right", p.mask.causal_lower_right},
        {"key_padding", p.mask.key_padding},
        {"dropout", p.dropout},
        {"seed", p.seed},
        {"dtype", dtype_name(p.dtype)},
        {"bias", bias_name(p.bias)},
        {"softcap", p.softcap ? Json(*p.softcap) : Json(nullptr)},
        {"sinks", p.sinks}}},
      {"mask", {{"label", pt.mask.label()}, {"pad_fraction", pt.mask.pad_fraction}}},
      {"inputs",
       {{"key", pt.input_key},
        {"seed", pt.input_seed},
        {"regime", pt.regime.kind},
        {"std", pt.regime.std},
        {"text", pt.regime.text},
        {"rope", pt.regime.rope.str()},
        {"rope_mode", rope_mode_name(pt.regime.rope.mode)},
        {"rope_base", pt.regime.rope.base},
        {"rope_query_offset", rope_query_offset(p)},
        {"label", pt.regime.label()}}},
      {"threads", pt.threads},
      {"pass", pass_name(pt.pass)},
      {"isa_requested", pt.isa},
      {"isa", simd::active_isa()},
      {"accuracy", {{"reference", accuracy_mode(p, c.accuracy)}, {"rows", accuracy_rows(p, c.accuracy)}}},
      {"flops", point_flops(pt)},
      {"bytes", json_or_null(point_bytes(pt))},
      {"memory",
       {{"inputs_bytes", m.call.inputs},
        {"output_bytes", m.call.output},
        {"workspace_bytes", m.call.workspace},
        {"reference_bytes", m.reference},
        {"fp32_inputs_bytes", m.fp32_inputs},
        {"need_bytes", m.need()},
        {"budget_bytes", *c.memory_budget_bytes}}},
      {"measure",
       {{"warmup", c.measure.warmup},
        {"min_reps", c.measure.min_reps},
        {"max_reps", c.measure.max_reps},
        {"min_time_s", c.measure.min_time_s},
        {"max_time_s", c.measure.max_time_s},
        {"target_rel_ci", c.measure.target_rel_ci},
        {"max_interference", c.measure.max_interference},
        {"max_remeasure", c.measure.max_remeasure},
        {"calibrate_every", c.measure.calibrate_every},
        {"interleave", c.measure.interleave},
        {"group_sgemm", c.measure.group_sgemm},
        {"group_bandwidth", c.measure.group_bandwidth}}},
      {"skip", skip.empty() ? Json(nullptr) : Json(skip)},
      {"row", to_json(base_row(pt, c, simd::active_isa()))}};
  return j;
}

TimingSummary time_summary(const TimingStats& t) {
  TimingSummary s;
  s.median = t.median_ms;
  s.p10 = t.p10_ms;
  s.p90 = t.p90_ms;
  s.mean = t.mean_ms;
  s.cv = t.cv;
  s.reps = t.reps;
  s.samples = t.samples_ms;
  if (t.ci.ok) {
    s.ci_lo = t.ci.lo;
    s.ci_hi = t.ci.hi;
    s.ci_level = t.ci.level;
  }
  return s;
}

void fill_timing(ResultRow& row, const TimingStats& t, double flops, const Calibration* cal) {
  const double gflops = flops / (t.median_ms * 1e6);
  row.time_ms = time_summary(t);
  row.flops = flops;
  row.gflops = gflops;
  if (row.bytes && *row.bytes > 0) row.gbytes_per_s = *row.bytes / (t.median_ms * 1e6);
  if (!cal) return;
  row.calibration = cal->index;
  if (const auto it = cal->sgemm_gflops.find(row.threads); it != cal->sgemm_gflops.end() && it->second > 0)
    row.frac_sgemm = gflops / it->second;
  if (const auto it = cal->fma_gflops.find({row.threads, row.isa});
      it != cal->fma_gflops.end() && it->second > 0)
    row.frac_peak = gflops / it->second;
  if (row.gbytes_per_s)
    if (const auto it = cal->bandwidth_gbytes_per_s.find(row.threads);
        it != cal->bandwidth_gbytes_per_s.end() && it->second > 0)
      row.frac_bandwidth = *row.gbytes_per_s / it->second;
}

}  // namespace attn
