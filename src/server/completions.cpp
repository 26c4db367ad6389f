// A completion request from its body to its last byte, on its own thread
// (server_impl.h): the body is parsed into a Request (src/api), submitted to
// the engine, and the answer written as it comes.
//
// Status codes: a whole answer waits up to 1.5 s before committing to a
// status line, so that most requests get their real status (400 for what
// the engine refuses, 504 for a timeout, 500 for a failure). After that the
// answer is written as it comes — a stream as events, a whole answer after
// blanks written every 200 ms (JSON allows leading whitespace) — so that a
// client that goes away cancels its request at once either way, and errors
// can only be told in the body. /metrics counts each request under the
// status it ended with: 200 only for an answer given in full, 504 for a
// timeout, 499 for a client that went away, 503 for a request cancelled at
// shutdown, 500 for a failure, even where the status line said 200.
#include <fmt/format.h>

#include "encore/error.h"
#include "encore/openai.h"
#include "server/server_impl.h"
#include "util/text.h"

namespace encore {

using server::Exchange;
using server::Json;
using server::Reply;
using Clock = std::chrono::steady_clock;

namespace {

// How a request's answer ended, for /metrics (see the file comment).
struct Ending {
  int status;
  const char* outcome;
};
constexpr Ending kOk{200, "ok"}, kTimeout{504, "timeout"}, kGone{499, "disconnected"},
    kShutdown{503, "cancelled"}, kCancelled{500, "cancelled"}, kFailed{500, "failed"};

// How a Response that is not Ok ended (`shutdown`: the server cancelled what
// still ran at the end of its grace), with what the client is told.
struct Stopped {
  Ending ending;
  std::string message;
  const char* code;
};
Stopped stopped_as(const Response& r, bool shutdown) {
  if (r.status == Response::Status::Cancelled && shutdown) {
    return {kShutdown, "the server is shutting down: the request was cancelled", "shutting_down"};
  }
  if (r.status == Response::Status::Cancelled) return {kCancelled, "the request was cancelled", ""};
  return {kFailed, r.error.empty() ? "the request failed" : r.error, ""};
}

// How the audit log names an ending (audit.h, Ending).
audit::Ending audit_ending(const Ending& e, const Response& r) {
  if (e.status == kOk.status) return {"completed", "", e.status};
  if (e.status == kShutdown.status) return {"stopped", "the server shut down", e.status};
  if (e.status == kTimeout.status) return {"cancelled", "the request timed out", e.status};
  if (e.status == kGone.status) return {"cancelled", "the client went away", e.status};
  if (r.status == Response::Status::Failed) return {"failed", r.error, e.status};
  return {"cancelled", "the request was cancelled", e.status};
}

// The counters of an answer given in full.
void count_answer(server::Metrics& metrics, const Response& r) {
  metrics.tokens(r.usage.prompt_tokens, r.usage.generated_tokens, r.usage.cached_tokens);
  if (r.usage.generated_tokens > 0) metrics.time_to_first_token(r.ttft_seconds);
}

// What one request needs while its answer is written.
struct Answer {
  Server::Impl& m;
  Exchange& ex;
  RequestHandle& handle;
  server::ReplyContext ctx = {};
  bool stream = false;
  bool include_usage = false;
  int n = 1;
  Clock::time_point deadline = {};
  Clock::time_point last_write = Clock::now();
  Ending ended = kGone;  // how early() ended it

  bool write(const std::string& text) {
    last_write = Clock::now();
    if (ex.write(text)) return true;
    handle.cancel();
    return false;
  }
  bool event(const Json& j) { return write("data: " + server::dump(j) + "\n\n"); }
  // An error told in the body, once the status line has been sent.
  bool error(const std::string& message, const std::string& code) {
    const Json err = server::error_json(message, "server_error", {}, code);
    return stream ? event(err) : write(server::dump(err));
  }
  // A whole answer ready (or failed, or timed out) within 1.5 s, counted;
  // nullopt when it is still running then.
  std::optional<Reply> early();
  Ending body();
};

// The X-Session-Id header: the session id a balancer can hash on without
// reading the body (deploy/haproxy.cfg). Alone it names the session; with
// the body's session_id the two must agree, so that routing and the session
// continued are one. The error when it is not a session id or disagrees.
std::optional<std::string> take_session_header(const server::RequestHead& head, Request& r) {
  constexpr const char* kName = "X-Session-Id";
  const size_t count = head.header_count(kName);
  if (count == 0) return std::nullopt;
  if (count > 1) return fmt::format("{} is given {} times; give it once", kName, count);
  const std::string id = head.header(kName);
  if (!valid_session_id(id)) {
    return fmt::format("the {} header '{}' is not a session id (one is {})", kName,
                       util::printable(id, 64), kSessionIdRule);
  }
  if (r.session.empty()) {
    r.session = id;
  } else if (r.session != id) {
    return fmt::format(
        "the {} header '{}' and the body's session_id '{}' differ; send one, or both "
        "equal",
        kName, id, r.session);
  }
  return std::nullopt;
}

}  // namespace

void Server::Impl::record(const std::string& id, const std::string& endpoint,
                          const std::string& tenant, const audit::Ending& ending,
                          const Response* r) {
  Engine* e = engine.load();
  if (e == nullptr) return;
  const auto line = [&](bool check_queued) {
    if (!audit_log) return;
    audit::Json j =
        audit::request_record(id, endpoint, tenant, ending, r, e->info(), opt.audit.redact);
    if (check_queued) j["check"] = "queued";
    audit_log->append(std::move(j));
  };
  // The request's line goes first; its check's line comes when the check ends.
  if (shadow && r != nullptr && ending.status == "completed") {
    shadow->offer(id, tenant, *r, line);
  } else {
    line(false);
  }
}

void Server::Impl::complete(Exchange& ex) {
  const auto* admitted = static_cast<const Admitted*>(ex.state.get());
  const bool chat = admitted->chat;
  const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  const std::string id = new_id(chat);
  auto answer = [&](Reply r) {
    metrics.request(endpoint, r.status);
    ex.reply(std::move(r));
  };
  // Refused before it ran: answered, and its audit line says why.
  auto refuse = [&](int status, const std::string& message, const std::string& param,
                    const std::string& code) {
    record(id, endpoint, admitted->tenant, {"rejected", message, status}, nullptr);
    answer(server::error_reply(status, message, "invalid_request_error", param, code));
  };
  Engine* e = engine.load();

  api::ServerRequest parsed;
  try {
    const nlohmann::json body = api::parse_json_body(ex.body());
    ex.body() = std::string();  // the tree holds what is needed
    parsed = api::parse_server_request(
        body, chat ? api::Endpoint::ChatCompletions : api::Endpoint::Completions);
  } catch (const api::RequestError& err) {
    return refuse(400, err.what(), err.field(), {});
  }
  Request& request = parsed.request;
  if (std::optional<std::string> bad = take_session_header(ex.head(), request)) {
    return refuse(400, *bad, "session_id", {});
  }
  const bool stream = request.stream;
  if (chat && request.chat_template.empty()) request.chat_template = opt.chat_template;
  request.tenant = admitted->tenant;  // never from the client
  request.stream = true;              // events drive both kinds of answer
  // The operator's choice holds for every client (ServerOptions).
  if (opt.normalize_input) request.normalize_input = true;

  auto handle = std::make_shared<RequestHandle>();
  try {
    *handle = e->submit(request);
  } catch (const InvalidArgument& err) {
    return refuse(400, err.what(), api::param_of(err), {});
  } catch (const ResourceExhausted& err) {
    return refuse(400, err.what(), api::param_of(err), "context_length_exceeded");
  } catch (const NotFound& err) {  // a continuation with nothing saved to continue
    return refuse(404, err.what(), api::param_of(err), "session_not_found");
  }
  // Registered for the cancel at shutdown; a request that comes in after it
  // is cancelled at once.
  {
    std::lock_guard<std::mutex> lock(mu);
    running.insert(handle);
    if (shutting_down) handle->cancel();
  }
  struct Unregister {
    Impl& m;
    const std::shared_ptr<RequestHandle>& handle;
    ~Unregister() {
      std::lock_guard<std::mutex> lock(m.mu);
      m.running.erase(handle);
    }
  } unregister{*this, handle};

  Answer a{*this, ex, *handle};
  a.ctx.chat = chat;
  a.ctx.id = id;
  a.ctx.created = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  a.ctx.model = opt.model_name;
  a.ctx.system_fingerprint = e->info().system_fingerprint;
  a.ctx.logprobs = request.logprobs;
  a.ctx.session = request.session;
  a.ctx.session_continued = handle->session_found();
  a.stream = stream;
  a.include_usage = parsed.include_usage;
  a.n = request.n;
  a.deadline = Clock::now() + opt.request_timeout;

  // A whole answer: wait a moment before committing to a status line.
  if (!stream) {
    if (std::optional<Reply> early = a.early()) {
      record(id, endpoint, admitted->tenant, audit_ending(a.ended, handle->wait()),
             &handle->wait());
      return answer(std::move(*early));
    }
  }

  server::HeaderList headers;
  if (stream) headers.emplace_back("Cache-Control", "no-cache");
  Ending end = kGone;
  const bool started = ex.start(200, stream ? "text/event-stream" : server::kJson, headers);
  if (started) {
    end = a.body();
  } else {
    handle->cancel();
  }
  const Response& r = handle->wait();  // within a step of a cancel
  record(id, endpoint, admitted->tenant, audit_ending(end, r), &r);
  // Counted before the answer's last bytes go out: a client that reads
  // /metrics right after it sees this request counted.
  metrics.outcome(end.outcome);
  metrics.request(endpoint, end.status);
  if (started && end.status != kGone.status) ex.finish();
}

namespace {

std::optional<Reply> Answer::early() {
  const auto commit_at = std::min(deadline, Clock::now() + std::chrono::milliseconds(1500));
  while (!handle.done() && Clock::now() < commit_at) {
    handle.next_for(std::chrono::milliseconds(50));
  }
  if (!handle.done() && Clock::now() < deadline) return std::nullopt;
  if (!handle.done()) {
    handle.cancel();
    ended = kTimeout;
    m.metrics.outcome(kTimeout.outcome);
    return server::error_reply(504, "the request timed out", "server_error", {}, "timeout");
  }
  const Response& r = handle.wait();
  if (r.status != Response::Status::Ok) {
    const Stopped st = stopped_as(r, m.shutting_down);
    ended = st.ending;
    m.metrics.outcome(st.ending.outcome);
    return server::error_reply(st.ending.status, st.message, "server_error", {}, st.code);
  }
  ended = kOk;
  m.metrics.outcome(kOk.outcome);
  count_answer(m.metrics, r);
  Reply whole;
  whole.body = server::dump(server::reply_json(ctx, r));
  return whole;
}

// Writes the answer as it comes; how it ended.
Ending Answer::body() {
  const size_t count = static_cast<size_t>(n);
  std::vector<std::vector<TokenId>> ids(count);
  std::vector<bool> started(count, false), finished(count, false);
  std::vector<Clock::time_point> last_token(count);
  std::vector<size_t> offset(count, 0);  // text_offset of the next token
  const uint64_t seed = handle.seed();
  for (;;) {
    if (Clock::now() > deadline) {
      handle.cancel();
      return error("the request timed out", "timeout") ? kTimeout : kGone;
    }
    const std::optional<Event> ev = handle.next_for(std::chrono::milliseconds(200));
    if (Clock::now() - last_write >= std::chrono::milliseconds(200)) {
      if (!write(stream ? ": keep-alive\n\n" : " ")) return kGone;
    }
    if (!ev) continue;
    if (ev->kind == Event::Kind::Done) break;
    const size_t i = static_cast<size_t>(ev->sample);
    if (ev->kind == Event::Kind::Token) {
      ids[i].push_back(ev->id);
      const auto now = Clock::now();
      if (stream && ids[i].size() > 1) {
        m.metrics.inter_token_latency(std::chrono::duration<double>(now - last_token[i]).count());
      }
      last_token[i] = now;
    }
    if (!stream) continue;
    if (ctx.chat && !started[i]) {
      started[i] = true;
      if (!event(server::role_chunk(ctx, seed, ev->sample))) return kGone;
    }
    if (ev->kind == Event::Kind::Token) {
      const size_t at = offset[i];
      if (!ctx.chat && ev->logprob) offset[i] += ev->logprob->chosen.text.size();
      if ((!ev->text.empty() || ev->logprob) &&
          !event(server::text_chunk(ctx, seed, ev->sample, ev->text, ev->logprob, at))) {
        return kGone;
      }
    }
    if (ev->kind == Event::Kind::Finish) {
      finished[i] = true;
      if (!ev->text.empty() &&
          !event(server::text_chunk(ctx, seed, ev->sample, ev->text, std::nullopt, offset[i]))) {
        return kGone;
      }
      if (!event(server::finish_chunk(ctx, seed, ev->sample,
                                      server::openai_finish_reason(ev->finish),
                                      output_hash(ids[i])))) {
        return kGone;
      }
    }
  }
  const Response& r = handle.wait();
  if (r.status != Response::Status::Ok) {
    const Stopped st = stopped_as(r, m.shutting_down);
    // At shutdown, each unfinished choice of a stream ends with a reason
    // that says so, before the error that tells why.
    for (size_t i = 0; stream && st.ending.status == kShutdown.status && i < count; ++i) {
      if (finished[i]) continue;
      if (!event(server::finish_chunk(ctx, seed, static_cast<int>(i), "cancelled",
                                      output_hash(ids[i])))) {
        return kGone;
      }
    }
    return error(st.message, st.code) ? st.ending : kGone;
  }
  count_answer(m.metrics, r);
  if (stream) {
    if (include_usage && !event(server::usage_chunk(ctx, r))) return kGone;
    if (!write("data: [DONE]\n\n")) return kGone;
  } else if (!write(server::dump(server::reply_json(ctx, r)))) {
    return kGone;
  }
  return kOk;
}

}  // namespace
}  // namespace encore
