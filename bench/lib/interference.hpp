// What else ran on the machine while a point was timed: a probe read before and after the timed
// repetitions. Sources, all Linux:
// - /proc/stat, the lines of the CPUs this process may run on (sched_getaffinity): busy and steal ticks;
// - getrusage(RUSAGE_SELF): this process's CPU time (subtracted from the busy ticks, leaving other
// processes')
//   and its involuntary context switches;
// - /proc/self/task/*/schedstat: per thread, the nanoseconds it spent runnable but waiting for a core (the
//   most direct and finest reading of contention; absent without CONFIG_SCHEDSTATS, then read as 0);
// - /proc/loadavg, and /sys/devices/system/cpu/cpuN/cpufreq/scaling_cur_freq where the kernel exposes it.
// The parsers are pure functions of the file text, so tests feed them made-up files.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/lib/result_row.hpp"

namespace attn {

// One /proc/stat reading summed over a set of CPUs, in clock ticks (USER_HZ).
struct CpuTicks {
  int64_t busy = 0;   // user + nice + system + irq + softirq (guest time is inside user and nice)
  int64_t steal = 0;  // time the hypervisor ran something else on these vCPUs
  int64_t idle = 0;   // idle + iowait
  int cpus = 0;       // how many of the requested CPUs had a line
};
// Sums the "cpuN ..." lines of `proc_stat` whose N is in `cpus` (all "cpuN" lines when `cpus` is empty).
CpuTicks parse_proc_stat(const std::string& proc_stat, const std::vector<int>& cpus);
// The run-queue wait of one thread, /proc/<pid>/task/<tid>/schedstat "run_ns wait_ns timeslices": wait_ns,
// or nullopt when the text is not of that form.
std::optional<int64_t> parse_schedstat_wait_ns(const std::string& schedstat);
// The 1-minute load average (the first field of /proc/loadavg), or nullopt.
std::optional<double> parse_loadavg(const std::string& loadavg);

// The whole text of a small kernel file (/proc, /sys), "" when it cannot be read.
std::string read_kernel_file(const std::string& path);

// The CPUs this process may run on (sched_getaffinity), in increasing order.
std::vector<int> allowed_cpus();

// The interference score a row is judged by (row_fields documents it): steal plus the larger of the run-queue
// wait and the foreign CPU share beyond its tick resolution (2 ticks per CPU over the window: each of the two
// /proc/stat readings may be up to a tick off per CPU).
double interference_score(const InterferenceSummary& s, double ticks_per_s);

class InterferenceProbe {
 public:
  InterferenceProbe();  // finds the CPUs and the clock tick once
  void start();
  // The readings since start(); `threads` is how many threads the timed code ran on (runq_wait_frac is over
  // window × threads).
  InterferenceSummary stop(int threads) const;
  const std::vector<int>& cpus() const { return cpus_; }

 private:
  struct Reading {
    double wall_s = 0;
    CpuTicks ticks;
    double own_cpu_s = 0;
    int64_t nivcsw = 0;
    int64_t runq_wait_ns = 0;
  };
  Reading read() const;

  std::vector<int> cpus_;
  double ticks_per_s_ = 100;
  Reading start_;
};

}  // namespace attn
