// dsa (DeepSeek Sparse Attention) against its fp64 definition: the selected key sets themselves (random
// scores, exact ties and 1-ulp near-ties under the lower-index rule), the outputs, full attention when topk
// covers the context, causal rows with fewer keys than topk, GQA / MQA, d_v != d_k (MLA's 576 / 512), decode
// against a long cache, the backward, the phase times and the parameter errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/interface/attention.hpp"
#include "common/kernels/mask.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"
#include "common/support/tensor.hpp"
#include "variants/dsa/dsa.hpp"

using namespace attn;

namespace {

// One dsa problem with its tensors: Q, K, V, the index inputs (N(0, 1), seeded), masks, the output.
struct DsaCase {
  Problem p;
  FloatArray q, k, v, out, index_q, index_k, index_w;
  ByteArray mask, pad;
  DsaCase(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_q, int64_t seq_kv, int64_t head_dim,
          int64_t v_head_dim, const std::string& masks, const Json& params, uint64_t seed) {
    p = make_problem("dsa", params);
    p.batch = batch, p.heads = heads, p.kv_heads = kv_heads, p.seq_q = seq_q, p.seq_kv = seq_kv;
    p.head_dim = head_dim, p.v_head_dim = v_head_dim;
    p.mask = parse_mask(masks, "test");
    const IndexerShape ix(p);
    q = FloatArray({batch, heads, seq_q, head_dim});
    k = FloatArray({batch, p.num_kv_heads(), seq_kv, head_dim});
    v = FloatArray({batch, p.num_kv_heads(), seq_kv, p.value_dim()});
    out = FloatArray({batch, heads, seq_q, p.value_dim()}, std::nanf(""));
    index_q = FloatArray({batch, seq_q, ix.heads, ix.dim});
    index_k = FloatArray({batch, seq_kv, ix.dim});
    index_w = FloatArray({batch, seq_q, ix.heads});
    FloatArray* all[] = {&q, &k, &v, &index_q, &index_k, &index_w};
    for (int i = 0; i < 6; ++i)
      fill_normal(all[i]->ptr(), static_cast<int64_t>(all[i]->numel()), seed * 7 + i);
    if (p.mask.boolean) {
      mask = ByteArray({seq_q, seq_kv});
      Rng rng(seed * 7 + 6);
      for (auto& m : mask.data) m = rng.uniform() < 0.7 ? 1 : 0;
    }
    if (p.mask.key_padding) {
      pad = ByteArray({batch, seq_kv});
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t j = 0; j < seq_kv; ++j) pad.data[b * seq_kv + j] = (j + b) % 4 == 0;
    }
  }
  AttentionInputs inputs() {
    AttentionInputs in;
    in.q = q.ptr(), in.k = k.ptr(), in.v = v.ptr(), in.out = out.ptr();
    in.mask = mask.numel() ? mask.ptr() : nullptr;
    in.key_padding = pad.numel() ? pad.ptr() : nullptr;
    in.index_q = index_q.ptr(), in.index_k = index_k.ptr(), in.index_w = index_w.ptr();
    return in;
  }
  const Attention& dsa() const { return Registry::instance().get("dsa"); }
  FloatArray run() {
    dsa().run(p, inputs());
    return out;
  }
  DoubleArray definition() {
    DoubleArray want(out.shape);
    dsa().reference_forward(p, inputs(), want.ptr());
    return want;
  }
};

// The kernel's selection equals the fp64 definition's, row by row.
void require_same_selection(DsaCase& c) {
  const dsa::Selection got = dsa::select_keys(c.p, c.inputs()), want = dsa::reference_select(c.p, c.inputs());
  REQUIRE(got.capacity == want.capacity);
  for (int64_t r = 0; r < c.p.batch * c.p.seq_q; ++r) {
    INFO(c.p.repro() << ": row " << r);
    REQUIRE(got.count[r] == want.count[r]);
    for (int32_t j = 0; j < got.count[r]; ++j) REQUIRE(got.row(r)[j] == want.row(r)[j]);
  }
}

// The output against the fp64 definition: every element within the derived bound (abs_tolerance: exact
// softmax attention's, over at most the selected keys) and rel L2 <= 1e-5. Why 1e-5: each output element is
// a convex combination of n <= topk values after d_k-long dot products; the worst-case fp32 error is
// u (2 d_k |s| + 2 n) relative (u = 2^-24 ~ 6e-8), what abs_tolerance bounds; rounding errors of random
// sign add up like sqrt(d_k + n) u in the norm: sqrt(576 + 2048) u ~ 3e-6 at the largest case here, and 1e-5
// leaves a 3x margin.
void require_matches_definition(DsaCase& c) {
  const FloatArray got = c.run();
  const DoubleArray want = c.definition();
  const ErrorMetrics m =
      compare_outputs(got.ptr(), want.ptr(), c.p.batch * c.p.heads * c.p.seq_q, c.p.value_dim());
  const double tol = c.dsa().abs_tolerance(c.p, c.inputs());
  INFO(c.p.repro() << ": max_abs_err " << m.max_abs_err << " (bound " << tol << "), rel_l2 " << m.rel_l2_err);
  REQUIRE(m.nan_count == 0);
  REQUIRE(m.max_abs_err <= tol);
  REQUIRE(m.rel_l2_err <= 1e-5);
}

}  // namespace

TEST_CASE("dsa selects the fp64 definition's keys and matches its output", "[dsa]") {
  struct Shape {
    int64_t batch, heads, kv_heads, seq_q, seq_kv, dim, dv;
    const char* mask;
    int64_t topk, index_heads, index_dim;
  };
  const Shape shapes[] = {
      {2, 2, 0, 33, 33, 16, 16, "none", 5, 3, 7},
      {2, 4, 2, 40, 40, 16, 16, "causal", 8, 4, 16},  // rows 0..7 keep fewer than topk
      {1, 2, 0, 17, 300, 8, 8, "causal_lower_right", 32, 8, 32},
      {2, 3, 0, 19, 19, 12, 12, "causal+bool+pad", 4, 2, 5},
      {1, 4, 1, 7, 70, 12, 20, "pad", 9, 5, 3},         // MQA, d_v > d_k
      {1, 8, 1, 300, 300, 16, 8, "causal", 16, 8, 16},  // several index tiles per row and per key range
  };
  for (const Shape& s : shapes) {
    DsaCase c(s.batch, s.heads, s.kv_heads, s.seq_q, s.seq_kv, s.dim, s.dv, s.mask,
              {{"topk", s.topk}, {"index_heads", s.index_heads}, {"index_dim", s.index_dim}}, 17 + s.seq_kv);
    require_same_selection(c);
    require_matches_definition(c);
  }
}

TEST_CASE("dsa keeps every allowed key of causal rows with fewer than topk", "[dsa]") {
  DsaCase c(1, 2, 0, 40, 40, 8, 8, "causal", {{"topk", 16}, {"index_heads", 2}, {"index_dim", 4}}, 3);
  const dsa::Selection sel = dsa::select_keys(c.p, c.inputs());
  for (int64_t t = 0; t < 40; ++t) {
    REQUIRE(sel.count[t] == std::min<int64_t>(t + 1, 16));
    if (t < 16)
      for (int32_t j = 0; j <= t; ++j) REQUIRE(sel.row(t)[j] == j);
    for (int32_t j = 0; j < sel.count[t]; ++j) REQUIRE(sel.row(t)[j] <= t);
  }
}

TEST_CASE("dsa breaks exact ties and fp32 near-ties as the fp64 definition does", "[dsa]") {
  // One index head of width 2, q_I = (1, 1), w = 1: the score of key s is k_I(s, 0) + k_I(s, 1).
  DsaCase c(1, 1, 0, 1, 8, 4, 4, "none", {{"topk", 2}, {"index_heads", 1}, {"index_dim", 2}}, 5);
  c.index_q.data = {1.0f, 1.0f};
  c.index_w.data = {1.0f};
  const float one_up = std::nextafter(1.0f, 2.0f);
  // Keys 1, 3, 6 score exactly 1; key 5 scores 1 + 2^-30 (in fp32 its sum rounds to 1: a tie there, not in
  // fp64); key 7 scores one fp32 ulp above 1 only in its first component plus 0; the rest score 0.
  const float kk[8][2] = {{0, 0}, {1, 0}, {0, 0}, {0.5f, 0.5f}, {0, 0}, {1, std::ldexp(1.0f, -30)},
                          {1, 0}, {0, 0}};
  for (int s = 0; s < 8; ++s) c.index_k.data[2 * s] = kk[s][0], c.index_k.data[2 * s + 1] = kk[s][1];
  SECTION("the fp64 winner of an fp32 tie, then the lower index of an exact tie") {
    require_same_selection(c);
    const dsa::Selection sel = dsa::select_keys(c.p, c.inputs());
    REQUIRE(sel.count[0] == 2);
    CHECK(sel.row(0)[0] == 1);  // ties with 3 and 6 at exactly 1: the lowest index wins
    CHECK(sel.row(0)[1] == 5);  // 1 + 2^-30: above the tie in fp64 though equal in fp32
  }
  SECTION("a 1-ulp-apart pair and an exact tie at the threshold") {
    c.index_k.data[2 * 7] = one_up;  // key 7: one fp32 ulp above 1 (and key 5 still 1 + 2^-30)
    c.p.params["topk"] = 3;
    require_same_selection(c);
    const dsa::Selection sel = dsa::select_keys(c.p, c.inputs());
    REQUIRE(sel.count[0] == 3);
    CHECK(sel.row(0)[0] == 1);
    CHECK(sel.row(0)[1] == 5);
    CHECK(sel.row(0)[2] == 7);
  }
  SECTION("every score equal (all index keys zero): the lowest indices") {
    std::fill(c.index_k.data.begin(), c.index_k.data.end(), 0.0f);
    c.p.params["topk"] = 3;
    require_same_selection(c);
    const dsa::Selection sel = dsa::select_keys(c.p, c.inputs());
    CHECK(std::vector<int32_t>(sel.row(0), sel.row(0) + 3) == std::vector<int32_t>{0, 1, 2});
  }
  SECTION("random near-ties: duplicated index keys and keys one ulp apart in every component") {
    DsaCase r(2, 2, 0, 24, 64, 8, 8, "causal", {{"topk", 6}, {"index_heads", 4}, {"index_dim", 8}}, 9);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t s = 1; s < 64; s += 2) {
        float* row = r.index_k.ptr() + (b * 64 + s) * 8;
        const float* prev = row - 8;
        for (int d = 0; d < 8; ++d) row[d] = s % 4 == 1 ? prev[d] : std::nextafter(prev[d], 10.0f);
      }
    require_same_selection(r);
    require_matches_definition(r);
  }
}

TEST_CASE("dsa with topk covering the context is full softmax attention", "[dsa]") {
  for (const char* mask : {"none", "causal", "causal_lower_right+pad"}) {
    DsaCase c(2, 4, 2, 13, 29, 16, 16, mask, {{"topk", 29}, {"index_heads", 2}, {"index_dim", 3}}, 11);
    const FloatArray got = c.run();
    Problem dense = make_problem("naive");
    dense.batch = c.p.batch, dense.heads = c.p.heads, dense.kv_heads = c.p.kv_heads, dense.seq_q = c.p.seq_q;
    dense.seq_kv = c.p.seq_kv, dense.head_dim = c.p.head_dim, dense.mask = c.p.mask;
    DoubleArray want(c.out.shape);
    reference_attention(dense, c.inputs(), want.ptr());
    const double tol = exact_abs_tolerance(dense, c.inputs());
    const ErrorMetrics m = compare_outputs(got.ptr(), want.ptr(), 2 * 4 * 13, 16);
    INFO(c.p.repro() << ": max_abs_err " << m.max_abs_err << " (bound " << tol << ") rel_l2 "
                     << m.rel_l2_err);
    REQUIRE(m.max_abs_err <= tol);
    REQUIRE(m.rel_l2_err <= 1e-5);
    // And the naive variant's fp32 output, within both bounds of dsa's.
    FloatArray naive_out(c.out.shape);
    AttentionInputs in = c.inputs();
    in.out = naive_out.ptr();
    Registry::instance().get("naive").run(dense, in);
    double worst = 0;
    for (std::size_t e = 0; e < got.numel(); ++e)
      worst = std::max(worst, std::fabs(static_cast<double>(got.data[e]) - naive_out.data[e]));
    REQUIRE(worst <= 2 * tol);
  }
}

TEST_CASE("dsa at MLA's absorbed shape: d_k 576, d_v 512, one K/V head", "[dsa]") {
  DsaCase c(1, 4, 1, 6, 200, 576, 512, "causal_lower_right",
            {{"topk", 64}, {"index_heads", 8}, {"index_dim", 32}}, 21);
  require_same_selection(c);
  require_matches_definition(c);
}

TEST_CASE("dsa with more query heads per K/V head than one attention task takes", "[dsa]") {
  // Groups above 32 heads (MLA's absorbed MQA: 128 on one latent) share each token's gathered rows between
  // head blocks of 32; the last block partial (72 = 32 + 32 + 8, 40 = 32 + 8), decode and prefill, and rows
  // with no allowed key (seq_q 5 > seq_kv 3 under the lower-right rule: the first two rows see none).
  struct Shape {
    int64_t heads, kv_heads, seq_q, seq_kv;
  };
  for (const Shape& s :
       {Shape{72, 1, 1, 300}, Shape{72, 1, 6, 300}, Shape{80, 2, 4, 90}, Shape{72, 1, 5, 3}}) {
    DsaCase c(1, s.heads, s.kv_heads, s.seq_q, s.seq_kv, 24, 16, "causal_lower_right",
              {{"topk", 40}, {"index_heads", 4}, {"index_dim", 8}}, 53 + s.seq_q);
    require_same_selection(c);
    require_matches_definition(c);
  }
}

TEST_CASE("dsa decodes one and four queries against a long cache", "[dsa]") {
  // V3.2's indexer (64 heads of 128, topk 2048) against 3000 cached keys, lower-right causal.
  for (int64_t seq_q : {1, 4}) {
    DsaCase c(1, 8, 1, seq_q, 3000, 32, 24, "causal_lower_right", Json::object(), 31 + seq_q);
    require_same_selection(c);
    require_matches_definition(c);
    const dsa::Selection sel = dsa::select_keys(c.p, c.inputs());
    for (int64_t t = 0; t < seq_q; ++t) REQUIRE(sel.count[t] == 2048);
  }
}

TEST_CASE("dsa reports its indexer, selection and attention times", "[dsa]") {
  DsaCase c(1, 2, 0, 1, 500, 16, 16, "causal_lower_right",
            {{"topk", 64}, {"index_heads", 4}, {"index_dim", 8}}, 41);
  PhaseTimes times;
  AttentionInputs in = c.inputs();
  in.phase_times = &times;
  c.dsa().run(c.p, in);
  REQUIRE(times.count == 3);
  CHECK(std::string(times.names[0]) == "indexer");
  CHECK(std::string(times.names[1]) == "selection");
  CHECK(std::string(times.names[2]) == "attention");
  for (int i = 0; i < 3; ++i) CHECK(times.seconds[i] >= 0);
}

TEST_CASE("dsa's backward matches the gradient of its definition", "[dsa]") {
  struct Shape {
    int64_t batch, heads, kv_heads, seq_q, seq_kv, dim, dv;
    const char* mask;
    int64_t topk;
  };
  const Shape shapes[] = {{2, 2, 0, 17, 17, 8, 8, "causal", 4},
                          {1, 4, 1, 9, 40, 12, 20, "causal_lower_right+pad", 6},
                          {2, 4, 2, 21, 21, 16, 16, "bool", 5},
                          {1, 2, 1, 1, 300, 24, 16, "causal_lower_right", 32}};
  for (const Shape& s : shapes) {
    DsaCase c(s.batch, s.heads, s.kv_heads, s.seq_q, s.seq_kv, s.dim, s.dv, s.mask,
              {{"topk", s.topk}, {"index_heads", 3}, {"index_dim", 5}}, 51 + s.seq_kv);
    const FloatArray out = c.run();
    FloatArray d_out(out.shape), dq(c.q.shape), dk(c.k.shape), dv(c.v.shape), dq2(c.q.shape);
    fill_normal(d_out.ptr(), static_cast<int64_t>(d_out.numel()), 99);
    GradientArgs g{.out = out.ptr(), .d_out = d_out.ptr(), .dq = dq.ptr(), .dk = dk.ptr(), .dv = dv.ptr()};
    c.dsa().run_backward(c.p, c.inputs(), g);
    DoubleArray wq(c.q.shape), wk(c.k.shape), wv(c.v.shape);
    c.dsa().reference_backward(c.p, c.inputs(), d_out.ptr(), wq.ptr(), wk.ptr(), wv.ptr());
    const GradientTolerance tol = c.dsa().grad_tolerance(c.p, c.inputs(), d_out.ptr());
    const ErrorMetrics mq =
        compare_outputs(dq.ptr(), wq.ptr(), static_cast<int64_t>(dq.numel()) / s.dim, s.dim);
    const ErrorMetrics mk =
        compare_outputs(dk.ptr(), wk.ptr(), static_cast<int64_t>(dk.numel()) / s.dim, s.dim);
    const ErrorMetrics mv =
        compare_outputs(dv.ptr(), wv.ptr(), static_cast<int64_t>(dv.numel()) / s.dv, s.dv);
    INFO(c.p.repro() << ": dq " << mq.max_abs_err << " (" << tol.dq << "), dk " << mk.max_abs_err << " ("
                     << tol.dk << "), dv " << mv.max_abs_err << " (" << tol.dv << ")");
    REQUIRE(mq.max_abs_err <= tol.dq);
    REQUIRE(mk.max_abs_err <= tol.dk);
    REQUIRE(mv.max_abs_err <= tol.dv);
    // Deterministic: the same gradients bitwise at one thread.
    {
      ThreadScope one(1);
      g.dq = dq2.ptr();
      FloatArray dk2(c.k.shape), dv2(c.v.shape);
      g.dk = dk2.ptr(), g.dv = dv2.ptr();
      c.dsa().run_backward(c.p, c.inputs(), g);
      REQUIRE(dq2.data == dq.data);
      REQUIRE(dk2.data == dk.data);
      REQUIRE(dv2.data == dv.data);
    }
  }
}

TEST_CASE("dsa rejects bad parameters and missing index inputs", "[dsa]") {
  CHECK_THROWS_AS(make_problem("dsa", {{"topk", 0}}), UsageError);
  CHECK_THROWS_AS(make_problem("dsa", {{"index_heads", 0}}), UsageError);
  CHECK_THROWS_AS(make_problem("dsa", {{"index_dim", dsa::kMaxIndexDim + 1}}), UsageError);
  CHECK_THROWS_AS(make_problem("dsa", {{"topk", 2.5}}), UsageError);
  CHECK_THROWS_WITH(make_problem("dsa", {{"top_k", 8}}), Catch::Contains("topk"));
  DsaCase c(1, 2, 0, 4, 4, 8, 8, "causal", {{"topk", 2}, {"index_heads", 2}, {"index_dim", 2}}, 61);
  AttentionInputs in = c.inputs();
  in.index_k = nullptr;
  CHECK_THROWS_WITH(c.dsa().run(c.p, in), Catch::Contains("index_k"));
  Problem p = c.p;
  p.dropout = 0.1;
  CHECK_THROWS_AS(c.dsa().run(p, c.inputs()), NotSupported);
}
