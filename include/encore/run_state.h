// The JSON file of `encore run --save-state` / `--resume`: everything needed
// to continue a generation in another process with bit-identical results:
// the request (prompt ids, seed, sampling, stop strings ...) with, in
// Request::resume, each sample's SampleState (request.h). The KV cache is not
// in it: it is recomputed from the ids (persisted KV snapshots come with the
// snapshot store).
//
// The file is untrusted input: load_run_state() checks its size, every
// field's type and range, and names the field in its errors.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "encore/request.h"

namespace encore {

struct RunState {
  std::string system_fingerprint;  // must equal the resuming engine's
  int32_t n_ctx = 0;               // the context size bounds the output (finish reason "context")
  // prompt_ids, seed, sampling, n, logprobs, stop, ignore_eos and, in
  // `resume`, the samples' states. max_tokens, tenant and priority are a
  // call's, not the generation's: not saved.
  Request request;
  // A session record's counts (none in a --save-state file):
  // - session_seed: the seed of its first turn. A new turn without a seed
  //   takes session_seed + its turn index, as `encore chat` counts (turn k
  //   of a chat: k user messages, session_seed + k - 1).
  // - turns: turns with a new prompt so far (1 after the first).
  // - generation and saved_ms (Unix ms, the writer's clock): the same
  //   session may be in several tiers, a replica's own directory holding an
  //   older turn than Redis after the session went on elsewhere: the record
  //   with the highest (generation, saved_ms) wins (load_session).
  std::optional<uint64_t> session_seed;
  int64_t turns = 0;
  uint64_t generation = 0;
  uint64_t saved_ms = 0;
};

// The state to save after `response` answered `request` (a plain prompt,
// ids or messages: the evaluated ids are saved).
RunState run_state_after(const Request& request, const Response& response,
                         const std::string& system_fingerprint, int32_t n_ctx);

// Writes atomically (a temporary file renamed over `path`).
void save_run_state(const std::string& path, const RunState& state);
// The file's text (also what a session record holds).
std::string run_state_json(const RunState& state);
// Throws InvalidArgument naming the file and field.
RunState load_run_state(const std::string& path);
// The same for the file's text; `where` starts every error message.
RunState parse_run_state(std::string_view text, const std::string& where);

// The parts of a run state that other records share (the audit log,
// include/encore/audit.h), in the same JSON shapes:
// - a request's generation settings (sampling, n, logprobs, stop,
//   ignore_eos; a run state's "request" object without the conversation);
nlohmann::ordered_json generation_json(const Request& request);
// - read back from untrusted JSON into `request` (errors start with `where`
//   and name the field);
void parse_generation(const nlohmann::ordered_json& j, const std::string& where, Request& request);
// - the sample states (a run state's "samples" array).
nlohmann::ordered_json sample_states_json(const std::vector<SampleState>& states);

}  // namespace encore
