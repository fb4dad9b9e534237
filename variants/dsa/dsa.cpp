// dsa: DeepSeek Sparse Attention (DeepSeek-V3.2-Exp). A lightning indexer scores every (query t, key s) as
// I(t, s) = sum_h w(t, h) relu(q_I(t, h) . k_I(s)) (index_heads query vectors of index_dim per token, one
// index key per token shared by every head, a weight per token and index head); the masks remove keys; each
// query keeps its topk keys by I (ties: the lower key index); then softmax attention over those keys only,
// every query head of a token using that token's keys. Inputs and the selection proof: dsa.hpp, indexer.cpp.
// The attention reads the selected K / V rows in place for small groups (gathered dots and axpys) or gathers
// them once per (token, K/V head) for two GEMMs per block of query heads (attend_chunk); the backward (dQ,
// dK, dV through the selected keys; the indexer's inputs get no gradient: DeepSeek trains the indexer by its
// own KL loss against the main attention, with the indexer's input detached) recomputes the selection and
// reduces dK, dV per key in a fixed order.
#include "variants/dsa/dsa.hpp"

#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/interface/attention.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/mask.hpp"
#include "common/kernels/vmath.hpp"
#include "common/reference/reference.hpp"
#include "common/support/aligned.hpp"
#include "common/support/runtime.hpp"

namespace attn {
namespace {

using dsa::Selection;

// Query heads of one K/V group per attention task: the gathered K / V rows serve this many heads' GEMMs.
constexpr int64_t kHeadBlock = 32;
// Query heads per task up to which a prefill task reads its selected rows in place (gathered dot products and
// axpys, vmath.hpp) instead of copying them for two GEMMs: with one to four heads per K/V head the copy cost
// more than the products (8 heads of 64, n = 4096, topk 2048: 5.8 s per call, tiled 0.1 s).
constexpr int64_t kDotHeads = 4;
// Below this many (token, K/V head) tasks in a chunk, attend_chunk gathers each one's rows in parallel.
constexpr int64_t kSharedGatherTasks = 4;
// Keys per task of the backward's dK / dV reduction.
constexpr int64_t kGradKeys = 32;

int64_t head_blocks(const Problem& p) {
  return (p.group_size() + kHeadBlock - 1) / kHeadBlock;
}

// Σ over query rows of min(topk, keys the causal rule leaves): the attended (query, key) pairs per batch
// entry and head (boolean and padding masks are data and not subtracted, as causal_pairs does).
double selected_pairs(const Problem& p) {
  const double lq = static_cast<double>(p.seq_q);
  const double m = static_cast<double>(std::min(p.param_int("topk"), p.seq_kv));
  if (!p.mask.any_causal()) return lq * m;
  // Row t keeps clamp(t + c + 1, 0, m) keys: causal_pairs' ramp with m in place of seq_kv.
  const double c = static_cast<double>(causal_offset(p));
  const double first = std::max(0.0, -c);
  const double full = std::clamp(m - c - 1, first, lq);
  const double n = full - first;
  return n * (first + c + 1) + n * (n - 1) / 2 + (lq - full) * m;
}

// Per-thread scratch of the attention tasks: the gathered K and V rows, the weights (and dP).
struct GatherScratch {
  AlignedVector<float> k, v, s, dp;
};

// Copies the selected rows j0 <= j < j1 of K/V head g of batch entry b into sc.k ([n, head_dim]) and sc.v
// ([n, d_v]), sized for `capacity` rows beforehand.
void gather_rows(const Problem& p, const AttentionInputs& in, int64_t b, int64_t g, const int32_t* keys,
                 int64_t j0, int64_t j1, GatherScratch& sc) {
  const int64_t D = p.head_dim, Dv = p.value_dim(), blk = b * p.num_kv_heads() + g;
  const float* k = in.k + blk * p.seq_kv * D;
  const float* v = in.v + blk * p.seq_kv * Dv;
  for (int64_t j = j0; j < j1; ++j) {
    std::memcpy(sc.k.data() + j * D, k + keys[j] * D, sizeof(float) * D);
    std::memcpy(sc.v.data() + j * Dv, v + keys[j] * Dv, sizeof(float) * Dv);
  }
}
void size_gather(const Problem& p, int64_t capacity, GatherScratch& sc) {
  sc.k.resize(static_cast<std::size_t>(std::max<int64_t>(capacity, 1) * p.head_dim));
  sc.v.resize(static_cast<std::size_t>(std::max<int64_t>(capacity, 1) * p.value_dim()));
}

// Gathers the n selected rows of K/V head g of batch entry b into sc.k and sc.v.
void gather(const Problem& p, const AttentionInputs& in, int64_t b, int64_t g, const int32_t* keys, int64_t n,
            GatherScratch& sc) {
  size_gather(p, n, sc);
  gather_rows(p, in, b, g, keys, 0, n, sc);
}

// The softmax weights of `nh` query heads from h0 of token t against the gathered keys kg ([n, head_dim])
// into sc.s ([nh, n]).
void weights(const Problem& p, const AttentionInputs& in, int64_t b, int64_t h0, int64_t nh, int64_t t,
             int64_t n, const float* kg, GatherScratch& sc) {
  const int64_t D = p.head_dim;
  sc.s.resize(static_cast<std::size_t>(nh * n));
  sgemm(false, true, nh, n, D, static_cast<float>(p.effective_scale()),
        in.q + ((b * p.heads + h0) * p.seq_q + t) * D, p.seq_q * D, kg, D, 0.0f, sc.s.data(), n);
  for (int64_t i = 0; i < nh; ++i) {
    float* row = sc.s.data() + i * n;
    const float sum = exp_sub_sum(row, n, row_max(row, n));
    scale_row(row, n, 1.0f / sum);
  }
}

// One attention task: token t of batch entry b, K/V head g, query-head block hb.
struct Task {
  int64_t t, g, h0, nh;
  Task(const Problem& p, int64_t t0, int64_t index) {
    const int64_t blocks = head_blocks(p), per_row = p.num_kv_heads() * blocks;
    t = t0 + index / per_row;
    g = (index % per_row) / blocks;
    const int64_t hb = index % blocks;
    h0 = g * p.group_size() + hb * kHeadBlock;
    nh = std::min(kHeadBlock, p.group_size() - hb * kHeadBlock);
  }
};

// Tokens [t0, t1) of batch entry b when a K/V head serves several head blocks (MLA's absorbed MQA: 128
// query heads on one latent) or the chunk is a decode step: each token's selected rows are gathered once, in
// parallel over the keys, and shared by the head blocks' GEMMs (one task each). Gathering per task instead
// copied them once per block: 4 x 8.9 MB per decoded token at V3.2's shapes. The GEMMs are the same calls on
// the same values.
void attend_chunk_shared(const Problem& p, const AttentionInputs& in, int64_t b, int64_t t0, int64_t t1,
                         const int32_t* keys, const int32_t* count, int64_t capacity) {
  const int64_t Dv = p.value_dim(), blocks = head_blocks(p);
  GatherScratch shared;
  size_gather(p, capacity, shared);
  tbb::enumerable_thread_specific<GatherScratch> scratch;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t g = 0; g < p.num_kv_heads(); ++g) {
      const int64_t n = count[t - t0];
      const int32_t* sel = keys + (t - t0) * capacity;
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 64), [&](const tbb::blocked_range<int64_t>& r) {
        gather_rows(p, in, b, g, sel, r.begin(), r.end(), shared);
      });
      tbb::parallel_for(int64_t{0}, blocks, [&](int64_t hb) {
        const int64_t h0 = g * p.group_size() + hb * kHeadBlock;
        const int64_t nh = std::min(kHeadBlock, p.group_size() - hb * kHeadBlock);
        float* out = in.out + ((b * p.heads + h0) * p.seq_q + t) * Dv;
        if (n == 0) {  // no allowed key: zero rows
          for (int64_t i = 0; i < nh; ++i) std::fill_n(out + i * p.seq_q * Dv, Dv, 0.0f);
          return;
        }
        GatherScratch& sc = scratch.local();
        weights(p, in, b, h0, nh, t, n, shared.k.data(), sc);
        sgemm(false, false, nh, Dv, n, 1.0f, sc.s.data(), n, shared.v.data(), Dv, 0.0f, out, p.seq_q * Dv);
      });
    }
}

// Output rows of tokens [t0, t1) of batch entry b over their selected keys (keys / count: rows from t0).
void attend_chunk(const Problem& p, const AttentionInputs& in, int64_t b, int64_t t0, int64_t t1,
                  const int32_t* keys, const int32_t* count, int64_t capacity) {
  // The shared gather when a K/V head serves several head blocks, or when the chunk has too few tasks to
  // keep the threads busy (decode: one token per K/V head), where gathering in parallel over the keys is the
  // only parallelism left; it makes the same GEMM calls as a task's own gather. The path depends on the
  // problem's shape only, never on the thread count, so outputs are the same at any number of threads.
  if (head_blocks(p) > 1 || (t1 - t0) * p.num_kv_heads() < kSharedGatherTasks)
    return attend_chunk_shared(p, in, b, t0, t1, keys, count, capacity);
  const int64_t Dv = p.value_dim(), tasks = (t1 - t0) * p.num_kv_heads() * head_blocks(p);
  tbb::enumerable_thread_specific<GatherScratch> scratch;
  tbb::parallel_for(int64_t{0}, tasks, [&](int64_t index) {
    const Task k(p, t0, index);
    const int64_t n = count[k.t - t0];
    float* out = in.out + ((b * p.heads + k.h0) * p.seq_q + k.t) * Dv;
    if (n == 0) {  // no allowed key: zero rows
      for (int64_t i = 0; i < k.nh; ++i) std::fill_n(out + i * p.seq_q * Dv, Dv, 0.0f);
      return;
    }
    GatherScratch& sc = scratch.local();
    const int32_t* sel = keys + (k.t - t0) * capacity;
    if (k.nh <= kDotHeads) {  // read the selected rows in place: one dot / axpy pass per head
      const int64_t D = p.head_dim, blk = b * p.num_kv_heads() + k.g;
      const float* kr = in.k + blk * p.seq_kv * D;
      const float* vr = in.v + blk * p.seq_kv * Dv;
      sc.s.resize(static_cast<std::size_t>(n));
      float* s = sc.s.data();
      for (int64_t i = 0; i < k.nh; ++i) {
        gathered_dots(in.q + ((b * p.heads + k.h0 + i) * p.seq_q + k.t) * D, kr, D, D, sel, n,
                      static_cast<float>(p.effective_scale()), s);
        scale_row(s, n, 1.0f / exp_sub_sum(s, n, row_max(s, n)));
        float* o = out + i * p.seq_q * Dv;
        std::fill_n(o, Dv, 0.0f);
        gathered_axpy(s, vr, Dv, Dv, sel, n, o);
      }
      return;
    }
    gather(p, in, b, k.g, sel, n, sc);
    weights(p, in, b, k.h0, k.nh, k.t, n, sc.k.data(), sc);
    sgemm(false, false, k.nh, Dv, n, 1.0f, sc.s.data(), n, sc.v.data(), Dv, 0.0f, out, p.seq_q * Dv);
  });
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Batch entry b of the problem as exact softmax attention under a boolean mask: the selected keys. The
// definition (reference_forward), its gradient and the tolerances are the shared reference's on it.
struct SelectedProblem {
  Problem p;
  std::vector<uint8_t> mask;
  AttentionInputs in;
  SelectedProblem(const Problem& prob, const AttentionInputs& inputs, const Selection& sel, int64_t b)
      : p(prob), in(inputs) {
    p.batch = 1;
    p.mask = MaskSpec{};
    p.mask.boolean = true;
    mask.assign(static_cast<std::size_t>(prob.seq_q * prob.seq_kv), 0);
    for (int64_t t = 0; t < prob.seq_q; ++t) {
      const int64_t r = b * prob.seq_q + t;
      for (int32_t j = 0; j < sel.count[r]; ++j) mask[t * prob.seq_kv + sel.row(r)[j]] = 1;
    }
    const int64_t kvh = prob.num_kv_heads();
    in.q = inputs.q + b * prob.heads * prob.seq_q * prob.head_dim;
    in.k = inputs.k + b * kvh * prob.seq_kv * prob.head_dim;
    in.v = inputs.v + b * kvh * prob.seq_kv * prob.value_dim();
    in.out = inputs.out ? inputs.out + b * prob.heads * prob.seq_q * prob.value_dim() : nullptr;
    in.mask = mask.data();
    in.key_padding = nullptr;
  }
  SelectedProblem(const SelectedProblem&) = delete;
  SelectedProblem& operator=(const SelectedProblem&) = delete;
};

class Dsa final : public Attention {
 public:
  std::string name() const override { return "dsa"; }
  std::string description() const override {
    return "DeepSeek Sparse Attention: a lightning indexer (ReLU-weighted multi-head index scores) picks "
           "each "
           "query's top-k keys, softmax attention over them";
  }
  Capabilities capabilities() const override {
    // Not exact softmax attention (it is exact over the selected keys; with topk >= the allowed keys it is
    // full attention). Positions do not matter but the index inputs are not permuted with K and V (and the
    // tie rule names key indices): no permutation equivariance claimed. fp32 storage only.
    return {.exact = false,
            .causal = true,
            .causal_lower_right = true,
            .gqa = true,
            .boolean_mask = true,
            .key_padding = true,
            .cross = true,
            .backward = true,
            .decode = true,
            .value_dim = true,
            .indexer = true};
  }
  std::vector<ParamSpec> param_specs() const override {
    return {{.name = "topk",
             .type = ParamType::integer,
             .default_value = 2048,
             .help = "keys each query keeps (all allowed keys when fewer)",
             .min = 1,
             .max = static_cast<double>(dsa::kMaxTopk)},
            {.name = "index_heads",
             .type = ParamType::integer,
             .default_value = 64,
             .help = "index query vectors per token (index_q [batch, seq_q, index_heads, index_dim])",
             .min = 1,
             .max = static_cast<double>(dsa::kMaxIndexHeads)},
            {.name = "index_dim",
             .type = ParamType::integer,
             .default_value = 128,
             .help = "width of the index queries and of the one index key per token (index_k [batch, "
                     "seq_kv, index_dim])",
             .min = 1,
             .max = static_cast<double>(dsa::kMaxIndexDim)}};
  }
  std::vector<Json> test_param_sets() const override {
    // A small top-k (most check rows select; near-threshold rescoring and the tie rule run), one key per
    // query with one index head of width 1, and a top-k above every check shape's context (full attention).
    return {{{"topk", 5}, {"index_heads", 3}, {"index_dim", 7}},
            {{"topk", 1}, {"index_heads", 1}, {"index_dim", 1}},
            {{"topk", 4096}, {"index_heads", 2}, {"index_dim", 4}}};
  }
  std::vector<std::string> extra_not_supported_reasons(const Problem& p) const override {
    if (p.seq_kv > dsa::kMaxSeqKv) return {"dsa stores key indices in 32 bits: seq_kv must be < 2^31"};
    return {};
  }

  double flops(const Problem& p) const override {
    // The indexer: 2·index_dim per (index head, scored pair) for the dot products and 2 per (index head,
    // pair) for the ReLU-weighted sum, over the pairs the causal rule leaves; the attention: 2·(d_k + d_v)
    // per selected (query head, key) pair. The selection is not counted.
    const IndexerShape ix(p);
    const double batch = static_cast<double>(p.batch);
    return batch * causal_pairs(p) * static_cast<double>(ix.heads) * (2.0 * ix.dim + 2.0) +
           batch * static_cast<double>(p.heads) * selected_pairs(p) * 2.0 * (p.head_dim + p.value_dim());
  }
  double bytes_moved(const Problem& p) const override {
    // Q and O once, the index inputs once, and the selected K and V rows once per (token, K/V head): the
    // gather's reads (a key selected by several tokens is read again for each).
    const IndexerShape ix(p);
    const double f = sizeof(float);
    return f *
           (static_cast<double>(p.q_elements() + p.out_elements()) + static_cast<double>(ix.q_elements(p)) +
            static_cast<double>(ix.k_elements(p)) + static_cast<double>(ix.w_elements(p)) +
            static_cast<double>(p.batch * p.num_kv_heads()) * selected_pairs(p) *
                static_cast<double>(p.head_dim + p.value_dim()));
  }
  std::size_t decode_state_bytes(const Problem& p) const override {
    // The KV cache and the index keys of every cached token.
    return sat_add(kv_cache_bytes(p),
                   sat_mul(static_cast<std::size_t>(IndexerShape(p).k_elements(p)), sizeof(float)));
  }
  std::size_t workspace_bytes(const Problem& p, int threads) const override {
    const auto cap = static_cast<std::size_t>(std::min(p.param_int("topk"), p.seq_kv));
    const auto gather =
        cap * static_cast<std::size_t>(p.head_dim + p.value_dim() + kHeadBlock) * sizeof(float);
    const auto chunk_sel = static_cast<std::size_t>(dsa::chunk_rows(p)) * (cap + 1) * sizeof(int32_t);
    return dsa::select_workspace_bytes(p, threads) + chunk_sel +
           static_cast<std::size_t>(std::max(threads, 1)) * gather;
  }
  std::size_t backward_workspace_bytes(const Problem& p, int threads) const override {
    // One batch entry's selection, its weights and dS ([seq_q, heads, topk] each) and the key lists.
    const auto cap = static_cast<std::size_t>(std::min(p.param_int("topk"), p.seq_kv));
    const auto rows = static_cast<std::size_t>(p.seq_q);
    return workspace_bytes(p, threads) + rows * (cap + 1) * sizeof(int32_t) +
           2 * rows * static_cast<std::size_t>(p.heads) * cap * sizeof(float) +
           rows * cap * 2 * sizeof(int32_t) + static_cast<std::size_t>(p.seq_kv + 1) * sizeof(int64_t) +
           static_cast<std::size_t>(std::max(threads, 1)) * cap * kHeadBlock * sizeof(float);
  }
  double backward_flops(const Problem& p) const override {
    // The indexer again (the selection is recomputed), and per selected (query head, key) pair: the logits
    // and dP (2·d_k + 2·d_v), dQ (2·d_k), dK (2·d_k) and dV (2·d_v).
    const IndexerShape ix(p);
    const double batch = static_cast<double>(p.batch);
    return batch * causal_pairs(p) * static_cast<double>(ix.heads) * (2.0 * ix.dim + 2.0) +
           batch * static_cast<double>(p.heads) * selected_pairs(p) *
               (6.0 * p.head_dim + 4.0 * p.value_dim());
  }

  void reference_forward(const Problem& p, const AttentionInputs& in, double* out) const override {
    const Selection sel = dsa::reference_select(p, in);
    for (int64_t b = 0; b < p.batch; ++b) {
      const SelectedProblem m(p, in, sel, b);
      reference_attention(m.p, m.in, out + b * p.heads * p.seq_q * p.value_dim());
    }
  }
  void reference_backward(const Problem& p, const AttentionInputs& in, const float* d_out, double* dq,
                          double* dk, double* dv) const override {
    // The selection depends on the index inputs only, so the gradient is softmax attention's on the selected
    // keys (the indexer's inputs get none).
    const Selection sel = dsa::reference_select(p, in);
    const int64_t kvh = p.num_kv_heads();
    for (int64_t b = 0; b < p.batch; ++b) {
      const SelectedProblem m(p, in, sel, b);
      reference_attention_backward(
          m.p, m.in, d_out + b * p.heads * p.seq_q * p.value_dim(), dq + b * p.heads * p.seq_q * p.head_dim,
          dk + b * kvh * p.seq_kv * p.head_dim, dv + b * kvh * p.seq_kv * p.value_dim());
    }
  }
  GradientTolerance grad_tolerance(const Problem& p, const AttentionInputs& in,
                                   const float* d_out) const override {
    // Exact softmax attention's running-error bound on each batch entry's selected keys (the backward is that
    // computation over fewer terms); the largest over the batch.
    const Selection sel = dsa::reference_select(p, in);
    GradientTolerance worst;
    for (int64_t b = 0; b < p.batch; ++b) {
      const SelectedProblem m(p, in, sel, b);
      const GradientTolerance t =
          exact_grad_tolerance(m.p, m.in, d_out + b * p.heads * p.seq_q * p.value_dim());
      worst.dq = std::max(worst.dq, t.dq), worst.dk = std::max(worst.dk, t.dk),
      worst.dv = std::max(worst.dv, t.dv);
    }
    return worst;
  }

 protected:
  void forward(const Problem& p, const AttentionInputs& in) const override {
    const int64_t cap = std::min(p.param_int("topk"), p.seq_kv), rows = dsa::chunk_rows(p);
    AlignedVector<float> scores(static_cast<std::size_t>(rows * p.seq_kv));
    std::vector<int32_t> keys(static_cast<std::size_t>(rows * cap)), count(static_cast<std::size_t>(rows));
    for (int64_t b = 0; b < p.batch; ++b) {
      auto start = std::chrono::steady_clock::now();
      const double kn = dsa::key_norm_max(p, in, b);
      if (in.phase_times) in.phase_times->add("indexer", seconds_since(start));
      for (int64_t t0 = 0; t0 < p.seq_q; t0 += rows) {
        const int64_t t1 = std::min(p.seq_q, t0 + rows);
        dsa::select_chunk(p, in, b, t0, t1, kn, scores.data(), keys.data(), count.data(), in.phase_times);
        start = std::chrono::steady_clock::now();
        attend_chunk(p, in, b, t0, t1, keys.data(), count.data(), cap);
        if (in.phase_times) in.phase_times->add("attention", seconds_since(start));
      }
    }
  }
  void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const override;
};

// The backward of one batch entry: P and dS per (token, head, selected key), dQ per token, then dK and dV
// per key from the tokens that selected it, in token order (deterministic: no atomics, fixed order).
void Dsa::backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const {
  const int64_t D = p.head_dim, Dv = p.value_dim(), H = p.heads, kvh = p.num_kv_heads(), Lq = p.seq_q;
  const int64_t nkv = p.seq_kv, cap = std::min(p.param_int("topk"), nkv), rows = dsa::chunk_rows(p);
  const float scale = static_cast<float>(p.effective_scale());
  std::fill_n(g.dk, p.kv_elements(), 0.0f);
  std::fill_n(g.dv, p.v_elements(), 0.0f);
  AlignedVector<float> scores(static_cast<std::size_t>(rows * nkv));
  std::vector<int32_t> keys(static_cast<std::size_t>(Lq * cap)), count(static_cast<std::size_t>(Lq));
  AlignedVector<float> pw(static_cast<std::size_t>(Lq * H * cap)), ds(pw.size());
  std::vector<int64_t> start(static_cast<std::size_t>(nkv + 1));
  std::vector<int32_t> users(static_cast<std::size_t>(Lq * cap) * 2);  // (token, position) per selected pair
  for (int64_t b = 0; b < p.batch; ++b) {
    const double kn = dsa::key_norm_max(p, in, b);
    for (int64_t t0 = 0; t0 < Lq; t0 += rows)
      dsa::select_chunk(p, in, b, t0, std::min(Lq, t0 + rows), kn, scores.data(), keys.data() + t0 * cap,
                        count.data() + t0, nullptr);
    // P, dP, dS and dQ per task (token, K/V head, head block).
    tbb::enumerable_thread_specific<GatherScratch> scratch;
    tbb::parallel_for(int64_t{0}, Lq * kvh * head_blocks(p), [&](int64_t index) {
      const Task k(p, 0, index);
      const int64_t n = count[k.t];
      float* dq = g.dq + ((b * H + k.h0) * Lq + k.t) * D;
      if (n == 0) {
        for (int64_t i = 0; i < k.nh; ++i) std::fill_n(dq + i * Lq * D, D, 0.0f);
        return;
      }
      GatherScratch& sc = scratch.local();
      gather(p, in, b, k.g, keys.data() + k.t * cap, n, sc);
      weights(p, in, b, k.h0, k.nh, k.t, n, sc.k.data(), sc);
      sc.dp.resize(static_cast<std::size_t>(k.nh * n));
      sgemm(false, true, k.nh, n, Dv, 1.0f, g.d_out + ((b * H + k.h0) * Lq + k.t) * Dv, Lq * Dv, sc.v.data(),
            Dv, 0.0f, sc.dp.data(), n);
      for (int64_t i = 0; i < k.nh; ++i) {
        const float* pr = sc.s.data() + i * n;
        float* dpr = sc.dp.data() + i * n;
        double dot = 0;
        for (int64_t j = 0; j < n; ++j) dot += static_cast<double>(pr[j]) * dpr[j];
        float* pout = pw.data() + (k.t * H + k.h0 + i) * cap;
        float* dsout = ds.data() + (k.t * H + k.h0 + i) * cap;
        for (int64_t j = 0; j < n; ++j) {
          pout[j] = pr[j];
          dsout[j] = pr[j] * (dpr[j] - static_cast<float>(dot));
        }
      }
      sgemm(false, false, k.nh, D, n, scale, ds.data() + (k.t * H + k.h0) * cap, cap, sc.k.data(), D, 0.0f,
            dq, Lq * D);
    });
    // The tokens that selected each key, in token order (a counting sort of the selected pairs).
    std::fill(start.begin(), start.end(), 0);
    for (int64_t t = 0; t < Lq; ++t)
      for (int32_t j = 0; j < count[t]; ++j) ++start[keys[t * cap + j] + 1];
    for (int64_t s = 0; s < nkv; ++s) start[s + 1] += start[s];
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t t = 0; t < Lq; ++t)
      for (int32_t j = 0; j < count[t]; ++j) {
        const int64_t at = fill[keys[t * cap + j]]++;
        users[2 * at] = static_cast<int32_t>(t), users[2 * at + 1] = j;
      }
    const int64_t key_blocks = (nkv + kGradKeys - 1) / kGradKeys;
    tbb::parallel_for(int64_t{0}, kvh * key_blocks, [&](int64_t index) {
      const int64_t kg = index / key_blocks, s0 = (index % key_blocks) * kGradKeys;
      for (int64_t s = s0; s < std::min(nkv, s0 + kGradKeys); ++s) {
        float* dk = g.dk + ((b * kvh + kg) * nkv + s) * D;
        float* dv = g.dv + ((b * kvh + kg) * nkv + s) * Dv;
        for (int64_t u = start[s]; u < start[s + 1]; ++u) {
          const int64_t t = users[2 * u], j = users[2 * u + 1];
          for (int64_t h = kg * p.group_size(); h < (kg + 1) * p.group_size(); ++h) {
            const float pv = pw[(t * H + h) * cap + j], dsv = scale * ds[(t * H + h) * cap + j];
            const float* dor = g.d_out + ((b * H + h) * Lq + t) * Dv;
            const float* qr = in.q + ((b * H + h) * Lq + t) * D;
            for (int64_t d = 0; d < Dv; ++d) dv[d] += pv * dor[d];
            for (int64_t d = 0; d < D; ++d) dk[d] += dsv * qr[d];
          }
        }
      }
    });
  }
}

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::Dsa)
