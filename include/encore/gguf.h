// GGUF model files: reader (mmap or plain memory) and writer.
//
// Spec: GGUF v2/v3 (little-endian). A file is
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x (string key, u32 value_type, value)
//   n_tensors x (string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset)
//   padding to `general.alignment` (default 32) | tensor data
// dims[0] is the fastest-moving (row length), as in ggml's ne[0].
//
// Ownership: a gguf::File owns its mapping or buffer; TensorInfo::data and
// every string_view it hands out stay valid as long as the File lives.
// Thread-safety: a File is immutable after open(); const methods may be
// called from any number of threads.
// Alignment: tensor data sits at file offsets that are multiples of
// alignment(), and the image starts 64-byte aligned (Read, from_bytes) or
// page aligned (Mmap), so TensorInfo::data is aligned to min(alignment(), 64).
// Untrusted input: open() validates every count, length, type, shape and
// offset against the file size before allocating or reading, and throws
// encore::GgufError naming the file, the key or tensor, and the byte offset.
// The parsed metadata costs at most a small multiple of the file size plus a
// constant (array items are budgeted by file size).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "encore/dtype.h"
#include "encore/error.h"

namespace encore::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
const char* value_type_name(ValueType t);  // "uint32", "array", ...
// Type classes, for a value's type or an array's element type.
bool is_integer_type(ValueType t);  // any signed/unsigned integer type
bool is_signed_type(ValueType t);   // INT8/16/32/64

// One metadata value. Plain data: exactly one group of fields is meaningful,
// chosen by `type`.
struct Value {
  ValueType type = ValueType::UINT8;
  uint64_t u = 0;                     // UINT8/16/32/64 and BOOL (0/1)
  int64_t i = 0;                      // INT8/16/32/64
  double f = 0.0;                     // FLOAT32/FLOAT64
  std::string s;                      // STRING (raw bytes, not checked for UTF-8)
  ValueType elem = ValueType::UINT8;  // ARRAY: element type
  std::vector<Value> arr;             // ARRAY: elements (may themselves be arrays)

  static Value make_u32(uint32_t v);
  static Value make_i32(int32_t v);
  static Value make_u64(uint64_t v);
  static Value make_f32(float v);
  static Value make_bool(bool v);
  static Value make_string(std::string v);
  static Value make_array(ValueType elem, std::vector<Value> items);

  bool is_integer() const;  // any signed/unsigned integer type
  bool is_signed() const;   // INT8/16/32/64 (the payload is in `i`)
  bool is_float() const;    // FLOAT32/FLOAT64
  // Human-readable rendering (arrays abbreviated after `max_items`).
  std::string to_string(size_t max_items = 8) const;

  // Same type and same meaningful payload (fields of other types are
  // ignored); floats compare by bit pattern, so NaN equals the same NaN and
  // -0.0 differs from 0.0, as the bytes written to a file would.
  bool operator==(const Value& other) const;
};

struct KeyValue {
  std::string key;
  Value value;
  uint64_t offset = 0;  // byte offset of the key in the file
};

struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  std::vector<uint64_t> dims;  // dims[0] = row length (ggml ne[0])
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;           // size of the data, from type x shape
  uint64_t data_offset = 0;       // relative to the start of the data section
  uint64_t info_offset = 0;       // byte offset of this tensor's info in the file
  const uint8_t* data = nullptr;  // zero-copy view into the mapping/buffer

  uint64_t n_rows() const;  // product of dims[1..]
  std::span<const uint8_t> bytes() const { return {data, n_bytes}; }
};

// "[4096, 32000]": dims as messages and tables print them.
std::string shape_string(std::span<const uint64_t> dims);

// Identity and version of an opened file, from fstat() of its descriptor at
// open(): two stamps are equal only for the same file (device, inode) with
// the same size and modification and status-change times. Any write to the
// file, or replacing it by another (rename), changes the stamp; the ctime
// cannot be set back by utimensat, so keeping the size and mtime does not
// hide a change.
struct FileStamp {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

// The stamp `path` has now (stat follows symlinks, as open() does), or
// nullopt when it cannot be stat'ed.
std::optional<FileStamp> stamp_of(const std::string& path);

enum class LoadMode {
  Mmap,  // map the file read-only (fast open, pages fault in on use)
  Read,  // read the whole file into ordinary memory (faster decode on VMs
         // where page-cache pages get evicted and faulted back); the 8-byte
         // header is checked first, so a large non-GGUF file fails at once
};

class File {
 public:
  // Opens and validates `path`. Throws GgufError.
  static File open(const std::string& path, LoadMode mode = LoadMode::Read);
  // Parses an in-memory image; `name` stands for the path in messages.
  // Used by tests and the fuzzer. Throws GgufError.
  static File from_bytes(std::vector<uint8_t> bytes, std::string name = "<memory>");

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const;
  uint32_t version() const;
  uint64_t alignment() const;
  uint64_t file_size() const;
  // Header end rounded up to alignment(). In a file without tensors it may
  // exceed file_size(): ggml does not pad such files.
  uint64_t data_section_offset() const;
  LoadMode load_mode() const;
  // fstat() of the descriptor open() read or mapped; nullopt for from_bytes,
  // and for LoadMode::Read if the file changed while it was being read.
  const std::optional<FileStamp>& stamp() const;

  const std::vector<KeyValue>& metadata() const;
  const std::vector<TensorInfo>& tensors() const;

  // Gives the memory behind `bytes` (a part of the image, e.g. a tensor's
  // data) back to the OS, for an owner that holds its own copy of them (the
  // engine's repacked weights): the whole pages inside are dropped
  // (madvise). Afterwards those bytes read as zeros (LoadMode::Read) or are
  // read from the file again on use (Mmap): whoever calls this must be the
  // only user of the File, and no one may read those bytes as weights again.
  // Returns the bytes given back (page-aligned inside `bytes`; 0 where the
  // OS refused). Throws std::logic_error if `bytes` is not in the image.
  // Not thread-safe: no reader of the File may run meanwhile.
  uint64_t release(std::span<const uint8_t> bytes);
  uint64_t released_bytes() const;  // the sum of release()'s results

  // nullptr if absent.
  const Value* find(std::string_view key) const;
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed getters: throw GgufError naming the file and key if the key is
  // missing or has an incompatible type. Integer getters accept any integer
  // type whose value fits; get_f32 accepts floats and integers.
  uint32_t get_u32(std::string_view key) const;
  uint64_t get_u64(std::string_view key) const;
  int64_t get_i64(std::string_view key) const;
  float get_f32(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const Value& get_array(std::string_view key) const;  // type == ARRAY
  // Optional variants: nullopt if absent, throw if present with a bad type.
  std::optional<uint32_t> opt_u32(std::string_view key) const;
  std::optional<float> opt_f32(std::string_view key) const;
  std::optional<bool> opt_bool(std::string_view key) const;
  std::optional<std::string> opt_string(std::string_view key) const;

  // Tensor lookup that throws GgufError ("missing required tensor ...").
  const TensorInfo& tensor(std::string_view name) const;

 private:
  struct Impl;
  explicit File(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Builds a GGUF v3 file. Keys and tensors are written in insertion order.
// Tensor data may be given as bytes or produced on demand by a callback
// (so multi-GiB files never need to sit in memory at once).
class Writer {
 public:
  // Fills exactly n_bytes at dst.
  using Producer = std::function<void(uint8_t* dst, uint64_t n_bytes)>;

  explicit Writer(uint32_t alignment = 32);

  void set(std::string key, Value value);  // replaces an existing key
  void add_tensor(std::string name, DType type, std::vector<uint64_t> dims,
                  std::vector<uint8_t> data);
  void add_tensor(std::string name, DType type, std::vector<uint64_t> dims, Producer producer);

  // set() and add_tensor() validate their arguments and throw
  // encore::InvalidArgument (an encore::Error) for an empty or overlong
  // key/name, a value whose payload does not fit its type, a shape that is
  // not a multiple of the block size, data of the wrong size or a duplicate
  // tensor name. set("general.alignment", u32) also changes the alignment.
  //
  // Writes atomically (temp file in the same folder + fsync + rename):
  // `path` either keeps its old content or gets the complete new file.
  // Producers run one at a time, in tensor order, into a buffer the size of
  // the largest produced tensor; an exception from a producer removes the
  // temp file and propagates. Throws encore::Error on I/O failure.
  void write(const std::string& path) const;
  // The same bytes, in memory (tests, fuzz seeds).
  std::vector<uint8_t> to_bytes() const;

 private:
  // Header, metadata and tensor infos, zero-padded to the alignment; fills
  // each tensor's offset in the data section and the total file size.
  std::vector<uint8_t> header_bytes(std::vector<uint64_t>* offsets, uint64_t* total_size) const;

  struct PendingTensor {
    std::string name;
    DType type;
    std::vector<uint64_t> dims;
    uint64_t n_bytes;
    std::vector<uint8_t> data;  // empty when produced
    Producer producer;
  };
  uint32_t alignment_;
  std::vector<std::pair<std::string, Value>> kv_;  // [n_kv] (key, value) in insertion order
  std::vector<PendingTensor> tensors_;             // [n_tensors] in insertion order
};

}  // namespace encore::gguf
