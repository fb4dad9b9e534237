"""The numbers behind the figures and the report, computed from the results before anything is drawn.

analyse(results) is pure (numpy only, no matplotlib, nothing written, the results left as they are) and returns
a plain dict of JSON values, which plot.py writes as summary.json (adding "files", the files it wrote):

    results_dir, rows_ok, rows_excluded    the folder and how many rows are in the curves / left out
    fits                        per series (label, mask, facet): the fitted time exponent over its sizes and
                                between its two largest sizes
    nonfinite_accuracy_points   measured rows whose rel_l2_err is inf/nan
    crossover                   per approximate attnbench series: where it becomes faster / smaller than the
                                best exact attnbench variant at the same point, and by how much at its max n;
                                `against`: the exact series that were the fastest at its points.
                                With backward passes among the rows (#27) one entry per series and pass-less
                                facet: these fields for the forward (inference), and `training` (the forward +
                                backward step) and `backward`, each against the best exact row of its pass
    excluded                    {status: rows} of the rows left out of the curves
    excluded_reasons            those rows grouped by status, variant and the shape of their reason
    key_figures                 per series: its figures at its largest n (and whether that row is noisy) and its
                                worst error
    best_exact                  per point: the fastest exact attnbench row and the exact one with least memory
    fastest                     per facet (mask, context) and n: the fastest attnbench series, exact or not, its
                                time and whether it is exact (what plot.py prints at its end, terminal.py)
    pareto                      per facet: every row's speed-up over the fastest exact row at its point against
                                its error, and which of them form the Pareto front
    accuracy_by_dtype           per variant x dtype (x regime, x bias when several): median and max of the
                                kernel's and the end-to-end max_abs_err, and the time ratio vs fp32 (#14)
    dtype_vs_fp32               None unless the rows have more than one dtype; else per series of a dtype other
                                than fp32 (mask, setting) and n: its speed-up over the same variant's fp32 row
                                at the same point (time_fp32 / time_dtype, paired round by round where both
                                were timed in one interleaved group, with its interval), its kernel and
                                end-to-end max_abs_err and the fp32 row's (the floor), and whether either row
                                is noisy
    roofline                    the ceilings of the run per thread count (sgemm GFLOP/s, memory bandwidth from
                                meta.json) with every measured row's arithmetic intensity (flops / bytes) and
                                GFLOP/s; per variant its best frac_bandwidth and frac_sgemm and where; and
                                `missing`, what the results lack for it (older folders: no bytes, no bandwidth)
    key_ratios                  the time ratios users compare, A / B at the largest n both were measured at
                                (attnbench rows): every pair of series at the same point ("variants"; B is the
                                exact one, then the one without parameters), each mask vs none ("mask") and each
                                thread count vs the smallest ("threads") for the same series and point. Each:
                                the ratio of the medians, the conservative interval [lo_a / hi_b, hi_a / lo_b]
                                from the two 95% intervals of the medians (None when one lacks it), and
                                `significant` ("yes": the intervals are apart, "no (intervals overlap)", "—": an
                                interval is missing). At most `limit_per_kind` per kind; `counts` has how many
                                there were (#18)
    measurement                 how the rows were measured on a shared machine (#18): `recorded` (false for
                                folders from before the fields), rows with an interval and which bars the time
                                figure draws, re-measured (attempts > 1) and noisy rows with their ids (the first
                                20), the interference score median / max over rows, why peak memory is missing,
                                and meta.json's `calibrations` (None before them) with the spread max / min of
                                sgemm GFLOP/s per thread count across the used ones
    training                    None for forward-only results; else (#27) per series that timed a backward and
                                each n: the forward's, backward's and training step's time, GFLOP/s, frac_peak and
                                peak memory, backward / forward and step / forward time ratios, the gradient error
                                (worst rel_l2_err of dQ, dK, dV, its reference kind); the passes' FLOP ratios to
                                the forward; the backward rows left out, once per variant and reason
    decode                      None without decode rows (seq_q < seq_kv, causal_lower_right, forward); else
                                per series and context seq_kv: time per new token, speed-up over the fastest
                                exact row, memory.state_bytes beside memory.kv_cache_bytes, and the exponents
                                of their growth with the context (0: a state that does not grow)
    phases                      None unless forward rows carry phase_ms (dsa: indexer, selection, attention);
                                else per series and context: each phase's ms and share, the fastest exact row
                                and the speed-up over it, each phase's growth exponent, and where one phase
                                passes another (measured between two contexts, or extrapolated and said so)
    chunk_sweep                 None unless a variant was measured at several `chunk` values; else per
                                variant, setting and family (its series less the chunk), at each n: time,
                                GFLOP/s and frac_peak per chunk, the fastest chunk, slowest / fastest
    accuracy_references         None unless rows have accuracy_vs_softmax; else per such series the worst
                                `accuracy` (against its own fp64 reference) and `accuracy_vs_softmax` (against
                                exact softmax attention) errors, and which reference `accuracy` is against
    patterns                    None without a patterns/ folder; else (patterns.summarise) its mask mode, size and
                                the heads drawn, per variant drawn its colour scale (signed where a weight is
                                negative), range, mask and the recurrences' g / beta, and the variants not drawn
                                with their status and reason

With several passes (sweep.pass, #27) the pass is a context dimension: every series, facet, point and
comparison is within one pass, and key_ratios gains a "pass" kind (backward and training step vs forward).

Series, facets and rows come in the order the figures and tables show them. Non-finite values in the lists
added for the figures and tables (key_figures, best_exact, pareto) are written as the rows write them,
"inf"/"nan" (JSON has none).
"""
import math
import os
import re

import numpy as np

from .common import json_num, num
from .mla import analyze_mla
from .patterns import summarise as patterns_summary
from .results import CONTEXT_DIMS, context_value, facet_order, mask_order, pass_order, series_label, worst

ERR_FLOOR = 1e-12  # errors below this are drawn (log axes) and ranked for the Pareto front as this


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


POINT_FIELDS = ["mask", "regime", "batch", "heads", "kv_heads", "head_dim", "v_head_dim", "threads", "seq_q", "seq_kv",
                "pass", "isa", "dtype", "bias"]


def point_key(r):
    """One measured point; variants are compared within it (on the same SIMD target when the sweep has several,
    and in the same pass: a backward row against the exact variants' backward rows)."""
    return tuple(r.pass_ if f == "pass" else getattr(r, f) for f in POINT_FIELDS)


def fastest_by(rows, key):
    """{key(r): the fastest of the rows with that key} (the first of equal times)."""
    fastest = {}
    for r in rows:
        k = key(r)
        if k not in fastest or r.time_median < fastest[k].time_median:
            fastest[k] = r
    return fastest


def best_exact(res):
    """Per point: the fastest exact attnbench row and (bytes, row) of the exact attnbench row with least memory.
    The PyTorch peer is left out, so the crossovers do not change with whether it was run."""
    exact = [r for r in res.ok if r.exact and r.source == "attnbench"]
    fastest, least_mem = fastest_by(exact, point_key), {}
    for r in exact:
        k = point_key(r)
        m, _ = r.memory()
        if m is not None and (k not in least_mem or m < least_mem[k][0]):
            least_mem[k] = (m, r)
    return fastest, least_mem


def _fits(res, series):
    fits = []
    for (label, mask, rk), rows in series:
        ns = [r.seq_kv for r in rows]
        ts = [r.time_median for r in rows]
        fits.append({"series": label, "mask": mask, "context": res.rest_title(rk), "exponent": fit_exponent(ns, ts),
                     "n_min": min(ns), "n_max": max(ns), "points": len(ns),
                     "tail_exponent": fit_exponent(ns[-2:], ts[-2:]) if len(ns) >= 2 else None,
                     "exact": rows[0].exact, "source": rows[0].source, "params": rows[0].params_text})
    return fits


def _nonfinite_accuracy(series):
    # The error each row's pass is judged by: the output's (forward), the gradient's (backward, training step).
    return sum(1 for _, rows in series for r in rows if r.pass_error() is not None and not math.isfinite(r.pass_error()))


def _cross_rows(rows, fastest, least_mem):
    """Where the rows of one series (one pass) become faster / smaller than the best exact row at each point
    of the same pass, and by how much at their largest n."""
    ns, t_ratio, m_ratio, est_used = [], [], [], False
    for r in rows:
        k = point_key(r)
        if k not in fastest:
            continue
        ns.append(r.seq_kv)
        t_ratio.append(r.time_median / fastest[k].time_median)
        mem, est = r.memory()
        base = least_mem.get(k)
        est_used |= est or (base is not None and base[1].memory()[1])
        m_ratio.append(mem / base[0] if mem is not None and base is not None else None)
    against = []  # the exact series that were fastest at the compared points, in n order
    for r in rows:
        base = fastest.get(point_key(r))
        if base is not None and base.label not in against:
            against.append(base.label)
    n_t, t_text = crossover(ns, t_ratio)
    n_m, m_text = crossover(ns, m_ratio)
    t_text = "faster " + t_text if t_text == "at every measured n" else t_text
    m_text = "less memory " + m_text if m_text == "at every measured n" else m_text
    return {"faster_from_n": n_t, "faster": t_text, "less_memory_from_n": n_m, "less_memory": m_text,
            "speedup_at_max_n": 1 / t_ratio[-1] if t_ratio else None,
            "memory_ratio_at_max_n": m_ratio[-1] if m_ratio else None,
            "n_range": [min(ns), max(ns)] if ns else None, "against": against,
            "memory_estimated": est_used}  # some memory figure was an estimate (no peak measured)


def _not_measured(res, label, mask, base, p):
    """Why a series has no measured rows in pass p: the reasons of its rows left out ("skipped: linear has no
    backward pass"), else "not measured"."""
    reasons = []
    for r in res.excluded:
        if r.label == label and r.mask == mask and r.pass_ == p and res.split_pass(res.rest_key(r))[1] == base:
            text = f"{r.status}: {r.reason}" if r.reason else str(r.status)
            if text not in reasons:
                reasons.append(text)
    return "; ".join(reasons) if reasons else "not measured"


def _crossovers(res, table_series, fastest, least_mem):
    """Per approximate attnbench series: its crossover against the best exact variant. With backward passes
    among the results a series is one per pass-less facet: the forward (inference) crossover,
    and `training` (the forward + backward step) and `backward` (the backward alone) beside it, each against
    the best exact row of the same pass."""
    groups, order = {}, []
    for (label, mask, rk), rows in table_series:
        if rows[0].exact or rows[0].source != "attnbench":
            continue
        key = (label, mask, res.split_pass(rk)[1])
        if key not in groups:
            groups[key] = {}
            order.append(key)
        groups[key][rows[0].pass_] = rows
    training = any(p != "forward" for p in res.all_passes)
    out = []
    for label, mask, base in order:
        by = groups[(label, mask, base)]
        entry = {"series": label, "mask": mask, "context": res.base_title(base)}
        if by.get("forward"):
            entry.update(_cross_rows(by["forward"], fastest, least_mem))
        else:  # a sweep of backward passes only
            note = "no forward rows (" + _not_measured(res, label, mask, base, "forward") + ")"
            entry.update(faster_from_n=None, faster=note, less_memory_from_n=None, less_memory=note,
                         speedup_at_max_n=None, memory_ratio_at_max_n=None, n_range=None, against=[],
                         memory_estimated=False)
        if training:
            for p, name in (("forward_backward", "training"), ("backward", "backward")):
                if by.get(p):
                    c = _cross_rows(by[p], fastest, least_mem)
                    entry[name] = {k: c[k] for k in ("faster_from_n", "faster", "speedup_at_max_n", "n_range")}
                else:
                    entry[name] = {"faster_from_n": None, "faster": "— (" + _not_measured(res, label, mask, base, p) + ")",
                                   "speedup_at_max_n": None, "n_range": None}
        out.append(entry)
    return out


def _growth(ns, ys):
    """The exponent k of y ~ n^k over the points that have y: exactly 0 when y is the same at every n (a state
    that does not grow), None with fewer than 2 sizes."""
    pts = [(n, y) for n, y in zip(ns, ys) if y is not None and y > 0]
    if len({n for n, _ in pts}) < 2:
        return None
    if len({y for _, y in pts}) == 1:
        return 0.0
    return fit_exponent([n for n, _ in pts], [y for _, y in pts])


def _decode(res, table_series, fastest):
    """The decode view, None when no measured forward row is a decode step (Row.is_decode): per series (and
    setting), at each context seq_kv, the time per new token (time_ms.median / seq_q), the speed-up over the
    fastest exact attnbench row at the same point, what the variant keeps between steps (memory.state_bytes)
    beside the KV cache exact attention keeps (memory.kv_cache_bytes); and how each grows with the context
    (fitted exponents: 0 for a state that does not grow, 1 for a KV cache)."""
    out = []
    for (label, mask, rk), rows in table_series:
        rows = [r for r in rows if r.is_decode() and r.pass_ == "forward"]
        if not rows:
            continue
        pts = []
        for r in rows:
            base = fastest.get(point_key(r))
            st, kv = r.state_bytes, r.kv_cache_bytes
            pts.append({"id": r.id, "seq_q": r.seq_q, "seq_kv": r.seq_kv, "time_ms": json_num(r.time_median),
                        "time_per_token_ms": json_num(r.time_median / r.seq_q), "state_bytes": st,
                        "kv_cache_bytes": kv, "state_over_kv_cache": st / kv if st is not None and kv else None,
                        "speedup_vs_fastest_exact": json_num(base.time_median / r.time_median) if base else None,
                        "fastest_exact": base.label if base else None, "noisy": r.noisy,
                        "frac_bandwidth": json_num(r.frac_bandwidth)})
        ns = [p["seq_kv"] for p in pts]
        states = [p["state_bytes"] for p in pts]
        out.append({"series": label, "variant": rows[0].variant, "exact": rows[0].exact, "source": rows[0].source,
                    "mask": mask, "context": res.rest_title(rk), "points": pts,
                    "time_per_token_exponent": _growth(ns, [r.time_median / r.seq_q for r in rows]),
                    "state_exponent": _growth(ns, states),
                    "kv_cache_exponent": _growth(ns, [p["kv_cache_bytes"] for p in pts]),
                    "state_constant": (len({x for x in states}) == 1) if all(x is not None for x in states) else None})
    return {"series": out} if out else None


PHASE_ORDER = ["indexer", "selection", "attention"]  # dsa's phases, in the order a call runs them
MIN_GROWTH_GAP = 0.05  # growth exponents closer than this: two phases that grow alike (noise apart) never cross
MAX_EXTRAPOLATION = 16  # a phase crossing is extrapolated up to 16x the largest measured context, not beyond


def _phase_crossing(ns, a, b, ka, kb):
    """Where phase a's time passes phase b's: the context from which a >= b at every measured context after it
    (interpolated in log-log between the bracketing contexts), "from the smallest measured context" when a >= b
    throughout; beyond the largest context, extrapolated from the two phases' growth exponents over the last two
    contexts (ka - kb >= MIN_GROWTH_GAP needed, and up to MAX_EXTRAPOLATION times the largest); None when a stays
    below b and does not grow faster. Returns (n, how)."""
    pts = [(n, y / x) for n, x, y in zip(ns, a, b) if x and y and x > 0 and y > 0]
    if not pts:
        return None, None
    n_at, how = crossover([n for n, _ in pts], [r for _, r in pts])
    if n_at is not None:
        return n_at, "measured"
    if how == "at every measured n":
        return float(pts[0][0]), "from the smallest context"
    if ka is None or kb is None or ka - kb < MIN_GROWTH_GAP:
        return None, None
    n_max, r_max = pts[-1]  # b / a at the largest context, > 1 here: a catches up as n^(ka - kb)
    log_n = math.log(n_max) + math.log(r_max) / (ka - kb)
    if log_n > math.log(n_max * MAX_EXTRAPOLATION):
        return None, None  # too far beyond what was measured to be worth a number
    return float(math.exp(log_n)), "extrapolated"


def _phases(res, table_series, fastest):
    """The phase view, None unless some forward row carries phase_ms (a variant that times its phases, dsa:
    indexer, selection, attention): per series and setting, at each context seq_kv, each phase's median ms and
    share of the call, the call's time, the fastest exact row's at the same point and the speed-up over it; how
    each phase grows with the context (fitted exponent); and, per pair of phases whose order changes within or
    beyond the measured contexts, where the one passes the other (measured: interpolated between two measured
    contexts; extrapolated: from the growth over the two largest, and said so)."""
    out = []
    for (label, mask, rk), rows in table_series:
        rows = sorted((r for r in rows if r.pass_ == "forward" and isinstance(r.fields.get("phase_ms"), dict)),
                      key=lambda r: r.seq_kv)
        if not rows:
            continue
        names = []
        for r in rows:
            names += [k for k in r.fields["phase_ms"] if k not in names]
        # The rows' objects come with their keys sorted; the phases a variant is known to run in order first.
        names.sort(key=lambda k: PHASE_ORDER.index(k) if k in PHASE_ORDER else len(PHASE_ORDER))
        pts = []
        for r in rows:
            ph = {k: num(r.fields["phase_ms"].get(k)) for k in names}
            base = fastest.get(point_key(r))
            pts.append({"id": r.id, "seq_q": r.seq_q, "seq_kv": r.seq_kv, "time_ms": json_num(r.time_median),
                        "phase_ms": {k: json_num(v) for k, v in ph.items()},
                        "share": {k: json_num(v / r.time_median) if v is not None else None for k, v in ph.items()},
                        "fastest_exact": base.label if base else None,
                        "fastest_exact_ms": json_num(base.time_median) if base else None,
                        "speedup_vs_fastest_exact": json_num(base.time_median / r.time_median) if base else None,
                        "noisy": r.noisy})
        ns = [p["seq_kv"] for p in pts]
        series_ph = {k: [num(p["phase_ms"][k]) for p in pts] for k in names}
        growth = {k: _growth(ns, v) if all(x is not None and x > 0 for x in v) else None
                  for k, v in series_ph.items()}
        tail = {k: fit_exponent(ns[-2:], v[-2:]) if len(ns) >= 2 and all(x and x > 0 for x in v[-2:]) else None
                for k, v in series_ph.items()}
        crossings = []
        for a in names:
            for b in names:
                if a == b:
                    continue
                first_a, first_b = series_ph[a][0], series_ph[b][0]
                if first_a is None or first_b is None or first_a >= first_b:
                    continue  # only a phase that starts below another can pass it
                n_at, how = _phase_crossing(ns, series_ph[a], series_ph[b], tail[a], tail[b])
                if n_at is not None:
                    crossings.append({"phase": a, "passes": b, "seq_kv": json_num(n_at), "how": how})
        out.append({"series": label, "variant": rows[0].variant, "mask": mask, "context": res.rest_title(rk),
                    "phases": names, "points": pts, "growth": growth, "crossings": crossings})
    return {"series": out} if out else None


def _chunk_value(r):
    c = r.params.get("chunk")
    return c if isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0 else None


def _chunk_sweep(res):
    """The chunk-size view, None when no variant was measured at several `chunk` values with its other
    parameters the same: per variant and setting (mask, context), each family (the series less its chunk:
    "gla(form=chunk)", "gla(form=recurrent)") with several chunks, and at each n its time, GFLOP/s and
    frac_peak per chunk, the fastest chunk and the slowest chunk's time over the fastest's."""
    groups, order = {}, []
    for r in res.ok:
        c = _chunk_value(r)
        if c is None:
            continue
        key = (r.variant, r.mask, res.rest_key(r), r.source)
        family = series_label(r.variant, r.params, [k for k in r.label_keys if k != "chunk"], r.label_tags)
        if key not in groups:
            groups[key] = {}
            order.append(key)
        groups[key].setdefault(family, {}).setdefault(r.seq_kv, {})[c] = r
    out = []
    for key in sorted(order, key=lambda k: (k[0], mask_order(k[1]), res.facet_key_order(k[2]), k[3])):
        variant, mask, rk, source = key
        families = []
        for family, by_n in sorted(groups[key].items()):
            sizes = []
            for n, by_c in sorted(by_n.items()):
                if len(by_c) < 2:
                    continue
                pts = [{"chunk": c, "id": r.id, "time_ms": json_num(r.time_median), "gflops": json_num(r.gflops),
                        "frac_peak": json_num(r.frac_peak), "noisy": r.noisy} for c, r in sorted(by_c.items())]
                best = min(sorted(by_c), key=lambda c: by_c[c].time_median)  # a tie: the smallest chunk
                slowest = max(r.time_median for r in by_c.values())
                sizes.append({"seq_kv": n, "points": pts, "best_chunk": best,
                              "best_time_ms": json_num(by_c[best].time_median),
                              "slowest_over_best": json_num(slowest / by_c[best].time_median)})
            if sizes:
                families.append({"series": family, "by_n": sizes})
        if families:
            out.append({"variant": variant, "mask": mask, "context": res.rest_title(rk), "source": source,
                        "families": families})
    return out or None


def _same(a, b):
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def _accuracy_references(res, table_series):
    """The two accuracy figures, for the series whose forward rows have accuracy_vs_softmax (None when none
    has): `accuracy` (against the variant's own fp64 reference: its own definition for a variant that is not
    softmax attention, exact softmax attention otherwise) and `accuracy_vs_softmax` (always against exact
    softmax attention), worst over the series' rows. `reference` is "own_definition" when the two differ on
    some row, "exact_softmax" when they are the same figures (a softmax variant)."""
    out = []
    for (label, mask, rk), rows in table_series:
        rows = [r for r in rows if r.pass_ == "forward"
                and (r.softmax_rel_l2_err is not None or r.softmax_max_abs_err is not None)]
        if not rows:
            continue
        own = any(not _same(r.rel_l2_err, r.softmax_rel_l2_err) or not _same(r.max_abs_err, r.softmax_max_abs_err)
                  for r in rows)
        out.append({"series": label, "variant": rows[0].variant, "mask": mask, "context": res.rest_title(rk),
                    "source": rows[0].source, "rows": len(rows),
                    "reference": "own_definition" if own else "exact_softmax",
                    "rel_l2_err": json_num(worst([r.rel_l2_err for r in rows])),
                    "max_abs_err": json_num(worst([r.max_abs_err for r in rows])),
                    "softmax_rel_l2_err": json_num(worst([r.softmax_rel_l2_err for r in rows])),
                    "softmax_max_abs_err": json_num(worst([r.softmax_max_abs_err for r in rows]))})
    return out or None


def _excluded(res):
    counts, reasons = {}, {}
    for r in res.excluded:
        st = r.status or "?"
        counts[st] = counts.get(st, 0) + 1
        # Numbers (byte counts, sizes) differ per row; the reason's shape groups them.
        reason = re.sub(r"\d+(\.\d+)?", "#", r.reason or "(no reason given)")
        reason = reason if len(reason) <= 140 else reason[:137] + "..."
        reasons.setdefault((st, r.variant, reason), []).append(r)
    groups = [{"status": st, "variant": variant, "reason": reason, "rows": len(rs),
               "n": sorted({r.seq_kv for r in rs}), "example": (rs[0].reason or "")[:200]}
              for (st, variant, reason), rs in sorted(reasons.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
    return counts, groups


def _fastest(res):
    """Per facet (mask, context) and n, in the tables' order: the fastest measured attnbench row, exact or not, of
    any dtype or SIMD target (its series names them when they vary); the peer left out as in best_exact."""
    rows = [r for r in res.ok if r.source == "attnbench"]
    fastest = fastest_by(rows, lambda r: (r.mask, res.rest_key(r), r.seq_kv))
    return [{"mask": mask, "context": res.rest_title(rk), "seq_kv": n, "series": r.label, "exact": r.exact,
             "time_ms": json_num(r.time_median), "noisy": r.noisy, "id": r.id}
            for (mask, rk, n), r in sorted(fastest.items(), key=lambda kv: (mask_order(kv[0][0]),
                                                                            res.facet_key_order(kv[0][1]), kv[0][2]))]


def _key_figures(res, table_series):
    out = []
    for (label, mask, rk), rows in table_series:
        last = rows[-1]
        # The output's error for a forward series, the gradient's (worst of dQ, dK, dV) for a backward one
        worst_err = worst([r.pass_error() for r in rows])
        mem, estimated = last.memory()
        out.append({"series": label, "mask": mask, "context": res.rest_title(rk), "source": last.source,
                    "params": last.params_text, "exact": last.exact, "max_n": last.seq_kv,  # the rest: at max_n
                    "time_ms": json_num(last.time_median), "gflops": json_num(last.gflops),
                    "frac_sgemm": json_num(last.frac_sgemm), "frac_peak": json_num(last.frac_peak),
                    "frac_sgemm_ci": list(last.frac_sgemm_ci) if last.frac_sgemm_ci else None,
                    "frac_sgemm_in_group": bool(last.group_sgemm_gflops),
                    "memory_bytes": mem, "memory_estimated": estimated, "worst_rel_l2_err": json_num(worst_err),
                    "noisy": last.noisy})  # the row at max_n stayed above the interference threshold
    return out


def _best_exact_list(fastest, least_mem):
    out = []
    for k, r in fastest.items():
        m = least_mem.get(k)
        out.append(dict(zip(POINT_FIELDS, k), fastest=r.id, time_ms=json_num(r.time_median),
                        least_memory=m[1].id if m else None, memory_bytes=m[0] if m else None))
    return out


def _pareto(res, fastest):
    cells = {}
    for r in res.ok:
        base = fastest.get(point_key(r))
        err = r.pass_error()  # a backward row's is its gradient's (worst of dQ, dK, dV)
        if base is None or err is None or not math.isfinite(err):
            continue
        cells.setdefault((r.mask, res.rest_key(r)), []).append(
            {"series": r.label, "seq_kv": r.seq_kv, "exact": r.exact, "rel_l2_err": err,
             "speedup": base.time_median / r.time_median})
    out = []
    for (mask, rk), pts in cells.items():
        # The front: points no other point beats on both error (lower) and speed-up (higher).
        front, best = [], -math.inf
        for i in sorted(range(len(pts)), key=lambda i: (max(pts[i]["rel_l2_err"], ERR_FLOOR), -pts[i]["speedup"])):
            if pts[i]["speedup"] > best:
                front.append(i)
                best = pts[i]["speedup"]
        for p in pts:
            p["speedup"] = json_num(p["speedup"])
        out.append({"mask": mask, "context": res.rest_title(rk), "points": pts, "front": front})
    return out


def _roofline(res):
    """The roofline: one panel per thread count with measured rows that have bytes, each with the run's two
    ceilings at that thread count (None when meta.json lacks them), its points, and where each variant comes
    closest to either ceiling."""
    rows = [r for r in res.ok if r.bytes and r.bytes > 0 and r.flops and r.flops > 0 and r.gflops]
    missing = []
    if not rows:
        missing.append("no measured row has `bytes` (results written before attnbench recorded each variant's "
                       "bytes_moved, #13)" if res.ok else "no measured row")
    threads = sorted({r.threads for r in rows}, key=lambda t: (t is None, t))
    if rows and not res.bandwidth:
        missing.append("meta.json has no `memory_bandwidth` calibration: no bandwidth ceiling or frac_bandwidth")
    elif rows and any(t not in res.bandwidth for t in threads):
        missing.append("meta.json has no `memory_bandwidth` for "
                       + ", ".join(f"{t} thread(s)" for t in threads if t not in res.bandwidth))
    if rows and any(t not in res.calibration for t in threads):
        missing.append("meta.json has no `sgemm_calibration` for "
                       + ", ".join(f"{t} thread(s)" for t in threads if t not in res.calibration))
    panels = []
    for t in threads:
        mine = [r for r in rows if r.threads == t]
        bw = res.bandwidth.get(t)
        # The compute ceiling is the sgemm each row was divided by (timed in its own rounds, or the calibration
        # it names), not one figure from the start of the run: the panel draws their median and range.
        own = {id(r): r.sgemm_denominator(res) for r in mine}
        dens = sorted(v for v in own.values() if v)
        sg = _median(dens)
        pts = [{"id": r.id, "series": r.label, "variant": r.variant, "pass": r.pass_, "kv_heads": r.kv_heads, "heads": r.heads,
                "mask": r.mask, "seq_q": r.seq_q, "seq_kv": r.seq_kv, "intensity": r.flops / r.bytes,
                "gflops": json_num(r.gflops), "gbytes_per_s": json_num(r.gbytes_per_s),
                "frac_bandwidth": json_num(r.frac_bandwidth), "frac_sgemm": json_num(r.frac_sgemm),
                "sgemm_gflops": json_num(own[id(r)]),
                # which ceiling is the lower at its intensity: what bounds it on this machine
                "bound": (None if not own[id(r)] or bw is None else
                          "memory" if bw * r.flops / r.bytes < own[id(r)] else "compute")}
               for r in mine]
        panels.append({"threads": t, "sgemm_gflops": sg,
                       "sgemm_gflops_range": [dens[0], dens[-1]] if dens else None,
                       "sgemm_in_group_rows": sum(1 for r in mine if r.group_sgemm_gflops),
                       "bandwidth_gbytes_per_s": bw,
                       "ridge_intensity": sg / bw if sg and bw else None, "points": pts})
    best = []
    for variant, p in sorted({(r.variant, r.pass_) for r in rows}, key=lambda vp: (vp[0], pass_order(vp[1]))):
        mine = [r for r in rows if r.variant == variant and r.pass_ == p]
        fb = [r for r in mine if r.frac_bandwidth is not None and math.isfinite(r.frac_bandwidth)]
        fs = [r for r in mine if r.frac_sgemm is not None and math.isfinite(r.frac_sgemm)]
        b = max(fb, key=lambda r: r.frac_bandwidth) if fb else None
        s = max(fs, key=lambda r: r.frac_sgemm) if fs else None
        best.append({"variant": variant, "pass": p, "rows": len(mine),
                     "best_frac_bandwidth": b.frac_bandwidth if b else None, "at_bandwidth": b.id if b else None,
                     "gbytes_per_s": b.gbytes_per_s if b else None,
                     "best_frac_sgemm": s.frac_sgemm if s else None, "at_sgemm": s.id if s else None,
                     "gflops": s.gflops if s else None})
    return {"missing": missing, "panels": panels, "best": best}


def _median(xs):
    xs = sorted(x for x in xs if x is not None and not math.isnan(x))
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


DTYPE_ORDER = {"fp32": 0, "bf16": 1, "fp16": 2}


def _dtype_rows(res):
    """The rows the dtype views compare: attnbench's measured rows, the forward ones (accuracy / accuracy_e2e are
    the forward's output errors; a backward row repeats its training forward's) unless the sweep timed no
    forward."""
    rows = [r for r in res.ok if r.source == "attnbench"]
    return [r for r in rows if r.pass_ == "forward"] or rows


def _fp32_key(r):
    """What a row's fp32 counterpart shares with it: the variant, its parameters and its point but the dtype
    (shape, mask, regime, bias, threads, target, pass)."""
    return (r.variant, r.params_text) + tuple(v for f, v in zip(POINT_FIELDS, point_key(r)) if f != "dtype")


def _accuracy_by_dtype(res):
    """Per variant x dtype (x regime, x bias when several): median and max of the kernel's max_abs_err
    (accuracy, on the rounded inputs) and the end-to-end one (accuracy_e2e, on the fp32 inputs), and the median
    time ratio against the same variant's fp32 row at the same point (same parameters, shape, mask, regime,
    bias, threads, target), where the results have one."""
    rows = _dtype_rows(res)
    several_regimes = len({r.regime for r in rows}) > 1
    several_biases = len({r.bias for r in rows}) > 1
    fp32 = {_fp32_key(r): r for r in rows if r.dtype == "fp32"}
    groups = {}
    for r in rows:
        key = (r.variant, r.dtype, r.regime if several_regimes else None, r.bias if several_biases else None)
        groups.setdefault(key, []).append(r)
    out = []
    for (variant, dtype, regime, bias), rs in sorted(
            groups.items(), key=lambda kv: (kv[0][0], DTYPE_ORDER.get(kv[0][1], 9), str(kv[0][2]), str(kv[0][3]))):
        kernel = [r.max_abs_err for r in rs if r.max_abs_err is not None]
        e2e = [r.e2e_max_abs_err for r in rs if r.e2e_max_abs_err is not None]
        ratios = []
        for r in rs:
            base = fp32.get(_fp32_key(r))
            if base is not None and base.time_median:
                ratios.append(r.time_median / base.time_median)
        worst = lambda xs: max(xs, key=lambda e: (not math.isfinite(e), e)) if xs else None  # noqa: E731
        out.append({"variant": variant, "dtype": dtype, "regime": regime, "bias": bias, "rows": len(rs),
                    "kernel_median_max_abs_err": json_num(_median(kernel)),
                    "kernel_max_max_abs_err": json_num(worst(kernel)),
                    "e2e_median_max_abs_err": json_num(_median(e2e)), "e2e_max_max_abs_err": json_num(worst(e2e)),
                    "time_ratio_vs_fp32": json_num(_median(ratios)) if dtype != "fp32" else None,
                    "time_ratio_points": len(ratios) if dtype != "fp32" else 0})
    return out


def _dtype_vs_fp32(res):
    """The storage-dtype view, None unless the rows _dtype_rows picks have more than one dtype: per series of a
    dtype other than fp32 (its label names the dtype and the parameters that vary, e.g.
    "tiled(bf16_kernel=native) [bf16]"; a series per mask and setting, as in every figure), at each n: its
    speed-up over the same variant's fp32 row at the same point (_fp32_key: same parameters, shape, mask,
    regime, bias, threads, target), time_fp32 / time_dtype (> 1: faster than fp32; _ratio: the median of the
    round-by-round ratios with its interval when both were timed in one interleaved group, else the ratio of the
    medians), its kernel (accuracy) and end-to-end (accuracy_e2e) max_abs_err, and the fp32 row's max_abs_err
    (the floor: fp32 rounding alone). A point without an fp32 counterpart has its errors and no speed-up."""
    rows = _dtype_rows(res)
    dtypes = {r.dtype for r in rows}
    if len(dtypes) < 2:
        return None
    fp32 = {_fp32_key(r): r for r in rows if r.dtype == "fp32"}
    out = []
    for (label, mask, rk), rs in sorted(res.series(rows).items(),
                                        key=lambda kv: (mask_order(kv[0][1]), res.series_order(kv[0]))):
        if rs[0].dtype == "fp32":
            continue
        pts, against = [], []
        for r in rs:
            base = fp32.get(_fp32_key(r))
            speed = _ratio("dtype", base, r, {}, {}, mask, "") if base is not None and base.time_median else None
            if base is not None and base.label not in against:
                against.append(base.label)
            pts.append({"seq_kv": r.seq_kv, "id": r.id, "fp32_id": base.id if base else None,
                        "fp32_series": base.label if base else None,
                        "time_ms": json_num(r.time_median),
                        "fp32_time_ms": json_num(base.time_median) if base else None,
                        "speedup": speed["ratio"] if speed else None,
                        "speedup_interval": speed["interval"] if speed else None,
                        "method": speed["method"] if speed else None,
                        "kernel_max_abs_err": json_num(r.max_abs_err), "e2e_max_abs_err": json_num(r.e2e_max_abs_err),
                        "fp32_max_abs_err": json_num(base.max_abs_err) if base else None,
                        "noisy": r.noisy, "fp32_noisy": base.noisy if base else None})
        out.append({"series": label, "variant": rs[0].variant, "dtype": rs[0].dtype, "params": rs[0].params_text,
                    "mask": mask, "context": res.rest_title(rk), "fp32_series": against, "points": pts})
    return {"dtypes": sorted(dtypes, key=lambda d: (DTYPE_ORDER.get(d, 9), d)),
            "passes": sorted({r.pass_ for r in rows}, key=pass_order), "series": out}


MAX_RATIOS_PER_KIND = 16  # rows of the key-ratios table per kind of comparison
MAX_IDS = 20  # row ids listed per count in the measurement conditions
DEFAULT_MAX_INTERFERENCE = 0.05  # measure.max_interference when the config does not set it


def _setting(r, drop=None):
    """Everything that defines a row's point but n and `drop` (mask or threads): the mask, the context
    dimensions (seq_q only when it differs from n), the target, dtype and bias."""
    return ((None if drop == "mask" else r.mask),) \
        + tuple(context_value(r, d) for d in CONTEXT_DIMS if d != drop) + (r.isa, r.dtype, r.bias)


def _context_text(res, r, drop=None):
    return ", ".join(f"{d}={context_value(r, d)}" for d in res.varying
                     if d != drop and context_value(r, d) is not None)


def _side(r, **what):
    ci = r.time_ci()
    return dict(what, series=r.label, id=r.id, median_ms=json_num(r.time_median), ci_ms=list(ci) if ci else None,
                ci_level=r.ci_level if ci else None, noisy=r.noisy)


def median_interval(xs, level=0.95):
    """The distribution-free interval of the median of xs, as attnbench's median_interval: [x(l), x(n+1-l)]
    with l the largest rank whose exact coverage 1 - 2 P(Binomial(n, 1/2) <= l - 1) is at least `level`.
    (lo, hi, coverage), or None below 6 values (even [min, max] covers less than 95% then)."""
    x = sorted(xs)
    n = len(x)
    best, total, term, cum = None, 2 ** n, 1, 0  # exact integers: term = C(n, l - 1), cum = sum up to it
    for l in range(1, (n + 1) // 2 + 1):
        cum += term
        term = term * (n - l + 1) // l
        coverage = 1.0 - 2.0 * (cum / total)
        if coverage < level:
            break
        best = (x[l - 1], x[n - l], coverage)
    return best


def paired_ratios(a, b):
    """A's and B's samples divided round by round when both rows were timed in one interleaved group (sample r
    of each from round r); None otherwise."""
    if not a.interleave_group or a.interleave_group != b.interleave_group:
        return None
    n = min(len(a.samples), len(b.samples))
    ratios = [a.samples[r] / b.samples[r] for r in range(n) if b.samples[r] > 0]
    return ratios if len(ratios) == n and n > 0 else None


def _ratio(kind, a, b, a_what, b_what, mask, context):
    """A / B. Timed in one interleaved group: the median of the round-by-round ratios and its own
    distribution-free interval (a drift of the machine during the group cancels in every ratio). Otherwise the
    ratio of the median times and the conservative interval [lo_a / hi_b, hi_a / lo_b] from the two intervals
    of the medians. Significant when the interval leaves out 1 (paired) or the two intervals are apart."""
    paired = paired_ratios(a, b)
    ci = median_interval(paired) if paired else None
    if ci:
        ratio = _median(paired)
        interval = [ci[0], ci[1]]
        significant = "yes" if ci[0] > 1 or ci[1] < 1 else "no (interval holds 1)"
        method = "paired"
    else:
        ratio = a.time_median / b.time_median
        ca, cb = a.time_ci(), b.time_ci()
        if ca and cb:
            interval = [ca[0] / cb[1], ca[1] / cb[0]]
            significant = "yes" if ca[0] > cb[1] or cb[0] > ca[1] else "no (intervals overlap)"
        else:
            interval, significant = None, "—"
        method = "medians"
    return {"kind": kind, "mask": mask, "context": context, "seq_kv": a.seq_kv, "a": _side(a, **a_what),
            "b": _side(b, **b_what), "ratio": json_num(ratio), "interval": interval, "method": method,
            "pairs": len(paired) if ci else None, "significant": significant}


def _largest(pairs):
    """{reduce key: (sort key, a, b)} of the pairs at the largest n per reduce key, in sort-key order."""
    best = {}
    for key, order, a, b in pairs:
        if key not in best or a.seq_kv > best[key][1].seq_kv:
            best[key] = (order, a, b)
    return sorted(best.values(), key=lambda v: v[0])


def _baseline_rank(r):
    # B of "A vs B": an exact variant before an approximate one, then the one with no parameters (the plain
    # reference, e.g. naive), then by name.
    return (not r.exact, len(r.params), r.label)


def _key_ratios(res):
    """The ratios users compare, each at the largest n both rows have, attnbench rows only (the PyTorch peer
    has no interval): every pair of series at the same point (variants), each mask against none for the same
    series (mask), each thread count against the smallest for the same series and point (threads)."""
    rows = [r for r in res.ok if r.source == "attnbench" and r.time_median and r.time_median > 0]
    found = {"variants": [], "mask": [], "threads": []}
    if res.by_pass():  # several passes: each against the forward of the same series and point
        found["pass"] = []
    by = {}
    for r in rows:
        by.setdefault((_setting(r), r.seq_kv), {})[r.label] = r
    for (setting, _), cell in by.items():
        for i, la in enumerate(sorted(cell)):
            for lb in sorted(cell)[i + 1:]:
                a, b = sorted((cell[la], cell[lb]), key=_baseline_rank, reverse=True)
                order = (mask_order(a.mask), res.facet_key_order(res.rest_key(a)), _baseline_rank(b), _baseline_rank(a))
                found["variants"].append(((a.label, b.label, setting), order, a, b))
    for drop, kind in (("mask", "mask"), ("threads", "threads"), ("pass", "pass")):
        if kind not in found:
            continue
        by = {}
        for r in rows:
            by.setdefault((r.label, _setting(r, drop), r.seq_kv), {})[context_value(r, drop)] = r
        for (label, setting, _), cell in by.items():
            if drop == "mask":
                base = cell.get("none")
                others = [m for m in sorted(cell, key=mask_order) if m != "none"]
            elif drop == "pass":
                base = cell.get("forward")
                others = [p for p in sorted(cell, key=pass_order) if p != "forward"]
            else:
                t0 = min((t for t in cell if t is not None), default=None)
                base = cell.get(t0)
                others = sorted(t for t in cell if t is not None and t != t0)
            for v in (others if base is not None else []):
                a = cell[v]
                order = (facet_order(tuple(pass_order(a.pass_) if d == "pass" else context_value(a, d)
                                           for d in res.varying if d != drop)), label,
                         mask_order(v) if drop == "mask" else mask_order(a.mask),
                         v if drop == "threads" else pass_order(v) if drop == "pass" else 0)
                found[kind].append(((label, v, setting), order, a, base))
    out, counts = [], {}
    for kind, pairs in found.items():
        chosen = _largest(pairs)
        counts[kind] = len(chosen)
        for _, a, b in chosen[:MAX_RATIOS_PER_KIND]:
            if kind == "variants":
                out.append(_ratio(kind, a, b, {}, {}, a.mask, _context_text(res, a)))
            elif kind == "mask":
                out.append(_ratio(kind, a, b, {"mask": a.mask}, {"mask": b.mask}, None, _context_text(res, a)))
            elif kind == "pass":
                out.append(_ratio(kind, a, b, {"pass": a.pass_}, {"pass": b.pass_}, a.mask,
                                  _context_text(res, a, "pass")))
            else:
                out.append(_ratio(kind, a, b, {"threads": a.threads}, {"threads": b.threads}, a.mask,
                                  _context_text(res, a, "threads")))
    return {"limit_per_kind": MAX_RATIOS_PER_KIND, "counts": counts,
            "shown": {k: min(c, MAX_RATIOS_PER_KIND) for k, c in counts.items()}, "rows": out}


def _pass_side(r):
    """One pass's figures at a point for the training table: None when the pass was not measured there."""
    if r is None:
        return None
    mem, est = r.memory()
    return {"id": r.id, "time_ms": json_num(r.time_median), "gflops": json_num(r.gflops),
            "frac_peak": json_num(r.frac_peak), "frac_sgemm": json_num(r.frac_sgemm), "flops": r.flops,
            "memory_bytes": mem, "memory_estimated": est, "noisy": r.noisy}


def _pass_ratio(a, b):
    """a's time over b's (b the forward at the same point): paired round by round when they were timed in one
    interleaved group, else the ratio of the medians (see _ratio)."""
    if a is None or b is None or not a.time_median or not b.time_median:
        return None
    full = _ratio("pass", a, b, {}, {}, a.mask, "")
    return {k: full[k] for k in ("ratio", "interval", "method", "pairs", "significant")}


def _grad_error(rows):
    """The gradient errors of a point: the worst rel_l2_err of dQ, dK, dV over its backward and training-step
    rows that compared one, with the reference kind; else the reference kind they name ("none") and no error."""
    compared = [r for r in rows if r is not None and r.grad_rel_l2()[0] is not None]
    if not compared:
        refs = sorted({r.grad_reference for r in rows if r is not None and r.grad_reference})
        return {"reference": refs[0] if refs else None, "blocks": None, "rel_l2_err": None, "part": None,
                "max_abs_err": None, "nonfinite": None, "pass": None}
    r = max(compared, key=lambda r: (not math.isfinite(r.grad_rel_l2()[0]),
                                     r.grad_rel_l2()[0] if math.isfinite(r.grad_rel_l2()[0]) else 0.0))
    err, part = r.grad_rel_l2()
    nonfinite = [x.grad_nonfinite() for x in compared if x.grad_nonfinite() is not None]
    return {"reference": r.grad_reference, "blocks": r.grad_blocks, "rel_l2_err": json_num(err), "part": part,
            "max_abs_err": json_num(worst([x.grad[p]["max_abs_err"] for x in compared for p in x.grad])),
            "nonfinite": max(nonfinite) if nonfinite else None, "pass": r.pass_}


def _ratio_stats(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return {"median": _median(xs), "min": min(xs), "max": max(xs), "points": len(xs)} if xs else None


def _training(res):
    """The training view, None when every row is a forward row: per series (one pass-less facet) and n
    that timed a backward or a training step, each pass's figures, the backward's and the training step's time
    over the forward's, the gradient errors and each pass's peak memory; the passes' FLOP ratios to the
    forward (the FLOP convention, as measured); and the rows of backward passes left out, once per variant and
    reason."""
    if all(p == "forward" for p in res.all_passes):
        return None
    cells = {}
    for r in res.ok:
        if r.source != "attnbench":
            continue
        base = res.split_pass(res.rest_key(r))[1]
        cells.setdefault((r.label, r.mask, base), {}).setdefault(r.seq_kv, {})[r.pass_] = r
    trained = {k: v for k, v in cells.items() if any(p != "forward" for cell in v.values() for p in cell)}
    out, flops = [], {"backward": [], "forward_backward": []}
    for (label, mask, base) in sorted(trained, key=lambda k: (mask_order(k[1]), k[0], facet_order(k[2]))):
        for n, cell in sorted(trained[(label, mask, base)].items()):
            f, b, fb = cell.get("forward"), cell.get("backward"), cell.get("forward_backward")
            for p, r in (("backward", b), ("forward_backward", fb)):
                if r is not None and f is not None and r.flops and f.flops:
                    flops[p].append(r.flops / f.flops)
            any_row = f or b or fb
            out.append({"series": label, "variant": any_row.variant, "exact": any_row.exact, "mask": mask,
                        "context": res.base_title(base), "seq_kv": n, "forward": _pass_side(f),
                        "backward": _pass_side(b), "forward_backward": _pass_side(fb),
                        "backward_over_forward": _pass_ratio(b, f), "step_over_forward": _pass_ratio(fb, f),
                        "grad": _grad_error([b, fb])})
    left = {}
    for r in res.excluded:
        if r.pass_ == "forward" or r.source != "attnbench":
            continue
        reason = re.sub(r"\d+(\.\d+)?", "#", r.reason or "(no reason given)")
        left.setdefault((r.variant, r.status or "?", reason), []).append(r)
    left_out = [{"variant": v, "status": st, "reason": (rs[0].reason or "(no reason given)")[:200], "rows": len(rs),
                 "passes": sorted({r.pass_ for r in rs}, key=pass_order), "n": sorted({r.seq_kv for r in rs})}
                for (v, st, _), rs in sorted(left.items(), key=lambda kv: kv[0])]
    return {"passes": res.all_passes, "measured_passes": res.passes, "rows": out,
            "flops_ratio": {p: _ratio_stats(xs) for p, xs in flops.items()}, "left_out": left_out}


def _max_interference(meta):
    m = ((meta.get("config") or {}).get("measure") or {}) if isinstance(meta.get("config"), dict) else {}
    v = m.get("max_interference") if isinstance(m, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else DEFAULT_MAX_INTERFERENCE


def _calibrations(res, rows):
    """meta.json calibrations as listed (index, when, why, used, the interference score, sgemm GFLOP/s per
    thread count, how many rows divided by it) and, per thread count, the spread max / min of sgemm GFLOP/s
    across the used ones."""
    if res.calibrations is None:
        return None, []
    per_cal = {}
    for r in rows:
        if r.calibration is not None:
            per_cal[r.calibration] = per_cal.get(r.calibration, 0) + 1
    cals, used = [], {}
    for i, c in enumerate(res.calibrations):
        index = c.get("index") if isinstance(c.get("index"), int) else i
        sgemm = []
        for e in c.get("sgemm") if isinstance(c.get("sgemm"), list) else []:
            g = num(e.get("gflops")) if isinstance(e, dict) else None
            if g is not None and isinstance(e.get("threads"), int):
                sgemm.append({"threads": e["threads"], "gflops": g})
        sgemm.sort(key=lambda e: e["threads"])
        inter = c.get("interference")
        cals.append({"index": index, "timestamp": c.get("timestamp"), "after_points": c.get("after_points"),
                     "reason": c.get("reason"), "used": c.get("used") is not False,
                     "interference_score": json_num(num(inter.get("score"))) if isinstance(inter, dict) else None,
                     "sgemm": sgemm, "rows": per_cal.get(index, 0)})
        if cals[-1]["used"]:
            for e in sgemm:
                if math.isfinite(e["gflops"]) and e["gflops"] > 0:
                    used.setdefault(e["threads"], []).append(e["gflops"])
    spread = [{"threads": t, "calibrations": len(g), "min_gflops": min(g), "max_gflops": max(g),
               "max_over_min": max(g) / min(g)} for t, g in sorted(used.items())]
    return cals, spread


def _measurement(res):
    """How the rows were measured on a shared machine: intervals, re-measurements, noisy rows, the
    interference scores, why peak memory is missing, and the calibrations over the run."""
    rows = res.rows  # attnbench's (the PyTorch peer records none of it)
    ok_ids = {id(r) for r in res.ok}
    ok = [r for r in rows if id(r) in ok_ids]
    drawn_ci = sum(1 for r in res.ok if r.time_ci())
    remeasured = [r for r in rows if r.attempts > 1]
    noisy = [r for r in rows if r.noisy]
    scored = [r for r in rows if r.interference_score is not None and not math.isnan(r.interference_score)]
    worst = max(scored, key=lambda r: r.interference_score) if scored else None
    attempts = {}
    for r in rows:  # of the measured rows (a row not timed has 0 attempts)
        if r.conditions_recorded and r.attempts > 0:
            attempts[str(r.attempts)] = attempts.get(str(r.attempts), 0) + 1
    notes = {}
    for r in rows:
        if r.peak_note:
            notes[r.peak_note] = notes.get(r.peak_note, 0) + 1
    cals, spread = _calibrations(res, rows)
    return {
        "recorded": any(r.conditions_recorded for r in rows),
        "max_interference": _max_interference(res.meta),
        "rows": len(rows),
        "rows_ok": len(ok),
        "rows_with_ci": sum(1 for r in ok if r.time_ci()),
        # What the time figure's bars show: the 95% interval of the median where every drawn row has one,
        # p10-p90 where none has, both ("mixed") otherwise.
        "error_bars": "ci95" if res.ok and drawn_ci == len(res.ok) else "p10_p90" if not drawn_ci else "mixed",
        "attempts": dict(sorted(attempts.items(), key=lambda kv: int(kv[0]))),
        "remeasured": len(remeasured),
        "remeasured_ids": [r.id for r in remeasured[:MAX_IDS]],
        "noisy": len(noisy),
        "noisy_ids": [r.id for r in noisy[:MAX_IDS]],
        "interference_rows": len(scored),
        "interference_score_median": json_num(_median([r.interference_score for r in scored])),
        "interference_score_max": json_num(worst.interference_score) if worst else None,
        "interference_score_max_id": worst.id if worst else None,
        "peak_notes": [{"note": n, "rows": c} for n, c in sorted(notes.items(), key=lambda kv: (-kv[1], kv[0]))],
        "calibrations": cals,
        "calibration_spread": spread,
    }


def analyse(res):
    """Everything the figures and the report show, from the results alone (see the module docstring)."""
    series = res.sorted_series()  # the figures' order: by label, mask, facet
    # The tables' order: masks none, causal, then the rest; then by label and facet.
    table_series = sorted(series, key=lambda kv: (mask_order(kv[0][1]), res.series_order(kv[0])))
    fastest, least_mem = best_exact(res)
    counts, groups = _excluded(res)
    return {
        "results_dir": os.path.abspath(res.dir),
        "rows_ok": len(res.ok),
        "rows_excluded": len(res.excluded),
        "fits": _fits(res, series),
        "nonfinite_accuracy_points": _nonfinite_accuracy(series),
        "crossover": _crossovers(res, table_series, fastest, least_mem),
        "excluded": counts,
        "excluded_reasons": groups,
        "key_figures": _key_figures(res, table_series),
        "best_exact": _best_exact_list(fastest, least_mem),
        "fastest": _fastest(res),
        "pareto": _pareto(res, fastest),
        "roofline": _roofline(res),
        "accuracy_by_dtype": _accuracy_by_dtype(res),
        "dtype_vs_fp32": _dtype_vs_fp32(res),
        "key_ratios": _key_ratios(res),
        "measurement": _measurement(res),
        "training": _training(res),
        "decode": _decode(res, table_series, fastest),
        "phases": _phases(res, table_series, fastest),
        "mla": analyze_mla(res.mla_rows, [r for r in res.ok if r.is_decode() and r.pass_ == "forward"]),
        "chunk_sweep": _chunk_sweep(res),
        "accuracy_references": _accuracy_references(res, table_series),
        "patterns": patterns_summary(res.patterns) if res.patterns else None,
    }
