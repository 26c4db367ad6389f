// The HTTP request reader of `encore serve` (src/server/http_reader.h) on
// bytes from memory, fed one at a time or all at once: limits whatever the
// framing, the framing rules that stop request smuggling, pipelining, and
// the stop after the head. Runs under ASan+UBSan (label unit); the same
// attacks through the real server are in cli_serve_hostile_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "server/http_reader.h"

namespace encore::server {
namespace {

using State = RequestReader::State;

struct Read {
  State state = State::NeedMore;
  RequestHead head;
  std::string body, leftover;
  HttpFailure failure;
};

// Feeds `bytes` in pieces of `piece` bytes (0: all at once), going on after
// the head with `body_limit` (0: the reader's own).
Read read(const std::string& bytes, const HttpLimits& limits, size_t piece = 0,
          size_t body_limit = 0) {
  RequestReader r(limits);
  Read out;
  size_t at = 0;
  State s = State::NeedMore;
  while (true) {
    if (s == State::HeadReady) {
      out.head = r.head();
      if (body_limit) r.limit_body(body_limit);
      s = r.feed({});
      continue;
    }
    if (s != State::NeedMore || at == bytes.size()) break;
    const size_t n = piece ? std::min(piece, bytes.size() - at) : bytes.size() - at;
    s = r.feed(std::string_view(bytes).substr(at, n));
    at += n;
  }
  out.state = s;
  if (s == State::Done) {
    out.body = r.take_body();
    out.leftover = r.take_leftover() + bytes.substr(at);
  }
  if (s == State::Failed) out.failure = r.failure();
  return out;
}

const HttpLimits kLimits{1024, 16, 100};

std::string chunked(const std::string& body_chunks) {
  return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
         body_chunks;
}

TEST(HttpReader, ReadsLengthAndChunkedBodiesAndKeepsWhatFollows) {
  for (size_t piece : {size_t{0}, size_t{1}, size_t{7}}) {
    const Read a =
        read("POST /v1/completions?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET",
             kLimits, piece);
    ASSERT_EQ(a.state, State::Done) << piece;
    EXPECT_EQ(a.head.method, "POST");
    EXPECT_EQ(a.head.path, "/v1/completions");
    EXPECT_EQ(a.head.target, "/v1/completions?x=1");
    EXPECT_EQ(a.head.header("host"), "h");
    EXPECT_EQ(a.body, "hello");
    EXPECT_EQ(a.leftover, "GET") << piece;
    const Read b =
        read(chunked("3\r\nhel\r\n2;ext=1\r\nlo\r\n0\r\nTrailer: t\r\n\r\nX"), kLimits, piece);
    ASSERT_EQ(b.state, State::Done) << piece;
    EXPECT_TRUE(b.head.chunked);
    EXPECT_EQ(b.body, "hello");
    EXPECT_EQ(b.leftover, "X");
  }
  const Read old = read("GET /health HTTP/1.0\r\n\r\n", kLimits);
  ASSERT_EQ(old.state, State::Done);
  EXPECT_EQ(old.head.version, 10);
  EXPECT_FALSE(old.head.keep_alive);
}

TEST(HttpReader, BodiesAreCappedWhateverTheFraming) {
  // Declared over the limit: refused at the head, before any body byte.
  Read r = read("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n", kLimits);
  EXPECT_EQ(r.state, State::Failed);
  EXPECT_EQ(r.failure.status, 413);
  // Chunked: refused as soon as the chunk sizes pass the limit.
  for (size_t piece : {size_t{0}, size_t{1}}) {
    r = read(chunked("40\r\n" + std::string(64, 'a') + "\r\n40\r\n" + std::string(64, 'a') +
                     "\r\n0\r\n\r\n"),
             kLimits, piece);
    EXPECT_EQ(r.state, State::Failed) << piece;
    EXPECT_EQ(r.failure.status, 413);
  }
  // A lower limit set after the head applies to both framings.
  r = read("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n" + std::string(20, 'a'),
           kLimits, 0, 10);
  EXPECT_EQ(r.failure.status, 413);
  r = read(chunked("14\r\n" + std::string(20, 'a') + "\r\n0\r\n\r\n"), kLimits, 0, 10);
  EXPECT_EQ(r.failure.status, 413);
  r = read(chunked("a\r\n" + std::string(10, 'a') + "\r\n0\r\n\r\n"), kLimits, 0, 10);
  EXPECT_EQ(r.state, State::Done);
}

TEST(HttpReader, HeadersAreCapped) {
  std::string many = "GET / HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 16; ++i) many.append("A").append(std::to_string(i)).append(": v\r\n");
  Read r = read(many + "\r\n", kLimits);
  EXPECT_EQ(r.failure.status, 431) << "17 fields";
  r = read("GET / HTTP/1.1\r\nHost: x\r\nX: " + std::string(2000, 'v') + "\r\n\r\n", kLimits, 1);
  EXPECT_EQ(r.failure.status, 431) << "2 KB of headers";
  // Without an end: refused once the limit is reached, not buffered on.
  RequestReader endless(kLimits);
  State s = endless.feed("GET / HTTP/1.1\r\nHost: x\r\n");
  for (int i = 0; i < 1000 && s == State::NeedMore; ++i) s = endless.feed("X-Pad: yyyyyyyy\r\n");
  EXPECT_EQ(s, State::Failed);
  EXPECT_LE(endless.held_bytes(), 4096u);
}

TEST(HttpReader, FramingThatCouldHideARequestIsRefused) {
  const struct {
    const char* what;
    std::string bytes;
    int status;
  } cases[] = {
      {"two lengths",
       "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", 400},
      {"a length list", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 1\r\n\r\n", 400},
      {"length and chunked",
       "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
       400},
      {"chunked and length",
       "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
       400},
      {"gzip", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"chunked, gzip", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
       501},
      {"two encodings",
       "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
       "chunked\r\n\r\n",
       400},
      {"chunked on 1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"no host", "GET / HTTP/1.1\r\n\r\n", 400},
      {"two hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"space before colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400},
      {"HTTP/2.0", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505},
      {"garbage", "GARBAGE\r\n\r\n", 400},
      {"bad chunk size", chunked("zz\r\n"), 400},
      {"Expect other than 100-continue", "GET / HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n\r\n",
       417},
  };
  for (const auto& k : cases) {
    const Read r = read(k.bytes, kLimits);
    EXPECT_EQ(r.state, State::Failed) << k.what;
    EXPECT_EQ(r.failure.status, k.status) << k.what << ": " << r.failure.message;
    EXPECT_FALSE(r.failure.message.empty());
  }
}

TEST(HttpReader, StopsAfterTheHeadBeforeTheBody) {
  RequestReader r(kLimits);
  const std::string all =
      "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\nbody";
  ASSERT_EQ(r.feed(all), State::HeadReady);
  EXPECT_TRUE(r.head().expect_continue);
  EXPECT_EQ(r.head().content_length, 4u);
  EXPECT_TRUE(r.head().has_body());
  ASSERT_EQ(r.feed({}), State::Done);
  EXPECT_EQ(r.take_body(), "body");
}

}  // namespace
}  // namespace encore::server
