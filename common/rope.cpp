// Rotary position embedding (rope.hpp).
#include "common/rope.hpp"

#include <tbb/parallel_for.h>

#include <cmath>
#include <vector>

#include "common/error.hpp"
#include "common/params.hpp"

namespace attn {

const char* rope_mode_name(RopeMode m) {
  switch (m) {
    case RopeMode::normal:
      return "normal";
    case RopeMode::neox:
      return "neox";
    default:
      return "none";
  }
}

RopeMode parse_rope_mode(const std::string& text, const std::string& where) {
  for (RopeMode m : {RopeMode::none, RopeMode::normal, RopeMode::neox})
    if (text == rope_mode_name(m)) return m;
  throw UsageError(where + ": unknown RoPE mode '" + text + "' (allowed: none, normal, neox)");
}

std::string RopeSpec::str() const {
  std::string s = rope_mode_name(mode);
  if (on() && base != 10000.0) s += ",base=" + shortest_double_text(base);
  return s;
}

void validate_rope(const RopeSpec& r, int64_t head_dim, const std::string& where) {
  if (!std::isfinite(r.base) || r.base <= 0)
    throw UsageError(where + ": RoPE base must be a finite number > 0, got " + shortest_double_text(r.base));
  if (r.on() && head_dim % 2 != 0)
    throw UsageError(where + ": RoPE rotates pairs of elements, so head_dim must be even, got " +
                     std::to_string(head_dim));
}

namespace {
// Element indices (a, b) of pair i in a row of `dim`.
inline void pair_index(RopeMode m, int64_t i, int64_t dim, int64_t& a, int64_t& b) {
  if (m == RopeMode::normal) {
    a = 2 * i;
    b = 2 * i + 1;
  } else {
    a = i;
    b = i + dim / 2;
  }
}
inline double theta(double base, int64_t pos, int64_t i, int64_t dim) {
  return static_cast<double>(pos) * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
}
}  // namespace

void apply_rope(const RopeSpec& r, float* x, int64_t blocks, int64_t seq, int64_t dim, int64_t offset) {
  if (!r.on()) return;
  validate_rope(r, dim, "rope");
  const int64_t half = dim / 2;
  // cos/sin per (position, pair), fp64 then rounded once: shared by every block.
  std::vector<float> cs(static_cast<std::size_t>(seq * half)), sn(cs.size());
  tbb::parallel_for(int64_t{0}, seq, [&](int64_t s) {
    for (int64_t i = 0; i < half; ++i) {
      const double t = theta(r.base, offset + s, i, dim);
      cs[static_cast<std::size_t>(s * half + i)] = static_cast<float>(std::cos(t));
      sn[static_cast<std::size_t>(s * half + i)] = static_cast<float>(std::sin(t));
    }
  });
  tbb::parallel_for(int64_t{0}, blocks * seq, [&](int64_t row) {
    float* xr = x + row * dim;
    const float* c = cs.data() + (row % seq) * half;
    const float* s = sn.data() + (row % seq) * half;
    if (r.mode == RopeMode::normal) {
      for (int64_t i = 0; i < half; ++i) {
        const float a = xr[2 * i], b = xr[2 * i + 1];
        xr[2 * i] = a * c[i] - b * s[i];
        xr[2 * i + 1] = a * s[i] + b * c[i];
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        const float a = xr[i], b = xr[i + half];
        xr[i] = a * c[i] - b * s[i];
        xr[i + half] = a * s[i] + b * c[i];
      }
    }
  });
}

void apply_rope_fp64(const RopeSpec& r, const double* x, double* out, int64_t blocks, int64_t seq, int64_t dim,
                     int64_t offset) {
  const int64_t n = blocks * seq * dim;
  for (int64_t e = 0; e < n; ++e) out[e] = x[e];
  if (!r.on()) return;
  validate_rope(r, dim, "rope");
  for (int64_t row = 0; row < blocks * seq; ++row) {
    const int64_t pos = offset + row % seq;
    for (int64_t i = 0; i < dim / 2; ++i) {
      int64_t a = 0, b = 0;
      pair_index(r.mode, i, dim, a, b);
      const double t = theta(r.base, pos, i, dim);
      const double xa = x[row * dim + a], xb = x[row * dim + b];
      out[row * dim + a] = xa * std::cos(t) - xb * std::sin(t);
      out[row * dim + b] = xa * std::sin(t) + xb * std::cos(t);
    }
  }
}

}  // namespace attn
