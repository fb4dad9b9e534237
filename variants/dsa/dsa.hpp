// DeepSeek Sparse Attention (DeepSeek-V3.2-Exp): a lightning indexer scores every (query, key) pair, each
// query keeps its top-k keys, and softmax attention runs over those keys only. This header exposes the key
// selection (the kernel's and the fp64 definition's) so tests can compare the sets themselves.
#pragma once
#include <cstdint>
#include <vector>

#include "common/interface/attention.hpp"

namespace attn::dsa {

// Limits of the parameters (ParamSpec max): key indices are stored in 32 bits.
inline constexpr int64_t kMaxTopk = int64_t{1} << 30;
inline constexpr int64_t kMaxIndexHeads = 1024;
inline constexpr int64_t kMaxIndexDim = 4096;
inline constexpr int64_t kMaxSeqKv = (int64_t{1} << 31) - 1;

// The keys each query row keeps: row r = b * seq_q + t holds count[r] key indices in ascending order at
// keys[r * capacity ...], capacity = min(topk, seq_kv).
struct Selection {
  int64_t capacity = 0;
  std::vector<int32_t> keys;
  std::vector<int32_t> count;
  const int32_t* row(int64_t r) const { return keys.data() + r * capacity; }
};

// The definition of the index score in fp64: I(t, s) = sum_h w(t, h) * max(q_I(t, h) . k_I(s), 0), summed
// in double in the order h = 0.., d = 0... The kernel rescores the keys near its threshold with this same
// function, so its decisions there are bitwise those of the definition.
double index_score_fp64(const float* index_q_row, const float* index_w_row, const float* index_k_row,
                        int64_t index_heads, int64_t index_dim);

// The fp64 definition's selection: every key the masks allow to query t is scored by index_score_fp64 and
// the row keeps the topk largest; ties (equal fp64 scores) go to the lower key index. All allowed keys when
// there are at most topk.
Selection reference_select(const Problem& p, const AttentionInputs& in);

// The kernel's selection (the fp32 indexer as blocked GEMMs, an O(n) select, the keys near the threshold
// rescored in fp64): the same sets as reference_select, for any inputs (see select_row in indexer.cpp).
// Adds the indexer's and the selection's wall time to `times` when not null.
Selection select_keys(const Problem& p, const AttentionInputs& in, PhaseTimes* times = nullptr);

// ---- Internals shared by the forward and backward (indexer.cpp) ----

// Query rows per chunk of one batch entry: the chunk's fp32 index scores ([rows, seq_kv]) stay within
// kScoreChunkFloats; fixed by the problem, never by the thread count.
int64_t chunk_rows(const Problem& p);

// Scores and selects query rows [t0, t1) of batch entry b into keys / count (rows relative to t0, stride
// capacity). `scores` holds (t1 - t0) * seq_kv floats. `key_norm_max` is max_s ||k_I(b, s)|| (key_norm_max).
void select_chunk(const Problem& p, const AttentionInputs& in, int64_t b, int64_t t0, int64_t t1,
                  double key_norm_max, float* scores, int32_t* keys, int32_t* count, PhaseTimes* times);

// max over keys s of batch entry b of the Euclidean norm of k_I(b, s), in double.
double key_norm_max(const Problem& p, const AttentionInputs& in, int64_t b);

// Bytes select_chunk allocates per thread and for its score chunk (workspace_bytes).
std::size_t select_workspace_bytes(const Problem& p, int threads);

}  // namespace attn::dsa
