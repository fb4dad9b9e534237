// `attnbench eval`: run one variant on Q, K, V from .npy files and write O.npy (float32, [B,H,Lq,D]).
// K and V may have fewer heads than Q (grouped-query attention): K's dimension 1 is Problem::kv_heads.
// Optionally: RoPE on Q and K (fp32, before anything else), the storage dtype (Q, K, V rounded to bf16 /
// fp16 with round-to-nearest-even, or float16 files used as they are), the ALiBi bias, soft-capping, sink
// logits and a recurrence's inputs (the gate g, beta, an initial state in, the final state out). Its checks
// are in bench/lib/eval.hpp, shared with the Python module's forward().
#include <tbb/global_control.h>

#include <cmath>
#include <iostream>
#include <tuple>

#include "bench/lib/command.hpp"
#include "bench/lib/eval.hpp"
#include "common/interface/half.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/kernels/rope.hpp"
#include "common/kernels/simd.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"

namespace attn::cli {
namespace {

struct EvalOptions {
  std::string variant, q, k, v, mask, key_padding, out, isa = "best";
  std::vector<std::string> params;
  bool causal = false, causal_lower_right = false, compare = false;
  std::optional<double> scale, softcap;
  double dropout = 0;
  uint64_t seed = 0;
  std::string dtype = "fp32", rope = "none", alibi_slopes;
  bool alibi = false;
  double rope_base = 10000.0;
  CLI::Option* rope_base_opt = nullptr;
  // The backward (--grad-output): dO in, dQ, dK, dV out; the training forward's saved state out
  // (--save-state), or O and the saved state of an earlier training forward in (--forward-output,
  // --saved-state) instead of running it.
  std::string grad_output, dq, dk, dv, save_state, forward_output, saved_state;
  // Learned sink logits in ([heads]) and, with the backward, their gradient out.
  std::string sink_logits, d_sink_logits;
  // A recurrence's inputs (the gate g, beta, a starting state), its final state out, and with the backward
  // the gradients of the three inputs out.
  std::string g, beta, initial_state, final_state, dg, dbeta, d_initial_state;
  // A lightning indexer's inputs (Capabilities::indexer).
  std::string index_q, index_k, index_w;
  bool backward() const { return !grad_output.empty(); }
};

// Refuses option combinations of the backward before any file is read.
void check_backward_options(const EvalOptions& o) {
  if (!o.backward()) {
    for (auto [name, value] : {std::pair<const char*, const std::string*>{"--dq", &o.dq},
                               {"--dk", &o.dk},
                               {"--dv", &o.dv},
                               {"--forward-output", &o.forward_output},
                               {"--saved-state", &o.saved_state},
                               {"--d-sink-logits", &o.d_sink_logits},
                               {"--dg", &o.dg},
                               {"--dbeta", &o.dbeta},
                               {"--d-initial-state", &o.d_initial_state}})
      if (!value->empty())
        throw UsageError(
            std::string(name) + " '" + *value +
            "' needs --grad-output DO.npy (the gradient of the output the backward starts from)");
    return;
  }
  for (auto [name, value] :
       {std::pair<const char*, const std::string*>{"--dq", &o.dq}, {"--dk", &o.dk}, {"--dv", &o.dv}})
    if (value->empty())
      throw UsageError("--grad-output '" + o.grad_output + "' needs --dq, --dk and --dv (" + name +
                       " is missing): where the gradients go");
  if (!o.d_sink_logits.empty() && o.sink_logits.empty())
    throw UsageError("--d-sink-logits '" + o.d_sink_logits +
                     "' needs --sink-logits S.npy (it is the gradient of those logits)");
  for (auto [name, value, input, input_flag] :
       {std::tuple<const char*, const std::string*, const std::string*, const char*>{"--dg", &o.dg, &o.g,
                                                                                     "--g G.npy"},
        {"--dbeta", &o.dbeta, &o.beta, "--beta B.npy"},
        {"--d-initial-state", &o.d_initial_state, &o.initial_state, "--initial-state S0.npy"}})
    if (!value->empty() && input->empty())
      throw UsageError(std::string(name) + " '" + *value + "' needs " + input_flag +
                       " (it is the gradient of that input)");
  if (!o.final_state.empty() && !o.forward_output.empty())
    throw UsageError("--final-state '" + o.final_state + "' with --forward-output '" + o.forward_output +
                     "': no forward runs to write a final state; drop one of them");
  if (!o.saved_state.empty() && o.forward_output.empty())
    check_state_needs_out("--saved-state '" + o.saved_state + "'", "--forward-output O.npy", "eval");
  if (!o.forward_output.empty() && !o.save_state.empty())
    throw UsageError("--save-state '" + o.save_state + "' with --forward-output '" + o.forward_output +
                     "': no training forward runs to save a state; drop one of them");
  if (o.out.empty() && o.forward_output.empty())
    throw UsageError("--out is required (the forward's output), unless --forward-output gives it");
}

// A float32/float64 tensor file of exactly `want` shape and finite values, for the backward's inputs: dO,
// an earlier forward's O or saved state. UsageError naming the option, the file, the shape and the first
// non-finite value (check_backward_input; allow_infinite: only NaN, for the saved state).
FloatArray read_backward_input(const std::string& option, const std::string& path,
                               const std::vector<int64_t>& want, const std::string& meaning,
                               bool allow_infinite = false) {
  FloatArray x;
  try {
    x = read_npy_float(path);
  } catch (const UsageError& e) {
    throw UsageError(option + ": " + e.what() + "; expected float32/64 of shape " +
                     FloatArray::shape_to_string(want) + " " + meaning);
  }
  check_backward_input(option + " '" + path + "'", x.shape, x.ptr(), want, meaning, allow_infinite);
  return x;
}

// One of Q, K, V: its values in fp32 (float16 files widened, exactly) and, for a float16 ('<f2') file, its
// bit patterns as read (used as the fp16 storage unless RoPE has rotated the tensor).
struct InputTensor {
  FloatArray values;
  NdArray<uint16_t> fp16_bits;
  bool from_fp16 = false;
};

InputTensor read_input(const std::string& option, const std::string& path, DType dtype) {
  const std::string bytes = read_file_bytes(path);
  InputTensor t;
  if (parse_npy_header(bytes, path).descr != "<f2") {
    t.values = parse_npy_float(bytes, path);
    return t;
  }
  if (dtype != DType::fp16)
    throw UsageError(
        option + " '" + path +
        "': dtype '<f2' (float16) is used as fp16 storage as it is, so it needs --dtype fp16 (got "
        "--dtype " +
        dtype_name(dtype) + "); save it as float32 for another dtype");
  t.fp16_bits = parse_npy_fp16(bytes, path);
  t.from_fp16 = true;
  t.values = FloatArray(t.fp16_bits.shape);
  widen_tensor(DType::fp16, t.fp16_bits.ptr(), static_cast<int64_t>(t.values.numel()), t.values.ptr());
  return t;
}

Json metrics_json(const ErrorMetrics& m, const std::string& reference) {
  return {{"reference", reference},
          {"max_abs_err", json_number(m.max_abs_err)},
          {"rel_l2_err", json_number(m.rel_l2_err)},
          {"mean_cosine", json_number(m.mean_cosine)},
          {"nan_count", m.nan_count},
          {"inf_count", m.inf_count}};
}

// The gradients of one backward call, kept until every output can be written, and with --compare their
// errors.
struct BackwardResult {
  FloatArray dq, dk, dv, d_sink;  // d_sink: [heads], with --d-sink-logits
  FloatArray dg, dbeta, d_s0;     // with --dg, --dbeta, --d-initial-state: their inputs' shapes
  Json compare;
};

// One eval call, filled in stage by stage: the variant and problem, the tensors as read, the backward's
// inputs, then what ran.
struct EvalCall {
  const Attention* variant = nullptr;
  Json params;
  Problem p;
  DType dtype = DType::fp32;
  Bias bias = Bias::none;
  RopeSpec rope;
  InputTensor q, k, v;
  ByteArray mask, pad;
  std::vector<float> slopes, sinks;
  std::vector<float> g, beta, s0;         // a recurrence's gate, beta and initial state, as float32
  DoubleArray index_q, index_k, index_w;  // an indexer's inputs, as read
  std::vector<float> index_q32, index_k32, index_w32;
  FloatArray final_state;         // [batch, heads, head_dim, d_v], with --final-state
  FloatArray d_out, forward_out;  // the backward's dO, and an earlier training forward's O
  std::vector<float> saved;       // that forward's saved state, or the one the training forward writes
  FloatArray out;
  // The fp32 inputs (before any rounding to the storage dtype) and the inputs the variant reads.
  AttentionInputs fp32_in, in;
  std::vector<uint16_t> q16, k16, v16;
  NonfiniteCounts bad;
  BackwardResult grads;
};

// The backward of the training forward whose O (`c.out`) and state (`c.saved`) are given: dQ, dK, dV, with
// --compare their errors (gradient_comparison).
BackwardResult run_backward_step(const EvalOptions& o, const EvalCall& c) {
  const Problem& p = c.p;
  BackwardResult r;
  r.dq = FloatArray({p.batch, p.heads, p.seq_q, p.head_dim});
  r.dk = FloatArray({p.batch, p.num_kv_heads(), p.seq_kv, p.head_dim});
  r.dv = FloatArray({p.batch, p.num_kv_heads(), p.seq_kv, p.value_dim()});
  GradientArgs g;
  g.out = c.out.ptr();
  g.saved = c.saved.empty() ? nullptr : c.saved.data();
  g.d_out = c.d_out.ptr();
  g.dq = r.dq.ptr(), g.dk = r.dk.ptr(), g.dv = r.dv.ptr();
  if (!o.d_sink_logits.empty()) {
    r.d_sink = FloatArray({p.heads});
    g.d_sink_logits = r.d_sink.ptr();
  }
  if (!o.dg.empty()) {
    r.dg = FloatArray(gate_shape(p, c.variant->capabilities().gate));
    g.dg = r.dg.ptr();
  }
  if (!o.dbeta.empty()) {
    r.dbeta = FloatArray(beta_shape(p));
    g.dbeta = r.dbeta.ptr();
  }
  if (!o.d_initial_state.empty()) {
    r.d_s0 = FloatArray(state_shape(p));
    g.d_initial_state = r.d_s0.ptr();
  }
  c.variant->run_backward(p, c.in, g);
  const std::string note =
      nonfinite_gradients_note(count_nonfinite_gradients(p, r.dq.ptr(), r.dk.ptr(), r.dv.ptr()));
  if (!note.empty()) std::cerr << "attnbench: warning: " << note << "\n";
  if (o.compare) {
    ExtraGradients extra;
    extra.d_sink = g.d_sink_logits, extra.dg = g.dg, extra.dbeta = g.dbeta;
    extra.d_initial_state = g.d_initial_state;
    r.compare =
        gradient_comparison(*c.variant, p, c.in, c.d_out.ptr(), r.dq.ptr(), r.dk.ptr(), r.dv.ptr(), extra);
  }
  return r;
}

// The variant, its parameters and the storage options, checked before any file is read (as --isa): names,
// combinations, and whether the variant takes them.
EvalCall check_call_options(const EvalOptions& o) {
  check_backward_options(o);
  simd::select_isa(o.isa, "--isa");
  EvalCall c;
  c.variant = &Registry::instance().get(o.variant);
  c.params = parse_cli_params(*c.variant, o.params);
  c.p = make_problem(o.variant, c.params);
  c.dtype = parse_dtype(o.dtype, "--dtype");
  c.rope.mode = parse_rope_mode(o.rope, "--rope");
  c.rope.base = o.rope_base;
  validate_rope(c.rope, 2, "--rope-base");  // the base; head_dim is checked once Q is read
  if (o.rope_base_opt->count() && !c.rope.on())
    throw UsageError("--rope-base " + shortest_double_text(o.rope_base) +
                     " needs --rope normal or --rope neox (it is the base of the rotary angles)");
  if (!o.alibi_slopes.empty() && !o.alibi)
    throw UsageError(
        "--alibi-slopes '" + o.alibi_slopes +
        "' needs --alibi (the slopes are those of the ALiBi bias; without --alibi there is none)");
  c.bias = o.alibi ? Bias::alibi : Bias::none;
  check_storage(*c.variant, c.params, c.dtype, c.bias, "--dtype " + std::string(dtype_name(c.dtype)),
                "--alibi");
  auto named = [](const char* flag, const std::string& file) {
    return file.empty() ? std::string() : std::string(flag) + " '" + file + "'";
  };
  check_extra_inputs_given(*c.variant, {.g = named("--g", o.g),
                                        .beta = named("--beta", o.beta),
                                        .initial_state = named("--initial-state", o.initial_state),
                                        .final_state = named("--final-state", o.final_state),
                                        .g_how = "--g G.npy",
                                        .beta_how = "--beta B.npy"});
  return c;
}

// A float32/float64 input file read in double, with the option named in a reader's error.
DoubleArray read_double_input(const std::string& option, const std::string& path) {
  try {
    return read_npy_double(path);
  } catch (const UsageError& e) {
    throw UsageError(option + ": " + e.what());
  }
}

// An indexer's index_q [batch, seq_q, index_heads, index_dim], index_k [batch, seq_kv, index_dim] and index_w
// [batch, seq_q, index_heads] (sizes from --q, --k and the variant's index_heads / index_dim), finite
// float32; refused for a variant that reads none, required by one that does.
void read_index_inputs(const EvalOptions& o, EvalCall& c) {
  const Problem& p = c.p;
  const bool given = !o.index_q.empty() || !o.index_k.empty() || !o.index_w.empty();
  if (!c.variant->capabilities().indexer) {
    if (given) throw UsageError(p.variant + " reads no index inputs (--index-q, --index-k, --index-w)");
    return;
  }
  if (o.index_q.empty() || o.index_k.empty() || o.index_w.empty())
    throw UsageError(p.variant +
                     " needs --index-q, --index-k and --index-w (its lightning indexer's inputs)");
  const IndexerShape ix(p);
  auto load = [&](const char* option, const std::string& path, const std::vector<int64_t>& shape,
                  const char* layout, std::vector<float>& out) {
    const DoubleArray x = read_double_input(option, path);
    if (x.shape != shape)
      throw UsageError(std::string(option) + " '" + path + "': must be " + layout + " = " +
                       DoubleArray::shape_to_string(shape) + ", got " + x.shape_str());
    out.resize(x.numel());
    for (std::size_t e = 0; e < x.numel(); ++e) {
      out[e] = static_cast<float>(x.data[e]);
      if (!std::isfinite(out[e]))
        throw UsageError(std::string(option) + " '" + path + "': element " + std::to_string(e) +
                         " is not a finite float32");
    }
  };
  load("--index-q", o.index_q, {p.batch, p.seq_q, ix.heads, ix.dim}, "[batch, seq_q, index_heads, index_dim]",
       c.index_q32);
  load("--index-k", o.index_k, {p.batch, p.seq_kv, ix.dim}, "[batch, seq_kv, index_dim]", c.index_k32);
  load("--index-w", o.index_w, {p.batch, p.seq_q, ix.heads}, "[batch, seq_q, index_heads]", c.index_w32);
}

// A recurrence's g, beta and initial state, read and checked against the sizes from --q (eval.hpp's rules;
// check_call_options has checked the variant reads each one given and is given each one it needs).
void read_recurrence_inputs(const EvalOptions& o, EvalCall& c) {
  Problem& p = c.p;
  if (!o.g.empty()) {
    const DoubleArray x = read_double_input("--g", o.g);
    c.g = checked_gate("--g '" + o.g + "'", "--q", x.shape, x.ptr(), p, c.variant->capabilities().gate);
  }
  if (!o.beta.empty()) {
    const DoubleArray x = read_double_input("--beta", o.beta);
    c.beta = checked_beta("--beta '" + o.beta + "'", "--q", x.shape, x.ptr(), p);
  }
  if (!o.initial_state.empty()) {
    const DoubleArray x = read_double_input("--initial-state", o.initial_state);
    c.s0 = checked_initial_state("--initial-state '" + o.initial_state + "'", "--q", x.shape, x.ptr(), p);
    p.initial_state = true;
  }
  read_index_inputs(o, c);
}

// Q, K, V, the masks and the slopes, read and checked; the problem's sizes and options from them.
void read_call_tensors(const EvalOptions& o, EvalCall& c) {
  Problem& p = c.p;
  c.q = read_input("--q", o.q, c.dtype);
  c.k = read_input("--k", o.k, c.dtype);
  c.v = read_input("--v", o.v, c.dtype);
  const std::string q_what = "--q '" + o.q + "'", k_what = "--k '" + o.k + "'", v_what = "--v '" + o.v + "'";
  require_rank4(q_what, c.q.values.shape, "[batch, heads, seq_q, head_dim]");
  require_rank4(k_what, c.k.values.shape, "[batch, kv_heads, seq_kv, head_dim]");
  require_rank4(v_what, c.v.values.shape, "[batch, kv_heads, seq_kv, d_v]");
  check_kv_shapes(q_what, c.q.values.shape, k_what, c.k.values.shape, v_what, c.v.values.shape);
  set_shape(p, c.q.values.shape, c.k.values.shape, c.v.values.shape);
  p.mask.causal = o.causal;
  p.mask.causal_lower_right = o.causal_lower_right;
  p.scale = o.scale;
  p.softcap = o.softcap;
  p.dropout = o.dropout;
  p.seed = o.seed;
  p.dtype = c.dtype;
  p.bias = c.bias;
  if (c.rope.on()) validate_rope(c.rope, p.head_dim, "--rope " + o.rope + " (--q '" + o.q + "')");
  if (!o.mask.empty()) {
    c.mask = read_npy_mask(o.mask);
    require_shape("--mask '" + o.mask + "'", c.mask.shape, {p.seq_q, p.seq_kv}, "[seq_q, seq_kv]");
    p.mask.boolean = true;
  }
  if (!o.key_padding.empty()) {
    c.pad = read_npy_mask(o.key_padding);
    require_shape("--key-padding '" + o.key_padding + "'", c.pad.shape, {p.batch, p.seq_kv},
                  "[batch, seq_kv]");
    p.mask.key_padding = true;
  }
  if (!o.alibi_slopes.empty()) {
    const DoubleArray s = read_npy_double(o.alibi_slopes);
    c.slopes = checked_alibi_slopes("--alibi-slopes '" + o.alibi_slopes + "'", "--q", s.shape, s.ptr(), p);
  }
  if (!o.sink_logits.empty()) {
    const DoubleArray s = read_npy_double(o.sink_logits);
    c.sinks = checked_head_values("--sink-logits '" + o.sink_logits + "'", "--q", "sink logit", s.shape,
                                  s.ptr(), p);
    p.sinks = true;
  }
  read_recurrence_inputs(o, c);
}

// The backward's own inputs (dO, an earlier training forward's O and state), read and checked before
// anything runs or is written; or the refusal of --save-state for a variant without a backward.
void read_backward_inputs(const EvalOptions& o, EvalCall& c) {
  const Problem& p = c.p;
  if (!o.backward()) {
    if (!o.save_state.empty())
      check_save_state_has_backward(*c.variant, "--save-state '" + o.save_state + "'");
    return;
  }
  const std::vector<int64_t> o_shape{p.batch, p.heads, p.seq_q, p.value_dim()};
  c.d_out = read_backward_input("--grad-output", o.grad_output, o_shape, d_out_meaning("--q"));
  if (o.forward_output.empty()) return;
  c.forward_out =
      read_backward_input("--forward-output", o.forward_output, o_shape, forward_output_meaning());
  const std::size_t n = check_saved_state_given(
      *c.variant, p, !o.saved_state.empty(), "--forward-output '" + o.forward_output + "'",
      "--saved-state '" + o.saved_state + "'",
      "give --saved-state S.npy written by `eval --save-state` with the same inputs", "drop the option");
  if (n > 0) {
    // The state may hold +inf (the log-sum-exp of a query row with no allowed key, as `eval --save-state`
    // writes it): only NaN is refused.
    const FloatArray st = read_backward_input("--saved-state", o.saved_state, {static_cast<int64_t>(n)},
                                              saved_state_meaning(*c.variant), /*allow_infinite=*/true);
    c.saved.assign(st.data.begin(), st.data.end());
  }
}

// RoPE, the storage rounding, then the forward (the inference forward, or the training forward when its
// state is wanted: the same O; none when an earlier training forward's O and state are given) and the
// backward.
void run_call(const EvalOptions& o, EvalCall& c) {
  const Problem& p = c.p;
  // RoPE on the fp32 values of Q and K, queries at rope_query_offset (lower-right: the last query at the last
  // key's position). A rotated float16 input is rounded back to fp16 like any other.
  if (c.rope.on()) {
    apply_rope_qk(c.rope, p, c.q.values.ptr(), c.k.values.ptr());
    c.q.from_fp16 = c.k.from_fp16 = false;
  }
  c.out = FloatArray({p.batch, p.heads, p.seq_q, p.value_dim()});
  c.fp32_in = AttentionInputs{c.q.values.ptr(),
                              c.k.values.ptr(),
                              c.v.values.ptr(),
                              c.mask.numel() ? c.mask.ptr() : nullptr,
                              c.pad.numel() ? c.pad.ptr() : nullptr,
                              c.out.ptr(),
                              nullptr,
                              nullptr,
                              nullptr,
                              c.slopes.empty() ? nullptr : c.slopes.data()};
  c.fp32_in.sink_logits = c.sinks.empty() ? nullptr : c.sinks.data();
  c.fp32_in.g = c.g.empty() ? nullptr : c.g.data();
  c.fp32_in.beta = c.beta.empty() ? nullptr : c.beta.data();
  c.fp32_in.initial_state = c.s0.empty() ? nullptr : c.s0.data();
  c.fp32_in.index_q = c.index_q32.empty() ? nullptr : c.index_q32.data();
  c.fp32_in.index_k = c.index_k32.empty() ? nullptr : c.index_k32.data();
  c.fp32_in.index_w = c.index_w32.empty() ? nullptr : c.index_w32.data();
  if (!o.final_state.empty()) {
    c.final_state = FloatArray(state_shape(p));
    c.fp32_in.final_state = c.final_state.ptr();
  }
  c.in = c.fp32_in;
  if (c.dtype != DType::fp32) {
    auto store = [&](InputTensor& t, std::vector<uint16_t>& bits) -> const uint16_t* {
      if (t.from_fp16) return t.fp16_bits.ptr();  // float16 file, used as it is
      bits.resize(t.values.numel());
      round_tensor(c.dtype, t.values.ptr(), static_cast<int64_t>(bits.size()), bits.data());
      return bits.data();
    };
    c.in.q16 = store(c.q, c.q16);
    c.in.k16 = store(c.k, c.k16);
    c.in.v16 = store(c.v, c.v16);
    c.in.q = c.in.k = c.in.v = nullptr;
  }
  const bool training = o.backward() || !o.save_state.empty();
  if (!c.forward_out.numel()) {
    if (training) {
      c.saved.assign(c.variant->saved_floats(p), 0.0f);
      c.variant->run_saving(p, c.in, c.saved.empty() ? nullptr : c.saved.data());
    } else {
      c.variant->run(p, c.in);
    }
  } else {
    std::copy(c.forward_out.data.begin(), c.forward_out.data.end(), c.out.data.begin());
  }
  c.bad = count_nonfinite_values(p, c.in);
  if (const std::string note = nonfinite_output_note(c.bad); !note.empty())
    std::cerr << "attnbench: warning: " << note << "\n";
  if (o.backward()) c.grads = run_backward_step(o, c);
}

// Every output file only now that everything has run (each written to a temporary and renamed).
void write_outputs(const EvalOptions& o, const EvalCall& c) {
  if (!o.out.empty()) write_npy(o.out, c.out);
  if (!o.final_state.empty()) write_npy(o.final_state, c.final_state);
  if (!o.save_state.empty()) {
    FloatArray state({static_cast<int64_t>(c.saved.size())});
    std::copy(c.saved.begin(), c.saved.end(), state.data.begin());
    write_npy(o.save_state, state);
  }
  if (o.backward()) {
    write_npy(o.dq, c.grads.dq);
    write_npy(o.dk, c.grads.dk);
    write_npy(o.dv, c.grads.dv);
    if (!o.d_sink_logits.empty()) write_npy(o.d_sink_logits, c.grads.d_sink);
    if (!o.dg.empty()) write_npy(o.dg, c.grads.dg);
    if (!o.dbeta.empty()) write_npy(o.dbeta, c.grads.dbeta);
    if (!o.d_initial_state.empty()) write_npy(o.d_initial_state, c.grads.d_s0);
  }
}

// --compare: the output's errors against the fp64 exact reference (and the gradients', with --grad-output)
// as one JSON line on stdout. A recurrence (is_recurrence) is not softmax attention: its reference is its own
// fp64 definition on the same inputs (g, beta, initial state), its final state is compared with the
// definition's (final_state_accuracy, with --final-state), and accuracy_vs_softmax gives the distance from
// exact softmax attention on the same Q, K, V (informative).
void print_comparison(const EvalOptions& o, const EvalCall& c) {
  const Problem& p = c.p;
  const DType dtype = c.dtype;
  const int64_t rows = p.batch * p.heads * p.seq_q;
  const bool own = is_recurrence(c.variant->capabilities());
  auto reference = [&](const Problem& rp, const AttentionInputs& in, double* out, double* final_state) {
    if (own)
      c.variant->reference_forward_state(rp, in, out, final_state);
    else
      reference_attention(rp, in, out);
  };
  DoubleArray want(c.out.shape);
  DoubleArray want_state(c.final_state.numel() ? c.final_state.shape : std::vector<int64_t>{0});
  reference(p, c.in, want.ptr(), want_state.numel() ? want_state.ptr() : nullptr);
  const ErrorMetrics m = compare_outputs(c.out.ptr(), want.ptr(), rows, p.value_dim());
  const std::string stored = dtype == DType::fp32 ? "fp32" : dtype_name(dtype);
  const std::string of = own ? "fp64 " + p.variant + " (its own definition)" : "fp64";
  Json accuracy = metrics_json(m, of + " on the inputs as stored (" + stored + ")");
  // End to end: fp64 on the fp32 inputs before rounding to the storage dtype (after RoPE, which is applied
  // in fp32 either way); the same as `accuracy` for fp32 storage and for float16 files used as they are.
  Json accuracy_e2e = accuracy;
  if (dtype != DType::fp32) {
    reference(WideInputs::as_fp32(p), c.fp32_in, want.ptr(), nullptr);
    accuracy_e2e = metrics_json(compare_outputs(c.out.ptr(), want.ptr(), rows, p.value_dim()),
                                of + " on the fp32 inputs before rounding to " + stored);
  } else {
    accuracy_e2e["reference"] = "fp64 on the fp32 inputs (the same as accuracy: fp32 storage)";
  }
  Json stored_as_is = Json::array();
  if (c.q.from_fp16) stored_as_is.push_back("q");
  if (c.k.from_fp16) stored_as_is.push_back("k");
  if (c.v.from_fp16) stored_as_is.push_back("v");
  Json j = {{"id", p.repro()},
            {"isa", simd::active_isa()},
            {"dtype", dtype_name(dtype)},
            {"bias", bias_name(c.bias)},
            {"rope", rope_mode_name(c.rope.mode)},
            {"max_abs_err", json_number(m.max_abs_err)},
            {"rel_l2_err", json_number(m.rel_l2_err)},
            {"mean_cosine", json_number(m.mean_cosine)},
            {"nan_count", m.nan_count},
            {"inf_count", m.inf_count},
            {"accuracy", accuracy},
            {"accuracy_e2e", accuracy_e2e},
            {"nonfinite_inputs", c.bad.inputs()},
            {"nonfinite_q", c.bad.q},
            {"nonfinite_k", c.bad.k},
            {"nonfinite_v", c.bad.v}};
  if (c.bias == Bias::alibi) j["alibi_slopes"] = o.alibi_slopes.empty() ? "default" : o.alibi_slopes;
  if (c.rope.on()) {
    j["rope_base"] = json_number(c.rope.base);
    j["rope_query_offset"] = rope_query_offset(p);
  }
  if (dtype == DType::fp16) j["fp16_inputs_as_is"] = stored_as_is;
  if (c.final_state.numel())
    j["final_state_accuracy"] = final_state_comparison(p, c.final_state.ptr(), want_state.ptr());
  if (own) {
    reference_attention(p, c.in, want.ptr());
    j["accuracy_vs_softmax"] =
        metrics_json(compare_outputs(c.out.ptr(), want.ptr(), rows, p.value_dim()),
                     "fp64 exact softmax attention on the same Q, K, V (informative: " + p.variant +
                         " is a recurrence, not an approximation of softmax attention)");
  }
  if (o.backward())
    for (auto it = c.grads.compare.begin(); it != c.grads.compare.end(); ++it) j[it.key()] = it.value();
  std::cout << j.dump() << "\n";
}

int run_eval(const EvalOptions& o) {
  EvalCall c = check_call_options(o);
  read_call_tensors(o, c);
  const int threads = static_cast<int>(
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));  // set by --threads
  check_runnable(*c.variant, c.p, threads, o.compare, o.backward());
  read_backward_inputs(o, c);
  run_call(o, c);
  write_outputs(o, c);
  if (o.compare) print_comparison(o, c);
  return 0;
}

// eval's options for a recurrence's initial state and a lightning indexer's inputs (Capabilities::state,
// indexer).
void add_extra_input_options(CLI::App& sub, EvalOptions& o) {
  sub.add_option("--initial-state", o.initial_state,
                 "a recurrence's starting state .npy, float32/64 [batch, heads, head_dim, d_v] "
                 "(d_k x d_v per query head), finite; default 0 (`attnbench list`: state)");
  sub.add_option("--index-q", o.index_q,
                 "a lightning indexer's index queries .npy, float32/64 [batch, seq_q, index_heads, "
                 "index_dim]; with --index-k [batch, seq_kv, index_dim] and --index-w [batch, seq_q, "
                 "index_heads] required by the variants that read them (`attnbench list`: indexer), "
                 "refused by others");
  sub.add_option("--index-k", o.index_k, "a lightning indexer's index keys .npy (see --index-q)");
  sub.add_option("--index-w", o.index_w, "a lightning indexer's head weights .npy (see --index-q)");
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND(
    "eval",
    "run one variant on Q, K, V .npy files ([batch, heads, seq, head_dim]; K and V may have fewer heads, V "
    "another last extent d_v) and "
    "write O.npy",
    [](CLI::App& sub) {
      auto o = std::make_shared<attn::cli::EvalOptions>();
      sub.add_option("--variant", o->variant, "registered variant name (see `attnbench list`)")->required();
      sub.add_option("--param", o->params, "variant parameter NAME=VALUE (repeatable)");
      sub.add_option("--q", o->q, "queries .npy, float32/64 [batch, heads, seq_q, head_dim]")->required();
      sub.add_option("--k", o->k,
                     "keys .npy, [batch, kv_heads, seq_kv, head_dim]; kv_heads dividing heads (grouped-query "
                     "attention: query head h reads K/V head h / (heads / kv_heads)), else equal to it")
          ->required();
      sub.add_option("--v", o->v,
                     "values .npy, [batch, kv_heads, seq_kv, d_v]: the keys' first three extents; d_v != "
                     "head_dim for variants that take it (`attnbench list`: value_dim)")
          ->required();
      sub.add_flag("--causal", o->causal, "causal mask, upper-left aligned (query i attends keys j <= i)");
      sub.add_flag("--causal-lower-right", o->causal_lower_right,
                   "causal mask, lower-right aligned (query i attends keys j <= i + seq_kv - seq_q: the last "
                   "query sees every key, as KV-cache decoding); with --causal the stricter of the two");
      sub.add_option("--mask", o->mask, "boolean mask .npy [seq_q, seq_kv], nonzero = may attend");
      sub.add_option("--key-padding", o->key_padding, "key padding .npy [batch, seq_kv], nonzero = padded");
      sub.add_option("--scale", o->scale, "logit scale (default 1/sqrt(head_dim))");
      sub.add_option("--softcap", o->softcap,
                     "logit soft-capping: s <- C tanh(s / C) after scaling, before bias, masks and softmax "
                     "(Gemma 2); C > 0, the variant must support it (`attnbench list`: softcap)");
      sub.add_option("--sink-logits", o->sink_logits,
                     "learned sink logits .npy, float32/64 [heads], finite: each row's softmax gets one more "
                     "logit sink_h whose weight takes no value (the variant must support it: sinks)");
      sub.add_option("--d-sink-logits", o->d_sink_logits,
                     "with --grad-output and --sink-logits: dL/d sink_logits .npy out, float32 [heads] "
                     "(summed over batch and rows)");
      sub.add_option(
          "--g", o->g,
          "a gated recurrence's gate .npy, float32/64, every value finite and <= 0 (decay exp(g)): "
          "[batch, heads, seq] for a scalar gate (simple_gla, gated_delta_rule), [batch, heads, "
          "seq, head_dim] for a per-channel one (gla, kda); required by those variants, refused by "
          "others (`attnbench list`: gate)");
      sub.add_option(
          "--beta", o->beta,
          "the delta rule's beta .npy, float32/64 [batch, heads, seq], every value in (0, 1]; "
          "required by delta_rule, gated_delta_rule and kda, refused by others (`attnbench list`: beta)");
      attn::cli::add_extra_input_options(sub, *o);
      sub.add_option("--final-state", o->final_state,
                     "a recurrence's state after the last token .npy out, float32 [batch, heads, head_dim, "
                     "d_v]; with --compare also final_state_accuracy against the fp64 definition's");
      sub.add_option("--dg", o->dg, "with --grad-output and --g: dL/dg .npy out, float32, g's shape");
      sub.add_option("--dbeta", o->dbeta,
                     "with --grad-output and --beta: dL/dbeta .npy out, float32, beta's shape");
      sub.add_option("--d-initial-state", o->d_initial_state,
                     "with --grad-output and --initial-state: dL/dS0 .npy out, float32, the state's shape");
      sub.add_option("--dropout", o->dropout, "dropout probability on the attention weights, in [0, 1)");
      sub.add_option("--seed", o->seed, "dropout seed");
      sub.add_option("--out", o->out,
                     "output .npy, float32 [batch, heads, seq_q, d_v] (required unless --forward-output)");
      sub.add_flag("--compare", o->compare,
                   "print accuracy against the fp64 exact reference as JSON: `accuracy` on the inputs as "
                   "stored, `accuracy_e2e` on the fp32 inputs before rounding to --dtype (a recurrence: "
                   "against its own fp64 definition, with `accuracy_vs_softmax` and, with --final-state, "
                   "`final_state_accuracy`); with --grad-output also `grad_accuracy` (dQ, dK, dV and "
                   "the --dg, --dbeta, --d-initial-state asked for, against the fp64 gradient of the "
                   "variant's own definition) and `grad_accuracy_exact` (against exact attention's)");
      sub.add_option("--dtype", o->dtype,
                     "storage of Q, K, V: fp32 (default), bf16 or fp16, rounded from the fp32 inputs "
                     "(round-to-nearest-even); compute and O stay fp32. float16 ('<f2') .npy inputs are "
                     "used as fp16 storage as they are and need --dtype fp16");
      sub.add_flag("--alibi", o->alibi,
                   "ALiBi bias: logit(i, j) -= slope_h * (i' - j) under a causal mask, slope_h * |i' - j| "
                   "otherwise (i' = i + seq_kv - seq_q with --causal-lower-right); default slopes "
                   "2^(-8 (h + 1) / H) (interleaved for H not a power of two)");
      sub.add_option("--alibi-slopes", o->alibi_slopes,
                     "with --alibi: slopes .npy, float32/64 [heads] (one per query head)");
      sub.add_option("--rope", o->rope,
                     "rotary position embedding on Q and K before attention: none (default), normal "
                     "(pairs 2i, 2i+1) or neox (pairs i, i + D/2); keys at 0 .. seq_kv-1, queries at 0 .. "
                     "seq_q-1, offset by seq_kv - seq_q with --causal-lower-right; head_dim must be even");
      o->rope_base_opt = sub.add_option("--rope-base", o->rope_base,
                                        "with --rope: base of the angles pos * base^(-2i/D) (default 10000)");
      sub.add_option("--grad-output", o->grad_output,
                     "the backward: dL/dO .npy, float32/64 [batch, heads, seq_q, d_v], finite; needs "
                     "--dq, --dk, --dv (the variant must have a backward: `attnbench list`)");
      sub.add_option("--dq", o->dq, "with --grad-output: dL/dQ .npy out, float32, Q's shape");
      sub.add_option("--dk", o->dk,
                     "with --grad-output: dL/dK .npy out, float32, K's shape (grouped-query heads summed)");
      sub.add_option("--dv", o->dv, "with --grad-output: dL/dV .npy out, float32, V's shape");
      sub.add_option("--save-state", o->save_state,
                     "run the training forward and write the state it keeps for the backward (float32, "
                     "flattened; `attnbench list --json` says what it holds per variant)");
      sub.add_option("--forward-output", o->forward_output,
                     "with --grad-output: O of an earlier training forward on the same inputs (no forward "
                     "runs); with --saved-state for variants that keep a state");
      sub.add_option("--saved-state", o->saved_state,
                     "with --forward-output: the state that forward wrote with --save-state");
      attn::cli::add_isa_option(sub, o->isa);
      return std::function<int()>([o] { return attn::cli::run_eval(*o); });
    })
