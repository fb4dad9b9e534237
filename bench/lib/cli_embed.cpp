// `attnbench embed`: tokenise a text file, look the tokens up in an embedding table (word2vec/GloVe text or
// seeded), add or concatenate a positional encoding, and write X.npy (float32, [1, L, E]).
#include <iostream>

#include "bench/lib/command.hpp"
#include "common/frontends/embedding.hpp"
#include "common/frontends/positional.hpp"
#include "common/io/npy.hpp"
#include "common/support/error.hpp"

namespace attn::cli {
namespace {

struct EmbedOptions {
  std::string text, embeddings, positional = "sinusoidal", combine = "add", positional_npy, out;
  int64_t vocab_size = 0, d_model = 0, max_tokens = 0;
  uint64_t seed = 0, positional_seed = 0;
  // Presence of the options whose absence means something (CLI11 keeps counts on the Option objects).
  CLI::Option *embeddings_opt = nullptr, *vocab_opt = nullptr, *d_model_opt = nullptr, *seed_opt = nullptr,
              *max_tokens_opt = nullptr, *positional_npy_opt = nullptr, *positional_seed_opt = nullptr,
              *combine_opt = nullptr;
};

// Rejects inconsistent option combinations, naming the options, before any file is read.
void check_options(const EmbedOptions& o, PositionalKind kind) {
  const bool seeded = o.vocab_opt->count() || o.d_model_opt->count() || o.seed_opt->count();
  if (o.embeddings_opt->count() && seeded)
    throw UsageError(
        "--embeddings '" + o.embeddings +
        "' cannot be combined with --vocab-size/--d-model/--seed (a loaded table has its own size); "
        "give either --embeddings VEC.txt or --vocab-size N --d-model D --seed S");
  if (!o.embeddings_opt->count() && !seeded)
    throw UsageError("no embedding table: give --embeddings VEC.txt or --vocab-size N --d-model D --seed S");
  if (seeded) {
    for (const CLI::Option* opt : {o.vocab_opt, o.d_model_opt, o.seed_opt})
      if (!opt->count())
        throw UsageError("missing " + opt->get_name() +
                         ": a seeded table needs all of --vocab-size N --d-model D --seed S");
    if (o.vocab_size < 1) throw UsageError("--vocab-size " + std::to_string(o.vocab_size) + ": must be >= 1");
    if (o.d_model < 1) throw UsageError("--d-model " + std::to_string(o.d_model) + ": must be >= 1");
  }
  if (o.max_tokens_opt->count() && o.max_tokens < 1)
    throw UsageError("--max-tokens " + std::to_string(o.max_tokens) + ": must be >= 1");
  if (kind != PositionalKind::learned && (o.positional_npy_opt->count() || o.positional_seed_opt->count()))
    throw UsageError(std::string(o.positional_npy_opt->count() ? "--positional-npy" : "--positional-seed") +
                     " applies to --positional learned only (got --positional " + o.positional + ")");
  if (o.positional_npy_opt->count() && o.positional_seed_opt->count())
    throw UsageError(
        "--positional-npy '" + o.positional_npy +
        "' and --positional-seed both given: a learned table is read from the file or drawn from the "
        "seed, not both");
  if ((kind == PositionalKind::none || kind == PositionalKind::rope) && o.combine_opt->count())
    throw UsageError(
        "--combine " + o.combine + ": there is nothing to combine with --positional " + o.positional +
        (kind == PositionalKind::rope ? " (RoPE adds no encoding; it rotates q and k in the layer)" : ""));
}

int run_embed(const EmbedOptions& o) {
  PositionalSpec spec;
  spec.kind = parse_positional_kind(o.positional, "--positional");
  spec.combine = parse_positional_combine(o.combine, "--combine");
  spec.learned_path = o.positional_npy;
  spec.learned_seed = o.positional_seed;
  check_options(o, spec.kind);
  const std::vector<std::string> tokens =
      read_tokens(o.text, o.max_tokens_opt->count() ? std::optional<int64_t>(o.max_tokens) : std::nullopt);
  TokenEmbedding table = o.embeddings_opt->count() ? TokenEmbedding::load_text(o.embeddings)
                                                   : TokenEmbedding::seeded(o.vocab_size, o.d_model, o.seed);
  table.assign_words(tokens);  // seeded tables: the text's words in first-seen order; loaded tables are full
  const TokenizedText tok = table.tokenize(tokens);
  const FloatArray x = apply_positional(table.lookup(tok.ids), spec);
  const int64_t L = x.shape[0], E = x.shape[1];
  FloatArray out({1, L, E});
  std::copy(x.data.begin(), x.data.end(), out.data.begin());
  write_npy(o.out, out);
  if (tok.unknown_count == L)
    std::cerr << "attnbench: warning: none of the " << L << " tokens of '" << o.text
              << "' is in the vocabulary; every row is the zero unknown row plus its position\n";
  Json report = {{"text", o.text},
                 {"out", o.out},
                 {"shape", out.shape},
                 {"tokens", L},
                 {"unknown_tokens", tok.unknown_count},
                 {"unknown_examples", tok.unknown_examples},
                 {"unknown_row", table.unknown_id()},
                 {"vocab_size", table.vocab_size()},
                 {"words_assigned", table.words().size()},
                 {"d_model", table.d_model()},
                 {"positional", positional_kind_name(spec.kind)},
                 {"combine", positional_combine_name(spec.combine)}};
  if (spec.kind == PositionalKind::rope) {
    report["combine"] = "none";
    report["positional_applied"] =
        "in the layer: no encoding is added here; rotate q and k with attnbench layer --rope normal|neox";
  }
  std::cout << report.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND(
    "embed",
    "tokenise a text file, embed the tokens (word2vec/GloVe text or seeded table) plus a positional "
    "encoding; "
    "writes X.npy [1, L, E] and prints a JSON report (token and unknown-token counts)",
    [](CLI::App& sub) {
      auto o = std::make_shared<attn::cli::EmbedOptions>();
      sub.add_option("--text", o->text,
                     "text file; tokens are whitespace-separated and looked up exactly (no case folding)")
          ->required();
      o->embeddings_opt = sub.add_option("--embeddings", o->embeddings,
                                         "word2vec/GloVe text file ('word v_1 .. v_D' lines, optional 'count "
                                         "dim' header); unknown tokens map "
                                         "to an all-zero row");
      o->vocab_opt =
          sub.add_option("--vocab-size", o->vocab_size,
                         "seeded table: rows; the text's words take rows in first-seen order, words "
                         "beyond the table are unknown (all-zero row)");
      o->d_model_opt = sub.add_option("--d-model", o->d_model, "seeded table: width D");
      o->seed_opt = sub.add_option("--seed", o->seed, "seeded table: seed (values i.i.d. N(0, 1))");
      sub.add_option(
          "--positional", o->positional,
          "positional encoding: sinusoidal (default; PE(t,2i)=sin(t/10000^(2i/D)), PE(t,2i+1)=cos(..), "
          "t from 0), learned, none, rope (nothing added: RoPE is applied in the layer, attnbench layer "
          "--rope)");
      sub.add_option("--combine", o->combine, "add (default; E = D) or concat (E = D + encoding width)");
      o->positional_npy_opt =
          sub.add_option("--positional-npy", o->positional_npy,
                         "learned: table .npy [max_len, P] (max_len >= tokens; P = D for add)");
      o->positional_seed_opt =
          sub.add_option("--positional-seed", o->positional_seed,
                         "learned without --positional-npy: seed of an [L, D] N(0, 1) table "
                         "(default 0)");
      o->max_tokens_opt =
          sub.add_option("--max-tokens", o->max_tokens, "use only the first N tokens (N >= 1)");
      o->combine_opt = sub.get_option("--combine");
      sub.add_option("--out", o->out, "output .npy, float32 [1, L, E] (written only on success)")->required();
      return std::function<int()>([o] { return attn::cli::run_embed(*o); });
    })
