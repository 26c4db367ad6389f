// Internal: the integer operations of the AVX2 panel kernel (panel_kernel.h):
// one ymm register holds 8 rows (half a panel); maddubs sums 2 products per
// 16-bit lane, madd the pairs into 32-bit lanes. matmul_panel_avxvnni.cpp
// derives the AVX-VNNI set from it.
// Include only from translation units compiled for AVX2 (*_avx2.cpp,
// *_avxvnni.cpp), inside no namespace.
// Thread-safety: pure functions.
#pragma once

#include <immintrin.h>

#include "kernels/vec_avx2.h"

namespace encore::kernels::mm {
namespace {

// The float operations (and kW: rows per register) are avx2::Vec's.
struct V256 : avx2::Vec {
  using Vec::add;
  using Vec::sub;
  using I = __m256i;
  // Activation rows per tile (of 16 registers), for every type: the partial
  // sums of 4 rows spill a few registers, but each weight register feeds 4
  // rows. bench_matmul, m = 512: Q4_K 49 -> 44 ms, Q6_K 57 -> 45, Q8_0 51 -> 46
  // (tiles of 2 rows before).
  static constexpr int kMaxC = 4;
  // Signed weights use the sign trick instead (|w| * sign(q, w)): no bias.
  static constexpr int kI8Bias = 0;
  static I izero() { return _mm256_setzero_si256(); }
  static I load(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static I set1_epi8(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  static I bcast(int32_t v) { return _mm256_set1_epi32(v); }
  static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  template <int N>
  static I srli(I a) {
    return _mm256_srli_epi32(a, N);
  }
  template <int N>
  static I slli(I a) {
    return _mm256_slli_epi32(a, N);
  }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
  // u <= 63 and |q| <= 127: a pair's sum (<= 16002) never saturates.
  static I dot(I acc, I u, I q) {
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1)));
  }
  // |w| <= 128 and |q| <= 127: a pair (<= 32512) never saturates.
  static I dot_i8(I acc, I w, I q) {
    return dot(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w));
  }
  static F u8_to_f(const uint8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  // The int8 pairs of 8 rows at p (16 bytes), each pair one 32-bit lane of
  // two int16.
  static I s8_pairs(const uint8_t* p) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // Q6_K's sub-scales ride in the madd that widens the int16 sums
  // (widen_scaled, instead of a madd with ones and two vpmulld per group):
  // the sums (<= 32004) times a scale (|sc| <= 128) stay far inside int32.
  static constexpr bool kScaledDot = true;
  static I twice_low16(I a) {  // each lane's low int16 in both halves
    const I lo = _mm256_and_si256(a, _mm256_set1_epi32(0xffff));
    return _mm256_or_si256(lo, _mm256_slli_epi32(lo, 16));
  }
  static I twice_high16(I a) {
    const I hi = _mm256_srli_epi32(a, 16);
    return _mm256_or_si256(hi, _mm256_slli_epi32(hi, 16));
  }
  // maddubs' int16 pairs summed in int16 lanes, widened to int32 only once
  // per 16, 8 or 4 products (panel_kernel.h bounds them): fewer madd + add
  // pairs for the 4-, 5- and 6-bit types. Exact.
  static constexpr bool kI16Acc = true;
  static I dot16(I acc16, I u, I q) { return _mm256_add_epi16(acc16, _mm256_maddubs_epi16(u, q)); }
  static I widen(I acc, I t16) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(t16, _mm256_set1_epi16(1)));
  }
  static I widen_scaled(I acc, I t16, I sc16) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(t16, sc16));
  }
  static I madd16(I a, I b) { return _mm256_madd_epi16(a, b); }
  static F cvt(I a) { return _mm256_cvtepi32_ps(a); }  // exact: |a| < 2^24
};

}  // namespace
}  // namespace encore::kernels::mm
