#!/usr/bin/python3
"""PyTorch peer: times the exact-attention points of an attnbench sweep config in PyTorch on the CPU, so that
scripts/plot.py draws PyTorch next to the C++ variants, on the same inputs and in the same row schema.

    /usr/bin/python3 scripts/peers/torch_attention.py CONFIG.json [--out DIR] [--filter TEXT] [--attnbench PATH]

The sweep is defined once, in C++; attnbench (--attnbench PATH, else $ATTNBENCH, else
<repo>/build/release/attnbench) gives everything but the timing:
- the plan: `attnbench run CONFIG --dry-run --json [--filter TEXT]` validates the config and lists the points.
  Each (shape, mask, regime, threads) is run once, whatever the variants and SIMD targets, with the id
  "peer/torch_naive" + the point's id from ":B=" on (without ",isa=NAME");
- the inputs: `attnbench inputs CONFIG --filter ID --out TMP`, once per input set: Q, K, V and the key padding
  exactly as `run` makes them, and the fp64 exact reference on the rows `run` compares (for backward points
  also dO and the fp64 gradient reference);
- the row: the `row` of an exact variant's point there (bench/lib/result_row.hpp) with its flops (4·d per
  attended pair), filled in with the measurements; isa is "" (PyTorch picks its own kernels) and the workspace
  is PyTorch's (two score-sized tensors at a time, plus the additive mask).
It times softmax(q @ k.transpose(-2, -1) * scale + mask, dim=-1) @ v with torch.set_num_threads(threads) and
the config's measure settings, compares the last output with the reference rows (attnbench's metrics) and
records the peak RSS increase during timing (VmHWM reset through /proc/self/clear_refs, as attnbench).
Masks as attnbench's: causal is upper-left (key j <= query i, torch.tril), causal_lower_right allows
j <= i + Lkv - Lq (both: the stricter), key padding drops the padded keys; a query row with no allowed key
is zeros (PyTorch's softmax would give NaN), set in the timed call. Grouped-query attention (K and V with
kv_heads < heads heads; kv_heads from the plan's problem, else the id's "Hkv=", else heads): torch 1.13 has no
enable_gqa, so each call repeats the K/V heads, k.repeat_interleave(heads // kv_heads, dim=1), query head h
reading K/V head h // (heads // kv_heads) as attnbench's kv_head_of; the copies count in the workspace.
Skipped: dropout (PyTorch cannot draw attnbench's keep decisions), bf16 / fp16 storage and the ALiBi bias
(the peer computes fp32 attention without a bias; RoPE needs nothing, Q and K come rotated), points the plan skips for memory (need_bytes
over memory_budget) and points whose PyTorch memory exceeds memory_budget. A point the plan skips because its
variant lacks a capability (a mask kind, GQA, cross-attention) is still run: PyTorch computes it. Rows are appended to DIR/results.peers.jsonl (DIR: results/<config name>,
as `attnbench run`); frac_sgemm and frac_peak use DIR/meta.json's calibrations when a C++ run wrote it.
Backward points (sweep.pass `backward` / `forward_backward`, ids ending ",pass=NAME", kept on the peer's id)
time autograd through the same expression: out = softmax(q k^T * scale + mask) v with q, k, v requiring
gradients, then torch.autograd.grad(out, (q, k, v), d_out), dO (d_out.npy) from `attnbench inputs`.
forward_backward times both in one call (a fresh graph per repetition). backward times the grad alone: one
untimed forward per measurement builds the graph, and each timed repetition is
torch.autograd.grad(..., retain_graph=True) on it (as attnbench's backward rows read the O and state one
untimed training forward left); memory.peak_bytes is the timed pass's (the backward's from the graph the
forward left, a training step's from before its forward). flops is the plan's (the C++ row's: a backward is
2.5x the forward, a step the sum), the workspace PyTorch's (the softmax output autograd keeps and three more
score-sized tensors in the backward, the repeated K/V and their gradients with GQA), accuracy the O of the
timed pass against the reference rows, and grad_accuracy dQ, dK, dV against the fp64 gradient of exact
attention on the blocks `attnbench inputs` lists (grad_blocks.npy, grad_dq/dk/dv.npy), with attnbench's metrics
(grouped-query: dK, dV summed over the group, as repeat_interleave's gradient gives).
Without torch (Debian's python3-torch) it prints "torch not available: ..." and exits 0.
Exit codes: 0 done (or torch missing), 1 some point failed, 2 bad config or option.
"""
import argparse
import copy
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

try:  # numpy and torch come together (Debian's python3-torch depends on python3-numpy); see main()
    import numpy as np
except ImportError:
    np = None

PROG = "torch_attention.py"
VARIANT = "torch_naive"
ID_PREFIX = "peer/"  # ids never collide with the C++ rows (and --resume there never sees these)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class AttnbenchError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def attnbench(exe, *args):
    """stdout of `attnbench ARGS`; AttnbenchError with its exit code and stderr when it fails."""
    r = subprocess.run([exe, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise AttnbenchError(r.returncode, r.stderr.strip() or f"attnbench {args[0]} exited {r.returncode}")
    return r.stdout


def load_plan(exe, config, filt=None):
    out = attnbench(exe, "run", config, "--dry-run", "--json", *(["--filter", filt] if filt else []))
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def peer_points(plan):
    """[(peer id, plan point)]: one per (shape, mask, regime, threads), in plan order, each the first point of
    an exact variant there (else the first point: the row then has no flops)."""
    chosen = {}
    for pt in plan:
        pid = pt["id"][pt["id"].index(":B=", len(pt["variant"])):]
        suffix = "" if point_pass(pt) == "forward" else ",pass=" + point_pass(pt)  # the id's last part
        pid = pid.removesuffix(suffix)
        if pt["isa_requested"] != "best":
            pid = pid.removesuffix(",isa=" + pt["isa_requested"])
        pid = ID_PREFIX + VARIANT + pid + suffix
        if pid not in chosen or (pt["row"]["exact"] and not chosen[pid]["row"]["exact"]):
            chosen[pid] = pt
    return list(chosen.items())


def point_pass(pt):
    """The pass the point times: "forward" (plans from before the pass axis), "backward", "forward_backward"."""
    return pt.get("pass") or "forward"


def id_shape_tokens(pid):
    """The id's tokens after ":B=" (sizes, mask parts, regime, threads), split at ',' and '+'."""
    i = pid.find(":B=")
    return [t for part in (pid[i + 1:] if i >= 0 else "").split(",") for t in part.split("+")]


def v_width(p):
    """d_v, the width of V and the output: the problem's v_head_dim (0 or absent: head_dim)."""
    dv = p.get("v_head_dim")
    return dv if isinstance(dv, int) and not isinstance(dv, bool) and dv > 0 else p["head_dim"]


def point_problem(pt):
    """The plan point's problem with kv_heads and causal_lower_right filled in, read defensively: the problem's
    fields when the plan has them, else the id ("Hkv=N" only when it differs from H; "causal_lower_right" among
    the mask parts), else kv_heads = heads and no lower-right mask."""
    p = dict(pt["problem"])
    tokens = id_shape_tokens(pt["id"])
    kv = p.get("kv_heads")
    if not isinstance(kv, int) or isinstance(kv, bool) or kv <= 0:  # absent, or 0 meaning "same as heads"
        kv = next((int(t[4:]) for t in tokens if t.startswith("Hkv=") and t[4:].isdigit()), p["heads"])
    p["kv_heads"] = kv
    if not isinstance(p.get("causal_lower_right"), bool):
        p["causal_lower_right"] = "causal_lower_right" in tokens
    if not isinstance(p.get("causal"), bool):
        p["causal"] = "causal" in tokens
    return p


def allowed_keys(p, key_padding=None):
    """[B or 1, 1, Lq, Lkv] booleans, True where query i may attend key j under the point's masks (attnbench's
    key_allowed), or None when every key is allowed."""
    B, Lq, Lkv = p["batch"], p["seq_q"], p["seq_kv"]
    if not (p["causal"] or p["causal_lower_right"] or p["key_padding"]):
        return None
    allowed = np.ones((B if p["key_padding"] else 1, 1, Lq, Lkv), bool)
    i, j = np.arange(Lq)[:, None], np.arange(Lkv)[None, :]
    if p["causal"]:  # upper-left aligned: query i attends keys j <= i
        allowed &= j <= i
    if p["causal_lower_right"]:  # lower-right aligned: the last query attends every key
        allowed &= j <= i + (Lkv - Lq)
    if p["key_padding"]:  # nonzero: a padded key
        allowed &= (key_padding == 0)[:, None, None, :]
    return allowed


def inputs_key(pt):
    """What the fetched files depend on: the plan's input key (Q, K, V, padding) and what the reference rows
    depend on beyond it (masks, scale, kv_heads), so that two points sharing Q, K, V but not their reference
    never share a fetch, whatever the input key spells out."""
    p = point_problem(pt)
    return (pt["inputs"]["key"], p["causal"], p["causal_lower_right"], p["key_padding"], p["kv_heads"], p["scale"])


def fetch_inputs(exe, config, pt, tmp):
    """The point's files from `attnbench inputs` as arrays: q, k, v, [key_padding], [reference, rows]; a backward
    point's also d_out, [grad_dq, grad_dk, grad_dv, grad_blocks]."""
    d = tempfile.mkdtemp(dir=tmp)
    try:
        attnbench(exe, "inputs", config, "--filter", pt["id"], "--out", d)
        with open(os.path.join(d, "point.json"), encoding="utf-8") as f:
            files = json.load(f)["files"]
        return {name: np.load(os.path.join(d, file)) for name, file in files.items()}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def fetch_point(points, i):
    """The point whose `attnbench inputs` serve the peer points from i on that share points[i]'s inputs: the
    first backward one among them of the same dtype, bias and dropout (its files are a superset), else
    points[i]."""
    first = points[i][1]
    same = lambda pt: all(pt["problem"].get(f) == first["problem"].get(f) for f in ("dtype", "bias", "dropout"))
    for _, pt in points[i:]:
        if inputs_key(pt) != inputs_key(first):
            break
        if point_pass(pt) != "forward" and same(pt):  # the references are on the same (fp32) inputs
            return pt
    return first


def start_row(pid, pt):
    """The point's base row as the peer's, with PyTorch's memory estimate, and why it is skipped ("": it is not)."""
    p, row = point_problem(pt), copy.deepcopy(pt["row"])
    row.update(id=pid, variant=VARIANT, params={}, exact=True, isa="")
    # q @ k^T materialises the scores, and each of * scale, + mask, softmax makes one more [B, H, Lq, Lkv]
    # tensor while the previous is alive: two score-sized tensors at a time, plus the additive mask
    # ([B, 1, Lq, Lkv] with key padding, else [1, 1, Lq, Lkv]); with GQA, K and V repeated to every head.
    cells = p["seq_q"] * p["seq_kv"]
    workspace = 2 * 4 * cells * p["batch"] * p["heads"]
    if p["causal"] or p["causal_lower_right"] or p["key_padding"]:
        workspace += 4 * cells * (p["batch"] if p["key_padding"] else 1)
    if p["kv_heads"] != p["heads"]:
        workspace += 4 * p["batch"] * p["heads"] * p["seq_kv"] * (p["head_dim"] + v_width(p))
    if point_pass(pt) != "forward":
        # autograd keeps the softmax output P for the backward, which makes dP, dS and the scaled dS (four
        # score-sized tensors at a time, two more than the forward's); with GQA, the repeated K/V's gradients.
        workspace += 2 * 4 * cells * p["batch"] * p["heads"]
        if p["kv_heads"] != p["heads"]:
            workspace += 4 * p["batch"] * p["heads"] * p["seq_kv"] * (p["head_dim"] + v_width(p))
    mem = row["memory"]
    mem.update(workspace_bytes=workspace, estimated_bytes=pt["memory"]["output_bytes"] + workspace)
    need, budget = mem["inputs_bytes"] + mem["estimated_bytes"] + mem["reference_bytes"], pt["memory"]["budget_bytes"]
    # The plan's memory refusals stand (attnbench would not make these inputs either); its capability skips
    # (the variant lacks a mask kind, GQA, ...) do not: PyTorch computes every exact point.
    if pt["row"]["exact"] and pt["skip"] and pt["memory"]["need_bytes"] > budget:
        return row, pt["skip"]
    if p["dropout"] > 0:
        return row, "dropout: the PyTorch peer times attention without dropout"
    # Storage dtype and bias: the peer computes fp32 attention without a bias, so its rows would
    # misstate a bf16 / fp16 or ALiBi point.
    if pt["problem"].get("dtype", "fp32") != "fp32":
        return row, f"dtype {pt['problem']['dtype']}: the PyTorch peer runs fp32 inputs only"
    if pt["problem"].get("bias", "none") != "none":
        return row, f"bias {pt['problem']['bias']}: the PyTorch peer applies no logit bias"
    if need > budget:
        return row, (f"needs {need} bytes in PyTorch (inputs {mem['inputs_bytes']}, output and workspace "
                     f"{mem['estimated_bytes']}, accuracy reference {mem['reference_bytes']}) > memory_budget {budget}")
    return row, ""


def median_interval(samples, level=0.95):
    """attn::median_interval: the distribution-free interval [x(l), x(n+1-l)] of the median with the largest
    rank l whose binomial coverage 1 - 2 P(Bin(n, 1/2) <= l - 1) is >= level; (None, None, None) below 6
    samples. Exact binomial sums (Python integers), so it agrees with the C++ up to its n = 4096 switch."""
    n, s = len(samples), sorted(samples)
    best, cdf = None, 0
    for l in range(1, (n + 1) // 2 + 1):
        cdf += math.comb(n, l - 1)
        coverage = 1 - 2 * cdf / 2 ** n
        if coverage < level:
            break
        best = (l, coverage)
    if best is None:
        return None, None, None
    l, coverage = best
    return s[l - 1], s[n - l], coverage


def time_repeated(fn, m):
    """attn::time_repeated's stopping rule (measure.target_rel_ci included) and summary; also returns the last
    output (checked for accuracy)."""
    for _ in range(m["warmup"]):
        fn()
    samples = []
    target = m.get("target_rel_ci") or 0
    while True:
        t0 = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - t0) * 1000.0)
        n, total = len(samples), sum(samples) / 1000.0
        if n >= m["max_reps"] or total >= m["max_time_s"]:
            break
        if n < m["min_reps"]:
            continue
        if target <= 0:
            if total >= m["min_time_s"]:
                break
            continue
        lo, hi, _ = median_interval(samples)
        med = float(np.median(samples))
        if lo is not None and med > 0 and max(hi - med, med - lo) <= target * med:
            break
    s = np.asarray(samples)
    mean = float(s.mean())
    cv = float(s.std(ddof=1) / mean) if n > 1 and mean > 0 else 0.0
    pct = lambda q: float(np.percentile(s, q))  # linear interpolation, as the C++ summarize()
    lo, hi, level = median_interval(samples)
    return {"median": pct(50), "p10": pct(10), "p90": pct(90), "mean": mean, "cv": cv, "reps": n,
            "ci_lo": lo, "ci_hi": hi, "ci_level": level, "samples": [float(x) for x in samples]}, result


class InterferenceProbe:
    """attnbench's interference probe (bench/lib/interference.{hpp,cpp}), the same readings and score, so a
    peer row is judged by the rule its attnbench neighbours are: /proc/stat busy and steal ticks of the CPUs
    this process may run on, minus this process's own CPU time (getrusage), the run-queue wait of its threads
    (/proc/self/task/*/schedstat), involuntary context switches, /proc/loadavg and the cores' frequency."""

    def __init__(self):
        self.cpus = sorted(os.sched_getaffinity(0))
        self.hz = float(os.sysconf("SC_CLK_TCK")) or 100.0
        self.start_reading = None

    @staticmethod
    def _text(path):
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _read(self):
        busy = steal = cpus = 0
        want = set(self.cpus)
        for line in self._text("/proc/stat").splitlines():
            parts = line.split()
            if not parts or not parts[0].startswith("cpu") or parts[0] == "cpu":
                continue
            try:
                n, f = int(parts[0][3:]), [int(x) for x in parts[1:]]
            except ValueError:
                continue
            if n in want and len(f) >= 7:
                busy += f[0] + f[1] + f[2] + f[5] + f[6]  # user nice system irq softirq, as parse_proc_stat
                steal += f[7] if len(f) > 7 else 0
                cpus += 1
        u = resource.getrusage(resource.RUSAGE_SELF)
        wait_ns = 0
        try:
            for tid in os.listdir("/proc/self/task"):
                f = self._text(f"/proc/self/task/{tid}/schedstat").split()
                if len(f) == 3 and f[1].isdigit():
                    wait_ns += int(f[1])
        except OSError:
            pass
        return {"wall": time.perf_counter(), "busy": busy, "steal": steal, "cpus": cpus,
                "own": u.ru_utime + u.ru_stime, "nivcsw": u.ru_nivcsw, "wait_ns": wait_ns}

    def start(self):
        self.start_reading = self._read()

    def stop(self, threads):
        a, b = self.start_reading, self._read()
        window = max(b["wall"] - a["wall"], 1e-9)
        capacity = window * max(1, b["cpus"])
        clamp = lambda x: min(max(x, 0.0), 1.0)
        steal = clamp((b["steal"] - a["steal"]) / self.hz / capacity)
        other = clamp(((b["busy"] - a["busy"]) / self.hz - (b["own"] - a["own"])) / capacity)
        runq = clamp((b["wait_ns"] - a["wait_ns"]) * 1e-9 / (window * max(threads, 1)))
        try:
            load = float(self._text("/proc/loadavg").split()[0])
        except (IndexError, ValueError):
            load = 0.0
        mhz = []
        for c in self.cpus:
            try:
                mhz.append(float(self._text(f"/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq")) / 1000.0)
            except ValueError:
                pass
        resolution = 2.0 / (self.hz * window)  # each /proc/stat reading may be a tick off per CPU
        return {"window_s": window, "steal_frac": steal, "other_cpu_frac": other, "runq_wait_frac": runq,
                "score": steal + max(runq, max(0.0, other - resolution)),
                "ctx_switches_involuntary": b["nivcsw"] - a["nivcsw"], "loadavg_1m": load,
                "freq_mhz": sum(mhz) / len(mhz) if mhz else None}


class MemoryProbe:
    """attnbench's memory probe: the resident high-water mark (VmHWM, reset per point through
    /proc/self/clear_refs) minus the resident memory before the timed calls; None where the reset fails."""

    @staticmethod
    def _status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    def reset(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.base = self._status("VmRSS:")
        except (OSError, StopIteration, ValueError):
            self.base = None

    def peak_increase(self):
        try:  # VmHWM is updated lazily from the RSS counters: the larger of it and the RSS, as attnbench
            peak = max(self._status("VmHWM:"), self._status("VmRSS:"))
            return None if self.base is None else max(0, peak - self.base)
        except (OSError, StopIteration, ValueError):
            return None


def num(x):
    """JSON has no NaN/Inf: written as strings, as attnbench does."""
    return x if math.isfinite(x) else "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"


def compare_outputs(got, want):
    """attn::compare_outputs (common/reference/reference.cpp) on [rows, dim]: max |diff|, relative L2 and mean cosine over
    the finite outputs (a row with a non-finite value has cosine 0), NaN/Inf counts; the errors are inf when an
    output is non-finite where the reference is finite."""
    got = got.astype(np.float64)
    fin = np.isfinite(got)
    g, w = np.where(fin, got, 0.0), np.where(fin, want, 0.0)
    diff = np.abs(g - w)
    d2, w2 = float((diff * diff).sum()), float((w * w).sum())
    rel = math.sqrt(d2 / w2) if w2 > 0 else math.sqrt(d2)
    gg, ww, gw = (g * g).sum(1), (w * w).sum(1), (g * w).sum(1)
    cos = np.where((gg == 0) & (ww == 0), 1.0,
                   np.where((gg > 0) & (ww > 0), gw / np.sqrt(np.maximum(gg * ww, 1e-300)), 0.0))
    cos[~fin.all(axis=1)] = 0.0
    max_abs = float(diff.max()) if diff.size else 0.0
    if (~fin & np.isfinite(want)).any():
        max_abs = rel = math.inf
    return {"max_abs_err": num(max_abs), "rel_l2_err": num(rel),
            "mean_cosine": num(float(cos.mean()) if len(cos) else 1.0),
            "nan_count": int(np.isnan(got).sum()), "inf_count": int(np.isinf(got).sum())}


def gathered_gradients(grads, blocks, kv_heads):
    """dQ, dK, dV of the (batch * kv_heads + K/V head) blocks in attnbench's compact layout
    (reference_attention_backward with kv_blocks): dq [n, group, Lq, D] (the block's query heads), dk and dv
    [n, Lkv, D]."""
    dq, dk, dv = grads
    group = dq.shape[1] // kv_heads
    gq = np.stack([dq[b // kv_heads, (b % kv_heads) * group:(b % kv_heads + 1) * group] for b in blocks])
    return gq, np.stack([dk[b // kv_heads, b % kv_heads] for b in blocks]), \
        np.stack([dv[b // kv_heads, b % kv_heads] for b in blocks])


def measure(torch, pt, row, data, settings, probe, calibration, interference):
    """Times the PyTorch expression (a backward point: its pass through autograd) on the point's inputs and
    fills `row` in."""
    p, T, pass_ = point_problem(pt), pt["threads"], point_pass(pt)
    B, H, Lq, Lkv, D = p["batch"], p["heads"], p["seq_q"], p["seq_kv"], p["head_dim"]
    if H % p["kv_heads"]:
        raise RuntimeError(f"kv_heads {p['kv_heads']} does not divide heads {H}")
    Dv = v_width(p)
    for x, width, name in (("k", D, "head_dim"), ("v", Dv, "v_head_dim")):
        if data[x].shape != (B, p["kv_heads"], Lkv, width):
            raise RuntimeError(f"attnbench inputs gave {x} of shape {list(data[x].shape)}, the point has "
                               f"[batch, kv_heads, seq_kv, {name}] = {[B, p['kv_heads'], Lkv, width]}")
    if pass_ != "forward" and "d_out" not in data:
        raise RuntimeError(f"attnbench inputs gave no d_out.npy for the {pass_} point {pt['id']}")
    group = H // p["kv_heads"]
    allowed = allowed_keys(p, data.get("key_padding"))
    torch.set_num_threads(T)
    tq, tk, tv = (torch.from_numpy(data[x]) for x in ("q", "k", "v"))
    # Rows with no allowed key: softmax over all -inf is NaN in PyTorch, zeros in attnbench. Their mask row
    # allows every key instead (finite weights, no NaN in a gradient either) and their output is set to zero,
    # so no gradient flows back from them.
    empty = None if allowed is None or allowed.any(-1).all() else ~allowed.any(-1, keepdims=True)
    tmask = None
    if allowed is not None:
        blocked = ~allowed if empty is None else ~(allowed | empty)
        tmask = torch.zeros(allowed.shape).masked_fill_(torch.from_numpy(blocked), -math.inf)
    tempty = None if empty is None else torch.from_numpy(empty)
    scale = p["scale"]

    def forward(q=tq, k=tk, v=tv):
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        s = q @ k.transpose(-2, -1) * scale
        if tmask is not None:
            s = s + tmask
        o = torch.softmax(s, dim=-1) @ v
        return o if tempty is None else o.masked_fill_(tempty, 0.0)

    # As attnbench's runner: a window whose interference score is above measure.max_interference is measured
    # again after a pause (twice the last window, 10 ms to 0.25 s per attempt so far), up to max_remeasure
    # times; the cleanest attempt is kept and the row is noisy when none was clean.
    best, grads = None, None
    with torch.set_grad_enabled(pass_ != "forward"):
        leaves = tuple(x.detach().requires_grad_(pass_ != "forward") for x in (tq, tk, tv))
        d_out = torch.from_numpy(data["d_out"]) if pass_ != "forward" else None
        graph_out = None
        if pass_ == "forward":
            fn = forward
        elif pass_ == "forward_backward":
            def fn():
                o = forward(*leaves)
                return o.detach(), torch.autograd.grad(o, leaves, d_out)
        else:  # backward: the graph of one untimed forward, the grad alone timed (retain_graph keeps it)
            graph_out = forward(*leaves)

            def fn():
                return graph_out.detach(), torch.autograd.grad(graph_out, leaves, d_out, retain_graph=True)
        probe.reset()
        last_window = 0.0
        for attempt in range(1, 2 + int(settings.get("max_remeasure", 2))):
            if attempt > 1:
                time.sleep(min(max(2 * last_window, 0.01), 0.25 * (attempt - 1)))
            interference.start()
            t, out = time_repeated(fn, settings)
            noise = interference.stop(T)
            last_window = noise["window_s"]
            if best is None or noise["score"] < best[2]["score"]:
                best = (t, out, noise, attempt)
            if noise["score"] <= settings.get("max_interference", 0.05):
                break
        row["memory"]["peak_bytes"] = probe.peak_increase()
        graph_out = None  # the backward point's graph goes before the row is filled in
    t, out, noise, _ = best
    if pass_ != "forward":
        out, grads = out
        grads = [g.numpy() for g in grads]
    out = out.numpy()
    row["time_ms"] = t
    row["attempts"] = attempt
    row["interference"] = noise
    row["noisy"] = noise["score"] > settings.get("max_interference", 0.05)
    if pt["row"]["exact"]:  # an exact variant's count of the work (the pass's: point_flops)
        row["flops"] = pt["flops"]
        row["gflops"] = gflops = pt["flops"] / (t["median"] * 1e6)
        row["frac_sgemm"] = gflops / calibration["sgemm"][T] if calibration["sgemm"].get(T) else None
        row["frac_peak"] = gflops / calibration["peak"][T] if calibration["peak"].get(T) else None
    row["nonfinite_inputs"] = sum(int((~np.isfinite(data[x])).sum()) for x in ("q", "k", "v"))
    bad = 0
    if row["accuracy"]["reference"] != "none":
        rows = data["rows"]
        row["accuracy"].update(rows=len(rows), **compare_outputs(out[:, :, rows, :].reshape(-1, Dv),
                                                                 data["reference"].reshape(-1, Dv)))
        if "accuracy_e2e" in row:  # fp32 inputs only (start_row): the end-to-end error is the same
            row["accuracy_e2e"] = dict(row["accuracy"])
        if "accuracy_vs_softmax" in row:  # softmax attention: the same figures as accuracy (result_row.cpp)
            row["accuracy_vs_softmax"] = {k: row["accuracy"][k] for k in ("max_abs_err", "rel_l2_err")}
        bad += row["accuracy"]["nan_count"] + row["accuracy"]["inf_count"]
    if grads is not None and "grad_blocks" in data:
        ga = row["grad_accuracy"]
        ga["blocks"] = len(data["grad_blocks"])
        for name, got in zip(("dq", "dk", "dv"), gathered_gradients(grads, data["grad_blocks"], p["kv_heads"])):
            width = Dv if name == "dv" else D
            m = compare_outputs(got.reshape(-1, width), data["grad_" + name].reshape(-1, width))
            ga[name] = {k: m[k] for k in ("max_abs_err", "rel_l2_err", "nan_count", "inf_count")}
            bad += m["nan_count"] + m["inf_count"]
    # Fully masked rows are zeros (forward); NaN/Inf left come from non-finite inputs: reported, not failed.
    if bad:
        row["reason"] = f"{bad} NaN/Inf values in the output{' or gradients' if grads is not None else ''} " \
                        f"({row['nonfinite_inputs']} non-finite inputs)"


def read_calibration(out_dir):
    """The C++ run's calibrations in DIR/meta.json, when it is there: the denominators of frac_sgemm, frac_peak."""
    cal = {"sgemm": {}, "peak": {}}
    try:
        with open(os.path.join(out_dir, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        cal["sgemm"] = {int(x["threads"]): float(x["gflops"]) for x in meta.get("sgemm_calibration", [])}
        # fma_peak has one entry per (threads, SIMD target): PyTorch picks its own kernels, so its bound is the
        # best target's peak, the highest one at each thread count.
        for x in meta.get("fma_peak", []):
            cal["peak"][int(x["threads"])] = max(cal["peak"].get(int(x["threads"]), 0.0), float(x["gflops"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return cal


def error(msg):
    for line in msg.splitlines():
        print(f"{PROG}: {line}", file=sys.stderr)


def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="sweep config (JSON), as for `attnbench run`")
    ap.add_argument("--out", metavar="DIR", help="results folder (default results/<config name>)")
    ap.add_argument("--filter", metavar="TEXT", help="only the points whose attnbench id contains TEXT")
    ap.add_argument("--attnbench", metavar="PATH",
                    help="the attnbench binary (default: $ATTNBENCH, else <repo>/build/release/attnbench)")
    a = ap.parse_args(argv)
    exe = a.attnbench or os.environ.get("ATTNBENCH") or os.path.join(ROOT, "build", "release", "attnbench")
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        error(f"error: attnbench '{exe}' is not an executable file (build it with `cmake --preset release && "
              "cmake --build --preset release`, or give --attnbench PATH or ATTNBENCH=PATH)")
        return 2
    try:
        plan = load_plan(exe, a.config, a.filter)
    except AttnbenchError as e:
        error(str(e))
        return 2 if e.code == 2 else 1
    try:
        import torch
        if np is None:
            raise ImportError("No module named 'numpy'")
    except ImportError as e:
        print(f"torch not available: {e}; install Debian's python3-torch (with python3-numpy) to run the "
              "PyTorch peer")
        return 0
    out_dir = a.out or os.path.join("results", plan[0]["config"])  # attnbench refuses a plan with no point
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        error(f"error: --out '{out_dir}': exists and is not a directory")
        return 2
    points = peer_points(plan)
    settings = plan[0]["measure"]  # the config's measure section with attnbench's defaults filled in
    os.makedirs(out_dir, exist_ok=True)
    calibration, probe, interference = read_calibration(out_dir), MemoryProbe(), InterferenceProbe()
    path = os.path.join(out_dir, "results.peers.jsonl")
    counts = {"ok": 0, "skipped": 0, "failed": 0}
    print(f"{PROG}: torch {torch.__version__}, plan and inputs from {exe}: {len(points)} points -> {path}")
    key, data = None, None
    with open(path, "a", encoding="utf-8") as f, tempfile.TemporaryDirectory(prefix="attnbench-peer-") as tmp:
        for i, (pid, pt) in enumerate(points, 1):
            row, skip = start_row(pid, pt)
            if skip:
                row.update(status="skipped", reason=skip)
            else:
                try:
                    if key != inputs_key(pt) or (point_pass(pt) != "forward" and "d_out" not in data):
                        # Points sharing inputs are adjacent in the plan: fetched once, from a backward point
                        # among them when there is one (its files are the forward's and dO, the gradients').
                        key, data = None, None  # the old inputs go before the new ones are loaded
                        data = fetch_inputs(exe, a.config, fetch_point(points, i - 1), tmp)
                        key = inputs_key(pt)
                    measure(torch, pt, row, data, settings, probe, calibration, interference)
                except AttnbenchError as e:
                    row.update(status="failed", reason=f"attnbench inputs: {e}")
                except MemoryError:
                    row.update(status="failed", reason="out of memory (MemoryError)")
                except RuntimeError as e:
                    row.update(status="failed", reason=f"torch: {e}")
            row["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            # One complete line per point, flushed and synced: a crash leaves at most a torn last line,
            # which the readers (plot.py) drop.
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
            counts[row["status"]] += 1
            detail = f"{row['time_ms']['median']:.4g} ms" if row["status"] == "ok" else f"({row['reason']})"
            print(f"[{i}/{len(points)}] {row['status']} {row['id']}  {detail}", flush=True)
    print(f"{PROG}: {counts['ok']} ok, {counts['skipped']} skipped, {counts['failed']} failed; rows in {path}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
