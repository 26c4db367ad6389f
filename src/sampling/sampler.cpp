#include "encore/sampler.h"

#include <cassert>
#include <cmath>

namespace encore {

int32_t argmax(std::span<const float> logits) {
  assert(!logits.empty());
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

int32_t sample_softmax(std::span<const float> logits, float temp, float u) {
  assert(temp > 0.0f && u >= 0.0f && u < 1.0f);
  const int32_t top = argmax(logits);
  const float max = logits[top];
  double total = 0.0;
  for (float l : logits) {
    if (!std::isnan(l)) total += std::exp(static_cast<double>((l - max) / temp));
  }
  const double target = static_cast<double>(u) * total;
  double running = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    running += std::exp(static_cast<double>((logits[i] - max) / temp));
    if (running > target) return static_cast<int32_t>(i);
  }
  return top;  // only reachable through rounding at u -> 1
}

}  // namespace encore
