// dsa's lightning indexer and top-k key selection: fp32 index scores as blocked GEMMs with the ReLU-weighted
// head sum fused, an O(n) select per query row, and an fp64 rescoring of the keys whose fp32 score is too
// close to the row's threshold to decide, so the kernel keeps exactly the keys the fp64 definition keeps.
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "common/kernels/mask.hpp"
#include "common/support/aligned.hpp"
#include "common/support/runtime.hpp"
#include "variants/dsa/dsa.hpp"

namespace attn::dsa {
namespace {

// Index-score tiles: kIndexRows query tokens (x index_heads GEMM rows) against kIndexKeys keys per task. At
// V3.2's 64 heads a tile's GEMM output is 1024 x 256 floats (1 MiB, per thread).
constexpr int64_t kIndexRows = 16;
constexpr int64_t kIndexKeys = 256;
// The fp32 score chunk of one batch entry's query rows: at most this many floats (16 MiB).
constexpr int64_t kScoreChunkFloats = int64_t{1} << 22;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The allowed keys of query t of batch entry b, ascending (the masks: causal kinds, boolean, padding).
void allowed_keys(const Problem& p, const AttentionInputs& in, int64_t b, int64_t t,
                  std::vector<int32_t>& out) {
  out.clear();
  const int64_t end = causal_key_end(p, t);
  const uint8_t* mask = p.mask.boolean ? in.mask + t * p.seq_kv : nullptr;
  const uint8_t* pad = p.mask.key_padding ? in.key_padding + b * p.seq_kv : nullptr;
  for (int64_t s = 0; s < end; ++s)
    if ((!mask || mask[s]) && (!pad || !pad[s])) out.push_back(static_cast<int32_t>(s));
}

// Per-thread scratch of the selection.
struct SelectScratch {
  std::vector<int32_t> cand, amb;
  std::vector<float> vals;
  std::vector<std::pair<double, int32_t>> ranked;
  std::vector<uint8_t> chosen;
};

// One query row's selection from its fp32 scores `srow` (indexed by key). Why it equals the fp64
// definition's: let S_s be the fp32 score and T_s the exact score of the fp32 inputs. The fp32 sum
// sum_h w_h relu(q_h . k_s) has |S_s - T_s| <= B = gamma_n sum_h |w_h| ||q_h|| ||k_s|| with n = index_dim +
// index_heads + 1 (the dot products, the product with w, the head sum; any summation order; relu is
// 1-Lipschitz; |q . k| <= ||q|| ||k||), bounded here with max_s ||k_s||. If tau is the k-th largest S, the
// k-th largest T lies in [tau - B, tau + B] (k values of S are >= tau, n - k + 1 are <= tau). With D = 2B: a
// key with S > tau + 2D has T > tau_T + 2B, so it is in the top k under any tie rule; one with S < tau - 2D
// is out. Every key in between is rescored by index_score_fp64 (the definition's own function, so bitwise its
// value, within ~1e-16 relative of T, far inside the 2B margin) and the row keeps the k - (sure keys) best
// of them by (fp64 score desc, key index asc): the definition's rule. The rescored set is the keys within a
// few fp32 ulps of the threshold: typically none or a handful.
void select_row(const Problem& p, const AttentionInputs& in, int64_t b, int64_t t, const float* srow,
                double key_norm_max, SelectScratch& sc, int32_t* keys, int32_t* count) {
  const IndexerShape ix(p);
  const int64_t topk = p.param_int("topk");
  allowed_keys(p, in, b, t, sc.cand);
  const int64_t n = static_cast<int64_t>(sc.cand.size());
  if (n <= topk) {
    std::copy(sc.cand.begin(), sc.cand.end(), keys);
    *count = static_cast<int32_t>(n);
    return;
  }
  sc.vals.resize(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) sc.vals[i] = srow[sc.cand[i]];
  std::nth_element(sc.vals.begin(), sc.vals.begin() + (topk - 1), sc.vals.end(), std::greater<float>());
  const double tau = sc.vals[static_cast<std::size_t>(topk - 1)];
  const float* qrow = in.index_q + (b * p.seq_q + t) * ix.heads * ix.dim;
  const float* wrow = in.index_w + (b * p.seq_q + t) * ix.heads;
  double weighted = 0;
  for (int64_t h = 0; h < ix.heads; ++h) {
    double qn = 0;
    for (int64_t d = 0; d < ix.dim; ++d)
      qn += static_cast<double>(qrow[h * ix.dim + d]) * qrow[h * ix.dim + d];
    weighted += std::fabs(static_cast<double>(wrow[h])) * std::sqrt(qn);
  }
  const double u = std::ldexp(1.0, -24), terms = static_cast<double>(ix.dim + ix.heads + 1);
  // B, with 1.01 for the rounding of this bound's own double arithmetic and the subnormal floor of the
  // products (each product may lose up to the smallest subnormal).
  const double bound = 1.01 * (terms * u / (1.0 - terms * u)) * weighted * key_norm_max +
                       terms * std::numeric_limits<float>::denorm_min();
  const double hi = tau + 4.0 * bound, lo = tau - 4.0 * bound;
  int64_t sure = 0;
  sc.amb.clear();
  for (int64_t i = 0; i < n; ++i) {
    const double x = srow[sc.cand[i]];
    if (x > hi)
      ++sure;
    else if (x >= lo)
      sc.amb.push_back(static_cast<int32_t>(i));
  }
  const int64_t need = topk - sure;  // in [1, amb.size()] by the argument above
  sc.ranked.clear();
  for (int32_t i : sc.amb) {
    const int32_t s = sc.cand[i];
    sc.ranked.emplace_back(
        index_score_fp64(qrow, wrow, in.index_k + (b * p.seq_kv + s) * ix.dim, ix.heads, ix.dim), i);
  }
  auto better = [&](const std::pair<double, int32_t>& x, const std::pair<double, int32_t>& y) {
    return x.first > y.first || (x.first == y.first && x.second < y.second);  // i ascending = key ascending
  };
  const int64_t take = std::min<int64_t>(need, static_cast<int64_t>(sc.ranked.size()));
  if (take > 0 && take < static_cast<int64_t>(sc.ranked.size()))
    std::nth_element(sc.ranked.begin(), sc.ranked.begin() + (take - 1), sc.ranked.end(), better);
  sc.chosen.assign(static_cast<std::size_t>(n), 0);
  for (int64_t j = 0; j < take; ++j) sc.chosen[sc.ranked[j].second] = 1;
  int32_t c = 0;
  for (int64_t i = 0; i < n; ++i)
    if (srow[sc.cand[i]] > hi || sc.chosen[i]) keys[c++] = sc.cand[i];
  *count = c;
}

// The fp32 index scores of rows [r0, r1) (a tile's rows) against keys [s0, s1): one GEMM of the rows' index
// queries ([rows * heads, dim]) by the keys' index keys, then the ReLU-weighted head sum into `out` (row
// stride seq_kv).
void score_tile(const Problem& p, const AttentionInputs& in, int64_t b, int64_t r0, int64_t r1, int64_t s0,
                int64_t s1, float* tile, float* out) {
  const IndexerShape ix(p);
  const int64_t nr = r1 - r0, ns = s1 - s0, H = ix.heads;
  sgemm(false, true, nr * H, ns, ix.dim, 1.0f, in.index_q + (b * p.seq_q + r0) * H * ix.dim, ix.dim,
        in.index_k + (b * p.seq_kv + s0) * ix.dim, ix.dim, 0.0f, tile, ns);
  for (int64_t r = 0; r < nr; ++r) {
    float* o = out + r * p.seq_kv + s0;
    const float* w = in.index_w + (b * p.seq_q + r0 + r) * H;
    std::fill_n(o, ns, 0.0f);
    for (int64_t h = 0; h < H; ++h) {
      const float wh = w[h];
      const float* c = tile + (r * H + h) * ns;
      for (int64_t s = 0; s < ns; ++s) o[s] += wh * std::max(c[s], 0.0f);
    }
  }
}

}  // namespace

double index_score_fp64(const float* qrow, const float* wrow, const float* krow, int64_t heads, int64_t dim) {
  double total = 0;
  for (int64_t h = 0; h < heads; ++h) {
    double dot = 0;
    for (int64_t d = 0; d < dim; ++d)
      dot += static_cast<double>(qrow[h * dim + d]) * static_cast<double>(krow[d]);
    total += static_cast<double>(wrow[h]) * std::max(dot, 0.0);
  }
  return total;
}

int64_t chunk_rows(const Problem& p) {
  return std::clamp<int64_t>(kScoreChunkFloats / std::max<int64_t>(p.seq_kv, 1), 1, p.seq_q);
}

double key_norm_max(const Problem& p, const AttentionInputs& in, int64_t b) {
  // Per block of keys, then the largest: a max is exact, so the result does not depend on the threads.
  const int64_t dim = IndexerShape(p).dim, blocks = (p.seq_kv + kIndexKeys - 1) / kIndexKeys;
  std::vector<double> block_max(static_cast<std::size_t>(blocks), 0.0);
  tbb::parallel_for(int64_t{0}, blocks, [&](int64_t blk) {
    double best = 0;
    for (int64_t s = blk * kIndexKeys; s < std::min(p.seq_kv, (blk + 1) * kIndexKeys); ++s) {
      const float* k = in.index_k + (b * p.seq_kv + s) * dim;
      double n = 0;
      for (int64_t d = 0; d < dim; ++d) n += static_cast<double>(k[d]) * k[d];
      best = std::max(best, n);
    }
    block_max[static_cast<std::size_t>(blk)] = best;
  });
  return std::sqrt(*std::max_element(block_max.begin(), block_max.end()));
}

void select_chunk(const Problem& p, const AttentionInputs& in, int64_t b, int64_t t0, int64_t t1,
                  double key_norm, float* scores, int32_t* keys, int32_t* count, PhaseTimes* times) {
  const IndexerShape ix(p);
  const int64_t capacity = std::min(p.param_int("topk"), p.seq_kv);
  const int64_t row_blocks = (t1 - t0 + kIndexRows - 1) / kIndexRows;
  const int64_t key_blocks = (p.seq_kv + kIndexKeys - 1) / kIndexKeys;
  auto start = std::chrono::steady_clock::now();
  // The indexer: tasks (row block, key block), each writing its own part of `scores`; keys past the causal
  // end of the block's last row are never scored (decode: every key; prefill: the lower triangle).
  tbb::enumerable_thread_specific<AlignedVector<float>> tiles;
  tbb::parallel_for(int64_t{0}, row_blocks * key_blocks, [&](int64_t task) {
    const int64_t r0 = t0 + (task / key_blocks) * kIndexRows, r1 = std::min(t1, r0 + kIndexRows);
    const int64_t s0 = (task % key_blocks) * kIndexKeys;
    const int64_t s1 = std::min(s0 + kIndexKeys, causal_key_end(p, r1 - 1));
    if (s0 >= s1) return;
    AlignedVector<float>& tile = tiles.local();
    tile.resize(static_cast<std::size_t>(kIndexRows * ix.heads * kIndexKeys));
    score_tile(p, in, b, r0, r1, s0, s1, tile.data(), scores + (r0 - t0) * p.seq_kv);
  });
  if (times) times->add("indexer", seconds_since(start));
  start = std::chrono::steady_clock::now();
  tbb::enumerable_thread_specific<SelectScratch> scratch;
  tbb::parallel_for(t0, t1, [&](int64_t t) {
    select_row(p, in, b, t, scores + (t - t0) * p.seq_kv, key_norm, scratch.local(),
               keys + (t - t0) * capacity, count + (t - t0));
  });
  if (times) times->add("selection", seconds_since(start));
}

std::size_t select_workspace_bytes(const Problem& p, int threads) {
  const IndexerShape ix(p);
  const auto per_thread = static_cast<std::size_t>(kIndexRows * ix.heads * kIndexKeys) * sizeof(float) +
                          static_cast<std::size_t>(p.seq_kv) * (2 * sizeof(int32_t) + sizeof(float) + 1 + 16);
  const auto chunk = static_cast<std::size_t>(chunk_rows(p) * p.seq_kv) * sizeof(float);
  return chunk + static_cast<std::size_t>(std::max(threads, 1)) * per_thread;
}

Selection select_keys(const Problem& p, const AttentionInputs& in, PhaseTimes* times) {
  Selection sel;
  sel.capacity = std::min(p.param_int("topk"), p.seq_kv);
  sel.keys.assign(static_cast<std::size_t>(p.batch * p.seq_q * sel.capacity), 0);
  sel.count.assign(static_cast<std::size_t>(p.batch * p.seq_q), 0);
  const int64_t rows = chunk_rows(p);
  AlignedVector<float> scores(static_cast<std::size_t>(rows * p.seq_kv));
  for (int64_t b = 0; b < p.batch; ++b) {
    const double kn = key_norm_max(p, in, b);
    for (int64_t t0 = 0; t0 < p.seq_q; t0 += rows) {
      const int64_t t1 = std::min(p.seq_q, t0 + rows), r = b * p.seq_q + t0;
      select_chunk(p, in, b, t0, t1, kn, scores.data(), sel.keys.data() + r * sel.capacity,
                   sel.count.data() + r, times);
    }
  }
  return sel;
}

Selection reference_select(const Problem& p, const AttentionInputs& in) {
  const IndexerShape ix(p);
  const int64_t topk = p.param_int("topk");
  Selection sel;
  sel.capacity = std::min(topk, p.seq_kv);
  sel.keys.assign(static_cast<std::size_t>(p.batch * p.seq_q * sel.capacity), 0);
  sel.count.assign(static_cast<std::size_t>(p.batch * p.seq_q), 0);
  std::vector<int32_t> allowed;
  std::vector<std::pair<double, int32_t>> ranked;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < p.seq_q; ++t) {
      allowed_keys(p, in, b, t, allowed);
      ranked.clear();
      const float* qrow = in.index_q + (b * p.seq_q + t) * ix.heads * ix.dim;
      const float* wrow = in.index_w + (b * p.seq_q + t) * ix.heads;
      for (int32_t s : allowed)
        ranked.emplace_back(
            index_score_fp64(qrow, wrow, in.index_k + (b * p.seq_kv + s) * ix.dim, ix.heads, ix.dim), s);
      // The definition's order: higher score first, the lower key index on equal scores.
      std::sort(ranked.begin(), ranked.end(), [](const auto& x, const auto& y) {
        return x.first > y.first || (x.first == y.first && x.second < y.second);
      });
      const int64_t keep = std::min<int64_t>(topk, static_cast<int64_t>(ranked.size()));
      int32_t* out = sel.keys.data() + (b * p.seq_q + t) * sel.capacity;
      for (int64_t j = 0; j < keep; ++j) out[j] = ranked[j].second;
      std::sort(out, out + keep);
      sel.count[b * p.seq_q + t] = static_cast<int32_t>(keep);
    }
  return sel;
}

}  // namespace attn::dsa
