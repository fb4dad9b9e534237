// Measuring one sweep point, and the calibration that gives its row the sgemm and FMA-peak denominators.
#include "bench/lib/runner.hpp"

#include <iomanip>
#include <iostream>
#include <memory>

#include "bench/lib/bandwidth.hpp"
#include "bench/lib/sysinfo.hpp"
#include "common/reference.hpp"
#include "common/runtime.hpp"
#include "common/simd.hpp"
#include "common/util.hpp"

namespace attn {

namespace {

// The bandwidth ceiling next to the compute ones, per thread count: meta["memory_bandwidth"] is
// {"<threads>": {"gbytes_per_s": best, "median": ..., "buffer_bytes": ..., "reps": ..., "isa": ...}}. One
// buffer (allocated and page-touched once, freed before the first point) serves every thread count.
void calibrate_memory_bandwidth(const SweepConfig& config, Json& meta, const std::function<bool()>& stop,
                                Calibration& cal) {
  Json bw = meta.value("memory_bandwidth", Json::object());
  if (!bw.is_object()) bw = Json::object();
  for (auto it = bw.begin(); it != bw.end(); ++it)  // resumed: keep the denominators of the rows written
    if (it.value().is_object() && it.value().contains("gbytes_per_s") &&
        it.value()["gbytes_per_s"].is_number())
      cal.bandwidth_gbytes_per_s[std::stoi(it.key())] = it.value()["gbytes_per_s"].get<double>();
  std::unique_ptr<BandwidthBuffer> buffer;
  for (int t : config.threads) {
    if (cal.bandwidth_gbytes_per_s.count(t) || stop()) continue;
    const simd::ScopedIsa scope("best", "sweep.isa");  // the widest loads this CPU has
    if (!buffer) buffer = std::make_unique<BandwidthBuffer>();
    const BandwidthCalibration c = calibrate_bandwidth(t, *buffer);
    cal.bandwidth_gbytes_per_s[t] = c.gbytes_per_s;
    bw[std::to_string(t)] = {{"gbytes_per_s", c.gbytes_per_s},
                             {"median", c.median_gbytes_per_s},
                             {"buffer_bytes", c.buffer_bytes},
                             {"reps", c.reps},
                             {"isa", simd::active_isa()}};
    std::cout << "attnbench: memory bandwidth (streaming read of "
              << format_bytes(static_cast<double>(c.buffer_bytes)) << "), " << t
              << " thread(s): " << std::fixed << std::setprecision(1) << c.gbytes_per_s << " GB/s (median "
              << c.median_gbytes_per_s << ")\n"
              << std::defaultfloat;
  }
  meta["memory_bandwidth"] = bw;
}

}  // namespace

Calibration calibrate(const SweepConfig& config, Json& meta, const std::function<bool()>& stop) {
  Calibration cal;
  for (const auto& c : meta.value("sgemm_calibration", Json::array()))      // resumed: keep the denominators
    cal.sgemm_gflops[c["threads"].get<int>()] = c["gflops"].get<double>();  // of the rows already written
  Json sgemm = meta.value("sgemm_calibration", Json::array());
  if (const std::string note = blas_kernel_note(); !note.empty()) {
    std::cout << "attnbench: note: " << note << "\n";
    meta["blas_note"] = note;
  }
  for (int t : config.threads) {
    if (cal.sgemm_gflops.count(t) || stop()) continue;
    const SgemmCalibration c = calibrate_sgemm(t);
    cal.sgemm_gflops[t] = c.gflops;
    sgemm.push_back({{"threads", t},
                     {"size", c.size},
                     {"gflops", c.gflops},
                     {"median_ms", c.timing.median_ms},
                     {"cv", c.timing.cv}});
    std::cout << "attnbench: sgemm calibration, " << t << " thread(s), " << c.size << "^3: " << std::fixed
              << std::setprecision(1) << c.gflops << " GFLOP/s\n"
              << std::defaultfloat;
  }
  // The hardware bound next to the BLAS one (sgemm depends on which kernels the installed BLAS picks), per
  // thread count and SIMD target: the best target (the bound sgemm is checked against) and every target the
  // points run on, each measured under its own selection. Targets are keyed by the name that ran, so "best"
  // and the name it resolves to are measured once.
  Json peaks = meta.value("fma_peak", Json::array());
  for (const auto& c : peaks)  // resumed: keep the denominators of the rows already written
    if (c.contains("isa") && c["isa"].is_string())
      cal.fma_gflops[{c["threads"].get<int>(), c["isa"].get<std::string>()}] = c["gflops"].get<double>();
  std::vector<std::string> requested{"best"};
  for (const std::string& name : config.isas)
    if (std::find(requested.begin(), requested.end(), name) == requested.end()) requested.push_back(name);
  std::string best;
  for (int t : config.threads)
    for (const std::string& name : requested) {
      if (stop()) break;
      const simd::ScopedIsa scope(name, "sweep.isa");
      const std::string isa = simd::active_isa();
      if (name == "best") best = isa;
      if (cal.fma_gflops.count({t, isa})) continue;
      const FmaPeak c = calibrate_fma_peak(t);
      cal.fma_gflops[{t, c.isa}] = c.gflops;
      peaks.push_back({{"threads", t}, {"isa", c.isa}, {"gflops", c.gflops}, {"lanes", c.lanes}});
      std::cout << "attnbench: fp32 FMA peak (" << c.isa << ", " << c.lanes << " lanes), " << t
                << " thread(s): " << std::fixed << std::setprecision(1) << c.gflops << " GFLOP/s\n"
                << std::defaultfloat;
    }
  // sgemm is fp32 FMAs on the same cores: above the best target's peak, the probe is wrong.
  for (int t : config.threads) {
    const auto s = cal.sgemm_gflops.find(t);
    const auto p = cal.fma_gflops.find({t, best});
    if (s != cal.sgemm_gflops.end() && p != cal.fma_gflops.end() && s->second > p->second)
      std::cerr << "attnbench: warning: the sgemm calibration at " << t << " thread(s) (" << std::fixed
                << std::setprecision(1) << s->second << " GFLOP/s) exceeds the fp32 FMA peak of the best "
                << "SIMD target " << best << " (" << p->second
                << " GFLOP/s): the FMA-peak probe is wrong, and frac_peak with it\n"
                << std::defaultfloat;
  }
  meta["sgemm_calibration"] = sgemm;
  meta["fma_peak"] = peaks;
  calibrate_memory_bandwidth(config, meta, stop, cal);
  return cal;
}

PointRunner::PointRunner(const SweepConfig& config) : config_(config) {}

namespace {

// NaN/Inf among n 16-bit values of storage type t (an all-ones exponent).
int64_t count_nonfinite16(DType t, const uint16_t* x, std::size_t n) {
  const uint16_t exp = t == DType::bf16 ? 0x7f80u : 0x7c00u;
  int64_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += (x[i] & exp) == exp;
  return bad;
}

void fill_accuracy(AccuracySummary& a, const ErrorMetrics& m, int64_t rows) {
  a.rows = rows;
  a.max_abs_err = m.max_abs_err;
  a.rel_l2_err = m.rel_l2_err;
  a.mean_cosine = m.mean_cosine;
  a.nan_count = m.nan_count;
  a.inf_count = m.inf_count;
}

}  // namespace

ResultRow PointRunner::measure(const SweepPoint& pt) {
  const Problem& p = pt.problem;
  const Attention& variant = Registry::instance().get(p.variant);
  // Every kernel of the point (inputs, timed calls) runs on the point's target; the plan checked it.
  const simd::ScopedIsa isa_scope(pt.isa, "sweep.isa");
  ResultRow row = base_row(pt, config_, simd::active_isa());
  if (std::string why = skip_reason(pt, config_); !why.empty()) {
    row.status = "skipped";
    row.reason = std::move(why);
    return row;
  }
  try {
    if (inputs_key_ != pt.input_key) {
      // The old inputs (and their rounded copy) go before the new ones are made.
      stored_.reset();
      inputs_ = PointInputs();
      inputs_key_.clear();
      rope_ms_.clear();
      inputs_ = make_inputs(pt);
      inputs_key_ = pt.input_key;
    }
    if (p.dtype == DType::fp32) {
      stored_.reset();
    } else if (!stored_ || stored_dtype_ != p.dtype) {
      stored_.reset();
      stored_ = std::make_unique<StoredInputs>(p, inputs_.view(nullptr));
      stored_dtype_ = p.dtype;
    }
    time_rope(pt, row);
    time_and_compare(pt, variant, row);
  } catch (const std::bad_alloc&) {
    row.status = "failed";
    row.reason = "out of memory (std::bad_alloc)";
  } catch (const std::exception& e) {
    row.status = "failed";
    row.reason = e.what();
  }
  return row;
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

void PointRunner::reference_for(const Problem& p, const AttentionInputs& in, const std::string& mode,
                                const std::string& key, std::string& have_key, DoubleArray& ref) {
  if (have_key == key) return;
  have_key.clear();
  ref = DoubleArray();
  ref = DoubleArray({p.batch, p.heads, static_cast<int64_t>(reference_rows_.size()), p.head_dim});
  reference_attention(p, in, ref.ptr(), mode == "full" ? nullptr : &reference_rows_);
  have_key = key;
}

void PointRunner::time_and_compare(const SweepPoint& pt, const Attention& variant, ResultRow& row) {
  const Problem& p = pt.problem;
  TimingStats t;
  int64_t peak = -1;
  FloatArray out;
  // What the variant reads: the fp32 inputs, or their bf16 / fp16 rounding.
  AttentionInputs in = p.dtype == DType::fp32 ? inputs_.view(nullptr) : stored_->get();
  {
    probe_.reset();
    out = FloatArray({p.batch, p.heads, p.seq_q, p.head_dim});  // O has the query heads
    in.out = out.ptr();
    ThreadScope scope(pt.threads);
    t = time_repeated([&] { variant.run(p, in); }, config_.measure);
    peak = probe_.peak_increase();
  }
  const double flops = variant.flops(p), gflops = flops / (t.median_ms * 1e6);
  row.time_ms = {t.median_ms, t.p10_ms, t.p90_ms, t.mean_ms, t.cv, t.reps};
  row.flops = flops;
  row.gflops = gflops;
  row.frac_sgemm = gflops / calibration_.sgemm_gflops.at(pt.threads);
  if (const auto it = calibration_.fma_gflops.find({pt.threads, row.isa});
      it != calibration_.fma_gflops.end() && it->second > 0)
    row.frac_peak = gflops / it->second;
  if (peak >= 0) row.memory.peak_bytes = peak;
  if (row.bytes && *row.bytes > 0) {
    row.gbytes_per_s = *row.bytes / (t.median_ms * 1e6);
    if (const auto it = calibration_.bandwidth_gbytes_per_s.find(pt.threads);
        it != calibration_.bandwidth_gbytes_per_s.end() && it->second > 0)
      row.frac_bandwidth = *row.gbytes_per_s / it->second;
  }

  // NaN never leaks silently: non-finite output from finite inputs fails the point. The inputs counted are
  // the ones the variant read (fp16 rounds fp32 values beyond 65504 to Inf).
  const int64_t bad_in = p.dtype == DType::fp32 ? count_nonfinite(inputs_.q.ptr(), inputs_.q.numel()) +
                                                      count_nonfinite(inputs_.k.ptr(), inputs_.k.numel()) +
                                                      count_nonfinite(inputs_.v.ptr(), inputs_.v.numel())
                                                : count_nonfinite16(p.dtype, in.q16, inputs_.q.numel()) +
                                                      count_nonfinite16(p.dtype, in.k16, inputs_.k.numel()) +
                                                      count_nonfinite16(p.dtype, in.v16, inputs_.v.numel());
  const int64_t bad_out = count_nonfinite(out.ptr(), out.numel());
  row.nonfinite_inputs = bad_in;
  if (bad_out && !bad_in) {
    row.status = "failed";
    row.reason = std::to_string(bad_out) + " NaN/Inf values in the output from finite inputs";
  }

  // Accuracy against exact softmax attention in fp64 (same masks, bias and dropout), on all or sampled rows:
  // on the inputs the variant read (`accuracy`) and on the fp32 inputs before rounding (`accuracy_e2e`; for
  // fp32 one reference serves both).
  const std::string mode = row.accuracy.reference;
  if (mode == "none") return;
  reference_rows_ = accuracy_rows(p, config_.accuracy);
  const std::string key = pt.input_key + "|" + mode + "|" + std::to_string(p.dropout) + "|" +
                          std::to_string(p.seed) + "|" + bias_name(p.bias);
  reference_for(WideInputs::as_fp32(p), inputs_.view(nullptr), mode, key, reference_key_, reference_);
  if (p.dtype == DType::fp32) {
    stored_reference_key_.clear();  // points of one dtype are adjacent: free it for the fp32 points
    stored_reference_ = DoubleArray();
  } else {
    in.out = nullptr;
    reference_for(p, in, mode, key + "|" + dtype_name(p.dtype), stored_reference_key_, stored_reference_);
  }
  const auto got = mode == "full"
                       ? std::vector<float>(out.data.begin(), out.data.end())
                       : gather_rows(out.ptr(), p.batch * p.heads, p.seq_q, p.head_dim, reference_rows_);
  const int64_t nrows = p.batch * p.heads * static_cast<int64_t>(reference_rows_.size());
  const auto rows = static_cast<int64_t>(reference_rows_.size());
  const ErrorMetrics e2e = compare_outputs(got.data(), reference_.ptr(), nrows, p.head_dim);
  fill_accuracy(row.accuracy_e2e, e2e, rows);
  if (p.dtype == DType::fp32)
    fill_accuracy(row.accuracy, e2e, rows);
  else
    fill_accuracy(row.accuracy, compare_outputs(got.data(), stored_reference_.ptr(), nrows, p.head_dim),
                  rows);
}

}  // namespace attn
