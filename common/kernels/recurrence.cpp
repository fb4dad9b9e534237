// The recurrent form, the fp64 definition, the reverse-mode backward and the tolerances of the gated /
// delta-rule recurrences (common/kernels/recurrence.hpp). One template runs the definition token by token in
// fp32 (the recurrent form, the backward) and in fp64 (the reference), so the two differ only in precision.
#include "common/kernels/recurrence.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/interface/util.hpp"
#include "common/support/error.hpp"

namespace attn {

double retention_log_gamma(int64_t head) {
  return std::log1p(-std::ldexp(1.0, static_cast<int>(-5 - std::min<int64_t>(head, 1000))));
}

HeadInputs head_inputs(const Problem& p, const AttentionInputs& in, const RecurrenceKind& kind, int64_t b,
                       int64_t h) {
  HeadInputs hi;
  hi.n = p.seq_q, hi.dk = p.head_dim, hi.dv = p.value_dim();
  // A decode problem (seq_q < seq_kv, Capabilities::decode) runs from its initial state over the last seq_q
  // tokens: K, V, g and beta are [.., seq_kv, ..] (one per key token) and only rows seq_kv - seq_q .. are
  // read.
  const int64_t bh = b * p.heads + h, n = hi.n, dk = hi.dk, dv = hi.dv, nkv = p.seq_kv, skip = nkv - n;
  hi.q = in.q + bh * n * dk;
  hi.k = in.k + (p.kv_block(b, h) * nkv + skip) * dk;
  hi.v = in.v + (p.kv_block(b, h) * nkv + skip) * dv;
  if (kind.gate == Gate::scalar) hi.g = in.g + bh * nkv + skip;
  if (kind.gate == Gate::vector) hi.g = in.g + (bh * nkv + skip) * dk;
  if (kind.delta) hi.beta = in.beta + bh * nkv + skip;
  if (p.initial_state) hi.s0 = in.initial_state + bh * dk * dv;
  hi.log_gamma = kind.retention ? retention_log_gamma(h) : 0.0;
  hi.scale = p.effective_scale();
  return hi;
}

namespace {
// Whether every x[0 .. n) is finite and <= 0 (NaN fails both comparisons). Branch-free, so it vectorises:
// gla's gates are B H n d values, which a loop stopping at the first bad one read at a fraction of the speed
// (3.6 ms at B=1, H=8, n=16384, d=64 on one thread, beside a chunk-form call of 30-60 ms on two).
bool all_gates_valid(const float* x, int64_t n) {
  constexpr float lowest = -std::numeric_limits<float>::max();
  int bad = 0;
  for (int64_t i = 0; i < n; ++i)
    bad |= static_cast<int>(!(x[i] <= 0.0f)) | static_cast<int>(!(x[i] >= lowest));
  return bad == 0;
}
}  // namespace

void check_recurrence_inputs(const Problem& p, const AttentionInputs& in, const RecurrenceKind& kind) {
  // The tokens the call reads: all of them, or a decode's last seq_q of seq_kv (checking the whole context
  // would cost a decode step O(seq_kv)).
  const int64_t rows = p.batch * p.heads, nkv = p.seq_kv, skip = p.seq_kv - p.seq_q;
  if (kind.gate != Gate::none) {
    const int64_t w = kind.gate == Gate::vector ? p.head_dim : 1;
    // Rows checked in parallel when there are many gates (not for a decode step's few); the first bad
    // element in index order is the one reported, whatever the threads.
    std::vector<char> row_ok(static_cast<std::size_t>(rows));
    auto check_row = [&](int64_t r) {
      row_ok[r] = all_gates_valid(in.g + (r * nkv + skip) * w, (nkv - skip) * w);
    };
    if (rows * (nkv - skip) * w >= (int64_t{1} << 16))
      tbb::parallel_for(int64_t{0}, rows, check_row);
    else
      for (int64_t r = 0; r < rows; ++r) check_row(r);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = (r * nkv + skip) * w; !row_ok[r] && e < (r + 1) * nkv * w; ++e)
        if (!std::isfinite(in.g[e]) || in.g[e] > 0)
          throw UsageError(p.variant + ": g[" + std::to_string(e) + "] = " + std::to_string(in.g[e]) +
                           ": every gate must be finite and <= 0 (a decay exp(g) in (0, 1])");
  }
  if (kind.delta)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = r * nkv + skip; e < (r + 1) * nkv; ++e)
        if (!std::isfinite(in.beta[e]) || !(in.beta[e] > 0 && in.beta[e] <= 1))
          throw UsageError(p.variant + ": beta[" + std::to_string(e) + "] = " + std::to_string(in.beta[e]) +
                           ": every beta must be in (0, 1]");
  if (p.initial_state) {
    const int64_t n = p.state_elements();
    for (int64_t e = 0; e < n; ++e)
      if (!std::isfinite(in.initial_state[e]))
        throw UsageError(p.variant + ": initial_state[" + std::to_string(e) + "] is not finite");
  }
}

namespace {

// Running norms the tolerances are derived from (filled only when asked for: they cost O(d_k d_v) a token).
struct HeadStats {
  // Forward: e_fwd bounds ||S_t(fp32) - S_t|| step by step (see recurrence_abs_tolerance), max_e_fwd its
  // largest value, max_out the largest bound on an output row's error.
  double e_fwd = 0, max_e_fwd = 0, max_out = 0;
  double max_s = 0, max_q = 0, max_k = 0, max_v = 0, max_u = 0, min_r = INFINITY;
  // Backward: the same for dS = dL/dS_t, run in reverse.
  double e_bwd = 0, max_e_bwd = 0, max_ds = 0, max_do = 0;
};

// One token's key (L2-normalised when asked: k / ||k||, a zero key stays zero) into kb; returns ||k||.
template <class T>
T load_key(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t, T* kb) {
  const float* k = hi.k + t * hi.dk;
  T s = 0;
  for (int64_t c = 0; c < hi.dk; ++c) s += T(k[c]) * T(k[c]);
  const T r = std::sqrt(s);
  const T inv = !kind.normalize_keys ? T(1) : r > 0 ? T(1) / r : T(0);
  for (int64_t c = 0; c < hi.dk; ++c) kb[c] = T(k[c]) * inv;
  return r;
}

// The decay a_t (d_k values, one per row of S): exp(g), per key channel or broadcast; retention's gamma_h;
// 1 without a gate.
template <class T>
void load_decay(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t, T* a) {
  const int64_t d = hi.dk;
  if (kind.gate == Gate::vector) {
    for (int64_t c = 0; c < d; ++c) a[c] = std::exp(T(hi.g[t * d + c]));
    return;
  }
  const T x = kind.gate == Gate::scalar ? std::exp(T(hi.g[t]))
              : kind.retention          ? T(std::exp(hi.log_gamma))
                                        : T(1);
  std::fill_n(a, d, x);
}

// One step S_{t-1} -> S_t in place (S dk x dv; a, k: dk; v, u, p: dv); writes u_t (the value row added,
// beta (v - k S') for the delta rule) and p_t = k S'_t (delta only).
template <class T>
void step(int64_t dk, int64_t dv, const T* a, const T* k, const float* v, T beta, bool delta, T* S, T* u,
          T* p) {
  if (delta) {
    std::fill_n(p, dv, T(0));
    for (int64_t c = 0; c < dk; ++c) {
      const T kc = k[c] * a[c];
      const T* row = S + c * dv;
      for (int64_t j = 0; j < dv; ++j) p[j] += kc * row[j];
    }
    for (int64_t j = 0; j < dv; ++j) u[j] = beta * (T(v[j]) - p[j]);
  } else {
    for (int64_t j = 0; j < dv; ++j) u[j] = T(v[j]);
  }
  for (int64_t c = 0; c < dk; ++c) {
    T* row = S + c * dv;
    const T ac = a[c], kc = k[c];
    for (int64_t j = 0; j < dv; ++j) row[j] = ac * row[j] + kc * u[j];
  }
}

double norm2(const double* x, int64_t n) {
  double s = 0;
  for (int64_t e = 0; e < n; ++e) s += x[e] * x[e];
  return std::sqrt(s);
}
template <class T>
double norm_f(const T* x, int64_t n) {
  double s = 0;
  for (int64_t e = 0; e < n; ++e) s += double(x[e]) * double(x[e]);
  return std::sqrt(s);
}

// The transitions' norm bound at one step (a, kb: d_k values): ||diag(a)|| <= max a, ||I - beta k^T k|| <=
// max(1, |1 - beta ||k||^2|) (both d_k x d_k, acting on S's rows).
double transition_norm(const RecurrenceKind& kind, const double* a, const double* kb, double beta,
                       int64_t d) {
  const double nk = norm2(kb, d);
  const double rho = kind.delta ? std::max(1.0, std::fabs(1 - beta * nk * nk)) : 1.0;
  return rho * *std::max_element(a, a + d);
}

// The forward running norms of one step (fp64 only; see recurrence_abs_tolerance). s_prev: ||S_{t-1}||, s_t:
// ||S_t||.
void observe_forward(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t, double s_prev, double s_t,
                     const double* a, const double* kb, double r, const double* u, double k_factor,
                     HeadStats& st) {
  const int64_t dk = hi.dk, dv = hi.dv;
  const double nk = norm2(kb, dk), nv = norm_f(hi.v + t * dv, dv), nq = norm_f(hi.q + t * dk, dk);
  const double k2 = 1 + nk * nk;
  const double local = k_factor * k2 * k2 * (s_prev + nv);
  st.e_fwd = transition_norm(kind, a, kb, hi.beta ? hi.beta[t] : 1.0, dk) * st.e_fwd + local;
  st.max_e_fwd = std::max(st.max_e_fwd, st.e_fwd);
  // o_t = scale q_t S_t: a d_k-term dot product per output column.
  const double u_round = std::ldexp(1.0, -24) * static_cast<double>(dk + 2);
  st.max_out = std::max(st.max_out, hi.scale * nq * (st.e_fwd + u_round * s_t));
  st.max_s = std::max(st.max_s, s_t);
  st.max_q = std::max(st.max_q, nq), st.max_k = std::max(st.max_k, nk), st.max_v = std::max(st.max_v, nv);
  st.max_u = std::max(st.max_u, norm2(u, dv));
  if (kind.normalize_keys) st.min_r = std::min(st.min_r, r);
}

// The definition token by token on one head, state in T, starting from S (holding S_0). Writes out rows
// (OutT, when not null), keeps S every `every` tokens in ckpt (when not null: ckpt[m] = S before token
// m * every) and leaves S_n in S.
template <class T, class OutT>
void head_forward(const HeadInputs& hi, const RecurrenceKind& kind, T* S, OutT* out, T* ckpt, int64_t every,
                  HeadStats* st = nullptr, double k_factor = 0) {
  const int64_t n = hi.n, dk = hi.dk, dv = hi.dv, dd = dk * dv;
  std::vector<T> a(dk), kb(dk), u(dv), p(dv);
  const T scale = T(hi.scale);
  for (int64_t t = 0; t < n; ++t) {
    if (ckpt && t % every == 0) std::copy_n(S, dd, ckpt + (t / every) * dd);
    const T r = load_key(hi, kind, t, kb.data());
    load_decay(hi, kind, t, a.data());
    double s_norm = 0;
    if constexpr (std::is_same_v<T, double>)
      if (st) s_norm = norm_f(S, dd);
    step(dk, dv, a.data(), kb.data(), hi.v + t * dv, T(hi.beta ? hi.beta[t] : 1.0f), kind.delta, S, u.data(),
         p.data());
    if constexpr (std::is_same_v<T, double>)
      if (st)
        observe_forward(hi, kind, t, s_norm, norm_f(S, dd), a.data(), kb.data(), r, u.data(), k_factor, *st);
    if (!out) continue;
    const float* q = hi.q + t * dk;
    std::fill_n(p.data(), dv, T(0));
    for (int64_t c = 0; c < dk; ++c) {
      const T qc = T(q[c]) * scale;
      const T* row = S + c * dv;
      for (int64_t j = 0; j < dv; ++j) p[j] += qc * row[j];
    }
    for (int64_t j = 0; j < dv; ++j) out[t * dv + j] = static_cast<OutT>(p[j]);
  }
}

// One head's gradients, written into its own rows (dq, dk: n x d_k; dv: n x d_v; dg: n or n x d_k; dbeta: n;
// ds0: d_k x d_v; the last three may be null).
template <class T>
struct HeadGrads {
  T *dq, *dk, *dv, *dg, *dbeta, *ds0;
};

// Per-step scratch of the reverse pass: d_k values per key channel (a, kb, dkk, da), d_v per value column.
template <class T>
struct BackScratch {
  std::vector<T> a, kb, u, p, du, dkk, dp, da;
  BackScratch(int64_t dk, int64_t dv) : a(dk), kb(dk), u(dv), p(dv), du(dv), dkk(dk), dp(dv), da(dk) {}
};

// Reverse mode through token t: S_prev = S_{t-1}, S_t its successor; dS holds dL/dS_t from the later tokens
// on entry and dL/dS_{t-1} on return.
template <class T>
void step_backward(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t, const T* S_prev, const T* S_t,
                   const float* d_out, T* dS, BackScratch<T>& w, const HeadGrads<T>& g) {
  const int64_t dk = hi.dk, dv = hi.dv;
  const T r = load_key(hi, kind, t, w.kb.data());
  load_decay(hi, kind, t, w.a.data());
  const T beta = T(hi.beta ? hi.beta[t] : 1.0f), scale = T(hi.scale);
  const float* v = hi.v + t * dv;
  const float* q = hi.q + t * dk;
  const float* dout = d_out + t * dv;
  // Recompute p = k S'_t and u_t.
  std::fill_n(w.p.data(), dv, T(0));
  if (kind.delta)
    for (int64_t c = 0; c < dk; ++c)
      for (int64_t j = 0; j < dv; ++j) w.p[j] += w.kb[c] * w.a[c] * S_prev[c * dv + j];
  for (int64_t j = 0; j < dv; ++j) w.u[j] = kind.delta ? beta * (T(v[j]) - w.p[j]) : T(v[j]);
  // o_t = scale q S_t: dq, and dS_t gains scale q^T dO. Then S_t = S' + k^T u: du = k dS, dk = dS u^T.
  std::fill_n(w.du.data(), dv, T(0));
  for (int64_t c = 0; c < dk; ++c) {
    T* ds = dS + c * dv;
    const T* s = S_t + c * dv;
    const T qc = scale * T(q[c]);
    T dqc = 0, dkc = 0;
    for (int64_t j = 0; j < dv; ++j) {
      dqc += s[j] * T(dout[j]);
      ds[j] += qc * T(dout[j]);
      w.du[j] += w.kb[c] * ds[j];
      dkc += ds[j] * w.u[j];
    }
    g.dq[t * dk + c] = static_cast<T>(scale * dqc);
    w.dkk[c] = dkc;
  }
  if (kind.delta) {
    T db = 0;
    for (int64_t j = 0; j < dv; ++j) {
      g.dv[t * dv + j] = beta * w.du[j];
      db += w.du[j] * (T(v[j]) - w.p[j]);
      w.dp[j] = -beta * w.du[j];
    }
    if (g.dbeta) g.dbeta[t] = db;
  } else {
    for (int64_t j = 0; j < dv; ++j) g.dv[t * dv + j] = w.du[j];
  }
  // Through p = k S' (delta) and S' = diag(a) S_{t-1}.
  for (int64_t c = 0; c < dk; ++c) {
    T* ds = dS + c * dv;
    const T* sp = S_prev + c * dv;
    T dkc = 0, dac = 0;
    for (int64_t j = 0; j < dv; ++j) {
      if (kind.delta) {
        dkc += w.a[c] * sp[j] * w.dp[j];
        ds[j] += w.kb[c] * w.dp[j];
      }
      dac += ds[j] * sp[j];
      ds[j] *= w.a[c];
    }
    w.dkk[c] += dkc;
    w.da[c] = dac * w.a[c];  // dL/dg_c = a_c dL/da_c
  }
  if (g.dg && kind.gate == Gate::vector)
    for (int64_t c = 0; c < dk; ++c) g.dg[t * dk + c] = w.da[c];
  if (g.dg && kind.gate == Gate::scalar) {
    T s = 0;
    for (int64_t c = 0; c < dk; ++c) s += w.da[c];
    g.dg[t] = s;
  }
  // Through the normalisation k = k_raw / r: dk_raw = (dk - k (k . dk)) / r.
  T kd = 0;
  if (kind.normalize_keys)
    for (int64_t c = 0; c < dk; ++c) kd += w.kb[c] * w.dkk[c];
  const T inv = !kind.normalize_keys ? T(1) : r > 0 ? T(1) / r : T(0);
  for (int64_t c = 0; c < dk; ++c) g.dk[t * dk + c] = (w.dkk[c] - w.kb[c] * kd) * inv;
}

// The backward running norms of one step, in reverse order (fp64 only; see recurrence_grad_tolerance). dS
// holds dL/dS_{t-1} on entry; ds_t: ||dL/dS_t|| (with o_t's term) before the step.
void observe_backward(const HeadInputs& hi, const RecurrenceKind& kind, int64_t t, const double* dS,
                      double ds_t, const float* d_out, double k_factor, const double* a, const double* kb,
                      HeadStats& st) {
  const int64_t dk = hi.dk, dv = hi.dv;
  const double ndo = norm_f(d_out + t * dv, dv), nk = norm2(kb, dk);
  const double k2 = 1 + nk * nk;
  const double local = k_factor * k2 * k2 * (ds_t + hi.scale * norm_f(hi.q + t * dk, dk) * ndo);
  st.e_bwd = transition_norm(kind, a, kb, hi.beta ? hi.beta[t] : 1.0, dk) * (st.e_bwd + local);
  st.max_e_bwd = std::max(st.max_e_bwd, st.e_bwd + local);
  st.max_ds = std::max({st.max_ds, ds_t, norm2(dS, dk * dv)}), st.max_do = std::max(st.max_do, ndo);
}

// One head's backward: a forward pass keeping S every `every` tokens, then the chunks in reverse, each
// recomputing its C + 1 states from its checkpoint: O((n / C + C) d_k d_v) memory.
template <class T>
void head_backward(const HeadInputs& hi, const RecurrenceKind& kind, const float* d_out, int64_t every,
                   const HeadGrads<T>& g, HeadStats* st = nullptr, double k_factor = 0) {
  const int64_t n = hi.n, dk = hi.dk, dv = hi.dv, dd = dk * dv, chunks = (n + every - 1) / every;
  std::vector<T> ckpt(static_cast<std::size_t>(chunks * dd)), S(dd, T(0)), dS(dd, T(0));
  std::vector<T> states(static_cast<std::size_t>((every + 1) * dd));
  if (hi.s0) std::copy_n(hi.s0, dd, S.begin());
  head_forward<T, T>(hi, kind, S.data(), nullptr, ckpt.data(), every);
  BackScratch<T> w(dk, dv);
  for (int64_t m = chunks - 1; m >= 0; --m) {
    const int64_t t0 = m * every, len = std::min(every, n - t0);
    std::copy_n(ckpt.data() + m * dd, dd, states.data());
    for (int64_t i = 0; i < len; ++i) {
      std::copy_n(states.data() + i * dd, dd, states.data() + (i + 1) * dd);
      load_key(hi, kind, t0 + i, w.kb.data());
      load_decay(hi, kind, t0 + i, w.a.data());
      step(dk, dv, w.a.data(), w.kb.data(), hi.v + (t0 + i) * dv, T(hi.beta ? hi.beta[t0 + i] : 1.0f),
           kind.delta, states.data() + (i + 1) * dd, w.u.data(), w.p.data());
    }
    for (int64_t i = len - 1; i >= 0; --i) {
      double ds_t = 0;  // ||dL/dS_t|| before the step (its o_t term included: bounded by adding it)
      if constexpr (std::is_same_v<T, double>)
        if (st)
          ds_t = norm_f(dS.data(), dd) +
                 hi.scale * norm_f(hi.q + (t0 + i) * dk, dk) * norm_f(d_out + (t0 + i) * dv, dv);
      step_backward(hi, kind, t0 + i, states.data() + i * dd, states.data() + (i + 1) * dd, d_out, dS.data(),
                    w, g);
      if constexpr (std::is_same_v<T, double>)
        if (st)
          observe_backward(hi, kind, t0 + i, dS.data(), ds_t, d_out, k_factor, w.a.data(), w.kb.data(), *st);
    }
  }
  if (g.ds0) std::copy_n(dS.data(), dd, g.ds0);
}

// Runs fn(b, h, bh) for every (batch, query head), one TBB task each.
template <class Fn>
void for_each_head(const Problem& p, Fn&& fn) {
  tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) { fn(bh / p.heads, bh % p.heads, bh); });
}

// The gradients of every head into dq and per-query-head dk, dv (summed over grouped-query groups after, in
// head order, so the result does not depend on the thread count).
// chunkwise: the chunk form's own backward (fp32, recurrence_chunkwise_backward), else the reverse pass with
// checkpoints `every` tokens.
template <class T>
void all_heads_backward(const Problem& p, const AttentionInputs& in, const RecurrenceKind& kind,
                        const float* d_out, int64_t every, const RecurrenceGrads<T>& g,
                        bool chunkwise = false) {
  // A head's rows: krows of Q, K, dq, dk (n x d_k), vrows of V, dO, dv (n x d_v).
  const int64_t n = p.seq_q, krows = n * p.head_dim, vrows = n * p.value_dim(), group = p.group_size();
  std::vector<T> dk_h, dv_h;
  if (group > 1) {
    dk_h.resize(static_cast<std::size_t>(p.batch * p.heads * krows));
    dv_h.resize(static_cast<std::size_t>(p.batch * p.heads * vrows));
  }
  const int64_t gstride = kind.gate == Gate::vector ? krows : n;
  for_each_head(p, [&](int64_t b, int64_t h, int64_t bh) {
    const HeadInputs hi = head_inputs(p, in, kind, b, h);
    HeadGrads<T> hg;
    hg.dq = g.dq + bh * krows;
    hg.dk = group > 1 ? dk_h.data() + bh * krows : g.dk + p.kv_block(b, h) * krows;
    hg.dv = group > 1 ? dv_h.data() + bh * vrows : g.dv + p.kv_block(b, h) * vrows;
    hg.dg = g.dg && kind.gate != Gate::none ? g.dg + bh * gstride : nullptr;
    hg.dbeta = g.dbeta && kind.delta ? g.dbeta + bh * n : nullptr;
    hg.ds0 = g.d_initial_state ? g.d_initial_state + bh * hi.dk * hi.dv : nullptr;
    if constexpr (std::is_same_v<T, float>)
      if (chunkwise) {
        recurrence_chunk_head_backward(hi, kind, every, d_out + bh * vrows,
                                       {hg.dq, hg.dk, hg.dv, hg.dg, hg.dbeta, hg.ds0});
        return;
      }
    head_backward<T>(hi, kind, d_out + bh * vrows, every, hg);
  });
  if (group == 1) return;
  tbb::parallel_for(int64_t{0}, p.batch * p.num_kv_heads(), [&](int64_t kvb) {
    const int64_t b = kvb / p.num_kv_heads(), kvh = kvb % p.num_kv_heads();
    T* dk = g.dk + kvb * krows;
    T* dv = g.dv + kvb * vrows;
    std::fill_n(dk, krows, T(0)), std::fill_n(dv, vrows, T(0));
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      const int64_t bh = b * p.heads + h;
      for (int64_t e = 0; e < krows; ++e) dk[e] += dk_h[bh * krows + e];
      for (int64_t e = 0; e < vrows; ++e) dv[e] += dv_h[bh * vrows + e];
    }
  });
}

}  // namespace

void recurrence_forward(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg) {
  if (cfg.form == RecurrenceForm::chunk) {
    recurrence_chunk_forward(p, in, cfg);
    return;
  }
  const int64_t dv = p.value_dim(), dd = p.head_dim * dv;
  for_each_head(p, [&](int64_t b, int64_t h, int64_t bh) {
    const HeadInputs hi = head_inputs(p, in, cfg.kind, b, h);
    std::vector<float> S(dd, 0.0f);
    if (hi.s0) std::copy_n(hi.s0, dd, S.begin());
    recurrence_recurrent_head(hi, cfg.kind, S.data(), in.out + bh * p.seq_q * dv);
    if (in.final_state) std::copy_n(S.data(), dd, in.final_state + bh * dd);
  });
}

void recurrence_reference(const Problem& p, const AttentionInputs& in, const RecurrenceKind& kind,
                          double* out, double* final_state) {
  const int64_t dv = p.value_dim(), dd = p.head_dim * dv;
  for_each_head(p, [&](int64_t b, int64_t h, int64_t bh) {
    const HeadInputs hi = head_inputs(p, in, kind, b, h);
    std::vector<double> S(dd, 0.0);
    if (hi.s0) std::copy_n(hi.s0, dd, S.begin());
    head_forward<double, double>(hi, kind, S.data(), out + bh * p.seq_q * dv, nullptr, 1);
    if (final_state) std::copy_n(S.data(), dd, final_state + bh * dd);
  });
}

bool recurrence_chunkwise_backward(const RecurrenceConfig& cfg) {
  // KDA (a gate per key channel with the delta rule) has no chunkwise backward yet: its chunk form's
  // backward is the token-by-token reverse pass from checkpoints every C tokens.
  return cfg.form == RecurrenceForm::chunk && !(cfg.kind.gate == Gate::vector && cfg.kind.delta);
}

// Each form's own backward: the chunk form's reverse mode through its chunkwise products
// (recurrence_chunk_backward.cpp), the recurrent form's through the recurrence token by token, recomputing
// the states from checkpoints every cfg.chunk tokens.
void recurrence_backward(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg,
                         const float* d_out, const RecurrenceGrads<float>& g) {
  all_heads_backward<float>(p, in, cfg.kind, d_out, cfg.chunk, g, recurrence_chunkwise_backward(cfg));
}

void recurrence_reference_backward(const Problem& p, const AttentionInputs& in, const RecurrenceKind& kind,
                                   const float* d_out, const RecurrenceGrads<double>& g) {
  all_heads_backward<double>(p, in, kind, d_out, 64, g);
}

namespace {

// The fp64 running norms of every head (forward; with d_out, the backward's too).
std::vector<HeadStats> all_head_stats(const Problem& p, const AttentionInputs& in,
                                      const RecurrenceConfig& cfg, const float* d_out) {
  const int64_t n = p.seq_q, dk = p.head_dim, dv = p.value_dim(), dd = dk * dv;
  // u (d + 8 + C') per unit of magnitude: the local rounding of one step (see recurrence_abs_tolerance),
  // d = d_k for the forward (its sums run over d_k and C, never d_v) and max(d_k, d_v) for the gradients'
  // bounds (the backward's products also sum over d_v; see recurrence_grad_tolerance).
  const int64_t c_eff = cfg.form == RecurrenceForm::chunk ? std::min(cfg.chunk, n) : 0;
  const int64_t d = d_out ? std::max(dk, dv) : dk;
  const double k_factor = std::ldexp(1.0, -24) * static_cast<double>(d + 8 + c_eff);
  std::vector<HeadStats> stats(static_cast<std::size_t>(p.batch * p.heads));
  for_each_head(p, [&](int64_t b, int64_t h, int64_t bh) {
    const HeadInputs hi = head_inputs(p, in, cfg.kind, b, h);
    std::vector<double> S(dd, 0.0);
    if (hi.s0) std::copy_n(hi.s0, dd, S.begin());
    HeadStats& st = stats[bh];
    head_forward<double, double>(hi, cfg.kind, S.data(), nullptr, nullptr, 1, &st, k_factor);
    if (!d_out) return;
    std::vector<double> gq(n * dk), gk(n * dk), gv(n * dv);
    HeadGrads<double> hg{gq.data(), gk.data(), gv.data(), nullptr, nullptr, nullptr};
    head_backward<double>(hi, cfg.kind, d_out + bh * n * dv, 64, hg, &st, k_factor);
  });
  return stats;
}

}  // namespace

// Why this bound. u = 2^-24, d_k = head_dim, d_v = value_dim(); per (batch, head), with row vectors and
// Frobenius norms (S is d_k x d_v):
//  * one fp32 step S_{t-1} -> S_t commits a local error E_t: the decay exp(g) (within 2u), S' = a S (one
//    rounding), p = k S' (a d_k-term dot product per column: d_k u ||k|| ||S'||), u = beta (v - p) and the
//    rank-1 update k^T u (a few roundings each, no sum), the key normalisation ((d_k + 3) u relative).
//    Bounding ||u|| <= ||v|| + ||k|| ||S'|| and ||S'|| <= ||S_{t-1}|| (a <= 1):
//    ||E_t|| <= (d_k + 8) u (1 + ||k_t||^2)^2 (||S_{t-1}|| + ||v_t||).
//    No forward sum runs over d_v: the value columns are independent of each other.
//    The chunk form evaluates the same sums in another order: the intra-chunk products (the scores over d_k,
//    A U and Kᵀ U over the chunk's tokens) and the UT solve (the recurrence's own forward substitution) add
//    up to C more terms per sum, so (d_k + 8 + C) replaces (d_k + 8);
//    its decays exp(Gamma_t - Gamma_s) are exponentials of differences of fp64 cumulative sums, each
//    difference rounded once to fp32 (a factor off by at most 2^-24 / e in absolute terms, plus the exp2
//    polynomial's 1.5 ulp; gla's off-diagonal factors are products of three such), well inside the C terms.
//  * an error in S_{t-1} reaches S_t through J_t = (I - beta k^T k) diag(a) (delta) or diag(a), whose norm is
//    at most rho_t max(a_t), rho_t = max(1, |1 - beta ||k||^2|) (1 with normalised keys and beta in (0, 1]),
//    so e_t = rho_t max(a_t) e_{t-1} + ||E_t|| bounds ||S_t(fp32) - S_t|| (HeadStats::e_fwd): the decays damp
//    old errors as they damp old tokens;
//  * o_t = scale q_t S_t, a d_k-term dot product per column:
//    |do_tj| <= scale ||q_t|| (e_t + (d_k + 2) u ||S_t||) (HeadStats::max_out).
// The bound is the largest of those over heads and tokens, times 4 for blocked BLAS summation orders the
// analysis does not follow. It is a worst case (every rounding aligned): the errors seen are 1e2-1e4 times
// smaller; a wrong gate, chunk boundary, solve or state carry moves outputs by a fraction of ||q|| ||S||,
// above it, and tests/test_recurrent.cpp holds every form to 1e-5 relative against an independent fp64
// recurrence besides.
double recurrence_abs_tolerance(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg) {
  double tol = 0;
  for (const HeadStats& st : all_head_stats(p, in, cfg, nullptr)) tol = std::max(tol, st.max_out);
  return 4.0 * tol + 1e-30;
}

// The state's running bound e_t above (a Frobenius bound, so one on every element), its largest over
// tokens and heads, times 4 as the output's.
double recurrence_state_tolerance(const Problem& p, const AttentionInputs& in, const RecurrenceConfig& cfg) {
  double tol = 0;
  for (const HeadStats& st : all_head_stats(p, in, cfg, nullptr)) tol = std::max(tol, st.max_e_fwd);
  return 4.0 * tol + 1e-30;
}

// Why these bounds. The backward runs the same steps in reverse on dS = dL/dS_t, whose transitions are the
// transposes J_t^T (same norms), with local errors bounded as the forward's with ||dS_t|| + scale ||q_t||
// ||dO_t|| in place of ||S_{t-1}|| + ||v_t||, damped by the same transition norms in reverse: its largest
// running bound is E_dS (HeadStats::max_e_bwd). The forward states it recomputes are off by at most E_S, the
// forward's largest e_t (above). Both running bounds are taken here with max(d_k, d_v) in place of d_k (u
// (max(d_k, d_v) + 8 + C) per unit of magnitude): dS's own steps sum over d_k (du = k dS), but the chunk
// form's backward also forms d_v-term products that feed the gradients as the forward's d_k-term ones feed
// the outputs (P = dO Vᵀ, dO S_0ᵀ, V dSᵀ, the delta rule's dR Uᵀ). Then, with m_k = d_k + 2 and m_v = d_v + 2
// (the length of each final dot product):
//   dq_t = scale S_t dO_t^T (over d_v):   scale max||dO|| (E_S + m_v u max||S||)
//   dv_t = beta k_t dS_t (over d_k):      max||k|| (E_dS + m_k u max||dS||)
//   dk_t = dS_t u_t^T + S'_t dp_t^T       (E_dS + m_v u max||dS||)(max||u|| + max||S|| max||k||)
//          (both over d_v):               + max||dS|| (E_u + E_S max||k||),  E_u = max||k|| E_S + (m_k + 2) u
//                                         (max||v|| + max||k|| max||S||) (u = beta (v - k S'), k S' over
//                                         d_k); divided by min ||k_raw|| when keys are normalised (dk_raw =
//                                         (I - k k^T) dk / ||k_raw||).
// Each times 4, as the forward's. The chunk form's own backward (recurrence_chunk_backward.cpp) evaluates the
// same sums in another order, blocked by chunk: up to C more terms per sum (its C x C products, the delta
// rule's transposed solve), which the running bounds already carry for the chunk form (all_head_stats); its
// decays are exponentials of fp64 differences rounded once, as the forward's. tests/test_recurrent.cpp holds
// both forms' gradients to these bounds and to 1e-5 relative, with d_k = d_v and with d_k != d_v both ways.
GradientTolerance recurrence_grad_tolerance(const Problem& p, const AttentionInputs& in,
                                            const RecurrenceConfig& cfg, const float* d_out) {
  const double u = std::ldexp(1.0, -24), scale = p.effective_scale();
  const double mk = static_cast<double>(p.head_dim) + 2, mv = static_cast<double>(p.value_dim()) + 2;
  GradientTolerance tol;
  for (const HeadStats& st : all_head_stats(p, in, cfg, d_out)) {
    const double e_s = st.max_e_fwd, e_ds = st.max_e_bwd;
    const double ds_k = e_ds + mk * u * st.max_ds, ds_v = e_ds + mv * u * st.max_ds;
    const double e_u = st.max_k * e_s + (mk + 2) * u * (st.max_v + st.max_k * st.max_s);
    double dk = ds_v * (st.max_u + st.max_s * st.max_k) + st.max_ds * (e_u + e_s * st.max_k);
    if (cfg.kind.normalize_keys) dk /= std::max(st.min_r, 1e-30);
    tol.dq = std::max(tol.dq, scale * st.max_do * (e_s + mv * u * st.max_s));
    tol.dv = std::max(tol.dv, st.max_k * ds_k);
    tol.dk = std::max(tol.dk, dk);
  }
  tol.dq = 4 * tol.dq + 1e-30, tol.dk = 4 * tol.dk + 1e-30, tol.dv = 4 * tol.dv + 1e-30;
  return tol;
}

namespace {
double heads_of(const Problem& p) {
  return static_cast<double>(p.batch) * static_cast<double>(p.heads);
}
// Per token and head, the recurrent form's multiply-adds (2 FLOPs each) on the d_k x d_v state: the decay
// d_k d_v (1 FLOP each, when there is one), the rank-1 update 2 d_k d_v, p = k S' 2 d_k d_v (delta), the
// output q S 2 d_k d_v.
double recurrent_token_flops(const RecurrenceKind& kind, double dk, double dv) {
  const bool decays = kind.gate != Gate::none || kind.retention;
  return (decays ? dk * dv : 0) + 4 * dk * dv + (kind.delta ? 2 * dk * dv : 0);
}
}  // namespace

double recurrence_flops(const Problem& p, const RecurrenceConfig& cfg) {
  const double n = static_cast<double>(p.seq_q), dk = static_cast<double>(p.head_dim),
               dv = static_cast<double>(p.value_dim());
  if (cfg.form == RecurrenceForm::recurrent) return heads_of(p) * n * recurrent_token_flops(cfg.kind, dk, dv);
  // Per chunk of L tokens: Q S (2 L d_k d_v), the lower triangle of Q K^T (L (L + 1) d_k) and of A U
  // (L (L + 1) d_v), the state's decay (d_k d_v) and K^T U (2 L d_k d_v); the delta rule adds K S
  // (2 L d_k d_v), the strict lower triangle of K K^T (L (L - 1) d_k) and the solve on U's d_v columns
  // (L (L - 1) d_v). The gates' exponentials are not counted.
  auto chunk_flops = [&](double L) {
    return 4 * L * dk * dv + L * (L + 1) * (dk + dv) + dk * dv +
           (cfg.kind.delta ? 2 * L * dk * dv + L * (L - 1) * (dk + dv) : 0);
  };
  // Closed form over the full chunks and the last one (a loop over chunks would not end for n near 2^40).
  const double C = static_cast<double>(cfg.chunk), full = std::floor(n / C), rest = n - full * C;
  const double total = full * chunk_flops(C) + (rest > 0 ? chunk_flops(rest) : 0);
  return heads_of(p) * total;
}

double recurrence_backward_flops(const Problem& p, const RecurrenceConfig& cfg) {
  const double n = static_cast<double>(p.seq_q), dk = static_cast<double>(p.head_dim),
               dv = static_cast<double>(p.value_dim()), dkv = dk * dv;
  if (recurrence_chunkwise_backward(cfg)) {
    // Per chunk of L tokens: the first pass's state carry (K^ᵀ U, 2 L d_k d_v, and its decay d_k d_v); then
    // dO S_0ᵀ, V dSᵀ (U dSᵀ), K^ dS and Q^ᵀ dO (2 L d_k d_v each), dS's decay (d_k d_v), and five triangular
    // products (only the pairs s <= t counted), three over d_k (the scores A, P K, Pᵀ Q: L (L + 1) d_k each)
    // and two over d_v (P = dO Vᵀ, Aᵀ dO: L (L + 1) d_v each). The delta rule recomputes U twice (the first
    // pass and the chunk's backward: [K; Q] S_0 4 L d_k d_v, K Kᵀ L (L - 1) d_k and the solve L (L - 1) d_v
    // each) and adds dX_K S_0ᵀ and Knᵀ dX_K (2 L d_k d_v each), the transposed solve and dR Uᵀ (L (L - 1)
    // d_v each), E Kn and Eᵀ Kn (L (L - 1) d_k each). The gates' exponentials and the elementwise decays are
    // not counted, as in the forward.
    auto chunk_flops = [&](double L) {
      const double base = 10 * L * dkv + 2 * dkv + L * (L + 1) * (3 * dk + 2 * dv);
      return base + (cfg.kind.delta ? 2 * (4 * L * dkv + L * (L - 1) * (dk + dv)) + 4 * L * dkv +
                                          2 * L * (L - 1) * (dk + dv)
                                    : 0);
    };
    const double C = static_cast<double>(cfg.chunk), full = std::floor(n / C), rest = n - full * C;
    return heads_of(p) * (full * chunk_flops(C) + (rest > 0 ? chunk_flops(rest) : 0));
  }
  // The reverse pass runs the recurrence twice (checkpoints, then each chunk's states again) and, per token,
  // dq, dS += q^T dO, du = k dS, dk = dS u^T, da and dS = a dS' (11 d_k d_v), plus 6 d_k d_v for the delta
  // rule's p, dp and its rank-1 term.
  return heads_of(p) * n * (2 * recurrent_token_flops(cfg.kind, dk, dv) + (cfg.kind.delta ? 17 : 11) * dkv);
}

std::size_t recurrence_workspace_bytes(const Problem& p, const RecurrenceConfig& cfg, int threads) {
  const std::size_t dk = to_size(p.head_dim), dv = to_size(p.value_dim()),
                    c = to_size(std::min(cfg.chunk, p.seq_q));
  // Per running task: the d_k x d_v state and, chunk form, the chunk's buffers (recurrence_chunk-inl.hpp's
  // ChunkBuffers: six C x d_k, C x max(2 d_v, d_k), max(C d_v, d_k) and four C x C floats, d_k + 2 C more,
  // and the fp64 log decays, C x d_k).
  std::size_t per = sat_mul(dk, dv, sizeof(float));
  if (cfg.form == RecurrenceForm::chunk)
    per = sat_add(per,
                  sat_mul(sat_add(sat_mul(6, c, dk), sat_mul(c, std::max(2 * dv, dk)),
                                  std::max(sat_mul(c, dv), dk), sat_mul(4, c, c), dk, sat_mul(2, c)),
                          sizeof(float)),
                  sat_mul(c, dk, sizeof(double)));
  return sat_mul(per, to_size(std::max(threads, 1)));
}

std::size_t recurrence_backward_workspace_bytes(const Problem& p, const RecurrenceConfig& cfg, int threads) {
  const std::size_t dk = to_size(p.head_dim), dv = to_size(p.value_dim()), n = to_size(p.seq_q),
                    c = to_size(cfg.chunk);
  const std::size_t chunks = (n + c - 1) / c, cc = std::min(c, n);
  // Per running task, reverse pass: checkpoints every C tokens, the C + 1 states of one chunk, S and dS
  // (d_k x d_v each). Chunkwise: the state at every chunk's start, the forward's chunk buffers (as
  // recurrence_workspace_bytes counts them) and the backward's (recurrence_chunk_backward.cpp's
  // BackBuffers: C x d_v, three C x d_k and two C x max(d_k, d_v), one C x C and two C floats, a d_k x d_v
  // transpose and dS, C x d_k doubles; the delta rule two C x C floats more).
  std::size_t per = sat_mul(sat_add(chunks, cc + 1, 2), dk, dv, sizeof(float));
  if (recurrence_chunkwise_backward(cfg)) {
    const std::size_t fwd = recurrence_workspace_bytes(p, cfg, 1);  // includes one d_k x d_v state
    const std::size_t back =
        sat_add(sat_mul(sat_add(sat_mul(cc, sat_add(dv, sat_mul(3, dk), sat_mul(2, std::max(dk, dv)))),
                                sat_mul(cfg.kind.delta ? 3 : 1, cc, cc), sat_mul(2, dk, dv), sat_mul(2, cc)),
                        sizeof(float)),
                sat_mul(cc, dk, sizeof(double)));
    per = sat_add(sat_mul(chunks, dk, dv, sizeof(float)), fwd, back);
  }
  // Grouped-query heads: per-query-head dK (Q's shape) and dV (the output's), summed per group after.
  const std::size_t group =
      p.is_gqa() ? sat_mul(sat_add(to_size(p.q_elements()), to_size(p.out_elements())), sizeof(float)) : 0;
  return sat_add(sat_mul(per, to_size(std::max(threads, 1))), group);
}

}  // namespace attn
