// Problem descriptor: validation and the canonical repro string.
#include "common/interface/problem.hpp"

#include <charconv>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "common/support/error.hpp"

namespace attn {

namespace {
// Sizes beyond this are refused outright (no tensor of 2^40 elements fits any machine this runs on).
constexpr int64_t kMaxDim = int64_t{1} << 40;
}  // namespace

std::string MaskSpec::str() const {
  if (!any()) return "none";
  std::string s;
  auto add = [&](const char* part) { s += (s.empty() ? "" : "+") + std::string(part); };
  if (causal) add("causal");
  if (causal_lower_right) add("causal_lower_right");
  if (boolean) add("bool");
  if (key_padding) add("pad");
  return s;
}

MaskSpec parse_mask(const std::string& text, const std::string& where, double* pad_fraction) {
  MaskSpec m;
  if (text == "none" || text.empty()) return m;
  const std::string allowed =
      pad_fraction ? "none, or causal, causal_lower_right, pad, pad=F with F in [0, 1], joined by '+'"
                   : "none, or causal, causal_lower_right, bool, pad joined by '+'";
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, '+')) {
    if (part == "causal") {
      m.causal = true;
    } else if (part == "causal_lower_right") {
      m.causal_lower_right = true;
    } else if (part == "bool" && !pad_fraction) {
      m.boolean = true;
    } else if (part == "pad") {
      m.key_padding = true;
    } else if (pad_fraction && part.rfind("pad=", 0) == 0) {
      m.key_padding = true;
      double f = 0;
      try {
        std::size_t used = 0;
        f = std::stod(part.substr(4), &used);
        if (used != part.size() - 4) throw std::invalid_argument(part);
      } catch (const std::exception&) {
        throw UsageError(where + ": padding fraction in '" + text + "' is not a number");
      }
      if (!(f >= 0 && f <= 1))
        throw UsageError(where + ": padding fraction must be in [0, 1], got '" + part.substr(4) + "'");
      *pad_fraction = f;
    } else {
      throw UsageError(where + ": unknown mask '" + part + "' in '" + text + "' (allowed: " + allowed + ")");
    }
  }
  return m;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
    default:
      return "fp32";
  }
}

DType parse_dtype(const std::string& text, const std::string& where) {
  for (DType t : {DType::fp32, DType::bf16, DType::fp16})
    if (text == dtype_name(t)) return t;
  throw UsageError(where + ": unknown dtype '" + text + "' (allowed: fp32, bf16, fp16)");
}

const char* bias_name(Bias b) {
  return b == Bias::alibi ? "alibi" : "none";
}

Bias parse_bias(const std::string& text, const std::string& where) {
  if (text == "none") return Bias::none;
  if (text == "alibi") return Bias::alibi;
  throw UsageError(where + ": unknown bias '" + text + "' (allowed: none, alibi)");
}

double Problem::effective_scale() const {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

const Json& Problem::param(const std::string& name) const {
  if (!params.contains(name))
    throw std::logic_error("variant '" + variant + "' has no parameter '" + name + "'");
  return params.at(name);
}
int64_t Problem::param_int(const std::string& name) const {
  return param(name).get<int64_t>();
}
double Problem::param_number(const std::string& name) const {
  return param(name).get<double>();
}
std::string Problem::param_string(const std::string& name) const {
  return param(name).get<std::string>();
}

std::string Problem::repro() const {
  std::ostringstream s;
  s << variant;
  if (!params.empty()) {
    s << "{";
    bool first = true;
    // Spec order (stable across JSON key order) when param_order covers params, else key order.
    std::vector<std::string> names;
    for (const auto& n : param_order)
      if (params.contains(n)) names.push_back(n);
    if (names.size() != params.size()) {
      names.clear();
      for (auto it = params.begin(); it != params.end(); ++it) names.push_back(it.key());
    }
    for (const auto& n : names) {
      s << (first ? "" : ",") << n << "=" << param_value_text(params.at(n));
      first = false;
    }
    s << "}";
  }
  s << ":B=" << batch << ",H=" << heads;
  if (num_kv_heads() != heads) s << ",Hkv=" << num_kv_heads();
  s << ",Lq=" << seq_q << ",Lkv=" << seq_kv << ",D=" << head_dim;
  if (distinct_value_dim()) s << ",Dv=" << value_dim();
  if (mask.any()) s << "," << mask.str();
  if (bias != Bias::none) s << "," << bias_name(bias);
  if (dtype != DType::fp32) s << ",dtype=" << dtype_name(dtype);
  if (scale) s << ",scale=" << shortest_double_text(*scale);
  if (softcap) s << ",softcap=" << shortest_double_text(*softcap);
  if (sinks) s << ",sinks";
  if (initial_state) s << ",state0";
  if (dropout > 0) s << ",dropout=" << shortest_double_text(dropout) << ",seed=" << seed;
  return s.str();
}

void Problem::validate() const {
  auto check_size = [](const char* field, int64_t v) {
    if (v < 1 || v > kMaxDim)
      throw UsageError(std::string(field) + ": must be an integer in [1, 2^40], got " + std::to_string(v));
  };
  check_size("batch", batch);
  check_size("heads", heads);
  check_size("seq_q", seq_q);
  check_size("seq_kv", seq_kv);
  check_size("head_dim", head_dim);
  if (v_head_dim != 0) check_size("v_head_dim", v_head_dim);
  if (kv_heads < 0 || kv_heads > heads || (kv_heads > 0 && heads % kv_heads != 0))
    throw UsageError("kv_heads: must divide heads (query heads " + std::to_string(heads) +
                     " into groups of equal size), got kv_heads " + std::to_string(kv_heads) +
                     " with heads " + std::to_string(heads));
  // Each size is at most 2^40, but their product can still overflow 64 bits: check it without wrapping.
  auto check_elements = [&](const char* seq_name, int64_t seq, const char* dim_name, int64_t dim,
                            const char* tensors) {
    int64_t n = batch;
    const bool overflow = __builtin_mul_overflow(n, heads, &n) || __builtin_mul_overflow(n, seq, &n) ||
                          __builtin_mul_overflow(n, dim, &n);
    if (overflow || n > kMaxTensorElements) {
      std::ostringstream s;
      s << "batch x heads x " << seq_name << " x " << dim_name << " (the elements of " << tensors
        << ") = " << batch << " x " << heads << " x " << seq << " x " << dim << " = "
        << static_cast<double>(batch) * static_cast<double>(heads) * static_cast<double>(seq) *
               static_cast<double>(dim)
        << ": must be at most 2^58 = " << kMaxTensorElements
        << " (so that every byte count of the problem fits in 64 bits)";
      throw UsageError(s.str());
    }
  };
  const bool dv = distinct_value_dim();
  check_elements("seq_q", seq_q, "head_dim", head_dim, dv ? "Q" : "Q and the output");
  // K/V have kv_heads <= heads heads: bounded by these
  check_elements("seq_kv", seq_kv, "head_dim", head_dim, dv ? "K" : "K and V");
  if (dv) {
    check_elements("seq_q", seq_q, "v_head_dim", value_dim(), "the output");
    check_elements("seq_kv", seq_kv, "v_head_dim", value_dim(), "V");
  }
  if (scale && (!std::isfinite(*scale) || *scale <= 0))
    throw UsageError("scale: must be a finite number > 0, got " + std::to_string(*scale));
  if (softcap && (!std::isfinite(*softcap) || *softcap <= 0))
    throw UsageError("softcap: must be a finite number > 0 (the cap C of C tanh(s / C)), got " +
                     std::to_string(*softcap));
  if (!(dropout >= 0.0 && dropout < 1.0))
    throw UsageError("dropout: must be a probability in [0, 1), got " + std::to_string(dropout));
}

void parse_problem_shape(const std::string& tail, const std::string& where, Problem& p) {
  std::stringstream ss(tail);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t eq = item.find('=');
    if (eq == std::string::npos) {
      if (item == "alibi")
        p.bias = Bias::alibi;
      else if (item == "sinks")
        p.sinks = true;
      else if (item == "state0")
        p.initial_state = true;
      else
        p.mask = parse_mask(item, where);
      continue;
    }
    std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    // Strict: the whole value must be a number of the field's kind (no trailing junk, no sign on counts).
    auto whole_int = [&](auto& field) {
      using T = std::remove_reference_t<decltype(field)>;
      T x{};
      const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
      if (r.ec == std::errc::result_out_of_range)
        throw UsageError(where + ": field '" + k + "' value '" + v + "' is out of range");
      if (r.ec != std::errc() || r.ptr != v.data() + v.size() || v.empty() || v[0] == '-' || v[0] == '+')
        throw UsageError(where + ": field '" + k + "' has a non-numeric value '" + v +
                         "' (a non-negative integer is expected)");
      field = x;
    };
    auto whole_double = [&]() {
      double x = 0;
      const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
      if (r.ec == std::errc::result_out_of_range)
        throw UsageError(where + ": field '" + k + "' value '" + v + "' is out of range");
      if (r.ec != std::errc() || r.ptr != v.data() + v.size() || v.empty())
        throw UsageError(where + ": field '" + k + "' has a non-numeric value '" + v + "'");
      return x;
    };
    if (k == "B")
      whole_int(p.batch);
    else if (k == "H")
      whole_int(p.heads);
    else if (k == "Hkv")
      whole_int(p.kv_heads);
    else if (k == "Lq")
      whole_int(p.seq_q);
    else if (k == "Lkv")
      whole_int(p.seq_kv);
    else if (k == "D")
      whole_int(p.head_dim);
    else if (k == "Dv")
      whole_int(p.v_head_dim);
    else if (k == "scale")
      p.scale = whole_double();
    else if (k == "dropout")
      p.dropout = whole_double();
    else if (k == "seed")
      whole_int(p.seed);
    else if (k == "dtype")
      p.dtype = parse_dtype(v, where + ": field 'dtype'");
    else if (k == "softcap")
      p.softcap = whole_double();
    else
      throw UsageError(where + ": unknown field '" + k +
                       "' (B, H, Hkv, Lq, Lkv, D, Dv, dtype, scale, softcap, dropout, seed)");
  }
  p.validate();
}

}  // namespace attn
