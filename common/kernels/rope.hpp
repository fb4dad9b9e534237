// Rotary position embedding (RoPE, Su et al. 2021), applied to Q and K before attention: the row of
// position pos has its pairs rotated by theta_i = pos * base^(-2i / d), i = 0 .. d/2 - 1:
//   (x, y) -> (x cos theta_i - y sin theta_i, x sin theta_i + y cos theta_i)
// normal mode pairs adjacent elements (x_2i, x_2i+1), GPT-J and llama.cpp's default; neox mode pairs
// (x_i, x_{i + d/2}), GPT-NeoX and Hugging Face llama. Keys sit at positions 0 .. seq_kv - 1; queries at
// 0 .. seq_q - 1, offset by seq_kv - seq_q under causal_lower_right (rope_query_offset), so a decode step's
// query is at the cache's last position. The angles and their cos/sin are computed in fp64 and rounded once;
// the rotation itself is fp32.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/interface/problem.hpp"

namespace attn {

enum class RopeMode : uint8_t { none, normal, neox };
const char* rope_mode_name(RopeMode m);  // "none", "normal", "neox"
RopeMode parse_rope_mode(const std::string& text, const std::string& where);

struct RopeSpec {
  RopeMode mode = RopeMode::none;
  double base = 10000.0;
  bool on() const { return mode != RopeMode::none; }
  std::string str() const;  // "none", "normal", "neox", with ",base=B" when base is not 10000
};

// Throws UsageError naming `where` unless base is finite and > 0 and, when on, head_dim is even.
void validate_rope(const RopeSpec& r, int64_t head_dim, const std::string& where);

inline int64_t rope_query_offset(const Problem& p) {
  return p.mask.causal_lower_right ? p.seq_kv - p.seq_q : 0;
}

// cos and sin of every (position, pair) for positions [first, first + count): what a model caches.
class RopeTable {
 public:
  RopeTable(const RopeSpec& r, int64_t dim, int64_t first, int64_t count);
  // Rotates `blocks` blocks of [seq][dim] in place, row i of a block at position offset + i (which must lie
  // in the table). Parallel over rows (TBB); a no-op for mode none.
  void apply(float* x, int64_t blocks, int64_t seq, int64_t offset) const;

 private:
  RopeMode mode_;
  int64_t dim_, first_, count_;
  std::vector<float> cos_, sin_;  // [count][dim / 2]
};

// Q and K of problem p ([batch, heads, seq_q, D] and [batch, kv_heads, seq_kv, D]) rotated in place with one
// table: keys at 0 .. seq_kv - 1, queries offset by rope_query_offset(p).
void apply_rope_qk(const RopeSpec& r, const Problem& p, float* q, float* k);

// Rotates x, `blocks` blocks of [seq, dim] (e.g. batch * heads blocks of Q), in place: row i of a
// block is at position offset + i. Parallel over blocks and rows (TBB); a no-op for mode none.
void apply_rope(const RopeSpec& r, float* x, int64_t blocks, int64_t seq, int64_t dim, int64_t offset);

// The same in fp64 (for tests and the oracle): out = RoPE(x), all in double.
void apply_rope_fp64(const RopeSpec& r, const double* x, double* out, int64_t blocks, int64_t seq,
                     int64_t dim, int64_t offset);

}  // namespace attn
