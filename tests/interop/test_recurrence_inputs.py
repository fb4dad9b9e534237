#!/usr/bin/python3
"""A recurrence's inputs beyond Q, K, V: the gate g, beta, an initial state and the final state, through
`attnbench eval --g --beta --initial-state --final-state [--grad-output ... --dg --dbeta --d-initial-state]
--compare` and the Python module's keyword arguments (forward / backward / reference / reference_backward with
g=, beta=, initial_state=, return_final_state=True), against an fp64 recurrence written out here in numpy from
the definitions (independent of common/recurrence*.cpp):

    simple_gla        S_t = exp(g_t) S_{t-1} + k_tᵀ v_t                       g [batch, heads, seq]
    gla               S_t = diag(exp(g_t)) S_{t-1} + k_tᵀ v_t                 g [batch, heads, seq, d_k]
    delta_rule        S_t = S_{t-1} + β_t k_tᵀ (v_t − k_t S_{t-1})            keys L2-normalised
    gated_delta_rule  S_t = exp(g_t) S_{t-1} + β_t k_tᵀ (v_t − exp(g_t) k_t S_{t-1})
    retention         S_t = γ_h S_{t-1} + k_tᵀ v_t, γ_h = 1 − 2^(−5−h)
    o_t = scale · q_t S_t, S_0 = the initial state or 0

Tolerance: relative L2 error <= 1e-5 for the fp32 output and final state against fp64. Why that bound holds with
room: u = 2^-24 ≈ 6e-8 is fp32's unit roundoff. One token's update adds a rank-one term to S and reads a
d-term dot product per output element; the chunk form adds a C-term sum per element inside a chunk. Under the
probabilistic rounding model (Higham & Mary, SIAM J. Sci. Comput. 2019: an m-term sum's relative error grows as
about sqrt(m)·u rather than m·u) the local error of a step is about sqrt(d + C + 8)·u ≈ 6·u ≈ 4e-7 here
(d = 16, C = 16). The state carries earlier steps' errors, multiplied by the decay each step: with g =
logsigmoid(N(0, 1)) the mean decay E[sigmoid(z)] = 0.5, so the carried error is a geometric sum of about twice the
local one; the delta rule's transition (I − β k kᵀ, unit keys, β in (0, 1]) is a contraction, and retention's
γ_h <= 1 − 2^-5 makes the sum at most 32 terms deep, each error independent, so about sqrt(32)·4e-7 ≈ 2e-6. So the
expected relative L2 error is of order 1e-6, and 1e-5 leaves a margin of 5 to 10 (the measured values are
printed). The fp64 definitions agree with numpy's to 1e-12 (both double, different summation orders), and the
fp64 gradients with numpy's central differences to 1e-6 (step 1e-6: truncation ~1e-12, cancellation
~1e-16/1e-6 = 1e-10, relative to gradients of order 1).

Run by ctest as `/usr/bin/python3 test_recurrence_inputs.py --attnbench PATH`; the module's checks need
ATTNBENCH_PYTHON_DIR (set where the module is built) and are skipped without it. Exit 0 pass, 1 fail, 77 skip (no
numpy)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError as e:
    print("SKIP: %s (for %s)" % (e, sys.executable))
    sys.exit(77)

attnbench = None
MODULE_DIR = os.environ.get("ATTNBENCH_PYTHON_DIR")
if MODULE_DIR:
    sys.path.insert(0, MODULE_DIR)
    import attnbench  # noqa: E402

FAILURES = []
TOL = 1e-5  # the fp32 bound derived above


def check(ok, what):
    print(("PASS  " if ok else "FAIL  ") + what)
    if not ok:
        FAILURES.append(what)
    return ok


def cli(exe, *args, timeout=300):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def rel_l2(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def bitwise_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# What each variant reads: its gate's shape ("scalar" [B, H, n], "vector" [B, H, n, d], None) and beta.
VARIANTS = {
    "simple_gla": ("scalar", False),
    "gla": ("vector", False),
    "delta_rule": (None, True),
    "gated_delta_rule": ("scalar", True),
    "retention": (None, False),
    "kda": ("vector", True),
}


def numpy_recurrence(variant, q, k, v, g=None, beta=None, s0=None, scale=None):
    """The fp64 definition token by token, vectorised over (batch, query head). Returns (O, final state)."""
    gate, delta = VARIANTS[variant]
    B, H, n, d = q.shape
    group = H // k.shape[1]
    q = q.astype(np.float64)
    k = np.repeat(k, group, axis=1).astype(np.float64)  # query head h reads K/V head h // group
    v = np.repeat(v, group, axis=1).astype(np.float64)
    if delta:  # keys L2-normalised per token (a zero key stays zero)
        norm = np.linalg.norm(k, axis=-1, keepdims=True)
        k = np.where(norm > 0, k / np.where(norm > 0, norm, 1), 0)
    scale = 1 / np.sqrt(d) if scale is None else scale
    S = np.zeros((B, H, d, d)) if s0 is None else s0.astype(np.float64).copy()
    out = np.zeros((B, H, n, d))
    gamma = 1 - 2.0 ** (-5 - np.arange(H))
    for t in range(n):
        kt, vt = k[:, :, t], v[:, :, t]
        if gate == "scalar":
            S = np.exp(g[:, :, t].astype(np.float64))[:, :, None, None] * S
        elif gate == "vector":
            S = np.exp(g[:, :, t].astype(np.float64))[:, :, :, None] * S  # diag(exp(g_t)) S: one per key row
        elif variant == "retention":
            S = gamma[None, :, None, None] * S
        if delta:
            u = beta[:, :, t].astype(np.float64)[:, :, None] * (vt - np.einsum("bhi,bhij->bhj", kt, S))
        else:
            u = vt
        S = S + kt[:, :, :, None] * u[:, :, None, :]
        out[:, :, t] = scale * np.einsum("bhi,bhij->bhj", q[:, :, t], S)
    return out, S


def make_inputs(rng, variant, B, H, HKV, n, d):
    gate, delta = VARIANTS[variant]
    x = {"q": rng.standard_normal((B, H, n, d)).astype(np.float32),
         "k": rng.standard_normal((B, HKV, n, d)).astype(np.float32),
         "v": rng.standard_normal((B, HKV, n, d)).astype(np.float32),
         "initial_state": (0.5 * rng.standard_normal((B, H, d, d))).astype(np.float32)}
    if gate:  # g = logsigmoid(N(0, 1)), the sweep's default
        z = rng.standard_normal((B, H, n) if gate == "scalar" else (B, H, n, d))
        x["g"] = (-np.log1p(np.exp(-z))).astype(np.float32)
    if delta:  # beta = sigmoid(N(0, 1))
        x["beta"] = (1 / (1 + np.exp(-rng.standard_normal((B, H, n))))).astype(np.float32)
    return x


def save(tmp, name, x):
    path = os.path.join(tmp, name + ".npy")
    np.save(path, x)
    return path


def extra_kwargs(x, with_state=True):
    return {key: x[key] for key in ("g", "beta", "initial_state") if key in x and (with_state or key != "initial_state")}


def eval_forward(exe, tmp, variant, x, params, with_state=True):
    """eval --compare with the variant's inputs: (O, final state, the JSON it printed) or None (with the failure)."""
    paths = {key: save(tmp, key, val) for key, val in x.items()}
    out, fin = os.path.join(tmp, "out.npy"), os.path.join(tmp, "final.npy")
    args = ["eval", "--variant", variant, "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--causal",
            "--out", out, "--final-state", fin, "--compare"]
    for key, flag in (("g", "--g"), ("beta", "--beta"), ("initial_state", "--initial-state")):
        if key in x and (with_state or key != "initial_state"):
            args += [flag, paths[key]]
    for name, value in params.items():
        args += ["--param", "%s=%s" % (name, value)]
    r = cli(exe, *args)
    if not check(r.returncode == 0, "eval %s %s runs (%s)" % (variant, params, r.stderr.strip()[-200:])):
        return None
    return np.load(out), np.load(fin), json.loads(r.stdout)


def forward_against_numpy(exe, tmp):
    rng = np.random.default_rng(32)
    # n = 77: chunks of 16 leave an uneven last chunk of 13; grouped-query heads (4 query heads, 2 K/V heads).
    B, H, HKV, n, d = 2, 4, 2, 77, 16
    for variant in VARIANTS:
        x = make_inputs(rng, variant, B, H, HKV, n, d)
        for with_state in (True, False):
            want_o, want_s = numpy_recurrence(variant, x["q"], x["k"], x["v"], x.get("g"), x.get("beta"),
                                              x["initial_state"] if with_state else None)
            for form in ("chunk", "recurrent"):
                params = {"form": form, "chunk": 16}
                label = "%s form=%s %s" % (variant, form, "S0 given" if with_state else "S0 = 0")
                got = eval_forward(exe, tmp, variant, x, params, with_state)
                if got is None:
                    continue
                o, s, j = got
                eo, es = rel_l2(o, want_o), rel_l2(s, want_s)
                check(eo <= TOL and es <= TOL and s.dtype == np.float32 and s.shape == (B, H, d, d),
                      "%s: eval's O and final state [B, H, d, d] float32 against numpy's fp64 recurrence: rel L2 "
                      "%.2e, %.2e <= %g" % (label, eo, es, TOL))
                ja, jf = j["accuracy"]["rel_l2_err"], j["final_state_accuracy"]["rel_l2_err"]
                # --compare's errors are against the C++ fp64 definition: the same as against numpy's to 1e-12.
                check(abs(ja - eo) <= 1e-12 and abs(jf - es) <= 1e-12 and variant in j["accuracy"]["reference"]
                      and "accuracy_vs_softmax" in j and j["rel_l2_err"] == ja,
                      "%s: --compare's accuracy is against the variant's own fp64 definition (%.3e vs numpy %.3e; "
                      "final state %.3e vs %.3e)" % (label, ja, eo, jf, es))
                if attnbench is None:
                    continue
                kw = extra_kwargs(x, with_state)
                mo, ms = attnbench.forward(variant, x["q"], x["k"], x["v"], causal=True, params=params,
                                           return_final_state=True, **kw)
                check(bitwise_equal(mo, o) and bitwise_equal(ms, s),
                      "%s: forward(g=, beta=, initial_state=, return_final_state=True) equals eval bitwise" % label)
                ro, rs = attnbench.reference(x["q"], x["k"], x["v"], causal=True, variant=variant, params=params,
                                             return_final_state=True, **kw)
                check(rel_l2(ro, want_o) <= 1e-12 and rel_l2(rs, want_s) <= 1e-12 and rs.dtype == np.float64,
                      "%s: reference(variant=, return_final_state=True) is numpy's fp64 recurrence to 1e-12 "
                      "(%.1e, %.1e)" % (label, rel_l2(ro, want_o), rel_l2(rs, want_s)))


def numeric_derivative(variant, x, key, index, d_out, h=1e-6):
    """Central difference of L = sum(d_out * O) in x[key][index] through numpy's fp64 recurrence."""
    def loss(delta):
        y = {k: v.astype(np.float64) for k, v in x.items()}
        y[key][index] += delta
        o, _ = numpy_recurrence(variant, y["q"], y["k"], y["v"], y.get("g"), y.get("beta"), y["initial_state"])
        return float((d_out.astype(np.float64) * o).sum())
    return (loss(h) - loss(-h)) / (2 * h)


def backward_against_numpy(exe, tmp):
    if attnbench is None:
        print("SKIP  the module's backward with g / beta / initial_state: ATTNBENCH_PYTHON_DIR is not set")
        return
    rng = np.random.default_rng(27)
    B, H, HKV, n, d = 1, 2, 2, 21, 8
    for variant in ("simple_gla", "gla", "gated_delta_rule", "delta_rule"):
        x = make_inputs(rng, variant, B, H, HKV, n, d)
        d_out = rng.standard_normal(x["q"].shape).astype(np.float32)
        kw = extra_kwargs(x)
        names = [k for k in ("g", "beta", "initial_state") if k in x]
        params = {"chunk": 8}
        got = attnbench.backward(variant, x["q"], x["k"], x["v"], d_out, causal=True, params=params, compare=True,
                                 **kw)
        ref = attnbench.reference_backward(variant, x["q"], x["k"], x["v"], d_out, causal=True, params=params, **kw)
        check(len(got) == 3 + len(names) + 1 and len(ref) == 3 + len(names),
              "%s: backward returns dq, dk, dv, then the gradients of %s, then the metrics; reference_backward "
              "the same in fp64" % (variant, ", ".join(names)))
        metrics = got[-1]["grad_accuracy"]
        for i, name in enumerate(["q", "k", "v"] + names):
            g32, g64 = got[i], ref[i]
            grad = {"initial_state": "d_initial_state"}.get(name, "d" + name)
            shape_ok = g32.shape == (x[name].shape if name in x else x["q"].shape) and g64.dtype == np.float64
            err = rel_l2(g32, g64)
            check(shape_ok and err <= TOL, "%s: %s of backward() against reference_backward(): rel L2 %.2e <= %g"
                  % (variant, grad, err, TOL))
            if name in names:
                key = {"g": "dg", "beta": "dbeta", "initial_state": "d_initial_state"}[name]
                check(key in metrics and metrics[key]["max_abs_err"] == float(np.abs(g32.astype(np.float64) - g64).max()),
                      "%s: backward(compare=True)'s grad_accuracy.%s is the distance to reference_backward()'s"
                      % (variant, key))
                # The fp64 gradient against numpy's central differences, at a few elements.
                flat = rng.choice(x[name].size, 3, replace=False)
                worst = 0.0
                for e in flat:
                    index = np.unravel_index(e, x[name].shape)
                    num = numeric_derivative(variant, x, name, index, d_out)
                    worst = max(worst, abs(num - g64[index]) / max(1.0, abs(num)))
                check(worst <= 1e-6, "%s: reference_backward()'s %s against numpy's central differences of the "
                                     "fp64 recurrence: %.1e <= 1e-6" % (variant, grad, worst))
        # eval --grad-output with --dg / --dbeta / --d-initial-state: the module's gradients bitwise.
        paths = {key: save(tmp, key, val) for key, val in x.items()}
        paths["d_out"] = save(tmp, "d_out", d_out)
        outs = {n: os.path.join(tmp, "grad_" + n + ".npy") for n in ["dq", "dk", "dv"] + ["d" + m for m in names]}
        flags = {"dg": "--dg", "dbeta": "--dbeta", "dinitial_state": "--d-initial-state"}
        args = ["eval", "--variant", variant, "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--causal",
                "--param", "chunk=8", "--out", os.path.join(tmp, "o.npy"), "--grad-output", paths["d_out"],
                "--dq", outs["dq"], "--dk", outs["dk"], "--dv", outs["dv"], "--compare"]
        for m in names:
            args += [{"g": "--g", "beta": "--beta", "initial_state": "--initial-state"}[m], paths[m],
                     flags["d" + m], outs["d" + m]]
        r = cli(exe, *args)
        if check(r.returncode == 0, "%s: eval --grad-output with %s runs (%s)" % (variant, names, r.stderr[-200:])):
            same = all(bitwise_equal(np.load(outs[n]), got[i]) for i, n in enumerate(outs))
            j = json.loads(r.stdout)
            check(same and j["grad_accuracy"] == got[-1]["grad_accuracy"],
                  "%s: eval's dq, dk, dv and the gradients of %s equal backward()'s bitwise, and its grad_accuracy "
                  "is backward()'s" % (variant, ", ".join(names)))


def refusals(exe, tmp):
    """The module's ValueError carries eval's message, the argument named instead of the option and file."""
    if attnbench is None:
        print("SKIP  the module's refusals: ATTNBENCH_PYTHON_DIR is not set")
        return
    rng = np.random.default_rng(5)
    x = make_inputs(rng, "gated_delta_rule", 1, 2, 2, 6, 8)
    gv = make_inputs(rng, "gla", 1, 2, 2, 6, 8)["g"]
    g_pos = x["g"].copy()
    g_pos[0, 1, 3] = 0.25
    beta_nan = x["beta"].copy()
    beta_nan[0, 0, 4] = np.nan
    cases = [  # (variant, module kwargs, eval arguments as (flag, name, array))
        ("naive", {"g": x["g"]}, [("--g", "g", x["g"])]),
        ("delta_rule", {"g": x["g"], "beta": x["beta"]}, [("--g", "g", x["g"]), ("--beta", "beta", x["beta"])]),
        ("simple_gla", {"g": x["g"], "beta": x["beta"]}, [("--g", "g", x["g"]), ("--beta", "beta", x["beta"])]),
        ("tiled", {"initial_state": x["initial_state"]}, [("--initial-state", "initial_state", x["initial_state"])]),
        ("gla", {}, []),
        ("gated_delta_rule", {"g": x["g"]}, [("--g", "g", x["g"])]),
        ("gla", {"g": x["g"]}, [("--g", "g", x["g"])]),
        ("simple_gla", {"g": gv}, [("--g", "g", gv)]),
        ("simple_gla", {"g": g_pos}, [("--g", "g", g_pos)]),
        ("gated_delta_rule", {"g": x["g"], "beta": beta_nan}, [("--g", "g", x["g"]), ("--beta", "beta", beta_nan)]),
        ("simple_gla", {"g": x["g"], "initial_state": x["initial_state"][..., :7]},
         [("--g", "g", x["g"]), ("--initial-state", "initial_state", x["initial_state"][..., :7])]),
    ]
    qkv = [(n, save(tmp, "r_" + n, x[n])) for n in ("q", "k", "v")]
    for variant, kwargs, flags in cases:
        args = ["eval", "--variant", variant, "--causal", "--out", os.path.join(tmp, "r_out.npy")]
        for n, p in qkv:
            args += ["--" + n, p]
        message_map = [("from --q", "from q"), ("--g G.npy", "g="), ("--beta B.npy", "beta=")]
        for flag, name, arr in flags:
            p = save(tmp, "r_" + name, arr)
            args += [flag, p]
            message_map.append(("%s '%s'" % (flag, p), name))
        r = cli(exe, *args)
        message = r.stderr.strip().split(": ", 2)[-1]
        for a, b in message_map:
            message = message.replace(a, b)
        try:
            attnbench.forward(variant, x["q"], x["k"], x["v"], causal=True, **kwargs)
            e = None
        except ValueError as err:
            e = err
        check(r.returncode == 2 and e is not None and str(e) == message and not os.path.exists(args[5]),
              "%s with %s: eval exits 2, the module raises ValueError with its message (%s)"
              % (variant, sorted(kwargs) or "nothing", str(e)[:110]))
    e = None
    try:
        attnbench.reference(x["q"], x["k"], x["v"], causal=True, g=x["g"])
    except ValueError as err:
        e = err
    check(e is not None and str(e).startswith("g needs variant="), "reference(g=) without variant: ValueError (%s)" % e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True)
    exe = ap.parse_args().attnbench
    if attnbench is None:
        print("SKIP  the module's checks: ATTNBENCH_PYTHON_DIR is not set (no Python module in this build)")
    with tempfile.TemporaryDirectory(prefix="attn_recurrence_") as tmp:
        forward_against_numpy(exe, tmp)
        backward_against_numpy(exe, tmp)
        refusals(exe, tmp)
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
