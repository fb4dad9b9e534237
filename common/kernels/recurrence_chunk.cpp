// The chunkwise-parallel form of the gated / delta-rule recurrences (common/kernels/recurrence.hpp). Per
// (batch, head), chunks of C tokens in order, the state S (d x d, fp32) carried across. Inside a chunk, with
// Gamma_t = sum of the log decays from the chunk's start to token t (inclusive), and u_t the value row each
// token adds (v_t, or the delta rule's beta_t (v_t - exp(g_t) k_t S_{t-1})):
//
//   S_t = exp(Gamma_t) S_0 + sum_{s <= t} exp(Gamma_t - Gamma_s) k_sᵀ u_s        (scalar gates)
//   o_t = scale (exp(Gamma_t) q_t S_0 + sum_{s <= t} exp(Gamma_t - Gamma_s) (q_t . k_s) u_s)
//
// i.e. O = scale (diag(e^Gamma) Q S_0 + (Q Kᵀ ⊙ D) U) with D_ts = exp(Gamma_t - Gamma_s) below the diagonal,
// and S_C = e^Gamma_C S_0 + (diag(e^(Gamma_C - Gamma)) K)ᵀ U. Vector gates (gla) make every exponent per key
// channel. The delta rule's U solves (I + A) U = diag(beta) (V - diag(e^Gamma) K S_0) with A_ts = beta_t
// D_ts (k_t . k_s) strictly below the diagonal: the UT transform of DeltaNet / Gated DeltaNet (Yang et al.
// 2024; flash-linear-attention's chunk_delta_rule computes T = (I + A)^-1 and W = T diag(beta) K,
// U = T diag(beta) V to run chunks in parallel; here chunks run in order with the state known, so one forward
// substitution on the combined right-hand side replaces T, W and U).
//
// Overflow and underflow: every exponential taken is of Gamma_t - Gamma_s with s <= t (or of Gamma_t,
// Gamma_C - Gamma_s, relative to the chunk start or end), all <= 0, so no factor exceeds 1; the cumulative
// sums are kept in fp64 (with g >= -30 a step they reach -1920 inside a chunk of 64, and an fp32 sum would
// lose the small differences between large sums), and each difference is rounded once. Entries with s > t are
// never exponentiated (exp(+1920) would overflow, and inf * 0 is NaN); a decay below fp32's range is 0, the
// correct limit. gla never factors exp(Gamma_t - Gamma_s) into exp(Gamma_t) exp(-Gamma_s) across a chunk:
// its intra-chunk scores use, for each block of 16 query rows, the log decay at the block's start as the
// reference (q_t e^(Gamma_t - Gamma_r), k_s e^(Gamma_r - Gamma_s), s <= r < t, both factors <= 1), and the
// 16 x 16 diagonal blocks elementwise.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/kernels/recurrence.hpp"
#include "common/support/runtime.hpp"

namespace attn {
namespace {

constexpr int64_t kGlaBlock = 16;  // gla's intra-chunk block of query rows (see above)

// One head's buffers for one chunk (at most C rows).
struct ChunkBuffers {
  std::vector<float> k, kd, u, a, b, x, qg, s;  // C x d (k, kd, u, x, qg), C x C (a, b), d x d (s)
  std::vector<double> gam;                      // C (scalar) or C x d (vector) cumulative log decays
  std::vector<float> ed, el;                    // C: e^Gamma_t, e^(Gamma_C - Gamma_t) (scalar gates)
  ChunkBuffers(int64_t c, int64_t d)
      : k(c * d),
        kd(c * d),
        u(c * d),
        a(c * c),
        b(c * c),
        x(c * d),
        qg(c * d),
        s(d * d),
        gam(c * d),
        ed(c),
        el(c) {}
};

// Keys of tokens t0 .. t0 + L - 1 into cb.k (L2-normalised per token when asked).
void load_keys(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t0, int64_t L, ChunkBuffers& cb) {
  const int64_t d = hi.d;
  for (int64_t i = 0; i < L; ++i) {
    const float* k = hi.k + (t0 + i) * d;
    float* dst = cb.k.data() + i * d;
    float s = 0;
    for (int64_t c = 0; c < d; ++c) s += k[c] * k[c];
    const float r = std::sqrt(s);
    const float inv = !kind.normalize_keys ? 1.0f : r > 0 ? 1.0f / r : 0.0f;
    for (int64_t c = 0; c < d; ++c) dst[c] = k[c] * inv;
  }
}

// Gamma_t (fp64) for the chunk; width 1 (scalar, retention, none) or d (vector).
void load_gammas(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t0, int64_t L, ChunkBuffers& cb) {
  const int64_t w = kind.gate == Gate::vector ? hi.d : 1;
  for (int64_t i = 0; i < L; ++i)
    for (int64_t c = 0; c < w; ++c) {
      const double g = kind.gate == Gate::vector   ? hi.g[(t0 + i) * w + c]
                       : kind.gate == Gate::scalar ? hi.g[t0 + i]
                                                   : hi.log_gamma;
      cb.gam[i * w + c] = (i ? cb.gam[(i - 1) * w + c] : 0.0) + g;
    }
  if (kind.gate == Gate::vector) return;
  for (int64_t i = 0; i < L; ++i) {
    cb.ed[i] = static_cast<float>(std::exp(cb.gam[i]));
    cb.el[i] = static_cast<float>(std::exp(cb.gam[L - 1] - cb.gam[i]));
  }
}

// cb.a (L x L) = Q K^T with D applied, zero above the diagonal (scalar gates).
void scalar_scores(const float* q, int64_t L, int64_t d, ChunkBuffers& cb) {
  sgemm(false, true, L, L, d, 1.0f, q, d, cb.k.data(), d, 0.0f, cb.a.data(), L);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t s = 0; s < L; ++s)
      cb.a[t * L + s] = s > t ? 0.0f : cb.a[t * L + s] * static_cast<float>(std::exp(cb.gam[t] - cb.gam[s]));
}

// cb.a (L x L) = sum_c q_tc k_sc exp(Gamma_tc - Gamma_sc) for s <= t, 0 above (vector gates), by blocks of
// kGlaBlock query rows relative to the block's start (see the file comment).
void vector_scores(const float* q, int64_t L, int64_t d, ChunkBuffers& cb) {
  std::fill(cb.a.begin(), cb.a.begin() + L * L, 0.0f);
  for (int64_t i0 = 0; i0 < L; i0 += kGlaBlock) {
    const int64_t i1 = std::min(L, i0 + kGlaBlock);
    for (int64_t t = i0; t < i1; ++t)  // the diagonal block, elementwise
      for (int64_t s = i0; s <= t; ++s) {
        double acc = 0;
        for (int64_t c = 0; c < d; ++c)
          acc += double(q[t * d + c]) * cb.k[s * d + c] * std::exp(cb.gam[t * d + c] - cb.gam[s * d + c]);
        cb.a[t * L + s] = static_cast<float>(acc);
      }
    if (i0 == 0) continue;
    const double* ref = cb.gam.data() + (i0 - 1) * d;  // Gamma at token r = i0 - 1: s <= r < t
    for (int64_t t = i0; t < i1; ++t)
      for (int64_t c = 0; c < d; ++c)
        cb.qg[(t - i0) * d + c] = q[t * d + c] * static_cast<float>(std::exp(cb.gam[t * d + c] - ref[c]));
    for (int64_t s = 0; s < i0; ++s)
      for (int64_t c = 0; c < d; ++c)
        cb.kd[s * d + c] = cb.k[s * d + c] * static_cast<float>(std::exp(ref[c] - cb.gam[s * d + c]));
    sgemm(false, true, i1 - i0, i0, d, 1.0f, cb.qg.data(), d, cb.kd.data(), d, 0.0f, cb.a.data() + i0 * L, L);
  }
}

// The delta rule's U into cb.u: (I + A) U = diag(beta) (V - diag(e^Gamma) K S_0), A_ts = beta_t D_ts k_t.k_s
// (s < t), by forward substitution.
void delta_values(const HeadInputs& hi, int64_t t0, int64_t L, ChunkBuffers& cb) {
  const int64_t d = hi.d;
  const float* v = hi.v + t0 * d;
  const float* beta = hi.beta + t0;
  sgemm(false, false, L, d, d, 1.0f, cb.k.data(), d, cb.s.data(), d, 0.0f, cb.x.data(), d);  // K S_0
  for (int64_t t = 0; t < L; ++t)
    for (int64_t j = 0; j < d; ++j) cb.u[t * d + j] = beta[t] * (v[t * d + j] - cb.ed[t] * cb.x[t * d + j]);
  sgemm(false, true, L, L, d, 1.0f, cb.k.data(), d, cb.k.data(), d, 0.0f, cb.b.data(), L);  // K K^T
  for (int64_t t = 1; t < L; ++t) {
    float* ut = cb.u.data() + t * d;
    for (int64_t s = 0; s < t; ++s) {
      const float coef = beta[t] * static_cast<float>(std::exp(cb.gam[t] - cb.gam[s])) * cb.b[t * L + s];
      const float* us = cb.u.data() + s * d;
      for (int64_t j = 0; j < d; ++j) ut[j] -= coef * us[j];
    }
  }
}

// O rows = scale (inter + intra), then the state moves to the chunk's end.
void finish_chunk(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t0, int64_t L, const float* U,
                  float* out, ChunkBuffers& cb) {
  const int64_t d = hi.d;
  const float* q = hi.q + t0 * d;
  const float scale = static_cast<float>(hi.scale);
  const bool vec = kind.gate == Gate::vector;
  if (vec) {  // Q ⊙ e^Gamma, and K ⊙ e^(Gamma_C - Gamma)
    const double* last = cb.gam.data() + (L - 1) * d;
    for (int64_t t = 0; t < L; ++t)
      for (int64_t c = 0; c < d; ++c) {
        cb.qg[t * d + c] = q[t * d + c] * static_cast<float>(std::exp(cb.gam[t * d + c]));
        cb.kd[t * d + c] = cb.k[t * d + c] * static_cast<float>(std::exp(last[c] - cb.gam[t * d + c]));
      }
  } else {
    for (int64_t t = 0; t < L; ++t)
      for (int64_t c = 0; c < d; ++c) cb.kd[t * d + c] = cb.k[t * d + c] * cb.el[t];
  }
  sgemm(false, false, L, d, d, scale, vec ? cb.qg.data() : q, d, cb.s.data(), d, 0.0f, out, d);
  if (!vec)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t j = 0; j < d; ++j) out[t * d + j] *= cb.ed[t];
  sgemm(false, false, L, d, L, scale, cb.a.data(), L, U, d, 1.0f, out, d);
  for (int64_t c = 0; c < d; ++c) {
    const float decay = vec ? static_cast<float>(std::exp(cb.gam[(L - 1) * d + c])) : cb.ed[L - 1];
    for (int64_t j = 0; j < d; ++j) cb.s[c * d + j] *= decay;
  }
  sgemm(true, false, d, d, L, 1.0f, cb.kd.data(), d, U, d, 1.0f, cb.s.data(), d);
}

void head_chunks(const HeadInputs& hi, const RecurrenceKind& kind, int64_t C, float* out,
                 float* final_state) {
  const int64_t n = hi.n, d = hi.d;
  ChunkBuffers cb(std::min(C, n), d);
  if (hi.s0) std::copy_n(hi.s0, d * d, cb.s.begin());
  for (int64_t t0 = 0; t0 < n; t0 += C) {
    const int64_t L = std::min(C, n - t0);
    load_keys(hi, kind, t0, L, cb);
    load_gammas(hi, kind, t0, L, cb);
    const float* q = hi.q + t0 * d;
    if (kind.gate == Gate::vector)
      vector_scores(q, L, d, cb);
    else
      scalar_scores(q, L, d, cb);
    if (kind.delta) delta_values(hi, t0, L, cb);
    finish_chunk(hi, kind, t0, L, kind.delta ? cb.u.data() : hi.v + t0 * d, out + t0 * d, cb);
  }
  if (final_state) std::copy_n(cb.s.data(), d * d, final_state);
}

}  // namespace

void recurrence_chunk_forward(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg) {
  const int64_t n = p.seq_q, d = p.head_dim;
  tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) {
    const HeadInputs hi = head_inputs(p, in, cfg.kind, bh / p.heads, bh % p.heads);
    head_chunks(hi, cfg.kind, cfg.chunk, in.out + bh * n * d,
                in.final_state ? in.final_state + bh * d * d : nullptr);
  });
}

}  // namespace attn
