// attnbench_mpi run (sweep.hpp): the one sweep driver of bench/lib (run_sweep) on rank 0 with the ring as
// its executor, and the other ranks serving it. Per point rank 0 broadcasts what every rank needs (the
// variant and its parameters, sizes, causality, threads, scale, the measure settings), every rank runs the
// ring, and rank 0 fills the row as `attnbench run` does (base_row, fill_timing, the accuracy references)
// plus the ring's own figures; the end of the sweep (with its exit status) is one more broadcast.
#include "bench/mpi/sweep.hpp"

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>

#include "bench/lib/accuracy.hpp"
#include "bench/lib/executor.hpp"
#include "bench/lib/inputs.hpp"
#include "bench/lib/measure.hpp"
#include "bench/lib/plan.hpp"
#include "bench/lib/rows.hpp"
#include "bench/lib/sweep.hpp"
#include "bench/mpi/ring.hpp"
#include "common/interface/util.hpp"
#include "common/kernels/simd.hpp"
#include "common/support/error.hpp"
#include "common/support/runtime.hpp"

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

// Why the ring cannot run this point ("" when it can): the variant must compute block partials (and take
// this block problem), and the ring runs fp32 self-attention with no mask or a causal one.
std::string ring_skip_reason(const SweepPoint& pt, int P) {
  const Problem& p = pt.problem;
  const std::string what = ": attnbench_mpi runs fp32 self-attention with no mask or a causal one";
  const Attention& v = Registry::instance().get(p.variant);
  if (!v.capabilities().block_partials)
    return p.variant + " does not compute block partials, which ring attention runs on (variants that do: " +
           join(block_variants()) + ")";
  if (p.dtype != DType::fp32) return std::string("dtype ") + dtype_name(p.dtype) + what;
  if (p.bias != Bias::none) return "bias " + std::string(bias_name(p.bias)) + what;
  if (p.dropout > 0) return "dropout" + what;
  if (pt.mask.label() != "none" && pt.mask.label() != "causal") return "mask " + pt.mask.label() + what;
  if (pt.regime.rope.on()) return "RoPE" + what;
  if (pt.pass != Pass::forward) return std::string("pass ") + pass_name(pt.pass) + ": the ring runs forwards";
  if (p.seq_q != p.seq_kv) return "seq_q != seq_kv" + what;
  if (P > p.seq_q)
    return std::to_string(P) + " ranks for n = " + std::to_string(p.seq_q) + ": ring attention needs P <= n";
  if (const std::vector<std::string> why = v.block_not_supported_reasons(p); !why.empty())
    return join(why, "; ");
  return "";
}

// What rank 0 broadcasts per point (or, with go = 0, the end of the sweep and its exit status), then the
// variant's repro head ("name{params}") as a string.
struct PointMsg {
  int64_t go = 0, status = 0, batch = 1, heads = 1, kv_heads = 1, n = 1, head_dim = 1, causal = 0,
          threads = 1;
  int64_t warmup = 0, min_reps = 1, max_reps = 1;
  double scale = NAN, min_time_s = 0, max_time_s = 0;
  int64_t v_dim = 1;  // d_v (= head_dim unless the point has a distinct value width)
};

void broadcast_string(std::string& s) {
  int64_t len = static_cast<int64_t>(s.size());
  MPI_Bcast(&len, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  s.resize(static_cast<std::size_t>(len));
  MPI_Bcast(s.data(), static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD);
}

// What one point's ring leaves on rank 0 (every rank computes the collective parts).
struct RingRun {
  std::vector<double> samples_ms;   // per repetition, the slowest rank's ring time
  FloatArray out;                   // the gathered output (rank 0)
  int64_t max_peak_increase = -1;   // the largest rank's resident increase while timed (-1: not measured)
  int64_t estimate[3] = {0, 0, 0};  // the largest rank's estimate: beyond its inputs, its inputs, workspace
  int64_t nonfinite_out = 0;        // NaN / Inf in the output, over the ranks
  Json report;                      // rank_report (rank 0)
};

// The ring for one point on every rank (collective): scatter, timed repetitions until the measure settings
// stop them (the slowest rank's time, so every rank sees the same samples and stops together), memory,
// non-finite outputs, the per-rank report and the gathered output. `inputs` is rank 0's (null elsewhere).
RingRun run_point_ring(const PointMsg& msg, const Problem& base, const PointInputs* inputs) {
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const Shape shape{msg.batch, msg.heads, msg.kv_heads, msg.n, msg.head_dim, msg.v_dim};
  const bool causal = msg.causal != 0;
  const Zigzag z(shape.n, P);
  ThreadScope scope(static_cast<int>(msg.threads));
  RankData data;
  SourceFn source;
  if (rank == 0)
    source = [&](int t, int64_t first, int64_t count, float* out) {
      const FloatArray& a = t == 0 ? inputs->q : t == 1 ? inputs->k : inputs->v;
      std::copy_n(a.ptr() + first, count, out);
    };
  scatter(MPI_COMM_WORLD, z, shape, source, data);
  const RankMemory need = rank_memory(z, shape, rank, base, static_cast<int>(msg.threads), true);
  // Memory as `attnbench run` reads it: the resident high-water mark is reset once the rank holds its share
  // of Q, K, V, so the increase is what the ring itself needs (output, the second K/V buffer, the variant's
  // block workspace). The row's memory.peak_bytes is the largest rank's; each rank's absolute peak is in
  // `ring`.
  MemoryProbe memory;
  memory.reset();
  RingRun run;
  RankStats last;
  double spent = 0;
  for (int rep = 0;; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    RankData work;
    work.q[0] = data.q[0], work.q[1] = data.q[1], work.kv = data.kv;  // the ring consumes its K/V buffer
    last = ring_attention(MPI_COMM_WORLD, base, causal, z, shape, work);
    double slowest = 0;
    MPI_Allreduce(&last.total_s, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rep < msg.warmup) continue;
    run.samples_ms.push_back(slowest * 1e3);
    spent += slowest;
    const int64_t reps = static_cast<int64_t>(run.samples_ms.size());
    if (reps >= msg.max_reps || spent >= msg.max_time_s ||
        (reps >= msg.min_reps && spent >= msg.min_time_s)) {
      data.out[0] = std::move(work.out[0]);
      data.out[1] = std::move(work.out[1]);
      break;
    }
  }
  const int64_t increase = memory.supported() ? memory.peak_increase() : -1;
  MPI_Allreduce(&increase, &run.max_peak_increase, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  int64_t est[3] = {static_cast<int64_t>(need.beyond_inputs()), static_cast<int64_t>(need.inputs),
                    static_cast<int64_t>(need.workspace)};
  MPI_Allreduce(est, run.estimate, 3, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  // NaN never leaks silently: non-finite outputs (each counted on the rank holding them).
  const RankNonfinite bad_out = count_rank_nonfinite(z, shape, rank, data);
  MPI_Reduce(&bad_out.out, &run.nonfinite_out, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  run.report =
      rank_report(MPI_COMM_WORLD, z, shape, last, peak_rss_bytes(), static_cast<int>(msg.threads), causal);
  SinkFn sink;
  if (rank == 0) {
    run.out = FloatArray({shape.batch, shape.heads, shape.n, shape.v_dim});
    sink = [&](int64_t first, int64_t count, const float* v) {
      std::copy_n(v, count, run.out.ptr() + first);
    };
  }
  gather(MPI_COMM_WORLD, z, shape, data, sink);
  return run;
}

// The block problem every rank builds from a point message and the variant's repro head.
Problem base_problem(const PointMsg& msg, const std::string& head) {
  Problem base = parse_problem(head + ":B=1,H=1,Lq=1,Lkv=1,D=1");
  base.batch = msg.batch, base.heads = msg.heads,
  base.kv_heads = msg.kv_heads == msg.heads ? 0 : msg.kv_heads;
  base.head_dim = msg.head_dim, base.seq_q = base.seq_kv = msg.n;
  base.v_head_dim = msg.v_dim == msg.head_dim ? 0 : msg.v_dim;
  if (!std::isnan(msg.scale)) base.scale = msg.scale;
  return base;
}

// Rank 0's executor: one point at a time through the ring; skipped points never leave rank 0.
class RingExecutor final : public Executor {
 public:
  RingExecutor(const SweepConfig& config, int ranks)
      : config_(config), ranks_(ranks), references_(config.accuracy) {}
  // Releases the serving ranks with the sweep's exit status (also when the driver threw).
  ~RingExecutor() override { finish(1); }
  void finish(int status) {
    if (finished_) return;
    finished_ = true;
    PointMsg end;
    end.status = status;
    MPI_Bcast(&end, sizeof end, MPI_BYTE, 0, MPI_COMM_WORLD);
  }

  Json machine_facts() const override {
    return {{"ranks", ranks_}, {"program", "attnbench_mpi run"}, {"isa", simd::active_isa()}};
  }
  void check_resume(const Json& meta) const override {
    const Json was = meta.value("ranks", Json());
    if (!was.is_number_integer() || was.get<int>() != ranks_)
      throw UsageError("--resume: the interrupted run ran with " +
                       (was.is_number_integer() ? std::to_string(was.get<int>()) : std::string("no")) +
                       " ranks, this one with " + std::to_string(ranks_) + " (mpirun -np " +
                       std::to_string(ranks_) +
                       "); resume with the same rank count, or rerun with --force or another --out");
  }
  void prepare(Json&, const std::function<bool()>&) override {}  // rows carry no fractions of a calibration
  bool groups_input_sets(const SweepConfig&) const override { return false; }
  std::string row_id(const SweepPoint& pt) const override {
    return pt.id + ",ranks=" + std::to_string(ranks_);
  }

  std::vector<ResultRow> measure(const std::vector<SweepPoint>& group, const std::function<bool()>&,
                                 bool& interrupted) override {
    interrupted = false;
    std::vector<ResultRow> rows;
    for (const SweepPoint& pt : group) rows.push_back(measure_point(pt));
    return rows;
  }

 private:
  ResultRow measure_point(const SweepPoint& pt) {
    ResultRow row = base_row(pt, config_, simd::active_isa());
    row.id = row_id(pt);
    row.ring = ResultRow::Ring{ranks_, std::nullopt, std::nullopt, Json()};
    std::string why = ring_skip_reason(pt, ranks_);
    if (why.empty()) why = skip_reason(pt, config_);
    if (!why.empty()) {
      row.status = "skipped", row.reason = why;
      row.memory.peak_note = "not measured: the point was skipped";
      return row;
    }
    const Problem& p = pt.problem;
    const MeasureSettings& ms = config_.measure;
    PointMsg msg{1,
                 0,
                 p.batch,
                 p.heads,
                 p.num_kv_heads(),
                 p.seq_q,
                 p.head_dim,
                 pt.mask.spec.any_causal() ? 1 : 0,
                 pt.threads,
                 ms.warmup,
                 ms.min_reps,
                 ms.max_reps,
                 p.scale ? *p.scale : NAN,
                 ms.min_time_s,
                 ms.max_time_s};
    msg.v_dim = p.value_dim();
    std::string head = p.repro();
    head = head.substr(0, head.rfind(':'));
    MPI_Bcast(&msg, sizeof msg, MPI_BYTE, 0, MPI_COMM_WORLD);
    broadcast_string(head);
    const PointInputs inputs = make_inputs(pt);
    const RingRun run = run_point_ring(msg, base_problem(msg, head), &inputs);
    fill_row(pt, inputs, run, row);
    std::cerr << "attnbench_mpi: " << row.id << "  " << *row.time_ms.median << " ms (slowest of " << ranks_
              << " ranks)\n";
    return row;
  }

  void fill_row(const SweepPoint& pt, const PointInputs& inputs, const RingRun& run, ResultRow& row) {
    fill_timing(row, summarize(run.samples_ms), point_flops(pt), nullptr);
    row.attempts = 1;
    references_.fill_forward(pt, inputs.view(pt.problem, nullptr), inputs.view(pt.problem, nullptr),
                             run.out.ptr(), row);
    const int64_t bad_in = count_nonfinite(inputs.q.ptr(), inputs.q.numel()) +
                           count_nonfinite(inputs.k.ptr(), inputs.k.numel()) +
                           count_nonfinite(inputs.v.ptr(), inputs.v.numel());
    row.nonfinite_inputs = bad_in;
    if (run.nonfinite_out && !bad_in) {
      row.status = "failed";
      row.reason = std::to_string(run.nonfinite_out) + " NaN/Inf values in the output from finite inputs";
    }
    // Per rank (the largest over the ranks): `estimated_bytes` what the timed ring adds to the rank's share
    // of the inputs (output, ring buffers, the block workspace, the per-repetition copies): the bound of
    // `peak_bytes`; `inputs_bytes` that share. Rank 0 also holds the whole inputs and output of the point.
    row.memory.estimated_bytes = static_cast<uint64_t>(run.estimate[0]);
    row.memory.inputs_bytes = static_cast<uint64_t>(run.estimate[1]);
    row.memory.workspace_bytes = static_cast<uint64_t>(run.estimate[2]);
    if (run.max_peak_increase >= 0)
      row.memory.peak_bytes = run.max_peak_increase;
    else
      row.memory.peak_note =
          "not measured: this kernel cannot reset the resident high-water mark (clear_refs)";
    int64_t most = 0;  // the rank that sent the most (ranks differ by at most a position's K/V per step)
    for (const Json& r : run.report["per_rank"]) most = std::max(most, r["bytes_sent"].get<int64_t>());
    row.ring->bytes_sent_per_rank = static_cast<double>(most);
    row.ring->rank0_whole_tensors_bytes =
        static_cast<double>(inputs.bytes() + run.out.numel() * sizeof(float));
    row.ring->report = run.report;
  }

  const SweepConfig& config_;
  int ranks_;
  AccuracyReferences references_;
  bool finished_ = false;
};

// Ranks other than 0: serve the points rank 0 broadcasts until the end message; returns its status.
int serve_ring_points() {
  while (true) {
    PointMsg msg;
    MPI_Bcast(&msg, sizeof msg, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (!msg.go) return static_cast<int>(msg.status);
    std::string head;
    broadcast_string(head);
    run_point_ring(msg, base_problem(msg, head), nullptr);
  }
}

}  // namespace

int run_sweep(const SweepOptions& o, int threads) {
  (void)threads;
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  if (rank != 0) {
    simd::select_isa(o.isa, "--isa");
    return serve_ring_points();
  }
  // Rank 0: the plan (a config error ends the sweep for every rank with exit 2), then the one driver.
  int status = 0;
  std::string message;
  Plan plan;
  try {
    if (o.resume && o.force) throw UsageError("--resume and --force exclude each other");
    simd::select_isa(o.isa, "--isa");
    plan = load_plan(o.config, o.isa);
  } catch (const UsageError& e) {
    status = 2, message = std::string("attnbench_mpi: error: ") + e.what();
  } catch (const std::exception& e) {
    status = 1, message = std::string("attnbench_mpi: failed: ") + e.what();
  }
  RingExecutor executor(plan.config, P);
  if (status == 0) {
    attn::SweepOptions so;
    so.out_dir = o.out.empty() ? "results/" + plan.config.name + "-mpi" + std::to_string(P) : o.out;
    so.resume = o.resume, so.force = o.force, so.filter = o.filter, so.isa = o.isa;
    try {
      status = attn::run_sweep(plan, so, executor);
    } catch (const UsageError& e) {
      status = 2, message = std::string("attnbench_mpi: error: ") + e.what();
    } catch (const std::exception& e) {
      status = 1, message = std::string("attnbench_mpi: failed: ") + e.what();
    }
  }
  executor.finish(status);
  if (!message.empty()) std::cerr << message << "\n";
  return status;
}

}  // namespace attn::ring
