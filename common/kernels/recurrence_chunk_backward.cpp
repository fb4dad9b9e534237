// The chunkwise form's backward: reverse mode through the chunk form of recurrence_chunk-inl.hpp, chunk by
// chunk in reverse, on the same register-blocked products. Below for the recurrences without the delta rule
// (retention, simple_gla, gla); the delta rule's, through its UT solve, at chunk_backward_delta.
//
// Per (batch, head): a first pass runs the chunks forward keeping the state at every chunk's start (n / C
// states of d_k x d_v). Then, for each chunk in reverse with its start state S_0 and dS = dL/dS_C (zero after
// the last chunk: no gradient flows into the final state), with Gamma the cumulative log decays from the
// chunk's start, A = Q Kᵀ ⊙ D the forward's masked scores and P = scale (dO Vᵀ) masked to s <= t:
//
//   scalar gates (D_ts = e^(Gamma_t - Gamma_s), Q^ = diag(e^Gamma) Q, K^ = diag(e^(Gamma_C - Gamma)) K):
//     dQ = scale diag(e^Gamma) dO S_0ᵀ + (P ⊙ D) K          dK = (P ⊙ D)ᵀ Q + diag(e^(Gamma_C - Gamma)) V dSᵀ
//     dV = scale Aᵀ dO + K^ dS                             dS_0 = e^Gamma_C dS + scale Q^ᵀ dO
//   vector gates (gla): the same with every decay per key channel, so P ⊙ D is no matrix: the sums
//     dQ_t = sum_s P_ts k_s ⊙ e^(Gamma_t - Gamma_s) and dK_s = sum_t P_ts q_t ⊙ e^(Gamma_t - Gamma_s) run by
//     blocks of kGlaBlock tokens with the forward's three-factor split (gla_intra_grads).
//   The gates: with q~_t = q_t e^Gamma_t, k~_s = k_s e^-Gamma_s and S_C = e^Gamma_C (S_0 + sum k~_sᵀ v_s),
//     dL/dGamma_t = q_t ⊙ dq_t - k_t ⊙ dk_t (+ the row sums of dS ⊙ S_C at the chunk's last token), and
//     dg_t = sum_{t' >= t in the chunk} dL/dGamma_t' (summed over channels for a scalar gate). The reverse
//     sum runs over at most C terms: the cancellation between them is the chunk's, not the sequence's (a
//     reverse cumulative sum over the whole sequence, as some GPU kernels take, cancels n terms into a value
//     of the size of one).
// Every exponential is of a difference <= 0, relative to the chunk's start or end or to a block's end, as in
// the forward: nothing overflows for any g >= -30 a step, and a decay below fp32's range is 0.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/kernels/recurrence_chunk_backward.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // must come first: it re-includes this file once per target
// clang-format on
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/kernels/recurrence.hpp"
#include "common/kernels/recurrence_chunk-inl.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::chunk::HWY_NAMESPACE {

// The backward's buffers for one chunk, beside the forward's ChunkBuffers (d_k: Q, K, the gates; d_v: V).
struct BackBuffers {
  std::vector<float> vt;      // Vᵀ (d_v x C; the delta rule: Uᵀ)
  std::vector<float> p;       // P (C x C), then P ⊙ D for scalar gates
  std::vector<float> tr;      // a d_v x d_k transpose (S_0ᵀ, then dSᵀ)
  std::vector<float> qe;      // Q ⊙ e^Gamma (C x d_k)
  std::vector<float> kf;      // gla: e^(Gamma_e - Gamma_s), s's block ending at e (C x d_k); delta: dU, dR
                              // (C x d_v)
  std::vector<float> bm;      // gla: the decayed keys of the earlier blocks (C x d_k); delta: dKn (C x d_k)
  std::vector<float> x, y;    // gla: C x d_k scratch; delta: dX_K (C x d_v) in x
  std::vector<double> dl;     // dL/dGamma (C or C x d_k)
  std::vector<float> kk, gm;  // the delta rule: (Kn Knᵀ) ⊙ D and dL/dM, then E (C x C, strictly lower)
  std::vector<float> ex, yv;  // the delta rule: C each (delta_gamma_grads)
  BackBuffers(int64_t c, int64_t dk, int64_t dv, bool delta)
      : vt(c * dv),
        p(c * c),
        tr(dk * dv),
        qe(c * dk),
        kf(c * std::max(dk, dv)),
        bm(c * dk),
        x(c * std::max(dk, dv)),
        y(c * dk),
        dl(c * dk),
        kk(delta ? c * c : 0),
        gm(delta ? c * c : 0),
        ex(c),
        yv(c) {}
};

// C (m x n, ldc) = alpha op(A) B (+ C when accumulating): op(A) = A (m x k, row-major, lda) or, trans, the
// transpose of A stored k x m (lda); B row-major k x n (ldb). The chunk kernel's gemm, in one line.
void mm(const float* a, bool trans, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
        int64_t m, int64_t n, int64_t k, float alpha = 1.0f, bool accumulate = false) {
  gemm({.a = a,
        .ars = trans ? 1 : lda,
        .acs = trans ? lda : 1,
        .b = b,
        .ldb = ldb,
        .c = c,
        .ldc = ldc,
        .m = m,
        .n = n,
        .k = k,
        .alpha = alpha,
        .accumulate = accumulate});
}

void transpose(const float* a, int64_t rows, int64_t cols, float* at) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) at[j * rows + i] = a[i * cols + j];
}

// dqt += p kj ⊙ e^(gt - gs) and dks += p qt ⊙ e^(gt - gs) (gt <= gs elementwise; the differences in fp64,
// rounded once, into xd).
void diag_pair(const double* gt, const double* gs, const float* qt, const float* ks, float p, float* dqt,
               float* dks, int64_t d, float* xd) {
  for (int64_t c = 0; c < d; ++c) xd[c] = static_cast<float>(gt[c] - gs[c]);
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto vp = hn::Set(df, p), log2e = hn::Set(df, 1.4426950408889634f);
  int64_t c = 0;
  for (; c + N <= d; c += N) {
    const auto e = hn::Mul(vp, Exp2(df, hn::Mul(hn::LoadU(df, xd + c), log2e)));
    hn::StoreU(hn::MulAdd(e, hn::LoadU(df, ks + c), hn::LoadU(df, dqt + c)), df, dqt + c);
    hn::StoreU(hn::MulAdd(e, hn::LoadU(df, qt + c), hn::LoadU(df, dks + c)), df, dks + c);
  }
  for (; c < d; ++c) {
    const float e = p * std::exp(xd[c]);
    dqt[c] += e * ks[c], dks[c] += e * qt[c];
  }
}

// y += x ⊙ e^(hi - lo) (hi - lo <= 0; the product through scratch, n floats).
void add_decayed(const double* hi, const double* lo, const float* x, float* y, int64_t n, float* xd,
                 float* scratch) {
  mul_exp_diff(hi, lo, x, scratch, n, xd);
  for (int64_t c = 0; c < n; ++c) y[c] += scratch[c];
}

// gla's intra-chunk sums dQ_t += sum_{s <= t} P_ts k_s ⊙ e^(Gamma_t - Gamma_s) and dK_s += sum_{t >= s}
// P_ts q_t ⊙ e^(Gamma_t - Gamma_s) (rows of d = d_k), by blocks of kGlaBlock tokens: the diagonal blocks
// elementwise (diag_pair), the others through the forward's split e^(Gamma_t - Gamma_s) = e^(Gamma_t -
// Gamma_r) e^(Gamma_r - Gamma_e) e^(Gamma_e - Gamma_s) (r the token before t's block, e the last of s's
// block; every factor <= 1).
void gla_intra_grads(int64_t L, int64_t d, const ChunkBuffers& cb, BackBuffers& bb, float* dq, float* dk,
                     float* xd) {
  const float *k = cb.kp, *q = cb.qp, *P = bb.p.data();
  const double* gam = cb.gam.data();
  auto block_end = [L](int64_t s) { return std::min(L, (s / kGlaBlock + 1) * kGlaBlock) - 1; };
  for (int64_t s = 0; s < L; ++s) {  // kf_s = e^(Gamma_e - Gamma_s); bm_s = k_s ⊙ kf_s for now
    float* f = bb.kf.data() + s * d;
    std::fill(f, f + d, 1.0f);
    mul_exp_diff(gam + block_end(s) * d, gam + s * d, f, f, d, xd);
  }
  for (int64_t i0 = 0; i0 < L; i0 += kGlaBlock) {
    const int64_t i1 = std::min(L, i0 + kGlaBlock), m = i1 - i0;
    for (int64_t t = i0; t < i1; ++t)
      for (int64_t s = i0; s <= t; ++s)
        diag_pair(gam + t * d, gam + s * d, q + t * d, k + s * d, P[t * L + s], dq + t * d, dk + s * d, d,
                  xd);
    if (i0 == 0) continue;
    const double* ref = gam + (i0 - 1) * d;  // Gamma_r
    float* qq = bb.y.data();                 // q_t ⊙ e^(Gamma_t - Gamma_r), t in the block
    for (int64_t t = i0; t < i1; ++t) mul_exp_diff(gam + t * d, ref, q + t * d, qq + (t - i0) * d, d, xd);
    float* mid = bb.qe.data();  // e^(Gamma_r - Gamma_e) of each earlier block (a row of scratch)
    float* B = bb.bm.data();    // rows s < i0: k_s ⊙ kf_s ⊙ mid of s's block
    for (int64_t j0 = 0; j0 < i0; j0 += kGlaBlock) {
      const int64_t ej = j0 + kGlaBlock - 1;
      std::fill(mid, mid + d, 1.0f);
      if (ej != i0 - 1) mul_exp_diff(ref, gam + ej * d, mid, mid, d, xd);
      for (int64_t s = j0; s < j0 + kGlaBlock; ++s)
        for (int64_t c = 0; c < d; ++c) B[s * d + c] = k[s * d + c] * bb.kf[s * d + c] * mid[c];
      // dK of block j from block i: (P_ij ᵀ (Q ⊙ first factor)) ⊙ mid ⊙ kf.
      float* Y = bb.x.data();
      mm(P + i0 * L + j0, true, L, qq, d, Y, d, kGlaBlock, d, m);
      for (int64_t s = j0; s < j0 + kGlaBlock; ++s)
        for (int64_t c = 0; c < d; ++c) dk[s * d + c] += Y[(s - j0) * d + c] * mid[c] * bb.kf[s * d + c];
    }
    // dQ of block i: (P_i,<i B) ⊙ first factor.
    float* X = bb.x.data();
    mm(P + i0 * L, false, L, B, d, X, d, m, d, i0);
    for (int64_t t = i0; t < i1; ++t) add_decayed(gam + t * d, ref, X + (t - i0) * d, dq + t * d, d, xd, mid);
  }
}

// P = scale dO Vᵀ on and below the diagonal, 0 above; times D for scalar gates. d: d_v (dO's and V's rows).
void masked_p(const RecurrenceKind& kind, const float* dout, const float* v, int64_t L, int64_t d,
              float scale, const ChunkBuffers& cb, BackBuffers& bb) {
  transpose(v, L, d, bb.vt.data());
  gemm({.a = dout,
        .ars = d,
        .acs = 1,
        .b = bb.vt.data(),
        .ldb = L,
        .c = bb.p.data(),
        .ldc = L,
        .m = L,
        .n = L,
        .k = d,
        .alpha = scale,
        .lower_c = true});
  for (int64_t t = 0; t < L; ++t) {
    float* row = bb.p.data() + t * L;
    if (kind.gate != Gate::vector)
      for (int64_t s = 0; s <= t; ++s) row[s] *= cb.dm[t * L + s];
    std::fill(row + t + 1, row + L, 0.0f);
  }
}

// y_t ⊙= e^Gamma_t (from the chunk's start) or e^(Gamma_C - Gamma_t) (to its end), per row of d = d_k (the
// decays are per key channel).
void decay_rows(const RecurrenceKind& kind, int64_t L, int64_t d, bool to_end, float* y, ChunkBuffers& cb) {
  const double* last = cb.gam.data() + (L - 1) * d;
  for (int64_t t = 0; t < L; ++t) {
    if (kind.gate == Gate::vector) {
      const double* gt = cb.gam.data() + t * d;
      mul_exp_diff(to_end ? last : gt, to_end ? gt : nullptr, y + t * d, y + t * d, d, cb.xd.data());
    } else {
      const float f = to_end ? cb.el[t] : cb.ed[t];
      for (int64_t c = 0; c < d; ++c) y[t * d + c] *= f;
    }
  }
}

// dg of the chunk's tokens from dL/dGamma (see the file comment); s_end: the state at the chunk's end (null
// for the last chunk, where dS = 0).
void gate_grads(const RecurrenceKind& kind, int64_t L, int64_t dkw, int64_t dvw, const float* dq,
                const float* dk, const float* ds, const float* s_end, const ChunkBuffers& cb, BackBuffers& bb,
                float* dg) {
  const int64_t w = kind.gate == Gate::vector ? dkw : 1;
  double* dl = bb.dl.data();
  std::fill(dl, dl + L * w, 0.0);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t c = 0; c < dkw; ++c)
      dl[t * w + (w == 1 ? 0 : c)] +=
          double(cb.qp[t * dkw + c]) * dq[t * dkw + c] - double(cb.kp[t * dkw + c]) * dk[t * dkw + c];
  if (s_end)  // row c of S decays with key channel c
    for (int64_t c = 0; c < dkw; ++c)
      for (int64_t j = 0; j < dvw; ++j)
        dl[(L - 1) * w + (w == 1 ? 0 : c)] += double(ds[c * dvw + j]) * s_end[c * dvw + j];
  for (int64_t c = 0; c < w; ++c) {
    double acc = 0;
    for (int64_t t = L - 1; t >= 0; --t) acc += dl[t * w + c], dg[t * w + c] = static_cast<float>(acc);
  }
}

// dS (d_k x d_v) <- diag(e^Gamma_C) dS + scale (Q ⊙ e^Gamma)ᵀ dO: dL/dS_0 through the decay and the outputs.
void state_grad(const RecurrenceKind& kind, int64_t L, int64_t dk, int64_t dv, const float* dout, float scale,
                float* ds, ChunkBuffers& cb, BackBuffers& bb) {
  std::copy_n(cb.qp, L * dk, bb.qe.data());
  decay_rows(kind, L, dk, false, bb.qe.data(), cb);
  float* xd = cb.xd.data();  // the state's decay over the chunk, per key channel (row of S)
  if (kind.gate == Gate::vector) {
    const double* last = cb.gam.data() + (L - 1) * dk;
    for (int64_t c = 0; c < dk; ++c) xd[c] = static_cast<float>(last[c]);
    exp_row(xd, xd, dk);
  } else {
    std::fill(xd, xd + dk, cb.ed[L - 1]);
  }
  for (int64_t c = 0; c < dk; ++c)
    for (int64_t j = 0; j < dv; ++j) ds[c * dv + j] *= xd[c];
  mm(bb.qe.data(), true, dk, dout, dv, ds, dv, dk, dv, L, scale, true);
}

// dQ = scale e^Gamma ⊙ dO S_0ᵀ + the intra-chunk sums of P ⊙ D with the keys, and dK = e^(Gamma_C - Gamma)
// ⊙ U dSᵀ + those with the queries (U: the value rows the tokens add, V or the delta rule's U, L x d_v; dO
// L x d_v; dQ, dK L x d_k; P from masked_p; gla's sums by gla_intra_grads). Leaves dSᵀ (d_v x d_k) in bb.tr.
void query_key_grads(const RecurrenceKind& kind, int64_t L, int64_t dkw, int64_t dvw, const float* dout,
                     const float* v, const float* ds, float scale, ChunkBuffers& cb, BackBuffers& bb,
                     float* dq, float* dk) {
  transpose(cb.s.data(), dkw, dvw, bb.tr.data());
  mm(dout, false, dvw, bb.tr.data(), dkw, dq, dkw, L, dkw, dvw, scale);
  decay_rows(kind, L, dkw, false, dq, cb);
  transpose(ds, dkw, dvw, bb.tr.data());
  mm(v, false, dvw, bb.tr.data(), dkw, dk, dkw, L, dkw, dvw);
  decay_rows(kind, L, dkw, true, dk, cb);
  if (kind.gate == Gate::vector) {
    gla_intra_grads(L, dkw, cb, bb, dq, dk, cb.xd.data());
  } else {
    gemm({.a = bb.p.data(),
          .ars = L,
          .acs = 1,
          .b = cb.kp,
          .ldb = dkw,
          .c = dq,
          .ldc = dkw,
          .m = L,
          .n = dkw,
          .k = L,
          .accumulate = true,
          .lower_a = true});
    mm(bb.p.data(), true, L, cb.qp, dkw, dk, dkw, L, dkw, L, 1.0f, true);
  }
}

// One chunk's gradients (rows t0 .. t0 + L - 1 of dq, dk, dv, dg) from its start state cb.s; dS = dL/dS_C on
// entry, dL/dS_0 on return.
void chunk_backward(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t0, int64_t L,
                    const float* dout, const float* s_end, float* ds, ChunkBuffers& cb, BackBuffers& bb,
                    const RecurrenceGrads<float>& g) {
  const int64_t dkw = hi.dk, dvw = hi.dv;
  const float scale = static_cast<float>(hi.scale);
  const float* v = hi.v + t0 * dvw;
  float *dq = g.dq + t0 * dkw, *dk = g.dk + t0 * dkw, *dv = g.dv + t0 * dvw;
  load_rows(hi, kind, t0, L, cb);
  load_gammas(hi, kind, t0, L, cb);
  if (kind.gate == Gate::vector)
    vector_scores(L, dkw, cb);
  else
    scalar_scores(kind, L, dkw, cb);
  masked_p(kind, dout, v, L, dvw, scale, cb, bb);
  query_key_grads(kind, L, dkw, dvw, dout, v, ds, scale, cb, bb, dq, dk);
  // dV = K^ dS + scale Aᵀ dO.
  decayed_keys(kind, L, dkw, cb);
  mm(cb.kd.data(), false, dkw, ds, dvw, dv, dvw, L, dvw, dkw);
  mm(cb.a.data(), true, L, dout, dvw, dv, dvw, L, dvw, L, scale, true);
  if (g.dg && kind.gate != Gate::none)
    gate_grads(kind, L, dkw, dvw, dq, dk, ds, s_end, cb, bb,
               g.dg + t0 * (kind.gate == Gate::vector ? dkw : 1));
  state_grad(kind, L, dkw, dvw, dout, scale, ds, cb, bb);
}

// The delta rule's chunk up to U (the forward's steps): the scores, [Kn; Q] S_0 into cb.x, and the solve
// (cb.u = U, the first L rows of cb.bp = M strictly below the diagonal). kk (when not null): (Kn Knᵀ) ⊙ D
// strictly below the diagonal, kept before the solve scales it into M.
void delta_forward(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t0, int64_t L, ChunkBuffers& cb,
                   float* kk) {
  const int64_t dk = hi.dk, dv = hi.dv;
  load_rows(hi, kind, t0, L, cb);
  load_gammas(hi, kind, t0, L, cb);
  scalar_scores(kind, L, dk, cb);
  if (kk)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t s = 0; s < L; ++s) kk[t * L + s] = s < t ? cb.bp[t * L + s] * cb.dm[t * L + s] : 0.0f;
  mm(cb.qk.data(), false, dk, cb.s.data(), dv, cb.x.data(), dv, 2 * L, dv, dk);
  delta_values(hi, t0, L, cb);
}

// dR = (I + M)^-ᵀ dU in place (M strictly lower, L x L; dU L x d, d = d_v): dR_t = dU_t - sum_{s > t} M_st
// dR_s, t from the last row up.
void back_substitute(const float* m, int64_t L, float* x, int64_t d) {
  for (int64_t t = L - 2; t >= 0; --t) {
    float* xt = x + t * d;
    for (int64_t s = t + 1; s < L; ++s) {
      const float c = m[s * L + t];
      const float* xs = x + s * d;
      for (int64_t j = 0; j < d; ++j) xt[j] -= c * xs[j];
    }
  }
}

// dL/dGamma of the delta rule's chunk (scalar gates), into bb.dl: Gamma_t enters through e^Gamma_t (the
// output's Q S_0 term and R's K S_0 term: ed_t times their gradients, ex[t]), through D in A and M (each pair
// (t, s) adds W_ts = dX_ts X_ts to Gamma_t and takes it from Gamma_s), and through the state's decays
// (-y_t at t, with y_t = el_t (Kn_t dS) . U_t, and sum_t y_t + e^Gamma_C <dS, S_0> at the last token).
void delta_gamma_grads(int64_t L, const float* ex, const float* y, double state_term, const ChunkBuffers& cb,
                       BackBuffers& bb) {
  double* dl = bb.dl.data();
  const float* qk = cb.bp.data() + L * L;  // Q Knᵀ (lower)
  const float* M = cb.bp.data();
  double ysum = 0;
  for (int64_t t = 0; t < L; ++t) dl[t] = double(ex[t]) - y[t], ysum += y[t];
  for (int64_t t = 0; t < L; ++t)
    for (int64_t s = 0; s <= t; ++s) {
      double w = double(bb.p[t * L + s]) * qk[t * L + s];       // dA ⊙ A (P holds dA ⊙ D)
      if (s < t) w += double(bb.gm[t * L + s]) * M[t * L + s];  // dM ⊙ M
      dl[t] += w, dl[s] -= w;
    }
  dl[L - 1] += ysum + state_term;
}

// The delta rule's chunk backward (scalar gates or none; see the file comment for the non-delta one). With
// Kn the normalised keys, X_K = Kn S_0, X_Q = Q S_0, R = diag(beta) (V - diag(e^Gamma) X_K), M_ts = beta_t
// D_ts (kn_t . kn_s) (s < t), U = (I + M)^-1 R, A = (Q Knᵀ) ⊙ D, O = scale (diag(e^Gamma) X_Q + A U),
// S_C = e^Gamma_C S_0 + (diag(el) Kn)ᵀ U:
//   dU = diag(el) Kn dS + scale Aᵀ dO;  dR = (I + M)^-ᵀ dU;  dM = -dR Uᵀ (s < t);  dV = diag(beta) dR
//   dQ = scale diag(e^Gamma) dO S_0ᵀ + (dA ⊙ D) Kn,  dA = scale dO Uᵀ
//   dKn = (dA ⊙ D)ᵀ Q + diag(el) U dSᵀ + E Kn + Eᵀ Kn + dX_K S_0ᵀ,  E = dM ⊙ D diag(beta),
//         dX_K = -diag(beta e^Gamma) dR;  then through the normalisation: (dKn - kn (kn . dKn)) / ||k||
//   dbeta_t = dR_t . (v_t - e^Gamma_t X_K,t) + sum_s dM_ts (kn_t . kn_s) D_ts
//   dS_0 = e^Gamma_C dS + scale (diag(e^Gamma) Q)ᵀ dO + Knᵀ dX_K
void chunk_backward_delta(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t0, int64_t L,
                          const float* dout, float* ds, ChunkBuffers& cb, BackBuffers& bb,
                          const RecurrenceGrads<float>& g) {
  const int64_t dkw = hi.dk, dvw = hi.dv;
  const float scale = static_cast<float>(hi.scale);
  // X_K = Kn S_0 and X_Q = Q S_0: L x d_v each.
  const float *v = hi.v + t0 * dvw, *beta = hi.beta + t0, *xk = cb.x.data(), *xq = cb.x.data() + L * dvw;
  float *dq = g.dq + t0 * dkw, *dk = g.dk + t0 * dkw, *dv = g.dv + t0 * dvw;
  // dU, dR, dX_K: L x d_v; dKn: L x d_k.
  float *du = bb.kf.data(), *dkn = bb.bm.data(), *dx = bb.x.data(), *ex = bb.ex.data(), *y = bb.yv.data();
  delta_forward(hi, kind, t0, L, cb, bb.kk.data());
  const float* U = cb.u.data();
  masked_p(kind, dout, U, L, dvw, scale, cb, bb);                           // P = dA ⊙ D; bb.vt = Uᵀ
  query_key_grads(kind, L, dkw, dvw, dout, U, ds, scale, cb, bb, dq, dkn);  // dKn: its U dSᵀ and Pᵀ Q terms
  // dU, with y_t = (el_t Kn_t dS) . U_t taken before Aᵀ dO joins it.
  decayed_keys(kind, L, dkw, cb);
  mm(cb.kd.data(), false, dkw, ds, dvw, du, dvw, L, dvw, dkw);
  for (int64_t t = 0; t < L; ++t) y[t] = dot(du + t * dvw, U + t * dvw, dvw);
  mm(cb.a.data(), true, L, dout, dvw, du, dvw, L, dvw, L, scale, true);
  back_substitute(cb.bp.data(), L, du, dvw);  // du = dR
  // dV, dbeta (R's part), e^Gamma's gradients, dX_K.
  for (int64_t t = 0; t < L; ++t) {
    const float* r = du + t * dvw;
    const float e = cb.ed[t], b = beta[t];
    double db = 0;
    for (int64_t j = 0; j < dvw; ++j) {
      dv[t * dvw + j] = b * r[j];
      db += double(r[j]) * (v[t * dvw + j] - e * xk[t * dvw + j]);
      dx[t * dvw + j] = -b * e * r[j];
    }
    if (g.dbeta) g.dbeta[t0 + t] = static_cast<float>(db);
    ex[t] = e * (scale * dot(dout + t * dvw, xq + t * dvw, dvw) - b * dot(r, xk + t * dvw, dvw));
  }
  // dM = -dR Uᵀ below the diagonal, and dbeta's M part.
  mm(du, false, dvw, bb.vt.data(), L, bb.gm.data(), L, L, L, dvw, -1.0f);
  for (int64_t t = 0; t < L; ++t) {
    double db = 0;
    for (int64_t s = 0; s < L; ++s) {
      float& m = bb.gm[t * L + s];
      if (s >= t) m = 0.0f;
      db += double(m) * bb.kk[t * L + s];
    }
    if (g.dbeta) g.dbeta[t0 + t] += static_cast<float>(db);
  }
  if (g.dg && kind.gate == Gate::scalar) {
    double state_term = 0;
    for (int64_t e = 0; e < dkw * dvw; ++e) state_term += double(ds[e]) * cb.s[e];
    delta_gamma_grads(L, ex, y, state_term * cb.ed[L - 1], cb, bb);
    double acc = 0;
    for (int64_t t = L - 1; t >= 0; --t) acc += bb.dl[t], g.dg[t0 + t] = static_cast<float>(acc);
  }
  // dKn += E Kn + Eᵀ Kn + dX_K S_0ᵀ (E overwrites dM: beta_t D_ts dM_ts).
  transpose(cb.s.data(), dkw, dvw, bb.tr.data());
  mm(dx, false, dvw, bb.tr.data(), dkw, dkn, dkw, L, dkw, dvw, 1.0f, true);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t s = 0; s < t; ++s) bb.gm[t * L + s] *= beta[t] * cb.dm[t * L + s];
  mm(bb.gm.data(), false, L, cb.kp, dkw, dkn, dkw, L, dkw, L, 1.0f, true);
  mm(bb.gm.data(), true, L, cb.kp, dkw, dkn, dkw, L, dkw, L, 1.0f, true);
  // dS_0, then dK through the normalisation.
  state_grad(kind, L, dkw, dvw, dout, scale, ds, cb, bb);
  mm(cb.kp, true, dkw, dx, dvw, ds, dvw, dkw, dvw, L, 1.0f, true);
  for (int64_t t = 0; t < L; ++t) {
    const float* kn = cb.kp + t * dkw;
    const float* raw = hi.k + (t0 + t) * dkw;
    const float* dn = dkn + t * dkw;
    if (!kind.normalize_keys) {
      std::copy_n(dn, dkw, dk + t * dkw);
      continue;
    }
    const float r = std::sqrt(dot(raw, raw, dkw));
    const float inv = r > 0 ? 1.0f / r : 0.0f, kd = dot(kn, dn, dkw);
    for (int64_t c = 0; c < dkw; ++c) dk[t * dkw + c] = (dn[c] - kn[c] * kd) * inv;
  }
}

// One (batch, head): the states at every chunk's start, then the chunks in reverse. g's pointers are this
// head's rows (dq, dk: n x d_k; dv: n x d_v; dg: n or n x d_k; d_initial_state: d_k x d_v; null when not
// wanted, but dq, dk, dv); d_out: n x d_v.
void ChunkHeadBackward(const HeadInputs& hi, const RecurrenceKind& kind, int64_t C, const float* d_out,
                       const RecurrenceGrads<float>& g) {
  const int64_t n = hi.n, dk = hi.dk, dv = hi.dv, dd = dk * dv, chunks = (n + C - 1) / C;
  const int64_t c = std::min(C, n);
  ChunkBuffers cb(c, dk, dv);
  BackBuffers bb(c, dk, dv, kind.delta);
  std::vector<float> starts(static_cast<std::size_t>(chunks * dd)), ds(dd, 0.0f);
  if (hi.s0) std::copy_n(hi.s0, dd, cb.s.begin());
  for (int64_t m = 0; m < chunks; ++m) {
    const int64_t t0 = m * C, L = std::min(C, n - t0);
    std::copy_n(cb.s.data(), dd, starts.data() + m * dd);
    if (m + 1 == chunks) break;  // the final state is not needed
    if (kind.delta) {
      delta_forward(hi, kind, t0, L, cb, nullptr);
      carry_state(kind, L, dk, dv, cb.u.data(), cb);
      continue;
    }
    load_rows(hi, kind, t0, L, cb);
    load_gammas(hi, kind, t0, L, cb);
    carry_state(kind, L, dk, dv, hi.v + t0 * dv, cb);
  }
  for (int64_t m = chunks - 1; m >= 0; --m) {
    const int64_t t0 = m * C, L = std::min(C, n - t0);
    std::copy_n(starts.data() + m * dd, dd, cb.s.data());
    const float* s_end = m + 1 < chunks ? starts.data() + (m + 1) * dd : nullptr;
    if (kind.delta)
      chunk_backward_delta(hi, kind, t0, L, d_out + t0 * dv, ds.data(), cb, bb, g);
    else
      chunk_backward(hi, kind, t0, L, d_out + t0 * dv, s_end, ds.data(), cb, bb, g);
  }
  if (g.d_initial_state) std::copy_n(ds.data(), dd, g.d_initial_state);
}

}  // namespace attn::chunk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace chunk {
HWY_EXPORT(ChunkHeadBackward);
// Dispatched by its plain name from inside the namespace: HWY_COMPILE_ONLY_STATIC (ATTN_NATIVE=ON) turns
// HWY_DYNAMIC_DISPATCH(F) into N_<TARGET>::F, which must resolve from here.
void head_backward(const HeadInputs& hi, const RecurrenceKind& kind, int64_t chunk, const float* d_out,
                   const RecurrenceGrads<float>& g) {
  HWY_DYNAMIC_DISPATCH(ChunkHeadBackward)(hi, kind, chunk, d_out, g);
}
}  // namespace chunk

void recurrence_chunk_head_backward(const HeadInputs& hi, const RecurrenceKind& kind, int64_t chunk,
                                    const float* d_out, const RecurrenceGrads<float>& g) {
  chunk::head_backward(hi, kind, chunk, d_out, g);
}
}  // namespace attn
#endif  // HWY_ONCE
