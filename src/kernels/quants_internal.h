// Per-type row kernels behind dequantize_row / quantize_row (quants.h), and
// the helpers they share. Internal to the kernels module.
//
// Every kernel takes a count of whole blocks; the public entry points check
// the type and the block multiple. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

#include "encore/dtype.h"

namespace encore::kernels::internal {

// Reads a block from possibly unaligned bytes (an mmap'd tensor need not be
// aligned to the block's uint16_t fields). Compiles to plain loads.
template <class Block>
Block load_block(const uint8_t* p) {
  Block b;
  std::memcpy(&b, p, sizeof(Block));
  return b;
}

template <class Block>
void store_block(const Block& b, uint8_t* p) {
  std::memcpy(p, &b, sizeof(Block));
}

// f32_to_fp16 for a block scale or offset; throws encore::InvalidArgument
// naming the type and block when the value overflows fp16.
uint16_t scale_to_fp16(float v, DType type, int64_t block);

// The smallest fp16 >= v, for v >= 0 finite (throws like scale_to_fp16 if
// that is inf). Used where a scale must not shrink when stored.
uint16_t scale_to_fp16_up(float v, DType type, int64_t block);

// src: [n_blocks] blocks of the type; dst: [n_blocks * block size] floats.
void dequantize_q4_0(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q4_1(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q5_0(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q5_1(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q8_0(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q4_k(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q5_k(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q6_k(const uint8_t* src, float* dst, int64_t n_blocks);

// src: [n_blocks * block size] finite floats; dst: [n_blocks] blocks.
void quantize_q4_0(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q4_1(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q5_0(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q5_1(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q8_0(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q4_k(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q5_k(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q6_k(const float* src, uint8_t* dst, int64_t n_blocks);

}  // namespace encore::kernels::internal
