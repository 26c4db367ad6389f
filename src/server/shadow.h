// Live consistency checks (`encore serve --shadow-rate R`): a fraction R of
// the completed requests is submitted again, as the engine ran it
// (Response::effective), at the lowest priority and under a prefix-cache
// salt of its own (so no KV is shared with any answer or other check: the
// prompt is computed again, in whatever batch the scheduler forms), and
// its outputs are compared with what was served. A mismatch is counted
// (/metrics), logged with what reproduces it, and recorded in the audit
// log as a "check" line after the request's own line.
//
// Ownership: borrows the Engine and the AuditLog (both outlive it); owns one
// thread and the checks in flight (at most kMaxPending; more are skipped,
// counted). Thread-safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "encore/audit.h"
#include "encore/engine.h"

namespace encore::server {

struct ConsistencyCounters {
  int64_t checks = 0;                       // compared
  std::map<std::string, int64_t> mismatch;  // by reason: output, finish_reason
  std::map<std::string, int64_t> skipped;   // by reason: queue_full, not_completed, shutdown
  int64_t pending = 0;                      // queued or running now
};

// How a check's outputs differ from the served ones: {reason, detail} with
// reason "output" (ids: the first differing choice and token) or
// "finish_reason"; {"", ""} when they are the same.
std::pair<std::string, std::string> output_difference(const Response& served,
                                                      const Response& check);

class ShadowChecker {
 public:
  static constexpr size_t kMaxPending = 64;

  // rate in [0, 1]: every 1/rate-th completed request is checked (a
  // running fraction, not a coin: rate 1 checks all, 0.5 every other).
  ShadowChecker(Engine& engine, double rate, audit::AuditLog* audit, bool redact,
                std::function<void(std::string_view)> log);
  ~ShadowChecker();  // stop()
  ShadowChecker(const ShadowChecker&) = delete;
  ShadowChecker& operator=(const ShadowChecker&) = delete;

  // After a completed answer (`id` as the audit log names it): decides
  // whether the rate says to check it, calls `before(queued)` (which writes
  // the request's audit line, so that it precedes its check's line), and
  // queues the check. False when not checked.
  bool offer(const std::string& id, const std::string& tenant, const Response& served,
             const std::function<void(bool queued)>& before);
  // Cancels the checks still queued (counted as skipped: shutdown) and
  // joins the thread. Idempotent.
  void stop();
  ConsistencyCounters counters() const;

 private:
  struct Check {
    std::string id, tenant;
    Response served;
    RequestHandle handle;
    bool submitted = false;  // false: the engine refused it (not run)
  };
  void run();
  void compare(Check& c);

  Engine& engine_;
  const double rate_;
  audit::AuditLog* audit_;
  const bool redact_;
  std::function<void(std::string_view)> log_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Check> queue_;
  RequestHandle* current_ = nullptr;  // the check being waited for
  double credit_ = 0;
  uint64_t submitted_ = 0;  // checks so far: each one's own prefix-cache salt
  bool stopping_ = false;
  ConsistencyCounters counters_;
  std::thread thread_;
};

}  // namespace encore::server
