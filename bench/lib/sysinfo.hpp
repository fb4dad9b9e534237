// Facts about the machine and the build, recorded in every results folder's meta.json.
#pragma once
#include <nlohmann/json.hpp>

namespace attn {

nlohmann::json system_info();  // cpu model and flags, cores, memory, compiler, flags, library versions, git
std::string now_iso8601();     // UTC, e.g. 2026-11-29T21:32:24Z

}  // namespace attn
