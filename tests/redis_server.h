// A real redis-server (Debian's, installed by scripts/setup.sh) for tests:
// started on a free loopback port with no persistence, stopped (SIGKILL if
// need be) when the object dies. Tests may stop and start it again to
// simulate an outage.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

namespace encore::test {

inline int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    throw std::runtime_error("no free loopback port");
  }
  const int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

class RedisServer {
 public:
  RedisServer() : port_(free_loopback_port()) { start(); }
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }
  int port() const { return port_; }

  void start() {
    if (pid_ > 0) return;
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      const std::string port = std::to_string(port_);
      freopen("/dev/null", "w", stdout);
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", "/tmp", nullptr);
      _exit(127);  // not installed: scripts/setup.sh installs redis-server
    }
    // Ready when it answers PING (bounded: 10 s).
    for (int i = 0; i < 1000; ++i) {
      if (cli("PING") == "PONG\n") return;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("redis-server exited at start (is it installed?)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    stop();
    throw std::runtime_error("redis-server did not answer PING within 10 s");
  }

  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // One redis-cli command's output ("" if it failed).
  std::string cli(const std::string& args) const {
    const std::string cmd =
        "redis-cli -h 127.0.0.1 -p " + std::to_string(port_) + " " + args + " 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return {};
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
    return out;
  }

 private:
  int port_;
  pid_t pid_ = -1;
};

}  // namespace encore::test
