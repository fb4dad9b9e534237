// Test support: Catch2 test cases generated from the registry, one per registered variant, so that
// `ctest -R NAME` runs one variant alone and a new variant folder gets its own tests with no edit to tests/.
//
//   TEST_CASE_PER_VARIANT("{} passes the checks", "[registry]") { ... use `variant` ... }
//
// declares the body at static-initialisation time; register_variant_tests(), called by main
// (tests/test_main.cpp) before Catch runs, makes one test case per registered variant, named by the title
// with "{}" replaced by the variant's name and tagged with the tags plus [<name>]. It cannot be done earlier:
// the variants register themselves from static initialisers in other files, whose order relative to this
// file's is unspecified, so the registry is complete only once main has started.
#pragma once
#include <catch2/catch.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"

namespace attn::test {

using VariantTestBody = void (*)(const Attention& variant);

struct VariantTestSpec {
  std::string title;  // "{}" stands for the variant's name
  std::string tags;
  VariantTestBody body;
  const char* file;  // __FILE__: static storage, as Catch's SourceLineInfo needs
  std::size_t line;
};

inline std::vector<VariantTestSpec>& variant_test_specs() {
  static std::vector<VariantTestSpec> specs;  // constructed on first use, whatever the static-init order
  return specs;
}

// Registers a per-variant test body (TEST_CASE_PER_VARIANT's static object).
struct VariantTest {
  VariantTest(std::string title, std::string tags, VariantTestBody body, const char* file, std::size_t line) {
    variant_test_specs().push_back({std::move(title), std::move(tags), body, file, line});
  }
};

// A test case name: `title` with "{}" replaced by the variant's name (or the name appended in parentheses).
inline std::string variant_test_name(const std::string& title, const std::string& name) {
  std::string s = title;
  const std::size_t at = s.find("{}");
  return at == std::string::npos ? s + " (" + name + ")" : s.replace(at, 2, name);
}

// Runs one body for one variant, looked up by name when the test runs.
class VariantTestInvoker final : public Catch::ITestInvoker {
 public:
  VariantTestInvoker(VariantTestBody body, std::string variant) : body_(body), variant_(std::move(variant)) {}
  void invoke() const override { body_(Registry::instance().get(variant_)); }

 private:
  VariantTestBody body_;
  std::string variant_;
};

// One Catch2 test case per (TEST_CASE_PER_VARIANT body, registered variant). Call once, from main, before
// Catch::Session().run (Catch copies the name and tags; it owns the invoker).
inline void register_variant_tests() {
  static bool done = false;
  if (done) return;
  done = true;
  for (const VariantTestSpec& spec : variant_test_specs())
    for (const std::string& name : Registry::instance().names()) {
      const std::string test_name = variant_test_name(spec.title, name);
      const std::string tags = spec.tags + "[" + name + "]";
      const Catch::AutoReg reg(new VariantTestInvoker(spec.body, name),
                               Catch::SourceLineInfo(spec.file, spec.line), Catch::StringRef(),
                               Catch::NameAndTags(test_name, tags));
    }
}

}  // namespace attn::test

#define ATTN_VARIANT_TEST_INNER(fn, reg, title, tags)                                                  \
  static void fn(const ::attn::Attention& variant);                                                    \
  namespace {                                                                                          \
  const ::attn::test::VariantTest reg(title, tags, &fn, __FILE__, static_cast<std::size_t>(__LINE__)); \
  }                                                                                                    \
  static void fn([[maybe_unused]] const ::attn::Attention& variant)

// Like TEST_CASE, once per registered variant; the body sees the variant as `const Attention& variant`.
#define TEST_CASE_PER_VARIANT(title, tags)                           \
  ATTN_VARIANT_TEST_INNER(ATTN_CONCAT(attn_variant_test_, __LINE__), \
                          ATTN_CONCAT(attn_variant_test_reg_, __LINE__), title, tags)
