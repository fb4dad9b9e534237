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

}  // namespace attn
