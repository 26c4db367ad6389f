// Every `encore run` flag provably takes effect, through the real binary
// (--normalize-input: cli_serve_seed_test.cpp).
//
// A sameness test alone proves nothing: an ignored --seed passed every one we
// had. So each flag that is part of the request is paired: two runs that
// differ only in that flag must give different ids (or the documented
// different finish). Each flag that must not change the output (-t, -b,
// --isa, --kv-mem, --mmap, --logprobs) gives identical ids, and is shown to
// take effect some other way (the load line on stderr, an error when the
// budget is too small, the extra JSON fields).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "shared_data.h"

namespace encore::test {
namespace {

using Json = nlohmann::json;

// The whole distribution at temperature 1: every seed may go its own way.
const Args kPure = {"--temp", "1.0", "--top-k", "0", "--top-p", "1", "--min-p", "0"};

class CliFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    ENCORE_SHARED_FILE(path, "models/stories260K.gguf");
    model_ = path;
  }

  // `encore run --json` on stories260K; fails the test unless it succeeds.
  Json run(const Args& args, std::string* err = nullptr) const {
    const CliResult r = run_encore(Args{"run", "-m", model_, "--json", "-c", "256"} + args);
    EXPECT_EQ(r.exit_code, 0) << ::testing::PrintToString(args) << "\n" << r.err;
    if (err) *err = r.err;
    if (r.exit_code != 0) return Json::object();
    return Json::parse(r.out);
  }
  static Json ids(const Json& j) { return j.value("ids", Json::array()); }

  std::string model_;
  TempDir dir_;
};

TEST_F(CliFlags, TwentySeedsGiveAtLeastEighteenDistinctCompletions) {
  std::set<Json> distinct;
  for (int seed = 1; seed <= 20; ++seed) {
    const Json j =
        run(Args{"-p", "Once upon a time", "-n", "32", "--seed", std::to_string(seed)} + kPure);
    EXPECT_EQ(j.value("seed", uint64_t{0}), static_cast<uint64_t>(seed)) << "reported seed";
    distinct.insert(ids(j));
  }
  std::printf("distinct 32-token completions over 20 seeds: %zu\n", distinct.size());
  EXPECT_GE(distinct.size(), 18u);
}

TEST_F(CliFlags, TwoSeedlessRunsDiffer) {
  const Args req = Args{"-p", "Once upon a time", "-n", "32"} + kPure;
  const Json a = run(req), b = run(req);
  EXPECT_NE(a.at("seed"), b.at("seed"));
  EXPECT_NE(ids(a), ids(b)) << "two seedless runs gave the same output";
}

// --derive-seed: two seedless runs with one secret are the same run; another
// secret, another seed.
TEST_F(CliFlags, DeriveSeedRepeatsASeedlessRun) {
  const Args req = Args{"-p", "Once upon a time", "-n", "32"} + kPure;
  const Json a = run(req + Args{"--derive-seed", dir_.file("secret")});
  const Json b = run(req + Args{"--derive-seed", dir_.file("secret")});
  EXPECT_EQ(a.at("seed"), b.at("seed"));
  EXPECT_EQ(ids(a), ids(b));
  const Json c = run(req + Args{"--derive-seed", dir_.file("other")});
  EXPECT_NE(c.at("seed"), a.at("seed"));
  EXPECT_NE(ids(c), ids(a)) << "another secret gave the same output";
}

// `args` with flag set to value: replaced where it is given, else appended.
Args with(Args args, const std::string& flag, const std::string& value) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == flag) {
      args[i + 1] = value;
      return args;
    }
  }
  return args + Args{flag, value};
}

// For each request flag: a base request and the same with one flag changed.
TEST_F(CliFlags, EveryRequestFlagChangesTheOutput) {
  const Args base = Args{"-p", "Once upon a time", "-n", "32", "--seed", "4242"} + kPure;
  struct Pair {
    std::string flag;
    std::string value;  // the changed run's
    Args extra = {};    // in both runs
  };
  const std::vector<Pair> pairs = {
      {"--seed", "4243"},
      {"--temp", "2.5"},
      {"--top-k", "2"},
      {"--top-p", "0.3"},
      {"--min-p", "0.3"},
      {"--typical", "0.3"},
      {"--repeat-penalty", "3"},
      {"--repeat-last-n", "1", {"--repeat-penalty", "3"}},
      {"--presence-penalty", "3"},
      {"--frequency-penalty", "3"},
      // Temperature before min_p widens what min_p keeps at temperature 3.
      {"--samplers", "temperature;min_p", {"--temp", "3", "--min-p", "0.2"}},
      {"-n", "5"},
  };
  for (const Pair& p : pairs) {
    Args a = base;
    for (size_t i = 0; i + 1 < p.extra.size(); i += 2) a = with(a, p.extra[i], p.extra[i + 1]);
    const Json ja = run(a), jb = run(with(a, p.flag, p.value));
    ASSERT_FALSE(ids(ja).empty()) << p.flag;
    EXPECT_NE(ids(ja), ids(jb)) << p.flag << " " << p.value << " changed nothing";
  }
}

TEST_F(CliFlags, LogitBiasStopAndNTakeEffect) {
  const Args req = Args{"-p", "Once upon a time", "-n", "32", "--seed", "77"} + kPure;
  const Json base = run(req);
  ASSERT_GE(ids(base).size(), 8u);
  // --logit-bias ID-inf bans the first generated token.
  const int first = ids(base)[0].get<int>();
  const Json banned = run(req + Args{"--logit-bias", std::to_string(first) + "-inf"});
  EXPECT_NE(ids(banned)[0].get<int>(), first) << "a banned token was generated";
  // A large positive bias forces a token.
  const Json forced = run(req + Args{"--logit-bias", "300+1000"});
  for (const Json& id : ids(forced)) EXPECT_EQ(id.get<int>(), 300);
  // --stop: a piece of the base text ends it early, with finish "stop".
  const std::string text = base.at("text");
  ASSERT_GE(text.size(), 12u);
  const std::string stop = text.substr(text.size() / 2, 3);
  const Json stopped = run(req + Args{"--stop", stop});
  EXPECT_EQ(stopped.at("finish_reason"), "stop");
  EXPECT_LT(ids(stopped).size(), ids(base).size());
  EXPECT_EQ(stopped.at("text").get<std::string>().find(stop), std::string::npos);
  EXPECT_EQ(base.at("finish_reason"), "length");
  // --n 2: a choices list whose second sample is another draw; the first is
  // the --n 1 output.
  const Json two = run(req + Args{"--n", "2"});
  ASSERT_EQ(two.at("choices").size(), 2u);
  EXPECT_EQ(two["choices"][0].at("ids"), ids(base));
  EXPECT_NE(two["choices"][1].at("ids"), ids(base));
}

TEST_F(CliFlags, PromptContextAndKvTypeFlagsTakeEffect) {
  const Args req = Args{"-n", "16", "--seed", "5"} + kPure;
  const Json a = run(req + Args{"-p", "Once upon a time"});
  const Json b = run(req + Args{"-p", "The dog"});
  EXPECT_NE(a.at("prompt_ids"), b.at("prompt_ids"));
  EXPECT_NE(ids(a), ids(b));
  // -f reads the prompt from a file: the same ids as -p with its text.
  const std::string file = dir_.file("prompt.txt");
  std::ofstream(file) << "The dog";
  const Json f = run(req + Args{"-f", file});
  EXPECT_EQ(f.at("prompt_ids"), b.at("prompt_ids"));
  EXPECT_EQ(ids(f), ids(b));
  // --special: "<s>" typed in the prompt becomes the BOS id.
  const Json plain = run(req + Args{"-p", "<s>Tom"});
  const Json special = run(req + Args{"-p", "<s>Tom", "--special"});
  EXPECT_NE(plain.at("prompt_ids"), special.at("prompt_ids"));
  // --chat / --system / --chat-template render another prompt.
  const Json chat = run(req + Args{"-p", "The dog", "--chat-template", "chatml"});
  EXPECT_NE(chat.at("prompt_ids"), b.at("prompt_ids"));
  EXPECT_EQ(chat.at("chat_template"), "chatml");
  const Json sys =
      run(req + Args{"-p", "The dog", "--chat-template", "chatml", "--system", "Be nice."});
  EXPECT_NE(sys.at("prompt_ids"), chat.at("prompt_ids"));
  const Json llama2 = run(req + Args{"-p", "The dog", "--chat-template", "llama2"});
  EXPECT_NE(llama2.at("prompt_ids"), chat.at("prompt_ids"));
  // -c bounds the generation: finish "context" once prompt + ids fill it.
  const CliResult c = run_encore(Args{"run", "-m", model_, "--json", "-c", "20", "-n", "-1", "-p",
                                      "Once upon a time", "--seed", "5"} +
                                 kPure);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const Json cj = Json::parse(c.out);
  EXPECT_EQ(cj.at("finish_reason"), "context");
  EXPECT_EQ(cj.at("n_ctx"), 20);
  EXPECT_EQ(cj.at("prompt_ids").size() + ids(cj).size(), 21u);
  // --kv-type is part of the numerics: another system fingerprint.
  const Json f32 = run(req + Args{"-p", "The dog", "--kv-type", "f32"});
  EXPECT_NE(f32.at("system_fingerprint"), b.at("system_fingerprint"));
}

// Flags that change speed or memory only: identical ids, and each shows it
// was read (stderr's load line, or an error when it cannot work).
TEST_F(CliFlags, SpeedAndMemoryFlagsKeepTheOutput) {
  const Args req = Args{"-p", "Once upon a time", "-n", "32", "--seed", "9"} + kPure;
  std::string err;
  const Json base = run(req, &err);
  struct Same {
    Args flags;
    std::string in_stderr;  // evidence that the flag was read
  };
  std::vector<Same> same = {
      {{"-t", "1"}, "1 threads"},
      {{"-t", "3"}, "3 threads"},
      {{"-b", "1"}, "batch 1"},
      {{"-b", "7"}, "batch 7"},
      {{"--isa", "scalar"}, "scalar kernels"},
      {{"--kv-mem", "64"}, "64.0 MiB"},
      {{"--mmap"}, "mmap"},
      {{"--no-mmap"}, "read into memory"},
      {{"--logprobs", "3"}, ""},
  };
  for (const Same& s : same) {
    std::string e;
    const Json j = run(req + s.flags, &e);
    EXPECT_EQ(ids(j), ids(base)) << ::testing::PrintToString(s.flags);
    EXPECT_EQ(j.at("logprobs")[0].at("logprob"), base.at("logprobs")[0].at("logprob"))
        << ::testing::PrintToString(s.flags);
    if (!s.in_stderr.empty()) {
      EXPECT_NE(e.find(s.in_stderr), std::string::npos)
          << ::testing::PrintToString(s.flags) << ": " << e;
    }
  }
  // --logprobs N adds N alternatives per token.
  const Json lp = run(req + Args{"--logprobs", "3"});
  EXPECT_EQ(lp.at("logprobs")[0].at("top_logprobs").size(), 3u);
  EXPECT_FALSE(base.at("logprobs")[0].contains("top_logprobs"));
  // A KV budget too small for the request is refused, not ignored.
  const CliResult small =
      run_encore(Args{"run", "-m", model_, "-c", "256", "--kv-mem", "0.01"} + req);
  EXPECT_EQ(small.exit_code, 1) << small.err;
  EXPECT_NE(small.err.find("KV"), std::string::npos) << small.err;
}

// A paused generation continues with the seed it was saved with.
TEST_F(CliFlags, ResumeUsesTheSavedSeed) {
  const Args req = Args{"-p", "Once upon a time"} + kPure;
  const Json seven = run(req + Args{"--seed", "7", "-n", "30"});
  const Json eight = run(req + Args{"--seed", "8", "-n", "30"});
  ASSERT_NE(ids(seven), ids(eight));
  const std::string state = dir_.file("seven.json");
  const Json a = run(req + Args{"--seed", "7", "-n", "10", "--save-state", state});
  const Json b = run(Args{"--resume", state, "-n", "20"});
  EXPECT_EQ(b.at("seed"), 7);
  Json joined = ids(a);
  for (const Json& id : ids(b)) joined.push_back(id);
  EXPECT_EQ(joined, ids(seven)) << "pause/resume under seed 7 differs from one run under seed 7";
  EXPECT_NE(joined, ids(eight));
  // The continuation alone differs from seed 8's continuation too.
  const Json eight_ids = ids(eight);
  const Json eight_part(std::vector<Json>(eight_ids.begin() + 10, eight_ids.end()));
  EXPECT_NE(ids(b), eight_part);
}

}  // namespace
}  // namespace encore::test
