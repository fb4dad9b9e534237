// The built-in variants' capabilities, pinned in one table (issue #39). A capability the registry-wide checks
// need (causal, dropout, bf16 ...) turned off in a variant makes those checks SKIPPED rows, and a skip is
// green: without this table only tests/test_registry_checks.cpp's `passed >= 20` would notice. Here any
// change of any field, and a built-in variant added or removed, fails by name until the table is updated on
// purpose. Plugin variants (a plugin loaded into this process by tests/test_plugins.cpp) are not built-ins
// and are left out.
#include <catch2/catch.hpp>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/interface/plugin_loader.hpp"

using namespace attn;

namespace {

// Every bool field of Capabilities (common/interface/attention.hpp), by name; gate is the one other field.
struct BoolField {
  std::string_view name;
  bool Capabilities::*member;
};
constexpr BoolField kBoolFields[] = {
    {"exact", &Capabilities::exact},
    {"causal", &Capabilities::causal},
    {"causal_lower_right", &Capabilities::causal_lower_right},
    {"gqa", &Capabilities::gqa},
    {"boolean_mask", &Capabilities::boolean_mask},
    {"key_padding", &Capabilities::key_padding},
    {"cross", &Capabilities::cross},
    {"dropout", &Capabilities::dropout},
    {"bf16", &Capabilities::bf16},
    {"fp16", &Capabilities::fp16},
    {"alibi", &Capabilities::alibi},
    {"permutation_equivariant", &Capabilities::permutation_equivariant},
    {"baseline", &Capabilities::baseline},
    {"backward", &Capabilities::backward},
    {"sinks", &Capabilities::sinks},
    {"softcap", &Capabilities::softcap},
    {"beta", &Capabilities::beta},
    {"state", &Capabilities::state},
    {"decode", &Capabilities::decode},
    {"own_definition", &Capabilities::own_definition},
    {"value_dim", &Capabilities::value_dim},
    {"block_partials", &Capabilities::block_partials},
    {"strided_kv", &Capabilities::strided_kv},
    {"indexer", &Capabilities::indexer},
};
// Every field is one byte (bool, Gate : uint8_t), so a field added to Capabilities changes its size: then
// add it to kBoolFields (or compare it below) and to every row of kBuiltIns.
static_assert(sizeof(Capabilities) == std::size(kBoolFields) + sizeof(Gate),
              "Capabilities has a field this test does not compare: add it to kBoolFields and kBuiltIns");

// THE TABLE. Each built-in variant, its gate, and the bool fields it sets (every field not named is false).
// When a variant's capabilities change on purpose, change its row here in the same commit.
struct Pinned {
  std::string_view variant;
  Gate gate;
  std::initializer_list<std::string_view> set;
};
const Pinned kBuiltIns[] = {
    {"bigbird",
     Gate::none,
     {"causal", "causal_lower_right", "gqa", "boolean_mask", "key_padding", "dropout", "bf16", "fp16",
      "alibi", "backward"}},
    {"dsa",
     Gate::none,
     {"causal", "causal_lower_right", "gqa", "boolean_mask", "key_padding", "cross", "backward", "decode",
      "value_dim", "indexer"}},
    {"delta_rule",
     Gate::none,
     {"causal", "causal_lower_right", "gqa", "bf16", "fp16", "backward", "beta", "state", "decode",
      "own_definition", "value_dim"}},
    {"gated_delta_rule",
     Gate::scalar,
     {"causal", "causal_lower_right", "gqa", "bf16", "fp16", "backward", "beta", "state", "decode",
      "own_definition", "value_dim"}},
    {"gla",
     Gate::vector,
     {"causal", "causal_lower_right", "gqa", "bf16", "fp16", "backward", "state", "decode", "own_definition",
      "value_dim"}},
    {"kda",
     Gate::vector,
     {"causal", "causal_lower_right", "gqa", "bf16", "fp16", "backward", "beta", "state", "decode",
      "own_definition", "value_dim"}},
    {"linear",
     Gate::none,
     {"causal", "causal_lower_right", "gqa", "key_padding", "cross", "bf16", "fp16",
      "permutation_equivariant", "backward"}},
    {"linformer", Gate::none, {"gqa", "key_padding", "cross", "dropout", "bf16", "fp16", "backward"}},
    {"naive",
     Gate::none,
     {"exact", "causal", "causal_lower_right", "gqa", "boolean_mask", "key_padding", "cross", "dropout",
      "bf16", "fp16", "alibi", "permutation_equivariant", "baseline", "backward", "sinks", "softcap",
      "value_dim", "strided_kv"}},
    {"nystrom", Gate::none, {"gqa", "key_padding", "cross", "bf16", "fp16", "backward"}},
    {"performer",
     Gate::none,
     {"causal", "causal_lower_right", "gqa", "key_padding", "cross", "bf16", "fp16",
      "permutation_equivariant", "backward"}},
    {"retention",
     Gate::none,
     {"causal", "causal_lower_right", "gqa", "bf16", "fp16", "backward", "state", "decode", "own_definition",
      "value_dim"}},
    {"simple_gla",
     Gate::scalar,
     {"causal", "causal_lower_right", "gqa", "bf16", "fp16", "backward", "state", "decode", "own_definition",
      "value_dim"}},
    {"sliding_window",
     Gate::none,
     {"causal", "causal_lower_right", "gqa", "boolean_mask", "key_padding", "dropout", "bf16", "fp16",
      "backward", "sinks", "softcap", "decode"}},
    {"tiled",
     Gate::none,
     {"exact", "causal", "causal_lower_right", "gqa", "boolean_mask", "key_padding", "cross", "dropout",
      "bf16", "fp16", "alibi", "permutation_equivariant", "backward", "sinks", "softcap", "block_partials",
      "value_dim", "strided_kv"}},
};

const char* yes_no(bool b) {
  return b ? "true" : "false";
}

const Pinned* pinned(std::string_view variant) {
  for (const Pinned& row : kBuiltIns)
    if (row.variant == variant) return &row;
  return nullptr;
}

constexpr const char* kUpdate =
    "; if that is intended, update its row of kBuiltIns in tests/test_capabilities.cpp in the same commit";

}  // namespace

TEST_CASE("the table names only real capability fields, each variant once", "[registry][capabilities]") {
  std::set<std::string_view> fields, variants;
  for (const BoolField& f : kBoolFields) fields.insert(f.name);
  CHECK(fields.size() == std::size(kBoolFields));
  for (const Pinned& row : kBuiltIns) {
    INFO("kBuiltIns row " << row.variant);
    CHECK(variants.insert(row.variant).second);
    std::set<std::string_view> set;
    for (std::string_view name : row.set) {
      INFO("field " << name);
      CHECK(fields.count(name) == 1);
      CHECK(set.insert(name).second);
    }
  }
  // capabilities_json (`attnbench list --json`) shows exactly these fields and gate.
  const Json shown = capabilities_json(Capabilities{});
  CHECK(shown.size() == std::size(kBoolFields) + 1);
  CHECK(shown.contains("gate"));
  for (const BoolField& f : kBoolFields) {
    INFO("field " << f.name);
    CHECK(shown.contains(std::string(f.name)));
  }
}

TEST_CASE("every built-in variant has exactly the capabilities the table pins", "[registry][capabilities]") {
  int built_in = 0;
  for (const Attention* v : Registry::instance().all()) {
    if (plugin_of(v->name()) != nullptr) continue;  // loaded from a plugin, not built in
    ++built_in;
    const Pinned* row = pinned(v->name());
    if (!row) {
      FAIL_CHECK("built-in variant " << v->name() << " has no row in the capability table" << kUpdate);
      continue;
    }
    const Capabilities caps = v->capabilities();
    for (const BoolField& f : kBoolFields) {
      bool expected = false;
      for (std::string_view name : row->set) expected = expected || name == f.name;
      const bool actual = caps.*f.member;
      if (actual != expected)
        FAIL_CHECK(v->name() << ": capability " << f.name << " is " << yes_no(actual)
                             << ", the table expects " << yes_no(expected) << kUpdate);
    }
    if (caps.gate != row->gate)
      FAIL_CHECK(v->name() << ": capability gate is " << gate_name(caps.gate) << ", the table expects "
                           << gate_name(row->gate) << kUpdate);
  }
  for (const Pinned& row : kBuiltIns) {
    const Attention* v = Registry::instance().find(row.variant);
    if (!v || plugin_of(row.variant) != nullptr)
      FAIL_CHECK("the capability table has a row for "
                 << row.variant
                 << ", which is not a registered built-in variant (removed "
                    "or renamed?)"
                 << kUpdate);
  }
  CHECK(built_in == static_cast<int>(std::size(kBuiltIns)));
}
