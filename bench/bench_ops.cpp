// Element-wise and attention kernels (kernels/ops.h) per ISA, one thread, at
// the shapes of a 1B model (TinyLlama: n_embd 2048, n_ff 5632, 32 query heads
// sharing 4 KV heads of 64 dims, vocabulary 32000): what the forward pass
// spends outside the matmuls. Inputs stay in cache; the numbers compare ISAs
// and versions of the kernels, not memory.
//
//   build-bench/bin/bench_ops [--benchmark_filter=attention]
//
// Counter: elem/s (elements of the main input per second; for attention,
// cached rows per second for one query head).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "encore/dtype.h"
#include "encore/isa.h"
#include "kernels/fp16.h"
#include "kernels/ops.h"

namespace {

using encore::DType;
using encore::Isa;
namespace k = encore::kernels;

std::vector<float> random_floats(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

bool skip(benchmark::State& state, Isa isa) {
  if (encore::isa_supported(isa)) return false;
  state.SkipWithError("ISA not supported by this CPU");
  return true;
}

void BM_RmsNorm(benchmark::State& state, Isa isa) {
  const int64_t n = 2048;
  const std::vector<float> x = random_floats(n, -2, 2, 1), w = random_floats(n, 0.5f, 1.5f, 2);
  std::vector<float> out(n);
  if (skip(state, isa)) return;
  for (auto _ : state) {
    k::rmsnorm(out.data(), x.data(), w.data(), n, 1e-5f, isa);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["elem/s"] =
      benchmark::Counter(static_cast<double>(n * state.iterations()), benchmark::Counter::kIsRate);
}

void BM_Swiglu(benchmark::State& state, Isa isa) {
  const int64_t n = 5632;
  const std::vector<float> g = random_floats(n, -6, 6, 3), u = random_floats(n, -2, 2, 4);
  std::vector<float> out(n);
  if (skip(state, isa)) return;
  for (auto _ : state) {
    k::swiglu(out.data(), g.data(), u.data(), n, isa);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["elem/s"] =
      benchmark::Counter(static_cast<double>(n * state.iterations()), benchmark::Counter::kIsRate);
}

void BM_ExpShifted(benchmark::State& state, Isa isa) {
  const int64_t n = 32000;  // the sampler's softmax over a vocabulary
  const std::vector<float> x = random_floats(n, -30, 10, 5);
  std::vector<float> y(n);
  if (skip(state, isa)) return;
  for (auto _ : state) {
    k::exp_shifted(y.data(), x.data(), 10.0f, n, isa);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["elem/s"] =
      benchmark::Counter(static_cast<double>(n * state.iterations()), benchmark::Counter::kIsRate);
}

// One KV head's 8 query heads over n_kv cached tokens in blocks of 16.
// n_tok query tokens at the end of n_kv cached ones (a prefill chunk: token
// i sees n_kv - n_tok + i + 1 rows); n_tok = 1 is one decode step.
void BM_Attention(benchmark::State& state, Isa isa, DType kv_type, int64_t n_kv, int n_tok) {
  constexpr int kHeadDim = 64, kGroup = 8, kKvHeads = 4, kBlock = 16;
  const int64_t row = int64_t{kKvHeads} * kHeadDim;
  const int64_t n_blocks = (n_kv + kBlock - 1) / kBlock;
  const size_t elem = kv_type == DType::F16 ? 2 : 4;
  const std::vector<float> kf = random_floats(n_blocks * kBlock * row, -1, 1, 6);
  const std::vector<float> vf = random_floats(n_blocks * kBlock * row, -1, 1, 7);
  std::vector<uint8_t> kb(kf.size() * elem), vb(vf.size() * elem);
  for (size_t i = 0; i < kf.size(); ++i) {
    if (kv_type == DType::F16) {
      const uint16_t hk = k::f32_to_fp16(kf[i]), hv = k::f32_to_fp16(vf[i]);
      std::memcpy(kb.data() + 2 * i, &hk, 2);
      std::memcpy(vb.data() + 2 * i, &hv, 2);
    } else {
      std::memcpy(kb.data() + 4 * i, &kf[i], 4);
      std::memcpy(vb.data() + 4 * i, &vf[i], 4);
    }
  }
  std::vector<const uint8_t*> kp(n_blocks), vp(n_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) {
    kp[b] = kb.data() + b * kBlock * row * elem;
    vp[b] = vb.data() + b * kBlock * row * elem;
  }
  const k::PagedKv kv{kp.data(), vp.data(), kv_type, kBlock, row};
  const int64_t qs = int64_t{kGroup} * kHeadDim;
  const std::vector<float> q = random_floats(n_tok * qs, -1, 1, 8);
  std::vector<float> scores(static_cast<size_t>(n_tok * kGroup * n_kv)), out(q.size());
  std::vector<int64_t> visible(static_cast<size_t>(n_tok));
  int64_t rows = 0;  // query-head rows scored per call
  for (int i = 0; i < n_tok; ++i) rows += (visible[i] = n_kv - n_tok + i + 1) * kGroup;
  if (skip(state, isa)) return;
  for (auto _ : state) {
    k::attention_tokens(q.data(), qs, n_tok, visible.data(), kGroup, kv, 1, kHeadDim, 0.125f,
                        scores.data(), out.data(), isa);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["elem/s"] = benchmark::Counter(static_cast<double>(rows * state.iterations()),
                                                benchmark::Counter::kIsRate);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const Isa isas[] = {Isa::Avx512, Isa::Avx2, Isa::Scalar};
  for (Isa isa : isas) {
    const std::string s = encore::isa_name(isa);
    benchmark::RegisterBenchmark(("BM_RmsNorm/" + s).c_str(), BM_RmsNorm, isa);
    benchmark::RegisterBenchmark(("BM_Swiglu/" + s).c_str(), BM_Swiglu, isa);
    benchmark::RegisterBenchmark(("BM_ExpShifted/" + s).c_str(), BM_ExpShifted, isa);
    for (DType t : {DType::F32, DType::F16}) {
      for (int64_t n_kv : {int64_t{100}, int64_t{2048}}) {
        for (int n_tok : {1, 16}) {
          const std::string name = fmt::format("BM_Attention/{}/kv={}/n_kv={}/tokens={}", s,
                                               encore::dtype_name(t), n_kv, n_tok);
          benchmark::RegisterBenchmark(name.c_str(), BM_Attention, isa, t, n_kv, n_tok);
        }
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
