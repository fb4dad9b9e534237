// The random projection of performer (random_features.hpp).
#include "variants/performer/random_features.hpp"

#include <algorithm>
#include <cmath>

#include "common/support/random.hpp"

namespace attn {
namespace {

double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

std::vector<double> draw_random_features(int64_t m, int64_t d, bool orthogonal, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> w(static_cast<std::size_t>(m * d));
  if (!orthogonal) {
    for (double& x : w) x = rng.normal();
    return w;
  }
  std::vector<double> block(static_cast<std::size_t>(d * d));
  for (int64_t r0 = 0; r0 < m; r0 += d) {
    for (double& x : block) x = rng.normal();
    // Modified Gram-Schmidt over the rows; a second pass ("twice is enough", Giraud et al. 2005) brings
    // the rows orthogonal to fp64 rounding whatever the conditioning of the draw. A row that (with
    // probability 0) lost all its norm to the earlier ones is redrawn.
    for (int64_t r = 0; r < d; ++r) {
      double* row = block.data() + r * d;
      for (;;) {
        const double drawn = std::sqrt(dot(row, row, d));
        for (int pass = 0; pass < 2; ++pass)
          for (int64_t s = 0; s < r; ++s) {
            const double* prev = block.data() + s * d;
            const double c = dot(row, prev, d);
            for (int64_t i = 0; i < d; ++i) row[i] -= c * prev[i];
          }
        const double norm = std::sqrt(dot(row, row, d));
        if (norm > 1e-8 * drawn) {
          for (int64_t i = 0; i < d; ++i) row[i] /= norm;
          break;
        }
        for (int64_t i = 0; i < d; ++i) row[i] = rng.normal();
      }
    }
    const int64_t rows = std::min(d, m - r0);
    for (int64_t r = 0; r < rows; ++r) {
      double chi2 = 0;
      for (int64_t i = 0; i < d; ++i) {
        const double g = rng.normal();
        chi2 += g * g;
      }
      const double norm = std::sqrt(chi2);
      for (int64_t i = 0; i < d; ++i) w[(r0 + r) * d + i] = norm * block[r * d + i];
    }
  }
  return w;
}

}  // namespace attn
