// MLA's fp64 definition (mla_reference.hpp): DeepSeek-V3's naive path, token by token in double.
#include "common/reference/mla_reference.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/interface/params.hpp"
#include "common/kernels/rope.hpp"
#include "common/support/error.hpp"

namespace attn {
namespace {

// The widths a layer may have: a shape past these is a typo or a corrupt file, not a model.
constexpr int64_t kMaxWidth = int64_t{1} << 16;
constexpr int64_t kMaxHeads = int64_t{1} << 12;

void require_range(const char* field, int64_t value, int64_t lo, int64_t hi, const std::string& why = "") {
  if (value < lo || value > hi)
    throw UsageError(std::string("MLA shape: ") + field + " = " + std::to_string(value) + "; must be in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]" +
                     (why.empty() ? "" : " (" + why + ")"));
}

// DeepSeek's RMSNorm (F.rms_norm, eps 1e-6): x / sqrt(mean(x^2) + eps) * w.
constexpr double kRmsEps = 1e-6;
void rms_norm(std::vector<double>& x, const FloatArray& w) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + kRmsEps);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] *= inv * static_cast<double>(w.data[i]);
}

// y[out] = W[out, in] x[in] (torch.nn.Linear without bias).
std::vector<double> linear(const FloatArray& w, const double* x) {
  const int64_t in = w.shape[1], out = w.shape[0];
  std::vector<double> y(static_cast<std::size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    const float* row = w.ptr() + o * in;
    double acc = 0;
    for (int64_t i = 0; i < in; ++i) acc += static_cast<double>(row[i]) * x[i];
    y[static_cast<std::size_t>(o)] = acc;
  }
  return y;
}

void rope_row(const MlaShape& s, double* x, int64_t pos) {
  const RopeSpec spec{RopeMode::normal, s.rope_base};
  std::vector<double> out(static_cast<std::size_t>(s.qk_rope_dim));
  apply_rope_fp64(spec, x, out.data(), 1, 1, s.qk_rope_dim, pos);
  std::copy(out.begin(), out.end(), x);
}

void check_weight(const FloatArray& t, const char* name, std::vector<int64_t> want) {
  if (t.shape != want)
    throw UsageError(std::string("MLA weights: ") + name + " has shape " + t.shape_str() + "; expected " +
                     FloatArray::shape_to_string(want));
  for (std::size_t e = 0; e < t.numel(); ++e)
    if (!std::isfinite(t.data[e]))
      throw UsageError(std::string("MLA weights: ") + name + " holds the non-finite value " +
                       std::to_string(t.data[e]) + " at flat index " + std::to_string(e) +
                       "; weights must be finite");
}

}  // namespace

double MlaShape::softmax_scale() const {
  return 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
}

void MlaShape::validate() const {
  require_range("d_model", d_model, 1, kMaxWidth);
  require_range("heads", heads, 1, kMaxHeads);
  require_range("q_lora_rank", q_lora_rank, 0, kMaxWidth, "0 means no query compression");
  require_range("kv_lora_rank", kv_lora_rank, 1, kMaxWidth);
  require_range("qk_nope_dim", qk_nope_dim, 1, kMaxWidth);
  require_range("qk_rope_dim", qk_rope_dim, 2, kMaxWidth);
  require_range("v_head_dim", v_head_dim, 1, kMaxWidth);
  if (qk_rope_dim % 2 != 0)
    throw UsageError("MLA shape: qk_rope_dim = " + std::to_string(qk_rope_dim) +
                     "; must be even (RoPE rotates pairs of elements)");
  if (!std::isfinite(rope_base) || rope_base <= 1.0)
    throw UsageError("MLA shape: rope_base = " + shortest_double_text(rope_base) +
                     "; must be a finite number > 1");
}

std::string MlaShape::str() const {
  return "E=" + std::to_string(d_model) + ",H=" + std::to_string(heads) +
         ",q_lora=" + std::to_string(q_lora_rank) + ",kv_lora=" + std::to_string(kv_lora_rank) +
         ",nope=" + std::to_string(qk_nope_dim) + ",rope=" + std::to_string(qk_rope_dim) +
         ",v=" + std::to_string(v_head_dim) + ",base=" + shortest_double_text(rope_base);
}

void MlaWeights::validate(const MlaShape& s) const {
  s.validate();
  const int64_t E = s.d_model, H = s.heads, qk = s.qk_head_dim();
  if (s.q_lora_rank == 0) {
    check_weight(wq, "wq", {H * qk, E});
    for (auto [t, name] : {std::pair{&wq_a, "wq_a"}, {&q_norm, "q_norm"}, {&wq_b, "wq_b"}})
      if (t->numel())
        throw UsageError(std::string("MLA weights: ") + name + " has shape " + t->shape_str() +
                         "; expected none (q_lora_rank is 0: the query is x wq^T)");
  } else {
    if (wq.numel())
      throw UsageError("MLA weights: wq has shape " + wq.shape_str() + "; expected none (q_lora_rank is " +
                       std::to_string(s.q_lora_rank) + ": the query is wq_b(q_norm(wq_a(x))))");
    check_weight(wq_a, "wq_a", {s.q_lora_rank, E});
    check_weight(q_norm, "q_norm", {s.q_lora_rank});
    check_weight(wq_b, "wq_b", {H * qk, s.q_lora_rank});
  }
  check_weight(wkv_a, "wkv_a", {s.latent_row(), E});
  check_weight(kv_norm, "kv_norm", {s.kv_lora_rank});
  check_weight(wkv_b, "wkv_b", {H * (s.qk_nope_dim + s.v_head_dim), s.kv_lora_rank});
  check_weight(wo, "wo", {E, H * s.v_head_dim});
}

DoubleArray mla_reference(const MlaShape& s, const MlaWeights& w, const FloatArray& x_all,
                          int64_t first_row) {
  w.validate(s);
  if (x_all.rank() != 3 || x_all.shape[2] != s.d_model || x_all.shape[0] < 1 || x_all.shape[1] < 1)
    throw UsageError("MLA reference: x has shape " + x_all.shape_str() + "; expected [batch, seq, " +
                     std::to_string(s.d_model) + "]");
  const int64_t B = x_all.shape[0], L = x_all.shape[1], E = s.d_model, H = s.heads;
  if (first_row < 0 || first_row >= L)
    throw UsageError("MLA reference: first_row " + std::to_string(first_row) + " outside [0, " +
                     std::to_string(L) + ")");
  const int64_t nope = s.qk_nope_dim, qk = s.qk_head_dim(), dv = s.v_head_dim;
  const int64_t kvl = s.kv_lora_rank, rows = L - first_row;
  // Per token: every head's K [H][qk] and V [H][dv] (naive form); per output row: every head's q [H][qk].
  std::vector<double> K(static_cast<std::size_t>(B * L * H * qk)),
      V(static_cast<std::size_t>(B * L * H * dv));
  std::vector<double> Q(static_cast<std::size_t>(B * rows * H * qk));
  tbb::parallel_for(int64_t{0}, B * L, [&](int64_t bt) {
    const int64_t t = bt % L;
    std::vector<double> x(static_cast<std::size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      x[static_cast<std::size_t>(e)] = x_all.data[static_cast<std::size_t>(bt * E + e)];
    // kv = wkv_a x = [c_kv, k_pe]; c_kv = kv_norm(c_kv); k_pe rotated at position t.
    std::vector<double> kv = linear(w.wkv_a, x.data());
    std::vector<double> c(kv.begin(), kv.begin() + kvl), k_pe(kv.begin() + kvl, kv.end());
    rms_norm(c, w.kv_norm);
    rope_row(s, k_pe.data(), t);
    const std::vector<double> kvb = linear(w.wkv_b, c.data());  // [H][nope + dv]
    for (int64_t h = 0; h < H; ++h) {
      double* k = K.data() + (bt * H + h) * qk;
      std::copy_n(kvb.begin() + h * (nope + dv), nope, k);
      std::copy(k_pe.begin(), k_pe.end(), k + nope);  // k_pe shared by every head
      std::copy_n(kvb.begin() + h * (nope + dv) + nope, dv, V.data() + (bt * H + h) * dv);
    }
    if (t < first_row) return;
    std::vector<double> q;
    if (s.q_lora_rank == 0) {
      q = linear(w.wq, x.data());
    } else {
      std::vector<double> a = linear(w.wq_a, x.data());
      rms_norm(a, w.q_norm);
      q = linear(w.wq_b, a.data());
    }
    for (int64_t h = 0; h < H; ++h) rope_row(s, q.data() + h * qk + nope, t);
    std::copy(q.begin(), q.end(), Q.begin() + ((bt / L) * rows + t - first_row) * H * qk);
  });
  // Causal softmax attention per (batch, row, head), then wo.
  DoubleArray y({B, rows, E});
  const double scale = s.softmax_scale();
  tbb::parallel_for(int64_t{0}, B * rows, [&](int64_t br) {
    const int64_t b = br / rows, t = first_row + br % rows;
    std::vector<double> o(static_cast<std::size_t>(H * dv), 0.0), sc(static_cast<std::size_t>(t + 1));
    for (int64_t h = 0; h < H; ++h) {
      const double* q = Q.data() + (br * H + h) * qk;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j <= t; ++j) {
        const double* k = K.data() + ((b * L + j) * H + h) * qk;
        double acc = 0;
        for (int64_t d = 0; d < qk; ++d) acc += q[d] * k[d];
        sc[static_cast<std::size_t>(j)] = acc * scale;
        mx = std::max(mx, acc * scale);
      }
      double sum = 0;
      for (int64_t j = 0; j <= t; ++j)
        sum += sc[static_cast<std::size_t>(j)] = std::exp(sc[static_cast<std::size_t>(j)] - mx);
      for (int64_t j = 0; j <= t; ++j) {
        const double p = sc[static_cast<std::size_t>(j)] / sum;
        const double* v = V.data() + ((b * L + j) * H + h) * dv;
        for (int64_t d = 0; d < dv; ++d) o[static_cast<std::size_t>(h * dv + d)] += p * v[d];
      }
    }
    const std::vector<double> out = linear(w.wo, o.data());
    std::copy(out.begin(), out.end(), y.ptr() + br * E);
  });
  return y;
}

}  // namespace attn
