// Row (de)quantisation entry points (see quants.h): type dispatch, the plain
// float types, and the scale helpers shared by the block kernels.
#include "kernels/quants.h"

#include <cassert>
#include <cmath>
#include <cstring>
#include <string>

#include "encore/error.h"
#include "kernels/fp16.h"
#include "kernels/quants_internal.h"

namespace encore::kernels {
namespace internal {
namespace {

[[noreturn]] void throw_scale_overflow(float v, DType type, int64_t block) {
  throw InvalidArgument(std::string("quantize_row(") + dtype_name(type) + "): block " +
                        std::to_string(block) + " needs a scale of " + std::to_string(v) +
                        ", beyond the fp16 maximum 65504; the values are too large for " +
                        dtype_name(type) + " (store the tensor as F32 or scale it down)");
}

}  // namespace

uint16_t scale_to_fp16(float v, DType type, int64_t block) {
  const uint16_t h = f32_to_fp16(v);
  if ((h & 0x7c00u) == 0x7c00u) throw_scale_overflow(v, type, block);
  return h;
}

uint16_t scale_to_fp16_up(float v, DType type, int64_t block) {
  assert(v >= 0.0f);
  uint16_t h = f32_to_fp16(v);
  // For non-negative halves the bit patterns are ordered like the values, so
  // the next half up is h + 1 (0x7bff + 1 is inf, caught below).
  if (fp16_to_f32(h) < v) ++h;
  if ((h & 0x7c00u) == 0x7c00u) throw_scale_overflow(v, type, block);
  return h;
}

}  // namespace internal

namespace {

// Also handles ids outside the enum (a cast from an unchecked integer).
[[noreturn]] void throw_unsupported(const char* what, DType type) {
  const DTypeInfo* info = dtype_info(static_cast<uint32_t>(type));
  const std::string name = info != nullptr ? std::string(info->name)
                                           : "id " + std::to_string(static_cast<uint32_t>(type));
  throw Error(std::string(what) + ": tensor type " + name +
              " is not supported (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
              "Q4_K, Q5_K, Q6_K); convert the model to one of these types");
}

// Block types cannot encode inf/NaN (their scales are derived from the values
// and every float op after that would be poisoned), and ggml's quantisers
// would cast NaN to an integer, which is undefined behaviour.
void check_finite(DType type, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(src[i])) {
      throw InvalidArgument(std::string("quantize_row(") + dtype_name(type) + "): value " +
                            std::to_string(i) + " is " + std::to_string(src[i]) +
                            "; only finite values can be quantised");
    }
  }
}

}  // namespace

bool row_conversion_supported(DType type) {
  switch (type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  if (!row_conversion_supported(type)) throw_unsupported("dequantize_row", type);
  const DTypeInfo& info = dtype_info(type);
  assert(n >= 0 && n % info.block_elems == 0);
  if (n == 0) return;  // src/dst may be null; memcpy would not allow that
  const int64_t n_blocks = n / info.block_elems;
  const auto* s = static_cast<const uint8_t*>(src);
  switch (type) {
    case DType::F32:
      std::memcpy(dst, s, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = fp16_to_f32(h);
      }
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, s + 2 * i, 2);
        dst[i] = bf16_to_f32(b);
      }
      return;
    case DType::Q4_0:
      return internal::dequantize_q4_0(s, dst, n_blocks);
    case DType::Q4_1:
      return internal::dequantize_q4_1(s, dst, n_blocks);
    case DType::Q5_0:
      return internal::dequantize_q5_0(s, dst, n_blocks);
    case DType::Q5_1:
      return internal::dequantize_q5_1(s, dst, n_blocks);
    case DType::Q8_0:
      return internal::dequantize_q8_0(s, dst, n_blocks);
    case DType::Q4_K:
      return internal::dequantize_q4_k(s, dst, n_blocks);
    case DType::Q5_K:
      return internal::dequantize_q5_k(s, dst, n_blocks);
    case DType::Q6_K:
      return internal::dequantize_q6_k(s, dst, n_blocks);
    default:
      throw_unsupported("dequantize_row", type);
  }
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  if (!row_conversion_supported(type)) throw_unsupported("quantize_row", type);
  const DTypeInfo& info = dtype_info(type);
  assert(n >= 0 && n % info.block_elems == 0);
  if (n == 0) return;  // src/dst may be null; memcpy would not allow that
  const int64_t n_blocks = n / info.block_elems;
  auto* d = static_cast<uint8_t*>(dst);
  if (info.block_elems > 1) check_finite(type, src, n);
  switch (type) {
    case DType::F32:
      std::memcpy(d, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_fp16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = f32_to_bf16(src[i]);
        std::memcpy(d + 2 * i, &b, 2);
      }
      return;
    case DType::Q4_0:
      return internal::quantize_q4_0(src, d, n_blocks);
    case DType::Q4_1:
      return internal::quantize_q4_1(src, d, n_blocks);
    case DType::Q5_0:
      return internal::quantize_q5_0(src, d, n_blocks);
    case DType::Q5_1:
      return internal::quantize_q5_1(src, d, n_blocks);
    case DType::Q8_0:
      return internal::quantize_q8_0(src, d, n_blocks);
    case DType::Q4_K:
      return internal::quantize_q4_k(src, d, n_blocks);
    case DType::Q5_K:
      return internal::quantize_q5_k(src, d, n_blocks);
    case DType::Q6_K:
      return internal::quantize_q6_k(src, d, n_blocks);
    default:
      throw_unsupported("quantize_row", type);
  }
}

}  // namespace encore::kernels
