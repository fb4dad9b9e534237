"""scripts/quality's command line: runs the points of a quality config into a results folder, with progress
lines and an ETA on stderr, resumable, then draws the figures and REPORT.md (scripts/plot.py).

    scripts/quality [CONFIG.json] [--out DIR] [--resume | --force] [--filter TEXT] [--dry-run] [--no-plot]

Exit codes: 0 every point ok or skipped, 1 some point failed (its row says why), 2 bad config, folder or
options (nothing written), 130 interrupted (Ctrl-C or SIGTERM: the finished points are kept, --resume runs the
rest).
"""
import argparse
import os
import signal
import subprocess
import sys
import time
import traceback

from . import config as config_mod
from . import models, rows, store, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "quality.json")
PROG = "quality"
PRINT_EVERY_S = 15  # at most one evaluation line per point in this many seconds


def log(message):
    print(f"[{PROG}] {message}", file=sys.stderr, flush=True)


def duration(seconds):
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Progress:
    """The lines a run prints: each point as it starts and ends, each evaluation with the pace, and an ETA.
    Points stop at their criterion, usually long before their step limit, so the ETA is an upper bound: the
    remaining steps at their limits, at the seconds per step measured so far for the same task (the point's
    own once it has one)."""

    def __init__(self, points):
        self.points = points
        self.pace = {}  # task -> [seconds, steps] of the training steps so far
        self.start = self.printed = time.perf_counter()
        self.index = 0

    def seconds_per_step(self, task):
        s, n = self.pace.get(task, (0.0, 0))
        return s / n if n else None

    def bound(self, current=None):
        """Seconds left at most: the points after the current one to their step limits (at their task's pace, or
        the current point's while its task has none), plus the current one's."""
        total, unknown, own = 0.0, False, {}
        if current is not None:
            point, outcome = current
            own[point.task] = sum(outcome.step_times) / max(outcome.steps, 1)
            total += own[point.task] * max(point.steps_bound() - outcome.steps, 0)
        for p in self.points[self.index + 1:]:
            per = self.seconds_per_step(p.task) or own.get(p.task)
            unknown |= per is None
            total += (per or 0.0) * p.steps_bound()
        return total, unknown

    def eta_text(self, current=None):
        total, unknown = self.bound(current)
        return f"ETA <= {duration(total)}" + (" (+ tasks not timed yet)" if unknown else "")

    def begin(self, index, point):
        self.index = index
        log(f"[{index + 1}/{len(self.points)}] {point.id}")

    def evaluation(self, point, outcome, train_loss):
        """A line for the evaluation, at most one per PRINT_EVERY_S of a point (the first and the point's end
        line always): long runs evaluate every few seconds."""
        now = time.perf_counter()
        if len(outcome.curve) > 1 and now - self.printed < PRINT_EVERY_S:
            return
        self.printed = now
        e = outcome.curve[-1]
        per = sum(outcome.step_times) / max(outcome.steps, 1)
        log(f"  step {e['step']:6d}  train loss {train_loss:.4g}  eval loss {e['loss']:.4g}  accuracy "
            f"{e['accuracy']:.4f}  {per:.3f} s/step  | elapsed {duration(time.perf_counter() - self.start)}, "
            + self.eta_text((point, outcome)))

    def end(self, point, row):
        t = row["task"]
        if row["status"] == "ok":
            s, n = self.pace.get(point.task, (0.0, 0))
            self.pace[point.task] = (s + t["train_s"], n + t["steps"])
            log(f"  done: best accuracy {t['best_accuracy']:.4f}, best loss {t['best_loss']:.4g}, {t['steps']} steps "
                f"({t['stop']}{', converged' if t['converged'] else ''}) in {duration(t['wall_s'])}")
        else:
            log(f"  {row['status']}: {row['reason']}")


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="scripts/quality", description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="?", default=DEFAULT_CONFIG, help="quality config (default configs/quality.json)")
    ap.add_argument("--out", help="results folder (default results/<name>/ in the checkout)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="finish an interrupted run (the points not in it yet)")
    mode.add_argument("--force", action="store_true", help="replace the folder's results")
    ap.add_argument("--filter", metavar="TEXT", help="run only the points whose id contains TEXT")
    ap.add_argument("--dry-run", action="store_true", help="list the points and their step limits; write nothing")
    ap.add_argument("--no-plot", action="store_true", help="do not run scripts/plot.py on the folder at the end")
    return ap.parse_args(argv)


def dry_run(cfg, points):
    for p in points:
        print(p.id + ("\tskip: " + p.skip if p.skip else f"\tat most {p.steps_bound()} steps"))
    print(f"{len(points)} points ({sum(1 for p in points if p.skip)} skipped)", file=sys.stderr)
    return 0


def run_point(attnbench, point, progress, threads, isa, plugins):
    """The point's row: skipped (its reason), ok (trained), or failed (what went wrong, the run goes on)."""
    plugin = plugins.get(point.variant, "")
    if point.skip:
        return rows.make_row(attnbench, point, None, "skipped", point.skip, threads, isa, plugin)
    outcome = None
    try:
        outcome = train.train(point, lambda o, loss: progress.evaluation(point, o, loss), options={"threads": threads})
        return rows.make_row(attnbench, point, outcome, "ok", "", threads, isa, plugin)
    except train.Diverged as e:
        return rows.make_row(attnbench, point, None, "failed", str(e), threads, isa, plugin)
    except (ValueError, RuntimeError) as e:
        traceback.print_exc()
        return rows.make_row(attnbench, point, None, "failed", f"{type(e).__name__}: {e}", threads, isa, plugin)


def main(argv):
    args = parse_args(argv)
    try:
        import attnbench
        import torch
    except ImportError as e:
        log(f"error: {e} (build the module: scripts/quality builds it; run with Debian's /usr/bin/python3)")
        return 2
    try:
        cfg = config_mod.load(args.config, attnbench.variants, attnbench.load_plugin)
    except config_mod.ConfigError as e:
        log(f"error: {e}")
        return 2
    points = [p for p in cfg.points if not args.filter or args.filter in p.id]
    if not points:
        log(f"error: --filter '{args.filter}': no point of {len(cfg.points)} matches")
        return 2
    if args.dry_run:
        return dry_run(cfg, points)
    out = args.out or os.path.join(ROOT, "results", cfg.name)
    try:
        folder = store.ResultsFolder(out, cfg, args.resume, args.force)
    except store.FolderError as e:
        log(f"error: {e}")
        return 2
    info = attnbench.info()
    threads = cfg.threads or info["cores_available"]
    torch.set_num_threads(cfg.torch_threads)
    meta = meta_json(attnbench, torch, cfg, threads)
    folder.prepare(args.resume, meta)
    folder.write_meta(**{f"loadavg_{'resume' if args.resume else 'start'}": loadavg()})
    status = run_all(attnbench, cfg, folder, points, threads, info["isa"]["best"])
    folder.write_meta(loadavg_end=loadavg())
    if status != 130 and not args.no_plot:
        plotted = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plot.py"), out]).returncode
        status = status or (1 if plotted else 0)
    return status


def harness_commit():
    """The checkout's commit, "+dirty" when bench/quality or the configs differ from it (system.git_commit is
    the module's build, which may predate the harness's Python)."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "bench/quality", "configs"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def loadavg():
    """/proc/loadavg's 1, 5 and 15 minute averages: how busy the machine was (the step times depend on it)."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except (OSError, ValueError):
        return None


def meta_json(attnbench, torch, cfg, threads):
    import numpy

    registry = attnbench.variants()
    return {
        "tool": "attnbench quality", "config_name": cfg.name, "config_path": os.path.abspath(cfg.path),
        "config_hash": cfg.hash, "config": cfg.data, "description": cfg.data.get("description", ""),
        "deviations": cfg.deviations, "model_notes": models.MODEL_NOTES, "speed_results": cfg.speed_results,
        "threads": threads, "torch_threads": cfg.torch_threads,
        "system": attnbench.system_info(), "harness_commit": harness_commit(),
        "python": {"version": sys.version.split()[0], "torch": torch.__version__, "numpy": numpy.__version__},
        "registry": [v["name"] for v in registry],
        "plugins": cfg.plugins,
        "baseline": next((v["name"] for v in registry if v["capabilities"].get("baseline")), None),
        "points_planned": len(cfg.points),
    }


def run_all(attnbench, cfg, folder, points, threads, isa):
    done = folder.done()
    todo = [p for p in points if p.id not in done]
    plugins = {v["name"]: v.get("plugin", "") for v in attnbench.variants()}
    log(f"{cfg.name}: {len(points)} points, {len(points) - len(todo)} already in {folder.out}, {len(todo)} to run "
        f"({sum(1 for p in todo if p.skip)} skipped); attnbench's kernels on {threads} threads, torch's ops on "
        f"{cfg.torch_threads}")
    progress = Progress(todo)
    failed, interrupted = 0, False

    def on_term(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        for i, point in enumerate(todo):
            progress.begin(i, point)
            row = run_point(attnbench, point, progress, threads, isa, plugins)
            folder.append(row)
            failed += row["status"] == "failed"
            progress.end(point, row)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: the finished points are kept; `--resume` runs the rest")
    finally:
        signal.signal(signal.SIGTERM, previous)
        folder.finish(attnbench, interrupted)
    log(f"{len(folder.rows)} rows in {folder.out} in {duration(time.perf_counter() - progress.start)}"
        + (f"; {failed} failed" if failed else ""))
    return 130 if interrupted else (1 if failed else 0)
