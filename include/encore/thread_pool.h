// A fixed pool of persistent worker threads for data-parallel loops.
//
// Ownership: a ThreadPool owns n_threads - 1 worker threads, created in the
// constructor and joined in the destructor; the thread that calls
// parallel_for() is the remaining one. No threads are created per call.
// Cost: one parallel_for() publishes the job, runs chunks on the caller and
// waits only for chunks other threads have actually started (a few
// microseconds; workers spin briefly before sleeping so back-to-back calls
// stay cheap). A worker that is slow to wake (busy or oversubscribed
// machine) is not waited for: its chunk is run by whoever is free.
// Thread-safety: parallel_for() must be called from one thread at a time and
// is not reentrant (fn must not call parallel_for() on the same pool); both
// misuses are detected and throw std::logic_error. size() is safe anywhere.
// There is no global pool: whoever needs one creates it and passes it down.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace encore {

class ThreadPool {
 public:
  // fn(begin, end, thread): processes [begin, end); `thread` in [0, size())
  // identifies the executing thread (the caller is 0), for per-thread scratch.
  using RangeFn = std::function<void(int64_t begin, int64_t end, int thread)>;

  static constexpr int kMaxThreads = 4096;

  // 1 <= n_threads <= kMaxThreads (throws InvalidArgument otherwise); the
  // caller of parallel_for() counts as one of them.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Splits [0, n) statically into N = size() * chunks_per_thread contiguous
  // chunks, chunk c = [n*c/N, n*(c+1)/N); empty chunks are skipped. Threads
  // claim chunks as they become free, so with several chunks per thread one
  // that is slowed down (a busy core) does less of the work. The split
  // depends only on n, size() and chunks_per_thread; which thread runs a
  // chunk does not, so fn's results must depend only on [begin, end) (use
  // `thread` only to pick scratch).
  // Blocks until every chunk has finished. If chunks throw, the exception of
  // the lowest-numbered failing chunk is rethrown here after all chunks have
  // finished. n <= 0 does nothing. chunks_per_thread is clamped to
  // [1, kMaxChunks / size()]; with size() == 1, fn gets [0, n) in one call.
  // n < 2^63 / kMaxChunks (the chunk bounds are computed as n * c / N).
  void parallel_for(int64_t n, const RangeFn& fn, int chunks_per_thread = 1);
  static constexpr int kMaxChunks = 8192;

 private:
  void worker_main(int thread);
  // Claims and runs chunks of job `gen` until none are left.
  void run_chunks(uint64_t gen, int thread);

  const int n_threads_;
  std::vector<std::thread> workers_;

  // The current job; written by the caller before it publishes the job in
  // state_, read by a thread only after it has claimed one of its chunks.
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  // The job's chunk count: written by the caller before it publishes the
  // job, read by threads to know when none are left (atomic: a worker of
  // the previous job may read it while the next is being set up).
  std::atomic<int> n_chunks_{0};
  std::vector<std::exception_ptr> errors_;  // [kMaxChunks] one slot per chunk of a job

  // (generation << kChunkBits) | next unclaimed chunk. A claim is a CAS that
  // also checks the generation, so a late worker can never take a chunk of
  // a job that has already moved on; a finished job's counter is set to the
  // maximum, so none is left whatever the next job's chunk count.
  std::atomic<uint64_t> state_{0};
  std::atomic<int> chunks_done_{0};  // finished chunks of the current job
  std::atomic<bool> in_use_{false};  // detects reentrant/concurrent use
  bool stop_ = false;                // guarded by mutex_

  std::mutex mutex_;
  std::condition_variable wake_;  // workers wait here for a new job
  std::condition_variable done_;  // the caller waits here for the last chunk
};

}  // namespace encore
