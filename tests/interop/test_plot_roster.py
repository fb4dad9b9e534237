#!/usr/bin/python3
"""scripts/plot.py on the rows of the linear recurrences (#32 item 6), synthetic with known answers:

- crossover: tiled exact causal at 1e-6 n² ms against a chunkwise form at 1e-3 n ms crosses at n = 1000
  exactly (the ratio 1000 / n is a power law, so log-log interpolation between 512 and 1024 is exact); a chunk
  of 32 at 1.25e-3 n at 1250; the recurrent form at 1e-2 n never within n <= 4096; linear at 2e-4 n from the
  smallest n; each names tiled as the exact series it was compared against;
- chunk size: time = 1e-3 n (C/64 + 64/C) / 2 is fastest at C = 64 with the slowest (32, 128) 1.25x it; the
  recurrent form, the same at every chunk, ties (its smallest chunk);
- decode (seq_q = 1 and 4 < seq_kv, causal_lower_right): tiled at 1e-5 seq_kv ms per token, the recurrent form
  0.01 ms whatever the context; a constant state of 8 x 64 x 64 x 4 bytes against a KV cache of 4096 seq_kv
  bytes: exponents 0 and 1, ratio 1/512 at 16384, a speed-up of 16.384 there;
- accuracy: the recurrence's `accuracy` (against its own definition) and `accuracy_vs_softmax` differ, tiled's
  are the same figures, linear's rows have no accuracy_vs_softmax;

- phases: dsa rows with phase_ms (indexer ∝ n, constant selection and attention) beside tiled: each phase's
  share, where the indexer passes the attention (measured, and extrapolated when the contexts stop short),
  where dsa passes tiled;

all in summary.json and REPORT.md, and the figures decode, phases and chunk_size drawn; results without decode rows,
chunk sweeps or accuracy_vs_softmax get none of those sections or figures; decode rows written before
memory.state_bytes still get their time per token. The stages apart (analysis without
matplotlib, the report without figures) as test_plot.py checks them.

Run by ctest as `/usr/bin/python3 test_plot_roster.py --attnbench PATH` (the path is not used: plot.py reads
files only). Exit 0 pass, 1 fail, 77 skip (numpy or matplotlib missing)."""
import argparse
import json
import os
import sys
import tempfile

import test_plot as tp  # check, run_plot, check_stages and the failures they record (next to this file)

check = tp.check
H, D = 8, 64
NS = [256, 512, 1024, 2048, 4096]
CONTEXTS = [1024, 4096, 16384]
STATE = H * D * D * 4  # a recurrence's fp32 d_k x d_v state per head, B = 1


def kv_cache(n):
    return 2 * H * n * D * 4  # K and V, fp32


def row(variant, params, n, time_ms, exact, seq_q=None, mask="causal", err=1e-7, softmax_err=None, state=None,
        kv=None):
    """A forward row in attnbench's schema; softmax_err: accuracy_vs_softmax's figures (None: the row has none,
    as rows written before it)."""
    seq_q = n if seq_q is None else seq_q
    ptext = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
    flops = 4.0 * H * D * seq_q * n / (2 if mask == "causal" else 1)
    r = {"id": f"{variant}{{{ptext}}}:B=1,H={H},Lq={seq_q},Lkv={n},D={D},{mask},gaussian(std=1),T=2",
         "variant": variant, "params": params, "batch": 1, "heads": H, "kv_heads": H, "seq_q": seq_q, "seq_kv": n,
         "head_dim": D, "mask": mask, "regime": "gaussian(std=1)", "threads": 2, "exact": exact, "status": "ok",
         "reason": "", "pass": "forward",
         "time_ms": {"median": time_ms, "p10": time_ms * 0.98, "p90": time_ms * 1.02, "mean": time_ms, "cv": 0.01,
                     "reps": 5},
         "flops": flops, "gflops": flops / (time_ms * 1e6), "frac_peak": flops / (time_ms * 1e6) / 100.0,
         "accuracy": {"reference": "sampled", "rows": 32, "max_abs_err": 2 * err, "rel_l2_err": err,
                      "mean_cosine": 1.0, "nan_count": 0, "inf_count": 0},
         "memory": {"estimated_bytes": 4 * H * seq_q * D, "peak_bytes": None, "state_bytes": state,
                    "kv_cache_bytes": kv}}
    if softmax_err is not None:
        r["accuracy_vs_softmax"] = {"max_abs_err": softmax_err[0], "rel_l2_err": softmax_err[1]}
    return r


def roster_rows():
    rows = []
    for n in NS:
        rows.append(row("tiled", {}, n, 1e-6 * n * n, True, softmax_err=(2e-7, 1e-7)))
        for c in (32, 64, 128):
            chunk = {"form": "chunk", "chunk": c}
            rows.append(row("gla", chunk, n, 1e-3 * n * (c / 64 + 64 / c) / 2, False, err=1e-6,
                            softmax_err=(0.6, 0.8)))
            rows.append(row("gla", {"form": "recurrent", "chunk": c}, n, 1e-2 * n, False, err=1e-6,
                            softmax_err=(0.6, 0.8)))
        rows.append(row("linear", {"chunk": 64, "feature_map": "elu"}, n, 2e-4 * n, False, err=0.3))
    for n in CONTEXTS:
        for q in (1, 4):
            rows.append(row("tiled", {}, n, 1e-5 * n * q, True, seq_q=q, mask="causal_lower_right",
                            softmax_err=(2e-7, 1e-7), state=kv_cache(n), kv=kv_cache(n)))
        rows.append(row("gla", {"form": "recurrent", "chunk": 64}, n, 0.01, False, seq_q=1, mask="causal_lower_right",
                        err=1e-6, softmax_err=(0.6, 0.8), state=STATE, kv=kv_cache(n)))
    return rows


META = {"config_name": "roster", "config": {"name": "roster"},
        "sgemm_calibration": [{"threads": 2, "gflops": 100.0, "size": 2048, "cv": 0.01}],
        "system": {"cpu_model": "Roster Test CPU 7", "cores_available": 2}}


def plot(d, rows):
    return tp.plot_report(d, rows, META)


section = tp.report_section
close = tp.close


def test_crossover(summary, md):
    cross = {(c["series"], c["mask"], c["context"]): c for c in summary["crossover"]}
    prefill = [c for c in summary["crossover"] if c["mask"] == "causal"]
    check(sorted(c["series"] for c in prefill) == ["gla(chunk=128,form=chunk)", "gla(chunk=128,form=recurrent)",
                                                    "gla(chunk=32,form=chunk)", "gla(chunk=32,form=recurrent)",
                                                    "gla(chunk=64,form=chunk)", "gla(chunk=64,form=recurrent)", "linear"],
          f"[crossover] one entry per non-exact causal series, each form and chunk apart ({len(prefill)})")
    c64 = cross.get(("gla(chunk=64,form=chunk)", "causal", ""), {})
    check(close(c64.get("faster_from_n"), 1000.0), f"[crossover] 1e-3 n overtakes 1e-6 n² at n = 1000 ({c64.get('faster_from_n')})")
    c32 = cross.get(("gla(chunk=32,form=chunk)", "causal", ""), {})
    check(close(c32.get("faster_from_n"), 1250.0), f"[crossover] 1.25e-3 n at n = 1250 ({c32.get('faster_from_n')})")
    rec = cross.get(("gla(chunk=64,form=recurrent)", "causal", ""), {})
    check(rec.get("faster_from_n") is None and rec.get("faster") == "never within measured range"
          and close(rec.get("speedup_at_max_n"), 1e-6 * 4096 / 1e-2),
          f"[crossover] the recurrent form 1e-2 n: never within n <= 4096, speed-up 0.41 there ({rec.get('faster')})")
    lin = cross.get(("linear", "causal", ""), {})
    check(lin.get("faster") == "faster at every measured n", f"[crossover] linear 2e-4 n: from the smallest n ({lin.get('faster')})")
    check(all(c.get("against") == ["tiled"] for c in prefill), "[crossover] each names tiled as the best exact series")
    sec = section(md, "Crossover")
    check("| approximate variant | mask | measured n | faster than best exact from | speed-up at max n | "
          "less memory than best exact from | memory ratio at max n | best exact |" in sec,
          "[crossover] REPORT.md's crossover table has the best exact column")
    check("| `gla(chunk=64,form=chunk)` | causal | 256–4096 | n ≈ 1000 (between 512 and 1024) | 4.10× at n=4096 |" in sec
          and "| `gla(chunk=32,form=chunk)` | causal | 256–4096 | n ≈ 1250 (between 1024 and 2048) |" in sec,
          "[crossover] REPORT.md gives n ≈ 1000 and n ≈ 1250 with their brackets")
    check("| `gla(chunk=64,form=recurrent)` | causal | 256–4096 | never within measured range | 0.41× at n=4096 |" in sec
          and "| `linear` | causal | 256–4096 | faster at every measured n |" in sec and "| `tiled` |" in sec,
          "[crossover] REPORT.md: the recurrent form never, linear at every n, tiled named as the baseline")


def test_chunks(summary, md):
    sweep = summary.get("chunk_sweep") or []
    check(len(sweep) == 1 and sweep[0]["variant"] == "gla" and sweep[0]["mask"] == "causal",
          f"[chunk] one chunk-size panel: gla, causal prefill (linear has one chunk; decode one) ({len(sweep)})")
    if not sweep:
        return
    fams = {f["series"]: f for f in sweep[0]["families"]}
    check(sorted(fams) == ["gla(form=chunk)", "gla(form=recurrent)"], f"[chunk] the families are the forms ({sorted(fams)})")
    chunk = fams.get("gla(form=chunk)", {"by_n": []})["by_n"]
    check([s["seq_kv"] for s in chunk] == NS and all(s["best_chunk"] == 64 and close(s["slowest_over_best"], 1.25)
                                                     for s in chunk),
          "[chunk] at every n chunk 64 is fastest, the slowest 1.25x it")
    s4096 = chunk[-1] if chunk else {"points": []}
    check([(p["chunk"], round(p["time_ms"], 9)) for p in s4096["points"]] == [(32, 5.12), (64, 4.096), (128, 5.12)]
          and all(close(p["gflops"], 4.0 * H * D * 4096 * 4096 / 2 / (p["time_ms"] * 1e6)) for p in s4096["points"]),
          "[chunk] each chunk's time and GFLOP/s at n = 4096")
    rec = fams.get("gla(form=recurrent)", {"by_n": []})["by_n"]
    check(all(s["best_chunk"] == 32 and close(s["slowest_over_best"], 1.0) for s in rec) and len(rec) == len(NS),
          "[chunk] the recurrent form, the same at every chunk: a tie (its smallest chunk), slowest / fastest 1")
    sec = section(md, "Chunk size")
    check("| `gla(form=chunk)` | causal | 4096 | 32: 5.12 · 64: 4.096 · 128: 5.12 |" in sec and "| 64 | 1.25× |" in sec,
          "[chunk] REPORT.md's Chunk size table gives the time per chunk, the fastest and slowest / fastest")
    check("![Chunk size](plots/chunk_size.png)" in sec, "[chunk] REPORT.md embeds the chunk-size figure in its section")


def test_decode(summary, md, d):
    dec = (summary.get("decode") or {}).get("series", [])
    by = {(e["series"], e["context"]): e for e in dec}
    check(sorted(by) == [("gla(chunk=64,form=recurrent)", "seq_q=1"), ("tiled", "seq_q=1"), ("tiled", "seq_q=4")],
          f"[decode] one decode series per variant and seq_q, the prefill rows left out ({sorted(by)})")
    g = by.get(("gla(chunk=64,form=recurrent)", "seq_q=1"))
    t1, t4 = by.get(("tiled", "seq_q=1")), by.get(("tiled", "seq_q=4"))
    if not (g and t1 and t4):
        return
    check([p["seq_kv"] for p in g["points"]] == CONTEXTS and all(p["state_bytes"] == STATE for p in g["points"])
          and [p["kv_cache_bytes"] for p in g["points"]] == [kv_cache(n) for n in CONTEXTS],
          "[decode] the recurrence's state and the KV cache beside it at each context")
    check(g["state_exponent"] == 0.0 and g["state_constant"] is True and close(g["kv_cache_exponent"], 1.0)
          and abs(g["time_per_token_exponent"]) < 1e-9,
          f"[decode] the state does not grow (exponent 0), the KV cache does (1), nor the time per token "
          f"({g['state_exponent']}, {g['kv_cache_exponent']}, {g['time_per_token_exponent']})")
    last = g["points"][-1]
    check(close(last["speedup_vs_fastest_exact"], 1e-5 * 16384 / 0.01) and last["fastest_exact"] == "tiled"
          and close(last["state_over_kv_cache"], 1 / 512),
          f"[decode] at 16384: 16.384x faster than tiled, the state 1/512 of the KV cache ({last})")
    check(all(close(p["time_per_token_ms"], 1e-5 * p["seq_kv"]) for p in t1["points"] + t4["points"])
          and close(t4["points"][0]["time_ms"], 4e-5 * 1024),
          "[decode] time per token is time / seq_q (tiled at seq_q = 4 and 1 alike)")
    check(close(t1["state_exponent"], 1.0) and t1["state_constant"] is False and close(t1["time_per_token_exponent"], 1.0),
          "[decode] tiled keeps its KV cache: the state grows with the context")
    sec = section(md, "Decode")
    check("| `gla(chunk=64,form=recurrent)` | causal_lower_right; seq_q=1 | 1 | 16384 | 0.01 | 16.4× (`tiled`) | — | "
          "128 KiB | 64 MiB | 0.00195 |" in sec,
          "[decode] REPORT.md's Decode table: time per token, speed-up, state beside the KV cache, their ratio")
    check("| `gla(chunk=64,form=recurrent)` | causal_lower_right; seq_q=1 | 1024–16384 | constant | constant | ∝ n^1.00 |"
          in sec and "| `tiled` | causal_lower_right; seq_q=4 | 1024–16384 | ∝ n^1.00 | ∝ n^1.00 | ∝ n^1.00 |" in sec,
          "[decode] REPORT.md's growth table: constant state and time per token, a KV cache ∝ n")
    check("![Decode](plots/decode.png)" in sec, "[decode] REPORT.md embeds the decode figure in its section")
    with open(os.path.join(d, "plots", "decode.svg"), encoding="utf-8") as f:
        svg = f.read()
    check("Roster Test CPU 7" in svg and "KV cache of exact attention" in svg and "state (constant)" in svg,
          "[decode] the figure names the CPU, draws the KV cache beside the state")


def test_accuracy(summary, md):
    refs = {(e["series"], e["context"]): e for e in summary.get("accuracy_references") or []}
    g = refs.get(("gla(chunk=64,form=chunk)", ""), {})
    check(g.get("reference") == "own_definition" and g.get("rel_l2_err") == 1e-6 and g.get("softmax_rel_l2_err") == 0.8
          and g.get("softmax_max_abs_err") == 0.6 and g.get("rows") == len(NS),
          f"[accuracy] the recurrence: accuracy against its own definition, 0.8 from softmax ({g})")
    t = refs.get(("tiled", ""), {})
    check(t.get("reference") == "exact_softmax" and t.get("rel_l2_err") == t.get("softmax_rel_l2_err") == 1e-7,
          "[accuracy] tiled: both figures against exact softmax, the same")
    check(not any(k[0] == "linear" for k in refs), "[accuracy] linear's rows, without accuracy_vs_softmax, are not listed")
    sec = section(md, "Accuracy against each reference")
    check("| `gla(chunk=64,form=chunk)` | causal | 5 | its own fp64 definition | 1.00e-06 | 2.00e-06 | 8.00e-01 | "
          "6.00e-01 |" in sec and "| `tiled` | causal | 5 | exact softmax (same as vs softmax) | 1.00e-07 |" in sec,
          "[accuracy] REPORT.md shows both figures per series")
    check("for a variant that is not softmax attention (a linear recurrence) its own definition" in sec
          and "`accuracy_vs_softmax` is always against exact fp64 softmax attention" in sec,
          "[accuracy] ... with the sentence saying which reference each is against")
    check(OWN_IN_CAPTION in section(md, "Accuracy vs sequence length"),
          "[accuracy] the accuracy figure's caption says the recurrence's error is against its own definition")


OWN_IN_CAPTION = "is against its own fp64 definition"


def test_roster(tmp):
    d = os.path.join(tmp, "roster")
    summary, md = plot(d, roster_rows())
    if summary is None:
        return
    test_crossover(summary, md)
    test_chunks(summary, md)
    test_decode(summary, md, d)
    test_accuracy(summary, md)
    with open(os.path.join(d, "plots", "accuracy_vs_seq.svg"), encoding="utf-8") as f:
        check("or the variant's own definition" in f.read(), "[accuracy] the accuracy figure's title names both references")
    for stem in ("decode", "chunk_size"):
        png = os.path.join(d, "plots", f"{stem}.png")
        check(os.path.isfile(png) and os.path.getsize(png) > 10000 and f"plots/{stem}.svg" in summary["files"],
              f"[roster] {stem}.png and .svg are drawn and listed in summary.json")
    tp.check_stages("roster", d, summary, md)


def test_without(tmp):
    """Prefill rows of tiled and linear only (one chunk, no accuracy_vs_softmax, no decode row): no decode,
    chunk-size or accuracy-reference section or figure."""
    d = os.path.join(tmp, "plain")
    rows = [r for r in roster_rows() if r["mask"] == "causal" and r["variant"] in ("tiled", "linear")]
    for r in rows:
        r.pop("accuracy_vs_softmax", None)
        r["memory"].pop("state_bytes")
        r["memory"].pop("kv_cache_bytes")
    summary, md = plot(d, rows)
    if summary is None:
        return
    check(summary["decode"] is None and summary["chunk_sweep"] is None and summary["accuracy_references"] is None,
          "[plain] summary.json: decode, chunk_sweep and accuracy_references are null")
    for heading in ("## Decode", "## Chunk size", "## Accuracy against each reference"):
        check(heading not in md, f"[plain] REPORT.md has no '{heading}' section")
    check(OWN_IN_CAPTION not in md, "[plain] the accuracy caption says nothing of own definitions")
    check(summary["files"] == [f"plots/{s}.{e}" for s in tp.FIGURES for e in ("png", "svg")] + ["REPORT.md"],
          f"[plain] only the usual figures are drawn ({summary['files']})")
    check("| `linear` | causal | 256–4096 | faster at every measured n |" in md, "[plain] the crossover table as before")
    tp.check_stages("plain", d, summary, md)


def test_old_decode(tmp):
    """Decode rows written before memory.state_bytes and accuracy_vs_softmax: the Decode section still gives the
    time per token, with no state (— in the table, null exponents), and the figure says so."""
    d = os.path.join(tmp, "old-decode")
    rows = [r for r in roster_rows() if r["mask"] == "causal_lower_right"]
    for r in rows:
        r.pop("accuracy_vs_softmax", None)
        r["memory"].pop("state_bytes")
        r["memory"].pop("kv_cache_bytes")
    summary, md = plot(d, rows)
    if summary is None:
        return
    dec = {(e["series"], e["context"]): e for e in (summary.get("decode") or {}).get("series", [])}
    g = dec.get(("gla", "seq_q=1"), {})  # its one parameter set: no parameter in the label
    check(g.get("state_exponent") is None and g.get("state_constant") is None
          and [p["time_per_token_ms"] for p in g.get("points", [])] == [0.01] * 3,
          "[old decode] time per token without state: the state's exponent is null")
    check("| `gla` | causal_lower_right; seq_q=1 | 1 | 1024 | 0.01 | 1.02× (`tiled`) | — | — | — | — |"
          in section(md, "Decode"), "[old decode] the Decode table shows — for the state and the KV cache")
    check(summary["accuracy_references"] is None and "## Accuracy against each reference" not in md,
          "[old decode] no accuracy_vs_softmax: no accuracy-reference section")
    with open(os.path.join(d, "plots", "decode.svg"), encoding="utf-8") as f:
        check("no memory.state_bytes in these rows" in f.read(), "[old decode] the figure's memory panel says why it is empty")


def phase_rows():
    """dsa decode rows with phase_ms beside tiled's: indexer n / 4096 ms, selection 0.1 ms, attention 6 ms per
    call; tiled n / 1024 ms. seq_q = 1 at 4K ... 32K (the indexer passes the attention at 6 * 4096 = 24576,
    measured between 16K and 32K: the ratio is a power law, so the log-log interpolation is exact; dsa passes
    tiled between 8K and 16K), seq_q = 4 at 4K ... 16K only (the same crossing, extrapolated from the last two
    contexts' growth: exponents 1 and 0)."""
    rows = []
    for q, contexts in ((1, [4096, 8192, 16384, 32768]), (4, [4096, 8192, 16384])):
        for n in contexts:
            rows.append(row("tiled", {}, n, n / 1024, True, seq_q=q, mask="causal_lower_right", kv=kv_cache(n),
                            state=kv_cache(n)))
            phases = {"indexer": n / 4096, "selection": 0.1, "attention": 6.0}
            r = row("dsa", {"topk": 2048}, n, sum(phases.values()), False, seq_q=q, mask="causal_lower_right",
                    kv=kv_cache(n), state=kv_cache(n))
            r["phase_ms"] = phases
            rows.append(r)
    return rows


def test_phases(tmp):
    d = os.path.join(tmp, "phases")
    summary, md = plot(d, phase_rows())
    if summary is None:
        return
    ph = {e["context"]: e for e in (summary.get("phases") or {}).get("series", [])}
    check(sorted(ph) == ["seq_q=1", "seq_q=4"] and all(e["series"] == "dsa" for e in ph.values()),
          f"[phases] one phase series per setting, dsa only ({sorted(ph)})")
    one, four = ph.get("seq_q=1"), ph.get("seq_q=4")
    if not (one and four):
        return
    check(one["phases"] == ["indexer", "selection", "attention"], "[phases] the phases in the rows' order")
    last = one["points"][-1]
    check(close(last["phase_ms"]["indexer"], 8.0) and close(last["share"]["attention"], 6.0 / 14.1)
          and close(last["speedup_vs_fastest_exact"], 32.0 / 14.1) and last["fastest_exact"] == "tiled",
          f"[phases] at 32K: each phase, its share, the speed-up over tiled ({last})")
    check(close(one["growth"]["indexer"], 1.0) and one["growth"]["attention"] == 0.0,
          "[phases] the indexer grows as n, the attention not at all")
    c1 = {(c["phase"], c["passes"]): c for c in one["crossings"]}
    check(list(c1) == [("indexer", "attention")] and close(c1[("indexer", "attention")]["seq_kv"], 24576.0)
          and c1[("indexer", "attention")]["how"] == "measured",
          f"[phases] the indexer passes the attention at 24576, measured; no other crossing ({one['crossings']})")
    c4 = {(c["phase"], c["passes"]): c for c in four["crossings"]}
    check(list(c4) == [("indexer", "attention")] and close(c4[("indexer", "attention")]["seq_kv"], 24576.0)
          and c4[("indexer", "attention")]["how"] == "extrapolated",
          f"[phases] up to 16K only: the same crossing, extrapolated and marked so ({four['crossings']})")
    cross = {(e["series"], e["context"]): e for e in summary["crossover"]}
    check("between 8192 and 16384" in (cross.get(("dsa(topk=2048)", "seq_q=1")) or cross.get(("dsa", "seq_q=1"))
                                       or {}).get("faster", ""),
          f"[phases] the Crossover names where dsa passes tiled ({summary['crossover']})")
    sec = section(md, "Phases")
    check("| 1 | 32768 | 8 (57%) | 0.1 (1%) | 6 (43%) | 14.1 | 32 (`tiled`) | 2.27× |" in sec,
          "[phases] REPORT.md's Phases table: each phase with its share, the call, tiled and the speed-up")
    check("*indexer* passes *attention* at a context of ≈ 24,576 tokens (interpolated" in sec
          and "*indexer* would pass *attention* at ≈ 24,576 tokens: **extrapolated**" in sec,
          "[phases] REPORT.md names the measured and the extrapolated crossing, the latter as such")
    check("![Phases](plots/phases.png)" in sec and "plots/phases.svg" in summary["files"],
          "[phases] the phases figure is drawn and embedded in its section")
    with open(os.path.join(d, "plots", "phases.svg"), encoding="utf-8") as f:
        svg = f.read()
    check("Roster Test CPU 7" in svg and "fastest exact (tiled)" in svg, "[phases] the figure names the CPU and tiled")
    tp.check_stages("phases", d, summary, md)


def mla_row(form, context, new, time_ms, core_ms, heads=H, preset="p"):
    """A results.mla.jsonl row (`attnbench mla --sweep`) with the fields the report reads."""
    return {"kind": "mla", "config": "roster", "form": form, "preset": preset, "batch": 1, "context": context,
            "new_tokens": new, "variant": "tiled", "threads": 2,
            "shape": {"d_model": 64, "heads": heads, "q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_dim": 128,
                      "qk_rope_dim": 64, "v_head_dim": 128, "rope_base": 10000},
            "cache_bytes_per_token": 163840 if form == "naive" else 2304, "median_ms": time_ms, "p10_ms": time_ms,
            "p90_ms": time_ms, "core_median_ms": core_ms, "gflops_per_s": 10.0, "frac_peak": 0.1, "gb_per_s": 20.0,
            "rel_l2": 3e-7 if context <= 2048 else None}


def mla_rows():
    """Decode (1 new token) at 4K ... 32K: naive n / 1024 ms, absorbed 12 ms (absorbed faster from 12288, a
    power law: the log-log interpolation is exact); their cores n / 2048 and 2 ms (equal at 4096). Prefill at
    context 2048, s = 1 ... 16 new tokens: naive 3 s, absorbed s^1.5 ms (naive faster from s = 9)."""
    rows = []
    for n in (4096, 8192, 16384, 32768):
        rows += [mla_row("naive", n, 1, n / 1024, n / 2048), mla_row("absorbed", n, 1, 12.0, 2.0)]
        g = mla_row("gqa", n, 1, n / 8192, n / 8192)  # the block's GQA core: its own series, no crossover part
        g["gqa"], g["cache_bytes_per_token"] = {"kv_heads": 2, "head_dim": 128}, 2048
        rows.append(g)
    for s in (1, 2, 4, 8, 16):
        rows += [mla_row("naive", 2048, s, 3.0 * s, 1.0 * s), mla_row("absorbed", 2048, s, s ** 1.5, 0.5 * s)]
    return rows


def test_mla(tmp):
    d = os.path.join(tmp, "mla")
    tp.write_rows(d, phase_rows())
    with open(os.path.join(d, "results.mla.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in mla_rows()))
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(META, f)
    summary, md = tp.plot_folder(d)
    if summary is None:
        return
    m = summary.get("mla") or {}
    dec = (m.get("decode") or [None])[0] or {}
    check(close(dec.get("absorbed_faster_from"), 12288.0) and dec.get("how") == "measured"
          and close(dec.get("core_absorbed_faster_from"), 4096.0) and close(dec.get("cache_ratio"), 163840 / 2304),
          f"[mla] decode: absorbed faster from 12288 (core from 4096), cache 71x smaller ({dec})")
    pre = (m.get("prefill") or [None])[0] or {}
    check(pre.get("context") == 2048 and close(pre.get("naive_faster_from"), 9.0) and pre.get("how") == "measured",
          f"[mla] prefill at 2048: naive faster from 9 new tokens ({pre})")
    check(sorted(s["series"] for s in m.get("sweep_decode", [])) == ["dsa", "tiled"],
          f"[mla] the sweep's one-token decode rows of the same head count are beside ({m.get('sweep_decode')})")
    sec = section(md, "Multi-head latent attention (MLA)")
    check("its layer call is faster from ≈ 12,288 tokens of context on" in sec
          and "its core alone from ≈ 4,096 tokens of context on" in sec
          and "the naive form is faster from ≈ 9 new tokens per call on" in sec,
          "[mla] REPORT.md names the decode and the prefill crossovers")
    check("GQA core (2 KV heads × 128): 4096: 0.5 ms, 8192: 1 ms, 16384: 2 ms, 32768: 4 ms" in sec
          and "cache 2 KiB per token against 2.25 KiB" in sec,
          "[mla] the GQA core beside the absorbed one: its times and cache per token")
    check("| `p` | MLA naive | 8 | 2048 | 1 | 3 | 3 | 1 (33%) |" in sec and "3.00e-07" in sec and "not checked" in sec,
          "[mla] the MLA table: times, the core's share, the error where checked")
    check("![Multi-head latent attention](plots/mla.png)" in sec and "plots/mla.svg" in summary["files"],
          "[mla] the figure is drawn and embedded in its section")
    with open(os.path.join(d, "plots", "mla.svg"), encoding="utf-8") as f:
        svg = f.read()
    check("Roster Test CPU 7" in svg and "MLA naive: layer" in svg and "dsa (sweep, core)" in svg
          and "GQA core (2 KV heads × 128)" in svg,
          "[mla] the figure names the CPU, the forms and the sweep's series")
    tp.check_stages("mla", d, summary, md)
    # A bad line that is not the last one: exit 2 naming the file and line.
    with open(os.path.join(d, "results.mla.jsonl"), "w") as f:
        f.write('{"kind": "mla"}\n' + json.dumps(mla_rows()[0]) + "\n")
    r = tp.run_plot(d)
    check(r.returncode == 2 and "results.mla.jsonl:1: missing form" in r.stderr,
          f"[mla] a bad MLA row: exit 2 naming file:line ({r.returncode}, {r.stderr.strip()[-300:]})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", help="unused: plot.py reads files only")
    ap.parse_args()
    try:
        import numpy  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (install python3-numpy python3-matplotlib)")
        return 77
    with tempfile.TemporaryDirectory(prefix="attnbench-test-plot-roster-") as tmp:
        for case in (test_roster, test_without, test_old_decode, test_phases, test_mla):
            print(f"--    {case.__name__}")
            try:
                case(tmp)
            except Exception as e:  # noqa: BLE001
                check(False, f"{case.__name__} raised {type(e).__name__}: {e}")
    print(f"{len(tp.failures)} failure(s)" if tp.failures else "all passed")
    return 1 if tp.failures else 0


if __name__ == "__main__":
    sys.exit(main())
