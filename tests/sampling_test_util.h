// Sampler parameter sets and logits shared by the sampling tests.
#pragma once

#include <cstdint>
#include <vector>

#include "encore/rng.h"
#include "encore/sampler.h"

namespace encore::test {

// Every stage off except temperature 1: plain softmax sampling.
inline SamplingParams plain() {
  SamplingParams p;
  p.temp = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.typical_p = 1.0f;
  p.repeat_penalty = 1.0f;
  p.repeat_last_n = 64;
  return p;
}

// Every stage on: the defaults (top_k 40, top_p 0.95, min_p 0.05, temp 0.8)
// plus penalties and typical.
inline SamplingParams busy_params() {
  SamplingParams p;
  p.repeat_penalty = 1.3f;
  p.repeat_last_n = 8;
  p.frequency_penalty = 0.1f;
  p.presence_penalty = 0.2f;
  p.typical_p = 0.97f;
  return p;
}

// n logits in [-2, 2) from the Philox stream of `seed`.
inline std::vector<float> varied_logits(size_t n, uint64_t seed) {
  std::vector<float> l(n);
  for (size_t i = 0; i < n; ++i) {
    l[i] = 4.0f * uniform_from_word(random_words(seed, 1, i)[0]) - 2.0f;
  }
  return l;
}

}  // namespace encore::test
