// ThreadSanitizer canary (built only with ATTN_SANITIZE=thread; scripts/sanitize runs it before the tests).
// It checks the TSan set-up itself, with the same TBB pattern the variants use: the caller writes inputs,
// tbb::parallel_for bodies on every thread read them and write their own outputs, the caller reads the
// outputs.
//   attn_tsan_canary         must run clean: tsan_tbb.cpp gives TSan TBB's hand-offs, so there is no report;
//   attn_tsan_canary --race  adds one real race (an unsynchronised += on a shared counter in the bodies) and
//                            must be reported, at the line marked RACE, so the annotations hide no real race.
// It also fails (exit 3) if TBB ran every body on one thread, since then nothing was tested.
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  const bool race = argc > 1 && std::strcmp(argv[1], "--race") == 0;
  long shared = 0;
  std::atomic<int> on_workers{0};
  double total = 0;
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<float> in(256), out(256);
    for (int i = 0; i < 256; ++i) in[i] = static_cast<float>(i + rep);
    tbb::parallel_for(0, 256, [&](int i) {
      float x = in[i];
      for (int k = 0; k < 20000; ++k) x = std::sqrt(x + 1.0f);  // enough work for the other thread to steal
      out[i] = x;
      if (tbb::this_task_arena::current_thread_index() != 0)
        on_workers.fetch_add(1, std::memory_order_relaxed);
      if (race && i % 64 == 0) shared += i;  // RACE
    });
    for (float f : out) total += f;
  }
  std::printf("attn_tsan_canary: %s, %d of %d bodies ran on a worker thread (checksum %.3f, %ld)\n",
              race ? "with a race" : "race-free", on_workers.load(), 20 * 256, total, shared);
  return on_workers.load() > 0 ? 0 : 3;
}
