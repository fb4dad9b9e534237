// Registry and the shared parts of the Attention interface.
#include "common/interface/attention.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "common/interface/half.hpp"
#include "common/interface/plugin_loader.hpp"
#include "common/interface/util.hpp"
#include "common/support/error.hpp"

namespace attn {

Json capabilities_json(const Capabilities& c) {
  return {{"exact", c.exact},
          {"causal", c.causal},
          {"causal_lower_right", c.causal_lower_right},
          {"gqa", c.gqa},
          {"boolean_mask", c.boolean_mask},
          {"key_padding", c.key_padding},
          {"cross", c.cross},
          {"dropout", c.dropout},
          {"bf16", c.bf16},
          {"fp16", c.fp16},
          {"alibi", c.alibi},
          {"permutation_equivariant", c.permutation_equivariant},
          {"baseline", c.baseline},
          {"backward", c.backward},
          {"block_partials", c.block_partials},
          {"sinks", c.sinks},
          {"softcap", c.softcap},
          {"gate", gate_name(c.gate)},
          {"beta", c.beta},
          {"state", c.state},
          {"decode", c.decode},
          {"own_definition", c.own_definition},
          {"value_dim", c.value_dim},
          {"strided_kv", c.strided_kv},
          {"indexer", c.indexer}};
}

Json variants_json() {
  Json all = Json::array();
  for (const Attention* v : Registry::instance().all()) {
    Json params = Json::array();
    for (const auto& s : v->param_specs()) params.push_back(param_spec_json(s));
    all.push_back({{"name", v->name()},
                   {"description", v->description()},
                   {"capabilities", capabilities_json(v->capabilities())},
                   {"saved_state", v->saved_description()},
                   {"params", params},
                   {"plugin", plugin_source(v->name())}});  // "" when built in
  }
  return all;
}

std::size_t MemoryEstimate::beyond_inputs() const {
  return sat_add(output, workspace);
}
std::size_t MemoryEstimate::total() const {
  return sat_add(inputs, beyond_inputs());
}

namespace {
// The inputs and output of `p` (no workspace). Problem::validate bounds Q, K, V and O at 2^58 elements each,
// so their bytes fit in 64 bits; the boolean mask (seq_q × seq_kv, up to 2^80) and the sum saturate.
MemoryEstimate io_bytes(const Problem& p) {
  MemoryEstimate m;
  m.inputs = sat_add(to_size(p.qkv_elements()) * dtype_bytes(p.dtype),
                     p.mask.boolean ? sat_mul(to_size(p.seq_q), to_size(p.seq_kv)) : 0,
                     p.mask.key_padding ? to_size(p.batch * p.seq_kv) : 0);
  m.output = static_cast<std::size_t>(p.out_elements()) * sizeof(float);
  return m;
}
}  // namespace

MemoryEstimate Attention::estimate_memory(const Problem& p, int threads) const {
  MemoryEstimate m = io_bytes(p);
  m.workspace = workspace_bytes(p, threads);
  return m;
}

std::vector<std::string> Attention::not_supported_reasons(const Problem& p) const {
  const Capabilities c = capabilities();
  std::vector<std::string> r;
  if (p.mask.causal && !c.causal) r.push_back(name() + " does not support the causal mask");
  if (p.mask.causal_lower_right && !c.causal_lower_right)
    r.push_back(name() + " does not support the causal_lower_right mask");
  if (p.is_gqa() && !c.gqa)
    r.push_back(name() + " does not support grouped-query attention (kv_heads " +
                std::to_string(p.num_kv_heads()) + " != heads " + std::to_string(p.heads) + ")");
  if (p.mask.boolean && !c.boolean_mask) r.push_back(name() + " does not support boolean masks");
  if (p.mask.key_padding && !c.key_padding) r.push_back(name() + " does not support key padding");
  if (p.seq_q != p.seq_kv && !c.cross && !(c.decode && is_decode_shape(p)))
    r.push_back(name() + " does not support cross-attention (seq_q " + std::to_string(p.seq_q) +
                " != seq_kv " + std::to_string(p.seq_kv) + ")");
  if (p.dropout > 0 && !c.dropout) r.push_back(name() + " does not support dropout");
  if (p.distinct_value_dim() && !c.value_dim)
    r.push_back(name() + " needs V as wide as Q and K (got v_head_dim " + std::to_string(p.value_dim()) +
                " != head_dim " + std::to_string(p.head_dim) + ")");
  if ((p.dtype == DType::bf16 && !c.bf16) || (p.dtype == DType::fp16 && !c.fp16)) {
    std::string takes = "fp32";
    if (c.bf16) takes += ", bf16";
    if (c.fp16) takes += ", fp16";
    r.push_back(name() + " does not take dtype " + dtype_name(p.dtype) + " (it takes " + takes + ")");
  }
  if (p.bias == Bias::alibi && !c.alibi) r.push_back(name() + " does not support the ALiBi bias");
  if (p.softcap && !c.softcap) r.push_back(name() + " does not support logit soft-capping");
  if (p.sinks && !c.sinks) r.push_back(name() + " does not take sink logits");
  if (p.initial_state && !c.state) r.push_back(name() + " does not take an initial state");
  if (c.gate != Gate::none || c.beta || c.state) {
    // A recurrence (it reads a gate or beta, or carries a state) runs causally over one sequence.
    if (!p.mask.any_causal())
      r.push_back(name() + " is a causal recurrence: it needs the causal mask (got mask " + p.mask.str() +
                  ")");
    if (p.seq_q != p.seq_kv && !(c.decode && is_decode_shape(p)))
      r.push_back(name() +
                  " is a recurrence over one sequence: it needs seq_q == seq_kv, or seq_q < seq_kv " +
                  "under causal_lower_right alone (decode) (got " + std::to_string(p.seq_q) + " and " +
                  std::to_string(p.seq_kv) + ", mask " + p.mask.str() + ")");
    else if (p.seq_q != p.seq_kv && !p.initial_state)
      r.push_back(name() + " decodes from a state: seq_q " + std::to_string(p.seq_q) + " < seq_kv " +
                  std::to_string(p.seq_kv) + " needs an initial state (the state after the first seq_kv - " +
                  "seq_q tokens, e.g. a chunk-form call on them with final_state); it does not rerun the " +
                  "context");
  }
  for (auto& extra : extra_not_supported_reasons(p)) r.push_back(std::move(extra));
  return r;
}

std::string Attention::unsupported_reasons_text(const Problem& p) const {
  std::string why;
  for (const auto& r : not_supported_reasons(p)) why += (why.empty() ? "" : "; ") + r;
  return why;
}

const char* gate_name(Gate g) {
  return g == Gate::scalar ? "scalar" : g == Gate::vector ? "vector" : "none";
}

void Attention::check_extra_inputs(const Problem& p, const AttentionInputs& in) const {
  const Capabilities c = capabilities();
  std::string missing;
  auto need = [&](bool wanted, const void* ptr, const std::string& what) {
    if (wanted && !ptr) missing += (missing.empty() ? "" : ", ") + what;
  };
  need(c.gate == Gate::scalar, in.g, "g [batch, heads, seq] (the decay gate)");
  need(c.gate == Gate::vector, in.g, "g [batch, heads, seq, head_dim] (the decay gate)");
  need(c.beta, in.beta, "beta [batch, heads, seq]");
  need(p.sinks, in.sink_logits, "sink_logits [heads]");
  need(p.initial_state, in.initial_state, "initial_state [batch, heads, head_dim, v_head_dim]");
  need(c.indexer, in.index_q, "index_q [batch, seq_q, index_heads, index_dim]");
  need(c.indexer, in.index_k, "index_k [batch, seq_kv, index_dim]");
  need(c.indexer, in.index_w, "index_w [batch, seq_q, index_heads]");
  if (!missing.empty()) throw UsageError(name() + ": missing " + missing);
}

namespace {
// A reserved cache or strided V (AttentionInputs::kv_capacity, v_row_stride): legal values, and a variant
// that reads them (Capabilities::strided_kv), fp32, forward only.
void check_kv_layout(const Attention& v, const Problem& p, const AttentionInputs& in, bool backward) {
  if (in.kv_capacity < 0 || in.v_row_stride < 0)
    throw UsageError(
        "attention inputs: kv_capacity and v_row_stride must be >= 0 (0: the contiguous default), got " +
        std::to_string(in.kv_capacity) + " and " + std::to_string(in.v_row_stride));
  if (in.kv_capacity != 0 && in.kv_capacity < p.seq_kv)
    throw UsageError("attention inputs: kv_capacity " + std::to_string(in.kv_capacity) + " is below seq_kv " +
                     std::to_string(p.seq_kv) + "; it must be 0 (contiguous) or at least seq_kv");
  if (in.v_row_stride != 0 && in.v_row_stride < p.value_dim())
    throw UsageError("attention inputs: v_row_stride " + std::to_string(in.v_row_stride) + " is below d_v " +
                     std::to_string(p.value_dim()) + "; it must be 0 (contiguous) or at least d_v");
  if (!has_strided_kv(p, in)) return;
  const std::string layout = "K/V read in place from a reserved cache or V with a row stride (kv_capacity " +
                             std::to_string(kv_block_rows(p, in)) + ", v_row_stride " +
                             std::to_string(v_row_stride(p, in)) + ")";
  if (!v.capabilities().strided_kv)
    throw NotSupported(p.repro() + ": " + v.name() + " reads K and V only contiguous, not " + layout +
                       " (capability strided_kv)");
  if (p.dtype != DType::fp32)
    throw NotSupported(p.repro() + ": " + layout + " is fp32 only, got dtype " + dtype_name(p.dtype));
  if (backward) throw NotSupported(p.repro() + ": the backward does not take " + layout);
}
}  // namespace

void Attention::run(const Problem& p, const AttentionInputs& in) const {
  p.validate();
  if (const std::string why = unsupported_reasons_text(p); !why.empty())
    throw NotSupported(p.repro() + ": " + why);
  check_inputs(p, in);
  check_extra_inputs(p, in);
  check_kv_layout(*this, p, in, /*backward=*/false);
  forward(p, in);
}

std::size_t kv_cache_bytes(const Problem& p) {
  return sat_mul(sat_add(to_size(p.kv_elements()), to_size(p.v_elements())), dtype_bytes(p.dtype));
}

bool is_decode_shape(const Problem& p) {
  return p.seq_q < p.seq_kv && p.mask.causal_lower_right && !p.mask.causal;
}

std::size_t Attention::decode_state_bytes(const Problem& p) const {
  return kv_cache_bytes(p);
}

double compulsory_bytes(const Problem& p) {
  const MemoryEstimate m = io_bytes(p);
  return static_cast<double>(m.inputs) + static_cast<double>(m.output);
}

double Attention::bytes_moved(const Problem& p) const {
  return compulsory_bytes(p);
}

// ---- Block partials ----

namespace {
[[noreturn]] void no_block_partials(const Attention& v) {
  throw std::logic_error(v.name() + " does not implement block partials (capabilities().block_partials)");
}
}  // namespace

std::vector<std::string> Attention::block_not_supported_reasons(const Problem&) const {
  if (!capabilities().block_partials) return {name() + " does not compute block partials"};
  return {};
}
void Attention::init_block_state(const Problem&, const BlockState&) const {
  no_block_partials(*this);
}
void Attention::accumulate_block(const Problem&, const AttentionInputs&, const BlockState&) const {
  no_block_partials(*this);
}
void Attention::finish_block_state(const Problem&, const BlockState&, float*) const {
  no_block_partials(*this);
}
std::size_t Attention::block_workspace_bytes(const Problem&, int) const {
  no_block_partials(*this);
}

// ---- Training ----

std::vector<std::string> Attention::backward_not_supported_reasons(const Problem& p) const {
  std::vector<std::string> r = not_supported_reasons(p);
  if (!capabilities().backward) {
    r.push_back(name() + " has no backward pass");
    return r;
  }
  for (auto& extra : extra_backward_not_supported_reasons(p)) r.push_back(std::move(extra));
  return r;
}

std::string Attention::backward_unsupported_reasons_text(const Problem& p) const {
  std::string why;
  for (const auto& r : backward_not_supported_reasons(p)) why += (why.empty() ? "" : "; ") + r;
  return why;
}

void Attention::run_saving(const Problem& p, const AttentionInputs& in, float* saved) const {
  p.validate();
  if (const std::string why = backward_unsupported_reasons_text(p); !why.empty())
    throw NotSupported(p.repro() + ": " + why);
  check_inputs(p, in);
  check_extra_inputs(p, in);
  check_kv_layout(*this, p, in, /*backward=*/false);
  if (saved_floats(p) > 0 && !saved)
    throw UsageError(name() + ": the training forward needs a buffer for its saved state (" +
                     std::to_string(saved_floats(p)) + " floats: " + saved_description() + ")");
  forward_saving(p, in, saved);
}

void Attention::forward_saving(const Problem& p, const AttentionInputs& in, float*) const {
  forward(p, in);
}

void Attention::backward(const Problem& p, const AttentionInputs&, const GradientArgs&) const {
  throw std::logic_error(name() + " claims capabilities().backward but does not override backward() (" +
                         p.repro() + ")");
}

void Attention::run_backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const {
  p.validate();
  if (const std::string why = backward_unsupported_reasons_text(p); !why.empty())
    throw NotSupported(p.repro() + ": " + why);
  check_inputs(p, in, /*needs_out=*/false);
  check_extra_inputs(p, in);
  check_kv_layout(*this, p, in, /*backward=*/true);
  std::string missing;
  auto need = [&](const void* ptr, const char* what) {
    if (!ptr) missing += (missing.empty() ? "" : ", ") + std::string(what);
  };
  need(g.d_out, "dO (the gradient of the output)");
  need(g.out, "O (the forward's output)");
  if (saved_floats(p) > 0)
    need(g.saved, ("the forward's saved state (" + std::to_string(saved_floats(p)) +
                   " floats: " + saved_description() + ")")
                      .c_str());
  need(g.dq, "dq");
  need(g.dk, "dk");
  need(g.dv, "dv");
  if (!missing.empty()) throw UsageError(name() + " backward: missing " + missing);
  if (p.dtype == DType::fp32) {
    backward(p, in, g);
    return;
  }
  // bf16 / fp16 storage: the gradients are those of the stored (rounded) values, computed in fp32.
  const WideInputs wide(p, in);
  backward(WideInputs::as_fp32(p), wide.get(), g);
}

MemoryEstimate Attention::estimate_backward_memory(const Problem& p, int threads) const {
  MemoryEstimate m = io_bytes(p);
  // Besides Q, K, V and the masks: O and dO (fp32, the output's shape) and the saved state.
  const std::size_t o_bytes = m.output;
  m.inputs = sat_add(m.inputs, sat_mul(2, o_bytes), sat_mul(saved_floats(p), sizeof(float)));
  // dQ, dK, dV in fp32 (Q's, K's and V's shapes).
  const std::size_t qkv = to_size(p.qkv_elements());
  m.output = sat_mul(qkv, sizeof(float));
  // bf16 / fp16: run_backward's fp32 copies of Q, K, V.
  const std::size_t widened = p.dtype == DType::fp32 ? 0 : sat_mul(qkv, sizeof(float));
  m.workspace = sat_add(backward_workspace_bytes(p, threads), widened);
  return m;
}

Registry& Registry::instance() {
  static Registry registry;
  return registry;
}

bool Registry::add(std::unique_ptr<Attention> variant) {
  const std::string n = variant->name();
  if (find(n)) throw std::logic_error("attention variant '" + n + "' registered twice");
  // Defaults must validate: a broken variant fails at start-up, not in the middle of a sweep.
  resolve_params(variant->param_specs(), Json::object(), "variant '" + n + "' defaults");
  variants_.push_back(std::move(variant));
  std::sort(variants_.begin(), variants_.end(),
            [](const auto& a, const auto& b) { return a->name() < b->name(); });
  return true;
}

const Attention* Registry::find(std::string_view name) const {
  for (const auto& v : variants_)
    if (v->name() == name) return v.get();
  return nullptr;
}

std::string Registry::unknown_variant_message(std::string_view name) const {
  std::string msg = "unknown variant '" + std::string(name) + "'";
  if (auto m = did_you_mean(std::string(name), names())) msg += " (did you mean '" + *m + "'?)";
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  return msg + "; registered: " + known;
}

const Attention& Registry::get(std::string_view name) const {
  if (const Attention* v = find(name)) return *v;
  throw UsageError(unknown_variant_message(name));
}

const Attention& Registry::baseline() const {
  const Attention* found = nullptr;
  for (const auto& v : variants_) {
    if (!v->capabilities().baseline) continue;
    if (found)
      throw std::logic_error("variants '" + found->name() + "' and '" + v->name() +
                             "' both set capabilities().baseline; exactly one may");
    found = v.get();
  }
  if (!found) throw std::logic_error("no registered variant sets capabilities().baseline");
  return *found;
}

std::vector<const Attention*> Registry::all() const {
  std::vector<const Attention*> out;
  for (const auto& v : variants_) out.push_back(v.get());
  return out;
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> out;
  for (const auto& v : variants_) out.push_back(v->name());
  return out;
}

namespace {
// Resolves `given` against the variant's specs and records their order (Problem::param_order).
void set_params(Problem& p, const Attention& v, const Json& given, const std::string& where) {
  const auto specs = v.param_specs();
  p.params = resolve_params(specs, given, where);
  p.param_order.clear();
  for (const auto& s : specs) p.param_order.push_back(s.name);
}
}  // namespace

Problem make_problem(const std::string& variant, const Json& given) {
  const Attention& v = Registry::instance().get(variant);
  Problem p;
  p.variant = variant;
  set_params(p, v, given, "variant '" + variant + "'");
  return p;
}

Problem parse_problem(const std::string& repro) {
  const std::string where = "repro string '" + repro + "'";
  Problem p;
  std::size_t colon = repro.rfind(':');
  if (colon == std::string::npos) throw UsageError(where + ": missing ':' between variant and shape");
  std::string head = repro.substr(0, colon), tail = repro.substr(colon + 1);
  std::size_t brace = head.find('{');
  p.variant = head.substr(0, brace);
  const Attention* variant = Registry::instance().find(p.variant);
  if (!variant) throw UsageError(where + ": " + Registry::instance().unknown_variant_message(p.variant));
  Json given = Json::object();
  if (brace != std::string::npos) {
    if (head.back() != '}') throw UsageError(where + ": unbalanced '{' in the parameter list");
    std::stringstream ss(head.substr(brace + 1, head.size() - brace - 2));
    std::string kv;
    const auto specs = variant->param_specs();
    while (std::getline(ss, kv, ',')) {
      std::size_t eq = kv.find('=');
      if (eq == std::string::npos) throw UsageError(where + ": parameter '" + kv + "' is not k=v");
      std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      const ParamSpec* spec = nullptr;
      for (const auto& s : specs)
        if (s.name == k) spec = &s;
      if (!spec) {
        given[k] = v;  // resolve_params reports it with a did-you-mean
        continue;
      }
      given[k] = v == "[]" ? Json::array() : parse_param_value(*spec, v, where + ": parameter '" + k + "'");
    }
  }
  set_params(p, *variant, given, where);
  parse_problem_shape(tail, where, p);
  return p;
}

void check_inputs(const Problem& p, const AttentionInputs& in, bool needs_out) {
  if (p.dtype == DType::fp32) {
    if (!in.q || !in.k || !in.v || (needs_out && !in.out))
      throw UsageError(needs_out ? "attention inputs: q, k, v and out are required"
                                 : "attention inputs: q, k and v are required");
  } else if (!in.q16 || !in.k16 || !in.v16 || (needs_out && !in.out)) {
    throw UsageError(std::string("attention inputs: dtype ") + dtype_name(p.dtype) + " needs q16, k16, v16" +
                     (needs_out ? " and out" : ""));
  }
  if (p.mask.boolean && !in.mask)
    throw UsageError("attention inputs: the problem has a boolean mask but no mask tensor was given");
  if (p.mask.key_padding && !in.key_padding)
    throw UsageError("attention inputs: the problem has key padding but no padding tensor was given");
}

}  // namespace attn
