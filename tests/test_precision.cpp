// Storage precisions, ALiBi slopes and RoPE (#14) beyond the registry-wide checks (common/reference/check.cpp
// runs every dtype- and ALiBi-capable variant against the fp64 oracle and the 2x-naive rule).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/kernels/alibi.hpp"
#include "common/kernels/rope.hpp"
#include "common/support/random.hpp"

using namespace attn;

namespace {

// The reference rounding: every finite value of the 16-bit format as a double, sorted; the nearest one to
// x wins, a tie goes to the even bit pattern, and x beyond the largest finite value by at least half an
// ulp of it goes to infinity (IEEE round to nearest even). Independent of the bit tricks in half.hpp.
struct Format {
  std::vector<std::pair<double, uint16_t>> finite;  // non-negative finite values
  double overflow = 0;                              // |x| >= this rounds to infinity
  uint16_t inf = 0;
  Format(DType t) {
    for (uint32_t h = 0; h < 0x8000; ++h) {
      const float f = widen(t, static_cast<uint16_t>(h));
      if (std::isfinite(f)) finite.push_back({static_cast<double>(f), static_cast<uint16_t>(h)});
    }
    std::sort(finite.begin(), finite.end());
    const double max = finite.back().first, below = finite[finite.size() - 2].first;
    overflow = max + (max - below) / 2;
    inf = t == DType::bf16 ? 0x7f80 : 0x7c00;
  }
  uint16_t round(float xf) const {
    const double x = std::fabs(static_cast<double>(xf));
    const uint16_t sign = std::signbit(xf) ? 0x8000 : 0;
    if (x >= overflow) return sign | inf;
    auto it = std::lower_bound(finite.begin(), finite.end(), std::make_pair(x, uint16_t{0}));
    if (it == finite.end()) return sign | finite.back().second;  // above the largest, below the threshold
    if (it->first == x || it == finite.begin()) return sign | it->second;
    const auto lo = *(it - 1), hi = *it;
    const double dlo = x - lo.first, dhi = hi.first - x;
    if (dlo < dhi) return sign | lo.second;
    if (dhi < dlo) return sign | hi.second;
    return sign | ((lo.second & 1) == 0 ? lo.second : hi.second);
  }
};

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

TEST_CASE("bf16 and fp16 rounding matches round-to-nearest-even on special values and ties", "[precision]") {
  for (DType t : {DType::bf16, DType::fp16}) {
    const Format ref(t);
    std::vector<float> xs = {0.0f,
                             -0.0f,
                             1.0f,
                             -1.0f,
                             65504.0f,
                             65519.99f,
                             65520.0f,
                             65536.0f,
                             std::numeric_limits<float>::max(),
                             std::numeric_limits<float>::min(),
                             std::numeric_limits<float>::denorm_min(),
                             1e-8f,
                             5.96e-8f,
                             2.98e-8f,
                             6.1e-5f,
                             3.0e38f,
                             3.4e38f,
                             1.0f / 3.0f,
                             0.1f};
    // Every midpoint between neighbours (ties), and one float either side of each, over the whole range
    // (subnormals of both formats included), sampled.
    for (std::size_t i = 0; i + 1 < ref.finite.size(); i += (i < 2048 ? 1 : 7)) {
      const double mid = (ref.finite[i].first + ref.finite[i + 1].first) / 2;
      const float m = static_cast<float>(mid);
      if (static_cast<double>(m) != mid) continue;  // not representable in fp32: no exact tie to test
      xs.push_back(m);
      xs.push_back(std::nextafter(m, 0.0f));
      xs.push_back(std::nextafter(m, INFINITY));
      xs.push_back(-m);
    }
    Rng rng(7);
    for (int i = 0; i < 20000; ++i) xs.push_back(from_bits(static_cast<uint32_t>(rng.next())));
    int64_t checked = 0;
    for (float x : xs) {
      if (std::isnan(x)) continue;
      const uint16_t got = round_to(t, x), want = ref.round(x);
      INFO(dtype_name(t) << " x = " << x << " got 0x" << std::hex << got << " want 0x" << want);
      REQUIRE(got == want);
      ++checked;
    }
    CHECK(checked > 10000);
    // Infinities stay infinite with their sign; NaN stays NaN (quiet) with its sign, also for signalling
    // NaNs whose payload sits only in the low bits that rounding drops.
    CHECK(std::isinf(widen(t, round_to(t, INFINITY))));
    CHECK(widen(t, round_to(t, -INFINITY)) < 0);
    for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
      const float back = widen(t, round_to(t, from_bits(nan)));
      CHECK(std::isnan(back));
      CHECK(std::signbit(back) == ((nan >> 31) != 0));
    }
    // Widening is exact: every non-NaN 16-bit pattern survives a round trip.
    for (uint32_t h = 0; h < 0x10000; ++h) {
      const float f = widen(t, static_cast<uint16_t>(h));
      if (!std::isnan(f)) REQUIRE(round_to(t, f) == h);
    }
  }
}

TEST_CASE("bulk conversions equal the scalar ones", "[precision]") {
  std::vector<float> x(200000);
  fill_normal(x.data(), static_cast<int64_t>(x.size()), 3, 100.0);
  for (DType t : {DType::bf16, DType::fp16}) {
    std::vector<uint16_t> h(x.size());
    round_tensor(t, x.data(), static_cast<int64_t>(x.size()), h.data());
    std::vector<float> w(x.size());
    widen_tensor(t, h.data(), static_cast<int64_t>(h.size()), w.data());
    const std::vector<float> r = rounded_values(t, x.data(), static_cast<int64_t>(x.size()));
    for (std::size_t i = 0; i < x.size(); i += 13) {
      REQUIRE(h[i] == round_to(t, x[i]));
      REQUIRE(w[i] == widen(t, h[i]));
      REQUIRE(r[i] == w[i]);
    }
  }
}

TEST_CASE("ALiBi default slopes follow the paper's formulas for 8, 12 and 16 heads", "[precision][alibi]") {
  // H = 8: 2^-(h+1). H = 16: 2^-(h+1)/2. H = 12 (not a power of two): n = 8, the first 8 as for H = 8, then
  // m1 = 2^(-4/8) raised to 1, 3, 5, 7.
  const auto s8 = alibi_default_slopes(8), s16 = alibi_default_slopes(16), s12 = alibi_default_slopes(12);
  for (int h = 0; h < 8; ++h) CHECK(s8[h] == Approx(std::pow(2.0, -(h + 1))).epsilon(1e-15));
  for (int h = 0; h < 16; ++h) CHECK(s16[h] == Approx(std::pow(2.0, -(h + 1) / 2.0)).epsilon(1e-15));
  REQUIRE(s12.size() == 12);
  for (int h = 0; h < 8; ++h) CHECK(s12[h] == Approx(std::pow(2.0, -(h + 1))).epsilon(1e-15));
  const double tail[] = {std::pow(2.0, -0.5), std::pow(2.0, -1.5), std::pow(2.0, -2.5), std::pow(2.0, -3.5)};
  for (int h = 8; h < 12; ++h) CHECK(s12[h] == Approx(tail[h - 8]).epsilon(1e-15));
  CHECK(alibi_default_slopes(1)[0] == Approx(std::pow(2.0, -8.0)));
}

TEST_CASE("ALiBi distance: causal alignments and the symmetric form", "[precision][alibi]") {
  Problem p;
  p.seq_q = 3, p.seq_kv = 10;
  CHECK(alibi_distance(p, 1, 4) == 3.0);  // no causal mask: |i - j|
  p.mask.causal = true;
  CHECK(alibi_distance(p, 2, 0) == 2.0);  // upper-left: i - j
  p.mask.causal = false;
  p.mask.causal_lower_right = true;
  CHECK(alibi_distance(p, 2, 9) == 0.0);  // the last query sits at the last key's position
  CHECK(alibi_distance(p, 0, 3) == 4.0);  // query 0 at position 7
}

TEST_CASE("RoPE in both modes matches a direct fp64 rotation, with odd positions and offsets",
          "[precision][rope]") {
  const int64_t blocks = 3, seq = 9, dim = 12;
  std::vector<float> x(static_cast<std::size_t>(blocks * seq * dim));
  fill_normal(x.data(), static_cast<int64_t>(x.size()), 11, 1.0);
  for (RopeMode mode : {RopeMode::normal, RopeMode::neox}) {
    for (double base : {10000.0, 500.0}) {
      for (int64_t offset : {int64_t{0}, int64_t{7}, int64_t{1001}}) {
        std::vector<float> got = x;
        const RopeSpec r{mode, base};
        apply_rope(r, got.data(), blocks, seq, dim, offset);
        double worst = 0;
        for (int64_t row = 0; row < blocks * seq; ++row) {
          const int64_t pos = offset + row % seq;
          for (int64_t i = 0; i < dim / 2; ++i) {
            // Written out here, independently of rope.cpp: pair (a, b) and angle pos * base^(-2i/d).
            const int64_t a = mode == RopeMode::normal ? 2 * i : i;
            const int64_t b = mode == RopeMode::normal ? 2 * i + 1 : i + dim / 2;
            const double th = static_cast<double>(pos) / std::pow(base, 2.0 * i / dim);
            const double xa = x[row * dim + a], xb = x[row * dim + b];
            worst = std::max(worst, std::fabs(got[row * dim + a] - (xa * std::cos(th) - xb * std::sin(th))));
            worst = std::max(worst, std::fabs(got[row * dim + b] - (xa * std::sin(th) + xb * std::cos(th))));
          }
        }
        // cos and sin are rounded once to fp32 (u each), two products and a sum in fp32 (3 more roundings):
        // at most about 5 u (|xa| + |xb|) <= 10 u max|x|; max|x| < 6 for these 324 normals.
        INFO(rope_mode_name(mode) << " base " << base << " offset " << offset);
        CHECK(worst <= 10 * std::ldexp(1.0, -24) * 6);
        // The fp64 oracle agrees with the same formula.
        std::vector<double> xd(x.begin(), x.end()), yd(x.size());
        apply_rope_fp64(r, xd.data(), yd.data(), blocks, seq, dim, offset);
        for (std::size_t e = 0; e < x.size(); ++e)
          REQUIRE(std::fabs(yd[e] - got[e]) <= 10 * std::ldexp(1.0, -24) * 6);
      }
    }
  }
}

TEST_CASE("RoPE makes q.k depend on the position difference only, and Q/K share one table",
          "[precision][rope]") {
  const int64_t dim = 16;
  std::vector<float> q(dim), k(dim);
  fill_normal(q.data(), dim, 5, 1.0);
  fill_normal(k.data(), dim, 6, 1.0);
  auto dot_at = [&](int64_t m, int64_t n) {
    std::vector<float> a = q, b = k;
    apply_rope({RopeMode::neox, 10000.0}, a.data(), 1, 1, dim, m);
    apply_rope({RopeMode::neox, 10000.0}, b.data(), 1, 1, dim, n);
    double s = 0;
    for (int64_t e = 0; e < dim; ++e) s += static_cast<double>(a[e]) * b[e];
    return s;
  };
  CHECK(dot_at(5, 2) == Approx(dot_at(105, 102)).margin(1e-5));
  CHECK(std::fabs(dot_at(5, 2) - dot_at(5, 4)) > 1e-3);  // and it does depend on the difference
  // apply_rope_qk under lower-right: queries at seq_kv - seq_q + i, keys at j.
  Problem p;
  p.batch = 1, p.heads = 2, p.kv_heads = 1, p.seq_q = 3, p.seq_kv = 8, p.head_dim = dim;
  p.mask.causal_lower_right = true;
  std::vector<float> Q(static_cast<std::size_t>(2 * 3 * dim)), K(static_cast<std::size_t>(8 * dim));
  fill_normal(Q.data(), static_cast<int64_t>(Q.size()), 8, 1.0);
  fill_normal(K.data(), static_cast<int64_t>(K.size()), 9, 1.0);
  std::vector<float> Q2 = Q, K2 = K;
  apply_rope_qk({RopeMode::normal, 10000.0}, p, Q.data(), K.data());
  apply_rope({RopeMode::normal, 10000.0}, Q2.data(), 2, 3, dim, 5);
  apply_rope({RopeMode::normal, 10000.0}, K2.data(), 1, 8, dim, 0);
  CHECK(Q == Q2);
  CHECK(K == K2);
  REQUIRE_THROWS_WITH(validate_rope({RopeMode::normal, 10000.0}, 7, "inputs.rope"),
                      Catch::Contains("head_dim must be even, got 7"));
}

namespace {

// Seeded N(0, 1) values, the fp32 inputs a widening variant's 16-bit inputs are rounded from.
std::vector<float> normal_values(int64_t n, uint64_t seed) {
  std::vector<float> x(static_cast<std::size_t>(n));
  fill_normal(x.data(), n, seed, 1.0);
  return x;
}

// A variant that takes bf16 but not fp16, registered nowhere: the refusal text of a missing storage dtype
// (every registered variant takes both).
class Bf16Only final : public Attention {
 public:
  std::string name() const override { return "bf16_only"; }
  std::string description() const override { return "test stand-in"; }
  Capabilities capabilities() const override { return {.bf16 = true}; }
  double flops(const Problem&) const override { return 0; }
  std::size_t workspace_bytes(const Problem&, int) const override { return 0; }

 protected:
  void forward(const Problem&, const AttentionInputs&) const override {}
};

}  // namespace

TEST_CASE("a variant without a storage dtype refuses it by name, with the dtypes it takes",
          "[precision][dtype]") {
  const Bf16Only v;
  Problem p = make_problem("naive");
  p.variant = v.name();
  CHECK(v.unsupported_reasons_text(p).empty());
  p.dtype = DType::bf16;
  CHECK(v.unsupported_reasons_text(p).empty());
  p.dtype = DType::fp16;
  CHECK(v.unsupported_reasons_text(p) == "bf16_only does not take dtype fp16 (it takes fp32, bf16)");
}

// linear, performer, nystrom, sliding_window, bigbird and linformer take bf16 / fp16 by widening Q, K and V
// to fp32 once, up front (WideInputs), and running their fp32 kernel: so on 16-bit inputs they must give
// bitwise the output they give on the fp32 values those inputs widen to, and their fp64 reference and
// tolerance must read the same values. Their workspace grows by exactly the fp32 copies.
TEST_CASE("variants that widen bf16 / fp16 up front compute bitwise what they compute on the widened values",
          "[precision][dtype]") {
  struct Case {
    const char* variant;
    Json params;
    const char* mask;
    int64_t heads, kv_heads, seq_q, seq_kv, head_dim;
  };
  const Case cases[] = {
      {"linear", Json::object(), "none", 4, 2, 19, 19, 17},
      {"linear", {{"chunk", 5}, {"feature_map", "relu"}}, "causal+pad", 2, 0, 33, 33, 16},
      {"performer", {{"features", 17}, {"chunk", 5}}, "causal", 4, 1, 33, 33, 16},
      {"performer", Json::object(), "pad", 2, 0, 9, 40, 24},
      {"nystrom", {{"landmarks", 3}}, "pad", 4, 2, 33, 37, 17},
      {"sliding_window", {{"window", 3}, {"global_tokens", 2}}, "causal+bool", 2, 0, 37, 37, 16},
      {"sliding_window", {{"window", 5}, {"dilation", 2}}, "pad", 4, 2, 40, 40, 8},
      {"bigbird", {{"block", 4}}, "causal+pad", 4, 2, 37, 37, 16},
      {"linformer", {{"k", 5}}, "pad", 2, 0, 17, 23, 8},
  };
  uint64_t seed = 100;
  for (const Case& c : cases)
    for (const DType t : {DType::bf16, DType::fp16}) {
      Problem p32 = make_problem(c.variant, c.params);
      p32.batch = 2, p32.heads = c.heads, p32.kv_heads = c.kv_heads, p32.seq_q = c.seq_q,
      p32.seq_kv = c.seq_kv, p32.head_dim = c.head_dim;
      p32.mask = parse_mask(c.mask, "test");
      Problem p16 = p32;
      p16.dtype = t;
      INFO(p16.repro());
      const Attention& v = Registry::instance().get(c.variant);
      REQUIRE(v.unsupported_reasons_text(p16).empty());

      const int64_t nq = p32.q_elements(), nkv = p32.kv_elements();
      const std::vector<float> q = normal_values(nq, ++seed), k = normal_values(nkv, ++seed),
                               vv = normal_values(nkv, ++seed);
      std::vector<uint8_t> mask, pad;
      if (p32.mask.boolean) {
        Rng rng(++seed);
        for (int64_t e = 0; e < p32.seq_q * p32.seq_kv; ++e) mask.push_back(rng.uniform() < 0.7 ? 1 : 0);
      }
      if (p32.mask.key_padding)
        for (int64_t b = 0; b < p32.batch; ++b)
          for (int64_t j = 0; j < p32.seq_kv; ++j) pad.push_back(j >= p32.seq_kv - 3 * b ? 1 : 0);
      AttentionInputs in32;
      in32.mask = mask.empty() ? nullptr : mask.data();
      in32.key_padding = pad.empty() ? nullptr : pad.data();

      // The 16-bit inputs (rounded from q, k, v) and the fp32 values they widen to.
      in32.q = q.data(), in32.k = k.data(), in32.v = vv.data();
      const StoredInputs stored(p16, in32);
      const std::vector<float> wq = rounded_values(t, q.data(), nq), wk = rounded_values(t, k.data(), nkv),
                               wv = rounded_values(t, vv.data(), nkv);
      AttentionInputs wide = in32;
      wide.q = wq.data(), wide.k = wk.data(), wide.v = wv.data();

      std::vector<float> out16(static_cast<std::size_t>(nq), std::nanf("")), out32(out16), plain(out16);
      AttentionInputs in16 = stored.get();
      in16.out = out16.data();
      v.run(p16, in16);
      wide.out = out32.data();
      v.run(p32, wide);
      CHECK(std::memcmp(out16.data(), out32.data(), out16.size() * sizeof(float)) == 0);
      CHECK(std::all_of(out16.begin(), out16.end(), [](float x) { return std::isfinite(x); }));
      // Not vacuous: the rounding to 16 bits changed the inputs, and so the output.
      in32.out = plain.data();
      v.run(p32, in32);
      CHECK(std::memcmp(out16.data(), plain.data(), out16.size() * sizeof(float)) != 0);

      std::vector<double> ref16(out16.size()), ref32(out16.size());
      v.reference_forward(p16, stored.get(), ref16.data());
      v.reference_forward(p32, wide, ref32.data());
      CHECK(std::memcmp(ref16.data(), ref32.data(), ref16.size() * sizeof(double)) == 0);
      CHECK(v.abs_tolerance(p16, stored.get()) == v.abs_tolerance(p32, wide));

      for (const int threads : {1, 2})
        CHECK(v.workspace_bytes(p16, threads) - v.workspace_bytes(p32, threads) ==
              static_cast<std::size_t>(nq + 2 * nkv) * sizeof(float));
    }
}
