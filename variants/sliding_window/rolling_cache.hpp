// sliding_window's decode (StreamingLLM): under a causal mask with global_tokens = s the pattern is s sink
// tokens plus a window, so a decode step at position P reads only the sinks and the keys P - w·dilation ..
// P. A rolling KV cache keeps exactly those: s sink slots and a ring of w·dilation + 1 slots that the newest
// position overwrites, so its memory is fixed when it is made and stays so however long the context grows.
//
// One kernel (attend_entries) computes a query row's softmax over a list of key/value rows; the cache and the
// variant's decode path (a problem with seq_q < seq_kv under causal_lower_right, reading the rows in place
// from the full K/V) both list the sinks in ascending position, then the band in ascending position, so they
// give bitwise the same output; tests/test_sliding_window.cpp holds both against full attention under the
// window + sinks pattern.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace attn::sliding_window {

// What a row's softmax adds to its logits s_c = scale q . k_c (Problem::softcap, Problem::sinks):
//  * softcap C > 0: s_c <- C tanh(s_c / C) (0: none);
//  * sink: the query head's learned sink logit (a logit with no key, not one of the cache's sink positions),
//    one more term of the denominator whose weight takes no value (null: none): out = sum_c exp(s_c - m) v_c
//    / (exp(sink - m) + sum_c exp(s_c - m)), m = max(max_c s_c, sink).
struct RowLogits {
  float softcap = 0;
  const float* sink = nullptr;
};

// Softmax attention of one query row q (d floats) over `count` key rows k[c] and value rows v[c]: out =
// sum_c softmax(scale q . k_c)_c v_c, in fp32, entries in the order given, with `logits`' soft-capping and
// sink. `scores` holds count floats. count == 0 writes a zero row (sink or not: a row with no key is zero, as
// in the variant's other paths and naive).
void attend_entries(const float* q, const float* const* k, const float* const* v, int64_t count, int64_t d,
                    float scale, float* scores, float* out, const RowLogits& logits = {});

// The positions a decode query at position `pos` attends under the causal window + global pattern, in the
// order attend_entries takes them: the global positions <= pos (sorted `globals`), then the band pos -
// m·dilation (m = window .. 0, ascending, at least 0, not global). A global query attends every key <= pos.
// O(globals + window) whatever pos is (no per-position flags: a decode step must not touch the context).
void decode_positions(int64_t pos, int64_t window, int64_t dilation, const std::vector<int64_t>& globals,
                      std::vector<int64_t>& out);

// One (batch, K/V head)'s rolling cache of `sinks` leading positions and the last window·dilation + 1
// positions, fp32.
class RollingKvCache {
 public:
  RollingKvCache(int64_t sinks, int64_t window, int64_t dilation, int64_t head_dim);
  // The key and value rows of the next position (length()).
  void append(const float* k, const float* v);
  // Positions appended so far; the newest is length() - 1.
  int64_t length() const { return length_; }
  int64_t capacity() const { return sinks_ + span_; }
  // Bytes the cache holds (K and V slots, fp32), fixed at construction.
  std::size_t bytes() const { return (keys_.size() + values_.size()) * sizeof(float); }
  // The query row of the newest position attending the cache (its sinks and window), written to out, with
  // `logits`' soft-capping and learned sink logit (of the query's head; attend_entries).
  void attend(const float* q, float scale, float* out, const RowLogits& logits = {});

 private:
  int64_t slot(int64_t pos) const { return pos < sinks_ ? pos : sinks_ + (pos - sinks_) % span_; }
  int64_t sinks_, window_, dilation_, span_, d_;
  int64_t length_ = 0;
  std::vector<float> keys_, values_;  // capacity() x d each
  std::vector<float> scores_;
  std::vector<const float*> kp_, vp_;
};

}  // namespace attn::sliding_window
