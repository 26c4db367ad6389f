// `encore serve` against hostile clients, through the real binary on
// loopback (issue "encore serve holds against hostile clients"): bodies
// capped whatever the framing and refused from the headers before any body
// byte when the key is wrong, bounded headers, no request smuggling, slow
// clients that cannot starve the others, a shutdown grace that is a bound,
// JSON bodies whatever their Content-Type, and the small protocol points
// (listen backlog, HTTP/1.0 streams, the status a cut answer is counted
// under, /v1/models/{id}). Under each attack /health answers within a second
// and the server's memory stays within 64 MB of its idle size plus its KV
// budget.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hostile_client.h"
#include "serve_fixture.h"
#include "shared_data.h"

namespace encore::test {
namespace {

using Json = nlohmann::json;

constexpr int64_t kKvMib = 64;  // --kv-mem of every server here
constexpr int64_t kSlackKib = 64 * 1024;

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = ENCORE_SHARED_DIR "/models/stories260K.gguf";
    if (!std::ifstream(model_)) GTEST_SKIP() << "no " << model_;
  }
  // A server with the KV budget of these tests, warmed up by one request
  // (so that its idle size includes what any request loads).
  std::unique_ptr<ServeProcess> serve(std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--kv-mem", std::to_string(kKvMib)});
    auto s = std::make_unique<ServeProcess>(model_, extra);
    if (!s->ready()) return s;
    httplib::Client c = s->client();
    c.Post("/v1/completions", R"({"prompt":"Tom","max_tokens":2})", "application/json");
    return s;
  }
  // The server's peak resident memory stayed within the bound of the issue.
  void expect_memory_bounded(const ServeProcess& s, int64_t idle_kib, const char* attack) {
    const int64_t peak = proc_kib(s.pid(), "VmHWM");
    EXPECT_LT(peak - idle_kib, kSlackKib + kKvMib * 1024)
        << attack << ": peak " << peak << " KiB, idle " << idle_kib << " KiB";
  }
  std::string model_;
};

std::string chunk(const std::string& data) {
  char size[32];
  snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

// Sends `head`, then chunks of 64 KiB up to `total` bytes on another
// thread, while this one reads the answer: what came back.
std::string upload_chunked(RawConn& c, const std::string& head, size_t total) {
  if (!c.send_all(head)) return {};
  std::thread sender([&c, total] {
    const std::string piece = chunk(std::string(65536, 'a'));
    for (size_t sent = 0; sent < total; sent += 65536) {
      if (!c.send_all(piece)) return;
    }
    c.send_all("0\r\n\r\n");
  });
  std::string got = c.read_until_close(std::chrono::seconds(20));
  shutdown(c.fd(), SHUT_RDWR);  // stops the sender if it is still at it
  sender.join();
  return got;
}

const char* const kChunkedPost =
    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    "Transfer-Encoding: chunked\r\n\r\n";

// Finding 1: a chunked body is capped like any other, and without a valid
// key not one body byte is kept.
TEST_F(Hostile, ChunkedBodiesAreCappedAndKeysCheckedFirst) {
  auto s = serve({"--max-body", "65536"});
  ASSERT_TRUE(s->ready()) << s->stderr_text();
  const int64_t idle = proc_kib(s->pid(), "VmRSS");
  HealthWatch health(s->port());
  {  // 12 MiB chunked against a 64 KiB limit: 413, not a 200 or a JSON error.
    RawConn c(s->port());
    ASSERT_TRUE(c.ok());
    const std::string got = upload_chunked(c, kChunkedPost, 12u << 20);
    EXPECT_EQ(statuses(got), std::vector<int>{413}) << got.substr(0, 300);
  }
  {  // A declared length over the limit: 413 before the body is sent.
    RawConn c(s->port());
    ASSERT_TRUE(
        c.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                   "100000\r\n\r\n"));
    EXPECT_EQ(statuses(c.read_until_close(std::chrono::seconds(5))), std::vector<int>{413});
    EXPECT_FALSE(c.timed_out());
  }
  {  // A chunked request within the limit is served.
    RawConn c(s->port());
    const std::string body = R"({"prompt":"Tom","max_tokens":3,"seed":1})";
    ASSERT_TRUE(c.send_all(std::string(kChunkedPost) + chunk(body.substr(0, 10)) +
                           chunk(body.substr(10)) + "0\r\n\r\n"));
    const std::string got = c.read_until_close(std::chrono::seconds(10));
    EXPECT_EQ(statuses(got).at(0), 200) << got;
  }
  health.stop();
  EXPECT_LT(health.slowest(), 1.0);
  EXPECT_EQ(health.failed(), 0);
  expect_memory_bounded(*s, idle, "12 MiB chunked");

  TempDir d;
  std::ofstream(d.file("keys")) << "alice-key-1234 alice\n";
  auto a = serve({"--api-keys", d.file("keys")});
  ASSERT_TRUE(a->ready()) << a->stderr_text();
  const int64_t idle_a = proc_kib(a->pid(), "VmRSS");
  HealthWatch health_a(a->port());
  // Three keyless uploads of 256 MiB at once: 401 each, from the headers.
  std::vector<std::thread> uploads;
  std::vector<std::string> answers(3);
  for (size_t i = 0; i < answers.size(); ++i) {
    uploads.emplace_back([&, i] {
      RawConn c(a->port());
      answers[i] = upload_chunked(c, kChunkedPost, 256u << 20);
    });
  }
  for (std::thread& t : uploads) t.join();
  health_a.stop();
  for (const std::string& got : answers) {
    EXPECT_EQ(statuses(got), std::vector<int>{401}) << got.substr(0, 300);
  }
  EXPECT_LT(health_a.slowest(), 1.0);
  EXPECT_EQ(health_a.failed(), 0);
  expect_memory_bounded(*a, idle_a, "keyless chunked uploads");
}

// Finding 2: header bytes and fields are bounded (431), memory too.
TEST_F(Hostile, HeadersAreBounded) {
  auto s = serve({});
  ASSERT_TRUE(s->ready()) << s->stderr_text();
  const int64_t idle = proc_kib(s->pid(), "VmRSS");
  HealthWatch health(s->port());
  {  // 20,000 lines of 8 KB (160 MB): 431 within the first 32 KiB.
    RawConn c(s->port());
    ASSERT_TRUE(c.send_all("GET /health HTTP/1.1\r\nHost: x\r\n"));
    std::thread sender([&c] {
      const std::string pad(8000, 'v');
      for (int i = 0; i < 20000; ++i) {
        if (!c.send_all("X-Pad-" + std::to_string(i) + ": " + pad + "\r\n")) return;
      }
      c.send_all("\r\n");
    });
    const std::string got = c.read_until_close(std::chrono::seconds(20));
    shutdown(c.fd(), SHUT_RDWR);
    sender.join();
    EXPECT_EQ(statuses(got), std::vector<int>{431}) << got.substr(0, 300);
  }
  auto with_fields = [&](int n) {
    std::string req = "GET /health HTTP/1.1\r\nHost: x\r\n";
    for (int i = 1; i < n; ++i) req += "X-F" + std::to_string(i) + ": 1\r\n";
    RawConn c(s->port());
    c.send_all(req + "Connection: close\r\n\r\n");
    return statuses(c.read_until_close(std::chrono::seconds(5)));
  };
  EXPECT_EQ(with_fields(99), std::vector<int>{200});  // 100 fields with Connection
  EXPECT_EQ(with_fields(101), std::vector<int>{431});
  // 240 heads of 32,000 bytes of empty fields ("a:" lines) at once, from four
  // addresses: the field count stops each parse early, so they cost their
  // bytes, not a table of 8,000 fields each (~680 KiB).
  std::vector<std::unique_ptr<RawConn>> tiny;
  std::string head = "GET /health HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 8000; ++i) head += "a:\r\n";
  head += "\r\n";
  for (const char* from : {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}) {
    for (int i = 0; i < 60; ++i) {
      tiny.push_back(std::make_unique<RawConn>(s->port(), from));
      tiny.back()->send_all(head);
    }
  }
  for (auto& c : tiny) {
    EXPECT_EQ(statuses(c->read_until_close(std::chrono::seconds(10))), std::vector<int>{431});
  }
  health.stop();
  EXPECT_LT(health.slowest(), 1.0);
  EXPECT_EQ(health.failed(), 0);
  expect_memory_bounded(*s, idle, "160 MB of headers, 240 heads of tiny fields");
}

// Finding 3: after a request the server cannot frame for sure, nothing more
// is read from its connection: the request hidden behind it never runs.
TEST_F(Hostile, NoRequestIsSmuggledBehindABadOne) {
  auto s = serve({"--max-header-bytes", "8192"});
  ASSERT_TRUE(s->ready()) << s->stderr_text();
  const std::string hidden = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  struct Case {
    const char* what;
    std::string bad;
    int status;
  };
  const std::vector<Case> cases = {
      {"over-long header line",
       "GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + std::string(9000, 'a') + "\r\n\r\n", 431},
      {"duplicate Content-Length",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: "
       "2\r\n\r\n{}",
       400},
      {"Content-Length list",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\n{}", 400},
      {"Content-Length with chunked",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: "
       "chunked\r\n\r\n0\r\n\r\n",
       400},
      {"Transfer-Encoding other than chunked",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"chunked not last",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 501},
      {"bad request line", "GARBAGE\r\n\r\n", 400},
      {"no Host", "GET /health HTTP/1.1\r\n\r\n", 400},
      {"two Hosts", "GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"bad chunk size", std::string(kChunkedPost) + "zz\r\n{}\r\n0\r\n\r\n", 400},
  };
  for (const Case& k : cases) {
    RawConn c(s->port());
    ASSERT_TRUE(c.send_all(k.bad + hidden)) << k.what;
    const std::string got = c.read_until_close(std::chrono::seconds(5));
    EXPECT_FALSE(c.timed_out()) << k.what << ": the connection was left open";
    EXPECT_EQ(statuses(got), std::vector<int>{k.status}) << k.what << "\n" << got;
    EXPECT_EQ(got.find("\"object\":\"list\""), std::string::npos) << k.what << ": smuggled";
  }
  // Well-formed requests in one write are all served (pipelining).
  RawConn c(s->port());
  ASSERT_TRUE(
      c.send_all(hidden + hidden + "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  EXPECT_EQ(statuses(c.read_until_close(std::chrono::seconds(5))),
            (std::vector<int>{200, 200, 200}));
}

// Finding 4: slow clients hold sockets, never the threads that answer the
// others; connections per address and in all are capped at accept.
TEST_F(Hostile, TricklingClientsDoNotStarveTheOthers) {
  auto s = serve({"--read-timeout", "2", "--read-deadline", "3"});
  ASSERT_TRUE(s->ready()) << s->stderr_text();
  const int64_t idle = proc_kib(s->pid(), "VmRSS");
  HealthWatch health(s->port());
  // 150 connections from another address, each trickling a byte every 0.5 s
  // (each read progresses in time; only the deadline ends them), for two
  // read deadlines.
  std::vector<std::unique_ptr<RawConn>> slow;
  for (int i = 0; i < 150; ++i) slow.push_back(std::make_unique<RawConn>(s->port(), "127.0.0.2"));
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  for (size_t at = 0; at < 14; ++at) {
    for (auto& c : slow) c->send_all(std::string(1, at < req.size() ? req[at] : 'a'));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  health.stop();
  EXPECT_GT(health.asked(), 20);
  EXPECT_LT(health.slowest(), 1.0) << "slow clients stalled /health or /metrics";
  EXPECT_EQ(health.failed(), 0);
  httplib::Client c = s->client();
  const std::string m = c.Get("/metrics")->body;
  // 64 per address (the default) were admitted; the other 86 were shed.
  EXPECT_NE(m.find("encore_requests_rejected_total{reason=\"too_many_connections\"} 86"),
            std::string::npos)
      << m.substr(0, 2000);
  EXPECT_NE(m.find("encore_requests_rejected_total{reason=\"slow_client\"} 64"), std::string::npos);
  slow.clear();
  expect_memory_bounded(*s, idle, "150 trickling connections");

  // A stalled request gets its 408 before the close.
  RawConn stalled(s->port());
  ASSERT_TRUE(stalled.send_all("GET /health HTTP/1.1\r\n"));
  EXPECT_EQ(statuses(stalled.read_until_close(std::chrono::seconds(10))), std::vector<int>{408});

  // The total: with room for 4 connections, the fifth is shed at once with
  // a 503, whatever its address; a closed one makes room again.
  auto t = serve({"--max-connections", "4"});
  ASSERT_TRUE(t->ready()) << t->stderr_text();
  std::vector<std::unique_ptr<RawConn>> held;
  // Four connections held open (one shed while an earlier connection was
  // still being closed is made again).
  for (const char* from : {"127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"}) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      auto c = std::make_unique<RawConn>(t->port(), from);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (c->closed_by_server()) continue;
      held.push_back(std::move(c));
      break;
    }
  }
  ASSERT_EQ(held.size(), 4u);
  RawConn fifth(t->port(), "127.0.0.7");
  fifth.send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(statuses(fifth.read_until_close(std::chrono::seconds(5))), std::vector<int>{503});
  held.clear();
  bool served = false;
  for (int i = 0; i < 50 && !served; ++i) {  // the closes are noticed within a moment
    httplib::Client h("127.0.0.1", t->port());
    auto r = h.Get("/health");
    served = r && r->status == 200;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(served);
}

// Bodies that trickle hold their place in flight only a quarter of the
// places per address: the others stay for everyone else.
TEST_F(Hostile, TricklingBodiesCannotHoldEveryPlace) {
  auto s = serve({"--max-queue", "8"});
  ASSERT_TRUE(s->ready()) << s->stderr_text();
  std::vector<std::unique_ptr<RawConn>> uploads;
  std::vector<int> got;
  for (int i = 0; i < 6; ++i) {
    uploads.push_back(std::make_unique<RawConn>(s->port(), "127.0.0.2"));
    uploads.back()->send_all(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{");
  }
  for (size_t i = 2; i < uploads.size(); ++i) {  // 8 / 4 = 2 may wait for their body
    // 15 s: a bound, not a timing (the 503 comes at once); under a loaded
    // ctest -j 2 one answer once took longer than 5 s.
    const std::vector<int> st = statuses(uploads[i]->read_until_close(std::chrono::seconds(15)));
    EXPECT_EQ(st, std::vector<int>{503}) << i;
  }
  httplib::Client c = s->client();
  auto r = c.Post("/v1/completions", R"({"prompt":"Tom","max_tokens":2})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const std::string m = c.Get("/metrics")->body;
  EXPECT_NE(m.find("encore_requests_rejected_total{reason=\"uploads_per_address\"} 4"),
            std::string::npos);
}

// Finding 7: a JSON body is read as JSON whatever the Content-Type says, up
// to --max-body (curl -d and Python's urllib send form-urlencoded).
TEST_F(Hostile, JsonBodiesAreReadWhateverTheirContentType) {
  auto s = serve({});
  ASSERT_TRUE(s->ready()) << s->stderr_text();
  const Json req = {
      {"prompt", "Tom"}, {"max_tokens", 3}, {"seed", 5}, {"user", std::string(20000, 'u')}};
  httplib::Client c = s->client();
  std::string hash;
  for (const char* type : {"application/x-www-form-urlencoded", "text/plain", "application/json"}) {
    auto r = c.Post("/v1/completions", req.dump(), type);
    ASSERT_TRUE(r) << type;
    ASSERT_EQ(r->status, 200) << type << ": " << r->body;
    const std::string h = Json::parse(r->body)["choices"][0]["output_hash"];
    if (hash.empty()) hash = h;
    EXPECT_EQ(h, hash) << type;
  }
}

// Finding 5: at the end of --shutdown-grace what still runs is cancelled,
// its stream ends saying so, and the process exits.
TEST_F(Hostile, ShutdownGraceIsABound) {
  auto s = serve({"--shutdown-grace", "2", "-t", "1"});
  ASSERT_TRUE(s->ready()) << s->stderr_text();
  // Four streams that would each run far longer than the grace.
  const Json req = {{"prompt", "Once"},  {"max_tokens", 500},  {"n", 64},
                    {"stream", true},    {"ignore_eos", true}, {"seed", 1},
                    {"temperature", 1.0}};
  std::vector<std::unique_ptr<RawConn>> streams;
  for (int i = 0; i < 4; ++i) {
    auto c = std::make_unique<RawConn>(s->port());
    const std::string body = req.dump();
    ASSERT_TRUE(c->send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body));
    streams.push_back(std::move(c));
  }
  std::vector<std::string> got(streams.size());
  std::vector<std::thread> readers;
  for (size_t i = 0; i < streams.size(); ++i) {
    readers.emplace_back(
        [&, i] { got[i] = streams[i]->read_until_close(std::chrono::seconds(60)); });
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto start = Clock::now();
  kill(s->pid(), SIGTERM);
  EXPECT_EQ(s->wait_exit(), 0) << s->stderr_text();
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  for (std::thread& t : readers) t.join();
  EXPECT_GE(took, 1.5) << "the requests were not given their grace";
  EXPECT_LT(took, 8.0) << "the shutdown took longer than grace + a few seconds";
  for (const std::string& g : got) {
    EXPECT_NE(g.find("\"finish_reason\":\"cancelled\""), std::string::npos) << g.substr(0, 500);
    EXPECT_NE(g.find("\"code\":\"shutting_down\""), std::string::npos);
    EXPECT_EQ(g.find("[DONE]"), std::string::npos) << "a cancelled stream claimed to be complete";
  }
}

// Finding 9: the listen backlog, HTTP/1.0 streams, the status a timed-out
// answer is counted under, GET /v1/models/{id}, 405.
TEST_F(Hostile, ProtocolDetails) {
  auto s = serve({"--request-timeout", "2", "-t", "1"});
  ASSERT_TRUE(s->ready()) << s->stderr_text();
  // The backlog of the listening socket (ss's Send-Q for a listener).
  TempDir d;
  const std::string ss_out = d.file("ss");
  ASSERT_EQ(
      std::system(("ss -Hltn 'sport = :" + std::to_string(s->port()) + "' > " + ss_out).c_str()),
      0);
  std::istringstream line(read_file(ss_out));
  std::string state;
  int64_t recv_q = -1, backlog = -1;
  line >> state >> recv_q >> backlog;
  EXPECT_GE(backlog, 511) << read_file(ss_out);

  // HTTP/1.0 asks for a stream: no chunks, the body ends with the connection.
  const std::string body = R"({"prompt":"Tom","max_tokens":5,"seed":2,"stream":true})";
  RawConn old(s->port());
  ASSERT_TRUE(old.send_all("POST /v1/completions HTTP/1.0\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body));
  const std::string got = old.read_until_close(std::chrono::seconds(10));
  EXPECT_FALSE(old.timed_out());
  const size_t head_end = got.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << got;
  EXPECT_EQ(got.substr(0, head_end).find("chunked"), std::string::npos) << got;
  EXPECT_EQ(got.compare(head_end + 4, 6, "data: "), 0) << "a chunk size before the data";
  EXPECT_NE(got.find("data: [DONE]\n\n"), std::string::npos);

  // A whole answer that times out after its status line: counted as 504.
  httplib::Client c = s->client();
  const Json slow = {
      {"prompt", "Once"}, {"max_tokens", 500}, {"n", 64}, {"ignore_eos", true}, {"seed", 1}};
  auto r = c.Post("/v1/completions", slow.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);  // committed after 1.5 s
  EXPECT_NE(r->body.find("\"code\":\"timeout\""), std::string::npos) << r->body;
  const std::string m = c.Get("/metrics")->body;
  EXPECT_NE(m.find("encore_requests_total{endpoint=\"/v1/completions\",status=\"504\"} 1"),
            std::string::npos);
  // Two answers in full (the warm-up and the HTTP/1.0 stream), not three.
  EXPECT_NE(m.find("encore_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n"),
            std::string::npos)
      << "the timed-out answer was counted as a 200";

  // GET /v1/models/{id} (the OpenAI client's models.retrieve); 405.
  auto model = c.Get("/v1/models/encore");
  ASSERT_TRUE(model);
  EXPECT_EQ(model->status, 200);
  EXPECT_EQ(Json::parse(model->body)["id"], "encore");
  auto other = c.Get("/v1/models/gpt-4");
  EXPECT_EQ(other->status, 404);
  EXPECT_EQ(Json::parse(other->body)["error"]["code"], "model_not_found");
  auto wrong = c.Get("/v1/completions");
  EXPECT_EQ(wrong->status, 405);
  EXPECT_EQ(wrong->get_header_value("Allow"), "POST");
}

}  // namespace
}  // namespace encore::test
