// Whether this translation unit is built with a sanitizer (ASan, TSan, MSan): GCC defines __SANITIZE_*__,
// clang answers __has_feature.
#pragma once

namespace attn {

inline constexpr bool kSanitizerBuild =
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
    true;
#else
    false;
#endif
#else
    false;
#endif

}  // namespace attn
