#!/usr/bin/python3
"""Turns an attnbench results folder into paper figures (PNG + SVG) and a self-contained REPORT.md.

    /usr/bin/python3 scripts/plot.py RESULTS_DIR [--out DIR]
    /usr/bin/python3 scripts/plot.py --patterns DIR [--out DIR]     (or RESULTS_DIR holding patterns.json)
    /usr/bin/python3 scripts/plot.py --compare COMPARE_JSON [--out DIR]
    /usr/bin/python3 scripts/plot.py --drift DRIFT_JSON [DRIFT_JSON ...] [--out DIR]
    /usr/bin/python3 scripts/plot.py QUALITY_DIR [--speed RESULTS_DIR] [--out DIR]

RESULTS_DIR holds what `attnbench run` writes (results.jsonl, meta.json) and, optionally, the PyTorch peer rows
(results.peers.jsonl, scripts/peers/torch_attention.py). Figures go to OUT/plots/, the report to
OUT/REPORT.md and the numbers behind it (fitted exponents, crossovers, key ratios, measurement conditions) to
OUT/summary.json; OUT defaults to RESULTS_DIR. A RESULTS_DIR/patterns/ folder written by `attnbench patterns`
is drawn and embedded too (a variant without a pattern is listed with its reason; a folder with none is bad
input). --compare draws OUT/compare.png and .svg (OUT defaults to the file's folder) from
what `attnbench compare A B --json` printed (scripts/plotlib/compare.py). --drift draws OUT/drift.png and .svg
(OUT defaults to the first file's folder) from what `attnbench drift ... --json` printed (scripts/plotlib/drift.py).
A QUALITY_DIR written by scripts/quality gets the task-quality figures and a REPORT.md with its "What it can learn"
section (scripts/plotlib/quality.py); --speed names a sweep's folder whose times at the tasks' lengths the
accuracy-against-time figure uses (default: the config's speed_results, else the training step times).
Results of backward passes (sweep.pass) draw each pass side by side and add a "Training (forward + backward)"
section and a training crossover column to the report; decode rows (seq_q < seq_kv, causal_lower_right) add
plots/decode and a Decode section, a variant measured at several `chunk` values plots/chunk_size and a Chunk size
section, several storage dtypes (sweep.dtype) plots/dtype_vs_fp32 in the Accuracy by dtype section, rows with
accuracy_vs_softmax an "Accuracy against each reference" section. Needs numpy and matplotlib only (Debian's python3-numpy, python3-matplotlib); runs headless (Agg).
Exit codes: 0 done, 2 bad input (the message names the file or option).

On stdout: the path of every file written, one a line (RESULTS_DIR: REPORT.md's last), then for RESULTS_DIR a
short summary for the terminal (scripts/run ends on it; at most ~15 lines for the default sweep), its first line
starting "Summary (": per mask (and setting) the fastest variant at each n with its time and whether it is exact,
then the crossovers REPORT.md's Crossover table names (plotlib/terminal.py). Warnings go to stderr.

This is the command line; the work is in scripts/plotlib/, one stage per module: results (read the folder)
-> analysis (every number, before anything is drawn; it is summary.json) -> figures (draw only) -> report.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))  # plotlib/ next to this file (any cwd, symlinks)

from plotlib.common import PROG, InputError, atomic_write_text  # noqa: E402
from plotlib.patterns import load_patterns  # noqa: E402
from plotlib.results import Results  # noqa: E402
from plotlib.analysis import analyse  # noqa: E402
from plotlib.report import write_report  # noqa: E402
from plotlib.terminal import summary_lines  # noqa: E402


def plot_patterns_only(pdir, out_dir):
    pats = load_patterns(pdir)
    from plotlib import figures

    os.makedirs(out_dir, exist_ok=True)
    for p in figures.draw_patterns(pats, out_dir):
        print(p)
    return 0


def plot_results(results_dir, out_dir):
    res = Results(results_dir)
    analysis = analyse(res)
    from plotlib import figures

    plots = os.path.join(out_dir, "plots")
    os.makedirs(plots, exist_ok=True)
    written = figures.draw_results(res, analysis, plots)
    if res.patterns:  # RESULTS_DIR/patterns/
        written += figures.draw_patterns(res.patterns, plots)
    files = [os.path.relpath(p, out_dir) for p in written]
    report = write_report(res, analysis, out_dir, files)
    summary = dict(analysis, files=files + ["REPORT.md"])
    atomic_write_text(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=2, default=str) + "\n")
    for p in written:
        print(p)
    print(report)
    print("\n".join(summary_lines(analysis)))
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dir", nargs="?", help="folder written by `attnbench run` (results.jsonl, meta.json)")
    ap.add_argument("--patterns", metavar="DIR", help="draw the folder written by `attnbench patterns` instead")
    ap.add_argument("--compare", metavar="COMPARE_JSON",
                    help="draw compare.png/.svg from what `attnbench compare A B --json` printed instead")
    ap.add_argument("--drift", metavar="DRIFT_JSON", nargs="+",
                    help="draw drift.png/.svg from what `attnbench drift ... --json` printed (one or more files) instead")
    ap.add_argument("--out", metavar="DIR", help="where to write (default: the input folder)")
    ap.add_argument("--speed", metavar="RESULTS_DIR", help="a quality folder's accuracy-against-time figure: the "
                    "times of this sweep's folder at the tasks' lengths")
    a = ap.parse_args(argv)
    try:
        if sum(bool(x) for x in (a.results_dir, a.patterns, a.compare, a.drift)) > 1:
            raise InputError("give one of RESULTS_DIR, --patterns DIR, --compare COMPARE_JSON and --drift DRIFT_JSON")
        if a.drift:
            from plotlib.drift import plot_drift

            return plot_drift(a.drift, a.out)
        if a.compare:
            from plotlib.compare import plot_compare

            return plot_compare(a.compare, a.out)
        if a.patterns:
            return plot_patterns_only(a.patterns, a.out or a.patterns)
        if not a.results_dir:
            raise InputError("missing RESULTS_DIR (or --patterns DIR, or --compare COMPARE_JSON); see --help")
        if os.path.isfile(os.path.join(a.results_dir, "patterns.json")):
            return plot_patterns_only(a.results_dir, a.out or a.results_dir)
        from plotlib import quality

        if quality.is_quality_folder(a.results_dir):
            return quality.plot_quality(a.results_dir, a.out or a.results_dir, a.speed)
        if a.speed:
            raise InputError("--speed applies to a quality folder (written by scripts/quality) only")
        return plot_results(a.results_dir, a.out or a.results_dir)
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
