// `attnbench [--threads N] doctor [--json] [--seconds S]`: the machine checks that explain moving timings
// (bench/lib/doctor.hpp), each with what was read and a one-line fix. Always exits 0: it reports, it does
// not judge whether a run may go ahead.
#include <tbb/global_control.h>

#include <iostream>

#include "bench/lib/command.hpp"
#include "bench/lib/doctor.hpp"
#include "bench/lib/sysinfo.hpp"
#include "common/support/runtime.hpp"

namespace attn::cli {
namespace {

int run_doctor(bool as_json, double seconds) {
  DoctorOptions o;
  // run_cli's ThreadScope holds the --threads value (all available cores by default).
  o.threads =
      static_cast<int>(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
  o.seconds = seconds;
  const std::vector<DoctorFinding> findings = doctor_checks(o);
  if (as_json) {
    std::cout
        << Json{{"cpu_model", cpu_model()}, {"threads", o.threads}, {"checks", doctor_json(findings)}}.dump(2)
        << "\n";
    return 0;
  }
  std::cout << "attnbench doctor: " << (cpu_model().empty() ? "(unknown CPU)" : cpu_model()) << ", "
            << o.threads << " thread(s)\n";
  int warnings = 0;
  for (const DoctorFinding& f : findings) {
    std::cout << (f.status == "ok"     ? "[ok]      "
                  : f.status == "warn" ? "[warn]    "
                                       : "[unknown] ")
              << f.check << ": " << f.observed << "\n";
    if (!f.fix.empty()) std::cout << "          fix: " << f.fix << "\n";
    warnings += f.status == "warn";
  }
  std::cout << warnings << " warning(s)\n";
  return 0;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND("doctor",
                      "what on this machine makes timings move (frequency governor, turbo, SMT, steal, load, "
                      "OPENBLAS_CORETYPE, huge pages, sgemm spread), each with a one-line fix",
                      [](CLI::App& sub) {
                        auto as_json = std::make_shared<bool>(false);
                        auto seconds = std::make_shared<double>(1.0);
                        sub.add_flag("--json", *as_json, "machine-readable output");
                        sub.add_option("--seconds", *seconds,
                                       "how long the steal, load and sgemm checks observe (default 1)")
                            ->check(CLI::Range(0.05, 60.0));
                        return std::function<int()>(
                            [as_json, seconds] { return attn::cli::run_doctor(*as_json, *seconds); });
                      })
