// Persistent worker pool: one job at a time, published through a packed
// (generation, next chunk) word that threads claim chunks from.
//
// Why claiming instead of "chunk t runs on thread t": a forward pass issues
// thousands of small jobs per second, and on a busy machine a sleeping worker
// can take a whole scheduler time slice to wake up. With claiming the caller
// simply runs the chunks nobody has started, so a late worker costs nothing.
// The chunk boundaries stay static, so results never depend on who ran what.
// Workers spin briefly before sleeping on a condition variable because a
// futex sleep/wake per job would dominate tiny models.
#include "encore/thread_pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "encore/error.h"

namespace encore {
namespace {

// The chunk counter runs from 0 to the job's chunk count inclusive:
// claiming the last chunk leaves it at that count, "none left". That value
// must still fit below the generation bits, or the final claim would carry
// into the generation and look like a new job to the workers.
constexpr int kChunkBits = 14;
constexpr uint64_t kChunkMask = (uint64_t{1} << kChunkBits) - 1;
static_assert((uint64_t{1} << kChunkBits) > ThreadPool::kMaxChunks);
static_assert(ThreadPool::kMaxChunks >= ThreadPool::kMaxThreads);

// Spin iterations before blocking. Short on purpose: the machine may be
// shared, and a sleeping worker only costs one wake-up per job.
constexpr int kSpinIters = 2048;

inline uint64_t gen_of(uint64_t state) { return state >> kChunkBits; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  if (n_threads < 1 || n_threads > kMaxThreads) {
    throw InvalidArgument("thread pool: the thread count must be in [1, " +
                          std::to_string(kMaxThreads) + "], got " + std::to_string(n_threads));
  }
  errors_.resize(kMaxChunks);  // once: parallel_for allocates nothing
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

void ThreadPool::run_chunks(uint64_t gen, int thread) {
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    // Acquire: a count of the next job comes with that job's close store
    // (released below), so the CAS of a worker that read it fails.
    const auto n_chunks = static_cast<uint64_t>(n_chunks_.load(std::memory_order_acquire));
    if (gen_of(s) != gen || (s & kChunkMask) >= n_chunks) return;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;  // s was reloaded
    }
    // Chunk claimed: the job cannot finish (and fn_/n_ cannot change) until
    // it is counted as done below.
    const int chunk = static_cast<int>(s & kChunkMask);
    const int64_t begin = n_ * chunk / static_cast<int64_t>(n_chunks);
    const int64_t end = n_ * (chunk + 1) / static_cast<int64_t>(n_chunks);
    if (begin < end) {
      try {
        (*fn_)(begin, end, thread);
      } catch (...) {
        errors_[static_cast<size_t>(chunk)] = std::current_exception();
      }
    }
    if (chunks_done_.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<int>(n_chunks)) {
      // Notify under the mutex so the caller cannot miss it between checking
      // chunks_done_ and going to sleep.
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
    s = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_main(int thread) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = gen_of(state_.load(std::memory_order_acquire));
    for (int i = 0; i < kSpinIters && gen == seen; ++i) {
      cpu_relax();
      gen = gen_of(state_.load(std::memory_order_acquire));
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock,
                 [&] { return stop_ || gen_of(state_.load(std::memory_order_acquire)) != seen; });
      gen = gen_of(state_.load(std::memory_order_acquire));
      if (gen == seen) return;  // woken by stop_ with no new job
    }
    seen = gen;
    run_chunks(gen, thread);
  }
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int chunks_per_thread) {
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
  const int n_chunks = n_threads_ * std::clamp(chunks_per_thread, 1, kMaxChunks / n_threads_);
  n_chunks_.store(n_chunks, std::memory_order_release);
  chunks_done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = gen_of(state_.load(std::memory_order_relaxed)) + 1;
  {
    // Publishing under the mutex pairs with the workers' predicate check, so
    // a worker about to sleep cannot miss this job.
    std::lock_guard<std::mutex> lock(mutex_);
    state_.store(gen << kChunkBits, std::memory_order_release);
  }
  wake_.notify_all();

  run_chunks(gen, 0);

  bool done = chunks_done_.load(std::memory_order_acquire) == n_chunks;
  for (int i = 0; i < kSpinIters && !done; ++i) {
    cpu_relax();
    done = chunks_done_.load(std::memory_order_acquire) == n_chunks;
  }
  if (!done) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return chunks_done_.load(std::memory_order_acquire) == n_chunks; });
  }
  // Close the job: a worker still in run_chunks for this generation must
  // see "none left" whatever the next job's chunk count (n_chunks_ changes
  // with the next call; with only the counter at this job's count, a worker
  // comparing it with a larger count could claim a chunk of this finished
  // generation, run it for the next job and miscount its chunks).
  state_.store((gen << kChunkBits) | kChunkMask, std::memory_order_release);
  fn_ = nullptr;

  std::exception_ptr first;
  for (int c = 0; c < n_chunks; ++c) {  // only this job's slots were written
    std::exception_ptr& e = errors_[static_cast<size_t>(c)];
    if (e && !first) first = e;
    e = nullptr;
  }
  in_use_.store(false, std::memory_order_release);
  if (first) std::rethrow_exception(first);
}

}  // namespace encore
