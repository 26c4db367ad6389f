// The generation loop: prompt ids in, generated ids out, one token at a time.
//
// Ownership: generate() borrows the ForwardContext (and through it the model
// and the KV pool) and the tokenizer; it owns one KvSequence for the request
// and returns its blocks to the pool however it exits. Not thread-safe: one
// call per ForwardContext at a time.
// Cost: one forward pass over the prompt, then one per generated token.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "encore/kv_cache.h"
#include "encore/model.h"
#include "encore/tokenizer.h"

namespace encore {

enum class FinishReason {
  Eog,      // the model produced an end-of-generation token (EOS, EOT ...)
  Length,   // n_predict tokens were generated
  Context,  // the context window is full
};
const char* finish_reason_name(FinishReason r);  // "eog", "length", "context"

struct GenerateParams {
  int32_t n_predict = -1;  // -1: until EOG or the context is full
  float temp = 0.8f;       // 0: greedy argmax (ties to the lowest id)
  uint64_t seed = 0;       // key of the token-draw RNG stream (see rng.h)
  // The prompt is run in steps of at most this many tokens (chunked
  // prefill; llama.cpp's -b). Changes speed and peak memory only: logits are
  // identical for every chunk size (see ForwardContext).
  int32_t prefill_chunk = 512;
};

struct GenerateResult {
  std::vector<TokenId> ids;  // generated ids (prompt excluded, EOG excluded)
  FinishReason finish = FinishReason::Length;
  double prompt_seconds = 0.0;
  double generate_seconds = 0.0;
};

// Called with each generated id as soon as it is chosen (never for EOG).
using TokenCallback = std::function<void(TokenId)>;

// Runs prompt_ids (must be non-empty: at least BOS) then generates.
// Throws InvalidArgument when the prompt alone does not fit the context or
// the tokenizer's vocabulary differs from the model's, ResourceExhausted when
// the KV pool cannot hold the context, and ModelError when every logit of a
// step is NaN (a broken model file).
GenerateResult generate(ForwardContext& ctx, const Tokenizer& tokenizer,
                        const std::vector<TokenId>& prompt_ids, const GenerateParams& params,
                        const TokenCallback& on_token);

}  // namespace encore
