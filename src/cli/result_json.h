// The JSON of one finished request, as `encore run --json` prints it and
// `encore batch` writes it per line: prompt_ids; ids, text, logprobs,
// finish_reason and output_hash (or a `choices` list of them when n > 1);
// seed, system_fingerprint, model_fingerprint, n_ctx, usage and, for a chat,
// chat_template.
#pragma once

#include <nlohmann/json.hpp>

#include "encore/engine.h"

namespace encore::cli {

// with_top: list the top alternatives of each token (logprobs > 0).
nlohmann::ordered_json response_json(const Engine& engine, const Response& r, int n, bool with_top);

}  // namespace encore::cli
