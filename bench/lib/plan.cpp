// The plan: machine defaults resolved, the cross product expanded and checked, and per-point facts.
#include "bench/lib/plan.hpp"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "bench/lib/decode_state.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/simd.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/hash.hpp"
#include "common/support/runtime.hpp"

namespace attn {
namespace {

std::string axis_path(const Json& raw, const std::string& section, const std::string& key, std::size_t i) {
  const bool list = raw.contains(section) && raw[section].contains(key) && raw[section][key].is_array();
  return section + "." + key + (list ? "[" + std::to_string(i) + "]" : "");
}

// Fills what the config left to the machine and checks what it asked against the machine.
void resolve_for_machine(SweepConfig& c, const Machine& m) {
  if (c.threads.empty()) {
    c.threads = {m.threads};
  } else {
    for (std::size_t i = 0; i < c.threads.size(); ++i)
      if (c.threads[i] > m.threads)
        throw UsageError(axis_path(c.raw, "sweep", "threads", i) + ": must be an integer in [1, " +
                         std::to_string(m.threads) + "] (the cores available), got " +
                         std::to_string(c.threads[i]));
  }
  if (!c.memory_budget_bytes)
    c.memory_budget_bytes = m.physical_bytes ? m.physical_bytes / 2 : (uint64_t{8} << 30);
  for (std::size_t i = 0; i < c.isas.size(); ++i) {
    const std::string& name = c.isas[i];
    if (name != "best" && std::find(m.isas.begin(), m.isas.end(), name) == m.isas.end())
      throw UsageError((c.isa_from_config ? axis_path(c.raw, "sweep", "isa", i) : std::string("--isa")) +
                       " '" + name + "': this CPU does not support that target; supported: best, " +
                       join(m.isas));
  }
}

// A repeated axis value (seq_len [16, 16], a variant listed twice) would make two points with one id, and
// --resume would take one for the other; sizes whose product overflows, and parameters a variant refuses at
// a shape (a global token listed twice), are config errors too, before any output folder exists.
void check_plan(const SweepConfig& c, const std::vector<SweepPoint>& points) {
  std::map<std::string, std::size_t> seen;
  const Json variants = c.raw.value("variants", Json("all"));
  for (const SweepPoint& pt : points) {
    if (++seen[pt.id] == 2)
      throw UsageError("config: two points have the same id '" + pt.id +
                       "': an axis (sweep.*, inputs, variants or a parameter list) repeats a value");
    try {
      pt.problem.validate();
    } catch (const UsageError& e) {
      throw UsageError("sweep: point '" + pt.id + "': " + e.what());
    }
    try {
      (void)Registry::instance().get(pt.problem.variant).not_supported_reasons(pt.problem);
    } catch (const UsageError& e) {
      std::string where = "variants";
      for (std::size_t i = 0; i < c.variants.size() && variants.is_array() && where == "variants"; ++i) {
        const auto& sets = c.variants[i].param_sets;
        if (c.variants[i].name == pt.problem.variant &&
            std::find(sets.begin(), sets.end(), pt.problem.params) != sets.end())
          where = "variants[" + std::to_string(i) + "].params";
      }
      throw UsageError(where + ": " + e.what());
    }
  }
}

}  // namespace

Machine this_machine() {
  Machine m;
  m.threads = available_threads();
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  m.physical_bytes = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  m.isas = simd::isa_info().supported;
  return m;
}

void apply_isa_option(SweepConfig& c, const std::string& name) {
  simd::validate_isa(name, "--isa");
  if (name == "best") return;  // the default: the config's sweep.isa (or its default) stands
  if (c.isa_from_config)
    throw UsageError("--isa '" + name + "': config '" + c.source_path + "' sets sweep.isa (" +
                     c.raw["sweep"]["isa"].dump() +
                     "); give the targets in one place: drop --isa, or drop sweep.isa from the config");
  c.isas = {name};
}

Plan make_plan(SweepConfig config, const std::string& isa_option, const Machine& machine) {
  apply_isa_option(config, isa_option);
  resolve_for_machine(config, machine);
  Plan plan;
  plan.points = expand_plan(config);
  check_plan(config, plan.points);
  plan.config = std::move(config);
  return plan;
}

Plan load_plan(const std::string& path, const std::string& isa_option) {
  SweepConfig c = load_sweep_config(path);
  try {
    return make_plan(std::move(c), isa_option);
  } catch (const UsageError& e) {
    const std::string what = e.what();
    if (what.rfind("--isa", 0) == 0) throw;  // about the option, not the file
    throw UsageError("config '" + path + "': " + what);
  }
}

namespace {
// What a mask adds to a point's inputs: "none" or "pad=F" (causal masks add nothing; see expand_plan).
std::string mask_inputs_label(const MaskAxis& m) {
  MaskAxis inputs_only;
  inputs_only.spec.key_padding = m.spec.key_padding;
  inputs_only.pad_fraction = m.pad_fraction;
  return inputs_only.label();
}
}  // namespace

std::vector<SweepPoint> expand_plan(const SweepConfig& c) {
  if (c.threads.empty() || !c.memory_budget_bytes)
    throw std::logic_error("expand_plan: the config is not resolved for a machine (use make_plan)");
  std::vector<SweepPoint> plan;
  // The masks in the order of their inputs part, first appearance first (stable): masks that differ only in
  // causality are adjacent in the plan, so they form one interleaved group (sweep.cpp groups adjacent points
  // of one input key). Configs whose masks already are in that order keep their plan order.
  std::vector<MaskAxis> masks_by_inputs;
  for (const MaskAxis& m : c.masks) {
    const std::string part = mask_inputs_label(m);
    bool seen = false;
    for (const MaskAxis& have : masks_by_inputs) seen |= mask_inputs_label(have) == part;
    if (seen) continue;
    for (const MaskAxis& same : c.masks)
      if (mask_inputs_label(same) == part) masks_by_inputs.push_back(same);
  }
  const std::size_t n_seq = c.self_attention ? c.seq_q.size() : c.seq_q.size() * c.seq_kv.size();
  for (const Regime& regime : c.regimes)
    for (int64_t B : c.batch)
      for (int64_t H : c.heads)
        for (int64_t KV : c.kv_heads.empty() ? std::vector<int64_t>{H} : c.kv_heads)
          for (int64_t D : c.head_dim)
            for (int64_t Dv : c.v_head_dim.empty() ? std::vector<int64_t>{D} : c.v_head_dim)
              for (std::size_t s = 0; s < n_seq; ++s)
                for (const MaskAxis& mask : masks_by_inputs) {
                  const int64_t Lq = c.self_attention ? c.seq_q[s] : c.seq_q[s / c.seq_kv.size()];
                  const int64_t Lkv = c.self_attention ? c.seq_kv[s] : c.seq_kv[s % c.seq_kv.size()];
                  std::ostringstream key;
                  // Hkv only when it differs from H, as in repro(): configs without sweep.kv_heads keep their
                  // input keys, and so their input seeds and inputs.
                  key << "B=" << B << ",H=" << H;
                  if (KV != H) key << ",Hkv=" << KV;
                  // The mask's part of the key is what it adds to the inputs (the key-padding flags), not
                  // causality: a causal point and its non-causal twin read the same Q, K, V (the non-causal
                  // point's draws), so they are one input set, timed together and compared round by round.
                  key << ",Lq=" << Lq << ",Lkv=" << Lkv << ",D=" << D;
                  if (Dv != D) key << ",Dv=" << Dv;  // as in repro(): configs without it keep their keys
                  key << "," << mask_inputs_label(mask) << ",";
                  // The seed comes from the regime without RoPE: a point with RoPE rotates the very draws (or
                  // projections) the same point without it uses. The key has the RoPE part: other inputs.
                  const uint64_t seed = fnv1a64(key.str() + regime.base_label(), c.seed);
                  key << regime.label();
                  // The storage dtype and the bias leave the fp32 inputs as they are: points differing only
                  // in them share the input key (and the fp32 reference of the end-to-end accuracy).
                  for (const Bias bias : c.biases)
                    for (const double cap : c.softcaps)
                      for (const bool sinks : c.sinks)
                        for (const DType dtype : c.dtypes)
                          for (const VariantSpec& v : c.variants)
                            for (const Json& params : v.param_sets)
                              for (int T : c.threads)
                                for (const std::string& isa : c.isas)
                                  for (const Pass pass : c.passes) {
                                    SweepPoint pt;
                                    Problem& p = pt.problem;
                                    p = make_problem(
                                        v.name,
                                        params);  // resolved already; this records the spec order
                                    p.batch = B, p.heads = H, p.seq_q = Lq, p.seq_kv = Lkv, p.head_dim = D;
                                    p.v_head_dim = Dv == D ? 0 : Dv;  // 0: V as wide as Q and K
                                    p.kv_heads =
                                        KV == H ? 0 : KV;  // 0: multi-head attention (Problem::num_kv_heads)
                                    p.mask = mask.spec;
                                    p.dropout = c.dropout;
                                    p.seed = c.seed;
                                    p.dtype = dtype;
                                    p.bias = bias;
                                    if (cap > 0) p.softcap = cap;
                                    p.sinks = sinks;
                                    // A recurrence's decode point runs from the state a chunkwise prefill of
                                    // the context makes (untimed; decode_state.hpp).
                                    p.initial_state = decode_from_prefill(p);
                                    pt.mask = mask;
                                    pt.regime = regime;
                                    pt.threads = T;
                                    pt.isa = isa;
                                    pt.pass = pass;
                                    pt.input_key = key.str();
                                    pt.input_seed = seed;
                                    std::ostringstream id;
                                    id << p.repro();
                                    if (mask.spec.key_padding)
                                      id << ",padfrac=" << shortest_double_text(mask.pad_fraction);
                                    id << "," << regime.label() << ",T=" << T;
                                    // "best" adds nothing: configs without sweep.isa keep the ids (and
                                    // --filter texts and resumable folders) they had before the axis existed.
                                    if (isa != "best") id << ",isa=" << isa;
                                    // The forward adds nothing, so ids from before the pass axis stay as they
                                    // were.
                                    if (pass != Pass::forward) id << ",pass=" << pass_name(pass);
                                    pt.id = id.str();
                                    plan.push_back(std::move(pt));
                                  }
                }
  return plan;
}

std::string accuracy_mode(const Problem& p, const AccuracySettings& a) {
  if (a.reference != "auto") return a.reference;
  return p.seq_q <= a.rows ? "full" : "sampled";
}

std::vector<int64_t> accuracy_rows(const Problem& p, const AccuracySettings& a) {
  const std::string mode = accuracy_mode(p, a);
  if (mode == "none") return {};
  return sample_rows(p.seq_q, mode == "full" ? p.seq_q : a.rows);
}

std::string grad_accuracy_mode(const Problem& p, const AccuracySettings& a) {
  if (a.reference == "none") return "none";
  if (const Capabilities caps = Registry::instance().get(p.variant).capabilities();
      caps.own_definition && caps.state) {
    // A recurrence's fp64 gradient (recurrence_reference_backward) is its definition token by token, not
    // softmax's n x n: a forward keeping a state every few tokens, then each stretch recomputed and reversed,
    // at most about 20 multiply-adds per (token, state entry) per head (the delta rule's, the largest:
    // k S, the update and the output forward; their adjoints and the recomputation back). It is computed
    // over every head even when only the first and last blocks are compared (reference_gradient_blocks), so
    // the whole problem is what it costs either way.
    const double all = 20.0 * static_cast<double>(p.seq_q) * static_cast<double>(p.head_dim) *
                       static_cast<double>(p.value_dim()) * static_cast<double>(p.batch * p.heads);
    if (all > a.grad_max_work) return "none";
    return a.reference == "sampled" ? "sampled" : "full";
  }
  // The fp64 gradient's work per query head it covers: two passes of about 3 multiply-adds per (query, key,
  // dim) (reference_attention_backward; dim: the mean of d_k and d_v, which the products split between).
  const double per_head = 3.0 * static_cast<double>(p.seq_q) * static_cast<double>(p.seq_kv) *
                          static_cast<double>(p.head_dim + p.value_dim());
  const double all = per_head * static_cast<double>(p.batch * p.heads);
  if (all <= a.grad_max_work && a.reference != "sampled") return "full";
  const int64_t blocks = std::min<int64_t>(2, p.batch * p.num_kv_heads());
  if (per_head * static_cast<double>(blocks * p.group_size()) <= a.grad_max_work) return "sampled";
  return "none";
}

std::vector<int64_t> grad_reference_blocks(const Problem& p, const AccuracySettings& a) {
  const std::string mode = grad_accuracy_mode(p, a);
  const int64_t n = p.batch * p.num_kv_heads();
  std::vector<int64_t> blocks;
  if (mode == "full")
    for (int64_t x = 0; x < n; ++x) blocks.push_back(x);
  else if (mode == "sampled")
    blocks = n == 1 ? std::vector<int64_t>{0} : std::vector<int64_t>{0, n - 1};  // the first and the last
  return blocks;
}

std::size_t PointMemory::need() const {
  return sat_add(call.total(), reference, fp32_inputs, grad_reference, extra_inputs, prefill);
}

PointMemory point_memory(const SweepPoint& pt, const SweepConfig& c) {
  const Problem& p = pt.problem;
  PointMemory m;
  const Attention& v = Registry::instance().get(p.variant);
  m.call = v.estimate_memory(p, pt.threads);
  if (pt.pass != Pass::forward) {
    // The backward holds Q, K, V, O, the saved state and dO (inputs), dQ, dK, dV (output) and its workspace;
    // a training step also runs the forward, whose workspace is gone before the backward starts.
    const std::size_t forward_workspace = m.call.workspace;
    m.call = v.estimate_backward_memory(p, pt.threads);
    if (pt.pass == Pass::forward_backward) m.call.workspace = std::max(m.call.workspace, forward_workspace);
    const std::vector<int64_t> blocks = grad_reference_blocks(p, c.accuracy);
    if (!blocks.empty()) {
      // fp64 dQ of the blocks' query heads and dK, dV, plus the per-row statistics, and the fp32 gradients'
      // gathered copies.
      const std::size_t n = blocks.size();
      const std::size_t elems = sat_add(sat_mul(n, to_size(p.group_size() * p.seq_q * p.head_dim)),
                                        sat_mul(n, to_size(p.seq_kv * (p.head_dim + p.value_dim()))));
      m.grad_reference = sat_add(sat_mul(elems, sizeof(double) + sizeof(float)),
                                 sat_mul(to_size(p.group_size() * p.seq_q), 2 * sizeof(double)));
      // A variant's own definition (Capabilities::own_definition) has its gradient over the whole tensors
      // (reference_gradients): some of the blocks are gathered from a whole fp64 dQ, dK, dV.
      if (v.capabilities().own_definition && n < to_size(p.batch * p.num_kv_heads()))
        m.grad_reference = sat_add(m.grad_reference, sat_mul(to_size(p.qkv_elements()), sizeof(double)));
    }
  }
  // The accuracy step's fp64 reference rows and the fp32 copy of the compared output rows.
  const std::string mode = accuracy_mode(p, c.accuracy);
  if (mode != "none") {
    const int64_t rows = mode == "full" ? p.seq_q : std::min(p.seq_q, c.accuracy.rows);
    const auto elements = static_cast<std::size_t>(p.batch * p.heads * rows * p.value_dim());
    // bf16 / fp16: the reference on the rounded inputs (the kernel's error) and the one on the fp32 inputs
    // (the end-to-end error); fp32: one serves both.
    m.reference = elements * ((p.dtype == DType::fp32 ? 1 : 2) * sizeof(double) + sizeof(float));
    // A variant that is not softmax attention is compared with its own definition too
    // (Capabilities::own_definition), whose fp64 reference_forward writes every row.
    if (v.capabilities().own_definition)
      m.reference = sat_add(
          m.reference, sat_mul(to_size(p.out_elements()), (p.dtype == DType::fp32 ? 1 : 2) * sizeof(double)));
  }
  if (p.dtype != DType::fp32) m.fp32_inputs = to_size(p.qkv_elements()) * sizeof(float);
  const Capabilities caps = v.capabilities();
  // Per key token (every point draws them over the whole context) and head; saturating: the state's size is
  // not bounded by Problem::validate.
  const std::size_t tokens = to_size(p.batch * p.heads * p.seq_kv);
  const std::size_t gate = caps.gate == Gate::vector   ? sat_mul(tokens, to_size(p.head_dim))
                           : caps.gate == Gate::scalar ? tokens
                                                       : 0;
  const std::size_t state = sat_mul(to_size(p.batch * p.heads), to_size(p.head_dim), to_size(p.value_dim()));
  // An indexer's index_q, index_k and index_w (IndexerShape).
  const std::size_t index =
      caps.indexer ? sat_add(to_size(IndexerShape(p).q_elements(p)), to_size(IndexerShape(p).k_elements(p)),
                             to_size(IndexerShape(p).w_elements(p)))
                   : 0;
  m.extra_inputs =
      sat_mul(sat_add(gate, caps.beta ? tokens : 0, to_size(p.heads), p.initial_state ? state : 0, index),
              sizeof(float));
  if (decode_from_prefill(p)) {
    const Problem pre = prefill_problem(p);
    const std::size_t pre_tokens = to_size(pre.batch * pre.heads * pre.seq_q);
    const std::size_t pre_gate = caps.gate == Gate::vector   ? sat_mul(pre_tokens, to_size(pre.head_dim))
                                 : caps.gate == Gate::scalar ? pre_tokens
                                                             : 0;
    // Its Q, K, V, output and workspace (fp32: the prefill runs in fp32), the g and beta prefixes, the state.
    m.prefill = sat_add(v.estimate_memory(pre, pt.threads).total(),
                        sat_mul(sat_add(pre_gate, caps.beta ? pre_tokens : 0, state), sizeof(float)));
  }
  return m;
}

std::string skip_reason(const SweepPoint& pt, const SweepConfig& c) {
  const Attention& v = Registry::instance().get(pt.problem.variant);
  if (std::string why = pt.pass == Pass::forward ? v.unsupported_reasons_text(pt.problem)
                                                 : v.backward_unsupported_reasons_text(pt.problem);
      !why.empty())
    return why;
  const PointMemory m = point_memory(pt, c);
  const std::size_t need = m.need(), budget = *c.memory_budget_bytes;
  if (need <= budget) return "";
  return std::string(need == SIZE_MAX ? "needs at least " : "needs ") + std::to_string(need) + " bytes (" +
         format_bytes(static_cast<double>(need)) + ": inputs " +
         format_bytes(static_cast<double>(m.call.inputs)) + ", output and workspace " +
         format_bytes(static_cast<double>(m.call.beyond_inputs())) + ", accuracy reference " +
         format_bytes(static_cast<double>(m.reference)) +
         (m.grad_reference ? ", gradient reference " + format_bytes(static_cast<double>(m.grad_reference))
                           : std::string()) +
         (m.fp32_inputs ? ", fp32 inputs the " + std::string(dtype_name(pt.problem.dtype)) +
                              " ones are rounded from " + format_bytes(static_cast<double>(m.fp32_inputs))
                        : std::string()) +
         (m.extra_inputs ? ", per-token inputs (g, beta, sinks, state, index inputs) " +
                               format_bytes(static_cast<double>(m.extra_inputs))
                         : std::string()) +
         (m.prefill ? ", the decode state's prefill " + format_bytes(static_cast<double>(m.prefill))
                    : std::string()) +
         ") > memory_budget " + format_bytes(static_cast<double>(budget));
}

double point_flops(const SweepPoint& pt) {
  const Attention& v = Registry::instance().get(pt.problem.variant);
  switch (pt.pass) {
    case Pass::forward:
      return v.flops(pt.problem);
    case Pass::backward:
      return v.backward_flops(pt.problem);
    case Pass::forward_backward:
      return v.flops(pt.problem) + v.backward_flops(pt.problem);
  }
  return 0;
}

std::optional<double> point_bytes(const SweepPoint& pt) {
  try {
    const Attention& v = Registry::instance().get(pt.problem.variant);
    if (pt.pass == Pass::forward) return v.bytes_moved(pt.problem);
    // The backward's compulsory traffic: Q, K, V, the masks, O, dO and the saved state read once, dQ, dK, dV
    // written once (estimate_backward_memory's inputs and output); a training step adds the forward's.
    const MemoryEstimate m = v.estimate_backward_memory(pt.problem, pt.threads);
    const double backward = static_cast<double>(m.inputs) + static_cast<double>(m.output);
    return pt.pass == Pass::backward ? backward : backward + v.bytes_moved(pt.problem);
  } catch (const std::exception&) {
    return std::nullopt;  // a variant whose count refuses a problem it does not support
  }
}

}  // namespace attn
