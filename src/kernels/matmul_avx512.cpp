// AVX-512 (F/BW/DQ/VL + VNNI) matmul kernels: the float panel kernel of
// float_panel_kernel.h with 16 rows (one panel) per register; the integer
// panel kernel is matmul_panel_avx512.cpp, and activation quantisation
// reuses the AVX2 table (its results are exact anyway).
#include "kernels/float_panel_kernel.h"
#include "kernels/matmul_internal.h"
#include "kernels/vec_avx512.h"

namespace encore::kernels::mm {
namespace {

// The float panel kernel's tiles: up to 24 accumulators of the 32 zmm
// registers, 2 panels x 12 activation rows for prefill, up to 4 panels for
// decode-sized batches.
struct VF512 : avx512::Vec {
  static constexpr int kFloatAcc = 24;
  static constexpr int kFloatNR = 4;
  static constexpr int kFloatC = 12;
  static constexpr int kFloatCMax = 12;
};

}  // namespace

const IsaKernels& avx512_kernels() {
  static const IsaKernels k = [] {
    IsaKernels t = avx2_kernels();
    t.panel_tile = panel_tile_avx512;
    t.float_panels = float_panel_kernel::float_panels<VF512>;
    t.act_rows = kActRows;
    return t;
  }();
  return k;
}

}  // namespace encore::kernels::mm
