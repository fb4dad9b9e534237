// linformer (Wang et al. 2020): keys and values projected along the sequence to k rows by fixed random
// E, F ∈ R^(k×n), then softmax attention over the k projected keys: out = softmax(scale·Q (E K)ᵀ) (F V).
// Time O(n·k·d), memory O(k·n + k·d) per K/V head; never an n × n matrix.
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/dropout.hpp"
#include "common/kernels/vmath.hpp"
#include "common/support/aligned.hpp"
#include "common/support/runtime.hpp"
#include "variants/linformer/projection.hpp"

namespace attn {
namespace {

using linformer::Stream;

// k above 2^20 is no longer a low-rank projection of any sequence this harness runs (the paper uses 64-512).
constexpr int64_t kMaxK = int64_t{1} << 20;
constexpr double kMaxSeed = 9007199254740991.0;  // 2^53 - 1: every seed survives a JSON double exactly
// Work units, fixed by the problem (never by the thread count): rows of E (or F) per projection task, keys
// per projection GEMM (with key padding, a block holding a padded key is copied with those rows zeroed), and
// query rows per attention task (its scores are a kQueryRows × k block).
constexpr int64_t kProjRows = 64;
constexpr int64_t kKeyBlock = 512;
constexpr int64_t kQueryRows = 128;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// E and F of `p` as fp32 (linformer/projection.hpp), k × seq_kv each.
// With `into` (2 k n floats: the training forward's saved state), drawn there, E then F.
struct Projections {
  AlignedVector<float> own;
  float* e = nullptr;
  float* f = nullptr;
  explicit Projections(const Problem& p, float* into = nullptr) {
    const int64_t k = p.param_int("k"), n = p.seq_kv;
    const auto seed = static_cast<uint64_t>(p.param_int("seed"));
    if (!into) own.resize(static_cast<std::size_t>(2 * k * n)), into = own.data();
    e = into, f = into + k * n;
    linformer::fill_projection(seed, Stream::keys, k, n, e);
    linformer::fill_projection(seed, Stream::values, k, n, f);
  }
};

// The fp64 projections of one K/V block (batch entry b): K' = E K and V' = F V over the keys that are not
// padded (a padded key's column of E and F counts as zero; skipping it also keeps a NaN in a padded row out),
// and, with `magnitudes`, A = |E| |K| and B = |F| |V| over the same keys (the rounding-error scale of each
// projected entry). All k × d.
struct ProjectedBlock {
  std::vector<double> kp, vp, a, b;
};

ProjectedBlock project_fp64(const Problem& p, const AttentionInputs& in, const Projections& pr, int64_t kv,
                            bool magnitudes) {
  const int64_t k = p.param_int("k"), n = p.seq_kv, D = p.head_dim, b = kv / p.num_kv_heads();
  const std::size_t size = static_cast<std::size_t>(k * D);
  ProjectedBlock out{std::vector<double>(size, 0.0), std::vector<double>(size, 0.0), {}, {}};
  if (magnitudes) out.a.assign(size, 0.0), out.b.assign(size, 0.0);
  const float* key = in.k + kv * n * D;
  const float* val = in.v + kv * n * D;
  for (int64_t r = 0; r < k; ++r)
    for (int64_t j = 0; j < n; ++j) {
      if (p.mask.key_padding && in.key_padding[b * n + j]) continue;
      const double e = pr.e[static_cast<std::size_t>(r * n + j)],
                   f = pr.f[static_cast<std::size_t>(r * n + j)];
      for (int64_t c = 0; c < D; ++c) {
        const double kc = key[j * D + c], vc = val[j * D + c];
        out.kp[r * D + c] += e * kc;
        out.vp[r * D + c] += f * vc;
        if (magnitudes) {
          out.a[r * D + c] += std::fabs(e * kc);
          out.b[r * D + c] += std::fabs(f * vc);
        }
      }
    }
  return out;
}

// dst (rows × D, leading dimension D) = proj (rows × n, leading dimension n) times src (n × D), in blocks of
// kKeyBlock keys accumulated in order. Padded keys (pad[j] != 0, pad may be null) are read as zero rows from
// a copy in `buf` (kKeyBlock × D floats): a zero row adds exactly nothing, even where the padded input holds
// a NaN or Inf that a zeroed column of E would turn into NaN (0 · Inf).
void project_rows(const float* proj, int64_t rows, int64_t n, const float* src, int64_t D, const uint8_t* pad,
                  float* buf, float* dst) {
  for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
    const int64_t len = std::min(kKeyBlock, n - j0);
    const float* block = src + j0 * D;
    if (pad && std::any_of(pad + j0, pad + j0 + len, [](uint8_t x) { return x != 0; })) {
      for (int64_t j = 0; j < len; ++j) {
        float* row = buf + j * D;
        if (pad[j0 + j])
          std::fill(row, row + D, 0.0f);
        else
          std::copy_n(block + j * D, D, row);
      }
      block = buf;
    }
    sgemm(false, false, rows, D, len, 1.0f, proj + j0, n, block, D, j0 == 0 ? 0.0f : 1.0f, dst, D);
  }
}

class Linformer final : public Attention {
 public:
  std::string name() const override { return "linformer"; }
  std::string description() const override {
    return "softmax(scale Q (E K)^T) (F V): keys and values projected along the sequence to k rows by seeded "
           "N(0,1/k) matrices E, F shared by every head and batch entry (the paper's headwise sharing), "
           "O(n·k·d)";
  }
  Capabilities capabilities() const override {
    // Not exact (softmax over k random mixtures of the keys, not over the keys). Non-causal only: every
    // projected key mixes all positions, so no projected key is "in the past" of a query (the paper is
    // encoder-only; extra_not_supported_reasons says so). No boolean mask: a [seq_q, seq_kv] mask has no
    // entry for a projected key. Key padding is a zero column of E and F for that key (per batch entry).
    // Not permutation equivariant: E's column j multiplies key j, so reordering the keys changes K'. No ALiBi
    // (its distance |i - j| has no meaning for a projected key). bf16 / fp16: widened to fp32 up front
    // (WideInputs, counted in workspace_bytes). Dropout acts on the k softmax weights of each query row, with
    // the shared DropoutRow (j = the projected key's index). Backward: dQ, dK, dV through the fixed E and F
    // (they get no gradient), for every problem the forward runs.
    return {.exact = false,
            .causal = false,
            .causal_lower_right = false,
            .gqa = true,
            .boolean_mask = false,
            .key_padding = true,
            .cross = true,
            .dropout = true,
            .bf16 = true,
            .fp16 = true,
            .alibi = false,
            .permutation_equivariant = false,
            .backward = true};
  }
  std::vector<ParamSpec> param_specs() const override {
    return {
        {.name = "k",
         .type = ParamType::integer,
         .default_value = 256,
         .help = "projected length: rows of E and F (used as given, also when k >= seq_kv: the projection "
                 "is then no reduction and costs more than exact attention)",
         .min = 1,
         .max = static_cast<double>(kMaxK)},
        {.name = "seed",
         .type = ParamType::integer,
         .default_value = 0,
         .help = "seed of the random projections E and F (not the dropout seed)",
         .min = 0,
         .max = kMaxSeed}};
  }
  std::vector<Json> test_param_sets() const override {
    // k = 1 (one projected key: the softmax is 1, out = F V), 5 and 16 make the check's seq 1..130 cover
    // k < n, k = n and k > n; 80 (> kProjRows) runs two projection row blocks; the default 256 once.
    return {{{"k", 1}}, {{"k", 5}, {"seed", 7}}, {{"k", 16}}, {{"k", 80}, {"seed", 3}}, Json::object()};
  }

  double flops(const Problem& p) const override {
    // The multiply-adds of the method: E K and F V, 2·k·n·d each per K/V head (grouped-query heads share
    // them), and Q K'ᵀ and P V', 2·Lq·k·d each per query head. Not counted: drawing E and F (k·n normals per
    // matrix, once per call; in a trained Linformer they are parameters, not work), the softmax, dropout,
    // the padding copies and the bf16 / fp16 widening. Wall time includes all of them.
    const double k = static_cast<double>(p.param_int("k")), D = static_cast<double>(p.head_dim);
    const double proj =
        4.0 * k * static_cast<double>(p.seq_kv) * D * static_cast<double>(p.batch * p.num_kv_heads());
    const double attend = 4.0 * static_cast<double>(p.seq_q) * k * D * static_cast<double>(p.batch * p.heads);
    return proj + attend;
  }

  double bytes_moved(const Problem& p) const override {
    // Compulsory traffic plus what this schedule streams: E and F written once and read by every K/V head's
    // projection, and K', V' (k × d each) written once per K/V head and read once per query head. Whether E
    // and F stay in cache between K/V heads is the machine's business; this counts them as streamed.
    const double k = static_cast<double>(p.param_int("k")), D = static_cast<double>(p.head_dim);
    const double ef = 2.0 * k * static_cast<double>(p.seq_kv) * sizeof(float);
    const double kv_heads = static_cast<double>(p.batch * p.num_kv_heads());
    const double projected = 2.0 * k * D * sizeof(float);
    return compulsory_bytes(p) + ef * (1.0 + kv_heads) +
           projected * (kv_heads + static_cast<double>(p.batch * p.heads));
  }

  std::size_t workspace_bytes(const Problem& p, int threads) const override {
    // E and F (k × n each), K' and V' (k × d per K/V head), and per thread the larger of a scores block
    // (kQueryRows × k) and, with key padding, a block of zeroed keys (kKeyBlock × d); bf16 / fp16 add fp32
    // copies of Q, K and V. Saturating (common/interface/util.hpp): k × n alone can exceed 64 bits for valid
    // sizes.
    const std::size_t k = to_size(p.param_int("k")), n = to_size(p.seq_kv), D = to_size(p.head_dim);
    const std::size_t T = to_size(std::max(threads, 1));
    const std::size_t ef = sat_mul(2, k, n);
    const std::size_t projected = sat_mul(2, to_size(p.batch * p.num_kv_heads()), k, D);
    const std::size_t scores = sat_mul(to_size(std::min(kQueryRows, p.seq_q)), k);
    const std::size_t keys = p.mask.key_padding ? sat_mul(to_size(std::min(kKeyBlock, p.seq_kv)), D) : 0;
    const std::size_t floats = sat_add(ef, projected, sat_mul(T, std::max(scores, keys)));
    const std::size_t widened =
        p.dtype == DType::fp32
            ? 0
            : sat_mul(sat_add(to_size(p.q_elements()), sat_mul(2, to_size(p.kv_elements()))), sizeof(float));
    return sat_add(sat_mul(floats, sizeof(float)), widened);
  }

  // The definition in fp64 with the same fp32 E and F (the draws as the kernel sees them, cast to double):
  // per K/V block K' = E K and V' = F V over the unpadded keys, then per query row softmax(scale q K'ᵀ) V',
  // dropout (if any) on the k normalised weights.
  void reference_forward(const Problem& p, const AttentionInputs& stored, double* out) const override {
    const WideInputs wide(p, stored);
    const AttentionInputs& in = wide.get();
    const Projections pr(p);
    const int64_t k = p.param_int("k"), D = p.head_dim, Lq = p.seq_q, G = p.group_size();
    const double scale = p.effective_scale();
    tbb::parallel_for(int64_t{0}, p.batch * p.num_kv_heads(), [&](int64_t kv) {
      const ProjectedBlock pb = project_fp64(p, in, pr, kv, false);
      const int64_t b = kv / p.num_kv_heads();
      std::vector<double> s(static_cast<std::size_t>(k));
      for (int64_t h = kv % p.num_kv_heads() * G; h < (kv % p.num_kv_heads() + 1) * G; ++h) {
        const int64_t bh = b * p.heads + h;
        for (int64_t i = 0; i < Lq; ++i) {
          const float* q = in.q + (bh * Lq + i) * D;
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t r = 0; r < k; ++r) {
            double acc = 0;
            for (int64_t c = 0; c < D; ++c) acc += static_cast<double>(q[c]) * pb.kp[r * D + c];
            s[r] = acc * scale;
            mx = std::isnan(s[r]) || std::isnan(mx) ? std::numeric_limits<double>::quiet_NaN()
                                                    : std::max(mx, s[r]);
          }
          double sum = 0;
          for (int64_t r = 0; r < k; ++r) sum += s[r] = std::exp(s[r] - mx);
          const DropoutRow drop = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, b, h, i) : DropoutRow();
          double* o = out + (bh * Lq + i) * D;
          std::fill(o, o + D, 0.0);
          for (int64_t r = 0; r < k; ++r) {
            double w = s[r] / sum;
            if (p.dropout > 0) w = drop.keep(r) ? w / (1.0 - p.dropout) : 0.0;
            for (int64_t c = 0; c < D; ++c) o[c] += w * pb.vp[r * D + c];
          }
        }
      }
    });
  }

  // Why this bound. u = 2^-24; per K/V block, with A = |E| |K| and B = |F| |V| (k × d, over the unpadded
  // keys, computed here in fp64), a_c = max_r A_rc, and per query head M = scale · max_i Σ_c |q_ic| a_c:
  //  * each projected entry is a sum of n products (fp32, in kKeyBlock pieces, any order): |ΔK'_rc| <= n u
  //  A_rc
  //    and |ΔV'_rc| <= n u B_rc (Higham's γ_n; a zeroed padded row adds exactly 0);
  //  * a logit s_ir = scale Σ_c q_ic K'_rc then moves by scale Σ_c |q_ic| |ΔK'_rc| <= n u M from K', plus its
  //    own d-term dot product, the scale multiply and the scale's rounding to fp32, <= (d + 2) u M since
  //    |K'_rc| <= A_rc: |Δs| <= (n + d + 2) u M;
  //  * as in exact_abs_tolerance (common/reference/reference.cpp), logits moved by at most Δs change each
  //  softmax
  //    weight by a relative 2 Δs (the row's normaliser moves too), so Σ_r |Δw_r| <= 2 Δs. Those weights sum
  //    to 1 before and after, so the changes sum to 0 and move the output by |Σ_r Δw_r (V'_rc - m_c)| <= 2 Δs
  //    R for the midpoint m_c of column c, with R = max_c (max_r V'_rc - min_r V'_rc) / 2 (k = 1: R = 0, the
  //    one weight is exactly 1). Dropout breaks the zero sum (kept weights times 1 / (1 - p)): R = max|V'|;
  //  * the fp32 exp, the normaliser's k-term sum and the division add (k + 16) u relative to each weight, and
  //    the k-term sum of weighted values k u, each times max|V'|; V' itself is off by max ΔV' <= n u max B.
  // Total |error| <= u (2 (n + d + 2) M R + (2 k + 16) max|V'| + n max B) / (1 - p); we allow 4x that, as
  // the softmax bound does. The n u A terms are worst cases (no cancellation among the n products); real
  // errors grow like sqrt(n), so at n in the thousands the bound is loose, but at the check's n <= 130 a
  // projection off by one key (a shifted column of E, a dropped last key) moves the output far more than
  // this (tests/test_linformer.cpp asserts it).
  double abs_tolerance(const Problem& p, const AttentionInputs& stored) const override {
    const WideInputs wide(p, stored);
    const AttentionInputs& in = wide.get();
    const Projections pr(p);
    const int64_t k = p.param_int("k"), n = p.seq_kv, D = p.head_dim, Lq = p.seq_q, G = p.group_size();
    const double u = std::ldexp(1.0, -24), scale = p.effective_scale();
    double worst = 0;
    for (int64_t kv = 0; kv < p.batch * p.num_kv_heads(); ++kv) {
      const ProjectedBlock pb = project_fp64(p, in, pr, kv, true);
      std::vector<double> a(static_cast<std::size_t>(D), 0.0);
      double vmax = 0, bmax = 0, half_range = 0;
      for (int64_t c = 0; c < D; ++c) {
        double lo = std::numeric_limits<double>::infinity(), hi = -lo;
        for (int64_t r = 0; r < k; ++r) {
          const double vrc = pb.vp[r * D + c];
          a[c] = std::max(a[c], pb.a[r * D + c]);
          vmax = std::max(vmax, std::fabs(vrc));
          bmax = std::max(bmax, pb.b[r * D + c]);
          lo = std::min(lo, vrc), hi = std::max(hi, vrc);
        }
        half_range = std::max(half_range, (hi - lo) / 2);
      }
      const double spread = p.dropout > 0 ? vmax : half_range;
      const int64_t b = kv / p.num_kv_heads();
      double m = 0;
      for (int64_t h = kv % p.num_kv_heads() * G; h < (kv % p.num_kv_heads() + 1) * G; ++h)
        for (int64_t i = 0; i < Lq; ++i) {
          const float* q = in.q + ((b * p.heads + h) * Lq + i) * D;
          double acc = 0;
          for (int64_t c = 0; c < D; ++c) acc += std::fabs(static_cast<double>(q[c])) * a[c];
          m = std::max(m, scale * acc);
        }
      const double logit_error = static_cast<double>(n + D + 2) * m;  // in units of u
      const double bound = u *
                           (2.0 * logit_error * spread + (2.0 * static_cast<double>(k) + 16.0) * vmax +
                            static_cast<double>(n) * bmax) /
                           (1.0 - p.dropout);
      worst = std::max(worst, bound);
    }
    return 4.0 * worst + std::numeric_limits<float>::min();
  }

  // ---- Training ----

  std::size_t saved_floats(const Problem& p) const override {
    // E and F (drawing them again took the backward as long as half its GEMMs at k 256, n 4096: in a trained
    // Linformer they are parameters, kept anyway), then K' and V'.
    const std::size_t k = to_size(p.param_int("k"));
    return sat_add(sat_mul(2, k, to_size(p.seq_kv)),
                   sat_mul(2, to_size(p.batch * p.num_kv_heads()), k, to_size(p.head_dim)));
  }
  std::string saved_description() const override {
    return "E and F (k x seq_kv each), then the projected keys K' = E K and values V' = F V of every (batch, "
           "K/V head), k x head_dim each (K' of all, then V' of all)";
  }

  double backward_flops(const Problem& p) const override {
    // The backward's GEMMs: per query head S = scale Q K'ᵀ again, dP = dO V'ᵀ, dQ = scale dS K', dK' +=
    // scale dSᵀ Q and dV' += P̃ᵀ dO (2·Lq·k·d each); per K/V head dK = Eᵀ dK' and dV = Fᵀ dV' (2·n·k·d each).
    // E, F, K' and V' come from the forward (saved), so E K and F V are not redone. Not counted: the softmax,
    // the group sums of dK', dV' (k·d per query head).
    const double k = static_cast<double>(p.param_int("k")), D = static_cast<double>(p.head_dim);
    return 10.0 * static_cast<double>(p.seq_q) * k * D * static_cast<double>(p.batch * p.heads) +
           4.0 * static_cast<double>(p.seq_kv) * k * D * static_cast<double>(p.batch * p.num_kv_heads());
  }

  std::size_t backward_workspace_bytes(const Problem& p, int threads) const override {
    // dK' and dV' per query head (k × d each) and, with grouped-query heads, their sums per K/V head, and per
    // thread a block of P and one of dS (kQueryRows × k each). E and F are in the saved state.
    const std::size_t k = to_size(p.param_int("k")), D = to_size(p.head_dim);
    const std::size_t T = to_size(std::max(threads, 1));
    const std::size_t sums = p.is_gqa() ? sat_mul(2, to_size(p.batch * p.num_kv_heads()), k, D) : 0;
    const std::size_t floats = sat_add(sat_mul(2, to_size(p.batch * p.heads), k, D), sums,
                                       sat_mul(T, 2, to_size(std::min(kQueryRows, p.seq_q)), k));
    return sat_mul(floats, sizeof(float));
  }

  // The gradient of reference_forward in fp64: per K/V block the same fp64 K' and V', per query row the
  // softmax backward on the k projected keys (dropout's keep decisions and 1 / (1 - p) as the forward's),
  // dK' and dV' summed over the group's rows, then dK = Eᵀ dK' and dV = Fᵀ dV' over the unpadded keys (a
  // padded key is not in the definition: its gradient is 0).
  void reference_backward(const Problem& p, const AttentionInputs& stored, const float* d_out, double* dq,
                          double* dk, double* dv) const override {
    const WideInputs wide(p, stored);
    const AttentionInputs& in = wide.get();
    const Projections pr(p);
    const int64_t k = p.param_int("k"), n = p.seq_kv, D = p.head_dim, Lq = p.seq_q, G = p.group_size();
    const double scale = p.effective_scale(), kd = p.dropout > 0 ? 1.0 / (1.0 - p.dropout) : 1.0;
    tbb::parallel_for(int64_t{0}, p.batch * p.num_kv_heads(), [&](int64_t kv) {
      const ProjectedBlock pb = project_fp64(p, in, pr, kv, false);
      const int64_t b = kv / p.num_kv_heads(), kvh = kv % p.num_kv_heads();
      const std::size_t kd_size = static_cast<std::size_t>(k * D);
      std::vector<double> dkp(kd_size, 0.0), dvp(kd_size, 0.0), w(static_cast<std::size_t>(k)), wd(w.size()),
          ds(w.size()), o(static_cast<std::size_t>(D));
      for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
        const int64_t bh = b * p.heads + h;
        for (int64_t i = 0; i < Lq; ++i) {
          const float* q = in.q + (bh * Lq + i) * D;
          const float* g = d_out + (bh * Lq + i) * D;
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t r = 0; r < k; ++r) {
            double acc = 0;
            for (int64_t c = 0; c < D; ++c) acc += static_cast<double>(q[c]) * pb.kp[r * D + c];
            w[r] = acc * scale;
            mx = std::isnan(w[r]) || std::isnan(mx) ? std::numeric_limits<double>::quiet_NaN()
                                                    : std::max(mx, w[r]);
          }
          double sum = 0;
          for (int64_t r = 0; r < k; ++r) sum += w[r] = std::exp(w[r] - mx);
          const DropoutRow drop = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, b, h, i) : DropoutRow();
          std::fill(o.begin(), o.end(), 0.0);
          for (int64_t r = 0; r < k; ++r) {
            w[r] /= sum;
            wd[r] = p.dropout > 0 ? (drop.keep(r) ? w[r] * kd : 0.0) : w[r];
            for (int64_t c = 0; c < D; ++c) o[c] += wd[r] * pb.vp[r * D + c];
          }
          // dP̃_r = dO · V'_r, dP_r = keep_r kd dP̃_r, delta = Σ_r P_r dP_r = dO · O, dS_r = P_r (dP_r -
          // delta).
          double delta = 0;
          for (int64_t c = 0; c < D; ++c) delta += static_cast<double>(g[c]) * o[c];
          for (int64_t r = 0; r < k; ++r) {
            double acc = 0;
            for (int64_t c = 0; c < D; ++c) acc += static_cast<double>(g[c]) * pb.vp[r * D + c];
            if (p.dropout > 0) acc = drop.keep(r) ? acc * kd : 0.0;
            ds[r] = scale * w[r] * (acc - delta);
          }
          double* dqi = dq + (bh * Lq + i) * D;
          std::fill(dqi, dqi + D, 0.0);
          for (int64_t r = 0; r < k; ++r)
            for (int64_t c = 0; c < D; ++c) {
              dqi[c] += ds[r] * pb.kp[r * D + c];
              dkp[r * D + c] += ds[r] * q[c];
              dvp[r * D + c] += wd[r] * g[c];
            }
        }
      }
      const float* e = pr.e;
      const float* f = pr.f;
      for (int64_t j = 0; j < n; ++j) {
        double* dkj = dk + (kv * n + j) * D;
        double* dvj = dv + (kv * n + j) * D;
        std::fill(dkj, dkj + D, 0.0);
        std::fill(dvj, dvj + D, 0.0);
        if (p.mask.key_padding && in.key_padding[b * n + j]) continue;
        for (int64_t r = 0; r < k; ++r) {
          const double er = e[r * n + j], fr = f[r * n + j];
          for (int64_t c = 0; c < D; ++c) dkj[c] += er * dkp[r * D + c], dvj[c] += fr * dvp[r * D + c];
        }
      }
    });
  }

  GradientTolerance grad_tolerance(const Problem& p, const AttentionInputs& stored,
                                   const float* d_out) const override;

 protected:
  std::vector<std::string> extra_not_supported_reasons(const Problem& p) const override {
    std::vector<std::string> r;
    if (p.mask.any_causal())
      r.push_back(
          "causal: every projected key mixes all n positions, so no projected key is in a query's past "
          "(Linformer is defined for the non-causal encoder)");
    if (p.mask.boolean)
      r.push_back(
          "boolean mask: a [seq_q, seq_kv] mask has no entry for the k projected keys (key padding, "
          "which zeroes keys before the projection, is supported)");
    const int64_t k = p.param_int("k");
    if (p.seq_kv > kMaxTensorElements / k)
      r.push_back("E and F (k " + std::to_string(k) + " x seq_kv " + std::to_string(p.seq_kv) +
                  ") would exceed 2^58 elements");
    return r;
  }

  void forward(const Problem& p, const AttentionInputs& stored) const override {
    forward_impl(p, stored, nullptr);
  }
  void forward_saving(const Problem& p, const AttentionInputs& stored, float* saved) const override {
    forward_impl(p, stored, saved);
  }
  void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const override;

 private:
  // The forward, and with `saved` (the training forward) E, F and a copy of K', V' there (saved_floats): one
  // code path, so the training forward's O is bitwise run()'s.
  void forward_impl(const Problem& p, const AttentionInputs& stored, float* saved) const {
    const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
    const AttentionInputs& in = wide.get();
    const Projections pr(p, saved);  // the training forward draws E and F into its saved state
    const int64_t k = p.param_int("k"), n = p.seq_kv, D = p.head_dim, Lq = p.seq_q;
    const int64_t BKV = p.batch * p.num_kv_heads(), BH = p.batch * p.heads;
    AlignedVector<float> projected(static_cast<std::size_t>(2 * BKV * k * D));
    float* const kp = projected.data();
    float* const vp = kp + BKV * k * D;
    tbb::enumerable_thread_specific<AlignedVector<float>> scratch;
    auto local = [&](int64_t floats) -> float* {
      AlignedVector<float>& buf = scratch.local();
      if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<std::size_t>(floats));
      return buf.data();
    };

    // K' = E K and V' = F V once per K/V head (grouped-query heads share them), in tasks of kProjRows rows of
    // E or F, so even one K/V head spreads over the threads.
    const int64_t row_blocks = ceil_div(k, kProjRows);
    tbb::parallel_for(int64_t{0}, BKV * 2 * row_blocks, [&](int64_t task) {
      const int64_t kv = task / (2 * row_blocks), values = task / row_blocks % 2;
      const int64_t r0 = task % row_blocks * kProjRows, rows = std::min(kProjRows, k - r0);
      const uint8_t* pad = p.mask.key_padding ? in.key_padding + kv / p.num_kv_heads() * n : nullptr;
      float* buf = pad ? local(std::min(kKeyBlock, n) * D) : nullptr;
      project_rows((values ? pr.f : pr.e) + r0 * n, rows, n, (values ? in.v : in.k) + kv * n * D, D, pad, buf,
                   (values ? vp : kp) + (kv * k + r0) * D);
    });

    if (saved) std::copy(projected.begin(), projected.end(), saved + 2 * k * n);

    // Per (batch entry, query head, block of kQueryRows queries): S = scale Q K'ᵀ, softmax over the k
    // columns, O = S V'. A row always has k finite-weight columns (padding zeroes keys, not columns), so no
    // row is empty; with every key padded K' = V' = 0 and the output is 0.
    const int64_t blocks = ceil_div(Lq, kQueryRows);
    const float scale = static_cast<float>(p.effective_scale());
    tbb::parallel_for(int64_t{0}, BH * blocks, [&](int64_t task) {
      const int64_t bh = task / blocks, i0 = task % blocks * kQueryRows, rows = std::min(kQueryRows, Lq - i0);
      const int64_t b = bh / p.heads, h = bh % p.heads, kv = p.kv_block(b, h);
      float* s = local(std::min(kQueryRows, Lq) * k);
      sgemm(false, true, rows, k, D, scale, in.q + (bh * Lq + i0) * D, D, kp + kv * k * D, D, 0.0f, s, k);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = s + r * k;
        const float sum = exp_sub_sum(row, k, row_max(row, k));
        if (p.dropout > 0) {
          const DropoutRow drop(p.dropout, p.seed, b, h, i0 + r);
          const float keep_scale = drop.scale() / sum;
          for (int64_t j = 0; j < k; ++j) row[j] = drop.keep(j) ? row[j] * keep_scale : 0.0f;
        } else {
          scale_row(row, k, 1.0f / sum);
        }
      }
      sgemm(false, false, rows, D, k, 1.0f, s, k, vp + kv * k * D, D, 0.0f, in.out + (bh * Lq + i0) * D, D);
    });
  }
};

// The backward: exact attention's backward on the k projected keys, then back through E and F.
//  1. Per (batch entry, query head), blocks of kQueryRows queries in order: S = scale Q K'ᵀ (E, F, K' and V'
//     are the forward's saved state) and its softmax exactly as the forward computes them (the same GEMM and
//     kernels: the same P), dP̃ = dO V'ᵀ, dS = P (keep kd dP̃ - delta) with delta = dO · O, then dQ = scale dS
//     K' (the block's own rows), and this head's dK' += scale dSᵀ Q, dV' += P̃ᵀ dO (P̃ = P after dropout),
//     blocks added in order.
//  2. Grouped-query heads: dK', dV' of a K/V head are its query heads' summed in head order.
//  3. Per (batch, K/V head, dK or dV, block of kKeyBlock keys): dK = Eᵀ dK' and dV = Fᵀ dV' for those keys;
//     a padded key's rows are 0 (it is not in the definition, and E's column there is not zeroed).
// Every task writes its own outputs and every sum runs in an order fixed by the problem, so the gradients
// are bitwise the same at any thread count; no atomics.
void Linformer::backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const {
  const int64_t k = p.param_int("k"), n = p.seq_kv, D = p.head_dim, Lq = p.seq_q, G = p.group_size();
  const int64_t BKV = p.batch * p.num_kv_heads(), BH = p.batch * p.heads;
  const float* e = g.saved;
  const float* f = e + k * n;
  const float* kp = f + k * n;
  const float* vp = kp + BKV * k * D;
  const float scale = static_cast<float>(p.effective_scale());
  // dK' then dV' (k × d each) per query head.
  AlignedVector<float> per_head(static_cast<std::size_t>(BH * 2 * k * D));
  tbb::enumerable_thread_specific<AlignedVector<float>> scratch;
  const int64_t block_rows = std::min(kQueryRows, Lq);
  const int64_t blocks = ceil_div(Lq, kQueryRows);
  tbb::parallel_for(int64_t{0}, BH, [&](int64_t bh) {
    AlignedVector<float>& buf = scratch.local();
    if (static_cast<int64_t>(buf.size()) < 2 * block_rows * k)
      buf.resize(static_cast<std::size_t>(2 * block_rows * k));
    float* prob = buf.data();
    float* ds = prob + block_rows * k;
    const int64_t b = bh / p.heads, h = bh % p.heads, kv = p.kv_block(b, h);
    const float* kpb = kp + kv * k * D;
    const float* vpb = vp + kv * k * D;
    float* dkp = per_head.data() + bh * 2 * k * D;
    float* dvp = dkp + k * D;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t i0 = blk * kQueryRows, rows = std::min(kQueryRows, Lq - i0);
      const float* q = in.q + (bh * Lq + i0) * D;
      const float* dout = g.d_out + (bh * Lq + i0) * D;
      const float* o = g.out + (bh * Lq + i0) * D;
      sgemm(false, true, rows, k, D, scale, q, D, kpb, D, 0.0f, prob, k);
      sgemm(false, true, rows, k, D, 1.0f, dout, D, vpb, D, 0.0f, ds, k);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = prob + r * k;
        float* drow = ds + r * k;
        float delta = 0;
        for (int64_t c = 0; c < D; ++c) delta += dout[r * D + c] * o[r * D + c];
        const float sum = exp_sub_sum(row, k, row_max(row, k));
        if (p.dropout > 0) {
          // The forward's P̃ (kept weights times drop.scale() / sum), and P = exp / sum for dS.
          const DropoutRow drop(p.dropout, p.seed, b, h, i0 + r);
          const float keep_scale = drop.scale() / sum, inv = 1.0f / sum, kd = drop.scale();
          for (int64_t j = 0; j < k; ++j) {
            const bool kept = drop.keep(j);
            drow[j] = row[j] * inv * ((kept ? drow[j] * kd : 0.0f) - delta);
            row[j] = kept ? row[j] * keep_scale : 0.0f;
          }
        } else {
          scale_row(row, k, 1.0f / sum);
          for (int64_t j = 0; j < k; ++j) drow[j] = row[j] * (drow[j] - delta);
        }
      }
      sgemm(false, false, rows, D, k, scale, ds, k, kpb, D, 0.0f, g.dq + (bh * Lq + i0) * D, D);
      const float beta = blk == 0 ? 0.0f : 1.0f;
      sgemm(true, false, k, D, rows, scale, ds, k, q, D, beta, dkp, D);
      sgemm(true, false, k, D, rows, 1.0f, prob, k, dout, D, beta, dvp, D);
    }
  });

  // dK' and dV' per K/V head: the query head's own without grouped-query heads, else the group's sum.
  AlignedVector<float> sums(p.is_gqa() ? static_cast<std::size_t>(BKV * 2 * k * D) : 0);
  if (p.is_gqa())
    tbb::parallel_for(int64_t{0}, BKV, [&](int64_t kv) {
      const int64_t b = kv / p.num_kv_heads(), h0 = kv % p.num_kv_heads() * G;
      float* dst = sums.data() + kv * 2 * k * D;
      const float* first = per_head.data() + (b * p.heads + h0) * 2 * k * D;
      std::copy(first, first + 2 * k * D, dst);
      for (int64_t h = h0 + 1; h < h0 + G; ++h) {
        const float* src = per_head.data() + (b * p.heads + h) * 2 * k * D;
        for (int64_t x = 0; x < 2 * k * D; ++x) dst[x] += src[x];
      }
    });
  const float* dproj = p.is_gqa() ? sums.data() : per_head.data();

  const int64_t key_blocks = ceil_div(n, kKeyBlock);
  tbb::parallel_for(int64_t{0}, BKV * 2 * key_blocks, [&](int64_t task) {
    const int64_t kv = task / (2 * key_blocks), values = task / key_blocks % 2;
    const int64_t j0 = task % key_blocks * kKeyBlock, len = std::min(kKeyBlock, n - j0);
    const float* proj = values ? f : e;
    float* dst = (values ? g.dv : g.dk) + (kv * n + j0) * D;
    sgemm(true, false, len, D, k, 1.0f, proj + j0, n, dproj + (kv * 2 + values) * k * D, D, 0.0f, dst, D);
    if (p.mask.key_padding) {
      const uint8_t* pad = in.key_padding + kv / p.num_kv_heads() * n + j0;
      for (int64_t j = 0; j < len; ++j)
        if (pad[j]) std::fill(dst + j * D, dst + (j + 1) * D, 0.0f);
    }
  });
}

// Why these bounds: a running error analysis of the backward above, element by element in fp64 from the
// inputs, as exact_grad_tolerance (common/reference/reference.cpp) does for softmax attention, with u = 2^-24
// and gamma_m = m u for an m-term fp32 sum of products in any order. Linformer's backward is exact
// attention's on the projected K', V' (k keys) with two additions: K' and V' carry the forward's projection
// error, |ΔK'_rc| <= n u (|E| |K|)_rc and |ΔV'_rc| <= n u (|F| |V|)_rc (as in abs_tolerance), and the
// gradients of K', V' are pulled back through E, F (k-term sums). Those projection errors are large next to
// rounding (n u worst cases), so where they cancel exactly to first order the bound keeps the cancellation
// (else k = 1, where the one weight is exactly 1 whatever the logits, got a bound 1e3 times the gradient).
// Per query row of head h (kk_r = keep_r / (1 - p), or 1 without dropout):
//  * logit s_r = scale q · K'_r: es_r = scale ((d + 2) u Σ_c |q_c K'_rc| + Σ_c |q_c| ΔK'_rc) (the dot, the
//    scale multiply and its rounding to fp32, K''s error);
//  * weight P_r = exp(s_r - max) / sum moves by P_r (Δs_r - Σ_l P_l Δs_l) from the logits, so relative
//    eps_r = (1 - P_r) es_r + Σ_{l != r} P_l es_l + rnd_r, where rnd_r = 2 u (max - s_r) + Σ_l P_l 2 u
//    (max - s_l) + (k + 10) u covers exp_sub_sum (the argument and log2(e) roundings, here and in the
//    normaliser), the exp polynomial's 1.5 ulp, the k-term sum, 1 / sum and the dropout scale;
//  * O (the forward's, read for delta = dO · O): the logit part Σ_r Δs_r (P̃_r V'_rc - P_r O_c) (P̃ = kk P),
//    bounded by Σ_r es_r |P̃_r V'_rc - P_r O_c|, plus Σ_r P̃_r |V'_rc| (rnd_r + (k + 1) u); V''s error is
//    counted with dP̃ below;
//  * dP̃_r = dO · V'_r: (d + 1) u Σ_c |dO_c V'_rc|; delta: (d + 1) u Σ_c |dO_c O_c| + Σ_c |dO_c| err(O_c);
//  * dS_r = P_r (kk_r dP̃_r - delta): P_r (kk_r err_dP̃_r + err_delta + 3 u |diff_r|) + P_r eps_r |diff_r|, and
//    V''s error, which enters dP̃_r and delta together: P_r Σ_l |kk_r [l = r] - P̃_l| Σ_c |dO_c| ΔV'_lc;
//  * dQ_c = scale Σ_r dS_r K'_rc: scale Σ_r (err_dS_r |K'_rc| + |dS_r| ΔK'_rc + (k + 2) u |dS_r K'_rc|);
//  * dK'_rc = scale Σ dS_r q_c and dV'_rc = Σ P̃_r dO_c over the M = G Lq rows of the group (per head, then
//    the G head sums: M + G terms): scale |q_c| (err_dS_r + (M + G + 2) u |dS_r|) and P̃_r |dO_c| (eps_r +
//    (M + G + 1) u), summed over the rows;
//  * dK_jc = Σ_r E_rj dK'_rc (k terms; E is the same fp32 matrix in the kernel and the definition):
//    Σ_r |E_rj| (err(dK'_rc) + (k + 1) u |dK'_rc|); dV likewise with F. A padded key's gradient is exactly 0.
// Each tolerance is twice the largest elementwise bound (the analysis is first order: the factor covers the
// dropped products of small errors), plus the smallest normal float. The n u projection terms are worst
// cases (real errors grow like sqrt(n)): on the check's inputs the bound is 1e2-1e4 times the actual error,
// and a pull-back through a shifted or swapped E / F still exceeds it many times (tests/test_linformer.cpp).
GradientTolerance Linformer::grad_tolerance(const Problem& p, const AttentionInputs& stored,
                                            const float* d_out) const {
  const WideInputs wide(p, stored);
  const AttentionInputs& in = wide.get();
  const Projections pr(p);
  const int64_t k = p.param_int("k"), n = p.seq_kv, D = p.head_dim, Lq = p.seq_q, G = p.group_size();
  const int64_t BKV = p.batch * p.num_kv_heads();
  const double u = std::ldexp(1.0, -24), scale = p.effective_scale();
  const double kd = p.dropout > 0 ? 1.0 / (1.0 - p.dropout) : 1.0;
  const double rows_in = static_cast<double>(G * Lq + G);  // terms of one dK' / dV' sum
  std::vector<double> worst(static_cast<std::size_t>(3 * BKV), 0.0);
  tbb::parallel_for(int64_t{0}, BKV, [&](int64_t kv) {
    const ProjectedBlock pb = project_fp64(p, in, pr, kv, true);
    const int64_t b = kv / p.num_kv_heads(), kvh = kv % p.num_kv_heads();
    const std::size_t KD = static_cast<std::size_t>(k * D);
    // Projection errors, and per (r, c) the exact dK', dV' and their error bounds.
    std::vector<double> ekp(KD), evp(KD), dkp(KD, 0.0), dvp(KD, 0.0), e_dkp(KD, 0.0), e_dvp(KD, 0.0);
    for (std::size_t e = 0; e < KD; ++e)
      ekp[e] = static_cast<double>(n) * u * pb.a[e], evp[e] = static_cast<double>(n) * u * pb.b[e];
    std::vector<double> s(static_cast<std::size_t>(k)), es(s.size()), w(s.size()), wd(s.size()), kk(s.size()),
        rnd(s.size()), eps(s.size()), dp(s.size()), dp_err(s.size()), dp_proj(s.size()), ds(s.size()),
        eds(s.size()), o(static_cast<std::size_t>(D)), eo(o.size());
    double wq = 0;
    for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
      const int64_t bh = b * p.heads + h;
      for (int64_t i = 0; i < Lq; ++i) {
        const float* q = in.q + (bh * Lq + i) * D;
        const float* g = d_out + (bh * Lq + i) * D;
        double mx = -std::numeric_limits<double>::infinity(), es_max = 0;
        for (int64_t r = 0; r < k; ++r) {
          double acc = 0, mag = 0, proj = 0;
          for (int64_t c = 0; c < D; ++c) {
            const double t = static_cast<double>(q[c]) * pb.kp[r * D + c];
            acc += t, mag += std::fabs(t), proj += std::fabs(static_cast<double>(q[c])) * ekp[r * D + c];
          }
          s[r] = scale * acc;
          es[r] = scale * (static_cast<double>(D + 2) * u * mag + proj);
          mx = std::max(mx, s[r]);
          es_max = std::max(es_max, es[r]);
        }
        if (!std::isfinite(mx)) continue;  // NaN or Inf inputs: no bound to give
        double sum = 0, spread = 0, es_bar = 0;
        for (int64_t r = 0; r < k; ++r) sum += std::exp(s[r] - mx);
        for (int64_t r = 0; r < k; ++r) {
          w[r] = std::exp(s[r] - mx) / sum;
          spread += w[r] * 2 * u * (mx - s[r]);
          es_bar += w[r] * es[r];
        }
        const DropoutRow drop = p.dropout > 0 ? DropoutRow(p.dropout, p.seed, b, h, i) : DropoutRow();
        for (int64_t r = 0; r < k; ++r) {
          kk[r] = p.dropout > 0 ? (drop.keep(r) ? kd : 0.0) : 1.0;
          wd[r] = kk[r] * w[r];
          rnd[r] = 2 * u * (mx - s[r]) + spread + static_cast<double>(k + 10) * u;
          // |ΔP_r| / P_r: the logits' part |Δs_r - Σ_l P_l Δs_l| and the rounding part.
          eps[r] = (1 - w[r]) * es[r] + (es_bar - w[r] * es[r]) + rnd[r];
        }
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t r = 0; r < k; ++r)
          for (int64_t c = 0; c < D; ++c) o[c] += wd[r] * pb.vp[r * D + c];
        // O's rounding error (weights and the k-term sum), and its logit part Σ_r Δs_r (P̃_r V'_rc - P_r O_c).
        std::fill(eo.begin(), eo.end(), 0.0);
        for (int64_t r = 0; r < k; ++r)
          for (int64_t c = 0; c < D; ++c) {
            const double vrc = pb.vp[r * D + c];
            eo[c] += wd[r] * std::fabs(vrc) * (rnd[r] + static_cast<double>(k + 1) * u) +
                     es[r] * std::fabs(wd[r] * vrc - w[r] * o[c]);
          }
        double delta = 0, e_delta = 0;
        for (int64_t c = 0; c < D; ++c) {
          const double gc = g[c];
          delta += gc * o[c];
          e_delta += static_cast<double>(D + 1) * u * std::fabs(gc * o[c]) + std::fabs(gc) * eo[c];
        }
        double proj_bar = 0;  // Σ_l P̃_l Σ_c |dO_c| ΔV'_lc: V''s error in delta
        for (int64_t r = 0; r < k; ++r) {
          double acc = 0, mag = 0, proj = 0;
          for (int64_t c = 0; c < D; ++c) {
            const double t = static_cast<double>(g[c]) * pb.vp[r * D + c];
            acc += t, mag += std::fabs(t), proj += std::fabs(static_cast<double>(g[c])) * evp[r * D + c];
          }
          dp[r] = acc, dp_err[r] = static_cast<double>(D + 1) * u * mag, dp_proj[r] = proj;
          proj_bar += wd[r] * proj;
        }
        for (int64_t r = 0; r < k; ++r) {
          const double diff = kk[r] * dp[r] - delta;
          ds[r] = w[r] * diff;
          // V''s error enters dP̃_r and delta together: P_r Σ_l (kk_r [l = r] - P̃_l) dO · ΔV'_l.
          const double v_err = proj_bar - wd[r] * dp_proj[r] + std::fabs(kk[r] - wd[r]) * dp_proj[r];
          eds[r] = w[r] * (kk[r] * dp_err[r] + e_delta + v_err + 3 * u * std::fabs(diff)) +
                   w[r] * eps[r] * std::fabs(diff);
        }
        for (int64_t c = 0; c < D; ++c) {
          double e = 0, mag = 0;
          for (int64_t r = 0; r < k; ++r) {
            const double kprc = pb.kp[r * D + c];
            e += eds[r] * std::fabs(kprc) + std::fabs(ds[r]) * ekp[r * D + c];
            mag += std::fabs(ds[r] * kprc);
          }
          wq = std::max(wq, scale * (e + static_cast<double>(k + 2) * u * mag));
        }
        for (int64_t r = 0; r < k; ++r) {
          for (int64_t c = 0; c < D; ++c) {
            const double qc = q[c], gc = g[c];
            dkp[r * D + c] += scale * ds[r] * qc;
            dvp[r * D + c] += wd[r] * gc;
            e_dkp[r * D + c] += scale * std::fabs(qc) * (eds[r] + (rows_in + 2) * u * std::fabs(ds[r]));
            e_dvp[r * D + c] += wd[r] * std::fabs(gc) * (eps[r] + (rows_in + 1) * u);
          }
        }
      }
    }
    double wk = 0, wv = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (p.mask.key_padding && in.key_padding[b * n + j]) continue;
      for (int64_t c = 0; c < D; ++c) {
        double ek = 0, ev = 0;
        for (int64_t r = 0; r < k; ++r) {
          const double er = std::fabs(static_cast<double>(pr.e[static_cast<std::size_t>(r * n + j)]));
          const double fr = std::fabs(static_cast<double>(pr.f[static_cast<std::size_t>(r * n + j)]));
          ek += er * (e_dkp[r * D + c] + static_cast<double>(k + 1) * u * std::fabs(dkp[r * D + c]));
          ev += fr * (e_dvp[r * D + c] + static_cast<double>(k + 1) * u * std::fabs(dvp[r * D + c]));
        }
        wk = std::max(wk, ek), wv = std::max(wv, ev);
      }
    }
    worst[static_cast<std::size_t>(3 * kv)] = wq;
    worst[static_cast<std::size_t>(3 * kv + 1)] = wk;
    worst[static_cast<std::size_t>(3 * kv + 2)] = wv;
  });
  GradientTolerance t;
  for (int64_t x = 0; x < BKV; ++x) {
    t.dq = std::max(t.dq, worst[static_cast<std::size_t>(3 * x)]);
    t.dk = std::max(t.dk, worst[static_cast<std::size_t>(3 * x + 1)]);
    t.dv = std::max(t.dv, worst[static_cast<std::size_t>(3 * x + 2)]);
  }
  const double tiny = std::numeric_limits<float>::min();
  t.dq = 2 * t.dq + tiny, t.dk = 2 * t.dk + tiny, t.dv = 2 * t.dv + tiny;
  return t;
}

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::Linformer)
