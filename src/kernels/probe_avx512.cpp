#include <immintrin.h>

#include "kernels/probe_internal.h"

namespace encore::kernels::probe_detail {

float fma_loop_avx512(int64_t iters) {
  __m512 acc[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999f);
  const __m512 b = _mm512_set1_ps(0.001f);
  for (int64_t i = 0; i < iters; ++i) {
    for (int c = 0; c < kFmaChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kFmaChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}

int32_t int8_loop_avx512(int64_t iters) {
  __m512i acc[kIntChains];
  for (int c = 0; c < kIntChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i u = _mm512_set1_epi8(3);
  const __m512i s = _mm512_set1_epi8(-2);
  for (int64_t i = 0; i < iters; ++i) {
    for (int c = 0; c < kIntChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], u, s);
  }
  __m512i sum = acc[0];
  for (int c = 1; c < kIntChains; ++c) sum = _mm512_add_epi32(sum, acc[c]);
  return _mm512_reduce_add_epi32(sum);
}

}  // namespace encore::kernels::probe_detail
