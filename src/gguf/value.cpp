// Metadata values: constructors, rendering, validation and the canonical
// GGUF encoding shared by the writer and the fingerprint.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include "encore/gguf.h"
#include "gguf/internal.h"
#include "util/text.h"

namespace encore::gguf {

namespace {

// What each value type is, indexed by its number in the file.
struct TypeInfo {
  const char* name;
  uint64_t size;  // bytes of a scalar; 0 for STRING and ARRAY
  bool integer;
  bool is_signed;
};
constexpr TypeInfo kTypes[] = {
    {"uint8", 1, true, false},    {"int8", 1, true, true},    {"uint16", 2, true, false},
    {"int16", 2, true, true},     {"uint32", 4, true, false}, {"int32", 4, true, true},
    {"float32", 4, false, false}, {"bool", 1, false, false},  {"string", 0, false, false},
    {"array", 0, false, false},   {"uint64", 8, true, false}, {"int64", 8, true, true},
    {"float64", 8, false, false},
};
static_assert(std::size(kTypes) == static_cast<size_t>(ValueType::FLOAT64) + 1);

// The row of `t`, or nullptr for a number that is no type.
const TypeInfo* type_info(ValueType t) {
  const auto k = static_cast<uint32_t>(t);
  return k < std::size(kTypes) ? &kTypes[k] : nullptr;
}

}  // namespace

const char* value_type_name(ValueType t) {
  const TypeInfo* info = type_info(t);
  return info ? info->name : "unknown";
}

Value Value::make_u32(uint32_t v) {
  Value r;
  r.type = ValueType::UINT32;
  r.u = v;
  return r;
}

Value Value::make_i32(int32_t v) {
  Value r;
  r.type = ValueType::INT32;
  r.i = v;
  return r;
}

Value Value::make_u64(uint64_t v) {
  Value r;
  r.type = ValueType::UINT64;
  r.u = v;
  return r;
}

Value Value::make_f32(float v) {
  Value r;
  r.type = ValueType::FLOAT32;
  r.f = v;
  return r;
}

Value Value::make_bool(bool v) {
  Value r;
  r.type = ValueType::BOOL;
  r.u = v ? 1 : 0;
  return r;
}

Value Value::make_string(std::string v) {
  Value r;
  r.type = ValueType::STRING;
  r.s = std::move(v);
  return r;
}

Value Value::make_array(ValueType elem, std::vector<Value> items) {
  Value r;
  r.type = ValueType::ARRAY;
  r.elem = elem;
  r.arr = std::move(items);
  return r;
}

bool is_integer_type(ValueType t) {
  const TypeInfo* info = type_info(t);
  return info && info->integer;
}

bool is_signed_type(ValueType t) {
  const TypeInfo* info = type_info(t);
  return info && info->is_signed;
}

bool Value::is_integer() const { return is_integer_type(type); }
bool Value::is_signed() const { return is_signed_type(type); }
bool Value::is_float() const { return type == ValueType::FLOAT32 || type == ValueType::FLOAT64; }

bool Value::operator==(const Value& other) const {
  if (type != other.type) return false;
  switch (type) {
    case ValueType::STRING:
      return s == other.s;
    case ValueType::FLOAT32:
    case ValueType::FLOAT64:
      return std::memcmp(&f, &other.f, sizeof(double)) == 0;
    case ValueType::ARRAY:
      // std::vector's == compares the items with this operator.
      return elem == other.elem && arr == other.arr;
    default:
      return is_signed() ? i == other.i : u == other.u;
  }
}

std::string shape_string(std::span<const uint64_t> dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

namespace {

bool is_unsigned(ValueType t) { return is_integer_type(t) && !is_signed_type(t); }

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    unsigned char b = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (b < 0x20 || b == 0x7f) {
      out += fmt::format("\\x{:02x}", b);
    } else {
      out += c;  // UTF-8 passes through unchanged
    }
  }
  out += '"';
  return out;
}

}  // namespace

std::string Value::to_string(size_t max_items) const {
  switch (type) {
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64:
      return fmt::format("{}", u);
    case ValueType::INT8:
    case ValueType::INT16:
    case ValueType::INT32:
    case ValueType::INT64:
      return fmt::format("{}", i);
    case ValueType::FLOAT32:
      return fmt::format("{}", static_cast<float>(f));
    case ValueType::FLOAT64:
      return fmt::format("{}", f);
    case ValueType::BOOL:
      return u ? "true" : "false";
    case ValueType::STRING:
      return quoted(s);
    case ValueType::ARRAY: {
      std::string out = "[";
      size_t shown = std::min(arr.size(), max_items);
      for (size_t k = 0; k < shown; ++k) {
        if (k) out += ", ";
        out += arr[k].to_string(max_items);
      }
      if (shown < arr.size()) {
        out += fmt::format("{}... ({} {} items)", shown ? ", " : "", arr.size(),
                           value_type_name(elem));
      }
      out += "]";
      return out;
    }
  }
  return "?";
}

namespace detail {

bool is_valid_value_type(uint32_t raw) { return raw <= static_cast<uint32_t>(ValueType::FLOAT64); }

uint64_t scalar_size(ValueType t) {
  const TypeInfo* info = type_info(t);
  return info ? info->size : 0;
}

uint64_t min_encoded_size(ValueType t) {
  if (t == ValueType::STRING) return 8;     // length, possibly no bytes
  if (t == ValueType::ARRAY) return 4 + 8;  // element type and count
  return scalar_size(t);
}

namespace {

void check_value_at(const Value& v, std::string_view key, uint32_t depth) {
  auto bad = [&](std::string what) {
    throw InvalidArgument(fmt::format("gguf writer: key '{}': {}", util::printable(key), what));
  };
  uint64_t max_u = 0;
  int64_t min_i = 0, max_i = 0;
  switch (v.type) {
    case ValueType::UINT8:
      max_u = UINT8_MAX;
      break;
    case ValueType::UINT16:
      max_u = UINT16_MAX;
      break;
    case ValueType::UINT32:
      max_u = UINT32_MAX;
      break;
    case ValueType::UINT64:
      max_u = UINT64_MAX;
      break;
    case ValueType::BOOL:
      max_u = 1;
      break;
    case ValueType::INT8:
      min_i = INT8_MIN, max_i = INT8_MAX;
      break;
    case ValueType::INT16:
      min_i = INT16_MIN, max_i = INT16_MAX;
      break;
    case ValueType::INT32:
      min_i = INT32_MIN, max_i = INT32_MAX;
      break;
    case ValueType::INT64:
      min_i = INT64_MIN, max_i = INT64_MAX;
      break;
    case ValueType::FLOAT32:
      // Converting a finite double beyond the float range is undefined
      // behaviour; inf and NaN convert as they are.
      if (std::isfinite(v.f) && std::fabs(v.f) > std::numeric_limits<float>::max()) {
        bad(fmt::format("value {} does not fit in float32", v.f));
      }
      return;
    case ValueType::FLOAT64:
      return;
    case ValueType::STRING:
      if (v.s.size() > kMaxStringBytes) bad("string longer than 1 GiB");
      return;
    case ValueType::ARRAY:
      if (depth + 1 > kMaxArrayDepth) {
        bad(fmt::format("arrays nested deeper than {} levels", kMaxArrayDepth));
      }
      if (!is_valid_value_type(static_cast<uint32_t>(v.elem))) {
        bad(fmt::format("unknown array element type {}", static_cast<uint32_t>(v.elem)));
      }
      for (const Value& item : v.arr) {
        if (item.type != v.elem) {
          bad(fmt::format("array of {} holds an item of type {}", value_type_name(v.elem),
                          value_type_name(item.type)));
        }
        check_value_at(item, key, depth + 1);
      }
      return;
    default:
      bad(fmt::format("unknown value type {}", static_cast<uint32_t>(v.type)));
  }
  if (is_unsigned(v.type) || v.type == ValueType::BOOL) {
    if (v.u > max_u) bad(fmt::format("value {} does not fit in {}", v.u, value_type_name(v.type)));
  } else if (v.i < min_i || v.i > max_i) {
    bad(fmt::format("value {} does not fit in {}", v.i, value_type_name(v.type)));
  }
}

template <typename T>
void append_le(std::vector<uint8_t>& out, T v) {
  uint8_t buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // little-endian host (checked in parser.cpp)
  out.insert(out.end(), buf, buf + sizeof(T));
}

}  // namespace

void check_value(const Value& v, std::string_view key) { check_value_at(v, key, 0); }

void check_key(std::string_view key) {
  if (key.empty()) throw InvalidArgument("gguf writer: empty metadata key");
  if (key.size() > kMaxKeyBytes) {
    throw InvalidArgument(fmt::format("gguf writer: key '{}' is {} bytes long; at most {} allowed",
                                      util::printable(key), key.size(), kMaxKeyBytes));
  }
}

void append_u32(std::vector<uint8_t>& out, uint32_t v) { append_le(out, v); }
void append_u64(std::vector<uint8_t>& out, uint64_t v) { append_le(out, v); }

void append_string(std::vector<uint8_t>& out, std::string_view s) {
  append_u64(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

void append_value(std::vector<uint8_t>& out, const Value& v) {
  switch (v.type) {
    case ValueType::UINT8:
    case ValueType::BOOL:
      append_le(out, static_cast<uint8_t>(v.u));
      break;
    case ValueType::INT8:
      append_le(out, static_cast<int8_t>(v.i));
      break;
    case ValueType::UINT16:
      append_le(out, static_cast<uint16_t>(v.u));
      break;
    case ValueType::INT16:
      append_le(out, static_cast<int16_t>(v.i));
      break;
    case ValueType::UINT32:
      append_le(out, static_cast<uint32_t>(v.u));
      break;
    case ValueType::INT32:
      append_le(out, static_cast<int32_t>(v.i));
      break;
    case ValueType::UINT64:
      append_le(out, v.u);
      break;
    case ValueType::INT64:
      append_le(out, v.i);
      break;
    case ValueType::FLOAT32:
      append_le(out, static_cast<float>(v.f));
      break;
    case ValueType::FLOAT64:
      append_le(out, v.f);
      break;
    case ValueType::STRING:
      append_string(out, v.s);
      break;
    case ValueType::ARRAY:
      append_u32(out, static_cast<uint32_t>(v.elem));
      append_u64(out, v.arr.size());
      for (const Value& item : v.arr) append_value(out, item);
      break;
  }
}

void append_kv(std::vector<uint8_t>& out, std::string_view key, const Value& v) {
  append_string(out, key);
  append_u32(out, static_cast<uint32_t>(v.type));
  append_value(out, v);
}

bool tensor_n_bytes(DType type, std::span<const uint64_t> dims, uint64_t* n_bytes) {
  const DTypeInfo& info = dtype_info(type);
  if (dims.empty() || dims[0] % info.block_elems != 0) return false;
  uint64_t total;
  if (__builtin_mul_overflow(dims[0] / info.block_elems, uint64_t{info.block_bytes}, &total)) {
    return false;
  }
  for (size_t d = 1; d < dims.size(); ++d) {
    if (__builtin_mul_overflow(total, dims[d], &total)) return false;
  }
  *n_bytes = total;
  return true;
}

}  // namespace detail
}  // namespace encore::gguf
