// AVX2 direct (in-place) decode kernels of the K-quant types Q4_K, Q5_K and
// Q6_K: int_subtile<R, C, S> of matmul_avx2.cpp (sub-tiles of at most 2 x 2
// or 1 x 4, one register per 32-value group, acc[..][g % 2]) read straight
// from the 256-value super-blocks. Included only by matmul_avx2.cpp (compiled for AVX2),
// inside its anonymous namespace, after reduce16. Same operations as
// decode + int_tile, same bits.
#pragma once

// Prefetch distance in weight rows (speed only), as legacy_direct_subtile's.
constexpr size_t kKAhead = 8;

template <size_t kB>
inline void prefetch_super_block_avx2(const uint8_t* p, size_t row_bytes) {
  const char* ahead = reinterpret_cast<const char*>(p + kKAhead * row_bytes);
  _mm_prefetch(ahead, _MM_HINT_T0);
  _mm_prefetch(ahead + 64, _MM_HINT_T0);
  _mm_prefetch(ahead + 128, _MM_HINT_T0);
  if constexpr (kB > 192) _mm_prefetch(ahead + kB - 1, _MM_HINT_T0);
}

// Q4_K and Q5_K: ws_j = d * sc_j and wm_j = -(dmin * m_j) as decode computes
// them (exact products; the super-block's 8 groups are lanes 0..7 of accm, so
// one fma per super-block is the offset term's accm[g % 8] step); chunk c (32
// bytes) gives group 2c (low nibbles) and 2c + 1 (high nibbles); Q5_K adds
// bit 2c / 2c + 1 of qh[l] as bit 4. The values (<= 31) are the u8 side of
// maddubs as they are. The scale product of group j is lane j of ws8 * da8:
// the same rounded product int_subtile forms from broadcasts.
template <int R, int C, bool Q5>
void q45_k_direct_subtile(const uint8_t* w, size_t row_bytes, int64_t k, const ActRows& a,
                          int64_t i0, float* out, int ldo) {
  constexpr size_t kB = Q5 ? 176 : 144;  // sizeof(BlockQ5_K), sizeof(BlockQ4_K)
  constexpr size_t kQs = Q5 ? 48 : 16;
  const int64_t ng = a.kp / kGroup, nsb = k / 256;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i k16 = _mm256_set1_epi8(0x10);
  __m256 acc[C][R][2], accm[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r][0] = acc[c][r][1] = accm[c][r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nsb; ++b) {
    __m256 ws8[R], wm8[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * row_bytes + b * kB;
      prefetch_super_block_avx2<kB>(p, row_bytes);
      ws8[r] = k4_scales(p, &wm8[r]);
    }
    // The products, broadcast from memory per group (a load, no shuffle).
    alignas(32) float sd[C][R][8];
    for (int c = 0; c < C; ++c) {
      const __m256 da8 = _mm256_loadu_ps(a.d + (i0 + c) * ng + 8 * b);
      const __m256 as8 = _mm256_loadu_ps(a.asum + (i0 + c) * ng + 8 * b);
      for (int r = 0; r < R; ++r) {
        _mm256_store_ps(sd[c][r], _mm256_mul_ps(ws8[r], da8));
        accm[c][r] = _mm256_fmadd_ps(wm8[r], as8, accm[c][r]);
      }
    }
    for (int ch = 0; ch < 4; ++ch) {
      __m256i wlo[R], whi[R];
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = w + r * row_bytes + b * kB;
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kQs + 32 * ch));
        wlo[r] = _mm256_and_si256(v, m4);
        whi[r] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if constexpr (Q5) {
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
          const __m256i b0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * ch)));
          const __m256i b1 = _mm256_set1_epi8(static_cast<char>(1 << (2 * ch + 1)));
          wlo[r] = _mm256_or_si256(
              wlo[r], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), k16));
          whi[r] = _mm256_or_si256(
              whi[r], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), k16));
        }
      }
      const int64_t g = 8 * b + 2 * ch;
      for (int c = 0; c < C; ++c) {
        const int8_t* q = a.q + (i0 + c) * a.kp + g * kGroup;
        const __m256i qlo = in_register(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
        const __m256i qhi =
            in_register(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32)));
        for (int r = 0; r < R; ++r) {
          const __m256 plo =
              _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wlo[r], qlo), ones));
          const __m256 phi =
              _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(whi[r], qhi), ones));
          acc[c][r][0] = _mm256_fmadd_ps(plo, _mm256_broadcast_ss(&sd[c][r][2 * ch]), acc[c][r][0]);
          acc[c][r][1] =
              _mm256_fmadd_ps(phi, _mm256_broadcast_ss(&sd[c][r][2 * ch + 1]), acc[c][r][1]);
        }
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      out[c * ldo + r] = reduce16(acc[c][r][0], acc[c][r][1]) + reduce8(accm[c][r]);
    }
  }
}

// Q6_K: group j (0..3) of half h holds values 32j .. 32j + 31 of the half:
// low (j even: ql[l], j odd: ql[32 + l]) or high nibbles (j >= 2) with two
// bits of qh[l] at bits 4-5 (layout in quants.h; 16-bit shifts spill bits
// only outside 4-5, which the masks drop). u = q (0..63) is the u8 side of
// maddubs and 32 * sum(q) of each pair is taken off in int16 (<= 2 * 63 *
// 127 and 2 * 32 * 127: no saturation), leaving p = sum((u - 32) * q). ws
// per 16 values d * scales[i] (exact): lanes [s(2j') x4, s(2j' + 1) x4]
// with j' = 4h + j.
template <int R, int C>
void q6_k_direct_subtile(const uint8_t* w, size_t row_bytes, int64_t k, const ActRows& a,
                         int64_t i0, float* out, int ldo) {
  constexpr size_t kB = 210;  // sizeof(BlockQ6_K)
  const int64_t ng = a.kp / kGroup, nsb = k / 256;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  const __m256i k32 = _mm256_set1_epi8(32);
  __m256 acc[C][R][2];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r][0] = acc[c][r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nsb; ++b) {
    __m256 ws[R][2];  // [16] d * scales[i]
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * row_bytes + b * kB;
      prefetch_super_block_avx2<kB>(p, row_bytes);
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(rd16(p + 208)));
      const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
      ws[r][0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
      ws[r][1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
    }
    // Unrolled: j % 2 picks the accumulator, which must be known at compile
    // time to stay in a register.
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        __m256i u[R];
        __m256 sc[R];
        for (int r = 0; r < R; ++r) {
          const uint8_t* p = w + r * row_bytes + b * kB;
          const __m256i ql =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h + 32 * (j % 2)));
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
          const __m256i lo = j < 2 ? ql : _mm256_srli_epi16(ql, 4);
          // qh bits 2j .. 2j + 1 to bits 4-5.
          const __m256i hb = j == 0   ? _mm256_slli_epi16(qh, 4)
                             : j == 1 ? _mm256_slli_epi16(qh, 2)
                             : j == 2 ? qh
                                      : _mm256_srli_epi16(qh, 2);
          u[r] = _mm256_or_si256(_mm256_and_si256(lo, m4), _mm256_and_si256(hb, m30));
          const __m256i idx = _mm256_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1,
                                                2 * j + 1, 2 * j + 1);
          sc[r] = _mm256_permutevar8x32_ps(ws[r][h], idx);
        }
        const int64_t g = 8 * b + 4 * h + j;
        for (int c = 0; c < C; ++c) {
          const __m256i qv = in_register(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (i0 + c) * a.kp + 32 * g)));
          const __m256i base = _mm256_maddubs_epi16(k32, qv);
          const __m256 dac = _mm256_broadcast_ss(a.d + (i0 + c) * ng + g);
          for (int r = 0; r < R; ++r) {
            const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(u[r], qv), base);
            const __m256 pf = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
            acc[c][r][j % 2] = _mm256_fmadd_ps(pf, _mm256_mul_ps(sc[r], dac), acc[c][r][j % 2]);
          }
        }
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) out[c * ldo + r] = reduce16(acc[c][r][0], acc[c][r][1]);
}
