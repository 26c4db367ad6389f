// The HTTP server (include/encore/server.h) over cpp-httplib (Debian's
// libcpp-httplib-dev): a maintained, dependency-light library whose blocking
// thread-per-connection model fits a server whose work happens on the
// engine's scheduler thread anyway; a handler only waits on a
// RequestHandle.
#include "encore/server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/random.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "encore/error.h"
#include "encore/openai.h"
#include "server/auth.h"
#include "server/http_guard.h"
#include "server/metrics.h"
#include "server/openai_response.h"

namespace encore {

using server::Json;
using Clock = std::chrono::steady_clock;

struct Server::Impl {
  ServerOptions opt;
  server::ApiKeys keys;
  bool auth = false;
  server::GuardedHttpServer http;
  server::Metrics metrics;
  std::atomic<Engine*> engine{nullptr};
  int port = 0;
  uint64_t id_salt = 0;
  std::atomic<uint64_t> next_id{0};

  std::mutex mu;
  std::condition_variable idle;
  int in_flight = 0;
  std::unordered_map<std::string, int> by_tenant;
  bool draining = false;

  void routes();
  void completions(const httplib::Request& req, httplib::Response& res, bool chat);
  bool provide(RequestHandle& handle, const server::ReplyContext& ctx, bool stream,
               bool include_usage, Clock::time_point deadline, int n, httplib::DataSink& sink);
  std::string new_id(bool chat) {
    return fmt::format("{}-{:016x}{:08x}", chat ? "chatcmpl" : "cmpl", id_salt, ++next_id);
  }
};

namespace {

// A request's place among those in flight, given back however it ends (for
// a stream: when its content provider is released).
struct Slot {
  Server::Impl* m = nullptr;
  std::string tenant;
  ~Slot() {
    if (!m) return;
    {
      std::lock_guard<std::mutex> lock(m->mu);
      --m->in_flight;
      if (--m->by_tenant[tenant] == 0) m->by_tenant.erase(tenant);
    }
    m->idle.notify_all();
  }
};

// Content types: with the charset, httplib never gzips a JSON answer, so
// the blanks written while a long answer is computed reach the socket (a
// client that went away is noticed at once); SSE is never compressed.
const char* const kJson = "application/json; charset=utf-8";

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void reply_error(httplib::Response& res, int status, const std::string& message,
                 const std::string& type, const std::string& param = {},
                 const std::string& code = {}) {
  res.status = status;
  res.set_content(dump(server::error_json(message, type, param, code)), kJson);
}

}  // namespace

void Server::Impl::completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  auto done = [&](int status) { metrics.request(endpoint, status); };
  Engine* e = engine.load();
  if (!e) {
    res.set_header("Retry-After", "5");
    reply_error(res, 503, "the model is still loading", "server_error");
    return done(503);
  }
  std::string tenant;
  int tenant_limit = opt.tenant_in_flight > 0 ? opt.tenant_in_flight : opt.max_in_flight;
  if (auth) {
    const std::optional<std::string> key =
        server::bearer_key(req.get_header_value("Authorization"));
    const auto it = key ? keys.find(*key) : keys.end();
    if (it == keys.end()) {
      metrics.rejected("unauthorized");
      res.set_header("WWW-Authenticate", "Bearer");
      reply_error(res, 401,
                  key ? "unknown API key" : "an API key is needed: Authorization: Bearer KEY",
                  "invalid_request_error", {}, "invalid_api_key");
      return done(401);
    }
    if (it->second.revoked) {
      metrics.rejected("revoked");
      reply_error(res, 403, "this API key has been revoked", "permission_error", {},
                  "revoked_api_key");
      return done(403);
    }
    tenant = it->second.tenant;
    if (it->second.max_in_flight > 0) tenant_limit = it->second.max_in_flight;
  }

  Json body;
  Request request;
  try {
    body = api::parse_json_body(req.body);
    request = api::parse_request(
        body, chat ? api::Endpoint::ChatCompletions : api::Endpoint::Completions);
  } catch (const api::RequestError& err) {
    reply_error(res, 400, err.what(), "invalid_request_error", err.field());
    return done(400);
  }
  const bool stream = request.stream;
  bool include_usage = false;
  if (const auto so = body.find("stream_options"); so != body.end() && !so->is_null()) {
    if (!so->is_object() || !stream) {
      reply_error(res, 400,
                  so->is_object() ? "stream_options: only allowed when stream is true"
                                  : "stream_options: must be an object",
                  "invalid_request_error", "stream_options");
      return done(400);
    }
    if (const auto iu = so->find("include_usage"); iu != so->end()) {
      if (!iu->is_boolean()) {
        reply_error(res, 400, "stream_options.include_usage: must be true or false",
                    "invalid_request_error", "stream_options.include_usage");
        return done(400);
      }
      include_usage = iu->get<bool>();
    }
  }
  if (const auto sid = body.find("session_id"); sid != body.end() && sid->is_string()) {
    request.session = sid->get<std::string>();
  }
  if (chat && request.chat_template.empty()) request.chat_template = opt.chat_template;
  request.tenant = tenant;  // never from the client
  request.stream = true;    // events drive both kinds of answer

  // Admission: a place among those in flight.
  auto slot = std::make_shared<Slot>();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (draining || in_flight >= opt.max_in_flight) {
      metrics.rejected(draining ? "shutting_down" : "server_busy");
      res.set_header("Retry-After", "1");
      reply_error(res, 503,
                  draining ? "the server is shutting down" : "the server is busy: try again",
                  "server_error", {}, draining ? "shutting_down" : "server_busy");
      return done(503);
    }
    int& mine = by_tenant[tenant];
    if (mine >= tenant_limit) {
      if (mine == 0) by_tenant.erase(tenant);
      metrics.rejected("tenant_limit");
      res.set_header("Retry-After", "1");
      reply_error(res, 429,
                  fmt::format("too many requests in flight for this key (limit {})", tenant_limit),
                  "requests", {}, "rate_limit_exceeded");
      return done(429);
    }
    ++mine;
    ++in_flight;
    slot->m = this;
    slot->tenant = tenant;
  }

  auto handle = std::make_shared<RequestHandle>();
  try {
    *handle = e->submit(request);
  } catch (const InvalidArgument& err) {
    reply_error(res, 400, err.what(), "invalid_request_error", api::engine_error_param(err.what()));
    return done(400);
  } catch (const ResourceExhausted& err) {
    reply_error(res, 400, err.what(), "invalid_request_error", api::engine_error_param(err.what()),
                "context_length_exceeded");
    return done(400);
  }

  server::ReplyContext ctx;
  ctx.chat = chat;
  ctx.id = new_id(chat);
  ctx.created = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  ctx.model = opt.model_name;
  ctx.system_fingerprint = e->info().system_fingerprint;
  ctx.logprobs = request.logprobs;
  ctx.engine = e;
  const auto deadline = Clock::now() + opt.request_timeout;
  const int n = request.n;

  // A whole answer: wait a moment before committing to a status line, so
  // that the requests that end early (most) get their real status.
  if (!stream) {
    const auto commit_at = std::min(deadline, Clock::now() + std::chrono::milliseconds(1500));
    while (!handle->done() && Clock::now() < commit_at) {
      handle->next_for(std::chrono::milliseconds(50));
    }
    if (handle->done() || Clock::now() >= deadline) {
      if (!handle->done()) {
        handle->cancel();
        metrics.outcome("timeout");
        reply_error(res, 504, "the request timed out", "server_error", {}, "timeout");
        return done(504);
      }
      const Response& r = handle->wait();
      if (r.status != Response::Status::Ok) {
        metrics.outcome(r.status == Response::Status::Cancelled ? "cancelled" : "failed");
        reply_error(res, 500, r.error.empty() ? "the request was cancelled" : r.error,
                    "server_error");
        return done(500);
      }
      metrics.outcome("ok");
      metrics.tokens(r.usage.prompt_tokens, r.usage.generated_tokens, r.usage.cached_tokens);
      if (r.usage.generated_tokens > 0) metrics.time_to_first_token(r.ttft_seconds);
      res.set_content(dump(server::reply_json(ctx, r)), kJson);
      return done(200);
    }
  }
  done(200);

  // Then the answer is written as it comes (chunked): a stream as events,
  // a whole answer after blanks written every 200 ms (JSON allows leading
  // whitespace), so a client that goes away cancels its request at once
  // either way. Errors after this point can only be told in the body.
  auto provider = [this, handle, ctx, stream, include_usage, deadline, n, slot](
                      size_t, httplib::DataSink& sink) {
    try {
      return provide(*handle, ctx, stream, include_usage, deadline, n, sink);
    } catch (const std::exception&) {  // e.g. out of memory: this request only
      handle->cancel();
      return false;
    }
  };
  if (stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", provider);
  } else {
    res.set_chunked_content_provider(kJson, provider);
  }
}

// Writes a request's answer as it comes; false when the client went away
// (the request is then cancelled).
bool Server::Impl::provide(RequestHandle& handle, const server::ReplyContext& ctx, bool stream,
                           bool include_usage, Clock::time_point deadline, int n,
                           httplib::DataSink& sink) {
  std::vector<std::vector<TokenId>> ids(static_cast<size_t>(n));
  std::vector<bool> started(static_cast<size_t>(n), false);
  std::vector<Clock::time_point> last_token(static_cast<size_t>(n));
  std::vector<size_t> offset(static_cast<size_t>(n), 0);  // text_offset of the next token
  Clock::time_point last_write = Clock::now();
  const uint64_t seed = handle.seed();
  auto write = [&](const std::string& text) {
    last_write = Clock::now();
    if (sink.write(text.data(), text.size())) return true;
    handle.cancel();
    metrics.outcome("disconnected");
    return false;
  };
  auto event = [&](const Json& j) { return write("data: " + dump(j) + "\n\n"); };
  for (;;) {
    if (Clock::now() > deadline) {
      handle.cancel();
      metrics.outcome("timeout");
      const Json err = server::error_json("the request timed out", "server_error", {}, "timeout");
      if (stream ? !event(err) : !write(dump(err))) return false;
      sink.done();
      return true;
    }
    const std::optional<Event> ev = handle.next_for(std::chrono::milliseconds(200));
    if (Clock::now() - last_write >= std::chrono::milliseconds(200)) {
      if (!write(stream ? ": keep-alive\n\n" : " ")) return false;
    }
    if (!ev) continue;
    if (ev->kind == Event::Kind::Done) break;
    const size_t i = static_cast<size_t>(ev->sample);
    if (ev->kind == Event::Kind::Token) {
      ids[i].push_back(ev->id);
      const auto now = Clock::now();
      if (stream && ids[i].size() > 1) {
        metrics.inter_token_latency(std::chrono::duration<double>(now - last_token[i]).count());
      }
      last_token[i] = now;
    }
    if (!stream) continue;
    if (ctx.chat && !started[i]) {
      started[i] = true;
      if (!event(server::role_chunk(ctx, seed, ev->sample))) return false;
    }
    if (ev->kind == Event::Kind::Token) {
      const size_t at = offset[i];
      if (!ctx.chat && ctx.logprobs >= 0) offset[i] += ctx.engine->token_text(ev->id).size();
      if ((!ev->text.empty() || ev->logprob) &&
          !event(server::text_chunk(ctx, seed, ev->sample, ev->text, ev->logprob, at))) {
        return false;
      }
    }
    if (ev->kind == Event::Kind::Finish) {
      if (!ev->text.empty() &&
          !event(server::text_chunk(ctx, seed, ev->sample, ev->text, std::nullopt, offset[i]))) {
        return false;
      }
      if (!event(server::finish_chunk(ctx, seed, ev->sample, ev->finish, output_hash(ids[i])))) {
        return false;
      }
    }
  }
  const Response& r = handle.wait();
  if (r.status != Response::Status::Ok) {
    metrics.outcome(r.status == Response::Status::Cancelled ? "cancelled" : "failed");
    const Json err = server::error_json(r.error.empty() ? "the request was cancelled" : r.error,
                                        "server_error", {});
    if (stream ? !event(err) : !write(dump(err))) return false;
    sink.done();
    return true;
  }
  metrics.outcome("ok");
  metrics.tokens(r.usage.prompt_tokens, r.usage.generated_tokens, r.usage.cached_tokens);
  if (r.usage.generated_tokens > 0) metrics.time_to_first_token(r.ttft_seconds);
  if (stream) {
    if (include_usage && !event(server::usage_chunk(ctx, r))) return false;
    if (!write("data: [DONE]\n\n")) return false;
  } else if (!write(dump(server::reply_json(ctx, r)))) {
    return false;
  }
  sink.done();
  return true;
}

void Server::Impl::routes() {
  http.Post("/v1/completions",
            [this](const httplib::Request& q, httplib::Response& r) { completions(q, r, false); });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& q, httplib::Response& r) { completions(q, r, true); });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = draining;
    }
    const bool ready = engine.load() != nullptr && !stopping;
    r.status = ready ? 200 : 503;
    r.set_content(ready      ? R"({"status":"ok"})"
                  : stopping ? R"({"status":"draining"})"
                             : R"({"status":"loading"})",
                  kJson);
    metrics.request("/health", r.status);
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) {
    Json model = {
        {"id", opt.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "encore"}};
    if (Engine* e = engine.load()) model["system_fingerprint"] = e->info().system_fingerprint;
    r.set_content(dump(Json({{"object", "list"}, {"data", Json::array({model})}})), kJson);
    metrics.request("/v1/models", 200);
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
    Engine* e = engine.load();
    const EngineStats s = e ? e->stats() : EngineStats{};
    int64_t flying = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      flying = in_flight;
    }
    metrics.request("/metrics", 200);
    r.set_content(
        metrics.render(s, e ? e->state_counters() : decltype(e->state_counters()){}, flying),
        "text/plain; version=0.0.4");
  });
  // Everything else: OpenAI's error shape, not httplib's empty body.
  http.set_error_handler([this](const httplib::Request& q, httplib::Response& r) {
    if (!r.body.empty()) return;
    std::string msg, type = "invalid_request_error";
    if (r.status == 404) {
      msg = "no such endpoint";
      type = "not_found_error";
    } else if (r.status == 413) {
      msg = fmt::format("the body exceeds {} bytes", opt.max_body_bytes);
    } else if (r.status >= 500) {
      msg = "internal error";
      type = "server_error";
    } else {
      msg = fmt::format("the request could not be read (HTTP {})", r.status);
    }
    r.set_content(dump(server::error_json(msg, type, {})), kJson);
    // A fixed set of labels: a client's path never becomes a metric series.
    metrics.request(server::endpoint_label(q.path), r.status);
  });
  http.set_exception_handler(
      [this](const httplib::Request& q, httplib::Response& r, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        reply_error(r, 500, what, "server_error");
        metrics.request(server::endpoint_label(q.path), 500);
      });
}

std::unique_ptr<Server> Server::create(const ServerOptions& o) {
  if (o.port < 0 || o.port > 65535) {
    throw InvalidArgument(fmt::format("port {} must be in [0, 65535]", o.port));
  }
  if (o.max_in_flight < 1 || o.tenant_in_flight < 0 || o.max_body_bytes < 1024) {
    throw InvalidArgument("server limits: max_in_flight >= 1, tenant limit >= 0, body >= 1 KiB");
  }
  if (o.read_timeout < std::chrono::seconds(1) || o.read_timeout > std::chrono::hours(1) ||
      o.read_deadline < std::chrono::milliseconds(100) || o.read_deadline > std::chrono::hours(1)) {
    throw InvalidArgument(
        "server limits: read timeout in [1 s, 1 h], read deadline in [0.1 s, 1 h]");
  }
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.opt = o;
  if (!o.api_keys_file.empty()) {
    m.keys = server::load_api_keys(o.api_keys_file);
    m.auth = true;
  }
  if (getrandom(&m.id_salt, sizeof m.id_salt, 0) != sizeof m.id_salt) m.id_salt = 0;
  const int threads = o.http_threads > 0 ? o.http_threads : 2 * o.max_in_flight + 8;
  m.http.new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  m.http.set_payload_max_length(o.max_body_bytes);
  m.http.set_read_timeout(o.read_timeout);
  m.http.set_request_read_deadline(o.read_deadline);
  m.http.on_cut_off([&m] { m.metrics.rejected("slow_client"); });
  m.http.set_write_timeout(std::chrono::seconds(30));
  m.http.set_keep_alive_timeout(2);  // an idle connection holds a worker thread
  m.routes();
  m.port = o.port == 0 ? m.http.bind_to_any_port(o.host)
                       : (m.http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (m.port <= 0) {
    throw Error(fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)",
                            o.host, o.port));
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { impl_->http.stop(); }

int Server::port() const { return impl_->port; }
void Server::set_engine(Engine* engine) { impl_->engine = engine; }
void Server::run() { impl_->http.listen_after_bind(); }

void Server::drain_and_stop(std::chrono::seconds grace) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->draining = true;
  impl_->idle.wait_for(lock, grace, [&] { return impl_->in_flight == 0; });
  lock.unlock();
  // stop() does nothing before the listener runs: wait for it (run() may
  // have been called just now) so that run() is sure to return.
  for (int i = 0; i < 500 && !impl_->http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  impl_->http.stop();
}

}  // namespace encore
