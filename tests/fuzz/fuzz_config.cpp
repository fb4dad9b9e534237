// libFuzzer target: sweep configs (bench/lib/config.cpp, plan.cpp) on arbitrary bytes, through the code path
// of `attnbench run CONFIG.json --dry-run`: JSON parsing, the full validation, plan expansion, and the
// dry-run plan listing (each point's skip reasons and memory estimate). No sweep runs and nothing is written:
// the dry run returns before the output folder is touched, and its listing goes to a discarding stream.
// UsageError and NotSupported are the expected answers to a bad config; any other exception, a crash, a
// sanitizer report, a timeout or an allocation beyond -malloc_limit_mb is a finding.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <random>
#include <streambuf>
#include <string>
#include <vector>

#include "bench/lib/plan.hpp"
#include "bench/lib/sweep.hpp"
#include "common/interface/params.hpp"
#include "common/support/error.hpp"

#ifndef ATTN_FUZZ_DATA_DIR
#error "ATTN_FUZZ_DATA_DIR (tests/fuzz/data) must be defined by the build"
#endif

namespace {

// Swallows the dry-run listing (it would otherwise cost more than the parsing being fuzzed).
class NullBuffer : public std::streambuf {
 protected:
  int_type overflow(int_type c) override { return traits_type::not_eof(c); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

// Sends std::cout to a NullBuffer while alive.
struct QuietCout {
  NullBuffer null;
  std::streambuf* kept = std::cout.rdbuf(&null);
  QuietCout() = default;
  QuietCout(const QuietCout&) = delete;
  QuietCout& operator=(const QuietCout&) = delete;
  ~QuietCout() { std::cout.rdbuf(kept); }
};

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_config: invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    // Relative "tokens" text files resolve against the config's folder: tests/fuzz/data holds sample.txt.
    const attn::Plan plan =
        attn::make_plan(attn::parse_sweep_config_text(text, ATTN_FUZZ_DATA_DIR "/config.json"));
    const attn::SweepConfig& config = plan.config;
    require(!config.name.empty() && !config.variants.empty() && !config.regimes.empty(),
            "a valid config has a name, variants and regimes");
    require(!plan.points.empty() && !config.threads.empty() && config.memory_budget_bytes.has_value(),
            "a plan has points and is resolved for the machine");
    attn::SweepOptions options;
    options.dry_run = true;  // the listing only: never measure, never write
    options.progress_tty = false;
    options.out_dir = "/nonexistent/fuzz/out";
    int status = 0;
    {
      QuietCout quiet;
      status = attn::run_sweep(plan, options);
      options.json = true;  // and the JSON listing (`run --dry-run --json`)
      status |= attn::run_sweep(plan, options);
    }
    require(status == 0, "a dry run succeeds");
  } catch (const attn::UsageError&) {
  } catch (const attn::NotSupported&) {
  }
  return 0;
}

#ifdef ATTN_LIBFUZZER
// Structure-aware mutation. Most byte-level mutations of a JSON config are syntax errors that stop in the
// parser, so three times in four the input is parsed, one value of its tree is changed (to a boundary value,
// a schema key or value, a list, a copy of another node, or removed) and the tree is written back. The rest,
// and inputs that do not parse, get libFuzzer's own byte-level mutations.
extern "C" std::size_t LLVMFuzzerMutate(uint8_t* data, std::size_t size, std::size_t max_size);

namespace {

using attn::Json;

Json interesting_value(std::minstd_rand& rng) {
  static const Json kValues[] = {0,
                                 1,
                                 2,
                                 3,
                                 4,
                                 7,
                                 16,
                                 33,
                                 64,
                                 1024,
                                 -1,
                                 -0.0,
                                 0.5,
                                 0.999999,
                                 1.5,
                                 1e-7,
                                 1e300,
                                 -1e300,
                                 1099511627776,
                                 1099511627777,
                                 9007199254740992,
                                 9223372036854775807LL,
                                 18446744073709551615ULL,
                                 true,
                                 false,
                                 nullptr,
                                 "",
                                 "all",
                                 "none",
                                 "causal",
                                 "pad",
                                 "pad=0",
                                 "pad=1",
                                 "pad=0.5",
                                 "causal+pad=0.25",
                                 "bool",
                                 "gaussian",
                                 "tokens",
                                 "sample.txt",
                                 "/nonexistent",
                                 "auto",
                                 "full",
                                 "sampled",
                                 "naive",
                                 "tiled",
                                 "linear",
                                 "sliding_window",
                                 "elu",
                                 "relu",
                                 "8GiB",
                                 "1 B",
                                 "0.5K",
                                 "99999999999 TiB",
                                 "1e3",
                                 "a",
                                 ".a",
                                 std::string(70, '7'),
                                 Json::array(),
                                 Json::object()};
  return kValues[rng() % std::size(kValues)];
}

const char* schema_key(std::minstd_rand& rng) {
  static const char* const kKeys[] = {
      "name",          "description", "variants", "sweep",         "inputs",      "measure",   "accuracy",
      "memory_budget", "seed",        "batch",    "heads",         "head_dim",    "seq_len",   "seq_q",
      "seq_kv",        "mask",        "threads",  "dropout",       "regime",      "std",       "text",
      "warmup",        "min_reps",    "max_reps", "min_time_s",    "max_time_s",  "reference", "rows",
      "params",        "window",      "dilation", "global_tokens", "feature_map", "chunk",     "eps",
      "tile_q",        "tile_kv"};
  return kKeys[rng() % std::size(kKeys)];
}

void collect(Json& j, std::vector<Json*>& nodes, int depth) {
  nodes.push_back(&j);
  if (depth > 16 || !j.is_structured()) return;
  for (auto& child : j) collect(child, nodes, depth + 1);
}

void mutate_tree(Json& root, std::minstd_rand& rng) {
  std::vector<Json*> nodes;
  collect(root, nodes, 0);
  Json& n = *nodes[rng() % nodes.size()];
  switch (rng() % 8) {
    case 0:
    case 1:
      n = interesting_value(rng);
      break;
    case 2: {  // a short list (an axis)
      Json list = Json::array();
      for (unsigned k = 0, len = 1 + rng() % 4; k < len; ++k) list.push_back(interesting_value(rng));
      n = list;
      break;
    }
    case 3:  // a copy of another node (e.g. an axis list moved to another key)
      n = Json(*nodes[rng() % nodes.size()]);
      break;
    case 4:
      if (n.is_object())
        n[schema_key(rng)] = interesting_value(rng);
      else if (n.is_array())
        n.push_back(n.empty() ? interesting_value(rng) : Json(n[rng() % n.size()]));
      else
        n = Json{{schema_key(rng), n}};
      break;
    case 5:
      if (n.is_structured() && !n.empty()) {
        auto it = n.begin();
        std::advance(it, rng() % n.size());
        n.erase(it);
      } else {
        n = interesting_value(rng);
      }
      break;
    case 6:
      if (n.is_number()) {
        const double x = n.get<double>();
        const double tweaked[] = {x + 1, x - 1, x * 2, -x, x * 1e6, x / 3};
        const double t = tweaked[rng() % std::size(tweaked)];
        if (n.is_number_integer() && std::abs(t) < 9e18 && t == std::floor(t))
          n = static_cast<int64_t>(t);
        else
          n = t;
      } else {
        n = interesting_value(rng);
      }
      break;
    default:  // a key of the schema added to the root or renamed
      if (root.is_object()) root[schema_key(rng)] = Json(n);
      break;
  }
}

}  // namespace

extern "C" std::size_t LLVMFuzzerCustomMutator(uint8_t* data, std::size_t size, std::size_t max_size,
                                               unsigned int seed) {
  std::minstd_rand rng(seed);
  if (rng() % 4 == 0) return LLVMFuzzerMutate(data, size, max_size);
  Json j = Json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return LLVMFuzzerMutate(data, size, max_size);
  for (unsigned k = 0, rounds = 1 + rng() % 3; k < rounds; ++k) mutate_tree(j, rng);
  const std::string out = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}
#endif  // ATTN_LIBFUZZER
