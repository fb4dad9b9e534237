#!/usr/bin/python3
"""attnbench_mpi under mpirun (ctest label mpi; bench/mpi/mpi.cmake registers one test per part).

  accuracy  P = 1..4 ranks, n in {1, 7, 130, 1000}, causal and not: the ring's output against an fp64 numpy
            reference and against single-process tiled (`attnbench eval --variant tiled`), within the fp32
            bound derived in fp32_bound() below; --compare's own report checked on a few runs
  errors    P > n refused (exit 2, the message names P and n); unsupported flags and shapes refused; inputs
            too big for the node's memory refused before anything is allocated (sparse .npy files)
  fault     a rank that aborts after its first block makes mpirun exit non-zero, within a bounded time
  sweep     `attnbench_mpi run` on a small config: tiled rows with ranks, bytes and a memory estimate,
            other variants skipped; --resume measures only the rows missing, refuses another rank count

Exit 0 pass, 1 fail, 77 skip (numpy or mpirun missing). Every mpirun runs under a timeout.
"""
import argparse
import json
import re
import os
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:
    print("skip: numpy missing")
    sys.exit(77)

MPI_TIMEOUT = 60  # seconds per mpirun: a hang fails the test instead of stalling ctest
FAILURES = []
SESSION_TMP = None  # this test's own TMPDIR for mpirun (set in main)


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)


def mpirun(args, P, *cmd, timeout=MPI_TIMEOUT):
    full = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(P), args.mpi, "--threads", "1",
            *cmd]
    t0 = time.monotonic()
    # OpenMPI's session directory lives under TMPDIR (ompi.HOST.UID); two tests starting mpirun at once in the
    # shared /tmp raced on creating it ("mkdir ... File exists", orte_init failed). Each test its own TMPDIR.
    env = dict(os.environ, TMPDIR=SESSION_TMP) if SESSION_TMP else None
    try:
        r = subprocess.run(full, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - t0
    return r, time.monotonic() - t0


def save_inputs(folder, n, seed, B=2, H=4, Hkv=2, D=24, std=1.5, Dv=None):
    rng = np.random.default_rng(seed)
    paths = {}
    for name, heads, s in (("q", H, std), ("k", Hkv, std), ("v", Hkv, 1.0)):
        width = Dv if name == "v" and Dv else D
        a = (rng.standard_normal((B, heads, n, width)) * s).astype(np.float32)
        paths[name] = os.path.join(folder, f"{name}{n}{'_dv' if Dv else ''}.npy")
        np.save(paths[name], a)
    return paths


def reference(q, k, v, causal):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if causal:
        n = q.shape[2]
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    s -= s.max(axis=-1, keepdims=True)
    w = np.exp(s)
    return (w / w.sum(axis=-1, keepdims=True)) @ v


def fp32_bound(q, k, v, P):
    """Absolute error bound of fp32 exact attention against fp64, as common/reference/reference.cpp
    exact_abs_tolerance: with u = 2^-24 and S = scale * max||q_i|| * max||k_j||, a logit carries D*u*S, exp
    doubles it, the normaliser and the weighted sum of Lkv values add Lkv*u*max|v|, plus 16 ulps slack for
    the exp polynomial and the per-tile rescales: u*max|v|*(2*D*S + 2*Lkv + 16), times 4 for accumulation
    order. The ring adds one online-softmax merge per (query chunk, key chunk) block, at most 2P per row
    (ring.hpp), each an exp2 (1.5 ulp), a multiply and an add on the sum and the output: 3u relative each,
    so 4 * 3 * 2P * u * max|v| more."""
    u = 2.0 ** -24
    D, n = q.shape[-1], k.shape[2]
    qn = np.sqrt((q.astype(np.float64) ** 2).sum(-1)).max()
    kn = np.sqrt((k.astype(np.float64) ** 2).sum(-1)).max()
    vmax = np.abs(v).max()
    S = qn * kn / np.sqrt(D)
    return 4 * u * vmax * (2 * D * S + 2 * n + 16) + 4 * 3 * 2 * P * u * vmax


def part_accuracy(args, tmp):
    cases = 0
    for n in (1, 7, 130, 1000):
        paths = save_inputs(tmp, n, seed=n)
        q, k, v = (np.load(paths[x]) for x in "qkv")
        for causal in (False, True):
            flag = ["--causal"] if causal else []
            want = reference(q, k, v, causal)
            tiled_out = os.path.join(tmp, "tiled.npy")
            r = subprocess.run([args.attnbench, "--threads", "1", "eval", "--variant", "tiled", "--q", paths["q"],
                                "--k", paths["k"], "--v", paths["v"], *flag, "--out", tiled_out],
                               capture_output=True, text=True, timeout=MPI_TIMEOUT)
            check(r.returncode == 0, f"attnbench eval tiled n={n}: {r.stderr}")
            tiled = np.load(tiled_out)
            for P in (1, 2, 3, 4):
                if P > n:
                    continue
                # Small tiles on n = 130 so the blocks run several tiles and the split-KV path.
                tiles = ["--param", "tile_q=4", "--param", "tile_kv=8"] if n == 130 and P % 2 else []
                out = os.path.join(tmp, f"ring{n}_{P}_{int(causal)}.npy")
                compare = ["--compare"] if n == 130 else []
                r, _ = mpirun(args, P, "eval", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], *flag,
                              *tiles, "--out", out, *compare)
                what = f"n={n} P={P} causal={causal}"
                if r is None or r.returncode != 0:
                    check(False, f"{what}: mpirun failed or timed out: {r.stderr if r else 'timeout'}")
                    continue
                got = np.load(out)
                bound = fp32_bound(q, k, v, P)
                err_ref = np.abs(got - want).max()
                err_tiled = np.abs(got.astype(np.float64) - tiled).max()
                check(np.isfinite(got).all(), f"{what}: non-finite output")
                check(err_ref <= bound, f"{what}: max |ring - fp64| = {err_ref:.3g} > bound {bound:.3g}")
                # Both within `bound` of the exact result, so within 2 * bound of each other.
                check(err_tiled <= 2 * bound, f"{what}: max |ring - tiled| = {err_tiled:.3g} > {2 * bound:.3g}")
                report = json.loads(r.stdout.strip().splitlines()[-1])
                check(report["ranks"] == P and len(report["per_rank"]) == P, f"{what}: report ranks")
                check(sum(x["rows"] for x in report["per_rank"]) == n, f"{what}: rows do not add up to n")
                rows = [x["rows"] for x in report["per_rank"]]
                check(max(rows) - min(rows) <= 1, f"{what}: rows per rank {rows} not balanced")
                kv_bytes = 2 * k.size * 4
                sent = [x["bytes_sent"] for x in report["per_rank"]]
                # Each rank sends every block but its predecessor's own: |K,V| minus that block's bytes.
                check(sum(sent) == (P - 1) * kv_bytes, f"{what}: bytes sent {sent}, total != (P-1)*|K,V|")
                if compare:
                    c = report["compare"]
                    if not tiles:  # --compare runs tiled with the ring's parameters: the same run as ours
                        check(abs(c["max_abs_diff_vs_single"] - err_tiled) < 1e-12, f"{what}: --compare diff")
                    check(c["accuracy"]["max_abs_err"] <= bound, f"{what}: --compare accuracy")
                    check(c["max_abs_diff_vs_single"] <= c["tolerance_vs_single"], f"{what}: --compare tolerance")
                cases += 1
                print(f"ok {what}: |ring-fp64| {err_ref:.2e} |ring-tiled| {err_tiled:.2e} bound {bound:.2e}")
    check(cases == 2 * (1 + 4 + 4 + 4), f"ran {cases} cases")
    # d_v != d_k (V 40 wide against Q, K 24; MLA's heads are 192 / 128): the K/V blocks carry both widths and
    # the outputs are d_v wide. Small tiles with 3 ranks (split-KV inside the blocks), and --compare.
    n, Dv = 130, 40
    paths = save_inputs(tmp, n, seed=11, Dv=Dv)
    q, k, v = (np.load(paths[x]) for x in "qkv")
    for P, causal in ((3, True), (2, False)):
        flag = ["--causal"] if causal else []
        tiles = ["--param", "tile_q=4", "--param", "tile_kv=8"] if P == 3 else []
        out = os.path.join(tmp, f"ring_dv{P}.npy")
        r, _ = mpirun(args, P, "eval", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], *flag, *tiles,
                      "--out", out, "--compare")
        what = f"d_v={Dv} head_dim=24 n={n} P={P} causal={causal}"
        if r is None or r.returncode != 0:
            check(False, f"{what}: mpirun failed or timed out: {r.stderr if r else 'timeout'}")
            continue
        got = np.load(out)
        check(got.shape == (2, 4, n, Dv), f"{what}: output shape {got.shape}")
        bound = fp32_bound(q, k, v, P)
        err_ref = np.abs(got - reference(q, k, v, causal)).max()
        check(err_ref <= bound, f"{what}: max |ring - fp64| = {err_ref:.3g} > bound {bound:.3g}")
        report = json.loads(r.stdout.strip().splitlines()[-1])
        sent = [x["bytes_sent"] for x in report["per_rank"]]
        check(sum(sent) == (P - 1) * (k.size + v.size) * 4, f"{what}: bytes sent {sent}, total != (P-1)*|K,V|")
        check(report["compare"]["max_abs_diff_vs_single"] <= report["compare"]["tolerance_vs_single"],
              f"{what}: --compare against single-process tiled")
        print(f"ok {what}: |ring-fp64| {err_ref:.2e} bound {bound:.2e}")
    # A row with no allowed key cannot occur under a causal mask on self-attention (key i is always
    # allowed); NaN inputs stay visible: a NaN in one key reaches exactly the rows that see it.
    paths = save_inputs(tmp, 7, seed=3)
    k = np.load(paths["k"])
    k[0, 0, 4, 0] = np.nan
    np.save(paths["k"], k)
    out = os.path.join(tmp, "nan.npy")
    r, _ = mpirun(args, 3, "eval", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--causal", "--out", out)
    check(r is not None and r.returncode == 0, "NaN input run")
    if r is not None and r.returncode == 0:
        # Not silent: a warning with both counts, and the counts in the report.
        rep = json.loads(r.stdout.strip().splitlines()[-1])
        check(rep.get("nonfinite_inputs") == 1 and rep.get("nonfinite_kv") == 1 and rep.get("nonfinite_q") == 0,
              f"NaN input run: the report counts the one NaN input ({ {k: rep.get(k) for k in rep if 'nonfinite' in k} })")
        check((rep.get("nonfinite_output") or 0) > 0 and
              f"the output holds {rep.get('nonfinite_output')} NaN/Inf values (the inputs held 1)" in r.stderr,
              f"NaN input run: a warning naming the output's and the inputs' counts ({r.stderr!r})")
        got = np.load(out)
        bad_rows = np.isnan(got).any(-1)  # [B, H, n]
        check(bad_rows[0, :2, 4:].all() and not bad_rows[0, :2, :4].any() and not bad_rows[1].any(),
              "NaN key 4 of batch 0, K/V head 0 must reach exactly rows >= 4 of query heads 0, 1")


def part_errors(args, tmp):
    paths = save_inputs(tmp, 1, seed=1)
    r, _ = mpirun(args, 2, "eval", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--out",
                  os.path.join(tmp, "o.npy"))
    check(r is not None and r.returncode == 2, f"P=2 > n=1 must exit 2, got {r and r.returncode}")
    if r is not None:
        check("P <= n" in r.stderr and "n = 1" in r.stderr and "-np 2" in r.stderr,
              f"P > n message must name P and n: {r.stderr!r}")
        check(r.stderr.count("ring attention needs") == 1, "the error is printed once (by rank 0)")
    p7 = save_inputs(tmp, 7, seed=2)
    k8 = os.path.join(tmp, "k8.npy")
    np.save(k8, np.zeros((2, 2, 8, 24), np.float32))
    for extra, needle in ((["--mask", "m.npy"], "--mask"), (["--dtype", "bf16"], "--dtype bf16"),
                          (["--variant", "naive"], "--variant naive"), (["--dropout", "0.1"], "--dropout"),
                          (["--k", k8, "--v", k8], "seq_q == seq_kv"), (["--param", "tile_q=-1"], "tile_q")):
        base = {"--q": p7["q"], "--k": p7["k"], "--v": p7["v"]}
        cmd = ["eval"]
        for key, val in base.items():
            if key not in extra:
                cmd += [key, val]
        r, _ = mpirun(args, 2, *cmd, *extra, "--out", os.path.join(tmp, "o.npy"))
        check(r is not None and r.returncode == 2 and needle in r.stderr,
              f"{extra}: want exit 2 naming {needle!r}, got {r and r.returncode}: {r and r.stderr!r}")
    r, _ = mpirun(args, 2, "eval", "--q", os.path.join(tmp, "missing.npy"), "--k", p7["k"], "--v", p7["v"],
                  "--out", os.path.join(tmp, "o.npy"))
    check(r is not None and r.returncode == 2 and "missing.npy" in r.stderr, "missing file: exit 2 naming it")
    # Inputs larger than this node's memory (sparse files: nothing is on disk): refused before any allocation,
    # naming the node's need and memory and the worst rank's parts; no output file.
    n = 2 ** 27  # [1, 1, n, 64] float32: 32 GiB per tensor, so each of 2 ranks needs well over 24 GiB
    huge = {}
    for name in ("q", "k", "v"):
        huge[name] = os.path.join(tmp, f"huge_{name}.npy")
        with open(huge[name], "wb") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (1, 1, n, 64)})
            f.truncate(f.tell() + n * 64 * 4)
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) * 1024
    if mem < 2 * 64 * 2 ** 30:
        out = os.path.join(tmp, "huge_o.npy")
        r, _ = mpirun(args, 2, "eval", "--q", huge["q"], "--k", huge["k"], "--v", huge["v"], "--out", out)
        check(r is not None and r.returncode == 2 and "physical memory" in r.stderr and "2 rank(s) on node" in r.stderr
              and "ring buffers" in r.stderr and r.stderr.count("not supported") == 1,
              f"inputs beyond the node's memory: exit 2 with the node's need, once ({r and r.returncode}: {r and r.stderr!r})")
        check(not os.path.exists(out), "no output file after the refusal")
    else:
        print(f"note: {mem} bytes of memory: the memory-fit refusal is not exercised")


def part_fault(args, tmp):
    paths = save_inputs(tmp, 1000, seed=5)
    out = os.path.join(tmp, "o.npy")
    r, elapsed = mpirun(args, 3, "eval", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--causal",
                        "--out", out, "--abort-rank-after-first-block", "1", timeout=MPI_TIMEOUT)
    check(r is not None, f"mpirun with an aborting rank hung ({elapsed:.0f} s, killed by the timeout)")
    if r is not None:
        check(r.returncode != 0, "mpirun with an aborting rank must exit non-zero")
        check(not os.path.exists(out), "no output file after a failed run")
        print(f"ok: aborting rank 1 -> mpirun exit {r.returncode} after {elapsed:.1f} s")


def part_sweep(args, tmp):
    cfg = {"name": "mpi_test", "variants": ["tiled", "naive"],
           "sweep": {"batch": 1, "heads": 2, "head_dim": 16, "seq_len": [33, 100], "mask": ["none", "causal"],
                     "threads": 1},
           "inputs": {"regime": "gaussian", "std": 1.0},
           "measure": {"warmup": 0, "min_reps": 1, "max_reps": 2, "min_time_s": 0, "max_time_s": 1,
                       "max_interference": 1, "calibrate_every": 0},
           "accuracy": {"reference": "full"}, "memory_budget": "1GiB", "seed": 7}
    path = os.path.join(tmp, "cfg.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    out = os.path.join(tmp, "res")
    r, _ = mpirun(args, 2, "run", path, "--out", out)
    check(r is not None and r.returncode == 0, f"run: {r and r.stderr}")
    if r is None or r.returncode != 0:
        return
    rows = [json.loads(line) for line in open(os.path.join(out, "results.jsonl"))]
    check(len(rows) == 8, f"8 rows (2 variants x 2 lengths x 2 masks), got {len(rows)}")
    for row in rows:
        check(row["ranks"] == 2, "ranks field")
        if row["variant"] == "naive":
            check(row["status"] == "skipped" and "tiled" in row["reason"], "naive rows skipped with a reason")
            continue
        check(row["status"] == "ok" and row["time_ms"]["median"] > 0, f"{row['id']}: measured")
        kv = 2 * row["batch"] * row["kv_heads"] * row["seq_kv"] * row["head_dim"] * 4
        check(abs(row["bytes_sent_per_rank"] - kv / 2) <= 2 * row["kv_heads"] * row["head_dim"] * 4 * 2,
              f"{row['id']}: bytes_sent_per_rank {row['bytes_sent_per_rank']} vs |K,V|/2 = {kv / 2}")
        check(row["accuracy"]["max_abs_err"] < 1e-5, f"{row['id']}: accuracy {row['accuracy']}")
        check(row["id"].endswith(",ranks=2"), "ids carry the rank count")
        # The largest rank's resident increase while timed: at least its share of the output (n/2 rows).
        out_share = row["batch"] * row["heads"] * (row["seq_q"] // 2) * row["head_dim"] * 4
        peak = row["memory"].get("peak_bytes")
        check(peak is not None and peak >= out_share and all(r["peak_rss_bytes"] > 0 for r in row["ring"]["per_rank"]),
              f"{row['id']}: memory.peak_bytes {peak} >= the output share {out_share}, per-rank peak RSS > 0")
        whole = 4 * row["batch"] * (2 * row["heads"] + 2 * row["kv_heads"]) * row["seq_q"] * row["head_dim"]
        check(row.get("rank0_whole_tensors_bytes") == whole,
              f"{row['id']}: rank0_whole_tensors_bytes {row.get('rank0_whole_tensors_bytes')} = Q, K, V and O = {whole}")
        est = row["memory"]["estimated_bytes"]
        block = 2 * row["batch"] * row["kv_heads"] * (row["seq_kv"] // 2) * row["head_dim"] * 4
        check(est >= out_share + block and row["memory"]["inputs_bytes"] >= out_share,
              f"{row['id']}: estimated_bytes {est} covers the output share and a K/V block")
        # The estimate bounds the measured increase, with 32 MiB for what it leaves out (allocator arenas,
        # thread stacks, MPI's buffers).
        check(peak is None or peak <= est + 32 * 2 ** 20, f"{row['id']}: peak {peak} within estimate {est} + 32 MiB")
    check(os.path.exists(os.path.join(out, "results.csv")), "results.csv written")

    # --resume: drop the last two rows (an interrupted run), resume: only those two are measured again, the
    # others are kept as written.
    jsonl = os.path.join(out, "results.jsonl")
    with open(jsonl) as f:
        lines = f.read().splitlines()
    with open(jsonl, "w") as f:
        f.write("".join(line + "\n" for line in lines[:-2]))
    r, _ = mpirun(args, 2, "run", path, "--out", out, "--resume")
    summary = re.search(r"(\d+) ok, (\d+) skipped, (\d+) failed", r.stdout if r is not None else "")
    check(r is not None and r.returncode == 0 and "8 points, 6 already done" in r.stdout and summary is not None
          and sum(int(x) for x in summary.groups()) == 2,
          f"--resume measures the 2 missing rows and keeps 6 ({r and r.returncode}: {r and r.stdout!r} {r and r.stderr!r})")
    with open(jsonl) as f:
        again = f.read().splitlines()
    check(again[:6] == lines[:6], "--resume leaves the kept rows byte for byte")
    check(sorted(json.loads(x)["id"] for x in again) == sorted(json.loads(x)["id"] for x in lines),
          "--resume: every planned id once")
    # Another rank count, or no --resume / --force on a folder with results: refused, naming why.
    r, _ = mpirun(args, 3, "run", path, "--out", out, "--resume")
    check(r is not None and r.returncode == 2 and "ran with 2 ranks, this one with 3" in r.stderr,
          f"--resume with 3 ranks refused ({r and r.returncode}: {r and r.stderr!r})")
    r, _ = mpirun(args, 2, "run", path, "--out", out)
    check(r is not None and r.returncode == 2 and "--resume" in r.stderr and "--force" in r.stderr,
          f"a folder with results needs --resume or --force ({r and r.returncode}: {r and r.stderr!r})")
    with open(jsonl) as f:
        check(f.read().splitlines() == again, "the refused runs left results.jsonl untouched")

    # A point with d_v != head_dim (sweep.v_head_dim) runs through the ring with d_v-wide outputs.
    cfg.update(name="mpi_dv", variants=["tiled"])
    cfg["sweep"].update(seq_len=33, mask="causal", v_head_dim=8)
    with open(path, "w") as f:
        json.dump(cfg, f)
    out = os.path.join(tmp, "res_dv")
    r, _ = mpirun(args, 2, "run", path, "--out", out)
    check(r is not None and r.returncode == 0, f"run d_v: {r and r.stderr}")
    if r is not None and r.returncode == 0:
        rows = [json.loads(line) for line in open(os.path.join(out, "results.jsonl"))]
        check(len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["accuracy"]["max_abs_err"] < 1e-5,
              f"d_v sweep row ok and accurate: {rows}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["accuracy", "errors", "fault", "sweep"])
    ap.add_argument("--mpi", required=True)
    ap.add_argument("--attnbench", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    args = ap.parse_args()
    if not os.path.exists(args.mpirun) and subprocess.run(["which", args.mpirun], capture_output=True).returncode:
        print("skip: no mpirun")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        global SESSION_TMP
        SESSION_TMP = os.path.join(tmp, "ompi-session")
        os.makedirs(SESSION_TMP)
        globals()["part_" + args.part](args, tmp)
    print("FAILED:" if FAILURES else "passed", *FAILURES, sep="\n  ")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
