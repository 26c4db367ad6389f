// Float row panels (float_panel.h): repacking and the chain order.
#include "kernels/float_panel.h"

#include <cassert>
#include <cstring>

#include "kernels/fp16.h"

namespace encore::kernels::mm {

bool is_float_panel_type(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

size_t float_panel_bytes(DType t, int64_t k) {
  const size_t e = float_elem_bytes(t);
  return (static_cast<size_t>(kChains) * static_cast<size_t>(k) * e + 63) / 64 * 64;
}

void repack_float_panel(const WeightView& w, int64_t p, uint8_t* dst) {
  assert(is_float_panel_type(w.type));
  const size_t e = float_elem_bytes(w.type);
  const int64_t k = w.cols;
  std::memset(dst, 0, float_panel_bytes(w.type, k));  // padded rows and the tail
  for (int r = 0; r < kChains && p * kChains + r < w.rows; ++r) {
    const uint8_t* src = w.data + static_cast<size_t>(p * kChains + r) * w.row_bytes;
    for (int j = 0; j < kChains; ++j) {
      const int64_t s = chain_start(k, j), n = chain_length(k, j);
      for (int64_t t = 0; t < n; ++t) {
        std::memcpy(dst + (static_cast<size_t>(s + t) * kChains + r) * e,
                    src + static_cast<size_t>(j + kChains * t) * e, e);
      }
    }
  }
}

float float_panel_value(DType t, const uint8_t* panel, int64_t pos, int r) {
  const uint8_t* v = panel + (static_cast<size_t>(pos) * kChains + r) * float_elem_bytes(t);
  if (t == DType::F32) {
    float f;
    std::memcpy(&f, v, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, v, 2);
  return t == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
}

void float_panel_row(const WeightView& w, int64_t row, float* out) {
  assert(is_float_panel_type(w.type) && w.panels != nullptr);
  const int64_t k = w.cols;
  const uint8_t* panel =
      w.panels + static_cast<size_t>(row / kChains) * float_panel_bytes(w.type, k);
  const int r = static_cast<int>(row % kChains);
  for (int j = 0; j < kChains; ++j) {
    const int64_t s = chain_start(k, j), n = chain_length(k, j);
    for (int64_t t = 0; t < n; ++t)
      out[j + kChains * t] = float_panel_value(w.type, panel, s + t, r);
  }
}

void chain_order(const float* x, int64_t k, float* dst, int64_t stride) {
  int64_t start[kChains];  // [16] each chain's first position
  for (int j = 0; j < kChains; ++j) start[j] = chain_start(k, j);
  const int64_t q = k / kChains;
  // Whole steps of 16 values read in order, one value to each chain.
  for (int64_t t = 0; t < q; ++t) {
    for (int j = 0; j < kChains; ++j) dst[(start[j] + t) * stride] = x[kChains * t + j];
  }
  for (int j = 0; j < k % kChains; ++j) dst[(start[j] + q) * stride] = x[kChains * q + j];
}

}  // namespace encore::kernels::mm
