#!/usr/bin/env python3
"""Interop: the quality harness (bench/quality, scripts/quality) end to end at tiny sizes.

- The tasks: MQAR as Zoology defines it (key and value ranges, each key once in the context and once at a
  query slot, labels only at the query positions, power-law gaps, filler 0, one seed one data set) and
  Schlag's capacity batches and evaluation sequences (settings 1 and 2: the last occurrence answers).
- A fixed seed gives the same loss curve twice (both tasks, bit for bit).
- Config errors name the field, the value and what is allowed, exit 2 and write nothing.
- A run, killed after its first point and resumed, keeps that point and runs the rest; its rows are read by
  `attnbench compare` (p-values over the training-step times, the task block) and plot.py draws its figures
  and the "What it can learn" section.

Run by ctest as `/usr/bin/python3 test_quality_harness.py --attnbench PATH` (ATTNBENCH_PYTHON_DIR: the module's
folder). Exit 0 pass, 1 fail, 77 skip (no torch, or no module: a sanitizer build).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import torch
except ImportError as exc:
    print(f"SKIP: {exc}")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
FAILURES = []

# Two cheap points per task: tiled and delta_rule at tiny sizes, a handful of steps each.
TINY = {
    "name": "tiny",
    "variants": ["tiled", {"name": "delta_rule", "params": {"chunk": 8}}],
    "tasks": [
        {"task": "capacity", "n": 8, "head_dim": 16, "max_steps": 6, "eval_every": 3},
        {"task": "mqar", "seq_len": 16, "kv_pairs": 2, "vocab": 32, "d_model": 16, "train_examples": 64,
         "test_examples": 16, "batch": 16, "epochs": 2, "eval_every": "epoch"},
    ],
}


def check(condition, message):
    if not condition:
        FAILURES.append(message)
        print("FAIL:", message)


def test_mqar():
    from quality.tasks import MQAR_IGNORE, mqar

    vocab, length, kv = 64, 32, 4
    x, y = mqar(vocab, 200, length, kv, seed=3)
    check(x.shape == (200, length) and y.shape == (200, length), f"mqar shapes {x.shape}, {y.shape}")
    x2, y2 = mqar(vocab, 200, length, kv, seed=3)
    check(np.array_equal(x, x2) and np.array_equal(y, y2), "mqar: one seed, two data sets")
    check(not np.array_equal(x, mqar(vocab, 200, length, kv, seed=4)[0]), "mqar: seeds 3 and 4 give the same data")
    gaps = []
    for row, labels in zip(x, y):
        keys, values = row[0:2 * kv:2], row[1:2 * kv:2]
        check(((keys >= 1) & (keys < vocab // 2)).all(), f"mqar keys outside 1..V/2-1: {keys}")
        check(((values >= vocab // 2) & (values < vocab)).all(), f"mqar values outside V/2..V-1: {values}")
        check(len(set(keys)) == kv and len(set(values)) == kv, "mqar: a key or value repeats within an example")
        rest = row[2 * kv:]
        asked = np.nonzero(rest)[0]
        check(len(asked) == kv and sorted(rest[asked]) == sorted(keys), "mqar: each key once at a query slot")
        check((asked % 2 == 0).all(), f"mqar: query slots at odd offsets {asked}")
        answered = np.nonzero(labels != MQAR_IGNORE)[0]
        check(list(answered) == list(2 * kv + asked), "mqar: labels other than at the query keys' positions")
        for at in answered:
            check(labels[at] == values[list(keys).index(row[at])], "mqar: a label is not its key's value")
        gaps += list(asked // 2)
    space = (length - 2 * kv) // 2
    # The power law with a = 0.01 puts most of its mass on the first gaps: gap 0 is drawn far more often than
    # under a uniform draw of kv of the `space` slots.
    share_first = gaps.count(0) / (len(gaps) / kv)
    check(share_first > 2 * kv / space, f"mqar: gap 0 in {share_first:.2f} of the examples: not the power law")


def test_capacity():
    from quality.tasks import CapacityTask

    for setting in (1, 2):
        task = CapacityTask(12, setting, np.random.RandomState(5))
        keys, values, query, target = task.batch(64)
        check(keys.shape == (64, 12 * setting), f"capacity setting {setting}: batch shape {keys.shape}")
        for k, v, q, t in zip(keys, values, query, target):
            if setting == 1:
                check(sorted(k) == list(range(12)), "capacity setting 1: keys are not the N distinct keys")
                check(len(set(v)) == 12 and (v >= 12).all(), "capacity setting 1: values not N distinct ids")
            at = np.nonzero(k == q)[0][-1]
            check(t == v[at], "capacity: the target is not the value at the query's last occurrence")
        k, v, q, t = task.eval_sequence()
        check(len(q) == len(np.unique(k[0])), "capacity eval: not one query per distinct key")


def test_same_curve_twice():
    from quality import config, train

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny.json")
        with open(path, "w") as f:
            json.dump(TINY, f)
        import attnbench
        for point in config.load(path, attnbench.variants()).points:
            curves = []
            for _ in range(2):
                outcome = train.train(point, lambda o, loss: None, options={"threads": 2})
                curves.append((outcome.curve, outcome.train_losses))
            check(curves[0] == curves[1], f"{point.id}: two runs with one seed gave different curves:\n"
                  f"{curves[0]}\n{curves[1]}")
            check(len(curves[0][0]) >= 2, f"{point.id}: fewer than 2 evaluations: {curves[0][0]}")


def quality(args, **kw):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ["ATTNBENCH_PYTHON_DIR"],
                                                        os.path.join(ROOT, "bench")]))
    return subprocess.run([sys.executable, "-m", "quality", *args], env=env, capture_output=True, text=True, **kw)


def test_config_errors(tmp):
    cases = [
        ({"name": "bad", "tasks": [{"task": "mqar", "seq_len": -5, "kv_pairs": 2}]},
         "tasks[0].seq_len: must be a positive integer, got -5"),
        ({"name": "bad", "tasks": [{"task": "mqar", "seq_len": [16, 0], "kv_pairs": 2}]},
         "tasks[0].seq_len[1]: must be a positive integer, got 0"),
        ({"name": "bad", "tasks": [{"task": "capacity", "n": 8, "setting": 3}]},
         "tasks[0].setting: must be one of 1, 2, got 3"),
        ({"name": "bad", "variants": ["tilde"], "tasks": [{"task": "capacity", "n": 8}]},
         "variants[0].name: not a registered variant"),
        ({"name": "bad", "variants": [{"name": "sliding_window", "params": {"windw": 3}}],
          "tasks": [{"task": "capacity", "n": 8}]},
         "variants[0].params.windw: unknown parameter of variant 'sliding_window'"),
        ({"name": "bad", "tasks": [{"task": "mqar", "seq_len": 16, "kv_pairs": 8}]},
         "tasks[0]: seq_len, kv_pairs and vocab do not fit together"),
        ({"name": "bad", "tasks": [{"task": "lra"}]}, "tasks[0].task: required: \"capacity\" or \"mqar\", got \"lra\""),
        ({"name": "bad", "tasks": [{"task": "capacity", "n": 8, "lr": "fast"}]},
         "tasks[0].lr: must be a positive number, got \"fast\""),
    ]
    for i, (cfg, expected) in enumerate(cases):
        path = os.path.join(tmp, f"bad{i}.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        out = os.path.join(tmp, f"bad{i}")
        r = quality([path, "--out", out, "--no-plot"])
        check(r.returncode == 2, f"bad config {i}: exit {r.returncode}, expected 2")
        check(f"config '{path}': {expected}" in r.stderr, f"bad config {i}: expected '{expected}' in: {r.stderr}")
        check(not os.path.exists(out), f"bad config {i}: {out} was created")


def test_shipped_configs():
    """Every quality config in configs/ plans (--dry-run: exit 0, each point listed); what tests/defaults leaves
    to this test (its NOT_SWEEPS)."""
    import glob

    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.json"))):
        with open(path) as f:
            cfg = json.load(f)
        if "tasks" not in cfg:
            continue
        r = quality([path, "--dry-run"])
        check(r.returncode == 0, f"{os.path.basename(path)} --dry-run: exit {r.returncode}\n{r.stderr}")
        check(r.stdout.count("\n") >= 2, f"{os.path.basename(path)} --dry-run listed {r.stdout.count(chr(10))} points")


def test_plugins(tmp, exe):
    """A config's "plugins" load before its variants are read (paths relative to the config's folder): the
    test plugin's variant is planned (and skipped with its reason: it has no backward); a path that is no
    plugin fails with exit 2 naming the entry and writes nothing."""
    plugin = os.path.join(os.path.dirname(exe), "plugins", "libplugin_good.so")
    if not os.path.isfile(plugin):
        check(False, f"test plugin {plugin} not built")
        return
    cfg = {"name": "plug", "plugins": [os.path.relpath(plugin, tmp)], "variants": ["plugin_good_exact", "tiled"],
           "tasks": [{"task": "capacity", "n": 8}]}
    path = os.path.join(tmp, "plug.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    r = quality([path, "--dry-run"])
    check(r.returncode == 0, f"plugin config --dry-run: exit {r.returncode}\n{r.stderr}")
    check("capacity:plugin_good_exact:" in r.stdout and "has no backward pass" in r.stdout,
          f"plugin variant not planned or not skipped for its missing backward:\n{r.stdout}")
    cfg["plugins"] = ["no_such_plugin.so"]
    with open(path, "w") as f:
        json.dump(cfg, f)
    out = os.path.join(tmp, "plug")
    r = quality([path, "--out", out, "--no-plot"])
    check(r.returncode == 2 and f"config '{path}': plugins[0]: " in r.stderr and "no_such_plugin.so" in r.stderr,
          f"a missing plugin: exit {r.returncode}, stderr: {r.stderr}")
    check(not os.path.exists(out), f"a missing plugin: {out} was created")


def test_run_resume_compare(tmp, exe):
    path = os.path.join(tmp, "tiny.json")
    with open(path, "w") as f:
        json.dump(TINY, f)
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ["ATTNBENCH_PYTHON_DIR"], os.path.join(ROOT, "bench")]))
    proc = subprocess.Popen([sys.executable, "-m", "quality", path, "--out", a, "--no-plot"], env=env,
                            stderr=subprocess.PIPE, text=True)
    jsonl = os.path.join(a, "results.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if os.path.isfile(jsonl) and open(jsonl).read().count("\n") >= 1:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    err = proc.communicate()[1]
    check(proc.returncode == 130, f"SIGTERM after the first point: exit {proc.returncode}, expected 130\n{err}")
    first = open(jsonl).read().splitlines()
    meta = json.load(open(os.path.join(a, "meta.json")))
    check(meta["interrupted"] is True, "meta.json of the interrupted run: interrupted is not true")
    check(len(first) < 4, f"the interrupted run wrote {len(first)} rows of 4")
    r = quality([path, "--out", a, "--no-plot"])
    check(r.returncode == 2 and "--resume finishes them" in r.stderr, f"rerun without --resume: {r.stderr}")
    r = quality([path, "--out", a, "--resume", "--no-plot"])
    check(r.returncode == 0, f"--resume: exit {r.returncode}\n{r.stderr}")
    rows = [json.loads(line) for line in open(jsonl)]
    check(len(rows) == 4 and all(r["status"] == "ok" for r in rows), f"after --resume: {[r['id'] for r in rows]}")
    check(open(jsonl).read().splitlines()[:len(first)] == first, "--resume rewrote the rows it kept")
    check(json.load(open(os.path.join(a, "meta.json")))["interrupted"] is False, "meta.json: still interrupted")
    header = open(os.path.join(a, "results.csv")).readline()
    check("task.best_accuracy" in header and "time_ms.median" in header, f"results.csv header: {header[:200]}")
    for row in rows:
        t = row["task"]
        check(t["steps"] == row["time_ms"]["reps"] == len(row["time_ms"]["samples"]),
              f"{row['id']}: steps {t['steps']} vs time_ms reps {row['time_ms']['reps']}")
        check(abs(sum(row["time_ms"]["samples"]) / 1e3 - t["train_s"]) < 1e-6 * max(1, t["train_s"]),
              f"{row['id']}: train_s is not the sum of the step times")
    r = quality([path, "--out", b])  # with the plot step
    check(r.returncode == 0, f"second run: exit {r.returncode}\n{r.stderr}")
    report = open(os.path.join(b, "REPORT.md")).read() if os.path.isfile(os.path.join(b, "REPORT.md")) else ""
    check("## What it can learn" in report, "REPORT.md has no 'What it can learn' section")
    for fig in ("quality_capacity", "quality_mqar", "quality_vs_time"):
        check(os.path.isfile(os.path.join(b, "plots", fig + ".png")), f"plots/{fig}.png missing")
    c = subprocess.run([exe, "compare", a, b, "--json"], capture_output=True, text=True)
    check(c.returncode == 0, f"attnbench compare: exit {c.returncode}\n{c.stderr}")
    if c.returncode == 0:
        result = json.loads(c.stdout)
        check(result["summary"]["compared"] == 4, f"compare: {result['summary']}")
        for p in result["points"]:
            check(p["p_value"] is not None, f"compare {p['id']}: no p-value")
            check(p["task_a"] is not None and p["task_b"] is not None, f"compare {p['id']}: no task block")
            check(p["task_a"]["accuracy"] == p["task_b"]["accuracy"],
                  f"compare {p['id']}: one seed, accuracies {p['task_a']['accuracy']} vs {p['task_b']['accuracy']}")
    md = subprocess.run([exe, "compare", a, b], capture_output=True, text=True).stdout
    check("## What the points learned" in md, "compare's report has no task table")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True)
    args = ap.parse_args()
    module_dir = os.environ.get("ATTNBENCH_PYTHON_DIR")
    if not module_dir or not os.path.isdir(module_dir):
        print("SKIP: ATTNBENCH_PYTHON_DIR unset (no Python module in this build)")
        return 77
    sys.path.insert(0, module_dir)
    torch.set_num_threads(2)
    test_mqar()
    test_capacity()
    test_same_curve_twice()
    test_shipped_configs()
    with tempfile.TemporaryDirectory() as tmp:
        test_config_errors(tmp)
        test_plugins(tmp, os.path.abspath(args.attnbench))
        test_run_resume_compare(tmp, os.path.abspath(args.attnbench))
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
