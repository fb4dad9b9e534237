// The calibrations (calibration.hpp).
#include "bench/lib/calibration.hpp"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <latch>
#include <memory>
#include <thread>

#include "bench/lib/bandwidth.hpp"
#include "bench/lib/result_row.hpp"
#include "bench/lib/sysinfo.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/runtime.hpp"

namespace attn {

SgemmCalibration calibrate_sgemm(int threads, int64_t size, int reps) {
  SgemmCalibration c;
  c.threads = threads;
  c.size = size;
  SgemmBench bench(size);
  MeasureSettings ms;
  ms.warmup = 1;
  ms.min_reps = reps;
  ms.max_reps = reps;
  ms.min_time_s = 0;
  ms.max_time_s = 60;
  c.timing = std::move(time_interleaved({[&] { return bench.call_ms(threads); }}, ms).stats[0]);
  c.gflops = bench.flops() / (c.timing.median_ms * 1e6);
  return c;
}

FmaPeak calibrate_fma_peak(int threads) {
  FmaPeak peak;
  peak.threads = threads;
  peak.isa = simd::active_isa();
  // Size the run on one thread: double until it takes 50 ms, then scale to about 0.1 s.
  int64_t iterations = 1 << 16;
  simd::FmaRun probe = simd::fma_chains(iterations);
  while (probe.seconds < 0.05 && iterations < (int64_t{1} << 40)) {
    iterations *= 2;
    probe = simd::fma_chains(iterations);
  }
  iterations = std::max<int64_t>(
      1, static_cast<int64_t>(static_cast<double>(iterations) * 0.1 / std::max(probe.seconds, 1e-9)));
  peak.lanes = probe.lanes;
  // Every thread at once (a latch releases them together), twice, keeping the faster round: the first may
  // include frequency ramp-up.
  for (int round = 0; round < 2; ++round) {
    std::vector<simd::FmaRun> runs(static_cast<std::size_t>(threads));
    std::latch start(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        start.arrive_and_wait();
        runs[static_cast<std::size_t>(t)] = simd::fma_chains(iterations);
      });
    for (auto& th : pool) th.join();
    double gflops = 0;
    for (const simd::FmaRun& r : runs) gflops += r.flops / (r.seconds * 1e9);
    peak.gflops = std::max(peak.gflops, gflops);
  }
  return peak;
}

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

namespace {

// The targets the FMA peak is measured on: "best" (the bound sgemm is checked against) and every target the
// points run on.
std::vector<std::string> peak_targets(const SweepConfig& config) {
  std::vector<std::string> requested{"best"};
  for (const std::string& name : config.isas)
    if (std::find(requested.begin(), requested.end(), name) == requested.end()) requested.push_back(name);
  return requested;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Json interference_meta(const InterferenceSummary& i) {
  ResultRow r;  // the row's own writer gives the one layout of the object
  r.interference = i;
  return to_json(r)["interference"];
}

}  // namespace

ComputeCalibration measure_compute_calibration(const SweepConfig& config, const std::function<bool()>& stop,
                                               bool print) {
  ComputeCalibration c;
  InterferenceProbe probe;
  probe.start();
  for (int t : config.threads) {
    if (stop()) break;
    const SgemmCalibration s = calibrate_sgemm(t, kCalibrationSgemmSize);
    std::vector<double> rates;
    for (double ms : s.timing.samples_ms)
      rates.push_back(2.0 * static_cast<double>(s.size) * s.size * s.size / (ms * 1e6));
    std::sort(rates.begin(), rates.end());
    c.sgemm.push_back({{"threads", t},
                       {"size", s.size},
                       {"gflops", s.gflops},
                       {"median_ms", s.timing.median_ms},
                       {"cv", s.timing.cv},
                       {"p10_gflops", rates.empty() ? 0.0 : rates.front()},
                       {"p90_gflops", rates.empty() ? 0.0 : rates.back()}});
    c.sgemm_gflops[t] = s.gflops;
    if (print)
      std::cout << "attnbench: sgemm calibration, " << t << " thread(s), " << s.size << "^3: " << std::fixed
                << std::setprecision(1) << s.gflops << " GFLOP/s\n"
                << std::defaultfloat;
  }
  // The hardware bound next to the BLAS one, per thread count and SIMD target, each measured under its own
  // selection. Targets are keyed by the name that ran, so "best" and the name it resolves to are measured
  // once.
  for (int t : config.threads)
    for (const std::string& name : peak_targets(config)) {
      if (stop()) break;
      const simd::ScopedIsa scope(name, "sweep.isa");
      const std::string isa = simd::active_isa();
      if (name == "best") c.best_isa = isa;
      if (c.fma_gflops.count({t, isa})) continue;
      const FmaPeak f = calibrate_fma_peak(t);
      c.fma_gflops[{t, f.isa}] = f.gflops;
      c.fma.push_back({{"threads", t}, {"isa", f.isa}, {"gflops", f.gflops}, {"lanes", f.lanes}});
      if (print)
        std::cout << "attnbench: fp32 FMA peak (" << f.isa << ", " << f.lanes << " lanes), " << t
                  << " thread(s): " << std::fixed << std::setprecision(1) << f.gflops << " GFLOP/s\n"
                  << std::defaultfloat;
    }
  int most_threads = 1;
  for (int t : config.threads) most_threads = std::max(most_threads, t);
  c.interference = probe.stop(most_threads);
  return c;
}

void record_calibration(Json& meta, const ComputeCalibration& c, const std::string& reason,
                        int64_t after_points, bool used) {
  Json list = meta.value("calibrations", Json::array());
  if (!list.is_array()) list = Json::array();
  list.push_back({{"index", list.size()},
                  {"timestamp", utc_now()},
                  {"after_points", after_points},
                  {"reason", reason},
                  {"used", used},
                  {"interference", interference_meta(c.interference)},
                  {"sgemm", c.sgemm},
                  {"fma_peak", c.fma}});
  meta["calibrations"] = list;
}

Calibration calibrate(const SweepConfig& config, Json& meta, const std::function<bool()>& stop) {
  Calibration cal;
  if (const std::string note = blas_kernel_note(); !note.empty()) {
    std::cout << "attnbench: note: " << note << "\n";
    meta["blas_note"] = note;
  }
  // A resumed run measures a calibration of its own (the conditions may have changed since), appended to
  // "calibrations"; "sgemm_calibration" and "fma_peak" keep the first run's (the denominators of its rows).
  const bool resumed =
      meta.contains("calibrations") && meta["calibrations"].is_array() && !meta["calibrations"].empty();
  const ComputeCalibration c = measure_compute_calibration(config, stop, true);
  cal.sgemm_gflops = c.sgemm_gflops;
  cal.fma_gflops = c.fma_gflops;
  if (!meta.contains("sgemm_calibration")) meta["sgemm_calibration"] = c.sgemm;
  if (!meta.contains("fma_peak")) meta["fma_peak"] = c.fma;
  record_calibration(meta, c, resumed ? "resume" : "start", 0, true);
  cal.index = static_cast<int64_t>(meta["calibrations"].size()) - 1;
  if (c.interference.score > config.measure.max_interference)
    std::cerr << "attnbench: warning: the calibration ran under interference (score " << std::setprecision(3)
              << c.interference.score << " > measure.max_interference " << config.measure.max_interference
              << "); it is used until a clean one replaces it\n"
              << std::defaultfloat;
  // sgemm is fp32 FMAs on the same cores: above the best target's peak, the probe is wrong.
  for (int t : config.threads) {
    const auto s = cal.sgemm_gflops.find(t);
    const auto p = cal.fma_gflops.find({t, c.best_isa});
    if (s != cal.sgemm_gflops.end() && p != cal.fma_gflops.end() && s->second > p->second)
      std::cerr << "attnbench: warning: the sgemm calibration at " << t << " thread(s) (" << std::fixed
                << std::setprecision(1) << s->second << " GFLOP/s) exceeds the fp32 FMA peak of the best "
                << "SIMD target " << c.best_isa << " (" << p->second
                << " GFLOP/s): the FMA-peak probe is wrong, and frac_peak with it\n"
                << std::defaultfloat;
  }
  calibrate_memory_bandwidth(config, meta, stop, cal);
  return cal;
}

}  // namespace attn
