// An httplib::Server whose connections must send each whole request (line,
// headers, body) within a deadline, besides progressing within the
// per-read timeout. httplib 0.11 bounds each read only, so a client that
// trickles a byte a second ("slowloris") would hold a worker thread for as
// long as it likes; here it is cut off when its deadline passes and counted.
//
// How: httplib lets a subclass serve a connection itself (the virtual
// process_and_close_socket, as its SSLServer does) and parse requests from
// any Stream (process_request). This one reads through a Stream whose reads
// stop at the deadline; the keep-alive loop is httplib's, rewritten.
//
// Thread-safety: as httplib::Server.
#pragma once

#include <httplib.h>

#include <chrono>
#include <functional>

namespace encore::server {

class GuardedHttpServer : public httplib::Server {
 public:
  // Set before listening. Every request's bytes must have arrived this long
  // after its first byte did (writing the answer is not bounded by it).
  void set_request_read_deadline(std::chrono::milliseconds d) { read_deadline_ = d; }
  // Called (on the connection's thread) for each connection closed because
  // a started request stalled (read timeout) or was not all there by its
  // deadline; such a client gets httplib's 400 or a closed connection. A
  // connection that never starts a request is closed after the keep-alive
  // timeout, uncounted. Set before listening.
  void on_cut_off(std::function<void()> f) { on_cut_off_ = std::move(f); }

 private:
  bool process_and_close_socket(socket_t sock) override;

  std::chrono::milliseconds read_deadline_{30000};
  std::function<void()> on_cut_off_;
};

}  // namespace encore::server
