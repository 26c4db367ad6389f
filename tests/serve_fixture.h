// The real `encore serve` binary for tests: started on a free loopback port,
// ready when /health says 200, stopped with SIGTERM (SIGKILL if it hangs).
#pragma once

#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli_runner.h"
#include "redis_server.h"

namespace encore::test {

class ServeProcess {
 public:
  ServeProcess(const std::string& model, const std::vector<std::string>& extra)
      : port_(free_loopback_port()) {
    std::vector<std::string> args = {ENCORE_BINARY, "serve",  "-m",
                                     model,         "--port", std::to_string(port_)};
    if (std::find(extra.begin(), extra.end(), "-t") == extra.end()) {
      args.insert(args.end(), {"-t", "2"});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      setenv("XDG_CACHE_HOME", tmp_.path.c_str(), 1);
      freopen(tmp_.file("stderr").c_str(), "w", stderr);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    httplib::Client c = client();
    for (int i = 0; i < 500; ++i) {  // ready within 10 s
      if (auto r = c.Get("/health"); r && r->status == 200) return;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return;  // ready() is false; stderr() says why
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~ServeProcess() { stop(); }

  bool ready() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(port_); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(std::chrono::seconds(60));
    c.set_connection_timeout(std::chrono::seconds(5));
    return c;
  }
  std::string stderr_text() const { return read_file(tmp_.file("stderr")); }

  // SIGTERM; returns the exit code (-1: killed after 30 s, or not running).
  int stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    return wait_exit();
  }
  // Waits (30 s at most, then SIGKILL) for the process to end; its exit code.
  int wait_exit() {
    if (pid_ <= 0) return -1;
    int status = 0;
    for (int i = 0; i < 3000; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return -1;
  }

 private:
  TempDir tmp_;
  int port_;
  pid_t pid_ = -1;
};

// POSTs a JSON body to `path`: the answer parsed (null when none came or it
// is not JSON), and its status in *status (0 when none came).
inline nlohmann::json post_json(const ServeProcess& s, const std::string& path,
                                const nlohmann::json& body, int* status,
                                const httplib::Headers& headers = {}) {
  httplib::Client c = s.client();
  auto r = c.Post(path, headers, body.dump(), "application/json");
  *status = r ? r->status : 0;
  if (!r) return nlohmann::json();
  return nlohmann::json::parse(r->body, nullptr, false);
}

}  // namespace encore::test
