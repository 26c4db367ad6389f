// The engine's use of the persistent tiers (store.h): KV blocks restored
// into the pool instead of recomputed, and, for requests that ask for it,
// their blocks and session records written out.
//
// A block record ("block/<hash>", under the system fingerprint and the
// tenant) holds the pool layout, the block's parent hash and chain root, its
// token ids and its bytes; a restore checks every one of them against what
// the asking sequence expects, so a record can only stand in for the exact
// K/V bits a recompute would write (docs/invariance.md). Anything else is a
// fallback: logged, counted, recomputed.
//
// Threads: restore() and capture() run on the scheduler thread (they touch
// the pool); writes go through a queue to one writer thread, so no step
// waits for a disk or Redis. flush() waits for the queue to empty.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "encore/kv_cache.h"
#include "encore/run_state.h"
#include "encore/store.h"

namespace encore {

struct Job;

struct PersistCounters {
  int64_t blocks_restored = 0;
  int64_t blocks_saved = 0;     // queued for writing
  int64_t block_fallbacks = 0;  // a record was found but did not match (recomputed)
  int64_t sessions_saved = 0;
  int64_t sessions_loaded = 0;
  int64_t session_fallbacks = 0;  // a session record that could not be used
  int64_t write_errors = 0;
  int64_t restored_from[2] = {};  // by tier: [0] first (disk), [1] second (Redis)
  int64_t bytes_pending = 0;      // now: queued or being written (a gauge)
};

// What looking a session up found: the session, or why there is none.
struct SessionLoad {
  std::optional<RunState> state;  // set: found and usable
  enum class Absent {
    Missing,     // no record (never saved, removed, or expired and gone)
    Expired,     // a record past its time to live
    Unusable,    // a record that could not be used (damaged, does not parse ...)
    OtherModel,  // saved under another system fingerprint (model, build, KV type)
  };
  Absent absent = Absent::Missing;  // when !state
  std::string detail;               // Unusable: why; OtherModel: that fingerprint
  // Why session `id` is absent, in words ("no saved session 'ID' for this
  // tenant (...)").
  std::string why(const std::string& id) const;
};

class Persistence {
 public:
  // Owns the tiers; starts the writer thread.
  Persistence(std::unique_ptr<TieredStore> store, std::string system_fingerprint, KvBlockPool& pool,
              std::chrono::milliseconds ttl, StoreLog log);
  ~Persistence();  // writes what is queued, then stops
  Persistence(const Persistence&) = delete;
  Persistence& operator=(const Persistence&) = delete;

  // A block for `key` and `tokens` from the tiers, copied into a fresh pool
  // block and published in the prefix cache; -1 if none (or no free block).
  int32_t restore(const std::string& tenant, const BlockKey& key, std::span<const int32_t> tokens);
  // Queues the full blocks of sample i of `job` (those not written before)
  // for writing. Called before the sample's blocks are released.
  void capture(const Job& job, int i);
  // Queues the session record of `job` after its blocks. on_written (may be
  // empty) runs on the writer thread once the record and every write queued
  // before it were tried: written, or failed in a tier (counted, logged: e.g.
  // Redis down). Session records are never dropped for room.
  void save_session(const std::string& tenant, const std::string& session, RunState state,
                    std::function<void()> on_written = {});
  // The session record, or why there is none: the newest of every tier's
  // (RunState::generation, then saved_ms), since a session that went on on
  // another replica has a newer turn in Redis than this one's directory (an unusable record is
  // logged; one that does not parse or was made by another model is counted
  // as a fallback). A record still queued or being written is read from the
  // queue (the newest one): a continuation sent right after its answer
  // finds it. look_elsewhere: when there is none, ask the tiers whether
  // another model left one under that name (costs a directory walk and a
  // Redis SCAN, so only for explicit continuations).
  SessionLoad load_session(const std::string& tenant, const std::string& session,
                           bool look_elsewhere);
  // Blocks until every queued write is done (or failed).
  void flush();

  PersistCounters counters() const;
  const std::string& fingerprint() const { return fingerprint_; }
  std::vector<std::pair<std::string, StoreCounters>> tier_counters() const;

 private:
  struct Write {
    std::vector<std::pair<StoreKey, std::string>> items;
    size_t above = SIZE_MAX;  // only the tiers before this one (a promotion); else all
    std::chrono::milliseconds ttl{0};
    size_t bytes = 0;
    std::function<void()> done;  // after the write (failed or not), outside the lock
    bool session = false;        // a session record: never dropped for room
  };
  // Queues a copy of a hit for the tiers above the one that had it, with
  // the time it has left.
  void promote(const TieredStore::Hit& hit, const StoreKey& key);
  void writer_main();
  // The newest queued or in-flight payload of key, if any.
  std::optional<std::string> pending(const StoreKey& key) const;
  void enqueue(Write w);
  StoreKey key(const std::string& tenant, std::string name) const;

  std::unique_ptr<TieredStore> store_;
  const std::string fingerprint_;
  KvBlockPool& pool_;
  const std::chrono::milliseconds ttl_;
  StoreLog log_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<Write> queue_;
  size_t queued_bytes_ = 0;  // bounded: past kMaxQueuedBytes the oldest block writes are dropped
  bool writing_ = false;
  // The write the writer thread is doing (while writing_; empty otherwise).
  // Assigned under mu_; the writer reads it without the lock, pending() with
  // it: reads only.
  Write current_;
  bool stop_ = false;
  PersistCounters c_;
  // Blocks this process has already queued (content-addressed: writing one
  // again would store the same bytes). Bounded: cleared past 1M entries.
  std::unordered_set<std::string> written_;
  std::thread writer_;
};

}  // namespace encore
