// Server::Impl: the application behind the HTTP transport (server.cpp: the
// routes, admission, shutdown; completions.cpp: a completion request from
// its body to its last byte). Internal to src/server.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "encore/server.h"
#include "server/auth.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_response.h"
#include "server/shadow.h"

namespace encore {

// Threads that answer one admitted request each (they wait on the engine and
// write the answer); joined when they end and at shutdown. Their number is
// bounded by admission (ServerOptions::max_in_flight).
class RequestThreads {
 public:
  // False (and `work` not run) once join_all() has begun.
  bool spawn(std::function<void()> work);
  // Takes no new threads from here on, and joins those there are.
  void join_all();
  ~RequestThreads() { join_all(); }

 private:
  struct Entry {
    std::thread t;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex mu_;
  std::vector<Entry> threads_;
  bool stopped_ = false;
};

struct Server::Impl {
  ServerOptions opt;
  server::ApiKeys keys;
  bool auth = false;
  server::Metrics metrics;
  std::unique_ptr<server::HttpServer> http;
  std::atomic<Engine*> engine{nullptr};
  uint64_t id_salt = 0;
  std::atomic<uint64_t> next_id{0};
  RequestThreads workers;
  std::unique_ptr<audit::AuditLog> audit_log;     // opened by create()
  std::unique_ptr<server::ShadowChecker> shadow;  // made by set_engine() when shadow_rate > 0

  std::mutex mu;
  std::condition_variable idle;
  int in_flight = 0;
  std::unordered_map<std::string, int> by_tenant;
  // Admitted requests whose body is still arriving, per client address: at
  // most max_uploads_per_address() each, so that one address trickling
  // bodies cannot hold every place in flight.
  std::unordered_map<std::string, int> uploading;
  bool draining = false;
  std::atomic<bool> shutting_down{false};  // the grace is over: what still runs is cancelled
  // Requests submitted to the engine, for the cancel at shutdown.
  std::unordered_set<std::shared_ptr<RequestHandle>> running;

  // A completion request admitted from its headers (server.cpp), kept in
  // Exchange::state until its answer ends: holds its place among those in
  // flight.
  struct Admitted {
    Impl* m = nullptr;
    std::string tenant;
    std::string address;  // the client's, while its body is arriving ("" after)
    bool chat = false;
    void body_received();  // gives back the place among uploads
    ~Admitted();
  };
  int max_uploads_per_address() const;

  // server.cpp
  server::HttpHandlers handlers();
  std::optional<server::Reply> on_head(server::Exchange& ex);
  void on_request(std::shared_ptr<server::Exchange> ex);
  std::optional<server::Reply> admit(server::Exchange& ex, bool chat);
  server::Reply models(const std::string& path);
  server::Reply health();
  server::Reply metrics_page();

  // completions.cpp: parse, submit, wait and write; on a request thread.
  void complete(server::Exchange& ex);
  // The audit line of a finished request (and its consistency check, when
  // one is due); `r` is null for a request refused before it ran.
  void record(const std::string& id, const std::string& endpoint, const std::string& tenant,
              const audit::Ending& ending, const Response* r);

  void stop_http();  // closes every connection, joins the request threads

  std::string new_id(bool chat);
};

namespace server {

inline constexpr const char* kJson = "application/json; charset=utf-8";

std::string dump(const Json& j);
// An OpenAI-shaped error answer.
Reply error_reply(int status, const std::string& message, const std::string& type,
                  const std::string& param = {}, const std::string& code = {});

}  // namespace server
}  // namespace encore
