// A fixed pool of persistent worker threads for data-parallel loops.
//
// Ownership: a ThreadPool owns n_threads - 1 worker threads, created in the
// constructor and joined in the destructor; the thread that calls
// parallel_for() is the remaining one. No threads are created per call.
// Cost: one parallel_for() wakes the workers, runs the chunks and waits for
// the slowest one (a few microseconds of overhead; workers spin briefly before
// sleeping so back-to-back calls stay cheap).
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
  // identifies the executing thread (index per-thread scratch with it).
  using RangeFn = std::function<void(int64_t begin, int64_t end, int thread)>;

  // n_threads >= 1 (throws InvalidArgument otherwise); the caller of
  // parallel_for() counts as one of them.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Splits [0, n) statically into size() contiguous chunks, chunk t =
  // [n*t/size(), n*(t+1)/size()) runs on thread t (the caller is thread 0),
  // empty chunks are skipped. Blocks until every chunk has finished. If any
  // chunk throws, the first exception (by thread index) is rethrown here
  // after all chunks have finished. n <= 0 does nothing.
  void parallel_for(int64_t n, const RangeFn& fn);

 private:
  void worker_main(int thread);
  void run_chunk(int thread);

  const int n_threads_;
  std::vector<std::thread> workers_;

  // The job of the current generation; written by the caller before the
  // generation counter is bumped, read by workers after they see the bump.
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  std::vector<std::exception_ptr> errors_;  // [n_threads], one slot each

  std::atomic<uint64_t> generation_{0};  // bumped once per parallel_for
  std::atomic<int> pending_{0};          // workers still running this job
  std::atomic<bool> in_use_{false};      // detects reentrant/concurrent use
  bool stop_ = false;                    // guarded by mutex_

  std::mutex mutex_;
  std::condition_variable wake_;  // workers wait here for a new generation
  std::condition_variable done_;  // the caller waits here for pending_ == 0
};

}  // namespace encore
