// Sinusoidal and learned positional encodings and their combination with token embeddings.
#include "common/frontends/positional.hpp"

#include <algorithm>
#include <cmath>

#include "common/io/npy.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"

namespace attn {
namespace {

// Same cap as the embedding tables (4 GiB of fp32): a typo should not allocate the machine away.
constexpr int64_t kMaxElements = int64_t{1} << 30;

void check_shape(int64_t length, int64_t dim, const std::string& what) {
  if (length < 1 || dim < 1 || length > kMaxElements / dim)
    throw UsageError(what + ": length " + std::to_string(length) + " x dim " + std::to_string(dim) +
                     " is outside the allowed 1 .. 2^30 elements (both >= 1)");
}

}  // namespace

PositionalKind parse_positional_kind(const std::string& text, const std::string& where) {
  if (text == "none") return PositionalKind::none;
  if (text == "sinusoidal") return PositionalKind::sinusoidal;
  if (text == "learned") return PositionalKind::learned;
  if (text == "rope") return PositionalKind::rope;
  throw UsageError(where + ": unknown positional encoding '" + text +
                   "'; allowed: sinusoidal, learned, none, rope");
}

PositionalCombine parse_positional_combine(const std::string& text, const std::string& where) {
  if (text == "add") return PositionalCombine::add;
  if (text == "concat") return PositionalCombine::concat;
  throw UsageError(where + ": unknown combination '" + text + "'; allowed: add, concat");
}

std::string positional_kind_name(PositionalKind kind) {
  switch (kind) {
    case PositionalKind::none:
      return "none";
    case PositionalKind::sinusoidal:
      return "sinusoidal";
    case PositionalKind::learned:
      return "learned";
    case PositionalKind::rope:
      return "rope";
  }
  return "?";
}

std::string positional_combine_name(PositionalCombine combine) {
  return combine == PositionalCombine::add ? "add" : "concat";
}

FloatArray sinusoidal_encoding(int64_t length, int64_t dim) {
  check_shape(length, dim, "sinusoidal encoding");
  FloatArray pe({length, dim});
  // Column 2i and 2i+1 share the frequency 10000^(-2i/dim); computed once per pair.
  std::vector<double> inv_freq(static_cast<std::size_t>((dim + 1) / 2));
  for (std::size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = 1.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / static_cast<double>(dim));
  for (int64_t t = 0; t < length; ++t) {
    float* row = pe.ptr() + t * dim;
    for (int64_t c = 0; c < dim; ++c) {
      const double angle = static_cast<double>(t) * inv_freq[static_cast<std::size_t>(c / 2)];
      row[c] = static_cast<float>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  }
  return pe;
}

FloatArray seeded_learned_encoding(int64_t length, int64_t dim, uint64_t seed) {
  check_shape(length, dim, "learned positional encoding");
  FloatArray pe({length, dim});
  // Its own stream family, so the same seed for the token table and this one gives unrelated values.
  fill_normal(pe.ptr(), length * dim, mix64(seed ^ 0xbb67ae8584caa73bULL));
  return pe;
}

FloatArray load_learned_encoding(const std::string& path) {
  FloatArray pe = read_npy_float(path);
  if (pe.rank() != 2)
    throw UsageError("learned positional table '" + path + "': shape " + pe.shape_str() +
                     "; expected rank 2 [max_len, dim]");
  if (pe.shape[0] < 1 || pe.shape[1] < 1)
    throw UsageError("learned positional table '" + path + "': shape " + pe.shape_str() + " is empty");
  for (std::size_t e = 0; e < pe.numel(); ++e)
    if (!std::isfinite(pe.data[e]))
      throw UsageError("learned positional table '" + path + "': non-finite value at row " +
                       std::to_string(static_cast<int64_t>(e) / pe.shape[1]) + ", column " +
                       std::to_string(static_cast<int64_t>(e) % pe.shape[1]));
  return pe;
}

FloatArray combine_positional(const FloatArray& embedded, const FloatArray& encoding,
                              PositionalCombine combine, const std::string& where) {
  if (embedded.rank() != 2)
    throw UsageError("positional combine: embeddings have shape " + embedded.shape_str() +
                     "; expected [L, D]");
  if (encoding.rank() != 2)
    throw UsageError(where + ": shape " + encoding.shape_str() + "; expected rank 2 [max_len, dim]");
  const int64_t L = embedded.shape[0], D = embedded.shape[1], P = encoding.shape[1];
  if (encoding.shape[0] < L)
    throw UsageError(where + ": has " + std::to_string(encoding.shape[0]) +
                     " rows (positions) but the text has " + std::to_string(L) +
                     " tokens; use a longer table or fewer tokens");
  if (combine == PositionalCombine::add) {
    if (P != D)
      throw UsageError(where + ": width " + std::to_string(P) + " cannot be added to embeddings of width " +
                       std::to_string(D) + "; widths must be equal for add (concat allows any width)");
    FloatArray out = embedded;
    for (int64_t e = 0; e < L * D; ++e)
      out.data[static_cast<std::size_t>(e)] += encoding.data[static_cast<std::size_t>(e)];
    return out;
  }
  FloatArray out({L, D + P});
  for (int64_t t = 0; t < L; ++t) {
    std::copy_n(embedded.ptr() + t * D, D, out.ptr() + t * (D + P));
    std::copy_n(encoding.ptr() + t * P, P, out.ptr() + t * (D + P) + D);
  }
  return out;
}

FloatArray apply_positional(const FloatArray& embedded, const PositionalSpec& spec) {
  if (embedded.rank() != 2)
    throw UsageError("positional encoding: embeddings have shape " + embedded.shape_str() +
                     "; expected [L, D]");
  const int64_t L = embedded.shape[0], D = embedded.shape[1];
  switch (spec.kind) {
    case PositionalKind::none:
    case PositionalKind::rope:  // rotary: applied to q and k in the layer, nothing is added here
      return embedded;
    case PositionalKind::sinusoidal:
      return combine_positional(embedded, sinusoidal_encoding(L, D), spec.combine, "sinusoidal encoding");
    case PositionalKind::learned:
      if (spec.learned_path.empty())
        return combine_positional(embedded, seeded_learned_encoding(L, D, spec.learned_seed), spec.combine,
                                  "seeded learned encoding");
      return combine_positional(embedded, load_learned_encoding(spec.learned_path), spec.combine,
                                "learned positional table '" + spec.learned_path + "'");
  }
  throw std::logic_error("apply_positional: unhandled positional kind");
}

}  // namespace attn
