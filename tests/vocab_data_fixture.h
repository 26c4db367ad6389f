// What the tokenizer data tests share (tokenizer_data_test.cpp: the
// SentencePiece vocabularies; tokenizer_bpe_data_test.cpp: byte-level BPE and
// WordPiece): a fixture that loads a vocabulary of ../shared with its
// llama.cpp test vectors, the random text both feed the tokenizers, and the
// UTF-8 checks on what they decode. The two tests ask different things of
// the same tokenizer interface, so only the plumbing lives here.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "encore/gguf.h"
#include "encore/tokenizer.h"
#include "shared_data.h"
#include "vocab_vectors.h"

namespace encore::test {

using Ids = std::vector<TokenId>;

// " 1 2 3": ids for failure messages.
inline std::string ids_str(const Ids& ids) {
  std::string s;
  for (TokenId id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

// Whether `s` is well-formed UTF-8 (no overlong two-byte leads, no lead byte
// above F4, no truncated sequence).
inline bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80                 ? 1
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

inline void append_utf8(std::string* s, uint32_t cp) {
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

// One kind of character random_utf8 draws; each test lists its own mix, so
// that a test stresses what its tokenizers are sensitive to.
using CodePointDraw = std::function<uint32_t(std::mt19937*)>;

// A code point uniformly in [lo, hi].
inline CodePointDraw code_points(uint32_t lo, uint32_t hi) {
  return
      [lo, hi](std::mt19937* rng) { return std::uniform_int_distribution<uint32_t>(lo, hi)(*rng); };
}

// One of the (ASCII) characters of `chars`.
inline CodePointDraw one_of(std::string chars) {
  return [chars](std::mt19937* rng) -> uint32_t {
    return chars[std::uniform_int_distribution<int>(0, static_cast<int>(chars.size()) - 1)(*rng)];
  };
}

// Always `cp`, without using the generator.
inline CodePointDraw always(uint32_t cp) {
  return [cp](std::mt19937*) { return cp; };
}

// A printable ASCII character (space to '~').
inline CodePointDraw printable_ascii() { return code_points(0x20, 0x7E); }

// Any Unicode scalar value but NUL.
inline CodePointDraw any_scalar() {
  return [](std::mt19937* rng) {
    uint32_t cp;
    do {
      cp = std::uniform_int_distribution<uint32_t>(1, 0x10FFFF)(*rng);
    } while (cp >= 0xD800 && cp <= 0xDFFF);
    return cp;
  };
}

// Valid UTF-8 of 0 to `max_len` code points, each drawn by one of `kinds`
// picked uniformly (list a kind twice to draw it twice as often).
inline std::string random_utf8(std::mt19937* rng, int max_len,
                               const std::vector<CodePointDraw>& kinds) {
  std::uniform_int_distribution<int> len(0, max_len);
  std::uniform_int_distribution<int> kind(0, static_cast<int>(kinds.size()) - 1);
  std::string s;
  for (int n = len(*rng); n > 0; --n) append_utf8(&s, kinds[static_cast<size_t>(kind(*rng))](rng));
  return s;
}

// `count` strings of 0 to `max_len - 1` random bytes (ill-formed UTF-8,
// NULs, control characters), the same ones on every run.
inline std::vector<std::string> hostile_bytes(int count, int max_len) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<std::string> out;
  for (int k = 0; k < count; ++k) {
    std::string s(static_cast<size_t>(byte(rng) % max_len), '\0');
    for (char& c : s) c = static_cast<char>(byte(rng));
    out.push_back(std::move(s));
  }
  return out;
}

// All that `d` shows for `ids`, pushed one at a time, then finished.
inline std::string stream_all(StreamDecoder* d, const Ids& ids) {
  std::string shown;
  for (TokenId id : ids) shown += d->push(id);
  shown += d->finish();
  return shown;
}

// `name` with every character but letters and digits made '_': a valid
// gtest parameter name.
inline std::string param_name(std::string name) {
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

// A vocabulary of the shared folder with its llama.cpp test vectors (the
// .inp and .out files beside it). `Case::file()` names the GGUF file,
// relative to the shared folder.
template <class Case>
class VocabVectorsTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    ENCORE_SHARED_FILE(path, this->GetParam().file());
    tok_ = Tokenizer::create(vocab_from_gguf(gguf::File::open(path)));
    inputs_ = read_inputs(path + ".inp");
    outputs_ = read_outputs(path + ".out");
  }
  Ids encode(std::string_view text) const { return tok_->encode(text, {}); }

  // Every input of the vectors encodes to its ids.
  void expect_vectors_match() const {
    ASSERT_EQ(inputs_.size(), outputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const Ids got = encode(inputs_[i]);
      EXPECT_EQ(got, outputs_[i]) << "line " << i << " \"" << escaped(inputs_[i], 300)
                                  << "\"\n  want" << ids_str(outputs_[i]) << "\n  got "
                                  << ids_str(got);
    }
  }

  std::unique_ptr<Tokenizer> tok_;
  std::vector<std::string> inputs_;
  std::vector<Ids> outputs_;
};

}  // namespace encore::test
