// Row panels: the layout the integer (quantised) weights are repacked into so
// that SIMD lanes hold different output rows (the order of
// matmul_internal.h). Internal to src/kernels; the model keeps repacked
// copies (WeightView::panels), and matmul repacks on the fly where a view has
// none. Repacking is exact: every value, scale and offset of the GGUF blocks
// is kept as is, so a panel holds the same numbers in another order.
//
// A matrix of `rows` rows becomes ceil(rows / 16) panels of 16 rows each (the
// last one padded with rows of zero values and zero scales), each panel
// panel_bytes(t, cols) long, K in units of two blocks (64 values) for the
// legacy types and one super-block (256) for the K-quants; a legacy row of
// an odd number of blocks ends in a unit of one group. Every unit is a
// multiple of 64 bytes, so no vector load straddles two cache lines.
// Within a panel, unit after unit:
//   [unit header: the unit's scales for the 16 rows][group 0 values]...[group n-1 values]
// Headers (fp16 fields as in the blocks, [16] = one per row):
//   legacy (Q8_0 Q4_0 Q5_0):   d[2][16] fp16 (one per block)
//   legacy with offset (Q4_1 Q5_1): d[2][16] fp16, m[2][16] fp16
//   Q4_K, Q5_K:  d[16] fp16, dmin[16] fp16, sc[8][16] u8, mn[8][16] u8 (6-bit, unpacked)
//   Q6_K:        d[16] fp16, sc[8][16][2] int8 (group, row, half: one per 16
//                values), 32 bytes of padding
// Group values (32 per row), 4-byte chunks of the 16 rows side by side, so one
// 64-byte load holds 4 consecutive values of every row:
//   I8 (Q8_0): [8 chunks][16 rows][4] int8, chunk j = values 4j .. 4j+3
//   U4: [4 chunks][16 rows][4] bytes, byte t of chunk j = u[4j+t] | u[16+4j+t] << 4
//   U5: U4, then H[16 rows][4]: byte t, bit j = bit 4 of u[4j+t], bit 4+j = bit 4 of u[16+4j+t]
//   U6: U4, then H2[2][16 rows][4]: byte t of H2[h] holds bits 4-5 of
//       u[4j+t] at bits 0-1 and of u[16+4j+t] at bits 2-3 for j = 2h, and
//       the same for j = 2h+1 at bits 4-5 and 6-7
// The stored value u is unsigned (0..63) except for I8; the weight is
// w = u - bias (Q4_0 8, Q5_0 16, Q6_K 32, the others 0).
//
// Cost: repacking is O(rows * cols), scalar. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "encore/dtype.h"
#include "kernels/matmul.h"

namespace encore::kernels::mm {

inline constexpr int kPanelRows = 16;

enum class PanelValues : uint8_t { I8, U4, U5, U6 };
enum class PanelScales : uint8_t { Legacy, KQuant, Q6K };

// The layout's sizes and header offsets, defined once here for panel.cpp and
// the SIMD kernels (panel_kernel.h).
constexpr int64_t unit_values_of(PanelScales s) { return s == PanelScales::Legacy ? 64 : 256; }
constexpr size_t group_bytes_of(PanelValues v) {
  return (v == PanelValues::I8   ? 32
          : v == PanelValues::U4 ? 16
          : v == PanelValues::U5 ? 20
                                 : 24) *
         size_t{kPanelRows};
}
constexpr size_t head_bytes_of(PanelScales s, bool has_min) {
  return (s == PanelScales::Legacy ? (has_min ? 8 : 4) : 20) * size_t{kPanelRows};  // Q6_K padded
}
inline constexpr size_t kHeadD = 0;                     // d[16] fp16 (legacy: d[2][16])
inline constexpr size_t kHeadM = 2 * kPanelRows;        // K dmin[16] fp16
inline constexpr size_t kHeadLegacyM = 4 * kPanelRows;  // legacy m[2][16] fp16
inline constexpr size_t kHeadKSc = 4 * kPanelRows;      // K: sc[8][16] u8
inline constexpr size_t kHeadKMn = 12 * kPanelRows;     // K: mn[8][16] u8
inline constexpr size_t kHeadQ6Sc = 2 * kPanelRows;     // Q6_K: sc[8][16][2] int8
inline constexpr size_t kHigh = 16 * kPanelRows;        // in a group: H (U5) or H2[0] (U6)
inline constexpr size_t kHigh2 = 20 * kPanelRows;       // in a group: H2[1] (U6)

struct PanelFormat {
  PanelValues values = PanelValues::I8;
  PanelScales scales = PanelScales::Legacy;
  bool has_min = false;      // an offset term wm per group
  int bias = 0;              // w = u - bias
  int64_t unit_values = 32;  // values per unit (one GGUF block)
  size_t head_bytes = 0;     // scale bytes at the start of a unit
  size_t group_bytes = 0;    // value bytes of one 32-value group
  size_t unit_bytes = 0;     // head_bytes + unit_values / 32 * group_bytes
};

// The format of an integer type (is_int_type(t)).
const PanelFormat& panel_format(DType t);
namespace {  // one copy per ISA's translation unit (see matmul_internal.h)
inline int64_t panel_count(int64_t rows) { return (rows + kPanelRows - 1) / kPanelRows; }
}  // namespace
// Bytes of one panel of cols values per row (cols a multiple of the unit).
size_t panel_bytes(DType t, int64_t cols);

// Writes panel p of w (rows [16p, 16p + 16); rows past w.rows are zero) into
// dst: [panel_bytes(w.type, w.cols)], every byte of it. w.type must be an
// integer type.
void repack_panel(const WeightView& w, int64_t p, uint8_t* dst);

// The weight w of value k (of cols) for row r of a panel (the scalar twin's
// view of the layout), and its group's scales: ws (the float scale of the
// group: d, or d * sc for K-quants; Q6_K: d), wm (the offset, 0 without),
// and for Q6_K the two int sub-scales of the group's halves.
int panel_weight(const PanelFormat& f, const uint8_t* panel, int r, int64_t k);
struct GroupScales {
  float ws = 0, wm = 0;
  int sc_a = 1, sc_b = 1;  // Q6_K only
};
GroupScales panel_scales(const PanelFormat& f, const uint8_t* panel, int r, int64_t g);

}  // namespace encore::kernels::mm
