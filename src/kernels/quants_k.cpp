// The 256-value super-block types Q4_K, Q5_K and Q6_K (see quants.h).
//
// Dequantisation matches ggml's dequantize_row_q{4,5,6}_K operation for
// operation: the per-sub-block products d * sc and dmin * m are formed first
// (as floats), then each value is (d * sc) * q - (dmin * m), or for Q6_K
// (d * sc) * (q - 32), with no fused multiply-add.
//
// Quantisation is NOT ggml's (its reference quantisers run an iterative
// weighted error search). It is a direct scheme with a proven bound, used to
// write synthetic models and test data:
//
// Q4_K / Q5_K (nmax = 15 / 31), per super-block:
//   1. sub-block j (32 values) needs the range [lo_j, hi_j] with
//      lo_j = min(0, min x) (the format can only subtract an offset) and
//      hi_j = max x. Its offset is m_j = -lo_j >= 0.
//   2. dmin = max_j m_j / 63 rounded UP to fp16; lm_j = ceil(m_j / dmin), so
//      the stored offset M_j = dmin * lm_j >= m_j.
//   3. the step must span [-M_j, hi_j]: s_j = (hi_j + M_j) / nmax;
//      d = max_j s_j / 63 rounded UP to fp16; ls_j = ceil(s_j / d), so the
//      stored step D_j = d * ls_j >= s_j and the grid
//      {D_j * q - M_j : q = 0..nmax} covers [lo_j, hi_j].
//   4. q = clamp(round((x + M_j) / D_j), 0, nmax).
//   Bound: |dequantize(quantize(x)) - x| <= D_j / 2 with
//     D_j <= s_j + d,  s_j <= (hi_j - lo_j + dmin) / nmax,
//     d <= max_j s_j / 63 * (1 + 2^-10) + 2^-24,
//     dmin <= max_j m_j / 63 * (1 + 2^-10) + 2^-24,
//   i.e. about (range / nmax) / 2 * (1 + 2/63) for a super-block whose
//   sub-blocks span `range` (plus float rounding, a few ulps of the values).
//
// Q6_K, per super-block:
//   1. sub-block j (16 values) has absmax a_j and step s_j = a_j / 31, so
//      q in -31..31 covers it (the format's extra level -32 is not used).
//   2. d = max_j s_j / 127 rounded UP to fp16; scale sc_j = ceil(s_j / d)
//      (<= 127), stored step D_j = d * sc_j >= s_j.
//   3. q = clamp(round(x / D_j), -32, 31), stored as q + 32.
//   Bound: |error| <= D_j / 2 <= (a_j / 31 + d) / 2,
//     d <= max_j a_j / (31 * 127) * (1 + 2^-10) + 2^-24.
//
// Rounding is round-half-even (lrint in the default rounding mode, which
// Encore never changes), so the bytes are deterministic.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/fp16.h"
#include "kernels/quants.h"
#include "kernels/quants_internal.h"

namespace encore::kernels::internal {
namespace {

constexpr int kSubBlocks = 8;  // Q4_K/Q5_K sub-blocks of 32 values
constexpr int kSub = kSuperBlock / kSubBlocks;

// Q4_K / Q5_K dequantisation; kHighBits selects Q5_K's fifth bit plane.
// qh may be null when !kHighBits.
template <bool kHighBits>
void dequantize_k_asym(uint16_t d_bits, uint16_t dmin_bits, const uint8_t* scales,
                       const uint8_t* qh, const uint8_t* qs, float* y) {
  const float d = fp16_to_f32(d_bits);
  const float dmin = fp16_to_f32(dmin_bits);
  for (int c = 0; c < 4; ++c) {  // chunks of 64 values = 2 sub-blocks
    uint8_t sc, m;
    get_scale_min_k4(2 * c, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(m);
    get_scale_min_k4(2 * c + 1, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc);
    const float m2 = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * c;
    float* out = y + 64 * c;
    for (int l = 0; l < 32; ++l) {
      int q0 = q[l] & 0x0f;
      if constexpr (kHighBits) q0 += (qh[l] >> (2 * c)) & 1 ? 16 : 0;
      out[l] = d1 * static_cast<float>(q0) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      int q1 = q[l] >> 4;
      if constexpr (kHighBits) q1 += (qh[l] >> (2 * c + 1)) & 1 ? 16 : 0;
      out[32 + l] = d2 * static_cast<float>(q1) - m2;
    }
  }
}

// The ceiling of v / unit as an integer in 0..max (0 when unit is 0).
int ceil_steps(float v, float unit, int max) {
  if (unit <= 0.0f) return 0;
  return std::clamp(static_cast<int>(std::ceil(v / unit)), 0, max);
}

int round_clamped(float v, int lo, int hi) {
  return static_cast<int>(std::clamp(std::lrint(v), static_cast<long>(lo), static_cast<long>(hi)));
}

// Steps 1-4 of the Q4_K/Q5_K scheme (see the file comment) for one
// super-block: x [256] -> fp16 d/dmin, packed scales [12], quants L [256].
void quantize_k_asym(const float* x, int nmax, DType type, int64_t block, uint16_t* d_bits,
                     uint16_t* dmin_bits, uint8_t* scales, uint8_t* L) {
  float hi[kSubBlocks];
  float off[kSubBlocks];
  float max_off = 0.0f;
  for (int j = 0; j < kSubBlocks; ++j) {
    float lo = 0.0f;
    float h = x[kSub * j];
    for (int l = 0; l < kSub; ++l) {
      lo = std::min(lo, x[kSub * j + l]);
      h = std::max(h, x[kSub * j + l]);
    }
    hi[j] = h;
    off[j] = -lo;
    max_off = std::max(max_off, off[j]);
  }
  *dmin_bits = scale_to_fp16_up(max_off / 63.0f, type, block);
  const float dmin = fp16_to_f32(*dmin_bits);

  int lm[kSubBlocks];
  float mins[kSubBlocks];  // M_j exactly as dequantisation computes it
  float step[kSubBlocks];
  float max_step = 0.0f;
  for (int j = 0; j < kSubBlocks; ++j) {
    lm[j] = ceil_steps(off[j], dmin, 63);
    mins[j] = dmin * static_cast<float>(lm[j]);
    step[j] = (hi[j] + mins[j]) / static_cast<float>(nmax);
    max_step = std::max(max_step, step[j]);
  }
  *d_bits = scale_to_fp16_up(max_step / 63.0f, type, block);
  const float d = fp16_to_f32(*d_bits);

  int ls[kSubBlocks];
  for (int j = 0; j < kSubBlocks; ++j) ls[j] = ceil_steps(step[j], d, 63);

  // Pack: the inverse of get_scale_min_k4.
  for (int j = 0; j < 12; ++j) scales[j] = 0;
  for (int j = 0; j < kSubBlocks; ++j) {
    if (j < 4) {
      scales[j] |= static_cast<uint8_t>(ls[j]);
      scales[j + 4] |= static_cast<uint8_t>(lm[j]);
    } else {
      scales[j + 4] = static_cast<uint8_t>((ls[j] & 0x0f) | (lm[j] & 0x0f) << 4);
      scales[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }

  for (int j = 0; j < kSubBlocks; ++j) {
    const float dj = d * static_cast<float>(ls[j]);  // D_j as dequantisation computes it
    for (int l = 0; l < kSub; ++l) {
      const float v = x[kSub * j + l];
      L[kSub * j + l] =
          dj > 0.0f ? static_cast<uint8_t>(round_clamped((v + mins[j]) / dj, 0, nmax)) : 0;
    }
  }
}

}  // namespace

void dequantize_q4_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const auto b = load_block<BlockQ4_K>(src + i * sizeof(BlockQ4_K));
    dequantize_k_asym<false>(b.d, b.dmin, b.scales, nullptr, b.qs, dst + i * kSuperBlock);
  }
}

void dequantize_q5_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const auto b = load_block<BlockQ5_K>(src + i * sizeof(BlockQ5_K));
    dequantize_k_asym<true>(b.d, b.dmin, b.scales, b.qh, b.qs, dst + i * kSuperBlock);
  }
}

void dequantize_q6_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const auto b = load_block<BlockQ6_K>(src + i * sizeof(BlockQ6_K));
    const float d = fp16_to_f32(b.d);
    for (int h = 0; h < 2; ++h) {  // 128-value halves
      const uint8_t* ql = b.ql + 64 * h;
      const uint8_t* qh = b.qh + 32 * h;
      const int8_t* sc = b.scales + 8 * h;
      float* y = dst + i * kSuperBlock + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
        const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
        const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
        y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void quantize_q4_k(const float* src, uint8_t* dst, int64_t n_blocks) {
  uint8_t L[kSuperBlock];  // [256] quants 0..15
  for (int64_t i = 0; i < n_blocks; ++i) {
    BlockQ4_K b;
    quantize_k_asym(src + i * kSuperBlock, 15, DType::Q4_K, i, &b.d, &b.dmin, b.scales, L);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        b.qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | L[64 * c + 32 + l] << 4);
      }
    }
    store_block(b, dst + i * sizeof(BlockQ4_K));
  }
}

void quantize_q5_k(const float* src, uint8_t* dst, int64_t n_blocks) {
  uint8_t L[kSuperBlock];  // [256] quants 0..31
  for (int64_t i = 0; i < n_blocks; ++i) {
    BlockQ5_K b;
    quantize_k_asym(src + i * kSuperBlock, 31, DType::Q5_K, i, &b.d, &b.dmin, b.scales, L);
    for (int l = 0; l < 32; ++l) b.qh[l] = 0;
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int q0 = L[64 * c + l];
        const int q1 = L[64 * c + 32 + l];
        b.qs[32 * c + l] = static_cast<uint8_t>((q0 & 0x0f) | (q1 & 0x0f) << 4);
        b.qh[l] |= static_cast<uint8_t>((q0 >> 4) << (2 * c) | (q1 >> 4) << (2 * c + 1));
      }
    }
    store_block(b, dst + i * sizeof(BlockQ5_K));
  }
}

void quantize_q6_k(const float* src, uint8_t* dst, int64_t n_blocks) {
  constexpr int kSub16 = 16;
  uint8_t L[kSuperBlock];  // [256] quants + 32, 0..63
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float* x = src + i * kSuperBlock;
    float step[kSuperBlock / kSub16];
    float max_step = 0.0f;
    for (int j = 0; j < kSuperBlock / kSub16; ++j) {
      float amax = 0.0f;
      for (int l = 0; l < kSub16; ++l) amax = std::max(amax, std::fabs(x[kSub16 * j + l]));
      step[j] = amax / 31.0f;
      max_step = std::max(max_step, step[j]);
    }
    BlockQ6_K b;
    b.d = scale_to_fp16_up(max_step / 127.0f, DType::Q6_K, i);
    const float d = fp16_to_f32(b.d);
    for (int j = 0; j < kSuperBlock / kSub16; ++j) {
      const int sc = ceil_steps(step[j], d, 127);
      b.scales[j] = static_cast<int8_t>(sc);
      const float dj = d * static_cast<float>(sc);  // as dequantisation computes it
      for (int l = 0; l < kSub16; ++l) {
        const float v = x[kSub16 * j + l];
        const int q = dj > 0.0f ? round_clamped(v / dj, -32, 31) : 0;
        L[kSub16 * j + l] = static_cast<uint8_t>(q + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const uint8_t* Lh = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        b.ql[64 * h + l] = static_cast<uint8_t>((Lh[l] & 0x0f) | (Lh[l + 64] & 0x0f) << 4);
        b.ql[64 * h + l + 32] =
            static_cast<uint8_t>((Lh[l + 32] & 0x0f) | (Lh[l + 96] & 0x0f) << 4);
        b.qh[32 * h + l] = static_cast<uint8_t>((Lh[l] >> 4) | (Lh[l + 32] >> 4) << 2 |
                                                (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
      }
    }
    store_block(b, dst + i * sizeof(BlockQ6_K));
  }
}

}  // namespace encore::kernels::internal
