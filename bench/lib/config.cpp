// Config parsing and validation, one function per section of the file. Nothing runs and nothing is written
// until the whole config (and then its plan) is valid.
#include "bench/lib/config.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "common/interface/attention.hpp"
#include "common/interface/plugin_loader.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/error.hpp"
#include "common/support/hash.hpp"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& msg) {
  throw UsageError(path + ": " + msg);
}

// Rejects keys of `obj` outside `allowed`, with a did-you-mean.
void check_keys(const Json& obj, const std::string& path, const std::vector<std::string>& allowed) {
  if (!obj.is_object()) fail(path.empty() ? "config" : path, "must be an object, got " + obj.dump());
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end()) continue;
    std::string msg = "unknown key '" + it.key() + "'";
    if (auto m = did_you_mean(it.key(), allowed)) msg += " (did you mean '" + *m + "'?)";
    fail(path.empty() ? it.key() : path + "." + it.key(), msg + "; allowed: " + join(allowed));
  }
}

std::string sub(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}
std::string idx(const std::string& path, std::size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

int64_t get_int(const Json& v, const std::string& path, int64_t lo, int64_t hi, const char* what) {
  bool ok = v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                      v.get<double>() == std::floor(v.get<double>()));
  if (!ok) fail(path, std::string("must be ") + what + ", got " + v.dump());
  const double d = v.get<double>();
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
    fail(path, std::string("must be ") + what + ", got " + v.dump());
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(d);
}

double get_number(const Json& v, const std::string& path, double lo, double hi, const std::string& what) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo || v.get<double>() > hi)
    fail(path, "must be " + what + ", got " + v.dump());
  return v.get<double>();
}

// An axis: one value or a non-empty list of values.
template <class F>
void for_axis(const Json& v, const std::string& path, F&& each) {
  if (v.is_array()) {
    if (v.empty()) fail(path, "must not be an empty list");
    for (std::size_t i = 0; i < v.size(); ++i) each(v[i], idx(path, i));
  } else {
    each(v, path);
  }
}

constexpr int64_t kMaxSize = int64_t{1} << 40;
// sweep.threads above this is no machine's core count (the plan checks the cores this machine has).
constexpr int64_t kMaxThreads = 1 << 16;

// The most points one config may expand to (the presets have at most a few hundred). At a second or more per
// point this is hours of measuring; far more is an axis list gone wrong, whose expansion and checks would
// take minutes and gigabytes before anything runs.
constexpr uint64_t kMaxPoints = 10000;

// a * b, saturating at kMaxPoints + 1 (a is at most kMaxPoints + 1 and b a list's length: no overflow).
uint64_t points_product(uint64_t a, uint64_t b) {
  return std::min<uint64_t>(a * b, kMaxPoints + 1);
}

std::vector<int64_t> size_axis(const Json& v, const std::string& path) {
  std::vector<int64_t> out;
  for_axis(v, path, [&](const Json& x, const std::string& p) {
    if (x.is_number() && x.get<double>() > static_cast<double>(kMaxSize))
      fail(p, "must be a positive integer at most 2^40 = " + std::to_string(kMaxSize) + ", got " + x.dump());
    out.push_back(get_int(x, p, 1, kMaxSize, "a positive integer"));
  });
  return out;
}

MaskAxis parse_mask_axis(const Json& v, const std::string& path) {
  if (!v.is_string())
    fail(path, "must be a mask string (none, causal, causal_lower_right, pad, pad=F, causal+pad=F), got " +
                   v.dump());
  MaskAxis m;
  m.pad_fraction = 0.25;  // "pad" without a fraction
  m.spec = parse_mask(v.get<std::string>(), path, &m.pad_fraction);
  if (!m.spec.key_padding) m.pad_fraction = 0;
  return m;
}

// inputs[].rope (a mode or a list of modes, an axis) and inputs[].rope_base; every mode that is on needs an
// even head_dim at every value of sweep.head_dim (RoPE rotates pairs of elements).
std::vector<RopeSpec> parse_rope(const Json& r, const std::string& p, const std::vector<int64_t>& head_dims,
                                 const Json& head_dim_raw) {
  double base = 10000.0;
  if (r.contains("rope_base")) {
    const Json& b = r["rope_base"];
    if (!b.is_number() || !std::isfinite(b.get<double>()) || b.get<double>() <= 0)
      fail(sub(p, "rope_base"), "must be a finite number > 0 (the RoPE frequency base), got " + b.dump());
    base = b.get<double>();
  }
  std::vector<RopeSpec> out;
  for_axis(r.value("rope", Json("none")), sub(p, "rope"), [&](const Json& m, const std::string& mp) {
    if (!m.is_string()) fail(mp, "must be a RoPE mode (none, normal, neox), got " + m.dump());
    RopeSpec spec;
    spec.mode = parse_rope_mode(m.get<std::string>(), mp);
    spec.base = base;
    for (std::size_t i = 0; spec.on() && i < head_dims.size(); ++i)
      if (head_dims[i] % 2 != 0)
        fail(mp, "RoPE '" + m.get<std::string>() +
                     "' rotates pairs of elements and needs an even head_dim, got " +
                     (head_dim_raw.is_array() ? idx("sweep.head_dim", i) : std::string("sweep.head_dim")) +
                     " = " + std::to_string(head_dims[i]));
    for (const int64_t d : head_dims) validate_rope(spec, d, mp);
    out.push_back(spec);
  });
  if (r.contains("rope_base") &&
      std::none_of(out.begin(), out.end(), [](const RopeSpec& x) { return x.on(); }))
    fail(sub(p, "rope_base"), "only applies with inputs.rope normal or neox");
  return out;
}

// inputs[].g or inputs[].beta (`key`): one distribution {"dist": DIST, "mean": M, "std": S} or a list of
// them (an axis); absent: the default N(0, 1). DIST: for beta sigmoid_normal; for g logsigmoid_normal,
// softplus_normal (with an optional "scale" > 0) or lower_bound_sigmoid_normal (an optional "lower_bound" <
// 0): the config states the distribution it draws from (GateDistribution).
std::vector<GateDistribution> parse_gate_distributions(const Json& r, const std::string& p, const char* key) {
  if (!r.contains(key)) return {GateDistribution{}};
  const bool gate = std::string(key) == "g";
  const std::string first = gate ? "logsigmoid_normal" : "sigmoid_normal";
  const std::string allowed =
      gate ? "'logsigmoid_normal' (g = logsigmoid(z), z ~ N(mean, std^2)), 'softplus_normal' (g = -scale "
             "softplus(z), flash-linear-attention's KDA gate) or 'lower_bound_sigmoid_normal' (g = "
             "lower_bound "
             "sigmoid(z), its KDA gate with a lower bound)"
           : "'sigmoid_normal' (beta = sigmoid(z), z ~ N(mean, std^2))";
  std::vector<GateDistribution> out;
  for_axis(r[key], sub(p, key), [&](const Json& d, const std::string& dp) {
    if (!d.is_object())
      fail(dp, "must be a distribution {\"dist\": \"" + first +
                   "\", \"mean\": M, \"std\": S} or a list of them, got " + d.dump());
    if (!d.contains("dist")) fail(dp, "missing key 'dist' (" + allowed + ")");
    const std::string dist = d["dist"].is_string() ? d["dist"].get<std::string>() : "";
    GateDistribution g;
    if (dist == "softplus_normal" && gate) {
      g.kind = GateDistribution::softplus;
      check_keys(d, dp, {"dist", "mean", "std", "scale"});
      if (d.contains("scale"))
        g.factor =
            get_number(d["scale"], sub(dp, "scale"), 1e-6, 100, "a number in [1e-6, 100] (exp(A_log))");
    } else if (dist == "lower_bound_sigmoid_normal" && gate) {
      g.kind = GateDistribution::lower_bound_sigmoid;
      g.factor = -5;
      check_keys(d, dp, {"dist", "mean", "std", "lower_bound"});
      if (d.contains("lower_bound"))
        g.factor =
            get_number(d["lower_bound"], sub(dp, "lower_bound"), -100, -1e-6, "a number in [-100, -1e-6]");
    } else if (dist == first) {
      check_keys(d, dp, {"dist", "mean", "std"});
    } else {
      fail(sub(dp, "dist"), "must be " + allowed + ", got " + d["dist"].dump());
    }
    if (d.contains("mean"))
      g.mean = get_number(d["mean"], sub(dp, "mean"), -100, 100, "a number in [-100, 100]");
    if (d.contains("std")) g.std = get_number(d["std"], sub(dp, "std"), 0, 100, "a number in [0, 100]");
    out.push_back(g);
  });
  return out;
}

void parse_regimes(const Json& v, const std::string& path, const std::string& config_dir,
                   const std::vector<int64_t>& head_dims, const Json& head_dim_raw,
                   std::vector<Regime>& out) {
  for_axis(v, path, [&](const Json& r, const std::string& p) {
    check_keys(r, p, {"regime", "std", "text", "rope", "rope_base", "g", "beta"});
    if (!r.contains("regime")) fail(p, "missing key 'regime' (gaussian or tokens)");
    if (!r["regime"].is_string()) fail(sub(p, "regime"), "must be a string, got " + r["regime"].dump());
    const std::string kind = r["regime"].get<std::string>();
    std::vector<Regime> made;
    if (kind == "gaussian") {
      if (r.contains("text")) fail(sub(p, "text"), "only applies to regime 'tokens'");
      Json stds = r.value("std", Json(1.0));
      for_axis(stds, sub(p, "std"), [&](const Json& s, const std::string& sp) {
        Regime g;
        g.std = get_number(s, sp, 1e-6, 1e3, "a standard deviation in [1e-6, 1000]");
        made.push_back(g);
      });
    } else if (kind == "tokens") {
      if (r.contains("std")) fail(sub(p, "std"), "only applies to regime 'gaussian'");
      if (!r.contains("text") || !r["text"].is_string())
        fail(sub(p, "text"), "regime 'tokens' needs a text file path (string)");
      Regime t;
      t.kind = "tokens";
      std::filesystem::path file = r["text"].get<std::string>();
      if (file.is_relative()) file = std::filesystem::path(config_dir) / file;
      if (!std::filesystem::is_regular_file(file))
        fail(sub(p, "text"), "file '" + file.string() + "' does not exist or is not a regular file");
      t.text = file.string();
      made.push_back(t);
    } else {
      fail(sub(p, "regime"), "must be 'gaussian' or 'tokens', got '" + kind + "'");
    }
    const std::vector<RopeSpec> ropes = parse_rope(r, p, head_dims, head_dim_raw);
    const std::vector<GateDistribution> gs = parse_gate_distributions(r, p, "g");
    const std::vector<GateDistribution> betas = parse_gate_distributions(r, p, "beta");
    for (const Regime& m : made)
      for (const RopeSpec& rope : ropes)
        for (const GateDistribution& g : gs)
          for (const GateDistribution& beta : betas) {
            Regime x = m;
            x.rope = rope;
            x.g = g;
            x.beta = beta;
            out.push_back(x);
          }
  });
}

// Expands one variant entry's parameters: a list value is an axis; a list-typed parameter takes a list of
// lists as its axis (a plain list of integers for such a parameter is one value).
std::vector<Json> expand_params(const Attention& variant, const Json& given, const std::string& path) {
  const auto specs = variant.param_specs();
  if (!given.is_object())
    fail(path, "must be an object of parameter: value or [values], got " + given.dump());
  std::vector<Json> combos{Json::object()};
  for (auto it = given.begin(); it != given.end(); ++it) {
    const auto spec =
        std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == it.key(); });
    if (spec == specs.end())
      resolve_params(specs, Json{{it.key(), it.value()}}, path);  // throws did-you-mean
    // A list is an axis, except for an int_list parameter given a plain list of integers (one value).
    const Json& v = it.value();
    const bool one_list_value =
        spec->type == ParamType::int_list && v.is_array() && (v.empty() || !v[0].is_array());
    std::vector<Json> values;
    if (v.is_array() && !one_list_value) {
      if (v.empty()) fail(sub(path, it.key()), "must not be an empty list");
      for (const auto& x : v) values.push_back(x);
    } else {
      values.push_back(v);
    }
    if (points_product(combos.size(), values.size()) > kMaxPoints)
      fail(path, "the parameter lists make more than " + std::to_string(kMaxPoints) + " combinations");
    std::vector<Json> next;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::string vp =
          v.is_array() && !one_list_value ? idx(sub(path, it.key()), i) : sub(path, it.key());
      resolve_params(specs, Json{{it.key(), values[i]}}, vp);  // validates this value alone
      for (const auto& c : combos) {
        Json n = c;
        n[it.key()] = values[i];
        next.push_back(n);
      }
    }
    combos = std::move(next);
  }
  std::vector<Json> out;
  for (const auto& c : combos) out.push_back(resolve_params(specs, c, path));
  return out;
}

}  // namespace

std::string Regime::base_label() const {
  if (kind == "tokens") return "tokens(" + std::filesystem::path(text).filename().string() + ")";
  return "gaussian(std=" + shortest_double_text(std) + ")";
}

std::string GateDistribution::normal() const {
  return "N(" + shortest_double_text(mean) + "," + shortest_double_text(std) + ")";
}

std::string GateDistribution::g_formula() const {
  if (kind == softplus)
    return (factor == 1 ? std::string("-") : "-" + shortest_double_text(factor) + "*") + "softplus(" +
           normal() + ")";
  if (kind == lower_bound_sigmoid) return shortest_double_text(factor) + "*sigmoid(" + normal() + ")";
  return "logsigmoid(" + normal() + ")";
}

double GateDistribution::g_of(double z) const {
  // log1p(exp(z)) for z <= 36, else z to double precision (exp would overflow past z = 709); logsigmoid(z) =
  // -softplus(-z); sigmoid(z) = exp(-softplus(-z)).
  const auto softplus_of = [](double x) { return x > 36 ? x : std::log1p(std::exp(x)); };
  if (kind == softplus) return -factor * softplus_of(z);
  if (kind == lower_bound_sigmoid) return factor / (1 + std::exp(-z));
  return -softplus_of(-z);
}

std::string Regime::label() const {
  std::string s = base_label();
  if (rope.on()) s.insert(s.size() - 1, ",rope=" + rope.str());
  // Only when not the default, so configs without inputs[].g / .beta keep their ids and input keys.
  if (!g.is_default()) s.insert(s.size() - 1, ",g=" + g.g_formula());
  if (!beta.is_default()) s.insert(s.size() - 1, ",beta=sigmoid(" + beta.normal() + ")");
  return s;
}

std::string MaskAxis::label() const {
  std::string s;
  if (spec.causal) s = "causal";
  if (spec.causal_lower_right) s += s.empty() ? "causal_lower_right" : "+causal_lower_right";
  if (spec.key_padding) s += (s.empty() ? "pad=" : "+pad=") + shortest_double_text(pad_fraction);
  return s.empty() ? "none" : s;
}

uint64_t parse_bytes(const Json& value, const std::string& where) {
  // 2^64 as a double: a byte count below it converts to uint64_t exactly; converting a larger one (1e300,
  // "99999999999999 TiB") is undefined behaviour.
  constexpr double kTwoTo64 = 18446744073709551616.0;
  if (value.is_number()) {
    double d = value.get<double>();
    if (!std::isfinite(d) || d < 1 || d >= kTwoTo64)
      fail(where, "must be a number of bytes in [1, 2^64), got " + value.dump());
    return static_cast<uint64_t>(d);
  }
  static const std::regex re(R"(^\s*([0-9]+(\.[0-9]+)?)\s*(B|KiB|MiB|GiB|TiB|K|M|G|T|KB|MB|GB|TB)?\s*$)");
  std::smatch m;
  // Longer text is no byte size: bounding it keeps std::stod in range (it throws std::out_of_range past
  // 1e308, i.e. for 309 digits) and std::regex's recursive matcher shallow.
  constexpr std::size_t kMaxText = 64;
  const std::string text = value.is_string() ? value.get<std::string>() : "";
  if (!value.is_string() || text.size() > kMaxText || !std::regex_match(text, m, re))
    fail(where, "must be bytes as a number or a string like \"8GiB\" or \"512MiB\", got " + value.dump());
  const double n = std::stod(m[1].str());
  const std::string u = m[3].str();
  double mult = 1;
  if (u == "K" || u == "KiB" || u == "KB") mult = 1024.0;
  if (u == "M" || u == "MiB" || u == "MB") mult = 1024.0 * 1024;
  if (u == "G" || u == "GiB" || u == "GB") mult = 1024.0 * 1024 * 1024;
  if (u == "T" || u == "TiB" || u == "TB") mult = 1024.0 * 1024 * 1024 * 1024;
  if (n * mult < 1) fail(where, "must be at least 1 byte, got " + value.dump());
  if (n * mult >= kTwoTo64) fail(where, "must be less than 2^64 bytes (16 EiB), got " + value.dump());
  return static_cast<uint64_t>(n * mult);
}

std::string SweepConfig::hash() const {
  std::ostringstream s;
  s << std::hex << fnv1a64(raw.dump());
  return s.str();
}

namespace {

void parse_identity(const Json& j, SweepConfig& c) {
  if (!j.contains("name")) fail("name", "missing (a name for the results folder, e.g. \"default\")");
  if (!j["name"].is_string() ||
      !std::regex_match(j["name"].get<std::string>(), std::regex("[A-Za-z0-9_.-]{1,64}")) ||
      j["name"].get<std::string>().front() == '.')
    fail("name",
         "must be 1-64 characters of A-Z a-z 0-9 _ . - not starting with '.', got " + j["name"].dump());
  c.name = j["name"].get<std::string>();
  if (j.contains("description")) {
    if (!j["description"].is_string())
      fail("description", "must be a string, got " + j["description"].dump());
    c.description = j["description"].get<std::string>();
  }
}

// "variants": "all", or a list of names / {"name", "params"} objects.
void parse_variants(const Json& variants, SweepConfig& c) {
  auto& reg = Registry::instance();
  if (variants.is_string() && variants.get<std::string>() == "all") {
    for (const Attention* v : reg.all()) c.variants.push_back({v->name(), {make_problem(v->name()).params}});
    return;
  }
  if (!variants.is_array() || variants.empty())
    fail("variants",
         "must be \"all\" or a non-empty list of variant names or objects, got " + variants.dump());
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const std::string p = idx("variants", i);
    const Json& e = variants[i];
    Json name, params = Json::object();
    if (e.is_string()) {
      name = e;
    } else if (e.is_object()) {
      check_keys(e, p, {"name", "params"});
      if (!e.contains("name")) fail(p, "missing key 'name'");
      name = e["name"];
      if (e.contains("params")) params = e["params"];
    } else {
      fail(p, "must be a variant name or {\"name\": ..., \"params\": {...}}, got " + e.dump());
    }
    if (!name.is_string()) fail(p, "variant name must be a string, got " + name.dump());
    const Attention* v = reg.find(name.get<std::string>());
    if (!v) fail(e.is_string() ? p : sub(p, "name"), reg.unknown_variant_message(name.get<std::string>()));
    c.variants.push_back({v->name(), expand_params(*v, params, sub(p, "params"))});
  }
}

// "sweep": the shape, mask, thread, SIMD-target and dropout axes. Threads and targets are checked against
// this machine by the plan, not here.
void parse_sweep_axes(const Json& sweep, SweepConfig& c) {
  check_keys(sweep, "sweep",
             {"batch", "heads", "kv_heads", "head_dim", "v_head_dim", "seq_len", "seq_q", "seq_kv", "mask",
              "threads", "isa", "dropout", "dtype", "bias", "pass", "softcap", "sinks"});
  if (sweep.contains("batch")) c.batch = size_axis(sweep["batch"], "sweep.batch");
  if (sweep.contains("heads")) c.heads = size_axis(sweep["heads"], "sweep.heads");
  if (sweep.contains("kv_heads")) {
    // Grouped-query attention: every K/V head count must divide every query head count of the config (the
    // axes are crossed), so a config error names the value and the heads it does not divide.
    c.kv_heads = size_axis(sweep["kv_heads"], "sweep.kv_heads");
    for (std::size_t i = 0; i < c.kv_heads.size(); ++i)
      for (const int64_t h : c.heads)
        if (h % c.kv_heads[i] != 0)
          fail(sweep["kv_heads"].is_array() ? idx("sweep.kv_heads", i) : std::string("sweep.kv_heads"),
               "must divide every value of sweep.heads (query heads per K/V head), got " +
                   std::to_string(c.kv_heads[i]) + ", which does not divide heads " + std::to_string(h));
  }
  if (sweep.contains("head_dim")) c.head_dim = size_axis(sweep["head_dim"], "sweep.head_dim");
  if (sweep.contains("v_head_dim")) c.v_head_dim = size_axis(sweep["v_head_dim"], "sweep.v_head_dim");
  const bool has_len = sweep.contains("seq_len"), has_q = sweep.contains("seq_q"),
             has_kv = sweep.contains("seq_kv");
  if (has_len && (has_q || has_kv))
    fail("sweep.seq_len",
         "give either seq_len (self-attention) or seq_q and seq_kv (cross-attention), not both");
  if (has_q != has_kv) fail(has_q ? "sweep.seq_kv" : "sweep.seq_q", "missing: seq_q and seq_kv go together");
  if (has_len) {
    c.seq_q = c.seq_kv = size_axis(sweep["seq_len"], "sweep.seq_len");
  } else if (has_q) {
    c.self_attention = false;
    c.seq_q = size_axis(sweep["seq_q"], "sweep.seq_q");
    c.seq_kv = size_axis(sweep["seq_kv"], "sweep.seq_kv");
  } else {
    fail("sweep.seq_len", "missing: the sequence lengths to sweep (or seq_q and seq_kv)");
  }
  for_axis(sweep.value("mask", Json("none")), "sweep.mask",
           [&](const Json& m, const std::string& p) { c.masks.push_back(parse_mask_axis(m, p)); });
  if (sweep.contains("threads"))
    for_axis(sweep["threads"], "sweep.threads", [&](const Json& t, const std::string& p) {
      c.threads.push_back(static_cast<int>(get_int(t, p, 1, kMaxThreads, "a positive integer")));
    });
  if (sweep.contains("isa")) {
    c.isas.clear();
    c.isa_from_config = true;
    const std::vector<std::string>& known = simd::isa_info().compiled;
    for_axis(sweep["isa"], "sweep.isa", [&](const Json& v, const std::string& p) {
      if (!v.is_string())
        fail(p, "must be a SIMD target name (\"best\" or one of " + join(known) + "), got " + v.dump());
      const std::string name = v.get<std::string>();
      // A name this build has no kernels for is a config error on any machine (validate_isa's message names
      // the targets); whether this CPU runs it is the plan's question.
      if (name != "best" && std::find(known.begin(), known.end(), name) == known.end())
        simd::validate_isa(name, p);
      c.isas.push_back(name);
    });
  }
  if (sweep.contains("dropout"))
    c.dropout = get_number(sweep["dropout"], "sweep.dropout", 0, 0.999999, "a probability in [0, 1)");
  if (sweep.contains("dtype")) {
    c.dtypes.clear();
    for_axis(sweep["dtype"], "sweep.dtype", [&](const Json& v, const std::string& p) {
      if (!v.is_string()) fail(p, "must be a storage dtype (fp32, bf16, fp16), got " + v.dump());
      c.dtypes.push_back(parse_dtype(v.get<std::string>(), p));
    });
  }
  if (sweep.contains("pass")) {
    c.passes.clear();
    for_axis(sweep["pass"], "sweep.pass", [&](const Json& v, const std::string& p) {
      if (!v.is_string()) fail(p, "must be a pass (forward, backward, forward_backward), got " + v.dump());
      c.passes.push_back(parse_pass(v.get<std::string>(), p));
    });
  }
  if (sweep.contains("softcap")) {
    c.softcaps.clear();
    for_axis(sweep["softcap"], "sweep.softcap", [&](const Json& v, const std::string& p) {
      c.softcaps.push_back(
          get_number(v, p, 0, 1e6, "a cap C in (0, 1e6] for s <- C tanh(s / C), or 0 for no soft-capping"));
    });
  }
  if (sweep.contains("sinks")) {
    c.sinks.clear();
    for_axis(sweep["sinks"], "sweep.sinks", [&](const Json& v, const std::string& p) {
      if (!v.is_boolean())
        fail(p, "must be true (learned sink logits, one per head) or false, got " + v.dump());
      c.sinks.push_back(v.get<bool>());
    });
  }
  if (sweep.contains("bias")) {
    c.biases.clear();
    for_axis(sweep["bias"], "sweep.bias", [&](const Json& v, const std::string& p) {
      if (!v.is_string()) fail(p, "must be a logit bias (none, alibi), got " + v.dump());
      c.biases.push_back(parse_bias(v.get<std::string>(), p));
    });
  }
}

void parse_measure(const Json& m, MeasureSettings& s) {
  check_keys(
      m, "measure",
      {"warmup", "min_reps", "max_reps", "min_time_s", "max_time_s", "target_rel_ci", "max_interference",
       "max_remeasure", "calibrate_every", "interleave", "group_sgemm", "group_bandwidth"});
  if (m.contains("warmup"))
    s.warmup = static_cast<int>(get_int(m["warmup"], "measure.warmup", 0, 1000, "an integer in [0, 1000]"));
  if (m.contains("min_reps"))
    s.min_reps =
        static_cast<int>(get_int(m["min_reps"], "measure.min_reps", 1, 100000, "an integer in [1, 100000]"));
  if (m.contains("max_reps"))
    s.max_reps =
        static_cast<int>(get_int(m["max_reps"], "measure.max_reps", 1, 100000, "an integer in [1, 100000]"));
  if (m.contains("min_time_s"))
    s.min_time_s = get_number(m["min_time_s"], "measure.min_time_s", 0, 3600, "seconds in [0, 3600]");
  if (m.contains("max_time_s"))
    s.max_time_s =
        get_number(m["max_time_s"], "measure.max_time_s", 0.001, 86400, "seconds in [0.001, 86400]");
  if (m.contains("target_rel_ci") && !m["target_rel_ci"].is_null())
    s.target_rel_ci = get_number(m["target_rel_ci"], "measure.target_rel_ci", 0, 1,
                                 "a fraction of the median in [0, 1] (0 or null: off)");
  if (m.contains("max_interference"))
    s.max_interference = get_number(m["max_interference"], "measure.max_interference", 0, 1,
                                    "a share of the machine's CPU time in [0, 1] (1: never re-measure)");
  if (m.contains("max_remeasure"))
    s.max_remeasure = static_cast<int>(
        get_int(m["max_remeasure"], "measure.max_remeasure", 0, 20, "an integer in [0, 20]"));
  if (m.contains("calibrate_every"))
    s.calibrate_every =
        static_cast<int>(get_int(m["calibrate_every"], "measure.calibrate_every", 0, 1000000,
                                 "a number of points in [0, 1000000] (0: only at the start)"));
  if (m.contains("interleave")) {
    if (!m["interleave"].is_boolean())
      fail("measure.interleave",
           "must be true (time the points sharing an input set together, in rounds) or false (one after "
           "another), got " +
               m["interleave"].dump());
    s.interleave = m["interleave"].get<bool>();
  }
  if (m.contains("group_sgemm")) {
    if (!m["group_sgemm"].is_boolean())
      fail("measure.group_sgemm",
           "must be true (time the calibration's sgemm in each group's rounds, when it costs at most half a "
           "round, and divide the group's rows by it) or false (divide by the latest calibration), got " +
               m["group_sgemm"].dump());
    s.group_sgemm = m["group_sgemm"].get<bool>();
  }
  if (m.contains("group_bandwidth")) {
    if (!m["group_bandwidth"].is_boolean())
      fail("measure.group_bandwidth",
           "must be true (time a streaming read of each memory-bound point's K and V in its group's rounds, "
           "when it costs at most half a round, and divide the point's bandwidth by it) or false (divide by "
           "the start-of-run calibration), got " +
               m["group_bandwidth"].dump());
    s.group_bandwidth = m["group_bandwidth"].get<bool>();
  }
  if (s.max_reps < s.min_reps)
    fail("measure.max_reps", "must be >= measure.min_reps (" + std::to_string(s.min_reps) + "), got " +
                                 std::to_string(s.max_reps));
  if (s.max_time_s < s.min_time_s)
    // max_time_s may be the default here (absent from `m`: a const operator[] on a missing key is undefined).
    fail("measure.max_time_s", "must be >= measure.min_time_s (" + Json(s.min_time_s).dump() + "), got " +
                                   Json(s.max_time_s).dump() +
                                   (m.contains("max_time_s") ? "" : " (the default)"));
}

void parse_accuracy(const Json& a, AccuracySettings& s) {
  check_keys(a, "accuracy", {"reference", "rows", "grad_max_work"});
  if (a.contains("reference")) {
    const std::vector<std::string> modes{"auto", "full", "sampled", "none"};
    if (!a["reference"].is_string() ||
        std::find(modes.begin(), modes.end(), a["reference"].get<std::string>()) == modes.end())
      fail("accuracy.reference", "must be one of auto, full, sampled, none, got " + a["reference"].dump());
    s.reference = a["reference"].get<std::string>();
  }
  if (a.contains("rows"))
    s.rows = get_int(a["rows"], "accuracy.rows", 1, 1 << 20, "an integer in [1, 1048576]");
  if (a.contains("grad_max_work"))
    s.grad_max_work = get_number(a["grad_max_work"], "accuracy.grad_max_work", 0, 1e18,
                                 "multiply-adds in [0, 1e18] (0: no gradient reference)");
}

// Counted before any expansion: a cross product of long axes is refused without building it.
void check_point_count(const SweepConfig& c) {
  uint64_t param_sets = 0;
  for (const VariantSpec& v : c.variants)
    param_sets = std::min(param_sets + v.param_sets.size(), kMaxPoints + 1);
  uint64_t points = param_sets;
  for (const std::size_t n :
       {c.regimes.size(), c.batch.size(), c.heads.size(), std::max<std::size_t>(c.kv_heads.size(), 1),
        c.head_dim.size(), std::max<std::size_t>(c.v_head_dim.size(), 1), c.seq_q.size(),
        c.self_attention ? std::size_t{1} : c.seq_kv.size(), c.masks.size(),
        std::max<std::size_t>(c.threads.size(), 1), c.isas.size(), c.dtypes.size(), c.biases.size(),
        c.passes.size()})
    points = points_product(points, n);
  if (points > kMaxPoints)
    fail("config", "the cross product of variants, parameters, sweep.*, and inputs has more than " +
                       std::to_string(kMaxPoints) + " points; split the sweep or shorten an axis");
}

}  // namespace

const char* pass_name(Pass pass) {
  switch (pass) {
    case Pass::forward:
      return "forward";
    case Pass::backward:
      return "backward";
    case Pass::forward_backward:
      return "forward_backward";
  }
  return "?";
}

Pass parse_pass(const std::string& text, const std::string& where) {
  for (Pass p : {Pass::forward, Pass::backward, Pass::forward_backward})
    if (text == pass_name(p)) return p;
  throw UsageError(where + ": unknown pass '" + text + "' (allowed: forward, backward, forward_backward)");
}

// "plugins": shared libraries of out-of-tree variants (plugin_loader.hpp), loaded before "variants" names
// them; a relative path is relative to the config file's folder.
namespace {
void load_config_plugins(const Json& list, const std::string& dir) {
  if (!list.is_array()) throw UsageError("plugins: expected an array of paths, got " + list.dump());
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string where = "plugins[" + std::to_string(i) + "]";
    if (!list[i].is_string() || list[i].get<std::string>().empty())
      throw UsageError(where + ": expected a non-empty path string, got " + list[i].dump());
    std::filesystem::path path(list[i].get<std::string>());
    if (path.is_relative()) path = std::filesystem::path(dir) / path;
    load_plugin(path.string(), where);
  }
}
}  // namespace

// "mla": {"presets", "forms", "context", "new", "batch", "threads", "repeats", "warmup", "check_max_context",
// "variant", "params", "gqa", "memory_budget"} or a list of such blocks.
static MlaBlock parse_mla_block(const Json& j, const std::string& p) {
  check_keys(j, p,
             {"presets", "forms", "context", "new", "batch", "threads", "repeats", "warmup",
              "check_max_context", "variant", "params", "gqa", "memory_budget"});
  MlaBlock b;
  if (!j.contains("presets"))
    fail(sub(p, "presets"), "missing (a preset name, a list of them, or an object NAME: shape)");
  if (!j.contains("context"))
    fail(sub(p, "context"), "missing (cached tokens before the timed call: a list)");
  const Json& pr = j["presets"];
  if (pr.is_object()) {
    if (pr.empty()) fail(sub(p, "presets"), "must not be empty");
    for (auto it = pr.begin(); it != pr.end(); ++it)
      b.presets.emplace_back(it.key(), mla_shape_from_json(it.value(), sub(sub(p, "presets"), it.key())));
  } else {
    for_axis(pr, sub(p, "presets"), [&](const Json& v, const std::string& q) {
      if (!v.is_string())
        fail(q, "must be a preset name (" + join(mla_preset_names()) + "), got " + v.dump());
      b.presets.emplace_back(v.get<std::string>(), mla_preset(v.get<std::string>(), q));
    });
  }
  if (j.contains("forms")) {
    b.forms.clear();
    for_axis(j["forms"], sub(p, "forms"), [&](const Json& v, const std::string& q) {
      if (!v.is_string()) fail(q, "must be \"naive\" or \"absorbed\", got " + v.dump());
      const MlaForm f = parse_mla_form(v.get<std::string>(), q);
      if (std::find(b.forms.begin(), b.forms.end(), f) != b.forms.end()) fail(q, "repeats form " + v.dump());
      b.forms.push_back(f);
    });
  }
  auto ascending = [&](const Json& v, const std::string& key, int64_t lo, std::vector<int64_t>& out) {
    out.clear();
    for_axis(v, sub(p, key), [&](const Json& e, const std::string& q) {
      const int64_t x = get_int(e, q, lo, kMaxSize, lo == 0 ? "an integer >= 0" : "an integer >= 1");
      if (!out.empty() && x <= out.back())
        fail(q, "must be larger than the value before it (" + std::to_string(out.back()) +
                    "): list them ascending, each once");
      out.push_back(x);
    });
  };
  ascending(j["context"], "context", 0, b.context);
  if (j.contains("new")) ascending(j["new"], "new", 1, b.fresh);
  if (j.contains("batch")) b.batch = get_int(j["batch"], sub(p, "batch"), 1, 1 << 16, "an integer >= 1");
  if (j.contains("threads"))
    b.threads = static_cast<int>(get_int(j["threads"], sub(p, "threads"), 1, kMaxThreads, "an integer >= 1"));
  if (j.contains("repeats"))
    b.repeats = static_cast<int>(get_int(j["repeats"], sub(p, "repeats"), 1, 100000, "an integer >= 1"));
  if (j.contains("warmup"))
    b.warmup = static_cast<int>(get_int(j["warmup"], sub(p, "warmup"), 0, 100000, "an integer >= 0"));
  if (j.contains("check_max_context"))
    b.check_max_context =
        get_int(j["check_max_context"], sub(p, "check_max_context"), 0, kMaxSize, "an integer >= 0");
  if (j.contains("variant")) {
    const Json& v = j["variant"];
    if (!v.is_string() || !Registry::instance().find(v.get<std::string>()))
      fail(sub(p, "variant"), v.is_string()
                                  ? Registry::instance().unknown_variant_message(v.get<std::string>())
                                  : "must be a variant name, got " + v.dump());
    b.variant = v.get<std::string>();
  }
  if (j.contains("params")) {
    if (b.variant.empty()) fail(sub(p, "params"), "needs \"variant\" (the core whose parameters they are)");
    b.params =
        resolve_params(Registry::instance().get(b.variant).param_specs(), j["params"], sub(p, "params"));
  }
  if (j.contains("gqa")) {
    const Json& g = j["gqa"];
    const std::string gp = sub(p, "gqa");
    check_keys(g, gp, {"kv_heads", "head_dim"});
    if (!g.contains("kv_heads") || !g.contains("head_dim"))
      fail(gp, "needs \"kv_heads\" and \"head_dim\" (the GQA core measured beside the MLA forms)");
    b.gqa_kv_heads = get_int(g["kv_heads"], sub(gp, "kv_heads"), 1, kMaxSize, "an integer >= 1");
    b.gqa_head_dim = get_int(g["head_dim"], sub(gp, "head_dim"), 1, 1 << 16, "an integer in [1, 65536]");
    for (const auto& [name, shape] : b.presets)
      if (shape.heads % b.gqa_kv_heads != 0)
        fail(sub(gp, "kv_heads"),
             "must divide the query heads of every preset: " + std::to_string(shape.heads) + " of '" + name +
                 "' is not a multiple of " + std::to_string(b.gqa_kv_heads));
  }
  if (j.contains("memory_budget"))
    b.memory_budget_bytes = parse_bytes(j["memory_budget"], sub(p, "memory_budget"));
  return b;
}

SweepConfig parse_sweep_config(const Json& j, const std::string& source_path) {
  SweepConfig c;
  c.raw = j;
  c.source_path = source_path;
  check_keys(j, "",
             {"name", "description", "plugins", "variants", "sweep", "inputs", "measure", "accuracy",
              "memory_budget", "seed", "mla"});
  parse_identity(j, c);
  const std::string dir = std::filesystem::path(source_path).parent_path().string();
  if (j.contains("plugins")) load_config_plugins(j["plugins"], dir.empty() ? "." : dir);
  parse_variants(j.value("variants", Json("all")), c);
  parse_sweep_axes(j.value("sweep", Json::object()), c);
  const Json sweep_raw = j.value("sweep", Json::object());
  parse_regimes(j.value("inputs", Json{{"regime", "gaussian"}, {"std", 1.0}}), "inputs",
                dir.empty() ? "." : dir, c.head_dim,
                sweep_raw.is_object() ? sweep_raw.value("head_dim", Json()) : Json(), c.regimes);
  // The tokens regime projects V through the multi-head layer, whose V heads are head_dim wide.
  for (std::size_t i = 0; i < c.regimes.size(); ++i)
    for (const int64_t dv : c.v_head_dim)
      if (c.regimes[i].kind == "tokens" &&
          std::find(c.head_dim.begin(), c.head_dim.end(), dv) == c.head_dim.end())
        fail("sweep.v_head_dim",
             "regime 'tokens' (" + c.regimes[i].label() +
                 ") makes V with the multi-head layer's projection, head_dim wide: v_head_dim " +
                 std::to_string(dv) + " differs from every head_dim; use regime 'gaussian' for d_v != d_k");
  if (j.contains("measure")) parse_measure(j["measure"], c.measure);
  if (j.contains("accuracy")) parse_accuracy(j["accuracy"], c.accuracy);
  if (j.contains("memory_budget")) c.memory_budget_bytes = parse_bytes(j["memory_budget"], "memory_budget");
  if (j.contains("seed"))
    c.seed =
        static_cast<uint64_t>(get_int(j["seed"], "seed", 0, int64_t{1} << 53, "an integer in [0, 2^53]"));
  if (j.contains("mla")) {
    const Json& m = j["mla"];
    if (m.is_array()) {
      if (m.empty()) fail("mla", "must not be an empty list");
      for (std::size_t i = 0; i < m.size(); ++i) c.mla.push_back(parse_mla_block(m[i], idx("mla", i)));
    } else {
      c.mla.push_back(parse_mla_block(m, "mla"));
    }
    for (MlaBlock& b : c.mla)
      if (!b.memory_budget_bytes) b.memory_budget_bytes = c.memory_budget_bytes;
  }
  check_point_count(c);
  return c;
}

SweepConfig load_sweep_config(const std::string& path) {
  return parse_sweep_config_text(read_file_bytes(path), path);
}

SweepConfig parse_sweep_config_text(const std::string& text, const std::string& path) {
  Json j;
  try {
    // Deeper nesting than any config needs is refused while parsing: copying or printing a value nested
    // 100000 deep would recurse until the stack overflows.
    constexpr int kMaxDepth = 64;
    j = Json::parse(text, [&](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxDepth)
        throw UsageError("file '" + path + "': JSON nested more than " + std::to_string(kMaxDepth) +
                         " levels deep (a config needs at most 6)");
      return true;
    });
  } catch (const Json::parse_error& e) {
    // Translate the byte offset into a line and column.
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < std::min<std::size_t>(e.byte, text.size()) && i + 1 < e.byte; ++i) {
      if (text[i] == '\n')
        ++line, col = 1;
      else
        ++col;
    }
    throw UsageError("file '" + path + "': invalid JSON at line " + std::to_string(line) + ", column " +
                     std::to_string(col) + ": " + e.what());
  } catch (const Json::exception& e) {
    // Not a syntax error but a value the parser cannot hold, e.g. out_of_range.406 for 1e400.
    throw UsageError("file '" + path + "': invalid JSON: " + e.what());
  }
  try {
    return parse_sweep_config(j, path);
  } catch (const UsageError& e) {
    throw UsageError("config '" + path + "': " + e.what());
  }
}

}  // namespace attn
