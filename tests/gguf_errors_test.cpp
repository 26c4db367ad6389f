// Malformed GGUF images: each must be rejected with a GgufError naming the
// file, the key or tensor involved and the byte offset.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "encore/gguf.h"
#include "gguf_test_util.h"

namespace encore::gguf {
namespace {

using test::ByteBuilder;
using test::parse_error;

constexpr uint32_t kF32 = 0;
constexpr uint32_t kQ4_0 = 2;

// A file whose single KV is `key` of `type`, followed by the builder's extra bytes.
ByteBuilder one_kv(std::string_view key, uint32_t type) {
  ByteBuilder b;
  b.header(3, 0, 1).str(key).u32(type);
  return b;
}

TEST(GgufErrors, WrongMagic) {
  ByteBuilder b;
  b.raw("GGML").u32(3).u64(0).u64(0);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "not a GGUF file", "at byte 0",
                      "47 47 4d 4c");
}

TEST(GgufErrors, TooShortForMagic) {
  EXPECT_CONTAINS_ALL(parse_error({'G', 'G'}), "bad.gguf", "not a GGUF file", "2 bytes");
}

TEST(GgufErrors, UnsupportedVersions) {
  for (uint32_t v : {0u, 1u, 4u, 1000u}) {
    ByteBuilder b;
    b.header(v, 0, 0);
    EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf",
                        "unsupported GGUF version " + std::to_string(v), "at byte 4");
  }
  ByteBuilder v1;
  v1.header(1, 0, 0);
  EXPECT_CONTAINS_ALL(parse_error(v1.bytes()), "version 1 files");
}

TEST(GgufErrors, BigEndianFileIsRecognised) {
  ByteBuilder b;
  b.raw("GGUF").u32(0x03000000).u64(0).u64(0);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "big-endian");
}

TEST(GgufErrors, Version2IsAccepted) {
  ByteBuilder b;
  b.header(2, 0, 1).kv_u32("llama.block_count", 5);
  File f = File::from_bytes(b.bytes(), "v2.gguf");
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.get_u32("llama.block_count"), 5u);
}

TEST(GgufErrors, TruncatedHeader) {
  ByteBuilder b;
  b.raw("GGUF").u32(3).u32(0);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "truncated file", "tensor count",
                      "at byte 8");
}

TEST(GgufErrors, TruncatedInsideKey) {
  ByteBuilder b;
  b.header(3, 0, 1).u64(30).raw("general.arch");
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "metadata entry #0 (at byte 24)",
                      "truncated file", "key at byte 24 has length 30", "only 12 bytes remain");
}

TEST(GgufErrors, TruncatedInsideStringValue) {
  ByteBuilder b = one_kv("general.name", 8);
  const size_t at = b.size();
  b.u64(100).raw("abc");
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "key 'general.name' (at byte 24)",
                      "truncated file", fmt::format("string value at byte {}", at), "length 100");
}

TEST(GgufErrors, TruncatedInsideArrayOfScalars) {
  ByteBuilder b = one_kv("a.arr", 9);
  const size_t at = b.size();
  b.u32(4).u64(10).u32(1).u32(2).u32(3);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "key 'a.arr' (at byte 24)",
                      fmt::format("array at byte {} declares 10 items of type uint32", at),
                      "at least 40 bytes");
}

TEST(GgufErrors, TruncatedInsideArrayOfStrings) {
  ByteBuilder b = one_kv("tokenizer.ggml.tokens", 9);
  b.u32(8).u64(2).str("x");
  const size_t at = b.size();
  b.u64(5).raw("ab");
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "key 'tokenizer.ggml.tokens'",
                      "truncated file", fmt::format("string value at byte {} has length 5", at));
}

TEST(GgufErrors, TruncatedInsideScalarValue) {
  ByteBuilder b = one_kv("llama.block_count", 10);
  const size_t at = b.size();
  b.u32(5);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "key 'llama.block_count'",
                      fmt::format("uint64 value at byte {} needs 8 bytes", at));
}

TEST(GgufErrors, TruncatedInsideTensorInfo) {
  ByteBuilder b;
  b.header(3, 1, 0).str("token_embd.weight").u32(2).u64(64);
  const size_t at = b.size();
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf",
                      "tensor 'token_embd.weight' (info at byte 24)", "truncated file",
                      fmt::format("dimension at byte {} needs 8 bytes", at));
}

TEST(GgufErrors, TensorDataPastEndOfFile) {
  ByteBuilder b;
  b.header(3, 1, 0).tensor_info("output.weight", {8}, kF32, 0).pad_to(32);
  const size_t data = b.size();
  b.zeros(16);  // 32 bytes needed
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf",
                      "tensor 'output.weight' (info at byte 24)",
                      fmt::format("data [{}, {}) extends past the end of the file ({} bytes)", data,
                                  data + 32, data + 16));
}

TEST(GgufErrors, AbsurdKvCount) {
  ByteBuilder b;
  b.header(3, 0, uint64_t{1} << 40).zeros(100);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "metadata count 1099511627776",
                      "at byte 16", "impossible");
}

TEST(GgufErrors, AbsurdTensorCount) {
  ByteBuilder b;
  b.header(3, uint64_t{1} << 40, 0).zeros(100);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "tensor count 1099511627776", "at byte 8",
                      "impossible");
}

TEST(GgufErrors, CountsTogetherTooLarge) {
  ByteBuilder b;
  b.header(3, 2, 4).zeros(100);  // 2 * 33 + 4 * 14 = 122 > 100
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "cannot fit in the remaining 100 bytes");
}

TEST(GgufErrors, AbsurdKeyLength) {
  ByteBuilder b;
  b.header(3, 0, 1).u64(uint64_t{1} << 62).zeros(20);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "metadata entry #0 (at byte 24)",
                      "4611686018427387904", "1 GiB limit");
}

TEST(GgufErrors, AbsurdStringValueLength) {
  ByteBuilder b = one_kv("general.name", 8);
  const size_t at = b.size();
  b.u64(uint64_t{1} << 40).raw("abc");
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "key 'general.name'",
                      fmt::format("string value at byte {}", at), "1 GiB limit");
}

TEST(GgufErrors, AbsurdArrayLength) {
  ByteBuilder b = one_kv("tokenizer.ggml.scores", 9);
  const size_t at = b.size();
  b.u32(6).u64(uint64_t{1} << 62).zeros(16);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "key 'tokenizer.ggml.scores'",
                      fmt::format("array at byte {} declares 4611686018427387904 items", at),
                      "which need more than 2^64 bytes");
}

TEST(GgufErrors, TooManyArrayItemsInTotal) {
  // Enough bytes are present; the cap on parsed items stops it anyway.
  const uint64_t n = (uint64_t{1} << 23) + 1;
  ByteBuilder b = one_kv("x.bytes", 9);
  const size_t at = b.size();
  b.u32(0).u64(n).zeros(n);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "key 'x.bytes'",
                      fmt::format("array at byte {}", at), "8388608 array items");
}

// Each array item costs a Value (~100 bytes) but may take one byte of the
// file, so the number of items a file may declare grows with its size
// instead of allowing 8M items to any file.
TEST(GgufErrors, ArrayItemBudgetFollowsTheFileSize) {
  // 2^20 items are free, plus one per 8 bytes of file.
  const auto file_of = [](uint64_t n) {
    ByteBuilder b = one_kv("x.bytes", 9);
    b.u32(0).u64(n).zeros(n);
    return b;
  };
  const uint64_t ok = (uint64_t{1} << 20) + (uint64_t{1} << 17);  // 1.15 MiB file: fits
  File f = File::from_bytes(file_of(ok).bytes(), "ok.gguf");
  EXPECT_EQ(f.get_array("x.bytes").arr.size(), ok);

  const uint64_t n = uint64_t{1} << 21;  // 2 MiB file: 2^20 + 2^18 items allowed
  ByteBuilder b = file_of(n);
  const size_t size = b.size();
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "key 'x.bytes'",
                      fmt::format("more than {} array items in all", (1 << 20) + size / 8),
                      fmt::format("for a file of {} bytes", size), "8388608 array items");
}

// An array value nested `depth` levels deep, innermost holding one uint8.
void nested_arrays(ByteBuilder* b, int depth) {
  for (int level = 1; level < depth; ++level) b->u32(9).u64(1);
  b->u32(0).u64(1).u8(7);
}

TEST(GgufErrors, ArrayNestingLimit) {
  ByteBuilder ok = one_kv("deep", 9);
  nested_arrays(&ok, 16);
  File f = File::from_bytes(ok.bytes());
  const Value* v = f.find("deep");
  ASSERT_NE(v, nullptr);
  for (int level = 1; level < 16; ++level) v = &v->arr.at(0);
  EXPECT_EQ(v->elem, ValueType::UINT8);
  EXPECT_EQ(v->arr.at(0).u, 7u);

  ByteBuilder bad = one_kv("deep", 9);
  nested_arrays(&bad, 17);
  EXPECT_CONTAINS_ALL(parse_error(bad.bytes()), "bad.gguf", "key 'deep' (at byte 24)",
                      "nested more than 16 levels");
}

TEST(GgufErrors, UnknownValueType) {
  ByteBuilder b;
  b.header(3, 0, 1).str("x.y");
  const size_t at = b.size();
  b.u32(13).u64(0);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "key 'x.y' (at byte 24)",
                      fmt::format("unknown value type 13 at byte {}", at));
}

TEST(GgufErrors, UnknownArrayElementType) {
  ByteBuilder b = one_kv("x.y", 9);
  const size_t at = b.size();
  b.u32(99).u64(0);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "key 'x.y'",
                      fmt::format("unknown array element type 99 at byte {}", at));
}

TEST(GgufErrors, BoolOutOfRange) {
  ByteBuilder b = one_kv("x.flag", 7);
  const size_t at = b.size();
  b.u8(2).zeros(4);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "key 'x.flag'",
                      fmt::format("bool value 2 at byte {}", at));
}

TEST(GgufErrors, EmptyKey) {
  ByteBuilder b;
  b.header(3, 0, 1).str("").u32(4).u32(1);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "metadata entry #0 (at byte 24)",
                      "empty key");
}

TEST(GgufErrors, DuplicateKey) {
  ByteBuilder b;
  b.header(3, 0, 2).kv_u32("llama.block_count", 5);
  const size_t second = b.size();
  b.kv_u32("llama.block_count", 6);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf",
                      fmt::format("key 'llama.block_count' (at byte {})", second), "duplicate key",
                      "first defined at byte 24");
}

TEST(GgufErrors, KeyWithControlBytesIsEscaped) {
  ByteBuilder b;
  b.header(3, 0, 1).str("bad\nkey").u32(13).u32(0).u32(0);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "key 'bad\\x0akey'");
}

TEST(GgufErrors, UnknownTensorType) {
  ByteBuilder b;
  b.header(3, 1, 0).str("blk.0.attn_q.weight").u32(1).u64(32);
  const size_t at = b.size();
  b.u32(4).u64(0).pad_to(32).zeros(64);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf",
                      "tensor 'blk.0.attn_q.weight' (info at byte 24)",
                      fmt::format("unknown tensor type id 4 at byte {}", at));
}

TEST(GgufErrors, BadNDims) {
  for (uint32_t n_dims : {0u, 5u}) {
    ByteBuilder b;
    b.header(3, 1, 0).str("blk.0.attn_q.weight");
    const size_t at = b.size();
    b.u32(n_dims).zeros(64);
    EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "tensor 'blk.0.attn_q.weight'",
                        fmt::format("n_dims {} at byte {}; expected 1 to 4", n_dims, at));
  }
}

TEST(GgufErrors, ZeroSizedDimension) {
  ByteBuilder b;
  b.header(3, 1, 0).str("t").u32(2).u64(4);
  const size_t at = b.size();
  b.u64(0).u32(kF32).u64(0).zeros(32);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "tensor 't' (info at byte 24)",
                      fmt::format("zero-sized dimension: dims[1] at byte {}", at));
}

TEST(GgufErrors, DimsProductOverflows) {
  ByteBuilder b;
  b.header(3, 1, 0).tensor_info("t", {uint64_t{1} << 32, uint64_t{1} << 32, 2}, kF32, 0);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "tensor 't' (info at byte 24)",
                      "more than 2^63 elements");
}

TEST(GgufErrors, DimsLargerThanFile) {
  ByteBuilder b;
  b.header(3, 1, 0).tensor_info("t", {uint64_t{1} << 20, uint64_t{1} << 20}, kF32, 0);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "tensor 't' (info at byte 24)",
                      "need 4398046511104 bytes, more than the whole file");
}

TEST(GgufErrors, RowNotMultipleOfBlock) {
  ByteBuilder b;
  b.header(3, 1, 0).tensor_info("blk.0.ffn_up.weight", {33, 2}, kQ4_0, 0).zeros(64);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf",
                      "tensor 'blk.0.ffn_up.weight' (info at byte 24)",
                      "dims[0] = 33 is not a multiple of 32");
}

TEST(GgufErrors, EmptyAndOverlongTensorNames) {
  ByteBuilder empty;
  empty.header(3, 1, 0).tensor_info("", {4}, kF32, 0).zeros(32);
  EXPECT_CONTAINS_ALL(parse_error(empty.bytes()), "bad.gguf", "tensor info #0 (at byte 24)",
                      "empty tensor name");
  ByteBuilder longer;
  longer.header(3, 1, 0).tensor_info(std::string(64, 'n'), {4}, kF32, 0).zeros(32);
  EXPECT_CONTAINS_ALL(parse_error(longer.bytes()), "bad.gguf", "tensor info #0 (at byte 24)",
                      "64 bytes long; at most 63");
}

TEST(GgufErrors, DuplicateTensorName) {
  ByteBuilder b;
  b.header(3, 2, 0).tensor_info("a.weight", {8}, kF32, 0);
  const size_t second = b.size();
  b.tensor_info("a.weight", {8}, kF32, 32).pad_to(32).zeros(64);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf",
                      fmt::format("tensor 'a.weight' (info at byte {})", second),
                      "duplicate tensor name", "first defined at byte 24");
}

TEST(GgufErrors, TensorOffsetFarOutOfRange) {
  ByteBuilder b;
  b.header(3, 1, 0).tensor_info("t", {8}, kF32, uint64_t{1} << 63).pad_to(32).zeros(32);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf", "tensor 't' (info at byte 24)",
                      "extends past the end of the file");
}

TEST(GgufErrors, OverlappingTensorData) {
  ByteBuilder b;
  b.header(3, 2, 0).tensor_info("a", {16}, kF32, 0);  // [0, 64)
  const size_t second = b.size();
  b.tensor_info("b", {8}, kF32, 32).pad_to(32);  // [32, 64)
  const size_t data = b.size();
  b.zeros(64);
  EXPECT_CONTAINS_ALL(parse_error(b.bytes()), "bad.gguf",
                      fmt::format("tensor 'b' (info at byte {})", second),
                      fmt::format("data [{}, {}) overlaps the data of tensor 'a' [{}, {})",
                                  data + 32, data + 64, data, data + 64));
}

TEST(GgufErrors, MisalignedTensorOffset) {
  ByteBuilder b;
  b.header(3, 1, 0).str("t").u32(1).u64(4).u32(kF32);
  const size_t at = b.size();
  b.u64(16).pad_to(32).zeros(32);
  EXPECT_CONTAINS_ALL(
      parse_error(b.bytes()), "bad.gguf", "tensor 't' (info at byte 24)",
      fmt::format("data offset 16 at byte {} is not a multiple of the alignment 32", at));
}

TEST(GgufErrors, BadAlignmentValue) {
  for (uint32_t a : {0u, 3u, 48u}) {
    ByteBuilder b;
    b.header(3, 0, 1).kv_u32("general.alignment", a);
    EXPECT_CONTAINS_ALL(
        parse_error(b.bytes()), "bad.gguf", "key 'general.alignment' (at byte 24)",
        fmt::format("alignment {} (value at byte 53) is not a nonzero power of two", a));
  }
  ByteBuilder wrong_type;
  wrong_type.header(3, 0, 1).str("general.alignment").u32(10).u64(32);
  EXPECT_CONTAINS_ALL(parse_error(wrong_type.bytes()), "bad.gguf",
                      "key 'general.alignment' (at byte 24)", "has type uint64 (at byte 49)",
                      "expected uint32");
}

TEST(GgufErrors, CustomAlignmentIsHonoured) {
  ByteBuilder b;
  b.header(3, 1, 1).kv_u32("general.alignment", 64).tensor_info("t", {4}, kF32, 0).pad_to(64);
  const size_t data = b.size();
  b.f32(1).f32(2).f32(3).f32(4);
  File f = File::from_bytes(b.bytes());
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_section_offset(), data);
  float v[4];
  std::memcpy(v, f.tensor("t").data, sizeof(v));
  EXPECT_EQ(v[3], 4.0f);
}

// --- typed getters -------------------------------------------------------

File getter_file() {
  Writer w;
  w.set("general.name", Value::make_string("tiny"));
  w.set("llama.block_count", Value::make_u32(5));
  w.set("x.neg", Value::make_i32(-1));
  w.set("x.big", Value::make_u64(uint64_t{1} << 40));
  w.set("x.flag", Value::make_bool(true));
  w.set("x.eps", Value::make_f32(1e-5f));
  Value f64;
  f64.type = ValueType::FLOAT64;
  f64.f = 1e300;
  w.set("x.huge", f64);
  w.set("x.list", Value::make_array(ValueType::UINT32, {Value::make_u32(1)}));
  return File::from_bytes(w.to_bytes(), "model.gguf");
}

TEST(GgufGetters, MissingRequiredKey) {
  File f = getter_file();
  try {
    f.get_u32("llama.embedding_length");
    FAIL() << "expected a GgufError";
  } catch (const GgufError& e) {
    EXPECT_STREQ(e.what(), "model.gguf: missing required key 'llama.embedding_length'");
  }
  EXPECT_THROW(f.tensor("token_embd.weight"), GgufError);
  try {
    f.tensor("token_embd.weight");
  } catch (const GgufError& e) {
    EXPECT_CONTAINS_ALL(e.what(), "model.gguf", "missing required tensor 'token_embd.weight'");
  }
}

TEST(GgufGetters, WrongType) {
  File f = getter_file();
  try {
    f.get_u32("general.name");
    FAIL() << "expected a GgufError";
  } catch (const GgufError& e) {
    EXPECT_CONTAINS_ALL(e.what(),
                        "model.gguf: key 'general.name' (at byte 24) has type string, "
                        "expected an integer");
  }
  try {
    f.get_string("llama.block_count");
    FAIL() << "expected a GgufError";
  } catch (const GgufError& e) {
    EXPECT_CONTAINS_ALL(e.what(), "model.gguf", "key 'llama.block_count'",
                        "has type uint32, expected string");
  }
  EXPECT_THROW(f.get_bool("llama.block_count"), GgufError);
  EXPECT_THROW(f.get_f32("general.name"), GgufError);
  EXPECT_THROW(f.get_array("general.name"), GgufError);
  EXPECT_THROW(f.opt_string("llama.block_count"), GgufError);
}

TEST(GgufGetters, RangeChecks) {
  File f = getter_file();
  try {
    f.get_u32("x.neg");
    FAIL() << "expected a GgufError";
  } catch (const GgufError& e) {
    EXPECT_CONTAINS_ALL(e.what(), "model.gguf", "key 'x.neg'",
                        "= -1 (int32) does not fit in uint32");
  }
  EXPECT_THROW(f.get_u32("x.big"), GgufError);
  EXPECT_THROW(f.get_u64("x.neg"), GgufError);
  EXPECT_THROW(f.get_f32("x.huge"), GgufError);
  EXPECT_EQ(f.get_u64("x.big"), uint64_t{1} << 40);
  EXPECT_EQ(f.get_i64("x.neg"), -1);
  EXPECT_EQ(f.get_i64("x.big"), int64_t{1} << 40);
  EXPECT_EQ(f.get_u32("llama.block_count"), 5u);
  EXPECT_EQ(f.get_f32("llama.block_count"), 5.0f);
  EXPECT_EQ(f.get_f32("x.eps"), 1e-5f);
  EXPECT_TRUE(f.get_bool("x.flag"));
  EXPECT_EQ(f.get_string("general.name"), "tiny");
  EXPECT_EQ(f.get_array("x.list").arr.size(), 1u);
}

TEST(GgufGetters, OptionalVariants) {
  File f = getter_file();
  EXPECT_FALSE(f.opt_u32("absent").has_value());
  EXPECT_FALSE(f.opt_f32("absent").has_value());
  EXPECT_FALSE(f.opt_bool("absent").has_value());
  EXPECT_FALSE(f.opt_string("absent").has_value());
  EXPECT_EQ(f.opt_u32("llama.block_count"), 5u);
  EXPECT_EQ(f.opt_f32("x.eps"), 1e-5f);
  EXPECT_EQ(f.opt_bool("x.flag"), true);
  EXPECT_EQ(f.opt_string("general.name"), "tiny");
  EXPECT_THROW(f.opt_u32("x.neg"), GgufError);
  EXPECT_THROW(f.opt_bool("general.name"), GgufError);
  EXPECT_EQ(f.find("absent"), nullptr);
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
}

TEST(GgufOpen, MissingFileAndDirectory) {
  try {
    File::open("/nonexistent/model.gguf");
    FAIL() << "expected a GgufError";
  } catch (const GgufError& e) {
    EXPECT_CONTAINS_ALL(e.what(), "/nonexistent/model.gguf", "cannot open");
  }
  for (LoadMode mode : {LoadMode::Read, LoadMode::Mmap}) {
    try {
      File::open("/tmp", mode);
      FAIL() << "expected a GgufError";
    } catch (const GgufError& e) {
      EXPECT_CONTAINS_ALL(e.what(), "/tmp", "not a regular file");
    }
  }
}

// A large file that is not GGUF fails on its first 8 bytes in both load
// modes, before anything the size of the file is allocated or read.
TEST(GgufOpen, LargeNonGgufFileFailsAtOnce) {
  test::TempDir dir;
  const std::string path = dir.file("big.bin");
  {
    std::ofstream out(path, std::ios::binary);
    out << "NOTGGUF!";
  }
  std::error_code ec;
  std::filesystem::resize_file(path, uint64_t{1} << 40, ec);  // sparse: 1 TiB, no disk used
  if (ec) GTEST_SKIP() << "no sparse 1 TiB file here: " << ec.message();
  for (LoadMode mode : {LoadMode::Read, LoadMode::Mmap}) {
    try {
      File::open(path, mode);
      FAIL() << "expected a GgufError";
    } catch (const GgufError& e) {
      EXPECT_CONTAINS_ALL(e.what(), path, "not a GGUF file", "4e 4f 54 47");
    }
  }
  std::ofstream(path, std::ios::binary | std::ios::in | std::ios::out).write("GGUF\1\0\0\0", 8);
  try {
    File::open(path, LoadMode::Read);
    FAIL() << "expected a GgufError";
  } catch (const GgufError& e) {
    EXPECT_CONTAINS_ALL(e.what(), path, "unsupported GGUF version 1");
  }
}

#if defined(__SANITIZE_ADDRESS__)
#define ENCORE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ENCORE_TEST_ASAN 1
#endif
#endif

// Not under ASan: its shadow memory needs more address space than the limit
// below, and its allocator aborts on a request this size.
#ifndef ENCORE_TEST_ASAN
TEST(GgufOpen, FileTooLargeForMemorySuggestsMmap) {
  test::TempDir dir;
  const std::string path = dir.file("huge.gguf");
  {
    ByteBuilder b;
    b.header(3, 0, 0);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.bytes().data()),
              static_cast<std::streamsize>(b.size()));
  }
  std::error_code ec;
  std::filesystem::resize_file(path, uint64_t{1} << 40, ec);  // sparse: 1 TiB, no disk used
  if (ec) GTEST_SKIP() << "no sparse 1 TiB file here: " << ec.message();
  // The allocation must fail whatever the machine's overcommit policy.
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &old_limit), 0);
  struct rlimit limit = old_limit;
  limit.rlim_cur = std::min<rlim_t>(old_limit.rlim_max, rlim_t{64} << 30);
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &limit), 0);
  std::string message;
  try {
    File::open(path, LoadMode::Read);
  } catch (const GgufError& e) {
    message = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &old_limit), 0);
  EXPECT_CONTAINS_ALL(message, path, "not enough memory to read 1099511627776 bytes",
                      "load it with mmap instead");
}
#endif

TEST(GgufOpen, EmptyFile) {
  test::TempDir dir;
  const std::string path = dir.file("empty.gguf");
  { std::ofstream(path).flush(); }
  for (LoadMode mode : {LoadMode::Read, LoadMode::Mmap}) {
    try {
      File::open(path, mode);
      FAIL() << "expected a GgufError";
    } catch (const GgufError& e) {
      EXPECT_CONTAINS_ALL(e.what(), path, "0 bytes long");
    }
  }
}

}  // namespace
}  // namespace encore::gguf
