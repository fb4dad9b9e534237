// The shared front ends: token embeddings and tokenisation, positional encodings, and the multi-head layer
// (checked against a straightforward fp64 implementation written here, independent of
// common/frontends/multihead.cpp).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>

#include "common/frontends/embedding.hpp"
#include "common/frontends/multihead.hpp"
#include "common/frontends/positional.hpp"
#include "common/interface/attention.hpp"
#include "common/io/npy.hpp"
#include "common/kernels/rope.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace attn;
using attn::test::ScratchDir;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

constexpr double kU = 0x1.0p-24;  // fp32 unit roundoff

// ---------------------------------------------------------------------------------------------------------
// Independent fp64 multi-head attention, straight from the definitions (torch.nn.MultiheadAttention
// semantics): projections y = x W^T + b, head h = columns [h*D, (h+1)*D), softmax(scale q.k) over allowed
// keys (a row with none gives zeros), merge, out projection, optional residual. Alongside the output it
// returns a derived bound on |fp32 layer - fp64| (see bound below).
struct ReferenceResult {
  std::vector<double> y;  // [B, Lq, E]
  double tolerance = 0;
};

double gamma_n(double n) {
  return n * kU / (1.0 - n * kU);
}  // Higham's gamma_n: n roundings of relative u

// Projection of in [B, L, E] by (W [O, E], b) into out [B, L, O]; mag receives max over outputs of
// sum_i |x_i W_oi| + |b_o|, the size of what fp32 sums.
void project(const FloatArray& in, const FloatArray& W, const FloatArray& b, std::vector<double>& out,
             double& mag) {
  const int64_t rows = in.shape[0] * in.shape[1], E = in.shape[2], O = W.shape[0];
  out.assign(static_cast<std::size_t>(rows * O), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < O; ++o) {
      double acc = b.numel() ? b.data[o] : 0.0, m = b.numel() ? std::fabs(b.data[o]) : 0.0;
      for (int64_t i = 0; i < E; ++i) {
        acc += static_cast<double>(in.data[r * E + i]) * W.data[o * E + i];
        m += std::fabs(static_cast<double>(in.data[r * E + i]) * W.data[o * E + i]);
      }
      out[r * O + o] = acc;
      mag = std::max(mag, m);
    }
}

double max_abs(const std::vector<double>& t) {
  double m = 0;
  for (double e : t) m = std::max(m, std::fabs(e));
  return m;
}

// RoPE (apply_rope_fp64) on each head's [L, D] columns of t ([B, L, H * D]), positions 0 .. L-1 (the layer
// has no lower-right mask, so no query offset).
void rotate_heads(const RopeSpec& rope, std::vector<double>& t, int64_t B, int64_t L, int64_t H, int64_t D) {
  const int64_t E = H * D;
  std::vector<double> head(static_cast<std::size_t>(L * D)), turned(head.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t l = 0; l < L; ++l)
        for (int64_t d = 0; d < D; ++d) head[l * D + d] = t[(b * L + l) * E + h * D + d];
      apply_rope_fp64(rope, head.data(), turned.data(), 1, L, D, 0);
      for (int64_t l = 0; l < L; ++l)
        for (int64_t d = 0; d < D; ++d) t[(b * L + l) * E + h * D + d] = turned[l * D + d];
    }
}

// Largest per-head row norm of t ([rows, H * D]): what bounds a logit by Cauchy-Schwarz.
double max_head_norm(const std::vector<double>& t, int64_t H, int64_t D) {
  const int64_t E = H * D;
  double best = 0;
  for (std::size_t row = 0; row < t.size() / static_cast<std::size_t>(E); ++row)
    for (int64_t h = 0; h < H; ++h) {
      double n2 = 0;
      for (int64_t d = 0; d < D; ++d) n2 += t[row * E + h * D + d] * t[row * E + h * D + d];
      best = std::max(best, std::sqrt(n2));
    }
  return best;
}

// Softmax attention of every head (q, k [B, L, H * D], v [B, Lkv, H * Dv]), the heads' outputs
// concatenated: [B, Lq, H * Dv].
std::vector<double> attend_heads(const std::vector<double>& q, const std::vector<double>& k,
                                 const std::vector<double>& v, int64_t B, int64_t Lq, int64_t Lkv, int64_t H,
                                 int64_t D, int64_t Dv, bool causal, const ByteArray* pad) {
  const int64_t Eqk = H * D, E = H * Dv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> merged(static_cast<std::size_t>(B * Lq * E), 0.0), s(static_cast<std::size_t>(Lkv));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Lq; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Lkv; ++j) {
          const bool allowed = !(causal && j > i) && !(pad && pad->data[b * Lkv + j]);
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += q[(b * Lq + i) * Eqk + h * D + d] * k[(b * Lkv + j) * Eqk + h * D + d];
          s[j] = allowed ? dot * scale : -std::numeric_limits<double>::infinity();
          mx = std::max(mx, s[j]);
        }
        if (std::isinf(mx)) continue;  // no allowed key: zero attention row
        double sum = 0;
        for (int64_t j = 0; j < Lkv; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < Lkv; ++j)
          for (int64_t d = 0; d < Dv; ++d)
            merged[(b * Lq + i) * E + h * Dv + d] += s[j] / sum * v[(b * Lkv + j) * E + h * Dv + d];
      }
  return merged;
}

ReferenceResult reference_layer(const MultiHeadWeights& w, int64_t H, const FloatArray& x,
                                const FloatArray* ctx, bool causal, const ByteArray* pad, bool residual,
                                const RopeSpec& rope = {}) {
  const FloatArray& kv = ctx ? *ctx : x;
  const int64_t B = x.shape[0], Lq = x.shape[1], Lkv = kv.shape[1], E = x.shape[2], D = w.w_q.shape[0] / H,
                Dv = E / H;
  std::vector<double> q, k, v;
  double mag_q = 0, mag_k = 0, mag_v = 0, mag_o = 0;
  project(x, w.w_q, w.b_q, q, mag_q);
  project(kv, w.w_k, w.b_k, k, mag_k);
  project(kv, w.w_v, w.b_v, v, mag_v);
  // The fp32 rotation of an element, a cos - b sin with cos and sin rounded once, adds at most about
  // 3 u (|a| + |b|) <= 6 u max|q| to it (rotations keep the row norms, so q_norm and k_norm below hold).
  const double rope_dq = rope.on() ? 6.0 * kU * max_abs(q) : 0.0,
               rope_dk = rope.on() ? 6.0 * kU * max_abs(k) : 0.0;
  if (rope.on()) {
    rotate_heads(rope, q, B, Lq, H, D);
    rotate_heads(rope, k, B, Lkv, H, D);
  }
  const double q_norm = max_head_norm(q, H, D), k_norm = max_head_norm(k, H, D), v_max = max_abs(v);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const std::vector<double> merged = attend_heads(q, k, v, B, Lq, Lkv, H, D, Dv, causal, pad);
  ReferenceResult r;
  r.y.assign(static_cast<std::size_t>(B * Lq * E), 0.0);
  double w_o_row_l1 = 0;
  for (int64_t o = 0; o < E; ++o) {
    double l1 = 0;
    for (int64_t e = 0; e < E; ++e) l1 += std::fabs(w.w_o.data[o * E + e]);
    w_o_row_l1 = std::max(w_o_row_l1, l1);
  }
  for (int64_t row = 0; row < B * Lq; ++row)
    for (int64_t o = 0; o < E; ++o) {
      double acc = w.b_o.numel() ? w.b_o.data[o] : 0.0, m = w.b_o.numel() ? std::fabs(w.b_o.data[o]) : 0.0;
      for (int64_t e = 0; e < E; ++e) {
        acc += merged[row * E + e] * w.w_o.data[o * E + e];
        m += std::fabs(merged[row * E + e] * w.w_o.data[o * E + e]);
      }
      mag_o = std::max(mag_o, m);
      r.y[row * E + o] = acc + (residual ? x.data[row * E + o] : 0.0);
    }
  // The bound, stage by stage (first order in u; worst case, so typical errors are far below it):
  //  * each projection sums E products and the bias in fp32: |dq| <= gamma_n(E+1) * max sum|x W| + |b| (mag);
  //  * a logit scale * q.k moves by ||dq|| ||k|| + ||q|| ||dk|| (Cauchy-Schwarz; ||dq|| <= sqrt(D) max|dq|),
  //    its own fp32 sum adds gamma_n(D) ||q|| ||k||, all times scale, plus the rounding of the scaled value;
  //  * softmax: perturbing every logit by at most ds moves the weights by sum_j |dp_j| <= 2 ds, and fp32 exp,
  //    sum and division add gamma_n(Lkv + 4) (relative, weights sum to 1);
  //  * the weighted sum of Lkv values: (sum |dp|) v_max + dv + gamma_n(Lkv) v_max;
  //  * the out projection: do * max_row ||W_o||_1 + gamma_n(E+1) * max sum|o W_o| + |b_o|;
  //  * the residual add: one rounding of |y|.
  // We allow 2x that for the second-order terms. Being worst case it sits far above the errors seen;
  // check_layer also asserts that a wrong head split would exceed it.
  const double dq = gamma_n(E + 1.0) * mag_q + rope_dq, dk = gamma_n(E + 1.0) * mag_k + rope_dk,
               dv = gamma_n(E + 1.0) * mag_v;
  const double ds = scale * (std::sqrt(static_cast<double>(D)) * (dq * k_norm + q_norm * dk) +
                             gamma_n(static_cast<double>(D)) * q_norm * k_norm) +
                    kU * scale * q_norm * k_norm;
  const double dp = 2.0 * ds + gamma_n(Lkv + 4.0);
  const double d_o = dp * v_max + dv + gamma_n(static_cast<double>(Lkv)) * v_max;
  const double y_max = max_abs(r.y);
  r.tolerance = 2.0 * (d_o * w_o_row_l1 + gamma_n(E + 1.0) * mag_o + (residual ? kU * y_max : 0.0));
  return r;
}

FloatArray random_tensor(std::vector<int64_t> shape, uint64_t seed) {
  FloatArray t(std::move(shape));
  fill_uniform(t.ptr(), static_cast<int64_t>(t.numel()), seed, -1.0, 1.0);
  return t;
}

double max_abs_diff(const FloatArray& got, const std::vector<double>& want) {
  REQUIRE(got.numel() == want.size());
  double m = 0;
  for (std::size_t e = 0; e < want.size(); ++e) {
    REQUIRE(std::isfinite(got.data[e]));
    m = std::max(m, std::fabs(got.data[e] - want[e]));
  }
  return m;
}

// Runs the layer and the fp64 reference on the same inputs and asserts they agree within the derived bound,
// and that the bound has teeth: the reference with a wrong head split (1 head for H > 1, else 2) differs by
// more than 10x the bound.
void check_layer(const MultiHeadWeights& w, int64_t H, const FloatArray& x, const FloatArray* ctx,
                 const MultiHeadCall& call) {
  const MultiHeadLayer layer(w, H);
  const FloatArray y = layer.forward(x, ctx, call);
  REQUIRE(y.shape == x.shape);
  const ReferenceResult ref =
      reference_layer(w, H, x, ctx, call.causal, call.key_padding, call.residual, call.rope);
  const double err = max_abs_diff(y, ref.y);
  INFO("variant " << call.variant << " H=" << H << " max |err| " << err << " tolerance " << ref.tolerance);
  CHECK(err <= ref.tolerance);
  const int64_t wrong_heads = H > 1 ? 1 : 2;
  REQUIRE(x.shape[2] % wrong_heads == 0);
  const ReferenceResult wrong =
      reference_layer(w, wrong_heads, x, ctx, call.causal, call.key_padding, call.residual, call.rope);
  double split_effect = 0;
  for (std::size_t e = 0; e < ref.y.size(); ++e)
    split_effect = std::max(split_effect, std::fabs(wrong.y[e] - ref.y[e]));
  CHECK(split_effect > 10 * ref.tolerance);
  if (!call.rope.on()) return;
  // ... and RoPE has teeth: the reference without it, or with the other pairing, is far off.
  const ReferenceResult plain = reference_layer(w, H, x, ctx, call.causal, call.key_padding, call.residual);
  RopeSpec other = call.rope;
  other.mode = other.mode == RopeMode::normal ? RopeMode::neox : RopeMode::normal;
  const ReferenceResult paired =
      reference_layer(w, H, x, ctx, call.causal, call.key_padding, call.residual, other);
  double rope_effect = 0, pairing_effect = 0;
  for (std::size_t e = 0; e < ref.y.size(); ++e) {
    rope_effect = std::max(rope_effect, std::fabs(plain.y[e] - ref.y[e]));
    pairing_effect = std::max(pairing_effect, std::fabs(paired.y[e] - ref.y[e]));
  }
  CHECK(rope_effect > 10 * ref.tolerance);
  if (w.w_q.shape[0] / H > 2)
    CHECK(pairing_effect > 10 * ref.tolerance);  // D = 2: both pairings are one pair
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Positional encodings

TEST_CASE("sinusoidal encoding: values at known points", "[frontends]") {
  // Rounding a double in [-1, 1] to float errs by at most half an ulp, 2^-25; the angles are exact or within
  // a few double ulps, far below that.
  const double tol = std::ldexp(1.0, -24);
  const FloatArray pe = sinusoidal_encoding(1001, 8);
  REQUIRE(pe.shape == std::vector<int64_t>{1001, 8});
  auto at = [&](int64_t t, int64_t c) { return static_cast<double>(pe.data[t * 8 + c]); };
  for (int64_t c = 0; c < 8; ++c) CHECK(at(0, c) == (c % 2 == 0 ? 0.0 : 1.0));  // t starts at 0
  CHECK(at(1, 0) == Approx(std::sin(1.0)).margin(tol));
  CHECK(at(1, 1) == Approx(std::cos(1.0)).margin(tol));
  CHECK(at(7, 2) == Approx(std::sin(7.0 / 10.0)).margin(tol));  // pair i=1: 10000^(2/8) = 10
  CHECK(at(7, 3) == Approx(std::cos(7.0 / 10.0)).margin(tol));
  CHECK(at(1000, 6) == Approx(std::sin(1.0)).margin(tol));  // pair i=3: 10000^(6/8) = 1000
  CHECK(at(1000, 7) == Approx(std::cos(1.0)).margin(tol));
  CHECK(at(1000, 0) == Approx(std::sin(1000.0)).margin(tol));

  // Odd width: the first 5 columns of the pattern; the last is the sine of pair i=2, 10000^(4/5).
  const FloatArray odd = sinusoidal_encoding(4, 5);
  REQUIRE(odd.shape == std::vector<int64_t>{4, 5});
  CHECK(odd.data[3 * 5 + 4] == Approx(std::sin(3.0 / std::pow(10000.0, 0.8))).margin(tol));
  CHECK(odd.data[3 * 5 + 1] == Approx(std::cos(3.0)).margin(tol));

  CHECK_THROWS_AS(sinusoidal_encoding(0, 4), UsageError);
  CHECK_THROWS_AS(sinusoidal_encoding(4, 0), UsageError);
}

TEST_CASE("sinusoidal encoding: PE(t+k) = M_k PE(t) with M_k the block rotation", "[frontends]") {
  // M_k rotates each (sin, cos) pair by w_i k, w_i = 10000^(-2i/D), the same matrix for every t:
  // sin(w(t+k)) = cos(wk) sin(wt) + sin(wk) cos(wt), cos(w(t+k)) = -sin(wk) sin(wt) + cos(wk) cos(wt).
  // Tolerance: PE values are doubles rounded to float (<= 2^-25 each); a rotation row has unit 2-norm, so
  // M_k PE(t) carries <= sqrt(2) 2^-25, PE(t+k) another 2^-25: (1 + sqrt 2) 2^-25 < 2^-23.
  const double tol = std::ldexp(1.0, -23);
  for (const int64_t D : {16, 7}) {
    const int64_t L = 300, pairs = D / 2;  // odd D: the last (lone sine) column has no partner
    const FloatArray pe = sinusoidal_encoding(L, D);
    for (const int64_t k : {1, 5, 37, 250}) {
      std::vector<double> c(pairs), s(pairs);
      for (int64_t i = 0; i < pairs; ++i) {
        const double w = std::pow(10000.0, -2.0 * i / static_cast<double>(D));
        c[i] = std::cos(w * k);
        s[i] = std::sin(w * k);
      }
      double worst = 0, moved = 0;
      for (int64_t t = 0; t + k < L; ++t)
        for (int64_t i = 0; i < pairs; ++i) {
          const double a = pe.data[t * D + 2 * i], b = pe.data[t * D + 2 * i + 1];
          const double ra = c[i] * a + s[i] * b, rb = -s[i] * a + c[i] * b;
          worst = std::max({worst, std::fabs(ra - pe.data[(t + k) * D + 2 * i]),
                            std::fabs(rb - pe.data[(t + k) * D + 2 * i + 1])});
          moved = std::max(moved, std::fabs(ra - a));
        }
      INFO("D=" << D << " k=" << k << " worst " << worst);
      CHECK(worst <= tol);
      CHECK(moved > 1e3 * tol);  // the map is not the identity: the check above has teeth
      // The wrong shift does not fit: M_k maps PE(t) to PE(t+k), not PE(t+k+1).
      double off = 0;
      for (int64_t t = 0; t + k + 1 < L; ++t)
        off = std::max(
            off, std::fabs(c[0] * pe.data[t * D] + s[0] * pe.data[t * D + 1] - pe.data[(t + k + 1) * D]));
      CHECK(off > 1e3 * tol);
    }
  }
}

TEST_CASE("positional: learned tables, combine add/concat and their errors", "[frontends]") {
  ScratchDir dir("frontends");
  const FloatArray emb = random_tensor({4, 6}, 3);

  const FloatArray added = apply_positional(emb, {.kind = PositionalKind::sinusoidal});
  const FloatArray pe = sinusoidal_encoding(4, 6);
  REQUIRE(added.shape == std::vector<int64_t>{4, 6});
  for (std::size_t e = 0; e < added.numel(); ++e) CHECK(added.data[e] == emb.data[e] + pe.data[e]);

  const FloatArray cat =
      apply_positional(emb, {.kind = PositionalKind::sinusoidal, .combine = PositionalCombine::concat});
  REQUIRE(cat.shape == std::vector<int64_t>{4, 12});
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t c = 0; c < 6; ++c) {
      CHECK(cat.data[t * 12 + c] == emb.data[t * 6 + c]);
      CHECK(cat.data[t * 12 + 6 + c] == pe.data[t * 6 + c]);
    }

  CHECK(apply_positional(emb, {}).data == emb.data);  // kind none: unchanged

  // Seeded learned tables: deterministic, a longer table extends a shorter one, the seed matters.
  const FloatArray l3 = seeded_learned_encoding(3, 6, 9), l5 = seeded_learned_encoding(5, 6, 9);
  CHECK(std::equal(l3.data.begin(), l3.data.end(), l5.data.begin()));
  CHECK(seeded_learned_encoding(3, 6, 10).data != l3.data);
  const FloatArray learned_add = apply_positional(emb, {.kind = PositionalKind::learned, .learned_seed = 9});
  for (std::size_t e = 0; e < learned_add.numel(); ++e)
    CHECK(learned_add.data[e] == emb.data[e] + l5.data[e]);

  // From .npy: too few rows, a width mismatch for add, any width for concat, non-finite values.
  FloatArray table = random_tensor({3, 6}, 5);
  const std::string short_path = dir.file("short.npy");
  write_npy(short_path, table);
  CHECK_THROWS_WITH(apply_positional(emb, {.kind = PositionalKind::learned, .learned_path = short_path}),
                    Contains(short_path) && Contains("3 rows") && Contains("4 tokens"));
  const std::string narrow_path = dir.file("narrow.npy");
  write_npy(narrow_path, random_tensor({8, 2}, 6));
  CHECK_THROWS_WITH(apply_positional(emb, {.kind = PositionalKind::learned, .learned_path = narrow_path}),
                    Contains(narrow_path) && Contains("width 2") && Contains("width 6"));
  const FloatArray narrow_cat = apply_positional(
      emb,
      {.kind = PositionalKind::learned, .combine = PositionalCombine::concat, .learned_path = narrow_path});
  CHECK(narrow_cat.shape == std::vector<int64_t>{4, 8});
  table.data[7] = std::numeric_limits<float>::quiet_NaN();
  const std::string nan_path = dir.file("nan.npy");
  write_npy(nan_path, table);
  CHECK_THROWS_WITH(load_learned_encoding(nan_path), Contains(nan_path) && Contains("non-finite"));
  write_npy(dir.file("rank3.npy"), random_tensor({2, 2, 2}, 1));
  CHECK_THROWS_WITH(load_learned_encoding(dir.file("rank3.npy")), Contains("rank 2"));

  CHECK_THROWS_WITH(
      parse_positional_kind("sine", "--positional"),
      Contains("--positional") && Contains("'sine'") && Contains("sinusoidal, learned, none, rope"));
  CHECK_THROWS_WITH(parse_positional_combine("sum", "--combine"),
                    Contains("'sum'") && Contains("add, concat"));
  CHECK(parse_positional_kind("learned", "x") == PositionalKind::learned);
  // rope adds nothing: RoPE is applied to q and k in the layer.
  CHECK(parse_positional_kind("rope", "x") == PositionalKind::rope);
  CHECK(positional_kind_name(PositionalKind::rope) == "rope");
  CHECK(apply_positional(emb, {.kind = PositionalKind::rope}).data == emb.data);
}

// ---------------------------------------------------------------------------------------------------------
// Embeddings and tokenisation

TEST_CASE("embedding loader: header, CRLF, trailing spaces and blank lines are accepted", "[frontends]") {
  ScratchDir dir("frontends");
  const TokenEmbedding e = TokenEmbedding::load_text(
      dir.write("vec.txt", "3 4\r\nthe 0.1 0.2 0.3 0.4  \r\n, 1 2 3 4\r\ncat -1e-3 +5 6.5 7\t\r\n\r\n"));
  CHECK(e.vocab_size() == 3);
  CHECK(e.d_model() == 4);
  CHECK(e.unknown_id() == 3);
  REQUIRE(e.table().shape == std::vector<int64_t>{4, 4});
  REQUIRE(e.find("cat") == 2);
  CHECK(e.find(",") == 1);
  CHECK(!e.find("Cat"));  // exact lookup: no case folding
  const std::vector<float> cat_row(e.table().ptr() + 8, e.table().ptr() + 12);
  CHECK(cat_row == std::vector<float>{-1e-3f, 5.0f, 6.5f, 7.0f});
  for (int64_t c = 0; c < 4; ++c) CHECK(e.table().data[3 * 4 + c] == 0.0f);  // the unknown row

  const TokenEmbedding glove =
      TokenEmbedding::load_text(dir.write("glove.txt", "a 1 2\nb 3 4"));  // no header
  CHECK(glove.vocab_size() == 2);
  CHECK(glove.d_model() == 2);
  CHECK(glove.table().data[2] == 3.0f);
}

TEST_CASE("embedding loader: bad files are rejected with file:line", "[frontends]") {
  ScratchDir dir("frontends");
  auto load = [&](const std::string& content) {
    return TokenEmbedding::load_text(dir.write("bad.txt", content));
  };
  const std::string f = dir.file("bad.txt");
  CHECK_THROWS_WITH(load("a 1 2\nb 3\n"), Contains(f + ":2") && Contains("has 1 values, expected 2"));
  CHECK_THROWS_WITH(load("a 1 2\nb 3 4 5\n"), Contains(f + ":2") && Contains("has 3 values"));
  CHECK_THROWS_WITH(load("a 1 2\nb 3 x4\n"), Contains(f + ":2") && Contains("'x4'"));
  CHECK_THROWS_WITH(load("a 1 nan\n"), Contains(f + ":1") && Contains("'nan'"));
  CHECK_THROWS_WITH(load("a +-1 2\n"), Contains(f + ":1") && Contains("'+-1'"));  // was read as -1
  CHECK_THROWS_WITH(load("a 1 1e39\n"), Contains(f + ":1") && Contains("float32 range"));
  CHECK_THROWS_WITH(load("a 1 2\nb 3 4\na 5 6\n"),
                    Contains(f + ":3") && Contains("duplicate word 'a'") && Contains("first on line 1"));
  CHECK_THROWS_WITH(load("3 2\na 1 2\nb 3 4\n"), Contains("declares 3 words") && Contains("has 2 rows"));
  CHECK_THROWS_WITH(load("2 3\na 1 2\nb 3 4\n"),
                    Contains(f + ":2") && Contains("expected 3 (from the header)"));
  CHECK_THROWS_WITH(load("lonely\n"), Contains(f + ":1") && Contains("no values"));
  CHECK_THROWS_WITH(load(""), Contains(f) && Contains("no embedding rows"));
  CHECK_THROWS_WITH(load(" \n\r\n"), Contains("no embedding rows"));
  CHECK_THROWS_WITH(load(std::string("a 1\0 2\n", 8)), Contains("NUL"));
  CHECK_THROWS_WITH(TokenEmbedding::load_text(dir.file("missing.txt")),
                    Contains(dir.file("missing.txt")) && Contains("cannot open"));
}

TEST_CASE("tokenising: whitespace split, exact lookup, unknown tokens counted and mapped to the zero row",
          "[frontends]") {
  ScratchDir dir("frontends");
  const std::string text = dir.write("text.txt", "the cat\tsat on\r\nthe  mat .\n");
  const std::vector<std::string> tokens = read_tokens(text);
  CHECK(tokens == std::vector<std::string>{"the", "cat", "sat", "on", "the", "mat", "."});
  CHECK(read_tokens(text, 3) == std::vector<std::string>{"the", "cat", "sat"});
  CHECK_THROWS_WITH(read_tokens(text, 0), Contains("max_tokens") && Contains("got 0"));
  CHECK_THROWS_WITH(read_tokens(dir.write("empty.txt", "")), Contains("empty.txt") && Contains("no tokens"));
  CHECK_THROWS_WITH(read_tokens(dir.write("blank.txt", " \n\t\r\n")), Contains("no tokens"));
  CHECK_THROWS_WITH(read_tokens(dir.file("none.txt")), Contains("none.txt") && Contains("cannot open"));
  CHECK_THROWS_WITH(read_tokens(dir.path().string()), Contains("is a directory"));

  const TokenEmbedding e = TokenEmbedding::load_text(dir.write("vec.txt", "the 1 2\n, 3 4\ncat 5 6\n"));
  const TokenizedText tok = e.tokenize(tokens);
  const int64_t U = e.unknown_id();
  CHECK(tok.ids == std::vector<int64_t>{0, 2, U, U, 0, U, U});
  CHECK(tok.unknown_count == 4);
  CHECK(tok.unknown_examples == std::vector<std::string>{"sat", "on", "mat", "."});
  const FloatArray x = e.lookup(tok.ids);
  REQUIRE(x.shape == std::vector<int64_t>{7, 2});
  CHECK(x.data[2] == 5.0f);  // "cat"
  CHECK(x.data[3] == 6.0f);
  CHECK(x.data[4] == 0.0f);  // "sat": unknown, zero row
  CHECK(x.data[5] == 0.0f);
  CHECK_THROWS_AS(e.lookup({U + 1}), UsageError);
  CHECK_THROWS_AS(e.lookup({-1}), UsageError);

  // A seeded table takes the text's words in first-seen order until it is full; later words are unknown.
  TokenEmbedding seeded = TokenEmbedding::seeded(3, 8, 42);
  CHECK(seeded.words().empty());
  CHECK(seeded.assign_words(tokens) == 3);
  CHECK(seeded.words() == std::vector<std::string>{"the", "cat", "sat"});
  const TokenizedText st = seeded.tokenize(tokens);
  CHECK(st.ids == std::vector<int64_t>{0, 1, 2, 3, 0, 3, 3});
  CHECK(st.unknown_count == 3);
  CHECK(seeded.assign_words(tokens) == 0);  // full
}

TEST_CASE("seeded embedding: deterministic N(0, 1) rows independent of the vocabulary size", "[frontends]") {
  const TokenEmbedding a = TokenEmbedding::seeded(3, 8, 42), b = TokenEmbedding::seeded(3, 8, 42);
  const TokenEmbedding c = TokenEmbedding::seeded(5, 8, 42), d = TokenEmbedding::seeded(3, 8, 43);
  CHECK(a.table().data == b.table().data);
  CHECK(std::equal(a.table().ptr(), a.table().ptr() + 24, c.table().ptr()));
  CHECK(!std::equal(a.table().ptr(), a.table().ptr() + 24, d.table().ptr()));
  for (int64_t col = 0; col < 8; ++col) CHECK(a.table().data[3 * 8 + col] == 0.0f);  // unknown row
  // 64000 draws: the sample mean has standard deviation 1/sqrt(64000) = 0.004 and the sample variance
  // sqrt(2/64000) = 0.0056; 5 sigma bounds (the draws are fixed by the seed, so this never flickers).
  const TokenEmbedding big = TokenEmbedding::seeded(1000, 64, 7);
  double sum = 0, sum2 = 0;
  for (int64_t e = 0; e < 1000 * 64; ++e) {
    sum += big.table().data[e];
    sum2 += static_cast<double>(big.table().data[e]) * big.table().data[e];
  }
  const double mean = sum / 64000, var = sum2 / 64000 - mean * mean;
  CHECK(std::fabs(mean) < 0.02);
  CHECK(std::fabs(var - 1.0) < 0.03);
  CHECK_THROWS_WITH(TokenEmbedding::seeded(0, 8, 1), Contains("vocab_size") && Contains("got 0"));
  CHECK_THROWS_WITH(TokenEmbedding::seeded(4, 0, 1), Contains("d_model"));
  CHECK_THROWS_WITH(TokenEmbedding::seeded(int64_t{1} << 30, 1024, 1), Contains("2^30"));
}

// ---------------------------------------------------------------------------------------------------------
// Multi-head layer

TEST_CASE("multi-head layer: self-attention against an fp64 implementation", "[frontends]") {
  const MultiHeadWeights w = random_multihead_weights(16, 11, true);
  const FloatArray x = random_tensor({2, 7, 16}, 12);
  for (const int64_t H : {1, 4, 16}) {  // head_dim 16, 4 and 1
    check_layer(w, H, x, nullptr, {});
    check_layer(w, H, x, nullptr, {.causal = true});
  }
  // Key padding (batch 0 pads its last two keys) with causal.
  ByteArray pad({2, 7});
  pad.data[5] = pad.data[6] = 1;
  check_layer(w, 4, x, nullptr, {.causal = true, .key_padding = &pad});
  // No biases at all.
  check_layer(random_multihead_weights(16, 13, false), 2, x, nullptr, {});
}

TEST_CASE("multi-head layer: cross-attention (seq_q != seq_kv) against an fp64 implementation",
          "[frontends]") {
  MultiHeadWeights w = random_multihead_weights(12, 21, true);
  w.b_k = FloatArray();  // only some biases: each is independent
  w.b_v = FloatArray();
  const FloatArray x = random_tensor({2, 5, 12}, 22), ctx = random_tensor({2, 9, 12}, 23);
  check_layer(w, 3, x, &ctx, {});
  check_layer(w, 3, x, &ctx, {.causal = true});
  const FloatArray long_q = random_tensor({2, 9, 12}, 24), short_kv = random_tensor({2, 4, 12}, 25);
  check_layer(w, 2, long_q, &short_kv, {.causal = true});  // rows past seq_kv see every key

  // Batch 1 pads every key: its rows have no allowed key, attention gives zeros, the output is b_o.
  ByteArray pad({2, 9});
  pad.data[3] = 1;
  for (int64_t j = 0; j < 9; ++j) pad.data[9 + j] = 1;
  check_layer(w, 3, x, &ctx, {.key_padding = &pad});
  const FloatArray y = MultiHeadLayer(w, 3).forward(x, &ctx, {.key_padding = &pad});
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t o = 0; o < 12; ++o) CHECK(y.data[(5 + i) * 12 + o] == w.b_o.data[o]);
}

TEST_CASE("multi-head layer: RoPE on the projected q and k against an fp64 implementation", "[frontends]") {
  const MultiHeadWeights w = random_multihead_weights(16, 71, true);
  const FloatArray x = random_tensor({2, 9, 16}, 72), ctx = random_tensor({2, 13, 16}, 73);
  for (const RopeMode mode : {RopeMode::normal, RopeMode::neox})
    for (const double base : {10000.0, 37.0}) {
      INFO("rope " << rope_mode_name(mode) << " base " << base);
      const RopeSpec rope{mode, base};
      for (const int64_t H : {1, 2, 4}) {  // head_dim 16, 8, 4
        check_layer(w, H, x, nullptr, {.rope = rope});
        check_layer(w, H, x, nullptr, {.causal = true, .residual = true, .rope = rope});
        check_layer(w, H, x, &ctx, {.rope = rope});  // keys at 0 .. 12, queries at 0 .. 8
      }
    }
  // Mode none (whatever the base) is exactly the layer without RoPE.
  const MultiHeadLayer layer(w, 4);
  CHECK(layer.forward(x, nullptr, {.rope = {RopeMode::none, 5.0}}).data ==
        layer.forward(x, nullptr, {}).data);
  // Odd head_dim and a bad base are errors naming what is wrong.
  const MultiHeadWeights w3 = random_multihead_weights(6, 74, true);
  CHECK_THROWS_WITH(
      MultiHeadLayer(w3, 2).forward(random_tensor({1, 3, 6}, 1), nullptr, {.rope = {RopeMode::neox}}),
      Contains("head_dim must be even, got 3"));
  CHECK_THROWS_WITH(layer.forward(x, nullptr, {.rope = {RopeMode::normal, -1.0}}), Contains("base"));
}

TEST_CASE("multi-head layer: residual adds the input", "[frontends]") {
  const MultiHeadWeights w = random_multihead_weights(8, 31, true);
  const FloatArray x = random_tensor({1, 6, 8}, 32), ctx = random_tensor({1, 3, 8}, 33);
  check_layer(w, 2, x, nullptr, {.residual = true});
  check_layer(w, 2, x, &ctx, {.residual = true});
  const MultiHeadLayer layer(w, 2);
  const FloatArray plain = layer.forward(x, &ctx, {}), res = layer.forward(x, &ctx, {.residual = true});
  for (std::size_t e = 0; e < x.numel(); ++e)
    CHECK(res.data[e] == plain.data[e] + x.data[e]);  // one fp32 add
}

TEST_CASE("multi-head layer: every exact variant works as the core operator", "[frontends]") {
  const MultiHeadWeights w = random_multihead_weights(16, 41, true);
  const FloatArray x = random_tensor({2, 33, 16}, 42), ctx = random_tensor({2, 17, 16}, 43);
  ByteArray cross_pad({2, 17}), self_pad({2, 33});
  cross_pad.data[16] = cross_pad.data[17 + 2] = 1;
  self_pad.data[30] = self_pad.data[33 + 5] = 1;
  int exact_variants = 0;
  for (const Attention* v : Registry::instance().all()) {
    const Capabilities caps = v->capabilities();
    if (!caps.exact) continue;  // approximate variants are not softmax attention: no fp64 softmax oracle here
    ++exact_variants;
    for (const Json& params : v->test_param_sets()) {  // small tiles so multi-tile paths run
      MultiHeadCall call{.variant = v->name(), .params = params, .causal = caps.causal};
      call.key_padding = caps.key_padding ? &self_pad : nullptr;
      check_layer(w, 4, x, nullptr, call);
      if (!caps.cross) continue;
      call.key_padding = caps.key_padding ? &cross_pad : nullptr;
      check_layer(w, 4, x, &ctx, call);
    }
  }
  CHECK(exact_variants >= 1);
}

TEST_CASE("multi-head layer: head_dim != d_v (w_q, w_k of E_qk rows)", "[frontends][value_dim]") {
  // E = 16 over 4 heads gives d_v = 4; E_qk = 24 and 8 give head_dim 6 and 2 (wider and narrower than d_v).
  const FloatArray x = random_tensor({2, 19, 16}, 61), ctx = random_tensor({2, 11, 16}, 62);
  ByteArray pad({2, 11});
  pad.data[10] = pad.data[11 + 3] = 1;
  int ran = 0, refused = 0;
  for (const int64_t qk : {24, 8}) {
    const MultiHeadWeights w = random_multihead_weights(16, 63 + static_cast<uint64_t>(qk), true, qk);
    const MultiHeadLayer layer(w, 4);
    REQUIRE(layer.head_dim() == qk / 4);
    REQUIRE(layer.value_dim() == 4);
    for (const Attention* v : Registry::instance().all()) {
      const Capabilities caps = v->capabilities();
      if (!caps.exact) continue;
      MultiHeadCall call{.variant = v->name(), .causal = caps.causal};
      if (!caps.value_dim) {  // refused with the reason, never run with V cut or padded
        CHECK_THROWS_AS(layer.forward(x, nullptr, call), NotSupported);
        ++refused;
        continue;
      }
      check_layer(w, 4, x, nullptr, call);
      check_layer(
          w, 4, x, nullptr,
          {.variant = v->name(), .causal = true, .residual = true, .rope = {RopeMode::normal, 10000.0}});
      if (caps.cross) {
        call.key_padding = caps.key_padding ? &pad : nullptr;
        check_layer(w, 4, x, &ctx, call);
      }
      ++ran;
    }
  }
  CHECK(ran >= 4);  // naive and tiled, at both widths
  INFO("variants refusing d_v: " << refused);
  // E_qk must split over the heads too.
  CHECK_THROWS_WITH(MultiHeadLayer(random_multihead_weights(16, 1, false, 10), 4),
                    Contains("heads: 4") && Contains("10 rows"));
  CHECK_THROWS_WITH(random_multihead_weights(16, 1, false, -1), Contains("qk_width"));
}

TEST_CASE("multi-head layer: unsupported problems, bad shapes and inputs are clear errors", "[frontends]") {
  const MultiHeadWeights w = random_multihead_weights(6, 51, true);
  CHECK_THROWS_WITH(MultiHeadLayer(w, 4),
                    Contains("heads: 4") && Contains("d_model 6") && Contains("divide"));
  CHECK_THROWS_WITH(MultiHeadLayer(w, 0), Contains("heads: 0"));
  const MultiHeadLayer layer(w, 3);
  CHECK(layer.head_dim() == 2);
  const FloatArray x = random_tensor({2, 4, 6}, 52);
  CHECK_THROWS_WITH(layer.forward(random_tensor({2, 4, 5}, 1), nullptr, {}), Contains("x: shape [2, 4, 5]"));
  CHECK_THROWS_WITH(layer.forward(random_tensor({4, 6}, 1), nullptr, {}), Contains("x: shape [4, 6]"));
  const FloatArray other_batch = random_tensor({3, 4, 6}, 2);
  CHECK_THROWS_WITH(layer.forward(x, &other_batch, {}), Contains("context: batch 3"));
  ByteArray pad({2, 5});
  CHECK_THROWS_WITH(layer.forward(x, nullptr, {.key_padding = &pad}),
                    Contains("key_padding: shape [2, 5]") && Contains("[2, 4]"));
  FloatArray bad = x;
  bad.data[7] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(layer.forward(bad, nullptr, {}), Contains("x: non-finite") && Contains("[0, 1, 1]"));
  CHECK_THROWS_WITH(layer.forward(x, nullptr, {.variant = "nave"}), Contains("unknown variant 'nave'"));
  CHECK_THROWS_AS(layer.forward(x, nullptr, {.params = {{"no_such_param", 1}}}), UsageError);
  // A variant without cross-attention is NotSupported with the reason, not run.
  int checked = 0;
  for (const Attention* v : Registry::instance().all())
    if (!v->capabilities().cross) {
      const FloatArray ctx = random_tensor({2, 3, 6}, 3);
      CHECK_THROWS_AS(layer.forward(x, &ctx, {.variant = v->name()}), NotSupported);
      CHECK_THROWS_WITH(layer.forward(x, &ctx, {.variant = v->name()}), Contains("cross"));
      ++checked;
    }
  INFO("variants without cross-attention checked: " << checked);
  SUCCEED();
}

TEST_CASE("multi-head layer: bitwise identical at 1 and 2 threads", "[frontends]") {
  const MultiHeadWeights w = random_multihead_weights(32, 61, true);
  const FloatArray x = random_tensor({2, 150, 32}, 62);  // > 64 rows: several projection tasks
  const MultiHeadLayer layer(w, 4);
  FloatArray one, two;
  {
    ThreadScope scope(1);
    one = layer.forward(x, nullptr, {.causal = true});
  }
  {
    ThreadScope scope(2);
    two = layer.forward(x, nullptr, {.causal = true});
  }
  CHECK(one.data == two.data);
}

TEST_CASE("multi-head weights: seeded init, save/load round trip, directory errors", "[frontends]") {
  const int64_t E = 8;
  const MultiHeadWeights w = random_multihead_weights(E, 71, true),
                         nb = random_multihead_weights(E, 71, false);
  const float a_in = static_cast<float>(std::sqrt(6.0 / (4 * E))),
              a_out = static_cast<float>(1 / std::sqrt(8.0));
  for (float v : w.w_q.data) CHECK(std::fabs(v) <= a_in);
  for (float v : w.w_o.data) CHECK(std::fabs(v) <= a_out);
  CHECK(w.w_q.data != w.w_k.data);
  CHECK(w.w_q.data == nb.w_q.data);  // biases come from their own streams
  CHECK(nb.b_q.numel() == 0);
  REQUIRE(w.b_o.shape == std::vector<int64_t>{E});
  CHECK(random_multihead_weights(E, 72, true).w_q.data != w.w_q.data);

  ScratchDir dir("frontends");
  const std::string d = dir.file("weights");
  save_multihead_weights(d, w);
  const MultiHeadWeights back = load_multihead_weights(d);
  CHECK(back.w_v.data == w.w_v.data);
  CHECK(back.b_o.data == w.b_o.data);
  CHECK(back.d_model() == E);

  fs::remove(fs::path(d) / "b_k.npy");  // optional
  CHECK(load_multihead_weights(d).b_k.numel() == 0);
  fs::rename(fs::path(d) / "b_o.npy", fs::path(d) / "b_oo.npy");  // a typo must not silently drop the bias
  CHECK_THROWS_WITH(load_multihead_weights(d), Contains("'b_oo.npy'") && Contains("did you mean 'b_o.npy'"));
  fs::remove(fs::path(d) / "b_oo.npy");
  fs::remove(fs::path(d) / "w_k.npy");
  CHECK_THROWS_WITH(load_multihead_weights(d), Contains("missing required file 'w_k.npy'") && Contains(d));
  write_npy((fs::path(d) / "w_k.npy").string(), random_tensor({E, E - 1}, 1));
  CHECK_THROWS_WITH(load_multihead_weights(d),
                    Contains("w_k.npy") && Contains("[8, 7]") && Contains("[8, 8]"));
  write_npy((fs::path(d) / "w_k.npy").string(), w.w_k);
  write_npy((fs::path(d) / "b_v.npy").string(), random_tensor({E + 1}, 1));
  CHECK_THROWS_WITH(load_multihead_weights(d), Contains("b_v.npy") && Contains("[9]"));
  write_npy((fs::path(d) / "b_v.npy").string(), w.b_v);
  FloatArray nan_w = w.w_o;
  nan_w.data[3] = std::numeric_limits<float>::quiet_NaN();
  write_npy((fs::path(d) / "w_o.npy").string(), nan_w);
  CHECK_THROWS_WITH(load_multihead_weights(d), Contains("w_o.npy") && Contains("non-finite"));
  write_npy((fs::path(d) / "w_v.npy").string(), random_tensor({4, 8}, 1));
  CHECK_THROWS_WITH(load_multihead_weights(d), Contains("w_v.npy") && Contains("square"));
  write_npy((fs::path(d) / "w_v.npy").string(), w.w_v);
  // w_q sets E_qk (head_dim != d_v): a w_q of 4 rows asks the same of w_k and b_q, naming where E_qk came
  // from.
  write_npy((fs::path(d) / "w_q.npy").string(), random_tensor({4, 8}, 1));
  CHECK_THROWS_WITH(load_multihead_weights(d), Contains("w_k.npy") && Contains("[4, 8]") &&
                                                   Contains("E_qk = 4 from") && Contains("w_q.npy"));
  write_npy((fs::path(d) / "w_q.npy").string(), random_tensor({8, 7}, 1));
  CHECK_THROWS_WITH(load_multihead_weights(d), Contains("w_q.npy") && Contains("[8, 7]") && Contains("E_qk"));
  CHECK_THROWS_WITH(load_multihead_weights(dir.file("nowhere")),
                    Contains("nowhere") && Contains("does not exist"));
  CHECK_THROWS_WITH(random_multihead_weights(0, 1, true), Contains("d_model"));
}
