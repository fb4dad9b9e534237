// `attnbench mla` end to end: both forms on the tiny preset from a cache, their rows (--out) with the FLOPs,
// the FMA peak measured in the same run and the fraction of it, cache bytes per token and the error against
// the fp64 definition; bad flags exit 2 naming the flag. (A file of its own: it starts the attnbench
// executable, and tests/test_mla.cpp stays in-process.)
#include <catch2/catch.hpp>
#include <sstream>
#include <string>

#include "common/interface/params.hpp"
#include "tests/support/process.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace attn;
using namespace attn::test;

TEST_CASE("attnbench mla: both forms' rows carry FLOPs, the FMA peak and their fraction of it",
          "[mla][cli]") {
  ScratchDir dir("mla-cli");
  const ProcResult r =
      run_attnbench({"mla", "--preset", "tiny", "--context", "40", "--new", "1", "--form", "both",
                     "--repeats", "3", "--warmup", "1", "--threads", "1", "--out", dir.file("mla.jsonl")},
                    dir.path());
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(contains(r.out, "FMA peak"));
  CHECK(contains(r.out, "of peak"));
  std::istringstream lines(slurp(dir.path() / "mla.jsonl"));
  int rows = 0;
  for (std::string line; std::getline(lines, line); ++rows) {
    const Json row = Json::parse(line);
    INFO(row.dump());
    CHECK(row.at("kind") == "mla");
    const double gflops = row.at("gflops_per_s").get<double>(),
                 peak = row.at("fma_peak").at("gflops").get<double>();
    REQUIRE(gflops > 0);
    REQUIRE(peak > 0);
    CHECK(row.at("fma_peak").at("threads") == 1);
    CHECK_FALSE(row.at("fma_peak").at("isa").get<std::string>().empty());
    // The fraction is the row's own GFLOP/s over the peak; a layer call this small is far below it, and never
    // above it by more than the peak's own measurement noise.
    CHECK(row.at("frac_peak").get<double>() == Approx(gflops / peak).epsilon(1e-12));
    CHECK(row.at("frac_peak").get<double>() < 1.5);
    CHECK(row.at("rel_l2").get<double>() <= 1e-5);
    CHECK(row.at("cache_bytes_per_token").get<int64_t>() > 0);
  }
  CHECK(rows == 2);
  const ProcResult bad = run_attnbench({"mla", "--preset", "tiny", "--new", "0"}, dir.path());
  CHECK(bad.code == 2);
  CHECK(contains(bad.err, "--new 0"));
}
