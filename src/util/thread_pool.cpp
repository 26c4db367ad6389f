// Persistent worker pool: one job at a time, published through a generation
// counter. Workers spin for a short while before sleeping on a condition
// variable, because a forward pass issues many small back-to-back jobs and a
// futex sleep/wake per job would dominate tiny models.
#include "encore/thread_pool.h"

#include <stdexcept>
#include <string>

#include "encore/error.h"

namespace encore {
namespace {

// Spin iterations before blocking. Short on purpose: the machine may be
// shared, and a sleeping worker only costs one wake-up per job.
constexpr int kSpinIters = 2048;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Chunk t of [0, n) split into `parts` contiguous pieces.
inline void chunk_bounds(int64_t n, int parts, int t, int64_t* begin, int64_t* end) {
  *begin = n * t / parts;
  *end = n * (t + 1) / parts;
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  if (n_threads < 1) {
    throw InvalidArgument("thread pool: need at least 1 thread, got " +
                          std::to_string(n_threads));
  }
  errors_.resize(static_cast<size_t>(n_threads));
  workers_.reserve(static_cast<size_t>(n_threads - 1));
  for (int t = 1; t < n_threads; ++t) {
    workers_.emplace_back([this, t] { worker_main(t); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::run_chunk(int thread) {
  int64_t begin = 0, end = 0;
  chunk_bounds(n_, n_threads_, thread, &begin, &end);
  if (begin >= end) return;
  try {
    (*fn_)(begin, end, thread);
  } catch (...) {
    errors_[static_cast<size_t>(thread)] = std::current_exception();
  }
}

void ThreadPool::worker_main(int thread) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; i < kSpinIters && gen == seen; ++i) {
      cpu_relax();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] {
        return stop_ || generation_.load(std::memory_order_acquire) != seen;
      });
      gen = generation_.load(std::memory_order_acquire);
      if (gen == seen) return;  // woken by stop_ with no job pending
    }
    seen = gen;
    run_chunk(thread);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Notify under the mutex so the caller cannot miss it between checking
      // pending_ and going to sleep.
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn) {
  if (n <= 0) return;
  if (in_use_.exchange(true, std::memory_order_acquire)) {
    throw std::logic_error(
        "ThreadPool::parallel_for called while the pool is busy (reentrant call "
        "from inside a job, or concurrent calls from two threads)");
  }
  if (n_threads_ == 1) {
    try {
      fn(0, n, 0);
    } catch (...) {
      in_use_.store(false, std::memory_order_release);
      throw;
    }
    in_use_.store(false, std::memory_order_release);
    return;
  }

  fn_ = &fn;
  n_ = n;
  for (std::exception_ptr& e : errors_) e = nullptr;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Bumping under the mutex pairs with the workers' predicate check, so a
    // worker about to sleep cannot miss this generation.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();

  run_chunk(0);

  bool done = pending_.load(std::memory_order_acquire) == 0;
  for (int i = 0; i < kSpinIters && !done; ++i) {
    cpu_relax();
    done = pending_.load(std::memory_order_acquire) == 0;
  }
  if (!done) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  fn_ = nullptr;

  std::exception_ptr first;
  for (std::exception_ptr& e : errors_) {
    if (e && !first) first = e;
    e = nullptr;
  }
  in_use_.store(false, std::memory_order_release);
  if (first) std::rethrow_exception(first);
}

}  // namespace encore
