// The result row (bench/lib/result_row.hpp) against its committed fixture: the writer reproduces the fixture
// byte for byte, the reader reads it back to the same row, every documented field is in the JSON and every
// JSON field is documented, configs/README.md holds the generated field table, and bad rows are refused
// with the field named.
#include <catch2/catch.hpp>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "bench/lib/result_row.hpp"
#include "bench/lib/store.hpp"
#include "common/io/npy.hpp"
#include "common/support/error.hpp"

using namespace attn;
using Catch::Matchers::Contains;

namespace {

std::set<std::string> leaf_paths(const Json& j, const std::string& prefix = "") {
  std::set<std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string k = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it.value().is_object() && it.key() != "params" && it.key() != "data") {  // objects held whole
      const auto sub = leaf_paths(it.value(), k);
      out.insert(sub.begin(), sub.end());
    } else {
      out.insert(k);
    }
  }
  return out;
}

const std::string kFixture = std::string(ATTN_SOURCE_DIR) + "/tests/data/result_row.json";

}  // namespace

TEST_CASE("result row: the fixture round-trips byte for byte and every field is documented", "[row]") {
  // The fixture holds rows as `attnbench run` writes them: ok, skipped, failed, and non-finite metrics.
  const Json fixture = Json::parse(read_file_bytes(kFixture));
  REQUIRE(fixture.is_array());
  REQUIRE(fixture.size() >= 3);
  // Sweep rows hold every field but attnbench_mpi's ring figures (ring_only) and the quality harness's task
  // block (task_only).
  std::set<std::string> documented;
  for (const RowField& f : row_fields())
    if (!f.ring_only && !f.task_only) documented.insert(f.path);
  for (std::size_t i = 0; i < fixture.size(); ++i) {
    INFO("fixture row " << i);
    const ResultRow row = row_from_json(fixture[i], "fixture");
    CHECK(to_json(row).dump() == fixture[i].dump());
    CHECK(to_json(row_from_json(to_json(row), "again")).dump() == fixture[i].dump());
    CHECK(leaf_paths(fixture[i]) == documented);
  }
  // A default row has every field too (null until measured).
  CHECK(leaf_paths(to_json(ResultRow{})) == documented);
}

TEST_CASE("result row: scripts/plotlib/row_schema.json is the declaration the Python side reads", "[row]") {
  const Json schema =
      Json::parse(read_file_bytes(std::string(ATTN_SOURCE_DIR) + "/scripts/plotlib/row_schema.json"));
  INFO("regenerate it with `attnbench info --row-fields --json > scripts/plotlib/row_schema.json`");
  REQUIRE(schema.is_array());
  REQUIRE(schema.size() == row_fields().size());
  for (std::size_t i = 0; i < schema.size(); ++i) {
    const RowField& f = row_fields()[i];
    CHECK(schema[i].at("field") == f.path);
    CHECK(schema[i].at("type") == f.type);
    CHECK(schema[i].at("unit") == f.unit);
    CHECK(schema[i].at("meaning") == f.meaning);
    CHECK(schema[i].at("ring_only") == f.ring_only);
    CHECK(schema[i].at("task_only") == f.task_only);
  }
}

TEST_CASE("result row: configs/README.md holds the table generated from row_fields()", "[row]") {
  const std::string readme = read_file_bytes(std::string(ATTN_SOURCE_DIR) + "/configs/README.md");
  INFO("regenerate the table with `attnbench info --row-fields`");
  CHECK_THAT(readme, Contains(row_fields_markdown()));
}

TEST_CASE("result row: a quality row's task block round-trips, only its rows have it, and the CSV adds it",
          "[row]") {
  ResultRow row = row_from_json(Json::parse(read_file_bytes(kFixture))[0], "fixture");
  CHECK_FALSE(to_json(row).contains("task"));
  CHECK(results_csv({row}).find("task.") == std::string::npos);
  row.task.emplace();
  row.task->name = "mqar";
  row.task->size = 8, row.task->seq_len = 128, row.task->vocab = 512, row.task->d_model = 64;
  row.task->layers = 2, row.task->seed = 3, row.task->steps = 1900, row.task->short_conv = true;
  row.task->lr = 1e-3, row.task->train_s = 240.5, row.task->converged = true,
  row.task->stop = "stop_accuracy";
  row.task->best_accuracy = 0.995, row.task->loss = std::numeric_limits<double>::infinity();
  row.task->curve = Json::array({{{"step", 100}, {"loss", 2.5}, {"accuracy", 0.1}}});
  const Json j = to_json(row);
  std::set<std::string> task_fields;
  for (const RowField& f : row_fields())
    if (f.task_only) task_fields.insert(f.path);
  std::set<std::string> written;
  for (const std::string& path : leaf_paths(j["task"], "task")) written.insert(path);
  CHECK(written == task_fields);
  CHECK(j["task"]["setting"].is_null());
  CHECK(j["task"]["loss"] == "inf");
  CHECK(to_json(row_from_json(j, "again")).dump() == j.dump());
  const std::string csv = results_csv({row});
  CHECK_THAT(csv.substr(0, csv.find('\n')), Contains("task.best_accuracy"));
  Json bad = j;
  bad["task"]["steps"] = "many";
  CHECK_THROWS_WITH(row_from_json(bad, "x"), Contains("field 'task.steps': must be an integer"));
  bad = j;
  bad["task"].erase("name");
  CHECK_THROWS_WITH(row_from_json(bad, "x"), Contains("field 'task.name': missing"));
}

TEST_CASE("result row: the reader names the field of a bad row", "[row]") {
  const Json good = Json::parse(read_file_bytes(kFixture))[0];
  Json j = good;
  j.erase("id");
  CHECK_THROWS_WITH(row_from_json(j, "line 3"), Contains("line 3: field 'id': missing"));
  j = good;
  j["time_ms"]["median"] = "fast";
  CHECK_THROWS_WITH(row_from_json(j, "x"), Contains("field 'time_ms.median': must be a number, null"));
  j = good;
  j["status"] = "great";
  CHECK_THROWS_WITH(row_from_json(j, "x"), Contains("field 'status': must be ok, skipped or failed"));
  j = good;
  j["memory"]["inputs_bytes"] = -1;
  CHECK_THROWS_AS(row_from_json(j, "x"), UsageError);
  CHECK_THROWS_WITH(row_from_json(Json::array(), "x"), Contains("must be a JSON object"));
  // Non-finite metrics travel as strings and come back non-finite.
  j = good;
  j["accuracy"]["max_abs_err"] = "inf";
  j["accuracy"]["mean_cosine"] = "nan";
  const ResultRow r = row_from_json(j, "x");
  CHECK(std::isinf(*r.accuracy.max_abs_err));
  CHECK(std::isnan(*r.accuracy.mean_cosine));
  CHECK(to_json(r)["accuracy"]["max_abs_err"] == "inf");
}

TEST_CASE("result row: kv_heads, bytes, gbytes_per_s and frac_bandwidth round-trip, and older rows read",
          "[row][gqa]") {
  const Json fixture = Json::parse(read_file_bytes(kFixture));
  // The fixture's grouped-query row keeps its K/V head count and traffic.
  bool found_gqa = false;
  for (const Json& j : fixture) {
    const ResultRow r = row_from_json(j, "fixture");
    if (r.kv_heads != r.heads) {
      found_gqa = true;
      CHECK(r.kv_heads == 2);
      CHECK(r.mask == "causal_lower_right");
      REQUIRE(r.bytes);
      REQUIRE(r.gbytes_per_s);
      CHECK(*r.gbytes_per_s == Approx(*r.bytes / (*r.time_ms.median * 1e6)));
      REQUIRE(r.frac_bandwidth);
      CHECK(*r.frac_bandwidth > 0);
    }
  }
  CHECK(found_gqa);
  // A row written before the fields existed: kv_heads is heads, the bandwidth fields null.
  Json old = fixture[0];
  for (const char* k : {"kv_heads", "bytes", "gbytes_per_s", "frac_bandwidth"}) old.erase(k);
  const ResultRow r = row_from_json(old, "old row");
  CHECK(r.kv_heads == r.heads);
  CHECK(!r.bytes);
  CHECK(!r.gbytes_per_s);
  CHECK(!r.frac_bandwidth);
  const Json again = to_json(r);
  CHECK(again["kv_heads"] == r.heads);
  CHECK(again["bytes"].is_null());
  CHECK(again["frac_bandwidth"].is_null());
  // Wrong types name the field.
  Json bad = fixture[0];
  bad["kv_heads"] = "two";
  CHECK_THROWS_WITH(row_from_json(bad, "x"), Contains("field 'kv_heads': must be an integer or null"));
  bad = fixture[0];
  bad["bytes"] = true;
  CHECK_THROWS_WITH(row_from_json(bad, "x"), Contains("field 'bytes': must be a number, null"));
}
