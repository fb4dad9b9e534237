// Facts about the machine and the build, recorded in every results folder's meta.json and printed by
// `attnbench info`.
#pragma once
#include <nlohmann/json.hpp>

namespace attn {

nlohmann::json system_info();  // cpu model and flags, SIMD targets, cores, memory, compiler, flags, library
                               // versions, git
std::string cpu_model();       // "model name" of /proc/cpuinfo (empty where it has none)
nlohmann::json isa_json();     // {"compiled": [...], "supported": [...], "best": "..."} (simd::isa_info())
// {"library": openblas_get_config(), "core": the kernel core OpenBLAS uses, "coretype_env": OPENBLAS_CORETYPE
// or null, "note": blas_kernel_note() (empty unless the variable forces AVX2 kernels on an AVX-512 CPU)}
nlohmann::json blas_json();
// What `attnbench info --json` prints (and the Python module's info() returns): cpu_model, isa, blas, tbb
// (runtime and header versions), threads (the TBB thread limit now in force: --threads, else every available
// core), cores_available and kernels (kernels_json).
nlohmann::json info_json();
// The kernels each variant picks on this CPU and SIMD target where it has a choice (Attention::kernels),
// by variant name: {"tiled": {"bf16": "vdpbf16ps (AVX512_BF16)"}}. Also in meta.json (system_info).
nlohmann::json kernels_json();
std::string now_iso8601();  // UTC, e.g. 2026-11-29T21:32:24Z

}  // namespace attn
