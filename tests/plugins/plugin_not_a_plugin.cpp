// Test plugin (tests/test_plugins.cpp): a shared library that is no plugin (no ABI marker, no entry points);
// the loader must refuse it without loading it.
extern "C" __attribute__((visibility("default"))) int attnbench_test_not_a_plugin(int x) {
  return 2 * x + 1;
}
