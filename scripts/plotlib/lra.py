"""REPORT.md's "Relative to exact attention (LRA Table 2 layout)" section: for every approximate series, its
speed-up over the run's exact baseline (meta.json `baseline`, the registry's; LRA's vanilla Transformer
attention) and its memory relative to it at each n, with the ratios the Long Range Arena paper published for
the same family beside them.

The paper (Tay et al., "Long Range Arena: A Benchmark for Efficient Transformers", ICLR 2021, Table 2) timed
whole models training on the byte-level text task (batch 32, TPU v3), steps per second at 1K-4K tokens, and
their peak memory in GB. Ours is one attention layer's forward pass on this CPU; only the ratios are
comparable, and only in shape.
"""
import json
import os

from .common import fmt_num, md_table, num

# The paper's figures, keyed by the variant each model maps to: configs/lra_table2.json.
_TABLE2_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "lra_table2.json")


def _load_table2():
    with open(_TABLE2_PATH, encoding="utf-8") as f:
        t = json.load(f)
    models = {v: (m["model"], tuple(m["speedup"]), tuple(m["memory_gb"])) for v, m in t["models"].items()}
    return tuple(t["n"]), tuple(t["transformer_gb"]), models


# variant -> (the model's name in LRA Table 2, speed-up over the Transformer at each LRA_N, peak memory in GB).
LRA_N, LRA_TRANSFORMER_GB, LRA_TABLE2 = _load_table2()


def baseline_of(res):
    """The run's exact baseline (meta.json "baseline", the registry's); None for results written before it."""
    b = res.meta.get("baseline") if isinstance(res.meta, dict) else None
    return b if isinstance(b, str) and b else None


def _paper(variant, n):
    entry = LRA_TABLE2.get(variant)
    if entry is None or n not in LRA_N:
        return None, None
    i = LRA_N.index(n)
    return entry[1][i], entry[2][i] / LRA_TRANSFORMER_GB[i]


def _setting(r):
    return (r.regime, r.batch, r.heads, r.kv_heads, r.head_dim, r.seq_q == r.seq_kv, r.threads, r.dtype, r.bias,
            r.rope, r.isa)


def lra_data(res):
    """The section's numbers, or None when the results have no approximate series measured beside the baseline
    with no mask (or do not name their baseline). {"setting": the shapes, "baseline", "ns": [n], "rows":
    [{"label", "variant", "exact", "model", "cells": {n: {"speed", "memory", "paper_speed", "paper_memory"}}}],
    "order": {"ours": [...], "paper": [...]}}."""
    # The forward pass only (the backward and training-step rows have their own section)
    rows = [r for r in res.ok if r.source == "attnbench" and r.mask == "none" and r.seq_q == r.seq_kv
            and r.pass_ == "forward"]
    baseline = baseline_of(res)
    if baseline is None:
        return None
    base = {}
    for r in rows:
        if r.variant == baseline:
            base.setdefault(_setting(r), {})[r.seq_kv] = r
    if not base:
        return None
    # The setting (shapes, threads, dtype, ...) with the most rows beside a baseline: one table.
    counts = {}
    for r in rows:
        if r.variant != baseline and r.seq_kv in base.get(_setting(r), {}):
            counts[_setting(r)] = counts.get(_setting(r), 0) + 1
    if not counts:
        return None
    setting = max(counts, key=lambda s: (counts[s], str(s)))
    ref = base[setting]
    ns = sorted(ref)
    series = {}
    for r in rows:
        if _setting(r) == setting and r.variant != baseline and r.seq_kv in ref:
            series.setdefault(r.label, []).append(r)
    out = []
    for label in sorted(series, key=lambda s: (series[s][0].exact is False, s)):
        cells = {}
        for r in series[label]:
            b = ref[r.seq_kv]
            speed = b.time_median / r.time_median if r.time_median and b.time_median else None
            mem_r, est_r = r.memory()
            mem_b, est_b = b.memory()
            memory = mem_r / mem_b if mem_r and mem_b else None
            paper_speed, paper_memory = _paper(r.variant, r.seq_kv)
            cells[r.seq_kv] = {"speed": speed, "memory": memory, "memory_estimated": est_r or est_b,
                               "paper_speed": paper_speed, "paper_memory": paper_memory}
        v = series[label][0].variant
        out.append({"label": label, "variant": v, "exact": series[label][0].exact,
                    "model": LRA_TABLE2[v][0] if v in LRA_TABLE2 else None, "cells": cells})
    n_top = max(ns)
    ours = sorted((e for e in out if e["model"] and e["cells"].get(n_top, {}).get("speed")),
                  key=lambda e: -e["cells"][n_top]["speed"])
    paper = sorted((e for e in ours if e["cells"][n_top]["paper_speed"] is not None),
                   key=lambda e: -e["cells"][n_top]["paper_speed"])
    b0 = ref[ns[0]]
    return {"setting": {"batch": b0.batch, "heads": b0.heads, "kv_heads": b0.kv_heads, "head_dim": b0.head_dim,
                        "threads": b0.threads, "dtype": b0.dtype, "regime": b0.regime, "isa": b0.isa},
            "baseline": baseline, "ns": ns, "n_top": n_top, "rows": out,
            "order": {"ours": [e["label"] for e in ours],
                      "paper": [e["label"] for e in paper if e["cells"][n_top]["paper_speed"] is not None]}}


def _cell(value, paper, estimated=False):
    text = fmt_num(num(value), ".2f") + "×" if value is not None else "—"
    if estimated and value is not None:
        text += " (est.)"
    if paper is not None:
        text += f" (paper {paper:.2g}×)"
    return text


def lra_section(res):
    """The markdown section (without its heading), or None when lra_data is None."""
    d = lra_data(res)
    if d is None:
        return None
    ns = d["ns"]
    head = ["variant", "LRA model"] + [f"n={n}" for n in ns]
    speed = [[f"`{e['label']}`" + (" (exact)" if e["exact"] else ""), e["model"] or "—"]
             + [_cell(e["cells"].get(n, {}).get("speed"), e["cells"].get(n, {}).get("paper_speed")) for n in ns]
             for e in d["rows"]]
    memory = [[f"`{e['label']}`" + (" (exact)" if e["exact"] else ""), e["model"] or "—"]
              + [_cell(e["cells"].get(n, {}).get("memory"), e["cells"].get(n, {}).get("paper_memory"),
                       e["cells"].get(n, {}).get("memory_estimated", False)) for n in ns]
              for e in d["rows"]]
    s = d["setting"]
    text = [f"Setting: batch {s['batch']}, {s['heads']} heads ({s['kv_heads']} K/V), head_dim {s['head_dim']}, "
            f"{s['threads']} thread(s), {s['dtype']}, {s['regime']}, mask none, ISA {s['isa']}. Baseline: "
            f"`{d['baseline']}`, the exact quadratic attention (LRA's vanilla Transformer). In brackets: the ratio "
            "the "
            "LRA paper published for the same family (Tay et al. 2021, Table 2: whole models training on TPU "
            "v3, batch 32), where it has one.", "",
            f"**Speed-up over exact attention** (`{d['baseline']}` median time / the variant's; higher is faster):", "",
            md_table(head, speed), "",
            f"**Memory relative to exact attention** (the variant's peak memory / `{d['baseline']}`'s, measured "
            "beyond the inputs: output, workspace and the baseline's score matrix; the paper's is a whole training "
            "step's peak "
            "GB over the Transformer's; lower is smaller):", "",
            md_table(head, memory), ""]
    if d["order"]["ours"] and d["order"]["paper"]:
        ours = " > ".join(f"`{x}`" for x in d["order"]["ours"])
        paper = " > ".join(f"`{x}`" for x in d["order"]["paper"])
        same = d["order"]["ours"] == d["order"]["paper"]
        text += [f"Ordering by speed-up at n={d['n_top']}: here {ours}; in the paper {paper} "
                 f"({'the same order' if same else 'a different order'}). The paper timed a whole model's training "
                 "step on a TPU; this is one forward attention layer on this CPU, against an exact baseline "
                 "that runs as BLAS GEMMs.", ""]
    return "\n".join(text)
