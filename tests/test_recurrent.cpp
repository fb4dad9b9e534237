// The gated / delta-rule recurrences (variants/recurrent, common/kernels/recurrence.*): both forms against an
// independent fp64 recurrence written here, uneven last chunks, grouped-query heads, gates down to -30 and
// at 0, beta near 0 and at 1, state carry-over, gradients (dg, dbeta, d_initial_state included) and hostile
// inputs; with V as wide as Q and K (d_k = d_v) and of another width (Problem::v_head_dim, d_k != d_v both
// ways: a d_k x d_v state, d_v-wide outputs).
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "bench/lib/config.hpp"
#include "bench/lib/decode_state.hpp"
#include "bench/lib/inputs.hpp"
#include "bench/lib/plan.hpp"
#include "bench/lib/runner.hpp"
#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/kernels/recurrence.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"
#include "common/support/tensor.hpp"

using namespace attn;

namespace {

const char* const kVariants[] = {"retention", "simple_gla", "gla", "delta_rule", "gated_delta_rule", "kda"};

bool is_delta(const std::string& v) {
  return v == "delta_rule" || v == "gated_delta_rule" || v == "kda";
}

// One problem with its tensors: g = logsigmoid(N(0, 1)), beta = sigmoid(N(0, 1)) unless changed. d: d_k
// (Q, K, a vector gate); dv: d_v (V, the output; 0: d).
struct RecCase {
  const Attention& variant;
  Problem p;
  FloatArray q, k, v, g, beta, s0, out, fin;

  RecCase(const std::string& name, const Json& params, int64_t batch, int64_t heads, int64_t kv_heads,
          int64_t n, int64_t d, uint64_t seed, int64_t dv = 0)
      : variant(Registry::instance().get(name)), p(make_problem(name, params)) {
    p.batch = batch, p.heads = heads, p.kv_heads = kv_heads, p.seq_q = p.seq_kv = n, p.head_dim = d;
    p.v_head_dim = dv;
    p.mask.causal = true;
    dv = p.value_dim();
    q = FloatArray({batch, heads, n, d});
    k = FloatArray({batch, p.num_kv_heads(), n, d});
    v = FloatArray({batch, p.num_kv_heads(), n, dv});
    fill_normal(q.ptr(), static_cast<int64_t>(q.numel()), seed);
    fill_normal(k.ptr(), static_cast<int64_t>(k.numel()), seed + 1);
    fill_normal(v.ptr(), static_cast<int64_t>(v.numel()), seed + 2);
    const Gate gate = variant.capabilities().gate;
    if (gate != Gate::none) {
      g = gate == Gate::vector ? FloatArray({batch, heads, n, d}) : FloatArray({batch, heads, n});
      fill_normal(g.ptr(), static_cast<int64_t>(g.numel()), seed + 3);
      for (float& x : g.data) x = static_cast<float>(-std::log1p(std::exp(-double(x))));
    }
    if (variant.capabilities().beta) {
      beta = FloatArray({batch, heads, n});
      fill_normal(beta.ptr(), static_cast<int64_t>(beta.numel()), seed + 4);
      for (float& x : beta.data) x = static_cast<float>(1 / (1 + std::exp(-double(x))));
    }
    out = FloatArray({batch, heads, n, dv}, std::nanf(""));
    fin = FloatArray({batch, heads, d, dv}, std::nanf(""));
  }
  void with_initial_state(uint64_t seed) {
    s0 = FloatArray({p.batch, p.heads, p.head_dim, p.value_dim()});
    fill_normal(s0.ptr(), static_cast<int64_t>(s0.numel()), seed, 0.5);
    p.initial_state = true;
  }
  AttentionInputs inputs() {
    AttentionInputs in;
    in.q = q.ptr(), in.k = k.ptr(), in.v = v.ptr(), in.out = out.ptr(), in.final_state = fin.ptr();
    in.g = g.numel() ? g.ptr() : nullptr;
    in.beta = beta.numel() ? beta.ptr() : nullptr;
    in.initial_state = s0.numel() ? s0.ptr() : nullptr;
    return in;
  }
  void run() { variant.run(p, inputs()); }
};

// The definitions of issue 32, written out independently of common/kernels/recurrence.*: out and the final
// state. S is d_k x d_v: row i (key channel i) decays with g's channel i, column j is value column j.
struct Naive {
  std::vector<double> out, fin;
};
Naive naive(const RecCase& c) {
  const Problem& p = c.p;
  const std::string name = p.variant;
  const int64_t n = p.seq_q, dk = p.head_dim, dv = p.value_dim(), dd = dk * dv;
  const bool normalize = is_delta(name) && p.param_int("normalize_keys") != 0;
  Naive r{std::vector<double>(c.out.numel()), std::vector<double>(c.fin.numel())};
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t bh = b * p.heads + h, kv = b * p.num_kv_heads() + h / (p.heads / p.num_kv_heads());
      std::vector<double> S(dd, 0.0), kt(dk), pred(dv), decay(dk);
      if (p.initial_state)
        for (int64_t e = 0; e < dd; ++e) S[e] = c.s0.data[bh * dd + e];
      for (int64_t t = 0; t < n; ++t) {
        double norm = 0;
        for (int64_t i = 0; i < dk; ++i) kt[i] = c.k.data[(kv * n + t) * dk + i], norm += kt[i] * kt[i];
        if (normalize)
          for (double& x : kt) x /= std::sqrt(norm);
        for (int64_t i = 0; i < dk; ++i) {
          if (name == "retention") decay[i] = 1 - std::pow(2.0, -5.0 - double(h));
          if (name == "simple_gla" || name == "gated_delta_rule")
            decay[i] = std::exp(double(c.g.data[bh * n + t]));
          if (name == "gla" || name == "kda") decay[i] = std::exp(double(c.g.data[(bh * n + t) * dk + i]));
          if (name == "delta_rule") decay[i] = 1;
        }
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) S[i * dv + j] *= decay[i];
        const float* vt = c.v.ptr() + (kv * n + t) * dv;
        const double beta = is_delta(name) ? double(c.beta.data[bh * n + t]) : 1.0;
        for (int64_t j = 0; j < dv; ++j) {
          pred[j] = 0;
          if (is_delta(name))
            for (int64_t i = 0; i < dk; ++i) pred[j] += kt[i] * S[i * dv + j];
        }
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += beta * kt[i] * (vt[j] - pred[j]);
        for (int64_t j = 0; j < dv; ++j) {
          double o = 0;
          for (int64_t i = 0; i < dk; ++i) o += double(c.q.data[(bh * n + t) * dk + i]) * S[i * dv + j];
          r.out[(bh * n + t) * dv + j] = p.effective_scale() * o;
        }
      }
      for (int64_t e = 0; e < dd; ++e) r.fin[bh * dd + e] = S[e];
    }
  return r;
}

double rel_l2(const float* got, const double* want, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t e = 0; e < n; ++e) {
    if (!std::isfinite(got[e])) return INFINITY;
    num += (got[e] - want[e]) * (got[e] - want[e]), den += want[e] * want[e];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}
double max_abs(const float* got, const double* want, std::size_t n) {
  double m = 0;
  for (std::size_t e = 0; e < n; ++e)
    m = std::max(m, std::isfinite(got[e]) ? std::fabs(got[e] - want[e]) : INFINITY);
  return m;
}

// Runs `c` and holds out and the final state against the independent recurrence.
void expect_matches(RecCase& c, double rel = 1e-5) {
  c.run();
  const Naive want = naive(c);
  INFO(c.p.repro());
  CHECK(rel_l2(c.out.ptr(), want.out.data(), c.out.numel()) <= rel);
  CHECK(rel_l2(c.fin.ptr(), want.fin.data(), c.fin.numel()) <= rel);
  CHECK(max_abs(c.out.ptr(), want.out.data(), c.out.numel()) <= c.variant.abs_tolerance(c.p, c.inputs()));
}

// The default chunk (32), 64 (flash-linear-attention's) and 16, and the recurrent form.
const Json kForms[] = {{{"form", "chunk"}},
                       {{"form", "chunk"}, {"chunk", 64}},
                       {{"form", "chunk"}, {"chunk", 16}},
                       {{"form", "recurrent"}}};

}  // namespace

TEST_CASE("recurrences: both forms match an independent fp64 recurrence, uneven last chunk, GQA",
          "[recurrent]") {
  for (const char* name : kVariants)
    for (const Json& form : kForms) {
      RecCase c(name, form, 2, 4, 2, 300, 24, 11);  // 300 = 9 * 32 + 12 = 4 * 64 + 44: uneven last chunks
      expect_matches(c);
    }
}

TEST_CASE("recurrences: n = 4096 chunk form and n = 1024 recurrent form within 1e-5 of the fp64 recurrence",
          "[recurrent]") {
  for (const char* name : kVariants) {
    RecCase c(name, Json::object(), 1, 1, 0, 4096, 32, 21);  // d 32: the fp64 loops stay fast
    expect_matches(c);
    RecCase r(name, {{"form", "recurrent"}}, 1, 2, 0, 1024, 64, 23);
    expect_matches(r);
  }
}

TEST_CASE("recurrences: kda with one gate value across its key channels equals gated_delta_rule",
          "[recurrent]") {
  // Same Q, K, V, beta (same seeds) and kda's g[b, h, t, c] = gated_delta_rule's g[b, h, t] for every c: the
  // same recurrence. Each output is within its variant's derived bound of the exact one, so the two within
  // the sum of the bounds (the forms compute in different orders: not bitwise).
  for (const Json& form : kForms) {
    RecCase scalar("gated_delta_rule", form, 1, 4, 2, 150, 24, 61), vec("kda", form, 1, 4, 2, 150, 24, 61);
    const int64_t d = vec.p.head_dim;
    for (std::size_t e = 0; e < vec.g.numel(); ++e)
      vec.g.data[e] = scalar.g.data[e / static_cast<std::size_t>(d)];
    REQUIRE(vec.beta.data == scalar.beta.data);
    scalar.run();
    vec.run();
    const double bound = scalar.variant.abs_tolerance(scalar.p, scalar.inputs()) +
                         vec.variant.abs_tolerance(vec.p, vec.inputs());
    INFO(vec.p.repro() << ": bound " << bound);
    double worst = 0;
    for (std::size_t e = 0; e < vec.out.numel(); ++e)
      worst = std::max(worst, double(std::fabs(vec.out.data[e] - scalar.out.data[e])));
    CHECK(worst <= bound);
    CHECK(worst < 1e-4);  // and close in absolute terms (outputs of order 1)
  }
}

TEST_CASE("recurrences: chunk sizes 1, 7 and larger than the sequence, initial state in and final state out",
          "[recurrent]") {
  for (const char* name : kVariants)
    for (int64_t chunk : {1, 7, 512}) {
      RecCase c(name, {{"chunk", chunk}}, 1, 2, 0, 100, 16, 31);
      c.with_initial_state(77);
      expect_matches(c);
    }
}

namespace {
// (d_k, d_v) with d_k != d_v both ways: d_v wider and narrower than d_k, widths not a multiple of the SIMD
// vector (d_v 24 and 40 leave 8 columns to the element-by-element tails on AVX-512's 16 lanes; d_k 20 leaves
// 4 on AVX-512 and AVX2), and a d_v of 8, narrower than an AVX-512 vector (every value column in the tails).
const std::pair<int64_t, int64_t> kWidths[] = {{16, 24}, {32, 8}, {20, 40}};
}  // namespace

TEST_CASE("recurrences: d_k != d_v, both forms match the fp64 recurrence, uneven last chunk, GQA",
          "[recurrent]") {
  for (const auto& [dk, dv] : kWidths)
    for (const char* name : kVariants)
      for (const Json& form : kForms) {
        RecCase c(name, form, 2, 4, 2, 100, dk, 11, dv);  // 100 = 3 x 32 + 4 = 64 + 36 = 6 x 16 + 4
        REQUIRE(c.p.repro().find(",Dv=" + std::to_string(dv)) != std::string::npos);
        expect_matches(c);
      }
}

TEST_CASE("recurrences: d_k != d_v, a d_k x d_v initial state in and final state out, chunks 1, 7, 512",
          "[recurrent]") {
  for (const auto& [dk, dv] : kWidths)
    for (const char* name : kVariants)
      for (const Json& form : {Json{{"chunk", 1}}, Json{{"chunk", 7}}, Json{{"chunk", 512}},
                               Json{{"form", "recurrent"}, {"chunk", 7}}}) {
        RecCase c(name, form, 1, 2, 0, 60, dk, 31, dv);
        c.with_initial_state(77);
        REQUIRE(c.s0.numel() == static_cast<std::size_t>(2 * dk * dv));
        expect_matches(c);
      }
}

TEST_CASE("recurrences: gates at -30 and at 0, beta near 0 and at 1", "[recurrent]") {
  for (const char* name : {"simple_gla", "gla", "gated_delta_rule", "delta_rule", "kda"})
    for (const Json& form : kForms) {
      RecCase c(name, form, 1, 2, 0, 200, 16, 41);
      // The first 64 tokens at g = -30 (cumulative -1920 over a chunk of 64, -960 over the default 32), then
      // g = -30, 0 and random by turns.
      const std::size_t per_token = c.g.numel() / 400;
      for (std::size_t e = 0; e < c.g.numel(); ++e) {
        const std::size_t t = (e / std::max<std::size_t>(per_token, 1)) % 200;
        if (t < 64 || t % 3 == 0) c.g.data[e] = -30.0f;
        if (t >= 64 && t % 3 == 1) c.g.data[e] = 0.0f;
      }
      for (std::size_t e = 0; e < c.beta.numel(); ++e)
        c.beta.data[e] = e % 3 == 0 ? 1e-6f : e % 3 == 1 ? 1.0f : c.beta.data[e];
      expect_matches(c);
      for (float x : c.out.data) REQUIRE(std::isfinite(x));
    }
}

TEST_CASE("recurrences: two calls carrying the final state equal one call (d_k = d_v and d_k != d_v)",
          "[recurrent]") {
  // (d_k, d_v): equal, then a d_k x d_v state with d_v wider (20: not a multiple of any SIMD width) and
  // narrower than d_k.
  for (const auto& widths : {std::pair<int64_t, int64_t>{16, 16}, {12, 20}, {24, 8}})
    for (const char* name : kVariants)
      for (const Json& form : kForms) {
        const int64_t d = widths.first, dv = widths.second;  // named, not bound: lambdas capture them
        const int64_t n = 200, first = 77;                   // 77: mid-chunk for every chunk size
        RecCase whole(name, form, 1, 2, 0, n, d, 51, dv);
        whole.run();
        auto part = [&](int64_t t0, int64_t len, const FloatArray* state) {
          RecCase c(name, form, 1, 2, 0, len, d, 51, dv);
          auto slice = [&](const FloatArray& src, FloatArray& dst, int64_t w) {
            for (int64_t bh = 0; bh < 2; ++bh)
              std::copy_n(src.ptr() + (bh * n + t0) * w, len * w, dst.ptr() + bh * len * w);
          };
          slice(whole.q, c.q, d), slice(whole.k, c.k, d), slice(whole.v, c.v, dv);
          if (whole.g.numel()) slice(whole.g, c.g, whole.g.numel() / (2 * n));
          if (whole.beta.numel()) slice(whole.beta, c.beta, 1);
          if (state) c.s0 = *state, c.p.initial_state = true;
          c.run();
          return c;
        };
        const RecCase a = part(0, first, nullptr);
        const RecCase b = part(first, n - first, &a.fin);
        std::vector<double> joined(whole.out.numel());
        for (int64_t bh = 0; bh < 2; ++bh)
          for (int64_t t = 0; t < n; ++t)
            for (int64_t j = 0; j < dv; ++j)
              joined[(bh * n + t) * dv + j] = t < first ? a.out.data[(bh * first + t) * dv + j]
                                                        : b.out.data[(bh * (n - first) + t - first) * dv + j];
        INFO(whole.p.repro() + " " + form.dump());
        CHECK(rel_l2(whole.out.ptr(), joined.data(), joined.size()) <= 1e-5);
        std::vector<double> bfin(b.fin.data.begin(), b.fin.data.end());
        CHECK(rel_l2(whole.fin.ptr(), bfin.data(), bfin.size()) <= 1e-5);
      }
}

namespace {

// One training step of `c` (forward keeping nothing, then the backward with every gradient asked for).
struct Trained {
  FloatArray dq, dk, dv, dg, dbeta, ds0;
};
Trained train(RecCase& c, const FloatArray& d_out) {
  Trained t{FloatArray(c.q.shape), FloatArray(c.k.shape),    FloatArray(c.v.shape),
            FloatArray(c.g.shape), FloatArray(c.beta.shape), FloatArray(c.s0.shape)};
  c.variant.run_saving(c.p, c.inputs(), nullptr);
  GradientArgs g;
  g.out = c.out.ptr(), g.d_out = d_out.ptr();
  g.dq = t.dq.ptr(), g.dk = t.dk.ptr(), g.dv = t.dv.ptr();
  g.dg = c.g.numel() ? t.dg.ptr() : nullptr;
  g.dbeta = c.beta.numel() ? t.dbeta.ptr() : nullptr;
  g.d_initial_state = c.s0.numel() ? t.ds0.ptr() : nullptr;
  c.variant.run_backward(c.p, c.inputs(), g);
  return t;
}

double loss(RecCase& c, const FloatArray& d_out) {
  const Naive r = naive(c);
  double l = 0;
  for (std::size_t e = 0; e < r.out.size(); ++e) l += r.out[e] * d_out.data[e];
  return l;
}

// Central difference of the independent definition along element e of x (x quantised to 2^-12 so x +- h,
// h = 2^-10, is exact in fp32), held against the fp64 gradient.
void expect_derivative(RecCase& c, FloatArray& x, std::size_t e, double grad, const FloatArray& d_out,
                       const char* what) {
  const float x0 = x.data[e];
  const float h = 1.0f / 1024;
  x.data[e] = x0 + h;
  const double lp = loss(c, d_out);
  x.data[e] = x0 - h;
  const double lm = loss(c, d_out);
  x.data[e] = x0;
  const double fd = (lp - lm) / (2 * h);
  INFO(std::string(what) + "[" + std::to_string(e) + "] " + c.p.repro() + ": fd " + std::to_string(fd) +
       " vs " + std::to_string(grad));
  CHECK(std::fabs(fd - grad) <= 1e-4 * std::max(1.0, std::fabs(grad)));
}

void quantise(FloatArray& x) {
  for (float& v : x.data) v = std::nearbyint(v * 4096.0f) / 4096.0f;
}

}  // namespace

TEST_CASE("recurrences: gradients (dq, dk, dv, dg, dbeta, d_initial_state) against fp64, both forms",
          "[recurrent]") {
  // (d_k, d_v): equal, then d_v wider (20: not a multiple of a vector) and narrower than d_k.
  for (const auto& [dk, dv] : {std::pair<int64_t, int64_t>{12, 12}, {12, 20}, {20, 8}})
    for (const char* name : kVariants)
      for (const Json& form :
           {Json{{"form", "chunk"}, {"chunk", 16}}, Json{{"form", "recurrent"}, {"chunk", 7}}}) {
        RecCase c(name, form, 1, 4, 2, 90, dk, 61, dv);
        c.with_initial_state(62);
        for (float& x : c.g.data) x = std::min(x, -1.0f / 256);  // keep g - h <= 0 for the differences
        quantise(c.q), quantise(c.k), quantise(c.v), quantise(c.g), quantise(c.beta), quantise(c.s0);
        for (float& x : c.beta.data) x = std::clamp(x, 1.0f / 256, 1.0f - 1.0f / 256);
        const FloatArray d_out = [&] {
          FloatArray d(c.out.shape);
          fill_normal(d.ptr(), static_cast<int64_t>(d.numel()), 63);
          return d;
        }();
        const Trained got = train(c, d_out);
        const AttentionInputs in = c.inputs();
        RecurrenceKind kind;
        kind.gate = c.variant.capabilities().gate;
        kind.retention = std::string(name) == "retention";
        kind.delta = is_delta(name);
        kind.normalize_keys = kind.delta;
        DoubleArray wq(c.q.shape), wk(c.k.shape), wv(c.v.shape), wg(c.g.shape), wb(c.beta.shape),
            ws(c.s0.shape);
        RecurrenceGrads<double> want{wq.ptr(),
                                     wk.ptr(),
                                     wv.ptr(),
                                     c.g.numel() ? wg.ptr() : nullptr,
                                     c.beta.numel() ? wb.ptr() : nullptr,
                                     ws.ptr()};
        recurrence_reference_backward(c.p, in, kind, d_out.ptr(), want);
        INFO(c.p.repro());
        CHECK(rel_l2(got.dq.ptr(), wq.ptr(), wq.numel()) <= 1e-5);
        CHECK(rel_l2(got.dk.ptr(), wk.ptr(), wk.numel()) <= 1e-5);
        CHECK(rel_l2(got.dv.ptr(), wv.ptr(), wv.numel()) <= 1e-5);
        CHECK(rel_l2(got.ds0.ptr(), ws.ptr(), ws.numel()) <= 1e-5);
        if (c.g.numel()) CHECK(rel_l2(got.dg.ptr(), wg.ptr(), wg.numel()) <= 1e-5);
        if (c.beta.numel()) CHECK(rel_l2(got.dbeta.ptr(), wb.ptr(), wb.numel()) <= 1e-5);
        // The fp64 gradients of the per-token inputs are derivatives of the independent definition.
        for (std::size_t e : {std::size_t{0}, std::size_t{37}, std::size_t{171}}) {
          if (c.g.numel()) expect_derivative(c, c.g, e % c.g.numel(), wg.data[e % c.g.numel()], d_out, "dg");
          if (c.beta.numel())
            expect_derivative(c, c.beta, e % c.beta.numel(), wb.data[e % c.beta.numel()], d_out, "dbeta");
          expect_derivative(c, c.s0, e % c.s0.numel(), ws.data[e % c.s0.numel()], d_out, "d_initial_state");
          // dq, dk (n x d_k rows) and dv (n x d_v rows, summed over the grouped-query heads): the shapes the
          // widths could mix up.
          expect_derivative(c, c.q, e % c.q.numel(), wq.data[e % c.q.numel()], d_out, "dq");
          expect_derivative(c, c.k, e % c.k.numel(), wk.data[e % c.k.numel()], d_out, "dk");
          expect_derivative(c, c.v, e % c.v.numel(), wv.data[e % c.v.numel()], d_out, "dv");
        }
      }
}

namespace {

// The fp64 gradients of c's definition (dg only where c has a gate).
Trained reference_grads(RecCase& c, const FloatArray& d_out) {
  Trained w{FloatArray(c.q.shape), FloatArray(c.k.shape),    FloatArray(c.v.shape),
            FloatArray(c.g.shape), FloatArray(c.beta.shape), FloatArray(c.s0.shape)};
  DoubleArray wq(c.q.shape), wk(c.k.shape), wv(c.v.shape), wg(c.g.shape), wb(c.beta.shape), ws(c.s0.shape);
  RecurrenceKind kind;
  kind.gate = c.variant.capabilities().gate;
  kind.retention = c.p.variant == "retention";
  kind.delta = kind.normalize_keys = is_delta(c.p.variant);
  recurrence_reference_backward(c.p, c.inputs(), kind, d_out.ptr(),
                                {wq.ptr(), wk.ptr(), wv.ptr(), c.g.numel() ? wg.ptr() : nullptr,
                                 c.beta.numel() ? wb.ptr() : nullptr, c.s0.numel() ? ws.ptr() : nullptr});
  auto narrow = [](const DoubleArray& a, FloatArray& b) {
    for (std::size_t e = 0; e < a.numel(); ++e) b.data[e] = static_cast<float>(a.data[e]);
  };
  narrow(wq, w.dq), narrow(wk, w.dk), narrow(wv, w.dv), narrow(wg, w.dg), narrow(wb, w.dbeta),
      narrow(ws, w.ds0);
  return w;
}

double rel_l2(const FloatArray& got, const FloatArray& want) {
  std::vector<double> w(want.data.begin(), want.data.end());
  return rel_l2(got.ptr(), w.data(), w.size());
}

// Every gradient of `c` (dq, dk, dv, d_initial_state, and dg, dbeta where it has g, beta) within 1e-5
// relative L2 of the fp64 definition's.
void expect_grads_close(const Trained& got, const Trained& want, const RecCase& c) {
  CHECK(rel_l2(got.dq, want.dq) <= 1e-5);
  CHECK(rel_l2(got.dk, want.dk) <= 1e-5);
  CHECK(rel_l2(got.dv, want.dv) <= 1e-5);
  CHECK(rel_l2(got.ds0, want.ds0) <= 1e-5);
  if (c.g.numel()) CHECK(rel_l2(got.dg, want.dg) <= 1e-5);
  if (c.beta.numel()) CHECK(rel_l2(got.dbeta, want.dbeta) <= 1e-5);
}

}  // namespace

// The chunk form's own backward at a longer sequence than the test above, with uneven last chunks,
// grouped-query heads, d not a multiple of the vector, gates at -30 (cumulative -1920 over a chunk of 64)
// and at 0 besides logsigmoid(N(0, 1)), beta near 0 and at 1: every gradient finite and within 1e-5 relative
// (L2) of the fp64 definition's, and within the derived bound element by element.
TEST_CASE("recurrences: the chunkwise backward at n = 1000 against fp64, gates down to -30", "[recurrent]") {
  // mild: g / 50, so a chunk's decay stays near 1 and the state's terms weigh in dg (with logsigmoid(N(0, 1))
  // alone, e^Gamma_C is ~e^-20 over a chunk of 32). d_k = 20; d_v = 20, then 40 and 8 (d_k != d_v both ways).
  struct Config {
    int chunk;
    bool mild;
    int64_t dv;
  };
  for (const char* name : kVariants)
    for (const auto& [chunk, mild, dv] : {Config{16, false, 20}, Config{32, true, 20}, Config{64, false, 20},
                                          Config{64, true, 20}, Config{32, false, 40}, Config{16, true, 8}}) {
      RecCase c(name, {{"form", "chunk"}, {"chunk", chunk}}, 1, 4, 2, 1000, 20, 71 + chunk, dv);
      c.with_initial_state(72);
      for (std::size_t e = 0; e < c.g.numel(); ++e) {
        const std::size_t t = (e / (c.g.numel() / 4000)) % 1000;  // token of element e (4 heads)
        if (mild) c.g.data[e] /= 50;
        if ((t >= 300 && t < 364) || (!mild && t % 7 == 0)) c.g.data[e] = -30.0f;
        if (t % 7 == 1) c.g.data[e] = 0.0f;
      }
      for (std::size_t e = 0; e < c.beta.numel(); ++e)
        c.beta.data[e] = e % 5 == 0 ? 1e-6f : e % 5 == 1 ? 1.0f : c.beta.data[e];
      FloatArray d_out(c.out.shape);
      fill_normal(d_out.ptr(), static_cast<int64_t>(d_out.numel()), 73);
      const Trained got = train(c, d_out);
      const Trained want = reference_grads(c, d_out);
      INFO(c.p.repro());
      for (const FloatArray* x : {&got.dq, &got.dk, &got.dv, &got.dg, &got.dbeta, &got.ds0})
        for (float y : x->data) REQUIRE(std::isfinite(y));
      expect_grads_close(got, want, c);
      const GradientTolerance tol = c.variant.grad_tolerance(c.p, c.inputs(), d_out.ptr());
      std::vector<double> wq(want.dq.data.begin(), want.dq.data.end()),
          wk(want.dk.data.begin(), want.dk.data.end()), wv(want.dv.data.begin(), want.dv.data.end());
      CHECK(max_abs(got.dq.ptr(), wq.data(), wq.size()) <= tol.dq);
      CHECK(max_abs(got.dk.ptr(), wk.data(), wk.size()) <= tol.dk);
      CHECK(max_abs(got.dv.ptr(), wv.data(), wv.size()) <= tol.dv);
    }
}

// The chunk form's kernels are compiled once per SIMD target, and their vector loops and scalar tails split
// d_k and d_v columns differently on each (16, 8, 4 lanes or 1): every supported target runs the d_k != d_v
// widths, forward (both forms) and the chunkwise backward, against the fp64 definition.
TEST_CASE("recurrences: d_k != d_v on every supported SIMD target, forward and chunkwise backward",
          "[recurrent]") {
  for (const std::string& isa : simd::isa_info().supported) {
    const simd::ScopedIsa scoped(isa);
    REQUIRE(simd::active_isa() == isa);
    for (const auto& [dk, dv] : kWidths)
      for (const char* name : kVariants) {
        for (const Json& form : {Json{{"chunk", 16}}, Json{{"form", "recurrent"}}}) {
          RecCase c(name, form, 1, 4, 2, 45, dk, 81, dv);  // 45 = 2 x 16 + 13
          INFO(isa);
          expect_matches(c);
        }
        RecCase c(name, {{"chunk", 16}}, 1, 4, 2, 45, dk, 83, dv);
        c.with_initial_state(84);
        FloatArray d_out(c.out.shape);
        fill_normal(d_out.ptr(), static_cast<int64_t>(d_out.numel()), 85);
        const Trained got = train(c, d_out);
        const Trained want = reference_grads(c, d_out);
        INFO(isa << " " << c.p.repro());
        expect_grads_close(got, want, c);
      }
  }
}

TEST_CASE("recurrences: FLOPs and workspace count d_k and d_v apart", "[recurrent]") {
  auto problem = [](const char* name, const Json& params, int64_t dk, int64_t dv) {
    Problem p = make_problem(name, params);
    p.heads = 4, p.seq_q = p.seq_kv = 1000, p.head_dim = dk, p.v_head_dim = dv, p.mask.causal = true;
    return p;
  };
  for (const char* name : kVariants) {
    const Attention& v = Registry::instance().get(name);
    INFO(name);
    // The recurrent form's work is all on the d_k x d_v state: proportional to d_k d_v.
    const Json rec = {{"form", "recurrent"}};
    CHECK(v.flops(problem(name, rec, 64, 32)) == v.flops(problem(name, rec, 32, 64)));
    CHECK(v.flops(problem(name, rec, 64, 32)) == 0.5 * v.flops(problem(name, rec, 64, 64)));
    CHECK(v.backward_flops(problem(name, rec, 64, 32)) == 0.5 * v.backward_flops(problem(name, rec, 64, 64)));
    // The chunk form's products: between the square problems on either side, in every count.
    for (const auto& [dk, dv] : {std::pair<int64_t, int64_t>{64, 32}, {32, 64}}) {
      const Problem small = problem(name, Json::object(), 32, 32),
                    mid = problem(name, Json::object(), dk, dv), big = problem(name, Json::object(), 64, 64);
      CHECK(v.flops(small) < v.flops(mid));
      CHECK(v.flops(mid) < v.flops(big));
      CHECK(v.backward_flops(small) < v.backward_flops(mid));
      CHECK(v.backward_flops(mid) < v.backward_flops(big));
      CHECK(v.workspace_bytes(small, 2) < v.workspace_bytes(mid, 2));
      CHECK(v.workspace_bytes(mid, 2) < v.workspace_bytes(big, 2));
      CHECK(v.backward_workspace_bytes(small, 2) < v.backward_workspace_bytes(mid, 2));
      CHECK(v.backward_workspace_bytes(mid, 2) < v.backward_workspace_bytes(big, 2));
    }
  }
}

TEST_CASE("recurrences: hostile inputs are clear errors", "[recurrent]") {
  auto throws_usage = [](RecCase& c, const std::string& has) {
    INFO(c.p.repro() + " expecting '" + has + "'");
    try {
      c.run();
      FAIL("no error");
    } catch (const UsageError& e) {
      CHECK(std::string(e.what()).find(has) != std::string::npos);
    }
  };
  {
    RecCase c("simple_gla", Json::object(), 1, 2, 0, 20, 8, 1);
    c.g.data[5] = 0.5f;
    throws_usage(c, "<= 0");
    c.g.data[5] = std::nanf("");
    throws_usage(c, "finite");
    c.g = FloatArray();
    throws_usage(c, "missing g");
  }
  {
    RecCase c("gated_delta_rule", {{"form", "recurrent"}}, 1, 2, 0, 20, 8, 1);
    c.beta.data[3] = 0.0f;
    throws_usage(c, "(0, 1]");
    c.beta.data[3] = 1.5f;
    throws_usage(c, "(0, 1]");
    c.beta.data[3] = std::nanf("");
    throws_usage(c, "(0, 1]");
  }
  {
    RecCase c("delta_rule", Json::object(), 1, 2, 0, 20, 8, 1);
    c.with_initial_state(3);
    c.s0.data[7] = INFINITY;
    throws_usage(c, "initial_state");
  }
  {
    RecCase c("retention", Json::object(), 1, 2, 0, 20, 8, 1);
    c.p.mask.causal = false;
    CHECK_THROWS_AS(c.run(), NotSupported);
    c.p.mask.causal = true;
    c.p.seq_kv = 10;
    CHECK_THROWS_WITH(c.run(), Catch::Contains("seq_q == seq_kv"));
  }
}

namespace {

// Rows [t0, t0 + len) of every [rows, width]-row block of src ([blocks, n, width]) into [blocks, len, width].
FloatArray token_slice(const FloatArray& src, int64_t blocks, int64_t n, int64_t t0, int64_t len) {
  const int64_t width = static_cast<int64_t>(src.numel()) / (blocks * n);
  FloatArray dst({blocks, len, width});
  for (int64_t b = 0; b < blocks; ++b)
    std::copy_n(src.ptr() + (b * n + t0) * width, len * width, dst.ptr() + b * len * width);
  return dst;
}

// One decode step of `whole`'s variant at token t: seq_q = 1, seq_kv = t + 1 under causal_lower_right, the
// context's K, V, g, beta as given (the tokens before t are there, as in a KV cache, and must not be read),
// from `state` ([batch, heads, d_k, d_v]); writes the output row of every head into `out` ([batch, heads,
// d_v]) and the new state.
void decode_step(const RecCase& whole, const Json& params, int64_t t, FloatArray& state, FloatArray& out) {
  const Problem& pw = whole.p;
  const int64_t n = pw.seq_q, d = pw.head_dim, bh = pw.batch * pw.heads, bkv = pw.batch * pw.num_kv_heads();
  Problem p = make_problem(pw.variant, params);
  p.batch = pw.batch, p.heads = pw.heads, p.kv_heads = pw.kv_heads, p.head_dim = d;
  p.v_head_dim = pw.v_head_dim;
  p.seq_q = 1, p.seq_kv = t + 1;
  p.mask.causal_lower_right = true;
  p.initial_state = true;
  const FloatArray q = token_slice(whole.q, bh, n, t, 1);
  const FloatArray k = token_slice(whole.k, bkv, n, 0, t + 1), v = token_slice(whole.v, bkv, n, 0, t + 1);
  const FloatArray g = whole.g.numel() ? token_slice(whole.g, bh, n, 0, t + 1) : FloatArray();
  const FloatArray beta = whole.beta.numel() ? token_slice(whole.beta, bh, n, 0, t + 1) : FloatArray();
  FloatArray next(state.shape);
  AttentionInputs in;
  in.q = q.ptr(), in.k = k.ptr(), in.v = v.ptr(), in.out = out.ptr();
  in.g = g.numel() ? g.ptr() : nullptr;
  in.beta = beta.numel() ? beta.ptr() : nullptr;
  in.initial_state = state.ptr(), in.final_state = next.ptr();
  whole.variant.run(p, in);
  state = std::move(next);
}

}  // namespace

TEST_CASE("recurrences: chunked prefill then token-by-token decode equals one chunkwise call",
          "[recurrent]") {
  // Prefill lengths with an uneven final chunk for each chunk size (77 = 4 x 16 + 13, 50 = 7 x 7 + 1,
  // 130 = 2 x 64 + 2), then 20 decode steps; grouped-query heads (4 query heads on 2 K/V heads); d_k = d_v,
  // then a d_k x d_v state both ways (d_v wider, 24, and narrower, 8).
  struct Split {
    int64_t chunk, prefill;
    const char* decode_form;
  };
  const Split splits[] = {{16, 77, "chunk"}, {7, 50, "recurrent"}, {64, 130, "chunk"}};
  const int64_t steps = 20, whole_chunk = 32;
  for (const auto& [d, dv] : {std::pair<int64_t, int64_t>{16, 16}, {16, 24}, {32, 8}})
    for (const char* name : kVariants)
      for (const Split& s : splits) {
        const int64_t n = s.prefill + steps;
        RecCase whole(name, {{"chunk", whole_chunk}}, 1, 4, 2, n, d, 91, dv);
        whole.run();
        // The chunked prefill: one chunk-form call on the first tokens, keeping its final state.
        RecCase pre(name, {{"chunk", s.chunk}}, 1, 4, 2, s.prefill, d, 91, dv);
        pre.q = token_slice(whole.q, 4, n, 0, s.prefill);
        pre.k = token_slice(whole.k, 2, n, 0, s.prefill), pre.v = token_slice(whole.v, 2, n, 0, s.prefill);
        if (whole.g.numel()) pre.g = token_slice(whole.g, 4, n, 0, s.prefill);
        if (whole.beta.numel()) pre.beta = token_slice(whole.beta, 4, n, 0, s.prefill);
        pre.run();
        REQUIRE(pre.fin.numel() == static_cast<std::size_t>(4 * d * dv));
        FloatArray state = pre.fin, row({1, 4, dv});
        std::vector<double> joined(whole.out.numel());
        for (int64_t h = 0; h < 4; ++h)
          for (int64_t t = 0; t < s.prefill; ++t)
            for (int64_t j = 0; j < dv; ++j)
              joined[(h * n + t) * dv + j] = pre.out.data[(h * s.prefill + t) * dv + j];
        for (int64_t t = s.prefill; t < n; ++t) {
          decode_step(whole, {{"form", s.decode_form}, {"chunk", s.chunk}}, t, state, row);
          for (int64_t h = 0; h < 4; ++h)
            for (int64_t j = 0; j < dv; ++j) joined[(h * n + t) * dv + j] = row.data[h * dv + j];
        }
        // Why this bound: the split run and the one call are both fp32 evaluations of one recurrence. Each
        // step of either commits a local rounding of at most (d_k + 8 + C) u (1 + ||k||^2)^2 (||S|| + ||v||),
        // u = 2^-24, C the chunk (0 for a recurrent step; the forward's sums run over d_k and C, not d_v),
        // and both propagate it through the same transitions (recurrence_abs_tolerance's derivation): so each
        // is within the bound derived for the whole sequence at the larger chunk, from epsilon, d_k, C and
        // the length, of the fp64 definition, and they are within twice it of each other. The same holds for
        // the state with its running bound (recurrence_state_tolerance).
        RecurrenceConfig cfg;
        {
          const Json params = {{"chunk", std::max(s.chunk, whole_chunk)}};
          Problem wide = make_problem(name, params);
          wide.batch = 1, wide.heads = 4, wide.kv_heads = 2, wide.seq_q = wide.seq_kv = n, wide.head_dim = d;
          wide.v_head_dim = dv;
          wide.mask.causal = true;
          cfg.kind.gate = whole.variant.capabilities().gate;
          cfg.kind.retention = std::string(name) == "retention";
          cfg.kind.delta = is_delta(name);
          cfg.kind.normalize_keys = is_delta(name);
          cfg.chunk = std::max(s.chunk, whole_chunk);
          const double out_bound = 2 * whole.variant.abs_tolerance(wide, whole.inputs());
          const double state_bound = 2 * recurrence_state_tolerance(wide, whole.inputs(), cfg);
          INFO(wide.repro() + " chunk " + std::to_string(s.chunk) + " prefill " + std::to_string(s.prefill) +
               ": output bound " + std::to_string(out_bound) + ", state bound " +
               std::to_string(state_bound));
          CHECK(max_abs(whole.out.ptr(), joined.data(), joined.size()) <= out_bound);
          const std::vector<double> fin(state.data.begin(), state.data.end());
          CHECK(max_abs(whole.fin.ptr(), fin.data(), fin.size()) <= state_bound);
          // And both within 1e-5 relative, as every form is of the fp64 recurrence.
          CHECK(rel_l2(whole.out.ptr(), joined.data(), joined.size()) <= 1e-5);
          CHECK(rel_l2(whole.fin.ptr(), fin.data(), fin.size()) <= 1e-5);
        }
      }
}

TEST_CASE("recurrences: a decode step reads only its own token's K, V, g, beta and costs O(d_k d_v) per head",
          "[recurrent]") {
  for (const int64_t dv : {8, 12})  // d_v = d_k, then wider
    for (const char* name : kVariants) {
      const int64_t n = 40, d = 8;
      RecCase whole(name, Json::object(), 1, 2, 0, n, d, 7, dv);
      FloatArray state({1, 2, d, dv}), clean({1, 2, dv}), poisoned({1, 2, dv});
      fill_normal(state.ptr(), static_cast<int64_t>(state.numel()), 5, 0.5);
      FloatArray s1 = state, s2 = state;
      decode_step(whole, Json::object(), n - 1, s1, clean);
      // NaN in every earlier token: a step that read them would give NaN.
      for (FloatArray* x : {&whole.k, &whole.v, &whole.g, &whole.beta}) {
        const int64_t blocks = x == &whole.k || x == &whole.v ? whole.p.num_kv_heads() : whole.p.heads;
        if (!x->numel()) continue;
        const int64_t width = static_cast<int64_t>(x->numel()) / (blocks * n);
        for (int64_t b = 0; b < blocks; ++b)
          std::fill_n(x->ptr() + b * n * width, (n - 1) * width, std::nanf(""));
      }
      decode_step(whole, Json::object(), n - 1, s2, poisoned);
      INFO(whole.p.repro());
      CHECK(clean.data == poisoned.data);
      CHECK(s1.data == s2.data);
      // The same work and workspace at any context.
      Problem a = make_problem(name), b = make_problem(name);
      for (Problem* p : {&a, &b}) {
        p->heads = 8, p->head_dim = 64, p->seq_q = 1, p->mask.causal_lower_right = true,
        p->initial_state = true;
      }
      a.seq_kv = 1024, b.seq_kv = 32768;
      CHECK(whole.variant.flops(a) == whole.variant.flops(b));
      CHECK(whole.variant.workspace_bytes(a, 2) == whole.variant.workspace_bytes(b, 2));
      CHECK(whole.variant.decode_state_bytes(b) == 8u * 64 * 64 * sizeof(float));
      CHECK(kv_cache_bytes(b) == 2u * 8 * 32768 * 64 * sizeof(float));
      // d_v = 32 beside d_k = 64: the state is d_k x d_v per head, and still independent of the context.
      a.v_head_dim = b.v_head_dim = 32;
      CHECK(whole.variant.unsupported_reasons_text(b).empty());
      CHECK(whole.variant.flops(a) == whole.variant.flops(b));
      CHECK(whole.variant.workspace_bytes(a, 2) == whole.variant.workspace_bytes(b, 2));
      CHECK(whole.variant.decode_state_bytes(b) == 8u * 64 * 32 * sizeof(float));
    }
}

TEST_CASE("recurrences: a decode problem without an initial state is refused with the reason",
          "[recurrent]") {
  for (const char* name : kVariants) {
    Problem p = make_problem(name);
    p.heads = 2, p.head_dim = 8, p.seq_q = 1, p.seq_kv = 100;
    p.mask.causal_lower_right = true;
    const Attention& v = Registry::instance().get(name);
    INFO(name);
    CHECK_THAT(v.unsupported_reasons_text(p), Catch::Contains("needs an initial state"));
    p.initial_state = true;
    CHECK(v.unsupported_reasons_text(p).empty());
    // Upper-left causal with seq_q < seq_kv is not a decode: refused as before.
    p.mask.causal = true;
    CHECK_THAT(v.unsupported_reasons_text(p), Catch::Contains("seq_q == seq_kv"));
    p.mask.causal = false;
    CHECK_THAT(v.backward_unsupported_reasons_text(p), Catch::Contains("no backward for a decode problem"));
  }
}

TEST_CASE("sweep decode points: a state from the chunkwise prefill, rows with own accuracy and state bytes",
          "[recurrent][sweep]") {
  const std::string text = R"({"name": "decode-test",
    "variants": ["tiled", "retention", {"name": "gla", "params": {"form": "recurrent", "chunk": 16}},
                 {"name": "gated_delta_rule", "params": {"chunk": 16}},
                 {"name": "sliding_window", "params": {"window": 50, "global_tokens": 4}}],
    "sweep": {"batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 16, "seq_q": 1, "seq_kv": 300,
              "mask": "causal_lower_right", "threads": 1},
    "measure": {"warmup": 0, "min_reps": 1, "max_reps": 3, "min_time_s": 0, "max_time_s": 1},
    "accuracy": {"reference": "full"}, "memory_budget": "1GiB", "seed": 3})";
  const Plan plan = make_plan(parse_sweep_config_text(text, "decode-test.json"));
  REQUIRE(plan.points.size() == 5);
  PointRunner runner(plan.config);
  Calibration cal;  // the denominators do not matter here
  cal.sgemm_gflops[1] = 1;
  runner.set_calibration(cal);
  for (const SweepPoint& pt : plan.points) {
    const Problem& p = pt.problem;
    const bool recurrence = p.variant != "tiled" && p.variant != "sliding_window";
    const ResultRow row = runner.measure(pt);
    INFO(row.id << ": " << row.reason);
    REQUIRE(row.status == "ok");
    CHECK(p.initial_state == recurrence);
    CHECK((row.id.find(",state0") != std::string::npos) == recurrence);
    REQUIRE(row.accuracy.rel_l2_err);
    REQUIRE(row.accuracy_vs_softmax.rel_l2_err);
    CHECK(*row.memory.kv_cache_bytes == 2 * 2 * 300 * 16 * 4);
    if (recurrence) {
      // Against its own definition from the same state: fp32 rounding; softmax attention is another operator.
      CHECK(*row.accuracy.rel_l2_err <= 1e-5);
      CHECK(*row.accuracy_vs_softmax.rel_l2_err > 0.1);
      CHECK(*row.memory.state_bytes == 4 * 16 * 16 * 4);
    } else {
      CHECK(*row.accuracy_vs_softmax.rel_l2_err == *row.accuracy.rel_l2_err);
      CHECK(*row.accuracy_vs_softmax.max_abs_err == *row.accuracy.max_abs_err);
    }
    if (p.variant == "tiled") CHECK(*row.memory.state_bytes == *row.memory.kv_cache_bytes);
    if (p.variant == "sliding_window") CHECK(*row.memory.state_bytes == 2 * (4 + 50 + 1) * 2 * 16 * 4);
    if (!recurrence) continue;
    // The prefill's state, then the decode step from it, equal the fp64 definition run over the whole
    // context (a self-attention problem of 300 tokens whose last query is the decode's).
    PointInputs in = make_inputs(pt);
    AttentionInputs view = in.view(p, nullptr);
    DecodeStates states;
    states.prepare(pt, view);
    REQUIRE(states.state_for(p) != nullptr);
    FloatArray out({1, 4, 1, 16});
    AttentionInputs step = view;
    step.out = out.ptr();
    step.initial_state = states.state_for(p);
    const Attention& variant = Registry::instance().get(p.variant);
    variant.run(p, step);
    Problem whole = p;
    whole.seq_q = 300, whole.initial_state = false;
    whole.mask = MaskSpec{};
    whole.mask.causal = true;
    FloatArray q({1, 4, 300, 16});
    for (int64_t h = 0; h < 4; ++h) std::copy_n(in.q.ptr() + h * 16, 16, q.ptr() + (h * 300 + 299) * 16);
    AttentionInputs all = view;
    all.q = q.ptr();
    DoubleArray want({1, 4, 300, 16});
    variant.reference_forward(whole, all, want.ptr());
    std::vector<double> last(4 * 16);
    for (int64_t h = 0; h < 4; ++h) std::copy_n(want.ptr() + (h * 300 + 299) * 16, 16, last.data() + h * 16);
    CHECK(rel_l2(out.ptr(), last.data(), last.size()) <= 1e-5);
  }
}

TEST_CASE("recurrences: a bf16 / fp16 decode step widens only its own token", "[recurrent]") {
  for (const int64_t dv : {8, 20})  // d_v = d_k, then wider
    for (const char* name : kVariants)
      for (DType t : {DType::bf16, DType::fp16}) {
        const int64_t n = 64, d = 8;
        RecCase whole(name, Json::object(), 1, 4, 2, n, d, 17, dv);
        Problem p = make_problem(name);
        p.heads = 4, p.kv_heads = 2, p.head_dim = d, p.v_head_dim = dv, p.seq_q = 1, p.seq_kv = n,
        p.dtype = t;
        p.mask.causal_lower_right = true;
        p.initial_state = true;
        FloatArray state({1, 4, d, dv}), out({1, 4, 1, dv});
        fill_normal(state.ptr(), static_cast<int64_t>(state.numel()), 9, 0.5);
        const FloatArray q = token_slice(whole.q, 4, n, n - 1, 1);
        AttentionInputs in;
        in.q = q.ptr(), in.k = whole.k.ptr(), in.v = whole.v.ptr();
        in.g = whole.g.numel() ? whole.g.ptr() : nullptr;
        in.beta = whole.beta.numel() ? whole.beta.ptr() : nullptr;
        in.initial_state = state.ptr();
        const StoredInputs stored(p, in);
        AttentionInputs s16 = stored.get();
        s16.out = out.ptr();
        DoubleArray want({1, 4, 1, dv});
        whole.variant.reference_forward(p, s16, want.ptr());
        // NaN (fp16) or 2^125 (bf16) in every earlier token's 16-bit K and V rows: the step reads none of
        // them.
        std::vector<uint16_t> k(s16.k16, s16.k16 + whole.k.numel()), v(s16.v16, s16.v16 + whole.v.numel());
        for (int64_t b = 0; b < 2; ++b) {
          for (int64_t e = 0; e < (n - 1) * d; ++e) k[b * n * d + e] = 0x7e00;
          for (int64_t e = 0; e < (n - 1) * dv; ++e) v[b * n * dv + e] = 0x7e00;
        }
        s16.k16 = k.data(), s16.v16 = v.data();
        whole.variant.run(p, s16);
        INFO(p.repro());
        CHECK(max_abs(out.ptr(), want.ptr(), out.numel()) <= whole.variant.abs_tolerance(p, stored.get()));
        // It widens the step's tokens, not the context: the same workspace at any context.
        Problem longer = p;
        longer.seq_kv = 32768;
        CHECK(whole.variant.workspace_bytes(longer, 2) == whole.variant.workspace_bytes(p, 2));
      }
}
