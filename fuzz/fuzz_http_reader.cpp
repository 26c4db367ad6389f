// libFuzzer target for the HTTP request reader of `encore serve`
// (src/server/http_reader.h): request line, headers, Content-Length and
// chunked framing, pipelined requests, fed in pieces of any size as a socket
// delivers them. The first input byte picks the piece size and the body
// limit set after the head; the rest is the bytes from the client.
//
// Checked on every input: no crash, hang or sanitizer report; the reader
// never holds more than the head limit plus one piece plus the body limit;
// a refusal has a 4xx/5xx status and a message; a finished request's body
// respects the limit, and its framing is one of the two it may be; a body
// announced as longer than the limit is refused before any of it is kept;
// the bytes of the requests read plus what is left over never exceed what
// was fed (nothing is invented or read twice).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/http_reader.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using encore::server::HttpLimits;
  using encore::server::RequestReader;
  if (size < 1) return 0;
  const size_t piece = 1 + (data[0] & 0x3F);                 // 1..64 bytes per read
  const size_t body_limit = (data[0] & 0x40) ? 64 : 100000;  // lowered after the head, or not
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  HttpLimits limits;
  limits.max_header_bytes = 1024;
  limits.max_header_fields = 16;
  limits.max_body_bytes = 4096;

  std::string leftover;
  size_t fed = 0;
  for (int request = 0; request < 8; ++request) {  // pipelined requests
    RequestReader r(limits, std::move(leftover));
    leftover.clear();
    RequestReader::State s = r.feed({});
    size_t limit = limits.max_body_bytes;
    while (s == RequestReader::State::NeedMore || s == RequestReader::State::HeadReady) {
      if (s == RequestReader::State::HeadReady) {
        const auto& h = r.head();
        check(h.version == 10 || h.version == 11);
        check(!(h.chunked && h.content_length));
        check(h.fields.size() <= limits.max_header_fields);
        check(!h.path.empty() || h.target.empty() || h.target[0] == '?');
        if (body_limit < limit) {
          r.limit_body(body_limit);
          limit = body_limit;
          if (h.content_length && *h.content_length > body_limit) {
            check(r.state() == RequestReader::State::Failed);
            check(r.failure().status == 413);
          }
        }
        s = r.feed({});
        continue;
      }
      if (fed >= in.size()) break;
      const size_t n = std::min(piece, in.size() - fed);
      s = r.feed(in.substr(fed, n));
      fed += n;
      check(r.held_bytes() <= 4 * (limits.max_header_bytes + piece) + 2 * limit + 64);
    }
    if (s == RequestReader::State::Failed) {
      check(r.failure().status >= 400 && r.failure().status < 600);
      check(!r.failure().message.empty());
      return 0;  // the connection is closed: nothing after it is read
    }
    if (s != RequestReader::State::Done) return 0;  // the client stopped mid-request
    const std::string body = r.take_body();
    check(body.size() <= limit);
    if (r.head().content_length) check(body.size() == *r.head().content_length);
    leftover = r.take_leftover();
    check(leftover.size() <= fed);
  }
  return 0;
}
