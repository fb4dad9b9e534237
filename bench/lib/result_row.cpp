// The result row's one writer, one reader and field documentation.
#include "bench/lib/result_row.hpp"

#include <cmath>
#include <limits>
#include <sstream>

#include "common/error.hpp"
#include "common/util.hpp"

namespace attn {
namespace {

Json opt(const std::optional<double>& x) {
  return x ? json_number(*x) : Json(nullptr);
}
Json opt(const std::optional<int64_t>& x) {
  return x ? Json(*x) : Json(nullptr);
}

// Reading: every accessor names the field's path in its error.
class Reader {
 public:
  Reader(const Json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j.is_object()) fail("", "a result row must be a JSON object, got " + j.dump());
  }

  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw UsageError(where_ + (path.empty() ? "" : ": field '" + path + "'") + ": " + msg);
  }
  const Json* find(const std::string& path) const {
    const Json* cur = &j_;
    std::stringstream ss(path);
    std::string part;
    while (std::getline(ss, part, '.')) {
      if (!cur->is_object() || !cur->contains(part)) return nullptr;
      cur = &(*cur)[part];
    }
    return cur;
  }
  std::string str(const std::string& path, bool required = false) const {
    const Json* v = find(path);
    if (!v || v->is_null()) {
      if (required) fail(path, "missing (every row has it)");
      return "";
    }
    if (!v->is_string()) fail(path, "must be a string, got " + v->dump());
    return v->get<std::string>();
  }
  int64_t integer(const std::string& path) const {
    const Json* v = find(path);
    if (!v || v->is_null()) return 0;
    if (!v->is_number_integer()) fail(path, "must be an integer, got " + v->dump());
    return v->get<int64_t>();
  }
  uint64_t bytes(const std::string& path) const {
    const Json* v = find(path);
    if (!v || v->is_null()) return 0;
    if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<int64_t>() >= 0))
      fail(path, "must be a byte count (non-negative integer), got " + v->dump());
    return v->get<uint64_t>();
  }
  std::optional<int64_t> opt_integer(const std::string& path) const {
    const Json* v = find(path);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_number_integer()) fail(path, "must be an integer or null, got " + v->dump());
    return v->get<int64_t>();
  }
  // A metric: a number, null, or "nan" / "inf" / "-inf" (JSON has no non-finite numbers).
  std::optional<double> opt_number(const std::string& path) const {
    const Json* v = find(path);
    if (!v || v->is_null()) return std::nullopt;
    if (v->is_number()) return v->get<double>();
    if (v->is_string()) {
      const std::string s = v->get<std::string>();
      if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
      if (s == "inf") return std::numeric_limits<double>::infinity();
      if (s == "-inf") return -std::numeric_limits<double>::infinity();
    }
    fail(path, "must be a number, null, \"nan\", \"inf\" or \"-inf\", got " + v->dump());
  }
  double number(const std::string& path) const { return opt_number(path).value_or(0.0); }
  bool boolean(const std::string& path) const {
    const Json* v = find(path);
    if (!v || v->is_null()) return false;
    if (!v->is_boolean()) fail(path, "must be true or false, got " + v->dump());
    return v->get<bool>();
  }

 private:
  const Json& j_;
  std::string where_;
};

Json accuracy_json(const AccuracySummary& a) {
  return {{"reference", a.reference},          {"rows", a.rows},
          {"max_abs_err", opt(a.max_abs_err)}, {"rel_l2_err", opt(a.rel_l2_err)},
          {"mean_cosine", opt(a.mean_cosine)}, {"nan_count", opt(a.nan_count)},
          {"inf_count", opt(a.inf_count)}};
}

AccuracySummary read_accuracy(const Reader& in, const std::string& key) {
  AccuracySummary a;
  a.reference = in.str(key + ".reference");
  a.rows = in.integer(key + ".rows");
  a.max_abs_err = in.opt_number(key + ".max_abs_err");
  a.rel_l2_err = in.opt_number(key + ".rel_l2_err");
  a.mean_cosine = in.opt_number(key + ".mean_cosine");
  a.nan_count = in.opt_integer(key + ".nan_count");
  a.inf_count = in.opt_integer(key + ".inf_count");
  return a;
}

Json grad_part_json(const GradAccuracySummary::Part& g) {
  return {{"max_abs_err", opt(g.max_abs_err)},
          {"rel_l2_err", opt(g.rel_l2_err)},
          {"nan_count", opt(g.nan_count)},
          {"inf_count", opt(g.inf_count)}};
}

Json grad_accuracy_json(const GradAccuracySummary& g) {
  return {{"reference", g.reference},
          {"blocks", g.blocks},
          {"dq", grad_part_json(g.dq)},
          {"dk", grad_part_json(g.dk)},
          {"dv", grad_part_json(g.dv)}};
}

GradAccuracySummary read_grad_accuracy(const Reader& in) {
  GradAccuracySummary g;
  g.reference = in.str("grad_accuracy.reference");
  if (g.reference.empty()) g.reference = "none";  // rows from before the backward pass
  g.blocks = in.integer("grad_accuracy.blocks");
  for (auto [name, part] :
       {std::pair<const char*, GradAccuracySummary::Part*>{"dq", &g.dq}, {"dk", &g.dk}, {"dv", &g.dv}}) {
    const std::string k = std::string("grad_accuracy.") + name;
    part->max_abs_err = in.opt_number(k + ".max_abs_err");
    part->rel_l2_err = in.opt_number(k + ".rel_l2_err");
    part->nan_count = in.opt_integer(k + ".nan_count");
    part->inf_count = in.opt_integer(k + ".inf_count");
  }
  return g;
}

// Every key is always written (null until measured), like time_ms, so a row's fields never depend on its
// status.
Json interference_json(const std::optional<InterferenceSummary>& i) {
  if (!i)
    return {{"window_s", nullptr},       {"steal_frac", nullptr}, {"other_cpu_frac", nullptr},
            {"runq_wait_frac", nullptr}, {"score", nullptr},      {"ctx_switches_involuntary", nullptr},
            {"loadavg_1m", nullptr},     {"freq_mhz", nullptr}};
  return {{"window_s", json_number(i->window_s)},
          {"steal_frac", json_number(i->steal_frac)},
          {"other_cpu_frac", json_number(i->other_cpu_frac)},
          {"runq_wait_frac", json_number(i->runq_wait_frac)},
          {"score", json_number(i->score)},
          {"ctx_switches_involuntary", i->ctx_switches_involuntary},
          {"loadavg_1m", json_number(i->loadavg_1m)},
          {"freq_mhz", opt(i->freq_mhz)}};
}

std::optional<InterferenceSummary> read_interference(const Reader& in) {
  const Json* v = in.find("interference");
  if (!v || v->is_null()) return std::nullopt;  // a row from before the field
  if (!v->is_object()) in.fail("interference", "must be an object, got " + v->dump());
  if (!in.opt_number("interference.window_s")) return std::nullopt;  // not measured
  InterferenceSummary i;
  i.window_s = in.number("interference.window_s");
  i.steal_frac = in.number("interference.steal_frac");
  i.other_cpu_frac = in.number("interference.other_cpu_frac");
  i.runq_wait_frac = in.number("interference.runq_wait_frac");
  i.score = in.number("interference.score");
  i.ctx_switches_involuntary = in.integer("interference.ctx_switches_involuntary");
  i.loadavg_1m = in.number("interference.loadavg_1m");
  i.freq_mhz = in.opt_number("interference.freq_mhz");
  return i;
}

// Always an object (null leaves when the point was timed alone), like interference.
Json interleave_json(const std::optional<ResultRow::Interleave>& i) {
  if (!i) return {{"group", nullptr}, {"points", nullptr}, {"position", nullptr}, {"rounds", nullptr}};
  return {{"group", i->group}, {"points", i->points}, {"position", i->position}, {"rounds", i->rounds}};
}

std::optional<ResultRow::Interleave> read_interleave(const Reader& in) {
  const Json* v = in.find("interleave");
  if (!v || v->is_null()) return std::nullopt;  // a row from before the field
  if (!v->is_object()) in.fail("interleave", "must be an object, got " + v->dump());
  if (in.str("interleave.group").empty()) return std::nullopt;  // timed alone
  ResultRow::Interleave i;
  i.group = in.str("interleave.group");
  i.points = static_cast<int>(in.integer("interleave.points"));
  i.position = static_cast<int>(in.integer("interleave.position"));
  i.rounds = static_cast<int>(in.integer("interleave.rounds"));
  return i;
}

// Always an object (null leaves when the group ran without it).
Json group_sgemm_json(const std::optional<ResultRow::GroupSgemm>& g) {
  if (!g) return {{"gflops", nullptr}, {"reps", nullptr}, {"frac_ci_lo", nullptr}, {"frac_ci_hi", nullptr}};
  return {{"gflops", g->gflops},
          {"reps", g->reps},
          {"frac_ci_lo", opt(g->frac_ci_lo)},
          {"frac_ci_hi", opt(g->frac_ci_hi)}};
}

std::optional<ResultRow::GroupSgemm> read_group_sgemm(const Reader& in) {
  const Json* v = in.find("group_sgemm");
  if (!v || v->is_null()) return std::nullopt;  // a row from before the field
  if (!v->is_object()) in.fail("group_sgemm", "must be an object, got " + v->dump());
  const std::optional<double> g = in.opt_number("group_sgemm.gflops");
  if (!g) return std::nullopt;  // the group ran without it
  ResultRow::GroupSgemm out;
  out.gflops = *g;
  out.reps = static_cast<int>(in.integer("group_sgemm.reps"));
  out.frac_ci_lo = in.opt_number("group_sgemm.frac_ci_lo");
  out.frac_ci_hi = in.opt_number("group_sgemm.frac_ci_hi");
  return out;
}

}  // namespace

Json to_json(const ResultRow& r) {
  Json j = {{"id", r.id},
            {"variant", r.variant},
            {"params", r.params},
            {"batch", r.batch},
            {"heads", r.heads},
            {"kv_heads", r.kv_heads},
            {"seq_q", r.seq_q},
            {"seq_kv", r.seq_kv},
            {"head_dim", r.head_dim},
            {"mask", r.mask},
            {"regime", r.regime},
            {"threads", r.threads},
            {"isa", r.isa},
            {"dropout", r.dropout},
            {"dtype", r.dtype},
            {"bias", r.bias},
            {"rope", r.rope},
            {"rope_ms", opt(r.rope_ms)},
            {"pass", r.pass},
            {"exact", r.exact},
            {"status", r.status},
            {"reason", r.reason},
            {"time_ms",
             {{"median", opt(r.time_ms.median)},
              {"p10", opt(r.time_ms.p10)},
              {"p90", opt(r.time_ms.p90)},
              {"mean", opt(r.time_ms.mean)},
              {"cv", opt(r.time_ms.cv)},
              {"reps", r.time_ms.reps},
              {"ci_lo", opt(r.time_ms.ci_lo)},
              {"ci_hi", opt(r.time_ms.ci_hi)},
              {"ci_level", opt(r.time_ms.ci_level)},
              {"samples", r.time_ms.samples}}},
            {"interference", interference_json(r.interference)},
            {"attempts", r.attempts},
            {"noisy", r.noisy},
            {"interleave", interleave_json(r.interleave)},
            {"calibration", opt(r.calibration)},
            {"group_sgemm", group_sgemm_json(r.group_sgemm)},
            {"flops", opt(r.flops)},
            {"gflops", opt(r.gflops)},
            {"frac_sgemm", opt(r.frac_sgemm)},
            {"frac_peak", opt(r.frac_peak)},
            {"bytes", opt(r.bytes)},
            {"gbytes_per_s", opt(r.gbytes_per_s)},
            {"frac_bandwidth", opt(r.frac_bandwidth)},
            {"accuracy", accuracy_json(r.accuracy)},
            {"accuracy_e2e", accuracy_json(r.accuracy_e2e)},
            {"grad_accuracy", grad_accuracy_json(r.grad_accuracy)},
            {"memory",
             {{"estimated_bytes", r.memory.estimated_bytes},
              {"inputs_bytes", r.memory.inputs_bytes},
              {"workspace_bytes", r.memory.workspace_bytes},
              {"reference_bytes", r.memory.reference_bytes},
              {"peak_bytes", opt(r.memory.peak_bytes)},
              {"peak_note", r.memory.peak_note}}},
            {"nonfinite_inputs", opt(r.nonfinite_inputs)},
            {"timestamp", r.timestamp}};
  if (r.ring) {
    j["ranks"] = r.ring->ranks;
    j["bytes_sent_per_rank"] = opt(r.ring->bytes_sent_per_rank);
    j["rank0_whole_tensors_bytes"] = opt(r.ring->rank0_whole_tensors_bytes);
    j["ring"] = r.ring->report;
  }
  return j;
}

ResultRow row_from_json(const Json& j, const std::string& where) {
  const Reader in(j, where);
  ResultRow r;
  r.id = in.str("id", true);
  r.variant = in.str("variant", true);
  r.status = in.str("status", true);
  if (r.status != "ok" && r.status != "skipped" && r.status != "failed")
    in.fail("status", "must be ok, skipped or failed, got '" + r.status + "'");
  if (const Json* p = in.find("params"); p && !p->is_null()) {
    if (!p->is_object()) in.fail("params", "must be an object, got " + p->dump());
    r.params = *p;
  }
  r.batch = in.integer("batch");
  r.heads = in.integer("heads");
  // Rows from before grouped-query attention have no kv_heads: K/V had `heads` heads.
  r.kv_heads = in.opt_integer("kv_heads").value_or(r.heads);
  r.seq_q = in.integer("seq_q");
  r.seq_kv = in.integer("seq_kv");
  r.head_dim = in.integer("head_dim");
  r.mask = in.str("mask");
  r.regime = in.str("regime");
  r.threads = static_cast<int>(in.integer("threads"));
  r.isa = in.str("isa");
  r.dropout = in.number("dropout");
  // Rows from before precision and position were axes (#14) read as the defaults.
  r.dtype = in.str("dtype");
  if (r.dtype.empty()) r.dtype = "fp32";
  if (r.dtype != "fp32" && r.dtype != "bf16" && r.dtype != "fp16")
    in.fail("dtype", "must be fp32, bf16 or fp16, got '" + r.dtype + "'");
  r.bias = in.str("bias");
  if (r.bias.empty()) r.bias = "none";
  r.rope = in.str("rope");
  if (r.rope.empty()) r.rope = "none";
  r.rope_ms = in.opt_number("rope_ms");
  r.pass = in.str("pass");
  if (r.pass.empty()) r.pass = "forward";  // rows from before the backward pass
  if (r.pass != "forward" && r.pass != "backward" && r.pass != "forward_backward")
    in.fail("pass", "must be forward, backward or forward_backward, got '" + r.pass + "'");
  r.exact = in.boolean("exact");
  r.reason = in.str("reason");
  r.time_ms.median = in.opt_number("time_ms.median");
  r.time_ms.p10 = in.opt_number("time_ms.p10");
  r.time_ms.p90 = in.opt_number("time_ms.p90");
  r.time_ms.mean = in.opt_number("time_ms.mean");
  r.time_ms.cv = in.opt_number("time_ms.cv");
  r.time_ms.reps = static_cast<int>(in.integer("time_ms.reps"));
  // Rows from before the interval (#18) read with null intervals, no samples, one clean attempt.
  r.time_ms.ci_lo = in.opt_number("time_ms.ci_lo");
  r.time_ms.ci_hi = in.opt_number("time_ms.ci_hi");
  r.time_ms.ci_level = in.opt_number("time_ms.ci_level");
  if (const Json* v = in.find("time_ms.samples"); v && !v->is_null()) {
    if (!v->is_array()) in.fail("time_ms.samples", "must be a list of numbers, got " + v->dump());
    for (const Json& x : *v) {
      if (!x.is_number()) in.fail("time_ms.samples", "must be a list of numbers, got " + x.dump() + " in it");
      r.time_ms.samples.push_back(x.get<double>());
    }
  }
  r.interference = read_interference(in);
  r.attempts = static_cast<int>(in.opt_integer("attempts").value_or(r.time_ms.reps > 0 ? 1 : 0));
  r.noisy = in.boolean("noisy");
  r.interleave = read_interleave(in);
  r.calibration = in.opt_integer("calibration");
  r.group_sgemm = read_group_sgemm(in);
  r.flops = in.opt_number("flops");
  r.gflops = in.opt_number("gflops");
  r.frac_sgemm = in.opt_number("frac_sgemm");
  r.frac_peak = in.opt_number("frac_peak");
  r.bytes = in.opt_number("bytes");
  r.gbytes_per_s = in.opt_number("gbytes_per_s");
  r.frac_bandwidth = in.opt_number("frac_bandwidth");
  r.accuracy = read_accuracy(in, "accuracy");
  // Rows from before the storage dtype: fp32, where the end-to-end error is the kernel's.
  r.accuracy_e2e = in.find("accuracy_e2e") ? read_accuracy(in, "accuracy_e2e") : r.accuracy;
  r.grad_accuracy = read_grad_accuracy(in);
  r.memory.estimated_bytes = in.bytes("memory.estimated_bytes");
  r.memory.inputs_bytes = in.bytes("memory.inputs_bytes");
  r.memory.workspace_bytes = in.bytes("memory.workspace_bytes");
  r.memory.reference_bytes = in.bytes("memory.reference_bytes");
  r.memory.peak_bytes = in.opt_integer("memory.peak_bytes");
  r.memory.peak_note = in.str("memory.peak_note");
  r.nonfinite_inputs = in.opt_integer("nonfinite_inputs");
  r.timestamp = in.str("timestamp");
  if (in.find("ranks")) {
    ResultRow::Ring ring;
    ring.ranks = static_cast<int>(in.integer("ranks"));
    ring.bytes_sent_per_rank = in.opt_number("bytes_sent_per_rank");
    ring.rank0_whole_tensors_bytes = in.opt_number("rank0_whole_tensors_bytes");
    if (const Json* rep = in.find("ring")) ring.report = *rep;
    r.ring = ring;
  }
  return r;
}

const std::vector<RowField>& row_fields() {
  static const std::vector<RowField> fields{
      {"id", "string",
       "the point's unique id: the problem's repro string (with `,alibi` and `,dtype=NAME` unless the "
       "defaults), `,padfrac=F` with key padding, the regime (with `,rope=MODE` when RoPE is on), `,T=` "
       "threads, `,isa=NAME` unless the requested target is `best`, and `,pass=NAME` unless the pass is the "
       "forward"},
      {"variant", "string", "registered variant name"},
      {"params", "object", "the variant's resolved parameters (defaults filled in)"},
      {"batch", "integer", "B"},
      {"heads", "integer", "H (query heads)"},
      {"kv_heads", "integer",
       "K/V heads (grouped-query attention: query head h reads K/V head h / (heads / kv_heads)); equal to "
       "`heads` for multi-head attention and in rows written before the field existed"},
      {"seq_q", "integer", "query length"},
      {"seq_kv", "integer", "key/value length"},
      {"head_dim", "integer", "D"},
      {"mask", "string",
       "`none`, `causal`, `causal_lower_right`, `pad=F`, or `+`-joined (`causal+pad=F`, "
       "`causal_lower_right+pad=F`)"},
      {"regime", "string",
       "how the inputs were made: `gaussian(std=S)` or `tokens(FILE)`, with `,rope=MODE` inside the "
       "parentheses when RoPE is on (`gaussian(std=1,rope=normal)`)"},
      {"threads", "integer", "TBB threads"},
      {"isa", "string", "the SIMD target that ran (e.g. `avx3`, `avx2`, `neon`, `scalar`)"},
      {"dropout", "number", "dropout probability on the attention weights"},
      {"dtype", "string",
       "storage precision of Q, K, V: `fp32`, or `bf16` / `fp16` rounded (nearest even) from the fp32 "
       "inputs; "
       "computation and the output are fp32 (`fp32` in rows written before the field existed)"},
      {"bias", "string", "logit bias: `none` or `alibi` (the ALiBi paper's default slopes)"},
      {"rope", "string",
       "RoPE applied to the fp32 Q and K before rounding: `none`, `normal` (adjacent pairs), `neox` "
       "(halves), "
       "with `,base=B` when the base is not 10000"},
      {"rope_ms", "number|null",
       "median milliseconds of applying RoPE to Q and K once, at the row's threads and target (not part of "
       "`time_ms`); null when `rope` is `none`"},
      {"pass", "string",
       "what was timed (sweep.pass): `forward`; `backward` (dQ, dK, dV from the O, saved state and dO an "
       "untimed training forward left); or `forward_backward` (the training forward then the backward); "
       "`forward` in rows written before the field existed"},
      {"exact", "boolean", "the variant computes softmax attention exactly"},
      {"status", "string", "`ok`, `skipped` (unsupported or over the memory budget) or `failed`"},
      {"reason", "string", "why skipped or failed (`\"\"` when ok)"},
      {"time_ms.median", "number|null", "median milliseconds per call"},
      {"time_ms.p10", "number|null", "10th percentile"},
      {"time_ms.p90", "number|null", "90th percentile"},
      {"time_ms.mean", "number|null", "mean"},
      {"time_ms.cv", "number|null", "coefficient of variation (stddev / mean)"},
      {"time_ms.reps", "integer", "measured repetitions (0 when not measured)"},
      {"time_ms.ci_lo", "number|null",
       "lower end of the 95% confidence interval of the median: the order statistic x(l) of the "
       "distribution-free interval [x(l), x(n+1-l)], l the largest rank whose binomial coverage is >= 95%; "
       "null below 6 repetitions (no such pair exists)"},
      {"time_ms.ci_hi", "number|null", "upper end, x(n+1-l)"},
      {"time_ms.ci_level", "number|null",
       "the interval's exact coverage, 1 - 2 P(Binomial(n, 1/2) < l) (>= 0.95)"},
      {"time_ms.samples", "array", "every measured repetition in ms, in order (at most max_reps)"},
      {"interference.window_s", "number|null",
       "interference while the point was timed (#18; null until measured, for the attempt kept): the wall "
       "seconds the probe covered (warm-up and timed rounds; an interleaved group shares one window)"},
      {"interference.steal_frac", "number|null",
       "hypervisor steal over window x the CPUs this process may run on (/proc/stat)"},
      {"interference.other_cpu_frac", "number|null",
       "other processes' CPU time on those CPUs (their busy ticks minus this process's CPU time) over the "
       "same; known to about 2 ticks per CPU"},
      {"interference.runq_wait_frac", "number|null",
       "time this process's runnable threads waited for a core (/proc/self/task/*/schedstat) over window x "
       "threads"},
      {"interference.score", "number|null",
       "steal_frac + max(runq_wait_frac, other_cpu_frac - 2 / (HZ x window_s)): compared with "
       "measure.max_interference"},
      {"interference.ctx_switches_involuntary", "integer|null",
       "this process's involuntary context switches "
       "during the window (getrusage)"},
      {"interference.loadavg_1m", "number|null", "/proc/loadavg's 1-minute load at the end of the window"},
      {"interference.freq_mhz", "number|null",
       "mean cpufreq scaling_cur_freq of those CPUs; null where the kernel does not expose it (VMs)"},
      {"attempts", "integer",
       "timed measurements of the point: 1, plus one per re-measurement after a score above "
       "measure.max_interference (at most 1 + measure.max_remeasure); the cleanest is kept; 0 when not "
       "measured"},
      {"noisy", "boolean", "every attempt's interference score stayed above measure.max_interference"},
      {"interleave.group", "string|null",
       "the id of the first point of the group this point was timed with in interleaved rounds "
       "(measure.interleave: the points sharing one input set); null when timed alone"},
      {"interleave.points", "integer|null", "the points timed in that group"},
      {"interleave.position", "integer|null",
       "this point's place in the group's rounds (0-based; odd rounds run in reverse order)"},
      {"interleave.rounds", "integer|null",
       "the group's timed rounds; sample r of time_ms.samples was taken in round r, so two rows of one group "
       "pair up sample by sample (a point that reached max_reps or max_time_s left early and has fewer)"},
      {"calibration", "integer|null",
       "index into meta.json's `calibrations` of the sgemm / FMA-peak calibration that frac_peak (and "
       "frac_sgemm when `group_sgemm` is null) were divided by (the latest one measured clean before the "
       "point)"},
      {"group_sgemm.gflops", "number|null",
       "the median GFLOP/s of the sgemm timed in this row's interleaved rounds (measure.group_sgemm: the "
       "calibration's sgemm at the row's thread count, one call per round); null when the group ran without "
       "it (its sgemm would have cost over half a round, or measure.group_sgemm is false)"},
      {"group_sgemm.reps", "integer|null", "the sgemm's timed calls in those rounds"},
      {"group_sgemm.frac_ci_lo", "number|null",
       "95% distribution-free interval of frac_sgemm, over the rounds both were timed in (null below 6)"},
      {"group_sgemm.frac_ci_hi", "number|null", "its upper end"},
      {"flops", "number|null",
       "floating-point operations of one timed call, as the variant counts its work: `flops` for the "
       "forward, `backward_flops` for the backward (by default the FlashAttention-2 convention, 2.5x the "
       "forward's, the five matmuls of a backward against the forward's two; causal counts only the "
       "unmasked pairs in both), their sum for a training step"},
      {"gflops", "number|null", "flops / median time"},
      {"frac_sgemm", "number|null",
       "with `group_sgemm`: the median over the group's rounds of (this row's GFLOP/s / the sgemm's GFLOP/s "
       "in the same round); without: gflops / the sgemm calibration at the same thread count"},
      {"frac_peak", "number|null", "gflops / the fp32 FMA peak of the row's own SIMD target and threads"},
      {"bytes", "number|null",
       "bytes one call moves to and from memory as the variant counts its traffic (`bytes_moved`; at least "
       "Q, K, V, O and the masks once), from the sizes, so skipped rows have it too; null in older rows. "
       "Backward rows count the backward's compulsory traffic (Q, K, V, the masks, O, dO and the saved state "
       "read once, dQ, dK, dV written once), a training step that plus the forward's"},
      {"gbytes_per_s", "number|null", "bytes / median time / 1e9 (achieved bandwidth)"},
      {"frac_bandwidth", "number|null",
       "gbytes_per_s / the in-run memory-bandwidth calibration at the same thread count "
       "(`memory_bandwidth` in meta.json)"},
      {"accuracy.reference", "string", "`full`, `sampled` or `none`"},
      {"accuracy.rows", "integer", "query rows compared per (batch, head)"},
      {"accuracy.max_abs_err", "number|string|null",
       "largest absolute error against the fp64 exact reference on the inputs the kernel read (rounded to "
       "`dtype`: the kernel's own error; `\"inf\"` if an output is non-finite)"},
      {"accuracy.rel_l2_err", "number|string|null", "‖out − ref‖₂ / ‖ref‖₂ over the compared rows"},
      {"accuracy.mean_cosine", "number|string|null", "mean cosine similarity of output and reference rows"},
      {"accuracy.nan_count", "integer|null", "NaN values in the compared output rows"},
      {"accuracy.inf_count", "integer|null", "Inf values in the compared output rows"},
      {"accuracy_e2e.reference", "string", "as `accuracy.reference`"},
      {"accuracy_e2e.rows", "integer", "as `accuracy.rows`"},
      {"accuracy_e2e.max_abs_err", "number|string|null",
       "largest absolute error against the fp64 reference on the fp32 inputs before rounding to `dtype` "
       "(end to end: the rounding of the inputs and the kernel's own error; equal to `accuracy` for fp32)"},
      {"accuracy_e2e.rel_l2_err", "number|string|null", "‖out − ref_fp32‖₂ / ‖ref_fp32‖₂"},
      {"accuracy_e2e.mean_cosine", "number|string|null", "mean cosine similarity against that reference"},
      {"accuracy_e2e.nan_count", "integer|null", "as `accuracy.nan_count`"},
      {"accuracy_e2e.inf_count", "integer|null", "as `accuracy.inf_count`"},
      {"grad_accuracy.reference", "string",
       "backward rows: `full`, `sampled` (the first and last (batch, K/V head) blocks) or `none` (forward "
       "rows, or a reference costing more than accuracy.grad_max_work)"},
      {"grad_accuracy.blocks", "integer", "(batch, K/V head) blocks whose gradients were compared"},
      {"grad_accuracy.dq.max_abs_err", "number|string|null",
       "largest absolute error of dQ against the fp64 gradient of exact softmax attention (same masks, "
       "bias, scale, dropout) on the inputs the kernel read; for an approximate variant that is the distance "
       "of its gradient from exact attention's (its own definition's gradient is what `attnbench check` "
       "tests)"},
      {"grad_accuracy.dq.rel_l2_err", "number|string|null", "‖dQ − ref‖₂ / ‖ref‖₂ over the compared blocks"},
      {"grad_accuracy.dq.nan_count", "integer|null", "NaN values in the compared dQ"},
      {"grad_accuracy.dq.inf_count", "integer|null", "Inf values in the compared dQ"},
      {"grad_accuracy.dk.max_abs_err", "number|string|null", "as for dQ, of dK"},
      {"grad_accuracy.dk.rel_l2_err", "number|string|null", "as for dQ, of dK"},
      {"grad_accuracy.dk.nan_count", "integer|null", "as for dQ, of dK"},
      {"grad_accuracy.dk.inf_count", "integer|null", "as for dQ, of dK"},
      {"grad_accuracy.dv.max_abs_err", "number|string|null", "as for dQ, of dV"},
      {"grad_accuracy.dv.rel_l2_err", "number|string|null", "as for dQ, of dV"},
      {"grad_accuracy.dv.nan_count", "integer|null", "as for dQ, of dV"},
      {"grad_accuracy.dv.inf_count", "integer|null", "as for dQ, of dV"},
      {"memory.estimated_bytes", "integer",
       "output + the variant's workspace estimate (saturating); backward rows: dQ, dK, dV + the backward's "
       "workspace"},
      {"memory.inputs_bytes", "integer",
       "Q, K, V (at `dtype`'s width) and masks; backward rows add O, dO and the saved state"},
      {"memory.workspace_bytes", "integer",
       "the variant's own workspace estimate at `threads` (backward rows: the backward's; a training step: "
       "the larger of the forward's and the backward's)"},
      {"memory.reference_bytes", "integer",
       "what the accuracy steps allocate (fp64 reference rows, two of them for bf16 / fp16, + copy; backward "
       "rows add the fp64 gradients of the compared blocks)"},
      {"memory.peak_bytes", "integer|null",
       "measured increase of the resident high-water mark during the point's untimed checked call (null: "
       "not measured): the forward's for forward rows; for backward rows the backward's, measured from the "
       "state the training forward left (dQ, dK, dV and the backward's workspace); for a training step both "
       "passes, from before the forward"},
      {"memory.peak_note", "string",
       "why `peak_bytes` is null (the kernel refused the /proc/self/clear_refs reset, or the point was not "
       "timed); `\"\"` when it was measured"},
      {"nonfinite_inputs", "integer|null", "NaN/Inf values in Q, K, V (null until measured)"},
      {"timestamp", "string", "when the row was written (UTC)"},
  };
  return fields;
}

std::string row_fields_markdown() {
  std::ostringstream o;
  o << "| field | type | meaning |\n|---|---|---|\n";
  for (const RowField& f : row_fields())
    o << "| `" << f.path << "` | " << f.type << " | " << f.meaning << " |\n";
  return o.str();
}

}  // namespace attn
