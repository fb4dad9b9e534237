// Plugins (issue #29) against the suite's test plugins (tests/plugins/*.cpp, built by
// tests/plugins/plugins.cmake into ATTN_TEST_PLUGIN_DIR): what the loader refuses (a missing file, a library
// that is no plugin, a plugin of another ABI, a variant name that is taken), each exit 2 from the CLI with
// the path named and nothing registered; a good plugin's variant checked and swept beside naive; hostile
// variants (throws, NaN, writes past its output) failing their rows while the sweep goes on; the rows'
// `plugin` field and meta.json's "plugins"; the config's "plugins" key and ATTNBENCH_PLUGINS;
// attnbench_gbench --plugin; the guard regions of the runner's output buffers (bench/lib/guarded.hpp), and
// under AddressSanitizer the out-of-bounds write reported where it happens.
//
// Only plugin_good (a correct variant) is loaded into this process (attn_tests exports its symbols, so it
// can): every other plugin runs in a child attnbench, so a test binary run as a whole never registers a
// hostile variant beside the built-in ones.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "bench/lib/guarded.hpp"
#include "common/interface/attention.hpp"
#include "common/interface/plugin_abi.hpp"
#include "common/interface/plugin_loader.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/support/error.hpp"
#include "tests/support/attention_case.hpp"
#include "tests/support/process.hpp"

using namespace attn;
using namespace attn::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

constexpr bool kAsanBuild =
#ifdef ATTN_GUARDED_ASAN
    true;
#else
    false;
#endif

std::string plugin_path(const std::string& name) {
  return (fs::path(ATTN_TEST_PLUGIN_DIR) / ("lib" + name + ".so")).string();
}
std::string real(const std::string& path) {
  return fs::canonical(path).string();
}

// Runs attnbench with ATTNBENCH_PLUGINS set to `env` (unset when empty): this process's own loads append to
// it, and a child must see only what the test gives it.
ProcResult attnbench(const ScratchDir& dir, const std::vector<std::string>& args,
                     const std::string& env = "") {
  if (env.empty())
    ::unsetenv("ATTNBENCH_PLUGINS");
  else
    ::setenv("ATTNBENCH_PLUGINS", env.c_str(), 1);
  ProcResult r = run_attnbench(args, dir.path());
  ::unsetenv("ATTNBENCH_PLUGINS");
  return r;
}

// Correctness sweeps: no re-measuring, no recalibration, few repetitions.
Json measure_fast() {
  return {{"warmup", 0},     {"min_reps", 1},         {"max_reps", 2},       {"min_time_s", 0},
          {"max_time_s", 1}, {"max_interference", 1}, {"calibrate_every", 0}};
}

Json tiny_config(const Json& variants, const Json& seq_len = Json::array({32, 64})) {
  return {{"name", "plugins"},
          {"variants", variants},
          {"sweep", {{"batch", 1}, {"heads", 2}, {"head_dim", 16}, {"seq_len", seq_len}, {"threads", 1}}},
          {"measure", measure_fast()},
          {"accuracy", {{"reference", "full"}}},
          {"memory_budget", "1GiB"},
          {"seed", 5}};
}

std::vector<Json> read_rows(const fs::path& jsonl) {
  std::vector<Json> rows;
  std::istringstream in(slurp(jsonl));
  for (std::string line; std::getline(in, line);) rows.push_back(Json::parse(line));
  return rows;
}

// "PATH (fnv1a64:<16 hex>)" of the plugin at `path`, as rows record it.
void check_source(const std::string& source, const std::string& path) {
  INFO("plugin field: " << source);
  if (source.empty()) {
    FAIL_CHECK("the plugin field is empty");
    return;
  }
  CHECK(source.rfind(real(path) + " (fnv1a64:", 0) == 0);
  CHECK(source.size() == real(path).size() + std::string(" (fnv1a64:)").size() + 16);
  CHECK(source.back() == ')');
}

}  // namespace

TEST_CASE("plugins: a missing file, a library that is no plugin, another ABI and a taken name are refused",
          "[plugin]") {
  ScratchDir dir("plugins");
  struct Refused {
    std::string path;
    std::vector<std::string> says;
  };
  const std::string abi = "plugin ABI " + std::to_string(ATTNBENCH_ABI_VERSION);
  const std::map<std::string, Refused> cases = {
      {"missing", {plugin_path("no_such_plugin"), {"no such file"}}},
      {"not a plugin",
       {plugin_path("plugin_not_a_plugin"), {"not an attnbench plugin", "no plugin ABI marker"}}},
      {"wrong ABI",
       {plugin_path("plugin_wrong_abi"), {"attnbench 9.9.9 (test)", "plugin ABI 999", abi, "rebuild"}}},
      {"clash", {plugin_path("plugin_clash"), {"variant 'naive' clashes", "built into"}}},
  };
  const std::vector<std::string> names_before = Registry::instance().names();
  for (const auto& [what, c] : cases) {
    INFO(what << ": " << c.path);
    // From the command line: exit 2, the message naming the option and the path, nothing listed.
    const ProcResult r = attnbench(dir, {"--plugin", c.path, "list"});
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK_THAT(r.err, Contains("--plugin '" + c.path + "'"));
    for (const std::string& s : c.says) CHECK_THAT(r.err, Contains(s));
    if (what == "clash") CHECK_THAT(r.err, Contains("built into '" + real(ATTNBENCH_EXE) + "'"));
    // In this process: a UsageError with the same text, and the registry as it was.
    try {
      load_plugin(c.path, "--plugin");
      FAIL("load_plugin accepted " << c.path);
    } catch (const UsageError& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Contains(c.path));
      for (const std::string& s : c.says) CHECK_THAT(msg, Contains(s));
    }
    CHECK(Registry::instance().names() == names_before);
    CHECK(loaded_plugins().empty());
  }
  CHECK(plugin_of("naive") == nullptr);
  CHECK(plugin_source("naive").empty());
}

TEST_CASE("plugins: plugin_good loads once however often it is named, and its variant passes attnbench check",
          "[plugin]") {
  ScratchDir dir("plugins");
  const std::string good = plugin_path("plugin_good");
  REQUIRE(Registry::instance().find("plugin_good_exact") == nullptr);
  const PluginInfo& info = load_plugin(good, "--plugin");
  CHECK(info.path == real(good));
  CHECK(info.abi == ATTNBENCH_ABI_VERSION);
  CHECK(info.variants == std::vector<std::string>{"plugin_good_exact"});
  CHECK(info.hash.size() == std::string("fnv1a64:").size() + 16);
  // The same file again (by another spelling of its path): the same plugin, nothing registered twice.
  const PluginInfo& again =
      load_plugin((fs::path(ATTN_TEST_PLUGIN_DIR) / "." / "libplugin_good.so").string());
  CHECK(&again == &info);
  CHECK(loaded_plugins().size() == 1);
  REQUIRE(Registry::instance().find("plugin_good_exact") != nullptr);
  CHECK(plugin_of("plugin_good_exact") == &info);
  CHECK(plugin_source("plugin_good_exact") == info.path + " (" + info.hash + ")");
  CHECK(plugin_source("naive").empty());
  const Json j = plugins_json();
  REQUIRE(j.size() == 1);
  CHECK(j[0].at("path") == info.path);
  CHECK(j[0].at("variants") == Json::array({"plugin_good_exact"}));
  CHECK(j[0].at("hash") == info.hash);
  CHECK(j[0].at("abi") == ATTNBENCH_ABI_VERSION);
  CHECK(j[0].at("built_against").get<std::string>().size() > 0);
  // Its output equals naive's on the same inputs (plain, causal; grouped-query heads).
  for (const std::string mask : {"none", "causal"}) {
    Problem p = make_test_problem("naive", 2, 4, 24, 24, 16, mask);
    p.kv_heads = 2;
    AttentionCase a(p, 11);
    p.variant = "plugin_good_exact";
    AttentionCase b(p, 11);
    Registry::instance().get("naive").run(a.p, a.inputs());
    Registry::instance().get("plugin_good_exact").run(b.p, b.inputs());
    double err = 0;
    for (std::size_t i = 0; i < a.out.numel(); ++i)
      err = std::max(err, static_cast<double>(std::abs(a.out.data[i] - b.out.data[i])));
    INFO(mask);
    CHECK(err < 1e-5);
  }
  // From the command line, named twice: the registry checks pass on it.
  const ProcResult r =
      attnbench(dir, {"--plugin", good, "--plugin", good, "check", "--variant", "plugin_good_exact"});
  CHECK(r.code == 0);
  CHECK_THAT(r.out + r.err, Contains("plugin_good_exact"));
  const ProcResult l = attnbench(dir, {"--plugin", good, "--plugin", good, "list"});
  CHECK(l.code == 0);
  CHECK_THAT(l.out, Contains("plugin_good_exact: "));
}

TEST_CASE("plugins: a sweep with --plugin writes every row, failing the hostile variants' with the reason",
          "[plugin]") {
  ScratchDir dir("plugins");
  const std::string good = plugin_path("plugin_good"), hostile = plugin_path("plugin_hostile");
  // Under AddressSanitizer plugin_oob stops the process at its write (the ASan test below).
  Json variants = {"naive", "plugin_good_exact", "plugin_throws", "plugin_nan"};
  if (!kAsanBuild) variants.push_back("plugin_oob");
  const std::string cfg = dir.write("sweep.json", tiny_config(variants).dump(2));
  const fs::path out = dir.path() / "out";
  const ProcResult r =
      attnbench(dir, {"--plugin", good, "--plugin", hostile, "run", cfg, "--out", out.string()});
  CHECK(r.code == 1);  // failed rows: the sweep finishes and says so
  const std::vector<Json> rows = read_rows(out / "results.jsonl");
  CHECK(rows.size() == 2 * variants.size());
  std::map<std::string, int> seen;
  for (const Json& row : rows) {
    const std::string v = row.at("variant"), status = row.at("status"), reason = row.at("reason");
    INFO(row.at("id").get<std::string>() << ": " << status << " " << reason);
    ++seen[v];
    REQUIRE(row.at("plugin").is_string());
    if (v == "naive") {
      CHECK(status == "ok");
      CHECK(row.at("plugin") == "");
    } else if (v == "plugin_good_exact") {
      CHECK(status == "ok");
      check_source(row.at("plugin"), good);
      CHECK(row.at("accuracy").at("max_abs_err").get<double>() < 1e-5);
    } else {
      CHECK(status == "failed");
      check_source(row.at("plugin"), hostile);
      if (v == "plugin_throws")
        CHECK(reason == "plugin_throws: deliberate failure in the hostile test plugin");
      if (v == "plugin_nan") CHECK(reason == "1 NaN/Inf values in the output from finite inputs");
      if (v == "plugin_oob") CHECK(reason == "wrote outside its output O: 1 float after its end");
      CHECK(row.at("time_ms").at("median").is_null());
    }
  }
  for (const auto& v : variants) CHECK(seen[v.get<std::string>()] == 2);
  // meta.json names both plugins with what they registered; the CSV has the column.
  const Json meta = Json::parse(slurp(out / "meta.json"));
  REQUIRE(meta.at("plugins").size() == 2);
  CHECK(meta["plugins"][0].at("path") == real(good));
  CHECK(meta["plugins"][0].at("variants") == Json::array({"plugin_good_exact"}));
  CHECK(meta["plugins"][1].at("path") == real(hostile));
  CHECK(meta["plugins"][1].at("variants") == Json::array({"plugin_nan", "plugin_oob", "plugin_throws"}));
  CHECK(rows[0].at("plugin") == "");
  CHECK_THAT(slurp(out / "results.csv"), Contains("plugin"));

  // Without plugins, meta.json says so (an empty list) and every row's plugin is "".
  const std::string plain = dir.write("plain.json", tiny_config({"naive"}, {32}).dump(2));
  REQUIRE(attnbench(dir, {"run", plain, "--out", dir.file("plain")}).code == 0);
  CHECK(Json::parse(slurp(dir.path() / "plain" / "meta.json")).at("plugins") == Json::array());
  for (const Json& row : read_rows(dir.path() / "plain" / "results.jsonl")) CHECK(row.at("plugin") == "");
}

TEST_CASE("plugins: a config's plugins key loads paths relative to its folder and refuses bad entries",
          "[plugin]") {
  ScratchDir dir("plugins");
  // A copy of plugin_good in a folder beside the config: the rows name the copy (same bytes, same hash).
  fs::create_directories(dir.path() / "cfg" / "lib");
  const fs::path copy = dir.path() / "cfg" / "lib" / "libmine.so";
  fs::copy_file(plugin_path("plugin_good"), copy);
  Json c = tiny_config({"naive", "plugin_good_exact"}, {32});
  c["plugins"] = {"lib/libmine.so"};
  const std::string cfg = (dir.path() / "cfg" / "sweep.json").string();
  write_text(cfg, c.dump(2));
  const ProcResult r = attnbench(dir, {"run", cfg, "--out", dir.file("out")});
  REQUIRE(r.code == 0);
  const std::vector<Json> rows = read_rows(dir.path() / "out" / "results.jsonl");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].at("plugin") == "");
  check_source(rows[1].at("plugin"), copy.string());
  const Json meta = Json::parse(slurp(dir.path() / "out" / "meta.json"));
  REQUIRE(meta.at("plugins").size() == 1);
  CHECK(meta["plugins"][0].at("path") == real(copy.string()));

  const std::map<std::string, std::pair<Json, std::vector<std::string>>> bad = {
      {"not an array", {"lib/libmine.so", {"plugins: expected an array of paths"}}},
      {"a number", {Json::array({5}), {"plugins[0]", "expected a non-empty path string, got 5"}}},
      {"an empty string", {Json::array({""}), {"plugins[0]", "expected a non-empty path string"}}},
      {"the second entry", {Json::array({"lib/libmine.so", false}), {"plugins[1]", "got false"}}},
      {"a missing file", {Json::array({"lib/nothing.so"}), {"plugins[0]", "lib/nothing.so", "no such file"}}},
      {"a plugin of another ABI",
       {Json::array({plugin_path("plugin_wrong_abi")}), {"plugins[0]", "plugin ABI 999"}}},
  };
  for (const auto& [what, b] : bad) {
    INFO(what);
    c["plugins"] = b.first;
    write_text(cfg, c.dump(2));
    const ProcResult e = attnbench(dir, {"run", cfg, "--out", dir.file("bad")});
    CHECK(e.code == 2);
    for (const std::string& s : b.second) CHECK_THAT(e.err, Contains(s));
    CHECK_FALSE(fs::exists(dir.path() / "bad" / "results.jsonl"));
  }
}

TEST_CASE("plugins: ATTNBENCH_PLUGINS loads each listed plugin and refuses a bad entry", "[plugin]") {
  ScratchDir dir("plugins");
  const std::string good = plugin_path("plugin_good"), hostile = plugin_path("plugin_hostile");
  const ProcResult l = attnbench(dir, {"list"}, good + "::" + hostile);  // empty entries are skipped
  CHECK(l.code == 0);
  for (const char* v : {"plugin_good_exact: ", "plugin_throws: ", "plugin_nan: ", "plugin_oob: "})
    CHECK_THAT(l.out, Contains(v));
  const ProcResult without = attnbench(dir, {"list"});
  CHECK(without.code == 0);
  CHECK_THAT(without.out, !Contains("plugin_good_exact"));
  const ProcResult e = attnbench(dir, {"list"}, good + ":" + plugin_path("plugin_not_a_plugin"));
  CHECK(e.code == 2);
  CHECK_THAT(e.err, Contains("ATTNBENCH_PLUGINS '" + plugin_path("plugin_not_a_plugin") + "'"));
  CHECK_THAT(e.err, Contains("not an attnbench plugin"));
}

TEST_CASE("plugins: attnbench_gbench --plugin registers the plugin's benchmarks", "[plugin]") {
#ifndef ATTNBENCH_GBENCH_EXE
  SUCCEED("this build has no attnbench_gbench (sanitizer builds): nothing to test");
#else
  ScratchDir dir("plugins");
  Json c = tiny_config({"naive", "plugin_good_exact"}, {32});
  const std::string cfg = dir.write("gbench.json", c.dump(2));
  ::unsetenv("ATTNBENCH_PLUGINS");
  const ProcOptions opt{dir.path(), std::nullopt};
  const ProcResult r = run_process(
      ATTNBENCH_GBENCH_EXE,
      {"--config=" + cfg, "--plugin", plugin_path("plugin_good"), "--benchmark_list_tests=true"}, opt);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("\nplugin_good_exact") || Catch::Matchers::StartsWith("plugin_good_exact"));
  CHECK_THAT(r.out, Contains("naive"));
  // Without the plugin the config names an unknown variant.
  const ProcResult e =
      run_process(ATTNBENCH_GBENCH_EXE, {"--config=" + cfg, "--benchmark_list_tests=true"}, opt);
  CHECK(e.code == 2);
  CHECK_THAT(e.err, Contains("plugin_good_exact"));
#endif
}

TEST_CASE("plugins: guarded output buffers keep the alignment and start zeroed and count writes outside",
          "[plugin]") {
  GuardedArray a("dK", 37);
  REQUIRE(a.ptr() != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(a.ptr()) % kAlignment == 0);
  CHECK(a.numel() == 37);
  for (std::size_t i = 0; i < a.numel(); ++i) CHECK(a.ptr()[i] == 0.0f);
  for (std::size_t i = 0; i < a.numel(); ++i) a.ptr()[i] = std::nanf("");  // inside: never reported
  CHECK(a.outside_note().empty());
  CHECK(outside_writes({&a}).empty());
#ifdef ATTN_GUARDED_ASAN
  // Under ASan the guards are poisoned (a write there is reported where it happens), the buffer is not.
  CHECK(__asan_address_is_poisoned(a.ptr() - 1));
  CHECK(__asan_address_is_poisoned(a.ptr() - GuardedArray::kGuardFloats));
  CHECK(__asan_address_is_poisoned(a.ptr() + a.numel()));
  // The trailing guard's last float is poisoned only when it ends an 8-byte granule (ASan cannot poison the
  // start of a granule whose end stays addressable); 37 floats leave it mid-granule, so check the float
  // before it. Past the vector's end is the allocator's redzone.
  CHECK(__asan_address_is_poisoned(a.ptr() + a.numel() + GuardedArray::kGuardFloats - 2));
  CHECK_FALSE(__asan_address_is_poisoned(a.ptr()));
  CHECK_FALSE(__asan_address_is_poisoned(a.ptr() + a.numel() - 1));
#else
  a.ptr()[a.numel()] = 1.0f;
  CHECK(outside_writes({&a}) == "wrote outside its output dK: 1 float after its end");
  a.ptr()[-1] = 0.0f, a.ptr()[-64] = 0.0f, a.ptr()[a.numel() + 63] = -1.0f;
  CHECK(a.outside().before == 2);
  CHECK(a.outside().after == 2);
  GuardedArray b("dV", 16);
  b.ptr()[-3] = 7.0f;
  CHECK(outside_writes({&a, &b}) ==
        "wrote outside its output dK: 2 floats before its start and 2 floats after its end; "
        "wrote outside its output dV: 1 float before its start");
  // A move keeps the buffer (and what was written around it).
  GuardedArray moved = std::move(b);
  CHECK(moved.outside_note() == "dV: 1 float before its start");
#endif
}

TEST_CASE("plugins: under AddressSanitizer a write past the output stops at the write", "[plugin][asan]") {
  if (!kAsanBuild) {
    SUCCEED("not an AddressSanitizer build: the guard check covers plugin_oob (the sweep test above)");
    return;
  }
  ScratchDir dir("plugins");
  const std::string hostile = plugin_path("plugin_hostile");
  // eval: O is an exact multiple of 64 bytes (no slack after it), so the stray float is out of bounds.
  AttentionCase c(make_test_problem("naive", 1, 2, 8, 8, 16), 3);
  const CaseFiles f = c.write_files(dir);
  const ProcResult e = attnbench(dir, {"--plugin", hostile, "eval", "--variant", "plugin_oob", "--q", f.q,
                                       "--k", f.k, "--v", f.v, "--out", dir.file("o.npy")});
  CHECK(e.code != 0);
  CHECK_THAT(e.err, Contains("AddressSanitizer"));
  // The sweep's checked call: the write lands in the poisoned guard after O (bench/lib/guarded.hpp).
  const std::string cfg = dir.write("oob.json", tiny_config({"plugin_oob"}, {32}).dump(2));
  const ProcResult r = attnbench(dir, {"--plugin", hostile, "run", cfg, "--out", dir.file("out")});
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Contains("AddressSanitizer"));
  CHECK_THAT(r.err,
             Contains("plugin_hostile"));  // the faulting frame (library or source file, as symbolized)
}
