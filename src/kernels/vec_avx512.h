// Internal: the float vector of the AVX-512 kernels (16 lanes in a zmm
// register), the twin of vec_avx2.h (see there; ops_vec.h is written over
// both). Tails use masked loads and stores, which never touch memory past
// lane n.
// Include only from translation units compiled for AVX-512 (*_avx512.cpp).
// Thread-safety: pure functions.
#pragma once

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined_*() placeholders (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>

namespace encore::kernels::avx512 {
namespace {

struct Vec {
  using F = __m512;
  static constexpr int kW = 16;
  // Accumulators of one scores tile (rows x heads, reduce16_rows): 16 of the
  // 32 zmm registers.
  static constexpr int kScoreRows = 16;
  // Query heads per scores tile (4 rows each): each row load feeds 4 FMAs
  // (16 rows of one head needed a load per FMA).
  static constexpr int kScoreHeads = 4;
  // Accumulators of one attention accumulate tile: 16 of the 32 zmm registers.
  static constexpr int kAccumRegs = 16;

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  // Lanes [0, n) set; n may be <= 0 (none) or >= kW (all).
  using M = __mmask16;
  static M mask(int64_t n) {
    return n <= 0 ? 0 : n >= kW ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1u);
  }
  static F load_n(const float* p, M m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store_n(float* p, F v, M m) { _mm512_mask_storeu_ps(p, m, v); }
  static F keep_n(F fresh, F old, M m) { return _mm512_mask_mov_ps(old, m, fresh); }
  static F load_f16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // kW BF16 values widened exactly (a shift into the high half).
  static F load_bf16(const uint8_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }  // a > b ? a : b (NaN: b)
  static F min(F a, F b) { return _mm512_min_ps(a, b); }  // a < b ? a : b (NaN: b)
  static F neg(F a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
  static F scale_pow2(F p, F n) {
    const __m512i ni = _mm512_cvttps_epi32(n);
    const __m512i n1 = _mm512_srai_epi32(ni, 1);
    const __m512i n2 = _mm512_sub_epi32(ni, n1);
    const __m512i bias = _mm512_set1_epi32(127);
    const F s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
    const F s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  }
  static F nan_to(F x, F res) {
    return _mm512_mask_add_ps(res, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, x);
  }
  static void lanes(F v, float* out) { _mm512_storeu_ps(out, v); }

  // reduce16 of acc[k][0] for all 16 k at once (reduce16_rows: out[k] =
  // scale * that, for k < n, n <= 16).
  // Each level adds lane l and lane l + half of every accumulator (the pairs
  // of canonical.h's fold tree) while packing two accumulators into one
  // register. After four levels key 4t + L sits at position 4L + t
  // (unpermuted: reduce16_fold); one permute restores the order.
  static F reduce16_fold(const F (*acc)[1]) {
    F c[8], d[4], e[2];
    for (int i = 0; i < 8; ++i) {  // 16 -> 8 lanes: acc[l] + acc[l + 8]
      const F a = acc[2 * i][0], b = acc[2 * i + 1][0];
      c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    for (int i = 0; i < 4; ++i) {  // 8 -> 4: s8[l] + s8[l + 4]
      const F a = c[2 * i], b = c[2 * i + 1];
      d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    for (int i = 0; i < 2; ++i) {  // 4 -> 2: s4[0] + s4[2], s4[1] + s4[3]
      const F a = d[2 * i], b = d[2 * i + 1];
      e[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    // 2 -> 1: s0 + s1.
    return _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  static void reduce16_rows(const F (*acc)[1], float scale, float* out, int n) {
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const F r =
        _mm512_mul_ps(_mm512_permutexvar_ps(idx, reduce16_fold(acc)), _mm512_set1_ps(scale));
    _mm512_mask_storeu_ps(out, mask(n), r);
  }
  // The same for 4 heads of 4 rows (acc[4 k + h]: head h, row k): out[h *
  // stride + k] for k < n (n <= 4). Unpermuted, the fold leaves key 4 k + h
  // at position 4 h + k, so head h's rows are 128-bit lane h, stored as is.
  static void reduce16_rows_heads(const F (*acc)[1], float scale, float* out, int64_t stride,
                                  int n) {
    const F r = _mm512_mul_ps(reduce16_fold(acc), _mm512_set1_ps(scale));
    const __mmask8 m = static_cast<__mmask8>((1u << n) - 1u);
    _mm_mask_storeu_ps(out, m, _mm512_extractf32x4_ps(r, 0));
    _mm_mask_storeu_ps(out + stride, m, _mm512_extractf32x4_ps(r, 1));
    _mm_mask_storeu_ps(out + 2 * stride, m, _mm512_extractf32x4_ps(r, 2));
    _mm_mask_storeu_ps(out + 3 * stride, m, _mm512_extractf32x4_ps(r, 3));
  }
};

}  // namespace
}  // namespace encore::kernels::avx512
