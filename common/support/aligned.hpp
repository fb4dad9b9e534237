// 64-byte aligned storage for SIMD-friendly buffers (a full AVX-512 register, one cache line).
#pragma once
#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace attn {

inline constexpr std::size_t kAlignment = 64;

template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n == 0) return nullptr;
    if (n > static_cast<std::size_t>(-1) / sizeof(T) - kAlignment) throw std::bad_alloc();
    std::size_t bytes = (n * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, bytes);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace attn
