// A dense, C-ordered n-dimensional array. Attention tensors are rank 4, [batch, heads, seq, dim], fp32.
#pragma once
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "common/support/aligned.hpp"

namespace attn {

template <class T>
struct NdArray {
  std::vector<int64_t> shape;
  AlignedVector<T> data;

  NdArray() = default;
  explicit NdArray(std::vector<int64_t> s, T fill = T{}) : shape(std::move(s)), data(count(shape), fill) {}

  static std::size_t count(const std::vector<int64_t>& s) {
    return static_cast<std::size_t>(std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>()));
  }
  std::size_t numel() const { return data.size(); }
  int rank() const { return static_cast<int>(shape.size()); }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }
  std::string shape_str() const { return shape_to_string(shape); }

  static std::string shape_to_string(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  }
};

using FloatArray = NdArray<float>;
using DoubleArray = NdArray<double>;
using ByteArray = NdArray<uint8_t>;

}  // namespace attn
