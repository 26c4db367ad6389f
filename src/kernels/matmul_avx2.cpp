// AVX2 + FMA + F16C matmul kernels: the canonical order of matmul_internal.h
// with 256-bit vectors (activation quantisation, and the float panel kernel
// of float_panel_kernel.h; the integer panel kernel is
// matmul_panel_avx2.cpp). Compiled with -mavx2 -mfma
// -mf16c -mbmi2 and only called after isa_supported(Isa::Avx2).
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

#include "kernels/float_panel_kernel.h"
#include "kernels/matmul_internal.h"
#include "kernels/vec_avx2.h"

namespace encore::kernels::mm {
namespace {

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
    int8_t* const q = act_q(a, i, g);
    const int64_t at = act_at(a, i, g);
    if (ab >= kInfBits || ab < kTinyBits) {
      quantize_group_scalar(xg, ab, q, a.d + at, a.asum + at);
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
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), b);
    a.d[at] = dg;
    a.asum[at] = dg * static_cast<float>(hsum_epi32(sum));
  }
}

// The float panel kernel's tiles: up to 12 accumulators of the 16 ymm
// registers, 2 registers (one panel of 16 rows) x 6 activation rows for
// prefill, up to 4 registers (two panels) for decode-sized batches.
struct VF256 : avx2::Vec {
  static constexpr int kFloatAcc = 12;
  static constexpr int kFloatNR = 4;
  static constexpr int kFloatC = 6;
  static constexpr int kFloatCMax = 8;
};

}  // namespace

const IsaKernels& avx2_kernels() {
  static const IsaKernels k{.quantize_act = quantize_act_avx2,
                            .panel_tile = panel_tile_avx2,
                            .float_panels = float_panel_kernel::float_panels<VF256>,
                            .act_rows = 4};
  return k;
}

}  // namespace encore::kernels::mm
