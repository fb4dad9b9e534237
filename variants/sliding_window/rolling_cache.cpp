// The rolling KV cache of sliding_window's decode (rolling_cache.hpp).
#include "variants/sliding_window/rolling_cache.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/kernels/vmath.hpp"

namespace attn::sliding_window {

namespace {
// q . k in kLanes independent partial sums (a fixed order the compiler can vectorise: a single running sum
// is a serial chain it may not reorder), then summed pairwise.
constexpr int64_t kLanes = 16;
float dot(const float* q, const float* k, int64_t d) {
  float acc[kLanes] = {};
  int64_t e = 0;
  for (; e + kLanes <= d; e += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += q[e + l] * k[e + l];
  for (int64_t l = 0; e < d; ++e, ++l) acc[l] += q[e] * k[e];
  for (int64_t w = kLanes / 2; w > 0; w /= 2)
    for (int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}
}  // namespace

void attend_entries(const float* q, const float* const* k, const float* const* v, int64_t count, int64_t d,
                    float scale, float* scores, float* out, const RowLogits& logits) {
  std::fill_n(out, d, 0.0f);
  if (count == 0) return;
  for (int64_t c = 0; c < count; ++c) scores[c] = dot(q, k[c], d) * scale;
  if (logits.softcap > 0) softcap(scores, count, logits.softcap);
  // NaN if a logit is NaN: then the sink stays out of the max and the NaN reaches the output.
  float mx = row_max(scores, count);
  if (logits.sink && !std::isnan(mx)) mx = std::max(mx, *logits.sink);
  // In place: scores[c] = exp(scores[c] - mx); the sink adds its term to the denominator only.
  const float sum = exp_sub_sum(scores, count, mx) + (logits.sink ? std::exp(*logits.sink - mx) : 0.0f);
  for (int64_t c = 0; c < count; ++c) {
    const float w = scores[c];
    for (int64_t e = 0; e < d; ++e) out[e] += w * v[c][e];
  }
  const float inv = 1.0f / sum;
  for (int64_t e = 0; e < d; ++e) out[e] *= inv;
}

void decode_positions(int64_t pos, int64_t window, int64_t dilation, const std::vector<int64_t>& globals,
                      std::vector<int64_t>& out) {
  auto is_global = [&](int64_t j) { return std::binary_search(globals.begin(), globals.end(), j); };
  out.clear();
  if (is_global(pos)) {  // a global query attends every earlier key
    for (int64_t j = 0; j <= pos; ++j) out.push_back(j);
    return;
  }
  for (int64_t g : globals)
    if (g <= pos) out.push_back(g);
  for (int64_t m = std::min(window, pos / dilation); m >= 0; --m) {
    const int64_t j = pos - m * dilation;
    if (!is_global(j)) out.push_back(j);
  }
}

RollingKvCache::RollingKvCache(int64_t sinks, int64_t window, int64_t dilation, int64_t head_dim)
    : sinks_(sinks), window_(window), dilation_(dilation), span_(window * dilation + 1), d_(head_dim) {
  if (sinks < 0 || window < 0 || dilation < 1 || head_dim < 1)
    throw std::invalid_argument("RollingKvCache: sinks >= 0, window >= 0, dilation >= 1, head_dim >= 1");
  keys_.assign(static_cast<std::size_t>(capacity() * d_), 0.0f);
  values_.assign(keys_.size(), 0.0f);
  scores_.assign(static_cast<std::size_t>(capacity()), 0.0f);
  kp_.reserve(static_cast<std::size_t>(capacity()));
  vp_.reserve(static_cast<std::size_t>(capacity()));
}

void RollingKvCache::append(const float* k, const float* v) {
  const int64_t s = slot(length_++);
  std::copy_n(k, d_, keys_.data() + s * d_);
  std::copy_n(v, d_, values_.data() + s * d_);
}

void RollingKvCache::attend(const float* q, float scale, float* out, const RowLogits& logits) {
  if (length_ == 0) throw std::logic_error("RollingKvCache::attend before any append");
  const int64_t pos = length_ - 1;
  kp_.clear(), vp_.clear();
  auto add = [&](int64_t j) {
    kp_.push_back(keys_.data() + slot(j) * d_);
    vp_.push_back(values_.data() + slot(j) * d_);
  };
  // As decode_positions orders them: the sinks (a query among them attends every key up to it, all sinks),
  // then the band's non-sink positions, ascending.
  for (int64_t j = 0; j < std::min(sinks_, pos + 1); ++j) add(j);
  if (pos >= sinks_)
    for (int64_t m = std::min(window_, pos / dilation_); m >= 0; --m)
      if (pos - m * dilation_ >= sinks_) add(pos - m * dilation_);
  attend_entries(q, kp_.data(), vp_.data(), static_cast<int64_t>(kp_.size()), d_, scale, scores_.data(), out,
                 logits);
}

}  // namespace attn::sliding_window
