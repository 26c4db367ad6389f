// Request validation through the real `encore serve` binary (issue 25):
// OpenAI fields that would change the answer and that Encore does not
// implement, a logit_bias that bans every token and bad session ids get a 400
// with OpenAI's error object naming the field (`param`) in a short message,
// and the server goes on answering. The parser's own cases are in
// openai_request_test.cpp, the engine's in engine_test.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "serve_fixture.h"
#include "shared_data.h"

namespace encore::test {
namespace {

using Json = nlohmann::json;

constexpr int kStoriesVocab = 512;  // stories260K's vocabulary

class ServeApi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::ifstream(model_)) GTEST_SKIP() << "no " << model_;
  }
  Json post(ServeProcess& s, const std::string& path, const Json& body, int* status) {
    const Json j = post_json(s, path, body, status);
    EXPECT_NE(*status, 0) << "no answer from " << path;
    return j;
  }
  // Expects a 400 whose OpenAI error names `param` in a short message that
  // contains `says`.
  void expect_400(ServeProcess& s, const std::string& path, const Json& body,
                  const std::string& param, const std::string& says) {
    int status = 0;
    const Json j = post(s, path, body, &status);
    const std::string shown = j.dump().substr(0, 400);
    EXPECT_EQ(status, 400) << shown;
    ASSERT_TRUE(j.contains("error") && j["error"].is_object()) << shown;
    const Json& e = j["error"];
    EXPECT_EQ(e.value("type", ""), "invalid_request_error") << shown;
    EXPECT_EQ(e.value("param", ""), param) << shown;
    ASSERT_TRUE(e["message"].is_string()) << shown;
    const std::string message = e["message"];
    EXPECT_LT(message.size(), 300u) << shown;
    EXPECT_NE(message.find(says), std::string::npos) << shown;
  }
  const std::string model_ = ENCORE_SHARED_DIR "/models/stories260K.gguf";
};

Json chat_body(Json extra) {
  extra["messages"] = Json::array({{{"role", "user"}, {"content", "Hi"}}});
  extra["max_tokens"] = 4;
  return extra;
}

TEST_F(ServeApi, UnsupportedFieldsBansAndBadSessionIdsGet400NamingTheField) {
  ServeProcess s(model_, {"--chat-template", "chatml"});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  const std::string completions = "/v1/completions", chat = "/v1/chat/completions";
  expect_400(s, completions, {{"prompt", "Once"}, {"echo", true}}, "echo", "not supported");
  expect_400(
      s, chat,
      chat_body({{"tools",
                  Json::array({{{"type", "function"}, {"function", {{"name", "get_weather"}}}}})}}),
      "tools", "not supported");
  expect_400(s, chat, chat_body({{"response_format", {{"type", "json_object"}}}}),
             "response_format", "not supported");
  // Every token at -100 (a ban): nothing left to sample.
  Json all_banned = {{"prompt", "Once"}, {"max_tokens", 4}};
  for (int id = 0; id < kStoriesVocab; ++id) all_banned["logit_bias"][std::to_string(id)] = -100;
  expect_400(s, completions, all_banned, "logit_bias", "bans every token");
  expect_400(s, completions, {{"prompt", "Once"}, {"session_id", ""}}, "session_id",
             "[A-Za-z0-9_.-]");
  expect_400(s, completions, {{"prompt", "Once"}, {"session_id", std::string(1 << 20, 's')}},
             "session_id", "[A-Za-z0-9_.-]");

  // The neighbours that ask for nothing are answered, and the server goes on.
  int status = 0;
  Json ok = post(s, completions,
                 {{"prompt", "Once"}, {"max_tokens", 4}, {"echo", false}, {"best_of", 1}}, &status);
  EXPECT_EQ(status, 200) << ok.dump();
  ok = post(s, chat,
            chat_body({{"response_format", {{"type", "text"}}},
                       {"tools", Json::array()},
                       {"tool_choice", "none"}}),
            &status);
  EXPECT_EQ(status, 200) << ok.dump();
  Json one_left = all_banned;
  one_left["logit_bias"].erase(std::to_string(kStoriesVocab - 1));
  ok = post(s, completions, one_left, &status);
  EXPECT_EQ(status, 200) << ok.dump().substr(0, 400);
}

}  // namespace
}  // namespace encore::test
