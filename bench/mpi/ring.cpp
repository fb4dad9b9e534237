// The ring (ring.hpp): zigzag chunk boundaries, the K/V rotation with non-blocking transfers, and the
// per-block calls into the variant's block partials (Attention::accumulate_block).
#include "bench/mpi/ring.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "common/interface/util.hpp"
#include "common/support/error.hpp"

namespace attn::ring {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A buffer of `floats` floats as messages of at most kMaxMessageFloats, all with one tag: MPI matches
// messages between two ranks with the same tag in the order they were posted, so the pieces land in order.
void post_sends(const float* buf, int64_t floats, int to, int tag, MPI_Comm comm,
                std::vector<MPI_Request>& reqs) {
  for (int64_t at = 0; at < floats; at += kMaxMessageFloats) {
    reqs.emplace_back();
    MPI_Isend(buf + at, static_cast<int>(std::min(kMaxMessageFloats, floats - at)), MPI_FLOAT, to, tag, comm,
              &reqs.back());
  }
}
void post_recvs(float* buf, int64_t floats, int from, int tag, MPI_Comm comm,
                std::vector<MPI_Request>& reqs) {
  for (int64_t at = 0; at < floats; at += kMaxMessageFloats) {
    reqs.emplace_back();
    MPI_Irecv(buf + at, static_cast<int>(std::min(kMaxMessageFloats, floats - at)), MPI_FLOAT, from, tag,
              comm, &reqs.back());
  }
}

}  // namespace

Zigzag::Zigzag(int64_t n_, int ranks_) : n(n_), ranks(ranks_) {
  if (ranks < 1 || n < ranks)
    throw std::invalid_argument("zigzag: need 1 <= P <= n (P = " + std::to_string(ranks) +
                                ", n = " + std::to_string(n) + ")");
  const int64_t P = ranks;
  std::vector<int64_t> len(static_cast<std::size_t>(2 * P));
  for (int64_t r = 0; r < P; ++r) {
    const int64_t share =
        (r + 1) * n / P - r * n / P;  // floor((r+1)n/P) - floor(rn/P), no overflow for n <= 2^40
    len[static_cast<std::size_t>(r)] = (share + 1) / 2;
    len[static_cast<std::size_t>(2 * P - 1 - r)] = share / 2;
  }
  starts.assign(1, 0);
  for (int64_t l : len) starts.push_back(starts.back() + l);
}

int64_t Zigzag::rows_of(int r) const {
  const auto c = chunks_of(r);
  return chunk_len(c[0]) + chunk_len(c[1]);
}

KvBlockLayout kv_layout(const Zigzag& z, const Shape& s, int rank) {
  KvBlockLayout l;
  const auto c = z.chunks_of(rank);
  l.len[0] = z.chunk_len(c[0]);
  l.len[1] = z.chunk_len(c[1]);
  l.k_row = s.batch * s.kv_heads * s.head_dim;
  l.v_row = s.batch * s.kv_heads * s.v_dim;
  return l;
}

int64_t kv_capacity(const Zigzag& z, const Shape& s) {
  int64_t capacity = 0;
  for (int r = 0; r < z.ranks; ++r) capacity = std::max(capacity, kv_layout(z, s, r).floats());
  return capacity;
}

RankMemory rank_memory(const Zigzag& z, const Shape& s, int rank, const Problem& base, int threads,
                       bool with_copies) {
  const std::size_t f = sizeof(float);
  const std::size_t rows = static_cast<std::size_t>(s.batch * s.heads * z.rows_of(rank));
  const KvBlockLayout mine = kv_layout(z, s, rank);
  const std::size_t capacity = static_cast<std::size_t>(kv_capacity(z, s));
  const std::size_t own = static_cast<std::size_t>(mine.floats());
  RankMemory m;
  m.inputs = (rows * static_cast<std::size_t>(s.head_dim) + own) * f;
  m.output = (rows * static_cast<std::size_t>(s.v_dim) + 2 * rows) * f;
  // The spare buffer the next block arrives in holds `capacity`; an own block smaller than that is grown to
  // it (reallocated after the spare exists: old and new at once).
  m.ring = z.ranks > 1 ? (capacity + (own < capacity ? capacity : 0)) * f : 0;
  int64_t longest = 0;
  for (int c = 0; c < 2 * z.ranks; ++c) longest = std::max(longest, z.chunk_len(c));
  Problem block = base;
  block.seq_q = block.seq_kv = std::max<int64_t>(longest, 1);
  block.mask = MaskSpec{};
  m.workspace = Registry::instance().get(block.variant).block_workspace_bytes(block, threads);
  if (with_copies) m.copies = (rows * static_cast<std::size_t>(s.head_dim) + own) * f;
  return m;
}

int check_node_memory(const RankMemory& need, std::size_t extra, const std::string& what,
                      std::string& message) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int node_ranks = 1;
  MPI_Comm_size(node, &node_ranks);
  const double mine = static_cast<double>(sat_add(need.total(), extra));
  double on_node = 0;
  MPI_Allreduce(&mine, &on_node, 1, MPI_DOUBLE, MPI_SUM, node);
  MPI_Comm_free(&node);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const double physical = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
  // The worst node (the largest need over memory), found collectively; rank 0 writes the message.
  struct {
    double ratio;
    int rank;
  } local{physical > 0 ? on_node / physical : 0.0, rank}, worst{0, 0};
  MPI_Allreduce(&local, &worst, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
  if (worst.ratio <= 1.0) return 0;
  // The worst rank's figures go to rank 0.
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  double figures[8] = {on_node,
                       physical,
                       static_cast<double>(node_ranks),
                       static_cast<double>(need.inputs),
                       static_cast<double>(need.output),
                       static_cast<double>(need.ring),
                       static_cast<double>(need.workspace),
                       static_cast<double>(extra)};
  MPI_Bcast(figures, 8, MPI_DOUBLE, worst.rank, MPI_COMM_WORLD);
  MPI_Bcast(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, worst.rank, MPI_COMM_WORLD);
  if (rank == 0) {
    auto b = [](double x) { return format_bytes(x); };
    message = "attnbench_mpi: not supported: " + what + ": the " +
              std::to_string(static_cast<int>(figures[2])) + " rank(s) on node '" + host + "' need " +
              b(figures[0]) + " together, more than its " + b(figures[1]) + " of physical memory (rank " +
              std::to_string(worst.rank) + ": its inputs share " + b(figures[3]) + ", output " +
              b(figures[4]) + ", ring buffers " + b(figures[5]) + ", block workspace " + b(figures[6]) +
              (figures[7] > 0 ? ", --compare's whole tensors and fp64 reference " + b(figures[7]) : "") +
              "); spread the ranks over more nodes or use more ranks";
  }
  return 2;
}

RankNonfinite count_rank_nonfinite(const Zigzag& z, const Shape& s, int rank, const RankData& d) {
  // count_nonfinite: common/interface/util.hpp
  auto bad = [](const float* x, std::size_t n) { return count_nonfinite(x, n); };
  RankNonfinite c;
  const auto chunks = z.chunks_of(rank);
  for (int i = 0; i < 2; ++i) {
    const std::size_t rows =
        static_cast<std::size_t>(s.batch * s.heads * z.chunk_len(chunks[static_cast<std::size_t>(i)]));
    const std::size_t nq = rows * static_cast<std::size_t>(s.head_dim),
                      no = rows * static_cast<std::size_t>(s.v_dim);
    c.q += bad(d.q[i].data(), std::min(nq, d.q[i].size()));
    c.out += bad(d.out[i].data(), std::min(no, d.out[i].size()));
  }
  c.kv = bad(d.kv.data(), std::min(d.kv.size(), static_cast<std::size_t>(kv_layout(z, s, rank).floats())));
  return c;
}

RankStats ring_attention(MPI_Comm comm, const Problem& base, bool causal, const Zigzag& z, const Shape& s,
                         RankData& d, const Faults& faults) {
  int rank = 0, P = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  const int next_rank = (rank + 1) % P, prev_rank = (rank + P - 1) % P;
  RankStats st;
  const auto my_chunks = z.chunks_of(rank);

  // The running state of each query chunk's rows: m, l ([batch][heads][len]) and o (as the output).
  std::vector<float> m[2], l[2];
  const Attention& variant = Registry::instance().get(base.variant);
  BlockState state[2];
  Problem qp[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t len = z.chunk_len(my_chunks[static_cast<std::size_t>(i)]);
    qp[i] = base;
    qp[i].seq_q = len;
    const int64_t rows = s.batch * s.heads * len;
    m[i].resize(static_cast<std::size_t>(rows));
    l[i].resize(static_cast<std::size_t>(rows));
    d.out[i].assign(static_cast<std::size_t>(rows * s.v_dim), 0.0f);
    state[i] = {m[i].data(), l[i].data(), d.out[i].data()};
    if (rows > 0) variant.init_block_state(qp[i], state[i]);
  }

  const int64_t capacity = kv_capacity(z, s);
  AlignedVector<float> spare(static_cast<std::size_t>(P > 1 ? capacity : 0));
  if (static_cast<int64_t>(d.kv.size()) < capacity) d.kv.resize(static_cast<std::size_t>(capacity));
  float* cur = d.kv.data();
  float* nxt = spare.data();

  const double t0 = now_s();
  for (int step = 0; step < P; ++step) {
    const int src = (rank - step + P) % P;  // whose K/V block `cur` holds
    const KvBlockLayout cur_l = kv_layout(z, s, src);
    std::vector<MPI_Request> reqs;
    if (step + 1 < P) {
      // The next block (rank src - 1's) arrives from the previous rank while this one is computed on; the
      // current one goes on to the next rank, both tagged with the step.
      const KvBlockLayout nxt_l = kv_layout(z, s, (src + P - 1) % P);
      post_recvs(nxt, nxt_l.floats(), prev_rank, step, comm, reqs);
      post_sends(cur, cur_l.floats(), next_rank, step, comm, reqs);
      st.bytes_sent += static_cast<double>(cur_l.floats()) * sizeof(float);
    }
    const auto kv_chunks = z.chunks_of(src);
    for (int qi = 0; qi < 2; ++qi) {
      for (int ki = 0; ki < 2; ++ki) {
        const int a = my_chunks[static_cast<std::size_t>(qi)], b = kv_chunks[static_cast<std::size_t>(ki)];
        if (qp[qi].seq_q == 0 || cur_l.len[ki] == 0) continue;
        if (causal && a < b) continue;  // every key after every query
        Problem p = qp[qi];
        p.seq_kv = cur_l.len[ki];
        p.mask = MaskSpec{};
        p.mask.causal = causal && a == b;  // the diagonal chunk: equal positions, key j <= query i
        AttentionInputs in{};
        in.q = d.q[qi].data();
        in.k = cur + cur_l.k_offset(ki);
        in.v = cur + cur_l.v_offset(ki);
        const double c0 = now_s();
        variant.accumulate_block(p, in, state[qi]);
        st.compute_s += now_s() - c0;
        ++st.blocks;
        if (faults.abort_rank_after_first_block == rank) std::abort();
        // Give the transfers a chance to progress between blocks (MPI moves data only inside its calls).
        if (!reqs.empty()) {
          int done = 0;
          MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
          if (done) reqs.clear();
        }
      }
    }
    if (!reqs.empty()) {
      const double w0 = now_s();
      MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
      st.wait_s += now_s() - w0;
    }
    std::swap(cur, nxt);
  }
  const double f0 = now_s();
  for (int i = 0; i < 2; ++i)
    if (qp[i].seq_q > 0) variant.finish_block_state(qp[i], state[i], d.out[i].data());
  st.compute_s += now_s() - f0;
  st.total_s = now_s() - t0;
  return st;
}

namespace {
void send_blocking(const float* buf, int64_t floats, int to, MPI_Comm comm) {
  for (int64_t at = 0; at < floats; at += kMaxMessageFloats)
    MPI_Send(buf + at, static_cast<int>(std::min(kMaxMessageFloats, floats - at)), MPI_FLOAT, to, 0, comm);
}
void recv_blocking(float* buf, int64_t floats, int from, MPI_Comm comm) {
  for (int64_t at = 0; at < floats; at += kMaxMessageFloats)
    MPI_Recv(buf + at, static_cast<int>(std::min(kMaxMessageFloats, floats - at)), MPI_FLOAT, from, 0, comm,
             MPI_STATUS_IGNORE);
}
int64_t max_chunk_len(const Zigzag& z) {
  int64_t m = 0;
  for (int c = 0; c < 2 * z.ranks; ++c) m = std::max(m, z.chunk_len(c));
  return m;
}
}  // namespace

void scatter(MPI_Comm comm, const Zigzag& z, const Shape& s, const SourceFn& source, RankData& d) {
  int rank = 0, P = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  {
    const KvBlockLayout mine = kv_layout(z, s, rank);
    for (int i = 0; i < 2; ++i)
      d.q[i].assign(static_cast<std::size_t>(s.batch * s.heads * mine.len[i] * s.head_dim), 0.0f);
    d.kv.assign(static_cast<std::size_t>(mine.floats()), 0.0f);
  }
  const int64_t widest = std::max(s.head_dim, s.v_dim);
  std::vector<float> staging(static_cast<std::size_t>(rank == 0 ? max_chunk_len(z) * widest : 0));
  for (int r = rank == 0 ? 0 : rank; r < (rank == 0 ? P : rank + 1); ++r) {
    const KvBlockLayout l = kv_layout(z, s, r);
    const auto chunks = z.chunks_of(r);
    for (int i = 0; i < 2; ++i) {
      const int64_t start = z.chunk_start(chunks[static_cast<std::size_t>(i)]), len = l.len[i];
      if (len == 0) continue;
      for (int t = 0; t < 3; ++t) {
        const int64_t heads = t == 0 ? s.heads : s.kv_heads, D = t == 2 ? s.v_dim : s.head_dim;
        for (int64_t bh = 0; bh < s.batch * heads; ++bh) {
          const int64_t first = (bh * s.n + start) * D, count = len * D;
          float* dst = nullptr;
          if (r == rank)
            dst = t == 0 ? d.q[i].data() + bh * count
                         : d.kv.data() + (t == 1 ? l.k_offset(i) : l.v_offset(i)) + bh * count;
          if (rank != 0) {
            recv_blocking(dst, count, 0, comm);
          } else if (r == 0) {
            source(t, first, count, dst);
          } else {
            source(t, first, count, staging.data());
            send_blocking(staging.data(), count, r, comm);
          }
        }
      }
    }
  }
}

void gather(MPI_Comm comm, const Zigzag& z, const Shape& s, const RankData& d, const SinkFn& sink) {
  int rank = 0, P = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  const int64_t D = s.v_dim;  // output rows are d_v wide
  std::vector<float> staging(static_cast<std::size_t>(rank == 0 ? max_chunk_len(z) * D : 0));
  for (int r = rank == 0 ? 0 : rank; r < (rank == 0 ? P : rank + 1); ++r) {
    const auto chunks = z.chunks_of(r);
    for (int i = 0; i < 2; ++i) {
      const int64_t start = z.chunk_start(chunks[static_cast<std::size_t>(i)]);
      const int64_t len = z.chunk_len(chunks[static_cast<std::size_t>(i)]);
      if (len == 0) continue;
      for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
        const int64_t first = (bh * s.n + start) * D, count = len * D;
        if (rank != 0) {
          send_blocking(d.out[i].data() + bh * count, count, 0, comm);
        } else if (r == 0) {
          sink(first, count, d.out[i].data() + bh * count);
        } else {
          recv_blocking(staging.data(), count, r, comm);
          sink(first, count, staging.data());
        }
      }
    }
  }
}

Json rank_report(MPI_Comm comm, const Zigzag& z, const Shape& s, const RankStats& st, int64_t peak_rss_bytes,
                 int threads, bool causal) {
  int rank = 0, P = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  constexpr int kFields = 8;
  const double mine[kFields] = {static_cast<double>(z.rows_of(rank)),
                                st.compute_s,
                                st.wait_s,
                                st.total_s,
                                st.bytes_sent,
                                static_cast<double>(st.blocks),
                                static_cast<double>(peak_rss_bytes),
                                static_cast<double>(threads)};
  std::vector<double> all(static_cast<std::size_t>(rank == 0 ? kFields * P : 0));
  MPI_Gather(mine, kFields, MPI_DOUBLE, all.data(), kFields, MPI_DOUBLE, 0, comm);
  if (rank != 0) return nullptr;
  Json ranks = Json::array();
  double slowest = 0, compute_max = 0, compute_sum = 0;
  for (int r = 0; r < P; ++r) {
    const double* a = all.data() + r * kFields;
    ranks.push_back({{"rank", r},
                     {"rows", static_cast<int64_t>(a[0])},
                     {"compute_s", a[1]},
                     {"wait_s", a[2]},
                     {"ring_s", a[3]},
                     {"bytes_sent", static_cast<int64_t>(a[4])},
                     {"blocks", static_cast<int64_t>(a[5])},
                     {"peak_rss_bytes", static_cast<int64_t>(a[6])},
                     {"threads", static_cast<int64_t>(a[7])}});
    slowest = std::max(slowest, a[3]);
    compute_max = std::max(compute_max, a[1]);
    compute_sum += a[1];
  }
  const double kv_bytes =
      static_cast<double>(s.batch * s.kv_heads * s.n * (s.head_dim + s.v_dim)) * sizeof(float);
  return {{"ranks", P},
          {"n", s.n},
          {"causal", causal},
          {"assignment", "zigzag: rank r holds chunks r and 2P-1-r of 2P"},
          {"ring_s", slowest},
          {"kv_bytes", kv_bytes},
          {"expected_bytes_sent_per_rank", kv_bytes * (P - 1) / P},
          {"compute_max_over_mean", compute_sum > 0 ? compute_max / (compute_sum / P) : 1.0},
          {"per_rank", ranks}};
}

std::vector<std::string> block_variants() {
  std::vector<std::string> names;
  for (const Attention* v : Registry::instance().all())
    if (v->capabilities().block_partials) names.push_back(v->name());
  return names;
}

std::string default_block_variant() {
  const std::vector<std::string> names = block_variants();
  if (names.empty())
    throw UsageError("no registered variant computes block partials (capabilities().block_partials)");
  return names.front();
}

}  // namespace attn::ring
