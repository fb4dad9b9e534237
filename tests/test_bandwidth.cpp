// The in-run memory-bandwidth calibration (bench/lib/bandwidth.hpp): correctness only, no timing
// assertions. The kernel sums exactly what it reads on every SIMD target this CPU runs (tails included), the
// buffer is far larger than the last-level cache, and a calibration returns a finite positive rate.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "bench/lib/bandwidth.hpp"
#include "common/kernels/simd.hpp"

using namespace attn;

TEST_CASE("bandwidth: the streaming kernel sums every element on every supported target", "[bandwidth]") {
  for (const std::string& isa : simd::isa_info().supported) {
    const simd::ScopedIsa scope(isa, "test");
    INFO("isa " << isa);
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{16},
                                std::size_t{129}, std::size_t{1000}, std::size_t{4099}}) {
      std::vector<float> x(n + 1);
      double want = 0;
      for (std::size_t i = 0; i < n; ++i) {
        x[i + 1] = static_cast<float>(i % 7) - 2.0f;  // small integers: every partial sum is exact in fp32
        want += x[i + 1];
      }
      CHECK(stream_read_sum(x.data() + 1, n) == want);  // unaligned start
    }
  }
}

TEST_CASE("bandwidth: the buffer is far larger than the last-level cache", "[bandwidth]") {
  const uint64_t llc = last_level_cache_bytes();
  const uint64_t bytes = bandwidth_buffer_bytes();
  INFO("LLC " << llc << " bytes, buffer " << bytes << " bytes");
  if (kSanitizerBuild) {  // capped: a sanitizer build's bandwidth figure means nothing
    CHECK(bytes <= kBandwidthSanitizerBytes);
    CHECK(bytes >= std::min(kBandwidthSanitizerBytes, std::max<uint64_t>(2 * llc, 1)));
    return;
  }
  CHECK(bytes > 2 * llc - 1);
  CHECK(bytes >= std::min<uint64_t>(uint64_t{512} << 20, std::max<uint64_t>(2 * llc, 1)));
}

TEST_CASE("bandwidth: a calibration on 1 and 2 threads returns a finite positive rate", "[bandwidth]") {
  const BandwidthBuffer buffer(uint64_t{64} << 20);  // small: this checks the plumbing, not the machine
  CHECK(buffer.bytes() == (uint64_t{64} << 20));
  for (const int threads : {1, 2}) {
    const BandwidthCalibration c = calibrate_bandwidth(threads, buffer, 2);
    INFO("threads " << threads);
    CHECK(c.threads == threads);
    CHECK(c.buffer_bytes == buffer.bytes());
    CHECK(c.reps == 2);
    CHECK(std::isfinite(c.gbytes_per_s));
    CHECK(c.gbytes_per_s > 0);
    CHECK(c.median_gbytes_per_s > 0);
    CHECK(c.median_gbytes_per_s <= c.gbytes_per_s);
    // Every element is 1: three passes (one untimed) read each of them once.
    CHECK(c.checksum == Approx(3.0 * static_cast<double>(buffer.floats())).epsilon(1e-6));
  }
}

TEST_CASE("bandwidth: the default buffer is touched and calibrated without error", "[bandwidth]") {
  const BandwidthBuffer buffer;
  CHECK(buffer.bytes() == bandwidth_buffer_bytes() / sizeof(float) * sizeof(float));
  if (!kSanitizerBuild) CHECK(buffer.bytes() > last_level_cache_bytes());  // a sanitizer build's is capped
  const BandwidthCalibration c = calibrate_bandwidth(1, buffer, 1);
  CHECK(std::isfinite(c.gbytes_per_s));
  CHECK(c.gbytes_per_s > 0);
}
