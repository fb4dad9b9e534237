// Seeded, platform-independent random numbers (splitmix64 + Box-Muller): the same seed gives the same
// tensors on every machine and standard library, unlike std::normal_distribution.
#pragma once
#include <cmath>
#include <cstdint>

#include "common/support/hash.hpp"

namespace attn {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(mix64(seed ^ 0x243f6a8885a308d3ULL)) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix64(state_);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    const double r = std::sqrt(-2.0 * std::log(u1)), t = 6.283185307179586 * u2;
    spare_ = r * std::sin(t);
    has_spare_ = true;
    return r * std::cos(t);
  }

 private:
  uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

template <class T>
void fill_normal(T* x, int64_t n, uint64_t seed, double stddev = 1.0, double mean = 0.0) {
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(mean + stddev * rng.normal());
}

template <class T>
void fill_uniform(T* x, int64_t n, uint64_t seed, double lo, double hi) {
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(lo + (hi - lo) * rng.uniform());
}

}  // namespace attn
