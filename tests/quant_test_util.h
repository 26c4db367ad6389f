// Random quantised blocks and activations for kernel tests (test_matmul,
// test_panel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "encore/dtype.h"
#include "kernels/fp16.h"

namespace encore::kernels::test {

// Fills bytes: [n] (whole blocks of type t) with random bytes, the fp16
// scales and mins kept finite (|v| <= 0.05): values quantize_row never makes,
// such as negative Q6_K sub-scales, Q6_K q = -32, Q8_0 -128 and every bit
// pattern of the high bits.
inline void fill_random_blocks(DType t, uint8_t* bytes, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(rng());
  // Offsets of the fp16 fields (d, and m / dmin where there is one) in each block.
  const size_t block = dtype_info(t).block_bytes;
  std::vector<size_t> halves = {0};
  if (t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K) {
    halves = {0, 2};
  } else if (t == DType::Q6_K) {
    halves = {208};
  }
  for (size_t b = 0; b < n / block; ++b) {
    for (size_t off : halves) {
      const uint16_t h = f32_to_fp16(scale(rng));
      std::memcpy(bytes + b * block + off, &h, 2);
    }
  }
}

// m rows of cols activations, standard normal.
inline std::vector<float> random_acts(int64_t m, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * cols));
  for (auto& v : x) v = nd(rng);
  return x;
}

// Bit-identical outputs (NaN payloads and signed zeros included).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // (empty vectors may hold null pointers, which memcmp must not be given)
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace encore::kernels::test
