// `attnbench merge OUT`: joins the shards of `run --shard` (OUT/shards/I-of-N) into OUT's results; see
// bench/lib/merge.hpp. Exit 0: every planned point merged; 1: points missing (listed; the merged files are
// written and marked incomplete); 2: the shards do not belong together (nothing written).
#include <iostream>
#include <map>

#include "bench/lib/command.hpp"
#include "bench/lib/merge.hpp"

namespace attn::cli {
namespace {

int merge(const std::string& dir) {
  const MergeResult r = merge_shards(dir);
  std::string absent;
  for (int i = 0, k = 0; i < r.shard_count; ++i) {
    if (k < static_cast<int>(r.present.size()) && r.present[static_cast<std::size_t>(k)] == i) {
      ++k;
      continue;
    }
    absent += (absent.empty() ? "" : ", ") + std::to_string(i);
  }
  std::cout << "attnbench: merge '" << dir << "': sweep '" << r.meta.value("config_name", "?")
            << "' (config hash " << r.meta.value("config_hash", "?") << "), " << r.present.size() << " of "
            << r.shard_count << " shard(s) present" << (absent.empty() ? "" : " (absent: " + absent + ")")
            << "\n";
  for (const std::string& note : r.notes) std::cout << "attnbench: note: " << note << "\n";
  if (!r.complete()) {
    std::cout << "attnbench: " << r.missing.size() << " of " << r.planned << " planned point(s) missing:\n";
    std::map<int, std::size_t> per_shard;
    for (const MergeMissing& m : r.missing) ++per_shard[m.shard];
    for (const auto& [shard, n] : per_shard) {
      std::cout << "  shard " << shard << "-of-" << r.shard_count << ": " << n << " point(s)\n";
      for (const MergeMissing& m : r.missing)
        if (m.shard == shard) std::cout << "    missing: " << m.id << "\n";
    }
  }
  std::cout << "attnbench: merged " << r.rows << " of " << r.planned << " planned point(s) into " << dir
            << "/results.jsonl, results.csv, meta.json"
            << (r.complete() ? " (complete)" : " (incomplete: meta.json says \"complete\": false)") << "\n";
  return r.complete() ? 0 : 1;
}

}  // namespace
}  // namespace attn::cli

ATTN_REGISTER_COMMAND(
    "merge",
    "join the shards of `run --shard` (OUT/shards/I-of-N) into OUT/results.jsonl, results.csv, meta.json",
    [](CLI::App& sub) {
      auto dir = std::make_shared<std::string>();
      sub.add_option("out", *dir, "the --out folder of the sharded runs (holds shards/I-of-N/)")->required();
      return std::function<int()>([dir] { return attn::cli::merge(*dir); });
    })
