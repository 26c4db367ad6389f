// AVX-512 (F/BW/DQ/VL + VNNI) matmul kernels of the float path (the
// canonical order of matmul_internal.h, 16 lanes in one register); the
// integer panel kernel is matmul_panel_avx512.cpp, and activation
// quantisation reuses the AVX2 table (its results are exact anyway).
// GCC 12 flags the _mm512_undefined_*() pass-through operands inside its own
// AVX-512 intrinsics as uninitialised (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/matmul_internal.h"
#include "kernels/simd_common.h"

namespace encore::kernels::mm {
namespace {

// reduce16 of canonical.h on one register: acc[l] + acc[l + 8], then
// reduce8 (simd_common.h).
inline float reduce16(__m512 a) {
  return reduce8(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
}

// Weight loaders of the float tiles: 16 values of a row from index i, exact
// (vcvtph2ps only quiets signalling NaNs; outputs are NaN-canonicalised);
// load_n reads only the lanes of mask m (the rest are 0).
struct LoadF32 {
  static __m512 load(const uint8_t* row, int64_t i) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i);
  }
  static __m512 load_n(const uint8_t* row, int64_t i, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
  }
};
struct LoadF16 {
  static __m512 load(const uint8_t* row, int64_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i)));
  }
  static __m512 load_n(const uint8_t* row, int64_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * i));
  }
};
struct LoadBF16 {
  static __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 load(const uint8_t* row, int64_t i) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i)));
  }
  static __m512 load_n(const uint8_t* row, int64_t i, __mmask16 m) {
    return widen(_mm256_maskz_loadu_epi16(m, row + 2 * i));
  }
};

// The whole 16-value steps of float_block_t (k16 values), continuing the
// accumulators acc_io: [C * R][16], or with `zero` starting them at +0
// (acc_io not read); with `out` set, out[c * R + r] = reduce16 of the lanes
// instead of storing them. Kept apart from the masked tail on purpose:
// with the tail in the same function (as a second call of one step lambda,
// or as a mask computed per step) GCC 12 kept the accumulators in memory and
// stored all R x C of them on every step; F16 prefill ran at half speed.
template <int R, int C, class L, size_t kAhead>
__attribute__((noinline)) void float_steps(const uint8_t* w, size_t stride, const float* x,
                                           int64_t x_stride, int64_t k16, float* acc_io, bool zero,
                                           float* out) {
  __m512 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r)
      acc[c][r] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(acc_io + 16 * (c * R + r));
  auto step = [&](int64_t i) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = L::load(w + r * stride, i);
    for (int c = 0; c < C; ++c) {
      const __m512 xv = _mm512_loadu_ps(x + c * x_stride + i);
      for (int r = 0; r < R; ++r) acc[c][r] = _mm512_fmadd_ps(wv[r], xv, acc[c][r]);
    }
  };
  static_assert(kAhead == 0 || !std::is_same_v<L, LoadF32>, "the prefetch assumes 16-bit rows");
  auto prefetch = [&](int64_t i) {  // 64 bytes of each 16-bit row, kAhead rows on
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (r + kAhead) * stride + 2 * i), _MM_HINT_T0);
    }
  };
  int64_t i = 0;
  for (; i + 32 <= k16; i += 32) {
    if (kAhead > 0) prefetch(i);
    step(i);
    step(i + 16);
  }
  if (i < k16) {
    if (kAhead > 0) prefetch(i);
    step(i);
  }
  if (out != nullptr) {
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < R; ++r) out[c * R + r] = reduce16(acc[c][r]);
    return;
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc_io + 16 * (c * R + r), acc[c][r]);
}

// out[j] = reduce16 of the lanes of pair j < n of acc: [n][16].
void reduce_pairs(const float* acc, int n, float* out) {
  for (int j = 0; j < n; ++j) out[j] = reduce16(_mm512_loadu_ps(acc + 16 * j));
}

// R x C canonical dot products over k more values of rows of weights
// `stride` bytes apart, continuing acc: [C * R][16], with `first` and `out`
// as IsaKernels::float_tile has them.
// kAhead > 0: also prefetch the same bytes kAhead rows further on (the
// direct F16/BF16 decode path reads the rows in place; speed only).
template <int R, int C, class L, size_t kAhead>
void float_block_t(const uint8_t* w, size_t stride, const float* x, int64_t x_stride, int64_t k,
                   float* acc, bool first, float* out) {
  const int64_t k16 = k / 16 * 16;
  if (k16 == k) {  // whole steps only: the lanes stay in registers
    float_steps<R, C, L, kAhead>(w, stride, x, x_stride, k16, acc, first, out);
    return;
  }
  if (first) std::fill_n(acc, 16 * R * C, 0.0f);
  if (k16 > 0) float_steps<R, C, L, kAhead>(w, stride, x, x_stride, k16, acc, false, nullptr);
  // Masked: lanes past k are not touched at all (an unmasked fma(0, 0, -0)
  // would turn a -0 lane, left by an underflowed negative product, into +0,
  // which the scalar twin never does).
  const __mmask16 m = static_cast<__mmask16>((1u << (k - k16)) - 1);
  __m512 wv[R];
  for (int r = 0; r < R; ++r) wv[r] = L::load_n(w + r * stride, k16, m);
  for (int c = 0; c < C; ++c) {
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + c * x_stride + k16);
    for (int r = 0; r < R; ++r) {
      float* lanes = acc + 16 * (c * R + r);
      _mm512_storeu_ps(lanes, _mm512_mask3_fmadd_ps(wv[r], xv, _mm512_loadu_ps(lanes), m));
    }
  }
  if (out != nullptr) reduce_pairs(acc, R * C, out);
}

// The whole dot products: out[c * R + r] (the direct decode path).
template <int R, int C, class L, size_t kAhead>
void float_tile_t(const uint8_t* w, size_t stride, const float* x, int64_t x_stride, int64_t k,
                  float* out) {
  alignas(64) float acc[C * R][16];
  float_block_t<R, C, L, kAhead>(w, stride, x, x_stride, k, &acc[0][0], true, out);
}

using FloatTileFn = void (*)(const uint8_t*, size_t, const float*, int64_t, int64_t, float*);
using FloatBlockFn = void (*)(const uint8_t*, size_t, const float*, int64_t, int64_t, float*, bool,
                              float*);

template <bool kBlock, class L, size_t kAhead, int R, int... Cs>
constexpr auto frow_of(std::integer_sequence<int, Cs...>) {
  if constexpr (kBlock) {
    return std::array<FloatBlockFn, sizeof...(Cs)>{&float_block_t<R, Cs + 1, L, kAhead>...};
  } else {
    return std::array<FloatTileFn, sizeof...(Cs)>{&float_tile_t<R, Cs + 1, L, kAhead>...};
  }
}

// [R - 1][C - 1]: float_block_t (kBlock) or float_tile_t.
template <bool kBlock, class L, size_t kAhead>
constexpr auto float_table() {
  constexpr auto seq = std::make_integer_sequence<int, 4>{};
  return std::array{frow_of<kBlock, L, kAhead, 1>(seq), frow_of<kBlock, L, kAhead, 2>(seq),
                    frow_of<kBlock, L, kAhead, 3>(seq), frow_of<kBlock, L, kAhead, 4>(seq)};
}

void float_tile_avx512(int R, int C, const float* w, int64_t w_stride, const float* x,
                       int64_t x_stride, int64_t k, bool first, float* acc, float* out) {
  static constexpr auto kTable = float_table<true, LoadF32, 0>();
  kTable[R - 1][C - 1](reinterpret_cast<const uint8_t*>(w), w_stride * sizeof(float), x, x_stride,
                       k, acc, first, out);
}

#ifndef ENCORE_PF_FLOAT
#define ENCORE_PF_FLOAT 8
#endif

bool has_direct_float_avx512(DType t, int64_t m) {
  return m <= kDecodeRows && (t == DType::F16 || t == DType::BF16);
}

void direct_float_tile_avx512(DType t, int R, int C, const uint8_t* w, size_t row_bytes,
                              const float* x, int64_t x_stride, int64_t k, float* out) {
  static constexpr auto kF16 = float_table<false, LoadF16, ENCORE_PF_FLOAT>();
  static constexpr auto kBF16 = float_table<false, LoadBF16, ENCORE_PF_FLOAT>();
  (t == DType::F16 ? kF16 : kBF16)[R - 1][C - 1](w, row_bytes, x, x_stride, k, out);
}

}  // namespace

const IsaKernels& avx512_kernels() {
  static const IsaKernels k = [] {
    IsaKernels t = avx2_kernels();
    t.panel_tile = panel_tile_avx512;
    t.float_tile = float_tile_avx512;
    t.has_direct_float = has_direct_float_avx512;
    t.direct_float_tile = direct_float_tile_avx512;
    return t;
  }();
  return k;
}

}  // namespace encore::kernels::mm
