// The built-in byte-level SentencePiece vocabulary of synthetic models.
//
// Ownership: returns plain values the caller owns. Cost: O(n_vocab) time and
// memory (a few bytes of text and one gguf::Value per token and array).
// Thread-safety: a pure function.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "encore/gguf.h"

namespace encore::synth {

// tokenizer.* metadata of an SPM ("llama") vocabulary of exactly n_vocab
// tokens (n_vocab >= 512): <unk>, <s>, </s>, the 256 byte-fallback tokens
// <0x00>..<0xFF>, then pieces over a small alphabet built so that every
// piece of length L is a shorter piece plus one character (so SPM merges
// can reach it), scored by creation order. Deterministic.
std::vector<std::pair<std::string, gguf::Value>> builtin_vocab_metadata(int n_vocab);

}  // namespace encore::synth
