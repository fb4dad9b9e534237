"""Reading a folder written by `attnbench patterns` (patterns.json, <variant>.npy, the recurrences' g / beta) and
what the figure and REPORT.md say about it: which variants were drawn, on which colour scale, masked or not,
which were not and why, and the inputs the recurrences read. Needs numpy for the .npy files; no matplotlib.

Every entry of patterns.json has a status: "ok" (drawn), "skipped" or "failed" (with a reason). An "ok" entry
whose file cannot be read, or is not [heads, n, n], is listed as failed (with a warning) and the others are
drawn: one variant without a pattern never fails the report; only a folder with no pattern at all does (an
InputError naming patterns.json).
"""
import json
import os
import sys

from .common import PROG, InputError, fmt_num

MAX_PANELS = 16  # heatmaps in the figure: fewer heads per variant when there are many variants
MAX_HEADS = 4
# A variant with any negative weight (the recurrences' signed, unnormalised weights of each value, Nyström's
# pseudo-inverse, Linformer's projections) is drawn on a symmetric signed-√ scale; the others on a √ scale from 0.
SCALES = {"sqrt": "√ from 0", "signed_sqrt": "signed √, symmetric about 0"}
MASKS = {"auto": "causal where the variant has a causal form", "causal": "causal", "none": "unmasked"}


def heads_shown(variants, heads):
    """How many heads (the first ones) the figure draws per variant: all (up to MAX_HEADS) for a few variants,
    fewer as they grow, at least one, at most MAX_PANELS heatmaps in all (while there are no more variants)."""
    return max(1, min(heads, MAX_HEADS, MAX_PANELS // max(1, variants)))


def heads_text(shown, heads):
    """Which heads the figure draws: "all 4 heads", "head 0 of 4", "heads 0–1 of 4"."""
    if shown == heads:
        return f"all {heads} heads" if heads > 1 else "its one head"
    return f"head 0 of {heads}" if shown == 1 else f"heads 0–{shown - 1} of {heads}"


def _read(meta_path):
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except ValueError as e:
        raise InputError(f"{meta_path}: not valid JSON ({e})")
    if not isinstance(meta, dict) or not isinstance(meta.get("variants", []), list):
        raise InputError(f"{meta_path}: not what `attnbench patterns` writes (an object with a \"variants\" list)")
    return meta


def _weights(pdir, entry):
    """(the [heads, n, n] weights of an ok entry, None) or (None, why it cannot be drawn)."""
    import numpy as np

    path = os.path.join(pdir, str(entry.get("file", "")))
    try:
        w = np.load(path)
    except (OSError, ValueError) as e:
        return None, f"cannot read {path} ({e})"
    if w.ndim != 3 or w.shape[1] != w.shape[2] or w.shape[0] < 1:
        return None, f"{path}: shape {w.shape}; expected [heads, n, n]"
    return w.astype(np.float64), None


def load_patterns(pdir):
    """The folder as {"dir", "meta" (patterns.json), "tokens" (or None), "drawn": [(entry, weights [heads, n, n])]
    of the entries with a pattern, "missing": [{"variant", "status", "reason"}] of the others}."""
    meta_path = os.path.join(pdir, "patterns.json")
    if not os.path.isfile(meta_path):
        raise InputError(f"--patterns '{pdir}': no patterns.json (write one with `attnbench patterns ... --out DIR`)")
    meta = _read(meta_path)
    tokens = None
    if meta.get("tokens"):
        with open(os.path.join(pdir, meta["tokens"]), encoding="utf-8") as f:
            tokens = json.load(f)
    drawn, missing = [], []
    for v in meta.get("variants", []):
        name = str(v.get("name", "?")) if isinstance(v, dict) else "?"
        status = v.get("status", "ok") if isinstance(v, dict) else "failed"
        w, why = _weights(pdir, v) if status == "ok" else (None, v.get("reason") or "no reason given")
        if w is None:
            if status == "ok":
                print(f"{PROG}: warning: {meta_path}: {name} is listed ok but has no pattern to draw: {why}",
                      file=sys.stderr)
            missing.append({"variant": name, "status": "failed" if status == "ok" else str(status), "reason": why})
        else:
            drawn.append((v, w))
    if not drawn:
        why = "; ".join(f"{m['variant']}: {m['status']} ({m['reason']})" for m in missing) or "no variants"
        raise InputError(f"{meta_path}: no variant has a pattern to draw ({why})")
    return {"dir": pdir, "meta": meta, "tokens": tokens, "drawn": drawn, "missing": missing}


def mask_mode(meta):
    """patterns.json's "mask" ("none", "causal", "auto"); folders written before it: from its "causal"."""
    m = meta.get("mask")
    return m if m in MASKS else ("causal" if meta.get("causal") else "none")


def is_causal(meta, entry):
    """Whether a variant's pattern was drawn causal (its entry's "causal", else the folder's)."""
    return bool(entry.get("causal", meta.get("causal", False)))


def unmasked_note(meta, entry):
    """" (unmasked)" for a variant drawn without a mask beside causal ones (--mask auto: it has no causal form)."""
    return " (unmasked)" if mask_mode(meta) != "none" and not is_causal(meta, entry) else ""


def scale_of(w):
    """"signed_sqrt" when any finite weight is negative, else "sqrt" (see SCALES)."""
    import numpy as np

    finite = w[np.isfinite(w)]
    return "signed_sqrt" if finite.size and finite.min() < 0 else "sqrt"


def _inputs(entry):
    """{"g": {"distribution", "shape", "file"}, "beta": ...} of a recurrence's entry (what it read), or an
    indexer's index_q / index_k / index_w (dsa), else {}."""
    ins = entry.get("inputs") if isinstance(entry.get("inputs"), dict) else {}
    return {k: {f: ins[k].get(f) for f in ("distribution", "shape", "file")}
            for k in ("g", "beta", "index_q", "index_k", "index_w") if isinstance(ins.get(k), dict)}


def summarise(p):
    """What the figure and the report say about a loaded folder (load_patterns), as JSON values: the mask, the
    size, the heads drawn, per variant its scale, range, mask and inputs, and the variants not drawn."""
    import numpy as np

    meta = p["meta"]
    heads = min(w.shape[0] for _, w in p["drawn"])
    variants = []
    for entry, w in p["drawn"]:
        finite = w[np.isfinite(w)]
        variants.append({"variant": entry.get("name", "?"), "causal": is_causal(meta, entry),
                         "unmasked_beside_causal": unmasked_note(meta, entry) != "", "scale": scale_of(w),
                         "min": float(finite.min()) if finite.size else None,
                         "max": float(finite.max()) if finite.size else None,
                         "nonfinite": int(w.size - finite.size), "inputs": _inputs(entry)})
    return {"mask": mask_mode(meta), "seq": int(p["drawn"][0][1].shape[1]), "heads": heads,
            "heads_shown": heads_shown(len(variants), heads), "seed": meta.get("seed"), "variants": variants,
            "missing": p["missing"]}


def _shape(s):
    return "×".join(str(x) for x in s) if isinstance(s, list) else "?"


def notes(summary):
    """The figure's footnote and the report's list, one sentence each: the scales and which variants are signed,
    the variants drawn unmasked, the recurrences' g / beta, the variants not drawn with their reasons."""
    vs = summary["variants"]
    signed = [v["variant"] for v in vs if v["scale"] == "signed_sqrt"]
    out = [f"Colour: each variant on its own scale, {SCALES['sqrt']} (magma, 0 black) where every weight is >= 0"
           + (f"; {SCALES['signed_sqrt']} (red positive, blue negative, 0 white) for a variant with a negative "
              f"weight: {', '.join(signed)}" if signed else "") + "."]
    unmasked = [v["variant"] for v in vs if v["unmasked_beside_causal"]]
    if unmasked:
        out.append(f"Unmasked (no causal form): {', '.join(unmasked)}.")
    drawn_inputs = [f"{v['variant']}: " + ", ".join(f"{k} = {i['distribution'] or '?'} [{_shape(i['shape'])}]"
                                                     for k, i in v["inputs"].items()) for v in vs if v["inputs"]]
    if drawn_inputs:
        seed = f" (seed {summary['seed']})" if summary.get("seed") is not None else ""
        out.append(f"The recurrences' gates and step sizes, drawn{seed} as the sweep draws them: "
                   + "; ".join(drawn_inputs) + ".")
    nonfinite = [f"{v['variant']} ({v['nonfinite']})" for v in vs if v["nonfinite"]]
    if nonfinite:
        out.append("Non-finite weights (left blank): " + ", ".join(nonfinite) + ".")
    if summary["missing"]:
        out.append("Not drawn: " + "; ".join(f"{m['variant']} ({m['status']}: {m['reason']})"
                                            for m in summary["missing"]) + ".")
    return out


def range_text(v):
    """A variant's range of finite weights for the report: "[-0.12, 1.3]"."""
    return f"[{fmt_num(v['min'], '.2g')}, {fmt_num(v['max'], '.2g')}]" if v["min"] is not None else "—"
