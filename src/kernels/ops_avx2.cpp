// AVX2 versions of the ops.h kernels (see ops_simd.h). Each one performs the
// scalar twin's operations lane by lane, in the same order: a pair of ymm
// registers holds the 16 lanes of a canonical dot product or lane sum (lanes
// 0-7 and 8-15). Short tails run the scalar reference code itself on the
// spilled lanes, which gives the same bits by construction.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/canonical.h"  // kDotLanes; reduce16 is re-stated below
#include "kernels/fp16.h"
#include "kernels/ops_math.h"
#include "kernels/ops_simd.h"

namespace encore::kernels::avx2 {
namespace {

// canonical.h's reduce16 fold, restated with internal linkage so this
// translation unit (compiled with AVX flags) never supplies the out-of-line
// copy that baseline code might link against.
float fold16(const float* acc) {
  float s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// Lanes [0, count) set (count may be <= 0 or >= 8).
inline __m256i lane_mask(int count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// exp_f32_ref on 8 lanes, operation for operation.
inline __m256 exp8(__m256 x) {
  using namespace expf_const;
  // maxps(a, b) = a > b ? a : b and minps likewise: NaN lanes clamp to kMin.
  __m256 xc = _mm256_max_ps(x, _mm256_set1_ps(kMin));
  xc = _mm256_min_ps(xc, _mm256_set1_ps(kMax));
  const __m256 shifter = _mm256_set1_ps(kShifter);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(kLog2e), shifter), shifter);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);  // fma(-n, hi, xc)
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC7);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvttps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  const __m256 res = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_ps(res, _mm256_add_ps(x, x), nan);
}

inline __m256 silu8(__m256 x) {
  const __m256 neg = _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));  // scalar -x: sign flip
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(neg)));
}

void spill(__m256 lo, __m256 hi, float* lanes) {
  _mm256_storeu_ps(lanes, lo);
  _mm256_storeu_ps(lanes + 8, hi);
}

// reduce16 of 4 accumulators (lanes 0-7 in lo[k], 8-15 in hi[k]) at once:
// result lane k = reduce16(acc k). Each step adds the pairs of canonical.h's
// fold tree.
inline __m128 reduce16x4(const __m256* lo, const __m256* hi) {
  __m256 s8[4];
  for (int k = 0; k < 4; ++k) s8[k] = _mm256_add_ps(lo[k], hi[k]);  // acc[l] + acc[l + 8]
  // s8[l] + s8[l + 4]: [k0 s4 | k1 s4] and [k2 s4 | k3 s4].
  const __m256 t01 = _mm256_add_ps(_mm256_permute2f128_ps(s8[0], s8[1], 0x20),
                                   _mm256_permute2f128_ps(s8[0], s8[1], 0x31));
  const __m256 t23 = _mm256_add_ps(_mm256_permute2f128_ps(s8[2], s8[3], 0x20),
                                   _mm256_permute2f128_ps(s8[2], s8[3], 0x31));
  // s4[0] + s4[2], s4[1] + s4[3]: [k0 s0 s1, k2 s0 s1 | k1 s0 s1, k3 s0 s1].
  const __m256 u = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 2, 3, 2)));
  // s0 + s1: [k0, k2, k0, k2 | k1, k3, k1, k3].
  const __m256 v = _mm256_hadd_ps(u, u);
  return _mm_unpacklo_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
}

void widen_f16(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = fp16_to_f32(h);
  }
}

// 4 rows (fewer at the end: missing rows repeat the last one and are not
// stored) against one query head.
inline void scores4(const float* qh, int head_dim, const float* const* rp, float scale, float* s,
                    int nr) {
  __m256 lo[4], hi[4];
  for (int k = 0; k < 4; ++k) lo[k] = hi[k] = _mm256_setzero_ps();
  int c = 0;
  for (; c + 16 <= head_dim; c += 16) {
    const __m256 ql = _mm256_loadu_ps(qh + c), qhi = _mm256_loadu_ps(qh + c + 8);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      lo[k] = _mm256_fmadd_ps(ql, _mm256_loadu_ps(rp[k] + c), lo[k]);
      hi[k] = _mm256_fmadd_ps(qhi, _mm256_loadu_ps(rp[k] + c + 8), hi[k]);
    }
  }
  if (c < head_dim) {
    // Lanes at or past head_dim keep their accumulator (blend), as in the
    // scalar loop that never touches them.
    const int rem = head_dim - c;
    const __m256i ml = lane_mask(rem), mh = lane_mask(rem - 8);
    const __m256 ql = _mm256_maskload_ps(qh + c, ml), qhi = _mm256_maskload_ps(qh + c + 8, mh);
    for (int k = 0; k < 4; ++k) {
      const __m256 fl = _mm256_fmadd_ps(ql, _mm256_maskload_ps(rp[k] + c, ml), lo[k]);
      const __m256 fh = _mm256_fmadd_ps(qhi, _mm256_maskload_ps(rp[k] + c + 8, mh), hi[k]);
      lo[k] = _mm256_blendv_ps(lo[k], fl, _mm256_castsi256_ps(ml));
      hi[k] = _mm256_blendv_ps(hi[k], fh, _mm256_castsi256_ps(mh));
    }
  }
  const __m128 dots = _mm_mul_ps(reduce16x4(lo, hi), _mm_set1_ps(scale));
  if (nr == 4) {
    _mm_storeu_ps(s, dots);
  } else {
    float tmp[4];
    _mm_storeu_ps(tmp, dots);
    for (int k = 0; k < nr; ++k) s[k] = tmp[k];
  }
}

void scores(const float* q, int n_heads, int head_dim, const float* const* rows, int n_rows,
            float scale, float* s, int64_t s_stride) {
  for (int r0 = 0; r0 < n_rows; r0 += 4) {
    const int nr = n_rows - r0 < 4 ? n_rows - r0 : 4;
    const float* rp[4];
    for (int k = 0; k < 4; ++k) rp[k] = rows[r0 + (k < nr ? k : nr - 1)];
    for (int h = 0; h < n_heads; ++h) {
      scores4(q + static_cast<int64_t>(h) * head_dim, head_dim, rp, scale, s + h * s_stride + r0,
              nr);
    }
  }
}

float max(const float* s, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(s + j), m);  // NaN s: keep m
  float lanes[8];
  _mm256_storeu_ps(lanes, m);
  float r = -INFINITY;
  for (float v : lanes) r = v > r ? v : r;
  for (; j < n; ++j) r = s[j] > r ? s[j] : r;
  return r;
}

float exp_sum(float* s, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256 pl = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    const __m256 ph = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), mv));
    _mm256_storeu_ps(s + j, pl);
    _mm256_storeu_ps(s + j + 8, ph);
    lo = _mm256_add_ps(lo, pl);
    hi = _mm256_add_ps(hi, ph);
  }
  float lanes[kDotLanes];
  spill(lo, hi, lanes);
  for (; j < n; ++j) {
    s[j] = exp_f32_ref(s[j] - m);
    lanes[j % kDotLanes] = lanes[j % kDotLanes] + s[j];
  }
  return fold16(lanes);
}

// One head, dims [d0, d0 + 8 * NV) of o (the last register partial: mask
// `last`), accumulated over all rows in order.
template <int NV>
void accumulate_tile(const float* ph, const float* const* rows, int n_rows, int d0, __m256i last,
                     float* oh) {
  __m256 acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV - 1; ++v) acc[v] = _mm256_loadu_ps(oh + d0 + 8 * v);
  acc[NV - 1] = _mm256_maskload_ps(oh + d0 + 8 * (NV - 1), last);
  for (int r = 0; r < n_rows; ++r) {
    const __m256 p = _mm256_set1_ps(ph[r]);
    const float* row = rows[r] + d0;
#pragma GCC unroll 8
    for (int v = 0; v < NV - 1; ++v)
      acc[v] = _mm256_fmadd_ps(p, _mm256_loadu_ps(row + 8 * v), acc[v]);
    acc[NV - 1] = _mm256_fmadd_ps(p, _mm256_maskload_ps(row + 8 * (NV - 1), last), acc[NV - 1]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV - 1; ++v) _mm256_storeu_ps(oh + d0 + 8 * v, acc[v]);
  _mm256_maskstore_ps(oh + d0 + 8 * (NV - 1), last, acc[NV - 1]);
}

void accumulate(const float* p, int n_heads, int64_t p_stride, const float* const* rows, int n_rows,
                int head_dim, float* o) {
  constexpr int kTile = 64;  // 8 registers: 8 independent FMA chains per row
  for (int h = 0; h < n_heads; ++h) {
    const float* ph = p + h * p_stride;
    float* oh = o + static_cast<int64_t>(h) * head_dim;
    for (int d0 = 0; d0 < head_dim; d0 += kTile) {
      const int nd = head_dim - d0 < kTile ? head_dim - d0 : kTile;
      const int nv = (nd + 7) / 8;
      const __m256i last = lane_mask(nd - 8 * (nv - 1));
      switch (nv) {
        case 1:
          accumulate_tile<1>(ph, rows, n_rows, d0, last, oh);
          break;
        case 2:
          accumulate_tile<2>(ph, rows, n_rows, d0, last, oh);
          break;
        case 3:
          accumulate_tile<3>(ph, rows, n_rows, d0, last, oh);
          break;
        case 4:
          accumulate_tile<4>(ph, rows, n_rows, d0, last, oh);
          break;
        case 5:
          accumulate_tile<5>(ph, rows, n_rows, d0, last, oh);
          break;
        case 6:
          accumulate_tile<6>(ph, rows, n_rows, d0, last, oh);
          break;
        case 7:
          accumulate_tile<7>(ph, rows, n_rows, d0, last, oh);
          break;
        default:
          accumulate_tile<8>(ph, rows, n_rows, d0, last, oh);
          break;
      }
    }
  }
}

}  // namespace

const AttnKernels kAttn = {widen_f16, scores, max, exp_sum, accumulate};

void exp_n(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] = exp_f32_ref(x[i]);
}

void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    lo = _mm256_fmadd_ps(a, a, lo);
    hi = _mm256_fmadd_ps(b, b, hi);
  }
  float lanes[kDotLanes];
  spill(lo, hi, lanes);
  for (; i < n; ++i) lanes[i % kDotLanes] = std::fma(x[i], x[i], lanes[i % kDotLanes]);
  const float mean = fold16(lanes) / static_cast<float>(n);
  const float scale = 1.0f / std::sqrt(mean + eps);
  const __m256 sv = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 y =
        _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _mm256_loadu_ps(w + i));
    _mm256_storeu_ps(out + i, y);
  }
  for (; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

void swiglu(float* out, const float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 y = _mm256_mul_ps(silu8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i));
    _mm256_storeu_ps(out + i, y);
  }
  for (; i < n; ++i) out[i] = silu_ref(gate[i]) * up[i];
}

}  // namespace encore::kernels::avx2
