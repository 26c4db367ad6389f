// `encore serve` through real HTTP on loopback (the binary, cpp-httplib's
// client): OpenAI's shapes, the same output as `encore run` for the same
// request and seed, streaming equal to the whole answer, field errors,
// limits, tenants, disconnects, metrics (checked by promtool), SIGTERM, and
// the official `openai` npm client (tests/node/openai_client.mjs).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "serve_fixture.h"
#include "shared_data.h"

namespace encore::test {
namespace {

using Json = nlohmann::json;

const char* const kJson = "application/json";

// The data lines of an SSE body, in order ("[DONE]" included).
std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

// POST with the body read as it arrives; on_data returning false closes
// the connection (a client that goes away).
void post_streaming(httplib::Client& c, const std::string& path, const httplib::Headers& headers,
                    const std::string& body, std::function<bool(const char*, size_t)> on_data) {
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.body = body;
  req.set_header("Content-Type", kJson);
  req.content_receiver = [on_data](const char* p, size_t n, uint64_t, uint64_t) {
    return on_data(p, n);
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  c.send(req, res, err);
}

class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new std::string(ENCORE_SHARED_DIR "/models/stories260K.gguf");
  }
  static void TearDownTestSuite() { delete model_; }
  void SetUp() override {
    if (!std::ifstream(*model_)) GTEST_SKIP() << "no " << *model_;
  }
  Json post(ServeProcess& s, const std::string& path, const Json& body, int* status = nullptr,
            const httplib::Headers& headers = {}) {
    httplib::Client c = s.client();
    auto r = c.Post(path, headers, body.dump(), kJson);
    EXPECT_TRUE(r) << "no answer from " << path;
    if (!r) return Json();
    if (status) *status = r->status;
    return Json::parse(r->body, nullptr, false);
  }
  static std::string* model_;
};
std::string* Serve::model_ = nullptr;

const Json kPure = {{"temperature", 1.0}, {"top_k", 0}, {"top_p", 1.0}, {"min_p", 0.0}};

TEST_F(Serve, CompletionsMatchRunAndCarryFingerprintSeedAndHash) {
  ServeProcess s(*model_, {});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  Json req = kPure;
  req["prompt"] = "Once upon a time";
  req["max_tokens"] = 24;
  req["seed"] = 4242;
  req["logprobs"] = 2;
  int status = 0;
  const Json j = post(s, "/v1/completions", req, &status);
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["seed"], 4242);
  EXPECT_EQ(j["system_fingerprint"].get<std::string>().rfind("fp_", 0), 0u);
  const Json& c0 = j["choices"][0];
  EXPECT_EQ(c0["logprobs"]["tokens"].size(), 24u);
  EXPECT_EQ(c0["logprobs"]["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  // The listed tokens spell the text (but for a leading space the decoder
  // strips), and their offsets follow their lengths.
  std::string spelled;
  for (size_t k = 0; k < 24; ++k) {
    EXPECT_EQ(c0["logprobs"]["text_offset"][k], spelled.size());
    spelled += c0["logprobs"]["tokens"][k].get<std::string>();
    for (const auto& [tok, lp] : c0["logprobs"]["top_logprobs"][k].items())
      EXPECT_FALSE(tok.empty());
  }
  ASSERT_FALSE(c0["text"].get<std::string>().empty());
  EXPECT_NE(spelled.find(c0["text"].get<std::string>()), std::string::npos) << spelled;
  // The same request through `encore run`: the same ids (hash), text and fingerprint.
  const CliResult run =
      run_encore({"run", "-m", *model_, "--json", "-p", "Once upon a time", "-n", "24", "--seed",
                  "4242", "--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const Json rj = Json::parse(run.out);
  EXPECT_EQ(c0["output_hash"], rj["output_hash"]);
  EXPECT_EQ(c0["text"], rj["text"]);
  EXPECT_EQ(j["system_fingerprint"], rj["system_fingerprint"]);
  // Another seed: another output; no seed: one is drawn and reported.
  req["seed"] = 4243;
  EXPECT_NE(post(s, "/v1/completions", req)["choices"][0]["output_hash"], c0["output_hash"]);
  req.erase("seed");
  const Json a = post(s, "/v1/completions", req), b = post(s, "/v1/completions", req);
  EXPECT_NE(a["seed"], b["seed"]);
  req["seed"] = a["seed"];
  EXPECT_EQ(post(s, "/v1/completions", req)["choices"][0]["output_hash"],
            a["choices"][0]["output_hash"]);
  // n = 3: three choices, the first equal to n = 1's.
  req["n"] = 3;
  const Json three = post(s, "/v1/completions", req);
  ASSERT_EQ(three["choices"].size(), 3u);
  EXPECT_EQ(three["choices"][0]["output_hash"], a["choices"][0]["output_hash"]);
  EXPECT_NE(three["choices"][1]["output_hash"], three["choices"][0]["output_hash"]);
}

TEST_F(Serve, StreamingEqualsTheWholeAnswer) {
  ServeProcess s(*model_, {"--chat-template", "chatml"});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    Json req = kPure;
    if (path == "/v1/completions") {
      req["prompt"] = "The little dog";
    } else {
      req["messages"] = Json::array({{{"role", "user"}, {"content", "Tell me about the dog"}}});
    }
    req["max_tokens"] = 40;
    req["seed"] = 11;
    req["n"] = 2;
    req["stop"] = Json::array({"\n\n"});
    if (path == "/v1/completions") {
      req["logprobs"] = 1;
    } else {
      req["logprobs"] = true;
      req["top_logprobs"] = 1;
    }
    const Json whole = post(s, path, req);
    req["stream"] = true;
    req["stream_options"] = {{"include_usage", true}};
    httplib::Client c = s.client();
    auto r = c.Post(path, req.dump(), kJson);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    const std::vector<std::string> events = sse_data(r->body);
    ASSERT_GE(events.size(), 3u);
    EXPECT_EQ(events.back(), "[DONE]");
    std::vector<std::string> text(2);
    std::vector<std::string> hashes(2);
    std::vector<Json> lps(2, Json::array());  // per choice, each token's logprobs
    bool usage = false;
    for (size_t e = 0; e + 1 < events.size(); ++e) {
      const Json chunk = Json::parse(events[e]);
      EXPECT_EQ(chunk["seed"], 11) << path;
      if (chunk.contains("usage")) {
        usage = true;
        // The same counts (the prompt is cached by now: cached_tokens may differ).
        EXPECT_EQ(chunk["usage"]["prompt_tokens"], whole["usage"]["prompt_tokens"]) << path;
        EXPECT_EQ(chunk["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
        continue;
      }
      const Json& ch = chunk["choices"][0];
      const size_t i = ch["index"];
      text[i] += path == "/v1/completions" ? ch["text"].get<std::string>()
                                           : ch["delta"].value("content", "");
      if (!ch["finish_reason"].is_null()) hashes[i] = ch["output_hash"];
      if (ch["logprobs"].is_null()) continue;
      if (path == "/v1/completions") {
        const Json& l = ch["logprobs"];
        for (size_t k = 0; k < l["tokens"].size(); ++k) {
          lps[i].push_back(Json::array(
              {l["tokens"][k], l["token_logprobs"][k], l["top_logprobs"][k], l["text_offset"][k]}));
        }
      } else {
        for (const Json& t : ch["logprobs"]["content"]) lps[i].push_back(t);
      }
    }
    EXPECT_TRUE(usage) << path;
    for (size_t i = 0; i < 2; ++i) {
      const Json& w = whole["choices"][i];
      EXPECT_EQ(text[i], path == "/v1/completions" ? w["text"] : w["message"]["content"]) << path;
      EXPECT_EQ(hashes[i], w["output_hash"]) << path;
      // Each token's logprobs (and completions' text offsets) as in the whole answer.
      Json want = Json::array();
      if (path == "/v1/completions") {
        const Json& l = w["logprobs"];
        for (size_t k = 0; k < l["tokens"].size(); ++k) {
          want.push_back(Json::array(
              {l["tokens"][k], l["token_logprobs"][k], l["top_logprobs"][k], l["text_offset"][k]}));
        }
      } else {
        want = w["logprobs"]["content"];
      }
      EXPECT_GT(want.size(), 1u) << path;
      EXPECT_EQ(lps[i], want) << path;
    }
  }
}

TEST_F(Serve, BadRequestsGetTheirFourHundredsNamingTheField) {
  ServeProcess s(*model_, {"--max-body", "65536"});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  httplib::Client c = s.client();
  struct Case {
    std::string body;
    int status;
    std::string param;
  };
  Json many_stops = {{"prompt", "x"}, {"stop", Json::array()}};
  for (int i = 0; i < 10000; ++i) many_stops["stop"].push_back("s" + std::to_string(i));
  const std::vector<Case> cases = {
      {"{not json", 400, ""},
      {R"({"prompt": "x", "temperature": "hot"})", 400, "temperature"},
      {R"({"prompt": "x", "n": 1000000})", 400, "n"},
      {R"({"prompt": "x", "max_tokens": -5})", 400, "max_tokens"},
      {"{\"prompt\": \"\xff\xfe bad utf-8\"}", 400, ""},
      {R"({"prompt": [1, 2, 999999]})", 400, "prompt[2]"},
      {R"({"prompt": "x", "logit_bias": {"99999": 5}})", 400, "logit_bias"},
      {many_stops.dump(), 413, ""},  // the body alone exceeds 64 KiB
      {R"({"prompt": ")" + std::string(100, 'a') + R"(", "stop": [""]})", 400, "stop[0]"},
      {R"({"prompt": ")" + std::string(3000, 'w') + R"(", "max_tokens": 1})", 400, "prompt"},
  };
  for (const Case& k : cases) {
    auto r = c.Post("/v1/completions", k.body, kJson);
    ASSERT_TRUE(r) << k.body.substr(0, 80);
    EXPECT_EQ(r->status, k.status) << k.body.substr(0, 80) << "\n" << r->body;
    const Json e = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.contains("error")) << r->body;
    if (!k.param.empty()) {
      EXPECT_EQ(e["error"]["param"], k.param) << r->body;
    }
  }
  // A smaller stop list still over the limit of 16 strings: a 400.
  Json stops = {{"prompt", "x"}, {"stop", Json::array()}};
  for (int i = 0; i < 100; ++i) stops["stop"].push_back("s" + std::to_string(i));
  EXPECT_EQ(c.Post("/v1/completions", stops.dump(), kJson)->status, 400);
  auto nf = c.Get("/v1/nothing");
  EXPECT_EQ(nf->status, 404);
  EXPECT_TRUE(Json::parse(nf->body).contains("error"));
  // The server still answers.
  EXPECT_EQ(c.Post("/v1/completions", R"({"prompt":"Tom","max_tokens":3})", kJson)->status, 200);
}

TEST_F(Serve, ApiKeysTenantsAndIsolation) {
  TempDir d;
  std::ofstream(d.file("keys")) << "# key tenant\n"
                                   "alice-key-1234 alice\n"
                                   "bob-key-123456 bob\n"
                                   "old-key-123456 alice revoked\n";
  ServeProcess s(*model_, {"--api-keys", d.file("keys")});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  Json req = {{"prompt", std::string(200, 'a')}, {"max_tokens", 2}, {"seed", 1}};
  int status = 0;
  post(s, "/v1/completions", req, &status);
  EXPECT_EQ(status, 401);
  post(s, "/v1/completions", req, &status, {{"Authorization", "Bearer nope-nope-nope"}});
  EXPECT_EQ(status, 401);
  post(s, "/v1/completions", req, &status, {{"Authorization", "Bearer old-key-123456"}});
  EXPECT_EQ(status, 403);
  const httplib::Headers alice = {{"Authorization", "Bearer alice-key-1234"}};
  const httplib::Headers bob = {{"Authorization", "Bearer bob-key-123456"}};
  const Json a1 = post(s, "/v1/completions", req, &status, alice);
  ASSERT_EQ(status, 200) << a1.dump();
  EXPECT_EQ(a1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const Json a2 = post(s, "/v1/completions", req, &status, alice);
  EXPECT_GT(a2["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << a2.dump();
  // Bob sends Alice's prompt: nothing of hers is served to him.
  const Json b1 = post(s, "/v1/completions", req, &status, bob);
  EXPECT_EQ(b1["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << b1.dump();
  EXPECT_EQ(b1["choices"][0]["output_hash"], a1["choices"][0]["output_hash"])
      << "the tenant changed the output";
}

// A request that runs for seconds even on stories260K with one thread: 64
// samples x 500 tokens.
Json long_request(bool stream) {
  return {{"prompt", "Once"},   {"max_tokens", 500}, {"n", 64},           {"stream", stream},
          {"ignore_eos", true}, {"seed", 1},         {"temperature", 1.0}};
}

// The value of one sample line of /metrics ("" when absent).
std::string metric(ServeProcess& s, const std::string& series) {
  auto m = s.client().Get("/metrics");
  if (!m) return {};
  const size_t at = m->body.find("\n" + series + " ");
  if (at == std::string::npos) return {};
  const size_t v = at + series.size() + 2;
  return m->body.substr(v, m->body.find('\n', v) - v);
}

// Waits (bounded: 30 s) until `series` reads `value`.
bool wait_metric(ServeProcess& s, const std::string& series, const std::string& value) {
  for (int i = 0; i < 1500; ++i) {
    if (metric(s, series) == value) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Starts a long stream on another thread; returns once its first bytes came.
struct BackgroundStream {
  std::thread t;
  std::mutex mu;
  std::string body;
  std::atomic<bool> hang_up{false};
  std::atomic<bool> started{false};
  BackgroundStream(ServeProcess& s, const httplib::Headers& headers, const Json& req) {
    t = std::thread([this, &s, headers, req] {
      httplib::Client c = s.client();
      post_streaming(c, "/v1/completions", headers, req.dump(), [&](const char* p, size_t n) {
        {
          std::lock_guard<std::mutex> lock(mu);
          body.append(p, n);
        }
        started = true;
        return !hang_up.load();
      });
      started = true;
    });
    for (int i = 0; i < 3000 && !started; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu);
    return body;
  }
  ~BackgroundStream() {
    hang_up = true;
    if (t.joinable()) t.join();
  }
};

TEST_F(Serve, TenantAndServerLimitsGiveRetryAfter) {
  TempDir d;
  std::ofstream(d.file("keys")) << "one-at-a-time tenant1 max_in_flight=1\n"
                                   "another-key-00 tenant2\n";
  ServeProcess s(*model_, {"--api-keys", d.file("keys"), "--max-queue", "2"});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  const httplib::Headers one = {{"Authorization", "Bearer one-at-a-time"}};
  const httplib::Headers two = {{"Authorization", "Bearer another-key-00"}};
  BackgroundStream a(s, one, long_request(true));
  httplib::Client c = s.client();
  auto busy = c.Post("/v1/completions", one, R"({"prompt":"x","max_tokens":1})", kJson);
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 429) << busy->body;
  EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
  BackgroundStream b(s, two, long_request(true));  // the second and last place
  auto full = c.Post("/v1/completions", two, R"({"prompt":"x","max_tokens":1})", kJson);
  ASSERT_TRUE(full);
  EXPECT_EQ(full->status, 503) << full->body;
  EXPECT_EQ(full->get_header_value("Retry-After"), "1");
  EXPECT_NE(metric(s, "encore_requests_rejected_total{reason=\"tenant_limit\"}"), "");
}

TEST_F(Serve, AClientThatGoesAwayCancelsItsRequest) {
  ServeProcess s(*model_, {"-t", "1"});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  {  // a stream, after its first chunks
    BackgroundStream a(s, {}, long_request(true));
  }
  EXPECT_TRUE(wait_metric(s, "encore_requests_finished_total{outcome=\"disconnected\"}", "1"));
  EXPECT_TRUE(wait_metric(s, "encore_running_requests", "0"));
  // A whole answer (asked with gzip, as the openai clients do): the client
  // gives up after half a second.
  httplib::Client c = s.client();
  c.set_read_timeout(std::chrono::milliseconds(500));
  auto r =
      c.Post("/v1/completions", {{"Accept-Encoding", "gzip"}}, long_request(false).dump(), kJson);
  EXPECT_FALSE(r);
  EXPECT_TRUE(wait_metric(s, "encore_requests_finished_total{outcome=\"disconnected\"}", "2"))
      << "a whole answer kept running after its client left";
  EXPECT_TRUE(wait_metric(s, "encore_running_requests", "0"));
}

// A loopback TCP connection to the server, for clients httplib would not be.
int raw_connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True once the server has closed `fd` (or answered and closed it).
bool closed_by_server(int fd) {
  char buf[256];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    if (n < 0) return false;  // nothing yet, still open
  }
}

TEST_F(Serve, TimeoutsAndSlowClients) {
  ServeProcess s(*model_,
                 {"--request-timeout", "1", "--read-timeout", "2", "--read-deadline", "3"});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  httplib::Client c = s.client();
  auto r = c.Post("/v1/completions", long_request(false).dump(), kJson);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504) << r->body;
  EXPECT_NE(r->body.find("timed out"), std::string::npos);
  // Slowloris: headers that stop coming are cut off; others are served meanwhile.
  const int fd = raw_connect(s.port());
  ASSERT_GE(fd, 0);
  ASSERT_GT(send(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n", 40, 0), 0);
  EXPECT_EQ(c.Get("/health")->status, 200) << "a slow client blocked the server";
  char buf[64];
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  EXPECT_GE(recv(fd, buf, sizeof buf, 0), 0) << "the stalled connection was not closed";
  close(fd);
  // Trickling slowloris: a header line every 200 ms never stalls a read for
  // the read timeout (2 s), yet the whole request is overdue after 3 s: the
  // connection is closed by then (allow up to 8 s on a loaded machine). Both
  // are counted.
  const int tr = raw_connect(s.port());
  ASSERT_GE(tr, 0);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_GT(send(tr, "POST /v1/completions HTTP/1.1\r\n", 31, 0), 0);
  bool cut = false;
  for (int i = 0; i < 50 && !cut; ++i) {  // 10 s at most
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const std::string line = "X-Pad-" + std::to_string(i) + ": y\r\n";
    cut = send(tr, line.data(), line.size(), MSG_NOSIGNAL) < 0 || closed_by_server(tr);
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  close(tr);
  EXPECT_TRUE(cut) << "a trickling client was still connected after 10 s";
  EXPECT_LT(took, 8.0) << "the trickling client was cut off late";
  EXPECT_GE(took, 1.5) << "the trickling client was cut off before its deadline";
  EXPECT_TRUE(wait_metric(s, "encore_requests_rejected_total{reason=\"slow_client\"}", "2"));
  // A request sent at once on a kept-alive connection is served as before.
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  // Pipelined: two requests in one write get two answers (the second was
  // read along with the first and must not be lost).
  const int pp = raw_connect(s.port());
  ASSERT_GE(pp, 0);
  const std::string two =
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(send(pp, two.data(), two.size(), MSG_NOSIGNAL), static_cast<ssize_t>(two.size()));
  timeval rtv{5, 0};
  setsockopt(pp, SOL_SOCKET, SO_RCVTIMEO, &rtv, sizeof rtv);
  std::string got;
  char rb[4096];
  for (ssize_t n; (n = recv(pp, rb, sizeof rb, 0)) > 0;) got.append(rb, static_cast<size_t>(n));
  close(pp);
  size_t answers = 0;
  for (size_t at = got.find("HTTP/1.1 200"); at != std::string::npos;
       at = got.find("HTTP/1.1 200", at + 1)) {
    ++answers;
  }
  EXPECT_EQ(answers, 2u) << got;
}

TEST_F(Serve, MetricsStayValidForPromtool) {
  ServeProcess s(*model_, {});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  httplib::Client c = s.client();
  c.Post("/v1/completions", R"({"prompt":"Tom","max_tokens":4})", kJson);
  c.Post("/v1/completions", R"({"prompt":"Tom","temperature":"hot"})", kJson);
  // A path that tries to inject a label value is counted as "other".
  EXPECT_EQ(c.Get("/v1/a%22b%0Ac")->status, 404);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  TempDir d;
  std::ofstream(d.file("metrics.txt")) << m->body;
  const int rc = std::system(("promtool check metrics < " + shell_quote(d.file("metrics.txt")) +
                              " >/dev/null 2>" + shell_quote(d.file("promtool.err")))
                                 .c_str());
  EXPECT_EQ(rc, 0) << read_file(d.file("promtool.err"));
  for (const char* name : {"encore_requests_total{endpoint=\"/v1/completions\",status=\"400\"}",
                           "encore_requests_total{endpoint=\"other\",status=\"404\"}",
                           "encore_time_to_first_token_seconds_bucket", "encore_kv_blocks",
                           "encore_prefix_cache_lookups_total", "encore_seeds_drawn_total",
                           "encore_state_write_queue_bytes 0", "encore_generated_tokens_total 4"}) {
    EXPECT_NE(m->body.find(name), std::string::npos) << name;
  }
}

// SIGTERM: no new requests (503, /health 503), the one in flight finishes,
// exit 0.
TEST_F(Serve, SigtermFinishesWhatIsInFlight) {
  ServeProcess s(*model_, {});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  Json req = long_request(true);
  req["n"] = 16;
  BackgroundStream a(s, {}, req);
  ASSERT_FALSE(a.text().empty());
  std::thread stopper([&] { EXPECT_EQ(s.stop(), 0) << s.stderr_text(); });
  bool refused = false;
  for (int i = 0; i < 500 && !refused; ++i) {  // the drain starts within the signal's delivery
    httplib::Client c = s.client();
    auto h = c.Get("/health");
    refused = h && h->status == 503;
    if (refused) {
      EXPECT_NE(h->body.find("draining"), std::string::npos);
      auto r = c.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})", kJson);
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 503);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  EXPECT_TRUE(refused) << "the server kept taking requests after SIGTERM";
  stopper.join();
  a.t.join();
  EXPECT_NE(a.text().find("data: [DONE]"), std::string::npos) << "the stream was cut at shutdown";
}

// --shutdown-delay: after SIGTERM the port stays open, /health answering 503
// "draining" and requests 503, for a load balancer to take the server out
// before it closes (deploy/haproxy.cfg); without it, it closes at once.
TEST_F(Serve, ShutdownDelayKeepsThePortOpenAnsweringDraining) {
  for (const bool delay : {true, false}) {
    ServeProcess s(*model_, delay ? std::vector<std::string>{"--shutdown-delay", "3"}
                                  : std::vector<std::string>{});
    ASSERT_TRUE(s.ready()) << s.stderr_text();
    ASSERT_EQ(kill(s.pid(), SIGTERM), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    httplib::Client c = s.client();
    auto h = c.Get("/health");
    if (delay) {
      ASSERT_TRUE(h) << "the port closed before --shutdown-delay passed";
      EXPECT_EQ(h->status, 503);
      EXPECT_NE(h->body.find("draining"), std::string::npos) << h->body;
      auto r = c.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})", kJson);
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 503);
    } else {
      EXPECT_FALSE(h) << "without a delay the port closes once nothing is in flight";
    }
    EXPECT_EQ(s.wait_exit(), 0) << s.stderr_text();
  }
}

TEST_F(Serve, TheOpenAiNodeClientWorks) {
  const std::string dir = ENCORE_SOURCE_DIR "/tests/node";
  if (!std::ifstream(dir + "/node_modules/openai/package.json")) {
    FAIL() << "the openai npm package is missing: run scripts/setup.sh (npm ci in tests/node)";
  }
  ServeProcess s(*model_, {"--chat-template", "chatml"});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  TempDir d;
  const int rc = std::system(("node " + shell_quote(dir + "/openai_client.mjs") + " " + s.base() +
                              " >" + shell_quote(d.file("out")) + " 2>&1")
                                 .c_str());
  EXPECT_EQ(rc, 0) << read_file(d.file("out"));
}

}  // namespace
}  // namespace encore::test
