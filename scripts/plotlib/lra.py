"""REPORT.md's "Relative to exact attention (LRA Table 2 layout)" section: for every approximate series, its
speed-up over the exact baseline (`naive`: LRA's vanilla Transformer attention) and its memory relative to it
at each n, with the ratios the Long Range Arena paper published for the same family beside them.

The paper (Tay et al., "Long Range Arena: A Benchmark for Efficient Transformers", ICLR 2021, Table 2) timed
whole models training on the byte-level text task (batch 32, TPU v3), steps per second at 1K-4K tokens, and
their peak memory in GB. Ours is one attention layer's forward pass on this CPU; only the ratios are
comparable, and only in shape.
"""
from .common import fmt_num, num

BASELINE = "naive"

# variant -> (the model's name in LRA Table 2, speed-up over the Transformer at 1K, 2K, 3K, 4K, peak memory in
# GB at 1K, 2K, 3K, 4K). The Transformer's own memory: 0.85, 2.65, 5.51, 9.48 GB. The 4K speed-ups of Local
# Attention, Linear Transformer, Performer and Linformer and the Transformer's 9.48 GB are the figures quoted
# in ../shared/ANCHORS.md; the rest were transcribed from the same table.
LRA_N = (1024, 2048, 3072, 4096)
LRA_TRANSFORMER_GB = (0.85, 2.65, 5.51, 9.48)
LRA_TABLE2 = {
    "sliding_window": ("Local Attention", (1.1, 1.7, 3.2, 5.3), (0.42, 0.76, 1.06, 1.37)),
    "linear": ("Linear Trans.", (1.1, 1.9, 3.7, 5.6), (0.37, 0.59, 0.82, 1.06)),
    "performer": ("Performer", (1.2, 1.9, 3.8, 5.7), (0.37, 0.59, 0.82, 1.06)),
    "linformer": ("Linformer", (1.2, 1.9, 3.7, 5.5), (0.37, 0.55, 0.99, 0.99)),
    "bigbird": ("BigBird", (0.9, 0.8, 1.2, 1.1), (0.77, 1.49, 2.18, 2.88)),
}


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
    """The section's numbers, or None when the results have no approximate series measured beside `naive` with
    no mask. {"setting": the shapes, "ns": [n], "rows": [{"label", "variant", "exact", "model", "cells":
    {n: {"speed", "memory", "paper_speed", "paper_memory"}}}], "order": {"ours": [...], "paper": [...]}}."""
    # The forward pass only (the backward and training-step rows of #27 have their own section)
    rows = [r for r in res.ok if r.source == "attnbench" and r.mask == "none" and r.seq_q == r.seq_kv
            and r.pass_ == "forward"]
    base = {}
    for r in rows:
        if r.variant == BASELINE:
            base.setdefault(_setting(r), {})[r.seq_kv] = r
    if not base:
        return None
    # The setting (shapes, threads, dtype, ...) with the most rows beside a baseline: one table.
    counts = {}
    for r in rows:
        if r.variant != BASELINE and r.seq_kv in base.get(_setting(r), {}):
            counts[_setting(r)] = counts.get(_setting(r), 0) + 1
    if not counts:
        return None
    setting = max(counts, key=lambda s: (counts[s], str(s)))
    ref = base[setting]
    ns = sorted(ref)
    series = {}
    for r in rows:
        if _setting(r) == setting and r.variant != BASELINE and r.seq_kv in ref:
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
            "ns": ns, "n_top": n_top, "rows": out,
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
    from .report import md_table  # report imports this module; md_table is defined before the import runs
    text = [f"Setting: batch {s['batch']}, {s['heads']} heads ({s['kv_heads']} K/V), head_dim {s['head_dim']}, "
            f"{s['threads']} thread(s), {s['dtype']}, {s['regime']}, mask none, ISA {s['isa']}. Baseline: "
            f"`{BASELINE}`, the exact quadratic attention (LRA's vanilla Transformer). In brackets: the ratio the "
            "LRA paper published for the same family (Tay et al. 2021, Table 2: whole models training on TPU "
            "v3, batch 32), where it has one.", "",
            "**Speed-up over exact attention** (`naive` median time / the variant's; higher is faster):", "",
            md_table(head, speed), "",
            "**Memory relative to exact attention** (the variant's peak memory / `naive`'s, measured beyond the "
            "inputs: output, workspace and `naive`'s score matrix; the paper's is a whole training step's peak "
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
