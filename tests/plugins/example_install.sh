#!/usr/bin/env bash
# ctest plugin.example: the README's "Benchmark your own attention" as a user walks it. Installs this build to a
# temporary prefix, builds examples/plugin against the installed package (find_package(attnbench) +
# attnbench_add_variant, nothing of this source tree on its include path), then with the installed attnbench:
# lists, checks, sweeps (the plugin named in the config's "plugins"), compares two sweeps and draws the report,
# each of which must show the plugin's variant beside the built-in one.
#   example_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
src="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "plugin.example: FAILED: $*" >&2
  exit 1
}

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
bin="$tmp/prefix/bin/attnbench"
[ -x "$bin" ] || fail "cmake --install put no attnbench in $tmp/prefix/bin"
# The example sees the installed headers only: a copy of examples/plugin outside the source tree.
cp -R "$src/examples/plugin" "$tmp/myattn"
cmake -S "$tmp/myattn" -B "$tmp/myattn/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/configure.log" 2>&1 || {
  cat "$tmp/configure.log"
  fail "configuring the example against the installed package"
}
cmake --build "$tmp/myattn/build" >"$tmp/build.log" 2>&1 || {
  cat "$tmp/build.log"
  fail "building the example plugin"
}
plugin="$tmp/myattn/build/libmyattn.so"
[ -f "$plugin" ] || fail "no $plugin"

"$bin" --plugin "$plugin" list | grep '^ *my_attention' >/dev/null || fail "'attnbench --plugin ... list' does not show my_attention"
ATTNBENCH_PLUGINS="$plugin" "$bin" list | grep '^ *my_attention' >/dev/null || fail "ATTNBENCH_PLUGINS does not load it"
"$bin" --plugin "$plugin" check --variant my_attention >"$tmp/check.log" 2>&1 || {
  tail -40 "$tmp/check.log"
  fail "'attnbench --plugin ... check --variant my_attention' failed"
}
grep -E 'passed' "$tmp/check.log" | tail -1

# The example's own sweep.json parses and plans with the plugin it names (README's command, not run in full).
(cd "$tmp/myattn" && "$bin" run sweep.json --dry-run >"$tmp/dry-run.log" 2>&1) || {
  cat "$tmp/dry-run.log"
  fail "examples/plugin/sweep.json does not plan"
}
grep -q 'my_attention' "$tmp/dry-run.log" || fail "the dry run of examples/plugin/sweep.json lists no my_attention point"

# A sweep naming the plugin in the config (a path relative to the config's folder), run twice to compare.
cat >"$tmp/myattn/sweep.json" <<'JSON'
{
  "name": "myattn-example",
  "plugins": ["build/libmyattn.so"],
  "variants": ["naive", "my_attention"],
  "sweep": {"batch": 1, "heads": 2, "head_dim": 32, "seq_len": [64, 128], "mask": ["none", "causal"],
            "threads": 1},
  "measure": {"warmup": 1, "min_reps": 3, "max_reps": 5, "min_time_s": 0.01, "max_time_s": 0.5}
}
JSON
for r in a b; do
  "$bin" run "$tmp/myattn/sweep.json" --out "$tmp/results-$r" >"$tmp/run-$r.log" 2>&1 || {
    tail -30 "$tmp/run-$r.log"
    fail "the sweep with the plugin in its config failed"
  }
done
/usr/bin/python3 - "$tmp/results-a" "$plugin" <<'PY' || fail "rows or meta.json do not record the plugin"
import json, os, sys
out, plugin = sys.argv[1], os.path.realpath(sys.argv[2])
rows = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))]
mine = [r for r in rows if r["variant"] == "my_attention"]
assert mine and all(r["status"] == "ok" for r in mine), [(r["id"], r["status"], r.get("reason")) for r in mine]
assert all(r["plugin"].startswith(plugin + " (fnv1a64:") for r in mine), mine[0]["plugin"]
assert all(r["plugin"] == "" for r in rows if r["variant"] == "naive")
assert all(r["accuracy"]["rel_l2_err"] < 1e-5 for r in mine), [r["accuracy"] for r in mine]
meta = json.load(open(os.path.join(out, "meta.json")))
assert [p["path"] for p in meta["plugins"]] == [plugin], meta.get("plugins")
assert meta["plugins"][0]["variants"] == ["my_attention"]
print("plugin.example: %d my_attention rows ok, rel_l2 <= %.2g" % (len(mine), max(r["accuracy"]["rel_l2_err"] for r in mine)))
PY
"$bin" compare "$tmp/results-a" "$tmp/results-b" >"$tmp/compare.md" || fail "attnbench compare failed"
grep -q 'my_attention' "$tmp/compare.md" || fail "compare shows no my_attention point"
if /usr/bin/python3 -c 'import numpy, matplotlib' 2>/dev/null; then
  /usr/bin/python3 "$tmp/prefix/share/attnbench/scripts/plot.py" "$tmp/results-a" >"$tmp/plot.log" 2>&1 || {
    tail -20 "$tmp/plot.log" >&2
    fail "the installed scripts/plot.py failed on the sweep"
  }
  grep -q 'my_attention' "$tmp/results-a/REPORT.md" || fail "REPORT.md does not mention my_attention"
  echo "plugin.example: list, check, sweep, compare and REPORT.md show my_attention"
else
  echo "plugin.example: numpy/matplotlib missing (scripts/test installs them): the report was not drawn"
  exit 77
fi
