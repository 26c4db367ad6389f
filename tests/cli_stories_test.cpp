// Golden test: `encore run --temp 0 -n 200 --json` on stories260K reproduces
// the reference ids of ../shared/models/stories260K.expected.json (the
// `kv_cache: f32` cases), one ctest per (model, prompt).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "shared_data.h"

namespace encore::test {
namespace {

struct StoryCase {
  const char* model;
  int index;  // index among that model's f32-KV cases
};

void PrintTo(const StoryCase& c, std::ostream* os) { *os << c.model << " case " << c.index; }

class StoriesGolden : public ::testing::TestWithParam<StoryCase> {};

TEST_P(StoriesGolden, GreedyIdsMatchReference) {
  const StoryCase c = GetParam();
  ENCORE_SHARED_FILE(expected_path, "models/stories260K.expected.json");
  ENCORE_SHARED_FILE(model_path, std::string("models/") + c.model);
  const nlohmann::json expected = nlohmann::json::parse(read_file(expected_path));
  std::vector<nlohmann::json> cases;
  for (const auto& e : expected["cases"]) {
    if (e["model"] == c.model && e["kv_cache"] == "f32") cases.push_back(e);
  }
  ASSERT_LT(c.index, static_cast<int>(cases.size())) << "no such case in " << expected_path;
  const nlohmann::json& e = cases[c.index];

  const CliResult r = run_encore({"run", "-m", model_path, "-p", e["prompt"].get<std::string>(),
                                  "--temp", "0", "-n", "200", "--json", "-c", "512"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json got = nlohmann::json::parse(r.out);
  EXPECT_EQ(got["prompt_ids"], e["prompt_ids"]);
  const auto want_ids = e["ids"].get<std::vector<int>>();
  const auto got_ids = got["ids"].get<std::vector<int>>();
  for (size_t i = 0; i < std::min(want_ids.size(), got_ids.size()); ++i) {
    ASSERT_EQ(got_ids[i], want_ids[i])
        << "first difference at generated token " << i
        << " (reference top1-top2 margin there: " << e["top1_top2_logit_margin"][i] << ")";
  }
  EXPECT_EQ(got_ids.size(), want_ids.size());
  EXPECT_EQ(got["finish_reason"], "length");
  EXPECT_TRUE(got.contains("model_fingerprint"));
  EXPECT_TRUE(got.contains("seed"));
  if (e["prompt"] == "") {
    EXPECT_EQ(got["text"].get<std::string>().rfind(
                  "Once upon a time, there was a little girl named Lily.", 0),
              0u)
        << got["text"];
  }
}

std::string case_name(const ::testing::TestParamInfo<StoryCase>& info) {
  std::string m = info.param.model;
  for (char& ch : m) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return m + "_prompt" + std::to_string(info.param.index);
}

INSTANTIATE_TEST_SUITE_P(
    Cli, StoriesGolden,
    ::testing::Values(StoryCase{"stories260K.gguf", 0}, StoryCase{"stories260K.gguf", 1},
                      StoryCase{"stories260K.gguf", 2}, StoryCase{"stories260K.gguf", 3},
                      StoryCase{"stories260K-f16.gguf", 0}, StoryCase{"stories260K-f16.gguf", 1},
                      StoryCase{"stories260K-f16.gguf", 2}, StoryCase{"stories260K-f16.gguf", 3}),
    case_name);

TEST(CliRun, StreamsTextAndReportsSpeedOnStderr) {
  ENCORE_SHARED_FILE(model_path, "models/stories260K.gguf");
  const CliResult r = run_encore({"run", "-m", model_path, "--temp", "0", "-n", "30", "-p", ""});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time, there was a little girl named Lily.", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("load:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("prompt:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("finish: length"), std::string::npos) << r.err;
}

TEST(CliRun, ContextLimitStopsGenerationAndSaysSo) {
  ENCORE_SHARED_FILE(model_path, "models/stories260K.gguf");
  const CliResult r = run_encore(
      {"run", "-m", model_path, "--temp", "0", "-c", "16", "--json", "-p", "Once upon a time"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json got = nlohmann::json::parse(r.out);
  EXPECT_EQ(got["finish_reason"], "context");
  EXPECT_EQ(got["prompt_ids"].size() + got["ids"].size(), 17u);  // 16 in the KV + the last pick
}

TEST(CliRun, PromptLongerThanContextIsAClearError) {
  ENCORE_SHARED_FILE(model_path, "models/stories260K.gguf");
  const CliResult r =
      run_encore({"run", "-m", model_path, "-c", "4", "-p", "Once upon a time there was a dog"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("context size is 4"), std::string::npos) << r.err;
}

TEST(CliRun, SameSeedSameTextAndSeedIsReported) {
  ENCORE_SHARED_FILE(model_path, "models/stories260K.gguf");
  const std::vector<std::string> args = {"run",  "-m", model_path, "--temp", "0.9", "--seed",
                                         "1234", "-n", "40",       "--json", "-p",  "Tom"};
  const CliResult a = run_encore(args), b = run_encore(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["ids"], nlohmann::json::parse(b.out)["ids"]);
  EXPECT_EQ(nlohmann::json::parse(a.out)["seed"], 1234u);
  const CliResult c = run_encore({"run", "-m", model_path, "--temp", "0.9", "-n", "5", "--json"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_TRUE(nlohmann::json::parse(c.out)["seed"].is_number_unsigned());
}

TEST(CliRun, ThreadCountDoesNotChangeOutput) {
  // stories260K's matrices are too small to be split across threads, so use
  // a synthetic model whose matmuls are (256 x 256 and up, over a 40-token
  // prompt).
  TempDir tmp;
  const std::string model = tmp.file("tiny.gguf");
  ASSERT_EQ(run_encore({"synth", "-o", model, "--preset", "tiny", "--type", "Q4_K"}).exit_code, 0);
  std::string prompt;
  for (int i = 0; i < 8; ++i) prompt += "the quick brown fox ";
  auto ids = [&](const char* threads) {
    const CliResult r = run_encore({"run", "-m", model, "--temp", "0.7", "--seed", "4", "-n", "48",
                                    "--json", "-t", threads, "-p", prompt});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["ids"];
  };
  const auto one = ids("1");
  EXPECT_GE(one.size(), 10u);  // random weights: an EOG may come before -n
  EXPECT_EQ(one, ids("2"));
  EXPECT_EQ(one, ids("3"));
}

TEST(CliRun, BadFlagValuesAreRejected) {
  ENCORE_SHARED_FILE(model_path, "models/stories260K.gguf");
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"-t", "0"},
                                              {"-t", "-3"},
                                              {"-n", "-7"},
                                              {"--kv-mem", "nan"},
                                              {"--kv-mem", "1e30"},
                                              {"--kv-mem", "-5"},
                                              {"-c", "-1"},
                                              {"--temp", "-1"}}) {
    std::vector<std::string> args = {"run", "-m", model_path, "-p", "hi"};
    args.insert(args.end(), bad.begin(), bad.end());
    const CliResult r = run_encore(args);
    EXPECT_NE(r.exit_code, 0) << bad[0] << " " << bad[1];
    EXPECT_NE(r.err.find(bad[0].substr(0, 2)), std::string::npos) << r.err;
  }
  const CliResult both = run_encore({"run", "-m", model_path, "-p", "", "-f", "/dev/null"});
  EXPECT_NE(both.exit_code, 0);
}

TEST(CliRun, KvBudgetSmallerThanContextFailsUpFront) {
  ENCORE_SHARED_FILE(model_path, "models/stories260K.gguf");
  const CliResult r =
      run_encore({"run", "-m", model_path, "-c", "512", "--kv-mem", "0.1", "-p", "Once", "--json"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");  // nothing half-printed
  EXPECT_NE(r.err.find("KV cache holds 160 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("raise --kv-mem"), std::string::npos) << r.err;
}

TEST(CliRun, MmapAndReadGiveTheSameOutput) {
  ENCORE_SHARED_FILE(model_path, "models/stories260K.gguf");
  auto ids = [&](const char* mode) {
    const CliResult r = run_encore(
        {"run", "-m", model_path, "--temp", "0", "-n", "32", "--json", mode, "-p", "The cat"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["ids"];
  };
  EXPECT_EQ(ids("--mmap"), ids("--no-mmap"));
}

TEST(CliRun, MissingModelIsAClearError) {
  const CliResult r = run_encore({"run", "-m", "/nonexistent/model.gguf", "-p", "hi"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace encore::test
