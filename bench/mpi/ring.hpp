// Exact ring attention over MPI (Liu et al. 2023): the sequence is cut into chunks, each rank keeps its query
// chunks and the running (max, sum, unnormalised output) of their rows, and the K/V blocks travel around the
// ring of ranks, the transfer of the next block overlapping the compute on the current one. The block compute
// is the variant's block partials (Attention::accumulate_block: any registered variant that claims
// capabilities().block_partials), merged into a running state.
//
// Zigzag assignment (so that causal work is balanced): the n positions are cut into 2P contiguous chunks,
// chunk c in [0, 2P) starting where chunk c - 1 ends, and rank r holds chunks r and 2P - 1 - r (one early and
// one late chunk: under a causal mask the early chunk's rows see few keys and the late chunk's many, and
// every rank gets one of each). Chunk sizes come from each rank's share of the sequence,
// share(r) = floor((r + 1) n / P) - floor(r n / P): chunk r holds ceil(share(r) / 2) positions and chunk
// 2P - 1 - r holds floor(share(r) / 2). So ranks hold floor(n / P) or ceil(n / P) rows each (at least one
// when P <= n; P > n is refused), chunks differ by at most one position, and any n works.
// Rank r's K/V block (the same chunks of K and V) travels: at step t in [0, P) rank r holds the block of rank
// (r - t) mod P. A query chunk a against a key chunk b is computed whole (no mask) when the mask is off or
// a > b, as a causal diagonal block when a == b (equal positions, so the block's own upper-left causal rule
// is exactly "key j <= query i"), and skipped when a < b (every key in the future).
#pragma once
#include <mpi.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/support/aligned.hpp"

namespace attn::ring {

struct Zigzag {
  int64_t n = 0;
  int ranks = 1;
  Zigzag(int64_t n_, int ranks_);
  int64_t chunk_start(int c) const { return starts[static_cast<std::size_t>(c)]; }
  int64_t chunk_len(int c) const { return starts[static_cast<std::size_t>(c) + 1] - chunk_start(c); }
  // Rank r's chunks, early one first: {r, 2P - 1 - r}.
  std::array<int, 2> chunks_of(int r) const { return {r, 2 * ranks - 1 - r}; }
  int64_t rows_of(int r) const;  // query rows (positions) rank r holds

 private:
  std::vector<int64_t> starts;  // 2P + 1 boundaries
};

// The tensor sizes every rank knows (from rank 0's headers): Q is [batch][heads][n][head_dim], K is
// [batch][kv_heads][n][head_dim], V [batch][kv_heads][n][v_dim] and the output [batch][heads][n][v_dim]
// (d_v = v_dim, equal to head_dim unless the problem has a distinct value width, e.g. MLA's 192 / 128).
struct Shape {
  int64_t batch = 1, heads = 1, kv_heads = 1, n = 1, head_dim = 1, v_dim = 1;
};

// One rank's K/V block: [K of its early chunk][V of it][K of its late chunk][V of it], K parts
// [batch][kv_heads][len][head_dim] and V parts [batch][kv_heads][len][v_dim].
struct KvBlockLayout {
  int64_t len[2] = {0, 0};
  int64_t k_row = 0;  // batch * kv_heads * head_dim: floats of one position in K
  int64_t v_row = 0;  // batch * kv_heads * v_dim: the same in V
  int64_t k_offset(int i) const { return i == 0 ? 0 : len[0] * (k_row + v_row); }
  int64_t v_offset(int i) const { return k_offset(i) + len[i] * k_row; }
  int64_t floats() const { return (len[0] + len[1]) * (k_row + v_row); }
};
KvBlockLayout kv_layout(const Zigzag& z, const Shape& s, int rank);
// Floats of the largest K/V block any rank sends: the size of every rank's ring buffers.
int64_t kv_capacity(const Zigzag& z, const Shape& s);

// What one rank holds: its two query chunks ([batch][heads][len][head_dim] each) and, on entry, its own K/V
// block (the buffer is sized for the largest block of any rank). On return out[i] holds the output rows of
// query chunk i ([batch][heads][len][v_dim]).
struct RankData {
  AlignedVector<float> q[2];
  AlignedVector<float> kv;
  AlignedVector<float> out[2];
};

struct RankStats {
  double compute_s = 0;   // in the variant's block compute (accumulate_block) and the final division
  double wait_s = 0;      // blocked in MPI_Waitall for the ring transfers
  double total_s = 0;     // the ring, from its first block to the last output row
  double bytes_sent = 0;  // K/V bytes this rank sent around the ring
  int64_t blocks = 0;     // (query chunk, key chunk) pairs computed (skipped ones not counted)
};

// Test hook (attnbench_mpi --abort-rank-after-first-block R, hidden): that rank calls abort() after its first
// block so the tests can check that mpirun fails instead of hanging.
struct Faults {
  int abort_rank_after_first_block = -1;
};

// Runs the ring on every rank of `comm` (collective). `base` carries the variant parameters (tile_q,
// tile_kv), the scale and the sizes other than the sequence; `causal` selects the causal mask. Returns this
// rank's statistics. Throws on a local error; MPI errors abort (MPI_ERRORS_ARE_FATAL).
RankStats ring_attention(MPI_Comm comm, const Problem& base, bool causal, const Zigzag& z, const Shape& s,
                         RankData& d, const Faults& faults = {});

// Moving the data (collective; rank 0 is the only one that touches files or whole tensors).
// SourceFn (rank 0): elements [first, first + count) of tensor t (0: Q, 1: K, 2: V) in C order.
using SourceFn = std::function<void(int t, int64_t first, int64_t count, float* out)>;
// SinkFn (rank 0): output elements [first, first + count) of [batch][heads][n][v_dim], in C order.
using SinkFn = std::function<void(int64_t first, int64_t count, const float* values)>;
// Rank 0 reads every rank's query chunks and K/V block piece by piece (one (batch, head) row range of one
// chunk at a time) and sends them; each rank receives straight into its RankData. Rank 0's peak is its own
// data plus one piece.
void scatter(MPI_Comm comm, const Zigzag& z, const Shape& s, const SourceFn& source, RankData& d);
// The reverse for the outputs: rank 0 receives every rank's output rows piece by piece and passes them on.
void gather(MPI_Comm comm, const Zigzag& z, const Shape& s, const RankData& d, const SinkFn& sink);

// Every rank's statistics gathered on rank 0 as JSON (collective; other ranks get null): per rank its query
// rows, compute, wait and ring seconds, bytes sent, blocks computed and peak resident memory; the slowest
// rank's ring time; |K,V| and the (P - 1) / P * |K,V| every rank sends when the chunks divide evenly; the
// compute max / mean over ranks (zigzag balance).
Json rank_report(MPI_Comm comm, const Zigzag& z, const Shape& s, const RankStats& st, int64_t peak_rss_bytes,
                 int threads, bool causal);

// One rank's memory in the ring, in bytes (what eval checks against the node's memory and run reports as
// the row's estimate): `inputs` its query chunks and own K/V block (held after scatter); `output` its output
// chunks and the running max / sum per row; `ring` what the rotation adds: the buffer the next block arrives
// in (the largest block any rank sends) and, when its own block is smaller, that block regrown to it;
// `workspace` the variant's block workspace (block_workspace_bytes) for its
// largest (query chunk, key chunk) block; `copies` the working copies `attnbench_mpi run` makes of the query
// chunks and K/V block for each repetition (0 for eval).
struct RankMemory {
  std::size_t inputs = 0, output = 0, ring = 0, workspace = 0, copies = 0;
  std::size_t total() const { return inputs + output + ring + workspace + copies; }
  std::size_t beyond_inputs() const { return total() - inputs; }
};
RankMemory rank_memory(const Zigzag& z, const Shape& s, int rank, const Problem& base, int threads,
                       bool with_copies);

// Collective: whether every node's physical memory holds what its ranks need (`need` plus `extra` on this
// rank). 0 when it does; otherwise 2, and on rank 0 `message` names `what`, the node, its ranks' total, its
// memory and the worst rank's parts.
int check_node_memory(const RankMemory& need, std::size_t extra, const std::string& what,
                      std::string& message);

// NaN / Inf among the values of one rank's inputs (its query chunks and own K/V block, which together over
// the ranks hold every input value once) and of its output chunks.
struct RankNonfinite {
  int64_t q = 0, kv = 0, out = 0;
};
RankNonfinite count_rank_nonfinite(const Zigzag& z, const Shape& s, int rank, const RankData& d);

// The registered variants that claim capabilities().block_partials, by name, and the first of them (what
// attnbench_mpi eval runs without --variant); UsageError when none is registered.
std::vector<std::string> block_variants();
std::string default_block_variant();

// Largest number of floats one MPI message carries: bigger buffers go as several messages (MPI counts are
// int).
inline constexpr int64_t kMaxMessageFloats = int64_t{1} << 30;

}  // namespace attn::ring
