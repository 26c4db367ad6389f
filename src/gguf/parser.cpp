// Parsing and validation of a GGUF image. Every count, length, type, shape
// and offset read from the file is checked against the bytes that remain
// before anything is allocated for it, with overflow-safe arithmetic, so a
// malformed file gets a GgufError and never a crash or a huge allocation.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>

#include "gguf/internal.h"
#include "util/text.h"

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace encore::gguf::detail {
namespace {

[[noreturn]] void fail_header(const std::string& name, std::string_view msg) {
  throw GgufError(fmt::format("{}: {}", name, msg));
}

// The 4-byte magic at p.
void check_magic(const uint8_t* p, const std::string& name) {
  uint32_t magic;
  std::memcpy(&magic, p, sizeof magic);
  if (magic != kMagic) {
    fail_header(name, fmt::format("not a GGUF file: expected the magic \"GGUF\" (47 47 55 46) "
                                  "at byte 0, found {:02x} {:02x} {:02x} {:02x}",
                                  p[0], p[1], p[2], p[3]));
  }
}

void check_version(uint32_t version, const std::string& name) {
  if (version == 2 || version == 3) return;
  std::string hint;
  if (version == 1) {
    hint = "; version 1 files (from 2023) must be converted to a newer GGUF";
  } else if (__builtin_bswap32(version) == 2 || __builtin_bswap32(version) == 3) {
    hint = fmt::format(
        "; this looks like a big-endian GGUF v{}, and only little-endian "
        "files are supported",
        __builtin_bswap32(version));
  }
  fail_header(name, fmt::format("unsupported GGUF version {} at byte 4; only versions 2 and 3 "
                                "are supported{}",
                                version, hint));
}

// "at least a*b bytes", computed without overflow.
std::string at_least_bytes(uint64_t a, uint64_t b) {
  uint64_t p;
  if (__builtin_mul_overflow(a, b, &p)) return "more than 2^64 bytes";
  return fmt::format("at least {} bytes", p);
}

class Parser {
 public:
  Parser(std::span<const uint8_t> image, const std::string& name)
      : p_(image.data()),
        size_(image.size()),
        name_(name),
        max_array_elements_(std::min(kMaxTotalArrayElements,
                                     kFreeArrayElements + size_ / kFileBytesPerArrayElement)) {}

  Parsed run() {
    read_header();
    for (uint64_t k = 0; k < n_kv_; ++k) read_kv(k);
    for (uint64_t k = 0; k < n_tensors_; ++k) read_tensor_info(k);
    ctx_.clear();
    place_tensor_data();
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(std::string_view msg) const {
    if (ctx_.empty()) throw GgufError(fmt::format("{}: {}", name_, msg));
    throw GgufError(fmt::format("{}: {}: {}", name_, ctx_, msg));
  }

  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      fail(fmt::format(
          "truncated file: {} at byte {} needs {} bytes, but only {} remain (file size {}); "
          "the file is truncated or corrupt",
          what, pos_, n, remaining(), size_));
    }
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what) {
    const uint64_t at = pos_;
    // Not read<>() with a formatted description: this runs once per string
    // (hundreds of thousands in a vocabulary), so the text is built only on failure.
    if (remaining() < sizeof(uint64_t))
      need(sizeof(uint64_t), fmt::format("the length of the {}", what));
    const uint64_t len = read<uint64_t>("");
    if (len > kMaxStringBytes) {
      fail(
          fmt::format("the {} at byte {} claims a length of {} bytes, more than the 1 GiB limit; "
                      "the file is corrupt",
                      what, at, len));
    }
    if (len > remaining()) {
      fail(fmt::format(
          "truncated file: the {} at byte {} has length {}, but only {} bytes remain after "
          "its length field (file size {}); the file is truncated or corrupt",
          what, at, len, remaining(), size_));
    }
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }

  void read_header() {
    if (size_ < 4) {
      fail(fmt::format("not a GGUF file: {} bytes long, too short for the 4-byte magic \"GGUF\"",
                       size_));
    }
    check_magic(p_, name_);
    pos_ = 4;
    const uint32_t version = read<uint32_t>("the version");
    check_version(version, name_);
    out_.version = version;
    n_tensors_ = read<uint64_t>("the tensor count");
    n_kv_ = read<uint64_t>("the metadata count");
    // Impossible counts are rejected here, so no loop runs billions of times
    // and no reservation is sized from garbage.
    const uint64_t rest = remaining();
    if (n_kv_ > rest / kMinKvBytes) {
      fail(fmt::format(
          "header: the metadata count {} at byte 16 is impossible: the remaining {} "
          "bytes hold at most {} entries of at least {} bytes each; the file is corrupt",
          n_kv_, rest, rest / kMinKvBytes, kMinKvBytes));
    }
    if (n_tensors_ > rest / kMinTensorInfoBytes) {
      fail(
          fmt::format("header: the tensor count {} at byte 8 is impossible: the remaining {} "
                      "bytes hold at most {} tensor infos of at least {} bytes each; the file is "
                      "corrupt",
                      n_tensors_, rest, rest / kMinTensorInfoBytes, kMinTensorInfoBytes));
    }
    if (n_kv_ * kMinKvBytes + n_tensors_ * kMinTensorInfoBytes > rest) {
      fail(
          fmt::format("header: {} metadata entries and {} tensor infos (counts at bytes 16 and 8) "
                      "cannot fit in the remaining {} bytes; the file is corrupt",
                      n_kv_, n_tensors_, rest));
    }
    out_.kv.reserve(std::min<uint64_t>(n_kv_, 1024));
    out_.tensors.reserve(std::min<uint64_t>(n_tensors_, 1024));
  }

  void read_kv(uint64_t k) {
    const uint64_t at = pos_;
    ctx_ = fmt::format("metadata entry #{} (at byte {})", k, at);
    std::string key = read_string("key");
    if (key.empty()) fail("empty key; every metadata entry needs a name");
    if (key.size() > kMaxKeyBytes) {
      fail(fmt::format("the key is {} bytes long; keys may have at most {} bytes", key.size(),
                       kMaxKeyBytes));
    }
    ctx_ = fmt::format("key '{}' (at byte {})", util::printable(key), at);
    if (auto it = out_.kv_index.find(key); it != out_.kv_index.end()) {
      fail(fmt::format("duplicate key; it was first defined at byte {}",
                       out_.kv[it->second].offset));
    }
    const uint64_t type_at = pos_;
    const uint32_t raw = read<uint32_t>("the value type");
    if (!is_valid_value_type(raw)) {
      fail(fmt::format("unknown value type {} at byte {}; expected 0 to 12", raw, type_at));
    }
    KeyValue kv;
    kv.value = read_value(static_cast<ValueType>(raw), 0);
    kv.offset = at;
    if (key == "general.alignment") check_alignment(kv.value, type_at);
    out_.kv_index.emplace(key, out_.kv.size());
    kv.key = std::move(key);
    out_.kv.push_back(std::move(kv));
  }

  void check_alignment(const Value& v, uint64_t type_at) {
    if (v.type != ValueType::UINT32) {
      fail(fmt::format("general.alignment has type {} (at byte {}), expected uint32",
                       value_type_name(v.type), type_at));
    }
    if (!is_power_of_two(v.u)) {
      fail(fmt::format("alignment {} (value at byte {}) is not a nonzero power of two", v.u,
                       type_at + 4));
    }
    out_.alignment = v.u;
  }

  Value read_value(ValueType type, uint32_t depth) {
    Value v;
    v.type = type;
    const uint64_t at = pos_;
    switch (type) {
      case ValueType::UINT8:
        v.u = read<uint8_t>("a uint8 value");
        break;
      case ValueType::INT8:
        v.i = read<int8_t>("an int8 value");
        break;
      case ValueType::UINT16:
        v.u = read<uint16_t>("a uint16 value");
        break;
      case ValueType::INT16:
        v.i = read<int16_t>("an int16 value");
        break;
      case ValueType::UINT32:
        v.u = read<uint32_t>("a uint32 value");
        break;
      case ValueType::INT32:
        v.i = read<int32_t>("an int32 value");
        break;
      case ValueType::UINT64:
        v.u = read<uint64_t>("a uint64 value");
        break;
      case ValueType::INT64:
        v.i = read<int64_t>("an int64 value");
        break;
      case ValueType::FLOAT32:
        v.f = read<float>("a float32 value");
        break;
      case ValueType::FLOAT64:
        v.f = read<double>("a float64 value");
        break;
      case ValueType::BOOL:
        v.u = read<uint8_t>("a bool value");
        if (v.u > 1) fail(fmt::format("bool value {} at byte {} is neither 0 nor 1", v.u, at));
        break;
      case ValueType::STRING:
        v.s = read_string("string value");
        break;
      case ValueType::ARRAY:
        read_array(&v, depth + 1);
        break;
    }
    return v;
  }

  void read_array(Value* v, uint32_t depth) {
    const uint64_t at = pos_;
    if (depth > kMaxArrayDepth) {
      fail(fmt::format("arrays nested more than {} levels deep (array at byte {})", kMaxArrayDepth,
                       at));
    }
    const uint32_t raw = read<uint32_t>("an array element type");
    if (!is_valid_value_type(raw)) {
      fail(fmt::format("unknown array element type {} at byte {}; expected 0 to 12", raw, at));
    }
    const auto elem = static_cast<ValueType>(raw);
    const uint64_t n = read<uint64_t>("an array length");
    const uint64_t min_size = min_encoded_size(elem);
    if (n > remaining() / min_size) {
      fail(fmt::format(
          "truncated file: the array at byte {} declares {} items of type {}, which need {}, "
          "but only {} remain (file size {}); the file is truncated or corrupt",
          at, n, value_type_name(elem), at_least_bytes(n, min_size), remaining(), size_));
    }
    if (n > max_array_elements_ - total_array_elements_) {
      fail(fmt::format(
          "the array at byte {} brings the metadata to more than {} array items in all, the "
          "limit for a file of {} bytes ({} plus one per {} bytes of file, at most {} array "
          "items), which guards memory against malformed files",
          at, max_array_elements_, size_, kFreeArrayElements, kFileBytesPerArrayElement,
          kMaxTotalArrayElements));
    }
    total_array_elements_ += n;
    v->elem = elem;
    v->arr.reserve(n);
    for (uint64_t k = 0; k < n; ++k) v->arr.push_back(read_value(elem, depth));
  }

  void read_tensor_info(uint64_t k) {
    const uint64_t at = pos_;
    ctx_ = fmt::format("tensor info #{} (at byte {})", k, at);
    std::string name = read_string("tensor name");
    if (name.empty()) fail("empty tensor name");
    if (name.size() > kMaxTensorNameBytes) {
      fail(fmt::format("the tensor name '{}' is {} bytes long; at most {} are allowed",
                       util::printable(name), name.size(), kMaxTensorNameBytes));
    }
    ctx_ = fmt::format("tensor '{}' (info at byte {})", util::printable(name), at);
    if (auto it = out_.tensor_index.find(name); it != out_.tensor_index.end()) {
      fail(fmt::format("duplicate tensor name; it was first defined at byte {}",
                       out_.tensors[it->second].info_offset));
    }
    TensorInfo t;
    t.info_offset = at;
    const uint64_t n_dims_at = pos_;
    const uint32_t n_dims = read<uint32_t>("n_dims");
    if (n_dims == 0 || n_dims > kMaxDims) {
      fail(fmt::format("n_dims {} at byte {}; expected 1 to {}", n_dims, n_dims_at, kMaxDims));
    }
    t.n_elements = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim_at = pos_;
      const uint64_t dim = read<uint64_t>("a dimension");
      if (dim == 0) {
        fail(fmt::format("zero-sized dimension: dims[{}] at byte {} is 0; expected at least 1", d,
                         dim_at));
      }
      overflow = overflow || __builtin_mul_overflow(t.n_elements, dim, &t.n_elements);
      t.dims.push_back(dim);
    }
    // ggml counts elements in int64_t.
    if (overflow || t.n_elements > uint64_t{INT64_MAX}) {
      fail(fmt::format("dims {} hold more than 2^63 elements; the file is corrupt",
                       shape_string(t.dims)));
    }
    const uint64_t type_at = pos_;
    const uint32_t raw_type = read<uint32_t>("the tensor type");
    const DTypeInfo* info = dtype_info(raw_type);
    if (info == nullptr)
      fail(fmt::format("unknown tensor type id {} at byte {}", raw_type, type_at));
    t.type = info->type;
    if (t.dims[0] % info->block_elems != 0) {
      fail(
          fmt::format("type {} stores blocks of {} values, but the row length dims[0] = {} "
                      "is not a multiple of {}",
                      info->name, info->block_elems, t.dims[0], info->block_elems));
    }
    if (!tensor_n_bytes(t.type, t.dims, &t.n_bytes) || t.n_bytes > size_) {
      fail(fmt::format("dims {} of type {} need {} bytes, more than the whole file ({} bytes)",
                       shape_string(t.dims), info->name,
                       t.n_bytes > size_ ? fmt::format("{}", t.n_bytes) : "more than 2^64", size_));
    }
    const uint64_t offset_at = pos_;
    t.data_offset = read<uint64_t>("the data offset");
    if (t.data_offset % out_.alignment != 0) {
      fail(fmt::format("data offset {} at byte {} is not a multiple of the alignment {}",
                       t.data_offset, offset_at, out_.alignment));
    }
    out_.tensor_index.emplace(name, out_.tensors.size());
    t.name = std::move(name);
    out_.tensors.push_back(std::move(t));
  }

  void set_tensor_context(const TensorInfo& t) {
    ctx_ = fmt::format("tensor '{}' (info at byte {})", util::printable(t.name), t.info_offset);
  }

  void place_tensor_data() {
    const uint64_t header_end = pos_;
    if (!align_up(header_end, out_.alignment, &out_.data_offset)) {
      fail(fmt::format("the data section offset overflows (header ends at byte {})", header_end));
    }
    for (TensorInfo& t : out_.tensors) {
      set_tensor_context(t);
      uint64_t start, end;
      const bool overflow = __builtin_add_overflow(out_.data_offset, t.data_offset, &start) ||
                            __builtin_add_overflow(start, t.n_bytes, &end);
      if (overflow || end > size_) {
        const std::string range =
            overflow ? fmt::format("of {} bytes at data offset {}", t.n_bytes, t.data_offset)
                     : fmt::format("[{}, {})", start, end);
        fail(
            fmt::format("data {} extends past the end of the file ({} bytes); the file is "
                        "truncated or corrupt",
                        range, size_));
      }
      t.data = p_ + start;
    }
    // Ranges may not overlap: a writer bug that aliases two tensors would
    // otherwise go unnoticed until outputs are wrong.
    std::vector<size_t> order(out_.tensors.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const TensorInfo& ta = out_.tensors[a];
      const TensorInfo& tb = out_.tensors[b];
      return ta.data_offset != tb.data_offset ? ta.data_offset < tb.data_offset : a < b;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const TensorInfo& prev = out_.tensors[order[k - 1]];
      const TensorInfo& cur = out_.tensors[order[k]];
      if (prev.data_offset + prev.n_bytes > cur.data_offset) {
        set_tensor_context(cur);
        const uint64_t base = out_.data_offset;
        fail(fmt::format("data [{}, {}) overlaps the data of tensor '{}' [{}, {})",
                         base + cur.data_offset, base + cur.data_offset + cur.n_bytes,
                         util::printable(prev.name), base + prev.data_offset,
                         base + prev.data_offset + prev.n_bytes));
      }
    }
  }

  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
  std::string ctx_;  // what is being read, e.g. "key 'x' (at byte 40)"; prefixes messages
  uint64_t n_kv_ = 0;
  uint64_t n_tensors_ = 0;
  const uint64_t max_array_elements_;  // see kFreeArrayElements
  uint64_t total_array_elements_ = 0;
  Parsed out_;
};

}  // namespace

Parsed parse(std::span<const uint8_t> image, const std::string& name) {
  return Parser(image, name).run();
}

void check_magic_and_version(std::span<const uint8_t> first8, const std::string& name) {
  check_magic(first8.data(), name);
  uint32_t version;
  std::memcpy(&version, first8.data() + 4, sizeof version);
  check_version(version, name);
}

}  // namespace encore::gguf::detail
