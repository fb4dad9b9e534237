// sliding_window against its definitions: naive under the equivalent boolean mask (built here from the
// definition, not from the variant's own pattern code), full attention in the limits, dilation, edges,
// errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "common/interface/attention.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"
#include "common/support/tensor.hpp"
#include "tests/support/attention_case.hpp"
#include "variants/sliding_window/rolling_cache.hpp"

using namespace attn;
using namespace attn::test;

namespace {

// A sliding_window self-attention case: seeded Q, K, V; with `padded`, batch b pads every third key from
// offset b, and batch 2 (if present) pads every key.
AttentionCase window_case(const Json& params, int64_t batch, int64_t heads, int64_t seq, int64_t dim,
                          bool causal, bool padded, uint64_t seed) {
  AttentionCase c(make_test_problem("sliding_window", batch, heads, seq, seq, dim, "none", params),
                  seed * 3 + 1);
  c.p.mask.causal = causal;
  c.p.mask.key_padding = padded;
  if (padded) c.pad_keys([](int64_t b, int64_t j) { return b == 2 || (j + b) % 3 == 0; });
  return c;
}

// The Longformer pattern written straight from the definition: key j is allowed for query i iff
// j = i + k*dilation with |k| <= w (k <= 0 when causal), or either position is global.
std::vector<uint8_t> definition_mask(int64_t n, int64_t w, int64_t dilation,
                                     const std::vector<int64_t>& globals, bool causal) {
  std::vector<uint8_t> m(static_cast<std::size_t>(n * n), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t step = -w; step <= (causal ? 0 : w); ++step) {
      const int64_t j = i + step * dilation;
      if (j >= 0 && j < n) m[i * n + j] = 1;
    }
  for (int64_t g : globals)
    for (int64_t x = 0; x < n; ++x) m[g * n + x] = m[x * n + g] = 1;
  if (causal)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) m[i * n + j] = 0;
  return m;
}

template <class Array>
double max_abs_diff(const FloatArray& a, const Array& b) {
  double worst = 0;
  for (std::size_t e = 0; e < a.numel(); ++e) {
    const double d = std::fabs(static_cast<double>(a.data[e]) - b.data[e]);
    worst = std::max(worst, std::isnan(d) ? INFINITY : d);
  }
  return worst;
}

// Asserts `got` is within the derived fp32 bound of the fp64 softmax reference of `p` (mask as given).
void require_matches_reference(const AttentionCase& c, const Problem& p, const FloatArray& got,
                               const uint8_t* mask = nullptr) {
  DoubleArray want({p.batch, p.heads, p.seq_q, p.head_dim});
  const AttentionInputs in = c.inputs(nullptr, &p, mask);  // the reference writes only `want`
  reference_attention(p, in, want.ptr());
  const ErrorMetrics m = compare_outputs(got.ptr(), want.ptr(), p.batch * p.heads * p.seq_q, p.head_dim);
  const double tol = exact_abs_tolerance(p, in);
  INFO(p.repro() << ": max_abs_err " << m.max_abs_err << " bound " << tol);
  REQUIRE(m.nan_count == 0);
  REQUIRE(m.max_abs_err <= tol);
}

}  // namespace

TEST_CASE("sliding_window equals naive under the equivalent boolean mask", "[sliding_window]") {
  struct Setting {
    int64_t window, dilation;
    Json globals;
    std::vector<int64_t> global_list;
  };
  const Setting settings[] = {{4, 1, 0, {}},
                              {1, 1, 0, {}},
                              {6, 2, 0, {}},
                              {3, 3, 2, {0, 1}},
                              {5, 1, Json::array({9, 2, 40}), {2, 9, 40}},
                              {2, 4, Json::array({0, 63}), {0, 63}},
                              {40, 1, 3, {0, 1, 2}}};
  uint64_t seed = 10;
  for (const Setting& s : settings)
    for (int64_t n : {64, 67, 130})
      for (bool causal : {false, true})
        for (bool padded : {false, true}) {
          const Json params = {{"window", s.window}, {"dilation", s.dilation}, {"global_tokens", s.globals}};
          AttentionCase c = window_case(params, 3, 2, n, 24, causal, padded, ++seed);
          const FloatArray got = c.run();
          const std::vector<uint8_t> mask = definition_mask(n, s.window, s.dilation, s.global_list, causal);
          Problem masked = make_problem("naive");
          masked.batch = c.p.batch, masked.heads = c.p.heads, masked.seq_q = masked.seq_kv = n;
          masked.head_dim = c.p.head_dim, masked.mask = c.p.mask;
          masked.mask.boolean = true;
          const FloatArray naive = c.run(masked, mask.data());
          INFO(c.p.repro());
          // Both are fp32 results within the derived bound of the same fp64 oracle, hence within twice it.
          require_matches_reference(c, masked, got, mask.data());
          require_matches_reference(c, masked, naive, mask.data());
          REQUIRE(max_abs_diff(got, naive) <=
                  2 * exact_abs_tolerance(masked, c.inputs(nullptr, &masked, mask.data())));
        }
}

TEST_CASE("sliding_window at a production window (w=256, 64-row tiles) equals the masked reference",
          "[sliding_window]") {
  // The check shapes stop at seq 130, where the default window covers everything; this runs real bands.
  const int64_t n = 1100;
  for (int64_t dilation : {1, 2})
    for (bool causal : {false, true}) {
      const Json params = {{"window", 256}, {"dilation", dilation}, {"global_tokens", Json::array({0, 700})}};
      AttentionCase c = window_case(params, 1, 2, n, 32, causal, true, 40 + dilation);
      const FloatArray got = c.run();
      const std::vector<uint8_t> mask = definition_mask(n, 256, dilation, {0, 700}, causal);
      Problem masked = c.p;
      masked.mask.boolean = true;
      INFO(c.p.repro());
      require_matches_reference(c, masked, got, mask.data());
    }
}

TEST_CASE("sliding_window with a window covering the sequence equals full attention", "[sliding_window]") {
  for (int64_t n : {1, 17, 100}) {
    for (bool causal : {false, true}) {
      // window = seq - 1 reaches every key from every query; larger windows must change nothing.
      for (int64_t w : {n - 1, n, 4 * n + 3}) {
        AttentionCase c = window_case({{"window", w}}, 2, 2, n, 16, causal, true, 100 + n + w);
        const FloatArray got = c.run();
        Problem full = make_problem("naive");
        full.batch = 2, full.heads = 2, full.seq_q = full.seq_kv = n, full.head_dim = 16,
        full.mask = c.p.mask;
        const FloatArray naive = c.run(full);
        INFO(c.p.repro());
        require_matches_reference(c, full, got);
        REQUIRE(max_abs_diff(got, naive) <= 2 * exact_abs_tolerance(full, c.inputs(nullptr, &full)));
      }
    }
  }
}

TEST_CASE("sliding_window with every position global equals full attention", "[sliding_window]") {
  const int64_t n = 45;
  std::vector<int64_t> every(n);
  for (int64_t i = 0; i < n; ++i) every[i] = n - 1 - i;  // unsorted on purpose
  for (const Json& globals : {Json(n), Json(n + 100), Json(every)}) {
    for (bool causal : {false, true}) {
      AttentionCase c = window_case({{"window", 1}, {"dilation", 3}, {"global_tokens", globals}}, 3, 1, n, 8,
                                    causal, true, 7);
      const FloatArray got = c.run();
      Problem full = make_problem("naive");
      full.batch = 3, full.heads = 1, full.seq_q = full.seq_kv = n, full.head_dim = 8, full.mask = c.p.mask;
      INFO(c.p.repro());
      require_matches_reference(c, full, got);
    }
  }
}

TEST_CASE(
    "sliding_window dilation 1 equals the undilated default, and a dilated window is a window on each "
    "residue class",
    "[sliding_window]") {
  AttentionCase c = window_case({{"window", 5}}, 1, 2, 70, 16, false, false, 3);
  Problem dilated_one = make_problem("sliding_window", {{"window", 5}, {"dilation", 1}});
  dilated_one.batch = 1, dilated_one.heads = 2, dilated_one.seq_q = dilated_one.seq_kv = 70,
  dilated_one.head_dim = 16;
  const FloatArray a = c.run(), b = c.run(dilated_one);
  REQUIRE(std::memcmp(a.ptr(), b.ptr(), a.numel() * sizeof(float)) == 0);

  // With dilation 3, positions r, r+3, r+6, ... see only each other, through an ordinary window of 5.
  const int64_t n = 70, dil = 3, D = 16, H = 2;
  for (bool causal : {false, true}) {
    AttentionCase whole = window_case({{"window", 5}, {"dilation", dil}}, 1, H, n, D, causal, false, 4);
    const FloatArray out = whole.run();
    for (int64_t r = 0; r < dil; ++r) {
      const int64_t m = (n - r + dil - 1) / dil;
      AttentionCase sub = window_case({{"window", 5}}, 1, H, m, D, causal, false, 0);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < m; ++t)
          for (int64_t d = 0; d < D; ++d) {
            const std::size_t from = ((h * n) + r + t * dil) * D + d, to = (h * m + t) * D + d;
            sub.q.data[to] = whole.q.data[from], sub.k.data[to] = whole.k.data[from];
            sub.v.data[to] = whole.v.data[from];
          }
      const FloatArray sub_out = sub.run();
      double worst = 0;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < m; ++t)
          for (int64_t d = 0; d < D; ++d)
            worst = std::max(worst, (double)std::fabs(out.data[((h * n) + r + t * dil) * D + d] -
                                                      sub_out.data[(h * m + t) * D + d]));
      INFO("residue " << r << (causal ? " causal" : ""));
      REQUIRE(worst <= 2 * exact_abs_tolerance(sub.p, sub.inputs(nullptr)));
    }
  }
}

TEST_CASE("sliding_window edges: the first and last w rows softmax over exactly their clipped band",
          "[sliding_window]") {
  const int64_t n = 50, w = 7, D = 12;
  AttentionCase c = window_case({{"window", w}}, 1, 1, n, D, false, false, 21);
  const FloatArray got = c.run();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i > w && i < n - 1 - w) continue;  // interior rows are covered by the mask test
    const int64_t lo = std::max<int64_t>(0, i - w), hi = std::min(n - 1, i + w);
    std::vector<double> s;
    for (int64_t j = lo; j <= hi; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += (double)c.q.data[i * D + d] * c.k.data[j * D + d];
      s.push_back(dot * scale);
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (int64_t d = 0; d < D; ++d) {
      double o = 0;
      for (int64_t j = lo; j <= hi; ++j) o += s[j - lo] / sum * c.v.data[j * D + d];
      worst = std::max(worst, std::fabs(o - got.data[i * D + d]));
    }
  }
  REQUIRE(worst <= exact_abs_tolerance(c.p, c.inputs(nullptr)));

  // Row 0 must not see key w+1 and must see key w: change each and watch row 0.
  AttentionCase moved = c;
  for (int64_t d = 0; d < D; ++d) moved.v.data[(w + 1) * D + d] += 100.0f;
  FloatArray out = moved.run();
  REQUIRE(std::memcmp(out.ptr(), got.ptr(), D * sizeof(float)) == 0);
  for (int64_t d = 0; d < D; ++d) moved.v.data[w * D + d] += 100.0f;
  out = moved.run();
  REQUIRE(std::fabs(out.data[0] - got.data[0]) > 0.01);
}

TEST_CASE("sliding_window window 0 returns each position's own value, and fully masked rows are zeros",
          "[sliding_window]") {
  const int64_t n = 33, D = 9;
  AttentionCase c = window_case({{"window", 0}}, 3, 2, n, D, false, true, 5);
  const FloatArray out = c.run();
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const bool padded = c.pad.data[b * n + i] != 0;
        for (int64_t d = 0; d < D; ++d) {
          const std::size_t e = (((b * 2 + h) * n) + i) * D + d;
          // One allowed key: weight exactly 1 (exp(0) / exp(0)), so the output is v_i; a padded self: zeros.
          REQUIRE(out.data[e] == (padded ? 0.0f : c.v.data[e]));
        }
      }
}

TEST_CASE("sliding_window is linear in n: workspace O(w), band FLOPs 4·n·(2w+1)·d", "[sliding_window]") {
  const Attention& v = Registry::instance().get("sliding_window");
  Problem p = make_problem("sliding_window", {{"window", 256}});
  p.batch = 1, p.heads = 8, p.head_dim = 64;
  p.seq_q = p.seq_kv = 4096;
  const std::size_t small = v.workspace_bytes(p, 2);
  const double small_flops = v.flops(p);
  p.seq_q = p.seq_kv = 32768;
  // No seq x seq buffer: the per-thread scratch depends on the window and tile, not on n.
  REQUIRE(v.workspace_bytes(p, 2) == small);
  REQUIRE(v.workspace_bytes(p, 2) < 32768u * 513u * sizeof(float));
  REQUIRE(v.flops(p) == 4.0 * 8 * 32768 * 513 * 64);
  REQUIRE(v.flops(p) == 8 * small_flops);
}

TEST_CASE("sliding_window sizes a huge global count without listing the positions", "[sliding_window]") {
  // global_tokens = 10^12 at seq 10^12: flops, workspace_bytes and the support check must be arithmetic
  // (the sweep asks them before deciding to skip); listing the positions would need 8 TB.
  const Attention& v = Registry::instance().get("sliding_window");
  Problem p = make_problem("sliding_window", {{"window", 4}, {"global_tokens", int64_t{1000000000000}}});
  p.batch = p.heads = p.head_dim = 1;
  p.seq_q = p.seq_kv = 1000000000000;
  CHECK(v.not_supported_reasons(p).empty());
  const std::size_t ws = v.workspace_bytes(p, 1);
  CHECK(ws >= std::size_t{1000000000000} * sizeof(int64_t));  // the position list forward would build
  // Every position global: full attention, 4·d FLOPs per (query, key) pair.
  CHECK(v.flops(p) == Approx(4.0 * 1e12 * 1e12).epsilon(1e-12));
}

TEST_CASE("sliding_window rejects bad parameters with the reason", "[sliding_window]") {
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(make_problem("sliding_window", {{"dilation", 0}}),
                      Contains("dilation") && Contains("[1") && Contains("got 0"));
  REQUIRE_THROWS_WITH(make_problem("sliding_window", {{"window", -1}}),
                      Contains("window") && Contains("got -1"));
  REQUIRE_THROWS_WITH(make_problem("sliding_window", {{"global_tokens", Json::array({1, -2})}}),
                      Contains("global_tokens") && Contains("got -2"));
  REQUIRE_THROWS_WITH(make_problem("sliding_window", {{"windw", 3}}), Contains("did you mean 'window'"));

  const Attention& v = Registry::instance().get("sliding_window");
  Problem p = make_problem("sliding_window", {{"global_tokens", Json::array({3, 8, 3})}});
  p.seq_q = p.seq_kv = 16, p.head_dim = 8;
  REQUIRE_THROWS_AS(v.not_supported_reasons(p), UsageError);
  REQUIRE_THROWS_WITH(v.not_supported_reasons(p), Contains("index 3 is listed more than once"));

  p = make_problem("sliding_window", {{"global_tokens", Json::array({2, 40})}});
  p.seq_q = p.seq_kv = 16, p.head_dim = 8;
  auto reasons = v.not_supported_reasons(p);
  REQUIRE(reasons.size() == 1);
  REQUIRE_THAT(reasons[0], Contains("index 40") && Contains("16"));
  p.seq_q = p.seq_kv = 41;
  REQUIRE(v.not_supported_reasons(p).empty());

  p.seq_kv = 20;  // cross-attention
  reasons = v.not_supported_reasons(p);
  REQUIRE(!reasons.empty());
  REQUIRE_THAT(reasons[0], Contains("cross-attention"));
}

// ---- Backward ----

namespace {

struct Grads {
  FloatArray dq, dk, dv;
};

// One training step of c.p's variant on c's inputs: run_saving, then run_backward with `d_out`.
Grads train(const AttentionCase& c, const FloatArray& d_out) {
  const Attention& v = Registry::instance().get(c.p.variant);
  FloatArray out(c.q.shape);
  const AttentionInputs io = c.inputs(out.ptr());
  std::vector<float> saved(v.saved_floats(c.p));
  v.run_saving(c.p, io, saved.data());
  Grads g{FloatArray(c.q.shape), FloatArray(c.k.shape), FloatArray(c.v.shape)};
  GradientArgs args;
  args.out = out.ptr(), args.saved = saved.data(), args.d_out = d_out.ptr();
  args.dq = g.dq.ptr(), args.dk = g.dk.ptr(), args.dv = g.dv.ptr();
  v.run_backward(c.p, io, args);
  return g;
}

// Asserts the training step's gradients are within grad_tolerance of the variant's fp64 gradient.
void require_gradients_match(const AttentionCase& c, uint64_t seed) {
  const Attention& v = Registry::instance().get(c.p.variant);
  const FloatArray d_out = normal_tensor(c.q.shape, seed);
  const Grads got = train(c, d_out);
  const AttentionInputs in = c.inputs(nullptr);
  DoubleArray dq(c.q.shape), dk(c.k.shape), dv(c.v.shape);
  v.reference_backward(c.p, in, d_out.ptr(), dq.ptr(), dk.ptr(), dv.ptr());
  const GradientTolerance tol = v.grad_tolerance(c.p, in, d_out.ptr());
  INFO(c.p.repro() << ": tolerance dq " << tol.dq << ", dk " << tol.dk << ", dv " << tol.dv);
  CHECK(max_abs_diff(got.dq, dq) <= tol.dq);
  CHECK(max_abs_diff(got.dk, dk) <= tol.dk);
  CHECK(max_abs_diff(got.dv, dv) <= tol.dv);
}

}  // namespace

TEST_CASE("sliding_window backward at sizes the registry checks do not reach", "[sliding_window]") {
  // The registry's gradient checks run seq <= 130 with windows <= 5 (or covering the sequence) and at most 2
  // global tokens: here several 32-row tiles per residue class, 40 global tokens (global rows and keys in
  // three 16-wide tasks each, global key columns over three 256-row query steps), dilation with globals,
  // grouped-query heads, padding and dropout, against the fp64 gradient of the definition.
  struct Setting {
    Json params;
    const char* mask;
    int64_t heads, kv_heads;
    double dropout;
  };
  const Setting settings[] = {
      {{{"window", 40}, {"global_tokens", 40}}, "pad", 4, 2, 0.0},
      {{{"window", 20}, {"dilation", 3}, {"global_tokens", Json::array({0, 5, 77, 299, 300, 519})}},
       "causal",
       2,
       1,
       0.1},
      {{{"window", 64}, {"dilation", 2}}, "causal+bool", 2, 2, 0.0},
  };
  uint64_t seed = 500;
  for (const Setting& s : settings) {
    Problem p = make_test_problem("sliding_window", 2, s.heads, 520, 520, 16, s.mask, s.params);
    p.kv_heads = s.kv_heads;
    AttentionCase c(p, ++seed);
    c.p.dropout = s.dropout, c.p.seed = 9;
    if (c.p.mask.key_padding)
      c.pad_keys([](int64_t b, int64_t j) { return b == 1 && (j % 7 == 0 || j > 480); });
    if (c.p.mask.boolean) c.random_mask(++seed, 0.8, {3});
    require_gradients_match(c, ++seed);
  }
}

TEST_CASE("sliding_window backward: keys nothing attends and rows that attend nothing get exact zeros",
          "[sliding_window]") {
  // Key 7 (a band key) and key 20 (a global key) are masked out of every row, key 11 and the global key 0
  // are padded in batch 1, and rows 3 (band) and 0 (global) attend nothing: their gradients are exactly 0,
  // not merely small.
  const int64_t n = 40, D = 8;
  const Json params = {{"window", 2}, {"dilation", 2}, {"global_tokens", Json::array({0, 20})}};
  AttentionCase c(make_test_problem("sliding_window", 2, 2, n, n, D, "bool+pad", params), 71);
  c.random_mask(5, 1.0, {0, 3});
  for (int64_t i = 0; i < n; ++i) c.mask.data[i * n + 7] = c.mask.data[i * n + 20] = 0;
  c.pad_keys([](int64_t b, int64_t j) { return b == 1 && (j == 11 || j == 0); });
  const Grads g = train(c, normal_tensor(c.q.shape, 72));
  auto row_is_zero = [&](const FloatArray& x, int64_t bh, int64_t i) {
    for (int64_t d = 0; d < D; ++d)
      if (x.data[(bh * n + i) * D + d] != 0.0f) return false;
    return true;
  };
  for (int64_t bh = 0; bh < 4; ++bh) {
    INFO("batch " << bh / 2 << " head " << bh % 2);
    for (int64_t j : {7, 20}) CHECK((row_is_zero(g.dk, bh, j) && row_is_zero(g.dv, bh, j)));
    if (bh >= 2)
      for (int64_t j : {11, 0}) CHECK((row_is_zero(g.dk, bh, j) && row_is_zero(g.dv, bh, j)));
    for (int64_t i : {0, 3}) CHECK(row_is_zero(g.dq, bh, i));
    CHECK_FALSE(row_is_zero(g.dk, bh, 8));  // a key that rows do attend
  }
}

TEST_CASE("sliding_window backward memory is linear in n", "[sliding_window]") {
  // Per-thread scratch O(tile·(w+g)) plus one float per query row (delta): never seq x seq.
  const Attention& v = Registry::instance().get("sliding_window");
  Problem p = make_problem("sliding_window", {{"window", 256}, {"global_tokens", 4}});
  p.batch = 1, p.heads = 8, p.head_dim = 64;
  p.seq_q = p.seq_kv = 4096;
  const std::size_t small = v.backward_workspace_bytes(p, 2);
  p.seq_q = p.seq_kv = 32768;
  const std::size_t large = v.backward_workspace_bytes(p, 2);
  CHECK(large < 10 * small);
  CHECK(large < 32768u * 32768u);
}

namespace {

// The StreamingLLM pattern on a causal sequence of n positions: the first `sinks` positions and the band
// j = i - m*dilation, m = 0 .. w (definition_mask with the leading positions global).
std::vector<uint8_t> streaming_mask(int64_t n, int64_t w, int64_t dilation, int64_t sinks) {
  std::vector<int64_t> globals;
  for (int64_t g = 0; g < std::min(sinks, n); ++g) globals.push_back(g);
  return definition_mask(n, w, dilation, globals, true);
}

}  // namespace

TEST_CASE("sliding_window decode: a rolling cache of sinks + window equals full attention of the pattern",
          "[sliding_window]") {
  struct Setting {
    int64_t window, dilation, sinks;
  };
  const Setting settings[] = {{8, 1, 4}, {5, 2, 1}, {16, 1, 0}, {3, 3, 2}};
  const int64_t n = 150, d = 16, heads = 2;
  for (const Setting& s : settings) {
    const Json params = {{"window", s.window}, {"dilation", s.dilation}, {"global_tokens", s.sinks}};
    // The whole sequence at once (causal self-attention under the window + sinks pattern), and its fp64
    // reference under the mask written from the definition.
    AttentionCase c = window_case(params, 1, heads, n, d, true, false, 300 + s.window);
    const FloatArray full = c.run();
    const std::vector<uint8_t> mask = streaming_mask(n, s.window, s.dilation, s.sinks);
    Problem masked = c.p;
    masked.mask.boolean = true;
    require_matches_reference(c, masked, full, mask.data());
    // Token by token through one rolling cache per head: its memory is fixed when it is made.
    FloatArray rolled({1, heads, n, d});
    const float scale = static_cast<float>(c.p.effective_scale());
    for (int64_t h = 0; h < heads; ++h) {
      sliding_window::RollingKvCache cache(s.sinks, s.window, s.dilation, d);
      const std::size_t bytes = cache.bytes();
      CHECK(cache.capacity() == s.sinks + s.window * s.dilation + 1);
      for (int64_t t = 0; t < n; ++t) {
        cache.append(&c.k_at(h, t, 0), &c.v_at(h, t, 0));
        cache.attend(&c.q_at(h, t, 0), scale, rolled.ptr() + (h * n + t) * d);
        REQUIRE(cache.bytes() == bytes);
      }
    }
    INFO(c.p.repro());
    // Both within the derived fp32 bound of the same fp64 oracle (hence within twice it of each other).
    require_matches_reference(c, masked, rolled, mask.data());
    CHECK(max_abs_diff(rolled, full) <=
          2 * exact_abs_tolerance(masked, c.inputs(nullptr, &masked, mask.data())));
    // The variant's decode (seq_q = 1 at every context length t + 1, causal_lower_right, the whole K/V given)
    // reads the rows the cache holds through the same kernel in the same order: bitwise the cache's output.
    for (int64_t t : {int64_t{0}, s.sinks, int64_t{37}, n - 1}) {
      AttentionCase step(
          make_test_problem("sliding_window", 1, heads, 1, t + 1, d, "causal_lower_right", params));
      for (int64_t h = 0; h < heads; ++h) {
        std::copy_n(&c.q_at(h, t, 0), d, &step.q_at(h, 0, 0));
        std::copy_n(&c.k_at(h, 0, 0), (t + 1) * d, &step.k_at(h, 0, 0));
        std::copy_n(&c.v_at(h, 0, 0), (t + 1) * d, &step.v_at(h, 0, 0));
      }
      const FloatArray got = step.run();
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < d; ++j) REQUIRE(got.data[h * d + j] == rolled.data[(h * n + t) * d + j]);
    }
  }
}

TEST_CASE("sliding_window decode shapes: reference, GQA, several queries, constant memory and work",
          "[sliding_window]") {
  const Json params = {{"window", 32}, {"dilation", 1}, {"global_tokens", 4}};
  for (int64_t seq_q : {1, 3}) {
    // 4 query heads on 2 K/V heads, a context of 500: against the variant's own fp64 definition (exact
    // softmax under the pattern at the queries' positions 500 - seq_q ..).
    Problem p = make_test_problem("sliding_window", 2, 4, seq_q, 500, 16, "causal_lower_right", params);
    p.kv_heads = 2;
    AttentionCase c(p, 77);
    const FloatArray got = c.run();
    const Attention& v = Registry::instance().get("sliding_window");
    DoubleArray want({p.batch, p.heads, p.seq_q, p.head_dim});
    v.reference_forward(p, c.inputs(nullptr), want.ptr());
    INFO(p.repro());
    CHECK(max_abs_diff(got, want) <= v.abs_tolerance(p, c.inputs(nullptr)));
    // Equal to the last rows of the full-context computation (self-attention over all 500 positions).
    AttentionCase whole(make_test_problem("sliding_window", 2, 4, 500, 500, 16, "causal", params));
    whole.p.kv_heads = 2;
    whole.k = c.k, whole.v = c.v;
    whole.q = FloatArray({2, 4, 500, 16});
    for (int64_t bh = 0; bh < 8; ++bh)
      std::copy_n(c.q.ptr() + bh * seq_q * 16, seq_q * 16, whole.q.ptr() + (bh * 500 + 500 - seq_q) * 16);
    const FloatArray all = whole.run();
    double worst = 0;
    for (int64_t bh = 0; bh < 8; ++bh)
      for (int64_t e = 0; e < seq_q * 16; ++e)
        worst = std::max(worst, std::fabs(double(got.data[bh * seq_q * 16 + e]) -
                                          all.data[(bh * 500 + 500 - seq_q) * 16 + e]));
    CHECK(worst <= 2 * v.abs_tolerance(p, c.inputs(nullptr)));
  }
  // What a decode keeps and does is constant in the context: the rolling cache (4 sinks + 33 window rows,
  // K and V, fp32), the FLOPs and the workspace, while exact attention's KV cache grows.
  const Attention& v = Registry::instance().get("sliding_window");
  Problem a = make_test_problem("sliding_window", 1, 8, 1, 1024, 64, "causal_lower_right", params);
  Problem b = a;
  b.seq_kv = 32768;
  CHECK(v.decode_state_bytes(a) == 8u * (4 + 33) * 2 * 64 * sizeof(float));
  CHECK(v.decode_state_bytes(b) == v.decode_state_bytes(a));
  CHECK(v.flops(a) == v.flops(b));
  CHECK(v.workspace_bytes(a, 2) == v.workspace_bytes(b, 2));
  CHECK(kv_cache_bytes(b) == 32 * kv_cache_bytes(a));
  // Masks, dropout and the backward are not part of the rolling-cache decode: refused with the reason.
  b.dropout = 0.1;
  CHECK_THAT(v.unsupported_reasons_text(b), Catch::Contains("no dropout"));
  b.dropout = 0;
  CHECK_THAT(v.backward_unsupported_reasons_text(b), Catch::Contains("no backward for a decode problem"));
}

// ---- Learned sink logits and logit soft-capping ----

namespace {

// One training step (run_saving, then run_backward with `d_out`) of c.p on c's inputs with the sink logits
// `sinks` ([heads]; empty: none): O, dQ, dK, dV and, with sinks, d sink logits. Every output starts as NaN,
// so an element left unwritten shows up.
struct Step {
  FloatArray out, dq, dk, dv, d_sink;
};
Step train_with_sinks(const AttentionCase& c, const std::vector<float>& sinks, const FloatArray& d_out) {
  const Attention& v = Registry::instance().get(c.p.variant);
  const float nan = std::nanf("");
  Step s{FloatArray(c.q.shape, nan), FloatArray(c.q.shape, nan), FloatArray(c.k.shape, nan),
         FloatArray(c.v.shape, nan), FloatArray({c.p.heads}, nan)};
  AttentionInputs in = c.inputs(s.out.ptr());
  in.sink_logits = sinks.empty() ? nullptr : sinks.data();
  std::vector<float> saved(v.saved_floats(c.p), nan);
  v.run_saving(c.p, in, saved.data());
  GradientArgs g;
  g.out = s.out.ptr(), g.saved = saved.data(), g.d_out = d_out.ptr();
  g.dq = s.dq.ptr(), g.dk = s.dk.ptr(), g.dv = s.dv.ptr();
  g.d_sink_logits = sinks.empty() ? nullptr : s.d_sink.ptr();
  v.run_backward(c.p, in, g);
  return s;
}

// The forward alone (Attention::run) of `p` on c's inputs with sink logits `sinks` (empty: none).
FloatArray run_with_sinks(const AttentionCase& c, const Problem& p, const std::vector<float>& sinks) {
  FloatArray out({p.batch, p.heads, p.seq_q, p.head_dim}, std::nanf(""));
  AttentionInputs in = c.inputs(out.ptr(), &p);
  in.sink_logits = sinks.empty() ? nullptr : sinks.data();
  Registry::instance().get(p.variant).run(p, in);
  return out;
}

std::vector<float> sink_logits(int64_t heads, uint64_t seed) {
  std::vector<float> s(static_cast<std::size_t>(heads));
  fill_normal(s.data(), heads, seed, 2.0);  // std 2 against logits of std ~4: some sinks dominate, some not
  return s;
}

}  // namespace

TEST_CASE("sliding_window sink logits and soft-capping: forward, backward and d sink logits against fp64",
          "[sliding_window]") {
  // The fp64 oracle is exact softmax attention (sinks and cap included) under the mask written from the
  // definition (definition_mask), not the variant's own pattern code or its MaskedProblem; the bounds are the
  // derived fp32 ones of that masked problem (exact_abs_tolerance, exact_grad_tolerance). Logits of std ~4
  // against C = 5, so the cap bends them and its derivative 1 - tanh^2 is far from 1.
  struct Setting {
    int64_t window, dilation;
    std::vector<int64_t> globals;
    const char* mask;
    int64_t heads, kv_heads, n;
  };
  const Setting settings[] = {
      // Dilated band, a listed global at a class's start and one inside it, grouped-query heads, padding
      // (batch 1 pads key 0, a global), 16-row tiles with tails in both residue classes (34 and 33 rows).
      {5, 2, {0, 9}, "causal+pad", 4, 2, 67},
      // Non-causal, dilation 3, a boolean mask with a fully masked band row (5) and global row (0): their
      // output and dQ rows are exactly zero and add nothing to d sink (naive's convention).
      {3, 3, {0, 1}, "bool", 2, 0, 50},
      // 20 global rows and keys (two 16-wide global tasks; global key columns over two 256-row query steps).
      {8, 1, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, "causal", 2, 1, 300},
  };
  uint64_t seed = 900;
  for (const Setting& s : settings)
    for (const char* mode : {"sinks", "softcap", "sinks+softcap"}) {
      const Json params = {{"window", s.window}, {"dilation", s.dilation}, {"global_tokens", s.globals}};
      Problem p = make_test_problem("sliding_window", 2, s.heads, s.n, s.n, 16, s.mask, params);
      p.kv_heads = s.kv_heads;
      const bool sinks_on = std::string(mode).find("sinks") != std::string::npos;
      if (std::string(mode).find("softcap") != std::string::npos) p.softcap = 5.0;
      p.sinks = sinks_on;
      AttentionCase c(p, ++seed, 2.0);
      if (c.p.mask.key_padding)
        c.pad_keys([&](int64_t b, int64_t j) { return b == 1 && (j % 5 == 0 || j > 60); });
      if (c.p.mask.boolean) c.random_mask(++seed, 0.8, {0, 5});
      const std::vector<float> sinks = sinks_on ? sink_logits(s.heads, ++seed) : std::vector<float>{};
      const FloatArray d_out = normal_tensor(c.q.shape, ++seed);
      const Step got = train_with_sinks(c, sinks, d_out);
      INFO(c.p.repro());

      // The oracle's problem: the definition's pattern (and the user's mask) as one boolean mask.
      std::vector<uint8_t> mask = definition_mask(s.n, s.window, s.dilation, s.globals, c.p.mask.causal);
      if (c.p.mask.boolean)
        for (std::size_t e = 0; e < mask.size(); ++e) mask[e] = mask[e] && c.mask.data[e];
      Problem masked = c.p;
      masked.mask.boolean = true;
      AttentionInputs in = c.inputs(nullptr, &masked, mask.data());
      in.sink_logits = sinks.empty() ? nullptr : sinks.data();

      DoubleArray want(c.q.shape);
      reference_attention(masked, in, want.ptr());
      const double tol = exact_abs_tolerance(masked, in);
      INFO("forward bound " << tol);
      CHECK(max_abs_diff(got.out, want) <= tol);
      // Not vacuous: without the sinks and the cap the output is another one.
      Problem plain = c.p;
      plain.sinks = false, plain.softcap.reset();
      CHECK(max_abs_diff(run_with_sinks(c, plain, {}), want) > 100 * tol);
      // The inference forward is the training forward's computation, bitwise.
      const FloatArray inferred = run_with_sinks(c, c.p, sinks);
      CHECK(std::memcmp(inferred.ptr(), got.out.ptr(), got.out.numel() * sizeof(float)) == 0);

      DoubleArray dq(c.q.shape), dk(c.k.shape), dv(c.v.shape);
      std::vector<double> d_sink(static_cast<std::size_t>(s.heads));
      reference_attention_backward(masked, in, d_out.ptr(), dq.ptr(), dk.ptr(), dv.ptr(), nullptr,
                                   sinks_on ? d_sink.data() : nullptr);
      const GradientTolerance gt = exact_grad_tolerance(masked, in, d_out.ptr());
      INFO("bounds dq " << gt.dq << ", dk " << gt.dk << ", dv " << gt.dv << ", d sink " << gt.d_sink_logits);
      CHECK(max_abs_diff(got.dq, dq) <= gt.dq);
      CHECK(max_abs_diff(got.dk, dk) <= gt.dk);
      CHECK(max_abs_diff(got.dv, dv) <= gt.dv);
      if (sinks_on)
        for (int64_t h = 0; h < s.heads; ++h) {
          INFO("head " << h << ": d sink " << got.d_sink.data[h] << ", fp64 " << d_sink[h]);
          CHECK(std::fabs(got.d_sink.data[h] - d_sink[h]) <= gt.d_sink_logits);
        }

      if (c.p.mask.boolean)  // rows 0 and 5 attend nothing: exact zeros, sink or not
        for (int64_t bh = 0; bh < c.p.batch * c.p.heads; ++bh)
          for (int64_t i : {0, 5})
            for (int64_t d = 0; d < 16; ++d) {
              const std::size_t e = static_cast<std::size_t>((bh * s.n + i) * 16 + d);
              CHECK((got.out.data[e] == 0.0f && got.dq.data[e] == 0.0f));
            }
    }
}

TEST_CASE(
    "sliding_window decode with sink logits and soft-capping: the rolling cache equals the full sequence",
    "[sliding_window]") {
  // StreamingLLM with both kinds of sink: 4 sink positions (global_tokens) and a learned sink logit per query
  // head, soft-capped logits, 4 query heads on 2 K/V heads, the last 3 positions of a 200-token context.
  const Json params = {{"window", 8}, {"dilation", 2}, {"global_tokens", 4}};
  const int64_t B = 2, H = 4, Hkv = 2, n = 200, nq = 3, D = 16;
  const Attention& v = Registry::instance().get("sliding_window");
  Problem whole_p = make_test_problem("sliding_window", B, H, n, n, D, "causal", params);
  whole_p.kv_heads = Hkv, whole_p.softcap = 5.0, whole_p.sinks = true;
  AttentionCase whole(whole_p, 950, 2.0);
  const std::vector<float> sinks = sink_logits(H, 951);
  const FloatArray all = run_with_sinks(whole, whole.p, sinks);

  Problem p = make_test_problem("sliding_window", B, H, nq, n, D, "causal_lower_right", params);
  p.kv_heads = Hkv, p.softcap = 5.0, p.sinks = true;
  AttentionCase step(p);
  step.k = whole.k, step.v = whole.v;
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < nq; ++i) std::copy_n(&whole.q_at(bh, n - nq + i, 0), D, &step.q_at(bh, i, 0));
  const FloatArray got = run_with_sinks(step, p, sinks);
  AttentionInputs in = step.inputs(nullptr);
  in.sink_logits = sinks.data();
  DoubleArray want(step.q.shape);
  v.reference_forward(p, in, want.ptr());
  const double tol = v.abs_tolerance(p, in);
  INFO(p.repro() << ": bound " << tol);
  CHECK(max_abs_diff(got, want) <= tol);
  // The full sequence's last rows: both within the bound of the same fp64 values, so within twice it.
  double worst = 0;
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t d = 0; d < D; ++d)
        worst = std::max(worst, std::fabs(double(got.data[(bh * nq + i) * D + d]) -
                                          all.data[(bh * n + n - nq + i) * D + d]));
  CHECK(worst <= 2 * tol);

  // Token by token through one rolling cache per (batch, K/V head): the variant's decode reads the same
  // entries through the same kernel in the same order, so its rows are bitwise the cache's.
  const float scale = static_cast<float>(p.effective_scale());
  std::vector<float> row(static_cast<std::size_t>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
      sliding_window::RollingKvCache cache(4, 8, 2, D);
      for (int64_t t = 0; t < n; ++t) {
        cache.append(&whole.k_at(b * Hkv + kvh, t, 0), &whole.v_at(b * Hkv + kvh, t, 0));
        if (t < n - nq) continue;
        for (int64_t h = kvh * (H / Hkv); h < (kvh + 1) * (H / Hkv); ++h) {
          const sliding_window::RowLogits logits{5.0f, &sinks[static_cast<std::size_t>(h)]};
          cache.attend(&whole.q_at(b * H + h, t, 0), scale, row.data(), logits);
          const float* dec = got.ptr() + ((b * H + h) * nq + t - (n - nq)) * D;
          INFO("batch " << b << " head " << h << " position " << t);
          CHECK(std::memcmp(row.data(), dec, D * sizeof(float)) == 0);
        }
      }
    }
}
