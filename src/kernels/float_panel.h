// Float row panels: the layout F32, F16 and BF16 weights are repacked into
// so that SIMD lanes hold different output rows (lanes across rows, the
// shape of order v2; the integer types' panels are panel.h). Internal to
// src/kernels.
//
// The float canonical order is canonical.h's dot_canonical: 16 interleaved
// chains, chain j = the fma chain over k = j, j + 16, j + 32, ... in k
// order from +0, then the fixed tree reduce16 over the 16 chains. A panel
// stores each chain's values contiguously, chain after chain, so a kernel
// runs one chain at a time for 16 rows in one register (or two) and needs
// no horizontal sum: the tree adds whole registers of chains.
//
// With K = 16 q + e: chain j holds n_j = q + (j < e ? 1 : 0) values and
// starts at position s_j = j q + min(j, e). A panel of rows [16p, 16p + 16)
// (rows past the matrix are zero) is K positions of 16 values each:
//   position s_j + t holds value k = j + 16 t of rows 16p .. 16p + 15,
// stored with the weight type's own bits (F32, F16, BF16: 4 or 2 bytes;
// exact), so a position is 64 or 32 bytes. Panels are padded to 64 bytes.
// Activation rows are permuted the same way once per matmul (chain_order),
// and interleaved in groups of kActGroup rows: value at position s of row i
// of a batch at xp[(i / kActGroup) * xs + s * kActGroup + i % kActGroup].
//
// Cost: repacking is O(rows * cols), scalar. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "encore/dtype.h"
#include "kernels/matmul.h"

namespace encore::kernels::mm {

inline constexpr int kChains = 16;  // canonical.h's kDotLanes
// Activation rows are interleaved in groups of this many (a multiple of
// every ISA's tile of activation rows): a kernel's tile then reads position
// s of its rows side by side, at fixed offsets from one pointer.
inline constexpr int kActGroup = 12;

// True for the types of the float path (F32, F16, BF16).
bool is_float_panel_type(DType t);
// Bytes of one stored value of a float path type.
constexpr size_t float_elem_bytes(DType t) { return t == DType::F32 ? 4 : 2; }
// Bytes of one float panel of k values per row of type t.
size_t float_panel_bytes(DType t, int64_t k);

namespace {  // one copy per ISA's translation unit (see matmul_internal.h)
// The first position of chain j in a row of k values.
inline int64_t chain_start(int64_t k, int j) {
  const int64_t q = k / kChains, e = k % kChains;
  return j * q + (j < e ? j : e);
}
inline int64_t chain_length(int64_t k, int j) { return k / kChains + (j < k % kChains ? 1 : 0); }
}  // namespace

// Writes float panel p of w (is_float_panel_type) into dst:
// [float_panel_bytes(w.type, w.cols)], every byte of it.
void repack_float_panel(const WeightView& w, int64_t p, uint8_t* dst);

// The value at position pos of row r of a float panel of type t, widened
// exactly (the scalar twin's view of the layout).
float float_panel_value(DType t, const uint8_t* panel, int64_t pos, int r);

// Row `row` of w (is_float_panel_type) read back from its float panels
// w.panels, widened exactly into out: [w.cols] (the embedding lookup of a
// tied output head whose file bytes were given back).
void float_panel_row(const WeightView& w, int64_t row, float* out);

// dst[(s_j + t) * stride] = x[j + 16 t]: the chain order of a row of k
// values (stride kActGroup into a group of interleaved rows).
void chain_order(const float* x, int64_t k, float* dst, int64_t stride);

}  // namespace encore::kernels::mm
