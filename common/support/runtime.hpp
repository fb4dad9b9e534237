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

// Row-major single-precision GEMM: C = alpha * op(A) * op(B) + beta * C.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace attn
