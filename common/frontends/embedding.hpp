// Token embeddings for the "tokens" input regime: whitespace tokenisation of a text file and a
// [vocab, d_model] lookup table, drawn from a seed or read from a word2vec/GloVe text file.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/support/tensor.hpp"

namespace attn {

// The whitespace-separated tokens of a text file (split on space, tab, CR, LF, VT, FF; bytes are kept as
// they are: no case folding, no punctuation stripping, so lookup is exact). Reads at most `max_tokens`
// tokens (>= 1) when given. Throws UsageError naming the file if it cannot be read or holds no token.
std::vector<std::string> read_tokens(const std::string& path,
                                     std::optional<int64_t> max_tokens = std::nullopt);

struct TokenizedText {
  std::vector<int64_t> ids;                   // one table row per token; unknown tokens get unknown_id()
  int64_t unknown_count = 0;                  // tokens not in the vocabulary (with repeats)
  std::vector<std::string> unknown_examples;  // the first kMaxUnknownExamples distinct unknown tokens
  static constexpr std::size_t kMaxUnknownExamples = 10;
};

class TokenEmbedding {
 public:
  // vocab_size rows of d_model values drawn i.i.d. N(0, 1), torch.nn.Embedding's default init. Row r comes
  // from its own stream keyed by (seed, r), so it does not depend on vocab_size. The vocabulary starts empty:
  // assign_words() gives words rows in first-seen order.
  static TokenEmbedding seeded(int64_t vocab_size, int64_t d_model, uint64_t seed);

  // Reads a word2vec/GloVe text file: one "word v_1 ... v_D" row per line, optionally preceded by a word2vec
  // "count dim" header line (a first non-blank line of exactly two non-negative integers is taken as the
  // header, and must then match the rows). Tolerates CRLF, trailing whitespace and blank lines. Rejects,
  // naming file:line, a row with the wrong number of values, a non-numeric, non-finite or out-of-float-range
  // value, and a duplicate word (with the line of its first occurrence). Every word is assigned.
  static TokenEmbedding load_text(const std::string& path);
  // The same on the bytes of such a file; `path` names it in messages (load_text reads the file and calls
  // this; tests/fuzz/fuzz_word2vec.cpp fuzzes it).
  static TokenEmbedding parse_text(const std::string& bytes, const std::string& path);

  int64_t vocab_size() const { return vocab_size_; }
  int64_t d_model() const { return table_.shape[1]; }
  // The row unknown tokens map to: an all-zero row appended after the vocabulary (so an unknown token adds
  // nothing to its position's encoding and stays distinguishable from every real row).
  int64_t unknown_id() const { return vocab_size_; }
  // [vocab_size + 1, d_model]; the last row (unknown_id()) is zeros.
  const FloatArray& table() const { return table_; }
  // words()[r] is the word of row r; rows past words().size() are not assigned yet (seeded tables).
  const std::vector<std::string>& words() const { return words_; }
  std::optional<int64_t> find(const std::string& word) const;

  // Gives every word of `tokens` that has no row yet the next free row, in first-seen order, while free rows
  // remain; later new words stay unknown. Returns the number of words assigned. (A loaded table is full.)
  int64_t assign_words(const std::vector<std::string>& tokens);

  // Exact lookup of each token; unknown tokens are counted and mapped to unknown_id().
  TokenizedText tokenize(const std::vector<std::string>& tokens) const;

  // The rows `ids` of the table: [ids.size(), d_model]. Throws UsageError for an id outside
  // [0, unknown_id()].
  FloatArray lookup(const std::vector<int64_t>& ids) const;

 private:
  int64_t vocab_size_ = 0;
  FloatArray table_;
  std::vector<std::string> words_;
  std::unordered_map<std::string, int64_t> index_;
};

}  // namespace attn
