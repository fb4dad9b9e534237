// Test plugin (tests/test_plugins.cpp): a library whose marker claims plugin ABI 999 and attnbench 9.9.9; the
// loader must refuse it from the file's bytes, before dlopen, naming both ABI versions. Hand-written (no
// plugin_entry.hpp: attn_add_plugin NO_ENTRY), so it holds nothing but the marker. (`extern "C"` without
// braces gives the const array external linkage, so no separate declaration is needed.)
extern "C" __attribute__((visibility("default"), used)) const char attnbench_plugin_marker[] =
    "attnbench-plugin-abi:999;attnbench=9.9.9 (test);";
