// linear attention against its own definitions: the chunked causal form against the step-by-step fp64
// recurrence, causality under future perturbation, feature maps, padding, and parameter errors; the backward
// where the registry-wide gradient checks do not reach (several query and key blocks, a long lower-right
// prefix, rows and batch entries with no weight) and its cost model.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "common/interface/attention.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"
#include "common/support/tensor.hpp"
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

template <class Want>
double max_abs_diff(const FloatArray& got, const Want& want) {
  double worst = 0;
  for (std::size_t e = 0; e < got.numel(); ++e) {
    const double d = std::fabs(got.data[e] - want[e]);
    worst = std::max(worst, std::isnan(d) ? INFINITY : d);
  }
  return worst;
}

// One training step on the case: run_saving, then run_backward with upstream gradient d_out.
struct Grads {
  FloatArray out, dq, dk, dv;
};
Grads train(const AttentionCase& c, const FloatArray& d_out) {
  const Attention& v = Registry::instance().get(c.p.variant);
  Grads g{FloatArray(c.q.shape, std::nanf("")), FloatArray(c.q.shape, std::nanf("")),
          FloatArray(c.k.shape, std::nanf("")), FloatArray(c.v.shape, std::nanf(""))};
  std::vector<float> saved(v.saved_floats(c.p), std::nanf(""));
  const AttentionInputs in = c.inputs(g.out.ptr());
  v.run_saving(c.p, in, saved.data());
  v.run_backward(c.p, in,
                 {.out = g.out.ptr(),
                  .saved = saved.data(),
                  .d_out = d_out.ptr(),
                  .dq = g.dq.ptr(),
                  .dk = g.dk.ptr(),
                  .dv = g.dv.ptr()});
  return g;
}

// The training step's dQ, dK, dV against reference_backward, each within grad_tolerance.
void require_reference_gradients(const AttentionCase& c, uint64_t seed) {
  const Attention& v = Registry::instance().get(c.p.variant);
  const FloatArray d_out = normal_tensor(c.q.shape, seed);
  const Grads g = train(c, d_out);
  DoubleArray wq(c.q.shape), wk(c.k.shape), wv(c.v.shape);
  v.reference_backward(c.p, c.inputs(nullptr), d_out.ptr(), wq.ptr(), wk.ptr(), wv.ptr());
  const GradientTolerance tol = v.grad_tolerance(c.p, c.inputs(nullptr), d_out.ptr());
  INFO(c.p.repro());
  REQUIRE(max_abs_diff(g.dq, wq.data) <= tol.dq);
  REQUIRE(max_abs_diff(g.dk, wk.data) <= tol.dk);
  REQUIRE(max_abs_diff(g.dv, wv.data) <= tol.dv);
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

// The registry's gradient checks stop at 130 positions; these shapes take the paths they do not: several
// query blocks split into slabs whose partial states are summed over a grouped-query head's group, several
// key blocks, many causal chunks, and a lower-right prefix of keys every query sees longer than one key
// block.
TEST_CASE("linear backward past one block matches the fp64 gradient", "[linear]") {
  uint64_t seed = 300;
  for (const char* map : {"elu", "relu"}) {
    Problem p = make_test_problem("linear", 1, 4, 600, 600, 24, "pad", {{"feature_map", map}});
    p.kv_heads = 2;
    AttentionCase full(p, ++seed);
    full.pad_keys([](int64_t, int64_t j) { return j % 7 == 3; });
    require_reference_gradients(full, ++seed);

    AttentionCase causal(make_test_problem("linear", 1, 2, 600, 600, 16, "causal", {{"feature_map", map}}),
                         ++seed);
    require_reference_gradients(causal, ++seed);

    p = make_test_problem("linear", 1, 4, 40, 1200, 16, "causal_lower_right+pad",
                          {{"feature_map", map}, {"chunk", 16}});
    p.kv_heads = 1;
    AttentionCase prefix(p, ++seed);
    prefix.pad_keys([](int64_t, int64_t j) { return j % 5 == 0; });
    require_reference_gradients(prefix, ++seed);
  }
}

TEST_CASE("linear backward: rows with no weight and fully padded batch entries get zero gradients",
          "[linear]") {
  for (bool causal : {false, true}) {
    // relu with a query whose features are all 0 (every coordinate negative): its row has numerator and
    // denominator 0 and r = 1/eps, and φ' = 0 must give an exact zero dQ row, not 0 · huge or NaN. Batch
    // entry 1 pads every key: its O and all its gradients are exactly 0.
    AttentionCase c = linear_case({{"feature_map", "relu"}, {"chunk", 4}}, 2, 2, 10, 10, 8, causal, true, 17);
    for (int64_t d = 0; d < 8; ++d) c.q.data[3 * 8 + d] = -1.0f - (float)d;  // batch 0, head 0, row 3
    const Grads g = train(c, normal_tensor(c.q.shape, 5));
    for (const FloatArray* t : {&g.dq, &g.dk, &g.dv})
      for (float x : t->data) REQUIRE(std::isfinite(x));
    for (int64_t d = 0; d < 8; ++d) REQUIRE(g.dq.data[3 * 8 + d] == 0.0f);
    const int64_t q_half = g.dq.numel() / 2, kv_half = g.dk.numel() / 2;
    for (int64_t e = q_half; e < 2 * q_half; ++e) REQUIRE(g.dq.data[e] == 0.0f);
    for (int64_t e = kv_half; e < 2 * kv_half; ++e) REQUIRE((g.dk.data[e] == 0.0f && g.dv.data[e] == 0.0f));
    // Batch 0's padded keys (j % 4 == 0) have no gradient either.
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < 10; j += 4)
        for (int64_t d = 0; d < 8; ++d) {
          const std::size_t e = (h * 10 + j) * 8 + d;
          REQUIRE((g.dk.data[e] == 0.0f && g.dv.data[e] == 0.0f));
        }
  }
}

TEST_CASE("linear backward is O(n): workspace independent of n, FLOPs linear in n", "[linear]") {
  const Attention& v = Registry::instance().get("linear");
  for (bool causal : {false, true}) {
    Problem p = make_problem("linear");
    p.batch = 1, p.heads = 8, p.head_dim = 64, p.mask.causal = causal;
    p.seq_q = p.seq_kv = 2048;
    const std::size_t small = v.backward_workspace_bytes(p, 2);
    const double small_flops = v.backward_flops(p);
    // Non-causal, one K/V head per query head: n·d·(10d + 6) per head against the forward's n·d·(4d + 2).
    if (!causal) REQUIRE(small_flops == Approx(v.flops(p) * (10.0 * 64 + 6) / (4.0 * 64 + 2)).epsilon(1e-12));
    p.seq_q = p.seq_kv = 32768;
    REQUIRE(v.backward_workspace_bytes(p, 2) == small);
    REQUIRE(v.backward_flops(p) == Approx(16 * small_flops).epsilon(1e-12));
    REQUIRE(v.saved_floats(p) == static_cast<std::size_t>(8 * 32768));
  }
}
