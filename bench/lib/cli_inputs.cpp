// `attnbench inputs CONFIG --filter ID --out DIR`: writes one sweep point's inputs as .npy, exactly as
// `attnbench run` makes them (same regime, seed and mask), with the point's plan entry and the fp64 exact
// reference rows its accuracy is measured against. Q, K, V are fp32 (after RoPE, before any rounding to a
// bf16 / fp16 point's dtype: round them to point.json's problem.dtype to get what the kernel read);
// reference.npy is on the rounded inputs, reference_e2e.npy (bf16 / fp16 only) on the fp32 ones. A backward
// point (`,pass=backward` / `,pass=forward_backward`) also gets its dO (d_out.npy, make_d_out) and the fp64
// gradient of exact attention its grad_accuracy is measured against: the (batch, K/V head) blocks of
// grad_reference_blocks (grad_blocks.npy) in reference_attention_backward's compact layout (grad_dq.npy
// [n, group, seq_q, head_dim], grad_dk.npy and grad_dv.npy [n, seq_kv, head_dim]), on the inputs rounded to
// the point's dtype as the runner's. The PyTorch peer (scripts/peers/torch_attention.py) and anyone
// reproducing a row outside attnbench start from these files.
#include <filesystem>
#include <iostream>
#include <set>

#include "bench/lib/command.hpp"
#include "bench/lib/inputs.hpp"
#include "bench/lib/rows.hpp"
#include "bench/lib/sweep.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/kernels/simd.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"

namespace fs = std::filesystem;

namespace attn::cli {
namespace {

struct InputsOptions {
  std::string config, filter, out, isa = "best";
  bool reference = true;
};

// A backward point's dO and, for `blocks` (empty: none), the fp64 gradient of exact attention (same masks,
// bias, scale, dropout) on the inputs the kernel reads (rounded to the point's dtype), as the runner's
// grad_accuracy (AccuracyReferences::fill_backward): compact, the blocks in order.
void write_backward_files(const SweepPoint& pt, const PointInputs& in, const std::vector<int64_t>& blocks,
                          const fs::path& dir) {
  const Problem& p = pt.problem;
  const FloatArray d_out = make_d_out(pt);
  write_npy((dir / "d_out.npy").string(), d_out);
  if (blocks.empty()) return;
  const auto n = static_cast<int64_t>(blocks.size());
  DoubleArray dq({n, p.group_size(), p.seq_q, p.head_dim}), dk({n, p.seq_kv, p.head_dim}), dv(dk.shape);
  {
    const StoredInputs stored(p, in.view(nullptr));
    reference_attention_backward(p, stored.get(), d_out.ptr(), dq.ptr(), dk.ptr(), dv.ptr(), &blocks);
  }
  write_npy((dir / "grad_dq.npy").string(), dq);
  write_npy((dir / "grad_dk.npy").string(), dk);
  write_npy((dir / "grad_dv.npy").string(), dv);
  NdArray<int64_t> b({n});
  std::copy(blocks.begin(), blocks.end(), b.data.begin());
  write_npy((dir / "grad_blocks.npy").string(), b);
}

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
  const bool backward = pt.pass != Pass::forward;
  // A backward point's inputs hold dO too (Q's size, fp32) beside Q, K, V; its reference the gradients'.
  const std::size_t inputs_need = sat_add(need.call.inputs, need.fp32_inputs,
                                          backward ? sat_mul(to_size(p.q_elements()), sizeof(float)) : 0);
  const std::size_t reference_need = sat_add(need.reference, need.grad_reference);
  if (sat_add(inputs_need, o.reference ? reference_need : 0) > *plan.config.memory_budget_bytes)
    throw NotSupported(pt.id + ": its inputs" + std::string(o.reference ? " and reference rows" : "") +
                       " need " + format_bytes(static_cast<double>(sat_add(inputs_need, reference_need))) +
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
  const std::vector<int64_t> blocks =
      backward && o.reference ? grad_reference_blocks(p, plan.config.accuracy) : std::vector<int64_t>{};
  if (backward) write_backward_files(pt, in, blocks, dir);
  Json j = point_json(pt, plan.config);
  j["files"] = {{"q", "q.npy"}, {"k", "k.npy"}, {"v", "v.npy"}};
  if (p.mask.key_padding) j["files"]["key_padding"] = "key_padding.npy";
  if (o.reference && !rows.empty()) {
    j["files"]["reference"] = "reference.npy", j["files"]["rows"] = "rows.npy";
    if (p.dtype != DType::fp32) j["files"]["reference_e2e"] = "reference_e2e.npy";
  }
  if (backward) j["files"]["d_out"] = "d_out.npy";
  if (!blocks.empty()) {
    j["files"]["grad_dq"] = "grad_dq.npy", j["files"]["grad_dk"] = "grad_dk.npy";
    j["files"]["grad_dv"] = "grad_dv.npy", j["files"]["grad_blocks"] = "grad_blocks.npy";
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
    "inputs",
    "write one sweep point's inputs (q/k/v .npy, dO for backward points), its plan entry and fp64 reference "
    "rows (and gradients)",
    [](CLI::App& sub) {
      auto o = std::make_shared<attn::cli::InputsOptions>();
      sub.add_option("config", o->config, "sweep config (JSON), see configs/README.md")->required();
      sub.add_option("--filter", o->filter,
                     "a point's id, or text that selects points sharing one set of inputs")
          ->required();
      sub.add_option("--out", o->out, "output folder (created; files in it are replaced)")->required();
      sub.add_flag(
          "--no-reference", [o](int64_t) { o->reference = false; },
          "skip the fp64 reference rows (reference.npy, rows.npy) and gradients (grad_*.npy)");
      attn::cli::add_isa_option(sub, o->isa);
      return std::function<int()>([o] { return attn::cli::write_inputs(*o); });
    })
