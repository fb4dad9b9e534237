#!/usr/bin/python3
"""scripts/plot.py on a sweep over storage dtypes (sweep.dtype), synthetic with known answers: the speed-up and
error figure (plots/dtype_vs_fp32) and the analysis behind it (summary.json dtype_vs_fp32).

- naive, no parameters: fp32 at 1e-5 n² ms, bf16 at 1.25e-5 n²: a speed-up of 0.8 (slower) at every n; at
  n = 1024 both were timed in one interleaved group with per-round ratios 1.1 ... 1.4 (median 1.25, while the
  medians' ratio is 10 / 8.4): the paired median 1.25 with the 7 rounds' [min, max] as its 95% interval;
- tiled, bf16_kernel native and widen (a parameter that varies: one series each, "tiled(bf16_kernel=native)
  [bf16]"): fp32 native at 5e-6 n², fp32 widen at 5.5e-6 n² (the same computation, timed apart), bf16 native at
  2.5e-6 n², bf16 widen at 4.4e-6 n²: speed-ups 2 and 1.25, each against the fp32 row with the same parameters;
- errors: fp32 2e-7 both ways (the floor), naive bf16 kernel 3e-7 / end to end 4e-3, tiled native bf16 kernel
  2e-3 / end to end 5e-3, tiled widen bf16 3e-7 / 4e-3; tiled widen bf16 at n = 512 noisy;

the figure names the CPU, keeps the series apart and is embedded in REPORT.md's Accuracy by dtype section; the
same results with fp32 rows only get neither the figure nor summary.json's dtype_vs_fp32. The stages apart (the
analysis without matplotlib, the report without figures) as test_plot.py checks them.

Run by ctest as `/usr/bin/python3 test_plot_dtype.py --attnbench PATH` (the path is not used: plot.py reads
files only). Exit 0 pass, 1 fail, 77 skip (numpy or matplotlib missing)."""
import argparse
import json
import os
import statistics
import sys
import tempfile

import test_plot as tp  # check, run_plot, check_stages and the failures they record (next to this file)

check = tp.check
H, D = 4, 64
NS = [256, 512, 1024]
FP32_ERR = 2e-7
# Per-round ratios fp32 / bf16 of naive at n = 1024 (timed in one interleaved group), and the fp32 samples.
ROUND_RATIOS = [1.1, 1.2, 1.25, 1.3, 1.25, 1.2, 1.4]
FP32_SAMPLES = [10.0, 12.0, 9.0, 11.0, 10.0, 13.0, 9.5]
PAIRED_N = 1024
META = {"config_name": "dtypes", "config": {"name": "dtypes", "sweep": {"dtype": ["fp32", "bf16"]}},
        "sgemm_calibration": [{"threads": 2, "gflops": 100.0, "size": 2048, "cv": 0.01}],
        "system": {"cpu_model": "Dtype Test CPU 3", "cores_available": 2}}


def row(variant, params, n, dtype, time_ms, err, e2e, noisy=False, samples=None, group=None):
    """A forward row in attnbench's schema, stored in `dtype`; samples / group: timed in an interleaved group."""
    ptext = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
    flops = 4.0 * H * D * n * n
    r = {"id": f"{variant}{{{ptext}}}:B=1,H={H},Lq={n},Lkv={n},D={D},dtype={dtype},none,gaussian(std=1),T=2",
         "variant": variant, "params": params, "batch": 1, "heads": H, "kv_heads": H, "seq_q": n, "seq_kv": n,
         "head_dim": D, "mask": "none", "regime": "gaussian(std=1)", "threads": 2, "exact": True, "status": "ok",
         "reason": "", "pass": "forward", "dtype": dtype, "bias": "none", "rope": "none", "noisy": noisy,
         "attempts": 3 if noisy else 1,
         "time_ms": {"median": time_ms, "p10": time_ms * 0.98, "p90": time_ms * 1.02, "mean": time_ms, "cv": 0.01,
                     "reps": len(samples) if samples else 5},
         "flops": flops, "gflops": flops / (time_ms * 1e6),
         "accuracy": {"reference": "sampled", "rows": 32, "max_abs_err": err, "rel_l2_err": err / 2,
                      "mean_cosine": 1.0, "nan_count": 0, "inf_count": 0},
         "accuracy_e2e": {"reference": "sampled", "rows": 32, "max_abs_err": e2e, "rel_l2_err": e2e / 2,
                          "mean_cosine": 1.0, "nan_count": 0, "inf_count": 0},
         "memory": {"estimated_bytes": 4 * H * n * D, "peak_bytes": None}}
    if samples:
        r["time_ms"]["samples"] = samples
        r["interleave"] = {"group": group, "points": 2, "position": 0, "rounds": len(samples)}
    return r


def dtype_rows():
    rows = []
    for n in NS:
        t = n * n
        if n == PAIRED_N:  # timed in one group: the samples round by round, their medians as the rows'
            bf16 = [s / q for s, q in zip(FP32_SAMPLES, ROUND_RATIOS)]
            group = f"naive{{}}:B=1,H={H},Lq={n},Lkv={n},D={D},dtype=fp32,none,gaussian(std=1),T=2"
            rows.append(row("naive", {}, n, "fp32", statistics.median(FP32_SAMPLES), FP32_ERR, FP32_ERR,
                            samples=FP32_SAMPLES, group=group))
            rows.append(row("naive", {}, n, "bf16", statistics.median(bf16), 3e-7, 4e-3, samples=bf16, group=group))
        else:
            rows.append(row("naive", {}, n, "fp32", 1e-5 * t, FP32_ERR, FP32_ERR))
            rows.append(row("naive", {}, n, "bf16", 1.25e-5 * t, 3e-7, 4e-3))
        for kernel, fp32_c, bf16_c, err, e2e in (("native", 5e-6, 2.5e-6, 2e-3, 5e-3),
                                                 ("widen", 5.5e-6, 4.4e-6, 3e-7, 4e-3)):
            p = {"bf16_kernel": kernel, "tile_kv": 64}  # tile_kv is the same everywhere: not in the label
            rows.append(row("tiled", p, n, "fp32", fp32_c * t, FP32_ERR, FP32_ERR))
            rows.append(row("tiled", p, n, "bf16", bf16_c * t, err, e2e, noisy=(kernel == "widen" and n == 512)))
    return rows


def plot(d, rows):
    return tp.plot_report(d, rows, META)


section = tp.report_section
close = tp.close


NATIVE, WIDEN = "tiled(bf16_kernel=native) [bf16]", "tiled(bf16_kernel=widen) [bf16]"
NATIVE32, WIDEN32 = "tiled(bf16_kernel=native) [fp32]", "tiled(bf16_kernel=widen) [fp32]"


def test_speedups(summary):
    dv = summary.get("dtype_vs_fp32") or {}
    by = {e["series"]: e for e in dv.get("series", [])}
    check(dv.get("dtypes") == ["fp32", "bf16"] and dv.get("passes") == ["forward"],
          f"[dtype] summary.json dtype_vs_fp32 names the dtypes and the pass ({dv.get('dtypes')}, {dv.get('passes')})")
    check(sorted(by) == sorted(["naive [bf16]", NATIVE, WIDEN]),
          f"[dtype] one entry per bf16 series, the bf16_kernel values apart, no fp32 entry ({sorted(by)})")
    if sorted(by) != sorted(["naive [bf16]", NATIVE, WIDEN]):
        return
    for label, base, speed in ((NATIVE, NATIVE32, 2.0), (WIDEN, WIDEN32, 1.25)):
        pts = by[label]["points"]
        check([p["seq_kv"] for p in pts] == NS and all(close(p["speedup"], speed) for p in pts)
              and all(p["method"] == "medians" and p["fp32_series"] == base for p in pts)
              and by[label]["fp32_series"] == [base],
              f"[dtype] {label}: {speed}x fp32 at every n, against {base} (the same parameters) "
              f"({[(p['speedup'], p['fp32_series']) for p in pts]})")
        check(all(close(p["fp32_time_ms"] / p["time_ms"], p["speedup"]) for p in pts),
              f"[dtype] {label}: the speed-up is time_fp32 / time")
    naive = by["naive [bf16]"]["points"]
    check(all(close(p["speedup"], 0.8) for p in naive[:2]) and naive[0]["fp32_series"] == "naive [fp32]",
          f"[dtype] naive bf16 at 1.25x fp32's time: a speed-up of 0.8 ({[p['speedup'] for p in naive]})")
    paired = naive[-1]
    medians = statistics.median(FP32_SAMPLES) / statistics.median([s / q for s, q in zip(FP32_SAMPLES, ROUND_RATIOS)])
    check(paired["method"] == "paired" and close(paired["speedup"], 1.25) and not close(medians, 1.25)
          and paired["speedup_interval"] is not None and close(paired["speedup_interval"][0], 1.1)
          and close(paired["speedup_interval"][1], 1.4),
          f"[dtype] timed in one interleaved group: the median of the per-round ratios (1.25, not the medians' "
          f"{medians:.4f}) with its interval [1.1, 1.4] ({paired['speedup']}, {paired['speedup_interval']})")
    nat = by[NATIVE]["points"][0]
    check(nat["kernel_max_abs_err"] == 2e-3 and nat["e2e_max_abs_err"] == 5e-3 and nat["fp32_max_abs_err"] == FP32_ERR,
          f"[dtype] the kernel's and the end-to-end error, and the fp32 floor ({nat})")
    noisy = [(p["seq_kv"], p["noisy"], p["fp32_noisy"]) for p in by[WIDEN]["points"]]
    check(noisy == [(256, False, False), (512, True, False), (1024, False, False)],
          f"[dtype] the noisy bf16 row is flagged at its point ({noisy})")


def test_dtypes(tmp):
    d = os.path.join(tmp, "dtypes")
    summary, md = plot(d, dtype_rows())
    if summary is None:
        return
    test_speedups(summary)
    png, svg = (os.path.join(d, "plots", f"dtype_vs_fp32.{e}") for e in ("png", "svg"))
    check(os.path.isfile(png) and os.path.getsize(png) > 10000 and os.path.isfile(svg)
          and "plots/dtype_vs_fp32.png" in summary["files"] and "plots/dtype_vs_fp32.svg" in summary["files"],
          "[dtype] dtype_vs_fp32.png and .svg are drawn and listed in summary.json")
    if os.path.isfile(svg):
        with open(svg, encoding="utf-8") as f:
            text = f.read()
        check("Dtype Test CPU 3" in text, "[dtype] the figure names the CPU")
        check(all(s in text for s in (NATIVE, WIDEN, "naive [bf16]")) and f"{NATIVE32}: floor" in text
              and f"{WIDEN32}: floor" in text and "naive [fp32]: floor" in text
              and "solid: kernel (accuracy)" in text and "dashed: end to end (accuracy_e2e)" in text,
              "[dtype] the legend: each bf16 series (the bf16_kernel values apart), each fp32 series' floor, "
              "kernel solid and end to end dashed")
        check("as fast as fp32" in text and "hollow: noisy" in text,
              "[dtype] the speed-up panel: the 1x line and the noisy point hollow")
    sec = section(md, "Accuracy by dtype")
    check("| `tiled` | bf16 | 6 |" in sec and "| `naive` | fp32 | 3 |" in sec,
          "[dtype] REPORT.md's Accuracy by dtype table as before")
    check("### Speed-up and error by dtype figure" in sec and "![Speed-up and error by dtype](plots/dtype_vs_fp32.png)"
          in sec and "(plots/dtype_vs_fp32.svg)" in sec and "time_fp32 ÷ time" in sec,
          "[dtype] REPORT.md embeds the figure, with its caption, in the Accuracy by dtype section")
    check(md.count("](plots/dtype_vs_fp32.png)") == 1, "[dtype] ... and nowhere else")
    tp.check_stages("dtype", d, summary, md)


def test_one_dtype(tmp):
    """The same sweep with fp32 rows only: no dtype_vs_fp32 in summary.json, no figure, the table alone."""
    d = os.path.join(tmp, "fp32-only")
    summary, md = plot(d, [r for r in dtype_rows() if r["dtype"] == "fp32"])
    if summary is None:
        return
    check(summary.get("dtype_vs_fp32", "absent") is None, "[fp32 only] summary.json dtype_vs_fp32 is null")
    check(not os.path.exists(os.path.join(d, "plots", "dtype_vs_fp32.png"))
          and summary["files"] == [f"plots/{s}.{e}" for s in tp.FIGURES for e in ("png", "svg")] + ["REPORT.md"],
          f"[fp32 only] the figure is not drawn, only the usual ones ({summary['files']})")
    sec = section(md, "Accuracy by dtype")
    check("| `naive` | fp32 | 3 |" in sec and "dtype_vs_fp32" not in md and "Speed-up and error by dtype" not in md,
          "[fp32 only] the Accuracy by dtype section has its table and no figure")
    tp.check_stages("fp32 only", d, summary, md)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", help="unused: plot.py reads files only")
    ap.parse_args()
    try:
        import numpy  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (install python3-numpy python3-matplotlib)")
        return 77
    with tempfile.TemporaryDirectory(prefix="attnbench-test-plot-dtype-") as tmp:
        for case in (test_dtypes, test_one_dtype):
            print(f"--    {case.__name__}")
            try:
                case(tmp)
            except Exception as e:  # noqa: BLE001
                check(False, f"{case.__name__} raised {type(e).__name__}: {e}")
    print(f"{len(tp.failures)} failure(s)" if tp.failures else "all passed")
    return 1 if tp.failures else 0


if __name__ == "__main__":
    sys.exit(main())
