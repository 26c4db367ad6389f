#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "encore/engine.h"
#include "encore/error.h"
#include "encore/rng.h"
#include "encore/sampler.h"

namespace encore {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Greedy for temp == 0, otherwise one draw from stream (seed, sample 0,
// t = index of the generated token), purpose 0 (see rng.h).
TokenId choose(std::span<const float> logits, const GenerateParams& p, uint64_t t) {
  if (argmax(logits) < 0) {
    throw ModelError(fmt::format(
        "every logit of generated token {} is NaN: the model file's weights are broken", t));
  }
  if (p.temp <= 0.0f) return argmax(logits);
  const float u = uniform_from_word(random_words(p.seed, 0, t)[0]);
  return sample_softmax(logits, p.temp, u);
}

// Releases the sequence's blocks however generate() exits.
struct SequenceGuard {
  KvBlockPool& pool;
  KvSequence seq;
  ~SequenceGuard() { seq.release(pool); }
};

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Eog:
      return "eog";
    case FinishReason::Length:
      return "length";
    case FinishReason::Context:
      return "context";
  }
  return "?";
}

GenerateResult generate(ForwardContext& ctx, const Tokenizer& tokenizer,
                        const std::vector<TokenId>& prompt_ids, const GenerateParams& params,
                        const TokenCallback& on_token) {
  if (prompt_ids.empty()) throw InvalidArgument("generate: the prompt has no tokens (not even BOS)");
  const int32_t n_ctx = ctx.n_ctx();
  if (static_cast<int64_t>(prompt_ids.size()) > n_ctx) {
    throw InvalidArgument(fmt::format(
        "the prompt has {} tokens but the context size is {}: shorten the prompt or raise the "
        "context size",
        prompt_ids.size(), n_ctx));
  }
  const int n_vocab = ctx.model().hparams().n_vocab;
  if (tokenizer.n_vocab() != n_vocab) {
    throw InvalidArgument(fmt::format("the tokenizer has {} tokens but the model's vocabulary is {}",
                                      tokenizer.n_vocab(), n_vocab));
  }
  // Fail before the first token rather than halfway through the output: the
  // request may fill the whole context unless n_predict bounds it.
  KvBlockPool& pool = ctx.pool();
  int64_t needed = n_ctx;
  if (params.n_predict >= 0) {
    needed = std::min<int64_t>(n_ctx, static_cast<int64_t>(prompt_ids.size()) + params.n_predict);
  }
  const int64_t pool_tokens = static_cast<int64_t>(pool.n_free()) * pool.layout().block_tokens;
  if (pool_tokens < needed) {
    throw ResourceExhausted(fmt::format(
        "the KV cache has room for {} tokens ({} free blocks of {}) but this request may need {} "
        "(context size {}): raise the KV cache budget or lower the context size",
        pool_tokens, pool.n_free(), pool.layout().block_tokens, needed, n_ctx));
  }

  GenerateResult result;
  SequenceGuard guard{pool, {}};
  std::vector<float> logits(static_cast<size_t>(n_vocab));  // [n_vocab]

  auto start = std::chrono::steady_clock::now();
  if (params.prefill_chunk < 1) {
    throw InvalidArgument(
        fmt::format("prefill chunk size {} must be at least 1", params.prefill_chunk));
  }
  const size_t chunk = static_cast<size_t>(params.prefill_chunk);
  for (size_t begin = 0; begin < prompt_ids.size(); begin += chunk) {
    const size_t count = std::min(chunk, prompt_ids.size() - begin);
    const std::span<const TokenId> part(prompt_ids.data() + begin, count);
    const bool last = begin + count == prompt_ids.size();
    const SeqTokens entry{&guard.seq, part, last ? std::span<float>(logits) : std::span<float>()};
    ctx.step(std::span<const SeqTokens>(&entry, 1));
  }
  result.prompt_seconds = seconds_since(start);

  start = std::chrono::steady_clock::now();
  for (uint64_t t = 0;; ++t) {
    if (params.n_predict >= 0 && result.ids.size() >= static_cast<size_t>(params.n_predict)) {
      result.finish = FinishReason::Length;
      break;
    }
    const TokenId id = choose(logits, params, t);
    if (tokenizer.is_eog(id)) {
      result.finish = FinishReason::Eog;
      break;
    }
    result.ids.push_back(id);
    if (on_token) on_token(id);
    if (guard.seq.n_tokens >= n_ctx) {
      result.finish = FinishReason::Context;
      break;
    }
    const TokenId next[1] = {id};
    ctx.eval(guard.seq, next, logits);
  }
  result.generate_seconds = seconds_since(start);
  return result;
}

}  // namespace encore
