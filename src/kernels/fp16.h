// IEEE 754 binary16 ("half", F16) and bfloat16 (BF16) <-> binary32 conversions.
//
// Values are passed as their raw 16-bit patterns (uint16_t), exactly as they
// sit in GGUF tensors and quantised blocks. Everything is plain integer bit
// manipulation, so results do not depend on the CPU, compiler flags or the
// floating-point environment:
//   - fp16_to_f32 / bf16_to_f32 are exact (every half and bfloat16 value is a
//     float); NaN payloads and signs are kept.
//   - f32_to_fp16 / f32_to_bf16 round to nearest, ties to even, like F16C's
//     vcvtps2ph with imm 0 and like ggml's scalar converters. Overflow gives
//     +-inf, tiny values become half subnormals or +-0, NaN stays NaN (quiet).
// Cost: a handful of integer ops per value; no tables.
// Thread-safety: pure constexpr functions.
#pragma once

#include <bit>
#include <cstdint>

namespace encore::kernels {

// Exact widening of a half to a float.
constexpr float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    // Inf or NaN: all-ones exponent; the payload moves to the top mantissa bits.
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    // Normal: rebias the exponent from 15 to 127.
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal half: mant * 2^-24. Every one is a normal float; normalise by
    // moving the highest set bit p (0..9) to the implicit position.
    const int p = 31 - std::countl_zero(mant);
    const uint32_t f32_exp = static_cast<uint32_t>(p - 24 + 127);
    bits = sign | (f32_exp << 23) | ((mant << (23 - p)) & 0x7fffffu);
  }
  return std::bit_cast<float>(bits);
}

// Float to half, round to nearest even.
constexpr uint16_t f32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {
    // NaN: keep the top payload bits and force the quiet bit so a signalling
    // NaN whose payload sits only in the low bits does not turn into inf.
    return static_cast<uint16_t>(sign | 0x7c00u | 0x0200u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u) {
    // >= 65520 (halfway between 65504, the largest half, and 2^16): the tie
    // goes to the even neighbour, which is inf. Also covers inf itself.
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (ax >= 0x38800000u) {
    // Result is a normal half (|f| >= 2^-14). Rebias, then round away the low
    // 13 mantissa bits to nearest even; a carry out of the mantissa correctly
    // bumps the exponent.
    const uint32_t v = ax - ((127u - 15u) << 23);
    const uint32_t rounded = v + 0x0fffu + ((v >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  // Result is a half subnormal or zero: the half's bits are |f| * 2^24 rounded
  // to an integer (rounding up to 0x400 yields the smallest normal, correctly).
  const uint32_t e = ax >> 23;
  if (e < 126 - 24) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to 0
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;       // significand with implicit 1
  const uint32_t shift = 126 - e;                        // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

// Exact widening of a bfloat16 to a float (bfloat16 is the top half of a float).
constexpr float bf16_to_f32(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// Float to bfloat16, round to nearest even. Subnormals are kept (not flushed),
// overflow rounds to +-inf, NaN keeps its sign and top payload bits and is
// made quiet (same rule as ggml's ggml_compute_fp32_to_bf16).
constexpr uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace encore::kernels
