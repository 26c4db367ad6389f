// ThreadPool: static chunking, caller participation, exception propagation,
// misuse detection, many back-to-back jobs.
#include "encore/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "encore/error.h"

namespace encore {
namespace {

TEST(ThreadPool, RejectsBadThreadCounts) {
  EXPECT_THROW(ThreadPool(0), InvalidArgument);
  EXPECT_THROW(ThreadPool(-3), InvalidArgument);
  EXPECT_THROW(ThreadPool(ThreadPool::kMaxThreads + 1), InvalidArgument);
}

TEST(ThreadPool, CoversRangeOnceWithStaticContiguousChunks) {
  for (auto [threads, per_thread] :
       {std::pair{1, 1}, {2, 1}, {3, 1}, {4, 1}, {7, 1}, {2, 4}, {3, 5}, {2, 100000}}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    // chunks_per_thread is clamped to kMaxChunks in all (not for 1 thread:
    // that runs [0, n) on the caller in one piece).
    const int n_chunks =
        threads == 1 ? 1 : threads * std::min(per_thread, ThreadPool::kMaxChunks / threads);
    for (int64_t n : {1, 2, 3, 5, 16, 100, 1001, 20000}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      std::mutex mu;
      std::set<std::pair<int64_t, int64_t>> chunks;
      pool.parallel_for(
          n,
          [&](int64_t begin, int64_t end, int thread) {
            ASSERT_LT(begin, end);  // empty chunks are skipped
            ASSERT_GE(thread, 0);
            ASSERT_LT(thread, threads);
            {
              std::lock_guard<std::mutex> lock(mu);
              chunks.insert({begin, end});
            }
            for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
          },
          per_thread);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(hits[static_cast<size_t>(i)], 1) << "n=" << n << " i=" << i;
      }
      // Exactly the documented split: chunk c = [n*c/N, n*(c+1)/N), non-empty ones.
      std::set<std::pair<int64_t, int64_t>> want;
      for (int c = 0; c < n_chunks; ++c) {
        const int64_t b = n * c / n_chunks, e = n * (c + 1) / n_chunks;
        if (b < e) want.insert({b, e});
      }
      EXPECT_EQ(chunks, want) << "n=" << n << " threads=" << threads;
    }
  }
}

// With several chunks per thread, a thread held up in one chunk leaves the
// others to whoever is free: here the chunk that blocks waits until every
// other chunk is done, which only another thread can do. With one chunk per
// thread the other thread would have a single chunk, and the wait would end
// on its timeout with chunks left over.
TEST(ThreadPool, AThreadHeldUpLeavesItsShareToTheOthers) {
  ThreadPool pool(2);
  constexpr int kPerThread = 4;
  std::atomic<int> done{0};
  std::atomic<bool> first{true};
  std::atomic<int> blocked_thread{-1};
  std::mutex mu;
  std::map<int, int> chunks_by_thread;
  pool.parallel_for(
      80,
      [&](int64_t, int64_t, int thread) {
        {
          std::lock_guard<std::mutex> lock(mu);
          ++chunks_by_thread[thread];
        }
        if (first.exchange(false)) {
          blocked_thread = thread;
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
          while (done.load() < 2 * kPerThread - 1 && std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }
        ++done;
      },
      kPerThread);
  EXPECT_EQ(done.load(), 2 * kPerThread);
  EXPECT_EQ(chunks_by_thread[blocked_thread.load()], 1);
  EXPECT_EQ(chunks_by_thread[1 - blocked_thread.load()], 2 * kPerThread - 1);
}

TEST(ThreadPool, ThreadIndexIdentifiesTheExecutingThread) {
  ThreadPool pool(3);
  std::mutex mu;
  std::map<int, std::set<std::thread::id>> ids;
  for (int job = 0; job < 200; ++job) {
    pool.parallel_for(3, [&](int64_t, int64_t, int thread) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      std::lock_guard<std::mutex> lock(mu);
      ids[thread].insert(std::this_thread::get_id());
    });
  }
  ASSERT_TRUE(ids.count(0));
  EXPECT_EQ(ids[0], std::set<std::thread::id>{std::this_thread::get_id()});
  std::set<std::thread::id> all;
  for (const auto& [t, s] : ids) {
    EXPECT_EQ(s.size(), 1u) << "thread index " << t << " ran on several threads";
    all.insert(s.begin(), s.end());
  }
  EXPECT_EQ(all.size(), ids.size());  // distinct indices are distinct threads
}

TEST(ThreadPool, PerThreadScratchIsNeverShared) {
  // fn may index scratch by `thread`: two chunks never run concurrently on
  // the same index.
  ThreadPool pool(4);
  std::vector<std::atomic<int>> busy(4);
  std::atomic<int> clashes{0};
  for (int job = 0; job < 2000; ++job) {
    pool.parallel_for(16, [&](int64_t, int64_t, int thread) {
      if (busy[static_cast<size_t>(thread)].fetch_add(1) != 0) ++clashes;
      busy[static_cast<size_t>(thread)].fetch_sub(1);
    });
  }
  EXPECT_EQ(clashes.load(), 0);
}

TEST(ThreadPool, EmptyRangeDoesNothing) {
  ThreadPool pool(2);
  bool called = false;
  pool.parallel_for(0, [&](int64_t, int64_t, int) { called = true; });
  pool.parallel_for(-5, [&](int64_t, int64_t, int) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ThreadPool, ManyBackToBackJobs) {
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 20000; ++job) {
    pool.parallel_for(8, [&](int64_t b, int64_t e, int) { total += e - b; });
  }
  EXPECT_EQ(total.load(), 20000 * 8);
}

// Back-to-back jobs of different chunk counts: a worker finishing the last
// chunk of one job must never take part of the next one as a chunk of the
// old (it once could when the next job had more chunks: the count of chunks
// done then overshot and parallel_for waited forever, or returned early).
// Every element of every job runs exactly once.
TEST(ThreadPool, BackToBackJobsOfDifferentChunkCounts) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(64);
    for (int job = 0; job < 100000; ++job) {
      const int per_thread = 1 + (job % 3) * 3;  // 1, 4, 7 chunks per thread
      pool.parallel_for(
          64,
          [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
          },
          per_thread);
      if (job % 1000 == 999) {
        for (auto& h : hits) ASSERT_EQ(h.exchange(0), 1000) << "job " << job;
      }
    }
  }
}

TEST(ThreadPool, PropagatesExceptionAfterAllChunksFinish) {
  ThreadPool pool(4);
  std::atomic<int> finished{0};
  try {
    pool.parallel_for(4, [&](int64_t b, int64_t, int) {
      if (b == 2) throw std::runtime_error("chunk " + std::to_string(b) + " failed");
      ++finished;
    });
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "chunk 2 failed");
  }
  EXPECT_EQ(finished.load(), 3);
  // The pool is still usable afterwards.
  std::atomic<int> count{0};
  pool.parallel_for(4, [&](int64_t b, int64_t e, int) { count += static_cast<int>(e - b); });
  EXPECT_EQ(count.load(), 4);
}

TEST(ThreadPool, RethrowsTheLowestFailingChunksException) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(3,
                                 [&](int64_t b, int64_t, int) {
                                   if (b == 0) throw InvalidArgument("first chunk");
                                 }),
               InvalidArgument);
  for (int rep = 0; rep < 20; ++rep) {
    try {
      pool.parallel_for(3, [&](int64_t b, int64_t, int) {
        if (b > 0) throw std::runtime_error("chunk " + std::to_string(b));
      });
      ADD_FAILURE() << "expected an exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "chunk 1");
    }
  }
  ThreadPool single(1);
  EXPECT_THROW(single.parallel_for(1, [](int64_t, int64_t, int) { throw InvalidArgument("x"); }),
               InvalidArgument);
  // Usable after a throw on the single-thread path too.
  int calls = 0;
  single.parallel_for(5, [&](int64_t b, int64_t e, int t) {
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 5);
    EXPECT_EQ(t, 0);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

TEST(ThreadPool, ReentrantCallIsDetected) {
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    EXPECT_THROW(
        pool.parallel_for(
            1, [&](int64_t, int64_t, int) { pool.parallel_for(1, [](int64_t, int64_t, int) {}); }),
        std::logic_error);
    int ok = 0;
    pool.parallel_for(1, [&](int64_t, int64_t, int) { ++ok; });
    EXPECT_EQ(ok, 1);
  }
}

TEST(ThreadPool, WorksAtTheMaximumThreadCount) {
  // Claiming the last of kMaxThreads chunks must not carry the claim counter
  // into the generation bits (workers would see a phantom job: chunks run
  // twice, the caller waits forever or returns while chunks still run).
  constexpr int kThreads = ThreadPool::kMaxThreads;
  ThreadPool pool(kThreads);
  const int64_t n = 3 * int64_t{kThreads} + 5;
  for (int job = 0; job < 3; ++job) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int> calls{0};
    pool.parallel_for(n, [&](int64_t begin, int64_t end, int thread) {
      ASSERT_GE(thread, 0);
      ASSERT_LT(thread, kThreads);
      for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      calls.fetch_add(1);
    });
    EXPECT_EQ(calls.load(), kThreads) << "job " << job;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "job " << job << " i=" << i;
    }
  }
}

TEST(ThreadPool, DestroysCleanlyWhileIdleOrRightAfterAJob) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(3);
    if (i % 2) pool.parallel_for(3, [](int64_t, int64_t, int) {});
  }
}

}  // namespace
}  // namespace encore
