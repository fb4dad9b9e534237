"""The few lines plot.py prints at its end, after the files it wrote (scripts/run ends on them): per mask and
setting, the fastest variant at each n with its time and whether it is exact, and the crossovers REPORT.md's
Crossover table names. Only the analysis's numbers (analysis "fastest" and "crossover"), formatted; no
matplotlib, nothing computed here.
"""
import textwrap

from .common import fmt_num

HEADER = "Summary (REPORT.md has every table and figure, summary.json every number):"
MAX_SETTINGS = 3  # columns of the fastest-per-n table; the others are named, not shown
WIDTH = 110  # the crossover lines are wrapped at this many columns
NBSP = "\u00a0"  # joins the words of one crossover item while wrapping (textwrap does not break there)


def _setting(mask, context):
    return f"mask={mask}" + (f", {context}" if context else "")


def _cell(e):
    return (f"{e['series']} {fmt_num(e['time_ms'], '.3g')} ms, {'exact' if e['exact'] else 'approximate'}"
            + (" (noisy)" if e["noisy"] else ""))


def _fastest_table(settings, by_setting):
    """The fastest series at each n (rows) per setting (columns), as aligned text lines."""
    ns = sorted({n for s in settings for n in by_setting[s]})
    table = [["n"] + [_setting(*s) for s in settings]]
    table += [[str(n)] + [_cell(by_setting[s][n]) if n in by_setting[s] else "—" for s in settings] for n in ns]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return ["  " + " | ".join(c.rjust(w) if i == 0 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in table]


def _unbroken(text):
    return text.replace(" ", NBSP)


def _listed(what, names):
    """"what: a, b, c" that wraps after a comma only."""
    return _unbroken(f"{what}: {names[0]}") + "".join(", " + _unbroken(n) for n in names[1:])


def _crossover_line(setting, entries):
    """One setting's crossovers, from the analysis's "faster" of each approximate series: faster at every n,
    from n ≈ ... (in n order), or not within the measured n; against which exact series. Wrapped between items,
    never inside a name."""
    always = [e["series"] for e in entries if e["faster"] == "faster at every measured n"]
    crossing = sorted((e for e in entries if e["faster_from_n"] is not None), key=lambda e: e["faster_from_n"])
    never = [e["series"] for e in entries if e["faster"] == "never within measured range"]
    against = sorted({a for e in entries for a in e["against"]})
    items = ([_listed("at every n", always)] if always else []) \
        + [_unbroken(f"from n ≈ {e['faster_from_n']:.0f}: {e['series']}") for e in crossing] \
        + ([_listed("not within the measured n", never)] if never else [])
    head = _setting(*setting) + (f" (against {', '.join(against)})" if against else "")
    text = "; ".join(items) or "no approximate series compared"
    return [line.replace(NBSP, " ") for line in textwrap.wrap(f"{head}: {text}", WIDTH, initial_indent="  ",
                                                               subsequent_indent="      ", break_long_words=False,
                                                               break_on_hyphens=False)]


def summary_lines(an):
    """The summary as lines of text (without newlines)."""
    by_setting = {}
    for e in an["fastest"]:
        by_setting.setdefault((e["mask"], e["context"]), {})[e["seq_kv"]] = e
    if not by_setting:
        return [HEADER, "  no measured attnbench row: see REPORT.md's Points left out of the curves"]
    settings = list(by_setting)[:MAX_SETTINGS]
    lines = [HEADER, "Fastest variant at each n (median time of one call; exact: softmax attention computed exactly):"]
    lines += _fastest_table(settings, by_setting)
    if len(by_setting) > len(settings):
        lines.append(f"  ({len(by_setting) - len(settings)} more settings in REPORT.md's Key figures)")
    crossings = {}  # the forward's (with several passes the table's training column is left to REPORT.md)
    for c in an["crossover"]:
        crossings.setdefault((c["mask"], c["context"]), []).append(c)
    if crossings:
        lines.append("Approximate variants faster than the fastest exact one (REPORT.md's Crossover):")
        for s in list(crossings)[:MAX_SETTINGS]:
            lines += _crossover_line(s, crossings[s])
        if len(crossings) > MAX_SETTINGS:
            lines.append(f"  ({len(crossings) - MAX_SETTINGS} more settings in REPORT.md's Crossover)")
    return lines
