// The reproducibility contract through the `encore run` binary: every run
// is a new process, so these checks cover restarts. On stories260K: the same
// request gives the same JSON (ids, logprob bits, text, output_hash,
// fingerprints) whatever -t, --isa and -b; --n 8 extends --n 3; a generation
// saved with --save-state and continued in another process with --resume
// equals the uninterrupted one; broken or mismatched state files and
// request flags given with --resume are refused with a clear error; and the
// seed a seedless run reports reproduces it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "shared_data.h"

namespace encore::test {
namespace {

using Json = nlohmann::json;

constexpr int kN = 40;

// Sampler settings of a request (everything but the model and -n).
const Args kCombo = {"-p",
                     "Once upon a time",
                     "--seed",
                     "4242",
                     "--temp",
                     "0.8",
                     "--top-k",
                     "30",
                     "--top-p",
                     "0.92",
                     "--min-p",
                     "0.03",
                     "--repeat-penalty",
                     "1.15",
                     "--repeat-last-n",
                     "24",
                     "--presence-penalty",
                     "0.2",
                     "--frequency-penalty",
                     "0.1",
                     "--logit-bias",
                     "300+1.5",
                     "--logit-bias",
                     "17-inf",
                     "--logprobs",
                     "3"};
const Args kComboTypical = {"-p",
                            "The little dog",
                            "--seed",
                            "7",
                            "--temp",
                            "1.0",
                            "--top-k",
                            "0",
                            "--top-p",
                            "1",
                            "--min-p",
                            "0",
                            "--typical",
                            "0.9",
                            "--samplers",
                            "penalties;typ_p;temperature",
                            "--repeat-penalty",
                            "1.1",
                            "--stop",
                            "\n\n",
                            "--logprobs",
                            "2"};

// Runs `encore run` with --json; fails the test unless it succeeds.
Json run_json(const Args& args, std::string* err = nullptr) {
  const CliResult r = run_encore(Args{"run", "--json", "-c", "256"} + args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (err) *err = r.err;
  if (r.exit_code != 0) return Json();
  try {
    return Json::parse(r.out);
  } catch (const Json::exception& e) {
    ADD_FAILURE() << "stdout is not JSON: " << e.what() << "\n" << r.out;
    return Json();
  }
}

// Runs `encore run` and expects a clean refusal: exit code 1 (not a crash,
// not an "unexpected" error) and an error line on stderr.
CliResult run_refused(const Args& args) {
  const CliResult r = run_encore(Args{"run"} + args);
  EXPECT_NE(r.exit_code, 0) << "accepted: " << r.out;
  EXPECT_GT(r.exit_code, 0) << "did not exit normally (crash?)\n" << r.err;
  EXPECT_NE(r.exit_code, 2) << "an unexpected exception instead of a clear error:\n" << r.err;
  EXPECT_TRUE(r.out.empty() || r.out.find('{') == std::string::npos)
      << "printed a result: " << r.out;
  return r;
}

// Every field of one output that the contract covers.
void expect_same_choice(const Json& a, const Json& b, const std::string& what) {
  for (const char* key : {"ids", "text", "logprobs", "finish_reason", "output_hash"}) {
    EXPECT_EQ(a.at(key), b.at(key)) << what << ": field " << key;
  }
}

class CliRepro : public ::testing::Test {
 protected:
  void SetUp() override {
    ENCORE_SHARED_FILE(path, "models/stories260K.gguf");
    model_ = path;
  }
  Args m() const { return {"-m", model_}; }
  std::string model_;
  TempDir dir_;
};

TEST_F(CliRepro, RestartsThreadsIsaAndBatchSizeGiveIdenticalJson) {
  for (const Args& combo : {kCombo, kComboTypical}) {
    const Args base = m() + combo + Args{"-n", std::to_string(kN)};
    const CliResult a = run_encore(Args{"run", "--json", "-c", "256"} + base);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    const Json ja = Json::parse(a.out);
    ASSERT_FALSE(ja.at("ids").empty());
    ASSERT_EQ(ja.at("logprobs").size(), ja.at("ids").size());
    ASSERT_FALSE(ja.at("logprobs")[0].at("top_logprobs").empty());
    EXPECT_TRUE(ja.at("system_fingerprint").get<std::string>().rfind("fp_", 0) == 0);
    // The whole stdout is the same bytes: it has no timing in it.
    for (const Args& extra : {Args{}, Args{"-t", "1", "--isa", "scalar", "-b", "1"},
                              Args{"-t", "3", "-b", "7", "--mmap"}, Args{"-t", "2", "-b", "64"}}) {
      const CliResult b = run_encore(Args{"run", "--json", "-c", "256"} + base + extra);
      ASSERT_EQ(b.exit_code, 0) << b.err;
      EXPECT_EQ(b.out, a.out) << "with extra flags " << ::testing::PrintToString(extra);
      const Json jb = Json::parse(b.out);
      expect_same_choice(ja, jb, "restart");
      EXPECT_EQ(ja.at("system_fingerprint"), jb.at("system_fingerprint"));
      EXPECT_EQ(ja.at("model_fingerprint"), jb.at("model_fingerprint"));
    }
  }
}

TEST_F(CliRepro, ChoicesOfNEightEqualThoseOfNThree) {
  for (const Args& combo : {kCombo, kComboTypical}) {
    const Args base = m() + combo + Args{"-n", "24"};
    const Json three = run_json(base + Args{"--n", "3"});
    const Json eight = run_json(base + Args{"--n", "8", "-t", "1"});
    const Json one = run_json(base);
    ASSERT_EQ(three.at("choices").size(), 3u);
    ASSERT_EQ(eight.at("choices").size(), 8u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(eight["choices"][i].at("index"), i);
      expect_same_choice(three["choices"][i], eight["choices"][i],
                         "choice " + std::to_string(i) + " of --n 3 vs --n 8");
    }
    expect_same_choice(one, three["choices"][0], "--n 1 vs choice 0 of --n 3");
    EXPECT_EQ(three.at("system_fingerprint"), eight.at("system_fingerprint"));
  }
}

// -n k --save-state F, then --resume F -n (N - k) in a new process, equals -n N.
void check_resume(const Args& base_args, const std::string& model, const TempDir& dir, int k,
                  int n_samples) {
  const std::string what = "pause after " + std::to_string(k) + ", n " + std::to_string(n_samples);
  const Args base = Args{"-m", model} + base_args +
                    (n_samples > 1 ? Args{"--n", std::to_string(n_samples)} : Args{});
  const Json full = run_json(base + Args{"-n", std::to_string(kN)});
  const std::string state = dir.file("state-" + std::to_string(k) + ".json");
  const Json a = run_json(base + Args{"-n", std::to_string(k), "--save-state", state});
  ASSERT_TRUE(std::filesystem::exists(state)) << what;
  // The continuation on another schedule: 1 thread, scalar kernels, chunk 5.
  const Json b = run_json(Args{"-m", model, "--resume", state, "-n", std::to_string(kN - k), "-t",
                               "1", "--isa", "scalar", "-b", "5"});
  if (full.is_null() || a.is_null() || b.is_null()) return;
  for (const char* key : {"seed", "system_fingerprint", "prompt_ids"}) {
    EXPECT_EQ(b.at(key), full.at(key)) << what << ": " << key;
  }
  EXPECT_EQ(b.at("resumed_from"), state) << what;
  auto choices = [&](const Json& j) { return n_samples > 1 ? j.at("choices") : Json::array({j}); };
  const Json fc = choices(full), ac = choices(a), bc = choices(b);
  ASSERT_EQ(fc.size(), static_cast<size_t>(n_samples));
  ASSERT_EQ(bc.size(), static_cast<size_t>(n_samples));
  for (int i = 0; i < n_samples; ++i) {
    const std::string w = what + ", sample " + std::to_string(i);
    Json ids = ac[i].at("ids"), lps = ac[i].at("logprobs");
    for (const Json& id : bc[i].at("ids")) ids.push_back(id);
    for (const Json& lp : bc[i].at("logprobs")) lps.push_back(lp);
    EXPECT_EQ(ids, fc[i].at("ids")) << w;
    EXPECT_EQ(lps, fc[i].at("logprobs")) << w << " (logprobs, top alternatives included)";
    EXPECT_EQ(ac[i].at("text").get<std::string>() + bc[i].at("text").get<std::string>(),
              fc[i].at("text").get<std::string>())
        << w;
    EXPECT_EQ(bc[i].at("finish_reason"), fc[i].at("finish_reason")) << w;
  }
}

TEST_F(CliRepro, ResumeInAnotherProcessEqualsUninterrupted) {
  for (int k : {0, 1, 13, kN - 1, kN}) check_resume(kCombo, model_, dir_, k, 1);
  for (int k : {0, 7, kN - 1}) check_resume(kCombo, model_, dir_, k, 2);
  for (int k : {1, 20}) check_resume(kComboTypical, model_, dir_, k, 3);
}

TEST_F(CliRepro, ResumeRefusesRequestFlags) {
  const std::string state = dir_.file("s.json");
  run_json(m() + kCombo + Args{"-n", "4", "--save-state", state});
  for (const Args& extra :
       {Args{"--top-k", "5"}, Args{"-p", "hello"}, Args{"--seed", "1"}, Args{"--temp", "0.5"},
        Args{"--n", "2"}, Args{"--stop", "x"}, Args{"--top-p", "0.5"},
        Args{"--repeat-penalty", "1.3"}, Args{"--logit-bias", "5+1"}, Args{"--samplers", "top_k"},
        Args{"--chat"}}) {
    const CliResult r = run_refused(m() + Args{"--resume", state, "-n", "3"} + extra);
    EXPECT_NE(r.err.find("--resume"), std::string::npos)
        << ::testing::PrintToString(extra) << ": " << r.err;
    EXPECT_NE(r.err.find(extra[0]), std::string::npos)
        << "the error should name " << extra[0] << ": " << r.err;
  }
  // Numerics and speed flags are fine with --resume.
  run_json(m() + Args{"--resume", state, "-n", "3", "-t", "1", "-b", "3", "--isa", "scalar"});
}

TEST_F(CliRepro, BrokenStateFilesGiveClearErrors) {
  const std::string good = dir_.file("good.json");
  run_json(m() + kCombo + Args{"-n", "6", "--save-state", good, "--n", "2"});
  const std::string text = read_file(good);
  ASSERT_FALSE(text.empty());
  const Json j = Json::parse(text);

  struct Case {
    std::string name;
    std::string content;
    std::string expect;  // in stderr
  };
  std::vector<Case> cases;
  cases.push_back({"empty", "", "not valid JSON"});
  cases.push_back({"truncated", text.substr(0, text.size() / 2), "not valid JSON"});
  cases.push_back({"truncated to 1 byte", text.substr(0, 1), "not valid JSON"});
  cases.push_back({"binary", std::string("\x00\xff\x13garbage", 10), "not valid JSON"});
  cases.push_back({"not a state", "{\"hello\": 1}", "not an encore run state"});
  auto mutate = [&](const std::string& name, const std::function<void(Json&)>& f,
                    const std::string& expect) {
    Json c = j;
    f(c);
    cases.push_back({name, c.dump(1), expect});
  };
  mutate(
      "version", [](Json& c) { c["version"] = 99; }, "version");
  mutate(
      "no seed", [](Json& c) { c.erase("seed"); }, "seed");
  mutate(
      "ids not an array", [](Json& c) { c["samples"][0]["ids"] = "abc"; }, "ids");
  mutate(
      "id outside the vocabulary", [](Json& c) { c["samples"][1]["ids"][2] = 1 << 20; }, "outside");
  mutate(
      "negative id", [](Json& c) { c["samples"][0]["ids"][0] = -5; }, "outside");
  mutate(
      "prompt id outside the vocabulary", [](Json& c) { c["prompt_ids"][1] = 99999; }, "outside");
  mutate(
      "empty prompt", [](Json& c) { c["prompt_ids"] = Json::array(); }, "prompt");
  mutate(
      "counter does not match the ids", [](Json& c) { c["samples"][0]["t"] = 3; }, "RNG counter");
  mutate(
      "huge counter", [](Json& c) { c["samples"][0]["t"] = ~0ull; }, "RNG counter");
  mutate(
      "held_shown past the held text", [](Json& c) { c["samples"][0]["held_shown"] = 7; }, "held");
  mutate(
      "odd hex", [](Json& c) { c["samples"][1]["held_text_hex"] = "abc"; }, "hex");
  mutate(
      "not hex", [](Json& c) { c["samples"][1]["decoder_pending_hex"] = "zz"; }, "hex");
  mutate(
      "decoder bytes too long",
      [](Json& c) { c["samples"][1]["decoder_pending_hex"] = "e282e282"; }, "decoder bytes");
  mutate(
      "decoder bytes that do not follow from the ids",
      [](Json& c) { c["samples"][1]["decoder_pending_hex"] = "e2"; }, "decoder bytes");
  mutate(
      "held text without stop strings", [](Json& c) { c["samples"][1]["held_text_hex"] = "4141"; },
      "held text");
  mutate(
      "finished at length", [](Json& c) { c["samples"][0]["finished"] = "length"; }, "length");
  mutate(
      "huge n_ctx", [](Json& c) { c["n_ctx"] = 2147483647; }, "n_ctx");
  mutate(
      "n_ctx wrapping past 32 bits", [](Json& c) { c["n_ctx"] = 4294967297ull; }, "n_ctx");
  mutate(
      "float top_k", [](Json& c) { c["request"]["sampling"]["top_k"] = 1e300; }, "top_k");
  mutate(
      "huge temperature", [](Json& c) { c["request"]["sampling"]["temp"] = 1e300; }, "temp");
  mutate(
      "logit bias id wrapping past 32 bits",
      [](Json& c) { c["request"]["sampling"]["logit_bias"][0][0] = 4294967301ull; }, "logit_bias");
  mutate(
      "window longer than repeat_last_n",
      [](Json& c) {
        Json r = Json::array();
        for (int i = 0; i < 100; ++i) r.push_back(5);
        c["samples"][0]["recent"] = r;
      },
      "penalty window");
  mutate(
      "fewer samples than n", [](Json& c) { c["samples"].erase(1); }, "samples");
  mutate(
      "n = 0",
      [](Json& c) {
        c["request"]["n"] = 0;
        c["samples"] = Json::array();
      },
      "n");
  mutate(
      "unknown finish reason", [](Json& c) { c["samples"][0]["finished"] = "bored"; },
      "finish reason");
  mutate(
      "negative temperature", [](Json& c) { c["request"]["sampling"]["temp"] = -1; },
      "temperature");
  mutate(
      "unknown sampler stage", [](Json& c) { c["request"]["sampling"]["samplers"] = "nope"; },
      "nope");
  mutate(
      "logit bias outside the vocabulary",
      [](Json& c) { c["request"]["sampling"]["logit_bias"][0][0] = 1 << 24; }, "logit bias");
  mutate(
      "logprobs too many", [](Json& c) { c["request"]["logprobs"] = 500; }, "logprobs");
  mutate(
      "more generated than the context holds",
      [](Json& c) {
        Json ids = Json::array();
        for (int i = 0; i < 600; ++i) ids.push_back(5);  // stories260K: 512 positions
        c["samples"][0]["ids"] = ids;
        c["samples"][0]["t"] = 600;
      },
      "context");

  for (const Case& c : cases) {
    const std::string path = dir_.file("broken.json");
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << c.content;
    }
    const CliResult r = run_refused(m() + Args{"--resume", path, "-n", "4", "--json"});
    EXPECT_EQ(r.exit_code, 1) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find("error: "), std::string::npos) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos)
        << c.name << ": expected '" << c.expect << "' in: " << r.err;
  }
  // A missing file.
  const CliResult r = run_refused(m() + Args{"--resume", dir_.file("missing.json"), "-n", "4"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  // The good file still resumes.
  run_json(m() + Args{"--resume", good, "-n", "4"});
}

TEST_F(CliRepro, StateFromAnotherKvTypeIsRefused) {
  const std::string state = dir_.file("f32.json");
  const Json a =
      run_json(m() + kCombo + Args{"-n", "5", "--kv-type", "f32", "--save-state", state});
  const CliResult r =
      run_refused(m() + Args{"--resume", state, "-n", "5", "--kv-type", "f16", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("system fingerprint"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(a.value("system_fingerprint", std::string("?"))), std::string::npos)
      << "the error should name the saved fingerprint: " << r.err;
  // The default is f16: refused as well.
  const CliResult d = run_refused(m() + Args{"--resume", state, "-n", "5"});
  EXPECT_NE(d.err.find("system fingerprint"), std::string::npos) << d.err;
  // Under the same numerics it continues, with the same fingerprint.
  const Json b = run_json(m() + Args{"--resume", state, "-n", "5", "--kv-type", "f32"});
  EXPECT_EQ(b.at("system_fingerprint"), a.at("system_fingerprint"));
}

TEST_F(CliRepro, ReportedSeedReproducesASeedlessRun) {
  const Args req =
      m() + Args{"-p", "Once upon a time", "--temp", "1.0", "--top-k", "0",          "--top-p",
                 "1",  "--min-p",          "0",      "-n",  "32",      "--logprobs", "2"};
  std::string err;
  const Json a = run_json(req, &err);
  const Json b = run_json(req);
  ASSERT_TRUE(a.contains("seed") && a["seed"].is_number_unsigned()) << a.dump();
  const uint64_t seed = a["seed"].get<uint64_t>();
  EXPECT_NE(err.find("seed " + std::to_string(seed)), std::string::npos)
      << "stderr should report the seed: " << err;
  EXPECT_NE(a["seed"], b["seed"]) << "two seedless runs drew the same seed";
  const Json again = run_json(req + Args{"--seed", std::to_string(seed)});
  expect_same_choice(a, again, "seedless run vs --seed " + std::to_string(seed));
  EXPECT_EQ(again.at("seed"), a.at("seed"));
  EXPECT_EQ(again.at("system_fingerprint"), a.at("system_fingerprint"));
}

}  // namespace
}  // namespace encore::test

namespace encore::test {
namespace {

TEST(CliReproFlags, LogitBiasSyntaxIsStrict) {
  ENCORE_SHARED_FILE(model, "models/stories260K.gguf");
  for (const char* bad : {"5+", "+5", "5--1", "5+-1", "5+ 1", "5+0x10", "99999999999+1", "5-1e40",
                          "5+inf", "5*2", "a+1"}) {
    const CliResult r = run_refused({"-m", model, "-n", "1", "--logit-bias", bad});
    EXPECT_NE(r.err.find("--logit-bias"), std::string::npos) << bad << ": " << r.err;
  }
  for (const char* good : {"5+1", "5-0.5", "5-inf", "5+1.5e2"}) {
    run_json({"-m", model, "-n", "1", "--logit-bias", good});
  }
}

TEST(CliReproFlags, JsonAfterAPlainSaveStillReportsLogprobs) {
  ENCORE_SHARED_FILE(model, "models/stories260K.gguf");
  TempDir tmp;
  const std::string state = tmp.file("plain.json");
  const CliResult saved = run_encore({"run", "-m", model, "-c", "256", "-p", "Tom", "--seed", "3",
                                      "-n", "4", "--save-state", state});
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  const Json resumed = run_json({"-m", model, "--resume", state, "-n", "4", "--logprobs", "2"});
  ASSERT_EQ(resumed["ids"].size(), 4u);
  ASSERT_EQ(resumed["logprobs"].size(), 4u);
  EXPECT_EQ(resumed["logprobs"][0]["top_logprobs"].size(), 2u);
  const Json whole =
      run_json({"-m", model, "-p", "Tom", "--seed", "3", "-n", "8", "--logprobs", "2"});
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(whole["logprobs"][4 + i], resumed["logprobs"][i]) << "position " << 4 + i;
  }
}

}  // namespace
}  // namespace encore::test
