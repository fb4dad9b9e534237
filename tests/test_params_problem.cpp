// Typed variant parameters, the problem descriptor and its repro string: defaults, validation errors that
// name the parameter or field and the value, did-you-mean suggestions, and repro round trips.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common/interface/attention.hpp"
#include "common/interface/params.hpp"
#include "common/interface/problem.hpp"
#include "common/support/error.hpp"

using namespace attn;

namespace {

// A spec with every field set (designated initializers that omit fields warn under -Wextra).
ParamSpec spec(std::string name, ParamType type, Json default_value, std::optional<double> min,
               std::optional<double> max, std::vector<std::string> choices = {}) {
  ParamSpec s;
  s.name = std::move(name);
  s.type = type;
  s.default_value = std::move(default_value);
  s.help = "help for " + s.name;
  s.min = min;
  s.max = max;
  s.choices = std::move(choices);
  return s;
}

// One parameter of every type, as a variant would declare them.
std::vector<ParamSpec> sample_specs() {
  return {
      spec("block", ParamType::integer, 64, 1, 4096),
      spec("ratio", ParamType::number, 0.5, 0.0, 1.0),
      spec("kernel", ParamType::string, "exp", std::nullopt, std::nullopt, {"exp", "relu"}),
      spec("windows", ParamType::int_list, Json::array({1, 2}), 0, std::nullopt),
      spec("dilation", ParamType::int_or_int_list, 1, 1, std::nullopt),
  };
}

// Expects `fn` to throw a UsageError whose message holds every one of `parts`.
template <class Fn>
void expect_usage_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL_CHECK("no error; expected a message with '" << parts.front() << "'");
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    INFO(msg);
    for (const auto& part : parts) CHECK(msg.find(part) != std::string::npos);
  }
}

Json resolve(const Json& given) {
  return resolve_params(sample_specs(), given, "variant 'demo'");
}

}  // namespace

TEST_CASE("resolve_params fills defaults and keeps given values", "[params]") {
  const Json defaults = resolve(Json::object());
  CHECK(defaults ==
        Json{{"block", 64}, {"ratio", 0.5}, {"kernel", "exp"}, {"windows", {1, 2}}, {"dilation", 1}});
  CHECK(resolve(Json()) == defaults);  // null: no parameters given

  const Json given = resolve({{"block", 8}, {"kernel", "relu"}, {"dilation", {1, 2, 4}}});
  CHECK(given["block"] == 8);
  CHECK(given["kernel"] == "relu");
  CHECK(given["dilation"] == Json{1, 2, 4});
  CHECK(given["ratio"] == 0.5);

  // A whole-valued float is an integer (JSON configs write 3.0); it is stored as an integer.
  const Json whole = resolve({{"block", 3.0}, {"dilation", 2.0}});
  CHECK(whole["block"].is_number_integer());
  CHECK(whole["block"] == 3);
  CHECK(whole["dilation"] == 2);
  // Bounds are inclusive.
  CHECK(resolve({{"block", 1}, {"ratio", 1.0}})["ratio"] == 1.0);
  CHECK(resolve({{"block", 4096}, {"ratio", 0}})["block"] == 4096);
}

TEST_CASE("resolve_params rejects unknown names with did-you-mean, wrong types and out-of-range values",
          "[params]") {
  SECTION("unknown parameter") {
    expect_usage_error(
        [] {
          resolve({{"blok", 3}});
        },
        {"variant 'demo'", "unknown parameter 'blok'", "did you mean 'block'?", "known: block, ratio"});
    try {
      resolve({{"zzzzzzzzzz", 3}});
      FAIL_CHECK("accepted an unknown parameter");
    } catch (const UsageError& e) {
      // Nothing is close: no suggestion, but the known names are listed.
      CHECK_THAT(e.what(), !Catch::Contains("did you mean") && Catch::Contains("known: "));
    }
    expect_usage_error(
        [] {
          resolve_params({}, {{"window", 3}}, "variant 'naive'");
        },
        {"unknown parameter 'window'", "takes no parameters"});
  }
  SECTION("wrong type") {
    expect_usage_error(
        [] {
          resolve({{"block", "abc"}});
        },
        {"parameter 'block'", "must be an integer", "\"abc\""});
    expect_usage_error([] { resolve({{"block", 1.5}}); }, {"parameter 'block'", "must be an integer", "1.5"});
    expect_usage_error([] { resolve({{"ratio", "x"}}); }, {"parameter 'ratio'", "finite number"});
    expect_usage_error([] { resolve({{"kernel", 3}}); }, {"parameter 'kernel'", "must be a string", "3"});
    expect_usage_error([] { resolve({{"windows", 5}}); }, {"parameter 'windows'", "list of integers", "5"});
    expect_usage_error([] { resolve(Json::array({1, 2})); }, {"variant 'demo'", "must be an object"});
  }
  SECTION("out of range") {
    expect_usage_error([] { resolve({{"block", 0}}); }, {"parameter 'block'", "got 0"});
    expect_usage_error([] { resolve({{"block", 5000}}); }, {"parameter 'block'", "got 5000"});
    expect_usage_error([] { resolve({{"ratio", 1.5}}); }, {"parameter 'ratio'", "got 1.5"});
    expect_usage_error([] { resolve({{"ratio", -0.25}}); }, {"parameter 'ratio'", "got -0.25"});
    expect_usage_error(
        [] {
          resolve({{"kernel", "tanh"}});
        },
        {"parameter 'kernel'", "{exp, relu}", "\"tanh\""});
    expect_usage_error([] { resolve({{"dilation", 0}}); }, {"parameter 'dilation'", "got 0"});
  }
  SECTION("list element errors name the index") {
    expect_usage_error([] { resolve({{"windows", {4, 5, -2}}}); }, {"parameter 'windows'[2]", "got -2"});
    expect_usage_error([] { resolve({{"dilation", {1, "x"}}}); }, {"parameter 'dilation'[1]", "\"x\""});
    expect_usage_error([] { resolve({{"windows", Json::array({0.5})}}); }, {"parameter 'windows'[0]", "0.5"});
  }
  SECTION("an invalid default is reported as such") {
    const std::vector<ParamSpec> broken = {spec("block", ParamType::integer, 0, 1, std::nullopt)};
    expect_usage_error([&] { resolve_params(broken, Json::object(), "variant 'x' defaults"); },
                       {"parameter 'block' (default)", "got 0"});
  }
}

TEST_CASE("parse_param_value reads CLI text by the spec's type", "[params]") {
  const auto specs = sample_specs();
  const ParamSpec &block = specs[0], &ratio = specs[1], &kernel = specs[2], &windows = specs[3],
                  &dilation = specs[4];
  const Json three = parse_param_value(block, "3", "p");
  CHECK(three.is_number_integer());
  CHECK(three == 3);
  CHECK(parse_param_value(ratio, "0.25", "p") == 0.25);
  CHECK(parse_param_value(ratio, "1e-3", "p") == 1e-3);
  CHECK(parse_param_value(kernel, "relu", "p") == "relu");
  CHECK(parse_param_value(kernel, "3", "p") == "3");  // strings stay strings
  CHECK(parse_param_value(windows, "1,2,3", "p") == Json{1, 2, 3});
  CHECK(parse_param_value(windows, "1;2;3", "p") == Json{1, 2, 3});  // the repro-string spelling
  CHECK(parse_param_value(windows, "7", "p") == Json::array({7}));
  CHECK(parse_param_value(dilation, "4", "p") == 4);
  CHECK(parse_param_value(dilation, "4,8", "p") == Json{4, 8});

  expect_usage_error([&] { parse_param_value(block, "abc", "--param 'block'"); },
                     {"--param 'block'", "'abc'"});
  expect_usage_error([&] { parse_param_value(block, "3x", "p"); }, {"'3x'"});
  expect_usage_error([&] { parse_param_value(ratio, "", "p"); }, {"number"});
  expect_usage_error([&] { parse_param_value(windows, "1,b,3", "p"); }, {"'b'"});

  // Typed values, then validation: "3.5" parses, resolve_params refuses it for an integer.
  expect_usage_error(
      [&] {
        resolve({{"block", parse_param_value(block, "3.5", "p")}});
      },
      {"must be an integer"});
}

TEST_CASE("param_value_text is what parse_param_value reads back", "[params]") {
  const auto specs = sample_specs();
  CHECK(param_value_text(Json(64)) == "64");
  CHECK(param_value_text(Json("relu")) == "relu");
  CHECK(param_value_text(Json{1, 2, 3}) == "1;2;3");
  CHECK(param_value_text(Json::array()) == "[]");
  CHECK(parse_param_value(specs[3], param_value_text(Json{1, 2, 3}), "p") == Json{1, 2, 3});
  // A number parameter must survive the repro string exactly, or the repro does not rerun the same case.
  for (double x : {0.5, 0.1, 1.0 / 3.0, 0.1234567, 1e-7}) {
    INFO("value " << x << " printed as " << param_value_text(Json(x)));
    CHECK(parse_param_value(specs[1], param_value_text(Json(x)), "p").get<double>() == x);
  }
}

TEST_CASE("did_you_mean suggests only plausible typos", "[params]") {
  const std::vector<std::string> names = {"block", "window", "dilation"};
  CHECK(did_you_mean("blok", names) == "block");
  CHECK(did_you_mean("windwo", names) == "window");
  CHECK(did_you_mean("dilatoin", names) == "dilation");
  CHECK_FALSE(did_you_mean("xyzzy", names).has_value());
  CHECK_FALSE(did_you_mean("blok", {}).has_value());
}

TEST_CASE("parse_mask reads every combination and MaskSpec::str writes it back", "[params]") {
  CHECK(parse_mask("none", "w") == MaskSpec{});
  CHECK(parse_mask("", "w") == MaskSpec{});
  CHECK(parse_mask("causal", "w") == MaskSpec{.causal = true});
  CHECK(parse_mask("pad+bool", "w") == MaskSpec{.boolean = true, .key_padding = true});
  for (int bits = 0; bits < 8; ++bits) {
    const MaskSpec m{.causal = (bits & 1) != 0, .boolean = (bits & 2) != 0, .key_padding = (bits & 4) != 0};
    INFO(m.str());
    CHECK(parse_mask(m.str(), "w") == m);
    CHECK(m.any() == (bits != 0));
  }
  CHECK(MaskSpec{.causal = true, .boolean = true, .key_padding = true}.str() == "causal+bool+pad");
  CHECK(parse_mask("causal_lower_right+pad", "w") ==
        MaskSpec{.key_padding = true, .causal_lower_right = true});
  CHECK(MaskSpec{.key_padding = true, .causal_lower_right = true}.str() == "causal_lower_right+pad");
  CHECK(MaskSpec{.causal_lower_right = true}.any_causal());
  CHECK_FALSE(MaskSpec{.boolean = true}.any_causal());
  expect_usage_error([] { parse_mask("causal+sideways", "--mask"); },
                     {"--mask", "'sideways'", "causal+sideways"});
}

TEST_CASE("Problem::validate names the bad field and its value", "[params]") {
  auto with = [](auto change) {
    Problem p = make_problem("naive");
    p.seq_q = p.seq_kv = 8;
    change(p);
    return p;
  };
  CHECK_NOTHROW(with([](Problem&) {}).validate());
  expect_usage_error([&] { with([](Problem& p) { p.batch = 0; }).validate(); }, {"batch", "got 0"});
  expect_usage_error([&] { with([](Problem& p) { p.heads = -3; }).validate(); }, {"heads", "got -3"});
  expect_usage_error([&] { with([](Problem& p) { p.seq_q = 0; }).validate(); }, {"seq_q", "got 0"});
  expect_usage_error([&] { with([](Problem& p) { p.seq_kv = int64_t{1} << 41; }).validate(); },
                     {"seq_kv", "2199023255552"});
  expect_usage_error([&] { with([](Problem& p) { p.head_dim = 0; }).validate(); }, {"head_dim", "got 0"});
  expect_usage_error([&] { with([](Problem& p) { p.scale = 0.0; }).validate(); }, {"scale", "> 0"});
  expect_usage_error([&] { with([](Problem& p) { p.scale = -1.0; }).validate(); }, {"scale", "-1"});
  expect_usage_error([&] { with([](Problem& p) { p.scale = std::nan(""); }).validate(); }, {"scale", "nan"});
  expect_usage_error([&] { with([](Problem& p) { p.dropout = 1.0; }).validate(); }, {"dropout", "got 1"});
  expect_usage_error([&] { with([](Problem& p) { p.dropout = -0.1; }).validate(); }, {"dropout", "-0.1"});
  expect_usage_error([&] { with([](Problem& p) { p.dropout = std::nan(""); }).validate(); },
                     {"dropout", "nan"});
  // Grouped-query heads: kv_heads must divide heads; the message names both.
  CHECK_NOTHROW(with([](Problem& p) { p.heads = 32, p.kv_heads = 8; }).validate());
  CHECK_NOTHROW(with([](Problem& p) { p.heads = 6, p.kv_heads = 3; }).validate());
  expect_usage_error([&] { with([](Problem& p) { p.heads = 32, p.kv_heads = 5; }).validate(); },
                     {"kv_heads", "kv_heads 5", "heads 32"});
  expect_usage_error([&] { with([](Problem& p) { p.heads = 4, p.kv_heads = 8; }).validate(); },
                     {"kv_heads", "kv_heads 8", "heads 4"});
  expect_usage_error([&] { with([](Problem& p) { p.heads = 4, p.kv_heads = -1; }).validate(); },
                     {"kv_heads", "-1"});
}

TEST_CASE("Problem accessors: default scale, element counts, typed parameters", "[params]") {
  Problem p = make_problem("naive");
  p.batch = 2, p.heads = 3, p.seq_q = 5, p.seq_kv = 7, p.head_dim = 16;
  CHECK(p.effective_scale() == 0.25);
  p.scale = 0.3;
  CHECK(p.effective_scale() == 0.3);
  CHECK(p.q_elements() == 2 * 3 * 5 * 16);
  CHECK(p.kv_elements() == 2 * 3 * 7 * 16);
  CHECK_FALSE(p.is_self_shaped());
  CHECK(p.num_kv_heads() == 3);  // kv_heads 0: one K/V head per query head
  CHECK_FALSE(p.is_gqa());
  p.heads = 8, p.kv_heads = 2;
  CHECK(p.group_size() == 4);
  CHECK(p.kv_elements() == 2 * 2 * 7 * 16);
  CHECK((p.kv_head_of(0) == 0 && p.kv_head_of(3) == 0 && p.kv_head_of(4) == 1 && p.kv_head_of(7) == 1));
  CHECK(p.kv_block(1, 5) == 1 * 2 + 1);
  CHECK(p.is_gqa());
  p.heads = 3, p.kv_heads = 0;
  // Asking for a parameter the variant does not declare is a variant bug, not a usage error.
  CHECK_THROWS_AS(p.param_int("block"), std::logic_error);
  p.params = {{"block", 32}, {"ratio", 0.5}, {"kernel", "relu"}};
  CHECK(p.param_int("block") == 32);
  CHECK(p.param_number("ratio") == 0.5);
  CHECK(p.param_string("kernel") == "relu");
}

TEST_CASE("repro strings round-trip through parse_problem", "[params]") {
  std::vector<Problem> problems;
  auto add = [&](auto change) {
    Problem p = make_problem("naive");
    change(p);
    problems.push_back(p);
  };
  add([](Problem&) {});
  add([](Problem& p) { p.batch = 2, p.heads = 8, p.seq_q = p.seq_kv = 1024, p.head_dim = 64; });
  add([](Problem& p) {
    p.seq_q = 7, p.seq_kv = 19, p.head_dim = 17, p.mask = parse_mask("causal+bool+pad", "");
  });
  add([](Problem& p) { p.seq_q = p.seq_kv = 17, p.mask.key_padding = true, p.scale = 0.3; });
  add([](Problem& p) { p.seq_q = p.seq_kv = 33, p.mask.causal = true, p.dropout = 0.25, p.seed = 1234; });
  add([](Problem& p) { p.dropout = 0.1, p.seed = 18446744073709551615ull; });
  // Values that need more than six significant digits: a repro must rerun exactly this case.
  add([](Problem& p) { p.head_dim = 3, p.scale = 1.0 / std::sqrt(3.0); });
  add([](Problem& p) { p.dropout = 0.1234567, p.seed = 5; });
  add([](Problem& p) {
    p.heads = 32, p.kv_heads = 8, p.seq_q = 1, p.seq_kv = 4096, p.mask.causal_lower_right = true;
  });
  add([](Problem& p) { p.heads = 4, p.kv_heads = 4; });  // kv_heads == heads: written as plain MHA
  for (const Problem& p : problems) {
    const std::string repro = p.repro();
    INFO(repro);
    const Problem q = parse_problem(repro);
    CHECK(q.variant == p.variant);
    CHECK(q.params == p.params);
    CHECK(q.batch == p.batch);
    CHECK(q.heads == p.heads);
    CHECK(q.num_kv_heads() == p.num_kv_heads());
    CHECK(q.seq_q == p.seq_q);
    CHECK(q.seq_kv == p.seq_kv);
    CHECK(q.head_dim == p.head_dim);
    CHECK(q.mask == p.mask);
    CHECK(q.scale.has_value() == p.scale.has_value());
    if (p.scale && q.scale) CHECK(*q.scale == *p.scale);
    CHECK(q.dropout == p.dropout);
    if (p.dropout > 0) CHECK(q.seed == p.seed);  // the seed only matters (and is only written) with dropout
    CHECK(q.repro() == repro);
  }
  CHECK(problems[2].repro() == "naive:B=1,H=1,Lq=7,Lkv=19,D=17,causal+bool+pad");
  CHECK(problems[4].repro() == "naive:B=1,H=1,Lq=33,Lkv=33,D=64,causal,dropout=0.25,seed=1234");
  CHECK(problems[8].repro() == "naive:B=1,H=32,Hkv=8,Lq=1,Lkv=4096,D=64,causal_lower_right");
  CHECK(problems[9].repro() == "naive:B=1,H=4,Lq=1,Lkv=1,D=64");
  expect_usage_error([] { parse_problem("naive:B=1,H=6,Hkv=4,Lq=2,Lkv=2,D=8"); }, {"kv_heads 4", "heads 6"});
}

TEST_CASE("malformed repro strings are rejected with a message saying what is wrong", "[params]") {
  const std::string shape = "B=1,H=1,Lq=4,Lkv=4,D=8";
  expect_usage_error([] { parse_problem("naive"); }, {"repro string 'naive'", "missing ':'"});
  expect_usage_error([&] { parse_problem("naiv:" + shape); },
                     {"unknown variant 'naiv'", "did you mean 'naive'?"});
  expect_usage_error([&] { parse_problem("naive{:" + shape); }, {"unbalanced '{'"});
  expect_usage_error([&] { parse_problem("naive{foo}:" + shape); }, {"parameter 'foo' is not k=v"});
  expect_usage_error([&] { parse_problem("naive{blok=3}:" + shape); },
                     {"unknown parameter 'blok'", "takes no parameters"});
  expect_usage_error([] { parse_problem("naive:B=x,H=1"); }, {"field 'B'", "non-numeric", "'x'"});
  expect_usage_error([] { parse_problem("naive:B=99999999999999999999999"); }, {"field 'B'", "out of range"});
  expect_usage_error([&] { parse_problem("naive:" + shape + ",Q=3"); }, {"unknown field 'Q'"});
  expect_usage_error([&] { parse_problem("naive:" + shape + ",sideways"); }, {"unknown mask 'sideways'"});
  expect_usage_error([] { parse_problem("naive:B=0,H=1,Lq=4,Lkv=4,D=8"); }, {"batch", "got 0"});
  expect_usage_error([&] { parse_problem("naive:" + shape + ",dropout=1.5"); }, {"dropout", "1.5"});
  expect_usage_error([&] { parse_problem("naive:" + shape + ",scale=-2"); }, {"scale", "-2"});
  // Trailing garbage in a number is a typo to report, not a value to truncate ("B=3x" is not B=3).
  expect_usage_error([] { parse_problem("naive:B=3x,H=1,Lq=4,Lkv=4,D=8"); }, {"field 'B'", "3x"});
  expect_usage_error([&] { parse_problem("naive:" + shape + ",dropout=0.5,seed=-1"); },
                     {"field 'seed'", "-1"});
}

TEST_CASE("the registry refuses unknown variant names with a suggestion", "[params]") {
  REQUIRE(Registry::instance().find("naive") != nullptr);
  CHECK(Registry::instance().find("naiv") == nullptr);
  CHECK(&Registry::instance().get("naive") == Registry::instance().find("naive"));
  expect_usage_error([] { Registry::instance().get("naiv"); },
                     {"unknown variant 'naiv'", "did you mean 'naive'?", "registered:", "naive"});
  expect_usage_error([] { make_problem("Naive"); }, {"unknown variant 'Naive'", "did you mean 'naive'?"});
  expect_usage_error(
      [] {
        make_problem("naive", {{"block", 3}});
      },
      {"variant 'naive'", "unknown parameter 'block'"});
  const auto names = Registry::instance().names();
  CHECK(std::is_sorted(names.begin(), names.end()));
  CHECK(names.size() == Registry::instance().all().size());
}

TEST_CASE("d_v != d_k: sizes, repro Dv=, validation, and a variant without value_dim refuses with the reason",
          "[params][value_dim]") {
  Problem p = make_problem("naive");
  p.batch = 2, p.heads = 4, p.kv_heads = 2, p.seq_q = 5, p.seq_kv = 7, p.head_dim = 16;
  CHECK(p.value_dim() == 16);
  CHECK_FALSE(p.distinct_value_dim());
  CHECK(p.repro().find("Dv=") == std::string::npos);
  p.v_head_dim = 24;
  CHECK(p.value_dim() == 24);
  CHECK(p.q_elements() == 2 * 4 * 5 * 16);
  CHECK(p.kv_elements() == 2 * 2 * 7 * 16);
  CHECK(p.v_elements() == 2 * 2 * 7 * 24);
  CHECK(p.out_elements() == 2 * 4 * 5 * 24);
  CHECK(p.state_elements() == 2 * 4 * 16 * 24);
  CHECK(p.effective_scale() == 0.25);  // 1/sqrt(d_k)
  CHECK(p.repro() == "naive:B=2,H=4,Hkv=2,Lq=5,Lkv=7,D=16,Dv=24");
  const Problem back = parse_problem(p.repro());
  CHECK(back.value_dim() == 24);
  CHECK(back.repro() == p.repro());
  // Dv equal to D reads back as the same problem (no Dv in its id).
  CHECK(parse_problem("naive:B=1,H=1,Lq=2,Lkv=2,D=8,Dv=8").repro() == "naive:B=1,H=1,Lq=2,Lkv=2,D=8");
  expect_usage_error([] { (void)parse_problem("naive:B=1,H=1,Lq=2,Lkv=2,D=8,Dv=-3"); }, {"Dv", "-3"});
  Problem bad = p;
  bad.v_head_dim = -1;
  expect_usage_error([&] { bad.validate(); }, {"v_head_dim", "-1"});
  // V and the output are bounded like Q and K.
  bad = p;
  bad.batch = 1, bad.heads = 1, bad.kv_heads = 0, bad.seq_q = 1, bad.seq_kv = int64_t{1} << 30,
  bad.head_dim = 1;
  bad.v_head_dim = int64_t{1} << 30;
  expect_usage_error([&] { bad.validate(); }, {"v_head_dim", "(the elements of V)"});
  CHECK(Registry::instance().get("naive").unsupported_reasons_text(p).empty());
  Problem sw = make_problem("sliding_window");  // its own parameters; p's sizes
  sw.batch = p.batch, sw.heads = p.heads, sw.kv_heads = p.kv_heads, sw.seq_q = sw.seq_kv = p.seq_q;
  sw.head_dim = p.head_dim, sw.v_head_dim = p.v_head_dim;
  const std::string why = Registry::instance().get("sliding_window").unsupported_reasons_text(sw);
  CHECK_THAT(why, Catch::Matchers::Contains("needs V as wide as Q and K (got v_head_dim 24 != head_dim 16)"));
}
