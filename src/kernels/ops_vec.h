// Internal: the SIMD element-wise and attention kernels of ops_simd.h,
// written once over a float vector V of kW lanes (vec_avx2.h: 8,
// vec_avx512.h: 16) and instantiated by ops_avx2.cpp and ops_avx512.cpp.
//
// Each kernel performs its scalar twin's operations (ops.cpp,
// ops_attention.cpp, ops_math.h) lane by lane in the same order, so both
// instantiations match the scalar code bit for bit:
// - a canonical dot product or lane sum keeps its 16 lanes in kH = 16 / kW
//   registers (one zmm, or lanes 0-7 and 8-15 in two ymm);
// - a tail loads only lanes [0, n) (the rest read as +0) and takes the new
//   value only in those lanes (V::keep_n), so an accumulator lane the scalar
//   loop never touches keeps its exact bits (an fma with +0 would turn -0
//   into +0).
// Include only from a translation unit compiled for V's ISA.
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "kernels/canonical.h"
#include "kernels/ops_math.h"
#include "kernels/ops_simd.h"

namespace encore::kernels {
namespace {

template <class V>
struct OpsVec {
  using F = typename V::F;
  using M = typename V::M;  // lane mask of a tail
  static constexpr int kW = V::kW;
  static constexpr int kH = kDotLanes / kW;  // registers per 16 canonical lanes
  static_assert(kH * kW == kDotLanes);

  // exp_f32_ref (ops_math.h), operation for operation.
  static F exp(F x) {
    using namespace expf_const;
    // max(a, b) = a > b ? a : b and min likewise: NaN lanes clamp to kMin.
    F xc = V::min(V::max(x, V::set1(kMin)), V::set1(kMax));
    const F shifter = V::set1(kShifter);
    const F n = V::sub(V::fma(xc, V::set1(kLog2e), shifter), shifter);
    F r = V::fnma(n, V::set1(kLn2Hi), xc);  // fma(-n, hi, xc)
    r = V::fnma(n, V::set1(kLn2Lo), r);
    F p = V::set1(kC7);
    for (const float c : {kC6, kC5, kC4, kC3, kC2, 1.0f, 1.0f}) p = V::fma(p, r, V::set1(c));
    return V::nan_to(x, V::scale_pow2(p, n));
  }

  // silu_ref: x / (1 + exp(-x)), -x a sign flip like the scalar negation.
  static F silu(F x) { return V::div(x, V::add(V::set1(1.0f), exp(V::neg(x)))); }

  static float reduce(const F* acc) {  // reduce16 of the 16 lanes in acc[0, kH)
    float lanes[kDotLanes];
    for (int h = 0; h < kH; ++h) V::lanes(acc[h], lanes + h * kW);
    return reduce16(lanes);
  }

  // ---- element-wise ---------------------------------------------------------

  static void exp_n(const float* x, float* y, int64_t n) {
    int64_t i = 0;
    for (; i + kW <= n; i += kW) V::store(y + i, exp(V::load(x + i)));
    if (i < n) {
      const M m = V::mask(n - i);
      V::store_n(y + i, exp(V::load_n(x + i, m)), m);
    }
  }

  static void swiglu(float* out, const float* gate, const float* up, int64_t n) {
    int64_t i = 0;
    for (; i + kW <= n; i += kW) {
      V::store(out + i, V::mul(silu(V::load(gate + i)), V::load(up + i)));
    }
    if (i < n) {
      const M m = V::mask(n - i);
      V::store_n(out + i, V::mul(silu(V::load_n(gate + i, m)), V::load_n(up + i, m)), m);
    }
  }

  static void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps) {
    F acc[kH];
    for (F& a : acc) a = V::zero();
    int64_t i = 0;
    for (; i + kDotLanes <= n; i += kDotLanes) {
#pragma GCC unroll 2
      for (int h = 0; h < kH; ++h) {
        const F v = V::load(x + i + h * kW);
        acc[h] = V::fma(v, v, acc[h]);
      }
    }
    for (int h = 0; h < kH && i + h * kW < n; ++h) {
      const M m = V::mask(n - i - h * kW);
      const F v = V::load_n(x + i + h * kW, m);
      acc[h] = V::keep_n(V::fma(v, v, acc[h]), acc[h], m);
    }
    const float mean = reduce(acc) / static_cast<float>(n);
    const F scale = V::set1(1.0f / std::sqrt(mean + eps));
    for (i = 0; i + kW <= n; i += kW) {
      V::store(out + i, V::mul(V::mul(V::load(x + i), scale), V::load(w + i)));
    }
    if (i < n) {
      const M m = V::mask(n - i);
      V::store_n(out + i, V::mul(V::mul(V::load_n(x + i, m), scale), V::load_n(w + i, m)), m);
    }
  }

  // ---- attention building blocks (AttnKernels) ------------------------------

  static void widen_f16(const uint8_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + kW <= n; i += kW) V::store(dst + i, V::load_f16(src + 2 * i));
    if (i < n) {  // the last halves through a zeroed copy: no read past src's end
      uint8_t tail[2 * kW] = {};
      std::memcpy(tail, src + 2 * i, static_cast<size_t>(2 * (n - i)));
      V::store_n(dst + i, V::load_f16(tail), V::mask(n - i));
    }
  }

  // kScoreRows rows (fewer at the end: missing rows repeat the last one and
  // are not stored) against one query head.
  static void scores_tile(const float* qh, int head_dim, const float* const* rp, float scale,
                          float* s, int nr) {
    constexpr int R = V::kScoreRows;
    F acc[R][kH];
#pragma GCC unroll 16
    for (int k = 0; k < R; ++k) {
      for (int h = 0; h < kH; ++h) acc[k][h] = V::zero();
    }
    int c = 0;
    for (; c + kDotLanes <= head_dim; c += kDotLanes) {
#pragma GCC unroll 2
      for (int h = 0; h < kH; ++h) {
        const F q = V::load(qh + c + h * kW);
#pragma GCC unroll 16
        for (int k = 0; k < R; ++k) acc[k][h] = V::fma(q, V::load(rp[k] + c + h * kW), acc[k][h]);
      }
    }
    for (int h = 0; h < kH && c + h * kW < head_dim; ++h) {
      const M m = V::mask(head_dim - c - h * kW);
      const F q = V::load_n(qh + c + h * kW, m);
#pragma GCC unroll 16
      for (int k = 0; k < R; ++k) {
        const F f = V::fma(q, V::load_n(rp[k] + c + h * kW, m), acc[k][h]);
        acc[k][h] = V::keep_n(f, acc[k][h], m);
      }
    }
    V::reduce16_rows(acc, scale, s, nr);
  }

  static void scores(const float* q, int n_heads, int head_dim, const float* const* rows,
                     int n_rows, float scale, float* s, int64_t s_stride) {
    constexpr int R = V::kScoreRows;
    for (int r0 = 0; r0 < n_rows; r0 += R) {
      const int nr = n_rows - r0 < R ? n_rows - r0 : R;
      const float* rp[R];
      for (int k = 0; k < R; ++k) rp[k] = rows[r0 + (k < nr ? k : nr - 1)];
      for (int h = 0; h < n_heads; ++h) {
        scores_tile(q + static_cast<int64_t>(h) * head_dim, head_dim, rp, scale,
                    s + h * s_stride + r0, nr);
      }
    }
  }

  static float max(const float* s, int64_t n) {
    F m = V::set1(-INFINITY);
    int64_t j = 0;
    for (; j + kW <= n; j += kW) m = V::max(V::load(s + j), m);  // NaN s: keep m
    if (j < n) {
      const M t = V::mask(n - j);
      m = V::keep_n(V::max(V::load_n(s + j, t), m), m, t);
    }
    float lanes[kW];
    V::lanes(m, lanes);
    float r = -INFINITY;
    for (const float v : lanes) r = v > r ? v : r;
    return r;
  }

  static float exp_sum(float* s, int64_t n, float m) {
    const F mv = V::set1(m);
    F acc[kH];
    for (F& a : acc) a = V::zero();
    int64_t j = 0;
    for (; j + kDotLanes <= n; j += kDotLanes) {
#pragma GCC unroll 2
      for (int h = 0; h < kH; ++h) {
        const F p = exp(V::sub(V::load(s + j + h * kW), mv));
        V::store(s + j + h * kW, p);
        acc[h] = V::add(acc[h], p);
      }
    }
    for (int h = 0; h < kH && j + h * kW < n; ++h) {
      const M t = V::mask(n - j - h * kW);
      const F p = exp(V::sub(V::load_n(s + j + h * kW, t), mv));
      V::store_n(s + j + h * kW, p, t);
      acc[h] = V::keep_n(V::add(acc[h], p), acc[h], t);
    }
    return reduce(acc);
  }

  // One head, dims [d0, d0 + kW * NV) of o (the last register only the lanes
  // of `last`), accumulated over all rows in order.
  template <int NV>
  static void accumulate_tile(const float* ph, const float* const* rows, int n_rows, int d0, M last,
                              float* oh) {
    F acc[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV - 1; ++v) acc[v] = V::load(oh + d0 + kW * v);
    acc[NV - 1] = V::load_n(oh + d0 + kW * (NV - 1), last);
    for (int r = 0; r < n_rows; ++r) {
      const F p = V::set1(ph[r]);
      const float* row = rows[r] + d0;
#pragma GCC unroll 8
      for (int v = 0; v < NV - 1; ++v) acc[v] = V::fma(p, V::load(row + kW * v), acc[v]);
      acc[NV - 1] = V::fma(p, V::load_n(row + kW * (NV - 1), last), acc[NV - 1]);
    }
#pragma GCC unroll 8
    for (int v = 0; v < NV - 1; ++v) V::store(oh + d0 + kW * v, acc[v]);
    V::store_n(oh + d0 + kW * (NV - 1), acc[NV - 1], last);
  }

  static void accumulate(const float* p, int n_heads, int64_t p_stride, const float* const* rows,
                         int n_rows, int head_dim, float* o) {
    constexpr int kTile = 8 * kW;  // 8 registers: 8 independent FMA chains per row
    using Tile = void (*)(const float*, const float* const*, int, int, M, float*);
    static constexpr Tile kTiles[8] = {accumulate_tile<1>, accumulate_tile<2>, accumulate_tile<3>,
                                       accumulate_tile<4>, accumulate_tile<5>, accumulate_tile<6>,
                                       accumulate_tile<7>, accumulate_tile<8>};
    for (int h = 0; h < n_heads; ++h) {
      const float* ph = p + h * p_stride;
      float* oh = o + static_cast<int64_t>(h) * head_dim;
      for (int d0 = 0; d0 < head_dim; d0 += kTile) {
        const int nd = head_dim - d0 < kTile ? head_dim - d0 : kTile;
        const int nv = (nd + kW - 1) / kW;
        kTiles[nv - 1](ph, rows, n_rows, d0, V::mask(nd - kW * (nv - 1)), oh);
      }
    }
  }

  static constexpr AttnKernels attn_kernels() {
    return {widen_f16, scores, max, exp_sum, accumulate};
  }
};

}  // namespace
}  // namespace encore::kernels
