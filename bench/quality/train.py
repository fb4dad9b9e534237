"""Training one point: Schlag's loop for the capacity task (his synthetic/main.py) and Zoology's Trainer for
MQAR, in torch (Adam / AdamW, cross_entropy, DataLoader, CosineAnnealingLR). A point is seeded whole: torch's
generator (initialisation, dropout, the DataLoader's shuffling) and the task's numpy RandomState, so one seed
gives one loss curve, bit for bit (tests/interop/test_quality_harness.py runs a point twice).
"""
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from . import models
from .tasks import CAPACITY_EVAL_SEQUENCES, MQAR_IGNORE, CapacityTask, leaked, mqar

# MQAR's test set is drawn with seed + this (the training set with seed), so the two never share a generator.
MQAR_TEST_SEED_OFFSET = 1_000_003


class Diverged(Exception):
    """The training loss became NaN or infinite: the point fails with the step named."""


class Outcome:
    """What one training run measured: the evaluations (curve: [{step, loss, accuracy}]), the wall time and the
    loss of every training step (forward, loss, backward, optimiser step; no data loading or evaluation), why it
    stopped and whether it converged (met the task's criterion). `extra` holds the task's own facts."""

    def __init__(self):
        self.curve, self.step_times, self.train_losses, self.extra = [], [], [], {}
        self.steps, self.stop, self.converged = 0, "", False
        self.eval_s = 0.0
        self.start = time.perf_counter()
        self.wall_s = 0.0

    def evaluation(self, step, loss, accuracy):
        self.curve.append({"step": step, "loss": loss, "accuracy": accuracy})

    def finish(self, stop, converged):
        self.stop, self.converged = stop, converged
        self.wall_s = time.perf_counter() - self.start
        return self


def _timed_step(model, optimizer, loss_fn, outcome):
    t = time.perf_counter()
    loss = loss_fn()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    outcome.step_times.append(time.perf_counter() - t)
    outcome.steps += 1
    value = loss.item()
    outcome.train_losses.append(value)
    if not np.isfinite(value):
        raise Diverged(f"training loss became {value} at step {outcome.steps}")
    return value


def capacity_model(point, attention=models.attnbench_attention, options=None):
    spec = models.VariantSpec(point.variant, point.params, point.caps)
    return models.CapacityModel(spec, point["n"], point["head_dim"], attention, options)


def train_capacity(point, progress, attention=models.attnbench_attention, options=None):
    """Schlag's loop: Adam, batches of `batch` fresh examples, an evaluation every `eval_every` steps (20
    sequences, each queried at every distinct key), stop when the evaluation loss is <= stop_loss, after
    more than `patience` evaluations in a row without a new lowest loss (his max_strike), or at max_steps."""
    torch.manual_seed(point.seed)
    rng = np.random.RandomState(point.seed)
    task = CapacityTask(point["n"], point["setting"], rng)
    model = capacity_model(point, attention, options)
    optimizer = torch.optim.Adam(model.parameters(), lr=point["lr"])
    outcome, best, strikes = Outcome(), np.inf, 0
    n = point["n"]
    for step in range(1, point["max_steps"] + 1):
        keys, values, query, target = (torch.from_numpy(a) for a in task.batch(point["batch"]))
        model.train()
        loss = _timed_step(model, optimizer,
                           lambda: models.capacity_loss(model(keys, values, query), target, n), outcome)
        if step % point["eval_every"] and step != point["max_steps"]:
            continue
        eval_loss, accuracy = _evaluate_capacity(model, task, point["batch"], outcome)
        outcome.evaluation(step, eval_loss, accuracy)
        progress(outcome, loss)
        if eval_loss < best:
            best, strikes = eval_loss, 0
        else:
            strikes += 1
        if eval_loss <= point["stop_loss"]:
            return outcome.finish("stop_loss", True)
        if strikes > point["patience"]:
            return outcome.finish("no_improvement", False)
    return outcome.finish("max_steps", False)


def _evaluate_capacity(model, task, batch, outcome):
    """Schlag's evaluation: the mean of the per-batch losses over 20 sequences, each split into batches of at
    most `batch` queries; and the fraction of queries whose largest output is the right value."""
    t = time.perf_counter()
    model.eval()
    losses, right, total = [], 0, 0
    with torch.no_grad():
        for _ in range(CAPACITY_EVAL_SEQUENCES):
            keys, values, query, target = (torch.from_numpy(a) for a in task.eval_sequence())
            for i in range(0, len(query), batch):
                part = slice(i, i + batch)
                y_hat = model(keys[part], values[part], query[part])
                losses.append(models.capacity_loss(y_hat, target[part], task.n).item())
                right += int((y_hat.argmax(dim=-1) == target[part] - task.n).sum())
                total += len(y_hat)
    outcome.eval_s += time.perf_counter() - t
    return float(np.mean(losses)), right / total


def mqar_model(point, attention=models.attnbench_attention, options=None):
    spec = models.VariantSpec(point.variant, point.params, point.caps)
    positions = {"all": True, "none": False}.get(point["positions"], spec.family == "softmax")
    return models.LanguageModel(spec, point["vocab"], point["d_model"], point["layers"], point["heads"],
                                point["seq_len"], positions, point["short_conv"], point["embed_dropout"],
                                attention, options)


def mqar_loss(model, x, y):
    """Zoology's loss: cross_entropy over the query positions (the others are labelled -100 and ignored), the
    logits computed at those positions only (LanguageModel's `select`: the same loss and gradients)."""
    asked = y != MQAR_IGNORE
    return F.cross_entropy(model(x, asked), y[asked])


def mqar_data(point):
    """(train inputs, train labels, test inputs, test labels) as int64 tensors."""
    s = point.settings
    train = mqar(s["vocab"], s["train_examples"], s["seq_len"], s["kv_pairs"], point.seed, s["power_a"])
    test = mqar(s["vocab"], s["test_examples"], s["seq_len"], s["kv_pairs"], point.seed + MQAR_TEST_SEED_OFFSET,
                s["power_a"])
    return train, test


def train_mqar(point, progress, attention=models.attnbench_attention, options=None, data=None):
    """Zoology's Trainer: AdamW (weight_decay), cross_entropy over the query positions (labels -100
    elsewhere), the training set shuffled every epoch, cosine annealing of the learning rate over `epochs`
    (stepped per epoch, eta_min 0), an evaluation on the test set after every epoch (or every `eval_every`
    steps), stop once the test accuracy exceeds stop_accuracy, after `epochs`, or at max_steps."""
    (train_x, train_y), (test_x, test_y) = data or mqar_data(point)
    outcome = Outcome()
    outcome.extra = {"train_examples": len(train_x), "test_examples": len(test_x),
                     "test_seed": point.seed + MQAR_TEST_SEED_OFFSET, "leaked": leaked(train_x, test_x)}
    torch.manual_seed(point.seed)
    model = mqar_model(point, attention, options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=point["lr"], weight_decay=point["weight_decay"])
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=point["epochs"], eta_min=0.0)
    loader = DataLoader(TensorDataset(torch.from_numpy(train_x), torch.from_numpy(train_y)),
                        batch_size=point["batch"], shuffle=True, generator=torch.Generator().manual_seed(point.seed))
    test = (torch.from_numpy(test_x), torch.from_numpy(test_y))
    every, max_steps = point["eval_every"], point["max_steps"]
    for _ in range(point["epochs"]):
        for x, y in loader:
            model.train()
            loss = _timed_step(model, optimizer, lambda: mqar_loss(model, x, y), outcome)
            last = max_steps is not None and outcome.steps >= max_steps
            if (every != "epoch" and outcome.steps % every == 0) or last:
                if _evaluate_mqar(model, test, point, outcome, progress, loss) > point["stop_accuracy"]:
                    return outcome.finish("stop_accuracy", True)
            if last:
                return outcome.finish("max_steps", False)
        if every == "epoch" and _evaluate_mqar(model, test, point, outcome, progress, loss) > point["stop_accuracy"]:
            return outcome.finish("stop_accuracy", True)
        schedule.step()
    if not outcome.curve or outcome.curve[-1]["step"] != outcome.steps:
        _evaluate_mqar(model, test, point, outcome, progress, loss)
    return outcome.finish("epochs", False)


def _evaluate_mqar(model, test, point, outcome, progress, train_loss):
    """Zoology's test: the mean of the per-batch losses and the accuracy over every query position of the test
    set (argmax of the logits against the label; the logits at those positions only, as mqar_loss); recorded in
    the curve, reported, returned (accuracy)."""
    t = time.perf_counter()
    model.eval()
    inputs, labels = test
    losses, right, total = [], 0, 0
    with torch.no_grad():
        for i in range(0, len(inputs), point["batch"]):
            x, y = inputs[i:i + point["batch"]], labels[i:i + point["batch"]]
            asked = y != MQAR_IGNORE
            logits = model(x, asked)
            losses.append(F.cross_entropy(logits, y[asked]).item())
            right += int((logits.argmax(dim=-1) == y[asked]).sum())
            total += int(asked.sum())
    outcome.eval_s += time.perf_counter() - t
    accuracy = right / total
    outcome.evaluation(outcome.steps, float(np.mean(losses)), accuracy)
    progress(outcome, train_loss)
    return accuracy


def train(point, progress, attention=models.attnbench_attention, options=None):
    return (train_capacity if point.task == "capacity" else train_mqar)(point, progress, attention, options)
