// Byte-level BPE ("gpt2" vocabularies: GPT-2, Llama 3, Qwen2, DeepSeek,
// Falcon, StarCoder, MPT ...), as Hugging Face's BPE model with a ByteLevel
// pre-tokenizer and decoder, which is what the models were trained with.
//
// Per raw-text fragment (after special tokens are split off): the
// vocabulary's normaliser (NFC for some), the pre-tokenizer's word split
// (pretokenizer.cpp), then per word: one symbol per byte (the token that
// spells that byte in GPT-2's byte alphabet), and adjacent symbols merged
// lowest merge rank first, leftmost first on equal ranks, until no adjacent
// pair has a merge. The merges come from tokenizer.ggml.merges ("left
// right", rank = index). Decoding maps the token texts back to bytes.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <queue>
#include <unordered_map>

#include "encore/tokenizer.h"
#include "tokenizer/internal.h"
#include "tokenizer/pretokenizer.h"

namespace encore {
namespace tokenizer_detail {
namespace {

constexpr bool self_mapped(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

constexpr std::array<uint16_t, 256> kByteToSymbol = [] {
  std::array<uint16_t, 256> t{};
  uint16_t next = 256;
  for (int b = 0; b < 256; ++b) t[b] = self_mapped(b) ? static_cast<uint16_t>(b) : next++;
  return t;
}();

// Inverse for U+0100..U+0143 (the 68 bytes that are not self-mapped).
constexpr std::array<uint8_t, 68> kShiftedToByte = [] {
  std::array<uint8_t, 68> t{};
  for (int b = 0; b < 256; ++b) {
    if (!self_mapped(b)) t[kByteToSymbol[b] - 256] = static_cast<uint8_t>(b);
  }
  return t;
}();

// The code point of a well-formed sequence of `len` bytes at s[i].
uint32_t decode_utf8(std::string_view s, size_t i, size_t len) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k])); };
  switch (len) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

}  // namespace

uint32_t byte_to_symbol(uint8_t b) { return kByteToSymbol[b]; }

int symbol_to_byte(uint32_t cp) {
  if (cp < 256) return self_mapped(static_cast<int>(cp)) ? static_cast<int>(cp) : -1;
  if (cp < 256 + kShiftedToByte.size()) return kShiftedToByte[cp - 256];
  return -1;
}

std::string bytes_to_symbols(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(&out, kByteToSymbol[static_cast<uint8_t>(c)]);
  return out;
}

std::string symbols_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Utf8Seq seq = scan_utf8(text, i);
    const int b =
        seq.kind == Utf8Kind::Complete ? symbol_to_byte(decode_utf8(text, i, seq.len)) : -1;
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out.append(text, i, seq.len);
    }
    i += seq.len;
  }
  return out;
}

namespace {

// Per-call cache of the ids of words already encoded in this call (prose
// repeats its words); heterogeneous lookup avoids a copy per probe.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct IdSpan {
  uint32_t begin;
  uint32_t len;
};
// Words longer than this are not cached (rarely repeated, and a 1 MiB word
// would double the call's memory); at most this many entries.
constexpr size_t kCacheMaxWordBytes = 128;
constexpr size_t kCacheMaxEntries = size_t{1} << 16;

// Merge ranks by pair of token ids: an open-addressing table (linear
// probing, at most half full; 16 bytes x 2-4 slots per merge). Every
// adjacent pair of every word is looked up, and std::unordered_map's node
// lookups were the largest cost in profiles; this table made encoding
// 1.7-1.9x faster.
class MergeTable {
 public:
  struct Entry {
    uint64_t key;  // kEmpty: free slot
    int32_t rank;
    TokenId result;
  };

  explicit MergeTable(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, Entry{kEmpty, 0, 0});
    mask_ = cap - 1;
  }
  static uint64_t key(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Keeps the first entry for a key (the lowest rank when inserted in order).
  void insert(uint64_t k, int32_t rank, TokenId result) {
    for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return;
      if (slots_[i].key == kEmpty) {
        slots_[i] = Entry{k, rank, result};
        return;
      }
    }
  }
  const Entry* find(uint64_t k) const {
    for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.key == k) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  // Token ids are >= 0, so no pair has all bits set.
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t hash(uint64_t k) {  // the 64-bit finaliser of MurmurHash3
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    k *= 0xC4CEB9FE1A85EC53ull;
    k ^= k >> 33;
    return k;
  }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(Vocab vocab);

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opt) const override;

 private:
  // Scratch space of one encode() call.
  struct Work {
    struct Symbol {
      TokenId id;  // -1: merged into its left neighbour
      int32_t prev;
      int32_t next;
    };
    struct Candidate {
      int32_t rank;
      int32_t left;
      int32_t right;
      TokenId left_id;
      TokenId right_id;
      TokenId result;
      // Lowest rank first; on equal ranks the leftmost pair (Hugging Face's
      // order; one rank is one pair, so only overlapping pairs such as the
      // two in "aaa" tie).
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    std::vector<Symbol> symbols;
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
    std::vector<PreTokenizer::Word> words;
    std::string normalized;
    std::unordered_map<std::string, IdSpan, StringHash, std::equal_to<>> cache;
    std::vector<TokenId> cached_ids;
  };

  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, Work* w, std::vector<TokenId>* out) const;
  void merge_word(std::string_view word, Work* w, std::vector<TokenId>* out) const;

  tokenizer_detail::PreTokenizer pre_;
  std::array<TokenId, 256> byte_token_;  // the token spelling each byte, -1 if none
  MergeTable merges_;
  // ignore_merges: raw bytes of each Normal token -> id (views into pieces_).
  std::unordered_map<std::string_view, TokenId> whole_words_;
};

BpeTokenizer::BpeTokenizer(Vocab vocab)
    : Tokenizer(std::move(vocab)), pre_(this->vocab().pre), merges_(this->vocab().merges.size()) {
  const Vocab& v = this->vocab();
  for (int b = 0; b < 256; ++b) {
    std::string sym;
    append_utf8(&sym, kByteToSymbol[static_cast<size_t>(b)]);
    byte_token_[static_cast<size_t>(b)] = find_token(sym);
  }

  if (v.merges.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw ModelError(fmt::format("vocabulary: {} merges is more than ranks can count (2^31 - 1)",
                                 v.merges.size()));
  }
  for (size_t rank = 0; rank < v.merges.size(); ++rank) {
    const std::string& m = v.merges[rank];
    // The separator is the first space after the first character (byte-level
    // token texts never contain a space; a leading one would be a text).
    const size_t sep = m.find(' ', 1);
    if (sep == std::string::npos) {
      throw ModelError(fmt::format(
          "vocabulary: merge {} '{}' is not of the form 'left right' (tokenizer.ggml.merges)", rank,
          printable(m)));
    }
    const std::string_view left(m.data(), sep);
    const std::string_view right(m.data() + sep + 1, m.size() - sep - 1);
    const TokenId a = find_token(left);
    const TokenId b = find_token(right);
    const TokenId ab = find_token(std::string(left) + std::string(right));
    // A merge whose parts or result are not tokens can never apply (symbols
    // are always tokens); Hugging Face refuses such a file, llama.cpp keeps
    // going, and so do we. A pair listed twice keeps its first (lowest) rank.
    if (a < 0 || b < 0 || ab < 0) continue;
    merges_.insert(MergeTable::key(a, b), static_cast<int32_t>(rank), ab);
  }

  // Added tokens are stored as their plain text, not byte-mapped (as
  // llama.cpp renders them). DeepSeek's user-defined "÷", "ø" ... are also
  // the byte-level symbols of the bytes F7, F8 ..., which UTF-8 never uses:
  // they render as "÷", "ø", so that the text "ø" (split off as that token)
  // round-trips; Hugging Face's decoder gives byte F8.
  pieces_.resize(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const std::string& t = v.tokens[i];
    if (!common_piece(type_of(static_cast<TokenId>(i)), t, &pieces_[i])) {
      pieces_[i] = symbols_to_bytes(t);  // normal and byte tokens
    }
  }
  if (pre_.ignore_merges()) {
    whole_words_.reserve(v.tokens.size());
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      if (type_of(static_cast<TokenId>(i)) == TokenType::Normal && !pieces_[i].empty()) {
        whole_words_.try_emplace(pieces_[i], static_cast<TokenId>(i));
      }
    }
  }
}

std::vector<TokenId> BpeTokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  const Vocab& v = vocab();
  check_bos_eos(v, opt);
  // Symbol indices are 32-bit, NFC may grow the text (at most 3x) and ICU
  // takes 32-bit lengths.
  constexpr size_t kMaxText = std::numeric_limits<int32_t>::max() / 4;
  check_text_size(text, kMaxText);

  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (opt.add_bos) out.push_back(v.bos);
  Work work;
  for (const Fragment& f : split_special(text, opt)) {
    if (f.id >= 0) {
      out.push_back(f.id);
      continue;
    }
    const std::string_view norm = pre_.normalize(f.text, &work.normalized);
    pre_.split(norm, &work.words);
    for (const PreTokenizer::Word& wd : work.words) {
      encode_word(norm.substr(wd.begin, wd.len), &work, &out);
    }
  }
  if (opt.add_eos) out.push_back(v.eos);
  return out;
}

void BpeTokenizer::encode_word(std::string_view word, Work* w, std::vector<TokenId>* out) const {
  if (pre_.ignore_merges()) {
    const auto it = whole_words_.find(word);
    if (it != whole_words_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {  // the common single-byte word needs no merges or cache
    const TokenId id = byte_token_[static_cast<uint8_t>(word[0])];
    if (id >= 0) out->push_back(id);
    return;
  }
  if (word.size() > kCacheMaxWordBytes) {
    merge_word(word, w, out);
    return;
  }
  if (const auto it = w->cache.find(word); it != w->cache.end()) {
    const IdSpan s = it->second;
    out->insert(out->end(), w->cached_ids.begin() + s.begin,
                w->cached_ids.begin() + s.begin + s.len);
    return;
  }
  const size_t first = out->size();
  merge_word(word, w, out);
  if (w->cache.size() < kCacheMaxEntries) {
    const IdSpan s{static_cast<uint32_t>(w->cached_ids.size()),
                   static_cast<uint32_t>(out->size() - first)};
    w->cached_ids.insert(w->cached_ids.end(), out->begin() + static_cast<ptrdiff_t>(first),
                         out->end());
    w->cache.emplace(std::string(word), s);
  }
}

void BpeTokenizer::merge_word(std::string_view word, Work* w, std::vector<TokenId>* out) const {
  auto& sym = w->symbols;
  sym.clear();
  for (char c : word) {
    const TokenId id = byte_token_[static_cast<uint8_t>(c)];
    // A byte the vocabulary cannot spell is dropped, as Hugging Face's BPE
    // does without an unk_token (the models here have none in their BPE
    // model, even where the GGUF names an unknown id: that is <|endoftext|>,
    // which must not appear mid-text). Falcon, StarCoder, Refact and MPT lack
    // some bytes (C0, C1, F5..FF, which UTF-8 never uses, and Falcon also
    // some control characters and F2; StarCoder F1). llama.cpp throws there.
    if (id < 0) continue;
    const auto i = static_cast<int32_t>(sym.size());
    sym.push_back(Work::Symbol{id, i - 1, i + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  auto& queue = w->queue;
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const MergeTable::Entry* m = merges_.find(MergeTable::key(sym[left].id, sym[right].id));
    if (m == nullptr) return;
    queue.push(Work::Candidate{m->rank, left, right, sym[left].id, sym[right].id, m->result});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Work::Candidate c = queue.top();
    queue.pop();
    Work::Symbol& left = sym[c.left];
    // Stale when either side has merged since: a symbol's id only ever
    // changes to a longer token at the same start, so it never comes back.
    if (left.id != c.left_id || left.next != c.right || sym[c.right].id != c.right_id) continue;
    Work::Symbol& right = sym[c.right];
    left.id = c.result;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.left;
    right.id = -1;
    try_add(left.prev, c.left);
    try_add(c.left, left.next);
  }
  for (int32_t i = 0; i != -1; i = sym[i].next) out->push_back(sym[i].id);
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe(Vocab vocab) {
  return std::make_unique<BpeTokenizer>(std::move(vocab));
}

}  // namespace tokenizer_detail
}  // namespace encore
