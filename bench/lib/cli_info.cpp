// `attnbench info [--json]`: what this machine and build give the kernels: the CPU model, the SIMD targets
// (compiled into the binary, supported by the CPU, the best one, which --isa best picks), the BLAS library
// with the kernel core it uses, the TBB version, the thread count commands run with and the kernels variants
// pick on this CPU and target (Attention::kernels: tiled's bf16 kernel). `--row-fields`
// prints the result row's field table instead (configs/README.md holds it; tests/test_result_row.cpp checks).
#include <iostream>

#include "bench/lib/command.hpp"
#include "bench/lib/result_row.hpp"
#include "bench/lib/sysinfo.hpp"
#include "common/support/runtime.hpp"

namespace attn::cli {
namespace {

std::string joined(const Json& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n.get<std::string>();
  return s;
}

int run_info(bool as_json, bool row_fields) {
  if (row_fields) {
    if (as_json) {
      Json fields = Json::array();
      for (const RowField& f : attn::row_fields())
        fields.push_back({{"field", f.path},
                          {"type", f.type},
                          {"unit", f.unit},
                          {"meaning", f.meaning},
                          {"ring_only", f.ring_only},
                          {"task_only", f.task_only}});
      std::cout << fields.dump(2) << "\n";
    } else {
      std::cout << row_fields_markdown();
    }
    return 0;
  }
  // run_cli's ThreadScope holds the --threads value (all available cores by default).
  const Json info = info_json();
  const int threads = info["threads"];
  if (as_json) {
    std::cout << info.dump(2) << "\n";
    return 0;
  }
  const Json& isa = info["isa"];
  const Json& blas = info["blas"];
  std::cout << "cpu:       " << (info["cpu_model"] == "" ? "(unknown)" : info["cpu_model"].get<std::string>())
            << "\n"
            << "isa:       best " << isa["best"].get<std::string>() << "\n"
            << "           supported: " << joined(isa["supported"]) << "\n"
            << "           compiled:  " << joined(isa["compiled"]) << "\n"
            << "blas:      " << blas["library"].get<std::string>() << "\n"
            << "           core: " << blas["core"].get<std::string>();
  if (!blas["coretype_env"].is_null())
    std::cout << " (OPENBLAS_CORETYPE=" << blas["coretype_env"].get<std::string>()
              << (blas["autocore_from"].is_null()
                      ? std::string()
                      : ", set by attnbench: OpenBLAS had fallen back to " +
                            blas["autocore_from"].get<std::string>() + " on this CPU")
              << ")";
  std::cout << "\n";
  if (const std::string note = blas["note"]; !note.empty()) std::cout << "           note: " << note << "\n";
  std::cout << "tbb:       " << info["tbb"]["version"].get<std::string>() << "\n"
            << "threads:   " << threads << " (" << available_threads() << " cores available)\n";
  // The kernels variants pick on this CPU and target, one line each: "tiled bf16: vdpbf16ps (AVX512_BF16)".
  bool first = true;
  for (const auto& [variant, kinds] : info["kernels"].items())
    for (const auto& [what, kernel] : kinds.items()) {
      std::cout << (first ? "kernels:   " : "           ") << variant << " " << what << ": "
                << kernel.get<std::string>() << "\n";
      first = false;
    }
  return 0;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND("info", "the CPU, SIMD targets (compiled, supported, best), BLAS core, TBB and threads",
                      [](CLI::App& sub) {
                        auto as_json = std::make_shared<bool>(false);
                        auto row_fields = std::make_shared<bool>(false);
                        sub.add_flag("--json", *as_json, "machine-readable output");
                        sub.add_flag("--row-fields", *row_fields,
                                     "the result row's fields (Markdown table; JSON with --json)");
                        return std::function<int()>(
                            [as_json, row_fields] { return attn::cli::run_info(*as_json, *row_fields); });
                      })
