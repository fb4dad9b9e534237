// The kernelised-attention engine shared by linear and performer (see feature_attention.hpp): the
// non-causal state per K/V head, the causal chunked prefix form, and the fp64 quadratic definition.
#include "common/kernels/feature_attention.hpp"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/interface/util.hpp"
#include "common/kernels/mask.hpp"
#include "common/support/aligned.hpp"
#include "common/support/runtime.hpp"

namespace attn {
namespace {

// The engine reads fp32 Q, K, V only; a bf16 / fp16 problem arrives with them null unless widened first.
void require_fp32_inputs(const AttentionInputs& in, const char* who) {
  if (!in.q || !in.k || !in.v)
    throw std::logic_error(std::string(who) +
                           ": Q, K and V must be fp32 (widen bf16 / fp16 inputs with WideInputs first)");
}

// Key rows j0 .. j0+rows-1 of K/V block `kv` (batch entry b), and query rows i0.. of query head bh.
FeatureRows key_rows(const Problem& p, const AttentionInputs& in, int64_t b, int64_t kv, int64_t j0,
                     int64_t rows) {
  return {.b = b,
          .head = -1,
          .kv = kv,
          .row0 = j0,
          .rows = rows,
          .src = in.k + (kv * p.seq_kv + j0) * p.head_dim};
}
FeatureRows query_rows(const Problem& p, const AttentionInputs& in, int64_t bh, int64_t i0, int64_t rows) {
  const int64_t b = bh / p.heads, h = bh % p.heads;
  return {.b = b,
          .head = h,
          .kv = p.kv_block(b, h),
          .row0 = i0,
          .rows = rows,
          .src = in.q + (bh * p.seq_q + i0) * p.head_dim};
}

// Zeroes the rows (leading dimension ld, `width` used) of padded keys among keys j0 .. j0+rows-1.
void zero_padded_rows(const Problem& p, const AttentionInputs& in, int64_t b, int64_t j0, int64_t rows,
                      float* x, int64_t ld, int64_t width) {
  if (!p.mask.key_padding) return;
  for (int64_t r = 0; r < rows; ++r)
    if (in.key_padding[b * p.seq_kv + j0 + r]) std::fill(x + r * ld, x + r * ld + width, 0.0f);
}

// φ of `rows` key rows j0.. of K/V block `kv` into `dst` (rows × m); padded keys become zero rows, so they
// add nothing to any numerator or denominator. Also adds the column sums of the result into `col_sum` (the
// normaliser's φ(K)ᵀ1) unless it is null.
void key_features(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, int64_t b, int64_t kv,
                  int64_t j0, int64_t rows, float* dst, float* col_sum) {
  const int64_t M = phi.features();
  phi.keys(key_rows(p, in, b, kv, j0, rows), dst);
  zero_padded_rows(p, in, b, j0, rows, dst, M, M);
  if (col_sum)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < M; ++e) col_sum[e] += dst[r * M + e];
}

// out row = numerator / (denominator + eps); a row with no allowed key has both 0 and gets 0 (eps > 0).
// row_eps: one eps per row, or null for `eps` everywhere. saved (optional): each row's factor 1 / (den +
// eps), the backward's saved state.
void normalise_rows(const float* num, int64_t ld_num, const float* den, int64_t ld_den, float eps,
                    const float* row_eps, int64_t rows, int64_t dim, float* out, float* saved) {
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / (den[r * ld_den] + (row_eps ? row_eps[r] : eps));
    for (int64_t d = 0; d < dim; ++d) out[r * dim + d] = num[r * ld_num + d] * inv;
    if (saved) saved[r] = inv;
  }
}

// Query features of rows i0.. of query head bh into `dst`; with a per-row eps, row_eps[0..rows) starts at
// eps and the map may rescale it.
void query_features(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, int64_t bh,
                    int64_t i0, int64_t rows, float eps, float* dst, float* row_eps) {
  if (row_eps) std::fill(row_eps, row_eps + rows, eps);
  phi.queries(query_rows(p, in, bh, i0, rows), dst, row_eps);
}

// Adds keys [j0, j1) of K/V block `kv` (batch entry b) into state = [φ(K)ᵀV | φ(K)ᵀ1] (m × (d+1)), in
// blocks of kFeatureKeyRows; `buf` holds kFeatureKeyRows × m floats, col_sum m.
void fold_keys(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, int64_t b, int64_t kv,
               int64_t j0, int64_t j1, float* state, float* col_sum, float* buf) {
  const int64_t D = p.head_dim, M = phi.features(), Lkv = p.seq_kv, ld_state = D + 1;
  for (int64_t j = j0; j < j1; j += kFeatureKeyRows) {
    const int64_t rows = std::min(kFeatureKeyRows, j1 - j);
    std::fill(col_sum, col_sum + M, 0.0f);
    key_features(p, in, phi, b, kv, j, rows, buf, col_sum);
    sgemm(true, false, M, D, rows, 1.0f, buf, M, in.v + (kv * Lkv + j) * D, D, 1.0f, state, ld_state);
    for (int64_t e = 0; e < M; ++e) state[e * ld_state + D] += col_sum[e];
  }
}

// Floats of one causal task: φ(Q) and φ(K) chunks (C × m each), the C×C scores, the C×(d+1)
// numerator|denominator, the m×(d+1) state, a column sum (m), (lower-right, seq_kv > seq_q) a block of φ for
// folding the keys every query sees, and with a per-row eps C of those. Saturating.
std::size_t causal_scratch_floats(const Problem& p, int64_t m, int64_t chunk, bool per_row_eps) {
  const std::size_t D = to_size(p.head_dim), M = to_size(m), C = to_size(std::min(chunk, p.seq_q));
  const std::size_t prefix = p.mask.any_causal() && causal_offset(p) > 0 ? sat_mul(kFeatureKeyRows, M) : 0;
  return sat_add(sat_mul(2, C, M), sat_mul(C, C), sat_mul(C, D + 1), sat_mul(M, D + 1), M, prefix,
                 per_row_eps ? C : 0);
}

// Non-causal: per K/V head, state = [φ(K)ᵀV | φ(K)ᵀ1] (m × (d+1)), shared by the query heads of its group
// (grouped-query attention builds it once per K/V head); then every query block is one GEMM with it.
void forward_full(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, float eps,
                  float* saved) {
  const int64_t D = p.head_dim, M = phi.features(), Lq = p.seq_q, Lkv = p.seq_kv, BH = p.batch * p.heads;
  const int64_t ld_state = D + 1, BKV = p.batch * p.num_kv_heads();
  const bool per_row_eps = phi.scales_eps();
  AlignedVector<float> states(static_cast<std::size_t>(BKV * M * ld_state), 0.0f);
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;

  tbb::parallel_for(int64_t{0}, BKV, [&](int64_t kv) {
    AlignedVector<float>& buf = scratch.local();
    if (static_cast<int64_t>(buf.size()) < kFeatureKeyRows * M + M) buf.resize(kFeatureKeyRows * M + M);
    fold_keys(p, in, phi, kv / p.num_kv_heads(), kv, 0, Lkv, states.data() + kv * M * ld_state,
              buf.data() + kFeatureKeyRows * M, buf.data());
  });

  const int64_t blocks = (Lq + kFeatureQueryRows - 1) / kFeatureQueryRows;
  tbb::parallel_for(int64_t{0}, BH * blocks, [&](int64_t task) {
    const int64_t bh = task / blocks, i0 = task % blocks * kFeatureQueryRows;
    const int64_t rows = std::min(kFeatureQueryRows, Lq - i0);
    AlignedVector<float>& buf = scratch.local();
    const int64_t need =
        kFeatureQueryRows * M + kFeatureQueryRows * ld_state + (per_row_eps ? kFeatureQueryRows : 0);
    if (static_cast<int64_t>(buf.size()) < need) buf.resize(need);
    float* fq = buf.data();
    float* nd = fq + kFeatureQueryRows * M;
    float* row_eps = per_row_eps ? nd + kFeatureQueryRows * ld_state : nullptr;
    query_features(p, in, phi, bh, i0, rows, eps, fq, row_eps);
    const int64_t kv = p.kv_block(bh / p.heads, bh % p.heads);
    sgemm(false, false, rows, ld_state, M, 1.0f, fq, M, states.data() + kv * M * ld_state, ld_state, 0.0f, nd,
          ld_state);
    normalise_rows(nd, ld_state, nd + D, ld_state, eps, row_eps, rows, D, in.out + (bh * Lq + i0) * D,
                   saved ? saved + bh * Lq + i0 : nullptr);
  });
}

// Causal, one head per task, chunk by chunk: inside a chunk the masked quadratic form (φ(Q_c)φ(K_c)ᵀ ⊙
// tril) [V_c | 1]; across chunks the running state S = Σ_{j before the chunk} φ(k_j) [v_j | 1]ᵀ. Query i
// attends keys j <= i + c (mask.hpp causal_offset: c = 0 upper-left, seq_kv - seq_q lower-right), so the
// chunk of queries [c0, c0 + C) meets the diagonal keys [c0 + c, c0 + c + C): keys before c0 + c are in
// the state (with c > 0, keys [0, c) are folded in before the first chunk: every query sees them), and
// with c < 0 the first -c queries see no key and get 0.
void forward_causal(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, float eps,
                    int64_t chunk, float* saved) {
  const int64_t D = p.head_dim, M = phi.features(), Lq = p.seq_q, Lkv = p.seq_kv, ld_state = D + 1;
  const int64_t C = std::min(chunk, Lq), off = causal_offset(p);
  const bool per_row_eps = phi.scales_eps();
  const std::size_t scratch_floats = causal_scratch_floats(p, M, chunk, per_row_eps);
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;

  tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) {
    AlignedVector<float>& buf = scratch.local();
    if (buf.size() < scratch_floats) buf.resize(scratch_floats);
    float* fq = buf.data();
    float* fk = fq + C * M;
    float* a = fk + C * M;
    float* nd = a + C * C;
    float* state = nd + C * ld_state;
    float* col_sum = state + M * ld_state;
    float* prefix = col_sum + M;  // kFeatureKeyRows x m: φ of the keys every query sees (off > 0)
    float* row_eps = per_row_eps ? prefix + (off > 0 ? kFeatureKeyRows * M : 0) : nullptr;
    std::fill(state, state + M * ld_state + M, 0.0f);                  // state and col_sum
    const int64_t b = bh / p.heads, kv = p.kv_block(b, bh % p.heads);  // grouped-query: the shared K/V
    if (off > 0) fold_keys(p, in, phi, b, kv, 0, std::min(off, Lkv), state, col_sum, prefix);

    for (int64_t c0 = 0; c0 < Lq; c0 += C) {
      const int64_t nq = std::min(C, Lq - c0);
      // This chunk's diagonal keys [ka, kb): row r may see keys j <= c0 + r + off.
      const int64_t kd = c0 + off, ka = std::clamp<int64_t>(kd, 0, Lkv),
                    kb = std::clamp<int64_t>(kd + nq, 0, Lkv), nk = kb - ka;
      query_features(p, in, phi, bh, c0, nq, eps, fq, row_eps);
      // Inter-chunk part first: nd = φ(Q_c) S (both numerator and denominator columns).
      sgemm(false, false, nq, ld_state, M, 1.0f, fq, M, state, ld_state, 0.0f, nd, ld_state);
      if (nk > 0) {
        const float* v = in.v + (kv * Lkv + ka) * D;
        std::fill(col_sum, col_sum + M, 0.0f);
        key_features(p, in, phi, b, kv, ka, nk, fk, col_sum);
        // Intra-chunk: A = φ(Q_c) φ(K_c)ᵀ with the future zeroed, its row sums into the denominator column.
        sgemm(false, true, nq, nk, M, 1.0f, fq, M, fk, M, 0.0f, a, nk);
        for (int64_t r = 0; r < nq; ++r) {
          float* ar = a + r * nk;
          const int64_t seen = std::clamp<int64_t>(kd + r + 1 - ka, 0, nk);  // keys ka .. ka+seen-1
          std::fill(ar + seen, ar + nk, 0.0f);
          float row_sum = 0;
          for (int64_t j = 0; j < seen; ++j) row_sum += ar[j];
          nd[r * ld_state + D] += row_sum;
        }
        sgemm(false, false, nq, D, nk, 1.0f, a, nk, v, D, 1.0f, nd, ld_state);
        // Fold this chunk's keys into the state for the chunks after it.
        sgemm(true, false, M, D, nk, 1.0f, fk, M, v, D, 1.0f, state, ld_state);
        for (int64_t e = 0; e < M; ++e) state[e * ld_state + D] += col_sum[e];
      }
      normalise_rows(nd, ld_state, nd + D, ld_state, eps, row_eps, nq, D, in.out + (bh * Lq + c0) * D,
                     saved ? saved + bh * Lq + c0 : nullptr);
    }
  });
}

// ---- Backward ----
// Notation (feature_attention.hpp): f_i = φ(q_i), g_j = φ(k_j) (zero rows for padded keys), Ṽ_j = [v_j | 1],
// Ẽ_i = r_i [dO_i | −dO_i·O_i] with r_i the forward's saved 1 / (den_i + eps_i). dL/dw_ij = Ṽ_j·Ẽ_i for every
// allowed pair, so dφ(q_i) = Σ_j g_j (Ṽ_j·Ẽ_i), dφ(k_j) = Σ_i f_i (Ṽ_j·Ẽ_i) and dv_j = Σ_i w_ij r_i dO_i
// (the first d entries of Σ_i w_ij Ẽ_i). Padded keys have g_j = 0, so they take no part in any sum; their
// dφ(k_j) is zeroed before input_gradient (their features are not a function of k_j).

// Tasks the non-causal backward's query phase aims for when there are few query heads (each head's blocks
// then split into slabs, each slab keeping one m×(d+1) partial of U; see backward_full).
inline constexpr int64_t kBackwardQueryTasks = 16;

// Ṽ = [V | 1] of `rows` value rows into dst (rows × (d+1)).
void augment_values(const float* v, int64_t rows, int64_t D, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(v + r * D, v + (r + 1) * D, dst + r * (D + 1));
    dst[r * (D + 1) + D] = 1.0f;
  }
}

// Ẽ of query rows i0 .. i0+rows-1 of head bh into dst (rows × (d+1)): r_i dO_i and −r_i (dO_i·O_i), with
// the forward's O and r_i. A row with no allowed key has O_i = 0 and takes part in no sum below.
void scaled_output_gradients(const Problem& p, const GradientArgs& g, int64_t bh, int64_t i0, int64_t rows,
                             float* dst) {
  const int64_t D = p.head_dim, ld = D + 1;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = bh * p.seq_q + i0 + r;
    const float* dout = g.d_out + row * D;
    const float* o = g.out + row * D;
    float delta = 0;
    for (int64_t d = 0; d < D; ++d) delta += dout[d] * o[d];
    const float inv = g.saved[row];
    for (int64_t d = 0; d < D; ++d) dst[r * ld + d] = inv * dout[d];
    dst[r * ld + D] = -(inv * delta);
  }
}

// Zeroes the entries of a chunk's nq × nk pair matrix whose key the query may not see: row r (query c0 + r)
// sees the block's keys ka .. ka + seen - 1 with seen = clamp(kd + r + 1 − ka, 0, nk), kd = c0 + offset.
void mask_future(float* a, int64_t nq, int64_t nk, int64_t kd, int64_t ka) {
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t seen = std::clamp<int64_t>(kd + r + 1 - ka, 0, nk);
    std::fill(a + r * nk + seen, a + (r + 1) * nk, 0.0f);
  }
}

// Keys per block of the causal backward: a chunk's diagonal keys (at most C) or, lower-right with more keys
// than queries, the block size the keys every query sees are handled in.
int64_t causal_key_block(const Problem& p, int64_t C) {
  const int64_t off = p.mask.any_causal() ? causal_offset(p) : 0;
  return off > 0 ? std::max(C, std::min({kFeatureKeyRows, off, p.seq_kv})) : C;
}

// One causal backward task's floats (both phases use the same layout): F (C × m), Ẽ (C × (d+1)), eps per
// row (C, when the map scales it), key features G, Ṽ and dφ(Q) or dφ(K) (KB × m, KB × (d+1), max(C, KB) ×
// m), the two C × C pair matrices, and the m × (d+1) state. Saturating.
std::size_t causal_backward_scratch_floats(const Problem& p, int64_t m, int64_t chunk, bool per_row_eps) {
  const int64_t C64 = std::max<int64_t>(1, std::min(chunk, p.seq_q));
  const std::size_t D = to_size(p.head_dim), M = to_size(m), C = to_size(C64),
                    KB = to_size(causal_key_block(p, C64));
  return sat_add(sat_mul(C, M), sat_mul(C, D + 1), per_row_eps ? C : 0, sat_mul(KB, M), sat_mul(KB, D + 1),
                 sat_mul(std::max(C, KB), M), sat_mul(2, C, C), sat_mul(M, D + 1));
}

struct CausalScratch {
  float *f, *et, *row_eps, *g, *vt, *dx, *a, *bm, *state;
  CausalScratch(const Problem& p, int64_t M, int64_t C, int64_t KB, bool per_row_eps, float* buf) {
    const int64_t ld = p.head_dim + 1;
    f = buf;
    et = f + C * M;
    row_eps = et + C * ld;
    g = row_eps + (per_row_eps ? C : 0);
    vt = g + KB * M;
    dx = vt + KB * ld;
    a = dx + std::max(C, KB) * M;
    bm = a + C * C;
    state = bm + C * C;
    if (!per_row_eps) row_eps = nullptr;
  }
};

// Causal, phase A (dQ), one query head per task, chunks in order: S = Σ_{keys before the chunk's diagonal
// block} g_j Ṽ_jᵀ (the forward's running state, keys [0, offset) first when offset > 0), then dφ(Q_c) = Ẽ_c
// Sᵀ + (Ẽ_c Ṽ_cᵀ ⊙ mask) G_c, and the chunk's keys folded into S.
void backward_causal_queries(const Problem& p, const AttentionInputs& in, const GradientArgs& g,
                             const FeatureMap& phi, int64_t chunk) {
  const int64_t D = p.head_dim, M = phi.features(), Lq = p.seq_q, Lkv = p.seq_kv, ld = D + 1;
  const int64_t C = std::min(chunk, Lq), off = causal_offset(p), KB = causal_key_block(p, C);
  const bool per_row_eps = phi.scales_eps();
  const std::size_t floats = causal_backward_scratch_floats(p, M, chunk, per_row_eps);
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;

  tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) {
    AlignedVector<float>& buf = scratch.local();
    if (buf.size() < floats) buf.resize(floats);
    const CausalScratch s(p, M, C, KB, per_row_eps, buf.data());
    const int64_t b = bh / p.heads, kv = p.kv_block(b, bh % p.heads);
    std::fill(s.state, s.state + M * ld, 0.0f);
    for (int64_t j0 = 0; j0 < std::min(off, Lkv); j0 += KB) {  // keys every query sees
      const int64_t nk = std::min(KB, std::min(off, Lkv) - j0);
      key_features(p, in, phi, b, kv, j0, nk, s.g, nullptr);
      augment_values(in.v + (kv * Lkv + j0) * D, nk, D, s.vt);
      sgemm(true, false, M, ld, nk, 1.0f, s.g, M, s.vt, ld, 1.0f, s.state, ld);
    }
    for (int64_t c0 = 0; c0 < Lq; c0 += C) {
      const int64_t nq = std::min(C, Lq - c0);
      const int64_t kd = c0 + off, ka = std::clamp<int64_t>(kd, 0, Lkv),
                    kb = std::clamp<int64_t>(kd + nq, 0, Lkv), nk = kb - ka;
      query_features(p, in, phi, bh, c0, nq, 1.0f, s.f, s.row_eps);  // the eps is unused: r_i is saved
      scaled_output_gradients(p, g, bh, c0, nq, s.et);
      sgemm(false, true, nq, M, ld, 1.0f, s.et, ld, s.state, ld, 0.0f, s.dx, M);
      if (nk > 0) {
        key_features(p, in, phi, b, kv, ka, nk, s.g, nullptr);
        augment_values(in.v + (kv * Lkv + ka) * D, nk, D, s.vt);
        sgemm(false, true, nq, nk, ld, 1.0f, s.et, ld, s.vt, ld, 0.0f, s.bm, nk);  // dL/dw of the block
        mask_future(s.bm, nq, nk, kd, ka);
        sgemm(false, false, nq, M, nk, 1.0f, s.bm, nk, s.g, M, 1.0f, s.dx, M);
        sgemm(true, false, M, ld, nk, 1.0f, s.g, M, s.vt, ld, 1.0f, s.state, ld);
      }
      phi.input_gradient(query_rows(p, in, bh, c0, nq), s.f, s.dx, g.dq + (bh * Lq + c0) * D);
    }
  });
}

// Causal, phase B (dK, dV), one K/V head per task with its group's query heads inside, chunks in reverse:
// U = Σ_{queries after the chunk, every head of the group} f_i Ẽ_iᵀ (m × (d+1)), then for the chunk's
// diagonal keys dφ(K_c) = Ṽ_c Uᵀ + Σ_h (Ẽ_hc Ṽ_cᵀ ⊙ mask)ᵀ F_hc and dV_c = G_c U[:, :d] + Σ_h (F_hc G_cᵀ ⊙
// mask)ᵀ Ẽ_hc[:, :d], and the chunk's queries folded into U. The keys every query sees (offset > 0) take the
// final U alone; keys no query sees get zeros. Summing the group inside the task writes dK, dV once, in head
// order, with the key features computed once per K/V head.
void backward_causal_keys(const Problem& p, const AttentionInputs& in, const GradientArgs& g,
                          const FeatureMap& phi, int64_t chunk) {
  const int64_t D = p.head_dim, M = phi.features(), Lq = p.seq_q, Lkv = p.seq_kv, ld = D + 1;
  const int64_t C = std::min(chunk, Lq), off = causal_offset(p), KB = causal_key_block(p, C);
  const int64_t Hkv = p.num_kv_heads(), G = p.group_size();
  const bool per_row_eps = phi.scales_eps();
  const std::size_t floats = causal_backward_scratch_floats(p, M, chunk, per_row_eps);
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;

  tbb::parallel_for(int64_t{0}, p.batch * Hkv, [&](int64_t kv) {
    AlignedVector<float>& buf = scratch.local();
    if (buf.size() < floats) buf.resize(floats);
    const CausalScratch s(p, M, C, KB, per_row_eps, buf.data());
    const int64_t b = kv / Hkv, h0 = b * p.heads + (kv % Hkv) * G;  // the group's first query head (bh)
    float* dk = g.dk + kv * Lkv * D;
    float* dv = g.dv + kv * Lkv * D;
    float* u = s.state;
    std::fill(u, u + M * ld, 0.0f);
    // Keys past the last query's reach get no gradient.
    const int64_t reach = std::clamp<int64_t>(Lq + off, 0, Lkv);
    std::fill(dk + reach * D, dk + Lkv * D, 0.0f);
    std::fill(dv + reach * D, dv + Lkv * D, 0.0f);
    // Keys with dφ(K) ready in s.dx (with U's part and every head's): padding zeroed, then through φ.
    auto finish_keys = [&](int64_t j0, int64_t nk) {
      zero_padded_rows(p, in, b, j0, nk, s.dx, M, M);
      phi.input_gradient(key_rows(p, in, b, kv, j0, nk), s.g, s.dx, dk + j0 * D);
    };
    for (int64_t c0 = (Lq - 1) / C * C; c0 >= 0; c0 -= C) {
      const int64_t nq = std::min(C, Lq - c0);
      const int64_t kd = c0 + off, ka = std::clamp<int64_t>(kd, 0, Lkv),
                    kb = std::clamp<int64_t>(kd + nq, 0, Lkv), nk = kb - ka;
      if (nk > 0) {
        key_features(p, in, phi, b, kv, ka, nk, s.g, nullptr);
        augment_values(in.v + (kv * Lkv + ka) * D, nk, D, s.vt);
        sgemm(false, true, nk, M, ld, 1.0f, s.vt, ld, u, ld, 0.0f, s.dx, M);
        sgemm(false, false, nk, D, M, 1.0f, s.g, M, u, ld, 0.0f, dv + ka * D, D);
      }
      for (int64_t bh = h0; bh < h0 + G; ++bh) {
        query_features(p, in, phi, bh, c0, nq, 1.0f, s.f, s.row_eps);
        scaled_output_gradients(p, g, bh, c0, nq, s.et);
        if (nk > 0) {
          sgemm(false, true, nq, nk, M, 1.0f, s.f, M, s.g, M, 0.0f, s.a, nk);  // w of the block
          mask_future(s.a, nq, nk, kd, ka);
          sgemm(false, true, nq, nk, ld, 1.0f, s.et, ld, s.vt, ld, 0.0f, s.bm, nk);  // dL/dw of the block
          mask_future(s.bm, nq, nk, kd, ka);
          sgemm(true, false, nk, M, nq, 1.0f, s.bm, nk, s.f, M, 1.0f, s.dx, M);
          sgemm(true, false, nk, D, nq, 1.0f, s.a, nk, s.et, ld, 1.0f, dv + ka * D, D);
        }
        sgemm(true, false, M, ld, nq, 1.0f, s.f, M, s.et, ld, 1.0f, u, ld);
      }
      if (nk > 0) finish_keys(ka, nk);
    }
    for (int64_t j0 = 0; j0 < std::min(off, Lkv); j0 += KB) {  // keys every query sees: U alone
      const int64_t nk = std::min(KB, std::min(off, Lkv) - j0);
      key_features(p, in, phi, b, kv, j0, nk, s.g, nullptr);
      augment_values(in.v + (kv * Lkv + j0) * D, nk, D, s.vt);
      sgemm(false, true, nk, M, ld, 1.0f, s.vt, ld, u, ld, 0.0f, s.dx, M);
      sgemm(false, false, nk, D, M, 1.0f, s.g, M, u, ld, 0.0f, dv + j0 * D, D);
      finish_keys(j0, nk);
    }
  });
}

// Non-causal query tasks: (query head, slab of consecutive kFeatureQueryRows blocks), as many slabs per head
// as give kBackwardQueryTasks tasks when there are few heads (fixed by the problem, not the threads).
struct QuerySlabs {
  int64_t blocks, per_slab, slabs;
  explicit QuerySlabs(const Problem& p) {
    blocks = (p.seq_q + kFeatureQueryRows - 1) / kFeatureQueryRows;
    const int64_t bh = p.batch * p.heads;
    const int64_t wanted = std::clamp<int64_t>((kBackwardQueryTasks + bh - 1) / bh, 1, blocks);
    per_slab = (blocks + wanted - 1) / wanted;
    slabs = (blocks + per_slab - 1) / per_slab;
  }
};

// Floats of one non-causal backward thread, the largest of its three phases: folding keys (a block of key
// features and a column sum), a query block (F, dφ(Q), Ẽ and eps per row) and a key block (G, dφ(K), Ṽ).
std::size_t full_backward_thread_floats(const Problem& p, int64_t m, bool per_row_eps) {
  const std::size_t D = to_size(p.head_dim), M = to_size(m);
  const std::size_t fold = sat_add(sat_mul(kFeatureKeyRows, M), M);
  const std::size_t queries = sat_add(sat_mul(2, kFeatureQueryRows, M), sat_mul(kFeatureQueryRows, D + 1),
                                      per_row_eps ? to_size(kFeatureQueryRows) : 0);
  const std::size_t keys = sat_add(sat_mul(2, kFeatureKeyRows, M), sat_mul(kFeatureKeyRows, D + 1));
  return std::max({fold, queries, keys});
}

// Non-causal: (1) per K/V head the forward's state S = [φ(K)ᵀV | φ(K)ᵀ1]; (2) per (query head, slab):
// dφ(Q) = Ẽ Sᵀ per block of queries, and the slab's partial Σ f_i Ẽ_iᵀ; (3) per K/V head U = the partials of
// its group's heads and slabs summed in (head, slab) order, in place of S; (4) per (K/V head, block of keys):
// dφ(K) = Ṽ Uᵀ and dV = G U[:, :d].
void backward_full(const Problem& p, const AttentionInputs& in, const GradientArgs& g,
                   const FeatureMap& phi) {
  const int64_t D = p.head_dim, M = phi.features(), Lq = p.seq_q, Lkv = p.seq_kv, ld = D + 1;
  const int64_t BH = p.batch * p.heads, BKV = p.batch * p.num_kv_heads(), G = p.group_size();
  const bool per_row_eps = phi.scales_eps();
  const QuerySlabs qs(p);
  const int64_t state = M * ld;
  AlignedVector<float> states(static_cast<std::size_t>(BKV * state), 0.0f);
  AlignedVector<float> parts(static_cast<std::size_t>(BH * qs.slabs * state));
  const std::size_t thread_floats = full_backward_thread_floats(p, M, per_row_eps);
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;
  auto local = [&]() -> float* {
    AlignedVector<float>& buf = scratch.local();
    if (buf.size() < thread_floats) buf.resize(thread_floats);
    return buf.data();
  };

  tbb::parallel_for(int64_t{0}, BKV, [&](int64_t kv) {
    float* buf = local();
    fold_keys(p, in, phi, kv / p.num_kv_heads(), kv, 0, Lkv, states.data() + kv * state,
              buf + kFeatureKeyRows * M, buf);
  });

  tbb::parallel_for(int64_t{0}, BH * qs.slabs, [&](int64_t task) {
    const int64_t bh = task / qs.slabs, slab = task % qs.slabs;
    const int64_t kv = p.kv_block(bh / p.heads, bh % p.heads);
    float* f = local();
    float* df = f + kFeatureQueryRows * M;
    float* et = df + kFeatureQueryRows * M;
    float* row_eps = per_row_eps ? et + kFeatureQueryRows * ld : nullptr;
    float* part = parts.data() + task * state;
    const int64_t first = slab * qs.per_slab, last = std::min(qs.blocks, first + qs.per_slab);
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t i0 = blk * kFeatureQueryRows, rows = std::min(kFeatureQueryRows, Lq - i0);
      query_features(p, in, phi, bh, i0, rows, 1.0f, f, row_eps);  // the eps is unused: r_i is saved
      scaled_output_gradients(p, g, bh, i0, rows, et);
      sgemm(false, true, rows, M, ld, 1.0f, et, ld, states.data() + kv * state, ld, 0.0f, df, M);
      sgemm(true, false, M, ld, rows, 1.0f, f, M, et, ld, blk == first ? 0.0f : 1.0f, part, ld);
      phi.input_gradient(query_rows(p, in, bh, i0, rows), f, df, g.dq + (bh * Lq + i0) * D);
    }
  });

  tbb::parallel_for(int64_t{0}, BKV, [&](int64_t kv) {
    float* u = states.data() + kv * state;
    const int64_t b = kv / p.num_kv_heads(), h0 = b * p.heads + (kv % p.num_kv_heads()) * G;
    const float* first = parts.data() + h0 * qs.slabs * state;  // the group's parts are consecutive
    std::copy(first, first + state, u);
    for (int64_t t = 1; t < G * qs.slabs; ++t) {
      const float* part = first + t * state;
      for (int64_t e = 0; e < state; ++e) u[e] += part[e];
    }
  });

  const int64_t key_blocks = (Lkv + kFeatureKeyRows - 1) / kFeatureKeyRows;
  tbb::parallel_for(int64_t{0}, BKV * key_blocks, [&](int64_t task) {
    const int64_t kv = task / key_blocks, j0 = task % key_blocks * kFeatureKeyRows;
    const int64_t rows = std::min(kFeatureKeyRows, Lkv - j0), b = kv / p.num_kv_heads();
    const float* u = states.data() + kv * state;
    float* gk = local();
    float* dg = gk + kFeatureKeyRows * M;
    float* vt = dg + kFeatureKeyRows * M;
    key_features(p, in, phi, b, kv, j0, rows, gk, nullptr);
    augment_values(in.v + (kv * Lkv + j0) * D, rows, D, vt);
    sgemm(false, true, rows, M, ld, 1.0f, vt, ld, u, ld, 0.0f, dg, M);
    sgemm(false, false, rows, D, M, 1.0f, gk, M, u, ld, 0.0f, g.dv + (kv * Lkv + j0) * D, D);
    zero_padded_rows(p, in, b, j0, rows, dg, M, M);
    phi.input_gradient(key_rows(p, in, b, kv, j0, rows), gk, dg, g.dk + (kv * Lkv + j0) * D);
  });
}

}  // namespace

void feature_attention_forward(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, float eps,
                               int64_t chunk, float* saved) {
  require_fp32_inputs(in, "feature_attention_forward");
  if (p.mask.any_causal())
    forward_causal(p, in, phi, eps, chunk, saved);
  else
    forward_full(p, in, phi, eps, saved);
}

std::size_t feature_attention_saved_floats(const Problem& p) {
  return to_size(p.batch * p.heads * p.seq_q);
}

void feature_attention_reference(const Problem& p, const AttentionInputs& in, const FeatureMapFp64& phi,
                                 double eps, double* out) {
  require_fp32_inputs(in, "feature_attention_reference");
  const int64_t D = p.head_dim, M = phi.features(), Lq = p.seq_q, Lkv = p.seq_kv;
  std::vector<double> fq(static_cast<std::size_t>(M)), fk(static_cast<std::size_t>(Lkv * M));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t bh = b * p.heads + h, kv = p.kv_block(b, h);
      for (int64_t j = 0; j < Lkv; ++j) phi.key(b, kv, j, in.k + (kv * Lkv + j) * D, fk.data() + j * M);
      for (int64_t i = 0; i < Lq; ++i) {
        const double row_eps = phi.query(b, h, i, in.q + (bh * Lq + i) * D, fq.data(), eps);
        double* o = out + (bh * Lq + i) * D;
        std::fill(o, o + D, 0.0);
        double den = 0;
        for (int64_t j = 0; j < Lkv; ++j) {
          if (!key_allowed(p, in, b, i, j)) continue;
          double w = 0;
          for (int64_t e = 0; e < M; ++e) w += fq[e] * fk[j * M + e];
          den += w;
          for (int64_t d = 0; d < D; ++d) o[d] += w * in.v[(kv * Lkv + j) * D + d];
        }
        for (int64_t d = 0; d < D; ++d) o[d] /= den + row_eps;
      }
    }
}

void feature_attention_backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g,
                                const FeatureMap& phi, int64_t chunk) {
  require_fp32_inputs(in, "feature_attention_backward");
  if (!g.out || !g.saved || !g.d_out || !g.dq || !g.dk || !g.dv)
    throw std::logic_error("feature_attention_backward: O, the saved state, dO, dq, dk and dv are required");
  if (p.mask.any_causal()) {
    // Two passes over the chunks in opposite directions: the dQ prefix runs forwards, the dK / dV one
    // backwards; they share nothing but the inputs.
    backward_causal_queries(p, in, g, phi, chunk);
    backward_causal_keys(p, in, g, phi, chunk);
  } else {
    backward_full(p, in, g, phi);
  }
}

namespace {

// The fp64 quantities of query row i of head (b, h) in the quadratic definition: its features and eps, the
// allowed keys with their weights, r = 1 / (den + eps), O and δ = dO·O.
struct ReferenceRow {
  std::vector<double> f, w, o;
  std::vector<int64_t> keys;
  double r = 0, delta = 0;
};

void reference_row(const Problem& p, const AttentionInputs& in, const FeatureMapFp64& phi, double eps,
                   const float* d_out, const std::vector<double>& fk, int64_t b, int64_t h, int64_t i,
                   ReferenceRow& row) {
  const int64_t D = p.head_dim, M = phi.features(), Lq = p.seq_q, Lkv = p.seq_kv;
  const int64_t bh = b * p.heads + h, kv = p.kv_block(b, h);
  row.f.resize(static_cast<std::size_t>(M));
  row.o.assign(static_cast<std::size_t>(D), 0.0);
  row.w.clear();
  row.keys.clear();
  const double row_eps = phi.query(b, h, i, in.q + (bh * Lq + i) * D, row.f.data(), eps);
  double den = 0;
  for (int64_t j = 0; j < Lkv; ++j) {
    if (!key_allowed(p, in, b, i, j)) continue;
    double w = 0;
    for (int64_t e = 0; e < M; ++e) w += row.f[e] * fk[j * M + e];
    row.keys.push_back(j);
    row.w.push_back(w);
    den += w;
    for (int64_t d = 0; d < D; ++d) row.o[d] += w * in.v[(kv * Lkv + j) * D + d];
  }
  row.r = 1.0 / (den + row_eps);
  row.delta = 0;
  for (int64_t d = 0; d < D; ++d) {
    row.o[d] *= row.r;
    row.delta += static_cast<double>(d_out[(bh * Lq + i) * D + d]) * row.o[d];
  }
}

// Key features of every key of K/V block kv (batch entry b): Lkv × m.
std::vector<double> reference_key_features(const Problem& p, const AttentionInputs& in,
                                           const FeatureMapFp64& phi, int64_t b, int64_t kv) {
  const int64_t D = p.head_dim, M = phi.features(), Lkv = p.seq_kv;
  std::vector<double> fk(static_cast<std::size_t>(Lkv * M));
  for (int64_t j = 0; j < Lkv; ++j) phi.key(b, kv, j, in.k + (kv * Lkv + j) * D, fk.data() + j * M);
  return fk;
}

}  // namespace

void feature_attention_reference_backward(const Problem& p, const AttentionInputs& in,
                                          const FeatureMapFp64& phi, double eps, const float* d_out,
                                          double* dq, double* dk, double* dv) {
  require_fp32_inputs(in, "feature_attention_reference_backward");
  const int64_t D = p.head_dim, M = phi.features(), Lq = p.seq_q, Lkv = p.seq_kv;
  const int64_t Hkv = p.num_kv_heads(), G = p.group_size();
  tbb::parallel_for(int64_t{0}, p.batch * Hkv, [&](int64_t kv) {
    const int64_t b = kv / Hkv;
    const std::vector<double> fk = reference_key_features(p, in, phi, b, kv);
    std::vector<double> dg(static_cast<std::size_t>(Lkv * M), 0.0), df(static_cast<std::size_t>(M));
    double* dvk = dv + kv * Lkv * D;
    std::fill(dvk, dvk + Lkv * D, 0.0);
    ReferenceRow row;
    for (int64_t h = (kv % Hkv) * G; h < (kv % Hkv + 1) * G; ++h) {
      const int64_t bh = b * p.heads + h;
      for (int64_t i = 0; i < Lq; ++i) {
        reference_row(p, in, phi, eps, d_out, fk, b, h, i, row);
        const float* dout = d_out + (bh * Lq + i) * D;
        std::fill(df.begin(), df.end(), 0.0);
        for (std::size_t t = 0; t < row.keys.size(); ++t) {
          const int64_t j = row.keys[t];
          const float* v = in.v + (kv * Lkv + j) * D;
          double dw = 0;  // dL/dw_ij = r (dO_i·v_j − δ_i)
          for (int64_t d = 0; d < D; ++d) dw += static_cast<double>(dout[d]) * v[d];
          dw = row.r * (dw - row.delta);
          for (int64_t e = 0; e < M; ++e) {
            df[e] += dw * fk[j * M + e];
            dg[j * M + e] += dw * row.f[e];
          }
          for (int64_t d = 0; d < D; ++d) dvk[j * D + d] += row.w[t] * row.r * dout[d];
        }
        phi.input_gradient(in.q + (bh * Lq + i) * D, row.f.data(), df.data(), dq + (bh * Lq + i) * D);
      }
    }
    for (int64_t j = 0; j < Lkv; ++j)
      phi.input_gradient(in.k + (kv * Lkv + j) * D, fk.data() + j * M, dg.data() + j * M,
                         dk + (kv * Lkv + j) * D);
  });
}

// Why this bound. u = 2^-24; ε_q, ε_k the relative errors of the fp32 query and key features (the caller's
// FeatureErrors); L = seq_kv, n_q = seq_q, G query heads per K/V head. Every computed quantity below is a sum
// of products of features, values, dO and r; we bound its error by the sum of the magnitudes of its terms
// times their own relative errors plus n·u for a sum n deep (worst-case gamma_n, first order), element by
// element from the fp64 quantities of the definition:
//  * forward (the O and r the backward is given): every term of den_i and num_id is f_ie g_je (v_jd): within
//    ε_w = ε_q + ε_k + (m + 2L + 6) u relative (2L: the state's and the chunks' sums, by blocks); so with
//    N_id = Σ_j w_ij |v_jd|, r_i is within ε_r = ε_w + 3u relative (eps's own rounding inside) and |ΔO_id| ≤
//    e_o = r_i ε_w N_id + |O_id| (ε_r + u);
//  * δ_i = dO_i·O_i (d terms): |Δδ_i| ≤ e_δ = Σ_d |dO_id| e_o,d + (d + 1) u Σ_d |dO_id O_id|; Ẽ_i = r_i [dO_i
//    | −δ_i] within r_i |dO_id| (ε_r + u) and r_i (e_δ + |δ_i| (ε_r + u));
//  * dL/dw_ij = Ṽ_j·Ẽ_i, whose terms have magnitude Mag_ij = r_i (Σ_d |v_jd dO_id| + |δ_i|) and errors
//    Err_ij = r_i ((ε_r + u)(Σ_d |v_jd dO_id| + |δ_i|) + e_δ);
//  * dφ(q_i)_e = Σ_j g_je (Ṽ_j·Ẽ_i): |Δ| ≤ Σ_j g_je (Mag_ij (ε_k + n_dq u) + Err_ij), n_dq = 2L + d + 6 (the
//    state's sum over keys, the d + 1 of the product, the chunk's masked sum);
//  * dφ(k_j)_e = Σ_i f_ie (Ṽ_j·Ẽ_i) over the group's queries that see j: |Δ| ≤ Σ_i f_ie (Mag_ij (ε_q + n_dk
//  u)
//    + Err_ij), n_dk = 2 G n_q + d + G + 6 (U's sum over the group's queries by chunks or slabs);
//  * dv_jd = Σ_i Σ_e f_ie g_je Ẽ_id: |Δ| ≤ Σ_i w_ij r_i |dO_id| (ε_q + ε_k + ε_r + (n_dv + 2) u), n_dv =
//    2 G n_q + m + G + 6;
//  * dq, dk: the map's input_gradient_error on those dφ bounds and the features' ε (the map's derivation).
// Features are >= 0, so no cancellation hides inside the magnitudes of the feature sums; the signs of dO, v
// and δ are all carried in absolute values. We allow 2x that (as exact_grad_tolerance does) and take the
// max over elements. A wrong chunk boundary, mask or state update on a single key moves that key's dv_j and
// dk_j, and the dq_i of the queries near it, by O(1) of their size, far above this.
GradientTolerance feature_attention_grad_tolerance(const Problem& p, const AttentionInputs& in,
                                                   const FeatureMapFp64& phi, double eps, const float* d_out,
                                                   FeatureErrors feature_err) {
  require_fp32_inputs(in, "feature_attention_grad_tolerance");
  const int64_t D = p.head_dim, M = phi.features(), Lq = p.seq_q, Lkv = p.seq_kv;
  const int64_t Hkv = p.num_kv_heads(), G = p.group_size();
  const double u = std::ldexp(1.0, -24), eq = feature_err.query, ek = feature_err.key;
  const double dd = static_cast<double>(D), mm = static_cast<double>(M), L = static_cast<double>(Lkv),
               gq = static_cast<double>(G * Lq), gg = static_cast<double>(G);
  const double eps_w = eq + ek + (mm + 2 * L + 6) * u, eps_r = eps_w + 3 * u;
  const double n_dq = 2 * L + dd + 6, n_dk = 2 * gq + dd + gg + 6, n_dv = 2 * gq + mm + gg + 6;
  std::vector<double> worst(static_cast<std::size_t>(3 * p.batch * Hkv), 0.0);
  tbb::parallel_for(int64_t{0}, p.batch * Hkv, [&](int64_t kv) {
    const int64_t b = kv / Hkv;
    const std::vector<double> fk = reference_key_features(p, in, phi, b, kv);
    std::vector<double> dg(static_cast<std::size_t>(Lkv * M), 0.0), e_dg(dg.size(), 0.0),
        e_dv(static_cast<std::size_t>(Lkv * D), 0.0);
    std::vector<double> df(static_cast<std::size_t>(M)), e_df(df.size()), e_o(static_cast<std::size_t>(D)),
        e_x(static_cast<std::size_t>(D));
    double* w = worst.data() + 3 * kv;
    ReferenceRow row;
    for (int64_t h = (kv % Hkv) * G; h < (kv % Hkv + 1) * G; ++h) {
      const int64_t bh = b * p.heads + h;
      for (int64_t i = 0; i < Lq; ++i) {
        reference_row(p, in, phi, eps, d_out, fk, b, h, i, row);
        if (row.keys.empty()) continue;  // O_i = 0 exactly and the row takes part in no sum
        const float* dout = d_out + (bh * Lq + i) * D;
        double e_delta = 0, ad = std::fabs(row.delta);
        for (int64_t d = 0; d < D; ++d) {
          double n_abs = 0;
          for (std::size_t t = 0; t < row.keys.size(); ++t)
            n_abs += row.w[t] * std::fabs(static_cast<double>(in.v[(kv * Lkv + row.keys[t]) * D + d]));
          e_o[d] = row.r * eps_w * n_abs + std::fabs(row.o[d]) * (eps_r + u);
          e_delta += std::fabs(static_cast<double>(dout[d])) * (e_o[d] + (dd + 1) * u * std::fabs(row.o[d]));
        }
        std::fill(df.begin(), df.end(), 0.0);
        std::fill(e_df.begin(), e_df.end(), 0.0);
        for (std::size_t t = 0; t < row.keys.size(); ++t) {
          const int64_t j = row.keys[t];
          const float* v = in.v + (kv * Lkv + j) * D;
          double dot = 0, mag = 0;
          for (int64_t d = 0; d < D; ++d) {
            const double x = static_cast<double>(dout[d]) * v[d];
            dot += x, mag += std::fabs(x);
          }
          const double dw = row.r * (dot - row.delta), m_ij = row.r * (mag + ad);
          const double e_ij = row.r * ((eps_r + u) * (mag + ad) + e_delta);
          const double to_q = m_ij * (ek + n_dq * u) + e_ij, to_k = m_ij * (eq + n_dk * u) + e_ij;
          for (int64_t e = 0; e < M; ++e) {
            const double gje = fk[j * M + e], fie = row.f[e];
            df[e] += dw * gje;
            e_df[e] += gje * to_q;
            dg[j * M + e] += dw * fie;
            e_dg[j * M + e] += fie * to_k;
          }
          const double to_v = row.w[t] * row.r * (eq + ek + eps_r + (n_dv + 2) * u);
          for (int64_t d = 0; d < D; ++d) e_dv[j * D + d] += to_v * std::fabs(static_cast<double>(dout[d]));
        }
        phi.input_gradient_error(in.q + (bh * Lq + i) * D, row.f.data(), df.data(), e_df.data(), eq,
                                 e_x.data());
        for (double x : e_x) w[0] = std::max(w[0], x);
      }
    }
    for (int64_t j = 0; j < Lkv; ++j) {
      phi.input_gradient_error(in.k + (kv * Lkv + j) * D, fk.data() + j * M, dg.data() + j * M,
                               e_dg.data() + j * M, ek, e_x.data());
      for (double x : e_x) w[1] = std::max(w[1], x);
    }
    for (double x : e_dv) w[2] = std::max(w[2], x);
  });
  GradientTolerance t;
  for (int64_t x = 0; x < p.batch * Hkv; ++x) {
    t.dq = std::max(t.dq, worst[3 * x]);
    t.dk = std::max(t.dk, worst[3 * x + 1]);
    t.dv = std::max(t.dv, worst[3 * x + 2]);
  }
  const double tiny = std::numeric_limits<float>::min();
  t.dq = 2 * t.dq + tiny, t.dk = 2 * t.dk + tiny, t.dv = 2 * t.dv + tiny;
  return t;
}

double feature_attention_flops(const Problem& p, int64_t m, int64_t chunk) {
  const double D = static_cast<double>(p.head_dim), M = static_cast<double>(m),
               Lq = static_cast<double>(p.seq_q);
  // Causal folds only the keys the last query sees into the state.
  const double Lkv = static_cast<double>(causal_key_end(p, p.seq_q - 1));
  double per_head = 2.0 * Lkv * M * D + 2.0 * Lq * M * (D + 1);
  if (p.mask.any_causal()) per_head += Lq * static_cast<double>(std::min(chunk, p.seq_q) + 1) * (M + D);
  return per_head * static_cast<double>(p.batch * p.heads);
}

std::size_t feature_attention_workspace_bytes(const Problem& p, int64_t m, int64_t chunk, int threads,
                                              bool per_row_eps) {
  // Saturating (common/interface/util.hpp): m·d alone exceeds 64 bits at head_dim 2^40, a valid size.
  const std::size_t D = to_size(p.head_dim), M = to_size(m), T = to_size(std::max(threads, 1));
  if (p.mask.any_causal()) return sat_mul(T, causal_scratch_floats(p, m, chunk, per_row_eps), sizeof(float));
  const std::size_t states = sat_mul(to_size(p.batch * p.num_kv_heads()), M, D + 1);  // one per K/V head
  // One buffer per thread, sized for the larger of the two phases: a block of key features and its column
  // sum, or a block of query features, its numerator|denominator (and its eps per row).
  const std::size_t keys = sat_add(sat_mul(kFeatureKeyRows, M), M);
  const std::size_t queries = sat_add(sat_mul(kFeatureQueryRows, D + 1), sat_mul(kFeatureQueryRows, M),
                                      per_row_eps ? to_size(kFeatureQueryRows) : 0);
  return sat_mul(sat_add(states, sat_mul(T, std::max(keys, queries))), sizeof(float));
}

// Per query head (h) or K/V head (kv), with L' = the keys some query sees (causal_key_end of the last query,
// seq_kv without a causal mask) and the causal chunk products counted over their lower triangles (≈ n_q·(C+1)
// per inner dimension, as feature_attention_flops):
//  * non-causal: kv: the state [φ(K)ᵀV | φ(K)ᵀ1] rebuilt (2·L·m·d, counted as the forward counts it),
//    dφ(K) = Ṽ Uᵀ (2·L·m·(d+1)) and dV = G U (2·L·m·d); h: dφ(Q) = Ẽ Sᵀ and U += F Ẽ (2·n_q·m·(d+1) each).
//    With one K/V head per query head and n_q = L: n·m·(10d + 6) against the forward's n·m·(4d + 2), ~2.5x;
//  * causal, phase A (h): the state over L' keys (2·L'·m·(d+1)), Ẽ Sᵀ (2·n_q·m·(d+1)), the chunk's Ẽ Ṽᵀ
//    (n_q·(C+1)·(d+1)) and its product with G (n_q·(C+1)·m); phase B (h): F Gᵀ and Ẽ Ṽᵀ again, their products
//    with F and Ẽ (n_q·(C+1)·(2m + 2d + 1)) and U += F Ẽ (2·n_q·m·(d+1)); (kv): Ṽ Uᵀ and G U over L' keys
//    (2·L'·m·(2d + 1)).
double feature_attention_backward_flops(const Problem& p, int64_t m, int64_t chunk) {
  const double D = static_cast<double>(p.head_dim), M = static_cast<double>(m),
               Lq = static_cast<double>(p.seq_q), Lkv = static_cast<double>(p.seq_kv),
               seen = static_cast<double>(causal_key_end(p, p.seq_q - 1));
  const double bh = static_cast<double>(p.batch * p.heads),
               bkv = static_cast<double>(p.batch * p.num_kv_heads());
  if (!p.mask.any_causal()) return bkv * Lkv * M * (2 * D + 2 * (D + 1) + 2 * D) + bh * Lq * M * 4 * (D + 1);
  const double tri = Lq * static_cast<double>(std::min(chunk, p.seq_q) + 1);
  const double per_head = 2 * seen * M * (D + 1) + 4 * Lq * M * (D + 1) + tri * (2 * (D + 1) + 3 * M + D);
  return bh * per_head + bkv * 2 * seen * M * (2 * D + 1);
}

FeatureBackwardRows feature_attention_backward_rows(const Problem& p) {
  const double bh = static_cast<double>(p.batch * p.heads),
               bkv = static_cast<double>(p.batch * p.num_kv_heads());
  const double Lq = static_cast<double>(p.seq_q), Lkv = static_cast<double>(p.seq_kv),
               seen = static_cast<double>(causal_key_end(p, p.seq_q - 1));
  if (!p.mask.any_causal())  // keys twice per K/V head (the state, then dφ(K)), queries once
    return {.query_features = bh * Lq,
            .key_features = 2 * bkv * Lkv,
            .query_gradients = bh * Lq,
            .key_gradients = bkv * Lkv};
  // Queries in both phases; the seen keys per query head in phase A and once per K/V head in phase B.
  return {.query_features = 2 * bh * Lq,
          .key_features = (bh + bkv) * seen,
          .query_gradients = bh * Lq,
          .key_gradients = bkv * seen};
}

std::size_t feature_attention_backward_workspace_bytes(const Problem& p, int64_t m, int64_t chunk,
                                                       int threads, bool per_row_eps) {
  const std::size_t T = to_size(std::max(threads, 1));
  if (p.mask.any_causal())
    return sat_mul(T, causal_backward_scratch_floats(p, m, chunk, per_row_eps), sizeof(float));
  // The states (then U) per K/V head, the partials of U per (query head, slab), one buffer per thread.
  const std::size_t state = sat_mul(to_size(m), to_size(p.head_dim) + 1);
  const QuerySlabs qs(p);
  return sat_mul(sat_add(sat_mul(to_size(p.batch * p.num_kv_heads()), state),
                         sat_mul(to_size(p.batch * p.heads), to_size(qs.slabs), state),
                         sat_mul(T, full_backward_thread_floats(p, m, per_row_eps))),
                 sizeof(float));
}

}  // namespace attn
