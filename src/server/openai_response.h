// OpenAI's response shapes for /v1/completions and /v1/chat/completions:
// whole bodies and Server-Sent-Event chunks, with Encore's additions
// (top-level `seed`, per choice `output_hash`, usage's cached tokens, and
// for a request with a session `session_id` and `session_continued`).
//
// finish_reason: eog and stop -> "stop"; length and context -> "length".
// Pure functions over plain data; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "encore/engine.h"

namespace encore::server {

using Json = nlohmann::ordered_json;

struct ReplyContext {
  bool chat = false;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  std::string system_fingerprint;
  int32_t logprobs = -1;  // as in the Request: -1 none, N: N alternatives
  // The request's session_id ("" for none) and whether a saved session was
  // continued (else the request started it): extension fields of every
  // answer and chunk of a request with a session.
  std::string session;
  bool session_continued = false;
};

const char* openai_finish_reason(FinishReason r);

// The whole answer of a non-streamed request.
Json reply_json(const ReplyContext& c, const Response& r);

// Streamed: the first chunk of a chat choice (the assistant role), a chunk
// for a piece of text (with the token's logprobs when asked), the last chunk
// of a choice, and the usage chunk (stream_options.include_usage).
// `text_offset`: the bytes of the choice's earlier tokens' texts (the
// completions logprobs' text_offset, as in the whole answer).
Json role_chunk(const ReplyContext& c, uint64_t seed, int choice);
Json text_chunk(const ReplyContext& c, uint64_t seed, int choice, const std::string& text,
                const std::optional<LogprobEntry>& lp, size_t text_offset);
// `reason`: openai_finish_reason(), or "cancelled" for a stream cut at shutdown.
Json finish_chunk(const ReplyContext& c, uint64_t seed, int choice, std::string_view reason,
                  const std::string& output_hash);
Json usage_chunk(const ReplyContext& c, const Response& r);

// {"error": {"message", "type", "param", "code"}}.
Json error_json(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code = "");

}  // namespace encore::server
