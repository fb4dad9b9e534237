"""REPORT.md: the key figures and ratios, crossover, training (when the results time backward passes), decode
(when they have decode rows), phases (when rows time their phases: dsa), chunk size (when a variant was measured at several chunks), accuracy by dtype (with
its speed-up and error figure when the results have several dtypes), accuracy against each reference (when rows
have accuracy_vs_softmax), roofline and left-out tables, the measurement conditions,
the machine and the config, from the Results and the analysis (analysis.analyse) alone, plus a section
embedding each figure file that was written. Nothing here draws or imports matplotlib, and nothing depends on
whether (or in which order) the figures were drawn: with no figure files the report has every table and no
figure sections.
"""
import json
import os

from . import patterns
from .lra import lra_section
from .mla import mla_section
from .common import (CHUNK_SIZE, DECODE, DTYPE_VS_FP32, FIGURES, PATTERNS, PHASES, ROOFLINE, SECTION_FIGURES,
                     atomic_write_text, fmt_bytes, fmt_num, md_table, num)
from .results import pass_title

TITLES = {"time_vs_seq": "Time vs sequence length", "memory_vs_seq": "Peak memory vs sequence length",
          "accuracy_vs_seq": "Accuracy vs sequence length", "pareto": "Speed–accuracy trade-off",
          "throughput": "Throughput vs sgemm", "roofline": "Roofline", "decode": "Decode", "phases": "Phases",
          "mla": "Multi-head latent attention",
          "chunk_size": "Chunk size", "dtype_vs_fp32": "Speed-up and error by dtype"}
BLURBS = {
    "mla": "Per MLA preset (a row each): left, one decode step's time against the context: the whole layer call of "
           "each form (solid: naive, dashed: absorbed, from results.mla.jsonl) and its core attention alone (thin, "
           "dotted), with the sweep's one-token decode rows of the same head count (core attention only, in their "
           "series' styles); right, one call's time against the new tokens it brings at a fixed context (prefill "
           "in pieces), both forms: where the lines cross the naive form becomes the faster one.",
    "time_vs_seq": "Median time of one forward call; bars span p10–p90. The legend gives the exponent k of a "
                   "least-squares fit of log(time) on log(n) over the series' measured sizes (range in "
                   "brackets): exact attention's quadratic cost shows as k ≈ 2 once n is large enough for "
                   "the n² terms to dominate. Dotted grey guides have slopes 1 and 2. Solid: exact; "
                   "dashed: approximate; dotted: PyTorch peer. Each variant has one colour and one marker in "
                   "every figure (its series, such as other parameters or dtypes, in shades of that colour); "
                   "the PyTorch peer is black.",
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
    "roofline": "One point per measured row: its arithmetic intensity (the variant's FLOP count over the bytes "
                "it must move, `bytes_moved`) against its GFLOP/s, on log axes. The ceilings come from the same "
                "run: the sgemm calibration (dash-dot, horizontal) and the streaming-read memory bandwidth × "
                "intensity (dashed diagonal); the dotted vertical line is the ridge where they meet. Left of it "
                "a kernel is memory-bound (decode, small seq_q), right of it compute-bound. Colour and marker: "
                "the series, as in every figure; filled, hollow or half filled: the pass and kv_heads, where "
                "they vary.",
    "decode": "Left: the median time of one decode call divided by its new tokens (seq_q) against the context "
              "seq_kv, on log axes (solid: exact; dashed: the others). Right: what each series keeps between "
              "decode steps at that context (`memory.state_bytes`: a recurrence's d_k × d_v state per (batch, "
              "head), sliding_window's rolling cache, the KV cache for the other variants) and, black dashed, the "
              "KV cache exact attention keeps at the same context (`memory.kv_cache_bytes`): the KV cache grows "
              "with the context, a recurrence's state does not.",
    "phases": "Per series that times its phases (dsa: the lightning indexer, the top-k selection, the attention over "
              "the selected keys) and setting: each phase's median time stacked against the context seq_kv (log "
              "axis for the context; bands in the series' colour, one hatching per phase), the call's median time "
              "(the series' line) and the fastest exact attnbench row's at the same point (dashed, in its style). Where the stack passes the dashed line the sparse "
              "variant stops paying off; where the indexer's band passes the attention's, the O(n) scoring "
              "dominates the O(topk) attention.",
    "chunk_size": "Per variant (and setting): its median time (left, log) and GFLOP/s (right) against the chunk "
                  "size, one line per n (the variant's marker, in shades of its colour from light at the smallest n "
                  "to dark at the largest) and per family of series that differ only in the chunk (line style); "
                  "the star marks the fastest chunk at each n.",
    "dtype_vs_fp32": "Per series stored in a 16-bit dtype (its label names the dtype, and the parameters that vary, "
                     "such as `bf16_kernel`), one row of panels per mask and setting. Left: its speed-up over the "
                     "same variant's fp32 row at the same point (same parameters, shape, mask, inputs, bias, "
                     "threads and target), time_fp32 ÷ time against n, above the dashed 1× line where it is "
                     "faster; the median of the per-round ratios with its 95% interval as bars where both rows were "
                     "timed in one interleaved group, else the ratio of the medians (the table's *time vs fp32* is "
                     "the inverse, median over the points); hollow markers: the row or its fp32 row noisy. Right: "
                     "its `accuracy.max_abs_err` (kernel, against fp64 attention on the inputs it read, solid) and "
                     "`accuracy_e2e.max_abs_err` (end to end, against fp64 on the fp32 inputs, dashed) against n, "
                     "with the fp32 row's error dotted in the fp32 series' colour: the floor of fp32 rounding alone. "
                     "A series has one colour in both panels; the legend is beside the right one.",
}


def _where(entry):
    return entry["mask"] + (f"; {entry['context']}" if entry["context"] else "")


PASS_BLURBS = {
    "time_vs_seq": " Columns: the forward (inference), the backward alone (dQ, dK, dV from the state an untimed "
                   "training forward left) and the whole training step (forward + backward), on one time axis per "
                   "row; the last column is each variant's backward time over its forward time (solid) and the "
                   "training step's over the forward's (dashed) at the same point, with the FLOP ratio of the "
                   "backward (dotted grey) for reference.",
    "memory_vs_seq": " One column per pass, sharing the memory axis: the backward's peak is measured from the "
                     "state the training forward left (dQ, dK, dV and its workspace), the training step's from "
                     "before its forward.",
    "accuracy_vs_seq": " One column per pass: the forward's output error, and for the backward and the training "
                       "step the gradient's: the worst rel_l2_err of dQ, dK and dV against exact softmax "
                       "attention's fp64 gradient.",
    "pareto": " One column per pass, each against the fastest exact variant in the same pass; the backward's and "
              "the training step's error is the gradient's (worst of dQ, dK, dV).",
    "throughput": " One column per pass, each with its own FLOP count (the backward 2.5× the forward's).",
}


OWN_REFERENCE = (" For a variant that is not softmax attention (see Accuracy against each reference), "
                 "`accuracy` and so the error drawn here is against its own fp64 definition.")


def figure_blurb(stem, an, res):
    """A figure's caption; with several passes how its columns split them, with one pass other than the
    forward what its rows time."""
    text = time_blurb(an) if stem == "time_vs_seq" else BLURBS[stem]
    if stem == "accuracy_vs_seq" and any(e["reference"] == "own_definition" for e in an.get("accuracy_references") or []):
        text += OWN_REFERENCE
    if res.by_pass():
        return text + PASS_BLURBS.get(stem, "")
    if res.passes != ["forward"] and stem in PASS_BLURBS:
        text = text.replace("one forward call", "one call")
        return text + (f" The rows time the {' and the '.join(pass_title(p) for p in res.passes)}: times, FLOPs and "
                       "memory are that pass's, and the error is the gradient's (the worst rel_l2_err of dQ, dK, dV "
                       "against exact softmax attention's fp64 gradient).")
    return text


def time_blurb(an):
    """The time figure's caption: which bars it draws (the 95% interval of the median where the rows have one)
    and the hollow markers of noisy rows."""
    m = an["measurement"]
    bars = {"ci95": "bars span the 95% confidence interval of the median (distribution-free, from the order "
                    "statistics of the repetitions)",
            "mixed": "bars span the 95% confidence interval of the median where the row has one (6 or more "
                     "repetitions), p10–p90 where it has not"}.get(m["error_bars"], "bars span p10–p90")
    text = BLURBS["time_vs_seq"].replace("bars span p10–p90", bars)
    if m["noisy"]:
        text += (f" Hollow markers: the {m['noisy']} noisy row(s), whose interference score stayed above "
                 f"measure.max_interference ({m['max_interference']:g}) on every attempt.")
    return text


def key_figures(an):
    fits = {(f["series"], f["mask"], f["context"]): f for f in an["fits"]}
    table = []
    for e in an["key_figures"]:
        f = fits.get((e["series"], e["mask"], e["context"]), {})
        k = f.get("exponent")
        table.append([
            f"`{e['series']}`" + (" (PyTorch)" if e["source"] == "peer" else ""),
            e["params"].replace(",", ", ") or "—",
            _where(e),
            "yes" if e["exact"] else "no",
            f"{k:.2f} (n={f['n_min']}–{f['n_max']})" if k is not None else "—",
            f"{fmt_num(f.get('tail_exponent'), '.2f')}",
            e["max_n"],
            fmt_num(num(e["time_ms"]), ".4g") + (" (noisy)" if e.get("noisy") else ""),
            fmt_num(num(e["gflops"]), ".3g"),
            fmt_num(num(e["frac_sgemm"]), ".2f") + (f" [{e['frac_sgemm_ci'][0]:.2f}, {e['frac_sgemm_ci'][1]:.2f}]"
                                                    if e.get("frac_sgemm_ci") else ""),
            fmt_num(num(e["frac_peak"]), ".2f"),
            fmt_bytes(e["memory_bytes"]) + (" (est.)" if e["memory_estimated"] else ""),
            fmt_num(num(e["worst_rel_l2_err"]), ".2e"),
        ])
    return md_table(["series", "parameters", "mask", "exact", "exponent (fit)", "slope, last 2 n", "max n", "time at max n (ms)",
                     "GFLOP/s", "× sgemm", "× FMA peak", "memory at max n", "worst rel_l2_err"], table)


RATIO_KINDS = {"variants": "variants", "mask": "mask vs none", "threads": "threads", "pass": "pass vs forward"}


def _ratio_side(kind, s):
    text = f"`{s['series']}`"
    if kind == "mask":
        text += f", {s['mask']}"
    elif kind == "threads":
        text += f", {s['threads']} thread{'s' if s['threads'] != 1 else ''}"
    elif kind == "pass":
        text += f", {s['pass']}"
    return text + (" (noisy)" if s["noisy"] else "")


def key_ratios_section(an):
    kr = an["key_ratios"]
    if not kr["rows"]:
        return "No two measured attnbench rows to compare (one series, one mask and one thread count)."
    table = []
    for e in kr["rows"]:
        iv = e["interval"]
        table.append([RATIO_KINDS[e["kind"]], _ratio_side(e["kind"], e["a"]), _ratio_side(e["kind"], e["b"]),
                      "; ".join(x for x in (e["mask"], e["context"], f"n={e['seq_kv']}") if x),
                      fmt_num(num(e["a"]["median_ms"]), ".4g"), fmt_num(num(e["b"]["median_ms"]), ".4g"),
                      fmt_num(num(e["ratio"]), ".3g") + "×", f"[{iv[0]:.3g}, {iv[1]:.3g}]" if iv else "—",
                      f"paired, {e['pairs']} rounds" if e.get("method") == "paired" else "medians",
                      e["significant"]])
    bound = ", ".join(f"{RATIO_KINDS[k]}: {kr['shown'][k]} of {c}" for k, c in kr["counts"].items() if c)
    return "\n".join([
        md_table(["comparison", "A", "B", "at", "A median (ms)", "B median (ms)", "A / B", "interval", "from",
                  "significant"], table), "",
        "*A / B*, at the largest n both rows were measured at (attnbench rows; *variants*: every pair of series "
        "at the same point, B the exact one, then the one without parameters; *mask vs none*: the same series "
        "and point with and without the mask; *threads*: the same series and point against its smallest thread "
        "count"
        + ("; *pass vs forward*: the same series and point, its backward or training step against its forward"
           if "pass" in kr["counts"] else "") + "). *from paired*: both rows were timed in one interleaved group (`measure.interleave`), so their "
        "repetitions pair up round by round; A / B is the median of the per-round ratios and *interval* its 95% "
        "distribution-free interval (a drift of the machine's speed during the group reaches both sides of every "
        "ratio and cancels); *significant*: yes when the interval leaves out 1. *from medians*: the ratio of the "
        "median times and [lo_A / hi_B, hi_A / lo_B] from the two 95% confidence intervals of the medians (it "
        "holds the true ratio whenever both intervals hold their medians, at least 90%); *significant*: yes "
        "when the two intervals are apart, no when they overlap, — when a row has none (fewer than 6 "
        "repetitions, or results from before attnbench recorded it). "
        "*(noisy)*: the row's interference stayed above the threshold on every attempt.",
        "",
        f"The table is bounded to one row per pair and setting, at most {kr['limit_per_kind']} per kind of "
        f"comparison, in the order above ({bound}); summary.json `key_ratios` holds the same rows."])


def _speedup_cell(speed, n_range):
    return f"{fmt_num(speed, '.2f')}× at n={n_range[1]}" if n_range else "—"


def crossover_table(an):
    """The crossover table; with backward passes among the results a training column (the forward +
    backward step's crossover and its speed-up at max n) beside the inference (forward) one."""
    training = any("training" in c for c in an["crossover"])
    rows_md = []
    for c in an["crossover"]:
        n_range = c["n_range"]
        speed, mem = c["speedup_at_max_n"], c["memory_ratio_at_max_n"]
        row = [f"`{c['series']}`", _where(c), f"{n_range[0]}–{n_range[1]}" if n_range else "—", c["faster"],
               _speedup_cell(speed, n_range)]
        if training:
            t = c["training"]
            row += [t["faster"], _speedup_cell(t["speedup_at_max_n"], t["n_range"])]
        rows_md.append(row + [c["less_memory"] + (" (some estimated)" if c["memory_estimated"] else ""),
                              f"{fmt_num(mem, '.3f')}× at n={n_range[1]}" if n_range and mem is not None else "—",
                              ", ".join(f"`{a}`" for a in c.get("against") or []) or "—"])
    if not rows_md:
        return "No approximate variant among the results: nothing to cross over."
    if training:
        return md_table(["approximate variant", "mask", "measured n", "inference (forward): faster than best exact from",
                         "speed-up at max n", "training (fwd+bwd): faster than best exact from",
                         "training speed-up at max n", "less memory than best exact from (forward)",
                         "memory ratio at max n", "best exact (forward)"], rows_md)
    return md_table(["approximate variant", "mask", "measured n", "faster than best exact from",
                     "speed-up at max n", "less memory than best exact from", "memory ratio at max n",
                     "best exact"], rows_md)


FLOP_CONVENTION = ("FLOPs: each pass counts its own (`flops`): the backward by default 2.5× the forward's (the "
                   "FlashAttention-2 convention: five matmuls against the forward's two; causal halves both), the "
                   "training step the sum (3.5×)")


def _ratio_text(r):
    if r is None:
        return "—"
    iv = r["interval"]
    return fmt_num(num(r["ratio"]), ".2f") + "×" + (f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else "")


def _grad_text(g):
    if g["rel_l2_err"] is None:
        return f"— (reference {g['reference']})" if g["reference"] else "—"
    where = g["reference"] + (f", {g['blocks']} blocks" if g["reference"] == "sampled" and g["blocks"] else "")
    text = f"{fmt_num(num(g['rel_l2_err']), '.2e')} (d{g['part'][1:].upper()}; {where})"
    return text + (f", {g['nonfinite']} non-finite" if g["nonfinite"] else "")


def _pass_cells(side):
    if side is None:
        return ["—", "—"]
    return [fmt_num(num(side["time_ms"]), ".4g") + (" (noisy)" if side["noisy"] else ""),
            f"{fmt_num(num(side['gflops']), '.3g')} ({fmt_num(num(side['frac_peak']), '.2f')})"]


def _mem(side):
    if side is None or side["memory_bytes"] is None:
        return "—"
    return fmt_bytes(side["memory_bytes"]) + (" (est.)" if side["memory_estimated"] else "")


def _flops_measured(fr):
    parts = []
    for p, name in (("backward", "backward"), ("forward_backward", "training step")):
        st = fr.get(p)
        if not st:
            continue
        same = abs(st["max"] - st["min"]) <= 1e-9 * st["max"]
        parts.append(f"{name} {st['median']:.2f}× the forward's" + (f" at all {st['points']} points" if same else
                     f" (median over {st['points']} points; {st['min']:.2f}–{st['max']:.2f}×)"))
    return "; here " + ", ".join(parts) if parts else ""


def training_section(an):
    """REPORT.md's "Training (forward + backward)" section (without its heading), or None for results of
    forward passes only."""
    t = an.get("training")
    if t is None:
        return None
    md = []
    if t["rows"]:
        table = []
        for e in t["rows"]:
            table.append([f"`{e['series']}`", _where(e), e["seq_kv"]] + _pass_cells(e["forward"])
                         + _pass_cells(e["backward"]) + _pass_cells(e["forward_backward"])
                         + [_ratio_text(e["backward_over_forward"]), _grad_text(e["grad"]),
                            " / ".join(_mem(e[p]) for p in ("forward", "backward", "forward_backward"))])
        md += [md_table(["series", "mask", "n", "forward (ms)", "GFLOP/s (× peak)", "backward (ms)",
                         "GFLOP/s (× peak)", "fwd+bwd (ms)", "GFLOP/s (× peak)", "bwd / fwd",
                         "gradient rel_l2_err (worst of dQ, dK, dV; reference)",
                         "peak memory fwd / bwd / fwd+bwd"], table), ""]
        md.append(f"{FLOP_CONVENTION}{_flops_measured(t['flops_ratio'])}. *GFLOP/s*: the pass's FLOPs over its "
                  "median time; *× peak*: over the fp32 FMA peak (`frac_peak`). *bwd / fwd*: the backward's median "
                  "time over the forward's at the same point (paired round by round, with its 95% interval, when "
                  "both were timed in one interleaved group). *gradient rel_l2_err*: ‖dX − ref‖₂ / ‖ref‖₂ against "
                  "exact softmax attention's fp64 gradient (for an approximate variant, the distance of its "
                  "gradient from exact attention's), the worst of dQ, dK and dV; *full*: the whole problem, "
                  "*sampled*: the first and last (batch, K/V head) blocks, *none*: not compared "
                  "(accuracy.grad_max_work). *peak memory*: each pass's own peak, the backward's from the state "
                  "the training forward left, the training step's from before its forward.")
    else:
        md.append("No backward pass or training step was measured.")
    if t["left_out"]:
        md += ["", "Backward points left out, once per variant:", ""]
        for g in t["left_out"]:
            n = g["n"]
            md.append(f"- `{g['variant']}` ({g['status']}): {g['reason']} ({g['rows']} points: "
                      f"{', '.join(pass_title(p) for p in g['passes'])}; n = {', '.join(map(str, n))})")
    return "\n".join(md)


def _figure_subsection(stem, drawn):
    """A section figure's "### ... figure" subsection (the figure, its caption), [] when it was not drawn."""
    if stem not in drawn:
        return []
    return ["", f"### {TITLES[stem]} figure", "", f"![{TITLES[stem]}](plots/{stem}.png)", "",
            BLURBS[stem] + f" ([SVG](plots/{stem}.svg))"]


def _growth_text(k, constant_word):
    if k is None:
        return "—"
    return constant_word if k == 0 else f"∝ n^{k:.2f}"


def decode_section(an, drawn):
    """REPORT.md's Decode section (without its heading), None without decode rows."""
    dec = an.get("decode")
    if not dec:
        return None
    table, growth = [], []
    for e in dec["series"]:
        name = f"`{e['series']}`" + (" (PyTorch)" if e["source"] == "peer" else "")
        for p in e["points"]:
            ratio = p["state_over_kv_cache"]
            table.append([name, _where(e), p["seq_q"], p["seq_kv"],
                          fmt_num(num(p["time_per_token_ms"]), ".4g") + (" (noisy)" if p["noisy"] else ""),
                          (fmt_num(num(p["speedup_vs_fastest_exact"]), ".3g") + f"× (`{p['fastest_exact']}`)")
                          if p["fastest_exact"] else "—",
                          fmt_num(num(p.get("frac_bandwidth")), ".2f"),
                          fmt_bytes(p["state_bytes"]), fmt_bytes(p["kv_cache_bytes"]),
                          fmt_num(ratio, ".3g") if ratio is not None else "—"])
        ns = [p["seq_kv"] for p in e["points"]]
        growth.append([name, _where(e), f"{min(ns)}–{max(ns)}", _growth_text(e["time_per_token_exponent"], "constant"),
                       _growth_text(e["state_exponent"], "constant"), _growth_text(e["kv_cache_exponent"], "constant")])
    md = [md_table(["series", "mask", "seq_q", "context seq_kv", "time per token (ms)", "speed-up over fastest exact",
                    "of bandwidth", "state kept", "KV cache (exact attention)", "state ÷ KV cache"], table), "",
          "Decode rows: fewer new queries (seq_q) than keys (the context seq_kv) under the lower-right causal mask, "
          "timed forward. *time per token*: the median time of one call divided by seq_q. *speed-up over fastest "
          "exact*: the fastest exact attnbench variant's time at the same point over this one's (that variant in "
          "brackets). *of bandwidth*: `frac_bandwidth`, the bytes the call must read (`bytes`) per second over a "
          "streaming read of the same K and V timed in the same rounds (`group_bandwidth`, from wherever those "
          "bytes live: a cache or DRAM), or, for rows without one, over the run's DRAM streaming-read "
          "calibration (a decode step that reads its whole KV cache is memory-bound: 1 is the limit; above 1 "
          "against the calibration, part of the cache stayed in the CPU's caches between calls). "
          "*state kept*: `memory.state_bytes`, what the series keeps between decode steps at that "
          "context (a recurrence's d_k × d_v state per (batch, head), sliding_window's rolling cache, the KV cache "
          "for the other variants); *KV cache*: `memory.kv_cache_bytes`, the KV cache exact attention keeps at the "
          "same context.", "",
          md_table(["series", "mask", "contexts", "time per token", "state kept", "KV cache"], growth), "",
          "How each grows with the context: the exponent k of a least-squares fit of log(y) on log(seq_kv) over "
          "the measured contexts (*constant*: the same at every context)."]
    return "\n".join(md + _figure_subsection(DECODE, drawn))


def phases_section(an, drawn):
    """REPORT.md's Phases section (without its heading), None unless rows carry phase_ms."""
    ph = an.get("phases")
    if not ph:
        return None
    md = []
    for e in ph["series"]:
        names = e["phases"]
        table = []
        for p in e["points"]:
            cells = [f"{fmt_num(num(p['phase_ms'][k]), '.3g')} ({fmt_num(100 * num(p['share'][k]), '.0f')}%)"
                     if p["phase_ms"][k] is not None and p["share"][k] is not None else "—" for k in names]
            speed = num(p["speedup_vs_fastest_exact"])
            table.append([p["seq_q"], p["seq_kv"], *cells,
                          fmt_num(num(p["time_ms"]), ".4g") + (" (noisy)" if p["noisy"] else ""),
                          (fmt_num(num(p["fastest_exact_ms"]), ".4g") + f" (`{p['fastest_exact']}`)")
                          if p["fastest_exact"] else "—",
                          fmt_num(speed, ".3g") + "×" if speed is not None else "—"])
        md += [f"**`{e['series']}`**, {_where(e)}", "",
               md_table(["seq_q", "context seq_kv", *[f"{k} ms (share)" for k in names], "call ms",
                         "fastest exact ms", "speed-up"], table), ""]
        grow = ", ".join(f"{k} {_growth_text(e['growth'][k], 'constant')}" for k in names)
        lines = [f"Growth with the context: {grow}."]
        for c in e["crossings"]:
            n = num(c["seq_kv"])
            if c["how"] == "measured":
                lines.append(f"*{c['phase']}* passes *{c['passes']}* at a context of ≈ {n:,.0f} tokens "
                             "(interpolated between the measured contexts).")
            elif c["how"] == "from the smallest context":
                lines.append(f"*{c['phase']}* takes longer than *{c['passes']}* from the smallest measured "
                             f"context on ({n:,.0f}).")
            else:
                lines.append(f"*{c['phase']}* would pass *{c['passes']}* at ≈ {n:,.0f} tokens: **extrapolated** "
                             "from their growth between the two largest measured contexts, not measured.")
        md += [" ".join(lines), ""]
    md.append("Each phase's time is the median over the timed calls of that phase alone (`phase_ms`); the shares "
              "are of the call's median and need not sum to 100%. *fastest exact*: the fastest exact attnbench "
              "row at the same point; *speed-up*: its time over this series' (above 1×: the sparse variant is "
              "faster). Where the variant becomes faster for good is in the Crossover table above.")
    return "\n".join(md + _figure_subsection(PHASES, drawn))


def chunk_section(an, drawn):
    """REPORT.md's Chunk size section (without its heading), None unless a variant was measured at several
    chunks."""
    sweep = an.get("chunk_sweep")
    if not sweep:
        return None
    table = []
    for e in sweep:
        for f in e["families"]:
            for s in f["by_n"]:
                name = f"`{f['series']}`" + (" (PyTorch)" if e["source"] == "peer" else "")
                table.append([name, _where(e), s["seq_kv"],
                              " · ".join(f"{p['chunk']}: {fmt_num(num(p['time_ms']), '.4g')}" for p in s["points"]),
                              " · ".join(f"{p['chunk']}: {fmt_num(num(p['gflops']), '.3g')}" for p in s["points"]),
                              s["best_chunk"], fmt_num(num(s["slowest_over_best"]), ".3g") + "×"])
    md = [md_table(["series (all chunks)", "mask", "n", "time (ms) by chunk", "GFLOP/s by chunk", "fastest chunk",
                    "slowest ÷ fastest"], table), "",
          "Each series measured at several `chunk` values with its other parameters the same, at each n: the "
          "median time and GFLOP/s per chunk (chunk: value), the fastest chunk and the slowest chunk's time over "
          "the fastest's."]
    return "\n".join(md + _figure_subsection(CHUNK_SIZE, drawn))


REFERENCE_TEXT = {"own_definition": "its own fp64 definition", "exact_softmax": "exact softmax (same as vs softmax)"}


def accuracy_references_section(an):
    """REPORT.md's "Accuracy against each reference" section (without its heading), None unless rows have
    accuracy_vs_softmax."""
    refs = an.get("accuracy_references")
    if not refs:
        return None
    table = [[f"`{e['series']}`" + (" (PyTorch)" if e["source"] == "peer" else ""), _where(e), e["rows"],
              REFERENCE_TEXT.get(e["reference"], e["reference"]), fmt_num(num(e["rel_l2_err"]), ".2e"),
              fmt_num(num(e["max_abs_err"]), ".2e"), fmt_num(num(e["softmax_rel_l2_err"]), ".2e"),
              fmt_num(num(e["softmax_max_abs_err"]), ".2e")] for e in refs]
    return "\n".join([
        md_table(["series", "mask", "rows", "`accuracy` against", "accuracy rel_l2_err (worst)",
                  "accuracy max_abs_err (worst)", "vs exact softmax rel_l2_err (worst)",
                  "vs exact softmax max_abs_err (worst)"], table), "",
        "`accuracy` is against the series' own fp64 reference on the inputs the kernel read: for a variant that is "
        "not softmax attention (a linear recurrence) its own definition, so it measures the kernel's rounding; "
        "otherwise exact softmax attention. `accuracy_vs_softmax` is always against exact fp64 softmax attention "
        "on the same Q, K, V: for a variant that is not softmax attention it is informative, the distance between "
        "the two operators rather than an error of the kernel; for a softmax variant it is the same figure as "
        "`accuracy`. Worst over the series' forward rows."])


def excluded_section(an):
    counts = an["excluded"]
    if not counts:
        return "Every row was measured (status ok)."
    parts = [f"{an['rows_excluded']} of {an['rows_ok'] + an['rows_excluded']} rows are left out of the curves: "
             + ", ".join(f"{c} {s}" for s, c in sorted(counts.items())) + ". By reason (# stands for numbers):", ""]
    table = [[g["status"], f"`{g['variant']}`", g["rows"], ", ".join(map(str, g["n"])), g["reason"], g["example"]]
             for g in an["excluded_reasons"]]
    parts.append(md_table(["status", "variant", "rows", "n", "reason", "example"], table))
    return "\n".join(parts)


def accuracy_by_dtype_section(an, drawn=()):
    """REPORT.md's Accuracy by dtype section (without its heading): the table, and with several dtypes the
    speed-up and error figure when it was drawn."""
    entries = an.get("accuracy_by_dtype") or []
    if not entries:
        return "No measured row with an accuracy reference."
    with_regime = any(e["regime"] is not None for e in entries)
    with_bias = any(e["bias"] is not None for e in entries)
    header = ["variant", "dtype"] + (["inputs"] if with_regime else []) + (["bias"] if with_bias else []) + [
        "rows", "kernel max_abs_err (median)", "kernel (max)", "end to end (median)", "end to end (max)",
        "time vs fp32"]
    table = []
    for e in entries:
        ratio = num(e["time_ratio_vs_fp32"])
        table.append([f"`{e['variant']}`", e["dtype"]] + ([e["regime"] or "—"] if with_regime else [])
                     + ([e["bias"] or "—"] if with_bias else [])
                     + [e["rows"], fmt_num(num(e["kernel_median_max_abs_err"]), ".2e"),
                        fmt_num(num(e["kernel_max_max_abs_err"]), ".2e"),
                        fmt_num(num(e["e2e_median_max_abs_err"]), ".2e"), fmt_num(num(e["e2e_max_max_abs_err"]), ".2e"),
                        (f"{ratio:.2f}× ({e['time_ratio_points']} points)" if ratio is not None else "—")])
    return "\n".join([md_table(header, table), "",
                      "*kernel*: `accuracy.max_abs_err`, against fp64 attention on the inputs the variant read "
                      "(rounded to the dtype); *end to end*: `accuracy_e2e.max_abs_err`, against fp64 attention on "
                      "the fp32 inputs before rounding (the same for fp32). Median and max over the variant's "
                      "rows. *time vs fp32*: the median ratio of its time to the same variant's fp32 row at the "
                      "same point, where the results have one."] + _figure_subsection(DTYPE_VS_FP32, drawn))


def roofline_section(an, drawn):
    roof = an["roofline"]
    md = []
    if not any(p["points"] for p in roof["panels"]):
        md.append("The roofline data is missing: " + "; ".join(roof["missing"] or ["no measured row"]) + ".")
        return "\n".join(md)
    for p in roof["panels"]:
        sg, bw = p["sgemm_gflops"], p["bandwidth_gbytes_per_s"]
        rng = p.get("sgemm_gflops_range")
        where = ""
        if rng:
            where = (f" (the median of the rows' own sgemm, {p.get('sgemm_in_group_rows', 0)} of {len(p['points'])} "
                     f"timed in their rounds; range {rng[0]:.1f}–{rng[1]:.1f})")
        md.append(f"- {p['threads']} thread(s): sgemm {fmt_num(sg, '.1f')} GFLOP/s{where}, memory bandwidth "
                  f"{fmt_num(bw, '.1f')} GB/s" + (f", ridge at {p['ridge_intensity']:.1f} FLOP/byte" if p["ridge_intensity"]
                                                  else "") + f"; {len(p['points'])} rows")
    if roof["missing"]:
        md.append("- missing: " + "; ".join(roof["missing"]))
    md.append("")
    several = len({b.get("pass") for b in roof["best"]}) > 1
    table = [[f"`{b['variant']}`" + (f" ({b['pass']})" if several else ""), b["rows"], fmt_num(b["best_frac_bandwidth"], ".2f"),
              fmt_num(b["gbytes_per_s"], ".3g"), f"`{b['at_bandwidth']}`" if b["at_bandwidth"] else "—",
              fmt_num(b["best_frac_sgemm"], ".2f"), fmt_num(b["gflops"], ".3g"),
              f"`{b['at_sgemm']}`" if b["at_sgemm"] else "—"] for b in roof["best"]]
    md.append(md_table(["variant", "rows", "best × bandwidth", "GB/s", "at", "best × sgemm", "GFLOP/s", "at"], table))
    md += ["", "*× bandwidth*: the row's `bytes` per second over the in-run memory bandwidth at its thread count "
               "(`frac_bandwidth`); *× sgemm*: its GFLOP/s over the sgemm timed in its own rounds, or else the "
               "calibration it names (`frac_sgemm`)."]
    if ROOFLINE in drawn:
        md += ["", f"### {TITLES[ROOFLINE]} figure", "", f"![{TITLES[ROOFLINE]}](plots/{ROOFLINE}.png)", "",
               BLURBS[ROOFLINE] + f" ([SVG](plots/{ROOFLINE}.svg))"]
    return "\n".join(md)


def patterns_section(summary):
    """The Attention patterns section's text under its figure: what the heatmaps are, a table of each variant's
    mask, colour scale and range of weights, and the notes of the figure's footnote (patterns.notes)."""
    text = ("The weights each variant applies on a small input (`attnbench patterns`), measured through its forward "
            "pass with V set to unit vectors: row i is the weight query i puts on each key; for a recurrence, the "
            "signed, unnormalised weight of each value in its output (rows need not sum to 1, nor need Nyström's "
            "and Linformer's).")
    if summary is None:
        return text + " ([SVG](plots/patterns.svg))"
    text += (f" n = {summary['seq']}, {patterns.MASKS[summary['mask']]}; the figure draws "
             f"{patterns.heads_text(summary['heads_shown'], summary['heads'])} of each variant. "
             "([SVG](plots/patterns.svg))")
    table = [[f"`{v['variant']}`", "causal" if v["causal"] else "unmasked", patterns.SCALES[v["scale"]],
              patterns.range_text(v)] for v in summary["variants"]]
    table += [[f"`{m['variant']}`", "—", f"not drawn: {m['status']} ({m['reason']})", "—"]
              for m in summary["missing"]]
    return "\n".join([text, "", md_table(["variant", "mask", "colour scale", "weights (min, max)"], table), ""]
                     + [f"- {line}" for line in patterns.notes(summary)])


MAX_CALIBRATION_ROWS = 24


def _ids(ids, total):
    text = ", ".join(f"`{i}`" for i in ids)
    return text + (f" (the first {len(ids)} of {total}; all in results.jsonl)" if total > len(ids) else "")


def _rows(n):
    return f"{n} row{'s' if n != 1 else ''}"


def measurement_section(an):
    m = an["measurement"]
    md = []
    if not m["recorded"]:
        md.append("Interference, re-measurements and intervals of the median were not recorded: results written "
                  "before attnbench recorded interference (no row has `interference`, `attempts` or `noisy`).")
    else:
        attempts = ", ".join(f"{k} × {v}" for k, v in m["attempts"].items())
        md.append(f"- {m['rows_with_ci']} of {m['rows_ok']} measured rows have a 95% confidence interval of the "
                  "median (it needs 6 or more repetitions).")
        md.append(f"- Re-measured because of interference (attempts > 1): {m['remeasured']} of {m['rows']} rows"
                  + (f" (attempts: {attempts})" if attempts else "")
                  + (": " + _ids(m["remeasured_ids"], m["remeasured"]) if m["remeasured"] else "") + ".")
        md.append(f"- Noisy (interference score above measure.max_interference = {m['max_interference']:g} on "
                  f"every attempt; kept, marked (noisy) in the tables): {_rows(m['noisy'])}"
                  + (": " + _ids(m["noisy_ids"], m["noisy"]) if m["noisy"] else "") + ".")
        if m["interference_rows"]:
            md.append(f"- Interference score over the {m['interference_rows']} rows that measured it: median "
                      f"{fmt_num(num(m['interference_score_median']), '.3g')}, max "
                      f"{fmt_num(num(m['interference_score_max']), '.3g')} (`{m['interference_score_max_id']}`).")
        else:
            md.append("- Interference score: no row measured it.")
    if m["peak_notes"]:
        md.append("- Peak memory not measured: " + "; ".join(f"{p['note']} ({_rows(p['rows'])})"
                                                             for p in m["peak_notes"]) + ".")
    md.append("")
    cals = m["calibrations"]
    if cals is None:
        md.append("Calibrations over time: not recorded: results written before attnbench recorded interference "
                  "(meta.json has no `calibrations`; the Machine section lists the one sgemm calibration).")
        return "\n".join(md)
    if not cals:
        md.append("meta.json lists no calibrations.")
        return "\n".join(md)
    threads = sorted({e["threads"] for c in cals for e in c["sgemm"]})
    table = []
    for c in cals[:MAX_CALIBRATION_ROWS]:
        g = {e["threads"]: e["gflops"] for e in c["sgemm"]}
        table.append([c["index"], c["timestamp"] or "?", fmt_num(num(c["after_points"]), ".0f"), c["reason"] or "?",
                      "yes" if c["used"] else "no", fmt_num(num(c["interference_score"]), ".3g")]
                     + [fmt_num(g.get(t), ".1f") for t in threads] + [c["rows"]])
    md.append(md_table(["calibration", "timestamp", "after points", "reason", "used", "interference score"]
                       + [f"sgemm GFLOP/s, {t} thread{'s' if t != 1 else ''}" for t in threads] + ["rows"], table))
    md.append("")
    if len(cals) > MAX_CALIBRATION_ROWS:
        md += [f"The first {MAX_CALIBRATION_ROWS} of {len(cals)} calibrations; summary.json `measurement` has "
               "all.", ""]
    md.append("*reason*: start (or resume) of the run, cadence (every measure.calibrate_every points) or "
              "interference (after a disturbed point); *used*: no for a calibration taken under interference, "
              "which the rows did not divide by; *rows*: the rows whose frac_sgemm and frac_peak divide by it.")
    if m["calibration_spread"]:
        md += ["", "Spread of the sgemm calibration across the used calibrations: "
               + "; ".join(f"{s['threads']} thread(s): {s['min_gflops']:.1f}–{s['max_gflops']:.1f} GFLOP/s over "
                           f"{s['calibrations']}, max/min {s['max_over_min']:.3f}" for s in m["calibration_spread"])
               + "."]
    return "\n".join(md)


def machine_section(meta):
    s = meta.get("system", {})
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
    for c in meta.get("sgemm_calibration", []):
        rows.append([f"sgemm calibration, {c.get('threads')} thread(s)",
                     f"{num(c.get('gflops')):.1f} GFLOP/s ({c.get('size')}³, cv {num(c.get('cv')) or 0:.2f})"])
    # One FMA peak per (threads, SIMD target); older results have one per thread count.
    for c in meta.get("fma_peak", []):
        if num(c.get("gflops")):
            lanes = f", {c['lanes']} lanes" if c.get("lanes") else ""
            rows.append([f"fp32 FMA peak, {c.get('threads')} thread(s), {c.get('isa') or '?'}",
                         f"{num(c.get('gflops')):.1f} GFLOP/s{lanes}"])
    mb = meta.get("memory_bandwidth")
    for t, c in sorted((mb or {}).items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
        if isinstance(c, dict) and num(c.get("gbytes_per_s")):
            rows.append([f"memory bandwidth, {t} thread(s)",
                         f"{num(c['gbytes_per_s']):.1f} GB/s (median {fmt_num(num(c.get('median')), '.1f')}, "
                         f"streaming read of {fmt_bytes(num(c.get('buffer_bytes')))})"])
    rows += [["memory probe", meta.get("memory_probe", "?")],
             ["run", f"{meta.get('start_time', '?')} → {meta.get('end_time', '?')}"
                     + (" (interrupted)" if meta.get("interrupted") else "")]]
    return md_table(["", ""], rows)


def render_report(res, an, figure_files):
    """REPORT.md's text. figure_files: the files written under the report's folder ("plots/<stem>.png", ...);
    a figure gets its section when its PNG is among them."""
    drawn = {os.path.splitext(os.path.basename(p))[0] for p in figure_files if p.endswith(".png")}
    meta = res.meta
    name = meta.get("config_name") or os.path.basename(os.path.abspath(res.dir))
    desc = (meta.get("config") or {}).get("description", "")
    counts = f"{len(res.ok)} measured rows in the curves"
    if res.peer_rows:
        counts += f" (including {sum(1 for r in res.ok if r.source == 'peer')} PyTorch peer rows from results.peers.jsonl)"
    md = [f"# attnbench results: {name}", ""]
    if desc:
        md += [f"> {desc}", ""]
    md += [f"{counts}; {len(res.excluded)} left out (see [below](#points-left-out-of-the-curves)). "
           f"Results folder: `{os.path.abspath(res.dir)}`. Generated by `scripts/plot.py`.", ""]
    md += ["## Key figures", "", key_figures(an), "",
           "*exponent (fit)*: least squares of log(time) on log(n) over the measured sizes; *slope, last 2 n*: "
           "the same between the two largest sizes (the asymptotic regime). *× sgemm*: fraction of the in-run "
           "sgemm throughput: of the sgemm timed in the row's own rounds where it ran there, with the 95% interval "
           "of the per-round ratios in brackets, else of the calibration before the row."
           + (" *(noisy)*: the row at max n stayed above the interference threshold on every attempt."
              if any(e.get("noisy") for e in an["key_figures"]) else "")
           + (" Series of the backward or the training step (pass=...): times, GFLOP/s and memory are that "
              "pass's; *worst rel_l2_err* is the gradient's (worst of dQ, dK, dV against exact attention's fp64 "
              "gradient)." if res.by_pass() else ""), "",
           "### Key ratios", "", key_ratios_section(an), ""]
    md += ["## Crossover", "", crossover_table(an), "",
           "Against the fastest (and the least memory-hungry) exact attnbench variant at each point; the size "
           "where an approximate variant becomes faster (or smaller) for good is interpolated in log–log between "
           "the bracketing measured sizes. Memory is the measured peak, or the estimate where no peak was "
           "measured. *best exact*: the exact series that were the fastest at the compared points."
           + (" *Training*: the same for the whole training step, each variant's forward + backward time against "
              "the fastest exact variant's forward + backward time at the same point."
              if any("training" in c for c in an["crossover"]) else ""), ""]
    training = training_section(an)
    if training is not None:
        md += ["## Training (forward + backward)", "", training, ""]
    decode = decode_section(an, drawn)
    if decode is not None:
        md += ["## Decode", "", decode, ""]
    phases = phases_section(an, drawn)
    if phases is not None:
        md += ["## Phases", "", phases, ""]
    mla = mla_section(an, _figure_subsection("mla", drawn))
    if mla:
        md += ["## Multi-head latent attention (MLA)", "", mla, ""]
    chunks = chunk_section(an, drawn)
    if chunks is not None:
        md += ["## Chunk size", "", chunks, ""]
    lra = lra_section(res)
    if lra:
        md += ["## Relative to exact attention (LRA Table 2 layout)", "", lra]
    for stem in FIGURES:
        if stem in drawn and stem not in SECTION_FIGURES:
            blurb = figure_blurb(stem, an, res)
            md += [f"## {TITLES[stem]}", "", f"![{TITLES[stem]}](plots/{stem}.png)", "",
                   blurb + f" ([SVG](plots/{stem}.svg))", ""]
    md += ["## Accuracy by dtype", "", accuracy_by_dtype_section(an, drawn), ""]
    refs = accuracy_references_section(an)
    if refs is not None:
        md += ["## Accuracy against each reference", "", refs, ""]
    md += ["## Roofline", "", roofline_section(an, drawn), ""]
    if PATTERNS in drawn:
        md += ["## Attention patterns", "", "![Attention patterns](plots/patterns.png)", "",
               patterns_section(an.get("patterns")), ""]
    md += ["## Points left out of the curves", "", excluded_section(an), ""]
    md += ["## Measurement conditions", "", measurement_section(an), ""]
    md += ["## Machine", "", machine_section(meta), ""]
    if meta.get("config") is not None:
        md += ["## Config", "", f"From `{meta.get('config_path', '?')}` (hash {meta.get('config_hash', '?')}):", "",
               "```json", json.dumps(meta["config"], indent=2), "```", ""]
    return "\n".join(md)


def write_report(res, an, out_dir, figure_files):
    """OUT_DIR/REPORT.md (written atomically); returns its path."""
    path = os.path.join(out_dir, "REPORT.md")
    atomic_write_text(path, render_report(res, an, figure_files))
    return path
