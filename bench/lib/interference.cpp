// The interference probe: /proc/stat, getrusage, per-thread schedstat, loadavg and cpufreq around a timing.
#include "bench/lib/interference.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace attn {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string read_kernel_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

CpuTicks parse_proc_stat(const std::string& text, const std::vector<int>& cpus) {
  CpuTicks t;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    // "cpuN user nice system idle iowait irq softirq steal guest guest_nice"; the aggregate "cpu " line has
    // no number and is skipped.
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || line[3] < '0' || line[3] > '9') continue;
    std::istringstream f(line.substr(3));
    int cpu = -1;
    int64_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (!(f >> cpu)) continue;
    int got = 0;
    while (got < 8 && f >> v[got]) ++got;
    if (got < 4) continue;  // not a stat line we understand
    if (!cpus.empty() && std::find(cpus.begin(), cpus.end(), cpu) == cpus.end()) continue;
    t.busy += v[0] + v[1] + v[2] + v[5] + v[6];
    t.idle += v[3] + v[4];
    t.steal += v[7];
    ++t.cpus;
  }
  return t;
}

std::optional<int64_t> parse_schedstat_wait_ns(const std::string& text) {
  std::istringstream in(text);
  int64_t run = 0, wait = 0;
  if (!(in >> run >> wait) || run < 0 || wait < 0) return std::nullopt;
  return wait;
}

std::optional<double> parse_loadavg(const std::string& text) {
  std::istringstream in(text);
  double one = 0;
  if (!(in >> one) || one < 0) return std::nullopt;
  return one;
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty())
    for (long c = 0; c < std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)); ++c)
      cpus.push_back(static_cast<int>(c));
  return cpus;
}

double interference_score(const InterferenceSummary& s, double ticks_per_s) {
  const double resolution = s.window_s > 0 ? 2.0 / (ticks_per_s * s.window_s) : 1.0;
  return s.steal_frac + std::max(s.runq_wait_frac, std::max(0.0, s.other_cpu_frac - resolution));
}

InterferenceProbe::InterferenceProbe() : cpus_(allowed_cpus()) {
  const long hz = sysconf(_SC_CLK_TCK);
  if (hz > 0) ticks_per_s_ = static_cast<double>(hz);
}

InterferenceProbe::Reading InterferenceProbe::read() const {
  Reading r;
  r.wall_s = now_s();
  r.ticks = parse_proc_stat(read_kernel_file("/proc/stat"), cpus_);
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0) {
    r.own_cpu_s = static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
                  static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
    r.nivcsw = u.ru_nivcsw;
  }
  // Threads that exit during the window take their wait with them; the timed code's threads (TBB workers)
  // live for the whole run.
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec))
    if (auto w = parse_schedstat_wait_ns(read_kernel_file((task.path() / "schedstat").string())))
      r.runq_wait_ns += *w;
  return r;
}

void InterferenceProbe::start() {
  start_ = read();
}

InterferenceSummary InterferenceProbe::stop(int threads) const {
  const Reading end = read();
  InterferenceSummary s;
  s.window_s = std::max(end.wall_s - start_.wall_s, 1e-9);
  const double cpus = std::max(1, end.ticks.cpus), capacity_s = s.window_s * cpus;
  const double busy_s = static_cast<double>(end.ticks.busy - start_.ticks.busy) / ticks_per_s_;
  const double steal_s = static_cast<double>(end.ticks.steal - start_.ticks.steal) / ticks_per_s_;
  s.steal_frac = std::clamp(steal_s / capacity_s, 0.0, 1.0);
  s.other_cpu_frac = std::clamp((busy_s - (end.own_cpu_s - start_.own_cpu_s)) / capacity_s, 0.0, 1.0);
  s.runq_wait_frac = std::clamp(static_cast<double>(end.runq_wait_ns - start_.runq_wait_ns) * 1e-9 /
                                    (s.window_s * std::max(threads, 1)),
                                0.0, 1.0);
  s.ctx_switches_involuntary = end.nivcsw - start_.nivcsw;
  s.loadavg_1m = parse_loadavg(read_kernel_file("/proc/loadavg")).value_or(0.0);
  double mhz = 0;
  int with_freq = 0;
  for (int c : cpus_) {
    const std::string khz =
        read_kernel_file("/sys/devices/system/cpu/cpu" + std::to_string(c) + "/cpufreq/scaling_cur_freq");
    if (khz.empty()) continue;
    try {
      mhz += std::stod(khz) / 1000.0;
      ++with_freq;
    } catch (const std::exception&) {
    }
  }
  if (with_freq) s.freq_mhz = mhz / with_freq;
  s.score = interference_score(s, ticks_per_s_);
  return s;
}

}  // namespace attn
