// libFuzzer target: the word2vec/GloVe text loader (TokenEmbedding::parse_text, which load_text calls) on
// arbitrary bytes. A UsageError is the expected answer to a bad file; any other exception, a crash, a
// sanitizer report or an allocation beyond -malloc_limit_mb is a finding. A table that loads must be
// consistent: [vocab + 1, width], every word found at its own row, the unknown row all zeros, finite values.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/frontends/embedding.hpp"
#include "common/support/error.hpp"

namespace {

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_word2vec: invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const attn::TokenEmbedding e = attn::TokenEmbedding::parse_text(bytes, "fuzz.txt");
    const int64_t V = e.vocab_size(), D = e.d_model();
    require(V >= 1 && D >= 1, "a loaded table is not empty");
    require(e.table().shape == std::vector<int64_t>{V + 1, D}, "table shape is [vocab + 1, width]");
    require(e.table().numel() == static_cast<std::size_t>((V + 1) * D), "table storage matches its shape");
    require(static_cast<int64_t>(e.words().size()) == V, "every row has a word");
    for (int64_t r = 0; r < V; ++r)
      require(e.find(e.words()[static_cast<std::size_t>(r)]) == r, "each word is found at its own row");
    for (std::size_t i = 0; i < e.table().numel(); ++i)
      require(std::isfinite(e.table().data[i]), "values are finite");
    for (int64_t c = 0; c < D; ++c) require(e.table().data[V * D + c] == 0.0f, "the unknown row is zeros");
    // Tokenise the vocabulary plus an unknown word and look the rows up.
    std::vector<std::string> tokens = e.words();
    tokens.push_back(std::string("\x01unknown\x02"));
    const attn::TokenizedText t = e.tokenize(tokens);
    require(t.ids.size() == tokens.size(), "one id per token");
    const attn::FloatArray rows = e.lookup(t.ids);
    require(rows.shape == std::vector<int64_t>{static_cast<int64_t>(tokens.size()), D}, "lookup shape");
  } catch (const attn::UsageError&) {
  }
  return 0;
}
