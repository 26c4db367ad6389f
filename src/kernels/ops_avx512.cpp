// AVX-512 versions of the ops.h kernels (see ops_simd.h). Each one performs
// the scalar twin's operations lane by lane, in the same order: one zmm
// register holds the 16 lanes of a canonical dot product or lane sum, and
// tails use masked loads and masked FMAs so untouched lanes keep their
// values exactly as the scalar loop leaves them.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined_*() placeholders (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernels/canonical.h"  // kDotLanes; reduce16 is re-stated below
#include "kernels/ops_math.h"
#include "kernels/ops_simd.h"

namespace encore::kernels::avx512 {
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

__mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

// exp_f32_ref on 16 lanes, operation for operation.
inline __m512 exp16(__m512 x) {
  using namespace expf_const;
  // maxps(a, b) = a > b ? a : b and minps likewise: NaN lanes clamp to kMin.
  __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(kMin));
  xc = _mm512_min_ps(xc, _mm512_set1_ps(kMax));
  const __m512 shifter = _mm512_set1_ps(kShifter);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(kLog2e), shifter), shifter);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), xc);  // fma(-n, hi, xc)
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kC7);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC5));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i ni = _mm512_cvttps_epi32(n);
  const __m512i n1 = _mm512_srai_epi32(ni, 1);
  const __m512i n2 = _mm512_sub_epi32(ni, n1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
  const __m512 res = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_add_ps(res, nan, x, x);
}

// silu_ref on 16 lanes: x / (1 + exp(-x)); -x flips the sign bit like the
// scalar negation.
inline __m512 silu16(__m512 x) {
  const __m512 neg = _mm512_xor_ps(x, _mm512_set1_ps(-0.0f));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(neg)));
}

float reduce16_reg(__m512 acc) {
  alignas(64) float lanes[kDotLanes];
  _mm512_store_ps(lanes, acc);
  return fold16(lanes);
}

// reduce16 of 16 accumulators at once: result lane k = reduce16(acc[k]).
// Each level adds lane l and lane l + half of every accumulator (the pairs of
// canonical.h's fold tree) while packing two accumulators into one register.
// After four levels key 4t + L sits at position 4L + t; one permute restores
// the order.
inline __m512 reduce16x16(const __m512* acc) {
  __m512 c[8], d[4], e[2];
  for (int i = 0; i < 8; ++i) {  // 16 -> 8 lanes: acc[l] + acc[l + 8]
    const __m512 a = acc[2 * i], b = acc[2 * i + 1];
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int i = 0; i < 4; ++i) {  // 8 -> 4: s8[l] + s8[l + 4]
    const __m512 a = c[2 * i], b = c[2 * i + 1];
    d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  for (int i = 0; i < 2; ++i) {  // 4 -> 2: s4[0] + s4[2], s4[1] + s4[3]
    const __m512 a = d[2 * i], b = d[2 * i + 1];
    e[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // 2 -> 1: s0 + s1.
  const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(idx, f);
}

void widen_f16(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, src + 2 * i);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(h));
  }
}

// 16 rows (fewer at the end: missing rows repeat the last one and are not
// stored) against one query head.
inline void scores16(const float* qh, int head_dim, const float* const* rp, float scale, float* s,
                     __mmask16 store_mask) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) acc[k] = _mm512_setzero_ps();
  int c = 0;
  for (; c + 16 <= head_dim; c += 16) {
    const __m512 qv = _mm512_loadu_ps(qh + c);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) acc[k] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rp[k] + c), acc[k]);
  }
  if (c < head_dim) {
    const __mmask16 m = tail_mask(head_dim - c);
    const __m512 qv = _mm512_maskz_loadu_ps(m, qh + c);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) {
      acc[k] = _mm512_mask3_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, rp[k] + c), acc[k], m);
    }
  }
  const __m512 dots = _mm512_mul_ps(reduce16x16(acc), _mm512_set1_ps(scale));
  _mm512_mask_storeu_ps(s, store_mask, dots);
}

void scores(const float* q, int n_heads, int head_dim, const float* const* rows, int n_rows,
            float scale, float* s, int64_t s_stride) {
  for (int r0 = 0; r0 < n_rows; r0 += 16) {
    const int nr = n_rows - r0 < 16 ? n_rows - r0 : 16;
    const float* rp[16];
    for (int k = 0; k < 16; ++k) rp[k] = rows[r0 + (k < nr ? k : nr - 1)];
    for (int h = 0; h < n_heads; ++h) {
      scores16(q + static_cast<int64_t>(h) * head_dim, head_dim, rp, scale, s + h * s_stride + r0,
               tail_mask(nr));
    }
  }
}

float max(const float* s, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(s + j), m);  // NaN s: keep m
  if (j < n) {
    const __mmask16 k = tail_mask(n - j);
    m = _mm512_mask_max_ps(m, k, _mm512_maskz_loadu_ps(k, s + j), m);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, m);
  float r = -INFINITY;
  for (float v : lanes) r = v > r ? v : r;
  return r;
}

float exp_sum(float* s, int64_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv));
    _mm512_storeu_ps(s + j, p);
    acc = _mm512_add_ps(acc, p);
  }
  if (j < n) {
    const __mmask16 k = tail_mask(n - j);
    const __m512 p = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), mv));
    _mm512_mask_storeu_ps(s + j, k, p);
    acc = _mm512_mask_add_ps(acc, k, acc, p);
  }
  return reduce16_reg(acc);
}

// One head, dims [d0, d0 + 16 * NV) of o (the last register masked by `last`),
// accumulated over all rows in order.
template <int NV>
void accumulate_tile(const float* ph, const float* const* rows, int n_rows, int d0, __mmask16 last,
                     float* oh) {
  __m512 acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV - 1; ++v) acc[v] = _mm512_loadu_ps(oh + d0 + 16 * v);
  acc[NV - 1] = _mm512_maskz_loadu_ps(last, oh + d0 + 16 * (NV - 1));
  for (int r = 0; r < n_rows; ++r) {
    const __m512 p = _mm512_set1_ps(ph[r]);
    const float* row = rows[r] + d0;
#pragma GCC unroll 8
    for (int v = 0; v < NV - 1; ++v)
      acc[v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(row + 16 * v), acc[v]);
    acc[NV - 1] = _mm512_fmadd_ps(p, _mm512_maskz_loadu_ps(last, row + 16 * (NV - 1)), acc[NV - 1]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV - 1; ++v) _mm512_storeu_ps(oh + d0 + 16 * v, acc[v]);
  _mm512_mask_storeu_ps(oh + d0 + 16 * (NV - 1), last, acc[NV - 1]);
}

void accumulate(const float* p, int n_heads, int64_t p_stride, const float* const* rows, int n_rows,
                int head_dim, float* o) {
  constexpr int kTile = 128;  // 8 registers: 8 independent FMA chains per row
  for (int h = 0; h < n_heads; ++h) {
    const float* ph = p + h * p_stride;
    float* oh = o + static_cast<int64_t>(h) * head_dim;
    for (int d0 = 0; d0 < head_dim; d0 += kTile) {
      const int nd = head_dim - d0 < kTile ? head_dim - d0 : kTile;
      const int nv = (nd + 15) / 16;
      const __mmask16 last = tail_mask(nd - 16 * (nv - 1));
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
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, k, exp16(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
    acc = _mm512_mask3_fmadd_ps(v, v, acc, k);
  }
  const float mean = reduce16_reg(acc) / static_cast<float>(n);
  const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(mean + eps));
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 y =
        _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), scale), _mm512_loadu_ps(w + i));
    _mm512_storeu_ps(out + i, y);
  }
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), scale),
                                   _mm512_maskz_loadu_ps(k, w + i));
    _mm512_mask_storeu_ps(out + i, k, y);
  }
}

void swiglu(float* out, const float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 y = _mm512_mul_ps(silu16(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i));
    _mm512_storeu_ps(out + i, y);
  }
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 y =
        _mm512_mul_ps(silu16(_mm512_maskz_loadu_ps(k, gate + i)), _mm512_maskz_loadu_ps(k, up + i));
    _mm512_mask_storeu_ps(out + i, k, y);
  }
}

}  // namespace encore::kernels::avx512
