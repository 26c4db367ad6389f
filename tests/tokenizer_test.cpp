// Unit tests of the tokenizer module on small hand-built vocabularies: SPM
// merges, byte fallback, special-token splitting, decoding, the streaming
// detokenizer, EOG detection and the errors of create() / vocab_from_gguf().
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "encore/gguf.h"
#include "encore/tokenizer.h"

namespace encore {
namespace {

using Ids = std::vector<TokenId>;

const std::string kSp = "\xE2\x96\x81";  // "▁"

// <unk> <s> </s>, then `pieces` (Normal, score = its value), optionally the
// 256 byte tokens at the end.
struct VocabBuilder {
  Vocab v;
  VocabBuilder() {
    v.model = "llama";
    add("<unk>", 0, TokenType::Unknown);
    add("<s>", 0, TokenType::Control);
    add("</s>", 0, TokenType::Control);
    v.unk = 0;
    v.bos = 1;
    v.eos = 2;
  }
  TokenId add(std::string text, float score = 0, TokenType type = TokenType::Normal) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
    return static_cast<TokenId>(v.tokens.size() - 1);
  }
  TokenId add_bytes() {
    const auto first = static_cast<TokenId>(v.tokens.size());
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      add(buf, 0, TokenType::Byte);
    }
    return first;
  }
  std::unique_ptr<Tokenizer> build() const { return Tokenizer::create(v); }
};

Ids enc(const Tokenizer& t, std::string_view s, bool parse_special = false) {
  Tokenizer::EncodeOptions o;
  o.parse_special = parse_special;
  return t.encode(s, o);
}

TEST(SpmMerge, HighestScoreFirst) {
  VocabBuilder b;
  b.v.add_space_prefix = false;
  const TokenId a = b.add("a");
  b.add("b");
  b.add("c");
  b.add("ab", -2);
  const TokenId bc = b.add("bc", -1);
  const auto t = b.build();
  // "bc" scores higher than "ab", so b pairs with c.
  EXPECT_EQ(enc(*t, "abc"), (Ids{a, bc}));
}

TEST(SpmMerge, TiesGoToTheLeftmostPair) {
  VocabBuilder b;
  b.v.add_space_prefix = false;
  const TokenId a = b.add("a");
  b.add("b");
  const TokenId ab = b.add("ab", -1);
  b.add("ba", -1);
  const auto t = b.build();
  EXPECT_EQ(enc(*t, "aba"), (Ids{ab, a}));
  const TokenId aa = b.add("aa", -1);
  const auto t2 = b.build();
  EXPECT_EQ(enc(*t2, "aaa"), (Ids{aa, a}));
}

TEST(SpmMerge, MergesChainIntoLongerTokens) {
  VocabBuilder b;
  b.add(kSp);
  const TokenId h = b.add("h");
  b.add("i");
  b.add(kSp + "h", -3);
  b.add("hi", -1);
  const TokenId sphi = b.add(kSp + "hi", -2);
  const auto t = b.build();
  // "▁hi": hi merges first (-1), then ▁ + hi (-2).
  EXPECT_EQ(enc(*t, "hi"), (Ids{sphi}));
  // A merge needs a token for the pair: "▁" + "hi" + "h" stays split.
  EXPECT_EQ(enc(*t, "hih"), (Ids{sphi, h}));
}

TEST(SpmMerge, SpacesBecomeMarkersAndThePrefixIsAddedOnce) {
  VocabBuilder b;
  const TokenId sp = b.add(kSp), x = b.add("x"), spx = b.add(kSp + "x", -1);
  const auto t = b.build();
  EXPECT_EQ(enc(*t, "x"), (Ids{spx}));
  EXPECT_EQ(enc(*t, "x x"), (Ids{spx, spx}));
  EXPECT_EQ(enc(*t, " x"), (Ids{sp, spx}));
  EXPECT_EQ(enc(*t, ""), Ids{});
  Tokenizer::EncodeOptions o;
  o.add_bos = true;
  EXPECT_EQ(t->encode("", o), (Ids{1}));
  o.add_eos = true;
  EXPECT_EQ(t->encode("x", o), (Ids{1, spx, 2}));
  b.v.add_space_prefix = false;
  const auto t2 = b.build();
  EXPECT_EQ(enc(*t2, "x"), (Ids{x}));
}

TEST(SpmBytes, UnknownCharactersFallBackToBytes) {
  VocabBuilder b;
  b.v.add_space_prefix = false;
  const TokenId a = b.add("a");
  const TokenId b0 = b.add_bytes();
  const auto t = b.build();
  // U+00E9 is C3 A9; a lone continuation byte and NUL are bytes as well.
  EXPECT_EQ(enc(*t, "a\xC3\xA9"), (Ids{a, b0 + 0xC3, b0 + 0xA9}));
  EXPECT_EQ(enc(*t, std::string("\x80\0a", 3)), (Ids{b0 + 0x80, b0, a}));
  // A truncated sequence at the end is what is left of it.
  EXPECT_EQ(enc(*t, "\xE4\xB8"), (Ids{b0 + 0xE4, b0 + 0xB8}));
  EXPECT_EQ(t->decode(enc(*t, "a\xC3\xA9\xFF")), "a\xC3\xA9\xFF");
}

TEST(SpmBytes, AStrayLeadByteSwallowsTheFollowingBytes) {
  VocabBuilder b;
  const TokenId b0 = b.add_bytes();
  const TokenId sp = b.add(kSp), x = b.add("x");
  const auto t = b.build();
  // As llama.cpp: the lead byte F8 claims 4 bytes, here itself and the
  // U+2581 that stood for the space; not a token, so all are spelled as bytes.
  EXPECT_EQ(enc(*t, "\xF8 x"), (Ids{sp, b0 + 0xF8, b0 + 0xE2, b0 + 0x96, b0 + 0x81, x}));
}

TEST(SpmBytes, WithoutByteTokensACharacterIsUnknown) {
  VocabBuilder b;
  b.v.add_space_prefix = false;
  const TokenId a = b.add("a");
  const auto t = b.build();
  EXPECT_EQ(enc(*t, "a\xC3\xA9z"), (Ids{a, 0, 0}));
  b.v.unk = -1;
  const auto t2 = b.build();
  EXPECT_THROW(enc(*t2, "z"), InvalidArgument);
}

TEST(SpmBytes, AByteTokenIsRenderedAsItsByte) {
  VocabBuilder b;
  const TokenId b0 = b.add_bytes();
  const auto t = b.build();
  EXPECT_EQ(t->token_to_piece(b0 + 0x0A), "\n");
  EXPECT_EQ(t->token_to_piece(b0 + 0xE2), "\xE2");
}

TEST(TokenizerSpecial, ControlTextIsPlainUnlessParsed) {
  VocabBuilder b;
  b.add("<");
  const TokenId s = b.add("s"), gt = b.add(">");
  b.add(kSp);
  b.add("x");
  const TokenId splt = b.add(kSp + "<", -1), spx = b.add(kSp + "x", -1);
  const auto t = b.build();
  EXPECT_EQ(enc(*t, "<s>", false), (Ids{splt, s, gt}));
  // Parsed: the text after a special token gets the dummy prefix again, as
  // in llama.cpp; the text before it does not end with one.
  EXPECT_EQ(enc(*t, "<s>x", true), (Ids{1, spx}));
  EXPECT_EQ(enc(*t, "x<s>x</s>", true), (Ids{spx, 1, spx, 2}));
  EXPECT_EQ(enc(*t, "<s><s>", true), (Ids{1, 1}));
}

TEST(TokenizerSpecial, UserDefinedTokensAreAlwaysSplitLongestFirst) {
  VocabBuilder b;
  b.v.add_space_prefix = false;
  const TokenId x = b.add("x"), y = b.add("y");
  const TokenId ux = b.add("<x>", 0, TokenType::UserDefined);
  const TokenId uxy = b.add("<x><y>", 0, TokenType::UserDefined);
  b.add_bytes();
  const auto t = b.build();
  EXPECT_EQ(enc(*t, "x<x>y", false), (Ids{x, ux, y}));
  EXPECT_EQ(enc(*t, "<x><y><x>", false), (Ids{uxy, ux}));
  // User-defined tokens render as their text even without render_special.
  EXPECT_EQ(t->decode(Ids{x, uxy, y}), "x<x><y>y");
}

TEST(TokenizerSpecial, StripAttributesEatAdjacentWhitespace) {
  VocabBuilder b;
  b.v.add_space_prefix = false;
  const TokenId x = b.add("x");
  const TokenId end = b.add("<e>", 0, TokenType::Control);
  b.v.rstrip = {end};
  const TokenId beg = b.add("<b>", 0, TokenType::Control);
  b.v.lstrip = {beg};
  const auto t = b.build();
  EXPECT_EQ(enc(*t, "x<e> \n\tx", true), (Ids{x, end, x}));
  EXPECT_EQ(enc(*t, "x \t<b>x", true), (Ids{x, beg, x}));
  EXPECT_EQ(enc(*t, "<e>  ", true), (Ids{end}));
}

TEST(TokenizerSpecial, UnknownTypeTokensNeedParseSpecial) {
  VocabBuilder b;
  b.v.add_space_prefix = false;
  b.add_bytes();
  const auto t = b.build();
  const Ids plain = enc(*t, "<unk>", false);
  EXPECT_EQ(plain.size(), 5u);
  EXPECT_EQ(enc(*t, "<unk>", true), (Ids{0}));
}

Ids cat(Ids a, const Ids& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Ids enc_in(const Tokenizer& t, std::string_view s, const std::vector<TextRange>& ranges) {
  Tokenizer::EncodeOptions o;
  o.parse_special = true;
  o.special_ranges = &ranges;
  return t.encode(s, o);
}

// special_ranges (a chat template's own text): Control/Unknown token texts
// become tokens only wholly inside a range; elsewhere the text is plain.
TEST(TokenizerSpecialRanges, ControlTokensOnlyWhollyInsideARange) {
  VocabBuilder b;
  b.v.add_space_prefix = false;
  const TokenId lt = b.add_bytes() + '<';
  const auto t = b.build();
  const Ids plain_eos = enc(*t, "</s>", false);
  ASSERT_EQ(plain_eos.size(), 4u);
  // Inside: the token; outside: plain text, as without parse_special.
  EXPECT_EQ(enc_in(*t, "<s></s>", {{0, 3}}), cat({1}, plain_eos));
  EXPECT_EQ(enc_in(*t, "<s></s>", {{3, 7}}), cat(enc(*t, "<s>", false), {2}));
  EXPECT_EQ(enc_in(*t, "</s>", {}), plain_eos);
  // Across a range's end (or start) is not inside.
  EXPECT_EQ(enc_in(*t, "</s>", {{0, 2}}), plain_eos);
  EXPECT_EQ(enc_in(*t, "</s>", {{1, 4}}), plain_eos);
  // A skipped occurrence does not hide one that starts inside it.
  const TokenId ll = b.add("<<", 0, TokenType::Control);
  const auto t2 = b.build();
  EXPECT_EQ(enc_in(*t2, "<<<", {{1, 3}}), (Ids{lt, ll}));
  EXPECT_EQ(enc(*t2, "<<<", true), (Ids{ll, lt}));
  // Unknown tokens are special too.
  EXPECT_EQ(enc_in(*t, "<unk><unk>", {{5, 10}}), cat(enc(*t, "<unk>", false), {0}));
  // Without parse_special the ranges change nothing.
  Tokenizer::EncodeOptions o;
  const std::vector<TextRange> all = {{0, 4}};
  o.special_ranges = &all;
  EXPECT_EQ(t->encode("</s>", o), plain_eos);
}

TEST(TokenizerSpecialRanges, UserDefinedTokensAndStrippingAreAsBefore) {
  VocabBuilder b;
  b.v.add_space_prefix = false;
  const TokenId x = b.add("x");
  const TokenId ud = b.add("<u>", 0, TokenType::UserDefined);
  const TokenId end = b.add("<e>", 0, TokenType::Control);
  b.v.rstrip = {end};
  b.add_bytes();
  const auto t = b.build();
  // User-defined tokens are matched everywhere, as in plain text.
  EXPECT_EQ(enc_in(*t, "x<u>x", {}), (Ids{x, ud, x}));
  // A token inside a range still strips the whitespace next to it, also when
  // that whitespace is outside the range: the same ids as a whole-text parse.
  EXPECT_EQ(enc_in(*t, "x<e> \nx", {{1, 4}}), (Ids{x, end, x}));
  EXPECT_EQ(enc_in(*t, "x<e> \nx", {{1, 4}}), enc(*t, "x<e> \nx", true));
}

TEST(TokenizerSpecialRanges, MalformedRangesAreRefused) {
  VocabBuilder b;
  b.add_bytes();
  const auto t = b.build();
  for (const std::vector<TextRange>& bad : std::vector<std::vector<TextRange>>{
           {{0, 5}}, {{2, 1}}, {{0, 2}, {1, 3}}, {{2, 3}, {0, 1}}}) {
    EXPECT_THROW(enc_in(*t, "abcd", bad), InvalidArgument);
  }
  EXPECT_EQ(enc_in(*t, "abcd", {{0, 2}, {2, 4}}), enc(*t, "abcd"));
}

TEST(TokenizerPieces, ControlTokensRenderOnlyOnRequest) {
  VocabBuilder b;
  const TokenId hello = b.add(kSp + "hello");
  b.add("unused", 0, TokenType::Unused);
  const auto t = b.build();
  EXPECT_EQ(t->token_to_piece(1), "");
  EXPECT_EQ(t->token_to_piece(1, true), "<s>");
  EXPECT_EQ(t->token_to_piece(0, true), "<unk>");
  EXPECT_EQ(t->token_to_piece(hello), " hello");
  EXPECT_EQ(t->token_to_piece(hello + 1, true), "");
  EXPECT_THROW(t->token_to_piece(-1), InvalidArgument);
  EXPECT_THROW(t->token_to_piece(t->n_vocab()), InvalidArgument);
}

TEST(TokenizerDecode, StripLeadingSpaceDropsOnlyTheDummyPrefix) {
  VocabBuilder b;
  const TokenId sp = b.add(kSp), hello = b.add(kSp + "hello"), spsp = b.add(kSp + kSp);
  b.add_bytes();
  const auto t = b.build();
  EXPECT_EQ(t->decode(Ids{1, hello, hello}), " hello hello");
  EXPECT_EQ(t->decode(Ids{1, hello, hello}, false, true), "hello hello");
  EXPECT_EQ(t->decode(Ids{1, hello}, true, true), "<s> hello");
  EXPECT_EQ(t->decode(Ids{sp, hello}, false, true), " hello");
  EXPECT_EQ(t->decode(Ids{spsp, hello}, false, true), "  hello");
  EXPECT_EQ(t->decode(enc(*t, "  hello"), false, true), "  hello");
  b.v.add_space_prefix = false;
  const auto t2 = b.build();
  EXPECT_EQ(t2->decode(Ids{hello}, false, true), " hello");
}

std::string stream_all(const Tokenizer& t, const Ids& ids, std::vector<std::string>* chunks,
                       bool strip = false) {
  StreamDecoder d(t, strip);
  std::string all;
  for (TokenId id : ids) {
    chunks->push_back(d.push(id));
    all += chunks->back();
  }
  chunks->push_back(d.finish());
  return all + chunks->back();
}

TEST(TokenizerStream, HoldsBackIncompleteSequences) {
  VocabBuilder b;
  const TokenId b0 = b.add_bytes();
  const TokenId hi = b.add(kSp + "hi");
  const auto t = b.build();
  // U+1F999 (F0 9F A6 99) in four byte tokens, then "é" (C3 A9).
  const Ids ids = {hi, b0 + 0xF0, b0 + 0x9F, b0 + 0xA6, b0 + 0x99, b0 + 0xC3, b0 + 0xA9};
  std::vector<std::string> chunks;
  const std::string all = stream_all(*t, ids, &chunks, true);
  EXPECT_EQ(all, "hi\xF0\x9F\xA6\x99\xC3\xA9");
  EXPECT_EQ(all, t->decode(ids, false, true));
  EXPECT_EQ(chunks[0], "hi");
  EXPECT_EQ(chunks[1], "");
  EXPECT_EQ(chunks[3], "");
  EXPECT_EQ(chunks[4], "\xF0\x9F\xA6\x99");
  EXPECT_EQ(chunks[5], "");
  EXPECT_EQ(chunks[6], "\xC3\xA9");
  EXPECT_EQ(chunks[7], "");
}

TEST(TokenizerStream, InvalidBytesBecomeReplacementCharacters) {
  VocabBuilder b;
  const TokenId b0 = b.add_bytes();
  const TokenId x = b.add("x");
  const auto t = b.build();
  const std::string fffd = "\xEF\xBF\xBD";
  std::vector<std::string> chunks;
  // A lone continuation byte, C0 and FF each give one U+FFFD.
  EXPECT_EQ(stream_all(*t, {b0 + 0x80, b0 + 0xC0, b0 + 0xFF, x}, &chunks),
            fffd + fffd + fffd + "x");
  chunks.clear();
  // E4 B8 then "x": the maximal subpart E4 B8 is one U+FFFD, emitted when x
  // shows it cannot complete.
  EXPECT_EQ(stream_all(*t, {b0 + 0xE4, b0 + 0xB8, x}, &chunks), fffd + "x");
  EXPECT_EQ(chunks[1], "");
  EXPECT_EQ(chunks[2], fffd + "x");
  chunks.clear();
  // Surrogates (ED A0) and overlongs (E0 80) are ill-formed at the second byte.
  EXPECT_EQ(stream_all(*t, {b0 + 0xED, b0 + 0xA0, b0 + 0x80}, &chunks), fffd + fffd + fffd);
  chunks.clear();
  // An incomplete sequence at the end is flushed by finish().
  EXPECT_EQ(stream_all(*t, {x, b0 + 0xF0, b0 + 0x9F}, &chunks), "x" + fffd);
  EXPECT_EQ(chunks.back(), fffd);
}

TEST(TokenizerEog, EosEotEomAndExtraIds) {
  VocabBuilder b;
  const TokenId eot = b.add("<|eot|>", 0, TokenType::Control);
  const TokenId eom = b.add("<|eom|>", 0, TokenType::Control);
  const TokenId other = b.add("<|x|>", 0, TokenType::Control);
  const TokenId extra = b.add("<|y|>", 0, TokenType::Control);
  b.v.eot = eot;
  b.v.eom = eom;
  b.v.extra_eog = {extra};
  const auto t = b.build();
  EXPECT_TRUE(t->is_eog(2));
  EXPECT_TRUE(t->is_eog(eot));
  EXPECT_TRUE(t->is_eog(eom));
  EXPECT_TRUE(t->is_eog(extra));
  EXPECT_FALSE(t->is_eog(1));
  EXPECT_FALSE(t->is_eog(other));
  EXPECT_FALSE(t->is_eog(-1));
  EXPECT_FALSE(t->is_eog(t->n_vocab()));
  EXPECT_TRUE(t->is_control(other));
  EXPECT_FALSE(t->is_control(0));
  EXPECT_EQ(t->find_token("<|x|>"), other);
  EXPECT_EQ(t->find_token("nope"), -1);
}

TEST(TokenizerCreate, RejectsBadVocabs) {
  VocabBuilder b;
  b.v.model = "t5";
  try {
    b.build();
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    EXPECT_STREQ(e.what(),
                 "tokenizer model 't5' is not supported yet (supported: llama, gpt2, bert)");
  }
  const auto bad = [](auto mutate) {
    VocabBuilder b;
    mutate(b.v);
    EXPECT_THROW(b.build(), ModelError);
  };
  bad([](Vocab& v) { v.tokens.clear(), v.scores.clear(), v.types.clear(); });
  bad([](Vocab& v) { v.scores.pop_back(); });
  bad([](Vocab& v) { v.types.push_back(TokenType::Normal); });
  bad([](Vocab& v) { v.bos = 3; });
  bad([](Vocab& v) { v.eot = -2; });
  bad([](Vocab& v) { v.rstrip = {7}; });
  bad([](Vocab& v) { v.types[1] = static_cast<TokenType>(9); });
  bad([](Vocab& v) { v.types[1] = TokenType::Byte; });  // "<s>" is no <0xHH>
  // Empty scores and types mean 0 and Normal.
  VocabBuilder ok;
  ok.v.scores.clear();
  ok.v.types.clear();
  EXPECT_NO_THROW(ok.build());
}

TEST(TokenizerRobustness, LongRepeatedTextIsLinearithmic) {
  VocabBuilder b;
  b.add_bytes();
  b.add(kSp);
  std::string run = "a";
  for (int k = 0; k < 5; ++k) {  // a, aa, aaaa, ... 16 a's
    b.add(run, -static_cast<float>(k));
    run += run;
  }
  const auto t = b.build();
  const std::string text(1 << 20, 'a');
  // A quadratic rescan would take hours: ctest's TIMEOUT (tests/tokenizer.cmake)
  // catches that; tests never assert on time.
  const Ids ids = enc(*t, text);
  EXPECT_EQ(t->decode(ids, false, true), text);
}

TEST(TokenizerRobustness, ConcurrentEncodeIsDeterministic) {
  VocabBuilder b;
  b.add_bytes();
  b.add("ab", -1);
  b.add(kSp + "a", -2);
  const auto t = b.build();
  const std::string text = "ab ba abba \xE4\xB8\x96 ab";
  const Ids want = enc(*t, text);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k) got[i] = enc(*t, text);
    });
  }
  for (auto& th : threads) th.join();
  for (const Ids& g : got) EXPECT_EQ(g, want);
}

// --- vocab_from_gguf -------------------------------------------------------

gguf::Value strings(std::vector<std::string> items) {
  std::vector<gguf::Value> v;
  for (auto& s : items) v.push_back(gguf::Value::make_string(std::move(s)));
  return gguf::Value::make_array(gguf::ValueType::STRING, std::move(v));
}
gguf::Value floats(size_t n) {
  return gguf::Value::make_array(gguf::ValueType::FLOAT32,
                                 std::vector<gguf::Value>(n, gguf::Value::make_f32(-1.0f)));
}
gguf::Value ints(std::vector<int32_t> items) {
  std::vector<gguf::Value> v;
  for (int32_t x : items) v.push_back(gguf::Value::make_i32(x));
  return gguf::Value::make_array(gguf::ValueType::INT32, std::move(v));
}

// A small valid "llama" vocabulary; tests tweak the writer before load().
struct GgufVocab {
  gguf::Writer w;
  GgufVocab() {
    w.set("tokenizer.ggml.model", gguf::Value::make_string("llama"));
    w.set("tokenizer.ggml.tokens", strings({"<unk>", "<s>", "</s>", "a", "<|end|>", "<|x|>"}));
    w.set("tokenizer.ggml.scores", floats(6));
    w.set("tokenizer.ggml.token_type", ints({2, 3, 3, 1, 3, 4}));
  }
  Vocab load() const { return vocab_from_gguf(gguf::File::from_bytes(w.to_bytes(), "test.gguf")); }
};

void expect_error(const GgufVocab& g, const std::string& needle) {
  try {
    g.load();
    ADD_FAILURE() << "expected an error mentioning: " << needle;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("test.gguf"), std::string::npos) << msg;
  }
}

TEST(VocabFromGguf, ReadsKeysAndAppliesLlamaDefaults) {
  GgufVocab g;
  const Vocab v = g.load();
  EXPECT_EQ(v.model, "llama");
  EXPECT_EQ(v.pre, "default");
  EXPECT_EQ(v.tokens.size(), 6u);
  EXPECT_EQ(v.types[5], TokenType::UserDefined);
  EXPECT_EQ(v.scores[3], -1.0f);
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
  EXPECT_EQ(v.unk, 0);
  EXPECT_TRUE(v.add_bos);
  EXPECT_FALSE(v.add_eos);
  EXPECT_TRUE(v.add_space_prefix);
  // "<|end|>" is found by its text.
  EXPECT_EQ(v.eot, 4);
  EXPECT_TRUE(v.rstrip.empty());
  const auto t = Tokenizer::create(v);
  EXPECT_TRUE(t->is_eog(4));

  g.w.set("tokenizer.ggml.bos_token_id", gguf::Value::make_u32(3));
  g.w.set("tokenizer.ggml.eot_token_id", gguf::Value::make_u32(5));
  g.w.set("tokenizer.ggml.add_bos_token", gguf::Value::make_bool(false));
  g.w.set("tokenizer.ggml.add_space_prefix", gguf::Value::make_bool(false));
  g.w.set("tokenizer.ggml.pre", gguf::Value::make_string("x"));
  const Vocab v2 = g.load();
  EXPECT_EQ(v2.bos, 3);
  EXPECT_EQ(v2.eot, 5);
  EXPECT_FALSE(v2.add_bos);
  EXPECT_FALSE(v2.add_space_prefix);
  EXPECT_EQ(v2.pre, "x");
}

TEST(VocabFromGguf, Phi3SpecialTokensStripWhitespaceToTheirRight) {
  GgufVocab g;
  g.w.set("general.name", gguf::Value::make_string("Phi3"));
  const Vocab v = g.load();
  // Control/user-defined/unknown tokens and "</s>", except <unk> and <s>.
  EXPECT_EQ(v.rstrip, (Ids{2, 4, 5}));
}

TEST(VocabFromGguf, Errors) {
  {
    GgufVocab g;
    g.w = gguf::Writer();
    g.w.set("tokenizer.ggml.model", gguf::Value::make_string("llama"));
    expect_error(g, "tokenizer.ggml.tokens is missing");
  }
  {
    GgufVocab g;
    g.w = gguf::Writer();
    g.w.set("tokenizer.ggml.tokens", strings({"a"}));
    expect_error(g, "tokenizer.ggml.model is missing");
  }
  {
    GgufVocab g;
    g.w.set("tokenizer.ggml.scores", floats(5));
    expect_error(g, "tokenizer.ggml.scores has 5 entries but tokenizer.ggml.tokens has 6");
  }
  {
    GgufVocab g;
    g.w.set("tokenizer.ggml.token_type", ints({1, 1, 1, 1, 1, 1, 1}));
    expect_error(g, "tokenizer.ggml.token_type has 7 entries");
  }
  {
    GgufVocab g;
    g.w.set("tokenizer.ggml.eos_token_id", gguf::Value::make_u32(6));
    expect_error(g, "tokenizer.ggml.eos_token_id = 6 is outside the vocabulary");
  }
  {
    GgufVocab g;
    g.w.set("tokenizer.ggml.tokens", ints({1, 2}));
    expect_error(g, "tokenizer.ggml.tokens has type array of int32");
  }
  {
    GgufVocab g;
    g.w.set("tokenizer.ggml.tokens", strings({}));
    expect_error(g, "tokenizer.ggml.tokens is empty");
  }
  {
    GgufVocab g;
    g.w.set("tokenizer.ggml.bos_token_id", gguf::Value::make_string("1"));
    expect_error(g, "tokenizer.ggml.bos_token_id has type string");
  }
}

TEST(VocabFromGguf, Float64ScoresBeyondFloatRangeAreRejected) {
  std::vector<gguf::Value> scores;
  for (double x : {-1.0, -2.5, 0.0, 1e300, 0.0, 0.0}) {
    gguf::Value v;
    v.type = gguf::ValueType::FLOAT64;
    v.f = x;
    scores.push_back(v);
  }
  GgufVocab g;
  g.w.set("tokenizer.ggml.scores", gguf::Value::make_array(gguf::ValueType::FLOAT64, scores));
  expect_error(g, "tokenizer.ggml.scores has the score 1e+300 for token 3, beyond the float32");
  scores[3].f = -3.0;  // in range: read as float
  g.w.set("tokenizer.ggml.scores", gguf::Value::make_array(gguf::ValueType::FLOAT64, scores));
  EXPECT_EQ(g.load().scores[1], -2.5f);
}

// Tokenizer::create's errors name the file the vocabulary came from.
TEST(TokenizerCreate, ErrorsNameTheVocabularySource) {
  const auto create_error = [](Vocab v) -> std::string {
    try {
      Tokenizer::create(std::move(v));
    } catch (const ModelError& e) {
      return e.what();
    }
    return "<created>";
  };
  GgufVocab g;
  EXPECT_EQ(g.load().source, "test.gguf");
  g.w.set("tokenizer.ggml.model", gguf::Value::make_string("no-such-model"));
  EXPECT_EQ(create_error(g.load()).rfind("test.gguf: tokenizer model 'no-such-model' is not "
                                         "supported yet (supported: ",
                                         0),
            0u)
      << create_error(g.load());

  GgufVocab bytes;  // a byte token whose text is not <0xHH> (spm.cpp)
  bytes.w.set("tokenizer.ggml.token_type", ints({2, 3, 3, 6, 3, 4}));
  const std::string msg = create_error(bytes.load());
  EXPECT_EQ(msg.rfind("test.gguf: vocabulary: token 3 has type byte", 0), 0u) << msg;

  VocabBuilder nan;  // validate()
  nan.v.scores[0] = NAN;
  nan.v.source = "hand.gguf";
  EXPECT_EQ(create_error(nan.v), "hand.gguf: vocabulary: token 0 has a NaN score");
  nan.v.source.clear();
  EXPECT_EQ(create_error(nan.v), "vocabulary: token 0 has a NaN score");
}

TEST(VocabFromGguf, DefaultIdsOutsideATinyVocabAreDropped) {
  GgufVocab g;
  g.w.set("tokenizer.ggml.tokens", strings({"<unk>", "<s>"}));
  g.w.set("tokenizer.ggml.scores", floats(2));
  g.w.set("tokenizer.ggml.token_type", ints({2, 3}));
  const Vocab v = g.load();
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, -1);
  EXPECT_NO_THROW(Tokenizer::create(v));
}

}  // namespace
}  // namespace encore
