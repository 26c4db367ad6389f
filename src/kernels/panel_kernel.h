// The integer panel kernel, written once over the vector width: V is the
// AVX-512 (16 rows per register), AVX2 or AVX-VNNI (8 rows, half a panel)
// set of integer and float operations. It computes the order of matmul_internal.h
// for the 16 rows of one panel (panel.h) and C activation rows: SIMD lanes
// hold different rows, so each output is one chain over its groups, the
// same on every ISA. Integer sums are exact, so how the 32 products of a
// group are grouped (vpdpbusd's 4, maddubs' 2, int16 sums of maddubs'
// pairs) changes nothing.
//
// Include only from the translation unit of V's ISA (*_avx2.cpp,
// *_avxvnni.cpp, *_avx512.cpp), inside an anonymous namespace (see
// matmul_internal.h).
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/matmul_internal.h"
#include "kernels/panel.h"
#include "kernels/simd_common.h"

namespace encore::kernels::mm::panel_kernel {
namespace {  // one copy per ISA's translation unit (see matmul_internal.h)

constexpr int kRows = kPanelRows;

inline int32_t load32(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// The compile-time constants of panel.h's format of one type.
template <PanelValues kVals, PanelScales kScales, bool kMin>
struct Format {
  static constexpr int64_t kUnit = unit_values_of(kScales);
  static constexpr int64_t kPerUnit = kUnit / 32;
  static constexpr size_t kGroupBytes = group_bytes_of(kVals);
  static constexpr size_t kHead = head_bytes_of(kScales, kMin);
  static constexpr size_t kUnitBytes = kHead + kPerUnit * kGroupBytes;
  static_assert(kUnitBytes % 64 == 0, "units start on cache lines");
  static size_t panel_bytes(int64_t k) {
    const int64_t tail = k % kUnit / 32;  // groups of a last, part-filled unit
    return static_cast<size_t>(k / kUnit) * kUnitBytes +
           (tail > 0 ? kHead + static_cast<size_t>(tail) * kGroupBytes : 0);
  }
};

// How far ahead of the group being multiplied the kernel asks for panel
// bytes (decode streams the panels from memory once; speed only).
// While multiplying a group the kernel asks for the same group of the next
// panel (into L2): with one panel streamed at a time the hardware
// prefetcher alone left the memory bus idle part of the time. Measured with
// bench_matmul m=1 (weights streamed from DRAM), AVX2 kernels: Q4_K and
// Q4_0 +20-40 %, Q6_K +60 %; AVX-512 within the noise. Wider tiles read a
// panel once for up to 8 activation rows (8 streams), so every tile that
// reads a panel first asks: m = 8 (layers), AVX-512, Q4_0 and Q4_K 71-95 ->
// 54-58 ms. The unit heads (scales) are asked for too: without them every
// unit of a streamed panel began with a miss to DRAM (m = 8 layers, AVX-512,
// best of 3 alternated: Q4_K 45.6 -> 43.0 ms, Q4_0 50.6 -> 41.2, Q8_0 36.9
// -> 30.9; 8 streams of 1b Q4_K_M 277 -> 334 tok/s). Speed only.
constexpr int kPrefetchLocality = 2;

// Asks for the n bytes at p of the panel after p's (pbytes further on).
inline void prefetch_next_panel(const uint8_t* p, size_t n, size_t pbytes) {
  for (size_t off = 0; off < n; off += 64) {
    // an address, not a pointer into the array: the last panel's "next" is past its end
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(p) + pbytes + off;
    __builtin_prefetch(reinterpret_cast<const void*>(ahead), 0, kPrefetchLocality);
  }
}

// Rows [h0 * V::kW, (h0 + NH) * V::kW) of one panel (NH registers of V::kW
// rows side by side), activation rows i0 + [0, C): out[c * 16 + r] = y
// (before NaN canonicalisation). `stream`: the panel is being read from
// memory (the first pass over it): ask for the next one meanwhile.
template <class V, PanelValues kVals, PanelScales kScales, bool kMin, int kBias, int C, int NH>
void tile(const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0, int h0, bool stream,
          float* out) {
  using I = typename V::I;
  using F = typename V::F;
  using Fm = Format<kVals, kScales, kMin>;
  constexpr int64_t kPerUnit = Fm::kPerUnit;
  constexpr size_t kGroupBytes = Fm::kGroupBytes, kHead = Fm::kHead, kUnitBytes = Fm::kUnitBytes;
  // The stored values' bias, plus V's own for signed bytes (the kernel may
  // turn them unsigned and subtract 128 per activation).
  constexpr int kTotalBias = kVals == PanelValues::I8 ? V::kI8Bias : kBias;
  const int64_t n_groups = k / 32, n_units = (n_groups + kPerUnit - 1) / kPerUnit;
  const size_t pbytes = Fm::panel_bytes(k);
  size_t hb[NH], row_off[NH];  // each register's first row, and its bytes in a [16][4] chunk
  for (int h = 0; h < NH; ++h) {
    hb[h] = static_cast<size_t>(h0 + h) * V::kW;
    row_off[h] = hb[h] * 4;
  }

  // The tile's rows are one block of interleaved activation rows
  // (matmul_internal.h): row c of group g's entry is at + g * a.block + c.
  static_assert(C <= kActRows);
  const int64_t at = act_at(a, i0, 0);
  const int8_t* const q = a.q + at * 32;  // + (g * a.block + c) * 32
  const float* const da = a.d + at;
  const float* const as = a.asum + at;
  const int32_t* const is = a.isum + at * 2;
  const int32_t* const qs = a.qsum + at;
  F acc[NH][C], accm[NH][C];
  for (int c = 0; c < C; ++c) {
    for (int h = 0; h < NH; ++h) acc[h][c] = accm[h][c] = V::zero();
  }
  const I lo4 = V::set1_epi8(0x0f), bit4 = V::set1_epi8(0x10), bits45 = V::set1_epi8(0x30);
  const bool ask_next = C <= 2 || stream;  // ask for the next panel's bytes meanwhile
  for (int64_t u = 0; u < n_units; ++u) {
    const uint8_t* unit = panel + static_cast<size_t>(u) * kUnitBytes;
    F d[NH], wm_legacy[NH], dmin[NH];
    for (int h = 0; h < NH; ++h) {
      d[h] = wm_legacy[h] = dmin[h] = V::zero();
      if constexpr (kScales != PanelScales::Legacy) d[h] = V::load_f16(unit + 2 * hb[h]);
      if constexpr (kScales == PanelScales::KQuant) {
        dmin[h] = V::load_f16(unit + kHeadM + 2 * hb[h]);
      }
    }
    if (ask_next) prefetch_next_panel(unit, kHead, pbytes);  // its unit head (the scales)
    const int64_t unit_groups = std::min<int64_t>(kPerUnit, n_groups - u * kPerUnit);
    for (int64_t gi = 0; gi < unit_groups; ++gi) {
      const int64_t g = u * kPerUnit + gi;
      const uint8_t* grp = unit + kHead + static_cast<size_t>(gi) * kGroupBytes;
      const int64_t ga = g * a.block;        // this group's d, asum, qsum, isum / 2
      const int8_t* const qg = q + ga * 32;  // [block][32] this group's values
      if (ask_next) prefetch_next_panel(grp, kGroupBytes, pbytes);  // the same group
      // Q6_K where V multiplies the sub-scales as it widens its int16 sums
      // (V::kScaledDot): per register the pairs (sc_a, sc_b) of each row as
      // int16, and each scale twice in a 32-bit lane.
      I sc_pair[NH], sc_a16[NH], sc_b16[NH];
      if constexpr (kScales == PanelScales::Q6K && V::kScaledDot) {
        for (int h = 0; h < NH; ++h) {
          sc_pair[h] = V::s8_pairs(unit + kHeadQ6Sc + (gi * kRows + hb[h]) * 2);
          sc_a16[h] = V::twice_low16(sc_pair[h]);
          sc_b16[h] = V::twice_high16(sc_pair[h]);
        }
      }
      // Q6_K scales each half of a group by its own sub-scale, so its two
      // halves sum apart (unless V scales them as it widens them: then in
      // one register); the other types sum a group in one register (fewer
      // registers: larger tiles), or in two where the tile has too few
      // chains to hide vpdpbusd's latency (decode; AVX2's 4-bit int16 sums
      // take one register either way). Exact either way.
      constexpr bool kHalves = (kScales == PanelScales::Q6K && !V::kScaledDot) || NH * C < 4;
      constexpr bool kI16 = V::kI16Acc && kVals != PanelValues::I8;
      constexpr int kI16Chunks = kVals == PanelValues::U6 ? 2 : 4;
      // Q6_K's sub-scales ride in the madd that widens its int16 sums, so
      // a V scales inside exactly when it sums in int16.
      static_assert(kScales != PanelScales::Q6K || V::kScaledDot == kI16);
      I s_lo[NH][C], s_hi[NH][C];
      for (int h = 0; h < NH; ++h) {
        for (int c = 0; c < C; ++c) s_lo[h][c] = s_hi[h][c] = V::izero();
      }
      // Each partial sum goes through in_register as it is updated: GCC 12
      // otherwise reassociates a group's integer sums and schedules every
      // product first, which spilled half of them to the stack with AVX2's
      // 16 registers. bench_matmul m = 512, 2 threads, AVX2 (best of 3-4
      // alternated): Q8_0 46.9 -> 39.8 ms, Q4_0 38.5 -> 29.2, Q4_K 43.4 ->
      // 30.0, Q5_K 45.8 -> 37.3; AVX-512 and AVX-VNNI within noise. The same
      // operations and the same integers.
      if constexpr (kVals == PanelValues::I8) {
        for (int j = 0; j < 8; j += 2) {
          for (int h = 0; h < NH; ++h) {
            const I w0 = V::load(grp + j * 64 + row_off[h]);
            const I w1 = V::load(grp + (j + 1) * 64 + row_off[h]);
            for (int c = 0; c < C; ++c) {
              I& s1 = kHalves ? s_hi[h][c] : s_lo[h][c];
              s_lo[h][c] =
                  in_register(V::dot_i8(s_lo[h][c], w0, V::bcast(load32(qg + 32 * c + 4 * j))));
              s1 = in_register(V::dot_i8(s1, w1, V::bcast(load32(qg + 32 * c + 4 * j + 4))));
            }
          }
        }
      } else {
        for (int h = 0; h < NH; ++h) {
          I h1 = V::izero(), h2 = V::izero();
          if constexpr (kVals != PanelValues::U4) h1 = V::load(grp + kHigh + row_off[h]);
          if constexpr (kVals == PanelValues::U6) h2 = V::load(grp + kHigh2 + row_off[h]);
          // Where V sums maddubs' pairs in int16 lanes (V::kI16Acc), each lane
          // holds 2 products of u <= 2^bits - 1 and |q| <= 127 (pair <= 3810,
          // 7874, 16002 for 4, 5, 6 bits): a lane takes 16, 8 or 4 products
          // (both halves' chunks for 4 bits, kI16Chunks of one half else)
          // before it is widened to int32 (<= 30480, 31496, 32004 < 2^15).
          I t_lo[C], t_hi[C];
          for (int c = 0; c < C; ++c) t_lo[c] = t_hi[c] = V::izero();
          auto chunk = [&](auto jc) {
            constexpr int j = decltype(jc)::value;
            const I nib = V::load(grp + j * 64 + row_off[h]);
            I lo = V::and_(nib, lo4), hi = V::and_(V::template srli<4>(nib), lo4);
            if constexpr (kVals == PanelValues::U5) {
              // bit j of each H byte is bit 4 of a low value, bit 4 + j of a high one
              lo = V::or_(lo, V::and_(V::template slli<4 - j>(h1), bit4));
              hi = V::or_(hi, V::and_(V::template srli<j>(h1), bit4));
            }
            if constexpr (kVals == PanelValues::U6) {
              // bits 4-5 of the low and high values of chunks 2h and 2h + 1 at
              // bits 0-1, 2-3 and 4-5, 6-7 of each byte of H2[h]
              const I hh = j < 2 ? h1 : h2;
              if constexpr (j % 2 == 0) {
                lo = V::or_(lo, V::and_(V::template slli<4>(hh), bits45));
                hi = V::or_(hi, V::and_(V::template slli<2>(hh), bits45));
              } else {
                lo = V::or_(lo, V::and_(hh, bits45));
                hi = V::or_(hi, V::and_(V::template srli<2>(hh), bits45));
              }
            }
            for (int c = 0; c < C; ++c) {
              const I qlo = V::bcast(load32(qg + 32 * c + 4 * j));
              const I qhi = V::bcast(load32(qg + 32 * c + 16 + 4 * j));
              if constexpr (kI16) {
                I& t1 = kVals == PanelValues::U4 ? t_lo[c] : t_hi[c];
                t_lo[c] = in_register(V::dot16(t_lo[c], lo, qlo));
                t1 = in_register(V::dot16(t1, hi, qhi));
                if constexpr ((j + 1) % kI16Chunks == 0) {  // widen before int16 can overflow
                  if constexpr (kScales == PanelScales::Q6K) {
                    s_lo[h][c] = V::widen_scaled(s_lo[h][c], t_lo[c], sc_a16[h]);
                    // scaled already: both halves sum in one register (one
                    // register fewer per activation row; Q6_K 45.3 -> 41.8 ms
                    // as above; exact)
                    s_lo[h][c] = in_register(V::widen_scaled(s_lo[h][c], t_hi[c], sc_b16[h]));
                  } else {
                    s_lo[h][c] = V::widen(s_lo[h][c], t_lo[c]);
                    if constexpr (kVals != PanelValues::U4) {
                      I& s1 = kHalves ? s_hi[h][c] : s_lo[h][c];
                      s1 = V::widen(s1, t_hi[c]);
                    }
                  }
                  t_lo[c] = t_hi[c] = V::izero();
                }
              } else {
                I& s1 = kHalves ? s_hi[h][c] : s_lo[h][c];
                s_lo[h][c] = in_register(V::dot(s_lo[h][c], lo, qlo));
                s1 = in_register(V::dot(s1, hi, qhi));
              }
            }
          };
          chunk(std::integral_constant<int, 0>{});
          chunk(std::integral_constant<int, 1>{});
          chunk(std::integral_constant<int, 2>{});
          chunk(std::integral_constant<int, 3>{});
        }
      }
      for (int h = 0; h < NH; ++h) {
        // The group's scales for this register's rows.
        F ws = d[h], wm = wm_legacy[h];
        if constexpr (kScales == PanelScales::Legacy) {  // one d (and m) per group
          ws = V::load_f16(unit + gi * 2 * kRows + 2 * hb[h]);
          if constexpr (kMin) wm = V::load_f16(unit + kHeadLegacyM + gi * 2 * kRows + 2 * hb[h]);
        }
        I sc_a = V::izero(), sc_b = V::izero();
        if constexpr (kScales == PanelScales::KQuant) {
          ws = V::mul(d[h], V::u8_to_f(unit + kHeadKSc + gi * kRows + hb[h]));  // exact
          wm = V::neg(V::mul(dmin[h], V::u8_to_f(unit + kHeadKMn + gi * kRows + hb[h])));
        }
        if constexpr (kScales == PanelScales::Q6K && !V::kScaledDot) {
          const I pairs = V::s8_pairs(unit + kHeadQ6Sc + (gi * kRows + hb[h]) * 2);
          sc_a = V::low16(pairs);
          sc_b = V::high16(pairs);
        }
        for (int c = 0; c < C; ++c) {
          // Q6_K's halves (the other types' offset takes qsum below)
          const int32_t i_lo = is[2 * (ga + c)], i_hi = is[2 * (ga + c) + 1];
          I s;
          if constexpr (kScales == PanelScales::Q6K && V::kScaledDot) {
            // the sums are already scaled: subtract 32 * (sc_a i_lo + sc_b i_hi),
            // |i| <= 16 * 127 fits an int16
            const int32_t ipair =
                (i_lo & 0xffff) | static_cast<int32_t>(static_cast<uint32_t>(i_hi) << 16);
            s = V::sub(s_lo[h][c], V::template slli<5>(V::madd16(sc_pair[h], V::bcast(ipair))));
          } else if constexpr (kScales == PanelScales::Q6K) {
            s = V::add(V::mullo(sc_a, V::sub(s_lo[h][c], V::bcast(kTotalBias * i_lo))),
                       V::mullo(sc_b, V::sub(s_hi[h][c], V::bcast(kTotalBias * i_hi))));
          } else {
            s = kHalves ? V::add(s_lo[h][c], s_hi[h][c]) : s_lo[h][c];
            if constexpr (kTotalBias != 0) {
              // offset * qsum: a broadcast load and a shift (kept apart by
              // in_register: GCC would shift and add in scalar registers)
              static_assert((kTotalBias & (kTotalBias - 1)) == 0, "a power of two");
              constexpr int kShift = __builtin_ctz(kTotalBias);
              s = V::sub(s, V::template slli<kShift>(in_register(V::bcast(qs[ga + c]))));
            }
          }
          acc[h][c] = V::fma(V::cvt(s), V::mul(ws, V::set1(da[ga + c])), acc[h][c]);
          if constexpr (kMin) accm[h][c] = V::fma(wm, V::set1(as[ga + c]), accm[h][c]);
        }
      }
    }
  }
  for (int h = 0; h < NH; ++h) {
    for (int c = 0; c < C; ++c) {
      V::store(out + c * kRows + hb[h], kMin ? V::add(acc[h][c], accm[h][c]) : acc[h][c]);
    }
  }
}

// The whole panel: with one activation row, every register of rows side by
// side (the panel is then read once); else one register's rows at a time
// over tiles of up to kMaxC activation rows (below).
template <class V, PanelValues kVals, PanelScales kScales, bool kMin, int kBias>
void tiles(const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0, int C, float* out) {
  constexpr int kRegs = kRows / V::kW;
  assert(i0 % a.block + C <= a.block);  // one block of rows (matmul_internal.h)
  constexpr int kMaxC = V::kMaxC;
  static_assert(kMaxC <= kMaxTileC);
  if (C == 1) {
    tile<V, kVals, kScales, kMin, kBias, 1, kRegs>(panel, k, a, i0, 0, true, out);
    return;
  }
  using Fn = void (*)(const uint8_t*, int64_t, const ActRows&, int64_t, int, bool, float*);
  static constexpr auto kTable = []<int... Cs>(std::integer_sequence<int, Cs...>) {
    return std::array<Fn, sizeof...(Cs)>{&tile<V, kVals, kScales, kMin, kBias, Cs + 1, 1>...};
  }
  (std::make_integer_sequence<int, kMaxC>{});
  for (int h = 0; h < kRegs; ++h) {
    for (int c0 = 0; c0 < C; c0 += kMaxC) {
      const int n = C - c0 >= kMaxC ? kMaxC : C - c0;
      // The call's first tile over this panel reads it from memory (a batch of
      // decode steps: the only one; prefill: the first activation rows).
      const bool first = i0 == 0 && h == 0 && c0 == 0;
      kTable[n - 1](panel, k, a, i0 + c0, h, first, out + c0 * kRows);
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
