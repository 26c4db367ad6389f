// One HTTP/1.x request read from untrusted bytes, with every limit applied
// while reading: request line and header bytes, header count, body bytes
// whatever the framing (Content-Length or chunked), and the framing rules
// that keep a request from hiding another (request smuggling).
//
// Parsing is Boost.Beast's request parser (Debian's libboost-dev), fed from
// memory: the connection code (http_server.cpp) and the fuzz target
// (fuzz/fuzz_http_reader.cpp) drive the same code. On top of Beast it
// refuses what Beast lets through but a server should not take: duplicate or
// comma-listed Content-Length, a Transfer-Encoding other than "chunked", a
// missing or repeated Host on HTTP/1.1, a repeated Authorization, more than
// max_header_fields fields, versions other than 1.0 and 1.1.
//
// Use: feed() the bytes as they come. It stops once after the head (state
// HeadReady) so that the caller can decide from the headers alone (route,
// authentication, admission, a lower body limit) before any body byte is
// parsed or buffered; then feed({}) continues with what is already here.
// After Done, take_leftover() holds the bytes of the next request
// (pipelining); after Failed, the connection must be closed (what follows is
// not trustworthy).
//
// Memory: at most max_header_bytes of unparsed input (plus one read) and the
// fields kept from it (counted as they are parsed: the parse stops at the
// first field past max_header_fields, trailers included), plus the body (at
// most the body limit; never reserved from a declared length).
// Ownership: plain values. Thread-safety: none (one per connection).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace encore::server {

struct HttpLimits {
  size_t max_header_bytes = 32 << 10;  // request line and header fields (431 above)
  size_t max_header_fields = 100;      // header fields (431 above)
  size_t max_body_bytes = 8 << 20;     // body after de-chunking (413 above)
};

// The request line and header fields.
struct RequestHead {
  std::string method;  // as sent: "GET", "POST" ...
  std::string target;  // as sent: "/v1/models/x?y"
  std::string path;    // target up to '?'
  int version = 11;    // 10 (HTTP/1.0) or 11
  bool keep_alive = true;
  bool chunked = false;
  std::optional<uint64_t> content_length;
  bool expect_continue = false;                             // Expect: 100-continue (HTTP/1.1 only)
  std::vector<std::pair<std::string, std::string>> fields;  // in order, names as sent

  // The first value of `name` (case-insensitive); "" when absent.
  std::string header(std::string_view name) const;
  // How many fields are named `name` (case-insensitive).
  size_t header_count(std::string_view name) const;
  // True when a body follows the head (chunked, or a Content-Length > 0).
  bool has_body() const { return chunked || content_length.value_or(0) > 0; }
};

// Why a request was refused: an HTTP status (400, 413, 431, 501, 505) and a
// message for the client.
struct HttpFailure {
  int status = 400;
  std::string message;
};

class RequestReader {
 public:
  enum class State {
    NeedMore,   // feed more bytes
    HeadReady,  // the head is read (returned once); feed({}) continues with the body
    Done,       // the whole request is read
    Failed,     // refused: failure() says why; close the connection after answering
  };

  // `leftover`: bytes already received for this request (the previous one's tail).
  explicit RequestReader(const HttpLimits& limits, std::string leftover = {});
  ~RequestReader();
  RequestReader(const RequestReader&) = delete;
  RequestReader& operator=(const RequestReader&) = delete;

  State feed(std::string_view bytes);
  State state() const { return state_; }
  // Any byte of this request received (leftover included).
  bool started() const { return started_; }

  const RequestHead& head() const { return head_; }  // from HeadReady on
  // Lowers the body limit of this request (after HeadReady, before the next
  // feed): a declared Content-Length above it fails at once with 413.
  void limit_body(size_t max_bytes);
  std::string take_body();      // Done
  std::string take_leftover();  // Done: the bytes after this request
  const HttpFailure& failure() const { return failure_; }
  // Bytes this reader holds now: unparsed input and the body so far.
  size_t held_bytes() const;

 private:
  State parse();
  State fail(int status, std::string message);
  State check_head();

  struct Parser;  // Beast's parser, kept out of this header
  std::unique_ptr<Parser> parser_;
  HttpLimits limits_;
  std::string pending_;  // received, not yet consumed by the parser
  RequestHead head_;
  HttpFailure failure_;
  State state_ = State::NeedMore;
  bool head_done_ = false;
  bool started_ = false;
};

}  // namespace encore::server
