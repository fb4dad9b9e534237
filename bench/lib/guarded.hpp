// Output buffers with guard regions, for the runner's untimed checked calls (runner.cpp): a variant that
// writes past either end of its output (O, dQ, dK, dV) fails the point, naming the buffer and how many floats
// it wrote before and after it, instead of silently corrupting the heap. Each buffer has kGuardFloats floats
// before and after it, filled with a NaN payload no kernel computes; the variant gets the inner pointer,
// zero-filled as a FloatArray is. Under AddressSanitizer the guards are also poisoned, so the first
// out-of-bounds write is reported at the faulting instruction (and the process stops there).
//
// What it cannot see: a write further than kGuardFloats floats away, and a write of the guard's own bit
// pattern.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "common/support/aligned.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define ATTN_GUARDED_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_GUARDED_ASAN 1
#endif
#endif
#ifdef ATTN_GUARDED_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace attn {

class GuardedArray {
 public:
  // 256 bytes, a multiple of kAlignment: the inner pointer keeps the 64-byte alignment of a FloatArray.
  static constexpr std::size_t kGuardFloats = 64;
  static_assert(kGuardFloats * sizeof(float) % kAlignment == 0);
  // A quiet NaN with a payload (0x7fdeadbe): compared bit for bit, so a kernel's own NaN differs from it.
  static constexpr uint32_t kGuardBits = 0x7fdeadbeu;

  GuardedArray() = default;
  // `name` is how messages call the buffer ("O", "dQ" ...).
  GuardedArray(std::string name, std::size_t numel) : name_(std::move(name)), numel_(numel) {
    data_.assign(numel + 2 * kGuardFloats, 0.0f);
    float pattern;
    std::memcpy(&pattern, &kGuardBits, sizeof pattern);
    for (std::size_t i = 0; i < kGuardFloats; ++i) data_[i] = data_[kGuardFloats + numel + i] = pattern;
    poison(true);
  }
  GuardedArray(const GuardedArray&) = delete;
  GuardedArray& operator=(const GuardedArray&) = delete;
  // Moving keeps the vector's storage (and so the poisoned guards) where it is.
  GuardedArray(GuardedArray&& o) noexcept
      : name_(std::move(o.name_)), numel_(std::exchange(o.numel_, 0)), data_(std::move(o.data_)) {
    o.data_.clear();
  }
  GuardedArray& operator=(GuardedArray&& o) noexcept {
    if (this != &o) {
      poison(false);
      name_ = std::move(o.name_);
      numel_ = std::exchange(o.numel_, 0);
      data_ = std::move(o.data_);
      o.data_.clear();
    }
    return *this;
  }
  ~GuardedArray() { poison(false); }

  float* ptr() { return data_.empty() ? nullptr : data_.data() + kGuardFloats; }
  const float* ptr() const { return data_.empty() ? nullptr : data_.data() + kGuardFloats; }
  std::size_t numel() const { return numel_; }
  const std::string& name() const { return name_; }

  // How many guard floats changed before the buffer's start and after its end.
  struct Outside {
    std::size_t before = 0, after = 0;
    bool any() const { return before || after; }
  };
  Outside outside() const {
    Outside o;
    if (data_.empty()) return o;
    poison(false);
    for (std::size_t i = 0; i < kGuardFloats; ++i) {
      o.before += !is_guard(data_[i]);
      o.after += !is_guard(data_[kGuardFloats + numel_ + i]);
    }
    poison(true);  // the buffer may be used again (a backward point's O in its timed rounds)
    return o;
  }
  // "O: 1 float after its end", or "" when the guards are intact.
  std::string outside_note() const {
    const Outside o = outside();
    if (!o.any()) return "";
    const auto floats = [](std::size_t n) { return std::to_string(n) + (n == 1 ? " float" : " floats"); };
    std::string s = name_ + ": ";
    if (o.before) s += floats(o.before) + " before its start";
    if (o.before && o.after) s += " and ";
    if (o.after) s += floats(o.after) + " after its end";
    return s;
  }

 private:
  static bool is_guard(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return bits == kGuardBits;
  }
  void poison([[maybe_unused]] bool on) const {
#ifdef ATTN_GUARDED_ASAN
    if (data_.empty()) return;
    const std::size_t bytes = kGuardFloats * sizeof(float);
    const float* after = data_.data() + kGuardFloats + numel_;
    if (on) {
      ASAN_POISON_MEMORY_REGION(data_.data(), bytes);
      ASAN_POISON_MEMORY_REGION(after, bytes);
    } else {
      ASAN_UNPOISON_MEMORY_REGION(data_.data(), bytes);
      ASAN_UNPOISON_MEMORY_REGION(after, bytes);
    }
#endif
  }

  std::string name_;
  std::size_t numel_ = 0;
  AlignedVector<float> data_;
};

// The reason a point fails when a checked call wrote outside any of `buffers` ("wrote outside its output O:
// 1 float after its end", several joined with "; "), or "" when every guard is intact.
inline std::string outside_writes(std::initializer_list<const GuardedArray*> buffers) {
  std::string reason;
  for (const GuardedArray* b : buffers)
    if (const std::string note = b->outside_note(); !note.empty())
      reason += (reason.empty() ? "" : "; ") + std::string("wrote outside its output ") + note;
  return reason;
}

}  // namespace attn
