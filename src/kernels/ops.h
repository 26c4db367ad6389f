// Element-wise, normalisation, RoPE and attention kernels of the forward pass
// (matrix multiplication lives in kernels/matmul.h).
//
// Invariance: every output value is computed in one canonical operation
// order that does not depend on the ISA, the thread split or how many tokens
// or sequences share a step (docs/invariance.md). Functions taking an Isa
// have a scalar twin and SIMD versions that agree bit for bit; functions
// without one are exact per element (no reduction, no FMA) and vectorise
// trivially. Transcendentals (exp, sin, cos, pow) are Encore's own, built
// from IEEE basic operations only, so results do not depend on libm.
//
// Ownership: kernels own nothing; every pointer is borrowed for the call.
// Thread-safety: all functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>

#include "encore/dtype.h"
#include "encore/isa.h"

namespace encore::kernels {

// out[i] = (x[i] * scale) * w[i], scale = 1 / sqrt(dot_canonical(x, x, n) / n + eps)
// (every operation rounded to float). out may alias x.
void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps, Isa isa);

// y[i] += x[i]  (residual connections, biases). Exact per element.
void add_inplace(float* y, const float* x, int64_t n);

// Encore's exp for float (ops_math.h: Cody-Waite reduction, degree-7
// polynomial, < 1 ulp (0.92 measured); exp(-inf) = 0, exp(inf) = inf, NaN -> NaN, results
// below 2^-126 are correctly rounded subnormals of the polynomial value).
// Identical on every ISA.
float exp_f32(float x);
// y[i] = exp_f32(x[i] - m): the subtraction rounded to float, then exp_f32
// (softmax weights of the sampler). y may alias x. Identical on every ISA.
void exp_shifted(float* y, const float* x, float m, int64_t n, Isa isa);
// silu(x) = x / (1 + exp_f32(-x)).
float silu(float x);
// out[i] = silu(gate[i]) * up[i]. out may alias gate or up (same index).
void swiglu(float* out, const float* gate, const float* up, int64_t n, Isa isa);

// Rotary position embedding angles for one position, as ggml computes them
// (ggml_rope_cache_init + rope_yarn, ext_factor 0, attn_factor 1), all in
// float: theta_scale = base^(-2/n_rot) (rounded to float); t = float(pos);
// for pair i in [0, n_rot/2): theta = freq_scale * (t / factor_i), t *= theta_scale
// (factor_i = freq_factors[i], or 1 when freq_factors is null); then cos/sin
// of theta rounded to float. pow, cos and sin are Encore's own (ops_math.h,
// computed in double: correctly rounded in practice). cos_out, sin_out: [n_rot / 2].
void rope_cos_sin(int64_t pos, int n_rot, float freq_base, float freq_scale,
                  const float* freq_factors, float* cos_out, float* sin_out);

// Rotates the first n_rot dims of each of n_heads heads of x:
// [n_heads, head_dim] in place with the angles from rope_cos_sin().
// Adjacent layout (llama.cpp LLAMA_ROPE_TYPE_NORM, llama2.c): pair i is
// (2i, 2i+1). NeoX layout: pair i is (i, i + n_rot/2). Exact per element.
void rope_adjacent(float* x, int n_heads, int head_dim, int n_rot, const float* cos,
                   const float* sin);
void rope_neox(float* x, int n_heads, int head_dim, int n_rot, const float* cos, const float* sin);

// Keys and values of one layer of one sequence, stored in fixed-size blocks
// (the paged KV cache). Token j lives in block j / block_tokens at row
// j % block_tokens; its row for KV head g starts at element g * head_dim.
// Elements are F32 or F16 (`type`).
struct PagedKv {
  const uint8_t* const* k_blocks = nullptr;  // [n_blocks] -> [block_tokens, row_stride]
  const uint8_t* const* v_blocks = nullptr;  // [n_blocks] -> [block_tokens, row_stride]
  DType type = DType::F32;
  int64_t block_tokens = 0;
  int64_t row_stride = 0;  // elements per token row (n_kv_heads * head_dim)
};

// One query head attending over cached tokens [0, n_kv) of KV head kv_head.
// Canonical order (docs/invariance.md; identical bits on every ISA):
//   s_j = dot_canonical(q, k_j) * scale   (k_j widened exactly to float)
//   m = max of the non-NaN s_j;  p_j = exp_f32(s_j - m)
//   sum = reduce16 of 16 lane sums (lane j % 16, plain adds in j order)
//   o[d] = fma(p_j, v_j[d], o[d]) for j = 0..n_kv-1 in order, from 0
//   out[d] = o[d] / sum
// q, out: [head_dim]; scores: scratch [n_kv] (left holding p). out must not
// alias q. head_dim: any positive value. n_kv <= 0 gives out = 0. NaN in q
// gives NaN out. Cost: 4 * n_kv * head_dim flops, K and V each read once.
void attention_head(const float* q, const PagedKv& kv, int kv_head, int64_t n_kv, int head_dim,
                    float scale, float* scores, float* out, Isa isa);

// The n_q_heads query heads that share KV head kv_head (grouped-query
// attention), reading each K/V row once for all of them. q, out:
// [n_q_heads, head_dim]; scores: scratch [n_q_heads, n_kv]. Bit-identical to
// calling attention_head once per query head (query head h uses
// scores + h * n_kv).
void attention_gqa(const float* q, int n_q_heads, const PagedKv& kv, int kv_head, int64_t n_kv,
                   int head_dim, float scale, float* scores, float* out, Isa isa);

// attention_gqa for n_tok query tokens of one sequence at once (a prefill
// chunk), reading each K/V row once for all of them: token i attends over
// rows [0, n_kv[i]) (n_kv[i] <= 0: zeros). Its heads are at q + i * q_stride
// and out + i * q_stride ([n_q_heads, head_dim] each); scores: scratch
// [n_tok * n_q_heads, n_max] (n_max: the largest n_kv[i]; token i's head h
// uses row i * n_q_heads + h). q_stride >= n_q_heads * head_dim when
// n_tok > 1; out must not alias q. Bit-identical to attention_gqa per token:
// only the sharing of K/V reads and widenings changes, not any head's order.
void attention_tokens(const float* q, int64_t q_stride, int n_tok, const int64_t* n_kv,
                      int n_q_heads, const PagedKv& kv, int kv_head, int head_dim, float scale,
                      float* scores, float* out, Isa isa);

}  // namespace encore::kernels
