// sliding_window: softmax attention restricted to a band of 2w+1 keys around each query (optionally dilated),
// plus Longformer-style global tokens. Time O(n·(w+g)·d); memory per thread O(tile·(w+g)), plus a 16 × seq
// strip when there are global rows: never a seq × seq matrix. The backward (see "Backward" below) has the
// same shape: O(n·(w+g)·d) time, the forward's log-sum-exp per row saved. Logit soft-capping and learned sink
// logits (Problem::softcap, Problem::sinks) as naive has them, on every path.
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/dropout.hpp"
#include "common/kernels/vmath.hpp"
#include "common/reference/reference.hpp"
#include "common/support/aligned.hpp"
#include "common/support/runtime.hpp"
#include "variants/sliding_window/pattern.hpp"
#include "variants/sliding_window/rolling_cache.hpp"

namespace attn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr int64_t kMaxWindow = int64_t{1} << 30;
// Global query rows handled per task in the global phase: their scores are a [rows, seq] strip.
constexpr int64_t kGlobalRowsPerTask = 16;

// How the band is computed ("sliding chunks"). With dilation δ, positions r, r+δ, r+2δ, ... (one residue
// class) attend only each other inside the band, and there the band is an ordinary window w. A residue class
// is a strided view of Q, K, V and O (leading dimension δ·D), so BLAS reads it in place with no gather. Each
// class is cut into query tiles of `tile` rows; a tile [t0, t1) needs keys [t0 - w, t1 + w) of its class, so
// one GEMM gives its scores, the corners outside the band are zeroed after the softmax, and one GEMM applies
// them to V. Redundant work is the corners: (tile + 2w) / (2w + 1) of the band FLOPs.
struct Plan {
  int64_t seq, dim, window, dilation, tile;
  int64_t residues;              // residue classes that hold any position: min(dilation, seq)
  int64_t tiles_per_class;       // tiles of the longest class (class 0); shorter classes skip their last task
  std::vector<int64_t> globals;  // empty unless built with positions (forward); see globals_count()
  int64_t n_globals;

  // with_positions = false: sizes only (flops, workspace_bytes), no O(seq) list of the global positions.
  explicit Plan(const Problem& p, bool with_positions = true)
      : seq(p.seq_q),
        dim(p.head_dim),
        window(p.param_int("window")),
        dilation(p.param_int("dilation")),
        globals(with_positions ? sliding_window::global_positions(p.param("global_tokens"), p.seq_q)
                               : std::vector<int64_t>{}),
        n_globals(sliding_window::global_count(p.param("global_tokens"), p.seq_q)) {
    residues = std::min(dilation, seq);
    const int64_t longest = class_length(0);
    // Tile rows: half the (effective) window, within [16, 64]. Taller tiles make bigger GEMMs but waste more
    // on the corners ((tile + 2w) / (2w + 1)); measured at n = 4096, d = 64 (1 thread, CPU time), the best
    // tiles were 16-32 for w = 32, 32 for w = 64 and 48-64 for w = 256 and 1024 (64 -> 128 at w = 256 lost
    // 10%). Fixed by the problem, never by the thread count.
    const int64_t w = std::min(window, longest);
    tile = std::clamp<int64_t>((w / 2 + 15) / 16 * 16, 16, 64);
    tiles_per_class = (longest + tile - 1) / tile;
  }
  int64_t class_length(int64_t r) const { return (seq - r + dilation - 1) / dilation; }
  int64_t globals_count() const { return n_globals; }
  // Keys of a tile's band [t0 - w, t1 + w) clipped to its class, at most this wide.
  int64_t max_span() const { return std::min(tile + 2 * window, class_length(0)); }
  int64_t band_floats() const { return tile * (max_span() + globals_count()) + 2 * globals_count() * dim; }
  // Global score rows are padded by 16 floats: a power-of-two row stride (seq = 2^k) makes every row of the
  // strip map to the same cache sets when BLAS packs it.
  int64_t global_stride() const { return seq + 16; }
  int64_t global_floats() const { return kGlobalRowsPerTask * (global_stride() + 2 * dim); }
};

// The logit options of query head h's rows (rolling_cache.hpp's RowLogits): Problem::softcap as fp32, and
// the head's sink logit (Problem::sinks).
sliding_window::RowLogits row_logits(const Problem& p, const AttentionInputs& in, int64_t h) {
  sliding_window::RowLogits r;
  if (p.softcap) r.softcap = static_cast<float>(*p.softcap);
  if (p.sinks) r.sink = in.sink_logits + h;
  return r;
}

// Soft-caps `rows` rows of `cols` logits (row stride ld) in place, s <- C tanh(s / C), with cap C > 0 (0:
// nothing). Before any mask: the map sends -inf to -C (tanh saturates), so a masked logit must be set to
// -inf after it, as naive does.
void cap_logits(float* s, int64_t rows, int64_t cols, int64_t ld, float cap) {
  if (cap <= 0) return;
  if (ld == cols) {
    softcap(s, rows * cols, cap);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) softcap(s + r * ld, cols, cap);
}

// Softmax over one score row split in two parts (band entries [lo, hi] of `band`, then `glob`), written back
// as normalised weights (dropout applied) with band entries outside [lo, hi] zeroed. Masked entries must
// already be -inf (and the logits soft-capped: cap_logits). `sink` (null: none): the head's sink logit, one
// more term of the denominator whose weight takes no value. A row with no allowed key becomes all zeros (with
// or without a sink, as naive's), so the GEMM that follows writes zeros. With `lse` (the training forward),
// the row's log-sum-exp mx + log(sum), the sink's term included, goes there (+inf: no allowed key).
void softmax_two_part(float* band, int64_t span, int64_t lo, int64_t hi, float* glob, int64_t n_glob,
                      const float* sink, const DropoutRow* drop, int64_t band_j0, int64_t band_step,
                      const int64_t* glob_j, float* lse) {
  std::fill(band, band + lo, 0.0f);
  std::fill(band + hi + 1, band + span, 0.0f);
  const int64_t width = hi - lo + 1;
  float mx = std::max(row_max(band + lo, width), row_max(glob, n_glob));
  if (mx == kNegInf) {
    std::fill(band + lo, band + hi + 1, 0.0f);
    std::fill(glob, glob + n_glob, 0.0f);
    if (lse) *lse = kPosInf;
    return;
  }
  if (sink && !std::isnan(mx)) mx = std::max(mx, *sink);
  const float sum = exp_sub_sum(band + lo, width, mx) + exp_sub_sum(glob, n_glob, mx) +
                    (sink ? std::exp(*sink - mx) : 0.0f);
  if (lse) *lse = mx + std::log(sum);
  if (drop) {
    const float keep_scale = drop->scale() / sum;
    for (int64_t c = lo; c <= hi; ++c)
      band[c] = drop->keep(band_j0 + c * band_step) ? band[c] * keep_scale : 0.0f;
    for (int64_t c = 0; c < n_glob; ++c) glob[c] = drop->keep(glob_j[c]) ? glob[c] * keep_scale : 0.0f;
  } else {
    scale_row(band + lo, width, 1.0f / sum);
    scale_row(glob, n_glob, 1.0f / sum);
  }
}

// The backward's P and dS of one score row from the forward's log-sum-exp. On entry s holds the logits
// (soft-capped when `cap` > 0, then -inf where the row may not attend) and dp the products dO_i . v_j; on
// exit s holds P after dropout (what multiplies dO into dV) and dp holds dS = P (dp' - delta) c', dp' = dp
// times dropout's keep / (1 - p), with P = exp(s - lse) (0 for a masked key; a sink's weight is in lse) and
// c' = 1 - (s / C)^2 the soft-cap's derivative d(C tanh(x / C))/dx = 1 - tanh^2(x / C) (1 without a cap;
// 0 for a masked key, whose logit -inf would make it -inf and P c' NaN). Column c is key j0 + c * step (or
// js[c]) for dropout's decisions. A row with no allowed key (lse = +inf) gets zeros: it has no gradient.
void gradient_row(float* s, float* dp, int64_t n, float lse, float delta, float cap, const DropoutRow* drop,
                  int64_t j0, int64_t step, const int64_t* js) {
  if (lse == kPosInf) {
    std::fill(s, s + n, 0.0f);
    std::fill(dp, dp + n, 0.0f);
    return;
  }
  const float kd = drop ? drop->scale() : 1.0f;
  auto kept = [&](int64_t c) { return !drop || drop->keep(js ? js[c] : j0 + c * step); };
  // dp' - delta, times c' (read from the capped logits before they become P).
  for (int64_t c = 0; c < n; ++c) {
    dp[c] = (drop ? (kept(c) ? dp[c] * kd : 0.0f) : dp[c]) - delta;
    if (cap > 0) dp[c] *= s[c] == kNegInf ? 0.0f : 1.0f - (s[c] / cap) * (s[c] / cap);
  }
  (void)exp_sub_sum(s, n, lse);
  for (int64_t c = 0; c < n; ++c) dp[c] *= s[c];
  if (drop)
    for (int64_t c = 0; c < n; ++c) s[c] = kept(c) ? s[c] * kd : 0.0f;
}

// Keys the band must not count: padded keys, and global keys (the global columns count them once).
// One row of `seq` flags per batch entry when there is padding, else one shared row; empty if none.
std::vector<uint8_t> band_excluded_keys(const Problem& p, const AttentionInputs& in, const Plan& plan) {
  if (!p.mask.key_padding && plan.globals.empty()) return {};
  const int64_t rows = p.mask.key_padding ? p.batch : 1;
  std::vector<uint8_t> ex(static_cast<std::size_t>(rows * plan.seq), 0);
  for (int64_t b = 0; b < rows; ++b) {
    uint8_t* e = ex.data() + b * plan.seq;
    if (p.mask.key_padding) std::copy_n(in.key_padding + b * plan.seq, plan.seq, e);
    for (int64_t g : plan.globals) e[g] = 1;
  }
  return ex;
}

// Rows `idx` of a [seq, dim] matrix gathered into [idx.size(), dim].
void gather_rows(const float* x, const int64_t* idx, int64_t count, int64_t dim, float* out) {
  for (int64_t c = 0; c < count; ++c) std::copy_n(x + idx[c] * dim, dim, out + c * dim);
}

// One tile of the band phase: rows [t0, t1) of residue class r (positions r + t * dilation, t the index in
// the class) of batch entry b, and the band keys [s0, s1) of the same class its rows may attend.
struct BandTile {
  int64_t b = 0, r = 0, t0 = 0, t1 = 0, s0 = 0, s1 = 0;
  int64_t rows() const { return t1 - t0; }
  int64_t span() const { return s1 - s0; }
};

// Tiles are numbered per (batch, head) as residue class × tile of the class (`heads` query heads for the
// forward and dQ, K/V heads for dK and dV): the tile of `task` (its head is task / tasks_per_head()), or
// false past a shorter class's last tile.
int64_t tasks_per_head(const Plan& plan) {
  return plan.residues * plan.tiles_per_class;
}
bool band_tile(const Problem& p, const Plan& plan, int64_t task, int64_t heads, BandTile& t) {
  const int64_t tph = tasks_per_head(plan);
  t.b = task / tph / heads;
  t.r = task % tph / plan.tiles_per_class;
  t.t0 = task % plan.tiles_per_class * plan.tile;
  const int64_t m = plan.class_length(t.r);
  if (t.t0 >= m) return false;
  t.t1 = std::min(m, t.t0 + plan.tile);
  t.s0 = std::max<int64_t>(0, t.t0 - plan.window);
  t.s1 = p.mask.any_causal() ? t.t1 : std::min(m, t.t1 + plan.window);
  return true;
}

// Sets to -inf the scores of class row t (query i) of a band tile that the query may not attend, among band
// entries [lo, hi] (its band, relative to s0) and the global columns: band keys that are excluded (`ex`:
// padded, or global, which the global columns count) or masked by the boolean mask; global keys after the
// query (causal), padded or masked. Returns [lo, hi] in `lo`, `hi`. The forward and the dQ pass mask alike.
void mask_band_row(const Problem& p, const AttentionInputs& in, const Plan& plan, const uint8_t* ex,
                   const BandTile& t, int64_t tr, float* band, float* glob, int64_t& lo, int64_t& hi) {
  const int64_t n = plan.seq, i = t.r + tr * plan.dilation;
  lo = std::max(t.s0, tr - plan.window) - t.s0;
  hi = (p.mask.any_causal() ? tr : std::min(t.s1 - 1, tr + plan.window)) - t.s0;
  if (ex || p.mask.boolean) {
    const uint8_t* allowed = p.mask.boolean ? in.mask + i * n : nullptr;
    for (int64_t c = lo; c <= hi; ++c) {
      const int64_t j = t.r + (t.s0 + c) * plan.dilation;
      if ((ex && ex[j]) || (allowed && !allowed[j])) band[c] = kNegInf;
    }
  }
  for (int64_t c = 0; c < plan.globals_count(); ++c) {
    const int64_t j = plan.globals[c];
    if ((p.mask.any_causal() && j > i) || (p.mask.key_padding && in.key_padding[t.b * n + j]) ||
        (p.mask.boolean && !in.mask[i * n + j]))
      glob[c] = kNegInf;
  }
}

// The band phase of the forward: every query row's band and global columns (global rows are written again
// by forward_global). With `lse`, each row's log-sum-exp ([batch, heads, seq]).
void forward_band(const Problem& p, const AttentionInputs& in, const Plan& plan, float* lse) {
  const int64_t n = plan.seq, D = plan.dim, dil = plan.dilation, T = plan.tile;
  const int64_t G = plan.globals_count(), ld = dil * D;
  const float scale = static_cast<float>(p.effective_scale());
  const std::vector<uint8_t> excluded = band_excluded_keys(p, in, plan);
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;

  tbb::parallel_for(int64_t{0}, p.batch * p.heads * tasks_per_head(plan), [&](int64_t task) {
    BandTile t;
    if (!band_tile(p, plan, task, p.heads, t)) return;
    const int64_t bh = task / tasks_per_head(plan), h = bh % p.heads;
    const int64_t nr = t.rows(), span = t.span(), lds = span + G;
    const int64_t kv_head = p.kv_block(t.b, h) * n * D;  // grouped-query: the group's K/V, not a copy

    AlignedVector<float>& buf = scratch.local();
    if (static_cast<int64_t>(buf.size()) < plan.band_floats()) buf.resize(plan.band_floats());
    float* s = buf.data();
    float* kg = s + T * (plan.max_span() + G);
    float* vg = kg + G * D;
    const int64_t head = bh * n * D;
    const float* q = in.q + head + (t.r + t.t0 * dil) * D;
    float* o = in.out + head + (t.r + t.t0 * dil) * D;
    const float* kb = in.k + kv_head + (t.r + t.s0 * dil) * D;
    const float* vb = in.v + kv_head + (t.r + t.s0 * dil) * D;

    // Scores: [band keys of this class | global keys], one row per query of the tile.
    sgemm(false, true, nr, span, D, scale, q, ld, kb, ld, 0.0f, s, lds);
    if (G > 0) {
      gather_rows(in.k + kv_head, plan.globals.data(), G, D, kg);
      gather_rows(in.v + kv_head, plan.globals.data(), G, D, vg);
      sgemm(false, true, nr, G, D, scale, q, ld, kg, D, 0.0f, s + span, lds);
    }

    const uint8_t* ex = excluded.empty() ? nullptr : excluded.data() + (p.mask.key_padding ? t.b * n : 0);
    const sliding_window::RowLogits logits = row_logits(p, in, h);
    cap_logits(s, nr, lds, lds, logits.softcap);
    for (int64_t row = 0; row < nr; ++row) {
      const int64_t i = t.r + (t.t0 + row) * dil;
      float* band = s + row * lds;
      int64_t lo = 0, hi = 0;
      mask_band_row(p, in, plan, ex, t, t.t0 + row, band, band + span, lo, hi);
      const DropoutRow drop = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, t.b, h, i) : DropoutRow();
      softmax_two_part(band, span, lo, hi, band + span, G, logits.sink, p.dropout > 0 ? &drop : nullptr,
                       t.r + t.s0 * dil, dil, plan.globals.data(), lse ? lse + bh * n + i : nullptr);
    }

    sgemm(false, false, nr, D, span, 1.0f, s, lds, vb, ld, 0.0f, o, ld);
    if (G > 0) sgemm(false, false, nr, D, G, 1.0f, s + span, lds, vg, D, 1.0f, o, ld);
  });
}

// Global query rows attend every key (subject to causal, padding and the boolean mask): a strip of full
// attention rows, written over what the band phase left in those rows (and their log-sum-exp).
void forward_global(const Problem& p, const AttentionInputs& in, const Plan& plan, float* lse) {
  const int64_t n = plan.seq, D = plan.dim, G = plan.globals_count();
  const int64_t tasks_per_head = (G + kGlobalRowsPerTask - 1) / kGlobalRowsPerTask;
  const float scale = static_cast<float>(p.effective_scale());
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;

  tbb::parallel_for(int64_t{0}, p.batch * p.heads * tasks_per_head, [&](int64_t task) {
    const int64_t bh = task / tasks_per_head, g0 = task % tasks_per_head * kGlobalRowsPerTask;
    const int64_t nr = std::min(G, g0 + kGlobalRowsPerTask) - g0;
    const int64_t b = bh / p.heads, h = bh % p.heads, head = bh * n * D;
    const int64_t kv_head = p.kv_block(b, h) * n * D;
    AlignedVector<float>& buf = scratch.local();
    if (static_cast<int64_t>(buf.size()) < plan.global_floats()) buf.resize(plan.global_floats());
    float* s = buf.data();
    const int64_t lds = plan.global_stride();
    float* qg = s + kGlobalRowsPerTask * lds;
    float* og = qg + kGlobalRowsPerTask * D;
    gather_rows(in.q + head, plan.globals.data() + g0, nr, D, qg);
    sgemm(false, true, nr, n, D, scale, qg, D, in.k + kv_head, D, 0.0f, s, lds);
    const sliding_window::RowLogits logits = row_logits(p, in, h);
    for (int64_t row = 0; row < nr; ++row) {
      const int64_t i = plan.globals[g0 + row];
      float* sr = s + row * lds;
      const int64_t keys = p.mask.any_causal() ? i + 1 : n;  // causal: keys after i are never attended
      cap_logits(sr, 1, keys, keys, logits.softcap);
      if (p.mask.key_padding || p.mask.boolean)
        for (int64_t j = 0; j < keys; ++j)
          if ((p.mask.key_padding && in.key_padding[b * n + j]) || (p.mask.boolean && !in.mask[i * n + j]))
            sr[j] = kNegInf;
      const DropoutRow drop = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, b, h, i) : DropoutRow();
      softmax_two_part(sr, n, 0, keys - 1, nullptr, 0, logits.sink, p.dropout > 0 ? &drop : nullptr, 0, 1,
                       nullptr, lse ? lse + bh * n + i : nullptr);
    }
    sgemm(false, false, nr, D, n, 1.0f, s, lds, in.v + kv_head, D, 0.0f, og, D);
    for (int64_t row = 0; row < nr; ++row)
      std::copy_n(og + row * D, D, in.out + head + plan.globals[g0 + row] * D);
  });
}

// ---- Decode (rolling_cache.hpp) ----
// A decode problem: seq_q < seq_kv under causal_lower_right, query row i at key position i + seq_kv - seq_q.
// Each row reads only what a rolling cache would hold (the global / sink rows and its band), in place from
// the full K/V (16-bit rows widened one at a time), through the kernel RollingKvCache uses: O((g + w) d) per
// query row, whatever seq_kv is.
int64_t decode_rows_bound(const Problem& p) {  // the most rows a non-global decode query reads
  const int64_t g = sliding_window::global_count(p.param("global_tokens"), p.seq_kv);
  return std::min(p.seq_kv, g + p.param_int("window") + 1);
}

void decode_forward(const Problem& p, const AttentionInputs& in) {
  const int64_t nq = p.seq_q, nkv = p.seq_kv, D = p.head_dim, off = nkv - nq;
  const int64_t window = p.param_int("window"), dilation = p.param_int("dilation");
  const std::vector<int64_t> globals = sliding_window::global_positions(p.param("global_tokens"), nkv);
  const float scale = static_cast<float>(p.effective_scale());
  struct Scratch {
    std::vector<int64_t> pos;
    std::vector<const float*> k, v;
    std::vector<float> scores, wide, q;
  };
  tbb::enumerable_thread_specific<Scratch> scratch;
  tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) {
    Scratch& w = scratch.local();
    const int64_t b = bh / p.heads, h = bh % p.heads, kv = p.kv_block(b, h) * nkv;
    for (int64_t i = 0; i < nq; ++i) {
      sliding_window::decode_positions(i + off, window, dilation, globals, w.pos);
      const auto count = static_cast<int64_t>(w.pos.size());
      w.k.resize(w.pos.size()), w.v.resize(w.pos.size()), w.scores.resize(w.pos.size());
      const float* q = nullptr;
      if (p.dtype == DType::fp32) {
        q = in.q + (bh * nq + i) * D;
        for (int64_t c = 0; c < count; ++c) {
          w.k[c] = in.k + (kv + w.pos[c]) * D;
          w.v[c] = in.v + (kv + w.pos[c]) * D;
        }
      } else {
        auto widen = [&](const uint16_t* x, float* y) {
          for (int64_t e = 0; e < D; ++e)
            y[e] = p.dtype == DType::bf16 ? bf16_to_float(x[e]) : fp16_to_float(x[e]);
        };
        w.wide.resize(static_cast<std::size_t>(2 * count * D));
        w.q.resize(static_cast<std::size_t>(D));
        widen(in.q16 + (bh * nq + i) * D, w.q.data());
        q = w.q.data();
        for (int64_t c = 0; c < count; ++c) {
          float* kr = w.wide.data() + 2 * c * D;
          widen(in.k16 + (kv + w.pos[c]) * D, kr);
          widen(in.v16 + (kv + w.pos[c]) * D, kr + D);
          w.k[c] = kr, w.v[c] = kr + D;
        }
      }
      sliding_window::attend_entries(q, w.k.data(), w.v.data(), count, D, scale, w.scores.data(),
                                     in.out + (bh * nq + i) * D, row_logits(p, in, h));
    }
  });
}

// ---- Backward ----
// The training forward saves each query row's log-sum-exp. The backward recomputes the weights from it,
// P = exp(s - lse), in two passes that each own what they write, so no output has two writers and nothing is
// reduced across tasks: the same inputs give bitwise the same gradients at any thread count.
//  * dQ, by query tiles as the forward cuts them (band rows: band and global columns; global rows: a full
//    strip): S and dP = dO V^T, then dS = P (dP - delta) and dQ = scale dS K (three GEMMs);
//  * dK and dV, by key tiles (the same tiles, read as keys): the queries that attend a band key tile are the
//    band queries of its class [t0 - w, t1 + w) (causal: [t0, t1 + w)) that are not global, and every global
//    query; global keys, which every query attends, take full columns in steps of query rows. S and dP are
//    recomputed as [queries x keys], then dV = P^T dO and dK = scale dS^T Q (four GEMMs).
// Seven GEMMs over the pattern instead of FlashAttention-2's five: the two recomputed products buy the
// ownership split (no per-task copies of dQ or dK/dV to sum, no atomics). delta = rowsum(dO * O).

// Query rows per step of a global key's column.
constexpr int64_t kQueryRowsPerStep = 256;

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

// What every backward task reads. lse (g.saved) and delta are [batch, heads, seq].
struct BackwardContext {
  const Problem& p;
  const AttentionInputs& in;
  const GradientArgs& g;
  const Plan& plan;
  float scale;
  float cap;  // Problem::softcap as fp32 (0: none)
  std::vector<float> delta;
  std::vector<uint8_t> excluded;   // band_excluded_keys
  std::vector<uint8_t> is_global;  // per position; empty without global tokens

  BackwardContext(const Problem& p_, const AttentionInputs& in_, const GradientArgs& g_, const Plan& plan_)
      : p(p_),
        in(in_),
        g(g_),
        plan(plan_),
        scale(static_cast<float>(p_.effective_scale())),
        cap(p_.softcap ? static_cast<float>(*p_.softcap) : 0.0f),
        delta(row_deltas(p_, g_)),
        excluded(band_excluded_keys(p_, in_, plan_)) {
    if (plan.globals.empty()) return;
    is_global.assign(static_cast<std::size_t>(plan.seq), 0);
    for (int64_t x : plan.globals) is_global[static_cast<std::size_t>(x)] = 1;
  }

  int64_t row(int64_t b, int64_t h, int64_t i) const { return (b * p.heads + h) * plan.seq + i; }
  const uint8_t* ex(int64_t b) const {
    return excluded.empty() ? nullptr : excluded.data() + (p.mask.key_padding ? b * plan.seq : 0);
  }
  bool global_row(int64_t i) const { return !is_global.empty() && is_global[static_cast<std::size_t>(i)]; }
  // gradient_row for query row i of head h over columns j0 + c * step (or js[c]): s holds the capped
  // (cap_logits), then masked logits.
  void gradient(float* s, float* dp, int64_t cols, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t step,
                const int64_t* js) const {
    const int64_t x = row(b, h, i);
    const DropoutRow drop = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, b, h, i) : DropoutRow();
    gradient_row(s, dp, cols, g.saved[x], delta[static_cast<std::size_t>(x)], cap,
                 p.dropout > 0 ? &drop : nullptr, j0, step, js);
  }
};

// Floats of per-thread scratch every backward task fits in: two score-sized buffers (S, then P; dP, then dS)
// and the gathered rows of its phase.
int64_t backward_floats(const Plan& plan) {
  const int64_t G = plan.globals_count(), D = plan.dim, R = kGlobalRowsPerTask;
  int64_t floats = 0;
  if (G < plan.seq) floats = 2 * plan.tile * (plan.max_span() + G) + 2 * G * D;  // band tiles
  if (G > 0)
    floats = std::max({floats, 2 * R * plan.global_stride() + 3 * R * D,  // global rows
                       2 * kQueryRowsPerStep * R + 4 * R * D});           // global keys
  return floats;
}

// dQ of one band tile's rows: S = scale Q [K_band | K_glob]^T and dP = dO [V_band | V_glob]^T, masked as
// the forward masks, P and dS, dQ = scale dS [K_band | K_glob]. Global rows are written again by
// dq_global_task.
void dq_band_task(const BackwardContext& c, int64_t task, float* buf) {
  const Problem& p = c.p;
  const Plan& plan = c.plan;
  BandTile t;
  if (!band_tile(p, plan, task, p.heads, t)) return;
  const int64_t n = plan.seq, D = plan.dim, dil = plan.dilation, G = plan.globals_count(), ld = dil * D;
  const int64_t h = task / tasks_per_head(plan) % p.heads, nr = t.rows(), span = t.span(), lds = span + G;
  const int64_t width = plan.tile * (plan.max_span() + G);
  float *s = buf, *dp = s + width, *kg = dp + width, *vg = kg + G * D;
  const int64_t kv = p.kv_block(t.b, h) * n * D, at = (t.b * p.heads + h) * n * D + (t.r + t.t0 * dil) * D;
  const float *q = c.in.q + at, *go = c.g.d_out + at;
  const float* kb = c.in.k + kv + (t.r + t.s0 * dil) * D;
  const float* vb = c.in.v + kv + (t.r + t.s0 * dil) * D;
  sgemm(false, true, nr, span, D, c.scale, q, ld, kb, ld, 0.0f, s, lds);
  sgemm(false, true, nr, span, D, 1.0f, go, ld, vb, ld, 0.0f, dp, lds);
  if (G > 0) {
    gather_rows(c.in.k + kv, plan.globals.data(), G, D, kg);
    gather_rows(c.in.v + kv, plan.globals.data(), G, D, vg);
    sgemm(false, true, nr, G, D, c.scale, q, ld, kg, D, 0.0f, s + span, lds);
    sgemm(false, true, nr, G, D, 1.0f, go, ld, vg, D, 0.0f, dp + span, lds);
  }
  cap_logits(s, nr, lds, lds, c.cap);
  const uint8_t* ex = c.ex(t.b);
  for (int64_t row = 0; row < nr; ++row) {
    const int64_t i = t.r + (t.t0 + row) * dil;
    float *band = s + row * lds, *dband = dp + row * lds;
    int64_t lo = 0, hi = 0;
    mask_band_row(p, c.in, plan, ex, t, t.t0 + row, band, band + span, lo, hi);
    std::fill(band, band + lo, kNegInf);
    std::fill(band + hi + 1, band + span, kNegInf);
    c.gradient(band, dband, span, t.b, h, i, t.r + t.s0 * dil, dil, nullptr);
    if (G > 0) c.gradient(band + span, dband + span, G, t.b, h, i, 0, 0, plan.globals.data());
  }
  float* dq = c.g.dq + at;
  sgemm(false, false, nr, D, span, c.scale, dp, lds, kb, ld, 0.0f, dq, ld);
  if (G > 0) sgemm(false, false, nr, D, G, c.scale, dp + span, lds, kg, D, 1.0f, dq, ld);
}

// Masks and differentiates the score rows of one band key tile (keys j0 + c * dil, c < nk, class indices
// [t0, t0 + nk)) for query head h: rows [0, span) are the band queries of class indices [q0, q0 + span) (a
// global one is zeroed: its row is among the global rows), rows span + x the global query globals[x].
void key_tile_rows(const BackwardContext& c, const BandTile& t, int64_t h, int64_t q0, float* s, float* dp,
                   int64_t lds) {
  const Problem& p = c.p;
  const Plan& plan = c.plan;
  const int64_t n = plan.seq, w = plan.window, dil = plan.dilation, nk = t.rows(), span = t.span();
  const int64_t j0 = t.r + t.t0 * dil;
  const bool causal = p.mask.any_causal();
  const uint8_t* ex = c.ex(t.b);
  auto mask_keys = [&](int64_t i, float* sr, int64_t lo, int64_t hi) {  // keys [lo, hi) in i's pattern
    std::fill(sr, sr + lo, kNegInf);
    std::fill(sr + hi, sr + nk, kNegInf);
    if (!ex && !p.mask.boolean) return;
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t j = j0 + k * dil;
      if ((ex && ex[j]) || (p.mask.boolean && !c.in.mask[i * n + j])) sr[k] = kNegInf;
    }
  };
  for (int64_t u = 0; u < span; ++u) {
    const int64_t tq = q0 + u, i = t.r + tq * dil;
    float *sr = s + u * lds, *dr = dp + u * lds;
    if (c.global_row(i)) {
      std::fill(sr, sr + nk, 0.0f);
      std::fill(dr, dr + nk, 0.0f);
      continue;
    }
    // Keys of the tile in the band of class row tq: class indices [tq - w, tq + w] (causal: up to tq).
    const int64_t lo = std::clamp<int64_t>(tq - w - t.t0, 0, nk);
    const int64_t hi = std::clamp<int64_t>((causal ? tq : tq + w) + 1 - t.t0, 0, nk);
    mask_keys(i, sr, lo, hi);
    c.gradient(sr, dr, nk, t.b, h, i, j0, dil, nullptr);
  }
  for (int64_t x = 0; x < plan.globals_count(); ++x) {
    const int64_t i = plan.globals[x];
    float *sr = s + (span + x) * lds, *dr = dp + (span + x) * lds;
    // Causal: keys j0 + k dil <= i, i.e. k < (i - j0) / dil + 1.
    const int64_t hi = causal ? std::clamp<int64_t>(i < j0 ? 0 : (i - j0) / dil + 1, 0, nk) : nk;
    mask_keys(i, sr, 0, hi);
    c.gradient(sr, dr, nk, t.b, h, i, j0, dil, nullptr);
  }
}

// dK and dV of one band key tile (see the backward's comment): for each query head of the group, S and dP
// as [band queries, global queries] x keys, P and dS (key_tile_rows), dV += P^T dO and dK += scale dS^T Q.
// Global keys' rows come out zero (their columns are masked) and are written by dk_global_task.
void dk_band_task(const BackwardContext& c, int64_t task, float* buf) {
  const Problem& p = c.p;
  const Plan& plan = c.plan;
  BandTile t;  // rows [t0, t1) are keys here; [s0, s1) the band queries
  if (!band_tile(p, plan, task, p.num_kv_heads(), t)) return;
  const int64_t n = plan.seq, D = plan.dim, dil = plan.dilation, G = plan.globals_count(), ld = dil * D;
  const int64_t bkv = task / tasks_per_head(plan), group = p.group_size(), T = plan.tile;
  if (p.mask.any_causal()) t.s0 = t.t0, t.s1 = std::min(plan.class_length(t.r), t.t1 + plan.window);
  const int64_t nk = t.rows(), span = t.span(), width = T * (plan.max_span() + G);
  float *s = buf, *dp = s + width, *qg = dp + width, *og = qg + G * D;
  const int64_t kv = bkv * n * D + (t.r + t.t0 * dil) * D;
  const float *kt = c.in.k + kv, *vt = c.in.v + kv;
  float *dk = c.g.dk + kv, *dv = c.g.dv + kv;
  for (int64_t h = bkv % p.num_kv_heads() * group; h < (bkv % p.num_kv_heads() + 1) * group; ++h) {
    const int64_t head = (t.b * p.heads + h) * n * D, at = head + (t.r + t.s0 * dil) * D;
    const float *q = c.in.q + at, *go = c.g.d_out + at;
    sgemm(false, true, span, nk, D, c.scale, q, ld, kt, ld, 0.0f, s, T);
    sgemm(false, true, span, nk, D, 1.0f, go, ld, vt, ld, 0.0f, dp, T);
    if (G > 0) {
      gather_rows(c.in.q + head, plan.globals.data(), G, D, qg);
      gather_rows(c.g.d_out + head, plan.globals.data(), G, D, og);
      sgemm(false, true, G, nk, D, c.scale, qg, D, kt, ld, 0.0f, s + span * T, T);
      sgemm(false, true, G, nk, D, 1.0f, og, D, vt, ld, 0.0f, dp + span * T, T);
    }
    cap_logits(s, span + G, nk, T, c.cap);
    key_tile_rows(c, t, h, t.s0, s, dp, T);
    const float beta = h % group == 0 ? 0.0f : 1.0f;  // the group's first head starts the sums
    sgemm(true, false, nk, D, span, 1.0f, s, T, go, ld, beta, dv, ld);
    sgemm(true, false, nk, D, span, c.scale, dp, T, q, ld, beta, dk, ld);
    if (G > 0) {
      sgemm(true, false, nk, D, G, 1.0f, s + span * T, T, og, D, 1.0f, dv, ld);
      sgemm(true, false, nk, D, G, c.scale, dp + span * T, T, qg, D, 1.0f, dk, ld);
    }
  }
}

// dQ of up to kGlobalRowsPerTask global query rows: full rows as the forward's global phase (causal: up to
// the last row's position), P and dS, dQ = scale dS K.
void dq_global_task(const BackwardContext& c, int64_t task, float* buf) {
  const Problem& p = c.p;
  const Plan& plan = c.plan;
  const int64_t n = plan.seq, D = plan.dim, G = plan.globals_count(), R = kGlobalRowsPerTask;
  const int64_t tph = (G + R - 1) / R, bh = task / tph, g0 = task % tph * R, nr = std::min(G, g0 + R) - g0;
  const int64_t b = bh / p.heads, h = bh % p.heads, head = bh * n * D, kv = p.kv_block(b, h) * n * D;
  const int64_t* rows = plan.globals.data() + g0;
  const int64_t keys = p.mask.any_causal() ? rows[nr - 1] + 1 : n, lds = plan.global_stride();
  float *s = buf, *dp = s + R * lds, *qg = dp + R * lds, *og = qg + R * D, *dq = og + R * D;
  gather_rows(c.in.q + head, rows, nr, D, qg);
  gather_rows(c.g.d_out + head, rows, nr, D, og);
  sgemm(false, true, nr, keys, D, c.scale, qg, D, c.in.k + kv, D, 0.0f, s, lds);
  sgemm(false, true, nr, keys, D, 1.0f, og, D, c.in.v + kv, D, 0.0f, dp, lds);
  cap_logits(s, nr, keys, lds, c.cap);
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t i = rows[r], own = p.mask.any_causal() ? i + 1 : n;
    float* sr = s + r * lds;
    std::fill(sr + own, sr + keys, kNegInf);
    if (p.mask.key_padding || p.mask.boolean)
      for (int64_t j = 0; j < own; ++j)
        if ((p.mask.key_padding && c.in.key_padding[b * n + j]) || (p.mask.boolean && !c.in.mask[i * n + j]))
          sr[j] = kNegInf;
    c.gradient(sr, dp + r * lds, keys, b, h, i, 0, 1, nullptr);
  }
  sgemm(false, false, nr, D, keys, c.scale, dp, lds, c.in.k + kv, D, 0.0f, dq, D);
  for (int64_t r = 0; r < nr; ++r) std::copy_n(dq + r * D, D, c.g.dq + head + rows[r] * D);
}

// dK and dV of up to kGlobalRowsPerTask global keys, whose columns every query row may attend: for each query
// head of the group, query rows in steps of kQueryRowsPerStep (causal: from the first key on), S and dP as
// [rows x keys], P and dS, dK += scale dS^T Q and dV += P^T dO, in that fixed order.
void dk_global_task(const BackwardContext& c, int64_t task, float* buf) {
  const Problem& p = c.p;
  const Plan& plan = c.plan;
  const int64_t n = plan.seq, D = plan.dim, G = plan.globals_count(), R = kGlobalRowsPerTask;
  const int64_t tph = (G + R - 1) / R, bkv = task / tph, g0 = task % tph * R, nk = std::min(G, g0 + R) - g0;
  const int64_t b = bkv / p.num_kv_heads(), kvh = bkv % p.num_kv_heads(), group = p.group_size();
  const int64_t* keys = plan.globals.data() + g0;
  const int64_t S = kQueryRowsPerStep;
  float *s = buf, *dp = s + S * R, *kg = dp + S * R, *vg = kg + R * D, *dk = vg + R * D, *dv = dk + R * D;
  gather_rows(c.in.k + bkv * n * D, keys, nk, D, kg);
  gather_rows(c.in.v + bkv * n * D, keys, nk, D, vg);
  bool first = true;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const int64_t head = (b * p.heads + h) * n * D;
    for (int64_t i0 = p.mask.any_causal() ? keys[0] : 0; i0 < n; i0 += S) {
      const int64_t len = std::min(S, n - i0);
      const float *q = c.in.q + head + i0 * D, *go = c.g.d_out + head + i0 * D;
      sgemm(false, true, len, nk, D, c.scale, q, D, kg, D, 0.0f, s, R);
      sgemm(false, true, len, nk, D, 1.0f, go, D, vg, D, 0.0f, dp, R);
      cap_logits(s, len, nk, R, c.cap);
      for (int64_t r = 0; r < len; ++r) {
        const int64_t i = i0 + r;
        float* sr = s + r * R;
        for (int64_t k = 0; k < nk; ++k) {
          const int64_t j = keys[k];
          if ((p.mask.any_causal() && j > i) || (p.mask.key_padding && c.in.key_padding[b * n + j]) ||
              (p.mask.boolean && !c.in.mask[i * n + j]))
            sr[k] = kNegInf;
        }
        c.gradient(sr, dp + r * R, nk, b, h, i, 0, 0, keys);
      }
      sgemm(true, false, nk, D, len, 1.0f, s, R, go, D, first ? 0.0f : 1.0f, dv, D);
      sgemm(true, false, nk, D, len, c.scale, dp, R, q, D, first ? 0.0f : 1.0f, dk, D);
      first = false;
    }
  }
  for (int64_t k = 0; k < nk; ++k) {
    std::copy_n(dk + k * D, D, c.g.dk + (bkv * n + keys[k]) * D);
    std::copy_n(dv + k * D, D, c.g.dv + (bkv * n + keys[k]) * D);
  }
}

// dL/d sink_h = -sum over batch entries and rows of p_sink delta, p_sink = exp(sink_h - lse) from the saved
// log-sum-exp (the sink's weight takes no value, so its dS is p_sink (0 - delta)); a row with no allowed key
// (lse = +inf) adds nothing. Summed per query head over (batch, head) blocks and rows in order, as naive's.
void sink_gradients(const Problem& p, const AttentionInputs& in, const GradientArgs& g,
                    const std::vector<float>& delta) {
  const int64_t n = p.seq_q;
  std::fill(g.d_sink_logits, g.d_sink_logits + p.heads, 0.0f);
  for (int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
    const float sink = in.sink_logits[bh % p.heads];
    for (int64_t i = 0; i < n; ++i) {
      const auto x = static_cast<std::size_t>(bh * n + i);
      g.d_sink_logits[bh % p.heads] += -std::exp(sink - g.saved[x]) * delta[x];
    }
  }
}

// The backward's phases (see above): delta, then the band tiles' dQ and dK/dV together, then the global
// rows' dQ and the global keys' dK/dV together (each overwrites what the band tiles left in its rows); the
// sink logits' gradient from delta and the saved log-sum-exp.
void backward_phases(const Problem& p, const AttentionInputs& in, const GradientArgs& g) {
  const Plan plan(p);
  const BackwardContext c(p, in, g, plan);
  if (p.sinks && g.d_sink_logits) sink_gradients(p, in, g, c.delta);
  const int64_t G = plan.globals_count(), R = kGlobalRowsPerTask;
  const int64_t floats = backward_floats(plan);
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;
  auto local = [&] {
    AlignedVector<float>& buf = scratch.local();
    if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<std::size_t>(floats));
    return buf.data();
  };
  if (G < plan.seq) {  // every position global: the global phases cover everything
    const int64_t dq_tasks = p.batch * p.heads * tasks_per_head(plan);
    const int64_t dk_tasks = p.batch * p.num_kv_heads() * tasks_per_head(plan);
    tbb::parallel_for(int64_t{0}, dq_tasks + dk_tasks, [&](int64_t task) {
      task < dq_tasks ? dq_band_task(c, task, local()) : dk_band_task(c, task - dq_tasks, local());
    });
  }
  if (G > 0) {
    const int64_t dq_tasks = p.batch * p.heads * ((G + R - 1) / R);
    const int64_t dk_tasks = p.batch * p.num_kv_heads() * ((G + R - 1) / R);
    tbb::parallel_for(int64_t{0}, dq_tasks + dk_tasks, [&](int64_t task) {
      task < dq_tasks ? dq_global_task(c, task, local()) : dk_global_task(c, task - dq_tasks, local());
    });
  }
}

// The pattern ∧ the user's mask as one boolean mask, and the problem and inputs that read it: what the fp64
// reference forward and backward and the gradient tolerance use (quadratic memory, like their time).
struct MaskedProblem {
  Problem p;
  std::vector<uint8_t> mask;
  AttentionInputs in;
  MaskedProblem(const Problem& prob, const AttentionInputs& inputs) : p(prob), in(inputs) {
    // On the key sequence: a decode problem's query row i sits at position i + seq_kv - seq_q.
    const int64_t nkv = prob.seq_kv, off = prob.seq_kv - prob.seq_q;
    const auto globals = sliding_window::global_positions(prob.param("global_tokens"), nkv);
    const sliding_window::Pattern pattern(prob.param_int("window"), prob.param_int("dilation"),
                                          prob.mask.any_causal(), globals, nkv);
    if (off == 0) {
      mask = pattern.dense_mask();
    } else {
      mask.assign(static_cast<std::size_t>(prob.seq_q * nkv), 0);
      for (int64_t i = 0; i < prob.seq_q; ++i)
        for (int64_t j = 0; j < nkv; ++j)
          mask[static_cast<std::size_t>(i * nkv + j)] = pattern.allows(i + off, j);
    }
    if (prob.mask.boolean)
      for (std::size_t e = 0; e < mask.size(); ++e) mask[e] = mask[e] && inputs.mask[e];
    p.mask.boolean = true;
    in.mask = mask.data();
  }
  MaskedProblem(const MaskedProblem&) = delete;
  MaskedProblem& operator=(const MaskedProblem&) = delete;
};

class SlidingWindow final : public Attention {
 public:
  std::string name() const override { return "sliding_window"; }
  std::string description() const override {
    return "softmax over a (dilated) band of 2w+1 keys plus global tokens (Longformer), blocked GEMMs, "
           "O(n·w·d)";
  }
  Capabilities capabilities() const override {
    // Not exact: it is exact softmax on a sparse pattern, not full attention (the sweep measures the gap).
    // Positions matter, so it is not permutation equivariant; the band is defined on one sequence, so no
    // cross-attention, and so causal_lower_right (offset seq_kv - seq_q = 0) is causal: any_causal() below.
    // Decode shapes (seq_q < seq_kv under causal_lower_right): the last seq_q positions read only the rows a
    // rolling cache of the sinks and the window holds (rolling_cache.hpp; no masks, dropout or backward).
    // bf16 / fp16: widened to fp32 up front (WideInputs, counted in workspace_bytes).
    // Soft-capping and sink logits as naive has them, on every path (band, global rows, backward, decode).
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
            .permutation_equivariant = false,
            .backward = true,
            .sinks = true,
            .softcap = true,
            .decode = true};
  }
  std::vector<ParamSpec> param_specs() const override {
    return {
        {.name = "window",
         .type = ParamType::integer,
         .default_value = 128,
         .help = "half-width w: query i attends keys i-w*dilation .. i+w*dilation (causal: .. i); "
                 "0 = each position attends only itself and the global tokens",
         .min = 0,
         .max = static_cast<double>(kMaxWindow)},
        {.name = "dilation",
         .type = ParamType::integer,
         .default_value = 1,
         .help = "step between attended keys (1 = contiguous band)",
         .min = 1,
         .max = static_cast<double>(kMaxWindow)},
        {.name = "global_tokens",
         .type = ParamType::int_or_int_list,
         .default_value = 0,
         .help = "count of leading global positions (capped at seq), or a list of distinct indices < seq; "
                 "global positions attend to every key and every query attends to them",
         .min = 0}};
  }
  std::vector<Json> test_param_sets() const override {
    // Tiny windows so band edges, tile boundaries (16-row tiles), dilation classes and globals all run on the
    // check shapes (seq 1..130); the default (w=128) covers the window >= seq case.
    return {Json::object(),
            {{"window", 2}},
            {{"window", 3}, {"dilation", 2}, {"global_tokens", 2}},
            {{"window", 0}, {"global_tokens", 1}},
            {{"window", 5}, {"dilation", 3}, {"global_tokens", Json::array({0, 4})}}};
  }

  double flops(const Problem& p) const override {
    // Decode: 4·d per (query, cached key) pair, each row reading at most the globals and the window's w+1.
    if (is_decode_shape(p))
      return 4.0 * static_cast<double>(p.batch * p.heads) * static_cast<double>(p.head_dim) *
             static_cast<double>(p.seq_q) * static_cast<double>(decode_rows_bound(p));
    // Per head: 4·d FLOPs (two GEMMs) per attended (query, key) pair of the pattern, counting band rows as
    // min(2w+1, class length) keys (w+1 when causal) plus the global keys, and global rows as seq keys.
    // Edge truncation of the band and the corners this kernel computes and discards are not counted.
    const Plan plan(p, /*with_positions=*/false);
    const double g = static_cast<double>(plan.globals_count()), n = static_cast<double>(p.seq_q);
    const int64_t band_keys = p.mask.any_causal() ? plan.window + 1 : 2 * plan.window + 1;
    const double keys = static_cast<double>(std::min(band_keys, plan.class_length(0)));
    return 4.0 * p.batch * p.heads * p.head_dim * ((n - g) * (keys + g) + g * n);
  }

  std::size_t workspace_bytes(const Problem& p, int threads) const override {
    if (is_decode_shape(p)) {
      // Per thread: positions, pointers and scores of a row's entries (and widened rows for bf16 / fp16);
      // the list of global positions once.
      const std::size_t rows = to_size(decode_rows_bound(p));
      const std::size_t per_thread =
          sat_add(sat_mul(rows, 2 * sizeof(int64_t) + 2 * sizeof(const float*) + sizeof(float)),
                  p.dtype == DType::fp32 ? 0 : sat_mul(rows + 1, 2 * to_size(p.head_dim), sizeof(float)));
      return sat_add(sat_mul(to_size(std::max(threads, 1)), per_thread),
                     sat_mul(to_size(sliding_window::global_count(p.param("global_tokens"), p.seq_kv)),
                             sizeof(int64_t)));
    }
    const Plan plan(p, /*with_positions=*/false);
    const int64_t g = plan.globals_count();
    const int64_t per_thread = plan.band_floats() + (g == 0 ? 0 : plan.global_floats());
    // Excluded-key flags (band_excluded_keys): one row per batch entry with padding, one shared row for
    // globals.
    const int64_t flags = p.mask.key_padding ? p.batch * p.seq_q : g == 0 ? 0 : p.seq_q;
    // bf16 / fp16 add fp32 copies of Q, K and V.
    // Saturating (common/interface/util.hpp): threads × per-thread floats exceeds 64 bits for the largest
    // valid sizes.
    const std::size_t widened =
        p.dtype == DType::fp32
            ? 0
            : sat_mul(sat_add(to_size(p.q_elements()), sat_mul(2, to_size(p.kv_elements()))), sizeof(float));
    return sat_add(sat_mul(to_size(std::max(threads, 1)), to_size(per_thread), sizeof(float)), to_size(flags),
                   sat_mul(to_size(g), sizeof(int64_t)), widened);
  }

  // The rolling cache a decode keeps: K and V rows of the globals (sinks) and of the last w·dilation + 1
  // positions, fp32 (RollingKvCache), at most the context: constant once the context passes it.
  std::size_t decode_state_bytes(const Problem& p) const override {
    const int64_t g = sliding_window::global_count(p.param("global_tokens"), p.seq_kv);
    const int64_t rows = std::min(p.seq_kv, g + p.param_int("window") * p.param_int("dilation") + 1);
    return sat_mul(to_size(p.batch * p.num_kv_heads()), to_size(rows), 2 * to_size(p.head_dim),
                   sizeof(float));
  }
  // Decode: Q and O once and the K/V rows a row reads (the rolling cache's), not the whole context.
  double bytes_moved(const Problem& p) const override {
    if (!is_decode_shape(p)) return compulsory_bytes(p);
    const double w = static_cast<double>(dtype_bytes(p.dtype)), q = static_cast<double>(p.q_elements());
    const double kv = 2.0 * static_cast<double>(p.batch * p.num_kv_heads() * p.head_dim) *
                      static_cast<double>(std::min(p.seq_kv, decode_rows_bound(p) + p.seq_q - 1));
    return (q + kv) * w + q * 4.0;
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
    const Plan plan(p, /*with_positions=*/false);
    const int64_t g = plan.globals_count();
    // Per thread: backward_floats. Shared: delta (one float per query row), the excluded-key flags (as the
    // forward's), the is_global flags and the list of global positions. Saturating
    // (common/interface/util.hpp).
    const int64_t flags = (p.mask.key_padding ? p.batch * p.seq_q
                           : g == 0           ? 0
                                              : p.seq_q) +
                          (g == 0 ? 0 : p.seq_q);
    return sat_add(sat_mul(to_size(std::max(threads, 1)), to_size(backward_floats(plan)), sizeof(float)),
                   sat_mul(to_size(p.batch * p.heads * p.seq_q), sizeof(float)), to_size(flags),
                   sat_mul(to_size(g), sizeof(int64_t)));
  }

  void reference_forward(const Problem& p, const AttentionInputs& in, double* out) const override {
    // Exact softmax under the equivalent boolean mask: pattern ∧ (the user's mask, if any); the shared
    // reference applies causal, padding and dropout itself, and widens bf16 / fp16 Q, K, V (exactly) as the
    // kernel does; the default abs_tolerance (exact_abs_tolerance) reads them the same way.
    const MaskedProblem m(p, in);
    reference_attention(m.p, m.in, out);
  }
  void reference_backward(const Problem& p, const AttentionInputs& in, const float* d_out, double* dq,
                          double* dk, double* dv) const override {
    // The gradient of reference_forward: exact softmax attention's under the same mask.
    const MaskedProblem m(p, in);
    reference_attention_backward(m.p, m.in, d_out, dq, dk, dv);
  }
  void reference_gradients(const Problem& p, const AttentionInputs& in, const float* d_out,
                           const Fp64Gradients& g) const override {
    // dQ, dK, dV and the sink logits' gradient of exact softmax attention under the same mask (the default
    // would give the sinks' gradient of full attention). One fp64 backward gives them all.
    const MaskedProblem m(p, in);
    std::vector<double> dq, dk, dv;
    double *gq = g.dq, *gk = g.dk, *gv = g.dv;
    if (!(gq && gk && gv)) {
      if (!(p.sinks && g.d_sink_logits)) return;
      dq.resize(to_size(p.q_elements())), dk.resize(to_size(p.kv_elements())), dv.resize(dk.size());
      gq = dq.data(), gk = dk.data(), gv = dv.data();
    }
    reference_attention_backward(m.p, m.in, d_out, gq, gk, gv, nullptr, p.sinks ? g.d_sink_logits : nullptr);
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
  void forward(const Problem& p, const AttentionInputs& stored) const override {
    forward_impl(p, stored, nullptr);
  }
  void forward_saving(const Problem& p, const AttentionInputs& stored, float* saved) const override {
    forward_impl(p, stored, saved);
  }
  void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const override {
    backward_phases(p, in, g);
  }

  std::vector<std::string> extra_not_supported_reasons(const Problem& p) const override {
    std::vector<std::string> reasons;
    // Positions are the key sequence's (seq_kv = seq_q except for a decode problem).
    // Resolving a list throws UsageError on duplicates: a config error, not a skip. (A count has none, and
    // is not expanded: it may be as long as the sequence.)
    if (p.param("global_tokens").is_array())
      (void)sliding_window::global_positions(p.param("global_tokens"), p.seq_kv);
    for (int64_t bad : sliding_window::out_of_range_global_indices(p.param("global_tokens"), p.seq_kv))
      reasons.push_back("sliding_window: global_tokens index " + std::to_string(bad) +
                        " is not a position of a " + std::to_string(p.seq_kv) +
                        "-long sequence (indices must be < seq)");
    if (is_decode_shape(p)) {
      if (p.mask.boolean || p.mask.key_padding)
        reasons.push_back(
            "sliding_window: a decode problem (rolling cache) takes no boolean mask or key padding");
      if (p.dropout > 0)
        reasons.push_back("sliding_window: a decode problem (rolling cache) takes no dropout");
    }
    return reasons;
  }
  std::vector<std::string> extra_backward_not_supported_reasons(const Problem& p) const override {
    if (!is_decode_shape(p)) return {};
    return {"sliding_window: no backward for a decode problem (seq_q " + std::to_string(p.seq_q) +
            " < seq_kv " + std::to_string(p.seq_kv) + ")"};
  }

 private:
  // forward() and the training forward are one computation; `lse` (the saved state) only adds its writes.
  void forward_impl(const Problem& p, const AttentionInputs& stored, float* lse) const {
    if (auto reasons = not_supported_reasons(p); !reasons.empty())
      throw NotSupported("sliding_window: " + reasons.front());
    if (is_decode_shape(p)) {  // reads the 16-bit rows it needs itself: no whole-context widening
      if (lse) throw std::logic_error("sliding_window: no training forward for a decode problem");
      decode_forward(p, stored);
      return;
    }
    const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
    const AttentionInputs& in = wide.get();
    const Plan plan(p);
    // Every position global is full attention: the band phase would be overwritten entirely.
    if (plan.globals_count() < plan.seq) forward_band(p, in, plan, lse);
    if (!plan.globals.empty()) forward_global(p, in, plan, lse);
  }
};

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::SlidingWindow)
