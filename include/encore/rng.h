// Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11).
//
// RNG stream layout (the one place it is defined):
//   key     = the request's 64-bit seed            (k0 = low 32 bits, k1 = high)
//   counter = (t_lo, t_hi, sample, purpose)        t = index of the generated token
// so the numbers used for token t of sample i of a request are a pure
// function of (seed, i, t): nothing else (other requests, threads, restarts,
// resumed state) can shift them. `purpose` separates independent uses of the
// same (seed, i, t), e.g. 0 = the token draw.
//
// Cost: 10 rounds of two 32x32->64 multiplies; no state, thread-safe.
#pragma once

#include <array>
#include <cstdint>

namespace encore {

using Philox4x32Counter = std::array<uint32_t, 4>;
using Philox4x32Key = std::array<uint32_t, 2>;

// One Philox4x32-10 block.
Philox4x32Counter philox4x32_10(Philox4x32Counter counter, Philox4x32Key key);

// Four 32-bit random words for (seed, sample, t, purpose).
Philox4x32Counter random_words(uint64_t seed, uint32_t sample, uint64_t t, uint32_t purpose = 0);

// Uniform float in [0, 1) from the top 24 bits of a word: every value is a
// multiple of 2^-24, exactly representable, identical on every platform.
float uniform_from_word(uint32_t word);

}  // namespace encore
