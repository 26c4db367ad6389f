// Pre-tokenizers of byte-level BPE vocabularies: the regex splits (and the
// Unicode normalisation some vocabularies apply first) that cut text into
// words before BPE merges run, chosen by tokenizer.ggml.pre.
//
// The reference for every pipeline is the Hugging Face `tokenizers` pipeline
// of the original model (normalizer + pre_tokenizer of its tokenizer.json);
// the patterns are those of llama.cpp (c392e509) where both agree, and the
// comments in pretokenizer.cpp say where they do not.
//
// Ownership: a PreTokenizer owns its compiled PCRE2 patterns (JIT-compiled
// when the library supports it), a few KiB each. Not copyable or movable.
// Thread-safety: immutable after construction; split() and normalize() may
// be called from any number of threads (match data is allocated per call).
// Cost: split() is linear in the text length for every supported pattern,
// with or without the JIT (see the comment on deepseek-llm's "\s+$" in
// pretokenizer.cpp); normalize() is linear and returns the input unchanged
// (no copy) unless it has to change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <unicode/uversion.h>

U_NAMESPACE_BEGIN
class Normalizer2;
U_NAMESPACE_END

namespace encore::tokenizer_detail {

class PreTokenizer {
 public:
  // A word: bytes [begin, begin + len) of the text given to split().
  struct Word {
    uint32_t begin;
    uint32_t len;
  };

  // Builds the pre-tokenizer named `pre` (tokenizer.ggml.pre). Throws
  // ModelError for a name it does not know, listing the known ones.
  explicit PreTokenizer(std::string_view pre);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // The names split() understands, in the order of the error message.
  static std::vector<std::string_view> known_names();

  // Cuts `text` (any bytes; at most 2^32 - 1 of them) into words that
  // together cover it exactly, in order, none empty. Bytes that are not
  // well-formed UTF-8 never match a pattern, so they end up in words of
  // their own or next to other unmatched bytes. Throws Error only if PCRE2
  // fails on its own (resource limits), which no supported pattern does.
  void split(std::string_view text, std::vector<Word>* words) const;

  // The text after the vocabulary's normaliser (Unicode NFC for qwen2 and
  // mpt, nothing for the others): `text` itself when nothing changes,
  // otherwise *storage holding the result. Ill-formed UTF-8 bytes are kept
  // as they are; only the well-formed runs between them are normalised.
  std::string_view normalize(std::string_view text, std::string* storage) const;

  // Hugging Face's BPE `ignore_merges` (Llama 3): a word that is a token as
  // a whole becomes that token without running the merges.
  bool ignore_merges() const { return ignore_merges_; }

 private:
  struct Stage;  // one split step (pretokenizer.cpp)

  std::vector<Stage> stages_;
  const U_ICU_NAMESPACE::Normalizer2* nfc_ = nullptr;  // ICU's shared instance; null: none
  bool ignore_merges_ = false;
};

}  // namespace encore::tokenizer_detail
