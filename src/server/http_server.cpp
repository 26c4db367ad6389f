#include "server/http_server.h"

#include <fmt/format.h>

#include <array>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/status.hpp>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "encore/error.h"

namespace encore::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// A connection closed with input it did not read lingers this long, reading
// and dropping, so that its last answer is not lost to a reset.
constexpr auto kLinger = std::chrono::seconds(2);

// The status line and headers of an answer. `length`: Content-Length, or
// nullopt for a streamed body (chunked on HTTP/1.1, else up to the close).
std::string head_bytes(int status, int version, bool keep_alive, std::string_view content_type,
                       const HeaderList& headers, std::optional<size_t> length) {
  const auto reason = beast::http::obsolete_reason(static_cast<beast::http::status>(status));
  std::string out = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\n", status,
                                std::string_view(reason.data(), reason.size()), content_type);
  for (const auto& [k, v] : headers) out += fmt::format("{}: {}\r\n", k, v);
  if (length) {
    out += fmt::format("Content-Length: {}\r\n", *length);
  } else if (version == 11) {
    out += "Transfer-Encoding: chunked\r\n";
  }
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return out;
}

// A whole answer: head and body.
std::string reply_bytes(const Reply& r, int version, bool keep_alive) {
  return head_bytes(r.status, version, keep_alive, r.content_type, r.headers, r.body.size()) +
         r.body;
}

// The client address the per-address limits count: IPv4 as it is, IPv6 by
// its /64 prefix (one host usually holds a whole /64).
std::string address_of(const tcp::endpoint& e) {
  net::ip::address a = e.address();
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    a = net::ip::make_address_v4(net::ip::v4_mapped, a.to_v6());
  }
  if (a.is_v4()) return a.to_string();
  net::ip::address_v6::bytes_type b = a.to_v6().to_bytes();
  std::fill(b.begin() + 8, b.end(), 0);
  return net::ip::address_v6(b).to_string() + "/64";
}

}  // namespace

struct HttpServer::Core : std::enable_shared_from_this<Core> {
  HttpServerOptions opt;
  HttpHandlers h;
  net::io_context ioc;
  net::executor_work_guard<net::io_context::executor_type> guard{ioc.get_executor()};
  // The acceptor and its retry timer live on one strand: accept handlers and
  // close_all() never touch them at the same time.
  net::strand<net::io_context::executor_type> accept_strand = net::make_strand(ioc);
  tcp::acceptor acceptor{accept_strand};
  net::steady_timer accept_retry{accept_strand};
  int port = 0;
  std::atomic<int> runners{0};  // threads in ioc.run()

  mutable std::mutex mu;
  std::unordered_map<std::string, int> per_ip;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> live;  // every open connection
  bool closing = false;

  void accept();
  void admit(tcp::socket s);
  void release(Connection* c, const std::string& ip) {
    std::lock_guard<std::mutex> lock(mu);
    if (--per_ip[ip] <= 0) per_ip.erase(ip);
    live.erase(c);
  }
};

// One client connection: reads requests one after another (keep-alive,
// pipelining) and writes their answers. Every handler runs on the
// connection's strand; a request thread only posts to it.
//
// Reads are timed by read_timer_, which cancels the read (the socket stays
// open for the 408); writes by the stream's own timer, which closes the
// socket when a write stalls.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<HttpServer::Core> core, tcp::socket s, std::string ip)
      : core_(std::move(core)),
        stream_(std::move(s)),
        read_timer_(stream_.get_executor()),
        ip_(std::move(ip)) {}
  ~Connection() { core_->release(this, ip_); }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->next_request(); });
  }
  // From any thread.
  void close_soon() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

  // Called through an Exchange; see there.
  void reply(const Exchange& ex, Reply r) {
    const bool keep = ex.head().keep_alive && !closing_;
    auto bytes = std::make_shared<std::string>(reply_bytes(r, ex.head().version, keep));
    net::post(stream_.get_executor(), [self = shared_from_this(), bytes, keep] {
      self->send(bytes, keep ? After::Next : After::Linger);
    });
  }
  // From a request thread, never the strand (it would wait on itself).
  bool write_blocking(std::string bytes) {
    auto done = std::make_shared<std::promise<bool>>();
    std::future<bool> ok = done->get_future();
    auto buf = std::make_shared<std::string>(std::move(bytes));
    net::post(stream_.get_executor(), [self = shared_from_this(), buf, done] {
      if (self->closed_) return done->set_value(false);
      self->stream_.expires_after(self->core_->opt.write_timeout);
      net::async_write(self->stream_, net::buffer(*buf),
                       [self, buf, done](beast::error_code ec, size_t) {
                         if (ec) self->close();
                         done->set_value(!ec);
                       });
    });
    // The write's own timer bounds it; the margin covers a strand that never
    // runs the post (an io_context already stopped): false, never a hang.
    const auto limit = core_->opt.write_timeout + std::chrono::seconds(5);
    return ok.wait_for(limit) == std::future_status::ready && ok.get();
  }
  void finish_stream(const Exchange& ex) {
    const bool keep = ex.head().keep_alive && ex.head().version == 11 && !closing_;
    auto bytes = std::make_shared<std::string>(ex.head().version == 11 ? "0\r\n\r\n" : "");
    net::post(stream_.get_executor(), [self = shared_from_this(), bytes, keep] {
      self->send(bytes, keep ? After::Next : After::Linger);
    });
  }
  // Marks the connection to be closed after the answer in progress.
  void close_after_answer() { closing_ = true; }

 private:
  enum class After { Next, Linger };

  void next_request() {
    if (closed_) return;
    reader_.emplace(core_->opt.limits, std::move(leftover_));
    leftover_.clear();
    if (reader_->started()) {
      deadline_ = Clock::now() + core_->opt.read_deadline;
      return on_state(reader_->feed({}));
    }
    read();
  }

  void read() {
    Clock::duration limit = core_->opt.idle_timeout;
    if (reader_->started()) {
      limit = std::min<Clock::duration>(core_->opt.read_timeout, deadline_ - Clock::now());
      if (limit <= Clock::duration::zero()) return cut_off();
    }
    stream_.expires_never();  // a write's timer must not close the socket under a read
    const uint64_t read = ++reads_;
    read_timed_out_ = false;
    read_timer_.expires_after(limit);
    read_timer_.async_wait([self = shared_from_this(), read](beast::error_code ec) {
      if (ec || read != self->reads_ || self->closed_) return;  // that read is over
      self->read_timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
    stream_.async_read_some(
        net::buffer(buf_),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_read(ec, n); });
  }

  void on_read(beast::error_code ec, size_t n) {
    ++reads_;  // a timer of this read that fires now does nothing
    read_timer_.cancel();
    if (closed_ || !reader_) return close();
    if (ec == net::error::operation_aborted && read_timed_out_) {
      if (reader_->started()) return cut_off();
      return close();  // an idle kept-alive connection
    }
    if (ec) return close();  // end of stream, reset: nothing to answer
    if (!reader_->started()) deadline_ = Clock::now() + core_->opt.read_deadline;
    on_state(reader_->feed({buf_.data(), n}));
  }

  // A started request that stalled or was not all there by its deadline.
  void cut_off() {
    core_->h.on_reject("slow_client");
    fail(408, "the request was not received in time");
  }

  void fail(int status, std::string message) {  // a copy: it may be the reader's
    const std::string path = reader_ && reader_->state() != RequestReader::State::NeedMore
                                 ? reader_->head().path
                                 : std::string();
    reader_.reset();  // what it holds is not needed for the answer
    ex_.reset();
    Reply r = core_->h.on_failure(status, message, path);
    auto bytes = std::make_shared<std::string>(reply_bytes(r, 11, false));
    send(bytes, After::Linger);
  }

  void on_state(RequestReader::State s) {
    if (closed_) return close();
    using State = RequestReader::State;
    switch (s) {
      case State::NeedMore:
        return read();
      case State::Failed:
        return fail(reader_->failure().status, reader_->failure().message);
      case State::HeadReady:
        return on_head();
      case State::Done: {
        auto ex = std::move(ex_);
        if (!ex) return close();
        ex->body_ = reader_->take_body();
        leftover_ = reader_->take_leftover();
        reader_.reset();
        try {
          core_->h.on_request(ex);
        } catch (const std::exception& e) {
          if (ex->phase_ == Exchange::Phase::Open) {
            ex->phase_ = Exchange::Phase::Answered;  // its destructor must not close first
            fail(500, e.what());
          }
        }
        return;
      }
    }
  }

  void on_head() {
    ex_ = std::make_shared<Exchange>(shared_from_this(), reader_->head(), ip_);
    ex_->body_limit = core_->opt.limits.max_body_bytes;
    std::optional<Reply> refusal;
    try {
      refusal = core_->h.on_head(*ex_);
    } catch (const std::exception& e) {
      ex_->phase_ = Exchange::Phase::Answered;
      return fail(500, e.what());
    }
    if (refusal) {
      ex_->phase_ = Exchange::Phase::Answered;
      ex_.reset();
      const RequestHead head = reader_->head();
      // The body was not read: the connection cannot go on after it. With
      // no body, what follows the head is the next request.
      const bool keep = head.keep_alive && !head.has_body();
      if (keep) leftover_ = reader_->take_leftover();
      reader_.reset();
      auto bytes = std::make_shared<std::string>(reply_bytes(*refusal, head.version, keep));
      return send(bytes, keep ? After::Next : After::Linger);
    }
    reader_->limit_body(ex_->body_limit);
    if (reader_->state() == RequestReader::State::Failed) {
      ex_->phase_ = Exchange::Phase::Answered;
      return on_state(RequestReader::State::Failed);
    }
    if (reader_->head().expect_continue && reader_->head().has_body()) {
      auto cont = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      stream_.expires_after(core_->opt.write_timeout);
      net::async_write(stream_, net::buffer(*cont),
                       [self = shared_from_this(), cont](beast::error_code ec, size_t) {
                         if (ec || self->closed_) return self->close();
                         self->on_state(self->reader_->feed({}));
                       });
      return;
    }
    on_state(reader_->feed({}));
  }

  void send(std::shared_ptr<std::string> bytes, After after) {
    if (closed_) return;
    stream_.expires_after(core_->opt.write_timeout);
    net::async_write(stream_, net::buffer(*bytes),
                     [self = shared_from_this(), bytes, after](beast::error_code ec, size_t) {
                       if (ec) return self->close();
                       if (after == After::Next) return self->next_request();
                       self->linger();
                     });
  }

  // Stops sending, then reads and drops what the client still sends, until
  // it closes or kLinger passes: a reset would lose the answer just sent.
  void linger() {
    if (closed_) return;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    drain(Clock::now() + kLinger);
  }
  void drain(Clock::time_point until) {
    if (closed_ || Clock::now() >= until) return close();
    stream_.expires_at(until);
    stream_.async_read_some(net::buffer(buf_),
                            [self = shared_from_this(), until](beast::error_code ec, size_t) {
                              if (ec) return self->close();
                              self->drain(until);
                            });
  }

  void close() {
    ex_.reset();  // a request cut off before its body ends here
    reader_.reset();
    if (closed_) return;
    closed_ = true;
    read_timer_.cancel();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  std::shared_ptr<HttpServer::Core> core_;
  beast::tcp_stream stream_;
  net::steady_timer read_timer_;
  uint64_t reads_ = 0;  // reads started and ended: a timer acts on its own read only
  bool read_timed_out_ = false;
  std::string ip_;
  std::array<char, 16384> buf_{};
  std::optional<RequestReader> reader_;
  std::string leftover_;  // bytes of the next request, read with this one
  Clock::time_point deadline_;
  std::shared_ptr<Exchange> ex_;  // between the head and the body
  bool closed_ = false;
  std::atomic<bool> closing_{false};
};

// ---- Exchange ---------------------------------------------------------------

Exchange::Exchange(std::shared_ptr<Connection> conn, RequestHead head, std::string peer)
    : conn_(std::move(conn)), head_(std::move(head)), peer_(std::move(peer)) {}

Exchange::~Exchange() {
  if (phase_ != Phase::Answered && conn_) conn_->close_soon();
}

void Exchange::reply(Reply r) {
  if (phase_ != Phase::Open) return;
  phase_ = Phase::Answered;
  conn_->reply(*this, std::move(r));
}

bool Exchange::start(int status, std::string_view content_type, const HeaderList& headers) {
  if (phase_ != Phase::Open) return false;
  phase_ = Phase::Streaming;
  // HTTP/1.0 has no chunks: the body ends with the connection.
  const bool keep = head_.keep_alive && head_.version == 11;
  if (!keep) conn_->close_after_answer();
  return conn_->write_blocking(
      head_bytes(status, head_.version, keep, content_type, headers, std::nullopt));
}

bool Exchange::write(std::string_view data) {
  if (phase_ != Phase::Streaming) return false;
  if (data.empty()) return true;  // an empty chunk would end the body
  if (head_.version != 11) return conn_->write_blocking(std::string(data));
  std::string chunk = fmt::format("{:x}\r\n", data.size());
  chunk.append(data);
  chunk += "\r\n";
  return conn_->write_blocking(std::move(chunk));
}

void Exchange::finish() {
  if (phase_ != Phase::Streaming) return;
  phase_ = Phase::Answered;
  conn_->finish_stream(*this);
}

// ---- the listener -----------------------------------------------------------

void HttpServer::Core::accept() {
  acceptor.async_accept(net::make_strand(ioc),
                        [self = shared_from_this()](beast::error_code ec, tcp::socket s) {
                          if (ec == net::error::operation_aborted) return;
                          {
                            std::lock_guard<std::mutex> lock(self->mu);
                            if (self->closing) return;
                          }
                          if (ec) {  // e.g. out of file descriptors: try again shortly
                            self->accept_retry.expires_after(std::chrono::milliseconds(50));
                            self->accept_retry.async_wait([self](beast::error_code e) {
                              if (!e) self->accept();
                            });
                            return;
                          }
                          self->admit(std::move(s));
                          self->accept();
                        });
}

void HttpServer::Core::admit(tcp::socket s) {
  beast::error_code ec;
  const tcp::endpoint peer = s.remote_endpoint(ec);
  if (ec) return;  // gone already
  const std::string ip = address_of(peer);
  bool shed = false;
  std::shared_ptr<Connection> c;
  {
    // Counted and registered in one step, so that close_all() sees every
    // connection it did not shed.
    std::lock_guard<std::mutex> lock(mu);
    if (closing) return;  // the socket closes with `s`
    const auto it = per_ip.find(ip);
    const int mine = it == per_ip.end() ? 0 : it->second;
    shed = live.size() >= static_cast<size_t>(opt.max_connections) ||
           (opt.max_connections_per_ip > 0 && mine >= opt.max_connections_per_ip);
    if (!shed) {
      ++per_ip[ip];
      c = std::make_shared<Connection>(shared_from_this(), std::move(s), ip);
      live.emplace(c.get(), c);
    }
  }
  if (shed) {
    // Shed before reading a byte: one non-blocking write of a fixed answer.
    h.on_reject("too_many_connections");
    Reply r = h.on_failure(503, "too many connections: try again later", "");
    r.headers.emplace_back("Retry-After", "1");
    const std::string bytes = reply_bytes(r, 11, false);
    s.non_blocking(true, ec);
    s.write_some(net::buffer(bytes), ec);
    s.shutdown(tcp::socket::shutdown_both, ec);
    s.close(ec);
    return;
  }
  c->start();
}

HttpServer::HttpServer(const HttpServerOptions& options, HttpHandlers handlers)
    : core_(std::make_shared<Core>()) {
  core_->opt = options;
  core_->h = std::move(handlers);
  beast::error_code ec;
  const net::ip::address addr = net::ip::make_address(options.host, ec);
  if (ec) {
    throw Error(
        fmt::format("cannot listen on {}: not an IP address of this machine", options.host));
  }
  const tcp::endpoint at(addr, static_cast<unsigned short>(options.port));
  tcp::acceptor& a = core_->acceptor;
  a.open(at.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(at, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Error(
        fmt::format("cannot listen on {}:{} ({})", options.host, options.port, ec.message()));
  }
  core_->port = a.local_endpoint().port();
  core_->accept();
}

HttpServer::~HttpServer() {
  close_all();
  release();
  // Run what is left (the closes, the cancelled accept) here when no thread
  // serves any more: pending handlers hold the Core, which would never be
  // freed otherwise.
  if (core_->runners.load() == 0) {
    core_->ioc.restart();
    core_->ioc.run();
  }
}

int HttpServer::port() const { return core_->port; }

void HttpServer::run() {
  auto serve = [c = core_] {
    ++c->runners;
    c->ioc.run();
    --c->runners;
  };
  std::vector<std::thread> more;
  for (int i = 1; i < core_->opt.io_threads; ++i) more.emplace_back(serve);
  serve();
  for (std::thread& t : more) t.join();
}

void HttpServer::close_all() {
  std::vector<std::shared_ptr<Connection>> conns;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->closing = true;
    for (auto& [p, w] : core_->live) {
      if (auto c = w.lock()) conns.push_back(std::move(c));
    }
  }
  // A weak reference: a post that never runs must not keep the Core alive.
  net::post(core_->accept_strand, [w = std::weak_ptr<Core>(core_)] {
    const std::shared_ptr<Core> c = w.lock();
    if (!c) return;
    beast::error_code ec;
    c->acceptor.close(ec);
    c->accept_retry.cancel();
  });
  for (auto& c : conns) c->close_soon();
}

void HttpServer::release() { core_->guard.reset(); }

int HttpServer::open_connections() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return static_cast<int>(core_->live.size());
}

}  // namespace encore::server
