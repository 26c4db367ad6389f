// gguf::File: owns the file image (a read-only private mapping or a
// 64-byte-aligned heap buffer) and serves metadata and tensor lookups.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <system_error>
#include <thread>
#include <vector>

#include "encore/gguf.h"
#include "gguf/internal.h"
#include "util/huge_pages.h"
#include "util/text.h"

namespace encore::gguf {
namespace {

using detail::errno_text;

// The bytes of a file image and how to release them.
class Storage {
 public:
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (mapped_ && data_ != nullptr) {
      ::munmap(const_cast<uint8_t*>(data_), size_);
    } else {
      std::free(const_cast<uint8_t*>(data_));
    }
  }

  // Heap buffer of exactly `size` bytes, 64-byte aligned (so tensor data at
  // aligned file offsets is aligned in memory too). The exact size lets
  // AddressSanitizer catch reads past the end of the image.
  // A large image is 2 MiB aligned and advised to use transparent huge
  // pages: 512 times fewer page faults while reading it, and fewer TLB
  // misses while the weights stream through the kernels (speed only).
  static std::unique_ptr<Storage> heap(uint64_t size, const std::string& path) {
    void* p = nullptr;
    if (size <= SIZE_MAX) {
      if (size >= kHugeFrom) {
        p = util::alloc_huge_pages(size);
      } else if (::posix_memalign(&p, 64, size ? size : 1) != 0) {
        p = nullptr;
      }
    }
    if (p == nullptr) {
      throw GgufError(fmt::format(
          "{}: not enough memory to read {} bytes; load it with mmap instead", path, size));
    }
    auto s = std::make_unique<Storage>();
    s->data_ = static_cast<const uint8_t*>(p);
    s->size_ = size;
    return s;
  }

  static std::unique_ptr<Storage> map(int fd, uint64_t size, const std::string& path) {
    auto s = std::make_unique<Storage>();
    if (size == 0) return s;  // mmap rejects empty files; the parser reports it
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      throw GgufError(fmt::format("{}: cannot map {} bytes: {}", path, size, errno_text(errno)));
    }
    s->data_ = static_cast<const uint8_t*>(p);
    s->size_ = size;
    s->mapped_ = true;
    return s;
  }

  static constexpr uint64_t kHugeFrom = uint64_t{64} << 20;  // smaller images: 64-byte aligned

  uint8_t* writable() { return const_cast<uint8_t*>(data_); }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

  // Gives the whole pages inside [b, e) (offsets into the image) back to
  // the OS; returns their bytes. MADV_DONTNEED on private pages: the heap
  // image's read as zeros afterwards, a mapping's fault in from the file.
  uint64_t release(uint64_t b, uint64_t e) {
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const auto base = reinterpret_cast<uintptr_t>(data_);
    const uint64_t pb = (base + b + page - 1) / page * page, pe = (base + e) / page * page;
    if (pe <= pb) return 0;
    if (::madvise(reinterpret_cast<void*>(pb), pe - pb, MADV_DONTNEED) != 0) return 0;
    return pe - pb;
  }

 private:
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
};

// Closes a descriptor on every path out of open().
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

// Reads bytes [begin, end) of the file (file_size bytes in all, for the
// message) into dst + begin.
void pread_fully(int fd, uint8_t* dst, uint64_t begin, uint64_t end, uint64_t file_size,
                 const std::string& path) {
  for (uint64_t done = begin; done < end;) {
    const size_t chunk = std::min<uint64_t>(end - done, uint64_t{1} << 30);
    const ssize_t r = ::pread(fd, dst + done, chunk, static_cast<off_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw GgufError(fmt::format("{}: read failed at byte {}: {}", path, done, errno_text(errno)));
    }
    if (r == 0) {
      throw GgufError(
          fmt::format("{}: the file shrank while being read (expected {} bytes, got {})", path,
                      file_size, done));
    }
    done += static_cast<uint64_t>(r);
  }
}

// Bytes [begin, end) of a file of `end` bytes by pread_fully in up to 8
// pieces of at least 64 MiB on their own threads: faulting in the fresh
// buffer and copying from the page cache is CPU work that one thread does at
// ~1-2 GB/s, far below what the memory allows. A piece whose thread cannot
// start is read here (and counted in nothing: it is only slower).
void read_parallel(int fd, uint8_t* dst, uint64_t begin, uint64_t end, const std::string& path) {
  const uint64_t piece_min = uint64_t{64} << 20;
  const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t n =
      std::clamp<uint64_t>((end - begin) / piece_min, 1, std::min<uint64_t>(8, cores));
  const uint64_t piece = (end - begin + n - 1) / n;
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  auto read_piece = [&](uint64_t i) {
    const uint64_t b = begin + i * piece, e = std::min(end, b + piece);
    try {
      pread_fully(fd, dst, b, e, end, path);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  // Pieces 1.. on threads, piece 0 on this one.
  for (uint64_t i = 1; i < n; ++i) {
    try {
      threads.emplace_back(read_piece, i);
    } catch (const std::system_error&) {
      read_piece(i);
    }
  }
  read_piece(0);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

int64_t ns_of(const struct timespec& t) { return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; }

}  // namespace

std::optional<FileStamp> stamp_of(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return detail::stamp_from_stat(st);
}

FileStamp detail::stamp_from_stat(const struct ::stat& st) {
  FileStamp s;
  s.device = static_cast<uint64_t>(st.st_dev);
  s.inode = static_cast<uint64_t>(st.st_ino);
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = ns_of(st.st_mtim);
  s.ctime_ns = ns_of(st.st_ctim);
  return s;
}

struct File::Impl {
  std::string path;
  LoadMode mode = LoadMode::Read;
  std::optional<FileStamp> stamp;
  std::unique_ptr<Storage> storage;
  detail::Parsed parsed;
  uint64_t released = 0;  // bytes given back by release()

  static std::unique_ptr<Impl> make(std::string path, LoadMode mode, std::optional<FileStamp> stamp,
                                    std::unique_ptr<Storage> storage) {
    auto impl = std::make_unique<Impl>();
    impl->parsed = detail::parse(storage->bytes(), path);
    impl->path = std::move(path);
    impl->mode = mode;
    impl->stamp = stamp;
    impl->storage = std::move(storage);
    return impl;
  }

  [[noreturn]] void missing_key(std::string_view key) const {
    throw GgufError(fmt::format("{}: missing required key '{}'", path, util::printable(key)));
  }

  [[noreturn]] void wrong_type(const KeyValue& kv, std::string_view expected) const {
    throw GgufError(fmt::format("{}: key '{}' (at byte {}) has type {}, expected {}", path,
                                util::printable(kv.key), kv.offset, value_type_name(kv.value.type),
                                expected));
  }

  [[noreturn]] void out_of_range(const KeyValue& kv, std::string_view target) const {
    throw GgufError(fmt::format("{}: key '{}' (at byte {}) = {} ({}) does not fit in {}", path,
                                util::printable(kv.key), kv.offset, kv.value.to_string(),
                                value_type_name(kv.value.type), target));
  }

  const KeyValue* find(std::string_view key) const {
    auto it = parsed.kv_index.find(key);
    return it == parsed.kv_index.end() ? nullptr : &parsed.kv[it->second];
  }

  const KeyValue& require(std::string_view key) const {
    const KeyValue* kv = find(key);
    if (kv == nullptr) missing_key(key);
    return *kv;
  }

  // An integer value as uint64/int64 within [lo, hi]; throws otherwise.
  uint64_t unsigned_in(const KeyValue& kv, uint64_t hi, std::string_view target) const {
    const Value& v = kv.value;
    if (!v.is_integer()) wrong_type(kv, "an integer");
    if (v.is_signed()) {
      if (v.i < 0 || static_cast<uint64_t>(v.i) > hi) out_of_range(kv, target);
      return static_cast<uint64_t>(v.i);
    }
    if (v.u > hi) out_of_range(kv, target);
    return v.u;
  }

  float to_f32(const KeyValue& kv) const {
    const Value& v = kv.value;
    if (v.is_float()) {
      if (std::isfinite(v.f) && std::fabs(v.f) > std::numeric_limits<float>::max()) {
        out_of_range(kv, "float32");
      }
      return static_cast<float>(v.f);
    }
    if (!v.is_integer()) wrong_type(kv, "a number");
    return v.is_signed() ? static_cast<float>(v.i) : static_cast<float>(v.u);
  }

  bool to_bool(const KeyValue& kv) const {
    if (kv.value.type != ValueType::BOOL) wrong_type(kv, "bool");
    return kv.value.u != 0;
  }

  const std::string& to_string(const KeyValue& kv) const {
    if (kv.value.type != ValueType::STRING) wrong_type(kv, "string");
    return kv.value.s;
  }
};

File::File(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

File File::open(const std::string& path, LoadMode mode) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw GgufError(fmt::format("{}: cannot open: {}", path, errno_text(errno)));
  std::unique_ptr<Storage> storage;
  std::optional<FileStamp> stamp;
  {
    FdCloser closer{fd};
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      throw GgufError(fmt::format("{}: cannot stat: {}", path, errno_text(errno)));
    }
    if (!S_ISREG(st.st_mode)) throw GgufError(fmt::format("{}: not a regular file", path));
    // The stamp of the descriptor, not of `path`: the path may name another
    // file by the time anyone looks at it again.
    stamp = detail::stamp_from_stat(st);
    const uint64_t size = stamp->size;
    if (mode == LoadMode::Mmap) {
      storage = Storage::map(fd, size, path);
    } else {
      // Check the header before allocating and reading the whole file, so
      // that a large file of another kind is rejected at once. Shorter
      // files are left to the parser, which reports them as truncated.
      uint8_t header[8];
      const uint64_t head = std::min<uint64_t>(size, sizeof header);
      pread_fully(fd, header, 0, head, size, path);
      if (head == sizeof header) detail::check_magic_and_version(header, path);
      storage = Storage::heap(size, path);
      if (head > 0) std::memcpy(storage->writable(), header, head);
      read_parallel(fd, storage->writable(), head, size, path);
      // A write while reading may have torn the image; then the stamp does
      // not describe it and must not be used to cache anything about it.
      struct stat after;
      if (::fstat(fd, &after) != 0 || detail::stamp_from_stat(after) != *stamp) stamp.reset();
    }
  }  // the mapping stays valid after the descriptor is closed
  return File(Impl::make(path, mode, stamp, std::move(storage)));
}

File File::from_bytes(std::vector<uint8_t> bytes, std::string name) {
  // Copied into an exact-size aligned buffer: same alignment guarantees as
  // LoadMode::Read, and out-of-bounds reads stay visible to sanitizers.
  auto storage = Storage::heap(bytes.size(), name);
  if (!bytes.empty()) std::memcpy(storage->writable(), bytes.data(), bytes.size());
  bytes = {};
  return File(Impl::make(std::move(name), LoadMode::Read, std::nullopt, std::move(storage)));
}

const std::string& File::path() const { return impl_->path; }
uint32_t File::version() const { return impl_->parsed.version; }
uint64_t File::alignment() const { return impl_->parsed.alignment; }
uint64_t File::file_size() const { return impl_->storage->bytes().size(); }
uint64_t File::data_section_offset() const { return impl_->parsed.data_offset; }
LoadMode File::load_mode() const { return impl_->mode; }
const std::optional<FileStamp>& File::stamp() const { return impl_->stamp; }
const std::vector<KeyValue>& File::metadata() const { return impl_->parsed.kv; }
uint64_t File::released_bytes() const { return impl_->released; }

uint64_t File::release(std::span<const uint8_t> bytes) {
  const std::span<const uint8_t> image = impl_->storage->bytes();
  if (bytes.empty()) return 0;
  const uint8_t* lo = image.data();
  if (bytes.data() < lo || bytes.data() + bytes.size() > lo + image.size()) {
    throw std::logic_error(fmt::format("{}: release() of bytes outside the file", impl_->path));
  }
  const auto b = static_cast<uint64_t>(bytes.data() - lo);
  const uint64_t n = impl_->storage->release(b, b + bytes.size());
  impl_->released += n;
  return n;
}
const std::vector<TensorInfo>& File::tensors() const { return impl_->parsed.tensors; }

const Value* File::find(std::string_view key) const {
  const KeyValue* kv = impl_->find(key);
  return kv ? &kv->value : nullptr;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = impl_->parsed.tensor_index.find(name);
  return it == impl_->parsed.tensor_index.end() ? nullptr : &impl_->parsed.tensors[it->second];
}

const TensorInfo& File::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr) {
    throw GgufError(
        fmt::format("{}: missing required tensor '{}'", impl_->path, util::printable(name)));
  }
  return *t;
}

uint32_t File::get_u32(std::string_view key) const {
  return static_cast<uint32_t>(impl_->unsigned_in(impl_->require(key), UINT32_MAX, "uint32"));
}

uint64_t File::get_u64(std::string_view key) const {
  return impl_->unsigned_in(impl_->require(key), UINT64_MAX, "uint64");
}

int64_t File::get_i64(std::string_view key) const {
  const KeyValue& kv = impl_->require(key);
  const Value& v = kv.value;
  if (!v.is_integer()) impl_->wrong_type(kv, "an integer");
  if (v.is_signed()) return v.i;
  if (v.u > uint64_t{INT64_MAX}) impl_->out_of_range(kv, "int64");
  return static_cast<int64_t>(v.u);
}

float File::get_f32(std::string_view key) const { return impl_->to_f32(impl_->require(key)); }
bool File::get_bool(std::string_view key) const { return impl_->to_bool(impl_->require(key)); }

const std::string& File::get_string(std::string_view key) const {
  return impl_->to_string(impl_->require(key));
}

const Value& File::get_array(std::string_view key) const {
  const KeyValue& kv = impl_->require(key);
  if (kv.value.type != ValueType::ARRAY) impl_->wrong_type(kv, "array");
  return kv.value;
}

std::optional<uint32_t> File::opt_u32(std::string_view key) const {
  const KeyValue* kv = impl_->find(key);
  if (kv == nullptr) return std::nullopt;
  return static_cast<uint32_t>(impl_->unsigned_in(*kv, UINT32_MAX, "uint32"));
}

std::optional<float> File::opt_f32(std::string_view key) const {
  const KeyValue* kv = impl_->find(key);
  if (kv == nullptr) return std::nullopt;
  return impl_->to_f32(*kv);
}

std::optional<bool> File::opt_bool(std::string_view key) const {
  const KeyValue* kv = impl_->find(key);
  if (kv == nullptr) return std::nullopt;
  return impl_->to_bool(*kv);
}

std::optional<std::string> File::opt_string(std::string_view key) const {
  const KeyValue* kv = impl_->find(key);
  if (kv == nullptr) return std::nullopt;
  return impl_->to_string(*kv);
}

uint64_t TensorInfo::n_rows() const {
  uint64_t rows = 1;
  for (size_t d = 1; d < dims.size(); ++d) rows *= dims[d];  // validated: cannot overflow
  return rows;
}

}  // namespace encore::gguf
