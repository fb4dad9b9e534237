"""A quality config: parsed and validated whole before anything runs, then expanded into points.

Errors name the config, the JSON path, the value and what is allowed, as `attnbench run` does for sweep
configs (`config 'x.json': tasks[1].seq_len[2]: must be a positive integer, got -5`). The keys, their
defaults (the papers' values) and their meaning: configs/README.md, "Quality configs".
"""
import hashlib
import itertools
import json
import math
import os
import re

from .tasks import check_mqar_sizes

NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# The delta rules' normalize_keys: the models normalise q and k themselves (models.py), so the kernels run
# with 0 unless the config gives the parameter.
MODEL_NORMALISES_KEYS = {"normalize_keys": 0}


class ConfigError(Exception):
    """A bad config: the message names the config, the path, the value and what is allowed (exit 2)."""


def _show(value):
    return json.dumps(value)


class Key:
    """One task key: its check (value -> error text or None), default, whether a list is an axis, help."""

    def __init__(self, check, default=None, axis=False, required=False):
        self.check, self.default, self.axis, self.required = check, default, axis, required


def _int_check(low, what):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            return f"must be {what}"
        return None
    return check


def _number_check(what, low=0.0, high=math.inf, low_open=True):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return f"must be {what}"
        if v < low or (low_open and v == low) or v > high:
            return f"must be {what}"
        return None
    return check


def _choice_check(choices):
    def check(v):
        return None if v in choices else "must be one of " + ", ".join(_show(c) for c in choices)
    return check


def _bool_check(v):
    return None if isinstance(v, bool) else "must be true or false"


def _eval_every_check(v):
    if v == "epoch" or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        return None
    return 'must be "epoch" or a positive integer (training steps between evaluations)'


POSITIVE_INT = _int_check(1, "a positive integer")
POSITIVE = _number_check("a positive number")

# Every key of a task block; a list value of an axis key is an axis (one point per value).
TASK_KEYS = {
    "capacity": {
        "setting": Key(_choice_check([1, 2]), 1, axis=True),
        "n": Key(POSITIVE_INT, axis=True, required=True),
        "head_dim": Key(POSITIVE_INT, 64, axis=True),
        "lr": Key(POSITIVE, 1e-3, axis=True),
        "batch": Key(POSITIVE_INT, 32),
        "eval_every": Key(POSITIVE_INT, 100),
        "patience": Key(_int_check(0, "a non-negative integer"), 10),
        "stop_loss": Key(POSITIVE, 1e-3),
        "max_steps": Key(POSITIVE_INT, 100000),
    },
    "mqar": {
        "seq_len": Key(POSITIVE_INT, axis=True, required=True),
        "kv_pairs": Key(POSITIVE_INT, axis=True, required=True),
        "vocab": Key(POSITIVE_INT, 8192, axis=True),
        "train_examples": Key(POSITIVE_INT, 100000),
        "test_examples": Key(POSITIVE_INT, 3000),
        "d_model": Key(POSITIVE_INT, 64, axis=True),
        "layers": Key(POSITIVE_INT, 2),
        "heads": Key(POSITIVE_INT, 1),
        "lr": Key(POSITIVE, 1e-3, axis=True),
        "short_conv": Key(_bool_check, False, axis=True),
        "batch": Key(POSITIVE_INT, 64),
        "epochs": Key(POSITIVE_INT, 64),
        "max_steps": Key(lambda v: None if v is None else POSITIVE_INT(v), None),
        "eval_every": Key(_eval_every_check, "epoch"),
        "stop_accuracy": Key(_number_check("a number in (0, 1]", 0.0, 1.0), 0.99),
        "weight_decay": Key(_number_check("a non-negative number", 0.0, low_open=False), 0.1),
        "embed_dropout": Key(_number_check("a number in [0, 1)", 0.0, 1.0 - 1e-12, low_open=False), 0.1),
        "positions": Key(_choice_check(["softmax", "all", "none"]), "softmax"),
        "power_a": Key(POSITIVE, 0.01),
    },
}
# The axes a point id spells, in order, with their short names.
ID_AXES = {
    "capacity": [("setting", "setting"), ("n", "N"), ("head_dim", "d"), ("lr", "lr")],
    "mqar": [("seq_len", "L"), ("kv_pairs", "kv"), ("vocab", "V"), ("d_model", "d_model"), ("layers", "layers"),
             ("heads", "heads"), ("lr", "lr"), ("short_conv", "conv")],
}
TOP_KEYS = ("name", "description", "plugins", "variants", "seeds", "threads", "torch_threads", "speed_results",
            "deviations", "tasks")
# torch's own intra-op threads: its ops here are small ([64, 128, 64] activations), and with 2 OpenMP threads on
# a 2-core VM whose other core is busy a training step took 3-5x longer than with 1 (bench/quality/README.md).
DEFAULT_TORCH_THREADS = 1


def _fmt(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return format(v, "g")
    return str(v)


class Point:
    """One training run: the task, its single-valued settings, the variant with its resolved parameters and
    the seed; `id` is its repro string (`scripts/quality CONFIG --filter ID` runs it alone) and `skip` the
    reason it cannot run (None when it can)."""

    def __init__(self, task, settings, variant, given_params, params, caps, seed, skip):
        self.task, self.settings, self.variant = task, dict(settings), variant
        self.given_params, self.params, self.caps = dict(given_params), dict(params), dict(caps)
        self.seed, self.skip = seed, skip
        label = variant + ("{" + ",".join(f"{k}={_fmt(given_params[k])}" for k in sorted(given_params)) + "}"
                           if given_params else "")
        sizes = ",".join(f"{short}={_fmt(self.settings[key])}" for key, short in ID_AXES[task])
        self.id = f"{task}:{label}:{sizes},seed={seed}"

    def __getitem__(self, key):
        return self.settings[key]

    def steps_bound(self):
        """The most training steps the point can take (for the ETA)."""
        s = self.settings
        if self.task == "capacity":
            return s["max_steps"]
        per_epoch = -(-s["train_examples"] // s["batch"])
        bound = s["epochs"] * per_epoch
        return min(bound, s["max_steps"]) if s["max_steps"] else bound


class Config:
    def __init__(self, path, data, points, text, plugins=()):
        self.path, self.data, self.points = path, data, points
        self.plugins = list(plugins)  # what load_plugin returned for each of the config's "plugins"
        self.name = data["name"]
        self.hash = hashlib.sha256(text.encode()).hexdigest()[:16]
        self.threads = data.get("threads")
        self.torch_threads = data.get("torch_threads", DEFAULT_TORCH_THREADS)
        self.deviations = list(data.get("deviations", []))
        speed = data.get("speed_results")
        self.speed_results = None if speed is None else os.path.join(os.path.dirname(os.path.abspath(path)), speed)


def load(path, registry, load_plugin=None):
    """Reads, validates and expands the config at `path` against `registry` (attnbench.variants(), or a
    callable returning it, called after the config's plugins are loaded); raises ConfigError. `registry`'s
    order is the variants' order when the config says "all". The config's "plugins" (paths relative to its
    folder, as in a sweep config) are loaded first with `load_plugin` (attnbench.load_plugin)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"config '{path}': cannot read it ({e.strerror})")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"config '{path}': not valid JSON ({e})")
    where = f"config '{path}'"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a JSON object, got {_show(data)[:60]}")
    plugins = _load_plugins(where, path, data.get("plugins", []), load_plugin)
    points = _Parser(where, registry() if callable(registry) else registry).parse(data)
    return Config(path, data, points, text, plugins)


def _load_plugins(where, path, value, load_plugin):
    """Loads the config's "plugins" (each a path to a plugin library, relative to the config's folder) before
    its variants are read, as `attnbench run` does: [load_plugin's result per plugin]."""
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise ConfigError(f"{where}: plugins: must be a list of paths to plugin libraries (relative to the "
                          f"config's folder), got {_show(value)[:80]}")
    if value and load_plugin is None:
        raise ConfigError(f"{where}: plugins: this caller cannot load plugins")
    loaded = []
    for i, entry in enumerate(value):
        full = entry if os.path.isabs(entry) else os.path.join(os.path.dirname(os.path.abspath(path)), entry)
        try:
            loaded.append(load_plugin(full))
        except ValueError as e:
            raise ConfigError(f"{where}: plugins[{i}]: {e}")
    return loaded


class _Parser:
    def __init__(self, where, registry):
        self.where = where
        self.registry = {v["name"]: v for v in registry}
        self.order = [v["name"] for v in registry]

    def fail(self, path, message, value=None, show=True):
        got = f", got {_show(value)}" if show else ""
        raise ConfigError(f"{self.where}: {path}: {message}{got}")

    def parse(self, data):
        for key in data:
            if key not in TOP_KEYS:
                self.fail(key, "unknown key (allowed: " + ", ".join(TOP_KEYS) + ")", show=False)
        name = data.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            self.fail("name", "required, 1-64 characters of A-Z a-z 0-9 _ . - (the results folder's name)", name)
        for key in ("description", "speed_results"):
            if key in data and not isinstance(data[key], str):
                self.fail(key, "must be a string", data[key])
        deviations = data.get("deviations", [])
        if not isinstance(deviations, list) or not all(isinstance(d, str) for d in deviations):
            self.fail("deviations", "must be a list of strings (where this config departs from the papers)",
                      deviations)
        for key in ("threads", "torch_threads"):
            if key in data and POSITIVE_INT(data[key]):
                self.fail(key, "must be a positive integer", data[key])
        variants = self.variants(data.get("variants", "all"), "variants")
        seeds = self.seeds(data.get("seeds", [1]), "seeds")
        tasks = data.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            self.fail("tasks", "required: a non-empty list of task blocks ({\"task\": \"capacity\" | \"mqar\", ...})",
                      tasks)
        points, ids = [], set()
        for i, block in enumerate(tasks):
            for p in self.task(block, f"tasks[{i}]", variants, seeds):
                if p.id in ids:
                    self.fail(f"tasks[{i}]", f"point '{p.id}' appears twice in the config", show=False)
                ids.add(p.id)
                points.append(p)
        return points

    def seeds(self, value, path):
        values = value if isinstance(value, list) else [value]
        if not values:
            self.fail(path, "must not be empty", value)
        for j, s in enumerate(values):
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                self.fail(f"{path}[{j}]" if isinstance(value, list) else path, "must be a non-negative integer", s)
        return values

    def variants(self, value, path):
        """[(name, given params)] with list-valued parameters expanded as axes."""
        if value == "all":
            return [(name, {}) for name in self.order]
        if not isinstance(value, list) or not value:
            self.fail(path, '"all" or a non-empty list of variant names or {"name": ..., "params": {...}}', value)
        out = []
        for j, item in enumerate(value):
            here = f"{path}[{j}]"
            if isinstance(item, str):
                item = {"name": item}
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                self.fail(here, 'must be a variant name or {"name": ..., "params": {...}}', item)
            extra = sorted(set(item) - {"name", "params"})
            if extra:
                self.fail(f"{here}.{extra[0]}", "unknown key (allowed: name, params)", show=False)
            name = item["name"]
            if name not in self.registry:
                self.fail(f"{here}.name", "not a registered variant (registered: " + ", ".join(self.order) + ")",
                          name)
            params = item.get("params", {})
            if not isinstance(params, dict):
                self.fail(f"{here}.params", "must be an object of the variant's parameters", params)
            out += [(name, p) for p in self.param_axes(name, params, f"{here}.params")]
        return out

    def param_axes(self, name, params, path):
        specs = {p["name"]: p for p in self.registry[name]["params"]}
        axes = []
        for key, value in params.items():
            if key not in specs:
                allowed = ", ".join(specs) or "none"
                self.fail(f"{path}.{key}", f"unknown parameter of variant '{name}' (its parameters: {allowed})",
                          show=False)
            list_typed = "list" in specs[key]["type"]
            values = value if isinstance(value, list) and (not list_typed or all(isinstance(v, list) for v in value)) \
                else [value]
            for v in values:
                self.param_value(specs[key], v, f"{path}.{key}")
            axes.append([(key, v) for v in values])
        return [dict(combo) for combo in itertools.product(*axes)]

    def param_value(self, spec, v, path):
        kind = spec["type"]
        ok = {"integer": isinstance(v, int) and not isinstance(v, bool),
              "number": isinstance(v, (int, float)) and not isinstance(v, bool),
              "string": isinstance(v, str)}.get(kind)
        if ok is None:  # "integer or list of integers"
            ok = (isinstance(v, int) and not isinstance(v, bool)) or (
                isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v))
        if not ok:
            self.fail(path, f"must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}", v)

    def task(self, block, path, variants, seeds):
        if not isinstance(block, dict) or block.get("task") not in TASK_KEYS:
            self.fail(f"{path}.task", "required: " + " or ".join(_show(t) for t in TASK_KEYS),
                      block.get("task") if isinstance(block, dict) else block)
        kind = block["task"]
        keys = TASK_KEYS[kind]
        allowed = ["task", "variants", "seeds", *keys]
        for key in block:
            if key not in allowed:
                self.fail(f"{path}.{key}", f"unknown key of a {kind} task (allowed: {', '.join(allowed)})", show=False)
        if "variants" in block:
            variants = self.variants(block["variants"], f"{path}.variants")
        if "seeds" in block:
            seeds = self.seeds(block["seeds"], f"{path}.seeds")
        axes = {}
        for key, spec in keys.items():
            if key not in block:
                if spec.required:
                    self.fail(f"{path}.{key}", "required", show=False)
                axes[key] = [spec.default]
                continue
            value = block[key]
            values = value if spec.axis and isinstance(value, list) else [value]
            if spec.axis and isinstance(value, list) and not value:
                self.fail(f"{path}.{key}", "must not be an empty list", value)
            for j, v in enumerate(values):
                error = spec.check(v)
                if error:
                    self.fail(f"{path}.{key}" + (f"[{j}]" if values is value else ""), error, v)
            axes[key] = values
        return self.expand(kind, axes, variants, seeds, path)

    def expand(self, kind, axes, variants, seeds, path):
        sizes = ["setting", "n"] if kind == "capacity" else ["seq_len", "kv_pairs", "vocab", "d_model"]
        rest = [k for k in axes if k not in sizes]
        points = []
        for size in itertools.product(*(axes[k] for k in sizes)):
            for name, given in variants:
                for other in itertools.product(*(axes[k] for k in rest)):
                    settings = dict(zip(sizes, size), **dict(zip(rest, other)))
                    self.check_settings(kind, settings, path)
                    for seed in seeds:
                        points.append(self.point(kind, settings, name, given, seed))
        return points

    def check_settings(self, kind, s, path):
        if kind == "mqar":
            try:
                check_mqar_sizes(s["vocab"], s["seq_len"], s["kv_pairs"])
            except ValueError as e:
                self.fail(path, f"seq_len, kv_pairs and vocab do not fit together: {e}", show=False)
            if s["d_model"] % s["heads"]:
                self.fail(f"{path}.d_model", f"must be a multiple of heads ({s['heads']})", s["d_model"])

    def point(self, kind, settings, name, given, seed):
        entry = self.registry[name]
        caps = entry["capabilities"]
        params = {p["name"]: p["default"] for p in entry["params"]}
        params.update({k: v for k, v in MODEL_NORMALISES_KEYS.items() if k in params})
        params.update(given)
        return Point(kind, settings, name, given, params, caps, seed, skip_reason(kind, name, caps))


def skip_reason(kind, name, caps):
    """Why a variant cannot be trained on the task (capabilities, not crashes), or None."""
    if not caps.get("backward"):
        return f"variant '{name}' has no backward pass: it cannot be trained"
    if caps.get("indexer"):
        return (f"variant '{name}' reads a lightning indexer's inputs (index_q, index_k, index_w), which neither "
                "the Python module nor these models produce yet")
    if kind == "mqar" and not caps.get("causal"):
        return (f"variant '{name}' has no causal form: MQAR trains a causal language model (next-token targets), "
                "and a non-causal mixer would read the answers")
    if kind == "capacity" and not caps.get("cross"):
        if not caps.get("causal"):
            return f"variant '{name}' has neither cross-attention nor a causal form to read the query with"
        if not caps.get("own_definition") and not caps.get("key_padding"):
            return (f"variant '{name}' has no cross-attention and no key padding: the query token's own key "
                    "cannot be left out")
    return None
