// Tokenisation and token-embedding tables (seeded, or from word2vec/GloVe text files).
#include "common/frontends/embedding.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <unordered_set>

#include "common/io/npy.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"

namespace attn {
namespace {

// Largest table we allocate, in fp32 elements (4 GiB): a typo in --vocab-size or --d-model should be an
// error, not an allocation that swaps the machine out.
constexpr int64_t kMaxTableElements = int64_t{1} << 30;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_space(line[i])) ++i;
    const std::size_t start = i;
    while (i < line.size() && !is_space(line[i])) ++i;
    if (i > start) fields.push_back(line.substr(start, i - start));
  }
  return fields;
}

bool is_unsigned_integer(std::string_view s) {
  if (s.empty() || s.size() > 18) return false;  // 18 digits always fit an int64_t
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// Parses one embedding value; nullopt unless the whole field is a finite number within the float range
// (rounding a larger value to float would make it inf, i.e. a NaN source downstream).
std::optional<float> parse_value(std::string_view s) {
  // from_chars rejects a leading '+'; drop one, but not in front of a second sign ("+-1" is no number).
  if (s.size() > 1 && s[0] == '+' && s[1] != '-' && s[1] != '+') s.remove_prefix(1);
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max()) return std::nullopt;
  return static_cast<float>(v);
}

std::string shown(std::string_view s) {
  constexpr std::size_t kMaxShown = 40;  // a corrupt file can hold megabyte-long "words"
  std::string out(s.substr(0, kMaxShown));
  if (s.size() > kMaxShown) out += "...";
  return "'" + out + "'";
}

void check_table_size(int64_t rows, int64_t d_model, const std::string& what) {
  if (rows < 1 || d_model < 1 || rows > kMaxTableElements / d_model)
    throw UsageError(what + ": a table of " + std::to_string(rows) + " x " + std::to_string(d_model) +
                     " values is outside the allowed 1 .. 2^30 elements");
}

}  // namespace

std::vector<std::string> read_tokens(const std::string& path, std::optional<int64_t> max_tokens) {
  if (max_tokens && *max_tokens < 1)
    throw UsageError("max_tokens: must be >= 1, got " + std::to_string(*max_tokens));
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UsageError("text file '" + path + "': is a directory, expected a text file");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw UsageError("text file '" + path + "': cannot open for reading (" + std::strerror(errno) + ")");
  std::vector<std::string> tokens;
  std::string token;
  // operator>> splits on the classic locale's whitespace: space, \t, \n, \v, \f, \r (so CRLF is harmless).
  while ((!max_tokens || static_cast<int64_t>(tokens.size()) < *max_tokens) && in >> token)
    tokens.push_back(std::move(token));
  if (in.bad()) throw UsageError("text file '" + path + "': read error (" + std::strerror(errno) + ")");
  if (tokens.empty())
    throw UsageError("text file '" + path + "': holds no tokens (it is empty or only whitespace)");
  return tokens;
}

TokenEmbedding TokenEmbedding::seeded(int64_t vocab_size, int64_t d_model, uint64_t seed) {
  if (vocab_size < 1) throw UsageError("vocab_size: must be >= 1, got " + std::to_string(vocab_size));
  if (d_model < 1) throw UsageError("d_model: must be >= 1, got " + std::to_string(d_model));
  check_table_size(std::min(vocab_size, kMaxTableElements) + 1, d_model, "seeded embedding");  // no overflow
  TokenEmbedding e;
  e.vocab_size_ = vocab_size;
  e.table_ = FloatArray({vocab_size + 1, d_model});
  const uint64_t base = mix64(seed ^ 0x6a09e667f3bcc909ULL);  // a stream family of its own for embeddings
  for (int64_t r = 0; r < vocab_size; ++r)
    fill_normal(e.table_.ptr() + r * d_model, d_model, base + static_cast<uint64_t>(r));
  return e;
}

TokenEmbedding TokenEmbedding::load_text(const std::string& path) {
  return parse_text(read_file_bytes(path), path);
}

TokenEmbedding TokenEmbedding::parse_text(const std::string& bytes, const std::string& path) {
  const std::string where = "embeddings file '" + path + "'";
  if (bytes.find('\0') != std::string::npos)
    throw UsageError(where +
                     ": holds NUL bytes; only the text format of word2vec/GloVe is supported (convert "
                     "binary word2vec files to text)");
  TokenEmbedding e;
  AlignedVector<float> values;      // becomes the table's storage: no second copy of a large file
  std::vector<int64_t> first_line;  // line of each word, for duplicate reports
  int64_t width = -1;               // values per row, from the header or the first row
  std::optional<int64_t> header_count;
  int64_t line_no = 0;
  bool first_row = true;  // the header, if any, is the first non-blank line
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    std::size_t end = bytes.find('\n', pos);
    if (end == std::string::npos) end = bytes.size();
    const std::string_view line(bytes.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    const auto fields = split_fields(line);
    if (fields.empty()) continue;  // blank lines (e.g. a trailing one) carry nothing
    const std::string at = "embeddings file " + path + ":" + std::to_string(line_no);
    const bool may_be_header = first_row;
    first_row = false;
    if (may_be_header && fields.size() == 2 && is_unsigned_integer(fields[0]) &&
        is_unsigned_integer(fields[1])) {
      header_count = std::stoll(std::string(fields[0]));
      width = std::stoll(std::string(fields[1]));
      if (width < 1)
        throw UsageError(at + ": header declares dimension " + std::to_string(width) + ", need >= 1");
      continue;
    }
    const int64_t n_values = static_cast<int64_t>(fields.size()) - 1;
    if (width < 0) {
      if (n_values < 1) throw UsageError(at + ": word " + shown(fields[0]) + " has no values");
      width = n_values;
    }
    if (n_values != width)
      throw UsageError(at + ": word " + shown(fields[0]) + " has " + std::to_string(n_values) +
                       " values, expected " + std::to_string(width) +
                       (header_count ? " (from the header)" : " (from the first row)") +
                       "; words cannot contain whitespace");
    const std::string word(fields[0]);
    if (auto it = e.index_.find(word); it != e.index_.end())
      throw UsageError(at + ": duplicate word " + shown(word) + " (first on line " +
                       std::to_string(first_line[static_cast<std::size_t>(it->second)]) + ")");
    for (std::size_t c = 1; c < fields.size(); ++c) {
      const auto v = parse_value(fields[c]);
      if (!v)
        throw UsageError(at + ": value " + std::to_string(c) + " of word " + shown(word) + " is " +
                         shown(fields[c]) + ", expected a finite number within the float32 range");
      values.push_back(*v);
    }
    e.index_.emplace(word, static_cast<int64_t>(e.words_.size()));
    e.words_.push_back(word);
    first_line.push_back(line_no);
    check_table_size(static_cast<int64_t>(e.words_.size()) + 1, width, where);
  }
  if (e.words_.empty())
    throw UsageError(where + ": holds no embedding rows (expected 'word v_1 ... v_D' lines)");
  if (header_count && *header_count != static_cast<int64_t>(e.words_.size()))
    throw UsageError(where + ": the header declares " + std::to_string(*header_count) +
                     " words but the file has " + std::to_string(e.words_.size()) + " rows");
  e.vocab_size_ = static_cast<int64_t>(e.words_.size());
  values.resize(values.size() + static_cast<std::size_t>(width), 0.0f);  // the unknown row
  e.table_.shape = {e.vocab_size_ + 1, width};
  e.table_.data = std::move(values);
  return e;
}

std::optional<int64_t> TokenEmbedding::find(const std::string& word) const {
  if (auto it = index_.find(word); it != index_.end()) return it->second;
  return std::nullopt;
}

int64_t TokenEmbedding::assign_words(const std::vector<std::string>& tokens) {
  int64_t assigned = 0;
  for (const auto& t : tokens) {
    if (static_cast<int64_t>(words_.size()) >= vocab_size_) break;
    if (index_.contains(t)) continue;
    index_.emplace(t, static_cast<int64_t>(words_.size()));
    words_.push_back(t);
    ++assigned;
  }
  return assigned;
}

TokenizedText TokenEmbedding::tokenize(const std::vector<std::string>& tokens) const {
  TokenizedText out;
  out.ids.reserve(tokens.size());
  std::unordered_set<std::string> seen_unknown;
  for (const auto& t : tokens) {
    if (auto id = find(t)) {
      out.ids.push_back(*id);
      continue;
    }
    out.ids.push_back(unknown_id());
    ++out.unknown_count;
    if (out.unknown_examples.size() < TokenizedText::kMaxUnknownExamples && seen_unknown.insert(t).second)
      out.unknown_examples.push_back(t);
  }
  return out;
}

FloatArray TokenEmbedding::lookup(const std::vector<int64_t>& ids) const {
  const int64_t d = d_model();
  FloatArray out({static_cast<int64_t>(ids.size()), d});
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > unknown_id())
      throw UsageError("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                       ": outside the table's rows [0, " + std::to_string(unknown_id()) + "]");
    std::copy_n(table_.ptr() + ids[i] * d, d, out.ptr() + static_cast<int64_t>(i) * d);
  }
  return out;
}

}  // namespace attn
