#!/usr/bin/python3
"""Every default path over every variant (issue #39): each command a newcomer reaches without naming a variant
runs every registered variant (the built-ins and the suite's test plugin), so a variant that one of them cannot
handle fails here, naming the variant and the command, and not on a newcomer's machine.

For every variant:
  patterns   `attnbench patterns --mask auto` (what scripts/run draws) gives it a pattern, and the pattern is
             the weights it applies: weights @ V equals `attnbench eval` on the same Q, K, V (and g, beta);
  run        a tiny sweep of every variant, forward and forward + backward, unmasked and causal: no failed
             row, and an ok forward row (and an ok backward row where it has a backward);
  inputs     `attnbench inputs` writes that point's inputs (the sweep's own helper: g, beta, dO ...);
  gbench     attnbench_gbench (the Google Benchmark driver over the registry) on the tiny sweep: no errors;
  eval       `attnbench eval --compare` on them, and `--grad-output` with their dO: the accuracy equals the
             sweep row's, bit for bit (same inputs, kernel and reference);
and `attnbench run --dry-run` plans every sweep config shipped in configs/.

Run by ctest as `/usr/bin/python3 test_default_paths.py --attnbench PATH --plugin PLUGIN.so`.
`--expect-failure VARIANT` is the self-test: with a plugin whose variant needs an input no default supplies
(tests/plugins/plugin_needs_input.cpp), the test must report that variant, and only it, under each command.
Exit 0 pass, 1 fail, 77 skip (numpy missing)."""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Files in configs/ that are not sweep configs (no "sweep"): data the plotting scripts read. Keep it short.
NOT_SWEEPS = {"lra_table2.json": "LRA Table 2's published figures, read by scripts/plotlib/lra.py",
              "plot_styles.json": "the variants with pinned figure styles, read by scripts/plotlib/styles.py",
              "quality_families.json": "the feature-map variants of the quality models, read by bench/quality/models.py",
              "quality_published.json": "published task-quality figures, read by scripts/plotlib/quality.py",
              "quality.json": "a quality config (scripts/quality), planned by tests/interop/test_quality_harness.py",
              "quality_full.json": "a quality config (scripts/quality), planned by tests/interop/test_quality_harness.py",
              "mla.json": "MLA layer shapes for `attnbench mla --config`, checked by tests/test_mla.cpp"}
# Variants a default path may skip, with the reason. Empty: every variant reaches every default path.
MAY_SKIP = {}
N, HEADS, HEAD_DIM = 24, 2, 8  # patterns: N > head_dim, so the unit-vector probe takes several passes
U = 2.0 ** -24

failures = []  # (variant or "", command, message)


def fail(variant, command, message):
    failures.append((variant, command, message))
    print(f"FAIL  [{command}] {variant + ': ' if variant else ''}{message}")


def ok(variant, command, message):
    print(f"ok    [{command}] {variant + ': ' if variant else ''}{message}")


class Cli:
    def __init__(self, exe, plugins):
        self.exe, self.prefix = exe, [a for p in plugins for a in ("--plugin", p)]

    def __call__(self, *args, timeout=600):
        return subprocess.run([self.exe, *self.prefix, *args], capture_output=True, text=True, timeout=timeout)


def first_line(r):
    text = (r.stderr or r.stdout).strip().splitlines()
    return text[-1] if text else f"exit {r.returncode}, no output"


def eval_args(variant, params, causal, files, g=None, beta=None, index_q=None, index_k=None, index_w=None):
    args = ["eval", "--variant", variant, "--q", files["q"], "--k", files["k"], "--v", files["v"]]
    for flag, path in (("--index-q", index_q), ("--index-k", index_k), ("--index-w", index_w)):
        if path:  # a lightning indexer's inputs (dsa)
            args += [flag, path]
    for k, v in params.items():
        args += ["--param", f"{k}={v}"]
    if causal:
        args.append("--causal")
    if g:
        args += ["--g", g]
    if beta:
        args += ["--beta", beta]
    return args


def check_patterns(cli, variants, tmp):
    """patterns --mask auto: every variant drawn, and its weights are what eval applies to a random V."""
    import numpy as np
    out = os.path.join(tmp, "patterns")
    r = cli("patterns", "--seq", str(N), "--heads", str(HEADS), "--head-dim", str(HEAD_DIM), "--mask", "auto",
            "--seed", "11", "--out", out)
    if r.returncode not in (0, 1) or not os.path.isfile(os.path.join(out, "patterns.json")):
        return fail("", "patterns", f"exit {r.returncode}, no patterns.json: {first_line(r)}")
    with open(os.path.join(out, "patterns.json")) as f:
        entries = {e["name"]: e for e in json.load(f)["variants"]}
    v_rand = np.random.default_rng(5).standard_normal((1, HEADS, N, HEAD_DIM)).astype(np.float32)
    np.save(os.path.join(tmp, "v_rand.npy"), v_rand)
    files = {"q": os.path.join(out, "q.npy"), "k": os.path.join(out, "k.npy"), "v": os.path.join(tmp, "v_rand.npy")}
    for name in variants:
        e = entries.get(name)
        if e is None:
            fail(name, "patterns", "not in patterns.json")
            continue
        if e["status"] != "ok":
            if name in MAY_SKIP and e["status"] == "skipped":
                ok(name, "patterns", f"skipped on purpose: {MAY_SKIP[name]}")
            else:
                fail(name, "patterns", f"{e['status']}: {e.get('reason', '')}")
            continue
        w = np.load(os.path.join(out, e["file"])).astype(np.float64)
        ins = e.get("inputs", {})
        extra = {k: os.path.join(out, ins[k]["file"]) for k in ("g", "beta", "index_q", "index_k", "index_w")
                 if k in ins}
        o_path = os.path.join(tmp, f"patterns_{name}.npy")
        r = cli(*eval_args(name, e["params"], e["causal"], files, **extra), "--out", o_path)
        if r.returncode != 0:
            fail(name, "eval", f"on the patterns' inputs: exit {r.returncode}: {first_line(r)}")
            continue
        got = np.load(o_path).astype(np.float64)[0]
        want = np.einsum("hij,hjd->hid", w, v_rand[0].astype(np.float64))
        # Each weight carries fp32 rounding of order (N + d) u max|w| (the probe's forward), summed over N values
        # of size max|V|, plus eval's own forward of the same order: 4 N (N + d) u max|w| max|V| bounds both.
        tol = 4 * N * (N + HEAD_DIM) * U * max(1.0, abs(w).max()) * abs(v_rand).max()
        err = abs(got - want).max()
        if err <= tol:
            ok(name, "patterns", f"weights @ V == eval's output (max err {err:.1e} <= {tol:.1e})")
        else:
            fail(name, "patterns", f"weights @ V differs from eval's output by {err:.2e} > {tol:.1e}")


def tiny_config(tmp, variants):
    cfg = {"name": "default_paths", "variants": variants,
           "sweep": {"batch": 1, "heads": 2, "head_dim": 8, "seq_len": [17], "mask": ["none", "causal"],
                     "pass": ["forward", "forward_backward"], "threads": 1},
           "inputs": {"regime": "gaussian", "std": 1.0},
           "measure": {"warmup": 0, "min_reps": 1, "max_reps": 1, "min_time_s": 0, "max_time_s": 1,
                       "max_interference": 1, "calibrate_every": 0},
           "accuracy": {"reference": "full"}, "memory_budget": "1GiB", "seed": 3}
    path = os.path.join(tmp, "default_paths.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def check_run(cli, variants, caps, tmp):
    """A tiny sweep of every variant; returns {variant: {pass: an ok row}}."""
    config = tiny_config(tmp, variants)
    out = os.path.join(tmp, "run")
    r = cli("run", config, "--out", out, "--plain")
    if r.returncode not in (0, 1) or not os.path.isfile(os.path.join(out, "results.jsonl")):
        fail("", "run", f"exit {r.returncode}: {first_line(r)}")
        return {}, config, out
    rows = [json.loads(line) for line in open(os.path.join(out, "results.jsonl"))]
    picked = {}
    for name in variants:
        mine = [row for row in rows if row["variant"] == name]
        for row in mine:
            if row["status"] == "failed":
                fail(name, "run", f"{row['id']} failed: {row['reason']}")
        for pass_ in ("forward", "forward_backward"):
            if pass_ == "forward_backward" and not caps[name].get("backward"):
                continue
            good = [row for row in mine if row["pass"] == pass_ and row["status"] == "ok"]
            if good:
                picked.setdefault(name, {})[pass_] = good[-1]  # causal last: the one every causal-only variant has
                ok(name, "run", f"{pass_}: {len(good)} ok row(s)")
            elif name not in MAY_SKIP:
                reasons = sorted({row["reason"] for row in mine if row["pass"] == pass_})
                fail(name, "run", f"no ok {pass_} row ({'; '.join(reasons) or 'no row'})")
    return picked, config, out


def check_inputs_eval(cli, name, caps, row, config, tmp):
    """`inputs` of the row's point, then eval (and --grad-output) on them: the row's own accuracy, bit for bit."""
    import numpy as np
    d = os.path.join(tmp, "inputs", f"{name}-{row['pass']}")
    r = cli("inputs", config, "--filter", row["id"], "--out", d)
    if r.returncode != 0:
        return fail(name, "inputs", f"{row['id']}: exit {r.returncode}: {first_line(r)}")
    with open(os.path.join(d, "point.json")) as f:
        point = json.load(f)
    files = {k: os.path.join(d, v) for k, v in point["files"].items()}
    prob = point["problem"]
    unexpected = {k for k in ("key_padding", "sink_logits", "initial_state") if k in files}
    if unexpected or prob["causal_lower_right"] or prob["dtype"] != "fp32" or prob["softcap"] is not None:
        return fail(name, "inputs", f"the tiny point has inputs this test does not pass on: {sorted(unexpected)}")
    ok(name, "inputs", f"wrote {', '.join(sorted(point['files']))}")
    args = eval_args(name, point["params"], prob["causal"], files, files.get("g"), files.get("beta"),
                     files.get("index_q"), files.get("index_k"), files.get("index_w"))
    out = os.path.join(d, "o.npy")
    r = cli(*args, "--out", out, "--compare")
    if r.returncode != 0:
        return fail(name, "eval", f"exit {r.returncode}: {first_line(r)}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    o = np.load(out)
    shape = [prob["batch"], prob["heads"], prob["seq_q"], prob["v_head_dim"]]
    if list(o.shape) != shape or not np.isfinite(o).all():
        return fail(name, "eval", f"O is {list(o.shape)} (want {shape}), finite: {bool(np.isfinite(o).all())}")
    want, have = row["accuracy"]["max_abs_err"], got["accuracy"]["max_abs_err"]
    if have == want:
        ok(name, "eval", f"--compare max_abs_err {have:.3e} == the sweep row's")
    else:
        fail(name, "eval", f"--compare max_abs_err {have!r} != the sweep row's {want!r} on the same inputs")
    if row["pass"] != "forward_backward":
        return
    grads = {k: os.path.join(d, f"d{k}.npy") for k in ("q", "k", "v")}
    gargs = ["--grad-output", files["d_out"], "--dq", grads["q"], "--dk", grads["k"], "--dv", grads["v"]]
    for k in ("g", "beta"):
        if k in files:
            grads[k] = os.path.join(d, f"d{k}.npy")
            gargs += ["--dg" if k == "g" else "--dbeta", grads[k]]
    r = cli(*args, "--out", out, "--compare", *gargs)
    if r.returncode != 0:
        return fail(name, "eval --grad-output", f"exit {r.returncode}: {first_line(r)}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for k, path in grads.items():
        g = np.load(path)
        src = np.load(files[k])
        if g.shape != src.shape or not np.isfinite(g).all():
            fail(name, "eval --grad-output", f"d{k} is {g.shape} (want {src.shape}), finite: {np.isfinite(g).all()}")
    # The row's grad_accuracy is against exact attention's gradient, or an own_definition variant's own (the
    # recurrences); eval prints both: grad_accuracy (the variant's own definition) and grad_accuracy_exact.
    key = "grad_accuracy" if caps["exact"] or caps.get("own_definition") else "grad_accuracy_exact"
    want, have = row["grad_accuracy"]["dq"]["max_abs_err"], got[key]["dq"]["max_abs_err"]
    if have == want:
        ok(name, "eval --grad-output", f"dQ max_abs_err {have:.3e} == the sweep row's; {', '.join('d' + k for k in grads)} written")
    else:
        fail(name, "eval --grad-output", f"dQ max_abs_err {have!r} != the sweep row's {want!r} on the same inputs")


def check_gbench(gbench, plugins, variants, config):
    """The Google Benchmark driver over the tiny sweep: every variant's points run (one short iteration each),
    none reports an error."""
    args = [gbench, *[f"--plugin={p}" for p in plugins], f"--config={config}", "--benchmark_min_time=0.0001",
            "--benchmark_format=json"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return fail("", "attnbench_gbench", f"exit {r.returncode}: {first_line(r)}")
    benchmarks = json.loads(r.stdout)["benchmarks"]
    for name in variants:
        mine = [b for b in benchmarks if b["name"].startswith((name + "{", name + ":"))]
        errors = [f"{b['name']}: {b.get('error_message', '')}" for b in mine if b.get("error_occurred")]
        if errors:
            fail(name, "attnbench_gbench", "; ".join(errors[:2]))
        elif not mine:
            fail(name, "attnbench_gbench", "ran no benchmark of it")
        else:
            ok(name, "attnbench_gbench", f"{len(mine)} benchmark(s) ran")


def check_dry_runs(cli, variants):
    """Every sweep config shipped in configs/ plans with the plugin loaded; "all" configs plan every variant."""
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.json"))):
        base = os.path.basename(path)
        with open(path) as f:
            cfg = json.load(f)
        if "sweep" not in cfg:
            if base in NOT_SWEEPS:
                ok("", "run --dry-run", f"configs/{base}: not a sweep ({NOT_SWEEPS[base]})")
            else:
                fail("", "run --dry-run", f"configs/{base} has no \"sweep\" and is not on NOT_SWEEPS")
            continue
        r = cli("run", path, "--dry-run")
        if r.returncode != 0:
            fail("", "run --dry-run", f"configs/{base}: exit {r.returncode}: {first_line(r)}")
            continue
        if cfg.get("variants") == "all":
            missing = [v for v in variants if f"\n{v}:" not in "\n" + r.stdout and f"\n{v}{{" not in "\n" + r.stdout]
            if missing:
                fail(", ".join(missing), "run --dry-run", f"configs/{base} (variants: all) plans no point of them")
                continue
        ok("", "run --dry-run", f"configs/{base}: {r.stdout.strip().splitlines()[-1]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True)
    ap.add_argument("--plugin", action="append", default=[], help="a plugin to load in every command (repeatable)")
    ap.add_argument("--gbench", help="the Google Benchmark driver, attnbench_gbench (absent from sanitizer builds)")
    ap.add_argument("--expect-failure", metavar="VARIANT",
                    help="self-test: VARIANT (from --plugin) must fail under every command, and nothing else")
    a = ap.parse_args()
    try:
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (install python3-numpy)")
        return 77
    os.environ.pop("ATTNBENCH_PLUGINS", None)
    cli = Cli(a.attnbench, a.plugin)
    listed = json.loads(cli("list", "--json").stdout)
    caps = {v["name"]: v["capabilities"] for v in listed}
    variants = [v["name"] for v in listed]
    if a.expect_failure:
        variants = ["naive", a.expect_failure]  # the self-test: one variant every path runs, and the one none can
    from_plugins = [v["name"] for v in listed if v.get("plugin")]
    print(f"variants: {', '.join(variants)} (from plugins: {', '.join(from_plugins) or 'none'})")
    if not from_plugins:
        fail("", "list", "no variant from a plugin: pass --plugin with the suite's test plugin")
    with tempfile.TemporaryDirectory(prefix="attnbench-default-paths-") as tmp:
        check_patterns(cli, variants, tmp)
        picked, config, _ = check_run(cli, variants, caps, tmp)
        for name in variants:
            for row in picked.get(name, {}).values():
                check_inputs_eval(cli, name, caps[name], row, config, tmp)
        if a.gbench:
            check_gbench(a.gbench, a.plugin, variants, config)
        else:
            print("note  attnbench_gbench not given (a build without it): not run")
        if not a.expect_failure:
            check_dry_runs(cli, variants)
    if a.expect_failure:
        commands = {c for v, c, _ in failures if v == a.expect_failure}
        others = [(v, c, m) for v, c, m in failures if v != a.expect_failure]
        want = {"patterns", "run"} | ({"attnbench_gbench"} if a.gbench else set())
        print(f"self-test: {a.expect_failure} failed under {sorted(commands)}; other failures: {len(others)}")
        passed = want <= commands and not others
        print("self-test " + ("passed" if passed else f"FAILED: want {sorted(want)} for {a.expect_failure}, none else"))
        return 0 if passed else 1
    if failures:
        print(f"\n{len(failures)} failure(s):")
        for v, c, m in failures:
            command = c if c.startswith("attnbench") else f"attnbench {c}"
            print(f"  {v or '(all variants)'} under `{command}`: {m}")
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
