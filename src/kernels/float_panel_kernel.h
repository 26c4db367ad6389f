// The float panel kernel, written once over the vector width: V is the
// AVX-512 (16 rows per register: one panel) or AVX2 (8 rows: half a panel)
// float vector (vec_avx512.h, vec_avx2.h). It computes dot_canonical
// (canonical.h) for the rows of float panels (float_panel.h) and
// chain-ordered activation rows with SIMD lanes across rows: each chain is
// one vertical fma chain per register, and the fold tree adds whole
// registers of chains, so the bits equal the scalar twin's on every ISA.
//
// Include only from the translation unit of V's ISA (*_avx2.cpp,
// *_avx512.cpp); its definitions sit in an anonymous namespace (see
// matmul_internal.h).
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <immintrin.h>

#include "kernels/float_panel.h"
#include "kernels/matmul_internal.h"

namespace encore::kernels::mm::float_panel_kernel {
namespace {  // one copy per ISA's translation unit (see matmul_internal.h)

// Each stream of panel bytes is asked for this far ahead of the position
// being multiplied: decode streams the panels from memory once, a few
// panels side by side, and the hardware prefetcher alone left the bus idle
// part of the time. bench_matmul F16 (2 threads, AVX-512 / AVX2 kernels):
// m = 1 layers 45 -> 49-52 / 37 -> 44-47 GB/s, m = 8 45-47 -> 32-33 / 92-99
// -> 60-65 ms, m = 512 gate1 28.5-28.8 -> 26.7-27.4 / 52 -> 49-50 ms
// (512 bytes: no gain; 8192: no better). Speed only.
constexpr size_t kPrefetch = 4096;

// V::kW stored values of one position (rows side by side), widened exactly.
template <class V, DType kElem>
struct Elem {
  static constexpr size_t kBytes = float_elem_bytes(kElem);
  static typename V::F load(const uint8_t* p) {
    if constexpr (kElem == DType::F32) {
      return V::load(reinterpret_cast<const float*>(p));
    } else if constexpr (kElem == DType::F16) {
      return V::load_f16(p);
    } else {
      return V::load_bf16(p);
    }
  }
};

// Registers [g0, g0 + NR) of a block of panels (register g = rows
// [g kW, g kW + kW) of the block; panels pbytes apart) times activation
// rows [0, C) at x (chain-ordered and interleaved, float_panel.h: row c's
// position s at x[s * kActGroup + c], all C rows in one group):
// out[c * ld + g * kW + l] for g in the tile, before NaN canonicalisation.
template <class V, DType kElem, int NR, int C>
void tile(const uint8_t* panels, size_t pbytes, int g0, int64_t k, const float* xp, float* out,
          int64_t ld) {
  using F = typename V::F;
  using E = Elem<V, kElem>;
  constexpr int kPerPanel = kChains / V::kW;
  constexpr size_t kPos = kChains * E::kBytes;  // bytes of one position of a panel
  const uint8_t* base[NR];
  for (int h = 0; h < NR; ++h) {
    const int g = g0 + h;
    base[h] = panels + static_cast<size_t>(g / kPerPanel) * pbytes +
              static_cast<size_t>(g % kPerPanel) * V::kW * E::kBytes;
  }
  // Each chain's registers, stored when the chain ends and folded at the
  // end; the chains' loop keeps only NR x C accumulators live.
  alignas(64) float chains[kChains][NR][C][V::kW];
  for (int j = 0; j < kChains; ++j) {
    const int64_t s = chain_start(k, j), n = chain_length(k, j);
    F acc[NR][C];
    for (int h = 0; h < NR; ++h)
      for (int c = 0; c < C; ++c) acc[h][c] = V::zero();
    const uint8_t* w[NR];
    for (int h = 0; h < NR; ++h) w[h] = base[h] + static_cast<size_t>(s) * kPos;
    const float* x = xp + s * kActGroup;
    for (int64_t t = 0; t < n; ++t) {
      F wv[NR];
      for (int h = 0; h < NR; ++h) {
        const uint8_t* p = w[h] + static_cast<size_t>(t) * kPos;
        // an address, not a pointer: the last panel's "ahead" is past its end
        const uintptr_t ahead = reinterpret_cast<uintptr_t>(p) + kPrefetch;
        _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
        wv[h] = E::load(p);
      }
      for (int c = 0; c < C; ++c) {
        const F b = V::set1(x[t * kActGroup + c]);
        for (int h = 0; h < NR; ++h) acc[h][c] = V::fma(wv[h], b, acc[h][c]);
      }
    }
    for (int h = 0; h < NR; ++h)
      for (int c = 0; c < C; ++c) V::store(chains[j][h][c], acc[h][c]);
  }
  // reduce16 (canonical.h), one register of rows at a time.
  for (int h = 0; h < NR; ++h) {
    for (int c = 0; c < C; ++c) {
      F s8[8], s4[4];
      for (int l = 0; l < 8; ++l)
        s8[l] = V::add(V::load(chains[l][h][c]), V::load(chains[l + 8][h][c]));
      for (int l = 0; l < 4; ++l) s4[l] = V::add(s8[l], s8[l + 4]);
      const F r = V::add(V::add(s4[0], s4[2]), V::add(s4[1], s4[3]));
      V::store(out + c * ld + static_cast<int64_t>(g0 + h) * V::kW, r);
    }
  }
}

using TileFn = void (*)(const uint8_t*, size_t, int, int64_t, const float*, float*, int64_t);

// The tiles that fit V's accumulator budget (null for the others, which are
// not even compiled).
template <class V, DType kElem, int NR, int C>
constexpr TileFn tile_or_null() {
  if constexpr (NR * C <= V::kFloatAcc) {
    return &tile<V, kElem, NR, C>;
  } else {
    return nullptr;
  }
}

template <class V, DType kElem, int NR, int... Cs>
constexpr std::array<TileFn, sizeof...(Cs)> row_of(std::integer_sequence<int, Cs...>) {
  return {tile_or_null<V, kElem, NR, Cs + 1>()...};
}

// [NR - 1][C - 1] for NR in [1, V::kFloatNR], C in [1, V::kFloatCMax].
template <class V, DType kElem, int... NRs>
constexpr auto table_of(std::integer_sequence<int, NRs...>) {
  return std::array{row_of<V, kElem, NRs + 1>(std::make_integer_sequence<int, V::kFloatCMax>{})...};
}

// Registers per tile for C activation rows: as many as the accumulator
// budget holds (decode-sized batches stream several panels at once, so
// several independent chains hide the fma latency), at most V::kFloatNR.
template <class V>
constexpr int regs_for(int C) {
  const int n = V::kFloatAcc / C;
  return n < V::kFloatNR ? n : V::kFloatNR;
}

template <class V, DType kElem>
void block(const uint8_t* panels, size_t pbytes, int64_t np, int64_t k, const float* xp, int64_t xs,
           int64_t m, float* out) {
  static_assert(kActGroup % V::kFloatC == 0 && V::kFloatCMax <= kActGroup,
                "every tile of activation rows lies within one interleaved group");
  static constexpr auto kTable = table_of<V, kElem>(std::make_integer_sequence<int, V::kFloatNR>{});
  const int n_regs = static_cast<int>(np) * (kChains / V::kW);
  const int64_t ld = np * kChains;
  // A decode-sized batch in one tile where the budget holds it (one pass
  // over the weights), else tiles of kFloatC rows.
  const int64_t step = m <= V::kFloatCMax ? m : V::kFloatC;
  for (int64_t c0 = 0; c0 < m; c0 += step) {
    const int C = static_cast<int>(m - c0 < step ? m - c0 : step);
    const int nr = regs_for<V>(C);
    for (int g = 0; g < n_regs; g += nr) {
      const int NR = n_regs - g < nr ? n_regs - g : nr;
      const float* x = xp + c0 / kActGroup * xs + c0 % kActGroup;
      kTable[NR - 1][C - 1](panels, pbytes, g, k, x, out + c0 * ld, ld);
    }
  }
}

// IsaKernels::float_panels for V.
template <class V>
void float_panels(DType elem, const uint8_t* panels, size_t pbytes, int64_t np, int64_t k,
                  const float* xp, int64_t xs, int64_t m, float* out) {
  switch (elem) {
    case DType::F16:
      return block<V, DType::F16>(panels, pbytes, np, k, xp, xs, m, out);
    case DType::BF16:
      return block<V, DType::BF16>(panels, pbytes, np, k, xp, xs, m, out);
    default:
      return block<V, DType::F32>(panels, pbytes, np, k, xp, xs, m, out);
  }
}

}  // namespace
}  // namespace encore::kernels::mm::float_panel_kernel
