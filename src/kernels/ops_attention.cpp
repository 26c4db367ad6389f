// Attention over the paged KV cache (see ops.h): the scalar twin, which
// defines the numbers, and the chunked driver that runs the SIMD building
// blocks of ops_simd.h in the same canonical order.
//
// Canonical order, per query head (q: [head_dim]):
//   s_j  = dot_canonical(q, k_j, head_dim) * scale      (k_j widened exactly to f32)
//   m    = max over non-NaN s_j  (m = s_j > m ? s_j : m from -inf; the sign of
//          a zero maximum cannot matter: exp(+-0 - +-0) = 1 either way)
//   p_j  = exp_f32(s_j - m)
//   sum  = reduce16(lane sums), lane l = sum of p_j for j % 16 == l, plain adds in j order
//   o[d] = fma(p_j, v_j[d], o[d]) for j = 0, 1, ..., n_kv - 1, from +0
//   out[d] = o[d] / sum
// n_kv <= 0 gives out = 0.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/canonical.h"
#include "kernels/fp16.h"
#include "kernels/kernel_table.h"
#include "kernels/ops.h"
#include "kernels/ops_math.h"
#include "kernels/ops_simd.h"

namespace encore::kernels {
namespace {

// Address of element 0 of token j's row for the KV head at element head_off.
const uint8_t* row_address(const uint8_t* const* blocks, const PagedKv& kv, int64_t j,
                           int64_t head_off) {
  const int64_t elem = kv.type == DType::F16 ? 2 : 4;
  return blocks[j / kv.block_tokens] + ((j % kv.block_tokens) * kv.row_stride + head_off) * elem;
}

// Exact widening of one cached row into dst: [head_dim].
void read_row(const uint8_t* src, DType type, int head_dim, float* dst) {
  if (type == DType::F16) {
    for (int d = 0; d < head_dim; ++d) {
      uint16_t h;
      std::memcpy(&h, src + 2 * d, 2);
      dst[d] = fp16_to_f32(h);
    }
  } else {
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(head_dim));
  }
}

void attention_head_scalar(const float* q, const PagedKv& kv, int kv_head, int64_t n_kv,
                           int head_dim, float scale, float* scores, float* out) {
  const int64_t head_off = static_cast<int64_t>(kv_head) * head_dim;
  std::vector<float> row(static_cast<size_t>(head_dim));  // [head_dim]
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n_kv; ++j) {
    read_row(row_address(kv.k_blocks, kv, j, head_off), kv.type, head_dim, row.data());
    scores[j] = dot_canonical(q, row.data(), head_dim) * scale;
    m = scores[j] > m ? scores[j] : m;
  }
  float lanes[kDotLanes] = {};
  for (int64_t j = 0; j < n_kv; ++j) {
    scores[j] = exp_f32_ref(scores[j] - m);
    lanes[j % kDotLanes] = lanes[j % kDotLanes] + scores[j];
  }
  const float sum = reduce16(lanes);
  for (int d = 0; d < head_dim; ++d) out[d] = 0.0f;
  for (int64_t j = 0; j < n_kv; ++j) {
    read_row(row_address(kv.v_blocks, kv, j, head_off), kv.type, head_dim, row.data());
    for (int d = 0; d < head_dim; ++d) out[d] = std::fma(scores[j], row[d], out[d]);
  }
  for (int d = 0; d < head_dim; ++d) out[d] = out[d] / sum;
}

// Runs n_tok query tokens of n_heads query heads each against one KV head
// with the SIMD building blocks: K and V are each read once, in chunks of up
// to kAttnChunkRows rows, for every head of every token (F16 chunks are
// widened into scratch once for all of them). Token i's heads: q + i * qs
// and out + i * qs; its scores: rows [i * n_heads, (i + 1) * n_heads) of
// scores, n_max apart (n_max: the largest n_kv[i]).
void attention_simd(const AttnKernels& kk, const float* q, int64_t qs, int n_tok,
                    const int64_t* n_kv, int n_heads, const PagedKv& kv, int kv_head, int64_t n_max,
                    int head_dim, float scale, float* scores, float* out) {
  const int64_t head_off = static_cast<int64_t>(kv_head) * head_dim;
  const bool f16 = kv.type == DType::F16;
  // F16 scratch: ~32 KiB so a widened chunk stays in L1 while every head of
  // the group reads it.
  constexpr int kScratchFloats = 8192;
  const int chunk =
      f16 ? std::clamp(kScratchFloats / head_dim / 16 * 16, 16, kAttnChunkRows) : kAttnChunkRows;
  std::vector<float> scratch;  // [chunk, head_dim], F16 only
  if (f16) scratch.resize(static_cast<size_t>(chunk) * static_cast<size_t>(head_dim));
  const float* rows[kAttnChunkRows];

  const int64_t elem = f16 ? 2 : 4;
  auto gather = [&](const uint8_t* const* blocks, int64_t j0, int n) {
    // Walk blocks and rows incrementally: no division per row.
    int64_t block = j0 / kv.block_tokens, in_block = j0 % kv.block_tokens;
    for (int r = 0; r < n; ++r) {
      const uint8_t* src = blocks[block] + (in_block * kv.row_stride + head_off) * elem;
      if (++in_block == kv.block_tokens) {
        in_block = 0;
        ++block;
      }
      if (f16) {
        float* dst = scratch.data() + static_cast<int64_t>(r) * head_dim;
        kk.widen_f16(src, dst, head_dim);
        rows[r] = dst;
      } else {
        // F32 rows are read in place (by unaligned SIMD loads only).
        rows[r] = reinterpret_cast<const float*>(src);
      }
    }
  };
  // Token i's share of a chunk of rows [j0, j0 + n): its rows below n_kv[i].
  auto rows_of = [&](int i, int64_t j0, int n) {
    return static_cast<int>(std::clamp<int64_t>(n_kv[i] - j0, 0, n));
  };
  const int64_t hs = static_cast<int64_t>(n_heads) * n_max;  // scores of one token

  for (int64_t j0 = 0; j0 < n_max; j0 += chunk) {
    const int n = static_cast<int>(std::min<int64_t>(chunk, n_max - j0));
    gather(kv.k_blocks, j0, n);
    for (int i = 0; i < n_tok; ++i) {
      if (const int ni = rows_of(i, j0, n); ni > 0) {
        kk.scores(q + i * qs, n_heads, head_dim, rows, ni, scale, scores + i * hs + j0, n_max);
      }
    }
  }
  std::vector<float> sums(static_cast<size_t>(n_tok) * n_heads);  // [n_tok, n_heads]
  for (int i = 0; i < n_tok; ++i) {
    std::fill(out + i * qs, out + i * qs + static_cast<int64_t>(n_heads) * head_dim, 0.0f);
    if (n_kv[i] <= 0) continue;
    for (int h = 0; h < n_heads; ++h) {
      float* s = scores + i * hs + h * n_max;
      sums[static_cast<size_t>(i) * n_heads + h] = kk.exp_sum(s, n_kv[i], kk.max(s, n_kv[i]));
    }
  }
  for (int64_t j0 = 0; j0 < n_max; j0 += chunk) {
    const int n = static_cast<int>(std::min<int64_t>(chunk, n_max - j0));
    gather(kv.v_blocks, j0, n);
    for (int i = 0; i < n_tok; ++i) {
      if (const int ni = rows_of(i, j0, n); ni > 0) {
        kk.accumulate(scores + i * hs + j0, n_heads, n_max, rows, ni, head_dim, out + i * qs);
      }
    }
  }
  for (int i = 0; i < n_tok; ++i) {
    if (n_kv[i] <= 0) continue;
    for (int h = 0; h < n_heads; ++h) {
      float* o = out + i * qs + static_cast<int64_t>(h) * head_dim;
      const float sum = sums[static_cast<size_t>(i) * n_heads + h];
      for (int d = 0; d < head_dim; ++d) o[d] = o[d] / sum;
    }
  }
}

}  // namespace

void attention_head(const float* q, const PagedKv& kv, int kv_head, int64_t n_kv, int head_dim,
                    float scale, float* scores, float* out, Isa isa) {
  attention_tokens(q, 0, 1, &n_kv, 1, kv, kv_head, head_dim, scale, scores, out, isa);
}

void attention_gqa(const float* q, int n_q_heads, const PagedKv& kv, int kv_head, int64_t n_kv,
                   int head_dim, float scale, float* scores, float* out, Isa isa) {
  attention_tokens(q, 0, 1, &n_kv, n_q_heads, kv, kv_head, head_dim, scale, scores, out, isa);
}

void attention_tokens(const float* q, int64_t q_stride, int n_tok, const int64_t* n_kv,
                      int n_q_heads, const PagedKv& kv, int kv_head, int head_dim, float scale,
                      float* scores, float* out, Isa isa) {
  const int64_t n_max = n_tok > 0 ? std::max<int64_t>(0, *std::max_element(n_kv, n_kv + n_tok)) : 0;
  if (const AttnKernels* kk = kernel_table(isa).attn; kk != nullptr && n_max > 0) {
    attention_simd(*kk, q, q_stride, n_tok, n_kv, n_q_heads, kv, kv_head, n_max, head_dim, scale,
                   scores, out);
    return;
  }
  for (int i = 0; i < n_tok; ++i) {
    for (int h = 0; h < n_q_heads; ++h) {
      const int64_t at = i * q_stride + static_cast<int64_t>(h) * head_dim;
      float* o = out + at;
      if (n_kv[i] <= 0) {
        std::fill(o, o + head_dim, 0.0f);
        continue;
      }
      attention_head_scalar(q + at, kv, kv_head, n_kv[i], head_dim, scale,
                            scores + (static_cast<int64_t>(i) * n_q_heads + h) * n_max, o);
    }
  }
}

}  // namespace encore::kernels
