"""What every stage of plot.py shares: the program name and the error type it exits 2 on, reading a metric
as a float, number formatting for the report and the figures' axes, and atomic writes (a temporary name, then
renamed: never a half-written report or summary). No numpy, no matplotlib."""
import math
import os
import tempfile

PROG = "plot.py"
# The figures, in the order they are drawn and appear in the report (plots/<stem>.png and .svg).
FIGURES = ["time_vs_seq", "memory_vs_seq", "accuracy_vs_seq", "pareto", "throughput", "roofline", "decode",
           "phases", "mla", "chunk_size", "dtype_vs_fp32"]
# Drawn only when the results have its data (rows with `bytes`); the report's Roofline section says otherwise.
ROOFLINE = "roofline"
# Drawn only when the results have decode rows (seq_q < seq_kv, causal_lower_right) / a variant measured at
# several `chunk` values; each is embedded in its own report section, which is there only then.
DECODE = "decode"
CHUNK_SIZE = "chunk_size"
# Drawn only when rows carry phase_ms (a variant that times its phases: dsa's indexer, selection, attention).
PHASES = "phases"
# Drawn only when the folder holds results.mla.jsonl (`attnbench mla --sweep`): embedded in the MLA section.
MLA = "mla"
# Drawn only when the results have more than one storage dtype; embedded in the Accuracy by dtype section.
DTYPE_VS_FP32 = "dtype_vs_fp32"
SECTION_FIGURES = (ROOFLINE, DECODE, PHASES, MLA, CHUNK_SIZE, DTYPE_VS_FP32)  # embedded in their sections, not in their own
PATTERNS = "patterns"  # plots/patterns.png when the results folder holds patterns/ (attnbench patterns)


class InputError(Exception):
    """Bad input the user has to fix: reported as `plot.py: error: ...`, exit code 2."""


def num(x):
    """A metric as float: numbers as they are, the strings "inf"/"-inf"/"nan" (how the sweep writes
    non-finite values, JSON having none) as such, null/absent as None."""
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)  # float() reads "inf", "-inf", "nan"
        except ValueError:
            return None
    return None


def json_num(x):
    """A float for summary.json the way the rows write it: finite as is, non-finite as "inf"/"-inf"/"nan"."""
    if x is None or math.isfinite(x):
        return x
    return str(x)


def fmt_bytes(b):
    if b is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.3g} {unit}"
        b /= 1024


def fmt_num(x, spec=".3g"):
    if x is None:
        return "—"
    if not math.isfinite(x):
        return str(x)
    return format(x, spec)


def atomic_write_text(path, text):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix="." + os.path.basename(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(out)
