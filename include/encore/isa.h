// Instruction-set selection for the compute kernels.
//
// Every kernel exists as a plain C++ "scalar" twin and as SIMD versions.
// All versions compute the same canonical operation order (see
// docs/invariance.md), so the ISA only changes speed, never a bit of output;
// tests run each ISA the CPU has and memcmp the results.
//
// Dispatch stays inside src/kernels (implemented in src/kernels/isa.cpp):
// callers pass an Isa value (chosen once,
// e.g. per ForwardContext) and the kernels pick their implementation.
// Nothing here is mutable global state: the CPU is queried on each call of
// detect_best_isa() (cheap CPUID), and the ENCORE_ISA override is read from the
// environment by isa_from_env() only when a caller asks for it.
// Thread-safety: all functions are pure/reentrant.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace encore {

enum class Isa : uint8_t {
  Scalar = 0,  // plain C++; the reference twin of every kernel
  Avx2 = 1,    // AVX2 + FMA + F16C + BMI2 (x86-64-v3)
  Avx512 = 2,  // AVX-512 F/BW/DQ/VL + VNNI (Ice Lake, Sapphire Rapids, Zen 4)
  // AVX2's kernels with AVX-VNNI's vpdpbusd on 256-bit registers in the
  // integer matmul (Alder Lake and later Intel cores without AVX-512, Zen 5).
  AvxVnni = 3,
};

// "scalar", "avx2", "avxvnni", "avx512".
const char* isa_name(Isa isa);
// Parses an ISA name (as isa_name prints it). Throws InvalidArgument naming
// the accepted values for anything else.
Isa parse_isa(std::string_view name);
// True if this CPU (and OS, for the AVX register state) can run `isa`.
bool isa_supported(Isa isa);
// The fastest ISA this CPU supports.
Isa detect_best_isa();
// Every ISA this CPU supports, scalar first, then from slowest to fastest
// (tests compare each against the scalar twin).
std::vector<Isa> supported_isas();
// The ISA to use by default: ENCORE_ISA if set (throws InvalidArgument when it
// names an unknown ISA or one this CPU lacks), else detect_best_isa().
Isa isa_from_env();

}  // namespace encore
