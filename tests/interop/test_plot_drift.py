#!/usr/bin/python3
"""`scripts/plot.py --drift DRIFT_JSON ...` on what the built `attnbench drift --json` printed for a small stack on
tests/data/declaration_of_independence.txt (every variant, the baseline included): drift.png and drift.svg are
written (to --out, or beside the first JSON), two documents draw into one figure, a document with a NaN/Inf
variant and a skipped one still draws, and bad input exits 2 naming the file, writing nothing.

Run by ctest as `/usr/bin/python3 test_plot_drift.py --attnbench PATH`. Exit 0 pass, 1 fail, 77 skip (numpy or
matplotlib missing)."""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLOT = os.path.join(ROOT, "scripts", "plot.py")
TEXT = os.path.join(ROOT, "tests", "data", "declaration_of_independence.txt")

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)
    return cond


def run_plot(*args):
    return subprocess.run([sys.executable, PLOT, *args], capture_output=True, text=True, timeout=300,
                          cwd=tempfile.gettempdir())


def check_figures(out, what):
    png, svg = os.path.join(out, "drift.png"), os.path.join(out, "drift.svg")
    if check(os.path.isfile(png) and os.path.isfile(svg), f"{what}: drift.png and drift.svg in {out}"):
        with open(png, "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{what}: drift.png is a PNG")
        root = ET.parse(svg).getroot()
        check(root.tag.endswith("svg"), f"{what}: drift.svg is an SVG document")
        check(os.path.getsize(png) > 20000, f"{what}: drift.png holds a drawing ({os.path.getsize(png)} bytes)")
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
    with tempfile.TemporaryDirectory(prefix="attnbench-test-plot-drift-") as tmp:
        args = [exe, "drift", "--text", TEXT, "--vocab-size", "500", "--d-model", "32", "--seed", "2", "--layers",
                "3", "--heads", "4", "--max-tokens", "64", "--variant", "all", "--json"]
        r = subprocess.run(args, capture_output=True, text=True, timeout=300)
        if not check(r.returncode == 0, f"attnbench drift --json exits 0 (rc {r.returncode}: {r.stderr.strip()})"):
            return 1
        doc = json.loads(r.stdout)
        check(doc["command"] == "drift" and len(doc["variants"]) >= 2, "drift JSON with every variant")
        check(all(len(v["layers"]) == 4 for v in doc["variants"] if v["status"] == "ok"), "L+1 layers per variant")
        base = [v for v in doc["variants"] if v["baseline"]]
        check(len(base) == 1 and base[0]["name"] == doc["baseline"], "one baseline entry")
        a_json = os.path.join(tmp, "a.json")
        with open(a_json, "w") as f:
            f.write(r.stdout)
        r = subprocess.run(args[:-3] + ["--variant", "linear", "--causal", "--json"], capture_output=True, text=True,
                           timeout=300)
        check(r.returncode == 0, f"a second (causal) run exits 0 (rc {r.returncode})")
        b_json = os.path.join(tmp, "b.json")
        with open(b_json, "w") as f:
            f.write(r.stdout)

        out = os.path.join(tmp, "figs")
        r = run_plot("--drift", a_json, "--out", out)
        check(r.returncode == 0, f"plot.py --drift --out exits 0 (rc {r.returncode}: {r.stderr.strip()[-400:]})")
        check_figures(out, "--out DIR")
        check(os.path.join(out, "drift.png") in r.stdout, "plot.py prints the paths it wrote")
        r = run_plot("--drift", a_json)
        check(r.returncode == 0, f"plot.py --drift (no --out) exits 0 (rc {r.returncode}: {r.stderr.strip()[-400:]})")
        check_figures(tmp, "default --out (the JSON's folder)")
        two = os.path.join(tmp, "two")
        r = run_plot("--drift", a_json, b_json, "--out", two)
        check(r.returncode == 0, f"two documents exit 0 (rc {r.returncode}: {r.stderr.strip()[-400:]})")
        check_figures(two, "two documents")
        with open(os.path.join(two, "drift.svg")) as f:
            svg = f.read()
        check("a]" in svg and "b]" in svg, "two documents: each line's label names its file")

        # A NaN/Inf variant (drawn up to its last finite layer) and a skipped one (listed) still draw.
        odd = copy.deepcopy(json.load(open(a_json)))
        lin = next(v for v in odd["variants"] if not v["baseline"])
        lin.update(status="nonfinite", failed_layer=2, error="layer 2: NaN", layers=lin["layers"][:2])
        odd["variants"].append({"name": "made_up", "status": "skipped", "reason": "needs a capability",
                                "baseline": False, "layers": []})
        odd_json = os.path.join(tmp, "odd.json")
        with open(odd_json, "w") as f:
            json.dump(odd, f)
        odd_out = os.path.join(tmp, "odd")
        r = run_plot("--drift", odd_json, "--out", odd_out)
        check(r.returncode == 0, f"NaN/Inf and skipped variants: exit 0 (rc {r.returncode}: {r.stderr.strip()[-400:]})")
        check_figures(odd_out, "NaN/Inf and skipped variants")
        with open(os.path.join(odd_out, "drift.svg")) as f:
            svg = f.read()
        check("made_up" in svg and "NaN/Inf" in svg, "the skipped variant and the NaN/Inf mark are in the figure")

        # Bad input: exit 2, the file named, nothing written.
        bad_out = os.path.join(tmp, "bad-out")
        cases = {"not JSON": "{\"variants\": [", "not a drift document": "{\"points\": []}",
                 "a variant without layers": "{\"command\": \"drift\", \"variants\": [{\"name\": \"naive\"}]}",
                 "a layer without rel_l2": "{\"command\": \"drift\", \"variants\": [{\"name\": \"naive\", "
                                           "\"layers\": [{\"layer\": 0}]}]}"}
        for what, text in cases.items():
            path = os.path.join(tmp, "bad-" + what.replace(" ", "-") + ".json")
            with open(path, "w") as f:
                f.write(text)
            r = run_plot("--drift", a_json, path, "--out", bad_out)
            check(r.returncode == 2 and path in r.stderr,
                  f"{what}: exit 2 naming the file (rc {r.returncode}, stderr {r.stderr.strip()!r})")
        missing = os.path.join(tmp, "missing.json")
        r = run_plot("--drift", missing, "--out", bad_out)
        check(r.returncode == 2 and missing in r.stderr,
              f"missing file: exit 2 naming it (rc {r.returncode}, stderr {r.stderr.strip()!r})")
        check(not os.path.exists(bad_out), "nothing written on bad input")
        r = run_plot("--compare", a_json, "--drift", a_json)
        check(r.returncode == 2 and "--drift" in r.stderr, f"--compare with --drift: exit 2 ({r.stderr.strip()!r})")
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
