// AVX2 + FMA + F16C matmul kernels: the canonical order of matmul_internal.h
// with 256-bit vectors (activation quantisation and the float path; the
// integer panel kernel is matmul_panel_avx2.cpp). Compiled with -mavx2 -mfma
// -mf16c -mbmi2 and only called after isa_supported(Isa::Avx2).
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

#include "kernels/matmul_internal.h"
#include "kernels/quants.h"
#include "kernels/simd_common.h"

namespace encore::kernels::mm {
namespace {

// reduce16 (canonical.h) of lanes lo = acc[0..7], hi = acc[8..15].
inline float reduce16(__m256 lo, __m256 hi) { return reduce8(_mm256_add_ps(lo, hi)); }

inline uint32_t hmax_epu32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

void quantize_act_avx2(const float* x, int64_t k, const ActRows& a, int64_t i) {
  int8_t* q = a.q + i * a.kp;
  float* d = a.d + i * (a.kp / kGroup);
  float* s = a.asum + i * (a.kp / kGroup);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t g = 0; g < k / kGroup; ++g) {
    const float* xg = x + g * kGroup;
    __m256 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(xg + 8 * j);
    __m256i mx = _mm256_and_si256(_mm256_castps_si256(v[0]), abs_mask);
    for (int j = 1; j < 4; ++j) {
      mx = _mm256_max_epu32(mx, _mm256_and_si256(_mm256_castps_si256(v[j]), abs_mask));
    }
    const uint32_t ab = hmax_epu32(mx);
    if (ab >= kInfBits || ab < kTinyBits) {
      quantize_group_scalar(xg, ab, q + g * kGroup, d + g, s + g);
      continue;
    }
    const float dg = std::bit_cast<float>(ab) / 127.0f;
    const __m256 id = _mm256_set1_ps(1.0f / dg);
    __m256i iv[4];
    // cvtps rounds to nearest even in the default MXCSR mode, like nearbyint.
    for (int j = 0; j < 4; ++j) iv[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));
    const __m256i sum =
        _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
    const __m256i p01 = _mm256_packs_epi32(iv[0], iv[1]);
    const __m256i p23 = _mm256_packs_epi32(iv[2], iv[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + g * kGroup), b);
    d[g] = dg;
    s[g] = dg * static_cast<float>(hsum_epi32(sum));
  }
}

inline __m256i tail_mask(int64_t n) {  // lanes < n set (n may be <= 0 or >= 8)
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int nn = n < 0 ? 0 : (n > 8 ? 8 : static_cast<int>(n));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(nn), idx);
}

// Weight loaders of the float sub-tiles: 16 values of a row from index i
// as two registers (exact: vcvtph2ps only quiets signalling NaNs, which are
// canonicalised on output), and the tail [i, i + n) as floats.
struct LoadF32 {
  static void load(const uint8_t* row, int64_t i, __m256& lo, __m256& hi) {
    const float* f = reinterpret_cast<const float*>(row) + i;
    lo = _mm256_loadu_ps(f);
    hi = _mm256_loadu_ps(f + 8);
  }
  static const float* tail(const uint8_t* row, int64_t i, int64_t, float*) {
    return reinterpret_cast<const float*>(row) + i;
  }
};
struct LoadF16 {
  static void load(const uint8_t* row, int64_t i, __m256& lo, __m256& hi) {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i + 16)));
  }
  static const float* tail(const uint8_t* row, int64_t i, int64_t n, float* tmp) {
    widen_scalar(DType::F16, row + 2 * i, n, tmp);
    return tmp;
  }
};
struct LoadBF16 {
  static __m256 widen8(const uint8_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static void load(const uint8_t* row, int64_t i, __m256& lo, __m256& hi) {
    lo = widen8(row + 2 * i);
    hi = widen8(row + 2 * i + 16);
  }
  static const float* tail(const uint8_t* row, int64_t i, int64_t n, float* tmp) {
    widen_scalar(DType::BF16, row + 2 * i, n, tmp);
    return tmp;
  }
};

// The whole 16-value steps of float_subtile (k16 values), continuing the
// lanes at acc_io (layout there), or with `zero` starting them at +0
// (acc_io not read); with `out` set, out[c * lda + r] = reduce16 of the
// lanes instead of storing them. Apart from the masked tail on purpose, as
// float_steps of matmul_avx512.cpp: with the tail in the same function GCC
// 12 stored every accumulator to memory on every step. With in_register,
// measured on the Zen 5 class VM with the AVX2 kernels: a 4 x 4 float tile
// over K blocks of 1024 (weights from L2), one thread, 68 -> 87 GFLOP/s
// (peak ~110); 5632 x 2048 F16 weights x 512 rows, two threads, 107-121 ->
// 147-156; `encore bench` F16 prefill 512, 48-49 -> 55-67 tok/s.
template <int R, int C, class L, size_t kAhead>
__attribute__((noinline)) void float_steps(const uint8_t* w, size_t stride, const float* x,
                                           int64_t x_stride, int64_t k16, float* acc_io, int lda,
                                           bool zero, float* out) {
  __m256 acc[C][R][2];
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      acc[c][r][0] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(acc_io + 16 * (c * lda + r));
      acc[c][r][1] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(acc_io + 16 * (c * lda + r) + 8);
    }
  }
  for (int64_t i = 0; i < k16; i += 16) {
    __m256 wv[R][2];
    for (int r = 0; r < R; ++r) {
      if (kAhead > 0 && i % 32 == 0) {  // 64 bytes of a 16-bit row
        _mm_prefetch(reinterpret_cast<const char*>(w + (r + kAhead) * stride + 2 * i), _MM_HINT_T0);
      }
      L::load(w + r * stride, i, wv[r][0], wv[r][1]);
      wv[r][0] = in_register(wv[r][0]);
      wv[r][1] = in_register(wv[r][1]);
    }
    for (int c = 0; c < C; ++c) {
      const __m256 x0 = in_register(_mm256_loadu_ps(x + c * x_stride + i));
      const __m256 x1 = in_register(_mm256_loadu_ps(x + c * x_stride + i + 8));
      for (int r = 0; r < R; ++r) {
        acc[c][r][0] = _mm256_fmadd_ps(wv[r][0], x0, acc[c][r][0]);
        acc[c][r][1] = _mm256_fmadd_ps(wv[r][1], x1, acc[c][r][1]);
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      if (out != nullptr) {
        out[c * lda + r] = reduce16(acc[c][r][0], acc[c][r][1]);
      } else {
        _mm256_storeu_ps(acc_io + 16 * (c * lda + r), acc[c][r][0]);
        _mm256_storeu_ps(acc_io + 16 * (c * lda + r) + 8, acc[c][r][1]);
      }
    }
  }
}

// Sub-tile of R <= 2 x C <= 2 canonical dot products over k more values of
// weight rows `stride` bytes apart, continuing their 16 lanes (2 registers)
// at acc_io + 16 * (c * lda + r), or from +0 with `zero`; with `out` set
// also out[c * lda + r] = the whole dot products (IsaKernels::float_tile).
// kAhead > 0: also prefetch the same bytes kAhead rows further on (F16/BF16
// rows read in place).
template <int R, int C, class L, size_t kAhead>
void float_subtile(const uint8_t* w, size_t stride, const float* x, int64_t x_stride, int64_t k,
                   float* acc_io, int lda, bool zero, float* out) {
  const int64_t k16 = k / 16 * 16;
  if (k16 == k) {  // whole steps only: the lanes stay in registers
    float_steps<R, C, L, kAhead>(w, stride, x, x_stride, k16, acc_io, lda, zero, out);
    return;
  }
  if (zero) {
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < R; ++r) std::fill_n(acc_io + 16 * (c * lda + r), 16, 0.0f);
  }
  if (k16 > 0)
    float_steps<R, C, L, kAhead>(w, stride, x, x_stride, k16, acc_io, lda, false, nullptr);
  // Lanes past k keep their accumulator (blend), as in the scalar twin: an
  // fma(0, 0, -0) would turn a -0 lane (an underflowed negative product)
  // into +0.
  const __m256i m0 = tail_mask(k - k16), m1 = tail_mask(k - k16 - 8);
  float tmp[R][16];
  const float* wt[R];
  for (int r = 0; r < R; ++r) wt[r] = L::tail(w + r * stride, k16, k - k16, tmp[r]);
  for (int c = 0; c < C; ++c) {
    const __m256 x0 = _mm256_maskload_ps(x + c * x_stride + k16, m0);
    const __m256 x1 = _mm256_maskload_ps(x + c * x_stride + k16 + 8, m1);
    for (int r = 0; r < R; ++r) {
      float* lanes = acc_io + 16 * (c * lda + r);
      const __m256 a0 = _mm256_loadu_ps(lanes), a1 = _mm256_loadu_ps(lanes + 8);
      const __m256 w0 = _mm256_maskload_ps(wt[r], m0);
      const __m256 w1 = _mm256_maskload_ps(wt[r] + 8, m1);
      _mm256_storeu_ps(lanes,
                       _mm256_blendv_ps(a0, _mm256_fmadd_ps(w0, x0, a0), _mm256_castsi256_ps(m0)));
      _mm256_storeu_ps(lanes + 8,
                       _mm256_blendv_ps(a1, _mm256_fmadd_ps(w1, x1, a1), _mm256_castsi256_ps(m1)));
    }
  }
  if (out == nullptr) return;
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      const float* lanes = acc_io + 16 * (c * lda + r);
      out[c * lda + r] = reduce16(_mm256_loadu_ps(lanes), _mm256_loadu_ps(lanes + 8));
    }
  }
}

// IsaKernels::float_tile on rows read with L, as 2 x 2 sub-tiles.
template <class L, size_t kAhead>
void float_block_2x2(int R, int C, const uint8_t* w, size_t stride, const float* x,
                     int64_t x_stride, int64_t k, bool first, float* acc, float* out) {
  using Fn =
      void (*)(const uint8_t*, size_t, const float*, int64_t, int64_t, float*, int, bool, float*);
  static constexpr Fn kFns[2][2] = {
      {&float_subtile<1, 1, L, kAhead>, &float_subtile<1, 2, L, kAhead>},
      {&float_subtile<2, 1, L, kAhead>, &float_subtile<2, 2, L, kAhead>}};
  for (int c = 0; c < C; c += 2) {
    for (int r = 0; r < R; r += 2) {
      const int rr = R - r >= 2 ? 2 : 1, cc = C - c >= 2 ? 2 : 1;
      kFns[rr - 1][cc - 1](w + r * stride, stride, x + c * x_stride, x_stride, k,
                           acc + 16 * (c * R + r), R, first,
                           out != nullptr ? out + c * R + r : nullptr);
    }
  }
}

void float_tile_avx2(int R, int C, const float* w, int64_t w_stride, const float* x,
                     int64_t x_stride, int64_t k, bool first, float* acc, float* out) {
  float_block_2x2<LoadF32, 0>(R, C, reinterpret_cast<const uint8_t*>(w), w_stride * sizeof(float),
                              x, x_stride, k, first, acc, out);
}

#ifndef ENCORE_PF_FLOAT
#define ENCORE_PF_FLOAT 8
#endif

// Up to 8 rows (the 8-stream decode): reading F16/BF16 in place was 1.7x
// the speed of widening the rows first at 8 activation rows (single thread,
// 2048 x 8192) and 1.5x end to end (`encore bench`, 8 streams of the 1b F16
// model, 2 threads); above that (prefill) the two measured the same.
bool has_direct_float_avx2(DType t, int64_t m) {
  return m <= kDecodeRows && (t == DType::F16 || t == DType::BF16);
}

void direct_float_tile_avx2(DType t, int R, int C, const uint8_t* w, size_t row_bytes,
                            const float* x, int64_t x_stride, int64_t k, float* out) {
  float acc[kMaxTileR * kMaxTileC][16];  // used only where k is not a multiple of 16
  if (t == DType::F16) {
    float_block_2x2<LoadF16, ENCORE_PF_FLOAT>(R, C, w, row_bytes, x, x_stride, k, true, &acc[0][0],
                                              out);
  } else {
    float_block_2x2<LoadBF16, ENCORE_PF_FLOAT>(R, C, w, row_bytes, x, x_stride, k, true, &acc[0][0],
                                               out);
  }
}

void widen_avx2(DType t, const uint8_t* src, int64_t k, float* dst) {
  const int64_t k8 = k / 8 * 8;
  if (t == DType::F16) {
    // vcvtph2ps is exact (it only quiets signalling NaNs; outputs are
    // NaN-canonicalised anyway).
    for (int64_t i = 0; i < k8; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
  } else if (t == DType::BF16) {
    for (int64_t i = 0; i < k8; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
      _mm256_storeu_ps(dst + i,
                       _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    }
  } else {
    widen_scalar(t, src, k, dst);
    return;
  }
  if (k8 < k) widen_scalar(t, src + 2 * k8, k - k8, dst + k8);
}

}  // namespace

const IsaKernels& avx2_kernels() {
  static const IsaKernels k{quantize_act_avx2, panel_tile_avx2,       float_tile_avx2,
                            widen_avx2,        has_direct_float_avx2, direct_float_tile_avx2};
  return k;
}

}  // namespace encore::kernels::mm
