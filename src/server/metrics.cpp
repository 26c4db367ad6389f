#include "server/metrics.h"

#include <fmt/format.h>

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
                            int64_t in_flight) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
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
  header(out, "encore_prompt_tokens_total", "counter", "Prompt tokens of answered requests.");
  out += fmt::format("encore_prompt_tokens_total {}\n", prompt_tokens_);
  header(out, "encore_cached_prompt_tokens_total", "counter",
         "Prompt tokens served from the prefix cache or the state tiers.");
  out += fmt::format("encore_cached_prompt_tokens_total {}\n", cached_tokens_);
  header(out, "encore_generated_tokens_total", "counter", "Generated tokens of answered requests.");
  out += fmt::format("encore_generated_tokens_total {}\n", generated_tokens_);
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
  header(out, "encore_requests_in_flight", "gauge", "HTTP requests being answered.");
  out += fmt::format("encore_requests_in_flight {}\n", in_flight);
  header(out, "encore_queue_depth", "gauge",
         "Requests waiting for the scheduler (preempted ones too).");
  out += fmt::format("encore_queue_depth {}\n", e.requests_waiting);
  header(out, "encore_running_requests", "gauge", "Requests holding KV in the scheduler.");
  out += fmt::format("encore_running_requests {}\n", e.requests_running);
  header(out, "encore_kv_blocks", "gauge", "KV cache blocks by state.");
  out += fmt::format(
      "encore_kv_blocks{{state=\"used\"}} {}\nencore_kv_blocks{{state=\"cached\"}} {}\n"
      "encore_kv_blocks{{state=\"free\"}} {}\n",
      e.kv_blocks_used, e.kv_blocks_cached, e.kv_blocks_free);
  header(out, "encore_forward_steps_total", "counter", "Forward steps of the scheduler.");
  out += fmt::format("encore_forward_steps_total {}\n", e.steps);
  header(out, "encore_preemptions_total", "counter", "Requests preempted to free KV blocks.");
  out += fmt::format("encore_preemptions_total {}\n", e.preemptions);
  header(out, "encore_prefix_cache_lookups_total", "counter", "Prompt walks of the prefix cache.");
  out += fmt::format("encore_prefix_cache_lookups_total {}\n", e.prefix_lookups);
  header(out, "encore_prefix_cache_hit_blocks_total", "counter",
         "Blocks found in the prefix cache.");
  out += fmt::format("encore_prefix_cache_hit_blocks_total {}\n", e.prefix_hit_blocks);
  header(out, "encore_prefix_cache_evictions_total", "counter", "Cached blocks taken back.");
  out += fmt::format("encore_prefix_cache_evictions_total {}\n", e.prefix_evictions);
  header(out, "encore_session_restores_total", "counter", "KV blocks restored, by state tier.");
  out += fmt::format(
      "encore_session_restores_total{{tier=\"disk\"}} {}\n"
      "encore_session_restores_total{{tier=\"redis\"}} {}\n",
      e.blocks_restored_disk, e.blocks_restored_redis);
  header(out, "encore_sessions_loaded_total", "counter", "Session records continued.");
  out += fmt::format("encore_sessions_loaded_total {}\n", e.sessions_loaded);
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
  header(out, "encore_redis_errors_total", "counter", "Redis reads and writes that failed.");
  int64_t redis_errors = 0;
  for (const auto& [tier, c] : tiers) {
    if (tier == "redis") redis_errors += c.get_errors + c.put_errors;
  }
  out += fmt::format("encore_redis_errors_total {}\n", redis_errors);
  header(out, "encore_seeds_drawn_total", "counter", "Requests without a seed (one was drawn).");
  out += fmt::format("encore_seeds_drawn_total {}\n", e.seeds_drawn);
  return out;
}

}  // namespace encore::server
