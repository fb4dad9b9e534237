// tiled: exact softmax attention, FlashAttention-style: query x key tiles, a running max and sum per query,
// the output rescaled when the max moves and divided once at the end. O(n) memory, no score matrix.
// Grouped-query heads share their K/V tiles inside one query tile; decode-shaped problems split the key
// range across tasks (flash-decoding, tiled.hpp). This file chooses the tiles and splits the work;
// tiled_kernels.cpp does one query tile on the SIMD target that common/kernels/simd.hpp selected (Highway
// dispatch).
#include "variants/tiled/tiled.hpp"

#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "common/interface/attention.hpp"
#include "common/kernels/alibi.hpp"
#include "common/kernels/mask.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/error.hpp"

namespace attn::tiled {
namespace {

// The L2 size in bytes (1 MiB if the system does not say): the working set of one query tile is sized to it.
int64_t l2_bytes() {
  static const int64_t bytes = [] {
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? static_cast<int64_t>(v) : int64_t{1} << 20;
  }();
  return bytes;
}

// Tile sizes: the user's, or ONNX Runtime MLAS's rule from the cache size (ANCHORS.md): key tile =
// L2 / 4 bytes / 4 / (dk + dv), query tile = min(key tile, dk + dv) capped at 128. For d = 64 and a 1 MiB L2
// that is 128 x 512: the score tile (256 KiB), the K and V tiles (128 KiB each) and Q^T, O^T (32 KiB each)
// stay in L2, and the 8 KiB Q^T panel one micro-kernel sweep reads stays in L1. Both are clipped to the
// sequence so short problems do not pad. The query tile counts rows: with grouped-query attention a tile
// holds tile_q / group positions (at least one) of each of the group's query heads.
Tiles choose_tiles(const Problem& p) {
  const int64_t dkv = p.head_dim + p.value_dim();
  int64_t kv = p.param_int("tile_kv"), q = p.param_int("tile_q");
  if (kv == 0) kv = std::clamp<int64_t>(l2_bytes() / 16 / dkv / kLanes * kLanes, 32, 2048);
  if (q == 0) q = std::clamp<int64_t>(round_up(std::min(kv, dkv), kLanes), kLanes, 128);
  return {std::clamp<int64_t>(q / p.group_size(), 1, p.seq_q), std::min(kv, p.seq_kv)};
}

Schedule make_schedule(const Problem& p) {
  Schedule s;
  s.tiles = choose_tiles(p);
  s.group = p.group_size();
  s.rows = s.tiles.q * s.group;
  s.q_tiles = (p.seq_q + s.tiles.q - 1) / s.tiles.q;
  s.units = p.batch * p.num_kv_heads() * s.q_tiles;
  if (s.units < kSplitTarget)
    s.splits =
        std::max<int64_t>(1, std::min((kSplitTarget + s.units - 1) / s.units, p.seq_kv / kMinSplitKeys));
  return s;
}

// Backward blocks: the user's tile sizes when set (the checks use tiny ones so the multi-block paths run),
// else 64 query rows x 128 keys: per thread P and dS (32 KiB each), K^T and V^T (32 KiB each at head_dim
// 64) and the dK, dV accumulators (32 KiB each) stay in L2, and each GEMM's B panel in L1. Key-block chunks:
// enough (batch, K/V head, chunk) tasks for load balance (16), at most 8 copies of dQ.
BackwardSchedule make_backward_schedule(const Problem& p) {
  BackwardSchedule s;
  const int64_t tq = p.param_int("tile_q"), tkv = p.param_int("tile_kv");
  s.tile_q = std::clamp<int64_t>(tq > 0 ? tq : 64, 1, p.seq_q);
  s.tile_kv = std::clamp<int64_t>(tkv > 0 ? tkv : 128, 1, p.seq_kv);
  s.dp = round_up(p.head_dim, kLanes);
  s.dpv = round_up(p.value_dim(), kLanes);
  s.kv_blocks = (p.seq_kv + s.tile_kv - 1) / s.tile_kv;
  constexpr int64_t kTargetTasks = 16, kMaxChunks = 8;
  const int64_t heads = p.batch * p.num_kv_heads();
  s.chunks = std::clamp<int64_t>((kTargetTasks + heads - 1) / heads, 1, std::min(kMaxChunks, s.kv_blocks));
  return s;
}

// Whether bf16_kernel=auto prefers the native kernels here: vdpbf16ps measured at least kBf16DotMinRatio
// times the fp32 FMA's multiply-add rate (on an Intel Xeon it ran at 0.48x, and prefill at bf16 took 1.6x
// the widening kernels' time: 130 against 79 ms, 8 heads of 128, 2048 x 2048, 2 threads).
bool native_bf16_faster() {
  return bf16_dot_rate_ratio() >= kBf16DotMinRatio;
}

// Whether `p` runs the native bf16 kernels (vdpbf16ps for Q K^T and P V): bf16 storage, an even head_dim,
// the CPU and selected SIMD target able to, and bf16_kernel native, or auto where they are the faster here.
bool native_bf16(const Problem& p) {
  const std::string kernel = p.param_string("bf16_kernel");
  return p.dtype == DType::bf16 && p.head_dim % 2 == 0 && kernel != "widen" &&
         native_bf16_unavailable().empty() && (kernel == "native" || native_bf16_faster());
}

// Whether `p`'s query tiles of amx_tile_rows run on AMX: bf16 storage, head_dim and d_v multiples of 32
// (whole 32-value tile rows), bf16_kernel auto or amx, and the CPU, kernel and SIMD target able to.
bool amx_bf16(const Problem& p) {
  const std::string kernel = p.param_string("bf16_kernel");
  return p.dtype == DType::bf16 && p.head_dim % 32 == 0 && p.value_dim() % 32 == 0 &&
         (kernel == "auto" || kernel == "amx") && amx_unavailable().empty();
}

// Whether a query tile of `rows` rows rounds its weights to bf16 (run_query_tile's choice): on AMX, or on the
// native vdpbf16ps kernels (GEMM-path tiles, and dot-path tiles of widths multiple of 32).
bool tile_rounds_weights(const Problem& p, int64_t rows) {
  if (amx_bf16(p) && amx_tile_rows(rows)) return true;
  const bool dot_pairs = p.head_dim % 32 == 0 && p.value_dim() % 32 == 0;
  return native_bf16(p) && (rows > kDotRows || dot_pairs);
}

// What bf16_kernel=auto runs on this CPU and SIMD target (attnbench info, meta.json): the choice, not the
// probe's ratio, which moves from run to run (the rows and info must be the same between runs).
std::string bf16_kernel_text() {
  const std::string amx =
      amx_unavailable().empty() ? "query tiles of 5-16 rows (decode) on AMX-BF16 (TDPBF16PS), others " : "";
  if (const std::string why = native_bf16_unavailable(); !why.empty())
    return amx + "widen to fp32 (" + why + ")";
  return amx + (native_bf16_faster()
                    ? "vdpbf16ps (AVX512_BF16; measured faster than the fp32 FMA here)"
                    : "widen to fp32 (vdpbf16ps measured slower than the fp32 FMA on this CPU; "
                      "bf16_kernel=native forces it)");
}

class Tiled final : public Attention {
 public:
  std::string name() const override { return "tiled"; }
  std::string description() const override {
    return "exact softmax attention, FlashAttention-style query x key tiles with online softmax, O(n) memory";
  }
  Capabilities capabilities() const override {
    return {.exact = true,
            .causal = true,
            .causal_lower_right = true,
            .gqa = true,
            .boolean_mask = true,
            .key_padding = true,
            .cross = true,
            .dropout = true,
            .bf16 = true,
            .fp16 = true,
            .alibi = true,
            .permutation_equivariant = true,
            .backward = true,
            .sinks = true,
            .softcap = true,
            .value_dim = true,
            .block_partials = true,
            .strided_kv = true};
  }

  // ---- Block partials (tiled.hpp): forward()'s split-KV path merged into a running state ----
  std::vector<std::string> block_not_supported_reasons(const Problem& p) const override {
    return block_reasons(p);
  }
  void init_block_state(const Problem& p, const BlockState& st) const override { init_partial_state(p, st); }
  void accumulate_block(const Problem& p, const AttentionInputs& in, const BlockState& st) const override {
    tiled::accumulate_block(p, in, st);
  }
  void finish_block_state(const Problem& p, const BlockState& st, float* out) const override {
    finish_partial_state(p, st, out);
  }
  std::size_t block_workspace_bytes(const Problem& p, int threads) const override {
    return tiled::block_workspace_bytes(p, threads);
  }
  std::vector<ParamSpec> param_specs() const override {
    return {
        {.name = "tile_q",
         .type = ParamType::integer,
         .default_value = 0,
         .help = "query rows per tile (0: from the L2 size, 128 for head_dim 64); grouped-query tiles "
                 "hold tile_q / group positions of each query head of a K/V head",
         .min = 0,
         .max = 1 << 16,
         .choices = {}},
        {.name = "tile_kv",
         .type = ParamType::integer,
         .default_value = 0,
         .help = "keys per tile (0: from the L2 size, 512 for head_dim 64)",
         .min = 0,
         .max = 1 << 16,
         .choices = {}},
        {.name = "bf16_kernel",
         .type = ParamType::string,
         .default_value = "auto",
         .help = "bf16 storage: native (Q K^T and P V with vdpbf16ps, P rounded to bf16; needs the CPU "
                 "flag avx512_bf16, the avx3 target and an even head_dim; decode tiles of at most 8 rows "
                 "also head_dim and d_v multiples of 32, else they widen), widen (K, V to fp32, fp32 FMAs), "
                 "amx (query tiles of 5 to 16 rows, decode of grouped heads, on AMX-BF16, P rounded to "
                 "bf16; needs the CPU flags amx_tile and amx_bf16 and head_dim and d_v multiples of 32; "
                 "other tiles as auto), auto "
                 "(amx where it can run, else native where it can and vdpbf16ps measured faster than the "
                 "fp32 FMA on this CPU; attnbench info says which)",
         .min = {},
         .max = {},
         .choices = {"auto", "native", "widen", "amx"}}};
  }
  std::vector<Json> test_param_sets() const override {
    // Tiny tiles (and tile_q != tile_kv) so the multi-tile, tail and diagonal paths run on small inputs;
    // tile_q 1..8 puts every shape on the dot-product (decode) kernels, tile_q 33 on the GEMM kernels.
    std::vector<Json> sets = {Json::object(),
                              {{"tile_q", 4}, {"tile_kv", 8}},
                              {{"tile_q", 3}, {"tile_kv", 5}},
                              {{"tile_q", 33}, {"tile_kv", 16}},
                              {{"tile_q", 1}, {"tile_kv", 7}}};
    // Where the native bf16 kernels can run but auto does not pick them (vdpbf16ps measured slower than
    // the FMA, or AMX takes the decode tiles), they are checked by name.
    if (native_bf16_unavailable().empty() && !native_bf16_faster())
      sets.push_back({{"tile_q", 33}, {"tile_kv", 16}, {"bf16_kernel", "native"}});
    if (native_bf16_unavailable().empty() && (!native_bf16_faster() || amx_unavailable().empty()))
      sets.push_back({{"tile_q", 1}, {"tile_kv", 7}, {"bf16_kernel", "native"}});
    return sets;
  }
  Json kernels() const override { return {{"bf16", bf16_kernel_text()}}; }
  // The native bf16 and the AMX P V round the weights to bf16 (tiled_kernels.cpp SoftmaxUpdatePairs and
  // ExpRowBf16) on the tiles tile_rounds_weights names: bf16 when the full query tiles or the last one do.
  DType weight_dtype(const Problem& p) const override {
    const Schedule s = make_schedule(p);  // the full query tiles' rows and the last tile's
    const int64_t tail = p.seq_q % s.tiles.q * s.group;
    return tile_rounds_weights(p, s.rows) || (tail > 0 && tile_rounds_weights(p, tail)) ? DType::bf16
                                                                                        : DType::fp32;
  }
  double flops(const Problem& p) const override {
    // The shared exact-attention count (common/kernels/mask.hpp): causal counts the pairs below the diagonal
    // only. The diagonal tiles compute some masked pairs too; those, and the exponentials, are not counted.
    return exact_attention_flops(p);
  }
  std::size_t workspace_bytes(const Problem& p, int threads) const override {
    const Schedule s = make_schedule(p);
    const bool wide = p.dtype != DType::fp32, pairs = native_bf16(p) || amx_bf16(p);
    return sat_add(sat_mul(to_size(std::max(threads, 1)),
                           Scratch::bytes(round_up(s.rows, kLanes), s.tiles.kv, p.head_dim, p.value_dim(),
                                          p.dropout > 0, wide, pairs)),
                   sat_mul(s.partial_floats(p), sizeof(float)));
  }

  void forward(const Problem& p, const AttentionInputs& in) const override { forward_impl(p, in, nullptr); }

 protected:
  std::vector<std::string> extra_not_supported_reasons(const Problem& p) const override {
    if (p.dtype == DType::bf16 && p.param_string("bf16_kernel") == "amx") {
      std::vector<std::string> why;
      if (const std::string r = amx_unavailable(); !r.empty()) why.push_back("bf16_kernel=amx: " + r);
      if (p.head_dim % 32 || p.value_dim() % 32)
        why.push_back("bf16_kernel=amx needs head_dim and d_v multiples of 32 (whole tile rows), got " +
                      std::to_string(p.head_dim) + " and " + std::to_string(p.value_dim()));
      return why;
    }
    if (p.dtype != DType::bf16 || p.param_string("bf16_kernel") != "native") return {};
    std::vector<std::string> why;
    if (const std::string r = native_bf16_unavailable(); !r.empty())
      why.push_back("bf16_kernel=native: " + r);
    if (p.head_dim % 2)
      why.push_back("bf16_kernel=native needs an even head_dim (vdpbf16ps multiplies pairs), got " +
                    std::to_string(p.head_dim));
    return why;
  }

 public:
  // ---- Training ----
  std::size_t saved_floats(const Problem& p) const override {
    return 2 * to_size(p.batch * p.heads * p.seq_q);
  }
  std::string saved_description() const override {
    return "each query row's log-sum-exp of its scale * log2(e) logits in two parts, [2, batch, heads, "
           "seq_q]: "
           "the row max (+inf for a row with no allowed key), then log2 of the row's sum of 2^(s - max)";
  }
  void forward_saving(const Problem& p, const AttentionInputs& in, float* saved) const override {
    forward_impl(p, in, saved);
  }
  double backward_flops(const Problem& p) const override {
    // The FlashAttention-2 convention: 2.5x the forward's count (five matmuls per block pair against two).
    // The recomputed QK^T is one of the five; the exponentials are not counted.
    return 2.5 * exact_attention_flops(p);
  }
  std::size_t backward_workspace_bytes(const Problem& p, int threads) const override {
    const BackwardSchedule s = make_backward_schedule(p);
    const std::size_t rows = to_size(p.batch * p.heads * p.seq_q);
    return sat_add(
        sat_mul(to_size(std::max(threads, 1)), BackwardScratch::bytes(s, p.head_dim, p.value_dim())),
        sat_mul(rows, sizeof(float)),                                     // delta
        sat_mul(to_size(s.chunks), rows, to_size(s.dp), sizeof(float)));  // dQ copies
  }
  // dL/d sink_h = -sum over batch entries and rows of p_sink * delta, p_sink = 2^(sink log2(e) - m - log2 l)
  // from the saved row state; per row in parallel, then summed per head in order.
  static void sink_gradients(const Problem& p, const AttentionInputs& in, const GradientArgs& g,
                             const float* delta) {
    const int64_t rows = p.batch * p.heads * p.seq_q;
    std::vector<float> per_row(to_size(rows));
    tbb::parallel_for(int64_t{0}, rows, [&](int64_t r) {
      const int64_t h = r / p.seq_q % p.heads;
      const float sink2 = static_cast<float>(in.sink_logits[h] * std::numbers::log2e);
      per_row[to_size(r)] = -std::exp2(sink2 - g.saved[r] - g.saved[rows + r]) * delta[r];
    });
    std::fill(g.d_sink_logits, g.d_sink_logits + p.heads, 0.0f);
    for (int64_t r = 0; r < rows; ++r) g.d_sink_logits[r / p.seq_q % p.heads] += per_row[to_size(r)];
  }

  void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const override {
    const BackwardSchedule sched = make_backward_schedule(p);
    const int64_t rows = p.batch * p.heads * p.seq_q, D = p.head_dim, V = p.value_dim(), dp = sched.dp;
    AlignedVector<float> delta(to_size(rows));
    AlignedVector<float> dq_part(sat_mul(to_size(sched.chunks), to_size(rows), to_size(dp)));
    // delta_i = rowsum(dO_i * O_i), and the dQ copies zeroed, in parallel over rows.
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, 256), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t i = r.begin(); i < r.end(); ++i) {
        float acc = 0;
        for (int64_t e = 0; e < V; ++e) acc += g.d_out[i * V + e] * g.out[i * V + e];
        delta[to_size(i)] = acc;
        for (int64_t c = 0; c < sched.chunks; ++c)
          std::fill_n(dq_part.data() + (c * rows + i) * dp, dp, 0.0f);
      }
    });
    BackwardContext c{p,
                      in,
                      g,
                      sched,
                      static_cast<float>(p.effective_scale()),
                      static_cast<float>(p.effective_scale() * std::numbers::log2e),
                      delta.data(),
                      dq_part.data(),
                      {},
                      0,
                      0,
                      make_schedule(p).tiles.q};
    if (p.bias == Bias::alibi) {
      for (double sl : alibi_slopes(p, in))
        c.alibi_l2e.push_back(static_cast<float>(-sl * std::numbers::log2e));
      c.bias_kind = p.mask.any_causal() ? 1 : 2;
      c.alibi_shift = alibi_query_offset(p);
    }
    if (p.softcap) c.cap2 = static_cast<float>(*p.softcap * std::numbers::log2e);
    tbb::enumerable_thread_specific<BackwardScratch> scratch;
    // Tasks are fixed by the problem and each writes only its own key blocks' dK, dV and its chunk's dQ copy.
    tbb::parallel_for(int64_t{0}, sched.tasks(p), [&](int64_t task) {
      const simd::ScopedFlushDenormals ftz;
      run_backward_task(c, task, scratch.local());
    });
    if (p.sinks && g.d_sink_logits) sink_gradients(p, in, g, delta.data());
    // dQ = scale * (sum of the chunks' copies, in chunk order): bitwise the same at any thread count.
    const float scale = c.scale;
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, 256), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t i = r.begin(); i < r.end(); ++i) {
        float* dq = g.dq + i * D;
        const float* part = dq_part.data() + i * dp;
        for (int64_t e = 0; e < D; ++e) dq[e] = part[e];
        for (int64_t ch = 1; ch < sched.chunks; ++ch) {
          const float* more = part + ch * rows * dp;
          for (int64_t e = 0; e < D; ++e) dq[e] += more[e];
        }
        for (int64_t e = 0; e < D; ++e) dq[e] *= scale;
      }
    });
  }

 private:
  void forward_impl(const Problem& p, const AttentionInputs& in, float* lse) const {
    const Schedule sched = make_schedule(p);
    AlignedVector<float> partials(sched.partial_floats(p));
    Context c{.p = p,
              .in = in,
              .sched = sched,
              .q_scale = static_cast<float>(p.effective_scale() * std::numbers::log2e),
              .partials = partials.empty() ? nullptr : partials.data()};
    if (p.bias == Bias::alibi) {
      for (double sl : alibi_slopes(p, in))
        c.alibi_l2e.push_back(static_cast<float>(-sl * std::numbers::log2e));
      c.bias_kind = p.mask.any_causal() ? 1 : 2;
    }
    c.bf16_dot = native_bf16(p);
    c.amx = amx_bf16(p);
    c.lse = lse;
    if (p.softcap) c.cap2 = static_cast<float>(*p.softcap * std::numbers::log2e);
    if (p.sinks)
      for (int64_t h = 0; h < p.heads; ++h)
        c.sink_l2e.push_back(static_cast<float>(in.sink_logits[h] * std::numbers::log2e));
    tbb::enumerable_thread_specific<Scratch> scratch;
    // Tasks (unit, split) are fixed by the problem; each writes only its own output (or partial) rows, by
    // the same sequence of operations on any thread, and the merge visits splits in order, so results are
    // bitwise independent of the thread count.
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, sched.units * sched.splits),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        const simd::ScopedFlushDenormals ftz;  // on whichever thread runs the task
                        Scratch& w = scratch.local();
                        for (int64_t t = r.begin(); t < r.end(); ++t)
                          run_query_tile(c, t / sched.splits, t % sched.splits, w);
                      });
    if (sched.splits > 1)
      tbb::parallel_for(int64_t{0}, sched.units, [&](int64_t unit) {
        const simd::ScopedFlushDenormals ftz;
        merge_splits(c, unit);
      });
  }
};

}  // namespace

// ---- Block partials (tiled.hpp) ----

namespace {
void check_block_problem(const Problem& p) {
  const std::vector<std::string> why = block_reasons(p);
  if (!why.empty()) throw NotSupported("tiled block partials: " + join(why, "; "));
}
}  // namespace

std::vector<std::string> block_reasons(const Problem& p) {
  std::vector<std::string> why;
  if (p.dtype != DType::fp32) why.push_back("storage " + std::string(dtype_name(p.dtype)) + " (fp32 only)");
  if (p.bias != Bias::none) why.push_back("a logit bias (none only)");
  if (p.dropout > 0) why.push_back("dropout (none only)");
  if (p.mask.boolean || p.mask.key_padding) why.push_back("a boolean or key-padding mask (causal only)");
  if (p.softcap) why.push_back("logit soft-capping");
  if (p.sinks) why.push_back("sink logits");
  return why;
}

void init_partial_state(const Problem& p, const PartialState& st) {
  const int64_t rows = p.batch * p.heads * p.seq_q;
  std::fill(st.m, st.m + rows, -std::numeric_limits<float>::infinity());
  std::fill(st.l, st.l + rows, 0.0f);
  std::fill(st.o, st.o + rows * p.value_dim(), 0.0f);
}

std::size_t block_workspace_bytes(const Problem& p, int threads) {
  const Schedule s = make_schedule(p);
  const std::size_t partial = sat_mul(to_size(s.units), to_size(s.splits), to_size(s.rows),
                                      to_size(s.partial_stride(p)), sizeof(float));
  return sat_add(
      sat_mul(to_size(std::max(threads, 1)), Scratch::bytes(round_up(s.rows, kLanes), s.tiles.kv, p.head_dim,
                                                            p.value_dim(), false, false, false)),
      partial);
}

void accumulate_block(const Problem& p, const AttentionInputs& in, const PartialState& st) {
  check_block_problem(p);
  const Schedule sched = make_schedule(p);
  // forward()'s split-KV path with every task writing partial rows (splits == 1 included).
  AlignedVector<float> partials(sat_mul(to_size(sched.units), to_size(sched.splits), to_size(sched.rows),
                                        to_size(sched.partial_stride(p))));
  Context c{.p = p,
            .in = in,
            .sched = sched,
            .q_scale = static_cast<float>(p.effective_scale() * std::numbers::log2e),
            .partials = partials.data(),
            .partial_out = true};
  tbb::enumerable_thread_specific<Scratch> scratch;
  // As in forward(): tasks fixed by the problem, the merge visits a unit's splits in order, so the state is
  // bitwise independent of the thread count.
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, sched.units * sched.splits),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      const simd::ScopedFlushDenormals ftz;
                      Scratch& w = scratch.local();
                      for (int64_t t = r.begin(); t < r.end(); ++t)
                        run_query_tile(c, t / sched.splits, t % sched.splits, w);
                    });
  tbb::parallel_for(int64_t{0}, sched.units, [&](int64_t unit) {
    const simd::ScopedFlushDenormals ftz;
    merge_into_state(c, unit, st);
  });
}

void finish_partial_state(const Problem& p, const PartialState& st, float* out) {
  const int64_t rows = p.batch * p.heads * p.seq_q, D = p.value_dim();  // o rows hold d_v floats
  tbb::parallel_for(int64_t{0}, rows, [&](int64_t r) {
    const float l = st.l[r];
    const float* o = st.o + r * D;
    float* y = out + r * D;
    if (std::isnan(l) || std::isnan(st.m[r])) {
      std::fill(y, y + D, std::numeric_limits<float>::quiet_NaN());
    } else if (l == 0.0f) {  // no allowed key
      std::fill(y, y + D, 0.0f);
    } else {
      const float inv = 1.0f / l;  // the one division, as forward()
      for (int64_t e = 0; e < D; ++e) y[e] = o[e] * inv;
    }
  });
}

}  // namespace attn::tiled

ATTN_REGISTER_VARIANT(attn::tiled::Tiled)
