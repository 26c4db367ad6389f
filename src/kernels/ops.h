// Plain scalar compute kernels of the forward pass.
//
// Every kernel the model calls lives behind this small interface so that the
// SIMD, batch-invariant versions can replace the bodies without touching the
// model code. These are the reference versions: float32 math, one float
// accumulator, elements summed in index order, no FMA (the build uses
// -ffp-contract=off). Results never depend on the thread count: work is only
// ever split across independent outputs.
//
// Ownership: kernels own nothing; every pointer is borrowed for the call.
// Thread-safety: all functions are reentrant; matmul() and attention users
// parallelise through the ThreadPool they are given.
#pragma once

#include <cstddef>
#include <cstdint>

#include "encore/dtype.h"

namespace encore {
class ThreadPool;
}

namespace encore::kernels {

// Below this many multiply-adds a job is cheaper to run on the calling thread
// than to hand out (waking workers costs microseconds). Only speed depends on
// it: the split never changes results.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 16;

// A borrowed 2-D weight matrix stored row-major in any dequantisable dtype:
// `rows` rows of `cols` values each, row r starting at data + r * row_bytes.
// In GGUF terms cols = dims[0] and rows = dims[1]. F32 data is read in place
// as floats, so it must be aligned to alignof(float) (asserted; the model
// loader checks it for weights from files); other types are copied out
// block by block and may sit at any address.
struct WeightView {
  DType type = DType::F32;
  const uint8_t* data = nullptr;  // [rows, row_bytes]
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
};

// y = x W^T for a batch of m activations: y[i][r] = sum_c W[r][c] * x[i][c].
// x: [m, w.cols], y: [m, w.rows] (must not alias x).
// Work is split across threads by output rows; each weight row is
// dequantised once into per-thread scratch and dotted with all m inputs.
// pool may be null; small products (< kMinParallelWork) run on the caller.
void matmul(const WeightView& w, const float* x, float* y, int64_t m, ThreadPool* pool);

// Dequantises row `row` of `w` into out: [w.cols]. Used for embedding lookup.
void get_row(const WeightView& w, int64_t row, float* out);

// sum_i a[i] * b[i], accumulated in index order in one float.
float dot(const float* a, const float* b, int64_t n);

// out[i] = (x[i] * (1 / sqrt(mean(x^2) + eps))) * w[i]. out may alias x.
void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps);

// y[i] += x[i]  (residual connections).
void add_inplace(float* y, const float* x, int64_t n);

// In-place softmax of x: [n] with max subtraction; the exp sum is a float.
void softmax(float* x, int64_t n);

// silu(x) = x / (1 + exp(-x)).
float silu(float x);
// out[i] = silu(gate[i]) * up[i]. out may alias gate or up.
void swiglu(float* out, const float* gate, const float* up, int64_t n);

// Rotary position embedding angles for one position: for pair i in
// [0, n_rot/2), theta_i = pos * freq_base^(-2i/n_rot), computed as ggml does
// (theta_scale = powf(base, -2/n_rot), theta multiplied up pair by pair in
// float), then cos/sin in float. cos_out, sin_out: [n_rot / 2].
void rope_cos_sin(int64_t pos, int n_rot, float freq_base, float* cos_out, float* sin_out);

// Rotates the first n_rot dims of each of n_heads heads of x:
// [n_heads, head_dim] in place with the angles from rope_cos_sin().
// Adjacent layout (llama.cpp LLAMA_ROPE_TYPE_NORM, llama2.c): pair i is
// (2i, 2i+1). NeoX layout: pair i is (i, i + n_rot/2).
void rope_adjacent(float* x, int n_heads, int head_dim, int n_rot, const float* cos,
                   const float* sin);
void rope_neox(float* x, int n_heads, int head_dim, int n_rot, const float* cos, const float* sin);

// Keys and values of one layer of one sequence, stored in fixed-size blocks
// (the paged KV cache). Token j lives in block j / block_tokens at row
// j % block_tokens; its row for KV head g starts at g * head_dim.
struct PagedKv {
  const float* const* k_blocks = nullptr;  // [n_blocks] -> [block_tokens, row_stride]
  const float* const* v_blocks = nullptr;  // [n_blocks] -> [block_tokens, row_stride]
  int64_t block_tokens = 0;
  int64_t row_stride = 0;  // floats per token row (n_kv_heads * head_dim)
};

// One query head attending over cached tokens [0, n_kv) of KV head kv_head:
// s_j = dot(q, k_j) * scale, p = softmax(s), out = sum_j p_j v_j (j in order).
// q, out: [head_dim]; scores: scratch [n_kv]. out must not alias q.
void attention_head(const float* q, const PagedKv& kv, int kv_head, int64_t n_kv, int head_dim,
                    float scale, float* scores, float* out);

}  // namespace encore::kernels
