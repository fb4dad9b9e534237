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

#include "common/aligned.hpp"
#include "common/attention.hpp"
#include "common/dropout.hpp"
#include "common/half.hpp"
#include "common/runtime.hpp"
#include "common/util.hpp"
#include "common/vmath.hpp"
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
struct Projections {
  AlignedVector<float> e, f;
  explicit Projections(const Problem& p) {
    const int64_t k = p.param_int("k"), n = p.seq_kv;
    const auto seed = static_cast<uint64_t>(p.param_int("seed"));
    e.resize(static_cast<std::size_t>(k * n));
    f.resize(static_cast<std::size_t>(k * n));
    linformer::fill_projection(seed, Stream::keys, k, n, e.data());
    linformer::fill_projection(seed, Stream::values, k, n, f.data());
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
    // the shared DropoutRow (j = the projected key's index).
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
            .permutation_equivariant = false};
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
    // copies of Q, K and V. Saturating (common/util.hpp): k × n alone can exceed 64 bits for valid sizes.
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
  //  * as in exact_abs_tolerance (common/reference.cpp), logits moved by at most Δs change each softmax
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
    const WideInputs wide(p, stored);  // bf16 / fp16: converted to fp32 once, up front
    const AttentionInputs& in = wide.get();
    const Projections pr(p);
    const int64_t k = p.param_int("k"), n = p.seq_kv, D = p.head_dim, Lq = p.seq_q;
    const int64_t BKV = p.batch * p.num_kv_heads(), BH = p.batch * p.heads;
    AlignedVector<float> kp(static_cast<std::size_t>(BKV * k * D)), vp(kp.size());
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
      project_rows((values ? pr.f : pr.e).data() + r0 * n, rows, n, (values ? in.v : in.k) + kv * n * D, D,
                   pad, buf, (values ? vp : kp).data() + (kv * k + r0) * D);
    });

    // Per (batch entry, query head, block of kQueryRows queries): S = scale Q K'ᵀ, softmax over the k
    // columns, O = S V'. A row always has k finite-weight columns (padding zeroes keys, not columns), so no
    // row is empty; with every key padded K' = V' = 0 and the output is 0.
    const int64_t blocks = ceil_div(Lq, kQueryRows);
    const float scale = static_cast<float>(p.effective_scale());
    tbb::parallel_for(int64_t{0}, BH * blocks, [&](int64_t task) {
      const int64_t bh = task / blocks, i0 = task % blocks * kQueryRows, rows = std::min(kQueryRows, Lq - i0);
      const int64_t b = bh / p.heads, h = bh % p.heads, kv = p.kv_block(b, h);
      float* s = local(std::min(kQueryRows, Lq) * k);
      sgemm(false, true, rows, k, D, scale, in.q + (bh * Lq + i0) * D, D, kp.data() + kv * k * D, D, 0.0f, s,
            k);
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
      sgemm(false, false, rows, D, k, 1.0f, s, k, vp.data() + kv * k * D, D, 0.0f,
            in.out + (bh * Lq + i0) * D, D);
    });
  }
};

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::Linformer)
