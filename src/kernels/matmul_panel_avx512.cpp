// The integer panel kernel (panel_kernel.h) for AVX-512 with VNNI: one zmm
// register holds 16 rows, vpdpbusd sums 4 products per row.
// GCC 12 flags the _mm512_undefined_*() pass-through operands inside its own
// AVX-512 intrinsics as uninitialised (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/matmul_internal.h"
#include "kernels/panel_kernel.h"
#include "kernels/vec_avx512.h"

namespace encore::kernels::mm {
namespace {

// The float operations (and kW: rows per register) are avx512::Vec's.
struct V512 : avx512::Vec {
  using Vec::add;
  using Vec::sub;
  using I = __m512i;
  // Activation rows per tile (of 32 registers), for every type: each weight
  // register feeds 8 rows, and 8 streams read a panel once. bench_matmul
  // against tiles of 4 for the types with halves or offsets: m = 512, Q4_K
  // 14.8 -> 12.8 ms, Q6_K 19.8 -> 15.9; m = 8, Q6_K 51 -> 39.
  static constexpr int kMaxC = 8;
  // Signed weight bytes are made unsigned (w + 128) for vpdpbusd; the kernel
  // subtracts 128 times the activations' sum.
  static constexpr int kI8Bias = 128;
  static I izero() { return _mm512_setzero_si512(); }
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I set1_epi8(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  static I bcast(int32_t v) { return _mm512_set1_epi32(v); }
  static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  template <int N>
  static I srli(I a) {
    return _mm512_srli_epi32(a, N);
  }
  template <int N>
  static I slli(I a) {
    return _mm512_slli_epi32(a, N);
  }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I mullo(I a, I b) { return _mm512_mullo_epi32(a, b); }
  // acc + per row the sum of 4 products of unsigned u and signed q bytes.
  static I dot(I acc, I u, I q) { return _mm512_dpbusd_epi32(acc, u, q); }
  static I dot_i8(I acc, I w, I q) {
    return _mm512_dpbusd_epi32(acc, _mm512_xor_si512(w, set1_epi8(0x80)), q);
  }
  static F u8_to_f(const uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // The int8 pairs of 16 rows at p (32 bytes), each pair one 32-bit lane of
  // two int16; low16 / high16 sign-extend either half to the whole lane.
  static I s8_pairs(const uint8_t* p) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static I low16(I a) { return _mm512_srai_epi32(_mm512_slli_epi32(a, 16), 16); }
  static I high16(I a) { return _mm512_srai_epi32(a, 16); }
  // vpdpbusd cannot scale inside: Q6_K's sub-scales are multiplied after.
  static constexpr bool kScaledDot = false;
  static constexpr bool kI16Acc = false;               // vpdpbusd sums into int32 itself
  static F cvt(I a) { return _mm512_cvtepi32_ps(a); }  // exact: |a| < 2^24
};

}  // namespace

void panel_tile_avx512(DType t, const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0,
                       int C, float* out) {
  panel_kernel::panel_tile<V512>(t, panel, k, a, i0, C, out);
}

}  // namespace encore::kernels::mm
