// System and build facts for meta.json and `attnbench info`.
#include "bench/lib/sysinfo.hpp"

#include <cblas.h>
#include <oneapi/tbb/version.h>
#include <tbb/global_control.h>
#include <unistd.h>

#include <Eigen/Core>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

#include "common/interface/attention.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/runtime.hpp"
#include ATTN_GIT_COMMIT_HEADER  // ATTN_GIT_COMMIT, stamped at build time (cmake/git_commit.cmake)

namespace attn {

std::string now_iso8601() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

// The first value of `key` in /proc/cpuinfo ("" if absent).
std::string cpuinfo_field(const std::string& key) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind(key, 0) != 0) continue;
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

}  // namespace

std::string cpu_model() {
  if (std::string model = cpuinfo_field("model name"); !model.empty()) return model;
  // aarch64 kernels name no model, only the implementer and part codes (0x41 = Arm, part 0xd0c = Neoverse
  // N1).
  const std::string implementer = cpuinfo_field("CPU implementer"), part = cpuinfo_field("CPU part");
  return implementer.empty() ? "" : "CPU implementer " + implementer + ", part " + part;
}

nlohmann::json isa_json() {
  const simd::IsaInfo& info = simd::isa_info();
  return {{"compiled", info.compiled}, {"supported", info.supported}, {"best", info.best}};
}

nlohmann::json blas_json() {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  // Set with OPENBLAS_CORETYPE when attnbench replaced the core OpenBLAS fell back to
  // (reexec_with_blas_core).
  const char* from = forced ? std::getenv("ATTN_BLAS_AUTOCORE_FROM") : nullptr;
  return {{"library", openblas_get_config()},
          {"core", openblas_get_corename()},
          {"coretype_env", forced ? nlohmann::json(forced) : nlohmann::json(nullptr)},
          {"autocore_from", from ? nlohmann::json(from) : nlohmann::json(nullptr)},
          {"note", blas_kernel_note()}};
}

nlohmann::json kernels_json() {
  nlohmann::json j = nlohmann::json::object();
  for (const Attention* v : Registry::instance().all())
    if (nlohmann::json k = v->kernels(); !k.empty()) j[v->name()] = std::move(k);
  return j;
}

nlohmann::json info_json() {
  const auto threads =
      static_cast<int>(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
  return {{"cpu_model", cpu_model()},
          {"isa", isa_json()},
          {"blas", blas_json()},
          {"tbb", {{"version", TBB_runtime_version()}, {"headers", TBB_VERSION_STRING}}},
          {"threads", threads},
          {"cores_available", available_threads()},
          {"kernels", kernels_json()}};
}

nlohmann::json system_info() {
  nlohmann::json j;
  const std::string model = cpu_model(), flags = cpuinfo_field("flags");
  // Only the SIMD flags that matter for these kernels; the full list is long and mostly noise.
  std::string simd;
  std::istringstream fs(flags);
  for (std::string f; fs >> f;)
    if (f.rfind("avx", 0) == 0 || f == "fma" || f.rfind("sse4", 0) == 0 || f == "f16c" ||
        f.rfind("amx", 0) == 0)
      simd += (simd.empty() ? "" : " ") + f;
  j["cpu_model"] = model;
  j["cpu_simd_flags"] = simd;
  j["isa"] = isa_json();
  j["kernels"] = kernels_json();
  j["cores_available"] = available_threads();
  j["memory_total_bytes"] =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  j["hostname"] = host;
  j["compiler"] = std::string("g++ ") + __VERSION__;
  j["build_type"] = ATTN_BUILD_TYPE;
  j["cxx_flags"] = ATTN_CXX_FLAGS;
  j["git_commit"] = ATTN_GIT_COMMIT;
  j["libraries"] = {
      {"openblas", blas_info()},
      {"tbb", TBB_VERSION_STRING},
      {"eigen", std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
                    std::to_string(EIGEN_MINOR_VERSION)},
      {"nlohmann_json", std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." +
                            std::to_string(NLOHMANN_JSON_VERSION_MINOR) + "." +
                            std::to_string(NLOHMANN_JSON_VERSION_PATCH)}};
  return j;
}

}  // namespace attn
