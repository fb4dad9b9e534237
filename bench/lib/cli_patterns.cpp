// `attnbench patterns`: the attention weights each variant really applies on a small input, per head, as
// .npy.
//
// Generic, with no change to the variant interface: every variant's output is linear in V (softmax weights,
// sliding_window's band, linear attention's normalised kernel all multiply V), so with V's column c set to
// the unit vector e_{j0+c} (zeros elsewhere) output column c is weight column j0 + c. Looping j0 over the
// keys in steps of head_dim measures the whole [seq, seq] matrix with ceil(seq / head_dim) forward calls.
// The recurrences are linear in V too (their state is a sum of terms linear in V, for given Q, K, g and
// beta): the probe gives the effective weights of their output on each value, signed (the delta rule
// subtracts what it overwrites) and not normalised. Their g and beta come from the sweep's own draw
// (fill_recurrence_inputs, the documented default distributions, seeded by --seed), recorded in
// patterns.json.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "bench/lib/command.hpp"
#include "bench/lib/inputs.hpp"
#include "common/frontends/embedding.hpp"
#include "common/frontends/multihead.hpp"
#include "common/frontends/positional.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"

namespace fs = std::filesystem;

namespace attn::cli {
namespace {

// The output is heads * seq^2 floats per variant: --max-seq may raise the default guard up to this.
constexpr int64_t kDefaultMaxSeq = 1024;
constexpr int64_t kHardMaxSeq = 4096;
constexpr double kMaxOutputBytes = 2.0 * 1024 * 1024 * 1024;  // all variants' weights together

struct PatternsOptions {
  std::string text, out;
  int64_t seq = 0, heads = 4, head_dim = 16, max_seq = kDefaultMaxSeq, max_tokens = 0;
  uint64_t seed = 0;
  double std = 1.0;
  bool causal = false;
  // --mask: none, causal, or auto (causal for every variant that has a causal form, unmasked for the others,
  // so one call draws every variant: the newcomer's scripts/run). --causal is --mask causal.
  std::string mask = "none";
  std::vector<std::string> variants, params;
  CLI::Option *seq_opt = nullptr, *text_opt = nullptr, *std_opt = nullptr, *max_tokens_opt = nullptr,
              *mask_opt = nullptr;
};

constexpr const char* kMaskModes = "none, causal or auto";

struct Inputs {
  FloatArray q, k;                  // [1, heads, seq, head_dim]
  std::vector<std::string> tokens;  // --text only
  int64_t unknown_tokens = 0;
};

void check_options(const PatternsOptions& o) {
  if (!o.seq_opt->count() && !o.text_opt->count())
    throw UsageError("give --seq N (seeded gaussian Q, K) or --text FILE (tokens through the front ends)");
  if (o.max_seq < 1 || o.max_seq > kHardMaxSeq)
    throw UsageError("--max-seq " + std::to_string(o.max_seq) + ": must be in [1, " +
                     std::to_string(kHardMaxSeq) + "] (the output is heads x N^2 floats per variant)");
  if (o.seq_opt->count() && (o.seq < 1 || o.seq > o.max_seq))
    throw UsageError("--seq " + std::to_string(o.seq) + ": must be in [1, " + std::to_string(o.max_seq) +
                     "] (--max-seq; the output is heads x N^2 floats per variant, raise --max-seq up to " +
                     std::to_string(kHardMaxSeq) + " if you mean it)");
  if (o.heads < 1 || o.heads > 64)
    throw UsageError("--heads " + std::to_string(o.heads) + ": must be in [1, 64]");
  if (o.head_dim < 1 || o.head_dim > 1024)
    throw UsageError("--head-dim " + std::to_string(o.head_dim) + ": must be in [1, 1024]");
  if (o.std_opt->count() && o.text_opt->count())
    throw UsageError("--std applies to --seq only (with --text, Q and K come from the embedded tokens)");
  if (!(std::isfinite(o.std) && o.std > 0 && o.std <= 1e3))
    throw UsageError("--std " + std::to_string(o.std) + ": must be a standard deviation in (0, 1000]");
  if (o.max_tokens_opt->count() && !o.text_opt->count())
    throw UsageError("--max-tokens applies to --text only");
  if (o.max_tokens_opt->count() && o.max_tokens < 1)
    throw UsageError("--max-tokens " + std::to_string(o.max_tokens) + ": must be >= 1");
  if (o.mask != "none" && o.mask != "causal" && o.mask != "auto")
    throw UsageError("--mask '" + o.mask + "': must be " + kMaskModes +
                     " (auto: causal where the variant has a causal form, unmasked elsewhere)");
  if (fs::exists(o.out) && !fs::is_directory(o.out))
    throw UsageError("--out '" + o.out + "': exists and is not a directory");
}

Inputs gaussian_inputs(const PatternsOptions& o) {
  Inputs in;
  in.q = FloatArray({1, o.heads, o.seq, o.head_dim});
  in.k = FloatArray({1, o.heads, o.seq, o.head_dim});
  // The same seed derivation as the sweep's gaussian regime (bench/lib/inputs.cpp), so --seed means the same.
  fill_normal(in.q.ptr(), static_cast<int64_t>(in.q.numel()), o.seed * 3 + 1, o.std);
  fill_normal(in.k.ptr(), static_cast<int64_t>(in.k.numel()), o.seed * 3 + 2, o.std);
  return in;
}

// The text's tokens -> seeded embedding of its own vocabulary + sinusoidal positions -> seeded Q, K
// projections (torch.nn.MultiheadAttention's init): what an untrained layer would attend on this text.
Inputs text_inputs(const PatternsOptions& o) {
  Inputs in;
  in.tokens =
      read_tokens(o.text, o.max_tokens_opt->count() ? std::optional<int64_t>(o.max_tokens) : std::nullopt);
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  if (n > o.max_seq)
    throw UsageError(
        "--text '" + o.text + "': " + std::to_string(n) + " tokens > " + std::to_string(o.max_seq) +
        " (--max-seq; the output is heads x N^2 floats per variant); use --max-tokens N to keep the "
        "first N tokens, or raise --max-seq up to " +
        std::to_string(kHardMaxSeq));
  const int64_t d_model = o.heads * o.head_dim;
  const std::set<std::string> vocab(in.tokens.begin(), in.tokens.end());
  TokenEmbedding table = TokenEmbedding::seeded(static_cast<int64_t>(vocab.size()), d_model, o.seed);
  table.assign_words(in.tokens);
  const TokenizedText tok = table.tokenize(in.tokens);
  in.unknown_tokens = tok.unknown_count;
  PositionalSpec pos;
  pos.kind = PositionalKind::sinusoidal;
  const FloatArray x2 = apply_positional(table.lookup(tok.ids), pos);  // [L, E]
  FloatArray x({1, n, d_model});
  std::copy(x2.data.begin(), x2.data.end(), x.data.begin());
  // A seed distinct from the embedding's, so the projections are not correlated with the table.
  const MultiHeadLayer layer(random_multihead_weights(d_model, o.seed ^ 0x9e3779b97f4a7c15ULL, false),
                             o.heads);
  MultiHeadLayer::HeadsQkv qkv = layer.project(x, nullptr);
  in.q = std::move(qkv.q);
  in.k = std::move(qkv.k);
  return in;
}

// --param VARIANT.NAME=VALUE, grouped by variant (only for selected variants, so a typo is not ignored).
std::map<std::string, std::vector<std::string>> group_params(const std::vector<std::string>& params,
                                                             const std::vector<std::string>& selected) {
  std::map<std::string, std::vector<std::string>> by_variant;
  for (const auto& kv : params) {
    const std::size_t eq = kv.find('='), dot = kv.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 >= eq)
      throw UsageError("--param '" + kv + "': expected VARIANT.NAME=VALUE, e.g. sliding_window.window=4");
    const std::string variant = kv.substr(0, dot);
    if (!Registry::instance().find(variant))
      throw UsageError("--param '" + kv + "': " + Registry::instance().unknown_variant_message(variant));
    if (std::find(selected.begin(), selected.end(), variant) == selected.end())
      throw UsageError("--param '" + kv + "': variant '" + variant +
                       "' is not selected (selected: " + join(selected) + ")");
    by_variant[variant].push_back(kv.substr(dot + 1));
  }
  return by_variant;
}

// The [heads, seq, seq] weights `variant` applies to (q, k), measured through V = unit vectors. `extra`
// holds the per-token inputs the variant reads besides Q, K, V (a recurrence's g and beta), or nothing.
FloatArray measure_weights(const Attention& variant, const Problem& p, const Inputs& in,
                           const PointInputs& extra) {
  const int64_t H = p.heads, N = p.seq_q, D = p.head_dim;
  FloatArray w({H, N, N});
  FloatArray v({1, H, N, D}), out({1, H, N, D});
  for (int64_t j0 = 0; j0 < N; j0 += D) {
    std::fill(v.data.begin(), v.data.end(), 0.0f);
    const int64_t cols = std::min(D, N - j0);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < cols; ++c) v.data[static_cast<std::size_t>((h * N + j0 + c) * D + c)] = 1.0f;
    std::fill(out.data.begin(), out.data.end(), 0.0f);
    AttentionInputs ai = extra.view(p, out.ptr());
    ai.q = in.q.ptr();
    ai.k = in.k.ptr();
    ai.v = v.ptr();
    variant.run(p, ai);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t c = 0; c < cols; ++c)
          w.data[static_cast<std::size_t>((h * N + i) * N + j0 + c)] =
              out.data[static_cast<std::size_t>((h * N + i) * D + c)];
  }
  return w;
}

// One variant's pattern: its entry of patterns.json, and its weights (with the g and beta it read) when ok.
struct Measured {
  std::string name;
  FloatArray weights;
  PointInputs extra;  // the g and beta it read, written beside its weights
};

// The per-token inputs a recurrence reads, for a pattern: the sweep's own draw (fill_recurrence_inputs) for a
// point of this problem in the default regime (g = logsigmoid(N(0,1)), beta = sigmoid(N(0,1))), with --seed
// as its input seed; `entry` records their distributions, shapes and files. Nothing for other variants.
PointInputs draw_recurrence_inputs(const Problem& p, const Capabilities& caps, uint64_t seed, Json& entry) {
  SweepPoint point;
  point.problem = p;
  point.input_seed = seed;
  PointInputs extra;
  fill_recurrence_inputs(point, extra);
  if (caps.gate == Gate::none && !caps.beta && !caps.indexer) return extra;
  Json drawn = Json::object();
  if (caps.gate != Gate::none)
    drawn["g"] = {{"distribution", point.regime.g.g_formula()},
                  {"shape", caps.gate == Gate::vector ? extra.g_vector.shape : extra.g.shape},
                  {"file", p.variant + ".g.npy"}};
  if (caps.beta)
    drawn["beta"] = {{"distribution", "sigmoid(" + point.regime.beta.normal() + ")"},
                     {"shape", extra.beta.shape},
                     {"file", p.variant + ".beta.npy"}};
  if (caps.indexer)  // a lightning indexer's inputs (dsa), N(0, 1) as the sweep draws them
    for (const auto& [name, a] : {std::pair<const char*, const FloatArray*>{"index_q", &extra.index_q},
                                  {"index_k", &extra.index_k},
                                  {"index_w", &extra.index_w}})
      drawn[name] = {
          {"distribution", "N(0, 1)"}, {"shape", a->shape}, {"file", p.variant + "." + name + ".npy"}};
  drawn["seed"] = seed;
  entry["inputs"] = drawn;
  return extra;
}

// Draws `variant` on `in` under `mask` (none, causal, auto): its patterns.json entry, status ok (the weights
// appended to `results`), skipped (a problem it cannot run) or failed (it threw: the others go on).
Json draw_variant(const Attention& variant, const std::vector<std::string>& params, const PatternsOptions& o,
                  const std::string& mask, const Inputs& in, std::vector<Measured>& results) {
  const std::string name = variant.name();
  const Capabilities caps = variant.capabilities();
  Problem p = make_problem(name, parse_cli_params(variant, params));
  p.batch = 1, p.heads = o.heads, p.seq_q = p.seq_kv = in.q.shape[2], p.head_dim = o.head_dim;
  p.mask.causal = mask == "causal" || (mask == "auto" && caps.causal);
  p.validate();
  Json entry = {{"name", name},
                {"params", p.params},
                {"exact", caps.exact},
                {"causal", p.mask.causal},
                {"description", variant.description()},
                {"repro", p.repro()}};
  if (const std::string why = variant.unsupported_reasons_text(p); !why.empty()) {
    entry["status"] = "skipped";
    entry["reason"] = why;
    std::cout << name << ": skipped (" << why << ")\n";
    return entry;
  }
  PointInputs extra = draw_recurrence_inputs(p, caps, o.seed, entry);
  FloatArray w;
  try {
    w = measure_weights(variant, p, in, extra);
  } catch (const std::exception& e) {
    entry["status"] = "failed";
    entry["reason"] = e.what();
    std::cerr << "attnbench: error: " << name << ": " << e.what() << "\n";
    return entry;
  }
  const auto bad = std::count_if(w.data.begin(), w.data.end(), [](float x) { return !std::isfinite(x); });
  entry["status"] = "ok";
  entry["file"] = name + ".npy";
  entry["shape"] = w.shape;
  entry["nonfinite"] = bad;
  if (bad) std::cerr << "attnbench: warning: " << name << ": " << bad << " NaN/Inf weights\n";
  std::cout << name << ": " << w.shape_str() << " -> " << (fs::path(o.out) / (name + ".npy")).string()
            << "\n";
  results.push_back({name, std::move(w), std::move(extra)});
  return entry;
}

// Writes the folder: each file to a temporary and renamed, patterns.json (the index) last.
void write_patterns(const PatternsOptions& o, const std::string& mask, const Inputs& in,
                    const std::vector<Measured>& results, const Json& variants_json) {
  fs::create_directories(o.out);
  const fs::path dir = o.out;
  write_npy((dir / "q.npy").string(), in.q);
  write_npy((dir / "k.npy").string(), in.k);
  for (const Measured& m : results) {
    write_npy((dir / (m.name + ".npy")).string(), m.weights);
    const Capabilities caps = Registry::instance().get(m.name).capabilities();
    if (caps.gate != Gate::none)
      write_npy((dir / (m.name + ".g.npy")).string(),
                caps.gate == Gate::vector ? m.extra.g_vector : m.extra.g);
    if (caps.beta) write_npy((dir / (m.name + ".beta.npy")).string(), m.extra.beta);
    if (caps.indexer) {
      write_npy((dir / (m.name + ".index_q.npy")).string(), m.extra.index_q);
      write_npy((dir / (m.name + ".index_k.npy")).string(), m.extra.index_k);
      write_npy((dir / (m.name + ".index_w.npy")).string(), m.extra.index_w);
    }
  }
  Json meta = {{"source", o.text_opt->count() ? "text" : "seq"},
               {"seq", in.q.shape[2]},
               {"heads", o.heads},
               {"head_dim", o.head_dim},
               {"causal", mask != "none"},
               {"mask", mask},
               {"scale", 1.0 / std::sqrt(static_cast<double>(o.head_dim))},
               {"seed", o.seed},
               {"layout",
                "<variant>.npy: float32 [heads, seq_q, seq_kv], row i = the weights query i puts on "
                "each key (a recurrence's: the signed, unnormalised weight of each value in its output; its "
                "entry's inputs name the g and beta it read); q.npy, k.npy: float32 [1, heads, seq, "
                "head_dim]; each variant's entry: status ok, skipped or failed (with the reason) and whether "
                "it was drawn causal"},
               {"q", "q.npy"},
               {"k", "k.npy"},
               {"variants", variants_json}};
  if (o.text_opt->count()) {
    write_file_atomic((dir / "tokens.json").string(), Json(in.tokens).dump() + "\n");
    meta["text"] = o.text;
    meta["tokens"] = "tokens.json";
    meta["unknown_tokens"] = in.unknown_tokens;
    meta["inputs"] =
        "seeded embedding of the text's vocabulary + sinusoidal positions, seeded Q/K projections";
  } else {
    meta["std"] = o.std;
    meta["inputs"] = "seeded gaussian Q, K ~ N(0, std^2)";
  }
  write_file_atomic((dir / "patterns.json").string(), meta.dump(2) + "\n");
}

int run_patterns(const PatternsOptions& o) {
  check_options(o);
  auto& reg = Registry::instance();
  std::vector<std::string> names = o.variants;
  if (names.empty()) names = reg.names();
  std::vector<std::string> unique;
  for (const auto& n : names) {
    if (!reg.find(n)) throw UsageError("--variant '" + n + "': " + reg.unknown_variant_message(n));
    if (std::find(unique.begin(), unique.end(), n) == unique.end()) unique.push_back(n);
  }
  names = unique;
  const auto params = group_params(o.params, names);

  // Everything is computed before anything is written: a failure leaves the output folder as it was.
  const Inputs in = o.text_opt->count() ? text_inputs(o) : gaussian_inputs(o);
  const int64_t N = in.q.shape[2];
  // Every variant's weights are held until all are computed (so a failure writes nothing): bound the total.
  const double total = 4.0 * static_cast<double>(o.heads) * static_cast<double>(N) * static_cast<double>(N) *
                       static_cast<double>(names.size());
  if (total > kMaxOutputBytes)
    throw UsageError("--heads " + std::to_string(o.heads) + " x n " + std::to_string(N) + "^2 x " +
                     std::to_string(names.size()) +
                     " variants = " + std::to_string(static_cast<int64_t>(total)) + " bytes of weights > " +
                     std::to_string(static_cast<int64_t>(kMaxOutputBytes)) +
                     "; draw fewer heads, a shorter sequence or fewer --variant");
  const std::string mask = o.causal ? "causal" : o.mask;
  Json variants_json = Json::array();
  std::vector<Measured> results;
  int failed = 0;
  for (const auto& name : names) {
    const auto it = params.find(name);
    variants_json.push_back(draw_variant(
        reg.get(name), it == params.end() ? std::vector<std::string>{} : it->second, o, mask, in, results));
    // One variant's failure costs its pattern, not the others': listed with the reason, exit 1 at the end.
    failed += variants_json.back()["status"] == "failed";
  }
  write_patterns(o, mask, in, results, variants_json);
  if (failed)
    std::cerr << "attnbench: " << failed << " of " << names.size()
              << " variants failed (listed in patterns.json with the reason); the others were written\n";
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND(
    "patterns",
    "for a small n, the attention weights each variant applies, per head: <variant>.npy [heads, n, n] in "
    "--out",
    [](CLI::App& sub) {
      auto o = std::make_shared<attn::cli::PatternsOptions>();
      o->seq_opt =
          sub.add_option("--seq", o->seq, "sequence length N: seeded gaussian Q, K (see --std, --seed)");
      o->text_opt =
          sub.add_option("--text", o->text,
                         "text file: its whitespace tokens, seeded embedding + sinusoidal positions, "
                         "seeded Q/K projections");
      o->seq_opt->excludes(o->text_opt);
      sub.add_option("--variant", o->variants, "variant to draw (repeatable; default every registered one)");
      sub.add_option("--param", o->params,
                     "VARIANT.NAME=VALUE for that variant, e.g. sliding_window.window=4 (repeatable)");
      auto* causal_opt =
          sub.add_flag("--causal", o->causal, "causal mask (query i attends keys j <= i): --mask causal");
      o->mask_opt =
          sub.add_option("--mask", o->mask,
                         "none (default), causal, or auto: causal for every variant with a causal form, "
                         "unmasked for the others (each entry of patterns.json records its own)");
      causal_opt->excludes(o->mask_opt);
      sub.add_option("--heads", o->heads, "heads (default 4)");
      sub.add_option("--head-dim", o->head_dim, "head dimension (default 16)");
      sub.add_option("--seed", o->seed, "seed of Q, K (--seq) or of the embedding and projections (--text)");
      o->std_opt = sub.add_option("--std", o->std, "--seq: standard deviation of Q and K (default 1)");
      o->max_tokens_opt = sub.add_option("--max-tokens", o->max_tokens, "--text: keep the first N tokens");
      sub.add_option(
          "--max-seq", o->max_seq,
          "refuse longer inputs (default 1024, at most 4096: the output is heads x N^2 per variant)");
      sub.add_option("--out", o->out,
                     "output folder: <variant>.npy, q.npy, k.npy, patterns.json (+ tokens.json with --text)")
          ->required();
      return std::function<int()>([o] { return attn::cli::run_patterns(*o); });
    })
