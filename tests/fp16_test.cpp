// Tests of the half / bfloat16 conversions in src/kernels/fp16.h.
#include "kernels/fp16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace encore::kernels {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

bool is_half_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }

// The value of a half straight from the IEEE definition, in double.
double half_value_reference(uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return sign ? -mag : mag;
}

// Compile-time checks: the conversions are constexpr.
static_assert(f32_to_fp16(1.0f) == 0x3c00);
static_assert(fp16_to_f32(0xc000) == -2.0f);
static_assert(f32_to_bf16(1.0f) == 0x3f80);
static_assert(bf16_to_f32(0x4040) == 3.0f);

TEST(Fp16, KnownValues) {
  struct Case {
    uint16_t h;
    float f;
  };
  const Case cases[] = {
      {0x0000, 0.0f},
      {0x3c00, 1.0f},
      {0xc000, -2.0f},
      {0x3800, 0.5f},
      {0x3555, 0.333251953125f},         // nearest half to 1/3
      {0x7bff, 65504.0f},                // largest finite half
      {0x0400, 6.103515625e-05f},        // 2^-14, smallest normal
      {0x03ff, 6.097555160522461e-05f},  // 1023 * 2^-24, largest subnormal
      {0x0001, 5.960464477539063e-08f},  // 2^-24, smallest subnormal
      {0x8001, -5.960464477539063e-08f},
      {0x0200, 3.0517578125e-05f},  // 2^-15
      {0x4248, 3.140625f},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(bits(fp16_to_f32(c.h)), bits(c.f)) << std::hex << c.h;
    EXPECT_EQ(f32_to_fp16(c.f), c.h) << c.f;
  }
  // Signed zero, infinities, NaN.
  EXPECT_EQ(bits(fp16_to_f32(0x8000)), 0x80000000u);
  EXPECT_EQ(f32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7e00)));
  EXPECT_TRUE(is_half_nan(f32_to_fp16(std::numeric_limits<float>::quiet_NaN())));
  // A signalling NaN whose payload is only in bits the half drops stays NaN.
  EXPECT_TRUE(is_half_nan(f32_to_fp16(from_bits(0x7f800001u))));
  EXPECT_EQ(f32_to_fp16(from_bits(0xff800001u)) & 0x8000, 0x8000);
  // Overflow and underflow.
  EXPECT_EQ(f32_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_fp16(-1e6f), 0xfc00);
  EXPECT_EQ(f32_to_fp16(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_fp16(-1e-10f), 0x8000);
  EXPECT_EQ(f32_to_fp16(from_bits(0x00000001u)), 0x0000);  // float subnormal
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::max()), 0x7c00);
}

TEST(Fp16, EveryHalfWidensExactlyAndRoundTrips) {
  for (uint32_t u = 0; u <= 0xffff; ++u) {
    const auto h = static_cast<uint16_t>(u);
    const float f = fp16_to_f32(h);
    const uint16_t back = f32_to_fp16(f);
    if (is_half_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << u;
      // The payload survives; a signalling NaN comes back quiet.
      ASSERT_EQ(back, h | 0x0200) << std::hex << u;
      continue;
    }
    if ((h & 0x7fff) == 0x7c00) {
      ASSERT_TRUE(std::isinf(f)) << std::hex << u;
    } else {
      ASSERT_EQ(static_cast<double>(f), half_value_reference(h)) << std::hex << u;
    }
    ASSERT_EQ(back, h) << std::hex << u;
  }
}

// Between every pair of neighbouring finite halves: the exact midpoint goes to
// the even one, one float ulp either side goes to the nearer one.
TEST(Fp16, RoundsToNearestEvenBetweenEveryNeighbourPair) {
  for (uint16_t h = 0; h < 0x7bff; ++h) {
    const uint16_t next = h + 1;
    // Halves have 11 significant bits, so their midpoint is exact in a float.
    const float mid = (fp16_to_f32(h) + fp16_to_f32(next)) / 2.0f;
    ASSERT_EQ(static_cast<double>(mid),
              (half_value_reference(h) + half_value_reference(next)) / 2.0)
        << std::hex << h;
    const uint16_t even = (h & 1) ? next : h;
    const float above = std::nextafter(mid, 1e9f);
    const float below = std::nextafter(mid, 0.0f);
    ASSERT_EQ(f32_to_fp16(mid), even) << std::hex << h;
    ASSERT_EQ(f32_to_fp16(above), next) << std::hex << h;
    ASSERT_EQ(f32_to_fp16(below), h) << std::hex << h;
    // Mirror image for negative values.
    ASSERT_EQ(f32_to_fp16(-mid), even | 0x8000) << std::hex << h;
    ASSERT_EQ(f32_to_fp16(-above), next | 0x8000) << std::hex << h;
    ASSERT_EQ(f32_to_fp16(-below), h | 0x8000) << std::hex << h;
  }
  // Beyond the largest half: 65520 is the tie between 65504 and 2^16 -> inf.
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_fp16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  // Below the smallest subnormal: 2^-25 ties between 0 and 2^-24 -> 0.
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  // 3 * 2^-26 is 0.75 of the smallest subnormal -> rounds up to it.
  EXPECT_EQ(f32_to_fp16(std::ldexp(3.0f, -26)), 0x0001);
}

#if defined(__FLT16_MANT_DIG__)
// The compiler's own _Float16 conversion (libgcc / compiler-rt soft-float,
// round to nearest even) as an independent reference.
TEST(Fp16, MatchesCompilerFloat16Conversion) {
  auto reference = [](float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); };
  auto check = [&](uint32_t u) {
    const float f = from_bits(u);
    if (std::isnan(f)) return;
    ASSERT_EQ(f32_to_fp16(f), reference(f)) << std::hex << u;
  };
  // A stride through every float bit pattern ...
  for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) check(static_cast<uint32_t>(u));
  // ... and dense random samples around the half range, where rounding matters.
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 300000; ++i) {
    const uint32_t u = any(rng);
    const uint32_t exp = 97 + (u >> 24) % 50;  // float exponents around 2^-30 .. 2^19
    check((u & 0x807fffffu) | exp << 23);
  }
}
#endif

TEST(Bf16, KnownValues) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-3.0f), 0xc040);
  EXPECT_EQ(bits(bf16_to_f32(0x3eab)), 0x3eab0000u);  // 0.333984375
  EXPECT_EQ(bf16_to_f32(0x3eab), 0.333984375f);
  // Ties go to even; anything past the tie goes up.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0xbf818000u)), 0xbf82);
  // Subnormals are rounded, not flushed.
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000u)), 0x0000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008001u)), 0x0001);
  EXPECT_EQ(bits(bf16_to_f32(0x0001)), 0x00010000u);
  // Zero, infinities, overflow.
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
  // NaN stays NaN and quiet, sign and top payload kept.
  EXPECT_EQ(f32_to_bf16(from_bits(0x7fc00000u)), 0x7fc0);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(f32_to_bf16(from_bits(0xff812345u)), 0xffc1);
}

TEST(Bf16, EveryBf16RoundTrips) {
  for (uint32_t u = 0; u <= 0xffff; ++u) {
    const auto b = static_cast<uint16_t>(u);
    const float f = bf16_to_f32(b);
    ASSERT_EQ(bits(f), u << 16);
    const bool nan = (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0;
    ASSERT_EQ(f32_to_bf16(f), nan ? (b | 0x0040) : b) << std::hex << u;
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // Reference: compare the dropped 16 bits against the halfway point.
  auto reference = [](uint32_t u) -> uint16_t {
    const uint32_t kept = u >> 16;
    const uint32_t dropped = u & 0xffff;
    const bool up = dropped > 0x8000 || (dropped == 0x8000 && (kept & 1));
    return static_cast<uint16_t>(kept + (up ? 1 : 0));
  };
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 1000000; ++i) {
    uint32_t u = any(rng);
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // force exact ties often
    if (std::isnan(from_bits(u))) continue;
    ASSERT_EQ(f32_to_bf16(from_bits(u)), reference(u)) << std::hex << u;
  }
}

}  // namespace
}  // namespace encore::kernels
