// The generation loop: prompt ids in, n samples of generated ids out.
//
// Reproducibility contract (docs/reproducibility.md): sample i of a request
// is a pure function of the model, the numerics settings (system
// fingerprint), the prompt ids, the sampling params, the stop strings, the
// context size and (seed, i). It does not depend on n, the thread count, the ISA, the prefill
// chunk size, other sequences in the same step, or on whether the
// generation was interrupted and resumed from a GenerationState.
//
// Ownership: generate() borrows the ForwardContext (and through it the model
// and the KV pool) and the tokenizer; it owns one KvSequence per sample and
// returns their blocks to the pool however it exits. Not thread-safe: one
// call per ForwardContext at a time.
// Cost: one forward pass over the prompt (shared by all samples), then one
// batched step per generated position for all unfinished samples.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "encore/kv_cache.h"
#include "encore/model.h"
#include "encore/sampler.h"
#include "encore/tokenizer.h"

namespace encore {

enum class FinishReason {
  Eog,      // the model produced an end-of-generation token (EOS, EOT ...)
  Length,   // n_predict tokens were generated
  Context,  // the context window is full
  Stop,     // a stop string appeared in the text
};
// "eog", "length", "context", "stop"; from_name throws InvalidArgument.
const char* finish_reason_name(FinishReason r);
FinishReason finish_reason_from_name(std::string_view name);

// The most stop strings, and the longest, a request may give (bounds the
// held-back text).
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopBytes = 256;
// The most alternatives per token --logprobs may ask for.
inline constexpr int kMaxTopLogprobs = 20;
// The most samples per request.
inline constexpr int kMaxSamples = 64;

struct GenerateParams {
  int32_t n_predict = -1;   // per sample and per call; -1: until EOG, a stop string or n_ctx
  SamplingParams sampling;  // repeat_last_n -1 = the context size
  uint64_t seed = 0;        // key of the RNG streams (rng.h); sample i uses stream i
  int32_t n_samples = 1;    // sample i draws from stream i whatever n is
  // -1: no logprobs; 0: the chosen token's; N: also the N most likely tokens.
  int32_t logprobs = -1;
  std::vector<std::string> stop;  // matched in the text across token boundaries
  // The prompt is run in steps of at most this many tokens (chunked
  // prefill; llama.cpp's -b). Changes speed and peak memory only.
  int32_t prefill_chunk = 512;
  // Drop the SPM dummy-prefix space of the first generated piece (the
  // prompt was BOS only), as llama.cpp renders it.
  bool strip_leading_space = false;

  // Throws InvalidArgument naming the field (sampling, stop strings, counts).
  void validate(int n_vocab) const;
};

// Everything needed to continue one sample exactly where it stopped: plain
// data, saved and restored by the caller (the CLI writes it as JSON).
struct SampleState {
  std::vector<TokenId> ids;  // generated so far (EOG excluded)
  SamplerState sampler;      // RNG counter and penalty window
  std::string held_text;     // decoded text held back: it may begin a stop string
  size_t held_shown = 0;     // bytes at its start already returned (a call that ended at -n
                             // shows all its text; they are not returned again)
  StreamDecoder::State decoder;
  std::optional<FinishReason> finished;  // eog, stop or context: nothing more to do
};

struct SampleResult {
  std::vector<TokenId> ids;            // generated in this call (EOG excluded; the ids of a stop
                                       // string are kept, its text is not)
  std::vector<LogprobEntry> logprobs;  // [ids.size()] when params.logprobs >= 0
  std::string text;                    // text of these ids, stop string and after cut
  FinishReason finish = FinishReason::Length;
};

struct GenerateResult {
  std::vector<SampleResult> samples;  // [n_samples]
  std::vector<SampleState> states;    // [n_samples] after this call: resume from here
  double prompt_seconds = 0.0;
  double generate_seconds = 0.0;
};

// Called with each sample's text as soon as it is safe to show (never
// inside a possible stop string); `id` is the token that produced it.
using TextCallback = std::function<void(int sample, TokenId id, std::string_view text)>;

// Runs prompt_ids (non-empty: at least BOS) then generates params.n_samples
// samples. With `resume` (one SampleState per sample, from an earlier call
// with the same prompt and params), each sample's KV is recomputed over
// prompt + its ids and generation continues from its state.
// Throws InvalidArgument when the prompt alone does not fit the context, the
// tokenizer's vocabulary differs from the model's or the params/resume state
// are invalid, ResourceExhausted when the KV pool cannot hold the samples,
// and ModelError when every logit of a step is NaN (a broken model file).
GenerateResult generate(ForwardContext& ctx, const Tokenizer& tokenizer,
                        const std::vector<TokenId>& prompt_ids, const GenerateParams& params,
                        const TextCallback& on_text,
                        const std::vector<SampleState>* resume = nullptr);

// XXH3-64 of the ids as little-endian int32, 16 hex digits: compares two
// outputs at a glance.
std::string output_hash(const std::vector<TokenId>& ids);

}  // namespace encore
