// Stage 1 of a sweep (config -> plan -> runner -> store): the JSON config (schema: configs/README.md), parsed
// and validated with JSON-path error messages. Parsing reads neither the machine nor the registry's runtime
// state beyond variant names and parameter specs: what depends on the machine (threads, memory budget,
// SIMD targets this CPU has) is resolved by the plan (plan.hpp).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/lib/measure.hpp"
#include "common/frontends/mla.hpp"
#include "common/interface/problem.hpp"
#include "common/kernels/rope.hpp"

namespace attn {

// The distribution a recurrence's per-token input is drawn from (inputs[].g, inputs[].beta): z ~ N(mean,
// std^2), then beta = sigmoid(z) (in (0, 1]) and g by its parametrisation (`kind`, inputs[].g's "dist"):
// logsigmoid_normal g = logsigmoid(z) (<= 0: a decay exp(g) = sigmoid(z); GLA's and Gated DeltaNet's layers,
// the default), softplus_normal g = -factor softplus(z) (flash-linear-attention's KDA gate, factor =
// exp(A_log), default 1), lower_bound_sigmoid_normal g = factor sigmoid(z) (its KDA gate with lower_bound,
// factor the bound, default -5: g in (-5, 0)). The documented default is N(0, 1) for both.
struct GateDistribution {
  enum Kind { logsigmoid = 0, softplus = 1, lower_bound_sigmoid = 2 };
  double mean = 0, std = 1;
  int kind = logsigmoid;  // g only; beta is always sigmoid(z)
  double factor = 1;      // softplus: the scale (> 0); lower_bound_sigmoid: the bound (< 0)
  bool operator==(const GateDistribution&) const = default;
  bool is_default() const { return *this == GateDistribution{}; }
  std::string normal() const;  // "N(0,1)", "N(-2,0.5)"
  std::string g_formula()
      const;  // "logsigmoid(N(0,1))", "-softplus(N(0,1))", "-2*softplus(..)", "-5*sigmoid(..)"
  double g_of(double z) const;  // g for a draw z of N(mean, std^2), in double; <= 0 and finite
};

struct Regime {
  std::string kind = "gaussian";  // "gaussian" | "tokens"
  double std = 1.0;               // gaussian: standard deviation of Q and K (V is N(0, 1)); sets peakedness
  std::string text;               // tokens: text file, resolved against the config's folder
  // Rotary position embedding applied to the fp32 Q and K once they are made (inputs.rope, inputs.rope_base),
  // before any rounding to the storage dtype, as a model does before it stores its KV cache.
  RopeSpec rope;
  // The recurrences' gate g (logsigmoid(N(mean, std^2)) by default, GateDistribution) and beta =
  // sigmoid(N(mean, std^2)) (inputs[].g, inputs[].beta), drawn for the points whose variant reads them
  // (bench/lib/inputs.hpp).
  GateDistribution g, beta;
  // "gaussian(std=1)" / "tokens(sample.txt)", with ",rope=normal" (",rope=neox,base=500000") when RoPE is on
  // and ",g=logsigmoid(N(-2,1))" (",g=-5*sigmoid(N(0,1))", GateDistribution::g_formula),
  // ",beta=sigmoid(N(0,2))" when a gate distribution is not the default: part of the point id and the input
  // key, so points differing only in RoPE or a gate distribution differ there.
  std::string label() const;
  // label() without the RoPE part: the input seed derives from it, so the same point with and without RoPE
  // starts from the same draws (or the same projections of the text).
  std::string base_label() const;
};

struct MaskAxis {
  MaskSpec spec;
  double pad_fraction = 0;  // with key padding: the fraction of trailing keys padded in every batch
  // "none", "causal", "causal_lower_right", "pad=0.25", "causal+pad=0.25", "causal_lower_right+pad=0.25"
  std::string label() const;
};

struct VariantSpec {
  std::string name;
  std::vector<Json> param_sets;  // expanded: one resolved parameter object per combination
};

struct AccuracySettings {
  std::string reference = "auto";  // "full" | "sampled" | "auto" (full when seq_q <= rows) | "none"
  int64_t rows = 64;               // sampled query rows per (batch, head)
  // Backward points: the fp64 gradient reference costs about 3 x 2 x seq_q x seq_kv x head_dim multiply-adds
  // per query head it covers; the whole problem when that is at most grad_max_work, else the first and last
  // (batch, K/V head) blocks when those are, else none (the row says which, grad_accuracy.reference). A
  // recurrence's own fp64 gradient costs about 20 x seq x d_k x d_v per head instead, for every head
  // (grad_accuracy_mode, plan.cpp).
  double grad_max_work = 68719476736.0;  // 2^36: n = 8192, d = 64, two blocks of one head (about 10 s)
};

// Which pass a point times (sweep.pass): the forward; the backward alone (reading the O, saved state and dO
// an untimed training forward left); or a training step, the training forward then the backward.
enum class Pass : uint8_t { forward, backward, forward_backward };
const char* pass_name(Pass pass);  // "forward", "backward", "forward_backward"
// UsageError naming `where`, the value and the allowed names.
Pass parse_pass(const std::string& text, const std::string& where);

// One block of a config's "mla" section: multi-head latent attention layers (common/frontends/mla.hpp) timed
// by `attnbench mla --sweep CONFIG` (scripts/run's MLA step) at every (preset, form, context, new tokens).
struct MlaBlock {
  std::vector<std::pair<std::string, MlaShape>> presets;  // name, shape (built-in names or inline shapes)
  std::vector<MlaForm> forms{MlaForm::naive, MlaForm::absorbed};
  std::vector<int64_t> context;   // cached tokens before the timed call, ascending, distinct
  std::vector<int64_t> fresh{1};  // "new": tokens per timed call (1 = a decode step)
  int64_t batch = 1;
  int threads = 0;  // 0: every available core (or `attnbench mla --threads`)
  int repeats = 5, warmup = 1;
  int64_t check_max_context = 1024;  // the fp64 check runs where context + new <= this (0: never)
  std::string variant;               // the core; empty: MlaCall's default (tiled)
  Json params = Json::object();
  // "gqa": {"kv_heads", "head_dim"}: beside the forms, a grouped-query core alone (the preset's query heads
  // on kv_heads K/V heads of head_dim, d_v = head_dim, the same core variant) at the same points, for a
  // comparison with a GQA model's decode (rows with form "gqa"; kv_heads 0: not measured).
  int64_t gqa_kv_heads = 0, gqa_head_dim = 0;
  // The block's largest footprint (weights + every form's cache at its largest context) must fit; unset:
  // the config's memory_budget, else half the physical memory (checked by `attnbench mla --sweep`).
  std::optional<uint64_t> memory_budget_bytes;
};

struct SweepConfig {
  std::string name;
  std::string description;
  std::string source_path;  // the file it was read from
  Json raw;                 // the config as given (recorded in meta.json, hashed for --resume)
  std::vector<VariantSpec> variants;
  std::vector<int64_t> batch{1}, heads{8}, head_dim{64}, seq_q, seq_kv;
  // Widths of V and the output (sweep.v_head_dim, d_v): empty means every point's d_v is its head_dim; a
  // value equal to a point's head_dim is that same point (Problem::v_head_dim 0).
  std::vector<int64_t> v_head_dim;
  // K/V heads (grouped-query attention, sweep.kv_heads): empty means every point's kv_heads is its heads;
  // each value divides every value of `heads` (checked when parsing).
  std::vector<int64_t> kv_heads;
  bool self_attention = true;  // seq_len given: seq_q = seq_kv
  std::vector<MaskAxis> masks;
  std::vector<Regime> regimes;
  std::vector<int> threads;  // empty: every available core (resolved by the plan)
  // SIMD targets (sweep.isa): "best" or a target name this build knows; the plan checks this CPU has them.
  std::vector<std::string> isas{"best"};
  bool isa_from_config = false;  // sweep.isa given (else `run --isa` / `attnbench_gbench --isa` may set it)
  double dropout = 0;
  // Storage precisions of Q, K, V (sweep.dtype) and logit biases (sweep.bias): axes crossed with the others.
  std::vector<DType> dtypes{DType::fp32};
  std::vector<Bias> biases{Bias::none};
  std::vector<Pass> passes{Pass::forward};  // sweep.pass
  // Logit soft-capping C (sweep.softcap; 0: none) and learned sink logits (sweep.sinks): axes crossed with
  // the others. Sink logits are drawn per point from the input seed, N(0, 1) per head (inputs.hpp).
  std::vector<double> softcaps{0.0};
  std::vector<bool> sinks{false};
  MeasureSettings measure;
  AccuracySettings accuracy;
  std::optional<uint64_t> memory_budget_bytes;  // unset: half the physical memory (resolved by the plan)
  uint64_t seed = 0;
  // "mla": one block or a list of blocks of MLA layer points (`attnbench mla --sweep CONFIG`), not sweep
  // points: `attnbench run` only validates them; scripts/run's MLA step measures them into results.mla.jsonl.
  std::vector<MlaBlock> mla;

  std::string hash() const;  // FNV-1a of the canonical JSON dump of `raw`
};

// Parses and validates; every error is a UsageError naming the JSON path (e.g. "sweep.seq_len[2]").
SweepConfig parse_sweep_config(const Json& j, const std::string& source_path);
SweepConfig load_sweep_config(const std::string& path);  // file errors name the file; JSON errors the line
// load_sweep_config on the text of a config file named `source_path` (tokens files resolve against its
// folder): JSON parsing with line/column errors, then parse_sweep_config. tests/fuzz/fuzz_config fuzzes it.
SweepConfig parse_sweep_config_text(const std::string& text, const std::string& source_path);

// "8GiB", "512 MiB", "1.5G", 1073741824 -> bytes; UsageError naming `where` otherwise.
uint64_t parse_bytes(const Json& value, const std::string& where);

}  // namespace attn
