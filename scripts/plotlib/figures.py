"""The figures (matplotlib, headless): each fig_* takes the Results and the analysis (analysis.analyse) and only
draws: the rows' own values, and from the analysis what is computed across rows (fitted exponents, speed-ups
over the best exact variant, the Pareto front). None of them writes into the analysis, so they can be drawn in
any order, or not at all. draw_results saves them as plots/<stem>.png and .svg, draw_patterns the heatmaps of
an `attnbench patterns` folder. SVGs are byte-stable (fixed hash salt, no date), so committed reports diff
cleanly.

Results of several passes (sweep.pass, #27: forward, backward, forward_backward) give every faceted figure one
column per pass (pass_grid; the passes of a row share its y axis where that compares them), and the time figure
a last column with each variant's backward / forward and training step / forward time ratios. Titles name the
CPU (meta.json) and the pass.
"""
import math
import os
import sys
import tempfile
import textwrap

import numpy as np
import matplotlib

matplotlib.use("Agg")  # headless: no display on CI or over ssh
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import colors as mcolors, ticker  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from .analysis import ERR_FLOOR  # noqa: E402
from .common import CHUNK_SIZE, DECODE, DTYPE_VS_FP32, FIGURES, MLA, PATTERNS, PHASES, PROG, ROOFLINE, fmt_bytes, num  # noqa: E402
from . import mla, patterns  # noqa: E402
from .results import PASSES, mask_order, params_text, pass_order, pass_short, pass_title, passes_text  # noqa: E402
from .styles import results_table, series_styles  # noqa: E402

matplotlib.rcParams["svg.hashsalt"] = "attnbench"
matplotlib.rcParams["font.size"] = 9

MAX_FACETS = 24  # subplots per figure; beyond this a figure is unreadable anyway
MAX_TOKEN_LABELS = 48  # pattern heatmaps label their axes with the tokens up to this many


MS = 4.5  # marker size of a series' points: large enough to tell its variant's marker (styles.MARKERS) apart
# A noisy point (interference above the threshold on every attempt): a ring around the series' marker.
NOISY_RING = dict(ls="none", marker="o", ms=8, mfc="none", mew=1.3)
# The attribute naming what an artist draws, (series label, "style") in the series' style or (variant, "hue") in
# its marker and a shade of its hue (the chunk-size figure's n): tests read each figure's styles from the artists.
SERIES_ATTR = "_attnbench_series"


def tag(artists, series, kind="style"):
    """Marks the artists that draw `series` (a Line2D list from ax.plot, an errorbar container, a scatter
    collection) as drawn in its style, or with kind "hue" in its variant's marker and a shade of its hue; returns
    what it was given."""
    if isinstance(artists, ErrorbarContainer):
        drawn = artists.lines[:1]  # the data line; the bars and caps are drawn in its colour, without markers
    else:
        drawn = artists if isinstance(artists, list) else [artists]
    for a in drawn:
        setattr(a, SERIES_ATTR, (series, kind))
    return artists


def plot_series(ax, series, st, *xy, **kw):
    """ax.plot of a series in its style st (styles.py: colour, marker; MS unless kw says otherwise), tagged."""
    return tag(ax.plot(*xy, **dict(dict(color=st.color, marker=st.marker, ms=MS), **kw)), series)


def line_style(rows):
    if rows[0].source == "peer":
        return ":"
    return "-" if rows[0].exact else "--"


def cpu_name(res):
    """The CPU model as the report's machine table names it (meta.json system.cpu_model)."""
    return (res.meta.get("system") or {}).get("cpu_model") or "unknown CPU"


def on_cpu(res):
    """" on <CPU model>" for a figure's title, "" when meta.json does not name it."""
    model = (res.meta.get("system") or {}).get("cpu_model")
    return f" on {model}" if model else ""


def pass_phrase(res):
    """What a figure's rows time, in brackets after its title: "(forward)", "(backward (dQ, dK, dV))", "(one
    column per pass)"."""
    return f" ({'one column per pass' if res.by_pass() else ', '.join(pass_short(p) for p in res.passes)})"


def has_backward(res):
    """Some measured row times a backward (alone or in a training step): its error is the gradient's."""
    return any(p != "forward" for p in res.passes)


def what_timed(res):
    """What a figure's rows time, for its title: "forward call", "backward (dQ, dK, dV) call"; "one column per
    pass" when there are several (#27)."""
    return "one column per pass" if res.by_pass() else f"{passes_text(res.passes)} call"


def facet_grid(res, title, share_y=False):
    """One column per mask, one row per setting of the other context dimensions that vary; with several passes
    (#27) one column per pass instead (pass_grid)."""
    if res.by_pass():
        fig, cells, _ = pass_grid(res, title, share_y)
        return fig, cells
    rows_keys = res.rest[:max(1, MAX_FACETS // max(1, len(res.masks)))]
    if len(rows_keys) < len(res.rest):
        title += f" (first {len(rows_keys)} of {len(res.rest)} settings)"
        print(f"{PROG}: warning: {len(res.rest)} settings x {len(res.masks)} masks: drawing the first "
              f"{len(rows_keys)} settings only", file=sys.stderr)
    nr, nc = len(rows_keys), len(res.masks)
    # Constrained layout: two-line panel titles never run into the x labels of the row above.
    fig, axes = plt.subplots(nr, nc, figsize=(4.8 * nc + 0.6, 3.9 * nr + 0.7), squeeze=False, layout="constrained")
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


def pass_grid(res, title, share_y=False, extra=None):
    """Several passes: one column per pass (forward, backward, forward + backward), one row per mask and
    setting of the other context dimensions that vary, the passes of a row sharing its y axis when share_y; and
    with `extra` (a panel title) one more column, not shared. (fig, {(mask, rest_key): ax}, {(mask, key without
    the pass): the extra column's ax})."""
    bases = sorted({(r.mask, res.split_pass(res.rest_key(r))[1]) for r in res.ok},
                   key=lambda mb: (mask_order(mb[0]), str(mb[1])))
    npass = len(res.passes)
    nc = npass + (1 if extra else 0)
    rows_keys = bases[:max(1, MAX_FACETS // nc)]
    if len(rows_keys) < len(bases):
        title += f" (first {len(rows_keys)} of {len(bases)} settings)"
        print(f"{PROG}: warning: {len(bases)} masks and settings x {npass} passes: drawing the first "
              f"{len(rows_keys)} only", file=sys.stderr)
    nr = len(rows_keys)
    fig = plt.figure(figsize=(4.6 * nc + 0.6, 3.7 * nr + 0.9), layout="constrained")
    gs = fig.add_gridspec(nr, nc)
    fig.suptitle(title, fontsize=11)
    cells, extras = {}, {}
    for i, (m, base) in enumerate(rows_keys):
        where = f"mask={m}" + (f", {res.base_title(base)}" if res.base_title(base) else "")
        first = None
        for j, p in enumerate(res.passes):
            ax = fig.add_subplot(gs[i, j], sharey=first if share_y else None)
            if share_y and first is not None:
                ax.tick_params(labelleft=False)
                ax._attnbench_inner = True  # finish_axes: the y label once per row
            first = first or ax
            ax.set_title(f"{pass_title(p)}\n{where}", fontsize=9)
            ax.grid(True, which="both", alpha=0.25)
            cells[(m, res.with_pass(base, p))] = ax
        if extra:
            ax = fig.add_subplot(gs[i, nc - 1])
            ax.set_title(f"{extra}\n{where}", fontsize=9)
            ax.grid(True, which="both", alpha=0.25)
            extras[(m, base)] = ax
    return fig, cells, extras


def finish_axes(cells, xlabel, ylabel, legend=True):
    for ax in cells.values():
        ax.set_xlabel(xlabel)
        if not getattr(ax, "_attnbench_inner", False):
            ax.set_ylabel(ylabel)
        if not ax.has_data():
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
        elif legend:
            ax.legend(fontsize=7, loc="best", framealpha=0.85)


def noisy_legend(ax):
    """One legend entry for the hollow rings around noisy points."""
    ax.plot([], [], mec="black", label="hollow: noisy (interference on every attempt)", **NOISY_RING)


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


def fig_time(res, an):
    title = f"Time per {what_timed(res)} vs sequence length{on_cpu(res)} (slope = fitted exponent)" \
        if not res.by_pass() else f"Time vs sequence length{on_cpu(res)}: {what_timed(res)} (slope = fitted exponent)"
    extras = {}
    if res.by_pass():
        fig, cells, extras = pass_grid(res, title, share_y=True, extra="time ÷ forward time, same point")
    else:
        fig, cells = facet_grid(res, title)
    styles = series_styles(res)
    fits = {(f["series"], f["mask"], f["context"]): f for f in an["fits"]}
    noisy_cells = set()
    for (label, mask, rk), rows in res.sorted_series():
        ax = cells.get((mask, rk))
        if ax is None:
            continue
        ns = [r.seq_kv for r in rows]
        ts = [r.time_median for r in rows]
        # The 95% interval of the median where the row has one, else p10-p90 (fewer than 6 repetitions,
        # older rows, the peer's)
        lo = [r.time_ci()[0] if r.time_ci() else r.time_p10 or t for r, t in zip(rows, ts)]
        hi = [r.time_ci()[1] if r.time_ci() else r.time_p90 or t for r, t in zip(rows, ts)]
        f = fits[(label, mask, res.rest_title(rk))]
        k = f["exponent"]
        rng = f"n={f['n_min']}–{f['n_max']}"
        name = f"{label}  $n^{{{k:.2f}}}$ ({rng})" if k is not None else f"{label}  (one size)"
        st = styles[label]
        tag(ax.errorbar(ns, ts, yerr=[np.maximum(0, np.subtract(ts, lo)), np.maximum(0, np.subtract(hi, ts))],
                        marker=st.marker, ms=MS, lw=1.4, capsize=2, ls=line_style(rows), color=st.color, label=name),
            label)
        noisy = [(r.seq_kv, r.time_median) for r in rows if r.noisy]
        if noisy:  # hollow: interference stayed above the threshold on every attempt
            ax.plot(*zip(*noisy), mec=st.color, zorder=3, **NOISY_RING)
            noisy_cells.add((mask, rk))
    for (m, rk), ax in cells.items():
        pts = [(r.seq_kv, r.time_median) for r in res.ok if r.mask == m and res.rest_key(r) == rk]
        if pts:
            slope_guides(ax, [p[0] for p in pts], [p[1] for p in pts])
        log2_axis(ax)
        ax.set_yscale("log")
        if (m, rk) in noisy_cells:
            noisy_legend(ax)
    bars = {"ci95": "bars 95% CI of the median", "mixed": "bars 95% CI of the median, else p10–p90"}
    finish_axes(cells, "sequence length n (tokens)",
                f"time (ms, median; {bars.get(an['measurement']['error_bars'], 'bars p10–p90')})")
    if extras:
        draw_pass_ratios(res, an, extras, styles)
    return fig


def draw_pass_ratios(res, an, extras, styles):
    """The time figure's last column with several passes: per series (in its style), its backward time over its
    forward time at each n (solid) and its training step's over its forward's (dashed, thinner), from the
    analysis's training rows; dotted grey: the backward's FLOP ratio (2.5 by the FlashAttention-2 convention)."""
    by_title = {(m, res.base_title(base)): ax for (m, base), ax in extras.items()}
    lines = {}
    for e in an["training"]["rows"] if an.get("training") else []:
        ax = by_title.get((e["mask"], e["context"]))
        for what, ratio in (("bwd", e["backward_over_forward"]), ("step", e["step_over_forward"])):
            if ax is not None and ratio is not None and num(ratio["ratio"]) is not None:
                lines.setdefault((ax, e["series"], what), []).append((e["seq_kv"], num(ratio["ratio"])))
    for (ax, label, what), pts in sorted(lines.items(), key=lambda kv: (id(kv[0][0]), kv[0][1], kv[0][2])):
        pts.sort()
        plot_series(ax, label, styles[label], *zip(*pts), ms=MS if what == "bwd" else MS - 1,
                    lw=1.4 if what == "bwd" else 1.0, ls="-" if what == "bwd" else "--",
                    label=f"{label}: backward ÷ forward" if what == "bwd" else f"{label}: (fwd+bwd) ÷ forward")
    fr = an["training"]["flops_ratio"] if an.get("training") else {}
    for ax in extras.values():
        log2_axis(ax)
        ax.set_xlabel("sequence length n (tokens)")
        ax.set_ylabel("time ratio to the forward (×)")
        for p, ls, name in (("backward", ":", "backward"), ("forward_backward", (0, (5, 2, 1, 2)), "fwd+bwd")):
            if (fr.get(p) or {}).get("median"):
                ax.axhline(fr[p]["median"], color="gray", lw=0.9, ls=ls,
                           label=f"{name} FLOPs ÷ forward FLOPs = {fr[p]['median']:.2g}")
        if not any(line.get_label()[:1] != "_" and "FLOPs" not in line.get_label() for line in ax.get_lines()):
            ax.text(0.5, 0.5, "no series with both passes", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
        ax.set_ylim(bottom=0, top=max([1.0] + [y * 1.25 for line in ax.get_lines() for y in line.get_ydata()]))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}×"))
        ax.legend(fontsize=7, loc="best", framealpha=0.85)


def fig_memory(res, an):
    fig, cells = facet_grid(res, f"Peak memory vs sequence length{pass_phrase(res)}{on_cpu(res)}: measured (solid) "
                            "and estimated (dashed)", share_y=True)
    styles = series_styles(res)
    for (label, mask, rk), rows in res.sorted_series():
        ax = cells.get((mask, rk))
        if ax is None:
            continue
        st = styles[label]
        meas = [(r.seq_kv, r.peak_bytes) for r in rows if r.peak_bytes is not None and r.peak_bytes > 0]
        est = [(r.seq_kv, r.estimated_bytes) for r in rows if r.estimated_bytes is not None and r.estimated_bytes > 0]
        if meas:
            plot_series(ax, label, st, *zip(*meas), lw=1.4, label=f"{label} measured")
        if est:  # the series' marker, hollow: an estimate, not a measurement
            plot_series(ax, label, st, *zip(*est), mfc="white", lw=1.0, ls="--",
                        label=f"{label} estimated" if meas else f"{label} estimated (not measured)")
    for ax in cells.values():
        log2_axis(ax)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda b, _: fmt_bytes(b)))
    finish_axes(cells, "sequence length n (tokens)", "peak memory above the inputs (bytes, log₂)"
                if has_backward(res) else "peak memory: output + workspace (bytes, log₂)")
    return fig


def fig_accuracy(res, an):
    if res.by_pass():
        title = ("Error vs exact fp64 softmax attention (rel. L2): the output (forward), the worst of dQ, dK, dV "
                 "(backward passes)")
    elif has_backward(res):
        title = "Gradient error vs exact fp64 softmax attention's (rel. L2, worst of dQ, dK, dV)"
    elif any(e["reference"] == "own_definition" for e in an.get("accuracy_references") or []):
        title = ("Error vs the fp64 reference (rel. L2): exact softmax attention, or the variant's own definition "
                 "where it is not softmax attention")
    else:
        title = "Error vs exact fp64 softmax attention (rel. L2), approximate variants"
    fig, cells = facet_grid(res, title + pass_phrase(res) + on_cpu(res), share_y=True)
    styles = series_styles(res)
    for (label, mask, rk), rows in res.sorted_series():
        ax = cells.get((mask, rk))
        if ax is None:
            continue
        st = styles[label]
        pts = [(r.seq_kv, r.pass_error()) for r in rows]  # backward rows: the gradient's
        bad = [n for n, e in pts if e is not None and not math.isfinite(e)]
        good = [(n, max(e, ERR_FLOOR)) for n, e in pts if e is not None and math.isfinite(e)]
        exact = rows[0].exact
        note = f" ({len(bad)} non-finite, ▲)" if bad else ""
        if good:
            plot_series(ax, label, st, *zip(*good), lw=1.4 if not exact else 0.8, ls=line_style(rows),
                        alpha=1.0 if not exact else 0.6, label=label + (" (exact: fp32 floor)" if exact else "") + note)
        if bad:  # non-finite errors are drawn at the top edge, never silently dropped
            ax.plot(bad, [1.0] * len(bad), ls="none", marker="^", ms=7, color=st.color,
                    transform=ax.get_xaxis_transform(), clip_on=False, label=None if good else label + note)
    for ax in cells.values():
        log2_axis(ax)
        ax.set_yscale("log")
    finish_axes(cells, "sequence length n (tokens)", "rel_l2_err = ‖X − X_ref‖₂ / ‖X_ref‖₂ (X: O, or worst of dQ, dK, dV)"
                if has_backward(res) else "rel_l2_err = ‖O − O_ref‖₂ / ‖O_ref‖₂")
    return fig


def fig_pareto(res, an):
    fig, cells = facet_grid(res, "Speed vs accuracy: speed-up over the fastest exact variant at the same point"
                            + (" and pass" if res.by_pass() else "") + pass_phrase(res) + on_cpu(res)
                            + ("\n(marker size grows with n, labels = n)" if res.by_pass() else ""))
    styles = series_styles(res)
    by_title = {(m, res.rest_title(rk)): ax for (m, rk), ax in cells.items()}
    ns_all = sorted({r.seq_kv for r in res.ok})
    size_of = {n: 14 + 60 * i / max(1, len(ns_all) - 1) for i, n in enumerate(ns_all)}
    for cell in an["pareto"]:
        ax = by_title.get((cell["mask"], cell["context"]))
        if ax is None:
            continue
        pts = [(max(p["rel_l2_err"], ERR_FLOOR), num(p["speedup"]), p) for p in cell["points"]]
        for label in sorted({p["series"] for p in cell["points"]}):
            mine = [q for q in pts if q[2]["series"] == label]
            tag(ax.scatter([q[0] for q in mine], [q[1] for q in mine], s=[size_of[q[2]["seq_kv"]] for q in mine],
                           color=styles[label].color, alpha=0.85, edgecolors="black", linewidths=0.4,
                           label=label + (" (exact)" if mine[0][2]["exact"] else ""), marker=styles[label].marker),
                label)
            for e, s, p in mine:
                if not p["exact"]:
                    ax.annotate(str(p["seq_kv"]), (e, s), fontsize=6, textcoords="offset points", xytext=(4, 2))
        front = [pts[i][:2] for i in cell["front"]]
        if len(front) > 1:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="black", lw=0.8,
                    alpha=0.5, label="Pareto front")
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    for ax in cells.values():
        ax.set_xscale("log")
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}×"))
    finish_axes(cells, "rel_l2_err of O, or worst of dQ, dK, dV (log)" if has_backward(res) else
                "rel_l2_err (log; marker size grows with n, labels = n)", "speed-up over fastest exact (×)")
    return fig


def fig_throughput(res, an):
    cal = ", ".join(f"{t} thread{'s' if t > 1 else ''}: {g:.1f} GFLOP/s" for t, g in sorted(res.calibration.items()))
    fig, cells = facet_grid(res, "Throughput as a fraction of the in-run sgemm calibration" + pass_phrase(res) + on_cpu(res)
                            + (f"\n({cal})" if cal else ""), share_y=True)
    styles = series_styles(res)
    for (label, mask, rk), rows in res.sorted_series():
        ax = cells.get((mask, rk))
        pts = [(r.seq_kv, r.frac_sgemm) for r in rows if r.frac_sgemm is not None and math.isfinite(r.frac_sgemm)]
        if ax is None or not pts:
            continue
        plot_series(ax, label, styles[label], *zip(*pts), lw=1.4, ls=line_style(rows), label=label)
    for ax in cells.values():
        log2_axis(ax)
        ax.set_ylim(bottom=0)
    finish_axes(cells, "sequence length n (tokens)", "GFLOP/s ÷ sgemm GFLOP/s (each variant's own FLOP count)"
                if not has_backward(res) else "GFLOP/s ÷ sgemm GFLOP/s (each pass's own FLOP count)")
    return fig


# The roofline's points of one series apart by pass and kv_heads: filled, hollow, half filled (the series keeps
# its colour and marker).
FILLS = ["full", "none", "left", "bottom", "right", "top"]
MAX_ROOFLINE_PANELS = 4


def fig_roofline(res, an):
    """Arithmetic intensity (flops / bytes, each variant's own counts) against achieved GFLOP/s, with the run's
    ceilings: the sgemm the rows were divided by (horizontal: their median, shaded: their range) and the
    memory bandwidth x intensity (diagonal), one panel per thread count. Colour and marker: the series' style
    (styles.py); fill: the pass and kv_heads (the K/V heads, = heads for multi-head attention), filled for the
    first of them (FILLS)."""
    roof = an["roofline"]
    panels = roof["panels"][:MAX_ROOFLINE_PANELS] or [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels) + 0.6, 4.6), squeeze=False)
    fig.suptitle(f"Roofline on {cpu_name(res)}: achieved GFLOP/s vs arithmetic intensity ("
                 + ("every pass, filled apart" if res.by_pass() else pass_short(res.passes[0])) + ")", fontsize=11)
    # Several passes: each series' passes are their own points (their own FLOPs and bytes), filled apart.
    several = len({p.get("pass") for pan in roof["panels"] for p in pan["points"]}) > 1
    styles = series_styles(res)
    kinds = sorted({(pass_order(p.get("pass")), p["kv_heads"]) for pan in roof["panels"] for p in pan["points"]},
                   key=lambda k: (k[0], k[1] is None, k[1]))
    fill = {k: FILLS[i % len(FILLS)] for i, k in enumerate(kinds)}
    several_kv = len({k[1] for k in kinds}) > 1

    def name(label, kind, heads):  # the pass and kv_heads only where they vary
        p = PASSES[kind[0][0]] if kind[0][0] < len(PASSES) else kind[0][1]
        return ((f"{label} [{p}]" if several else label)
                + (f", kv_heads={kind[1]}" + (" (MHA)" if kind[1] == heads else "") if several_kv else ""))
    for ax, pan in zip(axes[0], panels):
        ax.grid(True, which="both", alpha=0.25)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte moved, log)")
        ax.set_ylabel("achieved GFLOP/s (log)")
        if pan is None or not pan["points"]:
            ax.text(0.5, 0.5, "no data (no row has bytes)", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
            continue
        t = pan["threads"]
        ax.set_title(f"{t} thread{'s' if t != 1 else ''}", fontsize=9)
        xs = [p["intensity"] for p in pan["points"]]
        ys = [num(p["gflops"]) for p in pan["points"]]
        lo, hi = min(xs) / 3, max(xs) * 3
        sg, bw = pan["sgemm_gflops"], pan["bandwidth_gbytes_per_s"]
        if bw:
            lo, hi = (min(lo, sg / bw / 3), max(hi, sg / bw * 3)) if sg else (lo, hi)
            grid = np.geomspace(lo, hi, 200)
            roofy = bw * grid if not sg else np.minimum(bw * grid, sg)
            ax.plot(grid, bw * grid, color="black", lw=0.8, ls="--", alpha=0.6,
                    label=f"memory bandwidth {bw:.1f} GB/s × intensity")
            if sg:
                ax.plot(grid, roofy, color="black", lw=1.6, alpha=0.35)
        if sg:
            rng = pan.get("sgemm_gflops_range")
            spread = rng is not None and rng[1] > 1.01 * rng[0]
            ax.axhline(sg, color="black", lw=0.8, ls="-.", alpha=0.6,
                       label=f"sgemm {sg:.1f} GFLOP/s" + (f" (rows' own: {rng[0]:.0f}–{rng[1]:.0f})" if spread else ""))
            if spread:  # the sgemm the rows were divided by moved during the run: its range
                ax.axhspan(rng[0], rng[1], color="black", alpha=0.07, lw=0)
        if bw and sg:
            ax.axvline(sg / bw, color="gray", lw=0.6, ls=":", alpha=0.7)
        for label in sorted({p["series"] for p in pan["points"]}):
            st = styles[label]
            for kind in kinds:
                mine = [p for p in pan["points"]
                        if p["series"] == label and (pass_order(p.get("pass")), p["kv_heads"]) == kind]
                if not mine:
                    continue
                full = fill[kind] == "full"
                plot_series(ax, label, st, [p["intensity"] for p in mine], [num(p["gflops"]) for p in mine],
                            ls="none", ms=6, fillstyle=fill[kind], markerfacecoloralt="white",
                            mec="black" if full else st.color, mew=0.4 if full else 1.1, alpha=0.85,
                            label=name(label, kind, mine[0]["heads"]))
        ax.set_xlim(lo, hi)
        top = max([y for y in ys if y] + [sg or 0])
        bottom = min(y for y in ys if y)
        ax.set_ylim(bottom / 3, top * 2)
        ax.legend(fontsize=7, loc="lower right", framealpha=0.85)
    return fig


def _no_data_figure(title, text):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    fig.suptitle(title, fontsize=11)
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_axis_off()
    return fig


def _settings(entries, cap):
    """The (mask, context) settings of the analysis entries in their order, at most cap of them (a warning
    when more)."""
    keys = []
    for e in entries:
        if (e["mask"], e["context"]) not in keys:
            keys.append((e["mask"], e["context"]))
    if len(keys) > cap:
        print(f"{PROG}: warning: {len(keys)} settings: drawing the first {cap} only", file=sys.stderr)
    return keys[:cap], len(keys)


def fig_decode(res, an):
    """Decode (analysis "decode"): per setting, the time per new token against the context seq_kv (one line per
    series: solid exact, dashed the others), and what each series keeps between steps (memory.state_bytes,
    solid) with the KV cache exact attention keeps at the same context (memory.kv_cache_bytes, black dashed)
    beside it."""
    title = f"Decode{on_cpu(res)}: time per new token and memory kept between steps vs context"
    dec = an.get("decode")
    if not dec:
        return _no_data_figure(title, "no decode rows (seq_q < seq_kv, causal_lower_right)")
    settings, total = _settings(dec["series"], MAX_FACETS // 2)
    if len(settings) < total:
        title += f" (first {len(settings)} of {total} settings)"
    fig, axes = plt.subplots(len(settings), 2, figsize=(11.5, 4.0 * len(settings) + 0.7), squeeze=False,
                             layout="constrained")
    fig.suptitle(title, fontsize=11)
    styles = series_styles(res)
    for (mask, context), (at, am) in zip(settings, axes):
        where = f"mask={mask}" + (f", {context}" if context else "")
        at.set_title(f"time per token (median time ÷ seq_q)\n{where}", fontsize=9)
        am.set_title(f"memory kept between decode steps\n{where}", fontsize=9)
        kv_lines = []
        for e in dec["series"]:
            if (e["mask"], e["context"]) != (mask, context):
                continue
            st = styles[e["series"]]
            ls = "-" if e["exact"] else "--"
            pts = [(p["seq_kv"], num(p["time_per_token_ms"])) for p in e["points"]]
            plot_series(at, e["series"], st, *zip(*pts), lw=1.4, ls=ls, label=e["series"])
            state = [(p["seq_kv"], p["state_bytes"]) for p in e["points"] if p["state_bytes"]]
            if state:
                grow = e["state_exponent"]
                how = "constant" if grow == 0 else f"$n^{{{grow:.2f}}}$" if grow is not None else "one context"
                plot_series(am, e["series"], st, *zip(*state), lw=1.4, ls=ls, label=f"{e['series']}: state ({how})")
            kv = tuple((p["seq_kv"], p["kv_cache_bytes"]) for p in e["points"] if p["kv_cache_bytes"])
            if kv and kv not in kv_lines:
                kv_lines.append(kv)
        for i, kv in enumerate(kv_lines):  # the same for every series of a setting but for dtype or kv_heads
            am.plot(*zip(*kv), marker="x", ms=4, lw=1.2, ls=(0, (4, 2)), color="black", alpha=0.75 - 0.15 * min(i, 3),
                    label="KV cache of exact attention" + (f" ({i + 1})" if len(kv_lines) > 1 else ""))
        for ax in (at, am):
            ax.grid(True, which="both", alpha=0.25)
            log2_axis(ax)
        at.set_yscale("log")
        am.set_yscale("log", base=2)
        am.yaxis.set_major_formatter(ticker.FuncFormatter(lambda b, _: fmt_bytes(b)))
        finish_axes({0: at}, "context seq_kv (tokens)", "ms per new token (median)")
        if not am.has_data():
            am.text(0.5, 0.5, "no memory.state_bytes in these rows\n(written before it was recorded)", ha="center",
                    va="center", transform=am.transAxes, color="gray")
            am.set_axis_off()  # no axes to read: the title and the note only
        else:
            finish_axes({0: am}, "context seq_kv (tokens)", "bytes (log₂)")
    return fig


PHASE_HATCHES = ["", "//", "..", "xx", "\\\\", "++"]  # the phases of one series: bands of its colour, told apart by hatching


def fig_phases(res, an):
    """Phases (analysis "phases"): per series with phase_ms and setting, each phase's median time stacked against
    the context seq_kv (bands of the series' colour, a hatching each), the call's median time (the series' line,
    in its style) and the fastest exact row's (dashed, in that series' style)."""
    title = f"Phases{on_cpu(res)}: where a call's time goes vs context"
    ph = an.get("phases")
    if not ph:
        return _no_data_figure(title, "no rows with phase_ms")
    entries = ph["series"][:MAX_FACETS // 2]
    if len(entries) < len(ph["series"]):
        title += f" (first {len(entries)} of {len(ph['series'])} series)"
    cols = min(2, len(entries))
    rows = -(-len(entries) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 4.2 * rows + 0.7), squeeze=False, layout="constrained")
    fig.suptitle(title, fontsize=11)
    for ax in axes.flat[len(entries):]:
        ax.set_axis_off()
    styles = series_styles(res)
    for e, ax in zip(entries, axes.flat):
        ax.set_title(f"{e['series']}\nmask={e['mask']}" + (f", {e['context']}" if e["context"] else ""), fontsize=9)
        st = styles[e["series"]]
        ns = [p["seq_kv"] for p in e["points"]]
        bottom = np.zeros(len(ns))
        for i, k in enumerate(e["phases"]):
            ys = np.array([num(p["phase_ms"][k]) or 0.0 for p in e["points"]])
            ax.fill_between(ns, bottom, bottom + ys, facecolor=mcolors.to_rgba(st.color, 0.15 + 0.5 * i / max(1, len(e["phases"]) - 1)),
                            edgecolor=st.color, hatch=PHASE_HATCHES[i % len(PHASE_HATCHES)], lw=0.4, label=k)
            bottom = bottom + ys
        plot_series(ax, e["series"], st, ns, [num(p["time_ms"]) for p in e["points"]], lw=1.4,
                    label=f"{e['series']}: call (median)")
        for name in dict.fromkeys(p["fastest_exact"] for p in e["points"] if p["fastest_exact"]):
            pts = [(p["seq_kv"], num(p["fastest_exact_ms"])) for p in e["points"] if p["fastest_exact"] == name]
            plot_series(ax, name, styles[name], *zip(*pts), lw=1.2, ls="--", label=f"fastest exact ({name})")
        for c in e["crossings"]:
            if c["how"] == "measured":
                ax.axvline(num(c["seq_kv"]), color="gray", lw=0.8, ls=":")
                ax.annotate(f"{c['phase']} > {c['passes']}", (num(c["seq_kv"]), 0), xytext=(3, 3),
                            textcoords="offset points", fontsize=7, color="dimgray", rotation=90, va="bottom")
        ax.grid(True, which="both", alpha=0.25)
        log2_axis(ax)
        ax.set_ylim(bottom=0)
        finish_axes({0: ax}, "context seq_kv (tokens)", "ms (median)")
    return fig


def fig_mla(res, an):
    """MLA (analysis "mla"): per preset a row; left, the decode step's time against the context, both forms' layer
    call and core alone beside the sweep's one-token decode rows of the same head count; right, one call's time
    against its new tokens at each fixed context (the prefill crossover)."""
    title = f"Multi-head latent attention{on_cpu(res)}: decode per token vs context, and prefill vs new tokens"
    m = an.get("mla")
    if not m:
        return _no_data_figure(title, "no results.mla.jsonl rows")
    presets = list(dict.fromkeys(e["preset"] for e in m["series"]))[:MAX_FACETS // 2]
    fig, axes = plt.subplots(len(presets), 2, figsize=(11.5, 4.0 * len(presets) + 0.7), squeeze=False,
                             layout="constrained")
    fig.suptitle(title, fontsize=11)
    styles = series_styles(res)
    form_colors = {mla.NAIVE: "tab:red", mla.ABSORBED: "tab:blue"}
    for preset, (ad, ap) in zip(presets, axes):
        entries = [e for e in m["series"] if e["preset"] == preset]
        heads = entries[0]["heads"]
        ad.set_title(f"{preset} ({heads} heads): one decode step (1 new token)", fontsize=9)
        ap.set_title(f"{preset}: one call of s new tokens after a fixed context", fontsize=9)
        for e in entries:
            c = form_colors.get(e["form"], "tab:purple")
            ls = "-" if e["form"] == mla.NAIVE else "--" if e["form"] == mla.ABSORBED else "-."
            dec = [p for p in e["points"] if p["new_tokens"] == 1]
            if dec:
                ns = [p["context"] for p in dec]
                if e["form"] != mla.GQA:  # a GQA row is its core alone
                    ad.plot(ns, [num(p["time_ms"]) for p in dec], marker="o", ms=4, lw=1.5, ls=ls, color=c,
                            label=f"{e['label']}: layer")
                ad.plot(ns, [num(p["core_ms"]) for p in dec], marker="." if e["form"] != mla.GQA else "s", ms=4,
                        lw=1.0 if e["form"] != mla.GQA else 1.3, ls=":" if e["form"] != mla.GQA else ls, color=c,
                        label=e["label"] if e["form"] == mla.GQA else f"{e['label']}: core")
            for ctx in sorted({p["context"] for p in e["points"]}):
                pre = [p for p in e["points"] if p["context"] == ctx]
                if len(pre) < 2:
                    continue
                ap.plot([p["new_tokens"] for p in pre], [num(p["time_ms"]) for p in pre], marker="o", ms=4, lw=1.5,
                        ls=ls, color=c, label=f"{e['label']}, context {ctx}")
        for sd in m["sweep_decode"]:
            if sd["heads"] != heads or sd["series"] not in styles:
                continue
            pts = [(p["context"], num(p["time_ms"])) for p in sd["points"]]
            plot_series(ad, sd["series"], styles[sd["series"]], *zip(*pts), lw=1.2,
                        ls="-" if sd["exact"] else "-.", label=f"{sd['series']} (sweep, core)")
        for p in m["prefill"]:
            if p["preset"] == preset and p["naive_faster_from"] is not None:
                ap.axvline(num(p["naive_faster_from"]), color="gray", lw=0.8, ls=":")
        for ax in (ad, ap):
            ax.grid(True, which="both", alpha=0.25)
            log2_axis(ax)
            ax.set_yscale("log")
        finish_axes({0: ad}, "context (cached tokens)", "ms per call (median)")
        if ap.has_data():
            finish_axes({0: ap}, "new tokens s in the call", "ms per call (median)")
        else:
            ap.text(0.5, 0.5, "no prefill points\n(one context at several new-token counts)", ha="center",
                    va="center", transform=ap.transAxes, color="gray")
            ap.set_axis_off()
    return fig


LINESTYLES = ["-", "--", ":", "-."]


def fig_chunk_size(res, an):
    """Chunk size (analysis "chunk_sweep"): per variant and setting, its time and its GFLOP/s against the chunk,
    one line per n and family (line style: the series less its chunk, e.g. form=chunk / recurrent), in the
    variant's marker and hue: light at the smallest n, dark at the largest (Style.ramp)."""
    title = f"Chunk size{on_cpu(res)}: time and GFLOP/s vs chunk, one line per n"
    sweep = an.get("chunk_sweep")
    if not sweep:
        return _no_data_figure(title, "no variant measured at several chunk sizes")
    entries = sweep[:MAX_FACETS // 2]
    if len(entries) < len(sweep):
        title += f" (first {len(entries)} of {len(sweep)} panels)"
        print(f"{PROG}: warning: {len(sweep)} chunk-size panels: drawing the first {len(entries)} only", file=sys.stderr)
    fig, axes = plt.subplots(len(entries), 2, figsize=(11.5, 3.9 * len(entries) + 0.7), squeeze=False,
                             layout="constrained")
    fig.suptitle(title, fontsize=11)
    all_n = sorted({s["seq_kv"] for e in entries for f in e["families"] for s in f["by_n"]})
    table = results_table(res)
    for e, (at, ag) in zip(entries, axes):
        st = table.of(e["variant"], e["source"])
        color_of = {n: st.ramp(i, len(all_n)).color for i, n in enumerate(all_n)}
        where = f"mask={e['mask']}" + (f", {e['context']}" if e["context"] else "")
        name = e["variant"] + (" (PyTorch)" if e["source"] == "peer" else "")
        at.set_title(f"{name}: time\n{where}", fontsize=9)
        ag.set_title(f"{name}: GFLOP/s\n{where}", fontsize=9)
        chunks = set()
        several = len(e["families"]) > 1
        for j, f in enumerate(e["families"]):
            for s in f["by_n"]:
                cs = [p["chunk"] for p in s["points"]]
                chunks.update(cs)
                style = dict(marker=st.marker, ms=MS, lw=1.4, ls=LINESTYLES[j % len(LINESTYLES)],
                             color=color_of[s["seq_kv"]])
                tag(at.plot(cs, [num(p["time_ms"]) for p in s["points"]], **style), e["variant"], "hue")
                gf = [(c, num(p["gflops"])) for c, p in zip(cs, s["points"]) if num(p["gflops"]) is not None]
                if gf:
                    tag(ag.plot(*zip(*gf), **style), e["variant"], "hue")
                best = s["best_chunk"]
                at.plot([best], [num(s["best_time_ms"])], ls="none", marker="*", ms=9, color=color_of[s["seq_kv"]],
                        mec="black", mew=0.5, zorder=3)
        for ax in (at, ag):
            ax.grid(True, which="both", alpha=0.25)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(chunks))
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))
            ax.xaxis.set_minor_locator(ticker.NullLocator())
        at.set_yscale("log")
        ag.set_ylim(bottom=0)
        finish_axes({0: at, 1: ag}, "chunk (tokens)", "time (ms, median; ★ fastest chunk)", legend=False)
        ag.set_ylabel("GFLOP/s")
        # One legend entry per n (colour) and per family (line style), not one per line.
        ns = sorted({s["seq_kv"] for f in e["families"] for s in f["by_n"]})
        handles = [Line2D([], [], color=color_of[n], marker=st.marker, ms=MS, lw=1.4, label=f"n={n}") for n in ns]
        if several:
            handles += [Line2D([], [], color="black", lw=1.2, ls=LINESTYLES[j % len(LINESTYLES)], label=f["series"])
                        for j, f in enumerate(e["families"])]
        for ax in (at, ag):
            ax.legend(handles=handles, fontsize=7, loc="best", framealpha=0.85)
    return fig


def _error_line(ax, pts, series, st, ls, lw=1.4, alpha=1.0):
    """max_abs_err against n on a log axis in the series' style st: finite errors (below ERR_FLOOR drawn at it) as
    a line, non-finite ones as triangles on the top edge (never dropped), as the accuracy figure draws them.
    Returns how many were non-finite."""
    pts = [(n, e) for n, e in pts if e is not None]
    good = [(n, max(e, ERR_FLOOR)) for n, e in pts if math.isfinite(e)]
    bad = [n for n, e in pts if not math.isfinite(e)]
    if good:
        plot_series(ax, series, st, *zip(*good), lw=lw, ls=ls, alpha=alpha)
    if bad:
        ax.plot(bad, [1.0] * len(bad), ls="none", marker="^", ms=7, color=st.color, transform=ax.get_xaxis_transform(),
                clip_on=False)
    return len(bad)


def fig_dtype_vs_fp32(res, an):
    """Storage dtypes (analysis "dtype_vs_fp32"): per setting, left the speed-up of each series of a dtype other
    than fp32 over the same variant's fp32 row at the same point (time_fp32 / time, > 1 faster; bars: the
    ratio's 95% interval where it has one; hollow: the row or its fp32 row noisy) against n; right its
    max_abs_err against n in both views, the kernel's (on the inputs it read, solid) and end to end (on the fp32
    inputs, dashed), with the fp32 series' error (dotted, in its colour) as the floor; one legend per row beside
    it, a series having its colour in both panels. Series as everywhere: their label names the dtype and the
    parameters that vary (bf16_kernel=...)."""
    title = f"Storage dtype vs fp32{on_cpu(res)}: speed-up over the same variant's fp32 row, and max_abs_err, vs n"
    dv = an.get("dtype_vs_fp32")
    if not dv or not dv["series"]:
        return _no_data_figure(title, "one storage dtype only" if not dv else "no series of a dtype other than fp32")
    if dv["passes"] != ["forward"]:
        title += f" ({', '.join(pass_short(p) for p in dv['passes'])})"
    settings, total = _settings(dv["series"], MAX_FACETS // 2)
    if len(settings) < total:
        title += f" (first {len(settings)} of {total} settings)"
    fig, axes = plt.subplots(len(settings), 2, figsize=(13.5, 4.0 * len(settings) + 0.7), squeeze=False,
                             layout="constrained")
    fig.suptitle(title, fontsize=11)
    styles = series_styles(res)
    for (mask, context), (asp, aerr) in zip(settings, axes):
        where = f"mask={mask}" + (f", {context}" if context else "")
        asp.set_title(f"speed-up over fp32: time_fp32 ÷ time at the same point (> 1: faster)\n{where}", fontsize=9)
        aerr.set_title(f"max_abs_err vs fp64: kernel (solid), end to end (dashed), fp32 floor (dotted)\n{where}",
                       fontsize=9)
        floors, top, noisy_any, handles = {}, 1.0, False, []
        for e in dv["series"]:
            if (e["mask"], e["context"]) != (mask, context):
                continue
            st = styles[e["series"]]
            sp = [(p["seq_kv"], num(p["speedup"]), p) for p in e["points"]
                  if num(p["speedup"]) is not None and math.isfinite(num(p["speedup"]))]
            if sp:
                ns, ys = [q[0] for q in sp], [q[1] for q in sp]
                ivs = [q[2]["speedup_interval"] for q in sp]
                lo = [max(0.0, y - iv[0]) if iv else 0.0 for y, iv in zip(ys, ivs)]
                hi = [max(0.0, iv[1] - y) if iv else 0.0 for y, iv in zip(ys, ivs)]
                tag(asp.errorbar(ns, ys, yerr=[lo, hi], marker=st.marker, ms=MS, lw=1.4, capsize=2, color=st.color,
                                 label=e["series"]), e["series"])
                top = max([top] + [y + h for y, h in zip(ys, hi)])
                noisy = [(n, y) for n, y, p in sp if p["noisy"] or p["fp32_noisy"]]
                if noisy:  # hollow: interference stayed above the threshold on every attempt (either row)
                    asp.plot(*zip(*noisy), mec=st.color, zorder=3, **NOISY_RING)
                    noisy_any = True
            bad = sum(_error_line(aerr, [(p["seq_kv"], num(p[key])) for p in e["points"]], e["series"], st, ls)
                      for key, ls in (("kernel_max_abs_err", "-"), ("e2e_max_abs_err", "--")))
            handles.append(Line2D([], [], color=st.color, marker=st.marker, ms=MS, lw=1.4,
                                  label=e["series"] + (f" ({bad} non-finite, ▲)" if bad else "")))
            for p in e["points"]:
                if p["fp32_series"] is not None:
                    floors.setdefault(p["fp32_series"], {})[p["seq_kv"]] = num(p["fp32_max_abs_err"])
        for label, by_n in sorted(floors.items()):  # once per fp32 series (bf16 and fp16 share it)
            bad = _error_line(aerr, sorted(by_n.items()), label, styles[label], ":", lw=1.0, alpha=0.8)
            handles.append(Line2D([], [], color=styles[label].color, marker=styles[label].marker, ms=MS, lw=1.0, ls=":",
                                  label=f"{label}: floor" + (f" ({bad} non-finite, ▲)" if bad else "")))
        handles += [Line2D([], [], color="black", lw=1.2, ls="-", label="solid: kernel (accuracy)"),
                    Line2D([], [], color="black", lw=1.2, ls="--", label="dashed: end to end (accuracy_e2e)")]
        for ax in (asp, aerr):
            ax.grid(True, which="both", alpha=0.25)
            log2_axis(ax)
        aerr.set_yscale("log")
        if asp.has_data():
            asp.axhline(1.0, color="gray", lw=0.9, ls="--", label="as fast as fp32 (1×)")
            if noisy_any:
                noisy_legend(asp)
            asp.set_ylim(bottom=0, top=max(1.5, top * 1.15))
            asp.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}×"))
            finish_axes({0: asp}, "sequence length n (tokens)", "speed-up over fp32 (×)")
        else:
            asp.text(0.5, 0.5, "no fp32 row at the same points", ha="center", va="center", transform=asp.transAxes,
                     color="gray")
            asp.set_axis_off()
        finish_axes({0: aerr}, "sequence length n (tokens)", "max_abs_err (log)", legend=False)
        # One legend for the row's two panels (a series has its colour in both), beside them: inside, with a few
        # series in two views, it would hide the lines.
        aerr.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), framealpha=0.85)
    return fig


FIGURE_FUNCTIONS = dict(zip(FIGURES, (fig_time, fig_memory, fig_accuracy, fig_pareto, fig_throughput, fig_roofline,
                                      fig_decode, fig_phases, fig_mla, fig_chunk_size, fig_dtype_vs_fp32)))


PATTERN_COLUMNS = 5  # heatmaps per row of the patterns figure: a variant's heads side by side, variants wrapped
PATTERN_SIDE = 2.6  # inches per heatmap (3.2 with the tokens on its axes)


def _pattern_norm(w, scale):
    """A variant's colour scale over all its heads (finite weights): √ from 0 to its largest weight (magma), or
    for a variant with negative weights signed √ symmetric about 0 (red positive, blue negative, 0 white)."""
    finite = np.abs(w[np.isfinite(w)])
    top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    if scale == "signed_sqrt":
        return "RdBu_r", mcolors.FuncNorm((lambda x: np.sign(x) * np.sqrt(np.abs(x)), lambda y: np.sign(y) * y * y),
                                          vmin=-top, vmax=top)
    return "magma", mcolors.PowerNorm(gamma=0.5, vmin=0.0, vmax=top)


def fig_patterns(p):
    """The heatmaps of a patterns folder (patterns.load_patterns): per variant its first heads
    (patterns.heads_shown: all of up to 4 for a few variants, one for 13) side by side with its own colour bar
    (patterns.SCALES: √ from 0, or signed √ for a variant with a negative weight), the variants wrapped
    PATTERN_COLUMNS heatmaps to a row; under them the footnote of patterns.notes (scales, unmasked variants, the
    recurrences' g / beta, the variants not drawn and why)."""
    summary = patterns.summarise(p)
    meta, tokens, drawn = p["meta"], p["tokens"], p["drawn"]
    shown, n = summary["heads_shown"], summary["seq"]
    per_row = max(1, PATTERN_COLUMNS // shown)
    rows = -(-len(drawn) // per_row)
    per_row = -(-len(drawn) // rows)  # as many variants in every row, the last but fewer
    label_tokens = tokens is not None and len(tokens) <= MAX_TOKEN_LABELS
    side = 3.2 if label_tokens else PATTERN_SIDE
    width = (side * shown + 0.9) * per_row
    fig, axes = plt.subplots(rows, per_row * shown, figsize=(width, (side + 0.7) * rows + 0.6), squeeze=False,
                             layout="constrained")
    src = (f"text '{os.path.basename(meta.get('text', ''))}'" if meta.get("source") == "text"
           else f"gaussian Q, K (std={meta.get('std')})")
    fig.suptitle(f"Attention weights, n={n}, {src}, {patterns.MASKS[summary['mask']]}; "
                 f"{patterns.heads_text(shown, summary['heads'])} (row = query, column = key)", fontsize=11)
    for ax in axes.flat[len(drawn) * shown:]:
        ax.set_axis_off()  # the last row's empty places
    for i, ((entry, w), info) in enumerate(zip(drawn, summary["variants"])):
        r, c = divmod(i, per_row)
        block = [axes[r][c * shown + h] for h in range(shown)]
        cmap, norm = _pattern_norm(w, info["scale"])
        params = textwrap.fill(params_text(entry.get("params", {})).replace(",", ", "), 30 * shown)
        for h, ax in enumerate(block):
            im = ax.imshow(np.ma.masked_invalid(w[h]), cmap=cmap, norm=norm, interpolation="nearest")
            head = f"head {h}" if shown > 1 else ""
            if h == 0:
                title = info["variant"] + patterns.unmasked_note(meta, entry)
                ax.set_title("\n".join(x for x in (title, params, head) if x), fontsize=8, loc="left")
            else:
                ax.set_title(head, fontsize=8, loc="left")
            if label_tokens:
                ax.set_xticks(range(n))
                ax.set_yticks(range(n))
                ax.set_xticklabels(tokens, rotation=90, fontsize=5)
                ax.set_yticklabels(tokens, fontsize=5)
            ax.tick_params(labelsize=6)
            ax.set_xlabel("key", fontsize=7)
            if h == 0:
                ax.set_ylabel("query", fontsize=7)
        cb = fig.colorbar(im, ax=block, fraction=0.05, shrink=0.85, pad=0.02)
        cb.set_label("weight, " + ("signed √" if info["scale"] == "signed_sqrt" else "√") + " scale", fontsize=7)
        cb.ax.tick_params(labelsize=6)
    text = "\n".join(textwrap.fill(line, int(width * 17)) for line in patterns.notes(summary))
    fig.text(0.005, 0.0, text, fontsize=7.5, va="top", ha="left", color="dimgray")
    return fig


def save_figure(fig, out_dir, stem):
    """fig as OUT_DIR/<stem>.png and .svg, each written to a temporary name and renamed; closes fig."""
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


def draw_results(res, an, plots_dir):
    """Every figure of FIGURES into plots_dir (the roofline only when some row has bytes, decode only with
    decode rows, phases only with rows that carry phase_ms, chunk_size only with a chunk sweep, dtype_vs_fp32 only with several storage dtypes); returns the
    paths written."""
    written = []
    for stem in FIGURES:
        if stem == ROOFLINE and not any(p["points"] for p in an["roofline"]["panels"]):
            continue  # older results: no row has bytes; the report's Roofline section says so
        if ((stem == DECODE and not an.get("decode")) or (stem == CHUNK_SIZE and not an.get("chunk_sweep"))
                or (stem == PHASES and not an.get("phases")) or (stem == MLA and not an.get("mla"))):
            continue  # no decode rows / no chunk sweep / no phases: neither the figure nor its report section
        if stem == DTYPE_VS_FP32 and not (an.get("dtype_vs_fp32") or {}).get("series"):
            continue  # one storage dtype: the Accuracy by dtype section has its table only
        written += save_figure(FIGURE_FUNCTIONS[stem](res, an), plots_dir, stem)
    return written


def draw_patterns(p, out_dir):
    """The heatmaps of an `attnbench patterns` folder (patterns.load_patterns) as out_dir/patterns.png and .svg;
    returns the paths."""
    return save_figure(fig_patterns(p), out_dir, PATTERNS)
