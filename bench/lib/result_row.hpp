// The result row: one measured (or skipped, or failed) sweep point, the one definition of what
// results.jsonl, results.csv, the PyTorch peer's rows and plot.py read. Its fields are declared once
// (result_row.cpp kFields): to_json and row_from_json, the CSV columns, row_fields() (configs/README.md's
// table and scripts/plotlib/row_schema.json are generated from it; tests hold them together, and the JSON
// against tests/data/result_row.json).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/interface/params.hpp"

namespace attn {

struct TimingSummary {  // milliseconds per call over the measured repetitions (null until measured)
  std::optional<double> median, p10, p90, mean, cv;
  int reps = 0;
  // The distribution-free confidence interval of the median (order statistics; null below 6 repetitions,
  // where no pair of order statistics covers the median with 95%), and its exact coverage (>= 0.95).
  std::optional<double> ci_lo, ci_hi, ci_level;
  std::vector<double> samples;  // every measured repetition, in order (at most measure.max_reps)
};

// What else ran on the machine while a point was timed (bench/lib/interference.hpp), over the timing window.
struct InterferenceSummary {
  double window_s = 0;        // wall time the probe covered (warm-up and repetitions)
  double steal_frac = 0;      // hypervisor steal over (window × cores we may run on)
  double other_cpu_frac = 0;  // CPU time of other processes on those cores over (window × cores)
  double runq_wait_frac = 0;  // time our runnable threads waited for a core, over (window × threads)
  double score = 0;           // the share compared with measure.max_interference (see row_fields)
  int64_t ctx_switches_involuntary = 0;  // this process's, during the window
  double loadavg_1m = 0;                 // /proc/loadavg at the end of the window
  std::optional<double> freq_mhz;        // mean current frequency of those cores, where the kernel exposes it
};

// Against the fp64 reference (metrics null until compared): exact softmax attention, or the variant's own
// definition for a variant that is not softmax attention (Capabilities::own_definition: the recurrences).
struct AccuracySummary {
  std::string reference;                                       // "full" | "sampled" | "none"
  int64_t rows = 0;                                            // query rows compared per (batch, head)
  std::optional<double> max_abs_err, rel_l2_err, mean_cosine;  // written as "nan"/"inf" when not finite
  std::optional<int64_t> nan_count, inf_count;
};

// The informative distance of the output from exact softmax attention in fp64 on the same inputs (what the
// variant read), compared on `accuracy`'s rows: for a variant with its own definition (the recurrences) the
// gap between two different operators; for softmax variants the same figures as `accuracy`.
struct SoftmaxDistance {
  std::optional<double> max_abs_err, rel_l2_err;  // written as "nan"/"inf" when not finite
};

// Backward points: the fp32 gradients against the fp64 gradient of exact softmax attention (same masks, bias,
// dropout; reference_attention_backward) on the inputs the kernel read, per gradient tensor.
struct GradAccuracySummary {
  std::string reference = "none";  // "full" | "sampled" (grad_reference_blocks) | "none"
  int64_t blocks = 0;              // (batch, K/V head) blocks compared
  struct Part {
    std::optional<double> max_abs_err, rel_l2_err;  // written as "nan"/"inf" when not finite
    std::optional<int64_t> nan_count, inf_count;
  };
  Part dq, dk, dv;
};

struct MemorySummary {
  uint64_t estimated_bytes = 0;  // output + workspace (saturating)
  uint64_t inputs_bytes = 0;
  uint64_t workspace_bytes = 0;
  uint64_t reference_bytes = 0;
  // What a decode keeps per call between steps at the row's context (Attention::decode_state_bytes: a
  // recurrence's state, sliding_window's rolling cache, the KV cache for the others) and, beside it, the KV
  // cache exact attention keeps at that context (kv_cache_bytes). Null in rows from before them.
  std::optional<int64_t> state_bytes, kv_cache_bytes;
  std::optional<int64_t> peak_bytes;  // measured resident high-water-mark increase (null: not measured)
  std::string peak_note;              // why peak_bytes is null ("" when it is measured)
};

// Parts of ResultRow held in std::optional, declared at namespace scope: nested in ResultRow, clang 14 sees
// them as not default-constructible inside the enclosing class (their member initialisers are not parsed
// yet), and optional<T>::emplace() then fails to compile. Documented at their members below.
struct RowInterleave {
  std::string group;
  int points = 0;
  int position = 0;
  int rounds = 0;
};
struct RowGroupSgemm {
  double gflops = 0;
  int reps = 0;
  std::optional<double> frac_ci_lo, frac_ci_hi;
};
struct RowGroupBandwidth {
  double gbytes_per_s = 0;
  double bytes = 0;
  int reps = 0;
  std::optional<double> frac_ci_lo, frac_ci_hi;
};
struct RowRing {
  int ranks = 1;
  std::optional<double> bytes_sent_per_rank, rank0_whole_tensors_bytes;
  Json report;  // null for a skipped point
};

// What a quality row trained and how well it learned (bench/quality, `scripts/quality`): absent from every
// other row. Documented at its fields (result_row.cpp kTaskFields).
struct RowTask {
  std::string name;  // "capacity" | "mqar"
  std::optional<int64_t> setting, vocab;
  int64_t size = 0, seq_len = 0, d_model = 0, layers = 0, seed = 0, steps = 0;
  bool short_conv = false, converged = false;
  double lr = 0, train_s = 0, eval_s = 0, wall_s = 0;
  std::optional<double> loss, best_loss, accuracy, best_accuracy;
  std::string stop;
  Json curve = Json::array();  // [{step, loss, accuracy}]
  Json data = Json::object();  // the task's data facts (examples, seeds, leakage)
};

struct ResultRow {
  std::string id;
  std::string variant;
  // Where the variant comes from (plugin_source): "PATH (fnv1a64:HASH)" of the plugin that registered it, ""
  // for a built-in variant (and in rows from before plugins).
  std::string plugin;
  Json params = Json::object();
  int64_t batch = 0, heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  int64_t kv_heads = 0;    // K/V heads (= heads unless grouped-query); rows from before it read as heads
  int64_t v_head_dim = 0;  // d_v, V's and the output's width (= head_dim unless set); older rows: head_dim
  std::string mask;        // MaskAxis::label()
  std::string regime;      // Regime::label()
  int threads = 0;
  std::string isa;  // the SIMD target that ran
  double dropout = 0;
  // Storage precision of Q, K, V (`fp32`, `bf16`, `fp16`), logit bias (`none`, `alibi`) and the RoPE applied
  // to the inputs (RopeSpec::str(): `none`, `normal`, `neox,base=B`); rows from before them read as the
  // defaults.
  std::string dtype = "fp32";
  std::string bias = "none";
  std::optional<double> softcap;  // logit soft-capping C (null: none)
  bool sinks = false;             // learned sink logits, one per head
  std::string rope = "none";
  std::optional<double> rope_ms;  // median ms of applying RoPE to Q and K once (null: RoPE off, not measured)
  // {phase: median ms} of a variant that reports its phases (AttentionInputs::phase_times; dsa: indexer,
  // selection, attention) over the timed forward calls; null otherwise.
  Json phase_ms;
  // The pass timed (sweep.pass): "forward", "backward" or "forward_backward"; rows from before it read as
  // "forward".
  std::string pass = "forward";
  bool exact = false;
  std::string status = "ok";  // "ok" | "skipped" | "failed"
  std::string reason;         // why skipped or failed ("" when ok)
  TimingSummary time_ms;
  // Interference while timing (null until measured), the measurements taken (1 + re-measurements of a point
  // whose interference exceeded measure.max_interference), and whether even the cleanest stayed above it.
  std::optional<InterferenceSummary> interference;
  int attempts = 0;
  bool noisy = false;
  // The interleaved group the point was timed in (null when timed alone): the id of the group's first timed
  // point, the number of points timed together, this point's place among them and the timed rounds. Sample r
  // of every row of a group was taken in round r, so two rows' samples pair up round by round.
  using Interleave = RowInterleave;
  std::optional<Interleave> interleave;
  // Index into meta.json's "calibrations" of the calibration frac_peak (and frac_sgemm, when group_sgemm is
  // null) were divided by.
  std::optional<int64_t> calibration;
  // The sgemm timed in this row's rounds (measure.group_sgemm), null when the group ran without it: its
  // median GFLOP/s and repetitions, and the 95% interval of frac_sgemm, which is then the median over the
  // rounds of (this row's GFLOP/s / the sgemm's GFLOP/s in the same round).
  using GroupSgemm = RowGroupSgemm;
  std::optional<GroupSgemm> group_sgemm;
  // The streaming read of this point's K and V timed in its rounds (measure.group_bandwidth), null when the
  // group ran without it (a compute-bound point, a read costing over half a round, or the setting off): its
  // median GB/s, the bytes it read and its repetitions, and the 95% interval of frac_bandwidth, which is then
  // the median over the rounds of (this row's GB/s / the read's GB/s in the same round).
  using GroupBandwidth = RowGroupBandwidth;
  std::optional<GroupBandwidth> group_bandwidth;
  std::optional<double> flops, gflops, frac_sgemm, frac_peak;
  // Bytes one call moves (Attention::bytes_moved, from the sizes: set on skipped rows too), the achieved
  // bandwidth bytes / median time, and that over the streaming read of group_bandwidth when there is one,
  // else over the start-of-run memory-bandwidth calibration at the row's thread count.
  std::optional<double> bytes, gbytes_per_s, frac_bandwidth;
  // Against the fp64 reference on the inputs the kernel read (rounded to `dtype`): what the kernel loses.
  AccuracySummary accuracy;
  // Against the fp64 reference on the fp32 inputs before rounding: what a user of `dtype` loses end to end
  // (the same as `accuracy` for fp32 rows).
  AccuracySummary accuracy_e2e;
  SoftmaxDistance accuracy_vs_softmax;
  GradAccuracySummary grad_accuracy;  // backward and forward_backward rows (reference "none" otherwise)
  MemorySummary memory;
  std::optional<int64_t> nonfinite_inputs;  // NaN/Inf values in Q, K, V (null until measured)
  // Rows of attnbench_mpi's ring (absent from single-process rows): the rank count, the most K/V bytes one
  // rank sent, what rank 0 holds beyond its share (the point's whole Q, K, V and O, for the accuracy check)
  // and the per-rank report (ring.hpp rank_report).
  using Ring = RowRing;
  std::optional<Ring> ring;
  // Rows of the quality harness (absent from sweep rows): the task trained and its outcome; time_ms then
  // holds the training steps' wall times.
  using Task = RowTask;
  std::optional<Task> task;
  std::string timestamp;  // when the row was written (UTC ISO 8601)
};

// Every field is written (null until known), so readers never test for presence.
Json to_json(const ResultRow& row);
// Reads a row written by to_json (or the PyTorch peer). Throws UsageError naming `where` and the field for a
// missing required field or a wrong type; fields a row from an older attnbench lacks read as null.
ResultRow row_from_json(const Json& j, const std::string& where);

struct RowField {
  std::string path;  // "time_ms.median"
  std::string type;  // "number|null", "string", ...
  std::string unit;  // "ms", "B", "GFLOP/s", ... ("" when dimensionless or not a quantity)
  std::string meaning;
  bool ring_only = false;  // written only in attnbench_mpi's rows (ResultRow::ring)
  bool task_only = false;  // written only in the quality harness's rows (ResultRow::task)
};
// Every field of the row in the order the documentation lists them.
const std::vector<RowField>& row_fields();
// The Markdown table of row_fields() that configs/README.md holds (`attnbench info --row-fields`).
std::string row_fields_markdown();

}  // namespace attn
