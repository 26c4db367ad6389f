// Vocabularies (from GGUF tokenizer.ggml.* metadata), tokenizers and the
// streaming detokenizer.
//
// Tokenizer::create() picks the implementation from Vocab::model, through the
// factory table in src/tokenizer/tokenizer.cpp: "llama" = SentencePiece BPE
// with byte fallback (as llama.cpp's llm_tokenizer_spm), "gpt2" = byte-level
// BPE with the pre-tokenizer named by Vocab::pre (as the models' Hugging Face
// tokenizers, including the NFC some of them apply), "bert" = WordPiece.
//
// Ownership: a Tokenizer owns its Vocab and lookup tables (about 3x the
// vocabulary's text size). A StreamDecoder borrows a Tokenizer, which must
// outlive it.
// Thread-safety: a Tokenizer is immutable after create(); every const method
// may be called from any number of threads. A StreamDecoder is not
// thread-safe (one per generation stream).
// Cost: encode is O(n log n) in the text length (priority-queue merges;
// byte-level BPE also runs its pre-tokenizer's regexes, linear) plus one
// substring search per special token when splitting on special tokens;
// token_to_piece and decode are O(output length). A byte-level BPE tokenizer
// also holds its merge table (16 bytes x 2-4 per merge).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "encore/error.h"

namespace encore {

namespace gguf {
class File;
}

using TokenId = int32_t;

// GGUF tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

// A vocabulary as plain data, from the tokenizer.ggml.* keys. Build one with
// vocab_from_gguf() or by hand (tests, synthetic models); Tokenizer::create()
// validates it.
struct Vocab {
  std::string model;                // tokenizer.ggml.model: "llama" (SPM), "gpt2" (BPE), "bert"
  std::string pre = "default";      // tokenizer.ggml.pre
  std::vector<std::string> tokens;  // [n_vocab] raw bytes of each token's text
  std::vector<float> scores;        // [n_vocab], or empty: all 0
  std::vector<TokenType> types;     // [n_vocab], or empty: all Normal
  std::vector<std::string> merges;  // BPE only: "left right", in rank order

  // Special ids; -1 = none.
  TokenId bos = -1, eos = -1, unk = -1, pad = -1, sep = -1, eot = -1, eom = -1;

  bool add_bos = true;           // callers should encode with add_bos (SPM default: true)
  bool add_eos = false;          // callers should encode with add_eos
  bool add_space_prefix = true;  // SPM: prepend "▁" to the text (the dummy prefix)

  // Special tokens that swallow the whitespace to their left / right when the
  // text is split on special tokens (llama.cpp's LSTRIP / RSTRIP token
  // attributes; not stored in GGUF, vocab_from_gguf derives them as llama.cpp
  // does).
  std::vector<TokenId> lstrip;
  std::vector<TokenId> rstrip;
  // End-of-generation ids besides eos/eot/eom (vocab_from_gguf: tokens whose
  // text marks an end of turn, as llama.cpp's EOG list).
  std::vector<TokenId> extra_eog;

  // Where the vocabulary came from (vocab_from_gguf: the file's path), put
  // in front of Tokenizer::create's error messages; "" for hand-built ones.
  std::string source;

  int32_t n_vocab() const { return static_cast<int32_t>(tokens.size()); }
};

// Reads the tokenizer.ggml.* keys of `f`. Applies llama.cpp's per-model
// defaults (SPM: bos 1, eos 2, unk 0 when their keys are absent; add_bos true,
// add_space_prefix true), finds EOT/EOM tokens by their text when their keys
// are absent ("<|eot_id|>", "<|im_end|>", "<|end|>", ...; such a token becomes
// Control), and sets the Phi-3 whitespace-strip attributes by general.name.
// Throws ModelError naming the file and key: missing tokenizer.ggml.model or
// tokenizer.ggml.tokens, a key of the wrong type, scores or token_type whose
// length differs from tokens, a special id outside [0, n_vocab); GgufError
// (from gguf::File) for an add_* flag that is not a bool.
Vocab vocab_from_gguf(const gguf::File& f);

// A byte range [begin, end) of a text.
struct TextRange {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const TextRange&) const = default;
};

class Tokenizer {
 public:
  struct EncodeOptions {
    bool add_bos = false;        // prepend vocab().bos (InvalidArgument if there is none)
    bool add_eos = false;        // append vocab().eos (InvalidArgument if there is none)
    bool parse_special = false;  // match Control/Unknown token texts ("<s>") in the text;
                                 // UserDefined tokens are always matched
    // With parse_special: when not null, a Control/Unknown token text is matched only where it
    // lies wholly inside one of these byte ranges of the text (ascending, disjoint, within the
    // text; InvalidArgument otherwise); everywhere else the text is plain text, exactly as
    // without parse_special. A chat prompt passes the ranges its template wrote
    // (RenderedChat::template_ranges, chat_template.h), so that message content never becomes
    // control tokens while the template's markers do. Borrowed for the encode call.
    const std::vector<TextRange>* special_ranges = nullptr;
  };

  // Validates `vocab` (sizes, special ids, byte tokens) and builds the
  // tokenizer for vocab.model. Throws ModelError for an inconsistent vocab or
  // an unsupported model ("<vocab.source>: tokenizer model 'x' is not
  // supported yet (supported: ...)"; without the prefix when source is "").
  static std::unique_ptr<Tokenizer> create(Vocab vocab);

  virtual ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text (any bytes) to ids. SPM and byte-level BPE tokenize invalid UTF-8
  // and NUL byte by byte (BPE drops a byte its vocabulary has no token for,
  // as Hugging Face does); WordPiece drops NUL, control characters and
  // ill-formed UTF-8, as BERT's cleaning does.
  virtual std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opt) const = 0;

  // Raw bytes of one token as it appears in text ("▁" -> " ", <0x0A> -> "\n").
  // Control and Unknown tokens render as "" unless render_special (then their
  // text); UserDefined tokens always render as their text; Unused/Undefined
  // as "". A single byte token may be part of a UTF-8 sequence, so the piece
  // need not be valid UTF-8. Throws InvalidArgument for an id outside
  // [0, n_vocab). Served from pieces_, which each subclass fills.
  std::string token_to_piece(TokenId id, bool render_special = false) const;

  // Concatenated pieces (raw bytes, not checked for UTF-8; use StreamDecoder
  // for display). strip_leading_space: when the vocab adds a dummy prefix,
  // drop one ' ' at the very start of the result (for text that follows BOS).
  std::string decode(std::span<const TokenId> ids, bool render_special = false,
                     bool strip_leading_space = false) const;

  const Vocab& vocab() const { return vocab_; }
  int32_t n_vocab() const { return vocab_.n_vocab(); }
  // The id whose text is exactly `text`, or -1.
  TokenId find_token(std::string_view text) const;
  // End of generation: eos, eot, eom or one of vocab().extra_eog.
  bool is_eog(TokenId id) const;
  bool is_control(TokenId id) const;

 protected:
  // `vocab` must have passed validation (see create()).
  explicit Tokenizer(Vocab vocab);

  // [n_vocab] raw bytes each token renders as (token_to_piece's source);
  // filled by the subclass constructor from the vocab's own spelling.
  std::vector<std::string> pieces_;

  // A piece of the input after splitting on special tokens: either a token
  // (id >= 0) or a run of raw text (id == -1, text non-empty).
  struct Fragment {
    TokenId id = -1;
    std::string_view text;
  };
  // Splits `text` on special-token texts as llama.cpp does: tokens are tried
  // longest text first, each one cutting every raw fragment at all its
  // occurrences, left to right. Only UserDefined tokens unless
  // opt.parse_special; Control/Unknown ones only inside opt.special_ranges
  // when given (an occurrence outside them is skipped and the search goes on
  // from its next byte). Throws InvalidArgument for malformed ranges.
  std::vector<Fragment> split_special(std::string_view text, const EncodeOptions& opt) const;

  // Throws InvalidArgument unless 0 <= id < n_vocab.
  void check_id(TokenId id) const;
  // Throws InvalidArgument unless `ranges` are ascending, disjoint and within the text.
  static void check_ranges(const std::vector<TextRange>& ranges, size_t text_size);
  TokenType type_of(TokenId id) const {
    return vocab_.types.empty() ? TokenType::Normal : vocab_.types[static_cast<size_t>(id)];
  }
  float score_of(TokenId id) const {
    return vocab_.scores.empty() ? 0.0f : vocab_.scores[static_cast<size_t>(id)];
  }
  size_t max_token_bytes() const { return max_token_bytes_; }

 private:
  Vocab vocab_;
  // Keys view the strings of vocab_.tokens (never modified after
  // construction; Tokenizer is neither copyable nor movable).
  std::unordered_map<std::string_view, TokenId> by_text_;
  std::vector<TokenId> special_;  // candidates for split_special, longest text first
  std::vector<uint8_t> flags_;    // [n_vocab] kLstrip | kRstrip | kEog
  size_t max_token_bytes_ = 0;
};

// Streaming detokenizer: feed ids one at a time, get back only complete UTF-8.
//
// Pieces are appended to a pending buffer; push() returns all of it except a
// trailing sequence that is still incomplete (at most 3 bytes, held back
// until the next push). Ill-formed bytes are replaced by U+FFFD, one
// per maximal ill-formed subpart (the Unicode "best practice"): a byte that
// cannot start a sequence (80..BF, C0, C1, F5..FF), or a lead byte plus the
// continuation bytes that were valid so far when a byte that cannot continue
// it arrives. finish() flushes a held-back incomplete sequence as one U+FFFD.
// So the output is always valid UTF-8, and for ids whose decode() is valid
// UTF-8 the concatenation of all push() results and finish() equals
// decode(ids, render_special, strip_leading_space).
// True if `s` is well-formed UTF-8 (Unicode Table 3-7: no truncated or
// overlong sequences, no surrogates). O(size).
bool is_valid_utf8(std::string_view s);

class StreamDecoder {
 public:
  // Borrows `tok` (must outlive this). strip_leading_space and render_special
  // as in Tokenizer::decode.
  explicit StreamDecoder(const Tokenizer& tok, bool strip_leading_space = false,
                         bool render_special = false);

  // Throws InvalidArgument for an id outside the vocabulary.
  std::string push(TokenId id);
  // The held-back bytes (as U+FFFD); call once at the end of the stream.
  std::string finish();

  // Everything push() depends on besides the tokenizer, as plain data: a
  // saved generation records it, and resuming checks it against a replay of
  // the ids (the replay is what restores it).
  struct State {
    std::string pending;  // bytes of an incomplete UTF-8 sequence (<= 3)
    bool strip_pending = false;
  };
  State state() const { return {pending_, strip_pending_}; }

 private:
  const Tokenizer* tok_;
  bool strip_pending_;
  bool render_special_;
  std::string pending_;  // bytes not yet returned: an incomplete UTF-8 sequence (<= 3 bytes)
};

}  // namespace encore
