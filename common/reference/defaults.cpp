// The defaults of the Attention interface's reference hooks: a variant that does not override them is
// checked against exact softmax attention in fp64 (reference.hpp), with the exact tolerances. They live here,
// not beside the interface, so the interface does not depend on the reference layer above it.
#include <stdexcept>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/reference/reference.hpp"

namespace attn {

void Attention::reference_forward(const Problem& p, const AttentionInputs& in, double* out) const {
  reference_attention(p, in, out);
}

void Attention::reference_forward_state(const Problem& p, const AttentionInputs& in, double* out,
                                        double* final_state) const {
  if (final_state)
    throw std::logic_error(name() + " has no final state (Capabilities::state) to reference (" + p.repro() +
                           ")");
  reference_forward(p, in, out);
}

double Attention::abs_tolerance(const Problem& p, const AttentionInputs& in) const {
  return exact_abs_tolerance(p, in, weight_dtype(p));
}

void Attention::reference_backward(const Problem& p, const AttentionInputs& in, const float* d_out,
                                   double* dq, double* dk, double* dv) const {
  reference_attention_backward(p, in, d_out, dq, dk, dv);
}

void Attention::reference_gradients(const Problem& p, const AttentionInputs& in, const float* d_out,
                                    const Fp64Gradients& g) const {
  if (g.dq && g.dk && g.dv) reference_backward(p, in, d_out, g.dq, g.dk, g.dv);
  if (p.sinks && g.d_sink_logits) {
    std::vector<double> dq(static_cast<std::size_t>(p.q_elements())),
        dk(static_cast<std::size_t>(p.kv_elements())), dv(static_cast<std::size_t>(p.v_elements()));
    reference_attention_backward(p, in, d_out, dq.data(), dk.data(), dv.data(), nullptr, g.d_sink_logits);
  }
}

GradientTolerance Attention::grad_tolerance(const Problem& p, const AttentionInputs& in,
                                            const float* d_out) const {
  return exact_grad_tolerance(p, in, d_out, weight_dtype(p));
}

}  // namespace attn
