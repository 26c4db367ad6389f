// Tokenizer base: vocabulary checks, the model factory, special-token
// splitting, decoding and the streaming detokenizer.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <utility>

#include "encore/tokenizer.h"
#include "tokenizer/internal.h"

namespace encore {

namespace {

using tokenizer_detail::scan_utf8;
using tokenizer_detail::Utf8Kind;

constexpr uint8_t kLstrip = 1;
constexpr uint8_t kRstrip = 2;
constexpr uint8_t kEog = 4;

// The replacement character U+FFFD.
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

struct ModelEntry {
  std::string_view name;
  std::unique_ptr<Tokenizer> (*make)(Vocab);
};
// One row per supported tokenizer.ggml.model; new tokenizers add a row.
constexpr ModelEntry kModels[] = {
    {"llama", &tokenizer_detail::make_spm},
    {"gpt2", &tokenizer_detail::make_bpe},
    {"bert", &tokenizer_detail::make_wpm},
};

// The characters C's isspace() accepts in the "C" locale, which llama.cpp
// uses when stripping around special tokens.
bool is_c_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

void check_special_id(const Vocab& v, TokenId id, const char* what) {
  if (id < -1 || id >= v.n_vocab()) {
    throw ModelError(fmt::format("vocabulary: {} token id {} is outside [0, {}) (-1 = none)", what,
                                 id, v.n_vocab()));
  }
}

// Everything the Tokenizer constructors rely on, for hand-built vocabs as
// well as those read from GGUF.
void validate(const Vocab& v) {
  if (v.tokens.empty()) throw ModelError("vocabulary: no tokens");
  if (v.tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw ModelError(fmt::format("vocabulary: {} tokens is more than ids can count (2^31 - 1)",
                                 v.tokens.size()));
  }
  if (!v.scores.empty() && v.scores.size() != v.tokens.size()) {
    throw ModelError(
        fmt::format("vocabulary: {} scores for {} tokens", v.scores.size(), v.tokens.size()));
  }
  if (!v.types.empty() && v.types.size() != v.tokens.size()) {
    throw ModelError(
        fmt::format("vocabulary: {} token types for {} tokens", v.types.size(), v.tokens.size()));
  }
  for (size_t i = 0; i < v.scores.size(); ++i) {
    // NaN would break the strict ordering the merge queue relies on.
    if (std::isnan(v.scores[i])) {
      throw ModelError(fmt::format("vocabulary: token {} has a NaN score", i));
    }
  }
  for (size_t i = 0; i < v.types.size(); ++i) {
    const auto t = static_cast<int32_t>(v.types[i]);
    if (t < 0 || t > static_cast<int32_t>(TokenType::Byte)) {
      throw ModelError(fmt::format("vocabulary: token {} has type {} (valid: 0..6)", i, t));
    }
  }
  check_special_id(v, v.bos, "BOS");
  check_special_id(v, v.eos, "EOS");
  check_special_id(v, v.unk, "unknown");
  check_special_id(v, v.pad, "padding");
  check_special_id(v, v.sep, "separator");
  check_special_id(v, v.eot, "EOT");
  check_special_id(v, v.eom, "EOM");
  const std::pair<const std::vector<TokenId>*, const char*> lists[] = {
      {&v.lstrip, "lstrip"}, {&v.rstrip, "rstrip"}, {&v.extra_eog, "extra_eog"}};
  for (const auto& [list, name] : lists) {
    for (TokenId id : *list) {
      if (id < 0 || id >= v.n_vocab()) {
        throw ModelError(fmt::format("vocabulary: {} lists token id {}, outside [0, {})", name, id,
                                     v.n_vocab()));
      }
    }
  }
}

// Tokenizer::create, without the vocabulary's source in its messages.
std::unique_ptr<Tokenizer> create_from(Vocab vocab) {
  validate(vocab);
  for (const ModelEntry& m : kModels) {
    if (vocab.model == m.name) return m.make(std::move(vocab));
  }
  std::string supported;
  for (const ModelEntry& m : kModels) {
    if (!supported.empty()) supported += ", ";
    supported += m.name;
  }
  throw ModelError(fmt::format("tokenizer model '{}' is not supported yet (supported: {})",
                               tokenizer_detail::printable(vocab.model), supported));
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::create(Vocab vocab) {
  // One place names the file for every check, in validate() and in each
  // model's constructor alike.
  const std::string source = vocab.source;
  try {
    return create_from(std::move(vocab));
  } catch (const ModelError& e) {
    if (source.empty()) throw;
    throw ModelError(fmt::format("{}: {}", source, e.what()));
  }
}

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {
  const size_t n = vocab_.tokens.size();
  by_text_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = vocab_.tokens[i];
    // An empty text can never be matched; keeping it out of the map also
    // keeps it out of special-token splitting (an empty pattern matches
    // everywhere).
    if (t.empty()) continue;
    // A text listed twice maps to its last id, as llama.cpp's loader does.
    by_text_.insert_or_assign(std::string_view(t), static_cast<TokenId>(i));
    max_token_bytes_ = std::max(max_token_bytes_, t.size());
  }

  for (size_t i = 0; i < n; ++i) {
    const TokenType t = type_of(static_cast<TokenId>(i));
    const bool special =
        t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown;
    if (special && !vocab_.tokens[i].empty()) special_.push_back(static_cast<TokenId>(i));
  }
  // Longest text first; equal lengths by id so that the order (and thus the
  // result when two such texts overlap) is deterministic.
  std::stable_sort(special_.begin(), special_.end(), [this](TokenId a, TokenId b) {
    return vocab_.tokens[static_cast<size_t>(a)].size() >
           vocab_.tokens[static_cast<size_t>(b)].size();
  });

  flags_.assign(n, 0);
  for (TokenId id : vocab_.lstrip) flags_[static_cast<size_t>(id)] |= kLstrip;
  for (TokenId id : vocab_.rstrip) flags_[static_cast<size_t>(id)] |= kRstrip;
  for (TokenId id : {vocab_.eos, vocab_.eot, vocab_.eom}) {
    if (id >= 0) flags_[static_cast<size_t>(id)] |= kEog;
  }
  for (TokenId id : vocab_.extra_eog) flags_[static_cast<size_t>(id)] |= kEog;
}

Tokenizer::~Tokenizer() = default;

TokenId Tokenizer::find_token(std::string_view text) const {
  const auto it = by_text_.find(text);
  return it == by_text_.end() ? -1 : it->second;
}

bool Tokenizer::is_eog(TokenId id) const {
  return id >= 0 && id < n_vocab() && (flags_[static_cast<size_t>(id)] & kEog) != 0;
}

bool Tokenizer::is_control(TokenId id) const {
  return id >= 0 && id < n_vocab() && type_of(id) == TokenType::Control;
}

void Tokenizer::check_ranges(const std::vector<TextRange>& ranges, size_t text_size) {
  size_t prev_end = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const TextRange& r = ranges[i];
    if (r.begin > r.end || r.end > text_size || (i > 0 && r.begin < prev_end)) {
      throw InvalidArgument(fmt::format(
          "special_ranges[{}]: [{}, {}) is not an ascending, disjoint range within the {}-byte "
          "text",
          i, r.begin, r.end, text_size));
    }
    prev_end = r.end;
  }
}

void Tokenizer::check_id(TokenId id) const {
  if (id < 0 || id >= n_vocab()) {
    throw InvalidArgument(
        fmt::format("token id {} is outside the vocabulary [0, {})", id, n_vocab()));
  }
}

std::vector<Tokenizer::Fragment> Tokenizer::split_special(std::string_view text,
                                                          const EncodeOptions& opt) const {
  const std::vector<TextRange>* ranges = opt.parse_special ? opt.special_ranges : nullptr;
  if (ranges) check_ranges(*ranges, text.size());
  // Whether the occurrence of a Control/Unknown token text at text[at, at + len) may become
  // that token: everywhere, or only wholly inside one of the ranges.
  const auto allowed = [&](size_t at, size_t len) {
    if (!ranges) return true;
    const auto after = std::upper_bound(ranges->begin(), ranges->end(), at,
                                        [](size_t a, const TextRange& r) { return a < r.begin; });
    return after != ranges->begin() && at + len <= std::prev(after)->end;
  };
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back(Fragment{-1, text});
  std::vector<Fragment> next;
  for (TokenId id : special_) {
    const TokenType type = type_of(id);
    const bool user_defined = type == TokenType::UserDefined;
    if (!opt.parse_special && !user_defined) continue;
    const std::string_view pattern = vocab_.tokens[static_cast<size_t>(id)];
    const uint8_t flags = flags_[static_cast<size_t>(id)];
    // The first occurrence in `s` at or after `from` that may be cut out.
    const auto find = [&](std::string_view s, size_t from) {
      size_t pos = s.find(pattern, from);
      while (pos != std::string_view::npos && !user_defined &&
             !allowed(static_cast<size_t>(s.data() - text.data()) + pos, pattern.size())) {
        pos = s.find(pattern, pos + 1);
      }
      return pos;
    };
    next.clear();
    bool matched = false;
    for (const Fragment& f : frags) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      size_t pos = find(rest, 0);
      if (pos == std::string_view::npos) {
        next.push_back(f);
        continue;
      }
      matched = true;
      while (pos != std::string_view::npos) {
        std::string_view left = rest.substr(0, pos);
        if (flags & kLstrip) {
          while (!left.empty() && is_c_space(left.back())) left.remove_suffix(1);
        }
        if (!left.empty()) next.push_back(Fragment{-1, left});
        next.push_back(Fragment{id, {}});
        rest.remove_prefix(pos + pattern.size());
        if (flags & kRstrip) {
          while (!rest.empty() && is_c_space(rest.front())) rest.remove_prefix(1);
        }
        pos = find(rest, 0);
      }
      if (!rest.empty()) next.push_back(Fragment{-1, rest});
    }
    if (matched) frags.swap(next);
  }
  return frags;
}

std::string Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  check_id(id);
  const TokenType t = type_of(id);
  if (!render_special && (t == TokenType::Control || t == TokenType::Unknown)) return {};
  return pieces_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool render_special,
                              bool strip_leading_space) const {
  std::string out;
  bool strip = strip_leading_space && vocab_.add_space_prefix;
  for (TokenId id : ids) {
    std::string piece = token_to_piece(id, render_special);
    if (strip && !piece.empty()) {
      if (piece.front() == ' ') piece.erase(0, 1);
      strip = false;
    }
    out += piece;
  }
  return out;
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool strip_leading_space, bool render_special)
    : tok_(&tok),
      strip_pending_(strip_leading_space && tok.vocab().add_space_prefix),
      render_special_(render_special) {}

std::string StreamDecoder::push(TokenId id) {
  std::string piece = tok_->token_to_piece(id, render_special_);
  if (strip_pending_ && !piece.empty()) {
    if (piece.front() == ' ') piece.erase(0, 1);
    strip_pending_ = false;
  }
  pending_ += piece;
  std::string out;
  out.reserve(pending_.size());
  size_t i = 0;
  while (i < pending_.size()) {
    const auto seq = scan_utf8(pending_, i);
    if (seq.kind == Utf8Kind::Truncated) break;  // wait for the rest of the sequence
    if (seq.kind == Utf8Kind::Complete) {
      out.append(pending_, i, seq.len);
    } else {
      out += kReplacement;
    }
    i += seq.len;
  }
  pending_.erase(0, i);
  return out;
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto seq = scan_utf8(s, i);
    if (seq.kind != Utf8Kind::Complete) return false;
    i += seq.len;
  }
  return true;
}

std::string StreamDecoder::finish() {
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const auto seq = scan_utf8(pending_, i);
    if (seq.kind == Utf8Kind::Complete) {
      out.append(pending_, i, seq.len);
    } else {
      out += kReplacement;  // ill-formed, or cut off by the end of the stream
    }
    i += seq.len;
  }
  pending_.clear();
  return out;
}

namespace tokenizer_detail {

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

void check_bos_eos(const Vocab& v, const Tokenizer::EncodeOptions& opt) {
  if (opt.add_bos && v.bos < 0) {
    throw InvalidArgument("cannot add BOS: the vocabulary has no BOS token");
  }
  if (opt.add_eos && v.eos < 0) {
    throw InvalidArgument("cannot add EOS: the vocabulary has no EOS token");
  }
}

void check_text_size(std::string_view text, size_t max_bytes) {
  if (text.size() > max_bytes) {
    throw InvalidArgument(fmt::format("text of {} bytes is too long to tokenize (limit {} bytes)",
                                      text.size(), max_bytes));
  }
}

bool common_piece(TokenType type, const std::string& text, std::string* piece) {
  switch (type) {
    case TokenType::Normal:
    case TokenType::Byte:
      return false;
    case TokenType::Control:
    case TokenType::Unknown:
    case TokenType::UserDefined:
      *piece = text;
      return true;
    case TokenType::Unused:
    case TokenType::Undefined:
      break;
  }
  return true;  // never rendered, as in llama.cpp
}

Utf8Seq scan_utf8(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {Utf8Kind::Complete, 1};
  size_t need;        // continuation bytes after the lead byte
  uint8_t lo = 0x80;  // allowed range of the first continuation byte
  uint8_t hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {Utf8Kind::Invalid, 1};  // continuation byte, C0, C1 or F5..FF
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return {Utf8Kind::Truncated, k};
    const auto b = static_cast<uint8_t>(s[i + k]);
    const uint8_t l = k == 1 ? lo : 0x80;
    const uint8_t h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {Utf8Kind::Invalid, k};
  }
  return {Utf8Kind::Complete, need + 1};
}

}  // namespace tokenizer_detail

}  // namespace encore
