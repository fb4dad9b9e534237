#!/usr/bin/env python3
"""Interop: `attnbench layer` equals torch.nn.MultiheadAttention(E, H, batch_first=True) given the same weights.

Run by ctest as `/usr/bin/python3 test_torch_layer.py --attnbench PATH`. Exit 0 pass, 1 fail, 77 skip (no torch).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import zlib

try:
    import numpy as np
    import torch
except ImportError as exc:  # only a missing module skips; everything else is a failure
    print(f"SKIP: {exc}")
    sys.exit(77)

U = 2.0**-24  # fp32 unit roundoff
FAILURES = []


def check(condition, message):
    if not condition:
        FAILURES.append(message)
        print("FAIL:", message)


def gamma(n):
    return n * U / (1 - n * U)


def run(exe, args):
    return subprocess.run([exe, *args], capture_output=True, text=True)


def save_weights(directory, ws, bs):
    os.makedirs(directory, exist_ok=True)
    for name, w in zip(("w_q", "w_k", "w_v", "w_o"), ws):
        np.save(os.path.join(directory, name + ".npy"), w)
    if bs is not None:
        for name, b in zip(("b_q", "b_k", "b_v", "b_o"), bs):
            np.save(os.path.join(directory, name + ".npy"), b)


def torch_layer(x, ctx, ws, bs, heads, causal, pad, residual):
    """torch.nn.MultiheadAttention in float64 on the same (float32-valued) inputs and weights."""
    E = x.shape[2]
    mha = torch.nn.MultiheadAttention(E, heads, bias=bs is not None, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.from_numpy(np.concatenate(ws[:3]).astype(np.float64)))
        mha.out_proj.weight.copy_(torch.from_numpy(ws[3].astype(np.float64)))
        if bs is not None:
            mha.in_proj_bias.copy_(torch.from_numpy(np.concatenate(bs[:3]).astype(np.float64)))
            mha.out_proj.bias.copy_(torch.from_numpy(bs[3].astype(np.float64)))
    mha.eval()
    q = torch.from_numpy(x.astype(np.float64))
    kv = q if ctx is None else torch.from_numpy(ctx.astype(np.float64))
    lq, lkv = q.shape[1], kv.shape[1]
    attn_mask = torch.triu(torch.ones(lq, lkv, dtype=torch.bool), diagonal=1) if causal else None
    key_padding_mask = None if pad is None else torch.from_numpy(pad.astype(bool))
    # Grad stays enabled: that keeps torch off its inference fast path, so this is the plain reference math.
    out, _ = mha(q, kv, kv, key_padding_mask=key_padding_mask, attn_mask=attn_mask, need_weights=False)
    y = out.detach().numpy()
    return y + x.astype(np.float64) if residual else y


def derived_tolerance(x, ctx, ws, bs, heads, causal, pad):
    """Worst-case first-order bound on |fp32 layer - exact|, stage by stage (as in tests/test_frontends.cpp):
    projections sum E products + bias (gamma(E+1) * sum|x W| per entry); a logit scale * q.k moves by
    ||dq|| ||k|| + ||q|| ||dk|| (Cauchy-Schwarz, ||dq|| <= sqrt(D) max|dq|) plus gamma(D) ||q|| ||k|| for its own
    fp32 sum; softmax weights move by <= 2 * (logit error) + gamma(Lkv + 4) in total; the weighted sum adds
    gamma(Lkv) * max|v|; the out projection multiplies by max_row ||W_o||_1 and adds gamma(E+1) * sum|o W_o|;
    the residual one rounding. Doubled for second-order terms. Being worst case it sits far above the errors
    seen; each case also checks that a wrong head split would exceed it (see `case`)."""
    kv = x if ctx is None else ctx
    x64, kv64 = x.astype(np.float64), kv.astype(np.float64)
    E = x.shape[2]
    D = E // heads
    lkv = kv.shape[1]
    b = [np.zeros(E)] * 4 if bs is None else [bb.astype(np.float64) for bb in bs]
    W = [w.astype(np.float64) for w in ws]

    def proj(inp, w, bias):
        return inp @ w.T + bias, (np.abs(inp) @ np.abs(w).T + np.abs(bias)).max()

    q, mq = proj(x64, W[0], b[0])
    k, mk = proj(kv64, W[1], b[1])
    v, mv = proj(kv64, W[2], b[2])
    scale = 1 / np.sqrt(D)
    qh = q.reshape(q.shape[0], q.shape[1], heads, D).transpose(0, 2, 1, 3)
    kh = k.reshape(k.shape[0], k.shape[1], heads, D).transpose(0, 2, 1, 3)
    vh = v.reshape(v.shape[0], v.shape[1], heads, D).transpose(0, 2, 1, 3)
    s = scale * qh @ kh.transpose(0, 1, 3, 2)
    allowed = np.ones(s.shape, dtype=bool)
    if causal:
        allowed &= ~np.triu(np.ones(s.shape[2:], dtype=bool), k=1)
    if pad is not None:
        allowed &= ~pad.astype(bool)[:, None, None, :]
    s = np.where(allowed, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    p = np.where(np.isfinite(mx), np.exp(s - np.where(np.isfinite(mx), mx, 0)), 0.0)
    denom = p.sum(axis=-1, keepdims=True)
    p = np.divide(p, denom, out=np.zeros_like(p), where=denom > 0)
    o = (p @ vh).transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], E)
    mo = (np.abs(o) @ np.abs(W[3]).T + np.abs(b[3])).max()
    qn, kn = np.linalg.norm(qh, axis=-1).max(), np.linalg.norm(kh, axis=-1).max()  # per-head row norms
    v_max = np.abs(v).max()
    dq, dk, dv = gamma(E + 1) * mq, gamma(E + 1) * mk, gamma(E + 1) * mv
    ds = scale * (np.sqrt(D) * (dq * kn + qn * dk) + gamma(D) * qn * kn) + U * scale * qn * kn
    dp = 2 * ds + gamma(lkv + 4)
    d_o = dp * v_max + dv + gamma(lkv) * v_max
    y_max = np.abs(o @ W[3].T + b[3] + x64).max()
    return 2 * (d_o * np.abs(W[3]).sum(axis=1).max() + gamma(E + 1) * mo + U * y_max)


def make_weights(rng, E, bias):
    a_in, a_out = np.sqrt(6 / (4 * E)), 1 / np.sqrt(E)
    ws = [rng.uniform(-a_in, a_in, (E, E)).astype(np.float32) for _ in range(3)]
    ws.append(rng.uniform(-a_out, a_out, (E, E)).astype(np.float32))
    bs = [rng.uniform(-a_out, a_out, E).astype(np.float32) for _ in range(4)] if bias else None
    return ws, bs


def case(exe, tmp, name, *, B, Lq, Lkv, E, H, bias, causal=False, pad_tail=0, residual=False, cross=False,
         variant="naive"):
    """pad_tail: pad the last `pad_tail` keys of batch 0 (never key 0, so no query row is fully masked)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # stable across runs
    d = os.path.join(tmp, name)
    ws, bs = make_weights(rng, E, bias)
    save_weights(os.path.join(d, "weights"), ws, bs)
    x = rng.uniform(-1, 1, (B, Lq, E)).astype(np.float32)
    ctx = rng.uniform(-1, 1, (B, Lkv, E)).astype(np.float32) if cross else None
    args = ["layer", "--x", os.path.join(d, "x.npy"), "--weights", os.path.join(d, "weights"), "--heads", str(H),
            "--variant", variant, "--out", os.path.join(d, "y.npy")]
    np.save(os.path.join(d, "x.npy"), x)
    if cross:
        np.save(os.path.join(d, "ctx.npy"), ctx)
        args += ["--context", os.path.join(d, "ctx.npy")]
    seq_kv = Lkv if cross else Lq
    pad = None
    if pad_tail:
        pad = np.zeros((B, seq_kv), dtype=bool)
        pad[0, seq_kv - pad_tail:] = True
        np.save(os.path.join(d, "pad.npy"), pad)
        args += ["--key-padding", os.path.join(d, "pad.npy")]
    if causal:
        args.append("--causal")
    if residual:
        args.append("--residual")
    r = run(exe, args)
    if r.returncode != 0:
        check(False, f"{name}: attnbench layer exited {r.returncode}: {r.stderr.strip()}")
        return
    y = np.load(os.path.join(d, "y.npy"))
    check(y.dtype == np.float32 and y.shape == (B, Lq, E), f"{name}: output {y.dtype} {y.shape}")
    want = torch_layer(x, ctx, ws, bs, H, causal, pad, residual)
    tol = derived_tolerance(x, ctx, ws, bs, H, causal, pad)
    err = np.abs(y.astype(np.float64) - want).max()
    print(f"{name} [{variant}]: max |attnbench - torch| = {err:.3g}, tolerance {tol:.3g}")
    check(np.isfinite(y).all(), f"{name}: non-finite output")
    check(err <= tol, f"{name}: max error {err:.3g} > tolerance {tol:.3g}")
    # Teeth: the same layer with a wrong head split (1 head instead of H) must differ by far more than tol.
    wrong = torch_layer(x, ctx, ws, bs, 1, causal, pad, residual)
    check(np.abs(wrong - want).max() > 10 * tol, f"{name}: tolerance {tol:.3g} would not catch a wrong head split")


def fully_padded_rows(exe, tmp):
    """torch 1.13 returns NaN for a query with no allowed key; we return b_o (+ x with the residual)."""
    rng = np.random.default_rng(5)
    d = os.path.join(tmp, "fully_padded")
    E, H = 8, 2
    ws, bs = make_weights(rng, E, True)
    save_weights(os.path.join(d, "weights"), ws, bs)
    x = rng.uniform(-1, 1, (2, 3, E)).astype(np.float32)
    pad = np.zeros((2, 3), dtype=bool)
    pad[1, :] = True
    np.save(os.path.join(d, "x.npy"), x)
    np.save(os.path.join(d, "pad.npy"), pad)
    r = run(exe, ["layer", "--x", os.path.join(d, "x.npy"), "--weights", os.path.join(d, "weights"), "--heads",
                  str(H), "--key-padding", os.path.join(d, "pad.npy"), "--residual", "--out", os.path.join(d, "y.npy")])
    check(r.returncode == 0, f"fully padded: exit {r.returncode}: {r.stderr.strip()}")
    if r.returncode != 0:
        return
    y = np.load(os.path.join(d, "y.npy"))
    check(np.isfinite(y).all(), "fully padded: NaN/Inf in the output")
    # y = fl(b_o + x): b_o comes out of the projection exactly (0 * W adds exact zeros), then one fp32 add.
    check(np.array_equal(y[1], (bs[3][None, :] + x[1]).astype(np.float32)), "fully padded rows are not b_o + x")
    want = torch_layer(x[:1], None, ws, bs, H, False, pad[:1], True)  # batch 0 is ordinary for torch
    tol = derived_tolerance(x[:1], None, ws, bs, H, False, pad[:1])
    check(np.abs(y[0] - want[0]).max() <= tol, "fully padded: batch 0 differs from torch")


def error_cases(exe, tmp):
    """Bad input: non-zero exit, the message names the file/option, and no output is written."""
    rng = np.random.default_rng(9)
    d = os.path.join(tmp, "errors")
    E = 8
    ws, bs = make_weights(rng, E, True)
    wdir = os.path.join(d, "weights")
    save_weights(wdir, ws, bs)
    x = rng.uniform(-1, 1, (1, 4, E)).astype(np.float32)
    np.save(os.path.join(d, "x.npy"), x)
    out = os.path.join(d, "y.npy")
    base = ["layer", "--x", os.path.join(d, "x.npy"), "--weights", wdir, "--out", out]

    def expect_error(label, args, *needles):
        r = run(exe, base + args)
        check(r.returncode == 2, f"{label}: exit {r.returncode}, expected 2 (usage error); stderr: {r.stderr.strip()}")
        for n in needles:
            check(n in r.stderr, f"{label}: message does not name {n!r}: {r.stderr.strip()}")
        check(not os.path.exists(out), f"{label}: an output file was written")

    expect_error("heads not dividing E", ["--heads", "3"], "--heads 3", "E = 8")
    np.save(os.path.join(d, "pad.npy"), np.zeros((1, 5), dtype=bool))
    expect_error("key padding shape", ["--heads", "2", "--key-padding", os.path.join(d, "pad.npy")],
                 "--key-padding", "[1, 5]", "[1, 4]")
    np.save(os.path.join(d, "ctx.npy"), np.zeros((2, 4, E), dtype=np.float32))
    expect_error("context batch", ["--heads", "2", "--context", os.path.join(d, "ctx.npy")], "--context", "batch 2")
    expect_error("unknown variant", ["--heads", "2", "--variant", "nave"], "nave")
    np.save(os.path.join(wdir, "w_o.npy"), ws[3][:, :5])
    expect_error("wrong weight shape", ["--heads", "2"], "w_o.npy", "[8, 5]")
    np.save(os.path.join(wdir, "w_o.npy"), ws[3])
    os.remove(os.path.join(wdir, "w_v.npy"))
    expect_error("missing weight", ["--heads", "2"], "w_v.npy", wdir)
    base[base.index("--weights") + 1] = os.path.join(d, "nope")
    expect_error("missing weights dir", ["--heads", "2"], "nope", "does not exist")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--attnbench", required=True)
    exe = parser.parse_args().attnbench
    torch.manual_seed(0)
    listing = run(exe, ["list", "--json"])
    variants = json.loads(listing.stdout) if listing.returncode == 0 else []
    exact = [v for v in variants if v["capabilities"]["exact"]]
    check(any(v["name"] == "naive" for v in exact), "naive is not listed as an exact variant")
    with tempfile.TemporaryDirectory(prefix="attn_torch_layer_") as tmp:
        case(exe, tmp, "self", B=2, Lq=11, Lkv=11, E=32, H=4, bias=True)
        case(exe, tmp, "self_causal_pad_residual", B=2, Lq=9, Lkv=9, E=16, H=2, bias=True, causal=True,
             pad_tail=3, residual=True)
        case(exe, tmp, "self_no_bias", B=1, Lq=6, Lkv=6, E=12, H=3, bias=False)
        case(exe, tmp, "head_dim_1", B=1, Lq=5, Lkv=5, E=8, H=8, bias=True, causal=True)
        case(exe, tmp, "cross_pad_no_bias", B=2, Lq=7, Lkv=13, E=24, H=3, bias=False, pad_tail=4, cross=True)
        case(exe, tmp, "cross_causal_residual", B=2, Lq=13, Lkv=5, E=16, H=4, bias=True, causal=True,
             residual=True, cross=True)
        # Every exact variant as the core operator, on the features it claims.
        for v in exact:
            caps = v["capabilities"]
            case(exe, tmp, f"variant_{v['name']}", B=2, Lq=40, Lkv=40, E=32, H=4, bias=True,
                 causal=caps["causal"], pad_tail=5 if caps["key_padding"] else 0, variant=v["name"])
            if caps["cross"]:
                case(exe, tmp, f"variant_{v['name']}_cross", B=1, Lq=21, Lkv=35, E=32, H=2, bias=True,
                     pad_tail=3 if caps["key_padding"] else 0, cross=True, variant=v["name"])
        fully_padded_rows(exe, tmp)
        error_cases(exe, tmp)
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("all layer interop checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
