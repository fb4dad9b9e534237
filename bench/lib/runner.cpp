// Measuring the points of a group on this machine (the local executor): inputs, the checked call, accuracy,
// the interleaved timed rounds, and the recalibration between groups (calibration.hpp).
#include "bench/lib/runner.hpp"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "bench/lib/bandwidth.hpp"
#include "bench/lib/interference.hpp"
#include "bench/lib/rows.hpp"
#include "bench/lib/sysinfo.hpp"
#include "common/interface/plugin_loader.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/simd.hpp"
#include "common/reference/reference.hpp"
#include "common/support/runtime.hpp"

namespace attn {

PointRunner::PointRunner(const SweepConfig& config) : config_(config), references_(config.accuracy) {}

bool PointRunner::maybe_recalibrate(Json& meta, int64_t points_done, const std::function<bool()>& stop) {
  const int every = config_.measure.calibrate_every;
  const bool cadence = every > 0 && timed_since_calibration_ >= every;
  // After interference: once the machine is clean again (a point measured clean at its first attempt), so
  // the calibration does not itself run under the disturbance, and at most once per 5 timed points (each
  // calibration takes seconds).
  const bool disturbed = clean_after_interference_ && timed_since_calibration_ >= 5;
  if ((!cadence && !disturbed) || stop()) return false;
  const ComputeCalibration c = measure_compute_calibration(config_, stop, false);
  if (stop()) return false;  // interrupted midway: incomplete, not recorded
  const bool clean = c.interference.score <= config_.measure.max_interference;
  record_calibration(meta, c, cadence ? "cadence" : "interference", points_done, clean);
  timed_since_calibration_ = 0;
  interference_seen_ = clean_after_interference_ = false;
  std::cout << "attnbench: calibration " << meta["calibrations"].size() - 1 << " ("
            << (cadence ? "every " + std::to_string(every) + " points" : std::string("after interference"))
            << "): sgemm";
  for (const auto& [t, g] : c.sgemm_gflops)
    std::cout << " " << t << "T " << std::fixed << std::setprecision(1) << g << std::defaultfloat;
  std::cout << " GFLOP/s" << (clean ? "" : "; ran under interference, not used") << "\n" << std::flush;
  if (clean) {
    calibration_.sgemm_gflops = c.sgemm_gflops;
    calibration_.fma_gflops = c.fma_gflops;
    calibration_.index = static_cast<int64_t>(meta["calibrations"].size()) - 1;
  }
  return true;
}

namespace {

// NaN/Inf among n 16-bit values of storage type t (an all-ones exponent).
int64_t count_nonfinite16(DType t, const uint16_t* x, std::size_t n) {
  const uint16_t exp = t == DType::bf16 ? 0x7f80u : 0x7c00u;
  int64_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += (x[i] & exp) == exp;
  return bad;
}

// The median milliseconds of each phase over a point's timed forward calls ({name: ms}), null when its
// variant reports no phases.
Json phase_medians_ms(const std::vector<PhaseTimes>& samples) {
  if (samples.empty()) return nullptr;
  Json out = Json::object();
  for (int i = 0; i < samples[0].count; ++i) {
    std::vector<double> ms;
    for (const PhaseTimes& s : samples)
      for (int k = 0; k < s.count; ++k)
        if (std::string_view(s.names[k]) == samples[0].names[i]) ms.push_back(1e3 * s.seconds[k]);
    std::nth_element(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(ms.size() / 2), ms.end());
    out[samples[0].names[i]] = ms[ms.size() / 2];
  }
  return out;
}

}  // namespace

ResultRow PointRunner::measure(const SweepPoint& pt) {
  bool interrupted = false;
  std::vector<ResultRow> rows = measure_group({pt}, nullptr, interrupted);
  return std::move(rows.at(0));
}

void PointRunner::prepare_inputs(const SweepPoint& pt) {
  if (inputs_key_ != pt.input_key) {
    // The old inputs (and their rounded copies) go before the new ones are made.
    stored_.clear();
    inputs_ = PointInputs();
    inputs_key_.clear();
    rope_ms_.clear();
    decode_states_.clear();
    inputs_ = make_inputs(pt);
    inputs_key_ = pt.input_key;
  }
  fill_recurrence_inputs(pt, inputs_);  // g / beta in the shape this point's variant reads
  // A recurrence's decode point: its state, by a chunkwise prefill of the context (untimed;
  // decode_state.hpp).
  decode_states_.prepare(pt, fp32_inputs_for(pt.problem));
  const DType t = pt.problem.dtype;
  if (t != DType::fp32 && !stored_.count(t))
    stored_[t] = std::make_unique<StoredInputs>(pt.problem, inputs_.view(pt.problem, nullptr));
}

AttentionInputs PointRunner::inputs_for(const Problem& p) const {
  AttentionInputs in = p.dtype == DType::fp32 ? inputs_.view(p, nullptr) : stored_.at(p.dtype)->get();
  // The gate this variant reads (scalar or per channel), and beta as drawn now (the rounded copies were made
  // at their first point).
  in.g = inputs_.gate_for(p);
  in.beta = inputs_.beta.numel() ? inputs_.beta.ptr() : nullptr;
  in.index_q = inputs_.index_q.numel() ? inputs_.index_q.ptr() : nullptr;
  in.index_k = inputs_.index_k.numel() ? inputs_.index_k.ptr() : nullptr;
  in.index_w = inputs_.index_w.numel() ? inputs_.index_w.ptr() : nullptr;
  in.initial_state = decode_states_.state_for(p);
  return in;
}

AttentionInputs PointRunner::fp32_inputs_for(const Problem& p) const {
  AttentionInputs in = inputs_.view(p, nullptr);
  in.initial_state = decode_states_.state_for(p);
  return in;
}

std::vector<ResultRow> PointRunner::measure_group(const std::vector<SweepPoint>& group,
                                                  const std::function<bool()>& stop, bool& interrupted) {
  interrupted = false;
  GroupRun run;
  run.rows.resize(group.size());
  run.states.resize(group.size());
  check_points(group, run);
  if (run.timed.empty()) return std::move(run.rows);
  try {
    GroupBuffers buffers(group[run.timed[0]].problem, group, run.timed);
    const TimedCalls calls = timed_calls(group, run, buffers);
    if (!time_rounds(calls, run, stop)) {
      interrupted = true;
      return {};
    }
  } catch (const std::bad_alloc&) {
    for (std::string& e : run.errors) e = "out of memory (std::bad_alloc)";
  }
  timed_since_calibration_ += static_cast<int64_t>(run.timed.size());
  const bool noisy = run.noise.score > config_.measure.max_interference;
  if (noisy || run.attempts > 1)
    interference_seen_ = true;
  else if (interference_seen_)
    clean_after_interference_ = true;  // the episode is over: calibrate before the next point
  fill_timed_rows(group, run, noisy);
  return std::move(run.rows);
}

// Stage 1, per point in plan order: support and budget, inputs, RoPE timing, and one untimed call whose
// output is checked (NaN/Inf, accuracy) and whose resident-memory high-water mark is the row's peak.
void PointRunner::check_points(const std::vector<SweepPoint>& group, GroupRun& run) {
  {
    // Rounded copies only for the dtypes of this group (the others' memory goes first).
    std::set<DType> dtypes;
    for (const SweepPoint& pt : group) dtypes.insert(pt.problem.dtype);
    std::erase_if(stored_, [&](const auto& kv) { return !dtypes.count(kv.first); });
  }
  for (std::size_t i = 0; i < group.size(); ++i) {
    const SweepPoint& pt = group[i];
    const simd::ScopedIsa isa_scope(pt.isa, "sweep.isa");  // the plan checked it
    ResultRow& row = run.rows[i];
    row = base_row(pt, config_, simd::active_isa());
    row.plugin = plugin_source(pt.problem.variant);
    if (std::string why = skip_reason(pt, config_); !why.empty()) {
      row.status = "skipped";
      row.reason = std::move(why);
      row.memory.peak_note = "not measured: the point was skipped";
      continue;
    }
    try {
      prepare_inputs(pt);
      time_rope(pt, row);
      run_and_check(pt, row, run.states[i]);
      if (row.status == "ok") {
        run.timed.push_back(i);
        run.round_ms += last_check_ms_;
      }
    } catch (const std::bad_alloc&) {
      row.status = "failed";
      row.reason = "out of memory (std::bad_alloc)";
    } catch (const std::exception& e) {
      row.status = "failed";
      row.reason = e.what();
    }
    if (!row.memory.peak_bytes && row.memory.peak_note.empty())
      row.memory.peak_note = "not measured: the point failed before it was timed";
  }
  run.errors.assign(run.timed.size(), "");
  run.phases.assign(run.timed.size(), {});
}

PointRunner::GroupBuffers::GroupBuffers(const Problem& p0, const std::vector<SweepPoint>& group,
                                        const std::vector<std::size_t>& timed)
    : out({p0.batch, p0.heads, p0.seq_q, p0.value_dim()}) {
  for (std::size_t j : timed)
    if (group[j].pass != Pass::forward) {
      dq = FloatArray({p0.batch, p0.heads, p0.seq_q, p0.head_dim});
      dk = FloatArray({p0.batch, p0.num_kv_heads(), p0.seq_kv, p0.head_dim});
      dv = FloatArray({p0.batch, p0.num_kv_heads(), p0.seq_kv, p0.value_dim()});
      return;
    }
}

// One timed call of a point: its pass on the group's buffers (forward points write the shared O; backward
// points read their own training forward's O and state and write the shared gradients). Returns the
// milliseconds, or -1 with the error kept.
double PointRunner::timed_call(const SweepPoint& pt, TrainingState& st, GroupBuffers& b, std::string& error,
                               std::vector<PhaseTimes>* phases) {
  const simd::ScopedIsa isa_scope(pt.isa, "sweep.isa");
  const Attention& variant = Registry::instance().get(pt.problem.variant);
  AttentionInputs in = inputs_for(pt.problem);
  GradientArgs g;
  if (pt.pass == Pass::forward) {
    in.out = b.out.ptr();
  } else {
    in.out = st.out.ptr();
    g.out = st.out.ptr();
    g.saved = st.saved.empty() ? nullptr : st.saved.data();
    g.d_out = d_out_.ptr();
    g.dq = b.dq.ptr(), g.dk = b.dk.ptr(), g.dv = b.dv.ptr();
  }
  ThreadScope scope(pt.threads);
  PhaseTimes phase_times;  // a forward call's phases, for a variant that reports them
  if (pt.pass == Pass::forward) in.phase_times = &phase_times;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    switch (pt.pass) {
      case Pass::forward:
        variant.run(pt.problem, in);
        if (phase_times.count > 0) phases->push_back(phase_times);
        break;
      case Pass::backward:
        variant.run_backward(pt.problem, in, g);
        break;
      case Pass::forward_backward:
        variant.run_saving(pt.problem, in, st.saved.empty() ? nullptr : st.saved.data());
        variant.run_backward(pt.problem, in, g);
        break;
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  } catch (const std::exception& e) {
    error = e.what();
    return -1;
  }
}

// The group's calls: one per timed point, then the calibration's sgemm, one call per thread count, as a
// follower (it never keeps the rounds going), when its calls cost at most half a round (estimated from the
// calibration): the rows divide by the sgemm timed beside them, so frac_sgemm follows the machine's speed
// while they ran.
PointRunner::TimedCalls PointRunner::timed_calls(const std::vector<SweepPoint>& group, GroupRun& run,
                                                 GroupBuffers& buffers) {
  TimedCalls c;
  for (std::size_t j = 0; j < run.timed.size(); ++j) {
    const SweepPoint& pt = group[run.timed[j]];
    TrainingState& st = run.states[run.timed[j]];
    c.max_threads = std::max(c.max_threads, pt.threads);
    c.calls.push_back([this, &pt, &st, &buffers, &run, j] {
      return timed_call(pt, st, buffers, run.errors[j], &run.phases[j]);
    });
  }
  c.followers.assign(c.calls.size(), false);
  add_group_bandwidth(group, run, c);
  if (!config_.measure.group_sgemm) return c;
  std::set<int> threads;
  for (std::size_t j : run.timed) threads.insert(group[j].threads);
  const double flops = SgemmBench::flops_of(kCalibrationSgemmSize);
  double sgemm_ms = 0;
  for (int th : threads) {
    const auto it = calibration_.sgemm_gflops.find(th);
    sgemm_ms += it != calibration_.sgemm_gflops.end() && it->second > 0
                    ? flops / (it->second * 1e6)
                    : std::numeric_limits<double>::infinity();
  }
  if (2 * sgemm_ms > run.round_ms) return c;
  if (!sgemm_bench_) sgemm_bench_ = std::make_unique<SgemmBench>(kCalibrationSgemmSize);
  for (int th : threads) {
    run.sgemm_call[th] = c.calls.size();
    c.calls.push_back([this, th] { return sgemm_bench_->call_ms(th); });
    c.followers.push_back(true);
  }
  return c;
}

// The group bandwidth probes (measure.group_bandwidth): per timed forward point left of the calibration's
// ridge (flops / bytes below FMA peak / bandwidth at its threads; 16 times that for 16-bit K/V) whose K and
// V are between half and twice
// the bytes it moves, a streaming read of that K and V as stored, on its thread count, as a follower; when
// its estimated time (those bytes at the calibration's bandwidth) is at most twice a round. Points reading
// the same K/V at the same thread count share one read.
void PointRunner::add_group_bandwidth(const std::vector<SweepPoint>& group, GroupRun& run, TimedCalls& c) {
  if (!config_.measure.group_bandwidth) return;
  std::map<std::tuple<const void*, const void*, int>, std::size_t> shared;
  for (std::size_t j = 0; j < run.timed.size(); ++j) {
    const SweepPoint& pt = group[run.timed[j]];
    if (pt.pass != Pass::forward) continue;
    const auto bw = calibration_.bandwidth_gbytes_per_s.find(pt.threads);
    const auto peak = calibration_.fma_gflops.find({pt.threads, run.rows[run.timed[j]].isa});
    const std::optional<double> bytes = point_bytes(pt);
    if (bw == calibration_.bandwidth_gbytes_per_s.end() || bw->second <= 0 ||
        peak == calibration_.fma_gflops.end() || peak->second <= 0 || !bytes || *bytes <= 0)
      continue;
    const Problem& p = pt.problem;
    // Compute-bound right of the ridge. 16-bit K/V may run on a matrix engine far faster than the fp32 FMA
    // (tiled's AMX-BF16 tiles: 1.77 TFLOP/s per core against the FMA's ~155 GFLOP/s on an Intel Xeon), so
    // their ridge moves kMatrixEngineRidge times right: such a point's read still costs at most what the
    // point does, and at least 1/16 of it.
    constexpr double kMatrixEngineRidge = 16;
    const double ridge = peak->second / bw->second * (p.dtype == DType::fp32 ? 1 : kMatrixEngineRidge);
    if (point_flops(pt) / *bytes >= ridge) continue;
    const AttentionInputs in = inputs_for(p);
    const bool wide = p.dtype == DType::fp32;
    const std::size_t elt = wide ? sizeof(float) : sizeof(uint16_t);
    const void* k = wide ? static_cast<const void*>(in.k) : static_cast<const void*>(in.k16);
    const void* v = wide ? static_cast<const void*>(in.v) : static_cast<const void*>(in.v16);
    if (!k || !v) continue;
    std::vector<ByteSpan> spans{{k, static_cast<std::size_t>(p.kv_elements()) * elt}};
    if (v != k) spans.push_back({v, static_cast<std::size_t>(p.v_elements()) * elt});
    double read = 0;
    for (const ByteSpan& s : spans) read += static_cast<double>(s.bytes);
    // Only where K and V are most of what the call moves (not a recurrence's decode, which reads its state).
    if (read < 0.5 * *bytes || read > 2 * *bytes) continue;
    // A memory-bound point's read costs about what the point does; one costing over twice the group's calls
    // (a recurrence's decode, or a calibration far off) is left out.
    if (read / (bw->second * 1e6) > 2 * run.round_ms) continue;
    const auto key = std::make_tuple(k, v, pt.threads);
    if (const auto it = shared.find(key); it != shared.end()) {
      run.probe_call[j] = {it->second, read};
      continue;
    }
    shared[key] = c.calls.size();
    run.probe_call[j] = {c.calls.size(), read};
    const int threads = pt.threads;
    c.calls.push_back([spans, threads] {
      const ThreadScope scope(threads);
      return time_stream_read_ms(spans, threads);
    });
    c.followers.push_back(true);
  }
}

// Stage 2: the timed rounds (time_interleaved) under the interference probe. A score above the threshold is
// measured again, after a pause that lets a short burst pass, up to max_remeasure times; the cleanest is
// kept. False when `stop()` interrupted them.
bool PointRunner::time_rounds(const TimedCalls& calls, GroupRun& run, const std::function<bool()>& stop) {
  const MeasureSettings& m = config_.measure;
  double last_window_s = 0;
  for (int attempt = 1; attempt <= 1 + m.max_remeasure; ++attempt) {
    // The pause: twice the last attempt's window (a burst as long as the points passes), at least 10 ms
    // and at most 0.25 s per attempt so far.
    if (attempt > 1)
      std::this_thread::sleep_for(
          std::chrono::duration<double>(std::clamp(2 * last_window_s, 0.01, 0.25 * (attempt - 1))));
    interference_probe_.start();
    for (auto& p : run.phases) p.clear();
    InterleavedTiming ti = time_interleaved(calls.calls, m, stop, calls.followers);
    const InterferenceSummary ni = interference_probe_.stop(calls.max_threads);
    if (ti.interrupted) return false;
    last_window_s = ni.window_s;
    run.attempts = attempt;
    if (attempt == 1 || ni.score < run.noise.score)
      run.timing = std::move(ti), run.noise = ni, run.kept_phases = run.phases;
    if (ni.score <= m.max_interference) break;
  }
  return true;
}

// Stage 3: the rows' timings, the interleaving and the fractions of the calibration.
void PointRunner::fill_timed_rows(const std::vector<SweepPoint>& group, GroupRun& run, bool noisy) const {
  const InterleavedTiming& t = run.timing;
  for (std::size_t j = 0; j < run.timed.size(); ++j) {
    const SweepPoint& pt = group[run.timed[j]];
    ResultRow& row = run.rows[run.timed[j]];
    if (!run.errors[j].empty() || j >= t.stats.size() || t.failed[j]) {
      row.status = "failed";
      row.reason = run.errors[j].empty() ? "the timed calls failed" : run.errors[j];
      continue;
    }
    row.attempts = run.attempts;
    row.interference = run.noise;
    row.noisy = noisy;
    if (run.timed.size() > 1)
      row.interleave = ResultRow::Interleave{group[run.timed[0]].id, static_cast<int>(run.timed.size()),
                                             static_cast<int>(j), t.rounds};
    fill_timing(row, t.stats[j], point_flops(pt), &calibration_);
    if (j < run.kept_phases.size()) row.phase_ms = phase_medians_ms(run.kept_phases[j]);
    if (const auto it = run.sgemm_call.find(pt.threads);
        it != run.sgemm_call.end() && it->second < t.stats.size() && !t.stats[it->second].samples_ms.empty())
      fill_group_sgemm(t.stats[j], t.stats[it->second], row);
    if (const auto it = run.probe_call.find(j); it != run.probe_call.end() &&
                                                it->second.first < t.stats.size() &&
                                                !t.stats[it->second.first].samples_ms.empty())
      fill_group_bandwidth(t.stats[j], t.stats[it->second.first], it->second.second, row);
  }
}

namespace {
// The per-round ratio of two rates in one group, (amount / the point's time) / (follower_amount / the
// follower's time), summarised as the timings are (median and interval): sample r of every call of a group
// was taken in round r, so the ratio pairs the rounds both took part in. Empty when they share none.
std::optional<TimingStats> paired_rate_ratio(const TimingStats& point, double amount,
                                             const TimingStats& follower, double follower_amount) {
  std::vector<double> ratios;
  for (std::size_t r = 0; r < std::min(point.samples_ms.size(), follower.samples_ms.size()); ++r)
    ratios.push_back((amount / point.samples_ms[r]) / (follower_amount / follower.samples_ms[r]));
  if (ratios.empty()) return std::nullopt;
  return summarize(ratios);
}
}  // namespace

void PointRunner::fill_group_bandwidth(const TimingStats& point, const TimingStats& read, double read_bytes,
                                       ResultRow& row) const {
  if (!row.bytes || *row.bytes <= 0) return;
  const std::optional<TimingStats> f = paired_rate_ratio(point, *row.bytes, read, read_bytes);
  if (!f) return;
  ResultRow::GroupBandwidth g;
  g.gbytes_per_s = read_bytes / (read.median_ms * 1e6);
  g.bytes = read_bytes;
  g.reps = read.reps;
  if (f->ci.ok) g.frac_ci_lo = f->ci.lo, g.frac_ci_hi = f->ci.hi;
  row.group_bandwidth = g;
  row.frac_bandwidth = f->median_ms;
}

void PointRunner::fill_group_sgemm(const TimingStats& point, const TimingStats& sgemm, ResultRow& row) const {
  const double sgemm_flops = SgemmBench::flops_of(kCalibrationSgemmSize);
  const std::optional<TimingStats> f = paired_rate_ratio(point, *row.flops, sgemm, sgemm_flops);
  if (!f) return;
  ResultRow::GroupSgemm g;
  g.gflops = sgemm_flops / (sgemm.median_ms * 1e6);
  g.reps = sgemm.reps;
  if (f->ci.ok) g.frac_ci_lo = f->ci.lo, g.frac_ci_hi = f->ci.hi;
  row.group_sgemm = g;
  row.frac_sgemm = f->median_ms;
}

// RoPE on copies of Q and K (the inputs are rotated once already; rotating a copy again costs the same), with
// the point's measure settings and threads, before the variant's output and workspace exist.
void PointRunner::time_rope(const SweepPoint& pt, ResultRow& row) {
  if (!pt.regime.rope.on()) return;
  const std::string key = std::to_string(pt.threads) + "|" + row.isa;
  if (const auto it = rope_ms_.find(key); it != rope_ms_.end()) {
    row.rope_ms = it->second;
    return;
  }
  FloatArray q = inputs_.q, k = inputs_.k;
  ThreadScope scope(pt.threads);
  const TimingStats t = time_repeated([&] { apply_point_rope(pt, q.ptr(), k.ptr()); }, config_.measure);
  rope_ms_[key] = t.median_ms;
  row.rope_ms = t.median_ms;
}

void PointRunner::run_and_check(const SweepPoint& pt, ResultRow& row, TrainingState& state) {
  const Problem& p = pt.problem;
  if (pt.pass != Pass::forward) {
    check_backward(pt, row, state);
    if (row.status == "ok") fill_forward_accuracy(pt, state.out.ptr(), row);
    return;
  }
  const Attention& variant = Registry::instance().get(p.variant);
  // What the variant reads: the fp32 inputs, or their bf16 / fp16 rounding.
  AttentionInputs in = inputs_for(p);
  probe_.reset();
  GuardedArray out("O", static_cast<std::size_t>(p.out_elements()));  // the query heads, d_v wide
  in.out = out.ptr();
  {
    ThreadScope scope(pt.threads);
    const auto t0 = std::chrono::steady_clock::now();
    variant.run(p, in);
    last_check_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  record_peak(row);
  const int64_t bad_in = count_nonfinite_inputs(p, in);
  const int64_t bad_out = count_nonfinite(out.ptr(), out.numel());
  row.nonfinite_inputs = bad_in;
  // A write outside the output fails the point (whatever else it computed), then NaN: it never leaks
  // silently, non-finite output from finite inputs fails the point.
  if (std::string outside = outside_writes({&out}); !outside.empty()) {
    row.status = "failed";
    row.reason = std::move(outside);
  } else if (bad_out && !bad_in) {
    row.status = "failed";
    row.reason = std::to_string(bad_out) + " NaN/Inf values in the output from finite inputs";
  }
  fill_forward_accuracy(pt, out.ptr(), row);
}

void PointRunner::fill_forward_accuracy(const SweepPoint& pt, const float* out, ResultRow& row) {
  references_.fill_forward(pt, fp32_inputs_for(pt.problem), inputs_for(pt.problem), out, row);
}

const FloatArray& PointRunner::d_out_for(const SweepPoint& pt) {
  if (d_out_key_ != pt.input_key) {
    d_out_ = FloatArray();
    d_out_ = make_d_out(pt);
    d_out_key_ = pt.input_key;
  }
  return d_out_;
}

void PointRunner::check_backward(const SweepPoint& pt, ResultRow& row, TrainingState& state) {
  const Problem& p = pt.problem;
  const Attention& variant = Registry::instance().get(p.variant);
  AttentionInputs in = inputs_for(p);
  const FloatArray& d_out = d_out_for(pt);
  // A training step's peak covers both passes (its O and saved state are allocated under the probe);
  // the backward's starts once the forward's state exists.
  if (pt.pass == Pass::forward_backward) probe_.reset();
  state.out = GuardedArray("O", static_cast<std::size_t>(p.out_elements()));
  state.saved.assign(variant.saved_floats(p), 0.0f);
  in.out = state.out.ptr();
  double forward_ms = 0;
  {
    ThreadScope scope(pt.threads);
    const auto t0 = std::chrono::steady_clock::now();
    variant.run_saving(p, in, state.saved.empty() ? nullptr : state.saved.data());
    forward_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  if (pt.pass == Pass::backward) probe_.reset();
  GuardedArray dq("dQ", static_cast<std::size_t>(p.q_elements())),
      dk("dK", static_cast<std::size_t>(p.kv_elements())), dv("dV", static_cast<std::size_t>(p.v_elements()));
  GradientArgs g;
  g.out = state.out.ptr();
  g.saved = state.saved.empty() ? nullptr : state.saved.data();
  g.d_out = d_out.ptr();
  g.dq = dq.ptr(), g.dk = dk.ptr(), g.dv = dv.ptr();
  {
    ThreadScope scope(pt.threads);
    const auto t0 = std::chrono::steady_clock::now();
    variant.run_backward(p, in, g);
    const double backward_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    last_check_ms_ = backward_ms + (pt.pass == Pass::forward_backward ? forward_ms : 0.0);
  }
  record_peak(row);
  const int64_t bad_in = count_nonfinite_inputs(p, in);
  row.nonfinite_inputs = bad_in;
  // A write outside O or a gradient fails the point, before NaN is looked for.
  if (std::string outside = outside_writes({&state.out, &dq, &dk, &dv}); !outside.empty()) {
    row.status = "failed";
    row.reason = std::move(outside);
    return;
  }
  // NaN never leaks silently: non-finite O or gradients from finite inputs (and dO, always finite) fail it.
  const int64_t bad_out = count_nonfinite(state.out.ptr(), state.out.numel()) +
                          count_nonfinite(dq.ptr(), dq.numel()) + count_nonfinite(dk.ptr(), dk.numel()) +
                          count_nonfinite(dv.ptr(), dv.numel());
  if (bad_out && !bad_in) {
    row.status = "failed";
    row.reason = std::to_string(bad_out) + " NaN/Inf values in O, dQ, dK or dV from finite inputs";
    return;
  }
  // The gradients against the fp64 gradient on the inputs the kernel read (with the g, beta and state it
  // read): exact attention's, or the variant's own definition's (accuracy.hpp).
  references_.fill_backward(pt, in, d_out.ptr(), dq.ptr(), dk.ptr(), dv.ptr(), row);
}

void PointRunner::record_peak(ResultRow& row) {
  const int64_t peak = probe_.peak_increase();
  if (peak >= 0)
    row.memory.peak_bytes = peak;
  else
    row.memory.peak_note =
        "not measured: this kernel refused the resident high-water-mark reset "
        "(writing 5 to /proc/self/clear_refs), so a peak would include earlier points";
}

int64_t PointRunner::count_nonfinite_inputs(const Problem& p, const AttentionInputs& in) const {
  // The inputs counted are the ones the variant read (fp16 rounds fp32 values beyond 65504 to Inf).
  if (p.dtype == DType::fp32)
    return count_nonfinite(inputs_.q.ptr(), inputs_.q.numel()) +
           count_nonfinite(inputs_.k.ptr(), inputs_.k.numel()) +
           count_nonfinite(inputs_.v.ptr(), inputs_.v.numel());
  return count_nonfinite16(p.dtype, in.q16, inputs_.q.numel()) +
         count_nonfinite16(p.dtype, in.k16, inputs_.k.numel()) +
         count_nonfinite16(p.dtype, in.v16, inputs_.v.numel());
}

}  // namespace attn
