// Test plugin (tests/test_plugins.cpp): a variant named "naive", the name of a built-in variant; the loader
// must refuse the plugin naming it and the executable, and register nothing.
#include "common/interface/attention.hpp"

namespace {

class Clash final : public attn::Attention {
 public:
  std::string name() const override { return "naive"; }
  std::string description() const override { return "test plugin: takes the built-in naive's name"; }
  attn::Capabilities capabilities() const override { return {}; }
  double flops(const attn::Problem&) const override { return 0; }
  std::size_t workspace_bytes(const attn::Problem&, int) const override { return 0; }

 protected:
  void forward(const attn::Problem&, const attn::AttentionInputs&) const override {}
};

}  // namespace

ATTN_REGISTER_VARIANT(Clash)
