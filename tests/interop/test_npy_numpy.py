#!/usr/bin/python3
"""NumPy interop of attnbench's .npy I/O: files numpy writes are read by `attnbench eval` correctly (or rejected
with the right message), and the O.npy it writes loads in numpy. Exit 0 pass, 1 fail, 77 skip (no numpy)."""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not installed for", sys.executable)
    sys.exit(77)

FAILURES = []


def check(ok, what):
    print(("PASS  " if ok else "FAIL  ") + what)
    if not ok:
        FAILURES.append(what)


def run(exe, args):
    return subprocess.run([exe] + args, capture_output=True, text=True)


def reference(q, k, v, scale, allowed):
    """Softmax attention in float64; allowed is broadcastable to [B, H, Lq, Lkv]; empty rows give zeros."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    s = np.where(allowed, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    e = np.where(allowed, np.exp(s - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
    denom = e.sum(axis=-1, keepdims=True)
    w = np.divide(e, denom, out=np.zeros_like(e), where=denom > 0)
    return w @ v


def header_fortran_order(filename):
    """The fortran_order flag of a .npy header, read with numpy's public format functions."""
    with open(filename, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        return read(f)[1]


def tolerance(q, k, v, scale):
    """The bound of common/reference/reference.cpp (exact_abs_tolerance): fp32 rounding of the D-term logits, the exp,
    and the Lkv-term sums, u * max|v| * (2 D S + 2 Lkv + 16) with S = scale * max|q_i| * max|k_j|, times 4."""
    u = 2.0 ** -24
    qn = np.sqrt((q.astype(np.float64) ** 2).sum(-1)).max()
    kn = np.sqrt((k.astype(np.float64) ** 2).sum(-1)).max()
    d, lkv = q.shape[-1], k.shape[-2]
    return 4 * u * np.abs(v).max() * (2 * d * scale * qn * kn + 2 * lkv + 16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True)
    exe = ap.parse_args().attnbench
    rng = np.random.RandomState(7)
    B, H, LQ, LKV, D = 2, 3, 9, 11, 17
    q = rng.standard_normal((B, H, LQ, D)).astype(np.float32)
    k = rng.standard_normal((B, H, LKV, D)).astype(np.float32)
    v = rng.standard_normal((B, H, LKV, D)).astype(np.float32)
    scale = 1 / np.sqrt(D)

    with tempfile.TemporaryDirectory(prefix="attn_npy_interop_") as tmp:
        path = lambda name: os.path.join(tmp, name)
        for name, x in (("q", q), ("k", k), ("v", v)):
            np.save(path(name + ".npy"), x)
            np.save(path(name + "64.npy"), x.astype(np.float64))  # exactly the float32 values
        qkv = ["--q", path("q.npy"), "--k", path("k.npy"), "--v", path("v.npy")]

        # float32 4-D in, O.npy out: loads in numpy as float32 [B, H, Lq, D], C order, correct values.
        r = run(exe, ["eval", "--variant", "naive"] + qkv + ["--out", path("O.npy")])
        check(r.returncode == 0, "eval on numpy float32 files exits 0 " + r.stderr.strip())
        o = np.load(path("O.npy"), allow_pickle=False)
        check(o.dtype == np.float32, "O.npy dtype is float32 (got %s)" % o.dtype)
        check(o.shape == (B, H, LQ, D), "O.npy shape is %s (got %s)" % ((B, H, LQ, D), o.shape))
        check(not header_fortran_order(path("O.npy")) and o.flags["C_CONTIGUOUS"], "O.npy is C order")
        want = reference(q, k, v, scale, np.ones((LQ, LKV), bool))
        err, tol = np.abs(o - want).max(), tolerance(q, k, v, scale)
        check(err <= tol, "O.npy matches the numpy float64 reference: max err %.3g <= %.3g" % (err, tol))

        # float64 files holding the same values: bitwise the same output.
        r = run(exe, ["eval", "--variant", "naive", "--q", path("q64.npy"), "--k", path("k64.npy"),
                      "--v", path("v64.npy"), "--out", path("O64.npy")])
        check(r.returncode == 0 and np.array_equal(np.load(path("O64.npy")), o),
              "float64 inputs give bitwise the float32 result " + r.stderr.strip())

        # Format versions 2.0 and 3.0 (numpy uses them for huge headers / utf-8 field names).
        for ver in ((2, 0), (3, 0)):
            with open(path("q_v%d.npy" % ver[0]), "wb") as f:
                np.lib.format.write_array(f, q, version=ver)
            r = run(exe, ["eval", "--variant", "naive", "--q", path("q_v%d.npy" % ver[0]), "--k", path("k.npy"),
                          "--v", path("v.npy"), "--out", path("O_v.npy")])
            check(r.returncode == 0 and np.array_equal(np.load(path("O_v.npy")), o),
                  "format version %d.%d is read " % ver + r.stderr.strip())

        # Boolean masks: bool, uint8 and int64 (with nonzero values other than 1) give the same output, which
        # is the reference under that mask; fully masked row 0 is zeros.
        allowed = rng.uniform(size=(LQ, LKV)) < 0.6
        allowed[0, :] = False
        padded = np.zeros((B, LKV), bool)
        padded[1, -4:] = True
        outs = []
        for dtype, fill in ((np.bool_, 1), (np.uint8, 1), (np.int64, 256)):
            np.save(path("mask.npy"), np.where(allowed, fill, 0).astype(dtype))
            np.save(path("pad.npy"), np.where(padded, fill, 0).astype(dtype))
            r = run(exe, ["eval", "--variant", "naive"] + qkv + ["--mask", path("mask.npy"), "--key-padding",
                                                                  path("pad.npy"), "--out", path("O_m.npy")])
            check(r.returncode == 0, "mask of dtype %s accepted %s" % (np.dtype(dtype), r.stderr.strip()))
            outs.append(np.load(path("O_m.npy")) if r.returncode == 0 else None)
        if all(x is not None for x in outs):
            check(all(np.array_equal(outs[0], x) for x in outs[1:]), "bool, uint8, int64 masks give the same output")
            want = reference(q, k, v, scale, allowed[None, None] & ~padded[:, None, None, :])
            err = np.abs(outs[0] - want).max()
            check(err <= tol, "masked output matches the reference: max err %.3g <= %.3g" % (err, tol))
            check(np.all(outs[0][:, :, 0, :] == 0), "the fully masked row is exactly zero")

        # Arrays of rank 1, 2, 3: the header is read (the error quotes the shape numpy wrote), then refused.
        for shape in ((5,), (2, 3), (2, 3, 4)):
            np.save(path("bad.npy"), np.zeros(shape, np.float32))
            r = run(exe, ["eval", "--variant", "naive", "--q", path("bad.npy"), "--k", path("k.npy"),
                          "--v", path("v.npy"), "--out", path("O_bad.npy")])
            want_text = "rank %d [%s]" % (len(shape), ", ".join(map(str, shape)))
            check(r.returncode == 2 and want_text in r.stderr and "--q" in r.stderr,
                  "rank-%d q rejected naming '%s': %s" % (len(shape), want_text, r.stderr.strip()))
            check(not os.path.exists(path("O_bad.npy")), "no output written for the rank-%d q" % len(shape))

        # Rejected foreign files: Fortran order, big-endian, integer dtype.
        fortran_q = np.asfortranarray(q)  # same values, column-major memory
        check(fortran_q.flags["F_CONTIGUOUS"] and not fortran_q.flags["C_CONTIGUOUS"], "q copied to Fortran order")
        np.save(path("q_fortran.npy"), fortran_q)
        check(header_fortran_order(path("q_fortran.npy")), "numpy wrote the Fortran-ordered array with fortran_order True")
        for name, arr, needle in (("q_fortran.npy", None, "Fortran order"),
                                  ("q_be.npy", q.astype(">f4"), "big-endian"),
                                  ("q_i16.npy", q.astype(np.int16), "'<i2'")):
            if arr is not None:
                np.save(path(name), arr)
            r = run(exe, ["eval", "--variant", "naive", "--q", path(name), "--k", path("k.npy"), "--v", path("v.npy"),
                          "--out", path("O_bad.npy")])
            check(r.returncode == 2 and needle in r.stderr and name in r.stderr,
                  "%s rejected with '%s': %s" % (name, needle, r.stderr.strip()))

    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
