// Scalar twins of the element-wise, normalisation and RoPE kernels (see
// ops.h) and their ISA dispatch. The scalar loops define the numbers; the
// SIMD versions (ops_vec.h, one source for AVX2 and AVX-512) reproduce them bit
// for bit.
// Attention lives in ops_attention.cpp.
#include <cassert>
#include <cmath>
#include <cstdint>

#include "kernels/canonical.h"
#include "kernels/kernel_table.h"
#include "kernels/ops.h"
#include "kernels/ops_math.h"
#include "kernels/ops_simd.h"

namespace encore::kernels {

// Canonical: sum of squares = dot_canonical(x, x, n); mean = ss / float(n);
// scale = 1 / sqrt(mean + eps) (each op correctly rounded);
// out[i] = (x[i] * scale) * w[i].
void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps, Isa isa) {
  if (const auto f = kernel_table(isa).rmsnorm) return f(out, x, w, n, eps);
  const float sum_sq = dot_canonical(x, x, n);
  const float mean = sum_sq / static_cast<float>(n);
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

float exp_f32(float x) { return exp_f32_ref(x); }

float silu(float x) { return silu_ref(x); }

void exp_shifted(float* y, const float* x, float m, int64_t n, Isa isa) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] - m;
  if (const auto f = kernel_table(isa).exp_n) return f(y, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = exp_f32_ref(y[i]);
}

void swiglu(float* out, const float* gate, const float* up, int64_t n, Isa isa) {
  if (const auto f = kernel_table(isa).swiglu) return f(out, gate, up, n);
  for (int64_t i = 0; i < n; ++i) out[i] = silu_ref(gate[i]) * up[i];
}

// ggml's rope cache (ggml_rope_cache_init + rope_yarn with ext_factor = 0,
// attn_factor = 1), float operation for float operation, with powf/cosf/sinf
// replaced by Encore's double versions rounded to float: those give the
// correctly rounded value in all but ~1e-8 of cases, which is what a good
// libm gives too, so the angles stay compatible with llama.cpp generations.
void rope_cos_sin(int64_t pos, int n_rot, float freq_base, float freq_scale,
                  const float* freq_factors, float* cos_out, float* sin_out) {
  const float exponent = -2.0f / static_cast<float>(n_rot);
  const float theta_scale =
      static_cast<float>(pow_f64(static_cast<double>(freq_base), static_cast<double>(exponent)));
  float theta_base = static_cast<float>(pos);
  for (int i = 0; i < n_rot / 2; ++i) {
    const float ff = freq_factors != nullptr ? freq_factors[i] : 1.0f;
    const float theta_extrap = theta_base / ff;
    const float theta = freq_scale * theta_extrap;
    double s = 0.0, c = 0.0;
    sincos_f64(static_cast<double>(theta), &s, &c);
    cos_out[i] = static_cast<float>(c);
    sin_out[i] = static_cast<float>(s);
    theta_base *= theta_scale;
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

}  // namespace encore::kernels
