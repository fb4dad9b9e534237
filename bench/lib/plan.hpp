// Stage 2 of a sweep (config -> plan -> runner -> store): a validated config becomes the list of points to
// measure. Two steps: the machine's defaults and limits are resolved first (threads, memory budget, SIMD
// targets this CPU has, `run --isa`), then the cross product of every axis is expanded (pure: the same
// resolved config gives the same points on any machine) and checked (unique ids, every point a valid
// problem). Also what every consumer of a point asks of it: its accuracy mode, sampled rows, memory need and
// skip reason, and the point as JSON (`run --dry-run --json`, `attnbench inputs`, the PyTorch peer).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/lib/config.hpp"
#include "bench/lib/result_row.hpp"
#include "common/interface/attention.hpp"

namespace attn {

// One measured point: a fully specified problem plus how its inputs are made and how many threads run it.
struct SweepPoint {
  Problem problem;
  MaskAxis mask;
  Regime regime;
  int threads = 1;
  std::string isa = "best";   // the requested SIMD target; the row records the one that ran (resolved)
  Pass pass = Pass::forward;  // what is timed (sweep.pass)
  // problem.repro() (with ",alibi" and ",dtype=bf16" when not the defaults) + pad fraction + regime (with
  // ",rope=MODE" when RoPE is on) + threads (+ ",isa=NAME" unless the requested isa is "best", so configs
  // without sweep.isa keep their ids) (+ ",pass=NAME" unless the pass is the forward): unique within a sweep
  std::string id;
  // identical for points that share the fp32 inputs (and so the fp32 reference): the dtype and the bias are
  // not in it, RoPE is
  std::string input_key;
  uint64_t input_seed = 0;  // derived from the config seed and the input key
};

// What the plan's defaults and limits read from the machine (tests pass their own).
struct Machine {
  int threads = 1;                // cores available to this process
  uint64_t physical_bytes = 0;    // 0: unknown
  std::vector<std::string> isas;  // SIMD targets this CPU supports (simd::isa_info().supported)
};
Machine this_machine();

struct Plan {
  SweepConfig config;  // resolved: threads, memory budget and targets filled in for the machine
  std::vector<SweepPoint> points;
};

// Resolves `config` for `machine` (UsageError naming the field: more threads than cores, a target this CPU
// lacks), applies `run --isa NAME` (isa_option; see apply_isa_option), expands and checks the plan.
Plan make_plan(SweepConfig config, const std::string& isa_option = "best",
               const Machine& machine = this_machine());
Plan load_plan(const std::string& path, const std::string& isa_option = "best");

// `run --isa NAME` and `attnbench_gbench --isa NAME`: every point of a config that does not set sweep.isa
// runs on NAME. A config that sets sweep.isa keeps it, and any NAME but "best" is then refused (UsageError
// naming both), since the two would contradict each other. NAME is validated like sweep.isa.
void apply_isa_option(SweepConfig& config, const std::string& name);

// The cross product of a resolved config. Points sharing inputs are adjacent so inputs and references are
// made once.
std::vector<SweepPoint> expand_plan(const SweepConfig& resolved);

// "full" | "sampled" | "none" for this problem under the config's accuracy settings.
std::string accuracy_mode(const Problem& p, const AccuracySettings& accuracy);

// Backward points' gradient reference (AccuracySettings::grad_max_work): "full", "sampled" (the blocks of
// grad_reference_blocks) or "none", and the (batch * kv_heads + K/V head) blocks it covers.
std::string grad_accuracy_mode(const Problem& p, const AccuracySettings& accuracy);
std::vector<int64_t> grad_reference_blocks(const Problem& p, const AccuracySettings& accuracy);
// The query rows the accuracy step compares (empty when the mode is "none").
std::vector<int64_t> accuracy_rows(const Problem& p, const AccuracySettings& accuracy);

struct PointMemory {
  MemoryEstimate call;  // inputs (at the storage dtype's width), output, workspace of one call
  // The accuracy step's fp64 reference rows (two for bf16 / fp16: on the rounded and on the fp32 inputs) and
  // the fp32 copy of the compared output rows.
  std::size_t reference = 0;
  std::size_t fp32_inputs = 0;  // bf16 / fp16: the fp32 Q, K, V the stored ones are rounded from (kept)
  // Backward points: the fp64 gradients of the covered blocks and the fp32 copies compared with them.
  std::size_t grad_reference = 0;
  // The inputs besides Q, K, V and the masks the point holds (PointInputs, fp32): a recurrence's g ([batch,
  // heads, seq_kv] or [.., head_dim]) and beta, the sink logits, a decode point's initial state.
  std::size_t extra_inputs = 0;
  // A recurrence's decode point: the untimed chunkwise prefill of its context that makes the state
  // (DecodeStates::prepare) holds copies of the context's K, V, g, beta, a zero Q, its output and its
  // workspace while it runs.
  std::size_t prefill = 0;
  std::size_t need() const;  // everything the point holds at once (saturating)
};
PointMemory point_memory(const SweepPoint& pt, const SweepConfig& resolved);

// Why the point is not measured ("" = it is): the variant's unsupported reasons, else the memory budget
// (with the bytes it needs). run, --dry-run, --json and gbench give the same answer, before any allocation.
std::string skip_reason(const SweepPoint& pt, const SweepConfig& resolved);

// FLOPs of one timed call of the point: the forward's count (Attention::flops), the backward's
// (Attention::backward_flops: by default the FlashAttention-2 convention, 2.5x the forward's), or their sum.
double point_flops(const SweepPoint& pt);

// Bytes one call of the point moves, as its variant counts them (Attention::bytes_moved); nullopt when the
// variant's count throws on this problem.
std::optional<double> point_bytes(const SweepPoint& pt);

}  // namespace attn
