#!/usr/bin/python3
"""One colour and one marker per variant in every figure (scripts/plotlib/styles.py):

- the table: the 13 built-ins' pinned styles are 13 different pairs of clearly different colours (CIELAB ΔE76
  >= 25 between any two) and markers; every variant of a registry of 140 has its own (colour, marker) pair;
  adding a variant to the registry, wherever its name sorts, moves no built-in's style and no variant's before
  it; the peers' styles are no variant's; results without meta.json "registry" keep the built-ins' styles;
- the figures: on synthetic results that draw every figure of plots/ (the 13 built-ins, a plugin variant whose
  name sorts among them, a variant with four series, a second dtype, decode rows, a chunk sweep, bytes for the
  roofline, PyTorch peer rows) every drawn series' artists, read back from matplotlib, have its series' style
  in every figure (the chunk-size figure: its variant's marker), no two variants are drawn alike, and the styles
  do not move when a variant is added to meta.json's registry; the drift figure draws each variant in its style;
- plot.py on those results writes the same SVG bytes twice.

Run by ctest as `/usr/bin/python3 test_plot_styles.py --attnbench PATH` (the path is not used: plot.py reads
files only). Exit 0 pass, 1 fail, 77 skip (numpy or matplotlib missing)."""
import itertools
import json
import os
import sys

import test_plot as tp  # check, run_plot and the failures they record (next to this file)

check = tp.check
sys.path.insert(0, tp.SCRIPTS)
H, D = 8, 64
NS = [256, 512, 1024]
PLUGIN = "mamba_plugin"  # sorts between linformer and naive: a registry in alphabetical order puts it mid-list
MULTI = "gla"  # measured in two forms at two chunks: four series of one variant


def lab(color):
    """CIELAB (D65) of "#rrggbb"."""
    rgb = [int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    m = [[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]
    xyz = [sum(m[i][j] * lin[j] for j in range(3)) / w for i, w in enumerate((0.95047, 1.0, 1.08883))]
    f = [t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116 for t in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def delta_e(a, b):
    return sum((x - y) ** 2 for x, y in zip(lab(a), lab(b))) ** 0.5


def test_table(_tmp):
    from plotlib import styles

    pinned = styles.PINNED
    check(sorted(pinned) == sorted(styles.BUILT_IN) and len(pinned) == 13, "13 built-in variants have pinned styles")
    check(len(set(pinned.values())) == 13 and len({s.color for s in pinned.values()}) == 13,
          "the built-ins' 13 (colour, marker) pairs and 13 colours are all different")
    closest = min((delta_e(a.color, b.color), a.color, b.color)
                  for a, b in itertools.combinations(pinned.values(), 2))
    check(closest[0] >= 25, f"any two built-ins' colours are ΔE76 >= 25 apart (closest {closest[1]} / {closest[2]}: "
                            f"{closest[0]:.1f})")
    base = styles.StyleTable(styles.BUILT_IN)
    check(all(base.of(v) == pinned[v] for v in styles.BUILT_IN), "a table of the built-ins gives their pinned styles")
    many = sorted(styles.BUILT_IN + [f"plugin{i:03d}" for i in range(127)])  # 140 variants in alphabetical order
    table = styles.StyleTable(many)
    check(len({table.of(v) for v in many}) == len(many) and all(table.of(v) == pinned[v] for v in styles.BUILT_IN),
          f"{len(many)} registered variants: each its own (colour, marker) pair, the built-ins their pinned ones")
    for new in ("aardvark", "linear_v2", "mamba", "zeta"):  # before, among and after the built-ins
        reg = sorted(styles.BUILT_IN + [PLUGIN, new])
        before, after = styles.StyleTable(sorted(styles.BUILT_IN + [PLUGIN])), styles.StyleTable(reg)
        moved = [v for v in styles.BUILT_IN + [PLUGIN] if before.of(v) != after.of(v)
                 and (v in styles.BUILT_IN or reg.index(v) < reg.index(new))]
        check(not moved and after.of(new) not in {after.of(v) for v in reg if v != new},
              f"adding '{new}' to the registry moves no built-in's style nor an earlier variant's, and its own "
              f"is new (moved: {moved})")
    peers = styles.StyleTable(styles.BUILT_IN, ["torch_naive", "torch_flash"])
    check({peers.of(p, "peer") for p in ("torch_naive", "torch_flash")}.isdisjoint(table.of(v) for v in many)
          and not {peers.of(p, "peer").marker for p in ("torch_naive", "torch_flash")} & set(styles.MARKERS)
          and len({peers.of(p, "peer") for p in ("torch_naive", "torch_flash")}) == 2,
          "the peers' styles are their own and no variant's (markers no variant has)")
    check(styles.registry_order({}, {"tiled", PLUGIN, "naive"}) == sorted(["tiled", PLUGIN, "naive"])
          and styles.registry_order({"registry": ["tiled", "naive"]}, {PLUGIN, "naive"}) == ["tiled", "naive", PLUGIN],
          "the registry's order: meta.json's list, else the sorted names; names it lacks after it")


def row(variant, n, time_ms, exact, params=None, mask="causal", seq_q=None, dtype="fp32", err=1e-3, state=None,
        kv=None):
    params = params or {}
    seq_q = n if seq_q is None else seq_q
    ptext = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
    flops = 4.0 * H * D * seq_q * n / 2
    nbytes = 4.0 * H * D * (seq_q + 2 * n)
    return {"id": f"{variant}{{{ptext}}}:B=1,H={H},Lq={seq_q},Lkv={n},D={D},{mask},{dtype}", "variant": variant,
            "params": params, "batch": 1, "heads": H, "kv_heads": H, "seq_q": seq_q, "seq_kv": n, "head_dim": D,
            "mask": mask, "regime": "gaussian(std=1)", "threads": 1, "exact": exact, "status": "ok", "reason": "",
            "pass": "forward", "dtype": dtype,
            "time_ms": {"median": time_ms, "p10": time_ms * 0.98, "p90": time_ms * 1.02, "mean": time_ms,
                        "cv": 0.01, "reps": 5},
            "flops": flops, "gflops": flops / (time_ms * 1e6), "frac_sgemm": flops / (time_ms * 1e6) / 100.0,
            "bytes": nbytes,
            "accuracy": {"reference": "sampled", "rows": 32, "max_abs_err": 2 * err, "rel_l2_err": err,
                         "mean_cosine": 1.0, "nan_count": 0, "inf_count": 0},
            "memory": {"estimated_bytes": 4 * H * seq_q * D, "peak_bytes": 8 * H * seq_q * D, "state_bytes": state,
                       "kv_cache_bytes": kv}}


def results_rows():
    """(attnbench rows, peer rows) drawing every figure."""
    from plotlib import styles

    rows, peers = [], []
    for i, v in enumerate(styles.BUILT_IN + [PLUGIN]):
        exact = v in ("naive", "tiled")
        for n in NS:
            t = 1e-6 * n * n * (1 + i / 10) if exact else 1e-3 * n * (1 + i / 10)
            if v == MULTI:
                for form, chunk in itertools.product(("chunk", "recurrent"), (32, 64)):
                    rows.append(row(v, n, t * (1 + chunk / 256) * (2 if form == "recurrent" else 1), False,
                                    {"form": form, "chunk": chunk}))
                continue
            rows.append(row(v, n, t, exact, err=1e-7 if exact else 1e-2))
            if v == "nystrom":  # as a variant that times its phases (dsa does): the phases figure
                rows[-1]["phase_ms"] = {"indexer": 0.3 * t, "selection": 0.1 * t, "attention": 0.5 * t}
            if v == "tiled":  # a second dtype: dtype_vs_fp32
                rows.append(row(v, n, t * 0.7, exact, dtype="bf16", err=1e-3))
        if v in ("naive", "retention"):  # decode: one new token against contexts of 1024 and 2048
            for ctx in (1024, 2048):
                rows.append(row(v, ctx, 1e-5 * ctx if exact else 0.01, exact, mask="causal_lower_right", seq_q=1,
                                state=H * D * D * 4 if not exact else None, kv=2 * H * ctx * D * 4))
    for n in NS:
        p = row("torch_naive", n, 2e-6 * n * n, True, err=1e-7)
        p["id"] = "peer/" + p["id"]
        peers.append(p)
    return rows, peers


def write_results(d, registry):
    rows, peers = results_rows()
    os.makedirs(d, exist_ok=True)
    for name, rs in (("results.jsonl", rows), ("results.peers.jsonl", peers)):
        with open(os.path.join(d, name), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rs))
    # MLA layer rows (results.mla.jsonl) at the decode rows' head count: the mla figure draws the sweep's
    # one-token decode series (naive, retention) beside them, in their styles.
    with open(os.path.join(d, "results.mla.jsonl"), "w") as f:
        for form, ctx in itertools.product(("naive", "absorbed"), (1024, 2048)):
            f.write(json.dumps({"kind": "mla", "form": form, "preset": "p", "batch": 1, "context": ctx,
                                "new_tokens": 1, "threads": 1, "shape": {"heads": H},
                                "median_ms": 1e-5 * ctx * (2 if form == "naive" else 1), "core_median_ms": 1e-5 * ctx,
                                "cache_bytes_per_token": 1000 if form == "naive" else 100}) + "\n")
    meta = {"config_name": "styles", "baseline": "naive", "system": {"cpu_model": "synthetic CPU"},
            "sgemm_calibration": [{"threads": 1, "gflops": 100.0, "size": 2048, "cv": 0.01}],
            "memory_bandwidth": {"1": {"gbytes_per_s": 20.0, "median": 19.0, "buffer_bytes": 1 << 28}}}
    if registry is not None:
        meta["registry"] = registry
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)


def scatter_marker(coll, markers):
    """The marker a scatter collection was drawn with (its path is the marker's), or None."""
    import numpy as np
    from matplotlib.markers import MarkerStyle

    path = coll.get_paths()[0]
    for m in markers:
        ms = MarkerStyle(m)
        ref = ms.get_path().transformed(ms.get_transform())
        if ref.vertices.shape == path.vertices.shape and np.allclose(ref.vertices, path.vertices):
            return m
    return None


def drawn_styles(fig):
    """[(series, kind, colour, marker)] of every artist of fig tagged with the series it draws (figures.tag)."""
    from matplotlib import colors
    from matplotlib.lines import Line2D
    from plotlib import figures, styles

    out = []
    for ax in fig.axes:
        for a in ax.get_children():
            t = getattr(a, figures.SERIES_ATTR, None)
            if t is None:
                continue
            if isinstance(a, Line2D):
                out.append((t[0], t[1], colors.to_hex(a.get_color()), a.get_marker()))
            else:
                out.append((t[0], t[1], colors.to_hex(a.get_facecolor()[0]),
                            scatter_marker(a, styles.MARKERS + styles.PEER_MARKERS)))
    return out


def report_styles(d):
    """{figure stem: drawn_styles} of every figure of the results in d, drawn through plotlib; the results."""
    import matplotlib.pyplot as plt
    from plotlib import figures
    from plotlib.analysis import analyse
    from plotlib.results import Results

    res = Results(d)
    an = analyse(res)
    out = {}
    for stem in figures.FIGURES:
        fig = figures.FIGURE_FUNCTIONS[stem](res, an)
        out[stem] = drawn_styles(fig)
        plt.close(fig)
    return out, res


def test_figures(tmp):
    from plotlib import styles

    reg = sorted(styles.BUILT_IN + [PLUGIN])
    d = os.path.join(tmp, "styles")
    write_results(d, reg)
    drawn, res = report_styles(d)
    empty = [stem for stem, s in drawn.items() if not s]
    check(not empty, f"every figure draws its series through the style table ({', '.join(drawn)}; none: {empty})")
    variant_of = {r.label: r.variant for r in res.rows + res.peer_rows}
    table = styles.results_table(res)
    wanted = styles.series_styles(res)
    wrong, seen = [], {}
    for stem, items in drawn.items():
        for series, kind, color, marker in items:
            if kind == "hue":  # the chunk-size figure: the variant's marker, a shade of its colour per n
                ok = marker == table.of(series).marker
            else:
                ok = (color, marker) == wanted.get(series)
                seen.setdefault(series, set()).add((color, marker))
            if not ok:
                wrong.append(f"{stem}: {series} drawn {color} {marker}")
    check(not wrong, f"every series is drawn in its style in every figure ({wrong[:4]})")
    check(all(len(s) == 1 for s in seen.values()), "a series has one style across the figures of a report")
    multi = sorted(s for s in seen if variant_of.get(s) == MULTI)
    check(len(multi) == 4 and len({next(iter(seen[s])) for s in multi}) == 4
          and {next(iter(seen[s]))[1] for s in multi} == {styles.PINNED[MULTI].marker}
          and next(iter(seen[multi[0]])) == tuple(styles.PINNED[MULTI]),
          f"{MULTI}'s four series: its marker, four shades of its colour, the first its own ({multi})")
    by_variant = {}
    for s, st in seen.items():
        by_variant.setdefault((variant_of.get(s), s.startswith("torch_")), set()).update(st)
    clash = [(a, b) for a, b in itertools.combinations(sorted(by_variant), 2) if by_variant[a] & by_variant[b]]
    check(not clash, f"no two variants (or a variant and a peer) are drawn in the same colour and marker ({clash})")
    check(all(tuple(styles.PINNED[v]) in by_variant.get((v, False), set()) for v in styles.BUILT_IN),
          "each built-in is drawn in its pinned style")
    # A variant registered later: no built-in moves, nor a variant registered before it (the plugin moves when the
    # new one sorts before it: both take the next free pairs in the registry's order); results written before
    # meta.json had "registry": nothing moves.
    def but_plugin(styles_by_stem):
        return {stem: [x for x in items if variant_of.get(x[0], x[0]) != PLUGIN]
                for stem, items in styles_by_stem.items()}
    for what, registry, moves in (("'aardvark' registered (sorting first)", ["aardvark"] + reg, True),
                                  ("'zeta' registered (sorting last)", reg + ["zeta"], False),
                                  ("no registry in meta.json", None, False)):
        d2 = os.path.join(tmp, "styles-" + str(len(os.listdir(tmp))))
        write_results(d2, registry)
        again, _ = report_styles(d2)
        check(but_plugin(again) == but_plugin(drawn) and (moves or again == drawn),
              f"{what}: every figure draws every built-in's series as before"
              + (f" (only {PLUGIN}, registered after it, moves)" if moves else ", and the plugin's"))
    test_drift(reg)


def test_drift(reg):
    import matplotlib.pyplot as plt
    from plotlib import styles
    from plotlib.drift import fig_drift

    doc = {"command": "drift", "layers": 2, "variants": [
        {"name": v, "status": "ok", "baseline": v == "naive",
         "layers": [{"layer": i, "rel_l2": 1e-7 * (i + 1) * (j + 1)} for i in range(3)]} for j, v in enumerate(reg)]}
    for docs in ([("a.json", doc)], [("a.json", doc), ("b.json", doc)]):
        fig = fig_drift(docs)
        table = styles.StyleTable(reg)
        items = drawn_styles(fig)
        plt.close(fig)
        check(len(items) == len(reg) * len(docs) and all((c, m) == table.of(s) for s, _, c, m in items),
              f"the drift figure ({len(docs)} document(s)) draws each variant in its style")


def test_svg_stable(tmp):
    from plotlib import styles

    d = os.path.join(tmp, "stable")
    write_results(d, sorted(styles.BUILT_IN + [PLUGIN]))
    svgs = []
    for out in ("a", "b"):
        r = tp.run_plot(d, "--out", os.path.join(tmp, "stable-" + out))
        if not check(r.returncode == 0, f"plot.py on the styles results exits 0 (rc {r.returncode}: "
                                        f"{r.stderr.strip()[-300:]})"):
            return
        plots = os.path.join(tmp, "stable-" + out, "plots")
        svgs.append({n: open(os.path.join(plots, n), "rb").read() for n in sorted(os.listdir(plots))
                     if n.endswith(".svg")})
    check(len(svgs[0]) >= 9 and svgs[0] == svgs[1], f"two runs write the same SVG bytes ({len(svgs[0])} SVGs)")


if __name__ == "__main__":
    sys.exit(tp.run_file("attnbench-test-plot-styles-", [test_table, test_figures, test_svg_stable]))
