// in_register, for the kernels of every SIMD ISA (included by panel_kernel.h
// in the AVX2, AVX-VNNI and AVX-512 translation units). In an anonymous
// namespace: each file gets its own copy, compiled for its own ISA (one
// shared inline copy could be the AVX-512 one, called from the AVX2 kernels).
// Thread-safety: pure functions.
#pragma once

namespace encore::kernels::mm {
namespace {

// v, kept in a register. The empty asm, which GCC 12 must assume changes v,
// pins v where it stands in the program:
// - GCC would otherwise reassociate a chain of integer sums and compute
//   every term first, which spilled half of them with AVX2's 16 registers
//   (panel_kernel.h, where each partial sum passes through it);
// - nor can it fold a load into every instruction that uses the loaded
//   value (a float sub-tile once loaded an operand per FMA that way).
// Speed only: the same operations on the same values.
template <class V>
inline V in_register(V v) {
  asm("" : "+v"(v));  // any vector register (zmm16-31 too)
  return v;
}

}  // namespace
}  // namespace encore::kernels::mm
