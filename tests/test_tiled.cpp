// The tiled variant beyond the registry-wide checks: against naive and the fp64 reference with tiny tiles for
// every mask kind, dropout equal to naive's, causal tile skipping, exact zeros, and its exp2 error bound.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/simd.hpp"
#include "common/kernels/vmath.hpp"
#include "common/reference/reference.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"
#include "common/support/tensor.hpp"
#include "tests/support/attention_case.hpp"
#include "variants/tiled/tiled.hpp"

using namespace attn;
using namespace attn::test;

namespace {

const Attention& tiled_variant() {
  return Registry::instance().get("tiled");
}

// Seeded inputs for one problem. The boolean mask allows 70% of keys and hides every key from query rows 0
// and seq_q / 2 (when seq_q >= 3); batch b pads its last b * seq_kv / 3 keys, and batch 3 pads all of them.
AttentionCase tiled_case(Problem problem, uint64_t seed, double logit_std = 1.0) {
  AttentionCase c(std::move(problem), seed * 3 + 1, logit_std);
  const Problem& p = c.p;
  if (p.mask.boolean)
    c.random_mask(seed * 7 + 5, 0.7,
                  p.seq_q >= 3 ? std::vector<int64_t>{0, p.seq_q / 2} : std::vector<int64_t>{});
  if (p.mask.key_padding)
    c.pad_keys([&](int64_t b, int64_t j) { return j >= p.seq_kv - (b >= 3 ? p.seq_kv : b * p.seq_kv / 3); });
  return c;
}

Problem shape(int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_kv, int64_t dim, const char* mask) {
  return make_test_problem("tiled", batch, heads, seq_q, seq_kv, dim, mask);
}

DoubleArray to_double(const FloatArray& x) {
  DoubleArray d(x.shape);
  for (std::size_t e = 0; e < x.numel(); ++e) d.data[e] = x.data[e];
  return d;
}

// Tile shapes that make every query tile and key tile count, with tails: tile_q != tile_kv both ways, 1-wide
// tiles, and the cache-derived defaults.
const std::vector<Json> kTinyTiles = {{{"tile_q", 4}, {"tile_kv", 8}},   {{"tile_q", 3}, {"tile_kv", 5}},
                                      {{"tile_q", 1}, {"tile_kv", 1}},   {{"tile_q", 17}, {"tile_kv", 2}},
                                      {{"tile_q", 40}, {"tile_kv", 33}}, Json::object()};

}  // namespace

TEST_CASE("tiled matches the fp64 reference and naive for every mask kind with tiny tiles", "[tiled]") {
  const char* masks[] = {"none", "causal", "bool", "pad", "bool+pad", "causal+pad", "causal+bool+pad"};
  uint64_t seed = 100;
  for (int64_t seq : {1, 7, 17, 130}) {
    for (int64_t dim : {1, 17, 64}) {
      for (const char* mask : masks) {
        // Batch 4 so key padding reaches a fully padded batch; 2 heads so head offsets are exercised.
        AttentionCase data = tiled_case(shape(4, 2, seq, seq, dim, mask), ++seed);
        const DoubleArray want = data.reference();
        const DoubleArray base = to_double(data.run_as("naive"));
        const double tol = data.tolerance();
        for (const Json& tiles : kTinyTiles) {
          const FloatArray got = data.run_as("tiled", tiles);
          const ErrorMetrics ref = compare_outputs(got.ptr(), want.ptr(), data.rows(), dim);
          // naive and tiled are each within tol of the reference, so within 2 tol of each other.
          const ErrorMetrics vs_naive = compare_outputs(got.ptr(), base.ptr(), data.rows(), dim);
          INFO("seq " << seq << " dim " << dim << " mask " << mask << " tiles " << tiles.dump()
                      << ": vs reference " << ref.max_abs_err << ", vs naive " << vs_naive.max_abs_err
                      << ", bound " << tol);
          REQUIRE(ref.nan_count == 0);
          REQUIRE(ref.inf_count == 0);
          CHECK(ref.max_abs_err <= tol);
          CHECK(vs_naive.max_abs_err <= 2 * tol);
        }
      }
    }
  }
}

TEST_CASE("tiled cross-attention (seq_q != seq_kv) matches the reference", "[tiled]") {
  uint64_t seed = 200;
  for (auto [lq, lkv] : {std::pair<int64_t, int64_t>{7, 130}, {130, 7}, {1, 17}, {17, 1}, {33, 64}}) {
    for (const char* mask : {"none", "causal", "pad", "causal+bool+pad"}) {
      AttentionCase data = tiled_case(shape(4, 1, lq, lkv, 17, mask), ++seed);
      const DoubleArray want = data.reference();
      const double tol = data.tolerance();
      for (const Json& tiles : kTinyTiles) {
        const FloatArray got = data.run_as("tiled", tiles);
        const ErrorMetrics m = compare_outputs(got.ptr(), want.ptr(), data.rows(), data.p.head_dim);
        INFO("Lq " << lq << " Lkv " << lkv << " mask " << mask << " tiles " << tiles.dump() << ": "
                   << m.max_abs_err << " (bound " << tol << ")");
        REQUIRE(m.nan_count + m.inf_count == 0);
        CHECK(m.max_abs_err <= tol);
      }
    }
  }
}

TEST_CASE("tiled causal skips only key tiles above the diagonal, for tile_q != tile_kv", "[tiled]") {
  // Rectangular tiles put the diagonal at every offset inside a tile; a skipped tile that held an allowed key
  // (or a kept key beyond the diagonal) moves the output by order max|v|, far above the bound.
  AttentionCase data = tiled_case(shape(1, 2, 130, 130, 16, "causal"), 300);
  const DoubleArray want = data.reference();
  const double tol = data.tolerance();
  for (auto [tq, tkv] :
       {std::pair<int, int>{16, 5}, {5, 16}, {7, 64}, {64, 7}, {129, 1}, {1, 129}, {48, 128}}) {
    const FloatArray got = data.run_as("tiled", {{"tile_q", tq}, {"tile_kv", tkv}});
    const ErrorMetrics m = compare_outputs(got.ptr(), want.ptr(), data.rows(), 16);
    INFO("tile_q " << tq << " tile_kv " << tkv << ": " << m.max_abs_err << " (bound " << tol << ")");
    CHECK(m.nan_count == 0);
    CHECK(m.max_abs_err <= tol);
  }
  // Row 0 sees only key 0: its output is v_0 to within the bound.
  const FloatArray got = data.run_as("tiled", {{"tile_q", 3}, {"tile_kv", 4}});
  for (int64_t d = 0; d < 16; ++d) CHECK(std::fabs(got.data[d] - data.v.data[d]) <= tol);
}

TEST_CASE("tiled gives exact zeros for fully masked rows, never NaN", "[tiled]") {
  for (const Json& tiles : kTinyTiles) {
    // Rows 0 and seq/2 have no allowed key (boolean mask); batch 3 pads every key.
    AttentionCase data = tiled_case(shape(4, 2, 37, 37, 17, "bool+pad"), 400);
    const FloatArray got = data.run_as("tiled", tiles);
    int64_t zero_rows = 0;
    for (int64_t b = 0; b < 4; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 37; ++i) {
          const bool empty = b == 3 || i == 0 || i == 37 / 2;
          if (!empty) continue;
          ++zero_rows;
          for (int64_t d = 0; d < 17; ++d) {
            const float x = got.data[((b * 2 + h) * 37 + i) * 17 + d];
            INFO("tiles " << tiles.dump() << " b " << b << " h " << h << " row " << i << " dim " << d);
            REQUIRE(x == 0.0f);  // exactly zero: also fails for NaN
            REQUIRE(!std::signbit(x));
          }
        }
    CHECK(zero_rows == 2 * 37 + 3 * 2 * 2);
  }
}

TEST_CASE("tiled handles a row whose only allowed key lies in its last key tile", "[tiled]") {
  // The running max stays -inf through every earlier tile, then becomes finite: the -inf bookkeeping must
  // neither leak NaN nor lose the late key. Row i may attend key seq - 1 - (i % 3) only.
  Problem p = shape(1, 1, 20, 20, 8, "bool");
  AttentionCase data = tiled_case(p, 500);
  std::fill(data.mask.data.begin(), data.mask.data.end(), uint8_t{0});
  for (int64_t i = 0; i < 20; ++i) data.mask.data[i * 20 + 19 - i % 3] = 1;
  for (const Json& tiles : kTinyTiles) {
    const FloatArray got = data.run_as("tiled", tiles);
    for (int64_t i = 0; i < 20; ++i)
      for (int64_t d = 0; d < 8; ++d) {
        INFO("tiles " << tiles.dump() << " row " << i);
        // One allowed key: weight exactly 2^0 / 2^0 = 1, so the output is that value row exactly.
        CHECK(got.data[i * 8 + d] == data.v.data[(19 - i % 3) * 8 + d]);
      }
  }
}

TEST_CASE("tiled stays exact with logits near and beyond +-88 and a max that moves every tile", "[tiled]") {
  SECTION("gaussian logits reaching ~+-90") {
    // q, k ~ N(0, 4.6^2) at head_dim 16: scale * q.k reaches about +-90, where exp overflows in fp32.
    for (const char* mask : {"none", "causal", "pad"}) {
      AttentionCase data = tiled_case(shape(4, 2, 65, 65, 16, mask), 600, 4.6);
      const DoubleArray want = data.reference();
      for (const Json& tiles : kTinyTiles) {
        const FloatArray got = data.run_as("tiled", tiles);
        const ErrorMetrics m = compare_outputs(got.ptr(), want.ptr(), data.rows(), 16);
        INFO(mask << " tiles " << tiles.dump() << ": " << m.max_abs_err << " (bound " << data.tolerance()
                  << ")");
        CHECK(m.nan_count + m.inf_count == 0);
        CHECK(m.max_abs_err <= data.tolerance());
      }
    }
  }
  SECTION("increasing logits: the running max moves at every key tile") {
    // head_dim 1, scale 1: logit_ij = q_i k_j with k_j rising from -88 to +300, so every tile raises the max
    // and the running output must be rescaled each time; without the rescale the error is of order max|v|.
    AttentionCase data = tiled_case(shape(1, 1, 9, 97, 1, "none"), 700);
    data.p.scale = 1.0;
    for (int64_t j = 0; j < 97; ++j) data.k.data[j] = -88.0f + 388.0f * static_cast<float>(j) / 96.0f;
    for (int64_t i = 0; i < 9; ++i)
      data.q.data[i] = 0.125f * static_cast<float>(i);  // row 0: uniform weights
    const DoubleArray want = data.reference();
    for (const Json& tiles : kTinyTiles) {
      const FloatArray got = data.run_as("tiled", tiles);
      const ErrorMetrics m = compare_outputs(got.ptr(), want.ptr(), 9, 1);
      INFO("tiles " << tiles.dump() << ": " << m.max_abs_err << " (bound " << data.tolerance() << ")");
      CHECK(m.nan_count + m.inf_count == 0);
      CHECK(m.max_abs_err <= data.tolerance());
    }
  }
}

TEST_CASE("tiled dropout makes naive's keep decisions: same seed, same output", "[tiled]") {
  for (const char* mask : {"none", "causal", "causal+bool+pad"}) {
    Problem p = shape(4, 2, 70, 70, 24, mask);
    p.dropout = 0.3, p.seed = 1234;
    AttentionCase data = tiled_case(p, 800);
    const double tol = data.tolerance();  // includes the 1 / (1 - p) growth
    const DoubleArray want = data.reference();
    const DoubleArray base = to_double(data.run_as("naive"));
    for (const Json& tiles : kTinyTiles) {
      const FloatArray got = data.run_as("tiled", tiles);
      const ErrorMetrics vs_naive = compare_outputs(got.ptr(), base.ptr(), data.rows(), 24);
      const ErrorMetrics vs_ref = compare_outputs(got.ptr(), want.ptr(), data.rows(), 24);
      INFO(mask << " tiles " << tiles.dump() << ": vs naive " << vs_naive.max_abs_err << ", vs reference "
                << vs_ref.max_abs_err << " (bound " << tol << ")");
      CHECK(vs_naive.nan_count == 0);
      CHECK(vs_naive.max_abs_err <= 2 * tol);
      CHECK(vs_ref.max_abs_err <= tol);
    }
    // Dropout is really applied: another seed, or none, moves the output by far more than the bound.
    AttentionCase other = data;
    other.p.seed = 99;
    const FloatArray reseeded = other.run_as("tiled");
    CHECK(compare_outputs(reseeded.ptr(), want.ptr(), data.rows(), 24).max_abs_err > 100 * tol);
    other.p.dropout = 0;
    const FloatArray undropped = other.run_as("tiled");
    CHECK(compare_outputs(undropped.ptr(), want.ptr(), data.rows(), 24).max_abs_err > 100 * tol);
  }
}

TEST_CASE("tiled is bitwise identical at 1 and 2 threads with the default tiles", "[tiled]") {
  // Several query tiles per head and a key tail, so the two threads really split the work.
  for (const char* mask : {"none", "causal+pad"}) {
    AttentionCase data = tiled_case(shape(2, 3, 700, 700, 64, mask), 900);
    FloatArray one, two;
    {
      ThreadScope scope(1);
      one = data.run_as("tiled");
    }
    {
      ThreadScope scope(2);
      two = data.run_as("tiled");
    }
    CHECK(std::memcmp(one.ptr(), two.ptr(), one.numel() * sizeof(float)) == 0);
    CHECK(compare_outputs(one.ptr(), data.reference().ptr(), data.rows(), 64).max_abs_err <=
          data.tolerance());
  }
}

TEST_CASE("tiled workspace is O(1) in the sequence length and linear in threads", "[tiled]") {
  Problem p = shape(1, 8, 65536, 65536, 64, "causal");
  const std::size_t at_64k = tiled_variant().workspace_bytes(p, 2);
  p.seq_q = p.seq_kv = 4096;
  CHECK(tiled_variant().workspace_bytes(p, 2) == at_64k);
  CHECK(tiled_variant().workspace_bytes(p, 2) == 2 * tiled_variant().workspace_bytes(p, 1));
  CHECK(at_64k < std::size_t{64} << 20);  // the 65536-token budget: Q, K, V, O plus 64 MiB
  CHECK(at_64k > 0);
}

TEST_CASE("the exp2 polynomial is within its documented error bound on every supported SIMD target",
          "[tiled][simd]") {
  // Every logit difference in [-88, 0] (exp domain) is x in [-127, 0] once log2(e) is folded into the scale.
  // Bound: 1.5 ulp of the exact 2^x while the result is normal (x >= -126); below, results are flushed to 0,
  // an absolute error under 2^-126 (common/kernels/simd-inl.hpp says why that is harmless for softmax
  // weights).
  std::vector<float> x;
  for (double t = -127.0; t <= 0.0; t += 1.0 / 4099) x.push_back(static_cast<float>(t));  // ~520k points
  for (float t = -150.0f; t <= -120.0f; t += 0.01f) x.push_back(t);
  // Every fp32 value in [-1, -1/2] (a whole binade, 2^23 values, exhaustive), and tiny differences near 0:
  // the largest weights, those of keys near the max, come from there.
  for (float t = -1.0f; t <= -0.5f; t = std::nextafter(t, 0.0f)) x.push_back(t);
  for (int e = 1; e <= 60; ++e) x.push_back(-std::ldexp(1.0f, -e));
  x.push_back(0.0f);
  for (const std::string& isa : simd::isa_info().supported) {
    DYNAMIC_SECTION("on " << isa) {
      const simd::ScopedIsa scoped(isa);
      REQUIRE(simd::active_isa() == isa);
      std::vector<float> y(x.size());
      exp2_array(x.data(), y.data(), static_cast<int64_t>(x.size()));
      double worst_ulp = 0, worst_abs_denormal = 0;
      float worst_x = 0;
      for (std::size_t e = 0; e < x.size(); ++e) {
        const double exact = std::exp2(static_cast<double>(x[e]));
        const double err = std::fabs(static_cast<double>(y[e]) - exact);
        if (x[e] >= -126.0f) {
          // ulp of the exact value: 2^(floor(log2 exact) - 23).
          const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
          if (err / ulp > worst_ulp) worst_ulp = err / ulp, worst_x = x[e];
        } else {
          worst_abs_denormal = std::max(worst_abs_denormal, err);
        }
      }
      INFO("worst " << worst_ulp << " ulp at x = " << worst_x << "; worst denormal abs error "
                    << worst_abs_denormal);
      CHECK(worst_ulp <= 1.5);
      CHECK(worst_abs_denormal < std::ldexp(1.0, -126));
      CHECK(x.size() > 8'000'000);  // the exhaustive part really ran

      // Special values: exactly 1 at 0 (the max element), exactly 0 for -inf and far below, NaN kept.
      const float specials[] = {
          0.0f, -std::numeric_limits<float>::infinity(), -200.0f, -1e30f, std::nanf(""), -1.0f, -126.0f};
      float out[7];
      exp2_array(specials, out, 7);
      CHECK(out[0] == 1.0f);
      CHECK(out[1] == 0.0f);
      CHECK(out[2] == 0.0f);
      CHECK(out[3] == 0.0f);
      CHECK(std::isnan(out[4]));
      CHECK(out[5] == 0.5f);
      CHECK(out[6] == std::ldexp(1.0f, -126));
    }
  }
}

TEST_CASE("tiled lets a NaN input show in the output instead of hiding it", "[tiled]") {
  AttentionCase data = tiled_case(shape(1, 1, 20, 20, 8, "none"), 1000);
  data.k.data[5 * 8 + 3] = std::nanf("");  // key 5 is NaN: every row's weights are undefined
  for (const Json& tiles : kTinyTiles) {
    const FloatArray got = data.run_as("tiled", tiles);
    int64_t nan_rows = 0;
    for (int64_t i = 0; i < 20; ++i) nan_rows += std::isnan(got.data[i * 8]) ? 1 : 0;
    INFO("tiles " << tiles.dump());
    CHECK(nan_rows == 20);
  }
}

// Decode shapes: one query per head against a KV cache of up to 4096 keys, lower-right causal, grouped-query
// and not. Batch 1 leaves fewer (batch, K/V head, query tile) units than kSplitTarget, so the key range is
// split (flash-decoding); batch 8 x 4 K/V heads reaches it, so the same rows run unsplit. Both must match the
// fp64 reference and be bitwise equal at 1 and 2 threads (the split count comes from the problem).
TEST_CASE("tiled decode, split-KV and unsplit, matches the reference and is bitwise equal across threads",
          "[tiled]") {
  struct Shape {
    int64_t batch, heads, kv_heads, seq_kv;
  };
  for (const Shape s : {Shape{1, 4, 1, 4096}, Shape{1, 8, 2, 3000}, Shape{1, 2, 2, 4096},
                        Shape{8, 4, 4, 1500}, Shape{8, 8, 4, 4096}}) {
    Problem p = shape(s.batch, s.heads, 1, s.seq_kv, 64, "causal_lower_right");
    p.kv_heads = s.kv_heads;
    INFO(p.repro());
    AttentionCase data = tiled_case(p, 4100 + s.seq_kv);
    FloatArray one, two;
    {
      ThreadScope scope(1);
      one = data.run();
    }
    {
      ThreadScope scope(2);
      two = data.run();
    }
    CHECK(std::memcmp(one.ptr(), two.ptr(), one.numel() * sizeof(float)) == 0);
    CHECK(compare_outputs(one.ptr(), data.reference().ptr(), data.rows(), 64).max_abs_err <=
          data.tolerance());
  }
}

TEST_CASE("tiled split-KV merge matches the reference with masks that empty whole splits", "[tiled]") {
  // 2 x 2 heads = 4 units: 4 splits of 512 keys. Padding hides the last third of batch entry 1's keys, and
  // the boolean mask hides keys 0..1599, so three of the four splits see no key (max -inf) and must weigh 0.
  for (const char* mask : {"causal_lower_right", "causal_lower_right+pad", "bool"}) {
    Problem p = shape(2, 2, 1, 2048, 32, mask);
    INFO(mask);
    AttentionCase data = tiled_case(p, 77);
    if (p.mask.boolean)  // keys 0..1599 hidden: the first three 512-key splits see nothing
      for (int64_t j = 0; j < 1600; ++j) data.mask.data[j] = 0;
    const FloatArray got = data.run();
    CHECK(compare_outputs(got.ptr(), data.reference().ptr(), data.rows(), 32).max_abs_err <=
          data.tolerance());
    CHECK(count_nonfinite(got.ptr(), got.numel()) == 0);
  }
}

TEST_CASE("tiled reads grouped K/V heads in place: workspace does not grow with the K/V size", "[tiled]") {
  // A copy of K/V per query head would cost heads x seq_kv x head_dim floats; the workspace stays far below
  // one K/V head even at 131072 keys.
  Problem p = shape(1, 32, 1, 131072, 128, "causal_lower_right");
  p.kv_heads = 8;
  const std::size_t one_kv_head = static_cast<std::size_t>(p.seq_kv * p.head_dim) * sizeof(float);
  CHECK(tiled_variant().workspace_bytes(p, 2) < one_kv_head / 8);
  // Its own byte count is the compulsory traffic: Q, K and V of 8 K/V heads, O, once each.
  CHECK(tiled_variant().bytes_moved(p) == compulsory_bytes(p));
  CHECK(compulsory_bytes(p) == 4.0 * (2 * 32 * 128 + 2 * 8 * 131072 * 128));
}

// ---- bf16 storage: the native kernels (vdpbf16ps for Q K^T and P V, P rounded to bf16) and widening ----

namespace {

// Whether the CPU reports avx512_bf16 (vdpbf16ps).
bool cpu_flag_bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

// Whether the native kernels can run here: the CPU flag and the AVX-512 target selected.
bool cpu_has_bf16_dot() {
  return cpu_flag_bf16() && simd::active_isa().rfind("avx3", 0) == 0;
}

// The bf16_kernel value that runs the native kernels where they can run: native (auto picks them only where
// vdpbf16ps measured faster than the fp32 FMA, tiled::bf16_dot_rate_ratio), else auto (which widens).
const char* native_kernel() {
  return cpu_has_bf16_dot() ? "native" : "auto";
}

double max_abs(const FloatArray& x) {
  double m = 0;
  for (float e : x.data) m = std::max(m, std::fabs(static_cast<double>(e)));
  return m;
}

}  // namespace

namespace {
// The bf16 precision test's problems: masks, grouped-query heads, tile tails, dropout, decode tiles.
struct Bf16Case {
  int64_t batch, heads, kv_heads, seq_q, seq_kv, dim;
  const char* mask;
  double dropout;
  Json params;
};
const Bf16Case kBf16Cases[] = {
    {2, 3, 0, 33, 33, 64, "none", 0, Json::object()},
    {2, 3, 0, 33, 33, 64, "causal+pad", 0, Json::object()},
    {1, 4, 2, 130, 130, 32, "causal", 0, Json::object()},  // grouped-query heads
    {1, 2, 0, 300, 300, 64, "causal", 0, Json::object()},  // 300 = 2 x 128 + 44 query rows
    {1, 2, 0, 1000, 1000, 64, "none", 0, Json::object()},  // key tiles 512 + 488
    {2, 2, 0, 40, 70, 24, "bool", 0, Json::object()},      // cross, boolean mask
    {2, 4, 2, 100, 100, 16, "causal+pad", 0, {{"tile_q", 33}, {"tile_kv", 16}}},
    {1, 2, 0, 77, 77, 64, "none", 0, {{"tile_q", 33}, {"tile_kv", 7}}},  // odd key tiles: packed per tile
    {1, 2, 0, 200, 200, 64, "causal", 0.1, Json::object()},              // dropout
    // Decode-sized tiles (at most 8 rows: the dot-product kernels, vdpbf16ps pairs where native): 4 query
    // heads per K/V head, split-KV; 8 rows (2 positions x 4) on odd key tiles; MHA with dropout and key
    // padding; head_dim 48 (not a multiple of 32: those tiles widen even when native).
    {1, 8, 2, 1, 1500, 64, "causal_lower_right", 0, Json::object()},
    {1, 4, 1, 2, 777, 128, "causal_lower_right", 0, {{"tile_kv", 7}}},
    {2, 2, 0, 1, 300, 32, "causal_lower_right+pad", 0.1, Json::object()},
    {1, 4, 2, 1, 500, 48, "none", 0, Json::object()},
    // Tiles of 8 and 16 rows (AMX where the CPU has it): 8 and 16 query heads per K/V head, odd key tiles,
    // and 2 positions x 8 heads with key padding and dropout.
    {1, 16, 2, 1, 1500, 64, "causal_lower_right", 0, Json::object()},
    {1, 16, 1, 1, 700, 128, "causal_lower_right", 0, {{"tile_kv", 7}}},
    {2, 8, 1, 2, 300, 32, "causal_lower_right+pad", 0.1, Json::object()},
};
}  // namespace

TEST_CASE(
    "tiled bf16: native P V within 2x the baseline with bf16 weights, widening within 2x naive, both within "
    "their derived bounds, on masks, grouped-query heads, dropout and tile tails",
    "[tiled][precision]") {
  // The bar is FlashAttention's test rule: the kernel's max error against fp64 on the rounded inputs
  // at most 2x that of the baseline computed in the same arithmetic. Rounding P to bf16 (what the native
  // P V multiplies) moves a weight by up to 2^-8 of itself: every such kernel is ~1e-3 from fp64, where
  // naive, which widens to fp32, is ~1e-7, so the native path is held to naive's definition with its
  // weights rounded to bf16 (reference_attention's `weights`, PyTorch's softmax(S).to(bf16) @ V), and to
  // abs_tolerance, which adds the rounding's first-order bound 2 u_w / (1 - u_w) max|v| (u_w = 2^-8:
  // l sums the same rounded weights, so they still sum to one and only their spread moves the output;
  // reference.cpp). The widening path keeps P in fp32 and is held to naive itself.
  const bool native = cpu_has_bf16_dot();
  if (!native) WARN("no vdpbf16ps here (or not the avx3 target): only the widening path runs");
  const bool amx = tiled::amx_unavailable().empty();
  if (!amx) WARN("no AMX here: " << tiled::amx_unavailable());
  const Attention& naive = Registry::instance().get("naive");
  uint64_t seed = 40;
  for (const Bf16Case& cs : kBf16Cases) {
    for (const char* kernel : {native_kernel(), "widen", "amx"}) {
      if (std::string(kernel) == "amx" && (!amx || cs.dim % 32)) continue;  // amx refuses other widths
      Json params = cs.params;
      params["bf16_kernel"] = kernel;
      Problem p =
          make_test_problem("tiled", cs.batch, cs.heads, cs.seq_q, cs.seq_kv, cs.dim, cs.mask, params);
      p.kv_heads = cs.kv_heads;
      p.dropout = cs.dropout;
      p.seed = 7;
      p.dtype = DType::bf16;
      AttentionCase c = tiled_case(p, ++seed);
      const StoredInputs stored(p, c.inputs(nullptr));
      const AttentionInputs& in = stored.get();
      const int64_t rows = c.rows();
      DoubleArray want(c.q.shape), rounded(c.q.shape);
      reference_attention(p, in, want.ptr());
      reference_attention(p, in, rounded.ptr(), nullptr, DType::bf16);
      FloatArray got(c.q.shape, std::nanf("")), base(c.q.shape, std::nanf(""));
      AttentionInputs io = in;
      io.out = got.ptr();
      tiled_variant().run(p, io);
      Problem pn = c.for_variant("naive");
      pn.dtype = DType::bf16;
      io.out = base.ptr();
      naive.run(pn, io);
      FloatArray rounded_f(c.q.shape);
      for (std::size_t e = 0; e < rounded.numel(); ++e)
        rounded_f.data[e] = static_cast<float>(rounded.data[e]);
      const double err = compare_outputs(got.ptr(), want.ptr(), rows, cs.dim).max_abs_err;
      const double naive_err = compare_outputs(base.ptr(), want.ptr(), rows, cs.dim).max_abs_err;
      const double b16_err = compare_outputs(rounded_f.ptr(), want.ptr(), rows, cs.dim).max_abs_err;
      const double slack = std::ldexp(max_abs(c.v), -22);  // as the registry check: 4 ulps of max|v|
      const bool rounds = tiled_variant().weight_dtype(p) == DType::bf16;
      INFO(p.repro() << ": error " << err << ", naive " << naive_err << " (ratio " << err / naive_err
                     << "), baseline with bf16 weights " << b16_err << ", tolerance "
                     << tiled_variant().abs_tolerance(p, in));
      // Every tile rounds its weights under native, except dot-product tiles whose widths are not multiples
      // of 32: here the one-position decode case of head_dim 48 (the other cases' tiles hold > 8 rows).
      const bool dot_widened = cs.seq_q == 1 && cs.dim % 32 != 0;
      if (std::string(kernel) != "amx") {
        CHECK(rounds == (native && std::string(kernel) == "native" && !dot_widened));
      } else if (cs.seq_q <= 2) {  // decode-sized: one tile of seq_q x group rows, on AMX at 5..16 rows
        const int64_t tile_rows = cs.seq_q * (cs.kv_heads ? cs.heads / cs.kv_heads : 1);
        CHECK(rounds == (tiled::amx_tile_rows(tile_rows) && cs.dim % 32 == 0));
      }
      CHECK(err <= tiled_variant().abs_tolerance(p, in));
      if (rounds) {
        CHECK(err <= 2 * b16_err + slack);
        CHECK(err > 4 * naive_err);  // the rounding shows: this is not the fp32 path
      } else {
        CHECK(err <= 2 * naive_err + slack);
      }
      // Deterministic: the same bits at 1 and 2 threads.
      FloatArray one(c.q.shape);
      {
        ThreadScope scope(1);
        io.out = one.ptr();
        tiled_variant().run(p, io);
      }
      CHECK(std::memcmp(one.ptr(), got.ptr(), got.numel() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("tiled bf16: the normaliser sums the same rounded weights that multiply V, so they sum to one",
          "[tiled][precision]") {
  // One-hot values (v_j = e_j, 64 keys, 64 dims): output d is key d's weight. With l the sum of the very
  // rounded weights the outputs sum to 1 within fp32 rounding; with l summed from the unrounded ones they
  // would miss it by up to 2^-8. The weights themselves differ from fp64's by the bf16 rounding (native) or
  // by fp32 rounding only (widen).
  for (const char* kernel : {native_kernel(), "widen"}) {
    Problem p = make_test_problem("tiled", 1, 2, 64, 64, 64, "none", {{"bf16_kernel", kernel}});
    p.dtype = DType::bf16;
    AttentionCase c(p, 5, 2.0);
    for (int64_t bh = 0; bh < 2; ++bh)
      for (int64_t j = 0; j < 64; ++j)
        for (int64_t d = 0; d < 64; ++d) c.v_at(bh, j, d) = j == d ? 1.0f : 0.0f;
    const StoredInputs stored(p, c.inputs(nullptr));
    AttentionInputs in = stored.get();
    FloatArray got(c.q.shape);
    in.out = got.ptr();
    tiled_variant().run(p, in);
    DoubleArray want(c.q.shape);
    reference_attention(p, stored.get(), want.ptr());
    double worst_sum = 0, worst_rel = 0;
    for (int64_t r = 0; r < c.rows(); ++r) {
      double sum = 0;
      for (int64_t d = 0; d < 64; ++d) {
        sum += got.data[r * 64 + d];
        const double w = want.data[r * 64 + d];
        if (w > 1e-3) worst_rel = std::max(worst_rel, std::fabs(got.data[r * 64 + d] - w) / w);
      }
      worst_sum = std::max(worst_sum, std::fabs(sum - 1));
    }
    const bool rounds = tiled_variant().weight_dtype(p) == DType::bf16;
    INFO(kernel << ": |sum - 1| " << worst_sum << ", worst relative weight error " << worst_rel);
    CHECK(worst_sum <= 64 * std::ldexp(1.0, -23));
    // A weight moves by its own rounding and the sum's: at most 2^-7 / (1 - 2^-8) relative (plus fp32).
    CHECK(worst_rel <= (rounds ? std::ldexp(1.0, -7) * 1.01 : std::ldexp(1.0, -16)));
    if (rounds) CHECK(worst_rel > std::ldexp(1.0, -12));  // bf16, not fp32
  }
}

TEST_CASE(
    "tiled bf16_kernel: native where the CPU and target cannot is a clear error, and info names the kernel",
    "[tiled][precision]") {
  Problem p = make_test_problem("tiled", 1, 2, 64, 64, 64, "none", {{"bf16_kernel", "native"}});
  p.dtype = DType::bf16;
  const std::string kernel = tiled_variant().kernels().at("bf16").get<std::string>();
  if (cpu_has_bf16_dot()) {
    // auto follows the measured rate: the native kernels where vdpbf16ps beats the fp32 FMA's products per
    // second, widening (and fp32 weights) where it does not.
    const double ratio = tiled::bf16_dot_rate_ratio();
    INFO("vdpbf16ps / FMA multiply-add rate " << ratio << "; " << kernel);
    CHECK(ratio > 0.05);
    CHECK(ratio < 20);
    const bool faster = ratio >= tiled::kBf16DotMinRatio;
    CHECK_THAT(kernel, Catch::Contains(faster ? "vdpbf16ps (AVX512_BF16; measured faster"
                                              : "widen to fp32 (vdpbf16ps measured slower"));
    CHECK(tiled_variant().unsupported_reasons_text(p).empty());
    CHECK(tiled_variant().weight_dtype(p) == DType::bf16);  // native forced
    Problem autop = p;
    autop.params["bf16_kernel"] = "auto";
    CHECK(tiled_variant().weight_dtype(autop) == (faster ? DType::bf16 : DType::fp32));
  } else {
    CHECK_THAT(kernel, Catch::StartsWith("widen to fp32 ("));
    CHECK_THAT(tiled_variant().unsupported_reasons_text(p), Catch::Contains("bf16_kernel=native: "));
  }
  // An odd head_dim cannot pair its elements.
  Problem odd = p;
  odd.head_dim = 63;
  CHECK_THAT(
      tiled_variant().unsupported_reasons_text(odd),
      Catch::Contains("bf16_kernel=native needs an even head_dim (vdpbf16ps multiplies pairs), got 63"));
  // bf16_kernel=amx: runs where the CPU and kernel grant AMX, else a clear error naming why; it needs whole
  // 32-value tile rows.
  Problem amxp = p;
  amxp.params["bf16_kernel"] = "amx";
  if (const std::string why = tiled::amx_unavailable(); why.empty()) {
    CHECK(tiled_variant().unsupported_reasons_text(amxp).empty());
    CHECK_THAT(kernel,
               Catch::StartsWith("query tiles of 5-16 rows (decode) on AMX-BF16 (TDPBF16PS), others "));
  } else {
    CHECK_THAT(tiled_variant().unsupported_reasons_text(amxp), Catch::Contains("bf16_kernel=amx: " + why));
  }
  Problem amx48 = amxp;
  amx48.head_dim = 48;
  CHECK_THAT(
      tiled_variant().unsupported_reasons_text(amx48),
      Catch::Contains("bf16_kernel=amx needs head_dim and d_v multiples of 32 (whole tile rows), got 48"));
  // fp32 and fp16 storage ignore the parameter.
  Problem f16 = p;
  f16.dtype = DType::fp16;
  CHECK(tiled_variant().unsupported_reasons_text(f16).empty());
  // A SIMD target below AVX-512 widens under auto and refuses native, naming the CPU flag or the target.
  if (std::find(simd::isa_info().supported.begin(), simd::isa_info().supported.end(), "avx2") !=
      simd::isa_info().supported.end()) {
    const simd::ScopedIsa isa("avx2");
    CHECK_THAT(tiled_variant().kernels().at("bf16").get<std::string>(), Catch::StartsWith("widen to fp32 ("));
    const std::string why = tiled_variant().unsupported_reasons_text(p);
    CHECK_THAT(why, Catch::Contains("bf16_kernel=native: "));
    CHECK_THAT(why, Catch::Contains(cpu_flag_bf16() ? "the selected SIMD target avx2 is not AVX-512 (avx3)"
                                                    : "avx512_bf16"));
    Problem autop = p;
    autop.params["bf16_kernel"] = "auto";
    CHECK(tiled_variant().weight_dtype(autop) == DType::fp32);
  }
}

// ---- V of another width than Q and K (Capabilities::value_dim): V [batch][kv_heads][seq_kv][d_v], O and dO
// [batch][heads][seq_q][d_v], d_v = value_dim(). ----

namespace {

// Q, K (head_dim wide) and V (d_v wide) ~ N(0, 1) from `seed`; key padding as tiled_case's.
struct ValueDimCase {
  Problem p;
  FloatArray q, k, v;
  ByteArray pad;
  ValueDimCase(Problem problem, uint64_t seed) : p(std::move(problem)) {
    q = normal_tensor({p.batch, p.heads, p.seq_q, p.head_dim}, seed * 3 + 1);
    k = normal_tensor({p.batch, p.num_kv_heads(), p.seq_kv, p.head_dim}, seed * 3 + 2);
    v = normal_tensor({p.batch, p.num_kv_heads(), p.seq_kv, p.value_dim()}, seed * 3 + 3);
    if (p.mask.key_padding) {
      pad = ByteArray({p.batch, p.seq_kv});
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t j = 0; j < p.seq_kv; ++j)
          pad.data[b * p.seq_kv + j] = j >= p.seq_kv - (b >= 3 ? p.seq_kv : b * p.seq_kv / 3) ? 1 : 0;
    }
  }
  AttentionInputs inputs(float* o) const {
    return {q.ptr(), k.ptr(), v.ptr(), nullptr, p.mask.key_padding ? pad.ptr() : nullptr, o};
  }
  std::vector<int64_t> out_shape() const { return {p.batch, p.heads, p.seq_q, p.value_dim()}; }
};

Problem value_dim_problem(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_q, int64_t seq_kv,
                          int64_t dk, int64_t dv, const char* mask, const Json& params = Json::object()) {
  Problem p = make_test_problem("tiled", batch, heads, seq_q, seq_kv, dk, mask, params);
  p.kv_heads = kv_heads;
  p.v_head_dim = dv;
  return p;
}

// tiled's forward against the fp64 reference within abs_tolerance (16-bit storage: on the rounded inputs),
// and, in fp32, within 2x that bound of naive; bitwise equal at 1 and 2 threads. Returns the output.
FloatArray check_value_dim_forward(const Problem& p, uint64_t seed) {
  INFO(p.repro());
  const ValueDimCase c(p, seed);
  const StoredInputs stored(p, c.inputs(nullptr));
  const AttentionInputs& in = stored.get();
  FloatArray one(c.out_shape(), std::nanf("")), two(c.out_shape(), std::nanf(""));
  {
    ThreadScope scope(1);
    AttentionInputs io = in;
    io.out = one.ptr();
    tiled_variant().run(p, io);
  }
  {
    ThreadScope scope(2);
    AttentionInputs io = in;
    io.out = two.ptr();
    tiled_variant().run(p, io);
  }
  CHECK(std::memcmp(one.ptr(), two.ptr(), one.numel() * sizeof(float)) == 0);
  DoubleArray want(c.out_shape());
  tiled_variant().reference_forward(p, in, want.ptr());
  const int64_t rows = p.batch * p.heads * p.seq_q;
  const double tol = tiled_variant().abs_tolerance(p, in);
  const ErrorMetrics m = compare_outputs(one.ptr(), want.ptr(), rows, p.value_dim());
  INFO("max_abs_err " << m.max_abs_err << " (bound " << tol << ")");
  REQUIRE(m.nan_count + m.inf_count == 0);
  CHECK(m.max_abs_err <= tol);
  if (p.dtype == DType::fp32) {
    Problem pn = make_problem("naive");
    pn.batch = p.batch, pn.heads = p.heads, pn.kv_heads = p.kv_heads, pn.seq_q = p.seq_q,
    pn.seq_kv = p.seq_kv;
    pn.head_dim = p.head_dim, pn.v_head_dim = p.v_head_dim, pn.mask = p.mask;
    FloatArray base(c.out_shape(), std::nanf(""));
    AttentionInputs io = in;
    io.out = base.ptr();
    Registry::instance().get("naive").run(pn, io);
    const ErrorMetrics mb = compare_outputs(one.ptr(), to_double(base).ptr(), rows, p.value_dim());
    INFO("vs naive " << mb.max_abs_err);
    CHECK(mb.max_abs_err <= 2 * tol);
  }
  return one;
}

// tiled's training step against the fp64 gradient within grad_tolerance: dQ, dK head_dim wide, dV d_v
// wide; the training forward's O bitwise run()'s.
void check_value_dim_backward(const Problem& p, uint64_t seed) {
  INFO(p.repro());
  const ValueDimCase c(p, seed);
  const StoredInputs stored(p, c.inputs(nullptr));
  const AttentionInputs& in = stored.get();
  const Attention& t = tiled_variant();
  FloatArray out(c.out_shape(), std::nanf("")), ref_out(c.out_shape(), std::nanf(""));
  AttentionInputs io = in;
  io.out = ref_out.ptr();
  t.run(p, io);
  io.out = out.ptr();
  std::vector<float> saved(t.saved_floats(p), std::nanf(""));
  t.run_saving(p, io, saved.data());
  CHECK(std::memcmp(out.ptr(), ref_out.ptr(), out.numel() * sizeof(float)) == 0);
  const FloatArray d_out = normal_tensor(c.out_shape(), seed * 3 + 7);
  FloatArray dq(c.q.shape, std::nanf("")), dk(c.k.shape, std::nanf("")), dv(c.v.shape, std::nanf(""));
  GradientArgs g;
  g.out = out.ptr();
  g.saved = saved.data();
  g.d_out = d_out.ptr();
  g.dq = dq.ptr(), g.dk = dk.ptr(), g.dv = dv.ptr();
  t.run_backward(p, in, g);
  DoubleArray wq(c.q.shape), wk(c.k.shape), wv(c.v.shape);
  t.reference_backward(p, in, d_out.ptr(), wq.ptr(), wk.ptr(), wv.ptr());
  const GradientTolerance tol = t.grad_tolerance(p, in, d_out.ptr());
  struct Part {
    const char* name;
    const FloatArray& got;
    const DoubleArray& want;
    double tol;
    int64_t width;
  };
  for (const Part& pt : {Part{"dq", dq, wq, tol.dq, p.head_dim}, Part{"dk", dk, wk, tol.dk, p.head_dim},
                         Part{"dv", dv, wv, tol.dv, p.value_dim()}}) {
    const ErrorMetrics m = compare_outputs(pt.got.ptr(), pt.want.ptr(),
                                           static_cast<int64_t>(pt.got.numel()) / pt.width, pt.width);
    INFO(pt.name << " max_abs_err " << m.max_abs_err << " (bound " << pt.tol << ")");
    REQUIRE(m.nan_count + m.inf_count == 0);
    CHECK(m.max_abs_err <= pt.tol);
  }
}

struct Widths {
  int64_t dk, dv;
};
// DeepSeek MLA (576 / 512), its no-RoPE split (192 / 128), 320 / 256, and odd widths either way round.
const Widths kValueWidths[] = {{576, 512}, {192, 128}, {320, 256}, {24, 40}, {40, 8}, {17, 33}, {33, 5}};

}  // namespace

TEST_CASE("tiled with d_v != d_k: forward and backward against fp64, causal and not, tiny and default tiles",
          "[tiled][value_dim]") {
  uint64_t seed = 9000;
  for (const Widths w : kValueWidths) {
    const int64_t seq = w.dk >= 192 ? 70 : 130;  // the wide heads: fewer rows, still several tiles
    for (const char* mask : {"none", "causal", "causal+pad"})
      for (const Json& tiles : {Json{{"tile_q", 17}, {"tile_kv", 16}}, Json::object()}) {
        const Problem p = value_dim_problem(4, 2, 0, seq, seq, w.dk, w.dv, mask, tiles);
        check_value_dim_forward(p, ++seed);
        check_value_dim_backward(p, ++seed);
      }
    // Cross-attention both ways.
    check_value_dim_forward(value_dim_problem(1, 2, 0, 9, 40, w.dk, w.dv, "causal_lower_right"), ++seed);
    check_value_dim_backward(value_dim_problem(1, 2, 0, 40, 9, w.dk, w.dv, "causal"), ++seed);
  }
}

TEST_CASE("tiled with d_v != d_k: grouped-query and multi-query heads", "[tiled][value_dim]") {
  uint64_t seed = 9100;
  for (const Widths w : kValueWidths)
    for (int64_t kv_heads : {2, 1})
      for (const char* mask : {"none", "causal"}) {
        const Problem p = value_dim_problem(2, 4, kv_heads, 33, 33, w.dk, w.dv, mask);
        check_value_dim_forward(p, ++seed);
        check_value_dim_backward(p, ++seed);
      }
}

TEST_CASE("tiled with d_v != d_k: decode (1..4 queries) against long K/V, split-KV and dot-product tiles",
          "[tiled][value_dim]") {
  // One batch entry and one or two K/V heads: few units, so split-KV cuts 2048 keys into 512-key splits;
  // tiles of at most kDotRows rows run the dot-product kernels. The backward recomputes those tiles' logits
  // with the same kernels.
  uint64_t seed = 9200;
  for (const Widths w : kValueWidths)
    for (int64_t seq_q : {1, 2, 4})
      for (int64_t kv_heads : {1, 2}) {
        const Problem p = value_dim_problem(1, 4, kv_heads, seq_q, 2048, w.dk, w.dv, "causal_lower_right");
        check_value_dim_forward(p, ++seed);
        if (seq_q == 2) check_value_dim_backward(p, ++seed);
      }
}

TEST_CASE("tiled with d_v != d_k: bf16 and fp16 storage, native and widening kernels", "[tiled][value_dim]") {
  if (!cpu_has_bf16_dot()) WARN("no vdpbf16ps here (or not the avx3 target): only the widening path runs");
  uint64_t seed = 9300;
  for (const Widths w : kValueWidths) {
    if (w.dk % 2) continue;  // the native kernels take an even head_dim; auto widens otherwise (below)
    for (const char* kernel : {native_kernel(), "widen"})
      for (const char* mask : {"none", "causal"}) {
        Problem p = value_dim_problem(2, 4, 2, 40, 40, w.dk, w.dv, mask, {{"bf16_kernel", kernel}});
        p.dtype = DType::bf16;
        check_value_dim_forward(p, ++seed);
        check_value_dim_backward(p, ++seed);
        p = value_dim_problem(1, 4, 1, 2, 1500, w.dk, w.dv, "causal_lower_right", {{"bf16_kernel", kernel}});
        p.dtype = DType::bf16;  // decode: widened dot-product tiles, split-KV
        check_value_dim_forward(p, ++seed);
      }
  }
  for (const Widths w : kValueWidths) {
    Problem p = value_dim_problem(2, 2, 0, 40, 40, w.dk, w.dv, "causal");
    p.dtype = DType::fp16;
    check_value_dim_forward(p, ++seed);
    p.dtype = DType::bf16;  // odd head_dim under auto: widened
    check_value_dim_forward(p, ++seed);
  }
}

TEST_CASE("tiled with d_v != d_k: block partials over two key blocks match the whole problem",
          "[tiled][value_dim]") {
  uint64_t seed = 9400;
  for (const Widths w : kValueWidths) {
    // The first block has 1100 keys: two splits of its key range (split-KV inside accumulate_block).
    const Problem whole = value_dim_problem(1, 4, 2, 20, 1600, w.dk, w.dv, "none");
    INFO(whole.repro());
    const ValueDimCase c(whole, ++seed);
    const int64_t rows = whole.batch * whole.heads * whole.seq_q, dv = w.dv;
    std::vector<float> m(to_size(rows)), l(to_size(rows)), o(to_size(rows * dv));
    const BlockState st{m.data(), l.data(), o.data()};
    const Attention& t = tiled_variant();
    t.init_block_state(whole, st);
    // Two key blocks of one K/V head each (batch 1: K/V head kvh's keys are rows kvh * seq_kv ..), copied out
    // so each block is a contiguous [kv_heads][n][d] tensor.
    for (auto [j0, n] : {std::pair<int64_t, int64_t>{0, 1100}, {1100, 500}}) {
      Problem p = whole;
      p.seq_kv = n;
      FloatArray kb({1, 2, n, w.dk}), vb({1, 2, n, dv});
      for (int64_t h = 0; h < 2; ++h) {
        std::copy_n(c.k.ptr() + (h * whole.seq_kv + j0) * w.dk, n * w.dk, kb.ptr() + h * n * w.dk);
        std::copy_n(c.v.ptr() + (h * whole.seq_kv + j0) * dv, n * dv, vb.ptr() + h * n * dv);
      }
      t.accumulate_block(p, {c.q.ptr(), kb.ptr(), vb.ptr(), nullptr, nullptr, nullptr}, st);
    }
    FloatArray got(c.out_shape(), std::nanf(""));
    t.finish_block_state(whole, st, got.ptr());
    DoubleArray want(c.out_shape());
    const AttentionInputs in = c.inputs(nullptr);
    t.reference_forward(whole, in, want.ptr());
    const ErrorMetrics e = compare_outputs(got.ptr(), want.ptr(), rows, dv);
    const double tol = t.abs_tolerance(whole, in);
    INFO("max_abs_err " << e.max_abs_err << " (bound " << tol << ")");
    REQUIRE(e.nan_count + e.inf_count == 0);
    CHECK(e.max_abs_err <= tol);
  }
}
