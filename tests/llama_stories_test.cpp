// The Llama forward pass on the real stories260K model: greedy generations
// reproduce the reference ids of ../shared/models/stories260K.expected.json
// (kv_cache "f32" cases, made by llama.cpp and an independent numpy
// implementation), and are identical across thread counts and prefill modes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "encore/gguf.h"
#include "encore/model.h"
#include "encore/thread_pool.h"
#include "shared_data.h"

namespace encore {
namespace {

constexpr int kNPredict = 200;

struct Greedy {
  std::vector<int> ids;            // [kNPredict] generated ids
  std::vector<float> margins;      // [kNPredict] top1 - top2 logit at each step
  std::vector<float> last_logits;  // [n_vocab] logits of the last step
};

// Argmax with ties to the lowest id; also returns top1 - top2.
int argmax(const std::vector<float>& logits, float* margin) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  float second = -INFINITY;
  for (int i = 0; i < static_cast<int>(logits.size()); ++i) {
    if (i != best && logits[i] > second) second = logits[i];
  }
  *margin = logits[best] - second;
  return best;
}

Greedy greedy(const Model& model, int n_threads, const std::vector<int32_t>& prompt,
              bool prefill_one_by_one) {
  const HParams& hp = model.hparams();
  const int n_ctx = 512;
  const KvLayout layout = kv_layout_for(hp, DType::F32);
  KvBlockPool pool(layout, kv_bytes_for_tokens(layout, n_ctx));
  ThreadPool threads(n_threads);
  ForwardContext ctx(model, pool, threads, n_ctx);
  std::vector<float> logits(static_cast<size_t>(hp.n_vocab));  // [n_vocab]
  KvSequence seq;
  if (prefill_one_by_one) {
    for (size_t i = 0; i < prompt.size(); ++i)
      ctx.eval(seq, std::span(prompt).subspan(i, 1), logits);
  } else {
    ctx.eval(seq, prompt, logits);
  }
  Greedy g;
  for (int step = 0; step < kNPredict; ++step) {
    for (float v : logits) EXPECT_TRUE(std::isfinite(v)) << "step " << step;
    float margin = 0.0f;
    const int32_t id = argmax(logits, &margin);
    g.ids.push_back(id);
    g.margins.push_back(margin);
    if (step + 1 < kNPredict) {
      const int32_t next[1] = {id};
      ctx.eval(seq, next, logits);
    }
  }
  g.last_logits = logits;
  seq.release(pool);
  return g;
}

nlohmann::json load_expected(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// Index of the first differing step, or -1.
int first_mismatch(const std::vector<int>& got, const std::vector<int>& want) {
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] != want[i]) return static_cast<int>(i);
  }
  return got.size() == want.size() ? -1 : static_cast<int>(std::min(got.size(), want.size()));
}

class StoriesTest : public ::testing::TestWithParam<const char*> {};

TEST_P(StoriesTest, GreedyIdsMatchReferenceF32KvCases) {
  const std::string model_name = GetParam();
  ENCORE_SHARED_FILE(expected_path, "models/stories260K.expected.json");
  ENCORE_SHARED_FILE(model_path, "models/" + model_name);
  const nlohmann::json expected = load_expected(expected_path);
  const gguf::File file = gguf::File::open(model_path);
  const std::unique_ptr<Model> model = Model::load(file);
  EXPECT_EQ(model->hparams().n_vocab, 512);
  EXPECT_TRUE(model->hparams().tied_output);

  int n_cases = 0;
  for (const nlohmann::json& c : expected["cases"]) {
    if (c["model"] != model_name || c["kv_cache"] != "f32") continue;
    ++n_cases;
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["ids"].get<std::vector<int>>();
    const auto want_margins = c["top1_top2_logit_margin"].get<std::vector<float>>();
    SCOPED_TRACE("prompt '" + c["prompt"].get<std::string>() + "'");

    const Greedy g1 = greedy(*model, 1, prompt, false);
    const int bad = first_mismatch(g1.ids, want);
    EXPECT_EQ(bad, -1) << "first mismatch at step " << bad << ": got " << g1.ids[bad]
                       << " (our margin " << g1.margins[bad] << "), want " << want[bad]
                       << " (reference margin " << want_margins[bad] << ")";

    // Thread count and prefill mode change nothing, down to the last bit.
    const Greedy g2 = greedy(*model, 2, prompt, false);
    EXPECT_EQ(g2.ids, g1.ids);
    EXPECT_EQ(0, std::memcmp(g2.last_logits.data(), g1.last_logits.data(),
                             g1.last_logits.size() * sizeof(float)));
    const Greedy g3 = greedy(*model, 2, prompt, true);
    EXPECT_EQ(g3.ids, g1.ids);
    EXPECT_EQ(0, std::memcmp(g3.last_logits.data(), g1.last_logits.data(),
                             g1.last_logits.size() * sizeof(float)));
  }
  EXPECT_EQ(n_cases, 4);
}

INSTANTIATE_TEST_SUITE_P(Models, StoriesTest,
                         ::testing::Values("stories260K.gguf", "stories260K-f16.gguf"),
                         [](const auto& info) {
                           return std::string(info.param).find("f16") != std::string::npos
                                      ? std::string("F16")
                                      : std::string("F32");
                         });

// The Q8_0 file (FFN padded to 192): llama.cpp quantises activations to Q8_0
// for these matmuls and Encore does not, so its reference ids are not
// required to match. Checked: it loads and decodes finite logits; how many
// reference cases match anyway is reported, not asserted.
TEST(StoriesQ8, DecodesFiniteLogitsAndReportsReferenceAgreement) {
  ENCORE_SHARED_FILE(expected_path, "models/stories260K.expected.json");
  ENCORE_SHARED_FILE(model_path, "models/stories260K-ff192-q8_0.gguf");
  const nlohmann::json expected = load_expected(expected_path);
  const gguf::File file = gguf::File::open(model_path);
  const std::unique_ptr<Model> model = Model::load(file);
  EXPECT_EQ(model->hparams().n_ff, 192);
  for (const nlohmann::json& c : expected["cases"]) {
    if (c["model"] != "stories260K-ff192-q8_0.gguf" || c["kv_cache"] != "f32") continue;
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["ids"].get<std::vector<int>>();
    const auto want_margins = c["top1_top2_logit_margin"].get<std::vector<float>>();
    const Greedy g = greedy(*model, 2, prompt, false);
    const int bad = first_mismatch(g.ids, want);
    std::string note = "Q8_0 prompt '" + c["prompt"].get<std::string>() + "': ";
    if (bad < 0) {
      note += "all 200 ids match the reference";
    } else {
      note += "first mismatch at step " + std::to_string(bad) + " (reference margin " +
              std::to_string(want_margins[bad]) + ", ours " + std::to_string(g.margins[bad]) + ")";
    }
    std::printf("%s\n", note.c_str());
    RecordProperty("q8_0_" + std::to_string(prompt.size()), note);
  }
}

}  // namespace
}  // namespace encore
