"""attnbench's training harness: can a model built on each variant learn what attention learns?

Trains small models through attnbench's own kernels (attnbench.autograd) on tasks generated from a seed and
writes result rows beside the speed sweeps' (scripts/quality; bench/quality/README.md). One module per stage:

    config   a quality config (JSON) -> validated points (cross product of its axes), each with a repro id
    tasks    the tasks' data: Schlag et al.'s associative-retrieval capacity, Zoology's MQAR
    models   the torch models around the attention op (everything but the attention is torch's)
    train    the training loops (Schlag's, Zoology's): a point -> an Outcome (curve, step times, stop)
    rows     a point and its Outcome -> a result row (attnbench.result_row: the sweep's row definition)
    store    the results folder: results.jsonl, meta.json, results.csv; resume
    cli      scripts/quality's command line: progress, ETA, interruption, the plot step

Run with Debian's /usr/bin/python3 (numpy, torch) and the built module on PYTHONPATH (scripts/quality sets it).
"""
