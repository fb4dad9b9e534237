// Parameter validation shared by every variant, the CLI and the config loader.
#include "common/interface/params.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "common/support/error.hpp"

namespace attn {

std::string param_type_name(ParamType type) {
  switch (type) {
    case ParamType::integer:
      return "integer";
    case ParamType::number:
      return "number";
    case ParamType::string:
      return "string";
    case ParamType::int_list:
      return "list of integers";
    case ParamType::int_or_int_list:
      return "integer or list of integers";
  }
  return "?";
}

Json param_spec_json(const ParamSpec& spec) {
  Json j = {{"name", spec.name},
            {"type", param_type_name(spec.type)},
            {"default", spec.default_value},
            {"help", spec.help}};
  if (spec.min) j["min"] = *spec.min;
  if (spec.max) j["max"] = *spec.max;
  if (!spec.choices.empty()) j["choices"] = spec.choices;
  return j;
}

std::optional<std::string> did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  std::size_t best_d = std::max<std::size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    std::vector<std::size_t> prev(c.size() + 1), cur(c.size() + 1);
    for (std::size_t j = 0; j <= c.size(); ++j) prev[j] = j;
    for (std::size_t i = 1; i <= word.size(); ++i) {
      cur[0] = i;
      for (std::size_t j = 1; j <= c.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (word[i - 1] == c[j - 1] ? 0 : 1)});
      std::swap(prev, cur);
    }
    if (prev[c.size()] < best_d) {
      best_d = prev[c.size()];
      best = c;
    }
  }
  return best;
}

namespace {

std::string range_text(const ParamSpec& s) {
  if (s.min && s.max)
    return " in [" + shortest_double_text(*s.min) + ", " + shortest_double_text(*s.max) + "]";
  if (s.min) return " >= " + shortest_double_text(*s.min);
  if (s.max) return " <= " + shortest_double_text(*s.max);
  return "";
}

bool is_integer(const Json& v) {
  if (v.is_number_integer()) return true;
  if (v.is_number_float()) {
    double d = v.get<double>();
    return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15;
  }
  return false;
}

Json check_scalar_int(const ParamSpec& s, const Json& v, const std::string& where) {
  if (!is_integer(v)) throw UsageError(where + ": must be an integer" + range_text(s) + ", got " + v.dump());
  int64_t x = v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
  if ((s.min && x < *s.min) || (s.max && x > *s.max))
    throw UsageError(where + ": must be an integer" + range_text(s) + ", got " + std::to_string(x));
  return x;
}

Json check_value(const ParamSpec& s, const Json& v, const std::string& where) {
  switch (s.type) {
    case ParamType::integer:
      return check_scalar_int(s, v, where);
    case ParamType::number: {
      if (!v.is_number() || !std::isfinite(v.get<double>()))
        throw UsageError(where + ": must be a finite number" + range_text(s) + ", got " + v.dump());
      double x = v.get<double>();
      if ((s.min && x < *s.min) || (s.max && x > *s.max))
        throw UsageError(where + ": must be a number" + range_text(s) + ", got " + v.dump());
      return x;
    }
    case ParamType::string: {
      if (!v.is_string()) throw UsageError(where + ": must be a string, got " + v.dump());
      if (!s.choices.empty() &&
          std::find(s.choices.begin(), s.choices.end(), v.get<std::string>()) == s.choices.end()) {
        std::string allowed;
        for (const auto& c : s.choices) allowed += (allowed.empty() ? "" : ", ") + c;
        throw UsageError(where + ": must be one of {" + allowed + "}, got " + v.dump());
      }
      return v;
    }
    case ParamType::int_list:
    case ParamType::int_or_int_list: {
      if (s.type == ParamType::int_or_int_list && !v.is_array()) return check_scalar_int(s, v, where);
      if (!v.is_array()) throw UsageError(where + ": must be a list of integers, got " + v.dump());
      Json out = Json::array();
      for (std::size_t i = 0; i < v.size(); ++i)
        out.push_back(check_scalar_int(s, v[i], where + "[" + std::to_string(i) + "]"));
      return out;
    }
  }
  return v;
}

}  // namespace

Json resolve_params(const std::vector<ParamSpec>& specs, const Json& given, const std::string& where) {
  if (!given.is_null() && !given.is_object())
    throw UsageError(where + ": parameters must be an object of name: value, got " + given.dump());
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  Json out = Json::object();
  if (given.is_object()) {
    for (auto it = given.begin(); it != given.end(); ++it) {
      if (std::find(names.begin(), names.end(), it.key()) == names.end()) {
        std::string msg = where + ": unknown parameter '" + it.key() + "'";
        if (auto m = did_you_mean(it.key(), names)) msg += " (did you mean '" + *m + "'?)";
        std::string known;
        for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
        msg += names.empty() ? "; this variant takes no parameters" : "; known: " + known;
        throw UsageError(msg);
      }
    }
  }
  for (const auto& s : specs) {
    const std::string here = where + ": parameter '" + s.name + "'";
    if (given.is_object() && given.contains(s.name)) {
      out[s.name] = check_value(s, given.at(s.name), here);
    } else {
      out[s.name] = check_value(s, s.default_value, here + " (default)");
    }
  }
  return out;
}

namespace {
std::string with_article(const std::string& noun) {
  return (noun[0] == 'i' || noun[0] == 'a' ? "an " : "a ") + noun;
}
}  // namespace

std::string shortest_double_text(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

Json parse_param_value(const ParamSpec& spec, const std::string& text, const std::string& where) {
  auto parse_number = [&](const std::string& t) -> Json {
    try {
      std::size_t used = 0;
      double d = std::stod(t, &used);
      if (used != t.size()) throw std::invalid_argument(t);
      if (t.find_first_of(".eE") == std::string::npos && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
      return d;
    } catch (const std::exception&) {
      throw UsageError(where + ": must be " + with_article(param_type_name(spec.type)) + ", got '" + t + "'");
    }
  };
  switch (spec.type) {
    case ParamType::string:
      return text;
    case ParamType::integer:
    case ParamType::number:
      return parse_number(text);
    case ParamType::int_list:
    case ParamType::int_or_int_list: {
      if (spec.type == ParamType::int_or_int_list && text.find_first_of(",;") == std::string::npos)
        return parse_number(text);
      Json arr = Json::array();
      std::stringstream ss(text);
      std::string item;
      while (std::getline(ss, item, text.find(';') != std::string::npos ? ';' : ','))
        if (!item.empty()) arr.push_back(parse_number(item));
      return arr;
    }
  }
  return text;
}

std::string param_value_text(const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    std::string out;
    for (std::size_t i = 0; i < value.size(); ++i) out += (i ? ";" : "") + param_value_text(value[i]);
    return out.empty() ? "[]" : out;
  }
  if (value.is_number_float()) return shortest_double_text(value.get<double>());
  return value.dump();
}

}  // namespace attn
