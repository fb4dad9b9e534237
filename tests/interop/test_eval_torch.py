#!/usr/bin/python3
"""`attnbench eval --variant naive` against PyTorch's softmax(q @ k^T * scale + mask) @ v in float64, for several
shapes and every mask kind; then every exact variant (`attnbench list`: naive, tiled, tiled with small tiles, ...)
on grouped-query attention (K/V with fewer heads, repeated per group with repeat_interleave on the torch side)
and the lower-right causal mask (torch.tril(diagonal=Lkv - Lq)), alone and together, with seq_q <, = 1 and >
seq_kv. The backward (`eval --grad-output`) of every exact variant with one against torch's float64 autograd.
Exit 0 pass, 1 fail, 77 skip (numpy or torch missing)."""
import argparse
import json
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
    """The bound derived in common/reference/reference.cpp (exact_abs_tolerance), recomputed here: with u = 2^-24 and
    S = scale * max_i |q_i| * max_j |k_j|, fp32 logits carry D u S error, the exp about twice that plus a few
    ulps, and the two Lkv-term sums Lkv u each (weights sum to 1), so |O - O_exact| <= u max|v| (2 D S + 2 Lkv
    + 16); 4x that covers reordered (blocked BLAS) sums. A wrong mask or scale is off by O(max|v|)."""
    u = 2.0 ** -24
    qn = np.sqrt((q.astype(np.float64) ** 2).sum(-1)).max()
    kn = np.sqrt((k.astype(np.float64) ** 2).sum(-1)).max()
    d, lkv = q.shape[-1], k.shape[-2]
    return 4 * u * np.abs(v).max() * (2 * d * scale * qn * kn + 2 * lkv + 16)


def torch_reference(q, k, v, scale, allowed):
    """float64 softmax(q @ k^T * scale + mask) @ v, K and V repeated per group of query heads when they have
    fewer heads (head h reads K/V head h // (H // Hkv), as torch's enable_gqa), -inf where `allowed` is False."""
    B, H, LQ, _ = q.shape
    LKV, group = k.shape[2], H // k.shape[1]
    tq, tk, tv = (torch.from_numpy(x).double() for x in (q, k, v))
    if group > 1:
        tk, tv = tk.repeat_interleave(group, dim=1), tv.repeat_interleave(group, dim=1)
    additive = torch.zeros((B, 1, LQ, LKV), dtype=torch.float64)
    additive[torch.from_numpy(~np.broadcast_to(allowed, (B, 1, LQ, LKV)).copy())] = float("-inf")
    return (torch.softmax(tq @ tk.transpose(-2, -1) * scale + additive, dim=-1) @ tv).numpy()


def compare(label, got, want, allowed, q, k, v, scale):
    """attnbench's output against torch's: rows with no allowed key are NaN in torch and exactly zero here;
    the others within the fp32 bound."""
    B, H, LQ, D = want.shape
    empty = ~np.broadcast_to(allowed, (B, 1, LQ, allowed.shape[-1])).any(-1)  # [B, 1, LQ]
    empty = np.broadcast_to(empty[..., None], (B, H, LQ, D))
    check(np.all(np.isnan(want[empty])), label + ": torch gives NaN on the fully masked rows")
    check(np.all(got[empty] == 0), label + ": fully masked rows (%d values) are exactly zero" % empty.sum())
    live = ~empty
    tol = tolerance(q, k, v, scale)
    err = np.abs(got[live] - want[live]).max() if live.any() else 0.0
    check(np.all(np.isfinite(got)) and err <= tol, label + ": max |attnbench - torch| %.3g <= %.3g" % (err, tol))
    return tol


def gqa_lower_right(exe, tmp):
    """Every exact variant on GQA and lower-right causal problems. naive and tiled must claim both
    capabilities; another exact variant is compared where it claims what a case needs and must refuse
    (exit 2, 'not supported') where it does not."""
    path = lambda name: os.path.join(tmp, name)
    r = subprocess.run([exe, "list", "--json"], capture_output=True, text=True)
    variants = {x["name"]: x["capabilities"] for x in json.loads(r.stdout)}
    for name in ("naive", "tiled"):
        caps = variants.get(name, {})
        check(caps.get("gqa") is True and caps.get("causal_lower_right") is True,
              "%s claims gqa and causal_lower_right (%s)" % (name, caps))
    runs = [(name, []) for name, caps in variants.items() if caps["exact"]]
    if "tiled" in variants:  # tiles smaller than the lengths: tiles wholly masked, tails, several kv tiles
        runs.append(("tiled", ["--param", "tile_q=4", "--param", "tile_kv=8"]))
    # (batch, heads, kv_heads, seq_q, seq_kv, head_dim, mask parts)
    cases = [
        # GQA: groups of 4, all heads on one K/V head, groups of 2 with an odd head count; every mask kind.
        (2, 8, 2, 7, 7, 16, "none"), (2, 8, 1, 7, 7, 16, "causal"), (1, 6, 3, 9, 13, 33, "pad"),
        (2, 8, 2, 7, 7, 16, "causal+bool+pad"), (1, 6, 3, 13, 9, 8, "none"),
        # Lower-right causal: seq_q < seq_kv, decode (seq_q 1), seq_q > seq_kv (the first rows see no key),
        # square (equal to causal), and with causal (the stricter: upper-left when seq_q < seq_kv).
        (1, 2, 2, 5, 37, 17, "lr"), (2, 2, 2, 1, 300, 64, "lr"), (1, 3, 3, 37, 5, 8, "lr"),
        (1, 2, 2, 17, 17, 8, "lr"), (1, 2, 2, 5, 37, 8, "causal+lr"), (2, 2, 2, 37, 5, 8, "causal+lr+pad"),
        (1, 2, 2, 9, 20, 8, "lr+bool"),
        # GQA and lower-right together.
        (2, 8, 2, 1, 300, 64, "lr"), (1, 8, 1, 5, 37, 16, "lr+pad"), (1, 6, 3, 37, 5, 8, "lr+bool"),
        (2, 8, 2, 37, 5, 8, "causal+lr+pad"), (1, 8, 2, 20, 300, 32, "lr"),
    ]
    rng = np.random.RandomState(13)
    for (B, H, HKV, LQ, LKV, D, mask) in cases:
        parts = mask.split("+")
        q = rng.standard_normal((B, H, LQ, D)).astype(np.float32)
        k = rng.standard_normal((B, HKV, LKV, D)).astype(np.float32)
        v = rng.standard_normal((B, HKV, LKV, D)).astype(np.float32)
        for name, x in (("q", q), ("k", k), ("v", v)):
            np.save(path(name + ".npy"), x)
        scale = 0.4 if mask == "lr" and LQ == 5 else 1 / np.sqrt(D)
        args, allowed = [], np.ones((B, 1, LQ, LKV), bool)
        if "causal" in parts:
            args.append("--causal")
            allowed &= np.tril(np.ones((LQ, LKV), bool))  # j <= i
        if "lr" in parts:
            args.append("--causal-lower-right")
            allowed &= torch.ones((LQ, LKV), dtype=torch.bool).tril(diagonal=LKV - LQ).numpy()  # j <= i + Lkv - Lq
        if "bool" in parts:
            m = rng.uniform(size=(LQ, LKV)) < 0.7
            np.save(path("mask.npy"), m)
            args += ["--mask", path("mask.npy")]
            allowed &= m
        if "pad" in parts:
            padded = rng.uniform(size=(B, LKV)) < 0.3
            padded[0, -1] = True
            np.save(path("pad.npy"), padded)
            args += ["--key-padding", path("pad.npy")]
            allowed &= ~padded[:, None, None, :]
        if scale != 1 / np.sqrt(D):
            args += ["--scale", repr(scale)]
        want = torch_reference(q, k, v, scale, allowed)
        needs = {"gqa": HKV != H, "causal_lower_right": "lr" in parts, "causal": "causal" in parts,
                 "boolean_mask": "bool" in parts, "key_padding": "pad" in parts, "cross": LQ != LKV}
        for variant, params in runs:
            caps = variants[variant]
            label = "%s%s B=%d H=%d Hkv=%d Lq=%d Lkv=%d D=%d %s" % (
                variant, "{%s}" % ",".join(params[1::2]) if params else "", B, H, HKV, LQ, LKV, D, mask)
            if os.path.exists(path("O.npy")):
                os.remove(path("O.npy"))
            r = subprocess.run([exe, "eval", "--variant", variant, *params, "--q", path("q.npy"), "--k",
                                path("k.npy"), "--v", path("v.npy"), *args, "--compare", "--out", path("O.npy")],
                               capture_output=True, text=True)
            lacking = [c for c, needed in needs.items() if needed and not caps[c]]
            if lacking and variant not in ("naive", "tiled"):
                check(r.returncode == 2 and "not supported" in r.stderr and not os.path.exists(path("O.npy")),
                      label + ": refused, %s lacking (%s)" % (", ".join(lacking), r.stderr.strip()))
                continue
            if r.returncode != 0:
                check(False, label + ": eval exited %d: %s" % (r.returncode, r.stderr.strip()))
                continue
            got = np.load(path("O.npy"))
            check(got.shape == (B, H, LQ, D), label + ": output [B, H, Lq, D] (%s)" % (got.shape,))
            tol = compare(label, got, want, allowed, q, k, v, scale)
            # --compare: the id names Hkv (only when it differs from H) and the lower-right mask, and
            # attnbench's own fp64 reference agrees with torch to the same bound.
            j = json.loads(r.stdout)
            ident = j["id"]
            check((",Hkv=%d," % HKV in ident) == (HKV != H) and ("causal_lower_right" in ident) == ("lr" in parts)
                  and float(j["max_abs_err"]) <= tol and j["nan_count"] == 0,
                  label + ": --compare id %s, max_abs_err %s <= %.3g" % (ident, j["max_abs_err"], tol))


def torch_gradients(q, k, v, d_out, scale, allowed):
    """float64 dQ, dK, dV of torch_reference's attention by torch autograd (K/V repeated per group inside the
    graph, so dK and dV sum over it); a row with no allowed key attends every key in the graph and is zeroed
    after (NaN-free: it contributes no gradient)."""
    B, H, LQ, _ = q.shape
    LKV, group = k.shape[2], H // k.shape[1]
    tq, tk, tv = (torch.from_numpy(x).double().requires_grad_() for x in (q, k, v))
    ok = torch.from_numpy(np.broadcast_to(allowed, (B, 1, LQ, LKV)).copy())
    empty = ~ok.any(-1, keepdim=True)
    s = (tq @ tk.repeat_interleave(group, 1).transpose(-2, -1) * scale).masked_fill(~(ok | empty), float("-inf"))
    o = (torch.softmax(s, dim=-1) @ tv.repeat_interleave(group, 1)).masked_fill(empty, 0.0)
    return [g.numpy() for g in torch.autograd.grad(o, (tq, tk, tv), torch.from_numpy(d_out).double())]


def backward_vs_torch(exe, tmp):
    """`eval --grad-output` of every exact variant with a backward (`attnbench list --json` capabilities)
    against torch's float64 autograd: the gradients' error against torch is the error `--compare` reports
    against attnbench's own fp64 gradient of exact attention (the two references agree to 1e-12 relative), and
    both are fp32-small. GQA, lower-right causal, padding, a boolean mask with an empty row."""
    path = lambda name: os.path.join(tmp, "bwd_" + name)
    r = subprocess.run([exe, "list", "--json"], capture_output=True, text=True)
    names = [x["name"] for x in json.loads(r.stdout) if x["capabilities"]["exact"] and x["capabilities"]["backward"]]
    check({"naive", "tiled"} <= set(names), "naive and tiled have a backward (%s)" % names)
    rng = np.random.RandomState(29)
    cases = [(2, 4, 2, 9, 13, 16, "lr+pad"), (1, 2, 2, 11, 11, 8, "causal"), (1, 6, 3, 7, 10, 24, "bool"),
             (2, 8, 1, 33, 5, 8, "causal+lr")]
    for (B, H, HKV, LQ, LKV, D, mask) in cases:
        parts = mask.split("+")
        q = rng.standard_normal((B, H, LQ, D)).astype(np.float32)
        k = rng.standard_normal((B, HKV, LKV, D)).astype(np.float32)
        v = rng.standard_normal((B, HKV, LKV, D)).astype(np.float32)
        d_out = rng.standard_normal((B, H, LQ, D)).astype(np.float32)
        for name, x in (("q", q), ("k", k), ("v", v), ("do", d_out)):
            np.save(path(name + ".npy"), x)
        args, allowed = [], np.ones((B, 1, LQ, LKV), bool)
        if "causal" in parts:
            args.append("--causal")
            allowed &= np.tril(np.ones((LQ, LKV), bool))
        if "lr" in parts:
            args.append("--causal-lower-right")
            allowed &= np.tril(np.ones((LQ, LKV), bool), LKV - LQ)
        if "bool" in parts:
            m = rng.uniform(size=(LQ, LKV)) < 0.6
            m[2, :] = False  # a row with no allowed key
            np.save(path("mask.npy"), m)
            args += ["--mask", path("mask.npy")]
            allowed &= m
        if "pad" in parts:
            padded = rng.uniform(size=(B, LKV)) < 0.3
            np.save(path("pad.npy"), padded)
            args += ["--key-padding", path("pad.npy")]
            allowed &= ~padded[:, None, None, :]
        want = torch_gradients(q, k, v, d_out, 1 / np.sqrt(D), allowed)
        for variant in names:
            label = "%s backward B=%d H=%d Hkv=%d Lq=%d Lkv=%d D=%d %s" % (variant, B, H, HKV, LQ, LKV, D, mask)
            r = subprocess.run([exe, "eval", "--variant", variant, "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                                path("v.npy"), *args, "--out", path("o.npy"), "--grad-output", path("do.npy"),
                                "--dq", path("dq.npy"), "--dk", path("dk.npy"), "--dv", path("dv.npy"), "--compare"],
                               capture_output=True, text=True)
            if r.returncode == 2 and "not supported" in r.stderr and variant not in ("naive", "tiled"):
                print("note  %s: refused (%s)" % (label, r.stderr.strip()[-120:]))
                continue
            if r.returncode != 0:
                check(False, label + ": eval exited %d: %s" % (r.returncode, r.stderr.strip()))
                continue
            exact = json.loads(r.stdout)["grad_accuracy_exact"]
            for n, w in zip(("dq", "dk", "dv"), want):
                got = np.load(path(n + ".npy")).astype(np.float64)
                err = float(np.abs(got - w).max())
                rel = float(np.sqrt(((got - w) ** 2).sum() / (w ** 2).sum()))
                reported = float(exact[n]["max_abs_err"])
                check(got.shape == w.shape and rel < 1e-5 and abs(err - reported) <= 1e-9 * max(err, 1e-30) + 1e-15,
                      "%s: %s %s max |attnbench - torch fp64| %.3g (--compare against attnbench's fp64: %.3g), "
                      "relative L2 %.2g" % (label, n, list(got.shape), err, reported, rel))


def sinks_softcap_vs_torch(exe, tmp):
    """`eval --softcap C --sink-logits S.npy` forward and backward (--d-sink-logits) of every variant claiming
    both capabilities against torch float64 autograd of the definition: s = C tanh(scale q.k / C), then the
    masks, then softmax over the allowed logits plus one sink logit per head whose weight takes no value. A
    fully masked row (bool) is all sink: output 0. Logits of std ~4 so that the cap bends them. sliding_window
    runs at its default window (128), which covers these sequences (full attention), and only on the
    self-attention shape (it has no cross-attention)."""
    path = lambda name: os.path.join(tmp, "sink_" + name)
    r = subprocess.run([exe, "list", "--json"], capture_output=True, text=True)
    caps = {x["name"]: x["capabilities"] for x in json.loads(r.stdout)}
    names = [n for n, c in caps.items() if c["sinks"] and c["softcap"] and c["backward"]]
    check({"naive", "tiled"} <= set(names), "naive and tiled take sink logits and softcap (%s)" % names)
    rng = np.random.RandomState(31)
    for (B, H, HKV, LQ, LKV, D, mask, cap) in [(2, 4, 2, 19, 19, 16, "causal", 5.0),
                                               (1, 2, 2, 9, 13, 8, "bool+pad", 3.0)]:
        q = (2 * rng.standard_normal((B, H, LQ, D))).astype(np.float32)
        k = (2 * rng.standard_normal((B, HKV, LKV, D))).astype(np.float32)
        v = rng.standard_normal((B, HKV, LKV, D)).astype(np.float32)
        d_out = rng.standard_normal((B, H, LQ, D)).astype(np.float32)
        sinks = (2 * rng.standard_normal(H)).astype(np.float32)
        for name, x in (("q", q), ("k", k), ("v", v), ("do", d_out), ("s", sinks)):
            np.save(path(name + ".npy"), x)
        args, allowed = [], np.ones((B, 1, LQ, LKV), bool)
        if "causal" in mask:
            args.append("--causal")
            allowed &= np.tril(np.ones((LQ, LKV), bool))
        if "bool" in mask:
            m = rng.uniform(size=(LQ, LKV)) < 0.6
            m[2, :] = False
            np.save(path("mask.npy"), m)
            args += ["--mask", path("mask.npy")]
            allowed &= m
        if "pad" in mask:
            padded = rng.uniform(size=(B, LKV)) < 0.3
            np.save(path("pad.npy"), padded)
            args += ["--key-padding", path("pad.npy")]
            allowed &= ~padded[:, None, None, :]
        group = H // HKV
        tq, tk, tv, ts = (torch.from_numpy(x).double().requires_grad_() for x in (q, k, v, sinks))
        logits = tq @ tk.repeat_interleave(group, 1).transpose(-2, -1) / np.sqrt(D)
        logits = cap * torch.tanh(logits / cap)
        logits = logits.masked_fill(~torch.from_numpy(np.broadcast_to(allowed, logits.shape).copy()), float("-inf"))
        sink_col = ts.view(1, H, 1, 1).expand(B, H, LQ, 1)
        weights = torch.softmax(torch.cat([logits, sink_col], -1), -1)[..., :LKV]
        o = weights @ tv.repeat_interleave(group, 1)
        want = [o.detach().numpy()] + [g.numpy() for g in torch.autograd.grad(o, (tq, tk, tv, ts),
                                                                             torch.from_numpy(d_out).double())]
        for variant in names:
            if LQ != LKV and not caps[variant]["cross"]:
                continue
            label = "%s sinks+softcap=%g B=%d H=%d Hkv=%d Lq=%d Lkv=%d D=%d %s" % (variant, cap, B, H, HKV, LQ, LKV,
                                                                                 D, mask)
            r = subprocess.run([exe, "eval", "--variant", variant, "--q", path("q.npy"), "--k", path("k.npy"),
                                "--v", path("v.npy"), *args, "--softcap", repr(cap), "--sink-logits", path("s.npy"),
                                "--out", path("o.npy"), "--grad-output", path("do.npy"), "--dq", path("dq.npy"),
                                "--dk", path("dk.npy"), "--dv", path("dv.npy"), "--d-sink-logits", path("ds.npy"),
                                "--compare"], capture_output=True, text=True)
            if r.returncode != 0:
                check(False, label + ": eval exited %d: %s" % (r.returncode, r.stderr.strip()))
                continue
            for n, w in zip(("o", "dq", "dk", "dv", "ds"), want):
                got = np.load(path(n + ".npy")).astype(np.float64)
                rel = float(np.sqrt(((got - w) ** 2).sum() / (w ** 2).sum()))
                # fp32 against float64 over <= 20 keys: a few ulps relative; 1e-5 fails any formula error.
                check(got.shape == w.shape and np.all(np.isfinite(got)) and rel < 1e-5,
                      "%s: %s relative L2 against torch fp64 %.2g" % (label, n, rel))
            reported = json.loads(r.stdout)["grad_accuracy"]
            check("d_sink_logits" in reported, label + ": --compare reports d_sink_logits")
    # Refusals: a variant without sink logits, a sink file of the wrong shape, --d-sink-logits alone.
    base = [exe, "eval", "--q", path("q.npy"), "--k", path("k.npy"), "--v", path("v.npy"), "--out", path("x.npy")]
    np.save(path("s_bad.npy"), np.zeros(H + 1, np.float32))
    for extra, needle in ((["--variant", "linear", "--sink-logits", path("s.npy")], "sink"),
                          (["--variant", "naive", "--sink-logits", path("s_bad.npy")], "[heads]"),
                          (["--variant", "naive", "--softcap", "0"], "softcap"),
                          (["--variant", "naive", "--grad-output", path("do.npy"), "--dq", path("a.npy"), "--dk",
                            path("b.npy"), "--dv", path("c.npy"), "--d-sink-logits", path("d.npy")], "--sink-logits")):
        r = subprocess.run(base + extra, capture_output=True, text=True)
        check(r.returncode == 2 and needle in r.stderr and not os.path.exists(path("x.npy")),
              "refused with exit 2 naming %s: %s -> %d %s" % (needle, " ".join(extra[:2] + extra[2:3]), r.returncode,
                                                             r.stderr.strip()[-160:]))


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

                # torch gives NaN for a row with no allowed key; we give zeros: compare checks those rows apart.
                compare(label, got, torch_reference(q, k, v, scale, ok_mask), ok_mask, q, k, v, scale)
        gqa_lower_right(exe, tmp)
        backward_vs_torch(exe, tmp)
        sinks_softcap_vs_torch(exe, tmp)
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
