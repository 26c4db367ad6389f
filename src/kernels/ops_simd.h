// Internal: the per-ISA entry points behind kernels/ops.h, written once over
// the vector width in ops_vec.h and instantiated by ops_avx2.cpp and
// ops_avx512.cpp (compiled for those ISAs; call them only after
// isa_supported()). Every function computes exactly the canonical
// order of its scalar twin (ops.cpp, ops_attention.cpp), so results match it
// bit for bit. Thread-safety: reentrant.
#pragma once

#include <cstdint>

namespace encore::kernels {

// The building blocks of attention (ops_attention.cpp drives them over the
// paged cache in chunks of at most kAttnChunkRows rows). Row pointers point at
// f32 rows of head_dim elements (F16 caches are widened into scratch first).
struct AttnKernels {
  // dst[i] = fp16_to_f32(src[i]) for i < n. src: n halves, any alignment.
  void (*widen_f16)(const uint8_t* src, float* dst, int64_t n);
  // s[h * s_stride + r] = dot_canonical(q + h * head_dim, rows[r], head_dim) * scale
  // for h < n_heads, r < n_rows. q: [n_heads, head_dim].
  void (*scores)(const float* q, int n_heads, int head_dim, const float* const* rows, int n_rows,
                 float scale, float* s, int64_t s_stride);
  // Largest non-NaN s[j], j < n (-inf if none): m = s_j > m ? s_j : m.
  float (*max)(const float* s, int64_t n);
  // s[j] = exp_f32(s[j] - m) in place; returns reduce16 of the 16 lane sums
  // (lane j % 16, plain adds in j order).
  float (*exp_sum)(float* s, int64_t n, float m);
  // o[h * head_dim + d] = fma(p[h * p_stride + r], rows[r][d], o[h * head_dim + d])
  // for r = 0, 1, ..., n_rows - 1 in order, every h < n_heads and d < head_dim.
  void (*accumulate)(const float* p, int n_heads, int64_t p_stride, const float* const* rows,
                     int n_rows, int head_dim, float* o);
};

inline constexpr int kAttnChunkRows = 128;  // multiple of 16

namespace avx2 {
void exp_n(const float* x, float* y, int64_t n);  // y[i] = exp_f32(x[i]); y may alias x
void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps);
void swiglu(float* out, const float* gate, const float* up, int64_t n);
extern const AttnKernels kAttn;
}  // namespace avx2

namespace avx512 {
void exp_n(const float* x, float* y, int64_t n);  // y[i] = exp_f32(x[i]); y may alias x
void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps);
void swiglu(float* out, const float* gate, const float* up, int64_t n);
extern const AttnKernels kAttn;
}  // namespace avx512

}  // namespace encore::kernels
