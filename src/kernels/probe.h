// Machine probes for `encore bench`: memory read bandwidth and the compute
// peak of the FMA and int8 dot-product units, measured (not looked up), so a
// benchmark can say how far a kernel is from what this machine can do.
//
// Cost: each probe runs for a fraction of a second on every thread of the
// pool; measure_read_bandwidth also allocates and touches `bytes` once.
// Thread-safety: use the ThreadPool from one thread at a time, as always.
#pragma once

#include <cstddef>

#include "encore/isa.h"

namespace encore {
class ThreadPool;
}

namespace encore::kernels {

// Best rate (GB/s, 1e9 bytes) over 9 passes at which the pool's threads
// together read a buffer of `bytes` (pick it well above the last-level
// cache), each thread streaming its own contiguous share as the matmul
// kernels read weights, with and without software prefetch.
double measure_read_bandwidth(ThreadPool& threads, size_t bytes);

// Peak float multiply-add throughput in GFLOP/s (2 flops per lane per FMA)
// with the widest FMA of `isa` on every thread (scalar: std::fma chains).
double measure_fma_gflops(ThreadPool& threads, Isa isa);

// Peak int8 multiply-accumulate throughput in GOP/s (2 ops per u8*s8
// product): AVX-512 VNNI vpdpbusd, or AVX2 vpmaddubsw + vpmaddwd + vpaddd
// (what the int8 kernels use there); 0 for scalar.
double measure_int8_gops(ThreadPool& threads, Isa isa);

}  // namespace encore::kernels
