// Row panels (panel.h): the formats, the repacking and the scalar reads the
// scalar twin uses.
#include "kernels/panel.h"

#include <cassert>
#include <cstring>

#include "kernels/fp16.h"
#include "kernels/matmul_internal.h"
#include "kernels/quants.h"

namespace encore::kernels::mm {
namespace {

constexpr size_t kRows = kPanelRows;

PanelFormat make(PanelValues v, PanelScales s, bool has_min, int bias) {
  PanelFormat f;
  f.values = v;
  f.scales = s;
  f.has_min = has_min;
  f.bias = bias;
  // Legacy units are two blocks, so that every unit (and every group in it)
  // starts on a 64-byte boundary: a vector load never straddles two lines.
  f.unit_values = unit_values_of(s);
  f.group_bytes = group_bytes_of(v);
  f.head_bytes = head_bytes_of(s, has_min);
  f.unit_bytes = f.head_bytes + static_cast<size_t>(f.unit_values / kGroup) * f.group_bytes;
  return f;
}

void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// Writes the 32 stored values u of row r into a group's bytes.
void put_group(const PanelFormat& f, uint8_t* grp, int r, const uint8_t* u) {
  if (f.values == PanelValues::I8) {
    for (int j = 0; j < 8; ++j) std::memcpy(grp + (j * kRows + r) * 4, u + 4 * j, 4);
    return;
  }
  for (int j = 0; j < 4; ++j) {
    for (int t = 0; t < 4; ++t) {
      const int lo = u[4 * j + t], hi = u[16 + 4 * j + t];
      grp[(j * kRows + r) * 4 + t] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
      if (f.values == PanelValues::U5) {
        uint8_t& h = grp[kHigh + r * 4 + t];
        h = static_cast<uint8_t>(h | ((lo >> 4) & 1) << j | ((hi >> 4) & 1) << (4 + j));
      }
      if (f.values == PanelValues::U6) {
        uint8_t& h = grp[kHigh + (j / 2 * kRows + r) * 4 + t];
        const int at = 4 * (j % 2);
        h = static_cast<uint8_t>(h | ((lo >> 4) & 3) << at | ((hi >> 4) & 3) << (at + 2));
      }
    }
  }
}

}  // namespace

const PanelFormat& panel_format(DType t) {
  static const PanelFormat q8_0 = make(PanelValues::I8, PanelScales::Legacy, false, 0);
  static const PanelFormat q4_0 = make(PanelValues::U4, PanelScales::Legacy, false, 8);
  static const PanelFormat q4_1 = make(PanelValues::U4, PanelScales::Legacy, true, 0);
  static const PanelFormat q5_0 = make(PanelValues::U5, PanelScales::Legacy, false, 16);
  static const PanelFormat q5_1 = make(PanelValues::U5, PanelScales::Legacy, true, 0);
  static const PanelFormat q4_k = make(PanelValues::U4, PanelScales::KQuant, true, 0);
  static const PanelFormat q5_k = make(PanelValues::U5, PanelScales::KQuant, true, 0);
  static const PanelFormat q6_k = make(PanelValues::U6, PanelScales::Q6K, false, 32);
  switch (t) {
    case DType::Q8_0:
      return q8_0;
    case DType::Q4_0:
      return q4_0;
    case DType::Q4_1:
      return q4_1;
    case DType::Q5_0:
      return q5_0;
    case DType::Q5_1:
      return q5_1;
    case DType::Q4_K:
      return q4_k;
    case DType::Q5_K:
      return q5_k;
    case DType::Q6_K:
      return q6_k;
    default:
      break;
  }
  assert(false && "panel_format: not an integer type");
  return q8_0;
}

size_t panel_bytes(DType t, int64_t cols) {
  const PanelFormat& f = panel_format(t);
  const int64_t tail = cols % f.unit_values / kGroup;  // groups of a last, part-filled unit
  return static_cast<size_t>(cols / f.unit_values) * f.unit_bytes +
         (tail > 0 ? f.head_bytes + static_cast<size_t>(tail) * f.group_bytes : 0);
}

void repack_panel(const WeightView& w, int64_t p, uint8_t* dst) {
  const PanelFormat& f = panel_format(w.type);
  // GGUF blocks: 32 values (legacy) or 256 (K-quants), one or two to a unit.
  const int64_t block = f.scales == PanelScales::Legacy ? kLegacyBlock : kSuperBlock;
  const int64_t n_blocks = w.cols / block;
  const size_t block_bytes = dtype_row_bytes(w.type, static_cast<uint64_t>(block));
  std::memset(dst, 0, panel_bytes(w.type, w.cols));  // padding, and the bits or-ed in below
  // One block of one row decoded exactly (decode_scalar: signed w = u -
  // bias), the scales then read from the block itself.
  int8_t wv[kSuperBlock];
  float ws[kSuperBlock / 16], wm[kSuperBlock / kGroup];
  const DecRows dec{wv, ws, wm, kSuperBlock};
  for (int r = 0; r < kPanelRows && p * kPanelRows + r < w.rows; ++r) {
    const uint8_t* src = w.data + static_cast<size_t>(p * kPanelRows + r) * w.row_bytes;
    for (int64_t bi = 0; bi < n_blocks; ++bi) {
      const uint8_t* b = src + static_cast<size_t>(bi) * block_bytes;
      const int64_t first = bi * block;  // the block's first value in the row
      uint8_t* unit = dst + static_cast<size_t>(first / f.unit_values) * f.unit_bytes;
      const int64_t gi0 = first % f.unit_values / kGroup;  // its first group in the unit
      decode_scalar(w.type, b, block, dec, 0);
      if (f.scales == PanelScales::Legacy) {
        put16(unit + kHeadD + gi0 * 2 * kRows + 2 * r, rd16(b));
        if (f.has_min) put16(unit + kHeadLegacyM + gi0 * 2 * kRows + 2 * r, rd16(b + 2));
      } else if (f.scales == PanelScales::KQuant) {
        put16(unit + kHeadD + 2 * r, rd16(b));
        put16(unit + kHeadM + 2 * r, rd16(b + 2));
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, mn;
          get_scale_min_k4(j, b + 4, &sc, &mn);
          unit[kHeadKSc + j * kRows + r] = sc;
          unit[kHeadKMn + j * kRows + r] = mn;
        }
      } else {
        put16(unit + kHeadD + 2 * r, rd16(b + offsetof(BlockQ6_K, d)));
        for (int i = 0; i < 16; ++i) {
          unit[kHeadQ6Sc + (i / 2 * kRows + r) * 2 + i % 2] = b[offsetof(BlockQ6_K, scales) + i];
        }
      }
      for (int64_t g = 0; g < block / kGroup; ++g) {
        uint8_t u_vals[kGroup];
        for (int k = 0; k < kGroup; ++k) {
          u_vals[k] = static_cast<uint8_t>(wv[g * kGroup + k] + f.bias);
        }
        put_group(f, unit + f.head_bytes + static_cast<size_t>(gi0 + g) * f.group_bytes, r, u_vals);
      }
    }
  }
}

int panel_weight(const PanelFormat& f, const uint8_t* panel, int r, int64_t k) {
  const int64_t per_unit = f.unit_values / kGroup;
  const int64_t g = k / kGroup;
  const uint8_t* grp = panel + static_cast<size_t>(g / per_unit) * f.unit_bytes + f.head_bytes +
                       static_cast<size_t>(g % per_unit) * f.group_bytes;
  const int kk = static_cast<int>(k % kGroup);
  if (f.values == PanelValues::I8)
    return static_cast<int8_t>(grp[(kk / 4 * kRows + r) * 4 + kk % 4]);
  const int hi = kk >= 16 ? 1 : 0, j = (kk % 16) / 4, t = kk % 4;
  const uint8_t nib = grp[(j * kRows + r) * 4 + t];
  int u = hi ? nib >> 4 : nib & 15;
  if (f.values == PanelValues::U5) u |= ((grp[kHigh + r * 4 + t] >> (j + 4 * hi)) & 1) << 4;
  if (f.values == PanelValues::U6) {
    u |= ((grp[kHigh + (j / 2 * kRows + r) * 4 + t] >> (4 * (j % 2) + 2 * hi)) & 3) << 4;
  }
  return u - f.bias;
}

GroupScales panel_scales(const PanelFormat& f, const uint8_t* panel, int r, int64_t g) {
  const int64_t per_unit = f.unit_values / kGroup;
  const uint8_t* unit = panel + static_cast<size_t>(g / per_unit) * f.unit_bytes;
  const int gi = static_cast<int>(g % per_unit);
  GroupScales s;
  const float d = fp16_to_f32(rd16(unit + kHeadD + 2 * r));
  switch (f.scales) {
    case PanelScales::Legacy:
      s.ws = fp16_to_f32(rd16(unit + kHeadD + gi * 2 * kRows + 2 * r));
      if (f.has_min) s.wm = fp16_to_f32(rd16(unit + kHeadLegacyM + gi * 2 * kRows + 2 * r));
      break;
    case PanelScales::KQuant:  // both products exact in float
      s.ws = d * static_cast<float>(unit[kHeadKSc + gi * kRows + r]);
      s.wm = -(fp16_to_f32(rd16(unit + kHeadM + 2 * r)) *
               static_cast<float>(unit[kHeadKMn + gi * kRows + r]));
      break;
    case PanelScales::Q6K:
      s.ws = d;
      s.sc_a = static_cast<int8_t>(unit[kHeadQ6Sc + (gi * kRows + r) * 2]);
      s.sc_b = static_cast<int8_t>(unit[kHeadQ6Sc + (gi * kRows + r) * 2 + 1]);
      break;
  }
  return s;
}

}  // namespace encore::kernels::mm
