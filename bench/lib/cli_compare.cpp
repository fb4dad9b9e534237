// `attnbench compare A B [--json] [--fail-above R]`: B against A, point by point, with a Mann-Whitney U test
// over the repetitions (bench/lib/compare.hpp). Exit 0, 1 when --fail-above trips, 2 on bad input.
#include <iostream>
#include <memory>

#include "bench/lib/command.hpp"
#include "bench/lib/compare.hpp"
#include "common/interface/util.hpp"

namespace attn::cli {
namespace {

struct CompareOptions {
  std::string dir_a, dir_b;
  bool json = false;
  // Parsed by parse_fail_above, so a bad value gets attnbench's own message; given = the option was used (an
  // empty value is refused, not taken for its absence).
  std::string fail_above;
  bool fail_above_given = false;
};

int run_compare(const CompareOptions& o) {
  const std::optional<double> fail_above =
      o.fail_above_given ? std::optional<double>(parse_fail_above(o.fail_above)) : std::nullopt;
  const ResultsFolder a = load_results_folder(o.dir_a, "A"), b = load_results_folder(o.dir_b, "B");
  const Comparison c = compare_results(a, b);
  if (o.json)
    std::cout << comparison_json(c, fail_above).dump(2) << "\n";
  else
    std::cout << comparison_markdown(c, fail_above);
  std::cout << std::flush;
  if (!fail_above) return 0;
  const auto slow = regressions(c, *fail_above);
  if (slow.empty()) return 0;
  std::cerr << "attnbench compare: --fail-above " << *fail_above << ": " << slow.size()
            << " point(s) significantly slower (p < " << kCompareAlpha << ") by more than " << *fail_above
            << "x:\n";
  for (const PointComparison* p : slow)
    std::cerr << "  " << p->id << ": B/A " << *p->ratio << ", p " << *p->p_value << "\n";
  return 1;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND(
    "compare",
    "compare two results folders point by point (B/A ratio of the medians, Mann-Whitney U p-value)",
    [](CLI::App& sub) {
      auto o = std::make_shared<attn::cli::CompareOptions>();
      sub.add_option("A", o->dir_a, "results folder of the baseline (written by `attnbench run`)")
          ->required();
      sub.add_option("B", o->dir_b, "results folder to compare with it")->required();
      sub.add_flag("--json", o->json, "print one JSON document instead of the Markdown report");
      CLI::Option* fail_above = sub.add_option(
          "--fail-above", o->fail_above,
          "exit 1 when a point is significantly slower (p < 0.05) and B/A exceeds this ratio (> 1)");
      return std::function<int()>([o, fail_above] {
        o->fail_above_given = fail_above->count() > 0;
        return attn::cli::run_compare(*o);
      });
    })
