"""One colour and one marker per variant, the same in every figure of every report: the style table. The 13
built-in variants have pinned styles (PINNED, in the order of configs/plot_styles.json); any other variant (a plugin's, one added later) gets the next
(colour, marker) pair no variant has, in the order of the registry (meta.json "registry", the order of
`attnbench list --json`, plugins' variants included; results written before it: the sorted names of their
rows). So adding a variant never moves a built-in's style; only variants that are not built in, and registered
after it, can move. The PyTorch peer's rows (source "peer") have styles of their own, apart from every variant's.

Within one variant, its series (other parameters such as form=chunk / recurrent, dtypes, SIMD targets) keep its
marker and its hue and step through shades of it (darker, lighter, in the order of their labels). Not line
styles: those already say exact (solid), approximate (dashed) or peer (dotted) in every figure; and not hollow
markers: those say "estimated" (memory) and the rings around markers say "noisy". A shade keeps the series
recognisably its variant's (same marker, same hue) while telling the series apart side by side.
No matplotlib here: colours are "#rrggbb" strings.
"""
import json
import os
from collections import namedtuple

# Sixteen colours told apart on a white background: tab10 without its grey (the figures' guides and "no data"
# are grey), then six darker or more saturated ones chosen to keep every pair of the first 13 (the built-ins)
# at least ~27 apart in CIELAB (ΔE76; the closest pairs are tab10's own purple / pink and red / maroon), none of
# them a light / dark twin of another as tab20's pairs are; the last three serve variants that are not built in.
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#000080", "#800000", "#d500f9", "#0b6e4f", "#a6761d", "#00e5a0", "#ff1493"]
# Nine filled markers; 9 and 16 share no factor, so the i-th pair (PALETTE[i % 16], MARKERS[i % 9]) repeats only
# after 16 x 9 = 144 pairs, and the first 16 have 16 different colours. "*" and "X" are the peers'.
MARKERS = ["o", "s", "^", "D", "v", "P", "<", ">", "h"]
PAIRS = len(PALETTE) * len(MARKERS)


class Style(namedtuple("Style", "color marker")):
    """A colour ("#rrggbb") and a matplotlib marker."""

    def _mixed(self, f):
        """The colour mixed towards white (f > 0) or black (f < 0) by |f|, the same marker."""
        if f == 0:
            return self
        rgb = [int(self.color[i:i + 2], 16) for i in (1, 3, 5)]
        mixed = [c + (255 - c) * f if f > 0 else c * (1 + f) for c in rgb]
        return Style("#" + "".join(f"{round(c):02x}" for c in mixed), self.marker)

    def shade(self, k):
        """The style of a variant's k-th series: its marker, its colour mixed by SHADES[k] (around again after
        the last)."""
        return self._mixed(SHADES[k % len(SHADES)])

    def ramp(self, i, count):
        """The i-th of `count` ordered values (the chunk-size figure's n) in this hue: light (RAMP[0]) to dark."""
        return self._mixed(RAMP[0] + (RAMP[1] - RAMP[0]) * i / max(1, count - 1))


def pair(i):
    """The i-th (colour, marker) pair; they repeat after PAIRS."""
    return Style(PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)])


# The built-in variants' styles, pinned: the first 13 pairs in the registry's (alphabetical) order of today,
# read from configs/plot_styles.json (data, not code: no variant is named outside variants/ and configs/). A
# variant added later, wherever its name sorts, takes a pair after these and moves none of them.
_PINNED_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "plot_styles.json")
with open(_PINNED_PATH, encoding="utf-8") as _f:
    BUILT_IN = json.load(_f)["pinned"]
PINNED = {v: pair(i) for i, v in enumerate(BUILT_IN)}
# The peers: black and greys with markers no variant has, so a peer's style is never a variant's.
PEER_COLORS = ["#000000", "#5c5c5c", "#9a9a9a"]
PEER_MARKERS = ["*", "X"]
# A variant's k-th series: mixed towards black (negative) or white (positive) by this fraction; then around again.
SHADES = [0.0, -0.3, 0.35, -0.5, 0.55, -0.65, 0.7]
# An ordered quantity drawn in one variant's hue (the chunk-size figure's n): from this light to this dark.
RAMP = (0.55, -0.45)
PEER = "peer"


def registry_order(meta, names):
    """The registry's order of the variants: meta.json "registry" when it is a list of names, else the sorted
    names; names the registry lacks (a plugin not loaded when meta.json was written) after it, sorted."""
    reg = meta.get("registry") if isinstance(meta, dict) else None
    order = [v for v in reg if isinstance(v, str)] if isinstance(reg, list) else []
    return order + sorted(set(names) - set(order))


class StyleTable:
    """The built-ins' pinned styles; every other variant of `registry` the next free pair, in its order; each
    peer a peer style by its position among the sorted `peers`. A name in neither gets its style when first
    asked for (the next free one, never another's while pairs last)."""

    def __init__(self, registry, peers=()):
        self.variants, self.peers = dict(PINNED), {}
        self._taken = set(PINNED.values())
        self._next = 0  # the first pair index not yet looked at for a variant that is not built in
        for v in registry:
            self.of(v)
        for v in sorted(set(peers)):
            self.of(v, PEER)

    def _free_pair(self):
        while self._next < PAIRS and pair(self._next) in self._taken:
            self._next += 1
        st = pair(self._next)  # past PAIRS every pair is taken: they repeat (144 variants)
        self._next += 1
        self._taken.add(st)
        return st

    def of(self, variant, source=None):
        """The style of a variant, or of a peer when source is "peer"."""
        if source == PEER:
            if variant not in self.peers:
                i = len(self.peers)
                self.peers[variant] = Style(PEER_COLORS[i % len(PEER_COLORS)], PEER_MARKERS[i % len(PEER_MARKERS)])
            return self.peers[variant]
        if variant not in self.variants:
            self.variants[variant] = self._free_pair()
        return self.variants[variant]


def results_table(res):
    """The style table of a results folder: its registry (or its rows' sorted variant names) and its peers."""
    return StyleTable(registry_order(res.meta, {r.variant for r in res.rows}), {r.variant for r in res.peer_rows})


def series_styles(res):
    """{series label: Style} for every row of the results (measured or not, so a series' shade does not depend
    on which figure draws it): its variant's style, the k-th series of that variant (by label) its k-th
    shade."""
    table = results_table(res)
    by_variant = {}
    for r in res.rows + res.peer_rows:
        by_variant.setdefault((r.variant, r.source), set()).add(r.label)
    out = {}
    for (variant, source), labels in sorted(by_variant.items()):
        for k, label in enumerate(sorted(labels)):
            out.setdefault(label, table.of(variant, source).shade(k))
    return out
