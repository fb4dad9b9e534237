// tiled's native bf16 kernels with AVX512_BF16's vdpbf16ps, which multiplies pairs of bf16 values exactly
// and accumulates them in fp32 (32 products per instruction where an fp32 FMA does 16): the score tile
// S^T = K Q^T, and the output tile O^T += V^T P^T with P rounded to bf16 (tiled_kernels.cpp
// SoftmaxUpdatePairs) and V packed per tile as key pairs. Highway 1.0 (Debian 12) has no target with these
// instructions, so this file uses the intrinsics under a function-level target attribute, and
// tiled_kernels.cpp calls it from its AVX-512 target when the CPU reports avx512_bf16 (bf16_dot_supported)
// and bf16_kernel is not widen; every other CPU and target converts bf16 to fp32 instead.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <utility>

#include "variants/tiled/tiled.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ATTN_HAVE_BF16_KERNEL 1
#define ATTN_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma")))
#else
#define ATTN_HAVE_BF16_KERNEL 0
#endif

namespace attn::tiled {

#if ATTN_HAVE_BF16_KERNEL
bool bf16_dot_supported() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  }();
  return ok;
}
std::string bf16_dot_missing() {
  return bf16_dot_supported() ? "" : "the CPU lacks the flag avx512_bf16 (vdpbf16ps)";
}

namespace {
// 12 independent accumulator chains of one instruction, `iters` times, in registers (the empty asm keeps
// the compiler from folding or spilling them); seconds taken.
#define ATTN_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define ATTN_CHAIN_DECLARE(i) __m512 a##i = _mm512_setzero_ps();
#define ATTN_CHAIN_KEEP(i) asm volatile("" : "+v"(a##i));
#define ATTN_CHAIN_SUM(i) sum = _mm512_add_ps(sum, a##i);
template <bool kDot>
ATTN_BF16_TARGET double TimeChains(int64_t iters, float* sink) {
  ATTN_CHAINS(ATTN_CHAIN_DECLARE)
  const __m512 x = _mm512_set1_ps(0.5f), y = _mm512_set1_ps(0.25f);
  const __m512bh xb = (__m512bh)_mm512_set1_epi32(0x3f003f00), yb = (__m512bh)_mm512_set1_epi32(0x3e803e80);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) {
#define ATTN_CHAIN_STEP(i) a##i = kDot ? _mm512_dpbf16_ps(a##i, xb, yb) : _mm512_fmadd_ps(x, y, a##i);
    ATTN_CHAINS(ATTN_CHAIN_STEP)
#undef ATTN_CHAIN_STEP
    ATTN_CHAINS(ATTN_CHAIN_KEEP)
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  __m512 sum = _mm512_setzero_ps();
  ATTN_CHAINS(ATTN_CHAIN_SUM)
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  for (float lane : lanes) *sink += lane;
  return s;
}
#undef ATTN_CHAINS
#undef ATTN_CHAIN_DECLARE
#undef ATTN_CHAIN_KEEP
#undef ATTN_CHAIN_SUM

// vdpbf16ps's multiply-add rate (32 bf16 products per instruction) over the fp32 FMA's (16), one thread:
// the best of 7 interleaved timings of 12 chains x 4096 instructions each (~0.1 ms apiece; the best, since
// a preempted timing is only ever slower). Measured: 0.48 on an Intel Xeon (Sapphire Rapids class), where
// vdpbf16ps issues at a quarter of the FMA's rate; AMD Zen 4 and 5 issue it at the FMA's rate (2x).
double MeasureBf16DotRatio() {
  constexpr int64_t kIters = 4096;
  float sink = 0;
  double dot = 1e30, fma = 1e30;
  for (int round = 0; round < 7; ++round) {
    dot = std::min(dot, TimeChains<true>(kIters, &sink));
    fma = std::min(fma, TimeChains<false>(kIters, &sink));
  }
  if (!(sink == sink)) return 0;  // never: keeps the chains' results alive
  return 2.0 * fma / dot;
}
}  // namespace

double bf16_dot_rate_ratio() {
  static const double ratio = bf16_dot_supported() ? MeasureBf16DotRatio() : 0.0;
  return ratio;
}

namespace {
// MR key rows x NV vectors of 16 queries, as ScoreKernel in tiled_kernels.cpp (the same 8 x 2 blocking),
// over `pairs` depth pairs: qt2[e2 * ldq + c] holds query c's elements 2 e2 and 2 e2 + 1 as one 32-bit word
// (low half first, the order vdpbf16ps pairs them), k rows are read in place as 32-bit pairs. The epilogue
// multiplies by `scale` (scale * log2 e: Q stays exact bf16, unscaled) and adds the lane bias.
template <int MR, int NV, int BK>
ATTN_BF16_TARGET void Bf16ScoreKernel(const uint16_t* __restrict k, int64_t ldk,
                                      const uint32_t* __restrict qt2, int64_t ldq, int64_t pairs,
                                      float* __restrict s, int64_t lds, float* __restrict colmax, float scale,
                                      const LaneBias& bias, int64_t j0) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t e2 = 0; e2 < pairs; ++e2) {
    __m512bh b[NV];
    for (int c = 0; c < NV; ++c) b[c] = (__m512bh)_mm512_load_si512(qt2 + e2 * ldq + c * 16);
    for (int r = 0; r < MR; ++r) {
      int32_t word;
      std::memcpy(&word, k + r * ldk + 2 * e2, sizeof word);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(word);
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a, b[c]);
    }
  }
  const __m512 vs = _mm512_set1_ps(scale);
  __m512 mx[NV];
  for (int c = 0; c < NV; ++c) mx[c] = colmax ? _mm512_loadu_ps(colmax + c * 16) : _mm512_setzero_ps();
  for (int c = 0; c < NV; ++c) {
    __m512 pos = _mm512_setzero_ps(), slope = _mm512_setzero_ps();
    if constexpr (BK != 0) {
      pos = _mm512_loadu_ps(bias.pos + c * 16);
      slope = _mm512_loadu_ps(bias.slope + c * 16);
    }
    for (int r = 0; r < MR; ++r) {
      __m512 x = _mm512_mul_ps(acc[r][c], vs);
      if constexpr (BK != 0) {
        __m512 dist = _mm512_sub_ps(pos, _mm512_set1_ps(static_cast<float>(j0 + r)));
        if constexpr (BK == 2) dist = _mm512_abs_ps(dist);
        x = _mm512_fmadd_ps(slope, dist, x);
      }
      _mm512_storeu_ps(s + r * lds + c * 16, x);
      // Masked form: GCC 12 warns (falsely) about the undefined pass-through of the unmasked intrinsic.
      if (colmax) mx[c] = _mm512_mask_max_ps(mx[c], 0xffff, mx[c], x);
    }
  }
  if (colmax)
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(colmax + c * 16, mx[c]);
}

using Bf16Fn = void (*)(const uint16_t*, int64_t, const uint32_t*, int64_t, int64_t, float*, int64_t, float*,
                        float, const LaneBias&, int64_t);
template <int NV, int BK, int... R>
constexpr std::array<Bf16Fn, sizeof...(R)> Bf16Row(std::integer_sequence<int, R...>) {
  return {&Bf16ScoreKernel<R + 1, NV, BK>...};
}
template <int BK>
constexpr std::array<std::array<Bf16Fn, 8>, 2> Bf16Table() {
  return {Bf16Row<1, BK>(std::make_integer_sequence<int, 8>()),
          Bf16Row<2, BK>(std::make_integer_sequence<int, 8>())};
}
// Output micro-kernel: an MR x NV-vector block of O^T = alpha * O^T + V^T P^T, value dims in rows and
// queries in lanes, as PvKernel in tiled_kernels.cpp, over key pairs: v2[j2 * ldv + r] holds dim r of keys
// 2 j2 and 2 j2 + 1 as one 32-bit word, p2[j2 * ldp + c] query c's probabilities of the same two keys
// (already rounded to bf16). One vdpbf16ps adds both keys' exact products to the fp32 accumulator.
template <int MR, int NV>
ATTN_BF16_TARGET void Bf16PvKernel(const uint32_t* __restrict v2, int64_t ldv, const uint32_t* __restrict p2,
                                   int64_t ldp, int64_t pairs, float* __restrict ot, int64_t ldo,
                                   const float* __restrict alpha) {
  __m512 acc[MR][NV];
  for (int c = 0; c < NV; ++c) {
    const __m512 a = _mm512_load_ps(alpha + c * 16);
    for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_mul_ps(_mm512_load_ps(ot + r * ldo + c * 16), a);
  }
  for (int64_t j2 = 0; j2 < pairs; ++j2) {
    __m512bh b[NV];
    for (int c = 0; c < NV; ++c) b[c] = (__m512bh)_mm512_load_si512(p2 + j2 * ldp + c * 16);
    for (int r = 0; r < MR; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(v2[j2 * ldv + r]));
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a, b[c]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NV; ++c) _mm512_store_ps(ot + r * ldo + c * 16, acc[r][c]);
}

using Bf16PvFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t, float*, int64_t,
                          const float*);
template <int NV, int... R>
constexpr std::array<Bf16PvFn, sizeof...(R)> Bf16PvRow(std::integer_sequence<int, R...>) {
  return {&Bf16PvKernel<R + 1, NV>...};
}

// 16 bf16 values zero-extended to 32-bit lanes. Zero-masked forms: GCC 12 warns (falsely) about the undefined
// pass-through of the unmasked intrinsics.
ATTN_BF16_TARGET inline __m512i Widen16(const uint16_t* x) {
  return _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}

// Rows 2 j2 and 2 j2 + 1 of `rows` (n rows of dim bf16 values) interleaved into out[j2 * dim + e], the
// even row in the low half; an odd n pairs the last row with zeros.
ATTN_BF16_TARGET void PackPairs(const uint16_t* __restrict rows, int64_t n, int64_t dim,
                                uint32_t* __restrict out) {
  for (int64_t j = 0; j < n; j += 2) {
    const uint16_t* lo = rows + j * dim;
    const uint16_t* hi = j + 1 < n ? lo + dim : nullptr;
    uint32_t* o = out + j / 2 * dim;
    int64_t e = 0;
    for (; e + 16 <= dim; e += 16) {
      const __m512i h = hi ? _mm512_maskz_slli_epi32(0xffff, Widen16(hi + e), 16) : _mm512_setzero_si512();
      _mm512_storeu_si512(o + e, _mm512_or_si512(Widen16(lo + e), h));
    }
    for (; e < dim; ++e) o[e] = lo[e] | (hi ? static_cast<uint32_t>(hi[e]) << 16 : 0u);
  }
}
}  // namespace

void bf16_pack_pairs(const uint16_t* rows, int64_t n, int64_t dim, uint32_t* out) {
  PackPairs(rows, n, dim, out);
}

void bf16_pv_tile(const uint32_t* v2, int64_t dim, const uint32_t* p2, int64_t ld, int64_t pairs, float* ot,
                  const float* alpha) {
  static constexpr std::array<std::array<Bf16PvFn, 8>, 2> kernels = {
      Bf16PvRow<1>(std::make_integer_sequence<int, 8>()), Bf16PvRow<2>(std::make_integer_sequence<int, 8>())};
  for (int64_t c0 = 0; c0 < ld; c0 += 32) {
    const int64_t nv = std::min<int64_t>(2, (ld - c0) / 16);
    for (int64_t d0 = 0; d0 < dim; d0 += 8) {
      const int64_t mr = std::min<int64_t>(8, dim - d0);
      kernels[nv - 1][mr - 1](v2 + d0, dim, p2 + c0, ld, pairs, ot + d0 * ld + c0, ld, alpha + c0);
    }
  }
}

void bf16_score_tile(const uint16_t* k, int64_t dim, const uint32_t* qt2, int64_t ld, int64_t nk, float* s,
                     float* colmax, float scale, const LaneBias& bias, int64_t j0) {
  static constexpr std::array<std::array<std::array<Bf16Fn, 8>, 2>, 3> kernels = {
      Bf16Table<0>(), Bf16Table<1>(), Bf16Table<2>()};
  const auto& table = kernels[static_cast<std::size_t>(bias.kind)];
  for (int64_t c0 = 0; c0 < ld; c0 += 32) {
    const int64_t nv = std::min<int64_t>(2, (ld - c0) / 16);
    const LaneBias lb{bias.kind, bias.pos ? bias.pos + c0 : nullptr, bias.slope ? bias.slope + c0 : nullptr};
    for (int64_t r0 = 0; r0 < nk; r0 += 8) {
      const int64_t mr = std::min<int64_t>(8, nk - r0);
      table[nv - 1][mr - 1](k + r0 * dim, dim, qt2 + c0, ld, dim / 2, s + r0 * ld + c0, ld,
                            colmax ? colmax + c0 : nullptr, scale, lb, j0 + r0);
    }
  }
}
#else
bool bf16_dot_supported() {
  return false;
}
double bf16_dot_rate_ratio() {
  return 0.0;
}
std::string bf16_dot_missing() {
  return "this build has no vdpbf16ps kernel (x86-64 with GCC or Clang only; CPU flag avx512_bf16)";
}
void bf16_score_tile(const uint16_t*, int64_t, const uint32_t*, int64_t, int64_t, float*, float*, float,
                     const LaneBias&, int64_t) {}
void bf16_pack_pairs(const uint16_t*, int64_t, int64_t, uint32_t*) {}
void bf16_pv_tile(const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t, float*, const float*) {}
#endif

}  // namespace attn::tiled
