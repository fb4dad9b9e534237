// The one sweep driver: filter or shard, dry run, signals, the results folder, the executor's preparation
// (calibration), the groups with progress, the summary. What measures the points is an Executor
// (executor.hpp): the local PointRunner here, attnbench_mpi's ring there.
#include "bench/lib/sweep.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "bench/lib/doctor.hpp"
#include "bench/lib/executor.hpp"
#include "bench/lib/rows.hpp"
#include "bench/lib/runner.hpp"
#include "bench/lib/store.hpp"
#include "bench/lib/sysinfo.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/error.hpp"

namespace fs = std::filesystem;

namespace attn {
namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
}

// on_stop_signal for SIGINT and SIGTERM while alive; the previous dispositions are put back whole.
// std::signal could not do that: it returns only the handler, and reinstalling it through signal() adds
// SA_RESTART, which would change a Python interpreter's handler (installed without it) after the module's
// run().
class StopSignalScope {
 public:
  StopSignalScope() {
    struct sigaction stop = {};
    stop.sa_handler = on_stop_signal;
    stop.sa_flags = SA_RESTART;  // as std::signal installs it: a write or fsync under way is not cut short
    sigemptyset(&stop.sa_mask);
    sigaction(SIGINT, &stop, &previous_int_);
    sigaction(SIGTERM, &stop, &previous_term_);
  }
  ~StopSignalScope() {
    sigaction(SIGINT, &previous_int_, nullptr);
    sigaction(SIGTERM, &previous_term_, nullptr);
  }
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;

 private:
  struct sigaction previous_int_ = {}, previous_term_ = {};
};

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

int print_plan(const std::vector<SweepPoint>& points, const SweepConfig& config, bool json,
               const std::string& shard_note) {
  for (const SweepPoint& pt : points) {
    if (json) {
      std::cout << point_json(pt, config).dump() << "\n";
      continue;
    }
    std::cout << pt.id;
    if (const std::string why = skip_reason(pt, config); !why.empty())
      std::cout << "  SKIP: " << why;
    else
      std::cout << "  est. " << format_bytes(static_cast<double>(point_memory(pt, config).call.total()));
    std::cout << "\n";
  }
  if (!json) std::cout << points.size() << " points" << shard_note << "\n";
  return 0;
}

void progress(std::size_t done, std::size_t total, const std::string& id,
              std::chrono::steady_clock::time_point start) {
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string eta =
      done ? format_duration(el / static_cast<double>(done) * static_cast<double>(total - done)) : "?";
  std::cerr << "\r\033[K[" << done << "/" << total << "] ETA " << eta << "  " << id.substr(0, 100)
            << std::flush;
}

}  // namespace

Json slurm_environment() {
  Json env = Json::object();
  for (const char* name : {"SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_NODELIST",
                           "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION"})
    if (const char* v = std::getenv(name)) env[name] = v;
  return env;
}

std::vector<SweepPoint> filter_points(const Plan& plan, const std::string& filter) {
  std::vector<SweepPoint> points = plan.points;
  if (filter.empty()) return points;
  std::erase_if(points, [&](const SweepPoint& p) { return p.id.find(filter) == std::string::npos; });
  if (points.empty())
    throw UsageError("--filter '" + filter + "' matches none of the " + std::to_string(plan.points.size()) +
                     " points");
  return points;
}

namespace {

// The points this run measures: the plan's, or one shard of it (its folder under OUT/shards/, its meta),
// or those matching --filter.
struct Selection {
  std::vector<SweepPoint> points;
  Json shard_meta;  // null unless --shard
  std::string shard_note;
};
Selection select_points(const Plan& plan, SweepOptions& o) {
  Selection sel;
  if (o.shard.empty()) {
    sel.points = filter_points(plan, o.filter);
    return sel;
  }
  const ShardSpec shard = parse_shard(o.shard, std::getenv("SLURM_ARRAY_TASK_ID"));
  if (!o.filter.empty())
    throw UsageError(
        "--filter and --shard exclude each other: `attnbench merge` checks the shards against "
        "the whole plan, so a filtered shard would report the filtered-out points missing");
  sel.points = shard_points(plan, shard, sel.shard_meta);
  const std::string unit = sel.shard_meta["by"] == "input set" ? "input sets" : "points";
  sel.shard_note = " (shard " + std::to_string(shard.index) + "/" + std::to_string(shard.count) +
                   " of the plan's " + std::to_string(plan.points.size()) + " points, " +
                   sel.shard_meta["plan"]["units"].dump() + " " + unit + " dealt round-robin)";
  o.out_dir = (fs::path(o.out_dir) / "shards" / shard.folder()).string();
  return sel;
}

// The results folder (fresh, forced or resumed) with the machine facts, and a shard's record of this start.
std::unique_ptr<ResultStore> open_store(const Plan& plan, const SweepOptions& o, const Selection& sel,
                                        const Executor& executor) {
  const SweepConfig& config = plan.config;
  Json machine = {{"system", system_info()}};
  machine.update(executor.machine_facts());
  const Json slurm = slurm_environment();
  if (!slurm.empty()) machine["slurm"] = slurm;
  if (!sel.shard_meta.is_null()) machine["shard"] = sel.shard_meta;
  auto store = std::make_unique<ResultStore>(o.out_dir,
                                             o.resume  ? ResultStore::Mode::resume
                                             : o.force ? ResultStore::Mode::force
                                                       : ResultStore::Mode::fresh,
                                             config, ResultStore::Identity{config.hash(), o.isa}, machine);
  if (o.resume) executor.check_resume(store->meta());
  if (!sel.shard_meta.is_null()) {
    if (o.resume) check_resumed_shard(store->meta().value("shard", Json()), sel.shard_meta, o.out_dir);
    // Every start of the shard's folder (the first and each --resume, possibly on another node): where it
    // ran, so `merge` can name the machine of every row.
    const Json system = machine["system"];
    store->meta()["shard"]["runs"].push_back({{"start_time", now_iso8601()},
                                              {"hostname", system["hostname"]},
                                              {"cpu_model", system["cpu_model"]},
                                              {"slurm", slurm}});
    if (o.resume && !slurm.empty()) store->meta()["slurm"] = slurm;  // the latest task's ids
    store->save_meta();
  }
  return store;
}

// The points still to do, in the groups the executor measures together: with measure.interleave (when the
// executor groups input sets), the adjacent points that share one input set (the plan keeps them
// together); otherwise one point each.
std::vector<std::vector<SweepPoint>> make_groups(const std::vector<SweepPoint>& points,
                                                 const std::set<std::string>& done, bool by_input_set,
                                                 const Executor& executor) {
  std::vector<std::vector<SweepPoint>> groups;
  for (const SweepPoint& pt : points) {
    if (done.count(executor.row_id(pt))) continue;
    if (by_input_set && !groups.empty() && groups.back().back().input_key == pt.input_key)
      groups.back().push_back(pt);
    else
      groups.push_back({pt});
  }
  return groups;
}

// The counts of the closing summary.
struct Tally {
  std::size_t measured = 0;
  int failed = 0, skipped = 0, ok = 0, remeasured = 0, noisy = 0;
  void count(const ResultRow& row) {
    (row.status == "ok" ? ok : row.status == "skipped" ? skipped : failed)++;
    remeasured += row.attempts > 1;
    noisy += row.noisy;
    ++measured;
  }
};

// One line per row on a plain stream: status, id, the median with its interval, re-measurements, noise;
// the group's wall time after its last row.
void print_row(const ResultRow& row, std::size_t measured, std::size_t todo, bool last,
               std::size_t group_size, double secs) {
  std::cout << "[" << measured << "/" << todo << "] " << row.status << " " << row.id;
  if (row.status == "ok") {
    std::cout << "  " << std::setprecision(4) << *row.time_ms.median << " ms";
    if (row.time_ms.ci_lo && row.time_ms.ci_hi)
      std::cout << " [" << *row.time_ms.ci_lo << ", " << *row.time_ms.ci_hi << "]";
    if (row.attempts > 1) std::cout << "  measured " << row.attempts << "x";
    if (row.noisy && row.interference)
      std::cout << "  NOISY (interference " << std::setprecision(2) << row.interference->score << ")";
  } else {
    std::cout << "  (" << row.reason << ")";
  }
  if (last)
    std::cout << "  [" << format_duration(secs)
              << (group_size > 1 ? " for " + std::to_string(group_size) + " points" : "") << "]";
  std::cout << "\n";
}

// The groups, each measured by the executor and its rows appended as they come; stops early (leaving the
// folder resumable) when `stop()` turns true.
void measure_groups(const std::vector<std::vector<SweepPoint>>& groups, std::size_t todo,
                    const SweepOptions& o, ResultStore& store, Executor& executor,
                    const std::function<bool()>& stop, Tally& tally) {
  const bool tty = o.progress_tty && isatty(STDERR_FILENO);
  const auto t_start = std::chrono::steady_clock::now();
  for (const std::vector<SweepPoint>& group : groups) {
    if (stop()) break;
    if (executor.between_groups(store.meta(), static_cast<int64_t>(store.existing().size() + tally.measured),
                                stop))
      store.save_meta();
    const auto t0 = std::chrono::steady_clock::now();
    if (tty)
      progress(
          tally.measured, todo,
          group.size() > 1 ? std::to_string(group.size()) + " points together: " + group[0].id : group[0].id,
          t_start);
    bool interrupted = false;
    std::vector<ResultRow> rows = executor.measure(group, stop, interrupted);
    if (interrupted) break;  // none of the group is written: --resume measures it again
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (ResultRow& row : rows) {
      tally.count(row);
      store.append(row);
      if (!tty) print_row(row, tally.measured, todo, &row == &rows.back(), rows.size(), secs);
    }
    std::cout << std::flush;
  }
  if (tty) std::cerr << "\r\033[K";
}

}  // namespace

int run_sweep(const Plan& plan, const SweepOptions& options, Executor& executor) {
  SweepOptions o = options;
  const SweepConfig& config = plan.config;
  if (o.out_dir.empty()) o.out_dir = (fs::path("results") / config.name).string();
  const Selection sel = select_points(plan, o);
  if (o.dry_run) return print_plan(sel.points, config, o.json, sel.shard_note);

  // Handlers first: a Ctrl-C during set-up or calibration also ends in a resumable folder.
  std::optional<StopSignalScope> stop_signals(std::in_place);
  const std::unique_ptr<ResultStore> store = open_store(plan, o, sel, executor);
  std::set<std::string> done;
  for (const ResultRow& row : store->existing()) done.insert(row.id);
  std::size_t todo = 0;
  for (const auto& pt : sel.points) todo += !done.count(executor.row_id(pt));
  std::cout << "attnbench: sweep '" << config.name << "': " << sel.points.size() << " points"
            << sel.shard_note
            << (done.empty() ? "" : ", " + std::to_string(sel.points.size() - todo) + " already done")
            << " -> " << o.out_dir << "\n"
            << std::flush;
  // The machine's conditions first (the quick checks: no timed observation), printed and kept in meta.json.
  {
    DoctorOptions d;
    d.quick = true;
    d.threads = *std::max_element(config.threads.begin(), config.threads.end());
    const std::vector<DoctorFinding> findings = doctor_checks(d);
    std::cout << doctor_warnings_text(findings) << std::flush;
    store->meta()["doctor"] = doctor_json(findings);
  }
  const auto stop = [] { return g_stop_signal.load() != 0; };
  executor.prepare(store->meta(), stop);
  store->save_meta();

  const auto t_start = std::chrono::steady_clock::now();
  Tally tally;
  measure_groups(make_groups(sel.points, done, executor.groups_input_sets(config), executor), todo, o, *store,
                 executor, stop, tally);
  stop_signals.reset();
  const int sig = g_stop_signal.exchange(0);
  store->finish(sig != 0);
  std::cout << "attnbench: " << tally.ok << " ok, " << tally.skipped << " skipped, " << tally.failed
            << " failed in "
            << format_duration(
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count())
            << "; results in " << o.out_dir << "\n";
  if (tally.remeasured || tally.noisy)
    std::cout << "attnbench: interference: " << tally.remeasured << " point(s) measured again, "
              << tally.noisy << " still noisy (noisy: true in their rows; measure.max_interference "
              << config.measure.max_interference << ")\n";
  if (sig) {
    std::cout << "attnbench: interrupted (signal " << sig << ") after " << tally.measured << " of " << todo
              << " points; rerun with --resume to finish\n";
    return 130;
  }
  return tally.failed ? 1 : 0;
}

int run_sweep(const Plan& plan, const SweepOptions& options) {
  PointRunner runner(plan.config);
  return run_sweep(plan, options, runner);
}

int run_sweep_config(const std::string& config_path, const SweepOptions& options) {
  if (options.resume && options.force) throw UsageError("--resume and --force exclude each other");
  if (options.json && !options.dry_run) throw UsageError("--json goes with --dry-run (it prints the plan)");
  simd::ScopedIsa isa(options.isa, "--isa");
  const Plan plan = load_plan(config_path, options.isa);
  return run_sweep(plan, options);
}

}  // namespace attn
