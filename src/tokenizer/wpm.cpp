// WordPiece ("bert" vocabularies: BERT and the embedding models built on it,
// e.g. BAAI/bge-small-en-v1.5), as Hugging Face's BertNormalizer +
// BertPreTokenizer + WordPiece model of an uncased BERT.
//
// Per raw-text fragment (after special tokens are split off):
//  1. clean: drop NUL, U+FFFD (ill-formed UTF-8 counts as U+FFFD) and
//     control, format and private-use characters (VT, FF and U+0085 too,
//     though Unicode calls them white space); tab, newline, CR and other
//     white space become ' ', and CJK ideographs get a space on both sides
//     (so each is a word of its own);
//  2. strip accents (NFD, then drop nonspacing marks, Mn) and lowercase; the
//     NFD is not undone, so Hangul syllables end up as their jamo, as in BERT;
//  3. split on white space and isolate each punctuation character (ASCII
//     punctuation or a Unicode P* character);
//  4. per word, greedy longest match first from the left: a word longer than
//     100 characters, or one with a position that no token matches, becomes
//     the unknown token as a whole.
// GGUF files spell WordPiece vocabularies with llama.cpp's "phantom space":
// a word-initial piece is "▁piece" and a continuation piece is "piece"
// (Hugging Face's "##piece"); bracketed tokens ([CLS], [unused0]) keep their
// text. Decoding renders "▁" as a space, so decode(ids, false, true) gives
// the lowercased words separated by single spaces (Hugging Face's decoder
// also glues punctuation back on, "hello , world" -> "hello, world"; that
// display heuristic is not done here).
//
// Unicode tables are ICU's; Hugging Face uses older Rust tables for the
// categories, so characters assigned in recent Unicode versions may be kept
// here where it drops them as unassigned.
#include <fmt/format.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <limits>

#include "encore/tokenizer.h"
#include "tokenizer/internal.h"

namespace encore {
namespace tokenizer_detail {
namespace {

// Hugging Face's BertPreTokenizer limit (max_input_chars_per_word).
constexpr size_t kMaxWordChars = 100;

// The CJK ideograph blocks BERT pads with spaces (Hugging Face's list, which
// starts the Extension C-F range at U+2B920 where Google's BERT has U+2B820).
bool is_cjk(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool is_space(uint32_t c) {
  return c == '\t' || c == '\n' || c == '\r' || u_isUWhiteSpace(static_cast<UChar32>(c));
}

// What BERT's cleaning drops: control, format, private-use and surrogate
// characters (but not unassigned ones, which make their word [UNK]).
bool is_other(uint32_t c) {
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_PRIVATE_USE_CHAR:
    case U_SURROGATE:
      return true;
    default:
      return false;
  }
}

bool is_punct(uint32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
      (c >= 123 && c <= 126)) {
    return true;  // ASCII punctuation, which includes the symbols $+<=>^`|~
  }
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_CONNECTOR_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

// Calls f(code point) for each character of s; each ill-formed subpart is
// U+FFFD.
template <typename F>
void for_each_code_point(std::string_view s, F f) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Seq seq = scan_utf8(s, i);
    if (seq.kind != Utf8Kind::Complete) {
      f(0xFFFDu);
    } else {
      const auto b = [&](size_t k) {
        return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k]));
      };
      uint32_t cp;
      switch (seq.len) {
        case 1:
          cp = b(0);
          break;
        case 2:
          cp = ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
          break;
        case 3:
          cp = ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
          break;
        default:
          cp = ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
          break;
      }
      f(cp);
    }
    i += seq.len;
  }
}

class WpmTokenizer final : public Tokenizer {
 public:
  explicit WpmTokenizer(Vocab vocab);

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opt) const override;

 private:
  // Steps 1-2 of the header comment: cleaned, accent-stripped, lowercased.
  std::string normalize(std::string_view text) const;
  // Step 4 for one word (UTF-8, `n_chars` characters).
  void encode_word(std::string_view word, size_t n_chars, std::string* buf,
                   std::vector<TokenId>* out) const;

  const icu::Normalizer2* nfd_;  // ICU's shared instance
};

WpmTokenizer::WpmTokenizer(Vocab vocab) : Tokenizer(std::move(vocab)) {
  UErrorCode status = U_ZERO_ERROR;
  nfd_ = icu::Normalizer2::getNFDInstance(status);
  if (U_FAILURE(status) || nfd_ == nullptr) {
    throw ModelError(
        fmt::format("ICU cannot load its NFD normalizer data ({})", u_errorName(status)));
  }
  const Vocab& v = this->vocab();
  pieces_.resize(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const std::string& t = v.tokens[i];
    if (common_piece(type_of(static_cast<TokenId>(i)), t, &pieces_[i])) continue;
    // A normal or byte token: the phantom space of a word-initial piece is
    // a space.
    if (std::string_view(t).substr(0, kSpaceMarker.size()) == kSpaceMarker) {
      pieces_[i].reserve(t.size() - kSpaceMarker.size() + 1);
      pieces_[i] += ' ';
      pieces_[i].append(t, kSpaceMarker.size());
    } else {
      pieces_[i] = t;
    }
  }
}

std::string WpmTokenizer::normalize(std::string_view text) const {
  std::string cleaned;
  cleaned.reserve(text.size() + 8);
  for_each_code_point(text, [&](uint32_t c) {
    // Tab, newline and CR are spaces; other control characters are dropped
    // even where Unicode calls them white space (VT, FF, U+0085).
    if (c == 0 || c == 0xFFFD) return;
    if (c == '\t' || c == '\n' || c == '\r') {
      cleaned += ' ';
    } else if (is_other(c)) {
      return;
    } else if (is_space(c)) {
      cleaned += ' ';
    } else if (is_cjk(c)) {
      cleaned += ' ';
      append_utf8(&cleaned, c);
      cleaned += ' ';
    } else {
      append_utf8(&cleaned, c);
    }
  });
  std::string decomposed;
  decomposed.reserve(cleaned.size() + cleaned.size() / 4);
  icu::StringByteSink<std::string> sink(&decomposed);
  UErrorCode status = U_ZERO_ERROR;
  nfd_->normalizeUTF8(0, icu::StringPiece(cleaned.data(), static_cast<int32_t>(cleaned.size())),
                      sink, nullptr, status);
  if (U_FAILURE(status)) {
    throw Error(fmt::format("ICU NFD normalisation failed: {}", u_errorName(status)));
  }
  std::string out;
  out.reserve(decomposed.size());
  for_each_code_point(decomposed, [&](uint32_t c) {
    if (u_charType(static_cast<UChar32>(c)) == U_NON_SPACING_MARK) return;
    // Simple lowercase mapping: the one character whose full lowercase is
    // longer (U+0130) was decomposed and stripped above already.
    append_utf8(&out, static_cast<uint32_t>(u_tolower(static_cast<UChar32>(c))));
  });
  return out;
}

std::vector<TokenId> WpmTokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  const Vocab& v = vocab();
  // BERT's sequence ends with [SEP]; GGUF files give it as the separator,
  // not as EOS.
  const TokenId end = v.eos >= 0 ? v.eos : v.sep;
  if (opt.add_bos && v.bos < 0) {
    throw InvalidArgument("cannot add BOS ([CLS]): the vocabulary has none");
  }
  if (opt.add_eos && end < 0) {
    throw InvalidArgument("cannot add EOS ([SEP]): the vocabulary has neither");
  }
  // CJK padding triples a character at most and NFD grows text by a bounded
  // factor; ICU takes 32-bit lengths.
  constexpr size_t kMaxText = std::numeric_limits<int32_t>::max() / 8;
  check_text_size(text, kMaxText);

  std::vector<TokenId> out;
  if (opt.add_bos) out.push_back(v.bos);
  std::string buf;
  for (const Fragment& f : split_special(text, opt)) {
    if (f.id >= 0) {
      out.push_back(f.id);
      continue;
    }
    const std::string norm = normalize(f.text);
    size_t word_begin = 0;
    size_t word_chars = 0;
    size_t pos = 0;
    const auto flush = [&](size_t end_pos) {
      if (end_pos > word_begin) {
        encode_word(std::string_view(norm).substr(word_begin, end_pos - word_begin), word_chars,
                    &buf, &out);
      }
      word_chars = 0;
    };
    for_each_code_point(norm, [&](uint32_t c) {
      const size_t len = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
      if (is_space(c)) {
        flush(pos);
        word_begin = pos + len;
      } else if (is_punct(c)) {
        flush(pos);
        encode_word(std::string_view(norm).substr(pos, len), 1, &buf, &out);
        word_begin = pos + len;
      } else {
        ++word_chars;
      }
      pos += len;
    });
    flush(pos);
  }
  if (opt.add_eos) out.push_back(end);
  return out;
}

void WpmTokenizer::encode_word(std::string_view word, size_t n_chars, std::string* buf,
                               std::vector<TokenId>* out) const {
  const TokenId unk = vocab().unk;
  const auto unknown = [&] {
    // Without an unknown token the word is dropped (nothing else can stand
    // for it); every BERT vocabulary has [UNK].
    if (unk >= 0) out->push_back(unk);
  };
  if (n_chars > kMaxWordChars) {
    unknown();
    return;
  }
  const size_t first = out->size();
  size_t start = 0;
  while (start < word.size()) {
    TokenId found = -1;
    size_t end = word.size();
    while (end > start) {
      const std::string_view piece = word.substr(start, end - start);
      // A continuation piece starting with a literal "▁" would find a
      // word-initial token; in Hugging Face's spelling ("##▁...") there is
      // no such token.
      const bool ambiguous = start > 0 && piece.substr(0, kSpaceMarker.size()) == kSpaceMarker;
      if (!ambiguous &&
          piece.size() + (start == 0 ? kSpaceMarker.size() : 0) <= max_token_bytes()) {
        buf->clear();
        if (start == 0) buf->append(kSpaceMarker);
        buf->append(piece);
        found = find_token(*buf);
        if (found >= 0) break;
      }
      // One character shorter: step back over continuation bytes (the word
      // is well-formed UTF-8: it came out of ICU).
      do {
        --end;
      } while (end > start && (static_cast<uint8_t>(word[end]) & 0xC0) == 0x80);
    }
    if (found < 0) {
      out->resize(first);
      unknown();
      return;
    }
    out->push_back(found);
    start = end;
  }
}

}  // namespace

std::unique_ptr<Tokenizer> make_wpm(Vocab vocab) {
  return std::make_unique<WpmTokenizer>(std::move(vocab));
}

}  // namespace tokenizer_detail
}  // namespace encore
