// Small helpers several layers share: saturating byte arithmetic, counting non-finite values, JSON numbers
// that keep NaN/Inf visible, and joining names for messages.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "common/interface/params.hpp"

namespace attn {

// Byte counts add up without wrapping: a workspace estimate for an absurd problem may be near 2^64, and a
// wrapped sum would pass a memory check (and allocate) instead of refusing.
inline std::size_t sat_add(std::size_t a, std::size_t b) {
  std::size_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}
template <class... Rest>
std::size_t sat_add(std::size_t a, std::size_t b, std::size_t c, Rest... rest) {
  return sat_add(sat_add(a, b), c, static_cast<std::size_t>(rest)...);
}

// The same for products. Every size of a valid Problem is at most 2^40 and every tensor at most 2^58
// elements, but a workspace formula multiplies sizes of different tensors (head_dim², seq_q × seq_kv, threads
// × per-thread floats), which can exceed 64 bits: estimates go through these, never through int64_t `*`.
inline std::size_t sat_mul(std::size_t a, std::size_t b) {
  std::size_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}
template <class... Rest>
std::size_t sat_mul(std::size_t a, std::size_t b, std::size_t c, Rest... rest) {
  return sat_mul(sat_mul(a, b), c, static_cast<std::size_t>(rest)...);
}
// A non-negative count as a size (negative counts, which no valid problem has, read as 0).
inline std::size_t to_size(int64_t v) {
  return v > 0 ? static_cast<std::size_t>(v) : 0;
}

inline int64_t count_nonfinite(const float* x, std::size_t n) {
  int64_t c = 0;
  for (std::size_t i = 0; i < n; ++i) c += !std::isfinite(x[i]);
  return c;
}

// JSON has no NaN/Inf: non-finite metrics are written as strings ("inf", "nan") so they are never mistaken
// for a small error (nlohmann would write null).
inline Json json_number(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
}

inline std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// 1536 -> "1.500 KiB": binary units, three decimals above bytes.
inline std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 6) bytes /= 1024, ++u;
  std::ostringstream s;
  s.precision(u ? 3 : 0);
  s << std::fixed << bytes << " " << units[u];
  return s.str();
}

}  // namespace attn
