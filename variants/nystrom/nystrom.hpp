// What the nystrom variant (nystrom.cpp) shares with its tests: the landmark segment rule and the iterative
// Moore–Penrose pseudo-inverse with its reverse mode, in fp32 (the kernel's) and fp64 (the reference's), and
// the fp64 gradient with injected mistakes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/interface/attention.hpp"

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
// fp32 with sgemm; `work` holds pinv_work_floats(rows, cols) floats. With `iterates` (pinv_iterate_floats
// floats), every step's Z_k, X = A Z_k, T2 = 15I − X (7I − X) and T3 = 13I − X T2 are kept there for
// pinv_backward_fp32 (the same computation: Z is bitwise the same with or without).
std::size_t pinv_work_floats(int64_t rows, int64_t cols);
std::size_t pinv_iterate_floats(int64_t rows, int64_t cols, int64_t iterations);
void pinv_fp32(const float* a, int64_t rows, int64_t cols, int64_t iterations, float* z, float* work,
               float* iterates = nullptr);

// Reverse mode of pinv_fp32: da (rows × cols) = dL/dA for dz = dL/dZ (cols × rows), from A and the iterates
// pinv_fp32 kept: back through the steps, then through Z0 = α Aᵀ including α = 1/(‖A‖₁ ‖A‖∞), whose norms
// are differentiated at their argmax (the first largest column and row sum, as the forward takes them).
// `work` holds pinv_backward_work_floats(rows, cols) floats.
std::size_t pinv_backward_work_floats(int64_t rows, int64_t cols);
void pinv_backward_fp32(const float* a, int64_t rows, int64_t cols, int64_t iterations, const float* iterates,
                        const float* dz, float* da, float* work);

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
// With `iterates`, Z_0 .. Z_{iterations-1} (cols × rows each, in order) for pinv_backward_fp64.
void pinv_fp64(const double* a, int64_t rows, int64_t cols, int64_t iterations, double* z,
               PinvTrace* trace = nullptr, std::vector<double>* iterates = nullptr);
// Mistakes a backward could make, injected into the fp64 gradient (reference_backward_with) so the tests can
// show the gradient tolerance catches each: the pinv's reverse mode one step short (it stops before step 0
// and takes Z0's path with the adjoint of Z_1), Aᵀ read as A in that reverse mode (square A only), the
// landmark gradients spread over segments with boundaries ⌈i·n/c⌉, and Z0's scaling α treated as a constant.
enum class GradientDefect { none, reverse_step_short, transposed_a, ceil_segments, constant_alpha };

// Reverse mode of pinv_fp64 (as pinv_backward_fp32, every step in fp64 from the kept Z_k): da = dL/dA for
// dz = dL/dZ. With `trace`, the adjoints of every reverse step (Nystrom::grad_tolerance reads them).
struct PinvBackStep {  // the reverse of step k, from Λ' = dL/dZ_{k+1}: Λ' (cols × rows), dT3, dT2, dX (rows²)
  std::vector<double> lam, dt3, dt2, dx;
};
struct PinvBackTrace {
  std::vector<PinvBackStep> steps;  // index k
  std::vector<double> lam0;         // Λ_0 = dL/dZ_0 (cols × rows)
  double d_alpha = 0, d_norm_1 = 0, d_norm_inf = 0;
  int64_t col = 0, row = 0;  // where ‖A‖₁ and ‖A‖∞ were taken
};
void pinv_backward_fp64(const double* a, int64_t rows, int64_t cols, int64_t iterations,
                        const std::vector<double>& iterates, const double* dz, double* da,
                        GradientDefect defect = GradientDefect::none, PinvBackTrace* trace = nullptr);

// The nystrom variant's reference_backward with `defect` injected (for the tests; GradientDefect::none is
// reference_backward itself).
void reference_backward_with(const Problem& p, const AttentionInputs& in, const float* d_out, double* dq,
                             double* dk, double* dv, GradientDefect defect);

}  // namespace attn::nystrom
