#include "kernels/kernel_table.h"

#include "kernels/probe_internal.h"

namespace encore::kernels {

const KernelTable& kernel_table(Isa isa) {
  // Each table is built when first asked for, so that an AVX-512 table is
  // never touched on a CPU without AVX-512.
  switch (isa) {
    case Isa::Avx512: {
      static const KernelTable t{&mm::avx512_kernels(),
                                 avx512::exp_n,
                                 avx512::rmsnorm,
                                 avx512::swiglu,
                                 &avx512::kAttn,
                                 probe_detail::fma_loop_avx512,
                                 16,
                                 probe_detail::int8_loop_avx512,
                                 64};
      return t;
    }
    case Isa::Avx2: {
      static const KernelTable t{&mm::avx2_kernels(),
                                 avx2::exp_n,
                                 avx2::rmsnorm,
                                 avx2::swiglu,
                                 &avx2::kAttn,
                                 probe_detail::fma_loop_avx2,
                                 8,
                                 probe_detail::int8_loop_avx2,
                                 32};
      return t;
    }
    case Isa::AvxVnni: {  // AVX2's table but for the integer tiles and their probe
      static const KernelTable t = [] {
        KernelTable k = kernel_table(Isa::Avx2);
        k.matmul = &mm::avxvnni_kernels();
        k.int8_loop = probe_detail::int8_loop_avxvnni;
        return k;
      }();
      return t;
    }
    case Isa::Scalar:
      break;
  }
  static const KernelTable scalar{.matmul = &mm::scalar_kernels(),
                                  .fma_loop = probe_detail::fma_loop_scalar};
  return scalar;
}

}  // namespace encore::kernels
