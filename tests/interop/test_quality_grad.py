#!/usr/bin/env python3
"""Interop: one training step of the quality harness's models (bench/quality/models.py) through attnbench's fp32
kernels gives the gradients torch autograd gives for the same model in float64 whose attention is written in
plain torch, for every registered variant with a backward, on each model it can train (the capacity model;
the MQAR language model where the variant has a causal form), at tiny sizes that still cross chunk, tile and
block boundaries.

The float64 reference attention is plain torch where the definition is a few lines: softmax attention (naive,
tiled) and its band (sliding_window), linear attention with elu + 1, and the five recurrences token by token.
For the variants whose definition depends on seeded internals (bigbird's random blocks, performer's random
features, linformer's projections, nystrom's landmarks and iterative pseudo-inverse) it is attnbench's own
float64 definition through attnbench.autograd (the fp64 path: reference() and reference_backward(), which read
q, k, v and dO rounded to float32: that rounding is within the tolerance below).

Run by ctest as `/usr/bin/python3 test_quality_grad.py --attnbench PATH` (ATTNBENCH_PYTHON_DIR: the module's
folder). Exit 0 pass, 1 fail, 77 skip (no torch, or no module: a sanitizer build).
"""
import argparse
import copy
import json
import math
import os
import sys
import tempfile
import warnings

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as exc:
    print(f"SKIP: {exc}")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
U = 2.0**-24  # fp32 unit roundoff
FAILURES = []

# Tiny sizes whose axes cross the kernels' boundaries: MQAR L = 16 with recurrence chunks of 4, tiles of 4,
# bigbird blocks of 2, a window of 3; the capacity model with N = 6 (7 tokens with the query: a partial chunk)
# in both settings, V wider than head_dim (two value blocks).
CAPACITY = {"task": "capacity", "setting": [1, 2], "n": 10, "head_dim": 8, "batch": 4}
MQAR = {"task": "mqar", "seq_len": 16, "kv_pairs": 2, "vocab": 40, "d_model": 16, "heads": 2, "layers": 2,
        "short_conv": [False, True], "embed_dropout": 0.0, "batch": 3, "train_examples": 3, "test_examples": 3}
PARAMS = {"tiled": {"tile_q": 4, "tile_kv": 4}, "sliding_window": {"window": 3}, "bigbird": {"block": 2},
          "performer": {"features": 16}, "linformer": {"k": 4}, "nystrom": {"landmarks": 3},
          **{r: {"chunk": 4, "form": ["chunk", "recurrent"]}
             for r in ("retention", "simple_gla", "gla", "delta_rule", "gated_delta_rule", "kda")}}
SEEDED = ("bigbird", "performer", "linformer", "nystrom")  # reference: attnbench's fp64 definition

# The tolerance on ||grad32 - grad64|| / ||grad64|| per parameter tensor, from fp32 epsilon and the sizes.
# Every stage of the model and of its backward is a sum of at most N_MAX products (N_MAX: the widest of
# d_model, the sequence, the vocabulary and the capacity task's value width), whose fp32 error is at most
# gamma(N_MAX) ~ N_MAX * u relative to the sum of the magnitudes. The MQAR model has per layer LayerNorm,
# W_qkv, the convolution, the attention (two products), W_o, then the final LayerNorm, the tied head and the
# cross-entropy: 6 * layers + 4 = 16 stages; the backward doubles them (STAGES = 32). A factor of 10 covers
# cancellation (LayerNorm's and softmax's backward subtract means, so a gradient can be smaller than the
# magnitudes it is summed from) and second-order terms.
N_MAX = 40
STAGES = 2 * (6 * MQAR["layers"] + 4)
CANCELLATION = 10
TOLERANCE = CANCELLATION * STAGES * N_MAX * U / (1 - N_MAX * U)
# A float64 gradient below this fraction of the whole gradient's norm is zero in exact arithmetic: its sums
# cancelled to float64 rounding (2^-40 sits far above float64's 2^-53 and far below any gradient that is not).
ZERO_BY_SYMMETRY = 2.0**-40
# The check must see the attention: the gradients of the same model with the attention output replaced by
# zeros must differ from the reference by at least this many tolerances (else the case is MISTRUSTED).
DISCRIMINATION = 100


def check(condition, message):
    if not condition:
        FAILURES.append(message)
        print("FAIL:", message)


# ---- Plain-torch definitions (float64) ----

def softmax_attention(q, k, v, causal=False, key_padding=None, scale=None, window=None):
    """softmax(scale q k^T + masks) v; window w: key j in [i - w, i + w] (causal: [i - w, i])."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    lq, lk = q.shape[-2], k.shape[-2]
    i = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= (i - j).abs() <= window
    allowed = allowed.expand(s.shape).clone()
    if key_padding is not None:
        allowed &= ~torch.as_tensor(np.asarray(key_padding), dtype=torch.bool)[:, None, None, :]
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def linear_attention(q, k, v, causal=False, eps=1e-6):
    """phi(q) (phi(k)^T v) / (phi(q) . sum phi(k) + eps), phi = elu + 1; causal: prefix sums."""
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    w = fq @ fk.transpose(-1, -2)
    if causal:
        w = torch.tril(w)
    return (w @ v) / (w.sum(dim=-1, keepdim=True) + eps)


def recurrence(variant, q, k, v, scale=None, g=None, beta=None):
    """The six recurrences token by token: S_t (d_k x d_v) from S_{t-1}, o_t = scale q_t S_t."""
    b, h, length, dk = q.shape
    scale = 1.0 / math.sqrt(dk) if scale is None else scale
    state = q.new_zeros(b, h, dk, v.shape[-1])
    gamma = torch.tensor([1 - 2.0 ** (-5 - i) for i in range(h)], dtype=q.dtype)[None, :, None, None]
    outs = []
    for t in range(length):
        kt, vt = k[:, :, t], v[:, :, t]
        if variant == "retention":
            decay = gamma
        elif variant in ("gla", "kda"):
            decay = torch.exp(g[:, :, t])[..., None]
        elif variant in ("simple_gla", "gated_delta_rule"):
            decay = torch.exp(g[:, :, t])[..., None, None]
        else:
            decay = 1.0
        state = decay * state
        if variant in ("delta_rule", "gated_delta_rule", "kda"):
            old = torch.einsum("bhk,bhkv->bhv", kt, state)
            update = beta[:, :, t, None] * (vt - old)
        else:
            update = vt
        state = state + kt[..., :, None] * update[..., None, :]
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outs, dim=2)


def zero_attention(variant, q, k, v, **options):
    """An attention that contributes nothing: what the comparison must be able to tell from the kernels."""
    return q.new_zeros(q.shape[:-1] + v.shape[-1:])


def reference_attention(attnbench):
    """The float64 op the reference model calls in place of attnbench's kernels."""
    def attention(variant, q, k, v, causal=False, params=None, scale=None, g=None, beta=None, key_padding=None,
                  threads=None):
        params = params or {}
        if variant in SEEDED:
            return attnbench.attention_function(variant, q, k, v, causal=causal, params=params, scale=scale,
                                                key_padding=key_padding)
        if variant in ("naive", "tiled"):
            return softmax_attention(q, k, v, causal, key_padding, scale)
        if variant == "sliding_window":
            return softmax_attention(q, k, v, causal, key_padding, scale, window=params["window"])
        if variant == "linear":
            return linear_attention(q, k, v, causal, params.get("eps", 1e-6))
        return recurrence(variant, q, k, v, scale, g, beta)
    return attention


# ---- The cases ----

def points(registry, tmp):
    """Every (variant, model) case as the harness's own Points, from a config the harness parses."""
    from quality import config

    variants = [{"name": v["name"], "params": PARAMS.get(v["name"], {})} for v in registry]
    cfg = {"name": "grad", "variants": variants, "tasks": [CAPACITY, MQAR]}
    path = os.path.join(tmp, "grad.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return config.load(path, registry).points


def batch(point):
    """One training batch of the point's task, as the harness draws it."""
    from quality import tasks, train

    if point.task == "capacity":
        task = tasks.CapacityTask(point["n"], point["setting"], np.random.RandomState(point.seed))
        keys, values, query, target = (torch.from_numpy(a) for a in task.batch(point["batch"]))
        return lambda model: train.models.capacity_loss(model(keys, values, query), target, point["n"])
    (x, y), _ = train.mqar_data(point)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    return lambda model: train.mqar_loss(model, x, y)


def gradients(model, loss_fn):
    """The loss and every parameter's gradient (none when the loss does not depend on the parameters: the
    capacity model reads its output from the attention alone)."""
    model.zero_grad()
    loss = loss_fn(model)
    if loss.requires_grad:
        loss.backward()
    return loss.item(), {name: p.grad.detach().double().clone() for name, p in model.named_parameters()
                         if p.grad is not None}


def relative(a, b, floor=0.0):
    """||a - b|| / max(||b||, floor)."""
    return float((a - b).norm() / max(float(b.norm()), floor, 1e-300))


def case(attnbench, point):
    from quality import models, train

    build = train.capacity_model if point.task == "capacity" else train.mqar_model
    loss_fn = batch(point)
    torch.manual_seed(point.seed)
    model32 = build(point, models.attnbench_attention, {"threads": 2})
    model64 = copy.deepcopy(model32).double()
    model64.apply(lambda m: setattr(m, "attention", reference_attention(attnbench)) if hasattr(m, "attention") else 0)
    zero = copy.deepcopy(model64)
    zero.apply(lambda m: setattr(m, "attention", zero_attention) if hasattr(m, "attention") else 0)
    loss32, g32 = gradients(model32, loss_fn)
    loss64, g64 = gradients(model64, loss_fn)
    _, g0 = gradients(zero, loss_fn)
    # Each tensor's error relative to its own gradient; except a gradient zero in exact arithmetic (the key
    # bias under softmax's shift invariance: sum_j dS_ij = 0), whose float64 value is rounding residue far
    # below the rest: its fp32 value is residue too, judged against the whole gradient's norm.
    whole = float(torch.cat([g.flatten() for g in g64.values()]).norm())
    symmetric = {n for n, g in g64.items() if float(g.norm()) <= ZERO_BY_SYMMETRY * whole}
    zeros = {n: torch.zeros_like(g) for n, g in g64.items()}
    errors = {n: relative(g32.get(n, zeros[n]), g64[n], whole if n in symmetric else 0.0) for n in g64}
    worst = max(errors.values())
    seen = max(relative(g0.get(n, zeros[n]), g64[n]) for n in g64 if n not in symmetric)
    check(set(g32) == set(g64), f"{point.id}: parameters with a gradient differ: {sorted(set(g32) ^ set(g64))}")
    check(abs(loss32 - loss64) <= TOLERANCE * max(abs(loss64), 1.0),
          f"{point.id}: loss {loss32} (fp32 kernels) vs {loss64} (float64 reference)")
    check(worst <= TOLERANCE, f"{point.id}: gradient rel. error {worst:.3g} > tolerance {TOLERANCE:.3g}: "
          + ", ".join(f"{n} {e:.2g}" for n, e in errors.items() if e > TOLERANCE))
    check(seen >= DISCRIMINATION * TOLERANCE,
          f"{point.id}: MISTRUSTED: without the attention the gradients move only {seen:.3g} (< {DISCRIMINATION} "
          "tolerances): the comparison would not see a wrong kernel")
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True)
    ap.parse_args()
    module_dir = os.environ.get("ATTNBENCH_PYTHON_DIR")
    if not module_dir or not os.path.isdir(module_dir):
        print("SKIP: ATTNBENCH_PYTHON_DIR unset (no Python module in this build)")
        return 77
    sys.path.insert(0, module_dir)
    import attnbench

    torch.set_num_threads(2)
    # The fp64 definitions read q, k, v and dO rounded to float32 and warn that they do; that rounding is within
    # the tolerance (it perturbs the inputs by one unit roundoff).
    warnings.filterwarnings("ignore", message="attnbench.autograd: float64", category=RuntimeWarning)
    registry = attnbench.variants()
    # Variants reading indexer inputs (dsa) are skipped by the harness with the reason (bench/quality/config.py).
    trained = {v["name"] for v in registry
               if v["capabilities"].get("backward") and not v["capabilities"].get("indexer")}
    print(f"tolerance {TOLERANCE:.3g} (= {CANCELLATION} x {STAGES} stages x gamma({N_MAX}))")
    with tempfile.TemporaryDirectory() as tmp:
        cases = [p for p in points(registry, tmp) if not p.skip]
    covered = {}
    for point in cases:
        worst = case(attnbench, point)
        covered.setdefault(point.variant, set()).add(point.task)
        print(f"{worst:9.2e}  {point.id}")
    missing = sorted(trained - set(covered))
    check(not missing, f"variants with a backward but no case: {missing}")
    for v in sorted(covered):
        caps = next(r["capabilities"] for r in registry if r["name"] == v)
        if caps.get("causal"):
            check("mqar" in covered[v], f"{v}: has a causal form but no MQAR case")
    print(f"{len(cases)} cases, {len(covered)} variants")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
