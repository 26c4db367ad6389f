// Internals shared by the GGUF reader, writer and fingerprint: format limits,
// the canonical GGUF encoding of values and the parsed form of a file (their
// atomic file write is util/temp_file.h).
// Not part of the public API. Pure functions and plain data (thread-safe).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "encore/gguf.h"
#include "util/text.h"

struct stat;

namespace encore::gguf::detail {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kVersion = 3;         // what the writer produces
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr uint32_t kMaxDims = 4;              // GGML_MAX_DIMS
inline constexpr uint64_t kMaxTensorNameBytes = 63;  // ggml keeps names in char[64]
inline constexpr uint64_t kMaxKeyBytes = 65535;      // the spec's limit on key length
inline constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;
inline constexpr uint32_t kMaxArrayDepth = 16;
// Every parsed array element becomes a Value (sizeof(Value), ~100 bytes) but
// may take a single byte of the file, so without a budget a file of one-byte
// array items would cost ~100x its size in memory (the parser already
// guarantees at most one item per byte). Real files hold up to about a
// million items (vocabularies of 256k tokens with scores, types and merges),
// averaging well over 5 bytes each. So a file may have kFreeArrayElements
// items (~100 MB of Values) plus one per kFileBytesPerArrayElement bytes of
// its size (Values then cost at most ~12x the file size), and never more
// than kMaxTotalArrayElements.
inline constexpr uint64_t kMaxTotalArrayElements = uint64_t{1} << 23;
inline constexpr uint64_t kFreeArrayElements = uint64_t{1} << 20;
inline constexpr uint64_t kFileBytesPerArrayElement = 8;

// Smallest possible encodings, used to reject impossible counts before
// allocating anything: a KV is a non-empty key (8 + 1), a type (4) and a
// value of at least 1 byte; a tensor info is a non-empty name (8 + 1),
// n_dims (4), at least one dim (8), a type (4) and an offset (8).
inline constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
inline constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;

bool is_valid_value_type(uint32_t raw);
// Bytes that one value of type `t` occupies at the least (arrays: type + count).
uint64_t min_encoded_size(ValueType t);
// Fixed size of a scalar type; 0 for STRING and ARRAY.
uint64_t scalar_size(ValueType t);

constexpr bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Rounds `v` up to a multiple of `align` (a power of two); false on overflow.
inline bool align_up(uint64_t v, uint64_t align, uint64_t* out) {
  uint64_t sum;
  if (__builtin_add_overflow(v, align - 1, &sum)) return false;
  *out = sum & ~(align - 1);
  return true;
}

// Untrusted keys and tensor names go into messages through
// util::printable (util/text.h).

using util::errno_text;  // util/text.h

// The identity and version fields of a stat() result (see FileStamp).
FileStamp stamp_from_stat(const struct ::stat& st);

// Checks the first 8 bytes of a file (magic "GGUF" and a supported version)
// and throws GgufError, with the same message as parse(), if they are not
// those of a GGUF file. `first8` must hold exactly 8 bytes.
void check_magic_and_version(std::span<const uint8_t> first8, const std::string& name);

// Throws InvalidArgument unless `v` can be written: integer payloads fit
// their type, bools are 0/1, array items all have the element type, depth
// <= kMaxArrayDepth. `key` names the value in the message.
void check_value(const Value& v, std::string_view key);
// Throws InvalidArgument unless `key` is a valid metadata key.
void check_key(std::string_view key);

// GGUF little-endian encoding (appends to `out`). Values must be valid.
void append_u32(std::vector<uint8_t>& out, uint32_t v);
void append_u64(std::vector<uint8_t>& out, uint64_t v);
void append_string(std::vector<uint8_t>& out, std::string_view s);
// The value's payload, without its type tag (arrays include elem type + count).
void append_value(std::vector<uint8_t>& out, const Value& v);
// key string, u32 type, payload: exactly one metadata entry as in a file.
void append_kv(std::vector<uint8_t>& out, std::string_view key, const Value& v);

// Bytes of `dims` of `type`, or false if dims[0] is not a multiple of the
// block size or the size overflows uint64.
bool tensor_n_bytes(DType type, std::span<const uint64_t> dims, uint64_t* n_bytes);

// The result of parsing and validating a file image. TensorInfo::data is
// set relative to the image that was parsed.
struct Parsed {
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;
  std::vector<KeyValue> kv;                                 // [n_kv] in file order
  std::vector<TensorInfo> tensors;                          // [n_tensors] in file order
  std::map<std::string, size_t, std::less<>> kv_index;      // key -> index in kv
  std::map<std::string, size_t, std::less<>> tensor_index;  // name -> index in tensors
};

// Parses and validates `image` (the whole file). `name` is the path used in
// messages. Throws GgufError.
Parsed parse(std::span<const uint8_t> image, const std::string& name);

}  // namespace encore::gguf::detail
