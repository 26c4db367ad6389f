// The server's application (include/encore/server.h): routes, API keys and
// admission decided from the headers, the small endpoints, and the drain at
// shutdown. The transport is src/server/http_server.h; a completion request
// is answered by completions.cpp on a thread of its own.
#include "encore/server.h"

#include <fmt/format.h>
#include <sys/random.h>

#include <type_traits>

#include "encore/error.h"
#include "server/server_impl.h"

namespace encore {

using server::Exchange;
using server::Json;
using server::Reply;

namespace server {

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Reply error_reply(int status, const std::string& message, const std::string& type,
                  const std::string& param, const std::string& code) {
  Reply r;
  r.status = status;
  r.body = dump(error_json(message, type, param, code));
  return r;
}

}  // namespace server

// ---- request threads --------------------------------------------------------

bool RequestThreads::spawn(std::function<void()> work) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return false;
  // Join the threads that have ended (their number stays near those running).
  for (size_t i = 0; i < threads_.size();) {
    if (threads_[i].done->load()) {
      threads_[i].t.join();
      threads_[i] = std::move(threads_.back());
      threads_.pop_back();
    } else {
      ++i;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  threads_.push_back({std::thread([work = std::move(work), done] {
                        work();
                        done->store(true);
                      }),
                      done});
  return true;
}

void RequestThreads::join_all() {
  std::vector<Entry> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    all.swap(threads_);
  }
  for (Entry& e : all) e.t.join();
}

// ---- admission --------------------------------------------------------------

void Server::Impl::Admitted::body_received() {
  if (!m || address.empty()) return;
  std::lock_guard<std::mutex> lock(m->mu);
  if (--m->uploading[address] <= 0) m->uploading.erase(address);
  address.clear();
}

Server::Impl::Admitted::~Admitted() {
  if (!m) return;
  body_received();
  {
    std::lock_guard<std::mutex> lock(m->mu);
    --m->in_flight;
    if (--m->by_tenant[tenant] == 0) m->by_tenant.erase(tenant);
  }
  m->idle.notify_all();
}

// A quarter of the places in flight (at least one); none without a
// per-address connection limit (behind a proxy every client shares one).
int Server::Impl::max_uploads_per_address() const {
  if (opt.max_connections_per_ip == 0) return opt.max_in_flight;
  return std::max(1, opt.max_in_flight / 4);
}

std::string Server::Impl::new_id(bool chat) {
  return fmt::format("{}-{:016x}{:08x}", chat ? "chatcmpl" : "cmpl", id_salt, ++next_id);
}

// From the headers alone, before any body byte is read: the engine is
// there, the key is known and valid, and there is room for one more.
std::optional<Reply> Server::Impl::admit(Exchange& ex, bool chat) {
  const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  auto refuse = [&](Reply r) {
    metrics.request(endpoint, r.status);
    return std::optional<Reply>(std::move(r));
  };
  if (!engine.load()) {
    Reply r = server::error_reply(503, "the model is still loading", "server_error");
    r.headers.emplace_back("Retry-After", "5");
    return refuse(std::move(r));
  }
  std::string tenant;
  int tenant_limit = opt.tenant_in_flight > 0 ? opt.tenant_in_flight : opt.max_in_flight;
  if (auth) {
    const std::optional<std::string> key = server::bearer_key(ex.head().header("Authorization"));
    const auto it = key ? keys.find(*key) : keys.end();
    if (it == keys.end()) {
      metrics.rejected("unauthorized");
      Reply r = server::error_reply(
          401, key ? "unknown API key" : "an API key is needed: Authorization: Bearer KEY",
          "invalid_request_error", {}, "invalid_api_key");
      r.headers.emplace_back("WWW-Authenticate", "Bearer");
      return refuse(std::move(r));
    }
    if (it->second.revoked) {
      metrics.rejected("revoked");
      return refuse(server::error_reply(403, "this API key has been revoked", "permission_error",
                                        {}, "revoked_api_key"));
    }
    tenant = it->second.tenant;
    if (it->second.max_in_flight > 0) tenant_limit = it->second.max_in_flight;
  }
  // Refused for now: counted by reason, told when to try again.
  auto busy = [&](int status, const std::string& message, const char* type, const char* code,
                  const char* reason) {
    metrics.rejected(reason);
    Reply r = server::error_reply(status, message, type, {}, code);
    r.headers.emplace_back("Retry-After", "1");
    return refuse(std::move(r));
  };
  auto admitted = std::make_shared<Admitted>();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (draining) {
      return busy(503, "the server is shutting down", "server_error", "shutting_down",
                  "shutting_down");
    }
    if (in_flight >= opt.max_in_flight) {
      return busy(503, "the server is busy: try again", "server_error", "server_busy",
                  "server_busy");
    }
    const auto up = uploading.find(ex.peer());
    if (ex.head().has_body() && up != uploading.end() && up->second >= max_uploads_per_address()) {
      return busy(503,
                  fmt::format("too many requests from this address are still sending their body "
                              "(limit {}): try again",
                              max_uploads_per_address()),
                  "server_error", "server_busy", "uploads_per_address");
    }
    const auto held = by_tenant.find(tenant);
    if (held != by_tenant.end() && held->second >= tenant_limit) {
      return busy(429,
                  fmt::format("too many requests in flight for this key (limit {})", tenant_limit),
                  "requests", "rate_limit_exceeded", "tenant_limit");
    }
    int& mine = by_tenant[tenant];
    ++mine;
    ++in_flight;
    if (ex.head().has_body()) {
      ++uploading[ex.peer()];
      admitted->address = ex.peer();
    }
  }
  admitted->m = this;
  admitted->tenant = std::move(tenant);
  admitted->chat = chat;
  ex.state = std::move(admitted);
  ex.body_limit = opt.max_body_bytes;
  return std::nullopt;
}

// ---- routes -----------------------------------------------------------------

namespace {

// Bodies of the GET endpoints are read and dropped; they need no room.
constexpr size_t kSmallBody = 4096;

bool is_completions(const std::string& path) {
  return path == "/v1/completions" || path == "/v1/chat/completions";
}
bool is_get_route(const std::string& path) {
  return path == "/health" || path == "/metrics" || path == "/v1/models" ||
         path.rfind("/v1/models/", 0) == 0;
}

}  // namespace

std::optional<Reply> Server::Impl::on_head(Exchange& ex) {
  const std::string& path = ex.head().path;
  const std::string& method = ex.head().method;
  const bool post = is_completions(path), get = is_get_route(path);
  if (!post && !get) {
    metrics.request("other", 404);
    return server::error_reply(404, "no such endpoint", "not_found_error");
  }
  if ((post && method != "POST") || (get && method != "GET")) {
    metrics.request(server::endpoint_label(path), 405);
    Reply r = server::error_reply(405, fmt::format("{} takes {}", path, post ? "POST" : "GET"),
                                  "invalid_request_error");
    r.headers.emplace_back("Allow", post ? "POST" : "GET");
    return r;
  }
  if (get) {
    ex.body_limit = kSmallBody;
    return std::nullopt;
  }
  return admit(ex, path == "/v1/chat/completions");
}

void Server::Impl::on_request(std::shared_ptr<Exchange> ex) {
  const std::string& path = ex->head().path;
  if (is_completions(path)) {
    static_cast<Admitted*>(ex->state.get())->body_received();
    const bool started = workers.spawn([this, ex] {
      try {
        complete(*ex);
      } catch (const std::exception& e) {  // e.g. out of memory: this request only
        ex->reply(server::error_reply(500, e.what(), "server_error"));
        metrics.request(ex->head().path, 500);
      }
    });
    if (!started) {  // the server is stopping
      Reply r = server::error_reply(503, "the server is shutting down", "server_error", {},
                                    "shutting_down");
      metrics.request(path, r.status);
      ex->reply(std::move(r));
    }
    return;
  }
  Reply r = path == "/health" ? health() : path == "/metrics" ? metrics_page() : models(path);
  metrics.request(server::endpoint_label(path), r.status);
  ex->reply(std::move(r));
}

Reply Server::Impl::health() {
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    stopping = draining;
  }
  const bool ready = engine.load() != nullptr && !stopping;
  Reply r;
  r.status = ready ? 200 : 503;
  r.body = ready      ? R"({"status":"ok"})"
           : stopping ? R"({"status":"draining"})"
                      : R"({"status":"loading"})";
  return r;
}

Reply Server::Impl::models(const std::string& path) {
  Json model = {
      {"id", opt.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "encore"}};
  if (Engine* e = engine.load()) model["system_fingerprint"] = e->info().system_fingerprint;
  Reply r;
  if (path == "/v1/models") {
    r.body = server::dump(Json({{"object", "list"}, {"data", Json::array({model})}}));
    return r;
  }
  // GET /v1/models/{id} (the OpenAI client's models.retrieve).
  const std::string id = path.substr(sizeof("/v1/models/") - 1);
  if (id != opt.model_name) {
    return server::error_reply(404,
                               fmt::format("no model '{}' here; this server serves '{}'",
                                           id.substr(0, 100), opt.model_name),
                               "invalid_request_error", "model", "model_not_found");
  }
  r.body = server::dump(model);
  return r;
}

Reply Server::Impl::metrics_page() {
  Engine* e = engine.load();
  const EngineStats s = e ? e->stats() : EngineStats{};
  int64_t flying = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    flying = in_flight;
  }
  Reply r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = metrics.render(s, e ? e->state_counters() : decltype(e->state_counters()){}, flying,
                          http ? http->open_connections() : 0);
  // shadow is set by set_engine() before it publishes the engine: read it
  // only once the engine is seen.
  server::ConsistencyCounters checks;
  const bool checking = e != nullptr && shadow != nullptr;
  if (checking) checks = shadow->counters();
  const audit::WriterCounters lines = audit_log ? audit_log->counters() : audit::WriterCounters{};
  r.body +=
      server::render_audit_metrics(checking ? &checks : nullptr, audit_log ? &lines : nullptr);
  return r;
}

server::HttpHandlers Server::Impl::handlers() {
  server::HttpHandlers h;
  h.on_head = [this](Exchange& ex) { return on_head(ex); };
  h.on_request = [this](std::shared_ptr<Exchange> ex) { on_request(std::move(ex)); };
  h.on_failure = [this](int status, const std::string& message, const std::string& path) {
    // A fixed set of labels: a client's path never becomes a metric series.
    metrics.request(path.empty() ? "other" : server::endpoint_label(path), status);
    return server::error_reply(
        status, message, status >= 500 && status != 505 ? "server_error" : "invalid_request_error");
  };
  h.on_reject = [this](const char* reason) { metrics.rejected(reason); };
  return h;
}

// ---- life cycle -------------------------------------------------------------

std::unique_ptr<Server> Server::create(const ServerOptions& o) {
  visit_settings(o, [](const settings::Setting& s, const auto& v) {
    if constexpr (std::is_arithmetic_v<std::remove_cvref_t<decltype(v)>>) {
      settings::check(s, static_cast<double>(v));
    } else {  // a duration
      settings::check(s, std::chrono::duration<double>(v).count());
    }
  });
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.opt = o;
  if (!o.api_keys_file.empty()) {
    m.keys = server::load_api_keys(o.api_keys_file);
    m.auth = true;
  }
  if (getrandom(&m.id_salt, sizeof m.id_salt, 0) != sizeof m.id_salt) m.id_salt = 0;
  if (!o.audit.path.empty()) m.audit_log = audit::AuditLog::open(o.audit, o.log);
  server::HttpServerOptions h;
  h.host = o.host;
  h.port = o.port;
  h.limits.max_body_bytes = o.max_body_bytes;
  h.limits.max_header_bytes = o.max_header_bytes;
  h.max_connections = o.max_connections;
  h.max_connections_per_ip = o.max_connections_per_ip;
  h.read_timeout = o.read_timeout;
  h.read_deadline = o.read_deadline;
  h.idle_timeout = o.idle_timeout;
  h.io_threads = o.io_threads;
  m.http = std::make_unique<server::HttpServer>(h, m.handlers());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { impl_->stop_http(); }

// Connections still open (idle, slow, or a client that stopped reading) are
// closed: their writes fail at once, so every request thread ends; then
// run() returns.
void Server::Impl::stop_http() {
  http->close_all();
  workers.join_all();
  http->release();
}

int Server::port() const { return impl_->http->port(); }
std::map<std::string, uint64_t> Server::tenant_state_shares() const {
  return server::tenant_state_bytes(impl_->keys);
}
void Server::set_engine(Engine* engine) {
  Impl& m = *impl_;
  if (engine != nullptr && m.opt.shadow_rate > 0 && !m.shadow) {
    m.shadow = std::make_unique<server::ShadowChecker>(
        *engine, m.opt.shadow_rate, m.audit_log.get(), m.opt.audit.redact, m.opt.log);
  }
  m.engine = engine;
}
void Server::run() { impl_->http->run(); }

void Server::drain_and_stop(std::chrono::seconds grace, std::chrono::seconds delay) {
  Impl& m = *impl_;
  const auto open_until = std::chrono::steady_clock::now() + delay;
  std::unique_lock<std::mutex> lock(m.mu);
  m.draining = true;
  if (!m.idle.wait_for(lock, grace, [&] { return m.in_flight == 0; })) {
    // The grace is over: cancel what still runs. Each request ends within
    // a step; its answer says it was cancelled.
    m.shutting_down = true;  // under mu: a request submitted after this sees it
    for (const auto& handle : m.running) handle->cancel();
    m.idle.wait_for(lock, std::chrono::seconds(5), [&] { return m.in_flight == 0; });
  }
  lock.unlock();
  std::this_thread::sleep_until(open_until);  // still answering: 503, /health "draining"

  m.stop_http();
  // Checks still queued are cancelled (the engine is about to go); what
  // the log holds is written.
  if (m.shadow) m.shadow->stop();
  if (m.audit_log) m.audit_log->flush();
}

}  // namespace encore
