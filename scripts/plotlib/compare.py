"""The figure of `attnbench compare A B --json`: one row per point measured on both sides, its B/A ratio of the
medians on a log axis with a line at 1 (no change), the 10th-90th percentile range of the pairwise ratios of the
repetitions as an error bar, the significant points (p < alpha, two-sided Mann-Whitney U) filled in red (slower)
or green (faster), the others hollow, and the points measured with interference (`noisy` on either side) on a
hatched band with a note. Saved as OUT/compare.png and .svg (figures.save_figure: written to a temporary name,
then renamed)."""
import json
import os
import sys

from .common import PROG, InputError, num

STEM = "compare"
MAX_POINTS = 200  # rows per figure; beyond this the labels are unreadable anyway
SLOWER, FASTER, NEUTRAL, NOISY = "#c0392b", "#1e8449", "#7f8c8d", "#e67e22"
# Ratio ticks on the log axis (a comparison rarely spans a decade, where the default locator labels only 1).
RATIO_TICKS = [0.1, 0.2, 0.25, 0.33, 0.5, 0.67, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 3, 4, 5, 10]


def load_compare(path):
    """The document `attnbench compare --json` wrote, checked enough to draw: InputError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise InputError(f"'{path}': cannot read the compare JSON ({e.strerror or e})")
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"'{path}': not valid JSON ({e}); give what `attnbench compare A B --json` printed")
    if not isinstance(doc, dict) or not isinstance(doc.get("points"), list):
        raise InputError(f"'{path}': not the output of `attnbench compare A B --json` (no \"points\" list)")
    for i, p in enumerate(doc["points"]):
        if not isinstance(p, dict) or not isinstance(p.get("id"), str):
            raise InputError(f"'{path}': points[{i}] must be an object with a string \"id\", got {json.dumps(p)[:80]}")
    return doc


def side_title(doc, key):
    s = doc.get(key) if isinstance(doc.get(key), dict) else {}
    parts = [str(s.get("dir") or "?")]
    if s.get("git_commit"):
        parts.append(f"commit {s['git_commit']}")
    if s.get("isa_option") and s.get("isa_option") != "best":
        parts.append(f"--isa {s['isa_option']}")
    return ", ".join(parts)


def fig_compare(doc):
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib import ticker

    alpha = num(doc.get("alpha")) or 0.05
    points = [p for p in doc["points"] if num(p.get("ratio")) and num(p.get("ratio")) > 0]
    skipped = len(doc["points"]) - len(points)
    if len(points) > MAX_POINTS:
        print(f"{PROG}: warning: {len(points)} points: drawing the first {MAX_POINTS}", file=sys.stderr)
        points = points[:MAX_POINTS]
    n = len(points)
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.28 * max(n, 3)))
    title = f"B / A time per point (median ratio; p10–p90 of the pairwise ratios)\nA: {side_title(doc, 'a')}\n" \
            f"B: {side_title(doc, 'b')}"
    if skipped:
        title += f"\n({skipped} point(s) without a ratio not drawn)"
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", lw=1, zorder=1)
    lo, hi = 1.0, 1.0
    for row, p in enumerate(points):
        y = n - 1 - row  # the first point on top
        ratio = num(p["ratio"])
        p10, p90 = num(p.get("ratio_p10")), num(p.get("ratio_p90"))
        pval = num(p.get("p_value"))
        significant = pval is not None and pval < alpha
        color = (SLOWER if ratio > 1 else FASTER) if significant else NEUTRAL
        noisy = bool(p.get("noisy_a")) or bool(p.get("noisy_b"))
        if noisy:
            ax.axhspan(y - 0.45, y + 0.45, facecolor="none", edgecolor=NOISY, hatch="///", lw=0, alpha=0.3, zorder=0)
            who = "A and B" if p.get("noisy_a") and p.get("noisy_b") else ("A" if p.get("noisy_a") else "B")
            ax.annotate(f"noisy ({who})", (ratio, y), xytext=(8, 3), textcoords="offset points", fontsize=7,
                        color=NOISY)
        if p10 is not None and p90 is not None and p10 > 0:
            ax.hlines(y, p10, p90, color=color, lw=2, alpha=0.6, zorder=2)
            lo, hi = min(lo, p10), max(hi, p90)
        lo, hi = min(lo, ratio), max(hi, ratio)
        if pval is None:
            ax.plot(ratio, y, marker="x", color=NEUTRAL, ms=7, zorder=3)
        else:
            ax.plot(ratio, y, marker="o", ms=7, zorder=3, color=color,
                    markerfacecolor=color if significant else "white")
        label = f"{ratio:.3f}x" + (f", p={pval:.2g}" if pval is not None else ", no p")
        ax.annotate(label, (ratio, y), xytext=(8, -9 if noisy else -3), textcoords="offset points", fontsize=7,
                    color=color)
    ax.set_yticks(range(n))
    ax.set_yticklabels([p["id"] for p in reversed(points)], fontsize=7)
    ax.set_ylim(-0.7, max(n, 1) - 0.3)
    span = max(hi / lo, 1.1)
    x_lo, x_hi = lo / span ** 0.15, hi * span ** 0.35  # room on the right for the labels
    ax.set_xlim(x_lo, x_hi)
    ticks = [t for t in RATIO_TICKS if x_lo <= t <= x_hi]
    if len(ticks) >= 3:  # else (a range beyond 0.1 .. 10) the default log ticks
        ax.xaxis.set_major_locator(ticker.FixedLocator(ticks))
        ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.set_xlabel("B / A (log scale; > 1: B slower)")
    ax.grid(True, axis="x", which="both", alpha=0.25)
    if not n:
        ax.text(0.5, 0.5, "no point measured on both sides", ha="center", va="center", transform=ax.transAxes,
                color="gray")
    handles = [
        Line2D([], [], marker="o", ls="", color=SLOWER, label=f"slower, p < {alpha:g}"),
        Line2D([], [], marker="o", ls="", color=FASTER, label=f"faster, p < {alpha:g}"),
        Line2D([], [], marker="o", ls="", color=NEUTRAL, markerfacecolor="white", label="not significant"),
        Line2D([], [], marker="x", ls="", color=NEUTRAL, label="no p-value (< 2 repetitions recorded)"),
        Patch(facecolor="none", edgecolor=NOISY, hatch="///", label="noisy (interference)"),
    ]
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.55 / max(n, 3) - 0.08),
              ncol=5, framealpha=0.85)
    return fig


def plot_compare(path, out_dir=None):
    """Draws OUT_DIR/compare.png and .svg (OUT_DIR: the compare JSON's folder by default); prints the paths."""
    doc = load_compare(path)
    out_dir = out_dir or os.path.dirname(os.path.abspath(path))
    os.makedirs(out_dir, exist_ok=True)
    from .figures import save_figure  # matplotlib and the figures' style, only once the input is good

    for p in save_figure(fig_compare(doc), out_dir, STEM):
        print(p)
    return 0
