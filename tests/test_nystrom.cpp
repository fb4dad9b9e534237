// nystrom (the Nyströmformer) beyond the registry-wide checks: an independent fp64 model of the method with
// knobs that inject plausible bugs (and the tolerance must catch each), the segment rule by hand, convergence
// of the pinv iteration, the m = n limit against exact softmax attention, key padding as removal.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"
#include "common/support/tensor.hpp"
#include "tests/support/attention_case.hpp"
#include "variants/nystrom/nystrom.hpp"

using namespace attn;
using namespace attn::test;

namespace {

// What the independent model computes; the defaults are the variant's definition, the rest inject one bug.
struct Model {
  int64_t iterations = 6;
  bool ceil_boundaries = false;  // segments by ⌈i·n/m⌉ instead of ⌊i·n/m⌋
  bool transposed_a = false;     // the pinv of Aᵀ instead of A (square A only)
  bool pad_in_means = false;     // padded keys counted in K̃'s means (and landmarks counted over all keys)
};

using Mat = std::vector<double>;  // row-major

Mat matmul(const Mat& a, const Mat& b, int64_t n, int64_t k, int64_t p) {
  Mat c(static_cast<std::size_t>(n * p), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t l = 0; l < k; ++l)
      for (int64_t j = 0; j < p; ++j) c[i * p + j] += a[i * k + l] * b[l * p + j];
  return c;
}

void softmax_rows(Mat& x, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    double* r = &x[i * cols];
    const double mx = *std::max_element(r, r + cols);
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) sum += (r[j] = std::exp(r[j] - mx));
    for (int64_t j = 0; j < cols; ++j) r[j] /= sum;
  }
}

// Means of the rows of x (n × d) over `count` segments.
Mat segment_means(const std::vector<const float*>& rows, int64_t d, int64_t count, bool ceil_rule) {
  const int64_t n = static_cast<int64_t>(rows.size());
  // ⌊i·n/count⌋ (the variant's rule), computed here by hand rather than with nystrom::segment_begin.
  auto bound = [&](int64_t i) { return ceil_rule ? (i * n + count - 1) / count : i * n / count; };
  Mat out(static_cast<std::size_t>(count * d), 0.0);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r0 = bound(i), r1 = bound(i + 1);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t e = 0; e < d; ++e) out[i * d + e] += rows[r][e];
    for (int64_t e = 0; e < d; ++e) out[i * d + e] /= static_cast<double>(r1 - r0);
  }
  return out;
}

// The Nyströmformer of one case in fp64, written from the paper's equations without sharing code with the
// variant (only the iteration's formula): out = softmax(s Q K̃ᵀ) Z softmax(s Q̃ Kᵀ) V per (batch, head).
std::vector<double> model_forward(const AttentionCase& c, const Model& mod) {
  const Problem& p = c.p;
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv, m = p.param_int("landmarks");
  const double s = p.effective_scale();
  std::vector<double> out(static_cast<std::size_t>(p.batch * p.heads * Lq * D), 0.0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t bh = b * p.heads + h, kv = p.kv_block(b, h);
      std::vector<const float*> qrows, krows, mean_rows;
      std::vector<int64_t> keys;
      for (int64_t i = 0; i < Lq; ++i) qrows.push_back(c.q.ptr() + (bh * Lq + i) * D);
      for (int64_t j = 0; j < Lkv; ++j) {
        const float* kj = c.k.ptr() + (kv * Lkv + j) * D;
        const bool pad = p.mask.key_padding && c.pad.data[b * Lkv + j];
        if (!pad) keys.push_back(j), krows.push_back(kj);
        if (!pad || mod.pad_in_means) mean_rows.push_back(kj);
      }
      const int64_t n = static_cast<int64_t>(keys.size());
      if (n == 0) continue;
      const int64_t mq = std::min(m, Lq), mk = std::min<int64_t>(m, static_cast<int64_t>(mean_rows.size()));
      const Mat qt = segment_means(qrows, D, mq, mod.ceil_boundaries);
      const Mat kt = segment_means(mean_rows, D, mk, mod.ceil_boundaries);
      auto logits = [&](const Mat& x, int64_t nx, const std::vector<const float*>& y) {
        Mat l(static_cast<std::size_t>(nx * static_cast<int64_t>(y.size())));
        for (int64_t i = 0; i < nx; ++i)
          for (std::size_t j = 0; j < y.size(); ++j) {
            double acc = 0;
            for (int64_t e = 0; e < D; ++e) acc += x[i * D + e] * y[j][e];
            l[i * y.size() + j] = s * acc;
          }
        return l;
      };
      Mat a(static_cast<std::size_t>(mq * mk)), f(static_cast<std::size_t>(Lq * mk));
      for (int64_t i = 0; i < mq; ++i)
        for (int64_t j = 0; j < mk; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < D; ++e) acc += qt[i * D + e] * kt[j * D + e];
          a[i * mk + j] = s * acc;
        }
      for (int64_t i = 0; i < Lq; ++i)
        for (int64_t j = 0; j < mk; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < D; ++e) acc += qrows[i][e] * kt[j * D + e];
          f[i * mk + j] = s * acc;
        }
      Mat bm = logits(qt, mq, krows);
      softmax_rows(a, mq, mk);
      softmax_rows(f, Lq, mk);
      softmax_rows(bm, mq, n);
      if (mod.transposed_a && mq == mk) {
        for (int64_t i = 0; i < mq; ++i)
          for (int64_t j = i + 1; j < mk; ++j) std::swap(a[i * mk + j], a[j * mk + i]);
      }
      // Z0 = Aᵀ / (‖A‖₁ ‖A‖∞), Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ))).
      double n1 = 0, ninf = 0;
      for (int64_t i = 0; i < mq; ++i) {
        double r = 0;
        for (int64_t j = 0; j < mk; ++j) r += std::fabs(a[i * mk + j]);
        ninf = std::max(ninf, r);
      }
      for (int64_t j = 0; j < mk; ++j) {
        double col = 0;
        for (int64_t i = 0; i < mq; ++i) col += std::fabs(a[i * mk + j]);
        n1 = std::max(n1, col);
      }
      Mat z(static_cast<std::size_t>(mk * mq));
      for (int64_t i = 0; i < mq; ++i)
        for (int64_t j = 0; j < mk; ++j) z[j * mq + i] = a[i * mk + j] / (n1 * ninf);
      auto shifted = [mq](double c0, Mat x) {
        for (double& e : x) e = -e;
        for (int64_t i = 0; i < mq; ++i) x[i * mq + i] += c0;
        return x;
      };
      for (int64_t it = 0; it < mod.iterations; ++it) {
        const Mat x = matmul(a, z, mq, mk, mq);
        const Mat t3 = shifted(13, matmul(x, shifted(15, matmul(x, shifted(7, x), mq, mq, mq)), mq, mq, mq));
        z = matmul(z, t3, mk, mq, mq);
        for (double& e : z) e *= 0.25;
      }
      Mat v(static_cast<std::size_t>(n * D));
      for (int64_t c0 = 0; c0 < n; ++c0)
        for (int64_t e = 0; e < D; ++e) v[c0 * D + e] = c.v.data[(kv * Lkv + keys[c0]) * D + e];
      const Mat o = matmul(f, matmul(z, matmul(bm, v, mq, n, D), mk, mq, D), Lq, mk, D);
      std::copy(o.begin(), o.end(), out.begin() + bh * Lq * D);
    }
  return out;
}

double max_abs_diff(const FloatArray& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t e = 0; e < got.numel(); ++e) {
    const double d = std::fabs(got.data[e] - want[e]);
    worst = std::max(worst, std::isnan(d) ? INFINITY : d);
  }
  return worst;
}

// A check-like case: seeded gaussians, batch b pads its last b·seq_kv/3 keys (batch 3 and up: all).
AttentionCase nystrom_case(int64_t m, int64_t iterations, int64_t batch, int64_t heads, int64_t kv_heads,
                           int64_t seq_q, int64_t seq_kv, int64_t dim, bool pad, uint64_t seed,
                           double logit_std = 1.0) {
  Problem p = make_test_problem("nystrom", batch, heads, seq_q, seq_kv, dim, pad ? "pad" : "none",
                                {{"landmarks", m}, {"pinv_iterations", iterations}});
  p.kv_heads = kv_heads;
  AttentionCase c(p, seed, logit_std);
  if (pad) c.pad_keys([&](int64_t b, int64_t j) { return j >= seq_kv - (b >= 3 ? seq_kv : b * seq_kv / 3); });
  return c;
}

}  // namespace

namespace {
// The check's shapes (common/reference/check.cpp: reference, cross) with the variant's test parameter sets.
struct CaseShape {
  int64_t batch, heads, seq_q, seq_kv, dim;
};
const CaseShape kCheckShapes[] = {{1, 2, 7, 7, 17},     {2, 3, 17, 17, 8}, {4, 2, 33, 33, 64},
                                  {1, 1, 130, 130, 33}, {2, 2, 7, 19, 16}, {2, 2, 33, 5, 16}};
}  // namespace

TEST_CASE(
    "nystrom matches an independent fp64 model, and its tolerance catches a pinv iteration too few, a "
    "transposed A, segment boundaries by ceil and padded keys left in the means",
    "[nystrom]") {
  uint64_t seed = 1;
  int64_t detected[4] = {0, 0, 0, 0}, applicable[4] = {0, 0, 0, 0};
  for (const Json& params : Registry::instance().get("nystrom").test_param_sets()) {
    const Problem base = make_problem("nystrom", params);
    const int64_t m = base.param_int("landmarks"), iterations = base.param_int("pinv_iterations");
    for (const CaseShape& s : kCheckShapes)
      for (bool pad : {false, true})
        for (double logit_std : {1.0, 4.6}) {  // 4.6: the check's large-logits inputs
          AttentionCase c = nystrom_case(m, iterations, s.batch, s.heads, 0, s.seq_q, s.seq_kv, s.dim, pad,
                                         ++seed, logit_std);
          INFO(c.p.repro() << " logit_std " << logit_std);
          const FloatArray got = c.run();
          const double tol = c.tolerance();
          const std::vector<double> model = model_forward(c, Model{.iterations = iterations});
          // The variant's own fp64 reference is the model (up to fp64 rounding), and fp32 is within the
          // bound.
          DoubleArray ref(got.shape);
          Registry::instance().get("nystrom").reference_forward(c.p, c.inputs(nullptr), ref.ptr());
          double ref_vs_model = 0;
          for (std::size_t e = 0; e < model.size(); ++e)
            ref_vs_model = std::max(ref_vs_model, std::fabs(ref.data[e] - model[e]));
          REQUIRE(ref_vs_model <= 1e-9);
          REQUIRE(max_abs_diff(got, model) <= tol);
          if (logit_std != 1.0) continue;  // the bound is loose on near-one-hot softmaxes; see the variant
          const Model bugs[4] = {{.iterations = iterations - 1},
                                 {.iterations = iterations, .ceil_boundaries = true},
                                 {.iterations = iterations, .transposed_a = true},
                                 {.iterations = iterations, .pad_in_means = true}};
          for (int bug = 0; bug < 4; ++bug) {
            const std::vector<double> wrong = model_forward(c, bugs[bug]);
            double change = 0;
            for (std::size_t e = 0; e < model.size(); ++e)
              change = std::max(change, std::fabs(wrong[e] - model[e]));
            if (change == 0) continue;  // the bug changes nothing here (e.g. m divides n, one landmark)
            ++applicable[bug];
            INFO("bug " << bug << " moves the fp64 output by " << change << ", tolerance " << tol);
            CHECK(max_abs_diff(got, wrong) > tol);
            detected[bug] += max_abs_diff(got, wrong) > tol;
          }
        }
  }
  for (int bug = 0; bug < 4; ++bug) {
    INFO("bug " << bug << ": detected in " << detected[bug] << " of " << applicable[bug] << " cases");
    CHECK(applicable[bug] >= 10);
  }
}

TEST_CASE("nystrom with 6 pinv iterations is told apart from its own reference with 5", "[nystrom]") {
  // The check's `reference` shape at seq 130 (segments of 16 or 17 rows: A is far from converged).
  AttentionCase c = nystrom_case(8, 6, 1, 1, 0, 130, 130, 33, false, 77);
  const FloatArray got = c.run();
  const double tol = c.tolerance();
  const Attention& v = Registry::instance().get("nystrom");
  for (int64_t iterations : {6, 5, 7}) {
    Problem p = c.p;
    p.params["pinv_iterations"] = iterations;
    DoubleArray ref(got.shape);
    v.reference_forward(p, c.inputs(nullptr), ref.ptr());
    const ErrorMetrics e = compare_outputs(got.ptr(), ref.ptr(), c.rows(), c.p.head_dim);
    INFO(iterations << " iterations: max_abs_err " << e.max_abs_err << ", tolerance " << tol);
    if (iterations == 6)
      CHECK(e.max_abs_err <= tol);
    else
      CHECK(e.max_abs_err > 10 * tol);
  }
}

TEST_CASE("nystrom landmark segments by hand: boundaries floor(i n / m), n < m gives one row each",
          "[nystrom]") {
  using nystrom::landmark_count;
  using nystrom::segment_begin;
  auto bounds = [](int64_t n, int64_t m) {
    std::vector<int64_t> b;
    const int64_t count = landmark_count(n, m);
    for (int64_t i = 0; i <= count; ++i) b.push_back(segment_begin(i, n, count));
    return b;
  };
  CHECK(bounds(5, 2) == std::vector<int64_t>{0, 2, 5});        // 2 + 3 rows
  CHECK(bounds(7, 3) == std::vector<int64_t>{0, 2, 4, 7});     // 2 + 2 + 3
  CHECK(bounds(8, 4) == std::vector<int64_t>{0, 2, 4, 6, 8});  // m divides n: the paper's equal segments
  CHECK(bounds(3, 8) == std::vector<int64_t>{0, 1, 2, 3});     // n < m: one landmark per row
  CHECK(bounds(1, 64) == std::vector<int64_t>{0, 1});
  const std::vector<int64_t> b = bounds(130, 8);  // every segment 16 or 17 rows, none empty
  for (std::size_t i = 0; i + 1 < b.size(); ++i) CHECK((b[i + 1] - b[i] == 16 || b[i + 1] - b[i] == 17));
}

TEST_CASE("nystrom key padding removes the padded keys: the same output as the problem without them",
          "[nystrom]") {
  // 23 keys, every third padded in batch entry 1 (so the 15 or 16 valid keys make other segments), none in 0.
  AttentionCase padded = nystrom_case(4, 6, 2, 2, 1, 9, 23, 8, true, 5);
  padded.pad_keys([](int64_t b, int64_t j) { return b == 1 && j % 3 == 1; });
  const FloatArray got = padded.run();
  for (int64_t b = 0; b < 2; ++b) {
    std::vector<int64_t> keep;
    for (int64_t j = 0; j < 23; ++j)
      if (!padded.pad.data[b * 23 + j]) keep.push_back(j);
    const int64_t n = static_cast<int64_t>(keep.size());
    AttentionCase alone = nystrom_case(4, 6, 1, 2, 1, 9, n, 8, false, 5);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 9; ++i)
        for (int64_t d = 0; d < 8; ++d) alone.q_at(h, i, d) = padded.q_at(b * 2 + h, i, d);
    for (int64_t c = 0; c < n; ++c)
      for (int64_t d = 0; d < 8; ++d) {
        alone.k_at(0, c, d) = padded.k_at(b, keep[c], d);
        alone.v_at(0, c, d) = padded.v_at(b, keep[c], d);
      }
    const FloatArray want = alone.run();
    double worst = 0;
    for (int64_t e = 0; e < 2 * 9 * 8; ++e)
      worst = std::max(worst, double{std::fabs(got.data[b * 2 * 9 * 8 + e] - want.data[e])});
    INFO("batch entry " << b << ": " << n << " valid keys");
    CHECK(worst <= padded.tolerance() + alone.tolerance());
  }
  SECTION("every key padded: zeros") {
    padded.pad_keys([](int64_t b, int64_t) { return b == 1; });
    const FloatArray out = padded.run();
    for (int64_t e = 2 * 9 * 8; e < 4 * 9 * 8; ++e) REQUIRE(out.data[e] == 0.0f);
  }
}

// ‖A Z A − A‖_F / ‖A‖_F for a rows × cols A and its cols × rows Z.
static double pinv_residual(const Mat& a, const Mat& z, int64_t rows, int64_t cols) {
  const Mat aza = matmul(matmul(a, z, rows, cols, rows), a, rows, rows, cols);
  double num = 0, den = 0;
  for (std::size_t e = 0; e < a.size(); ++e) num += (aza[e] - a[e]) * (aza[e] - a[e]), den += a[e] * a[e];
  return std::sqrt(num / den);
}

TEST_CASE("nystrom pinv iteration converges: the residual of A Z A = A falls with every iteration",
          "[nystrom]") {
  // A softmax with a dominant diagonal (well conditioned), square 8 × 8 and wide 5 × 8.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{8, 8}, {5, 8}}) {
    Mat a(static_cast<std::size_t>(rows * cols));
    Rng rng(3);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) a[i * cols + j] = rng.normal() + (i == j ? 3.0 : 0.0);
    softmax_rows(a, rows, cols);
    std::vector<float> af(a.begin(), a.end());
    Mat a_rounded(af.begin(), af.end());  // what the fp32 iteration sees
    double last64 = INFINITY, last32 = INFINITY;
    for (int64_t k = 0; k <= 8; ++k) {
      Mat z(static_cast<std::size_t>(cols * rows));
      nystrom::pinv_fp64(a.data(), rows, cols, k, z.data());
      std::vector<float> zf(z.size()), work(nystrom::pinv_work_floats(rows, cols));
      nystrom::pinv_fp32(af.data(), rows, cols, k, zf.data(), work.data());
      const double r64 = pinv_residual(a, z, rows, cols);
      const double r32 = pinv_residual(a_rounded, Mat(zf.begin(), zf.end()), rows, cols);
      INFO(rows << "x" << cols << " after " << k << " iterations: residual fp64 " << r64 << ", fp32 " << r32);
      if (last64 > 1e-14) CHECK(r64 < last64);
      if (last32 > 1e-5) CHECK(r32 < last32);
      last64 = r64, last32 = r32;
    }
    CHECK(last64 < 1e-12);
    CHECK(last32 < 1e-5);
  }
}

TEST_CASE("nystrom with a landmark per row and enough iterations approaches exact softmax attention",
          "[nystrom]") {
  // n <= m: Q̃ = Q and K̃ = K, so F = A = B = P (the attention matrix) and out = P Z P V. With E = I − P Z,
  // out − P V = −E P V, so |out − P V| <= ‖E‖∞ max|P V| <= ‖E‖∞ max|V|; and E_{k+1} = E_k³ (3I + E_k) / 4.
  const int64_t n = 12, iterations = 20;
  AttentionCase c = nystrom_case(16, iterations, 1, 1, 0, n, n, 16, false, 9, 1.3);
  const FloatArray got = c.run();
  const DoubleArray exact = c.reference();  // softmax attention in fp64
  // P in fp64, its iterative pinv with the same iterations, and ‖I − P Z‖∞.
  const double s = c.p.effective_scale();
  Mat p(static_cast<std::size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t d = 0; d < 16; ++d) acc += double{c.q_at(0, i, d)} * c.k_at(0, j, d);
      p[i * n + j] = s * acc;
    }
  softmax_rows(p, n, n);
  Mat z(p.size());
  nystrom::pinv_fp64(p.data(), n, n, iterations, z.data());
  const Mat pz = matmul(p, z, n, n, n);
  double e_inf = 0, vmax = 0;
  for (int64_t i = 0; i < n; ++i) {
    double row = 0;
    for (int64_t j = 0; j < n; ++j) row += std::fabs((i == j ? 1.0 : 0.0) - pz[i * n + j]);
    e_inf = std::max(e_inf, row);
  }
  for (float x : c.v.data) vmax = std::max(vmax, double{std::fabs(x)});
  INFO("||I - P Z||_inf = " << e_inf);
  CHECK(e_inf < 1e-9);
  double worst = 0;
  for (std::size_t e = 0; e < got.numel(); ++e)
    worst = std::max(worst, std::fabs(got.data[e] - exact.data[e]));
  CHECK(worst <= e_inf * vmax + c.tolerance());
  // A few iterations are visibly not there yet: the limit is approached, not assumed.
  const FloatArray early = c.run_as("nystrom", {{"landmarks", 16}, {"pinv_iterations", 2}});
  double early_worst = 0;
  for (std::size_t e = 0; e < got.numel(); ++e)
    early_worst = std::max(early_worst, std::fabs(early.data[e] - exact.data[e]));
  CHECK(early_worst > 100 * worst);
}

TEST_CASE("nystrom counts the FLOPs of its GEMMs, a workspace linear in n, and validates its parameters",
          "[nystrom]") {
  Problem p =
      make_test_problem("nystrom", 2, 3, 100, 40, 8, "none", {{"landmarks", 16}, {"pinv_iterations", 2}});
  const Attention& v = Registry::instance().get("nystrom");
  // mq = 16, mk = 16: Q K̃ᵀ and F W 2·100·16·8 each, Q̃ K̃ᵀ 2·16·16·8, Q̃ Kᵀ and B V 2·16·40·8 each,
  // Z (B V) 2·16·16·8, and per iteration A Z, two X T, Z T3: 4 products of 16³ (2·16³ each).
  const double per_head = 4.0 * 100 * 16 * 8 + 2.0 * 16 * 16 * 8 + 4.0 * 16 * 40 * 8 + 2.0 * 16 * 16 * 8 +
                          2 * (4 * 2.0 * 16 * 16 * 16);
  CHECK(v.flops(p) == Approx(6 * per_head));
  p.seq_q = 3;  // n < m: 3 query landmarks
  const double small = 4.0 * 3 * 16 * 8 + 2.0 * 3 * 16 * 8 + 4.0 * 3 * 40 * 8 + 2.0 * 16 * 3 * 8 +
                       2 * (2.0 * 3 * 3 * 16 + 4.0 * 27 + 2.0 * 16 * 9);
  CHECK(v.flops(p) == Approx(6 * small));
  CHECK(v.workspace_bytes(p, 2) > v.workspace_bytes(p, 1));
  // Linear in n: at 2^40 positions the workspace is the m × d stores and scratch, not n × anything.
  p.seq_q = p.seq_kv = int64_t{1} << 40, p.head_dim = 64, p.params["landmarks"] = 64;
  CHECK(v.workspace_bytes(p, 1) < (std::size_t{1} << 30));
  // Parameter ranges: at least one landmark, at most 4096; 0..30 iterations.
  CHECK_THROWS_AS(make_problem("nystrom", {{"landmarks", 0}}), UsageError);
  CHECK_THROWS_AS(make_problem("nystrom", {{"landmarks", 4097}}), UsageError);
  CHECK_THROWS_AS(make_problem("nystrom", {{"pinv_iterations", -1}}), UsageError);
  CHECK_THROWS_AS(make_problem("nystrom", {{"pinv_iterations", 31}}), UsageError);
  CHECK_NOTHROW(make_problem("nystrom", {{"pinv_iterations", 0}}));
}

TEST_CASE("nystrom over several key blocks and query blocks, with whole key blocks padded, matches the model",
          "[nystrom]") {
  // 700 keys are three blocks of B V's online softmax; 300 queries two blocks of F. Batch entry 1 pads its
  // first 300 keys (its first block has no valid key at all), entry 2 every other key.
  for (int64_t m : {8, 64}) {
    AttentionCase c = nystrom_case(m, 6, 3, 2, 1, 300, 700, 24, true, 40 + m);
    c.pad_keys([](int64_t b, int64_t j) { return (b == 1 && j < 300) || (b == 2 && j % 2 == 0); });
    const FloatArray got = c.run();
    const double err = max_abs_diff(got, model_forward(c, Model{.iterations = 6})), tol = c.tolerance();
    INFO(c.p.repro() << ": max_abs_err " << err << ", tolerance " << tol);
    CHECK(err <= tol);
    CHECK(tol < 1e-2);  // a bound that still means something (outputs are of order max|V| ~ 4)
  }
}

// ---- Backward ----

namespace {

struct Grads {
  FloatArray dq, dk, dv;
};

// One training step on `c` (Q, K, V as `in` gives them: fp32, or the 16-bit storage): run_saving, then
// run_backward with `d_out`.
Grads train(const AttentionCase& c, const FloatArray& d_out, const AttentionInputs& in) {
  const Attention& v = Registry::instance().get("nystrom");
  FloatArray out(c.q.shape);
  AttentionInputs io = in;
  io.out = out.ptr();
  std::vector<float> saved(v.saved_floats(c.p));
  v.run_saving(c.p, io, saved.data());
  Grads g{FloatArray(c.q.shape), FloatArray(c.k.shape), FloatArray(c.v.shape)};
  GradientArgs args;
  args.out = out.ptr(), args.saved = saved.data(), args.d_out = d_out.ptr();
  args.dq = g.dq.ptr(), args.dk = g.dk.ptr(), args.dv = g.dv.ptr();
  v.run_backward(c.p, io, args);
  return g;
}

double max_abs_diff(const FloatArray& got, const DoubleArray& want) {
  double worst = 0;
  for (std::size_t e = 0; e < got.numel(); ++e) {
    const double d = std::fabs(got.data[e] - want.data[e]);
    worst = std::max(worst, std::isnan(d) ? INFINITY : d);
  }
  return worst;
}

double max_abs_diff(const DoubleArray& a, const DoubleArray& b) {
  double worst = 0;
  for (std::size_t e = 0; e < a.numel(); ++e) worst = std::max(worst, std::fabs(a.data[e] - b.data[e]));
  return worst;
}

// reference_backward, or with a defect injected (nystrom::GradientDefect).
struct RefGrads {
  DoubleArray dq, dk, dv;
};
RefGrads reference_grads(const AttentionCase& c, const Problem& p, const FloatArray& d_out,
                         nystrom::GradientDefect defect = nystrom::GradientDefect::none) {
  RefGrads r{DoubleArray(c.q.shape), DoubleArray(c.k.shape), DoubleArray(c.v.shape)};
  nystrom::reference_backward_with(p, c.inputs(nullptr, &p), d_out.ptr(), r.dq.ptr(), r.dk.ptr(), r.dv.ptr(),
                                   defect);
  return r;
}

}  // namespace

TEST_CASE(
    "nystrom's backward is within its tolerance with grouped-query heads, padding, bf16 and many blocks",
    "[nystrom]") {
  // The registry's gradient cases for nystrom have no grouped-query heads (theirs are causal or masked) and
  // no bf16 (theirs are causal); 300 queries and 700 keys run two query blocks and three key blocks, and
  // batch entry 1 pads its first 300 keys (a key block with no valid key), entry 2 every other key.
  struct GradCase {
    int64_t m, iterations, batch, heads, kv_heads, seq_q, seq_kv, dim;
    DType dtype;
  };
  const GradCase cases[] = {{4, 6, 2, 4, 2, 9, 23, 8, DType::fp32},
                            {8, 6, 3, 2, 1, 300, 700, 24, DType::fp32},
                            {7, 3, 2, 2, 1, 33, 40, 16, DType::bf16}};
  const Attention& v = Registry::instance().get("nystrom");
  uint64_t seed = 500;
  for (const GradCase& gc : cases) {
    AttentionCase c = nystrom_case(gc.m, gc.iterations, gc.batch, gc.heads, gc.kv_heads, gc.seq_q, gc.seq_kv,
                                   gc.dim, true, ++seed);
    c.pad_keys(
        [](int64_t b, int64_t j) { return (b == 1 && (j < 300 || j % 3 == 1)) || (b == 2 && j % 2 == 0); });
    c.p.dtype = gc.dtype;
    INFO(c.p.repro());
    const FloatArray d_out = normal_tensor(c.q.shape, ++seed);
    std::unique_ptr<StoredInputs> stored;
    if (gc.dtype != DType::fp32) stored = std::make_unique<StoredInputs>(c.p, c.inputs(nullptr));
    const AttentionInputs in = stored ? stored->get() : c.inputs(nullptr);
    const Grads got = train(c, d_out, in);
    DoubleArray dq(c.q.shape), dk(c.k.shape), dv(c.v.shape);
    v.reference_backward(c.p, in, d_out.ptr(), dq.ptr(), dk.ptr(), dv.ptr());
    const GradientTolerance tol = v.grad_tolerance(c.p, in, d_out.ptr());
    INFO("tolerance dq " << tol.dq << ", dk " << tol.dk << ", dv " << tol.dv);
    CHECK(max_abs_diff(got.dq, dq) <= tol.dq);
    CHECK(max_abs_diff(got.dk, dk) <= tol.dk);
    CHECK(max_abs_diff(got.dv, dv) <= tol.dv);
  }
  SECTION("every key of a batch entry padded: its gradients are exactly 0") {
    AttentionCase c = nystrom_case(4, 6, 2, 2, 1, 9, 23, 8, true, 7);
    c.pad_keys([](int64_t b, int64_t) { return b == 1; });
    const FloatArray d_out = normal_tensor(c.q.shape, 8);
    const Grads got = train(c, d_out, c.inputs(nullptr));
    for (int64_t e = 2 * 9 * 8; e < 4 * 9 * 8; ++e) REQUIRE(got.dq.data[e] == 0.0f);
    for (int64_t e = 23 * 8; e < 2 * 23 * 8; ++e) REQUIRE((got.dk.data[e] == 0.0f && got.dv.data[e] == 0.0f));
  }
}

TEST_CASE(
    "nystrom's gradient tolerance fails a backward one pinv step short, with A for A^T, with segment "
    "boundaries by ceil, or with one pinv iteration fewer",
    "[nystrom]") {
  // The fp32 backward against the fp64 gradient with one mistake injected (nystrom::GradientDefect), on the
  // check's shapes and parameter sets. The bound is 1e3-2e5 times the actual error (worst-case sums amplified
  // by the pinv), so a mistake that moves the gradient by under ~1% of its size can hide under it: A for Aᵀ
  // does on the 130-row shapes (0.02-1.4%); it is held to the cases where it moves the gradient by more than
  // 2% of its largest element. The others move it by 3-60% wherever they change it.
  using nystrom::GradientDefect;
  struct Defect {
    const char* name;
    GradientDefect defect;
    bool one_iteration_fewer;
    double min_change;  // relative to the gradient's largest element
  };
  const Defect defects[] = {{"reverse mode one step short", GradientDefect::reverse_step_short, false, 0},
                            {"A read for Aᵀ in the reverse mode", GradientDefect::transposed_a, false, 0.02},
                            {"segment boundaries by ceil", GradientDefect::ceil_segments, false, 0},
                            {"one pinv iteration fewer", GradientDefect::none, true, 0}};
  const Attention& v = Registry::instance().get("nystrom");
  uint64_t seed = 600;
  int64_t applicable[4] = {0, 0, 0, 0};
  for (const Json& params : v.test_param_sets()) {
    const Problem base = make_problem("nystrom", params);
    const int64_t m = base.param_int("landmarks"), iterations = base.param_int("pinv_iterations");
    for (const CaseShape& s : kCheckShapes)
      for (bool pad : {false, true}) {
        AttentionCase c =
            nystrom_case(m, iterations, s.batch, s.heads, 0, s.seq_q, s.seq_kv, s.dim, pad, ++seed);
        INFO(c.p.repro());
        const FloatArray d_out = normal_tensor(c.q.shape, ++seed);
        const Grads got = train(c, d_out, c.inputs(nullptr));
        const GradientTolerance tol = v.grad_tolerance(c.p, c.inputs(nullptr), d_out.ptr());
        const RefGrads want = reference_grads(c, c.p, d_out);
        REQUIRE(max_abs_diff(got.dq, want.dq) <= tol.dq);
        REQUIRE(max_abs_diff(got.dk, want.dk) <= tol.dk);
        double size = 0;
        for (double x : want.dq.data) size = std::max(size, std::fabs(x));
        for (double x : want.dk.data) size = std::max(size, std::fabs(x));
        for (int d = 0; d < 4; ++d) {
          Problem p = c.p;
          if (defects[d].one_iteration_fewer) {
            if (iterations == 0) continue;
            p.params["pinv_iterations"] = iterations - 1;
          }
          const RefGrads wrong = reference_grads(c, p, d_out, defects[d].defect);
          // dQ and dK: only the last mistake reaches dV, and it moves dQ and dK as well.
          const double change = std::max(max_abs_diff(wrong.dq, want.dq), max_abs_diff(wrong.dk, want.dk));
          if (change == 0 || change < defects[d].min_change * size) continue;  // e.g. one landmark, m | n
          ++applicable[d];
          const double seen =
              std::max(max_abs_diff(got.dq, wrong.dq) / tol.dq, max_abs_diff(got.dk, wrong.dk) / tol.dk);
          INFO(defects[d].name << " moves the fp64 gradient by " << change << " (" << change / size
                               << " of its size): the fp32 one is " << seen << " tolerances from it");
          CHECK(seen > 1);
        }
      }
  }
  for (int d = 0; d < 4; ++d) {
    INFO(defects[d].name << ": " << applicable[d] << " cases");
    CHECK(applicable[d] >= 20);
  }
}

TEST_CASE("nystrom's fp64 gradient is the derivative of its definition, with grouped-query heads and padding",
          "[nystrom]") {
  // check_reference_gradient's steps (2^-6, 2^-7) are too coarse for this definition: six pinv iterations
  // make it so curved that the Richardson remainder reaches 1e-6-7e-4 of the derivative there (the registry's
  // grad-definition fails on two of its cases for that reason), and a perturbation of up to 0.12 per entry
  // can cross a kink of ‖A‖₁ (the largest column sum changing column). The same test with steps 2^-9 and
  // 2^-10: the inputs multiples of 2^-8 in [1/8, 15], the directions of 2^-8 in (-8, 8), so every perturbed
  // value is exact in fp32 (22 significant bits); the remainder falls by 2^12.
  struct DefCase {
    int64_t m, iterations, batch, heads, kv_heads, seq_q, seq_kv, dim;
    bool pad;
  };
  const DefCase cases[] = {{8, 6, 1, 2, 0, 7, 7, 5, false},  // the registry's two failing shapes
                           {8, 6, 1, 2, 0, 5, 8, 4, false},
                           {64, 6, 2, 4, 2, 6, 9, 4, true},  // default parameters (m = n)
                           {3, 2, 2, 2, 1, 9, 5, 3, true}};
  const Attention& v = Registry::instance().get("nystrom");
  uint64_t seed = 700;
  for (const DefCase& dc : cases) {
    AttentionCase c = nystrom_case(dc.m, dc.iterations, dc.batch, dc.heads, dc.kv_heads, dc.seq_q, dc.seq_kv,
                                   dc.dim, dc.pad, ++seed);
    INFO(c.p.repro());
    for (FloatArray* t : {&c.q, &c.k, &c.v})
      for (float& x : t->data) {
        x = std::nearbyint(std::clamp(x, -15.0f, 15.0f) * 256.0f) / 256.0f;
        if (std::fabs(x) < 0.125f) x = x < 0 ? -0.125f : 0.125f;
      }
    const FloatArray d_out = normal_tensor(c.q.shape, ++seed);
    DoubleArray gq(c.q.shape), gk(c.k.shape), gv(c.v.shape), out(c.q.shape);
    v.reference_backward(c.p, c.inputs(nullptr), d_out.ptr(), gq.ptr(), gk.ptr(), gv.ptr());
    Rng rng(++seed);
    for (int dir = 0; dir < 3; ++dir) {
      std::vector<float> uq(c.q.numel()), uk(c.k.numel()), uv(c.v.numel());
      double analytic = 0, gnorm2 = 0, unorm2 = 0;
      auto draw = [&](std::vector<float>& u, const DoubleArray& g) {
        for (std::size_t e = 0; e < u.size(); ++e) {
          u[e] = static_cast<float>(std::nearbyint(std::clamp(rng.normal(), -7.9, 7.9) * 256.0) / 256.0);
          analytic += g.data[e] * u[e], gnorm2 += g.data[e] * g.data[e], unorm2 += double{u[e]} * u[e];
        }
      };
      draw(uq, gq), draw(uk, gk), draw(uv, gv);
      auto central = [&](float h) {
        double l[2];
        for (int side = 0; side < 2; ++side) {
          AttentionCase pc = c;
          const float sh = side == 0 ? h : -h;
          for (std::size_t e = 0; e < uq.size(); ++e) pc.q.data[e] += sh * uq[e];
          for (std::size_t e = 0; e < uk.size(); ++e) pc.k.data[e] += sh * uk[e], pc.v.data[e] += sh * uv[e];
          v.reference_forward(c.p, pc.inputs(nullptr), out.ptr());
          l[side] = 0;
          for (std::size_t e = 0; e < out.numel(); ++e) l[side] += double{d_out.data[e]} * out.data[e];
        }
        return (l[0] - l[1]) / (2.0 * h);
      };
      const double fd = (4.0 * central(1.0f / 1024) - central(1.0f / 512)) / 3.0;
      const double n = static_cast<double>(uq.size() + uk.size() + uv.size());
      const double rel =
          std::fabs(fd - analytic) / std::max(std::fabs(analytic), std::sqrt(gnorm2 * unorm2 / n));
      INFO("direction " << dir << ": central difference " << fd << " vs " << analytic << ", relative "
                        << rel);
      CHECK(rel <= 1e-6);
    }
  }
}
