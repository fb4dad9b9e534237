// `attnbench drift`: error through a stack of pre-norm transformer blocks (bench/lib/drift.hpp). A text's
// tokens are embedded (+ sinusoidal positions) and run through L seeded blocks in fp32 with each selected
// variant as the attention core, and through the same stack in fp64 with exact softmax attention; after every
// layer it reports rel_l2 and the mean cosine against the fp64 states, the registry's exact baseline always
// included as the floor.
#include <tbb/task_arena.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <set>

#include "bench/lib/command.hpp"
#include "bench/lib/drift.hpp"
#include "bench/lib/sysinfo.hpp"
#include "common/frontends/embedding.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/error.hpp"

namespace attn::cli {
namespace {

struct DriftOptions {
  std::string text, embeddings, isa = "best";
  std::vector<std::string> variants, params;
  int64_t vocab_size = 0, d_model = 0, max_tokens = 0, layers = 0, heads = 0;
  uint64_t seed = 0;
  bool causal = false, json = false;
  CLI::Option *embeddings_opt = nullptr, *vocab_opt = nullptr, *d_model_opt = nullptr, *seed_opt = nullptr,
              *max_tokens_opt = nullptr;
};

// Rejects inconsistent options, naming them, before any file is read.
void check_options(const DriftOptions& o) {
  const bool table_size = o.vocab_opt->count() || o.d_model_opt->count();
  if (o.embeddings_opt->count() && table_size)
    throw UsageError(
        "--embeddings '" + o.embeddings +
        "' cannot be combined with --vocab-size/--d-model (a loaded table has its own size); give "
        "either --embeddings VEC.txt [--seed S] or --vocab-size N --d-model D --seed S");
  if (!o.embeddings_opt->count() && !table_size)
    throw UsageError("no embedding table: give --embeddings VEC.txt or --vocab-size N --d-model D --seed S");
  if (table_size) {
    for (const CLI::Option* opt : {o.vocab_opt, o.d_model_opt, o.seed_opt})
      if (!opt->count())
        throw UsageError("missing " + opt->get_name() +
                         ": a seeded table needs all of --vocab-size N --d-model D --seed S");
    if (o.vocab_size < 1) throw UsageError("--vocab-size " + std::to_string(o.vocab_size) + ": must be >= 1");
    if (o.d_model < 1 || o.d_model > DriftLimits::kMaxDModel)
      throw UsageError("--d-model " + std::to_string(o.d_model) + ": must be in [1, " +
                       std::to_string(DriftLimits::kMaxDModel) + "]");
  }
  if (o.max_tokens_opt->count() && (o.max_tokens < 1 || o.max_tokens > DriftLimits::kMaxTokens))
    throw UsageError("--max-tokens " + std::to_string(o.max_tokens) + ": must be in [1, " +
                     std::to_string(DriftLimits::kMaxTokens) + "]");
  if (o.layers < 1 || o.layers > DriftLimits::kMaxLayers)
    throw UsageError("--layers " + std::to_string(o.layers) + ": must be in [1, " +
                     std::to_string(DriftLimits::kMaxLayers) + "]");
  if (o.heads < 1)
    throw UsageError("--heads " + std::to_string(o.heads) + ": must be >= 1 and divide d_model");
}

// The variants to run: the baseline first (always), then the requested ones in the order given; `all` expands
// to every registered variant. Unknown names are refused with the known ones.
std::vector<std::string> select_variants(const std::vector<std::string>& requested) {
  const auto& reg = Registry::instance();
  std::vector<std::string> names{reg.baseline().name()};
  auto add = [&](const std::string& n) {
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  };
  for (const auto& n : requested) {
    if (n == "all") {
      for (const auto& m : reg.names()) add(m);
    } else if (!reg.find(n)) {
      throw UsageError("--variant '" + n + "': " + reg.unknown_variant_message(n) + " (or all)");
    } else {
      add(n);
    }
  }
  return names;
}

// --param NAME=VALUE (only when one variant is requested by name) or VARIANT.NAME=VALUE, grouped by variant
// and resolved against its specs (typed, validated, defaults filled).
std::map<std::string, Json> resolve_params(const std::vector<std::string>& kvs,
                                           const std::vector<std::string>& requested,
                                           const std::vector<std::string>& selected) {
  const auto& reg = Registry::instance();
  std::map<std::string, std::vector<std::string>> by_variant;
  for (const auto& kv : kvs) {
    const std::size_t eq = kv.find('='), dot = kv.find('.');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--param '" + kv + "': expected NAME=VALUE or VARIANT.NAME=VALUE");
    if (dot != std::string::npos && dot < eq) {
      const std::string variant = kv.substr(0, dot);
      if (!reg.find(variant))
        throw UsageError("--param '" + kv + "': " + reg.unknown_variant_message(variant));
      if (std::find(selected.begin(), selected.end(), variant) == selected.end())
        throw UsageError("--param '" + kv + "': variant '" + variant +
                         "' is not selected (selected: " + join(selected) + ")");
      by_variant[variant].push_back(kv.substr(dot + 1));
      continue;
    }
    std::set<std::string> named(requested.begin(), requested.end());
    if (named.size() != 1 || named.count("all"))
      throw UsageError("--param '" + kv +
                       "': NAME=VALUE applies only when one --variant is given (selected: " + join(selected) +
                       "); write VARIANT.NAME=VALUE, e.g. linear.feature_map=relu");
    by_variant[*named.begin()].push_back(kv);
  }
  std::map<std::string, Json> out;
  for (const auto& name : selected) {
    const auto it = by_variant.find(name);
    out[name] =
        parse_cli_params(reg.get(name), it == by_variant.end() ? std::vector<std::string>{} : it->second);
  }
  return out;
}

std::string sci(double x, int digits = 3) {
  if (!std::isfinite(x)) return std::isnan(x) ? "nan" : "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*e", digits - 1, x);
  return buf;
}

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

struct VariantRun {
  std::string name;
  Json params;
  std::string status;  // ok | skipped | nonfinite
  std::string reason;  // skipped: unsupported_reasons_text; nonfinite: the error
  std::string repro;
  int64_t failed_layer = -1;
  std::vector<DriftLayerMetrics> layers;
};

// One text table per metric: rows are layers, columns variants (baseline first).
void print_table(const std::vector<VariantRun>& runs, int64_t layers, const std::string& title,
                 const std::function<std::string(const DriftLayerMetrics&)>& cell) {
  std::vector<const VariantRun*> cols;
  for (const auto& r : runs)
    if (r.status != "skipped") cols.push_back(&r);
  std::vector<std::string> heads;
  std::size_t width = 11;
  for (const auto* r : cols) {
    heads.push_back(r->name + (r == cols.front() ? " (baseline)" : ""));
    width = std::max(width, heads.back().size() + 2);
  }
  std::cout << title << "\n" << pad("layer", 7);
  for (const auto& h : heads) std::cout << pad(h, width);
  std::cout << "\n";
  for (int64_t l = 0; l <= layers; ++l) {
    std::cout << pad(std::to_string(l), 7);
    for (const auto* r : cols) {
      std::string c = l < static_cast<int64_t>(r->layers.size())
                          ? cell(r->layers[static_cast<std::size_t>(l)])
                      : l == r->failed_layer ? "NaN/Inf"
                                             : "-";
      std::cout << pad(c, width);
    }
    std::cout << "\n";
  }
}

// The text as tokens, the embedding table and the model the variants run in.
struct DriftSetup {
  std::vector<std::string> tokens;
  TokenEmbedding table;
  TokenizedText tok;
  int64_t n = 0, d = 0;
};

DriftSetup drift_setup(const DriftOptions& o) {
  DriftSetup s;
  // One past the limit, so a longer text is refused rather than silently cut (unless --max-tokens cuts it).
  const int64_t read_limit = o.max_tokens_opt->count() ? o.max_tokens : DriftLimits::kMaxTokens + 1;
  s.tokens = read_tokens(o.text, read_limit);
  if (static_cast<int64_t>(s.tokens.size()) > DriftLimits::kMaxTokens)
    throw UsageError("--text '" + o.text + "': more than " + std::to_string(DriftLimits::kMaxTokens) +
                     " tokens; give --max-tokens N (N <= " + std::to_string(DriftLimits::kMaxTokens) +
                     ") to use the first N");
  s.table = o.embeddings_opt->count() ? TokenEmbedding::load_text(o.embeddings)
                                      : TokenEmbedding::seeded(o.vocab_size, o.d_model, o.seed);
  s.table.assign_words(
      s.tokens);  // seeded tables: the text's words in first-seen order; loaded tables are full
  s.tok = s.table.tokenize(s.tokens);
  s.n = static_cast<int64_t>(s.tokens.size()), s.d = s.table.d_model();
  if (s.d % o.heads != 0)
    throw UsageError("--heads " + std::to_string(o.heads) + ": must divide d_model " + std::to_string(s.d) +
                     (o.embeddings_opt->count() ? " (from '" + o.embeddings + "')" : "") +
                     " (head_dim = d_model / heads)");
  if (s.tok.unknown_count == s.n)
    std::cerr << "attnbench: warning: none of the " << s.n << " tokens of '" << o.text
              << "' is in the vocabulary; every row is the zero unknown row plus its position\n";
  return s;
}

// Each variant through the stack against the fp64 reference: ok with its per-layer metrics, skipped with
// the reasons, or nonfinite at the layer where a state stopped being finite.
std::vector<VariantRun> run_variants(const DriftModel& model, const DriftStates& ref, const DriftOptions& o,
                                     const std::vector<std::string>& names,
                                     const std::map<std::string, Json>& params, int64_t n, int64_t d) {
  std::vector<VariantRun> runs;
  for (const auto& name : names) {
    VariantRun run;
    run.name = name;
    run.params = params.at(name);
    try {
      run.repro = model.core_problem(name, run.params).repro();
    } catch (const NotSupported& e) {
      // core_problem refuses with the repro and every reason; list the reasons alone.
      Problem p = make_problem(name, run.params);
      p.batch = 1, p.heads = o.heads, p.seq_q = p.seq_kv = n, p.head_dim = d / o.heads;
      p.mask.causal = o.causal;
      run.repro = p.repro();
      run.status = "skipped";
      run.reason = Registry::instance().get(name).unsupported_reasons_text(p);
      if (run.reason.empty()) run.reason = e.what();  // a refusal of the layer's (e.g. a recurrence's gates)
      runs.push_back(std::move(run));
      continue;
    }
    try {
      model.forward(name, run.params, [&](int64_t l, const FloatArray& h) {
        run.layers.push_back(drift_compare(l, h, ref[static_cast<std::size_t>(l)]));
      });
      run.status = "ok";
    } catch (const DriftNonFinite& e) {
      run.status = "nonfinite";
      run.reason = e.what();
      run.failed_layer = e.layer();
    }
    runs.push_back(std::move(run));
  }
  return runs;
}

Json drift_json(const DriftOptions& o, const DriftSetup& s, const std::vector<VariantRun>& runs) {
  const auto& reg = Registry::instance();
  Json variants = Json::array();
  for (const auto& r : runs) {
    Json v = {{"name", r.name},
              {"params", r.params},
              {"repro", r.repro},
              {"exact", reg.get(r.name).capabilities().exact},
              {"baseline", r.name == reg.baseline().name()},
              {"status", r.status}};
    if (r.status == "skipped") v["reason"] = r.reason;
    if (r.status == "nonfinite") v["error"] = r.reason, v["failed_layer"] = r.failed_layer;
    Json layers = Json::array();
    for (const auto& m : r.layers)
      layers.push_back({{"layer", m.layer},
                        {"rel_l2", json_number(m.rel_l2)},
                        {"mean_cosine", json_number(m.mean_cosine)},
                        {"one_minus_cosine", json_number(m.one_minus_cosine)},
                        {"max_abs_err", json_number(m.max_abs_err)},
                        {"ref_rms", json_number(m.ref_rms)}});
    v["layers"] = layers;
    variants.push_back(v);
  }
  const int64_t d = s.d;
  return {{"command", "drift"},
          {"text", o.text},
          {"tokens", s.n},
          {"max_tokens", o.max_tokens_opt->count() ? Json(o.max_tokens) : Json(nullptr)},
          {"embeddings", o.embeddings_opt->count() ? Json(o.embeddings) : Json("seeded")},
          {"vocab_size", s.table.vocab_size()},
          {"words_assigned", s.table.words().size()},
          {"unknown_tokens", s.tok.unknown_count},
          {"unknown_examples", s.tok.unknown_examples},
          {"seed", o.seed},
          {"d_model", d},
          {"heads", o.heads},
          {"head_dim", d / o.heads},
          {"layers", o.layers},
          {"causal", o.causal},
          {"model",
           {{"block", "pre-norm: x += MHA(LN(x)); x += W2 GELU(W1 LN(x) + b1) + b2"},
            {"ffn_hidden", kDriftFfnMultiplier * d},
            {"activation", "gelu (exact, erf)"},
            {"layer_norm", {{"eps", kDriftLayerNormEps}, {"affine", false}}},
            {"positional", "sinusoidal, added"},
            {"init",
             "torch defaults: MHA xavier-uniform in_proj, W_o and every bias and FFN weight uniform "
             "+-1/sqrt(fan_in)"}}},
          {"reference", "the same stack in fp64: LayerNorm, GEMMs, GELU and exact softmax attention"},
          {"baseline", reg.baseline().name()},
          {"cpu_model", cpu_model()},
          {"isa", simd::active_isa()},
          {"threads", tbb::this_task_arena::max_concurrency()},
          {"variants", variants}};
}

void print_drift_text(const DriftOptions& o, const DriftSetup& s, const std::vector<VariantRun>& runs) {
  const std::string cpu = cpu_model();
  const int64_t d = s.d;
  std::cout << "attnbench drift: " << o.layers << " pre-norm blocks (d_model " << d << ", " << o.heads
            << " heads x " << d / o.heads << ", FFN " << d << " -> " << kDriftFfnMultiplier * d << " -> " << d
            << " GELU), " << (o.causal ? "causal" : "non-causal") << ", seed " << o.seed << "\n"
            << "text: '" << o.text << "', " << s.n << " tokens, vocabulary " << s.table.vocab_size()
            << " rows (" << (o.embeddings_opt->count() ? "'" + o.embeddings + "'" : std::string("seeded"))
            << "), " << s.tok.unknown_count << " unknown\n"
            << "reference: the same stack in fp64 with exact softmax attention; CPU: "
            << (cpu.empty() ? "(unknown)" : cpu) << ", " << tbb::this_task_arena::max_concurrency()
            << " thread(s), isa " << simd::active_isa() << "\n\n";
  print_table(runs, o.layers, "rel_l2 = ||h_l - h_l_ref||_F / ||h_l_ref||_F",
              [](const DriftLayerMetrics& m) { return sci(m.rel_l2); });
  std::cout << "\n";
  print_table(runs, o.layers, "1 - mean cosine(h_l row, h_l_ref row)",
              [](const DriftLayerMetrics& m) { return sci(m.one_minus_cosine); });
  for (const auto& r : runs) {
    if (r.status == "skipped") std::cout << "\nskipped: " << r.name << " (" << r.reason << ")";
    if (r.status == "nonfinite") std::cout << "\nfailed: " << r.reason;
    if (!r.params.empty() && r.status != "skipped")
      std::cout << "\nparams: " << r.name << " " << r.params.dump();
  }
  std::cout << "\n";
}

int run_drift(const DriftOptions& o) {
  simd::select_isa(o.isa, "--isa");
  check_options(o);
  if (o.variants.empty()) throw UsageError("--variant: give at least one variant name, or all");
  const std::vector<std::string> names = select_variants(o.variants);
  const std::map<std::string, Json> params = resolve_params(o.params, o.variants, names);
  const DriftSetup s = drift_setup(o);
  const DriftModel model(s.table.lookup(s.tok.ids), o.heads, o.layers, o.seed, o.causal);
  const DriftStates ref = model.reference();
  const std::vector<VariantRun> runs = run_variants(model, ref, o, names, params, s.n, s.d);
  if (o.json)
    std::cout << drift_json(o, s, runs).dump(2) << "\n";
  else
    print_drift_text(o, s, runs);
  for (const VariantRun& r : runs)
    if (r.status == "nonfinite") {
      std::cout.flush();
      throw std::runtime_error(r.reason);  // the first failure
    }
  return 0;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND(
    "drift",
    "error through a stack of pre-norm transformer blocks: each variant's fp32 hidden states against the "
    "same "
    "stack in fp64 with exact attention, per layer (rel_l2, mean cosine), the exact baseline as the floor",
    [](CLI::App& sub) {
      auto o = std::make_shared<attn::cli::DriftOptions>();
      sub.add_option("--text", o->text,
                     "text file (required; whitespace tokens, looked up exactly). A small public-domain one: "
                     "tests/data/declaration_of_independence.txt (1337 tokens)")
          ->required();
      o->embeddings_opt =
          sub.add_option("--embeddings", o->embeddings,
                         "word2vec/GloVe text file ('word v_1 .. v_D' lines); unknown tokens map "
                         "to an all-zero row; d_model = D");
      o->vocab_opt =
          sub.add_option("--vocab-size", o->vocab_size,
                         "seeded table: rows; the text's words take rows in first-seen order, words "
                         "beyond the table are unknown (all-zero row)");
      o->d_model_opt = sub.add_option("--d-model", o->d_model, "seeded table: width D = d_model (<= 4096)");
      o->seed_opt =
          sub.add_option("--seed", o->seed,
                         "seed of the seeded table (values i.i.d. N(0, 1), as `attnbench embed`) and of "
                         "the layer weights (default 0 with --embeddings)");
      sub.add_option("--layers", o->layers, "number of blocks L (1 .. 64)")->required();
      sub.add_option("--heads", o->heads, "heads; must divide d_model")->required();
      sub.add_option(
             "--variant", o->variants,
             "attention core (repeatable; `all` = every registered variant, those that cannot run the "
             "problem listed as skipped with the reason). The exact baseline is always run")
          ->required();
      sub.add_option("--param", o->params,
                     "variant parameter: NAME=VALUE when one --variant is given, else VARIANT.NAME=VALUE "
                     "(repeatable)");
      sub.add_flag("--causal", o->causal, "causal mask (query i attends keys j <= i)");
      o->max_tokens_opt =
          sub.add_option("--max-tokens", o->max_tokens,
                         "use the first N tokens (1 .. 4096; default: the whole text, which must "
                         "then have at most 4096; tokens x d_model <= 2^21)");
      sub.add_flag("--json", o->json, "print one JSON document instead of the tables");
      attn::cli::add_isa_option(sub, o->isa);
      return std::function<int()>([o] { return attn::cli::run_drift(*o); });
    })
