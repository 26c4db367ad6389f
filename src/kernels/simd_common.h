// Pieces shared by the kernels of both SIMD ISAs (included by
// matmul_avx2.cpp, matmul_avx512.cpp and panel_kernel.h, compiled with AVX2
// and F16C at least): reduce8 and in_register. In an anonymous namespace: each file gets its own
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
// loads per 8 fmas; the loads, not the fmas, were the limit). The empty asm,
// which GCC must assume changes v, stops the folding. Speed only: the same
// operations in the same order.
template <class V>
inline V in_register(V v) {
  asm("" : "+v"(v));  // any vector register (zmm16-31 too)
  return v;
}

// The last three levels of canonical.h's reduce16 on one 8-lane register: s4[l] = a[l] +
// a[l + 4], then (s4[0] + s4[2]) + (s4[1] + s4[3]).
inline float reduce8(__m256 a) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 t = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));  // s4[0]+s4[2], s4[1]+s4[3]
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

}  // namespace
}  // namespace encore::kernels::mm
