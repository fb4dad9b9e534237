// `attnbench eval`: run one variant on Q, K, V from .npy files and write O.npy (float32, [B,H,Lq,D]).
// K and V may have fewer heads than Q (grouped-query attention): K's dimension 1 is Problem::kv_heads.
#include <tbb/global_control.h>
#include <unistd.h>

#include <cmath>
#include <iostream>

#include "bench/lib/command.hpp"
#include "common/error.hpp"
#include "common/npy.hpp"
#include "common/reference.hpp"
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
};

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
  Problem p = make_problem(o.variant, parse_cli_params(variant, o.params));
  FloatArray q = read_npy_float(o.q), k = read_npy_float(o.k), v = read_npy_float(o.v);
  require_rank4("--q", o.q, q, "[batch, heads, seq_q, head_dim]");
  require_rank4("--k", o.k, k, "[batch, kv_heads, seq_kv, head_dim]");
  require_rank4("--v", o.v, v, "[batch, kv_heads, seq_kv, head_dim]");
  check_kv_shapes(o, q, k, v);
  p.batch = q.shape[0], p.heads = q.shape[1], p.seq_q = q.shape[2], p.head_dim = q.shape[3];
  p.kv_heads = k.shape[1],
  p.seq_kv = k.shape[2];  // kv_heads == heads: multi-head attention (no Hkv in the id)
  p.mask.causal = o.causal;
  p.mask.causal_lower_right = o.causal_lower_right;
  p.scale = o.scale;
  p.dropout = o.dropout;
  p.seed = o.seed;
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
  p.validate();
  if (const std::string why = variant.unsupported_reasons_text(p); !why.empty())
    throw NotSupported(p.repro() + ": " + why);
  check_memory(variant, p, o.compare);
  FloatArray out({p.batch, p.heads, p.seq_q, p.head_dim});
  AttentionInputs in{
      q.ptr(),  k.ptr(), v.ptr(), mask.numel() ? mask.ptr() : nullptr, pad.numel() ? pad.ptr() : nullptr,
      out.ptr()};
  variant.run(p, in);
  const int64_t bad_q = count_nonfinite(q.ptr(), q.numel()), bad_k = count_nonfinite(k.ptr(), k.numel()),
                bad_v = count_nonfinite(v.ptr(), v.numel()), bad_in = bad_q + bad_k + bad_v;
  const int64_t bad_out = count_nonfinite(out.ptr(), out.numel());
  if (bad_out)
    std::cerr << "attnbench: warning: the output holds " << bad_out << " NaN/Inf values (the inputs held "
              << bad_in << ")\n";
  write_npy(o.out, out);
  if (o.compare) {
    DoubleArray want(out.shape);
    reference_attention(p, in, want.ptr());
    const ErrorMetrics m = compare_outputs(out.ptr(), want.ptr(), p.batch * p.heads * p.seq_q, p.head_dim);
    Json j = {{"id", p.repro()},
              {"isa", simd::active_isa()},
              {"max_abs_err", json_number(m.max_abs_err)},
              {"rel_l2_err", json_number(m.rel_l2_err)},
              {"mean_cosine", json_number(m.mean_cosine)},
              {"nan_count", m.nan_count},
              {"inf_count", m.inf_count},
              {"nonfinite_inputs", bad_in},
              {"nonfinite_q", bad_q},
              {"nonfinite_k", bad_k},
              {"nonfinite_v", bad_v}};
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
      sub.add_flag("--compare", o->compare, "print accuracy against the fp64 exact reference as JSON");
      attn::cli::add_isa_option(sub, o->isa);
      return std::function<int()>([o] { return attn::cli::run_eval(*o); });
    })
