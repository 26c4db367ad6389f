// Sessions through the real `encore serve` binary (issue 25): a continuation
// with nothing saved is a 404 with code session_not_found (never a 200 with an
// unrelated story), every answer says whether it continued a saved session,
// and a tenant's share of the state tiers (`state_mib=N` on its API-key line)
// keeps another tenant's writes from evicting its sessions — which they do
// without shares. Issue 28: a conversation replays by default (a new turn
// without a seed takes the last turn's seed + 1), on one server and across
// two replicas sharing Redis; the X-Session-Id header names the session.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "serve_fixture.h"
#include "shared_data.h"

namespace encore::test {
namespace {

using Json = nlohmann::json;

class ServeSession : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::ifstream(model_)) GTEST_SKIP() << "no " << model_;
  }
  Json post(ServeProcess& s, const Json& body, int* status, const std::string& key = "") {
    httplib::Headers h;
    if (!key.empty()) h.emplace("Authorization", std::string("Bearer ").append(key));
    const Json j = post_json(s, "/v1/completions", body, status, h);
    EXPECT_NE(*status, 0);
    return j;
  }
  // Continues `session` without a prompt until it is found (its record is
  // written after the answer, by another thread) or 10 s pass: the status.
  int continue_session(ServeProcess& s, const std::string& session, const std::string& key = "",
                       Json* out = nullptr) {
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      const Json j = post(s, {{"session_id", session}, {"max_tokens", 2}}, &status, key);
      if (out) *out = j;
      if (status != 404) return status;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return status;
  }
  // Waits until every state record queued for the tiers is written (the
  // gauge in /metrics reads 0), up to 60 s: whether it did.
  static bool wait_for_writes(ServeProcess& s) {
    for (int i = 0; i < 600; ++i) {
      httplib::Client c = s.client();
      auto m = c.Get("/metrics");
      if (m && m->body.find("\nencore_state_write_queue_bytes 0\n") != std::string::npos) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  const std::string model_ = ENCORE_SHARED_DIR "/models/stories260K.gguf";
};

TEST_F(ServeSession, AMissingSessionIsNotFoundAndAnswersSayWhetherTheyContinued) {
  TempDir d;
  ServeProcess s(model_, {"--state-dir", d.file("state")});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  int status = 0;
  const Json ghost = post(s, {{"session_id", "ghost"}, {"max_tokens", 4}}, &status);
  EXPECT_EQ(status, 404) << ghost.dump();
  EXPECT_EQ(ghost["error"]["code"], "session_not_found");
  EXPECT_EQ(ghost["error"]["param"], "session_id");
  EXPECT_NE(ghost["error"]["message"].get<std::string>().find("no saved session"),
            std::string::npos);
  // A prompt starts it; without one it continues.
  const Json first =
      post(s, {{"session_id", "s1"}, {"prompt", "Tom"}, {"max_tokens", 6}, {"seed", 3}}, &status);
  ASSERT_EQ(status, 200) << first.dump();
  EXPECT_EQ(first["session_id"], "s1");
  EXPECT_EQ(first["session_continued"], false);
  Json next;
  ASSERT_EQ(continue_session(s, "s1", "", &next), 200) << next.dump();
  EXPECT_EQ(next["session_continued"], true);
  EXPECT_EQ(next["usage"]["completion_tokens"], 2);
  // Streamed: every chunk says it.
  httplib::Client c = s.client();
  auto r = c.Post("/v1/completions",
                  Json({{"session_id", "s1"}, {"max_tokens", 2}, {"stream", true}}).dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find("\"session_id\":\"s1\",\"session_continued\":true"), std::string::npos)
      << r->body;
  // Without a session nothing is added.
  const Json plain = post(s, {{"prompt", "Tom"}, {"max_tokens", 2}}, &status);
  EXPECT_FALSE(plain.contains("session_continued"));
}

// Alice writes sessions of ~200 KB of KV each, far past 1 MiB; Bob's one
// session survives only when each has a share.
TEST_F(ServeSession, ATenantsShareKeepsAnothersSessions) {
  for (const bool shares : {true, false}) {
    TempDir d;
    std::ofstream(d.file("keys")) << "alice-key-1234 alice" << (shares ? " state_mib=1" : "")
                                  << "\nbob-key-123456 bob" << (shares ? " state_mib=1" : "")
                                  << "\n";
    ServeProcess s(model_, {"--api-keys", d.file("keys"), "--state-dir", d.file("state"),
                            "--state-max-mib", "2"});
    ASSERT_TRUE(s.ready()) << s.stderr_text();
    int status = 0;
    post(s, {{"session_id", "b1"}, {"prompt", "Tom"}, {"max_tokens", 4}, {"seed", 1}}, &status,
         "bob-key-123456");
    ASSERT_EQ(status, 200);
    ASSERT_EQ(continue_session(s, "b1", "bob-key-123456"), 200);
    const int n = 24;
    const auto name = [](int i) { return std::string("a").append(std::to_string(i)); };
    for (int i = 0; i < n; ++i) {
      std::string prompt;  // ~300 tokens, no block shared with another session
      for (int w = 0; w < 150; ++w) prompt.append(1, ' ').append(1, 'a' + (i + w) % 26).append("x");
      post(s, {{"session_id", name(i)}, {"prompt", prompt}, {"max_tokens", 2}, {"seed", i}},
           &status, "alice-key-1234");
      ASSERT_EQ(status, 200);
    }
    // Every record of Alice's is written (a continuation can be answered from
    // the write queue, before the directory cap has evicted anything).
    ASSERT_EQ(continue_session(s, name(n - 1), "alice-key-1234"), 200);
    ASSERT_TRUE(wait_for_writes(s)) << "the state writes never finished";
    Json bob;
    post(s, {{"session_id", "b1"}, {"max_tokens", 2}}, &status, "bob-key-123456");
    if (shares) {
      EXPECT_EQ(status, 200) << "Alice's writes evicted Bob's session despite the shares";
      // Alice's own oldest sessions made room for her newest.
      post(s, {{"session_id", "a0"}, {"max_tokens", 2}}, &status, "alice-key-1234");
      EXPECT_EQ(status, 404);
    } else {
      EXPECT_EQ(status, 404) << "without shares the directory cap takes Bob's session";
    }
  }
}

// The value of an unlabelled counter or gauge in /metrics (-1 when absent).
double metric(ServeProcess& s, const std::string& name) {
  httplib::Client c = s.client();
  auto r = c.Get("/metrics");
  if (!r) return -1;
  const std::string key = "\n" + name + " ";
  const size_t at = r->body.find(key);
  return at == std::string::npos ? -1 : std::stod(r->body.substr(at + key.size()));
}

struct Turn {
  std::string text;
  uint64_t seed = 0;
  bool continued = false;
};

// Three turns of one conversation, a seed on the first only; turn 1 on
// `first`, turns 2 and 3 on `rest`, each sent as soon as the one before was
// answered. The session is named by the X-Session-Id header alone.
// before_first, after_first: run just before turn 1 is sent and just after
// its answer came.
std::vector<Turn> conversation(ServeProcess& first, ServeProcess& rest, const std::string& session,
                               uint64_t seed, const std::function<void()>& before_first = {},
                               const std::function<void()>& after_first = {}) {
  const std::vector<std::string> prompts = {"Once upon a time", " Tom went to the park.",
                                            " Then the sun came out."};
  std::vector<Turn> turns;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ServeProcess& s = i == 0 ? first : rest;
    if (i == 0 && before_first) before_first();
    Json body = {{"prompt", prompts[i]}, {"max_tokens", 12}};
    if (i == 0) body["seed"] = seed;
    int status = 0;
    const Json j = post_json(s, "/v1/completions", body, &status, {{"X-Session-Id", session}});
    EXPECT_EQ(status, 200) << j.dump();
    if (status != 200) return turns;
    turns.push_back({j["choices"][0]["text"].get<std::string>(), j["seed"].get<uint64_t>(),
                     j.value("session_continued", false)});
    if (i == 0 && after_first) after_first();
  }
  return turns;
}

std::vector<std::string> texts(const std::vector<Turn>& turns) {
  std::vector<std::string> t;
  for (const Turn& x : turns) t.push_back(x.text);
  return t;
}

TEST_F(ServeSession, AConversationReplaysWithoutRepeatingSeedsOnOneServerAndAcrossReplicas) {
  TempDir d;
  RedisServer redis;
  ServeProcess a(model_, {"--state-dir", d.file("a"), "--redis", redis.url()});
  ServeProcess b(model_, {"--state-dir", d.file("b"), "--redis", redis.url()});
  ASSERT_TRUE(a.ready()) << a.stderr_text();
  ASSERT_TRUE(b.ready()) << b.stderr_text();

  const std::vector<Turn> once = conversation(a, a, "once", 41);
  const std::vector<Turn> twice = conversation(a, a, "twice", 41);
  // Redis takes 300 ms to accept turn 1's writes; its answer waits for them
  // (--async-session-writes would not): when it comes, the session is in
  // Redis, as a replica killed right then needs. (KV blocks queued after the
  // record may still be on their way: a lost one is recomputed, so the
  // write queue is not checked to be empty; under load it was not.)
  const std::vector<Turn> hop = conversation(
      a, b, "hop", 41, [&] { ASSERT_EQ(redis.cli("CLIENT PAUSE 300 WRITE"), "OK\n"); },
      [&] { EXPECT_NE(redis.cli("--scan --pattern '*:session/hop'"), ""); });
  ASSERT_EQ(once.size(), 3u);
  EXPECT_EQ(texts(twice), texts(once));
  EXPECT_EQ(texts(hop), texts(once));
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(once[i].seed, 41 + i) << "turn " << i + 1 << " reports the seed it used";
    EXPECT_EQ(hop[i].seed, 41 + i);
    EXPECT_EQ(hop[i].continued, i > 0) << "turn " << i + 1 << " continued the saved session";
  }
  // Replica b continued a session it never saw: its KV came from Redis.
  EXPECT_GE(metric(b, "encore_requests_restored_total"), 1);
  EXPECT_EQ(metric(b, "encore_seeds_session_total"), 2);
  EXPECT_EQ(metric(a, "encore_requests_restored_total"), 0) << "a's turns hit its RAM cache";

  // --async-session-writes answers first: the write is still queued or
  // being written then. What keeps it pending is a race: the request's own
  // Redis read (a GET pipelined with a ZADD, which CLIENT PAUSE WRITE holds)
  // times out after 500 ms and marks the tier down for its retry window
  // (1 s), so the Redis write then fails at once, and the bytes read are the
  // record's write to the directory tier. A try that finds it done reads 0,
  // so up to 3 tries, each on a new session, 1.2 s apart (past the window).
  // Without the flag every try reads 0: the answer waits for the write.
  ServeProcess c(model_,
                 {"--state-dir", d.file("c"), "--redis", redis.url(), "--async-session-writes"});
  ASSERT_TRUE(c.ready()) << c.stderr_text();
  int status = 0;
  double pending = 0;
  for (int attempt = 0; attempt < 3 && pending <= 0; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    ASSERT_EQ(redis.cli("CLIENT PAUSE 5000 WRITE"), "OK\n");
    post_json(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4}}, &status,
              {{"X-Session-Id", "async" + std::to_string(attempt)}});
    pending = metric(c, "encore_state_write_queue_bytes");
    ASSERT_EQ(redis.cli("CLIENT UNPAUSE"), "OK\n");
    ASSERT_EQ(status, 200);
  }
  EXPECT_GT(pending, 0) << c.stderr_text();

  // Changes when it should: another first seed changes the later turns too,
  const std::vector<Turn> other = conversation(a, a, "other", 42);
  ASSERT_EQ(other.size(), 3u);
  EXPECT_NE(other[1].text, once[1].text);
  EXPECT_NE(other[2].text, once[2].text);
  // and an explicit seed on a later turn wins over the derived one.
  post_json(a, "/v1/completions",
            {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"seed", 41}}, &status,
            {{"X-Session-Id", "explicit"}});
  ASSERT_EQ(status, 200);
  const Json two = post_json(
      a, "/v1/completions", {{"prompt", " Tom went to the park."}, {"max_tokens", 12}, {"seed", 7}},
      &status, {{"X-Session-Id", "explicit"}});
  ASSERT_EQ(status, 200) << two.dump();
  EXPECT_EQ(two["seed"], 7);
  EXPECT_NE(two["choices"][0]["text"], once[1].text);
}

// A chat sends the whole conversation each turn: its turn k takes the
// session's seed + k - 1 (k user messages), so a turn sent again (a retry
// after a lost answer) gets the same seed and answer, while the next turn
// gets the next seed.
TEST_F(ServeSession, AChatTurnSentAgainGetsTheSameSeed) {
  TempDir d;
  ServeProcess s(model_, {"--state-dir", d.file("state"), "--chat-template", "chatml"});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  auto chat = [&](const Json& messages, std::optional<uint64_t> seed) {
    Json body = {{"messages", messages}, {"max_tokens", 8}, {"session_id", "c"}};
    if (seed) body["seed"] = *seed;
    int status = 0;
    Json j = post_json(s, "/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 200) << j.dump();
    return j;
  };
  Json m = Json::array({{{"role", "user"}, {"content", "Hi"}}});
  const Json one = chat(m, 20);
  m.push_back({{"role", "assistant"}, {"content", one["choices"][0]["message"]["content"]}});
  m.push_back({{"role", "user"}, {"content", "Tell me a story"}});
  const Json two = chat(m, std::nullopt), again = chat(m, std::nullopt);
  EXPECT_EQ(two["seed"], 21);
  EXPECT_EQ(again["seed"], 21) << "a retried turn counts as the same turn";
  EXPECT_EQ(again["choices"][0]["message"]["content"], two["choices"][0]["message"]["content"]);
  m.push_back({{"role", "assistant"}, {"content", two["choices"][0]["message"]["content"]}});
  m.push_back({{"role", "user"}, {"content", "And then?"}});
  EXPECT_EQ(chat(m, std::nullopt)["seed"], 22);
}

TEST_F(ServeSession, TheSessionHeaderMustAgreeWithTheBody) {
  TempDir d;
  ServeProcess s(model_, {"--state-dir", d.file("state"), "--chat-template", "chatml"});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  int status = 0;
  const Json body = {{"prompt", "Tom"}, {"max_tokens", 2}, {"session_id", "body-id"}};
  Json j = post_json(s, "/v1/completions", body, &status, {{"X-Session-Id", "header-id"}});
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_EQ(j["error"]["param"], "session_id");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("differ"), std::string::npos);
  j = post_json(s, "/v1/completions", body, &status, {{"X-Session-Id", "a b"}});
  EXPECT_EQ(status, 400) << j.dump();
  j = post_json(s, "/v1/completions", body, &status,
                {{"X-Session-Id", "body-id"}, {"x-session-id", "other"}});
  EXPECT_EQ(status, 400) << j.dump();
  // Equal: one session, as with the body alone.
  j = post_json(s, "/v1/completions", body, &status, {{"X-Session-Id", "body-id"}});
  EXPECT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["session_id"], "body-id");
  // Alone, on the chat endpoint too, the header names the session.
  j = post_json(s, "/v1/chat/completions",
                {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 2}}, &status,
                {{"X-Session-Id", "chat-id"}});
  EXPECT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["session_id"], "chat-id");
}

}  // namespace
}  // namespace encore::test
