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
#include <limits>

#include "common/aligned.hpp"
#include "common/attention.hpp"
#include "common/half.hpp"
#include "common/runtime.hpp"
#include "common/util.hpp"
#include "common/vmath.hpp"

namespace attn {
namespace nystrom {

std::size_t pinv_work_floats(int64_t rows, int64_t cols) {
  // X, T, P (rows × rows) and the next Z (cols × rows).
  return sat_add(sat_mul(3, to_size(rows), to_size(rows)), sat_mul(to_size(cols), to_size(rows)));
}

void pinv_fp32(const float* a, int64_t rows, int64_t cols, int64_t iterations, float* z, float* work) {
  const int64_t R = rows, C = cols;
  // ‖A‖₁ (max column sum) and ‖A‖∞ (max row sum) of |A|; A is a softmax here (A ≥ 0, rows sum to 1), but the
  // absolute values keep the definition general. A NaN in A makes both NaN, and Z NaN: nothing is hidden.
  float norm_inf = 0, norm_1 = 0;
  for (int64_t i = 0; i < R; ++i) {
    float s = 0;
    for (int64_t j = 0; j < C; ++j) s += std::fabs(a[i * C + j]);
    norm_inf = std::isnan(s) ? s : std::max(norm_inf, s);
  }
  for (int64_t j = 0; j < C; ++j) {
    float s = 0;
    for (int64_t i = 0; i < R; ++i) s += std::fabs(a[i * C + j]);
    norm_1 =
        std::isnan(s) || std::isnan(norm_1) ? std::numeric_limits<float>::quiet_NaN() : std::max(norm_1, s);
  }
  if (std::isnan(norm_inf)) norm_1 = norm_inf;
  const float alpha = 1.0f / (norm_1 * norm_inf);
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
    sgemm(false, false, R, R, C, 1.0f, a, C, z, R, 0.0f, x, R);      // X = A Z
    shift(7.0f, x, t);                                               // T1 = 7I − X
    sgemm(false, false, R, R, R, 1.0f, x, R, t, R, 0.0f, pr, R);     // X T1
    shift(15.0f, pr, t);                                             // T2 = 15I − X T1
    sgemm(false, false, R, R, R, 1.0f, x, R, t, R, 0.0f, pr, R);     // X T2
    shift(13.0f, pr, t);                                             // T3 = 13I − X T2
    sgemm(false, false, C, R, R, 0.25f, z, R, t, R, 0.0f, next, R);  // Z ← ¼ Z T3
    std::copy(next, next + C * R, z);
  }
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

void pinv_fp64(const double* a, int64_t rows, int64_t cols, int64_t iterations, double* z, PinvTrace* trace) {
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
  for (int64_t k = 0; k < iterations; ++k) {
    PinvStep st;
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

HeadFp64 head_fp64(const Problem& p, const AttentionInputs& in, int64_t b, int64_t h, bool with_trace) {
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
                     with_trace ? &r.trace : nullptr);
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
            .permutation_equivariant = false};
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
    // (common/util.hpp).
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

 protected:
  void forward(const Problem& p, const AttentionInputs& stored) const override;
};

void Nystrom::forward(const Problem& p, const AttentionInputs& stored) const {
  const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
  const AttentionInputs& in = wide.get();
  const Shape sh(p);
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv, H = p.heads, KVH = p.num_kv_heads();
  const int64_t BH = p.batch * H, BKV = p.batch * KVH, mq = sh.mq, M = sh.mkv_cap;
  const float s = static_cast<float>(p.effective_scale());
  // Per batch entry: the key landmarks (0 when every key is padded) and their segments as positions:
  // landmark i averages the valid keys in [bounds[i], bounds[i + 1]).
  std::vector<int64_t> mkv(static_cast<std::size_t>(p.batch)),
      bounds(static_cast<std::size_t>(p.batch * (M + 1)));
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
  AlignedVector<float> kt(static_cast<std::size_t>(BKV * M * D)), w(static_cast<std::size_t>(BH * M * D));
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;
  auto local = [&]() -> float* {
    AlignedVector<float>& buf = scratch.local();
    if (buf.size() < sh.scratch_floats(p)) buf.resize(sh.scratch_floats(p));
    return buf.data();
  };

  // K̃ per (batch, K/V head): the mean of each segment's valid keys, shared by the query heads of the group.
  tbb::parallel_for(int64_t{0}, BKV, [&](int64_t bkv) {
    const int64_t b = bkv / KVH;
    const int64_t* bd = bounds.data() + b * (M + 1);
    const float* k = in.k + bkv * Lkv * D;
    for (int64_t i = 0; i < mkv[b]; ++i) {
      float* row = kt.data() + (bkv * M + i) * D;
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
  });

  // Per (batch, query head): Q̃, A = softmax(s Q̃ K̃ᵀ), Z ≈ A⁺, B V with an online softmax over key blocks, and
  // W = Z (B V), mkv × d.
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
    const float* q = in.q + bh * Lq * D;
    for (int64_t i = 0; i < mq; ++i) {
      const int64_t i0 = segment_begin(i, Lq, mq), i1 = segment_begin(i + 1, Lq, mq);
      float* row = qt + i * D;
      std::fill(row, row + D, 0.0f);
      for (int64_t r = i0; r < i1; ++r)
        for (int64_t d = 0; d < D; ++d) row[d] += q[r * D + d];
      const float len = static_cast<float>(i1 - i0);
      for (int64_t d = 0; d < D; ++d) row[d] /= len;
    }
    const float* ktb = kt.data() + kvb * M * D;
    sgemm(false, true, mq, mk, D, s, qt, D, ktb, D, 0.0f, a, mk);
    for (int64_t i = 0; i < mq; ++i) softmax_row(a + i * mk, mk);
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

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::Nystrom)
