// The memory-bandwidth calibration (bandwidth.hpp): a Highway kernel compiled once per target
// (foreach_target.h) and dispatched at run time to the target common/kernels/simd.hpp selected, and the TBB
// driver.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/lib/bandwidth.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // must come first: it re-includes this file once per target
// clang-format on
#include <hwy/highway.h>

#include "common/kernels/simd-inl.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::bandwidth::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using simd::HWY_NAMESPACE::DF;
using simd::HWY_NAMESPACE::VF;

// Eight independent accumulators: a vector add has 3-4 cycles of latency and cores issue two loads per
// cycle, so one chain would bound the loop by add latency (a quarter of the load rate); eight keep every
// load port busy from L1 and leave DRAM the only limit. Combines whole vectors of p[0..n) with `op` into one
// vector and sets `i` to where the scalar tail starts.
template <class D, class Op>
hn::Vec<D> StreamRead(D d, const hn::TFromD<D>* HWY_RESTRICT p, size_t n, size_t& i, Op op) {
  using V = hn::Vec<D>;
  const size_t N = hn::Lanes(d);
  V a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  V a4 = hn::Zero(d), a5 = hn::Zero(d), a6 = hn::Zero(d), a7 = hn::Zero(d);
  i = 0;
  for (; i + 8 * N <= n; i += 8 * N) {
    a0 = op(a0, hn::LoadU(d, p + i));
    a1 = op(a1, hn::LoadU(d, p + i + N));
    a2 = op(a2, hn::LoadU(d, p + i + 2 * N));
    a3 = op(a3, hn::LoadU(d, p + i + 3 * N));
    a4 = op(a4, hn::LoadU(d, p + i + 4 * N));
    a5 = op(a5, hn::LoadU(d, p + i + 5 * N));
    a6 = op(a6, hn::LoadU(d, p + i + 6 * N));
    a7 = op(a7, hn::LoadU(d, p + i + 7 * N));
  }
  for (; i + N <= n; i += N) a0 = op(a0, hn::LoadU(d, p + i));
  return op(op(op(a0, a1), op(a2, a3)), op(op(a4, a5), op(a6, a7)));
}
struct AddOp {
  template <class V>
  V operator()(V a, V b) const {
    return hn::Add(a, b);
  }
};
struct XorOp {
  template <class V>
  V operator()(V a, V b) const {
    return hn::Xor(a, b);
  }
};

double StreamReadSum(const float* HWY_RESTRICT p, size_t n) {
  const DF d;
  size_t i = 0;
  const VF s = StreamRead(d, p, n, i, AddOp());
  double sum = static_cast<double>(hn::GetLane(hn::SumOfLanes(d, s)));
  for (; i < n; ++i) sum += static_cast<double>(p[i]);
  return sum;
}

// The same load-bound loop over 32-bit words combined with XOR: any bit pattern costs the same (a float add
// of bf16 pairs read as fp32 could meet subnormals and their microcode assists), for the group probe, which
// reads a point's K and V as stored.
uint32_t StreamReadXor(const uint32_t* HWY_RESTRICT p, size_t n) {
  const hn::CappedTag<uint32_t, simd::HWY_NAMESPACE::kPadLanes> d;
  size_t i = 0;
  const auto x = StreamRead(d, p, n, i, XorOp());
  HWY_ALIGN uint32_t lanes[hn::MaxLanes(d)];
  hn::Store(x, d, lanes);
  uint32_t r = 0;
  for (size_t l = 0; l < hn::Lanes(d); ++l) r ^= lanes[l];
  for (; i < n; ++i) r ^= p[i];
  return r;
}
}  // namespace attn::bandwidth::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <sys/mman.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>
#include <vector>

#include "bench/lib/bandwidth.hpp"
#include "common/support/runtime.hpp"

namespace attn {
namespace bandwidth {
HWY_EXPORT(StreamReadSum);
HWY_EXPORT(StreamReadXor);
// Dispatched by their plain names from inside the namespace: HWY_COMPILE_ONLY_STATIC (ATTN_NATIVE=ON) turns
// HWY_DYNAMIC_DISPATCH(F) into N_<TARGET>::F, which must resolve from here.
double read_sum(const float* p, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(StreamReadSum)(p, n);
}
uint32_t read_xor(const uint32_t* p, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(StreamReadXor)(p, n);
}
}  // namespace bandwidth

double stream_read_sum(const float* p, std::size_t n) {
  return bandwidth::read_sum(p, n);
}

uint64_t last_level_cache_bytes() {
  for (const int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = sysconf(name);
    if (v > 0) return static_cast<uint64_t>(v);
  }
  return 0;
}

uint64_t bandwidth_buffer_bytes() {
  const uint64_t llc = last_level_cache_bytes();
  uint64_t bytes = std::max<uint64_t>(16 * llc, uint64_t{512} << 20);
  // Capped so one calibration stays within a couple of seconds per thread count: virtual machines often
  // report the whole socket's L3 (hundreds of MiB) as the level-3 size, and 16 x that is gigabytes. The
  // cap keeps the buffer at least twice the reported cache.
  bytes = std::min(bytes, std::max<uint64_t>(uint64_t{2} << 30, 2 * llc));
  // A sanitizer build's loads are instrumented, so its figure means nothing; touching gigabytes under ASan
  // (with their shadow) cost seconds in every `attnbench run` of the test suite.
  if (kSanitizerBuild) bytes = std::min(bytes, kBandwidthSanitizerBytes);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) {
    const uint64_t quarter = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 4;
    bytes = std::min(bytes, std::max(quarter, 2 * llc));
  }
  return bytes;
}

namespace {
// [begin, end) of part t of n floats split into `parts` contiguous pieces, on 64-byte boundaries.
std::pair<std::size_t, std::size_t> part(std::size_t n, int parts, int t) {
  const std::size_t lines = n / 16, per = lines / static_cast<std::size_t>(parts),
                    extra = lines % static_cast<std::size_t>(parts), ut = static_cast<std::size_t>(t);
  const std::size_t begin = (ut * per + std::min(ut, extra)) * 16;
  const std::size_t end = t + 1 == parts ? n : ((ut + 1) * per + std::min(ut + 1, extra)) * 16;
  return {begin, end};
}
}  // namespace

BandwidthBuffer::BandwidthBuffer(uint64_t bytes) {
  floats_ = static_cast<std::size_t>(std::max<uint64_t>(bytes / sizeof(float), 16));
  // 2 MiB-aligned with MADV_HUGEPAGE (as naive's score buffer): touching 2 GiB of 4 KiB pages costs seconds
  // of page faults on a VM, transparent huge pages a fraction of that, and the timed passes see fewer TLB
  // misses. Advice only: where it is refused the buffer has 4 KiB pages.
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  const std::size_t alloc = (floats_ * sizeof(float) + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, alloc);
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  madvise(p, alloc, MADV_HUGEPAGE);
#endif
  data_ = static_cast<float*>(p);
  // Every page written before any timing (no page fault is timed), in parallel: on a NUMA machine each
  // part's pages land near the threads that read it.
  const int parts = std::max(1, available_threads());
  tbb::parallel_for(
      0, parts,
      [&](int t) {
        const auto [b, e] = part(floats_, parts, t);
        std::fill(data_ + b, data_ + e, 1.0f);
      },
      tbb::static_partitioner());
}

BandwidthBuffer::~BandwidthBuffer() {
  std::free(data_);
}

BandwidthCalibration calibrate_bandwidth(int threads, const BandwidthBuffer& buffer, int reps) {
  BandwidthCalibration c;
  c.threads = std::max(1, threads);
  c.buffer_bytes = buffer.bytes();
  c.reps = std::max(1, reps);
  const ThreadScope scope(c.threads);
  std::vector<double> sums(static_cast<std::size_t>(c.threads));
  auto pass = [&] {
    // One contiguous part per task and, with the static partitioner and max_allowed_parallelism = threads,
    // one task per thread.
    tbb::parallel_for(
        0, c.threads,
        [&](int t) {
          const auto [b, e] = part(buffer.floats(), c.threads, t);
          sums[static_cast<std::size_t>(t)] += stream_read_sum(buffer.data() + b, e - b);
        },
        tbb::static_partitioner());
  };
  pass();  // untimed: wakes the workers, warms the TLB
  std::vector<double> rates;
  for (int r = 0; r < c.reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(static_cast<double>(c.buffer_bytes) / std::max(s, 1e-12) / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  c.gbytes_per_s = rates.back();
  const std::size_t m = rates.size() / 2;
  c.median_gbytes_per_s = rates.size() % 2 ? rates[m] : (rates[m - 1] + rates[m]) / 2;
  for (const double s : sums) c.checksum += s;
  return c;
}

double time_stream_read_ms(const std::vector<ByteSpan>& spans, int threads) {
  // Word offsets where each span starts in the concatenation; part t of the words goes to thread t.
  std::vector<std::size_t> start{0};
  for (const ByteSpan& s : spans) start.push_back(start.back() + s.bytes / sizeof(uint32_t));
  const std::size_t words = start.back();
  const int parts = std::max(1, threads);
  std::vector<uint32_t> sink(static_cast<std::size_t>(parts));
  const auto t0 = std::chrono::steady_clock::now();
  tbb::parallel_for(
      0, parts,
      [&](int t) {
        const auto [b, e] = part(words, parts, t);
        uint32_t x = 0;
        for (std::size_t i = 0; i < spans.size(); ++i) {
          const std::size_t lo = std::max(b, start[i]), hi = std::min(e, start[i + 1]);
          if (lo < hi)
            x ^= bandwidth::read_xor(static_cast<const uint32_t*>(spans[i].data) + (lo - start[i]), hi - lo);
        }
        sink[static_cast<std::size_t>(t)] = x;
      },
      tbb::static_partitioner());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // The XOR of what was read leaves the loop through a volatile store, so the loads cannot be dropped.
  volatile uint32_t keep = 0;
  for (const uint32_t x : sink) keep = keep ^ x;
  return ms;
}

}  // namespace attn
#endif  // HWY_ONCE
