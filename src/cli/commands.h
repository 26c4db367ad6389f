// Sub-commands of the `encore` binary. Each add_* registers its flags and a
// callback on `app`; callbacks throw encore::Error on bad input, which
// main() prints as one "error:" line and turns into exit code 1.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "encore/dtype.h"
#include "encore/tokenizer.h"

namespace encore::cli {

void add_run_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_synth_command(CLI::App& app);
// `encore tokenize` and `encore detokenize`.
void add_tokenize_commands(CLI::App& app);

void add_bench_command(CLI::App& app);
// `encore batch`: a JSONL file of requests through one engine.
void add_batch_command(CLI::App& app);
// `encore chat`: a multi-turn conversation in the terminal.
void add_chat_command(CLI::App& app);
// `encore cache`: the saved state as files and keys.
void add_cache_command(CLI::App& app);
// `encore serve`: the OpenAI-compatible HTTP server.
void add_serve_command(CLI::App& app);
// `encore template`: a Jinja chat template rendered with a JSON context.
void add_template_command(CLI::App& app);
// `encore settings` (hidden): the settings table as docs/settings.md shows it.
void add_settings_command(CLI::App& app);

// `encore audit verify` and `encore replay`: the audit log (docs/audit.md).
void add_audit_command(CLI::App& app);
void add_replay_command(CLI::App& app);

// The tokenizer of a model file (read through a mapping).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// --kv-type: "f16" or "f32" (throws InvalidArgument otherwise).
DType parse_kv_type(const std::string& s);

// Threads to use when -t is not given: every core the machine has.
int default_threads();

}  // namespace encore::cli
