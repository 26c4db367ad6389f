#include "server/shadow.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <limits>

#include "encore/error.h"

namespace encore::server {
namespace {

// The prefix-cache salt of one check: never a real tenant's (it begins
// with kInternalTenantMark) and never another check's, so a
// check shares no KV with any answer or check: its prompt is computed
// again. (Its blocks stay cached, unused, until the pool needs them.)
std::string check_tenant(const std::string& tenant, uint64_t number) {
  return fmt::format("{}check:{:016x}:{}", kInternalTenantMark,
                     XXH3_64bits(tenant.data(), tenant.size()), number);
}

}  // namespace

// Why two outputs of one request differ ("" when they do not), with the
// reason label for /metrics.
std::pair<std::string, std::string> output_difference(const Response& served,
                                                      const Response& check) {
  if (served.samples.size() != check.samples.size()) {
    return {"output", fmt::format("{} choices served, {} in the check", served.samples.size(),
                                  check.samples.size())};
  }
  for (size_t i = 0; i < served.samples.size(); ++i) {
    const SampleResult& a = served.samples[i];
    const SampleResult& b = check.samples[i];
    if (a.ids != b.ids) {
      size_t p = 0;
      while (p < a.ids.size() && p < b.ids.size() && a.ids[p] == b.ids[p]) ++p;
      return {"output",
              fmt::format("choice {}, token {}: served {}, check {} (output hash {} vs {})", i, p,
                          p < a.ids.size() ? std::to_string(a.ids[p]) : "the end",
                          p < b.ids.size() ? std::to_string(b.ids[p]) : "the end",
                          output_hash(a.ids), output_hash(b.ids))};
    }
    if (a.finish != b.finish) {
      return {"finish_reason",
              fmt::format("choice {}: finish reason {} served, {} in the check", i,
                          finish_reason_name(a.finish), finish_reason_name(b.finish))};
    }
  }
  return {};
}

ShadowChecker::ShadowChecker(Engine& engine, double rate, audit::AuditLog* audit, bool redact,
                             std::function<void(std::string_view)> log)
    : engine_(engine), rate_(rate), audit_(audit), redact_(redact), log_(std::move(log)) {
  counters_.mismatch["output"] = 0;
  counters_.mismatch["finish_reason"] = 0;
  for (const char* r : {"queue_full", "not_completed", "shutdown"}) counters_.skipped[r] = 0;
  thread_ = std::thread([this] { run(); });
}

ShadowChecker::~ShadowChecker() { stop(); }

bool ShadowChecker::offer(const std::string& id, const std::string& tenant, const Response& served,
                          const std::function<void(bool queued)>& before) {
  std::unique_lock<std::mutex> lock(mu_);
  bool due = false;
  if (!stopping_ && rate_ > 0) {
    credit_ += rate_;
    if (credit_ >= 1) {
      credit_ -= 1;
      due = true;
      if (static_cast<size_t>(counters_.pending) >= kMaxPending) {
        ++counters_.skipped["queue_full"];
        due = false;
      }
    }
  }
  const uint64_t number = due ? ++submitted_ : 0;
  if (due) ++counters_.pending;  // holds its place while it is submitted
  lock.unlock();
  before(due);
  if (!due) return false;
  Request q = served.effective;
  q.session.clear();
  q.persist = false;
  q.stream = false;
  q.logprobs = -1;  // never changes the ids
  q.priority = std::numeric_limits<int32_t>::min();
  q.tenant = check_tenant(tenant, number);
  Check c{id, tenant, served, {}, false};
  try {
    c.handle = engine_.submit(std::move(q));
    c.submitted = true;
  } catch (const Error& e) {
    // The engine ran it once: a refusal now is worth saying (not_run below).
    if (log_) log_(fmt::format("consistency: the check of {} was refused: {}", id, e.what()));
  }
  lock.lock();
  if (stopping_) {  // stop() has run: nobody would compare it
    c.handle.cancel();
    --counters_.pending;
    ++counters_.skipped["shutdown"];
    return false;
  }
  queue_.push_back(std::move(c));
  cv_.notify_one();
  return true;
}

void ShadowChecker::run() {
  for (;;) {
    Check c;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      c = std::move(queue_.front());
      queue_.pop_front();
      current_ = &c.handle;
    }
    compare(c);
  }
}

void ShadowChecker::compare(Check& c) {
  Response refused;
  refused.status = Response::Status::Failed;
  refused.error = "the engine refused the check";
  const Response& got = c.submitted ? c.handle.wait() : refused;
  std::string result = "identical", reason, detail;
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = nullptr;
    --counters_.pending;
    if (got.status != Response::Status::Ok) {
      result = "not_run";
      detail = got.error.empty() ? "cancelled" : got.error;
      ++counters_.skipped[stopping_ ? "shutdown" : "not_completed"];
    } else {
      std::tie(reason, detail) = output_difference(c.served, got);
      ++counters_.checks;
      if (!reason.empty()) {
        result = "mismatch";
        ++counters_.mismatch[reason];
      }
    }
  }
  if (result == "mismatch" && log_) {
    // Everything needed to run it again: the request's own audit record
    // (the request as the engine ran it, and what was served).
    const audit::Json req =
        audit::request_record(c.id, "consistency check", c.tenant, {"completed", "", 0}, &c.served,
                              engine_.info(), redact_);
    log_(fmt::format(
        "consistency: MISMATCH in request {} (tenant '{}'): {}; the request as the "
        "engine ran it and what was served: {}; `encore replay` on the audit log re-runs it",
        c.id, c.tenant, detail,
        req.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  }
  if (audit_ != nullptr) {
    audit::Json line;
    line["type"] = "check";
    line["id"] = c.id;
    line["tenant"] = c.tenant;
    line["result"] = result;
    if (!reason.empty()) line["reason"] = reason;
    if (!detail.empty()) line["detail"] = detail;
    if (got.status == Response::Status::Ok) {
      audit::Json hashes = audit::Json::array();
      for (const SampleResult& s : got.samples) hashes.push_back(output_hash(s.ids));
      line["output_hashes"] = std::move(hashes);
    }
    audit_->append(std::move(line));
  }
}

void ShadowChecker::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    for (Check& c : queue_) c.handle.cancel();
    if (current_ != nullptr) current_->cancel();
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

ConsistencyCounters ShadowChecker::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace encore::server
