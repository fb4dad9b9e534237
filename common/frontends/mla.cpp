// Multi-head latent attention (mla.hpp): DeepSeek's projections in fp32 (BLAS), the cache of each form, and
// the core attention through the registry, reading the cache in place.
#include "common/frontends/mla.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "common/interface/attention.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/kernels/rope.hpp"
#include "common/kernels/vmath.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"
#include "common/support/runtime.hpp"

namespace attn {
namespace {

// Rows and output columns per projection task: fixed by the problem, never by the thread count, so every
// output element is computed by the same operations at any thread count. Column blocks let a decode step's
// one row spread its (memory-bound) weight read over the threads.
constexpr int64_t kRowsPerTask = 64;
constexpr int64_t kColsPerTask = 256;
constexpr double kRmsEps = 1e-6;  // DeepSeek's RMSNorm eps

// Up to this many rows (a decode step's few tokens) a product with a weight matrix runs as dot products /
// axpys over its rows in vector lanes (vmath), reading each weight once per row straight from memory; sgemm
// would first pack the whole weight block, and a one-row GEMM is all packing (V3's absorbed decode step
// read its 0.75 GB of weights at ~15 GB/s through it). Fixed by the problem, so the operations do not depend
// on the thread count.
constexpr int64_t kDotRows = 4;
// Output columns of one dot-product block: the block's weight rows (<= 16 x the input width, 448 KiB at
// V3's 7168) stay in L2 while the (<= kDotRows) input rows go over them.
constexpr int64_t kDotCols = 16;

// 0, 1, 2, ...: the index list of consecutive rows for vmath's gathered kernels.
const int32_t* iota_index(int64_t n) {
  static const std::vector<int32_t> idx = [] {
    std::vector<int32_t> v(1 << 16);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i);
    return v;
  }();
  if (n > static_cast<int64_t>(idx.size())) throw std::logic_error("iota_index: too long");
  return idx.data();
}

// y[r, c] = x[r, :] . w[c, :] for r < rows (<= kDotRows), c < cols: x rows at stride ldx, w rows at ldw,
// y rows at ldy; `in` the inner width.
void dots_nt(const float* x, int64_t rows, int64_t ldx, const float* w, int64_t ldw, int64_t cols, int64_t in,
             float* y, int64_t ldy) {
  for (int64_t c0 = 0; c0 < cols; c0 += kDotCols) {
    const int64_t nc = std::min(kDotCols, cols - c0);
    for (int64_t r = 0; r < rows; ++r)
      gathered_dots(x + r * ldx, w + c0 * ldw, ldw, in, iota_index(nc), nc, 1.0f, y + r * ldy + c0);
  }
}

// y[r, :] = sum_k x[r, k] w[k, :] for r < rows, w [inner, cols] at stride ldw (y rows at ldy, overwritten).
void axpys_nn(const float* x, int64_t rows, int64_t ldx, const float* w, int64_t ldw, int64_t inner,
              int64_t cols, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    std::fill_n(y + r * ldy, cols, 0.0f);
    gathered_axpy(x + r * ldx, w, ldw, cols, iota_index(inner), inner, y + r * ldy);
  }
}

// y[rows, out] = x[rows, in] W^T, W [out, in] (torch.nn.Linear, no bias).
void linear(const float* x, int64_t rows, const FloatArray& w, float* y) {
  const int64_t out = w.shape[0], in = w.shape[1];
  const int64_t row_tasks = (rows + kRowsPerTask - 1) / kRowsPerTask,
                col_tasks = (out + kColsPerTask - 1) / kColsPerTask;
  tbb::parallel_for(int64_t{0}, row_tasks * col_tasks, [&](int64_t task) {
    const int64_t r0 = task / col_tasks * kRowsPerTask, c0 = task % col_tasks * kColsPerTask;
    const int64_t nr = std::min(kRowsPerTask, rows - r0), nc = std::min(kColsPerTask, out - c0);
    if (rows <= kDotRows)
      dots_nt(x + r0 * in, nr, in, w.ptr() + c0 * in, in, nc, in, y + r0 * out + c0, out);
    else
      sgemm(false, true, nr, nc, in, 1.0f, x + r0 * in, in, w.ptr() + c0 * in, in, 0.0f, y + r0 * out + c0,
            out);
  });
}

// RMSNorm of `rows` rows of `dim` elements at stride ld, in place: sum of squares in double, scale in fp32.
void rms_norm_rows(float* x, int64_t rows, int64_t dim, int64_t ld, const FloatArray& w) {
  tbb::parallel_for(int64_t{0}, rows, [&](int64_t r) {
    float* row = x + r * ld;
    double ss = 0;
    for (int64_t e = 0; e < dim; ++e) ss += static_cast<double>(row[e]) * row[e];
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + kRmsEps));
    for (int64_t e = 0; e < dim; ++e) row[e] = row[e] * inv * w.data[static_cast<std::size_t>(e)];
  });
}

FloatArray uniform(std::vector<int64_t> shape, uint64_t seed, uint64_t stream, double a, double centre = 0) {
  FloatArray t(std::move(shape));
  fill_uniform(t.ptr(), static_cast<int64_t>(t.numel()), mix64(seed ^ mix64(0x4d4c41 + stream)), centre - a,
               centre + a);
  return t;
}

double inv_sqrt(int64_t n) {
  return 1.0 / std::sqrt(static_cast<double>(n));
}

// The members of MlaWeights by file name.
std::array<std::pair<const char*, FloatArray MlaWeights::*>, 8> weight_members() {
  return {{{"wq", &MlaWeights::wq},
           {"wq_a", &MlaWeights::wq_a},
           {"q_norm", &MlaWeights::q_norm},
           {"wq_b", &MlaWeights::wq_b},
           {"wkv_a", &MlaWeights::wkv_a},
           {"kv_norm", &MlaWeights::kv_norm},
           {"wkv_b", &MlaWeights::wkv_b},
           {"wo", &MlaWeights::wo}}};
}

}  // namespace

std::string default_core_variant() {
  for (const Attention* v : Registry::instance().all()) {
    const Capabilities c = v->capabilities();
    if (c.exact && c.strided_kv && c.value_dim && c.gqa && c.causal_lower_right && !c.baseline)
      return v->name();
  }
  return Registry::instance().baseline().name();
}

MlaShape mla_preset(const std::string& name, const std::string& where) {
  MlaShape s;
  if (name == "deepseek_v3") {
    s = {.d_model = 7168,
         .heads = 128,
         .q_lora_rank = 1536,
         .kv_lora_rank = 512,
         .qk_nope_dim = 128,
         .qk_rope_dim = 64,
         .v_head_dim = 128};
  } else if (name == "deepseek_v2_lite") {
    s = {.d_model = 2048,
         .heads = 16,
         .q_lora_rank = 0,
         .kv_lora_rank = 512,
         .qk_nope_dim = 128,
         .qk_rope_dim = 64,
         .v_head_dim = 128};
  } else if (name == "tiny") {
    s = {.d_model = 32,
         .heads = 4,
         .q_lora_rank = 12,
         .kv_lora_rank = 16,
         .qk_nope_dim = 8,
         .qk_rope_dim = 4,
         .v_head_dim = 6};
  } else {
    std::string msg = where + ": unknown MLA preset '" + name + "'";
    if (auto m = did_you_mean(name, mla_preset_names())) msg += " (did you mean '" + *m + "'?)";
    throw UsageError(msg + "; known: deepseek_v3, deepseek_v2_lite, tiny");
  }
  return s;
}

std::vector<std::string> mla_preset_names() {
  return {"deepseek_v3", "deepseek_v2_lite", "tiny"};
}

namespace {
constexpr std::array<std::pair<const char*, int64_t MlaShape::*>, 7> kShapeFields = {{
    {"d_model", &MlaShape::d_model},
    {"heads", &MlaShape::heads},
    {"q_lora_rank", &MlaShape::q_lora_rank},
    {"kv_lora_rank", &MlaShape::kv_lora_rank},
    {"qk_nope_dim", &MlaShape::qk_nope_dim},
    {"qk_rope_dim", &MlaShape::qk_rope_dim},
    {"v_head_dim", &MlaShape::v_head_dim},
}};
}  // namespace

MlaShape mla_shape_from_json(const Json& j, const std::string& where) {
  std::vector<std::string> keys = {"rope_base"};
  for (const auto& [key, member] : kShapeFields) keys.emplace_back(key);
  if (!j.is_object()) throw UsageError(where + ": expected an object with " + join(keys, ", "));
  for (const auto& [key, value] : j.items())
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::string msg = where + ": unknown key '" + key + "'";
      if (auto m = did_you_mean(key, keys)) msg += " (did you mean '" + *m + "'?)";
      throw UsageError(msg + "; allowed: " + join(keys, ", "));
    }
  MlaShape s;
  for (const auto& [key, member] : kShapeFields) {
    if (!j.contains(key)) throw UsageError(where + ": missing '" + key + "'");
    const Json& v = j.at(key);
    if (!v.is_number_integer())
      throw UsageError(where + "." + key + ": expected an integer, got " + v.dump());
    s.*member = v.get<int64_t>();
  }
  if (j.contains("rope_base")) {
    if (!j.at("rope_base").is_number())
      throw UsageError(where + ".rope_base: expected a number, got " + j.at("rope_base").dump());
    s.rope_base = j.at("rope_base").get<double>();
  }
  try {
    s.validate();
  } catch (const UsageError& e) {
    throw UsageError(where + ": " + e.what());
  }
  return s;
}

Json mla_shape_json(const MlaShape& s) {
  Json j = Json::object();
  for (const auto& [key, member] : kShapeFields) j[key] = s.*member;
  j["rope_base"] = s.rope_base;
  return j;
}

std::vector<std::pair<std::string, MlaShape>> load_mla_presets(const std::string& path) {
  const std::string where = "config '" + path + "'";
  Json j;
  try {
    j = Json::parse(read_file_bytes(path));
  } catch (const Json::exception& e) {
    throw UsageError(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("presets") || !j.at("presets").is_object() || j.at("presets").empty())
    throw UsageError(where + ": expected {\"presets\": {NAME: {d_model, heads, ...}, ...}}");
  std::vector<std::pair<std::string, MlaShape>> out;
  for (const auto& [name, shape] : j.at("presets").items())
    out.emplace_back(name, mla_shape_from_json(shape, where + ": presets." + name));
  return out;
}

MlaWeights random_mla_weights(const MlaShape& s, uint64_t seed) {
  s.validate();
  const int64_t E = s.d_model, H = s.heads, qk = s.qk_head_dim();
  MlaWeights w;
  if (s.q_lora_rank == 0) {
    w.wq = uniform({H * qk, E}, seed, 0, inv_sqrt(E));
  } else {
    w.wq_a = uniform({s.q_lora_rank, E}, seed, 1, inv_sqrt(E));
    w.q_norm = uniform({s.q_lora_rank}, seed, 2, 0.5, 1.0);
    w.wq_b = uniform({H * qk, s.q_lora_rank}, seed, 3, inv_sqrt(s.q_lora_rank));
  }
  w.wkv_a = uniform({s.latent_row(), E}, seed, 4, inv_sqrt(E));
  w.kv_norm = uniform({s.kv_lora_rank}, seed, 5, 0.5, 1.0);
  w.wkv_b = uniform({H * (s.qk_nope_dim + s.v_head_dim), s.kv_lora_rank}, seed, 6, inv_sqrt(s.kv_lora_rank));
  w.wo = uniform({E, H * s.v_head_dim}, seed, 7, inv_sqrt(H * s.v_head_dim));
  return w;
}

MlaWeights load_mla_weights(const std::string& dir, const MlaShape& shape) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw UsageError("MLA weights directory '" + dir +
                     "': " + (fs::exists(dir, ec) ? "is not a directory" : "does not exist"));
  // A file that looks like a weight but is none of them is a likely typo (it would be silently ignored).
  std::vector<std::string> known;
  for (const auto& [name, member] : weight_members()) known.push_back(std::string(name) + ".npy");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    const bool looks_like_weight =
        (file.starts_with("w") || file.ends_with("_norm.npy")) && file.ends_with(".npy");
    if (looks_like_weight && std::find(known.begin(), known.end(), file) == known.end()) {
      std::string msg = "MLA weights directory '" + dir + "': unexpected file '" + file + "'";
      if (auto m = did_you_mean(file, known)) msg += " (did you mean '" + *m + "'?)";
      throw UsageError(msg + "; allowed: " + join(known, ", "));
    }
  }
  MlaWeights w;
  for (const auto& [name, member] : weight_members()) {
    const std::string path = (fs::path(dir) / (std::string(name) + ".npy")).string();
    if (fs::exists(path, ec)) w.*member = read_npy_float(path);
  }
  try {
    w.validate(shape);
  } catch (const UsageError& e) {
    throw UsageError("MLA weights directory '" + dir + "' (" + shape.str() + "): " + e.what());
  }
  return w;
}

void save_mla_weights(const std::string& dir, const MlaWeights& weights, const MlaShape& shape) {
  weights.validate(shape);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UsageError("MLA weights directory '" + dir + "': cannot create (" + ec.message() + ")");
  for (const auto& [name, member] : weight_members())
    if ((weights.*member).numel())
      write_npy((std::filesystem::path(dir) / (std::string(name) + ".npy")).string(), weights.*member);
}

namespace {
// DeepSeek's names of the two forms (inference/model.py attn_impl "naive" / "absorb"); the first is the
// name of a form of MLA, not of the variant that shares it.
constexpr const char* kNaiveForm = "naive";  // structure: not a variant
constexpr const char* kAbsorbedForm = "absorbed";
}  // namespace

const char* mla_form_name(MlaForm f) {
  return f == MlaForm::naive ? kNaiveForm : kAbsorbedForm;
}

MlaForm parse_mla_form(const std::string& text, const std::string& where) {
  if (text == kNaiveForm) return MlaForm::naive;
  if (text == kAbsorbedForm) return MlaForm::absorbed;
  throw UsageError(where + ": unknown MLA form '" + text + "' (allowed: naive, absorbed)");
}

int64_t mla_cache_elements_per_token(const MlaShape& s, MlaForm form) {
  return form == MlaForm::absorbed ? s.latent_row() : s.heads * (s.qk_head_dim() + s.v_head_dim);
}

MlaCache::MlaCache(const MlaShape& shape, MlaForm form, int64_t batch, int64_t capacity)
    : shape_(shape), form_(form), batch_(batch), capacity_(capacity) {
  shape.validate();
  if (batch < 1 || capacity < 1)
    throw UsageError("MLA cache: batch " + std::to_string(batch) + " and capacity " +
                     std::to_string(capacity) + " tokens; both must be >= 1");
  const int64_t per_token = mla_cache_elements_per_token(shape, form);
  if (capacity > kMaxTensorElements / batch / per_token)
    throw UsageError("MLA cache: batch " + std::to_string(batch) + " x capacity " + std::to_string(capacity) +
                     " x " + std::to_string(per_token) + " elements per token exceeds 2^58 elements");
  if (form == MlaForm::absorbed) {
    kv = FloatArray({batch, capacity, shape.latent_row()});
  } else {
    k = FloatArray({batch, shape.heads, capacity, shape.qk_head_dim()});
    v = FloatArray({batch, shape.heads, capacity, shape.v_head_dim});
  }
}

void MlaCache::truncate(int64_t length) {
  if (length < 0 || length > length_)
    throw UsageError("MLA cache: truncate to " + std::to_string(length) + " tokens; it holds " +
                     std::to_string(length_) + " (allowed: 0 .. " + std::to_string(length_) + ")");
  length_ = length;
}

std::size_t MlaCache::bytes() const {
  return static_cast<std::size_t>(batch_ * length_) * bytes_per_token();
}

MlaLayer::MlaLayer(MlaShape shape, MlaWeights weights) : shape_(shape), weights_(std::move(weights)) {
  weights_.validate(shape_);
}

Problem MlaLayer::core_problem(MlaForm form, const MlaCall& call, int64_t batch, int64_t seq_q,
                               int64_t context) const {
  const Attention& variant =
      Registry::instance().get(call.variant.empty() ? default_core_variant() : call.variant);
  Problem p = make_problem(variant.name(), call.params);
  p.batch = batch;
  p.heads = shape_.heads;
  p.seq_q = seq_q;
  p.seq_kv = context + seq_q;
  if (form == MlaForm::absorbed) {
    p.kv_heads = 1;
    p.head_dim = shape_.latent_row();
    p.v_head_dim = shape_.kv_lora_rank;
  } else {
    p.head_dim = shape_.qk_head_dim();
    p.v_head_dim = shape_.v_head_dim;
  }
  p.mask.causal_lower_right = true;
  p.scale = shape_.softmax_scale();
  p.validate();
  std::string why = variant.unsupported_reasons_text(p);
  if (const Capabilities c = variant.capabilities(); !c.strided_kv)
    why += std::string(why.empty() ? "" : "; ") + variant.name() +
           " reads K and V only contiguous, and MLA's core reads its reserved cache in place (capability "
           "strided_kv)";
  else if (c.gate != Gate::none || c.beta)
    why += std::string(why.empty() ? "" : "; ") + variant.name() + " reads per-token gates (g / beta)";
  if (!why.empty()) throw NotSupported(p.repro() + ": " + why);
  return p;
}

namespace {

// The per-call buffers of the projections shared by both forms: q [B*s][H*qk] (q_pe rotated), the latent
// c_kv [B*s][kv_lora] (normalised) and k_pe [B*s][rope] (rotated).
struct Projected {
  std::vector<float> q, latent, k_pe;
};

// with_query false: the cache's part only (latent, k_pe); q stays empty.
Projected project(const MlaShape& s, const MlaWeights& w, const FloatArray& x, int64_t context,
                  bool with_query = true) {
  const int64_t B = x.shape[0], n = x.shape[1], rows = B * n, H = s.heads, qk = s.qk_head_dim();
  const int64_t nope = s.qk_nope_dim, rope = s.qk_rope_dim, kvl = s.kv_lora_rank, lat = s.latent_row();
  Projected out;
  if (with_query) {
    out.q.resize(static_cast<std::size_t>(rows * H * qk));
    if (s.q_lora_rank == 0) {
      linear(x.ptr(), rows, w.wq, out.q.data());
    } else {
      std::vector<float> a(static_cast<std::size_t>(rows * s.q_lora_rank));
      linear(x.ptr(), rows, w.wq_a, a.data());
      rms_norm_rows(a.data(), rows, s.q_lora_rank, s.q_lora_rank, w.q_norm);
      linear(a.data(), rows, w.wq_b, out.q.data());
    }
  }
  std::vector<float> kv(static_cast<std::size_t>(rows * lat));
  linear(x.ptr(), rows, w.wkv_a, kv.data());
  rms_norm_rows(kv.data(), rows, kvl, lat, w.kv_norm);
  out.latent.resize(static_cast<std::size_t>(rows * kvl));
  out.k_pe.resize(static_cast<std::size_t>(rows * rope));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(kv.data() + r * lat, kvl, out.latent.data() + r * kvl);
    std::copy_n(kv.data() + r * lat + kvl, rope, out.k_pe.data() + r * rope);
  }
  // RoPE at positions context .. context + n - 1 (DeepSeek's view_as_complex pairs: RopeMode::normal): k_pe
  // as B blocks of [n][rope]; q_pe gathered into B * H blocks of [n][rope] and put back.
  const RopeSpec spec{RopeMode::normal, s.rope_base};
  apply_rope(spec, out.k_pe.data(), B, n, rope, context);
  if (!with_query) return out;
  std::vector<float> q_pe(static_cast<std::size_t>(rows * H * rope));
  auto q_pe_at = [&](int64_t b, int64_t i, int64_t h) { return q_pe.data() + ((b * H + h) * n + i) * rope; };
  auto q_at = [&](int64_t b, int64_t i, int64_t h) {
    return out.q.data() + ((b * n + i) * H + h) * qk + nope;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < H; ++h) std::copy_n(q_at(b, i, h), rope, q_pe_at(b, i, h));
  apply_rope(spec, q_pe.data(), B * H, n, rope, context);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < H; ++h) std::copy_n(q_pe_at(b, i, h), rope, q_at(b, i, h));
  return out;
}

void require_finite(const FloatArray& t, const std::string& name) {
  for (std::size_t e = 0; e < t.numel(); ++e)
    if (!std::isfinite(t.data[e]))
      throw UsageError(name + ": non-finite value " + std::to_string(t.data[e]) + " at flat index " +
                       std::to_string(e) + "; inputs must be finite");
}

// The cache rows of the n tokens projected in `pr` (B * n rows), at positions T .. T + n - 1: absorbed [c_kv
// | k_pe]; naive every head's K = [k_nope (wkv_b c_kv), k_pe] and V (wkv_b c_kv).
void write_cache_rows(const MlaShape& s, const MlaWeights& w, const Projected& pr, MlaCache& cache, int64_t B,
                      int64_t n, int64_t T) {
  const int64_t H = s.heads, qk = s.qk_head_dim(), nope = s.qk_nope_dim, rope = s.qk_rope_dim;
  const int64_t kvl = s.kv_lora_rank, lat = s.latent_row(), dv = s.v_head_dim, cap = cache.capacity();
  if (cache.form() == MlaForm::absorbed) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i) {
        float* row = cache.kv.ptr() + (b * cap + T + i) * lat;
        std::copy_n(pr.latent.data() + (b * n + i) * kvl, kvl, row);
        std::copy_n(pr.k_pe.data() + (b * n + i) * rope, rope, row + kvl);
      }
    return;
  }
  std::vector<float> kvb(static_cast<std::size_t>(B * n * H * (nope + dv)));
  linear(pr.latent.data(), B * n, w.wkv_b, kvb.data());
  tbb::parallel_for(int64_t{0}, B * H, [&](int64_t bh) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t i = 0; i < n; ++i) {
      const float* src = kvb.data() + ((b * n + i) * H + h) * (nope + dv);
      float* krow = cache.k.ptr() + (bh * cap + T + i) * qk;
      std::copy_n(src, nope, krow);
      std::copy_n(pr.k_pe.data() + (b * n + i) * rope, rope, krow + nope);
      std::copy_n(src + nope, dv, cache.v.ptr() + (bh * cap + T + i) * dv);
    }
  });
}

}  // namespace

void MlaLayer::check_call(const FloatArray& x, const MlaCache& cache) const {
  const MlaShape& s = shape_;
  if (x.rank() != 3 || x.shape[2] != s.d_model || x.shape[0] < 1 || x.shape[1] < 1)
    throw UsageError("x: shape " + x.shape_str() + "; expected [batch, new tokens, " +
                     std::to_string(s.d_model) + "] (d_model of the MLA layer)");
  if (cache.shape() != s)
    throw UsageError("MLA cache: made for " + cache.shape().str() + ", the layer is " + s.str());
  if (cache.batch() != x.shape[0])
    throw UsageError("MLA cache: batch " + std::to_string(cache.batch()) + " differs from x's batch " +
                     std::to_string(x.shape[0]));
  const int64_t n = x.shape[1], T = cache.length();
  if (n > cache.capacity() - T)
    throw UsageError("MLA cache: holds " + std::to_string(T) + " of its capacity " +
                     std::to_string(cache.capacity()) + " tokens; " + std::to_string(n) +
                     " more do not fit (reserve a larger capacity)");
  require_finite(x, "x");
}

void MlaLayer::append(const FloatArray& x, MlaCache& cache) const {
  check_call(x, cache);
  const int64_t B = x.shape[0], n = x.shape[1], T = cache.length();
  write_cache_rows(shape_, weights_, project(shape_, weights_, x, T, /*with_query=*/false), cache, B, n, T);
  cache.length_ = T + n;
}

FloatArray MlaLayer::forward(const FloatArray& x, MlaCache& cache, const MlaCall& call,
                             double* core_ms) const {
  check_call(x, cache);
  const MlaShape& s = shape_;
  const int64_t B = x.shape[0], n = x.shape[1], T = cache.length();
  const MlaForm form = cache.form();
  const Problem p = core_problem(form, call, B, n, T);
  const int64_t H = s.heads, qk = s.qk_head_dim(), nope = s.qk_nope_dim, rope = s.qk_rope_dim;
  const int64_t kvl = s.kv_lora_rank, lat = s.latent_row(), dv = s.v_head_dim, cap = cache.capacity();
  const Projected pr = project(s, weights_, x, T);
  write_cache_rows(s, weights_, pr, cache, B, n, T);
  const float* wkv_b = weights_.wkv_b.ptr();
  // The core's call alone, timed when asked (two clock reads).
  auto run_core = [&](const AttentionInputs& in) {
    const auto t0 = std::chrono::steady_clock::now();
    Registry::instance().get(p.variant).run(p, in);
    if (core_ms)
      *core_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<float> merged(static_cast<std::size_t>(B * n * H * dv));  // [B*n][H*dv], wo's input
  if (form == MlaForm::absorbed) {
    // Query [B, H, n, lat]: q_nope W_uk (W_uk = wkv_b's rows h*(nope+dv) .. + nope: [nope, kvl]) | q_pe.
    FloatArray q({B, H, n, lat}), o_lat({B, H, n, kvl});
    tbb::parallel_for(int64_t{0}, B * H, [&](int64_t bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* qn = pr.q.data() + (b * n * H + h) * qk;
      float* qa = q.ptr() + bh * n * lat;
      if (n <= kDotRows)
        axpys_nn(qn, n, H * qk, wkv_b + h * (nope + dv) * kvl, kvl, nope, kvl, qa, lat);
      else
        sgemm(false, false, n, kvl, nope, 1.0f, qn, H * qk, wkv_b + h * (nope + dv) * kvl, kvl, 0.0f, qa,
              lat);
      for (int64_t i = 0; i < n; ++i) std::copy_n(qn + i * H * qk + nope, rope, qa + i * lat + kvl);
    });
    // Multi-query attention over the cache; V = the latent, the first kvl columns of K's rows, in place.
    AttentionInputs in{};
    in.q = q.ptr();
    in.k = cache.kv.ptr();
    in.v = cache.kv.ptr();
    in.out = o_lat.ptr();
    in.kv_capacity = cap;
    in.v_row_stride = lat;
    run_core(in);
    // Each head's output times W_uv^T (W_uv = wkv_b's rows h*(nope+dv) + nope .. + dv: [dv, kvl]).
    tbb::parallel_for(int64_t{0}, B * H, [&](int64_t bh) {
      const int64_t b = bh / H, h = bh % H;
      if (n <= kDotRows)
        dots_nt(o_lat.ptr() + bh * n * kvl, n, kvl, wkv_b + (h * (nope + dv) + nope) * kvl, kvl, dv, kvl,
                merged.data() + b * n * H * dv + h * dv, H * dv);
      else
        sgemm(false, true, n, dv, kvl, 1.0f, o_lat.ptr() + bh * n * kvl, kvl,
              wkv_b + (h * (nope + dv) + nope) * kvl, kvl, 0.0f, merged.data() + b * n * H * dv + h * dv,
              H * dv);
    });
  } else {
    // Every head's query [B, H, n, qk]; its K and V rows went into the cache above.
    FloatArray q({B, H, n, qk}), o({B, H, n, dv});
    tbb::parallel_for(int64_t{0}, B * H, [&](int64_t bh) {
      const int64_t b = bh / H, h = bh % H;
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(pr.q.data() + ((b * n + i) * H + h) * qk, qk, q.ptr() + (bh * n + i) * qk);
    });
    AttentionInputs in{};
    in.q = q.ptr();
    in.k = cache.k.ptr();
    in.v = cache.v.ptr();
    in.out = o.ptr();
    in.kv_capacity = cap;
    run_core(in);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < n; ++i)
          std::copy_n(o.ptr() + ((b * H + h) * n + i) * dv, dv,
                      merged.data() + (b * n + i) * H * dv + h * dv);
  }
  cache.length_ = T + n;
  FloatArray y({B, n, s.d_model});
  linear(merged.data(), B * n, weights_.wo, y.ptr());
  return y;
}

double MlaLayer::flops(MlaForm form, const MlaCall& call, int64_t batch, int64_t n, int64_t context) const {
  const MlaShape& s = shape_;
  const double rows = static_cast<double>(batch * n), E = static_cast<double>(s.d_model),
               H = static_cast<double>(s.heads), qk = static_cast<double>(s.qk_head_dim()),
               nope = static_cast<double>(s.qk_nope_dim), dv = static_cast<double>(s.v_head_dim),
               kvl = static_cast<double>(s.kv_lora_rank), lat = static_cast<double>(s.latent_row());
  double per_row = s.q_lora_rank == 0 ? 2 * E * H * qk
                                      : 2 * E * static_cast<double>(s.q_lora_rank) +
                                            2 * static_cast<double>(s.q_lora_rank) * H * qk;
  per_row += 2 * E * lat + 2 * H * dv * E;                       // wkv_a, wo
  per_row += form == MlaForm::naive ? 2 * kvl * H * (nope + dv)  // wkv_b on the new tokens' latents
                                    : 2 * H * nope * kvl + 2 * H * kvl * dv;  // absorb W_uk, un-absorb W_uv
  const Problem p = core_problem(form, call, batch, n, context);
  return rows * per_row + Registry::instance().get(p.variant).flops(p);
}

double MlaLayer::bytes_read(MlaForm form, int64_t batch, int64_t n, int64_t context) const {
  double weights = 0;
  for (const auto& [name, member] : weight_members())
    weights += static_cast<double>((weights_.*member).numel());
  const double cache =
      static_cast<double>(batch * (context + n) * mla_cache_elements_per_token(shape_, form));
  const double x = static_cast<double>(batch * n * shape_.d_model);
  return (weights + cache + x) * sizeof(float);
}

}  // namespace attn
