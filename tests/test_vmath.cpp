// The row kernels of common/kernels/vmath.hpp on every SIMD target this CPU supports: every length from 0 to
// 40 (so every vector-tail size of every target runs), against fp64 on the same inputs, with NaN kept
// visible.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/kernels/simd.hpp"
#include "common/kernels/vmath.hpp"

using namespace attn;

namespace {
std::vector<float> random_row(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& e : x) e = dist(gen);
  return x;
}
}  // namespace

TEST_CASE("row kernels match fp64 on every supported SIMD target and every tail length", "[simd][vmath]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const double u = std::ldexp(1.0, -24);
  for (const std::string& isa : simd::isa_info().supported) {
    DYNAMIC_SECTION("on " << isa) {
      const simd::ScopedIsa scoped(isa);
      REQUIRE(simd::active_isa() == isa);
      CHECK(row_max(nullptr, 0) == -inf);
      {
        // softcap saturates: -inf becomes -cap (so callers mask after capping), +inf cap; NaN stays NaN. 20
        // entries: vector bodies and a tail on every target.
        std::vector<float> c(20);
        for (std::size_t j = 0; j < c.size(); ++j) c[j] = j % 3 == 0 ? -inf : j % 3 == 1 ? inf : nan;
        softcap(c.data(), static_cast<int64_t>(c.size()), 5.0f);
        for (std::size_t j = 0; j < c.size(); ++j) {
          INFO("j = " << j);
          if (j % 3 == 2)
            CHECK(std::isnan(c[j]));
          else
            CHECK(c[j] == (j % 3 == 0 ? -5.0f : 5.0f));
        }
      }
      for (int64_t n = 1; n <= 40; ++n) {
        INFO("n = " << n);
        std::vector<float> x = random_row(n, static_cast<uint32_t>(n), -20.0f, 20.0f);
        // row_max: exact; a NaN anywhere (first, last) makes it NaN whatever the lane order.
        float want = -inf;
        for (float e : x) want = std::max(want, e);
        CHECK(row_max(x.data(), n) == want);
        for (int64_t at : {int64_t{0}, n - 1}) {
          std::vector<float> y = x;
          y[at] = nan;
          CHECK(std::isnan(row_max(y.data(), n)));
        }
        // exp_sub_sum: each weight within the bound below, and the
        // sum within n u of the exact sum of the returned weights; -inf entries give exactly 0.
        // One masked (-inf) entry when the row has room for it (callers never pass m = -inf: a fully masked
        // row is handled before the exp).
        std::vector<float> w = x;
        const int64_t masked = n >= 2 ? n / 2 : -1;
        if (masked >= 0) w[static_cast<std::size_t>(masked)] = -inf;
        const float m = row_max(w.data(), n);
        std::vector<float> e = w;
        const float sum = exp_sub_sum(e.data(), n, m);
        double exact_sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          if (j == masked) {
            CHECK(e[static_cast<std::size_t>(j)] == 0.0f);
            continue;
          }
          const double t = static_cast<double>(w[j]) - m;
          const double ref = std::exp(t);
          // 1.5 ulp (<= 3u relative) for the polynomial; |t| u each for rounding x - m, for the log2(e)
          // multiply and (less) for log2(e) itself: 3 |t| u in all.
          CHECK(std::fabs(e[j] - ref) <= ref * (3 * u + 3 * std::fabs(t) * u) + 1e-38);
          exact_sum += e[j];
        }
        CHECK(std::fabs(sum - exact_sum) <= exact_sum * (n + 1) * u);
        // scale_row: one rounding per element.
        std::vector<float> s = x;
        scale_row(s.data(), n, 0.37f);
        for (int64_t j = 0; j < n; ++j) CHECK(s[j] == x[j] * 0.37f);
        // Feature maps: relu exact, elu + 1 within 1 ulp of exp (Highway's) and one rounding of x + 1.
        std::vector<float> xn = random_row(n, static_cast<uint32_t>(100 + n), -10.0f, 10.0f);
        xn[0] = nan;
        std::vector<float> r(xn.size()), el(xn.size());
        relu(xn.data(), r.data(), n);
        elu_plus_one(xn.data(), el.data(), n);
        CHECK(std::isnan(r[0]));
        CHECK(std::isnan(el[0]));
        for (int64_t j = 1; j < n; ++j) {
          CHECK(r[j] == (xn[j] > 0 ? xn[j] : 0.0f));
          const double ref = xn[j] > 0 ? xn[j] + 1.0 : std::exp(static_cast<double>(xn[j]));
          CHECK(std::fabs(el[j] - ref) <= ref * 2 * u);
        }
      }
    }
  }
}

TEST_CASE(
    "ScopedFlushDenormals flushes denormal results to zero, keeps denormal operands, and restores the mode",
    "[vmath]") {
  volatile float tiny = 1e-30f, small = 1e-10f;  // the product, 1e-40, is a denormal
  volatile float denormal = 1e-40f;
  const float before = tiny * small;
  CHECK(before != 0.0f);  // the default mode keeps denormals
  {
    const simd::ScopedFlushDenormals ftz;
#if defined(__x86_64__) || defined(__i386__)
    CHECK(tiny * small == 0.0f);        // a denormal result is flushed
    CHECK(denormal * 0x1p30f != 0.0f);  // a denormal operand is kept (no DAZ): the normal product survives
    CHECK(std::isnan(tiny * std::numeric_limits<float>::quiet_NaN()));  // NaN is untouched
#endif
  }
  CHECK(tiny * small == before);  // restored
}

TEST_CASE("gathered dots and axpys match fp64 on every supported SIMD target and every width",
          "[simd][vmath]") {
  // Rows picked by index, repeated and out of order, from a table with a row stride above the width; widths 1
  // to 40 (every vector tail of every target, and the 4-vector blocks of the axpy). Each dot is d products
  // summed: |error| <= d u sum |q_c r_c| (u = 2^-24, the fp32 unit roundoff; the lane split only reorders the
  // sum), times the scale; each axpy output is n products added to it: <= (n + 1) u sum |w_j r_jc| + u |out|.
  const double u = std::ldexp(1.0, -24);
  const int32_t idx[] = {5, 0, 7, 5, 2, 9, 1};
  const int64_t n = 7, rows_n = 10;
  for (const std::string& isa : simd::isa_info().supported) {
    DYNAMIC_SECTION("on " << isa) {
      const simd::ScopedIsa scoped(isa);
      for (int64_t d = 1; d <= 40; ++d) {
        INFO("d = " << d);
        const int64_t ld = d + 3;
        const std::vector<float> rows = random_row(rows_n * ld, static_cast<uint32_t>(100 + d), -2.0f, 2.0f);
        const std::vector<float> q = random_row(d, static_cast<uint32_t>(200 + d), -2.0f, 2.0f);
        const std::vector<float> w = random_row(n, static_cast<uint32_t>(300 + d), 0.0f, 1.0f);
        std::vector<float> s(static_cast<std::size_t>(n));
        gathered_dots(q.data(), rows.data(), ld, d, idx, n, 0.5f, s.data());
        for (int64_t j = 0; j < n; ++j) {
          double want = 0, mag = 0;
          for (int64_t c = 0; c < d; ++c) {
            const double t = static_cast<double>(q[c]) * rows[idx[j] * ld + c];
            want += t, mag += std::fabs(t);
          }
          CHECK(std::fabs(s[j] - 0.5 * want) <= 0.5 * (d + 1) * u * mag + u * std::fabs(0.5 * want));
        }
        std::vector<float> out = random_row(d, static_cast<uint32_t>(400 + d), -1.0f, 1.0f);
        const std::vector<float> before = out;
        gathered_axpy(w.data(), rows.data(), ld, d, idx, n, out.data());
        for (int64_t c = 0; c < d; ++c) {
          double want = before[c], mag = std::fabs(before[c]);
          for (int64_t j = 0; j < n; ++j) {
            const double t = static_cast<double>(w[j]) * rows[idx[j] * ld + c];
            want += t, mag += std::fabs(t);
          }
          CHECK(std::fabs(out[c] - want) <= (n + 1) * u * mag);
        }
      }
    }
  }
}
