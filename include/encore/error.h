// Error types thrown at Encore's boundaries (files, requests, CLI arguments).
//
// Every message says what was wrong, where (file, key, tensor, byte offset,
// request field) and, where useful, what to do. Asserts are reserved for
// programmer bugs; library code never calls exit().
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace encore {

// Base class of every error Encore throws on purpose. An error about one
// field names it as data: field() is the request field or option in the
// settings table's names (settings.h: "temperature", "max_tokens",
// "prompt_ids[2]", "messages[0].role", "session", "threads"), set where it is
// thrown and read by each front end to point at what its user typed (the
// OpenAI "param", a CLI flag) without parsing the message. what() is
// "FIELD: MESSAGE", or the message alone when there is no field; message()
// is the part after the field.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
  explicit Error(const char* message) : std::runtime_error(message) {}
  Error(std::string field, const std::string& message)
      : std::runtime_error(field.empty() ? message : field + ": " + message),
        field_(std::move(field)) {}
  const std::string& field() const { return field_; }
  std::string message() const {
    return field_.empty() ? std::string(what()) : std::string(what()).substr(field_.size() + 2);
  }

 private:
  std::string field_;
};

// A malformed or unsupported GGUF file. The message names the file, the key
// or tensor involved and the byte offset where the problem was found.
class GgufError : public Error {
 public:
  using Error::Error;
};

// A model file that is valid GGUF but cannot be run (missing keys, shapes
// that do not fit the architecture, unsupported tensor types ...).
class ModelError : public Error {
 public:
  using Error::Error;
};

// Bad user input to an API call or command (prompt too long for the
// context, invalid flag value ...), naming the field where there is one.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A fixed-size resource (KV cache blocks, ...) is exhausted.
class ResourceExhausted : public Error {
 public:
  using Error::Error;
};

// Something a request needs and names does not exist (the server answers
// 404). Today: a session continued without a new prompt (Request::session,
// no prompt, ids or messages) with no usable saved session for the tenant.
// Its field() is "session"; the message says why: none saved (never saved, removed, or expired), a
// record that cannot be used (damaged, unreadable) or one saved by another model, and what to do
// (send a prompt, which starts the session afresh).
class NotFound : public Error {
 public:
  using Error::Error;
};

}  // namespace encore
