// The HTTP/1.1 transport of `encore serve`, on Boost.Asio (Debian's
// libboost-dev): a few I/O threads serve every connection asynchronously,
// so a connection costs a socket and a few KiB, never a thread, whatever
// the client does. Idle, slow and trickling clients ("slowloris") therefore
// cannot starve the others; what they can hold is bounded here:
//   - connections in total and per client address (more are shed at accept
//     time with a 503 and closed);
//   - each request's head and body by HttpLimits (http_reader.h), whatever
//     the framing, checked while the bytes arrive;
//   - time: each read of a started request must progress within
//     read_timeout and the whole request must be in by read_deadline (408,
//     closed), an idle kept-alive connection is closed after idle_timeout,
//     each write must progress within write_timeout.
// After any malformed request the answer says so and the connection is
// closed (the bytes after it cannot be trusted: request smuggling); a
// connection closed with unread input lingers up to two seconds, reading and
// dropping, so that the client sees the answer instead of a reset.
//
// The application (server.cpp) sees each request twice, on an I/O thread:
// on_head with the headers only (decide, refuse, set the body limit) and
// on_request with the whole body; it answers through the Exchange, with a
// whole Reply (asynchronous, from any thread) or as a stream (blocking
// writes, from a thread of its own, never an I/O thread).
//
// Ownership: HttpServer owns the listening socket, the I/O threads and every
// connection; an Exchange keeps its connection alive until it is answered.
// Thread-safety: HttpServer's methods may be called from any thread; an
// Exchange is used by one thread at a time.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/http_reader.h"

namespace encore::server {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  HttpLimits limits;
  int max_connections = 1024;       // open connections in all
  int max_connections_per_ip = 64;  // per client address; 0: no limit (behind a proxy)
  std::chrono::milliseconds read_timeout{10000};
  std::chrono::milliseconds read_deadline{30000};
  std::chrono::milliseconds idle_timeout{5000};
  std::chrono::milliseconds write_timeout{30000};
  int io_threads = 2;
};

// A whole answer.
struct Reply {
  int status = 200;
  std::string content_type = "application/json; charset=utf-8";
  std::string body;
  HeaderList headers;  // besides Content-Type, Content-Length and Connection
};

class Connection;  // http_server.cpp

// One request and its answer.
class Exchange {
 public:
  Exchange(std::shared_ptr<Connection> conn, RequestHead head, std::string peer);
  ~Exchange();  // unanswered or unfinished: the connection is closed
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  const RequestHead& head() const { return head_; }
  const std::string& peer() const { return peer_; }  // the client's address
  std::string& body() { return body_; }              // from on_request on

  // Set by on_head: the largest body this request may have, and the
  // application's own state for this request.
  size_t body_limit = 0;
  std::shared_ptr<void> state;

  // A whole answer: written asynchronously; callable from any thread, once.
  void reply(Reply r);
  // A streamed answer (HTTP/1.1: chunked; HTTP/1.0: delimited by the close).
  // Blocking: each call returns once its bytes are written, or false when
  // the client is gone or stopped reading for write_timeout (the connection
  // is then closed). Never on an I/O thread.
  bool start(int status, std::string_view content_type, const HeaderList& headers);
  bool write(std::string_view data);
  void finish();  // ends the body; the connection goes on to the next request

 private:
  std::shared_ptr<Connection> conn_;
  RequestHead head_;
  std::string peer_;
  std::string body_;
  enum class Phase { Open, Streaming, Answered } phase_ = Phase::Open;
  friend class Connection;
};

struct HttpHandlers {
  // After the head, before the body: nullopt to read the body (up to
  // ex.body_limit, which starts at limits.max_body_bytes), or a refusal
  // (the connection is closed after it when a body was announced).
  std::function<std::optional<Reply>(Exchange& ex)> on_head;
  // After the body: answer through `ex` now or from another thread.
  std::function<void(std::shared_ptr<Exchange> ex)> on_request;
  // A request the transport refuses (status 400, 408, 413, 431, 501, 505...;
  // `path` "" when the head was not read): the answer to send.
  std::function<Reply(int status, const std::string& message, const std::string& path)> on_failure;
  // A connection shed at accept ("too_many_connections") or cut off while
  // sending its request ("slow_client").
  std::function<void(const char* reason)> on_reject;
};

class HttpServer {
 public:
  // Binds and listens (backlog: the system's maximum, SOMAXCONN). Throws
  // Error when it cannot.
  HttpServer(const HttpServerOptions& options, HttpHandlers handlers);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Serves on io_threads threads until stop(); returns once they are joined.
  void run();
  // Stops accepting and closes every connection: reads stop, blocked and
  // later writes fail at once. run() keeps its threads until release().
  void close_all();
  // After close_all() and once no thread writes to an Exchange any more:
  // run() returns.
  void release();
  int open_connections() const;

  struct Core;  // http_server.cpp

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace encore::server
