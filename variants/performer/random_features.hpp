// performer's random projection W (m × d, fp64): orthogonal blocks with chi(d) row norms, or iid Gaussian
// rows (Choromanski et al. 2020, "Rethinking Attention with Performers", section 2.4). Kept apart from the
// variant so tests can inspect the draw.
#pragma once
#include <cstdint>
#include <vector>

namespace attn {

// Row-major m × d. orthogonal: for each block of d rows (the last one truncated to m mod d rows), a d × d
// matrix of N(0, 1) draws is orthonormalised row by row (modified Gram-Schmidt, run twice, in fp64), and
// each row is rescaled to the norm of a fresh d-dim N(0, I) vector (a chi(d) draw), so every row is
// marginally N(0, I_d) and rows within a block are exactly orthogonal. Otherwise every entry is an
// independent N(0, 1) draw. All draws come from Rng(seed) (common/support/random.hpp) in a fixed order.
std::vector<double> draw_random_features(int64_t m, int64_t d, bool orthogonal, uint64_t seed);

}  // namespace attn
