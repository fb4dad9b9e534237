// The mask semantics every variant and the reference share (see MaskSpec in problem.hpp).
#pragma once
#include <cstdint>

#include "common/attention.hpp"

namespace attn {

inline bool key_allowed(const Problem& p, const AttentionInputs& in, int64_t b, int64_t i, int64_t j) {
  if (p.mask.causal && j > i) return false;
  if (p.mask.boolean && !in.mask[i * p.seq_kv + j]) return false;
  if (p.mask.key_padding && in.key_padding[b * p.seq_kv + j]) return false;
  return true;
}

// (query, key) pairs the causal structure leaves, per batch entry and head: sum over i < Lq of min(i+1, Lkv),
// and Lq·Lkv without a causal mask. Boolean and padding masks are data and are not subtracted.
inline double causal_pairs(const Problem& p) {
  const double q = static_cast<double>(p.seq_q), kv = static_cast<double>(p.seq_kv);
  if (!p.mask.causal) return q * kv;
  if (q <= kv) return q * (q + 1) / 2;
  return kv * (kv + 1) / 2 + (q - kv) * kv;
}

// The FLOP count of exact softmax attention every exact variant reports: 4·d per attended pair (2·d for a
// row of QKᵀ, 2·d for P·V), softmax not counted. Causal counts only the pairs below the diagonal (about half
// of 4·Lq·Lkv·d), whatever a variant computes: a variant that computes the masked half and discards it shows
// the lower GFLOP/s it earns, and none shows more than the machine can do.
inline double exact_attention_flops(const Problem& p) {
  return 4.0 * static_cast<double>(p.batch * p.heads) * static_cast<double>(p.head_dim) * causal_pairs(p);
}

}  // namespace attn
