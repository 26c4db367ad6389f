// matmul throughput per weight type, ISA and batch size, against the
// machine's read bandwidth.
//
//   build-bench/bin/bench_matmul [--benchmark_filter=Q4_K] [--threads=N]
//
// BM_ReadBandwidth: N threads sum a 1 GiB buffer (the reference bandwidth).
// BM_Matmul/<type>/<isa>/m=<m>/<set>:
//   set "layers": one pass over every matrix of many 1B-sized transformer
//     layers (K=2048 -> 2048, 256, 256, 2048, 5632, 5632; K=5632 -> 2048),
//     copied until they fill >= 1 GiB, so weights stream from DRAM (this
//     CPU's L3 is far too big for a single model-sized matrix set to miss it).
//   set "hot": one 2048 x 2048 matrix, which stays in the L2 caches of two
//     cores, so the kernel's arithmetic, not DRAM, sets the pace: the
//     ceiling a decode kernel (m = 1, or 8 streams at m = 8) could reach
//     with unlimited bandwidth.
//   set "output": the 32000 x 2048 output matrix, copied the same way.
//   set "gate1": one 5632 x 2048 matrix (m = 512 only: compute-bound).
// Counters: GB/s of weight bytes read, %bw (that against BM_ReadBandwidth of
// the same thread count, measured once at start), GOP/s (2 * m * rows * K).
// Weight matrices are real quantize_row output; the copies share content but
// not addresses, which is all the caches see.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "encore/dtype.h"
#include "encore/isa.h"
#include "encore/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/quants.h"

namespace {

using encore::DType;
using encore::Isa;
using encore::ThreadPool;
using encore::kernels::WeightView;

constexpr int64_t kGiB = int64_t{1} << 30;
int g_threads = 2;

struct Shape {
  int64_t rows, cols;
};

const std::vector<Shape> kLayer = {{2048, 2048}, {256, 2048},  {256, 2048}, {2048, 2048},
                                   {5632, 2048}, {5632, 2048}, {2048, 5632}};
const std::vector<Shape> kOutput = {{32000, 2048}};
const std::vector<Shape> kGate = {{5632, 2048}};
const std::vector<Shape> kHot = {{2048, 2048}};

// A set of weight matrices in one buffer, repeated to at least min_bytes.
struct MatrixSet {
  std::vector<std::vector<uint8_t>> protos;  // one GGUF matrix per shape
  std::vector<uint8_t> bytes;                // the copies: repacked panels
  std::vector<WeightView> views;
  int64_t macs_per_row = 0;  // sum of rows * cols over views
  int64_t max_rows = 0, max_cols = 0;
};

std::unique_ptr<MatrixSet> build_set(DType t, const std::vector<Shape>& shapes, int64_t min_bytes) {
  auto set = std::make_unique<MatrixSet>();
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // One real matrix per shape.
  std::vector<std::vector<uint8_t>> protos;
  int64_t unit = 0;
  for (const Shape& s : shapes) {
    const size_t rb = encore::dtype_row_bytes(t, static_cast<uint64_t>(s.cols));
    std::vector<uint8_t> m(rb * s.rows);
    std::vector<float> row(static_cast<size_t>(s.cols));
    for (int64_t r = 0; r < s.rows; ++r) {
      for (auto& v : row) v = nd(rng);
      encore::kernels::quantize_row(t, row.data(), m.data() + r * rb, s.cols);
    }
    const size_t packed = encore::kernels::repacked_bytes(t, s.rows, s.cols);
    unit += static_cast<int64_t>(packed != 0 ? packed : m.size());
    protos.push_back(std::move(m));
  }
  const int64_t copies = std::max<int64_t>(1, (min_bytes + unit - 1) / unit);
  set->bytes.resize(static_cast<size_t>(copies * unit));
  size_t off = 0;
  for (int64_t c = 0; c < copies; ++c) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      // As the model keeps them: matrices repacked into panels (what matmul
      // reads).
      const size_t rb = encore::dtype_row_bytes(t, static_cast<uint64_t>(shapes[i].cols));
      WeightView v{t, protos[i].data(), shapes[i].rows, shapes[i].cols, rb};
      const size_t packed = encore::kernels::repacked_bytes(t, v.rows, v.cols);
      if (packed != 0) {
        const int64_t n_panels = encore::kernels::panel_count(v.rows);
        encore::kernels::repack_panels(v, set->bytes.data() + off, 0, n_panels);
        v.panels = set->bytes.data() + off;
      } else {
        std::memcpy(set->bytes.data() + off, protos[i].data(), protos[i].size());
        v.data = set->bytes.data() + off;
      }
      set->views.push_back(v);
      set->macs_per_row += shapes[i].rows * shapes[i].cols;
      set->max_rows = std::max(set->max_rows, shapes[i].rows);
      set->max_cols = std::max(set->max_cols, shapes[i].cols);
      off += packed != 0 ? packed : protos[i].size();
    }
  }
  set->protos = std::move(protos);
  return set;
}

// The most recently built set, kept while consecutive benchmarks share it.
struct SetCache {
  DType type{};
  const std::vector<Shape>* shapes = nullptr;
  int64_t min_bytes = 0;
  std::unique_ptr<MatrixSet> set;
} g_cache;

const MatrixSet& get_set(DType t, const std::vector<Shape>& shapes, int64_t min_bytes) {
  if (!g_cache.set || g_cache.type != t || g_cache.shapes != &shapes ||
      g_cache.min_bytes != min_bytes) {
    g_cache.set.reset();
    g_cache.set = build_set(t, shapes, min_bytes);
    g_cache.type = t;
    g_cache.shapes = &shapes;
    g_cache.min_bytes = min_bytes;
  }
  return *g_cache.set;
}

uint64_t read_sum(const uint64_t* p, int64_t n) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (int64_t i = 0; i + 4 <= n; i += 4) {
    a0 += p[i];
    a1 += p[i + 1];
    a2 += p[i + 2];
    a3 += p[i + 3];
  }
  return a0 + a1 + a2 + a3;
}

double g_bandwidth = 0;  // bytes/s of the read-sum reference

void BM_ReadBandwidth(benchmark::State& state) {
  const int64_t n = kGiB / 8;
  std::vector<uint64_t> buf(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<uint64_t>(i);
  ThreadPool pool(g_threads);
  std::vector<uint64_t> sums(static_cast<size_t>(g_threads));
  for (auto _ : state) {
    pool.parallel_for(g_threads, [&](int64_t b, int64_t e, int) {
      for (int64_t c = b; c < e; ++c) {
        sums[c] = read_sum(buf.data() + n * c / g_threads, n / g_threads);
      }
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(kGiB) * state.iterations() / 1e9,
                                              benchmark::Counter::kIsRate);
}

double measure_bandwidth() {
  const int64_t n = kGiB / 8;
  std::vector<uint64_t> buf(static_cast<size_t>(n), 1);
  ThreadPool pool(g_threads);
  std::vector<uint64_t> sums(static_cast<size_t>(g_threads));
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(g_threads, [&](int64_t b, int64_t e, int) {
      for (int64_t c = b; c < e; ++c) {
        sums[c] = read_sum(buf.data() + n * c / g_threads, n / g_threads);
      }
    });
    benchmark::DoNotOptimize(sums.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(kGiB) / s);
  }
  return best;
}

void BM_Matmul(benchmark::State& state, DType t, Isa isa, int64_t m,
               const std::vector<Shape>* shapes, int64_t min_bytes) {
  if (!encore::isa_supported(isa)) {
    state.SkipWithError("ISA not supported by this CPU");
    return;
  }
  const MatrixSet& set = get_set(t, *shapes, min_bytes);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * set.max_cols));  // [m, max_cols]
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(static_cast<size_t>(m * set.max_rows));  // [m, max_rows]
  ThreadPool pool(g_threads);
  encore::kernels::MatmulScratch scratch;  // kept across calls, as ForwardContext does
  for (auto _ : state) {
    for (const WeightView& w : set.views) {
      encore::kernels::matmul(w, x.data(), y.data(), m, &pool, isa, &scratch);
    }
    benchmark::ClobberMemory();
  }
  const double bytes = static_cast<double>(set.bytes.size());
  const double iters = static_cast<double>(state.iterations());
  using C = benchmark::Counter;
  state.counters["GB/s"] = C(bytes * iters / 1e9, C::kIsRate);
  state.counters["%bw"] = C(bytes * iters * 100.0 / g_bandwidth, C::kIsRate);
  state.counters["GOP/s"] =
      C(2.0 * static_cast<double>(m) * static_cast<double>(set.macs_per_row) * iters / 1e9,
        C::kIsRate);
}

}  // namespace

int main(int argc, char** argv) {
  // --threads=N is ours; the rest goes to Google Benchmark.
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      g_threads = std::max(1, std::atoi(argv[i] + 10));
    } else {
      args.push_back(argv[i]);
    }
  }
  int n_args = static_cast<int>(args.size());
  benchmark::Initialize(&n_args, args.data());
  g_bandwidth = measure_bandwidth();
  fmt::print(stderr, "threads={} reference read bandwidth: {:.2f} GB/s\n", g_threads,
             g_bandwidth / 1e9);

  benchmark::RegisterBenchmark("BM_ReadBandwidth", BM_ReadBandwidth)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  const DType types[] = {DType::Q8_0, DType::Q4_K, DType::Q4_0, DType::Q6_K,
                         DType::Q5_K, DType::F16,  DType::F32,  DType::BF16};
  const Isa isas[] = {Isa::Avx512, Isa::AvxVnni, Isa::Avx2, Isa::Scalar};
  for (DType t : types) {
    struct Case {
      int64_t m;
      const std::vector<Shape>* shapes;
      const char* name;
      int64_t min_bytes;
    };
    const Case cases[] = {{1, &kLayer, "layers", kGiB},  {1, &kHot, "hot", 0},
                          {8, &kLayer, "layers", kGiB},  {8, &kHot, "hot", 0},
                          {1, &kOutput, "output", kGiB}, {512, &kGate, "gate1", 0}};
    for (const Case& c : cases) {
      for (Isa isa : isas) {
        if (isa == Isa::Scalar && c.m != 1) continue;  // far too slow to be worth timing
        const std::string name = fmt::format("BM_Matmul/{}/{}/m={}/{}", encore::dtype_name(t),
                                             encore::isa_name(isa), c.m, c.name);
        benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, t, isa, c.m, c.shapes, c.min_bytes)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.5);
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
