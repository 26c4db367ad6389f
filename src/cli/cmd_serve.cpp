// `encore serve`: the OpenAI-compatible HTTP server (include/encore/server.h).
// The socket is bound first, so /health answers 503 while the model loads;
// SIGTERM or SIGINT stops taking requests, lets those in flight finish (up
// to --shutdown-grace, then cancels them) and exits 0; a second signal exits
// at once.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/setting_flags.h"
#include "encore/engine.h"
#include "encore/error.h"
#include "encore/server.h"

namespace encore::cli {
namespace {

struct ServeArgs {
  std::string model;
  ServerOptions server;
  EngineFlags engine;
  AuditFlags audit;
  int shutdown_grace_s = settings::kShutdownGrace.int_default();
  int shutdown_delay_s = settings::kShutdownDelay.int_default();
};

// Each connection holds a file descriptor: raise the soft limit to the hard
// one, and keep --max-connections below what it allows (with room for the
// model, the state store and the listener), saying so.
void raise_file_limit(ServerOptions& so) {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
    getrlimit(RLIMIT_NOFILE, &r);
  }
  const rlim_t room = r.rlim_cur > 256 ? r.rlim_cur - 128 : r.rlim_cur / 2;
  if (r.rlim_cur != RLIM_INFINITY && static_cast<rlim_t>(so.max_connections) > room) {
    fmt::print(stderr,
               "serve: --max-connections {} lowered to {} (open-file limit {}; raise it with "
               "ulimit -n)\n",
               so.max_connections, room, r.rlim_cur);
    so.max_connections = static_cast<int>(room);
  }
}

void run_serve(const ServeArgs& a) {
  // SIGTERM and SIGINT are taken by one thread with sigwait, never by a
  // handler; every thread started from here on inherits the mask. The first
  // signal drains (or, while the model loads, exits at once); a second one
  // exits at once.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::mutex mu;
  std::condition_variable cv;
  int received = 0;
  bool ready = false;
  std::thread([&] {
    for (;;) {
      int sig = 0;
      sigwait(&stop_signals, &sig);
      std::lock_guard<std::mutex> lock(mu);
      if (++received > 1 || !ready) {
        fmt::print(stderr, "serve: {}: exiting now\n",
                   received > 1 ? "second signal" : "stopped while loading");
        std::_Exit(received > 1 ? 1 : 0);
      }
      fmt::print(stderr, "serve: {} received: finishing the requests in flight (up to {} s)\n",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", a.shutdown_grace_s);
      cv.notify_all();
    }
  }).detach();

  ServerOptions so = a.server;
  so.audit = audit_options(a.audit);
  so.log = [](std::string_view line) { fmt::print(stderr, "serve: {}\n", line); };
  raise_file_limit(so);
  const std::unique_ptr<Server> server = Server::create(so);
  fmt::print(stderr, "serve: listening on http://{}:{} (loading {})\n", so.host, server->port(),
             a.model);
  std::thread http([&] { server->run(); });
  std::unique_ptr<Engine> engine;
  try {
    EngineOptions eo = engine_options(a.model, a.engine, false);
    eo.tenant_shares.bytes = server->tenant_state_shares();  // the keys' state_mib=N
    engine = Engine::open(eo);
  } catch (...) {
    server->drain_and_stop(std::chrono::seconds(0));
    http.join();
    throw;
  }
  server->set_engine(engine.get());
  const EngineInfo& info = engine->info();
  fmt::print(stderr, "serve: ready ({} threads, {} kernels, context {}, KV {} blocks, {})\n",
             info.threads, isa_name(info.isa), info.n_ctx, info.kv_blocks, info.system_fingerprint);
  {
    std::unique_lock<std::mutex> lock(mu);
    ready = true;
    cv.wait(lock, [&] { return received > 0; });
  }
  server->drain_and_stop(std::chrono::seconds(a.shutdown_grace_s),
                         std::chrono::seconds(a.shutdown_delay_s));
  http.join();
  engine->drain();  // sessions and snapshots are written
  fmt::print(stderr, "serve: stopped\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand("serve", "An OpenAI-compatible HTTP server on the model");
  sub->add_option("-m,--model", args->model, "Model .gguf")->required();
  sub->add_option("--host", args->server.host, "Address to listen on")->capture_default_str();
  sub->add_option("--api-keys", args->server.api_keys_file,
                  "Require Authorization: Bearer KEY; lines: KEY TENANT [max_in_flight=N] "
                  "[state_mib=N] [revoked]")
      ->type_name("FILE");
  sub->add_option("--chat-template", args->server.chat_template,
                  "Chat template family for chat requests (default: the model's)")
      ->type_name("NAME");
  sub->add_option("--model-name", args->server.model_name, "The model id /v1/models reports")
      ->capture_default_str();
  // The limits (settings.h), checked again by Server::create with the same table.
  add_setting_flags(sub, args->server, settings::kServe);
  add_setting_flag(sub, settings::kShutdownGrace, args->shutdown_grace_s);
  add_setting_flag(sub, settings::kShutdownDelay, args->shutdown_delay_s);
  add_engine_flags(sub, args->engine,
                   kComputeFlags | kPrefixFlag | kStateFlags | kSeedFlag | kChatFlags,
                   settings::kServe);
  exclude_template_flags(sub);
  add_audit_flags(sub, args->audit, settings::kServe);
  sub->callback([args] { run_serve(*args); });
}

}  // namespace encore::cli
