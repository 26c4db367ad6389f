// vocab_from_gguf: the tokenizer.ggml.* keys of a GGUF file as a Vocab, with
// llama.cpp's per-model defaults and its text-based special-token detection.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

#include "encore/gguf.h"
#include "encore/tokenizer.h"

namespace encore {
namespace {

using gguf::Value;
using gguf::ValueType;

constexpr std::string_view kTokens = "tokenizer.ggml.tokens";

// Texts that mark the end of a turn (llama.cpp c392e509's lists). The first
// one present becomes eot when tokenizer.ggml.eot_token_id is absent; all
// present ones end generation.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
};
constexpr std::string_view kEomText = "<|eom_id|>";

class Reader {
 public:
  explicit Reader(const gguf::File& f) : f_(f) {}

  ModelError error(std::string_view key, std::string_view what) const {
    return ModelError(fmt::format("{}: {} {}", f_.path(), key, what));
  }

  // The array at `key` (nullptr if absent), checked to hold `n` elements
  // (n == 0: any number) that satisfy `elem_ok`.
  template <typename Pred>
  const Value* array(std::string_view key, size_t n, Pred elem_ok, const char* expected) const {
    const Value* v = f_.find(key);
    if (v == nullptr) return nullptr;
    if (v->type != ValueType::ARRAY || !elem_ok(v->elem)) {
      const std::string got = v->type == ValueType::ARRAY
                                  ? fmt::format("array of {}", gguf::value_type_name(v->elem))
                                  : std::string(gguf::value_type_name(v->type));
      throw error(key, fmt::format("has type {}, expected an array of {}", got, expected));
    }
    if (n != 0 && v->arr.size() != n) {
      throw error(key, fmt::format("has {} entries but {} has {}: the vocabulary is inconsistent",
                                   v->arr.size(), kTokens, n));
    }
    return v;
  }

  // Reads an id key into *id if present; it must be an integer in [0, n).
  bool id(std::string_view key, int32_t n, TokenId* id) const {
    const Value* v = f_.find(key);
    if (v == nullptr) return false;
    if (!v->is_integer()) {
      throw error(key, fmt::format("has type {}, expected an integer token id",
                                   gguf::value_type_name(v->type)));
    }
    const bool in_range = v->is_signed() ? v->i >= 0 && v->i < n : v->u < static_cast<uint64_t>(n);
    if (!in_range) {
      throw error(
          key,
          fmt::format("= {} is outside the vocabulary of {} tokens [0, {})",
                      v->is_signed() ? fmt::format("{}", v->i) : fmt::format("{}", v->u), n, n));
    }
    *id = static_cast<TokenId>(v->is_signed() ? v->i : static_cast<int64_t>(v->u));
    return true;
  }

 private:
  const gguf::File& f_;
};

// llama.cpp accepts float32 or int32 scores.
bool is_score_type(ValueType t) {
  return t == ValueType::FLOAT32 || t == ValueType::FLOAT64 || t == ValueType::INT32;
}

TokenType type_from_gguf(const Value& e) {
  const int64_t raw = e.is_signed() ? e.i : static_cast<int64_t>(std::min<uint64_t>(e.u, 1000));
  // Unknown codes are Undefined (never rendered), as llama.cpp treats them.
  if (raw < 0 || raw > static_cast<int64_t>(TokenType::Byte)) return TokenType::Undefined;
  return static_cast<TokenType>(raw);
}

// The id of the last token with text `t` (the one text lookups find), or -1.
TokenId last_with_text(const Vocab& v, std::string_view t) {
  for (size_t i = v.tokens.size(); i-- > 0;) {
    if (v.tokens[i] == t) return static_cast<TokenId>(i);
  }
  return -1;
}

// tokenizer.ggml.model and .pre: which tokenizer, and its pre-tokenizer.
void read_model(const Reader& r, const gguf::File& f, Vocab& v) {
  const Value* model = f.find("tokenizer.ggml.model");
  if (model == nullptr) {
    throw r.error("tokenizer.ggml.model",
                  "is missing: the file has no tokenizer (convert the model with its tokenizer)");
  }
  if (model->type != ValueType::STRING) {
    throw r.error("tokenizer.ggml.model", fmt::format("has type {}, expected a string",
                                                      gguf::value_type_name(model->type)));
  }
  v.model = model->s;
  if (const Value* pre = f.find("tokenizer.ggml.pre")) {
    if (pre->type != ValueType::STRING) {
      throw r.error("tokenizer.ggml.pre", fmt::format("has type {}, expected a string",
                                                      gguf::value_type_name(pre->type)));
    }
    v.pre = pre->s;
  }
}

// tokenizer.ggml.tokens: the vocabulary's texts (its size bounds every id).
void read_tokens(const Reader& r, Vocab& v) {
  const Value* tokens = r.array(
      kTokens, 0, [](ValueType t) { return t == ValueType::STRING; }, "strings");
  if (tokens == nullptr) {
    throw r.error(kTokens, "is missing: the file has no vocabulary");
  }
  if (tokens->arr.empty()) throw r.error(kTokens, "is empty");
  if (tokens->arr.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw r.error(kTokens,
                  fmt::format("has {} entries, more than ids can count", tokens->arr.size()));
  }
  v.tokens.reserve(tokens->arr.size());
  for (const Value& e : tokens->arr) v.tokens.push_back(e.s);
}

// Scores, token types and merges: arrays of one entry a token (merges: any
// number).
void read_token_arrays(const Reader& r, Vocab& v) {
  const size_t n = v.tokens.size();
  if (const Value* s = r.array("tokenizer.ggml.scores", n, is_score_type, "float32")) {
    v.scores.reserve(n);
    for (const Value& e : s->arr) {
      // A finite float64 beyond the float range would convert with undefined
      // behaviour (float32 values always fit).
      if (e.type == ValueType::FLOAT64 && std::isfinite(e.f) &&
          std::fabs(e.f) > std::numeric_limits<float>::max()) {
        throw r.error("tokenizer.ggml.scores",
                      fmt::format("has the score {} for token {}, beyond the float32 range", e.f,
                                  v.scores.size()));
      }
      v.scores.push_back(e.type == ValueType::INT32 ? static_cast<float>(e.i)
                                                    : static_cast<float>(e.f));
      if (std::isnan(v.scores.back())) {
        throw r.error("tokenizer.ggml.scores",
                      fmt::format("has a NaN score for token {}", v.scores.size() - 1));
      }
    }
  }
  if (const Value* t = r.array("tokenizer.ggml.token_type", n, gguf::is_integer_type, "int32")) {
    v.types.reserve(n);
    for (const Value& e : t->arr) v.types.push_back(type_from_gguf(e));
  } else {
    v.types.assign(n, TokenType::Normal);
  }
  if (const Value* m = r.array(
          "tokenizer.ggml.merges", 0, [](ValueType t) { return t == ValueType::STRING; },
          "strings")) {
    v.merges.reserve(m->arr.size());
    for (const Value& e : m->arr) v.merges.push_back(e.s);
  }
}

// The special ids: llama.cpp's per-model defaults, then the file's keys.
// Returns whether the file names eot and eom itself.
std::pair<bool, bool> read_special_ids(const Reader& r, const gguf::File& f, Vocab& v) {
  const auto n_vocab = static_cast<int32_t>(v.tokens.size());
  // Per-model defaults, as llama.cpp's loader; a default id outside the
  // vocabulary is dropped.
  const auto default_id = [n_vocab](TokenId id) { return id < n_vocab ? id : -1; };
  if (v.model == "llama") {
    v.bos = default_id(1);
    v.eos = default_id(2);
    v.unk = default_id(0);
    v.add_bos = true;
    v.add_space_prefix = true;
  } else if (v.model == "bert") {
    v.bos = default_id(101);
    v.unk = default_id(100);
    v.sep = default_id(102);
    v.pad = default_id(0);
    v.add_bos = true;
    // Word-initial WordPiece tokens are spelled "▁piece" in GGUF (llama.cpp's
    // phantom space), which acts like SPM's dummy prefix when decoding.
    v.add_space_prefix = true;
  } else {
    v.add_bos = false;
    v.add_space_prefix = false;
  }

  if (!r.id("tokenizer.ggml.bos_token_id", n_vocab, &v.bos)) {
    r.id("tokenizer.ggml.cls_token_id", n_vocab, &v.bos);  // BERT's [CLS] plays BOS
  }
  r.id("tokenizer.ggml.eos_token_id", n_vocab, &v.eos);
  r.id("tokenizer.ggml.unknown_token_id", n_vocab, &v.unk);
  // llama.cpp's key is spelled "seperator"; accept the correct spelling too.
  if (!r.id("tokenizer.ggml.seperator_token_id", n_vocab, &v.sep)) {
    r.id("tokenizer.ggml.separator_token_id", n_vocab, &v.sep);
  }
  r.id("tokenizer.ggml.padding_token_id", n_vocab, &v.pad);
  const bool has_eot = r.id("tokenizer.ggml.eot_token_id", n_vocab, &v.eot);
  const bool has_eom = r.id("tokenizer.ggml.eom_token_id", n_vocab, &v.eom);

  if (auto b = f.opt_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
  if (auto b = f.opt_bool("tokenizer.ggml.add_eos_token")) v.add_eos = *b;
  if (auto b = f.opt_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;
  return {has_eot, has_eom};
}

// End-of-turn tokens by text (llama.cpp's workaround for converters that
// do not write eot/eom ids). Like llama.cpp, such a token becomes Control
// so that it is hidden in output and matched only with parse_special.
void mark_end_of_turn(Vocab& v, bool has_eot, bool has_eom) {
  const auto make_control = [&v](TokenId id) {
    v.types[static_cast<size_t>(id)] = TokenType::Control;
  };
  for (std::string_view text : kEotTexts) {
    const TokenId id = last_with_text(v, text);
    if (id < 0) continue;
    if (!has_eot && v.eot < 0) v.eot = id;
    v.extra_eog.push_back(id);
    make_control(id);
  }
  if (const TokenId id = last_with_text(v, kEomText); id >= 0) {
    if (!has_eom) v.eom = id;
    v.extra_eog.push_back(id);
    make_control(id);
  }
}

// Phi-3 special tokens swallow the whitespace after them (llama.cpp keys
// this on general.name).
void phi3_rstrip(const gguf::File& f, Vocab& v) {
  const size_t n = v.tokens.size();
  std::string name = f.opt_string("general.name").value_or("");
  std::transform(name.begin(), name.end(), name.begin(),
                 [](char c) { return static_cast<char>(std::tolower(static_cast<uint8_t>(c))); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    const auto excluded = [](std::string_view t) {
      return t == "<unk>" || t == "<s>" || t == "<|endoftext|>";
    };
    for (size_t i = 0; i < n; ++i) {
      const TokenType t = v.types[i];
      const bool special =
          t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown;
      if ((special || v.tokens[i] == "</s>") && !excluded(v.tokens[i])) {
        v.rstrip.push_back(static_cast<TokenId>(i));
      }
    }
  }
}

}  // namespace

Vocab vocab_from_gguf(const gguf::File& f) {
  const Reader r(f);
  Vocab v;
  v.source = f.path();
  read_model(r, f, v);
  read_tokens(r, v);
  read_token_arrays(r, v);
  const auto [has_eot, has_eom] = read_special_ids(r, f, v);
  mark_end_of_turn(v, has_eot, has_eom);
  phi3_rstrip(f, v);
  return v;
}

}  // namespace encore
