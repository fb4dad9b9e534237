"""A quality results folder (scripts/quality, bench/quality): the figures and the REPORT.md with its "What it can
learn" section, beside the published numbers of configs/quality_published.json.

    analyse(rows, meta, speed)  -> the numbers (summary.json): per (task, size, variant) the seeds' outcomes
    figures                     -> plots/quality_capacity, quality_mqar[, quality_mqar_kv], quality_vs_time
    report                      -> REPORT.md

The capacity task is judged by the lowest evaluation loss of each run (Schlag's early stopping keeps the
best), MQAR by the highest test accuracy, taking the best learning rate per seed as Zoology's figures do; the
spread is over seeds (min to max). A point's time is a training step's median (time_ms.median) unless a speed
sweep's folder (plot.py --speed DIR, or the config's speed_results) has the variant at the task's length.
"""
import json
import math
import os
import statistics

from .common import InputError, atomic_write_text, fmt_num, md_table
from .results import read_jsonl

TOOL = "attnbench quality"
PUBLISHED_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs",
                              "quality_published.json")
CHANCE_LOSS = 0.5  # Schlag's loss when nothing is retrieved


def is_quality_folder(results_dir):
    meta = os.path.join(results_dir, "meta.json")
    if not os.path.isfile(meta):
        return False
    try:
        with open(meta, encoding="utf-8") as f:
            return json.load(f).get("tool") == TOOL
    except (OSError, ValueError):
        return False


def label_of(row):
    """The variant with the parameters the config gave it, as the point id spells it ("sliding_window{window=32}")."""
    parts = row["id"].split(":")
    return parts[1] if len(parts) >= 3 else row["variant"]


def _spread(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    return {"median": statistics.median(values), "mean": statistics.fmean(values), "min": min(values),
            "max": max(values), "seeds": len(values)}


def _group(rows, key):
    out = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def analyse_capacity(rows):
    """[{setting, n, d, lr, label, variant, loss: spread of best_loss, accuracy, converged, seeds, steps}]."""
    ok = [r for r in rows if r["task"]["name"] == "capacity" and r["status"] == "ok"]
    key = lambda r: (r["task"]["setting"], r["task"]["size"], r["task"]["d_model"], r["task"]["lr"], label_of(r),
                     r["variant"])
    out = []
    for (setting, n, d, lr, label, variant), group in sorted(_group(ok, key).items()):
        out.append({"setting": setting, "n": n, "d": d, "lr": lr, "label": label, "variant": variant,
                    "loss": _spread([r["task"]["best_loss"] for r in group]),
                    "accuracy": _spread([r["task"]["best_accuracy"] for r in group]),
                    "converged": sum(r["task"]["converged"] for r in group), "runs": len(group),
                    "steps": statistics.median(r["task"]["steps"] for r in group),
                    "step_ms": statistics.median(r["time_ms"]["median"] for r in group)})
    return out


def analyse_mqar(rows):
    """[{seq_len, kv, vocab, d_model, label, variant, conv, accuracy: spread over seeds of the best over the
    learning rates, lrs, best_lr (the most frequent), steps, step_ms}]."""
    ok = [r for r in rows if r["task"]["name"] == "mqar" and r["status"] == "ok"]
    key = lambda r: (r["task"]["seq_len"], r["task"]["size"], r["task"]["vocab"], r["task"]["d_model"], label_of(r),
                     r["variant"], r["task"]["short_conv"])
    out = []
    for (seq_len, kv, vocab, d_model, label, variant, conv), group in sorted(_group(ok, key).items()):
        per_seed = {}
        for r in group:  # the best learning rate of each seed, as Zoology's figures take the best of its sweep
            best = per_seed.get(r["task"]["seed"])
            if best is None or r["task"]["best_accuracy"] > best["task"]["best_accuracy"]:
                per_seed[r["task"]["seed"]] = r
        chosen = list(per_seed.values())
        lrs = [r["task"]["lr"] for r in chosen]
        out.append({"seq_len": seq_len, "kv": kv, "vocab": vocab, "d_model": d_model, "label": label,
                    "variant": variant, "conv": conv,
                    "accuracy": _spread([r["task"]["best_accuracy"] for r in chosen]),
                    "converged": sum(r["task"]["converged"] for r in chosen), "runs": len(chosen),
                    "lrs": sorted({r["task"]["lr"] for r in group}), "best_lr": max(set(lrs), key=lrs.count),
                    "steps": statistics.median(r["task"]["steps"] for r in chosen),
                    "step_ms": statistics.median(r["time_ms"]["median"] for r in chosen)})
    return out


def speed_times(speed_dir):
    """{(variant, seq_len): (median ms, pass, the row's id)} from a speed sweep's rows: at each length the
    training step (forward_backward) where measured, else the forward; causal rows preferred (the tasks'
    models are causal or read one query)."""
    if not speed_dir:
        return {}
    path = os.path.join(speed_dir, "results.jsonl")
    if not os.path.isfile(path):
        raise InputError(f"--speed '{speed_dir}': no results.jsonl (give a folder written by `attnbench run`)")
    rank = {"forward_backward": 0, "forward": 1, "backward": 2}
    best = {}
    for r in read_jsonl(path):
        if r.get("status") != "ok" or r.get("seq_q") != r.get("seq_kv") or not (r.get("time_ms") or {}).get("median"):
            continue
        score = (rank.get(r.get("pass", "forward"), 3), 0 if str(r.get("mask", "")).startswith("causal") else 1)
        key = (r["variant"], r["seq_kv"])
        if key not in best or score < best[key][0]:
            best[key] = (score, (r["time_ms"]["median"], r.get("pass", "forward"), r["id"]))
    return {k: v[1] for k, v in best.items()}


def time_points(rows, speed):
    """Per (task, length) panel: [{label, conv, accuracy, ms}] and where the times come from."""
    panels = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        t = r["task"]
        panel = (t["name"], t["seq_len"])
        panels.setdefault(panel, []).append(r)
    out = []
    for (task, length), group in sorted(panels.items()):
        from_speed = all((r["variant"], length) in speed for r in group)
        series = _group(group, lambda r: (label_of(r), r["task"]["short_conv"]))
        points = []
        for (label, conv), rs in sorted(series.items()):
            ms = speed[(rs[0]["variant"], length)][0] if from_speed else statistics.median(
                r["time_ms"]["median"] for r in rs)
            points.append({"label": label, "variant": rs[0]["variant"], "conv": conv, "ms": ms,
                           "accuracy": _spread([r["task"]["best_accuracy"] for r in rs])})
        out.append({"task": task, "seq_len": length, "points": points,
                    "time_source": "speed sweep (median ms per call at this length)" if from_speed
                    else "training step (median ms, whole model)"})
    return out


def load_published():
    with open(PUBLISHED_PATH, encoding="utf-8") as f:
        return json.load(f)


def analyse(results_dir, speed_dir=None):
    meta_path = os.path.join(results_dir, "meta.json")
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    jsonl = os.path.join(results_dir, "results.jsonl")
    if not os.path.isfile(jsonl):
        raise InputError(f"'{results_dir}' holds no results.jsonl (run scripts/quality first)")
    rows = [r for r in read_jsonl(jsonl) if isinstance(r.get("task"), dict)]
    if not rows:
        raise InputError(f"{jsonl}: no quality rows (rows with a task block)")
    speed_dir = speed_dir or meta.get("speed_results")
    speed = speed_times(speed_dir) if speed_dir and os.path.isdir(speed_dir) else {}
    return {"meta": meta, "rows": rows, "capacity": analyse_capacity(rows), "mqar": analyse_mqar(rows),
            "vs_time": time_points(rows, speed), "speed_results": speed_dir if speed else None,
            "published": load_published(),
            "not_trained": [{"id": r["id"], "status": r["status"], "reason": r["reason"]}
                            for r in rows if r["status"] != "ok"]}


def plot_quality(results_dir, out_dir, speed_dir=None):
    """plot.py's entry for a quality folder: figures, REPORT.md, summary.json; prints what it wrote."""
    an = analyse(results_dir, speed_dir)
    plots = os.path.join(out_dir, "plots")
    os.makedirs(plots, exist_ok=True)
    written = draw(an, plots)
    files = [os.path.relpath(p, out_dir) for p in written]
    report = os.path.join(out_dir, "REPORT.md")
    atomic_write_text(report, report_text(an, files))
    summary = {k: v for k, v in an.items() if k not in ("rows", "published", "meta")}
    atomic_write_text(os.path.join(out_dir, "summary.json"),
                      json.dumps(dict(summary, files=files + ["REPORT.md"]), indent=2, default=str) + "\n")
    for p in written:
        print(p)
    print(report)
    return 0


# ---- Figures (matplotlib, imported here only) ----

MARKERS = "osD^v<>ph*"


def _styles(an):
    """A colour per variant (its place in the registry, as meta.json lists it) and a marker per label."""
    import matplotlib.pyplot as plt

    palette = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("Dark2").colors)
    registry = an["meta"].get("registry") or []
    colours, markers = {}, {}
    labels = sorted({label_of(r) for r in an["rows"]})
    for r in an["rows"]:
        v = r["variant"]
        colours.setdefault(v, palette[(registry.index(v) if v in registry else len(colours)) % len(palette)])
    for v in colours:
        for i, label in enumerate(lb for lb in labels if lb.split("{")[0] == v):
            markers[label] = MARKERS[i % len(MARKERS)]
    return colours, markers


def _errorbar(ax, xs, spreads, colour, marker, label, linestyle="-"):
    pts = [(x, s) for x, s in zip(xs, spreads) if s is not None]
    if not pts:
        return
    x = [p[0] for p in pts]
    med = [p[1]["median"] for p in pts]
    yerr = [[m - p[1]["min"] for m, p in zip(med, pts)], [p[1]["max"] - m for m, p in zip(med, pts)]]
    ax.errorbar(x, med, yerr=yerr, color=colour, marker=marker, linestyle=linestyle, label=label, capsize=2,
                markersize=4, linewidth=1.2)


def fig_capacity(an, plt):
    colours, markers = _styles(an)
    settings = sorted({c["setting"] for c in an["capacity"]})
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.2), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        cs = [c for c in an["capacity"] if c["setting"] == setting]
        for (label, variant, d, lr), group in sorted(_group(cs, lambda c: (c["label"], c["variant"], c["d"],
                                                                              c["lr"])).items()):
            group.sort(key=lambda c: c["n"])
            extra = "" if len({(c["d"], c["lr"]) for c in cs}) == 1 else f" d={d} lr={lr:g}"
            _errorbar(ax, [c["n"] for c in group], [c["loss"] for c in group], colours[variant], markers[label],
                      label + extra)
        for curve in an["published"]["capacity"]["curves"]:
            present = [v for v in curve["variants"] if v in colours]
            if curve["setting"] != setting or not present:
                continue
            xs, ys = [], []
            for p in curve["points"]:
                xs += [p["n"], p.get("n_to", p["n"])] if "n_to" in p else [p["n"]]
                ys += [p.get("loss", p.get("loss_at_most"))] * (2 if "n_to" in p else 1)
            ax.plot(xs, ys, color=colours[present[0]], linestyle=":", linewidth=1.5, alpha=0.8,
                    label=f"published: {curve['model']}")
        ax.axhline(1e-3, color="grey", linewidth=0.8, linestyle="--")
        ax.axhline(CHANCE_LOSS, color="grey", linewidth=0.8, linestyle="-.")
        ax.text(ax.get_xlim()[0], 1e-3, " stop loss 1e-3", va="bottom", fontsize=7, color="grey")
        ax.text(ax.get_xlim()[0], CHANCE_LOSS, " nothing retrieved (0.5)", va="bottom", fontsize=7, color="grey")
        ax.set_yscale("log")
        ax.set_xlabel("N (key-value pairs)")
        ax.set_ylabel("lowest evaluation loss")
        ax.set_title(f"capacity, setting {setting} ({'N distinct keys' if setting == 1 else '2N keys, overwrite'})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    fig.suptitle(f"Associative-retrieval capacity (Schlag et al. 2021) on {_cpu(an)}")
    return fig


def _cpu(an):
    return (an["meta"].get("system") or {}).get("cpu_model") or "unknown CPU"


def fig_mqar(an, plt, x_key, panel_keys, title):
    """Accuracy against x_key (d_model, or kv) with one panel per value of panel_keys: Zoology's Figure 2."""
    colours, markers = _styles(an)
    panels = sorted({tuple(m[k] for k in panel_keys) for m in an["mqar"]})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels):
        ms = [m for m in an["mqar"] if tuple(m[k] for k in panel_keys) == panel]
        for (label, variant, conv), group in sorted(_group(ms, lambda m: (m["label"], m["variant"], m["conv"])).items()):
            group.sort(key=lambda m: m[x_key])
            _errorbar(ax, [m[x_key] for m in group], [m["accuracy"] for m in group], colours[variant],
                      markers[label], label + (" + conv" if conv else ""), "-" if conv else "--")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel({"d_model": "model dimension", "kv": "kv pairs"}[x_key])
        ax.set_title(", ".join(f"{k}={v}" for k, v in zip(panel_keys, panel)), fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy (best lr)")
    axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.suptitle(f"{title} on {_cpu(an)}; dashed: without the short convolution")
    return fig


def fig_vs_time(an, plt):
    colours, markers = _styles(an)
    panels = an["vs_time"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for p in panel["points"]:
            s = p["accuracy"]
            if s is None:
                continue
            ax.errorbar([p["ms"]], [s["median"]], yerr=[[s["median"] - s["min"]], [s["max"] - s["median"]]],
                        color=colours[p["variant"]], marker=markers[p["label"]], linestyle="none", capsize=2,
                        markerfacecolor=colours[p["variant"]] if p["conv"] else "none",
                        label=p["label"] + (" + conv" if p["conv"] else ""))
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("ms: " + panel["time_source"])
        ax.set_title(f"{panel['task']}, {panel['seq_len']} tokens", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="best")
    axes[0][0].set_ylabel("task accuracy (best evaluation)")
    fig.suptitle(f"What each variant learns against what it costs, on {_cpu(an)}")
    return fig


def draw(an, plots):
    """The figures the analysis has data for, as plots/<stem>.png and .svg; returns the paths written."""
    from . import figures

    plt = figures.plt
    written = []
    if an["capacity"]:
        written += figures.save_figure(fig_capacity(an, plt), plots, "quality_capacity")
    if an["mqar"]:
        fig = fig_mqar(an, plt, "d_model", ("seq_len", "kv"), "MQAR accuracy against model dimension (Zoology Fig. 2)")
        written += figures.save_figure(fig, plots, "quality_mqar")
        if any(len(set(m["kv"] for m in ms)) > 1
               for ms in _group(an["mqar"], lambda m: (m["seq_len"], m["d_model"])).values()):
            fig = fig_mqar(an, plt, "kv", ("seq_len", "d_model"), "MQAR accuracy against kv pairs")
            written += figures.save_figure(fig, plots, "quality_mqar_kv")
    if an["vs_time"]:
        written += figures.save_figure(fig_vs_time(an, plt), plots, "quality_vs_time")
    return written


# ---- REPORT.md ----

def _spread_text(s, spec=".3g"):
    if s is None:
        return "—"
    text = fmt_num(s["median"], spec)
    if s["seeds"] > 1:
        text += f" ({fmt_num(s['min'], spec)}–{fmt_num(s['max'], spec)}, {s['seeds']} seeds)"
    return text


def _published_capacity(published, variant, setting, n):
    for curve in published["capacity"]["curves"]:
        if variant not in curve["variants"] or curve["setting"] != setting:
            continue
        for p in curve["points"]:
            if "loss_at_most" in p and p["n"] <= n <= p["n_to"]:
                return f"≤ {fmt_num(p['loss_at_most'])} ({curve['model']})"
            if p.get("n") == n and "loss" in p:
                return f"{fmt_num(p['loss'])} ({curve['model']})"
            if "and" in p.get("note", "") and n > p["n"] and "loss" in p:
                return f"{fmt_num(p['loss'])} ({curve['model']}, {p['note']})"
    return "—"


def _published_mqar(published, variant, seq_len, kv, d_model):
    for e in published["mqar"]["entries"]:
        if variant in e["variants"] and [seq_len, kv] in e["sizes"] and d_model in e["d_model"]:
            lo, hi = e["accuracy_from"], e["accuracy_to"]
            return (f"{lo:g}–{hi:g}" if lo != hi else f"{lo:g}") + f" ({e['model']})"
    return "—"


def capacity_section(an):
    pub = an["published"]
    out = ["### Associative-retrieval capacity (Schlag, Irie & Schmidhuber 2021)", "",
           "The lowest evaluation loss of each run, 0.5·‖onehot(v) − y‖² (0.5: nothing retrieved), median over "
           "the seeds with their range; converged: runs that reached the stop loss. Published: "
           + pub["capacity"]["source"] + ".", ""]
    table = []
    for c in an["capacity"]:
        table.append([f"`{c['label']}`", c["setting"], c["n"], c["d"], fmt_num(c["lr"]), _spread_text(c["loss"]),
                      f"{c['converged']}/{c['runs']}", fmt_num(c["steps"], ".0f"),
                      _spread_text(c["accuracy"], ".3f"), _published_capacity(pub, c["variant"], c["setting"], c["n"])])
    out.append(md_table(["variant", "setting", "N", "d", "lr", "best loss", "converged", "steps (median)",
                         "accuracy", "published loss"], table))
    out += ["", "Largest N at which every run reached its stop loss, per variant and setting:", ""]
    for (setting, label), cs in sorted(_group(an["capacity"], lambda c: (c["setting"], c["label"])).items()):
        held = [c["n"] for c in cs if c["converged"] == c["runs"]]
        failed = [c["n"] for c in cs if c["converged"] < c["runs"]]
        out.append(f"- setting {setting}, `{label}`: " + (f"up to N = {max(held)}" if held else "at no N")
                   + (f"; not at N = {', '.join(map(str, failed))}" if failed else ""))
    return out


def mqar_section(an):
    pub = an["published"]
    out = ["### MQAR (Arora et al. 2023, Zoology)", "",
           "Test accuracy at the query positions: per seed the best over the learning rates (as Zoology's figures "
           "take the best of their sweep), median over the seeds with their range. Published: "
           + pub["mqar"]["source"] + ".", ""]
    table = []
    for m in an["mqar"]:
        table.append([f"`{m['label']}`", "on" if m["conv"] else "off", m["seq_len"], m["kv"], m["vocab"], m["d_model"],
                      _spread_text(m["accuracy"], ".3f"), f"{m['converged']}/{m['runs']}", fmt_num(m["best_lr"]),
                      fmt_num(m["steps"], ".0f"), fmt_num(m["step_ms"], ".1f"),
                      _published_mqar(pub, m["variant"], m["seq_len"], m["kv"], m["d_model"])])
    out.append(md_table(["variant", "short conv", "L", "kv", "vocab", "d_model", "accuracy", "> stop", "lr",
                         "steps", "ms / step", "published"], table))
    out += ["", "Ordering by median accuracy (best first):", ""]
    for key, ms in sorted(_group(an["mqar"], lambda m: (m["seq_len"], m["kv"], m["d_model"], m["conv"])).items()):
        ranked = sorted(ms, key=lambda m: -(m["accuracy"]["median"] if m["accuracy"] else -1))
        out.append(f"- L = {key[0]}, kv = {key[1]}, d_model = {key[2]}, short conv {'on' if key[3] else 'off'}: "
                   + " > ".join(f"`{m['label']}` {_spread_text(m['accuracy'], '.3f')}" for m in ranked))
    return out


def report_text(an, files):
    meta = an["meta"]
    system = meta.get("system") or {}
    lines = [f"# Task quality: {meta.get('config_name', '')}", ""]
    if meta.get("description"):
        lines += [meta["description"], ""]
    lines += [md_table(["", ""], [
        ["CPU", system.get("cpu_model", "—")], ["threads", meta.get("threads", "—")],
        ["commit", system.get("git_commit", "—")],
        ["torch", (meta.get("python") or {}).get("torch", "—")],
        ["run", f"{meta.get('start_time')} … {meta.get('end_time') or 'not finished'}"
         + (" (interrupted: `scripts/quality CONFIG --resume` finishes it)" if meta.get("interrupted") else "")],
    ]), "", "## What it can learn", "",
        "Small models trained through attnbench's own fp32 kernels (attnbench.autograd); everything else is "
        "torch's (bench/quality/README.md).", ""]
    if an["capacity"]:
        lines += capacity_section(an) + [""]
    if an["mqar"]:
        lines += mqar_section(an) + [""]
    deviations = list(meta.get("deviations") or []) + list(meta.get("model_notes") or [])
    if deviations:
        lines += ["### Where this run departs from the papers", ""] + [f"- {d}" for d in deviations] + [""]
    if an["not_trained"]:
        lines += ["### Not trained", "", md_table(["point", "status", "reason"],
                                                  [[f"`{n['id']}`", n["status"], n["reason"]] for n in an["not_trained"]]),
                  ""]
    lines += ["## Figures", ""]
    for f in files:
        if f.endswith(".png"):
            lines += [f"![{os.path.basename(f)[:-4]}]({f})", ""]
    for panel in an["vs_time"]:
        lines.append(f"- quality_vs_time, {panel['task']} at {panel['seq_len']} tokens: time from the "
                     f"{panel['time_source']}")
    return "\n".join(lines) + "\n"
