// Token selection from logits. Every function is deterministic: ties are
// broken by the lowest token id and sums run in token-id order, so the
// result depends only on the logits and the random words given.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

namespace encore {

// Index of the largest logit; ties go to the lowest id. NaN logits never win;
// -1 if every logit is NaN (callers treat that as a broken model).
int32_t argmax(std::span<const float> logits);

// Draws from softmax(logits / temp) with temp > 0, using u in [0, 1).
// Requires at least one non-NaN logit.
// The probabilities are exp((l_i - max) / temp) in float, summed in id order
// in double; the token is the first id whose running sum exceeds u * total.
int32_t sample_softmax(std::span<const float> logits, float temp, float u);

}  // namespace encore
