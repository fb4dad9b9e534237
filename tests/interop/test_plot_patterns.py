#!/usr/bin/python3
"""The attention-patterns figure and REPORT.md's section (scripts/plotlib/patterns.py, figures.fig_patterns):

- a hand-made patterns folder (--mask auto, 8 tokens, 2 heads): softmax weights (>= 0) on a √ scale from 0,
  negative weights (a recurrence's, an unmasked Nyström's) on a symmetric signed √ scale, each variant's own;
  the unmasked variant titled "(unmasked)"; a skipped, a failed and an unreadable entry listed with their
  reasons in the footnote and REPORT.md while the others are drawn; the recurrence's beta named; a non-finite
  weight left blank and counted; summary.json "patterns"; a folder with no pattern at all: exit 2 naming it;
- the layout: 4 variants draw all 4 heads each, 13 one head each, wrapped in rows of at most 5 heatmaps;
- the real thing: `attnbench patterns --seq 64 --mask auto` over every registered variant (scripts/run's
  command) drawn with one panel per variant, signed exactly where a weight is negative, "(unmasked)" exactly
  where the entry is not causal, and a figure a few thousand pixels wide at most.

Run by ctest as `/usr/bin/python3 test_plot_patterns.py --attnbench PATH`. Exit 0 pass, 1 fail, 77 skip (numpy or
matplotlib missing)."""
import json
import os
import shutil
import subprocess
import sys

import test_plot as tp  # check, run_plot and the failures they record (next to this file)

check = tp.check
sys.path.insert(0, tp.SCRIPTS)
N, HEADS = 8, 2


def write_folder(d, entries):
    """A patterns folder like `attnbench patterns --mask auto` writes: entries are (patterns.json entry, weights or
    None); each weights array is saved as <name>.npy, and a beta file beside a recurrence's."""
    import numpy as np

    os.makedirs(d)
    out = []
    for e, w in entries:
        if w is not None:
            np.save(os.path.join(d, e["file"]), w.astype(np.float32))
        for k, ins in (e.get("inputs") or {}).items():
            if isinstance(ins, dict):
                np.save(os.path.join(d, ins["file"]), np.full(ins["shape"], 0.5, np.float32))
        out.append(e)
    meta = {"mask": "auto", "causal": True, "seq": N, "heads": HEADS, "head_dim": 4, "seed": 7, "source": "seq",
            "std": 1.0, "variants": out}
    with open(os.path.join(d, "patterns.json"), "w") as f:
        json.dump(meta, f)


def hand_made():
    import numpy as np

    rng = np.random.default_rng(1)
    lower = np.tril(np.ones((N, N)))
    soft = rng.random((HEADS, N, N)) * lower
    soft /= soft.sum(-1, keepdims=True)
    signed = rng.normal(size=(HEADS, N, N)) * lower  # a recurrence's signed, unnormalised weights
    full = rng.normal(0.1, 0.2, size=(HEADS, N, N))  # unmasked, some negative
    nan = soft.copy()
    nan[0, 3, 1] = np.nan

    def ok(name, causal, **more):
        return dict({"name": name, "status": "ok", "file": f"{name}.npy", "causal": causal, "params": {"k": 1}}, **more)
    beta = {"beta": {"distribution": "sigmoid(N(0,1))", "shape": [1, HEADS, N], "file": "delta_rule.beta.npy"},
            "seed": 7}
    return [(ok("naive", True), soft), (ok("delta_rule", True, inputs=beta), signed), (ok("nystrom", False), full),
            ({"name": "linear", "status": "skipped", "reason": "no pattern at n=8 for this test"}, None),
            ({"name": "bigbird", "status": "failed", "reason": "threw: boom"}, None),
            (ok("gla", True), None),  # listed ok, its file missing: failed, the others drawn
            (ok("zz_plugin", True), nan)]


def images(fig):
    """[(axes title, image)] of fig's heatmaps, in drawing order."""
    return [(ax.get_title(loc="left"), im) for ax in fig.axes for im in ax.get_images()]


def signed_norm(im):
    return im.get_cmap().name == "RdBu_r" and im.norm.vmin == -im.norm.vmax


def test_hand_made(tmp):
    import matplotlib.pyplot as plt
    from plotlib import figures
    from plotlib.patterns import load_patterns

    d = os.path.join(tmp, "hand")
    write_folder(d, hand_made())
    r = tp.run_plot("--patterns", d)
    ok = r.returncode == 0 and os.path.isfile(os.path.join(d, "patterns.png"))
    check(ok, "[hand] plot.py --patterns draws despite a skipped, a failed and an unreadable entry"
          + ("" if ok else f" (rc {r.returncode}: {r.stderr.strip()[-300:]})"))
    check("warning" in r.stderr and "gla is listed ok but has no pattern to draw" in r.stderr,
          "[hand] the unreadable entry is a warning naming it")
    p = load_patterns(d)
    fig = figures.fig_patterns(p)
    ims = images(fig)
    titles = [t.split("\n")[0] for t, _ in ims if t and not t.startswith("head")]
    check(titles == ["naive", "delta_rule", "nystrom (unmasked)", "zz_plugin"],
          f"[hand] the four drawable variants, the unmasked one titled so ({titles})")
    by = {}
    for t, im in ims:
        by.setdefault(t.split("\n")[0] if not t.startswith("head") else list(by)[-1], []).append(im)
    check(all(len(v) == HEADS for v in by.values()), "[hand] both heads of each variant (4 variants: every head)")
    check(all(signed_norm(im) for v in ("delta_rule", "nystrom (unmasked)") for im in by[v])
          and not any(signed_norm(im) for v in ("naive", "zz_plugin") for im in by[v])
          and all(im.norm.vmin == 0 for v in ("naive", "zz_plugin") for im in by[v]),
          "[hand] negative weights on a symmetric signed scale, the others from 0")
    check(len({id(im.norm) for v in by.values() for im in v}) == 4
          and all(len({id(im.norm) for im in v}) == 1 for v in by.values()),
          "[hand] each variant its own colour scale, shared by its heads")
    bars = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel().startswith("weight")]
    check(bars.count("weight, signed √ scale") == 2 and bars.count("weight, √ scale") == 2,
          f"[hand] each colour bar names its scale ({bars})")
    foot = "\n".join(t.get_text() for t in fig.texts).replace("\n", " ")
    for want in ("linear (skipped: no pattern at n=8 for this test)", "bigbird (failed: threw: boom)", "gla (failed:",
                 "delta_rule: beta = sigmoid(N(0,1)) [1×2×8]", "Unmasked (no causal form): nystrom",
                 "zz_plugin (1)", "for a variant with a negative weight: delta_rule, nystrom"):
        check(want in foot, f"[hand] the footnote says '{want}'")
    plt.close(fig)
    # In a results folder: REPORT.md's section and summary.json.
    res = os.path.join(tmp, "hand-results")
    os.makedirs(res)
    shutil.copy(os.path.join(tp.FIXTURE, "results.jsonl"), res)
    shutil.copytree(d, os.path.join(res, "patterns"))
    r = tp.run_plot(res)
    if not check(r.returncode == 0, "[hand] plot.py RESULTS_DIR with that patterns/ exits 0"
                 + (f" (rc {r.returncode}: {r.stderr.strip()[-300:]})" if r.returncode else "")):
        return
    with open(os.path.join(res, "REPORT.md"), encoding="utf-8") as f:
        sec = tp.report_section(f.read(), "Attention patterns")
    for want in ("| `nystrom` | unmasked | signed √, symmetric about 0 |", "| `naive` | causal | √ from 0 | [0,",
                 "| `linear` | — | not drawn: skipped (no pattern at n=8 for this test) | — |",
                 "| `bigbird` | — | not drawn: failed (threw: boom) | — |", "beta = sigmoid(N(0,1))",
                 "the figure draws all 2 heads of each variant", "![Attention patterns](plots/patterns.png)"):
        check(want in sec, f"[hand] REPORT.md's Attention patterns section has '{want}'")
    with open(os.path.join(res, "summary.json"), encoding="utf-8") as f:
        s = json.load(f)["patterns"]
    check(s["mask"] == "auto" and [v["scale"] for v in s["variants"]] == ["sqrt", "signed_sqrt", "signed_sqrt", "sqrt"]
          and [m["variant"] for m in s["missing"]] == ["linear", "bigbird", "gla"],
          "[hand] summary.json 'patterns': the scales and the variants not drawn")
    # No pattern at all: exit 2, naming patterns.json, nothing written.
    none = os.path.join(tmp, "none")
    write_folder(none, [e for e in hand_made() if e[1] is None])
    r = tp.run_plot("--patterns", none)
    ok = (r.returncode == 2 and os.path.join(none, "patterns.json") + ": no variant has a pattern" in r.stderr
          and "linear: skipped" in r.stderr and not os.path.exists(os.path.join(none, "patterns.png")))
    check(ok, "[none] no drawable variant: exit 2 naming patterns.json and why, nothing written"
          + ("" if ok else f" ({r.returncode}: {r.stderr.strip()})"))


def test_layout(tmp):
    import matplotlib.pyplot as plt
    import numpy as np
    from plotlib import figures
    from plotlib.patterns import load_patterns

    w = np.tril(np.ones((4, N, N))) / np.arange(1, N + 1)[:, None]
    for count, heads, rows in ((4, 4, 4), (13, 1, 3)):
        d = os.path.join(tmp, f"layout{count}")
        write_folder(d, [({"name": f"v{i:02d}", "status": "ok", "file": f"v{i:02d}.npy", "causal": True}, w)
                         for i in range(count)])
        fig = figures.fig_patterns(load_patterns(d))
        ims = images(fig)
        grid = {(ax.get_subplotspec().rowspan.start, ax.get_subplotspec().colspan.start) for ax in fig.axes
                if ax.get_images()}
        cols = max(c for _, c in grid) + 1
        check(len(ims) == count * heads and max(r for r, _ in grid) + 1 == rows and cols <= 5,
              f"[layout] {count} variants: {heads} head(s) each, {rows} rows of at most 5 heatmaps "
              f"({len(ims)} heatmaps, {cols} columns)")
        plt.close(fig)


def test_real(tmp):
    import matplotlib.pyplot as plt
    import numpy as np
    from plotlib import figures
    from plotlib.patterns import load_patterns

    exe = os.environ.get("ATTNBENCH")
    if not exe:
        tp.say("skip  [real] no --attnbench PATH given")
        return
    out = os.path.join(tmp, "real")
    r = subprocess.run([exe, "patterns", "--seq", "64", "--mask", "auto", "--param", "sliding_window.window=8",
                        "--param", "sliding_window.global_tokens=1", "--out", out], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0 and "--mask" in r.stderr:
        tp.say(f"skip  [real] this attnbench has no `patterns --mask auto` ({r.stderr.strip()[:200]})")
        return
    if not check(r.returncode in (0, 1) and os.path.isfile(os.path.join(out, "patterns.json")),
                 f"[real] attnbench patterns --mask auto writes patterns.json (rc {r.returncode})"):
        return
    listed = [v["name"] for v in json.loads(subprocess.run([exe, "list", "--json"], capture_output=True, text=True,
                                                           check=True).stdout)]
    p = load_patterns(out)
    fig = figures.fig_patterns(p)
    ims = images(fig)
    heads_each = len(ims) // max(1, len(p["drawn"]))
    drawn = [e["name"] for e, _ in p["drawn"]]
    check(sorted(drawn + [m["variant"] for m in p["missing"]]) == sorted(listed)
          and len(ims) == len(drawn) * heads_each,
          f"[real] every registered variant drawn or listed ({len(drawn)} drawn, {heads_each} head(s) each)")
    wrong = []
    for i, (e, w) in enumerate(p["drawn"]):
        im = ims[i * heads_each][1]
        title = ims[i * heads_each][0].split("\n")[0]
        if signed_norm(im) != bool((w[np.isfinite(w)] < 0).any()):
            wrong.append(f"{e['name']}: scale")
        if title.endswith("(unmasked)") == bool(e["causal"]):
            wrong.append(f"{e['name']}: title '{title}'")
    check(not wrong, f"[real] signed exactly where a weight is negative, '(unmasked)' exactly where not causal "
                     f"({wrong})")
    recurrences = [e["name"] for e, _ in p["drawn"] if e.get("inputs")]
    foot = "\n".join(t.get_text() for t in fig.texts).replace("\n", " ")
    check(all(f"{v}: " in foot for v in recurrences),
          f"[real] the footnote names each recurrence's inputs ({recurrences})")
    plt.close(fig)
    r = tp.run_plot("--patterns", out)
    png = os.path.join(out, "patterns.png")
    if check(r.returncode == 0 and os.path.isfile(png), f"[real] plot.py --patterns exits 0 (rc {r.returncode})"):
        with open(png, "rb") as f:
            head = f.read(24)
        width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        check(width <= 3000 and height <= 2500, f"[real] patterns.png is {width} x {height} px (at most 3000 x 2500)")


if __name__ == "__main__":
    sys.exit(tp.run_file("attnbench-test-plot-patterns-", [test_hand_made, test_layout, test_real]))
