// tiled's AMX kernels for decode tiles at bf16 storage (Intel AMX-BF16: Sapphire Rapids and later Xeons).
// TDPBF16PS multiplies a 16 x 32 bf16 tile by a 32 x 16 one (exact products, fp32 sums) into a 16 x 16 fp32
// tile: 8192 products per instruction, where an AVX-512 FMA does 16. A decode tile (at most kDotRows query
// rows of one K/V head) is otherwise bound by its FMAs and bf16 conversions, not by memory: with 4 query
// heads per K/V head at 32K keys the widening kernels reached 0.6 of the in-run bandwidth on an Intel Xeon.
// Here the scores are S^T = K Q^T with K's rows read in place as the A tile (16 keys x 32 depth) and Q^T as
// the B tile (pairs of depth x query rows), P V = O with P rounded to bf16 (the A tile: query rows x 32 keys)
// against V packed per key tile as pairs of keys (the B tile), in the order vpunpck{l,h}wd leave (each
// 32-value chunk: dims 0-3, 8-11, 16-19, 24-27, then 4-7, ...; tiled_kernels.cpp puts O back in order).
// Highway 1.0 knows no AMX: intrinsics under a function-level target, run only where amx_missing() is "".
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "variants/tiled/tiled.hpp"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define ATTN_HAVE_AMX 1
#define ATTN_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma,amx-tile,amx-bf16")))
#else
#define ATTN_HAVE_AMX 0
#endif

namespace attn::tiled {

#if ATTN_HAVE_AMX
namespace {
// LDTILECFG's 64 bytes: palette 1, then bytes per row and rows of each of the 8 tiles.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

std::string AmxProbe() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "the CPU has no CPUID leaf 7";
  if (!(d & (1u << 24))) return "the CPU lacks the flag amx_tile";
  if (!(d & (1u << 22))) return "the CPU lacks the flag amx_bf16";
  // The softmax's rounding to bf16 and the packing of V use AVX512_BF16 and AVX512BW.
  if (const std::string why = bf16_dot_missing(); !why.empty()) return why;
  // Linux hands the 8 KiB tile state to a process only on request (XFEATURE_XTILEDATA = 18).
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) != 0)
    return std::string("the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(errno) + ")";
  return "";
}
}  // namespace

std::string amx_missing() {
  static const std::string why = AmxProbe();
  return why;
}

// Software prefetch into L1 of `bytes` from p (TILELOADD's 16 row loads are not followed by the L1
// prefetchers: without this the tile loads of K took two thirds of amx_scores even from L2).
inline void PrefetchBytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}
// Blocks of 16 keys (their K and V rows) prefetched ahead by amx_scores.
constexpr int64_t kAheadBlocks = 2;

// V rows j .. j + 15 of the key tile (rows at or past n zero) into vp as 8 key pairs: vp[r / 2 * V + c],
// rows r and r + 1 interleaved by vpunpck{l,h}wd per 32 values (the order the file comment describes).
ATTN_AMX_TARGET inline void PackPairs16(const uint16_t* v, int64_t V, int64_t n, int64_t j, uint32_t* vp) {
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t r = j; r < j + 16; r += 2) {
    uint32_t* out = vp + r / 2 * V;
    for (int64_t c = 0; c < V; c += 32) {
      const __m512i x0 = r < n ? _mm512_loadu_si512(v + r * V + c) : zero;
      const __m512i x1 = r + 1 < n ? _mm512_loadu_si512(v + (r + 1) * V + c) : zero;
      _mm512_storeu_si512(out + c, _mm512_unpacklo_epi16(x0, x1));
      _mm512_storeu_si512(out + c + 16, _mm512_unpackhi_epi16(x0, x1));
    }
  }
}

// GCC 12 warns that the _mm512_undefined_ps() inside its unpack and shuffle intrinsics "may be used
// uninitialized" once they are inlined into amx_scores (a false positive; the masks select every lane).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The 16 x 16 floats x[0..15] (rows) transposed in registers: x[c] becomes what column c was. Lanes paired
// (32-bit, then 64-bit unpacks within 128-bit blocks), then the blocks gathered by two rounds of
// shuffle_f32x4: 64 shuffles for 256 values.
ATTN_AMX_TARGET inline __m512 UnpackLo64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}
ATTN_AMX_TARGET inline __m512 UnpackHi64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}
ATTN_AMX_TARGET inline void Transpose16x16(__m512 x[16]) {
  __m512 t[16];
  for (int i = 0; i < 8;
       ++i) {  // t[2i], t[2i + 1]: rows 2i, 2i + 1 interleaved, elements 0-1 / 2-3 of a block
    t[2 * i] = _mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // x[4i + e]: block b holds rows 4i..4i+3 of column 4b + e
    x[4 * i] = UnpackLo64(t[4 * i], t[4 * i + 2]);
    x[4 * i + 1] = UnpackHi64(t[4 * i], t[4 * i + 2]);
    x[4 * i + 2] = UnpackLo64(t[4 * i + 1], t[4 * i + 3]);
    x[4 * i + 3] = UnpackHi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int e = 0; e < 4; ++e) {  // column 4b + e: block b of x[e], x[4 + e], x[8 + e], x[12 + e]
    const __m512 a = _mm512_shuffle_f32x4(x[e], x[4 + e], 0x88),
                 b = _mm512_shuffle_f32x4(x[e], x[4 + e], 0xdd);
    const __m512 c = _mm512_shuffle_f32x4(x[8 + e], x[12 + e], 0x88);
    const __m512 d = _mm512_shuffle_f32x4(x[8 + e], x[12 + e], 0xdd);
    t[e] = _mm512_shuffle_f32x4(a, c, 0x88);       // block 0
    t[8 + e] = _mm512_shuffle_f32x4(a, c, 0xdd);   // block 2
    t[4 + e] = _mm512_shuffle_f32x4(b, d, 0x88);   // block 1
    t[12 + e] = _mm512_shuffle_f32x4(b, d, 0xdd);  // block 3
  }
  for (int i = 0; i < 16; ++i) x[i] = t[i];
}

// Scores of nk keys as rows s[r * lds + j] (times scale): S^T by 16 keys per C tile (16 keys x 16 query
// columns, the columns past nr zero), 32 depth values per TDPBF16PS, transposed in registers (the scalar
// transpose it replaced took ~12% of the AMX decode's time). Also the same keys' V rows packed into vp as key
// pairs (amx_pv's B tiles) block by block, so that the K and V streams are in flight together. The last
// partial block of keys is copied into ktail ([16][D], zero-padded) so no tile load passes K's end; V rows
// past nk pack as zeros to a whole 32 keys. `left` keys from k and v may be prefetched.
ATTN_AMX_TARGET void amx_scores(const uint16_t* k, const uint16_t* v, int64_t D, int64_t V, int64_t nk,
                                int64_t left, const uint32_t* qb, int64_t nr, float scale, float* s,
                                int64_t lds, uint16_t* ktail, uint32_t* vp) {
  TileConfig cfg;
  cfg.rows[0] = 16, cfg.colsb[0] = 64;  // C: 16 keys x 16 query columns fp32
  cfg.rows[1] = 16, cfg.colsb[1] = 64;  // A: 16 keys x 32 bf16
  cfg.rows[2] = 16, cfg.colsb[2] = 64;  // B: 16 depth pairs x 16 query columns
  _tile_loadconfig(&cfg);
  alignas(64) float st[16 * 16];
  const __m512 vscale = _mm512_set1_ps(scale);
  const int64_t n32 = (nk + 31) / 32 * 32;
  for (int64_t j = 0; j < nk; j += 16) {
    const uint16_t* kb = k + j * D;
    if (const int64_t ahead = j + 16 * kAheadBlocks; ahead < left) {
      const int64_t rows = std::min<int64_t>(16, left - ahead);
      PrefetchBytes(k + ahead * D, rows * D * 2);
      PrefetchBytes(v + ahead * V, rows * V * 2);
    }
    if (j + 16 > nk) {
      std::memcpy(ktail, kb, static_cast<std::size_t>((nk - j) * D) * sizeof(uint16_t));
      std::fill(ktail + (nk - j) * D, ktail + 16 * D, uint16_t{0});
      kb = ktail;
    }
    _tile_zero(0);
    for (int64_t e = 0; e < D; e += 32) {
      _tile_loadd(1, kb + e, D * 2);
      _tile_loadd(2, qb + e / 2 * 16, 64);
      _tile_dpbf16ps(0, 1, 2);
    }
    PackPairs16(v, V, nk, j, vp);
    _tile_stored(0, st, 64);
    __m512 x[16];
    for (int i = 0; i < 16; ++i) x[i] = _mm512_load_ps(st + i * 16);
    Transpose16x16(x);
    for (int64_t r = 0; r < nr; ++r) _mm512_storeu_ps(s + r * lds + j, _mm512_mul_ps(x[r], vscale));
  }
  if (const int64_t j = (nk + 15) / 16 * 16; j < n32) PackPairs16(v, V, nk, j, vp);  // zero pairs to 32 keys
  _tile_release();
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// opart[r * V + c] = sum over the tile's keys of p[r][j] v[j][c] (c in the packing's order): p16 rows lds
// apart, bf16, zero from n to round_up(n, 32); C tiles of nr rows x 16 values, two value groups at a time
// (independent accumulation chains sharing each P tile), 32 keys per TDPBF16PS. next_k / next_v: the bytes
// of the next key tile to prefetch meanwhile (0: none).
ATTN_AMX_TARGET void amx_pv(const uint32_t* vp, int64_t V, int64_t n, const uint16_t* p16, int64_t lds,
                            int64_t nr, float* opart, const uint16_t* next_k, int64_t next_k_bytes,
                            const uint16_t* next_v, int64_t next_v_bytes) {
  // The next key tile's K and V, prefetched a slice per step: this phase reads only L1-resident data, and
  // memory would otherwise idle through it (16 query heads per K/V head, bf16, 32K keys, 2 threads, Intel
  // Xeon: 2.47 -> 1.80-1.96 ms; 8 per K/V head 3.47-3.57 -> 3.28-3.36 ms; two runs each, alternated).
  const int64_t iters = V / 32 * ((n + 31) / 32);
  const int64_t kstep = (next_k_bytes / iters + 63) / 64 * 64, vstep = (next_v_bytes / iters + 63) / 64 * 64;
  int64_t ko = 0, vo = 0;
  TileConfig cfg;
  const auto rows = static_cast<uint8_t>(nr);
  cfg.rows[0] = rows, cfg.colsb[0] = 64;  // C: nr query rows x 16 values fp32, two groups (0, 3)
  cfg.rows[3] = rows, cfg.colsb[3] = 64;
  cfg.rows[1] = 16, cfg.colsb[1] = 64;  // B: 16 key pairs x 16 values, two groups (1, 4)
  cfg.rows[4] = 16, cfg.colsb[4] = 64;
  cfg.rows[2] = rows, cfg.colsb[2] = 64;  // A: nr query rows x 32 keys bf16
  _tile_loadconfig(&cfg);
  const int64_t n32 = (n + 31) / 32 * 32;
  for (int64_t c = 0; c < V; c += 32) {  // V is a multiple of 32: whole pairs of groups
    _tile_zero(0);
    _tile_zero(3);
    for (int64_t j = 0; j < n32; j += 32) {
      _tile_loadd(2, p16 + j, lds * 2);
      _tile_loadd(1, vp + j / 2 * V + c, V * 4);
      _tile_loadd(4, vp + j / 2 * V + c + 16, V * 4);
      _tile_dpbf16ps(0, 2, 1);
      _tile_dpbf16ps(3, 2, 4);
      if (ko < next_k_bytes) {
        PrefetchBytes(reinterpret_cast<const char*>(next_k) + ko, std::min(kstep, next_k_bytes - ko));
        ko += kstep;
      }
      if (vo < next_v_bytes) {
        PrefetchBytes(reinterpret_cast<const char*>(next_v) + vo, std::min(vstep, next_v_bytes - vo));
        vo += vstep;
      }
    }
    _tile_stored(0, opart + c, V * 4);
    _tile_stored(3, opart + c + 16, V * 4);
  }
  _tile_release();
}
#else
std::string amx_missing() {
  return "this build has no AMX kernel (x86-64 Linux with GCC or Clang only; CPU flags amx_tile, amx_bf16)";
}
void amx_scores(const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, int64_t, const uint32_t*,
                int64_t, float, float*, int64_t, uint16_t*, uint32_t*) {}
void amx_pv(const uint32_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, float*, const uint16_t*,
            int64_t, const uint16_t*, int64_t) {}
#endif

}  // namespace attn::tiled
