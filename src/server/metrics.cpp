#include "server/metrics.h"

#include <fmt/format.h>

#include <initializer_list>
#include <utility>

namespace encore::server {
namespace {

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

void Metrics::Histogram::observe(double v) {
  for (size_t i = 0; i < kBounds.size(); ++i) {
    if (v <= kBounds[i]) {
      ++counts[i];
      break;
    }
  }
  ++count;
  sum += v;
}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::tokens(int64_t prompt, int64_t generated, int64_t cached) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
  cached_tokens_ += cached;
}

void Metrics::time_to_first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::inter_token_latency(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(seconds);
}

std::string endpoint_label(const std::string& path) {
  for (const char* known :
       {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}) {
    if (path == known) return known;
  }
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

void Metrics::outcome(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  ++outcomes_[what];
}

void Metrics::rejected(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++rejected_[reason];
}

std::string Metrics::render(const EngineStats& e,
                            const std::vector<std::pair<std::string, StoreCounters>>& tiers,
                            int64_t in_flight, int64_t connections) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  // A metric of one series without labels: its HELP/TYPE header and value.
  auto single = [&](const char* name, const char* type, const char* help, int64_t value) {
    header(out, name, type, help);
    out += fmt::format("{} {}\n", name, value);
  };
  // A metric of a few series told apart by one label: its header, then one
  // line per (label value, count), in the order given.
  auto labelled = [&](const char* name, const char* type, const char* help, const char* label,
                      std::initializer_list<std::pair<const char*, int64_t>> series) {
    header(out, name, type, help);
    for (const auto& [value, n] : series) {
      out += fmt::format("{}{{{}=\"{}\"}} {}\n", name, label, value, n);
    }
  };
  header(out, "encore_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (const auto& [key, n] : requests_) {
    out += fmt::format("encore_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, n);
  }
  header(out, "encore_requests_rejected_total", "counter",
         "Requests refused before they ran, by reason.");
  for (const auto& [reason, n] : rejected_) {
    out += fmt::format("encore_requests_rejected_total{{reason=\"{}\"}} {}\n", reason, n);
  }
  header(out, "encore_requests_finished_total", "counter",
         "Admitted requests by how they ended (ok, cancelled, failed, timeout, disconnected).");
  for (const auto& [what, n] : outcomes_) {
    out += fmt::format("encore_requests_finished_total{{outcome=\"{}\"}} {}\n", what, n);
  }
  single("encore_prompt_tokens_total", "counter", "Prompt tokens of answered requests.",
         prompt_tokens_);
  single("encore_cached_prompt_tokens_total", "counter",
         "Prompt tokens served from the prefix cache or the state tiers.", cached_tokens_);
  single("encore_generated_tokens_total", "counter", "Generated tokens of answered requests.",
         generated_tokens_);
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    header(out, name, "histogram", help);
    int64_t cumulative = 0;
    for (size_t i = 0; i < Histogram::kBounds.size(); ++i) {
      cumulative += h.counts[i];
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, Histogram::kBounds[i], cumulative);
    }
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, h.count, name,
                       h.sum, name, h.count);
  };
  histogram("encore_time_to_first_token_seconds", "Submission to the first generated token.",
            ttft_);
  histogram("encore_inter_token_latency_seconds", "Time between generated tokens of a stream.",
            itl_);
  single("encore_requests_in_flight", "gauge", "HTTP requests being answered.", in_flight);
  single("encore_open_connections", "gauge", "Client connections open now.", connections);
  single("encore_queue_depth", "gauge", "Requests waiting for the scheduler (preempted ones too).",
         e.requests_waiting);
  single("encore_running_requests", "gauge", "Requests holding KV in the scheduler.",
         e.requests_running);
  labelled(
      "encore_kv_blocks", "gauge", "KV cache blocks by state.", "state",
      {{"used", e.kv_blocks_used}, {"cached", e.kv_blocks_cached}, {"free", e.kv_blocks_free}});
  single("encore_forward_steps_total", "counter", "Forward steps of the scheduler.", e.steps);
  single("encore_preemptions_total", "counter", "Requests preempted to free KV blocks.",
         e.preemptions);
  single("encore_prefix_cache_lookups_total", "counter", "Prompt walks of the prefix cache.",
         e.prefix_lookups);
  single("encore_prefix_cache_hit_blocks_total", "counter", "Blocks found in the prefix cache.",
         e.prefix_hit_blocks);
  single("encore_prefix_cache_evictions_total", "counter", "Cached blocks taken back.",
         e.prefix_evictions);
  labelled("encore_session_restores_total", "counter", "KV blocks restored, by state tier.", "tier",
           {{"disk", e.blocks_restored_disk}, {"redis", e.blocks_restored_redis}});
  single("encore_requests_restored_total", "counter",
         "Requests whose KV came in part from the state tiers (not RAM, not recomputed).",
         e.requests_restored);
  single("encore_sessions_loaded_total", "counter", "Session records continued.",
         e.sessions_loaded);
  header(out, "encore_state_fallbacks_total", "counter",
         "Stored records that could not be used, by reason (recomputed).");
  for (const auto& [tier, c] : tiers) {
    for (int r = 0; r < kStoreMissReasons; ++r) {
      out += fmt::format("encore_state_fallbacks_total{{tier=\"{}\",reason=\"{}\"}} {}\n", tier,
                         store_miss_name(static_cast<StoreMiss>(r)), c.rejected[r]);
    }
  }
  out += fmt::format("encore_state_fallbacks_total{{tier=\"engine\",reason=\"mismatch\"}} {}\n",
                     e.state_fallbacks);
  single("encore_state_write_errors_total", "counter",
         "State records not written (a tier failed or the write queue was full).",
         e.state_write_errors);
  single("encore_state_write_queue_bytes", "gauge",
         "State records waiting for the tiers or being written.", e.state_bytes_pending);
  header(out, "encore_redis_errors_total", "counter", "Redis reads and writes that failed.");
  int64_t redis_errors = 0;
  for (const auto& [tier, c] : tiers) {
    if (tier == "redis") redis_errors += c.get_errors + c.put_errors;
  }
  out += fmt::format("encore_redis_errors_total {}\n", redis_errors);
  single("encore_seeds_drawn_total", "counter", "Requests without a seed (one was drawn).",
         e.seeds_drawn);
  single("encore_seeds_derived_total", "counter",
         "Requests without a seed (one was derived from the --derive-seed secret).",
         e.seeds_derived);
  single("encore_seeds_session_total", "counter",
         "New turns of a session without a seed (the session's seed + the turn's index).",
         e.seeds_session);
  single("encore_seed_reuse_total", "counter",
         "Requests giving a seed their tenant gave recently with another prompt (counted, not "
         "refused).",
         e.seeds_reused);
  return out;
}

std::string render_audit_metrics(const ConsistencyCounters* checks,
                                 const audit::WriterCounters* audit) {
  std::string out;
  auto by_reason = [&](const char* name, const char* help,
                       const std::map<std::string, int64_t>& series) {
    header(out, name, "counter", help);
    for (const auto& [reason, n] : series) {
      out += fmt::format("{}{{reason=\"{}\"}} {}\n", name, reason, n);
    }
  };
  if (checks != nullptr) {
    header(out, "encore_consistency_checks_total", "counter",
           "Completed requests run again (--shadow-rate) and compared with what was served.");
    out += fmt::format("encore_consistency_checks_total {}\n", checks->checks);
    by_reason("encore_consistency_mismatches_total",
              "Checks whose outputs differed from what was served, by reason (0 is the promise).",
              checks->mismatch);
    by_reason("encore_consistency_skipped_total",
              "Checks not made, by reason (queue_full, not_completed, shutdown).", checks->skipped);
    header(out, "encore_consistency_pending", "gauge", "Checks queued or running now.");
    out += fmt::format("encore_consistency_pending {}\n", checks->pending);
  }
  if (audit != nullptr) {
    header(out, "encore_audit_lines_total", "counter", "Lines written to the audit log.");
    out += fmt::format("encore_audit_lines_total {}\n", audit->lines);
    header(out, "encore_audit_queue_bytes", "gauge",
           "Audit records queued for the writer or being written.");
    out += fmt::format("encore_audit_queue_bytes {}\n", audit->bytes_pending);
    header(out, "encore_audit_write_errors_total", "counter",
           "Failed audit log writes and rotations (retried every second).");
    out += fmt::format("encore_audit_write_errors_total {}\n", audit->write_errors);
    header(out, "encore_audit_dropped_total", "counter",
           "Audit records never written: the writer was stuck for 30 s (a failing disk).");
    out += fmt::format("encore_audit_dropped_total {}\n", audit->dropped);
    header(out, "encore_audit_rotations_total", "counter", "Audit log files rotated by size.");
    out += fmt::format("encore_audit_rotations_total {}\n", audit->rotations);
  }
  return out;
}

}  // namespace encore::server
