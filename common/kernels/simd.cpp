// Run-time choice of the SIMD target (common/kernels/simd.hpp): Highway's list of compiled and supported
// targets, selection by name through Highway's target mask, and the per-target FMA-peak probe. Compiled once
// per target through foreach_target.h; the selection code below HWY_ONCE exists once.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/kernels/simd.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // must come first: it re-includes this file once per target
// clang-format on
#include "common/kernels/simd.hpp"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include <algorithm>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif
#include <cctype>
#include <chrono>
#include <mutex>

#include "common/kernels/simd-inl.hpp"
#include "common/support/error.hpp"

// A vector register operand for the probe's asm: any xmm/ymm/zmm on x86, a SIMD/FP register on Arm (an SVE
// vector is the sizeless type itself, not a wrapper with .raw). Redefined for each target this file is
// compiled for.
#undef ATTN_VREG
#if HWY_ARCH_X86
#define ATTN_VREG(x) "+v"(x.raw)
#elif HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 || HWY_TARGET == HWY_SVE_256 || \
    HWY_TARGET == HWY_SVE2_128
#define ATTN_VREG(x) "+w"(x)
#else
#define ATTN_VREG(x) "+w"(x.raw)
#endif

HWY_BEFORE_NAMESPACE();
namespace attn::simd::HWY_NAMESPACE {

// Targets without register vectors (scalar, emu128): a compiler barrier on the accumulator's memory.
template <class V>
HWY_INLINE void KeepLive(V& v) {
  asm volatile("" : : "r"(&v) : "memory");
}

// The target this code was compiled for: what actually runs when dispatch lands here.
int64_t ActiveTarget() {
  return HWY_TARGET;
}

// 12 chains x full-width vectors (ScalableTag, not the 16-lane cap: the probe measures the hardware). The
// empty asm with a "+" register operand makes each accumulator live in a register across every step, so the
// compiler can neither merge the chains, hoist them out of the loop nor keep them in memory.
FmaRun FmaChains(int64_t iterations) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const V a = hn::Set(d, 0.999999f), b = hn::Set(d, 1e-7f);
  V acc0 = hn::Set(d, 0.0f), acc1 = hn::Set(d, 1e-3f), acc2 = hn::Set(d, 2e-3f), acc3 = hn::Set(d, 3e-3f);
  V acc4 = hn::Set(d, 4e-3f), acc5 = hn::Set(d, 5e-3f), acc6 = hn::Set(d, 6e-3f), acc7 = hn::Set(d, 7e-3f);
  V acc8 = hn::Set(d, 8e-3f), acc9 = hn::Set(d, 9e-3f), acc10 = hn::Set(d, 1e-2f),
    acc11 = hn::Set(d, 1.1e-2f);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iterations; ++it) {
    acc0 = hn::MulAdd(acc0, a, b);
    acc1 = hn::MulAdd(acc1, a, b);
    acc2 = hn::MulAdd(acc2, a, b);
    acc3 = hn::MulAdd(acc3, a, b);
    acc4 = hn::MulAdd(acc4, a, b);
    acc5 = hn::MulAdd(acc5, a, b);
    acc6 = hn::MulAdd(acc6, a, b);
    acc7 = hn::MulAdd(acc7, a, b);
    acc8 = hn::MulAdd(acc8, a, b);
    acc9 = hn::MulAdd(acc9, a, b);
    acc10 = hn::MulAdd(acc10, a, b);
    acc11 = hn::MulAdd(acc11, a, b);
#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128 && (HWY_ARCH_X86 || HWY_ARCH_ARM)
    asm volatile(""
                 : ATTN_VREG(acc0), ATTN_VREG(acc1), ATTN_VREG(acc2), ATTN_VREG(acc3), ATTN_VREG(acc4),
                   ATTN_VREG(acc5), ATTN_VREG(acc6), ATTN_VREG(acc7), ATTN_VREG(acc8), ATTN_VREG(acc9),
                   ATTN_VREG(acc10), ATTN_VREG(acc11));
#else
    KeepLive(acc0);
#endif
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  V sum = hn::Add(hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3)), hn::Add(hn::Add(acc4, acc5), acc6));
  sum = hn::Add(sum, hn::Add(hn::Add(acc7, acc8), hn::Add(hn::Add(acc9, acc10), acc11)));
  volatile float sink = hn::GetLane(sum);  // the chains' results are used: they cannot be removed
  (void)sink;
  const int lanes = static_cast<int>(hn::Lanes(d));
  return {seconds, 2.0 * lanes * 12.0 * static_cast<double>(iterations), lanes};
}

}  // namespace attn::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::simd {
HWY_EXPORT(ActiveTarget);
HWY_EXPORT(FmaChains);

namespace {

std::string lower(const char* s) {
  std::string r(s);
  std::transform(r.begin(), r.end(), r.begin(), [](unsigned char c) { return std::tolower(c); });
  return r;
}

struct Targets {
  std::vector<std::pair<std::string, int64_t>> compiled, supported;  // best first
};

// Read once, before any selection replaces Highway's view of the CPU with a one-target mask.
const Targets& targets() {
  static const Targets t = [] {
    Targets r;
    const int64_t cpu = hwy::SupportedTargets();
    // Target bits: a lower bit is a better target, so ascending bit order is best first.
    for (int64_t bits = HWY_TARGETS; bits != 0; bits &= bits - 1) {
      const int64_t bit = bits & -bits;
      const std::pair<std::string, int64_t> entry{lower(hwy::TargetName(bit)), bit};
      r.compiled.push_back(entry);
      if (cpu & bit) r.supported.push_back(entry);
    }
    return r;
  }();
  return t;
}

std::string join_names(const std::vector<std::pair<std::string, int64_t>>& v) {
  std::string s;
  for (const auto& e : v) s += (s.empty() ? "" : ", ") + e.first;
  return s;
}

std::mutex selection_mutex;
std::string selected = "best";

int64_t target_bit(const std::string& name, const std::string& what) {
  const Targets& t = targets();
  if (name == "best") return 0;
  for (const auto& e : t.supported)
    if (e.first == name) return e.second;
  for (const auto& e : t.compiled)
    if (e.first == name)
      throw UsageError(what + " '" + name + "': this CPU does not support that target; supported: best, " +
                       join_names(t.supported));
  throw UsageError(what + " '" + name + "' is not a SIMD target of this build; supported: best, " +
                   join_names(t.supported) + " (compiled: " + join_names(t.compiled) + ")");
}

}  // namespace

const IsaInfo& isa_info() {
  static const IsaInfo info = [] {
    IsaInfo r;
    for (const auto& e : targets().compiled) r.compiled.push_back(e.first);
    for (const auto& e : targets().supported) r.supported.push_back(e.first);
    r.best = r.supported.empty() ? std::string("scalar") : r.supported.front();
    return r;
  }();
  return info;
}

std::string active_isa() {
  return lower(hwy::TargetName(HWY_DYNAMIC_DISPATCH(ActiveTarget)()));
}

void validate_isa(const std::string& name, const std::string& what) {
  target_bit(name, what);
}

void select_isa(const std::string& name, const std::string& what) {
  const int64_t bit = target_bit(name, what);
  std::lock_guard<std::mutex> lock(selection_mutex);
  // A one-target mask makes every HWY_DYNAMIC_DISPATCH table pick that target (0 restores the CPU's own
  // list); Highway re-chooses on the next dispatched call.
  hwy::SetSupportedTargetsForTest(bit);
  selected = name;
}

ScopedIsa::ScopedIsa(const std::string& name, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(selection_mutex);
    previous_ = selected;
  }
  select_isa(name, what);
}

ScopedIsa::~ScopedIsa() {
  select_isa(previous_);
}

FmaRun fma_chains(int64_t iterations) {
  return HWY_DYNAMIC_DISPATCH(FmaChains)(iterations);
}

ScopedFlushDenormals::ScopedFlushDenormals() {
#if defined(__x86_64__) || defined(__i386__)
  previous_ = _mm_getcsr();
  _mm_setcsr(static_cast<unsigned>(previous_) | 0x8000u);  // FTZ (bit 15)
#endif
}

ScopedFlushDenormals::~ScopedFlushDenormals() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(static_cast<unsigned>(previous_));
#endif
}

}  // namespace attn::simd
#endif  // HWY_ONCE
