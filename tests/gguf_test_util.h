// Helpers for the GGUF tests: a byte builder for hand-made (often
// malformed) images, error capture, temp folders.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "encore/gguf.h"

namespace encore::test {

// Appends little-endian GGUF fields. Offsets of interest are read with size().
class ByteBuilder {
 public:
  ByteBuilder& u8(uint8_t v) { return put(v); }
  ByteBuilder& u16(uint16_t v) { return put(v); }
  ByteBuilder& u32(uint32_t v) { return put(v); }
  ByteBuilder& u64(uint64_t v) { return put(v); }
  ByteBuilder& f32(float v) { return put(v); }
  ByteBuilder& raw(std::string_view s) {
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  ByteBuilder& zeros(size_t n) {
    bytes_.resize(bytes_.size() + n, 0);
    return *this;
  }
  ByteBuilder& str(std::string_view s) { return u64(s.size()).raw(s); }
  ByteBuilder& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
  }
  ByteBuilder& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  ByteBuilder& kv_str(std::string_view key, std::string_view v) { return str(key).u32(8).str(v); }
  ByteBuilder& tensor_info(std::string_view name, std::vector<uint64_t> dims, uint32_t type,
                           uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  ByteBuilder& pad_to(size_t align) { return zeros((align - bytes_.size() % align) % align); }

  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  template <typename T>
  ByteBuilder& put(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    bytes_.insert(bytes_.end(), b, b + sizeof(T));
    return *this;
  }
  std::vector<uint8_t> bytes_;
};

// The GgufError message from parsing `bytes`, or "" (with a test failure)
// if it parses.
inline std::string parse_error(const std::vector<uint8_t>& bytes,
                               const std::string& name = "bad.gguf") {
  try {
    gguf::File::from_bytes(bytes, name);
  } catch (const GgufError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a GgufError";
  return "";
}

#define EXPECT_CONTAINS_ALL(msg, ...)                                        \
  do {                                                                       \
    const std::string m_ = (msg);                                            \
    for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__}) { \
      EXPECT_NE(m_.find(part_), std::string::npos)                           \
          << "message lacks \"" << part_ << "\":\n  " << m_;                 \
    }                                                                        \
  } while (0)

// A fresh folder under the system temp folder, removed with its contents.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("encore-gguf-") + (info ? info->name() : "x") + "-" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace encore::test
