// `encore serve`: an OpenAI-compatible HTTP server over an Engine.
//
// Endpoints: POST /v1/completions, POST /v1/chat/completions (OpenAI's
// request and response shapes, Server-Sent Events when stream is true),
// GET /v1/models, GET /health (200 when the engine is ready, 503 before),
// GET /metrics (Prometheus text format). Every answer carries the
// system_fingerprint and the seed used; per choice an output_hash.
//
// Tenants: with an API-key file (lines `KEY TENANT [max_in_flight=N]
// [revoked]`), `Authorization: Bearer KEY` is required (401 without or with
// an unknown key, 403 for a revoked one) and the key's tenant — never a
// client-supplied field — salts the prefix cache and session keys. Limits:
// body size (413), prompt vs context (400), requests in flight over all
// tenants (503 with Retry-After) and per tenant (429 with Retry-After), a
// per-request timeout. A client that disconnects cancels its request: its
// KV is freed at the next step. drain() stops taking requests and waits for
// the ones in flight.
//
// Ownership: borrows the Engine (set_engine), which must outlive it; owns
// its listening socket and HTTP worker threads.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "encore/engine.h"

namespace encore {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (see Server::port())
  std::string api_keys_file;          // "": no authentication, one tenant ("")
  std::string model_name = "encore";  // the id /v1/models reports
  std::string chat_template;          // family for chat requests when the model has no template
  size_t max_body_bytes = 8u << 20;
  int max_in_flight = 64;    // requests answered at once over all tenants; more get 503
  int tenant_in_flight = 0;  // default per-tenant limit (0: max_in_flight); more get 429
  int http_threads = 0;      // 0: 2 x max_in_flight + 8 (slow or idle clients also hold one)
  std::chrono::seconds request_timeout{600};
  // Each read of a request's headers and body must progress within
  // read_timeout, and the whole request must have arrived read_deadline
  // after its first byte: a client that stalls or trickles ("slowloris") is
  // cut off (counted as rejected, reason slow_client).
  std::chrono::seconds read_timeout{10};
  std::chrono::milliseconds read_deadline{30000};
};

class Server {
 public:
  // Binds the socket. Throws InvalidArgument for bad options or an API-key
  // file that does not parse (naming the line), Error when it cannot bind.
  static std::unique_ptr<Server> create(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  // The engine to serve; until it is set, /health says 503 and requests get
  // 503 too (the model is still loading).
  void set_engine(Engine* engine);
  // Serves until stop(); returns after the last connection closed.
  void run();
  // Stops taking requests (503), waits up to `grace` for those in flight to
  // finish, then stops the server (run() returns).
  void drain_and_stop(std::chrono::seconds grace);

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace encore
