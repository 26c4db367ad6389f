// Pieces shared by the integer kernels of both SIMD ISAs (included by
// matmul_avx2.cpp and matmul_avx512.cpp, which are compiled with AVX2 and
// F16C): block scales (the fp16 fields of eight 32-value blocks, the scales
// of a Q4_K/Q5_K super-block; exact, the same values decode computes),
// reduce8, the offset term of a tile, and in_register (the AVX2 float
// kernels use it too). In an anonymous namespace: each file gets its own
// copy, compiled for its own ISA (one shared inline copy could be the
// AVX-512 one, called from the AVX2 kernels).
#pragma once

#include <immintrin.h>

#include "kernels/matmul_internal.h"

namespace encore::kernels::mm {
namespace {

// v, kept in a register: GCC 12 otherwise folds a load into every
// instruction that uses the loaded value, so in a 2 x 2 float sub-tile one
// of the two operands was loaded once per fma instead of once per step (12
// loads per 8 fmas; the loads, not the fmas, were the limit), and the
// integer kernels loaded an activation vector once per maddubs / vpdpbusd.
// The empty asm, which GCC must assume changes v, stops the folding. Speed
// only: the same operations in the same order. Measured on the Zen 5 class
// VM: AVX2 direct kernels, one thread, weights in L2, 1 / 8 activation rows
// (GOP/s): Q6_K 48 -> 56 / 69 -> 81, Q5_0 42 -> 52 / 65 -> 78, Q8_0 52 -> 62
// / 73 -> 100 (Q4_0, Q4_K, Q5_K unchanged); AVX-512 int_tile_t, 512 rows,
// two threads: Q8_0 +3 %, Q4_0 and Q6_K +15-20 % (the unsigned types
// unchanged).
template <class V>
inline V in_register(V v) {
  asm("" : "+v"(v));  // any vector register (zmm16-31 too)
  return v;
}

// reduce8 of matmul_internal.h on one 8-lane register: s4[l] = a[l] +
// a[l + 4], then (s4[0] + s4[2]) + (s4[1] + s4[3]).
inline float reduce8(__m256 a) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 t = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));  // s4[0]+s4[2], s4[1]+s4[3]
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// The offset term of an R x C tile of decoded rows, added to its outputs:
// out[c * R + r] += reduce8(accm) with accm[g % 8] = fma(wm_g, asum_g, .)
// over all ng groups (a multiple of 8; the padding has wm = asum = 0) of
// weight row r (wm: [R, ng]) and activation row c (asum: [C, ng]). The
// chains of two activation rows run side by side (2 R <= 8 accumulators,
// two asum and one wm register: they fit AVX2's 16 registers), once per
// tile, not one pass per output.
template <int R, int C>
void add_min_terms_t(const float* wm, const float* asum, int64_t ng, float* out) {
  for (int c0 = 0; c0 < C; c0 += 2) {
    const int cn = C - c0 < 2 ? 1 : 2;
    __m256 am[2][R];
    for (int c = 0; c < 2; ++c)
      for (int r = 0; r < R; ++r) am[c][r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g += 8) {
      __m256 as[2];
      for (int c = 0; c < cn; ++c) as[c] = _mm256_loadu_ps(asum + (c0 + c) * ng + g);
      for (int r = 0; r < R; ++r) {
        const __m256 w8 = _mm256_loadu_ps(wm + r * ng + g);
        for (int c = 0; c < cn; ++c) am[c][r] = _mm256_fmadd_ps(w8, as[c], am[c][r]);
      }
    }
    for (int c = 0; c < cn; ++c)
      for (int r = 0; r < R; ++r) out[(c0 + c) * R + r] += reduce8(am[c][r]);
  }
}

// What both ISAs' int_tile add to their R x C tile (1 <= R, C <= 4) of
// decoded rows r0.. and activation rows i0..: nothing unless the type has
// an offset (d.wm set).
inline void add_min_terms(int R, int C, const DecRows& d, int64_t r0, const ActRows& a, int64_t i0,
                          float* out) {
  if (d.wm == nullptr) return;
  using Fn = void (*)(const float*, const float*, int64_t, float*);
  static constexpr Fn kFns[4][4] = {{&add_min_terms_t<1, 1>, &add_min_terms_t<1, 2>,
                                     &add_min_terms_t<1, 3>, &add_min_terms_t<1, 4>},
                                    {&add_min_terms_t<2, 1>, &add_min_terms_t<2, 2>,
                                     &add_min_terms_t<2, 3>, &add_min_terms_t<2, 4>},
                                    {&add_min_terms_t<3, 1>, &add_min_terms_t<3, 2>,
                                     &add_min_terms_t<3, 3>, &add_min_terms_t<3, 4>},
                                    {&add_min_terms_t<4, 1>, &add_min_terms_t<4, 2>,
                                     &add_min_terms_t<4, 3>, &add_min_terms_t<4, 4>}};
  const int64_t ng = a.kp / kGroup;
  kFns[R - 1][C - 1](d.wm + r0 * ng, a.asum + i0 * ng, ng, out);
}

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

}  // namespace
}  // namespace encore::kernels::mm
