// The 32-value block types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (see quants.h).
//
// Dequantisation matches ggml's dequantize_row_* operation for operation:
// the quant is formed as an int, converted to float, multiplied by the fp16
// scale and (Q4_1/Q5_1) the offset added in a separate rounding step.
// Quantisation follows ggml's quantize_row_*_ref: the same amax / min-max
// scale choice, the same reciprocal, and the same truncating or roundf casts,
// so the bytes equal what ggml writes for the same floats.
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

// Quantisers. Each value is finite (checked by quantize_row), so every
// float-to-int cast below is in range: x * id lies within the quant range up
// to an ulp, and the + 8.5 / + 16.5 / + 0.5 offsets make it non-negative, so
// the truncating cast rounds half up exactly as ggml's (int8_t) casts do.

void quantize_q4_0(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float* x = src + i * kLegacyBlock;
    const float d = signed_absmax(x) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_0 b;
    b.d = scale_to_fp16(d, DType::Q4_0, i);
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(x[j + kHalf] * id + 8.5f));
      b.qs[j] = static_cast<uint8_t>(q0 | q1 << 4);
    }
    store_block(b, dst + i * sizeof(BlockQ4_0));
  }
}

void quantize_q4_1(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float* x = src + i * kLegacyBlock;
    float min, max;
    min_max(x, &min, &max);
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_1 b;
    b.d = scale_to_fp16(d, DType::Q4_1, i);
    b.m = scale_to_fp16(min, DType::Q4_1, i);
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = std::min(15, static_cast<int>((x[j] - min) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((x[j + kHalf] - min) * id + 0.5f));
      b.qs[j] = static_cast<uint8_t>(q0 | q1 << 4);
    }
    store_block(b, dst + i * sizeof(BlockQ4_1));
  }
}

void quantize_q5_0(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float* x = src + i * kLegacyBlock;
    const float d = signed_absmax(x) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ5_0 b;
    b.d = scale_to_fp16(d, DType::Q5_0, i);
    uint32_t qh = 0;
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = std::min(31, static_cast<int>(x[j] * id + 16.5f));
      const int q1 = std::min(31, static_cast<int>(x[j + kHalf] * id + 16.5f));
      b.qs[j] = static_cast<uint8_t>((q0 & 0x0f) | (q1 & 0x0f) << 4);
      qh |= static_cast<uint32_t>(q0 >> 4) << j;
      qh |= static_cast<uint32_t>(q1 >> 4) << (j + kHalf);
    }
    store_qh(qh, b.qh);
    store_block(b, dst + i * sizeof(BlockQ5_0));
  }
}

void quantize_q5_1(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float* x = src + i * kLegacyBlock;
    float min, max;
    min_max(x, &min, &max);
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ5_1 b;
    b.d = scale_to_fp16(d, DType::Q5_1, i);
    b.m = scale_to_fp16(min, DType::Q5_1, i);
    uint32_t qh = 0;
    for (int j = 0; j < kHalf; ++j) {
      // ggml has no clamp here: (x - min) * id <= 31 + an ulp, so + 0.5
      // truncates to at most 31. The & 31 only keeps the cast's range obvious.
      const int q0 = static_cast<int>((x[j] - min) * id + 0.5f) & 31;
      const int q1 = static_cast<int>((x[j + kHalf] - min) * id + 0.5f) & 31;
      b.qs[j] = static_cast<uint8_t>((q0 & 0x0f) | (q1 & 0x0f) << 4);
      qh |= static_cast<uint32_t>(q0 >> 4) << j;
      qh |= static_cast<uint32_t>(q1 >> 4) << (j + kHalf);
    }
    store_qh(qh, b.qh);
    store_block(b, dst + i * sizeof(BlockQ5_1));
  }
}

void quantize_q8_0(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float* x = src + i * kLegacyBlock;
    float amax = 0.0f;
    for (int j = 0; j < kLegacyBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 b;
    b.d = scale_to_fp16(d, DType::Q8_0, i);
    // roundf: halves away from zero, as ggml does.
    for (int j = 0; j < kLegacyBlock; ++j) b.qs[j] = static_cast<int8_t>(std::round(x[j] * id));
    store_block(b, dst + i * sizeof(BlockQ8_0));
  }
}

}  // namespace encore::kernels::internal
