// The machine checks behind `attnbench doctor` and the warnings `attnbench run` prints at its start.
#include "bench/lib/doctor.hpp"

#include <cblas.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "bench/lib/measure.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/aligned.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"

namespace attn {

namespace {

// The file's first line without trailing white space; nullopt when it cannot be read.
std::optional<std::string> first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return std::nullopt;
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

std::string percent(double frac) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << 100.0 * frac << "%";
  return s.str();
}

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}
std::set<int> parse_cpu_list(const std::string& text) {
  std::set<int> out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    try {
      const auto dash = part.find('-');
      const int a = std::stoi(part.substr(0, dash));
      const int b = dash == std::string::npos ? a : std::stoi(part.substr(dash + 1));
      for (int c = a; c <= b && c - a < 4096; ++c) out.insert(c);
    } catch (const std::exception&) {
    }
  }
  return out;
}

double own_cpu_seconds() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace

DoctorFinding check_governor(const std::string& sys_root, const std::vector<int>& cpus) {
  DoctorFinding f{"governor", "unknown", "", ""};
  std::map<std::string, int> governors;
  for (int c : cpus)
    if (auto g = first_line(sys_root + "/devices/system/cpu/cpu" + std::to_string(c) +
                            "/cpufreq/scaling_governor"))
      ++governors[*g];
  if (governors.empty()) {
    f.observed = "not exposed (no cpufreq in " + sys_root +
                 "/devices/system/cpu: typical of a VM, where the host sets the frequency)";
    return f;
  }
  std::string seen;
  for (const auto& [g, n] : governors)
    seen += (seen.empty() ? "" : ", ") + g + " (" + std::to_string(n) + " CPUs)";
  f.observed = seen;
  const bool all_performance = governors.size() == 1 && governors.begin()->first == "performance";
  f.status = all_performance ? "ok" : "warn";
  if (!all_performance)
    f.fix =
        "sudo cpupower frequency-set -g performance (or write 'performance' to each "
        "cpu*/cpufreq/scaling_governor): other governors change the clock with the load being measured";
  return f;
}

DoctorFinding check_turbo(const std::string& sys_root) {
  DoctorFinding f{"turbo", "unknown", "", ""};
  if (auto no_turbo = first_line(sys_root + "/devices/system/cpu/intel_pstate/no_turbo")) {
    const bool on = *no_turbo == "0";
    f.observed = std::string("intel_pstate turbo ") + (on ? "on" : "off");
    f.status = on ? "warn" : "ok";
    if (on)
      f.fix =
          "echo 1 | sudo tee /sys/devices/system/cpu/intel_pstate/no_turbo (turbo clocks follow temperature "
          "and how many cores are busy, so 1- and 2-thread timings are not on the same clock)";
    return f;
  }
  if (auto boost = first_line(sys_root + "/devices/system/cpu/cpufreq/boost")) {
    const bool on = *boost == "1";
    f.observed = std::string("cpufreq boost ") + (on ? "on" : "off");
    f.status = on ? "warn" : "ok";
    if (on)
      f.fix =
          "echo 0 | sudo tee /sys/devices/system/cpu/cpufreq/boost (boost clocks follow temperature and how "
          "many cores are busy)";
    return f;
  }
  f.observed = "not exposed (neither intel_pstate/no_turbo nor cpufreq/boost: typical of a VM)";
  return f;
}

DoctorFinding check_smt(const std::string& sys_root, const std::vector<int>& cpus, int threads) {
  DoctorFinding f{"smt", "unknown", "", ""};
  // Physical cores among the CPUs we may run on: CPUs listed as each other's siblings share one.
  std::set<std::set<int>> cores;
  const std::set<int> allowed(cpus.begin(), cpus.end());
  bool read_any = false;
  for (int c : cpus) {
    const auto list = first_line(sys_root + "/devices/system/cpu/cpu" + std::to_string(c) +
                                 "/topology/thread_siblings_list");
    if (!list) continue;
    read_any = true;
    std::set<int> sib;
    for (int s : parse_cpu_list(*list))
      if (allowed.count(s)) sib.insert(s);
    sib.insert(c);
    cores.insert(sib);
  }
  if (!read_any) {
    f.observed = "not exposed (no topology/thread_siblings_list)";
    return f;
  }
  const int n_cpus = static_cast<int>(cpus.size()), n_cores = static_cast<int>(cores.size());
  f.observed = std::to_string(n_cpus) + " CPUs allowed on " + std::to_string(n_cores) +
               " physical core(s), " + std::to_string(threads) + " thread(s) in use";
  if (n_cores == n_cpus) {
    f.status = "ok";
    return f;
  }
  f.status = "warn";
  std::string one_per_core;
  for (const auto& core : cores)
    one_per_core += (one_per_core.empty() ? "" : ",") + std::to_string(*core.begin());
  f.fix = threads > n_cores
              ? "use --threads <= " + std::to_string(n_cores) +
                    ": more threads than physical cores puts two on one core's shared units"
              : "taskset -c " + one_per_core +
                    " attnbench ... (TBB does not pin threads, so two may land on SMT siblings of one core)";
  return f;
}

DoctorFinding steal_finding(const CpuTicks& before, const CpuTicks& after, double seconds,
                            double ticks_per_s) {
  DoctorFinding f{"steal", "ok", "", ""};
  const double capacity = std::max(seconds, 1e-9) * std::max(after.cpus, 1);
  const double frac =
      std::clamp(static_cast<double>(after.steal - before.steal) / ticks_per_s / capacity, 0.0, 1.0);
  std::ostringstream s;
  s << percent(frac) << " of the CPUs' time over " << std::setprecision(3) << seconds << " s";
  f.observed = s.str();
  if (frac > 0.02) {
    f.status = "warn";
    f.fix =
        "the hypervisor gave our vCPUs' time to other guests: use a dedicated (metal or pinned) instance, "
        "and "
        "trust only ratios measured in one run";
  }
  return f;
}

DoctorFinding load_finding(const CpuTicks& before, const CpuTicks& after, double seconds, double ticks_per_s,
                           double own_cpu_s) {
  DoctorFinding f{"load", "ok", "", ""};
  const double capacity = std::max(seconds, 1e-9) * std::max(after.cpus, 1);
  const double busy = static_cast<double>(after.busy - before.busy) / ticks_per_s;
  // One tick per CPU per reading is the resolution of /proc/stat.
  const double resolution = 2.0 * std::max(after.cpus, 1) / ticks_per_s / capacity;
  const double frac = std::clamp((busy - own_cpu_s) / capacity, 0.0, 1.0);
  std::ostringstream s;
  s << "other processes used " << percent(frac) << " of the CPUs we may run on over " << std::setprecision(3)
    << seconds << " s (resolution " << percent(resolution) << ")";
  f.observed = s.str();
  if (frac - resolution > 0.05) {
    f.status = "warn";
    f.fix = "find and stop them (top -o %CPU): their load shares our cores and memory bandwidth";
  }
  return f;
}

DoctorFinding check_blas_core(const std::string& core, const std::string& best_isa) {
  DoctorFinding f{"blas_core", "ok",
                  "OpenBLAS runs its " + core + " kernels; the CPU's best target is " + best_isa, ""};
  // OpenBLAS's x86 cores with AVX-512 kernels; which cores have AVX2 ones, and what a CPU OpenBLAS fell back
  // on should run, blas_fallback_core knows (the rule attnbench's own re-execution follows).
  static const std::set<std::string> avx512{"SkylakeX", "Cooperlake", "SapphireRapids"};
  const bool x86_avx512 = best_isa == "avx3" || best_isa.rfind("avx3_", 0) == 0;
  const bool x86_avx2 = x86_avx512 || best_isa == "avx2";
  if (const std::string pick = blas_fallback_core(core, x86_avx512, x86_avx2); !pick.empty()) {
    f.status = "warn";
    f.fix = "run with OPENBLAS_CORETYPE=" + pick +
            " (this OpenBLAS did not recognise the CPU and fell back to " + core +
            " kernels: sgemm, naive and every frac_sgemm suffer; attnbench sets it itself unless "
            "ATTN_BLAS_AUTOCORE=0)";
  } else if (x86_avx512 && !avx512.count(core)) {
    f.status = "warn";
    f.fix =
        "unset OPENBLAS_CORETYPE if it is set (AVX2 kernels run sgemm at about half this CPU's AVX-512 "
        "speed)";
  }
  return f;
}

DoctorFinding check_openblas_coretype(const char* env_value, const std::string& core,
                                      const std::string& best_isa) {
  DoctorFinding f{"openblas_coretype", "ok", "", ""};
  if (!env_value || !*env_value) {
    f.observed = "not set (OpenBLAS picks its kernels for this CPU)";
    return f;
  }
  f.observed = std::string("OPENBLAS_CORETYPE=") + env_value + ": OpenBLAS runs its " + core +
               " kernels whatever it detects (compare frac_sgemm only between runs with the same setting)";
  if (const char* from = std::getenv("ATTN_BLAS_AUTOCORE_FROM"))
    f.observed +=
        std::string("; set by attnbench itself: OpenBLAS did not recognise this CPU and had picked ") + from +
        " (ATTN_BLAS_AUTOCORE=0 keeps OpenBLAS's pick)";
  // Forcing is a problem only when it forces kernels narrower than the CPU's best target (check_blas_core).
  if (check_blas_core(core, best_isa).status == "warn") {
    f.status = "warn";
    f.fix =
        "unset OPENBLAS_CORETYPE, or set it to the CPU's own core (SkylakeX for AVX-512, Haswell for AVX2), "
        "if "
        "this OpenBLAS runs correctly without it (older builds crash or miscompute on some CPUs)";
  }
  return f;
}

DoctorFinding check_thp(const std::string& sys_root) {
  DoctorFinding f{"thp", "unknown", "", ""};
  const auto enabled = first_line(sys_root + "/kernel/mm/transparent_hugepage/enabled");
  if (!enabled) {
    f.observed = "not exposed";
    return f;
  }
  auto selected = [](const std::string& line) {
    const auto a = line.find('['), b = line.find(']');
    return a != std::string::npos && b != std::string::npos && b > a ? line.substr(a + 1, b - a - 1) : line;
  };
  const std::string mode = selected(*enabled);
  const auto defrag = first_line(sys_root + "/kernel/mm/transparent_hugepage/defrag");
  f.observed = "enabled: " + mode + (defrag ? ", defrag: " + selected(*defrag) : "");
  if (mode == "never") {
    f.status = "warn";
    f.fix =
        "echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled (naive's score matrix and the "
        "bandwidth buffer ask for huge pages; without them TLB misses slow the large points)";
  } else if (defrag && selected(*defrag) == "always") {
    f.status = "warn";
    f.fix =
        "echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/defrag (defrag 'always' compacts memory "
        "inside allocations, a stall that lands in whichever point allocates)";
  } else {
    f.status = "ok";
  }
  return f;
}

DoctorFinding check_sgemm_spread(int threads, double seconds) {
  DoctorFinding f{"sgemm_spread", "ok", "", ""};
  constexpr int64_t n = 1024;
  SgemmBench bench(n);  // the calibration's yardstick, smaller
  std::vector<double> rates;
  using clock = std::chrono::steady_clock;
  const auto t_end = clock::now() + std::chrono::duration<double>(seconds);
  bench.call_ms(threads);  // warm-up
  while (clock::now() < t_end || rates.size() < 5) {
    rates.push_back(bench.flops() / (bench.call_ms(threads) * 1e6));
    if (rates.size() >= 100000) break;
  }
  const TimingStats st = summarize(rates);  // the same percentiles as the rows' timings
  const double spread = st.median_ms > 0 ? (st.p90_ms - st.p10_ms) / st.median_ms : 0;
  std::ostringstream s;
  s << rates.size() << " sgemm " << n << "^3 calls over " << std::setprecision(3) << seconds << " s at "
    << threads << " thread(s): median " << std::fixed << std::setprecision(1) << st.median_ms
    << " GFLOP/s, p10 " << st.p10_ms << ", p90 " << st.p90_ms << " (spread " << percent(spread) << ")";
  f.observed = s.str();
  if (spread > 0.05) {
    f.status = "warn";
    f.fix =
        "something shares the machine (see steal and load): measure on a quiet machine, or raise "
        "measure.min_reps and set measure.target_rel_ci so each point's interval shows it";
  }
  return f;
}

std::vector<DoctorFinding> doctor_checks(const DoctorOptions& o) {
  const std::vector<int> cpus = o.cpus.empty() ? allowed_cpus() : o.cpus;
  std::vector<DoctorFinding> out{check_governor(o.sys_root, cpus), check_turbo(o.sys_root),
                                 check_smt(o.sys_root, cpus, o.threads)};
  if (!o.quick) {
    const long hz = sysconf(_SC_CLK_TCK);
    const double ticks = hz > 0 ? static_cast<double>(hz) : 100.0;
    const CpuTicks before = parse_proc_stat(read_kernel_file(o.proc_root + "/stat"), cpus);
    const double own0 = own_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const CpuTicks after = parse_proc_stat(read_kernel_file(o.proc_root + "/stat"), cpus);
    out.push_back(steal_finding(before, after, secs, ticks));
    out.push_back(load_finding(before, after, secs, ticks, own_cpu_seconds() - own0));
  }
  const std::string core = openblas_get_corename(), best = simd::isa_info().best;
  out.push_back(check_openblas_coretype(std::getenv("OPENBLAS_CORETYPE"), core, best));
  out.push_back(check_blas_core(core, best));
  out.push_back(check_thp(o.sys_root));
  if (!o.quick) out.push_back(check_sgemm_spread(o.threads, o.seconds));
  return out;
}

Json doctor_json(const std::vector<DoctorFinding>& findings) {
  Json j = Json::array();
  for (const DoctorFinding& f : findings)
    j.push_back({{"check", f.check}, {"status", f.status}, {"observed", f.observed}, {"fix", f.fix}});
  return j;
}

std::string doctor_warnings_text(const std::vector<DoctorFinding>& findings) {
  std::string s;
  for (const DoctorFinding& f : findings)
    if (f.status == "warn")
      s += "attnbench: warning: " + f.check + ": " + f.observed + "; fix: " + f.fix + "\n";
  return s;
}

}  // namespace attn
