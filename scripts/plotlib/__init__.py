"""plotlib: what scripts/plot.py runs, one stage per module, each feeding the next.

    results   results.jsonl / results.peers.jsonl / meta.json (and a patterns/ folder) -> Results (Row objects)
    analysis  Results -> a plain dict of every number the figures and the report show: fits, crossovers, best
              exact per point, Pareto points, key figures and ratios, left-out rows, measurement conditions.
              Pure (numpy, no matplotlib); the dict is summary.json.
    figures   Results + analysis -> plots/*.png, *.svg (matplotlib). Only draws: the analysis is read, never
              written.
    report    Results + analysis + the figure files written -> REPORT.md (no matplotlib): it does not depend
              on whether, or in which order, figures were drawn.
    terminal  the analysis -> the few lines plot.py prints at its end (the fastest variant per n, the crossovers).
    styles    one colour and one marker per variant, the same in every figure (no matplotlib).
    common    what they share: the error type, number formatting, atomic writes.

Importing the package, results, analysis or report does not import matplotlib; only figures does.
"""
