// `attnbench drift`: how far the hidden states of a stack of pre-norm transformer blocks drift from an fp64
// reference when the attention core is a given variant computed in fp32. The model (weights fixed by a seed
// and the layer index, the same for every variant), its fp32 forward with any registered variant as the core,
// the same stack entirely in fp64 with exact softmax attention, and the per-layer comparison.
#pragma once
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/frontends/multihead.hpp"
#include "common/interface/attention.hpp"
#include "common/support/tensor.hpp"

namespace attn {

// Sizes `attnbench drift` accepts: the fp64 reference keeps every layer's [tokens, d_model] state, the fp32
// variant its own, and exact attention n^2 scores per head; beyond these a run is minutes and gigabytes.
struct DriftLimits {
  static constexpr int64_t kMaxTokens = 4096;
  static constexpr int64_t kMaxDModel = 4096;
  static constexpr int64_t kMaxElements = int64_t{1} << 21;  // tokens x d_model of one hidden state
  static constexpr int64_t kMaxLayers = 64;
};

// One pre-norm block (weights in the torch.nn.Linear layout [out, in]):
//   x <- x + MHA(LN(x))                      (MultiHeadLayer: W_q, W_k, W_v, W_o with biases)
//   x <- x + W2 GELU(W1 LN(x) + b1) + b2     (d -> 4d -> d; GELU(z) = z/2 (1 + erf(z / sqrt 2)), the exact
//   form)
// LN has no affine part (gamma = 1, beta = 0, torch's init), eps = 1e-5. Init (torch's defaults, so
// activations stay O(1)): MHA as random_multihead_weights(d, .., with_bias = true); W1, b1 uniform in
// [-1/sqrt(d), 1/sqrt(d)] and W2, b2 in [-1/sqrt(4d), 1/sqrt(4d)] (nn.Linear: 1/sqrt(fan_in)).
struct DriftBlockWeights {
  MultiHeadWeights attention;
  FloatArray w1, b1;  // [4d, d], [4d]
  FloatArray w2, b2;  // [d, 4d], [d]
};

// Layer `layer` (1-based) of the stack seeded by `seed`: a function of (seed, layer, d_model) only.
DriftBlockWeights drift_block_weights(int64_t d_model, uint64_t seed, int64_t layer);

constexpr double kDriftLayerNormEps = 1e-5;
constexpr int64_t kDriftFfnMultiplier = 4;

// The hidden states h_0 .. h_L, each [tokens, d_model]. h_0 = token rows + sinusoidal positions.
using DriftStates = std::vector<DoubleArray>;

class DriftModel {
 public:
  // token_rows: [tokens, d_model], the embedding table rows of the text's tokens (fp32 values; the reference
  // widens them exactly). Throws UsageError naming the size if it exceeds DriftLimits, heads does not divide
  // d_model or layers < 1.
  DriftModel(FloatArray token_rows, int64_t heads, int64_t layers, uint64_t seed, bool causal);

  int64_t tokens() const { return rows_.shape[0]; }
  int64_t d_model() const { return rows_.shape[1]; }
  int64_t heads() const { return heads_; }
  int64_t layers() const { return static_cast<int64_t>(blocks_.size()); }
  bool causal() const { return causal_; }

  // The reference: the same stack in fp64 (LayerNorm, GEMMs, exact softmax attention, GELU), positions in
  // fp64 (not rounded to fp32). Deterministic: parallel over work units fixed by the sizes, BLAS
  // single-threaded inside, so 1 and 2 threads give bitwise equal states. Throws std::runtime_error if a
  // state is non-finite.
  DriftStates reference() const;

  // The fp32 stack with `variant` (params resolved by the caller; empty params = defaults) as the attention
  // core; h_0 = fl(rows + fl(positions)) as `attnbench embed` makes it. Each state is checked as it is made:
  // NaN/Inf throws DriftNonFinite naming the variant, the layer and the sub-step. `on_state(l, h_l)` sees
  // each state [tokens, d_model] (l = 0 .. L).
  template <class OnState>
  void forward(const std::string& variant, const Json& params, OnState&& on_state) const;

  // The MultiHeadLayer core problem the variant must support (for unsupported_reasons_text).
  Problem core_problem(const std::string& variant, const Json& params) const;

 private:
  void forward_impl(const std::string& variant, const Json& params,
                    const std::function<void(int64_t, const FloatArray&)>& on_state) const;

  FloatArray rows_;
  int64_t heads_;
  uint64_t seed_;
  bool causal_;
  std::vector<DriftBlockWeights> blocks_;
  std::vector<MultiHeadLayer> attention_;
};

template <class OnState>
void DriftModel::forward(const std::string& variant, const Json& params, OnState&& on_state) const {
  forward_impl(variant, params, std::function<void(int64_t, const FloatArray&)>(on_state));
}

// A non-finite value in a hidden state of the fp32 stack: which variant, which layer, which step.
class DriftNonFinite : public std::runtime_error {
 public:
  DriftNonFinite(std::string variant, int64_t layer, const std::string& what)
      : std::runtime_error(what), variant_(std::move(variant)), layer_(layer) {}
  const std::string& variant() const { return variant_; }
  int64_t layer() const { return layer_; }

 private:
  std::string variant_;
  int64_t layer_;
};

struct DriftLayerMetrics {
  int64_t layer = 0;
  double rel_l2 = 0;            // ||h - h_ref||_F / ||h_ref||_F
  double mean_cosine = 1;       // mean over tokens of cos(h_t, h_ref_t)
  double one_minus_cosine = 0;  // mean over tokens of 1 - cos, computed without cancellation
  double max_abs_err = 0;       // max |h - h_ref|
  double ref_rms = 0;           // ||h_ref||_F / sqrt(numel): the scale of the state
};

// Compares one fp32 state with the reference's (the same shape; both finite).
DriftLayerMetrics drift_compare(int64_t layer, const FloatArray& got, const DoubleArray& want);

}  // namespace attn
