// Tokenizer tests on real vocabularies from ../shared: llama.cpp's test
// vectors (ids must match exactly), decode/encode round trips, streaming
// decode, and robustness on hostile input.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "encore/gguf.h"
#include "encore/tokenizer.h"
#include "shared_data.h"
#include "vocab_vectors.h"

namespace encore {
namespace {

using Ids = std::vector<TokenId>;

std::string ids_str(const Ids& ids) {
  std::string s;
  for (TokenId id : ids) s += " " + std::to_string(id);
  return s;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80                 ? 1
               : b >= 0xC2 && b <= 0xDF ? 2
               : b >= 0xE0 && b <= 0xEF ? 3
               : b >= 0xF0 && b <= 0xF4 ? 4
                                        : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

void append_utf8(std::string* s, uint32_t cp) {
  if (cp < 0x80) {
    *s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *s += static_cast<char>(0xC0 | (cp >> 6));
    *s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *s += static_cast<char>(0xE0 | (cp >> 12));
    *s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *s += static_cast<char>(0xF0 | (cp >> 18));
    *s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Random valid UTF-8: mostly ASCII words and whitespace, with Latin, Cyrillic,
// CJK, emoji and arbitrary scalar values mixed in.
std::string random_utf8(std::mt19937* rng) {
  std::uniform_int_distribution<int> len(0, 40);
  std::uniform_int_distribution<int> kind(0, 9);
  std::string s;
  for (int n = len(*rng); n > 0; --n) {
    uint32_t cp;
    switch (kind(*rng)) {
      case 0:
        cp = " \n\t"[std::uniform_int_distribution<int>(0, 2)(*rng)];
        break;
      case 1:
        cp = std::uniform_int_distribution<uint32_t>(0xA0, 0x24F)(*rng);
        break;
      case 2:
        cp = std::uniform_int_distribution<uint32_t>(0x400, 0x4FF)(*rng);
        break;
      case 3:
        cp = std::uniform_int_distribution<uint32_t>(0x4E00, 0x9FFF)(*rng);
        break;
      case 4:
        cp = std::uniform_int_distribution<uint32_t>(0x1F300, 0x1FAFF)(*rng);
        break;
      case 5: {
        do {
          cp = std::uniform_int_distribution<uint32_t>(1, 0x10FFFF)(*rng);
        } while (cp >= 0xD800 && cp <= 0xDFFF);
        break;
      }
      default:
        cp = std::uniform_int_distribution<uint32_t>(0x20, 0x7E)(*rng);
        break;
    }
    append_utf8(&s, cp);
  }
  return s;
}

struct VocabCase {
  const char* path;  // relative to the shared folder
};

class TokenizerData : public ::testing::TestWithParam<VocabCase> {
 protected:
  void SetUp() override {
    ENCORE_SHARED_FILE(gguf_path, GetParam().path);
    tok_ = Tokenizer::create(vocab_from_gguf(gguf::File::open(gguf_path)));
    inputs_ = read_inputs(gguf_path + ".inp");
    outputs_ = read_outputs(gguf_path + ".out");
  }
  Ids encode(std::string_view text) const { return tok_->encode(text, {}); }

  std::unique_ptr<Tokenizer> tok_;
  std::vector<std::string> inputs_;
  std::vector<Ids> outputs_;
};

TEST_P(TokenizerData, EncodeMatchesLlamaCpp) {
  ASSERT_FALSE(inputs_.empty());
  ASSERT_EQ(inputs_.size(), outputs_.size());
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const Ids got = encode(inputs_[i]);
    EXPECT_EQ(got, outputs_[i]) << "line " << i << " \"" << escaped(inputs_[i]) << "\"\n  want"
                                << ids_str(outputs_[i]) << "\n  got " << ids_str(got);
  }
}

TEST_P(TokenizerData, DecodeInvertsEncode) {
  for (const std::string& s : inputs_) {
    EXPECT_EQ(tok_->decode(encode(s), false, true), s) << "\"" << escaped(s) << "\"";
  }
  std::mt19937 rng(1234);
  for (int k = 0; k < 500; ++k) {
    const std::string s = random_utf8(&rng);
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
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int k = 0; k < 200; ++k) {
    std::string s(static_cast<size_t>(byte(rng) % 64), '\0');
    for (char& c : s) c = static_cast<char>(byte(rng));
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
    std::string shown;
    for (TokenId id : ids) shown += d.push(id);
    shown += d.finish();
    EXPECT_TRUE(valid_utf8(shown));
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
                           std::string name = info.param.path;
                           name = name.substr(name.rfind('/') + 1);
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

std::unique_ptr<Tokenizer> stories_tokenizer(const std::string& path) {
  return Tokenizer::create(vocab_from_gguf(gguf::File::open(path)));
}

// Strings where llama.cpp and SentencePiece disagree: we follow llama.cpp.
TEST(TokenizerStories260K, WhitespaceCasesFollowLlamaCpp) {
  ENCORE_SHARED_FILE(model, "models/stories260K.gguf");
  ENCORE_SHARED_FILE(diffs, "models/stories260K.tokenizer-whitespace-diffs.json");
  const auto tok = stories_tokenizer(model);
  const nlohmann::json j = nlohmann::json::parse(slurp(diffs));
  ASSERT_FALSE(j["cases"].empty());
  for (const auto& c : j["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok->encode(text, {}), c["llama_cpp"].get<Ids>()) << "\"" << escaped(text) << "\"";
  }
}

// The prompts and generated text of llama.cpp's reference generations: the
// prompt ids (with BOS) and the detokenized text (llama.cpp's pieces,
// concatenated without stripping) must match.
TEST(TokenizerStories260K, ReferencePromptsAndTextMatchLlamaCpp) {
  ENCORE_SHARED_FILE(model, "models/stories260K.gguf");
  ENCORE_SHARED_FILE(expected, "models/stories260K.expected.json");
  const auto tok = stories_tokenizer(model);
  const nlohmann::json j = nlohmann::json::parse(slurp(expected));
  ASSERT_FALSE(j["cases"].empty());
  for (const auto& c : j["cases"]) {
    Tokenizer::EncodeOptions o;
    o.add_bos = tok->vocab().add_bos;
    const std::string prompt = c["prompt"];
    EXPECT_EQ(tok->encode(prompt, o), c["prompt_ids"].get<Ids>()) << "\"" << prompt << "\"";
    const Ids ids = c["ids"].get<Ids>();
    EXPECT_EQ(tok->decode(ids), c["text"].get<std::string>()) << "\"" << prompt << "\"";
    StreamDecoder d(*tok);
    std::string streamed;
    for (TokenId id : ids) streamed += d.push(id);
    EXPECT_EQ(streamed + d.finish(), c["text"].get<std::string>());
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
