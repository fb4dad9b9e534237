// Test plugin (tests/defaults/test_default_paths.py, its self-test): needs_alibi_slopes, a variant that needs
// an input no default path supplies. It computes naive's output (through the host's registry) only when ALiBi
// slopes are given in AttentionInputs::alibi_slopes, which every command leaves null unless the user passes
// them, and throws otherwise: the registry-wide default-path test must fail on it, naming the variant and the
// command. Built with attn_add_plugin (tests/plugins/plugins.cmake); never loaded by a default path.
#include <string>

#include "common/interface/attention.hpp"
#include "common/kernels/mask.hpp"  // exact_attention_flops
#include "common/support/error.hpp"

namespace {

class NeedsAlibiSlopes final : public attn::Attention {
 public:
  std::string name() const override { return "needs_alibi_slopes"; }
  std::string description() const override {
    return "test plugin: naive's output, but only when AttentionInputs::alibi_slopes is given "
           "(tests/plugins/plugin_needs_input.cpp)";
  }
  attn::Capabilities capabilities() const override {
    return {.exact = true, .causal = true, .backward = false};
  }
  double flops(const attn::Problem& p) const override { return attn::exact_attention_flops(p); }
  std::size_t workspace_bytes(const attn::Problem& p, int threads) const override {
    return attn::Registry::instance().get("naive").workspace_bytes(p, threads);
  }

 protected:
  void forward(const attn::Problem& p, const attn::AttentionInputs& in) const override {
    if (!in.alibi_slopes)
      throw attn::UsageError(
          "needs_alibi_slopes: no AttentionInputs::alibi_slopes (this test variant needs an "
          "input no default path supplies)");
    attn::Problem naive = p;
    naive.variant = "naive";
    naive.params = attn::Json::object();
    attn::Registry::instance().get("naive").run(naive, in);
  }
};

}  // namespace

ATTN_REGISTER_VARIANT(NeedsAlibiSlopes)
