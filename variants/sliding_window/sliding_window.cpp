// sliding_window: softmax attention restricted to a band of 2w+1 keys around each query (optionally dilated),
// plus Longformer-style global tokens. Time O(n·(w+g)·d); memory per thread O(tile·(w+g)), plus a 16 × seq
// strip when there are global rows: never a seq × seq matrix.
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/aligned.hpp"
#include "common/attention.hpp"
#include "common/dropout.hpp"
#include "common/half.hpp"
#include "common/reference.hpp"
#include "common/runtime.hpp"
#include "common/util.hpp"
#include "common/vmath.hpp"
#include "variants/sliding_window/pattern.hpp"

namespace attn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
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

// Softmax over one score row split in two parts (band entries [lo, hi] of `band`, then `glob`), written back
// as normalised weights (dropout applied) with band entries outside [lo, hi] zeroed. Masked entries must
// already be -inf. A row with no allowed key becomes all zeros, so the GEMM that follows writes zeros.
void softmax_two_part(float* band, int64_t span, int64_t lo, int64_t hi, float* glob, int64_t n_glob,
                      const DropoutRow* drop, int64_t band_j0, int64_t band_step, const int64_t* glob_j) {
  std::fill(band, band + lo, 0.0f);
  std::fill(band + hi + 1, band + span, 0.0f);
  const int64_t width = hi - lo + 1;
  const float mx = std::max(row_max(band + lo, width), row_max(glob, n_glob));
  if (mx == kNegInf) {
    std::fill(band + lo, band + hi + 1, 0.0f);
    std::fill(glob, glob + n_glob, 0.0f);
    return;
  }
  const float sum = exp_sub_sum(band + lo, width, mx) + exp_sub_sum(glob, n_glob, mx);
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
    // bf16 / fp16: widened to fp32 up front (WideInputs, counted in workspace_bytes).
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
            .permutation_equivariant = false};
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
    const Plan plan(p, /*with_positions=*/false);
    const int64_t g = plan.globals_count();
    const int64_t per_thread = plan.band_floats() + (g == 0 ? 0 : plan.global_floats());
    // Excluded-key flags (band_excluded_keys): one row per batch entry with padding, one shared row for
    // globals.
    const int64_t flags = p.mask.key_padding ? p.batch * p.seq_q : g == 0 ? 0 : p.seq_q;
    // bf16 / fp16 add fp32 copies of Q, K and V.
    // Saturating (common/util.hpp): threads × per-thread floats exceeds 64 bits for the largest valid sizes.
    const std::size_t widened =
        p.dtype == DType::fp32
            ? 0
            : sat_mul(sat_add(to_size(p.q_elements()), sat_mul(2, to_size(p.kv_elements()))), sizeof(float));
    return sat_add(sat_mul(to_size(std::max(threads, 1)), to_size(per_thread), sizeof(float)), to_size(flags),
                   sat_mul(to_size(g), sizeof(int64_t)), widened);
  }

  void forward(const Problem& p, const AttentionInputs& stored) const override {
    if (auto reasons = not_supported_reasons(p); !reasons.empty())
      throw NotSupported("sliding_window: " + reasons.front());
    const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
    const AttentionInputs& in = wide.get();
    const Plan plan(p);
    // Every position global is full attention: the band phase would be overwritten entirely.
    if (plan.globals_count() < plan.seq) band_phase(p, in, plan);
    if (!plan.globals.empty()) global_phase(p, in, plan);
  }

  void reference_forward(const Problem& p, const AttentionInputs& in, double* out) const override {
    // Exact softmax under the equivalent boolean mask: pattern ∧ (the user's mask, if any); the shared
    // reference applies causal, padding and dropout itself, and widens bf16 / fp16 Q, K, V (exactly) as the
    // kernel does; the default abs_tolerance (exact_abs_tolerance) reads them the same way. Quadratic memory,
    // like the reference's time.
    const auto globals = sliding_window::global_positions(p.param("global_tokens"), p.seq_q);
    const sliding_window::Pattern pattern(p.param_int("window"), p.param_int("dilation"), p.mask.any_causal(),
                                          globals, p.seq_q);
    std::vector<uint8_t> mask = pattern.dense_mask();
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
    std::vector<std::string> reasons;
    // Resolving a list throws UsageError on duplicates: a config error, not a skip. (A count has none, and
    // is not expanded: it may be as long as the sequence.)
    if (p.param("global_tokens").is_array())
      (void)sliding_window::global_positions(p.param("global_tokens"), p.seq_q);
    for (int64_t bad : sliding_window::out_of_range_global_indices(p.param("global_tokens"), p.seq_q))
      reasons.push_back("sliding_window: global_tokens index " + std::to_string(bad) +
                        " is not a position of a " + std::to_string(p.seq_q) +
                        "-long sequence (indices must be < seq)");
    return reasons;
  }

 private:
  // Keys the band must not count: padded keys, and global keys (the global columns count them once).
  // One row of `seq` flags per batch entry when there is padding, else one shared row; empty if none.
  static std::vector<uint8_t> band_excluded_keys(const Problem& p, const AttentionInputs& in,
                                                 const Plan& plan) {
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

  static void band_phase(const Problem& p, const AttentionInputs& in, const Plan& plan) {
    const int64_t n = plan.seq, D = plan.dim, w = plan.window, dil = plan.dilation, T = plan.tile;
    const int64_t G = plan.globals_count(), ld = dil * D;
    const float scale = static_cast<float>(p.effective_scale());
    const std::vector<uint8_t> excluded = band_excluded_keys(p, in, plan);
    tbb::enumerable_thread_specific<AlignedVector<float>> scratch;
    const int64_t tasks_per_head = plan.residues * plan.tiles_per_class;

    tbb::parallel_for(int64_t{0}, p.batch * p.heads * tasks_per_head, [&](int64_t task) {
      const int64_t bh = task / tasks_per_head, r = task % tasks_per_head / plan.tiles_per_class;
      const int64_t t0 = task % plan.tiles_per_class * T, m = plan.class_length(r);
      if (t0 >= m) return;  // this class is one tile shorter than class 0
      const int64_t t1 = std::min(m, t0 + T), nr = t1 - t0;
      const int64_t s0 = std::max<int64_t>(0, t0 - w), s1 = p.mask.any_causal() ? t1 : std::min(m, t1 + w);
      const int64_t span = s1 - s0, lds = span + G;
      const int64_t b = bh / p.heads, h = bh % p.heads;
      const int64_t kv_head = p.kv_block(b, h) * n * D;  // grouped-query: the group's K/V, not a copy

      AlignedVector<float>& buf = scratch.local();
      if (static_cast<int64_t>(buf.size()) < plan.band_floats()) buf.resize(plan.band_floats());
      float* s = buf.data();
      float* kg = s + T * (plan.max_span() + G);
      float* vg = kg + G * D;
      const int64_t head = bh * n * D;
      const float* q = in.q + head + (r + t0 * dil) * D;
      float* o = in.out + head + (r + t0 * dil) * D;

      // Scores: [band keys of this class | global keys], one row per query of the tile.
      sgemm(false, true, nr, span, D, scale, q, ld, in.k + kv_head + (r + s0 * dil) * D, ld, 0.0f, s, lds);
      if (G > 0) {
        for (int64_t c = 0; c < G; ++c) {
          std::copy_n(in.k + kv_head + plan.globals[c] * D, D, kg + c * D);
          std::copy_n(in.v + kv_head + plan.globals[c] * D, D, vg + c * D);
        }
        sgemm(false, true, nr, G, D, scale, q, ld, kg, D, 0.0f, s + span, lds);
      }

      const uint8_t* ex = excluded.empty() ? nullptr : excluded.data() + (p.mask.key_padding ? b * n : 0);
      for (int64_t row = 0; row < nr; ++row) {
        const int64_t t = t0 + row, i = r + t * dil;
        float* band = s + row * lds;
        float* glob = band + span;
        const int64_t lo = std::max(s0, t - w) - s0,
                      hi = (p.mask.any_causal() ? t : std::min(s1 - 1, t + w)) - s0;
        if (ex || p.mask.boolean) {
          const uint8_t* allowed = p.mask.boolean ? in.mask + i * n : nullptr;
          for (int64_t c = lo; c <= hi; ++c) {
            const int64_t j = r + (s0 + c) * dil;
            if ((ex && ex[j]) || (allowed && !allowed[j])) band[c] = kNegInf;
          }
        }
        for (int64_t c = 0; c < G; ++c) {
          const int64_t j = plan.globals[c];
          if ((p.mask.any_causal() && j > i) || (p.mask.key_padding && in.key_padding[b * n + j]) ||
              (p.mask.boolean && !in.mask[i * n + j]))
            glob[c] = kNegInf;
        }
        const DropoutRow drop = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, b, h, i) : DropoutRow();
        softmax_two_part(band, span, lo, hi, glob, G, p.dropout > 0 ? &drop : nullptr, r + s0 * dil, dil,
                         plan.globals.data());
      }

      sgemm(false, false, nr, D, span, 1.0f, s, lds, in.v + kv_head + (r + s0 * dil) * D, ld, 0.0f, o, ld);
      if (G > 0) sgemm(false, false, nr, D, G, 1.0f, s + span, lds, vg, D, 1.0f, o, ld);
    });
  }

  // Global query rows attend every key (subject to causal, padding and the boolean mask): a strip of full
  // attention rows, written over what the band phase left in those rows.
  static void global_phase(const Problem& p, const AttentionInputs& in, const Plan& plan) {
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
      for (int64_t row = 0; row < nr; ++row)
        std::copy_n(in.q + head + plan.globals[g0 + row] * D, D, qg + row * D);
      sgemm(false, true, nr, n, D, scale, qg, D, in.k + kv_head, D, 0.0f, s, lds);
      for (int64_t row = 0; row < nr; ++row) {
        const int64_t i = plan.globals[g0 + row];
        float* sr = s + row * lds;
        const int64_t keys = p.mask.any_causal() ? i + 1 : n;  // causal: keys after i are never attended
        if (p.mask.key_padding || p.mask.boolean)
          for (int64_t j = 0; j < keys; ++j)
            if ((p.mask.key_padding && in.key_padding[b * n + j]) || (p.mask.boolean && !in.mask[i * n + j]))
              sr[j] = kNegInf;
        const DropoutRow drop = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, b, h, i) : DropoutRow();
        softmax_two_part(sr, n, 0, keys - 1, nullptr, 0, p.dropout > 0 ? &drop : nullptr, 0, 1, nullptr);
      }
      sgemm(false, false, nr, D, n, 1.0f, s, lds, in.v + kv_head, D, 0.0f, og, D);
      for (int64_t row = 0; row < nr; ++row)
        std::copy_n(og + row * D, D, in.out + head + plan.globals[g0 + row] * D);
    });
  }
};

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::SlidingWindow)
