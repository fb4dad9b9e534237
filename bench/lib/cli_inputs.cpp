// `attnbench inputs CONFIG --filter ID --out DIR`: writes one sweep point's inputs as .npy, exactly as
// `attnbench run` makes them (same regime, seed and mask), with the point's plan entry and the fp64
// reference rows its accuracy is measured against. Q, K, V are fp32 (after RoPE, before any rounding to a
// bf16 / fp16 point's dtype: round them to point.json's problem.dtype to get what the kernel read). The
// other inputs the point's variant reads, all fp32 and never rounded: key_padding.npy (uint8), g.npy (a
// recurrence's gate in the shape its variant reads: [batch, heads, seq_kv] or [.., head_dim]), beta.npy
// ([batch, heads, seq_kv]), sink_logits.npy ([heads], points with sink logits) and a decode point's
// initial_state.npy ([batch, heads, head_dim, d_v]: the state the runner makes by a chunkwise prefill of
// the context, DecodeStates). reference.npy is `accuracy`'s reference (accuracy_reference: exact softmax
// attention, or the variant's own definition for Capabilities::own_definition, from the initial state at a
// decode point) on the inputs rounded to the point's dtype, reference_e2e.npy (bf16 / fp16 only) the same
// on the fp32 ones. A backward point (`,pass=backward` / `,pass=forward_backward`) also gets its dO
// (d_out.npy, make_d_out) and the fp64 gradient its grad_accuracy is measured against
// (reference_gradient_blocks: exact softmax attention's, or the variant's own definition's): the
// (batch, K/V head) blocks of grad_reference_blocks (grad_blocks.npy) in reference_attention_backward's
// compact layout (grad_dq.npy [n, group, seq_q, head_dim], grad_dk.npy [n, seq_kv, head_dim] and
// grad_dv.npy [n, seq_kv, d_v]), on the inputs rounded to the point's dtype as the runner's. point.json's
// "files" names every file written. The PyTorch peer (scripts/peers/torch_attention.py) and anyone
// reproducing a row outside attnbench start from these files.
#include <filesystem>
#include <iostream>
#include <set>

#include "bench/lib/accuracy.hpp"
#include "bench/lib/command.hpp"
#include "bench/lib/decode_state.hpp"
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

// Writes `array` as DIR/NAME.npy and names it in `files`.
template <class Array>
void write_file(const fs::path& dir, const std::string& name, const Array& array, Json& files) {
  write_npy((dir / (name + ".npy")).string(), array);
  files[name] = name + ".npy";
}

// The inputs beyond Q, K, V the point's variant reads (capabilities, problem): key padding, g, beta, sink
// logits, and a decode point's initial state (`fp32.initial_state`).
void write_extra_inputs(const SweepPoint& pt, const PointInputs& in, const AttentionInputs& fp32,
                        const fs::path& dir, Json& files) {
  const Problem& p = pt.problem;
  const Capabilities caps = Registry::instance().get(p.variant).capabilities();
  if (p.mask.key_padding) write_file(dir, "key_padding", in.key_padding, files);
  if (caps.gate != Gate::none) write_file(dir, "g", caps.gate == Gate::vector ? in.g_vector : in.g, files);
  if (caps.beta) write_file(dir, "beta", in.beta, files);
  if (caps.indexer) {  // eval's --index-q, --index-k, --index-w
    write_file(dir, "index_q", in.index_q, files);
    write_file(dir, "index_k", in.index_k, files);
    write_file(dir, "index_w", in.index_w, files);
  }
  if (p.sinks) write_file(dir, "sink_logits", in.sink_logits, files);
  if (p.initial_state && fp32.initial_state) {
    FloatArray state({p.batch, p.heads, p.head_dim, p.value_dim()});
    std::copy_n(fp32.initial_state, state.numel(), state.ptr());
    write_file(dir, "initial_state", state, files);
  }
}

// `accuracy`'s reference rows on `stored` (the inputs rounded to the point's dtype) and, bf16 / fp16,
// `accuracy_e2e`'s on `fp32`, with the rows compared (none: nothing is written).
void write_reference_files(const Problem& p, const AccuracySettings& accuracy, const AttentionInputs& fp32,
                           const AttentionInputs& stored, const fs::path& dir, Json& files) {
  const std::vector<int64_t> rows = accuracy_rows(p, accuracy);
  if (rows.empty()) return;
  const bool full = accuracy_mode(p, accuracy) == "full";
  write_file(dir, "reference", accuracy_reference(p, stored, rows, full), files);
  if (p.dtype != DType::fp32)
    write_file(dir, "reference_e2e", accuracy_reference(WideInputs::as_fp32(p), fp32, rows, full), files);
  NdArray<int64_t> r({static_cast<int64_t>(rows.size())});
  std::copy(rows.begin(), rows.end(), r.data.begin());
  write_file(dir, "rows", r, files);
}

// A backward point's dO and, for `blocks` (empty: none), the fp64 gradient grad_accuracy compares with
// (reference_gradient_blocks) on `stored`, the inputs the kernel reads (rounded to the point's dtype, with
// g, beta, sink logits and initial state), as the runner's (AccuracyReferences::fill_backward): compact, the
// blocks in order.
void write_backward_files(const SweepPoint& pt, const AttentionInputs& stored,
                          const std::vector<int64_t>& blocks, const fs::path& dir, Json& files) {
  const FloatArray d_out = make_d_out(pt);
  write_file(dir, "d_out", d_out, files);
  if (blocks.empty()) return;
  {
    const GradientBlocks g = reference_gradient_blocks(pt.problem, stored, d_out.ptr(), blocks);
    write_file(dir, "grad_dq", g.dq, files);
    write_file(dir, "grad_dk", g.dk, files);
    write_file(dir, "grad_dv", g.dv, files);
  }
  NdArray<int64_t> b({static_cast<int64_t>(blocks.size())});
  std::copy(blocks.begin(), blocks.end(), b.data.begin());
  write_file(dir, "grad_blocks", b, files);
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
  // A backward point's inputs hold dO too (the output's size, fp32) beside Q, K, V; its reference the
  // gradients'.
  // The per-token inputs (g, beta, sinks, a decode point's state) and the prefill making that state too.
  const std::size_t inputs_need = sat_add(need.call.inputs, need.fp32_inputs, need.extra_inputs, need.prefill,
                                          backward ? sat_mul(to_size(p.out_elements()), sizeof(float)) : 0);
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
  // What the kernel reads, as the runner's (PointRunner::inputs_for): the fp32 inputs with the gate its
  // variant reads, and a decode point's state by the same chunkwise prefill; rounded to the point's dtype.
  PointInputs in = make_inputs(pt);
  AttentionInputs fp32 = in.view(p, nullptr);
  DecodeStates states;
  states.prepare(pt, fp32);
  fp32.initial_state = states.state_for(p);
  const StoredInputs stored(p, fp32);
  // point.json last: a folder with point.json is complete (every file is written atomically).
  Json files = Json::object();
  write_file(dir, "q", in.q, files);
  write_file(dir, "k", in.k, files);
  write_file(dir, "v", in.v, files);
  write_extra_inputs(pt, in, fp32, dir, files);
  if (o.reference) write_reference_files(p, plan.config.accuracy, fp32, stored.get(), dir, files);
  if (backward)
    write_backward_files(
        pt, stored.get(),
        o.reference ? grad_reference_blocks(p, plan.config.accuracy) : std::vector<int64_t>{}, dir, files);
  Json j = point_json(pt, plan.config);
  j["files"] = std::move(files);
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
    "write one sweep point's inputs (q/k/v .npy, the g / beta / sink logits / initial state its variant "
    "reads, "
    "dO for backward points), its plan entry and fp64 reference rows (and gradients)",
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
