// `attnbench compare A B`: did B get faster or slower than A, point by point, and is the difference real?
// The comparison of two results folders (the statistics it uses are in stats.hpp), kept apart from the
// command so the tests call them without a process.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "bench/lib/result_row.hpp"
#include "bench/lib/stats.hpp"

namespace attn {

// A difference counts as real (significant) below this two-sided p-value.
inline constexpr double kCompareAlpha = 0.05;
// One side of a comparison: a results folder as `attnbench run` wrote it.
struct ResultsFolder {
  std::string dir;
  std::string label;  // "A" or "B"
  Json meta = Json::object();
  std::vector<ResultRow> rows;
};

// The point id of a row of results.mla.jsonl (`attnbench mla --sweep`): "mla/FORM:PRESET,B=..,T=CONTEXT,
// new=..,core=VARIANT,threads=N", FORM naive, absorbed, or gqa(kv=..,D=..) for a block's GQA core, PRESET the
// shape's fields when the block gave the shape inline. From the row's form, gqa, preset, shape, batch,
// context, new_tokens, variant and threads; Json::exception when one is missing or of another type.
std::string mla_row_id(const Json& row);

// Reads DIR/meta.json and DIR/results.jsonl, and when present the rows of results.peers.jsonl (the PyTorch
// peers) and results.mla.jsonl (`attnbench mla --sweep`; ids "mla/FORM:PRESET,B=..,T=..,new=..,core=..,
// threads=.."), which are compared as the sweep's points are. UsageError (exit 2) naming the folder or file
// (and line) for a missing folder or file, JSON that does not parse, or an MLA line that is not an MLA row.
ResultsFolder load_results_folder(const std::string& dir, const std::string& label);

// A quality row's outcome (ResultRow::task) as compare shows it: the best evaluation accuracy and loss, the
// training steps and whether the run converged.
struct TaskOutcome {
  std::optional<double> accuracy, loss;
  int64_t steps = 0;
  bool converged = false;
};

// One point measured (status ok) on both sides.
struct PointComparison {
  std::string id;          // the match key (see compare_results)
  std::string id_a, id_b;  // the rows' own ids
  std::string variant;
  std::string isa_a, isa_b;
  int threads_a = 0, threads_b = 0;
  std::optional<double> median_a, median_b;  // time_ms.median, ms
  std::optional<double> ratio;               // median_b / median_a
  // The 10th and 90th percentiles of every pairwise ratio b_j / a_i of the repetitions.
  std::optional<double> ratio_p10, ratio_p90;
  int reps_a = 0, reps_b = 0;  // samples on each side
  std::optional<double> u;     // Mann-Whitney U of A's samples against B's
  std::optional<double> p_value;
  std::string p_method;  // "exact", "normal" or "" (no p-value)
  std::string
      verdict;  // "slower", "faster", "different" (p < alpha, equal medians), "not significant", "no p-value"
  bool noisy_a = false, noisy_b = false;
  std::optional<double> max_abs_err_a, max_abs_err_b, max_abs_err_diff;  // accuracy.max_abs_err, diff = B - A
  std::optional<TaskOutcome> task_a, task_b;  // quality rows: what each side learned
  std::vector<std::string> notes;
  bool significant() const { return p_value && *p_value < kCompareAlpha; }
};

// A matched point not compared: not ok on at least one side.
struct NotCompared {
  std::string id;
  std::string status_a, status_b, reason_a, reason_b;
};

// A meta.json field (dotted path) on both sides; `a` / `b` null when that side lacks it.
struct MetaField {
  std::string field;
  Json a, b;
};

struct Comparison {
  std::string dir_a, dir_b;
  Json summary_a, summary_b;  // a few facts per side for the header (config, commit, CPU, ...)
  std::vector<MetaField> differences,
      same;  // meta.json fields (and the rows' isa / threads) that differ / agree
  std::vector<std::string> meta_not_compared;  // meta.json keys measured anew by every run, left out
  bool config_same = true;
  std::vector<std::string> config_keys_differ;  // top-level config keys whose values differ
  std::vector<PointComparison> points;
  std::vector<std::string> only_a, only_b;
  std::vector<NotCompared> not_compared;
};

// Matches the rows of A and B by point id and compares every point measured on both sides. A run-wide
// `run --isa NAME` (a config without sweep.isa) appends ",isa=NAME" to every id of its folder; that suffix is
// left out of the match key, so runs of one config under different --isa compare point by point.
Comparison compare_results(const ResultsFolder& a, const ResultsFolder& b);

// `--fail-above R`: a number > 1, else UsageError naming the option, the value and what is allowed.
double parse_fail_above(const std::string& text);
// Points slower by more than `fail_above` (ratio > R) with p < kCompareAlpha.
std::vector<const PointComparison*> regressions(const Comparison& c, double fail_above);

// The whole comparison as one JSON document (`compare --json`; scripts/plotlib/compare.py draws it).
Json comparison_json(const Comparison& c, std::optional<double> fail_above);
// The Markdown report (`compare`'s default output).
std::string comparison_markdown(const Comparison& c, std::optional<double> fail_above);

}  // namespace attn
