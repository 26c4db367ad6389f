// AVX-512 (F/BW/DQ/VL + VNNI) matmul kernels: the canonical order of
// matmul_internal.h with one 512-bit register per pair, covering two 32-value
// groups: lane L of vpdpbusd sums bytes 4L..4L+3, i.e. lane L % 8 of group
// 2t + L / 8, which is exactly acc[8 * (g % 2) + l] (legacy_tile_rows holds
// the same sums at permuted lanes, see there). Activation quantisation
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

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/block_scales_avx2.h"
#include "kernels/matmul_internal.h"

namespace encore::kernels::mm {
namespace {

#ifndef ENCORE_PF_ROWS2
#define ENCORE_PF_ROWS2 16
#endif
// How far ahead (in weight rows) the direct kernels prefetch; speed only.
constexpr size_t kPrefetchRows = ENCORE_PF_ROWS2;

// reduce16 of canonical.h on one register: acc[l] + acc[l + 8], then
// reduce8 (block_scales_avx2.h).
inline float reduce16(__m512 a) {
  return reduce8(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
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
      wv[r] = in_register(_mm512_loadu_si512(wp[r] + 64 * t));
      if (S)
        base[r] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                   _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, wv[r]));
      sc[r] = _mm512_permutexvar_ps(idx_ws, _mm512_broadcast_f32x4(_mm_loadu_ps(sp[r] + 4 * t)));
    }
    for (int c = 0; c < C; ++c) {
      __m512i qv = in_register(_mm512_loadu_si512(qp[c] + 64 * t));
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

// int_tile_t<R, C, true> for Q8_0 without the decode pass: the int8 values
// and fp16 scales come straight from the blocks (34 bytes: d, qs[32]), two
// blocks per register. ws lanes are [d(2t) x8, d(2t+1) x8], which is what
// int_tile_t builds from the decoded ws; an odd last block runs with a zero
// upper half (w = 0, ws = 0: the fma leaves those lanes as they are, exactly
// as the zero padding does), and the padding itself is skipped (a no-op).
template <int R, int C>
void q8_0_tile_t(const uint8_t* w, size_t row_bytes, int64_t k, const ActRows& a, int64_t i0,
                 float* out) {
  constexpr size_t kB = 34;  // sizeof(BlockQ8_0)
  const int64_t ng = a.kp / kGroup, nb = k / kGroup;
  const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i idx_da = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps();
  auto pair = [&](int64_t b, bool has_hi) {
    __m512i wv[R], base[R];
    __m512 sc[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * row_bytes + b * kB;
      // The same bytes kPrefetchRows rows further on: a steady trickle of
      // prefetches keeps the memory bus busy without bursts (prefetches
      // never fault, so running past the matrix end is harmless).
      _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchRows * row_bytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchRows * row_bytes + 64), _MM_HINT_T0);
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
      uint16_t d0, d1 = 0;
      __builtin_memcpy(&d0, p, 2);
      __m256i hi = _mm256_setzero_si256();
      if (has_hi) {
        hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kB + 2));
        __builtin_memcpy(&d1, p + kB, 2);
      }
      wv[r] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      base[r] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                 _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, wv[r]));
      const __m128 d = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(d0 | (uint32_t{d1} << 16))));
      sc[r] = _mm512_permutexvar_ps(idx_da, _mm512_castps128_ps512(d));
    }
    for (int c = 0; c < C; ++c) {
      const int8_t* q = a.q + (i0 + c) * a.kp + b * kGroup;
      const __m512i qv = _mm512_xor_si512(_mm512_loadu_si512(q), k80);
      const __m128 d2 = _mm_castsi128_ps(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.d + (i0 + c) * ng + b)));
      const __m512 dac = _mm512_permutexvar_ps(idx_da, _mm512_castps128_ps512(d2));
      for (int r = 0; r < R; ++r) {
        const __m512i p = _mm512_dpbusd_epi32(base[r], qv, wv[r]);
        acc[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sc[r], dac), acc[c][r]);
      }
    }
  };
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) pair(b, true);
  if (b < nb) pair(b, false);
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) out[c * R + r] = reduce16(acc[c][r]);
}

// legacy_scales8 of block_scales_avx2.h (the same values), eight blocks'
// fp16 fields gathered with one word permute instead of a 16-bit load, shift
// and or per field: the fields of blocks p + [0, 8) lie within p's first
// 128 bytes (l0, l1) or the eight blocks' last 64 (l2; Q4_0's all lie in
// the first 128). Words [0, 8) of the permute are the d, [8, 16) the m of
// the types with a min. A short last group (n < 8, at the row's end) takes
// the scalar path, which reads nothing past the row. Measured on the Zen 5
// class VM, two threads, weights from memory, one activation row (GOP/s,
// medians of 5 alternated runs): Q4_0 129 -> 146, Q4_1 94 -> 122, Q5_0
// 86 -> 94, Q5_1 76 -> 89; a vpgatherdd instead was slower (Q4_0 71).
template <class B>
struct ScaleIdx {
  static constexpr int kB = static_cast<int>(B::kBytes), kL2 = 8 * kB - 64;
  alignas(64) uint16_t lo[32] = {}, hi[32] = {};  // word indices into (l0, l1) / l2
  uint32_t from_l2 = 0;                           // words taken from l2
  constexpr ScaleIdx() {
    for (int i = 0; i < (B::kMin >= 0 ? 16 : 8); ++i) {
      const int o = (i % 8) * kB + (i < 8 ? 0 : B::kMin);  // the field's byte offset
      if (o + 2 <= 128) {
        lo[i] = static_cast<uint16_t>(o / 2);
      } else {
        hi[i] = static_cast<uint16_t>((o - kL2) / 2);
        from_l2 |= 1u << i;
      }
    }
  }
};

template <class B>
inline __m256 legacy_scales8_perm(const uint8_t* p, int n, __m256* m8) {
  if (n < 8) return legacy_scales8<B>(p, n, m8);
  static constexpr ScaleIdx<B> kIdx{};
  const __m512i l0 = _mm512_loadu_si512(p), l1 = _mm512_loadu_si512(p + 64);
  __m512i r = _mm512_permutex2var_epi16(l0, _mm512_load_si512(kIdx.lo), l1);
  if constexpr (kIdx.from_l2 != 0) {
    const __m512i l2 = _mm512_loadu_si512(p + ScaleIdx<B>::kL2);
    r = _mm512_mask_permutexvar_epi16(r, kIdx.from_l2, _mm512_load_si512(kIdx.hi), l2);
  }
  if constexpr (B::kMin >= 0) *m8 = _mm256_cvtph_ps(_mm512_extracti32x4_epi32(r, 1));
  return _mm256_cvtph_ps(_mm512_castsi512_si128(r));
}

// int_tile_t<R, C, S> for the 32-value block types Q4_0, Q4_1, Q5_0, Q5_1
// without the decode pass (layout in LegacyBlock, matmul_internal.h). A
// block is one group, two blocks (a pair) fill a register. The nibbles are
// used in the order they unpack to, 128-bit chunks [b lo, b+1 lo, b hi,
// b+1 hi] (lo: values 0..15 of a block, hi: 16..31), and the activations
// are put in the same order (one chunk shuffle per activation register,
// shared by the tile's rows): each accumulator lane then holds the same
// (group parity, lane) sequence as in int_tile_t, only at another position,
// and the lanes are put back in canonical order before reduce16. A pair's
// nibbles come from one 64-byte load and a word permute (every field starts
// on an even byte); a load from the pair runs past it, so the pairs within
// 64 bytes of the row's end use one that ends where the pair does (which a
// row under 64 bytes cannot: legacy_tile_t copies those into padded rows). A masked load
// instead was slower, even with every lane on. The scale products fl(d * da)
// are made eight blocks at a time (one vcvtph2ps and one multiply per row
// and activation row) and stay in registers; one permute per pair spreads
// them as [d(b) da x4, d(b+1) da x4] over both halves. (Through a stack
// array and broadcast loads, 8 % slower.) The unsigned values u = w + bias
// (<= 31) are the u8 side of vpdpbusd as they are; with a bias the
// accumulator starts at -bias * sum(q) per lane: sum(u * q) - bias * sum(q)
// = sum(w * q), exact in int32. An odd last block runs with whatever bytes
// precede it as its upper half, whose q are the zero padding: their products
// are 0 (a no-op), as is the bias term. Types with a min add the
// offset term: per eight blocks one fma of their m (+0 past the row's end)
// and asum into accm, which is accm[g % 8] of matmul_internal.h.
//
// Measured on the Zen 5 class VM against the previous kernel (two loads and
// two inserts per pair and row, scale products through a stack array, the
// scalar scale gather), two threads, 5632 x 2048 weights from memory, 1 / 8
// activation rows, medians of adjacent-run ratios: Q4_0 1.44x / 1.29x, Q4_1
// 1.43x / 1.14x, Q5_0 1.10x / 1.26x, Q5_1 1.24x / 1.18x; end to end, decode
// of the 1b synth at batch 1, Q4_0 36-42 -> 57-71 tok/s.
template <int R, int C, class B>
void legacy_tile_rows(const uint8_t* w, size_t row_bytes, int64_t k, const ActRows& a, int64_t i0,
                      float* out) {
  constexpr bool kMin = B::kMin >= 0;
  constexpr int kB = static_cast<int>(B::kBytes);
  const int64_t ng = a.kp / kGroup, nb = k / kGroup;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i bias = _mm512_set1_epi8(B::kBias);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  // Words [b qs, b+1 qs, b qs, b+1 qs] of the 64 bytes from block b (the
  // upper half is shifted right by 4 below).
  alignas(64) static constexpr auto kQsIdx = [] {
    std::array<uint16_t, 32> t{};
    for (int i = 0; i < 32; ++i)
      t[i] = static_cast<uint16_t>((i / 8 % 2) * kB / 2 + B::kQs / 2 + i % 8);
    return t;
  }();
  const __m512i qs_idx = _mm512_load_si512(kQsIdx.data());
  constexpr int64_t kLoadBlocks = (64 + kB - 1) / kB;  // blocks a 64-byte load touches
  // Pair t's products: lanes 2t, 2t+1 of the eight, each repeated 4 times.
  const __m512i idx0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
  __m512 acc[C][R];
  __m256 accm[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps(), accm[c][r] = _mm256_setzero_ps();
  __m512 prod[R][C];  // fl(d * da) of blocks b8 + [0, 8) in the low 8 lanes
  // Load: 0 from the pair (it stays in the row), 1 ending where the pair does
  // (the row's last pair), 2 either, chosen at run time (the second-to-last
  // pair may need it too).
  auto pair = [&](int64_t b, int t, bool has_hi, auto load) {
    constexpr int kLoad = decltype(load)::value;
    const int span = has_hi ? 2 : 1;  // blocks in the pair
    const bool back = kLoad == 1 || (kLoad == 2 && b + kLoadBlocks > nb);
    const int64_t off = back ? span * kB - 64 : 0;
    const __m512i idx =
        back ? _mm512_add_epi16(qs_idx, _mm512_set1_epi16(static_cast<int16_t>(-off / 2))) : qs_idx;
    __m512i wv[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * row_bytes + b * B::kBytes;
      const char* ahead = reinterpret_cast<const char*>(p + kPrefetchRows * row_bytes);
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 2 * B::kBytes - 1, _MM_HINT_T0);
      const uint8_t* p1 = p + B::kBytes;
      const __m512i z = _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(p + off));
      wv[r] = _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xffff0000u, z, 4), m4);
      if constexpr (B::kQh >= 0) {  // bit 4 of value j is bit j of qh, in the chunk order
        // pdep spreads each qh word's halves over the 16-byte chunks of its
        // block: [b lo, b+1 lo, b hi, b+1 hi]. Every AVX-512 CPU runs pdep in
        // hardware (the AVX2 kernels avoid it: microcoded on Zen 1/2). With
        // the shifts and ors it replaced, and a blend + or where the masked
        // add is now, Q5_0 / Q5_1 at one activation row ran 47 / 38 GOP/s,
        // now 76 / 63 (one thread, weights in L2, Zen 5 class VM).
        const uint64_t q0 = rd32(p + B::kQh), q1 = has_hi ? rd32(p1 + B::kQh) : 0u;
        const uint64_t mask =
            _pdep_u64(q0, 0x0000ffff0000ffffull) | _pdep_u64(q1, 0xffff0000ffff0000ull);
        wv[r] = _mm512_mask_add_epi8(wv[r], static_cast<__mmask64>(mask), wv[r], bit4);
      }
    }
    const __m512i sidx = _mm512_add_epi32(idx0, _mm512_set1_epi32(2 * t));
    for (int c = 0; c < C; ++c) {
      const __m512i q = _mm512_loadu_si512(a.q + (i0 + c) * a.kp + b * kGroup);
      const __m512i qv = _mm512_shuffle_i64x2(q, q, _MM_SHUFFLE(3, 1, 2, 0));
      __m512i base = _mm512_setzero_si512();
      if constexpr (B::kBias != 0) {
        base = _mm512_sub_epi32(base, _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, qv));
      }
      for (int r = 0; r < R; ++r) {
        const __m512i p = _mm512_dpbusd_epi32(base, wv[r], qv);
        const __m512 s = _mm512_permutexvar_ps(sidx, prod[r][c]);
        acc[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[c][r]);
      }
    }
  };
  using Fwd = std::integral_constant<int, 0>;
  // ng is a multiple of 8 (kPadTo), so eight activation scales from b8 exist.
  for (int64_t b8 = 0; b8 < nb; b8 += 8) {
    const int n = static_cast<int>(std::min<int64_t>(8, nb - b8));
    for (int r = 0; r < R; ++r) {
      __m256 m8;
      const __m256 d = legacy_scales8_perm<B>(w + r * row_bytes + b8 * B::kBytes, n, &m8);
      for (int c = 0; c < C; ++c) {
        if constexpr (kMin) {
          accm[c][r] =
              _mm256_fmadd_ps(m8, _mm256_loadu_ps(a.asum + (i0 + c) * ng + b8), accm[c][r]);
        }
        prod[r][c] =
            _mm512_castps256_ps512(_mm256_mul_ps(d, _mm256_loadu_ps(a.d + (i0 + c) * ng + b8)));
      }
    }
    // The common cases with constant counts and load kinds, unrolled.
    if (n == 8 && b8 + 6 + kLoadBlocks <= nb) {
      for (int t = 0; t < 4; ++t) pair(b8 + 2 * t, t, true, Fwd{});
    } else if (n == 8 && b8 + 8 == nb) {  // the row's last eight (K a multiple of 256)
      for (int t = 0; t < 3; ++t) pair(b8 + 2 * t, t, true, Fwd{});
      pair(b8 + 6, 3, true, std::integral_constant<int, 1>{});
    } else {
      for (int t = 0; 2 * t < n; ++t) {
        pair(b8 + 2 * t, t, 2 * t + 1 < n, std::integral_constant<int, 2>{});
      }
    }
  }
  // Lanes [g0 l0-3, g1 l0-3, g0 l4-7, g1 l4-7] back to [g0 l0-7, g1 l0-7].
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      out[c * R + r] =
          reduce16(_mm512_shuffle_f32x4(acc[c][r], acc[c][r], _MM_SHUFFLE(3, 1, 2, 0)));
      if constexpr (kMin) out[c * R + r] += reduce8(accm[c][r]);
    }
  }
}

// legacy_tile_rows, with rows under 64 bytes (k < 128 or so: tests, never a
// model) first copied behind 64 zero bytes: every pair of such a row loads
// backwards, up to 64 bytes before its end, which then stays in memory that
// is ours.
template <int R, int C, class B>
void legacy_tile_t(const uint8_t* w, size_t row_bytes, int64_t k, const ActRows& a, int64_t i0,
                   float* out) {
  const size_t bytes = static_cast<size_t>(k / kGroup) * B::kBytes;
  if (bytes >= 64) {
    legacy_tile_rows<R, C, B>(w, row_bytes, k, a, i0, out);
    return;
  }
  constexpr size_t kPadded = 64 + 64;  // the zeros, then the row
  alignas(64) uint8_t padded[R][kPadded] = {};
  for (int r = 0; r < R; ++r) std::memcpy(padded[r] + 64, w + r * row_bytes, bytes);
  legacy_tile_rows<R, C, B>(padded[0] + 64, kPadded, k, a, i0, out);
}

#include "kernels/direct_kquant_avx512.h"

using DirectFn = void (*)(const uint8_t*, size_t, int64_t, const ActRows&, int64_t, float*);

template <template <int, int> class F, int R, int... Cs>
constexpr auto drow_of(std::integer_sequence<int, Cs...>) {
  return std::array<DirectFn, sizeof...(Cs)>{&F<R, Cs + 1>::run...};
}

template <int R, int C>
struct Q8Direct {
  static void run(const uint8_t* w, size_t rb, int64_t k, const ActRows& a, int64_t i0,
                  float* out) {
    q8_0_tile_t<R, C>(w, rb, k, a, i0, out);
  }
};
template <class B>
struct LegacyDirect {
  template <int R, int C>
  struct F {
    static void run(const uint8_t* w, size_t rb, int64_t k, const ActRows& a, int64_t i0,
                    float* out) {
      legacy_tile_t<R, C, B>(w, rb, k, a, i0, out);
    }
  };
};
template <bool Q5>
struct Q45KDirect {
  template <int R, int C>
  struct F {
    static void run(const uint8_t* w, size_t rb, int64_t k, const ActRows& a, int64_t i0,
                    float* out) {
      q45_k_tile_t<R, C, Q5>(w, rb, k, a, i0, out);
    }
  };
};
template <int R, int C>
struct Q6KDirect {
  static void run(const uint8_t* w, size_t rb, int64_t k, const ActRows& a, int64_t i0,
                  float* out) {
    q6_k_tile_t<R, C>(w, rb, k, a, i0, out);
  }
};

template <template <int, int> class F>
constexpr std::array<std::array<DirectFn, 4>, 4> direct_table() {
  constexpr auto seq = std::make_integer_sequence<int, 4>{};
  return {drow_of<F, 1>(seq), drow_of<F, 2>(seq), drow_of<F, 3>(seq), drow_of<F, 4>(seq)};
}

// Every integer type up to 8 activation rows (decode), and further where
// reading the blocks in place (each block decoded once per 4 activation
// rows, from L1) still beat decoding the rows into a buffer first, measured
// single thread on 2048 x 2048 weights (GOP/s, buffer -> in place): Q8_0
// m = 32 147 -> 191, m = 64 146 -> 189, m = 512 126 -> 149; Q6_K m = 16
// 132 -> 160, m = 32 143 -> 164; Q4_K and Q5_K m = 16 132 -> 144 and
// 116 -> 130 (at 32 and above their gains were within this VM's noise).
// Q4_0, Q4_1, Q5_0 and Q5_1 lost already at m = 16. End to end: 16 streams
// of the 1b Q8_0 model 84 -> 102 tok/s. Speed only: both paths give the same
// bits, so no test pins these limits.
bool has_direct_avx512(DType t, int64_t m) {
  switch (t) {
    case DType::Q8_0:
      return m <= kMaxDirectRows;
    case DType::Q6_K:
      return m <= 32;
    case DType::Q4_K:
    case DType::Q5_K:
      return m <= 16;
    default:
      return is_int_type(t) && m <= kDecodeRows;
  }
}

void direct_tile_avx512(DType t, int R, int C, const uint8_t* w, size_t row_bytes, int64_t k,
                        const ActRows& a, int64_t i0, float* out) {
  static constexpr auto kQ8 = direct_table<Q8Direct>();
  static constexpr auto kQ40 = direct_table<LegacyDirect<LegacyBlock<DType::Q4_0>>::F>();
  static constexpr auto kQ41 = direct_table<LegacyDirect<LegacyBlock<DType::Q4_1>>::F>();
  static constexpr auto kQ50 = direct_table<LegacyDirect<LegacyBlock<DType::Q5_0>>::F>();
  static constexpr auto kQ51 = direct_table<LegacyDirect<LegacyBlock<DType::Q5_1>>::F>();
  static constexpr auto kQ4K = direct_table<Q45KDirect<false>::F>();
  static constexpr auto kQ5K = direct_table<Q45KDirect<true>::F>();
  static constexpr auto kQ6K = direct_table<Q6KDirect>();
  const std::array<std::array<DirectFn, 4>, 4>* table = nullptr;
  switch (t) {
    case DType::Q8_0:
      table = &kQ8;
      break;
    case DType::Q4_0:
      table = &kQ40;
      break;
    case DType::Q4_1:
      table = &kQ41;
      break;
    case DType::Q5_0:
      table = &kQ50;
      break;
    case DType::Q5_1:
      table = &kQ51;
      break;
    case DType::Q4_K:
      table = &kQ4K;
      break;
    case DType::Q5_K:
      table = &kQ5K;
      break;
    default:
      table = &kQ6K;
      break;  // Q6_K (has_direct_avx512)
  }
  (*table)[R - 1][C - 1](w, row_bytes, k, a, i0, out);
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
  add_min_terms(R, C, dr, r0, a, i0, out);
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
    t.int_tile = int_tile_avx512;
    t.float_tile = float_tile_avx512;
    t.has_direct = has_direct_avx512;
    t.direct_tile = direct_tile_avx512;
    t.has_direct_float = has_direct_float_avx512;
    t.direct_float_tile = direct_float_tile_avx512;
    return t;
  }();
  return k;
}

}  // namespace encore::kernels::mm
