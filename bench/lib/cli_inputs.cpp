// `attnbench inputs CONFIG --filter ID --out DIR`: writes one sweep point's inputs as .npy, exactly as
// `attnbench run` makes them (same regime, seed and mask), with the point's plan entry and the fp64 exact
// reference rows its accuracy is measured against. Q, K, V are fp32 (after RoPE, before any rounding to a
// bf16 / fp16 point's dtype: round them to point.json's problem.dtype to get what the kernel read);
// reference.npy is on the rounded inputs, reference_e2e.npy (bf16 / fp16 only) on the fp32 ones. The PyTorch
// peer (scripts/peers/torch_attention.py) and anyone reproducing a row outside attnbench start from these
// files.
#include <filesystem>
#include <iostream>
#include <set>

#include "bench/lib/command.hpp"
#include "bench/lib/inputs.hpp"
#include "bench/lib/rows.hpp"
#include "bench/lib/sweep.hpp"
#include "common/error.hpp"
#include "common/half.hpp"
#include "common/npy.hpp"
#include "common/reference.hpp"
#include "common/simd.hpp"
#include "common/util.hpp"

namespace fs = std::filesystem;

namespace attn::cli {
namespace {

struct InputsOptions {
  std::string config, filter, out, isa = "best";
  bool reference = true;
};

int write_inputs(const InputsOptions& o) {
  simd::select_isa(o.isa, "--isa");
  const Plan plan = load_plan(o.config, o.isa);
  // An exact id wins; otherwise every point the filter selects must share one set of inputs.
  std::vector<SweepPoint> points;
  for (const SweepPoint& pt : plan.points)
    if (pt.id == o.filter) points = {pt};
  if (points.empty()) points = filter_points(plan, o.filter);
  std::set<std::string> keys;
  for (const SweepPoint& pt : points) keys.insert(pt.input_key);
  if (keys.size() > 1)
    throw UsageError("--filter '" + o.filter + "' selects " + std::to_string(points.size()) +
                     " points with " + std::to_string(keys.size()) +
                     " different inputs; give a point's full id (see `attnbench run CONFIG --dry-run`)");
  const SweepPoint& pt = points.front();
  const Problem& p = pt.problem;

  const PointMemory need = point_memory(pt, plan.config);
  const std::size_t inputs_need = sat_add(need.call.inputs, need.fp32_inputs);
  if (sat_add(inputs_need, o.reference ? need.reference : 0) > *plan.config.memory_budget_bytes)
    throw NotSupported(pt.id + ": its inputs" + std::string(o.reference ? " and reference rows" : "") +
                       " need " + format_bytes(static_cast<double>(sat_add(inputs_need, need.reference))) +
                       ", more than the config's memory_budget " +
                       format_bytes(static_cast<double>(*plan.config.memory_budget_bytes)));
  const fs::path dir = o.out;
  if (fs::exists(dir) && !fs::is_directory(dir))
    throw UsageError("--out '" + o.out + "' exists and is not a folder");
  fs::create_directories(dir);
  const PointInputs in = make_inputs(pt);
  // point.json last: a folder with point.json is complete (every file is written atomically).
  write_npy((dir / "q.npy").string(), in.q);
  write_npy((dir / "k.npy").string(), in.k);
  write_npy((dir / "v.npy").string(), in.v);
  if (p.mask.key_padding) write_npy((dir / "key_padding.npy").string(), in.key_padding);
  const std::vector<int64_t> rows = accuracy_rows(p, plan.config.accuracy);
  if (o.reference && !rows.empty()) {
    const bool full = accuracy_mode(p, plan.config.accuracy) == "full";
    DoubleArray ref({p.batch, p.heads, static_cast<int64_t>(rows.size()), p.head_dim});
    {
      // `accuracy`'s reference: on the inputs rounded to the point's dtype (fp32: the inputs themselves).
      const StoredInputs stored(p, in.view(nullptr));
      reference_attention(p, stored.get(), ref.ptr(), full ? nullptr : &rows);
    }
    write_npy((dir / "reference.npy").string(), ref);
    if (p.dtype != DType::fp32) {  // `accuracy_e2e`'s: on the fp32 inputs
      reference_attention(WideInputs::as_fp32(p), in.view(nullptr), ref.ptr(), full ? nullptr : &rows);
      write_npy((dir / "reference_e2e.npy").string(), ref);
    }
    NdArray<int64_t> r({static_cast<int64_t>(rows.size())});
    std::copy(rows.begin(), rows.end(), r.data.begin());
    write_npy((dir / "rows.npy").string(), r);
  }
  Json j = point_json(pt, plan.config);
  j["files"] = {{"q", "q.npy"}, {"k", "k.npy"}, {"v", "v.npy"}};
  if (p.mask.key_padding) j["files"]["key_padding"] = "key_padding.npy";
  if (o.reference && !rows.empty()) {
    j["files"]["reference"] = "reference.npy", j["files"]["rows"] = "rows.npy";
    if (p.dtype != DType::fp32) j["files"]["reference_e2e"] = "reference_e2e.npy";
  }
  j["points_sharing_these_inputs"] = Json::array();
  for (const SweepPoint& q : plan.points)
    if (q.input_key == pt.input_key) j["points_sharing_these_inputs"].push_back(q.id);
  write_file_atomic((dir / "point.json").string(), j.dump(2) + "\n");
  std::cout << "attnbench: inputs of " << pt.id << " -> " << dir.string() << "\n";
  return 0;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND(
    "inputs", "write one sweep point's inputs (q/k/v .npy), its plan entry and fp64 reference rows",
    [](CLI::App& sub) {
      auto o = std::make_shared<attn::cli::InputsOptions>();
      sub.add_option("config", o->config, "sweep config (JSON), see configs/README.md")->required();
      sub.add_option("--filter", o->filter,
                     "a point's id, or text that selects points sharing one set of inputs")
          ->required();
      sub.add_option("--out", o->out, "output folder (created; files in it are replaced)")->required();
      sub.add_flag(
          "--no-reference", [o](int64_t) { o->reference = false; },
          "skip the fp64 reference rows (reference.npy, rows.npy)");
      attn::cli::add_isa_option(sub, o->isa);
      return std::function<int()>([o] { return attn::cli::write_inputs(*o); });
    })
