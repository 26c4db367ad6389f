// Error types thrown at Encore's boundaries (files, requests, CLI arguments).
//
// Every message says what was wrong, where (file, key, tensor, byte offset,
// request field) and, where useful, what to do. Asserts are reserved for
// programmer bugs; library code never calls exit().
#pragma once

#include <stdexcept>
#include <string>

namespace encore {

// Base class of every error Encore throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
// context, invalid flag value ...).
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
// Like InvalidArgument the message starts with the request field ("session:
// ") and says why: none saved (never saved, removed, or expired), a record
// that cannot be used (damaged, unreadable) or one saved by another model,
// and what to do (send a prompt, which starts the session afresh).
class NotFound : public Error {
 public:
  using Error::Error;
};

}  // namespace encore
