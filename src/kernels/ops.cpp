// Reference scalar kernels (see ops.h). Straightforward loops on purpose:
// they define the numbers the SIMD kernels are tested against.
#include "kernels/ops.h"

#include <cassert>
#include <cmath>
#include <cstdint>
#include <vector>

#include "encore/thread_pool.h"
#include "kernels/quants.h"

namespace encore::kernels {

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void get_row(const WeightView& w, int64_t row, float* out) {
  dequantize_row(w.type, w.data + static_cast<size_t>(row) * w.row_bytes, out, w.cols);
}

void matmul(const WeightView& w, const float* x, float* y, int64_t m, ThreadPool* pool) {
  const int64_t rows = w.rows;
  const int64_t cols = w.cols;
  // F32 rows are read in place; the model loader rejects F32 weights that are
  // not float-aligned (a file may declare an alignment of 1 or 2).
  assert(w.type != DType::F32 || reinterpret_cast<uintptr_t>(w.data) % alignof(float) == 0);
  auto run = [&](int64_t r_begin, int64_t r_end, int /*thread*/) {
    // F32 rows are used in place; other types are dequantised one row at a
    // time into this chunk's scratch, so each row is decoded once per call
    // however many tokens are in the batch.
    std::vector<float> scratch;  // [cols]
    if (w.type != DType::F32) scratch.resize(static_cast<size_t>(cols));
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* row;
      if (w.type == DType::F32) {
        row = reinterpret_cast<const float*>(w.data + static_cast<size_t>(r) * w.row_bytes);
      } else {
        get_row(w, r, scratch.data());
        row = scratch.data();
      }
      for (int64_t i = 0; i < m; ++i) y[i * rows + r] = dot(row, x + i * cols, cols);
    }
  };
  if (pool == nullptr || rows * cols * m < kMinParallelWork) {
    run(0, rows, 0);
  } else {
    pool->parallel_for(rows, run);
  }
}

void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps) {
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum_sq += x[i] * x[i];
  const float mean = sum_sq / static_cast<float>(n);
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void softmax(float* x, int64_t n) {
  float max_val = x[0];
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > max_val) max_val = x[i];
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_val);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

void swiglu(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

void rope_cos_sin(int64_t pos, int n_rot, float freq_base, float* cos_out, float* sin_out) {
  // ggml multiplies theta up by theta_scale pair by pair instead of calling
  // powf per pair; doing the same keeps the angles bit-compatible with the
  // llama.cpp reference generations.
  const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(n_rot));
  float theta = static_cast<float>(pos);
  for (int i = 0; i < n_rot / 2; ++i) {
    cos_out[i] = std::cos(theta);
    sin_out[i] = std::sin(theta);
    theta *= theta_scale;
  }
}

void rope_adjacent(float* x, int n_heads, int head_dim, int n_rot, const float* cos,
                   const float* sin) {
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < n_rot / 2; ++i) {
      const float x0 = v[2 * i];
      const float x1 = v[2 * i + 1];
      v[2 * i] = x0 * cos[i] - x1 * sin[i];
      v[2 * i + 1] = x0 * sin[i] + x1 * cos[i];
    }
  }
}

void rope_neox(float* x, int n_heads, int head_dim, int n_rot, const float* cos, const float* sin) {
  const int half = n_rot / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float x0 = v[i];
      const float x1 = v[i + half];
      v[i] = x0 * cos[i] - x1 * sin[i];
      v[i + half] = x0 * sin[i] + x1 * cos[i];
    }
  }
}

void attention_head(const float* q, const PagedKv& kv, int kv_head, int64_t n_kv, int head_dim,
                    float scale, float* scores, float* out) {
  const int64_t head_off = static_cast<int64_t>(kv_head) * head_dim;
  for (int64_t j = 0; j < n_kv; ++j) {
    const float* k = kv.k_blocks[j / kv.block_tokens] + (j % kv.block_tokens) * kv.row_stride;
    scores[j] = dot(q, k + head_off, head_dim) * scale;
  }
  softmax(scores, n_kv);
  for (int d = 0; d < head_dim; ++d) out[d] = 0.0f;
  for (int64_t j = 0; j < n_kv; ++j) {
    const float* v = kv.v_blocks[j / kv.block_tokens] + (j % kv.block_tokens) * kv.row_stride;
    const float p = scores[j];
    for (int d = 0; d < head_dim; ++d) out[d] += p * v[head_off + d];
  }
}

}  // namespace encore::kernels
