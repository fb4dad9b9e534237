// The checks of one attention call on caller-given tensors (bench/lib/eval.hpp), moved out of `attnbench
// eval` so that the Python module applies the same ones.
#include "bench/lib/eval.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/tensor.hpp"

namespace attn {
namespace {

// The reasons `variant` gives for refusing the storage dtype and bias asked for (empty = it takes them):
// those a default-shaped problem gets with them and not without, so the text is the variant's own (the
// sweep's skip reason).
std::string storage_refusal(const Attention& variant, const Json& params, DType dtype, Bias bias) {
  Problem plain = make_problem(variant.name(), params);
  Problem asked = plain;
  asked.dtype = dtype;
  asked.bias = bias;
  const std::vector<std::string> before = variant.not_supported_reasons(plain);
  std::string text;
  for (const std::string& r : variant.not_supported_reasons(asked))
    if (std::find(before.begin(), before.end(), r) == before.end()) text += (text.empty() ? "" : "; ") + r;
  return text;
}

// Registered variants whose capabilities accept `dtype` / `bias` (for the refusal message).
std::string variants_taking(DType dtype, Bias bias) {
  std::string s;
  for (const Attention* a : Registry::instance().all()) {
    const Capabilities c = a->capabilities();
    const bool ok =
        (dtype == DType::fp32 || (dtype == DType::bf16 ? c.bf16 : c.fp16)) && (bias == Bias::none || c.alibi);
    if (ok) s += (s.empty() ? "" : ", ") + a->name();
  }
  return s.empty() ? "none" : s;
}

// "1, 2, 4 or 8": the K/V head counts allowed with `heads` query heads (the divisors of heads), the first
// 16 of them when there are more.
std::string kv_heads_allowed(int64_t heads) {
  std::vector<int64_t> small, large;
  for (int64_t d = 1; d <= heads / d; ++d)
    if (heads % d == 0) {
      small.push_back(d);
      if (d != heads / d) large.insert(large.begin(), heads / d);
    }
  small.insert(small.end(), large.begin(), large.end());
  std::string s;
  constexpr std::size_t kShown = 16;
  for (std::size_t i = 0; i < small.size() && i < kShown; ++i)
    s += (i == 0 ? "" : i + 1 == small.size() ? " or " : ", ") + std::to_string(small[i]);
  if (small.size() > kShown)
    s += ", ... (" + std::to_string(small.size()) + " divisors of " + std::to_string(heads) + ")";
  return s;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return FloatArray::shape_to_string(shape);
}

int64_t count_nonfinite_stored(DType t, const uint16_t* x, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(widen(t, x[i]));
  return bad;
}

}  // namespace

void check_storage(const Attention& variant, const Json& params, DType dtype, Bias bias,
                   const std::string& dtype_text, const std::string& alibi_text) {
  const bool alibi = bias == Bias::alibi;
  if (const std::string why = storage_refusal(variant, params, dtype, bias); !why.empty())
    throw UsageError(std::string(dtype != DType::fp32 ? dtype_text : "") +
                     (dtype != DType::fp32 && alibi ? " with " : "") + (alibi ? alibi_text : "") +
                     ": variant '" + variant.name() + "' cannot run it: " + why +
                     " (variants that can: " + variants_taking(dtype, bias) + ")");
}

void require_rank4(const std::string& what, const std::vector<int64_t>& shape, const std::string& layout) {
  if (shape.size() != 4)
    throw UsageError(what + ": rank " + std::to_string(shape.size()) + " " + shape_text(shape) +
                     "; expected rank 4 " + layout);
  for (int64_t extent : shape)
    if (extent < 1)
      throw UsageError(what + ": shape " + shape_text(shape) + " is empty; every extent of " + layout +
                       " must be >= 1");
}

void check_kv_shapes(const std::string& q_what, const std::vector<int64_t>& q, const std::string& k_what,
                     const std::vector<int64_t>& k, const std::string& v_what,
                     const std::vector<int64_t>& v) {
  const int64_t batch = q[0], heads = q[1], head_dim = q[3];
  const std::string allowed = "K must be [batch, kv_heads, seq_kv, head_dim] with Q's batch " +
                              std::to_string(batch) + " and head_dim " + std::to_string(head_dim) +
                              ", and kv_heads dividing Q's heads " + std::to_string(heads) + " (" +
                              kv_heads_allowed(heads) + "); V [batch, kv_heads, seq_kv, d_v]";
  auto fail = [&](const std::string& why) {
    throw UsageError(k_what + ": shape " + shape_text(k) + " does not fit " + q_what + " shape " +
                     shape_text(q) + ": " + why + "; " + allowed);
  };
  if (k[0] != batch) fail("batch " + std::to_string(k[0]) + " != Q's batch " + std::to_string(batch));
  if (k[3] != head_dim)
    fail("head_dim " + std::to_string(k[3]) + " != Q's head_dim " + std::to_string(head_dim));
  if (heads % k[1] != 0)
    fail("kv_heads " + std::to_string(k[1]) + " does not divide Q's heads " + std::to_string(heads));
  if (v[0] != k[0] || v[1] != k[1] || v[2] != k[2])
    throw UsageError(v_what + ": shape " + shape_text(v) + " does not fit " + k_what + " shape " +
                     shape_text(k) + " (V must be [batch, kv_heads, seq_kv, d_v] with K's first three " +
                     "extents; its last, d_v, may differ from head_dim for a variant that takes it)");
}

void set_shape(Problem& p, const std::vector<int64_t>& q, const std::vector<int64_t>& k,
               const std::vector<int64_t>& v) {
  p.batch = q[0], p.heads = q[1], p.seq_q = q[2], p.head_dim = q[3];
  p.kv_heads = k[1];  // kv_heads == heads: multi-head attention (no Hkv in the id)
  p.seq_kv = k[2];
  p.v_head_dim = v[3] == q[3] ? 0 : v[3];  // 0: d_v = head_dim (no Dv in the id)
}

void require_shape(const std::string& what, const std::vector<int64_t>& got, const std::vector<int64_t>& want,
                   const std::string& meaning) {
  if (got != want)
    throw UsageError(what + ": shape " + shape_text(got) + " does not match " + shape_text(want) + " " +
                     meaning);
}

std::vector<float> checked_head_values(const std::string& what, const std::string& q_option,
                                       const std::string& noun, const std::vector<int64_t>& shape,
                                       const double* values, const Problem& p) {
  require_shape(what, shape, {p.heads},
                "[heads] (one " + noun + " per query head; heads = " + std::to_string(p.heads) + " from " +
                    q_option + ")");
  std::vector<float> out;
  for (int64_t h = 0; h < p.heads; ++h) {
    const double s = values[h];
    if (!std::isfinite(s) || std::fabs(s) > std::numeric_limits<float>::max())
      throw UsageError(what + ": " + noun + " " + std::to_string(h) + " = " + std::to_string(s) +
                       " is not a finite float32");
    out.push_back(static_cast<float>(s));
  }
  return out;
}

std::vector<float> checked_alibi_slopes(const std::string& what, const std::string& q_option,
                                        const std::vector<int64_t>& shape, const double* values,
                                        const Problem& p) {
  return checked_head_values(what, q_option, "slope", shape, values, p);
}

bool is_recurrence(const Capabilities& c) {
  return c.own_definition;
}

namespace {

// Registered variants `pred` holds for (for the refusal messages), or "none".
template <class Pred>
std::string variants_where(Pred pred) {
  std::string s;
  for (const Attention* a : Registry::instance().all())
    if (pred(a->capabilities())) s += (s.empty() ? "" : ", ") + a->name();
  return s.empty() ? "none" : s;
}

std::string gate_meaning(Gate gate) {
  return gate == Gate::vector ? "its per-channel gate g, float32/64 [batch, heads, seq, head_dim]"
                              : "its gate g, float32/64 [batch, heads, seq]";
}

// The index of flat element `e` of `shape` ("[0, 2, 5]"), last dimension fastest.
std::string element_index(const std::vector<int64_t>& shape, std::size_t e) {
  std::vector<int64_t> at(shape.size());
  for (std::size_t d = at.size(), rest = e; d-- > 0; rest /= static_cast<std::size_t>(shape[d]))
    at[d] = static_cast<int64_t>(rest % static_cast<std::size_t>(shape[d]));
  return shape_text(at);
}

// Every value of a checked input as float32: finite (as read and as a float32), and `allowed` on the float32
// value; otherwise a UsageError naming `what`, the first offending element's index and value, and `rule`.
template <class Allowed>
std::vector<float> checked_values(const std::string& what, const std::vector<int64_t>& shape,
                                  const double* values, Allowed allowed, const std::string& rule) {
  const std::size_t n = NdArray<float>::count(shape);
  std::vector<float> out(n);
  for (std::size_t e = 0; e < n; ++e) {
    const double x = values[e];
    const auto at = [&] {
      return what + ": element " + element_index(shape, e) + " of shape " + shape_text(shape);
    };
    if (std::isnan(x)) throw UsageError(at() + " is NaN; " + rule);
    if (!std::isfinite(x) || std::fabs(x) > std::numeric_limits<float>::max())
      throw UsageError(at() + " = " + shortest_double_text(x) + " is not a finite float32; " + rule);
    const float f = static_cast<float>(x);
    if (!allowed(x) || !allowed(static_cast<double>(f)))
      throw UsageError(at() + " = " + shortest_double_text(x) +
                       (allowed(x) ? " (" + shortest_double_text(f) + " as a float32)" : std::string()) +
                       " is not allowed; " + rule);
    out[e] = f;
  }
  return out;
}

// The sizes a per-token or per-head input takes from Q (and K: g and beta have one value per key token, so a
// decode problem's, seq_q < seq_kv, cover its whole context as the sweep's do).
std::string sizes_from(const Problem& p, const std::string& q_what, bool head_dim) {
  const std::string seq =
      ", seq " + std::to_string(p.seq_kv) + (p.seq_q == p.seq_kv ? "" : " (seq_kv, one per key token)");
  return "batch " + std::to_string(p.batch) + ", heads " + std::to_string(p.heads) +
         (head_dim ? ", head_dim " + std::to_string(p.head_dim) : seq) + " from " + q_what;
}

}  // namespace

void check_extra_inputs_given(const Attention& variant, const ExtraInputNames& given) {
  const Capabilities c = variant.capabilities();
  const std::string v = "variant '" + variant.name() + "'";
  if (!given.g.empty() && c.gate == Gate::none)
    throw UsageError(given.g + ": " + v + " reads no gate g (variants that do: " +
                     variants_where([](const Capabilities& x) { return x.gate != Gate::none; }) + ")");
  if (!given.beta.empty() && !c.beta)
    throw UsageError(given.beta + ": " + v + " reads no beta (variants that do: " +
                     variants_where([](const Capabilities& x) { return x.beta; }) + ")");
  for (const std::string* s : {&given.initial_state, &given.final_state})
    if (!s->empty() && !c.state)
      throw UsageError(*s + ": " + v + " keeps no recurrent state (variants that do: " +
                       variants_where([](const Capabilities& x) { return x.state; }) + ")");
  if (c.gate != Gate::none && given.g.empty())
    throw UsageError(v + " needs " + given.g_how + ": " + gate_meaning(c.gate) +
                     ", every value finite and <= 0 (a decay exp(g) in (0, 1])");
  if (c.beta && given.beta.empty())
    throw UsageError(v + " needs " + given.beta_how +
                     ": its beta, float32/64 [batch, heads, seq], every value in (0, 1]");
}

std::vector<int64_t> gate_shape(const Problem& p, Gate gate) {
  // One per key token (the kernels index them by position in the context: a decode problem's last seq_q).
  if (gate == Gate::vector) return {p.batch, p.heads, p.seq_kv, p.head_dim};
  return {p.batch, p.heads, p.seq_kv};
}
std::vector<int64_t> beta_shape(const Problem& p) {
  return {p.batch, p.heads, p.seq_kv};
}
std::vector<int64_t> state_shape(const Problem& p) {
  return {p.batch, p.heads, p.head_dim, p.value_dim()};
}

std::vector<float> checked_gate(const std::string& what, const std::string& q_what,
                                const std::vector<int64_t>& shape, const double* values, const Problem& p,
                                Gate gate) {
  const bool vector = gate == Gate::vector;
  require_shape(what, shape, gate_shape(p, gate),
                std::string(vector ? "[batch, heads, seq, head_dim] (the per-channel gate of "
                                   : "[batch, heads, seq] (the scalar gate of ") +
                    p.variant + ": " + sizes_from(p, q_what, false) +
                    (vector ? ", head_dim " + std::to_string(p.head_dim) : "") + ")");
  return checked_values(
      what, shape, values, [](double x) { return x <= 0; },
      "every gate must be finite and <= 0 (a decay exp(g) in (0, 1])");
}

std::vector<float> checked_beta(const std::string& what, const std::string& q_what,
                                const std::vector<int64_t>& shape, const double* values, const Problem& p) {
  require_shape(what, shape, beta_shape(p),
                "[batch, heads, seq] (beta of " + p.variant + ": " + sizes_from(p, q_what, false) + ")");
  return checked_values(
      what, shape, values, [](double x) { return x > 0 && x <= 1; },
      "every beta must be in (0, 1] (as a float32)");
}

std::vector<float> checked_initial_state(const std::string& what, const std::string& q_what,
                                         const std::vector<int64_t>& shape, const double* values,
                                         const Problem& p) {
  require_shape(what, shape, state_shape(p),
                "[batch, heads, head_dim, d_v] (a d_k x d_v state per query head: " +
                    sizes_from(p, q_what, true) + ", d_v " + std::to_string(p.value_dim()) + " from V)");
  return checked_values(
      what, shape, values, [](double) { return true; }, "every value of a state must be a finite float32");
}

Json final_state_comparison(const Problem& p, const float* got, const double* reference_state) {
  const ErrorMetrics m = compare_outputs(got, reference_state, p.batch * p.heads * p.head_dim, p.value_dim());
  return {{"reference", "fp64 final state of " + p.variant + "'s own definition"},
          {"max_abs_err", json_number(m.max_abs_err)},
          {"rel_l2_err", json_number(m.rel_l2_err)},
          {"mean_cosine", json_number(m.mean_cosine)},
          {"nan_count", m.nan_count},
          {"inf_count", m.inf_count}};
}

void check_runnable(const Attention& variant, const Problem& p, int threads, bool with_reference,
                    bool backward) {
  p.validate();
  if (const std::string why =
          backward ? variant.backward_unsupported_reasons_text(p) : variant.unsupported_reasons_text(p);
      !why.empty())
    throw NotSupported(p.repro() + ": " + why);
  // Refuses, before anything is allocated, a call whose output, workspace and fp64 reference cannot fit in
  // this machine's physical memory, naming the bytes it would need.
  MemoryEstimate m = variant.estimate_memory(p, threads);
  // The inputs are already in memory; what the call adds is the output, the workspace and the fp64
  // reference (out_elements fit: Problem::validate bounds them).
  std::size_t reference = with_reference ? static_cast<std::size_t>(p.out_elements()) * sizeof(double) : 0;
  if (backward) {
    // The training forward's O and saved state, dO, the gradients and the backward's workspace (the larger
    // of the two passes'), and with --compare two fp64 gradients (the variant's own and exact attention's).
    const MemoryEstimate b = variant.estimate_backward_memory(p, threads);
    m.output = sat_add(b.output, sat_mul(2, m.output), sat_mul(variant.saved_floats(p), sizeof(float)));
    m.workspace = std::max(m.workspace, b.workspace);
    if (with_reference)
      reference = sat_add(reference, sat_mul(2 * sizeof(double), to_size(p.qkv_elements())));
  }
  const std::size_t need = sat_add(m.beyond_inputs(), reference);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const std::size_t physical = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
  if (need <= physical) return;
  throw NotSupported(
      p.repro() + ": needs " + (need == SIZE_MAX ? "at least " : "") + std::to_string(need) + " bytes (" +
      format_bytes(static_cast<double>(need)) + ": output " + format_bytes(static_cast<double>(m.output)) +
      ", workspace " + format_bytes(static_cast<double>(m.workspace)) +
      (with_reference ? ", fp64 reference " + format_bytes(static_cast<double>(reference)) : "") +
      ") beyond the inputs, more than the " + std::to_string(physical) + " bytes (" +
      format_bytes(static_cast<double>(physical)) + ") of physical memory");
}

NonfiniteCounts count_nonfinite_values(const Problem& p, const AttentionInputs& in) {
  auto bad = [&](const float* x, const uint16_t* x16, int64_t n) {
    return x16 ? count_nonfinite_stored(p.dtype, x16, n) : count_nonfinite(x, static_cast<std::size_t>(n));
  };
  NonfiniteCounts c;
  c.q = bad(in.q, in.q16, p.q_elements());
  c.k = bad(in.k, in.k16, p.kv_elements());
  c.v = bad(in.v, in.v16, p.v_elements());
  c.out = count_nonfinite(in.out, static_cast<std::size_t>(p.out_elements()));
  return c;
}

std::string nonfinite_output_note(const NonfiniteCounts& counts) {
  if (!counts.out) return "";
  return "the output holds " + std::to_string(counts.out) + " NaN/Inf values (the inputs held " +
         std::to_string(counts.inputs()) + ")";
}

void check_backward_input(const std::string& what, const std::vector<int64_t>& shape, const float* values,
                          const std::vector<int64_t>& want, const std::string& meaning, bool allow_infinite) {
  require_shape(what, shape, want, meaning);
  const std::size_t n = NdArray<float>::count(shape);
  for (std::size_t e = 0; e < n; ++e)
    if (allow_infinite ? std::isnan(values[e]) : !std::isfinite(values[e])) {
      std::vector<int64_t> at(shape.size());  // the element's index, last dimension fastest
      for (std::size_t d = at.size(), rest = e; d-- > 0; rest /= static_cast<std::size_t>(shape[d]))
        at[d] = static_cast<int64_t>(rest % static_cast<std::size_t>(shape[d]));
      throw UsageError(what + ": element " + shape_text(at) + " of shape " + shape_text(shape) + " is " +
                       (std::isnan(values[e]) ? "NaN" : "infinite") +
                       "; the backward needs finite values (a NaN would reach every gradient it touches)");
    }
}

std::string d_out_meaning(const std::string& q_what) {
  return "(dL/dO has the output's shape [batch, heads, seq_q, d_v], from " + q_what + " and V)";
}

std::string forward_output_meaning() {
  return "(the training forward's O, [batch, heads, seq_q, d_v])";
}

std::string saved_state_meaning(const Attention& variant) {
  return "(" + variant.saved_description() + ", flattened)";
}

void check_state_needs_out(const std::string& state_what, const std::string& out_text,
                           const std::string& caller) {
  throw UsageError(state_what + " needs " + out_text +
                   ": both come from one earlier training forward (without them " + caller +
                   " runs the training forward itself)");
}

std::size_t check_saved_state_given(const Attention& variant, const Problem& p, bool state_given,
                                    const std::string& out_what, const std::string& state_what,
                                    const std::string& give_state, const std::string& drop_state) {
  const std::size_t n = variant.saved_floats(p);
  if (n > 0 && !state_given)
    throw UsageError(out_what + ": " + variant.name() + "'s backward also needs the forward's saved state (" +
                     std::to_string(n) + " floats: " + variant.saved_description() + "): " + give_state);
  if (n == 0 && state_given)
    throw UsageError(state_what + ": " + variant.name() +
                     " keeps no state for its backward (it recomputes what it needs); " + drop_state);
  return n;
}

void check_save_state_has_backward(const Attention& variant, const std::string& what) {
  if (!variant.capabilities().backward)
    throw UsageError(what + ": " + variant.name() +
                     " has no backward pass, so its forward keeps no state for one");
}

int64_t count_nonfinite_gradients(const Problem& p, const float* dq, const float* dk, const float* dv) {
  return count_nonfinite(dq, static_cast<std::size_t>(p.q_elements())) +
         count_nonfinite(dk, static_cast<std::size_t>(p.kv_elements())) +
         count_nonfinite(dv, static_cast<std::size_t>(p.v_elements()));
}

std::string nonfinite_gradients_note(int64_t count) {
  if (!count) return "";
  return "the gradients hold " + std::to_string(count) + " NaN/Inf values";
}

namespace {

Json gradient_metrics(const float* got, const double* want, int64_t elements, int64_t dim) {
  const ErrorMetrics m = compare_outputs(got, want, elements / dim, dim);
  return {{"max_abs_err", json_number(m.max_abs_err)},
          {"rel_l2_err", json_number(m.rel_l2_err)},
          {"nan_count", m.nan_count},
          {"inf_count", m.inf_count}};
}

}  // namespace

Json gradient_comparison(const Attention& variant, const Problem& p, const AttentionInputs& in,
                         const float* d_out, const float* dq, const float* dk, const float* dv,
                         const ExtraGradients& extra) {
  const int64_t nq = p.q_elements(), nkv = p.kv_elements(), nv = p.v_elements();
  DoubleArray wq({nq}), wk({nkv}), wv({nv});
  AttentionInputs ref_in = in;
  ref_in.out = nullptr;
  auto metrics = [&](const std::string& reference) {
    return Json{{"reference", reference},
                {"dq", gradient_metrics(dq, wq.ptr(), nq, p.head_dim)},
                {"dk", gradient_metrics(dk, wk.ptr(), nkv, p.head_dim)},
                {"dv", gradient_metrics(dv, wv.ptr(), nv, p.value_dim())}};
  };
  Json j;
  variant.reference_backward(p, ref_in, d_out, wq.ptr(), wk.ptr(), wv.ptr());
  j["grad_accuracy"] = metrics("fp64 gradient of " + p.variant + "'s own definition");
  if (extra.d_sink && p.sinks) {
    std::vector<double> ws(static_cast<std::size_t>(p.heads));
    Fp64Gradients fg;
    fg.d_sink_logits = ws.data();
    variant.reference_gradients(p, ref_in, d_out, fg);
    j["grad_accuracy"]["d_sink_logits"] = gradient_metrics(extra.d_sink, ws.data(), p.heads, p.heads);
  }
  // A recurrence's dg, dbeta and d initial state, from one call of the definition's gradients (metrics per
  // row of the input's last dimension).
  const Capabilities caps = variant.capabilities();
  const std::vector<int64_t> g_shape = gate_shape(p, caps.gate), b_shape = beta_shape(p),
                             s_shape = state_shape(p);
  DoubleArray wg(extra.dg ? g_shape : std::vector<int64_t>{0}),
      wb(extra.dbeta ? b_shape : std::vector<int64_t>{0}),
      ws0(extra.d_initial_state ? s_shape : std::vector<int64_t>{0});
  Fp64Gradients fg;
  fg.dg = extra.dg ? wg.ptr() : nullptr;
  fg.dbeta = extra.dbeta ? wb.ptr() : nullptr;
  fg.d_initial_state = extra.d_initial_state && p.initial_state ? ws0.ptr() : nullptr;
  if (fg.dg || fg.dbeta || fg.d_initial_state) {
    variant.reference_gradients(p, ref_in, d_out, fg);
    auto add = [&](const char* key, const float* got, const DoubleArray& want,
                   const std::vector<int64_t>& shape) {
      const auto n = static_cast<int64_t>(want.numel());
      j["grad_accuracy"][key] = gradient_metrics(got, want.ptr(), n, shape.back());
    };
    if (fg.dg) add("dg", extra.dg, wg, g_shape);
    if (fg.dbeta) add("dbeta", extra.dbeta, wb, b_shape);
    if (fg.d_initial_state) add("d_initial_state", extra.d_initial_state, ws0, s_shape);
  }
  reference_attention_backward(p, ref_in, d_out, wq.ptr(), wk.ptr(), wv.ptr());
  j["grad_accuracy_exact"] = metrics("fp64 gradient of exact softmax attention");
  j["nonfinite_gradients"] = count_nonfinite_gradients(p, dq, dk, dv);
  return j;
}

}  // namespace attn
