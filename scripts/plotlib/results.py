"""Reading a results folder: results.jsonl (attnbench's rows), results.peers.jsonl (the PyTorch peer's rows,
optional) and meta.json into Row objects, grouped into the series and facets every figure and table shares;
and reading a patterns/ folder (`attnbench patterns`). The row fields are configs/README.md's "Result rows".

Bad input raises InputError naming the file (and line): plot.py reports it and exits 2. Needs numpy only for
the patterns' .npy files; no matplotlib.
"""
import json
import math
import os
import sys
from dataclasses import dataclass, field

from .common import PROG, InputError, num

# Besides mask and n. "pass" (forward, backward, forward_backward: #27) comes first: when a sweep has several,
# every curve, facet and comparison is within one pass, and the figures give each pass its own column.
CONTEXT_DIMS = ["pass", "regime", "batch", "heads", "kv_heads", "head_dim", "threads", "seq_q"]
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


def _sub(d, key, part):
    v = d.get(key)
    return v.get(part) if isinstance(v, dict) else None


def _softmax_rel_l2(d):
    vs = num(_sub(d, "accuracy_vs_softmax", "rel_l2_err"))
    return vs if vs is not None else num(_sub(d, "accuracy", "rel_l2_err"))


# The fields that say how a point was measured on a shared machine (#18); a row with none of them was written
# before attnbench recorded interference.
CONDITION_FIELDS = ("interference", "attempts", "noisy")


def _samples(d):
    """time_ms.samples as floats (every repetition, ms); [] when absent or not a list."""
    v = _sub(d, "time_ms", "samples")
    return [x for x in (num(s) for s in v) if x is not None] if isinstance(v, list) else []


def _attempts(d):
    """attempts as an int; rows from before the field: 1 when measured, 0 when not."""
    v = d.get("attempts")
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    reps = _sub(d, "time_ms", "reps")
    return 1 if d.get("status") == "ok" or (isinstance(reps, (int, float)) and reps > 0) else 0


def _pair(lo, hi):
    """(lo, hi) when both are finite and ordered, else None."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
        return None
    return lo, hi


def _int_or_none(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _grad(d):
    """grad_accuracy as (reference, blocks, {part: {max_abs_err, rel_l2_err, nan_count, inf_count}}); the
    reference is None when the row has no grad_accuracy (forward rows from before #27), "none" when no
    gradient was compared."""
    g = d.get("grad_accuracy")
    if not isinstance(g, dict):
        return None, None, {}
    parts = {}
    for part in GRAD_PARTS:
        e = g.get(part) if isinstance(g.get(part), dict) else {}
        parts[part] = {"max_abs_err": num(e.get("max_abs_err")), "rel_l2_err": num(e.get("rel_l2_err")),
                       "nan_count": _int_or_none(e.get("nan_count")), "inf_count": _int_or_none(e.get("inf_count"))}
    ref = g.get("reference") if isinstance(g.get("reference"), str) else None
    return ref, _int_or_none(g.get("blocks")), parts


def _badness(e):
    return (not math.isfinite(e), e if math.isfinite(e) else 0.0)


def worst(xs):
    """The largest of xs with non-finite values (inf, nan) worst of all; None when xs is empty."""
    xs = [x for x in xs if x is not None]
    return max(xs, key=_badness) if xs else None


@dataclass(eq=False)
class Row:
    """One result row. Shape fields keep their JSON values (None when absent); metrics are floats (None when
    not measured, inf/nan from the rows' "inf"/"nan" strings)."""
    id: str
    status: str
    variant: str
    seq_kv: int
    mask: str
    source: str  # "attnbench" (results.jsonl) or "peer" (results.peers.jsonl)
    params: dict = field(default_factory=dict)
    batch: object = None
    heads: object = None
    kv_heads: object = None  # K/V heads; rows from before grouped-query attention have none: heads
    seq_q: object = None
    head_dim: object = None
    regime: object = None
    threads: object = None
    isa: object = None  # the SIMD target that ran; peer rows have none
    exact: bool = False
    reason: str = ""
    time_median: float = None  # time_ms.median
    time_p10: float = None
    time_p90: float = None
    gflops: float = None
    frac_sgemm: float = None
    frac_peak: float = None
    flops: float = None
    bytes: float = None  # the variant's bytes_moved for one call (null in rows from before #13)
    gbytes_per_s: float = None
    frac_bandwidth: float = None
    # The distance from exact softmax attention, the accuracy plots' and the Pareto's axis:
    # accuracy_vs_softmax.rel_l2_err where the row has it (the recurrences' `accuracy` is against their own
    # definition since #32; for softmax variants the two are equal), else accuracy.rel_l2_err.
    rel_l2_err: float = None
    # Storage precision, logit bias and RoPE (#14); rows from before them read as fp32, none, none.
    dtype: str = "fp32"
    bias: str = "none"
    rope: str = "none"
    rope_ms: float = None
    max_abs_err: float = None  # accuracy.max_abs_err: the kernel's error on the inputs it read
    e2e_max_abs_err: float = None  # accuracy_e2e.max_abs_err: against fp64 on the fp32 inputs (older rows: the same)
    peak_bytes: float = None  # memory.peak_bytes
    peak_note: str = ""  # memory.peak_note: why peak_bytes is null ("" when measured, or in rows from before it)
    estimated_bytes: float = None  # memory.estimated_bytes
    # How the point was measured on a shared machine (#18); rows from before it read as one clean attempt with
    # no interval, no samples and no interference measured (conditions_recorded False).
    ci_lo: float = None  # time_ms.ci_lo, ci_hi: the 95% distribution-free interval of the median (None below 6 reps)
    ci_hi: float = None
    ci_level: float = None  # time_ms.ci_level: its exact coverage
    samples: list = field(default_factory=list)  # time_ms.samples: every repetition, ms
    interference: dict = None  # the interference object as written (None: not measured)
    interference_score: float = None  # interference.score
    attempts: int = 1  # timed measurements of the point (1 clean first time; 0 not measured)
    noisy: bool = False  # every attempt stayed above measure.max_interference
    calibration: int = None  # index into meta.json calibrations of the denominators of frac_sgemm / frac_peak
    # group_sgemm.gflops: the sgemm timed in the row's own rounds, which frac_sgemm was divided by (None: the
    # group ran without it, or the row predates it; frac_sgemm then divides by the calibration)
    group_sgemm_gflops: float = None
    frac_sgemm_ci: tuple = None  # group_sgemm.frac_ci_lo, frac_ci_hi: the 95% interval of frac_sgemm (None: none)
    # interleave.group: the id of the first point of the group this row was timed with, round by round (None:
    # timed alone, or written before it); sample r of every row of one group was taken in round r.
    interleave_group: str = None
    conditions_recorded: bool = False  # the row has interference / attempts / noisy (written since #18)
    # What was timed (sweep.pass, #27): "forward", "backward" or "forward_backward"; rows from before it are
    # forward rows. ("pass" is a Python keyword.) flops, peak_bytes, time are the pass's own.
    pass_: str = "forward"
    # grad_accuracy (#27): the reference kind ("full", "sampled", "none"; None: the row has no grad_accuracy),
    # the (batch, K/V head) blocks compared and, per dq / dk / dv, max_abs_err, rel_l2_err, nan_count, inf_count.
    grad_reference: str = None
    grad_blocks: int = None
    grad: dict = field(default_factory=dict)
    label: str = ""  # the series it belongs to: the variant, the parameters that vary, [isa] over several targets
    params_text: str = ""  # every parameter, "k=v,k=v"

    @classmethod
    def from_json(cls, d, source):
        grad = _grad(d)
        return cls(id=d["id"], status=d.get("status"), variant=d["variant"], seq_kv=d["seq_kv"], mask=d["mask"],
                   source=source, params=d.get("params") or {}, batch=d.get("batch"), heads=d.get("heads"),
                   kv_heads=d.get("kv_heads") if d.get("kv_heads") is not None else d.get("heads"),
                   seq_q=d.get("seq_q"), head_dim=d.get("head_dim"), regime=d.get("regime"),
                   threads=d.get("threads"), isa=d.get("isa"), exact=bool(d.get("exact")), reason=d.get("reason"),
                   time_median=num(_sub(d, "time_ms", "median")), time_p10=num(_sub(d, "time_ms", "p10")),
                   time_p90=num(_sub(d, "time_ms", "p90")), gflops=num(d.get("gflops")),
                   frac_sgemm=num(d.get("frac_sgemm")), frac_peak=num(d.get("frac_peak")),
                   flops=num(d.get("flops")), bytes=num(d.get("bytes")), gbytes_per_s=num(d.get("gbytes_per_s")),
                   frac_bandwidth=num(d.get("frac_bandwidth")),
                   rel_l2_err=_softmax_rel_l2(d), peak_bytes=num(_sub(d, "memory", "peak_bytes")),
                   estimated_bytes=num(_sub(d, "memory", "estimated_bytes")),
                   dtype=d.get("dtype") or "fp32", bias=d.get("bias") or "none", rope=d.get("rope") or "none",
                   rope_ms=num(d.get("rope_ms")), max_abs_err=num(_sub(d, "accuracy", "max_abs_err")),
                   e2e_max_abs_err=num(_sub(d, "accuracy_e2e" if isinstance(d.get("accuracy_e2e"), dict)
                                            else "accuracy", "max_abs_err")),
                   peak_note=_sub(d, "memory", "peak_note") if isinstance(_sub(d, "memory", "peak_note"), str) else "",
                   ci_lo=num(_sub(d, "time_ms", "ci_lo")), ci_hi=num(_sub(d, "time_ms", "ci_hi")),
                   ci_level=num(_sub(d, "time_ms", "ci_level")), samples=_samples(d),
                   interference=d.get("interference") if isinstance(d.get("interference"), dict) else None,
                   interference_score=num(_sub(d, "interference", "score")), attempts=_attempts(d),
                   noisy=d.get("noisy") is True, calibration=_int_or_none(d.get("calibration")),
                   group_sgemm_gflops=num(_sub(d, "group_sgemm", "gflops")),
                   frac_sgemm_ci=_pair(num(_sub(d, "group_sgemm", "frac_ci_lo")), num(_sub(d, "group_sgemm", "frac_ci_hi"))),
                   interleave_group=_sub(d, "interleave", "group")
                   if isinstance(_sub(d, "interleave", "group"), str) else None,
                   conditions_recorded=any(k in d for k in CONDITION_FIELDS),
                   pass_=d.get("pass") if isinstance(d.get("pass"), str) and d.get("pass") else "forward",
                   grad_reference=grad[0], grad_blocks=grad[1], grad=grad[2])

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
        repetitions, or written before #18)."""
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
        """The error a row's pass is judged by: the output's rel_l2_err for a forward row, the worst gradient
        rel_l2_err (dQ, dK, dV) for a backward or training-step row (None when no gradient was compared)."""
        return self.rel_l2_err if self.pass_ == "forward" else self.grad_rel_l2()[0]

    def memory(self):
        """Peak bytes measured, else the estimate; and whether it was estimated."""
        if self.peak_bytes is not None and self.peak_bytes > 0:
            return self.peak_bytes, False
        est = self.estimated_bytes
        return (est, True) if est is not None and est > 0 else (None, False)


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
        # Every sgemm / FMA-peak calibration of the run, in order (meta.json calibrations, #18): None when the
        # folder predates it (sgemm_calibration above is the first one either way).
        cals = self.meta.get("calibrations")
        self.calibrations = [c for c in cals if isinstance(c, dict)] if isinstance(cals, list) else None
        for r in self.ok:  # peer rows carry gflops; their fraction of sgemm comes from this run's calibration
            if r.frac_sgemm is None and r.gflops and r.threads in self.calibration:
                r.frac_sgemm = r.gflops / self.calibration[r.threads]
        # The in-run memory bandwidth per thread count (meta.json memory_bandwidth, written since #13):
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
        # So do storage dtypes and biases when they vary (#14): "tiled [bf16, alibi]". RoPE is in the regime
        # label ("gaussian(std=1,rope=normal)"), so it facets like any other input regime.
        several_dtypes = len({r.dtype for r in rows}) > 1
        several_biases = len({r.bias for r in rows}) > 1
        for r in rows:
            keys = [k for k in sorted(r.params) if len(values[(r.variant, k)]) > 1]
            r.label = r.variant + (f"({params_text(r.params, keys)})" if keys else "")
            tags = ([r.isa] if several_isas and r.isa else []) + ([r.dtype] if several_dtypes else []) \
                + ([r.bias] if several_biases and r.bias != "none" else [])
            if tags:
                r.label += f" [{', '.join(tags)}]"
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


def load_patterns(pdir):
    """A folder written by `attnbench patterns`: (patterns.json, the tokens or None, [(variant entry,
    weights [heads, n, n])] of the variants with status ok)."""
    import numpy as np

    meta_path = os.path.join(pdir, "patterns.json")
    if not os.path.isfile(meta_path):
        raise InputError(f"--patterns '{pdir}': no patterns.json (write one with `attnbench patterns ... --out DIR`)")
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except ValueError as e:
        raise InputError(f"{meta_path}: not valid JSON ({e})")
    tokens = None
    if meta.get("tokens"):
        with open(os.path.join(pdir, meta["tokens"]), encoding="utf-8") as f:
            tokens = json.load(f)
    panels = []
    for v in meta.get("variants", []):
        if v.get("status") != "ok":
            continue
        path = os.path.join(pdir, v["file"])
        try:
            w = np.load(path)
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: cannot read ({e})")
        if w.ndim != 3 or w.shape[1] != w.shape[2]:
            raise InputError(f"{path}: shape {w.shape}; expected [heads, n, n]")
        panels.append((v, w))
    if not panels:
        raise InputError(f"{meta_path}: lists no variant with status ok")
    return meta, tokens, panels
