// Registry and the shared parts of the Attention interface.
#include "common/attention.hpp"

#include <algorithm>
#include <stdexcept>

#include "common/error.hpp"
#include "common/reference.hpp"
#include "common/util.hpp"

namespace attn {

Json capabilities_json(const Capabilities& c) {
  return {{"exact", c.exact},
          {"causal", c.causal},
          {"boolean_mask", c.boolean_mask},
          {"key_padding", c.key_padding},
          {"cross", c.cross},
          {"dropout", c.dropout},
          {"permutation_equivariant", c.permutation_equivariant},
          {"baseline", c.baseline}};
}

std::size_t MemoryEstimate::beyond_inputs() const {
  return sat_add(output, workspace);
}
std::size_t MemoryEstimate::total() const {
  return sat_add(inputs, beyond_inputs());
}

MemoryEstimate Attention::estimate_memory(const Problem& p, int threads) const {
  // Problem::validate bounds every tensor at 2^58 elements, so these products fit in 64 bits.
  MemoryEstimate m;
  m.inputs = static_cast<std::size_t>(p.q_elements() + 2 * p.kv_elements()) * sizeof(float) +
             (p.mask.boolean ? static_cast<std::size_t>(p.seq_q * p.seq_kv) : 0) +
             (p.mask.key_padding ? static_cast<std::size_t>(p.batch * p.seq_kv) : 0);
  m.output = static_cast<std::size_t>(p.q_elements()) * sizeof(float);
  m.workspace = workspace_bytes(p, threads);
  return m;
}

std::vector<std::string> Attention::not_supported_reasons(const Problem& p) const {
  const Capabilities c = capabilities();
  std::vector<std::string> r;
  if (p.mask.causal && !c.causal) r.push_back(name() + " does not support the causal mask");
  if (p.mask.boolean && !c.boolean_mask) r.push_back(name() + " does not support boolean masks");
  if (p.mask.key_padding && !c.key_padding) r.push_back(name() + " does not support key padding");
  if (p.seq_q != p.seq_kv && !c.cross)
    r.push_back(name() + " does not support cross-attention (seq_q " + std::to_string(p.seq_q) +
                " != seq_kv " + std::to_string(p.seq_kv) + ")");
  if (p.dropout > 0 && !c.dropout) r.push_back(name() + " does not support dropout");
  for (auto& extra : extra_not_supported_reasons(p)) r.push_back(std::move(extra));
  return r;
}

std::string Attention::unsupported_reasons_text(const Problem& p) const {
  std::string why;
  for (const auto& r : not_supported_reasons(p)) why += (why.empty() ? "" : "; ") + r;
  return why;
}

void Attention::run(const Problem& p, const AttentionInputs& in) const {
  p.validate();
  if (const std::string why = unsupported_reasons_text(p); !why.empty())
    throw NotSupported(p.repro() + ": " + why);
  check_inputs(p, in);
  forward(p, in);
}

void Attention::reference_forward(const Problem& p, const AttentionInputs& in, double* out) const {
  reference_attention(p, in, out);
}

double Attention::abs_tolerance(const Problem& p, const AttentionInputs& in) const {
  return exact_abs_tolerance(p, in);
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

Problem make_problem(const std::string& variant, const Json& given) {
  const Attention& v = Registry::instance().get(variant);
  Problem p;
  p.variant = variant;
  p.params = resolve_params(v.param_specs(), given, "variant '" + variant + "'");
  return p;
}

void check_inputs(const Problem& p, const AttentionInputs& in, bool needs_out) {
  if (!in.q || !in.k || !in.v || (needs_out && !in.out))
    throw UsageError(needs_out ? "attention inputs: q, k, v and out are required"
                               : "attention inputs: q, k and v are required");
  if (p.mask.boolean && !in.mask)
    throw UsageError("attention inputs: the problem has a boolean mask but no mask tensor was given");
  if (p.mask.key_padding && !in.key_padding)
    throw UsageError("attention inputs: the problem has key padding but no padding tensor was given");
}

}  // namespace attn
