// Seed hygiene and input normalisation through the real `encore serve` (and
// `encore run` for the prompt ids): --derive-seed gives an absent seed that
// repeats for the same input and changes with the prompt, the tenant and the
// secret; encore_seed_reuse_total counts a tenant's seed given again with
// another prompt; --normalize-input makes "  cafe\u0301 " and "café" the
// same tokens, and without it they differ.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "serve_fixture.h"
#include "shared_data.h"

namespace encore::test {
namespace {

using Json = nlohmann::json;

const httplib::Headers kAlice = {{"Authorization", "Bearer alice-key-1234"}};
const httplib::Headers kBob = {{"Authorization", "Bearer bob-key-123456"}};

// Pure sampling (every token possible), so that another seed shows in the text.
Json request(const std::string& prompt) {
  return {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 1.0},
          {"top_k", 0},       {"top_p", 1.0},     {"min_p", 0.0}};
}

// The value of one sample line of /metrics ("" when absent).
std::string metric(const ServeProcess& s, const std::string& series) {
  auto m = s.client().Get("/metrics");
  if (!m) return {};
  const size_t at = m->body.find("\n" + series + " ");
  if (at == std::string::npos) return {};
  const size_t v = at + series.size() + 2;
  return m->body.substr(v, m->body.find('\n', v) - v);
}

class ServeSeed : public ::testing::Test {
 protected:
  void SetUp() override {
    ENCORE_SHARED_FILE(model, "models/stories260K.gguf");
    model_ = model;
    std::ofstream(dir_.file("keys")) << "alice-key-1234 alice\nbob-key-123456 bob\n";
    for (const char* name : {"secret1", "secret2"}) {
      const std::string path = dir_.file(name);
      std::ofstream(path) << name << std::string(40, 'x');
      ASSERT_EQ(chmod(path.c_str(), 0600), 0);
    }
  }
  // A completion's answer (status 200 expected).
  Json complete(const ServeProcess& s, const Json& req, const httplib::Headers& who = kAlice) {
    int status = 0;
    const Json j = post_json(s, "/v1/completions", req, &status, who);
    EXPECT_EQ(status, 200) << j.dump();
    return j;
  }
  std::string model_;
  TempDir dir_;
};

TEST_F(ServeSeed, DerivedSeedRepeatsForTheSameInputAndChangesWithEachPart) {
  ServeProcess s(model_, {"--api-keys", dir_.file("keys"), "--derive-seed", dir_.file("secret1")});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  const Json a1 = complete(s, request("Once upon a time"));
  const Json a2 = complete(s, request("Once upon a time"));
  EXPECT_EQ(a2["seed"], a1["seed"]);
  EXPECT_EQ(a2["choices"][0]["text"], a1["choices"][0]["text"]);
  EXPECT_EQ(a2["choices"][0]["output_hash"], a1["choices"][0]["output_hash"]);
  EXPECT_LT(a1["seed"].get<uint64_t>(), uint64_t{1} << 53);
  // Another prompt, another tenant: another seed.
  const Json other_prompt = complete(s, request("Once upon a time, a"));
  EXPECT_NE(other_prompt["seed"], a1["seed"]);
  const Json bob = complete(s, request("Once upon a time"), kBob);
  EXPECT_NE(bob["seed"], a1["seed"]);
  EXPECT_NE(bob["choices"][0]["output_hash"], a1["choices"][0]["output_hash"]);
  // A given seed wins over the derivation.
  Json given = request("Once upon a time");
  given["seed"] = 7;
  EXPECT_EQ(complete(s, given)["seed"], 7);
  EXPECT_EQ(metric(s, "encore_seeds_derived_total"), "4");
  EXPECT_EQ(metric(s, "encore_seeds_drawn_total"), "0");
  ASSERT_EQ(s.stop(), 0) << s.stderr_text();

  // The same secret after a restart: the same seed. Another secret: another.
  ServeProcess again(model_,
                     {"--api-keys", dir_.file("keys"), "--derive-seed", dir_.file("secret1")});
  ASSERT_TRUE(again.ready()) << again.stderr_text();
  EXPECT_EQ(complete(again, request("Once upon a time"))["seed"], a1["seed"]);
  ASSERT_EQ(again.stop(), 0);
  ServeProcess other(model_,
                     {"--api-keys", dir_.file("keys"), "--derive-seed", dir_.file("secret2")});
  ASSERT_TRUE(other.ready()) << other.stderr_text();
  EXPECT_NE(complete(other, request("Once upon a time"))["seed"], a1["seed"]);
}

TEST_F(ServeSeed, WithoutDeriveSeedTheSameInputDrawsAnotherSeed) {
  ServeProcess s(model_, {"--api-keys", dir_.file("keys")});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  const Json a1 = complete(s, request("Once upon a time"));
  const Json a2 = complete(s, request("Once upon a time"));
  EXPECT_NE(a2["seed"], a1["seed"]);
  EXPECT_EQ(metric(s, "encore_seeds_drawn_total"), "2");
  EXPECT_EQ(metric(s, "encore_seeds_derived_total"), "0");
}

TEST_F(ServeSeed, AMissingSecretIsCreatedAndAnUnsafeOneRefused) {
  const std::string fresh = dir_.file("fresh-secret");
  {
    ServeProcess s(model_, {"--derive-seed", fresh});
    ASSERT_TRUE(s.ready()) << s.stderr_text();
    struct stat st {};
    ASSERT_EQ(stat(fresh.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(st.st_size, 32);
  }
  ASSERT_EQ(chmod(fresh.c_str(), 0644), 0);
  ServeProcess refused(model_, {"--derive-seed", fresh});
  EXPECT_FALSE(refused.ready()) << "a world-readable secret was taken";
  const std::string err = refused.stderr_text();
  EXPECT_NE(err.find("--derive-seed " + fresh + ": mode 0644"), std::string::npos) << err;
}

TEST_F(ServeSeed, ReuseCountsTheSameSeedWithAnotherPromptPerTenant) {
  ServeProcess s(model_, {"--api-keys", dir_.file("keys")});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  auto seeded = [](const std::string& prompt, int seed) {
    Json j = request(prompt);
    j["max_tokens"] = 2;
    j["seed"] = seed;
    return j;
  };
  complete(s, seeded("Once", 5));
  complete(s, seeded("Once", 5));  // the same request again: no reuse
  complete(s, seeded("Tom", 6));
  complete(s, request("Lily"));  // no seed given: never a reuse
  EXPECT_EQ(metric(s, "encore_seed_reuse_total"), "0");
  complete(s, seeded("Tom", 5));  // counted, not refused (complete() checks 200)
  EXPECT_EQ(metric(s, "encore_seed_reuse_total"), "1");
  complete(s, seeded("Lily", 5), kBob);  // Bob's first use of 5
  EXPECT_EQ(metric(s, "encore_seed_reuse_total"), "1");
  complete(s, seeded("Once", 5));  // Alice's 5 was given with "Tom" too
  EXPECT_EQ(metric(s, "encore_seed_reuse_total"), "2");
}

// ---- --normalize-input ----------------------------------------------------------

const std::string kDecomposed = "  cafe\xCC\x81 ";  // "  cafe\u0301 ": e + combining acute
const std::string kComposed = "caf\xC3\xA9";        // "café": U+00E9

TEST_F(ServeSeed, NormalizeInputMakesRunPromptIdsEqual) {
  auto run = [&](const std::string& prompt, bool normalize) {
    Args a = {"run", "-m", model_, "--json", "-p", prompt, "-n", "8", "--seed", "3"};
    if (normalize) a.push_back("--normalize-input");
    const CliResult r = run_encore(a);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return Json::parse(r.out, nullptr, false);
  };
  const Json with_d = run(kDecomposed, true), with_c = run(kComposed, true);
  EXPECT_EQ(with_d["prompt_ids"], with_c["prompt_ids"]);
  EXPECT_EQ(with_d["output_hash"], with_c["output_hash"]);
  const Json without_d = run(kDecomposed, false), without_c = run(kComposed, false);
  EXPECT_NE(without_d["prompt_ids"], without_c["prompt_ids"]);
  EXPECT_EQ(without_c["prompt_ids"], with_c["prompt_ids"]) << "NFC text was changed";
  // Invalid UTF-8 is refused, naming the field, rather than passed on.
  const CliResult bad =
      run_encore({"run", "-m", model_, "-p", "caf\xC3", "-n", "1", "--normalize-input"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("prompt: not valid UTF-8"), std::string::npos) << bad.err;
}

TEST_F(ServeSeed, NormalizeInputMakesServedTextAndMessagesEqual) {
  auto answers = [&](const ServeProcess& s, const std::string& text, bool ask) {
    Json c = request(text);
    c["seed"] = 3;
    if (ask) c["normalize_input"] = true;
    Json chat = {{"messages", Json::array({Json{{"role", "user"}, {"content", text}}})},
                 {"max_tokens", 8},
                 {"seed", 3}};
    if (ask) chat["normalize_input"] = true;
    int status = 0;
    const Json j = post_json(s, "/v1/chat/completions", chat, &status);
    EXPECT_EQ(status, 200) << j.dump();
    const Json k = complete(s, c, {});
    return std::make_pair(k, j);
  };
  auto same = [](const std::pair<Json, Json>& a, const std::pair<Json, Json>& b) {
    // Prompt tokens, not cached ones: the second of two equal prompts is cached.
    return a.first["usage"]["prompt_tokens"] == b.first["usage"]["prompt_tokens"] &&
           a.first["choices"][0]["output_hash"] == b.first["choices"][0]["output_hash"] &&
           a.second["usage"]["prompt_tokens"] == b.second["usage"]["prompt_tokens"] &&
           a.second["choices"][0]["output_hash"] == b.second["choices"][0]["output_hash"];
  };
  {
    ServeProcess s(model_, {"--chat-template", "chatml", "--normalize-input"});
    ASSERT_TRUE(s.ready()) << s.stderr_text();
    EXPECT_TRUE(same(answers(s, kDecomposed, false), answers(s, kComposed, false)));
  }
  ServeProcess s(model_, {"--chat-template", "chatml"});
  ASSERT_TRUE(s.ready()) << s.stderr_text();
  EXPECT_FALSE(same(answers(s, kDecomposed, false), answers(s, kComposed, false)));
  // A request may ask for it on a server without the flag.
  EXPECT_TRUE(same(answers(s, kDecomposed, true), answers(s, kComposed, true)));
}

}  // namespace
}  // namespace encore::test
