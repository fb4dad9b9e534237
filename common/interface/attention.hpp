// The Attention interface every variant implements, and the registry that finds them.
// Adding a variant: one folder under variants/, one class, one ATTN_REGISTER_VARIANT line
// (variants/README.md).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/interface/params.hpp"
#include "common/interface/problem.hpp"

namespace attn {

// The decay gate a recurrence reads (Capabilities::gate): none; scalar, g [batch, heads, seq] (one decay
// exp(g) per token and head); vector, g [batch, heads, seq, head_dim] (one per key channel). Every g <= 0.
enum class Gate : uint8_t { none, scalar, vector };
const char* gate_name(Gate g);  // "none", "scalar", "vector"

struct Capabilities {
  bool exact = false;   // computes softmax attention exactly (up to fp32 rounding)
  bool causal = false;  // supports the causal mask
  // supports causal_lower_right (j <= i + seq_kv - seq_q) and both causal kinds together (causal_offset in
  // mask.hpp): a variant applying causal as "j > i" only must leave it false.
  bool causal_lower_right = false;
  // supports grouped-query attention (kv_heads < heads): K and V hold kv_heads heads, and query head h reads
  // K/V head p.kv_head_of(h). A variant indexing K/V by the query head must leave it false.
  bool gqa = false;
  bool boolean_mask = false;  // supports an explicit [seq_q, seq_kv] mask
  bool key_padding = false;   // supports a [batch, seq_kv] key-padding mask
  bool cross = false;         // supports seq_q != seq_kv (cross-attention)
  bool dropout = false;       // supports dropout on the attention weights (counter-based, see dropout.hpp)
  // Storage precisions taken besides fp32 (Problem::dtype; Q, K, V in AttentionInputs::q16, k16, v16).
  bool bf16 = false;
  bool fp16 = false;
  bool alibi = false;  // supports Bias::alibi (common/kernels/alibi.hpp), with default or given slopes
  // Permuting keys and values together leaves the output unchanged, and permuting queries permutes it
  // (true of any attention whose pattern does not depend on positions).
  bool permutation_equivariant = false;
  // The exact baseline every other variant is compared with (exactly one registered variant sets it): the
  // default of commands that take one variant (`attnbench layer`, the multi-head layer).
  bool baseline = false;
  // Implements the backward pass (run_backward): dQ, dK, dV of its own definition, i.e. the gradient of
  // reference_forward, for every problem run() accepts. Without it the harness skips backward points with the
  // reason.
  bool backward = false;
  // ---- Inputs beyond Q, K, V (the 2026 roster) ----
  // Learned sink logits (Problem::sinks; AttentionInputs::sink_logits, one per query head): every row's
  // softmax gets one more logit whose weight is dropped (gpt-oss).
  bool sinks = false;
  // Logit soft-capping (Problem::softcap = C): s <- C tanh(s / C) after the scale, before bias and masks.
  bool softcap = false;
  // A gated or delta-rule linear recurrence (not softmax attention), computed causally over one sequence:
  // it needs the causal mask and seq_q == seq_kv, and reads these per-token inputs:
  Gate gate = Gate::none;  // g (AttentionInputs::g): see Gate
  bool beta = false;       // beta [batch, heads, seq], each in (0, 1]
  // Takes a starting state (Problem::initial_state, AttentionInputs::initial_state) and can write the final
  // one (AttentionInputs::final_state), both [batch, heads, head_dim, d_v] (d_k x d_v per head).
  bool state = false;
  // Decode shapes: seq_q < seq_kv under causal_lower_right alone (the last seq_q positions' queries against
  // the context, a KV-cache decode step) without general cross-attention (Capabilities::cross). A
  // recurrence needs Problem::initial_state there: the state after the first seq_kv - seq_q tokens, of
  // which it then reads no K, V, g or beta (O(d_k d_v) per token and head whatever the context); without
  // one it refuses the problem (not_supported_reasons). sliding_window reads only its rolling cache's
  // entries (sinks and the window; variants/sliding_window/rolling_cache.hpp).
  bool decode = false;
  // Not softmax attention: the exact baseline of its rows' `accuracy` is its own fp64 definition
  // (reference_forward), and the distance from exact softmax attention is an informative second figure
  // (`accuracy_vs_softmax`). The recurrences set it; approximations of softmax attention do not.
  bool own_definition = false;
  // Takes V (and so the output) of another width than Q and K (Problem::v_head_dim, d_v != d_k): V is
  // [batch, kv_heads, seq_kv, d_v], the output and dO [batch, heads, seq_q, d_v], a state d_k x d_v.
  bool value_dim = false;
  // Implements block partials (init_block_state, accumulate_block, finish_block_state): attention of a
  // query block against key blocks one at a time, merged into a running state, for sequence-parallel callers
  // (attnbench_mpi's ring attention runs any variant that claims it).
  bool block_partials = false;
  // Reads K and V in place from a reserved cache (AttentionInputs::kv_capacity) and V rows with a stride
  // (AttentionInputs::v_row_stride), fp32 forward.
  bool strided_kv = false;
  // Reads a lightning indexer's inputs (DeepSeek Sparse Attention, variants/dsa): AttentionInputs::index_q,
  // index_k, index_w, shaped by the variant's integer parameters "index_heads" and "index_dim"
  // (IndexerShape). The harness draws them for such a variant as it draws g and beta for a recurrence.
  bool indexer = false;
};

Json capabilities_json(const Capabilities& caps);

// Every registered variant, by name: name, description, capabilities (capabilities_json) and params (each
// param_spec_json), as `attnbench list --json` prints them and the Python module's variants() returns them.
Json variants_json();

// Wall seconds of the named phases of one call (e.g. dsa's "indexer", "selection", "attention"), written by
// a variant that has phases when AttentionInputs::phase_times is not null. add() accumulates by name (a
// name must be a string literal: it is kept as a pointer); at most kMax phases.
struct PhaseTimes {
  static constexpr int kMax = 8;
  int count = 0;
  const char* names[kMax] = {};
  double seconds[kMax] = {};
  void add(const char* name, double s) {
    for (int i = 0; i < count; ++i)
      if (std::string_view(names[i]) == name) {
        seconds[i] += s;
        return;
      }
    if (count < kMax) names[count] = name, seconds[count++] = s;
  }
};

// Pointers to contiguous tensors. q: [batch, heads, seq_q, head_dim], out: [batch, heads, seq_q, d_v]; k:
// [batch, kv_heads, seq_kv, head_dim], v: [batch, kv_heads, seq_kv, d_v] (kv_heads = heads unless
// grouped-query, Problem::num_kv_heads; d_v = Problem::value_dim(), head_dim unless Capabilities::value_dim).
// Q, K and V are fp32 in q, k, v when problem.dtype is fp32, and the 16-bit patterns of bf16 / fp16 values in
// q16, k16, v16 otherwise (common/interface/half.hpp; the other three are then unused). out is always fp32.
// mask: [seq_q, seq_kv] (nonzero = may attend), required iff problem.mask.boolean. key_padding: [batch,
// seq_kv] (nonzero = padded), required iff problem.mask.key_padding. alibi_slopes: [heads], the ALiBi slope
// of each query head; null means the default slopes (alibi_default_slopes); read only when problem.bias is
// alibi.
struct AttentionInputs {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const uint8_t* mask = nullptr;
  const uint8_t* key_padding = nullptr;
  float* out = nullptr;
  const uint16_t* q16 = nullptr;
  const uint16_t* k16 = nullptr;
  const uint16_t* v16 = nullptr;
  const float* alibi_slopes = nullptr;
  // Recurrences (Capabilities::gate, beta, state) and sinks: g ([batch, heads, seq] or [.., head_dim]), beta
  // ([batch, heads, seq]), sink_logits ([heads]), initial_state (read when Problem::initial_state) and
  // final_state (written when not null), [batch, heads, head_dim, d_v]. All fp32.
  const float* g = nullptr;
  const float* beta = nullptr;
  const float* sink_logits = nullptr;
  const float* initial_state = nullptr;
  float* final_state = nullptr;
  // ---- A reserved KV cache read in place (Capabilities::strided_kv; appended in plugin ABI 3) ----
  // kv_capacity: rows each [.., seq, ..] block of K and V holds in memory (a cache reserved for kv_capacity
  // tokens of which the problem's seq_kv are filled): K/V block kb (Problem::kv_block) starts at row
  // kb * kv_capacity. 0 means seq_kv (contiguous blocks).
  // v_row_stride: floats from one V row to the next, >= d_v; 0 means d_v. v may point into K's rows (DeepSeek
  // MLA's absorbed form: V is the first 512 columns of the 576-wide K = [latent | k_pe], v == k,
  // v_row_stride == head_dim).
  // fp32 forward only (Attention::run and run_saving refuse them otherwise); a variant without
  // Capabilities::strided_kv is refused by name when either is not its default.
  int64_t kv_capacity = 0;
  int64_t v_row_stride = 0;
  // A lightning indexer's inputs (Capabilities::indexer; shapes from IndexerShape, all fp32, contiguous):
  // index_q [batch, seq_q, index_heads, index_dim] (index queries per query token), index_k [batch, seq_kv,
  // index_dim] (one index key per key token, shared by every head: MQA) and index_w [batch, seq_q,
  // index_heads] (the weight of each index head per query token, any scaling folded in).
  const float* index_q = nullptr;
  const float* index_k = nullptr;
  const float* index_w = nullptr;
  // Optional: where a variant that splits its work into phases (PhaseTimes) adds each phase's wall time of
  // this call; null: not wanted. The runner passes one for its timed calls and reports the medians.
  PhaseTimes* phase_times = nullptr;
};

// The index tensors' sizes of a variant with Capabilities::indexer: its resolved "index_heads" and
// "index_dim" parameters (std::logic_error when it lacks them).
struct IndexerShape {
  int64_t heads = 0, dim = 0;
  explicit IndexerShape(const Problem& p)
      : heads(p.param_int("index_heads")), dim(p.param_int("index_dim")) {}
  // Element counts, saturating at INT64_MAX: size estimates of problems far too large to run stay defined.
  int64_t q_elements(const Problem& p) const {
    return product(product(p.batch, p.seq_q), product(heads, dim));
  }
  int64_t k_elements(const Problem& p) const { return product(product(p.batch, p.seq_kv), dim); }
  int64_t w_elements(const Problem& p) const { return product(product(p.batch, p.seq_q), heads); }
  static int64_t product(int64_t a, int64_t b) {
    int64_t r = 0;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
  }
};

// The tensors of one backward call (Attention::run_backward). out: the forward's output O and saved: the
// state the forward kept for the backward (saved_floats(p) floats, written by run_saving; null when the
// variant keeps none), both from a forward on the same inputs; d_out: dL/dO, [batch, heads, seq_q, d_v].
// The gradients are written to dq (Q's shape) and dk, dv (K's and V's shapes: [batch, kv_heads, seq_kv,
// head_dim] and [.., d_v]; with grouped-query heads each sums over the query heads of its group). All fp32,
// contiguous.
struct GradientArgs {
  const float* out = nullptr;
  const float* saved = nullptr;
  const float* d_out = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  // Where they exist (the variant reads g, beta, sink logits, an initial state), their gradients, in their
  // shapes; null: not wanted.
  float* dg = nullptr;
  float* dbeta = nullptr;
  float* d_sink_logits = nullptr;
  float* d_initial_state = nullptr;
};

// The running state of a query block's rows [batch][heads][seq_q] under block partials: per row m and l,
// and o ([rows][d_v]). What they hold is the variant's (for online softmax: the running max, the sum of
// exponentials and the unnormalised output); callers only allocate them and pass them back.
struct BlockState {
  float* m = nullptr;
  float* l = nullptr;
  float* o = nullptr;
};

// Bounds on |grad_fp32 - grad_fp64| per gradient tensor (Attention::grad_tolerance); 0 for a gradient the
// problem does not have.
struct GradientTolerance {
  double dq = 0, dk = 0, dv = 0;
  double dg = 0, dbeta = 0, d_sink_logits = 0, d_initial_state = 0;
};

// The fp64 gradients reference_gradients writes (null: not wanted), shaped as GradientArgs' fp32 ones.
struct Fp64Gradients {
  double* dq = nullptr;
  double* dk = nullptr;
  double* dv = nullptr;
  double* dg = nullptr;
  double* dbeta = nullptr;
  double* d_sink_logits = nullptr;
  double* d_initial_state = nullptr;
};

// Bytes of one call, from the problem's sizes: every sum saturates at SIZE_MAX instead of wrapping (a
// workspace estimate for an absurd problem may be near 2^64, and a wrapped sum would pass a memory check).
struct MemoryEstimate {
  std::size_t inputs = 0;             // Q, K, V and the masks the problem uses
  std::size_t output = 0;             // the fp32 output
  std::size_t workspace = 0;          // the variant's own allocations (workspace_bytes)
  std::size_t beyond_inputs() const;  // output + workspace: what a call allocates when its inputs exist
  std::size_t total() const;          // inputs + output + workspace
};

class Attention {
 public:
  virtual ~Attention() = default;

  virtual std::string name() const = 0;
  virtual std::string description() const = 0;  // one line
  virtual Capabilities capabilities() const = 0;
  virtual std::vector<ParamSpec> param_specs() const { return {}; }

  // Every reason this variant cannot run `p` (empty = supported). The base checks the capabilities;
  // override extra_not_supported_reasons() for variant-specific limits.
  std::vector<std::string> not_supported_reasons(const Problem& p) const;

  // Floating-point operations of one forward call, as this variant counts its own work.
  virtual double flops(const Problem& p) const = 0;
  // Bytes this variant allocates beyond Q, K, V, O and the masks (at `threads` threads).
  virtual std::size_t workspace_bytes(const Problem& p, int threads) const = 0;
  // Bytes one forward call must move to and from memory, as this variant counts its own traffic: the
  // numerator of its achieved bandwidth (the row's `bytes`, frac_bandwidth) and the denominator of its
  // arithmetic intensity on the roofline. Default: compulsory_bytes(p) (Q, K, V, O and the masks once
  // each); override when the algorithm streams something more (a materialised score matrix, K/V read once
  // per query head), with a comment saying what is counted.
  virtual double bytes_moved(const Problem& p) const;

  // Bytes a decode server keeps per sequence between calls for this variant at the problem's context
  // (seq_kv tokens): what the rows report as memory.state_bytes beside kv_cache_bytes(p). Default: the KV
  // cache, what an attention that reads every key keeps; a recurrence keeps its d_k x d_v state per head and
  // sliding_window its rolling cache of sinks + window entries (both constant in the context).
  virtual std::size_t decode_state_bytes(const Problem& p) const;

  // What one run(p, ...) at `threads` threads needs in memory, from the sizes alone (nothing is allocated):
  // the one estimate the sweep, eval, check and the Google Benchmark driver all use.
  MemoryEstimate estimate_memory(const Problem& p, int threads) const;

  // not_supported_reasons joined with "; " (empty = supported): the one text every caller shows.
  std::string unsupported_reasons_text(const Problem& p) const;

  // UsageError naming every per-token or per-head input `p` and the capabilities need that `in` lacks (g,
  // beta, sink logits, the initial state). run, run_saving and run_backward call it.
  void check_extra_inputs(const Problem& p, const AttentionInputs& in) const;

  // The one checked entry point, what every caller uses: validates `p` (sizes, Problem::validate), refuses
  // what this variant cannot run (NotSupported, with unsupported_reasons_text) and inputs missing a tensor
  // `p` needs (UsageError), then calls forward. Variants never repeat these checks.
  void run(const Problem& p, const AttentionInputs& in) const;

  // The fp64 oracle for what this variant computes: its own exact definition. The default is exact softmax
  // attention (reference.hpp); approximate variants override it (e.g. linear attention's quadratic form).
  virtual void reference_forward(const Problem& p, const AttentionInputs& in, double* out) const;
  // reference_forward and, when final_state is not null, the fp64 final state of the definition
  // ([batch, heads, head_dim, d_v]) for a variant with Capabilities::state: what a run writing
  // AttentionInputs::final_state must match. Default: reference_forward; std::logic_error when a final state
  // is asked of a variant without one (a variant with state overrides it).
  virtual void reference_forward_state(const Problem& p, const AttentionInputs& in, double* out,
                                       double* final_state) const;

  // Bound on |forward - reference_forward| for these inputs. Default: exact_abs_tolerance (reference.hpp),
  // derived for softmax attention in fp32 (with weight_dtype's rounding of the weights); override with your
  // own derivation (and a comment saying why).
  virtual double abs_tolerance(const Problem& p, const AttentionInputs& in) const;

  // The precision this variant rounds the softmax weights P to before P V on `p`: fp32 (the default) when it
  // keeps them in fp32; bf16 when it computes P V in 16-bit arithmetic as FlashAttention does (tiled's
  // native bf16 kernels). The default tolerances add that rounding, and the checks' 2x-baseline rule then
  // compares with the baseline's definition computed with its weights rounded the same way (reference.hpp).
  virtual DType weight_dtype(const Problem&) const { return DType::fp32; }

  // The kernels this variant picks on this CPU and SIMD target where it has a choice, by what they serve,
  // e.g. {"bf16": "vdpbf16ps (AVX512_BF16)"} (`attnbench info` lists them). Default: none.
  virtual Json kernels() const { return Json::object(); }

  // Parameter sets the registry-wide checks run (small values that force multi-tile and tail paths).
  virtual std::vector<Json> test_param_sets() const { return {Json::object()}; }

  // ---- Block partials (capabilities().block_partials) ----
  // A sequence-parallel caller cuts the keys into blocks and feeds them one at a time: init_block_state, then
  // accumulate_block per (query block, key block), then finish_block_state writes the output rows. A block
  // problem has the query block's seq_q and the key block's seq_kv; its causal mask is the caller's mapping
  // of global positions (causal for a diagonal block of equal chunks, none when every key precedes every
  // query). Results must be bitwise independent of the thread count, as run()'s. Defaults throw
  // std::logic_error (a variant claiming the capability overrides all five).
  // What a block problem cannot have for this variant (dtype, bias, masks, dropout ...; empty: it can).
  virtual std::vector<std::string> block_not_supported_reasons(const Problem& p) const;
  virtual void init_block_state(const Problem& p, const BlockState& st) const;
  virtual void accumulate_block(const Problem& p, const AttentionInputs& in, const BlockState& st) const;
  // The output rows [batch][heads][seq_q][d_v]; `out` may be st.o.
  virtual void finish_block_state(const Problem& p, const BlockState& st, float* out) const;
  // accumulate_block's workspace at `threads` threads.
  virtual std::size_t block_workspace_bytes(const Problem& p, int threads) const;

  // ---- Training: the backward pass (capabilities().backward) ----
  // A training step is run_saving (the forward, keeping what the backward needs) then run_backward.

  // Floats of state the forward keeps for the backward besides O (e.g. one log-sum-exp per query row, as
  // FlashAttention keeps). 0: the backward needs only Q, K, V, O and dO (it recomputes what it needs).
  virtual std::size_t saved_floats(const Problem&) const { return 0; }
  // What saved holds, for messages and docs ("" when saved_floats is 0), e.g. "log-sum-exp per query row".
  virtual std::string saved_description() const { return ""; }
  // The checked training forward: what run() does, and writes the saved state into `saved` (saved_floats(p)
  // floats; may be null when that is 0). UsageError when the variant has no backward.
  void run_saving(const Problem& p, const AttentionInputs& in, float* saved) const;
  // The checked backward: validates as run() does (NotSupported for what the variant cannot run, forward or
  // backward), refuses a variant without backward and missing tensors (UsageError naming them: dO, O, the
  // saved state, a gradient), then calls backward(). bf16 / fp16 storage: Q, K, V are widened to fp32
  // (exactly) and backward() sees an fp32 problem; the gradients are fp32 either way.
  void run_backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const;
  // Every reason the backward cannot run `p`: not_supported_reasons, no backward capability, and
  // extra_backward_not_supported_reasons; and those joined with "; " (empty = supported).
  std::vector<std::string> backward_not_supported_reasons(const Problem& p) const;
  std::string backward_unsupported_reasons_text(const Problem& p) const;

  // FLOPs of one backward call. Default: the FlashAttention-2 convention, 2.5 x flops(p) (five matmuls
  // against the forward's two; causal halves both since flops(p) already counts only the unmasked pairs).
  // Variants whose backward is not that shape override it with their own count.
  virtual double backward_flops(const Problem& p) const { return 2.5 * flops(p); }
  // Bytes the backward allocates beyond Q, K, V, O, the saved state, dO and the three gradients.
  // Default: workspace_bytes(p, threads); override with the backward's own figure.
  virtual std::size_t backward_workspace_bytes(const Problem& p, int threads) const {
    return workspace_bytes(p, threads);
  }
  // What one run_backward at `threads` threads holds: inputs (Q, K, V, masks, O, saved state, dO), output
  // (dQ, dK, dV) and the backward's workspace.
  MemoryEstimate estimate_backward_memory(const Problem& p, int threads) const;

  // The fp64 gradient of reference_forward: with L = sum(d_out * O), dq = dL/dQ, dk = dL/dK, dv = dL/dV
  // (shapes as in GradientArgs). Default: exact softmax attention (reference_attention_backward in
  // reference.hpp); variants that override reference_forward override this with the gradient of their
  // definition. The registry-wide checks hold it against central differences of reference_forward.
  virtual void reference_backward(const Problem& p, const AttentionInputs& in, const float* d_out, double* dq,
                                  double* dk, double* dv) const;
  // Every fp64 gradient of the definition the problem has: dq, dk, dv (reference_backward) and, where they
  // exist, dg, dbeta, d sink logits, d initial state. Default: reference_backward, and for Problem::sinks
  // exact attention's sink-logit gradient. Variants with more inputs override it.
  virtual void reference_gradients(const Problem& p, const AttentionInputs& in, const float* d_out,
                                   const Fp64Gradients& g) const;
  // Bounds on |backward - reference_backward| for these inputs and this dO. Default: exact_grad_tolerance
  // (reference.hpp), derived for softmax attention in fp32; override with your own derivation.
  virtual GradientTolerance grad_tolerance(const Problem& p, const AttentionInputs& in,
                                           const float* d_out) const;

 protected:
  // Computes out = attention(q, k, v) for a problem run() has checked. Must be thread-safe (the registry
  // holds one instance) and use TBB for parallelism; BLAS runs single-threaded inside
  // (common/support/runtime.hpp).
  virtual void forward(const Problem& p, const AttentionInputs& in) const = 0;
  virtual std::vector<std::string> extra_not_supported_reasons(const Problem&) const { return {}; }
  // The training forward for a problem run_saving has checked: out as forward() writes it, plus the saved
  // state. Default (saved_floats 0): forward().
  virtual void forward_saving(const Problem& p, const AttentionInputs& in, float* saved) const;
  // dQ, dK, dV for a problem run_backward has checked (fp32 inputs in q, k, v). Must be deterministic as
  // forward() is: the same inputs give bitwise the same gradients at any thread count. Default: throws
  // std::logic_error (a variant claiming capabilities().backward must override it).
  virtual void backward(const Problem& p, const AttentionInputs& in, const GradientArgs& g) const;
  // Reasons this variant's backward cannot run `p` beyond the forward's (e.g. a mode it has no gradient for).
  virtual std::vector<std::string> extra_backward_not_supported_reasons(const Problem&) const { return {}; }
};

class Registry {
 public:
  static Registry& instance();
  bool add(std::unique_ptr<Attention> variant);  // returns true so it can initialise a static
  const Attention* find(std::string_view name) const;
  const Attention& get(std::string_view name) const;  // throws UsageError with the known names
  std::vector<const Attention*> all() const;          // sorted by name
  std::vector<std::string> names() const;
  std::string unknown_variant_message(std::string_view name) const;
  // The variant whose capabilities().baseline is set; throws std::logic_error unless exactly one is.
  const Attention& baseline() const;

 private:
  std::vector<std::unique_ptr<Attention>> variants_;
};

// Builds a fully resolved Problem for `variant` with user parameters `given` (validated, defaults filled).
Problem make_problem(const std::string& variant, const Json& given = Json::object());
// Reads a repro string (Problem::repro) back; parameters are resolved against the registered variant's specs.
Problem parse_problem(const std::string& repro);

// The KV cache an exact variant keeps at the problem's context: K and V, batch x kv_heads x seq_kv x
// (head_dim + d_v) at the storage dtype's width (saturating).
std::size_t kv_cache_bytes(const Problem& p);

// Whether `p` is a decode shape (Capabilities::decode): seq_q < seq_kv under causal_lower_right alone.
bool is_decode_shape(const Problem& p);

// Q, K, V (kv_heads heads), O and the masks the problem uses, each moved once: the least any variant moves.
double compulsory_bytes(const Problem& p);

// Checks that `in` has every pointer `p` needs (q, k, v or q16, k16, v16 by p.dtype; `out` only if
// needs_out); throws UsageError otherwise
// (Attention::run and reference_attention call it).
void check_inputs(const Problem& p, const AttentionInputs& in, bool needs_out = true);

// The layout of K and V in memory (AttentionInputs::kv_capacity, v_row_stride): rows per K/V block (K/V
// block kb's row j is row kb * kv_block_rows + j) and floats per V row; and whether either differs from the
// contiguous default. Variants with Capabilities::strided_kv index K and V through these.
inline int64_t kv_block_rows(const Problem& p, const AttentionInputs& in) {
  return in.kv_capacity > 0 ? in.kv_capacity : p.seq_kv;
}
inline int64_t v_row_stride(const Problem& p, const AttentionInputs& in) {
  return in.v_row_stride > 0 ? in.v_row_stride : p.value_dim();
}
inline bool has_strided_kv(const Problem& p, const AttentionInputs& in) {
  return kv_block_rows(p, in) != p.seq_kv || v_row_stride(p, in) != p.value_dim();
}

}  // namespace attn

#define ATTN_CONCAT_INNER(a, b) a##b
#define ATTN_CONCAT(a, b) ATTN_CONCAT_INNER(a, b)
#ifdef ATTNBENCH_PLUGIN
// Out of tree (a plugin built with attnbench_add_variant): ATTN_REGISTER_VARIANT records a factory in the
// plugin, and attnbench's loader creates and registers the variants after checking the plugin's ABI version
// and names (common/interface/plugin.hpp).
#include "common/interface/plugin.hpp"
#else
// Registers one instance of `Class` at static-initialisation time.
#define ATTN_REGISTER_VARIANT(Class)                                    \
  namespace {                                                           \
  [[maybe_unused]] const bool ATTN_CONCAT(attn_registered_, __LINE__) = \
      ::attn::Registry::instance().add(std::make_unique<Class>());      \
  }
#endif
