// nystrom: the Nyströmformer (Xiong et al. 2021). Per batch entry and query head, m landmarks Q̃, K̃ (means of
// consecutive segments of Q's and K's rows) and out = softmax(s Q K̃ᵀ) · Z · (softmax(s Q̃ Kᵀ) V), where Z
// approximates the pseudo-inverse of softmax(s Q̃ K̃ᵀ) by the paper's iteration. Time O(n·m·d + m³), memory
// O(m·d) per head: nothing n × n, nor even n × m (B V is accumulated over key blocks with an online softmax).
//
// Segments: a side of n rows gets min(m, n) landmarks, landmark i the mean of rows [⌊i·n/c⌋, ⌊(i+1)·n/c⌋)
// (c landmarks): ⌊n/c⌋ or ⌈n/c⌉ rows each, the paper's equal segments when c divides n, one row each when
// n <= m; queries and keys have their own n in cross-attention. Key padding removes the padded keys before
// anything else: K̃'s segments are taken over the valid keys in order (min(m, valid) of them) and B's softmax
// runs over the valid keys only, so the output equals that of the same problem with the padded keys deleted
// (a batch entry with none gets zeros). The official code instead zero-pads the sequence to a multiple of m
// and masks Q and K, so padded rows still count in its means; that is not reproduced. Z0's scaling ‖A‖₁‖A‖∞
// is taken per head (the official code takes the max over the whole batch), so a head's output does not
// depend on the rest of the batch. The paper's optional depthwise-convolution skip on V is left out.
#include "variants/nystrom/nystrom.hpp"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <string>

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/vmath.hpp"
#include "common/support/aligned.hpp"
#include "common/support/runtime.hpp"

namespace attn {
namespace nystrom {

std::size_t pinv_work_floats(int64_t rows, int64_t cols) {
  // X, T, P (rows × rows) and the next Z (cols × rows).
  return sat_add(sat_mul(3, to_size(rows), to_size(rows)), sat_mul(to_size(cols), to_size(rows)));
}

std::size_t pinv_iterate_floats(int64_t rows, int64_t cols, int64_t iterations) {
  // Per step Z_k (cols × rows) and X, T2, T3 (rows × rows).
  return sat_mul(to_size(iterations),
                 sat_add(sat_mul(to_size(cols), to_size(rows)), sat_mul(3, to_size(rows), to_size(rows))));
}

std::size_t pinv_backward_work_floats(int64_t rows, int64_t cols) {
  // The adjoint of Z and the next one (cols × rows), and T1, dT3, dX, dT2, dT1 (rows × rows).
  return sat_add(sat_mul(2, to_size(cols), to_size(rows)), sat_mul(5, to_size(rows), to_size(rows)));
}

namespace {

// ‖A‖₁ (max column sum) and ‖A‖∞ (max row sum) of |A| in fp32, and where they are taken (the first largest
// sum). A is a softmax here (A ≥ 0, rows sum to 1), but the absolute values keep the definition general. A
// NaN in A makes both NaN (and Z NaN: nothing is hidden).
struct Norms32 {
  float norm_1 = 0, norm_inf = 0;
  int64_t col = 0, row = 0;
};
Norms32 norms_fp32(const float* a, int64_t R, int64_t C) {
  Norms32 n;
  for (int64_t i = 0; i < R; ++i) {
    float s = 0;
    for (int64_t j = 0; j < C; ++j) s += std::fabs(a[i * C + j]);
    if (s > n.norm_inf) n.row = i;
    n.norm_inf = std::isnan(s) ? s : std::max(n.norm_inf, s);
  }
  for (int64_t j = 0; j < C; ++j) {
    float s = 0;
    for (int64_t i = 0; i < R; ++i) s += std::fabs(a[i * C + j]);
    if (s > n.norm_1) n.col = j;
    n.norm_1 = std::isnan(s) || std::isnan(n.norm_1) ? std::numeric_limits<float>::quiet_NaN()
                                                     : std::max(n.norm_1, s);
  }
  if (std::isnan(n.norm_inf)) n.norm_1 = n.norm_inf;
  return n;
}

template <class T>
T sign_of(T x) {
  return static_cast<T>((x > 0) - (x < 0));
}

}  // namespace

void pinv_fp32(const float* a, int64_t rows, int64_t cols, int64_t iterations, float* z, float* work,
               float* iterates) {
  const int64_t R = rows, C = cols;
  const Norms32 norms = norms_fp32(a, R, C);
  const float alpha = 1.0f / (norms.norm_1 * norms.norm_inf);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) z[j * R + i] = a[i * C + j] * alpha;
  float* x = work;
  float* t = x + R * R;
  float* pr = t + R * R;
  float* next = pr + R * R;
  // t = c·I − src (rows × rows).
  auto shift = [R](float c, const float* src, float* dst) {
    for (int64_t e = 0; e < R * R; ++e) dst[e] = -src[e];
    for (int64_t i = 0; i < R; ++i) dst[i * R + i] += c;
  };
  for (int64_t k = 0; k < iterations; ++k) {
    float* kept = iterates ? iterates + k * (C * R + 3 * R * R) : nullptr;
    if (kept) std::copy(z, z + C * R, kept);
    sgemm(false, false, R, R, C, 1.0f, a, C, z, R, 0.0f, x, R);   // X = A Z
    shift(7.0f, x, t);                                            // T1 = 7I − X
    sgemm(false, false, R, R, R, 1.0f, x, R, t, R, 0.0f, pr, R);  // X T1
    shift(15.0f, pr, t);                                          // T2 = 15I − X T1
    if (kept) std::copy(x, x + R * R, kept + C * R), std::copy(t, t + R * R, kept + C * R + R * R);
    sgemm(false, false, R, R, R, 1.0f, x, R, t, R, 0.0f, pr, R);  // X T2
    shift(13.0f, pr, t);                                          // T3 = 13I − X T2
    if (kept) std::copy(t, t + R * R, kept + C * R + 2 * R * R);
    sgemm(false, false, C, R, R, 0.25f, z, R, t, R, 0.0f, next, R);  // Z ← ¼ Z T3
    std::copy(next, next + C * R, z);
  }
}

// The adjoint of one step Z' = ¼ Z T3 with T3 = 13I − X T2, T2 = 15I − X T1, T1 = 7I − X, X = A Z, given
// Λ' = dL/dZ': dZ = ¼ Λ' T3ᵀ + Aᵀ dX and dA += dX Zᵀ, where dT3 = ¼ Zᵀ Λ', dX = −dT3 T2ᵀ − dT2 T1ᵀ − dT1,
// dT2 = −Xᵀ dT3, dT1 = −Xᵀ dT2. Then Z0 = α Aᵀ: dA += α Λ0ᵀ and dα = ⟨Λ0, Aᵀ⟩, with ∂α/∂‖A‖₁ = −α/‖A‖₁ on the
// argmax column's |A| and ∂α/∂‖A‖∞ = −α/‖A‖∞ on the argmax row's.
void pinv_backward_fp32(const float* a, int64_t rows, int64_t cols, int64_t iterations, const float* iterates,
                        const float* dz, float* da, float* work) {
  const int64_t R = rows, C = cols;
  float* lam = work;
  float* next = lam + C * R;
  float* t1 = next + C * R;
  float* dt3 = t1 + R * R;
  float* dx = dt3 + R * R;
  float* dt2 = dx + R * R;
  float* dt1 = dt2 + R * R;
  std::copy(dz, dz + C * R, lam);
  std::fill(da, da + R * C, 0.0f);
  for (int64_t k = iterations - 1; k >= 0; --k) {
    const float* zk = iterates + k * (C * R + 3 * R * R);
    const float* x = zk + C * R;
    const float* t2 = x + R * R;
    const float* t3 = t2 + R * R;
    for (int64_t e = 0; e < R * R; ++e) t1[e] = -x[e];
    for (int64_t i = 0; i < R; ++i) t1[i * R + i] += 7.0f;
    sgemm(false, true, C, R, R, 0.25f, lam, R, t3, R, 0.0f, next, R);  // ¼ Λ' T3ᵀ
    sgemm(true, false, R, R, C, 0.25f, zk, R, lam, R, 0.0f, dt3, R);   // dT3 = ¼ Zᵀ Λ'
    sgemm(false, true, R, R, R, -1.0f, dt3, R, t2, R, 0.0f, dx, R);    // dX = −dT3 T2ᵀ
    sgemm(true, false, R, R, R, -1.0f, x, R, dt3, R, 0.0f, dt2, R);    // dT2 = −Xᵀ dT3
    sgemm(false, true, R, R, R, -1.0f, dt2, R, t1, R, 1.0f, dx, R);    // dX −= dT2 T1ᵀ
    sgemm(true, false, R, R, R, -1.0f, x, R, dt2, R, 0.0f, dt1, R);    // dT1 = −Xᵀ dT2
    for (int64_t e = 0; e < R * R; ++e) dx[e] -= dt1[e];               // dX −= dT1
    sgemm(false, true, R, C, R, 1.0f, dx, R, zk, R, 1.0f, da, C);      // dA += dX Zᵀ
    sgemm(true, false, C, R, R, 1.0f, a, C, dx, R, 1.0f, next, R);     // dZ += Aᵀ dX
    std::swap(lam, next);
  }
  const Norms32 norms = norms_fp32(a, R, C);
  const float alpha = 1.0f / (norms.norm_1 * norms.norm_inf);
  float d_alpha = 0;
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) {
      da[i * C + j] += alpha * lam[j * R + i];
      d_alpha += lam[j * R + i] * a[i * C + j];
    }
  const float d_norm_1 = -alpha / norms.norm_1 * d_alpha, d_norm_inf = -alpha / norms.norm_inf * d_alpha;
  for (int64_t i = 0; i < R; ++i) da[i * C + norms.col] += d_norm_1 * sign_of(a[i * C + norms.col]);
  for (int64_t j = 0; j < C; ++j) da[norms.row * C + j] += d_norm_inf * sign_of(a[norms.row * C + j]);
}

namespace {

// c = a b (n × k times k × p) in fp64; with `abs`, |a| |b|.
void matmul64(const double* a, const double* b, int64_t n, int64_t k, int64_t p, double* c,
              bool abs = false) {
  for (int64_t i = 0; i < n; ++i) {
    double* ci = c + i * p;
    std::fill(ci, ci + p, 0.0);
    for (int64_t l = 0; l < k; ++l) {
      const double ail = abs ? std::fabs(a[i * k + l]) : a[i * k + l];
      const double* bl = b + l * p;
      if (abs)
        for (int64_t j = 0; j < p; ++j) ci[j] += ail * std::fabs(bl[j]);
      else
        for (int64_t j = 0; j < p; ++j) ci[j] += ail * bl[j];
    }
  }
}

double fro(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

// max row sum and max column sum of |x| (n × p).
std::pair<double, double> norm_inf_1(const double* x, int64_t n, int64_t p) {
  double ninf = 0, n1 = 0;
  std::vector<double> col(static_cast<std::size_t>(p), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t j = 0; j < p; ++j) s += std::fabs(x[i * p + j]), col[j] += std::fabs(x[i * p + j]);
    ninf = std::max(ninf, s);
  }
  for (double c : col) n1 = std::max(n1, c);
  return {ninf, n1};
}

}  // namespace

void pinv_fp64(const double* a, int64_t rows, int64_t cols, int64_t iterations, double* z, PinvTrace* trace,
               std::vector<double>* iterates) {
  const int64_t R = rows, C = cols;
  const std::size_t RR = static_cast<std::size_t>(R * R);
  const auto [norm_inf, norm_1] = norm_inf_1(a, R, C);
  const double alpha = 1.0 / (norm_1 * norm_inf);
  std::vector<double> zk(static_cast<std::size_t>(C * R)), x(RR), t(RR), pr(RR), tmp(RR), next(zk.size());
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) zk[j * R + i] = a[i * C + j] * alpha;
  auto shift = [R](double c, const std::vector<double>& src, std::vector<double>& dst) {
    for (std::size_t e = 0; e < src.size(); ++e) dst[e] = -src[e];
    for (int64_t i = 0; i < R; ++i) dst[i * R + i] += c;
  };
  if (trace) {
    *trace = PinvTrace();
    trace->z0_fro = fro(zk);
  }
  if (iterates) iterates->clear();
  for (int64_t k = 0; k < iterations; ++k) {
    PinvStep st;
    if (iterates) iterates->insert(iterates->end(), zk.begin(), zk.end());
    matmul64(a, zk.data(), R, C, R, x.data());
    if (trace) {
      matmul64(a, zk.data(), R, C, R, tmp.data(), true);
      st.az_fro = fro(tmp);
    }
    shift(7.0, x, t);
    if (trace) {
      st.t1_fro = fro(t);
      matmul64(x.data(), t.data(), R, R, R, tmp.data(), true);
      st.xt1_fro = fro(tmp);
    }
    matmul64(x.data(), t.data(), R, R, R, pr.data());
    shift(15.0, pr, t);
    if (trace) {
      st.t2_fro = fro(t);
      matmul64(x.data(), t.data(), R, R, R, tmp.data(), true);
      st.xt2_fro = fro(tmp);
    }
    matmul64(x.data(), t.data(), R, R, R, pr.data());
    shift(13.0, pr, t);
    if (trace) {
      st.t3_fro = fro(t);
      std::vector<double> zt(next.size());
      matmul64(zk.data(), t.data(), C, R, R, zt.data(), true);
      st.zt3_fro = fro(zt);
      trace->steps.push_back(st);
    }
    matmul64(zk.data(), t.data(), C, R, R, next.data());
    for (std::size_t e = 0; e < next.size(); ++e) zk[e] = 0.25 * next[e];
  }
  std::copy(zk.begin(), zk.end(), z);
}

void pinv_backward_fp64(const double* a, int64_t rows, int64_t cols, int64_t iterations,
                        const std::vector<double>& iterates, const double* dz, double* da,
                        GradientDefect defect, PinvBackTrace* trace) {
  const int64_t R = rows, C = cols;
  const std::size_t RR = static_cast<std::size_t>(R * R), CR = static_cast<std::size_t>(C * R);
  std::vector<double> lam(dz, dz + CR), next(CR), x(RR), t1(RR), t2(RR), t3(RR), pr(RR), dt3(RR), dx(RR),
      dt2(RR), dt1(RR), tmp(std::max(RR, CR)), tr(std::max(RR, CR)), at(CR), zt(CR), xt(RR);
  std::fill(da, da + R * C, 0.0);
  // dst = srcᵀ for an n × p src.
  auto transpose = [](const double* src, int64_t n, int64_t p, double* dst) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < p; ++j) dst[j * n + i] = src[i * p + j];
  };
  auto shift = [R](double c, const std::vector<double>& src, std::vector<double>& dst) {
    for (std::size_t e = 0; e < src.size(); ++e) dst[e] = -src[e];
    for (int64_t i = 0; i < R; ++i) dst[i * R + i] += c;
  };
  transpose(a, R, C, at.data());
  if (defect == GradientDefect::transposed_a && R == C) std::copy(a, a + R * C, at.data());
  if (trace) *trace = PinvBackTrace(), trace->steps.resize(static_cast<std::size_t>(iterations));
  const int64_t last = defect == GradientDefect::reverse_step_short ? 1 : 0;
  for (int64_t k = iterations - 1; k >= last; --k) {
    const double* zk = iterates.data() + static_cast<std::size_t>(k) * CR;
    // The step's intermediates again, as pinv_fp64 computed them.
    matmul64(a, zk, R, C, R, x.data());
    shift(7.0, x, t1);
    matmul64(x.data(), t1.data(), R, R, R, pr.data());
    shift(15.0, pr, t2);
    matmul64(x.data(), t2.data(), R, R, R, pr.data());
    shift(13.0, pr, t3);
    transpose(zk, C, R, zt.data());
    transpose(x.data(), R, R, xt.data());
    transpose(t3.data(), R, R, tr.data());
    matmul64(lam.data(), tr.data(), C, R, R, next.data());  // ¼ Λ' T3ᵀ
    for (double& e : next) e *= 0.25;
    matmul64(zt.data(), lam.data(), R, C, R, dt3.data());  // dT3 = ¼ Zᵀ Λ'
    for (double& e : dt3) e *= 0.25;
    transpose(t2.data(), R, R, tr.data());
    matmul64(dt3.data(), tr.data(), R, R, R, dx.data());  // dX = −dT3 T2ᵀ
    for (double& e : dx) e = -e;
    matmul64(xt.data(), dt3.data(), R, R, R, dt2.data());  // dT2 = −Xᵀ dT3
    for (double& e : dt2) e = -e;
    transpose(t1.data(), R, R, tmp.data());
    matmul64(dt2.data(), tmp.data(), R, R, R, pr.data());  // dX −= dT2 T1ᵀ
    for (std::size_t e = 0; e < RR; ++e) dx[e] -= pr[e];
    matmul64(xt.data(), dt2.data(), R, R, R, dt1.data());  // Xᵀ dT2 = −dT1
    for (std::size_t e = 0; e < RR; ++e) dx[e] += dt1[e];  // dX −= dT1
    transpose(zk, C, R, tmp.data());
    matmul64(dx.data(), tmp.data(), R, R, C, tr.data());  // dA += dX Zᵀ
    for (int64_t e = 0; e < R * C; ++e) da[e] += tr[e];
    if (trace) trace->steps[static_cast<std::size_t>(k)] = PinvBackStep{lam, dt3, dt2, dx};
    matmul64(at.data(), dx.data(), C, R, R, tr.data());  // dZ += Aᵀ dX
    for (std::size_t e = 0; e < CR; ++e) next[e] += tr[e];
    std::swap(lam, next);
  }
  // Z0 = α Aᵀ with α = 1/(‖A‖₁ ‖A‖∞), the norms at their (first) argmax.
  double norm_inf = 0, norm_1 = 0;
  int64_t row = 0, col = 0;
  for (int64_t i = 0; i < R; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < C; ++j) sum += std::fabs(a[i * C + j]);
    if (sum > norm_inf) norm_inf = sum, row = i;
  }
  for (int64_t j = 0; j < C; ++j) {
    double sum = 0;
    for (int64_t i = 0; i < R; ++i) sum += std::fabs(a[i * C + j]);
    if (sum > norm_1) norm_1 = sum, col = j;
  }
  const double alpha = 1.0 / (norm_1 * norm_inf);
  double d_alpha = 0;
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) {
      da[i * C + j] += alpha * lam[j * R + i];
      d_alpha += lam[j * R + i] * a[i * C + j];
    }
  if (defect == GradientDefect::constant_alpha) d_alpha = 0;
  const double d_norm_1 = -alpha / norm_1 * d_alpha, d_norm_inf = -alpha / norm_inf * d_alpha;
  for (int64_t i = 0; i < R; ++i) da[i * C + col] += d_norm_1 * sign_of(a[i * C + col]);
  for (int64_t j = 0; j < C; ++j) da[row * C + j] += d_norm_inf * sign_of(a[row * C + j]);
  if (trace) {
    trace->lam0 = lam;
    trace->d_alpha = d_alpha, trace->d_norm_1 = d_norm_1, trace->d_norm_inf = d_norm_inf;
    trace->col = col, trace->row = row;
  }
}

}  // namespace nystrom

namespace {

using nystrom::landmark_count;
using nystrom::segment_begin;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Query rows per task when applying F = softmax(s Q K̃ᵀ) to W = Z (B V), and keys per block of the online
// softmax that accumulates B V: fixed by the problem (never the thread count), so results are bitwise the
// same on any number of threads; large enough for BLAS, small enough that a block of scores stays in L2.
constexpr int64_t kQueryRows = 256;
constexpr int64_t kKeyBlock = 256;
constexpr int64_t kMaxLandmarks = 4096;
constexpr int64_t kMaxIterations = 30;

// Sizes of one problem: landmarks requested, iterations, and the most landmarks either side can have.
struct Shape {
  int64_t m, iterations, mq, mkv_cap;
  explicit Shape(const Problem& p)
      : m(p.param_int("landmarks")),
        iterations(p.param_int("pinv_iterations")),
        mq(landmark_count(p.seq_q, m)),
        mkv_cap(landmark_count(p.seq_kv, m)) {}
  // Floats of one thread's scratch: the larger of the per-head phase (Q̃, A, Z, the pinv work, a block of
  // B's scores, B V's accumulator, row max and sum) and the query-block phase (a block of F).
  std::size_t scratch_floats(const Problem& p) const {
    const std::size_t D = to_size(p.head_dim), Q = to_size(mq), K = to_size(mkv_cap);
    const std::size_t head = sat_add(sat_mul(Q, D), sat_mul(2, Q, K), nystrom::pinv_work_floats(mq, mkv_cap),
                                     sat_mul(Q, to_size(kKeyBlock)), sat_mul(Q, D), sat_mul(2, Q));
    const std::size_t block = sat_mul(to_size(std::min(kQueryRows, p.seq_q)), K);
    return std::max(head, block);
  }
};

bool padded(const Problem& p, const AttentionInputs& in, int64_t b, int64_t j) {
  return p.mask.key_padding && in.key_padding[b * p.seq_kv + j] != 0;
}

// Softmax of one fp32 row in place (the vmath kernels, as every variant's softmax).
void softmax_row(float* x, int64_t n) {
  const float mx = row_max(x, n);
  const float sum = exp_sub_sum(x, n, mx);
  scale_row(x, n, 1.0f / sum);
}

// Softmax of one fp64 row in place.
void softmax_row64(double* x, int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::isnan(x[j]) || std::isnan(mx) ? x[j] + mx : std::max(mx, x[j]);
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - mx));
  for (int64_t j = 0; j < n; ++j) x[j] /= sum;
}

// Everything about one (batch entry, query head) in fp64, as the reference and the tolerance need it.
struct HeadFp64 {
  int64_t mq = 0, mkv = 0;    // landmarks: queries, valid keys (0 when every key is padded)
  std::vector<int64_t> keys;  // the valid (unpadded) keys, in order
  // Q̃ (mq × d), K̃ (mkv × d), A (mq × mkv), Z (mkv × mq), B V (mq × d), W = Z B V (mkv × d).
  std::vector<double> qt, kt, a, z, bv, w;
  nystrom::PinvTrace trace;  // filled when asked for
};

HeadFp64 head_fp64(const Problem& p, const AttentionInputs& in, int64_t b, int64_t h, bool with_trace,
                   std::vector<double>* iterates = nullptr) {
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv, m = p.param_int("landmarks");
  const int64_t bh = b * p.heads + h, kv = p.kv_block(b, h);
  const double s = p.effective_scale();
  const float* q = in.q + bh * Lq * D;
  const float* k = in.k + kv * Lkv * D;
  const float* v = in.v + kv * Lkv * D;
  HeadFp64 r;
  for (int64_t j = 0; j < Lkv; ++j)
    if (!padded(p, in, b, j)) r.keys.push_back(j);
  const int64_t n = static_cast<int64_t>(r.keys.size());
  if (n == 0) return r;
  r.mq = landmark_count(Lq, m), r.mkv = landmark_count(n, m);
  // Segment means: queries over positions, keys over the valid keys (padding removes keys before anything).
  std::vector<double>& qt = r.qt;
  qt.assign(static_cast<std::size_t>(r.mq * D), 0.0);
  r.kt.assign(static_cast<std::size_t>(r.mkv * D), 0.0);
  for (int64_t i = 0; i < r.mq; ++i) {
    const int64_t i0 = segment_begin(i, Lq, r.mq), i1 = segment_begin(i + 1, Lq, r.mq);
    for (int64_t row = i0; row < i1; ++row)
      for (int64_t d = 0; d < D; ++d) qt[i * D + d] += q[row * D + d];
    for (int64_t d = 0; d < D; ++d) qt[i * D + d] /= static_cast<double>(i1 - i0);
  }
  for (int64_t i = 0; i < r.mkv; ++i) {
    const int64_t c0 = segment_begin(i, n, r.mkv), c1 = segment_begin(i + 1, n, r.mkv);
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t d = 0; d < D; ++d) r.kt[i * D + d] += k[r.keys[c] * D + d];
    for (int64_t d = 0; d < D; ++d) r.kt[i * D + d] /= static_cast<double>(c1 - c0);
  }
  auto dot = [D](const auto* x, const auto* y) {
    double acc = 0;
    for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(x[d]) * static_cast<double>(y[d]);
    return acc;
  };
  r.a.resize(static_cast<std::size_t>(r.mq * r.mkv));
  for (int64_t i = 0; i < r.mq; ++i) {
    for (int64_t j = 0; j < r.mkv; ++j) r.a[i * r.mkv + j] = s * dot(&qt[i * D], &r.kt[j * D]);
    softmax_row64(&r.a[i * r.mkv], r.mkv);
  }
  std::vector<double>& z = r.z;
  z.resize(static_cast<std::size_t>(r.mkv * r.mq));
  nystrom::pinv_fp64(r.a.data(), r.mq, r.mkv, p.param_int("pinv_iterations"), z.data(),
                     with_trace ? &r.trace : nullptr, iterates);
  // B V: B = softmax over the valid keys of s Q̃ Kᵀ.
  r.bv.assign(static_cast<std::size_t>(r.mq * D), 0.0);
  std::vector<double> brow(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < r.mq; ++i) {
    for (int64_t c = 0; c < n; ++c) brow[c] = s * dot(&qt[i * D], k + r.keys[c] * D);
    softmax_row64(brow.data(), n);
    for (int64_t c = 0; c < n; ++c)
      for (int64_t d = 0; d < D; ++d) r.bv[i * D + d] += brow[c] * v[r.keys[c] * D + d];
  }
  r.w.resize(static_cast<std::size_t>(r.mkv * D));
  nystrom::matmul64(z.data(), r.bv.data(), r.mkv, r.mq, D, r.w.data());
  return r;
}

// The fp64 gradient of one (batch entry, query head) of reference_forward, reverse mode by hand through the
// same fp64 steps (head_fp64), with every intermediate kept (the gradient tolerance reads them): F W, W = Z
// (B V), the pinv (pinv_backward_fp64, through every iteration and Z0's scaling), the softmaxes of F, A and
// B. The landmark means' part is head_backward_fp64's. With every key padded the output is 0 whatever the
// inputs: no gradient (mkv = 0, nothing else filled).
struct HeadGrad {
  HeadFp64 r;
  std::vector<double> iterates;           // Z_0 .. Z_{K-1}
  std::vector<double> f, df, dsf;         // F, dF = dO Wᵀ, dS_F = F (dF - rowsum(F dF)) without s: Lq × mk
  std::vector<double> dw, dkt_f, dkt_a;   // dW = Fᵀ dO, dK̃ from F's and from A's softmax: mk × d
  std::vector<double> dz, da, dsa;        // dZ = dW (B V)ᵀ (mk × mq); dA, dS_A without s (mq × mk)
  std::vector<double> dbv, dqt_a, dqt_b;  // d(B V) = Zᵀ dW, dQ̃ from A's and from B's softmax: mq × d
  std::vector<double> blog, bw, db, dsb;  // B's logits, B, dB = d(B V) Vᵀ, dS_B without s: mq × n
  std::vector<double> dq_f;               // dQ from F's softmax (Lq × d), before the landmarks' spread
  nystrom::PinvBackTrace trace;           // with_trace
};

HeadGrad head_grad_fp64(const Problem& p, const AttentionInputs& in, const float* d_out, int64_t b, int64_t h,
                        nystrom::GradientDefect defect, bool with_trace) {
  const int64_t D = p.head_dim, Lq = p.seq_q;
  const int64_t bh = b * p.heads + h, kv = p.kv_block(b, h);
  const double s = p.effective_scale();
  const float* q = in.q + bh * Lq * D;
  const float* k = in.k + kv * p.seq_kv * D;
  const float* v = in.v + kv * p.seq_kv * D;
  const float* dout = d_out + bh * Lq * D;
  HeadGrad g;
  g.r = head_fp64(p, in, b, h, with_trace, &g.iterates);
  const HeadFp64& r = g.r;
  if (r.mkv == 0) return g;
  const int64_t mq = r.mq, mk = r.mkv, n = static_cast<int64_t>(r.keys.size());
  auto sz = [](int64_t x) { return static_cast<std::size_t>(x); };
  g.f.assign(sz(Lq * mk), 0.0), g.df = g.f, g.dsf = g.f;
  g.dw.assign(sz(mk * D), 0.0), g.dkt_f = g.dw, g.dkt_a = g.dw;
  g.dq_f.assign(sz(Lq * D), 0.0);
  // F part, row by row: F_i = softmax(s q_i K̃ᵀ), dF_il = dO_i · W_l, dS_F = F (dF - Σ_l F_il dF_il).
  for (int64_t i = 0; i < Lq; ++i) {
    const float* qi = q + i * D;
    const float* gi = dout + i * D;
    double* f = &g.f[sz(i * mk)];
    double* df = &g.df[sz(i * mk)];
    for (int64_t l = 0; l < mk; ++l) {
      double acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(qi[d]) * r.kt[l * D + d];
      f[l] = s * acc;
    }
    softmax_row64(f, mk);
    double delta = 0;
    for (int64_t l = 0; l < mk; ++l) {
      double acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(gi[d]) * r.w[l * D + d];
      df[l] = acc;
      delta += f[l] * acc;
    }
    for (int64_t l = 0; l < mk; ++l) {
      const double ds = g.dsf[sz(i * mk + l)] = f[l] * (df[l] - delta);
      for (int64_t d = 0; d < D; ++d) {
        g.dq_f[sz(i * D + d)] += s * ds * r.kt[l * D + d];
        g.dkt_f[sz(l * D + d)] += s * ds * qi[d];
        g.dw[sz(l * D + d)] += f[l] * gi[d];
      }
    }
  }
  // W = Z (B V): dZ = dW (B V)ᵀ, d(B V) = Zᵀ dW; then the pinv and A's softmax.
  g.dz.assign(sz(mk * mq), 0.0), g.dbv.assign(sz(mq * D), 0.0), g.da.assign(sz(mq * mk), 0.0), g.dsa = g.da;
  for (int64_t l = 0; l < mk; ++l)
    for (int64_t j = 0; j < mq; ++j)
      for (int64_t d = 0; d < D; ++d) {
        g.dz[sz(l * mq + j)] += g.dw[sz(l * D + d)] * r.bv[j * D + d];
        g.dbv[sz(j * D + d)] += r.z[l * mq + j] * g.dw[sz(l * D + d)];
      }
  nystrom::pinv_backward_fp64(r.a.data(), mq, mk, p.param_int("pinv_iterations"), g.iterates, g.dz.data(),
                              g.da.data(), defect, with_trace ? &g.trace : nullptr);
  g.dqt_a.assign(sz(mq * D), 0.0), g.dqt_b = g.dqt_a;
  for (int64_t i = 0; i < mq; ++i) {
    double t = 0;
    for (int64_t l = 0; l < mk; ++l) t += r.a[i * mk + l] * g.da[sz(i * mk + l)];
    for (int64_t l = 0; l < mk; ++l) {
      const double ds = g.dsa[sz(i * mk + l)] = r.a[i * mk + l] * (g.da[sz(i * mk + l)] - t);
      for (int64_t d = 0; d < D; ++d) {
        g.dqt_a[sz(i * D + d)] += s * ds * r.kt[l * D + d];
        g.dkt_a[sz(l * D + d)] += s * ds * r.qt[i * D + d];
      }
    }
  }
  // B part, landmark row by row over the valid keys: B_i = softmax(s q̃_i Kᵀ), dB_ic = d(B V)_i · v_c.
  g.blog.assign(sz(mq * n), 0.0), g.bw = g.blog, g.db = g.blog, g.dsb = g.blog;
  for (int64_t i = 0; i < mq; ++i) {
    double* lg = &g.blog[sz(i * n)];
    double* bw = &g.bw[sz(i * n)];
    double* db = &g.db[sz(i * n)];
    for (int64_t c = 0; c < n; ++c) {
      double acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += r.qt[i * D + d] * k[r.keys[c] * D + d];
      bw[c] = lg[c] = s * acc;
    }
    softmax_row64(bw, n);
    double delta = 0;
    for (int64_t c = 0; c < n; ++c) {
      double acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += g.dbv[sz(i * D + d)] * v[r.keys[c] * D + d];
      db[c] = acc;
      delta += bw[c] * acc;
    }
    for (int64_t c = 0; c < n; ++c) {
      const double ds = g.dsb[sz(i * n + c)] = bw[c] * (db[c] - delta);
      for (int64_t d = 0; d < D; ++d) g.dqt_b[sz(i * D + d)] += s * ds * k[r.keys[c] * D + d];
    }
  }
  return g;
}

// head_grad_fp64 accumulated into the outputs: dq_head (Lq × d) written, dk_kv and dv_kv (the K/V head's,
// seq_kv × d) added to; dQ̃ and dK̃ go back through the landmark means (each row of a segment gets its
// landmark's gradient divided by the segment's length).
void head_backward_fp64(const Problem& p, const AttentionInputs& in, const float* d_out, int64_t b, int64_t h,
                        double* dq_head, double* dk_kv, double* dv_kv, nystrom::GradientDefect defect) {
  const int64_t D = p.head_dim, Lq = p.seq_q;
  const double s = p.effective_scale();
  std::fill(dq_head, dq_head + Lq * D, 0.0);
  const HeadGrad g = head_grad_fp64(p, in, d_out, b, h, defect, false);
  const HeadFp64& r = g.r;
  if (r.mkv == 0) return;
  const int64_t mq = r.mq, mk = r.mkv, n = static_cast<int64_t>(r.keys.size());
  std::copy(g.dq_f.begin(), g.dq_f.end(), dq_head);
  for (int64_t i = 0; i < mq; ++i)
    for (int64_t c = 0; c < n; ++c) {
      const int64_t j = r.keys[c];
      const double bw = g.bw[i * n + c], ds = s * g.dsb[i * n + c];
      for (int64_t d = 0; d < D; ++d) {
        dv_kv[j * D + d] += bw * g.dbv[i * D + d];
        dk_kv[j * D + d] += ds * r.qt[i * D + d];
      }
    }
  auto begin = [defect](int64_t i, int64_t rows, int64_t count) {
    return defect == nystrom::GradientDefect::ceil_segments ? (i * rows + count - 1) / count
                                                            : segment_begin(i, rows, count);
  };
  for (int64_t i = 0; i < mq; ++i) {
    const int64_t i0 = begin(i, Lq, mq), i1 = begin(i + 1, Lq, mq);
    for (int64_t row = i0; row < i1; ++row)
      for (int64_t d = 0; d < D; ++d)
        dq_head[row * D + d] += (g.dqt_a[i * D + d] + g.dqt_b[i * D + d]) / static_cast<double>(i1 - i0);
  }
  for (int64_t l = 0; l < mk; ++l) {
    const int64_t c0 = begin(l, n, mk), c1 = begin(l + 1, n, mk);
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t d = 0; d < D; ++d)
        dk_kv[r.keys[c] * D + d] += (g.dkt_f[l * D + d] + g.dkt_a[l * D + d]) / static_cast<double>(c1 - c0);
  }
}

class Nystrom final : public Attention {
 public:
  std::string name() const override { return "nystrom"; }
  std::string description() const override {
    return "Nystromformer (Xiong et al. 2021): softmax(Q Kl^T) Z softmax(Ql K^T) V with m segment-mean "
           "landmarks Ql, Kl and Z the iterative pinv of softmax(Ql Kl^T) (norms per head); without the "
           "depthwise-conv skip; non-causal; O(n·m·d + m³)";
  }
  Capabilities capabilities() const override {
    // Not causal: every query sees every landmark, and each landmark mixes keys from its whole segment (the
    // paper's method has no causal form). Key padding removes the padded keys before anything else (file
    // comment). No boolean mask (a per-pair mask does not factor through the landmarks), no dropout on
    // weights it never forms. Not permutation-equivariant: landmarks are means of consecutive rows.
    // bf16 / fp16: widened to fp32 up front (WideInputs, counted in workspace_bytes).
    return {.exact = false,
            .causal = false,
            .causal_lower_right = false,
            .gqa = true,
            .boolean_mask = false,
            .key_padding = true,
            .cross = true,
            .dropout = false,
            .bf16 = true,
            .fp16 = true,
            .permutation_equivariant = false,
            .backward = true};
  }
  std::vector<ParamSpec> param_specs() const override {
    return {
        {.name = "landmarks",
         .type = ParamType::integer,
         .default_value = 64,
         .help = "landmarks m per side: segment means of Q's and K's rows (min(m, n) when n < m)",
         .min = 1,
         .max = static_cast<double>(kMaxLandmarks)},
        {.name = "pinv_iterations",
         .type = ParamType::integer,
         .default_value = 6,
         .help = "iterations of the Moore-Penrose approximation of softmax(Ql Kl^T)^+ (0: Z = A^T scaled)",
         .min = 0,
         .max = static_cast<double>(kMaxIterations)}};
  }
  std::vector<Json> test_param_sets() const override {
    // m = 1, 3, 8 against the check's seq 1, 7, 17, 33, 130 (and 5, 19, 37, 300, 2500 in the cross, GQA and
    // decode cases): n < m, n = m, n ≫ m and n not a multiple of m; 1 and 6 iterations.
    return {{{"landmarks", 8}},
            {{"landmarks", 3}, {"pinv_iterations", 1}},
            {{"landmarks", 1}},
            {{"landmarks", 7}, {"pinv_iterations", 3}}};
  }

  double flops(const Problem& p) const override {
    // Per head, the GEMMs of forward, with mq = min(m, Lq) and mk = min(m, Lkv) landmarks (padding is data
    // and not subtracted): Q K̃ᵀ and F·W (2·Lq·mk·d each), Q̃ K̃ᵀ (2·mq·mk·d), Q̃ Kᵀ and B·V (2·mq·Lkv·d each),
    // W = Z·(B V) (2·mk·mq·d), and per pinv iteration A·Z (2·mq²·mk), two X·T (2·mq³ each) and Z·T3
    // (2·mk·mq²). Not counted: the segment means, the softmax exponentials and normalisations, the online
    // softmax rescaling, the ‖A‖₁‖A‖∞ scaling and the c·I − X shifts (all O(n·d + m²) or less).
    const Shape sh(p);
    const double D = static_cast<double>(p.head_dim), Lq = static_cast<double>(p.seq_q),
                 Lkv = static_cast<double>(p.seq_kv), mq = static_cast<double>(sh.mq),
                 mk = static_cast<double>(sh.mkv_cap);
    const double per_iteration = 2.0 * mq * mq * mk + 4.0 * mq * mq * mq + 2.0 * mk * mq * mq;
    const double per_head = 4.0 * Lq * mk * D + 2.0 * mq * mk * D + 4.0 * mq * Lkv * D + 2.0 * mk * mq * D +
                            static_cast<double>(sh.iterations) * per_iteration;
    return per_head * static_cast<double>(p.batch * p.heads);
  }

  std::size_t workspace_bytes(const Problem& p, int threads) const override {
    // K̃ per (batch, K/V head), W per (batch, query head), the key segment boundaries and landmark counts per
    // batch entry, and one scratch per thread; bf16 / fp16 add fp32 copies of Q, K and V. Saturating
    // (common/interface/util.hpp).
    const Shape sh(p);
    const std::size_t D = to_size(p.head_dim), K = to_size(sh.mkv_cap);
    const std::size_t stores = sat_mul(sat_add(sat_mul(to_size(p.batch * p.num_kv_heads()), K, D),
                                               sat_mul(to_size(p.batch * p.heads), K, D)),
                                       sizeof(float));
    const std::size_t bounds = sat_mul(to_size(p.batch), K + 2, sizeof(int64_t));
    const std::size_t scratch = sat_mul(to_size(std::max(threads, 1)), sh.scratch_floats(p), sizeof(float));
    const std::size_t widened =
        p.dtype == DType::fp32
            ? 0
            : sat_mul(sat_add(to_size(p.q_elements()), sat_mul(2, to_size(p.kv_elements()))), sizeof(float));
    return sat_add(stores, bounds, scratch, widened);
  }

  // The fp64 definition, straight from the formula: the same landmarks (segment rule, padding removed), A, B
  // and F as exact softmaxes, and Z by the same number of iterations of the same pinv recurrence (the
  // variant is defined by the iteration, not by the true pseudo-inverse). bf16 / fp16: on the stored values
  // widened (exactly) to fp32, what the kernel computes on.
  void reference_forward(const Problem& p, const AttentionInputs& stored, double* out) const override {
    const WideInputs wide(p, stored);
    const AttentionInputs& in = wide.get();
    const int64_t D = p.head_dim, Lq = p.seq_q;
    const double s = p.effective_scale();
    tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) {
      const int64_t b = bh / p.heads, h = bh % p.heads;
      const HeadFp64 r = head_fp64(p, in, b, h, false);
      double* o = out + bh * Lq * D;
      std::fill(o, o + Lq * D, 0.0);
      if (r.mkv == 0) return;  // every key padded: zeros
      std::vector<double> f(static_cast<std::size_t>(r.mkv));
      for (int64_t i = 0; i < Lq; ++i) {
        const float* qi = in.q + (bh * Lq + i) * D;
        for (int64_t l = 0; l < r.mkv; ++l) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(qi[d]) * r.kt[l * D + d];
          f[l] = s * acc;
        }
        softmax_row64(f.data(), r.mkv);
        for (int64_t l = 0; l < r.mkv; ++l)
          for (int64_t d = 0; d < D; ++d) o[i * D + d] += f[l] * r.w[l * D + d];
      }
    });
  }

  double abs_tolerance(const Problem& p, const AttentionInputs& stored) const override;

  // ---- Training ----

  std::size_t saved_floats(const Problem& p) const override {
    return sat_mul(to_size(p.batch * p.heads), to_size(Shape(p).mq), to_size(p.head_dim + 1));
  }
  std::string saved_description() const override {
    return "per (batch, query head): B V = softmax(s Ql K^T) V (landmarks x head_dim), then the log-sum-exp "
           "of each row of B's logits (landmarks)";
  }
  double backward_flops(const Problem& p) const override;
  std::size_t backward_workspace_bytes(const Problem& p, int threads) const override;
  void reference_backward(const Problem& p, const AttentionInputs& stored, const float* d_out, double* dq,
                          double* dk, double* dv) const override;
  GradientTolerance grad_tolerance(const Problem& p, const AttentionInputs& stored,
                                   const float* d_out) const override;

 protected:
  void forward(const Problem& p, const AttentionInputs& stored) const override {
    forward_impl(p, stored, nullptr);
  }
  void forward_saving(const Problem& p, const AttentionInputs& stored, float* saved) const override {
    forward_impl(p, stored, saved);
  }
  void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const override;

 private:
  // The forward; with `saved` (the training forward) it also writes the saved state. One code path, so the
  // training forward's O is bitwise run()'s.
  void forward_impl(const Problem& p, const AttentionInputs& stored, float* saved) const;
};

// Per batch entry: the key landmarks (0 when every key is padded) and their segments as positions: landmark i
// averages the valid keys in [bounds[i], bounds[i + 1]) (bounds: batch × (mkv_cap + 1)).
struct KeySegments {
  std::vector<int64_t> mkv, bounds;
  KeySegments(const Problem& p, const AttentionInputs& in, const Shape& sh) {
    const int64_t Lkv = p.seq_kv, M = sh.mkv_cap;
    mkv.resize(static_cast<std::size_t>(p.batch));
    bounds.resize(static_cast<std::size_t>(p.batch * (M + 1)));
    for (int64_t b = 0; b < p.batch; ++b) {
      int64_t n = 0;
      for (int64_t j = 0; j < Lkv; ++j) n += !padded(p, in, b, j);
      const int64_t count = landmark_count(n, sh.m);
      int64_t* bd = bounds.data() + b * (M + 1);
      mkv[b] = count;
      if (count == 0) continue;
      // Segment i of the valid keys starts at valid key number segment_begin(i, n, count): its position.
      bd[0] = 0, bd[count] = Lkv;
      for (int64_t j = 0, c = 0, i = 1; j < Lkv && i < count; ++j) {
        if (padded(p, in, b, j)) continue;
        if (c == segment_begin(i, n, count)) bd[i++] = j;
        ++c;
      }
    }
  }
  const int64_t* of(int64_t b, const Shape& sh) const { return bounds.data() + b * (sh.mkv_cap + 1); }
};

// K̃ of one (batch, K/V head) into kt (mk × d): the mean of each segment's valid keys. The forward and the
// backward both call this (the same K̃ bitwise).
void key_landmarks(const Problem& p, const AttentionInputs& in, const int64_t* bd, int64_t mk, int64_t b,
                   const float* k, float* kt) {
  const int64_t D = p.head_dim;
  for (int64_t i = 0; i < mk; ++i) {
    float* row = kt + i * D;
    std::fill(row, row + D, 0.0f);
    int64_t count = 0;
    for (int64_t j = bd[i]; j < bd[i + 1]; ++j) {
      if (padded(p, in, b, j)) continue;
      for (int64_t d = 0; d < D; ++d) row[d] += k[j * D + d];
      ++count;
    }
    const float inv = static_cast<float>(count);
    for (int64_t d = 0; d < D; ++d) row[d] /= inv;
  }
}

// Q̃ of one (batch, query head) into qt (mq × d), and A = softmax(s Q̃ K̃ᵀ) into a (mq × mk).
void query_landmarks_and_a(const Problem& p, const float* q, const float* kt, int64_t mq, int64_t mk, float s,
                           float* qt, float* a) {
  const int64_t D = p.head_dim, Lq = p.seq_q;
  for (int64_t i = 0; i < mq; ++i) {
    const int64_t i0 = segment_begin(i, Lq, mq), i1 = segment_begin(i + 1, Lq, mq);
    float* row = qt + i * D;
    std::fill(row, row + D, 0.0f);
    for (int64_t r = i0; r < i1; ++r)
      for (int64_t d = 0; d < D; ++d) row[d] += q[r * D + d];
    const float len = static_cast<float>(i1 - i0);
    for (int64_t d = 0; d < D; ++d) row[d] /= len;
  }
  sgemm(false, true, mq, mk, D, s, qt, D, kt, D, 0.0f, a, mk);
  for (int64_t i = 0; i < mq; ++i) softmax_row(a + i * mk, mk);
}

void Nystrom::forward_impl(const Problem& p, const AttentionInputs& stored, float* saved) const {
  const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
  const AttentionInputs& in = wide.get();
  const Shape sh(p);
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv, H = p.heads, KVH = p.num_kv_heads();
  const int64_t BH = p.batch * H, BKV = p.batch * KVH, mq = sh.mq, M = sh.mkv_cap;
  const float s = static_cast<float>(p.effective_scale());
  const KeySegments seg(p, in, sh);
  const std::vector<int64_t>& mkv = seg.mkv;
  AlignedVector<float> kt(static_cast<std::size_t>(BKV * M * D)), w(static_cast<std::size_t>(BH * M * D));
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;
  auto local = [&]() -> float* {
    AlignedVector<float>& buf = scratch.local();
    if (buf.size() < sh.scratch_floats(p)) buf.resize(sh.scratch_floats(p));
    return buf.data();
  };

  // K̃ per (batch, K/V head), shared by the query heads of the group.
  tbb::parallel_for(int64_t{0}, BKV, [&](int64_t bkv) {
    const int64_t b = bkv / KVH;
    key_landmarks(p, in, seg.of(b, sh), mkv[b], b, in.k + bkv * Lkv * D, kt.data() + bkv * M * D);
  });

  // Per (batch, query head): Q̃, A = softmax(s Q̃ K̃ᵀ), Z ≈ A⁺, B V with an online softmax over key blocks, and
  // W = Z (B V), mkv × d. The training forward keeps B V and the log-sum-exp of B's rows (saved_floats).
  tbb::parallel_for(int64_t{0}, BH, [&](int64_t bh) {
    const int64_t b = bh / H, kvb = p.kv_block(b, bh % H), mk = mkv[b];
    if (mk == 0) return;
    float* qt = local();
    float* a = qt + mq * D;
    float* z = a + mq * mk;
    float* work = z + mk * mq;
    float* sc = work + nystrom::pinv_work_floats(mq, mk);
    float* acc = sc + mq * kKeyBlock;
    float* row_m = acc + mq * D;
    float* row_l = row_m + mq;
    const float* ktb = kt.data() + kvb * M * D;
    query_landmarks_and_a(p, in.q + bh * Lq * D, ktb, mq, mk, s, qt, a);
    nystrom::pinv_fp32(a, mq, mk, sh.iterations, z, work);

    // B V = softmax(s Q̃ Kᵀ) V over the valid keys, block by block (running max row_m and sum row_l).
    const float* k = in.k + kvb * Lkv * D;
    const float* v = in.v + kvb * Lkv * D;
    std::fill(acc, acc + mq * D, 0.0f);
    std::fill(row_m, row_m + mq, kNegInf);
    std::fill(row_l, row_l + mq, 0.0f);
    for (int64_t j0 = 0; j0 < Lkv; j0 += kKeyBlock) {
      const int64_t nb = std::min(kKeyBlock, Lkv - j0);
      sgemm(false, true, mq, nb, D, s, qt, D, k + j0 * D, D, 0.0f, sc, nb);
      if (p.mask.key_padding)
        for (int64_t j = 0; j < nb; ++j)
          if (padded(p, in, b, j0 + j))
            for (int64_t i = 0; i < mq; ++i) sc[i * nb + j] = kNegInf;
      for (int64_t i = 0; i < mq; ++i) {
        float* sr = sc + i * nb;
        const float bm = row_max(sr, nb);
        const float nm = std::isnan(bm) ? bm : std::max(row_m[i], bm);
        if (nm == kNegInf) {  // no valid key yet in this row: nothing to add
          std::fill(sr, sr + nb, 0.0f);
          continue;
        }
        const float corr = row_m[i] == kNegInf ? 0.0f : std::exp(row_m[i] - nm);
        row_l[i] = row_l[i] * corr + exp_sub_sum(sr, nb, nm);
        if (corr != 1.0f) scale_row(acc + i * D, D, corr);
        row_m[i] = nm;
      }
      sgemm(false, false, mq, D, nb, 1.0f, sc, nb, v + j0 * D, D, 1.0f, acc, D);
    }
    for (int64_t i = 0; i < mq; ++i) scale_row(acc + i * D, D, 1.0f / row_l[i]);
    if (saved) {
      float* keep = saved + bh * mq * (D + 1);
      std::copy(acc, acc + mq * D, keep);
      for (int64_t i = 0; i < mq; ++i) keep[mq * D + i] = row_m[i] + std::log(row_l[i]);
    }
    sgemm(false, false, mk, D, mq, 1.0f, z, mq, acc, D, 0.0f, w.data() + bh * M * D, D);
  });

  // Per (batch, query head, block of query rows): F = softmax(s Q K̃ᵀ), out = F W.
  const int64_t blocks = (Lq + kQueryRows - 1) / kQueryRows;
  tbb::parallel_for(int64_t{0}, BH * blocks, [&](int64_t task) {
    const int64_t bh = task / blocks, i0 = task % blocks * kQueryRows, rows = std::min(kQueryRows, Lq - i0);
    const int64_t b = bh / H, kvb = p.kv_block(b, bh % H), mk = mkv[b];
    float* o = in.out + (bh * Lq + i0) * D;
    if (mk == 0) {  // every key padded: zeros, as for any row with no allowed key
      std::fill(o, o + rows * D, 0.0f);
      return;
    }
    float* f = local();
    sgemm(false, true, rows, mk, D, s, in.q + (bh * Lq + i0) * D, D, kt.data() + kvb * M * D, D, 0.0f, f, mk);
    for (int64_t r = 0; r < rows; ++r) softmax_row(f + r * mk, mk);
    sgemm(false, false, rows, D, mk, 1.0f, f, mk, w.data() + bh * M * D, D, 0.0f, o, D);
  });
}

// One thread's scratch of the backward, carved from one buffer (the sizes use the most landmarks either side
// can have; a batch entry with fewer key landmarks uses the front of each piece).
struct BackwardScratch {
  float *kt, *dkt, *qt, *a, *z, *work, *iterates, *w, *dw, *f, *df, *dz, *dbv, *da, *pinv_work, *dqt,
      *delta_b, *sc, *dsc, *kbuf, *vbuf;
  static std::size_t floats(const Problem& p, const Shape& sh) { return carve(p, sh, nullptr); }
  BackwardScratch(const Problem& p, const Shape& sh, float* base) { carve(p, sh, base, this); }

 private:
  static std::size_t carve(const Problem& p, const Shape& sh, float* base, BackwardScratch* out = nullptr) {
    const std::size_t D = to_size(p.head_dim), Q = to_size(sh.mq), M = to_size(sh.mkv_cap),
                      rows = to_size(std::min(kQueryRows, p.seq_q)), keys = to_size(kKeyBlock);
    const std::size_t sizes[] = {M * D,
                                 M * D,
                                 Q * D,
                                 Q * M,
                                 M * Q,
                                 nystrom::pinv_work_floats(sh.mq, sh.mkv_cap),
                                 nystrom::pinv_iterate_floats(sh.mq, sh.mkv_cap, sh.iterations),
                                 M * D,
                                 M * D,
                                 rows * M,
                                 rows * M,
                                 M * Q,
                                 Q * D,
                                 Q * M,
                                 nystrom::pinv_backward_work_floats(sh.mq, sh.mkv_cap),
                                 Q * D,
                                 Q,
                                 Q * keys,
                                 Q * keys,
                                 p.mask.key_padding ? keys * D : 0,
                                 p.mask.key_padding ? keys * D : 0};
    std::size_t total = 0;
    float* BackwardScratch::*members[] = {
        &BackwardScratch::kt,       &BackwardScratch::dkt,     &BackwardScratch::qt,
        &BackwardScratch::a,        &BackwardScratch::z,       &BackwardScratch::work,
        &BackwardScratch::iterates, &BackwardScratch::w,       &BackwardScratch::dw,
        &BackwardScratch::f,        &BackwardScratch::df,      &BackwardScratch::dz,
        &BackwardScratch::dbv,      &BackwardScratch::da,      &BackwardScratch::pinv_work,
        &BackwardScratch::dqt,      &BackwardScratch::delta_b, &BackwardScratch::sc,
        &BackwardScratch::dsc,      &BackwardScratch::kbuf,    &BackwardScratch::vbuf};
    static_assert(std::size(sizes) == std::size(members));
    for (std::size_t e = 0; e < std::size(sizes); ++e) {
      if (out) out->*members[e] = base + total;
      total = sat_add(total, sizes[e]);
    }
    return total;
  }
};

// The backward, per (batch entry, K/V head), its query heads in order; for each head, reverse mode through
// the forward's steps (F W, Z (B V), the pinv, the three softmaxes, the landmark means):
//  1. K̃, Q̃, A = softmax(s Q̃ K̃ᵀ) and Z by the forward's own code (bitwise its values), keeping the pinv's
//     iterates; B V and B's row log-sum-exp from the saved state; W = Z (B V) as the forward computes it.
//  2. F part, blocks of kQueryRows queries: F = softmax(s Q K̃ᵀ) again, dF = dO Wᵀ, dS_F = F (dF - delta) with
//     delta = Σ_l F_l dF_l, dQ = s dS_F K̃ (the block's rows), dK̃ += s dS_Fᵀ Q, dW += Fᵀ dO.
//  3. dZ = dW (B V)ᵀ, d(B V) = Zᵀ dW; the pinv's reverse mode gives dA (pinv_backward_fp32); dS_A = A (dA -
//     rowsum(A dA)), dQ̃ = s dS_A K̃, dK̃ += s dS_Aᵀ Q̃.
//  4. B part, blocks of kKeyBlock keys: B = exp(s Q̃ Kᵀ - lse) (padded keys 0), dB = d(B V) Vᵀ, dS_B = B (dB -
//     delta_B) with delta_B = d(B V) · B V, dV += Bᵀ d(B V), dK += s dS_Bᵀ Q̃, dQ̃ += s dS_B K. Blocks holding
//     a padded key read K and V from a copy with those rows zeroed: their weight is 0 and a NaN there stays
//     out.
//  5. dQ̃ spread over its segment's query rows (÷ its length); after the group, dK̃ over its segment's valid
//  keys.
// Every output is written by one task, every sum runs in an order fixed by the problem: bitwise the same at
// any thread count, no atomics. Parallel over (batch, K/V head) because dK, dV and dK̃ sum over the group's
// query heads (the forward's per-query-block split would need a reduction of n × d partial gradients).
void Nystrom::backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const {
  const Shape sh(p);
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv, H = p.heads, KVH = p.num_kv_heads(),
                G = p.group_size();
  const int64_t mq = sh.mq;
  const float s = static_cast<float>(p.effective_scale());
  const KeySegments seg(p, in, sh);
  const std::size_t scratch_floats = BackwardScratch::floats(p, sh);
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;
  tbb::parallel_for(int64_t{0}, p.batch * KVH, [&](int64_t bkv) {
    AlignedVector<float>& buf = scratch.local();
    if (buf.size() < scratch_floats) buf.resize(scratch_floats);
    const BackwardScratch ws(p, sh, buf.data());
    const int64_t b = bkv / KVH, h0 = bkv % KVH * G, mk = seg.mkv[static_cast<std::size_t>(b)];
    const int64_t* bd = seg.of(b, sh);
    const float* k = in.k + bkv * Lkv * D;
    const float* v = in.v + bkv * Lkv * D;
    float* dk = g.dk + bkv * Lkv * D;
    float* dv = g.dv + bkv * Lkv * D;
    std::fill(dk, dk + Lkv * D, 0.0f);
    std::fill(dv, dv + Lkv * D, 0.0f);
    if (mk == 0) {  // every key padded: the output is 0 whatever the inputs
      std::fill(g.dq + (b * H + h0) * Lq * D, g.dq + (b * H + h0 + G) * Lq * D, 0.0f);
      return;
    }
    key_landmarks(p, in, bd, mk, b, k, ws.kt);
    std::fill(ws.dkt, ws.dkt + mk * D, 0.0f);
    for (int64_t bh = b * H + h0; bh < b * H + h0 + G; ++bh) {
      const float* q = in.q + bh * Lq * D;
      const float* bv = g.saved + bh * mq * (D + 1);
      const float* lse = bv + mq * D;
      query_landmarks_and_a(p, q, ws.kt, mq, mk, s, ws.qt, ws.a);
      nystrom::pinv_fp32(ws.a, mq, mk, sh.iterations, ws.z, ws.work, ws.iterates);
      sgemm(false, false, mk, D, mq, 1.0f, ws.z, mq, bv, D, 0.0f, ws.w, D);

      // 2. F part.
      for (int64_t i0 = 0; i0 < Lq; i0 += kQueryRows) {
        const int64_t rows = std::min(kQueryRows, Lq - i0);
        const float* qb = q + i0 * D;
        const float* dout = g.d_out + (bh * Lq + i0) * D;
        sgemm(false, true, rows, mk, D, s, qb, D, ws.kt, D, 0.0f, ws.f, mk);
        for (int64_t r = 0; r < rows; ++r) softmax_row(ws.f + r * mk, mk);
        sgemm(false, true, rows, mk, D, 1.0f, dout, D, ws.w, D, 0.0f, ws.df, mk);
        for (int64_t r = 0; r < rows; ++r) {
          // delta = Σ_l F_l dF_l (= dO · O in exact arithmetic): from this F and dF, so an error of dF common
          // to a row cancels, and O's error (the forward's bound, which carries the pinv's) stays out.
          float delta = 0;
          for (int64_t l = 0; l < mk; ++l) delta += ws.f[r * mk + l] * ws.df[r * mk + l];
          for (int64_t l = 0; l < mk; ++l) ws.df[r * mk + l] = ws.f[r * mk + l] * (ws.df[r * mk + l] - delta);
        }
        sgemm(false, false, rows, D, mk, s, ws.df, mk, ws.kt, D, 0.0f, g.dq + (bh * Lq + i0) * D, D);
        sgemm(true, false, mk, D, rows, s, ws.df, mk, qb, D, 1.0f, ws.dkt, D);
        sgemm(true, false, mk, D, rows, 1.0f, ws.f, mk, dout, D, i0 == 0 ? 0.0f : 1.0f, ws.dw, D);
      }

      // 3. Through W = Z (B V), the pinv and A's softmax.
      sgemm(false, true, mk, mq, D, 1.0f, ws.dw, D, bv, D, 0.0f, ws.dz, mq);
      sgemm(true, false, mq, D, mk, 1.0f, ws.z, mq, ws.dw, D, 0.0f, ws.dbv, D);
      nystrom::pinv_backward_fp32(ws.a, mq, mk, sh.iterations, ws.iterates, ws.dz, ws.da, ws.pinv_work);
      for (int64_t i = 0; i < mq; ++i) {
        float* ar = ws.a + i * mk;
        float* dr = ws.da + i * mk;
        float t = 0;
        for (int64_t l = 0; l < mk; ++l) t += ar[l] * dr[l];
        for (int64_t l = 0; l < mk; ++l) dr[l] = ar[l] * (dr[l] - t);
      }
      sgemm(false, false, mq, D, mk, s, ws.da, mk, ws.kt, D, 0.0f, ws.dqt, D);
      sgemm(true, false, mk, D, mq, s, ws.da, mk, ws.qt, D, 1.0f, ws.dkt, D);

      // 4. B part.
      for (int64_t i = 0; i < mq; ++i) {
        float t = 0;
        for (int64_t d = 0; d < D; ++d) t += ws.dbv[i * D + d] * bv[i * D + d];
        ws.delta_b[i] = t;
      }
      for (int64_t j0 = 0; j0 < Lkv; j0 += kKeyBlock) {
        const int64_t nb = std::min(kKeyBlock, Lkv - j0);
        const float* kb = k + j0 * D;
        const float* vb = v + j0 * D;
        bool any_pad = false;
        for (int64_t j = 0; j < nb; ++j) any_pad = any_pad || padded(p, in, b, j0 + j);
        if (any_pad) {
          for (int64_t j = 0; j < nb; ++j) {
            const bool pad = padded(p, in, b, j0 + j);
            for (int64_t d = 0; d < D; ++d) {
              ws.kbuf[j * D + d] = pad ? 0.0f : kb[j * D + d];
              ws.vbuf[j * D + d] = pad ? 0.0f : vb[j * D + d];
            }
          }
          kb = ws.kbuf, vb = ws.vbuf;
        }
        sgemm(false, true, mq, nb, D, s, ws.qt, D, kb, D, 0.0f, ws.sc, nb);
        sgemm(false, true, mq, nb, D, 1.0f, ws.dbv, D, vb, D, 0.0f, ws.dsc, nb);
        for (int64_t i = 0; i < mq; ++i) {
          float* sr = ws.sc + i * nb;
          float* dr = ws.dsc + i * nb;
          if (any_pad)
            for (int64_t j = 0; j < nb; ++j)
              if (padded(p, in, b, j0 + j)) sr[j] = kNegInf;
          exp_sub_sum(sr, nb, lse[i]);
          for (int64_t j = 0; j < nb; ++j) dr[j] = sr[j] * (dr[j] - ws.delta_b[i]);
        }
        sgemm(true, false, nb, D, mq, 1.0f, ws.sc, nb, ws.dbv, D, 1.0f, dv + j0 * D, D);
        sgemm(true, false, nb, D, mq, s, ws.dsc, nb, ws.qt, D, 1.0f, dk + j0 * D, D);
        sgemm(false, false, mq, D, nb, s, ws.dsc, nb, kb, D, 1.0f, ws.dqt, D);
      }

      // 5. dQ̃ back to the query rows of each segment.
      float* dq = g.dq + bh * Lq * D;
      for (int64_t i = 0; i < mq; ++i) {
        const int64_t i0 = segment_begin(i, Lq, mq), i1 = segment_begin(i + 1, Lq, mq);
        const float len = static_cast<float>(i1 - i0);
        for (int64_t r = i0; r < i1; ++r)
          for (int64_t d = 0; d < D; ++d) dq[r * D + d] += ws.dqt[i * D + d] / len;
      }
    }
    // dK̃ back to the valid keys of each segment.
    for (int64_t l = 0; l < mk; ++l) {
      int64_t count = 0;
      for (int64_t j = bd[l]; j < bd[l + 1]; ++j) count += !padded(p, in, b, j);
      const float len = static_cast<float>(count);
      for (int64_t j = bd[l]; j < bd[l + 1]; ++j) {
        if (padded(p, in, b, j)) continue;
        for (int64_t d = 0; d < D; ++d) dk[j * D + d] += ws.dkt[l * D + d] / len;
      }
    }
  });
}

double Nystrom::backward_flops(const Problem& p) const {
  // The backward's GEMMs per head, with mq, mk (= min(m, Lkv)) landmarks and K iterations: F part, Q K̃ᵀ
  // again, dO Wᵀ, dS_F K̃, dS_Fᵀ Q and Fᵀ dO (2·Lq·mk·d each); Q̃ K̃ᵀ again, W = Z (B V), dZ, d(B V), dS_A K̃ and
  // dS_Aᵀ Q̃ (2·mq·mk·d each); the pinv again (its K iterations, as flops() counts them) and its reverse
  // mode, per iteration ¼ Λ T3ᵀ, Zᵀ Λ, dX Zᵀ and Aᵀ dX (2·mq²·mk each) and four mq × mq products (2·mq³
  // each); B part, Q̃ Kᵀ again, d(B V) Vᵀ, Bᵀ d(B V), dS_Bᵀ Q̃ and dS_B K (2·mq·Lkv·d each). B V comes from
  // the forward (saved), so its GEMM is not redone. Not counted: the softmaxes, means, spreads, the
  // norms and the c·I − X shifts (all O(n·d + m²) or less).
  const Shape sh(p);
  const double D = static_cast<double>(p.head_dim), Lq = static_cast<double>(p.seq_q),
               Lkv = static_cast<double>(p.seq_kv), mq = static_cast<double>(sh.mq),
               mk = static_cast<double>(sh.mkv_cap);
  const double forward_iteration = 2.0 * mq * mq * mk + 4.0 * mq * mq * mq + 2.0 * mk * mq * mq;
  const double reverse_iteration = 8.0 * mq * mq * mk + 8.0 * mq * mq * mq;
  const double per_head = 10.0 * Lq * mk * D + 12.0 * mq * mk * D + 10.0 * mq * Lkv * D +
                          static_cast<double>(sh.iterations) * (forward_iteration + reverse_iteration);
  return per_head * static_cast<double>(p.batch * p.heads);
}

std::size_t Nystrom::backward_workspace_bytes(const Problem& p, int threads) const {
  // The key segments per batch entry and one scratch per thread (BackwardScratch: the landmarks, A, Z and
  // the pinv's kept iterates, W, dW, blocks of F and dF, of B and dB, and of zeroed keys with padding).
  const Shape sh(p);
  const std::size_t bounds = sat_mul(to_size(p.batch), to_size(sh.mkv_cap) + 2, sizeof(int64_t));
  const std::size_t scratch =
      sat_mul(to_size(std::max(threads, 1)), BackwardScratch::floats(p, sh), sizeof(float));
  return sat_add(bounds, scratch);
}

// The fp64 gradient of reference_forward (head_backward_fp64 per query head, the group's added in head order
// into its K/V head's dK, dV), parallel over (batch, K/V head). bf16 / fp16: of the stored values widened.
void Nystrom::reference_backward(const Problem& p, const AttentionInputs& stored, const float* d_out,
                                 double* dq, double* dk, double* dv) const {
  nystrom::reference_backward_with(p, stored, d_out, dq, dk, dv, nystrom::GradientDefect::none);
}

}  // namespace

void nystrom::reference_backward_with(const Problem& p, const AttentionInputs& stored, const float* d_out,
                                      double* dq, double* dk, double* dv, GradientDefect defect) {
  const WideInputs wide(p, stored);
  const AttentionInputs& in = wide.get();
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv, G = p.group_size(), KVH = p.num_kv_heads();
  tbb::parallel_for(int64_t{0}, p.batch * KVH, [&](int64_t bkv) {
    const int64_t b = bkv / KVH;
    double* dkb = dk + bkv * Lkv * D;
    double* dvb = dv + bkv * Lkv * D;
    std::fill(dkb, dkb + Lkv * D, 0.0);
    std::fill(dvb, dvb + Lkv * D, 0.0);
    for (int64_t h = bkv % KVH * G; h < (bkv % KVH + 1) * G; ++h)
      head_backward_fp64(p, in, d_out, b, h, dq + (b * p.heads + h) * Lq * D, dkb, dvb, defect);
  });
}

namespace {

// Eigenvalues (descending) and orthonormal eigenvectors (columns of `vecs`, n × n) of the symmetric n × n
// matrix `a`, by cyclic Jacobi rotations (fp64; for the error bound only).
void sym_eigen(std::vector<double> a, int64_t n, std::vector<double>& vals, std::vector<double>& vecs) {
  std::vector<double> v(static_cast<std::size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) v[i * n + i] = 1.0;
  double total = 0;
  for (double x : a) total += x * x;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) off += a[i * n + j] * a[i * n + j];
    if (off <= 1e-32 * total || off == 0) break;
    for (int64_t pp = 0; pp < n; ++pp)
      for (int64_t qq = pp + 1; qq < n; ++qq) {
        const double apq = a[pp * n + qq];
        if (apq == 0) continue;
        const double theta = (a[qq * n + qq] - a[pp * n + pp]) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), sn = t * c;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q
          const double akp = a[k * n + pp], akq = a[k * n + qq];
          a[k * n + pp] = c * akp - sn * akq, a[k * n + qq] = sn * akp + c * akq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q
          const double apk = a[pp * n + k], aqk = a[qq * n + k];
          a[pp * n + k] = c * apk - sn * aqk, a[qq * n + k] = sn * apk + c * aqk;
        }
        for (int64_t k = 0; k < n; ++k) {
          const double vkp = v[k * n + pp], vkq = v[k * n + qq];
          v[k * n + pp] = c * vkp - sn * vkq, v[k * n + qq] = sn * vkp + c * vkq;
        }
      }
  }
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return a[x * n + x] > a[y * n + y]; });
  vals.resize(static_cast<std::size_t>(n));
  vecs.resize(static_cast<std::size_t>(n * n));
  for (int64_t c = 0; c < n; ++c) {
    vals[c] = a[order[c] * n + order[c]];
    for (int64_t k = 0; k < n; ++k) vecs[k * n + c] = v[k * n + order[c]];
  }
}

// One singular value through the pinv iteration: x = σ·ζ (an eigenvalue of A Z) goes to h(x) = x·g(x),
// g(x) = (13 − 15x + 7x² − x³)/4, and 1 − h(x) = (1 − x)³ (4 − x)/4, so x_k → 1 from any x_0 in (0, 1].
double g_poly(double x) {
  return (13 - 15 * x + 7 * x * x - x * x * x) / 4;
}
double h_poly(double x) {
  return x * g_poly(x);
}
// Divided differences h[x, y] and g[x, y] (the derivative where x ≈ y, which cancellation would spoil).
double h_dd(double x, double y) {
  if (std::fabs(x - y) > 1e-6) return (h_poly(x) - h_poly(y)) / (x - y);
  const double m = (x + y) / 2;
  return (1 - m) * (1 - m) * (13 - 4 * m) / 4;
}
double g_dd(double x, double y) {
  if (std::fabs(x - y) > 1e-6) return (g_poly(x) - g_poly(y)) / (x - y);
  const double m = (x + y) / 2;
  return (-15 + 14 * m - 3 * m * m) / 4;
}

// Error bounds of one fp32 softmax (F, A or B of one head), from the fp64 logits (step 2 of the derivation
// below): every weight is within a factor (1 ± rel) of the fp64 one, plus at most row_abs in absolute value
// summed over a row.
struct SoftmaxError {
  double rel = 0, row_abs = 0;
};

// The rows x (nx × d) and y (ny × d) that meet in the logits s x·y, in fp64; for a landmark row, the mean of
// |rows| over its segment and the segment's length (whose rounding bounds the error of an fp32 mean).
struct LogitRows {
  const double* rows;
  const double* abs_means;  // null for rows read from Q or K
  int64_t count, seg_len;
};

// softmax(s x yᵀ) row by row in fp64 into `w` (nx × ny), and its SoftmaxError. Logit (i, j) is off by at most
// δ_ij = s u ((d+2) |x_i|·|y_j| + (L_x+1) mean|x|·|y_j| + (L_y+1) |x_i|·mean|y|) (a dot of length d with the
// scale; a mean of L rows is off by (L+1)u mean|rows| per component), which moves every weight of the row
// by a factor within exp(±2 max δ). exp_sub_sum rounds x − max and the log2(e) multiply (each a relative
// error (max − x)u of the weight), `extra` more such roundings (B's online rescaling), plus 1.5 ulp (3u) for
// the polynomial; the sum of the row and the 1/sum scaling add (len + 1)u. A weight with relative error
// c (max − x)u adds w (max − x) c u in absolute terms: summed over the row (and twice, for the normaliser)
// that is the row_abs part, which stays small for peaked rows whose logit range is large.
SoftmaxError softmax_with_error(const LogitRows& x, const LogitRows& y, int64_t d, double s, int extra,
                                std::vector<double>& w) {
  const double u = std::ldexp(1.0, -24);
  const int64_t nx = x.count, ny = y.count;
  w.resize(static_cast<std::size_t>(nx * ny));
  SoftmaxError e;
  for (int64_t i = 0; i < nx; ++i) {
    const double* xi = x.rows + i * d;
    double* wi = w.data() + i * ny;
    double delta = 0;
    for (int64_t j = 0; j < ny; ++j) {
      const double* yj = y.rows + j * d;
      double dot = 0, abs_dot = 0, xa = 0, ya = 0;
      for (int64_t c = 0; c < d; ++c) {
        dot += xi[c] * yj[c];
        abs_dot += std::fabs(xi[c] * yj[c]);
        if (x.abs_means) xa += x.abs_means[i * d + c] * std::fabs(yj[c]);
        if (y.abs_means) ya += std::fabs(xi[c]) * y.abs_means[j * d + c];
      }
      wi[j] = s * dot;
      delta = std::max(delta,
                       s * u *
                           (static_cast<double>(d + 2) * abs_dot + static_cast<double>(x.seg_len + 1) * xa +
                            static_cast<double>(y.seg_len + 1) * ya));
    }
    const double mx = *std::max_element(wi, wi + ny);
    double sum = 0, spread = 0;
    for (int64_t j = 0; j < ny; ++j) sum += std::exp(wi[j] - mx);
    for (int64_t j = 0; j < ny; ++j) {
      const double t = mx - wi[j];
      wi[j] = std::exp(-t) / sum;
      spread += wi[j] * t;
    }
    e.rel = std::max(e.rel, 2 * delta + static_cast<double>(ny + 4) * u);
    e.row_abs = std::max(e.row_abs, 2 * (2 + extra) * u * spread);
  }
  return e;
}

// What the fp32 pinv's error does to the output (steps 3 and 4 of the derivation below).
struct PinvBound {
  double out = 0;        // bound on max |(F ΔZ B V)_re|
  double fz_factor = 0;  // max |(F Z E)_re| <= fz_factor · max|E| for any mq × d matrix E
};

// `f` is F (Lq × mk) in fp64, `da` a bound on ‖ΔA‖_F, `eta` on the relative error of α = 1/(‖A‖₁‖A‖∞).
PinvBound pinv_error_bound(const Problem& p, const HeadFp64& r, const std::vector<double>& f, double da,
                           double eta) {
  const double u = std::ldexp(1.0, -24);
  const int64_t D = p.head_dim, Lq = p.seq_q, K = p.param_int("pinv_iterations"), mq = r.mq, mk = r.mkv;
  const double dmq = static_cast<double>(mq), dmk = static_cast<double>(mk);
  // SVD of A: U, σ² from A Aᵀ (mq × mq), V from Aᵀ A (mk × mk), paired by descending eigenvalue (only
  // magnitudes are used, so the signs of the vectors do not matter).
  std::vector<double> at(static_cast<std::size_t>(mk * mq)), gram_u(static_cast<std::size_t>(mq * mq)),
      gram_v(static_cast<std::size_t>(mk * mk)), lam_u, lam_v, U, V;
  for (int64_t i = 0; i < mq; ++i)
    for (int64_t j = 0; j < mk; ++j) at[j * mq + i] = r.a[i * mk + j];
  nystrom::matmul64(r.a.data(), at.data(), mq, mk, mq, gram_u.data());
  nystrom::matmul64(at.data(), r.a.data(), mk, mq, mk, gram_v.data());
  sym_eigen(gram_u, mq, lam_u, U);
  sym_eigen(gram_v, mk, lam_v, V);
  const int64_t rank = std::min(mq, mk), modes = std::max(mq, mk);
  const auto [a_inf, a_1] = nystrom::norm_inf_1(r.a.data(), mq, mk);
  const double alpha = 1 / (a_1 * a_inf);
  // x_k, ζ_k of every mode, k = 0..K (0 for the modes beyond the rank).
  std::vector<std::vector<double>> xs(static_cast<std::size_t>(K + 1), std::vector<double>(modes, 0.0)),
      zs = xs;
  for (int64_t i = 0; i < rank; ++i) {
    const double sigma = std::sqrt(std::max(lam_u[i], 0.0));
    xs[0][i] = alpha * sigma * sigma, zs[0][i] = alpha * sigma;
    for (int64_t k = 0; k < K; ++k) {
      xs[k + 1][i] = h_poly(xs[k][i]);
      zs[k + 1][i] = zs[k][i] * g_poly(xs[k][i]);
    }
  }
  // How much each mode reaches the output: a_i = max_r |(F V)_ri|, b_j = max_e |(Uᵀ B V)_je|.
  std::vector<double> wa(static_cast<std::size_t>(mk), 0.0), wb(static_cast<std::size_t>(mq), 0.0);
  for (int64_t i = 0; i < Lq; ++i)
    for (int64_t c = 0; c < mk; ++c) {
      double acc = 0;
      for (int64_t l = 0; l < mk; ++l) acc += f[i * mk + l] * V[l * mk + c];
      wa[c] = std::max(wa[c], std::fabs(acc));
    }
  for (int64_t j = 0; j < mq; ++j)
    for (int64_t d = 0; d < D; ++d) {
      double acc = 0;
      for (int64_t l = 0; l < mq; ++l) acc += U[l * mq + j] * r.bv[l * D + d];
      wb[j] = std::max(wb[j], std::fabs(acc));
    }
  // ‖(a_i b_j coef(i, j))‖_F over i < mk (V side), j < mq (U side).
  auto weighted = [&](auto coef) {
    double acc = 0;
    for (int64_t i = 0; i < mk; ++i)
      for (int64_t j = 0; j < mq; ++j) {
        const double t = wa[i] * wb[j] * coef(i, j);
        acc += t * t;
      }
    return std::sqrt(acc);
  };
  // Backwards over the steps: P = the product of the later steps' multipliers h[x_i, x_j]; J = the
  // coefficient of ΔÃ_ij in ΔZ̃_ij through every step's X (its terms have one sign: g' < 0 < h' on [0, 1]).
  std::vector<double> P(static_cast<std::size_t>(mk * mq), 1.0), J(P.size(), 0.0);
  double rounding = 0;
  for (int64_t k = K - 1; k >= 0; --k) {
    const nystrom::PinvStep& st = r.trace.steps[static_cast<std::size_t>(k)];
    const std::vector<double>&x = xs[k], &z = zs[k];
    const double dx = dmk * u * st.az_fro;                                    // X = A Z_k
    const double dt2 = u * st.t1_fro + dmq * u * st.xt1_fro + u * st.t2_fro;  // T1, X T1, T2
    const double dt3 = dt2 + dmq * u * st.xt2_fro + u * st.t3_fro;            // ‖X‖₂ <= 1
    rounding += weighted([&](int64_t i, int64_t j) { return P[i * mq + j]; }) * dmq * u * st.zt3_fro / 4;
    rounding +=
        weighted([&](int64_t i, int64_t j) { return P[i * mq + j] * z[i] * std::fabs(g_dd(x[i], x[j])); }) *
        dx;
    rounding += weighted([&](int64_t i, int64_t j) { return P[i * mq + j] * z[i] / 4; }) * dt3;
    for (int64_t i = 0; i < rank; ++i)
      for (int64_t j = 0; j < rank; ++j)
        J[i * mq + j] += P[i * mq + j] * z[i] * z[j] * std::fabs(g_dd(x[i], x[j]));
    for (int64_t i = 0; i < mk; ++i)
      for (int64_t j = 0; j < mq; ++j) P[i * mq + j] *= std::fabs(h_dd(x[i], x[j]));
  }
  // Z_0 = α Aᵀ: ΔA through α ΔÃᵀ, α's relative error (diagonal: η ζ_0,i), Z_0's own rounding.
  double diag = 0;
  for (int64_t i = 0; i < rank; ++i) diag += wa[i] * wb[i] * P[i * mq + i] * zs[0][i];
  const double p_all = weighted([&](int64_t i, int64_t j) { return P[i * mq + j]; });
  PinvBound res;
  res.out = da * (weighted([&](int64_t i, int64_t j) { return J[i * mq + j]; }) + alpha * p_all) +
            eta * diag + u * r.trace.z0_fro * p_all + rounding;
  // F Z E = (F V) Z̃ (Uᵀ E): Σ_j a_j ζ_j |(Uᵀ E)_je| <= ‖(a_j ζ_j)‖₂ ‖E_{:,e}‖₂ <= ‖(a_j ζ_j)‖₂ √mq max|E|.
  double az = 0;
  for (int64_t j = 0; j < rank; ++j) az += wa[j] * zs[K][j] * wa[j] * zs[K][j];
  res.fz_factor = std::sqrt(az * dmq);
  return res;
}

// Why this bound. u = 2^-24; first order in u, per (batch entry, head), then the largest over the heads.
//  1. Weights (softmax_with_error): the logits' rounding (dots of length d, fp32 segment means) and
//     exp_sub_sum's give each weight of F, A and B a relative error <= rel plus an absolute error summing to
//     <= row_abs over a row; B's online softmax adds 5u per key block (rescaling) and one more (max − x)u
//     rounding per weight.
//  2. A: ‖ΔA‖_F <= rel_A ‖A‖_F + √m_q row_abs_A; the norms ‖A‖₁, ‖A‖∞ and so α = 1/(‖A‖₁‖A‖∞) are off by
//     η <= 2 rel_A + row_abs_A / ‖A‖∞ + m_q row_abs_A / ‖A‖₁ + (m_q + m_k + 3)u relative.
//  3. The pinv. With A = U Σ Vᵀ every exact iterate is Z_k = V diag(ζ_k) Uᵀ and A Z_k = U diag(x_k) Uᵀ,
//     x_k,i = σ_i ζ_k,i: x_0 = α σ² in [0, 1] (α <= 1/σ_max²), x_{k+1} = h(x_k) (above; modes with σ = 0 or
//     beyond the rank of a non-square A have x = ζ = 0). Linearising Z' = Z g(A Z): an error H of Z_k, in
//     these bases H̃ = Vᵀ H U, leaves the step as μ_ij H̃_ij with μ_ij = h[x_i, x_j] in [0, 13/4] (the
//     iteration corrects its own errors in converged modes, x -> 1, and carries them ×13/4 per step in slow
//     ones); an error E of X = A Z_k enters as ζ_i g[x_i, x_j] Ẽ_ij, one of T3 as ζ_i Ẽ_ij / 4, a rounding of
//     ¼ Z T3 as itself. The sources, in Frobenius norm (invariant under U, V): ΔA through each X (Ẽ = ΔÃ Z̃,
//     entries ΔÃ_ij ζ_j) and through Z_0 = α Aᵀ; α's error (η ζ_0,i on the diagonal); and each step's
//     roundings, from the fp64 iterates' norms (pinv_fp64's trace): X (m_k u ‖|A||Z|‖_F), T1, T2, T3 (with
//     ‖X‖₂ <= 1), ¼ Z T3 (m_q u ‖|Z||T3|‖_F / 4). A source of step k reaches Z_K times P_ij = Π_{l>k}
//     μ^(l)_ij.
//  4. To the output: F ΔZ B V = (F V) ΔZ̃ (Uᵀ B V), so |Δout| <= Σ_ij a_i b_j |ΔZ̃_ij| with a_i = max_r
//     |(F V)_ri|, b_j = max_e |(Uᵀ B V)_je|, and a source S with coefficients c_ij adds at most ‖S‖_F ‖(a_i
//     b_j c_ij)‖_F (Cauchy–Schwarz). The modes A barely sees (small σ), where Z's error grows fastest, are
//     those F and B V barely see (small a_i, b_j). A norm-wise bound (‖ΔZ‖ ‖B V‖, ‖ΔZ‖ growing ×13/4 per
//     step) was 1e3–1e5 times looser, above max|V| at 6 iterations: useless.
//  5. The rest: ΔF W <= rel_F max(F|W|) + row_abs_F max|W|; F Z ΔBV with |ΔBV| <= (rel_B + (n + 2)u)
//     max(B|V|) + row_abs_B max|V| (n valid keys) and F Z bounded by min(‖F Z‖∞, the modal factor); the
//     roundings of W = Z (B V) (m_q u F|Z||B V|) and of F W (m_k u F|W|).
// We allow 2x the sum for the first-order truncation and the fp64 eigen-decomposition. On the check's inputs
// the bound is 1e2–1e4 times the actual error, and one pinv iteration fewer, a transposed A, segment
// boundaries moved by a row or padded keys left in the means exceed it (tests/test_nystrom.cpp).
double Nystrom::abs_tolerance(const Problem& p, const AttentionInputs& stored) const {
  const WideInputs wide(p, stored);  // the values the kernel was given
  const AttentionInputs& in = wide.get();
  const double u = std::ldexp(1.0, -24), s = p.effective_scale();
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv;
  double worst = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const HeadFp64 r = head_fp64(p, in, b, h, true);
      if (r.mkv == 0) continue;  // every key padded: exact zeros
      const int64_t mq = r.mq, mk = r.mkv, n = static_cast<int64_t>(r.keys.size());
      const double dmq = static_cast<double>(mq), dmk = static_cast<double>(mk);
      const float* q = in.q + (b * p.heads + h) * Lq * D;
      const float* k = in.k + p.kv_block(b, h) * Lkv * D;
      const float* v = in.v + p.kv_block(b, h) * Lkv * D;
      // fp64 copies of Q's rows and the valid keys; the segment means of |Q| and |K| behind Q̃ and K̃.
      std::vector<double> q64(q, q + Lq * D), k64(static_cast<std::size_t>(n * D));
      std::vector<double> q_abs(static_cast<std::size_t>(mq * D), 0.0),
          k_abs(static_cast<std::size_t>(mk * D), 0.0);
      for (int64_t c = 0; c < n; ++c)
        for (int64_t d = 0; d < D; ++d) k64[c * D + d] = k[r.keys[c] * D + d];
      auto abs_means = [D](const std::vector<double>& x, int64_t rows, int64_t count,
                           std::vector<double>& out) {
        for (int64_t i = 0; i < count; ++i) {
          const int64_t i0 = segment_begin(i, rows, count), i1 = segment_begin(i + 1, rows, count);
          for (int64_t c = i0; c < i1; ++c)
            for (int64_t d = 0; d < D; ++d)
              out[i * D + d] += std::fabs(x[c * D + d]) / static_cast<double>(i1 - i0);
        }
      };
      abs_means(q64, Lq, mq, q_abs);
      abs_means(k64, n, mk, k_abs);
      const int64_t seg_q = (Lq + mq - 1) / mq, seg_k = (n + mk - 1) / mk;
      std::vector<double> f, a, bm;
      const LogitRows q_rows{q64.data(), nullptr, Lq, 0}, qt_rows{r.qt.data(), q_abs.data(), mq, seg_q},
          kt_rows{r.kt.data(), k_abs.data(), mk, seg_k}, k_rows{k64.data(), nullptr, n, 0};
      const SoftmaxError ef = softmax_with_error(q_rows, kt_rows, D, s, 0, f);
      const SoftmaxError ea = softmax_with_error(qt_rows, kt_rows, D, s, 0, a);
      SoftmaxError eb = softmax_with_error(qt_rows, k_rows, D, s, 1, bm);
      eb.rel += 5 * static_cast<double>((Lkv + kKeyBlock - 1) / kKeyBlock) * u;

      const auto [a_inf, a_1] = nystrom::norm_inf_1(r.a.data(), mq, mk);
      const double da = ea.rel * nystrom::fro(r.a) + std::sqrt(dmq) * ea.row_abs;
      const double eta = 2 * ea.rel + ea.row_abs / a_inf + dmq * ea.row_abs / a_1 + (dmq + dmk + 3) * u;
      const PinvBound pinv = pinv_error_bound(p, r, f, da, eta);

      double vmax = 0, wmax = 0;
      for (int64_t j : r.keys)
        for (int64_t d = 0; d < D; ++d) vmax = std::max(vmax, std::fabs(static_cast<double>(v[j * D + d])));
      // The largest entries of F|W|, F|Z||B V| and row sums of |F Z|.
      std::vector<double> abs_w(r.w.size()), abs_zbv(r.w.size()), fz(static_cast<std::size_t>(mq)),
          row(static_cast<std::size_t>(D));
      for (std::size_t e = 0; e < r.w.size(); ++e) wmax = std::max(wmax, abs_w[e] = std::fabs(r.w[e]));
      nystrom::matmul64(r.z.data(), r.bv.data(), mk, mq, D, abs_zbv.data(), true);
      double f_w = 0, f_zbv = 0, fz_inf = 0;
      for (int64_t i = 0; i < Lq; ++i) {
        nystrom::matmul64(&f[i * mk], abs_w.data(), 1, mk, D, row.data());
        f_w = std::max(f_w, *std::max_element(row.begin(), row.end()));
        nystrom::matmul64(&f[i * mk], abs_zbv.data(), 1, mk, D, row.data());
        f_zbv = std::max(f_zbv, *std::max_element(row.begin(), row.end()));
        nystrom::matmul64(&f[i * mk], r.z.data(), 1, mk, mq, fz.data());
        double sum = 0;
        for (double x : fz) sum += std::fabs(x);
        fz_inf = std::max(fz_inf, sum);
      }
      // |ΔBV_je| <= Σ_c |ΔB_jc| |V_ce| + n u (B|V|)_je: relative errors against (B|V|)_je, absolute ones
      // against max|V|.
      double bv_abs = 0;
      for (int64_t j = 0; j < mq; ++j)
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t c = 0; c < n; ++c)
            acc += bm[j * n + c] * std::fabs(static_cast<double>(v[r.keys[c] * D + d]));
          bv_abs = std::max(bv_abs, acc);
        }
      const double dbv = (eb.rel + static_cast<double>(n + 2) * u) * bv_abs + eb.row_abs * vmax;
      const double rest = ef.rel * f_w + ef.row_abs * wmax + std::min(fz_inf, pinv.fz_factor) * dbv +
                          dmq * u * f_zbv + dmk * u * f_w;
      worst = std::max(worst, pinv.out + rest);
    }
  return 2 * worst + std::numeric_limits<float>::min();
}

// ---- The gradient tolerance ----

// Rows meeting in logits s x·y, in fp64, with for landmark rows the segment means of |rows| and the segment
// lengths (their fp32 means are off by (len + 1) u mean|rows| per component); null for rows read from Q or K.
struct GradRows {
  const double* rows;
  const double* abs_means;
  const int64_t* lens;
  int64_t count;
};

// Per-element error bounds of one fp32 softmax (rows × cols, row-major), from its fp64 logits `lg` and
// weights `w`: es, the logit's error (a d-term dot with the scale, and the means' errors); eps, the relative
// change of the weight those errors make to first order (a weight moves by w_j (Δs_j - Σ_l w_l Δs_l): (1 -
// w_j) es_j + Σ_{l != j} w_l es_l; kept apart from rounding because it cancels in Σ_j w_j); rnd, the relative
// rounding of row_max / exp_sub_sum / 1 / sum (the argument and log2(e) roundings, 2 u (max - s), here and in
// the normaliser, the polynomial's 1.5 ulp, the cols-term sum and the scaling).
struct SoftmaxErr {
  std::vector<double> es, eps, rnd;
};
SoftmaxErr softmax_err(const GradRows& x, const GradRows& y, int64_t d, double s,
                       const std::vector<double>& lg, const std::vector<double>& w) {
  const double u = std::ldexp(1.0, -24);
  const int64_t nx = x.count, ny = y.count;
  SoftmaxErr e;
  e.es.resize(lg.size()), e.eps.resize(lg.size()), e.rnd.resize(lg.size());
  for (int64_t i = 0; i < nx; ++i) {
    const double* xi = x.rows + i * d;
    double mx = -std::numeric_limits<double>::infinity(), es_bar = 0, spread = 0;
    for (int64_t j = 0; j < ny; ++j) {
      const double* yj = y.rows + j * d;
      double abs_dot = 0, xa = 0, ya = 0;
      for (int64_t c = 0; c < d; ++c) {
        abs_dot += std::fabs(xi[c] * yj[c]);
        if (x.abs_means) xa += x.abs_means[i * d + c] * std::fabs(yj[c]);
        if (y.abs_means) ya += std::fabs(xi[c]) * y.abs_means[j * d + c];
      }
      const double lx = x.lens ? static_cast<double>(x.lens[i] + 1) : 0,
                   ly = y.lens ? static_cast<double>(y.lens[j] + 1) : 0;
      e.es[i * ny + j] = s * u * (static_cast<double>(d + 2) * abs_dot + lx * xa + ly * ya);
      mx = std::max(mx, lg[i * ny + j]);
    }
    for (int64_t j = 0; j < ny; ++j) {
      es_bar += w[i * ny + j] * e.es[i * ny + j];
      spread += w[i * ny + j] * 2 * u * (mx - lg[i * ny + j]);
    }
    for (int64_t j = 0; j < ny; ++j) {
      const double wj = w[i * ny + j], esj = e.es[i * ny + j];
      e.eps[i * ny + j] = (1 - wj) * esj + (es_bar - wj * esj);
      e.rnd[i * ny + j] = 2 * u * (mx - lg[i * ny + j]) + spread + static_cast<double>(ny + 6) * u;
    }
  }
  return e;
}

// Why these bounds. A running error analysis of the backward (Nystrom::backward), to first order in u =
// 2^-24, element by element in fp64 from the exact intermediates (head_grad_fp64); m-term fp32 sums of
// products are off by m u Σ|terms| (any order, so any blocking). Where the pinv enters, the elements are
// those of the SVD basis of A = U Σ Vᵀ (as in abs_tolerance), where every exact iterate and adjoint step is
// diagonal: an element bound there is carried exactly, mode by mode, while bounds in the usual basis (or in
// norms) grow ×13/4 per step through the slow modes and pair a slow mode's error with a fast mode's σ; a
// first version with Frobenius norms was 1e8 times the actual error, above the gradient itself. Bounds move
// between the bases as |U|ᵀ E |V| and |U| E |V|ᵀ. Per (batch, query head):
//  1. Landmarks: |ΔQ̃_ie| <= (len_i + 1) u mean|Q|_ie over its segment, likewise K̃ over its valid keys.
//     Softmaxes (softmax_err): F, A and B's weights carry a logit part eps (which cancels in a row's sum,
//     and the bounds keep paired where two quantities share it) and a rounding part rnd. B is recomputed
//     from the forward's log-sum-exp: the forward's sum (n terms, 5 u per key block of rescaling) and log,
//     and the backward's exp(s - lse) (2 u |s - lse| + 3 u); the saved B V has the same logit part and error
//     Σ_c B_c es_c |V_c - BV| + Σ_c B_c |V_c| rnd_c.
//  2. The forward pinv's iterates: with x_a = σ_a ζ_a (the modes of A Z_k) and μ_ab = |h[x_a, x_b]|, ΔZ̃_{k+1}
//     = μ ∘ ΔZ̃_k + ζ_a |g[x_a, x_b]| X's sources (ΔÃ ζ_b from ΔA Z_k, its rounding) + ζ_a / 4 the T
//     roundings + ¼ Z T3's rounding, from Z0's α ΔÃᵀ, α's error η ζ_0 and rounding; X̃_k is off by ΔÃ ζ_b +
//     σ_a ΔZ̃_k + rounding, T2 and T3 by X's times |x_a + x_b - 7| and |15 - x_b (7 - x_b)| + x_a ΔT̃2 and
//     their roundings. ΔW ⊃ ΔZ_K (B V) <= |V| ΔZ̃_K |Uᵀ B V| and Δd(BV) ⊃ ΔZ_Kᵀ dW <= |U| ΔZ̃_Kᵀ |Vᵀ dW|.
//  3. The F part: dW = Fᵀ dO (Lq terms), dF = dO Wᵀ (d terms, with ΔW), delta = Σ_l F_l dF_l, dS_F = F (dF
//     - delta): dF's errors and F's rounding as they enter both dF_l and delta, F's logit part through Σ_m
//     F_m Δs_m (dF_m - delta) (first order, exact), then dQ = s dS_F K̃ and dK̃ += s dS_Fᵀ Q.
//  4. d(B V) = Zᵀ dW: step 2's term, |Z|ᵀ |ΔdW| and mk u |Z|ᵀ |dW|.
//  5. The pinv's reverse mode: with Λ̃ = Vᵀ (dL/dZ) U, the exact reverse of step k is Λ̃_k = μ ∘ Λ̃_{k+1}
//     (h[x_a, x_b] = g(x_b) + x_a g[x_a, x_b]: the forward's multipliers), it adds g[x_a, x_b] ζ_a ζ_b
//     Λ̃_{k+1} to Uᵀ dA V, and Z0 = α Aᵀ adds α Λ̃_0ᵀ. An error entering Λ_k so reaches dÃ with J^(k) = Σ_{l<k}
//     |g^(l)| ζζ Π_{l<m<k} μ^(m) (and transposed, α Π_{m<k} μ^(m)); one in step k's dX directly with ζ_k (dX
//     Z_kᵀ) and with σ through Aᵀ dX into Λ_k; one in dT3, dT2, dT1 as dX's times |q[x_c, x_a]| = 4 |g[x_c,
//     x_a]|, |x_c + x_a - 7| and 1 (the adjoints of T3(X), T2, T1). The sources, as element bounds in the
//     basis: dZ = dW (B V)ᵀ's error with its exact factors kept (Vᵀ ΔdW (Uᵀ BV)ᵀ and (Vᵀ dW) ΔBVᵀ U: B V and
//     dW, like A, barely reach A's slow modes) and its rounding; every GEMM's rounding from the fp64 reverse
//     iterates (PinvBackTrace); the forward iterates' errors (2) times the adjoint met there (¼ |Λ̃'| ΔT̃3ᵀ, ¼
//     ΔZ̃ᵀ |Λ̃'|, ΔX̃ᵀ |dT̃3|, ...) and ΔÃᵀ |dX̃|. Z0's scaling: dα = <Λ_0, Aᵀ> (Λ_0's error meets Σ on the
//     diagonal), d‖A‖₁ = -α/‖A‖₁ dα on the argmax column (both columns when the two largest column sums are
//     within their fp32 error: fp32 may take the other), and d‖A‖∞ on a row: A's rows sum to 1, so its
//     softmax backward cancels that up to the row's rounding, A_ij |d‖A‖∞| (|1 - Σ_l A_il| + (mk + 2) u),
//     whichever row.
//  6. dS_A = A (dA - rowsum(A dA)), then dQ̃ = s dS_A K̃, dK̃ += s dS_Aᵀ Q̃: dA's modal error through the exact
//     linear map, ΔdQ̃_ie = s Σ_ca ΔdÃ_ca U_ic Σ_j A_ij (K̃_je - (A K̃)_ie) V_ja and ΔdK̃_le = s Σ_ca ΔdÃ_ca
//     Σ_i U_ic Q̃_ie A_il (V_la - (A V)_ia), which annihilates a row-constant error of dA (the largest part of
//     the reverse mode's actual error: A's top V mode is nearly constant, its rows summing to 1); A's own
//     errors and α's rounding element by element, as 3.
//  7. The B part: dB = d(B V) Vᵀ and delta_B = d(B V) · (B V) share d(B V)'s error (Σ_e |Δd(BV)_e| |V_ce -
//     BV_e|) and the logits (Σ_c' B_c' es_c' |dB_c' - delta_B|); dV = Bᵀ d(B V) and dK = s dS_Bᵀ Q̃ over the
//     group's G mq rows, dQ̃ += s dS_B K over the n valid keys.
//  8. The landmarks' spread: dQ += dQ̃_i / len_i, dK += dK̃_l / len_l, with the sums' term counts.
// Each tolerance is twice the largest element bound (the analysis is first order, and the SVD is computed in
// fp64: the factor covers both). On the check's inputs the bounds are 1e2-2e5 times the actual error (median
// 1e4 for dQ, dK, 1e3 for dV): worst-case m-term sums (the 130-row dW alone is 300x its actual error) times
// the pinv's amplification of them. A reverse mode one step short, Aᵀ for A in it and segment boundaries by
// ⌈i·n/c⌉ exceed them (tests/test_nystrom.cpp).
GradientTolerance Nystrom::grad_tolerance(const Problem& p, const AttentionInputs& stored,
                                          const float* d_out) const {
  const WideInputs wide(p, stored);  // the values the kernel was given
  const AttentionInputs& in = wide.get();
  const double u = std::ldexp(1.0, -24), s = p.effective_scale();
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv, G = p.group_size(), KVH = p.num_kv_heads();
  const int64_t K = p.param_int("pinv_iterations"), key_blocks = (Lkv + kKeyBlock - 1) / kKeyBlock;
  auto sz = [](int64_t x) { return static_cast<std::size_t>(x); };
  std::vector<double> worst(sz(3 * p.batch * KVH), 0.0);
  tbb::parallel_for(int64_t{0}, p.batch * KVH, [&](int64_t bkv) {
    const int64_t b = bkv / KVH;
    const float* k = in.k + bkv * Lkv * D;
    const float* v = in.v + bkv * Lkv * D;
    // Per key of this K/V head, summed over the group: the B part's error and magnitude for dK and dV; per
    // key landmark, dK̃'s error, magnitude and exact value.
    std::vector<double> ek(sz(Lkv * D), 0.0), mag_k(ek.size(), 0.0), ev(ek.size(), 0.0),
        mag_v(ek.size(), 0.0), dk_b(ek.size(), 0.0);
    std::vector<double> edkt, mag_kt, dkt;
    std::vector<int64_t> keys;
    int64_t mk = 0;
    double& wq = worst[sz(3 * bkv)];
    for (int64_t h = bkv % KVH * G; h < (bkv % KVH + 1) * G; ++h) {
      const HeadGrad g = head_grad_fp64(p, in, d_out, b, h, nystrom::GradientDefect::none, true);
      const HeadFp64& r = g.r;
      if (r.mkv == 0) continue;  // every key padded: exact zeros
      const int64_t mq = r.mq, n = static_cast<int64_t>(r.keys.size());
      mk = r.mkv, keys = r.keys;
      if (edkt.empty()) edkt.assign(sz(mk * D), 0.0), mag_kt = edkt, dkt = edkt;
      const int64_t bh = b * p.heads + h;
      const float* q = in.q + bh * Lq * D;
      const float* dout = d_out + bh * Lq * D;
      const double dmq = static_cast<double>(mq), dmk = static_cast<double>(mk);

      // 1. Landmarks and softmaxes.
      std::vector<double> q64(q, q + Lq * D), k64(sz(n * D)), v64(sz(n * D));
      for (int64_t c = 0; c < n; ++c)
        for (int64_t d = 0; d < D; ++d)
          k64[sz(c * D + d)] = k[keys[c] * D + d], v64[sz(c * D + d)] = v[keys[c] * D + d];
      std::vector<double> q_abs(sz(mq * D), 0.0), k_abs(sz(mk * D), 0.0), eqt(q_abs.size()),
          ekt(k_abs.size());
      std::vector<int64_t> qlen(sz(mq)), klen(sz(mk));
      auto abs_means = [D](const std::vector<double>& x, int64_t rows, int64_t count,
                           std::vector<double>& out, std::vector<int64_t>& len) {
        for (int64_t i = 0; i < count; ++i) {
          const int64_t i0 = segment_begin(i, rows, count), i1 = segment_begin(i + 1, rows, count);
          len[static_cast<std::size_t>(i)] = i1 - i0;
          for (int64_t c = i0; c < i1; ++c)
            for (int64_t d = 0; d < D; ++d)
              out[i * D + d] += std::fabs(x[c * D + d]) / static_cast<double>(i1 - i0);
        }
      };
      abs_means(q64, Lq, mq, q_abs, qlen);
      abs_means(k64, n, mk, k_abs, klen);
      for (int64_t i = 0; i < mq; ++i)
        for (int64_t d = 0; d < D; ++d)
          eqt[sz(i * D + d)] = static_cast<double>(qlen[i] + 1) * u * q_abs[i * D + d];
      for (int64_t l = 0; l < mk; ++l)
        for (int64_t d = 0; d < D; ++d)
          ekt[sz(l * D + d)] = static_cast<double>(klen[l] + 1) * u * k_abs[l * D + d];
      const GradRows q_rows{q64.data(), nullptr, nullptr, Lq},
          qt_rows{r.qt.data(), q_abs.data(), qlen.data(), mq},
          kt_rows{r.kt.data(), k_abs.data(), klen.data(), mk}, k_rows{k64.data(), nullptr, nullptr, n};
      auto logits = [&](const GradRows& x, const GradRows& y) {
        std::vector<double> lg(sz(x.count * y.count));
        for (int64_t i = 0; i < x.count; ++i)
          for (int64_t j = 0; j < y.count; ++j) {
            double acc = 0;
            for (int64_t d = 0; d < D; ++d) acc += x.rows[i * D + d] * y.rows[j * D + d];
            lg[sz(i * y.count + j)] = s * acc;
          }
        return lg;
      };
      const SoftmaxErr ef = softmax_err(q_rows, kt_rows, D, s, logits(q_rows, kt_rows), g.f);
      const SoftmaxErr ea = softmax_err(qt_rows, kt_rows, D, s, logits(qt_rows, kt_rows), r.a);
      const SoftmaxErr eb = softmax_err(qt_rows, k_rows, D, s, g.blog, g.bw);
      // B's rounding in the backward (from the saved lse) and the saved B V's error (logit part, rounding).
      std::vector<double> rnd_b(g.bw.size()), ebv(sz(mq * D), 0.0), ebv_rnd(ebv.size(), 0.0);
      for (int64_t i = 0; i < mq; ++i) {
        double mx = -std::numeric_limits<double>::infinity(), sum = 0, spread = 0;
        for (int64_t c = 0; c < n; ++c) mx = std::max(mx, g.blog[sz(i * n + c)]);
        for (int64_t c = 0; c < n; ++c) {
          sum += std::exp(g.blog[sz(i * n + c)] - mx);
          spread += g.bw[sz(i * n + c)] * 2 * u * (mx - g.blog[sz(i * n + c)]);
        }
        const double lse = mx + std::log(sum);
        const double r_lse =
            spread + static_cast<double>(n + 5 * key_blocks + 8) * u + 2 * u * std::fabs(lse);
        for (int64_t c = 0; c < n; ++c) {
          const double bw = g.bw[sz(i * n + c)], lg = g.blog[sz(i * n + c)];
          rnd_b[sz(i * n + c)] = r_lse + 2 * u * std::fabs(lg - lse) + 3 * u;
          const double fwd_rnd = 2 * u * (mx - lg) + spread + static_cast<double>(n + 5 * key_blocks + 8) * u;
          for (int64_t d = 0; d < D; ++d) {
            const double vcd = v64[sz(c * D + d)];
            ebv_rnd[sz(i * D + d)] += bw * std::fabs(vcd) * fwd_rnd;
            ebv[sz(i * D + d)] += bw * eb.es[sz(i * n + c)] * std::fabs(vcd - r.bv[i * D + d]);
          }
        }
      }
      for (std::size_t e = 0; e < ebv.size(); ++e) ebv[e] += ebv_rnd[e];

      // 2. A's error, α's, the SVD of A and the modes through the iteration.
      std::vector<double> e_a(r.a.size());
      for (std::size_t e = 0; e < r.a.size(); ++e) e_a[e] = r.a[e] * (ea.eps[e] + ea.rnd[e]);
      const auto [a_inf, a_1] = nystrom::norm_inf_1(r.a.data(), mq, mk);
      const double alpha = 1 / (a_1 * a_inf);
      std::vector<double> colsum(sz(mk), 0.0), ecol(sz(mk), 0.0), erow(sz(mq), 0.0);
      for (int64_t i = 0; i < mq; ++i)
        for (int64_t l = 0; l < mk; ++l) {
          colsum[sz(l)] += r.a[sz(i * mk + l)];
          ecol[sz(l)] += e_a[sz(i * mk + l)];
          erow[sz(i)] += r.a[sz(i * mk + l)] * ea.rnd[sz(i * mk + l)];  // the logit part cancels in a row
        }
      double rel_1 = 0, rel_inf = 0;
      for (int64_t l = 0; l < mk; ++l) rel_1 = std::max(rel_1, (ecol[sz(l)] + dmq * u * colsum[sz(l)]) / a_1);
      for (int64_t i = 0; i < mq; ++i)
        erow[sz(i)] += dmk * u, rel_inf = std::max(rel_inf, erow[sz(i)] / a_inf);
      const double eta = rel_1 + rel_inf + 3 * u;
      std::vector<double> at(sz(mk * mq)), gram_u(sz(mq * mq)), gram_v(sz(mk * mk)), lam_u, lam_v, U, V;
      for (int64_t i = 0; i < mq; ++i)
        for (int64_t l = 0; l < mk; ++l) at[sz(l * mq + i)] = r.a[sz(i * mk + l)];
      nystrom::matmul64(r.a.data(), at.data(), mq, mk, mq, gram_u.data());
      nystrom::matmul64(at.data(), r.a.data(), mk, mq, mk, gram_v.data());
      sym_eigen(gram_u, mq, lam_u, U);
      sym_eigen(gram_v, mk, lam_v, V);
      const int64_t rank = std::min(mq, mk), modes = std::max(mq, mk);
      std::vector<double> sigma(sz(modes), 0.0);
      std::vector<std::vector<double>> xs(sz(K + 1), std::vector<double>(sz(modes), 0.0)), zs = xs;
      for (int64_t i = 0; i < rank; ++i) {
        sigma[sz(i)] = std::sqrt(std::max(lam_u[sz(i)], 0.0));
        xs[0][sz(i)] = alpha * sigma[sz(i)] * sigma[sz(i)], zs[0][sz(i)] = alpha * sigma[sz(i)];
        for (int64_t it = 0; it < K; ++it) {
          xs[sz(it + 1)][sz(i)] = h_poly(xs[sz(it)][sz(i)]);
          zs[sz(it + 1)][sz(i)] = zs[sz(it)][sz(i)] * g_poly(xs[sz(it)][sz(i)]);
        }
      }
      // Multipliers per step (mk × mq, V side a, U side b): μ = |h[x_a, x_b]|, |g[x_a, x_b]|.
      std::vector<std::vector<double>> mu(sz(K), std::vector<double>(sz(mk * mq))), gab = mu;
      for (int64_t it = 0; it < K; ++it)
        for (int64_t a = 0; a < mk; ++a)
          for (int64_t c = 0; c < mq; ++c) {
            mu[sz(it)][sz(a * mq + c)] = std::fabs(h_dd(xs[sz(it)][sz(a)], xs[sz(it)][sz(c)]));
            gab[sz(it)][sz(a * mq + c)] = std::fabs(g_dd(xs[sz(it)][sz(a)], xs[sz(it)][sz(c)]));
          }
      // Matrix helpers: products, |x|, transposes, and images in the modal basis, |U|ᵀ E |U| (mq × mq),
      // |V|ᵀ E |U| (mk × mq) and |U|ᵀ E |V| (mq × mk): element bounds there from element bounds E here.
      auto mul = [](const std::vector<double>& x, const std::vector<double>& y, int64_t rows, int64_t inner,
                    int64_t cols) {
        std::vector<double> out(static_cast<std::size_t>(rows * cols));
        nystrom::matmul64(x.data(), y.data(), rows, inner, cols, out.data());
        return out;
      };
      auto absv = [](std::vector<double> x) {
        for (double& e : x) e = std::fabs(e);
        return x;
      };
      auto trans = [](const std::vector<double>& x, int64_t rows, int64_t cols) {
        std::vector<double> out(x.size());
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j)
            out[static_cast<std::size_t>(j * rows + i)] = x[static_cast<std::size_t>(i * cols + j)];
        return out;
      };
      auto axpy = [](std::vector<double>& y, double a, const std::vector<double>& x) {
        for (std::size_t e = 0; e < y.size(); ++e) y[e] += a * x[e];
      };
      const std::vector<double> ua = absv(U), va = absv(V), uat = trans(ua, mq, mq), vat = trans(va, mk, mk),
                                ut = trans(U, mq, mq), vt = trans(V, mk, mk);
      auto modal_uu = [&](const std::vector<double>& e) {
        return mul(mul(uat, e, mq, mq, mq), ua, mq, mq, mq);
      };
      auto modal_vu = [&](const std::vector<double>& e) {
        return mul(mul(vat, e, mk, mk, mq), ua, mk, mq, mq);
      };
      auto modal_uv = [&](const std::vector<double>& e) {
        return mul(mul(uat, e, mq, mq, mk), va, mq, mk, mk);
      };
      // |Uᵀ M U| and |Vᵀ M U| of exact matrices.
      auto exact_uu = [&](const std::vector<double>& m) {
        return absv(mul(mul(ut, m, mq, mq, mq), U, mq, mq, mq));
      };
      auto exact_vu = [&](const std::vector<double>& m) {
        return absv(mul(mul(vt, m, mk, mk, mq), U, mk, mq, mq));
      };
      const std::vector<double> abs_a = absv(r.a), abs_at = trans(abs_a, mq, mk);
      const std::vector<double> ea_m = modal_uv(e_a), ea_mt = trans(ea_m, mq, mk);  // |ΔÃ| (U mode, V mode)
      // The exact iterates and T1..T3 of every step (fp64), as the reverse mode meets them.
      struct Step {
        std::vector<double> z, x, t1, t2, t3;
      };
      std::vector<Step> steps(sz(K));
      auto shifted = [mq](double c, std::vector<double> m) {
        for (double& e : m) e = -e;
        for (int64_t i = 0; i < mq; ++i) m[static_cast<std::size_t>(i * mq + i)] += c;
        return m;
      };
      for (int64_t it = 0; it < K; ++it) {
        Step& st = steps[sz(it)];
        st.z.assign(g.iterates.begin() + it * mk * mq, g.iterates.begin() + (it + 1) * mk * mq);
        st.x = mul(r.a, st.z, mq, mk, mq);
        st.t1 = shifted(7, st.x);
        st.t2 = shifted(15, mul(st.x, st.t1, mq, mq, mq));
        st.t3 = shifted(13, mul(st.x, st.t2, mq, mq, mq));
      }
      // The forward iterates' errors, element bounds in the modal basis: ΔZ̃_k (mk × mq) and ΔX̃_k, ΔT̃2_k,
      // ΔT̃3_k (mq × mq). Z0 = α Aᵀ: α ΔÃᵀ, α's error (η ζ_0 on the diagonal) and its rounding. Step k: X = A
      // Z_k is off by ΔÃ ζ (ΔA Z_k), σ ΔZ̃_k (A ΔZ_k) and its rounding; T2 = 15I − X T1 and T3 = 13I − X T2 by
      // those through X (|x_a + x_b − 7|, then |15 − x_b (7 − x_b)| and x_a ΔT̃2) and their own roundings;
      // Z_{k+1} by μ ΔZ̃_k, ζ_a |g[x_a, x_b]| times X's sources, ζ_a / 4 times the T roundings' and ¼ Z T3's
      // rounding.
      std::vector<std::vector<double>> ez(sz(K + 1)), ex(sz(K)), et2(sz(K)), et3(sz(K));
      {
        std::vector<double> z0(sz(mk * mq));
        for (int64_t i = 0; i < mq; ++i)
          for (int64_t l = 0; l < mk; ++l) z0[sz(l * mq + i)] = u * alpha * abs_a[sz(i * mk + l)];
        ez[0] = modal_vu(z0);
        axpy(ez[0], alpha, ea_mt);
        for (int64_t i = 0; i < rank; ++i) ez[0][sz(i * mq + i)] += eta * zs[0][sz(i)];
      }
      for (int64_t it = 0; it < K; ++it) {
        const Step& st = steps[sz(it)];
        const std::vector<double>& x = xs[sz(it)];
        const std::vector<double>& z = zs[sz(it)];
        const std::vector<double> az = absv(st.z), ax = absv(st.x), at1 = absv(st.t1), at2 = absv(st.t2),
                                  at3 = absv(st.t3);
        std::vector<double> rx = mul(abs_a, az, mq, mk, mq), r2 = mul(ax, at1, mq, mq, mq),
                            r3 = mul(ax, at2, mq, mq, mq), rz = mul(az, at3, mk, mq, mq);
        for (std::size_t e = 0; e < rx.size(); ++e) {
          rx[e] *= dmk * u;
          r2[e] = dmq * u * r2[e] + u * (at1[e] + at2[e]);
          r3[e] = dmq * u * r3[e] + u * at3[e];
        }
        for (double& e : rz) e *= dmq * u / 4;
        rx = modal_uu(rx), r2 = modal_uu(r2), r3 = modal_uu(r3), rz = modal_vu(rz);
        ex[sz(it)].assign(sz(mq * mq), 0.0), et2[sz(it)] = ex[sz(it)], et3[sz(it)] = ex[sz(it)];
        ez[sz(it + 1)].assign(sz(mk * mq), 0.0);
        for (int64_t a = 0; a < mq; ++a)
          for (int64_t c = 0; c < mq; ++c) {
            const std::size_t ab = sz(a * mq + c);
            const double via_a = c < rank ? ea_m[sz(a * mk + c)] * z[sz(c)] : 0.0;
            const double via_z = a < rank ? sigma[sz(a)] * ez[sz(it)][ab] : 0.0;
            ex[sz(it)][ab] = via_a + via_z + rx[ab];
            et2[sz(it)][ab] = std::fabs(x[sz(a)] + x[sz(c)] - 7) * ex[sz(it)][ab] + r2[ab];
            et3[sz(it)][ab] = std::fabs(15 - x[sz(c)] * (7 - x[sz(c)])) * ex[sz(it)][ab] +
                              x[sz(a)] * et2[sz(it)][ab] + r3[ab];
            if (a < rank)
              ez[sz(it + 1)][ab] +=
                  z[sz(a)] * (gab[sz(it)][ab] * (via_a + rx[ab]) + (x[sz(a)] * r2[ab] + r3[ab]) / 4);
          }
        for (int64_t a = 0; a < mk; ++a)
          for (int64_t c = 0; c < mq; ++c) {
            const std::size_t ab = sz(a * mq + c);
            ez[sz(it + 1)][ab] += mu[sz(it)][ab] * ez[sz(it)][ab] + rz[ab];
          }
      }
      // ΔW ⊃ ΔZ_K (B V) <= |V| ΔZ̃_K |Uᵀ B V|; Δd(B V) ⊃ ΔZ_Kᵀ dW <= |U| ΔZ̃_Kᵀ |Vᵀ dW|.
      const std::vector<double> utbv = absv(mul(ut, r.bv, mq, mq, D)), vtdw = absv(mul(vt, g.dw, mk, mk, D));
      std::vector<double> ew = mul(va, mul(ez[sz(K)], utbv, mk, mq, D), mk, mk, D);
      std::vector<double> edbv = mul(ua, mul(trans(ez[sz(K)], mk, mq), vtdw, mq, mk, D), mq, mq, D);
      for (int64_t l = 0; l < mk; ++l)
        for (int64_t d = 0; d < D; ++d)
          for (int64_t j = 0; j < mq; ++j) {
            const double zlj = std::fabs(r.z[sz(l * mq + j)]);
            ew[sz(l * D + d)] += zlj * (ebv[sz(j * D + d)] + dmq * u * std::fabs(r.bv[j * D + d]));
          }

      // 3. The F part.
      std::vector<double> edw(sz(mk * D), 0.0);
      double wq_head = 0;
      std::vector<double> edq(sz(Lq * D), 0.0), edf(sz(mk)), edsf(sz(mk));
      for (int64_t i = 0; i < Lq; ++i) {
        const double* f = &g.f[sz(i * mk)];
        const double* df = &g.df[sz(i * mk)];
        const float* gi = dout + i * D;
        double delta = 0;
        for (int64_t l = 0; l < mk; ++l) delta += f[l] * df[l];
        double e_delta = 0;
        for (int64_t l = 0; l < mk; ++l) {
          double e = 0, mag = 0;
          for (int64_t d = 0; d < D; ++d) {
            e += std::fabs(static_cast<double>(gi[d])) * ew[sz(l * D + d)];
            mag += std::fabs(gi[d] * r.w[l * D + d]);
          }
          edf[sz(l)] = e + static_cast<double>(D + 1) * u * mag;
          const size_t il = sz(i * mk + l);
          e_delta += f[l] * (ef.es[il] * std::fabs(df[l] - delta) + ef.rnd[il] * std::fabs(df[l]) +
                             edf[sz(l)] + (dmk + 1) * u * std::fabs(df[l]));
        }
        for (int64_t l = 0; l < mk; ++l) {
          const size_t il = sz(i * mk + l);
          const double diff = df[l] - delta;
          edsf[sz(l)] = f[l] * ((ef.eps[il] + ef.rnd[il] + 3 * u) * std::fabs(diff) + edf[sz(l)] + e_delta);
          for (int64_t d = 0; d < D; ++d) {
            edw[sz(l * D + d)] += f[l] * std::fabs(static_cast<double>(gi[d])) *
                                  (ef.eps[il] + ef.rnd[il] + static_cast<double>(Lq + 1) * u);
            edkt[sz(l * D + d)] += s * edsf[sz(l)] * std::fabs(static_cast<double>(q[i * D + d]));
            mag_kt[sz(l * D + d)] += s * std::fabs(g.dsf[il] * q[i * D + d]);
          }
        }
        for (int64_t d = 0; d < D; ++d) {
          double e = 0, mag = 0;
          for (int64_t l = 0; l < mk; ++l) {
            const double ktl = r.kt[l * D + d], ds = g.dsf[sz(i * mk + l)];
            e += edsf[sz(l)] * std::fabs(ktl) + std::fabs(ds) * ekt[sz(l * D + d)];
            mag += std::fabs(ds * ktl);
          }
          edq[sz(i * D + d)] = s * (e + (dmk + 2) * u * mag);
        }
      }

      // 4. d(B V) = Zᵀ dW: |Z|ᵀ |ΔdW| and the GEMM's rounding (ΔZ's part above; dZ's error in 5).
      for (int64_t j = 0; j < mq; ++j)
        for (int64_t d = 0; d < D; ++d)
          for (int64_t l = 0; l < mk; ++l) {
            const double zlj = std::fabs(r.z[sz(l * mq + j)]);
            edbv[sz(j * D + d)] +=
                zlj * (edw[sz(l * D + d)] + (dmk + 1) * u * std::fabs(g.dw[sz(l * D + d)]));
          }

      // 5. The pinv's reverse mode in the modal basis: J^(k), P^(k) (mk × mq) for k = 0..K; every source an
      // element bound there, carried to ΔdÃ (mq × mk, U mode, V mode) and to Λ_0 (for dα).
      std::vector<std::vector<double>> J(sz(K + 1), std::vector<double>(sz(mk * mq), 0.0)),
          P(sz(K + 1), std::vector<double>(sz(mk * mq), 1.0));
      for (int64_t it = 0; it < K; ++it)
        for (int64_t a = 0; a < mk; ++a)
          for (int64_t c = 0; c < mq; ++c) {
            const std::size_t e = sz(a * mq + c);
            J[sz(it + 1)][e] =
                mu[sz(it)][e] * J[sz(it)][e] + gab[sz(it)][e] * zs[sz(it)][sz(a)] * zs[sz(it)][sz(c)];
            P[sz(it + 1)][e] = mu[sz(it)][e] * P[sz(it)][e];
          }
      std::vector<double> eda_m(sz(mq * mk), 0.0), elam0(sz(mk * mq), 0.0);
      // An error sl (mk × mq) in Λ_k: through steps k−1..0 to dA, and through Z0 = α Aᵀ (transposed).
      auto add_lambda = [&](int64_t level, const std::vector<double>& sl) {
        for (int64_t c = 0; c < mq; ++c)
          for (int64_t a = 0; a < mk; ++a) {
            double val = alpha * P[sz(level)][sz(a * mq + c)] * sl[sz(a * mq + c)];
            if (c < rank && a < rank) val += J[sz(level)][sz(c * mq + a)] * sl[sz(c * mq + a)];
            eda_m[sz(c * mk + a)] += val;
          }
        for (std::size_t e = 0; e < elam0.size(); ++e) elam0[e] += P[sz(level)][e] * sl[e];
      };
      // An error sx (mq × mq) in step k's dX: dA += dX Z_kᵀ (ζ_k on the V side) and Λ_k += Aᵀ dX (σ).
      auto add_dx = [&](int64_t step, const std::vector<double>& sx) {
        std::vector<double> sl(sz(mk * mq), 0.0);
        for (int64_t a = 0; a < rank; ++a)
          for (int64_t c = 0; c < mq; ++c) sl[sz(a * mq + c)] = sigma[sz(a)] * sx[sz(a * mq + c)];
        for (int64_t c = 0; c < mq; ++c)
          for (int64_t a = 0; a < rank; ++a)
            eda_m[sz(c * mk + a)] += sx[sz(c * mq + a)] * zs[sz(step)][sz(a)];
        add_lambda(step, sl);
      };
      const nystrom::PinvBackTrace& bt = g.trace;
      {
        // dZ = dW (B V)ᵀ: ΔdW (B V)ᵀ and dW ΔBVᵀ keep their exact factor in the modal basis (Vᵀ ΔdW (Uᵀ BV)ᵀ:
        // B V, like A, barely reaches A's slow U modes); the product's rounding goes element by element.
        const std::vector<double> abs_bv = absv(r.bv), abs_dw = absv(g.dw);
        std::vector<double> rnd = mul(abs_dw, trans(abs_bv, mq, D), mk, D, mq);
        for (double& e : rnd) e *= static_cast<double>(D + 1) * u;
        std::vector<double> sl = modal_vu(rnd);
        axpy(sl, 1.0, mul(mul(vat, edw, mk, mk, D), trans(utbv, mq, D), mk, D, mq));
        axpy(sl, 1.0, mul(vtdw, trans(mul(uat, ebv, mq, mq, D), mq, D), mk, D, mq));
        add_lambda(K, sl);
      }
      for (int64_t it = K - 1; it >= 0; --it) {
        const nystrom::PinvBackStep& bs = bt.steps[sz(it)];
        const Step& st = steps[sz(it)];
        const std::vector<double>& x = xs[sz(it)];
        const std::vector<double> az = absv(st.z), ax = absv(st.x), at1 = absv(st.t1), at2 = absv(st.t2),
                                  at3 = absv(st.t3), alam = absv(bs.lam), adt3 = absv(bs.dt3),
                                  adt2 = absv(bs.dt2), adx = absv(bs.dx);
        const std::vector<double> lam_m = exact_vu(bs.lam), dt3_m = exact_uu(bs.dt3),
                                  dt2_m = exact_uu(bs.dt2), dx_m = exact_uu(bs.dx),
                                  lam_k_m = exact_vu(it > 0 ? bt.steps[sz(it - 1)].lam : bt.lam0);
        const std::vector<double> axt = trans(ax, mq, mq), ext = trans(ex[sz(it)], mq, mq);
        // Λ_k: the roundings of ¼ Λ' T3ᵀ, Aᵀ dX and their sum; T3's error met by Λ'; ΔAᵀ dX.
        std::vector<double> rl = mul(alam, trans(at3, mq, mq), mk, mq, mq), ra = mul(abs_at, adx, mk, mq, mq);
        for (std::size_t e = 0; e < rl.size(); ++e) rl[e] = dmq * u / 4 * rl[e] + (dmq + 1) * u * ra[e];
        std::vector<double> sl = modal_vu(rl);
        axpy(sl, u, lam_k_m);
        axpy(sl, 0.25, mul(lam_m, trans(et3[sz(it)], mq, mq), mk, mq, mq));
        axpy(sl, 1.0, mul(ea_mt, dx_m, mk, mq, mq));
        add_lambda(it, sl);
        // dT3 = ¼ Zᵀ Λ': its rounding and Z_k's error; dT2 = −Xᵀ dT3 and dT1 = −Xᵀ dT2: theirs and X's; dX's
        // own products (−dT3 T2ᵀ, −dT2 T1ᵀ), the two updates, and T2's and T1's errors. dT3's reach dX times
        // 4 |g[x_c, x_a]|, dT2's times |x_c + x_a − 7|, dT1's as they are.
        std::vector<double> r3 = mul(trans(az, mk, mq), alam, mq, mk, mq);
        for (double& e : r3) e *= dmk * u / 4;
        std::vector<double> s3 = modal_uu(r3);
        axpy(s3, 0.25, mul(trans(ez[sz(it)], mk, mq), lam_m, mq, mk, mq));
        std::vector<double> r2 = mul(axt, adt3, mq, mq, mq);
        for (double& e : r2) e *= dmq * u;
        std::vector<double> s2 = modal_uu(r2);
        axpy(s2, 1.0, mul(ext, dt3_m, mq, mq, mq));
        std::vector<double> r1 = mul(axt, adt2, mq, mq, mq), rxa = mul(adt3, trans(at2, mq, mq), mq, mq, mq),
                            rxb = mul(adt2, trans(at1, mq, mq), mq, mq, mq);
        for (std::size_t e = 0; e < r1.size(); ++e)
          r1[e] = dmq * u * (r1[e] + rxa[e]) + (dmq + 1) * u * rxb[e] + 2 * u * adx[e];
        std::vector<double> sx = modal_uu(r1);
        axpy(sx, 1.0, mul(ext, dt2_m, mq, mq, mq));
        axpy(sx, 1.0, mul(dt3_m, trans(et2[sz(it)], mq, mq), mq, mq, mq));
        axpy(sx, 1.0, mul(dt2_m, ext, mq, mq, mq));
        for (int64_t c = 0; c < mq; ++c)
          for (int64_t a = 0; a < mq; ++a) {
            const std::size_t ca = sz(c * mq + a);
            sx[ca] += std::fabs(x[sz(c)] + x[sz(a)] - 7) * s2[ca] +
                      4 * std::fabs(g_dd(x[sz(c)], x[sz(a)])) * s3[ca];
          }
        add_dx(it, sx);
        // dA += dX Z_kᵀ: its rounding (mq terms, K updates) and Z_k's error.
        std::vector<double> rd = mul(adx, trans(az, mk, mq), mq, mq, mk);
        for (double& e : rd) e *= (dmq + static_cast<double>(K)) * u;
        axpy(eda_m, 1.0, modal_uv(rd));
        axpy(eda_m, 1.0, mul(dx_m, trans(ez[sz(it)], mk, mq), mq, mq, mk));
      }

      // What stays element by element in the usual basis (α's terms); eda_m goes to dQ̃ and dK̃ in 6.
      std::vector<double> eda(sz(mq * mk), 0.0);
      // Z0 = α Aᵀ: α's error and the product's rounding on α Λ_0ᵀ (Λ_0's own error went through P above).
      double lam0_a = 0, lam0_ea = 0;
      for (int64_t i = 0; i < mq; ++i)
        for (int64_t l = 0; l < mk; ++l) {
          const double lam = std::fabs(bt.lam0[sz(l * mq + i)]);
          eda[sz(i * mk + l)] += alpha * (2 * u + eta) * lam;
          lam0_a += lam * abs_a[sz(i * mk + l)], lam0_ea += lam * e_a[sz(i * mk + l)];
        }
      // dα = <Λ_0, Aᵀ>: Λ_0's error meets Aᵀ = V Σᵀ Uᵀ on the diagonal; A's error; the sum's rounding.
      double e_dalpha = lam0_ea + (dmq * dmk + 2) * u * lam0_a;
      for (int64_t a = 0; a < rank; ++a) e_dalpha += sigma[sz(a)] * elam0[sz(a * mq + a)];
      const double e_dn1 = std::fabs(bt.d_norm_1) * (eta + 3 * u) + alpha / a_1 * e_dalpha;
      const double e_dninf = std::fabs(bt.d_norm_inf) * (eta + 3 * u) + alpha / a_inf * e_dalpha;
      for (int64_t l = 0; l < mk; ++l) {
        const bool near =
            l != bt.col && colsum[sz(l)] + 2 * (ecol[sz(l)] + ecol[sz(bt.col)] + dmq * u * a_1) >= a_1;
        for (int64_t i = 0; i < mq; ++i) {
          if (l == bt.col) eda[sz(i * mk + l)] += e_dn1;
          if (near) eda[sz(i * mk + l)] += 2 * (std::fabs(bt.d_norm_1) + e_dn1);
        }
      }
      // 6. dS_A, dQ̃ and dK̃ from it. The modal part of dA's error goes through the exact linear map of the
      // softmax backward and the products, which annihilates a row-constant error of dA (the pinv's error is
      // largest along A's top V mode, nearly constant: A's rows sum to 1), so per output element:
      // ΔdQ̃_ie = s Σ_ca ΔdÃ_ca U_ic W^e_ia with W^e_ia = Σ_j A_ij (K̃_je − (A K̃)_ie) V_ja, and
      // ΔdK̃_le = s Σ_ca ΔdÃ_ca Σ_i U_ic Q̃_ie A_il (V_la − (A V)_ia), bounded with |U| ΔdÃ.
      std::vector<double> edqt(sz(mq * D), 0.0), mag_qt(edqt.size(), 0.0), edsa(sz(mk));
      {
        const std::vector<double> y = mul(ua, eda_m, mq, mq, mk);  // Σ_c |U_ic| ΔdÃ_ca, mq × mk
        const std::vector<double> akt = mul(r.a, r.kt, mq, mk, D), av = mul(r.a, V, mq, mk, mk);
        for (int64_t i = 0; i < mq; ++i) {
          for (int64_t d = 0; d < D; ++d) {
            double acc = 0;
            for (int64_t a = 0; a < mk; ++a) {
              double w = 0;
              for (int64_t j = 0; j < mk; ++j)
                w += r.a[sz(i * mk + j)] * (r.kt[j * D + d] - akt[sz(i * D + d)]) * V[sz(j * mk + a)];
              acc += y[sz(i * mk + a)] * std::fabs(w);
            }
            edqt[sz(i * D + d)] += s * acc;
          }
          for (int64_t l = 0; l < mk; ++l) {
            double zil = 0;
            for (int64_t a = 0; a < mk; ++a)
              zil += std::fabs(V[sz(l * mk + a)] - av[sz(i * mk + a)]) * y[sz(i * mk + a)];
            for (int64_t d = 0; d < D; ++d)
              edkt[sz(l * D + d)] += s * std::fabs(r.qt[i * D + d]) * r.a[sz(i * mk + l)] * zil;
          }
        }
      }
      for (int64_t i = 0; i < mq; ++i) {
        const double* a = &r.a[sz(i * mk)];
        const double* dA = &g.da[sz(i * mk)];
        double t = 0, sum_e = 0, sum_logit = 0, sum_rnd = 0;
        for (int64_t l = 0; l < mk; ++l) t += a[l] * dA[l];
        for (int64_t l = 0; l < mk; ++l) {
          const std::size_t il = sz(i * mk + l);
          sum_e += a[l] * eda[il];
          sum_logit += a[l] * ea.es[il] * std::fabs(dA[l] - t);
          sum_rnd += a[l] * (ea.rnd[il] + (dmk + 1) * u) * std::fabs(dA[l]);
        }
        for (int64_t l = 0; l < mk; ++l) {
          const std::size_t il = sz(i * mk + l);
          const double diff = dA[l] - t;
          edsa[sz(l)] =
              a[l] * (eda[il] + sum_e + (ea.eps[il] + ea.rnd[il] + 3 * u) * std::fabs(diff) + sum_logit +
                      sum_rnd + (std::fabs(bt.d_norm_inf) + e_dninf) * (erow[sz(i)] + (dmk + 2) * u));
        }
        for (int64_t l = 0; l < mk; ++l) {
          const double ds = g.dsa[sz(i * mk + l)];
          for (int64_t d = 0; d < D; ++d) {
            const double ktl = r.kt[l * D + d], qti = r.qt[i * D + d];
            edqt[sz(i * D + d)] += s * (edsa[sz(l)] * std::fabs(ktl) + std::fabs(ds) * ekt[sz(l * D + d)]);
            mag_qt[sz(i * D + d)] += s * std::fabs(ds * ktl);
            edkt[sz(l * D + d)] += s * (edsa[sz(l)] * std::fabs(qti) + std::fabs(ds) * eqt[sz(i * D + d)]);
            mag_kt[sz(l * D + d)] += s * std::fabs(ds * qti);
          }
        }
      }

      // 7. The B part.
      std::vector<double> edsb(sz(n));
      for (int64_t i = 0; i < mq; ++i) {
        const double* bw = &g.bw[sz(i * n)];
        const double* db = &g.db[sz(i * n)];
        double delta = 0, e_delta = 0, sum_logit = 0;
        for (int64_t d = 0; d < D; ++d) {
          const double dbv = g.dbv[sz(i * D + d)], bv = r.bv[i * D + d];
          delta += dbv * bv;
          e_delta +=
              std::fabs(dbv) * ebv_rnd[sz(i * D + d)] + static_cast<double>(D + 1) * u * std::fabs(dbv * bv);
        }
        for (int64_t c = 0; c < n; ++c) sum_logit += bw[c] * eb.es[sz(i * n + c)] * std::fabs(db[c] - delta);
        for (int64_t c = 0; c < n; ++c) {
          const std::size_t ic = sz(i * n + c);
          const double diff = db[c] - delta;
          double shared = 0, mag = 0;
          for (int64_t d = 0; d < D; ++d) {
            shared += edbv[sz(i * D + d)] * std::fabs(v64[sz(c * D + d)] - r.bv[i * D + d]);
            mag += std::fabs(g.dbv[sz(i * D + d)] * v64[sz(c * D + d)]);
          }
          edsb[sz(c)] = bw[c] * ((eb.eps[ic] + rnd_b[ic] + 3 * u) * std::fabs(diff) + sum_logit + e_delta +
                                 shared + static_cast<double>(D + 1) * u * mag);
        }
        for (int64_t c = 0; c < n; ++c) {
          const int64_t j = keys[c];
          const std::size_t ic = sz(i * n + c);
          const double ds = g.dsb[ic];
          for (int64_t d = 0; d < D; ++d) {
            const double dbv = g.dbv[sz(i * D + d)], qti = r.qt[i * D + d], kcd = k64[sz(c * D + d)];
            ev[sz(j * D + d)] += bw[c] * ((eb.eps[ic] + rnd_b[ic]) * std::fabs(dbv) + edbv[sz(i * D + d)]);
            mag_v[sz(j * D + d)] += bw[c] * std::fabs(dbv);
            ek[sz(j * D + d)] += s * (edsb[sz(c)] * std::fabs(qti) + std::fabs(ds) * eqt[sz(i * D + d)]);
            mag_k[sz(j * D + d)] += s * std::fabs(ds * qti);
            dk_b[sz(j * D + d)] += s * ds * qti;
            edqt[sz(i * D + d)] += s * edsb[sz(c)] * std::fabs(kcd);
            mag_qt[sz(i * D + d)] += s * std::fabs(ds * kcd);
          }
        }
      }

      // 8. dQ: the F part plus dQ̃ spread over its segment.
      for (int64_t i = 0; i < mq; ++i) {
        const int64_t i0 = segment_begin(i, Lq, mq), i1 = segment_begin(i + 1, Lq, mq);
        const double len = static_cast<double>(i1 - i0);
        for (int64_t row = i0; row < i1; ++row)
          for (int64_t d = 0; d < D; ++d) {
            const double dqt = g.dqt_a[sz(i * D + d)] + g.dqt_b[sz(i * D + d)];
            const double e =
                edq[sz(row * D + d)] +
                (edqt[sz(i * D + d)] + (dmk + static_cast<double>(n) + 2) * u * mag_qt[sz(i * D + d)] +
                 2 * u * std::fabs(dqt)) /
                    len +
                u * std::fabs(g.dq_f[sz(row * D + d)] + dqt / len);
            wq_head = std::max(wq_head, e);
          }
      }
      for (int64_t l = 0; l < mk; ++l)
        for (int64_t d = 0; d < D; ++d) dkt[sz(l * D + d)] += g.dkt_f[sz(l * D + d)] + g.dkt_a[sz(l * D + d)];
      wq = std::max(wq, wq_head);
    }
    double wk = 0, wv = 0;
    const double gmq = static_cast<double>(G * Shape(p).mq);
    if (mk > 0) {
      const int64_t n = static_cast<int64_t>(keys.size());
      for (int64_t l = 0; l < mk; ++l) {
        const int64_t c0 = segment_begin(l, n, mk), c1 = segment_begin(l + 1, n, mk);
        const double len = static_cast<double>(c1 - c0);
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t d = 0; d < D; ++d) {
            const std::size_t jd = sz(keys[c] * D + d), ld = sz(l * D + d);
            const double e_kt =
                (edkt[ld] + (static_cast<double>(G * (Lq + Shape(p).mq)) + 2) * u * mag_kt[ld] +
                 2 * u * std::fabs(dkt[ld])) /
                len;
            wk = std::max(
                wk, ek[jd] + (gmq + 2) * u * mag_k[jd] + e_kt + u * std::fabs(dk_b[jd] + dkt[ld] / len));
            wv = std::max(wv, ev[jd] + (gmq + 1) * u * mag_v[jd]);
          }
      }
    }
    worst[sz(3 * bkv + 1)] = wk, worst[sz(3 * bkv + 2)] = wv;
  });
  GradientTolerance t;
  for (int64_t x = 0; x < p.batch * KVH; ++x) {
    t.dq = std::max(t.dq, worst[sz(3 * x)]);
    t.dk = std::max(t.dk, worst[sz(3 * x + 1)]);
    t.dv = std::max(t.dv, worst[sz(3 * x + 2)]);
  }
  const double tiny = std::numeric_limits<float>::min();
  t.dq = 2 * t.dq + tiny, t.dk = 2 * t.dk + tiny, t.dv = 2 * t.dv + tiny;
  return t;
}

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::Nystrom)
