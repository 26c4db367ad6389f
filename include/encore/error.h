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

}  // namespace encore
