#!/usr/bin/python3
"""`attnbench patterns` against numpy: the weights it measures are the ones each variant is defined to apply.

Run by ctest as `/usr/bin/python3 test_patterns.py --attnbench PATH`. Exit 0 pass, 1 fail, 77 skip (numpy
missing). Also checks that scripts/plot.py draws the patterns."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLOT = os.path.join(ROOT, "scripts", "plot.py")
N, HEADS, HEAD_DIM, WINDOW = 16, 2, 4, 2  # head_dim 4 < N: the unit-vector probe needs 4 passes per variant
VARIANTS = ["naive", "tiled", "sliding_window", "linear"]

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)
    return cond


def run(exe, *args):
    return subprocess.run([exe, "patterns", *args], capture_output=True, text=True, timeout=300)


def masked_softmax(s, allowed):
    import numpy as np
    s = np.where(allowed, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    e = np.where(allowed, np.exp(s - np.where(np.isfinite(mx), mx, 0)), 0.0)
    den = e.sum(axis=-1, keepdims=True)
    return e / np.where(den > 0, den, 1)


def check_run(exe, tmp, causal):
    import numpy as np
    tag = "causal" if causal else "full"
    out = os.path.join(tmp, tag)
    args = ["--seq", str(N), "--heads", str(HEADS), "--head-dim", str(HEAD_DIM), "--seed", "3", "--out", out,
            "--param", f"sliding_window.window={WINDOW}", "--param", "sliding_window.global_tokens=1"]
    for v in VARIANTS:
        args += ["--variant", v]
    if causal:
        args.append("--causal")
    r = run(exe, *args)
    if not check(r.returncode == 0, f"[{tag}] patterns --seq {N} exits 0 (got {r.returncode}: {r.stderr.strip()})"):
        return None
    with open(os.path.join(out, "patterns.json")) as f:
        meta = json.load(f)
    check([v["name"] for v in meta["variants"]] == VARIANTS and all(v["status"] == "ok" for v in meta["variants"]),
          f"[{tag}] patterns.json lists the 4 variants, all ok")
    check(meta["seq"] == N and meta["heads"] == HEADS and meta["causal"] == causal, f"[{tag}] patterns.json shapes")
    sw = next(v for v in meta["variants"] if v["name"] == "sliding_window")
    check(sw["params"]["window"] == WINDOW and sw["params"]["global_tokens"] == 1,
          f"[{tag}] --param sliding_window.window=2 / global_tokens=1 reached the variant ({sw['params']})")
    q = np.load(os.path.join(out, "q.npy")).astype(np.float64)[0]
    k = np.load(os.path.join(out, "k.npy")).astype(np.float64)[0]
    check(q.shape == (HEADS, N, HEAD_DIM) and k.shape == (HEADS, N, HEAD_DIM), f"[{tag}] q.npy, k.npy shapes")
    w = {}
    for v in VARIANTS:
        a = np.load(os.path.join(out, f"{v}.npy"))
        check(a.dtype == np.float32 and a.shape == (HEADS, N, N), f"[{tag}] {v}.npy is float32 [{HEADS}, {N}, {N}]")
        w[v] = a.astype(np.float64)
        sums = w[v].sum(axis=-1)
        check(np.allclose(sums, 1.0, atol=2e-5), f"[{tag}] {v}: every row sums to 1 (max dev {abs(sums - 1).max():.2e})")
        if causal:
            upper = np.triu(np.ones((N, N), bool), 1)
            check(np.all(w[v][:, upper] == 0), f"[{tag}] {v}: causal upper triangle is exactly zero")
    i, j = np.indices((N, N))
    allowed = (j <= i) if causal else np.ones((N, N), bool)
    logits = np.einsum("hid,hjd->hij", q, k) / np.sqrt(HEAD_DIM)
    want = masked_softmax(logits, allowed)
    check(np.allclose(w["naive"], want, atol=1e-5),
          f"[{tag}] naive == softmax(QK^T * scale) recomputed in numpy (max err {abs(w['naive'] - want).max():.2e})")
    check(np.allclose(w["tiled"], want, atol=1e-5), f"[{tag}] tiled == the same softmax (max err {abs(w['tiled'] - want).max():.2e})")
    band = (abs(i - j) <= WINDOW) | (i == 0) | (j == 0)  # global token 0: its row and its column
    outside = ~(band & allowed)
    check(np.all(w["sliding_window"][:, outside] == 0),
          f"[{tag}] sliding_window is exactly zero outside the band (|i-j| <= {WINDOW}) except global row/column 0")
    check(np.all(w["sliding_window"][:, 0, :][:, allowed[0]] > 0) and np.all(w["sliding_window"][:, :, 0] > 0),
          f"[{tag}] sliding_window's global row 0 and column 0 are non-zero")
    want_sw = masked_softmax(logits, band & allowed)
    check(np.allclose(w["sliding_window"], want_sw, atol=1e-5),
          f"[{tag}] sliding_window == softmax restricted to band + globals (max err {abs(w['sliding_window'] - want_sw).max():.2e})")
    phi = lambda x: np.where(x > 0, x + 1, np.exp(x))  # elu(x) + 1, linear's default feature map
    kern = np.einsum("hid,hjd->hij", phi(q), phi(k)) * allowed
    want_lin = kern / (kern.sum(axis=-1, keepdims=True) + 1e-6)
    check(np.allclose(w["linear"], want_lin, atol=1e-5),
          f"[{tag}] linear == normalised kernel phi(q).phi(k) / sum (max err {abs(w['linear'] - want_lin).max():.2e})")
    # Linear attention's pattern is diffuse: higher row entropy than softmax's on the same inputs.
    ent = lambda p: float(-(p * np.log(np.where(p > 0, p, 1))).sum(axis=-1).mean())
    check(ent(w["linear"]) > ent(w["naive"]), f"[{tag}] linear's rows are more diffuse than softmax's (entropy "
                                               f"{ent(w['linear']):.2f} > {ent(w['naive']):.2f})")
    return out


def check_text(exe, tmp):
    import numpy as np
    text = os.path.join(tmp, "sample.txt")
    words = "the cat sat on the mat and the dog sat on the cat".split()
    with open(text, "w") as f:
        f.write(" ".join(words[:7]) + "\n" + " ".join(words[7:]) + "\n")
    out = os.path.join(tmp, "text")
    r = run(exe, "--text", text, "--variant", "naive", "--variant", "linear", "--causal", "--out", out)
    if not check(r.returncode == 0, f"[text] patterns --text exits 0 (got {r.returncode}: {r.stderr.strip()})"):
        return None
    with open(os.path.join(out, "tokens.json")) as f:
        check(json.load(f) == words, "[text] tokens.json holds the text's whitespace tokens in order")
    w = np.load(os.path.join(out, "naive.npy"))
    check(w.shape[1:] == (len(words), len(words)), f"[text] naive.npy is [heads, {len(words)}, {len(words)}]")
    check(np.allclose(w.sum(axis=-1), 1, atol=2e-5), "[text] rows sum to 1")
    r = run(exe, "--text", text, "--max-tokens", "5", "--variant", "naive", "--out", os.path.join(tmp, "text5"))
    check(r.returncode == 0 and np.load(os.path.join(tmp, "text5", "naive.npy")).shape[1] == 5, "[text] --max-tokens 5")
    return out


def check_errors(exe, tmp):
    bad = os.path.join(tmp, "refused")
    r = run(exe, "--seq", "5000", "--out", bad)
    check(r.returncode != 0 and "--seq" in r.stderr and "1024" in r.stderr,
          f"--seq 5000 refused naming --seq and the limit (rc {r.returncode}: {r.stderr.strip()})")
    check(not os.path.exists(bad), "nothing written when refused")
    r = run(exe, "--seq", "8", "--param", "window=4", "--out", bad)
    check(r.returncode != 0 and "VARIANT.NAME=VALUE" in r.stderr, f"--param without a variant prefix: {r.stderr.strip()}")
    r = run(exe, "--seq", "8", "--variant", "naive", "--param", "sliding_window.window=4", "--out", bad)
    check(r.returncode != 0 and "not selected" in r.stderr, f"--param for an unselected variant: {r.stderr.strip()}")
    r = run(exe, "--seq", "8", "--variant", "sliding_window", "--param", "sliding_window.windw=4", "--out", bad)
    check(r.returncode != 0 and "window" in r.stderr, f"--param typo gets did-you-mean: {r.stderr.strip()}")
    r = run(exe, "--seq", "8", "--variant", "nosuch", "--out", bad)
    check(r.returncode != 0 and "nosuch" in r.stderr, f"unknown --variant: {r.stderr.strip()}")
    r = run(exe, "--out", bad)
    check(r.returncode != 0 and "--seq" in r.stderr and "--text" in r.stderr, f"neither --seq nor --text: {r.stderr.strip()}")


def check_plot(out, tokens_out):
    for d, what in ((out, "seq"), (tokens_out, "text")):
        if d is None:
            continue
        r = subprocess.run([sys.executable, PLOT, "--patterns", d], capture_output=True, text=True, timeout=300)
        png = os.path.join(d, "patterns.png")
        ok = r.returncode == 0 and os.path.isfile(png) and os.path.getsize(png) > 10000
        check(ok, f"[{what}] plot.py --patterns draws patterns.png (rc {r.returncode}: {r.stderr.strip()[-300:]})")
        check(os.path.isfile(os.path.join(d, "patterns.svg")), f"[{what}] and patterns.svg")


# bigbird's pattern from its definition (variants/bigbird/pattern.hpp), random draws included: common/support/random.hpp's
# Rng (splitmix64) seeded per query block, each draw a uniform rank among the candidates not yet taken.
U64 = (1 << 64) - 1


def mix64(x):
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & U64
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & U64
    return x ^ (x >> 31)


def bigbird_allowed(n, block, window, globals_, randoms, seed, causal):
    import numpy as np
    nb, h = -(-n // block), window // 2
    first = min(globals_ if causal else (globals_ + 1) // 2, nb)
    last = 0 if causal else min(globals_ // 2, nb - first)
    glob = set(range(first)) | set(range(nb - last, nb))
    allowed = np.zeros((n, n), bool)
    for qb in range(nb):
        end = qb + 1 if causal else nb
        if qb in glob:
            keys = set(range(end))
        else:
            keys = {b for b in range(qb - h, qb + h + 1) if 0 <= b < end} | {b for b in glob if b < end}
            cand = [b for b in range(qb if causal else nb) if b not in keys]
            if randoms >= len(cand):
                keys |= set(cand)
            else:
                state = mix64((mix64(seed ^ 0x6a09e667f3bcc909) ^ mix64((qb + 0x632be59bd9b4e019) & U64)) ^ 0x243f6a8885a308d3)
                for t in range(randoms):
                    state = (state + 0x9e3779b97f4a7c15) & U64
                    pick = cand[mix64(state) % len(cand)]
                    cand.remove(pick)
                    keys.add(pick)
        for kb in keys:
            allowed[qb * block:(qb + 1) * block, kb * block:(kb + 1) * block] = True
    return allowed & np.tril(np.ones((n, n), bool)) if causal else allowed


def check_bigbird(exe, tmp):
    import numpy as np
    # 62 positions in blocks of 4: 16 blocks, the last partial; g = 1 lets the random draws pick that block.
    for n, params, causal in ((64, (4, 3, 2, 3, 0), False), (62, (4, 3, 1, 2, 9), False), (64, (4, 3, 2, 3, 5), True)):
        block, window, globals_, randoms, seed = params
        out = os.path.join(tmp, f"bigbird-{n}-{int(causal)}")
        args = ["--seq", str(n), "--heads", "2", "--variant", "bigbird", "--out", out,
                "--param", f"bigbird.block={block}", "--param", f"bigbird.window_blocks={window}",
                "--param", f"bigbird.global_blocks={globals_}", "--param", f"bigbird.random_blocks={randoms}",
                "--param", f"bigbird.seed={seed}"] + (["--causal"] if causal else [])
        tag = f"[bigbird n={n} {params} {'causal' if causal else 'full'}]"
        r = run(exe, *args)
        if not check(r.returncode == 0, f"{tag} patterns exits 0 (got {r.returncode}: {r.stderr.strip()})"):
            continue
        w = np.load(os.path.join(out, "bigbird.npy"))
        want = bigbird_allowed(n, block, window, globals_, randoms, seed, causal)
        check(all(np.array_equal(w[h] != 0, want) for h in range(w.shape[0])),
              f"{tag} nonzero weights == the block pattern (window, globals, seeded random blocks)")
        check(np.allclose(w.sum(axis=-1), 1, atol=2e-5), f"{tag} rows sum to 1")
        if not causal:  # the budget, read off the weights: a row's key blocks with any nonzero weight
            nb = -(-n // block)
            pad = np.zeros((w.shape[0], n, nb * block - n))
            seen = (np.concatenate([w, pad], axis=-1).reshape(w.shape[0], n, nb, block) != 0).any(-1).sum(-1)
            global_rows = want.all(axis=-1)
            check(np.all(seen[:, global_rows] == nb) and np.all(seen[:, ~global_rows] <= window + globals_ + randoms),
                  f"{tag} global rows see all {nb} blocks, the others at most window + global + random")


def recurrence_weights(name, q, k, g, beta, normalize_keys=True):
    """The effective weights of a recurrence on each value, [heads, n, n], from its definition token by token
    (common/kernels/recurrence.hpp) with V = the identity: o_t = scale q_t S_t, so row t of the output is the
    weight each value v_j carries in o_t. g: [heads, n] (scalar) or [heads, n, d] (vector) or None; beta
    [heads, n] or None (the plain rule)."""
    import numpy as np
    heads, n, d = q.shape
    w = np.zeros((heads, n, n))
    for h in range(heads):
        S = np.zeros((d, n))
        for t in range(n):
            kt = k[h, t] / np.linalg.norm(k[h, t]) if normalize_keys else k[h, t]
            if name == "retention":
                a = np.full(d, 1 - 2.0 ** (-5 - h))
            elif g is None:
                a = np.ones(d)
            elif g.ndim == 3:
                a = np.exp(g[h, t])
            else:
                a = np.full(d, np.exp(g[h, t]))
            S = a[:, None] * S
            vt = np.eye(n)[t]
            if beta is None:
                S = S + np.outer(kt, vt)
            else:
                S = S + np.outer(kt, beta[h, t] * (vt - kt @ S))
            w[h, t] = q[h, t] @ S / np.sqrt(d)
    return w


def check_every_variant(exe, tmp):
    """--mask auto draws every registered variant (the newcomer's scripts/run): each has a pattern, causal where
    it has a causal form, and the recurrences' weights are their definitions' with the g and beta written beside."""
    import numpy as np
    listed = json.loads(subprocess.run([exe, "list", "--json"], capture_output=True, text=True, check=True).stdout)
    out = os.path.join(tmp, "auto")
    r = run(exe, "--seq", str(N), "--heads", str(HEADS), "--head-dim", str(HEAD_DIM), "--seed", "5", "--mask", "auto",
            "--out", out)
    if not check(r.returncode == 0, f"[auto] patterns --mask auto exits 0 (got {r.returncode}: {r.stderr.strip()})"):
        return
    with open(os.path.join(out, "patterns.json")) as f:
        meta = json.load(f)
    entries = {v["name"]: v for v in meta["variants"]}
    check(sorted(entries) == sorted(v["name"] for v in listed), f"[auto] patterns.json lists every registered variant")
    check(meta["mask"] == "auto", "[auto] patterns.json records the mask mode")
    q = np.load(os.path.join(out, "q.npy")).astype(np.float64)[0]
    k = np.load(os.path.join(out, "k.npy")).astype(np.float64)[0]
    recurrences = 0
    for v in listed:
        e = entries.get(v["name"], {})
        caps = v["capabilities"]
        if not check(e.get("status") == "ok", f"[auto] {v['name']}: a pattern ({e.get('status')}: {e.get('reason', '')})"):
            continue
        check(e["causal"] == bool(caps.get("causal")), f"[auto] {v['name']}: causal exactly where it has a causal form")
        w = np.load(os.path.join(out, e["file"])).astype(np.float64)
        check(np.isfinite(w).all(), f"[auto] {v['name']}: finite weights")
        if caps.get("own_definition") and v["name"] in ("retention", "simple_gla", "gla", "delta_rule", "gated_delta_rule",
                                                                 "kda"):
            recurrences += 1
            ins = e.get("inputs", {})
            g = np.load(os.path.join(out, ins["g"]["file"])).astype(np.float64)[0] if "g" in ins else None
            beta = np.load(os.path.join(out, ins["beta"]["file"])).astype(np.float64)[0] if "beta" in ins else None
            check((g is not None) == (caps.get("gate", "none") != "none") and (beta is not None) == bool(caps.get("beta")),
                  f"[auto] {v['name']}: g / beta written exactly when it reads them ({sorted(ins)})")
            if g is not None:
                check(ins["g"]["distribution"] == "logsigmoid(N(0,1))" and (g <= 0).all(),
                      f"[auto] {v['name']}: g = logsigmoid(N(0,1)), every g <= 0")
            if beta is not None:
                check(ins["beta"]["distribution"] == "sigmoid(N(0,1))" and ((beta > 0) & (beta <= 1)).all(),
                      f"[auto] {v['name']}: beta = sigmoid(N(0,1)) in (0, 1]")
            want = recurrence_weights(v["name"], q, k, g, beta, normalize_keys=e["params"].get("normalize_keys", 0) == 1)
            err = abs(w - want).max()
            # fp32 against the fp64 definition: each weight is a sum over N tokens of (d + 2)-term products (the
            # state update, the delta correction, the read-out), each rounded at most once per term in fp32, so
            # |err| <= N (d + 2) u max(1, max|w|); 4x for the chunk form's reassociation (2e-5 .. 1e-4 here, 100x the
            # ~1e-7 seen).
            tol = 4 * N * (HEAD_DIM + 2) * 2.0 ** -24 * max(1.0, abs(want).max())
            check(err < tol, f"[auto] {v['name']}: weights == its definition with V = I (max err {err:.2e} < {tol:.1e})")
            if beta is not None:
                check((w < -1e-3).any(), f"[auto] {v['name']}: the delta rule's corrections give negative weights")
    check(recurrences == 6, f"[auto] the six recurrences were checked against their definitions ({recurrences})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True, help="path of the attnbench binary")
    a = ap.parse_args()
    try:
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (install python3-numpy)")
        return 77
    with tempfile.TemporaryDirectory(prefix="attnbench-test-patterns-") as tmp:
        full = check_run(a.attnbench, tmp, causal=False)
        check_run(a.attnbench, tmp, causal=True)
        text = check_text(a.attnbench, tmp)
        check_errors(a.attnbench, tmp)
        check_bigbird(a.attnbench, tmp)
        check_every_variant(a.attnbench, tmp)
        try:
            import matplotlib  # noqa: F401
            check_plot(full, text)
        except ImportError:
            print("skip  plot.py --patterns (matplotlib missing)")
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
