// Internals of the tokenizer module: the per-model factories and small text
// helpers shared by the tokenizers and the stream decoder.
// Not part of the public API. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "encore/tokenizer.h"

namespace encore::tokenizer_detail {

// One factory per Vocab::model; `vocab` has passed Tokenizer::create's checks.
std::unique_ptr<Tokenizer> make_spm(Vocab vocab);  // "llama"

// The U+2581 LOWER ONE EIGHTH BLOCK that SentencePiece writes for a space.
inline constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";

// What starts at byte i of s, by the well-formed UTF-8 table of the Unicode
// standard (Table 3-7: no overlongs, no surrogates, nothing above U+10FFFF).
enum class Utf8Kind {
  Complete,   // a well-formed sequence of `len` bytes
  Truncated,  // s ends after `len` bytes that are a valid start of a sequence
  Invalid,    // `len` bytes (>= 1) form a maximal ill-formed subpart
};
struct Utf8Seq {
  Utf8Kind kind;
  size_t len;
};
Utf8Seq scan_utf8(std::string_view s, size_t i);

// `s` with control and non-ASCII bytes escaped (\xNN) and cut after max_len
// bytes, for untrusted token texts in error messages.
std::string printable(std::string_view s, size_t max_len = 64);

}  // namespace encore::tokenizer_detail
