"""Reading a results folder: results.jsonl (attnbench's rows), results.peers.jsonl (the PyTorch peer's rows,
optional) and meta.json into Row objects, grouped into the series and facets every figure and table shares;
and a patterns/ folder (`attnbench patterns`, read by patterns.py). The row fields are configs/README.md's
"Result rows".

Bad input raises InputError naming the file (and line): plot.py reports it and exits 2. Needs numpy only for
the patterns' .npy files; no matplotlib.
"""
import json
import math
import os
import sys

from .common import PROG, InputError, num
from .mla import read_mla
from .patterns import load_patterns

# Besides mask and n. "pass" (forward, backward, forward_backward) comes first: when a sweep has several,
# every curve, facet and comparison is within one pass, and the figures give each pass its own column.
CONTEXT_DIMS = ["pass", "regime", "batch", "heads", "kv_heads", "head_dim", "v_head_dim", "threads", "seq_q"]
# The passes a row can time (sweep.pass), in the order the figures and tables show them; rows written before
# the field are forward rows.
PASSES = ["forward", "backward", "forward_backward"]
PASS_TITLES = {"forward": "forward", "backward": "backward (dQ, dK, dV)",
               "forward_backward": "forward + backward (training step)"}
GRAD_PARTS = ("dq", "dk", "dv")


def pass_order(p):
    return (PASSES.index(p), "") if p in PASSES else (len(PASSES), str(p))


def pass_short(p):
    """A pass's name for a bracket in a title: "forward", "backward", "forward + backward"."""
    return {"forward_backward": "forward + backward"}.get(p, str(p))


def pass_title(p):
    return PASS_TITLES.get(p, str(p))


def passes_text(passes):
    """'forward', 'forward and backward (dQ, dK, dV)', 'forward, backward (dQ, dK, dV) and forward + backward
    (training step)': what a figure's title says its rows time."""
    names = [pass_title(p) for p in sorted(passes, key=pass_order)] or ["forward"]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def read_jsonl(path):
    """Rows of a results .jsonl as dicts, last row per id wins (as the C++ reader). A torn last line (a crash
    mid-write) is dropped with a warning; a bad line anywhere else is an error naming file:line."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    rows, by_id = [], {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        is_tail = all(not rest.strip() for rest in lines[no:])
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "id" not in row or "status" not in row:
                raise ValueError("not a result row (needs 'id' and 'status')")
        except ValueError as e:
            if is_tail:
                print(f"{PROG}: warning: {path}:{no}: torn last line dropped ({e})", file=sys.stderr)
                break
            raise InputError(f"{path}:{no}: not a result row: {e}")
        by_id[row["id"]] = len(rows)
        rows.append(row)
    return [r for i, r in enumerate(rows) if by_id[r["id"]] == i]


# The row's fields as attnbench declares them (`attnbench info --row-fields --json`, the one declaration
# bench/lib/result_row.cpp writes and reads by): dotted path -> JSON type ("number|null", "integer", ...).
# Rows are read through it; a field the schema does not declare is never read.
SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "row_schema.json")


def _load_schema():
    with open(SCHEMA_PATH, encoding="utf-8") as f:
        return {e["field"]: e["type"] for e in json.load(f)}


ROW_SCHEMA = _load_schema()


def _typed(value, type_):
    """A JSON value as the schema types it; None when absent or of another type. Numbers read the strings
    "inf"/"-inf"/"nan" the sweep writes for non-finite values (JSON has none) as floats."""
    if value is None:
        return None
    kinds = type_.split("|")
    if "number" in kinds and num(value) is not None:
        return num(value)
    if "integer" in kinds and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value  # a float where an integer is declared (hand-written rows) reads as the number it is
    for kind, py in (("string", str), ("boolean", bool), ("object", dict), ("array", list)):
        if kind in kinds and isinstance(value, py):
            return value
    return None


def read_fields(d):
    """Every schema field of a row dict, typed: {dotted path: value or None}."""
    out = {}
    for path, type_ in ROW_SCHEMA.items():
        v = d
        for part in path.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        out[path] = _typed(v, type_)
    return out


# Row attributes that are one schema field: attribute -> (path, the value when the row lacks it: rows written
# before a field existed read as what it then was: fp32 storage, no bias, no RoPE, the forward pass).
VIEWS = {
    "id": ("id", None), "status": ("status", None), "variant": ("variant", None), "seq_kv": ("seq_kv", None),
    "mask": ("mask", None), "params": ("params", {}), "batch": ("batch", None), "heads": ("heads", None),
    "seq_q": ("seq_q", None), "head_dim": ("head_dim", None), "regime": ("regime", None),
    "threads": ("threads", None), "isa": ("isa", None), "exact": ("exact", False), "reason": ("reason", ""),
    "time_median": ("time_ms.median", None), "time_p10": ("time_ms.p10", None),
    "time_p90": ("time_ms.p90", None), "gflops": ("gflops", None), "frac_sgemm": ("frac_sgemm", None),
    "frac_peak": ("frac_peak", None), "flops": ("flops", None), "bytes": ("bytes", None),
    "gbytes_per_s": ("gbytes_per_s", None), "frac_bandwidth": ("frac_bandwidth", None),
    "rel_l2_err": ("accuracy.rel_l2_err", None), "max_abs_err": ("accuracy.max_abs_err", None),
    "dtype": ("dtype", "fp32"), "bias": ("bias", "none"), "rope": ("rope", "none"), "rope_ms": ("rope_ms", None),
    "peak_bytes": ("memory.peak_bytes", None), "peak_note": ("memory.peak_note", ""),
    "estimated_bytes": ("memory.estimated_bytes", None), "ci_lo": ("time_ms.ci_lo", None),
    "ci_hi": ("time_ms.ci_hi", None), "ci_level": ("time_ms.ci_level", None),
    "interference_score": ("interference.score", None), "noisy": ("noisy", False),
    "calibration": ("calibration", None), "group_sgemm_gflops": ("group_sgemm.gflops", None),
    "interleave_group": ("interleave.group", None), "pass_": ("pass", "forward"),
    "grad_reference": ("grad_accuracy.reference", None), "grad_blocks": ("grad_accuracy.blocks", None),
    # The distance from exact softmax attention, beside `accuracy` for a variant whose `accuracy` is against its
    # own fp64 definition (softmax variants: the same figures); None in rows written before it.
    "softmax_rel_l2_err": ("accuracy_vs_softmax.rel_l2_err", None),
    "softmax_max_abs_err": ("accuracy_vs_softmax.max_abs_err", None),
    # What a decode keeps between steps at the row's context, and the KV cache exact attention keeps there.
    "state_bytes": ("memory.state_bytes", None), "kv_cache_bytes": ("memory.kv_cache_bytes", None),
}
_missing = sorted(path for path, _ in VIEWS.values() if path not in ROW_SCHEMA)
if _missing:  # a renamed or removed field: fail on import, not with silently empty plots
    raise RuntimeError(f"{SCHEMA_PATH} lacks the fields {', '.join(_missing)} that plotlib reads")


# The fields that say how a point was measured on a shared machine; a row with none of them was written
# before attnbench recorded interference.
CONDITION_FIELDS = ("interference", "attempts", "noisy")


def _pair(lo, hi):
    """(lo, hi) when both are finite and ordered, else None."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
        return None
    return lo, hi


def _sub_fields(f, prefix):
    """The schema fields under prefix ("interference." ...) as a dict, None when the row has none of them."""
    sub = {k[len(prefix):]: v for k, v in f.items() if k.startswith(prefix)}
    return sub if any(v is not None for v in sub.values()) else None


def _badness(e):
    return (not math.isfinite(e), e if math.isfinite(e) else 0.0)


def worst(xs):
    """The largest of xs with non-finite values (inf, nan) worst of all; None when xs is empty."""
    xs = [x for x in xs if x is not None]
    return max(xs, key=_badness) if xs else None


class Row:
    """One result row, read through the schema: `fields` holds every declared field (dotted path -> typed
    value, None when absent), and the VIEWS attributes name the ones the figures use. Metrics are floats
    (inf/nan from the rows' "inf"/"nan" strings). Besides them:
      source: "attnbench" (results.jsonl) or "peer" (results.peers.jsonl);
      kv_heads: K/V heads (rows without the field: heads); v_head_dim: d_v (rows without it: head_dim);
        e2e_max_abs_err: accuracy_e2e.max_abs_err, the
        error against fp64 on the fp32 inputs (rows without it: accuracy's);
      samples: every repetition in ms; interference: the probe's readings as a dict (None: not measured);
      attempts: timed measurements (rows without the field: 1 when measured, 0 when not); conditions_recorded:
        the row has interference / attempts / noisy; frac_sgemm_ci: group_sgemm's 95% interval of frac_sgemm;
      grad: per dq / dk / dv, max_abs_err, rel_l2_err, nan_count, inf_count (empty: no grad_accuracy);
      label: the series it belongs to, params_text: every parameter as "k=v,k=v", label_keys / label_tags: the
        parameters and the [isa, dtype, bias] tags its label names (set by Results; series_label rebuilds it)."""

    def __init__(self, d, source):
        f = read_fields(d)
        self.fields = f
        for attr, (path, default) in VIEWS.items():
            setattr(self, attr, f[path] if f[path] is not None else default)
        self.source = source
        self.kv_heads = f["kv_heads"] if f["kv_heads"] is not None else self.heads
        self.v_head_dim = f["v_head_dim"] if f["v_head_dim"] is not None else self.head_dim
        e2e = f["accuracy_e2e.max_abs_err"]
        self.e2e_max_abs_err = e2e if isinstance(d.get("accuracy_e2e"), dict) else self.max_abs_err
        self.samples = [x for x in (num(s) for s in f["time_ms.samples"] or []) if x is not None]
        self.interference = _sub_fields(f, "interference.") if isinstance(d.get("interference"), dict) else None
        self.conditions_recorded = any(k in d for k in CONDITION_FIELDS)
        measured = self.status == "ok" or (f["time_ms.reps"] or 0) > 0
        self.attempts = f["attempts"] if f["attempts"] is not None else (1 if measured else 0)
        self.frac_sgemm_ci = _pair(f["group_sgemm.frac_ci_lo"], f["group_sgemm.frac_ci_hi"])
        self.grad = {} if not isinstance(d.get("grad_accuracy"), dict) else {
            part: {m: f[f"grad_accuracy.{part}.{m}"] for m in ("max_abs_err", "rel_l2_err", "nan_count", "inf_count")}
            for part in GRAD_PARTS}
        self.label = ""
        self.params_text = ""
        self.label_keys, self.label_tags = [], []

    @classmethod
    def from_json(cls, d, source):
        return cls(d, source)

    def sgemm_denominator(self, res):
        """The sgemm GFLOP/s this row's frac_sgemm is relative to: the sgemm timed in its own rounds, else the
        calibration it names (meta.json calibrations), else the run's first calibration; None when unknown."""
        if self.group_sgemm_gflops:
            return self.group_sgemm_gflops
        cals = res.calibrations or []
        if self.calibration is not None and 0 <= self.calibration < len(cals):
            for c in cals[self.calibration].get("sgemm") or []:
                if isinstance(c, dict) and c.get("threads") == self.threads and num(c.get("gflops")):
                    return num(c["gflops"])
        return res.calibration.get(self.threads)

    def time_ci(self):
        """(lo, hi) of the 95% interval of the median time, or None when the row has none (fewer than 6
        repetitions, or written before intervals were recorded)."""
        lo, hi = self.ci_lo, self.ci_hi
        if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi < lo:
            return None
        return lo, hi

    def grad_rel_l2(self):
        """(the worst rel_l2_err of dQ, dK, dV, which of them: "dq", "dk" or "dv") against exact attention's fp64
        gradient; (None, None) when no gradient was compared."""
        if self.grad_reference in (None, "none"):
            return None, None
        errs = [(e["rel_l2_err"], part) for part, e in self.grad.items() if e.get("rel_l2_err") is not None]
        return max(errs, key=lambda t: _badness(t[0])) if errs else (None, None)

    def grad_nonfinite(self):
        """NaN + Inf values counted in the compared dQ, dK, dV (None when not counted)."""
        counts = [e.get(k) for e in self.grad.values() for k in ("nan_count", "inf_count") if e.get(k) is not None]
        return sum(counts) if counts else None

    def pass_error(self):
        """The error a row's pass is judged by: for a forward row the output's distance from exact softmax
        attention (accuracy_vs_softmax where the row has it: a recurrence's `accuracy` is against its own
        definition, and the accuracy plots and the Pareto compare every variant with softmax; else accuracy),
        the worst gradient rel_l2_err (dQ, dK, dV) for a backward or training-step row (None when no gradient
        was compared)."""
        if self.pass_ != "forward":
            return self.grad_rel_l2()[0]
        return self.softmax_rel_l2_err if self.softmax_rel_l2_err is not None else self.rel_l2_err

    def is_decode(self):
        """A decode step: fewer queries than keys under the lower-right causal mask (the last query sees every
        key), the queries being the newest tokens of the context seq_kv."""
        return (self.mask == "causal_lower_right" and self.seq_q is not None and self.seq_kv is not None
                and self.seq_q < self.seq_kv)

    def memory(self):
        """Peak bytes measured, else the estimate; and whether it was estimated."""
        if self.peak_bytes is not None and self.peak_bytes > 0:
            return self.peak_bytes, False
        est = self.estimated_bytes
        return (est, True) if est is not None and est > 0 else (None, False)


def series_label(variant, params, keys, tags):
    """A series' name: the variant, the parameters `keys` that vary ("gla(chunk=64,form=chunk)") and the tags
    ("tiled [avx2, bf16]")."""
    label = variant + (f"({params_text(params, keys)})" if keys else "")
    return label + (f" [{', '.join(tags)}]" if tags else "")


def params_text(params, keys=None):
    if not params:
        return ""
    keys = sorted(params) if keys is None else keys
    return ",".join(f"{k}={value_text(params[k])}" for k in keys if k in params)


def value_text(v):
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))


def context_value(r, dim):
    if dim == "pass":
        return r.pass_
    if dim == "seq_q":  # cross-attention: n on the x axis is seq_kv, each seq_q is its own facet
        return r.seq_q if r.seq_q != r.seq_kv else None
    if dim == "kv_heads":  # grouped-query attention: its own facet; multi-head rows (kv_heads = heads) have none
        return r.kv_heads if r.kv_heads != r.heads else None
    if dim == "v_head_dim":  # d_v != d_k: its own facet; rows with V as wide as Q and K have none
        return r.v_head_dim if r.v_head_dim != r.head_dim else None
    return getattr(r, dim)


def mask_order(m):
    return (0 if m == "none" else 1 if m == "causal" else 2, m)


def facet_order(key):
    """Sort key of a facet (rest_key) or series key tuple: None first, so a dimension that is None in some rows
    (seq_q equal to seq_kv in a cross-attention sweep) sorts instead of failing; values of one type compare as
    they are."""
    return tuple((0,) if v is None else (1, facet_order(v) if isinstance(v, tuple) else v) for v in key)


class Results:
    """All rows of a results folder (attnbench's and the peer's), with the series and facet structure the
    figures and tables share: `ok` (measured, drawn) and `excluded` (everything else), both in file order."""

    def __init__(self, results_dir):
        if not os.path.isdir(results_dir):
            raise InputError(f"RESULTS_DIR '{results_dir}' does not exist or is not a directory "
                             "(give the --out folder of `attnbench run`)")
        self.dir = results_dir
        main = os.path.join(results_dir, "results.jsonl")
        if not os.path.isfile(main):
            raise InputError(f"RESULTS_DIR '{results_dir}' holds no results.jsonl "
                             "(run `attnbench run CONFIG --out DIR` first, then plot DIR)")
        raw = [(d, "attnbench") for d in read_jsonl(main)]
        peers = os.path.join(results_dir, "results.peers.jsonl")
        raw += [(d, "peer") for d in (read_jsonl(peers) if os.path.isfile(peers) else [])]
        self.meta = {}
        meta_path = os.path.join(results_dir, "meta.json")
        if os.path.isfile(meta_path):
            try:
                with open(meta_path, encoding="utf-8") as f:
                    self.meta = json.load(f)
            except ValueError as e:
                raise InputError(f"{meta_path}: not valid JSON ({e})")
            if not isinstance(self.meta, dict):
                raise InputError(f"{meta_path}: must hold a JSON object")
        else:
            print(f"{PROG}: warning: {meta_path} missing: the report will not name the machine or config",
                  file=sys.stderr)
        if not raw:
            raise InputError(f"{main}: holds no result rows")
        for d, source in raw:
            for key in ("variant", "seq_kv", "mask"):
                if key not in d:
                    raise InputError(f"{main if source == 'attnbench' else peers}: row '{d['id']}' has no '{key}'")
        all_rows = [Row.from_json(d, source) for d, source in raw]
        self.rows = [r for r in all_rows if r.source == "attnbench"]
        self.peer_rows = [r for r in all_rows if r.source == "peer"]
        self.ok = [r for r in all_rows if r.status == "ok" and r.time_median]
        ok_ids = {id(r) for r in self.ok}
        self.excluded = [r for r in all_rows if id(r) not in ok_ids]
        self.calibration = {int(c["threads"]): float(c["gflops"])
                            for c in self.meta.get("sgemm_calibration", []) if "threads" in c and "gflops" in c}
        # Every sgemm / FMA-peak calibration of the run, in order (meta.json calibrations): None when the
        # folder predates it (sgemm_calibration above is the first one either way).
        cals = self.meta.get("calibrations")
        self.calibrations = [c for c in cals if isinstance(c, dict)] if isinstance(cals, list) else None
        for r in self.ok:  # peer rows carry gflops; their fraction of sgemm comes from this run's calibration
            if r.frac_sgemm is None and r.gflops and r.threads in self.calibration:
                r.frac_sgemm = r.gflops / self.calibration[r.threads]
        # The in-run memory bandwidth per thread count (meta.json memory_bandwidth; absent from older runs):
        # {"<threads>": {"gbytes_per_s": best, "median": ..., "buffer_bytes": ...}}.
        self.bandwidth = {}
        mb = self.meta.get("memory_bandwidth")
        for t, c in (mb.items() if isinstance(mb, dict) else []):
            g = num(c.get("gbytes_per_s")) if isinstance(c, dict) else None
            if g and g > 0 and str(t).isdigit():
                self.bandwidth[int(t)] = g
        for r in self.ok:  # rows with bytes but no achieved bandwidth (the peer's) get it from their time
            if r.gbytes_per_s is None and r.bytes and r.time_median:
                r.gbytes_per_s = r.bytes / (r.time_median * 1e6)
            if r.frac_bandwidth is None and r.gbytes_per_s and r.threads in self.bandwidth:
                r.frac_bandwidth = r.gbytes_per_s / self.bandwidth[r.threads]
        self._label_rows(all_rows)
        # With no measured row the figures still come out (saying "no data") next to the report's reasons.
        self.masks = sorted({r.mask for r in self.ok}, key=mask_order) or ["none"]
        self.varying = [d for d in CONTEXT_DIMS if len({context_value(r, d) for r in self.ok}) > 1]
        self.rest = sorted({self.rest_key(r) for r in self.ok}, key=str) or [()]
        # The passes (sweep.pass) among the measured rows and among all rows (skipped backward points included).
        self.passes = sorted({r.pass_ for r in self.ok}, key=pass_order) or ["forward"]
        self.all_passes = sorted({r.pass_ for r in all_rows}, key=pass_order)
        # The attention patterns (patterns.load_patterns) of a patterns/ folder beside the rows, else None.
        pdir = os.path.join(results_dir, "patterns")
        self.patterns = load_patterns(pdir) if os.path.isfile(os.path.join(pdir, "patterns.json")) else None
        # results.mla.jsonl: `attnbench mla --sweep` rows (scripts/run's MLA step), not sweep rows ([] without).
        self.mla_rows = read_mla(results_dir)

    def _label_rows(self, rows):
        # A series label names the variant and only the parameters that vary for it in these results (the
        # full parameter sets are in the key-figures table), so legends stay short.
        values = {}
        for r in rows:
            for k, v in r.params.items():
                values.setdefault((r.variant, k), set()).add(json.dumps(v, sort_keys=True))
        # A sweep over SIMD targets (sweep.isa) gives each target its own curve: "tiled [avx2]". The isa is the
        # target that ran; peer rows have none (PyTorch picks its own kernels).
        several_isas = len({r.isa for r in rows if r.isa}) > 1
        # So do storage dtypes and biases when they vary: "tiled [bf16, alibi]". RoPE is in the regime
        # label ("gaussian(std=1,rope=normal)"), so it facets like any other input regime.
        several_dtypes = len({r.dtype for r in rows}) > 1
        several_biases = len({r.bias for r in rows}) > 1
        for r in rows:
            keys = [k for k in sorted(r.params) if len(values[(r.variant, k)]) > 1]
            tags = ([r.isa] if several_isas and r.isa else []) + ([r.dtype] if several_dtypes else []) \
                + ([r.bias] if several_biases and r.bias != "none" else [])
            r.label = series_label(r.variant, r.params, keys, tags)
            r.label_keys, r.label_tags = keys, tags
            r.params_text = params_text(r.params)

    def rest_key(self, r):
        """The facet row: the context dimensions (regime, shapes, threads) that vary in these results."""
        return tuple(context_value(r, d) for d in self.varying)

    def rest_title(self, key):
        return ", ".join(f"{d}={v}" for d, v in zip(self.varying, key) if v is not None)

    def by_pass(self):
        """Several passes among the measured rows: the figures give each its own column."""
        return "pass" in self.varying

    def split_pass(self, key):
        """A facet key as (its pass, the key without it); the pass is None when passes do not vary."""
        if "pass" not in self.varying:
            return None, key
        i = self.varying.index("pass")
        return key[i], key[:i] + key[i + 1:]

    def with_pass(self, base, p):
        """The facet key of `base` (a key without the pass, from split_pass) in pass p."""
        if "pass" not in self.varying:
            return base
        i = self.varying.index("pass")
        return base[:i] + (p,) + base[i:]

    def base_title(self, base):
        """rest_title of a facet key without its pass (split_pass)."""
        dims = [d for d in self.varying if d != "pass"]
        return ", ".join(f"{d}={v}" for d, v in zip(dims, base) if v is not None)

    def facet_key_order(self, rk):
        """Sort key of a facet key (rest_key): facet_order with the passes in PASSES order (forward, backward,
        forward_backward) rather than alphabetical."""
        if "pass" in self.varying:
            i = self.varying.index("pass")
            rk = rk[:i] + (pass_order(rk[i]),) + rk[i + 1:]
        return facet_order(rk)

    def series_order(self, key):
        """Sort key of a series key (label, mask, rest_key), the passes in PASSES order."""
        return facet_order(key[:2]) + ((1, self.facet_key_order(key[2])),)  # as facet_order(key) forward-only

    def series(self, rows):
        """{(label, mask, rest_key): rows sorted by n}."""
        out = {}
        for r in rows:
            out.setdefault((r.label, r.mask, self.rest_key(r)), []).append(r)
        for v in out.values():
            v.sort(key=lambda r: r.seq_kv)
        return out

    def sorted_series(self, rows=None):
        """series(rows or ok) as (key, rows) pairs sorted by (label, mask, facet): the order of the legends."""
        return sorted(self.series(self.ok if rows is None else rows).items(), key=lambda kv: self.series_order(kv[0]))
