// What tiled.cpp (the variant: tile sizes, work split) shares with tiled_kernels.cpp (the per-SIMD-target
// work of one query tile): the call context and the per-thread scratch.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/dropout.hpp"
#include "common/support/aligned.hpp"

namespace attn::tiled {

// Queries are padded to a multiple of this many lanes in every tile buffer (common/kernels/simd-inl.hpp
// kPadLanes): every target's vector width divides it.
inline constexpr int64_t kLanes = 16;

inline int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

struct Tiles {
  int64_t q, kv;  // query positions per tile, keys per tile
};

// The rows of one K/V head's query tile: grouped-query attention puts the `group` query heads that share a
// K/V head into one tile, position-major (row r = position (r / group) of the tile, query head
// kv_head * group + r % group), so each K/V tile is loaded once for all of them and never copied per head.
// Tiles with at most kDotRows rows (decode: one or a few new queries per K/V head) run the dot-product
// kernels (head_dim in the lanes); larger tiles run the GEMM micro-kernels (rows in the lanes).
inline constexpr int64_t kDotRows = 8;

// Split-KV (flash-decoding): when the (batch, K/V head, query tile) units are fewer than kSplitTarget, each
// unit's key range is cut into splits computed as separate tasks, whose partial (max, sum, unnormalised
// output) rows are merged with the online-softmax rule. The split count depends on the problem only (never
// the thread count), so results are bitwise the same on any number of threads. Splits hold at least
// kMinSplitKeys keys.
inline constexpr int64_t kSplitTarget = 32;
inline constexpr int64_t kMinSplitKeys = 512;

// The ALiBi bias of one score tile, per query lane (common/kernels/alibi.hpp): the logit of lane c and key j
// gets slope[c] * dist, dist = pos[c] - j (kind 1: causal) or |pos[c] - j| (kind 2), where pos is the lane's
// query position in the key sequence and slope = -slope_h * log2(e) (the kernels work in base 2). Padding
// lanes have slope 0. kind 0: no bias (pos, slope unused).
struct LaneBias {
  int kind = 0;
  const float* pos = nullptr;
  const float* slope = nullptr;
};

// AVX512_BF16 (tiled_bf16.cpp): whether this build and CPU have vdpbf16ps, and the score tile computed with
// it: S^T (nk x ld) = scale * K_tile Q^T + bias, K in place as bf16 (dim even), qt2 = Q^T as pairs
// ([dim / 2][ld] 32-bit words of two bf16, low half = the even element), colmax as in ScoreTile. j0 is the
// key index of the tile's first row.
bool bf16_dot_supported();
// Why this build and CPU have no vdpbf16ps ("" when they have it): names the missing CPU flag.
std::string bf16_dot_missing();
// vdpbf16ps's multiply-add rate over the fp32 FMA's on this CPU (products per second, one thread), timed
// once per process on first use (~2 ms); 0 without vdpbf16ps. bf16_kernel=auto runs the native kernels only
// where it is at least kBf16DotMinRatio: a CPU with the flag but a slow vdpbf16ps widens.
double bf16_dot_rate_ratio();
inline constexpr double kBf16DotMinRatio = 1.25;
// Why the native bf16 kernels cannot run now ("" when they can): bf16_dot_missing(), or the selected SIMD
// target is not AVX-512 (--isa / sweep.isa).
std::string native_bf16_unavailable();
// Why the AMX decode kernels cannot run now ("" when they can): amx_missing(), or the selected SIMD target
// is not AVX-512.
std::string amx_unavailable();
void bf16_score_tile(const uint16_t* k, int64_t dim, const uint32_t* qt2, int64_t ld, int64_t nk, float* s,
                     float* colmax, float scale, const LaneBias& bias, int64_t j0);
// The V tile as key pairs: rows 2 j2 and 2 j2 + 1 of `rows` ([n][dim] bf16) interleaved into
// out[j2 * dim + e] (low half = the even row; an odd n pairs the last row with 0).
void bf16_pack_pairs(const uint16_t* rows, int64_t n, int64_t dim, uint32_t* out);
// O^T (dim x ld) = alpha * O^T + V_tile^T P^T over `pairs` key pairs: v2 from bf16_pack_pairs, p2 the
// tile's probabilities rounded to bf16 as key pairs ([pairs][ld] words, low half = the even key).
void bf16_pv_tile(const uint32_t* v2, int64_t dim, const uint32_t* p2, int64_t ld, int64_t pairs, float* ot,
                  const float* alpha);

// AMX-BF16 (tiled_amx.cpp), the kernels of small query tiles where the CPU has it: why it cannot run (""
// when it can: CPU flags amx_tile and amx_bf16, avx512_bf16, and Linux granting the tile state, asked once).
std::string amx_missing();
// The query tiles AMX takes (Context::amx): kAmxMinRows .. 16 rows (decode of grouped heads, a few
// positions). Its per-key cost hardly grows with the rows, the FMA kernels' does: at bf16, 32K keys, 2
// threads on an Intel Xeon (Sapphire Rapids class) AMX took 1.75x less time than them at 8 rows, the same at
// 4 and 1.3x more at 1 (one query head per K/V head, where the FMA kernels were within 0.8 of the bandwidth).
inline constexpr int64_t kAmxMinRows = 5, kAmxMaxRows = 16;
inline bool amx_tile_rows(int64_t rows) {
  return rows >= kAmxMinRows && rows <= kAmxMaxRows;
}
// Scores s[r * lds + j] = scale * q_r . k_j of nk keys (k: [nk][D] bf16 in place, D a multiple of 32) and nr
// <= 16 query rows given as depth pairs qb[e2 * 16 + r] (columns nr..15 zero), for j up to nk rounded to 16
// (lds >= that); ktail holds 16 * D values. And the same keys' V rows ([nk][V], V a multiple of 32) as key
// pairs for amx_pv: vp holds round_up(nk, 32) / 2 * V words. `left` (>= nk): the keys from k and v that may
// be read ahead (prefetched).
void amx_scores(const uint16_t* k, const uint16_t* v, int64_t D, int64_t V, int64_t nk, int64_t left,
                const uint32_t* qb, int64_t nr, float scale, float* s, int64_t lds, uint16_t* ktail,
                uint32_t* vp);
// opart[r * V + c] = the tile's P V (c in the packing's value order; PairOrderToDims restores it): p16 nr
// rows of bf16 probabilities lds apart, zero from n to round_up(n, 32). Meanwhile it prefetches next_k_bytes
// from next_k and next_v_bytes from next_v (the next key tile).
void amx_pv(const uint32_t* vp, int64_t V, int64_t n, const uint16_t* p16, int64_t lds, int64_t nr,
            float* opart, const uint16_t* next_k, int64_t next_k_bytes, const uint16_t* next_v,
            int64_t next_v_bytes);

// Per-thread scratch for one query tile (ld = the tile's row count rounded up to kLanes). The dot-product
// path uses the same buffers row-major: qt as [rows][D], s as [rows][tile_kv rounded to kLanes], ot as
// [rows][Dv]. D is head_dim (Q, K), Dv the value width p.value_dim() (V, O): equal unless the problem has a
// distinct d_v.
struct Scratch {
  AlignedVector<float> qt;     // [D][ld]   Q^T of the tile, times scale * log2(e)
  AlignedVector<float> s;      // [tile_kv][ld]  scores, then unnormalised probabilities
  AlignedVector<float> ot;     // [Dv][ld]  running output, transposed
  AlignedVector<float> stats;  // [4][ld]   running max, running sum, tile max, rescale factor
  AlignedVector<float> bias;   // [2][ld]   ALiBi: lane positions, lane slopes (LaneBias)
  // bf16 / fp16 storage: the current K and V tiles widened to fp32 ([tile_kv][D] and [tile_kv][Dv]); for
  // the native bf16 kernels Q^T as bf16 pairs ([D / 2][ld]; the dot path: Q rows, [rows][D / 2]), the
  // tile's rounded probabilities as key pairs ([tile_kv / 2][ld]; the dot path: 16-bit rows
  // [rows][tile_kv rounded to kLanes]) and the V tile as key pairs ([tile_kv / 2][Dv]).
  // The AMX decode tiles also use p2 as 16-bit rows [rows][tile_kv rounded to 32], vt2 as V in key pairs
  // ([tile_kv rounded to 32 / 2][Dv]), qt2 as Q^T pairs [D / 2][16], ktail (the last partial block of 16 K
  // rows, zero-padded) and opart (the tile's P V, [rows][Dv]).
  AlignedVector<float> kt, vt;
  AlignedVector<uint32_t> qt2, p2, vt2;
  AlignedVector<float> opart;
  AlignedVector<uint16_t> ktail;
  std::vector<DropoutRow> drop;

  static int64_t round32(int64_t n) { return (n + 31) / 32 * 32; }
  // s: [tile_kv + kLanes][ld], or [rows][tile_kv rounded to 32] (the AMX tiles' rows; rows <= ld).
  static int64_t s_floats(int64_t ld, int64_t tile_kv) { return (round32(tile_kv) + kLanes) * ld; }
  // Words of p2: every layout above (ld >= rows).
  static int64_t p2_words(int64_t ld, int64_t tile_kv) { return round32(tile_kv) / 2 * ld; }
  void ensure(int64_t ld, int64_t tile_kv, int64_t dim, int64_t dv, bool dropout, bool wide, bool pairs) {
    auto grow = [](auto& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
    };
    grow(qt, dim * ld);
    grow(s, s_floats(ld, tile_kv));
    grow(ot, dv * ld);
    grow(stats, 4 * ld);
    grow(bias, 2 * ld);
    if (wide) {
      grow(kt, tile_kv * dim);
      grow(vt, tile_kv * dv);
    }
    if (pairs) {
      grow(qt2, (dim + 1) / 2 * ld);
      grow(p2, p2_words(ld, tile_kv));
      grow(vt2, round32(tile_kv) / 2 * dv);
      grow(opart, kAmxMaxRows * dv);
      grow(ktail, 16 * dim);
    }
    if (dropout) drop.resize(static_cast<std::size_t>(ld));
  }
  // What ensure() allocates, saturating (common/interface/util.hpp): this is also the estimate for problems
  // far too large to run (head_dim 2^40 times a 2^20-row group tile exceeds 64 bits).
  static std::size_t bytes(int64_t ld, int64_t tile_kv, int64_t dim, int64_t dv, bool dropout, bool wide,
                           bool pairs) {
    const std::size_t L = to_size(ld), K = to_size(tile_kv), D = to_size(dim), Dv = to_size(dv);
    const std::size_t K32 = (K + 31) / 32 * 32, R = to_size(kAmxMaxRows);
    const std::size_t floats =
        sat_add(sat_mul(sat_add(D, Dv, 6), L), sat_mul((K + 31) / 32 * 32 + kLanes, L),
                wide ? sat_mul(K, sat_add(D, Dv)) : 0, pairs ? sat_mul(K32 / 2 + (D + 1) / 2, L) : 0,
                pairs ? sat_mul(K32 / 2, Dv) : 0, pairs ? sat_add(sat_mul(R, Dv), sat_mul(8, D)) : 0);
    return sat_add(sat_mul(floats, sizeof(float)), dropout ? sat_mul(L, sizeof(DropoutRow)) : 0,
                   sizeof(Scratch));
  }
};

// How one forward call is cut into tasks: fixed by the problem alone.
struct Schedule {
  Tiles tiles;
  int64_t group = 1;    // query heads per K/V head
  int64_t rows = 1;     // rows of a full query tile: tiles.q * group
  int64_t q_tiles = 1;  // query tiles per K/V head
  int64_t units = 1;    // batch * kv_heads * q_tiles
  int64_t splits = 1;   // key-range splits per unit (1: no split-KV)
  // Floats of one partial row (split-KV): max, sum, then d_v (p.value_dim()) unnormalised outputs.
  int64_t partial_stride(const Problem& p) const { return p.value_dim() + 2; }
  std::size_t partial_floats(const Problem& p) const {
    return splits > 1 ? sat_mul(to_size(units), to_size(splits), to_size(rows), to_size(partial_stride(p)))
                      : 0;
  }
};

// Everything one forward call shares between its tasks.
struct Context {
  const Problem& p;
  const AttentionInputs& in;
  Schedule sched;
  float q_scale;    // scale * log2(e): the kernels exponentiate with 2^x
  float* partials;  // split-KV: [units][splits][rows][partial_stride] (null without splits)
  // ALiBi: -slope_h * log2(e) per query head (empty without the bias), and the LaneBias kind.
  std::vector<float> alibi_l2e{};
  int bias_kind = 0;
  // The native bf16 kernels (tiled.cpp native_bf16: bf16 storage, an even head_dim, bf16_kernel not widen,
  // AVX512_BF16 and the AVX-512 target): the GEMM-path tiles compute Q K^T and P V with vdpbf16ps.
  bool bf16_dot = false;
  // AMX-BF16 for the query tiles of amx_tile_rows (tiled.cpp amx_bf16: bf16 storage, head_dim and d_v
  // multiples of 32, bf16_kernel auto or amx, amx_missing() empty and the AVX-512 target).
  bool amx = false;
  // Every task writes partial rows to `partials` even without splits (accumulate_block).
  bool partial_out = false;
  // Logit soft-capping in base 2: C log2(e) (0: none); sink logits times log2(e) per query head (empty:
  // none).
  float cap2 = 0;
  std::vector<float> sink_l2e{};
  // The training forward (forward_saving): each query row's max m of the scale * log2(e) logits at
  // lse[row] and log2 of its sum of 2^(s - m) at lse[rows + row], row = (b * heads + h) * seq_q + i, rows =
  // batch * heads * seq_q (m = +inf for a row with no allowed key): the log-sum-exp in two parts.
  float* lse = nullptr;
};

// ---- Block partials: attention of a block of queries against one block of keys and values, merged into a
// running (max, sum, unnormalised output) per query row, for sequence-parallel callers (ring attention,
// bench/mpi) that see the keys block by block. The block runs through forward()'s split-KV path: every task
// writes its partial rows, and each unit's splits are merged into the state with the online-softmax rule.

// The running state of the rows [batch][heads][seq_q] of a query block: m (maximum logit, in base 2: the
// kernels' logits are scaled by log2(e)), l (sum of 2^(logit - m)) and o ([rows][d_v], d_v = p.value_dim(),
// the unnormalised output). Start from m = -inf, l = 0, o = 0 (init_partial_state).
using PartialState =
    BlockState;  // common/interface/attention.hpp: the block-partials state every variant shares
void init_partial_state(const Problem& p, const PartialState& st);

// Merges the block into the state. `p` describes the block: seq_q query rows (in.q, [batch][heads][seq_q]
// [head_dim]), seq_kv keys and values (in.k [batch][kv_heads][seq_kv][head_dim], in.v [...][d_v]), fp32, no
// bias, dropout or boolean / padding mask, tile_q / tile_kv from p.params. The causal rule is the problem's
// own (causal_offset, common/kernels/mask.hpp), so a caller maps global positions to it: a query block at q0
// against a key block at k0 needs the offset q0 - k0, which is p.mask.causal for q0 == k0 (the diagonal block
// of equal-sized chunks), p.mask.causal_lower_right for q0 - k0 == seq_kv - seq_q, and no mask at all when
// every key precedes every query. (A Context field for any offset was tried: it changed the code GCC
// generates for forward() and with it the last bits of tiled's outputs, so the kernels keep reading the
// problem.) Results are bitwise independent of the thread count. NotSupported for what it does not take.
void accumulate_block(const Problem& p, const AttentionInputs& in, const PartialState& st);
// Why accumulate_block cannot take `p` (empty: it can): storage, bias, dropout, boolean / padding masks.
std::vector<std::string> block_reasons(const Problem& p);

// The output rows [batch][heads][seq_q][d_v] of the state: o / l, zeros for a row that saw no allowed
// key, NaN for a row whose inputs held a NaN. `out` may be st.o (in place).
void finish_partial_state(const Problem& p, const PartialState& st, float* out);

// accumulate_block's workspace at `threads` threads: per-thread scratch and the partial rows.
std::size_t block_workspace_bytes(const Problem& p, int threads);

// ---- Backward (tiled_backward.cpp): FlashAttention-2, parallel over key blocks. ----

// How one backward call is cut into tasks, fixed by the problem alone (never the thread count).
struct BackwardSchedule {
  int64_t tile_q = 64;    // query rows per block (of one query head)
  int64_t tile_kv = 128;  // keys per block
  int64_t dp = 16;        // head_dim rounded up to kLanes: the row stride of the padded [rows][dp] buffers
  int64_t dpv = 16;       // value_dim rounded up to kLanes: the same for the d_v-wide ones (dV, dO)
  int64_t kv_blocks = 1;  // key blocks per K/V head
  // Key blocks of one (batch, K/V head) are dealt round-robin to `chunks` tasks (block jb to chunk
  // jb % chunks, which balances causal work); each chunk adds its part of dQ into its own copy.
  int64_t chunks = 1;
  int64_t tasks(const Problem& p) const { return p.batch * p.num_kv_heads() * chunks; }
};

// Everything one backward call shares between its tasks.
struct BackwardContext {
  const Problem& p;
  const AttentionInputs& in;
  const GradientArgs& g;  // g.saved: the forward's row max and log2 sum per query row (Context::lse)
  BackwardSchedule sched;
  float scale;         // the logit scale (dQ and dK carry it)
  float q_scale;       // scale * log2(e): logits in base 2, as the forward's
  const float* delta;  // [batch * heads * seq_q]: rowsum(dO * O)
  float* dq_part;      // [chunks][batch * heads * seq_q][dp], zeroed: each chunk's dQ / scale
  // ALiBi as the forward's: -slope_h * log2(e) per query head, kind 1 (causal) or 2 (|distance|), and the
  // query's offset in the key sequence.
  std::vector<float> alibi_l2e{};
  int bias_kind = 0;
  int64_t alibi_shift = 0;
  // The forward's query tiles (positions per tile, Schedule::tiles.q): a tile of at most kDotRows rows ran
  // the dot-product kernels, whose logits the backward recomputes the same way (forward_dot_row).
  int64_t forward_tile_q = 1;
  bool forward_dot_row(int64_t i) const {
    const int64_t t0 = i / forward_tile_q * forward_tile_q;
    return std::min(forward_tile_q, p.seq_q - t0) * p.group_size() <= kDotRows;
  }
  float cap2 = 0;  // soft-capping in base 2 (Context::cap2)
};

// Per-thread scratch of the backward: the block pair's P and dS ([tile_q][tile_kv rounded up]), K^T and V^T
// of the key block, its dK and dV accumulators ([tile_kv][dp] and [tile_kv][dpv]), the query block scaled by
// scale * log2(e), padded copies of K and Q rows when head_dim is not a multiple of kLanes and of dO rows
// when value_dim is not, and the key-padding row.
struct BackwardScratch {
  AlignedVector<float> s, dp, kt, vt, kpad, dk, dv, qpad, gpad, padv, qs, capf;
  static int64_t kv_padded(const BackwardSchedule& sc) { return round_up(sc.tile_kv, kLanes); }
  void ensure(const BackwardSchedule& sc, int64_t dim, int64_t vdim) {
    auto grow = [](auto& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
    };
    const int64_t kvp = kv_padded(sc);
    grow(s, sc.tile_q * kvp);
    grow(dp, sc.tile_q * kvp);
    grow(kt, dim * kvp);
    grow(vt, vdim * kvp);
    grow(dk, sc.tile_kv * sc.dp);
    grow(dv, sc.tile_kv * sc.dpv);
    grow(padv, kvp);
    grow(capf, kvp);
    grow(qs, sc.tile_q * dim);
    if (dim != sc.dp) {
      grow(kpad, sc.tile_kv * sc.dp);
      grow(qpad, sc.tile_q * sc.dp);
    }
    if (vdim != sc.dpv) grow(gpad, sc.tile_q * sc.dpv);
  }
  static std::size_t bytes(const BackwardSchedule& sc, int64_t dim, int64_t dv) {
    const std::size_t Q = to_size(sc.tile_q), K = to_size(sc.tile_kv), Kp = to_size(kv_padded(sc));
    const std::size_t D = to_size(dim), Dp = to_size(sc.dp), Dv = to_size(dv), Dpv = to_size(sc.dpv);
    const std::size_t floats = sat_add(
        sat_mul(2, Q, Kp), sat_mul(D + Dv, Kp), sat_mul(K, Dp + Dpv), 2 * Kp, sat_mul(Q, D),
        dim != sc.dp ? sat_add(sat_mul(K, Dp), sat_mul(Q, Dp)) : 0, dv != sc.dpv ? sat_mul(Q, Dpv) : 0);
    return sat_add(sat_mul(floats, sizeof(float)), sizeof(BackwardScratch));
  }
};

// One backward task (key-block chunk `task % chunks` of (batch, K/V head) `task / chunks`) on the selected
// SIMD target: writes its key blocks' dK and dV and adds into its chunk's dQ copy.
void run_backward_task(const BackwardContext& c, int64_t task, BackwardScratch& w);

// One task: split `split` of unit `unit` (batch, K/V head, query tile) on the selected SIMD target. Without
// splits it writes the unit's output rows; with splits, its partial rows.
void run_query_tile(const Context& c, int64_t unit, int64_t split, Scratch& w);
// Split-KV: merges the partial rows of `unit` into its output rows.
void merge_splits(const Context& c, int64_t unit);
// Block partials: merges the partial rows of `unit` into the running state.
void merge_into_state(const Context& c, int64_t unit, const PartialState& st);

}  // namespace attn::tiled
