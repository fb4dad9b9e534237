// attnbench_mpi run (sweep.hpp): rank 0 plans, makes each point's inputs and writes the rows; every rank
// runs the ring. Per point rank 0 broadcasts what the other ranks need (sizes, mask, tile parameters,
// threads, scale) or the end of the sweep.
#include "bench/mpi/sweep.hpp"

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>

#include "bench/lib/inputs.hpp"
#include "bench/lib/measure.hpp"
#include "bench/lib/plan.hpp"
#include "bench/lib/result_row.hpp"
#include "bench/lib/store.hpp"
#include "bench/lib/sysinfo.hpp"
#include "bench/mpi/ring.hpp"
#include "common/error.hpp"
#include "common/mask.hpp"
#include "common/npy.hpp"
#include "common/reference.hpp"
#include "common/runtime.hpp"
#include "common/simd.hpp"
#include "common/util.hpp"

namespace attn::ring {

void add_sweep_options(CLI::App& sub, SweepOptions& o) {
  sub.add_option("config", o.config, "sweep config (JSON), see configs/README.md")->required();
  sub.add_option("--out", o.out, "results folder (default: results/<config name>-mpi<P>)");
  sub.add_option("--filter", o.filter, "only points whose id contains this text");
  sub.add_flag("--force", o.force, "replace results already in the folder");
  sub.add_flag("--resume", o.resume,
               "finish an interrupted run in --out: the points it has rows for are not measured again (the "
               "config, --isa and the rank count must be the same)");
  sub.add_option("--isa", o.isa, "SIMD target (as attnbench run --isa)");
}

namespace {

// Why the ring cannot run this point ("" when it can).
std::string ring_skip_reason(const SweepPoint& pt, int P) {
  const Problem& p = pt.problem;
  const std::string what =
      ": attnbench_mpi runs tiled in fp32 on self-attention with no mask or a causal one";
  if (p.variant != "tiled") return "variant " + p.variant + what;
  if (p.dtype != DType::fp32) return std::string("dtype ") + dtype_name(p.dtype) + what;
  if (p.bias != Bias::none) return "bias " + std::string(bias_name(p.bias)) + what;
  if (p.dropout > 0) return "dropout" + what;
  if (pt.mask.label() != "none" && pt.mask.label() != "causal") return "mask " + pt.mask.label() + what;
  if (pt.regime.rope.on()) return "RoPE" + what;
  if (p.seq_q != p.seq_kv) return "seq_q != seq_kv" + what;
  if (P > p.seq_q)
    return std::to_string(P) + " ranks for n = " + std::to_string(p.seq_q) + ": ring attention needs P <= n";
  return "";
}

// What rank 0 broadcasts per point: go (0: the sweep is over), sizes, causal, tile_q, tile_kv, threads, and
// the scale (NaN: the default).
struct PointMsg {
  int64_t go = 0, batch = 1, heads = 1, kv_heads = 1, n = 1, head_dim = 1, causal = 0, tile_q = 0,
          tile_kv = 0, threads = 1;
  double scale = NAN;
};

}  // namespace

int run_sweep(const SweepOptions& o, int threads) {
  (void)threads;
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  namespace fs = std::filesystem;

  // Set-up on rank 0 (config, plan, folder), its status shared so every rank stops on an error. The folder is
  // attnbench run's (ResultStore): meta.json before any row, rows appended, flushed and fsynced one by one,
  // results.csv at the end, --resume / --force with the same checks, plus the rank count.
  int status = 0;
  std::string message;
  Plan plan;
  std::unique_ptr<ResultStore> store;
  std::set<std::string> done;
  if (rank == 0) {
    try {
      if (o.resume && o.force) throw UsageError("--resume and --force exclude each other");
      simd::select_isa(o.isa, "--isa");
      plan = load_plan(o.config, o.isa);
      const std::string dir =
          o.out.empty() ? "results/" + plan.config.name + "-mpi" + std::to_string(P) : o.out;
      Json machine = {{"system", system_info()},
                      {"ranks", P},
                      {"program", "attnbench_mpi run"},
                      {"isa", simd::active_isa()}};
      store = std::make_unique<ResultStore>(dir,
                                            o.resume  ? ResultStore::Mode::resume
                                            : o.force ? ResultStore::Mode::force
                                                      : ResultStore::Mode::fresh,
                                            plan.config, ResultStore::Identity{plan.config.hash(), o.isa},
                                            machine);
      if (o.resume) {
        const Json was = store->meta().value("ranks", Json());
        if (!was.is_number_integer() || was.get<int>() != P)
          throw UsageError("--resume: the interrupted run in '" + dir + "' ran with " +
                           (was.is_number_integer() ? std::to_string(was.get<int>()) : std::string("no")) +
                           " ranks, this one with " + std::to_string(P) + " (mpirun -np " +
                           std::to_string(P) +
                           "); resume with the same rank count, or rerun with --force or another --out");
        for (const ResultRow& row : store->existing()) done.insert(row.id);
        std::cout << "attnbench_mpi: resuming '" << dir << "': " << done.size() << " row(s) kept\n";
      }
    } catch (const UsageError& e) {
      status = 2, message = std::string("attnbench_mpi: error: ") + e.what();
    } catch (const std::exception& e) {
      status = 1, message = std::string("attnbench_mpi: failed: ") + e.what();
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (status != 0) {
    if (rank == 0) std::cerr << message << "\n";
    return status;
  }
  if (rank != 0) simd::select_isa(o.isa, "--isa");

  std::size_t next = 0, written = 0;
  while (true) {
    // Rank 0: the next point to measure, writing skipped rows on the way.
    PointMsg msg;
    const SweepPoint* pt = nullptr;
    if (rank == 0) {
      for (; next < plan.points.size(); ++next) {
        const SweepPoint& cand = plan.points[next];
        if (!o.filter.empty() && cand.id.find(o.filter) == std::string::npos) continue;
        if (done.count(cand.id + ",ranks=" + std::to_string(P))) continue;  // --resume: measured already
        std::string why = ring_skip_reason(cand, P);
        if (why.empty()) why = skip_reason(cand, plan.config);
        if (why.empty()) {
          pt = &cand;
          ++next;
          break;
        }
        ResultRow row;
        row.id = cand.id + ",ranks=" + std::to_string(P);
        row.variant = cand.problem.variant;
        row.params = cand.problem.params;
        row.batch = cand.problem.batch, row.heads = cand.problem.heads, row.seq_q = cand.problem.seq_q;
        row.seq_kv = cand.problem.seq_kv, row.head_dim = cand.problem.head_dim;
        row.kv_heads = cand.problem.num_kv_heads();
        row.mask = cand.mask.label(), row.regime = cand.regime.label(), row.threads = cand.threads;
        row.dtype = dtype_name(cand.problem.dtype), row.bias = bias_name(cand.problem.bias);
        row.status = "skipped", row.reason = why;
        row.memory.peak_note = "not measured: the point was skipped";
        store->append(row, {{"ranks", P}, {"bytes_sent_per_rank", nullptr}});
        ++written;
      }
      if (pt) {
        const Problem& p = pt->problem;
        msg = {1,
               p.batch,
               p.heads,
               p.num_kv_heads(),
               p.seq_q,
               p.head_dim,
               pt->mask.spec.any_causal() ? 1 : 0,
               p.param_int("tile_q"),
               p.param_int("tile_kv"),
               pt->threads,
               p.scale ? *p.scale : NAN};
      }
    }
    MPI_Bcast(&msg, sizeof msg, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (!msg.go) break;

    const Shape shape{msg.batch, msg.heads, msg.kv_heads, msg.n, msg.head_dim};
    Problem base = make_problem("tiled", Json{{"tile_q", msg.tile_q}, {"tile_kv", msg.tile_kv}});
    base.batch = shape.batch, base.heads = shape.heads, base.kv_heads = shape.kv_heads;
    base.head_dim = shape.head_dim, base.seq_q = base.seq_kv = shape.n;
    if (!std::isnan(msg.scale)) base.scale = msg.scale;
    const bool causal = msg.causal != 0;
    const Zigzag z(shape.n, P);
    ThreadScope scope(static_cast<int>(msg.threads));

    PointInputs inputs;
    if (rank == 0) inputs = make_inputs(*pt);
    RankData data;
    SourceFn source;
    if (rank == 0)
      source = [&](int t, int64_t first, int64_t count, float* out) {
        const FloatArray& a = t == 0 ? inputs.q : t == 1 ? inputs.k : inputs.v;
        std::copy_n(a.ptr() + first, count, out);
      };
    scatter(MPI_COMM_WORLD, z, shape, source, data);
    const RankMemory need = rank_memory(z, shape, rank, base, static_cast<int>(msg.threads), true);
    // Memory as `attnbench run` reads it: the resident high-water mark is reset once the rank holds its share
    // of Q, K, V, so the increase is what the ring itself needs (output, the second K/V buffer, tiled's
    // workspace). The row's memory.peak_bytes is the largest rank's; each rank's absolute peak is in `ring`.
    MemoryProbe memory;
    memory.reset();

    // Timing: warm-up, then repetitions until the config's measure settings stop them. A repetition's time is
    // the slowest rank's (MPI_Allreduce max), so every rank sees the same samples and stops together.
    const MeasureSettings& ms = plan.config.measure;  // rank 0's; broadcast below
    int settings[3] = {ms.warmup, ms.min_reps, ms.max_reps};
    double limits[2] = {ms.min_time_s, ms.max_time_s};
    MPI_Bcast(settings, 3, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(limits, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    std::vector<double> samples_ms;
    RankStats last;
    double spent = 0;
    for (int rep = 0;; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      RankData work;
      work.q[0] = data.q[0], work.q[1] = data.q[1], work.kv = data.kv;  // the ring consumes its K/V buffer
      last = ring_attention(MPI_COMM_WORLD, base, causal, z, shape, work);
      double slowest = 0;
      MPI_Allreduce(&last.total_s, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rep < settings[0]) continue;
      samples_ms.push_back(slowest * 1e3);
      spent += slowest;
      const int reps = static_cast<int>(samples_ms.size());
      if (reps >= settings[2] || spent >= limits[1] || (reps >= settings[1] && spent >= limits[0])) {
        data.out[0] = std::move(work.out[0]);
        data.out[1] = std::move(work.out[1]);
        break;
      }
    }
    FloatArray out;
    SinkFn sink;
    if (rank == 0) {
      out = FloatArray({shape.batch, shape.heads, shape.n, shape.head_dim});
      sink = [&](int64_t first, int64_t count, const float* v) { std::copy_n(v, count, out.ptr() + first); };
    }
    const int64_t increase = memory.supported() ? memory.peak_increase() : -1;
    int64_t max_increase = 0;
    MPI_Allreduce(&increase, &max_increase, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    // The estimate of the rank with the most: what it holds, and what the timed ring adds beyond that.
    int64_t est[4] = {static_cast<int64_t>(need.beyond_inputs()), static_cast<int64_t>(need.inputs),
                      static_cast<int64_t>(need.workspace), 0},
            est_max[4] = {0, 0, 0, 0};
    MPI_Allreduce(est, est_max, 4, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    // NaN never leaks silently: non-finite outputs (each counted on the rank holding them) fail the point
    // when the inputs were finite.
    const RankNonfinite bad_out = count_rank_nonfinite(z, shape, rank, data);
    int64_t bad_out_sum = 0;
    MPI_Reduce(&bad_out.out, &bad_out_sum, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    const Json report =
        rank_report(MPI_COMM_WORLD, z, shape, last, peak_rss_bytes(), static_cast<int>(msg.threads), causal);
    gather(MPI_COMM_WORLD, z, shape, data, sink);
    if (rank != 0) continue;

    const Problem& p = pt->problem;
    ResultRow row;
    row.id = pt->id + ",ranks=" + std::to_string(P);
    row.variant = p.variant;
    row.params = p.params;
    row.batch = p.batch, row.heads = p.heads, row.seq_q = p.seq_q, row.seq_kv = p.seq_kv;
    row.head_dim = p.head_dim, row.kv_heads = p.num_kv_heads();
    row.mask = pt->mask.label(), row.regime = pt->regime.label(), row.threads = pt->threads;
    row.isa = simd::active_isa(), row.dtype = "fp32", row.bias = "none", row.exact = true;
    const TimingStats t = summarize(samples_ms);
    row.time_ms.median = t.median_ms, row.time_ms.p10 = t.p10_ms, row.time_ms.p90 = t.p90_ms;
    row.time_ms.mean = t.mean_ms, row.time_ms.cv = t.cv, row.time_ms.reps = t.reps;
    row.time_ms.samples = t.samples_ms;
    if (t.ci.ok) row.time_ms.ci_lo = t.ci.lo, row.time_ms.ci_hi = t.ci.hi, row.time_ms.ci_level = t.ci.level;
    row.attempts = 1;
    row.flops = exact_attention_flops(p);
    row.gflops = *row.flops / (t.median_ms * 1e6);
    // Accuracy against the fp64 reference on the config's rows (as attnbench run).
    const std::string mode = accuracy_mode(p, plan.config.accuracy);
    row.accuracy.reference = mode;
    if (mode != "none") {
      const std::vector<int64_t> sel = accuracy_rows(p, plan.config.accuracy);
      const int64_t bh = p.batch * p.heads;
      std::vector<double> want(static_cast<std::size_t>(bh) * sel.size() * p.head_dim);
      const AttentionInputs in = inputs.view(out.ptr());
      reference_attention(p, in, want.data(), &sel);
      const std::vector<float> got = gather_rows(out.ptr(), bh, p.seq_q, p.head_dim, sel);
      const ErrorMetrics m =
          compare_outputs(got.data(), want.data(), bh * static_cast<int64_t>(sel.size()), p.head_dim);
      row.accuracy.rows = static_cast<int64_t>(sel.size());
      row.accuracy.max_abs_err = m.max_abs_err, row.accuracy.rel_l2_err = m.rel_l2_err;
      row.accuracy.mean_cosine = m.mean_cosine, row.accuracy.nan_count = m.nan_count;
      row.accuracy.inf_count = m.inf_count;
    }
    row.accuracy_e2e = row.accuracy;
    const int64_t bad_in = count_nonfinite(inputs.q.ptr(), inputs.q.numel()) +
                           count_nonfinite(inputs.k.ptr(), inputs.k.numel()) +
                           count_nonfinite(inputs.v.ptr(), inputs.v.numel());
    row.nonfinite_inputs = bad_in;
    if (bad_out_sum && !bad_in) {
      row.status = "failed";
      row.reason = std::to_string(bad_out_sum) + " NaN/Inf values in the output from finite inputs";
    }
    // Per rank (the largest over the ranks): `estimated_bytes` what the timed ring adds to the rank's share
    // of the inputs (output, ring buffers, tiled's workspace, the per-repetition copies): the bound of
    // `peak_bytes`; `inputs_bytes` that share. Rank 0 also holds the whole inputs and output of the point.
    row.memory.estimated_bytes = static_cast<uint64_t>(est_max[0]);
    row.memory.inputs_bytes = static_cast<uint64_t>(est_max[1]);
    row.memory.workspace_bytes = static_cast<uint64_t>(est_max[2]);
    if (memory.supported() && max_increase >= 0)
      row.memory.peak_bytes = max_increase;
    else
      row.memory.peak_note =
          "not measured: this kernel cannot reset the resident high-water mark (clear_refs)";
    int64_t most = 0;  // the rank that sent the most (ranks differ by at most a position's K/V per step)
    for (const Json& r : report["per_rank"]) most = std::max(most, r["bytes_sent"].get<int64_t>());
    // Rank 0 also makes the point's whole inputs and gathers its whole output (for the accuracy check),
    // beyond the ring's per-rank memory above.
    const double rank0_whole = static_cast<double>(inputs.bytes() + out.numel() * sizeof(float));
    store->append(row, {{"ranks", P},
                        {"bytes_sent_per_rank", most},
                        {"rank0_whole_tensors_bytes", rank0_whole},
                        {"ring", report}});
    ++written;
    std::cerr << "attnbench_mpi: " << row.id << "  " << t.median_ms << " ms (slowest of " << P << " ranks)\n";
  }
  if (rank == 0) {
    store->finish(false);
    std::cout << "attnbench_mpi: " << written << " row(s) written, " << done.size() << " kept, in "
              << store->dir() << "\n";
  }
  return 0;
}

}  // namespace attn::ring
