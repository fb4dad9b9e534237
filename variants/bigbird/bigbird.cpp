// bigbird: softmax attention restricted to BigBird-ITC's block-sparse pattern (Zaheer et al. 2020): each
// query block attends a window of neighbouring blocks, the global blocks and a few seeded random blocks;
// global blocks attend everything. The pattern is variants/bigbird/pattern.hpp. Time O(n·(w+g+r)·block·d)
// plus the global rows' O(g·block·n·d); memory per thread O(64 × chunk) scores: never a seq × seq matrix.
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/alibi.hpp"
#include "common/aligned.hpp"
#include "common/attention.hpp"
#include "common/dropout.hpp"
#include "common/half.hpp"
#include "common/mask.hpp"
#include "common/reference.hpp"
#include "common/runtime.hpp"
#include "common/util.hpp"
#include "common/vmath.hpp"
#include "variants/bigbird/pattern.hpp"

namespace attn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
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
            .permutation_equivariant = false};
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
    // fp16 add fp32 copies of Q, K and V. Saturating (common/util.hpp).
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

  void reference_forward(const Problem& p, const AttentionInputs& in, double* out) const override {
    // Exact softmax under the equivalent boolean mask: pattern ∧ (the user's mask, if any); the shared
    // reference applies causal, padding, ALiBi and dropout itself, and widens bf16 / fp16 Q, K, V (exactly)
    // as the kernel does; the default abs_tolerance (exact_abs_tolerance) reads them the same way. Quadratic
    // memory, like its time.
    const Plan plan(p);
    std::vector<uint8_t> mask = plan.pattern.dense_mask();
    if (p.mask.boolean)
      for (std::size_t e = 0; e < mask.size(); ++e) mask[e] = mask[e] && in.mask[e];
    Problem masked = p;
    masked.mask.boolean = true;
    AttentionInputs masked_in = in;
    masked_in.mask = mask.data();
    reference_attention(masked, masked_in, out);
  }

 protected:
  std::vector<std::string> extra_not_supported_reasons(const Problem& p) const override {
    // An even window is a usage error, not a skip (the ParamSpec cannot express parity).
    bigbird::validate_window(p.param_int("window_blocks"));
    return {};
  }

  void forward(const Problem& p, const AttentionInputs& stored) const override {
    const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
    const AttentionInputs& in = wide.get();
    const Plan plan(p);
    const bigbird::Pattern& pat = plan.pattern;
    const int64_t n = p.seq_q, D = p.head_dim, T = plan.tile, C = plan.chunk;
    const int64_t tasks_per_head = pat.blocks * plan.tiles_per_block;
    const float scale = static_cast<float>(p.effective_scale());
    const bool alibi = p.bias == Bias::alibi;
    const std::vector<float> slopes = alibi_slopes_f32(p, in);
    const int64_t alibi_shift = alibi_query_offset(p);
    const bool data_masks = p.mask.key_padding || p.mask.boolean || alibi;
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
      // The block's key blocks as contiguous key ranges, cut at the causal limit of the tile's last row.
      const int64_t key_end = causal_key_end(p, i1 - 1);
      sc.keys.clear();
      for (const bigbird::Range& r : pat.key_block_runs(qb)) {
        const bigbird::Range keys = {pat.positions(r.begin).begin,
                                     std::min(pat.positions(r.end - 1).end, key_end)};
        if (keys.begin < keys.end) sc.keys.push_back(keys);
      }

      bool first = true;  // no step has written O yet
      std::size_t range = 0;
      int64_t next_key = sc.keys.empty() ? 0 : sc.keys[0].begin;
      while (range < sc.keys.size()) {
        // One step: up to C columns taken from the key ranges in order.
        sc.pieces.clear();
        int64_t cols = 0;
        while (cols < C && range < sc.keys.size()) {
          const int64_t len = std::min(C - cols, sc.keys[range].end - next_key);
          sc.pieces.push_back({next_key, len, cols});
          cols += len, next_key += len;
          if (next_key == sc.keys[range].end && ++range < sc.keys.size()) next_key = sc.keys[range].begin;
        }
        float* s = sc.s.data();
        for (const Piece& pc : sc.pieces)
          sgemm(false, true, nr, pc.len, D, scale, q, D, k + pc.key * D, D, 0.0f, s + pc.col, C);

        for (int64_t r = 0; r < nr; ++r) {
          const int64_t i = i0 + r;
          float* sr = s + r * C;
          const int64_t allowed_end = causal_key_end(p, i);  // keys >= this are after the query
          for (const Piece& pc : sc.pieces) {
            float* x = sr + pc.col;
            const int64_t masked_from = std::clamp<int64_t>(allowed_end - pc.key, 0, pc.len);
            std::fill(x + masked_from, x + pc.len, kNegInf);
            if (!data_masks) continue;
            for (int64_t c = 0; c < masked_from; ++c) {
              const int64_t j = pc.key + c;
              if ((p.mask.key_padding && in.key_padding[b * n + j]) ||
                  (p.mask.boolean && !in.mask[i * n + j]))
                x[c] = kNegInf;
              else if (alibi) {
                const int64_t d = i + alibi_shift - j;
                x[c] -= slopes[static_cast<std::size_t>(h)] *
                        static_cast<float>(p.mask.any_causal() ? d : (d < 0 ? -d : d));
              }
            }
          }
          // Online softmax: rescale what earlier steps accumulated when the row max grows.
          const float cm = row_max(sr, cols), old = sc.m[r];
          const float mx = std::isnan(cm) || std::isnan(old) ? std::nanf("") : std::max(old, cm);
          float* orow = o + r * D;
          if (mx == kNegInf) {  // nothing allowed so far: this step adds nothing
            std::fill(sr, sr + cols, 0.0f);
            continue;
          }
          if (!first) {
            if (old == kNegInf)
              std::fill(orow, orow + D, 0.0f);  // earlier steps added only zero weights
            else if (mx != old)
              scale_row(orow, D, std::exp(old - mx));
          }
          const float sum = exp_sub_sum(sr, cols, mx);
          sc.l[r] = (old == kNegInf ? 0.0f : sc.l[r] * std::exp(old - mx)) + sum;
          sc.m[r] = mx;
          if (p.dropout > 0) {
            // Dropped after normalisation in the definition; here on the unnormalised weights, whose sum l
            // keeps every weight: the same result.
            const DropoutRow drop(p.dropout, p.seed, b, h, i);
            for (const Piece& pc : sc.pieces)
              for (int64_t c = 0; c < pc.len; ++c)
                sr[pc.col + c] = drop.keep(pc.key + c) ? sr[pc.col + c] * drop.scale() : 0.0f;
          }
        }
        for (const Piece& pc : sc.pieces) {
          sgemm(false, false, nr, D, pc.len, 1.0f, s + pc.col, C, v + pc.key * D, D, first ? 0.0f : 1.0f, o,
                D);
          first = false;
        }
      }

      for (int64_t r = 0; r < nr; ++r) {
        float* orow = o + r * D;
        if (first || sc.m[r] == kNegInf)
          std::fill(orow, orow + D, 0.0f);  // no allowed key: zeros, never NaN
        else
          scale_row(orow, D, 1.0f / sc.l[r]);
      }
    });
  }
};

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::BigBird)
