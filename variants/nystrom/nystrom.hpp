// What the nystrom variant (nystrom.cpp) shares with its tests: the landmark segment rule and the iterative
// Moore–Penrose pseudo-inverse, in fp32 (the kernel's) and fp64 (the reference's).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace attn::nystrom {

// Landmarks of a sequence of n >= 1 rows (n valid keys on the key side) with `m` requested: min(m, n), so a
// sequence shorter than m gets one landmark per row.
inline int64_t landmark_count(int64_t n, int64_t m) {
  return std::min(n, m);
}

// Landmark i of `count` over n rows is the mean of rows [segment_begin(i), segment_begin(i + 1)): boundaries
// ⌊i·n/count⌋, so segments have ⌊n/count⌋ or ⌈n/count⌉ rows (the paper's equal segments when count divides
// n) and none is empty (count <= n). n <= 2^40 and count <= 2^12 (the landmarks parameter's maximum), so i·n
// fits in 64 bits.
inline int64_t segment_begin(int64_t i, int64_t n, int64_t count) {
  return i * n / count;
}

// Z ≈ A⁺ for a rows × cols matrix A (row-major), Z cols × rows, by the iteration of Razavi et al. (2014) the
// Nyströmformer uses: Z0 = Aᵀ / (‖A‖₁ ‖A‖∞), Z_{k+1} = ¼ Z_k (13I − A Z_k (15I − A Z_k (7I − A Z_k))),
// `iterations` times (I is rows × rows). The norms are those of this one matrix (one head).
// fp32 with sgemm; `work` holds pinv_work_floats(rows, cols) floats.
std::size_t pinv_work_floats(int64_t rows, int64_t cols);
void pinv_fp32(const float* a, int64_t rows, int64_t cols, int64_t iterations, float* z, float* work);

// The same in fp64 (plain loops). With `trace`, also the norms of every fp64 iterate that the rounding terms
// of Nystrom::abs_tolerance need (entry k describes the step from Z_k to Z_{k+1}; X = A Z_k).
struct PinvStep {
  double az_fro = 0;   // ‖|A| |Z_k|‖_F
  double t1_fro = 0;   // ‖T1‖_F, T1 = 7I − X
  double xt1_fro = 0;  // ‖|X| |T1|‖_F
  double t2_fro = 0;   // ‖T2‖_F, T2 = 15I − X T1
  double xt2_fro = 0;  // ‖|X| |T2|‖_F
  double t3_fro = 0;   // ‖T3‖_F, T3 = 13I − X T2
  double zt3_fro = 0;  // ‖|Z_k| |T3|‖_F
};
struct PinvTrace {
  double z0_fro = 0;            // ‖Z_0‖_F
  std::vector<PinvStep> steps;  // one per iteration
};
void pinv_fp64(const double* a, int64_t rows, int64_t cols, int64_t iterations, double* z,
               PinvTrace* trace = nullptr);

}  // namespace attn::nystrom
