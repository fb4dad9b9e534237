// TBB and OpenBLAS thread control.
#include "common/support/runtime.hpp"

#include <cblas.h>
#include <sched.h>
#include <tbb/global_control.h>

#include <cstdlib>
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
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"))
    s += std::string(", OPENBLAS_CORETYPE=") + forced;
  return s + ")";
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
