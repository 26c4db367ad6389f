// `encore serve`: an OpenAI-compatible HTTP server over an Engine.
//
// Endpoints: POST /v1/completions, POST /v1/chat/completions (OpenAI's
// request and response shapes, Server-Sent Events when stream is true),
// GET /v1/models and /v1/models/{id}, GET /health (200 when the engine is
// ready, 503 while loading or draining), GET /metrics (Prometheus text
// format). Every answer carries the system_fingerprint and the seed used;
// per choice an output_hash.
//
// Tenants: with an API-key file (lines `KEY TENANT [max_in_flight=N]
// [state_mib=N] [revoked]`), `Authorization: Bearer KEY` is required (401 without or with
// an unknown key, 403 for a revoked one), decided from the headers before
// any body byte is read, and the key's tenant — never a client-supplied
// field — salts the prefix cache and session keys. A continuation of a
// session_id with nothing saved is a 404 with code session_not_found.
//
// Hostile clients (docs/serving.md, "Limits and hostile clients"): the
// transport (src/server/http_server.h) bounds connections in all and per
// client address, header bytes and fields, body bytes whatever the framing,
// and the time a request may take to arrive; malformed requests are answered
// and their connection closed. Requests: prompt vs context (400), requests
// in flight over all tenants (503 with Retry-After) and per tenant (429 with
// Retry-After), a per-request timeout (504, or a timeout error in the body
// once the answer has begun). A client that disconnects cancels its request:
// its KV is freed at the next step. drain_and_stop() stops taking requests,
// waits for the ones in flight up to a grace period, then cancels the rest.
//
// Audit (docs/audit.md): with ServerOptions::audit, every completion request
// whose body was read gets one line in a hash-chained log; with
// shadow_rate, that fraction of completed requests is run again and
// compared (/metrics encore_consistency_*; a "check" line in the log).
//
// Ownership: borrows the Engine (set_engine), which must outlive it; owns
// its listening socket, its I/O threads and one thread per request being
// answered.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "encore/audit.h"
#include "encore/engine.h"
#include "encore/settings.h"

namespace encore {

// The numeric limits' defaults, ranges and help are the settings table's
// (settings.h, where visit_settings pairs them with the members); Server::create
// checks them there.
struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = settings::kPort.int_default();  // 0: any free port (see Server::port())
  std::string api_keys_file;                 // "": no authentication, one tenant ("")
  std::string model_name = "encore";         // the id /v1/models reports
  // A family (chat_template.h) for every chat request instead of the model's
  // Jinja template (or --chat-template-file's); "": the template.
  std::string chat_template;
  // Per request, whatever the framing (413).
  size_t max_body_bytes = static_cast<size_t>(settings::kMaxBodyBytes.def);
  // Request line and headers (431); at most 100 fields.
  size_t max_header_bytes = static_cast<size_t>(settings::kMaxHeaderBytes.def);
  // Requests answered at once over all tenants; more get 503.
  int max_in_flight = settings::kMaxInFlight.int_default();
  // Default per-tenant limit (0: max_in_flight); more get 429.
  int tenant_in_flight = settings::kTenantInFlight.int_default();
  // Open connections; more are shed at accept (503).
  int max_connections = settings::kMaxConnections.int_default();
  // Per client address (0: none, e.g. behind a proxy).
  int max_connections_per_ip = settings::kMaxConnectionsPerIp.int_default();
  // Threads serving every connection's reads and writes.
  int io_threads = settings::kIoThreads.int_default();
  // A request may take this long from submission to its last byte (504, or
  // a timeout error in the body once the answer has begun).
  std::chrono::seconds request_timeout{settings::kRequestTimeout.int_default()};
  // Each read of a request's headers and body must progress within
  // read_timeout, and the whole request must have arrived read_deadline
  // after its first byte: a client that stalls or trickles ("slowloris") is
  // answered 408 and cut off (counted as rejected, reason slow_client).
  std::chrono::seconds read_timeout{settings::kReadTimeout.int_default()};
  std::chrono::milliseconds read_deadline{static_cast<int64_t>(settings::kReadDeadline.def * 1000)};
  // A kept-alive connection waiting for its next request.
  std::chrono::seconds idle_timeout{settings::kIdleTimeout.int_default()};
  // One line per completion request whose body was read (answered,
  // cancelled, failed or refused), docs/audit.md; no path: none.
  audit::AuditOptions audit;
  // Fraction of completed requests run again and compared (shadow.h in
  // src/server; /metrics encore_consistency_*).
  double shadow_rate = settings::kShadowRate.def;
  // Remarks (an audit log write error, a consistency mismatch); thread-safe.
  std::function<void(std::string_view)> log;
  // Every request's text is normalized (Request::normalize_input), whatever
  // the request says: the operator's choice holds for every client.
  bool normalize_input = settings::kNormalizeInput.def != 0;
};

class Server {
 public:
  // Binds the socket. Throws InvalidArgument for options outside the
  // settings table's ranges (field() names the option) or an API-key file
  // that does not parse (naming the line), Error when it cannot bind.
  static std::unique_ptr<Server> create(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  // Each tenant's share of the state tiers from the API-key file's
  // `state_mib=N` (EngineOptions::tenant_shares.bytes); empty without keys.
  std::map<std::string, uint64_t> tenant_state_shares() const;
  // The engine to serve; until it is set, /health says 503 and requests get
  // 503 too (the model is still loading).
  void set_engine(Engine* engine);
  // Serves until stop(); returns after the last connection closed.
  void run();
  // Stops taking requests (503; /health says "draining"), waits up to
  // `grace` for those in flight to finish, then cancels what is still
  // running (a stream ends with finish_reason "cancelled" and an error event
  // with code "shutting_down"), closes every connection and stops the server
  // (run() returns). Returns within grace plus a few seconds. `delay`: the
  // port stays open at least this long (new requests 503, /health
  // "draining"), for a load balancer's health checks to notice first; a
  // connection it opened just as the port closed would get no answer.
  void drain_and_stop(std::chrono::seconds grace,
                      std::chrono::seconds delay = std::chrono::seconds(0));

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace encore
