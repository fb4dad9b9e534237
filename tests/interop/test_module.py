#!/usr/bin/python3
"""The Python module (`import attnbench`, bench/python) against the CLI it shares its code with: variants() and
info() are `list --json` and `info --json`; forward() equals `attnbench eval` bitwise for every registered
variant (no mask and causal, then each option the variant's capabilities allow) on the same .npy inputs, and its
errors carry eval's messages with the argument named instead of the file; torch tensors, non-contiguous,
offset and float64 inputs give the float32 C-contiguous result (and float32 ones are read without a copy);
reference() is the fp64 oracle; run() gives `attnbench run`'s rows but for the timing fields, stops on SIGINT
after the current point with KeyboardInterrupt and Python's handler back, and resume=True finishes; the GIL is
released while a kernel runs.

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
                 "interference", "attempts", "noisy", "memory", "calibration", "rope_ms"}
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
    check(set(v) == {"name", "description", "capabilities", "saved_state", "params"} and
          all(set(p) >= {"name", "type", "default", "help"} for x in attnbench.variants() for p in x["params"]),
          "each variant: name, description, capabilities, saved_state, params (name, type, default, help)")
    check(attnbench.info() == json.loads(cli(exe, "info", "--json").stdout), "info() is `attnbench info --json`")
    for name in ("variants", "info", "forward", "reference", "run", "load_results"):
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
        for name in ("q", "k", "v", "mask", "key_padding", "slopes"):
            np.save(self.path(name), getattr(self, name))

    def path(self, name):
        return os.path.join(self.tmp, name + ".npy")


def eval_case(exe, inputs, variant, label, **options):
    """forward(variant, ..., **options) and `attnbench eval` with the matching options: bitwise equal outputs,
    or the same refusal (the module's message is the CLI's)."""
    args = ["eval", "--variant", variant, "--q", inputs.path("q"), "--k", inputs.path("k"), "--v",
            inputs.path("v"), "--out", inputs.path("out")]
    kwargs = {}
    for key, value in options.items():
        if key in ("mask", "key_padding"):
            args += ["--" + key.replace("_", "-"), inputs.path(key)]
            kwargs[key] = getattr(inputs, key)
        elif key == "alibi_slopes":
            args += ["--alibi-slopes", inputs.path("slopes")]
            kwargs[key] = inputs.slopes
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
        eval_case(exe, mha, name, "no mask")
        eval_case(exe, mha, name, "causal", causal=True)  # refused alike where the variant has no causal
        if caps["causal_lower_right"]:
            eval_case(exe, cross if caps["cross"] else mha, name, "causal_lower_right", causal_lower_right=True)
        if caps["boolean_mask"]:
            eval_case(exe, mha, name, "mask", mask=True)
        if caps["key_padding"]:
            eval_case(exe, mha, name, "key_padding + causal", key_padding=True, causal=True)
        if caps["dropout"]:
            eval_case(exe, mha, name, "dropout", dropout=0.25, seed=5)
        if caps["gqa"]:
            eval_case(exe, gqa, name, "grouped-query causal", causal=True)
        if caps["cross"]:
            eval_case(exe, cross, name, "cross-attention", scale=0.3)
        for dtype in ("bf16", "fp16"):
            eval_case(exe, mha, name, "dtype " + dtype, dtype=dtype)  # refused alike where not taken
        eval_case(exe, mha, name, "alibi with slopes", alibi=True, alibi_slopes=True)
        eval_case(exe, mha, name, "threads 1", threads=1)
        eval_case(exe, mha, name, "isa " + supported[-1], isa=supported[-1])
        int_params = [p for p in v["params"] if p["type"] == "integer"]
        if int_params:
            p = int_params[0]
            eval_case(exe, mha, name, "params %s=3" % p["name"], params={p["name"]: 3})


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


def layouts_and_dtypes():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 19, 20)).astype(np.float32) for _ in range(3))
    # The recurrences (gate / beta / state) take no g / beta from forward() yet (issue 32's keyword arguments
    # are a next step); their layouts are the same code path as every other variant's.
    recurrence = lambda c: c["state"] or c["gate"] != "none" or c["beta"]
    for variant in [x["name"] for x in attnbench.variants() if not recurrence(x["capabilities"])]:
        want = attnbench.forward(variant, q, k, v)
        transposed = np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # same values
        fortran = np.asfortranarray(k)
        buf = np.empty(v.size + 1, np.float32)[1:]  # C-contiguous, 4 bytes past an aligned start
        buf[:] = v.ravel()
        offset = buf.reshape(v.shape)
        check(not transposed.flags.c_contiguous and not fortran.flags.c_contiguous and offset.flags.c_contiguous,
              "%s: the views are what they should be" % variant)
        got = attnbench.forward(variant, transposed, fortran, offset)
        check(bitwise_equal(got, want), "%s: transposed, Fortran-ordered and offset inputs: the same output" % variant)
        got = attnbench.forward(variant, q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
        check(bitwise_equal(got, want), "%s: float64 inputs: the same output as float32 (converted)" % variant)
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
        ("v unlike k", fwd(v=v[:, :, :5]), "v: shape [1, 4, 5, 16] differs from k"),
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
        sweep(exe, tmp)
        interrupt(tmp)
        gil_released()
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
