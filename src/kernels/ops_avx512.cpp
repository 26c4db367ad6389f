// The AVX-512 element-wise and attention kernels of ops_simd.h: ops_vec.h over
// 16-lane zmm vectors (vec_avx512.h). The kernels themselves are written once,
// in ops_vec.h, for both SIMD ISAs.
#include "kernels/ops_simd.h"
#include "kernels/ops_vec.h"
#include "kernels/vec_avx512.h"

namespace encore::kernels::avx512 {

using Ops = OpsVec<Vec>;

void exp_n(const float* x, float* y, int64_t n) { Ops::exp_n(x, y, n); }
void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps) {
  Ops::rmsnorm(out, x, w, n, eps);
}
void swiglu(float* out, const float* gate, const float* up, int64_t n) {
  Ops::swiglu(out, gate, up, n);
}
const AttnKernels kAttn = Ops::attn_kernels();

}  // namespace encore::kernels::avx512
