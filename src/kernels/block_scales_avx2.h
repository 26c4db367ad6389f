// Block scales read with AVX2 + F16C (the fp16 fields of eight 32-value
// blocks, the scales of a Q4_K/Q5_K super-block), shared by the direct
// kernels of both SIMD ISAs (included by matmul_avx2.cpp and
// matmul_avx512.cpp, which are compiled with AVX2 and F16C). Exact: the
// same values decode computes.
#pragma once

#include <immintrin.h>

#include "kernels/matmul_internal.h"

namespace encore::kernels::mm {

// Eight fp16 fields of consecutive blocks (`stride` bytes apart, the first
// at p), widened (exact); blocks past n (n < 8 at a row's end) read as +0.
inline __m256 halves8(const uint8_t* p, size_t stride, int n) {
  uint64_t lo = 0, hi = 0;
  if (n >= 8) {
    for (int i = 0; i < 4; ++i) lo |= uint64_t{rd16(p + i * stride)} << (16 * i);
    for (int i = 0; i < 4; ++i) hi |= uint64_t{rd16(p + (i + 4) * stride)} << (16 * i);
  } else {
    for (int i = 0; i < n && i < 4; ++i) lo |= uint64_t{rd16(p + i * stride)} << (16 * i);
    for (int i = 4; i < n; ++i) hi |= uint64_t{rd16(p + i * stride)} << (16 * (i - 4));
  }
  return _mm256_cvtph_ps(_mm_set_epi64x(static_cast<int64_t>(hi), static_cast<int64_t>(lo)));
}

// The widened d of the eight 32-value blocks from p (n of them real, the
// rest +0) of a LegacyBlock type; types with a min also set *m8 to their m
// (+0 past n, like the padding groups' wm).
template <class B>
inline __m256 legacy_scales8(const uint8_t* p, int n, __m256* m8) {
  if constexpr (B::kMin >= 0) *m8 = halves8(p + B::kMin, B::kBytes, n);
  return halves8(p, B::kBytes, n);
}

// Returns ws_j = d * sc_j for the block's 8 groups and sets
// wm8[j] = -(dmin * m_j); `block` points at its fp16 d, dmin and packed scales.
inline __m256 k4_scales(const uint8_t* block, __m256* wm8) {
  uint64_t sc, mn;
  unpack_k4_scales(block + 4, &sc, &mn);
  const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(rd32(block))));
  const __m256 d = _mm256_broadcastss_ps(dm);
  const __m256 dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
  const __m256 scf =
      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
  const __m256 mf =
      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(mn))));
  // -(dmin * m): the negation is exact, so xor the sign of the product.
  *wm8 = _mm256_xor_ps(_mm256_mul_ps(dmin, mf), _mm256_set1_ps(-0.0f));
  return _mm256_mul_ps(d, scf);
}

}  // namespace encore::kernels::mm
