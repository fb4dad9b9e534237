#!/usr/bin/python3
"""Writes the hand-made seed inputs of tests/fuzz/corpus/{config,npy,word2vec}/ (seed-*; no numpy needed).

Regression inputs found by fuzzing (crash-*, named after what they caught) are committed next to them and are
not touched here. Rerun after changing a seed: /usr/bin/python3 tests/fuzz/make_seed_corpus.py
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def write(target, name, data):
    path = os.path.join(CORPUS, target, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# --- configs ------------------------------------------------------------------------------------------------
def configs():
    for f in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        if f.endswith(".json"):
            shutil.copyfile(os.path.join(ROOT, "configs", f), os.path.join(CORPUS, "config", "seed-preset-" + f))
    valid = {
        "minimal": {"name": "a", "sweep": {"seq_len": 4}},
        "cross": {"name": "x", "variants": ["naive", "tiled", "linear"],
                  "sweep": {"seq_q": [3, 5], "seq_kv": [7], "batch": 2, "heads": [1, 2], "head_dim": 8,
                            "mask": ["none", "pad", "pad=0.5"]}},
        "params": {"name": "p", "variants": [
            {"name": "sliding_window", "params": {"window": [0, 2], "dilation": [1, 3],
                                                  "global_tokens": [[0, 3], [1]]}},
            {"name": "sliding_window", "params": {"global_tokens": [0, 2]}},
            {"name": "linear", "params": {"feature_map": ["elu", "relu"], "chunk": 4, "eps": 1e-6}},
            {"name": "tiled", "params": {"tile_q": 16, "tile_kv": [16, 32]}}],
            "sweep": {"seq_len": [8, 16], "mask": ["causal", "causal+pad=0.25"], "threads": 1,
                      "dropout": 0.1}},
        "tokens": {"name": "tok", "variants": "all", "sweep": {"seq_len": 8},
                   "inputs": [{"regime": "tokens", "text": "sample.txt"},
                              {"regime": "gaussian", "std": [0.5, 2]}]},
        "measure": {"name": "m-1.b_c", "description": "all optional sections", "variants": ["naive"],
                    "sweep": {"seq_len": 2, "threads": [1]},
                    "measure": {"warmup": 0, "min_reps": 1, "max_reps": 1, "min_time_s": 0, "max_time_s": 0.5},
                    "accuracy": {"reference": "none", "rows": 1}, "memory_budget": 1048576, "seed": 9007199254740992},
        "bytes": {"name": "b", "sweep": {"seq_len": 4}, "memory_budget": "1.5 G"},
        "float-ints": {"name": "f", "sweep": {"seq_len": 4.0, "batch": 1e0}, "seed": 3.0},
        "gqa": {"name": "g", "variants": ["naive", "tiled"],
                "sweep": {"heads": [4, 8], "kv_heads": [4, 2, 1], "seq_q": [1, 4], "seq_kv": [16],
                          "mask": ["causal_lower_right", "causal_lower_right+pad=0.25"]}},
    }
    for k, v in valid.items():
        write("config", "seed-valid-" + k + ".json", json.dumps(v))
    invalid = {
        "syntax": '{"name": "a", "sweep": {"seq_len": [1, 2,]}',
        "empty": "",
        "not-object": "[1, 2, 3]",
        "unknown-key": '{"name": "a", "sweep": {"seq_len": 4, "sequence": 3}}',
        "duplicate-id": '{"name": "a", "sweep": {"seq_len": [4, 4]}}',
        "empty-axis": '{"name": "a", "sweep": {"seq_len": []}}',
        "huge-size": '{"name": "a", "sweep": {"seq_len": 1099511627777}}',
        "bad-mask": '{"name": "a", "sweep": {"seq_len": 4, "mask": "pad=1.5"}}',
        "bad-mask-nan": '{"name": "a", "sweep": {"seq_len": 4, "mask": "causal+pad=nan"}}',
        "kv-heads-not-dividing": '{"name": "a", "sweep": {"seq_len": 4, "heads": [8, 12], "kv_heads": [4, 8]}}',
        "both-seq": '{"name": "a", "sweep": {"seq_len": 4, "seq_q": 4, "seq_kv": 4}}',
        "bad-variant": '{"name": "a", "variants": ["naiv"], "sweep": {"seq_len": 4}}',
        "bad-param": '{"name": "a", "variants": [{"name": "sliding_window", "params": {"windw": 3}}],'
                     ' "sweep": {"seq_len": 4}}',
        "bad-bytes": '{"name": "a", "sweep": {"seq_len": 4}, "memory_budget": "8 GiBs"}',
        "bad-name": '{"name": ".hidden", "sweep": {"seq_len": 4}}',
        "missing-text": '{"name": "a", "sweep": {"seq_len": 4}, "inputs": {"regime": "tokens", "text": "nope.txt"}}',
        "reps": '{"name": "a", "sweep": {"seq_len": 4}, "measure": {"min_reps": 5, "max_reps": 2}}',
        "dup-global": '{"name": "a", "variants": [{"name": "sliding_window", "params": {"global_tokens": [[1, 1]]}}],'
                      ' "sweep": {"seq_len": 4}}',
    }
    for k, v in invalid.items():
        write("config", "seed-invalid-" + k + ".json", v)


# --- .npy ---------------------------------------------------------------------------------------------------
def npy(descr, shape, data, major=1, fortran=False, dict_text=None):
    if dict_text is None:
        shape_text = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        dict_text = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape_text)
    prefix = 10 if major == 1 else 12
    pad = (64 - (prefix + len(dict_text) + 1) % 64) % 64
    header = (dict_text + " " * pad + "\n").encode("latin-1")
    out = b"\x93NUMPY" + bytes([major, 0])
    out += struct.pack("<H" if major == 1 else "<I", len(header))
    return out + header + data


def npys():
    f4 = lambda *v: struct.pack("<%df" % len(v), *v)
    f8 = lambda *v: struct.pack("<%dd" % len(v), *v)
    seeds = {
        "f4-rank0": npy("<f4", (), f4(1.5)),
        "f4-rank1": npy("<f4", (3,), f4(1, 2, 3)),
        "f4-rank2": npy("<f4", (2, 3), f4(*range(6))),
        "f4-rank4": npy("<f4", (1, 2, 2, 1), f4(0.25, -1, 3e38, -0.0)),
        "f4-empty": npy("<f4", (0, 5), b""),
        "f8-rank2": npy("<f8", (2, 2), f8(1e-300, -2, 1e300, 4)),
        "f8-v2": npy("<f8", (2,), f8(1, 2), major=2),
        "f4-v3": npy("<f4", (1, 1), f4(7), major=3),
        "mask-b1": npy("|b1", (2, 3), bytes([1, 0, 1, 0, 0, 1])),
        "mask-u1": npy("|u1", (4,), bytes([0, 2, 255, 0])),
        "mask-i8": npy("<i8", (2,), struct.pack("<2q", 0, -5)),
        "mask-i4": npy("<i4", (1, 2), struct.pack("<2i", 1, 0)),
        "mask-f8": npy("<f8", (2,), f8(0, 1)),
        "double-quotes": npy("<f4", (1,), f4(1), dict_text='{"descr": "<f4", "fortran_order": False, "shape": (1,)}'),
        "long-shape": npy("<f4", (1,), f4(1), dict_text="{'descr': '<f4', 'fortran_order': False, 'shape': (1L,), }"),
        # Broken ones.
        "bad-magic": b"\x93NUMPZ\x01\x00\x00\x00",
        "bad-version": npy("<f4", (1,), f4(1))[:6] + b"\x04" + npy("<f4", (1,), f4(1))[7:],
        "truncated-header": npy("<f4", (1,), f4(1))[:30],
        "truncated-data": npy("<f4", (4,), f4(1, 2)),
        "trailing-data": npy("<f4", (1,), f4(1, 2)),
        "fortran": npy("<f4", (2, 2), f4(1, 2, 3, 4), fortran=True),
        "big-endian": npy(">f4", (1,), struct.pack(">f", 1)),
        "structured": npy("<f4", (1,), f4(1), dict_text="{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }"),
        "huge-shape": npy("<f4", (1 << 20, 1 << 20, 1 << 20), b""),
        "huge-shape-zero": npy("<f4", (0, 999999999999999, 999999999999999), b""),
        "negative-shape": npy("<f4", (1,), f4(1), dict_text="{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"),
        "overflow-f8": npy("<f8", (1,), f8(1e300)),
        "nan-mask": npy("<f4", (1,), f4(float("nan"))),
        "no-shape": npy("<f4", (1,), f4(1), dict_text="{'descr': '<f4', 'fortran_order': False}"),
        "complex": npy("<c8", (1,), f4(1, 2)),
    }
    for k, v in seeds.items():
        write("npy", "seed-" + k + ".npy", v)


# --- word2vec / GloVe text ----------------------------------------------------------------------------------
def word2vecs():
    seeds = {
        "word2vec-header": "3 4\nthe 0.1 0.2 0.3 0.4\n, 1 2 3 4\ncat -1e-3 +5 6.5 7\n",
        "word2vec-crlf": "2 2\r\na 1 2  \r\nb 3 4\t\r\n\r\n",
        "glove": "the 0.418 0.24968 -0.41242 0.1217\nof 0.70853 0.57088 -0.4716 0.18048\n"
                 "and 0.26818 0.14346 -0.27877 0.016257\n",
        "glove-one": "x 1\n",
        "utf8": "caf\u00e9 1.5e-7 -2\n\u65e5\u672c 0 0\n",
        "exponents": "a 1e38 -3.4e38 1e-45 0x1p3\n",
        # Broken ones.
        "wrong-width": "a 1 2\nb 3\n",
        "header-mismatch": "3 2\na 1 2\nb 3 4\n",
        "duplicate": "a 1 2\nb 3 4\na 5 6\n",
        "nan": "a 1 nan\n",
        "inf": "a inf 1\n",
        "overflow": "a 1 1e39\n",
        "no-values": "lonely\n",
        "blank": " \n\r\n",
        "nul": "a 1\x00 2\n",
        "plus-minus": "a +-1 2\n",
        "header-zero-dim": "1 0\na\n",
        "header-only": "0 5\n",
    }
    for k, v in seeds.items():
        write("word2vec", "seed-" + k + ".txt", v)


if __name__ == "__main__":
    configs()
    npys()
    word2vecs()
