// The scalar twin of the matmul kernels: the canonical order of
// matmul_internal.h written as plain loops. It defines the numbers; the SIMD
// tables must reproduce them bit for bit. Also holds the exact weight
// decoders that the SIMD tables reuse for the rarer types.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "kernels/canonical.h"
#include "kernels/float_panel.h"
#include "kernels/fp16.h"
#include "kernels/matmul_internal.h"
#include "kernels/panel.h"
#include "kernels/quants.h"
#include "kernels/quants_internal.h"

namespace encore::kernels::mm {

bool is_int_type(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

bool has_min(DType t) {
  return t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K;
}

void quantize_group_scalar(const float* x, uint32_t ab, int8_t* q, float* da, float* asum) {
  if (ab >= kInfBits || ab < kTinyBits) {
    std::memset(q, 0, kGroup);
    *da = ab >= kInfBits ? std::bit_cast<float>(kCanonNanBits) : 0.0f;
    *asum = *da;
    return;
  }
  const float d = std::bit_cast<float>(ab) / 127.0f;
  const float id = 1.0f / d;
  int sum = 0;
  for (int k = 0; k < kGroup; ++k) {
    const int v = static_cast<int>(std::nearbyint(x[k] * id));
    q[k] = static_cast<int8_t>(v);
    sum += v;
  }
  *da = d;
  *asum = d * static_cast<float>(sum);
}

namespace {

void quantize_act_scalar(const float* x, int64_t k, const ActRows& a, int64_t i) {
  for (int64_t g = 0; g < k / kGroup; ++g) {
    uint32_t ab = 0;
    for (int j = 0; j < kGroup; ++j) {
      const uint32_t b = std::bit_cast<uint32_t>(x[g * kGroup + j]) & 0x7fffffffu;
      ab = b > ab ? b : ab;
    }
    const int64_t at = act_at(a, i, g);
    quantize_group_scalar(x + g * kGroup, ab, act_q(a, i, g), a.d + at, a.asum + at);
  }
}

}  // namespace

void decode_scalar(DType t, const uint8_t* src, int64_t k, const DecRows& dr, int64_t r) {
  int8_t* w = dr.w + r * dr.kp;
  float* ws = dr.ws + r * (dr.kp / 16);
  float* wm = dr.wm != nullptr ? dr.wm + r * (dr.kp / kGroup) : nullptr;
  using internal::load_block;
  const int64_t nb32 = k / 32, nb256 = k / 256;
  switch (t) {
    case DType::Q8_0:
      for (int64_t b = 0; b < nb32; ++b) {
        const auto blk = load_block<BlockQ8_0>(src + b * sizeof(BlockQ8_0));
        std::memcpy(w + 32 * b, blk.qs, 32);
        ws[2 * b] = ws[2 * b + 1] = fp16_to_f32(blk.d);
      }
      return;
    case DType::Q4_0:
      for (int64_t b = 0; b < nb32; ++b) {
        const auto blk = load_block<BlockQ4_0>(src + b * sizeof(BlockQ4_0));
        for (int j = 0; j < 16; ++j) {
          w[32 * b + j] = static_cast<int8_t>((blk.qs[j] & 15) - 8);
          w[32 * b + j + 16] = static_cast<int8_t>((blk.qs[j] >> 4) - 8);
        }
        ws[2 * b] = ws[2 * b + 1] = fp16_to_f32(blk.d);
      }
      return;
    case DType::Q4_1:
      for (int64_t b = 0; b < nb32; ++b) {
        const auto blk = load_block<BlockQ4_1>(src + b * sizeof(BlockQ4_1));
        for (int j = 0; j < 16; ++j) {
          w[32 * b + j] = static_cast<int8_t>(blk.qs[j] & 15);
          w[32 * b + j + 16] = static_cast<int8_t>(blk.qs[j] >> 4);
        }
        ws[2 * b] = ws[2 * b + 1] = fp16_to_f32(blk.d);
        wm[b] = fp16_to_f32(blk.m);
      }
      return;
    case DType::Q5_0:
    case DType::Q5_1:
      for (int64_t b = 0; b < nb32; ++b) {
        const bool q51 = t == DType::Q5_1;
        const size_t bytes = q51 ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0);
        uint8_t qs[16];
        uint32_t qh;
        const uint8_t* p = src + b * bytes;
        const int off = q51 ? 4 : 2;
        std::memcpy(&qh, p + off, 4);
        std::memcpy(qs, p + off + 4, 16);
        const int bias = q51 ? 0 : 16;
        for (int j = 0; j < 16; ++j) {
          const int lo = (qs[j] & 15) | static_cast<int>(((qh >> j) & 1u) << 4);
          const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
          w[32 * b + j] = static_cast<int8_t>(lo - bias);
          w[32 * b + j + 16] = static_cast<int8_t>(hi - bias);
        }
        ws[2 * b] = ws[2 * b + 1] = fp16_to_f32(rd16(p));
        if (q51) wm[b] = fp16_to_f32(rd16(p + 2));
      }
      return;
    case DType::Q4_K:
    case DType::Q5_K:
      for (int64_t b = 0; b < nb256; ++b) {
        const bool q5 = t == DType::Q5_K;
        const uint8_t* p = src + b * (q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
        const float d = fp16_to_f32(rd16(p)), dmin = fp16_to_f32(rd16(p + 2));
        const uint8_t* scales = p + 4;
        const uint8_t* qh = p + 16;
        const uint8_t* qs = p + (q5 ? 48 : 16);
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, mn;
          get_scale_min_k4(j, scales, &sc, &mn);
          ws[16 * b + 2 * j] = ws[16 * b + 2 * j + 1] = d * static_cast<float>(sc);
          wm[8 * b + j] = -(dmin * static_cast<float>(mn));
        }
        int8_t* o = w + 256 * b;
        for (int c = 0; c < 4; ++c) {
          for (int l = 0; l < 32; ++l) {
            int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
            if (q5) {
              lo |= ((qh[l] >> (2 * c)) & 1) << 4;
              hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            o[64 * c + l] = static_cast<int8_t>(lo);
            o[64 * c + 32 + l] = static_cast<int8_t>(hi);
          }
        }
      }
      return;
    case DType::Q6_K:
      for (int64_t b = 0; b < nb256; ++b) {
        const auto blk = load_block<BlockQ6_K>(src + b * sizeof(BlockQ6_K));
        const float d = fp16_to_f32(blk.d);
        for (int i = 0; i < 16; ++i) ws[16 * b + i] = d * static_cast<float>(blk.scales[i]);
        for (int h = 0; h < 2; ++h) {
          const uint8_t* ql = blk.ql + 64 * h;
          const uint8_t* qh = blk.qh + 32 * h;
          int8_t* o = w + 256 * b + 128 * h;
          for (int l = 0; l < 32; ++l) {
            o[l] = static_cast<int8_t>(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
            o[l + 32] = static_cast<int8_t>(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
            o[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            o[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
          }
        }
      }
      return;
    default:
      return;  // not an integer type: the caller never asks
  }
}

namespace {

// The order of matmul_internal.h, one output at a time.
void panel_tile_scalar(DType t, const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0,
                       int C, float* out) {
  const PanelFormat& f = panel_format(t);
  const int64_t n_groups = k / kGroup;
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < kPanelRows; ++r) {
      float acc = 0.0f, accm = 0.0f;
      for (int64_t g = 0; g < n_groups; ++g) {
        const GroupScales s = panel_scales(f, panel, r, g);
        const int8_t* q = act_q(a, i0 + c, g);
        const int64_t at = act_at(a, i0 + c, g);
        int32_t half[2] = {0, 0};  // the sums over values [0, 16) and [16, 32)
        for (int kk = 0; kk < kGroup; ++kk) {
          half[kk / 16] += panel_weight(f, panel, r, kGroup * g + kk) * int32_t{q[kk]};
        }
        const int32_t sum = s.sc_a * half[0] + s.sc_b * half[1];
        acc = std::fma(static_cast<float>(sum), s.ws * a.d[at], acc);
        if (f.has_min) accm = std::fma(s.wm, a.asum[at], accm);
      }
      out[c * kPanelRows + r] = f.has_min ? acc + accm : acc;
    }
  }
}

// dot_canonical (canonical.h) of each panel row with each activation row,
// read from the float panels' chains (float_panel.h).
void float_panels_scalar(DType elem, const uint8_t* panels, size_t pbytes, int64_t np, int64_t k,
                         const float* xp, int64_t xs, int64_t m, float* out) {
  for (int64_t c = 0; c < m; ++c) {
    for (int64_t p = 0; p < np; ++p) {
      for (int r = 0; r < kChains; ++r) {
        float acc[kChains] = {};
        for (int j = 0; j < kChains; ++j) {
          const int64_t s = chain_start(k, j), n = chain_length(k, j);
          for (int64_t t = 0; t < n; ++t) {
            const float x = xp[c / kActGroup * xs + (s + t) * kActGroup + c % kActGroup];
            const float w = float_panel_value(elem, panels + p * pbytes, s + t, r);
            acc[j] = std::fma(w, x, acc[j]);
          }
        }
        out[c * np * kChains + p * kChains + r] = reduce16(acc);
      }
    }
  }
}

}  // namespace

const IsaKernels& scalar_kernels() {
  static const IsaKernels k{quantize_act_scalar, panel_tile_scalar, float_panels_scalar};
  return k;
}

}  // namespace encore::kernels::mm
