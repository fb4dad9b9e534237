"""The results folder of a quality run, kept as `attnbench run` keeps a sweep's (configs/README.md, "Sweep
configs"): results.jsonl (a row per point, flushed and fsynced as the point ends), meta.json (written at the
start, rewritten atomically at the end), results.csv (atomically at the end, also after an interruption).
Rows go through attnbench's own row definition (attnbench.result_row, results_csv, timing_summary), so
`attnbench compare`, plot.py and pandas read them as they read a sweep's.
"""
import datetime
import json
import os
import shutil
import tempfile

# What plot.py and the harness derive from the rows: a fresh or --force run removes them with the rows.
DERIVED = ("results.csv", "plots", "REPORT.md", "summary.json")


class FolderError(Exception):
    """The folder cannot be used as asked (exit 2, nothing written)."""


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def atomic_write(path, text):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix="." + os.path.basename(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_rows(path, repair):
    """The rows of results.jsonl, the last per id; a torn last line (a kill mid-write) is cut when `repair`
    (that point runs again), an unreadable line elsewhere is an error naming it."""
    if not os.path.isfile(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    rows, good_end, pos = {}, 0, 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        line = data[pos:] if end < 0 else data[pos:end]
        try:
            row = json.loads(line) if line.strip() else None
            if row is not None and (not isinstance(row, dict) or "id" not in row):
                raise ValueError("not a result row")
        except ValueError as e:
            if end < 0 or not data[end + 1:].strip():
                break  # a torn tail: cut below, its point runs again
            line_no = data[:pos].count(b"\n") + 1
            raise FolderError(f"{path}: line {line_no} is not a result row ({e})")
        if end < 0:
            break  # a last line without its newline was not finished: run that point again
        if row is not None:
            rows[row["id"]] = row
        pos = good_end = end + 1
    if repair and good_end < len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return list(rows.values())


class ResultsFolder:
    """OUT/results.jsonl, meta.json and results.csv of one config. The constructor checks that the folder may
    be used as asked (fresh, --resume of the same config, --force) and writes nothing; prepare() does."""

    def __init__(self, out, config, resume, force):
        self.out, self.config = out, config
        self.jsonl = os.path.join(out, "results.jsonl")
        self.meta_path = os.path.join(out, "meta.json")
        self.rows = []
        self.meta = {}
        existing = os.path.exists(self.jsonl) or os.path.exists(self.meta_path)
        if resume:
            if not os.path.isfile(self.meta_path):
                raise FolderError(f"--resume: '{out}' holds no meta.json of an earlier run (run without --resume)")
            try:
                with open(self.meta_path, encoding="utf-8") as f:
                    self.meta = json.load(f)
            except ValueError as e:
                raise FolderError(f"--resume: {self.meta_path} is not valid JSON ({e})")
            if self.meta.get("config_hash") != config.hash:
                raise FolderError(f"--resume: the config changed since '{out}' was started (hash "
                                  f"{self.meta.get('config_hash')} there, {config.hash} now): use --force to start "
                                  "over, or another --out")
        elif existing and not force:
            raise FolderError(f"'{out}' already holds results: --resume finishes them, --force replaces them")

    def prepare(self, resume, meta):
        """Creates the folder, or reopens it to resume (cutting a torn last row)."""
        os.makedirs(self.out, exist_ok=True)
        if resume:
            self.rows = read_rows(self.jsonl, repair=True)
            self.meta.setdefault("resumed_at", []).append(now())
            self.meta.update(interrupted=True, end_time=None)
        else:
            for name in ("results.jsonl", "meta.json") + DERIVED:
                path = os.path.join(self.out, name)
                if os.path.isdir(path):
                    shutil.rmtree(path)
                elif os.path.exists(path):
                    os.unlink(path)
            self.meta = dict(meta, start_time=now(), end_time=None, interrupted=True)
        self.write_meta()

    def done(self):
        return {row["id"] for row in self.rows}

    def append(self, row):
        with open(self.jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rows.append(row)

    def write_meta(self, **updates):
        self.meta.update(updates, rows=len(self.rows))
        atomic_write(self.meta_path, json.dumps(self.meta, indent=2) + "\n")

    def finish(self, attnbench, interrupted):
        """results.csv in the plan's order and the final meta.json (also after an interruption)."""
        order = {p.id: i for i, p in enumerate(self.config.points)}
        self.rows.sort(key=lambda r: order.get(r["id"], len(order)))
        atomic_write(os.path.join(self.out, "results.csv"), attnbench.results_csv(self.rows))
        self.write_meta(end_time=now(), interrupted=interrupted)
