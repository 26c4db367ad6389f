// A plain double-precision forward pass over a loaded Model, for tests: the
// yardstick the optimised ForwardContext is compared against.
//
// It shares nothing with src/model/forward.cpp but the loaded weights (and
// kernels::get_row to dequantise them): every step is written out the
// obvious way, in double, with std::exp/std::sin/std::cos. It covers what the
// loaders accept: llama, qwen2 (QKV biases), qwen3 (per-head QK RMSNorm), GQA,
// partial RoPE (n_rot < head_dim), both RoPE layouts, linear RoPE scaling
// (rope_freq_scale), rope_freqs divisors and tied output heads.
//
// The only rounding it shares with the engine is the weights' own (their
// stored type, dequantised to float). Activations are never rounded to F16,
// so a ForwardContext with an F16 KV cache differs from it by more than one
// with F32 entries.
//
// Cost: O(n_tokens * params + n_tokens^2 * n_layer * n_embd) multiply-adds,
// every matrix dequantised once per call; meant for models of a few MB and
// sequences of tens of tokens. Thread-safety: reentrant (reads the Model).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "encore/model.h"

namespace encore::test {

// Logits at every position: [n_tokens][n_vocab]. Throws std::out_of_range
// for a token id outside [0, n_vocab), std::invalid_argument for no tokens.
std::vector<std::vector<double>> reference_logits_all(const Model& model,
                                                      std::span<const int32_t> tokens);

// Logits after the last of `tokens`: [n_vocab].
std::vector<double> reference_logits(const Model& model, std::span<const int32_t> tokens);

}  // namespace encore::test
