// GGUF/ggml block formats and row (de)quantisation.
//
// Owns: the byte layouts of ggml's quantised blocks (laid out exactly as
// ggml-common.h defines them, little-endian, fp16 scales as raw bit patterns)
// and the conversions between a row of such blocks and floats.
//
// dequantize_row reproduces ggml's scalar dequantize_row_* bit for bit: same
// integer unpacking, same float operations in the same order, no fused
// multiply-add (the build uses -ffp-contract=off). For every supported type
// the products before the last step are exact in float (an fp16 scale has 11
// significant bits, the quants and 6/8-bit scales at most 8), so only the
// final add/subtract (or Q6_K's final multiply) rounds: the values equal
// ggml's even where ggml was built with FMA contraction.
// quantize_row writes valid blocks for synthetic models and tests; see
// quantize_row for its guarantees.
//
// Cost: O(n) with a few integer ops and 1-3 float ops per value; no
// allocation. Buffers may be unaligned (blocks are copied to the stack before
// decoding), so rows straight out of an mmap'd file are fine.
// Thread-safety: pure functions, safe to call concurrently on disjoint output.
#pragma once

#include <bit>
#include <cstdint>

#include "encore/dtype.h"

namespace encore::kernels {

static_assert(std::endian::native == std::endian::little,
              "ggml block layouts are little-endian; a big-endian port needs byte swaps");

// Values per block of the "legacy" types (Q4_0 ... Q8_0).
inline constexpr int kLegacyBlock = 32;
// Values per super-block of the K-quants (Q4_K, Q5_K, Q6_K).
inline constexpr int kSuperBlock = 256;

// Q4_0: y = (q - 8) * d.
struct BlockQ4_0 {
  uint16_t d;      // fp16 scale
  uint8_t qs[16];  // [16] nibbles: low = value j, high = value j + 16
};

// Q4_1: y = q * d + m.
struct BlockQ4_1 {
  uint16_t d;      // fp16 scale
  uint16_t m;      // fp16 offset (the block minimum)
  uint8_t qs[16];  // [16] nibbles: low = value j, high = value j + 16
};

// Q5_0: y = (q - 16) * d, q = 4 low bits from qs | 5th bit from qh.
struct BlockQ5_0 {
  uint16_t d;      // fp16 scale
  uint8_t qh[4];   // [32] bits, little-endian uint32: bit i = 5th bit of value i
  uint8_t qs[16];  // [16] nibbles: low = value j, high = value j + 16
};

// Q5_1: y = q * d + m, q as in Q5_0.
struct BlockQ5_1 {
  uint16_t d;      // fp16 scale
  uint16_t m;      // fp16 offset
  uint8_t qh[4];   // [32] bits, as in Q5_0
  uint8_t qs[16];  // [16] nibbles, as in Q5_0
};

// Q8_0: y = q * d.
struct BlockQ8_0 {
  uint16_t d;     // fp16 scale
  int8_t qs[32];  // [32] values
};

// Q4_K: 8 sub-blocks of 32 values; sub-block j has 6-bit scale sc[j] and
// 6-bit min m[j]; y = (d * sc[j]) * q - (dmin * m[j]).
// scales packs the 16 six-bit numbers into 12 bytes (see get_scale_min_k4):
//   j < 4:  sc[j] = scales[j] & 63,        m[j] = scales[j + 4] & 63
//   j >= 4: sc[j] = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4
//           m[j]  = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4
// qs holds 4 chunks of 64 values, 32 bytes each: byte l of chunk c has value
// 64c + l in its low nibble and value 64c + 32 + l in its high nibble.
struct BlockQ4_K {
  uint16_t d;          // fp16 super-block scale of the 6-bit scales
  uint16_t dmin;       // fp16 super-block scale of the 6-bit mins
  uint8_t scales[12];  // [8 scales + 8 mins] x 6 bits, packed as above
  uint8_t qs[128];     // [4 chunks][32] nibbles
};

// Q5_K: Q4_K plus a fifth bit per value. Bit 2c of qh[l] is the fifth bit of
// value 64c + l, bit 2c + 1 that of value 64c + 32 + l.
struct BlockQ5_K {
  uint16_t d;          // fp16 super-block scale of the 6-bit scales
  uint16_t dmin;       // fp16 super-block scale of the 6-bit mins
  uint8_t scales[12];  // packed as in Q4_K
  uint8_t qh[32];      // [32] bytes x 8 bits: fifth bits, layout above
  uint8_t qs[128];     // [4 chunks][32] low nibbles, as in Q4_K
};

// Q6_K: 16 sub-blocks of 16 values with signed 8-bit scales;
// y = (d * scales[i / 16]) * (q - 32), q in 0..63.
// Each 128-value half h uses ql[64h .. 64h+63] and qh[32h .. 32h+31]; for
// l in 0..31 (all indices relative to the half):
//   value l      = ql[l]      & 15 | ((qh[l] >> 0) & 3) << 4
//   value l + 32 = ql[l + 32] & 15 | ((qh[l] >> 2) & 3) << 4
//   value l + 64 = ql[l]      >> 4 | ((qh[l] >> 4) & 3) << 4
//   value l + 96 = ql[l + 32] >> 4 | ((qh[l] >> 6) & 3) << 4
struct BlockQ6_K {
  uint8_t ql[128];    // [2 halves][64] low 4 bits, layout above
  uint8_t qh[64];     // [2 halves][32] high 2 bits, layout above
  int8_t scales[16];  // [16] sub-block scales
  uint16_t d;         // fp16 super-block scale
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block.
inline void get_scale_min_k4(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// True for the types dequantize_row and quantize_row handle: F32, F16, BF16,
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (exactly the types whose
// DTypeInfo::can_dequantize is set).
bool row_conversion_supported(DType type);

// Converts a row of n values stored as `type` to floats.
//   src: [dtype_row_bytes(type, n)] bytes, any alignment
//   dst: [n] floats
// n must be a multiple of the type's block size (asserted; callers that read
// untrusted files validate shapes first). Throws encore::Error naming the
// type if it is not supported (see row_conversion_supported).
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// Converts n floats to a row stored as `type`.
//   src: [n] floats
//   dst: [dtype_row_bytes(type, n)] bytes, any alignment
// n as for dequantize_row. Deterministic: the same input gives the same bytes
// on every machine.
//   F32, F16, BF16: exact copy / round to nearest even.
//   Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: ggml's reference quantisers
//     (quantize_row_*_ref), byte for byte.
//   Q4_K, Q5_K, Q6_K: a simpler scheme than ggml's (no error search), with a
//     guaranteed bound on |dequantize(quantize(x)) - x|; see quants_k.cpp.
// Throws encore::Error if the type is not supported, encore::InvalidArgument
// if a block type is asked to encode a non-finite value or one whose scale
// does not fit in fp16 (|x| beyond about 5e5 for Q4_0 up to 2e8 for Q6_K).
// On throw the contents of dst are unspecified.
void quantize_row(DType type, const float* src, void* dst, int64_t n);

}  // namespace encore::kernels
