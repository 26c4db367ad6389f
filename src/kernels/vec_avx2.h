// Internal: the float vector of the AVX2 kernels (8 lanes in a ymm register),
// the interface ops_vec.h writes the element-wise and attention kernels over
// once for both ISAs (vec_avx512.h is the 16-lane twin). Every member maps to
// one instruction or a fixed short sequence with a fixed meaning per lane, so
// code written over it runs the same operations on either width.
// Include only from translation units compiled for AVX2 (*_avx2.cpp,
// *_avxvnni.cpp).
// Thread-safety: pure functions.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace encore::kernels::avx2 {
namespace {

struct Vec {
  using F = __m256;
  static constexpr int kW = 8;
  // Accumulator pairs of one scores tile (rows x heads, reduce16_rows): 4 x 2
  // accumulators + loads fit the 16 ymm registers.
  static constexpr int kScoreRows = 4;
  // Query heads per scores tile: one (2 heads x 2 rows measured no faster;
  // the tile's loads already fit beside its 8 accumulators).
  static constexpr int kScoreHeads = 1;
  // Accumulators of one attention accumulate tile: 8 of the 16 ymm
  // registers, beside a row's loads.
  static constexpr int kAccumRegs = 8;

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  // Lanes [0, n) set; n may be <= 0 (none) or >= kW (all). Tails build one
  // mask and pass it to the *_n members.
  using M = __m256i;
  static M mask(int64_t n) {
    const int c = n < 0 ? 0 : (n > kW ? kW : static_cast<int>(n));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  // The lanes of mask m from p, the rest +0; memory outside m is not read.
  static F load_n(const float* p, M m) { return _mm256_maskload_ps(p, m); }
  // Stores the lanes of m; memory outside m is not written.
  static void store_n(float* p, F v, M m) { _mm256_maskstore_ps(p, m, v); }
  // The lanes of m from fresh, the others from old.
  static F keep_n(F fresh, F old, M m) {
    return _mm256_blendv_ps(old, fresh, _mm256_castsi256_ps(m));
  }
  // kW halves (F16) widened exactly.
  static F load_f16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // kW BF16 values widened exactly (a shift into the high half).
  static F load_bf16(const uint8_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }       // a * b + c
  static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }     // -(a * b) + c
  static F max(F a, F b) { return _mm256_max_ps(a, b); }                 // a > b ? a : b (NaN: b)
  static F min(F a, F b) { return _mm256_min_ps(a, b); }                 // a < b ? a : b (NaN: b)
  static F neg(F a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }  // sign flip
  // (p * 2^(n >> 1)) * 2^(n - (n >> 1)) for integral n in [-151, 128] (exp's scaling).
  static F scale_pow2(F p, F n) {
    const __m256i ni = _mm256_cvttps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const F s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const F s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  }
  // NaN lanes of x give x + x (quietened), the others res.
  static F nan_to(F x, F res) {
    return _mm256_blendv_ps(res, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  static void lanes(F v, float* out) { _mm256_storeu_ps(out, v); }

  // out[k] = scale * reduce16(acc[k]) for k < n (n <= kScoreRows); acc[k]
  // holds lanes 0-7 in [0] and 8-15 in [1]. Each step adds the pairs of
  // canonical.h's fold tree, four accumulators at a time.
  static void reduce16_rows(const F (*acc)[2], float scale, float* out, int n) {
    F s8[4];
    for (int k = 0; k < 4; ++k) s8[k] = _mm256_add_ps(acc[k][0], acc[k][1]);  // l + (l + 8)
    // s8[l] + s8[l + 4]: [k0 s4 | k1 s4] and [k2 s4 | k3 s4].
    const F t01 = _mm256_add_ps(_mm256_permute2f128_ps(s8[0], s8[1], 0x20),
                                _mm256_permute2f128_ps(s8[0], s8[1], 0x31));
    const F t23 = _mm256_add_ps(_mm256_permute2f128_ps(s8[2], s8[3], 0x20),
                                _mm256_permute2f128_ps(s8[2], s8[3], 0x31));
    // s4[0] + s4[2], s4[1] + s4[3]: [k0 s0 s1, k2 s0 s1 | k1 s0 s1, k3 s0 s1].
    const F u = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 2, 3, 2)));
    // s0 + s1: [k0, k2, k0, k2 | k1, k3, k1, k3].
    const F v = _mm256_hadd_ps(u, u);
    const __m128 r =
        _mm_mul_ps(_mm_unpacklo_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)),
                   _mm_set1_ps(scale));
    if (n == 4) {
      _mm_storeu_ps(out, r);
    } else {
      float tmp[4];
      _mm_storeu_ps(tmp, r);
      std::memcpy(out, tmp, sizeof(float) * static_cast<size_t>(n));
    }
  }
};

}  // namespace
}  // namespace encore::kernels::avx2
