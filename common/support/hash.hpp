// Hashes every part of attnbench shares: splitmix64's mixer (random streams, dropout keep decisions, seeds
// per embedding/positional table) and FNV-1a over text (config hashes, per-input seeds). Both are pure and
// platform-independent, so the same inputs give the same numbers on every machine.
#pragma once
#include <cstdint>
#include <string_view>

namespace attn {

// splitmix64's finaliser: a bijective mixer with full avalanche.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

inline constexpr uint64_t kFnvOffsetBasis = 1469598103934665603ULL;

// 64-bit FNV-1a of `text`, starting from `basis` (the standard offset basis unless a caller seeds it).
inline uint64_t fnv1a64(std::string_view text, uint64_t basis = kFnvOffsetBasis) {
  uint64_t h = basis;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace attn
