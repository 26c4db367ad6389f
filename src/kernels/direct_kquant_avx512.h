// AVX-512 direct (in-place) decode kernels of the K-quant types Q4_K, Q5_K
// and Q6_K: int_tile_t<R, C, S> of matmul_avx512.cpp read straight from the
// 256-value super-blocks. Included only by matmul_avx512.cpp (compiled for
// AVX-512), inside its anonymous namespace, after reduce16 and
// kPrefetchRows. Same operations as decode + int_tile, same bits.
#pragma once

// The three cache lines of a super-block kPrefetchRows rows further on, and
// its last byte (a 176- or 210-byte block may reach a fourth).
template <size_t kB>
inline void prefetch_super_block(const uint8_t* p, size_t row_bytes) {
  const char* ahead = reinterpret_cast<const char*>(p + kPrefetchRows * row_bytes);
  _mm_prefetch(ahead, _MM_HINT_T0);
  _mm_prefetch(ahead + 64, _MM_HINT_T0);
  _mm_prefetch(ahead + 128, _MM_HINT_T0);
  if constexpr (kB > 192) _mm_prefetch(ahead + kB - 1, _MM_HINT_T0);
}

// Q4_K and Q5_K. Per super-block the 6-bit scales and mins are unpacked with
// integer ops (unpack_k4_scales: the values get_scale_min_k4 gives), ws_j = d
// * sc_j and wm_j = -(dmin * m_j) as decode computes them (exact products);
// the super-block's 8 groups are lanes 0..7 of accm, so one fma per
// super-block is the offset term's accm[g % 8] step. Chunk c (32 bytes: low
// nibbles = group 2c, high nibbles = group 2c + 1) is one register. Q5_K adds
// bit 2c (lower half) or 2c + 1 (upper half) of qh[l] as bit 4 of byte l.
template <int R, int C, bool Q5>
void q45_k_tile_t(const uint8_t* w, size_t row_bytes, int64_t k, const ActRows& a, int64_t i0,
                  float* out) {
  constexpr size_t kB = Q5 ? 176 : 144;  // sizeof(BlockQ5_K), sizeof(BlockQ4_K)
  constexpr size_t kQs = Q5 ? 48 : 16;
  const int64_t ng = a.kp / kGroup, nsb = k / 256;
  const __m512i m4x = _mm512_set1_epi8(0x0f);
  const __m512i k16 = _mm512_set1_epi8(0x10);
  const __m512i idx_da = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512i idx_ws[4], hsel[4];
  for (int c = 0; c < 4; ++c) {
    idx_ws[c] = _mm512_add_epi32(idx_da, _mm512_set1_epi32(2 * c));
    hsel[c] = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * c))),
                                 _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1))), 1);
  }
  __m512 acc[C][R];
  __m256 accm[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps(), accm[c][r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nsb; ++b) {
    __m256 ws8[R], wm8[R];  // [8] d * sc_j and -(dmin * m_j) of this super-block, per row
    __m512i qh[R];          // Q5_K: qh[0..31] in both halves
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * row_bytes + b * kB;
      prefetch_super_block<kB>(p, row_bytes);
      ws8[r] = k4_scales(p, &wm8[r]);
      if constexpr (Q5) {
        qh[r] =
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
      }
    }
    // ws_j * da_j for the super-block's 8 groups, per (activation, weight)
    // row pair: the same rounded products int_tile_t forms lane by lane.
    __m256 sd[C][R];
    for (int c = 0; c < C; ++c) {
      const __m256 da8 = _mm256_loadu_ps(a.d + (i0 + c) * ng + 8 * b);
      const __m256 as8 = _mm256_loadu_ps(a.asum + (i0 + c) * ng + 8 * b);
      for (int r = 0; r < R; ++r) {
        sd[c][r] = _mm256_mul_ps(ws8[r], da8);
        accm[c][r] = _mm256_fmadd_ps(wm8[r], as8, accm[c][r]);
      }
    }
    for (int ch = 0; ch < 4; ++ch) {
      __m512i wv[R];
      for (int r = 0; r < R; ++r) {
        // Both halves get the 32 bytes; the upper half is shifted to its
        // high nibbles, then both are masked to 4 bits.
        const uint8_t* qs = w + r * row_bytes + b * kB + kQs + 32 * ch;
        const __m512i v =
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)));
        wv[r] = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xffff0000u, v, 4), m4x);
        if constexpr (Q5) {
          wv[r] = _mm512_mask_add_epi8(wv[r], _mm512_test_epi8_mask(qh[r], hsel[ch]), wv[r], k16);
        }
      }
      const int64_t g = 8 * b + 2 * ch;  // first group of this register
      for (int c = 0; c < C; ++c) {
        const __m512i qv = _mm512_loadu_si512(a.q + (i0 + c) * a.kp + g * kGroup);
        for (int r = 0; r < R; ++r) {
          const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[r], qv);
          const __m512 scale = _mm512_permutexvar_ps(idx_ws[ch], _mm512_castps256_ps512(sd[c][r]));
          acc[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[c][r]);
        }
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) out[c * R + r] = reduce16(acc[c][r]) + reduce8(accm[c][r]);
}

// Q6_K: register t (0..3) holds values 64t .. 64t + 63 of a super-block,
// i.e. of half h = t / 2 either the low nibbles (t even) or the high ones of
// ql[64h .. 64h + 63], with 2 high bits of qh[32h + l] each (layout in
// quants.h); u = q (0..63) is the u8 side of vpdpbusd and the accumulator
// starts at -32 * sum(q) per lane, so p = sum((u - 32) * q) exactly. ws per
// 16 values: d * scales[i] (exact), lanes [s(4t) x4, .., s(4t + 3) x4].
template <int R, int C>
void q6_k_tile_t(const uint8_t* w, size_t row_bytes, int64_t k, const ActRows& a, int64_t i0,
                 float* out) {
  constexpr size_t kB = 210;  // sizeof(BlockQ6_K)
  const int64_t ng = a.kp / kGroup, nsb = k / 256;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  const __m512i k32 = _mm512_set1_epi8(32);
  const __m512i idx_da = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i idx_s = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nsb; ++b) {
    __m512 ws16[R];  // [16] d * scales[i]
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * row_bytes + b * kB;
      prefetch_super_block<kB>(p, row_bytes);
      const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
      ws16[r] = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(rd16(p + 208))),
                              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
    }
    for (int t = 0; t < 4; ++t) {
      const int h = t / 2;
      __m512i wv[R];
      __m512 sc[R];
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = w + r * row_bytes + b * kB;
        const __m512i ql = _mm512_loadu_si512(p + 64 * h);
        __m512i qh = _mm512_broadcast_i64x4(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h)));
        // Bits 4-5 of each byte: qh bits (0-1 | 2-3) for even t, (4-5 | 6-7)
        // for odd t, lower | upper half; 16-bit shifts only spill bits
        // outside 4-5 into neighbours, and the masks drop them.
        if (t % 2 == 0) qh = _mm512_slli_epi16(qh, 4);
        const __m512i hb = _mm512_and_si512(_mm512_mask_srli_epi16(qh, 0xffff0000u, qh, 2), m30);
        const __m512i lo = t % 2 == 0 ? ql : _mm512_srli_epi16(ql, 4);
        wv[r] = _mm512_or_si512(_mm512_and_si512(lo, m4), hb);
        sc[r] = _mm512_permutexvar_ps(_mm512_add_epi32(idx_s, _mm512_set1_epi32(4 * t)), ws16[r]);
      }
      const int64_t g = 8 * b + 2 * t;
      for (int c = 0; c < C; ++c) {
        const __m512i qv = _mm512_loadu_si512(a.q + (i0 + c) * a.kp + g * kGroup);
        const __m512i base = _mm512_sub_epi32(_mm512_setzero_si512(),
                                              _mm512_dpbusd_epi32(_mm512_setzero_si512(), k32, qv));
        const __m128 d2 = _mm_castsi128_ps(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.d + (i0 + c) * ng + g)));
        const __m512 dac = _mm512_permutexvar_ps(idx_da, _mm512_castps128_ps512(d2));
        for (int r = 0; r < R; ++r) {
          const __m512i p = _mm512_dpbusd_epi32(base, wv[r], qv);
          acc[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sc[r], dac), acc[c][r]);
        }
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) out[c * R + r] = reduce16(acc[c][r]);
}
