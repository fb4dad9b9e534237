#!/usr/bin/python3
"""PyTorch peer: runs the exact-attention points of an attnbench sweep config in PyTorch on the CPU.

    /usr/bin/python3 scripts/peers/torch_attention.py CONFIG.json [--out DIR] [--filter TEXT]

For every (shape, mask, regime, threads) point of the config it times
    torch.softmax(q @ k.transpose(-2, -1) * scale + mask, dim=-1) @ v
with the config's measure settings and appends one row per point, in the sweep's row schema with variant
"torch_naive", to DIR/results.peers.jsonl (DIR defaults to results/<config name>, as `attnbench run`), so
scripts/plot.py draws PyTorch next to the C++ variants. Q, K, V are the sweep's own inputs, bit for bit: the
same seeded generator (splitmix64 + Box-Muller, common/random.hpp) and seed derivation (bench/lib/
sweep_config.cpp expand_plan). Accuracy is measured against an fp64 recomputation on the same rows the
sweep samples; memory is the peak RSS increase during timing (the C++ probe's method: VmHWM reset through
/proc/self/clear_refs, else a ru_maxrss delta, else null).
Without torch (Debian's python3-torch) it prints "torch not available: ..." and exits 0.
Exit codes: 0 done (or torch missing), 1 some point failed, 2 bad config or option.
"""
import argparse
import json
import math
import os
import re
import resource
import sys
import time

try:  # numpy and torch come together (Debian's python3-torch depends on python3-numpy); see main()
    import numpy as np
except ImportError:
    np = None

PROG = "torch_attention.py"
VARIANT = "torch_naive"
ID_PREFIX = "peer/"  # ids never collide with the C++ rows (and --resume there never sees these)
GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1
FNV_PRIME = 1099511628211


class ConfigError(Exception):
    pass


# ---------------------------------------------------------------------------------------------------------
# The config: the sweep's schema and defaults (bench/lib/sweep_config.cpp), only the parts this runner needs.


def fail(path, msg):
    raise ConfigError(f"{path}: {msg}")


def axis(value, path, check):
    if isinstance(value, list):
        if not value:
            fail(path, "must not be an empty list")
        return [check(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return [check(value, path)]


def pos_int(lo, hi):
    def check(v, path):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or not lo <= v <= hi:
            fail(path, f"must be an integer in [{lo}, {hi}], got {json.dumps(v)}")
        return int(v)
    return check


def number(lo, hi, what):
    def check(v, path):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
            fail(path, f"must be {what}, got {json.dumps(v)}")
        return float(v)
    return check


def fmt_g(x):
    """C++ `ostream << double` (default precision 6), as the sweep's labels print numbers."""
    return f"{x:g}"


def parse_mask(v, path):
    if not isinstance(v, str):
        fail(path, f"must be a mask string (none, causal, pad, pad=F, causal+pad=F), got {json.dumps(v)}")
    causal, pad = False, None
    for part in v.split("+"):
        if part == "none" and v == "none":
            continue
        if part == "causal":
            causal = True
        elif part == "pad" or part.startswith("pad="):
            try:
                pad = float(part[4:]) if len(part) > 4 else 0.25
            except ValueError:
                fail(path, f"padding fraction in '{v}' is not a number")
            if not 0 <= pad <= 1:
                fail(path, f"padding fraction must be in [0, 1], got '{part[4:]}'")
        else:
            fail(path, f"unknown mask '{part}' in '{v}' (allowed: none, causal, pad, pad=F with F in [0, 1], "
                       "joined by '+')")
    label = "+".join(([("causal")] if causal else []) + ([f"pad={fmt_g(pad)}"] if pad is not None else [])) or "none"
    spec = "+".join((["causal"] if causal else []) + (["pad"] if pad is not None else []))
    return {"causal": causal, "pad": pad, "label": label, "spec": spec}


def parse_bytes(v, where):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if not math.isfinite(v) or v < 1:
            fail(where, f"must be a positive number of bytes, got {json.dumps(v)}")
        return int(v)
    m = re.fullmatch(r"\s*([0-9]+(\.[0-9]+)?)\s*(B|KiB|MiB|GiB|TiB|K|M|G|T|KB|MB|GB|TB)?\s*", v) if isinstance(v, str) else None
    if not m:
        fail(where, f'must be bytes as a number or a string like "8GiB" or "512MiB", got {json.dumps(v)}')
    mult = {"": 1, "B": 1}.get(m.group(3) or "", None)
    if mult is None:
        mult = 1024 ** ("KMGT".index(m.group(3)[0]) + 1)
    return int(float(m.group(1)) * mult)


def load_config(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"config '{path}': cannot read ({e.strerror})")
    try:
        j = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"config '{path}': invalid JSON ({e})")
    if not isinstance(j, dict):
        raise ConfigError(f"config '{path}': must be a JSON object")
    try:
        return parse_config(j)
    except ConfigError as e:
        raise ConfigError(f"config '{path}': {e}")


def parse_config(j):
    c = {}
    name = j.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name) or name.startswith("."):
        fail("name", f"must be 1-64 characters of A-Z a-z 0-9 _ . - not starting with '.', got {json.dumps(name)}")
    c["name"] = name
    sweep = j.get("sweep", {})
    if not isinstance(sweep, dict):
        fail("sweep", f"must be an object, got {json.dumps(sweep)}")
    size = pos_int(1, 1 << 40)
    c["batch"] = axis(sweep.get("batch", 1), "sweep.batch", size)
    c["heads"] = axis(sweep.get("heads", 8), "sweep.heads", size)
    c["head_dim"] = axis(sweep.get("head_dim", 64), "sweep.head_dim", size)
    if "seq_len" in sweep:
        if "seq_q" in sweep or "seq_kv" in sweep:
            fail("sweep.seq_len", "give either seq_len (self-attention) or seq_q and seq_kv (cross-attention), not both")
        lens = axis(sweep["seq_len"], "sweep.seq_len", size)
        c["seqs"] = [(n, n) for n in lens]
    elif "seq_q" in sweep and "seq_kv" in sweep:
        qs = axis(sweep["seq_q"], "sweep.seq_q", size)
        kvs = axis(sweep["seq_kv"], "sweep.seq_kv", size)
        c["seqs"] = [(q, kv) for q in qs for kv in kvs]
    else:
        fail("sweep.seq_len", "missing: the sequence lengths to sweep (or seq_q and seq_kv)")
    c["masks"] = axis(sweep.get("mask", "none"), "sweep.mask", parse_mask)
    avail = len(os.sched_getaffinity(0))
    c["threads"] = axis(sweep.get("threads", avail), "sweep.threads", pos_int(1, avail))
    c["dropout"] = number(0, 0.999999, "a probability in [0, 1)")(sweep.get("dropout", 0), "sweep.dropout")
    regimes = []

    def regime(r, path):
        if not isinstance(r, dict) or "regime" not in r:
            fail(path, "must be an object with key 'regime' (gaussian or tokens)")
        if r["regime"] == "gaussian":
            for s in axis(r.get("std", 1.0), f"{path}.std", number(1e-6, 1e3, "a standard deviation in [1e-6, 1000]")):
                regimes.append({"kind": "gaussian", "std": s, "label": f"gaussian(std={fmt_g(s)})"})
        elif r["regime"] == "tokens":
            text = r.get("text")
            regimes.append({"kind": "tokens", "label": f"tokens({os.path.basename(str(text))})"})
        else:
            fail(f"{path}.regime", f"must be 'gaussian' or 'tokens', got {json.dumps(r['regime'])}")
    axis(j.get("inputs", {"regime": "gaussian", "std": 1.0}), "inputs", regime)
    c["regimes"] = regimes
    m = j.get("measure", {})
    if not isinstance(m, dict):
        fail("measure", f"must be an object, got {json.dumps(m)}")
    c["measure"] = {
        "warmup": pos_int(0, 1000)(m.get("warmup", 1), "measure.warmup"),
        "min_reps": pos_int(1, 100000)(m.get("min_reps", 3), "measure.min_reps"),
        "max_reps": pos_int(1, 100000)(m.get("max_reps", 50), "measure.max_reps"),
        "min_time_s": number(0, 3600, "seconds in [0, 3600]")(m.get("min_time_s", 0.2), "measure.min_time_s"),
        "max_time_s": number(0.001, 86400, "seconds in [0.001, 86400]")(m.get("max_time_s", 10), "measure.max_time_s"),
    }
    a = j.get("accuracy", {})
    if not isinstance(a, dict):
        fail("accuracy", f"must be an object, got {json.dumps(a)}")
    ref = a.get("reference", "auto")
    if ref not in ("auto", "full", "sampled", "none"):
        fail("accuracy.reference", f"must be one of auto, full, sampled, none, got {json.dumps(ref)}")
    c["accuracy"] = {"reference": ref, "rows": pos_int(1, 1 << 20)(a.get("rows", 64), "accuracy.rows")}
    if "memory_budget" in j:
        c["memory_budget"] = parse_bytes(j["memory_budget"], "memory_budget")
    else:  # the sweep's default: half the physical memory
        c["memory_budget"] = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    c["seed"] = pos_int(0, 1 << 53)(j.get("seed", 0), "seed")
    return c


# ---------------------------------------------------------------------------------------------------------
# The sweep's inputs, bit for bit (common/random.hpp, bench/lib/inputs.cpp)


def mix64(x):
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def fill_normal(n, seed, std):
    """attn::fill_normal: Rng(seed) is splitmix64 (output k = mix64(state0 + k * golden)), normals by
    Box-Muller in pairs (cos first, then the spare sin), each rounded once to float32."""
    with np.errstate(over="ignore"):
        state0 = int(mix64(np.array([(seed ^ 0x243F6A8885A308D3) & MASK64], np.uint64))[0])
        pairs = (n + 1) // 2
        k = np.arange(1, 2 * pairs + 1, dtype=np.uint64)
        states = np.uint64(state0) + k * np.uint64(GOLDEN)
        u = (mix64(states) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    u1 = np.maximum(u[0::2], 1e-300)
    u2 = u[1::2]
    r = np.sqrt(-2.0 * np.log(u1))
    t = 6.283185307179586 * u2
    out = np.empty(2 * pairs, np.float64)
    out[0::2] = r * np.cos(t)
    out[1::2] = r * np.sin(t)
    return (std * out[:n]).astype(np.float32)


def input_seed(config_seed, key):
    s = config_seed
    for ch in key.encode():
        s = ((s ^ ch) * FNV_PRIME) & MASK64
    return s


# ---------------------------------------------------------------------------------------------------------
# Measurement


def sample_rows(seq_q, count):
    if count >= seq_q or count <= 0:
        return list(range(seq_q))
    if count == 1:
        return [seq_q - 1]
    return sorted(set(r * (seq_q - 1) // (count - 1) for r in range(count)))


def summarize(samples):
    s = np.sort(np.asarray(samples, float))
    pct = lambda q: float(np.percentile(s, q * 100))  # linear interpolation, as the C++ summarize()
    mean = float(s.mean())
    cv = float(s.std(ddof=1) / mean) if len(s) > 1 and mean > 0 else 0.0
    return {"median": pct(0.5), "p10": pct(0.1), "p90": pct(0.9), "mean": mean, "cv": cv, "reps": len(s)}


def time_repeated(fn, m):
    """attn::time_repeated's stopping rule; also returns the last output (checked for accuracy, so the
    largest points are not run once more)."""
    for _ in range(m["warmup"]):
        fn()
    samples, total = [], 0.0
    while True:
        t0 = time.perf_counter()
        result = fn()
        ms = (time.perf_counter() - t0) * 1000.0
        samples.append(ms)
        total += ms / 1000.0
        if len(samples) >= m["max_reps"] or total >= m["max_time_s"]:
            break
        if len(samples) >= m["min_reps"] and total >= m["min_time_s"]:
            break
    return summarize(samples), result


class MemoryProbe:
    """Peak RSS increase over a region: VmHWM reset through /proc/self/clear_refs (the C++ probe), else the
    growth of ru_maxrss (zero when the region stays below an earlier peak), else unsupported."""

    def __init__(self):
        self.method = None
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            if self._hwm() is not None:
                self.method = "VmHWM reset per point"
        except OSError:
            self.method = "ru_maxrss delta"

    @staticmethod
    def _hwm():
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    @staticmethod
    def _rss():
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    def reset(self):
        if self.method == "VmHWM reset per point":
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.base = self._rss()
        else:
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def peak_increase(self):
        if self.method == "VmHWM reset per point":
            peak = max(self._hwm() or 0, self._rss() or 0)
            return max(0, peak - self.base) if self.base is not None else None
        if self.method == "ru_maxrss delta":
            return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base)
        return None


def compare_outputs(got, want):
    """attn::compare_outputs on [rows, dim]: max |diff|, relative L2, mean cosine, NaN/Inf counts."""
    got = got.astype(np.float64)
    nan_count, inf_count = int(np.isnan(got).sum()), int(np.isinf(got).sum())
    bad_rows = ~np.isfinite(got).all(axis=1)
    nonfinite = bool((~np.isfinite(got) & np.isfinite(want)).any())
    g, w = np.where(np.isfinite(got), got, 0.0), np.where(np.isfinite(got), want, 0.0)
    diff = np.abs(g - w)
    max_abs = float(diff.max()) if diff.size else 0.0
    want2 = float((w * w).sum())
    rel = math.sqrt(float((diff * diff).sum()) / want2) if want2 > 0 else math.sqrt(float((diff * diff).sum()))
    gg, ww, gw = (g * g).sum(1), (w * w).sum(1), (g * w).sum(1)
    cos = np.where((gg == 0) & (ww == 0), 1.0, np.where((gg > 0) & (ww > 0), gw / np.sqrt(np.maximum(gg * ww, 1e-300)), 0.0))
    cos[bad_rows] = 0.0
    mean_cos = float(cos.mean()) if len(cos) else 1.0
    if nonfinite:
        max_abs = rel = math.inf
    return max_abs, rel, mean_cos, nan_count, inf_count


def num(x):
    """JSON has no NaN/Inf: written as strings, as the sweep does."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def reference(q, k, v, allowed, rows, scale):
    """fp64 exact softmax attention on query rows `rows`; a row with no allowed key is zeros."""
    qd = q[:, :, rows, :].astype(np.float64)
    s = np.einsum("bhid,bhjd->bhij", qd, k.astype(np.float64)) * scale
    if allowed is not None:
        s = np.where(allowed[:, :, rows, :], s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(mx)
    e = np.exp(s - np.where(empty, 0.0, mx))
    e = np.where(np.isfinite(s), e, 0.0)
    den = e.sum(axis=-1, keepdims=True)
    p = e / np.where(den > 0, den, 1.0)
    return np.einsum("bhij,bhjd->bhid", p, v.astype(np.float64))


def plan(c):
    """The exact points of the config, in the sweep's order (regime, B, H, D, n, mask, threads)."""
    for regime in c["regimes"]:
        for B in c["batch"]:
            for H in c["heads"]:
                for D in c["head_dim"]:
                    for Lq, Lkv in c["seqs"]:
                        for mask in c["masks"]:
                            key = f"B={B},H={H},Lq={Lq},Lkv={Lkv},D={D},{mask['label']},{regime['label']}"
                            for T in c["threads"]:
                                pid = f"{ID_PREFIX}{VARIANT}:B={B},H={H},Lq={Lq},Lkv={Lkv},D={D}"
                                if mask["spec"]:
                                    pid += "," + mask["spec"]
                                if c["dropout"] > 0:
                                    pid += f",dropout={fmt_g(c['dropout'])},seed={c['seed']}"
                                if mask["pad"] is not None:
                                    pid += f",padfrac={fmt_g(mask['pad'])}"
                                pid += f",{regime['label']},T={T}"
                                yield {"B": B, "H": H, "D": D, "Lq": Lq, "Lkv": Lkv, "mask": mask, "regime": regime,
                                       "threads": T, "id": pid, "key": key, "seed": input_seed(c["seed"], key)}


def measure_point(torch, c, pt, probe, calibration):
    B, H, D, Lq, Lkv, T = pt["B"], pt["H"], pt["D"], pt["Lq"], pt["Lkv"], pt["threads"]
    mask = pt["mask"]
    # attnbench's exact-attention count (common/mask.hpp exact_attention_flops): 4·d per attended pair,
    # causal counting the pairs below the diagonal only (PyTorch computes them all, as naive does).
    pairs = Lq * Lkv
    if mask["causal"]:
        pairs = Lq * (Lq + 1) / 2 if Lq <= Lkv else Lkv * (Lkv + 1) / 2 + (Lq - Lkv) * Lkv
    flops = 4.0 * B * H * D * pairs
    inputs_bytes = 4 * (B * H * Lq * D + 2 * B * H * Lkv * D) + (B * Lkv if mask["pad"] is not None else 0)
    # q @ k^T materialises the scores, and each of * scale, + mask, softmax makes one more [B, H, Lq, Lkv]
    # tensor while the previous is alive: two score-sized tensors at a time, plus the additive mask.
    scores = 4 * B * H * Lq * Lkv
    workspace = 2 * scores + (4 * B * Lq * Lkv if mask["causal"] or mask["pad"] is not None else 0)
    estimated = 4 * B * H * Lq * D + workspace
    row = {"id": pt["id"], "variant": VARIANT, "params": {}, "batch": B, "heads": H, "seq_q": Lq, "seq_kv": Lkv,
           "head_dim": D, "mask": mask["label"], "regime": pt["regime"]["label"], "threads": T,
           "dropout": c["dropout"], "exact": True, "status": "ok", "reason": "",
           "flops": None, "gflops": None, "frac_sgemm": None, "frac_peak": None,
           "peer": {"library": f"torch {torch.__version__}",
                    "formula": "softmax(q @ k.transpose(-2, -1) * scale + mask, dim=-1) @ v",
                    "memory_probe": probe.method},
           "memory": {"estimated_bytes": estimated, "inputs_bytes": inputs_bytes, "workspace_bytes": workspace,
                      "peak_bytes": None}}
    if pt["regime"]["kind"] != "gaussian":
        row.update(status="skipped", reason="regime 'tokens': the PyTorch peer makes gaussian inputs only")
        return row
    if c["dropout"] > 0:
        row.update(status="skipped", reason="dropout: the PyTorch peer times attention without dropout")
        return row
    if inputs_bytes + estimated > c["memory_budget"]:
        row.update(status="skipped", reason=f"needs {inputs_bytes + estimated} bytes (inputs {inputs_bytes}, output "
                                            f"and workspace {estimated}) > memory_budget {c['memory_budget']}")
        return row
    std = pt["regime"]["std"]
    s = pt["seed"]
    q = fill_normal(B * H * Lq * D, (s * 3 + 1) & MASK64, std).reshape(B, H, Lq, D)
    k = fill_normal(B * H * Lkv * D, (s * 3 + 2) & MASK64, std).reshape(B, H, Lkv, D)
    v = fill_normal(B * H * Lkv * D, (s * 3 + 3) & MASK64, 1.0).reshape(B, H, Lkv, D)
    allowed = None
    if mask["causal"] or mask["pad"] is not None:
        allowed = np.ones((B, 1, Lq, Lkv), bool)
        if mask["causal"]:  # top-left aligned, as attnbench: query i attends keys j <= i
            allowed &= np.tril(np.ones((Lq, Lkv), bool))[None, None]
        if mask["pad"] is not None:
            padded = int(math.floor(mask["pad"] * Lkv + 0.5))  # llround
            if padded:
                allowed[:, :, :, Lkv - padded:] = False
    scale = 1.0 / math.sqrt(D)
    torch.set_num_threads(T)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    tmask = None
    if allowed is not None:
        tmask = torch.zeros(allowed.shape, dtype=torch.float32)
        tmask.masked_fill_(torch.from_numpy(~allowed), float("-inf"))

    def forward():
        s_ = tq @ tk.transpose(-2, -1) * scale
        if tmask is not None:
            s_ = s_ + tmask
        return torch.softmax(s_, dim=-1) @ tv

    try:
        with torch.no_grad():
            probe.reset()
            t, out = time_repeated(forward, c["measure"])
            peak = probe.peak_increase()
            out = out.numpy()
    except MemoryError:
        row.update(status="failed", reason="out of memory (MemoryError)")
        return row
    except RuntimeError as e:
        row.update(status="failed", reason=f"torch: {e}")
        return row
    gflops = flops / (t["median"] * 1e6)
    row["time_ms"] = t
    row["flops"] = flops
    row["gflops"] = gflops
    row["frac_sgemm"] = gflops / calibration["sgemm"][T] if T in calibration["sgemm"] else None
    row["frac_peak"] = gflops / calibration["peak"][T] if calibration["peak"].get(T) else None
    row["memory"]["peak_bytes"] = peak
    row["nonfinite_inputs"] = 0
    mode = c["accuracy"]["reference"]
    if mode == "auto":
        mode = "full" if Lq <= c["accuracy"]["rows"] else "sampled"
    acc = {"reference": mode}
    if mode != "none":
        rows = sample_rows(Lq, Lq if mode == "full" else c["accuracy"]["rows"])
        want = reference(q, k, v, allowed, rows, scale).reshape(-1, D)
        got = out[:, :, rows, :].reshape(-1, D)
        max_abs, rel, cos, nans, infs = compare_outputs(got, want)
        acc.update(rows=len(rows), max_abs_err=num(max_abs), rel_l2_err=num(rel), mean_cosine=num(cos),
                   nan_count=nans, inf_count=infs)
        # A fully masked row is NaN in PyTorch (softmax of all -inf) where attnbench writes zeros: reported,
        # not failed, since it is the library's documented behaviour.
        if nans or infs:
            row["reason"] = f"{nans + infs} NaN/Inf values in the output (rows with no allowed key)"
    row["accuracy"] = acc
    return row


def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="sweep config (JSON), as for `attnbench run`")
    ap.add_argument("--out", metavar="DIR", help="results folder (default results/<config name>)")
    ap.add_argument("--filter", metavar="TEXT", help="only points whose id contains TEXT")
    a = ap.parse_args(argv)
    try:
        c = load_config(a.config)
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        import torch
        if np is None:
            raise ImportError("No module named 'numpy'")
    except ImportError as e:
        print(f"torch not available: {e}; install Debian's python3-torch (with python3-numpy) to run the "
              "PyTorch peer")
        return 0
    out_dir = a.out or os.path.join("results", c["name"])
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        print(f"{PROG}: error: --out '{out_dir}': exists and is not a directory", file=sys.stderr)
        return 2
    points = [p for p in plan(c) if not a.filter or a.filter in p["id"]]
    if not points:
        print(f"{PROG}: error: --filter '{a.filter}' matches none of the points", file=sys.stderr)
        return 2
    os.makedirs(out_dir, exist_ok=True)
    calibration = {"sgemm": {}, "peak": {}}
    try:  # the C++ run's calibrations, when they are there, give the peer rows frac_sgemm and frac_peak
        with open(os.path.join(out_dir, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        calibration["sgemm"] = {int(x["threads"]): float(x["gflops"]) for x in meta.get("sgemm_calibration", [])}
        # fma_peak has one entry per (threads, SIMD target): PyTorch picks its own kernels, so its bound is the
        # best target's peak, the highest one at each thread count.
        for x in meta.get("fma_peak", []):
            T = int(x["threads"])
            calibration["peak"][T] = max(calibration["peak"].get(T, 0.0), float(x["gflops"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    path = os.path.join(out_dir, "results.peers.jsonl")
    probe = MemoryProbe()
    counts = {"ok": 0, "skipped": 0, "failed": 0}
    print(f"{PROG}: torch {torch.__version__}: {len(points)} points -> {path}")
    with open(path, "a", encoding="utf-8") as f:
        for i, pt in enumerate(points, 1):
            row = measure_point(torch, c, pt, probe, calibration)
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
