// `encore serve` through real HTTP on loopback (the binary, cpp-httplib's
// client): OpenAI's shapes, the same output as `encore run` for the same
// request and seed, streaming equal to the whole answer, field errors,
// limits, tenants, disconnects, metrics (checked by promtool), SIGTERM, and
// the official `openai` npm client (tests/node/openai_client.mjs).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <fstream>
#include <functional>
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
    }
    EXPECT_TRUE(usage) << path;
    for (size_t i = 0; i < 2; ++i) {
      const Json& w = whole["choices"][i];
      EXPECT_EQ(text[i], path == "/v1/completions" ? w["text"] : w["message"]["content"]) << path;
      EXPECT_EQ(hashes[i], w["output_hash"]) << path;
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

TEST_F(Serve, LimitsDisconnectsMetricsAndSigterm) {
  TempDir d;
  std::ofstream(d.file("keys")) << "one-at-a-time tenant1 max_in_flight=1\n";
  ServeProcess s(*model_, {"--api-keys", d.file("keys"), "--max-queue", "2", "--read-timeout", "1",
                           "-b", "1"});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  const httplib::Headers key = {{"Authorization", "Bearer one-at-a-time"}};
  const Json long_req = {
      {"prompt", "Once"}, {"max_tokens", 400}, {"stream", true}, {"ignore_eos", true}, {"seed", 1}};
  // A long stream holds the tenant's one place: a second request gets 429.
  std::atomic<bool> got_first{false};
  std::thread first([&] {
    httplib::Client c = s.client();
    post_streaming(c, "/v1/completions", key, long_req.dump(), [&](const char*, size_t) {
      got_first = true;
      return true;
    });
  });
  while (!got_first) std::this_thread::yield();
  httplib::Client c = s.client();
  auto busy = c.Post("/v1/completions", key, R"({"prompt":"x","max_tokens":1})", kJson);
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 429) << busy->body;
  EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
  first.join();
  // A client that goes away mid-stream cancels its request.
  {
    httplib::Client d2 = s.client();
    int chunks = 0;
    post_streaming(d2, "/v1/completions", key, long_req.dump(),
                   [&](const char*, size_t) { return ++chunks < 3; });  // false: hang up
  }
  bool freed = false;
  for (int i = 0; i < 500 && !freed; ++i) {  // within 10 s
    auto m = c.Get("/metrics");
    freed = m && m->body.find("\nencore_running_requests 0\n") != std::string::npos &&
            m->body.find("\nencore_requests_in_flight 0\n") != std::string::npos;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(freed) << "a closed stream kept running";
  // Slowloris: headers that never finish are cut off after --read-timeout;
  // others are served meanwhile.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(s.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_GT(send(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n", 40, 0), 0);
  EXPECT_EQ(c.Get("/health")->status, 200) << "a slow client blocked the server";
  char buf[64];
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const ssize_t got = recv(fd, buf, sizeof buf, 0);  // 0 (closed) or an error response
  EXPECT_GE(got, 0) << "the slow connection was not closed within 5 s";
  close(fd);
  // Metrics parse with promtool.
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  const std::string prom = d.file("metrics.txt");
  std::ofstream(prom) << m->body;
  const int rc = std::system(("promtool check metrics < " + shell_quote(prom) + " >/dev/null 2>" +
                              shell_quote(d.file("promtool.err")))
                                 .c_str());
  EXPECT_EQ(rc, 0) << read_file(d.file("promtool.err"));
  for (const char* name : {"encore_requests_total{endpoint=\"/v1/completions\",status=\"429\"}",
                           "encore_time_to_first_token_seconds_bucket", "encore_kv_blocks",
                           "encore_prefix_cache_lookups_total", "encore_seeds_drawn_total"}) {
    EXPECT_NE(m->body.find(name), std::string::npos) << name;
  }
  // SIGTERM while a stream runs: it finishes, then the process exits 0.
  std::string body;
  std::thread last([&] {
    httplib::Client c3 = s.client();
    Json r = long_req;
    r["max_tokens"] = 60;
    post_streaming(c3, "/v1/completions", key, r.dump(), [&](const char* p, size_t n) {
      body.append(p, n);
      return true;
    });
  });
  while (body.empty()) std::this_thread::yield();
  EXPECT_EQ(s.stop(), 0) << s.stderr_text();
  last.join();
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << "the stream was cut at shutdown";
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
