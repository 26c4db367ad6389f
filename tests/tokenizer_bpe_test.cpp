// Unit tests of byte-level BPE and WordPiece on hand-built vocabularies: the
// GPT-2 byte <-> symbol map, merge order, the pre-tokenizers' word splits,
// ignore_merges, NFC, decoding, special tokens, streaming, errors, and
// robustness (long input, concurrent encode).
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "encore/tokenizer.h"
#include "tokenizer/internal.h"
#include "tokenizer/pretokenizer.h"

namespace encore {
namespace {

using Ids = std::vector<TokenId>;
using tokenizer_detail::byte_to_symbol;
using tokenizer_detail::bytes_to_symbols;
using tokenizer_detail::PreTokenizer;
using tokenizer_detail::symbol_to_byte;
using tokenizer_detail::symbols_to_bytes;

TEST(ByteLevelMap, IsABijectionWithGpt2sLayout) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = byte_to_symbol(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(cp).second) << b;
    EXPECT_EQ(symbol_to_byte(cp), b);
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (printable) {
      EXPECT_EQ(cp, static_cast<uint32_t>(b));
    } else {
      EXPECT_GE(cp, 0x100u);
    }
  }
  EXPECT_EQ(*seen.rbegin(), 0x143u);        // 68 shifted bytes: U+0100..U+0143
  EXPECT_EQ(byte_to_symbol(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_to_symbol('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_symbol(0x00), 0x100u);
  EXPECT_EQ(byte_to_symbol(0x7F), 0x121u);
  EXPECT_EQ(byte_to_symbol(0xAD), 0x143u);
  EXPECT_EQ(symbol_to_byte(0x20), -1);  // a raw space is not in the alphabet
  EXPECT_EQ(symbol_to_byte(0x144), -1);
  EXPECT_EQ(symbol_to_byte(0x4E16), -1);
}

TEST(ByteLevelMap, TextsRoundTrip) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(symbols_to_bytes(bytes_to_symbols(all)), all);
  EXPECT_EQ(bytes_to_symbols(" hi\n"), "\xC4\xA0hi\xC4\x8A");  // "ĠhiĊ"
  EXPECT_EQ(symbols_to_bytes("\xC4\xA0"
                             "caf\xC3\x83\xC2\xA9"),
            " caf\xC3\xA9");  // "ĠcafÃ©"
  // Characters outside the alphabet and ill-formed bytes pass through.
  EXPECT_EQ(symbols_to_bytes("x\xE4\xB8\x96 \xFF"), "x\xE4\xB8\x96 \xFF");
}

std::vector<std::string> words(std::string_view pre, std::string_view text) {
  const PreTokenizer p(pre);
  std::string storage;
  const std::string_view norm = p.normalize(text, &storage);
  std::vector<PreTokenizer::Word> ws;
  p.split(norm, &ws);
  std::vector<std::string> out;
  for (const auto& w : ws) out.emplace_back(norm.substr(w.begin, w.len));
  return out;
}

using Words = std::vector<std::string>;

TEST(PreTokenizer, SplitsAsTheModelsPatterns) {
  EXPECT_EQ(words("gpt-2", "Hello world's 123  x"),
            (Words{"Hello", " world", "'s", " 123", " ", " x"}));
  EXPECT_EQ(words("gpt-2", "a\tb  \n"), (Words{"a", "\t", "b", "  \n"}));
  // Llama 3: digits in threes, caseless contractions, newline runs.
  EXPECT_EQ(words("llama-bpe", "12345 abc\n\n  x"),
            (Words{"123", "45", " abc", "\n\n", " ", " x"}));
  EXPECT_EQ(words("llama-bpe", "DON'T ;)"), (Words{"DON", "'T", " ;)"}));
  EXPECT_EQ(words("qwen2", "x123"), (Words{"x", "1", "2", "3"}));
  // StarCoder: each digit alone, then GPT-2's pattern.
  EXPECT_EQ(words("starcoder", " 999"), (Words{" ", "9", "9", "9"}));
  // DeepSeek: newlines alone, trailing white space kept as one word.
  EXPECT_EQ(words("deepseek-llm", "a   \n  "), (Words{"a", "   ", "\n", "  "}));
  EXPECT_EQ(words("deepseek-coder", "x=12;"), (Words{"x", "=", "1", "2", ";"}));
  // Falcon: digit runs and triples on the byte-level symbols, so "½"
  // (C2 BD) is cut between its bytes.
  EXPECT_EQ(words("falcon",
                  "12\xC2\xBD"
                  "3456"),
            (Words{"12", "\xC2", "\xBD", "345", "6"}));
  EXPECT_EQ(words("falcon", "hi!!, you"), (Words{"hi", "!!,", " you"}));
  // U+180E is no white space for the models' tokenizers.
  EXPECT_EQ(words("gpt-2", "a \xE1\xA0\x8E b"), (Words{"a", " \xE1\xA0\x8E", " b"}));
  // Ill-formed UTF-8 never matches; it forms words of its own.
  EXPECT_EQ(words("gpt-2",
                  "ab\xFF\xFE"
                  "cd"),
            (Words{"ab", "\xFF\xFE", "cd"}));
}

TEST(PreTokenizer, NormalizesToNfcOnlyWhereTheModelDoes) {
  EXPECT_EQ(words("qwen2", "e\xCC\x81"), (Words{"\xC3\xA9"}));
  EXPECT_EQ(words("mpt", "e\xCC\x81"), (Words{"\xC3\xA9"}));
  EXPECT_EQ(words("llama-bpe", "e\xCC\x81"), (Words{"e", "\xCC\x81"}));  // a mark is no letter
  const PreTokenizer p("qwen2");
  std::string storage;
  const std::string_view plain = "already NFC: \xC3\xA9";
  EXPECT_EQ(p.normalize(plain, &storage).data(), plain.data()) << "no copy when unchanged";
  EXPECT_EQ(p.normalize("\xFF"
                        "e\xCC\x81\xC3",
                        &storage),
            "\xFF\xC3\xA9\xC3");
}

TEST(PreTokenizer, WordsAlwaysCoverTheText) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255);
  for (std::string_view pre : PreTokenizer::known_names()) {
    const PreTokenizer p(pre);
    std::vector<PreTokenizer::Word> ws;
    for (int k = 0; k < 200; ++k) {
      std::string s(static_cast<size_t>(byte(rng) % 40), '\0');
      for (char& c : s)
        c = static_cast<char>(k % 2 ? byte(rng) : " a1!\n\xC3\xA9\xE4"[byte(rng) % 8]);
      p.split(s, &ws);
      size_t pos = 0;
      for (const auto& w : ws) {
        ASSERT_EQ(w.begin, pos) << pre;
        ASSERT_GT(w.len, 0u) << pre;
        pos += w.len;
      }
      ASSERT_EQ(pos, s.size()) << pre;
    }
  }
}

TEST(PreTokenizer, UnknownNameIsAnErrorListingTheKnownOnes) {
  try {
    PreTokenizer p("chameleon");
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'chameleon'"), std::string::npos) << msg;
    for (const char* name : {"default", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm",
                             "deepseek-coder", "falcon", "starcoder", "refact", "mpt"}) {
      EXPECT_NE(msg.find(name), std::string::npos) << name << " in " << msg;
    }
  }
}

// A byte-level vocabulary: token b (0..255) spells byte b, then `extra`
// tokens (texts in the byte alphabet), then <|end|> (Control).
struct BpeBuilder {
  Vocab v;
  explicit BpeBuilder(std::string pre = "gpt-2") {
    v.model = "gpt2";
    v.pre = std::move(pre);
    v.add_bos = false;
    v.add_space_prefix = false;
    for (int b = 0; b < 256; ++b) add(bytes_to_symbols(std::string(1, static_cast<char>(b))));
  }
  TokenId add(std::string text, TokenType type = TokenType::Normal) {
    v.tokens.push_back(std::move(text));
    v.types.push_back(type);
    return static_cast<TokenId>(v.tokens.size() - 1);
  }
  // Adds the merge "left right" (raw bytes, spelled in the alphabet here)
  // and, unless present, its result as a token; returns the result's id.
  TokenId merge(std::string_view left, std::string_view right) {
    const std::string l = bytes_to_symbols(left), r = bytes_to_symbols(right);
    v.merges.push_back(l + " " + r);
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.tokens[i] == l + r) return static_cast<TokenId>(i);
    }
    return add(l + r);
  }
  std::unique_ptr<Tokenizer> build() const { return Tokenizer::create(v); }
};

TokenId byte_id(char c) { return static_cast<uint8_t>(c); }

TEST(BpeMerge, LowestRankFirst) {
  BpeBuilder b;
  const TokenId bc = b.merge("b", "c");
  const TokenId ab = b.merge("a", "b");
  EXPECT_EQ(b.build()->encode("abc", {}), (Ids{byte_id('a'), bc}));
  BpeBuilder r;
  const TokenId ab2 = r.merge("a", "b");
  r.merge("b", "c");
  EXPECT_EQ(r.build()->encode("abc", {}), (Ids{ab2, byte_id('c')}));
  (void)ab;
}

TEST(BpeMerge, EqualRanksGoLeftmostAndChain) {
  BpeBuilder b;
  const TokenId aa = b.merge("a", "a");
  const TokenId aaaa = b.merge("aa", "aa");
  const auto t = b.build();
  EXPECT_EQ(t->encode("aaa", {}), (Ids{aa, byte_id('a')}));
  EXPECT_EQ(t->encode("aaaaa", {}), (Ids{aaaa, byte_id('a')}));
  EXPECT_EQ(t->encode("aaaaaa", {}), (Ids{aaaa, aa}));
}

TEST(BpeMerge, NeverAcrossWords) {
  BpeBuilder b;
  const TokenId sp_w = b.merge(" ", "w");
  b.merge("o", " ");  // would join "hello" and " world" if words were ignored
  const auto t = b.build();
  const Ids ids = t->encode("o w", {});
  EXPECT_EQ(ids, (Ids{byte_id('o'), sp_w}));
  EXPECT_EQ(t->decode(ids), "o w");
}

TEST(BpeMerge, UnusableMergesAreSkippedAndMalformedOnesRejected) {
  BpeBuilder b;
  b.v.merges.push_back(bytes_to_symbols("x") + " " + bytes_to_symbols("y"));  // "xy" no token
  b.v.merges.push_back("nope-no-token " + bytes_to_symbols("y"));
  EXPECT_EQ(b.build()->encode("xy", {}), (Ids{byte_id('x'), byte_id('y')}));
  b.v.merges.push_back("nospace");
  try {
    b.build();
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("merge 2 'nospace'"), std::string::npos) << e.what();
  }
}

TEST(BpeMerge, IgnoreMergesTakesWholeWordTokensForLlama3) {
  // "abc" is a token that the merges cannot build (there is no "a b" or
  // "b c" merge); Llama 3 (ignore_merges) still emits it for the word "abc".
  for (const char* pre : {"llama-bpe", "gpt-2"}) {
    BpeBuilder b(pre);
    const TokenId abc = b.add(bytes_to_symbols("abc"));
    const auto t = b.build();
    const Ids want =
        std::string(pre) == "llama-bpe" ? Ids{abc} : Ids{byte_id('a'), byte_id('b'), byte_id('c')};
    EXPECT_EQ(t->encode("abc", {}), want) << pre;
    EXPECT_EQ(t->encode("abcd", {}), (Ids{byte_id('a'), byte_id('b'), byte_id('c'), byte_id('d')}))
        << pre;
  }
}

TEST(BpeMerge, BytesWithoutATokenAreDropped) {
  BpeBuilder b;
  b.v.tokens[0xFF] = "unused-not-the-symbol";
  const auto t = b.build();
  EXPECT_EQ(t->encode("a\xFF"
                      "b",
                      {}),
            (Ids{byte_id('a'), byte_id('b')}));
}

TEST(BpeDecode, PiecesAreBytesAndSpecialTokensHidden) {
  BpeBuilder b;
  const TokenId end = b.add("<|end|>", TokenType::Control);
  const TokenId user = b.add("<u>", TokenType::UserDefined);
  const TokenId unused = b.add("[PAD]", TokenType::Unused);
  b.v.eos = end;
  const auto t = b.build();
  EXPECT_EQ(t->token_to_piece(byte_id(' ')), " ");
  EXPECT_EQ(t->token_to_piece(byte_id('\n')), "\n");
  EXPECT_EQ(t->token_to_piece(0xC3), "\xC3");
  EXPECT_EQ(t->token_to_piece(end), "");
  EXPECT_EQ(t->token_to_piece(end, true), "<|end|>");
  EXPECT_EQ(t->token_to_piece(user), "<u>");
  EXPECT_EQ(t->token_to_piece(unused, true), "");
  EXPECT_THROW(t->token_to_piece(t->n_vocab()), InvalidArgument);
  EXPECT_TRUE(t->is_eog(end));

  // Special text is parsed only on request; user-defined text always.
  Tokenizer::EncodeOptions o;
  EXPECT_EQ(t->encode("x<|end|>", o).size(), 8u);
  EXPECT_EQ(t->encode("x<u>", o), (Ids{byte_id('x'), user}));
  o.parse_special = true;
  o.add_eos = true;
  EXPECT_EQ(t->encode("x<|end|>", o), (Ids{byte_id('x'), end, end}));
  o.add_bos = true;
  EXPECT_THROW(t->encode("x", o), InvalidArgument);  // no BOS in this vocabulary
}

TEST(BpeDecode, StreamingHoldsBackSplitCharacters) {
  BpeBuilder b;
  const auto t = b.build();
  const Ids ids = t->encode("\xC3\xA9\xE4\xB8\x96!", {});  // "é世!" byte by byte
  ASSERT_EQ(ids.size(), 6u);
  StreamDecoder d(*t);
  std::vector<std::string> chunks;
  for (TokenId id : ids) chunks.push_back(d.push(id));
  EXPECT_EQ(chunks, (std::vector<std::string>{"", "\xC3\xA9", "", "", "\xE4\xB8\x96", "!"}));
  EXPECT_EQ(d.finish(), "");
}

TEST(BpeRobustness, LongRunsAreFast) {
  BpeBuilder b;
  b.merge("a", "a");
  b.merge("aa", "aa");
  b.merge("aaaa", "aaaa");
  b.merge(" ", " ");
  const auto t = b.build();
  for (const std::string unit : {"a", " ", "ab", "\xE4\xB8\x96"}) {
    std::string text;
    while (text.size() < (1u << 20)) text += unit;
    // A quadratic rescan would take hours: ctest's TIMEOUT catches that.
    const Ids ids = t->encode(text, {});
    EXPECT_EQ(t->decode(ids), text);
  }
}

TEST(BpeRobustness, ConcurrentEncodeIsDeterministic) {
  BpeBuilder b("qwen2");
  b.merge("a", "b");
  b.merge(" ", "ab");
  b.merge("\xC3", "\xA9");
  const auto t = b.build();
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "ab ba e\xCC\x81 123 \xE4\xB8\x96 ";
  const Ids want = t->encode(text, {});
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = t->encode(text, {}); });
  }
  for (auto& th : threads) th.join();
  for (const Ids& g : got) EXPECT_EQ(g, want);
}

TEST(BpeCreate, UnknownPreTokenizerIsAModelError) {
  BpeBuilder b("my-new-model");
  EXPECT_THROW(b.build(), ModelError);
}

// WordPiece with llama.cpp's phantom-space spelling: "▁word" starts a word,
// "piece" continues one.
struct WpmBuilder {
  Vocab v;
  WpmBuilder() {
    v.model = "bert";
    v.pre = "default";
    v.unk = add("[UNK]", TokenType::Control);
    v.bos = add("[CLS]", TokenType::Control);
    v.sep = add("[SEP]", TokenType::Control);
  }
  TokenId add(std::string text, TokenType type = TokenType::Normal) {
    v.tokens.push_back(std::move(text));
    v.types.push_back(type);
    return static_cast<TokenId>(v.tokens.size() - 1);
  }
};

const std::string kSp = "\xE2\x96\x81";

TEST(WordPiece, GreedyLongestMatchFirst) {
  WpmBuilder b;
  const TokenId un = b.add(kSp + "un");
  const TokenId unaff = b.add(kSp + "unaff");
  const TokenId able = b.add("able");
  const TokenId a = b.add("a");
  const TokenId ff = b.add("ff");
  const TokenId comma = b.add(kSp + ",");
  const TokenId cafe = b.add(kSp + "cafe");
  const auto t = Tokenizer::create(b.v);
  // Longest first piece wins even where a shorter one would let the rest
  // match ("un" + "a" + "ff" + "able" is never tried).
  EXPECT_EQ(t->encode("unaffable", {}), (Ids{unaff, able}));
  EXPECT_EQ(t->encode("UNA", {}), (Ids{un, a}));
  // Punctuation is a word of its own; a word with an unmatched position is
  // [UNK] as a whole.
  EXPECT_EQ(t->encode("Unaffable,unx", {}), (Ids{unaff, able, comma, b.v.unk}));
  EXPECT_EQ(t->encode("CAF\xC3\x89", {}), (Ids{cafe}));  // accents stripped, lowercased
  EXPECT_EQ(t->decode(t->encode("unaffable , un", {}), false, true), "unaffable , un");
  (void)ff;
  Tokenizer::EncodeOptions o;
  o.add_bos = true;
  o.add_eos = true;  // BERT's [SEP] stands in for EOS
  EXPECT_EQ(t->encode("un", o), (Ids{b.v.bos, un, b.v.sep}));
}

}  // namespace
}  // namespace encore
