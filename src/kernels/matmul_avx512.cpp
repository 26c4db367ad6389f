// AVX-512 (F/BW/DQ/VL + VNNI) matmul kernels: the canonical order of
// matmul_internal.h with one 512-bit register per pair, covering two 32-value
// groups: lane L of vpdpbusd sums bytes 4L..4L+3, i.e. lane L % 8 of group
// 2t + L / 8, which is exactly acc[8 * (g % 2) + l]. Activation quantisation
// and weight decoding reuse the AVX2 table (their results are exact anyway).
//
// vpdpbusd multiplies u8 by s8. Unsigned weights (<= 31) are the u8 side as
// they are. For signed weights the activation becomes u8 as q + 128 (an xor
// with 0x80) and the accumulator starts at -128 * sum(w) per lane, computed
// once per weight register and shared by every activation row of the tile:
// sum((q + 128) * w) - 128 * sum(w) = sum(q * w), exact in int32.
// GCC 12 flags the _mm512_undefined_*() pass-through operands inside its own
// AVX-512 intrinsics as uninitialised (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <array>
#include <utility>

#include "kernels/matmul_internal.h"

namespace encore::kernels::mm {
namespace {

// reduce16 of canonical.h on one register: acc[l] + acc[l + 8], then
// s[l] + s[l + 4], then (s[0] + s[2]) + (s[1] + s[3]).
inline float reduce16(__m512 a) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 t = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

template <int R, int C, bool S>
void int_tile_t(const DecRows& dr, int64_t r0, const ActRows& a, int64_t i0, float* out) {
  const int64_t kp = a.kp, ng = kp / kGroup;
  const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
  // ws lanes: [s0 x4, s1 x4, s2 x4, s3 x4]; da lanes: [d0 x8, d1 x8].
  const __m512i idx_ws = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i idx_da = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps();
  const int8_t* wp[R];
  const float* sp[R];
  for (int r = 0; r < R; ++r) {
    wp[r] = dr.w + (r0 + r) * kp;
    sp[r] = dr.ws + (r0 + r) * (kp / 16);
  }
  const int8_t* qp[C];
  const float* dp[C];
  for (int c = 0; c < C; ++c) {
    qp[c] = a.q + (i0 + c) * kp;
    dp[c] = a.d + (i0 + c) * ng;
  }
  for (int64_t t = 0; t < kp / 64; ++t) {
    __m512i wv[R], base[R];
    __m512 sc[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = _mm512_loadu_si512(wp[r] + 64 * t);
      if (S)
        base[r] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                   _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, wv[r]));
      sc[r] = _mm512_permutexvar_ps(idx_ws, _mm512_broadcast_f32x4(_mm_loadu_ps(sp[r] + 4 * t)));
    }
    for (int c = 0; c < C; ++c) {
      __m512i qv = _mm512_loadu_si512(qp[c] + 64 * t);
      if (S) qv = _mm512_xor_si512(qv, k80);
      const __m128 d2 =
          _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(dp[c] + 2 * t)));
      const __m512 dac = _mm512_permutexvar_ps(idx_da, _mm512_broadcast_f32x2(d2));
      for (int r = 0; r < R; ++r) {
        const __m512i p = S ? _mm512_dpbusd_epi32(base[r], qv, wv[r])
                            : _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[r], qv);
        acc[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sc[r], dac), acc[c][r]);
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) out[c * R + r] = reduce16(acc[c][r]);
}

using IntTileFn = void (*)(const DecRows&, int64_t, const ActRows&, int64_t, float*);

template <bool S, int R, int... Cs>
constexpr auto row_of(std::integer_sequence<int, Cs...>) {
  return std::array<IntTileFn, sizeof...(Cs)>{&int_tile_t<R, Cs + 1, S>...};
}

template <bool S>
constexpr std::array<std::array<IntTileFn, 4>, 4> int_table() {
  constexpr auto seq = std::make_integer_sequence<int, 4>{};
  return {row_of<S, 1>(seq), row_of<S, 2>(seq), row_of<S, 3>(seq), row_of<S, 4>(seq)};
}

void int_tile_avx512(int R, int C, bool w_signed, const DecRows& dr, int64_t r0, const ActRows& a,
                     int64_t i0, float* out) {
  static constexpr auto kSigned = int_table<true>();
  static constexpr auto kUnsigned = int_table<false>();
  (w_signed ? kSigned : kUnsigned)[R - 1][C - 1](dr, r0, a, i0, out);
}

template <int R, int C>
void float_tile_t(const float* w, int64_t w_stride, const float* x, int64_t x_stride, int64_t k,
                  float* out) {
  __m512 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps();
  auto step = [&](int64_t i, __mmask16 m) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_ps(m, w + r * w_stride + i);
    for (int c = 0; c < C; ++c) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + c * x_stride + i);
      for (int r = 0; r < R; ++r) acc[c][r] = _mm512_fmadd_ps(wv[r], xv, acc[c][r]);
    }
  };
  const int64_t k16 = k / 16 * 16;
  for (int64_t i = 0; i < k16; i += 16) step(i, 0xffff);
  // Masked lanes read as 0 on both sides: fma(0, 0, acc) leaves acc as is.
  if (k16 < k) step(k16, static_cast<__mmask16>((1u << (k - k16)) - 1));
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) out[c * R + r] = reduce16(acc[c][r]);
}

using FloatTileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*);

template <int R, int... Cs>
constexpr auto frow_of(std::integer_sequence<int, Cs...>) {
  return std::array<FloatTileFn, sizeof...(Cs)>{&float_tile_t<R, Cs + 1>...};
}

void float_tile_avx512(int R, int C, const float* w, int64_t w_stride, const float* x,
                       int64_t x_stride, int64_t k, float* out) {
  static constexpr auto seq = std::make_integer_sequence<int, 4>{};
  static constexpr std::array<std::array<FloatTileFn, 4>, 4> kTable = {
      frow_of<1>(seq), frow_of<2>(seq), frow_of<3>(seq), frow_of<4>(seq)};
  kTable[R - 1][C - 1](w, w_stride, x, x_stride, k, out);
}

}  // namespace

const IsaKernels& avx512_kernels() {
  static const IsaKernels k = [] {
    IsaKernels t = avx2_kernels();
    t.int_tile = int_tile_avx512;
    t.float_tile = float_tile_avx512;
    return t;
  }();
  return k;
}

}  // namespace encore::kernels::mm
