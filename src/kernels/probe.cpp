#include "kernels/probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "encore/thread_pool.h"
#include "kernels/kernel_table.h"
#include "kernels/probe_internal.h"
#include "util/huge_pages.h"

namespace encore::kernels {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs body(iters) on every thread at once and returns the best (shortest)
// wall time of 3 runs; `iters` is chosen so one run takes ~0.1 s.
template <class Body>
double best_parallel_seconds(ThreadPool& threads, int64_t iters, Body body) {
  std::atomic<int64_t> sink{0};
  auto run = [&] {
    const auto t0 = Clock::now();
    threads.parallel_for(threads.size(), [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) sink += static_cast<int64_t>(body(iters));
    });
    return seconds_since(t0);
  };
  double best = run();
  for (int r = 0; r < 2; ++r) best = std::min(best, run());
  return best;
}

}  // namespace

namespace probe_detail {

float fma_loop_scalar(int64_t iters) {
  float acc[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) acc[c] = static_cast<float>(c);
  for (int64_t i = 0; i < iters; ++i) {
    for (float& a : acc) a = std::fma(a, 0.999f, 0.001f);
  }
  float sum = 0.0f;
  for (float a : acc) sum += a;
  return sum;
}

}  // namespace probe_detail

double measure_read_bandwidth(ThreadPool& threads, size_t bytes) {
  const size_t n = std::max<size_t>(bytes / sizeof(uint64_t), 1024);
  // On transparent huge pages where the kernel offers them, as the weights
  // read into memory are (gguf's Storage::heap): the probe measures the
  // memory the kernels stream from, not page walks.
  using util::kHugePage;
  const size_t size = (n * sizeof(uint64_t) + kHugePage - 1) / kHugePage * kHugePage;
  void* mem = util::alloc_huge_pages(size);
  if (mem == nullptr) throw std::bad_alloc();
  const std::unique_ptr<uint64_t, decltype(&std::free)> owner(static_cast<uint64_t*>(mem),
                                                              &std::free);
  uint64_t* const buf = owner.get();
  // Touch every page from the threads that will read it (first-touch NUMA
  // placement) with non-zero data, so no read hits a shared zero page.
  threads.parallel_for(static_cast<int64_t>(n), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) buf[static_cast<size_t>(i)] = static_cast<uint64_t>(i) * 3 + 1;
  });
  std::atomic<uint64_t> sink{0};
  double best = 1e30;
  // Read with no software prefetch and with prefetches 1 KiB and 4 KiB
  // ahead, best of all: the probe measures what the memory system can
  // deliver, as the kernels (which prefetch) see it, not what one access
  // pattern happens to get from the hardware prefetcher.
  for (const int64_t ahead : {int64_t{0}, int64_t{128}, int64_t{512}}) {  // in uint64s
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = Clock::now();
      threads.parallel_for(static_cast<int64_t>(n), [&](int64_t b, int64_t e, int) {
        // Four independent sums keep enough loads in flight; integer adds
        // vectorise freely (no rounding), so the loop runs at memory speed.
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t i = b;
        for (; i + 8 <= e; i += 8) {
          if (ahead > 0) __builtin_prefetch(&buf[static_cast<size_t>(std::min(i + ahead, e - 1))]);
          s0 += buf[static_cast<size_t>(i)] + buf[static_cast<size_t>(i + 4)];
          s1 += buf[static_cast<size_t>(i + 1)] + buf[static_cast<size_t>(i + 5)];
          s2 += buf[static_cast<size_t>(i + 2)] + buf[static_cast<size_t>(i + 6)];
          s3 += buf[static_cast<size_t>(i + 3)] + buf[static_cast<size_t>(i + 7)];
        }
        for (; i < e; ++i) s0 += buf[static_cast<size_t>(i)];
        sink += s0 + s1 + s2 + s3;
      });
      best = std::min(best, seconds_since(t0));
    }
  }
  return static_cast<double>(n * sizeof(uint64_t)) / best / 1e9;
}

double measure_fma_gflops(ThreadPool& threads, Isa isa) {
  const KernelTable& k = kernel_table(isa);
  const int64_t iters = isa == Isa::Scalar ? 2'000'000 : 10'000'000;
  const double s = best_parallel_seconds(threads, iters, k.fma_loop);
  const double flops =
      2.0 * k.fma_lanes * probe_detail::kFmaChains * static_cast<double>(iters) * threads.size();
  return flops / s / 1e9;
}

double measure_int8_gops(ThreadPool& threads, Isa isa) {
  const KernelTable& k = kernel_table(isa);
  if (k.int8_loop == nullptr) return 0.0;
  const int64_t iters = 5'000'000;
  const double s = best_parallel_seconds(threads, iters, k.int8_loop);
  const double ops = 2.0 * k.int8_products * probe_detail::kIntChains * static_cast<double>(iters) *
                     threads.size();
  return ops / s / 1e9;
}

}  // namespace encore::kernels
