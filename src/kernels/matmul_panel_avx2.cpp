// The integer panel kernel (panel_kernel.h) for AVX2 (panel_int_avx2.h's
// operations: maddubs and madd).
#include "kernels/matmul_internal.h"
#include "kernels/panel_int_avx2.h"
#include "kernels/panel_kernel.h"

namespace encore::kernels::mm {

void panel_tile_avx2(DType t, const uint8_t* panel, int64_t k, const ActRows& a, int64_t i0, int C,
                     float* out) {
  panel_kernel::panel_tile<V256>(t, panel, k, a, i0, C, out);
}

}  // namespace encore::kernels::mm
