// util::TempFile: the atomic file write shared by every file Encore writes
// whole (gguf::Writer, the fingerprint cache, the panel cache).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace encore::util {

// A file written under a temporary name next to `dest` ("DEST.tmp-RANDOM")
// and renamed over it by commit() after an fsync, so that `dest` always
// holds either its old or its complete new content; the temporary file is
// removed unless commit() succeeded.
// Ownership: owns the descriptor and the temporary file. Not thread-safe.
// Throws encore::Error (naming the file and the errno text) on I/O failure.
class TempFile {
 public:
  explicit TempFile(const std::string& dest);
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile();

  void write(const uint8_t* p, uint64_t n);
  void write(std::string_view s) { write(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }
  void commit();

 private:
  std::string dest_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace encore::util
