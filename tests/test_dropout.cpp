// Dropout on attention weights: the counter-based keep decisions (rate, independence, purity) and naive's use
// of them (p = 0 is no dropout, seeds reproduce, the mean over seeds is the no-dropout output, 1/(1-p)
// scale).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/kernels/dropout.hpp"
#include "common/reference/reference.hpp"
#include "common/support/random.hpp"
#include "common/support/tensor.hpp"
#include "tests/support/attention_case.hpp"

using namespace attn;
using namespace attn::test;

namespace {

// Seeded inputs for a naive self-attention problem; out starts as NaN so an unwritten element shows up.
AttentionCase naive_case(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim, uint64_t seed) {
  return AttentionCase(make_test_problem("naive", batch, heads, seq, seq, head_dim), seed);
}

// Softmax weights w[bh][i][j] in double, from the fp32 inputs (no dropout, causal if the problem says so).
std::vector<double> weights(const AttentionCase& c) {
  const Problem& p = c.p;
  const int64_t L = p.seq_q, D = p.head_dim, BH = p.batch * p.heads;
  std::vector<double> w(static_cast<std::size_t>(BH * L * L));
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < L; ++i) {
      double* row = &w[(bh * L + i) * L];
      const int64_t allowed = p.mask.causal ? i + 1 : L;
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < allowed; ++j) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d)
          s += double{c.q.data[(bh * L + i) * D + d]} * c.k.data[(bh * L + j) * D + d];
        row[j] = s * p.effective_scale();
        mx = std::max(mx, row[j]);
      }
      for (int64_t j = 0; j < allowed; ++j) {
        row[j] = std::exp(row[j] - mx);
        sum += row[j];
      }
      for (int64_t j = 0; j < L; ++j) row[j] = j < allowed ? row[j] / sum : 0.0;
    }
  return w;
}

std::vector<bool> keep_pattern(const DropoutRow& row, int64_t n) {
  std::vector<bool> out(static_cast<std::size_t>(n));
  for (int64_t j = 0; j < n; ++j) out[j] = row.keep(j);
  return out;
}

}  // namespace

TEST_CASE("DropoutRow keeps a fraction 1 - p of weights, independently across rows and keys", "[dropout]") {
  // Each decision is a Bernoulli(1 - p) draw; over n draws the kept count has standard deviation
  // sqrt(n p (1 - p)). 5 sigma is wide enough never to fail for a sound generator (the draws are fixed by the
  // seeds, so the test is deterministic) and narrow enough to catch a threshold or scaling mistake.
  const int64_t rows = 64, keys = 4096, n = rows * keys;
  for (double p : {0.1, 0.5, 0.9}) {
    int64_t kept = 0, kept_pairs = 0, agree = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const DropoutRow row(p, 2024, r % 2, r / 2 % 4, r / 8), next(p, 2024, r % 2, r / 2 % 4, r / 8 + 100);
      for (int64_t j = 0; j < keys; ++j) {
        kept += row.keep(j);
        kept_pairs += row.keep(j) && row.keep(j + 1);  // neighbouring keys independent: (1-p)^2
        agree += row.keep(j) == next.keep(j);          // different rows independent: p^2 + (1-p)^2
      }
    }
    auto within_5_sigma = [&](int64_t count, double prob) {
      const double sigma = std::sqrt(n * prob * (1 - prob));
      INFO("p " << p << ": count " << count << ", expected " << n * prob << " +- " << 5 * sigma);
      CHECK(std::fabs(count - n * prob) <= 5 * sigma);
    };
    within_5_sigma(kept, 1 - p);
    within_5_sigma(kept_pairs, (1 - p) * (1 - p));
    within_5_sigma(agree, p * p + (1 - p) * (1 - p));
    CHECK(DropoutRow(p, 1, 0, 0, 0).scale() == static_cast<float>(1 / (1 - p)));
  }
}

TEST_CASE("keep decisions are a pure function of (seed, b, h, i, j)", "[dropout]") {
  const int64_t n = 512;
  const DropoutRow row(0.5, 77, 1, 2, 3);
  const std::vector<bool> forward = keep_pattern(row, n);
  // Asked backwards, in a shuffled order, and from a second object: the same decisions.
  std::vector<bool> backward(n);
  for (int64_t j = n - 1; j >= 0; --j) backward[j] = row.keep(j);
  CHECK(backward == forward);
  std::vector<int64_t> order(n);
  for (int64_t j = 0; j < n; ++j) order[j] = j;
  Rng rng(3);
  for (int64_t j = n - 1; j > 0; --j) std::swap(order[j], order[static_cast<int64_t>(rng.next() % (j + 1))]);
  std::vector<bool> shuffled(n);
  for (int64_t j : order) shuffled[j] = row.keep(j);
  CHECK(shuffled == forward);
  CHECK(keep_pattern(DropoutRow(0.5, 77, 1, 2, 3), n) == forward);
  // Every argument matters, and b and h are not interchangeable.
  CHECK(keep_pattern(DropoutRow(0.5, 78, 1, 2, 3), n) != forward);
  CHECK(keep_pattern(DropoutRow(0.5, 77, 0, 2, 3), n) != forward);
  CHECK(keep_pattern(DropoutRow(0.5, 77, 1, 3, 3), n) != forward);
  CHECK(keep_pattern(DropoutRow(0.5, 77, 1, 2, 4), n) != forward);
  CHECK(keep_pattern(DropoutRow(0.5, 77, 2, 1, 3), n) != forward);
}

TEST_CASE("p = 0 is no dropout", "[dropout]") {
  for (const DropoutRow& row : {DropoutRow(), DropoutRow(0.0, 5, 1, 1, 1)}) {
    CHECK(row.scale() == 1.0f);
    int64_t dropped = 0;
    for (int64_t j = 0; j < 100000; ++j) dropped += !row.keep(j);
    CHECK(dropped == 0);
  }
  AttentionCase c = naive_case(2, 2, 17, 24, 100);
  c.p.mask.causal = true;
  const FloatArray plain = c.run();
  c.p.dropout = 0.0, c.p.seed = 987;  // a seed without dropout changes nothing
  CHECK(std::memcmp(c.run().ptr(), plain.ptr(), plain.numel() * sizeof(float)) == 0);
  // A p so small it rounds to threshold 0: the dropout code path runs but drops nothing and scales by 1.
  c.p.dropout = 1e-12;
  const FloatArray tiny = c.run();
  c.p.dropout = 0.0;
  const DoubleArray want = c.reference();
  CHECK(compare_outputs(tiny.ptr(), want.ptr(), 2 * 2 * 17, 24).max_abs_err <=
        exact_abs_tolerance(c.p, c.inputs()));
}

TEST_CASE("same seed gives the same output bitwise, a different seed a different one", "[dropout]") {
  AttentionCase c = naive_case(2, 2, 16, 8, 200);
  c.p.dropout = 0.5, c.p.seed = 42;
  const FloatArray first = c.run();
  const FloatArray again = c.run();
  CHECK(std::memcmp(first.ptr(), again.ptr(), first.numel() * sizeof(float)) == 0);
  c.p.seed = 43;
  const FloatArray other = c.run();
  // With p = 0.5 and 16 keys a row keeps the same set under two seeds with probability 2^-16: nearly every
  // one of the 64 rows must differ.
  int64_t rows_differ = 0;
  for (int64_t r = 0; r < 64; ++r)
    rows_differ += std::memcmp(&first.data[r * 8], &other.data[r * 8], 8 * sizeof(float)) != 0;
  CHECK(rows_differ >= 60);
}

TEST_CASE("kept weights are scaled by 1/(1-p), dropped ones are exactly zero, as DropoutRow decides",
          "[dropout]") {
  // Values are the identity rows (head_dim = seq_kv), so each output row IS the dropped-out weight row.
  const int64_t B = 2, H = 2, L = 8;
  for (double p : {0.5, 0.9}) {
    for (bool causal : {false, true}) {
      AttentionCase c = naive_case(B, H, L, L, 300);
      std::fill(c.v.data.begin(), c.v.data.end(), 0.0f);
      for (int64_t bh = 0; bh < B * H; ++bh)
        for (int64_t j = 0; j < L; ++j) c.v.data[(bh * L + j) * L + j] = 1.0f;
      c.p.mask.causal = causal;
      const std::vector<double> w = weights(c);
      c.p.dropout = p, c.p.seed = 9;
      const FloatArray got = c.run();
      const DoubleArray ref = c.reference();
      const double tol = exact_abs_tolerance(c.p, c.inputs());
      int64_t kept = 0, dropped = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < L; ++i) {
            const DropoutRow row(p, 9, b, h, i);
            for (int64_t j = 0; j < L; ++j) {
              const std::size_t e = static_cast<std::size_t>((((b * H + h) * L) + i) * L + j);
              const double want = row.keep(j) ? w[e] / (1 - p) : 0.0;
              INFO("p " << p << " causal " << causal << " b " << b << " h " << h << " i " << i << " j " << j);
              if (row.keep(j)) {
                CHECK(std::fabs(got.data[e] - want) <= tol);
                kept += w[e] > 0;
              } else {
                CHECK(got.data[e] == 0.0f);
                ++dropped;
              }
              // The reference applies the same decisions; it differs from this formula by double rounding.
              CHECK(std::fabs(ref.data[e] - want) <= 1e-12 * (1 + std::fabs(want)));
            }
          }
      CHECK(kept > 0);
      CHECK(dropped > 0);
    }
  }
}

TEST_CASE("dropout keeps fully masked rows at zero", "[dropout]") {
  AttentionCase c = naive_case(1, 2, 6, 4, 400);
  c.p.mask.boolean = true;
  c.mask = ByteArray({6, 6}, 1);
  std::fill_n(c.mask.ptr() + 2 * 6, 6, uint8_t{0});
  c.p.dropout = 0.3, c.p.seed = 1;
  const FloatArray got = c.run();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t d = 0; d < 4; ++d) CHECK(got.data[(h * 6 + 2) * 4 + d] == 0.0f);
  const DoubleArray want = c.reference();
  CHECK(compare_outputs(got.ptr(), want.ptr(), 12, 4).max_abs_err <= exact_abs_tolerance(c.p, c.inputs()));
}

TEST_CASE("the mean over many seeds approaches the no-dropout output", "[dropout]") {
  // out_d = sum_j w_j v_jd m_j / (1 - p) with m_j ~ Bernoulli(1 - p) independent: E[out_d] is the no-dropout
  // output and Var[out_d] = p / (1 - p) * sum_j w_j^2 v_jd^2. The mean of S independent seeds has standard
  // deviation sigma_d = sqrt(Var / S); we allow 6 sigma_d per element (192 elements: a sound implementation
  // exceeds it with probability ~4e-7) plus the fp32 bound of each single output.
  const double p = 0.3;
  const int seeds = 4000;
  AttentionCase c = naive_case(1, 2, 12, 8, 500);
  const std::vector<double> w = weights(c);
  const DoubleArray base = c.reference();
  c.p.dropout = p;
  const double fp_tol = exact_abs_tolerance(c.p, c.inputs());
  std::vector<double> mean(base.numel(), 0.0);
  FloatArray single;
  for (int s = 1; s <= seeds; ++s) {
    c.p.seed = static_cast<uint64_t>(s);
    const FloatArray got = c.run();
    if (s == 1) single = got;
    for (std::size_t e = 0; e < mean.size(); ++e) mean[e] += got.data[e] / static_cast<double>(seeds);
  }
  const int64_t L = 12, D = 8;
  double worst_z = 0, worst_unscaled_z = 0, worst_single_z = 0;
  for (int64_t bh = 0; bh < 2; ++bh)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t d = 0; d < D; ++d) {
        double var = 0;
        for (int64_t j = 0; j < L; ++j) {
          const double wv = w[(bh * L + i) * L + j] * c.v.data[(bh * L + j) * D + d];
          var += p / (1 - p) * wv * wv;
        }
        const double sigma = std::sqrt(var / seeds);
        const std::size_t e = static_cast<std::size_t>((bh * L + i) * D + d);
        const double bound = 6 * sigma + fp_tol;
        worst_z = std::max(worst_z, std::fabs(mean[e] - base.data[e]) / bound);
        // Without the 1/(1-p) scale the mean would be (1 - p) times the output: that must be caught.
        worst_unscaled_z = std::max(worst_unscaled_z, std::fabs(mean[e] * (1 - p) - base.data[e]) / bound);
        worst_single_z = std::max(worst_single_z, std::fabs(single.data[e] - base.data[e]) / bound);
      }
  INFO("largest |mean - no dropout| as a fraction of the bound: " << worst_z);
  CHECK(worst_z <= 1.0);
  CHECK(worst_unscaled_z > 1.0);
  CHECK(worst_single_z > 1.0);  // one seed alone is far off: the averaging is what converges
}
