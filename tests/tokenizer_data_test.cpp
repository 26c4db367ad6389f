// Tokenizer tests on real vocabularies from ../shared: llama.cpp's test
// vectors (ids must match exactly), decode/encode round trips, streaming
// decode, and robustness on hostile input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "encore/gguf.h"
#include "encore/tokenizer.h"
#include "shared_data.h"
#include "vocab_data_fixture.h"
#include "vocab_vectors.h"

namespace encore {
namespace {

using test::Ids;
using test::valid_utf8;

// What the random texts of DecodeInvertsEncode are made of, each kind
// equally likely: mostly ASCII words and whitespace, with Latin, Cyrillic,
// CJK, emoji and arbitrary scalar values mixed in.
const std::vector<test::CodePointDraw> kRandomText = {test::one_of(" \n\t"),
                                                      test::code_points(0xA0, 0x24F),
                                                      test::code_points(0x400, 0x4FF),
                                                      test::code_points(0x4E00, 0x9FFF),
                                                      test::code_points(0x1F300, 0x1FAFF),
                                                      test::any_scalar(),
                                                      test::printable_ascii(),
                                                      test::printable_ascii(),
                                                      test::printable_ascii(),
                                                      test::printable_ascii()};

struct VocabCase {
  const char* path;  // relative to the shared folder
  std::string file() const { return path; }
};

using TokenizerData = test::VocabVectorsTest<VocabCase>;

TEST_P(TokenizerData, EncodeMatchesLlamaCpp) {
  ASSERT_FALSE(inputs_.empty());
  expect_vectors_match();
}

TEST_P(TokenizerData, DecodeInvertsEncode) {
  for (const std::string& s : inputs_) {
    EXPECT_EQ(tok_->decode(encode(s), false, true), s) << "\"" << escaped(s) << "\"";
  }
  std::mt19937 rng(1234);
  for (int k = 0; k < 500; ++k) {
    const std::string s = test::random_utf8(&rng, 40, kRandomText);
    EXPECT_EQ(tok_->decode(encode(s), false, true), s) << "\"" << escaped(s) << "\"";
  }
}

TEST_P(TokenizerData, StreamingEmitsOnlyCompleteUtf8) {
  std::vector<std::string> texts = inputs_;
  texts.push_back("Llamas 🦙🦙 and 世界 and 𝄞 in a ｆｕｌｌ-width 💩 world ✅");
  bool saw_split = false;
  for (const std::string& s : texts) {
    Tokenizer::EncodeOptions o;
    o.add_bos = true;
    const Ids ids = tok_->encode(s, o);
    StreamDecoder d(*tok_, true);
    std::string all;
    for (TokenId id : ids) {
      const std::string chunk = d.push(id);
      EXPECT_TRUE(valid_utf8(chunk)) << "\"" << escaped(chunk) << "\" in \"" << escaped(s) << "\"";
      if (tok_->vocab().types[static_cast<size_t>(id)] == TokenType::Byte && chunk.empty()) {
        saw_split = true;
      }
      all += chunk;
    }
    all += d.finish();
    EXPECT_EQ(all, tok_->decode(ids, false, true));
    EXPECT_EQ(all, s);
  }
  EXPECT_TRUE(saw_split) << "no multi-byte character was split into byte tokens";
}

TEST_P(TokenizerData, SurvivesHostileInput) {
  for (const std::string& s : test::hostile_bytes(200, 64)) {
    const Ids ids = encode(s);
    for (TokenId id : ids) ASSERT_TRUE(id >= 0 && id < tok_->n_vocab());
    // Byte fallback spells every byte, so even invalid UTF-8 round-trips,
    // except that (as in llama.cpp) a stray lead byte groups the next bytes
    // into its symbol, which may swallow a space already turned into U+2581.
    std::string no_spaces = s;
    for (char& c : no_spaces) c = c == ' ' ? '_' : c;
    EXPECT_EQ(tok_->decode(encode(no_spaces), false, true), no_spaces)
        << "\"" << escaped(no_spaces) << "\"";
    StreamDecoder d(*tok_, true);
    EXPECT_TRUE(valid_utf8(test::stream_all(&d, ids)));
  }
  for (const std::string& unit : {std::string("a"), std::string(" "), std::string("\xE4\xB8\x96"),
                                  std::string(1, '\0'), std::string("\xFF")}) {
    std::string big;
    while (big.size() < (1u << 20)) big += unit;
    const Ids ids = encode(big);
    EXPECT_EQ(tok_->decode(ids, false, true), big) << "1 MiB of \"" << escaped(unit) << "\"";
  }
}

INSTANTIATE_TEST_SUITE_P(Spm, TokenizerData,
                         ::testing::Values(VocabCase{"models/stories260K.gguf"},
                                           VocabCase{"testdata/vocab/ggml-vocab-llama-spm.gguf"},
                                           VocabCase{"testdata/vocab/ggml-vocab-phi-3.gguf"}),
                         [](const ::testing::TestParamInfo<VocabCase>& info) {
                           const std::string path = info.param.path;
                           return test::param_name(path.substr(path.rfind('/') + 1));
                         });

// The stories260K tokenizer, checked against llama.cpp's JSON files beside
// the model.
class TokenizerStories260K : public ::testing::Test {
 protected:
  void SetUp() override {
    ENCORE_SHARED_FILE(model, "models/stories260K.gguf");
    tok_ = Tokenizer::create(vocab_from_gguf(gguf::File::open(model)));
  }
  // Reads the "cases" of the JSON file `rel` of the shared folder into
  // cases_; fails (or skips) the test when the file is missing or has none.
  void load_cases(const std::string& rel) {
    ENCORE_SHARED_FILE(path, rel);
    cases_ = nlohmann::json::parse(slurp(path))["cases"];
    ASSERT_FALSE(cases_.empty());
  }

  std::unique_ptr<Tokenizer> tok_;
  nlohmann::json cases_;
};

// Strings where llama.cpp and SentencePiece disagree: we follow llama.cpp.
TEST_F(TokenizerStories260K, WhitespaceCasesFollowLlamaCpp) {
  load_cases("models/stories260K.tokenizer-whitespace-diffs.json");
  for (const auto& c : cases_) {
    const std::string text = c["text"];
    EXPECT_EQ(tok_->encode(text, {}), c["llama_cpp"].get<Ids>()) << "\"" << escaped(text) << "\"";
  }
}

// The prompts and generated text of llama.cpp's reference generations: the
// prompt ids (with BOS) and the detokenized text (llama.cpp's pieces,
// concatenated without stripping) must match.
TEST_F(TokenizerStories260K, ReferencePromptsAndTextMatchLlamaCpp) {
  load_cases("models/stories260K.expected.json");
  for (const auto& c : cases_) {
    Tokenizer::EncodeOptions o;
    o.add_bos = tok_->vocab().add_bos;
    const std::string prompt = c["prompt"];
    EXPECT_EQ(tok_->encode(prompt, o), c["prompt_ids"].get<Ids>()) << "\"" << prompt << "\"";
    const Ids ids = c["ids"].get<Ids>();
    EXPECT_EQ(tok_->decode(ids), c["text"].get<std::string>()) << "\"" << prompt << "\"";
    StreamDecoder d(*tok_);
    EXPECT_EQ(test::stream_all(&d, ids), c["text"].get<std::string>());
  }
}

TEST(TokenizerPhi3, ChatPromptSplitsOnSpecialTokens) {
  ENCORE_SHARED_FILE(path, "testdata/vocab/ggml-vocab-phi-3.gguf");
  const auto tok = Tokenizer::create(vocab_from_gguf(gguf::File::open(path)));
  EXPECT_TRUE(tok->is_eog(tok->vocab().eos));
  EXPECT_TRUE(tok->is_eog(tok->find_token("<|end|>")));
  EXPECT_FALSE(tok->is_eog(tok->find_token("<|user|>")));
  Tokenizer::EncodeOptions o;
  o.add_bos = true;
  o.parse_special = true;
  const Ids ids = tok->encode("<|user|>\nHi<|end|>\n<|assistant|>\n", o);
  // llama.cpp strips the whitespace after Phi-3 special tokens and adds the
  // dummy prefix to text that follows one.
  const TokenId user = tok->find_token("<|user|>");
  const TokenId end = tok->find_token("<|end|>");
  const TokenId assistant = tok->find_token("<|assistant|>");
  const TokenId hi = tok->find_token("\xE2\x96\x81Hi");
  ASSERT_GE(hi, 0);
  EXPECT_EQ(ids, (Ids{1, user, hi, end, assistant}));
  EXPECT_EQ(tok->decode(ids, true), "<s><|user|> Hi<|end|><|assistant|>");
}

}  // namespace
}  // namespace encore
