// SentencePiece BPE with byte fallback ("llama" vocabularies), matching
// llama.cpp's llm_tokenizer_spm (reference: llama.cpp c392e509).
//
// Per raw-text fragment: spaces become U+2581, the dummy prefix U+2581 goes in
// front of the text and of every fragment that follows a special token (as
// llama.cpp does), the text is cut into characters by their UTF-8 lead byte,
// and adjacent symbols are merged greedily by the score of the token they
// form (highest first, leftmost on ties). Symbols that are not tokens in the
// end are spelled with <0xXX> byte tokens.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <queue>

#include "encore/tokenizer.h"
#include "tokenizer/internal.h"

namespace encore {
namespace {

using tokenizer_detail::check_bos_eos;
using tokenizer_detail::check_text_size;
using tokenizer_detail::common_piece;
using tokenizer_detail::kSpaceMarker;
using tokenizer_detail::printable;

// Length of a UTF-8 sequence from its lead byte's high nibble, the way
// llama.cpp groups characters: no validation, so a stray continuation or an
// invalid lead byte is a 1-byte (or, for F8..FF, a 4-byte) symbol of its own.
size_t lead_byte_len(uint8_t b) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[b >> 4];
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte a "<0xHH>" text stands for, or -1.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  const int hi = hex_value(t[3]);
  const int lo = hex_value(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(Vocab vocab);

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opt) const override;

 private:
  // Appends the ids of one raw-text fragment (already escaped) to `out`.
  void encode_escaped(std::string_view text, std::vector<TokenId>* out) const;
  // Appends the byte-fallback ids of a symbol that is not a token.
  void encode_bytes(std::string_view symbol, std::vector<TokenId>* out) const;

  std::array<TokenId, 256> byte_token_;  // id that spells each byte value, -1 if none
};

SpmTokenizer::SpmTokenizer(Vocab vocab) : Tokenizer(std::move(vocab)) {
  const Vocab& v = this->vocab();
  // As llama.cpp's byte_to_token: the "<0xXX>" token (upper-case hex), else a
  // token whose text is the byte itself.
  for (int b = 0; b < 256; ++b) {
    TokenId id = find_token(fmt::format("<0x{:02X}>", b));
    if (id < 0) id = find_token(std::string(1, static_cast<char>(b)));
    byte_token_[static_cast<size_t>(b)] = id;
  }

  pieces_.resize(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const std::string& t = v.tokens[i];
    const TokenType type = type_of(static_cast<TokenId>(i));
    if (common_piece(type, t, &pieces_[i])) continue;
    if (type == TokenType::Byte) {
      const int b = parse_byte_token(t);
      if (b < 0) {
        throw ModelError(fmt::format(
            "vocabulary: token {} has type byte but its text '{}' is not of the form <0xHH>", i,
            printable(t)));
      }
      pieces_[i] = std::string(1, static_cast<char>(b));
      continue;
    }
    std::string& p = pieces_[i];  // a normal token: every U+2581 is a space
    p.reserve(t.size());
    for (size_t k = 0; k < t.size();) {
      if (std::string_view(t).substr(k, kSpaceMarker.size()) == kSpaceMarker) {
        p += ' ';
        k += kSpaceMarker.size();
      } else {
        p += t[k++];
      }
    }
  }
}

std::vector<TokenId> SpmTokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  const Vocab& v = vocab();
  check_bos_eos(v, opt);
  // Symbol offsets are 32-bit; the escaped text grows by up to 3x.
  constexpr size_t kMaxText = (std::numeric_limits<int32_t>::max() - 3) / 3;
  check_text_size(text, kMaxText);

  std::vector<TokenId> out;
  if (opt.add_bos) out.push_back(v.bos);
  bool after_special = true;  // the start of the text counts as "after a special token"
  std::string escaped;
  for (const Fragment& f : split_special(text, opt)) {
    if (f.id >= 0) {
      out.push_back(f.id);
      after_special = true;
      continue;
    }
    escaped.clear();
    if (v.add_space_prefix && after_special) escaped += kSpaceMarker;
    for (char c : f.text) {
      if (c == ' ') {
        escaped += kSpaceMarker;
      } else {
        escaped += c;
      }
    }
    encode_escaped(escaped, &out);
    after_special = false;
  }
  if (opt.add_eos) out.push_back(v.eos);
  return out;
}

void SpmTokenizer::encode_escaped(std::string_view text, std::vector<TokenId>* out) const {
  if (text.empty()) return;

  // The symbols form a doubly linked list over `text`; a symbol merged into
  // its left neighbour keeps len 0.
  struct Symbol {
    uint32_t start;
    uint32_t len;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> sym;  // [n_chars]
  sym.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(lead_byte_len(static_cast<uint8_t>(text[off])), text.size() - off);
    const auto idx = static_cast<int32_t>(sym.size());
    sym.push_back(Symbol{static_cast<uint32_t>(off), static_cast<uint32_t>(len), idx - 1,
                         off + len == text.size() ? -1 : idx + 1});
    off += len;
  }

  // A candidate merge of `left` with its right neighbour into a token of
  // `score`. Entries go stale when either side changes; `len` (the two
  // lengths summed when queued) detects that, since lengths only grow.
  struct Candidate {
    float score;
    int32_t left;
    uint32_t len;
  };
  // Highest score on top; on equal scores the leftmost pair.
  const auto lower = [](const Candidate& a, const Candidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower)> queue(lower);

  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const size_t len = size_t{sym[left].len} + sym[right].len;
    if (len > max_token_bytes()) return;  // no token is that long
    const TokenId id = find_token(text.substr(sym[left].start, len));
    if (id < 0) return;
    queue.push(Candidate{score_of(id), left, static_cast<uint32_t>(len)});
  };

  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = sym[c.left];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = sym[left.next];
    if (right.len == 0 || left.len + right.len != c.len) continue;  // stale

    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.left;

    try_add(left.prev, c.left);
    try_add(c.left, left.next);
  }

  for (int32_t i = 0; i != -1; i = sym[i].next) {
    const std::string_view s = text.substr(sym[i].start, sym[i].len);
    const TokenId id = find_token(s);
    if (id >= 0) {
      out->push_back(id);
    } else {
      encode_bytes(s, out);
    }
  }
}

void SpmTokenizer::encode_bytes(std::string_view symbol, std::vector<TokenId>* out) const {
  for (char c : symbol) {
    if (byte_token_[static_cast<uint8_t>(c)] < 0) {
      // Without byte fallback the whole character becomes the unknown token.
      if (vocab().unk >= 0) {
        out->push_back(vocab().unk);
        return;
      }
      throw InvalidArgument(fmt::format(
          "cannot tokenize byte 0x{:02X}: the vocabulary has no <0x{:02X}> token and no "
          "unknown token",
          static_cast<uint8_t>(c), static_cast<uint8_t>(c)));
    }
  }
  for (char c : symbol) out->push_back(byte_token_[static_cast<uint8_t>(c)]);
}

}  // namespace

namespace tokenizer_detail {

std::unique_ptr<Tokenizer> make_spm(Vocab vocab) {
  return std::make_unique<SpmTokenizer>(std::move(vocab));
}

}  // namespace tokenizer_detail
}  // namespace encore
