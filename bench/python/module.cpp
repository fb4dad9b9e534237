// `import attnbench`: the harness from Python (pybind11). The same objects as the CLI, the same checks and
// messages (bench/lib/eval.hpp, the sweep's run_sweep_config); bench/python/README.md documents the API.
#include <dlfcn.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <tbb/global_control.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "bench/lib/eval.hpp"
#include "bench/lib/result_row.hpp"
#include "bench/lib/rows.hpp"
#include "bench/lib/stats.hpp"
#include "bench/lib/store.hpp"
#include "bench/lib/sweep.hpp"
#include "bench/lib/sysinfo.hpp"
#include "bench/python/autograd.hpp"
#include "common/interface/half.hpp"
#include "common/interface/plugin_loader.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/simd.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/runtime.hpp"

namespace py = pybind11;
using namespace py::literals;

namespace attn::python {
namespace {

// The CLI's --threads range (run_cli): 0 means every available core.
constexpr int kMaxThreads = 4096;

// The SIMD target selection, the TBB thread limit and the signal handlers are process-wide: a call that
// changes one (forward with isa or threads, run) holds this exclusively, so no other call's kernel runs
// under its settings; forward and reference without them share it and run concurrently. Taken with the GIL
// released, never the other way round.
std::shared_mutex g_process_state;

using FloatArg = py::array_t<float, py::array::c_style | py::array::forcecast>;
using DoubleArg = py::array_t<double, py::array::c_style | py::array::forcecast>;
using BoolArg = py::array_t<bool, py::array::c_style | py::array::forcecast>;

[[noreturn]] void raise_file_not_found(const std::string& what, const std::string& path) {
  PyErr_SetObject(PyExc_FileNotFoundError, py::make_tuple(ENOENT, what + " does not exist", path).ptr());
  throw py::error_already_set();
}

std::string path_arg(py::handle obj) {
  return py::str(py::module_::import("os").attr("fspath")(obj));
}

py::object to_python(const Json& j) {
  switch (j.type()) {
    case Json::value_t::boolean:
      return py::bool_(j.get<bool>());
    case Json::value_t::number_integer:
      return py::int_(j.get<int64_t>());
    case Json::value_t::number_unsigned:
      return py::int_(j.get<uint64_t>());
    case Json::value_t::number_float:
      return py::float_(j.get<double>());
    case Json::value_t::string:
      return py::str(j.get_ref<const std::string&>());
    case Json::value_t::array: {
      py::list list;
      for (const Json& e : j) list.append(to_python(e));
      return list;
    }
    case Json::value_t::object: {
      py::dict dict;
      for (auto it = j.begin(); it != j.end(); ++it) dict[py::str(it.key())] = to_python(it.value());
      return dict;
    }
    default:
      return py::none();
  }
}

// A JSON value from Python's (None, bool, int, float, str, list, tuple, dict with str keys; numpy scalars as
// their Python values); UsageError naming `where` otherwise.
Json from_python(py::handle h, const std::string& where) {
  if (h.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(h) || py::isinstance(h, py::module_::import("numpy").attr("bool_")))
    return h.cast<bool>();
  if (py::isinstance<py::str>(h)) return h.cast<std::string>();
  if (py::isinstance<py::dict>(h)) {
    Json object = Json::object();
    for (auto [key, value] : h.cast<py::dict>()) {
      if (!py::isinstance<py::str>(key))
        throw UsageError(where + ": key " + py::repr(key).cast<std::string>() + " is not a string");
      const std::string name = key.cast<std::string>();
      object[name] = from_python(value, where + "['" + name + "']");
    }
    return object;
  }
  if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) {
    Json array = Json::array();
    std::size_t i = 0;
    for (py::handle e : h) array.push_back(from_python(e, where + "[" + std::to_string(i++) + "]"));
    return array;
  }
  if (py::hasattr(h, "__index__")) {  // int and numpy integers
    const py::int_ value = py::reinterpret_steal<py::int_>(PyNumber_Index(h.ptr()));
    if (!value) throw py::error_already_set();
    try {
      return value.cast<int64_t>();
    } catch (const py::cast_error&) {
      throw UsageError(where + ": " + py::repr(value).cast<std::string>() + " is out of the 64-bit range");
    }
  }
  if (py::hasattr(h, "__float__")) {  // float and numpy floating types
    const py::object value = py::reinterpret_steal<py::object>(PyNumber_Float(h.ptr()));
    if (!value) throw py::error_already_set();
    return value.cast<double>();
  }
  throw UsageError(where + ": a " + py::str(py::type::of(h).attr("__name__")).cast<std::string>() +
                   " is not a JSON value (None, bool, int, float, str, list or dict)");
}

// Why numpy cannot make an array of `obj` (ensure() returns null and clears numpy's error: ask again).
std::string conversion_error(py::handle obj, const char* dtype) {
  try {
    py::module_::import("numpy").attr("asarray")(obj, "dtype"_a = dtype);
  } catch (py::error_already_set& e) {
    return e.what();
  }
  return "not an array numpy can read";
}

std::vector<int64_t> shape_of(const py::array& a) {
  return std::vector<int64_t>(a.shape(), a.shape() + a.ndim());
}

// `obj` as a C-contiguous float32 (or float64) array: the array itself when it already is one (no copy),
// else a converted copy. UsageError naming the argument when numpy cannot convert it.
template <class Arg>
Arg numeric_array(py::handle obj, const std::string& what) {
  Arg a = Arg::ensure(obj);
  if (!a) {
    const char* dtype = std::is_same_v<Arg, FloatArg> ? "float32" : "float64";
    throw UsageError(what + ": cannot be read as a " + dtype + " array (" + conversion_error(obj, dtype) +
                     ")");
  }
  // A C-contiguous view at an offset that is not a multiple of the element size (a byte-offset buffer) is
  // copied: the kernels read whole aligned elements.
  if (reinterpret_cast<std::uintptr_t>(a.data()) % alignof(typename Arg::value_type) != 0)
    a = Arg::ensure(py::module_::import("numpy").attr("array")(a, "copy"_a = true));
  return a;
}

// A mask argument as 0/1 bytes (nonzero = true), as `eval` reads a mask file: bool, integer or float (NaN
// refused); UsageError naming the argument otherwise.
BoolArg mask_array(py::handle obj, const std::string& what) {
  py::array a = py::array::ensure(obj);
  if (!a) throw UsageError(what + ": cannot be read as an array (" + conversion_error(obj, "bool") + ")");
  const char kind = a.dtype().kind();
  if (std::string("biuf").find(kind) == std::string::npos)
    throw UsageError(what + ": dtype '" + py::str(a.dtype()).cast<std::string>() +
                     "' is not allowed for a mask (bool, integer, or float of 0/1)");
  const py::module_ np = py::module_::import("numpy");
  if (kind == 'f') {
    const py::object nan_at = np.attr("flatnonzero")(np.attr("isnan")(a));
    if (py::len(nan_at))
      throw UsageError(what + ": mask element " + py::str(nan_at[py::int_(0)]).cast<std::string>() +
                       " is NaN");
  }
  return BoolArg::ensure(kind == 'b' ? py::object(a) : np.attr("not_equal")(a, 0));
}

// The masks, scale, dropout and bias options forward() and reference() share.
struct CallOptions {
  bool causal = false, causal_lower_right = false;
  py::object mask, key_padding;
  std::optional<double> scale;
  double dropout = 0;
  uint64_t seed = 0;
  bool alibi = false;
  py::object alibi_slopes;
  // A recurrence's gate g, beta and initial state (None: not given).
  py::object g = py::none(), beta = py::none(), initial_state = py::none();
  // Logit soft-capping C and learned sink logits ([heads]; None: not given), for the variants that list
  // softcap / sinks (eval's --softcap, --sink-logits).
  std::optional<double> softcap;
  py::object sink_logits = py::none();
};

// One call's arrays (held, so their buffers outlive the GIL-released kernel) and its checked problem.
struct Call {
  Problem problem;
  std::optional<FloatArg> q, k, v;
  std::optional<BoolArg> mask, key_padding;
  std::vector<float> slopes;
  std::vector<float> g, beta, initial_state;  // a recurrence's, as float32 (eval.hpp's checks)
  std::vector<float> sink_logits;             // one per query head
  Gate gate = Gate::none;                     // the variant's (g's shape)

  AttentionInputs inputs() const {
    AttentionInputs in;
    in.q = q->data(), in.k = k->data(), in.v = v->data();
    in.mask = mask ? reinterpret_cast<const uint8_t*>(mask->data()) : nullptr;
    in.key_padding = key_padding ? reinterpret_cast<const uint8_t*>(key_padding->data()) : nullptr;
    in.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
    in.g = g.empty() ? nullptr : g.data();
    in.beta = beta.empty() ? nullptr : beta.data();
    in.initial_state = initial_state.empty() ? nullptr : initial_state.data();
    in.sink_logits = sink_logits.empty() ? nullptr : sink_logits.data();
    return in;
  }
};

// check_extra_inputs_given with the arguments as the module names them.
void check_recurrence_args(const Attention& variant, const CallOptions& o, bool final_state) {
  check_extra_inputs_given(variant, {.g = o.g.is_none() ? "" : "g",
                                     .beta = o.beta.is_none() ? "" : "beta",
                                     .initial_state = o.initial_state.is_none() ? "" : "initial_state",
                                     .final_state = final_state ? "return_final_state=True" : "",
                                     .g_how = "g=",
                                     .beta_how = "beta="});
}

void check_slopes_need_alibi(const CallOptions& o) {
  if (!o.alibi_slopes.is_none() && !o.alibi)
    throw UsageError(
        "alibi_slopes needs alibi=True (the slopes are those of the ALiBi bias; without alibi there is "
        "none)");
}

// Converts and checks the arrays in `eval`'s order and words (the tensors, then the masks, then the slopes,
// then a recurrence's g, beta and initial state, of `gate`'s shape), filling `p`'s sizes and options. `p`
// comes with its variant, parameters, dtype and bias set.
Call prepare(Problem p, py::handle q, py::handle k, py::handle v, const CallOptions& o,
             Gate gate = Gate::none) {
  Call c;
  c.q = numeric_array<FloatArg>(q, "q");
  c.k = numeric_array<FloatArg>(k, "k");
  c.v = numeric_array<FloatArg>(v, "v");
  const std::vector<int64_t> qs = shape_of(*c.q), ks = shape_of(*c.k), vs = shape_of(*c.v);
  require_rank4("q", qs, "[batch, heads, seq_q, head_dim]");
  require_rank4("k", ks, "[batch, kv_heads, seq_kv, head_dim]");
  require_rank4("v", vs, "[batch, kv_heads, seq_kv, d_v]");
  check_kv_shapes("q", qs, "k", ks, "v", vs);
  set_shape(p, qs, ks, vs);
  p.mask.causal = o.causal;
  p.mask.causal_lower_right = o.causal_lower_right;
  p.scale = o.scale;
  p.dropout = o.dropout;
  p.seed = o.seed;
  p.softcap = o.softcap;
  if (!o.mask.is_none()) {
    c.mask = mask_array(o.mask, "mask");
    require_shape("mask", shape_of(*c.mask), {p.seq_q, p.seq_kv}, "[seq_q, seq_kv]");
    p.mask.boolean = true;
  }
  if (!o.key_padding.is_none()) {
    c.key_padding = mask_array(o.key_padding, "key_padding");
    require_shape("key_padding", shape_of(*c.key_padding), {p.batch, p.seq_kv}, "[batch, seq_kv]");
    p.mask.key_padding = true;
  }
  if (!o.alibi_slopes.is_none()) {
    const DoubleArg s = numeric_array<DoubleArg>(o.alibi_slopes, "alibi_slopes");
    c.slopes = checked_alibi_slopes("alibi_slopes", "q", shape_of(s), s.data(), p);
  }
  if (!o.sink_logits.is_none()) {
    const DoubleArg s = numeric_array<DoubleArg>(o.sink_logits, "sink_logits");
    c.sink_logits = checked_head_values("sink_logits", "q", "sink logit", shape_of(s), s.data(), p);
    p.sinks = true;
  }
  c.gate = gate;
  if (!o.g.is_none()) {
    const DoubleArg x = numeric_array<DoubleArg>(o.g, "g");
    c.g = checked_gate("g", "q", shape_of(x), x.data(), p, gate);
  }
  if (!o.beta.is_none()) {
    const DoubleArg x = numeric_array<DoubleArg>(o.beta, "beta");
    c.beta = checked_beta("beta", "q", shape_of(x), x.data(), p);
  }
  if (!o.initial_state.is_none()) {
    const DoubleArg x = numeric_array<DoubleArg>(o.initial_state, "initial_state");
    c.initial_state = checked_initial_state("initial_state", "q", shape_of(x), x.data(), p);
    p.initial_state = true;
  }
  c.problem = std::move(p);
  return c;
}

// The process-wide settings of one kernel call (`threads`, `isa`) for as long as it lives: exclusive use of
// them when the call sets either, else shared (calls without them run concurrently). Made with the GIL
// released.
class KernelScope {
 public:
  KernelScope(const std::optional<int>& threads, const std::optional<std::string>& isa) {
    if (isa || threads)
      exclusive_ = std::unique_lock<std::shared_mutex>(g_process_state);
    else
      shared_ = std::shared_lock<std::shared_mutex>(g_process_state);
    if (isa) isa_scope_.emplace(*isa, "isa");
    if (threads) thread_scope_.emplace(*threads);
  }

 private:
  std::unique_lock<std::shared_mutex> exclusive_;  // declared first: released after the settings are undone
  std::shared_lock<std::shared_mutex> shared_;
  std::optional<simd::ScopedIsa> isa_scope_;
  std::optional<ThreadScope> thread_scope_;
};

void check_kernel_settings(const std::optional<int>& threads, const std::optional<std::string>& isa) {
  if (isa) simd::validate_isa(*isa, "isa");
  if (threads && (*threads < 0 || *threads > kMaxThreads))
    throw UsageError("threads: " + std::to_string(*threads) + " is not in [0, " +
                     std::to_string(kMaxThreads) + "] (0 or None: every available core)");
}

// The threads a call's memory estimate assumes: the ones it asks for, else the process's limit.
int estimate_threads(const std::optional<int>& threads) {
  return threads && *threads > 0 ? *threads
                                 : static_cast<int>(tbb::global_control::active_value(
                                       tbb::global_control::max_allowed_parallelism));
}

// A registered variant with its parameters resolved (UsageError naming `params` otherwise).
struct ResolvedVariant {
  const Attention* variant = nullptr;
  Json params;
};

ResolvedVariant resolve_variant(const std::string& variant_name, py::object params) {
  ResolvedVariant r;
  r.variant = &Registry::instance().get(variant_name);
  const std::string where = "params for variant '" + r.variant->name() + "'";
  const Json given = params.is_none() ? Json::object() : from_python(params, "params");
  if (!given.is_object())
    throw UsageError("params: expected a dict of parameter values, got " + given.dump());
  r.params = resolve_params(r.variant->param_specs(), given, where);
  return r;
}

// A variant's call on q, k, v: the variant, the storage dtype and bias checked against it, then the arrays
// (prepare), in eval's order and words.
struct VariantCall {
  ResolvedVariant v;
  DType dtype = DType::fp32;
  Call call;
};

VariantCall prepare_variant_call(const std::string& variant_name, py::handle q, py::handle k, py::handle v,
                                 const CallOptions& o, py::object params, const std::string& dtype_text,
                                 bool final_state = false) {
  VariantCall c;
  c.v = resolve_variant(variant_name, params);
  Problem p = make_problem(c.v.variant->name(), c.v.params);
  c.dtype = parse_dtype(dtype_text, "dtype");
  check_slopes_need_alibi(o);
  const Bias bias = o.alibi ? Bias::alibi : Bias::none;
  check_storage(*c.v.variant, c.v.params, c.dtype, bias, "dtype='" + dtype_text + "'", "alibi=True");
  check_recurrence_args(*c.v.variant, o, final_state);  // after the storage, as eval checks them
  p.dtype = c.dtype;
  p.bias = bias;
  c.call = prepare(std::move(p), q, k, v, o, c.v.variant->capabilities().gate);
  return c;
}

// Q, K, V rounded to nearest even from their fp32 values to a bf16 / fp16 problem's storage, as `eval
// --dtype` does (nothing for fp32): `in` then points at the 16-bit copies. Run with the GIL released.
struct StoredCopies {
  std::vector<uint16_t> q16, k16, v16;
  void apply(const Problem& p, AttentionInputs& in) {
    if (p.dtype == DType::fp32) return;
    auto store = [&](const float* x, int64_t n, std::vector<uint16_t>& bits) {
      bits.resize(static_cast<std::size_t>(n));
      round_tensor(p.dtype, x, n, bits.data());
      return bits.data();
    };
    in.q16 = store(in.q, p.q_elements(), q16);
    in.k16 = store(in.k, p.kv_elements(), k16);
    in.v16 = store(in.v, p.v_elements(), v16);
    in.q = in.k = in.v = nullptr;
  }
};

void warn(const std::string& note) {
  if (!note.empty() && PyErr_WarnEx(PyExc_RuntimeWarning, note.c_str(), 1) != 0)
    throw py::error_already_set();
}

py::array_t<float> float_array(const std::vector<int64_t>& shape) {
  return py::array_t<float>(std::vector<py::ssize_t>(shape.begin(), shape.end()));
}

py::object forward(const std::string& variant_name, py::object q, py::object k, py::object v,
                   const CallOptions& o, py::object params, std::optional<int> threads,
                   std::optional<std::string> isa, const std::string& dtype_text, bool save_state,
                   bool return_final_state) {
  check_kernel_settings(threads, isa);
  VariantCall vc = prepare_variant_call(variant_name, q, k, v, o, params, dtype_text, return_final_state);
  const Attention& variant = *vc.v.variant;
  const Problem& pr = vc.call.problem;
  check_runnable(variant, pr, estimate_threads(threads), false);
  if (save_state) check_save_state_has_backward(variant, "save_state=True");

  py::array_t<float> out = float_array({pr.batch, pr.heads, pr.seq_q, pr.value_dim()});
  py::array_t<float> state = float_array({save_state ? static_cast<int64_t>(variant.saved_floats(pr)) : 0});
  py::array_t<float> final_state =
      float_array(return_final_state ? state_shape(pr) : std::vector<int64_t>{0});
  AttentionInputs in = vc.call.inputs();
  in.out = out.mutable_data();
  in.final_state = return_final_state ? final_state.mutable_data() : nullptr;
  float* saved = state.size() ? state.mutable_data() : nullptr;
  std::string note;
  {
    py::gil_scoped_release release;
    StoredCopies stored;
    stored.apply(pr, in);
    const KernelScope scope(threads, isa);
    if (save_state)
      variant.run_saving(pr, in, saved);
    else
      variant.run(pr, in);
    if (count_nonfinite(in.out, static_cast<std::size_t>(pr.out_elements())))
      note = nonfinite_output_note(count_nonfinite_values(pr, in));
  }
  warn(note);
  if (save_state && return_final_state) return py::make_tuple(out, state, final_state);
  if (save_state) return py::make_tuple(out, state);
  if (return_final_state) return py::make_tuple(out, final_state);
  return out;
}

// backward()'s earlier training forward, when given: O (`out`) and its saved state, checked as `eval
// --forward-output --saved-state` checks them. An empty state counts as none.
struct GivenForward {
  std::optional<FloatArg> out, state;
};

GivenForward checked_forward_output(const Attention& variant, const Problem& pr, py::object out,
                                    py::object state) {
  GivenForward f;
  if (out.is_none()) return f;
  const std::vector<int64_t> o_shape{pr.batch, pr.heads, pr.seq_q, pr.value_dim()};
  f.out = numeric_array<FloatArg>(out, "out");
  check_backward_input("out", shape_of(*f.out), f.out->data(), o_shape, forward_output_meaning());
  std::optional<FloatArg> s;
  if (!state.is_none()) s = numeric_array<FloatArg>(state, "state");
  const bool given = s && s->size() > 0;
  const std::size_t n = check_saved_state_given(
      variant, pr, given, "out", "state", "give state= from forward(..., save_state=True) on the same inputs",
      "drop the argument");
  if (n > 0) {
    // The state may hold +inf (the log-sum-exp of a query row with no allowed key): only NaN is refused.
    check_backward_input("state", shape_of(*s), s->data(), {static_cast<int64_t>(n)},
                         saved_state_meaning(variant), /*allow_infinite=*/true);
    f.state = std::move(s);
  }
  return f;
}

py::object backward(const std::string& variant_name, py::object q, py::object k, py::object v,
                    py::object d_out, py::object out, py::object state, const CallOptions& o,
                    py::object params, std::optional<int> threads, std::optional<std::string> isa,
                    const std::string& dtype_text, bool compare) {
  if (!state.is_none() && out.is_none()) check_state_needs_out("state", "out", "backward()");
  check_kernel_settings(threads, isa);
  VariantCall vc = prepare_variant_call(variant_name, q, k, v, o, params, dtype_text);
  const Attention& variant = *vc.v.variant;
  const Problem& pr = vc.call.problem;
  check_runnable(variant, pr, estimate_threads(threads), compare, /*backward=*/true);
  const std::vector<int64_t> q_shape{pr.batch, pr.heads, pr.seq_q, pr.head_dim},
      o_shape{pr.batch, pr.heads, pr.seq_q, pr.value_dim()},
      k_shape{pr.batch, pr.num_kv_heads(), pr.seq_kv, pr.head_dim},
      v_shape{pr.batch, pr.num_kv_heads(), pr.seq_kv, pr.value_dim()};
  const FloatArg d = numeric_array<FloatArg>(d_out, "d_out");
  check_backward_input("d_out", shape_of(d), d.data(), o_shape, d_out_meaning("q"));
  const GivenForward given = checked_forward_output(variant, pr, out, state);

  // O and the state of the training forward run here, when none is given.
  py::array_t<float> o_run = float_array(given.out ? std::vector<int64_t>{0} : o_shape);
  std::vector<float> saved(given.out ? 0 : variant.saved_floats(pr));
  py::array_t<float> dq = float_array(q_shape), dk = float_array(k_shape), dv = float_array(v_shape);
  // A recurrence's input gradients, in the order of the inputs: dg, dbeta, d_initial_state where given.
  const Call& call = vc.call;
  py::array_t<float> dg = float_array(call.g.empty() ? std::vector<int64_t>{0} : gate_shape(pr, call.gate)),
                     dbeta = float_array(call.beta.empty() ? std::vector<int64_t>{0} : beta_shape(pr)),
                     ds0 =
                         float_array(call.initial_state.empty() ? std::vector<int64_t>{0} : state_shape(pr)),
                     dsink = float_array(call.sink_logits.empty() ? std::vector<int64_t>{0}
                                                                  : std::vector<int64_t>{pr.heads});
  AttentionInputs in = vc.call.inputs();
  in.out = given.out ? nullptr : o_run.mutable_data();
  GradientArgs g;
  g.out = given.out ? given.out->data() : o_run.data();
  g.saved = given.state ? given.state->data() : saved.empty() ? nullptr : saved.data();
  g.d_out = d.data();
  g.dq = dq.mutable_data(), g.dk = dk.mutable_data(), g.dv = dv.mutable_data();
  g.dg = call.g.empty() ? nullptr : dg.mutable_data();
  g.dbeta = call.beta.empty() ? nullptr : dbeta.mutable_data();
  g.d_initial_state = call.initial_state.empty() ? nullptr : ds0.mutable_data();
  g.d_sink_logits = call.sink_logits.empty() ? nullptr : dsink.mutable_data();
  std::string forward_note, gradient_note;
  Json comparison;
  {
    py::gil_scoped_release release;
    StoredCopies stored;
    stored.apply(pr, in);
    const KernelScope scope(threads, isa);
    if (!given.out) {
      variant.run_saving(pr, in, saved.empty() ? nullptr : saved.data());
      forward_note = nonfinite_output_note(count_nonfinite_values(pr, in));
    }
    variant.run_backward(pr, in, g);
    gradient_note = nonfinite_gradients_note(count_nonfinite_gradients(pr, g.dq, g.dk, g.dv));
    if (compare) {
      ExtraGradients extra;
      extra.dg = g.dg, extra.dbeta = g.dbeta, extra.d_initial_state = g.d_initial_state;
      extra.d_sink = g.d_sink_logits;
      comparison = gradient_comparison(variant, pr, in, g.d_out, g.dq, g.dk, g.dv, extra);
    }
  }
  warn(forward_note);
  warn(gradient_note);
  py::list result;
  for (py::handle x : {dq, dk, dv}) result.append(x);
  if (g.dg) result.append(dg);
  if (g.dbeta) result.append(dbeta);
  if (g.d_initial_state) result.append(ds0);
  if (g.d_sink_logits) result.append(dsink);
  if (compare) result.append(to_python(comparison));
  return py::tuple(result);
}

py::object reference(py::object q, py::object k, py::object v, const CallOptions& o,
                     std::optional<std::string> variant_name, py::object params, bool return_final_state) {
  check_slopes_need_alibi(o);
  if (!variant_name) {
    if (!params.is_none())
      throw UsageError(
          "params needs variant=NAME (the parameters are a variant's; without variant reference() "
          "is exact softmax attention)");
    for (auto [name, given] : {std::pair<const char*, bool>{"g", !o.g.is_none()},
                               {"beta", !o.beta.is_none()},
                               {"initial_state", !o.initial_state.is_none()},
                               {"return_final_state=True", return_final_state}})
      if (given)
        throw UsageError(std::string(name) +
                         " needs variant=NAME (a recurrence's input; without variant reference() is exact "
                         "softmax attention, which reads none)");
    Problem p;
    p.variant = "reference";  // in messages only (repro strings)
    p.bias = o.alibi ? Bias::alibi : Bias::none;
    Call c = prepare(std::move(p), q, k, v, o);
    const Problem& pr = c.problem;
    pr.validate();
    py::array_t<double> out(std::vector<py::ssize_t>{pr.batch, pr.heads, pr.seq_q, pr.value_dim()});
    const AttentionInputs in = c.inputs();
    double* dst = out.mutable_data();
    {
      py::gil_scoped_release release;
      std::shared_lock<std::shared_mutex> shared(g_process_state);
      reference_attention(pr, in, dst);
    }
    return out;
  }
  // The variant's own fp64 definition (Attention::reference_forward) on a problem it can run.
  VariantCall vc = prepare_variant_call(*variant_name, q, k, v, o, params, "fp32", return_final_state);
  const Attention& variant = *vc.v.variant;
  const Problem& pr = vc.call.problem;
  pr.validate();
  if (const std::string why = variant.unsupported_reasons_text(pr); !why.empty())
    throw NotSupported(pr.repro() + ": " + why);
  py::array_t<double> out(std::vector<py::ssize_t>{pr.batch, pr.heads, pr.seq_q, pr.value_dim()});
  const std::vector<int64_t> ss = return_final_state ? state_shape(pr) : std::vector<int64_t>{0};
  py::array_t<double> final_state(std::vector<py::ssize_t>(ss.begin(), ss.end()));
  const AttentionInputs in = vc.call.inputs();
  double* dst = out.mutable_data();
  double* state_dst = return_final_state ? final_state.mutable_data() : nullptr;
  {
    py::gil_scoped_release release;
    std::shared_lock<std::shared_mutex> shared(g_process_state);
    variant.reference_forward_state(pr, in, dst, state_dst);
  }
  if (return_final_state) return py::make_tuple(out, final_state);
  return out;
}

py::tuple reference_backward(const std::string& variant_name, py::object q, py::object k, py::object v,
                             py::object d_out, const CallOptions& o, py::object params) {
  VariantCall vc = prepare_variant_call(variant_name, q, k, v, o, params, "fp32");
  const Attention& variant = *vc.v.variant;
  const Problem& pr = vc.call.problem;
  pr.validate();
  if (const std::string why = variant.backward_unsupported_reasons_text(pr); !why.empty())
    throw NotSupported(pr.repro() + ": " + why);
  const std::vector<int64_t> q_shape{pr.batch, pr.heads, pr.seq_q, pr.head_dim};
  const FloatArg d = numeric_array<FloatArg>(d_out, "d_out");
  check_backward_input("d_out", shape_of(d), d.data(), {pr.batch, pr.heads, pr.seq_q, pr.value_dim()},
                       d_out_meaning("q"));
  auto doubles = [](const std::vector<int64_t>& shape) {
    return py::array_t<double>(std::vector<py::ssize_t>(shape.begin(), shape.end()));
  };
  py::array_t<double> dq = doubles(q_shape),
                      dk = doubles({pr.batch, pr.num_kv_heads(), pr.seq_kv, pr.head_dim}),
                      dv = doubles({pr.batch, pr.num_kv_heads(), pr.seq_kv, pr.value_dim()});
  const Call& call = vc.call;
  py::array_t<double> dg = doubles(call.g.empty() ? std::vector<int64_t>{0} : gate_shape(pr, call.gate)),
                      dbeta = doubles(call.beta.empty() ? std::vector<int64_t>{0} : beta_shape(pr)),
                      ds0 = doubles(call.initial_state.empty() ? std::vector<int64_t>{0} : state_shape(pr)),
                      dsink = doubles(call.sink_logits.empty() ? std::vector<int64_t>{0}
                                                               : std::vector<int64_t>{pr.heads});
  const AttentionInputs in = call.inputs();
  const float* dop = d.data();
  Fp64Gradients fg;
  fg.dq = dq.mutable_data(), fg.dk = dk.mutable_data(), fg.dv = dv.mutable_data();
  fg.dg = call.g.empty() ? nullptr : dg.mutable_data();
  fg.dbeta = call.beta.empty() ? nullptr : dbeta.mutable_data();
  fg.d_initial_state = call.initial_state.empty() ? nullptr : ds0.mutable_data();
  fg.d_sink_logits = call.sink_logits.empty() ? nullptr : dsink.mutable_data();
  {
    py::gil_scoped_release release;
    std::shared_lock<std::shared_mutex> shared(g_process_state);
    if (fg.dg || fg.dbeta || fg.d_initial_state || fg.d_sink_logits)
      variant.reference_gradients(pr, in, dop, fg);
    else
      variant.reference_backward(pr, in, dop, fg.dq, fg.dk, fg.dv);
  }
  py::list result;
  for (py::handle x : {dq, dk, dv}) result.append(x);
  if (fg.dg) result.append(dg);
  if (fg.dbeta) result.append(dbeta);
  if (fg.d_initial_state) result.append(ds0);
  if (fg.d_sink_logits) result.append(dsink);
  return py::tuple(result);
}

// Rows of a results.jsonl as dicts (the last row per id, a torn last line dropped, as every reader does).
py::list rows_of(const std::string& jsonl) {
  py::list rows;
  for (const ResultRow& row : read_results_jsonl(jsonl, false)) rows.append(to_python(to_json(row)));
  return rows;
}

// std::cout into std::cerr while alive: the sweep's lines go to stderr, the Python program's stdout stays its
// own.
class CoutToStderr {
 public:
  CoutToStderr() : saved_(std::cout.rdbuf(std::cerr.rdbuf())) {}
  ~CoutToStderr() {
    std::cout.flush();
    std::cout.rdbuf(saved_);
  }
  CoutToStderr(const CoutToStderr&) = delete;
  CoutToStderr& operator=(const CoutToStderr&) = delete;

 private:
  std::streambuf* saved_;
};

py::list run(py::object config, py::object out, bool resume, bool force, std::optional<std::string> filter) {
  const std::string config_path = path_arg(config), out_dir = path_arg(out);
  if (!std::filesystem::exists(config_path)) raise_file_not_found("config", config_path);
  if (out_dir.empty()) throw UsageError("out: the output folder is empty; name one");
  SweepOptions options;
  options.out_dir = out_dir;
  options.resume = resume;
  options.force = force;
  options.filter = filter.value_or("");
  options.progress_tty = false;  // plain lines
  int code = 0;
  {
    py::gil_scoped_release release;
    std::unique_lock<std::shared_mutex> exclusive(g_process_state);
    CoutToStderr to_stderr;
    // run_sweep replaces Python's SIGINT handler with its own for the sweep (Ctrl-C stops after the current
    // point) and puts Python's back before it returns.
    code = run_sweep_config(config_path, options);
  }
  if (code == 130) {
    PyErr_SetString(
        PyExc_KeyboardInterrupt,
        ("sweep interrupted; run again with resume=True to finish it in '" + out_dir + "'").c_str());
    throw py::error_already_set();
  }
  return rows_of((std::filesystem::path(out_dir) / "results.jsonl").string());
}

py::object load_results(py::object dir) {
  const std::string folder = path_arg(dir);
  const std::string jsonl = (std::filesystem::path(folder) / "results.jsonl").string();
  if (!std::filesystem::exists(jsonl)) raise_file_not_found("results file", jsonl);
  py::list rows = rows_of(jsonl);
  py::module_ pandas;
  try {
    pandas = py::module_::import("pandas");
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_ImportError)) throw;
    return rows;
  }
  return pandas.attr("json_normalize")(rows);
}

constexpr const char* kForwardDoc =
    R"(forward(variant, q, k, v, *, causal=False, causal_lower_right=False, mask=None,
        key_padding=None, scale=None, dropout=0.0, seed=0, params=None, threads=None, isa=None,
        dtype="fp32", alibi=False, alibi_slopes=None, save_state=False, g=None, beta=None,
        initial_state=None, return_final_state=False, softcap=None, sink_logits=None)
        -> numpy.ndarray | tuple

Runs one registered variant, as `attnbench eval` does, and returns O, a new float32 array
[batch, heads, seq_q, d_v]. save_state=True runs the training forward instead (`eval --save-state`;
the variant must have a backward: variants()'s capabilities["backward"]) and returns (O, state): the same O,
and state, a new 1-D float32 array of what the variant keeps for its backward (variants()'s "saved_state"
says what; empty when it keeps nothing), for backward(..., out=O, state=state).

q: [batch, heads, seq_q, head_dim]; k: [batch, kv_heads, seq_kv, head_dim], v: [batch, kv_heads, seq_kv, d_v],
kv_heads dividing heads (grouped-query attention: query head h reads K/V head h // (heads // kv_heads)); d_v
(V's and O's width) may differ from head_dim for the variants whose capabilities list "value_dim". Any array-like numpy can
convert (numpy arrays, torch CPU tensors or their .numpy()): a C-contiguous float32 array is read in place,
without a copy; another dtype (float64, float16, ...) or layout (a transposed view) is converted to a
C-contiguous float32 copy first.
causal: query i attends keys j <= i. causal_lower_right: j <= i + seq_kv - seq_q (both: the stricter).
mask: [seq_q, seq_kv], nonzero = may attend. key_padding: [batch, seq_kv], nonzero = padded (never attended).
scale: logit scale (default 1/sqrt(head_dim)). dropout: probability in [0, 1) on the attention weights, with
the keep decisions drawn from seed (the same as the CLI's and the sweep's).
params: dict of the variant's parameters (variants() lists them), e.g. {"window": 8}.
threads: TBB worker threads (None or 0: every available core). isa: SIMD target ("best", "avx2", ...;
info()["isa"]["supported"]). Both are process-wide settings: a call that gives either runs alone.
dtype: storage of Q, K, V: "fp32", "bf16" or "fp16" (rounded to nearest even from the float32 values);
computation and O are float32. alibi: the ALiBi bias, default slopes 2^(-8 (h + 1) / heads), or
alibi_slopes ([heads], one per query head).
A recurrence's inputs (variants()'s capabilities "gate", "beta", "state"; `eval --g --beta --initial-state
--final-state`), converted as q is: g, the gate, every value finite and <= 0, [batch, heads, seq] for a scalar
gate (simple_gla, gated_delta_rule) or [batch, heads, seq, head_dim] for a per-channel one (gla, kda); beta,
[batch, heads, seq], every value in (0, 1] (delta_rule, gated_delta_rule, kda); initial_state, the starting state
[batch, heads, head_dim, d_v] (default 0). A variant needing one must be given it, and one it does not
read is refused (ValueError naming both). return_final_state=True returns (O, final_state), final_state a new
float32 [batch, heads, head_dim, d_v] array (with save_state: (O, state, final_state)).
softcap: logit soft-capping C > 0 (s <- C tanh(s / C) after the scale, before masks; `eval --softcap`).
sink_logits: [heads], one learned sink logit per query head, finite (`eval --sink-logits`): each row's
softmax gets one more logit whose weight is dropped. Both for the variants that list softcap / sinks
(naive, tiled, sliding_window); others raise attnbench.NotSupported.
The GIL is released while the kernel runs. Bad arguments raise ValueError with the CLI's message, naming the
argument (a combination the variant cannot run: attnbench.NotSupported, a ValueError). An output holding
NaN/Inf gives a RuntimeWarning.)";

constexpr const char* kBackwardDoc =
    R"(backward(variant, q, k, v, d_out, out=None, state=None, *, causal=False, causal_lower_right=False,
         mask=None, key_padding=None, scale=None, dropout=0.0, seed=0, params=None, threads=None, isa=None,
         dtype="fp32", alibi=False, alibi_slopes=None, compare=False, g=None, beta=None,
         initial_state=None, softcap=None, sink_logits=None) -> tuple

The backward pass of one registered variant with a backward (variants()'s capabilities["backward"]), as
`attnbench eval --grad-output` runs it: returns (dq, dk, dv), new float32 arrays, dq of q's shape, dk and dv
of k's and v's shapes (grouped-query heads: each sums over its group's query heads). The gradients are those of L = sum(d_out * O) for O = forward(variant, q, k, v, ...).

d_out: dL/dO, [batch, heads, seq_q, d_v], finite (converted to float32 as q is). Without out, the
training forward runs first (the same O as forward()). out, state: O and the state of an earlier
forward(..., save_state=True) on the same inputs and options (`eval --forward-output --saved-state`): no
forward runs; state is needed exactly when the variant keeps one (an empty array counts as none), and may
hold +inf (the log-sum-exp of a query row with no allowed key), never NaN. The other arguments are
forward()'s. dtype bf16 / fp16: the gradients of the rounded inputs, computed in fp32.
A recurrence's g, beta, initial_state (as forward() takes them): their gradients follow dv in that order,
each given one, float32 of its input's shape: (dq, dk, dv, dg) for simple_gla and gla, (dq, dk, dv, dg,
dbeta) for gated_delta_rule, plus d_initial_state with initial_state (`eval --dg --dbeta
--d-initial-state`). With sink_logits, d_sink_logits ([heads], float32) comes after those
(`eval --d-sink-logits`).
compare=True: returns (dq, dk, dv, metrics), metrics the dict `eval --grad-output --compare` prints for the
gradients: "grad_accuracy" (against the fp64 gradient of the variant's own definition, reference_backward:
what a correct backward must match), "grad_accuracy_exact" (against exact softmax attention's fp64
gradient: how far an approximate variant's gradient lands from it), each with "reference" and per gradient
"dq", "dk", "dv" (and in grad_accuracy "dg", "dbeta", "d_initial_state" where returned): max_abs_err,
rel_l2_err, nan_count, inf_count; and "nonfinite_gradients". The metrics come last in the tuple.
The GIL is released while the kernels run. Bad arguments raise ValueError with the CLI's message, naming
the argument (a missing state: what the variant keeps; a variant without backward or a combination its
backward cannot run: attnbench.NotSupported). Gradients holding NaN/Inf give a RuntimeWarning.)";

constexpr const char* kReferenceDoc =
    R"(reference(q, k, v, *, causal=False, causal_lower_right=False, mask=None,
          key_padding=None, scale=None, dropout=0.0, seed=0, alibi=False, alibi_slopes=None,
          variant=None, params=None, g=None, beta=None, initial_state=None,
          return_final_state=False, softcap=None, sink_logits=None) -> numpy.ndarray | tuple

The fp64 oracle (common/reference/reference.hpp): exact softmax attention in double on the float32 values of q, k, v
(converted as forward() converts them), with the same masks, scale, dropout decisions and ALiBi bias as
forward(), and forward()'s softcap and sink_logits. Returns a new float64 array [batch, heads, seq_q, d_v]; a query row with no allowed key is
zeros. variant (with its params): that variant's own fp64 definition instead (Attention::reference_forward:
exact attention for the exact variants, e.g. linformer's projections for linformer), on a problem the variant
can run (attnbench.NotSupported otherwise). A recurrence's g, beta, initial_state (with variant only) are
forward()'s, checked the same way; return_final_state=True returns (O, final_state), the definition's final
state in float64 [batch, heads, head_dim, d_v]. The GIL is released while it runs. Bad arguments raise
ValueError.)";

constexpr const char* kReferenceBackwardDoc =
    R"(reference_backward(variant, q, k, v, d_out, *, causal=False, causal_lower_right=False, mask=None,
                   key_padding=None, scale=None, dropout=0.0, seed=0, params=None, alibi=False,
                   alibi_slopes=None, g=None, beta=None, initial_state=None, softcap=None,
                   sink_logits=None) -> tuple

The fp64 gradients (dq, dk, dv) of the variant's own definition (Attention::reference_backward, the gradient
of reference(..., variant=variant)) for L = sum(d_out * O): what backward()'s float32 gradients are tested
against. New float64 arrays, dq of q's shape, dk and dv of k's (grouped-query: summed over the group). Like
reference(), it reads the float32 values of q, k, v and d_out (float64 inputs are rounded to float32 first).
The variant must have a backward and be able to run the problem (attnbench.NotSupported otherwise); d_out
is checked as backward() checks it. A recurrence's g, beta, initial_state: their fp64 gradients follow dv as
backward() returns them (dg, dbeta, d_initial_state, each given one), then d_sink_logits with sink_logits.
The GIL is released while it runs. Bad arguments raise ValueError.)";

constexpr const char* kRunDoc =
    R"(run(config_path, out, *, resume=False, force=False, filter=None) -> list[dict]

Runs the sweep of a JSON config (configs/README.md) into the folder out, as `attnbench run CONFIG --out OUT
--plain`, and returns the rows of out/results.jsonl as dicts. The sweep's lines (start, calibration, one per
point, summary) go to stderr. resume=True finishes an interrupted sweep, force=True replaces results already
in out, filter measures only the points whose id contains it. Ctrl-C (SIGINT) or SIGTERM stop after the
current point (the sweep installs its handler for the call and restores Python's after) and raise
KeyboardInterrupt; resume=True then finishes the sweep. The GIL is released during the sweep; it runs alone
(no forward() meanwhile). A bad config raises ValueError with the CLI's message; a missing config file
FileNotFoundError.)";

constexpr const char* kLoadResultsDoc = R"(load_results(dir) -> pandas.DataFrame | list[dict]

The rows of dir/results.jsonl (the last row per id): a pandas DataFrame flattened with pandas.json_normalize
(columns "time_ms.median", "accuracy.max_abs_err", ...) when pandas can be imported, else a list of dicts.
A missing file raises FileNotFoundError; a malformed one ValueError naming the file and line.)";

// forward() and backward(): the variants' fp32 kernels.
void def_kernel_calls(py::module_& m) {
  m.def(
      "forward",
      [](const std::string& variant, py::object q, py::object k, py::object v, bool causal,
         bool causal_lower_right, py::object mask, py::object key_padding, std::optional<double> scale,
         double dropout, uint64_t seed, py::object params, std::optional<int> threads,
         std::optional<std::string> isa, const std::string& dtype, bool alibi, py::object alibi_slopes,
         bool save_state, py::object g, py::object beta, py::object initial_state, bool return_final_state,
         std::optional<double> softcap, py::object sink_logits) {
        const CallOptions o{
            causal, causal_lower_right, mask, key_padding, scale,         dropout, seed,
            alibi,  alibi_slopes,       g,    beta,        initial_state, softcap, sink_logits};
        return forward(variant, q, k, v, o, params, threads, isa, dtype, save_state, return_final_state);
      },
      kForwardDoc, "variant"_a, "q"_a, "k"_a, "v"_a, py::kw_only(), "causal"_a = false,
      "causal_lower_right"_a = false, "mask"_a = py::none(), "key_padding"_a = py::none(),
      "scale"_a = py::none(), "dropout"_a = 0.0, "seed"_a = 0, "params"_a = py::none(),
      "threads"_a = py::none(), "isa"_a = py::none(), "dtype"_a = "fp32", "alibi"_a = false,
      "alibi_slopes"_a = py::none(), "save_state"_a = false, "g"_a = py::none(), "beta"_a = py::none(),
      "initial_state"_a = py::none(), "return_final_state"_a = false, "softcap"_a = py::none(),
      "sink_logits"_a = py::none());
  m.def(
      "backward",
      [](const std::string& variant, py::object q, py::object k, py::object v, py::object d_out,
         py::object out, py::object state, bool causal, bool causal_lower_right, py::object mask,
         py::object key_padding, std::optional<double> scale, double dropout, uint64_t seed,
         py::object params, std::optional<int> threads, std::optional<std::string> isa,
         const std::string& dtype, bool alibi, py::object alibi_slopes, bool compare, py::object g,
         py::object beta, py::object initial_state, std::optional<double> softcap, py::object sink_logits) {
        const CallOptions o{
            causal, causal_lower_right, mask, key_padding, scale,         dropout, seed,
            alibi,  alibi_slopes,       g,    beta,        initial_state, softcap, sink_logits};
        return backward(variant, q, k, v, d_out, out, state, o, params, threads, isa, dtype, compare);
      },
      kBackwardDoc, "variant"_a, "q"_a, "k"_a, "v"_a, "d_out"_a, "out"_a = py::none(), "state"_a = py::none(),
      py::kw_only(), "causal"_a = false, "causal_lower_right"_a = false, "mask"_a = py::none(),
      "key_padding"_a = py::none(), "scale"_a = py::none(), "dropout"_a = 0.0, "seed"_a = 0,
      "params"_a = py::none(), "threads"_a = py::none(), "isa"_a = py::none(), "dtype"_a = "fp32",
      "alibi"_a = false, "alibi_slopes"_a = py::none(), "compare"_a = false, "g"_a = py::none(),
      "beta"_a = py::none(), "initial_state"_a = py::none(), "softcap"_a = py::none(),
      "sink_logits"_a = py::none());
}

// reference() and reference_backward(): the fp64 definitions.
void def_references(py::module_& m) {
  m.def(
      "reference",
      [](py::object q, py::object k, py::object v, bool causal, bool causal_lower_right, py::object mask,
         py::object key_padding, std::optional<double> scale, double dropout, uint64_t seed, bool alibi,
         py::object alibi_slopes, std::optional<std::string> variant, py::object params, py::object g,
         py::object beta, py::object initial_state, bool return_final_state, std::optional<double> softcap,
         py::object sink_logits) {
        const CallOptions o{
            causal, causal_lower_right, mask, key_padding, scale,         dropout, seed,
            alibi,  alibi_slopes,       g,    beta,        initial_state, softcap, sink_logits};
        return reference(q, k, v, o, variant, params, return_final_state);
      },
      kReferenceDoc, "q"_a, "k"_a, "v"_a, py::kw_only(), "causal"_a = false, "causal_lower_right"_a = false,
      "mask"_a = py::none(), "key_padding"_a = py::none(), "scale"_a = py::none(), "dropout"_a = 0.0,
      "seed"_a = 0, "alibi"_a = false, "alibi_slopes"_a = py::none(), "variant"_a = py::none(),
      "params"_a = py::none(), "g"_a = py::none(), "beta"_a = py::none(), "initial_state"_a = py::none(),
      "return_final_state"_a = false, "softcap"_a = py::none(), "sink_logits"_a = py::none());
  m.def(
      "reference_backward",
      [](const std::string& variant, py::object q, py::object k, py::object v, py::object d_out, bool causal,
         bool causal_lower_right, py::object mask, py::object key_padding, std::optional<double> scale,
         double dropout, uint64_t seed, py::object params, bool alibi, py::object alibi_slopes, py::object g,
         py::object beta, py::object initial_state, std::optional<double> softcap, py::object sink_logits) {
        const CallOptions o{
            causal, causal_lower_right, mask, key_padding, scale,         dropout, seed,
            alibi,  alibi_slopes,       g,    beta,        initial_state, softcap, sink_logits};
        return reference_backward(variant, q, k, v, d_out, o, params);
      },
      kReferenceBackwardDoc, "variant"_a, "q"_a, "k"_a, "v"_a, "d_out"_a, py::kw_only(), "causal"_a = false,
      "causal_lower_right"_a = false, "mask"_a = py::none(), "key_padding"_a = py::none(),
      "scale"_a = py::none(), "dropout"_a = 0.0, "seed"_a = 0, "params"_a = py::none(), "alibi"_a = false,
      "alibi_slopes"_a = py::none(), "g"_a = py::none(), "beta"_a = py::none(),
      "initial_state"_a = py::none(), "softcap"_a = py::none(), "sink_logits"_a = py::none());
}

// Python loads extension modules RTLD_LOCAL, so a plugin (which binds to attnbench's symbols at dlopen, not
// to a library of its own) could not see ours: reopen this module RTLD_GLOBAL first (RTLD_NOLOAD: the very
// copy already loaded).
void make_module_global() {
  Dl_info self{};
  if (!dladdr(reinterpret_cast<void*>(&make_module_global), &self) || !self.dli_fname)
    throw std::runtime_error("load_plugin: cannot find the attnbench module's own file (dladdr failed)");
  if (!dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL)) {
    const char* err = dlerror();
    throw std::runtime_error(std::string("load_plugin: cannot make the attnbench module's symbols global: ") +
                             (err ? err : "dlopen failed"));
  }
}

constexpr const char* kLoadPluginDoc =
    "load_plugin(path) -> dict\n\nLoads a plugin (a shared library built with attnbench_add_variant; README, "
    "'Benchmark your own attention'): its variants join variants(), forward(), backward(), run() ... under "
    "their own names. Returns {path, hash, abi, built_against, variants, load_ms}. Loading the same file "
    "again does nothing. ValueError, naming the path, for a missing file, a library that is not a plugin, a "
    "plugin built against another attnbench ABI (naming both) or a variant name already registered (naming "
    "both libraries). ATTNBENCH_PLUGINS=a.so:b.so loads plugins at import.";

py::object load_plugin(const std::string& path) {
  make_module_global();
  return to_python(attn::plugin_json(attn::load_plugin(path, "load_plugin")));
}

// result_row(), results_csv() and timing_summary(): the result row's one definition (result_row.cpp) for rows
// written from Python (the quality harness, bench/quality), so they are the rows `attnbench run` writes.
void def_rows(py::module_& m) {
  m.def(
      "result_row",
      [](py::object row) { return to_python(to_json(row_from_json(from_python(row, "row"), "row"))); },
      "result_row(row: dict) -> dict\n\nThe row as `attnbench run` writes it: read as results.jsonl rows are "
      "read (row_from_json: a field of the wrong type or a missing id, variant or status raises ValueError "
      "naming it) and written back with every field (to_json: null until known), in the declared order. A "
      "`task` object makes it a quality row (configs/README.md, the row fields).",
      "row"_a);
  m.def(
      "results_csv",
      [](py::object rows) {
        std::vector<ResultRow> parsed;
        std::size_t i = 0;
        for (py::handle r : rows) {
          const std::string where = "rows[" + std::to_string(i++) + "]";
          parsed.push_back(row_from_json(from_python(r, where), where));
        }
        return results_csv(parsed);
      },
      "results_csv(rows: list[dict]) -> str\n\nresults.csv as `attnbench run` writes it for these rows: one "
      "column per declared field (the ring's and the task's only when a row has them), arrays and objects as "
      "JSON text.",
      "rows"_a);
  m.def(
      "timing_summary",
      [](std::vector<double> samples_ms) {
        if (samples_ms.empty()) throw UsageError("timing_summary: samples_ms is empty");
        ResultRow row;
        row.time_ms = time_summary(summarize(std::move(samples_ms)));
        return to_python(to_json(row)["time_ms"]);
      },
      "timing_summary(samples_ms: list[float]) -> dict\n\nA row's time_ms from the given repetitions (ms), "
      "computed as `attnbench run` computes it: median, p10, p90 (numpy's linear interpolation), mean, cv, "
      "reps, "
      "the distribution-free 95% interval of the median (ci_lo, ci_hi, ci_level) and the samples.",
      "samples_ms"_a);
  m.def(
      "system_info", [] { return to_python(system_info()); },
      "system_info() -> dict\n\nmeta.json's `system` as `attnbench run` writes it: CPU model and SIMD flags, "
      "targets, cores, memory, hostname, compiler, build type and flags, the git commit built, library "
      "versions.");
}

}  // namespace
}  // namespace attn::python

PYBIND11_MODULE(attnbench, m) {
  using namespace attn::python;
  namespace a = attn;
  m.doc() =
      "attnbench: benchmark and research harness for attention variants on the CPU, from Python: variants(), "
      "info(), forward(), backward(), reference(), reference_backward(), run(), load_results(), and "
      "attnbench.autograd (a torch.autograd.Function). See bench/python/README.md.";
  m.attr("__version__") = ATTN_VERSION;
  // OpenBLAS read OPENBLAS_CORETYPE when it loaded, before this module's code ran: say what to set.
  if (const std::string core = a::blas_autocore_pick(); !core.empty())
    PyErr_WarnEx(PyExc_RuntimeWarning,
                 ("OpenBLAS does not recognise this CPU and runs its narrower " + a::blas_core() +
                  " kernels (sgemm and the BLAS-based variants up to 8x "
                  "slower): start Python with OPENBLAS_CORETYPE=" +
                  core + " in the environment")
                     .c_str(),
                 1);
  // Never destroyed: a Python object must not be released after the interpreter has finalised.
  static auto* not_supported = new py::exception<a::NotSupported>(m, "NotSupported", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const a::UsageError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const a::NotSupported& e) {
      (*not_supported)(e.what());
    }
  });

  m.def(
      "variants", [] { return to_python(a::variants_json()); },
      "variants() -> list[dict]\n\nEvery registered variant, by name, as `attnbench list --json` prints it: "
      "name, description, capabilities (dict of bool: exact, causal, gqa, bf16, alibi, ...) and params (list "
      "of dicts: name, type, default, help; the names forward(params=...) takes).");
  m.def(
      "info", [] { return to_python(a::info_json()); },
      "info() -> dict\n\nThe machine and build, as `attnbench info --json` prints it: cpu_model, isa "
      "(compiled, supported, best), blas (library, core, coretype_env, note), tbb (version, headers), "
      "threads "
      "and cores_available.");
  def_kernel_calls(m);
  def_references(m);
  add_autograd_submodule(m);  // attnbench.autograd, also importable as `import attnbench.autograd`
  m.def("run", &run, kRunDoc, "config_path"_a, "out"_a, py::kw_only(), "resume"_a = false, "force"_a = false,
        "filter"_a = py::none());
  m.def("load_results", &load_results, kLoadResultsDoc, "dir"_a);
  m.def("load_plugin", &load_plugin, kLoadPluginDoc, "path"_a);
  def_rows(m);
  // ATTNBENCH_PLUGINS loads at import, as the CLI loads it at start: a bad entry fails the import, naming it.
  if (std::getenv("ATTNBENCH_PLUGINS")) {
    make_module_global();
    a::load_env_plugins();
  }
}
