// Row panels (src/kernels/panel.h) and the v2 order of the integer matmul
// (matmul_internal.h): repacking keeps every number of the GGUF blocks, the
// scalar twin computes exactly the order the header states from the blocks
// themselves, and repacked views give the bits of on-the-fly repacking on
// every ISA, batch size and panel edge.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "encore/dtype.h"
#include "encore/isa.h"
#include "encore/thread_pool.h"
#include "kernels/fp16.h"
#include "kernels/matmul.h"
#include "kernels/matmul_internal.h"
#include "kernels/panel.h"
#include "kernels/quants.h"
#include "quant_test_util.h"

namespace encore::kernels {
namespace {

using test::same_bits;

const DType kIntTypes[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                           DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K};

bool is_k_quant(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }

struct Weights {
  std::vector<uint8_t> bytes;
  WeightView view;
};

// Random blocks (quant_test_util.h).
Weights random_weights(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  const size_t row_bytes = dtype_row_bytes(t, static_cast<uint64_t>(cols));
  Weights w;
  w.bytes.resize(row_bytes * rows);
  test::fill_random_blocks(t, w.bytes.data(), w.bytes.size(), seed);
  w.view = WeightView{t, w.bytes.data(), rows, cols, row_bytes};
  return w;
}

// Every value of a panel, times its scales as the panel gives them, is
// ggml's dequantised value bit for bit (dequantize_row), padded rows are
// zero, and the sub-scales of Q6_K are the block's own. Fails when the
// repacking or the reads of panel.h lose or move a bit.
TEST(Panel, HoldsTheBlocksOwnNumbers) {
  for (DType t : kIntTypes) {
    const int64_t cols = is_k_quant(t) ? 512 : 96;
    const Weights w = random_weights(t, 21, cols, 5);  // two panels, the second padded
    const mm::PanelFormat& f = mm::panel_format(t);
    std::vector<uint8_t> panel(mm::panel_bytes(t, cols));
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t p = 0; p < 2; ++p) {
      std::fill(panel.begin(), panel.end(), uint8_t{0xA5});  // repack_panel writes every byte
      mm::repack_panel(w.view, p, panel.data());
      for (int r = 0; r < mm::kPanelRows; ++r) {
        const int64_t wr = p * mm::kPanelRows + r;
        if (wr < w.view.rows) get_row(w.view, wr, row.data());
        for (int64_t k = 0; k < cols; ++k) {
          const int wv = mm::panel_weight(f, panel.data(), r, k);
          const mm::GroupScales s = mm::panel_scales(f, panel.data(), r, k / 32);
          if (wr >= w.view.rows) {
            ASSERT_EQ(wv + f.bias, 0) << dtype_name(t) << " padded row " << r;
            ASSERT_EQ(s.ws, 0.0f);
            continue;
          }
          float v;
          if (t == DType::Q6_K) {
            const int sc = k % 32 < 16 ? s.sc_a : s.sc_b;
            v = (s.ws * static_cast<float>(sc)) * static_cast<float>(wv);  // ggml's order
          } else {
            v = static_cast<float>(wv) * s.ws;
            if (f.has_min) v = v + s.wm;
          }
          ASSERT_EQ(std::bit_cast<uint32_t>(v), std::bit_cast<uint32_t>(row[k]))
              << dtype_name(t) << " row " << wr << " k " << k;
        }
      }
    }
  }
}

// The v2 order written out from the GGUF blocks (decode_scalar's integers,
// the scales read from the block bytes) and the activations quantised by the
// group rule: the scalar twin must give exactly these bits. Fails when the
// twin's order (one chain over groups, exact group sums, the rounded scale
// product, the separate offset chain) changes in any way.
float v2_from_blocks(DType t, const uint8_t* row, int64_t cols, const float* x) {
  const int64_t kp = mm::padded_k(cols);
  std::vector<int8_t> w(static_cast<size_t>(kp));
  std::vector<float> ws(static_cast<size_t>(kp / 16)), wm(static_cast<size_t>(kp / 32));
  mm::decode_scalar(t, row, cols, mm::DecRows{w.data(), ws.data(), wm.data(), kp}, 0);
  const bool has_min = mm::has_min(t);
  float acc = 0.0f, accm = 0.0f;
  for (int64_t g = 0; g < cols / 32; ++g) {
    uint32_t ab = 0;
    for (int k = 0; k < 32; ++k) {
      ab = std::max(ab, std::bit_cast<uint32_t>(x[32 * g + k]) & 0x7fffffffu);
    }
    int8_t q[32];
    float da, asum;
    mm::quantize_group_scalar(x + 32 * g, ab, q, &da, &asum);
    int32_t half[2] = {0, 0};
    for (int k = 0; k < 32; ++k) half[k / 16] += int32_t{w[32 * g + k]} * q[k];
    int32_t s;
    float scale;
    if (t == DType::Q6_K) {  // ws per 16 is d * sc: take d and sc from the block
      const uint8_t* blk = row + (32 * g / 256) * sizeof(BlockQ6_K);
      const int sub = static_cast<int>(32 * g % 256 / 16);
      const auto* sc = reinterpret_cast<const int8_t*>(blk + offsetof(BlockQ6_K, scales));
      uint16_t d;
      std::memcpy(&d, blk + offsetof(BlockQ6_K, d), 2);
      s = sc[sub] * half[0] + sc[sub + 1] * half[1];
      scale = fp16_to_f32(d);
    } else {
      s = half[0] + half[1];
      scale = ws[2 * g];
    }
    acc = std::fma(static_cast<float>(s), scale * da, acc);
    if (has_min) accm = std::fma(wm[g], asum, accm);
  }
  return has_min ? acc + accm : acc;
}

TEST(Panel, ScalarTwinIsTheV2OrderOfTheBlocks) {
  for (DType t : kIntTypes) {
    const int64_t cols = is_k_quant(t) ? 768 : 320;
    const Weights w = random_weights(t, 19, cols, 9);
    const int64_t m = 3;
    const std::vector<float> x = test::random_acts(m, cols, 10);
    std::vector<float> y(static_cast<size_t>(m * w.view.rows));
    matmul(w.view, x.data(), y.data(), m, nullptr, Isa::Scalar);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t r = 0; r < w.view.rows; ++r) {
        const float ref =
            v2_from_blocks(t, w.view.data + r * w.view.row_bytes, cols, x.data() + i * cols);
        ASSERT_EQ(std::bit_cast<uint32_t>(y[i * w.view.rows + r]), std::bit_cast<uint32_t>(ref))
            << dtype_name(t) << " row " << r << " act " << i;
      }
    }
  }
}

// A view with panels repacked once (as the model keeps them) gives the bits
// of on-the-fly repacking under the scalar twin, on every ISA, thread count
// and batch size, with row counts that leave the last panel part empty.
// Fails when a kernel misreads the layout, a panel edge or a tile of
// activation rows.
TEST(Panel, RepackedViewsEqualTheScalarTwin) {
  ThreadPool pool(2);
  for (DType t : kIntTypes) {
    const int64_t cols = is_k_quant(t) ? 768 : 160;
    for (int64_t rows : {int64_t{16}, int64_t{37}}) {
      Weights w = random_weights(t, rows, cols, 17);
      std::vector<uint8_t> packed(repacked_bytes(t, rows, cols));
      repack_panels(w.view, packed.data(), 0, mm::panel_count(rows));
      WeightView pv = w.view;
      pv.panels = packed.data();
      for (int64_t m : {1, 3, 5, 8, 13, 40}) {
        const std::vector<float> x = test::random_acts(m, cols, 18);
        std::vector<float> ref(static_cast<size_t>(m * rows)), y(ref.size());
        matmul(w.view, x.data(), ref.data(), m, nullptr, Isa::Scalar);
        for (Isa isa : supported_isas()) {
          for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
            std::fill(y.begin(), y.end(), -1.0f);
            matmul(pv, x.data(), y.data(), m, tp, isa);
            EXPECT_TRUE(same_bits(y, ref))
                << dtype_name(t) << " rows=" << rows << " m=" << m << " isa=" << isa_name(isa)
                << " pool=" << (tp != nullptr);
          }
        }
      }
    }
  }
}

// The largest sums the formats allow, where a saturating or overflowing
// kernel would show: Q8_0 weights all -128 or all +127 against activations
// all -127 or +127 (the AVX2 sign trick's maddubs pairs at 2 * 128 * 127 =
// 32512; weights made unsigned, w + 128 = 255, would saturate them), and
// Q6_K with every sub-scale -128 and every weight -32 against activations
// all +-127 (|S_g| = 2 * 128 * 16 * 32 * 127 = 16,646,144, just under 2^24, where
// float(S_g) is still exact). Every ISA must give the scalar twin's bits,
// and the twin the exact value.
TEST(Panel, LargestSumsAreExactOnEveryIsa) {
  for (DType t : {DType::Q8_0, DType::Q6_K}) {
    const int64_t cols = 256, rows = 16;
    const size_t row_bytes = dtype_row_bytes(t, cols);
    std::vector<uint8_t> bytes(row_bytes * rows, 0);
    const uint16_t one = f32_to_fp16(1.0f);
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* row = bytes.data() + r * row_bytes;
      if (t == DType::Q8_0) {
        for (int64_t b = 0; b < cols / 32; ++b) {  // even rows -128, odd rows +127
          std::memcpy(row + b * 34, &one, 2);
          std::memset(row + b * 34 + 2, r % 2 == 0 ? 0x80 : 0x7f, 32);
        }
      } else {  // ql = qh = 0: every value q = 0, w = -32
        std::memset(row + offsetof(BlockQ6_K, scales), 0x80, 16);  // sub-scales -128
        std::memcpy(row + offsetof(BlockQ6_K, d), &one, 2);
      }
    }
    const WeightView w{t, bytes.data(), rows, cols, row_bytes};
    // Row 0 of x: all -1 (q = -127); row 1: all +1 (q = +127).
    std::vector<float> x(2 * cols, -1.0f);
    std::fill(x.begin() + cols, x.end(), 1.0f);
    std::vector<float> ref(2 * rows), y(ref.size());
    matmul(w, x.data(), ref.data(), 2, nullptr, Isa::Scalar);
    const double da = 1.0 / 127;
    for (int i = 0; i < 2; ++i) {
      for (int r = 0; r < 2; ++r) {
        const double q = i == 0 ? -127 : 127;
        const double w8 = r == 0 ? -128 : 127;
        const double s_g = t == DType::Q8_0 ? 32 * w8 * q : 2 * -128 * (16 * -32 * q);
        // Every group adds the same exact product s_g * fl(1 * da): the chain
        // of fmas over cols / 32 groups, in float.
        float acc = 0.0f;
        for (int g = 0; g < cols / 32; ++g) {
          acc = std::fma(static_cast<float>(s_g), static_cast<float>(da), acc);
        }
        EXPECT_EQ(ref[i * rows + r], acc) << dtype_name(t) << " act " << i << " row " << r;
      }
    }
    for (Isa isa : supported_isas()) {
      if (isa == Isa::Scalar) continue;
      matmul(w, x.data(), y.data(), 2, nullptr, isa);
      EXPECT_TRUE(same_bits(y, ref)) << dtype_name(t) << " " << isa_name(isa);
    }
  }
}

// The largest 4-, 5- and 6-bit sums, where the AVX2 kernels' int16 lanes
// (maddubs pairs summed before they are widened: panel_kernel.h) would
// saturate if they took one product more: every stored value at its maximum
// (u = 15, 31, 63) against activations of +-127, 16, 8 and 4 products per
// lane (30480, 31496, 32004). 8 activation rows: the widest tiles of every
// ISA. Every ISA must give the scalar twin's bits.
TEST(Panel, LargestNibbleSumsFitTheInt16Lanes) {
  for (DType t : {DType::Q4_0, DType::Q5_0, DType::Q6_K}) {
    const int64_t cols = 512, rows = 16, m = 8;
    const size_t row_bytes = dtype_row_bytes(t, cols);
    std::vector<uint8_t> bytes(row_bytes * rows, 0xff);  // every u at its maximum
    const uint16_t one = f32_to_fp16(1.0f);
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* row = bytes.data() + r * row_bytes;
      if (t == DType::Q6_K) {
        for (int64_t b = 0; b < cols / 256; ++b) {
          uint8_t* blk = row + b * sizeof(BlockQ6_K);
          std::memset(blk + offsetof(BlockQ6_K, scales), 1, 16);
          std::memcpy(blk + offsetof(BlockQ6_K, d), &one, 2);
        }
      } else {
        const size_t bb = t == DType::Q4_0 ? sizeof(BlockQ4_0) : sizeof(BlockQ5_0);
        for (int64_t b = 0; b < cols / 32; ++b) std::memcpy(row + b * bb, &one, 2);
      }
    }
    const WeightView w{t, bytes.data(), rows, cols, row_bytes};
    std::vector<float> x(static_cast<size_t>(m * cols));
    for (int64_t i = 0; i < m; ++i) {  // q = -127 and +127 in turn
      std::fill_n(x.begin() + i * cols, cols, i % 2 == 0 ? -1.0f : 1.0f);
    }
    std::vector<float> ref(static_cast<size_t>(m * rows)), y(ref.size());
    matmul(w, x.data(), ref.data(), m, nullptr, Isa::Scalar);
    // The twin itself: Q4_0's w = 15 - 8 = 7 in every group, S_g = 32 * 7 * q.
    if (t == DType::Q4_0) {
      float acc = 0.0f;
      for (int g = 0; g < cols / 32; ++g) {
        acc = std::fma(static_cast<float>(32 * 7 * -127), static_cast<float>(1.0 / 127), acc);
      }
      EXPECT_EQ(ref[0], acc);
    }
    for (Isa isa : supported_isas()) {
      if (isa == Isa::Scalar) continue;
      std::fill(y.begin(), y.end(), -1.0f);
      matmul(w, x.data(), y.data(), m, nullptr, isa);
      EXPECT_TRUE(same_bits(y, ref)) << dtype_name(t) << " " << isa_name(isa);
    }
  }
}

// The panels really are what matmul reads: other bytes in them give other
// outputs (so a kernel that went back to the GGUF rows would fail here).
TEST(Panel, MatmulReadsThePanelsItIsGiven) {
  const DType t = DType::Q4_0;
  Weights w = random_weights(t, 16, 64, 23);
  std::vector<uint8_t> packed(repacked_bytes(t, 16, 64));
  repack_panels(w.view, packed.data(), 0, 1);
  WeightView pv = w.view;
  pv.panels = packed.data();
  const std::vector<float> x = test::random_acts(1, 64, 24);
  std::vector<float> a(16), b(16);
  matmul(pv, x.data(), a.data(), 1, nullptr, detect_best_isa());
  packed[mm::panel_format(t).head_bytes] ^= 0x11;  // values of row 0 in the first group
  matmul(pv, x.data(), b.data(), 1, nullptr, detect_best_isa());
  EXPECT_NE(a[0], b[0]);
  for (int r = 1; r < 16; ++r) EXPECT_EQ(a[r], b[r]) << r;
}

}  // namespace
}  // namespace encore::kernels
