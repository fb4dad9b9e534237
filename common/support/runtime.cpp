// TBB and OpenBLAS thread control.
#include "common/support/runtime.hpp"

#include <cblas.h>
#include <sched.h>
#include <tbb/global_control.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <thread>

namespace attn {

namespace {
// BLAS runs single-threaded by default: parallelism comes from TBB over batch x heads x blocks.
const bool kBlasSingleThreaded = [] {
  openblas_set_num_threads(1);
  return true;
}();
}  // namespace

int available_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

struct ThreadScope::Impl {
  tbb::global_control control;
  explicit Impl(int n) : control(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(n)) {}
};

ThreadScope::ThreadScope(int threads)
    : impl_(std::make_unique<Impl>(threads > 0 ? threads : available_threads())),
      threads_(threads > 0 ? threads : available_threads()) {
  (void)kBlasSingleThreaded;
}
ThreadScope::~ThreadScope() = default;

void set_blas_threads(int threads) {
  openblas_set_num_threads(threads);
}
int blas_threads() {
  return openblas_get_num_threads();
}
std::string blas_info() {
  std::string s = openblas_get_config();
  s += " (core: ";
  s += openblas_get_corename();
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE")) {
    s += std::string(", OPENBLAS_CORETYPE=") + forced;
    if (const char* from = std::getenv("ATTN_BLAS_AUTOCORE_FROM"))
      s += std::string(" set by attnbench: OpenBLAS had picked ") + from;
  }
  return s + ")";
}

std::string blas_fallback_core(const std::string& core, bool avx512, bool avx2) {
  // OpenBLAS's x86 cores with AVX2 + FMA kernels or wider (the set `attnbench doctor` checks the picked core
  // against). An AVX2 core on an AVX-512 CPU is OpenBLAS's own choice for that CPU (Zen 4 on 0.3.21), not a
  // fallback: left alone (doctor still says what it costs).
  static const std::set<std::string> wide{"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
  if (wide.count(core)) return "";
  if (avx512) return "SkylakeX";
  if (avx2) return "Haswell";
  return "";
}

std::string blas_core() {
  return openblas_get_corename();
}

std::string blas_autocore_pick() {
#if defined(__x86_64__)
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  const char* opt = std::getenv("ATTN_BLAS_AUTOCORE");
  if ((set && *set) || (opt && std::string(opt) == "0")) return "";
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return blas_fallback_core(openblas_get_corename(), avx512, avx2);
#else
  return "";
#endif
}

void reexec_with_blas_core(char** argv) {
  if (!argv || !argv[0]) return;
  const std::string fix = blas_autocore_pick();
  if (fix.empty()) return;
  const std::string core = openblas_get_corename();
  setenv("OPENBLAS_CORETYPE", fix.c_str(), 1);
  setenv("ATTN_BLAS_AUTOCORE_FROM", core.c_str(), 1);
  execv("/proc/self/exe", argv);
  // The exec failed: go on with OpenBLAS's pick, and leave the environment as it was.
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("ATTN_BLAS_AUTOCORE_FROM");
}

std::string blas_kernel_note() {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced == nullptr) return "";
  const std::string core = openblas_get_corename();
  const bool avx2_core = core == "Haswell" || core == "Zen" || core == "Sandybridge";
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  const bool avx512 = false;
#endif
  if (!avx2_core || !avx512) return "";
  return "OPENBLAS_CORETYPE=" + std::string(forced) + " in the environment makes OpenBLAS use its " + core +
         " (AVX2) kernels on this AVX-512 CPU: sgemm and the BLAS-based variants run at about half the speed "
         "OpenBLAS reaches when it picks its kernels itself (unset OPENBLAS_CORETYPE for that)";
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

}  // namespace attn
