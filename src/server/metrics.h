// Prometheus metrics of the server (text exposition format 0.0.4): counters
// with labels and histograms, kept here; gauges and engine counters are
// read from the engine when /metrics is scraped.
//
// Thread-safety: every method may be called from any thread (one mutex).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "encore/audit.h"
#include "encore/engine.h"
#include "server/shadow.h"

namespace encore::server {

// The endpoint label of a path: one of a fixed set, else "other" (a
// client's path never becomes a series).
std::string endpoint_label(const std::string& path);

class Metrics {
 public:
  // A finished HTTP request: endpoint ("/v1/completions" ...) and the status
  // it ended with (for an answer begun with 200 and then cut short: 499,
  // 503 or 504, see src/server/completions.cpp).
  void request(const std::string& endpoint, int status);
  void tokens(int64_t prompt, int64_t generated, int64_t cached);
  void time_to_first_token(double seconds);
  void inter_token_latency(double seconds);
  void rejected(const std::string& reason);  // "server_busy", "tenant_limit", "unauthorized" ...
  // How an admitted request ended: ok, cancelled, failed, timeout, disconnected.
  // Rejections: "server_busy", "tenant_limit", "unauthorized", "revoked",
  // "shutting_down", "slow_client", "too_many_connections", "uploads_per_address".
  void outcome(const std::string& what);

  // The whole exposition: these plus the engine's gauges and counters.
  std::string render(const EngineStats& engine,
                     const std::vector<std::pair<std::string, StoreCounters>>& tiers,
                     int64_t in_flight, int64_t connections) const;

 private:
  struct Histogram {
    static constexpr std::array<double, 14> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                       1,     2.5,  5,     10,   30,  60,   120};
    std::array<int64_t, kBounds.size()> counts{};  // cumulative at render time
    int64_t count = 0;
    double sum = 0;
    void observe(double v);
  };
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, int64_t> rejected_;
  std::map<std::string, int64_t> outcomes_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0, cached_tokens_ = 0;
  Histogram ttft_, itl_;
};

// The consistency checks' and the audit log's metrics (shadow.h, audit.h);
// either may be null (not configured: their series are left out).
std::string render_audit_metrics(const ConsistencyCounters* checks,
                                 const audit::WriterCounters* audit);

}  // namespace encore::server
