// Per-ISA inner loops of the probes (probe_avx2.cpp, probe_avx512.cpp).
// Each runs `iters` iterations of independent instruction chains and returns
// a value derived from the accumulators, so the work cannot be optimised away.
#pragma once

#include <cstdint>

namespace encore::kernels::probe_detail {

// Flops per iteration: kFmaChains * lanes * 2.
inline constexpr int kFmaChains = 12;
float fma_loop_scalar(int64_t iters);  // 1 lane (probe.cpp)
float fma_loop_avx2(int64_t iters);    // 8 lanes
float fma_loop_avx512(int64_t iters);  // 16 lanes
// Products per iteration: kIntChains * 32 (avx2) or * 64 (avx512).
inline constexpr int kIntChains = 8;
int32_t int8_loop_avx2(int64_t iters);
int32_t int8_loop_avxvnni(int64_t iters);  // 32 products, as avx2's
int32_t int8_loop_avx512(int64_t iters);

}  // namespace encore::kernels::probe_detail
