// Multi-head latent attention (common/frontends/mla.hpp): both forms, prefill and decode through the KV
// cache, against the fp64 definition (common/reference/mla_reference.hpp, DeepSeek-V3's naive path in
// double); and the reserved-cache / strided-V inputs the absorbed form's core reads (AttentionInputs::
// kv_capacity, v_row_stride).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/frontends/mla.hpp"
#include "common/interface/attention.hpp"
#include "common/reference/mla_reference.hpp"
#include "common/reference/reference.hpp"
#include "common/support/error.hpp"
#include "common/support/random.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace attn;
using Catch::Contains;

namespace {

// Norm-wise bound on the layer's fp32 output against the fp64 definition. Each stage is fp32 dot products
// of length n (the projections: n = d_model, q_lora_rank, kv_lora_rank, heads * v_head_dim; the absorption:
// nope or kv_lora_rank; the core: head_dim and then seq_kv keys, at most ~600 here) whose rounding errors are
// independent: norm-wise they grow as u sqrt(n) (Higham's probabilistic bound, lambda sqrt(n) u with lambda
// a small constant) and, since RMSNorm and softmax over O(1) logits are well conditioned, add up over the
// ~7 chained stages: 7 * sqrt(600) * 2^-24 ~ 1.0e-5.
constexpr double kRelL2 = 1e-5;

double rel_l2(const FloatArray& got, const double* want) {
  double num = 0, den = 0;
  for (std::size_t e = 0; e < got.numel(); ++e) {
    const double d = got.data[e] - want[e];
    num += d * d;
    den += want[e] * want[e];
  }
  return std::sqrt(num / den);
}

FloatArray tokens(int64_t B, int64_t L, int64_t E, uint64_t seed) {
  FloatArray x({B, L, E});
  fill_normal(x.ptr(), static_cast<int64_t>(x.numel()), seed);
  return x;
}

// Tokens [from, from + n) of x [B, L, E].
FloatArray slice(const FloatArray& x, int64_t from, int64_t n) {
  const int64_t B = x.shape[0], L = x.shape[1], E = x.shape[2];
  FloatArray out({B, n, E});
  for (int64_t b = 0; b < B; ++b) std::copy_n(x.ptr() + (b * L + from) * E, n * E, out.ptr() + b * n * E);
  return out;
}

MlaShape tiny(int64_t q_lora) {
  MlaShape s = mla_preset("tiny");
  s.q_lora_rank = q_lora;
  return s;
}

// Prefills `context` tokens (when > 0) and runs `fresh` more, checking both calls against the fp64
// definition.
void check_against_definition(const MlaShape& s, MlaForm form, const std::string& variant, int64_t batch,
                              int64_t context, int64_t fresh) {
  const MlaWeights w = random_mla_weights(s, 11);
  const MlaLayer layer(s, w);
  const FloatArray x = tokens(batch, context + fresh, s.d_model, 100 + context + fresh);
  const DoubleArray want = mla_reference(s, w, x);      // [B, context + fresh, E]
  MlaCache cache(s, form, batch, context + fresh + 5);  // spare capacity: the core reads a reserved cache
  const MlaCall call{.variant = variant};
  INFO(mla_form_name(form) << " core " << variant << " " << s.str() << " B=" << batch << " context "
                           << context << " new " << fresh);
  auto rows = [&](int64_t from, int64_t n) {  // the definition's rows [from, from + n) of every batch entry
    std::vector<double> r;
    for (int64_t b = 0; b < batch; ++b)
      r.insert(r.end(), want.ptr() + (b * (context + fresh) + from) * s.d_model,
               want.ptr() + (b * (context + fresh) + from + n) * s.d_model);
    return r;
  };
  if (context > 0) {
    const FloatArray y = layer.forward(slice(x, 0, context), cache, call);
    CHECK(rel_l2(y, rows(0, context).data()) <= kRelL2);
  }
  CHECK(cache.length() == context);
  const FloatArray y = layer.forward(slice(x, context, fresh), cache, call);
  CHECK(cache.length() == context + fresh);
  CHECK(rel_l2(y, rows(context, fresh).data()) <= kRelL2);
}

}  // namespace

TEST_CASE("MLA: cache elements and bytes per token of each form", "[mla]") {
  const MlaShape v3 = mla_preset("deepseek_v3");
  CHECK(mla_cache_elements_per_token(v3, MlaForm::absorbed) == 576);
  CHECK(mla_cache_elements_per_token(v3, MlaForm::naive) == 40960);
  const MlaCache absorbed(v3, MlaForm::absorbed, 1, 4),
      naive(mla_preset("deepseek_v2_lite"), MlaForm::naive, 1, 4);
  CHECK(absorbed.bytes_per_token() == 576 * 4);
  CHECK(naive.bytes_per_token() == 16 * (192 + 128) * 4);
  CHECK(absorbed.kv.shape == std::vector<int64_t>{1, 4, 576});
  CHECK(naive.k.shape == std::vector<int64_t>{1, 16, 4, 192});
  CHECK(naive.v.shape == std::vector<int64_t>{1, 16, 4, 128});
  CHECK(absorbed.bytes() == 0);
}

TEST_CASE("MLA: both forms equal the fp64 definition, prefill and decode from caches of 0, 1, 37, 300",
          "[mla]") {
  for (const int64_t q_lora : {int64_t{0}, int64_t{12}})
    for (const MlaForm form : {MlaForm::naive, MlaForm::absorbed})
      for (const int64_t context : {0, 1, 37, 300})
        for (const int64_t fresh : {1, 3})
          check_against_definition(tiny(q_lora), form, "tiled", 1, context, fresh);
  // Batch 2 (the cache's per-entry capacity stride) and a prefill of 9 at once.
  for (const MlaForm form : {MlaForm::naive, MlaForm::absorbed}) {
    check_against_definition(tiny(12), form, "tiled", 2, 37, 3);
    check_against_definition(tiny(0), form, "tiled", 2, 0, 9);
  }
}

TEST_CASE("MLA: the naive variant as the core", "[mla]") {
  for (const MlaForm form : {MlaForm::naive, MlaForm::absorbed}) {
    check_against_definition(tiny(12), form, "naive", 2, 37, 3);
    check_against_definition(tiny(0), form, "naive", 1, 0, 9);
  }
}

TEST_CASE("MLA: DeepSeek's attention widths (576 / 512 absorbed, 192 / 128 naive) at 4 heads", "[mla]") {
  // nope 128, rope 64, v 128, kv_lora 512 as V3; d_model and q_lora small so the fp64 definition stays fast.
  const MlaShape s{.d_model = 64,
                   .heads = 4,
                   .q_lora_rank = 48,
                   .kv_lora_rank = 512,
                   .qk_nope_dim = 128,
                   .qk_rope_dim = 64,
                   .v_head_dim = 128};
  for (const MlaForm form : {MlaForm::naive, MlaForm::absorbed})
    for (const int64_t context : {0, 37})
      for (const int64_t fresh : {1, 3}) check_against_definition(s, form, "tiled", 1, context, fresh);
}

TEST_CASE("MLA: a sequence prefilled in pieces equals the sequence prefilled at once", "[mla]") {
  const MlaShape s = tiny(12);
  const MlaWeights w = random_mla_weights(s, 5);
  const MlaLayer layer(s, w);
  const FloatArray x = tokens(1, 40, s.d_model, 9);
  const DoubleArray want = mla_reference(s, w, x);
  for (const MlaForm form : {MlaForm::naive, MlaForm::absorbed}) {
    INFO(mla_form_name(form));
    MlaCache whole(s, form, 1, 40), pieces(s, form, 1, 64);
    const FloatArray y_whole = layer.forward(x, whole, {});
    FloatArray y_pieces({1, 40, s.d_model});
    int64_t at = 0;
    for (const int64_t n : {17, 1, 22}) {
      const FloatArray y = layer.forward(slice(x, at, n), pieces, {});
      std::copy(y.data.begin(), y.data.end(), y_pieces.ptr() + at * s.d_model);
      at += n;
    }
    CHECK(pieces.length() == 40);
    CHECK(rel_l2(y_whole, want.ptr()) <= kRelL2);
    CHECK(rel_l2(y_pieces, want.ptr()) <= kRelL2);
    // The caches hold the same rows: the projections of a token do not depend on the call it came in.
    const FloatArray& a = form == MlaForm::absorbed ? whole.kv : whole.k;
    const FloatArray& b = form == MlaForm::absorbed ? pieces.kv : pieces.k;
    const int64_t row = a.shape.back(), rows_per_block = form == MlaForm::absorbed ? 1 : s.heads;
    double worst = 0;
    for (int64_t blk = 0; blk < rows_per_block; ++blk)
      for (int64_t t = 0; t < 40; ++t)
        for (int64_t e = 0; e < row; ++e)
          worst =
              std::max<double>(worst, std::fabs(a.data[static_cast<std::size_t>((blk * 40 + t) * row + e)] -
                                                b.data[static_cast<std::size_t>((blk * 64 + t) * row + e)]));
    CHECK(worst <= 1e-5);
  }
}

TEST_CASE("MLA: a cache filled by append() holds what forward() writes, and decodes to the definition",
          "[mla]") {
  const MlaShape s = tiny(12);
  const MlaWeights w = random_mla_weights(s, 6);
  const MlaLayer layer(s, w);
  const FloatArray x = tokens(2, 31, s.d_model, 4);
  const DoubleArray want = mla_reference(s, w, x, 29);  // rows 29, 30 of each batch entry
  for (const MlaForm form : {MlaForm::naive, MlaForm::absorbed}) {
    INFO(mla_form_name(form));
    MlaCache forwarded(s, form, 2, 40), appended(s, form, 2, 40);
    layer.forward(slice(x, 0, 29), forwarded, {});
    layer.append(slice(x, 0, 4),
                 appended);  // in pieces, a decode-sized one (the dot-product path) among them
    layer.append(slice(x, 4, 1), appended);
    layer.append(slice(x, 5, 24), appended);
    CHECK(appended.length() == 29);
    const FloatArray& a = form == MlaForm::absorbed ? forwarded.kv : forwarded.k;
    const FloatArray& b = form == MlaForm::absorbed ? appended.kv : appended.k;
    const FloatArray& av = form == MlaForm::absorbed ? forwarded.kv : forwarded.v;
    const FloatArray& bv = form == MlaForm::absorbed ? appended.kv : appended.v;
    // The same code computes the rows; only the projection's blocking (one row or many) may differ, within
    // fp32 rounding of a width-32 dot product.
    double worst = 0;
    for (std::size_t e = 0; e < a.numel(); ++e)
      worst = std::max<double>(worst, std::fabs(a.data[e] - b.data[e]));
    for (std::size_t e = 0; e < av.numel(); ++e)
      worst = std::max<double>(worst, std::fabs(av.data[e] - bv.data[e]));
    CHECK(worst <= 1e-5);
    const FloatArray y = layer.forward(slice(x, 29, 2), appended, {});
    CHECK(rel_l2(y, want.ptr()) <= kRelL2);
  }
  MlaCache full(s, MlaForm::absorbed, 2, 3);
  CHECK_THROWS_WITH(layer.append(slice(x, 0, 4), full), Contains("4 more do not fit"));
  CHECK_THROWS_WITH(layer.append(tokens(2, 2, 31, 1), full), Contains("x: shape [2, 2, 31]"));
}

TEST_CASE("MLA: bad shapes, weights, inputs and cores are refused by name", "[mla]") {
  MlaShape s = tiny(12);
  s.qk_rope_dim = 5;
  CHECK_THROWS_WITH(s.validate(), Contains("qk_rope_dim = 5") && Contains("even"));
  s = tiny(12);
  s.heads = 0;
  CHECK_THROWS_WITH(s.validate(), Contains("heads = 0") && Contains("[1, "));
  s = tiny(-1);
  CHECK_THROWS_AS(s.validate(), UsageError);
  CHECK_THROWS_WITH(mla_preset("deepseek_v4"), Contains("deepseek_v4") && Contains("deepseek_v3"));
  CHECK_THROWS_WITH(parse_mla_form("latent", "--form"), Contains("--form") && Contains("naive, absorbed"));

  s = tiny(12);
  MlaWeights w = random_mla_weights(s, 1);
  MlaWeights bad = w;
  bad.wkv_b = FloatArray({3, 16});
  CHECK_THROWS_WITH(MlaLayer(s, bad), Contains("wkv_b") && Contains("[3, 16]") && Contains("[56, 16]"));
  bad = w;
  bad.wq = FloatArray({48, 32});
  CHECK_THROWS_WITH(MlaLayer(s, bad), Contains("wq") && Contains("q_lora_rank is 12"));
  bad = w;
  bad.kv_norm.data[3] = NAN;
  CHECK_THROWS_WITH(MlaLayer(s, bad), Contains("kv_norm") && Contains("non-finite"));
  CHECK_THROWS_WITH(MlaLayer(tiny(0), w), Contains("wq") && Contains("expected [48, 32]"));

  const MlaLayer layer(s, w);
  MlaCache cache(s, MlaForm::absorbed, 1, 4);
  CHECK_THROWS_WITH(layer.forward(tokens(1, 2, 31, 1), cache, {}), Contains("x: shape [1, 2, 31]"));
  CHECK_THROWS_WITH(layer.forward(tokens(2, 2, 32, 1), cache, {}),
                    Contains("batch 1") && Contains("batch 2"));
  CHECK_THROWS_WITH(layer.forward(tokens(1, 5, 32, 1), cache, {}),
                    Contains("capacity 4") && Contains("5 more do not fit"));
  MlaCache other(tiny(0), MlaForm::absorbed, 1, 4);
  CHECK_THROWS_WITH(layer.forward(tokens(1, 1, 32, 1), other, {}),
                    Contains("made for") && Contains("q_lora=0"));
  CHECK_THROWS_AS(MlaCache(s, MlaForm::naive, 0, 4), UsageError);
  // A core that cannot read the cache in place is refused with its reasons, and the cache is untouched.
  CHECK_THROWS_WITH(layer.forward(tokens(1, 1, 32, 1), cache, {.variant = "linear"}), Contains("strided_kv"));
  CHECK(cache.length() == 0);
  CHECK_THROWS_WITH(layer.forward(tokens(1, 1, 32, 1), cache, {.variant = "no_such"}), Contains("no_such"));
}

TEST_CASE("MLA: weights saved to .npy files load back equal", "[mla]") {
  attn::test::ScratchDir dir("mla_weights");
  for (const int64_t q_lora : {int64_t{0}, int64_t{12}}) {
    const MlaShape s = tiny(q_lora);
    const MlaWeights w = random_mla_weights(s, 3);
    const std::string path = dir.file("q" + std::to_string(q_lora));
    save_mla_weights(path, w, s);
    const MlaWeights back = load_mla_weights(path, s);
    CHECK(back.wkv_b.data == w.wkv_b.data);
    CHECK(back.wq.data == w.wq.data);
    CHECK(back.q_norm.data == w.q_norm.data);
    CHECK_THROWS_WITH(load_mla_weights(path, tiny(q_lora == 0 ? 12 : 0)), Contains(path));
  }
  const std::string typo = dir.file("q12");
  std::filesystem::copy_file(typo + "/wkv_b.npy", typo + "/wkv_bb.npy");
  CHECK_THROWS_WITH(load_mla_weights(typo, tiny(12)),
                    Contains("wkv_bb.npy") && Contains("did you mean 'wkv_b.npy'"));
}

TEST_CASE("a reserved cache and V with a row stride are read in place as their contiguous copies",
          "[mla][strided_kv]") {
  // Absorbed-form layout: K [B, capacity, D] with V its first Dv columns; MQA; decode (the dot path, split
  // over the keys) and a prefill block (the GEMM path), small tiles so several tiles run.
  const int64_t B = 2, H = 3, D = 24, Dv = 16, cap = 90;
  // tiled: tile_q 8 holds 2 positions of the 3 heads (6 rows: the dot-product path), tile_q 64 up to 21 (63
  // rows: the GEMM path); tile_kv 16 makes several key tiles and, in decode, split-KV partials.
  const std::vector<std::pair<std::string, Json>> cores = {{"tiled", {{"tile_q", 8}, {"tile_kv", 16}}},
                                                           {"tiled", {{"tile_q", 64}, {"tile_kv", 16}}},
                                                           {"naive", Json::object()}};
  for (const auto& [variant, params] : cores)
    for (const int64_t seq_q : {1, 3, 21}) {
      INFO(variant << " " << params.dump() << " seq_q " << seq_q);
      Problem p = make_problem(variant, params);
      p.batch = B;
      p.heads = H;
      p.kv_heads = 1;
      p.seq_q = seq_q;
      p.seq_kv = 70;
      p.head_dim = D;
      p.v_head_dim = Dv;
      p.mask.causal_lower_right = true;
      FloatArray q({B, H, seq_q, D}), cache({B, cap, D});
      fill_normal(q.ptr(), static_cast<int64_t>(q.numel()), 1);
      fill_normal(cache.ptr(), static_cast<int64_t>(cache.numel()), 2);
      for (int64_t b = 0; b < B;
           ++b)  // the reserved rows past seq_kv: never read, by the kernels or the bound
        std::fill_n(cache.ptr() + (b * cap + p.seq_kv) * D, (cap - p.seq_kv) * D, 1e6f);
      FloatArray k({B, 1, p.seq_kv, D}), v({B, 1, p.seq_kv, Dv});
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < p.seq_kv; ++j) {
          std::copy_n(cache.ptr() + (b * cap + j) * D, D, k.ptr() + (b * p.seq_kv + j) * D);
          std::copy_n(cache.ptr() + (b * cap + j) * D, Dv, v.ptr() + (b * p.seq_kv + j) * Dv);
        }
      FloatArray want({B, H, seq_q, Dv}), got({B, H, seq_q, Dv});
      const Attention& a = Registry::instance().get(variant);
      AttentionInputs contiguous{};
      contiguous.q = q.ptr();
      contiguous.k = k.ptr();
      contiguous.v = v.ptr();
      contiguous.out = want.ptr();
      a.run(p, contiguous);
      AttentionInputs in_place = contiguous;
      in_place.k = in_place.v = cache.ptr();
      in_place.kv_capacity = cap;
      in_place.v_row_stride = D;
      in_place.out = got.ptr();
      a.run(p, in_place);
      CHECK(got.data == want.data);  // the same operations on the same values
      // The forward's error bound reads the same K rows and V values as the kernels, not the layout's gaps.
      CHECK(exact_abs_tolerance(p, in_place) == exact_abs_tolerance(p, contiguous));
    }
  // Refusals: a variant without the capability, 16-bit storage, the backward, a capacity below seq_kv.
  Problem p = make_problem("linear");
  p.seq_q = p.seq_kv = 4;
  p.head_dim = 8;
  FloatArray x({1, 1, 4, 8}), o({1, 1, 4, 8});
  AttentionInputs in{};
  in.q = in.k = in.v = x.ptr();
  in.out = o.ptr();
  in.v_row_stride = 9;
  CHECK_THROWS_WITH(Registry::instance().get("linear").run(p, in), Contains("strided_kv"));
  p = make_problem("tiled");
  p.seq_q = p.seq_kv = 4;
  p.head_dim = 8;
  in.kv_capacity = 3;
  CHECK_THROWS_WITH(Registry::instance().get("tiled").run(p, in),
                    Contains("kv_capacity 3") && Contains("seq_kv 4"));
  in.kv_capacity = 0;
  in.v_row_stride = 7;
  CHECK_THROWS_WITH(Registry::instance().get("tiled").run(p, in), Contains("v_row_stride 7"));
  in.v_row_stride = 9;
  p.dtype = DType::bf16;
  std::vector<uint16_t> x16(32);
  in.q16 = in.k16 = in.v16 = x16.data();
  CHECK_THROWS_WITH(Registry::instance().get("tiled").run(p, in), Contains("fp32 only"));
  p.dtype = DType::fp32;
  FloatArray d({1, 1, 4, 8});
  GradientArgs g{.out = o.ptr(), .d_out = d.ptr(), .dq = d.ptr(), .dk = d.ptr(), .dv = d.ptr()};
  std::vector<float> saved(64);
  g.saved = saved.data();
  CHECK_THROWS_WITH(Registry::instance().get("naive").run_backward(p, in, g),
                    Contains("backward does not take"));
}

TEST_CASE("MLA: configs/mla.json's presets are the built-in ones, bad preset files are refused by name",
          "[mla]") {
  const auto presets = load_mla_presets(std::string(ATTN_SOURCE_DIR) + "/configs/mla.json");
  REQUIRE(presets.size() == 2);
  for (const auto& [name, shape] : presets) {
    INFO(name);
    CHECK(shape == mla_preset(name));
    CHECK(mla_shape_from_json(mla_shape_json(shape), "round trip") == shape);
  }
  Json j = mla_shape_json(mla_preset("tiny"));
  j["kv_lora"] = 3;
  CHECK_THROWS_WITH(mla_shape_from_json(j, "x"),
                    Contains("unknown key 'kv_lora'") && Contains("kv_lora_rank"));
  j = mla_shape_json(mla_preset("tiny"));
  j["heads"] = "4";
  CHECK_THROWS_WITH(mla_shape_from_json(j, "x"), Contains("x.heads: expected an integer"));
  j["heads"] = -4;
  CHECK_THROWS_WITH(mla_shape_from_json(j, "x"), Contains("heads = -4"));
}
