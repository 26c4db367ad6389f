#include "encore/isa.h"

#include <cpuid.h>

#include <cstdlib>
#include <string>

#include "encore/error.h"

namespace encore {
namespace {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx_vnni = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512vnni = false;
  bool os_avx = false, os_avx512 = false;
};

CpuFeatures query_cpu() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(1, 0, a, b, c, d);
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  const bool osxsave = (c >> 27) & 1;
  if (osxsave) {
    // XCR0: bits 1-2 = SSE/AVX state, bits 5-7 = AVX-512 state saved by the OS.
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f.os_avx = (lo & 0x6u) == 0x6u;
    f.os_avx512 = f.os_avx && (lo & 0xe0u) == 0xe0u;
  }
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned max_subleaf = a;
  f.avx2 = (b >> 5) & 1;
  f.bmi2 = (b >> 8) & 1;
  f.avx512f = (b >> 16) & 1;
  f.avx512dq = (b >> 17) & 1;
  f.avx512bw = (b >> 30) & 1;
  f.avx512vl = (b >> 31) & 1;
  f.avx512vnni = (c >> 11) & 1;
  if (max_subleaf >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx_vnni = (a >> 4) & 1;  // VEX-encoded: AVX's OS state (os_avx) suffices
  }
  return f;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::AvxVnni:
      return "avxvnni";
    case Isa::Avx512:
      return "avx512";
  }
  return "unknown";
}

Isa parse_isa(std::string_view name) {
  if (name == "scalar") return Isa::Scalar;
  if (name == "avx2") return Isa::Avx2;
  if (name == "avxvnni") return Isa::AvxVnni;
  if (name == "avx512") return Isa::Avx512;
  throw InvalidArgument("unknown instruction set '" + std::string(name) +
                        "': expected scalar, avx2, avxvnni or avx512");
}

bool isa_supported(Isa isa) {
  const CpuFeatures f = query_cpu();
  // The *_avx2.cpp files are also compiled with -mbmi2 (GCC emits shlx etc.).
  const bool avx2 = f.os_avx && f.avx2 && f.fma && f.f16c && f.bmi2;
  switch (isa) {
    case Isa::Scalar:
      return true;
    case Isa::Avx2:
      return avx2;
    case Isa::AvxVnni:
      return avx2 && f.avx_vnni;
    case Isa::Avx512:
      return avx2 && f.os_avx512 && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl &&
             f.avx512vnni;
  }
  return false;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512}) {  // slowest first
    if (isa_supported(i)) v.push_back(i);
  }
  return v;
}

Isa detect_best_isa() { return supported_isas().back(); }  // scalar is always there

Isa isa_from_env() {
  const char* env = std::getenv("ENCORE_ISA");
  if (env == nullptr || *env == '\0') return detect_best_isa();
  const Isa isa = parse_isa(env);
  if (!isa_supported(isa)) {
    throw InvalidArgument(std::string("ENCORE_ISA=") + env +
                          ": this CPU does not support that instruction set (best here: " +
                          isa_name(detect_best_isa()) + ")");
  }
  return isa;
}

}  // namespace encore
