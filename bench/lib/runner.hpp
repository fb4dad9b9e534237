// Stage 3 of a sweep (config -> plan -> runner -> store): measures a group of points that share one input set
// (one point when measure.interleave is off). Per point, in order: support and memory-budget check
// (skip_reason), inputs (fp32, with RoPE applied, made once per input set; rounded to the point's bf16 / fp16
// once per input set and dtype), the RoPE timing (rope_ms, once per input set, thread count and target), one
// untimed call under the resident-memory probe whose output is checked: a write outside the output
// (guarded.hpp) or NaN/Inf from finite inputs fails the point, accuracy against the fp64 exact softmax
// reference on the rounded inputs (`accuracy`) and on the fp32 ones (`accuracy_e2e`), each computed once per
// input set, bias (and dtype) and shared by every variant measured on it. Then the group's points are timed
// together in rounds (time_interleaved) under the interference probe. Also the calibration whose results are
// the rows' denominators (sgemm and the fp32 FMA peak per thread count and SIMD target, and the memory
// bandwidth per thread count).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "bench/lib/accuracy.hpp"
#include "bench/lib/calibration.hpp"
#include "bench/lib/decode_state.hpp"
#include "bench/lib/executor.hpp"
#include "bench/lib/guarded.hpp"
#include "bench/lib/inputs.hpp"
#include "bench/lib/interference.hpp"
#include "bench/lib/measure.hpp"
#include "bench/lib/plan.hpp"
#include "bench/lib/result_row.hpp"
#include "common/interface/half.hpp"
#include "common/support/tensor.hpp"

namespace attn {

// What a backward point keeps between its checked call and its timed rounds: the O and saved state of its
// training forward (the backward reads them every round; a training step rewrites them). O keeps the guards
// of the checked call (guarded.hpp).
struct TrainingState {
  GuardedArray out;
  std::vector<float> saved;
};

// The local executor: measures each group on this machine.
class PointRunner final : public Executor {
 public:
  explicit PointRunner(const SweepConfig& resolved);

  // Executor (executor.hpp).
  Json machine_facts() const override {
    return {{"memory_probe", memory_probe_supported() ? "VmHWM reset per point" : "unsupported"}};
  }
  void prepare(Json& meta, const std::function<bool()>& stop) override {
    set_calibration(calibrate(config_, meta, stop));
  }
  bool between_groups(Json& meta, int64_t rows_written, const std::function<bool()>& stop) override {
    return maybe_recalibrate(meta, rows_written, stop);
  }
  bool groups_input_sets(const SweepConfig& config) const override { return config.measure.interleave; }
  std::vector<ResultRow> measure(const std::vector<SweepPoint>& group, const std::function<bool()>& stop,
                                 bool& interrupted) override {
    return measure_group(group, stop, interrupted);
  }

  void set_calibration(Calibration calibration) { calibration_ = std::move(calibration); }
  // The point's row: status "ok", "skipped" (with the reason) or "failed" (an exception, NaN/Inf output).
  ResultRow measure(const SweepPoint& pt);
  // The rows of `group` (points sharing one input_key, in plan order), timed in interleaved rounds; rows of
  // two or more timed points name the group (ResultRow::interleave). `stop()` is asked between rounds: when
  // it turns true, `interrupted` is set and no rows are returned (none of the group is written).
  std::vector<ResultRow> measure_group(const std::vector<SweepPoint>& group,
                                       const std::function<bool()>& stop, bool& interrupted);
  bool memory_probe_supported() const { return probe_.supported(); }
  // Between points: measures the sgemm / FMA-peak calibration again when measure.calibrate_every points
  // were timed since the last one, or after interference, once a point measures clean again (at most once
  // per 5 timed points),
  // records it in meta ("calibrations") and, if it ran clean, divides the following rows by it. Returns
  // whether meta changed. `points_done` is the number of rows written so far in this run.
  bool maybe_recalibrate(Json& meta, int64_t points_done, const std::function<bool()>& stop);

 private:
  // What measuring one group accumulates: its rows, the backward points' training state, the points that go
  // on to be timed (indices into the group), the untimed calls' time (about one round's), the timing kept,
  // its interference, attempts and per-call errors, and where the group's sgemm calls are (threads -> call).
  struct GroupRun {
    std::vector<ResultRow> rows;
    std::vector<TrainingState> states;
    std::vector<std::size_t> timed;
    double round_ms = 0;
    InterleavedTiming timing;
    InterferenceSummary noise;
    int attempts = 0;
    std::vector<std::string> errors;
    std::map<int, std::size_t> sgemm_call;
    // Timed point j -> its bandwidth probe's call and the bytes that call reads (measure.group_bandwidth).
    std::map<std::size_t, std::pair<std::size_t, double>> probe_call;
    // Per timed point, the phase times (AttentionInputs::phase_times) of each forward call of the attempt
    // under way, and of the attempt kept (the one whose timing the rows report).
    std::vector<std::vector<PhaseTimes>> phases, kept_phases;
  };
  // The output every forward point of a group writes, and the gradients its backward points write (one set:
  // they share the input set, so the shapes).
  struct GroupBuffers {
    GroupBuffers(const Problem& p0, const std::vector<SweepPoint>& group,
                 const std::vector<std::size_t>& timed);
    FloatArray out, dq, dk, dv;
  };
  struct TimedCalls {
    std::vector<std::function<double()>> calls;
    std::vector<bool> followers;
    int max_threads = 1;
  };
  void check_points(const std::vector<SweepPoint>& group, GroupRun& run);
  double timed_call(const SweepPoint& pt, TrainingState& st, GroupBuffers& b, std::string& error,
                    std::vector<PhaseTimes>* phases);
  TimedCalls timed_calls(const std::vector<SweepPoint>& group, GroupRun& run, GroupBuffers& buffers);
  void add_group_bandwidth(const std::vector<SweepPoint>& group, GroupRun& run, TimedCalls& c);
  bool time_rounds(const TimedCalls& calls, GroupRun& run, const std::function<bool()>& stop);
  void fill_timed_rows(const std::vector<SweepPoint>& group, GroupRun& run, bool noisy) const;
  void prepare_inputs(const SweepPoint& pt);
  AttentionInputs inputs_for(const Problem& p) const;
  // The fp32 inputs of `p` (before any rounding to its dtype), with the g / beta and decode state it reads.
  AttentionInputs fp32_inputs_for(const Problem& p) const;
  // The untimed call: peak memory, output sanity and accuracy. The output is a GuardedArray: a write outside
  // it fails the point (before the NaN check). Backward passes run the training forward and the backward
  // (check_backward) and leave the forward's O and saved state in `state`.
  void run_and_check(const SweepPoint& pt, ResultRow& row, TrainingState& state);
  // Backward passes: the training forward, then the backward under the memory probe (from before the forward
  // for a training step), writes outside O, dQ, dK, dV, NaN/Inf from finite inputs, and the gradients against
  // the fp64 gradient of exact attention, or of the variant's own definition (grad_accuracy). Returns the
  // forward's output for the forward accuracy.
  void check_backward(const SweepPoint& pt, ResultRow& row, TrainingState& state);
  // dO of the current input set, N(0, 1) from its seed (made when a backward point first needs it).
  const FloatArray& d_out_for(const SweepPoint& pt);
  // The forward accuracy of `out` (accuracy, accuracy_e2e) against the fp64 references.
  void fill_forward_accuracy(const SweepPoint& pt, const float* out, ResultRow& row);
  void record_peak(ResultRow& row);  // the memory probe's peak into the row (or why it has none)
  // NaN/Inf in the Q, K, V the variant read (bf16 / fp16 counted as stored).
  int64_t count_nonfinite_inputs(const Problem& p, const AttentionInputs& in) const;
  // frac_sgemm from the sgemm timed in the same rounds (ResultRow::group_sgemm); after fill_timing.
  void fill_group_sgemm(const TimingStats& point, const TimingStats& sgemm, ResultRow& row) const;
  // frac_bandwidth from the streaming read of the point's K and V timed in the same rounds
  // (ResultRow::group_bandwidth); after fill_timing.
  void fill_group_bandwidth(const TimingStats& point, const TimingStats& read, double read_bytes,
                            ResultRow& row) const;
  void time_rope(const SweepPoint& pt, ResultRow& row);

  const SweepConfig& config_;
  Calibration calibration_;
  MemoryProbe probe_;
  double last_check_ms_ = 0;                 // run_and_check's call
  std::unique_ptr<SgemmBench> sgemm_bench_;  // the groups' sgemm (measure.group_sgemm), made once
  InterferenceProbe interference_probe_;
  int64_t timed_since_calibration_ = 0;    // points timed since the last calibration
  bool interference_seen_ = false;         // a point scored above measure.max_interference since then
  bool clean_after_interference_ = false;  // and a later point measured clean at its first attempt
  // Inputs and the fp64 references of the last input set: points sharing inputs are adjacent in the plan.
  PointInputs inputs_;  // fp32, RoPE applied
  std::string inputs_key_;
  std::map<DType, std::unique_ptr<StoredInputs>> stored_;  // inputs_ rounded to bf16 / fp16

  std::map<std::string, double> rope_ms_;  // "threads|isa" -> median ms, for inputs_key_
  DecodeStates decode_states_;             // recurrences' decode points: the prefill states of inputs_key_
  AccuracyReferences references_;          // the fp64 references of the current input set
  // Backward points of the current input set: dO.
  FloatArray d_out_;
  std::string d_out_key_;
};

}  // namespace attn
