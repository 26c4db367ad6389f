// Encore's own transcendental functions. libm's expf/sinf/cosf/powf may give
// different bits on different machines or libm versions, which would break
// reproducibility; these are built only from operations IEEE 754 defines
// exactly (+ - * /, fma, sqrt, rounding to an integer, scaling by a power of
// two, bit manipulation), so every machine gets the same bits.
//
//   exp_f32_ref   float exp, < 1 ulp (0.92 measured: tests/ops_test.cpp). The SIMD
//                 kernels (ops_vec.h, for AVX2 and AVX-512) run the very same
//                 operation sequence lane by lane.
//   exp_f64, log_f64, pow_f64, sincos_f64
//                 double versions for the RoPE angle table: accurate to a few
//                 double ulp, so rounding their results to float gives the
//                 correctly rounded float in all but ~1e-8 of cases.
// Cost: exp_f32_ref ~15 flops; the double ones ~20-40 flops each.
// The inline functions are `static` on purpose: this header is included by
// translation units compiled for AVX2/AVX-512, and with plain `inline` the
// linker could pick such a copy for baseline code (illegal instruction on
// older CPUs). Internal linkage keeps one copy per translation unit.
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace encore::kernels {

// Constants of exp_f32 (shared with the SIMD twins so they cannot drift).
namespace expf_const {
// Inputs are clamped to [kMin, kMax] first: below -104 the result rounds to
// +0 (exp(-104) < 2^-150), above 89 it overflows to +inf either way.
inline constexpr float kMin = -104.0f;
inline constexpr float kMax = 89.0f;
inline constexpr float kLog2e = 1.44269502162933349609375f;  // log2(e) rounded
// 1.5 * 2^23: adding it rounds a float of magnitude < 2^22 to an integer.
inline constexpr float kShifter = 12582912.0f;
// ln 2 = kLn2Hi + kLn2Lo (Cody-Waite). kLn2Hi has 9 significant bits, so
// n * kLn2Hi is exact for |n| <= 2^15 and x - n * kLn2Hi loses nothing.
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
// Taylor coefficients 1/k! (k = 2..7): on |r| <= 0.35 the truncation error is
// below 6e-9 relative, far under float rounding.
inline constexpr float kC2 = 0.5f;
inline constexpr float kC3 = 1.0f / 6.0f;
inline constexpr float kC4 = 1.0f / 24.0f;
inline constexpr float kC5 = 1.0f / 120.0f;
inline constexpr float kC6 = 1.0f / 720.0f;
inline constexpr float kC7 = 1.0f / 5040.0f;
}  // namespace expf_const

// exp for float, the scalar definition (ops.h exp_f32 calls it):
//   xc = min(max(x, kMin), kMax)         (as x86 maxps/minps: NaN -> kMin)
//   n  = round_to_even(xc * log2e)       (fma with the 1.5*2^23 shifter)
//   r  = fma(-n, kLn2Lo, fma(-n, kLn2Hi, xc))
//   p  = 1 + r(1 + r(c2 + r(c3 + ... + r c7)))   (Horner, each step one fma)
//   result = (p * 2^(n >> 1)) * 2^(n - (n >> 1))
// The first product is exact (p*2^(n>>1) stays normal), the second rounds
// once, so subnormal results are p * 2^n correctly rounded and n = 128 gives
// +inf exactly when p * 2^128 overflows. NaN in -> NaN out (quietened).
// Special values: exp(-inf) = +0, exp(+inf) = +inf, exp(+-0) = 1 exactly.
static inline float exp_f32_ref(float x) {
  using namespace expf_const;
  float xc = x > kMin ? x : kMin;
  xc = xc < kMax ? xc : kMax;
  const float n = std::fma(xc, kLog2e, kShifter) - kShifter;
  float r = std::fma(-n, kLn2Hi, xc);
  r = std::fma(-n, kLn2Lo, r);
  float p = kC7;
  p = std::fma(p, r, kC6);
  p = std::fma(p, r, kC5);
  p = std::fma(p, r, kC4);
  p = std::fma(p, r, kC3);
  p = std::fma(p, r, kC2);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const int32_t ni = static_cast<int32_t>(n);  // integral, in [-150, 128]
  const int32_t n1 = ni >> 1;                  // [-75, 64]
  const int32_t n2 = ni - n1;                  // [-75, 64]
  const float s1 = std::bit_cast<float>(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<uint32_t>(n2 + 127) << 23);
  const float res = (p * s1) * s2;
  return x != x ? x + x : res;
}

// silu(x) = x / (1 + exp(-x)), scalar definition.
static inline float silu_ref(float x) { return x / (1.0f + exp_f32_ref(-x)); }

// Double-precision helpers (defined in ops_math.cpp).
// exp_f64: |rel err| < 4e-16 for results in the normal range.
double exp_f64(double x);
// log_f64: x > 0 finite; NaN for x < 0 or NaN, -inf for 0, +inf for +inf.
double log_f64(double x);
// pow_f64(x, y) = exp(y * log(x)) for x > 0 (x = 1 gives 1, x <= 0 gives NaN:
// RoPE bases are positive).
double pow_f64(double x, double y);
// sin and cos of x. Argument reduction by pi/2 with a three-part constant and
// fma keeps ~1e-16 relative accuracy for |x| < 2^30 (RoPE angles stay far
// below: pos * freq_scale). Beyond that the result is still deterministic
// but loses accuracy. NaN or inf in -> NaN out.
void sincos_f64(double x, double* s, double* c);

}  // namespace encore::kernels
