"""Multi-head latent attention rows (results.mla.jsonl, written by `attnbench mla --sweep CONFIG`, scripts/run's
MLA step): reading them, the analysis (per preset and form the time per token, where the absorbed form passes
the naive one in decode and where the naive one passes it again as the new tokens grow, beside the sweep's
decode rows at the same head count) and REPORT.md's MLA section. No numpy, no matplotlib: the figure is
figures.fig_mla."""
import json
import os
import sys

from .common import PROG, InputError, fmt_bytes, fmt_num, json_num, md_table, num

MLA_FILE = "results.mla.jsonl"
# The MLA forms as rows name them ("naive" is MLA's naive form here, not the variant of that name).
NAIVE, ABSORBED, GQA = "naive", "absorbed", "gqa"  # structure: not a variant
FORMS = (NAIVE, ABSORBED, GQA)
REQUIRED = ("kind", "form", "shape", "batch", "context", "new_tokens", "median_ms", "core_median_ms",
            "cache_bytes_per_token")


def read_mla(results_dir):
    """The MLA rows of a results folder ([] without results.mla.jsonl), last row per point wins (a rerun
    replaces). A torn last line is dropped with a warning; any other bad line is an error naming file:line."""
    path = os.path.join(results_dir, MLA_FILE)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    rows = {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or row.get("kind") != "mla":
                raise ValueError("not an MLA row (needs \"kind\": \"mla\")")
            missing = [k for k in REQUIRED if k not in row]
            if missing:
                raise ValueError("missing " + ", ".join(missing))
            if row["form"] not in FORMS:
                raise ValueError(f"form {row['form']!r} (allowed: naive, absorbed, gqa)")
        except ValueError as e:
            if all(not rest.strip() for rest in lines[no:]):
                print(f"{PROG}: warning: {path}:{no}: torn last line dropped ({e})", file=sys.stderr)
                break
            raise InputError(f"{path}:{no}: {e}")
        rows[_point(row)] = row
    return list(rows.values())


def _preset(row):
    """The preset's name, else its shape in short."""
    s = row["shape"]
    return row.get("preset") or (f"E{s.get('d_model')}_H{s.get('heads')}_r{s.get('kv_lora_rank')}"
                                 f"_{s.get('qk_nope_dim')}+{s.get('qk_rope_dim')}_{s.get('v_head_dim')}")


def _point(row):
    return (_preset(row), row["form"], row["batch"], row["context"], row["new_tokens"], row.get("variant"),
            row.get("threads"))


def _crossing(xs, ratios):
    """The x from which ratio < 1 at every measured x after it (interpolated in log-log between the two
    bracketing xs), with how: "measured", "at every measured" (below 1 throughout) or "never" (not below 1 at
    the largest x)."""
    from .analysis import crossover  # analysis imports numpy; this module's readers need not
    n, how = crossover(xs, ratios)
    if n is not None:
        return json_num(n), "measured"
    return None, "at every measured" if how == "at every measured n" else "never"


def analyze_mla(rows, decode_rows):
    """The MLA view, None without MLA rows. decode_rows: the sweep's measured forward decode rows with
    seq_q 1 (results.Row), drawn beside the MLA rows of the same head count."""
    if not rows:
        return None
    series = {}
    for r in rows:
        series.setdefault((_preset(r), r["form"], r["batch"], r.get("threads")), []).append(r)
    out = []
    form_order = {f: i for i, f in enumerate(FORMS)}
    for (preset, form, batch, threads), rs in sorted(series.items(), key=lambda kv: (kv[0][0], form_order[kv[0][1]],
                                                                                      kv[0][2], kv[0][3] or 0)):
        rs.sort(key=lambda r: (r["context"], r["new_tokens"]))
        pts = []
        for r in rs:
            t, core, s = num(r["median_ms"]), num(r["core_median_ms"]), r["new_tokens"]
            pts.append({"context": r["context"], "new_tokens": s, "time_ms": json_num(t),
                        "time_per_token_ms": json_num(t / s) if t is not None else None,
                        "core_ms": json_num(core), "core_share": json_num(core / t) if t and core is not None else None,
                        "gflops_per_s": json_num(num(r.get("gflops_per_s"))), "frac_peak": json_num(num(r.get("frac_peak"))),
                        "gb_per_s": json_num(num(r.get("gb_per_s"))), "rel_l2": json_num(num(r.get("rel_l2"))),
                        "cache_bytes_per_token": r["cache_bytes_per_token"]})
        gqa = rs[0].get("gqa") if form == GQA and isinstance(rs[0].get("gqa"), dict) else None
        out.append({"preset": preset, "form": form, "batch": batch, "threads": threads, "heads": rs[0]["shape"].get("heads"),
                    "gqa": gqa, "label": f"GQA core ({gqa.get('kv_heads')} KV heads × {gqa.get('head_dim')})" if gqa
                    else "GQA core" if form == GQA else f"MLA {form}",
                    "shape": rs[0]["shape"], "variant": rs[0].get("variant"), "points": pts,
                    "cache_bytes_per_token": rs[0]["cache_bytes_per_token"]})
    decode, prefill = [], []
    for preset in dict.fromkeys(e["preset"] for e in out):
        for batch in sorted({e["batch"] for e in out if e["preset"] == preset}):
            forms = {e["form"]: e for e in out if e["preset"] == preset and e["batch"] == batch}
            if not {NAIVE, ABSORBED} <= set(forms):
                continue
            nv = {(p["context"], p["new_tokens"]): p for p in forms[NAIVE]["points"]}
            ab = {(p["context"], p["new_tokens"]): p for p in forms[ABSORBED]["points"]}
            common = sorted(set(nv) & set(ab))
            # Decode (one new token) against the context: absorbed / naive, below 1 where absorbed is faster.
            dec = [k for k in common if k[1] == 1]
            if dec:
                ctx = [k[0] for k in dec]
                layer = [num(ab[k]["time_ms"]) / num(nv[k]["time_ms"]) for k in dec]
                core = [num(ab[k]["core_ms"]) / num(nv[k]["core_ms"]) if num(nv[k]["core_ms"]) else None for k in dec]
                at, how = _crossing(ctx, layer)
                cat, chow = _crossing(ctx, core)
                decode.append({"preset": preset, "batch": batch, "heads": forms[NAIVE]["heads"],
                               "points": [{"context": c, "naive_ms": nv[k]["time_ms"], "absorbed_ms": ab[k]["time_ms"],
                                           "naive_over_absorbed": json_num(1 / x) if x else None,
                                           "naive_core_ms": nv[k]["core_ms"], "absorbed_core_ms": ab[k]["core_ms"],
                                           "core_naive_over_absorbed": json_num(1 / y) if y else None}
                                          for c, k, x, y in zip(ctx, dec, layer, core)],
                               "absorbed_faster_from": at, "how": how, "core_absorbed_faster_from": cat,
                               "core_how": chow,
                               "absorbed_cache": forms[ABSORBED]["cache_bytes_per_token"],
                               "cache_ratio": forms[NAIVE]["cache_bytes_per_token"] / forms[ABSORBED]["cache_bytes_per_token"]})
            # Prefill (several new tokens at one context): naive / absorbed against the new tokens, below 1
            # where the naive form is faster.
            for c in sorted({k[0] for k in common}):
                ks = [k for k in common if k[0] == c]
                if len(ks) < 2:
                    continue
                news = [k[1] for k in ks]
                ratio = [num(nv[k]["time_ms"]) / num(ab[k]["time_ms"]) for k in ks]
                at, how = _crossing(news, ratio)
                prefill.append({"preset": preset, "batch": batch, "context": c, "heads": forms[NAIVE]["heads"],
                                "points": [{"new_tokens": s, "naive_ms": nv[k]["time_ms"], "absorbed_ms": ab[k]["time_ms"],
                                            "naive_over_absorbed": json_num(x)} for s, k, x in zip(news, ks, ratio)],
                                "naive_faster_from": at, "how": how})
    # The sweep's one-token decode series at each MLA head count (dsa; tiled at the absorbed shape is the
    # absorbed form's core alone), time per call against the context.
    heads = {e["heads"] for e in out}
    beside = {}
    for r in decode_rows:
        if r.heads in heads and r.seq_q == 1:
            beside.setdefault((r.heads, r.label), []).append(r)
    sweep = [{"heads": h, "series": label, "variant": rs[0].variant, "exact": rs[0].exact,
              "points": [{"context": r.seq_kv, "time_ms": json_num(r.time_median)} for r in sorted(rs, key=lambda r: r.seq_kv)]}
             for (h, label), rs in sorted(beside.items(), key=lambda kv: (kv[0][0], kv[0][1]))]
    return {"series": out, "decode": decode, "prefill": prefill, "sweep_decode": sweep}


def _cross_text(at, how, subject, many, one, first):
    """'<subject> from ≈ 8,068 <many> on' / 'at every measured <one> (from <first>)' / 'not for good within
    the measured <many>'."""
    if at is not None:
        return f"{subject} from ≈ {num(at):,.0f} {many} on (interpolated between the measured ones)"
    if how == "at every measured":
        return f"{subject} at every measured {one} (from {first:,})"
    return f"{subject} not for good within the measured {many}"


def mla_section(an, figure_lines):
    """REPORT.md's MLA section (without its heading), None without MLA rows. figure_lines: the figure's
    subsection ([] when it was not drawn)."""
    m = an.get("mla")
    if not m:
        return None
    table = []
    for e in m["series"]:
        for p in e["points"]:
            table.append([f"`{e['preset']}`", e["label"], e["heads"], p["context"], p["new_tokens"],
                          fmt_num(num(p["time_ms"]), ".4g"), fmt_num(num(p["time_per_token_ms"]), ".4g"),
                          fmt_num(num(p["core_ms"]), ".4g") + (f" ({100 * num(p['core_share']):.0f}%)"
                                                                if p["core_share"] is not None else ""),
                          fmt_num(num(p["gflops_per_s"]), ".4g"), fmt_num(num(p["frac_peak"]), ".2f"),
                          fmt_num(num(p["gb_per_s"]), ".3g"), fmt_bytes(p["cache_bytes_per_token"]),
                          fmt_num(num(p["rel_l2"]), ".2e") if p["rel_l2"] is not None else "not checked"])
    md = [md_table(["preset", "form", "heads", "context", "new tokens", "layer ms", "ms per token", "core ms (share)",
                    "GFLOP/s", "of FMA peak", "GB/s", "cache per token", "rel L2 vs fp64"], table), "",
          "One MLA layer call (`attnbench mla`, common/frontends/mla.hpp) of *new tokens* after a cache of *context* "
          "tokens, median of its timed calls: the query and KV projections, the cache append, the core attention "
          "(the *core*, its own median: `core_median_ms`) and the output projection. *naive*: every head's K and V "
          "cached, multi-head attention at head_dim nope + rope; *absorbed*: W_uk folded into the query, one K/V head "
          "over the cached latent (V read in place), W_uv after. *GFLOP/s* and *of FMA peak*: the layer's FLOPs over "
          "its time and over the fp32 FMA peak measured in the same run; *GB/s*: the bytes it must read (weights, "
          "the cache, x) over its time. *rel L2*: against the fp64 definition where the block's check_max_context "
          "allowed it (the tests check both forms at every shape).", ""]
    if m["decode"]:
        lines = []
        for d in m["decode"]:
            first = d["points"][0]["context"]
            lines.append(f"- `{d['preset']}` ({d['heads']} heads): the absorbed form's cache is "
                         f"{d['cache_ratio']:.3g}× smaller; "
                         + _cross_text(d["absorbed_faster_from"], d["how"], "its layer call is faster", "tokens of context", "context", first)
                         + "; "
                         + _cross_text(d["core_absorbed_faster_from"], d["core_how"], "its core alone", "tokens of context", "context", first)
                         + ". naive ÷ absorbed per context: "
                         + ", ".join(f"{p['context']}: {fmt_num(num(p['naive_over_absorbed']), '.3g')}× "
                                     f"(core {fmt_num(num(p['core_naive_over_absorbed']), '.3g')}×)" for p in d["points"])
                         + "."
                         + "".join(f" {g['label']}: " + ", ".join(f"{p['context']}: {fmt_num(num(p['time_ms']), '.3g')} ms"
                                                                for p in g["points"] if p["new_tokens"] == 1)
                                   + f" (absorbed core: " + ", ".join(
                                       f"{p['context']}: {fmt_num(num(p['absorbed_core_ms']), '.3g')} ms" for p in d["points"])
                                   + f"; cache {fmt_bytes(g['cache_bytes_per_token'])} per token against "
                                     f"{fmt_bytes(d['absorbed_cache'])})."
                                   for g in m["series"] if g["preset"] == d["preset"] and g["form"] == GQA
                                   and g["batch"] == d["batch"]))
        md += ["**Decode (one new token)**: where the absorbed form becomes faster than the naive one.", "", *lines, ""]
    if m["prefill"]:
        lines = []
        for p in m["prefill"]:
            lines.append(f"- `{p['preset']}` ({p['heads']} heads), context {p['context']}: "
                         + _cross_text(p["naive_faster_from"], p["how"], "the naive form is faster", "new tokens per call", "new-token count",
                                       p["points"][0]["new_tokens"])
                         + ". naive ÷ absorbed: "
                         + ", ".join(f"{q['new_tokens']}: {fmt_num(num(q['naive_over_absorbed']), '.3g')}×"
                                     for q in p["points"]) + ".")
        md += ["**Prefill crossover**: as more tokens come in one call the absorbed form's larger core (d_qk "
               "kv_lora + rope against nope + rope per head) outweighs its smaller cache reads, and the naive form "
               "wins again (why DeepSeek prefills naive and decodes absorbed).", "", *lines, ""]
    if m["sweep_decode"]:
        md += ["The figure draws, beside the MLA layers' decode, the sweep's one-token decode rows of the same head "
               "count (core attention only: `tiled` at the absorbed shape is the absorbed form's core, `dsa` reads "
               "its top-k tokens of it): " + ", ".join(sorted({f"`{s['series']}` ({s['heads']} heads)"
                                                           for s in m["sweep_decode"]})) + ".", ""]
    while md and md[-1] == "":
        md.pop()
    return "\n".join(md + figure_lines)
