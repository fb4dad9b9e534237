// bigbird against its definition: the block pattern on hand examples (written here from the definition, not
// from the pattern code), the random draw (causal: strictly in the past; seeded), the block budget of a row,
// the weights the kernel applies (probed through V = identity), full attention when one block covers the
// sequence, the flop count and parameter errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "common/interface/attention.hpp"
#include "common/kernels/mask.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/tensor.hpp"
#include "tests/support/attention_case.hpp"
#include "variants/bigbird/pattern.hpp"

using namespace attn;
using namespace attn::test;
using attn::bigbird::Pattern;

namespace {

std::vector<int64_t> blocks_of(std::initializer_list<int64_t> b) {
  return std::vector<int64_t>(b);
}

// Sorted blocks of [lo, hi).
std::vector<int64_t> span(int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  for (int64_t b = lo; b < hi; ++b) out.push_back(b);
  return out;
}

Json bigbird_params(int64_t block, int64_t window, int64_t globals, int64_t randoms, int64_t seed = 0) {
  return {{"block", block},
          {"window_blocks", window},
          {"global_blocks", globals},
          {"random_blocks", randoms},
          {"seed", seed}};
}

}  // namespace

TEST_CASE("bigbird pattern: window and global blocks on a hand example", "[bigbird]") {
  // seq 22, block 4: 6 blocks, the last one partial (positions 20, 21). No random blocks.
  SECTION("non-causal, g = 2: the first and the last block are global") {
    const Pattern pat(22, 4, 3, 2, 0, 0, false);
    REQUIRE(pat.blocks == 6);
    REQUIRE(pat.positions(5).begin == 20);
    REQUIRE(pat.positions(5).end == 22);
    CHECK(pat.key_blocks(0) == span(0, 6));  // global query block: every key block
    CHECK(pat.key_blocks(5) == span(0, 6));
    CHECK(pat.key_blocks(1) == blocks_of({0, 1, 2, 5}));
    CHECK(pat.key_blocks(2) == blocks_of({0, 1, 2, 3, 5}));
    CHECK(pat.key_blocks(4) == blocks_of({0, 3, 4, 5}));
    CHECK(pat.allows(9, 21));        // block 2 -> global block 5
    CHECK_FALSE(pat.allows(9, 17));  // block 2 -> block 4: outside the window
    CHECK(pat.allows(21, 9));        // global query block 5 sees block 2
  }
  SECTION("non-causal, g = 3: the first two and the last block") {
    const Pattern pat(22, 4, 1, 3, 0, 0, false);
    CHECK(pat.first_globals() == 2);
    CHECK(pat.last_globals() == 1);
    CHECK(pat.key_blocks(3) == blocks_of({0, 1, 3, 5}));
    CHECK(pat.key_blocks(1) == span(0, 6));
  }
  SECTION("causal, g = 2: the first two blocks, nothing after the diagonal block") {
    const Pattern pat(22, 4, 3, 2, 0, 0, true);
    CHECK(pat.key_blocks(0) == blocks_of({0}));
    CHECK(pat.key_blocks(1) == blocks_of({0, 1}));  // global query block: its past only
    CHECK(pat.key_blocks(3) == blocks_of({0, 1, 2, 3}));
    CHECK(pat.key_blocks(5) == blocks_of({0, 1, 4, 5}));  // the last block is not global under causal
    CHECK(pat.allows(21, 20));
    CHECK_FALSE(pat.allows(20, 21));  // inside the diagonal block: key <= query
    CHECK_FALSE(pat.allows(21, 9));   // block 2 is neither window nor global for block 5
  }
  SECTION("fewer blocks than window + global + random: every block") {
    const Pattern pat(22, 4, 3, 2, 3, 9, false);
    for (int64_t qb = 0; qb < pat.blocks; ++qb) CHECK(pat.key_blocks(qb) == span(0, 6));
  }
}

TEST_CASE("bigbird pattern: random blocks", "[bigbird]") {
  // seq 160, block 4: 40 blocks; window 3, g = 2, r = 3.
  const Pattern a(160, 4, 3, 2, 3, 11, false), again(160, 4, 3, 2, 3, 11, false);
  const Pattern other(160, 4, 3, 2, 3, 12, false);
  bool seed_changes_draw = false;
  for (int64_t qb = 1; qb < a.blocks - 1; ++qb) {
    const std::vector<int64_t> r = a.random_blocks(qb);
    INFO("query block " << qb);
    REQUIRE(r.size() == 3);
    const std::set<int64_t> distinct(r.begin(), r.end());
    CHECK(distinct.size() == 3);
    for (int64_t kb : r) {
      CHECK(kb >= 0);
      CHECK(kb < a.blocks);
      CHECK(std::abs(kb - qb) > 1);            // not a window block
      CHECK((kb != 0 && kb != a.blocks - 1));  // not a global block
    }
    CHECK(again.random_blocks(qb) == r);  // the seed reproduces the draw
    seed_changes_draw |= other.random_blocks(qb) != r;
    if (qb >= 2 && qb <= a.blocks - 3)
      CHECK(a.key_blocks(qb).size() == 8);  // 3 window + 2 global + 3 random, all distinct
  }
  CHECK(seed_changes_draw);
  CHECK(a.random_blocks(0).empty());  // global query blocks draw none
  CHECK(a.random_blocks(a.blocks - 1).empty());

  SECTION("causal: strictly before the diagonal block, and independent of the sequence length") {
    const Pattern c(160, 4, 3, 1, 3, 11, true), longer(400, 4, 3, 1, 3, 11, true);
    for (int64_t qb = 1; qb < c.blocks; ++qb) {
      INFO("query block " << qb);
      const std::vector<int64_t> r = c.random_blocks(qb);
      // Candidates: blocks 1 .. qb-2 (block 0 global, qb-1 in the window, qb the diagonal).
      CHECK(static_cast<int64_t>(r.size()) == std::clamp<int64_t>(qb - 2, 0, 3));
      for (int64_t kb : r) {
        CHECK(kb >= 1);
        CHECK(kb < qb - 1);
      }
      CHECK(longer.random_blocks(qb) == r);
      for (int64_t kb : c.key_blocks(qb)) CHECK(kb <= qb);
    }
  }
}

TEST_CASE("bigbird: a non-global row attends at most window + global + random blocks", "[bigbird]") {
  struct Setting {
    int64_t seq, block, window, globals, randoms;
  };
  for (const Setting s : {Setting{130, 1, 3, 1, 2}, Setting{130, 4, 1, 2, 3}, Setting{130, 5, 3, 0, 2},
                          Setting{200, 4, 5, 3, 1}, Setting{64, 16, 3, 2, 3}}) {
    const Pattern pat(s.seq, s.block, s.window, s.globals, s.randoms, 3, false);
    const int64_t blocks = (s.seq + s.block - 1) / s.block, h = s.window / 2;
    // The definition: the first ceil(g/2) and the last floor(g/2) blocks are global.
    std::set<int64_t> globals;
    for (int64_t g = 0; g < std::min(blocks, (s.globals + 1) / 2); ++g) globals.insert(g);
    for (int64_t g = 0; g < s.globals / 2; ++g) globals.insert(std::max<int64_t>(0, blocks - 1 - g));
    const std::vector<uint8_t> m = pat.dense_mask();
    for (int64_t i = 0; i < s.seq; ++i) {
      const int64_t qb = i / s.block;
      std::set<int64_t> seen;
      for (int64_t j = 0; j < s.seq; ++j)
        if (m[static_cast<std::size_t>(i * s.seq + j)]) seen.insert(j / s.block);
      INFO("seq " << s.seq << " block " << s.block << " row " << i);
      if (globals.count(qb)) {
        CHECK(static_cast<int64_t>(seen.size()) == blocks);  // a global row sees every block
        continue;
      }
      // Window and global blocks, then min(r, what is left) random ones: never more than w + g + r.
      std::set<int64_t> fixed = globals;
      for (int64_t b = std::max<int64_t>(0, qb - h); b <= std::min(blocks - 1, qb + h); ++b) fixed.insert(b);
      const int64_t want = static_cast<int64_t>(fixed.size()) +
                           std::min(s.randoms, blocks - static_cast<int64_t>(fixed.size()));
      CHECK(static_cast<int64_t>(seen.size()) == want);
      CHECK(static_cast<int64_t>(seen.size()) <= s.window + s.globals + s.randoms);
      for (int64_t b : fixed) CHECK(seen.count(b) == 1);
      // Whole key blocks: a key is allowed iff its block is.
      for (int64_t j = 0; j < s.seq; ++j)
        CHECK(static_cast<bool>(m[static_cast<std::size_t>(i * s.seq + j)]) ==
              (seen.count(j / s.block) == 1));
    }
  }
}

TEST_CASE("bigbird: the kernel's weights are nonzero exactly on the pattern", "[bigbird]") {
  // V = identity (head_dim = seq): output row i is the weight row i. Logits of moderate size, so every
  // allowed weight is far above 0.
  const int64_t n = 48;
  for (const bool causal : {false, true}) {
    for (const Json& params :
         {bigbird_params(4, 3, 2, 2, 5), bigbird_params(5, 1, 1, 3, 2), bigbird_params(3, 3, 0, 1, 8)}) {
      AttentionCase c(make_test_problem("bigbird", 1, 2, n, n, n, causal ? "causal" : "none", params), 17,
                      0.3);
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t d = 0; d < n; ++d) c.v.data[static_cast<std::size_t>((h * n + j) * n + d)] = j == d;
      const FloatArray w = c.run();
      const Pattern pat(n, params["block"], params["window_blocks"], params["global_blocks"],
                        params["random_blocks"], params["seed"].get<uint64_t>(), causal);
      INFO(c.p.repro());
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < n; ++i) {
          double sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            const float x = w.data[static_cast<std::size_t>((h * n + i) * n + j)];
            sum += x;
            if (pat.allows(i, j))
              CHECK(x > 0.0f);
            else
              CHECK(x == 0.0f);
          }
          CHECK(std::fabs(sum - 1.0) < 1e-5);
        }
    }
  }
}

TEST_CASE("bigbird equals exact attention when the blocks cover the sequence", "[bigbird]") {
  // One block (block >= seq), or a window wider than the sequence with no global or random block.
  const int64_t n = 50;
  for (const Json& params :
       {bigbird_params(64, 3, 2, 3), bigbird_params(50, 1, 0, 0), bigbird_params(4, 27, 0, 0)}) {
    for (const char* mask : {"none", "causal", "causal+pad", "bool"}) {
      AttentionCase c(make_test_problem("bigbird", 2, 2, n, n, 16, mask, params), 41);
      if (c.p.mask.key_padding) c.pad_keys([](int64_t b, int64_t j) { return b == 1 && j % 3 == 0; });
      if (c.p.mask.boolean) c.random_mask(7, 0.6, {2});
      const FloatArray got = c.run();
      DoubleArray want({c.p.batch, c.p.heads, n, c.p.head_dim});
      const AttentionInputs in = c.inputs(nullptr);
      reference_attention(c.p, in, want.ptr());  // exact softmax attention, no pattern
      const ErrorMetrics m = compare_outputs(got.ptr(), want.ptr(), c.p.batch * c.p.heads * n, c.p.head_dim);
      INFO(c.p.repro() << ": max_abs_err " << m.max_abs_err);
      CHECK(m.nan_count == 0);
      CHECK(m.max_abs_err <= exact_abs_tolerance(c.p, in));
    }
  }
}

TEST_CASE("bigbird: flops count the pattern's pairs", "[bigbird]") {
  const Attention& v = Registry::instance().get("bigbird");
  for (const bool causal : {false, true})
    for (const int64_t n : {1, 13, 77}) {
      // Partial last blocks with g <= 1 (whether a block drew the last one depends on the draw), no
      // global block, a window wider than the sequence, more random blocks than candidates, one block.
      for (const Json& params :
           {bigbird_params(4, 3, 2, 2, 5), bigbird_params(5, 1, 1, 3), bigbird_params(3, 1, 0, 2, 4),
            bigbird_params(4, 9, 1, 2, 6), bigbird_params(7, 3, 2, 30), bigbird_params(64, 3, 2, 3),
            bigbird_params(1, 5, 3, 4), bigbird_params(6, 41, 0, 1)}) {
        Problem p = make_test_problem("bigbird", 2, 3, n, n, 8, causal ? "causal" : "none", params);
        const Pattern pat(n, params["block"], params["window_blocks"], params["global_blocks"],
                          params["random_blocks"], params["seed"].get<uint64_t>(), causal);
        double pairs = 0;
        for (uint8_t m : pat.dense_mask()) pairs += m;
        INFO(p.repro());
        CHECK(v.flops(p) == 4.0 * 2 * 3 * 8 * pairs);
        CHECK(v.flops(p) <= exact_attention_flops(p));
      }
    }
}

TEST_CASE("bigbird: parameter errors name the parameter", "[bigbird]") {
  REQUIRE_THROWS_WITH(make_problem("bigbird", {{"block", 0}}), Catch::Contains("block"));
  REQUIRE_THROWS_WITH(make_problem("bigbird", {{"random_blocks", -1}}), Catch::Contains("random_blocks"));
  Problem p = make_test_problem("bigbird", 1, 1, 16, 16, 4, "none", {{"window_blocks", 4}});
  const Attention& v = Registry::instance().get("bigbird");
  REQUIRE_THROWS_AS(v.not_supported_reasons(p), UsageError);
  REQUIRE_THROWS_WITH(v.flops(p), Catch::Contains("window_blocks") && Catch::Contains("odd"));
}

TEST_CASE("bigbird: rows longer than one score step (online softmax over several steps)", "[bigbird]") {
  // Steps are 512 score columns: global rows of a 700-long sequence take 2, and so do ordinary rows with
  // 5 blocks of 128 keys. Against the variant's own fp64 definition, with every mask kind, dropout and ALiBi.
  const Attention& v = Registry::instance().get("bigbird");
  const int64_t n = 700;
  for (const Json& params : {bigbird_params(64, 3, 2, 3, 1), bigbird_params(128, 3, 0, 2, 2)}) {
    for (const char* mask : {"none", "causal+pad", "bool"}) {
      for (const bool extras : {false, true}) {
        AttentionCase c(make_test_problem("bigbird", 2, 2, n, n, 8, mask, params), 23);
        if (c.p.mask.key_padding) c.pad_keys([](int64_t b, int64_t j) { return b == 1 && j % 5 == 0; });
        if (c.p.mask.boolean) c.random_mask(3, 0.5, {0, 650});
        if (extras) {
          c.p.dropout = 0.2, c.p.seed = 77;
          c.p.bias = Bias::alibi;
        }
        const FloatArray got = c.run();
        DoubleArray want({c.p.batch, c.p.heads, n, c.p.head_dim});
        const AttentionInputs in = c.inputs(nullptr);
        v.reference_forward(c.p, in, want.ptr());
        const ErrorMetrics m =
            compare_outputs(got.ptr(), want.ptr(), c.p.batch * c.p.heads * n, c.p.head_dim);
        INFO(c.p.repro() << ": max_abs_err " << m.max_abs_err);
        CHECK(m.nan_count == 0);
        CHECK(m.max_abs_err <= v.abs_tolerance(c.p, in));
      }
    }
  }
}

// ---- Backward ----

namespace {

struct Grads {
  FloatArray dq, dk, dv;
};

// One training step of bigbird on c's inputs: run_saving, then run_backward with `d_out`.
Grads train(const AttentionCase& c, const FloatArray& d_out) {
  const Attention& v = Registry::instance().get("bigbird");
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

double max_abs_diff(const FloatArray& a, const DoubleArray& b) {
  double worst = 0;
  for (std::size_t e = 0; e < a.numel(); ++e) {
    const double d = std::fabs(static_cast<double>(a.data[e]) - b.data[e]);
    worst = std::max(worst, std::isnan(d) ? INFINITY : d);
  }
  return worst;
}

}  // namespace

TEST_CASE("bigbird backward at sizes the registry checks do not reach", "[bigbird]") {
  // The registry's gradient checks run seq <= 130: here 64-row blocks with random blocks beyond the window,
  // global query rows longer than one 512-column score step, global key blocks whose columns take two
  // 512-row query steps, a partial last block, grouped-query heads, every mask kind, dropout and ALiBi,
  // against the fp64 gradient of the definition.
  const Attention& v = Registry::instance().get("bigbird");
  const int64_t n = 600, D = 16;
  uint64_t seed = 900;
  for (const Json& params : {bigbird_params(64, 3, 2, 3, 1), bigbird_params(48, 1, 3, 2, 4)}) {
    for (const char* mask : {"none", "causal+pad", "bool"}) {
      Problem p = make_test_problem("bigbird", 2, 4, n, n, D, mask, params);
      p.kv_heads = 2;
      AttentionCase c(p, ++seed);
      if (c.p.mask.key_padding) c.pad_keys([](int64_t b, int64_t j) { return b == 1 && j % 5 == 0; });
      if (c.p.mask.boolean) c.random_mask(++seed, 0.7, {0, 550});
      if (c.p.mask.any_causal()) c.p.dropout = 0.2, c.p.seed = 3, c.p.bias = Bias::alibi;
      const FloatArray d_out = normal_tensor(c.q.shape, ++seed);
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
  }
}

TEST_CASE("bigbird backward: keys nothing attends and rows that attend nothing get exact zeros",
          "[bigbird]") {
  // Blocks of 4, block 0 global, no random blocks. Key 21 is masked out of every row, key 22 is padded in
  // batch 1, and rows 2 (a global row) and 17 attend nothing: their gradients are exactly 0, not merely
  // small.
  const int64_t n = 48, D = 8;
  AttentionCase c(make_test_problem("bigbird", 2, 2, n, n, D, "bool+pad", bigbird_params(4, 3, 1, 0)), 41);
  c.random_mask(5, 1.0, {2, 17});
  for (int64_t i = 0; i < n; ++i) c.mask.data[i * n + 21] = 0;
  c.pad_keys([](int64_t b, int64_t j) { return b == 1 && j == 22; });
  const Grads g = train(c, normal_tensor(c.q.shape, 42));
  auto row_is_zero = [&](const FloatArray& x, int64_t bh, int64_t i) {
    for (int64_t d = 0; d < D; ++d)
      if (x.data[(bh * n + i) * D + d] != 0.0f) return false;
    return true;
  };
  for (int64_t bh = 0; bh < 4; ++bh) {
    INFO("batch " << bh / 2 << " head " << bh % 2);
    CHECK((row_is_zero(g.dk, bh, 21) && row_is_zero(g.dv, bh, 21)));
    if (bh >= 2) CHECK((row_is_zero(g.dk, bh, 22) && row_is_zero(g.dv, bh, 22)));
    for (int64_t i : {2, 17}) CHECK(row_is_zero(g.dq, bh, i));
    CHECK_FALSE(row_is_zero(g.dk, bh, 20));  // a key that rows do attend
  }
}
