"""A quality point's result row: the sweep row's fields that apply (the variant and its parameters, the shape
of the attention calls the model trains through, the wall time of every training step in time_ms) and the
task block (what was trained and what it learned). attnbench.result_row completes it with every other field
(null: a training run measures no kernel accuracy, FLOPs or memory) and checks it, so the row is one that
`attnbench run` could have written (configs/README.md, "Result rows").
"""
from . import models
from .store import now
from .tasks import CAPACITY_EVAL_SEQUENCES

MEMORY_NOTE = "not measured: a training run of the quality harness (its time_ms are whole training steps)"


def attention_shape(point):
    """(seq_q, seq_kv, head_dim, heads, mask) of the attention calls the point's model makes."""
    if point.task == "mqar":
        return point["seq_len"], point["seq_len"], point["d_model"] // point["heads"], point["heads"], "causal"
    tokens = point["n"] * (2 if point["setting"] == 2 else 1)
    if models.capacity_reads_cross(point.caps):
        return 1, tokens, point["head_dim"], 1, "none"
    return tokens + 1, tokens + 1, point["head_dim"], 1, "causal"


def task_block(point, outcome):
    s = point.settings
    capacity = point.task == "capacity"
    block = {
        "name": point.task,
        "setting": s["setting"] if capacity else None,
        "size": s["n"] if capacity else s["kv_pairs"],
        "seq_len": (s["n"] * (2 if s["setting"] == 2 else 1)) if capacity else s["seq_len"],
        "vocab": None if capacity else s["vocab"],
        "d_model": s["head_dim"] if capacity else s["d_model"],
        "layers": 1 if capacity else s["layers"],
        "short_conv": False if capacity else s["short_conv"],
        "lr": float(s["lr"]),
        "seed": point.seed,
        "steps": 0, "train_s": 0.0, "eval_s": 0.0, "wall_s": 0.0, "converged": False, "stop": "",
        "curve": [], "data": {"eval_sequences": CAPACITY_EVAL_SEQUENCES} if capacity else {},
    }
    if outcome is None:
        return block
    losses = [e["loss"] for e in outcome.curve]
    accuracies = [e["accuracy"] for e in outcome.curve]
    block.update(steps=outcome.steps, train_s=sum(outcome.step_times), eval_s=outcome.eval_s, wall_s=outcome.wall_s,
                 converged=outcome.converged, stop=outcome.stop, curve=outcome.curve)
    block["data"].update(outcome.extra)
    if outcome.curve:
        block.update(loss=losses[-1], best_loss=min(losses), accuracy=accuracies[-1],
                     best_accuracy=max(accuracies))
    return block


def make_row(attnbench, point, outcome, status, reason, threads, isa, plugin=""):
    """The row of `point` (status ok, skipped or failed) through attnbench.result_row."""
    seq_q, seq_kv, head_dim, heads, mask = attention_shape(point)
    row = {
        "id": point.id, "variant": point.variant, "plugin": plugin, "params": point.params,
        "batch": point["batch"], "heads": heads, "kv_heads": heads, "seq_q": seq_q, "seq_kv": seq_kv,
        "head_dim": head_dim, "v_head_dim": head_dim, "mask": mask, "regime": f"task({point.task})",
        "threads": threads, "isa": isa, "dropout": 0.0, "pass": "forward_backward",
        "exact": bool(point.caps.get("exact")), "status": status, "reason": reason,
        "attempts": 1 if status == "ok" else 0,
        "accuracy": {"reference": "none"}, "accuracy_e2e": {"reference": "none"},
        "memory": {"peak_note": MEMORY_NOTE}, "timestamp": now(),
        "task": task_block(point, outcome),
    }
    if outcome is not None and outcome.step_times:
        row["time_ms"] = attnbench.timing_summary([t * 1e3 for t in outcome.step_times])
    return attnbench.result_row(row)
