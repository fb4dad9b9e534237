// The fp64 reference and the naive variant on hand-computed cases (the textbook softmax example, two keys
// with known weights), fully masked rows, logits far beyond the fp32 exp overflow point, and the comparison
// metrics and tolerance every other check relies on. The shape/mask sweep itself is in
// common/reference/check.cpp.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/kernels/mask.hpp"
#include "common/reference/reference.hpp"
#include "common/support/tensor.hpp"
#include "tests/support/attention_case.hpp"

using namespace attn;
using namespace attn::test;

namespace {

constexpr double kFloatEps = std::numeric_limits<float>::epsilon();  // 2^-23

const Attention& naive() {
  return Registry::instance().get("naive");
}

// A naive problem; its case (AttentionCase) starts with zero Q, K, V, masks allowing every key and a NaN
// output, so a row the variant forgets to write shows up.
Problem problem(int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_kv, int64_t head_dim,
                const char* mask = "none") {
  return make_test_problem("naive", batch, heads, seq_q, seq_kv, head_dim, mask);
}

// naive against the fp64 reference with the derived bound, and no NaN/Inf anywhere.
void expect_matches_reference(AttentionCase& c) {
  c.run();
  const DoubleArray want = c.reference();
  const ErrorMetrics m = compare_outputs(c.out.ptr(), want.ptr(), c.rows(), c.p.head_dim);
  INFO(c.p.repro() << ": max_abs_err " << m.max_abs_err << " bound " << c.tolerance());
  CHECK(m.nan_count == 0);
  CHECK(m.inf_count == 0);
  CHECK(m.max_abs_err <= c.tolerance());
}

// True iff every element of output row (bh, i) is exactly zero.
bool row_is_zero(const AttentionCase& c, int64_t bh, int64_t i) {
  for (int64_t d = 0; d < c.p.head_dim; ++d)
    if (c.out_at(bh, i, d) != 0.0f) return false;
  return true;
}

}  // namespace

TEST_CASE("textbook example: softmax(0.9, 0.2, 0.1, 0.0, 0.3) = (0.34, 0.17, 0.15, 0.14, 0.19)", "[naive]") {
  // One query e_0, five keys s_j * e_0, scale 1: the logits are the scores. Values are the identity rows, so
  // the output row IS the weight row.
  const std::vector<float> scores = {0.9f, 0.2f, 0.1f, 0.0f, 0.3f};
  const std::vector<long> percent = {34, 17, 15, 14, 19};
  Problem p = problem(1, 1, 1, 5, 5);
  p.scale = 1.0;
  AttentionCase c(p);
  c.q_at(0, 0, 0) = 1.0f;
  for (int64_t j = 0; j < 5; ++j) {
    c.k_at(0, j, 0) = scores[j];
    c.v_at(0, j, j) = 1.0f;
  }
  c.run();
  const DoubleArray ref = c.reference();

  // The same weights by hand, in double, from the fp32 scores the kernels see.
  double sum = 0;
  for (float s : scores) sum += std::exp(static_cast<double>(s));
  double total = 0;
  for (int64_t j = 0; j < 5; ++j) {
    const double want = std::exp(static_cast<double>(scores[j])) / sum;
    INFO("weight " << j << ": naive " << c.out_at(0, 0, j) << ", reference " << ref.data[j] << ", hand "
                   << want);
    CHECK(std::lround(c.out_at(0, 0, j) * 100.0) == percent[j]);
    CHECK(std::lround(ref.data[j] * 100.0) == percent[j]);
    // The reference differs from the hand formula only by double rounding (max subtraction, other order).
    CHECK(std::fabs(ref.data[j] - want) <= 8 * std::numeric_limits<double>::epsilon());
    CHECK(std::fabs(c.out_at(0, 0, j) - want) <= c.tolerance());
    total += c.out_at(0, 0, j);
  }
  // Five fp32 weights, each within a few ulps of its exact value: their sum is 1 to ~5 ulps.
  CHECK(std::fabs(total - 1.0) <= 8 * kFloatEps);
}

TEST_CASE("the fp64 reference on a hand-computed case: two keys with weights 3/4 and 1/4", "[naive]") {
  // Logits ln 3 and 0 give weights 3/4, 1/4. Query 0 reads the keys' first component, query 1 their second
  // (through scale 0.5 and a query of 2), so a mixed-up index or a missing scale changes the answer.
  for (const char* mask : {"none", "causal"}) {
    Problem p = problem(1, 1, 2, 2, 2, mask);
    p.scale = 0.5;
    AttentionCase c(p);
    const float ln3 = static_cast<float>(std::log(3.0));
    c.q_at(0, 0, 0) = 2.0f, c.q_at(0, 1, 1) = 2.0f;
    c.k_at(0, 0, 0) = ln3, c.k_at(0, 1, 1) = ln3;  // row 0 favours key 0, row 1 favours key 1
    c.v_at(0, 0, 0) = 4.0f, c.v_at(0, 0, 1) = 8.0f, c.v_at(0, 1, 0) = 0.0f, c.v_at(0, 1, 1) = -4.0f;
    const DoubleArray ref = c.reference();
    // ln 3 rounded to fp32 moves a logit by <= 2^-24 * ln 3 ~ 7e-8; dw/ds = w (1 - w) = 3/16 and |v0 - v1|
    // <= 12, so the exact answers below move by < 2e-7. 1e-6 leaves room and still catches any wrong weight.
    const double tol = 1e-6;
    INFO(mask);
    if (p.mask.causal) {
      // Row 0 sees key 0 only: weight exactly 1.
      CHECK(ref.data[0] == 4.0);
      CHECK(ref.data[1] == 8.0);
    } else {
      CHECK(std::fabs(ref.data[0] - 3.0) <= tol);  // 3/4 * 4 + 1/4 * 0
      CHECK(std::fabs(ref.data[1] - 5.0) <= tol);  // 3/4 * 8 + 1/4 * -4
    }
    CHECK(std::fabs(ref.data[2] - 1.0) <= tol);  // 1/4 * 4 + 3/4 * 0
    CHECK(std::fabs(ref.data[3] + 1.0) <= tol);  // 1/4 * 8 + 3/4 * -4
    c.run();
    for (int e = 0; e < 4; ++e) CHECK(std::fabs(c.out.data[e] - ref.data[e]) <= c.tolerance());

    // Only row 1, through the `rows` argument: the same numbers.
    const std::vector<int64_t> rows = {1};
    std::vector<double> one(2);
    reference_attention(p, c.inputs(), one.data(), &rows);
    CHECK(one[0] == ref.data[2]);
    CHECK(one[1] == ref.data[3]);
  }
}

TEST_CASE("fully masked rows give exact zeros, never NaN", "[naive]") {
  SECTION("boolean mask with a row of zeros") {
    AttentionCase c(problem(2, 2, 9, 9, 17, "bool"));
    c.fill_normal(11);
    c.random_mask(5, 0.6, {3});  // query row 3 may attend nothing
    expect_matches_reference(c);
    for (int64_t bh = 0; bh < 4; ++bh) CHECK(row_is_zero(c, bh, 3));
  }
  SECTION("every key padded in one batch") {
    AttentionCase c(problem(2, 3, 7, 7, 20, "pad"));
    c.fill_normal(12);
    for (int64_t j = 0; j < 7; ++j) c.pad.data[7 + j] = 1;  // batch 1: all keys padded
    c.pad.data[2] = 1;                                      // batch 0: one padded key
    expect_matches_reference(c);
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < 7; ++i) {
        CHECK(row_is_zero(c, 3 + h, i));
        CHECK_FALSE(row_is_zero(c, h, i));
      }
  }
  SECTION("causal + padding leaving query row 0 with no key") {
    for (auto [lq, lkv] : {std::pair<int64_t, int64_t>{6, 6}, {9, 4}, {3, 8}}) {
      AttentionCase c(problem(2, 2, lq, lkv, 5, "causal+pad"));
      c.fill_normal(13);
      c.pad.data[0] = 1;  // batch 0 pads key 0, the only key causal row 0 may see
      INFO("Lq " << lq << " Lkv " << lkv);
      expect_matches_reference(c);
      for (int64_t h = 0; h < 2; ++h) {
        CHECK(row_is_zero(c, h, 0));
        CHECK_FALSE(row_is_zero(c, h, 1));
        CHECK_FALSE(row_is_zero(c, 2 + h, 0));  // batch 1 pads nothing: row 0 is v_0
      }
    }
  }
}

TEST_CASE("logits near and far beyond the fp32 exp overflow point (88.7) stay finite and exact", "[naive]") {
  // Keys s_j * e_0 and queries a * e_0 with scale 1, values the identity rows: the output row is the weight
  // row for logits a * s_j. Every logit is an exact fp32 product (one nonzero term), max subtraction of
  // these values is exact, exp adds 1 ulp, the 6-term sum and the division a few more: each weight is
  // within ~10 ulps of its exact value, so 32 * eps is a safe bound that an overflow (inf/NaN) or an
  // unsubtracted max (all zeros or inf) violates by orders of magnitude.
  const std::vector<std::vector<float>> logits = {
      {88.0f, 87.5f, 80.0f, 0.0f, -10.0f, 88.7f},
      {200.0f, 199.0f, 150.0f, -200.0f, 0.0f, 199.5f},
      {-200.0f, -201.0f, -199.0f, -250.0f, -300.0f, -200.5f},  // all underflow unless the max is subtracted
      {1000.0f, -1000.0f, 999.0f, 0.0f, 998.0f, 1.0f},
  };
  const std::vector<float> query_scale = {1.0f, -1.0f, 0.5f};
  const int64_t heads = static_cast<int64_t>(logits.size()), lq = 3, lkv = 6;
  Problem p = problem(1, heads, lq, lkv, lkv);
  p.scale = 1.0;
  AttentionCase c(p);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < lq; ++i) c.q_at(h, i, 0) = query_scale[i];
    for (int64_t j = 0; j < lkv; ++j) {
      c.k_at(h, j, 0) = logits[h][j];
      c.v_at(h, j, j) = 1.0f;
    }
  }
  c.run();
  const DoubleArray ref = c.reference();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < lq; ++i) {
      double mx = -INFINITY, sum = 0;
      for (float s : logits[h]) mx = std::max(mx, double{query_scale[i]} * s);
      for (float s : logits[h]) sum += std::exp(double{query_scale[i]} * s - mx);
      for (int64_t j = 0; j < lkv; ++j) {
        const double want = std::exp(double{query_scale[i]} * logits[h][j] - mx) / sum;
        INFO("head " << h << " query scale " << query_scale[i] << " key " << j);
        CHECK(std::isfinite(c.out_at(h, i, j)));
        CHECK(std::fabs(c.out_at(h, i, j) - want) <= 32 * kFloatEps);
        CHECK(std::fabs(ref.data[(h * lq + i) * lkv + j] - want) <= 1e-15);
      }
    }

  // Gaussian inputs scaled so logits reach about +-200 with the default scale, D = 17, causal or not.
  for (const char* mask : {"none", "causal"}) {
    AttentionCase g(problem(1, 2, 33, 33, 17, mask));
    // q.k has standard deviation 49 * sqrt(17); times scale 1/sqrt(17): 49. The largest of ~2000 logits is
    // about 3.5 sigma, ~170, and the smallest about -170.
    g.fill_normal(21, 7.0);
    expect_matches_reference(g);
  }
}

TEST_CASE("naive matches the reference for cross-attention with a boolean mask", "[naive]") {
  // common/reference/check.cpp sweeps self-attention with every mask; cross-attention there uses
  // none/pad/causal only.
  for (auto [lq, lkv, d] : {std::tuple<int64_t, int64_t, int64_t>{7, 19, 17}, {17, 5, 33}, {1, 130, 3}}) {
    for (const char* mask : {"bool", "causal+bool", "causal+bool+pad"}) {
      AttentionCase c(problem(2, 2, lq, lkv, d, mask));
      c.fill_normal(31);
      c.random_mask(7, 0.5);
      if (c.p.mask.key_padding) c.pad.data[lkv + lkv - 1] = 1;
      expect_matches_reference(c);
    }
  }
}

TEST_CASE("exact_abs_tolerance is tight enough to catch a wrong output", "[naive]") {
  AttentionCase c(problem(2, 2, 33, 33, 20));
  c.fill_normal(41);
  c.run();
  const DoubleArray want = c.reference();
  const double tol = c.tolerance();
  double vmax = 0;
  for (float x : c.v.data) vmax = std::max(vmax, double{std::fabs(x)});
  // The bound is a small fraction of the output scale, so it can fail at all.
  CHECK(tol > 0);
  CHECK(tol < 1e-3 * vmax);
  CHECK(compare_outputs(c.out.ptr(), want.ptr(), c.rows(), 20).max_abs_err <= tol);

  SECTION("one element shifted by 10x the bound") {
    FloatArray bad = c.out;
    bad.data[1234] += static_cast<float>(10 * tol);
    const ErrorMetrics m = compare_outputs(bad.ptr(), want.ptr(), c.rows(), 20);
    CHECK(m.max_abs_err > tol);
  }
  SECTION("a scale 1% off") {
    c.p.scale = 1.01 * c.p.effective_scale();
    c.run();
    c.p.scale.reset();
    CHECK(compare_outputs(c.out.ptr(), want.ptr(), c.rows(), 20).max_abs_err > tol);
  }
  SECTION("a causal mask the reference does not have") {
    c.p.mask.causal = true;
    c.run();
    c.p.mask.causal = false;
    CHECK(compare_outputs(c.out.ptr(), want.ptr(), c.rows(), 20).max_abs_err > tol);
  }
}

TEST_CASE("compare_outputs on hand-made data", "[naive]") {
  SECTION("finite values") {
    const std::vector<float> got = {1, 2, 3, 4};
    const std::vector<double> want = {1, 2, 3, 4.5};
    const ErrorMetrics m = compare_outputs(got.data(), want.data(), 2, 2);
    CHECK(m.rows == 2);
    CHECK(m.max_abs_err == 0.5);
    CHECK(m.rel_l2_err == Approx(0.5 / std::sqrt(1 + 4 + 9 + 20.25)).epsilon(1e-12));
    // Row 0 identical (cosine 1); row 1: (3,4).(3,4.5) / (5 * |(3,4.5)|).
    CHECK(m.mean_cosine == Approx((1.0 + 27.0 / (5.0 * std::sqrt(29.25))) / 2).epsilon(1e-12));
    CHECK(m.nan_count == 0);
    CHECK(m.inf_count == 0);
  }
  SECTION("NaN and Inf are counted and make the error infinite") {
    const std::vector<float> got = {1, std::nanf(""), INFINITY, 4, 5, -INFINITY};
    const std::vector<double> want = {1, 2, 3, 4, 5, 6};
    const ErrorMetrics m = compare_outputs(got.data(), want.data(), 3, 2);
    CHECK(m.nan_count == 1);
    CHECK(m.inf_count == 2);
    CHECK(std::isinf(m.max_abs_err));
    CHECK(std::isinf(m.rel_l2_err));
    CHECK(m.mean_cosine == Approx(0.0).margin(1e-12));  // every row holds a non-finite value: cosine 0 each
  }
  SECTION("zero reference rows") {
    const std::vector<float> got = {0, 0, 3, 4};
    const std::vector<double> want = {0, 0, 0, 0};
    const ErrorMetrics m = compare_outputs(got.data(), want.data(), 2, 2);
    CHECK(m.max_abs_err == 4);
    CHECK(m.rel_l2_err == 5);     // ||want|| = 0: the absolute norm of the difference
    CHECK(m.mean_cosine == 0.5);  // zero vs zero counts 1, nonzero vs zero counts 0
    const ErrorMetrics same = compare_outputs(got.data(), want.data(), 1, 2);
    CHECK(same.max_abs_err == 0);
    CHECK(same.rel_l2_err == 0);
    CHECK(same.mean_cosine == 1);
  }
  SECTION("no rows") {
    const ErrorMetrics m = compare_outputs(nullptr, nullptr, 0, 4);
    CHECK(m.max_abs_err == 0);
    CHECK(m.mean_cosine == 1);
  }
}

TEST_CASE("sample_rows spans the sequence including the first and last row", "[naive]") {
  for (auto [seq, count] : {std::pair<int64_t, int64_t>{100, 5}, {1000, 7}, {7, 2}, {17, 16}, {5, 3}}) {
    const auto rows = sample_rows(seq, count);
    INFO("seq " << seq << " count " << count);
    REQUIRE(!rows.empty());
    CHECK(rows.front() == 0);
    CHECK(rows.back() == seq - 1);
    CHECK(static_cast<int64_t>(rows.size()) <= count);
    CHECK(std::is_sorted(rows.begin(), rows.end()));
    CHECK(std::adjacent_find(rows.begin(), rows.end()) == rows.end());
  }
  CHECK(sample_rows(100, 5) == std::vector<int64_t>{0, 24, 49, 74, 99});
  CHECK(sample_rows(4, 10) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(sample_rows(1, 1) == std::vector<int64_t>{0});

  // The reference restricted to sampled rows equals those rows of the full reference, bitwise.
  AttentionCase c(problem(2, 2, 40, 40, 9, "causal"));
  c.fill_normal(51);
  const DoubleArray full = c.reference();
  const auto rows = sample_rows(40, 6);
  std::vector<double> part(4 * rows.size() * 9);
  reference_attention(c.p, c.inputs(), part.data(), &rows);
  for (int64_t bh = 0; bh < 4; ++bh)
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (int64_t d = 0; d < 9; ++d)
        CHECK(part[(bh * rows.size() + r) * 9 + d] == full.data[(bh * 40 + rows[r]) * 9 + d]);
  const std::vector<float> gathered = gather_rows(c.q.ptr(), 4, 40, 9, rows);
  CHECK(gathered[(3 * rows.size() + 2) * 9 + 4] == c.q_at(3, rows[2], 4));
}

TEST_CASE("naive reports its quadratic workspace and its FLOPs", "[naive]") {
  Problem p = problem(1, 8, 65536, 65536, 64);
  CHECK(naive().workspace_bytes(p, 2) >= std::size_t{65536} * 65536 * sizeof(float));
  Problem small = problem(2, 3, 5, 7, 16);
  CHECK(naive().workspace_bytes(small, 1) >= std::size_t{5} * 7 * sizeof(float));
  CHECK(naive().flops(small) == 4.0 * 2 * 3 * 5 * 7 * 16);
  // 10^12 x 10^12 scores do not fit in 64 bits of bytes: the estimate saturates rather than wrapping to a
  // small number that a memory budget would let through.
  Problem huge = problem(1, 1, 1000000000000, 1000000000000, 1);
  CHECK(naive().workspace_bytes(huge, 1) == SIZE_MAX);
}

TEST_CASE("exact variants count causal FLOPs over the pairs below the diagonal only", "[naive]") {
  // Brute-force count of the (i, j) pairs key_allowed leaves under a causal mask, for square and both
  // cross shapes; every exact variant reports 4·d FLOPs per such pair.
  for (auto [lq, lkv] : {std::pair<int64_t, int64_t>{7, 7}, {5, 9}, {9, 5}, {1, 4}, {4, 1}}) {
    Problem p = problem(2, 3, lq, lkv, 16);
    p.mask.causal = true;
    double pairs = 0;
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t j = 0; j < lkv; ++j) pairs += j <= i;
    CAPTURE(lq, lkv);
    CHECK(causal_pairs(p) == pairs);
    for (const auto& name : Registry::instance().names()) {
      const Attention& v = Registry::instance().get(name);
      if (!v.capabilities().exact) continue;
      CAPTURE(name);
      CHECK(v.flops(p) == 4.0 * 2 * 3 * 16 * pairs);
      p.mask.causal = false;
      CHECK(v.flops(p) == 4.0 * 2 * 3 * 16 * static_cast<double>(lq * lkv));
      p.mask.causal = true;
    }
  }
}

namespace {
// K or V of a grouped-query case with every K/V head repeated for the query heads of its group (torch's
// repeat_interleave along dim 1): the multi-head problem grouped-query attention must equal.
FloatArray repeat_kv_heads(const FloatArray& x, const Problem& p) {
  const int64_t rows = p.seq_kv * p.head_dim;
  FloatArray out({p.batch, p.heads, p.seq_kv, p.head_dim});
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      std::copy_n(x.ptr() + p.kv_block(b, h) * rows, rows, out.ptr() + (b * p.heads + h) * rows);
  return out;
}
}  // namespace

TEST_CASE("grouped-query attention equals multi-head attention on K/V repeated per group", "[naive][gqa]") {
  // Query head h reads K/V head h / (heads / kv_heads) (PyTorch enable_gqa, llama.cpp): the same as
  // repeat_interleave of K and V, in the fp64 reference bitwise (the same operations in the same order) and
  // in every exact variant within its bound.
  for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{8, 2}, {6, 3}, {4, 1}, {4, 4}}) {
    for (const char* mask : {"none", "causal_lower_right+pad"}) {
      Problem p = problem(2, heads, 5, 23, 8, mask);
      p.kv_heads = kv_heads;
      CAPTURE(heads, kv_heads, mask);
      AttentionCase gqa(p, 31);
      if (p.mask.key_padding) gqa.pad_keys([](int64_t b, int64_t j) { return b == 1 && j > 15; });
      Problem mha_p = p;
      mha_p.kv_heads = 0;
      AttentionCase mha(mha_p);
      mha.q = gqa.q;
      mha.k = repeat_kv_heads(gqa.k, p);
      mha.v = repeat_kv_heads(gqa.v, p);
      mha.pad = gqa.pad;
      const DoubleArray want = mha.reference(), got = gqa.reference();
      CHECK(std::memcmp(want.ptr(), got.ptr(), want.numel() * sizeof(double)) == 0);
      for (const auto& name : Registry::instance().names()) {
        const Attention& v = Registry::instance().get(name);
        if (!v.capabilities().exact || !v.unsupported_reasons_text(gqa.for_variant(name)).empty()) continue;
        CAPTURE(name);
        const FloatArray out = gqa.run_as(name);
        CHECK(compare_outputs(out.ptr(), want.ptr(), gqa.rows(), 8).max_abs_err <= gqa.tolerance());
      }
    }
  }
}

TEST_CASE("causal_lower_right is the mask j <= i + seq_kv - seq_q, and rows with no key are zeros",
          "[naive]") {
  for (auto [lq, lkv] : {std::pair<int64_t, int64_t>{5, 9}, {9, 5}, {1, 6}, {6, 6}}) {
    CAPTURE(lq, lkv);
    AttentionCase lr(problem(1, 2, lq, lkv, 4, "causal_lower_right"), 7);
    AttentionCase explicit_mask(problem(1, 2, lq, lkv, 4, "bool"));
    explicit_mask.q = lr.q, explicit_mask.k = lr.k, explicit_mask.v = lr.v;
    explicit_mask.mask = ByteArray({lq, lkv});
    double pairs = 0;
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t j = 0; j < lkv; ++j) {
        explicit_mask.mask.data[i * lkv + j] = j <= i + lkv - lq;
        pairs += j <= i + lkv - lq;
      }
    const DoubleArray want = explicit_mask.reference(), got = lr.reference();
    CHECK(std::memcmp(want.ptr(), got.ptr(), want.numel() * sizeof(double)) == 0);
    CHECK(causal_pairs(lr.p) == pairs);
    const FloatArray out = lr.run();
    CHECK(compare_outputs(out.ptr(), want.ptr(), lr.rows(), 4).max_abs_err <= lr.tolerance());
    // seq_q > seq_kv: the first seq_q - seq_kv rows of every head see no key.
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < std::max<int64_t>(0, lq - lkv); ++i)
        for (int64_t d = 0; d < 4; ++d) CHECK(out.data[(h * lq + i) * 4 + d] == 0.0f);
    // Equal to upper-left causal when seq_q == seq_kv; both together are the stricter.
    if (lq == lkv) CHECK(causal_offset(lr.p) == 0);
    Problem both = lr.p;
    both.mask.causal = true;
    CHECK(causal_offset(both) == std::min<int64_t>(0, lkv - lq));
  }
}

TEST_CASE("naive counts the bytes its schedule moves: K/V once per query head, the score matrix twice",
          "[naive][gqa]") {
  Problem p = problem(1, 32, 1, 32768, 128, "causal_lower_right");
  p.kv_heads = 8;
  const double kv_head = 2.0 * 32768 * 128 * 4;
  CHECK(naive().bytes_moved(p) == compulsory_bytes(p) + 24 * kv_head + 2.0 * 32 * 32768 * 4);
}
