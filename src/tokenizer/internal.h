// Internals of the tokenizer module: the per-model factories and small text
// helpers shared by the tokenizers and the stream decoder.
// Not part of the public API. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "encore/tokenizer.h"
#include "util/text.h"

namespace encore::tokenizer_detail {

// One factory per Vocab::model; `vocab` has passed Tokenizer::create's checks.
std::unique_ptr<Tokenizer> make_spm(Vocab vocab);  // "llama"
std::unique_ptr<Tokenizer> make_bpe(Vocab vocab);  // "gpt2" (byte-level BPE, bpe.cpp)
std::unique_ptr<Tokenizer> make_wpm(Vocab vocab);  // "bert" (WordPiece, wpm.cpp)

// GPT-2's byte-level alphabet, in which byte-level BPE vocabularies spell
// their tokens: bytes 21..7E, A1..AC and AE..FF stand for the character of
// the same code point, the 68 others for U+0100.. in byte order (space 20 ->
// U+0120 'Ġ', newline 0A -> U+010A 'Ċ').
uint32_t byte_to_symbol(uint8_t b);
// The byte that code point `cp` stands for, or -1 if it is not in the
// alphabet.
int symbol_to_byte(uint32_t cp);
// `bytes` spelled in the alphabet (UTF-8).
std::string bytes_to_symbols(std::string_view bytes);
// The bytes a token text spelled in the alphabet stands for. Characters
// outside the alphabet, and ill-formed UTF-8, are copied as they are.
std::string symbols_to_bytes(std::string_view text);

// Throws InvalidArgument when `opt` asks for a BOS or EOS token that `v`
// has none of (as SentencePiece and byte-level BPE say it).
void check_bos_eos(const Vocab& v, const Tokenizer::EncodeOptions& opt);
// Throws InvalidArgument when `text` is longer than `max_bytes`, the most a
// model's encode can take (its limit depends on how its text grows).
void check_text_size(std::string_view text, size_t max_bytes);

// Appends code point `cp` (a Unicode scalar value) to `s` as UTF-8.
void append_utf8(std::string* s, uint32_t cp);

// The pieces (token_to_piece's source) that every model renders alike, as
// llama.cpp does: control, unknown and user-defined tokens render as their
// text, unused and undefined ones as nothing. Sets *piece (left as it is
// for the latter) and returns true for those; false for normal and byte
// tokens, which each model spells its own way.
bool common_piece(TokenType type, const std::string& text, std::string* piece);

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

// Untrusted token texts go into error messages through util::printable.
using util::printable;

}  // namespace encore::tokenizer_detail
