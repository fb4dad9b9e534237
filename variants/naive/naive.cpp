// naive: exact softmax attention, the baseline. Materialises the [seq_q, seq_kv] score matrix of each head
// (quadratic memory), with BLAS GEMMs for Q K^T and P V and a max-subtracted softmax in between. The softmax
// exponential is the exp2 polynomial tiled uses (common/vmath.hpp exp_sub_sum, <= 1.5 ulp), so a tiled-vs-
// naive speed-up measures the tiling, not a faster exp. Causal runs a lower-trapezoid schedule: each block of
// query rows multiplies only the key columns up to its last row, so no GEMM work is spent on the masked
// upper triangle beyond the diagonal blocks.
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

#include "common/alibi.hpp"
#include "common/aligned.hpp"
#include "common/attention.hpp"
#include "common/dropout.hpp"
#include "common/half.hpp"
#include "common/mask.hpp"
#include "common/runtime.hpp"
#include "common/vmath.hpp"

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
            .baseline = true};
  }
  double flops(const Problem& p) const override {
    // The shared exact-attention count (common/mask.hpp). Causal GEMMs stop at each row block's last row
    // (the lower trapezoid); the masked pairs inside the diagonal blocks are computed but not counted.
    return exact_attention_flops(p);
  }
  double bytes_moved(const Problem& p) const override {
    // Q, K, V, O and the masks once (compulsory_bytes), plus what this schedule streams beyond them: each
    // query head reads its group's K/V again (one GEMM pair per query head, as a user writing the baseline
    // loops over heads), and the score matrix is materialised: written by the first GEMM and read by the
    // second (the softmax pass in between is counted as cached). Only the pairs the causal trapezoid
    // computes are counted.
    const double kv_head = 2.0 * static_cast<double>(p.seq_kv * p.head_dim) * sizeof(float);
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
    const std::size_t widened =
        p.dtype == DType::fp32
            ? 0
            : static_cast<std::size_t>(p.q_elements() + 2 * p.kv_elements()) * sizeof(float);
    return ScoreBuffer::allocated_bytes(static_cast<std::size_t>(floats)) + widened;
  }

  void forward(const Problem& p, const AttentionInputs& stored) const override {
    const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
    const AttentionInputs& in = wide.get();
    const std::vector<float> slopes = alibi_slopes_f32(p, in);
    const int64_t Lq = p.seq_q, Lkv = p.seq_kv, D = p.head_dim, BH = p.batch * p.heads;
    const int64_t group = heads_per_group(p), rows = rows_per_block(p);
    const int64_t blocks_per_head = (Lq + rows - 1) / rows;
    const float scale = static_cast<float>(p.effective_scale());
    ScoreBuffer scores(static_cast<std::size_t>(group) * Lq * Lkv);

    for (int64_t g0 = 0; g0 < BH; g0 += group) {
      const int64_t heads_here = std::min(group, BH - g0);
      tbb::parallel_for(int64_t{0}, heads_here * blocks_per_head, [&](int64_t task) {
        const int64_t bh = g0 + task / blocks_per_head, r0 = (task % blocks_per_head) * rows;
        const int64_t r1 = std::min(Lq, r0 + rows), nr = r1 - r0;
        const int64_t b = bh / p.heads, h = bh % p.heads;
        float* s = scores.data() + ((bh - g0) * Lq + r0) * Lkv;
        const float* q = in.q + (bh * Lq + r0) * D;
        const float* k = in.k + p.kv_block(b, h) * Lkv * D;  // grouped-query: the group's K/V, not a copy
        const float* v = in.v + p.kv_block(b, h) * Lkv * D;
        float* o = in.out + (bh * Lq + r0) * D;
        // Causal (query i attends keys j <= i + c, mask.hpp): keys past the block's last row's limit are
        // hidden from every row of the block, so both GEMMs stop there.
        const int64_t keys = causal_key_end(p, r1 - 1);
        if (keys == 0) {  // lower-right with seq_q > seq_kv: no row of this block sees a key
          std::fill(o, o + nr * D, 0.0f);
          return;
        }
        sgemm(false, true, nr, keys, D, scale, q, D, k, D, 0.0f, s, Lkv);
        for (int64_t r = 0; r < nr; ++r)
          softmax_row(p, in, b, h, r0 + r, s + r * Lkv, keys, slopes.empty() ? 0.0f : slopes[h]);
        sgemm(false, false, nr, D, keys, 1.0f, s, Lkv, v, D, 0.0f, o, D);
      });
    }
  }

 private:
  // Masks, then normalises the first `Lkv` scores of one row in place (the keys its block computed). A row
  // with no allowed key becomes all zeros, so the following GEMM writes a zero output row.
  // ALiBi (slope != 0 only with Bias::alibi): the bias is added first, in fp32, as a user's baseline would.
  static void softmax_row(const Problem& p, const AttentionInputs& in, int64_t b, int64_t h, int64_t i,
                          float* s, int64_t Lkv, float slope) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
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
    const float mx = row_max(s, Lkv);
    if (mx == kNegInf) {
      std::fill(s, s + Lkv, 0.0f);
      return;
    }
    const float sum = exp_sub_sum(s, Lkv, mx);
    if (p.dropout > 0) {
      const DropoutRow drop(p.dropout, p.seed, b, h, i);
      const float keep_scale = drop.scale() / sum;
      for (int64_t j = 0; j < Lkv; ++j) s[j] = drop.keep(j) ? s[j] * keep_scale : 0.0f;
    } else {
      scale_row(s, Lkv, 1.0f / sum);
    }
  }
};

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::Naive)
