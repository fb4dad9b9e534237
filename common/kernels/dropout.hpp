// Counter-based dropout on attention weights. keep(seed, b, h, i, j) is a pure function of its arguments, so
// every variant (any tiling, any thread schedule) makes the same keep decisions for the same seed.
// Kept weights are scaled by 1 / (1 - p); the weights are dropped after softmax normalisation, as in
// torch.nn.functional.dropout(softmax(...)).
#pragma once
#include <cmath>
#include <cstdint>

#include "common/support/hash.hpp"

namespace attn {

class DropoutRow {
 public:
  DropoutRow() = default;
  // p: drop probability in [0, 1). The effective probability is p rounded to a multiple of 2^-32.
  DropoutRow(double p, uint64_t seed, int64_t b, int64_t h, int64_t i)
      : key_(mix64(mix64(mix64(mix64(seed ^ 0x5bd1e9955bd1e995ULL) ^ static_cast<uint64_t>(b)) ^
                         static_cast<uint64_t>(h)) ^
                   static_cast<uint64_t>(i))),
        threshold_(static_cast<uint64_t>(std::llround(p * 4294967296.0))),
        scale_(static_cast<float>(1.0 / (1.0 - p))) {}

  bool keep(int64_t j) const {
    return (mix64(key_ + static_cast<uint64_t>(j) * 0x9e3779b97f4a7c15ULL) >> 32) >= threshold_;
  }
  float scale() const { return scale_; }

 private:
  uint64_t key_ = 0;
  uint64_t threshold_ = 0;
  float scale_ = 1.0f;
};

}  // namespace attn
