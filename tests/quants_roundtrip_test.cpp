// Random round trips through quantize_row / dequantize_row: error bounds per
// type, determinism, re-quantisation stability and input validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "encore/dtype.h"
#include "encore/error.h"
#include "kernels/quants.h"

namespace encore::kernels {
namespace {

constexpr int64_t kRow = 2048;  // a multiple of every block size

const DType kAllTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,
                           DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                           DType::Q4_K, DType::Q5_K, DType::Q6_K};

struct Dataset {
  std::string name;
  std::vector<float> x;  // [kRow]
};

std::vector<Dataset> datasets() {
  std::mt19937 rng(20240601);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<Dataset> out;
  auto add = [&](const std::string& name, auto gen) {
    Dataset d{name, std::vector<float>(kRow)};
    for (int64_t i = 0; i < kRow; ++i) d.x[i] = gen(i);
    out.push_back(std::move(d));
  };
  add("uniform", [&](int64_t) { return u(rng); });
  add("weights", [&](int64_t) { return normal(rng); });
  add("positive", [&](int64_t) { return 2.5f + 0.5f * u(rng); });
  add("negative", [&](int64_t) { return -4.5f + 0.5f * u(rng); });
  // Magnitude changes every 32 values (1e-3 .. 1e2): exercises per-sub-block
  // scales, including large 6-bit scales in Q4_K/Q5_K sub-blocks 4..7.
  add("mixed_scales", [&](int64_t i) {
    const int k = static_cast<int>((i / 32) * 7 % 6) - 3;
    return u(rng) * std::pow(10.0f, static_cast<float>(k));
  });
  add("outliers", [&](int64_t i) { return i % 97 == 0 ? (i % 2 ? 50.0f : -50.0f) : u(rng); });
  add("tiny", [&](int64_t) { return 1e-6f * u(rng); });  // fp16 scales go subnormal
  add("zeros", [&](int64_t) { return 0.0f; });
  add("constant", [&](int64_t) { return 0.7f; });
  add("ramp", [&](int64_t i) { return static_cast<float>(i % 256) / 16.0f - 8.0f; });
  return out;
}

std::vector<uint8_t> quant(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(dtype_row_bytes(t, x.size()), 0xcd);
  quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

std::vector<float> dequant(DType t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(t, q.data(), y.data(), n);
  return y;
}

// Half an fp16 ulp relative (normal scales) and absolute (subnormal scales).
constexpr double kFp16Rel = 1.0 / 2048;
constexpr double kFp16Abs = 1.0 / (1 << 25);

// The documented worst-case |dequantize(quantize(x)) - x| for each value of
// a block x[0 .. block size), plus a float-rounding allowance of 1e-6 of the
// block's magnitude.
std::vector<double> error_bounds(DType t, const float* x) {
  const int n = static_cast<int>(dtype_info(t).block_elems);
  double amax = 0, lo = x[0], hi = x[0];
  for (int i = 0; i < n; ++i) {
    amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
    lo = std::min(lo, static_cast<double>(x[i]));
    hi = std::max(hi, static_cast<double>(x[i]));
  }
  const double slack = 1e-6 * amax;
  std::vector<double> b(n, slack);
  auto fill = [&](double v) {
    for (double& e : b) e += v;
  };
  // Scale error: q * |d - fp16(d)| for the largest |q|.
  auto scale_err = [](double d, int qmax) { return qmax * (d * kFp16Rel + kFp16Abs); };
  switch (t) {
    case DType::F32:
      fill(0);
      break;
    case DType::F16:  // relative half-ulp, or absolute in the subnormal range
      for (int i = 0; i < n; ++i) b[i] += std::fabs(x[i]) * kFp16Rel + std::ldexp(1.0, -25);
      break;
    case DType::BF16:
      for (int i = 0; i < n; ++i) b[i] += std::fabs(x[i]) / 256;
      break;
    case DType::Q8_0:  // step amax/127, round to nearest
      fill(0.5 * amax / 127 + scale_err(amax / 127, 127));
      break;
    case DType::Q4_0:  // step amax/8; the value opposite the max clamps from +8 to +7
      fill(amax / 8 + scale_err(amax / 8, 8));
      break;
    case DType::Q5_0:
      fill(amax / 16 + scale_err(amax / 16, 16));
      break;
    case DType::Q4_1:
    case DType::Q5_1: {  // step range/nmax, plus fp16 error of d and of the min
      const int nmax = t == DType::Q4_1 ? 15 : 31;
      const double d = (hi - lo) / nmax;
      fill(0.5 * d + scale_err(d, nmax) + std::fabs(lo) * kFp16Rel + kFp16Abs);
      break;
    }
    case DType::Q4_K:
    case DType::Q5_K: {  // the bound stated in quants_k.cpp
      const int nmax = t == DType::Q4_K ? 15 : 31;
      double sub_lo[8], sub_hi[8], max_off = 0;
      for (int j = 0; j < 8; ++j) {
        sub_lo[j] = 0;
        sub_hi[j] = x[32 * j];
        for (int l = 0; l < 32; ++l) {
          sub_lo[j] = std::min(sub_lo[j], static_cast<double>(x[32 * j + l]));
          sub_hi[j] = std::max(sub_hi[j], static_cast<double>(x[32 * j + l]));
        }
        max_off = std::max(max_off, -sub_lo[j]);
      }
      const double dmin = max_off / 63 * (1 + 2 * kFp16Rel) + 2 * kFp16Abs;
      double s[8], max_s = 0;
      for (int j = 0; j < 8; ++j) {
        s[j] = (sub_hi[j] - sub_lo[j] + dmin) / nmax;
        max_s = std::max(max_s, s[j]);
      }
      const double d = max_s / 63 * (1 + 2 * kFp16Rel) + 2 * kFp16Abs;
      for (int i = 0; i < n; ++i) b[i] += 0.5 * (s[i / 32] + d);
      break;
    }
    case DType::Q6_K: {
      double a[16], max_a = 0;
      for (int j = 0; j < 16; ++j) {
        a[j] = 0;
        for (int l = 0; l < 16; ++l)
          a[j] = std::max(a[j], std::fabs(static_cast<double>(x[16 * j + l])));
        max_a = std::max(max_a, a[j]);
      }
      const double d = max_a / (31.0 * 127) * (1 + 2 * kFp16Rel) + 2 * kFp16Abs;
      for (int i = 0; i < n; ++i) b[i] += 0.5 * (a[i / 16] / 31 + d);
      break;
    }
    default:
      ADD_FAILURE() << "no bound for " << dtype_name(t);
  }
  return b;
}

TEST(QuantsRoundTrip, ErrorWithinDocumentedBound) {
  for (const Dataset& ds : datasets()) {
    for (DType t : kAllTypes) {
      SCOPED_TRACE(ds.name + " " + dtype_name(t));
      const auto y = dequant(t, quant(t, ds.x), kRow);
      const int block = static_cast<int>(dtype_info(t).block_elems);
      double worst_ratio = 0;
      for (int64_t b0 = 0; b0 < kRow; b0 += block) {
        const auto bound = error_bounds(t, ds.x.data() + b0);
        for (int i = 0; i < block; ++i) {
          const double err = std::fabs(static_cast<double>(y[b0 + i]) - ds.x[b0 + i]);
          ASSERT_LE(err, bound[i])
              << "value " << b0 + i << " = " << ds.x[b0 + i] << " came back as " << y[b0 + i];
          if (bound[i] > 0) worst_ratio = std::max(worst_ratio, err / bound[i]);
        }
      }
      // The bounds are worst cases; make sure they are not vacuous either:
      // somewhere in a random row the error gets near them.
      if (ds.name == "uniform" && t != DType::F32) {
        EXPECT_GT(worst_ratio, 0.3);
      }
    }
  }
}

TEST(QuantsRoundTrip, ZerosStayExactlyZero) {
  const std::vector<float> zeros(kRow, 0.0f);
  for (DType t : kAllTypes) {
    const auto y = dequant(t, quant(t, zeros), kRow);
    for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

TEST(QuantsRoundTrip, DeterministicAndAlignmentIndependent) {
  const auto all = datasets();
  const std::vector<float>& x = all[1].x;
  for (DType t : kAllTypes) {
    const auto a = quant(t, x);
    const auto b = quant(t, x);
    EXPECT_EQ(a, b) << dtype_name(t);
    // An odd destination address (quantised rows need not be aligned).
    std::vector<uint8_t> shifted(a.size() + 1);
    quantize_row(t, x.data(), shifted.data() + 1, kRow);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), shifted.begin() + 1)) << dtype_name(t);
    std::vector<float> y1(kRow), y2(kRow);
    dequantize_row(t, a.data(), y1.data(), kRow);
    dequantize_row(t, shifted.data() + 1, y2.data(), kRow);
    EXPECT_EQ(y1, y2) << dtype_name(t);
  }
}

// For the plain types and ggml's legacy quantisers, values that came out of
// dequantize_row are already on the grid, so quantising them again gives the
// same bytes (the scale choice reproduces the stored fp16 scale). Not when
// the scale underflowed fp16 ("tiny"): then the stored quants were computed
// with a scale the block does not keep.
TEST(QuantsRoundTrip, RequantizingDequantizedValuesGivesSameBytes) {
  for (const Dataset& ds : datasets()) {
    if (ds.name == "tiny") continue;
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                    DType::Q5_0, DType::Q5_1}) {
      SCOPED_TRACE(ds.name + " " + dtype_name(t));
      const auto q1 = quant(t, ds.x);
      const auto q2 = quant(t, dequant(t, q1, kRow));
      EXPECT_EQ(q1, q2);
    }
  }
}

// The K-quant scheme is not idempotent byte for byte (ceil on the scales can
// pick a coarser step the second time), but a second round trip must still
// respect the bound against the values it was given.
TEST(QuantsRoundTrip, KQuantsSecondRoundTripStaysBounded) {
  for (const Dataset& ds : datasets()) {
    for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
      SCOPED_TRACE(ds.name + " " + dtype_name(t));
      const auto y1 = dequant(t, quant(t, ds.x), kRow);
      const auto y2 = dequant(t, quant(t, y1), kRow);
      for (int64_t b0 = 0; b0 < kRow; b0 += kSuperBlock) {
        const auto bound = error_bounds(t, y1.data() + b0);
        for (int i = 0; i < kSuperBlock; ++i) {
          ASSERT_LE(std::fabs(static_cast<double>(y2[b0 + i]) - y1[b0 + i]), bound[i]);
        }
      }
    }
  }
}

TEST(QuantsRoundTrip, KnownLegacyBytes) {
  // Q8_0 of 0, 1, ..., 31: amax 31, d = 31/127 -> fp16 0x33d0 (0.244140625);
  // q = round(x * 127/31): x = 31 -> 127, x = 1 -> round(4.0968) = 4.
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i);
  const auto q8 = quant(DType::Q8_0, x);
  EXPECT_EQ(q8[0] | q8[1] << 8, 0x33d0);
  EXPECT_EQ(static_cast<int8_t>(q8[2 + 1]), 4);
  EXPECT_EQ(static_cast<int8_t>(q8[2 + 31]), 127);
  // Q4_0 of the same: max 31, d = 31 / -8 = -3.875 (fp16 0xc3c0); x = 31 ->
  // q = trunc(-8 + 8.5) = 0; x = 0 -> 8; x = 4 -> trunc(-1.032 + 8.5) = 7.
  const auto q4 = quant(DType::Q4_0, x);
  EXPECT_EQ(q4[0] | q4[1] << 8, 0xc3c0);
  EXPECT_EQ(q4[2 + 0] & 0x0f, 8);
  EXPECT_EQ(q4[2 + 4] & 0x0f, 7);
  EXPECT_EQ(q4[2 + 15] >> 4, 0);  // value 31
}

// Values around 1e-39 give scales so small that 1/d overflows to inf, and
// ggml's quantisers would cast inf or NaN (0 * inf) to an integer. Such a
// block dequantises to (+-)0 with its quants at the zero point, so quantising
// that result again gives the same bytes; every type stays within fp16's
// resolution of the input.
TEST(QuantsValidation, BlocksTooSmallForTheirScaleAreStoredAsZeros) {
  std::vector<std::pair<std::string, std::vector<float>>> rows = {
      {"1e-39", std::vector<float>(kRow, 1e-39f)},
      {"-1e-39", std::vector<float>(kRow, -1e-39f)},
      {"ramp", std::vector<float>(kRow)},
      {"alternating", std::vector<float>(kRow)},
  };
  for (int64_t i = 0; i < kRow; ++i) {
    rows[2].second[i] = static_cast<float>(i % 32) * 1e-40f;  // 0 and tiny values in a block
    rows[3].second[i] = (i % 2 ? 1e-39f : -1e-39f) * static_cast<float>(1 + i % 3);
  }
  for (const auto& [name, x] : rows) {
    for (DType t : kAllTypes) {
      SCOPED_TRACE(name + " " + dtype_name(t));
      std::vector<uint8_t> q;
      ASSERT_NO_THROW(q = quant(t, x));
      const std::vector<float> y = dequant(t, q, kRow);
      for (int64_t i = 0; i < kRow; ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << i;
        ASSERT_LE(std::fabs(static_cast<double>(y[i]) - x[i]), kFp16Abs) << i;
      }
      const DTypeInfo& info = dtype_info(t);
      if (info.block_elems == 1) {
        EXPECT_EQ(quant(t, y), q);  // plain types: already on the grid
        continue;
      }
      if (info.block_elems != kLegacyBlock) continue;  // K-quants: the bound above
      // Legacy blocks: a scale of +-0 (and Q4_1/Q5_1's offset, +-0 too) and
      // every quant at the zero point, i.e. the bytes of a block of zeros
      // apart from the signs of those zeros.
      const size_t halves = t == DType::Q4_1 || t == DType::Q5_1 ? 2 : 1;
      std::vector<uint8_t> want = quant(t, std::vector<float>(kRow, 0.0f));
      for (size_t b = 0; b < want.size(); b += info.block_bytes) {
        for (size_t h = 0; h < halves; ++h) {
          ASSERT_EQ(q[b + 2 * h] | (q[b + 2 * h + 1] & 0x7f) << 8, 0) << "block " << b;
          want[b + 2 * h + 1] = q[b + 2 * h + 1];  // the sign bit
        }
      }
      EXPECT_EQ(q, want);
      for (int64_t i = 0; i < kRow; ++i) ASSERT_EQ(y[i], 0.0f) << i;
    }
  }
}

TEST(QuantsValidation, NonFiniteInputThrowsForBlockTypes) {
  for (DType t : kAllTypes) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> x(kRow, 0.5f);
      x[300] = bad;
      std::vector<uint8_t> q(dtype_row_bytes(t, kRow));
      if (dtype_info(t).block_elems == 1) {
        EXPECT_NO_THROW(quantize_row(t, x.data(), q.data(), kRow)) << dtype_name(t);
      } else {
        EXPECT_THROW(quantize_row(t, x.data(), q.data(), kRow), InvalidArgument) << dtype_name(t);
      }
    }
  }
}

TEST(QuantsValidation, ScaleOverflowThrows) {
  for (DType t : kAllTypes) {
    if (dtype_info(t).block_elems == 1) continue;
    std::vector<float> x(kRow, 1.0f);
    x[5] = 1e30f;
    std::vector<uint8_t> q(dtype_row_bytes(t, kRow));
    EXPECT_THROW(quantize_row(t, x.data(), q.data(), kRow), InvalidArgument) << dtype_name(t);
    x[5] = -5e4f;  // every type's scale (and Q4_1/Q5_1's fp16 min) still fits
    EXPECT_NO_THROW(quantize_row(t, x.data(), q.data(), kRow)) << dtype_name(t);
  }
}

}  // namespace
}  // namespace encore::kernels
