// The BigBird-ITC block-sparse attention pattern (Zaheer et al. 2020) as a pure description, shared by the
// fast kernel, its fp64 reference, the flop count and anything that wants the weights the variant implies.
//
// Positions are cut into blocks of `block` (the last block may be partial); nb = ceil(seq / block). Query
// block qb attends whole key blocks:
//  * window: the window_blocks (odd, 2h+1) blocks qb-h .. qb+h that exist;
//  * global: g = global_blocks blocks. Without a causal mask they are the first ceil(g/2) and the last
//    floor(g/2) blocks (g = 2: the first and the last, BigBird-ITC's two global blocks); under a causal mask
//    they are the first g blocks, so that no position's pattern depends on how long the sequence is. A global
//    query block attends every key block (a full row), and every query block attends the global key blocks;
//  * random: random_blocks blocks drawn, without replacement and uniformly, from the blocks not already
//    chosen (all of them if fewer remain). Without a causal mask from every block; under a causal mask only
//    from the blocks strictly before the diagonal block qb. The draw is a pure function of (seed, qb) and the
//    candidates, through common/support/random.hpp. Global query blocks draw none (they see every block
//    anyway).
// A causal mask then applies key j <= query i inside the chosen blocks (blocks after qb drop out).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/support/error.hpp"
#include "common/support/hash.hpp"
#include "common/support/random.hpp"

namespace attn::bigbird {

// A half-open interval [begin, end) of block indices (or of positions).
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// Throws UsageError naming the parameter when a value the ParamSpecs cannot express is wrong (parity).
inline void validate_window(int64_t window_blocks) {
  if (window_blocks < 1 || window_blocks % 2 == 0)
    throw UsageError(
        "variant 'bigbird': parameter 'window_blocks': must be an odd count >= 1 (the window is "
        "centred: blocks qb-h .. qb+h for window_blocks = 2h+1), got " +
        std::to_string(window_blocks));
}

struct Pattern {
  int64_t seq = 0, block = 1, blocks = 0;  // blocks = ceil(seq / block)
  int64_t window = 1, globals = 0, randoms = 0;
  uint64_t seed = 0;
  bool causal = false;

  Pattern(int64_t seq_, int64_t block_, int64_t window_blocks, int64_t global_blocks, int64_t random_blocks,
          uint64_t seed_, bool causal_)
      : seq(seq_),
        block(block_),
        blocks((seq_ + block_ - 1) / block_),
        window(window_blocks),
        globals(global_blocks),
        randoms(random_blocks),
        seed(seed_),
        causal(causal_) {
    validate_window(window_blocks);
  }

  int64_t half() const { return window / 2; }
  // Global blocks at the start ([0, first_globals())) and at the end ([blocks - last_globals(), blocks)).
  int64_t first_globals() const { return std::min(causal ? globals : (globals + 1) / 2, blocks); }
  int64_t last_globals() const { return causal ? 0 : std::min(globals / 2, blocks - first_globals()); }
  bool is_global(int64_t b) const { return b < first_globals() || b >= blocks - last_globals(); }
  // Positions of block b.
  Range positions(int64_t b) const { return {b * block, std::min(seq, (b + 1) * block)}; }

  // The random key blocks of query block qb, in draw order. Candidates: [0, blocks) (causal: [0, qb)) minus
  // the window and global blocks. Each draw picks rank x uniform in [0, remaining) (rng.next() % remaining: a
  // bias below remaining / 2^64, i.e. < 2^-24 for any valid size) and maps it to the x-th block not yet
  // excluded, walking the sorted excluded intervals; O(randoms · (randoms + 3)) per block, independent of the
  // sequence length.
  std::vector<int64_t> random_blocks(int64_t qb) const {
    std::vector<int64_t> out;
    if (randoms == 0 || is_global(qb)) return out;
    const int64_t limit = causal ? qb : blocks;  // candidates are [0, limit)
    std::vector<Range> excluded;                 // sorted, disjoint, inside [0, limit)
    auto exclude = [&](Range r) {
      r.begin = std::max<int64_t>(r.begin, 0), r.end = std::min(r.end, limit);
      if (r.begin < r.end) excluded.push_back(r);
    };
    exclude({0, first_globals()});
    exclude({std::max(qb - half(), first_globals()), std::min(qb + half() + 1, blocks - last_globals())});
    exclude({blocks - last_globals(), blocks});
    int64_t remaining = limit;
    for (const Range& r : excluded) remaining -= r.size();
    const int64_t count = std::min(randoms, remaining);
    if (count == remaining) {  // every candidate: no draw needed
      int64_t b = 0;
      for (const Range& r : excluded) {
        for (; b < r.begin; ++b) out.push_back(b);
        b = r.end;
      }
      for (; b < limit; ++b) out.push_back(b);
      return out;
    }
    Rng rng(mix64(seed ^ 0x6a09e667f3bcc909ULL) ^ mix64(static_cast<uint64_t>(qb) + 0x632be59bd9b4e019ULL));
    for (int64_t t = 0; t < count; ++t) {
      int64_t pos = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(remaining - t));
      auto it = excluded.begin();
      for (; it != excluded.end() && it->begin <= pos; ++it) pos += it->size();
      excluded.insert(it, Range{pos, pos + 1});
      out.push_back(pos);
    }
    return out;
  }

  // The key blocks query block qb attends, as sorted, disjoint, maximal runs of blocks (adjacent blocks
  // merged: each run is one contiguous range of K/V rows). Under a causal mask, blocks after qb are dropped.
  std::vector<Range> key_block_runs(int64_t qb) const {
    const int64_t end = causal ? qb + 1 : blocks;
    if (is_global(qb)) return {{0, end}};
    std::vector<Range> parts = {{0, first_globals()},
                                {std::max<int64_t>(qb - half(), 0), std::min(qb + half() + 1, end)},
                                {blocks - last_globals(), blocks}};
    for (int64_t b : random_blocks(qb)) parts.push_back({b, b + 1});
    std::sort(parts.begin(), parts.end(), [](const Range& a, const Range& b) {
      return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
    });
    std::vector<Range> runs;
    for (Range r : parts) {
      r.end = std::min(r.end, end);
      if (r.begin >= r.end) continue;
      if (!runs.empty() && r.begin <= runs.back().end)
        runs.back().end = std::max(runs.back().end, r.end);
      else
        runs.push_back(r);
    }
    return runs;
  }

  // Sorted key blocks of query block qb (key_block_runs expanded).
  std::vector<int64_t> key_blocks(int64_t qb) const {
    std::vector<int64_t> out;
    for (const Range& r : key_block_runs(qb))
      for (int64_t b = r.begin; b < r.end; ++b) out.push_back(b);
    return out;
  }

  // Whether query i may attend key j (before key padding, a boolean mask and the data). O(randoms²): for
  // tests; dense_mask() builds every row block once.
  bool allows(int64_t i, int64_t j) const {
    if (causal && j > i) return false;
    const int64_t kb = j / block;
    for (const Range& r : key_block_runs(i / block))
      if (kb >= r.begin && kb < r.end) return true;
    return false;
  }

  // The pattern as a dense [seq, seq] boolean mask (nonzero = allowed): quadratic, for references and plots.
  std::vector<uint8_t> dense_mask() const {
    std::vector<uint8_t> mask(static_cast<std::size_t>(seq * seq), 0);
    for (int64_t qb = 0; qb < blocks; ++qb) {
      const Range rows = positions(qb);
      for (const Range& r : key_block_runs(qb)) {
        const Range keys = {positions(r.begin).begin, positions(r.end - 1).end};
        for (int64_t i = rows.begin; i < rows.end; ++i)
          for (int64_t j = keys.begin; j < keys.end && (!causal || j <= i); ++j)
            mask[static_cast<std::size_t>(i * seq + j)] = 1;
      }
    }
    return mask;
  }

  // Attended (query, key) pairs of the pattern ∧ causal over all query rows (data masks not subtracted), in
  // closed form over ranges of query blocks (the hostile-size tests ask it for seq = 2^40 with block 1), so
  // O(1) apart from the random draws below. Only one thing depends on the draws: whether a query block drew
  // the last block when that block is partial, not global, outside its window and only some candidates are
  // drawn (global_blocks <= 1, no causal mask). Those draws are replayed exactly while that takes at most
  // 2^22 draws in all; beyond that (more than 2^22 / random_blocks such query blocks) the count uses the
  // expected share randoms / candidates per query block instead, which differs from the drawn count by at
  // most block × (block - last block's size) pairs per such query block.
  double pairs() const { return causal ? causal_pairs() : full_pairs(); }

  // Σ_{t < count} min(v + slope·t, cap) for slope in {-1, 0, 1}.
  static double sum_min_linear(int64_t count, int64_t v, int64_t slope, int64_t cap) {
    if (count <= 0) return 0;
    auto series = [](double first, double step, double n) { return n * first + step * n * (n - 1) / 2; };
    const double c = static_cast<double>(cap);
    if (slope == 0) return static_cast<double>(count) * static_cast<double>(std::min(v, cap));
    if (slope > 0) {  // below the cap for t < cap - v
      const int64_t t0 = std::clamp<int64_t>(cap - v, 0, count);
      return series(static_cast<double>(v), 1, static_cast<double>(t0)) + static_cast<double>(count - t0) * c;
    }
    const int64_t t0 = std::clamp<int64_t>(v - cap, 0, count);  // at the cap while v - t >= cap
    return static_cast<double>(t0) * c +
           series(static_cast<double>(v - t0), -1, static_cast<double>(count - t0));
  }

 private:
  int64_t last_size() const { return seq - (blocks - 1) * block; }

  // Causal: global query blocks [0, fg) see their past (row i: i + 1 keys); query block qb >= fg sees
  // min(qb, fg + h + r) whole earlier blocks (its window's past, the globals and min(r, candidates) random
  // ones: the candidates are exactly the blocks before qb outside those) and the triangle of its own block.
  double causal_pairs() const {
    const int64_t fg = first_globals(), c = fg + half() + randoms, lb = last_size();
    const double B = static_cast<double>(block), P = static_cast<double>(std::min(seq, fg * block));
    double total = P * (P + 1) / 2;
    if (fg >= blocks) return total;
    const int64_t full = blocks - 1 - fg;  // full query blocks fg .. blocks-2
    total += B * B * sum_min_linear(full, fg, 1, c) + static_cast<double>(full) * B * (B + 1) / 2;
    const double L = static_cast<double>(lb);
    return total + L * B * static_cast<double>(std::min(blocks - 1, c)) + L * (L + 1) / 2;
  }

  // Without a causal mask: global query blocks see every key; query block qb in [fg, blocks - lg) sees
  // min(F(qb) + r, blocks) blocks, F(qb) = |window ∪ globals|, each of `block` keys except the partial last.
  double full_pairs() const {
    const int64_t fg = first_globals(), lg = last_globals(), h = half(), lb = last_size();
    const double B = static_cast<double>(block), n = static_cast<double>(seq);
    const double global_rows = static_cast<double>(std::min(seq, fg * block)) +
                               (lg > 0 ? static_cast<double>((lg - 1) * block + lb) : 0.0);
    double total = global_rows * n;
    const int64_t lo = fg, hi = blocks - lg;  // non-global query blocks
    if (lo >= hi) return total;
    auto F = [&](int64_t qb) { return fg + lg + std::min(qb + h + 1, blocks - lg) - std::max(qb - h, fg); };
    // Full-row query blocks [lo, full_hi); the last block, when not global, is added alone below.
    const int64_t full_hi = lg == 0 ? hi - 1 : hi;
    // F is linear between its breakpoints fg + h and blocks - lg - h - 1: sum min(F + r, blocks) piecewise.
    std::vector<int64_t> cuts = {lo, std::clamp(fg + h, lo, full_hi),
                                 std::clamp(blocks - lg - h - 1, lo, full_hi), full_hi};
    std::sort(cuts.begin(), cuts.end());
    double key_blocks = 0;
    for (std::size_t s = 0; s + 1 < cuts.size(); ++s) {
      const int64_t a = cuts[s], b = cuts[s + 1];
      if (a >= b) continue;
      key_blocks += sum_min_linear(b - a, F(a) + randoms, b - a > 1 ? F(a + 1) - F(a) : 0, blocks);
    }
    // Query blocks among them whose keys include the partial last block (it has lb < block keys).
    double with_last = 0;
    if (lb < block && lo < full_hi) {
      if (lg > 0) {
        with_last = static_cast<double>(full_hi - lo);  // a global block
      } else {
        const int64_t window_from = std::max(lo, blocks - 1 - h);  // ... in the window from here on
        with_last = static_cast<double>(std::max<int64_t>(0, full_hi - window_from));
        const int64_t rand_hi = std::min(full_hi, window_from);  // ... a random candidate before
        if (randoms > 0 && lo < rand_hi) {
          if (static_cast<double>(rand_hi - lo) * static_cast<double>(randoms) <= 4194304.0) {
            for (int64_t qb = lo; qb < rand_hi; ++qb) {
              if (F(qb) + randoms >= blocks) {
                ++with_last;  // every candidate is taken
              } else {
                const std::vector<int64_t> r = random_blocks(qb);
                with_last += std::find(r.begin(), r.end(), blocks - 1) != r.end();
              }
            }
          } else {
            const int64_t mid = lo + (rand_hi - lo) / 2;
            const double cand = static_cast<double>(blocks - F(mid));
            with_last +=
                static_cast<double>(rand_hi - lo) * std::min(1.0, static_cast<double>(randoms) / cand);
          }
        }
      }
    }
    total += B * (B * key_blocks - (B - static_cast<double>(lb)) * with_last);
    if (lg == 0) {  // the last block's own rows, not global: it always holds itself
      const double L = static_cast<double>(lb);
      total += L * (B * static_cast<double>(std::min(F(blocks - 1) + randoms, blocks)) - (B - L));
    }
    return total;
  }
};

}  // namespace attn::bigbird
