// The SIMD target ("ISA") every vector kernel runs on, chosen at run time. attnbench is one portable binary:
// Highway (libhwy) compiles each kernel for several targets (x86: avx3, avx2, sse4, ssse3, scalar; aarch64:
// sve2, sve, neon, scalar; see isa_info().compiled) and dispatch picks the best one the CPU supports, unless
// the user names another with --isa / sweep.isa. Names are Highway's target names in lower case.
//
// The selection is process-wide: select_isa() must not run while a kernel is running (the CLI and the sweep
// call it between calls, never inside one).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace attn::simd {

struct IsaInfo {
  std::vector<std::string> compiled;   // every target this binary has kernels for, best first
  std::vector<std::string> supported;  // those this CPU can run, best first (always ends with the fallback)
  std::string best;                    // supported.front()
};
const IsaInfo& isa_info();

// The target the kernels dispatch to now (the one that actually runs, reported from inside the kernels).
std::string active_isa();

// Makes every kernel run on target `name` ("best": the best supported one). An unknown or unsupported name
// throws UsageError naming `what` (e.g. "--isa" or "sweep.isa"), the value and the supported names.
void select_isa(const std::string& name, const std::string& what = "--isa");

// Throws the same UsageError as select_isa for a name that cannot be selected; selects nothing.
void validate_isa(const std::string& name, const std::string& what = "--isa");

// Selects `name` for its lifetime and restores the previous selection after.
class ScopedIsa {
 public:
  explicit ScopedIsa(const std::string& name, const std::string& what = "--isa");
  ~ScopedIsa();
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  std::string previous_;
};

// Flush-to-zero on the calling thread for its lifetime (x86: MXCSR FTZ; a no-op elsewhere: Arm's denormal
// cost was not measured), restoring the previous mode after. Kernels whose intermediate values are routinely
// far below 2^-126 use it: an online softmax with ALiBi multiplies probabilities near 2^-120 by values, and
// on Intel cores every denormal result of a vector FMA costs a microcode assist (tiled with ALiBi at n = 4096
// ran 42-64% slower than without on a Sapphire Rapids-class Xeon, 0-6% on Zen 5, where denormals are handled
// in hardware; FTZ | DAZ brought the Xeon to +3%). A flushed value is below 2^-126 in magnitude, 2^-102
// relative to a softmax row's sum (>= 1): far below fp32 resolution. NaN and Inf are unaffected. DAZ
// (denormal operands read as zero) is deliberately not set: Exp2 (simd-inl.hpp) already returns 0 below
// 2^-126, and with FTZ no computed value is denormal, so DAZ would only change denormal inputs (FTZ alone is
// not yet re-measured on the Xeon; on an AMD EPYC ALiBi costs +1% / +5% with it), and qemu applies it to
// F16C's vcvtph2ps (real CPUs do not), flushing every fp16 value below 2^-14 when widened, which the
// x86-64-v3 cross-test caught as a 10x larger fp16 error.
class ScopedFlushDenormals {
 public:
  ScopedFlushDenormals();
  ~ScopedFlushDenormals();
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
  uint64_t previous_ = 0;
};

// The FMA-peak probe on the active target: 12 independent chains of vector FMAs (acc = acc * a + b) held in
// registers (each step passes through an empty asm so the compiler can neither merge, spill-and-fold nor
// hoist the chains), `iterations` steps each. Returns the seconds it took and the FLOPs it did (2 per lane
// per FMA). The lane count is the target's vector width.
struct FmaRun {
  double seconds = 0;
  double flops = 0;
  int lanes = 0;
};
FmaRun fma_chains(int64_t iterations);

}  // namespace attn::simd
