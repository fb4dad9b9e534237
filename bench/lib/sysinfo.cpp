// System and build facts for meta.json.
#include "bench/lib/sysinfo.hpp"

#include <oneapi/tbb/version.h>
#include <unistd.h>

#include <Eigen/Core>
#include <chrono>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

#include "common/runtime.hpp"

namespace attn {

std::string now_iso8601() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json system_info() {
  nlohmann::json j;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(cpuinfo, line)) {
    auto value = [&] { return line.substr(line.find(':') + 2); };
    if (model.empty() && line.rfind("model name", 0) == 0) model = value();
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = value();
  }
  // Only the SIMD flags that matter for these kernels; the full list is long and mostly noise.
  std::string simd;
  std::istringstream fs(flags);
  for (std::string f; fs >> f;)
    if (f.rfind("avx", 0) == 0 || f == "fma" || f.rfind("sse4", 0) == 0 || f == "f16c" ||
        f.rfind("amx", 0) == 0)
      simd += (simd.empty() ? "" : " ") + f;
  j["cpu_model"] = model;
  j["cpu_simd_flags"] = simd;
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
