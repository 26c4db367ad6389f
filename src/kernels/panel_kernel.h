// The integer panel kernel, written once over the vector width: V is the
// AVX-512 (16 rows per register) or AVX2 (8 rows, half a panel) set of
// integer and float operations. It computes the order of matmul_internal.h
// for the 16 rows of one panel (panel.h) and C activation rows: SIMD lanes
// hold different rows, so each output is one chain over its groups, the
// same on every ISA. Integer sums are exact, so how the 32 products of a
// group are grouped (vpdpbusd's 4, maddubs' 2) changes nothing.
//
// Include only from the translation unit of V's ISA (*_avx2.cpp,
// *_avx512.cpp), inside an anonymous namespace (see matmul_internal.h).
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/matmul_internal.h"
#include "kernels/panel.h"

namespace encore::kernels::mm::panel_kernel {
namespace {  // one copy per ISA's translation unit (see matmul_internal.h)

constexpr int kRows = kPanelRows;

// Byte offsets of panel.h's layout (checked against panel.cpp by
// PanelLayout tests through the scalar twin).
constexpr size_t kHeadM = 2 * kRows, kHeadKSc = 4 * kRows, kHeadKMn = 12 * kRows;
constexpr size_t kHeadQ6Sc = 2 * kRows, kHigh = 16 * kRows, kHigh2 = 20 * kRows;

inline int32_t load32(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// Rows [half * V::kW, (half + 1) * V::kW) of one panel, activation rows i0 +
// [0, C): out[c * 16 + r] = y (before NaN canonicalisation).
template <class V, PanelValues kVals, PanelScales kScales, bool kMin, int kBias, int C>
void tile(const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0, int half, float* out) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int64_t kUnit = kScales == PanelScales::Legacy ? 32 : 256;
  constexpr int64_t kPerUnit = kUnit / 32;
  constexpr size_t kGroupBytes = kVals == PanelValues::I8   ? 32 * kRows
                                 : kVals == PanelValues::U4 ? 16 * kRows
                                 : kVals == PanelValues::U5 ? 20 * kRows
                                                            : 24 * kRows;
  constexpr size_t kHead = kScales == PanelScales::Legacy   ? (kMin ? 4 : 2) * kRows
                           : kScales == PanelScales::KQuant ? 20 * kRows
                                                            : 18 * kRows;
  constexpr size_t kUnitBytes = kHead + kPerUnit * kGroupBytes;
  // The stored values' bias, plus V's own for signed bytes (the kernel may
  // turn them unsigned and subtract 128 per activation).
  constexpr int kTotalBias = kVals == PanelValues::I8 ? V::kI8Bias : kBias;
  const size_t hb = static_cast<size_t>(half) * V::kW;  // this half's first row
  const size_t row_off = hb * 4;                        // ... its bytes in a [16][4] chunk

  const int64_t ag = a.kp / 32;
  const int8_t* q[C];
  const float* da[C];
  const float* as[C];
  const int32_t* is[C];
  F acc[C], accm[C];
  for (int c = 0; c < C; ++c) {
    q[c] = a.q + (i0 + c) * a.kp;
    da[c] = a.d + (i0 + c) * ag;
    as[c] = a.asum + (i0 + c) * ag;
    is[c] = a.isum + (i0 + c) * (a.kp / 16);
    acc[c] = V::fzero();
    accm[c] = V::fzero();
  }
  const I lo4 = V::set1_epi8(0x0f), bit4 = V::set1_epi8(0x10), bit5 = V::set1_epi8(0x20);
  const int64_t n_units = k / kUnit;
  for (int64_t u = 0; u < n_units; ++u) {
    const uint8_t* unit = panel + static_cast<size_t>(u) * kUnitBytes;
    F d = V::f16(unit + 2 * hb), wm_legacy = V::fzero(), dmin = V::fzero();
    if constexpr (kScales == PanelScales::Legacy && kMin)
      wm_legacy = V::f16(unit + kHeadM + 2 * hb);
    if constexpr (kScales == PanelScales::KQuant) dmin = V::f16(unit + kHeadM + 2 * hb);
    for (int64_t gi = 0; gi < kPerUnit; ++gi) {
      const int64_t g = u * kPerUnit + gi;
      const uint8_t* grp = unit + kHead + static_cast<size_t>(gi) * kGroupBytes;
      I s_lo[C], s_hi[C];
      for (int c = 0; c < C; ++c) s_lo[c] = s_hi[c] = V::izero();
      if constexpr (kVals == PanelValues::I8) {
        for (int j = 0; j < 8; j += 2) {
          const I w0 = V::load(grp + j * 64 + row_off), w1 = V::load(grp + (j + 1) * 64 + row_off);
          for (int c = 0; c < C; ++c) {
            s_lo[c] = V::dot_i8(s_lo[c], w0, V::bcast(load32(q[c] + 32 * g + 4 * j)));
            s_hi[c] = V::dot_i8(s_hi[c], w1, V::bcast(load32(q[c] + 32 * g + 4 * j + 4)));
          }
        }
      } else {
        I h1 = V::izero(), h2 = V::izero();
        if constexpr (kVals != PanelValues::U4) h1 = V::load(grp + kHigh + row_off);
        if constexpr (kVals == PanelValues::U6) h2 = V::load(grp + kHigh2 + row_off);
        auto chunk = [&](auto jc) {
          constexpr int j = decltype(jc)::value;
          const I nib = V::load(grp + j * 64 + row_off);
          I lo = V::and_(nib, lo4), hi = V::and_(V::template srli<4>(nib), lo4);
          if constexpr (kVals != PanelValues::U4) {
            // bit j of each H byte is bit 4 of a low value, bit 4 + j of a high one
            lo = V::or_(lo, V::and_(V::template slli<4 - j>(h1), bit4));
            hi = V::or_(hi, V::and_(V::template srli<j>(h1), bit4));
          }
          if constexpr (kVals == PanelValues::U6) {
            lo = V::or_(lo, V::and_(V::template slli<5 - j>(h2), bit5));
            if constexpr (j == 0) {
              hi = V::or_(hi, V::and_(V::template slli<1>(h2), bit5));
            } else {
              hi = V::or_(hi, V::and_(V::template srli<j - 1>(h2), bit5));
            }
          }
          for (int c = 0; c < C; ++c) {
            s_lo[c] = V::dot(s_lo[c], lo, V::bcast(load32(q[c] + 32 * g + 4 * j)));
            s_hi[c] = V::dot(s_hi[c], hi, V::bcast(load32(q[c] + 32 * g + 16 + 4 * j)));
          }
        };
        chunk(std::integral_constant<int, 0>{});
        chunk(std::integral_constant<int, 1>{});
        chunk(std::integral_constant<int, 2>{});
        chunk(std::integral_constant<int, 3>{});
      }
      // The group's scales for this half's rows.
      F ws = d, wm = wm_legacy;
      I sc_a = V::izero(), sc_b = V::izero();
      if constexpr (kScales == PanelScales::KQuant) {
        ws = V::mul(d, V::u8_to_f(unit + kHeadKSc + gi * kRows + hb));  // exact
        wm = V::neg(V::mul(dmin, V::u8_to_f(unit + kHeadKMn + gi * kRows + hb)));
      }
      if constexpr (kScales == PanelScales::Q6K) {
        sc_a = V::s8_to_i(unit + kHeadQ6Sc + 2 * gi * kRows + hb);
        sc_b = V::s8_to_i(unit + kHeadQ6Sc + (2 * gi + 1) * kRows + hb);
      }
      for (int c = 0; c < C; ++c) {
        const int32_t i_lo = is[c][2 * g], i_hi = is[c][2 * g + 1];
        I s;
        if constexpr (kScales == PanelScales::Q6K) {
          s = V::add(V::mullo(sc_a, V::sub(s_lo[c], V::bcast(kTotalBias * i_lo))),
                     V::mullo(sc_b, V::sub(s_hi[c], V::bcast(kTotalBias * i_hi))));
        } else {
          s = V::add(s_lo[c], s_hi[c]);
          if constexpr (kTotalBias != 0) s = V::sub(s, V::bcast(kTotalBias * (i_lo + i_hi)));
        }
        acc[c] = V::fma(V::cvt(s), V::mul(ws, V::fset1(da[c][g])), acc[c]);
        if constexpr (kMin) accm[c] = V::fma(wm, V::fset1(as[c][g]), accm[c]);
      }
    }
  }
  for (int c = 0; c < C; ++c)
    V::fstore(out + c * kRows + hb, kMin ? V::fadd(acc[c], accm[c]) : acc[c]);
}

template <class V, PanelValues kVals, PanelScales kScales, bool kMin, int kBias>
void tiles(const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0, int C, float* out) {
  for (int half = 0; half < kRows / V::kW; ++half) {
    for (int c0 = 0; c0 < C; c0 += V::kMaxC) {
      float* o = out + c0 * kRows;
      switch (C - c0 >= V::kMaxC ? V::kMaxC : C - c0) {
        case 1:
          tile<V, kVals, kScales, kMin, kBias, 1>(panel, k, a, i0 + c0, half, o);
          break;
        case 2:
          tile<V, kVals, kScales, kMin, kBias, 2>(panel, k, a, i0 + c0, half, o);
          break;
        case 3:
          if constexpr (V::kMaxC >= 3)
            tile<V, kVals, kScales, kMin, kBias, 3>(panel, k, a, i0 + c0, half, o);
          break;
        default:
          if constexpr (V::kMaxC >= 4)
            tile<V, kVals, kScales, kMin, kBias, 4>(panel, k, a, i0 + c0, half, o);
          break;
      }
    }
  }
}

// IsaKernels::panel_tile for V.
template <class V>
void panel_tile(DType t, const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0, int C,
                float* out) {
  using PV = PanelValues;
  using PS = PanelScales;
  switch (t) {
    case DType::Q8_0:
      return tiles<V, PV::I8, PS::Legacy, false, 0>(panel, k, a, i0, C, out);
    case DType::Q4_0:
      return tiles<V, PV::U4, PS::Legacy, false, 8>(panel, k, a, i0, C, out);
    case DType::Q4_1:
      return tiles<V, PV::U4, PS::Legacy, true, 0>(panel, k, a, i0, C, out);
    case DType::Q5_0:
      return tiles<V, PV::U5, PS::Legacy, false, 16>(panel, k, a, i0, C, out);
    case DType::Q5_1:
      return tiles<V, PV::U5, PS::Legacy, true, 0>(panel, k, a, i0, C, out);
    case DType::Q4_K:
      return tiles<V, PV::U4, PS::KQuant, true, 0>(panel, k, a, i0, C, out);
    case DType::Q5_K:
      return tiles<V, PV::U5, PS::KQuant, true, 0>(panel, k, a, i0, C, out);
    case DType::Q6_K:
      return tiles<V, PV::U6, PS::Q6K, false, 32>(panel, k, a, i0, C, out);
    default:
      return;  // not an integer type: the driver never asks
  }
}

}  // namespace
}  // namespace encore::kernels::mm::panel_kernel
