#!/usr/bin/python3
"""Turns an attnbench results folder into paper figures (PNG + SVG) and a self-contained REPORT.md.

    /usr/bin/python3 scripts/plot.py RESULTS_DIR [--out DIR]
    /usr/bin/python3 scripts/plot.py --patterns DIR [--out DIR]     (or RESULTS_DIR holding patterns.json)

RESULTS_DIR holds what `attnbench run` writes (results.jsonl, meta.json) and, optionally, the PyTorch peer rows
(results.peers.jsonl, scripts/peers/torch_attention.py). Figures go to OUT/plots/, the report to
OUT/REPORT.md and the numbers behind it (fitted exponents, crossovers) to OUT/summary.json; OUT defaults to
RESULTS_DIR. A RESULTS_DIR/patterns/ folder written by `attnbench patterns` is drawn and embedded too.
Needs numpy and matplotlib only (Debian's python3-numpy, python3-matplotlib); runs headless (Agg).
Exit codes: 0 done, 2 bad input (the message names the file or option).
"""
import argparse
import json
import math
import os
import re
import sys
import tempfile

import numpy as np
import matplotlib

matplotlib.use("Agg")  # headless: no display on CI or over ssh
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import colors as mcolors, ticker  # noqa: E402

# SVGs are byte-stable across runs (no random ids, no date), so committed reports diff cleanly.
matplotlib.rcParams["svg.hashsalt"] = "attnbench"
matplotlib.rcParams["font.size"] = 9

PROG = "plot.py"
FIGURES = ["time_vs_seq", "memory_vs_seq", "accuracy_vs_seq", "pareto", "throughput"]
CONTEXT_DIMS = ["regime", "batch", "heads", "head_dim", "threads", "seq_q"]  # besides mask and n
MAX_FACETS = 24  # subplots per figure; beyond this a figure is unreadable anyway
MAX_TOKEN_LABELS = 48  # pattern heatmaps label their axes with the tokens up to this many


class InputError(Exception):
    """Bad input the user has to fix: reported as `plot.py: error: ...`, exit code 2."""


# ---------------------------------------------------------------------------------------------------------
# Reading results


def read_jsonl(path):
    """Rows of a results .jsonl, last row per id wins (as the C++ reader). A torn last line (a crash
    mid-write) is dropped with a warning; a bad line anywhere else is an error naming file:line."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    rows, by_id = [], {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        is_tail = all(not rest.strip() for rest in lines[no:])
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "id" not in row or "status" not in row:
                raise ValueError("not a result row (needs 'id' and 'status')")
        except ValueError as e:
            if is_tail:
                print(f"{PROG}: warning: {path}:{no}: torn last line dropped ({e})", file=sys.stderr)
                break
            raise InputError(f"{path}:{no}: not a result row: {e}")
        by_id[row["id"]] = len(rows)
        rows.append(row)
    return [r for i, r in enumerate(rows) if by_id[r["id"]] == i]


def num(x):
    """A metric as float: numbers as they are, the strings "inf"/"-inf"/"nan" (how the sweep writes
    non-finite values, JSON having none) as such, null/absent as None."""
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)  # float() reads "inf", "-inf", "nan"
        except ValueError:
            return None
    return None


def get(row, path):
    cur = row
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def params_text(params, keys=None):
    if not params:
        return ""
    keys = sorted(params) if keys is None else keys
    return ",".join(f"{k}={value_text(params[k])}" for k in keys if k in params)


def value_text(v):
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))


class Results:
    """All rows of a results folder, with the series and facet structure the figures share."""

    def __init__(self, results_dir):
        if not os.path.isdir(results_dir):
            raise InputError(f"RESULTS_DIR '{results_dir}' does not exist or is not a directory "
                             "(give the --out folder of `attnbench run`)")
        self.dir = results_dir
        main = os.path.join(results_dir, "results.jsonl")
        if not os.path.isfile(main):
            raise InputError(f"RESULTS_DIR '{results_dir}' holds no results.jsonl "
                             "(run `attnbench run CONFIG --out DIR` first, then plot DIR)")
        self.rows = read_jsonl(main)
        for r in self.rows:
            r["_source"] = "attnbench"
        peers = os.path.join(results_dir, "results.peers.jsonl")
        self.peer_rows = read_jsonl(peers) if os.path.isfile(peers) else []
        for r in self.peer_rows:
            r["_source"] = "peer"
        self.meta = {}
        meta_path = os.path.join(results_dir, "meta.json")
        if os.path.isfile(meta_path):
            try:
                with open(meta_path, encoding="utf-8") as f:
                    self.meta = json.load(f)
            except ValueError as e:
                raise InputError(f"{meta_path}: not valid JSON ({e})")
            if not isinstance(self.meta, dict):
                raise InputError(f"{meta_path}: must hold a JSON object")
        else:
            print(f"{PROG}: warning: {meta_path} missing: the report will not name the machine or config",
                  file=sys.stderr)
        all_rows = self.rows + self.peer_rows
        if not all_rows:
            raise InputError(f"{main}: holds no result rows")
        for r in all_rows:
            for key in ("variant", "seq_kv", "mask"):
                if key not in r:
                    raise InputError(f"{main if r['_source'] == 'attnbench' else peers}: row '{r['id']}' "
                                     f"has no '{key}'")
        self.ok = [r for r in all_rows if r.get("status") == "ok" and num(get(r, "time_ms.median"))]
        ok_ids = {id(r) for r in self.ok}
        self.excluded = [r for r in all_rows if id(r) not in ok_ids]
        self.calibration = {int(c["threads"]): float(c["gflops"])
                            for c in self.meta.get("sgemm_calibration", []) if "threads" in c and "gflops" in c}
        for r in self.ok:  # peer rows carry gflops; their fraction of sgemm comes from this run's calibration
            if num(r.get("frac_sgemm")) is None and num(r.get("gflops")) and r.get("threads") in self.calibration:
                r["frac_sgemm"] = num(r["gflops"]) / self.calibration[r["threads"]]
        self._label_rows(all_rows)
        # With no measured row the figures still come out (saying "no data") next to the report's reasons.
        self.masks = sorted({r["mask"] for r in self.ok}, key=mask_order) or ["none"]
        self.varying = [d for d in CONTEXT_DIMS if len({context_value(r, d) for r in self.ok}) > 1]
        self.rest = sorted({self.rest_key(r) for r in self.ok}, key=str) or [()]
        self.colors = color_map(sorted({r["_label"] for r in self.ok}))

    def _label_rows(self, rows):
        # A series label names the variant and only the parameters that vary for it in these results (the
        # full parameter sets are in the key-figures table), so legends stay short.
        values = {}
        for r in rows:
            for k, v in (r.get("params") or {}).items():
                values.setdefault((r["variant"], k), set()).add(json.dumps(v, sort_keys=True))
        # A sweep over SIMD targets (sweep.isa) gives each target its own curve: "tiled [avx2]". The isa is the
        # target that ran; peer rows have none (PyTorch picks its own kernels).
        several_isas = len({r.get("isa") for r in rows if r.get("isa")}) > 1
        for r in rows:
            params = r.get("params") or {}
            keys = [k for k in sorted(params) if len(values[(r["variant"], k)]) > 1]
            r["_label"] = r["variant"] + (f"({params_text(params, keys)})" if keys else "")
            if several_isas and r.get("isa"):
                r["_label"] += f" [{r['isa']}]"
            r["_params"] = params_text(params)

    def rest_key(self, r):
        """The facet row: the context dimensions (regime, shapes, threads) that vary in these results."""
        return tuple(context_value(r, d) for d in self.varying)

    def rest_title(self, key):
        return ", ".join(f"{d}={v}" for d, v in zip(self.varying, key) if v is not None)

    def series(self, rows):
        """{(label, mask, rest_key): rows sorted by n}."""
        out = {}
        for r in rows:
            out.setdefault((r["_label"], r["mask"], self.rest_key(r)), []).append(r)
        for v in out.values():
            v.sort(key=lambda r: r["seq_kv"])
        return out


def context_value(r, dim):
    if dim == "seq_q":  # cross-attention: n on the x axis is seq_kv, each seq_q is its own facet
        return r.get("seq_q") if r.get("seq_q") != r.get("seq_kv") else None
    return r.get(dim)


def mask_order(m):
    return (0 if m == "none" else 1 if m == "causal" else 2, m)


def color_map(labels):
    palette = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("Dark2").colors)
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def line_style(rows):
    if rows[0]["_source"] == "peer":
        return ":"
    return "-" if rows[0].get("exact") else "--"


# ---------------------------------------------------------------------------------------------------------
# Numbers: fits and crossovers


def fit_exponent(ns, ts):
    """Least squares of log(t) on log(n): the exponent k of t ~ c * n^k, None with fewer than 2 sizes."""
    ns, ts = np.asarray(ns, float), np.asarray(ts, float)
    keep = (ns > 0) & (ts > 0) & np.isfinite(ts)
    if len(np.unique(ns[keep])) < 2:
        return None
    slope, _ = np.polyfit(np.log(ns[keep]), np.log(ts[keep]), 1)
    return float(slope)


def crossover(ns, ratios):
    """The n beyond which ratio < 1 at every measured n (interpolated in log-log between the bracketing
    sizes), or a phrase when it does not cross within the measured range."""
    pts = [(n, r) for n, r in zip(ns, ratios) if r is not None and r > 0 and math.isfinite(r)]
    if not pts:
        return None, "no common sizes"
    last_not_below = max((i for i, (_, r) in enumerate(pts) if r >= 1), default=None)
    if last_not_below is None:
        return None, "at every measured n"
    if last_not_below == len(pts) - 1:
        return None, "never within measured range"
    (n1, r1), (n2, r2) = pts[last_not_below], pts[last_not_below + 1]
    if r1 == 1:
        return float(n1), f"n ≈ {n1:.0f}"
    t = (0 - math.log(r1)) / (math.log(r2) - math.log(r1))
    n = math.exp(math.log(n1) + t * (math.log(n2) - math.log(n1)))
    return n, f"n ≈ {n:.0f} (between {n1} and {n2})"


def memory_of(r):
    """Peak bytes measured, else the estimate; and whether it was estimated."""
    peak = num(get(r, "memory.peak_bytes"))
    if peak is not None and peak > 0:
        return peak, False
    est = num(get(r, "memory.estimated_bytes"))
    return (est, True) if est is not None and est > 0 else (None, False)


def point_key(r):
    """One measured point; variants are compared within it (on the same SIMD target when the sweep has several)."""
    return (r["mask"], r.get("regime"), r.get("batch"), r.get("heads"), r.get("head_dim"), r.get("threads"),
            r.get("seq_q"), r["seq_kv"], r.get("isa"))


def best_exact(res):
    """Per point: the fastest exact attnbench row and the least memory of an exact attnbench row. The PyTorch
    peer is left out, so the crossovers do not change with whether it was run."""
    fastest, least_mem = {}, {}
    for r in res.ok:
        if not r.get("exact") or r["_source"] != "attnbench":
            continue
        k = point_key(r)
        if k not in fastest or num(r["time_ms"]["median"]) < num(fastest[k]["time_ms"]["median"]):
            fastest[k] = r
        m, _ = memory_of(r)
        if m is not None and (k not in least_mem or m < least_mem[k][0]):
            least_mem[k] = (m, r)
    return fastest, least_mem


def fmt_bytes(b):
    if b is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.3g} {unit}"
        b /= 1024


def fmt_num(x, spec=".3g"):
    if x is None:
        return "—"
    if not math.isfinite(x):
        return str(x)
    return format(x, spec)


# ---------------------------------------------------------------------------------------------------------
# Figures


def facet_grid(res, title):
    """One column per mask, one row per setting of the other context dimensions that vary."""
    rows_keys = res.rest[:max(1, MAX_FACETS // max(1, len(res.masks)))]
    if len(rows_keys) < len(res.rest):
        title += f" (first {len(rows_keys)} of {len(res.rest)} settings)"
        print(f"{PROG}: warning: {len(res.rest)} settings x {len(res.masks)} masks: drawing the first "
              f"{len(rows_keys)} settings only", file=sys.stderr)
    nr, nc = len(rows_keys), len(res.masks)
    fig, axes = plt.subplots(nr, nc, figsize=(4.8 * nc + 0.6, 3.9 * nr + 0.7), squeeze=False)
    fig.suptitle(title, fontsize=11)
    cells = {}
    for i, rk in enumerate(rows_keys):
        for j, m in enumerate(res.masks):
            ax = axes[i][j]
            sub = f"mask={m}" + (f"\n{res.rest_title(rk)}" if res.rest_title(rk) else "")
            ax.set_title(sub, fontsize=9)
            ax.grid(True, which="both", alpha=0.25)
            cells[(m, rk)] = ax
    return fig, cells


def finish_axes(cells, xlabel, ylabel, legend=True):
    for ax in cells.values():
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if not ax.has_data():
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
        elif legend:
            ax.legend(fontsize=7, loc="best", framealpha=0.85)


def log2_axis(ax):
    """Sequence lengths on a base-2 log axis, labelled as plain numbers (256, not 2^8)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))


def slope_guides(ax, ns, ts):
    """Dotted n^1 and n^2 guides through the facet's smallest point, to read slopes by eye."""
    if len(ns) < 2:
        return
    n0, n1 = min(ns), max(ns)
    t0 = min(t for n, t in zip(ns, ts) if n == n0)
    xs = np.array([n0, n1], float)
    for k in (1, 2):
        ax.plot(xs, t0 * (xs / n0) ** k, color="gray", lw=0.8, ls=(0, (1, 3)), zorder=0)
        ax.annotate(f"$n^{k}$", (xs[1], t0 * (xs[1] / n0) ** k), fontsize=7, color="gray",
                    textcoords="offset points", xytext=(2, 0), va="center", annotation_clip=False)


def fig_time(res, summary):
    fig, cells = facet_grid(res, "Time per forward call vs sequence length (slope = fitted exponent)")
    fits = []
    for (label, mask, rk), rows in sorted(res.series(res.ok).items()):
        ax = cells.get((mask, rk))
        if ax is None:
            continue
        ns = [r["seq_kv"] for r in rows]
        ts = [num(r["time_ms"]["median"]) for r in rows]
        lo = [num(get(r, "time_ms.p10")) or t for r, t in zip(rows, ts)]
        hi = [num(get(r, "time_ms.p90")) or t for r, t in zip(rows, ts)]
        k = fit_exponent(ns, ts)
        rng = f"n={min(ns)}–{max(ns)}"
        name = f"{label}  $n^{{{k:.2f}}}$ ({rng})" if k is not None else f"{label}  (one size)"
        ax.errorbar(ns, ts, yerr=[np.subtract(ts, lo), np.subtract(hi, ts)], marker="o", ms=3.5,
                    lw=1.4, capsize=2, ls=line_style(rows), color=res.colors[label], label=name)
        fits.append({"series": label, "mask": mask, "context": res.rest_title(rk), "exponent": k,
                     "n_min": min(ns), "n_max": max(ns), "points": len(ns),
                     "tail_exponent": fit_exponent(ns[-2:], ts[-2:]) if len(ns) >= 2 else None,
                     "exact": bool(rows[0].get("exact")), "source": rows[0]["_source"],
                     "params": rows[0]["_params"]})
    for (m, rk), ax in cells.items():
        pts = [(r["seq_kv"], num(r["time_ms"]["median"])) for r in res.ok if r["mask"] == m and res.rest_key(r) == rk]
        if pts:
            slope_guides(ax, [p[0] for p in pts], [p[1] for p in pts])
        log2_axis(ax)
        ax.set_yscale("log")
    finish_axes(cells, "sequence length n", "time (ms, median; bars p10–p90)")
    summary["fits"] = fits
    return fig


def fig_memory(res, summary):
    fig, cells = facet_grid(res, "Peak memory vs sequence length: measured (solid) and estimated (dashed)")
    for (label, mask, rk), rows in sorted(res.series(res.ok).items()):
        ax = cells.get((mask, rk))
        if ax is None:
            continue
        color = res.colors[label]
        meas = [(r["seq_kv"], num(get(r, "memory.peak_bytes"))) for r in rows]
        meas = [(n, b) for n, b in meas if b is not None and b > 0]
        est = [(r["seq_kv"], num(get(r, "memory.estimated_bytes"))) for r in rows]
        est = [(n, b) for n, b in est if b is not None and b > 0]
        if meas:
            ax.plot(*zip(*meas), marker="o", ms=3.5, lw=1.4, color=color, label=f"{label} measured")
        if est:
            ax.plot(*zip(*est), marker="x", ms=3.5, lw=1.0, ls="--", color=color,
                    label=f"{label} estimated" if meas else f"{label} estimated (not measured)")
    for ax in cells.values():
        log2_axis(ax)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda b, _: fmt_bytes(b)))
    finish_axes(cells, "sequence length n", "bytes (output + workspace)")
    return fig


def fig_accuracy(res, summary):
    fig, cells = facet_grid(res, "Error vs exact fp64 softmax attention (rel. L2), approximate variants")
    nonfinite = 0
    for (label, mask, rk), rows in sorted(res.series(res.ok).items()):
        ax = cells.get((mask, rk))
        if ax is None:
            continue
        pts = [(r["seq_kv"], num(get(r, "accuracy.rel_l2_err"))) for r in rows]
        bad = [n for n, e in pts if e is not None and not math.isfinite(e)]
        nonfinite += len(bad)
        good = [(n, max(e, 1e-12)) for n, e in pts if e is not None and math.isfinite(e)]
        exact = rows[0].get("exact")
        note = f" ({len(bad)} non-finite, ▲)" if bad else ""
        if good:
            ax.plot(*zip(*good), marker="o", ms=3.5, lw=1.4 if not exact else 0.8, ls=line_style(rows),
                    color=res.colors[label], alpha=1.0 if not exact else 0.6,
                    label=label + (" (exact: fp32 floor)" if exact else "") + note)
        if bad:  # non-finite errors are drawn at the top edge, never silently dropped
            ax.plot(bad, [1.0] * len(bad), ls="none", marker="^", ms=7, color=res.colors[label],
                    transform=ax.get_xaxis_transform(), clip_on=False, label=None if good else label + note)
    for ax in cells.values():
        log2_axis(ax)
        ax.set_yscale("log")
    finish_axes(cells, "sequence length n", "rel_l2_err = ‖O − O_ref‖₂ / ‖O_ref‖₂")
    summary["nonfinite_accuracy_points"] = nonfinite
    return fig


def fig_pareto(res, summary):
    fastest, _ = best_exact(res)
    fig, cells = facet_grid(res, "Speed vs accuracy: speed-up over the fastest exact variant at the same point")
    pts_by_cell = {}
    for r in res.ok:
        base = fastest.get(point_key(r))
        err = num(get(r, "accuracy.rel_l2_err"))
        if base is None or err is None or not math.isfinite(err):
            continue
        speedup = num(base["time_ms"]["median"]) / num(r["time_ms"]["median"])
        pts_by_cell.setdefault((r["mask"], res.rest_key(r)), []).append((max(err, 1e-12), speedup, r))
    ns_all = sorted({r["seq_kv"] for r in res.ok})
    size_of = {n: 14 + 60 * i / max(1, len(ns_all) - 1) for i, n in enumerate(ns_all)}
    for cell, pts in pts_by_cell.items():
        ax = cells.get(cell)
        if ax is None:
            continue
        for label in sorted({p[2]["_label"] for p in pts}):
            mine = [p for p in pts if p[2]["_label"] == label]
            ax.scatter([p[0] for p in mine], [p[1] for p in mine], s=[size_of[p[2]["seq_kv"]] for p in mine],
                       color=res.colors[label], alpha=0.85, edgecolors="black", linewidths=0.4, label=label,
                       marker="o" if mine[0][2].get("exact") else "D")
            for e, s, r in mine:
                if not r.get("exact"):
                    ax.annotate(str(r["seq_kv"]), (e, s), fontsize=6, textcoords="offset points", xytext=(4, 2))
        # The Pareto front: points no other point beats on both error (lower) and speed-up (higher).
        front, best = [], -math.inf
        for e, s, _ in sorted(pts, key=lambda p: (p[0], -p[1])):
            if s > best:
                front.append((e, s))
                best = s
        if len(front) > 1:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="black", lw=0.8,
                    alpha=0.5, label="Pareto front")
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    for ax in cells.values():
        ax.set_xscale("log")
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}×"))
    finish_axes(cells, "rel_l2_err (log; marker size grows with n, labels = n)", "speed-up over fastest exact (×)")
    return fig


def fig_throughput(res, summary):
    cal = ", ".join(f"{t} thread{'s' if t > 1 else ''}: {g:.1f} GFLOP/s" for t, g in sorted(res.calibration.items()))
    fig, cells = facet_grid(res, "Throughput as a fraction of the in-run sgemm calibration"
                            + (f" ({cal})" if cal else ""))
    for (label, mask, rk), rows in sorted(res.series(res.ok).items()):
        ax = cells.get((mask, rk))
        pts = [(r["seq_kv"], num(r.get("frac_sgemm"))) for r in rows]
        pts = [(n, f) for n, f in pts if f is not None and math.isfinite(f)]
        if ax is None or not pts:
            continue
        ax.plot(*zip(*pts), marker="o", ms=3.5, lw=1.4, ls=line_style(rows), color=res.colors[label], label=label)
    for ax in cells.values():
        log2_axis(ax)
        ax.set_ylim(bottom=0)
    finish_axes(cells, "sequence length n", "GFLOP/s ÷ sgemm GFLOP/s (each variant's own FLOP count)")
    return fig


# ---------------------------------------------------------------------------------------------------------
# Patterns


def load_patterns(pdir):
    meta_path = os.path.join(pdir, "patterns.json")
    if not os.path.isfile(meta_path):
        raise InputError(f"--patterns '{pdir}': no patterns.json (write one with `attnbench patterns ... --out DIR`)")
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except ValueError as e:
        raise InputError(f"{meta_path}: not valid JSON ({e})")
    tokens = None
    if meta.get("tokens"):
        with open(os.path.join(pdir, meta["tokens"]), encoding="utf-8") as f:
            tokens = json.load(f)
    panels = []
    for v in meta.get("variants", []):
        if v.get("status") != "ok":
            continue
        path = os.path.join(pdir, v["file"])
        try:
            w = np.load(path)
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: cannot read ({e})")
        if w.ndim != 3 or w.shape[1] != w.shape[2]:
            raise InputError(f"{path}: shape {w.shape}; expected [heads, n, n]")
        panels.append((v, w))
    if not panels:
        raise InputError(f"{meta_path}: lists no variant with status ok")
    return meta, tokens, panels


def fig_patterns(meta, tokens, panels):
    heads = min(4, panels[0][1].shape[0])
    n = panels[0][1].shape[1]
    nc = len(panels)
    side = 3.2 if n <= MAX_TOKEN_LABELS or tokens is None else 2.8
    # Constrained layout keeps each column's colour bar right under it, with no gap to the title.
    fig, axes = plt.subplots(heads, nc, figsize=(side * nc + 0.8, side * heads + 1.0), squeeze=False,
                             layout="constrained")
    src = (f"text '{os.path.basename(meta.get('text', ''))}'" if meta.get("source") == "text"
           else f"gaussian Q, K (std={meta.get('std')})")
    fig.suptitle(f"Attention weights per head, n={n}, {src}{', causal' if meta.get('causal') else ''} "
                 "(row = query, column = key; colour ∝ √weight)", fontsize=10)
    label_tokens = tokens is not None and len(tokens) <= MAX_TOKEN_LABELS
    for j, (v, w) in enumerate(panels):
        # One colour scale per variant (a column), square-root so diffuse patterns stay visible next to
        # peaked ones; exact zeros (masked, outside the band) stay the darkest colour.
        vmax = float(np.nanmax(w[:heads])) or 1.0
        norm = mcolors.PowerNorm(gamma=0.5, vmin=0.0, vmax=vmax)
        for h in range(heads):
            ax = axes[h][j]
            im = ax.imshow(w[h], cmap="magma", norm=norm, interpolation="nearest")
            if h == 0:
                extra = params_text(v.get("params", {})).replace(",", ", ")
                ax.set_title(v["name"] + ("\n" + extra if extra else "\n"), fontsize=8)
            if j == 0:
                ax.set_ylabel(f"head {h}\nquery")
            if label_tokens:
                ax.set_xticks(range(n))
                ax.set_yticks(range(n))
                ax.set_xticklabels(tokens, rotation=90, fontsize=5)
                ax.set_yticklabels(tokens, fontsize=5)
            if h == heads - 1:
                ax.set_xlabel("key")
        fig.colorbar(im, ax=[axes[h][j] for h in range(heads)], orientation="horizontal", fraction=0.03,
                     shrink=0.85, label="weight")
    return fig


# ---------------------------------------------------------------------------------------------------------
# Writing (every file to a temporary name, then renamed: never a half-written figure or report)


def atomic_write_text(path, text):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix="." + os.path.basename(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_figure(fig, out_dir, stem):
    paths = []
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, f"{stem}.{ext}")
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{stem}.", suffix=f".{ext}.tmp")
        os.close(fd)
        try:
            fig.savefig(tmp, format=ext, dpi=130, bbox_inches="tight", metadata={"Date": None} if ext == "svg" else None)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        paths.append(path)
    plt.close(fig)
    return paths


# ---------------------------------------------------------------------------------------------------------
# The report


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(out)


def key_figures(res, summary):
    fits = {(f["series"], f["mask"], f["context"]): f for f in summary["fits"]}
    table = []
    for (label, mask, rk), rows in sorted(res.series(res.ok).items(), key=lambda kv: (mask_order(kv[0][1]), kv[0])):
        last = rows[-1]
        f = fits.get((label, mask, res.rest_title(rk)), {})
        errs = [num(get(r, "accuracy.rel_l2_err")) for r in rows]
        errs = [e for e in errs if e is not None]
        worst = max(errs, key=lambda e: (not math.isfinite(e), e)) if errs else None
        mem, estimated = memory_of(last)
        k = f.get("exponent")
        table.append([
            f"`{label}`" + (" (PyTorch)" if last["_source"] == "peer" else ""),
            last["_params"].replace(",", ", ") or "—",
            mask + (f"; {res.rest_title(rk)}" if res.rest_title(rk) else ""),
            "yes" if last.get("exact") else "no",
            f"{k:.2f} (n={f['n_min']}–{f['n_max']})" if k is not None else "—",
            f"{fmt_num(f.get('tail_exponent'), '.2f')}",
            last["seq_kv"],
            fmt_num(num(last["time_ms"]["median"]), ".4g"),
            fmt_num(num(last.get("gflops")), ".3g"),
            fmt_num(num(last.get("frac_sgemm")), ".2f"),
            fmt_num(num(last.get("frac_peak")), ".2f"),
            fmt_bytes(mem) + (" (est.)" if estimated else ""),
            fmt_num(worst, ".2e"),
        ])
    return md_table(["series", "parameters", "mask", "exact", "exponent (fit)", "slope, last 2 n", "max n", "time at max n (ms)",
                     "GFLOP/s", "× sgemm", "× FMA peak", "memory at max n", "worst rel_l2_err"], table)


def crossover_table(res, summary):
    fastest, least_mem = best_exact(res)
    rows_md, out = [], []
    for (label, mask, rk), rows in sorted(res.series(res.ok).items(), key=lambda kv: (mask_order(kv[0][1]), kv[0])):
        if rows[0].get("exact") or rows[0]["_source"] != "attnbench":
            continue
        ns, t_ratio, m_ratio, est_used = [], [], [], False
        for r in rows:
            k = point_key(r)
            if k not in fastest:
                continue
            ns.append(r["seq_kv"])
            t_ratio.append(num(r["time_ms"]["median"]) / num(fastest[k]["time_ms"]["median"]))
            mem, est = memory_of(r)
            base = least_mem.get(k)
            est_used |= est or (base is not None and memory_of(base[1])[1])
            m_ratio.append(mem / base[0] if mem is not None and base is not None else None)
        n_t, t_text = crossover(ns, t_ratio)
        n_m, m_text = crossover(ns, m_ratio)
        t_text = "faster " + t_text if t_text == "at every measured n" else t_text
        m_text = "less memory " + m_text if m_text == "at every measured n" else m_text
        speed_last = 1 / t_ratio[-1] if t_ratio else None
        mem_last = m_ratio[-1] if m_ratio else None
        rows_md.append([f"`{label}`", mask + (f"; {res.rest_title(rk)}" if res.rest_title(rk) else ""),
                        f"{min(ns)}–{max(ns)}" if ns else "—", t_text,
                        f"{fmt_num(speed_last, '.2f')}× at n={ns[-1]}" if ns else "—",
                        m_text + (" (some estimated)" if est_used else ""),
                        f"{fmt_num(mem_last, '.3f')}× at n={ns[-1]}" if ns and mem_last is not None else "—"])
        out.append({"series": label, "mask": mask, "context": res.rest_title(rk), "faster_from_n": n_t,
                    "faster": t_text, "less_memory_from_n": n_m, "less_memory": m_text,
                    "speedup_at_max_n": speed_last, "memory_ratio_at_max_n": mem_last,
                    "n_range": [min(ns), max(ns)] if ns else None})
    summary["crossover"] = out
    if not rows_md:
        return "No approximate variant among the results: nothing to cross over."
    return md_table(["approximate variant", "mask", "measured n", "faster than best exact from",
                     "speed-up at max n", "less memory than best exact from", "memory ratio at max n"], rows_md)


def excluded_section(res, summary):
    if not res.excluded:
        summary["excluded"] = {}
        return "Every row was measured (status ok)."
    counts, reasons = {}, {}
    for r in res.excluded:
        st = r.get("status", "?")
        counts[st] = counts.get(st, 0) + 1
        # Numbers (byte counts, sizes) differ per row; the reason's shape groups them.
        reason = re.sub(r"\d+(\.\d+)?", "#", r.get("reason") or "(no reason given)")
        reason = reason if len(reason) <= 140 else reason[:137] + "..."
        key = (st, r["variant"], reason)
        reasons.setdefault(key, []).append(r)
    summary["excluded"] = counts
    parts = [f"{len(res.excluded)} of {len(res.ok) + len(res.excluded)} rows are left out of the curves: "
             + ", ".join(f"{c} {s}" for s, c in sorted(counts.items())) + ". By reason (# stands for numbers):", ""]
    table = []
    for (st, variant, reason), rs in sorted(reasons.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ns = sorted({r["seq_kv"] for r in rs})
        table.append([st, f"`{variant}`", len(rs), ", ".join(map(str, ns)), reason,
                      (rs[0].get("reason") or "")[:200]])
    parts.append(md_table(["status", "variant", "rows", "n", "reason", "example"], table))
    return "\n".join(parts)


def machine_section(res):
    s = res.meta.get("system", {})
    if not s:
        return "meta.json is missing: machine unknown."
    lib = s.get("libraries", {})
    rows = [["CPU", s.get("cpu_model", "?")], ["cores available", s.get("cores_available", "?")],
            ["memory", fmt_bytes(num(s.get("memory_total_bytes")))], ["SIMD", s.get("cpu_simd_flags", "?")],
            ["compiler", s.get("compiler", "?")], ["build", f"{s.get('build_type', '?')} {s.get('cxx_flags', '').strip()}"],
            ["git commit", s.get("git_commit", "?")], ["host", s.get("hostname", "?")]]
    rows += [[k, v] for k, v in sorted(lib.items())]
    isa = s.get("isa") or {}
    if isa:
        rows.append(["SIMD targets", f"best {isa.get('best', '?')}; supported: {', '.join(isa.get('supported', []))}"])
    for c in res.meta.get("sgemm_calibration", []):
        rows.append([f"sgemm calibration, {c.get('threads')} thread(s)",
                     f"{num(c.get('gflops')):.1f} GFLOP/s ({c.get('size')}³, cv {num(c.get('cv')) or 0:.2f})"])
    # One FMA peak per (threads, SIMD target); older results have one per thread count.
    for c in res.meta.get("fma_peak", []):
        if num(c.get("gflops")):
            lanes = f", {c['lanes']} lanes" if c.get("lanes") else ""
            rows.append([f"fp32 FMA peak, {c.get('threads')} thread(s), {c.get('isa') or '?'}",
                         f"{num(c.get('gflops')):.1f} GFLOP/s{lanes}"])
    rows += [["memory probe", res.meta.get("memory_probe", "?")],
             ["run", f"{res.meta.get('start_time', '?')} → {res.meta.get('end_time', '?')}"
                     + (" (interrupted)" if res.meta.get("interrupted") else "")]]
    return md_table(["", ""], rows)


def write_report(res, out_dir, summary, patterns_fig):
    meta = res.meta
    name = meta.get("config_name") or os.path.basename(os.path.abspath(res.dir))
    desc = (meta.get("config") or {}).get("description", "")
    counts = f"{len(res.ok)} measured rows in the curves"
    if res.peer_rows:
        counts += f" (including {sum(1 for r in res.ok if r['_source'] == 'peer')} PyTorch peer rows from results.peers.jsonl)"
    blurb = {
        "time_vs_seq": "Median time of one forward call; bars span p10–p90. The legend gives the exponent k of a "
                       "least-squares fit of log(time) on log(n) over the series' measured sizes (range in "
                       "brackets): exact attention's quadratic cost shows as k ≈ 2 once n is large enough for "
                       "the n² terms to dominate. Dotted grey guides have slopes 1 and 2. Solid: exact; "
                       "dashed: approximate; dotted: PyTorch peer.",
        "memory_vs_seq": "Solid: the peak resident-memory increase measured while timing (VmHWM, output and "
                         "workspace; the inputs are allocated before the probe is reset). Dashed: the "
                         "variant's own estimate (output + workspace_bytes).",
        "accuracy_vs_seq": "Relative L2 error of the output against fp64 exact softmax attention on the same "
                           "inputs (sampled rows for long sequences). Exact variants are drawn thin as the "
                           "fp32 floor. Non-finite errors (written \"inf\"/\"nan\" in the rows) are triangles "
                           "on the top edge.",
        "pareto": "Each point is one measured configuration: its speed-up over the fastest exact attnbench "
                  "variant at the same point (same n, mask, shapes, threads) against its error. Up and to the "
                  "left is better; the black step line is the Pareto front; labels give n.",
        "throughput": "GFLOP/s (each variant counts its own FLOPs) divided by the sgemm GFLOP/s measured at the "
                      "start of the same run with the same thread count: how close to the machine's dense "
                      "matrix-multiply speed each variant runs.",
    }
    titles = {"time_vs_seq": "Time vs sequence length", "memory_vs_seq": "Peak memory vs sequence length",
              "accuracy_vs_seq": "Accuracy vs sequence length", "pareto": "Speed–accuracy trade-off",
              "throughput": "Throughput vs sgemm"}
    md = [f"# attnbench results: {name}", ""]
    if desc:
        md += [f"> {desc}", ""]
    md += [f"{counts}; {len(res.excluded)} left out (see [below](#points-left-out-of-the-curves)). "
           f"Results folder: `{os.path.abspath(res.dir)}`. Generated by `scripts/plot.py`.", ""]
    md += ["## Key figures", "", key_figures(res, summary), "",
           "*exponent (fit)*: least squares of log(time) on log(n) over the measured sizes; *slope, last 2 n*: "
           "the same between the two largest sizes (the asymptotic regime). *× sgemm*: fraction of the in-run "
           "sgemm throughput.", ""]
    md += ["## Crossover", "", crossover_table(res, summary), "",
           "Against the fastest (and the least memory-hungry) exact attnbench variant at each point; the size "
           "where an approximate variant becomes faster (or smaller) for good is interpolated in log–log between "
           "the bracketing measured sizes. Memory is the measured peak, or the estimate where no peak was "
           "measured.", ""]
    for stem in FIGURES:
        md += [f"## {titles[stem]}", "", f"![{titles[stem]}](plots/{stem}.png)", "",
               blurb[stem] + f" ([SVG](plots/{stem}.svg))", ""]
    if patterns_fig:
        md += ["## Attention patterns", "", "![Attention patterns](plots/patterns.png)", "",
               "The weights each variant applies on a small input (`attnbench patterns`), measured through its "
               "forward pass with V set to unit vectors. ([SVG](plots/patterns.svg))", ""]
    md += ["## Points left out of the curves", "", excluded_section(res, summary), ""]
    md += ["## Machine", "", machine_section(res), ""]
    if meta.get("config") is not None:
        md += ["## Config", "", f"From `{meta.get('config_path', '?')}` (hash {meta.get('config_hash', '?')}):", "",
               "```json", json.dumps(meta["config"], indent=2), "```", ""]
    atomic_write_text(os.path.join(out_dir, "REPORT.md"), "\n".join(md))


# ---------------------------------------------------------------------------------------------------------


def plot_patterns_only(pdir, out_dir):
    meta, tokens, panels = load_patterns(pdir)
    os.makedirs(out_dir, exist_ok=True)
    paths = save_figure(fig_patterns(meta, tokens, panels), out_dir, "patterns")
    for p in paths:
        print(p)
    return 0


def plot_results(results_dir, out_dir):
    res = Results(results_dir)
    plots = os.path.join(out_dir, "plots")
    os.makedirs(plots, exist_ok=True)
    summary = {"results_dir": os.path.abspath(results_dir), "rows_ok": len(res.ok), "rows_excluded": len(res.excluded)}
    written = []
    for stem, fn in zip(FIGURES, (fig_time, fig_memory, fig_accuracy, fig_pareto, fig_throughput)):
        written += save_figure(fn(res, summary), plots, stem)
    patterns_fig = False
    pdir = os.path.join(results_dir, "patterns")
    if os.path.isfile(os.path.join(pdir, "patterns.json")):
        written += save_figure(fig_patterns(*load_patterns(pdir)), plots, "patterns")
        patterns_fig = True
    write_report(res, out_dir, summary, patterns_fig)
    summary["files"] = [os.path.relpath(p, out_dir) for p in written] + ["REPORT.md"]
    atomic_write_text(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=2, default=str) + "\n")
    for p in written:
        print(p)
    print(os.path.join(out_dir, "REPORT.md"))
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dir", nargs="?", help="folder written by `attnbench run` (results.jsonl, meta.json)")
    ap.add_argument("--patterns", metavar="DIR", help="draw the folder written by `attnbench patterns` instead")
    ap.add_argument("--out", metavar="DIR", help="where to write (default: the input folder)")
    a = ap.parse_args(argv)
    try:
        if a.patterns and a.results_dir:
            raise InputError("give RESULTS_DIR or --patterns DIR, not both")
        if a.patterns:
            return plot_patterns_only(a.patterns, a.out or a.patterns)
        if not a.results_dir:
            raise InputError("missing RESULTS_DIR (or --patterns DIR); see --help")
        if os.path.isfile(os.path.join(a.results_dir, "patterns.json")):
            return plot_patterns_only(a.results_dir, a.out or a.results_dir)
        return plot_results(a.results_dir, a.out or a.results_dir)
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
