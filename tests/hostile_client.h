// Tools for tests that play a hostile client against the real `encore serve`
// on loopback: raw TCP connections (from any 127.0.0.0/8 source address, so
// that one test can be several clients), the server's memory from /proc, and
// a watcher that checks /health keeps answering within a second.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace encore::test {

using Clock = std::chrono::steady_clock;

// One TCP connection to 127.0.0.1:port from `source` (e.g. "127.0.0.2").
class RawConn {
 public:
  explicit RawConn(int port, const char* source = "127.0.0.1") {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    inet_pton(AF_INET, source, &from.sin_addr);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
        connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      if (fd_ >= 0) close(fd_);
      fd_ = -1;
    }
  }
  ~RawConn() {
    if (fd_ >= 0) close(fd_);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  // False once the server closed or reset the connection.
  bool send_all(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Everything received until the server closes the connection or `limit`
  // passes (then timed_out() is true).
  std::string read_until_close(std::chrono::milliseconds limit) {
    std::string got;
    const auto end = Clock::now() + limit;
    char buf[65536];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
      if (left.count() <= 0) {
        timed_out_ = true;
        return got;
      }
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return got;  // closed (0) or reset
      got.append(buf, static_cast<size_t>(n));
    }
  }
  bool timed_out() const { return timed_out_; }

  // True once the server has closed the connection (without waiting).
  bool closed_by_server() {
    char buf[4096];
    for (;;) {
      const ssize_t n = recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
      if (n < 0) return false;
    }
  }

 private:
  int fd_ = -1;
  bool timed_out_ = false;
};

// The status codes of the responses in `bytes`, in order ("HTTP/1.1 413 ..."
// at the start of each response; 100 Continue included).
inline std::vector<int> statuses(const std::string& bytes) {
  std::vector<int> out;
  for (size_t at = bytes.find("HTTP/1."); at != std::string::npos;
       at = bytes.find("HTTP/1.", at + 1)) {
    if (at + 12 <= bytes.size() && bytes[at + 8] == ' ' && std::isdigit(bytes[at + 9]) &&
        std::isdigit(bytes[at + 10]) && std::isdigit(bytes[at + 11])) {
      out.push_back(std::atoi(bytes.substr(at + 9, 3).c_str()));
    }
  }
  return out;
}

// A field of /proc/PID/status in KiB (VmRSS: resident now, VmHWM: its peak).
inline int64_t proc_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atoll(line.c_str() + field.size() + 1);
  }
  return -1;
}

// Asks GET /health (and /metrics) every 100 ms from 127.0.0.1 on a fresh
// connection each time, with a 1 s limit, until stopped: the slowest answer
// and the number of missing or non-200 answers.
class HealthWatch {
 public:
  explicit HealthWatch(int port) : port_(port) {
    t_ = std::thread([this] {
      for (int i = 0; !stop_; ++i) {
        httplib::Client c("127.0.0.1", port_);
        c.set_connection_timeout(std::chrono::seconds(1));
        c.set_read_timeout(std::chrono::seconds(1));
        const auto start = Clock::now();
        auto r = c.Get(i % 2 == 0 ? "/health" : "/metrics");
        const double took = std::chrono::duration<double>(Clock::now() - start).count();
        {
          std::lock_guard<std::mutex> lock(mu_);
          slowest_ = std::max(slowest_, took);
          ++asked_;
          if (!r || r->status != 200) ++failed_;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  ~HealthWatch() { stop(); }
  void stop() {
    stop_ = true;
    if (t_.joinable()) t_.join();
  }
  double slowest() const {
    std::lock_guard<std::mutex> lock(mu_);
    return slowest_;
  }
  int failed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }
  int asked() const {
    std::lock_guard<std::mutex> lock(mu_);
    return asked_;
  }

 private:
  int port_;
  std::atomic<bool> stop_{false};
  std::thread t_;
  mutable std::mutex mu_;
  double slowest_ = 0;
  int failed_ = 0, asked_ = 0;
};

}  // namespace encore::test
