// Byte-level BPE and WordPiece tokenizers on the real vocabularies in
// ../shared/testdata/vocab: llama.cpp's test vectors (ids made by the
// models' Hugging Face tokenizers; they must match exactly), round trips,
// streaming decode, hostile input, EOG detection, special-token parsing and
// the Hugging Face behaviours llama.cpp does not have (NFC, Falcon's digit
// split on byte-level symbols).
#include <gtest/gtest.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "encore/gguf.h"
#include "encore/tokenizer.h"
#include "shared_data.h"
#include "tokenizer/internal.h"
#include "vocab_data_fixture.h"
#include "vocab_vectors.h"

namespace encore {
namespace {

using test::Ids;
using test::ids_str;
using test::valid_utf8;

// What the random texts of DecodeInvertsEncode are made of, each kind
// equally likely: ASCII words and punctuation, runs of spaces, tabs and
// newlines, Latin-1, Cyrillic, combining marks, CJK, Hangul, emoji, any
// scalar value and digits.
const std::vector<test::CodePointDraw> kRandomText = {test::one_of(" \n\t\r"),
                                                      test::always(' '),
                                                      test::code_points(0xA0, 0xFF),
                                                      test::code_points(0x400, 0x4FF),
                                                      test::code_points(0x300, 0x36F),
                                                      test::code_points(0x4E00, 0x9FFF),
                                                      test::code_points(0xAC00, 0xD7A3),
                                                      test::code_points(0x1F300, 0x1FAFF),
                                                      test::any_scalar(),
                                                      test::code_points('0', '9'),
                                                      test::printable_ascii(),
                                                      test::printable_ascii()};

std::string nfc(std::string_view s) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  n->normalizeUTF8(0, icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), sink, nullptr,
                   status);
  EXPECT_TRUE(U_SUCCESS(status));
  return out;
}

std::string vocab_path(const char* name) {
  return std::string("testdata/vocab/ggml-vocab-") + name + ".gguf";
}

struct VocabCase {
  const char* name;                  // ggml-vocab-NAME.gguf
  bool nfc;                          // the model normalises to NFC before splitting
  std::vector<const char*> eog;      // texts of tokens that must end generation
  std::vector<const char*> not_eog;  // texts of special tokens that must not
  std::string file() const { return vocab_path(name); }
};

class VocabData : public test::VocabVectorsTest<VocabCase> {
 protected:
  bool wordpiece() const { return tok_->vocab().model == "bert"; }
  // What decode(encode(s)) must give back: s after the vocabulary's
  // normaliser (for valid UTF-8), with each byte that stays a token of its
  // own rendered as that token. That is the byte itself, except that a byte
  // the vocabulary has no token for is dropped (as Hugging Face does), and
  // that DeepSeek spells the bytes UTF-8 never uses (C0, C1, F5..FF) with
  // user-defined tokens, which render as their text (F7 -> "÷"), as in
  // llama.cpp, so that the text "÷" round-trips.
  std::string round_trip(std::string_view s) const {
    std::string piece[256];
    for (int b = 0; b < 256; ++b) {
      const std::string one(1, static_cast<char>(b));
      const TokenId id = tok_->find_token(tokenizer_detail::bytes_to_symbols(one));
      if (id >= 0) piece[b] = tok_->token_to_piece(id);
    }
    const std::string n = GetParam().nfc ? nfc(s) : std::string(s);
    std::string out;
    for (char c : n) out += piece[static_cast<uint8_t>(c)];
    return out;
  }
};

TEST_P(VocabData, EncodeMatchesHuggingFaceVectors) {
  ASSERT_EQ(inputs_.size(), 46u);
  expect_vectors_match();
}

// Byte-level BPE: decode(encode(s)) == s (after NFC where the model
// normalises). WordPiece lowercases, strips accents and drops the spacing,
// so there the property is that the decoded text (the normalised words,
// single spaces between) encodes to the same ids, unless a word was [UNK].
TEST_P(VocabData, DecodeInvertsEncode) {
  std::vector<std::string> texts = inputs_;
  std::mt19937 rng(1234);
  for (int k = 0; k < 1000; ++k) texts.push_back(test::random_utf8(&rng, 48, kRandomText));
  int checked = 0;
  for (const std::string& s : texts) {
    const Ids ids = encode(s);
    if (!wordpiece()) {
      ASSERT_EQ(tok_->decode(ids), round_trip(s))
          << "\"" << escaped(s, 300) << "\"" << ids_str(ids);
      ++checked;
    } else if (std::find(ids.begin(), ids.end(), tok_->vocab().unk) == ids.end()) {
      const std::string text = tok_->decode(ids, false, true);
      ASSERT_EQ(encode(text), ids)
          << "\"" << escaped(s, 300) << "\" -> \"" << escaped(text, 300) << "\"";
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST_P(VocabData, StreamingEmitsOnlyCompleteUtf8) {
  std::vector<std::string> texts = inputs_;
  texts.push_back(
      "Llamas 🦙🦙 and 世界 and 𝄞 in a ｆｕｌｌ-width 💩 world ✅ "
      "កាន់តែ");
  for (const std::string& s : texts) {
    const Ids ids = encode(s);
    StreamDecoder d(*tok_);
    std::string all;
    for (TokenId id : ids) {
      const std::string chunk = d.push(id);
      EXPECT_TRUE(valid_utf8(chunk))
          << "\"" << escaped(chunk, 300) << "\" in \"" << escaped(s, 300) << "\"";
      all += chunk;
    }
    all += d.finish();
    EXPECT_EQ(all, tok_->decode(ids));
  }
}

// Hostile input never crashes or hangs. Byte-level BPE keeps every byte, so
// even ill-formed UTF-8 round-trips (NFC vocabularies normalise only the
// well-formed runs); WordPiece drops NUL and control characters and turns
// what it cannot spell into [UNK].
TEST_P(VocabData, SurvivesHostileInput) {
  for (const std::string& s : test::hostile_bytes(300, 96)) {
    const Ids ids = encode(s);
    for (TokenId id : ids) ASSERT_TRUE(id >= 0 && id < tok_->n_vocab());
    const std::string back = tok_->decode(ids);
    if (!wordpiece()) {
      if (!GetParam().nfc) {
        EXPECT_EQ(back, round_trip(s)) << "\"" << escaped(s, 300) << "\"";
      }
      EXPECT_EQ(tok_->decode(encode(back)), back) << "\"" << escaped(s, 300) << "\"";
    }
    StreamDecoder d(*tok_);
    EXPECT_TRUE(valid_utf8(test::stream_all(&d, ids)));
  }
  // 1 MiB of one character: each is a single pre-tokenizer word (or a run
  // of identical words) that must neither hang the regexes nor the merges.
  // Hangs are caught by ctest's TIMEOUT (tests/tokenizer.cmake), never by timing here.
  for (const std::string& unit :
       std::vector<std::string>{"a", " ", "\n", "3", "!", "\xE4\xB8\x96", "\xD0\xBC",
                                std::string(1, '\0'), "\xFF", "e\xCC\x81"}) {
    std::string big;
    while (big.size() < (1u << 20)) big += unit;
    // A different last character defeats "whole run" fast paths (a CJK
    // one after white space is the worst case for DeepSeek's "\s+$").
    for (const std::string tail : {"", "\xE4\xB8\x96"}) {
      const std::string text = big + tail;
      const Ids ids = encode(text);  // a hang fails through the test's ctest TIMEOUT
      if (!wordpiece() && !GetParam().nfc) {
        EXPECT_TRUE(tok_->decode(ids) == round_trip(text))
            << "1 MiB of \"" << escaped(unit, 300) << "\"";
      }
    }
  }
}

TEST_P(VocabData, EndOfGenerationTokens) {
  for (const char* text : GetParam().eog) {
    const TokenId id = tok_->find_token(text);
    ASSERT_GE(id, 0) << text;
    EXPECT_TRUE(tok_->is_eog(id)) << text;
    EXPECT_TRUE(tok_->is_control(id)) << text;
    EXPECT_EQ(tok_->token_to_piece(id), "") << text << " is hidden unless asked";
    EXPECT_EQ(tok_->token_to_piece(id, true), text);
  }
  for (const char* text : GetParam().not_eog) {
    const TokenId id = tok_->find_token(text);
    ASSERT_GE(id, 0) << text;
    EXPECT_FALSE(tok_->is_eog(id)) << text;
  }
  if (tok_->vocab().eos >= 0) {
    EXPECT_TRUE(tok_->is_eog(tok_->vocab().eos));
  }
  // Ordinary text never ends generation.
  for (TokenId id : encode("Hello world")) EXPECT_FALSE(tok_->is_eog(id));
}

const std::vector<VocabCase> kCases = {
    {"gpt-2", false, {"<|endoftext|>"}, {}},
    {"mpt", true, {"<|endoftext|>"}, {}},
    {"falcon", false, {"<|endoftext|>"}, {">>ABSTRACT<<"}},
    {"starcoder", false, {"<|endoftext|>"}, {"<fim_prefix>"}},
    {"refact", false, {"<|endoftext|>"}, {"<fim_prefix>"}},
    {"deepseek-coder",
     false,
     {"<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"},
     {"<\xEF\xBD\x9C"
      "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"}},
    {"deepseek-llm",
     false,
     {"<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"},
     {"<\xEF\xBD\x9C"
      "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"}},
    {"llama-bpe",
     false,
     {"<|end_of_text|>", "<|eot_id|>"},
     {"<|begin_of_text|>", "<|start_header_id|>"}},
    {"qwen2", true, {"<|endoftext|>", "<|im_end|>"}, {"<|im_start|>"}},
    {"bert-bge", false, {}, {}},
};

INSTANTIATE_TEST_SUITE_P(Vocab, VocabData, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<VocabCase>& info) {
                           return test::param_name(info.param.name);
                         });

Ids parse_special(const Tokenizer& t, std::string_view text) {
  Tokenizer::EncodeOptions o;
  o.parse_special = true;
  return t.encode(text, o);
}

// Cases beyond llama.cpp's vectors, where llama.cpp and Hugging Face differ
// or where the pre-tokenizers need care. The expected ids come from Hugging
// Face `tokenizers` 0.23.2 running each model's normalizer + pre-tokenizer +
// BPE/WordPiece model on the vocabulary and merges of these GGUF files (a
// pipeline that reproduces all 46 llama.cpp vectors of each vocabulary).
struct HfCase {
  const char* vocab;
  const char* text;
  Ids ids;
};
const HfCase kHfCases[] = {
    // Qwen2 and MPT (GPT-NeoX) normalise to NFC: "e" + U+0301 is "é".
    // llama.cpp does not normalise and gives other ids here.
    {"qwen2", "e\xCC\x81", {963}},
    {"qwen2", "\xC3\xA9", {963}},
    {"qwen2", "Cafe\xCC\x81 au lait", {34, 2577, 963, 7906, 1187, 275}},
    {"qwen2", "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", {126317}},  // jamo compose to 각
    {"mpt", "e\xCC\x81", {860}},
    {"mpt", "Cafe\xCC\x81 au lait", {36, 2320, 860, 7331, 826, 262}},
    // Llama 3 has no normaliser.
    {"llama-bpe", "e\xCC\x81", {68, 54939}},
    {"llama-bpe", "\xC3\xA9", {978}},
    // Caseless contractions ("'T"); digits in threes; U+017F LONG S is a
    // letter of its word, not part of the contraction.
    {"llama-bpe", "don'T", {15357, 17773}},
    {"llama-bpe", "it\xC5\xBF's", {275, 129, 123, 596}},
    {"llama-bpe", "12345678", {4513, 10961, 2495}},
    {"qwen2", "it\xC5\xBF's", {275, 144815, 594}},
    // U+180E is not white space for the models' regexes (it is for PCRE2).
    {"gpt-2", "a \xE1\xA0\x8E b", {64, 28053, 254, 236, 275}},
    {"llama-bpe", "a \xE1\xA0\x8E b", {64, 87189, 254, 236, 293}},
    {"qwen2", "a \xE1\xA0\x8E b", {64, 86089, 254, 236, 293}},
    {"gpt-2", "  \xC2\xA0\xE3\x80\x80x", {220, 5624, 5099, 222, 87}},
    // Falcon splits digits on the byte-level symbols: ½ (C2 BD), ² (C2 B2)
    // and the second byte of м (D0 BC) are "numeric". llama.cpp keeps them.
    {"falcon",
     "\xD0\xBC and \xD0\xBC\xD0\xB8\xD1\x80 999",
     {150, 132, 273, 5052, 132, 7795, 9310, 204, 15845}},
    {"falcon",
     "12\xC2\xBD"
     "3456",
     {928, 136, 133, 29094, 33}},
    {"falcon", "x\xC2\xB2y", {99, 136, 122, 100}},
    {"falcon", "1234567", {10963, 27681, 34}},
    // DeepSeek: trailing white space, CJK runs, digits one by one (coder)
    // or in runs (llm), and letters whose code points are NFC singletons.
    {"deepseek-llm", "a   \n  ", {64, 300, 185, 243}},
    {"deepseek-llm",
     "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C 123  ",
     {84313, 4997, 207, 16, 17, 18, 243}},
    {"deepseek-llm", "\xE1\xBD\xBD\xE2\x84\xA6\xE2\x84\xAA", {40751, 121, 9435, 99, 9435, 103}},
    {"deepseek-coder", "a   \n  ", {64, 315, 185, 243}},
    {"deepseek-coder", "x=1234;\r\n", {87, 28, 16, 17, 18, 19, 26, 188, 185}},
    {"starcoder", "v1.2.3-rc4", {123, 54, 51, 55, 51, 56, 50, 918, 57}},
    {"starcoder", " 999", {244, 62, 62, 62}},
    // BERT: NFD without recomposition (Hangul becomes jamo), FF is dropped
    // (not a space), accents and case go, a literal U+2581 is no phantom space.
    {"bert-bge",
     "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",
     {1469, 30006, 30021, 29991, 30014, 30020, 29999, 30008}},
    {"bert-bge", "Hello\fWorld", {7592, 11108}},
    {"bert-bge", "\xC4\xB0stanbul caf\xC3\xA9", {9960, 7668}},
    {"bert-bge", "x\xE2\x96\x81y", {100}},
    {"bert-bge", "\xE4\xBD\xA0\xE5\xA5\xBD!", {100, 100, 999}},
};

TEST(VocabHuggingFace, CasesBeyondTheVectors) {
  std::string loaded;
  std::unique_ptr<Tokenizer> tok;
  for (const HfCase& c : kHfCases) {
    if (loaded != c.vocab) {
      ENCORE_SHARED_FILE(path, vocab_path(c.vocab));
      tok = Tokenizer::create(vocab_from_gguf(gguf::File::open(path)));
      loaded = c.vocab;
    }
    const Ids got = tok->encode(c.text, {});
    EXPECT_EQ(got, c.ids) << c.vocab << " \"" << escaped(c.text, 300) << "\"\n  want"
                          << ids_str(c.ids) << "\n  got " << ids_str(got);
  }
}

TEST(VocabNfc, DecomposedInputTokenizesLikeComposed) {
  for (const char* name : {"qwen2", "mpt"}) {
    ENCORE_SHARED_FILE(path, vocab_path(name));
    const auto tok = Tokenizer::create(vocab_from_gguf(gguf::File::open(path)));
    EXPECT_EQ(tok->encode("e\xCC\x81", {}), tok->encode("\xC3\xA9", {})) << name;
    EXPECT_EQ(tok->encode("Ame\xCC\x81lie a\xCC\x8Angstro\xCC\x88m", {}),
              tok->encode("Am\xC3\xA9lie \xC3\xA5ngstr\xC3\xB6m", {}))
        << name;
    // Ill-formed bytes next to a decomposed character survive untouched.
    const std::string mixed =
        "\x80"
        "e\xCC\x81\xC3";
    EXPECT_EQ(tok->decode(tok->encode(mixed, {})), "\x80\xC3\xA9\xC3") << name;
  }
}

TEST(VocabSpecial, ChatMarkersParseOnlyWhenAsked) {
  ENCORE_SHARED_FILE(qwen_path, vocab_path("qwen2"));
  const auto qwen = Tokenizer::create(vocab_from_gguf(gguf::File::open(qwen_path)));
  const TokenId im_start = qwen->find_token("<|im_start|>");
  const TokenId im_end = qwen->find_token("<|im_end|>");
  ASSERT_GE(im_start, 0);
  EXPECT_EQ(parse_special(*qwen, "<|im_start|>"), (Ids{im_start}));
  const Ids plain = qwen->encode("<|im_start|>", {});
  EXPECT_GT(plain.size(), 1u);
  for (TokenId id : plain) EXPECT_NE(id, im_start);
  EXPECT_EQ(qwen->decode(plain), "<|im_start|>");
  const Ids chat = parse_special(*qwen, "<|im_start|>user\nHi<|im_end|>\n");
  ASSERT_EQ(chat.size(), 6u);  // im_start "user" "\n" "Hi" im_end "\n"
  EXPECT_EQ(chat.front(), im_start);
  EXPECT_EQ(chat[4], im_end);
  EXPECT_EQ(qwen->decode(chat), "user\nHi\n");
  EXPECT_EQ(qwen->decode(chat, true), "<|im_start|>user\nHi<|im_end|>\n");
  // User-defined added tokens (<tool_call>) are matched either way.
  const TokenId tool = qwen->find_token("<tool_call>");
  ASSERT_GE(tool, 0);
  EXPECT_EQ(qwen->encode("<tool_call>", {}), (Ids{tool}));
  EXPECT_EQ(qwen->token_to_piece(tool), "<tool_call>");

  ENCORE_SHARED_FILE(llama_path, vocab_path("llama-bpe"));
  const auto llama = Tokenizer::create(vocab_from_gguf(gguf::File::open(llama_path)));
  Tokenizer::EncodeOptions o;
  o.add_bos = true;
  o.parse_special = true;
  const Ids ids = llama->encode("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", o);
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids.front(), 128000);
  EXPECT_EQ(ids[1], llama->find_token("<|start_header_id|>"));
  EXPECT_EQ(ids.back(), llama->find_token("<|eot_id|>"));
  EXPECT_TRUE(llama->is_eog(ids.back()));
  EXPECT_GT(llama->encode("<|eot_id|>", {}).size(), 1u);
}

// WordPiece decoding gives the normalised words separated by single spaces
// (see VocabData.DecodeInvertsEncode for the round trip of random text).
TEST(WordPieceData, DecodeGivesNormalisedWords) {
  ENCORE_SHARED_FILE(path, vocab_path("bert-bge"));
  const auto tok = Tokenizer::create(vocab_from_gguf(gguf::File::open(path)));
  const Ids hello = tok->encode("  Hello,\tW\xC3\xB6rld!! ", {});
  EXPECT_EQ(tok->decode(hello, false, true), "hello , world ! !");
  Tokenizer::EncodeOptions o;
  o.add_bos = true;
  o.add_eos = true;
  const Ids framed = tok->encode("Hello", o);
  ASSERT_EQ(framed.size(), 3u);
  EXPECT_EQ(framed.front(), 101);  // [CLS]
  EXPECT_EQ(framed.back(), 102);   // [SEP]
  EXPECT_EQ(tok->decode(framed, false, true), "hello");
  EXPECT_EQ(tok->decode(framed, true, true), "[CLS] hello[SEP]");
  // A continuation piece joins its word.
  const Ids pieces = tok->encode("tokenization", {});
  EXPECT_GT(pieces.size(), 1u);
  EXPECT_EQ(tok->decode(pieces, false, true), "tokenization");
  // A 101-character word is unknown as a whole.
  EXPECT_EQ(tok->encode(std::string(101, 'a'), {}), (Ids{100}));
}

}  // namespace
}  // namespace encore
