// The sliding-window attention pattern (band, dilation, global tokens) as a pure predicate, shared by the
// fast kernel, its fp64 reference and anything that wants the weights the variant implies (e.g. `patterns`).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/interface/params.hpp"
#include "common/support/error.hpp"

namespace attn::sliding_window {

// The global positions a `global_tokens` value names for a sequence of `seq` positions, sorted.
//  * an integer c: the leading min(c, seq) positions (a count beyond the sequence makes every position
//  global);
//  * a list: exactly those indices. A duplicate index is a usage error (it would otherwise be silently
//    merged, hiding a typo in a config); indices >= seq are dropped here and reported by
//    out_of_range_global_indices() as a reason the problem is not supported.
inline std::vector<int64_t> global_positions(const Json& value, int64_t seq) {
  std::vector<int64_t> out;
  if (!value.is_array()) {
    const int64_t count = std::min(value.get<int64_t>(), seq);
    for (int64_t i = 0; i < count; ++i) out.push_back(i);
    return out;
  }
  for (const Json& e : value) out.push_back(e.get<int64_t>());
  std::sort(out.begin(), out.end());
  if (auto dup = std::adjacent_find(out.begin(), out.end()); dup != out.end())
    throw UsageError("variant 'sliding_window': parameter 'global_tokens': index " + std::to_string(*dup) +
                     " is listed more than once; list each global position once");
  out.erase(std::lower_bound(out.begin(), out.end(), seq), out.end());
  return out;
}

// How many positions global_positions() would return, without building them (a count of 10^12 must be
// estimated, not materialised). Duplicates in a list are counted once each time they appear; the list form is
// validated by global_positions() before any kernel runs.
inline int64_t global_count(const Json& value, int64_t seq) {
  if (!value.is_array()) return std::min(value.get<int64_t>(), seq);
  int64_t n = 0;
  for (const Json& e : value) n += e.get<int64_t>() < seq;
  return n;
}

// Indices of an explicit `global_tokens` list that do not exist in a sequence of `seq` positions.
inline std::vector<int64_t> out_of_range_global_indices(const Json& value, int64_t seq) {
  std::vector<int64_t> bad;
  if (value.is_array())
    for (const Json& e : value)
      if (e.get<int64_t>() >= seq) bad.push_back(e.get<int64_t>());
  return bad;
}

// Which (query i, key j) pairs the pattern allows, before key padding and any explicit boolean mask.
struct Pattern {
  int64_t window = 0;  // keys i - window*dilation ... i + window*dilation, in steps of dilation
  int64_t dilation = 1;
  bool causal = false;             // keys after the query are never attended
  std::vector<uint8_t> is_global;  // per position: attends every key and is attended by every query

  Pattern(int64_t window_, int64_t dilation_, bool causal_, const std::vector<int64_t>& globals, int64_t seq)
      : window(window_), dilation(dilation_), causal(causal_), is_global(static_cast<std::size_t>(seq), 0) {
    for (int64_t g : globals) is_global[static_cast<std::size_t>(g)] = 1;
  }

  bool allows(int64_t i, int64_t j) const {
    if (causal && j > i) return false;
    if (is_global[static_cast<std::size_t>(i)] || is_global[static_cast<std::size_t>(j)]) return true;
    const int64_t offset = i > j ? i - j : j - i;
    return offset % dilation == 0 && offset / dilation <= window;
  }

  // The pattern as a dense [seq, seq] boolean mask (nonzero = allowed): quadratic, for references and plots.
  std::vector<uint8_t> dense_mask() const {
    const int64_t seq = static_cast<int64_t>(is_global.size());
    std::vector<uint8_t> mask(static_cast<std::size_t>(seq * seq));
    for (int64_t i = 0; i < seq; ++i)
      for (int64_t j = 0; j < seq; ++j) mask[static_cast<std::size_t>(i * seq + j)] = allows(i, j) ? 1 : 0;
    return mask;
  }
};

}  // namespace attn::sliding_window
