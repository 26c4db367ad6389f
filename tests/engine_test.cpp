// generate(): finish reasons, EOG handling, determinism, KV accounting, on a
// synthetic tiny model written by synth_model into a temporary folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <string_view>

#include "cli_runner.h"
#include "encore/engine.h"
#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/synth.h"
#include "encore/thread_pool.h"

namespace encore {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    ThreadPool pool(2);
    SynthOptions o;
    o.preset = "tiny";
    o.type = DType::Q8_0;
    o.seed = 11;
    synth_model(o, dir_->file("tiny.gguf"), pool);
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    file_ = std::make_unique<gguf::File>(gguf::File::open(dir_->file("tiny.gguf")));
    model_ = Model::load(*file_);
    tokenizer_ = Tokenizer::create(vocab_from_gguf(*file_));
  }

  // A context of n_ctx positions over a pool of exactly `kv_tokens` tokens.
  std::unique_ptr<ForwardContext> context(int n_ctx, int kv_tokens) {
    const KvLayout layout = kv_layout_for(model_->hparams(), DType::F32);
    kv_ = std::make_unique<KvBlockPool>(layout, kv_bytes_for_tokens(layout, kv_tokens));
    return std::make_unique<ForwardContext>(*model_, *kv_, threads_, n_ctx);
  }

  static test::TempDir* dir_;
  ThreadPool threads_{2};
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<KvBlockPool> kv_;
};
test::TempDir* EngineTest::dir_ = nullptr;

const std::vector<TokenId> kPrompt = {1, 300, 301, 302};

TEST_F(EngineTest, LengthStopsAtNPredictAndReturnsBlocks) {
  auto ctx = context(128, 128);
  const int32_t free_before = kv_->n_free();
  GenerateParams p;
  p.n_predict = 9;
  p.sampling.temp = 0.0f;
  std::vector<TokenId> streamed_ids;
  std::string streamed_text;
  const GenerateResult r =
      generate(*ctx, *tokenizer_, kPrompt, p, [&](int sample, TokenId id, std::string_view text) {
        EXPECT_EQ(sample, 0);
        streamed_ids.push_back(id);
        streamed_text += text;
      });
  ASSERT_EQ(r.samples.size(), 1u);
  const SampleResult& s = r.samples[0];
  EXPECT_EQ(s.finish, FinishReason::Length);
  EXPECT_EQ(s.ids.size(), 9u);
  // The streamed text is the result's text, and every id it came with is one
  // of the generated ids, in generation order (ids whose piece is still
  // incomplete UTF-8 stream nothing).
  EXPECT_EQ(streamed_text, s.text);
  size_t at = 0;
  for (TokenId id : streamed_ids) {
    while (at < s.ids.size() && s.ids[at] != id) ++at;
    EXPECT_LT(at, s.ids.size()) << "streamed id " << id << " is not a generated id in order";
  }
  EXPECT_EQ(kv_->n_free(), free_before);  // the sequence's blocks went back
}

TEST_F(EngineTest, ContextFullStops) {
  auto ctx = context(20, 20);
  GenerateParams p;
  p.sampling.temp = 0.0f;
  const GenerateResult r = generate(*ctx, *tokenizer_, kPrompt, p, nullptr);
  EXPECT_EQ(r.samples[0].finish, FinishReason::Context);
  EXPECT_EQ(kPrompt.size() + r.samples[0].ids.size(),
            21u);  // 20 positions in the KV + the last pick
}

TEST_F(EngineTest, EogStopsAndIsNotEmitted) {
  // Some seed among the first 200 samples EOS within 300 tokens on this
  // random model (p(EOS) is about 1/512 per step); the search itself is
  // deterministic.
  auto ctx = context(512, 512);
  bool found = false;
  for (uint64_t seed = 0; seed < 200 && !found; ++seed) {
    GenerateParams p;
    p.n_predict = 300;
    p.sampling.temp = 1.5f;
    p.sampling.top_k = 0;  // the whole distribution: no truncation cuts EOS away
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.seed = seed;
    const GenerateResult r = generate(*ctx, *tokenizer_, kPrompt, p, nullptr);
    if (r.samples[0].finish != FinishReason::Eog) continue;
    found = true;
    for (TokenId id : r.samples[0].ids) EXPECT_FALSE(tokenizer_->is_eog(id));
  }
  EXPECT_TRUE(found) << "no seed reached EOS; the synthetic model's logits may be degenerate";
}

TEST_F(EngineTest, SameSeedSameIdsDifferentSeedDifferentIds) {
  auto ctx = context(128, 128);
  GenerateParams p;
  p.n_predict = 24;
  p.sampling.temp = 1.0f;
  p.seed = 77;
  const auto a = generate(*ctx, *tokenizer_, kPrompt, p, nullptr).samples[0].ids;
  const auto b = generate(*ctx, *tokenizer_, kPrompt, p, nullptr).samples[0].ids;
  p.seed = 78;
  const auto c = generate(*ctx, *tokenizer_, kPrompt, p, nullptr).samples[0].ids;
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST_F(EngineTest, KvTooSmallFailsBeforeTheFirstToken) {
  auto ctx = context(256, 32);
  GenerateParams p;
  p.sampling.temp = 0.0f;
  int calls = 0;
  try {
    generate(*ctx, *tokenizer_, kPrompt, p, [&](int, TokenId, std::string_view) { ++calls; });
    FAIL() << "expected ResourceExhausted";
  } catch (const ResourceExhausted& e) {
    EXPECT_NE(std::string(e.what()).find("room for 32 tokens"), std::string::npos) << e.what();
  }
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(kv_->n_free(), 2);  // nothing was taken
  // A bounded request that fits is fine.
  p.n_predict = 8;
  EXPECT_EQ(generate(*ctx, *tokenizer_, kPrompt, p, nullptr).samples[0].ids.size(), 8u);
}

TEST_F(EngineTest, PromptLongerThanContextIsInvalid) {
  auto ctx = context(3, 16);
  GenerateParams p;
  EXPECT_THROW(generate(*ctx, *tokenizer_, kPrompt, p, nullptr), InvalidArgument);
  EXPECT_THROW(generate(*ctx, *tokenizer_, {}, p, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace encore
