// linear attention against its own definitions: the chunked causal form against the step-by-step fp64
// recurrence, causality under future perturbation, feature maps, padding, and parameter errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "common/attention.hpp"
#include "common/error.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"
#include "tests/support/attention_case.hpp"

using namespace attn;
using namespace attn::test;

namespace {

// A linear-attention case: seeded Q, K, V; with `padded`, batch b pads keys j with (j + b) % 4 == 0, and
// batch 1 (if present) pads every key.
AttentionCase linear_case(const Json& params, int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_kv,
                          int64_t dim, bool causal, bool padded, uint64_t seed) {
  AttentionCase c(make_test_problem("linear", batch, heads, seq_q, seq_kv, dim, "none", params),
                  seed * 3 + 1);
  c.p.mask.causal = causal;
  c.p.mask.key_padding = padded;
  if (padded) c.pad_keys([](int64_t b, int64_t j) { return b == 1 || (j + b) % 4 == 0; });
  return c;
}

double phi(const std::string& map, double x) {
  if (map == "relu") return std::max(x, 0.0);
  return x > 0 ? x + 1.0 : std::exp(x);  // elu(x) + 1
}

// The recurrence linear attention is defined by, one position at a time in fp64 (Katharopoulos et al. eq.
// 18-20): S_i = S_{i-1} + φ(k_i) v_iᵀ, z_i = z_{i-1} + φ(k_i), out_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i + eps).
// Causal rows use the state after key i (keys beyond seq_kv do not exist); non-causal rows the final state.
std::vector<double> recurrence(const AttentionCase& c) {
  const Problem& p = c.p;
  const std::string map = p.param_string("feature_map");
  const double eps = p.param_number("eps");
  const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv;
  std::vector<double> out(static_cast<std::size_t>(p.batch * p.heads * Lq * D));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t bh = b * p.heads + h;
      std::vector<double> S(D * D, 0.0), z(D, 0.0), fq(D);
      int64_t next_key = 0;
      auto absorb_until = [&](int64_t last) {  // add keys next_key..last to the state
        for (; next_key <= std::min(last, Lkv - 1); ++next_key) {
          if (p.mask.key_padding && c.pad.data[b * Lkv + next_key]) continue;
          for (int64_t e = 0; e < D; ++e) {
            const double fk = phi(map, c.k.data[(bh * Lkv + next_key) * D + e]);
            z[e] += fk;
            for (int64_t d = 0; d < D; ++d) S[e * D + d] += fk * c.v.data[(bh * Lkv + next_key) * D + d];
          }
        }
      };
      if (!p.mask.causal) absorb_until(Lkv - 1);
      for (int64_t i = 0; i < Lq; ++i) {
        if (p.mask.causal) absorb_until(i);
        double den = 0;
        for (int64_t e = 0; e < D; ++e) den += (fq[e] = phi(map, c.q.data[(bh * Lq + i) * D + e])) * z[e];
        for (int64_t d = 0; d < D; ++d) {
          double num = 0;
          for (int64_t e = 0; e < D; ++e) num += fq[e] * S[e * D + d];
          out[(bh * Lq + i) * D + d] = num / (den + eps);
        }
      }
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

}  // namespace

TEST_CASE("linear chunked causal form equals the step-by-step recurrence", "[linear]") {
  uint64_t seed = 1;
  for (const char* map : {"elu", "relu"})
    for (int64_t chunk : {1, 3, 7, 16, 64, 500})  // 3 and 7 divide none of the lengths below
      for (int64_t n : {1, 50, 129})
        for (bool padded : {false, true}) {
          AttentionCase c =
              linear_case({{"feature_map", map}, {"chunk", chunk}}, 2, 2, n, n, 20, true, padded, ++seed);
          const FloatArray got = c.run();
          INFO(c.p.repro());
          REQUIRE(max_abs_diff(got, recurrence(c)) <= c.tolerance());
        }
}

TEST_CASE("linear non-causal and causal cross-attention equal the recurrence", "[linear]") {
  uint64_t seed = 100;
  for (const char* map : {"elu", "relu"})
    for (auto [lq, lkv] : {std::pair<int64_t, int64_t>{40, 40}, {70, 23}, {23, 70}, {300, 300}})
      for (bool causal : {false, true}) {
        AttentionCase c =
            linear_case({{"feature_map", map}, {"chunk", 8}}, 2, 3, lq, lkv, 33, causal, true, ++seed);
        const FloatArray got = c.run();
        INFO(c.p.repro());
        REQUIRE(max_abs_diff(got, recurrence(c)) <= c.tolerance());
      }
}

TEST_CASE("linear at production sizes (default chunk, d=64) equals the recurrence", "[linear]") {
  for (bool causal : {false, true}) {
    AttentionCase c = linear_case(Json::object(), 1, 2, 3001, 3001, 64, causal, true, 31);
    const FloatArray got = c.run();
    INFO(c.p.repro());
    REQUIRE(max_abs_diff(got, recurrence(c)) <= c.tolerance());
  }
}

TEST_CASE("linear chunk sizes that do not divide n agree with each other", "[linear]") {
  const int64_t n = 37;
  AttentionCase c = linear_case({{"chunk", 1}}, 1, 2, n, n, 16, true, false, 9);
  const FloatArray one = c.run();
  for (int64_t chunk : {2, 5, 10, 36, 37, 38}) {
    c.p.params["chunk"] = chunk;
    const FloatArray other = c.run();
    double worst = 0;
    for (std::size_t e = 0; e < one.numel(); ++e)
      worst = std::max(worst, (double)std::fabs(one.data[e] - other.data[e]));
    INFO("chunk " << chunk);
    REQUIRE(worst <= 2 * c.tolerance());  // each within the bound of the same fp64 definition
  }
}

TEST_CASE("linear causal: changing the future leaves earlier rows bitwise unchanged", "[linear]") {
  const int64_t n = 90, D = 24;
  for (int64_t chunk : {1, 8, 13, 64, 90}) {
    for (int64_t t : {0, 12, 45, 88}) {
      AttentionCase c = linear_case({{"chunk", chunk}}, 1, 2, n, n, D, true, false, 5);
      const FloatArray before = c.run();
      Rng rng(77);
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = t + 1; i < n; ++i)
          for (int64_t d = 0; d < D; ++d) {
            const std::size_t e = (h * n + i) * D + d;
            c.q.data[e] = 5.0f * (float)rng.normal();
            c.k.data[e] = 5.0f * (float)rng.normal();
            c.v.data[e] = 1e3f * (float)rng.normal();
          }
      const FloatArray after = c.run();
      INFO("chunk " << chunk << ", changed positions > " << t);
      // Future keys reach earlier rows only through zeroed entries of the chunk's masked scores (0 · v = 0
      // exactly) or through the state of later chunks, so earlier rows are bitwise equal.
      for (int64_t h = 0; h < 2; ++h)
        REQUIRE(std::memcmp(before.ptr() + h * n * D, after.ptr() + h * n * D, (t + 1) * D * sizeof(float)) ==
                0);
      // And the change is visible after t (the test would be vacuous otherwise).
      REQUIRE(std::fabs(before.data[(t + 1) * D] - after.data[(t + 1) * D]) > 1e-3);
    }
  }
}

TEST_CASE("linear gives zero rows, never NaN, when every weight is zero", "[linear]") {
  for (bool causal : {false, true}) {
    // relu with a query whose features are all negative: φ(q) = 0, numerator and denominator 0, eps keeps
    // 0/eps.
    AttentionCase c = linear_case({{"feature_map", "relu"}, {"chunk", 4}}, 2, 1, 10, 10, 8, causal, true, 11);
    for (int64_t d = 0; d < 8; ++d) c.q.data[3 * 8 + d] = -1.0f - (float)d;  // batch 0, row 3
    const FloatArray out = c.run();
    for (std::size_t e = 0; e < out.numel(); ++e) REQUIRE(!std::isnan(out.data[e]));
    for (int64_t d = 0; d < 8; ++d) REQUIRE(out.data[3 * 8 + d] == 0.0f);
    // Batch 1 pads every key: its whole output is zero, for elu too.
    for (const char* map : {"relu", "elu"}) {
      c.p.params["feature_map"] = map;
      const FloatArray padded = c.run();
      for (int64_t e = 10 * 8; e < 20 * 8; ++e) REQUIRE(padded.data[e] == 0.0f);
    }
  }
}

TEST_CASE("linear is O(n): workspace independent of n, FLOPs linear in n", "[linear]") {
  const Attention& v = Registry::instance().get("linear");
  for (bool causal : {false, true}) {
    Problem p = make_problem("linear");
    p.batch = 1, p.heads = 8, p.head_dim = 64, p.mask.causal = causal;
    p.seq_q = p.seq_kv = 2048;
    const std::size_t small = v.workspace_bytes(p, 2);
    const double small_flops = v.flops(p);
    p.seq_q = p.seq_kv = 32768;
    REQUIRE(v.workspace_bytes(p, 2) == small);
    REQUIRE(v.flops(p) == Approx(16 * small_flops).epsilon(1e-12));
  }
}

TEST_CASE("linear rejects bad parameters and unsupported problems with the reason", "[linear]") {
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(make_problem("linear", {{"feature_map", "tanh"}}),
                      Contains("feature_map") && Contains("{elu, relu}") && Contains("tanh"));
  REQUIRE_THROWS_WITH(make_problem("linear", {{"chunk", 0}}), Contains("chunk") && Contains("got 0"));
  REQUIRE_THROWS_WITH(make_problem("linear", {{"eps", 0.0}}), Contains("eps"));
  REQUIRE_THROWS_WITH(make_problem("linear", {{"eps", -1e-6}}), Contains("eps"));
  REQUIRE_THROWS_WITH(make_problem("linear", {{"feature_mop", "relu"}}),
                      Contains("did you mean 'feature_map'"));

  const Attention& v = Registry::instance().get("linear");
  Problem p = make_problem("linear");
  p.seq_q = p.seq_kv = 8, p.head_dim = 4;
  REQUIRE(v.not_supported_reasons(p).empty());
  p.mask.boolean = true;
  auto reasons = v.not_supported_reasons(p);
  REQUIRE(reasons.size() == 1);
  REQUIRE_THAT(reasons[0], Contains("boolean"));
  p.mask.boolean = false;
  p.scale = 0.5;
  reasons = v.not_supported_reasons(p);
  REQUIRE(reasons.size() == 1);
  REQUIRE_THAT(reasons[0], Contains("scale"));
}
