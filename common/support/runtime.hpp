// Threads and BLAS. Variants parallelise with TBB and call BLAS single-threaded inside their tasks (a
// multi-threaded BLAS inside TBB tasks would oversubscribe the cores). ThreadScope caps TBB for a scope.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace attn {

// Hardware threads available to this process (affinity-aware).
int available_threads();

// Limits TBB to `threads` worker threads while alive (threads <= 0: all available).
class ThreadScope {
 public:
  explicit ThreadScope(int threads);
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;
  int threads() const { return threads_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int threads_;
};

// BLAS thread count for direct calls from a single thread (the sgemm calibration). Variants never change it.
void set_blas_threads(int threads);
int blas_threads();
std::string blas_info();  // e.g. "OpenBLAS 0.3.21 ... (core: Cooperlake)", plus OPENBLAS_CORETYPE if set
// Non-empty when OPENBLAS_CORETYPE in the environment makes OpenBLAS use AVX2 kernels on a CPU with AVX-512
// (the variable wins over OpenBLAS's own detection). On this project's reference machine the image sets
// OPENBLAS_CORETYPE=Haswell: sgemm then runs at about 180-205 GFLOP/s on 2 threads instead of 340-375 with
// the Cooperlake/SkylakeX kernels OpenBLAS picks by itself, and every BLAS-based variant (naive, the
// sgemm calibration, PyTorch in the peer runner) slows down with it. attnbench does not override the
// user's choice; `attnbench run` prints this note and meta.json records the core.
std::string blas_kernel_note();

// The OpenBLAS core a CPU of these widths should run when OpenBLAS picked `core` by itself: "SkylakeX" on an
// AVX-512 x86 CPU (F, BW, VL, DQ), "Haswell" on an AVX2 + FMA one, and "" when `core` already has kernels of
// that width (or the CPU has neither). Pure, for the tests; a core OpenBLAS fell back to is one it names
// when it does not recognise the CPU (Prescott: SSE3).
std::string blas_fallback_core(const std::string& core, bool avx512, bool avx2);

// When OpenBLAS did not recognise this CPU and fell back to narrower kernels (Debian 12's OpenBLAS 0.3.21
// runs Intel's Emerald Rapids and newer on its SSE3 Prescott kernels: sgemm 36 against 302 GFLOP/s on 2
// threads of one), executes this program again (argv as given, /proc/self/exe) with OPENBLAS_CORETYPE set
// to blas_fallback_core's pick and ATTN_BLAS_AUTOCORE_FROM to the core it replaced (blas_info and `attnbench
// doctor` say so; meta.json records it). Call first thing in main(), before any thread starts. Does nothing
// when OPENBLAS_CORETYPE is set (the user's choice, or the second execution), when ATTN_BLAS_AUTOCORE=0,
// off x86, or when OpenBLAS picked a core of the CPU's width; returns (and the program goes on with the
// fallback kernels) if the exec fails.
void reexec_with_blas_core(char** argv);
// What reexec_with_blas_core would set OPENBLAS_CORETYPE to in this process ("" for nothing): the Python
// module, which cannot re-execute the interpreter, warns with it at import.
std::string blas_autocore_pick();
std::string blas_core();  // the kernel core OpenBLAS runs (openblas_get_corename)

// Row-major single-precision GEMM: C = alpha * op(A) * op(B) + beta * C.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace attn
