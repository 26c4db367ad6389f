// `encore`: run, batch, inspect and synthesise GGUF models; tokenize and
// detokenize; bench.
#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <thread>

#include "cli/commands.h"
#include "encore/error.h"

namespace encore::cli {

int default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace encore::cli

int main(int argc, char** argv) {
  // A file size limit (ulimit -f) makes writes fail with EFBIG, reported by
  // the state store, instead of killing the process.
  signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"Encore: reproducible LLM inference for GGUF models", "encore"};
  app.set_version_flag("--version", ENCORE_VERSION);
  app.require_subcommand(1);
  encore::cli::add_run_command(app);
  encore::cli::add_inspect_command(app);
  encore::cli::add_synth_command(app);
  encore::cli::add_tokenize_commands(app);
  encore::cli::add_bench_command(app);
  encore::cli::add_batch_command(app);
  encore::cli::add_chat_command(app);
  encore::cli::add_cache_command(app);
  encore::cli::add_serve_command(app);
  encore::cli::add_template_command(app);
  encore::cli::add_settings_command(app);
  encore::cli::add_audit_command(app);
  encore::cli::add_replay_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const encore::Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error (unexpected): {}\n", e.what());
    return 2;
  }
  return 0;
}
