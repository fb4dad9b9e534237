// The checks of one attention call on caller-given tensors, shared by `attnbench eval` (tensors from .npy
// files) and the Python module's forward() and reference() (numpy arrays): the same rules and the same
// messages. Each message names the input as the caller calls it: `what` is "--k 'k.npy'" for the CLI (option
// and file) and "k" for the module (the argument).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/attention.hpp"

namespace attn {

// Refuses a storage dtype or bias the variant cannot run (UsageError with the variant's own reasons and the
// variants that can). `dtype_text` and `alibi_text` name the options ("--dtype bf16", "--alibi").
void check_storage(const Attention& variant, const Json& params, DType dtype, Bias bias,
                   const std::string& dtype_text, const std::string& alibi_text);

// A rank-4 tensor with every extent >= 1, or a UsageError naming `what`, the shape and `layout`.
void require_rank4(const std::string& what, const std::vector<int64_t>& shape, const std::string& layout);

// K must be [Q's batch, kv_heads, seq_kv, Q's head_dim] with kv_heads dividing Q's heads, and V must have K's
// shape; otherwise a UsageError naming both inputs, both shapes and what is allowed.
void check_kv_shapes(const std::string& q_what, const std::vector<int64_t>& q, const std::string& k_what,
                     const std::vector<int64_t>& k, const std::string& v_what, const std::vector<int64_t>& v);

// Sets the problem's sizes from the checked shapes of Q [B, H, Lq, D] and K [B, Hkv, Lkv, D].
void set_shape(Problem& p, const std::vector<int64_t>& q, const std::vector<int64_t>& k);

// UsageError unless `got` is `want`: "WHAT: shape [..] does not match [..] MEANING".
void require_shape(const std::string& what, const std::vector<int64_t>& got, const std::vector<int64_t>& want,
                   const std::string& meaning);

// The ALiBi slopes as float32, one per query head: `values` must be [p.heads] finite float32 values
// (UsageError naming `what`; `q_option` names where heads came from, "--q").
std::vector<float> checked_alibi_slopes(const std::string& what, const std::string& q_option,
                                        const std::vector<int64_t>& shape, const double* values,
                                        const Problem& p);

// Problem::validate, then the variant's unsupported reasons (NotSupported: "ID: reasons"), then memory: the
// output, the workspace at `threads` threads and (with_reference) an fp64 reference must fit in physical
// memory (NotSupported naming the bytes). backward: the backward's reasons and memory too (a training step:
// O, the saved state, dO, dQ, dK, dV, the larger workspace, and with_reference the fp64 gradients).
void check_runnable(const Attention& variant, const Problem& p, int threads, bool with_reference,
                    bool backward = false);

// Non-finite values in the inputs as the variant read them (bf16 / fp16 storage counted as stored: rounding
// to fp16 turns |x| >= 65520 into Inf) and in the output `in.out` written by a run of `p`.
struct NonfiniteCounts {
  int64_t q = 0, k = 0, v = 0, out = 0;
  int64_t inputs() const { return q + k + v; }
};
NonfiniteCounts count_nonfinite_values(const Problem& p, const AttentionInputs& in);
// "the output holds N NaN/Inf values (the inputs held M)" when the output holds any, else "".
std::string nonfinite_output_note(const NonfiniteCounts& counts);

}  // namespace attn
