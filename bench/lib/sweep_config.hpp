// Sweep configs: the JSON schema (configs/README.md), its validation with JSON-path error messages, and the
// expansion of a config into single-valued points (the cross product of every axis, as benchdnn does).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/problem.hpp"

namespace attn {

struct Regime {
  std::string kind = "gaussian";  // "gaussian" | "tokens"
  double std = 1.0;               // gaussian: standard deviation of Q and K (V is N(0, 1)); sets peakedness
  std::string text;               // tokens: text file, resolved against the config's folder
  std::string label() const;      // "gaussian(std=1)" / "tokens(sample.txt)"
};

struct MaskAxis {
  MaskSpec spec;
  double pad_fraction = 0;    // with key padding: the fraction of trailing keys padded in every batch
  std::string label() const;  // "none", "causal", "pad=0.25", "causal+pad=0.25"
};

struct VariantSpec {
  std::string name;
  std::vector<Json> param_sets;  // expanded: one resolved parameter object per combination
};

struct MeasureSettings {
  int warmup = 1;
  int min_reps = 3;
  int max_reps = 50;
  double min_time_s = 0.2;  // keep repeating until this much time has been measured...
  double max_time_s = 10;   // ...but stop after this much (at least one measured repetition)
};

struct AccuracySettings {
  std::string reference = "auto";  // "full" | "sampled" | "auto" (full when seq_q <= rows) | "none"
  int64_t rows = 64;               // sampled query rows per (batch, head)
};

struct SweepConfig {
  std::string name;
  std::string description;
  std::string source_path;  // the file it was read from
  Json raw;                 // the config as given (recorded in meta.json, hashed for --resume)
  std::vector<VariantSpec> variants;
  std::vector<int64_t> batch{1}, heads{8}, head_dim{64}, seq_q, seq_kv;
  bool self_attention = true;  // seq_len given: seq_q = seq_kv
  std::vector<MaskAxis> masks;
  std::vector<Regime> regimes;
  std::vector<int> threads;
  // SIMD targets (sweep.isa, validated against this CPU): "best" or a name from simd::isa_info().supported.
  std::vector<std::string> isas{"best"};
  bool isa_from_config = false;  // sweep.isa given (else `run --isa` / `attnbench_gbench --isa` may set it)
  double dropout = 0;
  MeasureSettings measure;
  AccuracySettings accuracy;
  uint64_t memory_budget_bytes = 0;
  uint64_t seed = 0;

  std::string hash() const;  // FNV-1a of the canonical JSON dump of `raw`
};

// One measured point: a fully specified problem plus how its inputs are made and how many threads run it.
struct SweepPoint {
  Problem problem;
  MaskAxis mask;
  Regime regime;
  int threads = 1;
  std::string isa = "best";  // the requested SIMD target; the row records the one that ran (resolved)
  // problem.repro() + pad fraction + regime + threads (+ ",isa=NAME" unless the requested isa is "best", so
  // configs without sweep.isa keep their ids): unique within a sweep
  std::string id;
  std::string input_key;    // identical for points that share inputs (and so the reference)
  uint64_t input_seed = 0;  // derived from the config seed and the input key
};

// Parses and validates; every error is a UsageError naming the JSON path (e.g. "sweep.seq_len[2]").
SweepConfig parse_sweep_config(const Json& j, const std::string& source_path);
SweepConfig load_sweep_config(const std::string& path);  // file errors name the file; JSON errors the line
// load_sweep_config on the text of a config file named `source_path` (tokens files resolve against its
// folder): JSON parsing with line/column errors, then parse_sweep_config. tests/fuzz/fuzz_config fuzzes it.
SweepConfig parse_sweep_config_text(const std::string& text, const std::string& source_path);

// `run --isa NAME` and `attnbench_gbench --isa NAME`: every point of a config that does not set sweep.isa
// runs on NAME. A config that sets sweep.isa keeps it, and any NAME but "best" is then refused (UsageError
// naming both), since the two would contradict each other. NAME is validated like sweep.isa.
void apply_isa_option(SweepConfig& config, const std::string& name);

// Expands the cross product. Points sharing inputs are adjacent so inputs and references are made once.
std::vector<SweepPoint> expand_plan(const SweepConfig& config);

// "8GiB", "512 MiB", "1.5G", 1073741824 -> bytes; UsageError naming `where` otherwise.
uint64_t parse_bytes(const Json& value, const std::string& where);
std::string format_bytes(double bytes);

}  // namespace attn
