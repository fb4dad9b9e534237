// attnbench_mpi: exact ring attention over MPI (ring.hpp). Subcommands:
//   eval  Q, K, V from .npy files, O.npy written; the flags and checks of `attnbench eval`
//   (bench/lib/eval.hpp) run   a sweep config's points (variants with block partials, fp32, no mask or
//   causal) as result rows with the rank count
// The block kernel is any registered variant that claims capabilities().block_partials (--variant; default
// the first such variant by name): this file names none.
// Start it under mpirun (`mpirun -np P attnbench_mpi eval ...`); run alone it is one rank. Rank 0 reads the
// inputs piece by piece (it never holds a whole tensor), sends every rank its query chunks and K/V block, and
// writes the output rows it gathers. Exit codes as attnbench: 0 success, 1 failure, 2 usage error or
// unsupported problem. An error before the ring starts is reported once (by rank 0) and every rank exits
// with the same code; an error once data is moving aborts the job (MPI_Abort), so mpirun fails, never hangs.
#include <mpi.h>
#include <sys/resource.h>
#include <tbb/global_control.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>

#include "bench/lib/command.hpp"
#include "bench/lib/eval.hpp"
#include "bench/mpi/npy_stream.hpp"
#include "bench/mpi/ring.hpp"
#include "bench/mpi/sweep.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/kernels/simd.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/runtime.hpp"

namespace attn::ring {
namespace {

struct EvalOptions {
  std::string variant, q, k, v, out, isa = "best";  // variant "": default_block_variant()
  std::vector<std::string> params;
  bool causal = false, causal_lower_right = false, compare = false;
  std::optional<double> scale;
  // Flags of `attnbench eval` that ring attention does not take: accepted so that using one gives a clear
  // refusal rather than CLI11's "unknown option".
  std::string mask, key_padding, dtype = "fp32", rope = "none", alibi_slopes;
  double dropout = 0;
  bool alibi = false;
  Faults faults;
};

// Refuses what the ring does not run (NotSupported naming the flag). Same answer on every rank.
void refuse_unsupported(const EvalOptions& o, const Attention& variant) {
  const std::string what = " (attnbench_mpi runs fp32 with no mask or a causal one)";
  if (!variant.capabilities().block_partials)
    throw NotSupported("--variant " + o.variant + ": " + variant.name() +
                       " does not compute block partials, which ring attention runs on (variants that do: " +
                       join(block_variants()) + ")");
  if (!o.mask.empty()) throw NotSupported("--mask '" + o.mask + "': boolean masks" + what);
  if (!o.key_padding.empty()) throw NotSupported("--key-padding '" + o.key_padding + "'" + what);
  if (o.dropout != 0) throw NotSupported("--dropout " + shortest_double_text(o.dropout) + what);
  if (o.dtype != "fp32") throw NotSupported("--dtype " + o.dtype + what);
  if (o.alibi || !o.alibi_slopes.empty()) throw NotSupported("--alibi" + what);
  if (o.rope != "none") throw NotSupported("--rope " + o.rope + what);
}

int64_t peak_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // KiB on Linux
}

// Every rank's status (0, 1, 2) after a setup phase: the worst one, reported by rank 0 (every rank ran the
// same checks on the options; files are read by rank 0 only, so its message is the one to show).
int agree(int status, const std::string& message, int rank) {
  int worst = 0;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst != 0 && rank == 0)
    std::cerr << (message.empty() ? "attnbench_mpi: failed on another rank" : message) << "\n";
  return worst;
}

template <class Fn>
int guarded(Fn&& fn, std::string& message) {
  try {
    fn();
    return 0;
  } catch (const UsageError& e) {
    message = std::string("attnbench_mpi: error: ") + e.what();
    return 2;
  } catch (const NotSupported& e) {
    message = std::string("attnbench_mpi: not supported: ") + e.what();
    return 2;
  } catch (const std::exception& e) {
    message = std::string("attnbench_mpi: failed: ") + e.what();
    return 1;
  }
}

Json metrics_json(const ErrorMetrics& m) {
  return {{"max_abs_err", json_number(m.max_abs_err)},
          {"rel_l2_err", json_number(m.rel_l2_err)},
          {"mean_cosine", json_number(m.mean_cosine)},
          {"nan_count", m.nan_count},
          {"inf_count", m.inf_count}};
}

// What rank 0 learned from the options and the .npy headers (broadcast where every rank needs it).
struct EvalSetup {
  std::string variant;
  Json params;
  Shape shape;
  std::unique_ptr<NpyReader> readers[3];
};

// The options and (rank 0) the files' headers, checked on every rank; the worst status (0, 1, 2).
int eval_setup(const EvalOptions& o, EvalSetup& e, std::string& message) {
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const int status = guarded(
      [&] {
        simd::select_isa(o.isa, "--isa");
        e.variant = o.variant.empty() ? default_block_variant() : o.variant;
        refuse_unsupported(o, Registry::instance().get(e.variant));
        e.params = attn::cli::parse_cli_params(Registry::instance().get(e.variant), o.params);
        if (rank != 0) return;
        const std::string q_what = "--q '" + o.q + "'", k_what = "--k '" + o.k + "'",
                          v_what = "--v '" + o.v + "'";
        e.readers[0] = std::make_unique<NpyReader>(o.q, o.q);
        e.readers[1] = std::make_unique<NpyReader>(o.k, o.k);
        e.readers[2] = std::make_unique<NpyReader>(o.v, o.v);
        const auto &qs = e.readers[0]->shape(), &ks = e.readers[1]->shape(), &vs = e.readers[2]->shape();
        require_rank4(q_what, qs, "[batch, heads, seq_q, head_dim]");
        require_rank4(k_what, ks, "[batch, kv_heads, seq_kv, head_dim]");
        require_rank4(v_what, vs, "[batch, kv_heads, seq_kv, d_v]");
        check_kv_shapes(q_what, qs, k_what, ks, v_what, vs);
        Problem p = make_problem(e.variant, e.params);
        set_shape(p, qs, ks, vs);
        p.scale = o.scale;
        p.mask.causal = o.causal;
        p.validate();
        if (p.seq_q != p.seq_kv)
          throw NotSupported(q_what + " has seq_q = " + std::to_string(p.seq_q) + " and " + k_what +
                             " seq_kv = " + std::to_string(p.seq_kv) +
                             ": ring attention splits one sequence, so it needs seq_q == seq_kv");
        if (P > p.seq_q)
          throw UsageError("mpirun -np " + std::to_string(P) + ": " + std::to_string(P) +
                           " ranks for a sequence of n = " + std::to_string(p.seq_q) + " positions (" +
                           q_what +
                           "): ring attention needs P <= n, every rank holding at least one query row");
        e.shape = {p.batch, p.heads, p.num_kv_heads(), p.seq_q, p.head_dim, p.value_dim()};
      },
      message);
  const int worst = agree(status, message, rank);
  if (worst) return worst;
  int64_t dims[6] = {e.shape.batch, e.shape.heads,    e.shape.kv_heads,
                     e.shape.n,     e.shape.head_dim, e.shape.v_dim};
  MPI_Bcast(dims, 6, MPI_INT64_T, 0, MPI_COMM_WORLD);
  e.shape = {dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]};
  return 0;
}

// --compare on rank 0: the same variant in one process and the fp64 reference on the whole inputs.
Json eval_compare(const EvalOptions& o, const Problem& base, bool causal, int P) {
  Json j;
  // The same variant in one process (the same parameters, this rank's threads) and the fp64 reference, on
  // the whole inputs (rank 0 then holds them all: the memory bound above is the ring's, before this step).
  const FloatArray q = read_npy_float(o.q), k = read_npy_float(o.k), v = read_npy_float(o.v);
  const FloatArray ring_out = read_npy_float(o.out);
  FloatArray single_out(ring_out.shape);
  Problem p = base;
  p.mask.causal = causal;
  AttentionInputs in{};
  in.q = q.ptr();
  in.k = k.ptr();
  in.v = v.ptr();
  in.out = single_out.ptr();
  Registry::instance().get(base.variant).run(p, in);
  DoubleArray want(ring_out.shape);
  reference_attention(p, in, want.ptr());
  const int64_t rows = p.batch * p.heads * p.seq_q;
  // The fp32 bound against fp64 (exact_abs_tolerance, common/reference/reference.cpp) plus the ring's merges:
  // at most 2P (query chunk, key chunk) blocks per row, each merged with an exp2 (1.5 ulp), a multiply and an
  // add on the sum and the output (3u relative), times the same factor 4: 4 * 3 * 2P * u * max|v|. Ring and
  // the single-process run are each within it of the exact result, so within twice it of each other.
  double vmax = 0;
  for (std::size_t e = 0; e < v.numel(); ++e)
    vmax = std::max(vmax, std::fabs(static_cast<double>(v.data[e])));
  const double tolerance = exact_abs_tolerance(p, in) + 4.0 * 3.0 * 2.0 * P * std::ldexp(1.0, -24) * vmax;
  double diff = 0;
  for (std::size_t i = 0; i < ring_out.numel(); ++i) {
    const double d = std::fabs(static_cast<double>(ring_out.data[i]) - single_out.data[i]);
    if (std::isnan(d) || d > diff) diff = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
  }
  j["compare"] = {
      {"id", p.repro()},
      {"max_abs_diff_vs_single", json_number(diff)},
      {"tolerance", json_number(tolerance)},
      {"tolerance_vs_single", json_number(2 * tolerance)},
      {"accuracy", metrics_json(compare_outputs(ring_out.ptr(), want.ptr(), rows, p.value_dim()))},
      {"single_accuracy", metrics_json(compare_outputs(single_out.ptr(), want.ptr(), rows, p.value_dim()))},
      {"reference", "fp64 exact softmax attention on the fp32 inputs"}};
  return j["compare"];
}

int run_eval(const EvalOptions& o, int threads) {
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  std::string message;
  EvalSetup e;
  if (const int worst = eval_setup(o, e, message)) return worst;
  const Shape& shape = e.shape;
  const std::string& variant = e.variant;
  const Json& params = e.params;
  auto& readers = e.readers;

  // --causal-lower-right is --causal here: with seq_q == seq_kv the two rules are the same.
  const bool causal = o.causal || o.causal_lower_right;
  Problem base = make_problem(variant, params);
  base.batch = shape.batch;
  base.heads = shape.heads;
  base.kv_heads = shape.kv_heads;
  base.head_dim = shape.head_dim;
  base.v_head_dim = shape.v_dim == shape.head_dim ? 0 : shape.v_dim;
  base.seq_q = base.seq_kv = shape.n;
  base.scale = o.scale;
  const Zigzag z(shape.n, P);

  // Before anything is allocated: every node must hold what its ranks need (rank 0 with --compare also the
  // whole tensors and the fp64 reference), or every rank exits 2 with the node that does not.
  {
    const RankMemory need = rank_memory(z, shape, rank, base, threads, false);
    std::size_t extra = 0;
    if (rank == 0 && o.compare) {
      // Q, K, V, the ring's and the single run's outputs (fp32) and the fp64 reference output.
      const std::size_t rows = static_cast<std::size_t>(shape.batch * shape.heads * shape.n),
                        q = rows * static_cast<std::size_t>(shape.head_dim),
                        out = rows * static_cast<std::size_t>(shape.v_dim),
                        kv = static_cast<std::size_t>(shape.batch * shape.kv_heads * shape.n *
                                                      (shape.head_dim + shape.v_dim));
      extra = sat_add(sat_mul(sat_add(q, sat_mul(2, out), kv), sizeof(float)), sat_mul(out, sizeof(double)));
    }
    std::string why;
    if (const int worst = agree(check_node_memory(need, extra, "--q '" + o.q + "'", why), why, rank))
      return worst;
  }

  RankData data;
  SourceFn source;
  if (rank == 0)
    source = [&](int t, int64_t first, int64_t count, float* out) { readers[t]->read(first, count, out); };
  scatter(MPI_COMM_WORLD, z, shape, source, data);
  // NaN never leaks silently: the inputs' and the output's non-finite values are counted (each value on the
  // rank that holds it) and reported; a non-finite output gets a warning naming both counts.
  const RankNonfinite bad_in = count_rank_nonfinite(z, shape, rank, data);
  MPI_Barrier(MPI_COMM_WORLD);
  const RankStats st = ring_attention(MPI_COMM_WORLD, base, causal, z, shape, data, o.faults);
  const RankNonfinite bad_out = count_rank_nonfinite(z, shape, rank, data);
  int64_t bad[3] = {bad_in.q, bad_in.kv, bad_out.out}, bad_sum[3] = {0, 0, 0};
  MPI_Reduce(bad, bad_sum, 3, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0 && bad_sum[2] > 0)
    std::cerr << "attnbench_mpi: warning: the output holds " << bad_sum[2]
              << " NaN/Inf values (the inputs held " << bad_sum[0] + bad_sum[1] << ")\n";
  std::unique_ptr<NpyWriter> writer;
  SinkFn sink;
  if (rank == 0) {
    writer = std::make_unique<NpyWriter>(
        o.out, std::vector<int64_t>{shape.batch, shape.heads, shape.n, shape.v_dim});
    sink = [&](int64_t first, int64_t count, const float* values) { writer->write(first, count, values); };
  }
  gather(MPI_COMM_WORLD, z, shape, data, sink);
  if (rank == 0) writer->commit();
  const Json report = rank_report(MPI_COMM_WORLD, z, shape, st, peak_rss(), threads, causal);
  if (rank != 0) return 0;

  Json j = report;
  j["nonfinite_inputs"] = bad_sum[0] + bad_sum[1];
  j["nonfinite_q"] = bad_sum[0];
  j["nonfinite_kv"] = bad_sum[1];
  j["nonfinite_output"] = bad_sum[2];
  if (o.compare) j["compare"] = eval_compare(o, base, causal, P);
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace attn::ring

int main(int argc, char** argv) {
  using namespace attn::ring;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CLI::App app{"attnbench_mpi: exact ring attention over MPI (start it with mpirun -np P)"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads, "worker threads per rank (default: all available)")
      ->check(CLI::Range(0, 4096));

  auto o = std::make_shared<EvalOptions>();
  CLI::App* ev = app.add_subcommand("eval",
                                    "ring attention on Q, K, V .npy files ([batch, heads, n, head_dim]; "
                                    "K and V may have fewer heads); writes O.npy");
  ev->add_option("--variant", o->variant,
                 "the block kernel: a variant with block partials (`attnbench list --json`: block_partials; "
                 "default the first by name)");
  ev->add_option("--param", o->params, "variant parameter NAME=VALUE (repeatable)");
  ev->add_option("--q", o->q, "queries .npy, float32/64 [batch, heads, n, head_dim]")->required();
  ev->add_option("--k", o->k, "keys .npy, [batch, kv_heads, n, head_dim], kv_heads dividing heads")
      ->required();
  ev->add_option("--v", o->v, "values .npy, same shape as keys")->required();
  ev->add_flag("--causal", o->causal, "causal mask (query i attends keys j <= i); zigzag chunks balance it");
  ev->add_flag("--causal-lower-right", o->causal_lower_right, "the same as --causal here (seq_q == seq_kv)");
  ev->add_option("--scale", o->scale, "logit scale (default 1/sqrt(head_dim))");
  ev->add_option("--out", o->out, "output .npy, float32 [batch, heads, n, head_dim] (written by rank 0)")
      ->required();
  ev->add_flag("--compare", o->compare,
               "also run the variant in one process and the fp64 reference on rank 0 and print the "
               "differences");
  ev->add_option("--mask", o->mask, "not supported (refused)");
  ev->add_option("--key-padding", o->key_padding, "not supported (refused)");
  ev->add_option("--dropout", o->dropout, "not supported (refused unless 0)");
  ev->add_option("--dtype", o->dtype, "fp32 only (bf16, fp16 refused)");
  ev->add_flag("--alibi", o->alibi, "not supported (refused)");
  ev->add_option("--alibi-slopes", o->alibi_slopes, "not supported (refused)");
  ev->add_option("--rope", o->rope, "none only (refused otherwise)");
  attn::cli::add_isa_option(*ev, o->isa);
  ev->add_option("--abort-rank-after-first-block", o->faults.abort_rank_after_first_block,
                 "test hook: that rank calls abort() after its first block")
      ->group("");

  SweepOptions so;
  CLI::App* run = app.add_subcommand("run",
                                     "measure a sweep config's points with ring attention (variants with "
                                     "block partials, fp32, mask none or causal); rows with the rank count");
  add_sweep_options(*run, so);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    if (rank == 0) std::cout << out.str(), std::cerr << err.str();
    MPI_Finalize();
    return code == 0 ? 0 : 2;
  }
  int code = 0;
  try {
    attn::ThreadScope scope(threads);
    const int t =
        static_cast<int>(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
    if (ev->parsed()) code = run_eval(*o, t);
    if (run->parsed()) code = run_sweep(so, t);
  } catch (const std::exception& e) {
    // Data is moving between ranks: the others cannot be told, so the job ends here.
    std::cerr << "attnbench_mpi: rank " << rank << ": failed: " << e.what() << "\n";
    const int c =
        dynamic_cast<const attn::UsageError*>(&e) || dynamic_cast<const attn::NotSupported*>(&e) ? 2 : 1;
    MPI_Abort(MPI_COMM_WORLD, c);
    return c;
  }
  MPI_Finalize();
  return code;
}
