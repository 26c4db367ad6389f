// Internals of matmul (matmul.h): the canonical operation order of every
// weight type, the intermediate buffers, and the per-ISA kernel tables.
// Internal to src/kernels. Thread-safety: pure functions on caller buffers.
//
// ======================= THE CANONICAL ORDER (one place) =======================
// y[i][r] is defined by the scalar twin (matmul_scalar.cpp); the AVX2 and
// AVX-512 kernels compute exactly the same operations. Two families:
//
// Float weights (F32, F16, BF16): the row is widened exactly to f32 and
// y = dot_canonical(w_row, x_row, K) from canonical.h: 16 interleaved fma
// chains (chain j over k = j (mod 16), in k order, from +0), then the fixed
// tree reduce16. Activations stay float.
// This is order v2's "fixed number of interleaved chains" with C = 16, the
// same numbers as v1 (where the chains were the lanes of one register): the
// kernels now hold rows in SIMD lanes over float panels (float_panel.h) and
// run one chain at a time, so float bits did not change with v2.
//
// Integer weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), order v2
// (SIMD lanes hold different output rows, never parts of one output):
// 1. The activation row is quantised per group g of 32 values
//    (x[32g .. 32g+31]), identically on every ISA:
//      ab   = max_k (bits(x_k) & 0x7fffffff)      (integer max: no NaN rules)
//      ab >= 0x7f800000 (inf/NaN in the group): da = NaN, q = 0, asum = NaN
//      ab <  0x0d800000 (|x| < 2^-100 everywhere): da = 0, q = 0, asum = 0
//      else: da = amax / 127 (amax = the float whose bits are ab), id = 1 / da, q_k =
//      round_half_even(x_k * id)
//            (|q_k| <= 127), asum = da * float(sum_k q_k)
// 2. The weights are the GGUF blocks' own integers w_k and scales, exactly
//    (panel.h keeps them in row panels): per group g a float scale ws_g and
//    (types with an offset) an offset wm_g:
//      Q8_0  w = q,          ws = d                  (signed)
//      Q4_0  w = q - 8,      ws = d
//      Q5_0  w = q - 16,     ws = d
//      Q4_1  w = q,          ws = d,     wm = m
//      Q5_1  w = q,          ws = d,     wm = m
//      Q4_K  w = q,          ws = d*sc_j, wm = -(dmin*m_j)
//      Q5_K  w = q,          ws = d*sc_j, wm = -(dmin*m_j)
//      Q6_K  w = q - 32,     ws = d, and the int8 sub-scales sc_a, sc_b of
//            the group's two halves of 16 values
//    (d, m, dmin are the fp16 fields widened; every product here is exact in
//    float, so these numbers carry no rounding at all.)
// 3. Per group the exact integer
//      S_g = sum_{k<32} w[32g+k] * q[32g+k]                    (|S_g| <= 32*128*127)
//      Q6_K: S_g = sc_a * sum_{k<16} w q + sc_b * sum_{16<=k<32} w q   (|S_g| < 2^24)
//    (any grouping of the products gives the same integer), then one chain
//    per output, groups in index order, from +0:
//      acc = fma(float(S_g), ws_g * da_g, acc)     (float(S_g) exact; the scale
//                                                   product rounded to float first)
//    types with an offset also run accm = fma(wm_g, asum_g, accm) from +0,
//    and y = acc + accm; otherwise y = acc.
// Finally every NaN output is written as the quiet NaN 0x7fc00000, so NaN
// payloads (which differ between libm's fmaf and vfmadd) never show.
// Float accumulators CAN become -0 (an underflowed negative product), so
// no chain ever runs past its own values (a padded fma(0, x, -0) would make
// it +0): float panels give each chain exactly its length. On the integer
// path K is a whole number of blocks, so nothing is padded along K. A
// panel's padded rows only fill lanes whose outputs are dropped.
// ================================================================================
#pragma once

#include <cstddef>
#include <cstdint>

#include "encore/dtype.h"
#include "encore/isa.h"

namespace encore::kernels::mm {

inline constexpr int64_t kGroup = 32;   // values per activation group
inline constexpr int64_t kPadTo = 256;  // K is padded to a multiple of this
inline constexpr int kMaxTileC = 8;     // activation rows per integer register tile
// Batches of up to kDecodeRows activation rows (decode, up to 8 streams):
// one contiguous range of panels per thread.
inline constexpr int64_t kDecodeRows = 8;

// The inline helpers of this header sit in an anonymous namespace: it is
// included by files compiled for different ISAs (matmul_avx2.cpp and
// matmul_panel_avx2.cpp with AVX2 and BMI2, matmul_panel_avxvnni.cpp with
// AVX-VNNI besides, matmul_avx512.cpp and
// matmul_panel_avx512.cpp with AVX-512), and a shared inline copy that the
// compiler did not inline could be the one built for the wider ISA, then
// called from the scalar or AVX2 path. Each file keeps its own copy.
namespace {
inline int64_t padded_k(int64_t k) { return (k + kPadTo - 1) / kPadTo * kPadTo; }
}  // namespace

// True for the weight types that take the integer path.
bool is_int_type(DType t);
// Integer types with a per-group offset term wm.
bool has_min(DType t);

// Quantised activation rows, zero-padded to kp values, interleaved in
// blocks of `block` rows (kActRows, or m when fewer: one decode row stays
// compact in L1): per block of rows, per group g of 32 values, the block's
// rows side by side. A tile's rows (within one block: the driver steps by
// blocks) then lie at fixed offsets from one pointer per array (with a
// pointer per row and array, 32 of them had spilled registers). Allocate
// for m rounded up to a whole block; see the act_* helpers below.
inline constexpr int kActRows = kMaxTileC;
struct ActRows {
  int8_t* q = nullptr;      // [blocks, kp / 32, block, 32]
  float* d = nullptr;       // [blocks, kp / 32, block]
  float* asum = nullptr;    // [blocks, kp / 32, block]
  int32_t* isum = nullptr;  // [blocks, kp / 32, block, 2] sum_k q_k over each 16 values
  // [blocks, kp / 32, block] sum_k q_k over each group (isum's halves added):
  // the kernels subtract offset * qsum for stored values with an offset,
  // from memory (a broadcast load) instead of adding the halves in scalar
  // registers per tile row.
  int32_t* qsum = nullptr;
  int64_t kp = 0;
  int64_t block = kActRows;  // rows per block, <= kActRows
};

namespace {  // see padded_k
// The index of (activation row i, group g) among the per-group entries
// (d, asum, qsum; q and isum scaled by 32 and 2).
inline int64_t act_at(const ActRows& a, int64_t i, int64_t g) {
  return ((i / a.block) * (a.kp / kGroup) + g) * a.block + i % a.block;
}
inline int8_t* act_q(const ActRows& a, int64_t i, int64_t g) {
  return a.q + act_at(a, i, g) * kGroup;
}
}  // namespace

// Decoded weight rows: what decode_scalar writes (panel.cpp's repacking
// reads one block of values from it); kp is the row stride.
struct DecRows {
  int8_t* w = nullptr;  // [rows, kp]
  float* ws = nullptr;  // [rows, kp / 16]
  float* wm = nullptr;  // [rows, kp / 32] (only types with has_min)
  int64_t kp = 0;
};

struct IsaKernels {
  // Quantises x: [k] into row `i` of a (k % 32 == 0; the padding stays as is).
  void (*quantize_act)(const float* x, int64_t k, const ActRows& a, int64_t i);
  // Integer tile of the order above: out[c * 16 + r] = y for the 16 rows of
  // one panel (panel.h; type t, k values per row) and activation rows i0 +
  // [0, C), 1 <= C <= kMaxTileC, all in one block of a (i0 % a.block + C
  // <= a.block: the kernels read the block's rows at fixed offsets) (before
  // NaN canonicalisation). The kernel may
  // prefetch the bytes of the panel after it.
  void (*panel_tile)(DType t, const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0, int C,
                     float* out);
  // Float panels (float_panel.h) of element type elem: out[c * 16 np + r]
  // = dot_canonical (canonical.h) of row r of the np panels at `panels`
  // (pbytes apart) with activation row c < m of xp (chain-ordered and
  // interleaved in groups of kActGroup rows, xs floats apart: float_panel.h),
  // before NaN canonicalisation.
  void (*float_panels)(DType elem, const uint8_t* panels, size_t pbytes, int64_t np, int64_t k,
                       const float* xp, int64_t xs, int64_t m, float* out);
  // Activation rows per block of ActRows (<= kActRows): the rows the integer
  // path passes over each block of panels at a time. AVX2 tiles read each
  // activation row once per half panel, so 4 rows (K bytes each) stay in L1
  // where 8 of the down matrix's did not. Speed only.
  int act_rows = kActRows;
};

namespace {  // see padded_k

// Unaligned little-endian loads from weight bytes.
inline uint16_t rd16(const uint8_t* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
}

}  // namespace

const IsaKernels& scalar_kernels();
const IsaKernels& avx2_kernels();
const IsaKernels& avxvnni_kernels();  // avx2_kernels() with AVX-VNNI's integer tiles
const IsaKernels& avx512_kernels();

// Shared scalar pieces (matmul_scalar.cpp), and the panel kernels of each
// SIMD table (matmul_panel_*.cpp).
// Decodes weight row `src` (k values of type t) into row `r` of d, exactly
// (ws per 16 values; panel.h's repacking reads the values from it).
void decode_scalar(DType t, const uint8_t* src, int64_t k, const DecRows& d, int64_t r);
void panel_tile_avx2(DType t, const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0, int C,
                     float* out);
void panel_tile_avx512(DType t, const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0,
                       int C, float* out);
// The fixed activation-group rule above for one group whose integer abs-max
// bits are `ab`: writes q[32], returns da (asum via *asum).
void quantize_group_scalar(const float* x, uint32_t ab, int8_t* q, float* da, float* asum);

// Bits of 2^-100: groups whose abs max is below it quantise to zero (so that
// 1 / da stays finite).
inline constexpr uint32_t kTinyBits = 0x0d800000u;
inline constexpr uint32_t kInfBits = 0x7f800000u;
inline constexpr uint32_t kCanonNanBits = 0x7fc00000u;

}  // namespace encore::kernels::mm
