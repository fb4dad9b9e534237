// The kernelised-attention engine shared by linear and performer (see feature_attention.hpp): the
// non-causal state per K/V head, the causal chunked prefix form, and the fp64 quadratic definition.
#include "common/feature_attention.hpp"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/aligned.hpp"
#include "common/mask.hpp"
#include "common/runtime.hpp"
#include "common/util.hpp"

namespace attn {
namespace {

// The engine reads fp32 Q, K, V only; a bf16 / fp16 problem arrives with them null unless widened first.
void require_fp32_inputs(const AttentionInputs& in, const char* who) {
  if (!in.q || !in.k || !in.v)
    throw std::logic_error(std::string(who) +
                           ": Q, K and V must be fp32 (widen bf16 / fp16 inputs with WideInputs first)");
}

// φ of `rows` key rows j0.. of K/V block `kv` into `dst` (rows × m); padded keys become zero rows, so they
// add nothing to any numerator or denominator. Also adds the column sums of the result into `col_sum` (the
// normaliser's φ(K)ᵀ1).
void key_features(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, int64_t b, int64_t kv,
                  int64_t j0, int64_t rows, float* dst, float* col_sum) {
  const int64_t D = p.head_dim, M = phi.features();
  phi.keys({.b = b, .head = -1, .kv = kv, .row0 = j0, .rows = rows, .src = in.k + (kv * p.seq_kv + j0) * D},
           dst);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = dst + r * M;
    if (p.mask.key_padding && in.key_padding[b * p.seq_kv + j0 + r]) std::fill(row, row + M, 0.0f);
    for (int64_t e = 0; e < M; ++e) col_sum[e] += row[e];
  }
}

// out row = numerator / (denominator + eps); a row with no allowed key has both 0 and gets 0 (eps > 0).
// row_eps: one eps per row, or null for `eps` everywhere.
void normalise_rows(const float* num, int64_t ld_num, const float* den, int64_t ld_den, float eps,
                    const float* row_eps, int64_t rows, int64_t dim, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / (den[r * ld_den] + (row_eps ? row_eps[r] : eps));
    for (int64_t d = 0; d < dim; ++d) out[r * dim + d] = num[r * ld_num + d] * inv;
  }
}

// Query features of rows i0.. of query head bh into `dst`; with a per-row eps, row_eps[0..rows) starts at
// eps and the map may rescale it.
void query_features(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, int64_t bh,
                    int64_t i0, int64_t rows, float eps, float* dst, float* row_eps) {
  const int64_t b = bh / p.heads, h = bh % p.heads;
  if (row_eps) std::fill(row_eps, row_eps + rows, eps);
  phi.queries({.b = b,
               .head = h,
               .kv = p.kv_block(b, h),
               .row0 = i0,
               .rows = rows,
               .src = in.q + (bh * p.seq_q + i0) * p.head_dim},
              dst, row_eps);
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
void forward_full(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, float eps) {
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
    normalise_rows(nd, ld_state, nd + D, ld_state, eps, row_eps, rows, D, in.out + (bh * Lq + i0) * D);
  });
}

// Causal, one head per task, chunk by chunk: inside a chunk the masked quadratic form (φ(Q_c)φ(K_c)ᵀ ⊙
// tril) [V_c | 1]; across chunks the running state S = Σ_{j before the chunk} φ(k_j) [v_j | 1]ᵀ. Query i
// attends keys j <= i + c (mask.hpp causal_offset: c = 0 upper-left, seq_kv - seq_q lower-right), so the
// chunk of queries [c0, c0 + C) meets the diagonal keys [c0 + c, c0 + c + C): keys before c0 + c are in
// the state (with c > 0, keys [0, c) are folded in before the first chunk: every query sees them), and
// with c < 0 the first -c queries see no key and get 0.
void forward_causal(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, float eps,
                    int64_t chunk) {
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
      normalise_rows(nd, ld_state, nd + D, ld_state, eps, row_eps, nq, D, in.out + (bh * Lq + c0) * D);
    }
  });
}

}  // namespace

void feature_attention_forward(const Problem& p, const AttentionInputs& in, const FeatureMap& phi, float eps,
                               int64_t chunk) {
  require_fp32_inputs(in, "feature_attention_forward");
  if (p.mask.any_causal())
    forward_causal(p, in, phi, eps, chunk);
  else
    forward_full(p, in, phi, eps);
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
  // Saturating (common/util.hpp): m·d alone exceeds 64 bits at head_dim 2^40, a valid size.
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

}  // namespace attn
