// matmul (src/kernels/matmul.h): every ISA equals the scalar twin bit for bit,
// results do not depend on the batch size, the batch's other rows or the
// thread count, the numbers are accurate, and odd inputs do not crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "encore/dtype.h"
#include "encore/error.h"
#include "encore/isa.h"
#include "encore/thread_pool.h"
#include "kernels/canonical.h"
#include "kernels/fp16.h"
#include "kernels/matmul.h"
#include "kernels/matmul_internal.h"
#include "kernels/quants.h"
#include "quant_test_util.h"

namespace encore::kernels {
namespace {

using test::same_bits;

const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,
                        DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                        DType::Q4_K, DType::Q5_K, DType::Q6_K};

bool is_k_quant(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }
bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Column counts to try per type: block multiples, plus float tails.
std::vector<int64_t> cols_for(DType t) {
  if (is_k_quant(t)) return {256, 768};
  if (is_float(t)) return {8, 67, 83, 172, 256};  // 83: an odd 16-value step before the tail
  // 512: whole groups of eight blocks, the last one ending the row (the
  // AVX-512 direct kernels' row-end load).
  return {32, 96, 288, 448, 480, 512};
}

struct Weights {
  DType type;
  int64_t rows, cols;
  std::vector<float> storage;  // float-aligned backing bytes
  WeightView view;
};

Weights make_weights(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Weights w{t, rows, cols, {}, {}};
  const size_t row_bytes = dtype_row_bytes(t, static_cast<uint64_t>(cols));
  w.storage.resize((row_bytes * rows + 3) / 4 + 1);
  auto* bytes = reinterpret_cast<uint8_t*>(w.storage.data());
  std::vector<float> src(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : src) v = nd(rng);
    quantize_row(t, src.data(), bytes + r * row_bytes, cols);
  }
  w.view = WeightView{t, bytes, rows, cols, row_bytes};
  return w;
}

std::vector<float> run(const Weights& w, const std::vector<float>& x, int64_t m, Isa isa,
                       ThreadPool* pool = nullptr) {
  std::vector<float> y(static_cast<size_t>(m * w.rows), -1.0f);
  matmul(w.view, x.data(), y.data(), m, pool, isa);
  return y;
}

// Every ISA this CPU has gives the scalar twin's bits for `w` times the
// first `m` rows of `x`.
void expect_isas_equal_scalar(const Weights& w, const std::vector<float>& x, int64_t m) {
  const std::vector<float> xm(x.begin(), x.begin() + m * w.cols);
  const auto ref = run(w, xm, m, Isa::Scalar);
  for (Isa isa : supported_isas()) {
    EXPECT_TRUE(same_bits(run(w, xm, m, isa), ref))
        << dtype_name(w.type) << " cols=" << w.cols << " m=" << m << " isa=" << isa_name(isa);
  }
}

TEST(Matmul, EveryIsaEqualsScalarTwin) {
  for (DType t : kTypes) {
    for (int64_t cols : cols_for(t)) {
      const Weights w = make_weights(t, 13, cols, 1);
      // m = 6: decode-sized (one panel per block for the quantised types,
      // one float tile of activation rows); m = 12 and 70: blocks of 4
      // quantised panels, float tiles of 12 (AVX-512) or 6 (AVX2)
      // activation rows and a partial one, 70 in two chunks of rows.
      for (int64_t m : {int64_t{6}, int64_t{12}, int64_t{70}}) {
        expect_isas_equal_scalar(w, test::random_acts(m, cols, 2), m);
      }
    }
  }
}

// Decode-sized batches: each m and tile shape against the scalar twin, with
// the edge rows (zeros, huge, tiny, NaN, inf) among them.
TEST(Matmul, SmallBatchesEqualScalarTwin) {
  const float inf = std::numeric_limits<float>::infinity();
  for (DType t : kTypes) {
    for (int64_t cols : cols_for(t)) {
      const Weights w = make_weights(t, 14, cols, 21);  // a padded panel (2 rows unused)
      auto x = test::random_acts(8, cols, 22);
      for (int64_t k = 0; k < cols; ++k) {
        x[1 * cols + k] *= 1e30f;
        x[2 * cols + k] *= (k % 64 < 32) ? 1e-30f : 1e-42f;
        if (k < 32) x[3 * cols + k] = 0.0f;
      }
      x[5 * cols + cols / 2] = std::numeric_limits<float>::quiet_NaN();
      x[6 * cols + 1] = inf;
      for (int64_t m = 1; m <= 8; ++m) expect_isas_equal_scalar(w, x, m);
    }
  }
}

// Weights of random block bytes (fp16 scales and mins kept finite): values
// quantize_row never makes, such as negative Q6_K scales, Q6_K q = -32,
// Q8_0 -128 and every bit pattern of the high bits, against the scalar twin.
Weights random_block_weights(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  Weights w{t, rows, cols, {}, {}};
  const size_t row_bytes = dtype_row_bytes(t, static_cast<uint64_t>(cols));
  w.storage.resize((row_bytes * rows + 3) / 4 + 1);
  auto* bytes = reinterpret_cast<uint8_t*>(w.storage.data());
  test::fill_random_blocks(t, bytes, row_bytes * rows, seed);
  w.view = WeightView{t, bytes, rows, cols, row_bytes};
  return w;
}

TEST(Matmul, RandomBlockBytesEqualScalarTwin) {
  for (DType t : kTypes) {
    if (is_float(t)) continue;
    for (int64_t cols : cols_for(t)) {
      // 11 rows: tiles of 4 and 3 weight rows (13 and 14 rows above: 4, 1 and 2)
      const Weights w = random_block_weights(t, 11, cols, 31);
      const auto x = test::random_acts(8, cols, 32);
      for (int64_t m : {1, 2, 3, 5, 8}) expect_isas_equal_scalar(w, x, m);
    }
  }
}

// The model keeps every matrix repacked (WeightView::panels), float types
// included: matmul reads those panels, not the rows (a changed panel value
// changes exactly its own output), and gives the same bits as a view it
// repacks on the fly, on every ISA, for decode and prefill batches.
TEST(Matmul, RepackedPanelsAreWhatMatmulReads) {
  for (DType t : kTypes) {
    const int64_t cols = cols_for(t).back(), rows = 21;
    const Weights w = make_weights(t, rows, cols, 51);
    std::vector<uint8_t> panels(repacked_bytes(t, rows, cols));
    ASSERT_GT(panels.size(), 0u) << dtype_name(t);
    repack_panels(w.view, panels.data(), 0, panel_count(rows));
    WeightView packed = w.view;
    packed.panels = panels.data();
    for (int64_t m : {int64_t{1}, int64_t{5}, int64_t{30}}) {
      const auto x = test::random_acts(m, cols, 52);
      for (Isa isa : supported_isas()) {
        std::vector<float> y0(static_cast<size_t>(m * rows)), y1(y0.size());
        matmul(w.view, x.data(), y0.data(), m, nullptr, isa);
        matmul(packed, x.data(), y1.data(), m, nullptr, isa);
        EXPECT_TRUE(same_bits(y0, y1)) << dtype_name(t) << " m=" << m << " " << isa_name(isa);
      }
    }
    if (!is_float(t)) continue;
    // Row 17 is row 1 of panel 1; its first value (chain 0, position 0) is
    // the panel's bytes [2 or 4 per value] * 1 from the panel's start.
    const size_t e = t == DType::F32 ? 4 : 2;
    uint8_t* v = panels.data() + panels.size() / panel_count(rows) + 1 * e;
    v[e - 1] ^= 0x40;  // a high exponent bit: a far larger or smaller weight
    const auto x = test::random_acts(1, cols, 53);
    for (Isa isa : supported_isas()) {
      std::vector<float> y0(static_cast<size_t>(rows)), y1(y0.size());
      matmul(w.view, x.data(), y0.data(), 1, nullptr, isa);
      matmul(packed, x.data(), y1.data(), 1, nullptr, isa);
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(y0[r] != y1[r], r == 17) << dtype_name(t) << " row " << r << " " << isa_name(isa);
      }
    }
  }
}

TEST(Matmul, BatchInvariance) {
  const int64_t ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 33};
  for (DType t : kTypes) {
    const int64_t cols = cols_for(t).back();
    const Weights w = make_weights(t, 11, cols, 3);
    const auto x = test::random_acts(33, cols, 4);
    for (Isa isa : supported_isas()) {
      // The m = 1 result of each activation row.
      std::vector<float> single(static_cast<size_t>(33 * w.rows));
      for (int64_t i = 0; i < 33; ++i) {
        std::vector<float> xi(x.begin() + i * cols, x.begin() + (i + 1) * cols);
        const auto yi = run(w, xi, 1, isa);
        std::copy(yi.begin(), yi.end(), single.begin() + i * w.rows);
      }
      for (int64_t m : ms) {
        // Batch rows start at an offset so that each row meets different
        // neighbours than in other batches.
        const int64_t off = (m * 7) % (34 - m);
        std::vector<float> xb(x.begin() + off * cols, x.begin() + (off + m) * cols);
        const auto y = run(w, xb, m, isa);
        EXPECT_EQ(std::memcmp(y.data(), single.data() + off * w.rows, y.size() * sizeof(float)), 0)
            << dtype_name(t) << " m=" << m << " isa=" << isa_name(isa);
      }
    }
  }
}

// m = 5: decode-sized (activations prepared on the caller, one range of
// panels per thread); m = 20: prefill-sized (activations prepared on every
// thread, panels taken in chunks).
TEST(Matmul, ThreadCountInvariance) {
  ThreadPool p1(1), p2(2), p3(3);
  for (DType t : kTypes) {
    const int64_t cols = is_float(t) ? 172 : 512;
    const Weights w = make_weights(t, 37, cols, 5);  // 37 * 512 * 5 > kMinParallelWork
    for (int64_t m : {int64_t{5}, int64_t{20}}) {
      const auto x = test::random_acts(m, cols, 6);
      for (Isa isa : supported_isas()) {
        const auto ref = run(w, x, m, isa, nullptr);
        for (ThreadPool* p : {&p1, &p2, &p3}) {
          EXPECT_TRUE(same_bits(run(w, x, m, isa, p), ref))
              << dtype_name(t) << " m=" << m << " threads=" << p->size()
              << " isa=" << isa_name(isa);
        }
      }
    }
  }
}

// matmul_many (Q/K/V, gate/up) prepares the activations once and splits the
// matrices' panels, laid end to end, across the threads in one pass: each
// output must still be its own matmul's bits, for integer and float
// matrices mixed in one call (with an empty one), decode- and prefill-sized
// batches, ranges and chunks of panels that cross from one matrix into the
// next (2 and 3 threads: 19 integer and 13 float panels), and row counts
// that pad their last panel.
TEST(Matmul, ManyMatricesOfOneInputEqualOneCallEach) {
  ThreadPool p2(2), p3(3);
  const int64_t cols = 512;
  std::vector<Weights> ws;
  ws.push_back(make_weights(DType::Q4_K, 100, cols, 11));
  ws.push_back(make_weights(DType::F16, 100, cols, 12));
  ws.push_back(make_weights(DType::Q6_K, 37, cols, 13));
  ws.push_back(make_weights(DType::Q8_0, 130, cols, 14));
  ws.push_back(make_weights(DType::Q8_0, 0, cols, 17));
  ws.push_back(make_weights(DType::F32, 90, cols, 15));
  for (int64_t m : {int64_t{1}, int64_t{5}, int64_t{12}, int64_t{70}}) {
    const auto x = test::random_acts(m, cols, 16);
    for (Isa isa : supported_isas()) {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &p2, &p3}) {
        std::vector<std::vector<float>> ys;
        std::vector<MatmulOut> outs;
        for (const Weights& w : ws) ys.emplace_back(static_cast<size_t>(m * w.rows), -1.0f);
        for (size_t j = 0; j < ws.size(); ++j) outs.push_back({&ws[j].view, ys[j].data()});
        MatmulScratch scratch;
        matmul_many(outs, x.data(), m, p, isa, &scratch);
        for (size_t j = 0; j < ws.size(); ++j) {
          EXPECT_TRUE(same_bits(ys[j], run(ws[j], x, m, isa, p)))
              << dtype_name(ws[j].type) << " (entry " << j << ") m=" << m
              << " threads=" << (p != nullptr ? p->size() : 0) << " isa=" << isa_name(isa);
        }
      }
    }
  }
  // Matrices of other widths cannot share one prepared input.
  const Weights narrow = make_weights(DType::Q8_0, 16, 256, 18);
  std::vector<float> y0(16 * 100), y1(16 * 16);
  const MatmulOut mixed[] = {{&ws[0].view, y0.data()}, {&narrow.view, y1.data()}};
  EXPECT_THROW(matmul_many(mixed, test::random_acts(1, cols, 19).data(), 1, nullptr, Isa::Scalar),
               InvalidArgument);
}

// The float path runs one chain at a time over float panels, in blocks of
// panels, chunks of activation rows and register tiles (matmul.cpp,
// float_panel_kernel.h): every output must still be dot_canonical of its
// whole rows, on every ISA, the scalar twin included. Shapes cross every
// edge: K = 2131 = 16 * 133 + 3 has chains of two lengths, K = 2048 equal
// ones; 70 and 71 rows are 5 panels, the last one padded (one thread; two
// take them in chunks of one panel), 53 activation rows a 48-row chunk plus 5, in tiles of
// 12 (AVX-512) or 6 (AVX2) and partial ones; the activations start on a
// cache line and one float past it.
TEST(Matmul, BlockedFloatPathEqualsDotCanonical) {
  const int64_t m = 53;
  ThreadPool pool(2);
  // Kept across every call below, as ForwardContext keeps it: a K = 2048 call
  // then finds the buffers of a K = 2131 one (stale contents must not count).
  MatmulScratch scratch;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{70, 2131}, {70, 2048}, {71, 2131}, {71, 2048}}) {
      const Weights w = make_weights(t, rows, cols, 31);
      const auto acts = test::random_acts(m, cols, 32);
      std::vector<float> x_buf(static_cast<size_t>(m * cols + 32));
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t shift : {0, 1}) {
        float* x = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(x_buf.data()) + 63) &
                                            ~uintptr_t{63}) +
                   shift;
        std::copy(acts.begin(), acts.end(), x);
        for (Isa isa : supported_isas()) {
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
            std::vector<float> y(static_cast<size_t>(m * rows), -1.0f);
            matmul(w.view, x, y.data(), m, p, isa, p != nullptr ? &scratch : nullptr);
            int bad = 0;
            for (int64_t r = 0; r < rows; ++r) {
              get_row(w.view, r, row.data());
              for (int64_t i = 0; i < m; ++i) {
                const float ref = dot_canonical(row.data(), x + i * cols, cols);
                if (std::bit_cast<uint32_t>(y[i * rows + r]) != std::bit_cast<uint32_t>(ref)) ++bad;
              }
            }
            EXPECT_EQ(bad, 0) << dtype_name(t) << " rows=" << rows << " cols=" << cols
                              << " isa=" << isa_name(isa) << " shift=" << shift
                              << " threads=" << (p ? 2 : 1);
          }
        }
      }
    }
  }
}

// A MatmulScratch kept between calls holds capacity only: whatever an
// earlier call (or anything else) left in it never reaches an output. Here
// every buffer starts out filled with junk (int8 77, float NaN) and the
// outputs must equal those of a call with fresh buffers, bit for bit, for
// decode-sized batches (m = 3) and blocks of panels (m = 12, 70); K leaves
// padding up to the next 256 (32, 480) or none (256). Fails when the float
// path reads a panel byte or an activation it did not write, or the
// integer path a panel byte or an activation sum. The
// buffers must still be the junk-filled ones after the call: a buffer
// that grew would be fresh and prove nothing.
TEST(Matmul, ScratchContentsNeverReachTheOutput) {
  ThreadPool pool(2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType t : kTypes) {
    const std::vector<int64_t> cols_list =
        is_k_quant(t)
            ? std::vector<int64_t>{256, 768}
            : (is_float(t) ? std::vector<int64_t>{67, 256} : std::vector<int64_t>{32, 480});
    for (int64_t cols : cols_list) {
      const Weights w = make_weights(t, 13, cols, 41);
      for (int64_t m : {int64_t{3}, int64_t{12}, int64_t{70}}) {
        const auto x = test::random_acts(m, cols, 42);
        for (Isa isa : supported_isas()) {
          const auto ref = run(w, x, m, isa, &pool);
          MatmulScratch s;
          const size_t n = 1 << 17;
          s.x.assign(n, nan);
          s.act_q.assign(n, int8_t{77});
          s.act_f.assign(n, nan);
          s.act_i.assign(n, 0x12345678);
          s.threads.resize(2);
          for (auto& ts : s.threads) {
            ts.out.assign(n, nan);
            ts.panels.assign(n, uint8_t{77});
          }
          std::vector<float> y(static_cast<size_t>(m * w.rows), -1.0f);
          matmul(w.view, x.data(), y.data(), m, &pool, isa, &s);
          ASSERT_EQ(s.x.size(), n);
          ASSERT_EQ(s.act_q.size(), n);
          ASSERT_EQ(s.act_f.size(), n);
          ASSERT_EQ(s.act_i.size(), n);
          for (const auto& ts : s.threads) {
            ASSERT_EQ(ts.out.size(), n);
            ASSERT_EQ(ts.panels.size(), n);
          }
          EXPECT_TRUE(same_bits(y, ref))
              << dtype_name(t) << " cols=" << cols << " m=" << m << " isa=" << isa_name(isa);
        }
      }
    }
  }
}

// Accuracy against a double dot over the dequantised weights and the original
// float activations. Float types: |err| <= 1e-5 * sum|w x| (a few float
// roundings per term). Integer types: each activation is rounded to a step of
// da = amax_g / 127 of its 32-value group, so |err| <= sum_k |w_k| * amax_g /
// 254; we allow that bound * 1.01 + 1e-5 * sum|w x| for the float sums.
TEST(Matmul, AccuracyAgainstDouble) {
  for (DType t : kTypes) {
    const int64_t cols = cols_for(t).back();
    const Weights w = make_weights(t, 9, cols, 7);
    const int64_t m = 3;
    const auto x = test::random_acts(m, cols, 8);
    const auto y = run(w, x, m, isa_supported(Isa::Avx512) ? Isa::Avx512 : Isa::Scalar);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < w.rows; ++r) {
      get_row(w.view, r, row.data());
      for (int64_t i = 0; i < m; ++i) {
        const float* xi = x.data() + i * cols;
        double ref = 0, l1 = 0, qbound = 0;
        for (int64_t k = 0; k < cols; ++k) {
          ref += static_cast<double>(row[k]) * xi[k];
          l1 += std::fabs(static_cast<double>(row[k]) * xi[k]);
        }
        if (!is_float(t)) {
          for (int64_t g = 0; g < cols / 32; ++g) {
            double amax = 0, wsum = 0;
            for (int k = 0; k < 32; ++k) {
              amax = std::max(amax, std::fabs(static_cast<double>(xi[32 * g + k])));
              wsum += std::fabs(static_cast<double>(row[32 * g + k]));
            }
            qbound += wsum * amax / 254.0;
          }
        }
        const double tol = qbound * 1.01 + 1e-5 * l1;
        EXPECT_LE(std::fabs(y[i * w.rows + r] - ref), tol)
            << dtype_name(t) << " r=" << r << " i=" << i << " ref=" << ref;
      }
    }
  }
}

TEST(Matmul, EdgeValuesAreIdenticalAcrossIsas) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType t : kTypes) {
    const int64_t cols = is_k_quant(t) ? 512 : 256;
    const Weights w = make_weights(t, 6, cols, 9);
    const int64_t m = 7;
    auto x = test::random_acts(m, cols, 10);
    for (int64_t k = 0; k < cols; ++k) {
      x[0 * cols + k] = 0.0f;                              // all-zero row
      if (k < 64) x[1 * cols + k] = 0.0f;                  // zero groups
      x[2 * cols + k] *= 1e30f;                            // huge
      x[3 * cols + k] *= (k % 64 < 32) ? 1e-30f : 1e-42f;  // tiny, subnormal
    }
    x[4 * cols + 5] = nan;
    x[5 * cols + 40] = inf;
    x[6 * cols + 1] = -inf;
    x[6 * cols + 2] = inf;
    const auto ref = run(w, x, m, Isa::Scalar);
    for (int64_t r = 0; r < w.rows; ++r) {
      EXPECT_EQ(ref[0 * w.rows + r], 0.0f) << dtype_name(t);
      EXPECT_TRUE(std::isnan(ref[4 * w.rows + r])) << dtype_name(t);
      EXPECT_FALSE(std::isfinite(ref[6 * w.rows + r])) << dtype_name(t);
      EXPECT_TRUE(std::isfinite(ref[2 * w.rows + r])) << dtype_name(t);
      if (!is_float(t)) {
        EXPECT_TRUE(std::isnan(ref[5 * w.rows + r])) << dtype_name(t);
      }
    }
    for (Isa isa : supported_isas()) {
      EXPECT_TRUE(same_bits(run(w, x, m, isa), ref)) << dtype_name(t) << " " << isa_name(isa);
    }
  }
}

// A negative product that underflows leaves a -0 chain; no fma past a
// chain's own values may touch it on any ISA (a padded fma(0, 0, -0) gives
// +0). 17, 33, 1041, 2065: chains of two lengths; m = 12: prefill tiles.
TEST(Matmul, NegativeZeroLanesSurviveFloatTails) {
  for (int64_t cols : {16, 17, 20, 33, 47, 1041, 2065}) {
    for (int64_t m : {1, 12}) {
      std::vector<float> wrow(static_cast<size_t>(cols), -1e-30f);
      const std::vector<float> x(static_cast<size_t>(m * cols), 1e-30f);
      const WeightView w{DType::F32, reinterpret_cast<const uint8_t*>(wrow.data()), 1, cols,
                         static_cast<size_t>(cols) * sizeof(float)};
      for (Isa isa : supported_isas()) {
        std::vector<float> y(static_cast<size_t>(m), 1.0f);
        matmul(w, x.data(), y.data(), m, nullptr, isa);
        for (int64_t i = 0; i < m; ++i) {
          EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), 0x80000000u)
              << "cols " << cols << " m " << m << " " << isa_name(isa) << ": expected -0";
        }
      }
    }
  }
}

TEST(Matmul, OddShapes) {
  for (Isa isa : supported_isas()) {
    for (DType t : {DType::F32, DType::Q8_0, DType::Q4_K}) {
      const int64_t cols = t == DType::F32 ? 1 : 256;
      const Weights w = make_weights(t, 1, cols, 11);
      const auto x = test::random_acts(1, cols, 12);
      const auto ref = run(w, x, 1, Isa::Scalar);
      EXPECT_TRUE(same_bits(run(w, x, 1, isa), ref));
    }
  }
}

TEST(Matmul, UnsupportedTypeThrows) {
  const uint8_t bytes[256] = {};
  const WeightView w{DType::IQ2_XXS, bytes, 1, 256, 66};
  float x[256] = {}, y[1];
  EXPECT_ANY_THROW(matmul(w, x, y, 1, nullptr, Isa::Scalar));
}

}  // namespace
}  // namespace encore::kernels
