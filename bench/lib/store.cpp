// The results folder: meta.json, results.jsonl, results.csv, --resume and --force.
#include "bench/lib/store.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "bench/lib/sysinfo.hpp"
#include "common/interface/attention.hpp"
#include "common/interface/plugin_loader.hpp"
#include "common/io/npy.hpp"
#include "common/support/error.hpp"

namespace fs = std::filesystem;

namespace attn {
namespace {

// Files other tools derive from a folder's rows (scripts/plot.py: plots/, REPORT.md, summary.json;
// scripts/peers: results.peers.jsonl; `attnbench mla --sweep`: results.mla.jsonl; `attnbench patterns`:
// patterns/). They describe the results being replaced, so a fresh or --force run removes them with the rows.
const char* const kDerivedFiles[] = {"results.peers.jsonl", "results.mla.jsonl", "REPORT.md", "summary.json"};
const char* const kDerivedFolders[] = {"plots", "patterns"};

std::string csv_field(const Json& v) {
  std::string s = v.is_string() ? v.get<std::string>() : v.is_null() ? "" : v.dump();
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::string ResultStore::jsonl_path() const {
  return (fs::path(dir_) / "results.jsonl").string();
}
std::string ResultStore::meta_path() const {
  return (fs::path(dir_) / "meta.json").string();
}
std::string ResultStore::csv_path() const {
  return (fs::path(dir_) / "results.csv").string();
}

ResultStore::ResultStore(std::string dir, Mode mode, const SweepConfig& config, const Identity& id,
                         Json machine_meta)
    : dir_(std::move(dir)) {
  const fs::path d = dir_;
  const bool has_results = fs::exists(d / "results.jsonl") || fs::exists(d / "meta.json");
  if (mode == Mode::resume) {
    if (!fs::exists(d / "meta.json"))
      throw UsageError("--resume: '" + d.string() +
                       "' holds no interrupted sweep (no meta.json); run without --resume");
    Json old;
    try {
      old = Json::parse(read_file_bytes(meta_path()));
    } catch (const Json::exception& e) {
      throw UsageError("--resume: '" + meta_path() + "' is not valid JSON (" + e.what() + ")");
    }
    if (old.value("config_hash", "") != id.config_hash)
      throw UsageError("--resume: the config changed since the interrupted run in '" + d.string() +
                       "' (hash " + old.value("config_hash", "?") + " then, " + id.config_hash +
                       " now); rerun without --resume (and --force) or use another --out");
    if (const std::string was = old.value("isa_option", "best"); was != id.isa_option)
      throw UsageError("--resume: the interrupted run in '" + d.string() + "' ran with --isa " + was +
                       ", this one with --isa " + id.isa_option + "; resume with --isa " + was +
                       " (or rerun with --force or another --out)");
    meta_ = old;
    if (fs::exists(d / "results.jsonl")) existing_ = read_results_jsonl(jsonl_path(), true);
    meta_["resumed_at"].push_back(now_iso8601());
    // A folder from before plugins: the plugins of this run (rows record their own in `plugin`).
    if (!meta_.contains("plugins")) meta_["plugins"] = plugins_json();
    if (!meta_.contains("registry")) meta_["registry"] = Registry::instance().names();
  } else {
    if (has_results && mode != Mode::force)
      throw UsageError(
          "output folder '" + d.string() +
          "' already holds results; use --resume to finish them, --force to replace them, or --out");
    fs::create_directories(d);
    for (const char* f : {"results.jsonl", "results.csv", "meta.json"}) fs::remove(d / f);
    remove_derived_files(dir_);
    meta_ = {
        {"config_name", config.name}, {"config_path", config.source_path}, {"config_hash", id.config_hash},
        {"config", config.raw},       {"isa_option", id.isa_option},       {"start_time", now_iso8601()},
        {"end_time", nullptr}};
    // The registry's exact baseline, so readers (plots, REPORT.md) need not know a variant's name.
    meta_["baseline"] = Registry::instance().baseline().name();
    // The plugins loaded (--plugin, ATTNBENCH_PLUGINS, the config's "plugins"): path, hash, ABI, variants.
    meta_["plugins"] = plugins_json();
    // Every registered variant's name in the registry's order (plugins' included): the plots give each its
    // own colour and marker from its place here, the same in every figure.
    meta_["registry"] = Registry::instance().names();
    meta_.update(machine_meta);
    // meta.json (with the config hash) exists before results.jsonl, so a kill at any later moment leaves a
    // folder that --resume accepts.
    save_meta();
  }
  jsonl_.open(jsonl_path(), std::ios::app);
  if (!jsonl_) throw UsageError("cannot open '" + jsonl_path() + "' for appending");
  jsonl_fd_ = ::open(jsonl_path().c_str(), O_RDONLY);
}

ResultStore::~ResultStore() {
  if (jsonl_fd_ >= 0) ::close(jsonl_fd_);
}

void ResultStore::save_meta() {
  write_file_atomic(meta_path(), meta_.dump(2) + "\n");
}

void ResultStore::append(ResultRow& row, const Json& extra) {
  row.timestamp = now_iso8601();
  Json j = to_json(row);
  if (extra.is_object()) j.update(extra);
  jsonl_ << j.dump() << "\n";
  jsonl_.flush();
  if (!jsonl_) throw std::runtime_error("writing '" + jsonl_path() + "' failed");
  if (jsonl_fd_ >= 0) ::fsync(jsonl_fd_);
}

void ResultStore::finish(bool interrupted) {
  jsonl_.close();
  if (jsonl_fd_ >= 0) ::close(jsonl_fd_);
  jsonl_fd_ = -1;
  const std::vector<ResultRow> rows = read_results_jsonl(jsonl_path(), false);
  write_file_atomic(csv_path(), results_csv(rows));
  meta_["end_time"] = now_iso8601();
  meta_["interrupted"] = interrupted;
  meta_["rows"] = rows.size();
  save_meta();
}

void remove_derived_files(const std::string& dir) {
  const fs::path d = dir;
  for (const char* f : kDerivedFiles) fs::remove(d / f);
  for (const char* f : kDerivedFolders) fs::remove_all(d / f);
}

std::vector<ResultRow> read_results_jsonl(const std::string& path, bool repair) {
  std::vector<ResultRow> rows;
  const std::string text = read_file_bytes(path);
  std::size_t pos = 0, line_no = 0, good_end = 0;
  while (pos < text.size()) {
    const std::size_t nl = text.find('\n', pos);
    const bool last = nl == std::string::npos;
    const std::string line = text.substr(pos, last ? std::string::npos : nl - pos);
    ++line_no;
    const std::string where = "file '" + path + "': line " + std::to_string(line_no);
    Json j;
    bool ok = !last;  // a line without its newline was cut mid-write
    if (ok) {
      try {
        j = Json::parse(line);
        ok = j.is_object() && j.contains("id") && j.contains("status");
      } catch (const Json::exception&) {
        ok = false;
      }
    }
    if (!ok) {
      const bool is_tail = last || text.find_first_not_of(" \n", nl + 1) == std::string::npos;
      if (!is_tail) throw UsageError(where + " is not a result row");
      break;  // torn tail: dropped (and cut below), that point is measured again
    }
    rows.push_back(row_from_json(j, where));  // a row with a wrong-typed field is an error naming it
    pos = nl + 1;
    good_end = pos;
  }
  if (repair && good_end < text.size()) fs::resize_file(path, good_end);
  // Keep the last row per id (a point measured again after a torn write appears once).
  std::map<std::string, std::size_t> last_index;
  for (std::size_t i = 0; i < rows.size(); ++i) last_index[rows[i].id] = i;
  std::vector<ResultRow> unique;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (last_index[rows[i].id] == i) unique.push_back(rows[i]);
  return unique;
}

std::string results_csv(const std::vector<ResultRow>& rows) {
  // The columns are the declared fields in their order (row_fields()); the ring's and the task's only when a
  // row has them. Arrays and objects (time_ms.samples, params, ring, task.curve) go in one cell as JSON text.
  bool ring = false, task = false;
  for (const ResultRow& r : rows) ring = ring || r.ring.has_value(), task = task || r.task.has_value();
  std::vector<std::string> columns;
  for (const RowField& f : row_fields())
    if ((!f.ring_only || ring) && (!f.task_only || task)) columns.push_back(f.path);
  std::ostringstream out;
  for (std::size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << csv_field(columns[c]);
  out << "\n";
  for (const ResultRow& r : rows) {
    const Json j = to_json(r);
    for (std::size_t c = 0; c < columns.size(); ++c) {
      std::string pointer = "/" + columns[c];
      std::replace(pointer.begin(), pointer.end(), '.', '/');
      const Json::json_pointer at(pointer);
      out << (c ? "," : "") << (j.contains(at) ? csv_field(j.at(at)) : "");
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace attn
