// Helpers of the engine tests: synthetic prompts, a full-distribution
// request, and a bit-for-bit comparison of two responses.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "encore/request.h"

namespace encore {

inline std::vector<TokenId> prompt_of(int n, int salt) {
  std::vector<TokenId> ids = {1};
  for (int i = 1; i < n; ++i) ids.push_back(3 + (i * 37 + salt * 101) % 500);
  return ids;
}

inline Request request(std::vector<TokenId> prompt, uint64_t seed, int32_t max_tokens) {
  Request r;
  r.prompt_ids = std::move(prompt);
  r.seed = seed;
  r.max_tokens = max_tokens;
  r.sampling.temp = 1.0f;
  r.sampling.top_k = 0;
  r.sampling.top_p = 1.0f;
  r.sampling.min_p = 0.0f;
  r.logprobs = 2;
  return r;
}

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Ids, logprob bits (top alternatives included), text and finish of every sample.
inline ::testing::AssertionResult same_output(const Response& a, const Response& b) {
  if (a.status != Response::Status::Ok || b.status != Response::Status::Ok) {
    return ::testing::AssertionFailure()
           << "status " << static_cast<int>(a.status) << " / " << static_cast<int>(b.status) << ": "
           << a.error << b.error;
  }
  if (a.samples.size() != b.samples.size()) return ::testing::AssertionFailure() << "n differs";
  for (size_t i = 0; i < a.samples.size(); ++i) {
    const SampleResult &x = a.samples[i], &y = b.samples[i];
    if (x.ids != y.ids || x.text != y.text || x.finish != y.finish) {
      return ::testing::AssertionFailure() << "sample " << i << ": ids, text or finish differ";
    }
    if (x.logprobs.size() != y.logprobs.size()) {
      return ::testing::AssertionFailure() << "sample " << i << ": logprob counts differ";
    }
    for (size_t t = 0; t < x.logprobs.size(); ++t) {
      const LogprobEntry &p = x.logprobs[t], &q = y.logprobs[t];
      bool same = p.chosen.id == q.chosen.id && same_bits(p.chosen.logprob, q.chosen.logprob) &&
                  p.top.size() == q.top.size();
      for (size_t k = 0; same && k < p.top.size(); ++k) {
        same = p.top[k].id == q.top[k].id && same_bits(p.top[k].logprob, q.top[k].logprob);
      }
      if (!same) {
        return ::testing::AssertionFailure() << "sample " << i << " token " << t << ": logprobs";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace encore
