// OpenAI request shapes: a /v1/completions or /v1/chat/completions JSON body,
// or one line of an `encore batch` JSONL file, turned into a plain Request
// (request.h). Shared by `encore batch` and, later, the HTTP server.
//
// Mapping: absent or null fields keep the defaults of Request and
// SamplingParams (llama.cpp's, as llama-server does), except max_tokens
// (completions: 16, OpenAI's documented default; chat: unlimited). Unknown
// fields are ignored; "model" and "user" must be strings and are ignored (the
// tenant is never client-supplied). "session_id" is not read into the Request
// (the server takes it; `encore batch` ignores it) but must satisfy
// valid_session_id() (request.h: 1 to 128 bytes of [A-Za-z0-9_.-]; "" is an
// error, not "no session"). Every field is checked for type and range here,
// with a RequestError naming it; vocabulary-dependent checks (token ids <
// n_vocab, a logit_bias that bans every token) and chat roles (each template
// family has its own set) happen at Engine::submit().
//
// logit_bias: OpenAI's -100 ("a ban or exclusive selection") is a hard ban,
// stored as -inf (SamplingParams::logit_bias: -inf is never drawn while a
// token is left); other values in [-100, 100] are added to the logit.
//
// Unsupported OpenAI fields that would change the answer are refused with a
// RequestError naming them (never silently ignored), on the endpoint where
// OpenAI defines them. Chat: "response_format" other than {"type": "text"},
// a non-empty "tools" or "functions" (legacy) array, "tool_choice" or
// "function_call" (legacy) other than "none". Completions: "echo": true, a
// non-empty "suffix", "best_of" other than n (OpenAI: best_of >= n; best_of >
// n picks server-side, which Encore does not do). Their types are checked as
// OpenAI documents them (echo a boolean, suffix a string, best_of an
// integer, tools an array ...). Accepted: the values that ask for nothing
// (absent, null, echo false, suffix "", best_of == n, tools [], tool_choice
// "none", response_format {"type": "text"}).
//
// Messages quote a client's values clipped to at most 40 bytes (valid UTF-8),
// so a megabyte-sized value never comes back whole.
//
// Special tokens: a text prompt is plain text ("</s>" in it is the letters,
// not EOS) unless the body has the extension "parse_special": true (a
// boolean; /v1/completions only). Chat message content is always plain text:
// only the chat template's own markers become special tokens (chat_template.h),
// and "parse_special": true on a chat request is refused.
//
// Untrusted input: lines longer than kMaxLineBytes are refused before
// parsing, nesting is bounded, and message and prompt id counts are checked
// before anything is allocated for them.
//
// Ownership: plain values; nothing is retained. Cost: O(input size); a batch
// line is parsed into a JSON tree of a few times its size first.
// Thread-safety: every function is pure and may be called concurrently.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "encore/error.h"
#include "encore/request.h"

namespace encore::api {

enum class Endpoint { Completions, ChatCompletions };

// An invalid request. what() is "FIELD: MESSAGE" (just MESSAGE when the field
// is ""); the message says the allowed type or range and what was given.
// field() is the JSON field as a path relative to the request body
// ("temperature", "messages[2].content", "logit_bias.15043", "stop[1]"); for
// a batch line's envelope "custom_id", "method", "url" or "body". "" when the
// error is not about one field (JSON syntax, a body that is not an object).
// Numeric settings are checked against the settings table (settings.h), the
// same ranges as the CLI flags and Request::validate.
class RequestError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// body: one request object. Throws RequestError.
Request parse_request(const nlohmann::json& body, Endpoint endpoint);

// A request to the server's completion endpoints: the Request, with its
// session (`session_id`, which `encore batch` does not take), and what only
// the HTTP answer uses (`stream_options.include_usage`, allowed only with
// `stream`). Throws RequestError.
struct ServerRequest {
  Request request;
  bool include_usage = false;
};
ServerRequest parse_server_request(const nlohmann::json& body, Endpoint endpoint);

// One line of an `encore batch` JSONL file: either a flat request object with
// an optional "custom_id" (string), or OpenAI's Batch API envelope
// {"custom_id", "method": "POST", "url": "/v1/completions" or
// "/v1/chat/completions", "body": {...}} (a line with "body", "url" or
// "method" is an envelope). A flat object is a chat request when it has
// "messages", else a completion. Throws RequestError (field "" for JSON
// syntax errors, with the parser's byte offset in the message).
struct BatchLine {
  std::optional<std::string> custom_id;
  Endpoint endpoint = Endpoint::Completions;
  Request request;
};
BatchLine parse_batch_line(std::string_view line);

// The request field (OpenAI's name: the "param" of an error answer) an
// error is about: its field() with the engine's own names mapped
// ("prompt_ids[2]" -> "prompt[2]", "session" -> "session_id"); "" when it
// names none.
std::string param_of(const Error& e);

// A request body's JSON tree, with the bounds of a batch line (size,
// nesting). Throws RequestError (field "") with the byte offset of a
// syntax error.
nlohmann::json parse_json_body(std::string_view text);

// The custom_id of a line even when the rest of it is invalid (for error
// results); nullopt when there is none or the line is not a JSON object.
// Never throws RequestError.
std::optional<std::string> peek_custom_id(std::string_view line);

inline constexpr size_t kMaxLineBytes = size_t{16} << 20;  // longer lines: RequestError

}  // namespace encore::api
