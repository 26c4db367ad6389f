#include "server/http_guard.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

namespace encore::server {
namespace {

using Clock = std::chrono::steady_clock;

int to_ms(time_t sec, time_t usec) { return static_cast<int>(sec * 1000 + usec / 1000); }

// Waits until `sock` has `events`, or an error or hang-up (which the next
// recv/send then reports), or `ms` pass; false on timeout.
bool wait_for(socket_t sock, short events, int ms) {
  pollfd p{sock, events, 0};
  for (;;) {
    const int r = poll(&p, 1, std::max(ms, 0));
    if (r < 0 && errno == EINTR) continue;
    return r > 0 && (p.revents & (events | POLLERR | POLLHUP | POLLNVAL)) != 0;
  }
}

// Bytes received and not yet parsed: one per connection, so that a
// pipelined request read along with the one before it is not lost.
struct ReadBuffer {
  std::array<char, 4096> data{};  // [len] bytes received, [off, len) not yet read
  size_t off = 0, len = 0;
};

void address_of(socket_t sock, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  const int r = peer ? getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len)
                     : getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len);
  if (r != 0) return;
  std::array<char, NI_MAXHOST> host{};
  std::array<char, NI_MAXSERV> serv{};
  if (getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host.data(), host.size(), serv.data(),
                  serv.size(), NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host.data();
    port = std::atoi(serv.data());
  }
}

// One request's view of the connection: buffered reads that wait at most
// the per-read timeout and never past the request's deadline.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(socket_t sock, ReadBuffer& buf, int read_ms, int write_ms,
                 Clock::time_point deadline)
      : sock_(sock), buf_(buf), read_ms_(read_ms), write_ms_(write_ms), deadline_(deadline) {}

  // A read gave up waiting: the client stalled or its request was overdue.
  bool timed_out() const { return timed_out_; }

  bool is_readable() const override {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
    if (left <= 0) {
      timed_out_ = true;
      return false;
    }
    if (wait_for(sock_, POLLIN, static_cast<int>(std::min<int64_t>(left, read_ms_)))) return true;
    timed_out_ = true;  // a stall (read timeout) or the deadline
    return false;
  }
  bool is_writable() const override { return wait_for(sock_, POLLOUT, write_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    if (buf_.off < buf_.len) {
      const size_t n = std::min(size, buf_.len - buf_.off);
      std::memcpy(ptr, buf_.data.data() + buf_.off, n);
      buf_.off += n;
      return static_cast<ssize_t>(n);
    }
    if (!is_readable()) return -1;
    // Small reads (the line reader asks for one byte) go through the buffer.
    const bool small = size < buf_.data.size();
    char* to = small ? buf_.data.data() : ptr;
    const size_t want = small ? buf_.data.size() : size;
    ssize_t n;
    do {
      n = recv(sock_, to, want, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0 || !small) return n;
    buf_.len = static_cast<size_t>(n);
    buf_.off = 0;
    return read(ptr, size);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(sock_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(sock_, false, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  socket_t sock_;
  ReadBuffer& buf_;
  int read_ms_, write_ms_;
  Clock::time_point deadline_;
  mutable bool timed_out_ = false;
};

}  // namespace

bool GuardedHttpServer::process_and_close_socket(socket_t sock) {
  const int read_ms = to_ms(read_timeout_sec_, read_timeout_usec_);
  const int write_ms = to_ms(write_timeout_sec_, write_timeout_usec_);
  bool ok = false;
  ReadBuffer buf;
  // httplib's keep-alive loop: wait for the next request in short slices so
  // that stop() is noticed, then serve it.
  for (size_t left = keep_alive_max_count_; left > 0; --left) {
    const auto idle_end = Clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    bool readable = buf.off < buf.len;  // pipelined: already here
    while (!readable && svr_sock_ != INVALID_SOCKET && Clock::now() < idle_end) {
      readable = wait_for(sock, POLLIN, 100);
    }
    if (!readable || svr_sock_ == INVALID_SOCKET) break;
    DeadlineStream strm(sock, buf, read_ms, write_ms, Clock::now() + read_deadline_);
    bool closed = false;
    ok = process_request(strm, left == 1, closed, nullptr);
    if (strm.timed_out() && on_cut_off_) on_cut_off_();
    if (!ok || closed || strm.timed_out()) break;
  }
  shutdown(sock, SHUT_RDWR);
  close(sock);
  return ok;
}

}  // namespace encore::server
