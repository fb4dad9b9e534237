// linformer against definitions written here, independently of the variant's own reference: softmax
// attention over keys and values projected in fp64 with E and F from linformer/projection.hpp; the derived
// tolerance against projections that are off by one key; the seed; key padding as zeroed keys; dropout as
// naive's on the projected keys; parameter and mask errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/tensor.hpp"
#include "tests/support/attention_case.hpp"
#include "variants/linformer/projection.hpp"

using namespace attn;
using namespace attn::test;
using attn::linformer::Stream;

namespace {

struct Shape {
  int64_t batch, heads, kv_heads, seq_q, seq_kv, head_dim, k;
  bool padded;
  double scale;  // 0: the default 1/sqrt(head_dim)
};

// A linformer case with seeded Q, K, V; with `padded`, batch b pads key j iff (7 j + b) % 5 == 0.
AttentionCase linformer_case(const Shape& s, uint64_t seed, int64_t proj_seed = 11) {
  Problem p = make_test_problem("linformer", s.batch, s.heads, s.seq_q, s.seq_kv, s.head_dim,
                                s.padded ? "pad" : "none", {{"k", s.k}, {"seed", proj_seed}});
  p.kv_heads = s.kv_heads;
  if (s.scale > 0) p.scale = s.scale;
  AttentionCase c(p, seed);
  if (s.padded) c.pad_keys([](int64_t b, int64_t j) { return (7 * j + b) % 5 == 0; });
  return c;
}

// Ways to get the projection wrong by one key, for the tolerance test.
struct Defect {
  int64_t shift = 0;       // key j meets column (j + shift) mod n of E and F
  bool drop_last = false;  // the last key is left out of the projection
  bool swap = false;       // keys projected by F and values by E
};

// K' = E K and V' = F V in fp64 over the unpadded keys of K/V block kv, as k × d row-major arrays.
void project(const AttentionCase& c, const std::vector<float>& e, const std::vector<float>& f, int64_t kv,
             const Defect& defect, std::vector<double>& kp, std::vector<double>& vp) {
  const Problem& p = c.p;
  const int64_t k = p.param_int("k"), n = p.seq_kv, D = p.head_dim, b = kv / p.num_kv_heads();
  kp.assign(static_cast<std::size_t>(k * D), 0.0);
  vp.assign(static_cast<std::size_t>(k * D), 0.0);
  const std::vector<float>& ek = defect.swap ? f : e;
  const std::vector<float>& fv = defect.swap ? e : f;
  for (int64_t j = 0; j < n - (defect.drop_last ? 1 : 0); ++j) {
    if (p.mask.key_padding && c.pad.data[b * n + j]) continue;
    const int64_t col = (j + defect.shift) % n;
    for (int64_t r = 0; r < k; ++r)
      for (int64_t d = 0; d < D; ++d) {
        kp[r * D + d] += static_cast<double>(ek[r * n + col]) * c.k.data[(kv * n + j) * D + d];
        vp[r * D + d] += static_cast<double>(fv[r * n + col]) * c.v.data[(kv * n + j) * D + d];
      }
  }
}

// The paper's definition, directly: out = softmax(scale Q K'ᵀ) V' per query head, K' and V' of its K/V head.
std::vector<double> linformer_fp64(const AttentionCase& c, const Defect& defect = {}) {
  const Problem& p = c.p;
  const int64_t k = p.param_int("k"), n = p.seq_kv, D = p.head_dim, Lq = p.seq_q;
  const auto seed = static_cast<uint64_t>(p.param_int("seed"));
  std::vector<float> e(static_cast<std::size_t>(k * n)), f(e.size());
  linformer::fill_projection(seed, Stream::keys, k, n, e.data());
  linformer::fill_projection(seed, Stream::values, k, n, f.data());
  std::vector<double> out(static_cast<std::size_t>(p.q_elements())), kp, vp, w(static_cast<std::size_t>(k));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      project(c, e, f, p.kv_block(b, h), defect, kp, vp);
      const int64_t bh = b * p.heads + h;
      for (int64_t i = 0; i < Lq; ++i) {
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t r = 0; r < k; ++r) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d)
            s += static_cast<double>(c.q.data[(bh * Lq + i) * D + d]) * kp[r * D + d];
          w[r] = s * p.effective_scale();
          mx = std::max(mx, w[r]);
        }
        for (int64_t r = 0; r < k; ++r) sum += w[r] = std::exp(w[r] - mx);
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t r = 0; r < k; ++r) o += w[r] / sum * vp[r * D + d];
          out[(bh * Lq + i) * D + d] = o;
        }
      }
    }
  return out;
}

template <class A, class B>
double max_abs_diff(const A& got, const B& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t e = 0; e < got.size(); ++e)
    worst = std::max(worst, std::isfinite(static_cast<double>(got[e]))
                                ? std::fabs(static_cast<double>(got[e]) - static_cast<double>(want[e]))
                                : std::numeric_limits<double>::infinity());
  return worst;
}

// k < n, k > n, k = n, k = 1 (the softmax is 1: out = F V, Q plays no part), grouped-query heads, padding,
// cross shapes both ways, an overridden scale, and n = 130 with d = 33 (the check's largest shape).
const Shape kShapes[] = {{2, 4, 2, 9, 23, 12, 5, false, 0},     {1, 2, 0, 17, 7, 8, 16, true, 0},
                         {2, 3, 0, 33, 130, 33, 16, true, 0},   {1, 6, 3, 5, 64, 16, 64, false, 0.7},
                         {1, 1, 0, 130, 130, 33, 80, false, 0}, {1, 2, 0, 7, 40, 8, 1, true, 0}};

}  // namespace

TEST_CASE("linformer is softmax attention over keys and values projected independently in fp64",
          "[linformer]") {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    AttentionCase c = linformer_case(s, ++seed);
    INFO(c.p.repro());
    const FloatArray got = c.run();
    const double tol = c.tolerance();
    const std::vector<double> want = linformer_fp64(c);
    const double err = max_abs_diff(got.data, want);
    INFO("max_abs_err " << err << ", tolerance " << tol);
    CHECK(err <= tol);
    // The variant's own oracle agrees with this one to fp64 rounding.
    DoubleArray oracle(got.shape);
    Registry::instance().get("linformer").reference_forward(c.p, c.inputs(nullptr), oracle.ptr());
    CHECK(max_abs_diff(oracle.data, want) <= 1e-9 * (1 + tol));
  }
}

TEST_CASE("linformer's tolerance fails a projection off by one key", "[linformer]") {
  uint64_t seed = 200;
  for (const Shape& s : kShapes) {
    AttentionCase c = linformer_case(s, ++seed);
    const double tol = c.tolerance();
    const std::vector<double> want = linformer_fp64(c);
    for (const Defect& d : {Defect{1, false, false}, Defect{0, true, false}, Defect{0, false, true}}) {
      // Dropping the last key changes nothing where every batch entry pads it anyway.
      bool last_used = false;
      for (int64_t b = 0; b < s.batch; ++b)
        last_used |= !(s.padded && c.pad.data[b * s.seq_kv + s.seq_kv - 1]);
      if (d.drop_last && !last_used) continue;
      const double moved = max_abs_diff(linformer_fp64(c, d), want);
      INFO(c.p.repro() << " shift " << d.shift << " drop_last " << d.drop_last << " swap " << d.swap
                       << ": moved " << moved << ", tolerance " << tol);
      CHECK(moved > tol);
    }
  }
}

TEST_CASE("linformer's projections depend on the seed only, E and F apart, rows extend with n",
          "[linformer]") {
  const int64_t k = 6, n = 50;
  std::vector<float> e(k * n), f(k * n), e2(k * n), e_short(k * 20);
  linformer::fill_projection(3, Stream::keys, k, n, e.data());
  linformer::fill_projection(3, Stream::values, k, n, f.data());
  linformer::fill_projection(4, Stream::keys, k, n, e2.data());
  linformer::fill_projection(3, Stream::keys, k, 20, e_short.data());
  CHECK(e != f);
  CHECK(e != e2);
  for (int64_t r = 0; r < k; ++r)
    CHECK(std::equal(e_short.begin() + r * 20, e_short.begin() + (r + 1) * 20, e.begin() + r * n));
  // N(0, 1/k): the sample variance of k n = 300 draws is within 30% of 1/k.
  double sum2 = 0;
  for (float x : e) sum2 += static_cast<double>(x) * x;
  CHECK(sum2 / static_cast<double>(e.size()) == Approx(1.0 / k).epsilon(0.3));

  // Through the variant: the same seed reproduces the output bitwise, another seed moves it beyond the
  // tolerance.
  const Shape s{2, 2, 0, 11, 29, 8, 7, false, 0};
  AttentionCase a = linformer_case(s, 5, 21), b = linformer_case(s, 5, 21), other = linformer_case(s, 5, 22);
  const FloatArray ra = a.run(), rb = b.run(), ro = other.run();
  CHECK(std::memcmp(ra.ptr(), rb.ptr(), ra.numel() * sizeof(float)) == 0);
  CHECK(max_abs_diff(ra.data, ro.data) > a.tolerance());
}

TEST_CASE("linformer drops padded keys before the projection, even non-finite ones", "[linformer]") {
  const Shape s{3, 2, 1, 10, 37, 9, 8, true, 0};
  AttentionCase zeroed = linformer_case(s, 7), poisoned = linformer_case(s, 7);
  zeroed.pad_keys([](int64_t b, int64_t j) { return b == 2 || j % 3 == 1; });
  poisoned.pad = zeroed.pad;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t j = 0; j < s.seq_kv; ++j) {
      if (!zeroed.pad.data[b * s.seq_kv + j]) continue;
      for (int64_t d = 0; d < s.head_dim; ++d) {
        zeroed.k_at(b, j, d) = zeroed.v_at(b, j, d) = 0.0f;
        poisoned.k_at(b, j, d) = std::numeric_limits<float>::quiet_NaN();
        poisoned.v_at(b, j, d) = std::numeric_limits<float>::infinity();
      }
    }
  const FloatArray z = zeroed.run(), q = poisoned.run();
  CHECK(std::memcmp(z.ptr(), q.ptr(), z.numel() * sizeof(float)) == 0);
  CHECK(max_abs_diff(q.data, linformer_fp64(zeroed)) <= zeroed.tolerance());
  // Batch entry 2 pads every key: K' = V' = 0, so its rows are exactly 0.
  const int64_t per_batch = s.heads * s.seq_q * s.head_dim;
  CHECK(std::all_of(q.data.begin() + 2 * per_batch, q.data.end(), [](float x) { return x == 0.0f; }));
}

TEST_CASE("linformer's dropout is naive's dropout on the projected keys", "[linformer]") {
  // naive on K' and V' (the fp64 projections rounded to fp32) with the same dropout seed drops the same
  // (b, h, i, r) weights. Bound: linformer's tolerance covers its distance to the fp64 definition, naive's
  // covers its own on the rounded K', V', and rounding K', V' once more (u |K'|, u |V'|) is one more unit in
  // the (n + d + 2) u logit factor of linformer's bound, inside its 4x.
  for (double dropout : {0.0, 0.3}) {
    const Shape s{2, 4, 2, 12, 45, 8, 9, true, 0};
    AttentionCase c = linformer_case(s, 31);
    c.p.dropout = dropout, c.p.seed = 77;
    const FloatArray got = c.run();

    const int64_t k = s.k, n = s.seq_kv, D = s.head_dim;
    std::vector<float> e(k * n), f(k * n);
    linformer::fill_projection(11, Stream::keys, k, n, e.data());
    linformer::fill_projection(11, Stream::values, k, n, f.data());
    Problem np = make_test_problem("naive", s.batch, s.heads, s.seq_q, k, D);
    np.kv_heads = s.kv_heads, np.dropout = dropout, np.seed = 77;
    AttentionCase projected(np);
    projected.q = c.q;
    std::vector<double> kp, vp;
    for (int64_t kv = 0; kv < s.batch * s.kv_heads; ++kv) {
      project(c, e, f, kv, {}, kp, vp);
      for (int64_t e2 = 0; e2 < k * D; ++e2) {
        projected.k.data[kv * k * D + e2] = static_cast<float>(kp[e2]);
        projected.v.data[kv * k * D + e2] = static_cast<float>(vp[e2]);
      }
    }
    const FloatArray naive = projected.run();
    const double bound = c.tolerance() + projected.tolerance();
    INFO("dropout " << dropout << ": |linformer - naive| " << max_abs_diff(got.data, naive.data) << ", bound "
                    << bound);
    CHECK(max_abs_diff(got.data, naive.data) <= bound);
  }
}

TEST_CASE("linformer refuses bad k and seed, causal and boolean masks, with the reason", "[linformer]") {
  CHECK_THROWS_WITH(make_problem("linformer", {{"k", 0}}),
                    Catch::Contains("parameter 'k'") && Catch::Contains("got 0"));
  CHECK_THROWS_AS(make_problem("linformer", {{"k", (1 << 20) + 1}}), UsageError);
  CHECK_THROWS_AS(make_problem("linformer", {{"seed", -1}}), UsageError);
  CHECK_NOTHROW(make_problem("linformer", {{"k", 1 << 20}}));

  const Attention& v = Registry::instance().get("linformer");
  Problem p = make_test_problem("linformer", 1, 1, 8, 8, 4, "causal");
  CHECK_THAT(v.unsupported_reasons_text(p), Catch::Contains("mixes all n positions"));
  AttentionCase c(p, 1);
  CHECK_THROWS_AS(c.run(), NotSupported);
  p.mask = parse_mask("bool", "test");
  CHECK_THAT(v.unsupported_reasons_text(p), Catch::Contains("no entry for the k projected keys"));
  p.mask = parse_mask("pad", "test");
  CHECK(v.unsupported_reasons_text(p).empty());
  // k above n is used as given, not clipped: the repro keeps it and the FLOPs grow with it.
  Problem wide = make_test_problem("linformer", 1, 1, 8, 8, 4, "none", {{"k", 32}});
  CHECK_THAT(wide.repro(), Catch::Contains("k=32"));
  CHECK(v.flops(wide) == 4.0 * 32 * 8 * 4 * 2);
  // E and F of k x n over 2^58 elements are refused before anything is allocated.
  Problem huge = make_test_problem("linformer", 1, 1, 1, int64_t{1} << 40, 1, "none", {{"k", 1 << 20}});
  CHECK_THAT(v.unsupported_reasons_text(huge), Catch::Contains("2^58"));
  CHECK(static_cast<double>(v.workspace_bytes(huge, 2)) >= 8.0 * std::ldexp(1.0, 60));
}

// ---- Backward ----

namespace {

struct Grads {
  FloatArray dq, dk, dv;
};

// One training step of the variant on `c` (bf16 / fp16 problems on the rounded inputs): run_saving, then
// run_backward with `d_out`.
Grads train(AttentionCase& c, const FloatArray& d_out, const AttentionInputs& in) {
  const Attention& v = Registry::instance().get(c.p.variant);
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

}  // namespace

TEST_CASE(
    "linformer's gradient is naive's on the projected keys pulled back through E and F, and the tolerance "
    "fails a shifted, swapped or unmasked pull-back",
    "[linformer]") {
  // The registry's gradient checks see no grouped-query or bf16 case of linformer (those cases are causal
  // or masked): here grouped-query heads with padding, dropout, cross shapes both ways and bf16 storage.
  struct GradCase {
    Shape s;
    double dropout;
    DType dtype;
  };
  const GradCase cases[] = {{{2, 4, 2, 9, 23, 12, 5, true, 0}, 0.2, DType::fp32},
                            {{1, 6, 3, 21, 7, 8, 16, true, 0}, 0.0, DType::fp32},
                            {{2, 2, 1, 13, 40, 16, 9, true, 0}, 0.0, DType::bf16}};
  uint64_t seed = 300;
  for (const GradCase& gc : cases) {
    const Shape& s = gc.s;
    AttentionCase c = linformer_case(s, ++seed);
    c.p.dropout = gc.dropout, c.p.seed = 5;
    c.p.dtype = gc.dtype;
    INFO(c.p.repro());
    const FloatArray d_out = normal_tensor(c.q.shape, ++seed);
    std::unique_ptr<StoredInputs> stored;
    if (gc.dtype != DType::fp32) {
      stored = std::make_unique<StoredInputs>(c.p, c.inputs(nullptr));
      // The definition is that of the rounded inputs: compute everything below from them.
      const AttentionInputs w = stored->get();
      for (std::size_t e = 0; e < c.q.numel(); ++e) c.q.data[e] = bf16_to_float(w.q16[e]);
      for (std::size_t e = 0; e < c.k.numel(); ++e)
        c.k.data[e] = bf16_to_float(w.k16[e]), c.v.data[e] = bf16_to_float(w.v16[e]);
    }
    const AttentionInputs in = stored ? stored->get() : c.inputs(nullptr);
    const Attention& v = Registry::instance().get("linformer");
    const Grads got = train(c, d_out, in);
    DoubleArray dq(c.q.shape), dk(c.k.shape), dv(c.v.shape);
    v.reference_backward(c.p, in, d_out.ptr(), dq.ptr(), dk.ptr(), dv.ptr());
    const GradientTolerance tol = v.grad_tolerance(c.p, in, d_out.ptr());
    INFO("tolerance dq " << tol.dq << ", dk " << tol.dk << ", dv " << tol.dv);
    CHECK(max_abs_diff(got.dq.data, dq.data) <= tol.dq);
    CHECK(max_abs_diff(got.dk.data, dk.data) <= tol.dk);
    CHECK(max_abs_diff(got.dv.data, dv.data) <= tol.dv);

    // Independently: naive's exact fp64 gradient on K', V' (projected in fp64 here, rounded to fp32), then
    // dK = Eᵀ dK', dV = Fᵀ dV' over the unpadded keys.
    const int64_t k = s.k, n = s.seq_kv, D = s.head_dim, BKV = s.batch * s.kv_heads;
    std::vector<float> e(k * n), f(k * n);
    linformer::fill_projection(11, Stream::keys, k, n, e.data());
    linformer::fill_projection(11, Stream::values, k, n, f.data());
    Problem np = make_test_problem("naive", s.batch, s.heads, s.seq_q, k, D);
    np.kv_heads = s.kv_heads, np.dropout = gc.dropout, np.seed = 5;
    AttentionCase projected(np);
    projected.q = c.q;
    std::vector<double> kp, vp;
    for (int64_t kv = 0; kv < BKV; ++kv) {
      project(c, e, f, kv, {}, kp, vp);
      for (int64_t x = 0; x < k * D; ++x) {
        projected.k.data[kv * k * D + x] = static_cast<float>(kp[x]);
        projected.v.data[kv * k * D + x] = static_cast<float>(vp[x]);
      }
    }
    DoubleArray nq(c.q.shape), nk(projected.k.shape), nv(projected.v.shape);
    reference_attention_backward(np, projected.inputs(nullptr), d_out.ptr(), nq.ptr(), nk.ptr(), nv.ptr());
    // The pull-back, with a defect: 0 none, 1 E's and F's column j + 1 for key j, 2 E and F swapped, 3 padded
    // keys pulled back like the others.
    auto pull_back = [&](int defect, DoubleArray& out_k, DoubleArray& out_v) {
      for (int64_t kv = 0; kv < BKV; ++kv)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t d = 0; d < D; ++d) {
            double ak = 0, av = 0;
            const bool pad = c.pad.data[kv / s.kv_heads * n + j] != 0;
            if (!pad || defect == 3) {
              const int64_t col = defect == 1 ? (j + 1) % n : j;
              const std::vector<float>& ek = defect == 2 ? f : e;
              const std::vector<float>& fv = defect == 2 ? e : f;
              for (int64_t r = 0; r < k; ++r) {
                ak += static_cast<double>(ek[r * n + col]) * nk.data[(kv * k + r) * D + d];
                av += static_cast<double>(fv[r * n + col]) * nv.data[(kv * k + r) * D + d];
              }
            }
            out_k.data[(kv * n + j) * D + d] = ak;
            out_v.data[(kv * n + j) * D + d] = av;
          }
    };
    DoubleArray pk(c.k.shape), pv(c.v.shape);
    pull_back(0, pk, pv);
    CHECK(max_abs_diff(nq.data, dq.data) <= tol.dq);
    CHECK(max_abs_diff(pk.data, dk.data) <= tol.dk);
    CHECK(max_abs_diff(pv.data, dv.data) <= tol.dv);
    for (int defect = 1; defect <= 3; ++defect) {
      pull_back(defect, pk, pv);
      const double moved_k = max_abs_diff(pk.data, dk.data), moved_v = max_abs_diff(pv.data, dv.data);
      INFO("defect " << defect << ": dk moved " << moved_k << ", dv moved " << moved_v);
      CHECK(moved_k > 10 * tol.dk);
      CHECK(moved_v > 10 * tol.dv);
    }
  }
}

TEST_CASE(
    "linformer's fp64 gradient is the derivative of its definition with grouped-query heads and padding",
    "[linformer]") {
  // The registry's grad-definition cases for linformer have no padding nor grouped-query heads.
  const Shape s{2, 4, 2, 6, 9, 4, 5, true, 0};
  AttentionCase c = linformer_case(s, 41);
  c.p.dropout = 0.3, c.p.seed = 9;
  const FloatArray d_out = normal_tensor(c.q.shape, 42);
  const DirectionalCheck r = check_reference_gradient(Registry::instance().get("linformer"), c.p,
                                                      c.inputs(nullptr), d_out.ptr(), 3, 43);
  INFO("central difference " << r.fd << " vs " << r.analytic << ", relative " << r.worst_rel);
  CHECK(r.worst_rel <= 1e-6);
}
