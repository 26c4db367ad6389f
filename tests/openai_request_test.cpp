// OpenAI request bodies and `encore batch` lines -> Request (include/encore/openai.h):
// every field's mapping and default, both batch envelope styles, and for each
// kind of bad input the RequestError's field() and message. A parameterised
// test changes one field at a time and checks the Request changes, so a field
// the parser drops is caught.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "encore/error.h"
#include "encore/openai.h"
#include "encore/request.h"
#include "encore/sampler.h"

namespace encore::api {
namespace {

using json = nlohmann::json;
constexpr float kInf = std::numeric_limits<float>::infinity();

Request completion(const json& body) { return parse_request(body, Endpoint::Completions); }
Request chat(const json& body) { return parse_request(body, Endpoint::ChatCompletions); }

json hello() { return json::array({{{"role", "user"}, {"content", "Hello"}}}); }
json chat_body(json extra = json::object()) {
  extra["messages"] = hello();
  return extra;
}

// Every field of a Request, as one comparable value (-inf biases as text:
// JSON has no infinity).
json fields(const Request& r) {
  json j;
  j["prompt"] = r.prompt;
  j["prompt_ids"] = r.prompt_ids;
  for (const ChatMessage& m : r.messages) j["messages"].push_back({m.role, m.content});
  j["chat_template"] = r.chat_template;
  j["parse_special"] = r.parse_special;
  const SamplingParams& p = r.sampling;
  j["sampling"] = {p.temp,
                   p.top_k,
                   p.top_p,
                   p.min_p,
                   p.typical_p,
                   p.repeat_penalty,
                   p.repeat_last_n,
                   p.presence_penalty,
                   p.frequency_penalty,
                   sampler_order_string(p.order)};
  for (const auto& [id, bias] : p.logit_bias) j["logit_bias"].push_back({id, std::to_string(bias)});
  j["seed"] = r.seed ? json(*r.seed) : json(nullptr);
  j["n"] = r.n;
  j["max_tokens"] = r.max_tokens;
  j["stop"] = r.stop;
  j["logprobs"] = r.logprobs;
  j["ignore_eos"] = r.ignore_eos;
  j["tenant"] = r.tenant;
  j["priority"] = r.priority;
  j["stream"] = r.stream;
  return j;
}

// Runs f and expects a RequestError for `field`, whose message starts with it.
// Returns what() for further checks.
template <class F>
std::string error_of(F&& f, const std::string& field) {
  try {
    f();
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    if (!field.empty()) {
      EXPECT_TRUE(std::string_view(e.what()).starts_with(field + ": ")) << e.what();
    }
    return e.what();
  }
  ADD_FAILURE() << "no RequestError; expected one for field '" << field << "'";
  return "";
}
std::string completion_error(const json& body, const std::string& field) {
  return error_of([&] { completion(body); }, field);
}
std::string chat_error(const json& body, const std::string& field) {
  return error_of([&] { chat(body); }, field);
}
std::string line_error(std::string_view line, const std::string& field) {
  return error_of([&] { parse_batch_line(line); }, field);
}
bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// ---- defaults ---------------------------------------------------------------

TEST(OpenAiRequest, CompletionDefaultsAreLlamaCppsAndOpenAisMaxTokens) {
  const Request r = completion(json::object());
  Request expected;
  expected.max_tokens = 16;  // OpenAI's documented default for /v1/completions
  EXPECT_EQ(fields(r), fields(expected));
  EXPECT_EQ(r.prompt, "");
  EXPECT_TRUE(r.prompt_ids.empty());
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_EQ(r.logprobs, -1);
}

TEST(OpenAiRequest, ChatDefaultsHaveNoTokenLimit) {
  const Request r = chat(chat_body());
  Request expected;
  expected.messages = {{"user", "Hello"}};
  EXPECT_EQ(fields(r), fields(expected));
  EXPECT_EQ(r.max_tokens, -1);
}

TEST(OpenAiRequest, NullFieldsKeepTheDefaults) {
  json body = {{"prompt", nullptr},
               {"temperature", nullptr},
               {"top_p", nullptr},
               {"min_p", nullptr},
               {"typical_p", nullptr},
               {"top_k", nullptr},
               {"repeat_penalty", nullptr},
               {"repeat_last_n", nullptr},
               {"seed", nullptr},
               {"presence_penalty", nullptr},
               {"frequency_penalty", nullptr},
               {"n", nullptr},
               {"stop", nullptr},
               {"ignore_eos", nullptr},
               {"samplers", nullptr},
               {"logit_bias", nullptr},
               {"logprobs", nullptr},
               {"stream", nullptr},
               {"model", nullptr},
               {"user", nullptr},
               {"messages", nullptr}};
  EXPECT_EQ(fields(completion(body)), fields(completion(json::object())));
  body.erase("messages");
  body.erase("prompt");
  body["messages"] = hello();
  body["top_logprobs"] = nullptr;
  EXPECT_EQ(fields(chat(body)), fields(chat(chat_body())));
}

TEST(OpenAiRequest, UnknownAndIgnoredFieldsChangeNothing) {
  const json body = {{"prompt", "Hi"},      {"model", "stories"},         {"user", "mallory"},
                     {"session_id", "s1"},  {"metadata", {{"a", "b"}}},   {"store", false},
                     {"service_tier", "x"}, {"parallel_tool_calls", true}};
  const Request r = completion(body);
  EXPECT_EQ(fields(r), fields(completion({{"prompt", "Hi"}})));
  EXPECT_EQ(r.tenant, "");  // never client-supplied
}

// The values of the unsupported fields that ask for nothing are accepted.
TEST(OpenAiRequest, UnsupportedFieldsTakeTheValuesThatAskForNothing) {
  const Request plain = completion({{"prompt", "Hi"}});
  for (const json& extra :
       {json{{"echo", false}}, json{{"echo", nullptr}}, json{{"suffix", ""}},
        json{{"suffix", nullptr}}, json{{"best_of", 1}}, json{{"best_of", nullptr}}}) {
    json body = {{"prompt", "Hi"}};
    body.update(extra);
    EXPECT_EQ(fields(completion(body)), fields(plain)) << extra.dump();
  }
  const Request three = completion({{"prompt", "Hi"}, {"n", 3}, {"best_of", 3}});  // best_of == n
  EXPECT_EQ(fields(three), fields(completion({{"prompt", "Hi"}, {"n", 3}})));
  const json nothing = json::parse(R"({"response_format": {"type": "text"}, "tools": [],
      "tool_choice": "none", "functions": [], "function_call": "none"})");
  EXPECT_EQ(fields(chat(chat_body(nothing))), fields(chat(chat_body())));
  for (const char* key :
       {"response_format", "tools", "tool_choice", "functions", "function_call"}) {
    EXPECT_EQ(fields(chat(chat_body({{key, nullptr}}))), fields(chat(chat_body()))) << key;
  }
}

// ---- every field mapped -----------------------------------------------------

TEST(OpenAiRequest, CompletionMapsEveryField) {
  const json body = json::parse(R"({
    "model": "m", "prompt": "Once upon", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
    "min_p": 0.1, "typical_p": 0.8, "top_k": 12, "repeat_penalty": 1.3, "repeat_last_n": -1,
    "presence_penalty": 0.25, "frequency_penalty": -0.5, "seed": 18446744073709551615, "n": 3,
    "stop": ["\n", "The end"], "ignore_eos": true, "samplers": "top_k;temperature",
    "logit_bias": {"15043": 2.5, "7": -100}, "logprobs": 4, "stream": true})");
  const Request r = completion(body);
  EXPECT_EQ(r.prompt, "Once upon");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.sampling.temp, 0.5f);
  EXPECT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_EQ(r.sampling.typical_p, 0.8f);
  EXPECT_EQ(r.sampling.top_k, 12);
  EXPECT_EQ(r.sampling.repeat_penalty, 1.3f);
  EXPECT_EQ(r.sampling.repeat_last_n, -1);
  EXPECT_EQ(r.sampling.presence_penalty, 0.25f);
  EXPECT_EQ(r.sampling.frequency_penalty, -0.5f);
  ASSERT_TRUE(r.seed.has_value());
  EXPECT_EQ(*r.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "The end"}));
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.sampling.order, (std::vector<StageKind>{StageKind::TopK, StageKind::Temperature}));
  // The object's key order (nlohmann::json sorts keys); -100 bans.
  EXPECT_EQ(r.sampling.logit_bias,
            (std::vector<std::pair<TokenId, float>>{{15043, 2.5f}, {7, -kInf}}));
  EXPECT_EQ(r.logprobs, 4);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.messages.empty());
}

TEST(OpenAiRequest, ChatMapsEveryField) {
  const json body = json::parse(R"({
    "messages": [{"role": "system", "content": "Be terse."},
                 {"role": "user", "name": "bob",
                  "content": [{"type": "text", "text": "Hi, "}, {"type": "text", "text": "you"}]},
                 {"role": "assistant", "content": ""}],
    "max_completion_tokens": 9, "temperature": 0, "logprobs": true, "top_logprobs": 20,
    "seed": 0, "stop": "x", "n": 64, "stream": false})");
  const Request r = chat(body);
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be terse.");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].content, "Hi, you");  // text parts concatenated
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.sampling.temp, 0.0f);
  EXPECT_EQ(r.logprobs, 20);
  EXPECT_EQ(r.seed, std::optional<uint64_t>(0));
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.n, 64);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.prompt.empty() && r.prompt_ids.empty());
}

TEST(OpenAiRequest, PromptForms) {
  EXPECT_EQ(completion({{"prompt", "abc"}}).prompt, "abc");
  EXPECT_EQ(completion({{"prompt", json::array({"abc"})}}).prompt, "abc");
  const Request ids = completion({{"prompt", {1, 15043, 2147483647}}});
  EXPECT_EQ(ids.prompt_ids, (std::vector<TokenId>{1, 15043, 2147483647}));
  EXPECT_EQ(ids.prompt, "");
  EXPECT_EQ(completion({{"prompt", ""}}).prompt, "");  // BOS only
}

TEST(OpenAiRequest, MaxTokensRules) {
  EXPECT_EQ(completion({{"max_tokens", 0}}).max_tokens, 0);
  EXPECT_EQ(completion({{"max_tokens", -1}}).max_tokens, -1);
  EXPECT_EQ(completion({{"max_tokens", nullptr}}).max_tokens, -1);  // explicit null: unlimited
  EXPECT_EQ(completion({{"max_completion_tokens", 5}}).max_tokens, 5);
  EXPECT_EQ(completion({{"max_tokens", 3}, {"max_completion_tokens", 5}}).max_tokens, 5);
  // A null next to a value (clients that write unset fields as null) keeps the value.
  EXPECT_EQ(completion({{"max_tokens", 3}, {"max_completion_tokens", nullptr}}).max_tokens, 3);
  EXPECT_EQ(chat(chat_body({{"max_tokens", 2147483647}})).max_tokens, 2147483647);
  EXPECT_EQ(chat(chat_body({{"max_tokens", nullptr}})).max_tokens, -1);
}

TEST(OpenAiRequest, LogprobsCompletionAndChat) {
  EXPECT_EQ(completion({{"logprobs", 0}}).logprobs, 0);
  EXPECT_EQ(completion({{"logprobs", 20}}).logprobs, 20);
  EXPECT_EQ(chat(chat_body({{"logprobs", true}})).logprobs, 0);
  EXPECT_EQ(chat(chat_body({{"logprobs", true}, {"top_logprobs", 3}})).logprobs, 3);
  EXPECT_EQ(chat(chat_body({{"logprobs", false}})).logprobs, -1);
}

TEST(OpenAiRequest, SeedForms) {
  EXPECT_EQ(completion({{"seed", 42}}).seed, std::optional<uint64_t>(42));
  EXPECT_FALSE(completion({{"seed", -1}}).seed.has_value());  // llama-server's "random"
  EXPECT_EQ(completion({{"seed", json(int64_t{7})}}).seed, std::optional<uint64_t>(7));
}

TEST(OpenAiRequest, LogitBiasBoundsAndBan) {
  const Request r =
      completion({{"logit_bias", {{"0", 100}, {"2147483647", -99.5}, {"3", -100.0}}}});
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<std::pair<TokenId, float>>{
                                       {0, 100.0f}, {2147483647, -99.5f}, {3, -kInf}}));
  EXPECT_TRUE(completion({{"logit_bias", json::object()}}).sampling.logit_bias.empty());
}

TEST(OpenAiRequest, StopBounds) {
  EXPECT_EQ(completion({{"stop", std::string(kMaxStopBytes, 'a')}}).stop.size(), 1u);
  EXPECT_EQ(completion({{"stop", std::vector<std::string>(kMaxStopStrings, "a")}}).stop.size(),
            kMaxStopStrings);
  EXPECT_TRUE(completion({{"stop", json::array()}}).stop.empty());
}

TEST(OpenAiRequest, SizeLimitsAtTheBound) {
  EXPECT_EQ(completion({{"prompt", std::vector<int>(size_t{1} << 20, 5)}}).prompt_ids.size(),
            size_t{1} << 20);
  json many = json::array();
  for (int i = 0; i < 4096; ++i) many.push_back({{"role", "user"}, {"content", "x"}});
  EXPECT_EQ(chat({{"messages", many}}).messages.size(), 4096u);
}

// ---- changing one field changes the Request -------------------------------------

struct FieldChange {
  const char* name;
  Endpoint endpoint;
  json patch;
};

class OpenAiFieldChange : public testing::TestWithParam<FieldChange> {};

TEST_P(OpenAiFieldChange, ChangesTheRequest) {
  const FieldChange& c = GetParam();
  json base = c.endpoint == Endpoint::Completions ? json{{"prompt", "Hi"}} : chat_body();
  json changed = base;
  changed.update(c.patch);
  EXPECT_NE(fields(parse_request(changed, c.endpoint)), fields(parse_request(base, c.endpoint)))
      << c.patch.dump();
}

const Endpoint kC = Endpoint::Completions;
const Endpoint kChat = Endpoint::ChatCompletions;
INSTANTIATE_TEST_SUITE_P(
    Fields, OpenAiFieldChange,
    testing::Values(
        FieldChange{"prompt", kC, {{"prompt", "Ho"}}},
        FieldChange{"prompt_ids", kC, {{"prompt", {1, 2}}}},
        FieldChange{"prompt_one_string", kC, {{"prompt", json::array({"Ho"})}}},
        FieldChange{"messages", kChat,
                    json::parse(R"({"messages": [{"role": "user", "content": "Yo"}]})")},
        FieldChange{"message_role", kChat,
                    json::parse(R"({"messages": [{"role": "system", "content": "Hello"}]})")},
        FieldChange{
            "message_parts", kChat,
            json::parse(
                R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Yo"}]}]})")},
        FieldChange{"max_tokens", kC, {{"max_tokens", 3}}},
        FieldChange{"max_tokens_chat", kChat, {{"max_tokens", 3}}},
        FieldChange{"max_completion_tokens", kChat, {{"max_completion_tokens", 3}}},
        FieldChange{"temperature", kC, {{"temperature", 1.5}}},
        FieldChange{"top_p", kC, {{"top_p", 0.5}}}, FieldChange{"min_p", kC, {{"min_p", 0.5}}},
        FieldChange{"typical_p", kC, {{"typical_p", 0.5}}},
        FieldChange{"top_k", kC, {{"top_k", 5}}},
        FieldChange{"repeat_penalty", kC, {{"repeat_penalty", 1.5}}},
        FieldChange{"repeat_last_n", kC, {{"repeat_last_n", 8}}},
        FieldChange{"presence_penalty", kC, {{"presence_penalty", 0.5}}},
        FieldChange{"frequency_penalty", kC, {{"frequency_penalty", 0.5}}},
        FieldChange{"seed", kC, {{"seed", 5}}}, FieldChange{"n", kC, {{"n", 2}}},
        FieldChange{"stop", kC, {{"stop", "x"}}},
        FieldChange{"stop_array", kC, {{"stop", {"x", "y"}}}},
        FieldChange{"ignore_eos", kC, {{"ignore_eos", true}}},
        FieldChange{"parse_special", kC, {{"parse_special", true}}},
        FieldChange{"samplers", kC, {{"samplers", "temperature"}}},
        FieldChange{"logit_bias", kC, {{"logit_bias", {{"5", 1}}}}},
        FieldChange{"logit_bias_ban", kC, {{"logit_bias", {{"5", -100}}}}},
        FieldChange{"logprobs", kC, {{"logprobs", 2}}},
        FieldChange{"logprobs_chat", kChat, {{"logprobs", true}}},
        FieldChange{"top_logprobs", kChat, {{"logprobs", true}, {"top_logprobs", 2}}},
        FieldChange{"stream", kC, {{"stream", true}}},
        FieldChange{"stream_chat", kChat, {{"stream", true}}}),
    [](const testing::TestParamInfo<FieldChange>& info) { return std::string(info.param.name); });

// ---- errors -------------------------------------------------------------------

TEST(OpenAiRequestErrors, MessageNamesFieldRangeAndValue) {
  const std::string what = completion_error({{"temperature", "hot"}}, "temperature");
  EXPECT_EQ(what, R"(temperature: must be a number in [0, 1000000], got "hot")");
  try {
    completion({{"top_k", -1}});
    FAIL();
  } catch (const InvalidArgument& e) {  // RequestError is an InvalidArgument and an Error
    EXPECT_TRUE(contains(e.what(), "top_k")) << e.what();
  }
}

TEST(OpenAiRequestErrors, NumberFieldRanges) {
  struct Case {
    const char* field;
    json bad;
    const char* range;
  };
  // The ranges are the settings table's (settings.h), the same as the CLI's.
  const Case cases[] = {
      {"temperature", 1000000.5, "[0, 1000000]"},
      {"temperature", -0.1, "[0, 1000000]"},
      {"top_p", 1.5, "[0, 1]"},
      {"min_p", -1, "[0, 1]"},
      {"typical_p", 2, "[0, 1]"},
      {"repeat_penalty", 0, "(0, 1000000]"},
      {"repeat_penalty", 1e-300, "(0, 1000000]"},
      {"repeat_penalty", 1e7, "(0, 1000000]"},
      {"presence_penalty", 2e6, "[-1000000, 1000000]"},
      {"frequency_penalty", -3e6, "[-1000000, 1000000]"},
      {"temperature", 1e300, "[0, 1000000]"},
      {"top_p", true, "[0, 1]"},
      {"min_p", "0.1", "[0, 1]"},
      {"typical_p", json::array(), "[0, 1]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.field) + " = " + c.bad.dump());
    const std::string what = completion_error({{c.field, c.bad}}, c.field);
    EXPECT_TRUE(contains(what, c.range)) << what;
  }
  EXPECT_EQ(completion({{"repeat_penalty", 10}}).sampling.repeat_penalty, 10.0f);
  EXPECT_EQ(completion({{"presence_penalty", -2}}).sampling.presence_penalty, -2.0f);
  // Wider than OpenAI's documented [0, 2] and [-2, 2], as llama.cpp is (settings.h).
  EXPECT_EQ(completion({{"temperature", 2.5}}).sampling.temp, 2.5f);
  EXPECT_EQ(completion({{"frequency_penalty", -3}}).sampling.frequency_penalty, -3.0f);
}

TEST(OpenAiRequestErrors, IntegerFieldsAreStrictAndRangeChecked) {
  const uint64_t u64max = std::numeric_limits<uint64_t>::max();
  struct Case {
    const char* field;
    json bad;
  };
  const Case cases[] = {
      {"top_k", -1},
      {"top_k", 3.0},
      {"top_k", 2147483648LL},
      {"top_k", u64max},
      {"top_k", 1e300},
      {"top_k", true},
      {"repeat_last_n", -2},
      {"repeat_last_n", "8"},
      {"n", 0},
      {"n", kMaxSamples + 1},
      {"n", 2.0},
      {"max_tokens", -2},
      {"max_tokens", 3.0},
      {"max_tokens", 1e300},
      {"max_tokens", 2147483648LL},
      {"max_completion_tokens", u64max},
      {"max_completion_tokens", false},
      {"logprobs", kMaxTopLogprobs + 1},
      {"logprobs", -2},  // -1 is "none", as Request has it
      {"logprobs", true},
      {"seed", -2},
      {"seed", 1.5},
      {"seed", 1e300},
      {"seed", "5"},
      {"seed", std::numeric_limits<int64_t>::min()},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.field) + " = " + c.bad.dump());
    const std::string what = completion_error({{c.field, c.bad}}, c.field);
    EXPECT_TRUE(contains(what, "integer")) << what;
  }
  // 2^64 does not fit any integer type: nlohmann stores it as a double.
  completion_error(json::parse(R"({"seed": 18446744073709551616})"), "seed");
  // Parsed text stores every non-negative integer as unsigned (a C++ literal 0
  // above is signed): the lower bound must hold on that path too (found by
  // fuzz_batch_request).
  EXPECT_TRUE(contains(completion_error(json::parse(R"({"n": 0})"), "n"), "integer in [1, 64]"));
  line_error(R"({"prompt": "a", "n": 0, "top_k": 0})", "n");
}

TEST(OpenAiRequestErrors, BooleansAndStrings) {
  completion_error({{"stream", "yes"}}, "stream");
  completion_error({{"ignore_eos", 1}}, "ignore_eos");
  completion_error({{"model", 3}}, "model");
  completion_error({{"user", {{"id", 1}}}}, "user");
  completion_error({{"session_id", false}}, "session_id");
  chat_error(chat_body({{"logprobs", 3}}), "logprobs");
  completion_error({{"parse_special", "yes"}}, "parse_special");
  completion_error({{"parse_special", 1}}, "parse_special");
  chat_error(chat_body({{"parse_special", "no"}}), "parse_special");
}

// Special-token text in a text prompt is plain text unless the body opts in;
// chat content is always plain text, so opting in there is refused.
TEST(OpenAiRequest, ParseSpecialIsOptInAndCompletionsOnly) {
  EXPECT_FALSE(completion({{"prompt", "</s>"}}).parse_special);
  EXPECT_TRUE(completion({{"prompt", "</s>"}, {"parse_special", true}}).parse_special);
  EXPECT_FALSE(completion({{"prompt", "</s>"}, {"parse_special", false}}).parse_special);
  EXPECT_FALSE(chat(chat_body({{"parse_special", false}})).parse_special);
  const std::string e = chat_error(chat_body({{"parse_special", true}}), "parse_special");
  EXPECT_NE(e.find("message content is always plain text"), std::string::npos) << e;
  // An engine error about a message's role names that field.
  EXPECT_EQ(param_of(InvalidArgument("messages[3].role",
                                     "'x' is not a role of the chatml chat "
                                     "format")),
            "messages[3].role");
  EXPECT_EQ(param_of(InvalidArgument("parse_special", "message content is always plain text")),
            "parse_special");
}

TEST(OpenAiRequestErrors, Prompt) {
  EXPECT_TRUE(contains(completion_error({{"prompt", {"a", "b"}}}, "prompt"), "2 prompts"));
  completion_error({{"prompt", json::array()}}, "prompt");
  completion_error(json::parse(R"({"prompt": [[1, 2], [3]]})"),
                   "prompt");  // several tokenized prompts
  completion_error({{"prompt", 5}}, "prompt");
  completion_error({{"prompt", {{"a", 1}}}}, "prompt");
  completion_error({{"prompt", json::array({true})}}, "prompt");
  completion_error({{"prompt", {1, -1}}}, "prompt[1]");
  completion_error({{"prompt", {1, 2, 2147483648LL}}}, "prompt[2]");
  completion_error({{"prompt", {1, 2.0}}}, "prompt[1]");
  completion_error({{"prompt", {1, "a"}}}, "prompt[1]");
  const std::string big =
      completion_error({{"prompt", std::vector<int>((size_t{1} << 20) + 1, 5)}}, "prompt");
  EXPECT_TRUE(contains(big, "1048576")) << big;
  completion_error({{"messages", hello()}}, "messages");  // messages on /v1/completions
}

TEST(OpenAiRequestErrors, Messages) {
  chat_error(json::object(), "messages");
  chat_error({{"messages", json::array()}}, "messages");
  chat_error({{"messages", "Hello"}}, "messages");
  chat_error(chat_body({{"prompt", "x"}}), "prompt");  // prompt on /v1/chat/completions
  chat_error({{"messages", json::array({"Hello"})}}, "messages[0]");
  chat_error(json::parse(R"({"messages": [{"content": "x"}]})"), "messages[0].role");
  chat_error(json::parse(R"({"messages": [{"role": 1, "content": "x"}]})"), "messages[0].role");
  chat_error(json::parse(R"({"messages": [{"role": "", "content": "x"}]})"), "messages[0].role");
  chat_error(json::parse(R"({"messages": [{"role": "user"}]})"), "messages[0].content");
  chat_error(json::parse(R"({"messages": [{"role": "user", "content": 5}]})"),
             "messages[0].content");
  chat_error(json::parse(R"({"messages": [{"role": "user", "content": "x", "name": 1}]})"),
             "messages[0].name");
  const json image = json::parse(R"({"messages": [{"role": "system", "content": "x"},
      {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]})");
  const std::string what = chat_error(image, "messages[1].content[0].type");
  EXPECT_TRUE(contains(what, "image_url")) << what;
  chat_error(json::parse(R"({"messages": [{"role": "user", "content": ["x"]}]})"),
             "messages[0].content[0]");
  chat_error(json::parse(R"({"messages": [{"role": "user", "content": [{"text": "x"}]}]})"),
             "messages[0].content[0].type");
  chat_error(json::parse(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})"),
             "messages[0].content[0].text");
  chat_error(
      json::parse(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})"),
      "messages[0].content[0].text");
  json many = json::array();
  for (int i = 0; i < 4097; ++i) many.push_back({{"role", "user"}, {"content", "x"}});
  EXPECT_TRUE(contains(chat_error({{"messages", many}}, "messages"), "4096"));
}

TEST(OpenAiRequestErrors, TopLogprobsNeedsLogprobs) {
  chat_error(chat_body({{"top_logprobs", 2}}), "top_logprobs");
  chat_error(chat_body({{"logprobs", false}, {"top_logprobs", 2}}), "top_logprobs");
  chat_error(chat_body({{"logprobs", true}, {"top_logprobs", kMaxTopLogprobs + 1}}),
             "top_logprobs");
  chat_error(chat_body({{"logprobs", true}, {"top_logprobs", 1.0}}), "top_logprobs");
}

TEST(OpenAiRequestErrors, Stop) {
  completion_error({{"stop", ""}}, "stop");
  completion_error({{"stop", 5}}, "stop");
  completion_error({{"stop", {"a", ""}}}, "stop[1]");
  completion_error({{"stop", {"a", "b", 3}}}, "stop[2]");
  completion_error({{"stop", json::array({std::string(kMaxStopBytes + 1, 'a')})}}, "stop[0]");
  const std::string many =
      completion_error({{"stop", std::vector<std::string>(kMaxStopStrings + 1, "a")}}, "stop");
  EXPECT_TRUE(contains(many, "16")) << many;
}

TEST(OpenAiRequestErrors, LogitBias) {
  completion_error({{"logit_bias", {1, 2}}}, "logit_bias");
  completion_error({{"logit_bias", {{"15043", 100.5}}}}, "logit_bias.15043");
  completion_error({{"logit_bias", {{"15043", -101}}}}, "logit_bias.15043");
  completion_error({{"logit_bias", {{"15043", "1"}}}}, "logit_bias.15043");
  completion_error({{"logit_bias", {{"15043", true}}}}, "logit_bias.15043");
  for (const char* key : {"-1", "01", "abc", "2147483648", "1.5", "+5", " 5", "99999999999", ""}) {
    SCOPED_TRACE(key);
    const std::string what =
        completion_error({{"logit_bias", {{key, 1}}}}, std::string("logit_bias.") + key);
    EXPECT_TRUE(contains(what, "token id")) << what;
  }
  // A huge key is cut in the field and message, not copied whole.
  const std::string key(100000, '7');
  const std::string what = error_of(
      [&] {
        completion({{"logit_bias", {{key, 1}}}});
      },
      "logit_bias." + key.substr(0, 40) + "...");
  EXPECT_LT(what.size(), 400u);
}

TEST(OpenAiRequestErrors, Samplers) {
  const std::string what = completion_error({{"samplers", "top_k;bogus"}}, "samplers");
  EXPECT_TRUE(contains(what, "bogus")) << what;
  EXPECT_FALSE(contains(what, "--samplers")) << what;
  completion_error({{"samplers", "top_k;top_k"}}, "samplers");
  completion_error({{"samplers", json::array({"top_k"})}}, "samplers");
}

// Fields that would change the answer and that Encore does not implement:
// refused on the endpoint where OpenAI defines them, with their type checked
// as OpenAI documents it, in a short message that says what to do.
TEST(OpenAiRequestErrors, UnsupportedFieldsAreRefusedNamingThem) {
  struct Case {
    Endpoint endpoint;
    json patch;
    const char* field;
    const char* says;
  };
  const json tool = json::parse(R"({"type": "function", "function": {"name": "f"}})");
  const Case cases[] = {
      {kC, {{"echo", true}}, "echo", "not supported"},
      {kC, {{"echo", "true"}}, "echo", "boolean"},
      {kC, {{"echo", 1}}, "echo", "boolean"},
      {kC, {{"suffix", "x"}}, "suffix", "not supported"},
      {kC, {{"suffix", 5}}, "suffix", "string"},
      {kC, {{"best_of", 2}}, "best_of", "not supported"},
      {kC, {{"best_of", 4}, {"n", 3}}, "best_of", "not supported"},
      {kC, {{"best_of", 2}, {"n", 3}}, "best_of", ">= n (3)"},
      {kC, {{"best_of", 1.0}}, "best_of", "integer"},
      {kC, {{"best_of", "1"}}, "best_of", "integer"},
      {kChat, {{"response_format", {{"type", "json_object"}}}}, "response_format", "not supported"},
      {kChat,
       {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}},
       "response_format",
       "not supported"},
      {kChat, {{"response_format", "text"}}, "response_format", "object"},
      {kChat, {{"response_format", json::object()}}, "response_format.type", "missing"},
      {kChat, {{"response_format", {{"type", 1}}}}, "response_format.type", "string"},
      {kChat, {{"tools", json::array({tool})}}, "tools", "not supported"},
      {kChat, {{"tools", tool}}, "tools", "array"},
      {kChat, {{"tool_choice", "auto"}}, "tool_choice", "not supported"},
      {kChat, {{"tool_choice", "required"}}, "tool_choice", "not supported"},
      {kChat, {{"tool_choice", tool}}, "tool_choice", "not supported"},
      {kChat, {{"tool_choice", 1}}, "tool_choice", "\"none\""},
      {kChat, json::parse(R"({"functions": [{"name": "f"}]})"), "functions", "not supported"},
      {kChat, {{"functions", "f"}}, "functions", "array"},
      {kChat, {{"function_call", "auto"}}, "function_call", "not supported"},
      {kChat, {{"function_call", {{"name", "f"}}}}, "function_call", "not supported"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.patch.dump());
    json body = c.endpoint == kC ? json{{"prompt", "Hi"}} : chat_body();
    body.update(c.patch);
    const std::string what = error_of([&] { parse_request(body, c.endpoint); }, c.field);
    EXPECT_TRUE(contains(what, c.says)) << what;
    if (std::string_view(c.says) == "not supported") {
      EXPECT_TRUE(contains(what, "leave")) << "says what to do: " << what;
    }
    EXPECT_LT(what.size(), 300u) << what;
  }
  // Another field's error is not hidden behind these checks: all are still parsed.
  completion_error({{"echo", true}, {"temperature", 3e6}}, "temperature");
}

// session_id: checked by the engine's own rule (valid_session_id,
// request.h): "" would silently mean "no session". A huge one is clipped.
TEST(OpenAiRequestErrors, SessionIdFollowsTheEngineRule) {
  const std::string longest(kMaxSessionBytes, 'a');
  for (const std::string& id :
       {std::string("a"), std::string("Az09_.-"), longest, std::string(""), longest + "a",
        std::string("a b"), std::string("a/b"), std::string("\xff"), std::string("\xc3\xa9")}) {
    SCOPED_TRACE(id);
    if (valid_session_id(id)) {
      EXPECT_NO_THROW(completion({{"session_id", id}}));
      EXPECT_NO_THROW(chat(chat_body({{"session_id", id}})));
    } else {
      EXPECT_TRUE(contains(completion_error({{"session_id", id}}, "session_id"), kSessionIdRule));
    }
  }
  EXPECT_FALSE(valid_session_id(""));
  EXPECT_FALSE(valid_session_id(longest + "a"));
  const std::string what =
      completion_error({{"session_id", std::string(1 << 20, 'x')}}, "session_id");
  EXPECT_LT(what.size(), 300u) << what.substr(0, 400);
  completion_error({{"session_id", 5}}, "session_id");
}

// Engine errors name their own fields (Error::field()); these are OpenAI's
// names for them.
TEST(OpenAiRequestErrors, ParamOf) {
  EXPECT_EQ(param_of(InvalidArgument("logit_bias", "the logit bias bans every token")),
            "logit_bias");
  EXPECT_EQ(param_of(InvalidArgument("session", "'x y' is not a session id")), "session_id");
  EXPECT_EQ(param_of(NotFound("session", "none saved")), "session_id");
  EXPECT_EQ(param_of(InvalidArgument("prompt_ids[2]", "token id 9 is outside")), "prompt[2]");
  EXPECT_EQ(param_of(InvalidArgument("top_p", "must be a number in [0, 1], got 2")), "top_p");
  EXPECT_EQ(param_of(InvalidArgument("the engine is shutting down")), "");
}

TEST(OpenAiRequestErrors, BodyNotAnObject) {
  completion_error(json::array(), "");
  chat_error("text", "");
}

TEST(OpenAiRequestErrors, BadUtf8IsShownSafely) {
  // A body built in-process may hold bytes that are not UTF-8: the message stays valid UTF-8.
  const std::string what =
      completion_error({{"temperature", std::string("\xff\xfe hot")}}, "temperature");
  EXPECT_NO_THROW(json(what).dump());
}

// ---- batch lines ----------------------------------------------------------------

TEST(OpenAiBatchLine, FlatCompletionAndChat) {
  const BatchLine a = parse_batch_line(R"({"custom_id": "a1", "prompt": "Hi", "max_tokens": 3})");
  EXPECT_EQ(a.custom_id, std::optional<std::string>("a1"));
  EXPECT_EQ(a.endpoint, Endpoint::Completions);
  EXPECT_EQ(a.request.prompt, "Hi");
  EXPECT_EQ(a.request.max_tokens, 3);

  const BatchLine b =
      parse_batch_line(R"({"messages": [{"role": "user", "content": "Yo"}], "seed": 4})");
  EXPECT_FALSE(b.custom_id.has_value());
  EXPECT_EQ(b.endpoint, Endpoint::ChatCompletions);
  ASSERT_EQ(b.request.messages.size(), 1u);
  EXPECT_EQ(b.request.messages[0].content, "Yo");
  EXPECT_EQ(b.request.max_tokens, -1);
  EXPECT_EQ(b.request.seed, std::optional<uint64_t>(4));

  const BatchLine c = parse_batch_line("  {\"temperature\": 0}\r\n");
  EXPECT_EQ(c.endpoint, Endpoint::Completions);
  EXPECT_EQ(c.request.prompt, "");
  EXPECT_EQ(c.request.max_tokens, 16);
}

TEST(OpenAiBatchLine, BatchApiEnvelope) {
  const BatchLine a = parse_batch_line(
      R"({"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions",
          "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                   "max_tokens": 5}})");
  EXPECT_EQ(a.custom_id, std::optional<std::string>("req-1"));
  EXPECT_EQ(a.endpoint, Endpoint::ChatCompletions);
  EXPECT_EQ(a.request.messages.size(), 1u);
  EXPECT_EQ(a.request.max_tokens, 5);

  const BatchLine b = parse_batch_line(
      R"({"custom_id": "req-2", "method": "POST", "url": "/v1/completions",
          "body": {"prompt": [1, 2, 3], "temperature": 0}})");
  EXPECT_EQ(b.endpoint, Endpoint::Completions);
  EXPECT_EQ(b.request.prompt_ids, (std::vector<TokenId>{1, 2, 3}));
  EXPECT_EQ(b.request.max_tokens, 16);
  // Fields inside the body are named relative to it, as the endpoint would name them.
  line_error(R"({"url": "/v1/completions", "body": {"temperature": 3e6}})", "temperature");
  // The url decides: messages in a completions body is an error.
  line_error(R"({"url": "/v1/completions", "body": {"messages": []}})", "messages");
}

TEST(OpenAiBatchLine, EnvelopeErrors) {
  line_error(R"({"method": "GET", "url": "/v1/completions", "body": {}})", "method");
  line_error(R"({"method": "POST", "body": {}})", "url");
  EXPECT_TRUE(contains(line_error(R"({"url": "/v1/embeddings", "body": {}})", "url"),
                       "/v1/chat/completions"));
  line_error(R"({"url": "/v1/completions"})", "body");
  line_error(R"({"url": "/v1/completions", "body": "prompt"})", "body");
  line_error(R"({"custom_id": 7, "prompt": "x"})", "custom_id");
}

TEST(OpenAiBatchLine, FlatLineWithPromptAndMessagesIsAnError) {
  line_error(R"({"prompt": "x", "messages": [{"role": "user", "content": "y"}]})", "prompt");
}

TEST(OpenAiBatchLine, JsonErrorsHaveNoFieldAndAByteOffset) {
  for (std::string_view line : {R"({"prompt": "x",})", R"({"prompt": )", "", "{} {}",
                                R"({"a": tru})", "{\"a\": \"\xff\"}", R"({"seed": 1e400})"}) {
    SCOPED_TRACE(line);
    const std::string what = line_error(line, "");
    EXPECT_TRUE(contains(what, "at byte ")) << what;
    EXPECT_FALSE(contains(what, "json.exception")) << what;
  }
  EXPECT_TRUE(contains(line_error(R"({"prompt": "x",})", ""), "at byte 16"));
  line_error("[1, 2]", "");
  line_error("\"text\"", "");
}

TEST(OpenAiBatchLine, MessagesStayShortWhateverTheToken) {
  // An unterminated string of a megabyte: the message does not quote it.
  const std::string line = "{\"prompt\": \"" + std::string(1 << 20, 'x');
  const std::string what = line_error(line, "");
  EXPECT_LT(what.size(), 300u) << what.substr(0, 300);
  const std::string number = "{\"seed\": 1" + std::string(100000, '0') + "}";
  EXPECT_LT(line_error(number, "").size(), 400u);
  // A token that looks like the parser's "; expected X" tail is not copied either
  // (it held bytes that are not UTF-8: found by fuzz_batch_request).
  const std::string what2 = line_error("\"ab'; expected \xff\xe6'", "");
  EXPECT_FALSE(contains(what2, "\xff")) << what2;
  EXPECT_NO_THROW(json(what2).dump());
  EXPECT_TRUE(contains(line_error("{\"a\" 1}", ""), "; expected ':'"));
}

TEST(OpenAiBatchLine, LimitsBeforeParsing) {
  const std::string too_long(kMaxLineBytes + 1, ' ');
  EXPECT_TRUE(contains(line_error(too_long, ""), "16777216"));
  // Deep nesting is refused (memory), shallow nesting in ignored fields is fine.
  const std::string deep = "{\"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_TRUE(contains(line_error(deep, ""), "nested"));
  const std::string ok = "{\"x\": " + std::string(30, '[') + std::string(30, ']') + "}";
  EXPECT_NO_THROW(parse_batch_line(ok));
}

TEST(OpenAiBatchLine, RepeatedKeysKeepTheLast) {
  EXPECT_EQ(parse_batch_line(R"({"n": 2, "n": 3})").request.n, 3);
}

TEST(OpenAiBatchLine, PeekCustomId) {
  EXPECT_EQ(peek_custom_id(R"({"custom_id": "a", "temperature": "hot"})"),
            std::optional<std::string>("a"));
  EXPECT_EQ(peek_custom_id(R"({"custom_id": "b", "url": "/nope", "body": 1})"),
            std::optional<std::string>("b"));
  EXPECT_FALSE(peek_custom_id(R"({"custom_id": "c", )").has_value());
  EXPECT_FALSE(peek_custom_id(R"({"custom_id": 5})").has_value());
  EXPECT_FALSE(peek_custom_id(R"({"prompt": "x"})").has_value());
  EXPECT_FALSE(peek_custom_id(R"(["custom_id"])").has_value());
  EXPECT_FALSE(peek_custom_id("").has_value());
  EXPECT_FALSE(peek_custom_id(std::string(kMaxLineBytes + 1, ' ')).has_value());
}

}  // namespace
}  // namespace encore::api
