// ThreadSanitizer builds only (ATTN_SANITIZE=thread; never compiled otherwise). Debian's libtbb is not built
// with -fsanitize=thread, so TSan cannot see the synchronisation inside it: the hand-off of a spawned task to
// the thread that steals it, of a finished task back to the thread that waits for it, and the reuse of TBB's
// pooled task memory by another thread. Without that, every parallel_for whose body reads what the caller
// wrote (or whose caller reads what the body wrote) is reported as a race in attnbench code. Suppressing
// those reports would also hide real races in the same code, so instead this file tells TSan what TBB does,
// at the library's exported entry points, with TSan's annotation interface:
//   * task hand-off: r1::spawn releases the task's task_group_context; the library asks every task's context
//     is_group_execution_cancelled() (through its PLT, so this definition interposes) just before it runs the
//     task on whichever thread took it, which acquires it;
//   * completion: built with TBB_USE_PROFILING_TOOLS=2 (CMakeLists.txt), TBB's own headers report the
//     releasing / acquired events of its tool interface (wait_context release after a task, acquired after
//     execute_and_wait and wait, tree_node folding) through r1::call_itt_notify, mapped here onto TSan. The
//     header reports "releasing" just before its atomic decrement of the wait_context's count, while the
//     waiter reads that count inside libtbb, so the waiter also acquires the counter itself on return: the
//     finishing thread's decrement then happens-before the waiter's reuse of that (stack) memory;
//   * memory reuse: a block TBB hands out again (small-object pool, cache-aligned allocator) was released by
//     whoever freed it, and is acquired by whoever gets it.
// The edges are per parallel loop (its context), not per task, so two tasks of one loop are ordered only
// across a spawn: a race between them still shows up, as long as one side's access is not followed by a
// spawn on its thread before the other side runs. Every other access stays fully checked. tsan_canary.cpp
// (run by scripts/sanitize) checks both sides: no report on a race-free TBB loop, the report of a planted
// race.
#include <dlfcn.h>
#include <oneapi/tbb/cache_aligned_allocator.h>
#include <oneapi/tbb/detail/_small_object_pool.h>
#include <oneapi/tbb/detail/_task.h>
#include <oneapi/tbb/task_group.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {

// The libtbb definition that the one below hides (RTLD_NEXT: the next object after this executable).
template <class F>
F next_definition(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (!f) {
    std::fprintf(stderr, "tsan_tbb: %s not found in libtbb (%s)\n", mangled, dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

namespace d1 = tbb::detail::d1;
using SpawnFn = void (*)(d1::task&, d1::task_group_context&);
using ExecuteAndWaitFn = void (*)(d1::task&, d1::task_group_context&, d1::wait_context&,
                                  d1::task_group_context&);
using WaitFn = void (*)(d1::wait_context&, d1::task_group_context&);
using SpawnSlotFn = void (*)(d1::task&, d1::task_group_context&, d1::slot_id);
using CancelledFn = bool (*)(d1::task_group_context&);
using AllocateEdFn = void* (*)(d1::small_object_pool*&, std::size_t, const d1::execution_data&);
using AllocateFn = void* (*)(d1::small_object_pool*&, std::size_t);
using DeallocateEdFn = void (*)(d1::small_object_pool&, void*, std::size_t, const d1::execution_data&);
using DeallocateFn = void (*)(d1::small_object_pool&, void*, std::size_t);
using CacheAllocateFn = void* (*)(std::size_t);
using CacheDeallocateFn = void (*)(void*);

struct Next {
  SpawnFn spawn =
      next_definition<SpawnFn>("_ZN3tbb6detail2r15spawnERNS0_2d14taskERNS2_18task_group_contextE");
  SpawnSlotFn spawn_slot =
      next_definition<SpawnSlotFn>("_ZN3tbb6detail2r15spawnERNS0_2d14taskERNS2_18task_group_contextEt");
  ExecuteAndWaitFn execute_and_wait = next_definition<ExecuteAndWaitFn>(
      "_ZN3tbb6detail2r116execute_and_waitERNS0_2d14taskERNS2_18task_group_contextERNS2_12wait_contextES6_");
  WaitFn wait =
      next_definition<WaitFn>("_ZN3tbb6detail2r14waitERNS0_2d112wait_contextERNS2_18task_group_contextE");
  CancelledFn cancelled = next_definition<CancelledFn>(
      "_ZN3tbb6detail2r128is_group_execution_cancelledERNS0_2d118task_group_contextE");
  AllocateEdFn allocate_ed = next_definition<AllocateEdFn>(
      "_ZN3tbb6detail2r18allocateERPNS0_2d117small_object_poolEmRKNS2_14execution_dataE");
  AllocateFn allocate =
      next_definition<AllocateFn>("_ZN3tbb6detail2r18allocateERPNS0_2d117small_object_poolEm");
  DeallocateEdFn deallocate_ed = next_definition<DeallocateEdFn>(
      "_ZN3tbb6detail2r110deallocateERNS0_2d117small_object_poolEPvmRKNS2_14execution_dataE");
  DeallocateFn deallocate =
      next_definition<DeallocateFn>("_ZN3tbb6detail2r110deallocateERNS0_2d117small_object_poolEPvm");
  CacheAllocateFn cache_allocate =
      next_definition<CacheAllocateFn>("_ZN3tbb6detail2r122cache_aligned_allocateEm");
  CacheDeallocateFn cache_deallocate =
      next_definition<CacheDeallocateFn>("_ZN3tbb6detail2r124cache_aligned_deallocateEPv");
};

const Next& next() {
  static const Next n;
  return n;
}

// The address of wait_context's private atomic counter, where the finishing thread's decrement (an atomic
// read-modify-write that TSan sees, in header code) releases: oneTBB 2021's layout is
// { uint64_t m_version_and_traits; std::atomic<uint64_t> m_ref_count; }.
static_assert(sizeof(d1::wait_context) == 2 * sizeof(std::uint64_t), "oneTBB's wait_context layout changed");
void* wait_counter(d1::wait_context& w) {
  return reinterpret_cast<char*>(&w) + sizeof(std::uint64_t);
}

}  // namespace

namespace tbb::detail::r1 {

// TBB's tool-notification hook (d1::notify_type: 0 prepare, 1 cancel, 2 acquired, 3 releasing, 4 destroy).
void call_itt_notify(int type, void* ptr) {
  if (type == 2) __tsan_acquire(ptr);
  if (type == 3) __tsan_release(ptr);
}

void spawn(d1::task& t, d1::task_group_context& ctx) {
  __tsan_release(&ctx);
  next().spawn(t, ctx);
}

void spawn(d1::task& t, d1::task_group_context& ctx, d1::slot_id id) {
  __tsan_release(&ctx);
  next().spawn_slot(t, ctx, id);
}

void execute_and_wait(d1::task& t, d1::task_group_context& t_ctx, d1::wait_context& w,
                      d1::task_group_context& w_ctx) {
  next().execute_and_wait(t, t_ctx, w, w_ctx);
  __tsan_acquire(wait_counter(w));
}

void wait(d1::wait_context& w, d1::task_group_context& ctx) {
  next().wait(w, ctx);
  __tsan_acquire(wait_counter(w));
}

bool is_group_execution_cancelled(d1::task_group_context& ctx) {
  __tsan_acquire(&ctx);
  return next().cancelled(ctx);
}

void* allocate(d1::small_object_pool*& pool, std::size_t bytes, const d1::execution_data& ed) {
  void* p = next().allocate_ed(pool, bytes, ed);
  __tsan_acquire(p);
  return p;
}

void* allocate(d1::small_object_pool*& pool, std::size_t bytes) {
  void* p = next().allocate(pool, bytes);
  __tsan_acquire(p);
  return p;
}

void deallocate(d1::small_object_pool& pool, void* p, std::size_t bytes, const d1::execution_data& ed) {
  __tsan_release(p);
  next().deallocate_ed(pool, p, bytes, ed);
}

void deallocate(d1::small_object_pool& pool, void* p, std::size_t bytes) {
  __tsan_release(p);
  next().deallocate(pool, p, bytes);
}

void* cache_aligned_allocate(std::size_t size) {
  void* p = next().cache_allocate(size);
  __tsan_acquire(p);
  return p;
}

void cache_aligned_deallocate(void* p) {
  __tsan_release(p);
  next().cache_deallocate(p);
}

}  // namespace tbb::detail::r1
