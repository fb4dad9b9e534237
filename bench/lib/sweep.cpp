// The sweep runner. Order of work per point: support check, memory budget check, timing (with the memory
// probe), output sanity (NaN/Inf), accuracy against the fp64 exact softmax reference, then one JSON line.
#include "bench/lib/sweep.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "bench/lib/inputs.hpp"
#include "bench/lib/measure.hpp"
#include "bench/lib/sysinfo.hpp"
#include "common/error.hpp"
#include "common/npy.hpp"
#include "common/reference.hpp"
#include "common/runtime.hpp"
#include "common/simd.hpp"

namespace fs = std::filesystem;

namespace attn {
namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
}

// JSON has no NaN/Inf: non-finite metrics are written as strings ("inf", "nan") so they are never mistaken
// for a small error (nlohmann would write null).
Json num(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
}

// The fp64 exact reference for one set of inputs, shared by every variant measured on them.
struct ReferenceCache {
  std::string key;
  std::string mode;  // "full" | "sampled" | "none"
  std::vector<int64_t> rows;
  DoubleArray out;
};

// Byte counts add up without wrapping: a variant's workspace estimate for an absurd point may be near 2^64,
// and a wrapped sum would pass the memory budget (and allocate) instead of skipping the point.
std::size_t sat_add(std::size_t a, std::size_t b) {
  std::size_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}

int64_t count_nonfinite(const float* x, std::size_t n) {
  int64_t c = 0;
  for (std::size_t i = 0; i < n; ++i) c += !std::isfinite(x[i]);
  return c;
}

std::string format_duration(double s) {
  std::ostringstream o;
  if (s >= 3600)
    o << static_cast<int>(s / 3600) << "h" << std::setw(2) << std::setfill('0')
      << static_cast<int>(s / 60) % 60 << "m";
  else if (s >= 60)
    o << static_cast<int>(s / 60) << "m" << std::setw(2) << std::setfill('0') << static_cast<int>(s) % 60
      << "s";
  else
    o << std::fixed << std::setprecision(1) << s << "s";
  return o.str();
}

class Runner {
 public:
  Runner(const SweepConfig& c, const SweepOptions& o) : config_(c), opt_(o) {}

  int run() {
    std::vector<SweepPoint> plan = expand_plan(config_);
    const std::size_t planned = plan.size();
    if (!opt_.filter.empty()) {
      std::erase_if(plan, [&](const SweepPoint& p) { return p.id.find(opt_.filter) == std::string::npos; });
      if (plan.empty())
        throw UsageError("--filter '" + opt_.filter + "' matches none of the " + std::to_string(planned) +
                         " points");
    }
    if (opt_.dry_run) return print_plan(plan);
    // Handlers first: a Ctrl-C during set-up or calibration also ends in a resumable folder.
    auto* old_int = std::signal(SIGINT, on_stop_signal);
    auto* old_term = std::signal(SIGTERM, on_stop_signal);
    prepare_out_dir();
    std::set<std::string> done;
    for (const Json& row : existing_rows_) done.insert(row.value("id", ""));
    std::size_t todo = 0;
    for (const auto& pt : plan) todo += !done.count(pt.id);
    std::cout << "attnbench: sweep '" << config_.name << "': " << plan.size() << " points"
              << (done.empty() ? "" : ", " + std::to_string(plan.size() - todo) + " already done") << " -> "
              << opt_.out_dir << "\n"
              << std::flush;
    calibrate();

    const auto t_start = std::chrono::steady_clock::now();
    std::size_t measured = 0;
    int failed = 0, skipped = 0, ok = 0;
    ReferenceCache ref;
    PointInputs inputs;
    std::string inputs_key;
    for (const SweepPoint& pt : plan) {
      if (done.count(pt.id)) continue;
      if (g_stop_signal.load()) break;
      const auto t0 = std::chrono::steady_clock::now();
      progress(measured, todo, pt.id, t_start);
      Json row = measure_point(pt, inputs, inputs_key, ref);
      const std::string status = row["status"];
      (status == "ok" ? ok : status == "skipped" ? skipped : failed)++;
      append_row(row);
      ++measured;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!tty_) {
        std::cout << "[" << measured << "/" << todo << "] " << status << " " << pt.id;
        if (status == "ok")
          std::cout << "  " << std::setprecision(4) << row["time_ms"]["median"].get<double>() << " ms";
        else
          std::cout << "  (" << row["reason"].get<std::string>() << ")";
        std::cout << "  [" << format_duration(secs) << "]\n" << std::flush;
      }
    }
    if (tty_) std::cerr << "\r\033[K";
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
    const int sig = g_stop_signal.exchange(0);
    finish(sig != 0);
    std::cout << "attnbench: " << ok << " ok, " << skipped << " skipped, " << failed << " failed in "
              << format_duration(
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count())
              << "; results in " << opt_.out_dir << "\n";
    if (sig) {
      std::cout << "attnbench: interrupted (signal " << sig << ") after " << measured << " of " << todo
                << " points; rerun with --resume to finish\n";
      return 130;
    }
    return failed ? 1 : 0;
  }

 private:
  const SweepConfig& config_;
  SweepOptions opt_;
  std::vector<Json> existing_rows_;
  Json meta_;
  std::map<int, double> sgemm_gflops_;
  std::map<std::pair<int, std::string>, double> fma_gflops_;  // (threads, resolved isa) -> GFLOP/s
  std::ofstream jsonl_;
  int jsonl_fd_ = -1;
  bool tty_ = false;
  MemoryProbe probe_;

  std::string jsonl_path() const { return (fs::path(opt_.out_dir) / "results.jsonl").string(); }
  std::string meta_path() const { return (fs::path(opt_.out_dir) / "meta.json").string(); }
  std::string csv_path() const { return (fs::path(opt_.out_dir) / "results.csv").string(); }

  int print_plan(const std::vector<SweepPoint>& plan) {
    for (const auto& pt : plan) {
      const Attention& v = Registry::instance().get(pt.problem.variant);
      std::cout << pt.id;
      std::string why = v.unsupported_reasons_text(pt.problem);
      if (why.empty()) why = over_budget_reason(pt.problem, v, pt.threads);
      if (!why.empty())
        std::cout << "  SKIP: " << why;
      else
        std::cout << "  est. " << format_bytes(static_cast<double>(estimate_bytes(pt)));
      std::cout << "\n";
    }
    std::cout << plan.size() << " points\n";
    return 0;
  }

  static std::size_t inputs_bytes(const Problem& p) {
    return static_cast<std::size_t>(p.q_elements() + 2 * p.kv_elements()) * sizeof(float) +
           (p.mask.key_padding ? static_cast<std::size_t>(p.batch * p.seq_kv) : 0);
  }
  static std::size_t output_bytes(const Problem& p) {
    return static_cast<std::size_t>(p.q_elements()) * sizeof(float);
  }
  static std::size_t estimate_bytes(const SweepPoint& pt) {
    const Attention& v = Registry::instance().get(pt.problem.variant);
    return sat_add(inputs_bytes(pt.problem) + output_bytes(pt.problem),
                   v.workspace_bytes(pt.problem, pt.threads));
  }

  // Validates the output folder before anything is written; on --resume loads what is there.
  void prepare_out_dir() {
    const fs::path dir = opt_.out_dir;
    const bool has_results = fs::exists(dir / "results.jsonl") || fs::exists(dir / "meta.json");
    if (opt_.resume) {
      if (!fs::exists(dir / "meta.json"))
        throw UsageError("--resume: '" + dir.string() +
                         "' holds no interrupted sweep (no meta.json); run without --resume");
      Json old;
      try {
        old = Json::parse(read_file_bytes((dir / "meta.json").string()));
      } catch (const Json::exception& e) {
        throw UsageError("--resume: '" + (dir / "meta.json").string() + "' is not valid JSON (" + e.what() +
                         ")");
      }
      if (old.value("config_hash", "") != config_.hash())
        throw UsageError("--resume: the config changed since the interrupted run in '" + dir.string() +
                         "' (hash " + old.value("config_hash", "?") + " then, " + config_.hash() +
                         " now); rerun without --resume (and --force) or use another --out");
      if (const std::string was = old.value("isa_option", "best"); was != opt_.isa)
        throw UsageError("--resume: the interrupted run in '" + dir.string() + "' ran with --isa " + was +
                         ", this one with --isa " + opt_.isa + "; resume with --isa " + was +
                         " (or rerun with --force or another --out)");
      meta_ = old;
      if (fs::exists(dir / "results.jsonl")) existing_rows_ = read_results_jsonl(jsonl_path(), true);
    } else if (has_results && !opt_.force) {
      throw UsageError(
          "output folder '" + dir.string() +
          "' already holds results; use --resume to finish them, --force to replace them, or --out");
    } else {
      fs::create_directories(dir);
      // meta.json (with the config hash) exists before results.jsonl, so a kill at any later moment leaves a
      // folder that --resume accepts.
      // Everything an earlier run (or its plots and peer rows) left here belongs to the results being
      // replaced.
      for (const char* f :
           {"results.jsonl", "results.csv", "meta.json", "results.peers.jsonl", "REPORT.md", "summary.json"})
        fs::remove(dir / f);
      fs::remove_all(dir / "plots");
      fs::remove_all(dir / "patterns");
    }
    if (!opt_.resume) {
      meta_ = {{"config_name", config_.name},
               {"config_path", config_.source_path},
               {"config_hash", config_.hash()},
               {"config", config_.raw},
               {"system", system_info()},
               {"isa_option", opt_.isa},
               {"start_time", now_iso8601()},
               {"end_time", nullptr},
               {"memory_probe", probe_.supported() ? "VmHWM reset per point" : "unsupported"}};
      write_file_atomic(meta_path(), meta_.dump(2) + "\n");
    }
    jsonl_.open(jsonl_path(), std::ios::app);
    if (!jsonl_) throw UsageError("cannot open '" + jsonl_path() + "' for appending");
    jsonl_fd_ = ::open(jsonl_path().c_str(), O_RDONLY);
    tty_ = opt_.progress_tty && isatty(STDERR_FILENO);
  }

  void calibrate() {
    if (meta_.contains("sgemm_calibration")) {  // resumed: keep the denominators of the rows already written
      for (const auto& c : meta_["sgemm_calibration"])
        sgemm_gflops_[c["threads"].get<int>()] = c["gflops"].get<double>();
    }
    Json cal = meta_.value("sgemm_calibration", Json::array());
    if (const std::string note = blas_kernel_note(); !note.empty()) {
      std::cout << "attnbench: note: " << note << "\n";
      meta_["blas_note"] = note;
    }
    for (int t : config_.threads) {
      if (sgemm_gflops_.count(t) || g_stop_signal.load()) continue;
      const SgemmCalibration c = calibrate_sgemm(t);
      sgemm_gflops_[t] = c.gflops;
      cal.push_back({{"threads", t},
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
    // points run on, each measured under its own selection. Targets are keyed by the name that ran, so
    // "best" and the name it resolves to are measured once.
    Json peaks = meta_.value("fma_peak", Json::array());
    for (const auto& c : peaks)  // resumed: keep the denominators of the rows already written
      if (c.contains("isa") && c["isa"].is_string())
        fma_gflops_[{c["threads"].get<int>(), c["isa"].get<std::string>()}] = c["gflops"].get<double>();
    std::vector<std::string> requested{"best"};
    for (const std::string& name : config_.isas)
      if (std::find(requested.begin(), requested.end(), name) == requested.end()) requested.push_back(name);
    std::string best;
    for (int t : config_.threads)
      for (const std::string& name : requested) {
        if (g_stop_signal.load()) break;
        const simd::ScopedIsa scope(name, "sweep.isa");
        const std::string isa = simd::active_isa();
        if (name == "best") best = isa;
        if (fma_gflops_.count({t, isa})) continue;
        const FmaPeak c = calibrate_fma_peak(t);
        fma_gflops_[{t, c.isa}] = c.gflops;
        peaks.push_back({{"threads", t}, {"isa", c.isa}, {"gflops", c.gflops}, {"lanes", c.lanes}});
        std::cout << "attnbench: fp32 FMA peak (" << c.isa << ", " << c.lanes << " lanes), " << t
                  << " thread(s): " << std::fixed << std::setprecision(1) << c.gflops << " GFLOP/s\n"
                  << std::defaultfloat;
      }
    // sgemm is fp32 FMAs on the same cores: above the best target's peak, the probe is wrong.
    for (int t : config_.threads) {
      const auto s = sgemm_gflops_.find(t);
      const auto p = fma_gflops_.find({t, best});
      if (s != sgemm_gflops_.end() && p != fma_gflops_.end() && s->second > p->second)
        std::cerr << "attnbench: warning: the sgemm calibration at " << t << " thread(s) (" << std::fixed
                  << std::setprecision(1) << s->second << " GFLOP/s) exceeds the fp32 FMA peak of the best "
                  << "SIMD target " << best << " (" << p->second
                  << " GFLOP/s): the FMA-peak probe is wrong, and frac_peak with it\n"
                  << std::defaultfloat;
    }
    if (opt_.resume) meta_["resumed_at"].push_back(now_iso8601());
    meta_["sgemm_calibration"] = cal;
    meta_["fma_peak"] = peaks;
    write_file_atomic(meta_path(), meta_.dump(2) + "\n");
  }

  void progress(std::size_t done, std::size_t total, const std::string& id,
                std::chrono::steady_clock::time_point start) {
    if (!tty_) return;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string eta =
        done ? format_duration(el / static_cast<double>(done) * static_cast<double>(total - done)) : "?";
    std::cerr << "\r\033[K[" << done << "/" << total << "] ETA " << eta << "  " << id.substr(0, 100)
              << std::flush;
  }

  // `isa` is the SIMD target that runs the point (the caller holds the point's simd::ScopedIsa).
  Json base_row(const SweepPoint& pt) const {
    const Problem& p = pt.problem;
    return {{"id", pt.id},
            {"variant", p.variant},
            {"params", p.params},
            {"batch", p.batch},
            {"heads", p.heads},
            {"seq_q", p.seq_q},
            {"seq_kv", p.seq_kv},
            {"head_dim", p.head_dim},
            {"mask", pt.mask.label()},
            {"regime", pt.regime.label()},
            {"threads", pt.threads},
            {"isa", simd::active_isa()},
            {"dropout", p.dropout},
            {"exact", Registry::instance().get(p.variant).capabilities().exact},
            {"status", "ok"},
            {"reason", ""},
            // Present in every row (null until measured) so readers never need to test for them.
            {"time_ms",
             {{"median", nullptr},
              {"p10", nullptr},
              {"p90", nullptr},
              {"mean", nullptr},
              {"cv", nullptr},
              {"reps", 0}}},
            {"flops", nullptr},
            {"gflops", nullptr},
            {"frac_sgemm", nullptr},
            {"frac_peak", nullptr},
            {"accuracy",
             {{"reference", accuracy_mode(p)},
              {"rows", 0},
              {"max_abs_err", nullptr},
              {"rel_l2_err", nullptr},
              {"mean_cosine", nullptr},
              {"nan_count", nullptr},
              {"inf_count", nullptr}}}};
  }

  std::string accuracy_mode(const Problem& p) const {
    const std::string mode = config_.accuracy.reference;
    if (mode != "auto") return mode;
    return p.seq_q <= config_.accuracy.rows ? "full" : "sampled";
  }

  // Bytes the accuracy step allocates: the fp64 reference rows, and an fp32 copy of the compared rows.
  std::size_t reference_bytes(const Problem& p) const {
    const std::string mode = accuracy_mode(p);
    if (mode == "none") return 0;
    const int64_t rows = mode == "full" ? p.seq_q : std::min(p.seq_q, config_.accuracy.rows);
    return static_cast<std::size_t>(p.batch * p.heads * rows * p.head_dim) * (sizeof(double) + sizeof(float));
  }

  // Empty when the point fits the memory budget, else the reason with the bytes it would need (run and
  // --dry-run give the same answer, before anything is allocated).
  std::string over_budget_reason(const Problem& p, const Attention& variant, int threads) const {
    const std::size_t estimated = sat_add(output_bytes(p), variant.workspace_bytes(p, threads));
    const std::size_t need = sat_add(inputs_bytes(p) + reference_bytes(p), estimated);
    if (need <= config_.memory_budget_bytes) return "";
    return std::string(need == SIZE_MAX ? "needs at least " : "needs ") + std::to_string(need) + " bytes (" +
           format_bytes(static_cast<double>(need)) + ": inputs " +
           format_bytes(static_cast<double>(inputs_bytes(p))) + ", output and workspace " +
           format_bytes(static_cast<double>(estimated)) + ", accuracy reference " +
           format_bytes(static_cast<double>(reference_bytes(p))) + ") > memory_budget " +
           format_bytes(static_cast<double>(config_.memory_budget_bytes));
  }

  Json measure_point(const SweepPoint& pt, PointInputs& inputs, std::string& inputs_key,
                     ReferenceCache& ref) {
    const Problem& p = pt.problem;
    const Attention& variant = Registry::instance().get(p.variant);
    // Every kernel of the point (inputs, timed calls) runs on the point's target; sweep.isa was validated
    // with the config.
    const simd::ScopedIsa isa_scope(pt.isa, "sweep.isa");
    Json row = base_row(pt);
    const std::size_t workspace = variant.workspace_bytes(p, pt.threads);
    const std::size_t estimated = sat_add(output_bytes(p), workspace);
    row["memory"] = {{"estimated_bytes", estimated},
                     {"inputs_bytes", inputs_bytes(p)},
                     {"workspace_bytes", workspace},
                     {"reference_bytes", reference_bytes(p)},
                     {"peak_bytes", nullptr}};
    if (const std::string why = variant.unsupported_reasons_text(p); !why.empty()) {
      row["status"] = "skipped";
      row["reason"] = why;
      return row;
    }
    if (std::string why = over_budget_reason(p, variant, pt.threads); !why.empty()) {
      row["status"] = "skipped";
      row["reason"] = std::move(why);
      return row;
    }
    try {
      if (inputs_key != pt.input_key) {
        inputs = PointInputs();
        inputs = make_inputs(pt);
        inputs_key = pt.input_key;
      }
      measure_timing_and_accuracy(pt, variant, inputs, ref, row);
    } catch (const std::bad_alloc&) {
      row["status"] = "failed";
      row["reason"] = "out of memory (std::bad_alloc)";
    } catch (const std::exception& e) {
      row["status"] = "failed";
      row["reason"] = e.what();
    }
    return row;
  }

  void measure_timing_and_accuracy(const SweepPoint& pt, const Attention& variant, const PointInputs& inputs,
                                   ReferenceCache& ref, Json& row) {
    const Problem& p = pt.problem;
    TimingStats t;
    int64_t peak = -1;
    FloatArray out;
    {
      probe_.reset();
      out = FloatArray({p.batch, p.heads, p.seq_q, p.head_dim});
      const AttentionInputs in = inputs.view(out.ptr());
      ThreadScope scope(pt.threads);
      t = time_repeated([&] { variant.run(p, in); }, config_.measure);
      peak = probe_.peak_increase();
    }
    const double gflops = variant.flops(p) / (t.median_ms * 1e6);
    row["time_ms"] = {{"median", t.median_ms}, {"p10", t.p10_ms}, {"p90", t.p90_ms},
                      {"mean", t.mean_ms},     {"cv", t.cv},      {"reps", t.reps}};
    row["flops"] = variant.flops(p);
    row["gflops"] = gflops;
    row["frac_sgemm"] = gflops / sgemm_gflops_.at(pt.threads);
    if (const auto it = fma_gflops_.find({pt.threads, row["isa"].get<std::string>()});
        it != fma_gflops_.end() && it->second > 0)
      row["frac_peak"] = gflops / it->second;
    row["memory"]["peak_bytes"] = peak >= 0 ? Json(peak) : Json(nullptr);

    // NaN never leaks silently: non-finite output from finite inputs fails the point.
    const int64_t bad_in = count_nonfinite(inputs.q.ptr(), inputs.q.numel()) +
                           count_nonfinite(inputs.k.ptr(), inputs.k.numel()) +
                           count_nonfinite(inputs.v.ptr(), inputs.v.numel());
    const int64_t bad_out = count_nonfinite(out.ptr(), out.numel());
    row["nonfinite_inputs"] = bad_in;
    if (bad_out && !bad_in) {
      row["status"] = "failed";
      row["reason"] = std::to_string(bad_out) + " NaN/Inf values in the output from finite inputs";
    }

    // Accuracy against exact softmax attention in fp64 (same masks and dropout), on all or sampled rows.
    const std::string mode = accuracy_mode(p);
    const std::string key =
        pt.input_key + "|" + mode + "|" + std::to_string(p.dropout) + "|" + std::to_string(p.seed);
    if (mode != "none" && ref.key != key) {
      ref = ReferenceCache();
      ref.key = key;
      ref.mode = mode;
      ref.rows = sample_rows(p.seq_q, mode == "full" ? p.seq_q : config_.accuracy.rows);
      ref.out = DoubleArray({p.batch, p.heads, static_cast<int64_t>(ref.rows.size()), p.head_dim});
      reference_attention(p, inputs.view(out.ptr()), ref.out.ptr(), mode == "full" ? nullptr : &ref.rows);
    }
    Json acc = {{"reference", mode}};
    if (mode != "none") {
      const auto got = mode == "full"
                           ? std::vector<float>(out.data.begin(), out.data.end())
                           : gather_rows(out.ptr(), p.batch * p.heads, p.seq_q, p.head_dim, ref.rows);
      const int64_t nrows = p.batch * p.heads * static_cast<int64_t>(ref.rows.size());
      const ErrorMetrics m = compare_outputs(got.data(), ref.out.ptr(), nrows, p.head_dim);
      acc["rows"] = static_cast<int64_t>(ref.rows.size());
      acc["max_abs_err"] = num(m.max_abs_err);
      acc["rel_l2_err"] = num(m.rel_l2_err);
      acc["mean_cosine"] = num(m.mean_cosine);
      acc["nan_count"] = m.nan_count;
      acc["inf_count"] = m.inf_count;
    }
    row["accuracy"] = acc;
  }

  void append_row(Json& row) {
    row["timestamp"] = now_iso8601();
    jsonl_ << row.dump() << "\n";
    jsonl_.flush();
    if (!jsonl_) throw std::runtime_error("writing '" + jsonl_path() + "' failed");
    if (jsonl_fd_ >= 0) ::fsync(jsonl_fd_);
  }

  void finish(bool interrupted) {
    jsonl_.close();
    if (jsonl_fd_ >= 0) ::close(jsonl_fd_);
    std::vector<Json> rows = read_results_jsonl(jsonl_path(), false);
    write_file_atomic(csv_path(), results_csv(rows));
    meta_["end_time"] = now_iso8601();
    meta_["interrupted"] = interrupted;
    meta_["rows"] = rows.size();
    write_file_atomic(meta_path(), meta_.dump(2) + "\n");
  }
};

void flatten(const Json& j, const std::string& prefix, std::vector<std::pair<std::string, Json>>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string k = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it.value().is_object() && it.key() != "params")
      flatten(it.value(), k, out);
    else
      out.emplace_back(k, it.value());
  }
}

std::string csv_field(const Json& v) {
  std::string s = v.is_string() ? v.get<std::string>() : v.is_null() ? "" : v.dump();
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::vector<Json> read_results_jsonl(const std::string& path, bool repair) {
  std::vector<Json> rows;
  const std::string text = read_file_bytes(path);
  std::size_t pos = 0, line_no = 0, good_end = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    const bool last = nl == std::string::npos;
    const std::string line = text.substr(pos, last ? std::string::npos : nl - pos);
    ++line_no;
    Json row;
    bool ok = !last;  // a line without its newline was cut mid-write
    if (ok) {
      try {
        row = Json::parse(line);
        ok = row.is_object() && row.contains("id") && row.contains("status");
      } catch (const Json::exception&) {
        ok = false;
      }
    }
    if (!ok) {
      const bool is_tail = last || text.find_first_not_of(" \n", nl + 1) == std::string::npos;
      if (!is_tail)
        throw UsageError("file '" + path + "': line " + std::to_string(line_no) + " is not a result row");
      break;  // torn tail: dropped (and cut below), that point is measured again
    }
    rows.push_back(std::move(row));
    pos = nl + 1;
    good_end = pos;
  }
  if (repair && good_end < text.size()) fs::resize_file(path, good_end);
  // Keep the last row per id (a point measured again after a torn write appears once).
  std::map<std::string, std::size_t> last_index;
  for (std::size_t i = 0; i < rows.size(); ++i) last_index[rows[i]["id"].get<std::string>()] = i;
  std::vector<Json> unique;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (last_index[rows[i]["id"].get<std::string>()] == i) unique.push_back(rows[i]);
  return unique;
}

std::string results_csv(const std::vector<Json>& rows) {
  std::vector<std::string> columns;
  std::set<std::string> seen;
  std::vector<std::vector<std::pair<std::string, Json>>> flat;
  for (const Json& r : rows) {
    flat.emplace_back();
    flatten(r, "", flat.back());
    for (const auto& [k, v] : flat.back())
      if (seen.insert(k).second) columns.push_back(k);
  }
  std::ostringstream out;
  for (std::size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << csv_field(columns[c]);
  out << "\n";
  for (const auto& f : flat) {
    std::map<std::string, Json> m(f.begin(), f.end());
    for (std::size_t c = 0; c < columns.size(); ++c) {
      auto it = m.find(columns[c]);
      out << (c ? "," : "") << (it == m.end() ? "" : csv_field(it->second));
    }
    out << "\n";
  }
  return out.str();
}

int run_sweep(const SweepConfig& config, const SweepOptions& options) {
  SweepOptions o = options;
  if (o.out_dir.empty()) o.out_dir = (fs::path("results") / config.name).string();
  SweepConfig c = config;
  apply_isa_option(c, o.isa);
  return Runner(c, o).run();
}

}  // namespace attn
