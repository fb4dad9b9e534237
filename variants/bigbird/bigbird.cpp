// bigbird: softmax attention restricted to BigBird-ITC's block-sparse pattern (Zaheer et al. 2020): each
// query block attends a window of neighbouring blocks, the global blocks and a few seeded random blocks;
// global blocks attend everything. The pattern is variants/bigbird/pattern.hpp. Time O(n·(w+g+r)·block·d)
// plus the global rows' O(g·block·n·d); memory per thread O(64 × chunk) scores: never a seq × seq matrix.
// The backward (see "Backward" below) has the same cost, from the forward's log-sum-exp per row.
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/alibi.hpp"
#include "common/kernels/dropout.hpp"
#include "common/kernels/mask.hpp"
#include "common/kernels/vmath.hpp"
#include "common/reference/reference.hpp"
#include "common/support/aligned.hpp"
#include "common/support/runtime.hpp"
#include "variants/bigbird/pattern.hpp"

namespace attn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr double kMaxCount = static_cast<double>(int64_t{1} << 40);
// Query rows per task: a block taller than this is split into row tiles (each row's keys are its block's).
constexpr int64_t kRowTile = 64;
// Score columns per online-softmax step. The default pattern (w + g + r = 8 blocks of 64) fits in one step,
// so ordinary query blocks run a plain softmax; global rows (every key) and larger blocks take several steps.
constexpr int64_t kChunk = 512;

// How the work is cut, from the problem alone (never from the thread count).
struct Plan {
  bigbird::Pattern pattern;
  int64_t tile;             // query rows per task: min(block, seq, kRowTile)
  int64_t tiles_per_block;  // tasks per query block
  int64_t chunk;            // score columns per online-softmax step

  explicit Plan(const Problem& p)
      : pattern(p.seq_q, p.param_int("block"), p.param_int("window_blocks"), p.param_int("global_blocks"),
                p.param_int("random_blocks"), static_cast<uint64_t>(p.param_int("seed")),
                p.mask.any_causal()) {
    const int64_t rows = std::min(pattern.block, pattern.seq);  // rows of the tallest block
    tile = std::min(rows, kRowTile);
    tiles_per_block = (rows + tile - 1) / tile;
    // The most keys one row may need: every key with a global block, else window + random blocks.
    const int64_t blocks = pattern.blocks;
    const double pattern_keys =
        static_cast<double>(std::min(pattern.window, blocks) + std::min(pattern.randoms, blocks)) *
        static_cast<double>(rows);
    const int64_t max_keys =
        pattern.first_globals() > 0
            ? pattern.seq
            : static_cast<int64_t>(std::min(pattern_keys, static_cast<double>(pattern.seq)));
    chunk = std::min(max_keys, kChunk);
  }
  // Per-thread scratch: the score tile and the running max and sum of its rows.
  int64_t score_floats() const { return tile * chunk + 2 * tile; }
};

// A contiguous range of keys placed at score column `col` of the current step.
struct Piece {
  int64_t key, len, col;
};

struct Scratch {
  AlignedVector<float> s;
  std::vector<float> m, l;
  std::vector<bigbird::Range> keys;
  std::vector<Piece> pieces;
};
// The backward's P and dS of one score row from the forward's log-sum-exp. On entry s holds the logits
// (-inf where the row may not attend) and dp the products dO_i . v_j; on exit s holds P after dropout (what
// multiplies dO into dV) and dp holds dS = P (dp' - delta), dp' = dp times dropout's keep / (1 - p), with
// P = exp(s - lse) (0 for a masked key). Column c is key j0 + c for dropout's decisions. A row with no
// allowed key (lse = +inf) gets zeros: it has no gradient.
void gradient_row(float* s, float* dp, int64_t n, float lse, float delta, const DropoutRow* drop,
                  int64_t j0) {
  if (lse == kPosInf) {
    std::fill(s, s + n, 0.0f);
    std::fill(dp, dp + n, 0.0f);
    return;
  }
  (void)exp_sub_sum(s, n, lse);
  if (!drop) {
    for (int64_t c = 0; c < n; ++c) dp[c] = s[c] * (dp[c] - delta);
    return;
  }
  const float kd = drop->scale();
  for (int64_t c = 0; c < n; ++c) {
    const bool kept = drop->keep(j0 + c);
    const float prob = s[c];
    dp[c] = prob * ((kept ? dp[c] * kd : 0.0f) - delta);
    s[c] = kept ? prob * kd : 0.0f;
  }
}

// delta_i = dO_i . O_i per query row, summed in order.
std::vector<float> row_deltas(const Problem& p, const GradientArgs& g) {
  const int64_t rows = p.batch * p.heads * p.seq_q, D = p.head_dim;
  std::vector<float> delta(static_cast<std::size_t>(rows));
  tbb::parallel_for(int64_t{0}, rows, [&](int64_t x) {
    float acc = 0;
    for (int64_t d = 0; d < D; ++d) acc += g.d_out[x * D + d] * g.out[x * D + d];
    delta[static_cast<std::size_t>(x)] = acc;
  });
  return delta;
}

// The key ranges a tile of query block qb reads, whose last row is i_last: the block's key-block runs as
// contiguous key ranges, cut at that row's causal limit.
void tile_key_ranges(const Problem& p, const bigbird::Pattern& pat, int64_t qb, int64_t i_last,
                     std::vector<bigbird::Range>& keys) {
  const int64_t key_end = causal_key_end(p, i_last);
  keys.clear();
  for (const bigbird::Range& r : pat.key_block_runs(qb)) {
    const bigbird::Range k = {pat.positions(r.begin).begin, std::min(pat.positions(r.end - 1).end, key_end)};
    if (k.begin < k.end) keys.push_back(k);
  }
}

// Cuts the next step of up to C score columns from the key ranges, continuing at (range, next_key): its
// pieces, in order. Returns the step's columns.
int64_t next_step(const std::vector<bigbird::Range>& keys, std::size_t& range, int64_t& next_key, int64_t C,
                  std::vector<Piece>& pieces) {
  pieces.clear();
  int64_t cols = 0;
  while (cols < C && range < keys.size()) {
    const int64_t len = std::min(C - cols, keys[range].end - next_key);
    pieces.push_back({next_key, len, cols});
    cols += len, next_key += len;
    if (next_key == keys[range].end && ++range < keys.size()) next_key = keys[range].begin;
  }
  return cols;
}

// The data-dependent part of the logits: causal limit, key padding, boolean mask and ALiBi, applied to one
// query row's scores the same way by the forward and both backward passes.
struct RowMasks {
  const Problem& p;
  const AttentionInputs& in;
  std::vector<float> slopes;  // ALiBi, fp32 (empty without)
  int64_t alibi_shift;
  bool data_masks;  // padding, boolean mask or ALiBi: a per-key pass

  RowMasks(const Problem& p_, const AttentionInputs& in_)
      : p(p_),
        in(in_),
        slopes(alibi_slopes_f32(p_, in_)),
        alibi_shift(alibi_query_offset(p_)),
        data_masks(p_.mask.key_padding || p_.mask.boolean || p_.bias == Bias::alibi) {}

  // Query i of head h (batch b), scores sr of the pieces: keys at or after the causal limit, padded or
  // masked get -inf; the others get the ALiBi bias.
  void apply(int64_t b, int64_t h, int64_t i, float* sr, const Piece* pieces, std::size_t count) const {
    const int64_t n = p.seq_q, allowed_end = causal_key_end(p, i);  // keys >= allowed_end follow the query
    for (std::size_t x = 0; x < count; ++x) {
      const Piece& pc = pieces[x];
      float* s = sr + pc.col;
      const int64_t masked_from = std::clamp<int64_t>(allowed_end - pc.key, 0, pc.len);
      std::fill(s + masked_from, s + pc.len, kNegInf);
      if (!data_masks) continue;
      for (int64_t c = 0; c < masked_from; ++c) {
        const int64_t j = pc.key + c;
        if ((p.mask.key_padding && in.key_padding[b * n + j]) || (p.mask.boolean && !in.mask[i * n + j])) {
          s[c] = kNegInf;
        } else if (!slopes.empty()) {
          const int64_t d = i + alibi_shift - j;
          s[c] -= slopes[static_cast<std::size_t>(h)] *
                  static_cast<float>(p.mask.any_causal() ? d : (d < 0 ? -d : d));
        }
      }
    }
  }
};

// One online-softmax step of one row (scores sr, `cols` of them, already masked): rescales what earlier
// steps accumulated in the output row when the row max grows, turns the scores into unnormalised weights
// (dropout applied) and updates the row's max m and sum l.
void online_softmax_row(const Problem& p, int64_t b, int64_t h, int64_t i, float* sr, int64_t cols,
                        const std::vector<Piece>& pieces, bool first, float* orow, float& m, float& l) {
  const float cm = row_max(sr, cols), old = m;
  const float mx = std::isnan(cm) || std::isnan(old) ? std::nanf("") : std::max(old, cm);
  if (mx == kNegInf) {  // nothing allowed so far: this step adds nothing
    std::fill(sr, sr + cols, 0.0f);
    return;
  }
  if (!first) {
    if (old == kNegInf)
      std::fill(orow, orow + p.head_dim, 0.0f);  // earlier steps added only zero weights
    else if (mx != old)
      scale_row(orow, p.head_dim, std::exp(old - mx));
  }
  const float sum = exp_sub_sum(sr, cols, mx);
  l = (old == kNegInf ? 0.0f : l * std::exp(old - mx)) + sum;
  m = mx;
  if (p.dropout > 0) {
    // Dropped after normalisation in the definition; here on the unnormalised weights, whose sum l keeps
    // every weight: the same result.
    const DropoutRow drop(p.dropout, p.seed, b, h, i);
    for (const Piece& pc : pieces)
      for (int64_t c = 0; c < pc.len; ++c)
        sr[pc.col + c] = drop.keep(pc.key + c) ? sr[pc.col + c] * drop.scale() : 0.0f;
  }
}

// The forward (run() and the training forward alike); with `lse`, each query row's log-sum-exp
// ([batch, heads, seq], natural log, +inf for a row with no allowed key) is written too.
void forward_tiles(const Problem& p, const AttentionInputs& in, float* lse) {
  const Plan plan(p);
  const bigbird::Pattern& pat = plan.pattern;
  const int64_t n = p.seq_q, D = p.head_dim, T = plan.tile, C = plan.chunk;
  const int64_t tasks_per_head = pat.blocks * plan.tiles_per_block;
  const float scale = static_cast<float>(p.effective_scale());
  const RowMasks masks(p, in);
  tbb::enumerable_thread_specific<Scratch> scratch;

  tbb::parallel_for(int64_t{0}, p.batch * p.heads * tasks_per_head, [&](int64_t task) {
    const int64_t bh = task / tasks_per_head, qb = task % tasks_per_head / plan.tiles_per_block;
    const bigbird::Range rows = pat.positions(qb);
    const int64_t i0 = rows.begin + task % plan.tiles_per_block * T;
    if (i0 >= rows.end) return;  // a partial last block has fewer tiles
    const int64_t i1 = std::min(rows.end, i0 + T), nr = i1 - i0;
    const int64_t b = bh / p.heads, h = bh % p.heads;
    const float* q = in.q + (bh * n + i0) * D;
    const float* k = in.k + p.kv_block(b, h) * n * D;  // grouped-query: the group's K/V, read in place
    const float* v = in.v + p.kv_block(b, h) * n * D;
    float* o = in.out + (bh * n + i0) * D;

    Scratch& sc = scratch.local();
    if (static_cast<int64_t>(sc.s.size()) < T * C) sc.s.resize(static_cast<std::size_t>(T * C));
    sc.m.assign(static_cast<std::size_t>(nr), kNegInf);
    sc.l.assign(static_cast<std::size_t>(nr), 0.0f);
    tile_key_ranges(p, pat, qb, i1 - 1, sc.keys);

    bool first = true;  // no step has written O yet
    std::size_t range = 0;
    int64_t next_key = sc.keys.empty() ? 0 : sc.keys[0].begin;
    while (range < sc.keys.size()) {
      const int64_t cols = next_step(sc.keys, range, next_key, C, sc.pieces);
      float* s = sc.s.data();
      for (const Piece& pc : sc.pieces)
        sgemm(false, true, nr, pc.len, D, scale, q, D, k + pc.key * D, D, 0.0f, s + pc.col, C);
      for (int64_t r = 0; r < nr; ++r) {
        masks.apply(b, h, i0 + r, s + r * C, sc.pieces.data(), sc.pieces.size());
        online_softmax_row(p, b, h, i0 + r, s + r * C, cols, sc.pieces, first, o + r * D, sc.m[r], sc.l[r]);
      }
      for (const Piece& pc : sc.pieces) {
        sgemm(false, false, nr, D, pc.len, 1.0f, s + pc.col, C, v + pc.key * D, D, first ? 0.0f : 1.0f, o, D);
        first = false;
      }
    }

    for (int64_t r = 0; r < nr; ++r) {
      float* orow = o + r * D;
      const bool empty = first || sc.m[r] == kNegInf;
      if (empty)
        std::fill(orow, orow + D, 0.0f);  // no allowed key: zeros, never NaN
      else
        scale_row(orow, D, 1.0f / sc.l[r]);
      if (lse) lse[bh * n + i0 + r] = empty ? kPosInf : sc.m[r] + std::log(sc.l[r]);
    }
  });
}

// ---- Backward ----
// The training forward saves each query row's log-sum-exp. The backward recomputes the weights from it,
// P = exp(s - lse), in two passes that each own what they write, so no output has two writers and nothing is
// reduced across tasks: the same inputs give bitwise the same gradients at any thread count.
//  * dQ, by the forward's query tiles and score steps: S and dP = dO V^T on the tile's key ranges, then
//    dS = P (dP' - delta) and dQ = scale dS K (three GEMMs);
//  * dK and dV, by key tiles (up to kRowTile keys of one key block): the query blocks whose pattern holds
//    that key block (Inverse, below; a global key block's are every block) as contiguous query ranges, in
//    steps of kChunk rows; S and dP again as [queries x keys], then dV += P^T dO and dK += scale dS^T Q (four
//    GEMMs), over the group's query heads and the steps in a fixed order.
// Seven GEMMs over the pattern instead of FlashAttention-2's five: the two recomputed products buy the
// ownership split (no per-task copies of dQ or dK/dV to sum, no atomics). delta = rowsum(dO * O).

// For every key block, the query blocks whose pattern holds it (ascending): the pattern read by columns.
struct Inverse {
  std::vector<int64_t> offsets;  // query blocks of key block kb: [offsets[kb], offsets[kb + 1])
  std::vector<int64_t> blocks;

  explicit Inverse(const bigbird::Pattern& pat) {
    std::vector<std::vector<int64_t>> rows(static_cast<std::size_t>(pat.blocks));
    tbb::parallel_for(int64_t{0}, pat.blocks, [&](int64_t qb) { rows[qb] = pat.key_blocks(qb); });
    offsets.assign(static_cast<std::size_t>(pat.blocks + 1), 0);
    for (const auto& r : rows)
      for (int64_t kb : r) ++offsets[static_cast<std::size_t>(kb + 1)];
    for (int64_t kb = 0; kb < pat.blocks; ++kb) offsets[kb + 1] += offsets[kb];
    blocks.resize(static_cast<std::size_t>(offsets.back()));
    std::vector<int64_t> at(offsets.begin(), offsets.end() - 1);
    for (int64_t qb = 0; qb < pat.blocks; ++qb)  // in order: each key block's list comes out ascending
      for (int64_t kb : rows[qb]) blocks[static_cast<std::size_t>(at[kb]++)] = qb;
  }
  // An upper bound on the bytes the constructor holds at once (backward_workspace_bytes): its lists twice
  // (per query block, then per key block), the offsets and the per-query-block vectors.
  static std::size_t bytes(const bigbird::Pattern& pat) {
    const int64_t nb = pat.blocks, globals = std::min(nb, pat.first_globals() + pat.last_globals());
    const int64_t per_block = std::min(nb, pat.window + pat.globals + pat.randoms);
    const std::size_t entries =
        sat_add(sat_mul(to_size(nb - globals), to_size(per_block)), sat_mul(to_size(globals), to_size(nb)));
    return sat_add(sat_mul(2, entries, sizeof(int64_t)),
                   sat_mul(to_size(nb + 1), sizeof(int64_t) + sizeof(std::vector<int64_t>)));
  }
};

// What every backward task reads. lse (g.saved) and delta are [batch, heads, seq].
struct BackwardContext {
  const Problem& p;
  const AttentionInputs& in;
  const GradientArgs& g;
  const Plan plan;
  const RowMasks masks;
  const float scale;
  const std::vector<float> delta;
  const Inverse inverse;

  BackwardContext(const Problem& p_, const AttentionInputs& in_, const GradientArgs& g_)
      : p(p_),
        in(in_),
        g(g_),
        plan(p_),
        masks(p_, in_),
        scale(static_cast<float>(p_.effective_scale())),
        delta(row_deltas(p_, g_)),
        inverse(plan.pattern) {}

  // P and dS of query row i of head h over the step's pieces (see gradient_row).
  void gradient(float* s, float* dp, int64_t b, int64_t h, int64_t i,
                const std::vector<Piece>& pieces) const {
    const int64_t x = (b * p.heads + h) * p.seq_q + i;
    const DropoutRow drop = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, b, h, i) : DropoutRow();
    for (const Piece& pc : pieces)
      gradient_row(s + pc.col, dp + pc.col, pc.len, g.saved[x], delta[static_cast<std::size_t>(x)],
                   p.dropout > 0 ? &drop : nullptr, pc.key);
  }
};

// Per-thread scratch of the backward: two score-sized buffers (S, then P; dP, then dS) of the larger of the
// dQ pass's steps (tile x chunk) and the dK pass's (kChunk query rows x tile keys, at most seq rows).
int64_t backward_floats(const Plan& plan) {
  return 2 * plan.tile * std::max(plan.chunk, std::min(plan.pattern.seq, kChunk));
}

struct BackwardScratch {
  AlignedVector<float> s;
  std::vector<bigbird::Range> ranges;
  std::vector<Piece> pieces;
};

// dQ of one query tile: the forward's steps over its key ranges, with P from the saved log-sum-exp.
void dq_task(const BackwardContext& c, int64_t task, BackwardScratch& w) {
  const Problem& p = c.p;
  const bigbird::Pattern& pat = c.plan.pattern;
  const int64_t n = p.seq_q, D = p.head_dim, T = c.plan.tile, C = c.plan.chunk;
  const int64_t tasks_per_head = pat.blocks * c.plan.tiles_per_block;
  const int64_t bh = task / tasks_per_head, qb = task % tasks_per_head / c.plan.tiles_per_block;
  const bigbird::Range rows = pat.positions(qb);
  const int64_t i0 = rows.begin + task % c.plan.tiles_per_block * T;
  if (i0 >= rows.end) return;
  const int64_t i1 = std::min(rows.end, i0 + T), nr = i1 - i0, b = bh / p.heads, h = bh % p.heads;
  const float *q = c.in.q + (bh * n + i0) * D, *go = c.g.d_out + (bh * n + i0) * D;
  const float* k = c.in.k + p.kv_block(b, h) * n * D;
  const float* v = c.in.v + p.kv_block(b, h) * n * D;
  float* dq = c.g.dq + (bh * n + i0) * D;
  float *s = w.s.data(), *dp = s + T * C;
  tile_key_ranges(p, pat, qb, i1 - 1, w.ranges);
  bool first = true;
  std::size_t range = 0;
  int64_t next_key = w.ranges.empty() ? 0 : w.ranges[0].begin;
  while (range < w.ranges.size()) {
    next_step(w.ranges, range, next_key, C, w.pieces);
    for (const Piece& pc : w.pieces) {
      sgemm(false, true, nr, pc.len, D, c.scale, q, D, k + pc.key * D, D, 0.0f, s + pc.col, C);
      sgemm(false, true, nr, pc.len, D, 1.0f, go, D, v + pc.key * D, D, 0.0f, dp + pc.col, C);
    }
    for (int64_t r = 0; r < nr; ++r) {
      c.masks.apply(b, h, i0 + r, s + r * C, w.pieces.data(), w.pieces.size());
      c.gradient(s + r * C, dp + r * C, b, h, i0 + r, w.pieces);
    }
    for (const Piece& pc : w.pieces) {
      sgemm(false, false, nr, D, pc.len, c.scale, dp + pc.col, C, k + pc.key * D, D, first ? 0.0f : 1.0f, dq,
            D);
      first = false;
    }
  }
  if (first) std::fill(dq, dq + nr * D, 0.0f);  // no key at all (causal cut): no gradient
}

// The query ranges that attend key tile [j0, j1) of key block kb: the inverse's query blocks merged into
// contiguous position ranges, each starting no earlier than j0 under a causal mask (earlier queries see none
// of these keys).
void tile_query_ranges(const BackwardContext& c, int64_t kb, int64_t j0, std::vector<bigbird::Range>& out) {
  const bigbird::Pattern& pat = c.plan.pattern;
  out.clear();
  const int64_t* qbs = c.inverse.blocks.data();
  for (int64_t x = c.inverse.offsets[kb]; x < c.inverse.offsets[kb + 1]; ++x) {
    bigbird::Range r = pat.positions(qbs[x]);
    if (c.p.mask.any_causal()) r.begin = std::max(r.begin, j0);
    if (r.begin >= r.end) continue;
    if (!out.empty() && out.back().end == r.begin)
      out.back().end = r.end;
    else
      out.push_back(r);
  }
}

// dK and dV of one key tile: for each query head of the group, its query ranges in steps of up to kChunk
// rows, S and dP as [rows x keys], P and dS per row, dV += P^T dO and dK += scale dS^T Q.
void dk_task(const BackwardContext& c, int64_t task, BackwardScratch& w) {
  const Problem& p = c.p;
  const bigbird::Pattern& pat = c.plan.pattern;
  const int64_t n = p.seq_q, D = p.head_dim, T = c.plan.tile, S = std::min(n, kChunk);
  const int64_t tasks_per_kv = pat.blocks * c.plan.tiles_per_block;
  const int64_t bkv = task / tasks_per_kv, kb = task % tasks_per_kv / c.plan.tiles_per_block;
  const int64_t j0 = pat.positions(kb).begin + task % c.plan.tiles_per_block * T;
  if (j0 >= pat.positions(kb).end) return;
  const int64_t nk = std::min(pat.positions(kb).end, j0 + T) - j0, group = p.group_size();
  const int64_t b = bkv / p.num_kv_heads(), kvh = bkv % p.num_kv_heads();
  const float *kt = c.in.k + (bkv * n + j0) * D, *vt = c.in.v + (bkv * n + j0) * D;
  float *dk = c.g.dk + (bkv * n + j0) * D, *dv = c.g.dv + (bkv * n + j0) * D;
  float *s = w.s.data(), *dp = s + S * T;
  tile_query_ranges(c, kb, j0, w.ranges);
  w.pieces.assign(1, Piece{j0, nk, 0});  // every row reads the tile's keys, contiguous
  bool first = true;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const int64_t head = (b * p.heads + h) * n * D;
    for (const bigbird::Range& r : w.ranges) {
      for (int64_t i0 = r.begin; i0 < r.end; i0 += S) {
        const int64_t len = std::min(S, r.end - i0);
        const float *q = c.in.q + head + i0 * D, *go = c.g.d_out + head + i0 * D;
        sgemm(false, true, len, nk, D, c.scale, q, D, kt, D, 0.0f, s, T);
        sgemm(false, true, len, nk, D, 1.0f, go, D, vt, D, 0.0f, dp, T);
        for (int64_t x = 0; x < len; ++x) {
          c.masks.apply(b, h, i0 + x, s + x * T, w.pieces.data(), 1);
          c.gradient(s + x * T, dp + x * T, b, h, i0 + x, w.pieces);
        }
        sgemm(true, false, nk, D, len, 1.0f, s, T, go, D, first ? 0.0f : 1.0f, dv, D);
        sgemm(true, false, nk, D, len, c.scale, dp, T, q, D, first ? 0.0f : 1.0f, dk, D);
        first = false;
      }
    }
  }
  if (first) std::fill(dk, dk + nk * D, 0.0f), std::fill(dv, dv + nk * D, 0.0f);  // no query attends
}

// The backward: delta, then the dQ tiles and the dK/dV tiles in one parallel loop (they write different
// tensors).
void backward_tiles(const Problem& p, const AttentionInputs& in, const GradientArgs& g) {
  const BackwardContext c(p, in, g);
  const int64_t per_head = c.plan.pattern.blocks * c.plan.tiles_per_block, floats = backward_floats(c.plan);
  const int64_t dq_tasks = p.batch * p.heads * per_head, dk_tasks = p.batch * p.num_kv_heads() * per_head;
  tbb::enumerable_thread_specific<BackwardScratch> scratch;
  tbb::parallel_for(int64_t{0}, dq_tasks + dk_tasks, [&](int64_t task) {
    BackwardScratch& w = scratch.local();
    if (static_cast<int64_t>(w.s.size()) < floats) w.s.resize(static_cast<std::size_t>(floats));
    task < dq_tasks ? dq_task(c, task, w) : dk_task(c, task - dq_tasks, w);
  });
}

// The pattern ∧ the user's mask as one boolean mask, and the problem and inputs that read it: what the fp64
// reference forward and backward and the gradient tolerance use (quadratic memory, like their time).
struct MaskedProblem {
  Problem p;
  std::vector<uint8_t> mask;
  AttentionInputs in;
  MaskedProblem(const Problem& prob, const AttentionInputs& inputs) : p(prob), in(inputs) {
    mask = Plan(prob).pattern.dense_mask();
    if (prob.mask.boolean)
      for (std::size_t e = 0; e < mask.size(); ++e) mask[e] = mask[e] && inputs.mask[e];
    p.mask.boolean = true;
    in.mask = mask.data();
  }
  MaskedProblem(const MaskedProblem&) = delete;
  MaskedProblem& operator=(const MaskedProblem&) = delete;
};

class BigBird final : public Attention {
 public:
  std::string name() const override { return "bigbird"; }
  std::string description() const override {
    return "softmax over BigBird-ITC's block-sparse pattern: window, global and seeded random key blocks "
           "(Zaheer et al. 2020), dense GEMMs on contiguous key-block runs, O(n·(w+g+r)·block·d)";
  }
  Capabilities capabilities() const override {
    // Not exact: exact softmax on a sparse pattern, not full attention (the sweep measures the gap). Blocks
    // are defined on one sequence, so no cross-attention, and so causal_lower_right (offset seq_kv - seq_q =
    // 0) is causal: the kernel applies it through causal_key_end. Positions matter: not permutation
    // equivariant. bf16 / fp16: widened to fp32 up front (WideInputs, counted in workspace_bytes).
    return {.exact = false,
            .causal = true,
            .causal_lower_right = true,
            .gqa = true,
            .boolean_mask = true,
            .key_padding = true,
            .cross = false,
            .dropout = true,
            .bf16 = true,
            .fp16 = true,
            .alibi = true,
            .permutation_equivariant = false,
            .backward = true};
  }
  std::vector<ParamSpec> param_specs() const override {
    return {
        {.name = "block",
         .type = ParamType::integer,
         .default_value = 64,
         .help = "positions per block (the last block may be partial)",
         .min = 1,
         .max = kMaxCount},
        {.name = "window_blocks",
         .type = ParamType::integer,
         .default_value = 3,
         .help = "odd 2h+1: query block qb attends key blocks qb-h .. qb+h",
         .min = 1,
         .max = kMaxCount - 1},  // odd, like every valid value
        {.name = "global_blocks",
         .type = ParamType::integer,
         .default_value = 2,
         .help = "global blocks (attend and are attended by everything): the first ceil(g/2) and the last "
                 "floor(g/2) blocks; causal: the first g",
         .min = 0,
         .max = kMaxCount},
        {.name = "random_blocks",
         .type = ParamType::integer,
         .default_value = 3,
         .help = "random key blocks per query block, drawn from the blocks not already chosen (causal: "
                 "from earlier blocks only)",
         .min = 0,
         .max = kMaxCount},
        {.name = "seed",
         .type = ParamType::integer,
         .default_value = 0,
         .help = "seed of the random blocks (the draw of block qb depends only on seed, qb and the "
                 "candidates)",
         .min = 0,
         .max = 9007199254740992.0}};
  }
  std::vector<Json> test_param_sets() const override {
    // The checks run seq 1..130: blocks of 1, 4, 5 and 16 make partial last blocks, sequences with fewer
    // blocks than window + global + random (every candidate taken, no draw) and with many (33 blocks of 4,
    // 130 of 1), no global block, an odd global count (2 first, 1 last) and a wide window.
    return {Json::object(),
            {{"block", 1}, {"window_blocks", 3}, {"global_blocks", 1}, {"random_blocks", 2}},
            {{"block", 4}, {"window_blocks", 1}, {"global_blocks", 2}, {"random_blocks", 3}, {"seed", 5}},
            {{"block", 5}, {"window_blocks", 3}, {"global_blocks", 0}, {"random_blocks", 2}},
            {{"block", 4}, {"window_blocks", 5}, {"global_blocks", 3}, {"random_blocks", 1}, {"seed", 7}},
            {{"block", 16}}};
  }

  double flops(const Problem& p) const override {
    // 4·d FLOPs (a row of QKᵀ and of P·V) per (query, key) pair of the pattern ∧ causal, counted from the
    // pattern in closed form (Pattern::pairs says when random draws are replayed); key padding and boolean
    // masks are data and are not subtracted, as in exact_attention_flops. Not counted: the upper triangle of
    // the diagonal tile under causal, which the kernel computes and masks.
    const Plan plan(p);
    return 4.0 * static_cast<double>(p.batch * p.heads) * static_cast<double>(p.head_dim) *
           plan.pattern.pairs();
  }

  std::size_t workspace_bytes(const Problem& p, int threads) const override {
    const Plan plan(p);
    // Per thread: the score tile with its row max and sum, and the key ranges of one query block (at most
    // random + 3 runs, a piece per run per step); random_blocks() builds lists of the same length. bf16 /
    // fp16 add fp32 copies of Q, K and V. Saturating (common/interface/util.hpp).
    const std::size_t lists =
        sat_mul(sat_add(to_size(std::min(plan.pattern.randoms, plan.pattern.blocks)), 3),
                sizeof(bigbird::Range) + sizeof(Piece) + sizeof(bigbird::Range) + 8);
    const std::size_t per_thread = sat_add(sat_mul(to_size(plan.score_floats()), sizeof(float)), lists);
    const std::size_t widened =
        p.dtype == DType::fp32
            ? 0
            : sat_mul(sat_add(to_size(p.q_elements()), sat_mul(2, to_size(p.kv_elements()))), sizeof(float));
    return sat_add(sat_mul(to_size(std::max(threads, 1)), per_thread), widened);
  }

  // The training forward keeps each query row's log-sum-exp (backward's comment above).
  std::size_t saved_floats(const Problem& p) const override { return to_size(p.batch * p.heads * p.seq_q); }
  std::string saved_description() const override {
    return "log-sum-exp per query row [batch, heads, seq] (natural log; +inf for a row with no allowed key)";
  }
  double backward_flops(const Problem& p) const override {
    // Seven matmuls per attended pair (dQ pass: S, dP, dQ; dK/dV pass: S, dP, dK, dV), 2·d FLOPs each,
    // counted over the pattern's pairs as flops() counts them: 14·d against the forward's 4·d.
    return 3.5 * flops(p);
  }
  std::size_t backward_workspace_bytes(const Problem& p, int threads) const override {
    const Plan plan(p);
    // Per thread: backward_floats and the lists of one tile, each at most one entry per block: its query or
    // key ranges, the pieces of one score step and key_block_runs' temporaries (as workspace_bytes counts
    // them). Shared: delta (one float per query row) and the pattern's inverse (Inverse::bytes, an upper
    // bound). Saturating.
    const std::size_t lists = sat_mul(to_size(plan.pattern.blocks),
                                      sizeof(bigbird::Range) + sizeof(Piece) + sizeof(bigbird::Range) + 8);
    const std::size_t per_thread = sat_add(sat_mul(to_size(backward_floats(plan)), sizeof(float)), lists);
    return sat_add(sat_mul(to_size(std::max(threads, 1)), per_thread),
                   sat_mul(to_size(p.batch * p.heads * p.seq_q), sizeof(float)),
                   Inverse::bytes(plan.pattern));
  }

  void reference_forward(const Problem& p, const AttentionInputs& in, double* out) const override {
    // Exact softmax under the equivalent boolean mask: pattern ∧ (the user's mask, if any); the shared
    // reference applies causal, padding, ALiBi and dropout itself, and widens bf16 / fp16 Q, K, V (exactly)
    // as the kernel does; the default abs_tolerance (exact_abs_tolerance) reads them the same way.
    const MaskedProblem m(p, in);
    reference_attention(m.p, m.in, out);
  }
  void reference_backward(const Problem& p, const AttentionInputs& in, const float* d_out, double* dq,
                          double* dk, double* dv) const override {
    // The gradient of reference_forward: exact softmax attention's under the same mask.
    const MaskedProblem m(p, in);
    reference_attention_backward(m.p, m.in, d_out, dq, dk, dv);
  }
  GradientTolerance grad_tolerance(const Problem& p, const AttentionInputs& in,
                                   const float* d_out) const override {
    // The running-error bound of exact softmax attention's backward on the masked problem: the backward is
    // that computation with the masked pairs' weights exactly 0 (its sums run over fewer terms than the
    // bound's seq_kv, so it holds with room).
    const MaskedProblem m(p, in);
    return exact_grad_tolerance(m.p, m.in, d_out);
  }

 protected:
  std::vector<std::string> extra_not_supported_reasons(const Problem& p) const override {
    // An even window is a usage error, not a skip (the ParamSpec cannot express parity).
    bigbird::validate_window(p.param_int("window_blocks"));
    return {};
  }

  void forward(const Problem& p, const AttentionInputs& stored) const override {
    const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
    forward_tiles(p, wide.get(), nullptr);
  }
  void forward_saving(const Problem& p, const AttentionInputs& stored, float* saved) const override {
    const WideInputs wide(p, stored);  // one computation with forward(): it only adds the lse writes
    forward_tiles(p, wide.get(), saved);
  }
  void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const override {
    backward_tiles(p, in, g);
  }
};

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::BigBird)
