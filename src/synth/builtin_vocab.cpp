#include "synth/builtin_vocab.h"

#include <fmt/format.h>

#include <cassert>

namespace encore::synth {
namespace {

// GGUF tokenizer.ggml.token_type values.
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6;
constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

}  // namespace

std::vector<std::pair<std::string, gguf::Value>> builtin_vocab_metadata(int n_vocab) {
  assert(n_vocab >= 512);
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  tokens.reserve(n_vocab);
  auto add = [&](std::string piece, int32_t type) {
    tokens.push_back(std::move(piece));
    types.push_back(type);
  };
  add("<unk>", kUnknown);
  add("<s>", kControl);
  add("</s>", kControl);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), kByte);
  const int first_piece = static_cast<int>(tokens.size());

  // Level 1: the space mark and every printable ASCII character.
  add(kSpace, kNormal);
  for (char c = 0x21; c <= 0x7E && static_cast<int>(tokens.size()) < n_vocab; ++c) {
    add(std::string(1, c), kNormal);
  }
  // Longer levels: previous-level pieces extended by one lowercase letter in
  // English frequency order, so common-looking words appear first. A piece
  // may start with the space mark but never contain it later, as in real
  // SentencePiece vocabularies.
  const std::string letters = "etaoinshrdlucmfwypvbgkjqxz";
  std::vector<std::string> level = {kSpace};
  for (char c : letters) level.push_back(std::string(1, c));
  while (static_cast<int>(tokens.size()) < n_vocab) {
    std::vector<std::string> next;
    for (const std::string& prefix : level) {
      for (char c : letters) {
        if (static_cast<int>(tokens.size()) >= n_vocab) break;
        std::string piece = prefix + c;
        add(piece, kNormal);
        next.push_back(std::move(piece));
      }
    }
    level = std::move(next);
  }

  std::vector<gguf::Value> token_values, score_values, type_values;
  for (size_t i = 0; i < tokens.size(); ++i) {
    token_values.push_back(gguf::Value::make_string(tokens[i]));
    // Control/byte tokens score 0 like SentencePiece's; pieces score by
    // creation order, so shorter (earlier) merges win ties of length.
    const int idx = static_cast<int>(i);
    score_values.push_back(
        gguf::Value::make_f32(idx < first_piece ? 0.0f : -static_cast<float>(idx - first_piece)));
    type_values.push_back(gguf::Value::make_i32(types[i]));
  }
  std::vector<std::pair<std::string, gguf::Value>> kv;
  kv.emplace_back("tokenizer.ggml.model", gguf::Value::make_string("llama"));
  kv.emplace_back("tokenizer.ggml.pre", gguf::Value::make_string("default"));
  kv.emplace_back("tokenizer.ggml.tokens",
                  gguf::Value::make_array(gguf::ValueType::STRING, std::move(token_values)));
  kv.emplace_back("tokenizer.ggml.scores",
                  gguf::Value::make_array(gguf::ValueType::FLOAT32, std::move(score_values)));
  kv.emplace_back("tokenizer.ggml.token_type",
                  gguf::Value::make_array(gguf::ValueType::INT32, std::move(type_values)));
  kv.emplace_back("tokenizer.ggml.unknown_token_id", gguf::Value::make_u32(0));
  kv.emplace_back("tokenizer.ggml.bos_token_id", gguf::Value::make_u32(1));
  kv.emplace_back("tokenizer.ggml.eos_token_id", gguf::Value::make_u32(2));
  kv.emplace_back("tokenizer.ggml.add_bos_token", gguf::Value::make_bool(true));
  kv.emplace_back("tokenizer.ggml.add_eos_token", gguf::Value::make_bool(false));
  return kv;
}

}  // namespace encore::synth
