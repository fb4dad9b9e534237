"""The figure of `attnbench drift --json`: rel_l2 of each variant's fp32 hidden states against the fp64 stack
(log scale) after each layer, one line per variant in its colour and marker (styles.py, as in every figure; the
exact baseline thicker: the fp32 floor), from one or more drift JSON documents (several files: one line style per
file, each line's label naming its file; one file: the baseline dashed). A variant whose states went
NaN/Inf is drawn up to its last finite layer with an x at the failing layer; skipped variants are listed under
the title. The CPU (or CPUs) in the title. Saved as OUT/drift.png and .svg (figures.save_figure: written to a
temporary name, then renamed)."""
import json
import os

from .common import InputError, num
from .styles import StyleTable, registry_order

STEM = "drift"
LINESTYLES = ["-", "--", ":", "-."]  # one per drift document when there are several


def load_drift(path):
    """The document `attnbench drift --json` printed, checked enough to draw: InputError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise InputError(f"'{path}': cannot read the drift JSON ({e.strerror or e})")
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"'{path}': not valid JSON ({e}); give what `attnbench drift ... --json` printed")
    if not isinstance(doc, dict) or doc.get("command") != "drift" or not isinstance(doc.get("variants"), list):
        raise InputError(f"'{path}': not the output of `attnbench drift ... --json` (no \"command\": \"drift\" "
                         "with a \"variants\" list)")
    for i, v in enumerate(doc["variants"]):
        if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not isinstance(v.get("layers"), list):
            raise InputError(f"'{path}': variants[{i}] must be an object with a string \"name\" and a \"layers\" "
                             f"list, got {json.dumps(v)[:80]}")
        for j, m in enumerate(v["layers"]):
            if not isinstance(m, dict) or not isinstance(m.get("layer"), int) or num(m.get("rel_l2")) is None:
                raise InputError(f"'{path}': variants[{i}].layers[{j}] needs an integer \"layer\" and a number "
                                 f"\"rel_l2\", got {json.dumps(m)[:80]}")
    return doc


def describe(doc):
    return (f"L={doc.get('layers', '?')}, d_model {doc.get('d_model', '?')}, {doc.get('heads', '?')} heads, "
            f"{doc.get('tokens', '?')} tokens, {'causal' if doc.get('causal') else 'non-causal'}, "
            f"seed {doc.get('seed', '?')}")


def fig_drift(docs):
    """docs: [(path, doc)]."""
    import matplotlib.pyplot as plt
    from .figures import tag

    fig, ax = plt.subplots(figsize=(8, 5))
    ax.set_yscale("log")
    several = len(docs) > 1
    # The documents carry no registry: the built-ins' pinned styles, any other variant's by its sorted name.
    table = StyleTable(registry_order({}, {v["name"] for _, doc in docs for v in doc["variants"]}))
    notes, cpus, max_layer, drawn = [], [], 0, 0
    for k, (path, doc) in enumerate(docs):
        cpu = doc.get("cpu_model") or "unknown CPU"
        if cpu not in cpus:
            cpus.append(cpu)
        suffix = f" [{os.path.splitext(os.path.basename(path))[0]}]" if several else ""
        for v in doc["variants"]:
            name = v["name"] + suffix
            if v.get("status") == "skipped":
                notes.append(f"skipped: {name} ({v.get('reason', '')})")
                continue
            pts = [(m["layer"], num(m["rel_l2"])) for m in v["layers"]]
            pts = [(x, y) for x, y in pts if y is not None and y > 0 and y == y and y != float("inf")]
            baseline = bool(v.get("baseline"))
            st = table.of(v["name"])
            ls = LINESTYLES[k % len(LINESTYLES)] if several else "--" if baseline else "-"
            label = name + (" (baseline: fp32 floor)" if baseline else "")
            if pts:
                line, = tag(ax.plot([x for x, _ in pts], [y for _, y in pts], marker=st.marker, ms=4.5,
                                    color=st.color, ls=ls, lw=2.0 if baseline else 1.4, zorder=5 if baseline else 2,
                                    label=label), v["name"])
                drawn += 1
                max_layer = max(max_layer, pts[-1][0])
                if v.get("status") == "nonfinite" and isinstance(v.get("failed_layer"), int):
                    ax.plot([v["failed_layer"]], [pts[-1][1]], marker="x", ms=10, mew=2, color=line.get_color(), ls="")
                    ax.annotate("NaN/Inf", (v["failed_layer"], pts[-1][1]), xytext=(6, 4), textcoords="offset points",
                                fontsize=7, color=line.get_color())
                    max_layer = max(max_layer, v["failed_layer"])
            if v.get("status") == "nonfinite":
                notes.append(f"NaN/Inf: {name} at layer {v.get('failed_layer', '?')}")
        max_layer = max(max_layer, int(doc.get("layers") or 0))
    title = "Drift through the layers: ||h_l - h_l(fp64)||_F / ||h_l(fp64)||_F\n" + "CPU: " + "; ".join(cpus)
    if not several:
        title += "\n" + describe(docs[0][1])
    else:
        title += "\n" + "; ".join(f"{os.path.basename(p)}: {describe(d)}" for p, d in docs)
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_xlabel("layer (0 = embeddings + positions)")
    ax.set_ylabel("rel_l2 vs the fp64 stack (log scale)")
    ax.set_xticks(range(0, max_layer + 1))
    ax.grid(True, which="both", alpha=0.25)
    if drawn:
        ax.legend(fontsize=7, loc="best")
    else:
        ax.text(0.5, 0.5, "no variant with a positive error to draw", ha="center", va="center",
                transform=ax.transAxes, color="gray")
    if notes:
        fig.text(0.01, -0.02, "\n".join(notes), fontsize=7, va="top", ha="left", color="dimgray")
    return fig


def plot_drift(paths, out_dir=None):
    """Draws OUT_DIR/drift.png and .svg (OUT_DIR: the first JSON's folder by default); prints the paths."""
    docs = [(p, load_drift(p)) for p in paths]
    out_dir = out_dir or os.path.dirname(os.path.abspath(paths[0]))
    os.makedirs(out_dir, exist_ok=True)
    from .figures import save_figure  # matplotlib and the figures' style, only once the input is good

    for p in save_figure(fig_drift(docs), out_dir, STEM):
        print(p)
    return 0
