// `attnbench eval`: run one variant on Q, K, V from .npy files and write O.npy (float32, [B,H,Lq,D]).
// K and V may have fewer heads than Q (grouped-query attention): K's dimension 1 is Problem::kv_heads.
// Optionally: RoPE on Q and K (fp32, before anything else), the storage dtype (Q, K, V rounded to bf16 /
// fp16 with round-to-nearest-even, or float16 files used as they are) and the ALiBi bias.
#include <tbb/global_control.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>

#include "bench/lib/command.hpp"
#include "common/error.hpp"
#include "common/half.hpp"
#include "common/npy.hpp"
#include "common/reference.hpp"
#include "common/rope.hpp"
#include "common/simd.hpp"
#include "common/util.hpp"

namespace attn::cli {
namespace {

struct EvalOptions {
  std::string variant, q, k, v, mask, key_padding, out, isa = "best";
  std::vector<std::string> params;
  bool causal = false, causal_lower_right = false, compare = false;
  std::optional<double> scale;
  double dropout = 0;
  uint64_t seed = 0;
  std::string dtype = "fp32", rope = "none", alibi_slopes;
  bool alibi = false;
  double rope_base = 10000.0;
  CLI::Option* rope_base_opt = nullptr;
};

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

int64_t count_nonfinite_stored(DType t, const uint16_t* x, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(widen(t, x[i]));
  return bad;
}

Json metrics_json(const ErrorMetrics& m, const std::string& reference) {
  return {{"reference", reference},
          {"max_abs_err", json_number(m.max_abs_err)},
          {"rel_l2_err", json_number(m.rel_l2_err)},
          {"mean_cosine", json_number(m.mean_cosine)},
          {"nan_count", m.nan_count},
          {"inf_count", m.inf_count}};
}

void require_shape(const std::string& option, const std::string& file, const std::vector<int64_t>& got,
                   const std::vector<int64_t>& want, const std::string& meaning) {
  if (got != want)
    throw UsageError(option + " '" + file + "': shape " + FloatArray::shape_to_string(got) +
                     " does not match " + FloatArray::shape_to_string(want) + " " + meaning);
}

// A rank-4 tensor with every extent >= 1, or a UsageError naming the option, the file and the shape.
void require_rank4(const std::string& option, const std::string& file, const FloatArray& t,
                   const std::string& layout) {
  if (t.rank() != 4)
    throw UsageError(option + " '" + file + "': rank " + std::to_string(t.rank()) + " " + t.shape_str() +
                     "; expected rank 4 " + layout);
  for (int64_t extent : t.shape)
    if (extent < 1)
      throw UsageError(option + " '" + file + "': shape " + t.shape_str() + " is empty; every extent of " +
                       layout + " must be >= 1");
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

// K must be [Q's batch, kv_heads, seq_kv, Q's head_dim] with kv_heads dividing Q's heads, and V must have
// K's shape; otherwise a UsageError naming the files, both shapes and what is allowed.
void check_kv_shapes(const EvalOptions& o, const FloatArray& q, const FloatArray& k, const FloatArray& v) {
  const int64_t batch = q.shape[0], heads = q.shape[1], head_dim = q.shape[3];
  const std::string allowed = "K and V must be [batch, kv_heads, seq_kv, head_dim] with Q's batch " +
                              std::to_string(batch) + " and head_dim " + std::to_string(head_dim) +
                              ", and kv_heads dividing Q's heads " + std::to_string(heads) + " (" +
                              kv_heads_allowed(heads) + ")";
  auto fail = [&](const std::string& what) {
    throw UsageError("--k '" + o.k + "': shape " + k.shape_str() + " does not fit --q '" + o.q + "' shape " +
                     q.shape_str() + ": " + what + "; " + allowed);
  };
  if (k.shape[0] != batch)
    fail("batch " + std::to_string(k.shape[0]) + " != Q's batch " + std::to_string(batch));
  if (k.shape[3] != head_dim)
    fail("head_dim " + std::to_string(k.shape[3]) + " != Q's head_dim " + std::to_string(head_dim));
  if (heads % k.shape[1] != 0)
    fail("kv_heads " + std::to_string(k.shape[1]) + " does not divide Q's heads " + std::to_string(heads));
  if (v.shape != k.shape)
    throw UsageError("--v '" + o.v + "': shape " + v.shape_str() + " differs from --k '" + o.k + "' shape " +
                     k.shape_str() + " (V must have K's shape [batch, kv_heads, seq_kv, head_dim])");
}

// Refuses, before anything is allocated, a call whose output, workspace and (with --compare) fp64 reference
// cannot fit in this machine's physical memory, naming the bytes it would need.
void check_memory(const Attention& variant, const Problem& p, bool compare) {
  const int threads = static_cast<int>(
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));  // set by --threads
  const MemoryEstimate m = variant.estimate_memory(p, threads);
  // The inputs are already in memory (read from the files); what the call adds is the output, the
  // workspace and, with --compare, the fp64 reference (q_elements fit: Problem::validate bounds them).
  const std::size_t reference = compare ? static_cast<std::size_t>(p.q_elements()) * sizeof(double) : 0;
  const std::size_t need = sat_add(m.beyond_inputs(), reference);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const std::size_t physical = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
  if (need <= physical) return;
  throw NotSupported(p.repro() + ": needs " + (need == SIZE_MAX ? "at least " : "") + std::to_string(need) +
                     " bytes (" + format_bytes(static_cast<double>(need)) + ": output " +
                     format_bytes(static_cast<double>(m.output)) + ", workspace " +
                     format_bytes(static_cast<double>(m.workspace)) +
                     (compare ? ", fp64 reference " + format_bytes(static_cast<double>(reference)) : "") +
                     ") beyond the inputs, more than the " + std::to_string(physical) + " bytes (" +
                     format_bytes(static_cast<double>(physical)) + ") of physical memory");
}

int run_eval(const EvalOptions& o) {
  simd::select_isa(o.isa, "--isa");
  const Attention& variant = Registry::instance().get(o.variant);
  const Json params = parse_cli_params(variant, o.params);
  Problem p = make_problem(o.variant, params);
  // The storage options, checked before any file is read (as --isa): names, combinations, and whether the
  // variant takes them.
  const DType dtype = parse_dtype(o.dtype, "--dtype");
  RopeSpec rope;
  rope.mode = parse_rope_mode(o.rope, "--rope");
  rope.base = o.rope_base;
  validate_rope(rope, 2, "--rope-base");  // the base; head_dim is checked once Q is read
  if (o.rope_base_opt->count() && !rope.on())
    throw UsageError("--rope-base " + shortest_double_text(o.rope_base) +
                     " needs --rope normal or --rope neox (it is the base of the rotary angles)");
  if (!o.alibi_slopes.empty() && !o.alibi)
    throw UsageError(
        "--alibi-slopes '" + o.alibi_slopes +
        "' needs --alibi (the slopes are those of the ALiBi bias; without --alibi there is none)");
  const Bias bias = o.alibi ? Bias::alibi : Bias::none;
  if (const std::string why = storage_refusal(variant, params, dtype, bias); !why.empty())
    throw UsageError(std::string(dtype != DType::fp32 ? "--dtype " + std::string(dtype_name(dtype)) : "") +
                     (dtype != DType::fp32 && o.alibi ? " with " : "") + (o.alibi ? "--alibi" : "") +
                     ": variant '" + variant.name() + "' cannot run it: " + why +
                     " (variants that can: " + variants_taking(dtype, bias) + ")");

  InputTensor q = read_input("--q", o.q, dtype), k = read_input("--k", o.k, dtype),
              v = read_input("--v", o.v, dtype);
  require_rank4("--q", o.q, q.values, "[batch, heads, seq_q, head_dim]");
  require_rank4("--k", o.k, k.values, "[batch, kv_heads, seq_kv, head_dim]");
  require_rank4("--v", o.v, v.values, "[batch, kv_heads, seq_kv, head_dim]");
  check_kv_shapes(o, q.values, k.values, v.values);
  const std::vector<int64_t>& qs = q.values.shape;
  p.batch = qs[0], p.heads = qs[1], p.seq_q = qs[2], p.head_dim = qs[3];
  p.kv_heads = k.values.shape[1],
  p.seq_kv = k.values.shape[2];  // kv_heads == heads: multi-head attention (no Hkv in the id)
  p.mask.causal = o.causal;
  p.mask.causal_lower_right = o.causal_lower_right;
  p.scale = o.scale;
  p.dropout = o.dropout;
  p.seed = o.seed;
  p.dtype = dtype;
  p.bias = bias;
  if (rope.on()) validate_rope(rope, p.head_dim, "--rope " + o.rope + " (--q '" + o.q + "')");
  ByteArray mask, pad;
  if (!o.mask.empty()) {
    mask = read_npy_mask(o.mask);
    require_shape("--mask", o.mask, mask.shape, {p.seq_q, p.seq_kv}, "[seq_q, seq_kv]");
    p.mask.boolean = true;
  }
  if (!o.key_padding.empty()) {
    pad = read_npy_mask(o.key_padding);
    require_shape("--key-padding", o.key_padding, pad.shape, {p.batch, p.seq_kv}, "[batch, seq_kv]");
    p.mask.key_padding = true;
  }
  std::vector<float> slopes;
  if (!o.alibi_slopes.empty()) {
    const DoubleArray s = read_npy_double(o.alibi_slopes);
    require_shape("--alibi-slopes", o.alibi_slopes, s.shape, {p.heads},
                  "[heads] (one slope per query head; heads = " + std::to_string(p.heads) + " from --q)");
    for (std::size_t h = 0; h < s.numel(); ++h) {
      if (!std::isfinite(s.data[h]) || std::fabs(s.data[h]) > std::numeric_limits<float>::max())
        throw UsageError("--alibi-slopes '" + o.alibi_slopes + "': slope " + std::to_string(h) + " = " +
                         std::to_string(s.data[h]) + " is not a finite float32");
      slopes.push_back(static_cast<float>(s.data[h]));
    }
  }
  p.validate();
  if (const std::string why = variant.unsupported_reasons_text(p); !why.empty())
    throw NotSupported(p.repro() + ": " + why);
  check_memory(variant, p, o.compare);

  // RoPE on the fp32 values of Q and K, queries at rope_query_offset (lower-right: the last query at the last
  // key's position). A rotated float16 input is rounded back to fp16 like any other.
  if (rope.on()) {
    apply_rope_qk(rope, p, q.values.ptr(), k.values.ptr());
    q.from_fp16 = k.from_fp16 = false;
  }
  FloatArray out({p.batch, p.heads, p.seq_q, p.head_dim});
  // The fp32 inputs (before any rounding to the storage dtype) and the inputs the variant reads.
  const AttentionInputs fp32_in{q.values.ptr(),
                                k.values.ptr(),
                                v.values.ptr(),
                                mask.numel() ? mask.ptr() : nullptr,
                                pad.numel() ? pad.ptr() : nullptr,
                                out.ptr(),
                                nullptr,
                                nullptr,
                                nullptr,
                                slopes.empty() ? nullptr : slopes.data()};
  AttentionInputs in = fp32_in;
  std::vector<uint16_t> q16, k16, v16;
  if (dtype != DType::fp32) {
    auto store = [&](InputTensor& t, std::vector<uint16_t>& bits) -> const uint16_t* {
      if (t.from_fp16) return t.fp16_bits.ptr();  // float16 file, used as it is
      bits.resize(t.values.numel());
      round_tensor(dtype, t.values.ptr(), static_cast<int64_t>(bits.size()), bits.data());
      return bits.data();
    };
    in.q16 = store(q, q16);
    in.k16 = store(k, k16);
    in.v16 = store(v, v16);
    in.q = in.k = in.v = nullptr;
  }
  variant.run(p, in);
  // Non-finite values in the inputs as the variant read them (rounding to fp16 turns |x| >= 65520 into Inf).
  auto bad_count = [&](const float* x, const uint16_t* x16, int64_t n) {
    return x16 ? count_nonfinite_stored(dtype, x16, n) : count_nonfinite(x, static_cast<std::size_t>(n));
  };
  const int64_t bad_q = bad_count(in.q, in.q16, p.q_elements()),
                bad_k = bad_count(in.k, in.k16, p.kv_elements()),
                bad_v = bad_count(in.v, in.v16, p.kv_elements()), bad_in = bad_q + bad_k + bad_v;
  const int64_t bad_out = count_nonfinite(out.ptr(), out.numel());
  if (bad_out)
    std::cerr << "attnbench: warning: the output holds " << bad_out << " NaN/Inf values (the inputs held "
              << bad_in << ")\n";
  write_npy(o.out, out);
  if (o.compare) {
    const int64_t rows = p.batch * p.heads * p.seq_q;
    DoubleArray want(out.shape);
    reference_attention(p, in, want.ptr());
    const ErrorMetrics m = compare_outputs(out.ptr(), want.ptr(), rows, p.head_dim);
    const std::string stored = dtype == DType::fp32 ? "fp32" : dtype_name(dtype);
    Json accuracy = metrics_json(m, "fp64 on the inputs as stored (" + stored + ")");
    // End to end: fp64 on the fp32 inputs before rounding to the storage dtype (after RoPE, which is applied
    // in fp32 either way); the same as `accuracy` for fp32 storage and for float16 files used as they are.
    Json accuracy_e2e = accuracy;
    if (dtype != DType::fp32) {
      reference_attention(WideInputs::as_fp32(p), fp32_in, want.ptr());
      accuracy_e2e = metrics_json(compare_outputs(out.ptr(), want.ptr(), rows, p.head_dim),
                                  std::string("fp64 on the fp32 inputs before rounding to ") + stored);
    } else {
      accuracy_e2e["reference"] = "fp64 on the fp32 inputs (the same as accuracy: fp32 storage)";
    }
    Json stored_as_is = Json::array();
    if (q.from_fp16) stored_as_is.push_back("q");
    if (k.from_fp16) stored_as_is.push_back("k");
    if (v.from_fp16) stored_as_is.push_back("v");
    Json j = {{"id", p.repro()},
              {"isa", simd::active_isa()},
              {"dtype", dtype_name(dtype)},
              {"bias", bias_name(bias)},
              {"rope", rope_mode_name(rope.mode)},
              {"max_abs_err", json_number(m.max_abs_err)},
              {"rel_l2_err", json_number(m.rel_l2_err)},
              {"mean_cosine", json_number(m.mean_cosine)},
              {"nan_count", m.nan_count},
              {"inf_count", m.inf_count},
              {"accuracy", accuracy},
              {"accuracy_e2e", accuracy_e2e},
              {"nonfinite_inputs", bad_in},
              {"nonfinite_q", bad_q},
              {"nonfinite_k", bad_k},
              {"nonfinite_v", bad_v}};
    if (bias == Bias::alibi) j["alibi_slopes"] = o.alibi_slopes.empty() ? "default" : o.alibi_slopes;
    if (rope.on()) {
      j["rope_base"] = json_number(rope.base);
      j["rope_query_offset"] = rope_query_offset(p);
    }
    if (dtype == DType::fp16) j["fp16_inputs_as_is"] = stored_as_is;
    std::cout << j.dump() << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND(
    "eval",
    "run one variant on Q, K, V .npy files ([batch, heads, seq, head_dim]; K and V may have fewer heads) and "
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
      sub.add_option("--v", o->v, "values .npy, same shape as keys")->required();
      sub.add_flag("--causal", o->causal, "causal mask, upper-left aligned (query i attends keys j <= i)");
      sub.add_flag("--causal-lower-right", o->causal_lower_right,
                   "causal mask, lower-right aligned (query i attends keys j <= i + seq_kv - seq_q: the last "
                   "query sees every key, as KV-cache decoding); with --causal the stricter of the two");
      sub.add_option("--mask", o->mask, "boolean mask .npy [seq_q, seq_kv], nonzero = may attend");
      sub.add_option("--key-padding", o->key_padding, "key padding .npy [batch, seq_kv], nonzero = padded");
      sub.add_option("--scale", o->scale, "logit scale (default 1/sqrt(head_dim))");
      sub.add_option("--dropout", o->dropout, "dropout probability on the attention weights, in [0, 1)");
      sub.add_option("--seed", o->seed, "dropout seed");
      sub.add_option("--out", o->out, "output .npy, float32 [batch, heads, seq_q, head_dim]")->required();
      sub.add_flag("--compare", o->compare,
                   "print accuracy against the fp64 exact reference as JSON: `accuracy` on the inputs as "
                   "stored, `accuracy_e2e` on the fp32 inputs before rounding to --dtype");
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
      attn::cli::add_isa_option(sub, o->isa);
      return std::function<int()>([o] { return attn::cli::run_eval(*o); });
    })
