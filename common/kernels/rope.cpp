// Rotary position embedding (rope.hpp).
#include "common/kernels/rope.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "common/interface/params.hpp"
#include "common/support/error.hpp"

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

RopeTable::RopeTable(const RopeSpec& r, int64_t dim, int64_t first, int64_t count)
    : mode_(r.mode), dim_(dim), first_(first), count_(count) {
  validate_rope(r, dim, "rope");
  if (!r.on()) return;
  const int64_t half = dim / 2;
  // base^(-2i/d) once per pair, then one fp64 angle, cos and sin per (position, pair), rounded once.
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<std::size_t>(i)] =
        std::pow(r.base, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
  cos_.resize(static_cast<std::size_t>(count * half));
  sin_.resize(cos_.size());
  tbb::parallel_for(int64_t{0}, count, [&](int64_t s) {
    const double pos = static_cast<double>(first + s);
    for (int64_t i = 0; i < half; ++i) {
      const double t = pos * inv_freq[static_cast<std::size_t>(i)];
      cos_[static_cast<std::size_t>(s * half + i)] = static_cast<float>(std::cos(t));
      sin_[static_cast<std::size_t>(s * half + i)] = static_cast<float>(std::sin(t));
    }
  });
}

void RopeTable::apply(float* x, int64_t blocks, int64_t seq, int64_t offset) const {
  if (mode_ == RopeMode::none) return;
  if (offset < first_ || offset + seq > first_ + count_)
    throw std::logic_error("RopeTable::apply: positions outside the table");
  const int64_t half = dim_ / 2, dim = dim_;
  tbb::parallel_for(int64_t{0}, blocks * seq, [&](int64_t row) {
    float* xr = x + row * dim;
    const std::size_t at = static_cast<std::size_t>((offset - first_ + row % seq) * half);
    const float* c = cos_.data() + at;
    const float* s = sin_.data() + at;
    if (mode_ == RopeMode::normal) {
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

void apply_rope(const RopeSpec& r, float* x, int64_t blocks, int64_t seq, int64_t dim, int64_t offset) {
  if (!r.on()) return;
  RopeTable(r, dim, offset, seq).apply(x, blocks, seq, offset);
}

void apply_rope_qk(const RopeSpec& r, const Problem& p, float* q, float* k) {
  if (!r.on()) return;
  const int64_t off = rope_query_offset(p);
  const int64_t first = std::min<int64_t>(0, off), last = std::max(p.seq_kv, off + p.seq_q);
  const RopeTable table(r, p.head_dim, first, last - first);
  table.apply(q, p.batch * p.heads, p.seq_q, off);
  table.apply(k, p.batch * p.num_kv_heads(), p.seq_kv, 0);
}

void apply_rope_fp64(const RopeSpec& r, const double* x, double* out, int64_t blocks, int64_t seq,
                     int64_t dim, int64_t offset) {
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
