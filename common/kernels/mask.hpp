// The mask semantics every variant and the reference share (see MaskSpec in problem.hpp).
#pragma once
#include <algorithm>
#include <cstdint>

#include "common/interface/attention.hpp"

namespace attn {

// The causal rule as one offset c: query i may attend key j iff j <= i + c. Upper-left causal is c = 0,
// lower-right is c = seq_kv - seq_q, both together the smaller. Meaningful only when p.mask.any_causal().
inline int64_t causal_offset(const Problem& p) {
  int64_t c = p.mask.causal ? 0 : p.seq_kv - p.seq_q;
  if (p.mask.causal_lower_right) c = std::min(c, p.seq_kv - p.seq_q);
  return c;
}

// Keys [0, causal_key_end(p, i)) are the ones the causal rule leaves to query i (all seq_kv without a
// causal mask; 0 when it leaves none).
inline int64_t causal_key_end(const Problem& p, int64_t i) {
  if (!p.mask.any_causal()) return p.seq_kv;
  return std::clamp<int64_t>(i + causal_offset(p) + 1, 0, p.seq_kv);
}

inline bool key_allowed(const Problem& p, const AttentionInputs& in, int64_t b, int64_t i, int64_t j) {
  if (p.mask.any_causal() && j > i + causal_offset(p)) return false;
  if (p.mask.boolean && !in.mask[i * p.seq_kv + j]) return false;
  if (p.mask.key_padding && in.key_padding[b * p.seq_kv + j]) return false;
  return true;
}

// (query, key) pairs the causal structure leaves, per batch entry and head: the sum over i < Lq of
// causal_key_end(p, i) = clamp(i + c + 1, 0, Lkv), and Lq·Lkv without a causal mask. Boolean and padding
// masks are data and are not subtracted.
inline double causal_pairs(const Problem& p) {
  const double q = static_cast<double>(p.seq_q), kv = static_cast<double>(p.seq_kv);
  if (!p.mask.any_causal()) return q * kv;
  // Row i gets min(max(i + c + 1, 0), Lkv) keys: none for i < -c, then a ramp, then all Lkv.
  const double c = static_cast<double>(causal_offset(p));
  const double first = std::max(0.0, -c);                // first row with at least one key
  const double full = std::clamp(kv - c - 1, first, q);  // rows from here on see all Lkv keys
  // Ramp rows first .. full-1 see i + c + 1 keys each (1 .. up to Lkv - 1).
  const double n = full - first;
  const double ramp = n * (first + c + 1) + n * (n - 1) / 2;
  return ramp + (q - full) * kv;
}

// The FLOP count of exact softmax attention every exact variant reports: 2·(d_k + d_v) per attended pair
// (2·d_k for a row of QKᵀ, 2·d_v for P·V; 4·d when they are equal), softmax not counted. Causal counts only
// the pairs below the diagonal (about half of 4·Lq·Lkv·d), whatever a variant computes: a variant that
// computes the masked half and discards it shows the lower GFLOP/s it earns, and none shows more than the
// machine can do.
inline double exact_attention_flops(const Problem& p) {
  return 2.0 * static_cast<double>(p.batch * p.heads) * static_cast<double>(p.head_dim + p.value_dim()) *
         causal_pairs(p);
}

}  // namespace attn
