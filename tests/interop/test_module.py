#!/usr/bin/python3
"""The Python module (`import attnbench`, bench/python) against the CLI it shares its code with: variants() and
info() are `list --json` and `info --json`; forward() equals `attnbench eval` bitwise for every registered
variant (no mask and causal, then each option the variant's capabilities allow) on the same .npy inputs, and its
errors carry eval's messages with the argument named instead of the file; torch tensors, non-contiguous,
offset and float64 inputs give the float32 C-contiguous result (and float32 ones are read without a copy);
reference() is the fp64 oracle; run() gives `attnbench run`'s rows but for the timing fields, stops on SIGINT
after the current point with KeyboardInterrupt and Python's handler back, and resume=True finishes; the GIL is
released while a kernel runs. The backward: forward(save_state=True) and backward() equal `attnbench eval
--save-state / --grad-output [--compare]` bitwise for every variant with a backward (variants()'s capabilities),
their refusals carry eval's messages, reference_backward() is the fp64 gradient of the variant's definition, and
attnbench.autograd's Function gives backward()'s gradients in float32 and passes torch.autograd.gradcheck in
float64 (the fp64 definition).

Run by ctest as `/usr/bin/python3 test_module.py --attnbench PATH`, the module's folder in ATTNBENCH_PYTHON_DIR
(set by CMakeLists.txt where the module is built). Exit 0 pass, 1 fail, 77 skip (no module here, or no numpy)."""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tracemalloc
import types
import warnings

try:
    import numpy as np
except ImportError as e:
    print("SKIP: %s (for %s)" % (e, sys.executable))
    sys.exit(77)

MODULE_DIR = os.environ.get("ATTNBENCH_PYTHON_DIR")
if not MODULE_DIR:
    print("SKIP: ATTNBENCH_PYTHON_DIR is not set: this build has no Python module (ATTN_PYTHON=OFF, a sanitizer "
          "or fuzzing build, or pybind11 missing)")
    sys.exit(77)
sys.path.insert(0, MODULE_DIR)
import attnbench  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

FAILURES = []
# Row fields that depend on the timing run, not on the point: left out when rows of two runs are compared.
TIMING_FIELDS = {"time_ms", "gflops", "gbytes_per_s", "frac_sgemm", "frac_peak", "frac_bandwidth", "timestamp",
                 "interference", "attempts", "noisy", "memory", "calibration", "rope_ms",
                 "phase_ms", "group_sgemm", "group_bandwidth"}
# measure settings of the small sweeps: correctness, not timing (no re-measuring under the test load).
FAST_MEASURE = {"warmup": 0, "min_reps": 1, "max_reps": 2, "min_time_s": 0, "max_time_s": 1,
                "max_interference": 1, "calibrate_every": 0}


def check(ok, what):
    print(("PASS  " if ok else "FAIL  ") + what)
    if not ok:
        FAILURES.append(what)
    return ok


def bitwise_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def cli(exe, *args, timeout=120):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def raises(fn, exc=ValueError):
    """The exception `fn` raises (of type exc), or None."""
    try:
        fn()
    except exc as e:
        return e
    return None


def api_and_docs(exe):
    listed = json.loads(cli(exe, "list", "--json").stdout)
    check(attnbench.variants() == listed, "variants() is `attnbench list --json` (%d variants)" % len(listed))
    v = attnbench.variants()[0]
    check(set(v) == {"name", "description", "capabilities", "saved_state", "params", "plugin"} and
          all(set(p) >= {"name", "type", "default", "help"} for x in attnbench.variants() for p in x["params"]) and
          all(x["plugin"] == "" for x in attnbench.variants()),
          "each variant: name, description, capabilities, saved_state, params (name, type, default, help), "
          "plugin ('' for every built-in variant)")
    check(attnbench.info() == json.loads(cli(exe, "info", "--json").stdout), "info() is `attnbench info --json`")
    for name in ("variants", "info", "forward", "backward", "reference", "reference_backward", "run", "load_results",
                 "attention_function"):
        doc = getattr(attnbench, name).__doc__ or ""
        check(name + "(" in doc and len(doc) > 200, "%s has a docstring with its signature" % name)


class Inputs:
    """Q, K, V (and masks, slopes) as arrays and as .npy files, for the module and the CLI."""

    def __init__(self, tmp, rng, B, H, HKV, LQ, LKV, D):
        self.tmp = tmp
        self.q = rng.standard_normal((B, H, LQ, D)).astype(np.float32)
        self.k = rng.standard_normal((B, HKV, LKV, D)).astype(np.float32)
        self.v = rng.standard_normal((B, HKV, LKV, D)).astype(np.float32)
        self.mask = rng.uniform(size=(LQ, LKV)) < 0.7
        self.mask[0, :] = False  # a row with no allowed key
        self.key_padding = np.zeros((B, LKV), bool)
        self.key_padding[0, -2:] = True
        self.slopes = np.linspace(0.5, 0.05, H)
        # A recurrence's inputs: g = logsigmoid(N(0, 1)) per token ("g") or per key channel too
        # ("g_vector", gla's), beta = sigmoid(N(0, 1)), an initial state.
        self.g = (-np.log1p(np.exp(-rng.standard_normal((B, H, LQ))))).astype(np.float32)
        self.g_vector = (-np.log1p(np.exp(-rng.standard_normal((B, H, LQ, D))))).astype(np.float32)
        self.beta = (1 / (1 + np.exp(-rng.standard_normal((B, H, LQ))))).astype(np.float32)
        self.initial_state = (0.5 * rng.standard_normal((B, H, D, D))).astype(np.float32)
        for name in ("q", "k", "v", "mask", "key_padding", "slopes", "g", "g_vector", "beta", "initial_state"):
            np.save(self.path(name), getattr(self, name))

    def path(self, name):
        return os.path.join(self.tmp, name + ".npy")


# A recurrence's keyword arguments (eval's --g, --beta, --initial-state).
RECURRENCE_INPUTS = ("g", "beta", "initial_state")


def needed_inputs(caps):
    """The recurrence inputs a variant needs, as eval_case options: g ("g" or gla's "g_vector") and beta."""
    needed = {}
    if caps.get("state") or caps.get("gate", "none") != "none" or caps.get("beta"):
        needed["causal"] = True  # a recurrence runs causal only: every case but "no mask" runs it
    if caps.get("gate", "none") != "none":
        needed["g"] = "g_vector" if caps["gate"] == "vector" else "g"
    if caps.get("beta"):
        needed["beta"] = "beta"
    return needed


def eval_case(exe, inputs, variant, label, **options):
    """forward(variant, ..., **options) and `attnbench eval` with the matching options: bitwise equal outputs,
    or the same refusal (the module's message is the CLI's)."""
    args = ["eval", "--variant", variant, "--q", inputs.path("q"), "--k", inputs.path("k"), "--v",
            inputs.path("v"), "--out", inputs.path("out")]
    kwargs = {}
    for key, value in options.items():
        if value is False:  # an option left off (the default)
            continue
        if key in ("mask", "key_padding"):
            args += ["--" + key.replace("_", "-"), inputs.path(key)]
            kwargs[key] = getattr(inputs, key)
        elif key == "alibi_slopes":
            args += ["--alibi-slopes", inputs.path("slopes")]
            kwargs[key] = inputs.slopes
        elif key in RECURRENCE_INPUTS:  # the value names the Inputs attribute ("g" or "g_vector" for g)
            args += ["--" + key.replace("_", "-"), inputs.path(value)]
            kwargs[key] = getattr(inputs, value)
        elif key == "params":
            for name, val in value.items():
                args += ["--param", "%s=%s" % (name, val)]
            kwargs[key] = value
        elif key == "threads":
            args = ["--threads", str(value)] + args
            kwargs[key] = value
        elif value is True:
            args.append("--" + key.replace("_", "-"))
            kwargs[key] = True
        else:
            args += ["--" + key.replace("_", "-"), str(value)]
            kwargs[key] = value
    if os.path.exists(inputs.path("out")):
        os.remove(inputs.path("out"))
    r = cli(exe, *args)
    try:
        got = attnbench.forward(variant, inputs.q, inputs.k, inputs.v, **kwargs)
        error = None
    except ValueError as e:
        got, error = None, e
    label = "%s %s" % (variant, label)
    if r.returncode != 0:
        # eval's "attnbench: not supported: MSG" / "attnbench: error: MSG" is the module's MSG.
        cli_message = r.stderr.strip().split(": ", 2)[-1]
        # The storage options as the module names them: dtype='bf16', alibi=True.
        cli_message = re.sub(r"--dtype (\w+)", r"dtype='\1'", re.sub(r"--alibi(?!-)", "alibi=True", cli_message))
        check(error is not None and str(error) == cli_message,
              "%s: refused by both with the same message (%s)" % (label, cli_message[:90]))
        return
    want = np.load(inputs.path("out"))
    check(error is None and bitwise_equal(got, want),
          "%s: forward() equals `attnbench eval` bitwise%s" % (label, "" if error is None else ": " + str(error)))


def cli_equivalence(exe, tmp):
    rng = np.random.default_rng(17)
    # seq 33 and head_dim 24: SIMD and tile tails; K/V with fewer heads for the grouped-query case.
    for name in ("mha", "gqa", "cross"):
        os.makedirs(os.path.join(tmp, name))
    mha = Inputs(os.path.join(tmp, "mha"), rng, 2, 4, 4, 33, 33, 24)
    gqa = Inputs(os.path.join(tmp, "gqa"), rng, 1, 4, 2, 33, 33, 24)
    cross = Inputs(os.path.join(tmp, "cross"), rng, 1, 2, 2, 9, 40, 16)
    supported = attnbench.info()["isa"]["supported"]
    for v in attnbench.variants():
        name, caps = v["name"], v["capabilities"]
        if reads_index(v):
            continue  # its index inputs (eval --index-q/k/w) have no module argument yet
        # A recurrence's g and beta go with every case (refusals then come from the case's own option).
        needed = needed_inputs(caps)
        case = lambda *a, **kw: eval_case(*a, **dict(needed, **kw))
        case(exe, mha, name, "no mask", causal=False)
        case(exe, mha, name, "causal", causal=True)  # refused alike where the variant has no causal
        if caps["state"]:
            case(exe, mha, name, "causal with an initial state", causal=True, initial_state="initial_state")
        if caps["causal_lower_right"]:
            case(exe, cross if caps["cross"] else mha, name, "causal_lower_right", causal_lower_right=True,
                 causal=False)
        if caps["boolean_mask"]:
            case(exe, mha, name, "mask", mask=True)
        if caps["key_padding"]:
            case(exe, mha, name, "key_padding + causal", key_padding=True, causal=True)
        if caps["dropout"]:
            case(exe, mha, name, "dropout", dropout=0.25, seed=5)
        if caps["gqa"]:
            case(exe, gqa, name, "grouped-query causal", causal=True)
        if caps["cross"]:
            case(exe, cross, name, "cross-attention", scale=0.3)
        for dtype in ("bf16", "fp16"):
            case(exe, mha, name, "dtype " + dtype, dtype=dtype)  # refused alike where not taken
        case(exe, mha, name, "alibi with slopes", alibi=True, alibi_slopes=True)
        case(exe, mha, name, "threads 1", threads=1)
        case(exe, mha, name, "isa " + supported[-1], isa=supported[-1])
        int_params = [p for p in v["params"] if p["type"] == "integer"]
        if int_params:
            p = int_params[0]
            case(exe, mha, name, "params %s=3" % p["name"], params={p["name"]: 3})


def torch_tensors(tmp):
    if torch is None:
        print("SKIP  torch tensors: torch is not importable (python3-torch)")
        return
    g = torch.Generator().manual_seed(3)
    tq, tk, tv = (torch.randn(2, 3, 17, 16, generator=g) for _ in range(3))
    want = attnbench.forward("tiled", tq.numpy().copy(), tk.numpy().copy(), tv.numpy().copy(), causal=True)
    got = attnbench.forward("tiled", tq.numpy(), tk.numpy(), tv.numpy(), causal=True)
    check(bitwise_equal(got, want), "torch tensors through .numpy(): the same output as numpy copies")
    got = attnbench.forward("tiled", tq, tk, tv, causal=True)
    check(bitwise_equal(got, want), "torch tensors passed as they are (numpy converts them): the same output")
    tqt = tq.transpose(2, 3).contiguous().transpose(2, 3)  # a non-contiguous torch view of the same values
    got = attnbench.forward("tiled", tqt.numpy(), tk.numpy(), tv.numpy(), causal=True)
    check(not tqt.is_contiguous() and bitwise_equal(got, want), "a non-contiguous torch tensor's .numpy()")
    # Against PyTorch's own attention in float64.
    scores = (tq.double() @ tk.double().transpose(-2, -1)) / 4.0
    scores = scores.masked_fill(~torch.ones(17, 17, dtype=torch.bool).tril(), float("-inf"))
    ref = (torch.softmax(scores, -1) @ tv.double()).numpy()
    err = np.abs(want - ref).max()
    check(err < 1e-5, "tiled causal vs torch float64 softmax attention: max error %.2g < 1e-5" % err)
    check(np.abs(attnbench.reference(tq, tk, tv, causal=True) - ref).max() < 1e-12,
          "reference() on torch tensors equals torch float64 attention to 1e-12")


def recurrence_kwargs(caps, q, rng):
    """A recurrence's causal mask and the g / beta it needs for q's shape (g = logsigmoid(N(0, 1)), per key channel
    too for a per-channel gate; beta = sigmoid(N(0, 1))); {} for the other variants."""
    if not (caps["state"] or caps["gate"] != "none" or caps["beta"]):
        return {}
    B, H, L, D = q.shape
    kw = {"causal": True}
    if caps["gate"] != "none":
        z = rng.standard_normal((B, H, L, D) if caps["gate"] == "vector" else (B, H, L))
        kw["g"] = (-np.log1p(np.exp(-z))).astype(np.float32)
    if caps["beta"]:
        kw["beta"] = (1 / (1 + np.exp(-rng.standard_normal((B, H, L))))).astype(np.float32)
    return kw


def layouts_and_dtypes():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 19, 20)).astype(np.float32) for _ in range(3))
    # The recurrences need the causal mask and their g / beta (made here for q's shape).
    for x in module_variants(lambda v: not reads_index(v)):
        variant, opts = x["name"], recurrence_kwargs(x["capabilities"], q, rng)
        forward = lambda *a, **kw: attnbench.forward(*a, **dict(opts, **kw))
        want = forward(variant, q, k, v)
        transposed = np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # same values
        fortran = np.asfortranarray(k)
        buf = np.empty(v.size + 1, np.float32)[1:]  # C-contiguous, 4 bytes past an aligned start
        buf[:] = v.ravel()
        offset = buf.reshape(v.shape)
        check(not transposed.flags.c_contiguous and not fortran.flags.c_contiguous and offset.flags.c_contiguous,
              "%s: the views are what they should be" % variant)
        got = forward(variant, transposed, fortran, offset)
        check(bitwise_equal(got, want), "%s: transposed, Fortran-ordered and offset inputs: the same output" % variant)
        got = forward(variant, q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
        check(bitwise_equal(got, want), "%s: float64 inputs: the same output as float32 (converted)" % variant)
        if "g" in opts or "beta" in opts:
            wide = {n: np.asfortranarray(opts[n].astype(np.float64)) for n in ("g", "beta") if n in opts}
            got = forward(variant, q, k, v, **wide)
            check(bitwise_equal(got, want), "%s: g / beta as Fortran-ordered float64: the same output" % variant)
        check(got.flags.c_contiguous and got.flags.owndata and got.dtype == np.float32 and got.shape == q.shape,
              "%s: the output is a new C-contiguous float32 [B, H, Lq, D] array" % variant)
    # float32 C-contiguous inputs are read in place: the call allocates (numpy memory, traced) its output only;
    # float64 inputs are converted to float32 copies first.
    q, k, v = (rng.standard_normal((1, 4, 256, 64)).astype(np.float32) for _ in range(3))
    peaks = {}
    for dtype in (np.float32, np.float64):
        args = [x.astype(dtype) for x in (q, k, v)]
        tracemalloc.start()
        attnbench.forward("tiled", *args)
        peaks[dtype] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    check(peaks[np.float32] < 1.5 * q.nbytes, "float32 inputs are not copied: traced peak %d bytes, output %d" %
          (peaks[np.float32], q.nbytes))
    check(peaks[np.float64] >= 3 * q.nbytes, "float64 inputs are converted: traced peak %d bytes >= 3 x %d" %
          (peaks[np.float64], q.nbytes))


def bad_inputs(exe, tmp):
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((1, 4, 8, 16)).astype(np.float32) for _ in range(3))
    fwd = lambda **kw: lambda: attnbench.forward(kw.pop("variant", "tiled"), kw.pop("q", q), kw.pop("k", k),
                                                 kw.pop("v", v), **kw)
    cases = [
        ("q of rank 3", fwd(q=q[0]), "q: rank 3 [4, 8, 16]"),
        ("empty q", fwd(q=q[:, :, :0]), "q: shape [1, 4, 0, 16] is empty"),
        ("k with another head_dim", fwd(k=k[..., :8], v=v[..., :8]), "k: shape [1, 4, 8, 8] does not fit q"),
        ("k with 3 heads for 4", fwd(k=k[:, :3], v=v[:, :3]), "k: shape [1, 3, 8, 16] does not fit q"),
        ("v unlike k", fwd(v=v[:, :, :5]), "v: shape [1, 4, 5, 16] does not fit k"),
        ("mask shape", fwd(mask=np.ones((8, 7), bool)), "mask: shape [8, 7] does not match [8, 8]"),
        ("mask with NaN", fwd(mask=np.full((8, 8), np.nan)), "mask: mask element 0 is NaN"),
        ("key_padding shape", fwd(key_padding=np.zeros((2, 8), bool)), "key_padding: shape [2, 8] does not match"),
        ("slopes without alibi", fwd(alibi_slopes=np.ones(4)), "alibi_slopes needs alibi=True"),
        ("slopes shape", fwd(alibi=True, alibi_slopes=np.ones(3)), "alibi_slopes: shape [3] does not match [4]"),
        ("infinite slope", fwd(alibi=True, alibi_slopes=np.array([1, np.inf, 1, 1])),
         "alibi_slopes: slope 1 = inf is not a finite float32"),
        ("unknown variant", fwd(variant="nope"), "unknown variant 'nope'; registered: "),
        ("unknown parameter", fwd(params={"tile": 4}), "params for variant 'tiled': "),
        ("params not a dict", fwd(params=[1]), "params: expected a dict"),
        ("dtype", fwd(dtype="fp8"), "dtype: unknown dtype 'fp8'"),
        ("isa", fwd(isa="avx9000"), "isa 'avx9000' is not a SIMD target of this build"),
        ("threads", fwd(threads=-1), "threads: -1 is not in [0, 4096]"),
        ("dropout", fwd(dropout=1.5), "dropout: must be a probability in [0, 1)"),
        ("q a string", fwd(q="abc"), "q: cannot be read as a float32 array"),
        ("reference, k of rank 2", lambda: attnbench.reference(q, k[0, 0], v), "k: rank 2 [8, 16]"),
        ("reference, dropout", lambda: attnbench.reference(q, k, v, dropout=-1), "dropout: must be"),
    ]
    for label, fn, start in cases:
        e = raises(fn)
        check(e is not None and str(e).startswith(start), "%s: ValueError '%s...' (%s)" % (label, start, e))
    e = raises(fwd(variant="sliding_window", k=k[:, :, :5], v=v[:, :, :5]))
    check(isinstance(e, attnbench.NotSupported) and "does not support cross-attention" in str(e),
          "a problem the variant cannot run: attnbench.NotSupported (a ValueError): %s" % e)
    # The module's message is eval's with the argument named where eval names the option and its file.
    d = os.path.join(tmp, "bad")
    os.makedirs(d)
    for name, x in (("q", q), ("k", k[..., :8]), ("v", v[..., :8])):
        np.save(os.path.join(d, name + ".npy"), x)
    r = cli(exe, "eval", "--variant", "tiled", "--q", os.path.join(d, "q.npy"), "--k", os.path.join(d, "k.npy"),
            "--v", os.path.join(d, "v.npy"), "--out", os.path.join(d, "o.npy"))
    cli_message = r.stderr.strip().removeprefix("attnbench: error: ")
    for name in ("q", "k", "v"):
        cli_message = cli_message.replace("--%s '%s'" % (name, os.path.join(d, name + ".npy")), name)
    e = raises(fwd(k=k[..., :8], v=v[..., :8]))
    check(r.returncode == 2 and str(e) == cli_message, "bad k: eval's message with 'k' for \"--k 'FILE'\" (%s)" % e)
    e = raises(lambda: attnbench.load_results(os.path.join(tmp, "missing")), FileNotFoundError)
    check(e is not None and e.filename.endswith("results.jsonl"), "load_results of a missing folder: "
          "FileNotFoundError naming the file (%s)" % e)
    e = raises(lambda: attnbench.run(os.path.join(tmp, "missing.json"), os.path.join(tmp, "o")), FileNotFoundError)
    check(e is not None and "missing.json" in str(e), "run of a missing config: FileNotFoundError (%s)" % e)


def reference_oracle():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 2, 12, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, 15, 8)).astype(np.float32)  # grouped-query: both heads read K/V head 0
    v = rng.standard_normal((1, 1, 15, 8)).astype(np.float32)
    kk, vv = np.repeat(k, 2, axis=1).astype(np.float64), np.repeat(v, 2, axis=1).astype(np.float64)
    s = q.astype(np.float64) @ kk.transpose(0, 1, 3, 2) * 0.5
    allowed = np.arange(15)[None, :] <= np.arange(12)[:, None] + 3  # lower-right causal
    s = np.where(allowed, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    want = (w / w.sum(-1, keepdims=True)) @ vv
    got = attnbench.reference(q, k, v, causal_lower_right=True, scale=0.5)
    check(got.dtype == np.float64 and got.shape == q.shape and np.abs(got - want).max() < 1e-13,
          "reference(): float64, equal to numpy's float64 attention (grouped-query, lower-right causal) to 1e-13")
    out = attnbench.forward("naive", q, k, v, causal_lower_right=True, scale=0.5, dropout=0.3, seed=4)
    ref = attnbench.reference(q, k, v, causal_lower_right=True, scale=0.5, dropout=0.3, seed=4)
    check(np.abs(out - ref).max() < 1e-5 and np.abs(ref - got).max() > 1e-3,
          "reference() with dropout draws forward()'s keep decisions (naive within 1e-5; differs from no dropout)")


def value_dim():
    """V of another width than Q and K (d_v != d_k): forward, backward and the fp64 definitions take it from v's
    shape; the variants that need V as wide as Q and K raise NotSupported."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 4, 10, 8)).astype(np.float32)
    k = rng.standard_normal((2, 2, 10, 8)).astype(np.float32)  # grouped-query: 2 K/V heads
    v = rng.standard_normal((2, 2, 10, 3)).astype(np.float32)
    d_out = rng.standard_normal((2, 4, 10, 3)).astype(np.float32)
    kk, vv = np.repeat(k, 2, axis=1).astype(np.float64), np.repeat(v, 2, axis=1).astype(np.float64)
    s = q.astype(np.float64) @ kk.transpose(0, 1, 3, 2) / np.sqrt(8)
    s = np.where(np.tril(np.ones((10, 10), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    want = (w / w.sum(-1, keepdims=True)) @ vv
    ref = attnbench.reference(q, k, v, causal=True)
    check(ref.shape == (2, 4, 10, 3) and np.abs(ref - want).max() < 1e-12,
          "reference() with d_v 3 != d_k 8: numpy's float64 attention, [batch, heads, seq, d_v]")
    out = attnbench.forward("naive", q, k, v, causal=True)
    check(out.shape == (2, 4, 10, 3) and np.abs(out - want).max() < 1e-5,
          "forward('naive') with d_v != d_k: O [2, 4, 10, 3] within 1e-5 of numpy's")
    dq, dk, dv = attnbench.backward("naive", q, k, v, d_out, causal=True)
    rq, rk, rv = attnbench.reference_backward("naive", q, k, v, d_out, causal=True)
    check(dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and rv.shape == v.shape,
          "backward('naive') with d_v != d_k: dq, dk, dv in q's, k's and v's shapes")
    err = max(np.abs(g - r).max() / np.abs(r).max() for g, r in ((dq, rq), (dk, rk), (dv, rv)))
    check(err < 1e-5, "backward('naive') with d_v != d_k within 1e-5 of reference_backward (%.2g)" % err)
    out = attnbench.forward("tiled", q, k, v, causal=True)
    check(out.shape == (2, 4, 10, 3) and np.abs(out - want).max() < 1e-5,
          "forward('tiled') with d_v != d_k: O [2, 4, 10, 3] within 1e-5 of numpy's")
    tq, tk, tv = attnbench.backward("tiled", q, k, v, d_out, causal=True)
    err = max(np.abs(g - r).max() / np.abs(r).max() for g, r in ((tq, rq), (tk, rk), (tv, rv)))
    check(tv.shape == v.shape and err < 1e-5,
          "backward('tiled') with d_v != d_k within 1e-5 of reference_backward (%.2g)" % err)
    try:
        attnbench.forward("sliding_window", q, k, v, causal=True)
        check(False, "forward('sliding_window') with d_v != d_k: refused")
    except attnbench.NotSupported as e:
        check("needs V as wide as Q and K" in str(e),
              "forward('sliding_window') with d_v != d_k: NotSupported (%s)" % e)
    try:
        attnbench.backward("naive", q, k, v, q, causal=True)
        check(False, "backward with d_out of q's width: refused")
    except ValueError as e:
        check("d_out" in str(e), "backward with d_out [.., d_k] instead of [.., d_v]: ValueError naming d_out")


def recurrence_decode():
    """A recurrence's decode through forward(): g and beta cover the context (one per key token, as the kernels
    index them), the state is d_k x d_v; chunked prefill + token-by-token decode equals one chunkwise call."""
    rng = np.random.default_rng(5)
    n, P, dk, dv = 40, 33, 8, 12
    q = rng.standard_normal((1, 2, n, dk)).astype(np.float32)
    k = rng.standard_normal((1, 2, n, dk)).astype(np.float32) / 3
    v = rng.standard_normal((1, 2, n, dv)).astype(np.float32)
    g = -np.log1p(np.exp(-rng.standard_normal((1, 2, n)))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((1, 2, n))))).astype(np.float32)
    o_all, s_all = attnbench.forward("gated_delta_rule", q, k, v, causal=True, g=g, beta=beta,
                                     return_final_state=True)
    outs, (o, s) = [], attnbench.forward("gated_delta_rule", q[:, :, :P], k[:, :, :P], v[:, :, :P], causal=True,
                                         g=g[..., :P], beta=beta[..., :P], return_final_state=True)
    outs.append(o)
    for t in range(P, n):
        o, s = attnbench.forward("gated_delta_rule", q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1],
                                 causal_lower_right=True, g=g[..., :t + 1], beta=beta[..., :t + 1], initial_state=s,
                                 return_final_state=True)
        outs.append(o)
    err = max(np.abs(np.concatenate(outs, axis=2) - o_all).max(), np.abs(s - s_all).max())
    check(s.shape == (1, 2, dk, dv) and err < 1e-5,
          "gated_delta_rule prefill + decode through forward() (d_k 8, d_v 12) equals one call (%.2g)" % err)
    try:
        attnbench.forward("gated_delta_rule", q[:, :, n - 1:], k, v, causal_lower_right=True, g=g[..., n - 1:],
                          beta=beta, initial_state=s)
        check(False, "a decode step's g of seq_q (not seq_kv) values: refused")
    except ValueError as e:
        check("g" in str(e) and "seq_kv" in str(e),
              "a decode step's g of seq_q values: ValueError naming g and seq_kv (%s)" % e)


def softcap_and_sinks():
    """softcap and sink_logits (eval's --softcap, --sink-logits): forward, backward and the fp64 definitions."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 2, 12, 8)).astype(np.float32) * 2
    k = rng.standard_normal((1, 2, 12, 8)).astype(np.float32) * 2
    v = rng.standard_normal((1, 2, 12, 8)).astype(np.float32)
    d_out = rng.standard_normal(q.shape).astype(np.float32)
    sinks = np.array([0.5, -1.0], dtype=np.float32)
    cap = 3.0
    # numpy float64: s <- cap tanh(s / cap) after the scale, then the causal mask, then one more logit per
    # row whose weight is dropped.
    s = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) / np.sqrt(8)
    s = cap * np.tanh(s / cap)
    s = np.where(np.tril(np.ones((12, 12), bool)), s, -np.inf)
    m = np.maximum(s.max(-1, keepdims=True), sinks.astype(np.float64)[None, :, None, None])
    w = np.exp(s - m)
    want = (w / (w.sum(-1, keepdims=True) + np.exp(sinks.astype(np.float64)[None, :, None, None] - m))) @ v
    opts = dict(causal=True, softcap=cap, sink_logits=sinks)
    ref = attnbench.reference(q, k, v, **opts)
    check(np.abs(ref - want).max() < 1e-12,
          "reference(softcap=, sink_logits=): numpy's float64 capped attention with sinks to 1e-12")
    for name in ("naive", "tiled", "sliding_window"):
        out = attnbench.forward(name, q, k, v, **opts)
        check(np.abs(out - want).max() < 1e-5, "forward(%r, softcap=, sink_logits=) within 1e-5 of numpy's" % name)
        grads = attnbench.backward(name, q, k, v, d_out, **opts)
        fp64 = attnbench.reference_backward(name, q, k, v, d_out, **opts)
        check(len(grads) == 4 and grads[3].shape == (2,) and grads[3].dtype == np.float32 and len(fp64) == 4,
              "backward(%r, sink_logits=): (dq, dk, dv, d_sink_logits), d_sink_logits [heads] float32" % name)
        err = max(np.abs(g - r).max() / (np.abs(r).max() + 1e-30) for g, r in zip(grads, fp64))
        check(err < 1e-4, "backward(%r) with softcap and sinks: every gradient within 1e-4 (relative to its "
                          "largest value) of reference_backward's fp64 one (%.2g)" % (name, err))
    # d sink against a central difference of the fp64 definition (L = sum(d_out * O)).
    h = 2.0 ** -10
    for head in range(2):
        up, dn = sinks.copy(), sinks.copy()
        up[head] += h
        dn[head] -= h
        fd = (np.sum(d_out * attnbench.reference(q, k, v, causal=True, softcap=cap, sink_logits=up)) -
              np.sum(d_out * attnbench.reference(q, k, v, causal=True, softcap=cap, sink_logits=dn))) / (2 * h)
        got = attnbench.reference_backward("naive", q, k, v, d_out, **opts)[3][head]
        check(abs(got - fd) < 1e-6 * max(1.0, abs(fd)),
              "reference_backward's d_sink_logits[%d] is the central difference of reference() (%.6g vs %.6g)"
              % (head, got, fd))
    try:
        attnbench.forward("linear", q, k, v, causal=True, sink_logits=sinks)
        check(False, "forward('linear', sink_logits=): refused")
    except attnbench.NotSupported as e:
        check("sink" in str(e), "forward('linear', sink_logits=): NotSupported naming sinks (%s)" % e)
    try:
        attnbench.forward("naive", q, k, v, sink_logits=np.zeros(3, np.float32))
        check(False, "sink_logits of the wrong shape: refused")
    except ValueError as e:
        check("sink_logits" in str(e), "sink_logits of the wrong shape: ValueError naming it (%s)" % e)
    try:
        attnbench.forward("naive", q, k, v, softcap=-1.0)
        check(False, "softcap=-1: refused")
    except ValueError as e:
        check("softcap" in str(e), "softcap=-1: ValueError naming softcap (%s)" % e)


def small_config(tmp, name, extra=None):
    config = {"name": name, "variants": "all",
              "sweep": {"batch": 1, "heads": 2, "head_dim": 8, "seq_len": [16, 33], "mask": ["none", "causal"],
                        "threads": 1},
              "measure": FAST_MEASURE, "accuracy": {"reference": "full"}, "memory_budget": "1GiB", "seed": 3}
    config.update(extra or {})
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def without_timing(rows):
    return {r["id"]: {k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows}


def sweep(exe, tmp):
    config = small_config(tmp, "module_sweep")
    out_cli, out_py = os.path.join(tmp, "sweep_cli"), os.path.join(tmp, "sweep_py")
    r = cli(exe, "run", config, "--out", out_cli, "--plain", timeout=300)
    check(r.returncode == 0, "attnbench run on the small config exits 0 " + r.stderr[-300:])
    with open(os.path.join(out_cli, "results.jsonl")) as f:
        cli_rows = [json.loads(line) for line in f]
    rows = attnbench.run(config, out_py)
    # Every registered variant x 2 lengths x 2 masks (the small config's "variants" is "all").
    planned = 4 * len(attnbench.variants())
    check(len(rows) == len(cli_rows) == planned and without_timing(rows) == without_timing(cli_rows),
          "run() rows equal `attnbench run`'s but for the timing fields (%d rows)" % len(rows))
    check(all(r["status"] in ("ok", "skipped") for r in rows), "run(): every point ok or skipped")
    again = raises(lambda: attnbench.run(config, out_py))
    check(again is not None and "already holds results" in str(again), "run() into a used folder: ValueError (%s)" % again)
    check(len(attnbench.run(config, out_py, force=True, filter="tiled")) == 4, "run(force=True, filter='tiled')")
    bad = small_config(tmp, "bad", {"sweep": {"seq_len": [-5]}})
    r = cli(exe, "run", bad, "--out", os.path.join(tmp, "bad_out"))
    e = raises(lambda: attnbench.run(bad, os.path.join(tmp, "bad_out")))
    check(e is not None and r.returncode == 2 and "attnbench: error: " + str(e) == r.stderr.strip(),
          "a bad config: ValueError with the CLI's message (%s)" % e)
    # load_results: a DataFrame when pandas imports (a stand-in pandas module here when it is not installed),
    # else a list.
    if _has_pandas():
        import pandas
        df = attnbench.load_results(out_cli)
        check(isinstance(df, pandas.DataFrame) and len(df) == 16 and "time_ms.median" in df.columns,
              "load_results with pandas: a flattened DataFrame")
        return
    listed = attnbench.load_results(out_cli)
    check(listed == cli_rows, "load_results without pandas: the rows of results.jsonl as dicts")
    fake = types.ModuleType("pandas")
    fake.json_normalize = lambda rows: ("normalized", rows)
    sys.modules["pandas"] = fake
    try:
        got = attnbench.load_results(out_cli)
    finally:
        del sys.modules["pandas"]
    check(got[0] == "normalized" and got[1] == cli_rows,
          "load_results with pandas importable: pandas.json_normalize(rows) (a stand-in pandas module)")


def _has_pandas():
    try:
        import pandas  # noqa: F401
        return True
    except ImportError:
        return False


INTERRUPTED_CHILD = textwrap.dedent("""
    import json, os, signal, sys, time
    sys.path.insert(0, sys.argv[1])
    import attnbench
    config, out = sys.argv[2], sys.argv[3]
    try:
        attnbench.run(config, out)
        print("finished without an interrupt", flush=True)
    except KeyboardInterrupt as e:
        print("interrupted:", e, flush=True)
        with open(os.path.join(out, "meta.json")) as f:
            meta = json.load(f)
        with open(os.path.join(out, "results.jsonl")) as f:
            rows = sum(1 for line in f)
        print("meta.json interrupted: %s, rows: %d" % (meta["interrupted"], rows), flush=True)
    print("handler restored:", signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
    print("waiting", flush=True)
    try:
        time.sleep(60)
        print("no second interrupt", flush=True)
    except KeyboardInterrupt:
        print("second SIGINT: KeyboardInterrupt from Python's own handler", flush=True)
    rows = attnbench.run(config, out, resume=True)
    print("rows after resume:", len(rows), flush=True)
""")


def interrupt(tmp):
    """SIGINT during run(): the sweep stops after the current point, run() raises KeyboardInterrupt, Python's
    handler is back (a second SIGINT interrupts a sleep as usual), and resume=True measures the rest."""
    lens = list(range(16, 36))
    config = small_config(tmp, "slow", {"variants": ["naive"], "sweep": {"batch": 1, "heads": 1, "head_dim": 8,
                                                                           "seq_len": lens, "threads": 1},
                                        "measure": dict(FAST_MEASURE, max_reps=100000, min_time_s=0.05)})
    out = os.path.join(tmp, "slow_out")
    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED_CHILD, MODULE_DIR, config, out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    jsonl = os.path.join(out, "results.jsonl")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        if os.path.exists(jsonl) and os.path.getsize(jsonl) > 0:
            break
        time.sleep(0.02)
    child.send_signal(signal.SIGINT)
    lines = []
    while child.poll() is None and time.monotonic() < deadline:
        line = child.stdout.readline()
        lines.append(line.strip())
        if line.startswith("waiting"):
            time.sleep(0.2)
            child.send_signal(signal.SIGINT)
            break
    try:
        rest, err = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        rest, err = child.communicate()
    lines += rest.splitlines()
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    text = " | ".join(lines)
    check(child.returncode == 0, "the interrupted child exits 0" + ("" if child.returncode == 0 else err[-500:]))
    check(any(x.startswith("interrupted: sweep interrupted") for x in lines),
          "SIGINT during run(): KeyboardInterrupt (%s)" % text)
    stopped = [x for x in lines if x.startswith("meta.json interrupted: True, rows: ")]
    check(stopped and 1 <= int(stopped[0].split()[-1]) < len(lens),
          "the sweep stopped after the current point: meta.json interrupted, some rows but not all (%s)" % stopped)
    check("handler restored: True" in lines, "Python's SIGINT handler is back after run()")
    check("second SIGINT: KeyboardInterrupt from Python's own handler" in lines,
          "a second SIGINT interrupts time.sleep as in plain Python")
    check("rows after resume: %d" % len(lens) in lines and meta.get("interrupted") is False,
          "resume=True measures the rest: %d rows, meta.json interrupted false at the end" % len(lens))


def gil_released():
    """While forward() runs in this thread, a pure-Python counter in another thread advances. With a 1 s switch
    interval a thread holding the GIL keeps it for up to 1 s, so a call that held the GIL (a ~0.1 s C loop,
    sum(range(N)), the control) lets the counter make no step between the reads around it: 0 increments."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 8, 1024, 64)).astype(np.float32) for _ in range(3))
    state = {"count": 0, "stop": False}
    started = threading.Event()

    def counter():
        started.set()
        while not state["stop"]:
            state["count"] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    worker = threading.Thread(target=counter)
    worker.start()
    try:
        started.wait()
        c0 = state["count"]
        sum(range(1_000_000))  # holds the GIL throughout (~20 ms)
        held = state["count"] - c0
        c0 = state["count"]
        attnbench.forward("tiled", q, k, v)  # ~50 ms on 2 cores
        released = state["count"] - c0
    finally:
        state["stop"] = True
        worker.join()
        sys.setswitchinterval(old)
    check(held == 0, "control: a call holding the GIL lets the counter make %d steps (0)" % held)
    check(released >= 1000, "forward() releases the GIL: the counter made %d steps meanwhile (>= 1000)" % released)
    # Two threads calling forward at once give what each gives alone.
    want = {name: attnbench.forward(name, q[:, :2, :256], k[:, :2, :256], v[:, :2, :256], causal=True)
            for name in ("tiled", "naive")}
    got = {}
    threads = [threading.Thread(target=lambda n=name: got.__setitem__(
        n, attnbench.forward(n, q[:, :2, :256], k[:, :2, :256], v[:, :2, :256], causal=True))) for name in want]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(all(bitwise_equal(got[n], want[n]) for n in want), "two threads calling forward() at once: the "
          "outputs each gives alone")


GRAD_KEYS = ("grad_accuracy", "grad_accuracy_exact", "nonfinite_gradients")


def module_variants(pred=lambda v: True):
    """The registered variants with `pred`, from their capabilities (never a fixed list)."""
    return [v for v in attnbench.variants() if pred(v)]


def is_recurrence(v):
    caps = v["capabilities"]
    return caps["state"] or caps["gate"] != "none" or caps["beta"]


def reads_index(v):
    """A variant reading a lightning indexer's inputs (capabilities["indexer"]: dsa), which the module does not
    take yet (`attnbench eval --index-q/k/w` and the C++ tests run it)."""
    return v["capabilities"].get("indexer", False)


def backward_variants():
    """The registered variants with a backward pass (capabilities["backward"]) the module can run."""
    return module_variants(lambda v: v["capabilities"]["backward"] and not reads_index(v))


def cli_options(inputs, options):
    """`attnbench eval` arguments and module keyword arguments for the same options (as eval_case)."""
    args, kwargs = [], {}
    for key, value in options.items():
        if value is False:  # an option left off (the default)
            continue
        if key in ("mask", "key_padding"):
            args += ["--" + key.replace("_", "-"), inputs.path(key)]
            kwargs[key] = getattr(inputs, key)
        elif key == "alibi_slopes":
            args += ["--alibi-slopes", inputs.path("slopes")]
            kwargs[key] = inputs.slopes
        elif key in RECURRENCE_INPUTS:  # the value names the Inputs attribute, as in eval_case
            args += ["--" + key.replace("_", "-"), inputs.path(value)]
            kwargs[key] = getattr(inputs, value)
        elif key == "params":
            for name, val in value.items():
                args += ["--param", "%s=%s" % (name, val)]
            kwargs[key] = value
        elif key == "threads":
            args = ["--threads", str(value)] + args  # a global option: before the subcommand
            kwargs[key] = value
        elif value is True:
            args.append("--" + key.replace("_", "-"))
            kwargs[key] = True
        else:
            args += ["--" + key.replace("_", "-"), str(value)]
            kwargs[key] = value
    return args, kwargs


def cli_refusal(stderr):
    """eval's "attnbench: error: MSG" / "attnbench: not supported: MSG" as the module words MSG."""
    message = stderr.strip().split(": ", 2)[-1]
    return re.sub(r"--dtype (\w+)", r"dtype='\1'", re.sub(r"--alibi(?!-)", "alibi=True", message))


def backward_case_of(exe, inputs, variant, label, **options):
    """forward(save_state=True) and backward(compare=True), then backward(out=, state=), against `attnbench
    eval --save-state --grad-output --compare` on the same files: O, the state, dQ, dK, dV bitwise equal and
    the gradient metrics equal; or the same refusal."""
    # A recurrence's input gradients too (dg, dbeta, d_initial_state for each of g, beta, initial_state given):
    # backward() returns them after dv, eval writes them with --dg, --dbeta, --d-initial-state.
    input_grads = ["d" + n.replace("_", "") for n in RECURRENCE_INPUTS if n in options]
    files = {n: inputs.path(n) for n in ["out", "state", "dq", "dk", "dv"] + input_grads}
    for f in files.values():
        if os.path.exists(f):
            os.remove(f)
    extra, kwargs = cli_options(inputs, options)
    grad_flags = []
    for n in input_grads:
        grad_flags += [{"dg": "--dg", "dbeta": "--dbeta", "dinitialstate": "--d-initial-state"}[n], files[n]]
    globals_ = extra[:2] if extra[:1] == ["--threads"] else []
    extra = extra[len(globals_):]
    r = cli(exe, *globals_, "eval", "--variant", variant, "--q", inputs.path("q"), "--k", inputs.path("k"), "--v",
            inputs.path("v"), "--out", files["out"], "--save-state", files["state"], "--grad-output",
            inputs.path("d_out"), "--dq", files["dq"], "--dk", files["dk"], "--dv", files["dv"], "--compare", *extra,
            *grad_flags)
    label = "%s backward %s" % (variant, label)
    try:
        out, state = attnbench.forward(variant, inputs.q, inputs.k, inputs.v, save_state=True, **kwargs)
        grads = attnbench.backward(variant, inputs.q, inputs.k, inputs.v, inputs.d_out, compare=True, **kwargs)
        (dq, dk, dv), metrics = grads[:3], grads[-1]
        error = None
    except ValueError as e:
        error = e
    if r.returncode != 0:
        check(error is not None and str(error) == cli_refusal(r.stderr),
              "%s: refused by both with the same message (%s)" % (label, cli_refusal(r.stderr)[:90]))
        return
    if not check(error is None, "%s: the module runs what eval runs (%s)" % (label, error)):
        return
    want = {n: np.load(f) for n, f in files.items()}
    cli_json = json.loads(r.stdout)
    same = all(bitwise_equal(got, want[n]) for n, got in
               [("out", out), ("state", state), ("dq", dq), ("dk", dk), ("dv", dv)] +
               list(zip(input_grads, grads[3:-1])))
    check(same and dk.shape == inputs.k.shape and dq.shape == inputs.q.shape and len(grads) == 4 + len(input_grads),
          "%s: forward(save_state=True) and backward() equal `eval --save-state --grad-output` bitwise "
          "(O, state of %d floats, dQ, dK, dV%s)" % (label, state.size, "".join(", " + n for n in input_grads)))
    check(metrics == {k: cli_json[k] for k in GRAD_KEYS},
          "%s: backward(compare=True)'s metrics are eval --compare's gradient metrics" % label)
    again = attnbench.backward(variant, inputs.q, inputs.k, inputs.v, inputs.d_out, out, state, **kwargs)
    check(all(bitwise_equal(a, b) for a, b in zip(again, (dq, dk, dv))),
          "%s: backward(out=, state=) from forward(save_state=True) gives the same gradients" % label)
    # eval's own round trip: --forward-output and --saved-state from `eval --save-state` (a state holding +inf,
    # the log-sum-exp of a row with no allowed key, is taken as the module takes it).
    given = {n: inputs.path("given_" + n) for n in ("dq", "dk", "dv")}
    r = cli(exe, *globals_, "eval", "--variant", variant, "--q", inputs.path("q"), "--k", inputs.path("k"), "--v",
            inputs.path("v"), "--forward-output", files["out"], *(["--saved-state", files["state"]] if state.size else []),
            "--grad-output", inputs.path("d_out"), "--dq", given["dq"], "--dk", given["dk"], "--dv", given["dv"], *extra)
    check(r.returncode == 0 and all(bitwise_equal(np.load(given[n]), want[n]) for n in given),
          "%s: eval --forward-output --saved-state (%d of %d state values infinite) gives the same gradients (%s)"
          % (label, int(np.isinf(state).sum()), state.size, r.stderr.strip()[-150:]))


def backward_cli_equivalence(exe, tmp):
    rng = np.random.default_rng(23)
    for name in ("bmha", "bgqa", "bcross"):
        os.makedirs(os.path.join(tmp, name))
    mha = Inputs(os.path.join(tmp, "bmha"), rng, 2, 4, 4, 33, 33, 24)
    gqa = Inputs(os.path.join(tmp, "bgqa"), rng, 1, 4, 2, 33, 33, 24)
    cross = Inputs(os.path.join(tmp, "bcross"), rng, 1, 2, 2, 9, 40, 16)
    for x in (mha, gqa, cross):
        x.d_out = rng.standard_normal(x.q.shape).astype(np.float32)
        np.save(x.path("d_out"), x.d_out)
    variants = backward_variants()
    check(len(variants) >= 2, "variants() lists variants with a backward: %s" % [v["name"] for v in variants])
    for v in variants:
        name, caps = v["name"], v["capabilities"]
        needed = needed_inputs(caps)  # a recurrence's g and beta go with every case
        backward_case = lambda *a, **kw: backward_case_of(*a, **dict(needed, **kw))
        backward_case(exe, mha, name, "no mask", causal=False)
        backward_case(exe, mha, name, "causal", causal=True)
        if caps["state"]:
            backward_case(exe, mha, name, "causal with an initial state", causal=True, initial_state="initial_state")
        if caps["causal_lower_right"]:
            backward_case(exe, cross if caps["cross"] else mha, name, "causal_lower_right",
                          causal_lower_right=True, causal=False)
        if caps["boolean_mask"]:
            backward_case(exe, mha, name, "mask (a row with no allowed key: +inf in the state)", mask=True)
        if caps["key_padding"]:
            backward_case(exe, mha, name, "key_padding + causal", key_padding=True, causal=True)
        if caps["dropout"]:
            backward_case(exe, mha, name, "dropout", dropout=0.25, seed=5)
        if caps["gqa"]:
            backward_case(exe, gqa, name, "grouped-query causal", causal=True)
        if caps["cross"]:
            backward_case(exe, cross, name, "cross-attention", scale=0.3)
        backward_case(exe, mha, name, "dtype bf16", dtype="bf16")  # refused alike where not taken
        backward_case(exe, mha, name, "alibi with slopes", alibi=True, alibi_slopes=True)
        backward_case(exe, mha, name, "threads 1", threads=1)
        int_params = [p for p in v["params"] if p["type"] == "integer"]
        if int_params:
            p = int_params[0]
            backward_case(exe, mha, name, "params %s=3" % p["name"], params={p["name"]: 3})


def bad_backward_inputs(exe, tmp):
    """Hostile backward inputs: refused with eval's message, the argument named where eval names the option and
    its file."""
    rng = np.random.default_rng(31)
    q, k, v, d = (rng.standard_normal((1, 4, 8, 16)).astype(np.float32) for _ in range(4))
    variant = [x for x in backward_variants() if not is_recurrence(x)][0]["name"]  # takes q, k, v alone
    out, state = attnbench.forward(variant, q, k, v, save_state=True)
    folder = os.path.join(tmp, "bad_backward")
    os.makedirs(folder)
    path = lambda n: os.path.join(folder, n + ".npy")

    def both(label, cli_args, fn, replace, files=(), name=None):
        """The module's ValueError message is eval's after `replace` (CLI words -> module words); the CLI runs
        `name` (default: the first variant with a backward)."""
        for n, x in files:
            np.save(path(n), x)
        for n, x in (("q", q), ("k", k), ("v", v)):
            np.save(path(n), x)
        r = cli(exe, "eval", "--variant", name or variant, "--q", path("q"), "--k", path("k"), "--v", path("v"),
                *cli_args)
        message = r.stderr.strip().split(": ", 2)[-1]
        for a, b in replace:
            message = message.replace(a, b)
        e = raises(fn)
        check(r.returncode != 0 and e is not None and str(e) == message,
              "%s: ValueError with eval's message (%s)" % (label, e))
        return e

    dqkv = ["--dq", path("dq"), "--dk", path("dk"), "--dv", path("dv")]
    grad = ["--grad-output", path("d_out"), "--out", path("o")] + dqkv
    d_name = [("--grad-output '%s'" % path("d_out"), "d_out"), ("from --q and V)", "from q and V)")]
    both("d_out of another shape", grad, lambda: attnbench.backward(variant, q, k, v, d[..., :8]), d_name,
         [("d_out", d[..., :8])])
    for bad, what in ((np.nan, "NaN"), (np.inf, "infinite")):
        x = d.copy()
        x[0, 1, 2, 3] = bad
        e = both("d_out with a %s" % what, grad, lambda: attnbench.backward(variant, q, k, v, x), d_name,
                 [("d_out", x)])
        check(e is not None and "element [0, 1, 2, 3]" in str(e), "d_out %s: the element named (%s)" % (what, e))
    e = raises(lambda: attnbench.backward(variant, q, k, v, np.full(d.shape, "x")))
    check(e is not None and str(e).startswith("d_out: cannot be read as a float32 array"),
          "d_out of strings: ValueError naming d_out (%s)" % e)
    e = raises(lambda: attnbench.backward(variant, q, k, v, d.astype(np.float64)), Exception)
    check(e is None, "d_out as float64: converted, as q is (%s)" % e)
    fwd_given = ["--grad-output", path("d_out"), "--forward-output", path("o")] + dqkv
    names = [("--forward-output '%s'" % path("o"), "out"), ("--saved-state '%s'" % path("s"), "state"),
             ("give --saved-state S.npy written by `eval --save-state` with the same inputs",
              "give state= from forward(..., save_state=True) on the same inputs"),
             ("drop the option", "drop the argument")]
    if state.size:
        both("out without the state %s keeps" % variant, fwd_given,
             lambda: attnbench.backward(variant, q, k, v, d, out), names, [("d_out", d), ("o", out)])
        e = raises(lambda: attnbench.backward(variant, q, k, v, d, out, np.zeros(0, np.float32)))
        check(e is not None and "also needs the forward's saved state" in str(e),
              "an empty state for a variant that keeps one: the state is missing (%s)" % e)
        bad_state = state.copy()
        bad_state[3] = np.nan
        both("a state with a NaN", fwd_given + ["--saved-state", path("s")],
             lambda: attnbench.backward(variant, q, k, v, d, out, bad_state), names,
             [("d_out", d), ("o", out), ("s", bad_state)])
        both("a state of another size", fwd_given + ["--saved-state", path("s")],
             lambda: attnbench.backward(variant, q, k, v, d, out, state[:5]), names,
             [("d_out", d), ("o", out), ("s", state[:5])])
    bad_out = out.copy()
    bad_out[0, 0, 0, 0] = np.nan
    both("out with a NaN", fwd_given + ["--saved-state", path("s")],
         lambda: attnbench.backward(variant, q, k, v, d, bad_out, state), names,
         [("d_out", d), ("o", bad_out), ("s", state)])
    e = both("state without out", grad + ["--saved-state", path("s")],
             lambda: attnbench.backward(variant, q, k, v, d, state=state),
             [("--saved-state '%s'" % path("s"), "state"), ("--forward-output O.npy", "out"),
              ("eval runs", "backward() runs")], [("d_out", d), ("s", state)])
    # A stateless variant that runs this unmasked problem (the recurrences keep no state but need the causal mask).
    stateless, o2 = [x["name"] for x in backward_variants() if not x["saved_state"] and not is_recurrence(x)], None
    for x in stateless:
        try:
            o2 = attnbench.forward(x, q, k, v)
            break
        except attnbench.NotSupported:
            continue
    if o2 is not None:
        both("a state for %s, which keeps none" % x, fwd_given + ["--saved-state", path("s")],
             lambda: attnbench.backward(x, q, k, v, d, o2, state), names, [("d_out", d), ("o", o2), ("s", state)],
             name=x)
    else:
        print("SKIP  a state for a variant that keeps none: no stateless variant with a backward runs an unmasked "
              "problem (stateless: %s)" % (", ".join(stateless) or "none"))
    no_backward = [x["name"] for x in module_variants(lambda x: not x["capabilities"]["backward"])]
    if no_backward:
        x = no_backward[0]
        np.save(path("d_out"), d)
        r = cli(exe, "eval", "--variant", x, "--q", path("q"), "--k", path("k"), "--v", path("v"), "--out",
                path("o"), "--grad-output", path("d_out"), "--dq", path("dq"), "--dk", path("dk"), "--dv", path("dv"))
        e = raises(lambda: attnbench.backward(x, q, k, v, d))
        check(isinstance(e, attnbench.NotSupported) and "has no backward pass" in str(e) and
              str(e) == r.stderr.strip().split(": ", 2)[-1],
              "%s, a variant without backward: attnbench.NotSupported with eval's message (%s)" % (x, e))
        both("save_state=True for %s" % x, ["--out", path("o"), "--save-state", path("s")],
             lambda: attnbench.forward(x, q, k, v, save_state=True),
             [("--save-state '%s'" % path("s"), "save_state=True")], name=x)
        e = raises(lambda: attnbench.reference_backward(x, q, k, v, d))
        check(isinstance(e, attnbench.NotSupported) and "has no backward pass" in str(e),
              "reference_backward of %s: attnbench.NotSupported (%s)" % (x, e))
    else:
        print("SKIP  a variant without backward: every registered variant has one")
    e = raises(lambda: attnbench.reference(q, k, v, params={"k": 3}))
    check(e is not None and str(e).startswith("params needs variant="), "reference(params=) without variant (%s)" % e)


def numpy_attention_gradients(q, k, v, d_out, scale, allowed):
    """fp64 dQ, dK, dV of softmax attention written out apart from attnbench (grouped-query: K/V head h // G)."""
    G = q.shape[1] // k.shape[1]
    q, d_out = q.astype(np.float64), d_out.astype(np.float64)
    kk, vv = np.repeat(k, G, axis=1).astype(np.float64), np.repeat(v, G, axis=1).astype(np.float64)
    s = np.where(allowed, q @ kk.transpose(0, 1, 3, 2) * scale, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    p = w / w.sum(-1, keepdims=True)
    dp = d_out @ vv.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = ds @ kk * scale
    dk, dv = ds.transpose(0, 1, 3, 2) @ q * scale, p.transpose(0, 1, 3, 2) @ d_out
    fold = lambda x: x.reshape(x.shape[0], k.shape[1], G, *x.shape[2:]).sum(2)
    return dq, fold(dk), fold(dv)


def reference_gradients():
    rng = np.random.default_rng(12)
    q = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 13, 8)).astype(np.float32) for _ in range(2))  # cross: 9 queries, 13 keys
    d = rng.standard_normal(q.shape).astype(np.float32)
    allowed = np.arange(13)[None, :] <= np.arange(9)[:, None] + 4  # lower-right causal
    want = numpy_attention_gradients(q, k, v, d, 0.5, allowed)
    for name in [x["name"] for x in backward_variants() if x["capabilities"]["exact"]]:
        got = attnbench.reference_backward(name, q, k, v, d, causal_lower_right=True, scale=0.5)
        err = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
        check(all(g.dtype == np.float64 and g.shape == w.shape for g, w in zip(got, want)) and err < 1e-12,
              "reference_backward(%s): float64, equal to numpy's fp64 attention gradient (GQA, lower-right causal) "
              "to %.1e < 1e-12" % (name, err))
        check(bitwise_equal(attnbench.reference(q, k, v, causal=True, variant=name), attnbench.reference(q, k, v, causal=True)),
              "reference(variant=%s), an exact variant's definition, is reference()" % name)
    # Each variant's fp32 gradients against its own definition: backward(compare=True)'s grad_accuracy is the
    # distance to reference_backward(), and approximate variants' definitions are not exact attention's.
    for x in backward_variants():
        name, opts = x["name"], {"causal": True} if x["capabilities"]["causal"] else {}
        opts.update(recurrence_kwargs(x["capabilities"], q[:, :2], rng))  # a recurrence's g / beta
        # At 9 tokens the sparse patterns' defaults cover every pair (their definition is exact attention
        # there): a narrow window and small blocks make it their own.
        small = {"sliding_window": {"window": 2}, "bigbird": {"block": 2, "window_blocks": 1, "global_blocks": 1,
                                                              "random_blocks": 1}}
        if name in small:
            opts["params"] = small[name]
        args = (q[:, :2], k[:, :2, :9], v[:, :2, :9], d[:, :2])  # multi-head self-attention: every variant's
        got = attnbench.backward(name, *args, compare=True, **opts)
        ref = attnbench.reference_backward(name, *args, **opts)
        errs = [float(np.abs(g.astype(np.float64) - r).max()) for g, r in zip(got[:3], ref)]
        metric = [got[-1]["grad_accuracy"][n]["max_abs_err"] for n in ("dq", "dk", "dv")]
        check(errs == metric, "%s: backward(compare=True)'s grad_accuracy max_abs_err is the distance to "
                              "reference_backward() (%s)" % (name, errs))
        exact = x["capabilities"]["exact"]
        differs = not np.array_equal(attnbench.reference(*args[:3], variant=name, **opts),
                                     attnbench.reference(*args[:3], causal=opts.get("causal", False)))
        check(exact or differs, "%s: reference(variant=) is its own definition (%s)" %
              (name, "exact attention" if exact else "not exact attention's"))


def autograd_without_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.path.insert(0, sys.argv[1]); import attnbench; "
            "import attnbench.autograd as ag; print('imported', ag.attention_function is attnbench.attention_function)\n"
            "try:\n    ag.Attention\nexcept ImportError as e:\n    print('ImportError on use')")
    r = subprocess.run([sys.executable, "-c", code, MODULE_DIR], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and r.stdout.split("\n")[:2] == ["imported True", "ImportError on use"],
          "without torch: attnbench and attnbench.autograd import; the Function needs torch only when used (%s%s)"
          % (r.stdout.strip(), r.stderr.strip()[-200:]))


def autograd_recurrence(name, caps, gen):
    """A recurrence through the Function: g, beta and the initial state are differentiable tensors too."""
    rng = np.random.default_rng(21)
    B, H, HKV, L, D = 1, 4, 2, 37, 8
    kv = HKV if caps["gqa"] else H
    q = torch.randn(B, H, L, D, generator=gen, requires_grad=True)
    k, v = (torch.randn(B, kv, L, D, generator=gen, requires_grad=True) for _ in range(2))
    d = torch.randn(B, H, L, D, generator=gen)
    kw = recurrence_kwargs(caps, q.detach().numpy(), rng)
    extra = {key: torch.from_numpy(val).requires_grad_() for key, val in kw.items() if key in RECURRENCE_INPUTS}
    if caps["state"]:
        extra["initial_state"] = (0.1 * torch.randn(B, H, D, D, generator=gen)).requires_grad_()
    opts = {key: val for key, val in kw.items() if key not in RECURRENCE_INPUTS}
    o = attention_function_of()(name, q, k, v, **opts, **extra)
    o.backward(d)
    arrays = [t.detach().numpy() for t in (q, k, v)]
    np_extra = {key: t.detach().numpy() for key, t in extra.items()}
    want_o = attnbench.forward(name, *arrays, **opts, **np_extra)
    want = attnbench.backward(name, *arrays, d.numpy(), **opts, **np_extra)
    got = [t.grad.numpy() for t in (q, k, v)] + [extra[key].grad.numpy() for key in RECURRENCE_INPUTS if key in extra]
    check(len(got) == len(want) and bitwise_equal(o.detach().numpy(), want_o) and
          all(bitwise_equal(a, b) for a, b in zip(got, want)),
          "%s: the float32 Function's O and dQ, dK, dV, %s equal forward() and backward() bitwise"
          % (name, ", ".join("d" + key for key in extra)))
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    extra64 = {key: t.detach().double().requires_grad_() for key, t in extra.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # float64 copies of float32 values are exact: no warning expected anyway
        attention_function_of()(name, *leaves64, **opts, **extra64).backward(d.double())
    pairs = list(zip(got, leaves64 + [extra64[key] for key in RECURRENCE_INPUTS if key in extra64]))
    rel = max(float(np.linalg.norm(a - b.grad.numpy()) / np.linalg.norm(b.grad.numpy())) for a, b in pairs)
    check(rel < 1e-5, "%s: the float32 gradients (with %s) agree with the float64 path's (its fp64 definition): "
                      "relative L2 error %.2e < 1e-5" % (name, ", ".join("d" + key for key in extra), rel))


def attention_function_of():
    from attnbench.autograd import attention_function
    return attention_function


def autograd_gradcheck_extra_inputs(gen):
    """gradcheck in float64 through the extra differentiable inputs: gated_delta_rule's g, beta and initial
    state, naive's sink logits under soft-capping (values and steps exact in float32)."""
    fn_of = attention_function_of()
    q, k, v = ((torch.randint(-32, 32, (1, 2, 6, 4), generator=gen) / 32.0).double().requires_grad_()
               for _ in range(3))
    gate = (-torch.randint(0, 32, (1, 2, 6), generator=gen) / 32.0).double().requires_grad_()
    beta = (torch.randint(8, 32, (1, 2, 6), generator=gen) / 32.0).double().requires_grad_()
    s0 = (torch.randint(-8, 8, (1, 2, 4, 4), generator=gen) / 32.0).double().requires_grad_()
    sinks = (torch.randint(-32, 32, (2,), generator=gen) / 32.0).double().requires_grad_()
    for label, fn, inputs in [
            ("gated_delta_rule: q, k, v, g, beta, initial_state",
             lambda a, b, c, x, y, z: fn_of("gated_delta_rule", a, b, c, causal=True, g=x, beta=y, initial_state=z),
             (q, k, v, gate, beta, s0)),
            ("naive with softcap 2: q, k, v, sink_logits",
             lambda a, b, c, x: fn_of("naive", a, b, c, causal=True, softcap=2.0, sink_logits=x),
             (q, k, v, sinks))]:
        try:
            ok, why = torch.autograd.gradcheck(fn, inputs, eps=2 ** -10), ""
        except Exception as e:
            ok, why = False, str(e)[:300]
        check(ok, "%s: torch.autograd.gradcheck in float64 passes (eps 2^-10) %s" % (label, why))


def autograd_function():
    if torch is None:
        print("SKIP  attnbench.autograd: torch is not importable (python3-torch)")
        return
    from attnbench.autograd import Attention, attention_function
    check(issubclass(Attention, torch.autograd.Function) and "fp64 definition" in Attention.__doc__,
          "attnbench.autograd.Attention is a torch.autograd.Function whose doc names the fp64 definition")
    g = torch.Generator().manual_seed(7)
    B, H, HKV, L, D = 2, 4, 2, 11, 8
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[1, -3:] = True
    cases = [("plain", {}), ("causal + padding", {"causal": True, "key_padding": pad}),
             ("dropout", {"dropout": 0.2, "seed": 3})]
    # float32: the Function's O and gradients are forward()'s and backward()'s, bit for bit; against the float64
    # path (the fp64 definition on the same values) within the fp32 tolerance: relative L2 error < 1e-5 for the
    # exact variants, < 1e-3 for the approximate ones (their definitions' fp32 errors grow with the
    # projections and iterations; the registry's grad_tolerance bounds them per problem).
    for x in backward_variants():
        name, caps = x["name"], x["capabilities"]
        if is_recurrence(x):
            autograd_recurrence(name, caps, g)
            continue
        for label, opts in cases:
            if ("causal" in opts and not caps["causal"]) or ("key_padding" in opts and not caps["key_padding"]) or \
                    ("dropout" in opts and not caps["dropout"]):
                continue
            kv = HKV if caps["gqa"] else H
            q = torch.randn(B, H, L, D, generator=g, requires_grad=True)
            k, v = (torch.randn(B, kv, L, D, generator=g, requires_grad=True) for _ in range(2))
            d = torch.randn(B, H, L, D, generator=g)
            try:
                o = attention_function(name, q, k, v, **opts)
            except attnbench.NotSupported as e:  # e.g. a recurrence given no causal mask
                print("SKIP  %s %s: %s" % (name, label, e))
                continue
            o.backward(d)
            arrays = [t.detach().numpy() for t in (q, k, v)]
            want_o = attnbench.forward(name, *arrays, **opts)
            want = attnbench.backward(name, *arrays, d.numpy(), **opts)
            got = [t.grad.numpy() for t in (q, k, v)]
            check(bitwise_equal(o.detach().numpy(), want_o) and all(bitwise_equal(a, b) for a, b in zip(got, want)),
                  "%s %s (K/V heads %d): the float32 Function's O and dQ, dK, dV equal forward() and backward() "
                  "bitwise" % (name, label, kv))
            q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
            attention_function(name, q64, k64, v64, **opts).backward(d.double())
            rel = max(float(np.linalg.norm(a - b.grad.numpy()) / np.linalg.norm(b.grad.numpy()))
                      for a, b in zip(got, (q64, k64, v64)))
            bound = 1e-5 if caps["exact"] else 1e-3
            check(rel < bound, "%s %s: the float32 gradients agree with the float64 path's (the fp64 definition): "
                               "relative L2 error %.2e < %g" % (name, label, rel, bound))
    # float64: gradcheck of the fp64 definition for the exact variants with a backward, on inputs and steps exact
    # in float32 (multiples of 2^-5, eps 2^-10).
    exact = [x["name"] for x in backward_variants() if x["capabilities"]["exact"]]
    pad5 = torch.zeros(2, 5, dtype=torch.bool)
    pad5[1, 3:] = True
    for name in [n for n in ("naive", "tiled") if n in exact] or exact[:1]:
        for label, opts, kv in [("plain", {}, 2), ("causal", {"causal": True}, 2),
                                ("padding + causal_lower_right", {"key_padding": pad5, "causal_lower_right": True}, 2),
                                ("GQA (2 heads, 1 K/V head)", {"causal": True}, 1),
                                ("dropout", {"dropout": 0.3, "seed": 11}, 2)]:
            q = (torch.randint(-64, 64, (2, 2, 4, 3), generator=g) / 32.0).double().requires_grad_()
            k, v = ((torch.randint(-64, 64, (2, kv, 5, 3), generator=g) / 32.0).double().requires_grad_()
                    for _ in range(2))
            fn = lambda a, b, c: attention_function(name, a, b, c, **opts)
            try:
                ok = torch.autograd.gradcheck(fn, (q, k, v), eps=2 ** -10)  # default atol 1e-5, rtol 1e-3
                why = ""
            except Exception as e:  # gradcheck raises GradcheckError with the mismatching Jacobians
                ok, why = False, str(e)[:300]
            check(ok, "%s %s: torch.autograd.gradcheck in float64 passes (eps 2^-10) %s"
                  % (name, label, why))
    autograd_gradcheck_extra_inputs(g)
    q = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attention_function("naive", q, q, q)
    check(any("not exact in float32" in str(w.message) for w in caught),
          "float64 inputs not exact in float32: a RuntimeWarning says the definition reads them rounded")
    e = raises(lambda: attention_function("naive", q.float(), q, q))
    check(e is not None and "the same for all three" in str(e), "mixed float32 / float64 inputs: ValueError (%s)" % e)
    e = raises(lambda: attention_function("naive", q, q, q, window=3), TypeError)
    check(e is not None and "window" in str(e), "an unknown option: TypeError naming it (%s)" % e)


def backward_releases_gil():
    rng = np.random.default_rng(4)
    q, k, v, d = (rng.standard_normal((1, 4, 256, 32)).astype(np.float32) for _ in range(4))
    name = [x for x in backward_variants() if not is_recurrence(x)][0]["name"]
    state = {"count": 0, "stop": False}
    started = threading.Event()

    def counter():
        started.set()
        while not state["stop"]:
            state["count"] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    worker = threading.Thread(target=counter)
    worker.start()
    try:
        started.wait()
        # Calls repeated until the counter ran (on a busy machine one short call may end before the counter
        # thread is scheduled at all) for at most 0.8 s: under the 1 s switch interval a call that held the GIL
        # would leave the counter at 0 however often it ran.
        c0, t0, calls = state["count"], time.monotonic(), 0
        while state["count"] - c0 < 1000 and time.monotonic() - t0 < 0.8:
            attnbench.backward(name, q, k, v, d)
            calls += 1
        steps = state["count"] - c0
    finally:
        state["stop"] = True
        worker.join()
        sys.setswitchinterval(old)
    check(steps >= 1000, "backward() releases the GIL: the counter made %d steps during %d calls (>= 1000)" %
          (steps, calls))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True)
    exe = ap.parse_args().attnbench
    with tempfile.TemporaryDirectory(prefix="attn_module_") as tmp:
        api_and_docs(exe)
        cli_equivalence(exe, tmp)
        torch_tensors(tmp)
        layouts_and_dtypes()
        bad_inputs(exe, tmp)
        reference_oracle()
        softcap_and_sinks()
        value_dim()
        recurrence_decode()
        backward_cli_equivalence(exe, tmp)
        bad_backward_inputs(exe, tmp)
        reference_gradients()
        autograd_without_torch()
        autograd_function()
        backward_releases_gil()
        sweep(exe, tmp)
        interrupt(tmp)
        gil_released()
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
