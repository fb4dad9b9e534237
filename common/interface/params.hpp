// Typed variant parameters: each variant declares ParamSpecs; user values (JSON or k=v strings) are validated
// against them, defaults filled in, and errors name the parameter, the value and what is allowed.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace attn {

using Json = nlohmann::json;

enum class ParamType { integer, number, string, int_list, int_or_int_list };

struct ParamSpec {
  std::string name{};
  ParamType type = ParamType::integer;
  Json default_value{};                // must itself pass validation
  std::string help{};                  // one line
  std::optional<double> min{};         // inclusive; for lists, applies to each element
  std::optional<double> max{};         // inclusive
  std::vector<std::string> choices{};  // for strings: the allowed values (empty = any)
};

std::string param_type_name(ParamType type);
Json param_spec_json(const ParamSpec& spec);

// Validates `given` (a JSON object) against `specs`; returns an object holding every spec'd parameter
// (given value or default). `where` prefixes error messages, e.g. "variant 'sliding_window'".
// Unknown names are rejected with a did-you-mean suggestion.
Json resolve_params(const std::vector<ParamSpec>& specs, const Json& given, const std::string& where);

// Parses a CLI `k=v` value into JSON by the spec's type ("3", "0.5", "abc", "1,2,3" for lists).
Json parse_param_value(const ParamSpec& spec, const std::string& text, const std::string& where);

// Canonical text of a resolved parameter value for repro strings (lists as 1;2;3; numbers in the shortest
// form that reads back to the same double).
std::string param_value_text(const Json& value);

// The shortest decimal text that parses back to exactly `x`.
std::string shortest_double_text(double x);

// The closest candidate by edit distance, if it is close enough to be a plausible typo.
std::optional<std::string> did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace attn
