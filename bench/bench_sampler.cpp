// Per-token cost of the sampler chain and of logprobs at real vocabulary
// sizes (32000: Llama 2; 151936: Qwen 2/3), to compare with the forward pass
// (a 1B model decodes at ~60 ms per token on 2 cores here).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "encore/isa.h"
#include "encore/rng.h"
#include "encore/sampler.h"

namespace {

using encore::SamplingParams;

// Logits shaped like a language model's: a few likely tokens, a long tail.
std::vector<float> fake_logits(int n_vocab) {
  std::vector<float> l(static_cast<size_t>(n_vocab));
  for (int i = 0; i < n_vocab; ++i) {
    const uint32_t w = encore::random_words(7, 0, static_cast<uint64_t>(i))[0];
    l[static_cast<size_t>(i)] = encore::uniform_from_word(w) * 12.0f - 6.0f;
  }
  for (int i = 0; i < 8; ++i) l[static_cast<size_t>(i * 997 % n_vocab)] = 9.0f + i;
  return l;
}

void run(benchmark::State& state, const SamplingParams& p) {
  const int n_vocab = static_cast<int>(state.range(0));
  const std::vector<float> logits = fake_logits(n_vocab);
  encore::Sampler s(p, 1, 0, encore::detect_best_isa());
  for (auto _ : state) {
    const encore::TokenId id = s.sample(logits);
    s.accept(id);
    benchmark::DoNotOptimize(id);
  }
}

void BM_Greedy(benchmark::State& state) {
  SamplingParams p;
  p.temp = 0.0f;
  run(state, p);
}

void BM_DefaultChain(benchmark::State& state) {  // llama.cpp defaults + penalties on
  SamplingParams p;
  p.repeat_penalty = 1.1f;
  run(state, p);
}

void BM_FullVocabDraw(benchmark::State& state) {  // temperature only: every token survives
  SamplingParams p;
  p.temp = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  run(state, p);
}

void BM_TopPNoTopK(benchmark::State& state) {  // top_p over the whole vocabulary (a sort)
  SamplingParams p;
  p.top_k = 0;
  run(state, p);
}

void BM_Logprobs(benchmark::State& state) {
  const int n_vocab = static_cast<int>(state.range(0));
  const std::vector<float> logits = fake_logits(n_vocab);
  const encore::Isa isa = encore::detect_best_isa();
  for (auto _ : state) benchmark::DoNotOptimize(encore::token_logprobs(logits, 5, 5, isa));
}

BENCHMARK(BM_Greedy)->Arg(32000)->Arg(151936)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DefaultChain)->Arg(32000)->Arg(151936)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FullVocabDraw)->Arg(32000)->Arg(151936)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopPNoTopK)->Arg(32000)->Arg(151936)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Logprobs)->Arg(32000)->Arg(151936)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
