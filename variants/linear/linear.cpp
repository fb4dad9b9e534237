// linear: kernelised attention (Katharopoulos et al. 2020), φ(Q)(φ(K)ᵀV) / (φ(Q)(φ(K)ᵀ1) + eps) in O(n·d²)
// time by associativity; causal runs in chunks with a running d×d state.
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>

#include "common/aligned.hpp"
#include "common/attention.hpp"
#include "common/error.hpp"
#include "common/mask.hpp"
#include "common/runtime.hpp"
#include "common/util.hpp"
#include "common/vmath.hpp"

namespace attn {
namespace {

enum class FeatureMap { elu, relu };

// Rows per task when applying the non-causal state to the queries, and keys per block when building it:
// large enough for BLAS to run near peak, small enough that a block of φ stays in L2.
constexpr int64_t kQueryRows = 256;
constexpr int64_t kKeyRows = 512;

FeatureMap feature_map_of(const Problem& p) {
  return p.param_string("feature_map") == "relu" ? FeatureMap::relu : FeatureMap::elu;
}

// dst = φ(src) for `n` values, one vectorised pass on the selected SIMD target (common/vmath.hpp). elu(x) + 1
// is x + 1 for x > 0 and exp(x) for x <= 0 (so φ > 0 always); relu(x) = max(x, 0) can be 0 for a whole row,
// which eps then guards. A NaN input stays NaN in both.
void apply_feature_map(FeatureMap fm, const float* src, float* dst, int64_t n) {
  if (fm == FeatureMap::relu)
    relu(src, dst, n);
  else
    elu_plus_one(src, dst, n);
}

double feature_map_fp64(FeatureMap fm, double x) {
  if (fm == FeatureMap::relu) return std::max(x, 0.0);
  return x > 0 ? x + 1.0 : std::exp(x);
}

// φ of `rows` key rows into `dst`; padded keys become zero rows, so they add nothing to any numerator or
// denominator. Also adds the column sums of the result into `col_sum` (the normaliser's φ(K)ᵀ1).
void key_features(const Problem& p, const AttentionInputs& in, FeatureMap fm, int64_t b, int64_t j0,
                  int64_t rows, const float* k, float* dst, float* col_sum) {
  const int64_t D = p.head_dim;
  apply_feature_map(fm, k, dst, rows * D);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = dst + r * D;
    if (p.mask.key_padding && in.key_padding[b * p.seq_kv + j0 + r]) std::fill(row, row + D, 0.0f);
    for (int64_t d = 0; d < D; ++d) col_sum[d] += row[d];
  }
}

// out row = numerator / (denominator + eps); a row with no allowed key has both 0 and gets 0.
void normalise_rows(const float* num, int64_t ld_num, const float* den, int64_t ld_den, float eps,
                    int64_t rows, int64_t dim, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / (den[r * ld_den] + eps);
    for (int64_t d = 0; d < dim; ++d) out[r * dim + d] = num[r * ld_num + d] * inv;
  }
}

class Linear final : public Attention {
 public:
  std::string name() const override { return "linear"; }
  std::string description() const override {
    return "linear attention phi(Q)(phi(K)^T V) / phi(Q)(phi(K)^T 1), phi = elu+1 or relu; causal in chunks, "
           "O(n·d²)";
  }
  Capabilities capabilities() const override {
    // Arbitrary boolean masks would need the quadratic form (the reordering needs a mask that factorises:
    // causal and key padding do), so they are not supported; nor is dropout on weights it never forms.
    return {.exact = false,
            .causal = true,
            .causal_lower_right = true,
            .gqa = true,
            .boolean_mask = false,
            .key_padding = true,
            .cross = true,
            .dropout = false,
            .permutation_equivariant = true};
  }
  std::vector<ParamSpec> param_specs() const override {
    return {{.name = "feature_map",
             .type = ParamType::string,
             .default_value = "elu",
             .help = "phi applied to queries and keys: elu (elu(x)+1, always > 0) or relu",
             .choices = {"elu", "relu"}},
            {.name = "chunk",
             .type = ParamType::integer,
             .default_value = 64,
             .help = "causal only: positions per chunk (masked quadratic form inside, d x d state across)",
             .min = 1,
             .max = 65536},
            {.name = "eps",
             .type = ParamType::number,
             .default_value = 1e-6,
             .help = "added to every denominator phi(q).sum_j phi(k_j), so rows whose weights are all 0 "
                     "(relu, or every key masked) give 0, not NaN",
             .min = 1e-30,
             .max = 1.0}};
  }
  std::vector<Json> test_param_sets() const override {
    // Chunks of 1, 5 (not dividing any check length) and 16 run the multi-chunk causal path on seq 7..130.
    return {Json::object(),
            {{"chunk", 5}},
            {{"chunk", 1}, {"feature_map", "relu"}},
            {{"chunk", 16}, {"feature_map", "relu"}, {"eps", 1e-3}}};
  }

  double flops(const Problem& p) const override {
    // Per head, the multiply-adds that matter: φ(K)ᵀV (2·Lkv·d²), φ(Q) times the d×(d+1) state
    // (2·Lq·d·(d+1)), and, causal, the lower triangle of each chunk's φ(Q)φ(K)ᵀ and its product with V (≈
    // 2·Lq·(C+1)·d). The feature map, the masked upper triangles and the final division are not counted.
    const double D = static_cast<double>(p.head_dim), Lq = static_cast<double>(p.seq_q);
    // Causal folds only the keys the last query sees into the state.
    const double Lkv = static_cast<double>(causal_key_end(p, p.seq_q - 1));
    double per_head = 2.0 * Lkv * D * D + 2.0 * Lq * D * (D + 1);
    if (p.mask.any_causal())
      per_head += 2.0 * Lq * static_cast<double>(std::min(p.param_int("chunk"), p.seq_q) + 1) * D;
    return per_head * static_cast<double>(p.batch * p.heads);
  }

  std::size_t workspace_bytes(const Problem& p, int threads) const override {
    // Saturating (common/util.hpp): head_dim² alone exceeds 64 bits at head_dim 2^40, a valid size.
    const std::size_t D = to_size(p.head_dim), T = to_size(std::max(threads, 1));
    if (p.mask.any_causal()) return sat_mul(T, causal_scratch_floats(p), sizeof(float));
    const std::size_t states = sat_mul(to_size(p.batch * p.num_kv_heads()), D, D + 1);  // one per K/V head
    const std::size_t per_thread =
        std::max(sat_mul(kKeyRows, D), sat_add(sat_mul(kQueryRows, D + 1), sat_mul(kQueryRows, D)));
    return sat_mul(sat_add(states, sat_mul(T, per_thread)), sizeof(float));
  }

  void forward(const Problem& p, const AttentionInputs& in) const override {
    if (auto reasons = not_supported_reasons(p); !reasons.empty())
      throw NotSupported("linear: " + reasons.front());
    if (p.mask.any_causal())
      forward_causal(p, in);
    else
      forward_full(p, in);
  }

  // The fp64 quadratic definition: w_ij = φ(q_i)·φ(k_j) over allowed keys (causal, padding), out_i =
  // Σ w_ij v_j / (Σ w_ij + eps). No reordering, so it checks the associativity and the chunking.
  void reference_forward(const Problem& p, const AttentionInputs& in, double* out) const override {
    const FeatureMap fm = feature_map_of(p);
    const double eps = p.param_number("eps");
    const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv;
    std::vector<double> fq(static_cast<std::size_t>(D)), fk(static_cast<std::size_t>(Lkv * D));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h) {
        const int64_t bh = b * p.heads + h, kv = p.kv_block(b, h);
        for (int64_t e = 0; e < Lkv * D; ++e) fk[e] = feature_map_fp64(fm, in.k[kv * Lkv * D + e]);
        for (int64_t i = 0; i < Lq; ++i) {
          for (int64_t d = 0; d < D; ++d) fq[d] = feature_map_fp64(fm, in.q[(bh * Lq + i) * D + d]);
          double* o = out + (bh * Lq + i) * D;
          std::fill(o, o + D, 0.0);
          double den = 0;
          for (int64_t j = 0; j < Lkv; ++j) {
            if (!key_allowed(p, in, b, i, j)) continue;
            double w = 0;
            for (int64_t d = 0; d < D; ++d) w += fq[d] * fk[j * D + d];
            den += w;
            for (int64_t d = 0; d < D; ++d) o[d] += w * in.v[(kv * Lkv + j) * D + d];
          }
          for (int64_t d = 0; d < D; ++d) o[d] /= den + eps;
        }
      }
  }

  // Why this bound. With u = 2^-24, L = the keys a row sums over (≤ seq_kv) and w_ij = φ(q_i)·φ(k_j):
  //  * φ in fp32 is within 2u relative (one rounding for x + 1; Highway's exp is within 1 ulp), so each
  //  product
  //    φ(q)_e φ(k)_e is within 5u relative;
  //  * every term of the numerator, φ(q_i)_e φ(k_j)_e v_jd, and of the denominator is a product of those, and
  //    however the sums are associated (per key, per feature, chunk by chunk through the state) a sum of
  //    d·L terms has error ≤ (d + L) u times the sum of their magnitudes (pairwise-or-better in BLAS is even
  //    smaller); φ ≥ 0, so those magnitudes sum to Σ_j w_ij |v_jd| ≤ max|v| Σ_j w_ij for the numerator and to
  //    the denominator itself;
  //  * out = num / (den + eps): |Δout| ≤ |Δnum| / den + |out| |Δden| / den ≤ 2 (d + L + 8) u max|v|.
  // We allow 4x that, as the softmax bound does, since blocked BLAS orders sums differently from the
  // analysis. A wrong mask, chunk boundary or state update moves outputs by a fraction of max|v|, far above
  // this.
  double abs_tolerance(const Problem& p, const AttentionInputs& in) const override {
    double vmax = 0;
    for (int64_t e = 0; e < p.kv_elements(); ++e)
      vmax = std::max(vmax, std::fabs(static_cast<double>(in.v[e])));
    const double u = std::ldexp(1.0, -24);
    return 4.0 * 2.0 * static_cast<double>(p.head_dim + p.seq_kv + 8) * u * vmax + 1e-30;
  }

 protected:
  std::vector<std::string> extra_not_supported_reasons(const Problem& p) const override {
    // φ(q)·φ(k) is not a logit, so there is no temperature to set; ignoring a requested scale would hide it.
    if (p.scale)
      return {
          "linear attention has no logit scale (phi(q).phi(k) is not a softmax logit); leave scale unset"};
    return {};
  }

 private:
  static std::size_t causal_scratch_floats(const Problem& p) {
    const std::size_t D = to_size(p.head_dim), C = to_size(std::min(p.param_int("chunk"), p.seq_q));
    // φ(Q) and φ(K) chunks, the C×C scores, the C×(d+1) numerator|denominator, the state, a column sum, and
    // (lower-right, seq_kv > seq_q) a block of φ for folding the keys every query sees. Saturating: this is
    // also the workspace estimate of problems far too large to run.
    const std::size_t prefix = p.mask.any_causal() && causal_offset(p) > 0 ? sat_mul(kKeyRows, D) : 0;
    return sat_add(sat_mul(2, C, D), sat_mul(C, C), sat_mul(C, D + 1), sat_mul(D, D + 1), D, prefix);
  }

  // Adds keys [j0, j1) of K/V block `kv` (batch entry b) into state = [φ(K)ᵀV | φ(K)ᵀ1] (d × (d+1)), in
  // blocks of kKeyRows; `buf` holds kKeyRows × d floats, col_sum d.
  static void fold_keys(const Problem& p, const AttentionInputs& in, FeatureMap fm, int64_t b, int64_t kv,
                        int64_t j0, int64_t j1, float* state, float* col_sum, float* buf) {
    const int64_t D = p.head_dim, Lkv = p.seq_kv, ld_state = D + 1;
    for (int64_t j = j0; j < j1; j += kKeyRows) {
      const int64_t rows = std::min(kKeyRows, j1 - j);
      std::fill(col_sum, col_sum + D, 0.0f);
      key_features(p, in, fm, b, j, rows, in.k + (kv * Lkv + j) * D, buf, col_sum);
      sgemm(true, false, D, D, rows, 1.0f, buf, D, in.v + (kv * Lkv + j) * D, D, 1.0f, state, ld_state);
      for (int64_t d = 0; d < D; ++d) state[d * ld_state + D] += col_sum[d];
    }
  }

  // Non-causal: per K/V head, state = [φ(K)ᵀV | φ(K)ᵀ1] (d × (d+1)), shared by the query heads of its group
  // (grouped-query attention builds it once per K/V head); then every query block is one GEMM with it.
  static void forward_full(const Problem& p, const AttentionInputs& in) {
    const FeatureMap fm = feature_map_of(p);
    const float eps = static_cast<float>(p.param_number("eps"));
    const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv, BH = p.batch * p.heads, ld_state = D + 1;
    const int64_t BKV = p.batch * p.num_kv_heads();
    AlignedVector<float> states(static_cast<std::size_t>(BKV * D * ld_state), 0.0f);
    tbb::enumerable_thread_specific<AlignedVector<float>> scratch;

    tbb::parallel_for(int64_t{0}, BKV, [&](int64_t kv) {
      AlignedVector<float>& buf = scratch.local();
      if (static_cast<int64_t>(buf.size()) < kKeyRows * D + D) buf.resize(kKeyRows * D + D);
      fold_keys(p, in, fm, kv / p.num_kv_heads(), kv, 0, Lkv, states.data() + kv * D * ld_state,
                buf.data() + kKeyRows * D, buf.data());
    });

    const int64_t blocks = (Lq + kQueryRows - 1) / kQueryRows;
    tbb::parallel_for(int64_t{0}, BH * blocks, [&](int64_t task) {
      const int64_t bh = task / blocks, i0 = task % blocks * kQueryRows, rows = std::min(kQueryRows, Lq - i0);
      AlignedVector<float>& buf = scratch.local();
      const int64_t need = kQueryRows * D + kQueryRows * ld_state;
      if (static_cast<int64_t>(buf.size()) < need) buf.resize(need);
      float* fq = buf.data();
      float* nd = fq + kQueryRows * D;
      apply_feature_map(fm, in.q + (bh * Lq + i0) * D, fq, rows * D);
      const int64_t kv = p.kv_block(bh / p.heads, bh % p.heads);
      sgemm(false, false, rows, ld_state, D, 1.0f, fq, D, states.data() + kv * D * ld_state, ld_state, 0.0f,
            nd, ld_state);
      normalise_rows(nd, ld_state, nd + D, ld_state, eps, rows, D, in.out + (bh * Lq + i0) * D);
    });
  }

  // Causal, one head per task, chunk by chunk: inside a chunk the masked quadratic form (φ(Q_c)φ(K_c)ᵀ ⊙
  // tril) [V_c | 1]; across chunks the running state S = Σ_{j before the chunk} φ(k_j) [v_j | 1]ᵀ. Query i
  // attends keys j <= i + c (mask.hpp causal_offset: c = 0 upper-left, seq_kv - seq_q lower-right), so the
  // chunk of queries [c0, c0 + C) meets the diagonal keys [c0 + c, c0 + c + C): keys before c0 + c are in
  // the state (with c > 0, keys [0, c) are folded in before the first chunk: every query sees them), and
  // with c < 0 the first -c queries see no key and get 0.
  static void forward_causal(const Problem& p, const AttentionInputs& in) {
    const FeatureMap fm = feature_map_of(p);
    const float eps = static_cast<float>(p.param_number("eps"));
    const int64_t D = p.head_dim, Lq = p.seq_q, Lkv = p.seq_kv, ld_state = D + 1;
    const int64_t C = std::min(p.param_int("chunk"), Lq), off = causal_offset(p);
    tbb::enumerable_thread_specific<AlignedVector<float>> scratch;

    tbb::parallel_for(int64_t{0}, p.batch * p.heads, [&](int64_t bh) {
      AlignedVector<float>& buf = scratch.local();
      if (buf.size() < causal_scratch_floats(p)) buf.resize(causal_scratch_floats(p));
      float* fq = buf.data();
      float* fk = fq + C * D;
      float* a = fk + C * D;
      float* nd = a + C * C;
      float* state = nd + C * ld_state;
      float* col_sum = state + D * ld_state;
      float* prefix = col_sum + D;  // kKeyRows x d: φ of the keys every query sees (off > 0)
      std::fill(state, state + D * ld_state + D, 0.0f);                  // state and col_sum
      const int64_t b = bh / p.heads, kv = p.kv_block(b, bh % p.heads);  // grouped-query: the shared K/V
      if (off > 0) fold_keys(p, in, fm, b, kv, 0, std::min(off, Lkv), state, col_sum, prefix);

      for (int64_t c0 = 0; c0 < Lq; c0 += C) {
        const int64_t nq = std::min(C, Lq - c0);
        // This chunk's diagonal keys [ka, kb): row r may see keys j <= c0 + r + off.
        const int64_t kd = c0 + off, ka = std::clamp<int64_t>(kd, 0, Lkv),
                      kb = std::clamp<int64_t>(kd + nq, 0, Lkv), nk = kb - ka;
        apply_feature_map(fm, in.q + (bh * Lq + c0) * D, fq, nq * D);
        // Inter-chunk part first: nd = φ(Q_c) S (both numerator and denominator columns).
        sgemm(false, false, nq, ld_state, D, 1.0f, fq, D, state, ld_state, 0.0f, nd, ld_state);
        if (nk > 0) {
          const float* v = in.v + (kv * Lkv + ka) * D;
          std::fill(col_sum, col_sum + D, 0.0f);
          key_features(p, in, fm, b, ka, nk, in.k + (kv * Lkv + ka) * D, fk, col_sum);
          // Intra-chunk: A = φ(Q_c) φ(K_c)ᵀ with the future zeroed, its row sums into the denominator column.
          sgemm(false, true, nq, nk, D, 1.0f, fq, D, fk, D, 0.0f, a, nk);
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
          sgemm(true, false, D, D, nk, 1.0f, fk, D, v, D, 1.0f, state, ld_state);
          for (int64_t d = 0; d < D; ++d) state[d * ld_state + D] += col_sum[d];
        }
        normalise_rows(nd, ld_state, nd + D, ld_state, eps, nq, D, in.out + (bh * Lq + c0) * D);
      }
    });
  }
};

}  // namespace
}  // namespace attn

ATTN_REGISTER_VARIANT(attn::Linear)
