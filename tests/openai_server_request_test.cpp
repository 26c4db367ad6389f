// The server's request bodies (include/encore/openai.h: parse_server_request):
// what parse_request reads, plus the fields only `encore serve` takes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "encore/openai.h"

namespace encore::api {
namespace {

using json = nlohmann::json;

// The server's own fields: the session (batch lines have none) and
// stream_options, allowed only with a stream.
TEST(OpenAiServerRequest, SessionAndStreamOptions) {
  const auto parse = [](const json& body) {
    return parse_server_request(body, Endpoint::Completions);
  };
  EXPECT_EQ(parse({{"prompt", "x"}, {"session_id", "s-1"}}).request.session, "s-1");
  EXPECT_EQ(parse({{"prompt", "x"}}).request.session, "");
  EXPECT_EQ(parse_request({{"prompt", "x"}, {"session_id", "s-1"}}, Endpoint::Completions).session,
            "");  // batch lines: ignored
  EXPECT_TRUE(
      parse({{"stream", true}, {"stream_options", {{"include_usage", true}}}}).include_usage);
  EXPECT_FALSE(parse({{"stream", true}, {"stream_options", json::object()}}).include_usage);
  EXPECT_FALSE(parse({{"stream", true}}).include_usage);
  const auto refused = [&](const json& body, const std::string& field) {
    try {
      parse(body);
      ADD_FAILURE() << body.dump() << " was accepted";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.field(), field) << e.what();
    }
  };
  refused({{"stream_options", {{"include_usage", true}}}}, "stream_options");
  refused({{"stream", true}, {"stream_options", 1}}, "stream_options");
  refused({{"stream", true}, {"stream_options", {{"include_usage", "yes"}}}},
          "stream_options.include_usage");
  refused({{"session_id", ""}}, "session_id");
}

}  // namespace
}  // namespace encore::api
