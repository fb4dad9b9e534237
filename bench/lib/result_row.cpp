// The result row's one declaration of its fields (below: kFields), and from it its writer, reader and
// documentation.
#include "bench/lib/result_row.hpp"

#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>

#include "common/interface/util.hpp"
#include "common/support/error.hpp"

namespace attn {
namespace {

Json opt(const std::optional<double>& x) {
  return x ? json_number(*x) : Json(nullptr);
}
Json opt(const std::optional<int64_t>& x) {
  return x ? Json(*x) : Json(nullptr);
}
// A leaf of an optional object as JSON (non-finite doubles as "nan" / "inf").
Json leaf_json(double x) {
  return json_number(x);
}
Json leaf_json(const std::optional<double>& x) {
  return opt(x);
}
Json leaf_json(int64_t x) {
  return x;
}
Json leaf_json(int x) {
  return x;
}
Json leaf_json(const std::string& x) {
  return x;
}
Json leaf_json(bool x) {
  return x;
}
Json leaf_json(const std::optional<int64_t>& x) {
  return opt(x);
}
Json leaf_json(const Json& x) {
  return x;
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
  bool is_null(const std::string& path) const {
    const Json* v = find(path);
    return !v || v->is_null();
  }
  std::vector<double> numbers(const std::string& path) const {
    std::vector<double> out;
    const Json* v = find(path);
    if (!v || v->is_null()) return out;
    if (!v->is_array()) fail(path, "must be a list of numbers, got " + v->dump());
    for (const Json& x : *v) {
      if (!x.is_number()) fail(path, "must be a list of numbers, got " + x.dump() + " in it");
      out.push_back(x.get<double>());
    }
    return out;
  }
  Json object(const std::string& path) const {
    const Json* v = find(path);
    if (!v || v->is_null()) return Json::object();
    if (!v->is_object()) fail(path, "must be an object, got " + v->dump());
    return *v;
  }
  Json any(const std::string& path) const {
    const Json* v = find(path);
    return v ? *v : Json();
  }
  // A leaf of the type T it is stored as in ResultRow.
  template <class T>
  T as(const std::string& path) const {
    if constexpr (std::is_same_v<T, double>)
      return number(path);
    else if constexpr (std::is_same_v<T, std::optional<double>>)
      return opt_number(path);
    else if constexpr (std::is_same_v<T, int64_t>)
      return integer(path);
    else if constexpr (std::is_same_v<T, int>)
      return static_cast<int>(integer(path));
    else if constexpr (std::is_same_v<T, bool>)
      return boolean(path);
    else if constexpr (std::is_same_v<T, std::optional<int64_t>>)
      return opt_integer(path);
    else if constexpr (std::is_same_v<T, Json>)
      return any(path);
    else
      return str(path);
  }
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

// ---- The one declaration of the row's fields ----
// Each field: its path (nested objects joined by '.'), JSON type, unit, meaning, and how it is read from and
// written to a ResultRow. to_json, row_from_json, the CSV columns (store.cpp), the documentation table
// (configs/README.md, `attnbench info --row-fields`) and the schema the Python side reads
// (scripts/plotlib/row_schema.json, `attnbench info --row-fields --json`) all come from this table.

using Getter = Json (*)(const ResultRow&);
using Setter = void (*)(const Reader&, const char* path, ResultRow&);

// Codecs by kind; `member` is an expression in `r`. Leaves of an object that is absent (interference,
// interleave, group_sgemm before they are measured) are written null and read back as absent.
#define STR(member)                                  \
  [](const ResultRow& r) -> Json { return member; }, \
      [](const Reader& in, const char* path, ResultRow& r) { member = in.str(path); }
#define INT64(member)                                \
  [](const ResultRow& r) -> Json { return member; }, \
      [](const Reader& in, const char* path, ResultRow& r) { member = in.integer(path); }
#define INT(member)                                  \
  [](const ResultRow& r) -> Json { return member; }, \
      [](const Reader& in, const char* path, ResultRow& r) { member = static_cast<int>(in.integer(path)); }
#define NUM(member)                                  \
  [](const ResultRow& r) -> Json { return member; }, \
      [](const Reader& in, const char* path, ResultRow& r) { member = in.number(path); }
#define BOOL(member)                                 \
  [](const ResultRow& r) -> Json { return member; }, \
      [](const Reader& in, const char* path, ResultRow& r) { member = in.boolean(path); }
#define OPT_NUM(member)                                   \
  [](const ResultRow& r) -> Json { return opt(member); }, \
      [](const Reader& in, const char* path, ResultRow& r) { member = in.opt_number(path); }
#define OPT_INT(member)                                   \
  [](const ResultRow& r) -> Json { return opt(member); }, \
      [](const Reader& in, const char* path, ResultRow& r) { member = in.opt_integer(path); }
// An integer that older rows lack: read as null-able, 0 when absent (complete_and_check gives the meaning).
#define OPT_DEFAULT(member)                                                                                 \
  [](const ResultRow& r) -> Json { return member; }, [](const Reader& in, const char* path, ResultRow& r) { \
    member = static_cast<std::remove_reference_t<decltype(member)>>(in.opt_integer(path).value_or(0));      \
  }
#define BYTES(member)                                \
  [](const ResultRow& r) -> Json { return member; }, \
      [](const Reader& in, const char* path, ResultRow& r) { member = in.bytes(path); }
#define SAMPLES(member)                              \
  [](const ResultRow& r) -> Json { return member; }, \
      [](const Reader& in, const char* path, ResultRow& r) { member = in.numbers(path); }
#define OBJECT(member)                               \
  [](const ResultRow& r) -> Json { return member; }, \
      [](const Reader& in, const char* path, ResultRow& r) { member = in.object(path); }
// The first leaf of an optional object decides whether it is there (a non-null value), the others follow.
#define OPTIONAL_LEAF(opt_member, first, leaf, read)                                                       \
  [](const ResultRow& r) -> Json { return r.opt_member ? leaf_json(r.opt_member->leaf) : Json(nullptr); }, \
      [](const Reader& in, const char* path, ResultRow& r) {                                               \
        if (std::string_view(#leaf) == #first) {                                                           \
          if (in.is_null(path)) return;                                                                    \
          r.opt_member.emplace();                                                                          \
        }                                                                                                  \
        if (r.opt_member) r.opt_member->leaf = read;                                                       \
      }
#define INTERFERENCE(leaf) \
  OPTIONAL_LEAF(interference, window_s, leaf, in.template as<decltype(r.interference->leaf)>(path))
#define INTERLEAVE(leaf) \
  OPTIONAL_LEAF(interleave, group, leaf, in.template as<decltype(r.interleave->leaf)>(path))
#define GROUP_SGEMM(leaf) \
  OPTIONAL_LEAF(group_sgemm, gflops, leaf, in.template as<decltype(r.group_sgemm->leaf)>(path))
#define GROUP_BANDWIDTH(leaf) \
  OPTIONAL_LEAF(group_bandwidth, gbytes_per_s, leaf, in.template as<decltype(r.group_bandwidth->leaf)>(path))

struct Field {
  const char* path;
  const char* type;
  const char* unit;
  const char* meaning;
  Getter get;
  Setter set;
};

// Constant-initialised (string literals and function pointers), so no order of static initialisation
// matters.
constexpr Field kFields[] = {
    {"id", "string", "",
     "the point's unique id: the problem's repro string (with `,Dv=N` when d_v differs from head_dim, "
     "`,alibi` and "
     "`,dtype=NAME` unless the defaults, `,state0` when a recurrence starts from a state, as its decode "
     "points do), "
     "`,padfrac=F` with key padding, the regime (with `,rope=MODE` when RoPE is on, and a gate "
     "distribution that is not the default), `,T=` threads, `,isa=NAME` unless the requested "
     "target is `best`, and `,pass=NAME` unless the pass is the forward",
     STR(r.id)},
    {"variant", "string", "", "registered variant name", STR(r.variant)},
    {"plugin", "string", "",
     "where the variant comes from: `PATH (fnv1a64:HASH)` for a plugin's variant (the shared library's "
     "absolute path and the hash of its bytes; loaded with `--plugin`, ATTNBENCH_PLUGINS or the config's "
     "`plugins`, listed in meta.json's `plugins`), `\"\"` for a variant built into attnbench and in rows "
     "written before the field existed",
     STR(r.plugin)},
    {"params", "object", "", "the variant's resolved parameters (defaults filled in)", OBJECT(r.params)},
    {"batch", "integer", "", "B", INT64(r.batch)},
    {"heads", "integer", "", "H (query heads)", INT64(r.heads)},
    {"kv_heads", "integer", "",
     "K/V heads (grouped-query attention: query head h reads K/V head h / (heads / kv_heads)); "
     "equal to `heads` for multi-head attention and in rows written before the field existed",
     OPT_DEFAULT(r.kv_heads)},
    {"seq_q", "integer", "positions", "query length", INT64(r.seq_q)},
    {"seq_kv", "integer", "positions", "key/value length", INT64(r.seq_kv)},
    {"head_dim", "integer", "", "D (d_k: the width of Q and K)", INT64(r.head_dim)},
    {"v_head_dim", "integer", "",
     "d_v, the width of V and the output (sweep.v_head_dim); equal to `head_dim` unless set, and in rows "
     "written before the field existed",
     OPT_DEFAULT(r.v_head_dim)},
    {"mask", "string", "",
     "`none`, `causal`, `causal_lower_right`, `pad=F`, or `+`-joined (`causal+pad=F`, "
     "`causal_lower_right+pad=F`)",
     STR(r.mask)},
    {"regime", "string", "",
     "how the inputs were made: `gaussian(std=S)` or `tokens(FILE)`, with `,rope=MODE` inside "
     "the parentheses when RoPE is on (`gaussian(std=1,rope=normal)`) and `,g=logsigmoid(N(M,S))`, "
     "`,beta=sigmoid(N(M,S))` when a gate distribution is not the default",
     STR(r.regime)},
    {"threads", "integer", "", "TBB threads", INT(r.threads)},
    {"isa", "string", "", "the SIMD target that ran (e.g. `avx3`, `avx2`, `neon`, `scalar`)", STR(r.isa)},
    {"dropout", "number", "probability", "dropout probability on the attention weights", NUM(r.dropout)},
    {"dtype", "string", "",
     "storage precision of Q, K, V: `fp32`, or `bf16` / `fp16` rounded (nearest even) from the "
     "fp32 inputs; computation and the output are fp32 (`fp32` in rows written before the field "
     "existed)",
     STR(r.dtype)},
    {"bias", "string", "", "logit bias: `none` or `alibi` (the ALiBi paper's default slopes)", STR(r.bias)},
    {"softcap", "number|null", "", "logit soft-capping C of s <- C tanh(s / C) (null: none)",
     OPT_NUM(r.softcap)},
    {"sinks", "boolean", "",
     "learned sink logits, one per head, in every row's softmax denominator (drawn N(0, 1) per point)",
     BOOL(r.sinks)},
    {"rope", "string", "",
     "RoPE applied to the fp32 Q and K before rounding: `none`, `normal` (adjacent pairs), "
     "`neox` (halves), with `,base=B` when the base is not 10000",
     STR(r.rope)},
    {"rope_ms", "number|null", "ms",
     "median milliseconds of applying RoPE to Q and K once, at the row's threads and target (not "
     "part of `time_ms`); null when `rope` is `none`",
     OPT_NUM(r.rope_ms)},
    {"phase_ms", "object|null", "ms",
     "median milliseconds of each phase of the timed forward calls, by name, for a variant that reports its "
     "phases (dsa: `indexer`, `selection`, `attention`; they sum to about `time_ms.median`); null for "
     "other variants, backward passes and rows written before the field existed",
     [](const ResultRow& r) -> Json { return r.phase_ms; },
     [](const Reader& in, const char* path, ResultRow& r) { r.phase_ms = in.any(path); }},
    {"pass", "string", "",
     "what was timed (sweep.pass): `forward`; `backward` (dQ, dK, dV from the O, saved state and "
     "dO an untimed training forward left); or `forward_backward` (the training forward then the "
     "backward); `forward` in rows written before the field existed",
     STR(r.pass)},
    {"exact", "boolean", "", "the variant computes softmax attention exactly", BOOL(r.exact)},
    {"status", "string", "", "`ok`, `skipped` (unsupported or over the memory budget) or `failed`",
     STR(r.status)},
    {"reason", "string", "", "why skipped or failed (`\"\"` when ok)", STR(r.reason)},
    {"time_ms.median", "number|null", "ms", "median milliseconds per call", OPT_NUM(r.time_ms.median)},
    {"time_ms.p10", "number|null", "ms", "10th percentile", OPT_NUM(r.time_ms.p10)},
    {"time_ms.p90", "number|null", "ms", "90th percentile", OPT_NUM(r.time_ms.p90)},
    {"time_ms.mean", "number|null", "ms", "mean", OPT_NUM(r.time_ms.mean)},
    {"time_ms.cv", "number|null", "", "coefficient of variation (stddev / mean)", OPT_NUM(r.time_ms.cv)},
    {"time_ms.reps", "integer", "", "measured repetitions (0 when not measured)", INT(r.time_ms.reps)},
    {"time_ms.ci_lo", "number|null", "ms",
     "lower end of the 95% confidence interval of the median: the order statistic x(l) of the "
     "distribution-free interval [x(l), x(n+1-l)], l the largest rank whose binomial coverage is "
     ">= 95%; null below 6 repetitions (no such pair exists)",
     OPT_NUM(r.time_ms.ci_lo)},
    {"time_ms.ci_hi", "number|null", "ms", "upper end, x(n+1-l)", OPT_NUM(r.time_ms.ci_hi)},
    {"time_ms.ci_level", "number|null", "",
     "the interval's exact coverage, 1 - 2 P(Binomial(n, 1/2) < l) (>= 0.95)", OPT_NUM(r.time_ms.ci_level)},
    {"time_ms.samples", "array", "ms", "every measured repetition in ms, in order (at most max_reps)",
     SAMPLES(r.time_ms.samples)},
    {"interference.window_s", "number|null", "s",
     "interference while the point was timed (#18; null until measured, for the attempt kept): "
     "the wall seconds the probe covered (warm-up and timed rounds; an interleaved group shares "
     "one window)",
     INTERFERENCE(window_s)},
    {"interference.steal_frac", "number|null", "",
     "hypervisor steal over window x the CPUs this process may run on (/proc/stat)",
     INTERFERENCE(steal_frac)},
    {"interference.other_cpu_frac", "number|null", "",
     "other processes' CPU time on those CPUs (their busy ticks minus this process's CPU time) "
     "over the same; known to about 2 ticks per CPU",
     INTERFERENCE(other_cpu_frac)},
    {"interference.runq_wait_frac", "number|null", "",
     "time this process's runnable threads waited for a core (/proc/self/task/*/schedstat) over "
     "window x threads",
     INTERFERENCE(runq_wait_frac)},
    {"interference.score", "number|null", "",
     "steal_frac + max(runq_wait_frac, other_cpu_frac - 2 / (HZ x window_s)): compared with "
     "measure.max_interference",
     INTERFERENCE(score)},
    {"interference.ctx_switches_involuntary", "integer|null", "",
     "this process's involuntary context switches during the window (getrusage)",
     INTERFERENCE(ctx_switches_involuntary)},
    {"interference.loadavg_1m", "number|null", "", "/proc/loadavg's 1-minute load at the end of the window",
     INTERFERENCE(loadavg_1m)},
    {"interference.freq_mhz", "number|null", "MHz",
     "mean cpufreq scaling_cur_freq of those CPUs; null where the kernel does not expose it "
     "(VMs)",
     INTERFERENCE(freq_mhz)},
    {"attempts", "integer", "",
     "timed measurements of the point: 1, plus one per re-measurement after a score above "
     "measure.max_interference (at most 1 + measure.max_remeasure); the cleanest is kept; 0 when "
     "not measured",
     OPT_DEFAULT(r.attempts)},
    {"noisy", "boolean", "", "every attempt's interference score stayed above measure.max_interference",
     BOOL(r.noisy)},
    {"interleave.group", "string|null", "",
     "the id of the first point of the group this point was timed with in interleaved rounds "
     "(measure.interleave: the points sharing one input set); null when timed alone",
     INTERLEAVE(group)},
    {"interleave.points", "integer|null", "", "the points timed in that group", INTERLEAVE(points)},
    {"interleave.position", "integer|null", "",
     "this point's place in the group's rounds (0-based; odd rounds run in reverse order)",
     INTERLEAVE(position)},
    {"interleave.rounds", "integer|null", "",
     "the group's timed rounds; sample r of time_ms.samples was taken in round r, so two rows of "
     "one group pair up sample by sample (a point that reached max_reps or max_time_s left early "
     "and has fewer)",
     INTERLEAVE(rounds)},
    {"calibration", "integer|null", "",
     "index into meta.json's `calibrations` of the sgemm / FMA-peak calibration that frac_peak "
     "(and frac_sgemm when `group_sgemm` is null) were divided by (the latest one measured clean "
     "before the point)",
     OPT_INT(r.calibration)},
    {"group_sgemm.gflops", "number|null", "GFLOP/s",
     "the median GFLOP/s of the sgemm timed in this row's interleaved rounds "
     "(measure.group_sgemm: the calibration's sgemm at the row's thread count, one call per "
     "round); null when the group ran without it (its sgemm would have cost over half a round, "
     "or measure.group_sgemm is false)",
     GROUP_SGEMM(gflops)},
    {"group_sgemm.reps", "integer|null", "", "the sgemm's timed calls in those rounds", GROUP_SGEMM(reps)},
    {"group_sgemm.frac_ci_lo", "number|null", "",
     "95% distribution-free interval of frac_sgemm, over the rounds both were timed in (null "
     "below 6)",
     GROUP_SGEMM(frac_ci_lo)},
    {"group_sgemm.frac_ci_hi", "number|null", "", "its upper end", GROUP_SGEMM(frac_ci_hi)},
    {"flops", "number|null", "FLOP",
     "floating-point operations of one timed call, as the variant counts its work: `flops` for "
     "the forward, `backward_flops` for the backward (by default the FlashAttention-2 "
     "convention, 2.5x the forward's, the five matmuls of a backward against the forward's two; "
     "causal counts only the unmasked pairs in both), their sum for a training step",
     OPT_NUM(r.flops)},
    {"gflops", "number|null", "GFLOP/s", "flops / median time", OPT_NUM(r.gflops)},
    {"frac_sgemm", "number|null", "",
     "with `group_sgemm`: the median over the group's rounds of (this row's GFLOP/s / the "
     "sgemm's GFLOP/s in the same round); without: gflops / the sgemm calibration at the same "
     "thread count",
     OPT_NUM(r.frac_sgemm)},
    {"frac_peak", "number|null", "", "gflops / the fp32 FMA peak of the row's own SIMD target and threads",
     OPT_NUM(r.frac_peak)},
    {"bytes", "number|null", "B",
     "bytes one call moves to and from memory as the variant counts its traffic (`bytes_moved`; "
     "at least Q, K, V, O and the masks once), from the sizes, so skipped rows have it too; null "
     "in older rows. Backward rows count the backward's compulsory traffic (Q, K, V, the masks, "
     "O, dO and the saved state read once, dQ, dK, dV written once), a training step that plus "
     "the forward's",
     OPT_NUM(r.bytes)},
    {"gbytes_per_s", "number|null", "GB/s", "bytes / median time / 1e9 (achieved bandwidth)",
     OPT_NUM(r.gbytes_per_s)},
    {"group_bandwidth.gbytes_per_s", "number|null", "GB/s",
     "the median GB/s of a streaming read of this point's own K and V (as stored) timed in its "
     "interleaved rounds (measure.group_bandwidth: points whose flops / bytes is below the "
     "calibration's FMA peak / memory bandwidth, 16 times that for 16-bit K/V, on the row's thread "
     "count, one read per round); "
     "null when the group ran without it (a compute-bound point, a read costing over twice a round, "
     "or measure.group_bandwidth is false)",
     GROUP_BANDWIDTH(gbytes_per_s)},
    {"group_bandwidth.bytes", "number|null", "B", "the bytes that read covers (K and V as stored)",
     GROUP_BANDWIDTH(bytes)},
    {"group_bandwidth.reps", "integer|null", "", "the read's timed calls in those rounds",
     GROUP_BANDWIDTH(reps)},
    {"group_bandwidth.frac_ci_lo", "number|null", "",
     "95% distribution-free interval of frac_bandwidth, over the rounds both were timed in (null "
     "below 6)",
     GROUP_BANDWIDTH(frac_ci_lo)},
    {"group_bandwidth.frac_ci_hi", "number|null", "", "its upper end", GROUP_BANDWIDTH(frac_ci_hi)},
    {"frac_bandwidth", "number|null", "",
     "with `group_bandwidth`: the median over the group's rounds of (this row's GB/s / the "
     "streaming read's GB/s in the same round), the fraction of what the machine streams from "
     "wherever that many bytes live (a cache or DRAM); without: gbytes_per_s / the start-of-run "
     "memory-bandwidth calibration at the same thread count (`memory_bandwidth` in meta.json, a "
     "DRAM-sized buffer)",
     OPT_NUM(r.frac_bandwidth)},
    {"accuracy.reference", "string", "", "`full`, `sampled` or `none`", STR(r.accuracy.reference)},
    {"accuracy.rows", "integer", "", "query rows compared per (batch, head)", INT64(r.accuracy.rows)},
    {"accuracy.max_abs_err", "number|string|null", "",
     "largest absolute error against the fp64 exact reference on the inputs the kernel read "
     "(rounded to `dtype`: the kernel's own error; `\"inf\"` if an output is non-finite): exact "
     "softmax attention, or for a variant that is not softmax attention (the recurrences) its own "
     "definition (reference_forward); the distance from softmax is then `accuracy_vs_softmax`",
     OPT_NUM(r.accuracy.max_abs_err)},
    {"accuracy.rel_l2_err", "number|string|null", "", "‖out − ref‖₂ / ‖ref‖₂ over the compared rows",
     OPT_NUM(r.accuracy.rel_l2_err)},
    {"accuracy.mean_cosine", "number|string|null", "", "mean cosine similarity of output and reference rows",
     OPT_NUM(r.accuracy.mean_cosine)},
    {"accuracy.nan_count", "integer|null", "", "NaN values in the compared output rows",
     OPT_INT(r.accuracy.nan_count)},
    {"accuracy.inf_count", "integer|null", "", "Inf values in the compared output rows",
     OPT_INT(r.accuracy.inf_count)},
    {"accuracy_e2e.reference", "string", "", "as `accuracy.reference`", STR(r.accuracy_e2e.reference)},
    {"accuracy_e2e.rows", "integer", "", "as `accuracy.rows`", INT64(r.accuracy_e2e.rows)},
    {"accuracy_e2e.max_abs_err", "number|string|null", "",
     "largest absolute error against the fp64 reference on the fp32 inputs before rounding to "
     "`dtype` (end to end: the rounding of the inputs and the kernel's own error; equal to "
     "`accuracy` for fp32)",
     OPT_NUM(r.accuracy_e2e.max_abs_err)},
    {"accuracy_e2e.rel_l2_err", "number|string|null", "", "‖out − ref_fp32‖₂ / ‖ref_fp32‖₂",
     OPT_NUM(r.accuracy_e2e.rel_l2_err)},
    {"accuracy_e2e.mean_cosine", "number|string|null", "", "mean cosine similarity against that reference",
     OPT_NUM(r.accuracy_e2e.mean_cosine)},
    {"accuracy_e2e.nan_count", "integer|null", "", "as `accuracy.nan_count`",
     OPT_INT(r.accuracy_e2e.nan_count)},
    {"accuracy_e2e.inf_count", "integer|null", "", "as `accuracy.inf_count`",
     OPT_INT(r.accuracy_e2e.inf_count)},
    {"accuracy_vs_softmax.max_abs_err", "number|string|null", "",
     "informative: largest absolute distance of the output from exact softmax attention in fp64 on "
     "the inputs the kernel read, on `accuracy`'s rows: for a variant that is not softmax attention "
     "(the recurrences, whose `accuracy` is against their own definition) the gap between the two "
     "operators; for softmax variants (exact or approximate) the same as `accuracy.max_abs_err`; null "
     "when not compared and in older rows",
     OPT_NUM(r.accuracy_vs_softmax.max_abs_err)},
    {"accuracy_vs_softmax.rel_l2_err", "number|string|null", "",
     "informative: ‖out − softmax_ref‖₂ / ‖softmax_ref‖₂ on the same rows",
     OPT_NUM(r.accuracy_vs_softmax.rel_l2_err)},
    {"grad_accuracy.reference", "string", "",
     "backward rows: `full`, `sampled` (the first and last (batch, K/V head) blocks) or `none` "
     "(forward rows, or a reference costing more than accuracy.grad_max_work)",
     STR(r.grad_accuracy.reference)},
    {"grad_accuracy.blocks", "integer", "", "(batch, K/V head) blocks whose gradients were compared",
     INT64(r.grad_accuracy.blocks)},
    {"grad_accuracy.dq.max_abs_err", "number|string|null", "",
     "largest absolute error of dQ against an fp64 gradient on the inputs the kernel read: for a "
     "variant that is not softmax attention (capability own_definition: the recurrences) the "
     "gradient of its own fp64 definition (reference_gradients, with the g, beta and initial state "
     "it read); otherwise that of exact softmax attention (same masks, bias, scale, dropout, sinks), "
     "so for an approximate variant the distance of its gradient from exact attention's (its own "
     "definition's gradient is what `attnbench check` tests)",
     OPT_NUM(r.grad_accuracy.dq.max_abs_err)},
    {"grad_accuracy.dq.rel_l2_err", "number|string|null", "", "‖dQ − ref‖₂ / ‖ref‖₂ over the compared blocks",
     OPT_NUM(r.grad_accuracy.dq.rel_l2_err)},
    {"grad_accuracy.dq.nan_count", "integer|null", "", "NaN values in the compared dQ",
     OPT_INT(r.grad_accuracy.dq.nan_count)},
    {"grad_accuracy.dq.inf_count", "integer|null", "", "Inf values in the compared dQ",
     OPT_INT(r.grad_accuracy.dq.inf_count)},
    {"grad_accuracy.dk.max_abs_err", "number|string|null", "", "as for dQ, of dK",
     OPT_NUM(r.grad_accuracy.dk.max_abs_err)},
    {"grad_accuracy.dk.rel_l2_err", "number|string|null", "", "as for dQ, of dK",
     OPT_NUM(r.grad_accuracy.dk.rel_l2_err)},
    {"grad_accuracy.dk.nan_count", "integer|null", "", "as for dQ, of dK",
     OPT_INT(r.grad_accuracy.dk.nan_count)},
    {"grad_accuracy.dk.inf_count", "integer|null", "", "as for dQ, of dK",
     OPT_INT(r.grad_accuracy.dk.inf_count)},
    {"grad_accuracy.dv.max_abs_err", "number|string|null", "", "as for dQ, of dV",
     OPT_NUM(r.grad_accuracy.dv.max_abs_err)},
    {"grad_accuracy.dv.rel_l2_err", "number|string|null", "", "as for dQ, of dV",
     OPT_NUM(r.grad_accuracy.dv.rel_l2_err)},
    {"grad_accuracy.dv.nan_count", "integer|null", "", "as for dQ, of dV",
     OPT_INT(r.grad_accuracy.dv.nan_count)},
    {"grad_accuracy.dv.inf_count", "integer|null", "", "as for dQ, of dV",
     OPT_INT(r.grad_accuracy.dv.inf_count)},
    {"memory.estimated_bytes", "integer", "B",
     "output + the variant's workspace estimate (saturating); backward rows: dQ, dK, dV + the "
     "backward's workspace",
     BYTES(r.memory.estimated_bytes)},
    {"memory.inputs_bytes", "integer", "B",
     "Q, K, V (at `dtype`'s width) and masks; backward rows add O, dO and the saved state",
     BYTES(r.memory.inputs_bytes)},
    {"memory.workspace_bytes", "integer", "B",
     "the variant's own workspace estimate at `threads` (backward rows: the backward's; a "
     "training step: the larger of the forward's and the backward's)",
     BYTES(r.memory.workspace_bytes)},
    {"memory.reference_bytes", "integer", "B",
     "what the accuracy steps allocate (fp64 reference rows, two of them for bf16 / fp16, + "
     "copy; backward rows add the fp64 gradients of the compared blocks)",
     BYTES(r.memory.reference_bytes)},
    {"memory.state_bytes", "integer|null", "B",
     "what a decode keeps between steps at the row's context (seq_kv), from the sizes: a recurrence's "
     "d_k x d_v fp32 state per (batch, head), sliding_window's rolling cache (K and V of the sinks "
     "and the last w·dilation + 1 positions, fp32), the KV cache for every other variant; null in "
     "older rows",
     OPT_INT(r.memory.state_bytes)},
    {"memory.kv_cache_bytes", "integer|null", "B",
     "beside it, the KV cache exact attention keeps at the same context: K and V, batch x kv_heads "
     "x seq_kv x (head_dim + v_head_dim) at `dtype`'s width; null in older rows",
     OPT_INT(r.memory.kv_cache_bytes)},
    {"memory.peak_bytes", "integer|null", "B",
     "measured increase of the resident high-water mark during the point's untimed checked call "
     "(null: not measured): the forward's for forward rows; for backward rows the backward's, "
     "measured from the state the training forward left (dQ, dK, dV and the backward's "
     "workspace); for a training step both passes, from before the forward",
     OPT_INT(r.memory.peak_bytes)},
    {"memory.peak_note", "string", "",
     "why `peak_bytes` is null (the kernel refused the /proc/self/clear_refs reset, or the point "
     "was not timed); `\"\"` when it was measured",
     STR(r.memory.peak_note)},
    {"nonfinite_inputs", "integer|null", "", "NaN/Inf values in Q, K, V (null until measured)",
     OPT_INT(r.nonfinite_inputs)},
    {"timestamp", "string", "", "when the row was written (UTC)", STR(r.timestamp)},
};

// attnbench_mpi's ring figures: written only in its rows (ResultRow::ring), so single-process rows keep
// exactly the fields above.
constexpr Field kRingFields[] = {
    {"ranks", "integer", "", "attnbench_mpi rows only: the MPI rank count (ids end in `,ranks=P`)",
     [](const ResultRow& r) -> Json { return r.ring->ranks; },
     [](const Reader& in, const char* path, ResultRow& r) {
       r.ring->ranks = static_cast<int>(in.integer(path));
     }},
    {"bytes_sent_per_rank", "number|null", "B",
     "attnbench_mpi rows only: the most K/V bytes one rank sent around the ring",
     [](const ResultRow& r) -> Json { return opt(r.ring->bytes_sent_per_rank); },
     [](const Reader& in, const char* path, ResultRow& r) {
       r.ring->bytes_sent_per_rank = in.opt_number(path);
     }},
    {"rank0_whole_tensors_bytes", "number|null", "B",
     "attnbench_mpi rows only: what rank 0 holds beyond its share (the point's whole Q, K, V and O, for "
     "the "
     "accuracy check)",
     [](const ResultRow& r) -> Json { return opt(r.ring->rank0_whole_tensors_bytes); },
     [](const Reader& in, const char* path, ResultRow& r) {
       r.ring->rank0_whole_tensors_bytes = in.opt_number(path);
     }},
    {"ring", "object|null", "",
     "attnbench_mpi rows only: the per-rank report (query rows, compute, wait and ring seconds, bytes "
     "sent, "
     "blocks, peak RSS) and the balance; null for a skipped point",
     [](const ResultRow& r) -> Json { return r.ring->report; },
     [](const Reader& in, const char* path, ResultRow& r) { r.ring->report = in.any(path); }},
};

// The quality harness's task block: written only in its rows (ResultRow::task), so sweep rows keep exactly
// the fields above. Every leaf is read and written as the type RowTask stores it.
#define TASK(leaf)                                                                            \
  [](const ResultRow& r) -> Json { return leaf_json(r.task->leaf); },                         \
      [](const Reader& in, const char* path, ResultRow& r) {                                  \
        r.task->leaf = in.template as<std::remove_reference_t<decltype(r.task->leaf)>>(path); \
      }
constexpr Field kTaskFields[] = {
    {"task.name", "string", "",
     "quality rows only (`scripts/quality`, bench/quality): the task trained, `capacity` (Schlag et al. "
     "2021's "
     "associative retrieval) or `mqar` (Zoology's multi-query associative recall)",
     TASK(name)},
    {"task.setting", "integer|null", "",
     "capacity: 1 (N distinct keys) or 2 (2N keys drawn with replacement, the last occurrence counts); null "
     "for mqar",
     TASK(setting)},
    {"task.size", "integer", "",
     "the task's size: capacity N (key-value pairs), mqar the kv pairs per example", TASK(size)},
    {"task.seq_len", "integer", "tokens",
     "tokens per training example: capacity N (setting 1) or 2N (setting 2), mqar the input length L",
     TASK(seq_len)},
    {"task.vocab", "integer|null", "",
     "mqar: the vocabulary (keys from the first half, values from the second)", TASK(vocab)},
    {"task.d_model", "integer", "", "mqar: the model width; capacity: d, the width of Q and K",
     TASK(d_model)},
    {"task.layers", "integer", "", "sequence-mixer layers (capacity: 1, its single read-out)", TASK(layers)},
    {"task.short_conv", "boolean", "",
     "mqar: the short causal depthwise convolution (kernel 4) on q, k, v of every layer", TASK(short_conv)},
    {"task.lr", "number", "", "the learning rate (Adam for capacity, AdamW for mqar)", TASK(lr)},
    {"task.seed", "integer", "",
     "the seed of the data and the model (initialisation, dropout, shuffling): one seed, one curve",
     TASK(seed)},
    {"task.loss", "number|string|null", "",
     "the last evaluation's loss: capacity 0.5 ||onehot(v) - y||^2 (0.5 = nothing retrieved), mqar the "
     "cross-entropy at the query positions",
     TASK(loss)},
    {"task.best_loss", "number|string|null", "", "the lowest evaluation loss of the run", TASK(best_loss)},
    {"task.accuracy", "number|null", "",
     "the last evaluation's accuracy: the fraction of queries whose largest output (capacity) or logit "
     "(mqar) "
     "is the right value",
     TASK(accuracy)},
    {"task.best_accuracy", "number|null", "", "the highest evaluation accuracy of the run",
     TASK(best_accuracy)},
    {"task.steps", "integer", "", "training steps taken (each one batch: forward, loss, backward, optimiser)",
     TASK(steps)},
    {"task.train_s", "number", "s", "wall time of the training steps (the sum of `time_ms.samples`)",
     TASK(train_s)},
    {"task.eval_s", "number", "s", "wall time of the evaluations", TASK(eval_s)},
    {"task.wall_s", "number", "s", "wall time of the whole point: data, model, training and evaluations",
     TASK(wall_s)},
    {"task.converged", "boolean", "",
     "the run met the task's criterion: capacity evaluation loss <= stop_loss, mqar test accuracy > "
     "stop_accuracy",
     TASK(converged)},
    {"task.stop", "string", "",
     "why training stopped: `stop_loss`, `stop_accuracy` (converged), `no_improvement` (capacity: more than "
     "`patience` evaluations without a lower loss), `max_steps`, `epochs`; `\"\"` for a failed point",
     TASK(stop)},
    {"task.curve", "array", "", "every evaluation of the run in order: {step, loss, accuracy}", TASK(curve)},
    {"task.data", "object", "",
     "the task's data: capacity `eval_sequences`; mqar `train_examples`, `test_examples`, `test_seed` and "
     "`leaked` (test examples also in the training set)",
     TASK(data)},
};

#undef TASK
#undef GROUP_SGEMM
#undef GROUP_BANDWIDTH
#undef INTERLEAVE
#undef INTERFERENCE
#undef OPTIONAL_LEAF
#undef OBJECT
#undef SAMPLES
#undef BYTES
#undef OPT_DEFAULT
#undef OPT_INT
#undef OPT_NUM
#undef BOOL
#undef NUM
#undef INT
#undef INT64
#undef STR

// Sets `value` at `path` ('.'-separated) in `j`, creating the objects on the way.
void set_path(Json& j, const char* path, Json value) {
  Json* cur = &j;
  std::string_view p(path);
  for (std::size_t dot; (dot = p.find('.')) != std::string_view::npos; p.remove_prefix(dot + 1))
    cur = &(*cur)[std::string(p.substr(0, dot))];
  (*cur)[std::string(p)] = std::move(value);
}

// What rows from older attnbench versions lack reads as what those versions meant, and the values every
// reader relies on are checked.
void complete_and_check(const Reader& in, ResultRow& r) {
  if (r.id.empty()) in.fail("id", "missing (every row has it)");
  if (r.variant.empty()) in.fail("variant", "missing (every row has it)");
  if (!in.find("status")) in.fail("status", "missing (every row has it)");
  if (r.status != "ok" && r.status != "skipped" && r.status != "failed")
    in.fail("status", "must be ok, skipped or failed, got '" + r.status + "'");
  // Before grouped-query attention: K/V had `heads` heads.
  if (in.is_null("kv_heads")) r.kv_heads = r.heads;
  if (in.is_null("v_head_dim")) r.v_head_dim = r.head_dim;  // before d_v was an axis: V as wide as Q, K
  // Before precision, position and the backward pass were axes: the defaults.
  if (r.dtype.empty()) r.dtype = "fp32";
  if (r.dtype != "fp32" && r.dtype != "bf16" && r.dtype != "fp16")
    in.fail("dtype", "must be fp32, bf16 or fp16, got '" + r.dtype + "'");
  if (r.bias.empty()) r.bias = "none";
  if (r.rope.empty()) r.rope = "none";
  if (r.pass.empty()) r.pass = "forward";
  if (r.pass != "forward" && r.pass != "backward" && r.pass != "forward_backward")
    in.fail("pass", "must be forward, backward or forward_backward, got '" + r.pass + "'");
  if (r.grad_accuracy.reference.empty()) r.grad_accuracy.reference = "none";
  // Before re-measurement under interference: one clean attempt when measured.
  if (in.is_null("attempts")) r.attempts = r.time_ms.reps > 0 ? 1 : 0;
  // Before the storage dtype: fp32, where the end-to-end error is the kernel's.
  if (!in.find("accuracy_e2e")) r.accuracy_e2e = r.accuracy;
}

}  // namespace

Json to_json(const ResultRow& r) {
  Json j = Json::object();
  for (const Field& f : kFields) set_path(j, f.path, f.get(r));
  if (r.ring)
    for (const Field& f : kRingFields) set_path(j, f.path, f.get(r));
  if (r.task)
    for (const Field& f : kTaskFields) set_path(j, f.path, f.get(r));
  return j;
}

ResultRow row_from_json(const Json& j, const std::string& where) {
  const Reader in(j, where);
  ResultRow r;
  for (const Field& f : kFields) f.set(in, f.path, r);
  if (in.find("ranks")) {
    r.ring.emplace();
    for (const Field& f : kRingFields) f.set(in, f.path, r);
  }
  if (!in.is_null("task")) {
    r.task.emplace();
    for (const Field& f : kTaskFields) f.set(in, f.path, r);
    if (r.task->name.empty()) in.fail("task.name", "missing (every row with a task block has it)");
  }
  complete_and_check(in, r);
  return r;
}

const std::vector<RowField>& row_fields() {
  static const std::vector<RowField> documented = [] {
    std::vector<RowField> out;
    for (const Field& f : kFields) out.push_back({f.path, f.type, f.unit, f.meaning, false, false});
    for (const Field& f : kRingFields) out.push_back({f.path, f.type, f.unit, f.meaning, true, false});
    for (const Field& f : kTaskFields) out.push_back({f.path, f.type, f.unit, f.meaning, false, true});
    return out;
  }();
  return documented;
}

std::string row_fields_markdown() {
  std::ostringstream o;
  o << "| field | type | unit | meaning |\n|---|---|---|---|\n";
  for (const RowField& f : row_fields())
    o << "| `" << f.path << "` | " << f.type << " | " << f.unit << " | " << f.meaning << " |\n";
  return o.str();
}

}  // namespace attn
