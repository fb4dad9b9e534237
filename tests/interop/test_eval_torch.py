#!/usr/bin/python3
"""`attnbench eval --variant naive` against PyTorch's softmax(q @ k^T * scale + mask) @ v in float64, for several
shapes and every mask kind. Exit 0 pass, 1 fail, 77 skip (numpy or torch missing)."""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print("SKIP: %s (for %s)" % (e, sys.executable))
    sys.exit(77)

FAILURES = []


def check(ok, what):
    print(("PASS  " if ok else "FAIL  ") + what)
    if not ok:
        FAILURES.append(what)


def tolerance(q, k, v, scale):
    """The bound derived in common/reference.cpp (exact_abs_tolerance), recomputed here: with u = 2^-24 and
    S = scale * max_i |q_i| * max_j |k_j|, fp32 logits carry D u S error, the exp about twice that plus a few
    ulps, and the two Lkv-term sums Lkv u each (weights sum to 1), so |O - O_exact| <= u max|v| (2 D S + 2 Lkv
    + 16); 4x that covers reordered (blocked BLAS) sums. A wrong mask or scale is off by O(max|v|)."""
    u = 2.0 ** -24
    qn = np.sqrt((q.astype(np.float64) ** 2).sum(-1)).max()
    kn = np.sqrt((k.astype(np.float64) ** 2).sum(-1)).max()
    d, lkv = q.shape[-1], k.shape[-2]
    return 4 * u * np.abs(v).max() * (2 * d * scale * qn * kn + 2 * lkv + 16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True)
    exe = ap.parse_args().attnbench
    rng = np.random.RandomState(11)
    # (batch, heads, seq_q, seq_kv, head_dim): single token, SIMD tails, cross-attention both ways.
    shapes = [(1, 1, 1, 1, 1), (2, 3, 7, 7, 17), (1, 2, 17, 5, 33), (2, 2, 5, 17, 64), (3, 1, 33, 33, 8)]
    masks = ["none", "causal", "bool", "pad", "causal+bool+pad"]
    with tempfile.TemporaryDirectory(prefix="attn_torch_interop_") as tmp:
        path = lambda name: os.path.join(tmp, name)
        for (B, H, LQ, LKV, D) in shapes:
            q = rng.standard_normal((B, H, LQ, D)).astype(np.float32)
            k = rng.standard_normal((B, H, LKV, D)).astype(np.float32)
            v = rng.standard_normal((B, H, LKV, D)).astype(np.float32)
            for name, x in (("q", q), ("k", k), ("v", v)):
                np.save(path(name + ".npy"), x)
            # Boolean mask: random, query row 0 may attend nothing. Padding: the last batch pads every key
            # (when B > 1), batch 0 pads its last key (when Lkv > 1). Both leave rows with no allowed key.
            allowed = rng.uniform(size=(LQ, LKV)) < 0.6
            if LQ > 1:
                allowed[0, :] = False
            padded = np.zeros((B, LKV), bool)
            if B > 1:
                padded[-1, :] = True
            if LKV > 1:
                padded[0, -1] = True
            np.save(path("mask.npy"), allowed)
            np.save(path("pad.npy"), padded)
            for mask in masks:
                parts = mask.split("+")
                scale = 0.3 if mask == "causal" else 1 / np.sqrt(D)  # one explicit scale per shape
                args = ["eval", "--variant", "naive", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                        path("v.npy"), "--out", path("O.npy")]
                ok_mask = np.ones((B, 1, LQ, LKV), bool)
                if "causal" in parts:
                    args.append("--causal")
                    ok_mask &= np.tril(np.ones((LQ, LKV), bool))  # j <= i, top-left aligned
                if mask == "causal":
                    args += ["--scale", repr(scale)]
                if "bool" in parts:
                    args += ["--mask", path("mask.npy")]
                    ok_mask &= allowed
                if "pad" in parts:
                    args += ["--key-padding", path("pad.npy")]
                    ok_mask &= ~padded[:, None, None, :]
                label = "B=%d H=%d Lq=%d Lkv=%d D=%d %s" % (B, H, LQ, LKV, D, mask)
                if os.path.exists(path("O.npy")):
                    os.remove(path("O.npy"))
                r = subprocess.run([exe] + args, capture_output=True, text=True)
                if r.returncode != 0:
                    check(False, label + ": eval exited %d: %s" % (r.returncode, r.stderr.strip()))
                    continue
                got = np.load(path("O.npy"))

                tq, tk, tv = (torch.from_numpy(x).double() for x in (q, k, v))
                additive = torch.zeros((B, 1, LQ, LKV), dtype=torch.float64)
                additive[torch.from_numpy(~np.broadcast_to(ok_mask, (B, 1, LQ, LKV)).copy())] = float("-inf")
                want = (torch.softmax(tq @ tk.transpose(-2, -1) * scale + additive, dim=-1) @ tv).numpy()

                # torch gives NaN for a row with no allowed key; we give zeros. Check those rows apart.
                empty = ~np.broadcast_to(ok_mask, (B, 1, LQ, LKV)).any(-1)  # [B, 1, LQ]
                empty = np.broadcast_to(empty[..., None], (B, H, LQ, D))
                check(np.all(np.isnan(want[empty])), label + ": torch gives NaN on the fully masked rows")
                check(np.all(got[empty] == 0), label + ": fully masked rows (%d values) are exactly zero"
                      % empty.sum())
                live = ~empty
                tol = tolerance(q, k, v, scale)
                err = np.abs(got[live] - want[live]).max() if live.any() else 0.0
                check(np.all(np.isfinite(got)) and err <= tol,
                      label + ": max |attnbench - torch| %.3g <= %.3g" % (err, tol))
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
