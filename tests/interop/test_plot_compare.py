#!/usr/bin/python3
"""`scripts/plot.py --compare COMPARE_JSON` on what the built `attnbench compare A B --json` printed for two
synthetic results folders (those of tests/test_compare.cpp: a 2x slowdown, an unchanged point measured with
interference, a speed-up, a row without repetitions, points on one side only, a skipped point): compare.png and
compare.svg are written (to --out, or beside the JSON), and bad input exits 2 naming the file, writing nothing.

Run by ctest as `/usr/bin/python3 test_plot_compare.py --attnbench PATH`. Exit 0 pass, 1 fail, 77 skip (numpy or
matplotlib missing)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLOT = os.path.join(ROOT, "scripts", "plot.py")

TAIL = ":B=1,H=8,Lq=4096,Lkv=4096,D=64,causal,gaussian(std=1),T=2"
SLOWER = "tiled{tile_q=0,tile_kv=0}" + TAIL
SAME = "naive:B=1,H=8,Lq=1024,Lkv=1024,D=64,causal,gaussian(std=1),T=2"
FASTER = "linear{feature_map=elu,chunk=64,eps=1e-06}" + TAIL
ONLY_A = "sliding_window{window=128,dilation=1,global_tokens=0}" + TAIL
ONLY_B = "tiled{tile_q=0,tile_kv=0}:B=1,H=8,Lq=8192,Lkv=8192,D=64,causal,gaussian(std=1),T=2"
SKIPPED_B = "naive" + TAIL
OLD = "naive:B=1,H=8,Lq=8192,Lkv=8192,D=64,causal,gaussian(std=1),T=2"
BASE = [1.00, 1.01, 0.99, 1.02, 0.98, 1.005, 0.995, 1.015, 0.985]
BASE_AGAIN = [1.003, 0.993, 1.013, 0.983, 1.008, 0.998, 1.018, 0.988, 1.001]

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)
    return cond


def ok_row(rid, variant, samples, max_abs_err, noisy=False):
    s = sorted(samples)
    median = (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2 if s else None
    return {"id": rid, "variant": variant, "status": "ok", "reason": "", "threads": 2, "isa": "avx2",
            "noisy": noisy, "attempts": 1,
            "time_ms": {"median": median, "reps": len(samples), "samples": samples},
            "accuracy": {"reference": "full", "rows": 64, "max_abs_err": max_abs_err}}


def write_folder(path, commit, rows):
    os.makedirs(path)
    meta = {"config_name": "cmp", "config_hash": "c0ffee", "isa_option": "best",
            "config": {"name": "cmp", "sweep": {"seq_len": [1024, 4096, 8192], "mask": "causal", "threads": 2}},
            "start_time": "2026-12-01T10:00:00Z", "end_time": "2026-12-01T10:05:00Z",
            "system": {"cpu_model": "AMD EPYC", "git_commit": commit, "compiler": "g++ 12.2.0"}}
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    with open(os.path.join(path, "results.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def write_pair(tmp):
    """Folders A and B as tests/test_compare.cpp writes them; returns their paths."""
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    old_a = ok_row(OLD, "naive", [], 3e-7)
    old_a["time_ms"]["median"] = 50.0  # a row from before time_ms.samples
    write_folder(a, "aaaa1111", [ok_row(SLOWER, "tiled", BASE, 2.0e-7), ok_row(SAME, "naive", BASE, 3.0e-7),
                                 ok_row(FASTER, "linear", BASE, 0.5), ok_row(ONLY_A, "sliding_window", BASE, 0.8),
                                 ok_row(SKIPPED_B, "naive", BASE, 3.1e-7), old_a])
    write_folder(b, "bbbb2222", [ok_row(SLOWER, "tiled", [2 * x for x in BASE], 2.5e-7),
                                 ok_row(SAME, "naive", BASE_AGAIN, 3.0e-7, noisy=True),
                                 ok_row(FASTER, "linear", [0.8 * x for x in BASE], 0.5),
                                 ok_row(ONLY_B, "tiled", BASE, 2.0e-7),
                                 {"id": SKIPPED_B, "variant": "naive", "status": "skipped", "threads": 2,
                                  "reason": "needs 9.000 GiB, over the memory budget of 8.000 GiB"},
                                 ok_row(OLD, "naive", [50 * x for x in BASE], 3e-7)])
    return a, b


def run_plot(*args):
    return subprocess.run([sys.executable, PLOT, *args], capture_output=True, text=True, timeout=300,
                          cwd=tempfile.gettempdir())


def check_figures(out, what):
    png, svg = os.path.join(out, "compare.png"), os.path.join(out, "compare.svg")
    if check(os.path.isfile(png) and os.path.isfile(svg), f"{what}: compare.png and compare.svg in {out}"):
        with open(png, "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{what}: compare.png is a PNG")
        check(ET.parse(svg).getroot().tag.endswith("svg"), f"{what}: compare.svg is an SVG document")
        check(os.path.getsize(png) > 20000, f"{what}: compare.png holds a drawing ({os.path.getsize(png)} bytes)")
    check(not [n for n in os.listdir(out) if n.endswith(".tmp")], f"{what}: no temporary files left")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True, help="path of the attnbench binary")
    a = ap.parse_args()
    try:
        import numpy  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (install python3-numpy python3-matplotlib)")
        return 77
    exe = os.path.abspath(a.attnbench)
    with tempfile.TemporaryDirectory(prefix="attnbench-test-plot-compare-") as tmp:
        dir_a, dir_b = write_pair(tmp)
        r = subprocess.run([exe, "compare", dir_a, dir_b, "--json"], capture_output=True, text=True, timeout=120)
        if not check(r.returncode == 0, f"attnbench compare A B --json exits 0 (rc {r.returncode}: {r.stderr.strip()})"):
            return 1
        doc = json.loads(r.stdout)
        by_id = {p["id"]: p for p in doc["points"]}
        check(set(by_id) == {SLOWER, SAME, FASTER, OLD}, "four points compared")
        check(by_id[SLOWER]["verdict"] == "slower" and abs(by_id[SLOWER]["ratio"] - 2) < 1e-12
              and by_id[SLOWER]["p_value"] < 0.01, f"2x slowdown: ratio 2, p < 0.01 ({by_id[SLOWER]['p_value']})")
        check(by_id[SAME]["p_value"] > 0.05 and by_id[SAME]["noisy_b"], "unchanged point: p > 0.05, noisy in B")
        check(by_id[OLD]["p_value"] is None, "row without repetitions: p-value null")
        check(doc["only_a"] == [ONLY_A] and doc["only_b"] == [ONLY_B], "one-sided points listed")
        cmp_json = os.path.join(tmp, "compare.json")
        with open(cmp_json, "w") as f:
            f.write(r.stdout)

        out = os.path.join(tmp, "figs")
        r = run_plot("--compare", cmp_json, "--out", out)
        check(r.returncode == 0, f"plot.py --compare --out exits 0 (rc {r.returncode}: {r.stderr.strip()[-400:]})")
        check_figures(out, "--out DIR")
        check(os.path.join(out, "compare.png") in r.stdout, "plot.py prints the paths it wrote")
        r = run_plot("--compare", cmp_json)
        check(r.returncode == 0, f"plot.py --compare (no --out) exits 0 (rc {r.returncode}: {r.stderr.strip()[-400:]})")
        check_figures(tmp, "default --out (the JSON's folder)")

        # Bad input: exit 2, the file named, nothing written.
        bad_out = os.path.join(tmp, "bad-out")
        cases = {"not JSON": "{\"points\": [", "no points list": "{\"tool\": \"something else\"}",
                 "a point without an id": "{\"points\": [{\"ratio\": 2}]}"}
        for what, text in cases.items():
            path = os.path.join(tmp, "bad-" + what.replace(" ", "-") + ".json")
            with open(path, "w") as f:
                f.write(text)
            r = run_plot("--compare", path, "--out", bad_out)
            check(r.returncode == 2 and path in r.stderr,
                  f"{what}: exit 2 naming the file (rc {r.returncode}, stderr {r.stderr.strip()!r})")
        missing = os.path.join(tmp, "missing.json")
        r = run_plot("--compare", missing, "--out", bad_out)
        check(r.returncode == 2 and missing in r.stderr,
              f"missing file: exit 2 naming it (rc {r.returncode}, stderr {r.stderr.strip()!r})")
        check(not os.path.exists(bad_out), "nothing written on bad input")
        r = run_plot(dir_a, "--compare", cmp_json)
        check(r.returncode == 2 and "--compare" in r.stderr,
              f"RESULTS_DIR with --compare: exit 2 ({r.stderr.strip()!r})")
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
