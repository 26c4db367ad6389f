// Writer -> reader round trips: every value type (nested arrays included),
// every tensor type, both load modes, custom alignment; writer validation
// and atomic writes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>

#include "encore/gguf.h"
#include "gguf_test_util.h"

namespace encore::gguf {
namespace {

Value scalar(ValueType t, uint64_t u, int64_t i, double f) {
  Value v;
  v.type = t;
  v.u = u;
  v.i = i;
  v.f = f;
  return v;
}

// One key per value type, plus arrays of each and nested arrays.
std::vector<std::pair<std::string, Value>> all_values() {
  std::vector<std::pair<std::string, Value>> kv;
  kv.emplace_back("t.u8", scalar(ValueType::UINT8, 255, 0, 0));
  kv.emplace_back("t.i8", scalar(ValueType::INT8, 0, -128, 0));
  kv.emplace_back("t.u16", scalar(ValueType::UINT16, 65535, 0, 0));
  kv.emplace_back("t.i16", scalar(ValueType::INT16, 0, -32768, 0));
  kv.emplace_back("t.u32", Value::make_u32(4000000000u));
  kv.emplace_back("t.i32", Value::make_i32(-2000000000));
  kv.emplace_back("t.f32", Value::make_f32(-1.5e-7f));
  kv.emplace_back("t.bool", Value::make_bool(true));
  kv.emplace_back("t.string", Value::make_string(std::string("h\xc3\xa9llo\0world", 12)));
  kv.emplace_back("t.empty_string", Value::make_string(""));
  kv.emplace_back("t.u64", Value::make_u64(UINT64_MAX));
  kv.emplace_back("t.i64", scalar(ValueType::INT64, 0, INT64_MIN, 0));
  kv.emplace_back("t.f64", scalar(ValueType::FLOAT64, 0, 0, 3.141592653589793));
  // Arrays of every element type.
  std::vector<std::pair<std::string, Value>> scalars(kv.begin(), kv.end());
  for (const auto& [key, v] : scalars) {
    kv.emplace_back(key + ".array", Value::make_array(v.type, {v, v, v}));
  }
  kv.emplace_back("t.empty_array", Value::make_array(ValueType::INT32, {}));
  // Arrays of arrays, with differing element types and lengths.
  Value inner_a = Value::make_array(ValueType::UINT32, {Value::make_u32(1), Value::make_u32(2)});
  Value inner_b = Value::make_array(ValueType::STRING, {Value::make_string("x")});
  Value inner_c = Value::make_array(ValueType::FLOAT32, {});
  kv.emplace_back("t.nested", Value::make_array(ValueType::ARRAY, {inner_a, inner_b, inner_c}));
  Value deep = Value::make_array(ValueType::BOOL, {Value::make_bool(false)});
  for (int level = 1; level < 16; ++level) deep = Value::make_array(ValueType::ARRAY, {deep});
  kv.emplace_back("t.deep16", deep);
  return kv;
}

std::vector<uint8_t> random_bytes(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// Every known tensor type, two rows of two blocks each, random bytes.
Writer make_writer(uint32_t alignment, std::vector<std::vector<uint8_t>>* datas) {
  Writer w(alignment);
  for (const auto& [key, v] : all_values()) w.set(key, v);
  for (uint32_t raw = 0; raw < 64; ++raw) {
    const DTypeInfo* info = dtype_info(raw);
    if (info == nullptr) continue;
    std::vector<uint64_t> dims = {uint64_t{info->block_elems} * 2, 3};
    const uint64_t n_bytes = uint64_t{info->block_bytes} * 2 * 3;
    datas->push_back(random_bytes(n_bytes, raw));
    const std::string name = fmt::format("tensor.{}", info->name);
    if (raw % 2 == 0) {
      w.add_tensor(name, info->type, dims, datas->back());
    } else {
      std::vector<uint8_t> copy = datas->back();
      w.add_tensor(name, info->type, dims, [copy](uint8_t* dst, uint64_t n) {
        ASSERT_EQ(n, copy.size());
        std::memcpy(dst, copy.data(), n);
      });
    }
  }
  return w;
}

void check_file(const File& f, uint32_t alignment, const std::vector<std::vector<uint8_t>>& datas) {
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.data_section_offset() % alignment, 0u);
  const auto expected = all_values();
  size_t k = 0;
  for (const auto& [key, v] : expected) {
    const Value* got = f.find(key);
    ASSERT_NE(got, nullptr) << key;
    EXPECT_TRUE(*got == v) << key << ": " << got->to_string() << " vs " << v.to_string();
  }
  // Insertion order is kept (general.alignment first when not the default).
  const size_t first = alignment == 32 ? 0 : 1;
  ASSERT_EQ(f.metadata().size(), expected.size() + first);
  for (k = 0; k < expected.size(); ++k) EXPECT_EQ(f.metadata()[k + first].key, expected[k].first);

  ASSERT_EQ(f.tensors().size(), datas.size());
  k = 0;
  for (uint32_t raw = 0; raw < 64; ++raw) {
    const DTypeInfo* info = dtype_info(raw);
    if (info == nullptr) continue;
    const TensorInfo& t = f.tensors()[k];
    EXPECT_EQ(t.name, fmt::format("tensor.{}", info->name));
    EXPECT_EQ(&t, &f.tensor(t.name));
    EXPECT_EQ(t.type, info->type);
    EXPECT_EQ(t.dims, (std::vector<uint64_t>{uint64_t{info->block_elems} * 2, 3}));
    EXPECT_EQ(t.n_elements, uint64_t{info->block_elems} * 6);
    EXPECT_EQ(t.n_rows(), 3u);
    EXPECT_EQ(t.n_bytes, datas[k].size());
    EXPECT_EQ(t.data_offset % alignment, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % std::min<uint32_t>(alignment, 64), 0u)
        << t.name;
    EXPECT_TRUE(std::equal(t.bytes().begin(), t.bytes().end(), datas[k].begin())) << t.name;
    ++k;
  }
}

TEST(GgufRoundTrip, InMemory) {
  std::vector<std::vector<uint8_t>> datas;
  Writer w = make_writer(32, &datas);
  File f = File::from_bytes(w.to_bytes(), "mem.gguf");
  EXPECT_EQ(f.path(), "mem.gguf");
  check_file(f, 32, datas);
}

TEST(GgufRoundTrip, FileBothLoadModes) {
  test::TempDir dir;
  for (uint32_t alignment : {32u, 64u, 4096u}) {
    std::vector<std::vector<uint8_t>> datas;
    Writer w = make_writer(alignment, &datas);
    const std::string path = dir.file(fmt::format("model-{}.gguf", alignment));
    w.write(path);
    // The file and to_bytes() hold the same bytes.
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> on_disk((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(on_disk, w.to_bytes());
    EXPECT_EQ(on_disk.size() % alignment, 0u);
    for (LoadMode mode : {LoadMode::Read, LoadMode::Mmap}) {
      File f = File::open(path, mode);
      EXPECT_EQ(f.load_mode(), mode);
      EXPECT_EQ(f.path(), path);
      EXPECT_EQ(f.file_size(), on_disk.size());
      check_file(f, alignment, datas);
      // Moving keeps the tensor views valid.
      const uint8_t* data = f.tensors()[0].data;
      File moved = std::move(f);
      EXPECT_EQ(moved.tensors()[0].data, data);
    }
  }
}

// A file large enough to be read in several pieces on several threads (and
// into a huge-page buffer): every byte lands where mmap sees it. Each
// byte is a hash of its offset, so a piece read to the wrong place shows.
TEST(GgufRoundTrip, LargeFileReadInPiecesEqualsTheMapping) {
  test::TempDir dir;
  const uint64_t n = (uint64_t{200} << 20) / 4 + 3;  // F32 values: 200 MiB and a bit
  Writer w;
  w.add_tensor("big", DType::F32, {n}, [](uint8_t* dst, uint64_t bytes) {
    for (uint64_t i = 0; i < bytes; ++i) dst[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  });
  const std::string path = dir.file("big.gguf");
  w.write(path);
  const File read = File::open(path, LoadMode::Read);
  const File mapped = File::open(path, LoadMode::Mmap);
  const std::span<const uint8_t> a = read.tensors()[0].bytes(), b = mapped.tensors()[0].bytes();
  ASSERT_EQ(a.size(), n * 4);
  ASSERT_EQ(b.size(), n * 4);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0);
  EXPECT_EQ(a[a.size() - 1], static_cast<uint8_t>(((a.size() - 1) * 2654435761u) >> 13));
}

// release() gives back the whole pages inside a tensor: read into memory
// they then read as zeros, mapped they are read from the file again; the
// bytes around them (other tensors, the partial pages at the ends) stay.
TEST(GgufRoundTrip, ReleasedTensorPagesAreGivenBack) {
  test::TempDir dir;
  const uint64_t n = 5 * 4096 / 4 + 7;  // F32 values: over 5 pages
  const auto fill = [](uint8_t* dst, uint64_t bytes) {
    for (uint64_t i = 0; i < bytes; ++i) dst[i] = static_cast<uint8_t>(1 + i % 251);
  };
  Writer w(32);
  w.add_tensor("a", DType::F32, {n}, fill);
  w.add_tensor("b", DType::F32, {n}, fill);
  const std::string path = dir.file("r.gguf");
  w.write(path);
  for (LoadMode mode : {LoadMode::Read, LoadMode::Mmap}) {
    File f = File::open(path, mode);
    const std::span<const uint8_t> a = f.tensor("a").bytes(), b = f.tensor("b").bytes();
    EXPECT_EQ(f.released_bytes(), 0u);
    const uint64_t got = f.release(a);
    EXPECT_GE(got, 3u * 4096);  // at least the 3 pages wholly inside either way
    EXPECT_LE(got, a.size());
    EXPECT_EQ(got % 4096, 0u);
    EXPECT_EQ(f.released_bytes(), got);
    size_t zeros = 0;
    for (uint8_t v : a) zeros += v == 0;
    EXPECT_EQ(zeros, mode == LoadMode::Read ? got : 0u);
    EXPECT_EQ(a[0], 1);
    EXPECT_EQ(a[a.size() - 1], 1 + (a.size() - 1) % 251);
    for (uint64_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], 1 + i % 251) << i;
    const std::vector<uint8_t> outside(8);
    EXPECT_THROW(f.release(outside), std::logic_error);
  }
}

TEST(GgufRoundTrip, EmptyFile) {
  Writer w;
  std::vector<uint8_t> bytes = w.to_bytes();
  EXPECT_EQ(bytes.size(), 32u);  // 24-byte header padded to the alignment
  File f = File::from_bytes(bytes);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_TRUE(f.tensors().empty());
}

TEST(GgufValue, ToString) {
  EXPECT_EQ(Value::make_u32(7).to_string(), "7");
  EXPECT_EQ(Value::make_i32(-7).to_string(), "-7");
  EXPECT_EQ(Value::make_f32(0.5f).to_string(), "0.5");
  EXPECT_EQ(Value::make_bool(false).to_string(), "false");
  EXPECT_EQ(Value::make_string("a\"b\n").to_string(), "\"a\\\"b\\n\"");
  std::vector<Value> items;
  for (uint32_t k = 0; k < 10; ++k) items.push_back(Value::make_u32(k));
  EXPECT_EQ(Value::make_array(ValueType::UINT32, items).to_string(3),
            "[0, 1, 2, ... (10 uint32 items)]");
  EXPECT_STREQ(value_type_name(ValueType::FLOAT64), "float64");
  EXPECT_TRUE(Value::make_u64(1).is_integer());
  EXPECT_FALSE(Value::make_bool(true).is_integer());
  EXPECT_TRUE(Value::make_f32(1).is_float());
}

TEST(GgufValue, TypeClassesEqualityAndShapes) {
  EXPECT_TRUE(Value::make_i32(-1).is_signed());
  EXPECT_FALSE(Value::make_u32(1).is_signed());
  EXPECT_FALSE(Value::make_f32(1).is_signed());
  EXPECT_TRUE(is_integer_type(ValueType::INT8));
  EXPECT_FALSE(is_integer_type(ValueType::BOOL));
  EXPECT_TRUE(is_signed_type(ValueType::INT64));
  EXPECT_FALSE(is_signed_type(ValueType::UINT64));

  EXPECT_TRUE(Value::make_u32(5) == Value::make_u32(5));
  EXPECT_FALSE(Value::make_u32(5) == Value::make_u64(5));  // type matters
  Value stray = Value::make_u32(5);
  stray.i = 99;  // a field of another type is ignored
  EXPECT_TRUE(stray == Value::make_u32(5));
  EXPECT_FALSE(Value::make_f32(0.0f) == Value::make_f32(-0.0f));  // bit patterns
  EXPECT_TRUE(Value::make_f32(NAN) == Value::make_f32(NAN));
  const Value a = Value::make_array(ValueType::STRING, {Value::make_string("x")});
  EXPECT_TRUE(a == Value::make_array(ValueType::STRING, {Value::make_string("x")}));
  EXPECT_FALSE(a == Value::make_array(ValueType::STRING, {Value::make_string("y")}));
  EXPECT_FALSE(Value::make_array(ValueType::UINT8, {}) == Value::make_array(ValueType::INT8, {}));

  EXPECT_EQ(shape_string(std::vector<uint64_t>{4096, 32000}), "[4096, 32000]");
  EXPECT_EQ(shape_string(std::vector<uint64_t>{7}), "[7]");
}

TEST(GgufWriter, Float32ValueOutOfRangeIsRejected) {
  Writer w;
  for (double bad : {1e300, -1e300, 3.5e38}) {
    Value v = Value::make_f32(0);
    v.f = bad;
    try {
      w.set("x", v);
      ADD_FAILURE() << "expected InvalidArgument for " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_CONTAINS_ALL(e.what(), "key 'x'", "does not fit in float32");
    }
    EXPECT_THROW(w.set("y", Value::make_array(ValueType::FLOAT32, {v})), InvalidArgument);
  }
  for (double ok :
       {3.4028234663852886e38, -1e-45, static_cast<double>(INFINITY), static_cast<double>(NAN)}) {
    Value v = Value::make_f32(0);
    v.f = ok;
    EXPECT_NO_THROW(w.set("x", v)) << ok;
  }
  Value wide;
  wide.type = ValueType::FLOAT64;
  wide.f = 1e300;
  EXPECT_NO_THROW(w.set("x", wide));
  const File f = File::from_bytes(w.to_bytes());
  EXPECT_EQ(f.find("y"), nullptr);  // every rejected set() left the writer unchanged
  EXPECT_EQ(f.find("x")->f, 1e300);
}

TEST(GgufWriter, RejectsInvalidInput) {
  EXPECT_THROW(Writer(0), InvalidArgument);
  EXPECT_THROW(Writer(24), InvalidArgument);
  Writer w;
  EXPECT_THROW(w.set("", Value::make_u32(1)), InvalidArgument);
  Value too_big;
  too_big.type = ValueType::UINT8;
  too_big.u = 300;
  EXPECT_THROW(w.set("x", too_big), InvalidArgument);
  Value bad_bool = Value::make_bool(true);
  bad_bool.u = 2;
  EXPECT_THROW(w.set("x", bad_bool), InvalidArgument);
  EXPECT_THROW(w.set("x", Value::make_array(ValueType::UINT32, {Value::make_i32(1)})),
               InvalidArgument);
  Value deep = Value::make_array(ValueType::UINT8, {});
  for (int level = 1; level < 17; ++level) deep = Value::make_array(ValueType::ARRAY, {deep});
  EXPECT_THROW(w.set("x", deep), InvalidArgument);
  EXPECT_THROW(w.set("general.alignment", Value::make_u32(3)), InvalidArgument);
  EXPECT_THROW(w.set("general.alignment", Value::make_u64(64)), InvalidArgument);

  EXPECT_THROW(w.add_tensor("", DType::F32, {4}, std::vector<uint8_t>(16)), InvalidArgument);
  EXPECT_THROW(w.add_tensor(std::string(64, 'n'), DType::F32, {4}, std::vector<uint8_t>(16)),
               InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", DType::F32, {}, std::vector<uint8_t>{}), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", DType::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)),
               InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", DType::F32, {4, 0}, std::vector<uint8_t>{}), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", DType::Q8_0, {33}, std::vector<uint8_t>(34)), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", DType::F32, {4}, std::vector<uint8_t>(15)), InvalidArgument);
  try {
    w.add_tensor("t", DType::Q4_K, {256, 2}, std::vector<uint8_t>(10));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_CONTAINS_ALL(e.what(), "tensor 't'", "10 bytes of data given",
                        "Q4_K [256, 2] needs 288");
  }
  w.add_tensor("t", DType::F32, {4}, std::vector<uint8_t>(16));
  EXPECT_THROW(w.add_tensor("t", DType::F32, {4}, std::vector<uint8_t>(16)), InvalidArgument);
}

TEST(GgufWriter, SetReplacesAndAlignmentKeyFollows) {
  Writer w;
  w.set("a", Value::make_u32(1));
  w.set("b", Value::make_u32(2));
  w.set("a", Value::make_string("again"));
  w.set("general.alignment", Value::make_u32(128));
  w.add_tensor("t", DType::F32, {3}, std::vector<uint8_t>(12, 1));
  File f = File::from_bytes(w.to_bytes());
  ASSERT_EQ(f.metadata().size(), 3u);
  EXPECT_EQ(f.metadata()[0].key, "a");
  EXPECT_EQ(f.get_string("a"), "again");
  EXPECT_EQ(f.alignment(), 128u);
  EXPECT_EQ(f.data_section_offset() % 128, 0u);
}

TEST(GgufWriter, AtomicWrite) {
  test::TempDir dir;
  const std::string path = dir.file("model.gguf");
  Writer good;
  good.set("x", Value::make_u32(1));
  good.write(path);
  const auto old_size = std::filesystem::file_size(path);

  // A failing producer leaves the old file and no temp file behind.
  Writer bad;
  bad.set("x", Value::make_u32(2));
  bad.add_tensor("t", DType::F32, {4},
                 [](uint8_t*, uint64_t) { throw std::runtime_error("producer failed"); });
  EXPECT_THROW(bad.write(path), std::runtime_error);
  EXPECT_EQ(std::filesystem::file_size(path), old_size);
  EXPECT_EQ(File::open(path).get_u32("x"), 1u);
  size_t n_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++n_files;
    EXPECT_EQ(e.path().filename(), "model.gguf");
  }
  EXPECT_EQ(n_files, 1u);

  // Writing into a missing folder is an encore::Error naming the path.
  try {
    good.write(dir.file("missing/model.gguf"));
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_CONTAINS_ALL(e.what(), "missing/model.gguf", "cannot create the temporary file");
  }
}

}  // namespace
}  // namespace encore::gguf
