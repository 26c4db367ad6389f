// Hand-made blocks for every type dequantize_row supports. The bytes are
// written out here and the expected values worked out by hand (in comments)
// from the format definitions in ggml-common.h / ggml-quants.c, so these
// tests pin the layouts independently of the implementation.
// Random round trips live in quants_roundtrip_test.cpp.
#include "kernels/quants.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "encore/dtype.h"
#include "encore/error.h"

namespace encore::kernels {
namespace {

using Bytes = std::vector<uint8_t>;

std::vector<float> dequant(DType type, const Bytes& bytes, int64_t n) {
  EXPECT_EQ(bytes.size(), dtype_row_bytes(type, static_cast<uint64_t>(n)));
  std::vector<float> out(static_cast<size_t>(n), -12345.0f);
  dequantize_row(type, bytes.data(), out.data(), n);
  return out;
}

// Appends a little-endian uint16 (an fp16 bit pattern).
void put16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v & 0xff));
  b.push_back(static_cast<uint8_t>(v >> 8));
}

TEST(QuantsHandMade, F32) {
  const float vals[3] = {1.5f, -0.0f, 3.0e38f};
  Bytes b(sizeof(vals));
  std::memcpy(b.data(), vals, sizeof(vals));
  const auto y = dequant(DType::F32, b, 3);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(vals[i]));
}

TEST(QuantsHandMade, F16) {
  Bytes b;
  for (uint16_t h : {0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x8000, 0x7c00, 0x3555}) put16(b, h);
  const auto y = dequant(DType::F16, b, 8);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], 65504.0f);
  EXPECT_EQ(y[3], 5.960464477539063e-08f);                // 2^-24
  EXPECT_EQ(y[4], 6.097555160522461e-05f);                // 1023 * 2^-24
  EXPECT_EQ(std::bit_cast<uint32_t>(y[5]), 0x80000000u);  // -0
  EXPECT_TRUE(std::isinf(y[6]) && y[6] > 0);
  EXPECT_EQ(y[7], 0.333251953125f);  // 0x3555 = 1 + 0x155/1024, times 2^-2
}

TEST(QuantsHandMade, BF16) {
  Bytes b;
  for (uint16_t v : {0x3f80, 0xc040, 0x3eab, 0x0001}) put16(b, v);
  const auto y = dequant(DType::BF16, b, 4);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -3.0f);
  EXPECT_EQ(y[2], 0.333984375f);  // 0x3eab0000
  EXPECT_EQ(std::bit_cast<uint32_t>(y[3]), 0x00010000u);
}

// Q4_0: d = 0.5 (0x3800); qs[j] = j | (15 - j) << 4.
// value j      = (j - 8) * 0.5        -> -4.0 .. 3.5
// value 16 + j = ((15 - j) - 8) * 0.5 -> 3.5 .. -4.0
TEST(QuantsHandMade, Q4_0) {
  Bytes b;
  put16(b, 0x3800);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  const auto y = dequant(DType::Q4_0, b, 32);
  EXPECT_EQ(y[0], -4.0f);   // q = 0
  EXPECT_EQ(y[8], 0.0f);    // q = 8
  EXPECT_EQ(y[15], 3.5f);   // q = 15
  EXPECT_EQ(y[16], 3.5f);   // high nibble of byte 0: q = 15
  EXPECT_EQ(y[31], -4.0f);  // high nibble of byte 15: q = 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f);
    EXPECT_EQ(y[16 + j], (7 - j) * 0.5f);
  }
}

// Q4_1: d = 0.25 (0x3400), m = 1.5 (0x3e00); qs[j] = j | (15 - j) << 4.
// value j = j * 0.25 + 1.5; value 16 + j = (15 - j) * 0.25 + 1.5.
TEST(QuantsHandMade, Q4_1) {
  Bytes b;
  put16(b, 0x3400);
  put16(b, 0x3e00);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  const auto y = dequant(DType::Q4_1, b, 32);
  EXPECT_EQ(y[0], 1.5f);
  EXPECT_EQ(y[15], 5.25f);  // 15 * 0.25 + 1.5
  EXPECT_EQ(y[16], 5.25f);
  EXPECT_EQ(y[31], 1.5f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.25f + 1.5f);
    EXPECT_EQ(y[16 + j], (15 - j) * 0.25f + 1.5f);
  }
}

// Q5_0 / Q5_1 share the high-bit plane: qh = bits {0, 5, 16, 31}
// = 0x80010021, stored little-endian as 21 00 01 80; qs[j] = j | (15 - j) << 4.
// 5-bit q: value j = j + 16 * bit j; value 16 + j = (15 - j) + 16 * bit (16 + j).
//   value 0: 0 + 16 = 16     value 1: 1       value 5: 5 + 16 = 21
//   value 15: 15             value 16: 15 + 16 = 31
//   value 17: 14             value 31: 0 + 16 = 16
Bytes q5_payload() {
  Bytes b = {0x21, 0x00, 0x01, 0x80};
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  return b;
}

int q5_expected_q(int i) {
  const uint32_t qh = 0x80010021u;
  const int low = i < 16 ? i : 15 - (i - 16);
  return low + (((qh >> i) & 1) ? 16 : 0);
}

// Q5_0: d = 0.25 (0x3400); y = (q - 16) * 0.25.
TEST(QuantsHandMade, Q5_0) {
  Bytes b;
  put16(b, 0x3400);
  const Bytes p = q5_payload();
  b.insert(b.end(), p.begin(), p.end());
  const auto y = dequant(DType::Q5_0, b, 32);
  EXPECT_EQ(y[0], 0.0f);     // q 16
  EXPECT_EQ(y[1], -3.75f);   // q 1 -> -15 * 0.25
  EXPECT_EQ(y[5], 1.25f);    // q 21 -> 5 * 0.25
  EXPECT_EQ(y[15], -0.25f);  // q 15 -> -1 * 0.25
  EXPECT_EQ(y[16], 3.75f);   // q 31 -> 15 * 0.25
  EXPECT_EQ(y[17], -0.5f);   // q 14 -> -2 * 0.25
  EXPECT_EQ(y[31], 0.0f);    // q 16
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], (q5_expected_q(i) - 16) * 0.25f) << i;
}

// Q5_1: d = 0.5 (0x3800), m = -4 (0xc400); y = q * 0.5 - 4.
TEST(QuantsHandMade, Q5_1) {
  Bytes b;
  put16(b, 0x3800);
  put16(b, 0xc400);
  const Bytes p = q5_payload();
  b.insert(b.end(), p.begin(), p.end());
  const auto y = dequant(DType::Q5_1, b, 32);
  EXPECT_EQ(y[0], 4.0f);    // q 16
  EXPECT_EQ(y[1], -3.5f);   // q 1
  EXPECT_EQ(y[5], 6.5f);    // q 21
  EXPECT_EQ(y[16], 11.5f);  // q 31
  EXPECT_EQ(y[17], 3.0f);   // q 14
  EXPECT_EQ(y[31], 4.0f);   // q 16
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], q5_expected_q(i) * 0.5f - 4.0f) << i;
}

// Q8_0: d = 3 (0x4200); qs = -128, -1, 0, 1, 127, then i - 16 for the rest.
TEST(QuantsHandMade, Q8_0) {
  Bytes b;
  put16(b, 0x4200);
  const int8_t first[5] = {-128, -1, 0, 1, 127};
  for (int8_t q : first) b.push_back(static_cast<uint8_t>(q));
  for (int i = 5; i < 32; ++i) b.push_back(static_cast<uint8_t>(static_cast<int8_t>(i - 16)));
  const auto y = dequant(DType::Q8_0, b, 32);
  EXPECT_EQ(y[0], -384.0f);
  EXPECT_EQ(y[1], -3.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 3.0f);
  EXPECT_EQ(y[4], 381.0f);
  EXPECT_EQ(y[31], 45.0f);  // (31 - 16) * 3
}

// Q4_K / Q5_K scales used below (sub-block j: 6-bit scale sc, 6-bit min m):
//   sc = 1, 2, 3, 4, 5, 17, 33, 63      m = 0, 1, 2, 3, 52, 36, 24, 15
// The top two bits of sc[4..7] (0, 1, 2, 3) and of m[4..7] (3, 2, 1, 0) differ,
// so swapping where they live cannot go unnoticed.
// Packing (get_scale_min_k4):
//   bytes 0..3  = sc[0..3] | (sc[4..7] >> 4) << 6
//               = 1|0<<6, 2|1<<6, 3|2<<6, 4|3<<6   = 01 42 83 c4
//   bytes 4..7  = m[0..3] | (m[4..7] >> 4) << 6
//               = 0|3<<6, 1|2<<6, 2|1<<6, 3|0<<6   = c0 81 42 03
//   bytes 8..11 = (sc[4..7] & 15) | (m[4..7] & 15) << 4
//               = 5|4<<4, 1|4<<4, 1|8<<4, 15|15<<4 = 45 41 81 ff
const uint8_t kKScales[12] = {0x01, 0x42, 0x83, 0xc4, 0xc0, 0x81,
                              0x42, 0x03, 0x45, 0x41, 0x81, 0xff};
const int kKSc[8] = {1, 2, 3, 4, 5, 17, 33, 63};
const int kKMin[8] = {0, 1, 2, 3, 52, 36, 24, 15};

TEST(QuantsHandMade, GetScaleMinK4UnpacksAllEightSubBlocks) {
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, kKScales, &sc, &m);
    EXPECT_EQ(sc, kKSc[j]) << j;
    EXPECT_EQ(m, kKMin[j]) << j;
  }
}

// Q4_K: d = 2 (0x4000), dmin = 0.5 (0x3800), scales as above. In each 32-byte
// chunk c, byte l = (l & 15) | (15 - (l & 15)) << 4: value 64c + l has q = l & 15
// (sub-block 2c), value 64c + 32 + l has q = 15 - (l & 15) (sub-block 2c + 1).
// y = (2 * sc) * q - 0.5 * m.
TEST(QuantsHandMade, Q4_K) {
  Bytes b;
  put16(b, 0x4000);
  put16(b, 0x3800);
  b.insert(b.end(), kKScales, kKScales + 12);
  for (int i = 0; i < 128; ++i) {
    const int l = i % 32;
    b.push_back(static_cast<uint8_t>((l & 15) | (15 - (l & 15)) << 4));
  }
  const auto y = dequant(DType::Q4_K, b, 256);
  EXPECT_EQ(y[0], 0.0f);       // sub 0, q 0: 2*1*0 - 0.5*0
  EXPECT_EQ(y[5], 10.0f);      // sub 0, q 5: 2*1*5 - 0
  EXPECT_EQ(y[35], 47.5f);     // sub 1, l 3, q 12: 2*2*12 - 0.5*1
  EXPECT_EQ(y[135], 44.0f);    // sub 4, l 7, q 7: 2*5*7 - 0.5*52 = 70 - 26
  EXPECT_EQ(y[161], 458.0f);   // sub 5, l 1, q 14: 2*17*14 - 0.5*36 = 476 - 18
  EXPECT_EQ(y[207], 978.0f);   // sub 6, l 15, q 15: 2*33*15 - 0.5*24 = 990 - 12
  EXPECT_EQ(y[240], 1882.5f);  // sub 7, l 16, q 15: 2*63*15 - 0.5*15 = 1890 - 7.5
  EXPECT_EQ(y[255], -7.5f);    // sub 7, l 31, q 0: 0 - 7.5
  for (int i = 0; i < 256; ++i) {
    const int sub = i / 32;
    const int l = i % 32;
    const int q = sub % 2 == 0 ? (l & 15) : 15 - (l & 15);
    EXPECT_EQ(y[i], (2.0f * kKSc[sub]) * q - 0.5f * kKMin[sub]) << i;
  }
}

// Q5_K: as Q4_K plus the fifth-bit plane qh[32]: qh[l] = 0x55 for even l
// (bits 0,2,4,6: the first 32 values of every 64-chunk get +16) and 0xaa for
// odd l (bits 1,3,5,7: the second 32 values get +16).
TEST(QuantsHandMade, Q5_K) {
  Bytes b;
  put16(b, 0x4000);
  put16(b, 0x3800);
  b.insert(b.end(), kKScales, kKScales + 12);
  for (int l = 0; l < 32; ++l) b.push_back(l % 2 == 0 ? 0x55 : 0xaa);
  for (int i = 0; i < 128; ++i) {
    const int l = i % 32;
    b.push_back(static_cast<uint8_t>((l & 15) | (15 - (l & 15)) << 4));
  }
  const auto y = dequant(DType::Q5_K, b, 256);
  EXPECT_EQ(y[0], 32.0f);      // sub 0, l 0 (even, bit 0 set): q 0+16: 2*1*16 - 0
  EXPECT_EQ(y[1], 2.0f);       // sub 0, l 1 (odd, bit 0 clear): q 1: 2*1*1
  EXPECT_EQ(y[32], 59.5f);     // sub 1, l 0 (bit 1 clear): q 15: 2*2*15 - 0.5
  EXPECT_EQ(y[33], 119.5f);    // sub 1, l 1 (bit 1 set): q 14+16: 2*2*30 - 0.5
  EXPECT_EQ(y[194], 1176.0f);  // sub 6, l 2 (even, bit 6 set): q 2+16: 2*33*18 - 12
  EXPECT_EQ(y[227], 3520.5f);  // sub 7, l 3 (odd, bit 7 set): q 12+16: 2*63*28 - 7.5
  EXPECT_EQ(y[226], 1630.5f);  // sub 7, l 2 (even, bit 7 clear): q 13: 2*63*13 - 7.5
  for (int i = 0; i < 256; ++i) {
    const int sub = i / 32;
    const int l = i % 32;
    const bool second_half_of_chunk = sub % 2 == 1;
    int q = second_half_of_chunk ? 15 - (l & 15) : (l & 15);
    if ((l % 2 == 1) == second_half_of_chunk) q += 16;
    EXPECT_EQ(y[i], (2.0f * kKSc[sub]) * q - 0.5f * kKMin[sub]) << i;
  }
}

// Q6_K: d = 0.5 (0x3800); ql[i] = i (0..127); qh = 0xe4 in the first half
// (bits 1-0 = 0, 3-2 = 1, 5-4 = 2, 7-6 = 3) and 0x1b in the second
// (3, 2, 1, 0); scales as listed. y = (0.5 * sc) * (q - 32).
const int8_t kQ6Scales[16] = {1, 2, -1, -2, 4, 8, 16, -16, 3, -3, 10, -10, 127, -128, 5, -5};

TEST(QuantsHandMade, Q6_K) {
  Bytes b;
  for (int i = 0; i < 128; ++i) b.push_back(static_cast<uint8_t>(i));
  for (int i = 0; i < 64; ++i) b.push_back(i < 32 ? 0xe4 : 0x1b);
  for (int8_t s : kQ6Scales) b.push_back(static_cast<uint8_t>(s));
  put16(b, 0x3800);
  const auto y = dequant(DType::Q6_K, b, 256);
  // First half.
  EXPECT_EQ(y[0], -16.0f);     // ql[0]=0x00 low 0, qh bits 1-0 = 0: q 0-32; sc[0]=1
  EXPECT_EQ(y[17], -31.0f);    // ql[17]=0x11 low 1, hi 0: q -31; sc[1]=2
  EXPECT_EQ(y[37], 5.5f);      // ql[37]=0x25 low 5, hi 1: 21-32 = -11; sc[2]=-1
  EXPECT_EQ(y[84], 4.0f);      // ql[20]=0x14 high 1, hi 2: 33-32 = 1; sc[5]=8
  EXPECT_EQ(y[127], -152.0f);  // ql[63]=0x3f high 3, hi 3: 51-32 = 19; sc[7]=-16
  // Second half (ql[64..], qh[32..], scales[8..]).
  EXPECT_EQ(y[128], 24.0f);   // ql[64]=0x40 low 0, hi 3: 48-32 = 16; sc[8]=3
  EXPECT_EQ(y[191], -75.0f);  // ql[127]=0x7f low 15, hi 2: 47-32 = 15; sc[11]=-10
  EXPECT_EQ(y[208], 704.0f);  // ql[80]=0x50 high 5, hi 1: 21-32 = -11; sc[13]=-128
  EXPECT_EQ(y[239], -65.0f);  // ql[111]=0x6f high 6, hi 0: 6-32 = -26; sc[14]=5
  EXPECT_EQ(y[255], 62.5f);   // ql[127]=0x7f high 7, hi 0: 7-32 = -25; sc[15]=-5
  for (int i = 0; i < 256; ++i) {
    const int half = i / 128;
    const int r = i % 128;     // index within the half
    const int group = r / 32;  // which of ql/qh's four 32-value groups
    const int l = r % 32;
    const int ql = 64 * half + l + (group % 2 == 1 ? 32 : 0);  // byte holding the low bits
    const int low = group < 2 ? (ql & 15) : (ql >> 4);         // ql[k] == k here
    const int qh = half == 0 ? 0xe4 : 0x1b;
    const int high = (qh >> (2 * group)) & 3;
    const int q = (low | high << 4) - 32;
    EXPECT_EQ(y[i], (0.5f * kQ6Scales[i / 16]) * q) << i;
  }
}

TEST(QuantsHandMade, MultiBlockRowsAndUnalignedSource) {
  // Two Q4_0 blocks with different scales, starting at an odd address.
  Bytes b = {0xee};                                // padding byte so the row starts unaligned
  put16(b, 0x3c00);                                // d = 1
  for (int j = 0; j < 16; ++j) b.push_back(0x98);  // q 8 / 9 -> 0 / 1
  put16(b, 0xc000);                                // d = -2
  for (int j = 0; j < 16; ++j) b.push_back(0x07);  // q 7 / 0 -> -1 / -8
  std::vector<float> y(64);
  dequantize_row(DType::Q4_0, b.data() + 1, y.data(), 64);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[16], 1.0f);
  EXPECT_EQ(y[32], 2.0f);   // -1 * -2
  EXPECT_EQ(y[48], 16.0f);  // -8 * -2
}

TEST(Quants, BlockSizesMatchDtypeTable) {
  EXPECT_EQ(dtype_info(DType::Q4_0).block_bytes, sizeof(BlockQ4_0));
  EXPECT_EQ(dtype_info(DType::Q4_1).block_bytes, sizeof(BlockQ4_1));
  EXPECT_EQ(dtype_info(DType::Q5_0).block_bytes, sizeof(BlockQ5_0));
  EXPECT_EQ(dtype_info(DType::Q5_1).block_bytes, sizeof(BlockQ5_1));
  EXPECT_EQ(dtype_info(DType::Q8_0).block_bytes, sizeof(BlockQ8_0));
  EXPECT_EQ(dtype_info(DType::Q4_K).block_bytes, sizeof(BlockQ4_K));
  EXPECT_EQ(dtype_info(DType::Q5_K).block_bytes, sizeof(BlockQ5_K));
  EXPECT_EQ(dtype_info(DType::Q6_K).block_bytes, sizeof(BlockQ6_K));
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0}) {
    EXPECT_EQ(dtype_info(t).block_elems, static_cast<uint32_t>(kLegacyBlock));
  }
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    EXPECT_EQ(dtype_info(t).block_elems, static_cast<uint32_t>(kSuperBlock));
  }
}

TEST(Quants, SupportedTypesAreExactlyTheDequantizableOnes) {
  for (uint32_t id = 0; id < 64; ++id) {
    const DTypeInfo* info = dtype_info(id);
    if (info == nullptr) continue;
    EXPECT_EQ(row_conversion_supported(info->type), info->can_dequantize) << info->name;
  }
}

TEST(Quants, UnsupportedTypesThrowNamingTheType) {
  float out[256];
  float in[256] = {};
  uint8_t raw[512] = {};
  for (DType t : {DType::Q2_K, DType::Q8_1, DType::IQ2_XXS, DType::I32, DType::TQ2_0}) {
    try {
      dequantize_row(t, raw, out, 256);
      ADD_FAILURE() << "no throw for " << dtype_name(t);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(dtype_name(t)), std::string::npos) << e.what();
    }
    EXPECT_THROW(quantize_row(t, in, raw, 256), Error);
  }
  try {
    dequantize_row(static_cast<DType>(99), raw, out, 256);
    ADD_FAILURE() << "no throw for id 99";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("99"), std::string::npos) << e.what();
  }
}

TEST(Quants, EmptyRowsAreFine) {
  dequantize_row(DType::Q4_K, nullptr, nullptr, 0);
  quantize_row(DType::F32, nullptr, nullptr, 0);
}

}  // namespace
}  // namespace encore::kernels
