#!/usr/bin/python3
"""Plugins from Python (issue #29): attnbench.load_plugin(path) on the suite's test plugin
(tests/plugins/plugin_good.cpp, built into <build>/plugins) returns its path, hash, ABI and variants; the
variant joins attnbench.variants(); forward() on it matches forward() of the built-in naive (plain and
causal, grouped-query heads); loading the same file again returns the same; a missing path, a library that is
no plugin and a name clash raise ValueError naming the path.

Run by ctest as `/usr/bin/python3 test_plugin.py --attnbench PATH` (the plugins are found beside it:
build/release/attnbench -> build/release/plugins), the module's folder in ATTNBENCH_PYTHON_DIR. Exit 0 pass,
1 fail, 77 skip (no module in this build, no numpy, or the test plugins were not built)."""
import argparse
import os
import re
import sys

try:
    import numpy as np
except ImportError as e:
    print("SKIP: %s (for %s)" % (e, sys.executable))
    sys.exit(77)

MODULE_DIR = os.environ.get("ATTNBENCH_PYTHON_DIR")
if not MODULE_DIR:
    print("SKIP: ATTNBENCH_PYTHON_DIR is not set: this build has no Python module (ATTN_PYTHON=OFF, a sanitizer "
          "or fuzzing build, or pybind11 missing)")
    sys.exit(77)
# The module loads ATTNBENCH_PLUGINS at import: this test loads its plugins itself.
os.environ.pop("ATTNBENCH_PLUGINS", None)
sys.path.insert(0, MODULE_DIR)
import attnbench  # noqa: E402

FAILURES = []


def check(ok, what):
    print(("PASS  " if ok else "FAIL  ") + what)
    if not ok:
        FAILURES.append(what)
    return ok


def raises(fn, exc=ValueError):
    """The exception `fn` raises (of type exc), or None."""
    try:
        fn()
    except exc as e:
        return e
    return None


def names():
    return [v["name"] for v in attnbench.variants()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnbench", required=True)
    exe = ap.parse_args().attnbench
    plugins = os.path.join(os.path.dirname(os.path.realpath(exe)), "plugins")
    good = os.path.join(plugins, "libplugin_good.so")
    if not os.path.isfile(good):
        print("SKIP: %s is missing (the test plugins are built with the tests: tests/plugins/plugins.cmake)" % good)
        return 77

    before = names()
    check("plugin_good_exact" not in before, "plugin_good_exact is not registered before load_plugin")
    missing = os.path.join(plugins, "libno_such_plugin.so")
    e = raises(lambda: attnbench.load_plugin(missing))
    check(e is not None and missing in str(e) and "no such file" in str(e),
          "load_plugin of a missing file raises ValueError naming it: %r" % (str(e) if e else None))
    not_a_plugin = os.path.join(plugins, "libplugin_not_a_plugin.so")
    e = raises(lambda: attnbench.load_plugin(not_a_plugin))
    check(e is not None and not_a_plugin in str(e) and "not an attnbench plugin" in str(e),
          "load_plugin of a library that is no plugin raises ValueError naming it: %r" % (str(e) if e else None))
    clash = os.path.join(plugins, "libplugin_clash.so")
    e = raises(lambda: attnbench.load_plugin(clash))
    check(e is not None and clash in str(e) and "'naive'" in str(e) and "built into" in str(e),
          "load_plugin of a plugin whose variant is named naive raises ValueError naming both: %r" %
          (str(e) if e else None))
    check(names() == before, "the refused plugins registered nothing")

    info = attnbench.load_plugin(good)
    check(isinstance(info, dict), "load_plugin returns a dict: %r" % type(info))
    check(info.get("path") == os.path.realpath(good), "its path is the library's real path: %r" % info.get("path"))
    check(re.fullmatch(r"fnv1a64:[0-9a-f]{16}", str(info.get("hash"))) is not None,
          "its hash is fnv1a64:<16 hex digits>: %r" % info.get("hash"))
    check(info.get("variants") == ["plugin_good_exact"], "its variants: %r" % info.get("variants"))
    check(isinstance(info.get("abi"), int) and info["abi"] >= 1, "its ABI: %r" % info.get("abi"))
    after = names()
    check("plugin_good_exact" in after and set(before) <= set(after),
          "attnbench.variants() lists plugin_good_exact beside the built-in variants")
    check(attnbench.load_plugin(good) == info, "loading the same file again returns the same")

    rng = np.random.default_rng(7)
    for heads, kv_heads in ((2, 2), (4, 2)):
        q = rng.standard_normal((2, heads, 24, 16), dtype=np.float32)
        k = rng.standard_normal((2, kv_heads, 24, 16), dtype=np.float32)
        v = rng.standard_normal((2, kv_heads, 24, 16), dtype=np.float32)
        for causal in (False, True):
            got = attnbench.forward("plugin_good_exact", q, k, v, causal=causal)
            want = attnbench.forward("naive", q, k, v, causal=causal)
            err = float(np.max(np.abs(got - want)))
            check(got.shape == want.shape and got.dtype == np.float32 and err < 1e-5,
                  "forward(plugin_good_exact) = forward(naive) within 1e-5 (heads %d, kv_heads %d, causal %s): "
                  "max abs diff %.3g" % (heads, kv_heads, causal, err))

    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
