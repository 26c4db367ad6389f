// One table of kernels per ISA, chosen by kernel_table(): the only place in
// the kernels that switches on the ISA (as gemma.cpp keeps one table per
// target). A null entry means the scalar twin runs (ops.cpp,
// ops_attention.cpp, probe.cpp). Internal to src/kernels.
// Thread-safety: the tables are built once, on first use, and never change.
#pragma once

#include <cstdint>

#include "encore/isa.h"
#include "kernels/matmul_internal.h"
#include "kernels/ops_simd.h"

namespace encore::kernels {

struct KernelTable {
  const mm::IsaKernels* matmul = nullptr;
  void (*exp_n)(const float* x, float* y, int64_t n) = nullptr;
  void (*rmsnorm)(float* out, const float* x, const float* w, int64_t n, float eps) = nullptr;
  void (*swiglu)(float* out, const float* gate, const float* up, int64_t n) = nullptr;
  const AttnKernels* attn = nullptr;
  // The probes of `encore bench`: kFmaChains FMA chains of fma_lanes lanes,
  // and kIntChains int8 dot-product chains of int8_products products (none
  // for scalar code).
  float (*fma_loop)(int64_t iters) = nullptr;
  int fma_lanes = 1;
  int32_t (*int8_loop)(int64_t iters) = nullptr;
  int int8_products = 0;
};

// The caller has checked isa_supported(isa): a SIMD table is built by code
// of its ISA.
const KernelTable& kernel_table(Isa isa);

}  // namespace encore::kernels
