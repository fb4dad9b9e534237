#!/usr/bin/env python3
"""The house rules that keep attnbench's layers apart, checked on the source tree:

1. common/ is layered: support < io < interface < kernels < reference < frontends. A file includes headers of
   its own layer or a lower one, never a higher one, and the includes inside common/ have no circle.
2. Outside variants/ (tests and configs aside) no file includes a variant's header, and no C++ or Python
   source names a registered variant in a string literal: the harness reaches variants through the registry
   (its baseline, its capabilities), so a variant's folder is the only place that knows it. A literal that
   only shares a variant's name (MLA's "naive" form) is allowed on a line marked "structure: not a variant".
3. No C++ function runs past 100 lines outside the kernels (common/kernels/, variants/): long functions are
   split by their stages.
4. Every shipped config (configs/*.json) seeds the config fuzzer as a byte copy,
   tests/fuzz/corpus/config/seed-preset-NAME.json (tests/fuzz/make_seed_corpus.py writes them): a config added
   or changed without it leaves its sections (a new key, a new block) to the fuzzer's luck.

  check_structure.py --attnbench PATH [--root DIR]
Exits 0 when every rule holds, 1 listing every breach otherwise.
"""
import argparse
import json
import os
import re
import subprocess
import sys

LAYERS = ["support", "io", "interface", "kernels", "reference", "frontends"]
MAX_FUNCTION_LINES = 100
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# A function definition's opening line, as clang-format leaves it: the signature's last line ends in ") {",
# optionally with qualifiers, a trailing return type or a member-initialiser list.
FUNC_OPEN = re.compile(r"\)\s*(const)?\s*(noexcept)?\s*(override|final)?\s*(->\s*[\w:<>,\s*&]+)?\s*\{$")


def tracked_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (a source tarball): walk the tree
        files = []
        for d, _, names in os.walk(root):
            if "/build" in d or "/.git" in d:
                continue
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return files
    return out.stdout.split()


def read(root, path):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        return f.read()


def layer_of(path):
    parts = path.split("/")
    if len(parts) >= 3 and parts[0] == "common" and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return None


def check_common_layers(root, files):
    breaches = []
    common = [f for f in files if f.startswith("common/") and f.endswith((".hpp", ".cpp"))]
    graph = {}
    for f in common:
        if layer_of(f) is None:
            breaches.append(f"{f}: common/ files live in a layer folder ({', '.join(LAYERS)})")
            continue
        graph[f] = []
        for line in read(root, f).splitlines():
            m = INCLUDE.match(line)
            if not m or not m.group(1).startswith("common/"):
                continue
            target = m.group(1)
            graph[f].append(target)
            lt = layer_of(target)
            if lt is not None and lt > layer_of(f):
                breaches.append(f"{f} includes {target}: {LAYERS[layer_of(f)]} must not include the higher layer "
                                f"{LAYERS[lt]} (order: {' < '.join(LAYERS)})")
    # Circles: depth-first search over the include graph.
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph.get(node, []):
            if state.get(nxt) == "open":
                breaches.append("include circle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return breaches


def variant_names(attnbench):
    out = subprocess.run([attnbench, "list", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"check_structure: '{attnbench} list --json' failed: {out.stderr.strip()}")
    data = json.loads(out.stdout)
    items = data["variants"] if isinstance(data, dict) else data
    names = sorted(v["name"] if isinstance(v, dict) else v for v in items)
    if len(names) < 2:
        raise SystemExit(f"check_structure: '{attnbench} list --json' listed {names}: expected the registry")
    return names


def outside_variants(path):
    return not path.startswith(("variants/", "tests/", "configs/"))


def check_variant_names(root, files, names):
    breaches = []
    literal = re.compile(r'"(' + "|".join(re.escape(n) for n in names) + r')"')
    for f in files:
        if not outside_variants(f) or not f.endswith((".hpp", ".cpp", ".py")):
            continue
        for i, line in enumerate(read(root, f).splitlines(), 1):
            m = INCLUDE.match(line)
            if m and m.group(1).startswith("variants/"):
                breaches.append(f"{f}:{i}: includes a variant's header ({m.group(1)}); go through the registry")
            code = line.split("//")[0] if f.endswith((".hpp", ".cpp")) else line.split("#")[0]
            # A string that is a variant's name but means something else (MLA's "naive" form) carries the
            # marker on its line, with the reason beside it.
            if "structure: not a variant" in line:
                continue
            for m in literal.finditer(code):
                breaches.append(f"{f}:{i}: names the variant {m.group(0)}; ask the registry (baseline, "
                                "capabilities) or move the data under configs/")
    return breaches


def long_functions(text):
    """(first line, length) of every brace-matched definition opened by FUNC_OPEN longer than the limit."""
    lines = text.splitlines()
    found = []
    i = 0
    while i < len(lines):
        line = lines[i].split("//")[0].rstrip()
        if FUNC_OPEN.search(line) and not line.lstrip().startswith(("if", "for", "while", "switch", "}")):
            depth, j = 0, i
            while j < len(lines):
                code = re.sub(r'"(\\.|[^"\\])*"', '""', lines[j].split("//")[0])
                code = re.sub(r"'(\\.|[^'\\])*'", "''", code)
                depth += code.count("{") - code.count("}")
                if depth <= 0:
                    break
                j += 1
            # The signature may start a few lines above the opening brace.
            s = i
            while s > 0 and lines[s - 1].strip() and not lines[s - 1].rstrip().endswith((";", "}", "{", "*/")) \
                    and not lines[s - 1].lstrip().startswith(("//", "#")):
                s -= 1
            if j - s + 1 > MAX_FUNCTION_LINES:
                found.append((s + 1, j - s + 1, lines[s].strip()[:70]))
            i = j + 1
            continue
        i += 1
    return found


def check_function_length(root, files):
    breaches = []
    for f in files:
        if not f.endswith(".cpp") and not f.endswith(".hpp"):
            continue
        if f.startswith(("variants/", "common/kernels/")):
            continue
        for start, n, sig in long_functions(read(root, f)):
            breaches.append(f"{f}:{start}: {n} lines (limit {MAX_FUNCTION_LINES} outside kernels): {sig}")
    return breaches


def check_fuzz_seeds(root, files):
    breaches, fix = [], "run /usr/bin/python3 tests/fuzz/make_seed_corpus.py"
    for f in files:
        if not (f.startswith("configs/") and f.endswith(".json") and f.count("/") == 1):
            continue
        seed = "tests/fuzz/corpus/config/seed-preset-" + os.path.basename(f)
        if seed not in files:
            breaches.append(f"{f}: no fuzz seed {seed} ({fix})")
        elif read(root, f) != read(root, seed):
            breaches.append(f"{f}: its fuzz seed {seed} differs ({fix})")
    return breaches


def self_test():
    """The checkers find what they must (so a passing run means something)."""
    body = "\n".join(["  x += 1;"] * (MAX_FUNCTION_LINES + 1))
    assert long_functions(f"void f(int x) {{\n{body}\n}}\n"), "a long function must be found"
    assert not long_functions("void f(int x) {\n  x += 1;\n}\n"), "a short function is fine"
    assert long_functions(f'TEST_CASE("a", "[b]") {{\n  const char* s = "{{";\n{body}\n}}\n'), "braces in strings"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    a = ap.parse_args()
    self_test()
    root = os.path.abspath(a.root)
    files = [f for f in tracked_files(root) if os.path.isfile(os.path.join(root, f))]
    names = variant_names(a.attnbench)
    breaches = check_common_layers(root, files) + check_variant_names(root, files, names) + \
        check_function_length(root, files) + check_fuzz_seeds(root, files)
    for b in breaches:
        print(b)
    print(f"check_structure: {len(files)} files, {len(names)} variants ({', '.join(names)}): "
          f"{len(breaches)} breach(es)")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
