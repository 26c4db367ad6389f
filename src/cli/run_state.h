// The JSON file of `encore run --save-state` / `--resume`: everything needed
// to continue a generation in another process with bit-identical results
// (the request and, per sample, the SampleState of engine.h). The KV cache is
// not in it: it is recomputed from the ids (persisted KV snapshots come with
// the snapshot store).
//
// The file is untrusted input: load_run_state() checks its size, every
// field's type and range, and names the field in its errors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "encore/engine.h"

namespace encore::cli {

struct RunState {
  std::string system_fingerprint;  // must equal the resuming process's
  std::vector<TokenId> prompt_ids;
  int32_t n_ctx = 0;      // the context size bounds the output (finish reason "context")
  GenerateParams params;  // the request, seed included; n_predict and prefill_chunk are not saved
  std::vector<SampleState> samples;
};

// Writes atomically (a temporary file renamed over `path`).
void save_run_state(const std::string& path, const RunState& state);
// Throws InvalidArgument naming the file and field.
RunState load_run_state(const std::string& path);
// The same for the file's text; `where` starts every error message.
RunState parse_run_state(std::string_view text, const std::string& where);

}  // namespace encore::cli
