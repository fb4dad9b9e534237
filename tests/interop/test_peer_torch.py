#!/usr/bin/python3
"""The PyTorch peer (scripts/peers/torch_attention.py) is fed by attnbench's plan: its Q, K, V are the sweep's
bit for bit, it fetches each input set once, its ids are the exact points' ids under "peer/torch_naive", its
rows have exactly the C++ row's fields and types, its accuracy against the fp64 reference is fp32-exact, it
skips what the plan skips for memory (and dropout, and what PyTorch's memory would exceed) but computes what a
variant lacks a capability for, and its errors name the config field or the missing attnbench. Grouped-query
attention (K/V repeated per group) and the lower-right causal mask (rows with no key: zeros) match an
independent fp64 NumPy reference, in process and through attnbench's plan and inputs. Backward points
(sweep.pass): one peer row per C++ row with its ",pass=" id, the C++ row's flops (2.5x the forward's for the
backward), every field, gradients within fp32 of the fp64 gradient reference `attnbench inputs` writes (which is
the runner's: naive's gradients on those files have the sweep row's grad_accuracy exactly, and an independent
NumPy gradient agrees), rows that attnbench's row reader (`attnbench compare`) reads.

Run by ctest as `/usr/bin/python3 test_peer_torch.py --attnbench PATH`. Exit 0 pass, 1 fail, 77 skip (numpy or
torch missing). Tiny shapes: a few seconds, most of it importing torch and attnbench's sgemm calibration."""
import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import torch  # noqa: F401  (the peer imports it; in-process runs share this import)
except ImportError as e:
    print(f"skipped: {e} (install python3-numpy python3-torch; for {sys.executable})")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "scripts", "peers", "torch_attention.py")
MEASURE = {"warmup": 0, "min_reps": 1, "max_reps": 2, "min_time_s": 0, "max_time_s": 1}
TEXT = ("attention is all you need said the paper and the benchmark measured how long attention takes "
        "on the cpu for every length of sequence the sweep lists ") * 3

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)
    return cond


def load_peer():
    spec = importlib.util.spec_from_file_location("torch_attention", PEER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_config(tmp, name, threads=1, **over):
    cfg = {"name": name, "variants": ["linear", "naive", "tiled"],
           "sweep": {"batch": 2, "heads": 2, "head_dim": 8, "seq_len": [16, 40], "mask": ["none", "causal+pad=0.25"],
                     "threads": threads},
           "inputs": [{"regime": "gaussian", "std": [1.0, 2.0]}, {"regime": "tokens", "text": "words.txt"}],
           "measure": MEASURE, "accuracy": {"reference": "sampled", "rows": 5}, "memory_budget": "1GiB", "seed": 9}
    cfg.update(over)
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run_peer_inprocess(mod, *argv):
    """(exit code, stderr) of the peer's main() in this process (torch is imported once)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = mod.main(list(argv))
    return rc, err.getvalue()


def fields(row, table, prefix=""):
    """{field path: value}, nested objects flattened except where the field table names the object itself."""
    out = {}
    for k, v in row.items():
        path = prefix + k
        if isinstance(v, dict) and v and path not in table:
            out.update(fields(v, table, path + "."))
        else:
            out[path] = v
    return out


def type_ok(v, types):
    kinds = {"string": lambda x: isinstance(x, str), "null": lambda x: x is None,
             "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
             "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
             "boolean": lambda x: isinstance(x, bool), "object": lambda x: isinstance(x, dict),
             "array": lambda x: isinstance(x, list)}
    return any(kinds[t](v) for t in types.split("|"))


def tolerance(q, k, v, scale):
    """fp32 bound of exact attention (as tests/interop/test_eval_torch.py, from exact_abs_tolerance): u max|v|
    (2 D S + 2 Lkv + 16) with S = scale max|q_i| max|k_j|, times 4 for reordered sums."""
    u = 2.0 ** -24
    qn = np.sqrt((q.astype(np.float64) ** 2).sum(-1)).max()
    kn = np.sqrt((k.astype(np.float64) ** 2).sum(-1)).max()
    return 4 * u * np.abs(v).max() * (2 * q.shape[-1] * scale * qn * kn + 2 * k.shape[-2] + 16)


def test_sweep(exe, mod, tmp):
    # Two thread counts where there are two cores: two peer points share each input set.
    cores = json.loads(subprocess.run([exe, "info", "--json"], capture_output=True, text=True, timeout=60).stdout)["threads"]
    cfg = write_config(tmp, "peer-sweep", threads=[1, 2] if cores >= 2 else 1)
    with open(os.path.join(tmp, "words.txt"), "w") as f:
        f.write(TEXT)
    plan = mod.load_plan(exe, cfg)
    naive = {p["id"]: p for p in plan if p["variant"] == "naive"}
    keys = {p["inputs"]["key"] for p in plan}
    out = os.path.join(tmp, "out")
    # The C++ sweep of the exact baseline first: its rows and meta.json (calibrations) are what the peer joins.
    r = subprocess.run([exe, "run", cfg, "--out", out, "--filter", "naive:"], capture_output=True, text=True, timeout=300)
    if not check(r.returncode == 0, f"attnbench run (naive points) exits 0 ({r.stderr.strip()[-300:]})"):
        return
    with open(os.path.join(out, "results.jsonl")) as f:
        cpp = {row["id"]: row for row in map(json.loads, f)}
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)

    fed, fetched = {}, []
    real_fetch, real_measure = mod.fetch_inputs, mod.measure

    def fetch(exe_, config, pt, tmp_):
        fetched.append(pt["inputs"]["key"])
        return real_fetch(exe_, config, pt, tmp_)

    def measure(torch_, pt, row, data, *rest):
        fed[row["id"]] = {k: a.copy() for k, a in data.items()}
        return real_measure(torch_, pt, row, data, *rest)

    mod.fetch_inputs, mod.measure = fetch, measure
    try:
        rc, err = run_peer_inprocess(mod, cfg, "--out", out, "--attnbench", exe)
    finally:
        mod.fetch_inputs, mod.measure = real_fetch, real_measure
    if not check(rc == 0, f"peer exits 0 ({err.strip()[-300:]})"):
        return
    with open(os.path.join(out, "results.peers.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    want_ids = ["peer/torch_" + i for i in naive]
    check([r["id"] for r in rows] == want_ids,
          f"one peer row per (shape, mask, regime, threads), in plan order: 'peer/torch_' + the naive point's id "
          f"({len(rows)} rows, {len(naive)} naive points, {len(plan)} plan points)")
    check(sorted(fetched) == sorted(keys) and len(fetched) < len(plan),
          f"inputs fetched once per input set ({len(fetched)} fetches, {len(keys)} sets, {len(rows)} peer points)")
    check(all(r["status"] == "ok" and r["variant"] == "torch_naive" and r["reason"] == "" for r in rows),
          "every peer row ok, variant torch_naive, no reason")
    check(any(r["regime"].startswith("tokens(") for r in rows), "tokens regime points run (their inputs come from attnbench)")

    # Q, K, V (and the key padding) fed to PyTorch are attnbench's, bit for bit.
    same, checked = True, 0
    for pid, data in fed.items():
        cid = pid.removeprefix("peer/torch_")
        d = os.path.join(tmp, "inputs", str(checked))
        r = subprocess.run([exe, "inputs", cfg, "--filter", cid, "--out", d], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            check(False, f"attnbench inputs {cid} exits 0 ({r.stderr.strip()})")
            return
        names = ["q", "k", "v", "reference", "rows"] + (["key_padding"] if naive[cid]["problem"]["key_padding"] else [])
        for n in names:
            a = np.load(os.path.join(d, n + ".npy"))
            same &= n in data and data[n].dtype == a.dtype and np.array_equal(data[n], a)
        same &= set(data) == set(names)
        checked += 1
    check(same and checked == len(rows), f"the peer's Q, K, V, key padding, reference rows == `attnbench inputs` "
                                         f"of the same point, dtype and bits ({checked} points)")

    # ... and they are what `attnbench run` measured: naive on them (attnbench eval) has the run row's error.
    table = {f["field"]: f["type"] for f in json.loads(subprocess.run(
        [exe, "info", "--row-fields", "--json"], capture_output=True, text=True, timeout=60).stdout)
        if not f.get("ring_only") and not f.get("task_only")}  # the ring's and the quality task's: their rows only
    for pid in (want_ids[0], next(i for i in want_ids if "causal+pad" in i and "tokens(" in i)):
        data, c = fed[pid], cpp[pid.removeprefix("peer/torch_")]
        paths = {}
        for n in ("q", "k", "v", "key_padding"):
            if n in data:
                paths[n] = os.path.join(tmp, f"eval_{n}.npy")
                np.save(paths[n], data[n])
        o = os.path.join(tmp, "eval_out.npy")
        args = [exe, "eval", "--variant", "naive", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--out", o]
        if naive[c["id"]]["problem"]["causal"]:
            args.append("--causal")
        if "key_padding" in paths:
            args += ["--key-padding", paths["key_padding"]]
        r = subprocess.run(args, capture_output=True, text=True, timeout=60)
        if not check(r.returncode == 0, f"attnbench eval on the peer's inputs exits 0 ({r.stderr.strip()})"):
            return
        got = np.load(o)[:, :, data["rows"], :].astype(np.float64)
        err = float(np.abs(got - data["reference"]).max())
        check(err == c["accuracy"]["max_abs_err"] and c["status"] == "ok",
              f"{c['id']}: naive on the peer's inputs has the sweep row's max_abs_err exactly ({err!r} vs "
              f"{c['accuracy']['max_abs_err']!r})")

    # The row schema: the C++ row's field set and the field table's types; the plan's identity and flops.
    same = ("batch", "heads", "seq_q", "seq_kv", "head_dim", "mask", "regime", "threads", "dropout", "flops",
            "accuracy.reference", "accuracy.rows", "memory.inputs_bytes", "memory.reference_bytes")
    sgemm = {x["threads"]: x["gflops"] for x in meta["sgemm_calibration"]}
    peak = {t: max(x["gflops"] for x in meta["fma_peak"] if x["threads"] == t) for t in sgemm}
    wrong = {"fields": [], "types": [], "identity": [], "accuracy": [], "gflops": []}
    worst = 0.0
    for r in rows:
        c, f = cpp[r["id"].removeprefix("peer/torch_")], fields(r, table)
        fc = fields(c, table)
        if not set(f) == set(fc) == set(table):
            wrong["fields"].append((r["id"], sorted(set(f) ^ set(fc))))
        wrong["types"] += [(r["id"], k, v) for k, v in f.items() if k in table and not type_ok(v, table[k])]
        wrong["identity"] += [(r["id"], k, f.get(k), fc[k]) for k in same if f.get(k) != fc[k]]
        data, a = fed[r["id"]], r["accuracy"]
        tol = tolerance(data["q"], data["k"], data["v"], naive[c["id"]]["problem"]["scale"])
        err, rel, cos = (float(a[k]) if a[k] is not None else math.nan for k in ("max_abs_err", "rel_l2_err", "mean_cosine"))
        worst = max(worst, err / tol)
        if not (err <= tol and rel < 1e-5 and cos > 1 - 1e-9
                and a["nan_count"] == 0 and a["inf_count"] == 0 and a["rows"] == len(data["rows"]) == 5):
            wrong["accuracy"].append((r["id"], a, tol))
        T = r["threads"]
        if not (r["gflops"] > 0 and abs(r["frac_sgemm"] - r["gflops"] / sgemm[T]) <= 1e-12 * r["frac_sgemm"]
                and abs(r["frac_peak"] - r["gflops"] / peak[T]) <= 1e-12 * r["frac_peak"]
                and r["time_ms"]["reps"] >= 1 and r["nonfinite_inputs"] == 0):
            wrong["gflops"].append(r["id"])
    check(not wrong["fields"], f"every peer row has exactly the C++ row's fields, the field table's ({wrong['fields']})")
    check(not wrong["types"], f"every field has the field table's type ({wrong['types']})")
    check(not wrong["identity"], f"identity, flops and accuracy rows as the C++ row of the point ({wrong['identity']})")
    check(not wrong["accuracy"], f"fp32-exact against the fp64 reference on the 5 sampled rows (largest "
                                 f"max_abs_err / bound {worst:.2e}; {wrong['accuracy']})")
    check(not wrong["gflops"], f"gflops from the plan's flops, frac_sgemm and frac_peak from meta.json's "
                               f"calibrations ({wrong['gflops']})")


def test_skips(exe, mod, tmp):
    # The plan skips every point under a tiny memory_budget: the peer skips them with the plan's reason.
    cfg = write_config(tmp, "peer-tiny-budget", inputs={"regime": "gaussian"}, memory_budget=1000)
    plan = {p["id"]: p for p in mod.load_plan(exe, cfg) if p["variant"] == "naive"}
    out = os.path.join(tmp, "skip-out")
    rc, err = run_peer_inprocess(mod, cfg, "--out", out, "--attnbench", exe, "--filter", "Lq=16")
    with open(os.path.join(out, "results.peers.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    check(rc == 0 and len(rows) == 2 and all(r["status"] == "skipped" and "Lq=16" in r["id"]
                                             and r["reason"] == plan[r["id"].removeprefix("peer/torch_")]["skip"]
                                             and r["time_ms"]["median"] is None and r["flops"] is None for r in rows),
          f"points the plan skips: skipped with its reason, nothing measured; --filter passed through (rc {rc}, "
          f"{[r['reason'][:60] for r in rows]})")
    # A budget the exact variant fits in but PyTorch's score matrices do not; and dropout.
    need = max(p["memory"]["need_bytes"] for p in plan.values() if "Lq=40" in p["id"])
    cfg = write_config(tmp, "peer-torch-budget", inputs={"regime": "gaussian"}, memory_budget=need)
    cfg_drop = write_config(tmp, "peer-dropout", inputs={"regime": "gaussian"})
    with open(cfg_drop) as f:
        j = json.load(f)
    j["sweep"]["dropout"] = 0.1
    with open(cfg_drop, "w") as f:
        json.dump(j, f)
    for c, filt, want in ((cfg, "Lq=40", "in PyTorch"), (cfg_drop, "Lq=16", "dropout")):
        out = os.path.join(tmp, os.path.basename(c) + "-out")
        rc, err = run_peer_inprocess(mod, c, "--out", out, "--attnbench", exe, "--filter", filt)
        with open(os.path.join(out, "results.peers.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        check(rc == 0 and len(rows) == 2 and all(r["status"] == "skipped" and want in r["reason"] for r in rows),
              f"{os.path.basename(c)}: skipped, reason mentions '{want}' ({[r['reason'][:80] for r in rows]})")
    # A sweep over SIMD targets: PyTorch runs each point once, its id without ",isa=".
    cfg = write_config(tmp, "peer-isa", inputs={"regime": "gaussian"})
    with open(cfg) as f:
        j = json.load(f)
    j["sweep"]["isa"] = ["best", "scalar"]
    with open(cfg, "w") as f:
        json.dump(j, f)
    pts = mod.peer_points(mod.load_plan(exe, cfg))
    check(len(pts) == 4 and not any(",isa=" in pid for pid, _ in pts),
          f"sweep.isa: one peer point per shape and mask, ids without ',isa=' ({[p for p, _ in pts]})")


def reference_np(q, k, v, scale, causal=False, lower_right=False, key_padding=None):
    """fp64 attention written out apart from the peer: query head h reads K/V head h // (H // Hkv), key j is
    allowed to query i iff (not causal or j <= i) and (not lower_right or j <= i + Lkv - Lq) and not padded;
    a row with no allowed key is zeros."""
    B, H, Lq, D = q.shape
    Hkv, Lkv = k.shape[1], k.shape[2]
    out = np.zeros((B, H, Lq, D))
    for b in range(B):
        for h in range(H):
            kh, vh = k[b, h // (H // Hkv)].astype(np.float64), v[b, h // (H // Hkv)].astype(np.float64)
            for i in range(Lq):
                ok = [j for j in range(Lkv) if (not causal or j <= i) and (not lower_right or j <= i + Lkv - Lq)
                      and (key_padding is None or not key_padding[b, j])]
                if not ok:
                    continue
                s = kh[ok] @ q[b, h, i].astype(np.float64) * scale
                w = np.exp(s - s.max())
                out[b, h, i] = (w / w.sum()) @ vh[ok]
    return out


def test_point_problem(mod):
    base = {"batch": 1, "heads": 8, "seq_q": 5, "seq_kv": 37, "head_dim": 8, "scale": 0.5, "causal": False,
            "key_padding": False, "dropout": 0.0, "seed": 0}
    cases = [  # (id, extra problem fields, want kv_heads, want causal_lower_right)
        ("naive:B=1,H=8,Hkv=2,Lq=5,Lkv=37,D=8,causal_lower_right,gaussian(std=1),T=1", {}, 2, True),
        ("naive:B=1,H=8,Hkv=2,Lq=5,Lkv=37,D=8,causal_lower_right+pad,padfrac=0.25,gaussian(std=1),T=1", {}, 2, True),
        ("naive:B=1,H=8,Lq=5,Lkv=37,D=8,causal,gaussian(std=1),T=1", {}, 8, False),
        ("naive:B=1,H=8,Lq=5,Lkv=37,D=8,gaussian(std=1),T=1", {"kv_heads": 4, "causal_lower_right": True}, 4, True),
        ("naive:B=1,H=8,Hkv=2,Lq=5,Lkv=37,D=8,causal_lower_right,gaussian(std=1),T=1",
         {"kv_heads": 2, "causal_lower_right": True}, 2, True),
        ("sliding_window{window=3}:B=1,H=8,Lq=5,Lkv=37,D=8,tokens(causal_lower_right.txt),T=1", {}, 8, False),
    ]
    wrong = []
    for pid, extra, kv, lr in cases:
        p = mod.point_problem({"id": pid, "problem": dict(base, **extra)})
        if (p["kv_heads"], p["causal_lower_right"]) != (kv, lr):
            wrong.append((pid, extra, p["kv_heads"], p["causal_lower_right"]))
    check(not wrong, f"kv_heads and causal_lower_right from the plan's fields, else the id's Hkv= and mask parts, "
                     f"else heads and none ({wrong})")


def test_gqa_lower_right_inprocess(exe, mod, tmp):
    """measure() on synthetic points: GQA by repeated K/V heads and the lower-right mask, against reference_np."""
    cfg = write_config(tmp, "peer-synthetic", inputs={"regime": "gaussian"}, sweep={"seq_len": 4, "heads": 2, "head_dim": 8})
    template = mod.load_plan(exe, cfg)[0]
    rng = np.random.RandomState(5)
    cases = [  # (H, Hkv, Lq, Lkv, mask parts)
        (8, 2, 7, 7, ""), (8, 1, 7, 7, "causal"), (6, 3, 9, 9, "pad"), (8, 2, 5, 37, "causal_lower_right"),
        (1, 1, 5, 37, "causal_lower_right"), (2, 2, 1, 300, "causal_lower_right"), (2, 2, 37, 5, "causal_lower_right"),
        (8, 2, 37, 5, "causal_lower_right"), (8, 1, 1, 300, "causal_lower_right+pad"),
        (6, 3, 5, 37, "causal+causal_lower_right"), (6, 3, 37, 5, "causal+causal_lower_right+pad"),
    ]
    wrong = []
    for H, Hkv, Lq, Lkv, mask in cases:
        B, D, parts = 2, 8, mask.split("+")
        q = rng.standard_normal((B, H, Lq, D)).astype(np.float32)
        k = rng.standard_normal((B, Hkv, Lkv, D)).astype(np.float32)
        v = rng.standard_normal((B, Hkv, Lkv, D)).astype(np.float32)
        pad = (rng.uniform(size=(B, Lkv)) < 0.3).astype(np.uint8) if "pad" in parts else None
        if pad is not None:
            pad[0, :] = 1  # batch 0 pads every key: all its rows are empty
        scale = 1 / math.sqrt(D)
        lr = "causal_lower_right" in parts
        pt = json.loads(json.dumps(template))
        shape = f":B={B},H={H}" + (f",Hkv={Hkv}" if Hkv != H else "") + f",Lq={Lq},Lkv={Lkv},D={D}"
        pt["id"] = "naive" + shape + ("," + mask if mask else "") + ",gaussian(std=1),T=1"
        pt["problem"] = {"batch": B, "heads": H, "seq_q": Lq, "seq_kv": Lkv, "head_dim": D, "scale": scale,
                         "causal": "causal" in parts, "key_padding": pad is not None, "dropout": 0.0, "seed": 0}
        pt["threads"], pt["skip"] = 1, None
        pt["row"]["accuracy"]["reference"] = "full"
        want = reference_np(q, k, v, scale, "causal" in parts, lr, pad)
        data = {"q": q, "k": k, "v": v, "reference": want, "rows": np.arange(Lq)}
        if pad is not None:
            data["key_padding"] = pad
        row, skip = mod.start_row("peer/torch_naive" + shape, pt)
        mod.measure(torch, pt, row, data, MEASURE, mod.MemoryProbe(), {"sgemm": {}, "peak": {}}, mod.InterferenceProbe())
        a, tol = row["accuracy"], tolerance(q, k, v, scale)
        extra = 2 * 4 * B * H * Lkv * D if Hkv != H else 0  # the repeated K and V
        ws = 2 * 4 * B * H * Lq * Lkv + (4 * Lq * Lkv * (B if pad is not None else 1) if mask else 0) + extra
        if not (skip == "" and a["nan_count"] == 0 and a["inf_count"] == 0 and float(a["max_abs_err"]) <= tol
                and a["rows"] == Lq and row["reason"] == "" and row["memory"]["workspace_bytes"] == ws):
            wrong.append((pt["id"], skip, a, tol, row["reason"], row["memory"]["workspace_bytes"], ws))
    # The interference rule (as attnbench's runner): never clean -> 1 + max_remeasure attempts, noisy; a
    # threshold above any possible score (steal + share <= 2) -> one attempt, not noisy. Asserts counts, not times.
    for limit, attempts, noisy in ((-1.0, 3, True), (3.0, 1, False)):
        r2, _ = mod.start_row("peer/torch_naive" + shape, pt)
        mod.measure(torch, pt, r2, data, dict(MEASURE, max_interference=limit, max_remeasure=2), mod.MemoryProbe(),
                    {"sgemm": {}, "peak": {}}, mod.InterferenceProbe())
        i = r2.get("interference") or {}
        check(r2.get("attempts") == attempts and r2.get("noisy") is noisy and 0 <= i.get("score", -1) <= 2
              and all(0 <= i.get(k, -1) <= 1 for k in ("steal_frac", "other_cpu_frac", "runq_wait_frac"))
              and i.get("window_s", 0) > 0,
              f"max_interference {limit}: {attempts} attempt(s), noisy {noisy}, the probe's fields in range "
              f"(got attempts {r2.get('attempts')}, noisy {r2.get('noisy')}, {i})")
    check(not wrong, f"{len(cases)} GQA / lower-right causal points: PyTorch (K/V repeated per group, empty rows "
                     f"zeroed) within the fp32 bound of an independent fp64 reference, no NaN, workspace counts "
                     f"the repeated K/V ({wrong})")


def test_sweep_gqa_lower_right(exe, mod, tmp):
    """Through the plan and `attnbench inputs`: lower-right causal with seq_q <, = 1 and > seq_kv, and GQA
    (sweep.kv_heads) when attnbench's config has it. The peer runs every point (none skipped, even where the
    plan skips a variant lacking the capability) within the fp32 bound of attnbench's fp64 reference rows."""
    sweep = {"batch": 1, "heads": 8, "kv_heads": [8, 2, 1], "head_dim": 8, "seq_q": [1, 5, 37], "seq_kv": [5, 300],
             "mask": ["none", "causal_lower_right", "causal+causal_lower_right", "causal_lower_right+pad=0.25"]}
    cfg = write_config(tmp, "peer-gqa", inputs={"regime": "gaussian"}, sweep=sweep)
    r = subprocess.run([exe, "run", cfg, "--dry-run", "--json"], capture_output=True, text=True, timeout=60)
    if r.returncode == 2 and "unknown key 'kv_heads'" in r.stderr:
        print("note  attnbench's sweep has no kv_heads axis (yet): the sweep test runs without GQA")
        del sweep["kv_heads"]
        cfg = write_config(tmp, "peer-gqa", inputs={"regime": "gaussian"}, sweep=sweep)
    plan = mod.load_plan(exe, cfg)
    naive = {p["id"]: p for p in plan if p["variant"] == "naive"}
    fed, real_measure = {}, mod.measure

    def measure(torch_, pt, row, data, *rest):
        fed[row["id"]] = (pt, {k: a for k, a in data.items()})
        return real_measure(torch_, pt, row, data, *rest)

    out = os.path.join(tmp, "gqa-out")
    mod.measure = measure
    try:
        rc, err = run_peer_inprocess(mod, cfg, "--out", out, "--attnbench", exe)
    finally:
        mod.measure = real_measure
    if not check(rc == 0, f"peer on the GQA / lower-right sweep exits 0 ({err.strip()[-300:]})"):
        return
    with open(os.path.join(out, "results.peers.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    check([r["id"] for r in rows] == ["peer/torch_" + i for i in naive] and all(r["status"] == "ok" for r in rows),
          f"one ok row per naive point, none skipped ({len(rows)} rows, {len(naive)} naive points, "
          f"{sum(1 for p in naive.values() if p['skip'])} of them skipped by the plan)")
    wrong, gqa = [], 0
    for r in rows:
        pt, data = fed[r["id"]]
        p = mod.point_problem(pt)
        gqa += p["kv_heads"] != p["heads"]
        a, tol = r["accuracy"], tolerance(data["q"], data["k"], data["v"], p["scale"])
        ok = data["k"].shape[1] == p["kv_heads"] and a["nan_count"] == 0 and float(a["max_abs_err"]) <= tol
        # Where a row sees no key (lower-right with seq_q > seq_kv, the first rows), the reference is zero.
        if p["causal_lower_right"] and p["seq_q"] > p["seq_kv"]:
            ok &= bool(np.all(data["reference"][:, :, data["rows"] < p["seq_q"] - p["seq_kv"], :] == 0))
        if not ok:
            wrong.append((r["id"], a, tol))
    check(not wrong, f"every point within the fp32 bound of attnbench's reference rows, no NaN "
                     f"({gqa} GQA points; {wrong})")
    if "kv_heads" in sweep:
        check(gqa > 0 and all(("Hkv=" in r["id"]) == (fed[r["id"]][0]["problem"]["kv_heads"] != 8) for r in rows),
              f"GQA points present, 'Hkv=' in exactly their ids ({gqa})")


def numpy_gradients(q, k, v, d_out, scale, allowed):
    """fp64 dQ, dK, dV of softmax attention written out apart from the peer and attnbench: query head h reads
    K/V head h // G; a row with no allowed key contributes nothing; dK, dV summed over the group."""
    G = q.shape[1] // k.shape[1]
    q, d_out = q.astype(np.float64), d_out.astype(np.float64)
    kk, vv = np.repeat(k, G, axis=1).astype(np.float64), np.repeat(v, G, axis=1).astype(np.float64)
    s = np.where(allowed, q @ kk.transpose(0, 1, 3, 2) * scale, -np.inf)
    m = s.max(-1, keepdims=True)
    w = np.where(allowed, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    tot = w.sum(-1, keepdims=True)
    p = np.divide(w, tot, out=np.zeros_like(w), where=tot > 0)
    dp = d_out @ vv.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = ds @ kk * scale
    dk, dv = ds.transpose(0, 1, 3, 2) @ q * scale, p.transpose(0, 1, 3, 2) @ d_out
    fold = lambda x: x.reshape(x.shape[0], k.shape[1], G, *x.shape[2:]).sum(2)
    return dq, fold(dk), fold(dv)


def test_backward_sweep(exe, mod, tmp):
    """sweep.pass forward / backward / forward_backward, MHA and GQA, d_v = d_k and d_v != d_k (V and the output 12
    wide against Q and K 8: DeepSeek's shapes in small), no mask and causal + padding, the gradient reference
    sampled (the first and last (batch, K/V head) blocks)."""
    cfg = write_config(tmp, "peer-backward", inputs={"regime": "gaussian"}, variants=["naive", "tiled"],
                       sweep={"batch": 2, "heads": 4, "kv_heads": [4, 2], "head_dim": 8, "v_head_dim": [8, 12],
                              "seq_len": 16,
                              "mask": ["none", "causal+pad=0.25"], "pass": ["forward", "backward", "forward_backward"],
                              "threads": 1},
                       accuracy={"reference": "full", "grad_max_work": 70000})
    plan = mod.load_plan(exe, cfg)
    naive = {p["id"]: p for p in plan if p["variant"] == "naive"}
    out = os.path.join(tmp, "backward-out")
    r = subprocess.run([exe, "run", cfg, "--out", out, "--filter", "naive:"], capture_output=True, text=True, timeout=300)
    if not check(r.returncode == 0, f"attnbench run (naive, three passes) exits 0 ({r.stderr.strip()[-300:]})"):
        return
    with open(os.path.join(out, "results.jsonl")) as f:
        cpp = {row["id"]: row for row in map(json.loads, f)}
    fed, fetched = {}, []
    real_fetch, real_measure = mod.fetch_inputs, mod.measure

    def fetch(exe_, config, pt, tmp_):
        fetched.append(pt["id"])
        return real_fetch(exe_, config, pt, tmp_)

    def measure(torch_, pt, row, data, *rest):
        fed[row["id"]] = (pt, {k: a.copy() for k, a in data.items()})
        return real_measure(torch_, pt, row, data, *rest)

    mod.fetch_inputs, mod.measure = fetch, measure
    try:
        rc, err = run_peer_inprocess(mod, cfg, "--out", out, "--attnbench", exe)
    finally:
        mod.fetch_inputs, mod.measure = real_fetch, real_measure
    if not check(rc == 0, f"peer on the backward sweep exits 0 ({err.strip()[-300:]})"):
        return
    with open(os.path.join(out, "results.peers.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    want_ids = ["peer/torch_" + i for i in naive]
    check([r["id"] for r in rows] == want_ids and all(r["status"] == "ok" and r["reason"] == "" for r in rows),
          f"one ok peer row per naive point, ids with their ',pass=' part, in plan order ({len(rows)} rows; "
          f"{[r['id'][-30:] for r in rows if r['status'] != 'ok'][:3]})")
    sets = {p["inputs"]["key"] for p in naive.values()}
    check(len(fetched) == len(sets) and all(",pass=backward" in i for i in fetched),
          f"inputs fetched once per input set, from its backward point ({len(fetched)} fetches, {len(sets)} sets)")
    table = {f["field"]: f["type"] for f in json.loads(subprocess.run(
        [exe, "info", "--row-fields", "--json"], capture_output=True, text=True, timeout=60).stdout)
        if not f.get("ring_only") and not f.get("task_only")}
    wrong = {"fields": [], "types": [], "identity": [], "grad": [], "flops": []}
    same = ("pass", "batch", "heads", "kv_heads", "seq_q", "seq_kv", "mask", "flops", "memory.inputs_bytes",
            "memory.reference_bytes", "grad_accuracy.reference", "grad_accuracy.blocks", "accuracy.rows")
    for r in rows:
        c = cpp[r["id"].removeprefix("peer/torch_")]
        f, fc = fields(r, table), fields(c, table)
        if not set(f) == set(fc) == set(table):
            wrong["fields"].append((r["id"], sorted(set(f) ^ set(table))))
        wrong["types"] += [(r["id"], k, v) for k, v in f.items() if k in table and not type_ok(v, table[k])]
        wrong["identity"] += [(r["id"], k, f.get(k), fc.get(k)) for k in same if f.get(k) != fc.get(k)]
        g = r["grad_accuracy"]
        if r["pass"] == "forward":
            ok = g["reference"] == "none" and g["blocks"] == 0 and g["dq"]["max_abs_err"] is None
        else:
            ok = g["reference"] == "sampled" and g["blocks"] == 2 and all(
                g[n]["nan_count"] == 0 and g[n]["inf_count"] == 0 and float(g[n]["rel_l2_err"]) < 1e-5
                and float(g[n]["max_abs_err"]) < 1e-5 for n in ("dq", "dk", "dv"))
            ok &= float(r["accuracy"]["max_abs_err"]) < 1e-5 and r["accuracy"]["nan_count"] == 0
            fwd = next(x for x in rows if x["id"] == r["id"].rsplit(",pass=", 1)[0])
            want = 2.5 * fwd["flops"] if r["pass"] == "backward" else 3.5 * fwd["flops"]
            if abs(r["flops"] - want) > 1e-9 * want:
                wrong["flops"].append((r["id"], r["flops"], want))
        if not ok:
            wrong["grad"].append((r["id"], g))
    check(not wrong["fields"], f"every backward-sweep peer row has exactly the field table's fields ({wrong['fields']})")
    check(not wrong["types"], f"every field has the field table's type ({wrong['types'][:3]})")
    check(not wrong["identity"], f"pass, sizes, flops, memory and grad_accuracy reference/blocks as the C++ row's "
                                 f"({wrong['identity'][:3]})")
    check(not wrong["flops"], f"flops: a backward row 2.5x the forward's, a training step 3.5x ({wrong['flops']})")
    check(not wrong["grad"], f"backward rows: dQ, dK, dV within fp32 of the sampled fp64 gradient blocks (rel L2, "
                             f"max abs < 1e-5), O's accuracy too; forward rows: grad_accuracy none ({wrong['grad'][:2]})")
    # The files are the runner's: naive (attnbench eval --grad-output) on the peer's Q, K, V, padding and dO has
    # the sweep row's grad_accuracy exactly against the peer's gradient blocks; an independent NumPy gradient of
    # exact attention agrees with those blocks.
    pid = next(i for i in want_ids if "Hkv=2" in i and "causal+pad" in i and i.endswith(",pass=backward"))
    pt, data = fed[pid]
    c = cpp[pid.removeprefix("peer/torch_")]
    paths = {}
    for n in ("q", "k", "v", "key_padding", "d_out"):
        paths[n] = os.path.join(tmp, f"bw_{n}.npy")
        np.save(paths[n], data[n])
    grads = [os.path.join(tmp, f"bw_d{n}.npy") for n in "qkv"]
    r = subprocess.run([exe, "eval", "--variant", "naive", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"],
                        "--key-padding", paths["key_padding"], "--causal", "--out", os.path.join(tmp, "bw_o.npy"),
                        "--grad-output", paths["d_out"], "--dq", grads[0], "--dk", grads[1], "--dv", grads[2]],
                       capture_output=True, text=True, timeout=60)
    if not check(r.returncode == 0, f"attnbench eval --grad-output on the peer's inputs exits 0 ({r.stderr.strip()})"):
        return
    got = mod.gathered_gradients([np.load(x) for x in grads], data["grad_blocks"], pt["problem"]["kv_heads"])
    errs = [float(np.abs(a.astype(np.float64) - data["grad_" + n]).max()) for a, n in zip(got, ("dq", "dk", "dv"))]
    check(errs == [c["grad_accuracy"][n]["max_abs_err"] for n in ("dq", "dk", "dv")] and list(data["grad_blocks"]) == [0, 3],
          f"{c['id']}: naive's gradients on the peer's files have the sweep row's grad_accuracy max_abs_err exactly "
          f"({errs} vs {[c['grad_accuracy'][n]['max_abs_err'] for n in ('dq', 'dk', 'dv')]}; blocks "
          f"{list(data['grad_blocks'])})")
    p = mod.point_problem(pt)
    allowed = mod.allowed_keys(p, data["key_padding"])
    want = numpy_gradients(data["q"], data["k"], data["v"], data["d_out"], p["scale"], allowed)
    want = mod.gathered_gradients(want, data["grad_blocks"], p["kv_heads"])
    err = max(float(np.abs(w - data["grad_" + n]).max()) for w, n in zip(want, ("dq", "dk", "dv")))
    check(err < 1e-12, f"`attnbench inputs`' gradient blocks equal an independent NumPy fp64 gradient ({err:.1e})")
    # attnbench's own row reader takes the peer's rows (`attnbench compare` reads both folders' rows).
    as_run = os.path.join(tmp, "peer-as-run")
    os.makedirs(as_run)
    shutil.copy(os.path.join(out, "meta.json"), as_run)
    shutil.copy(os.path.join(out, "results.peers.jsonl"), os.path.join(as_run, "results.jsonl"))
    r = subprocess.run([exe, "compare", out, as_run], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"`attnbench compare` reads the peer's backward rows ({r.stderr.strip()[-300:]})")


def test_backward_inprocess(exe, mod, tmp):
    """measure() on synthetic backward points: GQA, lower-right causal with rows that see no key, padding, against
    an independent NumPy gradient (no NaN: the empty rows' gradients are zero)."""
    cfg = write_config(tmp, "peer-bw-synthetic", inputs={"regime": "gaussian"},
                       sweep={"seq_len": 4, "heads": 2, "head_dim": 8, "pass": "backward"})
    template = mod.load_plan(exe, cfg)[0]
    rng = np.random.RandomState(8)
    wrong = []
    for H, Hkv, Lq, Lkv, mask, pass_ in ((4, 2, 7, 7, "causal", "backward"), (4, 1, 9, 5, "causal_lower_right", "forward_backward"),
                                         (2, 2, 6, 6, "pad", "backward"), (6, 3, 9, 4, "causal_lower_right+pad", "backward")):
        B, D, parts = 2, 8, mask.split("+")
        q = rng.standard_normal((B, H, Lq, D)).astype(np.float32)
        k, v = (rng.standard_normal((B, Hkv, Lkv, D)).astype(np.float32) for _ in range(2))
        d_out = rng.standard_normal((B, H, Lq, D)).astype(np.float32)
        pad = None
        if "pad" in parts:
            pad = np.zeros((B, Lkv), np.uint8)
            pad[0, :] = 1  # batch 0: every key padded
            pad[1, -1] = 1
        scale = 1 / math.sqrt(D)
        pt = json.loads(json.dumps(template))
        shape = f":B={B},H={H}" + (f",Hkv={Hkv}" if Hkv != H else "") + f",Lq={Lq},Lkv={Lkv},D={D}"
        pt["id"] = "naive" + shape + "," + mask + ",gaussian(std=1),T=1,pass=" + pass_
        pt["pass"], pt["threads"], pt["skip"] = pass_, 1, None
        pt["problem"] = {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": Lq, "seq_kv": Lkv, "head_dim": D,
                         "scale": scale, "causal": "causal" in parts, "causal_lower_right": "causal_lower_right" in parts,
                         "key_padding": pad is not None, "dropout": 0.0, "seed": 0}
        pt["row"]["accuracy"]["reference"] = "full"
        pt["row"]["grad_accuracy"]["reference"] = "full"
        p = mod.point_problem(pt)
        allowed = mod.allowed_keys(p, pad)
        allowed = np.ones((1, 1, Lq, Lkv), bool) if allowed is None else allowed
        blocks = np.arange(B * Hkv)
        want = mod.gathered_gradients(numpy_gradients(q, k, v, d_out, scale, allowed), blocks, Hkv)
        data = {"q": q, "k": k, "v": v, "d_out": d_out, "reference": reference_np(q, k, v, scale, "causal" in parts,
                "causal_lower_right" in parts, pad), "rows": np.arange(Lq), "grad_blocks": blocks,
                "grad_dq": want[0], "grad_dk": want[1], "grad_dv": want[2]}
        if pad is not None:
            data["key_padding"] = pad
        row, skip = mod.start_row("peer/torch_naive" + shape + ",pass=" + pass_, pt)
        mod.measure(torch, pt, row, data, MEASURE, mod.MemoryProbe(), {"sgemm": {}, "peak": {}}, mod.InterferenceProbe())
        g = row["grad_accuracy"]
        ok = skip == "" and row["reason"] == "" and g["blocks"] == B * Hkv and all(
            g[n]["nan_count"] == 0 and float(g[n]["max_abs_err"]) < 1e-5 for n in ("dq", "dk", "dv"))
        if not ok:
            wrong.append((pt["id"], skip, row["reason"], g))
    check(not wrong, f"synthetic backward points (GQA, rows with no key, a fully padded batch): gradients within "
                     f"fp32 of an independent NumPy gradient, no NaN ({wrong})")


def test_errors(exe, tmp):
    def peer(*args, env=None, pre=()):
        return subprocess.run([sys.executable, *pre, PEER, *args], capture_output=True, text=True, timeout=120,
                              env=env)
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        json.dump({"name": "bad", "sweep": {"seq_len": [8], "heads": 2, "head_dim": 8, "mask": "causl"}}, f)
    r = peer(bad, "--attnbench", exe)
    check(r.returncode == 2 and r.stderr.startswith("torch_attention.py: ") and "sweep.mask" in r.stderr
          and "causl" in r.stderr and not r.stdout, f"bad config: exit 2, attnbench's message naming the field, "
                                                    f"prefixed with the program ({r.stderr.strip()!r})")
    cfg = write_config(tmp, "peer-errors", inputs={"regime": "gaussian"})
    missing = os.path.join(tmp, "no-such-dir", "attnbench")
    r = peer(cfg, "--attnbench", missing)
    check(r.returncode == 2 and missing in r.stderr and "--attnbench" in r.stderr,
          f"missing --attnbench PATH: exit 2 naming the path ({r.stderr.strip()!r})")
    r = peer(cfg, env=dict(os.environ, ATTNBENCH=missing))
    check(r.returncode == 2 and missing in r.stderr, f"missing $ATTNBENCH: exit 2 naming the path ({r.stderr.strip()!r})")
    r = peer(cfg, "--attnbench", exe, "--filter", "no-such-point")
    check(r.returncode == 2 and "--filter" in r.stderr and "no-such-point" in r.stderr,
          f"--filter matching nothing: exit 2 ({r.stderr.strip()!r})")
    out = os.path.join(tmp, "hidden-torch-out")
    hide = ["-c", "import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
                  "runpy.run_path(sys.argv[0], run_name='__main__')"]
    r = peer(cfg, "--out", out, "--attnbench", exe, pre=hide)
    check(r.returncode == 0 and r.stdout.startswith("torch not available:") and not os.path.exists(out),
          f"without torch: 'torch not available: ...', exit 0, nothing written ({r.stdout.strip()!r})")


def test_interference_probe(mod):
    """Two busy processes on this process's CPUs while it sleeps: the probe reads most of the CPUs' time as
    foreign (score well above the 0.05 default threshold, whatever else the machine runs: it is all foreign)."""
    burn = "import time\nt = time.time() + 1.5\nwhile time.time() < t: pass"
    procs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(max(2, len(os.sched_getaffinity(0))))]
    try:
        time.sleep(0.3)
        probe = mod.InterferenceProbe()
        probe.start()
        time.sleep(0.8)
        noise = probe.stop(1)
    finally:
        for p in procs:
            p.wait()
    check(noise["other_cpu_frac"] > 0.5 and noise["score"] > 0.5,
          f"busy processes on every allowed CPU: other_cpu_frac and score > 0.5 ({noise})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True, help="path of the attnbench binary")
    exe = os.path.abspath(ap.parse_args().attnbench)
    mod = load_peer()
    with tempfile.TemporaryDirectory(prefix="attnbench-test-peer-") as tmp:
        test_sweep(exe, mod, tmp)
        test_skips(exe, mod, tmp)
        test_point_problem(mod)
        test_gqa_lower_right_inprocess(exe, mod, tmp)
        test_interference_probe(mod)
        test_sweep_gqa_lower_right(exe, mod, tmp)
        test_backward_sweep(exe, mod, tmp)
        test_backward_inprocess(exe, mod, tmp)
        test_errors(exe, tmp)
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
