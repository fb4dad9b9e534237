// naive: exact softmax attention, the baseline. Materialises the [seq_q, seq_kv] score matrix of each head
// (quadratic memory), with BLAS GEMMs for Q K^T and P V and a max-subtracted softmax in between. The softmax
// exponential is the exp2 polynomial tiled uses (common/kernels/vmath.hpp exp_sub_sum, <= 1.5 ulp), so a
// tiled-vs- naive speed-up measures the tiling, not a faster exp. Causal runs a lower-trapezoid schedule:
// each block of query rows multiplies only the key columns up to its last row, so no GEMM work is spent on
// the masked upper triangle beyond the diagonal blocks.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/alibi.hpp"
#include "common/kernels/dropout.hpp"
#include "common/kernels/mask.hpp"
#include "common/kernels/vmath.hpp"
#include "common/support/aligned.hpp"
#include "common/support/runtime.hpp"

namespace attn {
namespace {

// Heads processed together: as many score matrices as fit in this many bytes (at least one). Small problems
// then parallelise over heads, large ones over the query rows of one head, and memory stays one head's
// score matrix for long sequences.
constexpr std::size_t kHeadGroupBytes = 32u << 20;

// Query rows per task. Fixed by the problem alone (never by the thread count), so every output element is
// computed by the same sequence of operations however many threads run: results are bitwise reproducible.
// At most 128: a 128-row slab of scores (2 MiB at 4096 keys) stays closer to the cores between the two GEMMs
// than 256 rows did, while each call still amortises BLAS's packing of K over enough rows.
int64_t rows_per_block(const Problem& p) {
  return std::clamp<int64_t>(p.seq_q / 8, 16, 128);
}

// The score matrices of one head group, allocated per call (quadratic memory is what naive is). Neither
// value-initialised (the first GEMM writes every element) nor left to 4 KiB pages: at 4096 keys a head is
// 64 MiB, and zeroing it plus 16384 first-touch page faults cost about as much as both GEMMs on this VM. With
// 2 MiB-aligned storage and MADV_HUGEPAGE, Linux backs it with transparent huge pages where it can.
class ScoreBuffer {
 public:
  static constexpr std::size_t kHugePage = std::size_t{2} << 20;
  // Bytes actually allocated for `count` floats (rounded up to the alignment), as workspace_bytes reports.
  static std::size_t allocated_bytes(std::size_t count) {
    const std::size_t bytes = std::max<std::size_t>(count * sizeof(float), 1);
    const std::size_t align = bytes >= kHugePage ? kHugePage : kAlignment;
    return (bytes + align - 1) / align * align;
  }
  explicit ScoreBuffer(std::size_t count) {
    const std::size_t bytes = allocated_bytes(count);
    const std::size_t align = bytes >= kHugePage ? kHugePage : kAlignment;
    void* p = std::aligned_alloc(align, bytes);
    if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    if (align == kHugePage) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
#endif
    data_.reset(static_cast<float*>(p));
  }
  float* data() {
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
};

// The backward keeps two score-sized matrices per head (P and dS): as many heads as fit in twice the
// forward's budget.
int64_t backward_heads_per_group(const Problem& p) {
  const std::size_t per_head = 2 * static_cast<std::size_t>(p.seq_q) * p.seq_kv * sizeof(float);
  return std::clamp<int64_t>(static_cast<int64_t>(2 * kHeadGroupBytes / std::max<std::size_t>(per_head, 1)),
                             1, p.batch * p.heads);
}

int64_t heads_per_group(const Problem& p) {
  const std::size_t per_head = static_cast<std::size_t>(p.seq_q) * p.seq_kv * sizeof(float);
  return std::clamp<int64_t>(static_cast<int64_t>(kHeadGroupBytes / std::max<std::size_t>(per_head, 1)), 1,
                             p.batch * p.heads);
}

class Naive final : public Attention {
 public:
  std::string name() const override { return "naive"; }
  std::string description() const override {
    return "exact softmax attention, full score matrix per head, BLAS GEMMs (the baseline)";
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
            .baseline = true,
            .backward = true,
            .sinks = true,
            .softcap = true,
            .value_dim = true,
            .strided_kv = true};
  }
  double flops(const Problem& p) const override {
    // The shared exact-attention count (common/kernels/mask.hpp). Causal GEMMs stop at each row block's last
    // row (the lower trapezoid); the masked pairs inside the diagonal blocks are computed but not counted.
    return exact_attention_flops(p);
  }
  double bytes_moved(const Problem& p) const override {
    // Q, K, V, O and the masks once (compulsory_bytes), plus what this schedule streams beyond them: each
    // query head reads its group's K/V again (one GEMM pair per query head, as a user writing the baseline
    // loops over heads), and the score matrix is materialised: written by the first GEMM and read by the
    // second (the softmax pass in between is counted as cached). Only the pairs the causal trapezoid
    // computes are counted.
    const double kv_head = static_cast<double>(p.seq_kv * (p.head_dim + p.value_dim())) * sizeof(float);
    const double rereads = static_cast<double>(p.batch * (p.heads - p.num_kv_heads())) * kv_head;
    const double scores = 2.0 * static_cast<double>(p.batch * p.heads) * causal_pairs(p) * sizeof(float);
    return compulsory_bytes(p) + rereads + scores;
  }
  std::size_t workspace_bytes(const Problem& p, int) const override {
    // Saturates instead of wrapping: at seq 10^12 the product is ~10^24 floats, and a wrapped estimate
    // could pass a memory budget.
    const double floats = static_cast<double>(heads_per_group(p)) * static_cast<double>(p.seq_q) *
                          static_cast<double>(p.seq_kv);
    if (floats * sizeof(float) >= 0x1p63) return SIZE_MAX;
    // bf16 / fp16: fp32 copies of Q, K and V (the baseline a user writes converts, then runs fp32).
    const std::size_t widened = p.dtype == DType::fp32 ? 0 : to_size(p.qkv_elements()) * sizeof(float);
    return ScoreBuffer::allocated_bytes(static_cast<std::size_t>(floats)) + widened;
  }

  std::size_t saved_floats(const Problem& p) const override { return to_size(p.batch * p.heads * p.seq_q); }
  std::string saved_description() const override {
    return "log-sum-exp of each query row's masked logits, natural log ([batch, heads, seq_q]; +inf for a "
           "row "
           "with no allowed key)";
  }
  double backward_flops(const Problem& p) const override {
    // Five GEMMs over the pairs the forward's two cover (S = QK^T again, dP = dO V^T, dV = P^T dO, dQ = dS K,
    // dK = dS^T Q): the FlashAttention-2 convention, 2.5x the forward.
    return 2.5 * exact_attention_flops(p);
  }
  std::size_t backward_workspace_bytes(const Problem& p, int) const override {
    // P and dS of a head group, [group][seq_q][seq_kv] each, plus a delta per query row of the group.
    const double floats = 2.0 * static_cast<double>(backward_heads_per_group(p)) *
                          static_cast<double>(p.seq_q) * static_cast<double>(p.seq_kv);
    if (floats * sizeof(float) >= 0x1p62) return SIZE_MAX;
    return sat_add(2 * ScoreBuffer::allocated_bytes(static_cast<std::size_t>(floats / 2)),
                   sat_mul(to_size(backward_heads_per_group(p) * p.seq_q), sizeof(float)));
  }

  void forward(const Problem& p, const AttentionInputs& stored) const override {
    forward_impl(p, stored, nullptr);
  }
  void forward_saving(const Problem& p, const AttentionInputs& stored, float* saved) const override {
    forward_impl(p, stored, saved);
  }

  // The baseline's backward, as a user writes it with BLAS: per head group, phase 1 over blocks of query rows
  // recomputes S = scale QK^T (GEMM) and P = exp(S - lse) from the saved log-sum-exp, dP = dO V^T (GEMM) and
  // dS = P (dP' - delta) with delta_i = dO_i . O_i (dP' = dP with the dropout mask and scale), keeps P after
  // dropout and dS in two full [seq_q, seq_kv] matrices, and writes dQ = scale dS K (GEMM); phase 2 over
  // blocks of keys then forms dV += P^T dO and dK += scale dS^T Q (GEMMs). Every task writes its own rows;
  // grouped-query heads add into their K/V head's dK, dV in head order. Bitwise independent of the threads.
  void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const override {
    const std::vector<float> slopes = alibi_slopes_f32(p, in);
    const int64_t Lq = p.seq_q, Lkv = p.seq_kv, D = p.head_dim, Dv = p.value_dim(), BH = p.batch * p.heads;
    const int64_t group = backward_heads_per_group(p), rows = rows_per_block(p);
    const int64_t blocks_per_head = (Lq + rows - 1) / rows;
    const int64_t key_cols = std::clamp<int64_t>(Lkv / 8, 16, 128),
                  col_blocks = (Lkv + key_cols - 1) / key_cols;
    const float scale = static_cast<float>(p.effective_scale());
    const float keep_scale = p.dropout > 0 ? static_cast<float>(1.0 / (1.0 - p.dropout)) : 1.0f;
    ScoreBuffer probs(static_cast<std::size_t>(group) * Lq * Lkv),
        dscores(static_cast<std::size_t>(group) * Lq * Lkv);
    std::vector<float> delta(static_cast<std::size_t>(group * Lq));
    std::fill(g.dk, g.dk + p.kv_elements(), 0.0f);
    std::fill(g.dv, g.dv + p.v_elements(), 0.0f);
    std::vector<float> sink_rows(p.sinks ? static_cast<std::size_t>(BH * Lq) : 0, 0.0f);
    const int64_t Hkv = p.num_kv_heads(), G = p.group_size();
    for (int64_t g0 = 0; g0 < BH; g0 += group) {
      const int64_t heads_here = std::min(group, BH - g0);
      // Phase 1: rows of P (after dropout) and dS, and dQ.
      tbb::parallel_for(int64_t{0}, heads_here * blocks_per_head, [&](int64_t task) {
        const int64_t bh = g0 + task / blocks_per_head, r0 = (task % blocks_per_head) * rows;
        const int64_t r1 = std::min(Lq, r0 + rows), nr = r1 - r0;
        const int64_t b = bh / p.heads, h = bh % p.heads;
        float* pr = probs.data() + ((bh - g0) * Lq + r0) * Lkv;
        float* ds = dscores.data() + ((bh - g0) * Lq + r0) * Lkv;
        const float* q = in.q + (bh * Lq + r0) * D;
        const float* k = in.k + p.kv_block(b, h) * Lkv * D;
        const float* v = in.v + p.kv_block(b, h) * Lkv * Dv;
        const float* o = g.out + (bh * Lq + r0) * Dv;
        const float* dout = g.d_out + (bh * Lq + r0) * Dv;
        const float* lse = g.saved + bh * Lq + r0;
        float* dq = g.dq + (bh * Lq + r0) * D;
        const int64_t keys = causal_key_end(p, r1 - 1);
        std::vector<float> cap_factor(p.softcap ? static_cast<std::size_t>(keys) : 0);
        // Entries past the block's key range stay zero for phase 2's GEMMs over whole columns.
        for (int64_t r = 0; r < nr; ++r) {
          std::fill(pr + r * Lkv + keys, pr + (r + 1) * Lkv, 0.0f);
          std::fill(ds + r * Lkv + keys, ds + (r + 1) * Lkv, 0.0f);
        }
        if (keys == 0) {
          std::fill(dq, dq + nr * D, 0.0f);
          return;
        }
        sgemm(false, true, nr, keys, D, scale, q, D, k, D, 0.0f, pr, Lkv);
        sgemm(false, true, nr, keys, Dv, 1.0f, dout, Dv, v, Dv, 0.0f, ds, Lkv);
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t i = r0 + r;
          float* prow = pr + r * Lkv;
          float* drow = ds + r * Lkv;
          float dl = 0;
          for (int64_t e = 0; e < Dv; ++e) dl += dout[r * Dv + e] * o[r * Dv + e];
          delta[static_cast<std::size_t>((bh - g0) * Lq + i)] = dl;
          probabilities_row(p, in, b, h, i, prow, keys, slopes.empty() ? 0.0f : slopes[h], lse[r],
                            p.softcap ? cap_factor.data() : nullptr);
          // The sink's weight takes no value: dL/d sink = -p_sink * delta.
          if (p.sinks)
            sink_rows[static_cast<std::size_t>(bh * Lq + i)] = -std::exp(in.sink_logits[h] - lse[r]) * dl;
          if (p.dropout > 0) {
            const DropoutRow drop(p.dropout, p.seed, b, h, i);
            // dS = P (keep * dP / (1 - p) - delta); P keeps dropout's mask and scale for dV.
            for (int64_t j = 0; j < keys; ++j) {
              const bool kept = drop.keep(j);
              drow[j] = prow[j] * ((kept ? drow[j] * keep_scale : 0.0f) - dl);
              prow[j] = kept ? prow[j] * keep_scale : 0.0f;
            }
          } else {
            for (int64_t j = 0; j < keys; ++j) drow[j] = prow[j] * (drow[j] - dl);
          }
          if (p.softcap)  // back through s = C tanh(s_raw / C)
            for (int64_t j = 0; j < keys; ++j) drow[j] *= cap_factor[j];
        }
        sgemm(false, false, nr, D, keys, scale, ds, Lkv, k, D, 0.0f, dq, D);
      });
      // Phase 2: dV += P^T dO and dK += scale dS^T Q per block of keys, the group's query heads of one K/V
      // head in order (grouped-query heads sum into their K/V head).
      const int64_t first_kv = g0 / G, last_kv = (g0 + heads_here - 1) / G;  // (batch, K/V head) indices
      tbb::parallel_for(int64_t{0}, (last_kv - first_kv + 1) * col_blocks, [&](int64_t task) {
        const int64_t bkv = first_kv + task / col_blocks, c0 = (task % col_blocks) * key_cols;
        const int64_t nc = std::min(key_cols, Lkv - c0);
        const int64_t b = bkv / Hkv;
        float* dk = g.dk + (bkv * Lkv + c0) * D;
        float* dv = g.dv + (bkv * Lkv + c0) * Dv;
        // Rows that may see key c0 under the causal rule (c0 <= i + offset); earlier rows hold zeros there.
        const int64_t r_start = p.mask.any_causal() ? std::clamp<int64_t>(c0 - causal_offset(p), 0, Lq) : 0;
        if (r_start >= Lq) return;
        for (int64_t bh = std::max(g0, (b * p.heads) + (bkv % Hkv) * G);
             bh < std::min(g0 + heads_here, b * p.heads + (bkv % Hkv + 1) * G); ++bh) {
          const float* pr = probs.data() + ((bh - g0) * Lq + r_start) * Lkv + c0;
          const float* ds = dscores.data() + ((bh - g0) * Lq + r_start) * Lkv + c0;
          const float* q = in.q + (bh * Lq + r_start) * D;
          const float* dout = g.d_out + (bh * Lq + r_start) * Dv;
          sgemm(true, false, nc, Dv, Lq - r_start, 1.0f, pr, Lkv, dout, Dv, 1.0f, dv, Dv);
          sgemm(true, false, nc, D, Lq - r_start, scale, ds, Lkv, q, D, 1.0f, dk, D);
        }
      });
    }
    if (p.sinks && g.d_sink_logits) {  // per query head, over batch entries and rows in order
      std::fill(g.d_sink_logits, g.d_sink_logits + p.heads, 0.0f);
      for (int64_t bh = 0; bh < BH; ++bh)
        for (int64_t i = 0; i < Lq; ++i)
          g.d_sink_logits[bh % p.heads] += sink_rows[static_cast<std::size_t>(bh * Lq + i)];
    }
  }

 private:
  void forward_impl(const Problem& p, const AttentionInputs& stored, float* saved) const {
    const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
    const AttentionInputs& in = wide.get();
    const std::vector<float> slopes = alibi_slopes_f32(p, in);
    const int64_t Lq = p.seq_q, Lkv = p.seq_kv, D = p.head_dim, Dv = p.value_dim(), BH = p.batch * p.heads;
    const int64_t group = heads_per_group(p), rows = rows_per_block(p);
    const int64_t blocks_per_head = (Lq + rows - 1) / rows;
    const float scale = static_cast<float>(p.effective_scale());
    const int64_t kv_rows = kv_block_rows(p, in), ldv = v_row_stride(p, in);
    ScoreBuffer scores(static_cast<std::size_t>(group) * Lq * Lkv);

    for (int64_t g0 = 0; g0 < BH; g0 += group) {
      const int64_t heads_here = std::min(group, BH - g0);
      tbb::parallel_for(int64_t{0}, heads_here * blocks_per_head, [&](int64_t task) {
        const int64_t bh = g0 + task / blocks_per_head, r0 = (task % blocks_per_head) * rows;
        const int64_t r1 = std::min(Lq, r0 + rows), nr = r1 - r0;
        const int64_t b = bh / p.heads, h = bh % p.heads;
        float* s = scores.data() + ((bh - g0) * Lq + r0) * Lkv;
        const float* q = in.q + (bh * Lq + r0) * D;
        // Grouped-query: the group's K/V, not a copy; a reserved cache or strided V in place (strided_kv).
        const float* k = in.k + p.kv_block(b, h) * kv_rows * D;
        const float* v = in.v + p.kv_block(b, h) * kv_rows * ldv;
        float* o = in.out + (bh * Lq + r0) * Dv;
        // Causal (query i attends keys j <= i + c, mask.hpp): keys past the block's last row's limit are
        // hidden from every row of the block, so both GEMMs stop there.
        const int64_t keys = causal_key_end(p, r1 - 1);
        if (keys == 0) {  // lower-right with seq_q > seq_kv: no row of this block sees a key
          std::fill(o, o + nr * Dv, 0.0f);
          if (saved)
            std::fill(saved + bh * Lq + r0, saved + bh * Lq + r1, std::numeric_limits<float>::infinity());
          return;
        }
        sgemm(false, true, nr, keys, D, scale, q, D, k, D, 0.0f, s, Lkv);
        for (int64_t r = 0; r < nr; ++r) {
          const float lse =
              softmax_row(p, in, b, h, r0 + r, s + r * Lkv, keys, slopes.empty() ? 0.0f : slopes[h]);
          if (saved) saved[bh * Lq + r0 + r] = lse;
        }
        sgemm(false, false, nr, Dv, keys, 1.0f, s, Lkv, v, ldv, 0.0f, o, Dv);
      });
    }
  }

  // The logits of one row (scores already scale * q.k, first `Lkv` keys) turned into its softmax weights from
  // the saved log-sum-exp, with the forward's bias and masks: P_j = exp(s_j - lse), 0 where masked.
  static void probabilities_row(const Problem& p, const AttentionInputs& in, int64_t b, int64_t h, int64_t i,
                                float* s, int64_t Lkv, float slope, float lse, float* cap_factor) {
    mask_row(p, in, b, h, i, s, Lkv, slope, cap_factor);
    if (lse == std::numeric_limits<float>::infinity()) {  // no allowed key in the forward
      std::fill(s, s + Lkv, 0.0f);
      return;
    }
    exp_sub_sum(s, Lkv, lse);
  }

  // Soft-caps the logits (cap_factor, if given, receives the derivative 1 - (s/C)^2 of each), adds the ALiBi
  // bias and sets masked logits of one row to -inf.
  static void mask_row(const Problem& p, const AttentionInputs& in, int64_t b, int64_t, int64_t i, float* s,
                       int64_t Lkv, float slope, float* cap_factor = nullptr) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    if (p.softcap) {
      const float cap = static_cast<float>(*p.softcap);
      softcap(s, Lkv, cap);
      if (cap_factor)
        for (int64_t j = 0; j < Lkv; ++j) cap_factor[j] = 1.0f - (s[j] / cap) * (s[j] / cap);
    }
    if (p.bias == Bias::alibi)
      for (int64_t j = 0; j < Lkv; ++j) s[j] -= slope * static_cast<float>(alibi_distance(p, i, j));
    if (p.mask.any_causal()) std::fill(s + std::min(causal_key_end(p, i), Lkv), s + Lkv, kNegInf);
    if (p.mask.boolean) {
      const uint8_t* m = in.mask + i * p.seq_kv;
      for (int64_t j = 0; j < Lkv; ++j)
        if (!m[j]) s[j] = kNegInf;
    }
    if (p.mask.key_padding) {
      const uint8_t* pad = in.key_padding + b * p.seq_kv;
      for (int64_t j = 0; j < Lkv; ++j)
        if (pad[j]) s[j] = kNegInf;
    }
  }

  // Masks, then normalises the first `Lkv` scores of one row in place (the keys its block computed). A row
  // with no allowed key becomes all zeros, so the following GEMM writes a zero output row.
  // ALiBi (slope != 0 only with Bias::alibi): the bias is added first, in fp32, as a user's baseline would.
  // Returns the row's log-sum-exp (natural log; +inf for a row with no allowed key), what the backward
  // recomputes the weights from.
  static float softmax_row(const Problem& p, const AttentionInputs& in, int64_t b, int64_t h, int64_t i,
                           float* s, int64_t Lkv, float slope) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    mask_row(p, in, b, h, i, s, Lkv, slope);
    float mx = row_max(s, Lkv);
    if (mx == kNegInf) {
      std::fill(s, s + Lkv, 0.0f);
      return std::numeric_limits<float>::infinity();
    }
    // Sink logit: one more term of the denominator, no value.
    const float sink = p.sinks ? in.sink_logits[h] : 0.0f;
    if (p.sinks && !std::isnan(mx)) mx = std::max(mx, sink);
    const float sum = exp_sub_sum(s, Lkv, mx) + (p.sinks ? std::exp(sink - mx) : 0.0f);
    const float lse = mx + std::log(sum);
    if (p.dropout > 0) {
      const DropoutRow drop(p.dropout, p.seed, b, h, i);
      const float keep_scale = drop.scale() / sum;
      for (int64_t j = 0; j < Lkv; ++j) s[j] = drop.keep(j) ? s[j] * keep_scale : 0.0f;
    } else {
      scale_row(s, Lkv, 1.0f / sum);
    }
    return lse;
  }
};

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::Naive)
