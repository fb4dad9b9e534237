// The in-run memory-bandwidth calibration: the denominator of a row's frac_bandwidth and the diagonal
// ceiling of the roofline (scripts/plotlib). A streaming read of a buffer far larger than the last-level
// cache, split across T threads, each reading its own contiguous part with the widest SIMD loads of the
// best target and several independent accumulators, so the loop is bound by loads, not by add latency.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/support/sanitizer.hpp"

namespace attn {

// The last-level cache in bytes (sysconf _SC_LEVEL3_CACHE_SIZE, else level 2), 0 when unknown.
uint64_t last_level_cache_bytes();

// The buffer the calibration reads: max(16 x the last-level cache, 512 MiB), capped at max(2 GiB, 2 x the
// last-level cache) and at a quarter of the physical memory (but never below 2 x the last-level cache); in a
// sanitizer build (kSanitizerBuild) at most kBandwidthSanitizerBytes.
uint64_t bandwidth_buffer_bytes();
inline constexpr uint64_t kBandwidthSanitizerBytes = uint64_t{256} << 20;

// A page-touched fp32 buffer (every page written once, by the threads that will read it, before any
// timing), kept for every thread count of one calibration.
class BandwidthBuffer {
 public:
  explicit BandwidthBuffer(uint64_t bytes = bandwidth_buffer_bytes());
  ~BandwidthBuffer();
  BandwidthBuffer(const BandwidthBuffer&) = delete;
  BandwidthBuffer& operator=(const BandwidthBuffer&) = delete;
  const float* data() const { return data_; }
  std::size_t floats() const { return floats_; }
  uint64_t bytes() const { return floats_ * sizeof(float); }

 private:
  float* data_ = nullptr;
  std::size_t floats_ = 0;
};

struct BandwidthCalibration {
  int threads = 1;
  uint64_t buffer_bytes = 0;
  int reps = 0;
  double gbytes_per_s = 0;         // the best rep: buffer_bytes / seconds / 1e9
  double median_gbytes_per_s = 0;  // the median rep
  double checksum = 0;             // the sum read (keeps the loads; finite for a finite buffer)
};

// `reps` timed streaming reads of `buffer` (after one untimed pass) on `threads` TBB threads (each reads one
// contiguous 1/threads of it); the best and median rate.
BandwidthCalibration calibrate_bandwidth(int threads, const BandwidthBuffer& buffer, int reps = 3);

// The dispatched kernel: the sum of p[0..n) read with several independent SIMD accumulators.
double stream_read_sum(const float* p, std::size_t n);

// The group bandwidth probe (measure.group_bandwidth): one timed streaming read of `spans` (a point's K and V
// as stored), their concatenation split into `threads` contiguous parts, one per task of the caller's TBB
// arena (ThreadScope), with the best SIMD target's widest loads; its milliseconds. It reads 32-bit words
// (combined with XOR, so bf16 pairs cost what fp32 does); a span's last bytes short of a word are left out.
struct ByteSpan {
  const void* data = nullptr;
  std::size_t bytes = 0;
};
double time_stream_read_ms(const std::vector<ByteSpan>& spans, int threads);

}  // namespace attn
