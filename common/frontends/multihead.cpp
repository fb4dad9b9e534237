// Multi-head attention layer: torch-layout projections (BLAS), head split/merge, any variant as the core.
#include "common/frontends/multihead.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <stdexcept>

#include "common/interface/attention.hpp"
#include "common/io/npy.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"

namespace attn {
namespace {

// Rows of x per projection task: fixed by the problem, never by the thread count, so every output element
// is computed by the same operations at any thread count (bitwise reproducible).
constexpr int64_t kRowsPerTask = 64;

// Largest d_model accepted: an E x E weight beyond this is a corrupt file or a typo, not a layer.
constexpr int64_t kMaxDModel = int64_t{1} << 16;

constexpr std::array<const char*, 4> kWeightNames = {"w_q", "w_k", "w_v", "w_o"};
constexpr std::array<const char*, 4> kBiasNames = {"b_q", "b_k", "b_v", "b_o"};

std::array<FloatArray*, 8> members(MultiHeadWeights& w) {
  return {&w.w_q, &w.w_k, &w.w_v, &w.w_o, &w.b_q, &w.b_k, &w.b_v, &w.b_o};
}
std::array<const FloatArray*, 8> members(const MultiHeadWeights& w) {
  return {&w.w_q, &w.w_k, &w.w_v, &w.w_o, &w.b_q, &w.b_k, &w.b_v, &w.b_o};
}
const char* member_name(std::size_t i) {
  return i < 4 ? kWeightNames[i] : kBiasNames[i - 4];
}

// Checks shapes and finiteness; label(i) names member i in messages (a tensor name or a file).
void validate_weights(const MultiHeadWeights& w, const std::function<std::string(std::size_t)>& label) {
  const auto all = members(w);
  if (w.w_v.rank() != 2 || w.w_v.shape[0] != w.w_v.shape[1] || w.w_v.shape[0] < 1 ||
      w.w_v.shape[0] > kMaxDModel)
    throw UsageError(label(2) + ": shape " + w.w_v.shape_str() +
                     "; expected a square [E, E] (torch.nn.Linear layout [out, in]) with 1 <= E <= 65536");
  const int64_t E = w.w_v.shape[0];
  // w_q sets E_qk (its rows): E for torch's layer, another width for head_dim != d_v.
  if (w.w_q.rank() != 2 || w.w_q.shape[1] != E || w.w_q.shape[0] < 1 || w.w_q.shape[0] > kMaxDModel)
    throw UsageError(label(0) + ": shape " + w.w_q.shape_str() + "; expected [E_qk, " + std::to_string(E) +
                     "] (E = " + std::to_string(E) + " from " + label(2) +
                     ", torch.nn.Linear layout [out, in]; E_qk = heads * head_dim, usually E) with "
                     "1 <= E_qk <= 65536");
  const int64_t Eqk = w.w_q.shape[0];
  for (std::size_t i = 0; i < all.size(); ++i) {
    const FloatArray& t = *all[i];
    const bool bias = i >= 4, qk = i % 4 < 2;               // w_q, w_k, b_q, b_k are E_qk wide
    if (bias && t.numel() == 0 && t.rank() <= 1) continue;  // absent bias
    const int64_t out = qk ? Eqk : E;
    const std::vector<int64_t> want = bias ? std::vector<int64_t>{out} : std::vector<int64_t>{out, E};
    if (t.shape != want)
      throw UsageError(label(i) + ": shape " + t.shape_str() + "; expected " +
                       FloatArray::shape_to_string(want) + " (E = " + std::to_string(E) + " from " +
                       label(2) +
                       (qk ? ", E_qk = " + std::to_string(Eqk) + " from " + label(0) : std::string()) +
                       ", torch.nn.Linear layout " + (bias ? "[out]" : "[out, in]") + ")");
    for (std::size_t e = 0; e < t.numel(); ++e)
      if (!std::isfinite(t.data[e]))
        throw UsageError(label(i) + ": non-finite value " + std::to_string(t.data[e]) + " at flat index " +
                         std::to_string(e) + "; weights must be finite");
  }
}

// y[rows, O] = x[rows, I] W^T + b for W [O, I] (b may be empty), parallel over fixed row blocks.
void linear(const float* x, int64_t rows, const FloatArray& w, const FloatArray& b, float* y) {
  const int64_t O = w.shape[0], I = w.shape[1];
  const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  tbb::parallel_for(int64_t{0}, tasks, [&](int64_t task) {
    const int64_t r0 = task * kRowsPerTask, nr = std::min(kRowsPerTask, rows - r0);
    float* out = y + r0 * O;
    if (b.numel()) {
      for (int64_t r = 0; r < nr; ++r) std::copy_n(b.ptr(), O, out + r * O);
    }
    sgemm(false, true, nr, O, I, 1.0f, x + r0 * I, I, w.ptr(), I, b.numel() ? 1.0f : 0.0f, out, O);
  });
}

// [B, L, H*D] -> [B, H, L, D]
FloatArray split_heads(const std::vector<float>& y, int64_t B, int64_t L, int64_t H, int64_t D) {
  FloatArray out({B, H, L, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l)
        std::copy_n(y.data() + (b * L + l) * H * D + h * D, D, out.ptr() + ((b * H + h) * L + l) * D);
  return out;
}

void require_finite(const FloatArray& t, const std::string& name) {
  for (std::size_t e = 0; e < t.numel(); ++e) {
    if (std::isfinite(t.data[e])) continue;
    std::string index;
    std::size_t rest = e;
    for (int d = t.rank() - 1; d >= 0; --d) {
      const auto extent = static_cast<std::size_t>(t.shape[static_cast<std::size_t>(d)]);
      index = std::to_string(rest % extent) + (index.empty() ? "" : ", ") + index;
      rest /= extent;
    }
    throw UsageError(name + ": non-finite value " + std::to_string(t.data[e]) + " at [" + index +
                     "]; inputs must be finite");
  }
}

// Xavier-uniform over the stacked [2 E_qk + E, E] in_proj_weight: sqrt(6 / (fan_in + fan_out)).
float uniform_bound_xavier(int64_t E, int64_t Eqk) {
  return static_cast<float>(std::sqrt(6.0 / (2.0 * static_cast<double>(E) + 2.0 * static_cast<double>(Eqk))));
}

}  // namespace

void MultiHeadWeights::validate() const {
  validate_weights(*this, [](std::size_t i) { return std::string(member_name(i)); });
}

MultiHeadWeights load_multihead_weights(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string where = "weights directory '" + dir + "'";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw UsageError(
        where + ": " + (fs::exists(dir, ec) ? "is not a directory" : "does not exist") +
        "; expected a directory holding w_q.npy, w_k.npy, w_v.npy, w_o.npy and optional b_*.npy");
  std::vector<std::string> known;
  for (std::size_t i = 0; i < 8; ++i) known.push_back(std::string(member_name(i)) + ".npy");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool looks_like_weight =
        (name.starts_with("w_") || name.starts_with("b_")) && name.ends_with(".npy");
    if (looks_like_weight && std::find(known.begin(), known.end(), name) == known.end()) {
      std::string msg = where + ": unexpected file '" + name + "'";
      if (auto m = did_you_mean(name, known)) msg += " (did you mean '" + *m + "'?)";
      throw UsageError(msg +
                       "; allowed: w_q.npy, w_k.npy, w_v.npy, w_o.npy, b_q.npy, b_k.npy, b_v.npy, b_o.npy");
    }
  }
  if (ec) throw UsageError(where + ": cannot list (" + ec.message() + ")");
  MultiHeadWeights w;
  auto slots = members(w);
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < 8; ++i) {
    const std::string path = (fs::path(dir) / known[i]).string();
    paths.push_back("file '" + path + "'");
    if (!fs::exists(path, ec)) {
      if (i >= 4) continue;  // biases are optional
      throw UsageError(
          where + ": missing required file '" + known[i] +
          "' (required: w_q.npy, w_k.npy, w_v.npy, w_o.npy; optional: b_q.npy, b_k.npy, b_v.npy, "
          "b_o.npy)");
    }
    *slots[i] = read_npy_float(path);
    if (i >= 4 && slots[i]->numel() == 0)
      throw UsageError(paths[i] + ": shape " + slots[i]->shape_str() +
                       " is empty; delete the file for no bias");
  }
  validate_weights(w, [&](std::size_t i) { return paths[i]; });
  return w;
}

void save_multihead_weights(const std::string& dir, const MultiHeadWeights& weights) {
  weights.validate();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UsageError("weights directory '" + dir + "': cannot create (" + ec.message() + ")");
  const auto all = members(weights);
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i]->numel())
      write_npy((std::filesystem::path(dir) / (std::string(member_name(i)) + ".npy")).string(), *all[i]);
}

MultiHeadWeights random_multihead_weights(int64_t d_model, uint64_t seed, bool with_bias, int64_t qk_width) {
  if (d_model < 1 || d_model > kMaxDModel)
    throw UsageError("d_model: must be in [1, 65536], got " + std::to_string(d_model));
  if (qk_width < 0 || qk_width > kMaxDModel)
    throw UsageError("qk_width: must be in [1, 65536] (0: d_model), got " + std::to_string(qk_width));
  const int64_t E = d_model, Eqk = qk_width > 0 ? qk_width : d_model;
  const float a_in = uniform_bound_xavier(E, Eqk),
              a_lin = static_cast<float>(1.0 / std::sqrt(static_cast<double>(E)));
  MultiHeadWeights w;
  auto slots = members(w);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const bool bias = i >= 4;
    if (bias && !with_bias) continue;
    const int64_t out = i % 4 < 2 ? Eqk : E;  // w_q, w_k, b_q, b_k: E_qk rows
    *slots[i] = bias ? FloatArray({out}) : FloatArray({out, E});
    const float a = (i < 3) ? a_in : a_lin;
    // One stream per tensor, so adding biases does not change the weights drawn for the same seed.
    fill_uniform(slots[i]->ptr(), static_cast<int64_t>(slots[i]->numel()), mix64(seed ^ mix64(0x4d48 + i)),
                 -a, a);
  }
  return w;
}

MultiHeadLayer::MultiHeadLayer(MultiHeadWeights weights, int64_t heads)
    : weights_(std::move(weights)), heads_(heads) {
  weights_.validate();
  const int64_t E = weights_.d_model(), Eqk = weights_.qk_width();
  if (heads < 1 || E % heads != 0)
    throw UsageError("heads: " + std::to_string(heads) + " does not divide d_model " + std::to_string(E) +
                     "; heads must be >= 1 and divide d_model (each head gets d_model / heads columns)");
  if (Eqk % heads != 0)
    throw UsageError("heads: " + std::to_string(heads) + " does not divide w_q's " + std::to_string(Eqk) +
                     " rows (E_qk); each head's queries and keys get E_qk / heads columns");
}

MultiHeadLayer::HeadsQkv MultiHeadLayer::project(const FloatArray& x, const FloatArray* context) const {
  const int64_t E = d_model(), H = heads_, D = head_dim(), Dv = value_dim();
  auto check = [&](const FloatArray& t, const char* name) {
    if (t.rank() != 3 || t.shape[2] != E || t.shape[0] < 1 || t.shape[1] < 1)
      throw UsageError(std::string(name) + ": shape " + t.shape_str() + "; expected [batch, seq, " +
                       std::to_string(E) + "] (E = d_model of the weights)");
  };
  check(x, "x");
  const FloatArray& kv = context ? *context : x;
  if (context) {
    check(*context, "context");
    if (context->shape[0] != x.shape[0])
      throw UsageError("context: batch " + std::to_string(context->shape[0]) + " differs from x's batch " +
                       std::to_string(x.shape[0]) + "; they must be equal");
  }
  const int64_t B = x.shape[0], Lq = x.shape[1], Lkv = kv.shape[1];
  std::vector<float> buf(static_cast<std::size_t>(B * std::max(Lq, Lkv) * std::max(E, weights_.qk_width())));
  HeadsQkv out;
  linear(x.ptr(), B * Lq, weights_.w_q, weights_.b_q, buf.data());
  out.q = split_heads(buf, B, Lq, H, D);
  linear(kv.ptr(), B * Lkv, weights_.w_k, weights_.b_k, buf.data());
  out.k = split_heads(buf, B, Lkv, H, D);
  linear(kv.ptr(), B * Lkv, weights_.w_v, weights_.b_v, buf.data());
  out.v = split_heads(buf, B, Lkv, H, Dv);
  return out;
}

FloatArray MultiHeadLayer::output_projection(const FloatArray& heads_out) const {
  const int64_t E = d_model(), H = heads_, D = value_dim();
  if (heads_out.rank() != 4 || heads_out.shape[1] != H || heads_out.shape[3] != D)
    throw UsageError("attention output: shape " + heads_out.shape_str() + "; expected [batch, " +
                     std::to_string(H) + ", seq_q, " + std::to_string(D) + "]");
  const int64_t B = heads_out.shape[0], Lq = heads_out.shape[2];
  std::vector<float> merged(static_cast<std::size_t>(B * Lq * E));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < Lq; ++l)
        std::copy_n(heads_out.ptr() + ((b * H + h) * Lq + l) * D, D,
                    merged.data() + (b * Lq + l) * E + h * D);
  FloatArray y({B, Lq, E});
  linear(merged.data(), B * Lq, weights_.w_o, weights_.b_o, y.ptr());
  return y;
}

namespace {
// The multi-head layer makes no g / beta (no projection produces them yet).
std::string recurrence_inputs_reason(const Attention& variant) {
  return variant.name() + " reads per-token gates (g / beta), which the multi-head layer does not produce";
}
}  // namespace

Problem MultiHeadLayer::core_problem(const MultiHeadCall& call, int64_t batch, int64_t seq_q,
                                     int64_t seq_kv) const {
  const Attention& variant =
      call.variant.empty() ? Registry::instance().baseline() : Registry::instance().get(call.variant);
  Problem p = make_problem(variant.name(), call.params);
  p.batch = batch;
  p.heads = heads_;
  p.seq_q = seq_q;
  p.seq_kv = seq_kv;
  p.head_dim = head_dim();
  p.v_head_dim = value_dim() == head_dim() ? 0 : value_dim();
  p.mask.causal = call.causal;
  p.mask.key_padding = call.key_padding != nullptr;
  validate_rope(call.rope, p.head_dim, "rope");
  p.validate();
  if (const std::string why = variant.unsupported_reasons_text(p); !why.empty())
    throw NotSupported(p.repro() + ": " + why);
  if (const Capabilities caps = variant.capabilities(); caps.gate != Gate::none || caps.beta)
    throw NotSupported(p.repro() + ": " + recurrence_inputs_reason(variant));
  if (variant.capabilities().indexer)
    throw NotSupported(
        p.repro() + ": " + variant.name() +
        " reads a lightning indexer's inputs (index_q, index_k, index_w), which the layer does not "
        "make");
  return p;
}

FloatArray MultiHeadLayer::forward(const FloatArray& x, const FloatArray* context,
                                   const MultiHeadCall& call) const {
  HeadsQkv qkv = project(x, context);  // checks the shapes of x and context
  require_finite(x, "x");
  if (context) require_finite(*context, "context");
  const int64_t B = x.shape[0], Lq = x.shape[1], Lkv = qkv.k.shape[2];
  if (call.key_padding && call.key_padding->shape != std::vector<int64_t>{B, Lkv})
    throw UsageError("key_padding: shape " + call.key_padding->shape_str() +
                     "; expected [batch, seq_kv] = " + FloatArray::shape_to_string({B, Lkv}));
  const Problem p = core_problem(call, B, Lq, Lkv);
  // Each [L, head_dim] block of q and k is one head of one batch entry: positions restart at 0 in each.
  apply_rope(call.rope, qkv.q.ptr(), B * heads_, Lq, head_dim(), rope_query_offset(p));
  apply_rope(call.rope, qkv.k.ptr(), B * heads_, Lkv, head_dim(), 0);
  FloatArray heads_out({B, heads_, Lq, value_dim()});
  const AttentionInputs in{
      qkv.q.ptr(),    qkv.k.ptr(), qkv.v.ptr(), nullptr, call.key_padding ? call.key_padding->ptr() : nullptr,
      heads_out.ptr()};
  Registry::instance().get(p.variant).run(p, in);
  FloatArray y = output_projection(heads_out);
  if (call.residual)
    for (std::size_t e = 0; e < y.numel(); ++e) y.data[e] += x.data[e];
  int64_t bad = 0;
  for (float v : y.data) bad += !std::isfinite(v);
  if (bad)
    throw std::runtime_error(
        "multi-head layer (" + p.repro() + "): the output holds " + std::to_string(bad) +
        " non-finite values from finite inputs and weights (overflow in the variant or the "
        "projections)");
  return y;
}

}  // namespace attn
