// ALiBi (Press et al. 2022, "Train Short, Test Long"): a per-head linear bias on the logits, the one rule the
// fp64 reference and every variant with Capabilities::alibi share.
//   logit(i, j) = scale * q_i . k_j - slope_h * dist(i, j)
//   dist(i, j) = i' - j under a causal mask (either kind), |i' - j| otherwise,
//   i' = i + (seq_kv - seq_q) under causal_lower_right (the query's position in the key sequence, as in a
//   KV-cache decode step), i' = i otherwise (upper-left alignment, torch's tril).
// Under a causal mask every allowed key has j <= i', so dist >= 0 there and the bias never rewards a key.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/interface/attention.hpp"

namespace attn {

// The paper's and ggml's default slopes for `heads` query heads: for H a power of two, slope_h =
// 2^(-8 (h + 1) / H); otherwise n = 2^floor(log2 H), m0 = 2^(-8 / n), m1 = 2^(-4 / n), slope_h = m0^(h + 1)
// for h < n and m1^(2 (h - n) + 1) after (the interleaved rule).
inline std::vector<double> alibi_default_slopes(int64_t heads) {
  std::vector<double> s(static_cast<std::size_t>(heads));
  int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  const double m0 = std::pow(2.0, -8.0 / static_cast<double>(n));
  const double m1 = std::pow(2.0, -4.0 / static_cast<double>(n));
  for (int64_t h = 0; h < heads; ++h)
    s[static_cast<std::size_t>(h)] =
        h < n ? std::pow(m0, static_cast<double>(h + 1)) : std::pow(m1, static_cast<double>(2 * (h - n) + 1));
  return s;
}

// The slopes a call uses: in.alibi_slopes when given, else the defaults.
inline std::vector<double> alibi_slopes(const Problem& p, const AttentionInputs& in) {
  if (!in.alibi_slopes) return alibi_default_slopes(p.heads);
  return std::vector<double>(in.alibi_slopes, in.alibi_slopes + p.heads);
}

// The slopes rounded to fp32, as the kernels use them (empty unless p.bias is alibi).
inline std::vector<float> alibi_slopes_f32(const Problem& p, const AttentionInputs& in) {
  std::vector<float> out;
  if (p.bias != Bias::alibi) return out;
  for (double s : alibi_slopes(p, in)) out.push_back(static_cast<float>(s));
  return out;
}

// i' - i: the offset of query positions in the key sequence.
inline int64_t alibi_query_offset(const Problem& p) {
  return p.mask.causal_lower_right ? p.seq_kv - p.seq_q : 0;
}

// dist(i, j) as above.
inline double alibi_distance(const Problem& p, int64_t i, int64_t j) {
  const double d = static_cast<double>(i + alibi_query_offset(p) - j);
  return p.mask.any_causal() ? d : std::fabs(d);
}

}  // namespace attn
