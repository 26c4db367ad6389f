// The 32-value block types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (see quants.h).
//
// Dequantisation matches ggml's dequantize_row_* operation for operation:
// the quant is formed as an int, converted to float, multiplied by the fp16
// scale and (Q4_1/Q5_1) the offset added in a separate rounding step.
// Quantisation follows ggml's quantize_row_*_ref: the same amax / min-max
// scale choice, the same reciprocal, and the same truncating or roundf casts,
// so the bytes equal what ggml writes for the same floats, except in blocks
// whose scale is 0 in fp16 (values below ~3e-8): there ggml's quants are
// meaningless or, below ~1e-38, undefined behaviour, and ours sit at the
// zero point (see inverse_scale). Q4_0/Q5_0 and Q4_1/Q5_1 share one
// quantiser each, templated on the bit width.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/fp16.h"
#include "kernels/quants.h"
#include "kernels/quants_internal.h"

namespace encore::kernels::internal {
namespace {

constexpr int kHalf = kLegacyBlock / 2;

// The fifth bits of a Q5 block as one little-endian word (bit i = value i).
uint32_t load_qh(const uint8_t (&qh)[4]) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

void store_qh(uint32_t bits, uint8_t (&qh)[4]) {
  for (int i = 0; i < 4; ++i) qh[i] = static_cast<uint8_t>(bits >> (8 * i));
}

// The value of largest magnitude (the first one on ties), sign kept: ggml
// scales Q4_0/Q5_0 by it so that this value lands exactly on the -8 / -16
// end of the asymmetric quant range.
float signed_absmax(const float* x) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < kLegacyBlock; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, float* min, float* max) {
  float lo = 3.40282347e38f;  // FLT_MAX: any finite value replaces it
  float hi = -3.40282347e38f;
  for (int j = 0; j < kLegacyBlock; ++j) {
    if (x[j] < lo) lo = x[j];
    if (x[j] > hi) hi = x[j];
  }
  *min = lo;
  *max = hi;
}

}  // namespace

void dequantize_q4_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const auto b = load_block<BlockQ4_0>(src + i * sizeof(BlockQ4_0));
    const float d = fp16_to_f32(b.d);
    float* y = dst + i * kLegacyBlock;
    for (int j = 0; j < kHalf; ++j) {
      const int x0 = (b.qs[j] & 0x0f) - 8;
      const int x1 = (b.qs[j] >> 4) - 8;
      y[j] = static_cast<float>(x0) * d;
      y[j + kHalf] = static_cast<float>(x1) * d;
    }
  }
}

void dequantize_q4_1(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const auto b = load_block<BlockQ4_1>(src + i * sizeof(BlockQ4_1));
    const float d = fp16_to_f32(b.d);
    const float m = fp16_to_f32(b.m);
    float* y = dst + i * kLegacyBlock;
    for (int j = 0; j < kHalf; ++j) {
      const int x0 = b.qs[j] & 0x0f;
      const int x1 = b.qs[j] >> 4;
      y[j] = static_cast<float>(x0) * d + m;
      y[j + kHalf] = static_cast<float>(x1) * d + m;
    }
  }
}

void dequantize_q5_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const auto b = load_block<BlockQ5_0>(src + i * sizeof(BlockQ5_0));
    const float d = fp16_to_f32(b.d);
    const uint32_t qh = load_qh(b.qh);
    float* y = dst + i * kLegacyBlock;
    for (int j = 0; j < kHalf; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
      const int h1 = static_cast<int>((qh >> (j + kHalf)) & 1u) << 4;
      const int x0 = ((b.qs[j] & 0x0f) | h0) - 16;
      const int x1 = ((b.qs[j] >> 4) | h1) - 16;
      y[j] = static_cast<float>(x0) * d;
      y[j + kHalf] = static_cast<float>(x1) * d;
    }
  }
}

void dequantize_q5_1(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const auto b = load_block<BlockQ5_1>(src + i * sizeof(BlockQ5_1));
    const float d = fp16_to_f32(b.d);
    const float m = fp16_to_f32(b.m);
    const uint32_t qh = load_qh(b.qh);
    float* y = dst + i * kLegacyBlock;
    for (int j = 0; j < kHalf; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
      const int h1 = static_cast<int>((qh >> (j + kHalf)) & 1u) << 4;
      const int x0 = (b.qs[j] & 0x0f) | h0;
      const int x1 = (b.qs[j] >> 4) | h1;
      y[j] = static_cast<float>(x0) * d + m;
      y[j + kHalf] = static_cast<float>(x1) * d + m;
    }
  }
}

void dequantize_q8_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const auto b = load_block<BlockQ8_0>(src + i * sizeof(BlockQ8_0));
    const float d = fp16_to_f32(b.d);
    float* y = dst + i * kLegacyBlock;
    for (int j = 0; j < kLegacyBlock; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
}

// Quantisers. Each value is finite (checked by quantize_row) and every
// block scale fits fp16 (scale_to_fp16 throws otherwise). When the stored
// scale is nonzero, |d| >= 2^-25, so id = 1/d is finite and x * id lies
// within the quant range up to an ulp; the + 8.5 / + 16.5 / + 0.5 offsets
// make it non-negative, so the truncating cast is in range and rounds half up
// exactly as ggml's (int8_t) casts do. When the stored scale is 0 (see
// inverse_scale) the quants are set to the zero point instead.

namespace {

// 1/d for quantising a block whose scale d is stored as the fp16 d_half, or
// 0 when d_half is (+-)0: then every value dequantises to 0 (Q4_1/Q5_1: to
// the offset) whatever the quants, so they are all put at the zero point.
// Besides d == 0 this covers blocks too small for fp16 (|d| < 2^-25),
// including those where 1/d overflows float (|d| < 2^-128, values below
// ~1e-38), for which ggml computes x * inf = inf or 0 * inf = NaN and casts
// it to an integer (undefined behaviour).
float inverse_scale(float d, uint16_t d_half) { return (d_half & 0x7fffu) == 0 ? 0.0f : 1.0f / d; }

// Q4_0 / Q5_0 (kBits = 4 / 5): y = (q - z) * d with z = 2^(kBits - 1) and
// d = max / -z for the value `max` of largest magnitude, which lands on q = 0.
template <int kBits, class Block>
void quantize_symmetric(const float* src, uint8_t* dst, int64_t n_blocks, DType type) {
  constexpr int kMaxQ = (1 << kBits) - 1;
  constexpr float kZero = static_cast<float>(1 << (kBits - 1));
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float* x = src + i * kLegacyBlock;
    const float d = signed_absmax(x) / -kZero;
    Block b;
    b.d = scale_to_fp16(d, type, i);
    const float id = inverse_scale(d, b.d);
    [[maybe_unused]] uint32_t qh = 0;  // Q5: the fifth bits
    for (int j = 0; j < kHalf; ++j) {
      // ggml clamps only the top: x * id >= -z - an ulp, so + z + 0.5 > 0.
      const int q0 = std::min(kMaxQ, static_cast<int>(x[j] * id + (kZero + 0.5f)));
      const int q1 = std::min(kMaxQ, static_cast<int>(x[j + kHalf] * id + (kZero + 0.5f)));
      b.qs[j] = static_cast<uint8_t>((q0 & 0x0f) | (q1 & 0x0f) << 4);
      if constexpr (kBits == 5) {
        qh |= static_cast<uint32_t>(q0 >> 4) << j;
        qh |= static_cast<uint32_t>(q1 >> 4) << (j + kHalf);
      }
    }
    if constexpr (kBits == 5) store_qh(qh, b.qh);
    store_block(b, dst + i * sizeof(Block));
  }
}

// Q4_1 / Q5_1 (kBits = 4 / 5): y = q * d + m with m = min and
// d = (max - min) / (2^kBits - 1).
template <int kBits, class Block>
void quantize_offset(const float* src, uint8_t* dst, int64_t n_blocks, DType type) {
  constexpr int kMaxQ = (1 << kBits) - 1;
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float* x = src + i * kLegacyBlock;
    float min, max;
    min_max(x, &min, &max);
    const float d = (max - min) / static_cast<float>(kMaxQ);
    Block b;
    b.d = scale_to_fp16(d, type, i);
    b.m = scale_to_fp16(min, type, i);
    const float id = inverse_scale(d, b.d);
    [[maybe_unused]] uint32_t qh = 0;  // Q5: the fifth bits
    for (int j = 0; j < kHalf; ++j) {
      // (x - min) * id <= kMaxQ + an ulp, so + 0.5 truncates to at most kMaxQ:
      // the min() never changes a value (ggml clamps Q4_1 and not Q5_1).
      const int q0 = std::min(kMaxQ, static_cast<int>((x[j] - min) * id + 0.5f));
      const int q1 = std::min(kMaxQ, static_cast<int>((x[j + kHalf] - min) * id + 0.5f));
      b.qs[j] = static_cast<uint8_t>((q0 & 0x0f) | (q1 & 0x0f) << 4);
      if constexpr (kBits == 5) {
        qh |= static_cast<uint32_t>(q0 >> 4) << j;
        qh |= static_cast<uint32_t>(q1 >> 4) << (j + kHalf);
      }
    }
    if constexpr (kBits == 5) store_qh(qh, b.qh);
    store_block(b, dst + i * sizeof(Block));
  }
}

}  // namespace

void quantize_q4_0(const float* src, uint8_t* dst, int64_t n_blocks) {
  quantize_symmetric<4, BlockQ4_0>(src, dst, n_blocks, DType::Q4_0);
}

void quantize_q5_0(const float* src, uint8_t* dst, int64_t n_blocks) {
  quantize_symmetric<5, BlockQ5_0>(src, dst, n_blocks, DType::Q5_0);
}

void quantize_q4_1(const float* src, uint8_t* dst, int64_t n_blocks) {
  quantize_offset<4, BlockQ4_1>(src, dst, n_blocks, DType::Q4_1);
}

void quantize_q5_1(const float* src, uint8_t* dst, int64_t n_blocks) {
  quantize_offset<5, BlockQ5_1>(src, dst, n_blocks, DType::Q5_1);
}

void quantize_q8_0(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float* x = src + i * kLegacyBlock;
    float amax = 0.0f;
    for (int j = 0; j < kLegacyBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    BlockQ8_0 b;
    b.d = scale_to_fp16(d, DType::Q8_0, i);
    const float id = inverse_scale(d, b.d);
    // roundf: halves away from zero, as ggml does.
    for (int j = 0; j < kLegacyBlock; ++j) b.qs[j] = static_cast<int8_t>(std::round(x[j] * id));
    store_block(b, dst + i * sizeof(BlockQ8_0));
  }
}

}  // namespace encore::kernels::internal
