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
      inputs_ = PointInputs();  // the old inputs go before the new ones are made
      inputs_key_.clear();
      inputs_ = make_inputs(pt);
      inputs_key_ = pt.input_key;
    }
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

void PointRunner::time_and_compare(const SweepPoint& pt, const Attention& variant, ResultRow& row) {
  const Problem& p = pt.problem;
  TimingStats t;
  int64_t peak = -1;
  FloatArray out;
  {
    probe_.reset();
    out = FloatArray({p.batch, p.heads, p.seq_q, p.head_dim});  // O has the query heads
    const AttentionInputs in = inputs_.view(out.ptr());
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

  // NaN never leaks silently: non-finite output from finite inputs fails the point.
  const int64_t bad_in = count_nonfinite(inputs_.q.ptr(), inputs_.q.numel()) +
                         count_nonfinite(inputs_.k.ptr(), inputs_.k.numel()) +
                         count_nonfinite(inputs_.v.ptr(), inputs_.v.numel());
  const int64_t bad_out = count_nonfinite(out.ptr(), out.numel());
  row.nonfinite_inputs = bad_in;
  if (bad_out && !bad_in) {
    row.status = "failed";
    row.reason = std::to_string(bad_out) + " NaN/Inf values in the output from finite inputs";
  }

  // Accuracy against exact softmax attention in fp64 (same masks and dropout), on all or sampled rows.
  const std::string mode = row.accuracy.reference;
  if (mode == "none") return;
  const std::string key =
      pt.input_key + "|" + mode + "|" + std::to_string(p.dropout) + "|" + std::to_string(p.seed);
  if (reference_key_ != key) {
    reference_key_.clear();
    reference_ = DoubleArray();
    reference_rows_ = accuracy_rows(p, config_.accuracy);
    reference_ = DoubleArray({p.batch, p.heads, static_cast<int64_t>(reference_rows_.size()), p.head_dim});
    reference_attention(p, inputs_.view(out.ptr()), reference_.ptr(),
                        mode == "full" ? nullptr : &reference_rows_);
    reference_key_ = key;
  }
  const auto got = mode == "full"
                       ? std::vector<float>(out.data.begin(), out.data.end())
                       : gather_rows(out.ptr(), p.batch * p.heads, p.seq_q, p.head_dim, reference_rows_);
  const int64_t nrows = p.batch * p.heads * static_cast<int64_t>(reference_rows_.size());
  const ErrorMetrics m = compare_outputs(got.data(), reference_.ptr(), nrows, p.head_dim);
  row.accuracy.rows = static_cast<int64_t>(reference_rows_.size());
  row.accuracy.max_abs_err = m.max_abs_err;
  row.accuracy.rel_l2_err = m.rel_l2_err;
  row.accuracy.mean_cosine = m.mean_cosine;
  row.accuracy.nan_count = m.nan_count;
  row.accuracy.inf_count = m.inf_count;
}

}  // namespace attn
