// `attnbench doctor`: what on this machine makes timings move, each with a one-line fix, in the
// spirit of pyperf's `system show` and Google Benchmark's CPU-scaling warning. `attnbench run` prints the
// quick checks' warnings at its start and keeps every finding in meta.json ("doctor").
// The readers take the /sys and /proc roots as arguments so tests run them on made-up trees.
#pragma once
#include <string>
#include <vector>

#include "bench/lib/interference.hpp"
#include "common/interface/params.hpp"

namespace attn {

struct DoctorFinding {
  std::string check;     // governor, turbo, smt, steal, load, openblas_coretype, blas_core, thp, sgemm_spread
  std::string status;    // "ok", "warn" or "unknown" (the machine does not expose it)
  std::string observed;  // what was read, in words
  std::string fix;       // one line; "" when ok
};

struct DoctorOptions {
  int threads = 1;       // the thread count the measurements will use
  bool quick = false;    // skip the checks that take time (steal and load over 1 s, the sgemm loop)
  double seconds = 1.0;  // how long the timed checks observe
  std::string sys_root = "/sys";
  std::string proc_root = "/proc";
  std::vector<int> cpus;  // the CPUs we may run on (empty: sched_getaffinity)
};

std::vector<DoctorFinding> doctor_checks(const DoctorOptions& options);

// The individual checks (doctor_checks runs them in this order).
DoctorFinding check_governor(const std::string& sys_root, const std::vector<int>& cpus);
DoctorFinding check_turbo(const std::string& sys_root);
DoctorFinding check_smt(const std::string& sys_root, const std::vector<int>& cpus, int threads);
// Steal and foreign load from two /proc/stat readings `seconds` apart (own_cpu_s: this process's CPU time in
// between, subtracted from the busy time).
DoctorFinding steal_finding(const CpuTicks& before, const CpuTicks& after, double seconds,
                            double ticks_per_s);
DoctorFinding load_finding(const CpuTicks& before, const CpuTicks& after, double seconds, double ticks_per_s,
                           double own_cpu_s);
// The kernel core OpenBLAS runs (openblas_get_corename) against the widest SIMD target this CPU has
// (simd::isa_info().best): a DYNAMIC_ARCH build that does not recognise a CPU (a VM that hides the model, a
// CPU newer than the library) falls back to SSE-era kernels, which run sgemm and naive at a fraction of the
// machine and inflate every frac_sgemm.
DoctorFinding check_blas_core(const std::string& core, const std::string& best_isa);
// OPENBLAS_CORETYPE (env_value, null when unset): a warning when it forces kernels check_blas_core rejects.
DoctorFinding check_openblas_coretype(const char* env_value, const std::string& core,
                                      const std::string& best_isa);
DoctorFinding check_thp(const std::string& sys_root);
// Square sgemm (1024^3) repeated for `seconds` at `threads`: the spread (p90 - p10) / median of the rates.
DoctorFinding check_sgemm_spread(int threads, double seconds);

Json doctor_json(const std::vector<DoctorFinding>& findings);
// "attnbench: warning: <check>: <observed>; fix: <fix>" for every warn finding, one per line.
std::string doctor_warnings_text(const std::vector<DoctorFinding>& findings);

}  // namespace attn
