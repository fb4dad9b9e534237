#!/usr/bin/python3
"""scripts/plot.py end to end: every figure and the report from a committed results fixture, the fitted
exponent and crossover on synthetic results with known answers, the key ratios and measurement conditions
on results with known intervals, interference and calibrations, and clear errors on bad input. And its
stages (scripts/plotlib: results -> analysis -> figures -> report) apart: the analysis alone, without
matplotlib, is summary.json; the report without figures has every table; drawing the figures (in any order)
changes neither.

Run by ctest as `/usr/bin/python3 test_plot.py --attnbench PATH` (only the PyTorch peer case runs it). The cases
run in parallel threads (each one mostly waits on a plot.py subprocess); their lines print case by case.
Exit 0 pass, 1 fail, 77 skip (numpy or matplotlib missing)."""
import argparse
import concurrent.futures
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
PLOT = os.path.join(SCRIPTS, "plot.py")
PEER = os.path.join(ROOT, "scripts", "peers", "torch_attention.py")
FIXTURE = os.path.join(ROOT, "tests", "data", "results_fixture")
FIGURES = ["time_vs_seq", "memory_vs_seq", "accuracy_vs_seq", "pareto", "throughput"]  # drawn for every results folder
ROOFLINE = "roofline"  # drawn only when some row has bytes

failures = []
_case = threading.local()  # the output lines of the case this thread runs


def check(cond, what):
    say(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)
    return cond


def say(line):
    lines = getattr(_case, "lines", None)
    if lines is None:
        print(line)
    else:
        lines.append(line)


def run_plot(*args):
    # From a cwd that is not scripts/: plot.py finds its plotlib/ package next to itself.
    return subprocess.run([sys.executable, PLOT, *args], capture_output=True, text=True, timeout=300,
                          cwd=tempfile.gettempdir())


# Runs the stages by hand in a fresh interpreter: argv = scripts folder, results folder, "figures" or "no-figures"
# (skip drawing). Prints one JSON object.
STAGES = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from plotlib.results import Results
from plotlib.analysis import analyse
from plotlib.report import render_report
out = {}
res = Results(sys.argv[2])
an = analyse(res)
out["analysis"] = an
out["matplotlib_after_analysis"] = "matplotlib" in sys.modules
out["report_no_figures"] = render_report(res, an, [])
out["report_pareto_only"] = render_report(res, an, ["plots/pareto.png", "plots/pareto.svg"])
out["matplotlib_after_report"] = "matplotlib" in sys.modules
if sys.argv[3] == "no-figures":
    print(json.dumps(out))
    sys.exit(0)
before = json.dumps(an, sort_keys=True)
from plotlib import figures
import matplotlib.pyplot as plt
for stem in reversed(figures.FIGURES):  # the other way round from plot.py's order, drawn but not saved
    plt.close(figures.FIGURE_FUNCTIONS[stem](res, an))
out["analysis_unchanged_by_figures"] = json.dumps(an, sort_keys=True) == before
out["report_unchanged_by_figures"] = render_report(res, an, []) == out["report_no_figures"]
print(json.dumps(out))
"""


def run_stages(results_dir, figures=True):
    """The stages run one by one on results_dir (see STAGES): a dict, or None after a failed check."""
    r = subprocess.run([sys.executable, "-c", STAGES, SCRIPTS, results_dir, "figures" if figures else "no-figures"],
                       capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir())
    if not check(r.returncode == 0, "the stages run by hand exit 0"
                 + (f" (rc {r.returncode}: {r.stderr.strip()[-500:]})" if r.returncode else "")):
        return None
    return json.loads(r.stdout)


def without_figure_sections(md):
    """REPORT.md without the sections (## or ###) that embed a figure (![...](plots/...)): the Roofline section
    keeps its table, its "### Roofline figure" subsection goes."""
    parts = re.split(r"\n(?=#{2,3} )", md)
    return "\n".join(p for p in parts if "](plots/" not in p)


def check_stages(what, results_dir, summary, md):
    """The analysis alone (no figure drawn, matplotlib not even imported) is what the full run wrote as
    summary.json (less "files", the files written); the report with figures skipped is the full run's report
    without its figure sections; drawing the figures in reverse order leaves the analysis and the report as
    they were."""
    st = run_stages(results_dir)
    if st is None:
        return None
    check(not st["matplotlib_after_analysis"] and not st["matplotlib_after_report"],
          f"[{what}] results, analysis and report run without importing matplotlib")
    expected = {k: v for k, v in summary.items() if k != "files"}
    check(st["analysis"] == expected, f"[{what}] the analysis alone equals summary.json of the full run (less 'files')")
    nofig = st["report_no_figures"]
    check("## Key figures" in nofig and "exponent (fit)" in nofig and "## Crossover" in nofig
          and "## Points left out of the curves" in nofig, f"[{what}] the report without figures has the tables")
    check("](plots/" not in nofig, f"[{what}] the report without figures embeds none")
    check(nofig == without_figure_sections(md), f"[{what}] ... and is the full report less its figure sections")
    pareto = st["report_pareto_only"]
    check("](plots/pareto.png)" in pareto and "(plots/pareto.svg)" in pareto and "](plots/time_vs_seq.png)" not in pareto,
          f"[{what}] the report embeds exactly the figures written (pareto only)")
    check(st["analysis_unchanged_by_figures"] and st["report_unchanged_by_figures"],
          f"[{what}] drawing the figures (in reverse order) changes neither the analysis nor the report")
    return st


def test_fixture(tmp):
    out = os.path.join(tmp, "fixture")
    if not check(os.path.isfile(os.path.join(FIXTURE, "results.jsonl")), f"the fixture {FIXTURE} is there"):
        return
    shutil.copytree(FIXTURE, out)  # plot.py writes next to the results: never into the committed fixture
    r = run_plot(out)
    if not check(r.returncode == 0, f"plot.py on the fixture exits 0 (got {r.returncode}: {r.stderr.strip()[-500:]})"):
        return
    for stem in FIGURES:
        png, svg = (os.path.join(out, "plots", f"{stem}.{ext}") for ext in ("png", "svg"))
        check(os.path.isfile(png) and os.path.getsize(png) > 10000, f"{stem}.png exists and is > 10 kB")
        if os.path.isfile(png):
            with open(png, "rb") as f:
                check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{stem}.png is a PNG")
        check(os.path.isfile(svg) and os.path.getsize(svg) > 10000, f"{stem}.svg exists and is > 10 kB")
        if os.path.isfile(svg):
            with open(svg, encoding="utf-8") as f:
                check("<svg" in f.read(2000), f"{stem}.svg is an SVG")
    report = os.path.join(out, "REPORT.md")
    if not check(os.path.isfile(report), "REPORT.md exists"):
        return
    with open(report, encoding="utf-8") as f:
        md = f.read()
    check(len(md) > 3000, f"REPORT.md is non-trivial ({len(md)} characters)")
    for stem in FIGURES:
        check(f"](plots/{stem}.png)" in md, f"REPORT.md embeds plots/{stem}.png")
        check(f"(plots/{stem}.svg)" in md, f"REPORT.md links plots/{stem}.svg")
    check("## Crossover" in md and "| approximate variant |" in md, "REPORT.md has the crossover table")
    for variant in ("linear", "sliding_window"):
        check(any(line.startswith(f"| `{variant}") for line in md.split("## Crossover")[1].split("##")[0].splitlines()),
              f"crossover table has a row for {variant}")
    check("## Key figures" in md and "exponent (fit)" in md, "REPORT.md has the key-figures table")
    check("## Machine" in md and "sgemm calibration" in md, "REPORT.md names the machine and the sgemm calibration")
    check("## Config" in md and '"seq_len"' in md, "REPORT.md holds the config")
    check("torch_naive" in md, "REPORT.md includes the PyTorch peer rows (results.peers.jsonl)")
    check("left out of the curves" in md and "memory_budget" in md,
          "REPORT.md counts the skipped rows and gives their reason")
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    check(summary["rows_excluded"] >= 1 and summary["rows_ok"] >= 20, "summary.json counts rows")
    # The fixture holds real timings from a shared machine, so only the fit's presence is checked here; its
    # value is checked on the synthetic results, where the answer is known.
    fits = [f for f in summary["fits"] if f["points"] >= 2]
    check(len(fits) >= 10 and all(isinstance(f["exponent"], float) and math.isfinite(f["exponent"]) for f in fits),
          f"every series with 2+ sizes has a finite fitted exponent ({len(fits)} series)")
    leftovers = [n for n in os.listdir(os.path.join(out, "plots")) if n.endswith(".tmp")]
    check(not leftovers, f"no temporary files left behind ({leftovers})")
    check(summary["files"] == [f"plots/{stem}.{ext}" for stem in FIGURES for ext in ("png", "svg")] + ["REPORT.md"],
          f"summary.json lists the files written ({summary['files']})")
    # The fixture predates bytes and the bandwidth calibration: no roofline figure, and the section says why.
    check(not os.path.exists(os.path.join(out, "plots", "roofline.png")), "no roofline figure for rows without bytes")
    check("## Roofline" in md and "The roofline data is missing: no measured row has `bytes`" in md,
          "REPORT.md's Roofline section says the data is missing")
    check(summary["roofline"]["panels"] == [] and summary["roofline"]["missing"],
          "summary.json roofline: no panels, the reason in 'missing'")
    # The fixture predates the measurement conditions: no interval, no interference, no calibrations list.
    check("## Measurement conditions" in md and "not recorded: results written before attnbench recorded "
          "interference" in md, "REPORT.md's Measurement conditions say the fixture predates them")
    m = summary.get("measurement", {})
    check(m.get("recorded") is False and m.get("calibrations") is None and m.get("rows_with_ci") == 0
          and m.get("error_bars") == "p10_p90" and m.get("noisy") == 0 and m.get("remeasured") == 0,
          f"summary.json measurement: not recorded, no calibrations, p10-p90 bars ({m})")
    kr = summary.get("key_ratios", {})
    check(kr.get("counts") == {"variants": 12, "mask": 4, "threads": 0} and len(kr.get("rows", [])) == 16
          and all(e["significant"] == "—" and e["interval"] is None for e in kr["rows"]),
          f"summary.json key_ratios: 6 pairs x 2 masks and 4 causal-vs-none, all '—' without intervals "
          f"({kr.get('counts')})")
    check("### Key ratios" in md and "| variants | `tiled` | `naive` | none; n=512 |" in md,
          "REPORT.md has the Key ratios table (tiled vs naive at their largest common n, 512)")
    with open(os.path.join(out, "plots", "time_vs_seq.svg"), encoding="utf-8") as f:
        svg = f.read()
    check("bars p10–p90" in svg and "95% CI" not in svg and "hollow: noisy" not in svg,
          "the time figure of rows without intervals draws p10–p90 bars and no noisy marker")
    check_stages("fixture", out, summary, md)


def row(variant, n, time_ms, exact, err, status="ok", reason="", peak=None, mask="none"):
    r = {"id": f"{variant}:B=1,H=1,Lq={n},Lkv={n},D=16,{mask},gaussian(std=1),T=1", "variant": variant, "params": {},
         "batch": 1, "heads": 1, "seq_q": n, "seq_kv": n, "head_dim": 16, "mask": mask, "regime": "gaussian(std=1)",
         "threads": 1, "dropout": 0.0, "exact": exact, "status": status, "reason": reason,
         "memory": {"estimated_bytes": 64 * n * (n if exact else 1), "inputs_bytes": 192 * n, "workspace_bytes": 0,
                    "peak_bytes": peak}}
    if status == "ok":
        flops = 4.0 * n * n * 16
        r.update(time_ms={"median": time_ms, "p10": time_ms * 0.98, "p90": time_ms * 1.02, "mean": time_ms, "cv": 0.01,
                          "reps": 5},
                 flops=flops, gflops=flops / (time_ms * 1e6), frac_sgemm=flops / (time_ms * 1e6) / 50.0,
                 accuracy={"reference": "sampled", "rows": 64, "max_abs_err": err, "rel_l2_err": err,
                           "mean_cosine": 0.9, "nan_count": 0, "inf_count": 0})
    return r


def test_synthetic(tmp):
    """time = c * n^1.5 exactly for the approximate series and c' * n^2 for the exact one: the fit must give 1.50
    and 2.00, and their ratio 16 * n^-0.5 crosses 1 at n = 256 exactly (log-log interpolation is exact for power
    laws). Non-finite accuracy strings and non-ok rows must not break anything."""
    d = os.path.join(tmp, "synthetic")
    os.makedirs(d)
    ns = [100, 200, 400, 800, 1600, 3200]
    rows = []
    for n in ns:
        rows.append(row("exact_sq", n, 1e-5 * n ** 2, True, 1e-7, peak=64 * n * n))
        err = "inf" if n == 800 else ("nan" if n == 1600 else 0.1)
        rows.append(row("approx_15", n, 1.6e-4 * n ** 1.5, False, err, peak=None))
    rows.append(row("approx_15", 6400, 0, False, 0, status="skipped", reason="needs 999 bytes > memory_budget 10"))
    rows.append(row("exact_sq", 6400, 0, True, 0, status="failed", reason="out of memory (std::bad_alloc)"))
    with open(os.path.join(d, "results.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.write('{"id": "torn')  # a crash mid-write: the torn last line is dropped, not an error
    meta = {"config_name": "synthetic", "config": {"name": "synthetic", "sweep": {"seq_len": ns}},
            "sgemm_calibration": [{"threads": 1, "gflops": 50.0, "size": 2048, "cv": 0.01}],
            "system": {"cpu_model": "synthetic CPU", "cores_available": 1}}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    r = run_plot(d)
    if not check(r.returncode == 0, f"plot.py on the synthetic results exits 0 (got {r.returncode}: {r.stderr.strip()[-500:]})"):
        return
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    fits = {f["series"]: f for f in summary["fits"]}
    k15 = fits.get("approx_15", {}).get("exponent")
    k2 = fits.get("exact_sq", {}).get("exponent")
    check(k15 is not None and abs(k15 - 1.5) <= 0.01, f"fitted exponent of time = c n^1.5 is 1.50 +- 0.01 (got {k15})")
    check(k2 is not None and abs(k2 - 2.0) <= 0.01, f"fitted exponent of time = c n^2 is 2.00 +- 0.01 (got {k2})")
    check(fits.get("approx_15", {}).get("n_min") == 100 and fits["approx_15"].get("n_max") == 3200,
          "the fit's range is the measured sizes (100-3200)")
    with open(os.path.join(d, "REPORT.md"), encoding="utf-8") as f:
        md = f.read()
    check("1.50 (n=100–3200)" in md, "REPORT.md prints the fitted exponent 1.50 with its range")
    cross = {c["series"]: c for c in summary["crossover"]}
    n_star = cross.get("approx_15", {}).get("faster_from_n")
    check(n_star is not None and abs(n_star - 256) < 0.5, f"crossover interpolated at n = 256 (got {n_star})")
    check("n ≈ 256 (between 200 and 400)" in md, "REPORT.md crossover table says n ≈ 256 (between 200 and 400)")
    # Memory: approx 64 n (estimated; no peak) vs exact 64 n^2 (measured): less memory at every n.
    check(cross.get("approx_15", {}).get("less_memory", "").startswith("less memory at every measured n"),
          f"memory crossover: less memory at every measured n (got {cross.get('approx_15', {}).get('less_memory')})")
    check(summary.get("nonfinite_accuracy_points") == 2, "the 'inf' and 'nan' accuracy strings are counted as non-finite")
    # Rows without `pass` are forward rows: no training section, no training column.
    check(summary.get("training") is None and "## Training" not in md and all("training" not in c for c in
                                                                            summary["crossover"]),
          "rows without pass: no Training section, no training crossover (summary.json training is null)")
    check("| approximate variant | mask | measured n | faster than best exact from | speed-up at max n |" in md,
          "rows without pass: the crossover table has its forward-only columns")
    with open(os.path.join(d, "plots", "time_vs_seq.svg"), encoding="utf-8") as f:
        svg = f.read()
    check("Time per forward call vs sequence length on synthetic CPU" in svg and "sequence length n (tokens)" in svg,
          "the time figure's title names the pass and the CPU, its x axis the unit")
    check(summary["rows_excluded"] == 2 and "out of memory" in md and "memory_budget" in md,
          "the skipped and failed rows are left out and their reasons summarised")
    st = check_stages("synthetic", d, summary, md)
    if st is not None:
        nofig = st["report_no_figures"]
        check("1.50 (n=100–3200)" in nofig and "n ≈ 256 (between 200 and 400)" in nofig,
              "the report without figures has the fitted exponent and the crossover")
        an = st["analysis"]
        check(an["nonfinite_accuracy_points"] == 2 and an["excluded"] == {"skipped": 1, "failed": 1},
              "the analysis alone counts the non-finite errors and the left-out rows")


def test_never_and_always(tmp):
    """A variant slower at every size: 'never within measured range'; faster at every size: 'at every
    measured n'."""
    d = os.path.join(tmp, "nocross")
    os.makedirs(d)
    rows = []
    for n in (128, 256, 512):
        rows.append(row("exact_sq", n, 1e-5 * n ** 2, True, 1e-7, peak=1000 * n))
        rows.append(row("slow", n, 1e-4 * n ** 2, False, 0.2, peak=10 * n))
        rows.append(row("fast", n, 1e-6 * n ** 2, False, 0.3, peak=10000 * n))
    with open(os.path.join(d, "results.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    r = run_plot(d)  # no meta.json: a warning, not an error
    if not check(r.returncode == 0, f"plot.py without meta.json exits 0 (got {r.returncode}: {r.stderr.strip()[-300:]})"):
        return
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        cross = {c["series"]: c for c in json.load(f)["crossover"]}
    check(cross["slow"]["faster"] == "never within measured range", f"slow: {cross['slow']['faster']}")
    check(cross["fast"]["faster"] == "faster at every measured n", f"fast: {cross['fast']['faster']}")
    check(cross["slow"]["less_memory"] == "less memory at every measured n", f"slow memory: {cross['slow']['less_memory']}")
    check(cross["fast"]["less_memory"] == "never within measured range", f"fast memory: {cross['fast']['less_memory']}")


def test_terminal_summary(tmp):
    """What plot.py prints after the files it wrote, on a sweep shaped like the default one (13 variants, n = 256
    … 4096, unmasked and causal, the recurrences causal only, a PyTorch peer) with known answers: tiled (exact)
    at 1e-6 n² ms; an approximate variant at c n ms crosses it at n = c / 1e-6 exactly (log-log interpolation is
    exact for power laws): linear (c = 1e-4) at every n, performer (2e-3) from n ≈ 2000, linformer (1e-2) never;
    the fastest at each n is linear unmasked (1e-4 n) and retention causal (5e-5 n); the peer, faster still, is
    never named. At most 15 lines, after REPORT.md's path."""
    d = os.path.join(tmp, "terminal")
    speeds = {"linear": 1e-4, "performer": 2e-3, "linformer": 1e-2, "retention": 5e-5, "bigbird": 1.5e-3,
              "nystrom": 6e-4, "sliding_window": 7e-4, "delta_rule": 2e-4, "gated_delta_rule": 2.2e-4, "gla": 4e-4,
              "simple_gla": 6e-5}
    recurrences = ("delta_rule", "gated_delta_rule", "gla", "retention", "simple_gla")
    rows, ns = [], [256, 512, 1024, 2048, 4096]
    for mask in ("none", "causal"):
        for n in ns:
            rows += [row("tiled", n, 1e-6 * n * n, True, 1e-7, mask=mask),
                     row("naive", n, 2e-6 * n * n, True, 1e-7, mask=mask)]
            rows += [row(v, n, c * n, False, 0.1, mask=mask) for v, c in speeds.items()
                     if mask == "causal" or v not in recurrences]
    write_rows(d, rows)
    with open(os.path.join(d, "results.peers.jsonl"), "w") as f:
        for n in ns:
            p = row("torch_naive", n, 1e-6 * n, True, 1e-7)
            f.write(json.dumps(dict(p, id="peer/" + p["id"])) + "\n")
    r = run_plot(d)
    if not check(r.returncode == 0, "[terminal] plot.py exits 0" + (f" (rc {r.returncode}: {r.stderr.strip()[-300:]})"
                                                                     if r.returncode else "")):
        return
    out = r.stdout.splitlines()
    report = out.index(os.path.join(d, "REPORT.md")) if os.path.join(d, "REPORT.md") in out else len(out)
    summary = out[report + 1:]
    check(all(os.path.isfile(p) for p in out[:report + 1]) and summary and summary[0].startswith("Summary ("),
          f"[terminal] stdout: the files written, REPORT.md's path last, then the summary ({out[report:report + 2]})")
    check(0 < len(summary) <= 15, f"[terminal] the summary has at most 15 lines ({len(summary)})")
    text = "\n".join(summary)
    ok = ("     n | mask=none                     | mask=causal" in text
          and "   256 | linear 0.0256 ms, approximate | retention 0.0128 ms, approximate" in text
          and "  4096 | linear 0.41 ms, approximate   | retention 0.205 ms, approximate" in text)
    check(ok, "[terminal] the fastest variant at each n per mask, its time and 'approximate'"
          + ("" if ok else "\n" + text))
    check("mask=none (against tiled): at every n: linear; from n ≈ 600: nystrom; from n ≈ 700: sliding_window;"
          in text
          and "from n ≈ 2000: performer; not within the measured n: linformer" in text.replace("\n      ", " "),
          "[terminal] the crossovers against tiled, in n order, as REPORT.md's table has them")
    check("at every n: delta_rule, gated_delta_rule, linear, retention, simple_gla;" in text.replace("\n      ", " ")
          and "from n ≈ 400: gla" in text, "[terminal] the causal crossovers")
    check("torch" not in text and "naive" not in text, "[terminal] the peer and the slower exact variant are not named")
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        fastest = json.load(f)["fastest"]
    check([(e["mask"], e["seq_kv"], e["series"], e["exact"]) for e in fastest]
          == [("none", n, "linear", False) for n in ns] + [("causal", n, "retention", False) for n in ns],
          "[terminal] summary.json 'fastest': per mask and n the fastest attnbench series")
    exact_only = os.path.join(tmp, "terminal-exact")
    write_rows(exact_only, [x for x in rows if x["exact"]])
    r = run_plot(exact_only)
    text = r.stdout.split("REPORT.md\n", 1)[-1]
    ok = r.returncode == 0 and "   256 | tiled 0.0655 ms, exact" in text and "Crossover" not in text
    check(ok, "[terminal] exact variants only: tiled, 'exact', and no crossover lines" + ("" if ok else "\n" + text))


def test_isa(tmp):
    """A sweep over SIMD targets (sweep.isa): one curve per target ("tiled [scalar]"), variants compared within
    a target, and meta.json's fma_peak (one entry per threads and target) listed in the machine section."""
    d = os.path.join(tmp, "isa")
    os.makedirs(d)
    rows = []
    for n in (128, 256, 512):
        for isa, speed in (("avx3", 1.0), ("scalar", 8.0)):
            for variant, exact, c in (("naive", True, 1e-5), ("tiled", True, 5e-6)):
                r = row(variant, n, speed * c * n ** 2, exact, 1e-7, peak=100 * n)
                r["isa"] = isa
                if isa != "avx3":
                    r["id"] += f",isa={isa}"
                rows.append(r)
    with open(os.path.join(d, "results.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    meta = {"config_name": "isa", "config": {"name": "isa", "sweep": {"isa": ["best", "scalar"]}},
            "sgemm_calibration": [{"threads": 1, "gflops": 50.0, "size": 2048, "cv": 0.01}],
            "fma_peak": [{"threads": 1, "isa": "avx3", "gflops": 220.0, "lanes": 16},
                         {"threads": 1, "isa": "scalar", "gflops": 5.5, "lanes": 1}],
            "system": {"cpu_model": "synthetic CPU", "cores_available": 1,
                       "isa": {"compiled": ["avx3", "scalar"], "supported": ["avx3", "scalar"], "best": "avx3"}}}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    r = run_plot(d)
    if not check(r.returncode == 0, f"plot.py on a sweep over targets exits 0 (got {r.returncode}: {r.stderr.strip()[-500:]})"):
        return
    with open(os.path.join(d, "REPORT.md"), encoding="utf-8") as f:
        md = f.read()
    check("`tiled [scalar]`" in md and "`naive [avx3]`" in md, "one series per variant and target")
    check("fp32 FMA peak, 1 thread(s), scalar | 5.5 GFLOP/s, 1 lanes" in md
          and "fp32 FMA peak, 1 thread(s), avx3 | 220.0 GFLOP/s, 16 lanes" in md, "REPORT.md lists the FMA peak per target")
    check("best avx3" in md, "REPORT.md names the SIMD targets")


def test_lra(tmp):
    """The LRA Table 2 layout: naive 1 ms * (n/1024)^2 with peak 4 n^2 bytes; performer 4x faster than naive at
    every n with 10% of its memory, linear 2x faster: the tables give those ratios with the paper's beside them
    (performer 5.7x at 4K, memory 1.06/9.48 = 0.11x), and the ordering line puts performer before linear in
    both (paper: performer 5.7x > linear 5.6x). Rows with a mask, results without the baseline's rows, and
    results whose meta.json names no baseline have no section."""
    d = os.path.join(tmp, "lra")
    ns = [1024, 2048, 3072, 4096]
    rows = []
    for n in ns:
        t = (n / 1024) ** 2
        rows.append(row("naive", n, t, True, 1e-7, peak=4 * n * n))
        rows.append(row("performer", n, t / 4, False, 0.1, peak=0.4 * n * n))
        rows.append(row("linear", n, t / 2, False, 0.1, peak=4 * n * n / 5))
        rows.append(row("performer", n, t / 8, False, 0.1, peak=0.1 * n * n, mask="causal"))
    write_rows(d, rows)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"baseline": "naive"}, f)
    r = run_plot(d)
    if not check(r.returncode == 0, f"plot.py on the LRA rows exits 0 (got {r.returncode}: {r.stderr.strip()[-300:]})"):
        return
    with open(os.path.join(d, "REPORT.md"), encoding="utf-8") as f:
        md = f.read()
    sec = md.split("## Relative to exact attention (LRA Table 2 layout)")[-1].split("\n## ")[0]
    check("| `performer` | Performer | 4.00× (paper 1.2×) | 4.00× (paper 1.9×) | 4.00× (paper 3.8×) | 4.00× (paper 5.7×) |"
          in sec, "the speed table gives performer 4.00x at every n beside the paper's 1.2/1.9/3.8/5.7x")
    check("| `linear` | Linear Trans. | 2.00× (paper 1.1×)" in sec, "linear 2.00x beside the paper's 1.1x at 1K")
    check("| `performer` | Performer | 0.10× (paper 0.44×) | 0.10× (paper 0.22×) | 0.10× (paper 0.15×) | 0.10× (paper 0.11×) |"
          in sec, "the memory table gives 0.10x beside the paper's GB ratios (0.37/0.85 ... 1.06/9.48)")
    check("8.00×" not in sec, "causal rows stay out of the table (the paper's and the baseline's mask is none)")
    check("here `performer` > `linear`; in the paper `performer` > `linear` (the same order)" in sec,
          "the ordering line at n=4096 agrees with the paper's")
    d2 = os.path.join(tmp, "lra_nobase")
    write_rows(d2, [r for r in rows if r["variant"] != "naive"])
    r = run_plot(d2)
    with open(os.path.join(d2, "REPORT.md"), encoding="utf-8") as f:
        check(r.returncode == 0 and "LRA Table 2 layout" not in f.read(), "no naive rows: no LRA section")
    d3 = os.path.join(tmp, "lra_nometa")
    write_rows(d3, rows)
    r = run_plot(d3)
    with open(os.path.join(d3, "REPORT.md"), encoding="utf-8") as f:
        check(r.returncode == 0 and "LRA Table 2 layout" not in f.read(),
              "meta.json names no baseline: no LRA section (no variant name is assumed)")


def write_rows(d, rows):
    os.makedirs(d)
    with open(os.path.join(d, "results.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))



def plot_report(d, rows, meta):
    """Writes rows and meta.json into d, runs plot.py there, and returns (summary.json, REPORT.md), or
    (None, None) with a recorded failure when plot.py fails."""
    write_rows(d, rows)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    return plot_folder(d)


def plot_folder(d):
    """Runs plot.py on the results folder d and returns (summary.json, REPORT.md), or (None, None) with a
    recorded failure when plot.py fails."""
    r = run_plot(d)
    if not check(r.returncode == 0, f"[{os.path.basename(d)}] plot.py exits 0"
                 + (f" (got {r.returncode}: {r.stderr.strip()[-500:]})" if r.returncode else "")):
        return None, None
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with open(os.path.join(d, "REPORT.md"), encoding="utf-8") as f:
        md = f.read()
    return summary, md


def report_section(md, heading):
    """The text of REPORT.md's section `## heading` up to the next ## heading ("" when there is none)."""
    parts = md.split(f"\n## {heading}\n")
    return parts[1].split("\n## ")[0] if len(parts) > 1 else ""


def close(a, b, tol=1e-9):
    return a is not None and b is not None and abs(a - b) <= tol * max(1.0, abs(b))

def test_dtype(tmp):
    """Storage dtypes and biases: one series per dtype ("tiled [bf16]"), the Accuracy by dtype table with
    the kernel's and the end-to-end errors and the time ratio vs the same variant's fp32 point, and rows from
    before the fields (no dtype, no accuracy_e2e) read as fp32 with the end-to-end error the kernel's."""
    d = os.path.join(tmp, "dtype")
    rows = []
    for n in (128, 256):
        for dtype, slow, e2e in (("fp32", 1.0, None), ("bf16", 0.5, 4e-3), ("fp16", 0.5, 9e-4)):
            for variant in ("naive", "tiled"):
                r = row(variant, n, slow * 1e-5 * n ** 2, True, 2e-7, peak=100 * n)
                if dtype != "fp32":  # fp32 rows: written as before the fields existed
                    r["id"] = r["id"].replace(",none,", f",dtype={dtype},none,")
                    r.update(dtype=dtype, bias="none", rope="none", rope_ms=None)
                    r["accuracy_e2e"] = dict(r["accuracy"], max_abs_err=e2e)
                rows.append(r)
    write_rows(d, rows)
    r = run_plot(d)
    if not check(r.returncode == 0, f"plot.py on a sweep over dtypes exits 0 (got {r.returncode}: {r.stderr.strip()[-500:]})"):
        return
    with open(os.path.join(d, "REPORT.md"), encoding="utf-8") as f:
        md = f.read()
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    check("`tiled [bf16]`" in md and "`naive [fp32]`" in md, "one series per variant and dtype")
    check("## Accuracy by dtype" in md, "REPORT.md has the Accuracy by dtype section")
    by = {(e["variant"], e["dtype"]): e for e in summary.get("accuracy_by_dtype", [])}
    check(len(by) == 6, f"accuracy_by_dtype has variant x dtype entries (got {sorted(by)})")
    b = by.get(("tiled", "bf16"), {})
    check(b.get("kernel_max_max_abs_err") == 2e-7 and b.get("e2e_max_max_abs_err") == 4e-3,
          "the kernel's and the end-to-end errors per dtype")
    check(b.get("time_ratio_vs_fp32") is not None and abs(b["time_ratio_vs_fp32"] - 0.5) < 1e-9
          and b.get("time_ratio_points") == 2, "the time ratio vs the same variant's fp32 point")
    f = by.get(("naive", "fp32"), {})
    check(f.get("e2e_max_max_abs_err") == 2e-7 and f.get("time_ratio_vs_fp32") is None,
          "rows without accuracy_e2e read as fp32 with the kernel's error end to end")
    check("| `tiled` | bf16 | 2 | 2.00e-07 | 2.00e-07 | 4.00e-03 | 4.00e-03 | 0.50× (2 points) |" in md,
          "the table row of tiled bf16")


def test_many_facets(tmp):
    """More settings than the figures have room for (13 x 2 masks > 24 facets: the figures draw 12 settings):
    the analysis still fits every series and counts every non-finite error, the undrawn ones included (they
    used to be computed while drawing, so the report had no exponent for a facet left out of the figures)."""
    d = os.path.join(tmp, "facets")
    rows = []
    for h in range(1, 14):
        for mask in ("none", "causal"):
            for n in (64, 128):
                for variant, exact, c, k in (("exact_sq", True, 1e-5, 2), ("approx", False, 1e-4, 1)):
                    err = 1e-7 if exact else ("inf" if h == 9 else 0.1)  # heads=9 sorts after 1, 10..13, 2..8
                    r = row(variant, n, c * h * n ** k, exact, err, peak=100 * n, mask=mask)
                    r["heads"], r["id"] = h, r["id"] + f",h={h}"
                    rows.append(r)
    write_rows(d, rows)
    st = run_stages(d, figures=False)  # the analysis and report alone (24 facets x 5 figures take seconds)
    if st is None:
        return
    check(not st["matplotlib_after_analysis"] and not st["matplotlib_after_report"],
          "[facets] results, analysis and report run without importing matplotlib")
    an = st["analysis"]
    fits = {(f["series"], f["mask"], f["context"]): f for f in an["fits"]}
    check(len(an["fits"]) == 52 and all((v, m, f"heads={h}") in fits for v in ("approx", "exact_sq")
                                        for m in ("none", "causal") for h in range(1, 14)),
          f"one fit per series, facets beyond the figures' 24 included ({len(an['fits'])} fits)")
    k = fits.get(("approx", "none", "heads=9"), {}).get("exponent")
    check(k is not None and abs(k - 1.0) < 1e-9, f"the undrawn facet heads=9 has its exponent 1.00 (got {k})")
    check(an["nonfinite_accuracy_points"] == 4, f"non-finite errors of the undrawn facet are counted "
                                                f"(got {an['nonfinite_accuracy_points']}, expected 4)")
    check("| `approx` | — | none; heads=9 | no | 1.00 (n=64–128) |" in st["report_no_figures"],
          "the key figures give the undrawn facet's exponent")
    kr = an["key_ratios"]
    kinds = [e["kind"] for e in kr["rows"]]
    check(kr["counts"] == {"variants": 26, "mask": 26, "threads": 0} and kinds.count("variants") == 16
          and kinds.count("mask") == 16, f"[facets] the key ratios are bounded to 16 per kind ({kr['counts']})")
    check("(variants: 16 of 26, mask vs none: 16 of 26)" in st["report_no_figures"],
          "[facets] the sentence under Key ratios says how many are shown")


def test_cross_attention(tmp):
    """Cross-attention where seq_q takes a value seq_kv also takes: the rows with seq_q = seq_kv share the facet
    without a seq_q, the others have one per seq_q; sorting those facets (None next to numbers) used to raise
    TypeError."""
    d = os.path.join(tmp, "cross")
    rows = []
    for q in (64, 128):
        for kv in (64, 128):
            for variant, exact, c in (("exact_sq", True, 1e-5), ("approx", False, 1e-6)):
                r = row(variant, kv, c * q * kv, exact, 1e-7 if exact else 0.1, peak=100 * kv)
                r["seq_q"], r["id"] = q, r["id"] + f",q={q}"
                rows.append(r)
    write_rows(d, rows)
    st = run_stages(d)  # also draws every figure (not saved)
    if st is None:
        return
    contexts = sorted({f["context"] for f in st["analysis"]["fits"]})
    check(contexts == ["", "seq_q=128", "seq_q=64"], f"facets: self-attention sizes, then one per seq_q ({contexts})")


def roofline_row(variant, kv, seq_q, seq_kv, threads, time_ms, exact=True, heads=8, d=64):
    """An ok row with the bandwidth fields: flops of exact attention, bytes = Q, K, V, O once (K/V with kv heads)."""
    flops = 4.0 * heads * d * seq_q * seq_kv
    nbytes = 4.0 * (2 * heads * seq_q * d + 2 * kv * seq_kv * d)
    r = row(variant, seq_kv, time_ms, exact, 1e-7)
    hkv = f",Hkv={kv}" if kv != heads else ""
    r.update(id=f"{variant}:B=1,H={heads}{hkv},Lq={seq_q},Lkv={seq_kv},D={d},causal_lower_right,gaussian(std=1),T={threads}",
             heads=heads, kv_heads=kv, seq_q=seq_q, head_dim=d, mask="causal_lower_right", threads=threads,
             flops=flops, gflops=flops / (time_ms * 1e6), bytes=nbytes, gbytes_per_s=nbytes / (time_ms * 1e6))
    return r


def ci_row(variant, n, mask, threads, median, ci, params, exact=True, attempts=1, noisy=False, score=0.01,
           calibration=0, peak_note=""):
    """An ok row with the measurement-condition fields: the 95% interval of the median (None: fewer than 6 repetitions), the
    samples, the interference measured, attempts, noisy and the calibration it divided by."""
    r = row(variant, n, median, exact, 1e-7 if exact else 0.05, peak=None if peak_note else 100 * n, mask=mask)
    r.update(id=f"{variant}:B=1,H=1,Lq={n},Lkv={n},D=16,{mask},gaussian(std=1),T={threads}", threads=threads,
             params=params, attempts=attempts, noisy=noisy, calibration=calibration,
             interference={"window_s": 0.5, "steal_frac": 0.0, "other_cpu_frac": score, "runq_wait_frac": 0.0,
                           "score": score, "ctx_switches_involuntary": 3, "loadavg_1m": 1.0, "freq_mhz": None})
    reps = 12 if ci else 5
    r["time_ms"].update(reps=reps, ci_lo=ci[0] if ci else None, ci_hi=ci[1] if ci else None,
                        ci_level=0.9614 if ci else None, samples=[median] * reps)
    r["memory"]["peak_note"] = peak_note
    return r


CI_NOTE = "the kernel refused the /proc/self/clear_refs reset"


def ci_results(d):
    """Known answers for the key ratios and the measurement conditions. At n = 512, 1 thread: naive 10 ms
    [9.8, 10.2], tiled 4 [3.9, 4.1] (re-measured: 2 attempts), approx 9.6 [9.5, 10.3]; causal: naive 6 with no
    interval (5 repetitions), tiled 2.5 [2.4, 2.6], approx 5 [4.9, 5.1] (noisy, 3 attempts, score 0.3). naive at
    2 threads: 5.5 [5, 6], causal 3.2 [3, 3.4]. n = 256: the same over 4 (approx over 2), divided by
    calibration 0; n = 512 by calibration 2. Calibration 1 ran under interference and was not used."""
    spec = {  # (variant, mask, threads): (median at 512, interval at 512)
        ("naive", "none", 1): (10.0, (9.8, 10.2)), ("tiled", "none", 1): (4.0, (3.9, 4.1)),
        ("approx", "none", 1): (9.6, (9.5, 10.3)), ("naive", "causal", 1): (6.0, None),
        ("tiled", "causal", 1): (2.5, (2.4, 2.6)), ("approx", "causal", 1): (5.0, (4.9, 5.1)),
        ("naive", "none", 2): (5.5, (5.0, 6.0)), ("naive", "causal", 2): (3.2, (3.0, 3.4))}
    params = {"naive": {}, "tiled": {"tile": 64}, "approx": {"rank": 8}}
    rows = []
    for n in (256, 512):
        for (variant, mask, threads), (median, ci) in spec.items():
            scale = 1.0 if n == 512 else (0.5 if variant == "approx" else 0.25)
            extra = {}
            if n == 512 and (variant, mask, threads) == ("tiled", "none", 1):
                extra = {"attempts": 2, "score": 0.02}
            if n == 512 and (variant, mask, threads) == ("approx", "causal", 1):
                extra = {"attempts": 3, "noisy": True, "score": 0.3, "peak_note": CI_NOTE}
            rows.append(ci_row(variant, n, mask, threads, median * scale,
                               (ci[0] * scale, ci[1] * scale) if ci else None, params[variant],
                               exact=variant != "approx", calibration=0 if n == 256 else 2, **extra))
    skipped = row("naive", 1024, 0, True, 0, status="skipped", reason="needs 999 bytes > memory_budget 10")
    skipped.update(id=skipped["id"].replace("T=1", "T=1,skipped"), attempts=0, noisy=False, interference=None,
                   calibration=None)
    skipped["memory"]["peak_note"] = "not timed"
    rows.append(skipped)
    write_rows(d, rows)

    def cal(i, reason, after, used, score, g1, g2):
        return {"index": i, "timestamp": f"2026-01-01T00:{10 * i:02d}:00Z", "after_points": after, "reason": reason,
                "used": used, "interference": {"window_s": 2.0, "steal_frac": 0.0, "other_cpu_frac": score,
                                               "runq_wait_frac": 0.0, "score": score, "ctx_switches_involuntary": 9,
                                               "loadavg_1m": 1.5, "freq_mhz": 3000.0},
                "sgemm": [{"threads": 1, "gflops": g1, "median_ms": 300.0, "cv": 0.01, "p10_gflops": g1 * 0.99,
                           "p90_gflops": g1 * 1.01},
                          {"threads": 2, "gflops": g2, "median_ms": 160.0, "cv": 0.02, "p10_gflops": g2 * 0.99,
                           "p90_gflops": g2 * 1.01}],
                "fma_peak": [{"threads": 1, "isa": "avx3", "gflops": 200.0}]}
    cals = [cal(0, "start", 0, True, 0.01, 50.0, 95.0), cal(1, "interference", 4, False, 0.4, 30.0, 50.0),
            cal(2, "cadence", 8, True, 0.02, 52.5, 100.0)]
    meta = {"config_name": "ci", "config": {"name": "ci", "measure": {"max_interference": 0.08}},
            "sgemm_calibration": [{"threads": e["threads"], "gflops": e["gflops"], "size": 2048, "cv": e["cv"]}
                                  for e in cals[0]["sgemm"]],
            "fma_peak": cals[0]["fma_peak"], "calibrations": cals,
            "system": {"cpu_model": "synthetic CPU", "cores_available": 2}}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    return rows


def test_measurement(tmp):
    """The key ratios and the measurement conditions on results with known answers: intervals apart
    (significant), overlapping (not), missing (—); a noisy and a re-measured row; three calibrations, one of
    them unused. The time figure's bars are the intervals (p10-p90 where a row has none) and noisy rows are
    hollow."""
    d = os.path.join(tmp, "ci")
    rows = ci_results(d)
    ids = {(r["variant"], r["mask"], r["threads"], r["seq_kv"]): r["id"] for r in rows}
    r = run_plot(d)
    if not check(r.returncode == 0, f"[ci] plot.py exits 0 (got {r.returncode}: {r.stderr.strip()[-500:]})"):
        return
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with open(os.path.join(d, "REPORT.md"), encoding="utf-8") as f:
        md = f.read()
    kr = summary.get("key_ratios", {})
    check(kr.get("counts") == {"variants": 6, "mask": 4, "threads": 2} and len(kr.get("rows", [])) == 12,
          f"[ci] key_ratios: 3 pairs x 2 masks, 4 mask-vs-none, 2 thread comparisons ({kr.get('counts')})")
    by = {(e["kind"], e["a"]["series"], e["b"]["series"], e["mask"], e["a"].get("mask"), e["a"].get("threads")): e
          for e in kr.get("rows", [])}

    def near(x, y):
        return x is not None and abs(x - y) < 1e-9

    e = by.get(("variants", "tiled", "naive", "none", None, None), {})
    check(e.get("seq_kv") == 512 and near(e.get("ratio"), 0.4) and e.get("interval") is not None
          and near(e["interval"][0], 3.9 / 10.2) and near(e["interval"][1], 4.1 / 9.8)
          and e.get("significant") == "yes",
          f"[ci] tiled vs naive at n=512: 0.4, [3.9/10.2, 4.1/9.8], significant ({e})")
    e = by.get(("variants", "approx", "naive", "none", None, None), {})
    check(near(e.get("ratio"), 0.96) and e.get("interval") is not None and near(e["interval"][0], 9.5 / 10.2)
          and near(e["interval"][1], 10.3 / 9.8) and e.get("significant") == "no (intervals overlap)",
          f"[ci] approx vs naive: 0.96, intervals overlap ({e})")
    e = by.get(("variants", "approx", "tiled", "none", None, None), {})
    check(near(e.get("ratio"), 2.4) and e.get("significant") == "yes",
          f"[ci] approx vs tiled: B is the exact one, 2.4, significant ({e})")
    check(not any(k[1] == "naive" and k[0] == "variants" for k in by),
          "[ci] naive (exact, no parameters) is always the B of its pairs")
    e = by.get(("variants", "tiled", "naive", "causal", None, None), {})
    check(near(e.get("ratio"), 2.5 / 6.0) and e.get("interval") is None and e.get("significant") == "—"
          and e.get("b", {}).get("ci_ms") is None, f"[ci] tiled vs naive causal: naive has no interval, '—' ({e})")
    e = by.get(("variants", "approx", "naive", "causal", None, None), {})
    check(e.get("a", {}).get("noisy") is True and e.get("b", {}).get("noisy") is False,
          f"[ci] the noisy row is flagged in its ratios ({e.get('a')})")
    e = by.get(("mask", "tiled", "tiled", None, "causal", None), {})
    check(near(e.get("ratio"), 0.625) and near(e["interval"][0], 2.4 / 4.1) and near(e["interval"][1], 2.6 / 3.9)
          and e.get("significant") == "yes" and e.get("context") == "threads=1",
          f"[ci] tiled causal vs none: 0.625, significant ({e})")
    e = by.get(("threads", "naive", "naive", "none", None, 2), {})
    check(near(e.get("ratio"), 0.55) and e.get("b", {}).get("threads") == 1 and e.get("significant") == "yes"
          and e.get("a", {}).get("id") == ids[("naive", "none", 2, 512)],
          f"[ci] naive 2 threads vs 1 at n=512: 0.55, significant ({e})")
    e = by.get(("threads", "naive", "naive", "causal", None, 2), {})
    check(e.get("significant") == "—" and e.get("interval") is None, f"[ci] naive causal 2 vs 1 threads: '—' ({e})")
    for line in ("| variants | `tiled` | `naive` | none; threads=1; n=512 | 4 | 10 | 0.4× | [0.382, 0.418] | medians | yes |",
                 "| variants | `approx` | `naive` | none; threads=1; n=512 | 9.6 | 10 | 0.96× | [0.931, 1.05] | "
                 "medians | no (intervals overlap) |",
                 "| variants | `approx` | `tiled` | none; threads=1; n=512 | 9.6 | 4 | 2.4× | [2.32, 2.64] | medians | yes |",
                 "| variants | `tiled` | `naive` | causal; threads=1; n=512 | 2.5 | 6 | 0.417× | — | medians | — |",
                 "| variants | `approx` (noisy) | `naive` | causal; threads=1; n=512 | 5 | 6 | 0.833× | — | medians | — |",
                 "| mask vs none | `tiled`, causal | `tiled`, none | threads=1; n=512 | 2.5 | 4 | 0.625× | "
                 "[0.585, 0.667] | medians | yes |",
                 "| threads | `naive`, 2 threads | `naive`, 1 thread | none; n=512 | 5.5 | 10 | 0.55× | [0.49, 0.612] "
                 "| medians | yes |",
                 "| threads | `naive`, 2 threads | `naive`, 1 thread | causal; n=512 | 3.2 | 6 | 0.533× | — "
                 "| medians | — |"):
        check(line in md, f"[ci] REPORT.md Key ratios has {line}")
    check("(variants: 6 of 6, mask vs none: 4 of 4, threads: 2 of 2)" in md,
          "[ci] the sentence under Key ratios gives the bound and the counts")
    keyfig = md.split("## Key figures")[1].split("### Key ratios")[0]
    noisy_lines = [line for line in keyfig.splitlines() if "(noisy)" in line and line.startswith("|")]
    check(len(noisy_lines) == 1 and noisy_lines[0].startswith("| `approx` |") and "| causal; threads=1 |"
          in noisy_lines[0] and "| 5 (noisy) |" in noisy_lines[0],
          f"[ci] the key-figures table marks the one noisy row, approx causal at n=512 ({noisy_lines})")

    m = summary.get("measurement", {})
    check(m.get("recorded") is True and m.get("rows") == 17 and m.get("rows_ok") == 16 and m.get("rows_with_ci") == 14
          and m.get("error_bars") == "mixed" and m.get("max_interference") == 0.08,
          f"[ci] measurement: 17 rows, 16 ok, 14 with an interval, mixed bars, threshold from the config ({m})")
    check(m.get("remeasured") == 2 and m.get("remeasured_ids") == [ids[("tiled", "none", 1, 512)],
                                                                    ids[("approx", "causal", 1, 512)]]
          and m.get("attempts") == {"1": 14, "2": 1, "3": 1},
          f"[ci] two rows re-measured, attempts 1 x 14, 2 x 1, 3 x 1 ({m.get('remeasured_ids')}, {m.get('attempts')})")
    check(m.get("noisy") == 1 and m.get("noisy_ids") == [ids[("approx", "causal", 1, 512)]],
          f"[ci] one noisy row ({m.get('noisy_ids')})")
    check(m.get("interference_rows") == 16 and m.get("interference_score_median") == 0.01
          and m.get("interference_score_max") == 0.3
          and m.get("interference_score_max_id") == ids[("approx", "causal", 1, 512)],
          f"[ci] interference score over 16 rows: median 0.01, max 0.3 at the noisy row "
          f"({m.get('interference_score_median')}, {m.get('interference_score_max')})")
    check(m.get("peak_notes") == [{"note": "not timed", "rows": 1}, {"note": CI_NOTE, "rows": 1}],
          f"[ci] why peak memory is missing, grouped ({m.get('peak_notes')})")
    cals = m.get("calibrations") or []
    check([(c["index"], c["reason"], c["used"], c["rows"], c["interference_score"]) for c in cals]
          == [(0, "start", True, 8, 0.01), (1, "interference", False, 0, 0.4), (2, "cadence", True, 8, 0.02)],
          f"[ci] three calibrations, the second unused, with the rows that divided by each ({cals})")
    check(cals and cals[1]["sgemm"] == [{"threads": 1, "gflops": 30.0}, {"threads": 2, "gflops": 50.0}],
          "[ci] each calibration's sgemm GFLOP/s per thread count")
    spread = {s["threads"]: s for s in m.get("calibration_spread", [])}
    check(sorted(spread) == [1, 2] and spread[1]["calibrations"] == 2 and spread[1]["min_gflops"] == 50.0
          and spread[1]["max_gflops"] == 52.5 and near(spread[1]["max_over_min"], 1.05)
          and near(spread[2]["max_over_min"], 100.0 / 95.0),
          f"[ci] spread over the used calibrations only: 52.5/50 and 100/95 ({spread})")
    for text in ("## Measurement conditions",
                 "- 14 of 16 measured rows have a 95% confidence interval of the median",
                 "Re-measured because of interference (attempts > 1): 2 of 17 rows (attempts: 1 × 14, 2 × 1, "
                 "3 × 1): "
                 f"`{ids[('tiled', 'none', 1, 512)]}`, `{ids[('approx', 'causal', 1, 512)]}`.",
                 "above measure.max_interference = 0.08 on every attempt; kept, marked (noisy) in the tables): 1 row: "
                 f"`{ids[('approx', 'causal', 1, 512)]}`.",
                 f"median 0.01, max 0.3 (`{ids[('approx', 'causal', 1, 512)]}`)",
                 f"Peak memory not measured: not timed (1 row); {CI_NOTE} (1 row).",
                 "| calibration | timestamp | after points | reason | used | interference score | sgemm GFLOP/s, "
                 "1 thread | sgemm GFLOP/s, 2 threads | rows |",
                 "| 0 | 2026-01-01T00:00:00Z | 0 | start | yes | 0.01 | 50.0 | 95.0 | 8 |",
                 "| 1 | 2026-01-01T00:10:00Z | 4 | interference | no | 0.4 | 30.0 | 50.0 | 0 |",
                 "| 2 | 2026-01-01T00:20:00Z | 8 | cadence | yes | 0.02 | 52.5 | 100.0 | 8 |",
                 "1 thread(s): 50.0–52.5 GFLOP/s over 2, max/min 1.050; 2 thread(s): 95.0–100.0 GFLOP/s over 2, "
                 "max/min 1.053.",
                 "bars span the 95% confidence interval of the median where the row has one",
                 "Hollow markers: the 1 noisy row(s)"):
        check(text in md, f"[ci] REPORT.md has: {text}")
    check("not recorded" not in md, "[ci] nothing said to be not recorded")
    with open(os.path.join(d, "plots", "time_vs_seq.svg"), encoding="utf-8") as f:
        svg = f.read()
    check("bars 95% CI of the median, else p10–p90" in svg and "hollow: noisy" in svg,
          "[ci] the time figure's axis names the interval bars and its legend the hollow noisy marker")
    bars = time_error_bars(d)

    def bar_is(key, lo, hi):
        got = bars.get(key, {}).get("512")
        return got is not None and near(got[0], lo) and near(got[1], hi)

    check(bar_is("mask=none\nthreads=1|tiled", 3.9, 4.1)
          and bar_is("mask=causal\nthreads=1|naive", 6.0 * 0.98, 6.0 * 1.02),
          f"[ci] the time figure's bars: the interval of the median (tiled: 3.9-4.1), p10-p90 where a row has "
          f"none (naive causal) ({bars})")
    check_stages("ci", d, summary, md)


# Draws the time figure of argv[2] (scripts folder argv[1]) and prints its error bars as JSON:
# {"<axes title>|<series>": {"<n>": [low end, high end]}}.
TIME_BARS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from plotlib.results import Results
from plotlib.analysis import analyse
from plotlib import figures
from matplotlib.container import ErrorbarContainer
res = Results(sys.argv[2])
fig = figures.fig_time(res, analyse(res))
out = {}
for ax in fig.axes:
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            segs = c.lines[2][0].get_segments()
            out[ax.get_title() + "|" + c.get_label().split()[0]] = {
                f"{seg[0][0]:g}": [float(seg[0][1]), float(seg[1][1])] for seg in segs}
print(json.dumps(out))
"""


def time_error_bars(results_dir):
    r = subprocess.run([sys.executable, "-c", TIME_BARS, SCRIPTS, results_dir], capture_output=True, text=True,
                       timeout=300, cwd=tempfile.gettempdir())
    if not check(r.returncode == 0, f"the time figure's error bars are read back (rc {r.returncode}: "
                                    f"{r.stderr.strip()[-500:]})"):
        return {}
    return json.loads(r.stdout)


def test_paired(tmp):
    """Interleaved rows: rows timed in one group pair their samples round by round, so a drift during the
    group cancels. naive at 1 and 2 threads and tiled at n = 512 in one group, every sample 10% slower than the
    round before: naive 2 threads is 0.95x naive 1 thread in every round (+-0.5%, alternating), tiled 0.4x
    (+-1%). Each row's own interval spans the drift (about +-30%), so from the medians 0.95 would not be
    significant; paired it is. A row of another group (causal) is compared from the medians."""
    d = os.path.join(tmp, "paired")
    group = "naive:B=1,H=1,Lq=512,Lkv=512,D=16,none,gaussian(std=1),T=1"
    rounds = 9

    def drifted(factor, wobble):
        return [10.0 * (1 + 0.1 * r) * factor * (1 + wobble * (-1) ** r) for r in range(rounds)]

    def interval(xs):
        x = sorted(xs)
        return x[1], x[7]  # [x(2), x(8)] of 9: the 95% interval of the median (coverage 0.961)

    rows = []
    for position, (variant, threads, samples, params) in enumerate(
            [("naive", 1, drifted(1.0, 0.0), {}), ("naive", 2, drifted(0.95, 0.005), {}),
             ("tiled", 1, drifted(0.4, 0.01), {"tile": 64})]):
        samples_sorted = sorted(samples)
        r = ci_row(variant, 512, "none", threads, samples_sorted[4], interval(samples), params)
        r["time_ms"].update(reps=rounds, samples=samples)
        r["interleave"] = {"group": group, "points": 3, "position": position, "rounds": rounds}
        rows.append(r)
    for variant, median, params in (("naive", 6.0, {}), ("tiled", 2.5, {"tile": 64})):
        r = ci_row(variant, 512, "causal", 1, median, (median * 0.98, median * 1.02), params)
        r["interleave"] = {"group": "another", "points": 2, "position": 0, "rounds": 12}
        r["time_ms"]["samples"] = [median * (1 + 0.01 * k) for k in range(12)]  # not the rows' pairing: medians
        rows.append(r)
    rows[-1]["interleave"]["group"] = "a third"  # the two causal rows were not timed together
    write_rows(d, rows)
    r = run_plot(d)
    if not check(r.returncode == 0, f"[paired] plot.py exits 0 (got {r.returncode}: {r.stderr.strip()[-500:]})"):
        return
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        kr = json.load(f).get("key_ratios", {})
    with open(os.path.join(d, "REPORT.md"), encoding="utf-8") as f:
        md = f.read()
    by = {(e["kind"], e["a"]["series"], e["mask"]): e for e in kr.get("rows", [])}
    e = by.get(("threads", "naive", "none"), {})
    check(e.get("method") == "paired" and e.get("pairs") == 9 and abs(e.get("ratio", 0) - 0.95 * 1.005) < 1e-9
          and abs(e["interval"][0] - 0.95 * 0.995) < 1e-9 and abs(e["interval"][1] - 0.95 * 1.005) < 1e-9
          and e.get("significant") == "yes",
          f"[paired] naive 2 vs 1 threads: the median of 9 paired ratios (5 at 0.95 x 1.005, 4 at 0.95 x 0.995), "
          f"interval [x(2), x(8)], significant ({e})")
    a, b = rows[1]["time_ms"], rows[0]["time_ms"]
    check(a["ci_lo"] < b["ci_hi"] and b["ci_lo"] < a["ci_hi"],
          "[paired] (the rows' own intervals overlap: from the medians it would not be significant)")
    e = by.get(("variants", "tiled", "none"), {})
    check(e.get("method") == "paired" and abs(e.get("ratio", 0) - 0.4 * 1.01) < 1e-9 and e.get("significant") == "yes",
          f"[paired] tiled vs naive at 1 thread: paired, 0.404 ({e})")
    e = by.get(("variants", "tiled", "causal"), {})
    check(e.get("method") == "medians" and e.get("pairs") is None and abs(e.get("ratio", 0) - 2.5 / 6) < 1e-9,
          f"[paired] tiled vs naive causal, timed in different groups: from the medians ({e})")
    check("| paired, 9 rounds | yes |" in md and "| medians |" in md,
          "[paired] REPORT.md's Key ratios says where each interval comes from")


def test_measurement_odd_values(tmp):
    """The measurement-condition fields with values the C++ side never writes (strings for numbers, an inverted interval,
    non-finite scores, junk calibrations, a non-numeric threshold): read as missing or defaults, no crash."""
    d = os.path.join(tmp, "ci-odd")
    rows = ci_results(d)
    ids = {(r["variant"], r["mask"], r["threads"], r["seq_kv"]): i for i, r in enumerate(rows)}
    rows[ids[("naive", "none", 1, 256)]]["time_ms"].update(ci_lo="nan", ci_hi=None, samples=None, ci_level="x")
    rows[ids[("tiled", "none", 1, 256)]].update(interference="weird", noisy="yes", calibration=1.5)
    rows[ids[("tiled", "none", 1, 512)]]["attempts"] = "2"  # the re-measured row
    rows[ids[("approx", "none", 1, 256)]]["interference"] = {"score": "inf"}
    rows[ids[("approx", "none", 1, 256)]]["memory"]["peak_note"] = None
    rows[ids[("tiled", "causal", 1, 256)]]["time_ms"].update(ci_lo=5.0, ci_hi=1.0)  # inverted: not an interval
    with open(os.path.join(d, "results.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    with open(os.path.join(d, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    meta["calibrations"] = [{"index": 0, "sgemm": "x"}, "junk", {"sgemm": [{"threads": "1", "gflops": 3},
                                                                           {"threads": 2, "gflops": 0}]}, {}]
    meta["config"]["measure"] = {"max_interference": "high"}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    st = run_stages(d, figures=False)
    if st is None:
        return
    m = st["analysis"]["measurement"]
    check(m["rows_with_ci"] == 12 and m["max_interference"] == 0.05,
          f"[ci odd] a 'nan' and an inverted interval are no interval; a bad threshold is the default 0.05 ({m})")
    check(m["attempts"] == {"1": 15, "3": 1} and m["remeasured"] == 1 and m["noisy"] == 1
          and m["interference_rows"] == 15 and m["interference_score_max"] == "inf",
          "[ci odd] attempts '2' and noisy 'yes' read as defaults, interference 'weird' as none; an 'inf' score "
          f"is the max, written 'inf' ({m['attempts']}, {m['interference_score_max']})")
    check([c["rows"] for c in m["calibrations"]] == [7, 0, 8] and m["calibration_spread"] == [],
          f"[ci odd] junk calibrations are skipped, none has a usable sgemm ({m['calibrations']})")
    check("## Measurement conditions" in st["report_no_figures"], "[ci odd] the report has its section")


def test_roofline(tmp):
    """A decode-like sweep with bytes, kv_heads and a bandwidth calibration at 1 and 2 threads: one roofline panel
    per thread count with both ceilings, points at intensity flops / bytes, the best frac_bandwidth and
    frac_sgemm per variant and where; facets by kv_heads. The same rows with a meta.json lacking
    memory_bandwidth still plot, and the report says what is missing."""
    bw = {1: 20.0, 2: 32.0}
    sg = {1: 50.0, 2: 100.0}
    rows = []
    for t in (1, 2):
        for kv in (8, 2, 1):
            for n in (1024, 4096):
                # naive streams at half the bandwidth, tiled at 80% (time = bytes / rate)
                for variant, frac in (("naive", 0.5), ("tiled", 0.8)):
                    r = roofline_row(variant, kv, 4, n, t, 1.0)
                    r["time_ms"]["median"] = r["bytes"] / (frac * bw[t] * 1e6)
                    r = roofline_row(variant, kv, 4, n, t, r["time_ms"]["median"])
                    r["frac_bandwidth"] = r["gbytes_per_s"] / bw[t]
                    r["frac_sgemm"] = r["gflops"] / sg[t]
                    rows.append(r)
    meta = {"config_name": "decode", "config": {"name": "decode"},
            "sgemm_calibration": [{"threads": t, "gflops": g, "size": 2048, "cv": 0.01} for t, g in sg.items()],
            "memory_bandwidth": {str(t): {"gbytes_per_s": g, "median": g * 0.95, "buffer_bytes": 1 << 31}
                                 for t, g in bw.items()},
            "system": {"cpu_model": "Roofline Test CPU 9000", "cores_available": 2}}
    d = os.path.join(tmp, "roofline")
    write_rows(d, rows)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    r = run_plot(d)
    if not check(r.returncode == 0, f"[roofline] plot.py exits 0 (got {r.returncode}: {r.stderr.strip()[-500:]})"):
        return
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with open(os.path.join(d, "REPORT.md"), encoding="utf-8") as f:
        md = f.read()
    roof = summary["roofline"]
    check([p["threads"] for p in roof["panels"]] == [1, 2], "[roofline] one panel per thread count")
    p2 = roof["panels"][1] if len(roof["panels"]) == 2 else {}
    check(p2.get("sgemm_gflops") == 100.0 and p2.get("bandwidth_gbytes_per_s") == 32.0
          and abs(p2.get("ridge_intensity", 0) - 100.0 / 32.0) < 1e-12,
          "[roofline] each panel has the run's sgemm and bandwidth ceilings and their ridge")
    pts = p2.get("points", [])
    check(len(pts) == 12 and all(abs(q["intensity"] - 4.0 * 8 * 64 * 4 * q["seq_kv"]
                                     / (4.0 * (2 * 8 * 4 * 64 + 2 * q["kv_heads"] * q["seq_kv"] * 64))) < 1e-9
                                 for q in pts), "[roofline] intensity = flops / bytes for every point")
    ridge = 100.0 / 32.0
    check(all(q["bound"] == ("memory" if q["intensity"] < ridge else "compute") for q in pts)
          and all(q["bound"] == "memory" for q in pts if q["kv_heads"] == 8),
          "[roofline] points left of the ridge are memory-bound (every MHA decode point), right of it compute-bound")
    check(sorted({q["kv_heads"] for q in pts}) == [1, 2, 8], "[roofline] points carry kv_heads")
    best = {b["variant"]: b for b in roof["best"]}
    check(abs((best.get("tiled", {}).get("best_frac_bandwidth") or 0) - 0.8) < 1e-9
          and abs((best.get("naive", {}).get("best_frac_bandwidth") or 0) - 0.5) < 1e-9,
          "[roofline] best frac_bandwidth per variant (0.8 tiled, 0.5 naive)")
    check(",Hkv=1," in (best.get("tiled", {}).get("at_sgemm") or ""),
          "[roofline] best frac_sgemm at the highest intensity (MQA, kv_heads=1)")
    check(roof["missing"] == [], "[roofline] nothing missing")
    png = os.path.join(d, "plots", "roofline.png")
    check(os.path.isfile(png) and os.path.getsize(png) > 10000, "[roofline] roofline.png is drawn")
    check("plots/roofline.png" in summary["files"] and "plots/roofline.svg" in summary["files"],
          "[roofline] summary.json lists the roofline figure")
    with open(os.path.join(d, "plots", "roofline.svg"), encoding="utf-8") as f:
        svg = f.read()
    check("Roofline Test CPU 9000" in svg, "[roofline] the figure's title names the CPU")
    check("## Roofline" in md and "| variant | rows | best × bandwidth |" in md and "| `tiled` | 12 | 0.80 |" in md,
          "[roofline] REPORT.md has the Roofline table with the best frac_bandwidth")
    check("2 thread(s): sgemm 100.0 GFLOP/s (the median of the rows' own sgemm, 0 of 12 timed in their rounds; "
          "range 100.0–100.0), memory bandwidth 32.0 GB/s, ridge at 3.1 FLOP/byte" in md,
          "[roofline] REPORT.md gives each panel's ceilings")
    check("](plots/roofline.png)" in md and "memory bandwidth, 2 thread(s) | 32.0 GB/s" in md,
          "[roofline] REPORT.md embeds the figure and lists the bandwidth calibration under Machine")
    contexts = {f["context"] for f in summary["fits"]}
    check("kv_heads=2, threads=1" in contexts and "threads=1" in contexts,
          f"[roofline] grouped-query rows get their own facet, MHA rows none ({sorted(contexts)})")
    check_stages("roofline", d, summary, md)

    # The ceiling is the sgemm each row was divided by, not the run's first calibration: at 2 threads, half
    # the rows carry the sgemm timed in their rounds (80 GFLOP/s), the others name calibration 1 (60 GFLOP/s).
    d3 = os.path.join(tmp, "roofline-own")
    own_rows, k = [], 0
    for r in rows:
        r = json.loads(json.dumps(r))
        if r["threads"] == 2:
            if k % 2 == 0:
                r["group_sgemm"] = {"gflops": 80.0, "reps": 9, "frac_ci_lo": 0.25, "frac_ci_hi": 0.75}
            else:
                r["calibration"] = 1
            k += 1
        own_rows.append(r)
    write_rows(d3, own_rows)
    meta3 = dict(meta, calibrations=[{"index": 0, "sgemm": [{"threads": 1, "gflops": 50.0}, {"threads": 2, "gflops": 100.0}]},
                                     {"index": 1, "sgemm": [{"threads": 1, "gflops": 50.0}, {"threads": 2, "gflops": 60.0}]}])
    with open(os.path.join(d3, "meta.json"), "w") as f:
        json.dump(meta3, f)
    r = run_plot(d3)
    if check(r.returncode == 0, f"[roofline, own sgemm] plot.py exits 0 ({r.stderr.strip()[-500:]})"):
        with open(os.path.join(d3, "summary.json"), encoding="utf-8") as f:
            p2 = json.load(f)["roofline"]["panels"][1]
        with open(os.path.join(d3, "REPORT.md"), encoding="utf-8") as f:
            md3 = f.read()
        check(p2["sgemm_gflops"] == 70.0 and p2["sgemm_gflops_range"] == [60.0, 80.0]
              and p2["sgemm_in_group_rows"] == 6,
              f"[roofline, own sgemm] the panel's ceiling is the median of the rows' own sgemm, with its range ({p2})")
        check(sorted({q["sgemm_gflops"] for q in p2["points"]}) == [60.0, 80.0],
              "[roofline, own sgemm] each point carries the sgemm it was divided by")
        check("2 thread(s): sgemm 70.0 GFLOP/s (the median of the rows' own sgemm, 6 of 12 timed in their rounds; "
              "range 60.0–80.0)" in md3, "[roofline, own sgemm] REPORT.md names the median and range")
        check(" [0.25, 0.75] |" in md3,
              "[roofline, own sgemm] Key figures give frac_sgemm's interval where the row has one")

    # The same rows, meta.json without memory_bandwidth: still plotted, the report says what is missing.
    d2 = os.path.join(tmp, "roofline-nobw")
    write_rows(d2, [dict(r, frac_bandwidth=None) for r in rows])
    with open(os.path.join(d2, "meta.json"), "w") as f:
        json.dump({k: v for k, v in meta.items() if k != "memory_bandwidth"}, f)
    r = run_plot(d2)
    if not check(r.returncode == 0, f"[roofline, no bandwidth] plot.py exits 0 ({r.stderr.strip()[-500:]})"):
        return
    with open(os.path.join(d2, "REPORT.md"), encoding="utf-8") as f:
        md2 = f.read()
    check("meta.json has no `memory_bandwidth` calibration" in md2,
          "[roofline, no bandwidth] the Roofline section says the bandwidth calibration is missing")
    check(os.path.isfile(os.path.join(d2, "plots", "roofline.png")),
          "[roofline, no bandwidth] the figure is still drawn (sgemm ceiling only)")


def pass_row(variant, n, p, time_ms, exact, grad=None, peak=None, status="ok", reason="", samples=None):
    """A row of pass p in the schema of attnbench's: the forward's flops 4 n^2 d, the backward's 2.5x, the
    training step's 3.5x; frac_peak against a 100 GFLOP/s peak; grad_accuracy (reference, blocks, {part:
    rel_l2_err}) on backward rows, reference none on forward ones. Forward rows are written without `pass`, as
    before the field: they must read as forward rows."""
    r = row(variant, n, time_ms, exact, 1e-7 if exact else 0.1, status=status, reason=reason, peak=peak)
    if p != "forward":
        r.update(id=r["id"] + f",pass={p}", **{"pass": p})
    ref, blocks, errs = grad or ("none", 0, {})
    r["grad_accuracy"] = {"reference": ref, "blocks": blocks,
                          **{part: {"max_abs_err": errs[part] * 2 if part in errs else None,
                                    "rel_l2_err": errs.get(part), "nan_count": 0 if part in errs else None,
                                    "inf_count": 0 if part in errs else None} for part in ("dq", "dk", "dv")}}
    if status == "ok":
        flops = 4.0 * n * n * 16 * {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}[p]
        r.update(flops=flops, gflops=flops / (time_ms * 1e6), frac_peak=flops / (time_ms * 1e6) / 100.0)
        if samples:
            r["time_ms"].update(reps=len(samples), samples=samples)
            r["interleave"] = {"group": f"{variant}:{n}", "points": 3, "position": 0, "rounds": len(samples)}
    return r


# Draws the time and memory figures of a results folder (argv: scripts folder, results folder) and prints, per
# panel, its title, y label, whether it shares its y axis with the panel before, and its labelled lines.
FIGURE_PANELS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from plotlib.results import Results
from plotlib.analysis import analyse
from plotlib import figures
res = Results(sys.argv[2])
an = analyse(res)
out = {}
for stem in ("time_vs_seq", "memory_vs_seq"):
    fig = figures.FIGURE_FUNCTIONS[stem](res, an)
    panels, prev = [], None
    for ax in fig.axes:
        lines = {}
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                lines[line.get_label()] = [[float(x), float(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]
        for c in ax.containers:  # the time figure's error bars: label -> (n, median)
            if c.get_label() and not c.get_label().startswith("_"):
                x, y = c.lines[0].get_data()
                lines[c.get_label()] = [[float(a), float(b)] for a, b in zip(x, y)]
        panels.append({"title": ax.get_title(), "ylabel": ax.get_ylabel(), "lines": lines,
                       "shares_y_with_previous": bool(prev is not None and ax.get_shared_y_axes().joined(ax, prev))})
        prev = ax
    out[stem] = {"suptitle": fig._suptitle.get_text() if fig._suptitle else "", "panels": panels}
print(json.dumps(out))
"""


def test_passes(tmp):
    """Forward, backward and training-step rows with known answers. exact_sq: forward 1e-5 n^2 ms, backward
    2.5x, training step 3.5x; approx: forward 1.6e-4 n^1.5 (crosses exact_sq at n = 256, as in test_synthetic),
    backward 64 x 2.5e-5 n^1.5 (crosses at 4096: never within the sizes) and training step 32 x 3.5e-5 n^1.5
    (crosses at n = 1024, between 800 and 1600); fwd_only has a forward and no backward (its 12 backward points
    skipped: listed once). Gradient errors: exact_sq dK 3e-7 worst (full), approx dQ 0.2 (sampled, 2 blocks).
    exact_sq's passes are interleaved with 7 samples each, the backward's 2.5x the forward's in every round."""
    d = os.path.join(tmp, "passes")
    ns = [100, 200, 400, 800, 1600, 3200]
    rows = []
    for n in ns:
        t = 1e-5 * n ** 2
        spread = [1 + 0.01 * (k - 3) for k in range(7)]
        for p, f, peak in (("forward", 1.0, 64 * n * n), ("backward", 2.5, 128 * n * n),
                           ("forward_backward", 3.5, 160 * n * n)):
            grad = None if p == "forward" else ("full", 1, {"dq": 1e-7, "dk": 3e-7, "dv": 2e-7})
            rows.append(pass_row("exact_sq", n, p, f * t, True, grad, peak=peak, samples=[f * t * x for x in spread]))
        a = 1.6e-4 * n ** 1.5
        grad = ("sampled", 2, {"dq": 0.2, "dk": 0.1, "dv": 0.05})
        rows.append(pass_row("approx", n, "forward", a, False, peak=64 * n))
        rows.append(pass_row("approx", n, "backward", 64 * 2.5e-5 * n ** 1.5, False, grad, peak=128 * n))
        rows.append(pass_row("approx", n, "forward_backward", 32 * 3.5e-5 * n ** 1.5, False, grad,
                             peak=160 * n))
        rows.append(pass_row("fwd_only", n, "forward", 0.5 * a, False, peak=32 * n))
        for p in ("backward", "forward_backward"):
            rows.append(pass_row("fwd_only", n, p, 0, False, status="skipped", reason="fwd_only has no backward pass"))
    write_rows(d, rows)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"config_name": "passes", "system": {"cpu_model": "synthetic CPU", "cores_available": 1},
                   "sgemm_calibration": [{"threads": 1, "gflops": 50.0, "size": 2048, "cv": 0.01}]}, f)
    r = run_plot(d)
    if not check(r.returncode == 0, f"plot.py on rows of three passes exits 0 (got {r.returncode}: {r.stderr.strip()[-500:]})"):
        return
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with open(os.path.join(d, "REPORT.md"), encoding="utf-8") as f:
        md = f.read()

    # Curves: one per series and pass, each over its 6 sizes with its own exponent.
    fits = {(f["series"], f["context"]): f for f in summary["fits"]}
    check(sorted(fits) == sorted([(v, f"pass={p}") for v in ("exact_sq", "approx")
                                  for p in ("forward", "backward", "forward_backward")] + [("fwd_only", "pass=forward")]),
          f"one series per variant and pass ({sorted(fits)})")
    check(all(f["points"] == 6 for f in fits.values()), "every series has its own 6 sizes (no pass joins another's)")
    check(all(abs(fits[(v, f"pass={p}")]["exponent"] - k) < 0.01 for v, k in (("exact_sq", 2.0), ("approx", 1.5))
              for p in ("forward", "backward", "forward_backward")),
          "each pass's fitted exponent is its own (exact_sq 2.00, approx 1.50)")

    # The crossover: inference as before, the training column beside it, the backward in summary.json.
    cross = {c["series"]: c for c in summary["crossover"]}
    c = cross.get("approx", {})
    check(abs((c.get("faster_from_n") or 0) - 256) < 0.5 and c.get("context") == "",
          f"inference crossover of approx at n = 256, one entry for its passes (got {c.get('faster_from_n')})")
    t = c.get("training", {})
    check(abs((t.get("faster_from_n") or 0) - 1024) < 0.5 and t.get("faster") == "n ≈ 1024 (between 800 and 1600)",
          f"training crossover of approx at n = 1024 (got {t})")
    check(abs(t.get("speedup_at_max_n", 0) - 1 / (32 * 3.5e-5 * 3200 ** 1.5 / (3.5e-5 * 3200 ** 2))) < 1e-9,
          "training speed-up at max n: exact_sq's step time over approx's at 3200")
    check(c.get("backward", {}).get("faster") == "never within measured range",
          f"backward crossover of approx: never (4096 > 3200) ({c.get('backward')})")
    check(cross.get("fwd_only", {}).get("training", {}).get("faster") == "— (skipped: fwd_only has no backward pass)",
          f"fwd_only's training crossover gives the reason ({cross.get('fwd_only', {}).get('training')})")
    sec = md.split("## Crossover")[-1].split("\n## ")[0]
    check("| inference (forward): faster than best exact from | speed-up at max n | training (fwd+bwd): faster than "
          "best exact from | training speed-up at max n |" in sec, "the crossover table has the training column")
    check("| `approx` | none | 100–3200 | n ≈ 256 (between 200 and 400) | " in sec
          and "| n ≈ 1024 (between 800 and 1600) | " in sec, "the approx row: n ≈ 256 inference, n ≈ 1024 training")

    # The training section.
    tr = summary.get("training") or {}
    check(tr.get("passes") == ["forward", "backward", "forward_backward"] and len(tr.get("rows", [])) == 12,
          f"summary.json training: the 3 passes, a row per series with a backward and n (got {len(tr.get('rows', []))})")
    check(tr.get("flops_ratio", {}).get("backward", {}).get("median") == 2.5
          and tr["flops_ratio"].get("forward_backward", {}).get("median") == 3.5, "the FLOP ratios 2.5 and 3.5")
    sec = md.split("## Training (forward + backward)")[-1].split("\n## ")[0]
    check("## Training (forward + backward)" in md and md.index("## Training") > md.index("## Crossover"),
          "REPORT.md has the Training section after the crossover")
    # exact_sq at 400: 1.6, 4, 5.6 ms; 6.4 GFLOP/s (0.064 of the peak) each; paired ratio 2.5 in every round;
    # peaks 64, 128, 160 n^2 bytes = 9.77, 19.5, 24.4 MiB.
    check("| `exact_sq` | none | 400 | 1.6 | 6.4 (0.06) | 4 | 6.4 (0.06) | 5.6 | 6.4 (0.06) | 2.50× [2.50, 2.50] | "
          "3.00e-07 (dK; full) | 9.77 MiB / 19.5 MiB / 24.4 MiB |" in sec,
          "the training row of exact_sq at n=400: times, GFLOP/s (× peak), paired bwd/fwd, gradient error, memory")
    check("| `approx` | none | 3200 | " in sec and "| 2.00e-01 (dQ; sampled, 2 blocks) | " in sec,
          "approx's gradient error: the worst of dQ, dK, dV with its reference")
    check("FLOPs: each pass counts its own" in sec and "backward 2.50× the forward's at all 12 points" in sec,
          "the FLOP convention is stated, with the ratio measured")
    check(sec.count("fwd_only has no backward pass") == 1 and "`fwd_only` (skipped): fwd_only has no backward pass "
          "(12 points: backward (dQ, dK, dV), forward + backward (training step); n = 100, 200, 400, 800, 1600, 3200)"
          in sec, "the skipped backward points are listed once per variant")
    check("`fwd_only` | none | " not in sec, "a variant without a backward has no training row")
    kr = summary["key_ratios"]
    check(kr["counts"].get("pass") == 4 and any(e["kind"] == "pass" and e["method"] == "paired"
                                                and e["ratio"] == 2.5 for e in kr["rows"]),
          f"key ratios: backward and step vs forward per series, paired for exact_sq ({kr['counts']})")
    check("| `exact_sq` | — | none; pass=backward | yes | 2.00 (n=100–3200) |" in md,
          "the key figures have a row per series and pass, naming the pass")

    # The figures: one column per pass (sharing y) and the ratio column; no curve mixes passes.
    r = subprocess.run([sys.executable, "-c", FIGURE_PANELS, SCRIPTS, d], capture_output=True, text=True,
                       timeout=300, cwd=tempfile.gettempdir())
    if not check(r.returncode == 0, f"the figures' panels are read back (rc {r.returncode}: {r.stderr.strip()[-500:]})"):
        return
    figs = json.loads(r.stdout)
    tp = figs["time_vs_seq"]["panels"]
    check([p["title"].split("\n")[0] for p in tp] == ["forward", "backward (dQ, dK, dV)",
                                                      "forward + backward (training step)", "time ÷ forward time, same point"],
          f"time figure: forward, backward, training step side by side, then the ratio ({[p['title'] for p in tp]})")
    check("synthetic CPU" in figs["time_vs_seq"]["suptitle"] and "one column per pass" in figs["time_vs_seq"]["suptitle"],
          f"the time figure's title names the CPU and the passes ({figs['time_vs_seq']['suptitle']!r})")
    check([p["shares_y_with_previous"] for p in tp] == [False, True, True, False],
          "the three pass panels share their time axis, the ratio panel has its own")
    def series_in(panel):
        return sorted(label.split()[0] for label in panel["lines"] if "$n^" in label)
    check(series_in(tp[0]) == ["approx", "exact_sq", "fwd_only"] and series_in(tp[1]) == ["approx", "exact_sq"]
          and series_in(tp[2]) == ["approx", "exact_sq"], "fwd_only is drawn in the forward panel only")
    fwd = next(v for k, v in tp[0]["lines"].items() if k.startswith("exact_sq"))
    bwd = next(v for k, v in tp[1]["lines"].items() if k.startswith("exact_sq"))
    check(len(fwd) == 6 and len(bwd) == 6 and all(abs(b[1] / f[1] - 2.5) < 1e-9 for f, b in zip(fwd, bwd)),
          "exact_sq's forward and backward curves have 6 points each, the backward's 2.5x the forward's")
    ratio = tp[3]["lines"].get("exact_sq: backward ÷ forward", [])
    check(len(ratio) == 6 and all(abs(y - 2.5) < 1e-9 for _, y in ratio) and "time ratio" in tp[3]["ylabel"],
          f"the ratio panel draws exact_sq's backward / forward = 2.5 at every n ({ratio})")
    mp = figs["memory_vs_seq"]["panels"]
    check(len(mp) == 3 and [p["shares_y_with_previous"] for p in mp] == [False, True, True]
          and "bytes" in mp[0]["ylabel"], "memory figure: one panel per pass on one memory axis, in bytes")
    peaks = mp[1]["lines"].get("exact_sq measured", [])
    check(len(peaks) == 6 and all(y == 128 * x * x for x, y in peaks), "the backward panel draws the backward's peak")
    check_stages("passes", d, summary, md)


def test_errors(tmp):
    missing = os.path.join(tmp, "does-not-exist")
    r = run_plot(missing)
    check(r.returncode != 0 and missing in r.stderr and "does not exist" in r.stderr,
          f"missing RESULTS_DIR: non-zero exit naming the folder (rc {r.returncode}, stderr {r.stderr.strip()!r})")
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    r = run_plot(empty)
    check(r.returncode != 0 and "results.jsonl" in r.stderr, f"folder without results.jsonl: clear error ({r.stderr.strip()!r})")
    check(not os.path.exists(os.path.join(empty, "REPORT.md")), "nothing written on error")
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    with open(os.path.join(bad, "results.jsonl"), "w") as f:
        f.write("not json\n" + json.dumps(row("exact_sq", 128, 1.0, True, 1e-7)) + "\n")
    r = run_plot(bad)
    check(r.returncode != 0 and "results.jsonl:1" in r.stderr, f"a bad line names file:line ({r.stderr.strip()!r})")


def test_peer(tmp):
    """The PyTorch peer runner: without torch it says so and exits 0; with torch its rows have the sweep's
    schema, exact accuracy, and plot.py draws them."""
    cfg = os.path.join(tmp, "peer.json")
    with open(cfg, "w") as f:
        json.dump({"name": "peer", "sweep": {"batch": 2, "heads": 1, "head_dim": 4, "seq_len": [8, 16],
                                              "mask": ["none", "causal", "pad=0.25"], "threads": 1},
                   "measure": {"warmup": 0, "min_reps": 1, "max_reps": 2, "min_time_s": 0, "max_time_s": 1},
                   "accuracy": {"reference": "full"}, "memory_budget": "1GiB", "seed": 5}, f)
    out = os.path.join(tmp, "peer-out")
    hide_torch = "import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; " \
                 "runpy.run_path(sys.argv[0], run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", hide_torch, PEER, cfg, "--out", out], capture_output=True, text=True,
                       timeout=120)
    check(r.returncode == 0 and r.stdout.startswith("torch not available:") and not os.path.exists(out),
          f"peer runner without torch: 'torch not available: ...', exit 0, nothing written (rc {r.returncode}, "
          f"{r.stdout.strip()!r} {r.stderr.strip()[-300:]!r})")
    with open(cfg.replace("peer.json", "bad.json"), "w") as f:
        json.dump({"name": "peer", "sweep": {"seq_len": [8], "mask": "causl"}}, f)
    r = subprocess.run([sys.executable, PEER, cfg.replace("peer.json", "bad.json")], capture_output=True, text=True,
                       timeout=120)
    check(r.returncode == 2 and "sweep.mask" in r.stderr and "causl" in r.stderr,
          f"peer runner on a bad config names the JSON path ({r.stderr.strip()!r})")
    try:
        import torch  # noqa: F401
    except ImportError:
        say("skip  peer runner with torch (python3-torch not installed)")
        return
    r = subprocess.run([sys.executable, PEER, cfg, "--out", out], capture_output=True, text=True, timeout=600)
    if not check(r.returncode == 0, f"peer runner exits 0 (rc {r.returncode}: {r.stderr.strip()[-500:]})"):
        return
    rows = [json.loads(line) for line in open(os.path.join(out, "results.peers.jsonl"))]
    check(len(rows) == 6 and all(r["status"] == "ok" and r["variant"] == "torch_naive" and r["id"].startswith("peer/")
                                 for r in rows), "peer runner writes 6 ok torch_naive rows with 'peer/' ids")
    keys = {"id", "variant", "params", "batch", "heads", "seq_q", "seq_kv", "head_dim", "mask", "regime", "threads",
            "exact", "status", "reason", "time_ms", "flops", "gflops", "memory", "accuracy"}
    check(all(keys <= set(r) for r in rows), "peer rows carry the sweep's fields")
    def pairs(r):  # attended (query, key) pairs: the lower triangle when causal (common/kernels/mask.hpp causal_pairs)
        q, kv = r["seq_q"], r["seq_kv"]
        return sum(min(i + 1, kv) for i in range(q)) if r["mask"] == "causal" else q * kv
    check(all(r["accuracy"]["rel_l2_err"] < 1e-5 and r["flops"] == 4.0 * 2 * 1 * pairs(r) * 4 for r in rows),
          "peer rows: exact accuracy against fp64, flops = 4 B H d x attended pairs (as attnbench's exact variants)")
    check(all("frac_peak" in r and "frac_sgemm" in r for r in rows), "peer rows carry frac_sgemm and frac_peak")
    check({r["mask"] for r in rows} == {"none", "causal", "pad=0.25"}, "peer rows use the sweep's mask labels")
    # plot.py reads the peer rows next to attnbench's (here a results.jsonl of one exact row per point).
    with open(os.path.join(out, "results.jsonl"), "w") as f:
        for p in rows:
            f.write(json.dumps(row("naive", p["seq_kv"], 0.01 * p["seq_kv"], True, 1e-7, mask=p["mask"])
                               | {"batch": 2, "head_dim": 4}) + "\n")
    r = run_plot(out)
    with open(os.path.join(out, "REPORT.md"), encoding="utf-8") as f:
        check(r.returncode == 0 and "`torch_naive` (PyTorch)" in f.read(), "plot.py puts the peer rows in the report")


def run_case(case, tmp):
    """case(tmp) with its output lines collected; an exception is a failure, not a crash of the others."""
    _case.lines = []
    try:
        case(tmp)
    except Exception as e:  # noqa: BLE001 (report it with the case's lines)
        check(False, f"{case.__name__} raised {type(e).__name__}: {e}")
    return _case.lines


def run_file(prefix, cases):
    """main() of a test file built on this one, run as `/usr/bin/python3 FILE --attnbench PATH`: the path in
    os.environ["ATTNBENCH"] (for the cases that run the binary), 77 (skip) without numpy or matplotlib, each
    case(tmp) in turn in one temporary folder named with prefix (an exception fails that case, the others still
    run); 0 when every check passed, else 1."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", help="path of the attnbench binary (for the cases that run it)")
    a = ap.parse_args()
    if a.attnbench:
        os.environ["ATTNBENCH"] = os.path.abspath(a.attnbench)
    try:
        import numpy  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (install python3-numpy python3-matplotlib)")
        return 77
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        for case in cases:
            print(f"--    {case.__name__}")
            for line in run_case(case, tmp):
                print(line)
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", help="path of the attnbench binary (plot.py reads files only; the PyTorch "
                                        "peer takes its plan and inputs from it)")
    a = ap.parse_args()
    if a.attnbench:  # the peer runs on the binary under test (e.g. the ASan build), not build/release's
        os.environ["ATTNBENCH"] = os.path.abspath(a.attnbench)
    try:
        import numpy  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (install python3-numpy python3-matplotlib)")
        return 77
    cases = [test_fixture, test_synthetic, test_never_and_always, test_isa, test_dtype, test_many_facets,
             test_cross_attention, test_measurement, test_paired, test_measurement_odd_values, test_roofline, test_errors,
             test_peer, test_lra, test_passes, test_terminal_summary]
    with tempfile.TemporaryDirectory(prefix="attnbench-test-plot-") as tmp:
        # Longest first: the fixture's and the peer's plot.py runs take most of the time.
        order = [test_fixture, test_peer] + [c for c in cases if c not in (test_fixture, test_peer)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            done = {case: pool.submit(run_case, case, tmp) for case in order}
        for case in cases:
            print(f"--    {case.__name__}")
            for line in done[case].result():
                print(line)
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
