// The integer panel kernel (panel_kernel.h) for AVX2 CPUs with AVX-VNNI
// (Isa::AvxVnni: Alder Lake and later Intel cores, Zen 5): AVX2's
// operations (panel_int_avx2.h) with vpdpbusd on ymm, which sums 4 products
// per row into int32 in one instruction where maddubs, madd and add take
// three. The same sums, exactly, so the same bits. Compiled with -mavxvnni
// besides AVX2's flags, and only called after isa_supported(Isa::AvxVnni).
#include <immintrin.h>

#include "kernels/matmul_internal.h"
#include "kernels/panel_int_avx2.h"
#include "kernels/panel_kernel.h"
#include "kernels/probe_internal.h"

namespace encore::kernels::mm {
namespace {

struct V256Vnni : V256 {  // tiles of up to 4 activation rows, as AVX2's
  // As AVX-512's: signed weight bytes made unsigned (w + 128); the kernel
  // subtracts 128 times the activations' sum.
  static constexpr int kI8Bias = 128;
  static constexpr bool kI16Acc = false;     // vpdpbusd sums into int32 itself
  static constexpr bool kScaledDot = false;  // Q6_K's sub-scales multiply the sums after
  static I dot(I acc, I u, I q) { return _mm256_dpbusd_avx_epi32(acc, u, q); }
  static I dot_i8(I acc, I w, I q) {
    return _mm256_dpbusd_avx_epi32(acc, _mm256_xor_si256(w, set1_epi8(0x80)), q);
  }
  static I low16(I a) { return _mm256_srai_epi32(_mm256_slli_epi32(a, 16), 16); }
  static I high16(I a) { return _mm256_srai_epi32(a, 16); }
  static I mullo(I a, I b) { return _mm256_mullo_epi32(a, b); }
};

void panel_tile_avxvnni(DType t, const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0,
                        int C, float* out) {
  panel_kernel::panel_tile<V256Vnni>(t, panel, k, a, i0, C, out);
}

}  // namespace

const IsaKernels& avxvnni_kernels() {
  static const IsaKernels k = [] {
    IsaKernels t = avx2_kernels();
    t.panel_tile = panel_tile_avxvnni;
    return t;
  }();
  return k;
}

}  // namespace encore::kernels::mm

namespace encore::kernels::probe_detail {

int32_t int8_loop_avxvnni(int64_t iters) {
  __m256i acc[kIntChains];
  for (int c = 0; c < kIntChains; ++c) acc[c] = _mm256_set1_epi32(c);
  __m256i u = _mm256_set1_epi8(3);
  __m256i s = _mm256_set1_epi8(-2);
  for (int64_t i = 0; i < iters; ++i) {
    for (int c = 0; c < kIntChains; ++c) {
      __asm__("" : "+x"(u), "+x"(s));  // as int8_loop_avx2: no hoisting or sharing
      acc[c] = _mm256_dpbusd_avx_epi32(acc[c], u, s);
    }
  }
  __m256i sum = acc[0];
  for (int c = 1; c < kIntChains; ++c) sum = _mm256_add_epi32(sum, acc[c]);
  return _mm256_cvtsi256_si32(sum);
}

}  // namespace encore::kernels::probe_detail
