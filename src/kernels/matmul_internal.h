// Internals of matmul (matmul.h): the canonical operation order of every
// weight type, the intermediate buffers, and the per-ISA kernel tables.
// Internal to src/kernels. Thread-safety: pure functions on caller buffers.
//
// ======================= THE CANONICAL ORDER (one place) =======================
// y[i][r] is defined by the scalar twin (matmul_scalar.cpp); the AVX2 and
// AVX-512 kernels compute exactly the same operations. Two families:
//
// Float weights (F32, F16, BF16, and the fallback for any other type that
// dequantize_row handles): the row is widened exactly (fallback: dequantised
// by dequantize_row) to f32 and y = dot_canonical(w_row, x_row, K) from
// canonical.h (16 lanes i % 16, fma, reduce16). Activations stay float.
//
// Integer weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K):
// 1. The activation row is quantised per group g of 32 values
//    (x[32g .. 32g+31]), identically on every ISA:
//      ab   = max_k (bits(x_k) & 0x7fffffff)      (integer max: no NaN rules)
//      ab >= 0x7f800000 (inf/NaN in the group): da = NaN, q = 0, asum = NaN
//      ab <  0x0d800000 (|x| < 2^-100 everywhere): da = 0, q = 0, asum = 0
//      else: da = amax / 127 (amax = the float whose bits are ab), id = 1 / da, q_k =
//      round_half_even(x_k * id)
//            (|q_k| <= 127), asum = da * float(sum_k q_k)
// 2. The weight row is decoded exactly into int8 values w_k, one float scale
//    ws per 16 values and (types with an offset) one float wm per group:
//      Q8_0  w = q,          ws = d                  (signed)
//      Q4_0  w = q - 8,      ws = d                  (signed)
//      Q5_0  w = q - 16,     ws = d                  (signed)
//      Q4_1  w = q,          ws = d,     wm = m      (unsigned)
//      Q5_1  w = q,          ws = d,     wm = m      (unsigned)
//      Q4_K  w = q,          ws = d*sc_j, wm = -(dmin*m_j)   (unsigned)
//      Q5_K  w = q,          ws = d*sc_j, wm = -(dmin*m_j)   (unsigned)
//      Q6_K  w = q - 32,     ws = d*sc_i (per 16)    (signed)
//    (d, m, dmin are the fp16 fields widened; every product here is exact in
//    float, so decoding has no rounding at all.)
// 3. For each group g and lane l in [0, 8) the exact integer
//      p = sum_{k<4} w[32g+4l+k] * q[32g+4l+k]        (|p| <= 4*128*127)
//    is accumulated into 16 float lanes, groups in index order:
//      acc[8*(g%2) + l] = fma(float(p), ws[2g + l/4] * da_g, acc[8*(g%2) + l])
//    (the scale product is rounded to float first). Types with wm also run
//      accm[g % 8] = fma(wm_g, asum_g, accm[g % 8])
//    and y = reduce16(acc) + reduce8(accm); otherwise y = reduce16(acc).
//    reduce8 is the tail of canonical.h's tree: s4[l] = a[l] + a[l+4],
//    then (s4[0] + s4[2]) + (s4[1] + s4[3]).
// Finally every NaN output is written as the quiet NaN 0x7fc00000, so NaN
// payloads (which differ between libm's fmaf and vfmadd) never show.
// All accumulators start at +0.0f. On the integer path zero padding (w = 0,
// ws = 0, q = 0, da = 0, wm = asum = 0) leaves them unchanged bit for bit:
// fma(0, 0, a) = a for every a that is not -0, and these accumulators never
// become -0 (a nonzero product is at least ~2^-131 in magnitude, so it never
// underflows to a signed zero, and +0 + -0 = +0 under round-to-nearest), so
// buffers are padded to Kp (K rounded up to 256) and SIMD code may run over
// the padding. Float accumulators CAN become -0 (an underflowed negative
// product), so float tails never touch lanes past K (masked fma / blend).
// ================================================================================
#pragma once

#include <cstddef>
#include <cstdint>

#include "encore/dtype.h"
#include "encore/isa.h"

namespace encore::kernels::mm {

inline constexpr int64_t kGroup = 32;   // values per activation group
inline constexpr int64_t kPadTo = 256;  // K is padded to a multiple of this
inline constexpr int kMaxTileR = 4;     // weight rows per register tile
inline constexpr int kMaxTileC = 4;     // activation rows per register tile
// Batches of up to kDecodeRows activation rows (decode, up to 8 streams)
// take the direct kernels of every type a table has them for; a table may
// keep them for larger batches (has_direct_avx512) but never beyond
// kMaxDirectRows, so larger batches always run the decoded-rows path.
inline constexpr int64_t kDecodeRows = 8;
inline constexpr int64_t kMaxDirectRows = 64;

// The inline helpers of this header sit in an anonymous namespace: it is
// included by files compiled for different ISAs (matmul_avx2.cpp with BMI2,
// matmul_avx512.cpp with AVX-512), and a shared inline copy that the
// compiler did not inline could be the one built for the wider ISA, then
// called from the scalar or AVX2 path. Each file keeps its own copy.
namespace {
inline int64_t padded_k(int64_t k) { return (k + kPadTo - 1) / kPadTo * kPadTo; }
}  // namespace

// True for the weight types that take the integer path.
bool is_int_type(DType t);
// Integer types whose decoded w can be negative (the rest are in [0, 31]).
bool is_signed_type(DType t);
// Integer types with a per-group offset term wm.
bool has_min(DType t);

// Quantised activation rows; zero-padded to kp values.
struct ActRows {
  int8_t* q = nullptr;    // [m, kp]
  float* d = nullptr;     // [m, kp / 32]
  float* asum = nullptr;  // [m, kp / 32]
  int64_t kp = 0;
};

// Decoded weight rows (integer path); zero-padded to kp values.
struct DecRows {
  int8_t* w = nullptr;  // [rows, kp]
  float* ws = nullptr;  // [rows, kp / 16]
  float* wm = nullptr;  // [rows, kp / 32] (only types with has_min)
  int64_t kp = 0;
};

struct IsaKernels {
  // Quantises x: [k] into row `i` of a (k % 32 == 0; the padding stays as is).
  void (*quantize_act)(const float* x, int64_t k, const ActRows& a, int64_t i);
  // Decodes weight row `src` (k values of type t) into row `r` of d.
  void (*decode)(DType t, const uint8_t* src, int64_t k, const DecRows& d, int64_t r);
  // Integer tile: out[c * R + r] = y = reduce16(acc) (+ reduce8(accm) where
  // d.wm is set: types with an offset) for weight rows r0 + [0, R) and
  // activation rows i0 + [0, C); 1 <= R <= 4, 1 <= C <= 4.
  void (*int_tile)(int R, int C, bool w_signed, const DecRows& d, int64_t r0, const ActRows& a,
                   int64_t i0, float* out);
  // Float tile, one block of K: continues the 16 lanes of dot_canonical
  // (canonical.h) of weight row w + r * w_stride with activation row
  // x + c * x_stride over their next k values, acc: [C * R][16] (pair
  // (r, c) at acc + 16 * (c * R + r)), in and out. The block must start at
  // a multiple of 16 within the rows, so lane l of the block is lane l of
  // the whole dot product. acc is scratch the kernel may always write.
  // `first` (the first block): the lanes start at +0 and acc is not read.
  // With out set (the last block) writes out[c * R + r] = reduce16 of the
  // pair's lanes, and acc's contents are then unspecified (kernels may
  // reduce from registers without storing the lanes). Lanes past k are left
  // as they are (a -0 lane stays -0).
  void (*float_tile)(int R, int C, const float* w, int64_t w_stride, const float* x,
                     int64_t x_stride, int64_t k, bool first, float* acc, float* out);
  // Widens a row of F16/BF16 (exact) or F32 into dst: [k].
  void (*widen)(DType t, const uint8_t* src, int64_t k, float* dst);
  // Optional (null, or false from has_direct = decode + int_tile): y as
  // int_tile gives it (offset term included), read straight from the blocks
  // of R weight rows (starting at w, row_bytes apart, k values each), for
  // the batch sizes (at least 1 to 8 rows) where decoding into a buffer
  // first costs more. Same operations, same bits.
  bool (*has_direct)(DType t, int64_t m);  // m: activation rows of the call
  void (*direct_tile)(DType t, int R, int C, const uint8_t* w, size_t row_bytes, int64_t k,
                      const ActRows& a, int64_t i0, float* out);
  // Optional (null, or false from has_direct_float = widen + float_tile):
  // the float_tile result read straight from R rows of F16/BF16 weights
  // (row_bytes apart), for small batches. Same operations, same bits.
  bool (*has_direct_float)(DType t, int64_t m) = nullptr;
  void (*direct_float_tile)(DType t, int R, int C, const uint8_t* w, size_t row_bytes,
                            const float* x, int64_t x_stride, int64_t k, float* out) = nullptr;
};

// Byte layout of the 32-value block types, for the direct kernels: fp16 d
// at 0, fp16 m at kMin, 32 high bits at kQh (-1: none), qs[16] at kQs (byte
// j: value j in the low nibble, value j + 16 in the high one); w = u - kBias.
// kInt8 (Q8_0): qs[32] at kQs are the signed values w themselves.
template <DType T>
struct LegacyBlock;
template <>
struct LegacyBlock<DType::Q4_0> {
  static constexpr size_t kBytes = 18;
  static constexpr int kMin = -1, kQh = -1, kQs = 2, kBias = 8;
  static constexpr bool kInt8 = false;
};
template <>
struct LegacyBlock<DType::Q4_1> {
  static constexpr size_t kBytes = 20;
  static constexpr int kMin = 2, kQh = -1, kQs = 4, kBias = 0;
  static constexpr bool kInt8 = false;
};
template <>
struct LegacyBlock<DType::Q5_0> {
  static constexpr size_t kBytes = 22;
  static constexpr int kMin = -1, kQh = 2, kQs = 6, kBias = 16;
  static constexpr bool kInt8 = false;
};
template <>
struct LegacyBlock<DType::Q5_1> {
  static constexpr size_t kBytes = 24;
  static constexpr int kMin = 2, kQh = 4, kQs = 8, kBias = 0;
  static constexpr bool kInt8 = false;
};
template <>
struct LegacyBlock<DType::Q8_0> {
  static constexpr size_t kBytes = 34;
  static constexpr int kMin = -1, kQh = -1, kQs = 2, kBias = 0;
  static constexpr bool kInt8 = true;
};

namespace {  // see padded_k

// Unaligned little-endian loads from weight bytes.
inline uint16_t rd16(const uint8_t* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
}
inline uint32_t rd32(const uint8_t* p) {
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// The 8 six-bit scales and the 8 mins of a Q4_K/Q5_K super-block from its
// 12 packed bytes (layout in quants.h), one per byte of *sc and *mn (byte j:
// sub-block j), with integer ops only: the values get_scale_min_k4 gives.
inline void unpack_k4_scales(const uint8_t* packed, uint64_t* sc, uint64_t* mn) {
  const uint32_t u0 = rd32(packed), u1 = rd32(packed + 4), u2 = rd32(packed + 8);
  // sc_0..3 = low 6 bits of bytes 0..3; m_0..3 = low 6 bits of bytes 4..7;
  // sc_4..7 = low nibble of bytes 8..11 | top 2 bits of bytes 0..3 << 4;
  // m_4..7 = high nibble of bytes 8..11 | top 2 bits of bytes 4..7 << 4.
  const uint32_t sc_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4;
  const uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4;
  *sc = sc_lo | uint64_t{sc_hi} << 32;
  *mn = m_lo | uint64_t{m_hi} << 32;
}

}  // namespace

const IsaKernels& scalar_kernels();
const IsaKernels& avx2_kernels();
const IsaKernels& avx512_kernels();

// Shared scalar pieces (matmul_scalar.cpp), also used by the SIMD tables for
// the rare types they have no SIMD code for.
void decode_scalar(DType t, const uint8_t* src, int64_t k, const DecRows& d, int64_t r);
void widen_scalar(DType t, const uint8_t* src, int64_t k, float* dst);
// The fixed activation-group rule above for one group whose integer abs-max
// bits are `ab`: writes q[32], returns da (asum via *asum).
void quantize_group_scalar(const float* x, uint32_t ab, int8_t* q, float* da, float* asum);

// Bits of 2^-100: groups whose abs max is below it quantise to zero (so that
// 1 / da stays finite).
inline constexpr uint32_t kTinyBits = 0x0d800000u;
inline constexpr uint32_t kInfBits = 0x7f800000u;
inline constexpr uint32_t kCanonNanBits = 0x7fc00000u;

}  // namespace encore::kernels::mm
