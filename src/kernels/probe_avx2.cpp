#include <immintrin.h>

#include "kernels/probe_internal.h"

namespace encore::kernels::probe_detail {

float fma_loop_avx2(int64_t iters) {
  __m256 acc[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999f);
  const __m256 b = _mm256_set1_ps(0.001f);
  for (int64_t i = 0; i < iters; ++i) {
    for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kFmaChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  return _mm256_cvtss_f32(sum);
}

int32_t int8_loop_avx2(int64_t iters) {
  __m256i acc[kIntChains];
  for (int c = 0; c < kIntChains; ++c) acc[c] = _mm256_set1_epi32(c);
  __m256i u = _mm256_set1_epi8(3);
  __m256i s = _mm256_set1_epi8(-2);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < iters; ++i) {
    for (int c = 0; c < kIntChains; ++c) {
      // Empty asm: the compiler must assume the operands changed, so it can
      // neither hoist the multiplies out of the loop nor share them
      // between chains.
      __asm__("" : "+x"(u), "+x"(s));
      const __m256i p16 = _mm256_maddubs_epi16(u, s);
      acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p16, ones));
    }
  }
  __m256i sum = acc[0];
  for (int c = 1; c < kIntChains; ++c) sum = _mm256_add_epi32(sum, acc[c]);
  return _mm256_cvtsi256_si32(sum);
}

}  // namespace encore::kernels::probe_detail
