// Positional encodings (sinusoidal, learned, none, rope) and how they combine with token embeddings (add,
// concat). rope adds nothing to the embeddings: rotary positions are applied to each head's q and k inside
// the attention layer (MultiHeadCall::rope, `attnbench layer --rope`), so the embedding step passes through.
#pragma once
#include <cstdint>
#include <string>

#include "common/support/tensor.hpp"

namespace attn {

enum class PositionalKind { none, sinusoidal, learned, rope };
enum class PositionalCombine { add, concat };

// "none" | "sinusoidal" | "learned" | "rope"; "add" | "concat". Throw UsageError naming `where`, the value
// and the allowed values.
PositionalKind parse_positional_kind(const std::string& text, const std::string& where);
PositionalCombine parse_positional_combine(const std::string& text, const std::string& where);
std::string positional_kind_name(PositionalKind kind);
std::string positional_combine_name(PositionalCombine combine);

// [length, dim] with PE(t, 2i) = sin(t / 10000^(2i/dim)) and PE(t, 2i+1) = cos(t / 10000^(2i/dim)),
// t = 0 .. length-1, computed in double and rounded once to float. Odd dim: the last column is the sine of
// the pair i = (dim-1)/2 and its cosine is dropped (the first `dim` columns of the pattern, as torch-style
// implementations that fill pe[:, 0::2] and pe[:, 1::2] do); the shift property PE(t+k) = M_k PE(t) then
// holds for every column but that last one.
FloatArray sinusoidal_encoding(int64_t length, int64_t dim);

// A learned table drawn i.i.d. N(0, 1) (torch.nn.Embedding's default init, as a learned positional table is
// an nn.Embedding(max_len, dim)). Rows are drawn in order from one stream, so row t does not depend on
// `length`: a longer table extends a shorter one.
FloatArray seeded_learned_encoding(int64_t length, int64_t dim, uint64_t seed);

// A learned table from a .npy file: float32/64 [max_len, dim], every value finite (UsageError naming the
// file otherwise).
FloatArray load_learned_encoding(const std::string& path);

// How to add positions to an [L, D] embedding.
struct PositionalSpec {
  PositionalKind kind = PositionalKind::none;
  PositionalCombine combine = PositionalCombine::add;
  std::string learned_path{};  // learned: the .npy table; empty = seeded_learned_encoding(L, D, learned_seed)
  uint64_t learned_seed = 0;
};

// embedded [L, D] -> [L, D] (add, or kind none or rope: unchanged) or [L, D + P] (concat, P the encoding
// width: D for sinusoidal and seeded learned tables, the file's width for a loaded one). Throws UsageError if
// a loaded table has fewer than L rows or, for add, a width other than D.
FloatArray apply_positional(const FloatArray& embedded, const PositionalSpec& spec);

// The combination step alone: embedded [L, D], encoding [L', P] with L' >= L (its first L rows are used).
// `where` names the encoding's source in errors.
FloatArray combine_positional(const FloatArray& embedded, const FloatArray& encoding,
                              PositionalCombine combine, const std::string& where);

}  // namespace attn
