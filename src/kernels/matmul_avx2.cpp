// AVX2 + FMA + F16C matmul kernels: the canonical order of matmul_internal.h
// with 256-bit vectors. Compiled with -mavx2 -mfma -mf16c -mbmi2 and only
// called after isa_supported(Isa::Avx2).
//
// Integer lanes: maddubs (u8 x s8 -> pairs of int16) then madd with ones
// (-> int32 of 4 consecutive products) is exactly p of the canonical order
// for one 32-value group in one register. maddubs saturates at +-32767, so
// the u8 side must stay small: unsigned weights (<= 31) go in directly;
// signed ones enter as |w| (<= 128) with the activation's sign flipped by w,
// which keeps every pair below 2 * 128 * 127 = 32512.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

#include "kernels/block_scales_avx2.h"
#include "kernels/matmul_internal.h"
#include "kernels/quants.h"

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

inline void store32(int8_t* dst, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), v);
}

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);  // exact (a NaN scale only ever yields a NaN output)
}

// The unsigned values u = w + bias of a 32-value block (layout in
// LegacyBlock): nibbles in value order, plus bit j of qh as bit 4 of value j
// (byte j takes qh's byte j / 8, then its bit j % 8).
template <class B>
inline __m256i legacy_values(const uint8_t* p) {
  // The 16 bytes in both halves, then the high half shifted by 4: low
  // nibbles (values 0..15) in the low half, high ones (16..31) in the high.
  const __m256i x =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + B::kQs)));
  __m256i u = _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_setr_epi64x(0, 0, 4, 4)),
                               _mm256_set1_epi8(0x0f));
  if constexpr (B::kQh >= 0) {
    const __m256i spread =
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    const __m256i bit_of = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
    const __m256i sel =
        _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(rd32(p + B::kQh))), spread);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(sel, bit_of), bit_of);
    u = _mm256_or_si256(u, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
  }
  return u;
}

// decode_scalar for the 32-value block types: w = u - bias, ws = d (twice),
// wm = m for the types with one.
template <class B>
void decode_legacy(const uint8_t* src, int64_t k, int8_t* w, float* ws, float* wm) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const uint8_t* p = src + b * B::kBytes;
    store32(w + 32 * b, _mm256_sub_epi8(legacy_values<B>(p), _mm256_set1_epi8(B::kBias)));
    ws[2 * b] = ws[2 * b + 1] = half(p);
    if constexpr (B::kMin >= 0) wm[b] = half(p + B::kMin);
  }
}

void decode_avx2(DType t, const uint8_t* src, int64_t k, const DecRows& dr, int64_t r) {
  int8_t* w = dr.w + r * dr.kp;
  float* ws = dr.ws + r * (dr.kp / 16);
  float* wm = dr.wm != nullptr ? dr.wm + r * (dr.kp / kGroup) : nullptr;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  switch (t) {
    case DType::Q8_0:
      for (int64_t b = 0; b < k / 32; ++b) {
        const uint8_t* p = src + b * sizeof(BlockQ8_0);
        store32(w + 32 * b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2)));
        ws[2 * b] = ws[2 * b + 1] = half(p);
      }
      return;
    case DType::Q4_0:
      return decode_legacy<LegacyBlock<DType::Q4_0>>(src, k, w, ws, wm);
    case DType::Q4_1:
      return decode_legacy<LegacyBlock<DType::Q4_1>>(src, k, w, ws, wm);
    case DType::Q5_0:
      return decode_legacy<LegacyBlock<DType::Q5_0>>(src, k, w, ws, wm);
    case DType::Q5_1:
      return decode_legacy<LegacyBlock<DType::Q5_1>>(src, k, w, ws, wm);
    case DType::Q4_K:
    case DType::Q5_K:
      for (int64_t b = 0; b < k / 256; ++b) {
        const bool q5 = t == DType::Q5_K;
        const uint8_t* p = src + b * (q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
        const float d = half(p), dmin = half(p + 2);
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, mn;
          get_scale_min_k4(j, p + 4, &sc, &mn);
          ws[16 * b + 2 * j] = ws[16 * b + 2 * j + 1] = d * static_cast<float>(sc);
          wm[8 * b + j] = -(dmin * static_cast<float>(mn));
        }
        const uint8_t* qs = p + (q5 ? 48 : 16);
        const __m256i hv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
        int8_t* o = w + 256 * b;
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
          __m256i lo = _mm256_and_si256(v, m4);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
          if (q5) {
            const __m256i b0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
            const __m256i b1 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1)));
            const __m256i h16 = _mm256_set1_epi8(16);
            lo = _mm256_or_si256(
                lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, b0), b0), h16));
            hi = _mm256_or_si256(
                hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, b1), b1), h16));
          }
          store32(o + 64 * c, lo);
          store32(o + 64 * c + 32, hi);
        }
      }
      return;
    case DType::Q6_K:
      for (int64_t b = 0; b < k / 256; ++b) {
        const uint8_t* p = src + b * sizeof(BlockQ6_K);
        const float d = half(p + 208);
        const auto* sc = reinterpret_cast<const int8_t*>(p + 192);
        for (int i = 0; i < 16; ++i) ws[16 * b + i] = d * static_cast<float>(sc[i]);
        const __m256i m3 = _mm256_set1_epi8(3), m30 = _mm256_set1_epi8(0x30);
        const __m256i mc = _mm256_set1_epi8(0x0c), k32 = _mm256_set1_epi8(32);
        for (int h = 0; h < 2; ++h) {
          const auto* ql = reinterpret_cast<const __m256i*>(p + 64 * h);
          const __m256i l0 = _mm256_loadu_si256(ql), l1 = _mm256_loadu_si256(ql + 1);
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
          // Shifts are 16-bit, so mask to the wanted bits first: nothing
          // crosses into the neighbouring byte.
          const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4);
          const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(qh, mc), 2);
          const __m256i h2 = _mm256_and_si256(qh, m30);
          const __m256i h3 = _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30);
          int8_t* o = w + 256 * b + 128 * h;
          store32(o, _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(l0, m4), h0), k32));
          store32(o + 32, _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(l1, m4), h1), k32));
          store32(o + 64,
                  _mm256_sub_epi8(
                      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), h2), k32));
          store32(o + 96,
                  _mm256_sub_epi8(
                      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h3), k32));
        }
      }
      return;
    default:
      decode_scalar(t, src, k, dr, r);
  }
}

// [s0 x4, s1 x4] from two consecutive floats.
inline __m256 expand_ws(const float* p) {
  const __m128 two = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two),
                                  _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

// Sub-tile of R <= 2 weight rows x C <= 2 activation rows (registers: 8 acc).
template <int R, int C, bool S>
void int_subtile(const DecRows& dr, int64_t r0, const ActRows& a, int64_t i0, float* out, int ldo) {
  const int64_t kp = a.kp, ng = kp / kGroup;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[C][R][2];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r][0] = acc[c][r][1] = _mm256_setzero_ps();
  const int8_t* wp[R];
  const float* sp[R];
  for (int r = 0; r < R; ++r) {
    wp[r] = dr.w + (r0 + r) * kp;
    sp[r] = dr.ws + (r0 + r) * (kp / 16);
  }
  const int8_t* aq[C];
  const float* ad[C];
  for (int c = 0; c < C; ++c) aq[c] = a.q + (i0 + c) * kp, ad[c] = a.d + (i0 + c) * ng;
  // Group g into acc[..][h], h = g % 2 a compile-time constant (as in
  // legacy_direct_subtile), each weight and activation vector loaded once
  // (in_register). 5632 x 2048 weights x 512 rows through the decoded rows,
  // two threads, medians of three (GOP/s): Q4_K 179 -> 194, Q8_0 157 -> 170,
  // Q6_K 138 -> 148. A 2 x 2 sub-tile still needs more than 16 registers,
  // so GCC keeps some accumulators on the stack.
  auto group = [&](int64_t g, auto parity) {
    constexpr int h = decltype(parity)::value;
    __m256i wv[R], aw[R];
    __m256 sc[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = in_register(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp[r] + 32 * g)));
      if (S) aw[r] = _mm256_abs_epi8(wv[r]);
      sc[r] = expand_ws(sp[r] + 2 * g);
    }
    for (int c = 0; c < C; ++c) {
      const __m256i qv =
          in_register(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq[c] + 32 * g)));
      const __m256 dac = _mm256_broadcast_ss(ad[c] + g);
      for (int r = 0; r < R; ++r) {
        const __m256i p16 = S ? _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(qv, wv[r]))
                              : _mm256_maddubs_epi16(wv[r], qv);
        const __m256 pf = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        acc[c][r][h] = _mm256_fmadd_ps(pf, _mm256_mul_ps(sc[r], dac), acc[c][r][h]);
      }
    }
  };
  for (int64_t g = 0; g < ng; g += 2) {  // ng is a multiple of 8 (kPadTo)
    group(g, std::integral_constant<int, 0>{});
    group(g + 1, std::integral_constant<int, 1>{});
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) out[c * ldo + r] = reduce16(acc[c][r][0], acc[c][r][1]);
}

template <bool S>
void int_tile_s(int R, int C, const DecRows& dr, int64_t r0, const ActRows& a, int64_t i0,
                float* out) {
  for (int c = 0; c < C; c += 2) {
    for (int r = 0; r < R; r += 2) {
      const int rr = R - r >= 2 ? 2 : 1, cc = C - c >= 2 ? 2 : 1;
      float* o = out + c * R + r;
      if (rr == 2 && cc == 2) int_subtile<2, 2, S>(dr, r0 + r, a, i0 + c, o, R);
      if (rr == 2 && cc == 1) int_subtile<2, 1, S>(dr, r0 + r, a, i0 + c, o, R);
      if (rr == 1 && cc == 2) int_subtile<1, 2, S>(dr, r0 + r, a, i0 + c, o, R);
      if (rr == 1 && cc == 1) int_subtile<1, 1, S>(dr, r0 + r, a, i0 + c, o, R);
    }
  }
}

void int_tile_avx2(int R, int C, bool w_signed, const DecRows& dr, int64_t r0, const ActRows& a,
                   int64_t i0, float* out) {
  if (w_signed) {
    int_tile_s<true>(R, C, dr, r0, a, i0, out);
  } else {
    int_tile_s<false>(R, C, dr, r0, a, i0, out);
  }
  add_min_terms(R, C, dr, r0, a, i0, out);
}

// int_subtile<R, C, S> for the 32-value block types Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1 read straight from the blocks (layout in LegacyBlock,
// matmul_internal.h), instead of the decoded buffer, for small batches: block
// b is group b and goes to acc[..][b % 2] as in int_subtile. Q8_0's signed
// values take int_subtile's abs/sign form. Otherwise the unsigned values u =
// w + bias (<= 31) are the u8 side of maddubs as they are, and bias * sum(q)
// of each pair is taken off in int16 (both sides <= 2 * 31 * 127, so nothing
// saturates), which leaves exactly the canonical p. The scale products fl(d *
// da) are made eight blocks at a time (one vcvtph2ps and one multiply per row
// and activation row) and each block's is broadcast from there by a load.
// Types with a min add the offset term: per eight blocks one fma of their m
// (+0 past the row's end) and asum into accm (accm[g % 8] of
// matmul_internal.h).
template <int R, int C, class B>
void legacy_direct_subtile(const uint8_t* w, size_t row_bytes, int64_t k, const ActRows& a,
                           int64_t i0, float* out, int ldo) {
  constexpr bool kMin = B::kMin >= 0;
  // Prefetch distance in weight rows (speed only): a steady trickle of
  // prefetches keeps the memory bus busy; prefetches never fault, so running
  // past the matrix end is harmless.
  constexpr size_t kAhead = 8;
  const int64_t ng = a.kp / kGroup, nb = k / kGroup;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i bias = _mm256_set1_epi8(B::kBias);
  __m256 acc[C][R][2], accm[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r][0] = acc[c][r][1] = accm[c][r] = _mm256_setzero_ps();
  alignas(32) float sc[R][C][8];  // fl(d * da) of blocks b8 + [0, 8)
  const int8_t* aq[C];            // the activation rows (hoisted: GCC recomputed them per block)
  for (int c = 0; c < C; ++c) aq[c] = a.q + (i0 + c) * a.kp;
  // h (the block's parity: which accumulator) is a compile-time constant:
  // indexed at run time, acc lived on the stack and every fma went through
  // a store and a reload (measured ~1.5-2x slower).
  auto block = [&](int64_t b, int j, auto parity) {
    constexpr int h = decltype(parity)::value;
    __m256i wv[R], aw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * row_bytes + b * B::kBytes;
      // One prefetch per 64 bytes or less: blocks of under 32 bytes take one
      // per two.
      if (h == 0 || B::kBytes >= 32) {
        _mm_prefetch(reinterpret_cast<const char*>(p + kAhead * row_bytes), _MM_HINT_T0);
      }
      if constexpr (B::kInt8) {
        wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + B::kQs));
        aw[r] = _mm256_abs_epi8(wv[r]);
      } else {
        wv[r] = legacy_values<B>(p);
      }
    }
    for (int c = 0; c < C; ++c) {
      const __m256i qv =
          in_register(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq[c] + 32 * b)));
      const __m256i base = B::kBias != 0 ? _mm256_maddubs_epi16(bias, qv) : _mm256_setzero_si256();
      for (int r = 0; r < R; ++r) {
        __m256i p16;
        if constexpr (B::kInt8) {
          p16 = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(qv, wv[r]));
        } else {
          p16 = _mm256_maddubs_epi16(wv[r], qv);
          if (B::kBias != 0) p16 = _mm256_sub_epi16(p16, base);
        }
        const __m256 pf = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        acc[c][r][h] = _mm256_fmadd_ps(pf, _mm256_broadcast_ss(&sc[r][c][j]), acc[c][r][h]);
      }
    }
  };
  constexpr std::integral_constant<int, 0> kEven;
  constexpr std::integral_constant<int, 1> kOdd;
  // ng is a multiple of 8 (kPadTo), so eight activation scales from b8 exist.
  for (int64_t b8 = 0; b8 < nb; b8 += 8) {
    const int n = static_cast<int>(std::min<int64_t>(8, nb - b8));
    for (int r = 0; r < R; ++r) {
      __m256 m8;
      const __m256 d = legacy_scales8<B>(w + r * row_bytes + b8 * B::kBytes, n, &m8);
      for (int c = 0; c < C; ++c) {
        if constexpr (kMin) {
          accm[c][r] =
              _mm256_fmadd_ps(m8, _mm256_loadu_ps(a.asum + (i0 + c) * ng + b8), accm[c][r]);
        }
        _mm256_store_ps(sc[r][c], _mm256_mul_ps(d, _mm256_loadu_ps(a.d + (i0 + c) * ng + b8)));
      }
    }
    if (n == 8) {  // the same loop with a constant count, unrolled
      for (int j = 0; j < 8; j += 2) {
        block(b8 + j, j, kEven);
        block(b8 + j + 1, j + 1, kOdd);
      }
    } else {
      for (int j = 0; j < n; j += 2) {
        block(b8 + j, j, kEven);
        if (j + 1 < n) block(b8 + j + 1, j + 1, kOdd);
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      out[c * ldo + r] = reduce16(acc[c][r][0], acc[c][r][1]);
      if constexpr (kMin) out[c * ldo + r] += reduce8(accm[c][r]);
    }
  }
}

#include "kernels/direct_kquant_avx2.h"

using DirectSubtileFn = void (*)(const uint8_t*, size_t, int64_t, const ActRows&, int64_t, float*,
                                 int);

// A direct tile of R x C from sub-tiles of 2 x 2, or with kWide, for more
// than two activation rows, of one weight row by up to four activation rows
// (each block is then decoded once per four activation rows, not per two,
// but each activation row's q and scales are loaded once per weight row
// rather than once per two). Which one wins
// depends on how the decode cost compares with the dot products; measured
// with the AVX2 kernels on the Zen 5 class VM, 2048 x 512 weights in L2,
// one thread, 8 activation rows (GOP/s, 1 x 4 vs 2 x 2): 2 x 2 for Q4_K 63
// vs 90 (5632 x 2048 from memory, two threads: 136 vs 169), Q5_K 61 vs 73,
// Q8_0 65 vs 89, Q4_0 60 vs 87, Q4_1 62 vs 80; 1 x 4 for the types with a
// costly decode: Q5_0 56 vs 47, Q5_1 54 vs 44, Q6_K 67 vs 62. Speed only:
// both give the same bits.
template <template <int, int> class F, bool kWide>
void direct_tile_sub(int R, int C, const uint8_t* w, size_t row_bytes, int64_t k, const ActRows& a,
                     int64_t i0, float* out) {
  static constexpr DirectSubtileFn kFns[2][2] = {{&F<1, 1>::run, &F<1, 2>::run},
                                                 {&F<2, 1>::run, &F<2, 2>::run}};
  if constexpr (kWide) {
    static constexpr DirectSubtileFn kWideFns[2] = {&F<1, 3>::run, &F<1, 4>::run};
    if (C > 2) {
      for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; c += 4) {
          const int cc = C - c >= 4 ? 4 : C - c;
          const DirectSubtileFn fn = cc > 2 ? kWideFns[cc - 3] : kFns[0][cc - 1];
          fn(w + static_cast<size_t>(r) * row_bytes, row_bytes, k, a, i0 + c, out + c * R + r, R);
        }
      }
      return;
    }
  }
  for (int c = 0; c < C; c += 2) {
    for (int r = 0; r < R; r += 2) {
      const int rr = R - r >= 2 ? 2 : 1, cc = C - c >= 2 ? 2 : 1;
      kFns[rr - 1][cc - 1](w + static_cast<size_t>(r) * row_bytes, row_bytes, k, a, i0 + c,
                           out + c * R + r, R);
    }
  }
}

template <bool Q5>
struct Q45KSub {
  template <int R, int C>
  struct F {
    static void run(const uint8_t* w, size_t rb, int64_t k, const ActRows& a, int64_t i0, float* o,
                    int ldo) {
      q45_k_direct_subtile<R, C, Q5>(w, rb, k, a, i0, o, ldo);
    }
  };
};
template <int R, int C>
struct Q6KSub {
  static void run(const uint8_t* w, size_t rb, int64_t k, const ActRows& a, int64_t i0, float* o,
                  int ldo) {
    q6_k_direct_subtile<R, C>(w, rb, k, a, i0, o, ldo);
  }
};
template <class B>
struct LegacySub {
  template <int R, int C>
  struct F {
    static void run(const uint8_t* w, size_t rb, int64_t k, const ActRows& a, int64_t i0, float* o,
                    int ldo) {
      legacy_direct_subtile<R, C, B>(w, rb, k, a, i0, o, ldo);
    }
  };
};

// Up to 8 activation rows (two tiles of sub-tiles, see direct_tile_sub:
// each block decoded two or four times, still cheaper than decoding the
// rows into a buffer first, 8 streams measured ~10 % faster); beyond that
// the buffer wins.
bool has_direct_avx2(DType t, int64_t m) {  // every integer type
  return is_int_type(t) && m <= kDecodeRows;
}

void direct_tile_avx2(DType t, int R, int C, const uint8_t* w, size_t row_bytes, int64_t k,
                      const ActRows& a, int64_t i0, float* out) {
  switch (t) {
    case DType::Q8_0:
      return direct_tile_sub<LegacySub<LegacyBlock<DType::Q8_0>>::F, false>(R, C, w, row_bytes, k,
                                                                            a, i0, out);
    case DType::Q4_0:
      return direct_tile_sub<LegacySub<LegacyBlock<DType::Q4_0>>::F, false>(R, C, w, row_bytes, k,
                                                                            a, i0, out);
    case DType::Q4_1:
      return direct_tile_sub<LegacySub<LegacyBlock<DType::Q4_1>>::F, false>(R, C, w, row_bytes, k,
                                                                            a, i0, out);
    case DType::Q5_0:
      return direct_tile_sub<LegacySub<LegacyBlock<DType::Q5_0>>::F, true>(R, C, w, row_bytes, k, a,
                                                                           i0, out);
    case DType::Q5_1:
      return direct_tile_sub<LegacySub<LegacyBlock<DType::Q5_1>>::F, true>(R, C, w, row_bytes, k, a,
                                                                           i0, out);
    case DType::Q4_K:
      return direct_tile_sub<Q45KSub<false>::F, false>(R, C, w, row_bytes, k, a, i0, out);
    case DType::Q5_K:
      return direct_tile_sub<Q45KSub<true>::F, false>(R, C, w, row_bytes, k, a, i0, out);
    default:  // Q6_K (has_direct_avx2)
      return direct_tile_sub<Q6KSub, true>(R, C, w, row_bytes, k, a, i0, out);
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
  static const IsaKernels k{
      quantize_act_avx2, decode_avx2,      int_tile_avx2,         float_tile_avx2,       widen_avx2,
      has_direct_avx2,   direct_tile_avx2, has_direct_float_avx2, direct_float_tile_avx2};
  return k;
}

}  // namespace encore::kernels::mm
