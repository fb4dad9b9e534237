// The statistics and the comparison of two results folders behind `attnbench compare` (compare.hpp).
#include "bench/lib/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "bench/lib/store.hpp"
#include "common/interface/util.hpp"
#include "common/io/npy.hpp"
#include "common/support/error.hpp"

namespace fs = std::filesystem;

namespace attn {
namespace {

// meta.json keys measured anew by every run (or stamped with its time): they differ between any two runs,
// so the header leaves them out. The config is compared through config_hash and its top-level keys.
const char* const kMetaNotCompared[] = {"start_time", "end_time",        "resumed_at",   "interrupted",
                                        "rows",       "config",          "calibrations", "sgemm_calibration",
                                        "fma_peak",   "memory_bandwidth"};

std::string fmt(double x, const char* spec) {
  if (!std::isfinite(x)) return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, x);
  return buf;
}
std::string fmt(const std::optional<double>& x, const char* spec) {
  return x ? fmt(*x, spec) : "—";
}

Json opt_json(const std::optional<double>& x) {
  return x ? json_number(*x) : Json(nullptr);
}

// A meta.json value at a dotted path (null when any part is missing).
Json meta_at(const Json& meta, const std::string& path) {
  const Json* cur = &meta;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (!cur->is_object() || !cur->contains(part)) return nullptr;
    cur = &(*cur)[part];
  }
  return *cur;
}
std::string meta_text(const Json& meta, const std::string& path) {
  const Json v = meta_at(meta, path);
  return v.is_null() ? "" : v.is_string() ? v.get<std::string>() : v.dump();
}

// Leaves of meta.json by dotted path. Objects are walked; the doctor's findings become doctor.<check> =
// "status: observed"; other arrays are compared whole.
void flatten_meta(const Json& j, const std::string& prefix, std::map<std::string, Json>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (prefix.empty() && std::find(std::begin(kMetaNotCompared), std::end(kMetaNotCompared), it.key()) !=
                              std::end(kMetaNotCompared))
      continue;
    const Json& v = it.value();
    if (v.is_object() && !v.empty()) {
      flatten_meta(v, key, out);
    } else if (key == "doctor" && v.is_array()) {
      for (const Json& f : v)
        if (f.is_object() && f.contains("check"))
          out["doctor." + meta_text(f, "check")] = meta_text(f, "status") + ": " + meta_text(f, "observed");
    } else {
      out[key] = v;
    }
  }
}

// The sorted distinct non-empty values of a field over the ok rows, joined ("avx2, avx3"); "" when none
// (rows from before the field read as "").
template <class Get>
std::string ok_row_values(const std::vector<ResultRow>& rows, Get get) {
  std::set<std::string> values;
  for (const ResultRow& r : rows)
    if (r.status == "ok" && !get(r).empty()) values.insert(get(r));
  return join(std::vector<std::string>(values.begin(), values.end()));
}

// The match key of every row (compare_results): the id, without the ",isa=NAME" a run-wide --isa NAME
// appended to every id of a folder whose config has no sweep.isa. Ids as they are if that would make two
// rows share a key.
std::vector<std::string> match_keys(const ResultsFolder& f) {
  std::vector<std::string> keys;
  for (const ResultRow& r : f.rows) keys.push_back(r.id);
  const Json sweep = meta_at(f.meta, "config.sweep");
  const std::string isa_option = meta_text(f.meta, "isa_option");
  if ((sweep.is_object() && sweep.contains("isa")) || isa_option.empty() || isa_option == "best") return keys;
  const std::string suffix = ",isa=" + isa_option;
  std::vector<std::string> stripped = keys;
  for (std::string& k : stripped)
    if (k.size() > suffix.size() && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0)
      k.resize(k.size() - suffix.size());
  const std::set<std::string> unique(stripped.begin(), stripped.end());
  return unique.size() == stripped.size() ? stripped : keys;
}

std::optional<double> median_of(const TimingSummary& t) {
  if (t.median) return t.median;
  if (!t.samples.empty()) return percentile_linear(t.samples, 0.5);
  return std::nullopt;
}

std::optional<TaskOutcome> task_outcome(const ResultRow& r) {
  if (!r.task) return std::nullopt;
  return TaskOutcome{r.task->best_accuracy, r.task->best_loss, r.task->steps, r.task->converged};
}

Json task_json(const std::optional<TaskOutcome>& t) {
  if (!t) return nullptr;
  return {{"accuracy", opt_json(t->accuracy)},
          {"loss", opt_json(t->loss)},
          {"steps", t->steps},
          {"converged", t->converged}};
}

PointComparison compare_point(const std::string& key, const ResultRow& a, const ResultRow& b) {
  PointComparison p;
  p.id = key, p.id_a = a.id, p.id_b = b.id;
  p.variant = a.variant;
  p.isa_a = a.isa, p.isa_b = b.isa;
  p.threads_a = a.threads, p.threads_b = b.threads;
  p.median_a = median_of(a.time_ms), p.median_b = median_of(b.time_ms);
  if (p.median_a && p.median_b && *p.median_a > 0) p.ratio = *p.median_b / *p.median_a;
  const std::vector<double>&sa = a.time_ms.samples, &sb = b.time_ms.samples;
  p.reps_a = static_cast<int>(sa.size()), p.reps_b = static_cast<int>(sb.size());
  if (sa.empty() || sb.empty()) {
    p.notes.push_back(std::string(sa.empty() && sb.empty() ? "A and B have"
                                  : sa.empty()             ? "A has"
                                                           : "B has") +
                      " no time_ms.samples (results from before they were recorded): no p-value");
  } else if (sa.size() < 2 || sb.size() < 2) {
    p.notes.push_back("fewer than 2 repetitions (A " + std::to_string(sa.size()) + ", B " +
                      std::to_string(sb.size()) + "): no p-value");
  } else {
    const MannWhitney mw = mann_whitney_u(sa, sb);
    p.u = mw.u, p.p_value = mw.p_value;
    p.p_method = mw.exact ? "exact" : "normal";
  }
  // The spread of the ratio: every pairing of a repetition of A with one of B, b_j / a_i.
  const auto finite_and = [](const std::vector<double>& v, auto pred) {
    return !v.empty() &&
           std::all_of(v.begin(), v.end(), [&](double x) { return std::isfinite(x) && pred(x); });
  };
  if (finite_and(sa, [](double x) { return x > 0; }) && finite_and(sb, [](double x) { return x >= 0; })) {
    p.ratio_p10 = pairwise_ratio_percentile(sa, sb, 0.1);
    p.ratio_p90 = pairwise_ratio_percentile(sa, sb, 0.9);
  }
  if (!p.p_value)
    p.verdict = "no p-value";
  else if (!p.significant())
    p.verdict = "not significant";
  else
    p.verdict = !p.ratio || *p.ratio == 1 ? "different" : *p.ratio > 1 ? "slower" : "faster";
  p.noisy_a = a.noisy, p.noisy_b = b.noisy;
  if (a.noisy || b.noisy)
    p.notes.push_back(std::string("noisy in ") +
                      (a.noisy && b.noisy ? "A and B"
                       : a.noisy          ? "A"
                                          : "B") +
                      " (interference above measure.max_interference)");
  p.max_abs_err_a = a.accuracy.max_abs_err, p.max_abs_err_b = b.accuracy.max_abs_err;
  if (p.max_abs_err_a && p.max_abs_err_b) p.max_abs_err_diff = *p.max_abs_err_b - *p.max_abs_err_a;
  p.task_a = task_outcome(a), p.task_b = task_outcome(b);
  if (a.isa != b.isa) p.notes.push_back("isa " + a.isa + " -> " + b.isa);
  return p;
}

Json side_summary(const ResultsFolder& f) {
  int ok = 0;
  for (const ResultRow& r : f.rows) ok += r.status == "ok";
  return {{"dir", f.dir},
          {"config_name", meta_at(f.meta, "config_name")},
          {"config_hash", meta_at(f.meta, "config_hash")},
          {"git_commit", meta_at(f.meta, "system.git_commit")},
          {"cpu_model", meta_at(f.meta, "system.cpu_model")},
          {"isa_option", meta_at(f.meta, "isa_option")},
          {"start_time", meta_at(f.meta, "start_time")},
          {"end_time", meta_at(f.meta, "end_time")},
          {"rows", f.rows.size()},
          {"rows_ok", ok}};
}

std::string cell(const Json& v) {
  std::string s = v.is_null() ? "(absent)" : v.is_string() ? v.get<std::string>() : v.dump();
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : c == '\n' ? std::string(" ") : std::string(1, c);
  return out;
}

std::string abbreviated(const std::string& s, std::size_t max_chars = 60) {
  return s.size() <= max_chars ? s : s.substr(0, max_chars) + "…";
}

}  // namespace

std::string mla_row_id(const Json& j) {
  std::string form = j.at("form").get<std::string>();
  if (form == "gqa")
    form += "(kv=" + std::to_string(j.at("gqa").at("kv_heads").get<int64_t>()) +
            ",D=" + std::to_string(j.at("gqa").at("head_dim").get<int64_t>()) + ")";
  std::string preset;
  if (j.at("preset").is_string()) {
    preset = j.at("preset").get<std::string>();
  } else {
    for (auto it = j.at("shape").begin(); it != j.at("shape").end(); ++it)
      preset += (preset.empty() ? "" : ",") + it.key() + "=" + it.value().dump();
  }
  return "mla/" + form + ":" + preset + ",B=" + std::to_string(j.at("batch").get<int64_t>()) +
         ",T=" + std::to_string(j.at("context").get<int64_t>()) +
         ",new=" + std::to_string(j.at("new_tokens").get<int64_t>()) +
         ",core=" + j.at("variant").get<std::string>() +
         ",threads=" + std::to_string(j.at("threads").get<int>());
}

namespace {
// A row of results.mla.jsonl (`attnbench mla --sweep`, cli_mla.cpp) as a row compare can match: its
// mla_row_id, its timing and the SIMD target its FMA peak ran on. UsageError naming file:line for a line
// that is not such a row.
ResultRow mla_row(const Json& j, const std::string& where) {
  const auto fail = [&](const std::string& why) {
    return UsageError(where + ": " + why + " (a row of `attnbench mla --sweep`: docs/cli.md)");
  };
  if (!j.is_object() || !j.contains("kind") || j["kind"] != "mla")
    throw fail("not a JSON object with \"kind\": \"mla\"");
  ResultRow r;
  try {
    r.id = mla_row_id(j);
    r.variant = r.id.substr(0, r.id.find(':'));
    r.threads = j.at("threads").get<int>();
    r.isa = j.at("fma_peak").at("isa").get<std::string>();
    r.time_ms.median = j.at("median_ms").get<double>();
    r.time_ms.samples = j.at("samples_ms").get<std::vector<double>>();
    r.time_ms.reps = static_cast<int>(r.time_ms.samples.size());
  } catch (const Json::exception& e) {
    throw fail(std::string("a field is missing or of the wrong type (") + e.what() + ")");
  }
  r.status = "ok";
  return r;
}

// The rows of the files beside results.jsonl that hold timed points: the PyTorch peers' (result rows
// themselves) and the MLA layer rows (mla_row). Blank lines are skipped; any other bad line is an error.
void read_derived_rows(const std::string& dir, std::vector<ResultRow>& rows) {
  std::error_code ec;
  const std::string peers = (fs::path(dir) / "results.peers.jsonl").string();
  if (fs::is_regular_file(peers, ec))
    for (ResultRow& r : read_results_jsonl(peers, /*repair=*/false)) rows.push_back(std::move(r));
  const std::string mla = (fs::path(dir) / "results.mla.jsonl").string();
  if (!fs::is_regular_file(mla, ec)) return;
  std::istringstream in(read_file_bytes(mla));
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "file '" + mla + "' line " + std::to_string(n);
    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::exception& e) {
      throw UsageError(where + ": not valid JSON (" + e.what() + ")");
    }
    rows.push_back(mla_row(j, where));
  }
}
}  // namespace

ResultsFolder load_results_folder(const std::string& dir, const std::string& label) {
  const std::string what = "results folder " + label + " '" + dir + "'";
  const std::string expected = " (give a folder written by `attnbench run`: meta.json and results.jsonl)";
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw UsageError("compare: " + what + " does not exist" + expected);
  if (!fs::is_directory(dir, ec)) throw UsageError("compare: " + what + " is not a folder" + expected);
  ResultsFolder f;
  f.dir = dir, f.label = label;
  const std::string meta_path = (fs::path(dir) / "meta.json").string();
  const std::string jsonl_path = (fs::path(dir) / "results.jsonl").string();
  if (!fs::is_regular_file(jsonl_path, ec))
    throw UsageError("compare: " + what + " has no results.jsonl" + expected);
  if (!fs::is_regular_file(meta_path, ec))
    throw UsageError("compare: " + what + " has no meta.json" + expected);
  try {
    f.meta = Json::parse(read_file_bytes(meta_path));
  } catch (const Json::exception& e) {
    throw UsageError("file '" + meta_path + "' is not valid JSON (" + e.what() + ")");
  }
  if (!f.meta.is_object())
    throw UsageError("file '" + meta_path + "': must be a JSON object (meta.json of `attnbench run`), got " +
                     std::string(f.meta.type_name()));
  f.rows = read_results_jsonl(jsonl_path, /*repair=*/false);
  read_derived_rows(dir, f.rows);
  return f;
}

Comparison compare_results(const ResultsFolder& a, const ResultsFolder& b) {
  Comparison c;
  c.dir_a = a.dir, c.dir_b = b.dir;
  c.summary_a = side_summary(a), c.summary_b = side_summary(b);

  // The header: every meta.json leaf (less what each run measures anew), then what the rows ran on.
  std::map<std::string, Json> ma, mb;
  flatten_meta(a.meta, "", ma);
  flatten_meta(b.meta, "", mb);
  const auto row_isa = [](const ResultRow& r) { return r.isa; };
  const auto row_threads = [](const ResultRow& r) { return r.threads ? std::to_string(r.threads) : ""; };
  for (auto [f, m] : {std::pair{&a, &ma}, std::pair{&b, &mb}}) {
    if (const std::string isa = ok_row_values(f->rows, row_isa); !isa.empty()) (*m)["rows.isa"] = isa;
    if (const std::string t = ok_row_values(f->rows, row_threads); !t.empty()) (*m)["rows.threads"] = t;
  }
  std::set<std::string> fields;
  for (const auto& [k, v] : ma) fields.insert(k);
  for (const auto& [k, v] : mb) fields.insert(k);
  for (const std::string& k : fields) {
    const Json va = ma.count(k) ? ma[k] : Json(nullptr), vb = mb.count(k) ? mb[k] : Json(nullptr);
    (va == vb ? c.same : c.differences).push_back({k, va, vb});
  }
  for (const char* k : kMetaNotCompared)
    if (std::string(k) != "config" && (a.meta.contains(k) || b.meta.contains(k)))
      c.meta_not_compared.push_back(k);

  const Json ca = meta_at(a.meta, "config"), cb = meta_at(b.meta, "config");
  c.config_same = meta_at(a.meta, "config_hash") == meta_at(b.meta, "config_hash") && ca == cb;
  std::set<std::string> config_keys;
  for (const Json* cfg : {&ca, &cb})
    if (cfg->is_object())
      for (auto it = cfg->begin(); it != cfg->end(); ++it) config_keys.insert(it.key());
  const auto key_of = [](const Json& cfg, const std::string& k) {
    return cfg.is_object() && cfg.contains(k) ? cfg[k] : Json(nullptr);
  };
  for (const std::string& k : config_keys)
    if (key_of(ca, k) != key_of(cb, k)) c.config_keys_differ.push_back(k);

  // The points, in A's order, then B's rows A lacks in B's order.
  const std::vector<std::string> keys_a = match_keys(a), keys_b = match_keys(b);
  std::map<std::string, std::size_t> index_b;
  for (std::size_t i = 0; i < keys_b.size(); ++i) index_b[keys_b[i]] = i;
  std::set<std::string> matched;
  for (std::size_t i = 0; i < keys_a.size(); ++i) {
    const auto it = index_b.find(keys_a[i]);
    if (it == index_b.end()) {
      c.only_a.push_back(a.rows[i].id);
      continue;
    }
    matched.insert(keys_a[i]);
    const ResultRow &ra = a.rows[i], &rb = b.rows[it->second];
    if (ra.status != "ok" || rb.status != "ok")
      c.not_compared.push_back({keys_a[i], ra.status, rb.status, ra.reason, rb.reason});
    else
      c.points.push_back(compare_point(keys_a[i], ra, rb));
  }
  for (std::size_t i = 0; i < keys_b.size(); ++i)
    if (!matched.count(keys_b[i])) c.only_b.push_back(b.rows[i].id);
  return c;
}

double parse_fail_above(const std::string& text) {
  const std::string allowed =
      "a number greater than 1 (the B/A ratio of the medians above which a point that is significantly "
      "slower, p < 0.05, fails the run; e.g. 1.10 for 10%)";
  double r = 0;
  std::size_t used = 0;
  try {
    r = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || !std::isfinite(r))
    throw UsageError("--fail-above: expected " + allowed + ", got '" + text + "'");
  if (r <= 1) throw UsageError("--fail-above: must be " + allowed + ", got " + text);
  return r;
}

std::vector<const PointComparison*> regressions(const Comparison& c, double fail_above) {
  std::vector<const PointComparison*> out;
  for (const PointComparison& p : c.points)
    if (p.significant() && p.ratio && *p.ratio > fail_above) out.push_back(&p);
  return out;
}

Json comparison_json(const Comparison& c, std::optional<double> fail_above) {
  Json j;
  j["tool"] = "attnbench compare";
  j["alpha"] = kCompareAlpha;
  j["a"] = c.summary_a;
  j["b"] = c.summary_b;
  Json diff = Json::array(), same = Json::array();
  for (const MetaField& f : c.differences) diff.push_back({{"field", f.field}, {"a", f.a}, {"b", f.b}});
  for (const MetaField& f : c.same) same.push_back({{"field", f.field}, {"value", f.a}});
  j["header"] = {{"differences", diff},
                 {"same", same},
                 {"not_compared", c.meta_not_compared},
                 {"config",
                  {{"same", c.config_same},
                   {"hash_a", c.summary_a["config_hash"]},
                   {"hash_b", c.summary_b["config_hash"]},
                   {"keys_differ", c.config_keys_differ}}}};
  Json points = Json::array();
  std::map<std::string, int> verdicts;
  int noisy = 0;
  for (const PointComparison& p : c.points) {
    ++verdicts[p.verdict];
    noisy += p.noisy_a || p.noisy_b;
    points.push_back({{"id", p.id},
                      {"id_a", p.id_a},
                      {"id_b", p.id_b},
                      {"variant", p.variant},
                      {"isa_a", p.isa_a},
                      {"isa_b", p.isa_b},
                      {"threads_a", p.threads_a},
                      {"threads_b", p.threads_b},
                      {"median_a_ms", opt_json(p.median_a)},
                      {"median_b_ms", opt_json(p.median_b)},
                      {"ratio", opt_json(p.ratio)},
                      {"ratio_p10", opt_json(p.ratio_p10)},
                      {"ratio_p90", opt_json(p.ratio_p90)},
                      {"reps_a", p.reps_a},
                      {"reps_b", p.reps_b},
                      {"u", opt_json(p.u)},
                      {"p_value", opt_json(p.p_value)},
                      {"p_method", p.p_method.empty() ? Json(nullptr) : Json(p.p_method)},
                      {"significant", p.significant()},
                      {"verdict", p.verdict},
                      {"noisy_a", p.noisy_a},
                      {"noisy_b", p.noisy_b},
                      {"max_abs_err_a", opt_json(p.max_abs_err_a)},
                      {"max_abs_err_b", opt_json(p.max_abs_err_b)},
                      {"max_abs_err_diff", opt_json(p.max_abs_err_diff)},
                      {"task_a", task_json(p.task_a)},
                      {"task_b", task_json(p.task_b)},
                      {"notes", p.notes}});
  }
  j["points"] = points;
  j["only_a"] = c.only_a;
  j["only_b"] = c.only_b;
  Json nc = Json::array();
  for (const NotCompared& n : c.not_compared)
    nc.push_back({{"id", n.id},
                  {"status_a", n.status_a},
                  {"status_b", n.status_b},
                  {"reason_a", n.reason_a},
                  {"reason_b", n.reason_b}});
  j["not_compared"] = nc;
  j["summary"] = {{"compared", c.points.size()},
                  {"slower", verdicts["slower"]},
                  {"faster", verdicts["faster"]},
                  {"different", verdicts["different"]},
                  {"not_significant", verdicts["not significant"]},
                  {"no_p_value", verdicts["no p-value"]},
                  {"noisy", noisy},
                  {"only_a", c.only_a.size()},
                  {"only_b", c.only_b.size()},
                  {"not_compared", c.not_compared.size()}};
  if (fail_above) {
    Json tripped = Json::array();
    for (const PointComparison* p : regressions(c, *fail_above))
      tripped.push_back({{"id", p->id}, {"ratio", opt_json(p->ratio)}, {"p_value", opt_json(p->p_value)}});
    j["fail_above"] = {{"threshold", *fail_above}, {"tripped", tripped}};
  } else {
    j["fail_above"] = nullptr;
  }
  return j;
}

namespace {

// The header table of the two sides and what differs between them.
void markdown_sides(std::ostringstream& md, const Comparison& c) {
  const auto side = [](const Json& s, const char* key) { return cell(s.value(key, Json(nullptr))); };
  md << "# attnbench compare\n\n"
     << "| | A | B |\n| --- | --- | --- |\n"
     << "| folder | `" << side(c.summary_a, "dir") << "` | `" << side(c.summary_b, "dir") << "` |\n"
     << "| config | " << side(c.summary_a, "config_name") << " (" << side(c.summary_a, "config_hash")
     << ") | " << side(c.summary_b, "config_name") << " (" << side(c.summary_b, "config_hash") << ") |\n"
     << "| commit | " << side(c.summary_a, "git_commit") << " | " << side(c.summary_b, "git_commit") << " |\n"
     << "| CPU | " << side(c.summary_a, "cpu_model") << " | " << side(c.summary_b, "cpu_model") << " |\n"
     << "| `--isa` | " << side(c.summary_a, "isa_option") << " | " << side(c.summary_b, "isa_option")
     << " |\n"
     << "| rows (ok) | " << side(c.summary_a, "rows") << " (" << side(c.summary_a, "rows_ok") << ") | "
     << side(c.summary_b, "rows") << " (" << side(c.summary_b, "rows_ok") << ") |\n"
     << "| run | " << side(c.summary_a, "start_time") << " … " << side(c.summary_a, "end_time") << " | "
     << side(c.summary_b, "start_time") << " … " << side(c.summary_b, "end_time") << " |\n\n";

  md << "## What differs\n\n";
  if (c.differences.empty()) {
    md << "Nothing: meta.json and the rows' isa and threads agree.\n";
  } else {
    md << "| field | A | B |\n| --- | --- | --- |\n";
    for (const MetaField& f : c.differences)
      md << "| `" << f.field << "` | " << cell(f.a) << " | " << cell(f.b) << " |\n";
  }
  md << "\n";
  if (!c.meta_not_compared.empty())
    md << "Not compared (measured anew by every run): `" << join(c.meta_not_compared, "`, `") << "`.\n";
  md << "\n**Config:** ";
  if (c.config_same)
    md << "the same (hash " << side(c.summary_a, "config_hash") << ").\n\n";
  else
    md << "different (hash " << side(c.summary_a, "config_hash") << " vs " << side(c.summary_b, "config_hash")
       << "); top-level keys whose values differ: "
       << (c.config_keys_differ.empty() ? std::string("none (only the hash)")
                                        : "`" + join(c.config_keys_differ, "`, `") + "`")
       << ".\n\n";
  md << "**The same in both** (" << c.same.size() << "): ";
  for (std::size_t i = 0; i < c.same.size(); ++i)
    md << (i ? "; " : "") << "`" << c.same[i].field << "` = " << abbreviated(cell(c.same[i].a));
  md << "\n\n";
}

// Quality rows (ResultRow::task): what each side's training run learned, beside the step times above.
void markdown_tasks(std::ostringstream& md, const Comparison& c) {
  const bool any = std::any_of(c.points.begin(), c.points.end(), [](const PointComparison& p) {
    return p.task_a.has_value() || p.task_b.has_value();
  });
  if (!any) return;
  const auto side = [](const std::optional<TaskOutcome>& t, auto get) {
    return t ? get(*t) : std::string("—");
  };
  const auto acc = [](const TaskOutcome& t) { return fmt(t.accuracy, "%.4f"); };
  const auto loss = [](const TaskOutcome& t) { return fmt(t.loss, "%.3g"); };
  const auto steps = [](const TaskOutcome& t) {
    return std::to_string(t.steps) + (t.converged ? "" : " (not converged)");
  };
  md << "## What the points learned (quality rows)\n\n"
     << "| point | accuracy A | accuracy B | loss A | loss B | steps A | steps B |\n"
     << "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const PointComparison& p : c.points)
    md << "| `" << cell(p.id) << "` | " << side(p.task_a, acc) << " | " << side(p.task_b, acc) << " | "
       << side(p.task_a, loss) << " | " << side(p.task_b, loss) << " | " << side(p.task_a, steps) << " | "
       << side(p.task_b, steps) << " |\n";
  md << "\nThe best evaluation of each run (`task.best_accuracy`, `task.best_loss`); the times above are its "
        "training steps (`time_ms`).\n\n";
}

// The points measured on both sides, with their verdicts and summary.
void markdown_points(std::ostringstream& md, const Comparison& c) {
  md << "## Points measured on both sides (" << c.points.size() << ")\n\n";
  std::map<std::string, int> verdicts;
  if (!c.points.empty()) {
    md << "| point | A ms | B ms | B/A | B/A p10–p90 | p | verdict | max_abs_err A | max_abs_err B | Δ err "
          "(B−A) "
          "| notes |\n"
       << "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |\n";
    for (const PointComparison& p : c.points) {
      ++verdicts[p.verdict];
      const std::string verdict = p.significant() ? "**" + p.verdict + "**" : p.verdict;
      md << "| `" << cell(p.id) << "` | " << fmt(p.median_a, "%.4g") << " | " << fmt(p.median_b, "%.4g")
         << " | " << fmt(p.ratio, "%.3f") << " | "
         << (p.ratio_p10 ? fmt(p.ratio_p10, "%.3f") + "–" + fmt(p.ratio_p90, "%.3f") : std::string("—"))
         << " | " << fmt(p.p_value, "%.2g") << (p.p_method == "normal" ? " (n)" : "") << " | " << verdict
         << " | " << fmt(p.max_abs_err_a, "%.2e") << " | " << fmt(p.max_abs_err_b, "%.2e") << " | "
         << fmt(p.max_abs_err_diff, "%+.2e") << " | " << cell(join(p.notes, "; ")) << " |\n";
    }
    md << "\nB/A: the ratio of the medians (above 1: B is slower). p10–p90: the 10th and 90th percentiles of "
          "every "
          "pairwise ratio b_j / a_i of the repetitions. p: the two-sided Mann-Whitney U test over the "
          "repetitions, exact without ties up to "
       << kExactMannWhitneyMax
       << " per side, else the normal approximation with tie and continuity corrections (marked (n)). "
          "**slower** / **faster**: p < "
       << kCompareAlpha << ". Δ err: accuracy.max_abs_err of B minus A.\n\n";
    md << "Summary: " << verdicts["slower"] << " slower, " << verdicts["faster"] << " faster, "
       << verdicts["not significant"] << " not significant, " << verdicts["no p-value"]
       << " without a p-value";
    if (verdicts["different"]) md << ", " << verdicts["different"] << " different with equal medians";
    md << ".\n\n";
  }
  markdown_tasks(md, c);
}

// The points on one side only, the ones not compared, and the regression gate.
void markdown_rest(std::ostringstream& md, const Comparison& c, std::optional<double> fail_above) {
  const auto id_list = [&](const char* title, const std::vector<std::string>& ids) {
    md << "## " << title << " (" << ids.size() << ")\n\n";
    for (const std::string& id : ids) md << "- `" << id << "`\n";
    if (!ids.empty()) md << "\n";
  };
  id_list("Only in A", c.only_a);
  id_list("Only in B", c.only_b);
  md << "## Not compared: skipped or failed on a side (" << c.not_compared.size() << ")\n\n";
  if (!c.not_compared.empty()) {
    md << "| point | A | B |\n| --- | --- | --- |\n";
    const auto status = [](const std::string& s, const std::string& reason) {
      return cell(reason.empty() ? s : s + ": " + reason);
    };
    for (const NotCompared& n : c.not_compared)
      md << "| `" << cell(n.id) << "` | " << status(n.status_a, n.reason_a) << " | "
         << status(n.status_b, n.reason_b) << " |\n";
    md << "\n";
  }
  if (fail_above) {
    const auto slow = regressions(c, *fail_above);
    md << "## Regression gate (--fail-above " << fmt(*fail_above, "%g") << ")\n\n";
    if (slow.empty())
      md << "Passed: no point is significantly slower than " << fmt(*fail_above, "%g") << "x.\n";
    for (const PointComparison* p : slow)
      md << "- FAILED `" << p->id << "`: B/A " << fmt(p->ratio, "%.3f") << ", p " << fmt(p->p_value, "%.2g")
         << "\n";
    int no_p = 0;
    for (const PointComparison& p : c.points) no_p += !p.p_value;
    if (no_p) md << "\n" << no_p << " point(s) without a p-value were not gated.\n";
  }
}

}  // namespace

std::string comparison_markdown(const Comparison& c, std::optional<double> fail_above) {
  std::ostringstream md;
  markdown_sides(md, c);
  markdown_points(md, c);
  markdown_rest(md, c, fail_above);
  return md.str();
}

}  // namespace attn
