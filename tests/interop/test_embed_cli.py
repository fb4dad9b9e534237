#!/usr/bin/env python3
"""Interop: `attnbench embed` against a numpy recomputation (GloVe lookup, unknown tokens, sinusoidal formula,
learned tables, concat), seeded-table properties, and its error handling (exit 2, named option/file, no output).

Run by ctest as `/usr/bin/python3 test_embed_cli.py --attnbench PATH`. Exit 0 pass, 1 fail, 77 skip (no numpy).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError as exc:
    print(f"SKIP: {exc}")
    sys.exit(77)

FAILURES = []


def check(condition, message):
    if not condition:
        FAILURES.append(message)
        print("FAIL:", message)


def run(exe, args):
    return subprocess.run([exe, "embed", *args], capture_output=True, text=True)


def sinusoidal(length, dim):
    """The issue's formula in float64: PE(t, 2i) = sin(t / 10000^(2i/D)), PE(t, 2i+1) = cos(...), t from 0;
    odd D keeps the first D columns (the last is a sine)."""
    pe = np.zeros((length, dim))
    t = np.arange(length, dtype=np.float64)[:, None]
    for c in range(dim):
        angle = t[:, 0] / np.power(10000.0, (2 * (c // 2)) / dim)
        pe[:, c] = np.sin(angle) if c % 2 == 0 else np.cos(angle)
    return pe


# |attnbench - numpy| for embedding + sinusoidal, both summed in fp32 from the same float32 embedding: the
# encoding is a double rounded once to float (half an ulp, <= 2^-25 for |PE| <= 1; the two codes may round
# angles a double ulp apart, which moves sin/cos by ~1e-16, so at most one float ulp apart: 2^-24), then one
# fp32 add (half an ulp of the sum each side). Hence 2^-24 * (1 + |expected|) per element.
def add_tolerance(expected):
    return 2.0**-24 * (1.0 + np.abs(expected))


def embed_ok(exe, args, label):
    r = run(exe, args)
    if r.returncode != 0:
        check(False, f"{label}: exit {r.returncode}: {r.stderr.strip()}")
        return None, None
    out = args[args.index("--out") + 1]
    x = np.load(out)
    check(x.dtype == np.float32 and x.ndim == 3 and x.shape[0] == 1, f"{label}: output {x.dtype} {x.shape}")
    try:
        report = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        check(False, f"{label}: no JSON report on stdout: {r.stdout!r}")
        report = {}
    return x[0], report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--attnbench", required=True)
    exe = parser.parse_args().attnbench
    with tempfile.TemporaryDirectory(prefix="attn_embed_cli_") as tmp:
        def path(name):
            return os.path.join(tmp, name)

        # A word2vec-style file (header, CRLF, trailing spaces) and a text with known and unknown words.
        rng = np.random.default_rng(3)
        words = ["the", "cat", "sat", "on", "mat", ","]
        D = 6
        table = rng.normal(size=(len(words), D)).astype(np.float32)
        with open(path("vec.txt"), "w", newline="") as f:
            f.write(f"{len(words)} {D}\r\n")
            for w, row in zip(words, table):
                f.write(w + " " + " ".join(repr(float(v)) for v in row) + "  \r\n")
        text = "the cat sat on the mat , the dog\r\nsat on The  log .\n"
        with open(path("text.txt"), "w", newline="") as f:
            f.write(text)
        tokens = text.split()
        L = len(tokens)
        unknown = [t for t in tokens if t not in words]
        rows = np.stack([table[words.index(t)] if t in words else np.zeros(D, np.float32) for t in tokens])

        # 1. Lookup only: exact rows, zeros for unknown tokens, the report counts them.
        x, rep = embed_ok(exe, ["--text", path("text.txt"), "--embeddings", path("vec.txt"), "--positional", "none",
                                "--out", path("none.npy")], "lookup")
        if x is not None:
            check(x.shape == (L, D), f"lookup: shape {x.shape}, want {(L, D)}")
            check(np.array_equal(x, rows), "lookup: rows differ from the file's vectors (zeros for unknown)")
            check(rep.get("tokens") == L, f"lookup: report tokens {rep.get('tokens')} != {L}")
            check(rep.get("unknown_tokens") == len(unknown), f"lookup: unknown {rep.get('unknown_tokens')}")
            check(rep.get("unknown_examples") == list(dict.fromkeys(unknown)), f"lookup: {rep.get('unknown_examples')}")
            check(rep.get("shape") == [1, L, D], f"lookup: report shape {rep.get('shape')}")

        # 2. Sinusoidal, add (the default): rows + PE.
        x, _ = embed_ok(exe, ["--text", path("text.txt"), "--embeddings", path("vec.txt"), "--out", path("add.npy")],
                        "sinusoidal add")
        if x is not None:
            want = rows.astype(np.float64) + sinusoidal(L, D)
            err = np.abs(x - want)
            check(x.shape == (L, D) and (err <= add_tolerance(want)).all(), f"sinusoidal add: max err {err.max():.3g}")

        # 3. Concat: [rows | PE], E = 2D.
        x, _ = embed_ok(exe, ["--text", path("text.txt"), "--embeddings", path("vec.txt"), "--combine", "concat",
                              "--out", path("cat.npy")], "concat")
        if x is not None:
            check(x.shape == (L, 2 * D), f"concat: shape {x.shape}")
            check(np.array_equal(x[:, :D], rows), "concat: left half is not the embeddings")
            pe = sinusoidal(L, D)
            check((np.abs(x[:, D:] - pe) <= 2.0**-24).all(), "concat: right half is not the sinusoidal encoding")

        # 4. --max-tokens: the first N tokens.
        x, rep = embed_ok(exe, ["--text", path("text.txt"), "--embeddings", path("vec.txt"), "--positional", "none",
                                "--max-tokens", "4", "--out", path("max.npy")], "max-tokens")
        if x is not None:
            check(np.array_equal(x, rows[:4]), "max-tokens: not the first 4 rows")
            check(rep.get("tokens") == 4, "max-tokens: report")

        # 5. Learned table from .npy, add and concat (any width for concat).
        learned = rng.normal(size=(L + 3, D)).astype(np.float32)
        np.save(path("learned.npy"), learned)
        x, _ = embed_ok(exe, ["--text", path("text.txt"), "--embeddings", path("vec.txt"), "--positional", "learned",
                              "--positional-npy", path("learned.npy"), "--out", path("learned_add.npy")], "learned")
        if x is not None:
            check(np.array_equal(x, rows + learned[:L]), "learned add: not rows + table[:L] (one fp32 add)")
        narrow = rng.normal(size=(L, 2)).astype(np.float32)
        np.save(path("narrow.npy"), narrow)
        x, _ = embed_ok(exe, ["--text", path("text.txt"), "--embeddings", path("vec.txt"), "--positional", "learned",
                              "--positional-npy", path("narrow.npy"), "--combine", "concat", "--out",
                              path("narrow_cat.npy")], "learned concat")
        if x is not None:
            check(x.shape == (L, D + 2) and np.array_equal(x[:, D:], narrow), "learned concat: wrong right part")

        # 6. Seeded tables: same word -> same row, deterministic, seed-dependent, vocabulary overflow -> unknown,
        #    odd D with the sinusoidal formula.
        seeded = ["--text", path("text.txt"), "--vocab-size", "5", "--d-model", "7", "--seed", "11"]
        a, rep = embed_ok(exe, seeded + ["--positional", "none", "--out", path("s1.npy")], "seeded")
        b, _ = embed_ok(exe, seeded + ["--positional", "none", "--out", path("s2.npy")], "seeded again")
        c, _ = embed_ok(exe, seeded[:-1] + ["12", "--positional", "none", "--out", path("s3.npy")], "seeded 12")
        if a is not None and b is not None and c is not None:
            check(np.array_equal(a, b), "seeded: not deterministic")
            check(not np.array_equal(a, c), "seeded: the seed changes nothing")
            first_seen = list(dict.fromkeys(tokens))
            assigned = first_seen[:5]
            for i, t in enumerate(tokens):
                j = tokens.index(t)
                check(np.array_equal(a[i], a[j]), f"seeded: token {t!r} rows differ")
                if t not in assigned:
                    check(not a[i].any(), f"seeded: overflow word {t!r} is not the zero row")
                else:
                    check(a[i].any(), f"seeded: assigned word {t!r} has a zero row")
            check(rep.get("unknown_tokens") == sum(t not in assigned for t in tokens), "seeded: unknown count")
            check(rep.get("words_assigned") == 5, f"seeded: words_assigned {rep.get('words_assigned')}")
            s, _ = embed_ok(exe, seeded + ["--out", path("s_sin.npy")], "seeded sinusoidal odd D")
            if s is not None:
                want = a.astype(np.float64) + sinusoidal(L, 7)
                check((np.abs(s - want) <= add_tolerance(want)).all(), "seeded: odd-D sinusoidal differs")
            learned_seeded, _ = embed_ok(exe, seeded + ["--positional", "learned", "--positional-seed", "3", "--out",
                                                        path("s_learned.npy")], "seeded learned")
            if learned_seeded is not None:
                delta = learned_seeded - a
                check(np.abs(delta).max() > 0.1 and np.isfinite(delta).all(), "seeded learned: no encoding added")

        # 7. Errors: exit 2, the message names the option/file and the value, no output file.
        with open(path("bad_row.txt"), "w") as f:
            f.write("the 1 2\ncat 3\n")
        with open(path("dup.txt"), "w") as f:
            f.write("the 1 2\ncat 3 4\nthe 5 6\n")
        with open(path("empty.txt"), "w") as f:
            f.write("  \n\n")
        np.save(path("short.npy"), learned[:3])
        out = path("err.npy")
        base = ["--text", path("text.txt"), "--out", out]
        errors = [
            ("empty text", ["--text", path("empty.txt"), "--embeddings", path("vec.txt"), "--out", out],
             ["empty.txt", "no tokens"]),
            ("missing text", ["--text", path("nope.txt"), "--embeddings", path("vec.txt"), "--out", out],
             ["nope.txt"]),
            ("bad row", base + ["--embeddings", path("bad_row.txt")], ["bad_row.txt:2", "has 1 values, expected 2"]),
            ("duplicate word", base + ["--embeddings", path("dup.txt")], ["dup.txt:3", "duplicate word 'the'"]),
            ("both tables", base + ["--embeddings", path("vec.txt"), "--vocab-size", "4"],
             ["--embeddings", "--vocab-size"]),
            ("no table", base, ["--embeddings", "--vocab-size"]),
            ("partial seeded", base + ["--vocab-size", "4", "--d-model", "3"], ["--seed"]),
            ("bad positional", base + ["--embeddings", path("vec.txt"), "--positional", "rotary"],
             ["--positional", "'rotary'", "sinusoidal, learned, none"]),
            ("bad combine", base + ["--embeddings", path("vec.txt"), "--combine", "mul"], ["--combine", "'mul'"]),
            ("concat without positions", base + ["--embeddings", path("vec.txt"), "--positional", "none", "--combine",
                                                 "concat"], ["--combine", "none"]),
            ("short learned table", base + ["--embeddings", path("vec.txt"), "--positional", "learned",
                                            "--positional-npy", path("short.npy")], ["short.npy", "3 rows"]),
            ("max tokens", base + ["--embeddings", path("vec.txt"), "--max-tokens", "0"], ["--max-tokens", "0"]),
            ("zero vocab", base + ["--vocab-size", "0", "--d-model", "3", "--seed", "1"], ["--vocab-size", "0"]),
        ]
        for label, args, needles in errors:
            r = run(exe, args)
            check(r.returncode == 2, f"{label}: exit {r.returncode}, expected 2; stderr: {r.stderr.strip()}")
            for n in needles:
                check(n in r.stderr, f"{label}: message lacks {n!r}: {r.stderr.strip()}")
            check(not os.path.exists(out), f"{label}: an output file was written")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("all embed CLI checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
