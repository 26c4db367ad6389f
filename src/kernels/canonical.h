// The canonical reduction order shared by every float dot product and sum of
// squares in the kernels (the scalar definition; SIMD versions must equal it
// bit for bit). Written once here; docs/invariance.md points to it.
//
// A length-n dot product of floats a, b is:
//   acc[l] = +0.0f for l in [0, 16)
//   for i in [0, n):  acc[i % 16] = fma(a[i], b[i], acc[i % 16])   (in i order)
//   result = reduce16(acc)
// reduce16 folds the 16 lanes by a fixed tree, halving each time:
//   8 lanes: acc[l] + acc[l + 8]; 4 lanes: s[l] + s[l + 4];
//   2 lanes: s[l] + s[l + 2];     result: s[0] + s[1]
// Why this shape: one AVX-512 register or two AVX2 registers hold the 16
// lanes, so SIMD code runs it with plain vertical FMAs and a short horizontal
// fold; a scalar loop runs it too. fma is correctly rounded (IEEE 754), so
// every implementation gets the same bits.
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>

namespace encore::kernels {

inline constexpr int kDotLanes = 16;

static inline float reduce16(const float* acc) {
  float s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  const float s0 = s4[0] + s4[2];
  const float s1 = s4[1] + s4[3];
  return s0 + s1;
}

// The lane loop of the dot product over n values, continuing acc (a piece
// of a longer dot product must start at a multiple of 16 within it).
static inline void fma_lanes(float* acc, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i % kDotLanes] = std::fma(a[i], b[i], acc[i % kDotLanes]);
}

// The canonical dot product, scalar twin.
static inline float dot_canonical(const float* a, const float* b, int64_t n) {
  float acc[kDotLanes] = {};
  fma_lanes(acc, a, b, n);
  return reduce16(acc);
}

}  // namespace encore::kernels
