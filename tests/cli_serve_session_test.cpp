// Sessions through the real `encore serve` binary (issue 25): a continuation
// with nothing saved is a 404 with code session_not_found (never a 200 with an
// unrelated story), every answer says whether it continued a saved session,
// and a tenant's share of the state tiers (`state_mib=N` on its API-key line)
// keeps another tenant's writes from evicting its sessions — which they do
// without shares.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

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

}  // namespace
}  // namespace encore::test
