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

#include <array>
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

  // R rows (fewer at the end: missing rows repeat the last one and are not
  // stored) against NH query heads (head h at qh + h * head_dim, its scores
  // at s + h * s_stride), R * NH = V::kScoreRows accumulators: the heads
  // share each row's loads.
  template <int R, int NH>
  static void scores_tile(const float* qh, int head_dim, const float* const* rp, float scale,
                          float* s, int64_t s_stride, int nr) {
    static_assert(R * NH == V::kScoreRows);
    F acc[V::kScoreRows][kH];  // [k * NH + h]: row k, head h
#pragma GCC unroll 16
    for (int a = 0; a < V::kScoreRows; ++a) {
      for (int h = 0; h < kH; ++h) acc[a][h] = V::zero();
    }
    int c = 0;
    for (; c + kDotLanes <= head_dim; c += kDotLanes) {
#pragma GCC unroll 2
      for (int l = 0; l < kH; ++l) {
        F q[NH];
#pragma GCC unroll 4
        for (int h = 0; h < NH; ++h) q[h] = V::load(qh + h * head_dim + c + l * kW);
#pragma GCC unroll 16
        for (int k = 0; k < R; ++k) {
          const F x = V::load(rp[k] + c + l * kW);
#pragma GCC unroll 4
          for (int h = 0; h < NH; ++h) acc[k * NH + h][l] = V::fma(q[h], x, acc[k * NH + h][l]);
        }
      }
    }
    for (int l = 0; l < kH && c + l * kW < head_dim; ++l) {
      const M m = V::mask(head_dim - c - l * kW);
#pragma GCC unroll 16
      for (int k = 0; k < R; ++k) {
        const F x = V::load_n(rp[k] + c + l * kW, m);
#pragma GCC unroll 4
        for (int h = 0; h < NH; ++h) {
          const F q = V::load_n(qh + h * head_dim + c + l * kW, m);
          const F f = V::fma(q, x, acc[k * NH + h][l]);
          acc[k * NH + h][l] = V::keep_n(f, acc[k * NH + h][l], m);
        }
      }
    }
    if constexpr (NH == 1) {
      V::reduce16_rows(acc, scale, s, nr);
    } else {
      static_assert(NH == V::kScoreHeads, "V::reduce16_rows_heads stores kScoreHeads heads");
      V::reduce16_rows_heads(acc, scale, s, s_stride, nr);
    }
  }

  static void scores(const float* q, int n_heads, int head_dim, const float* const* rows,
                     int n_rows, float scale, float* s, int64_t s_stride) {
    // Heads in groups of NH (V::kScoreHeads) on tiles of R rows, the rest
    // one at a time on tiles of V::kScoreRows rows.
    constexpr int NH = V::kScoreHeads, R = V::kScoreRows / NH, R1 = V::kScoreRows;
    auto each_block = [&](int r_step, auto&& tile) {
      for (int r0 = 0; r0 < n_rows; r0 += r_step) {
        const int nr = n_rows - r0 < r_step ? n_rows - r0 : r_step;
        const float* rp[V::kScoreRows];
        for (int k = 0; k < r_step; ++k) rp[k] = rows[r0 + (k < nr ? k : nr - 1)];
        tile(rp, r0, nr);
      }
    };
    int h0 = 0;
    for (; NH > 1 && h0 + NH <= n_heads; h0 += NH) {
      each_block(R, [&](const float* const* rp, int r0, int nr) {
        scores_tile<R, NH>(q + static_cast<int64_t>(h0) * head_dim, head_dim, rp, scale,
                           s + h0 * s_stride + r0, s_stride, nr);
      });
    }
    for (; h0 < n_heads; ++h0) {
      each_block(R1, [&](const float* const* rp, int r0, int nr) {
        scores_tile<R1, 1>(q + static_cast<int64_t>(h0) * head_dim, head_dim, rp, scale,
                           s + h0 * s_stride + r0, s_stride, nr);
      });
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

  // NH heads (ph, oh: head h at ph + h * p_stride, oh + h * head_dim), dims
  // [d0, d0 + kW * NV) of each (the last register only its first n_last lanes),
  // accumulated over all rows in order. The heads share each row's loads,
  // and NH * NV independent FMA chains hide the FMA latency.
  template <int NV, int NH>
  static void accumulate_tile(const float* ph, int64_t p_stride, const float* const* rows,
                              int n_rows, int head_dim, int d0, int n_last, float* oh) {
    const M last = V::mask(n_last);
    F acc[NH][NV];
#pragma GCC unroll 4
    for (int h = 0; h < NH; ++h) {
      float* o = oh + static_cast<int64_t>(h) * head_dim + d0;
#pragma GCC unroll 8
      for (int v = 0; v < NV - 1; ++v) acc[h][v] = V::load(o + kW * v);
      acc[h][NV - 1] = V::load_n(o + kW * (NV - 1), last);
    }
    for (int r = 0; r < n_rows; ++r) {
      const float* row = rows[r] + d0;
      F x[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV - 1; ++v) x[v] = V::load(row + kW * v);
      x[NV - 1] = V::load_n(row + kW * (NV - 1), last);
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        const F p = V::set1(ph[h * p_stride + r]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[h][v] = V::fma(p, x[v], acc[h][v]);
      }
    }
#pragma GCC unroll 4
    for (int h = 0; h < NH; ++h) {
      float* o = oh + static_cast<int64_t>(h) * head_dim + d0;
#pragma GCC unroll 8
      for (int v = 0; v < NV - 1; ++v) V::store(o + kW * v, acc[h][v]);
      V::store_n(o + kW * (NV - 1), acc[h][NV - 1], last);
    }
  }

  // Heads per accumulate tile of NV registers: V::kAccumRegs accumulators,
  // at most kAccHeads heads.
  static constexpr int kAccHeads = 4;
  static constexpr int heads_for(int nv) {
    const int nh = V::kAccumRegs / nv;
    return nh < 1 ? 1 : nh > kAccHeads ? kAccHeads : nh;
  }

  using AccTile = void (*)(const float*, int64_t, const float* const*, int, int, int, int, float*);
  template <int NV>
  static constexpr std::array<AccTile, kAccHeads> acc_row() {
    return {accumulate_tile<NV, 1>, accumulate_tile<NV, 2>, accumulate_tile<NV, 3>,
            accumulate_tile<NV, 4>};
  }

  static void accumulate(const float* p, int n_heads, int64_t p_stride, const float* const* rows,
                         int n_rows, int head_dim, float* o) {
    constexpr int kTile = 8 * kW;  // up to 8 registers of one head per tile
    // [NV - 1][NH - 1]
    static constexpr std::array<std::array<AccTile, kAccHeads>, 8> kTiles = {
        acc_row<1>(), acc_row<2>(), acc_row<3>(), acc_row<4>(),
        acc_row<5>(), acc_row<6>(), acc_row<7>(), acc_row<8>()};
    for (int d0 = 0; d0 < head_dim; d0 += kTile) {
      const int nd = head_dim - d0 < kTile ? head_dim - d0 : kTile;
      const int nv = (nd + kW - 1) / kW;
      const int nh = heads_for(nv);
      const int n_last = nd - kW * (nv - 1);
      for (int h = 0; h < n_heads; h += nh) {
        const int k = n_heads - h < nh ? n_heads - h : nh;
        kTiles[nv - 1][k - 1](p + h * p_stride, p_stride, rows, n_rows, head_dim, d0, n_last,
                              o + static_cast<int64_t>(h) * head_dim);
      }
    }
  }

  static constexpr AttnKernels attn_kernels() {
    return {widen_f16, scores, max, exp_sum, accumulate};
  }
};

}  // namespace
}  // namespace encore::kernels
