// Lines of a stream, each bounded: a longer line is reported and skipped,
// never held in memory (batch input, audit logs: files from outside).
//
// Ownership: borrows the stream. Cost: one 64 KiB buffer. Thread-safety: one
// thread at a time.
#pragma once

#include <cstdint>
#include <cstring>
#include <istream>
#include <string>

#include "encore/error.h"

namespace encore::util {

class LineReader {
 public:
  LineReader(std::istream& in, size_t max_bytes) : in_(in), max_bytes_(max_bytes) {}
  struct Line {
    std::string text;       // without "\n"; empty when too_long
    bool complete = false;  // ended with "\n" (false: the stream's last, unterminated line)
    bool too_long = false;  // longer than max_bytes
    uint64_t bytes = 0;     // its length in the stream, "\n" excluded
  };
  // False at the end of the stream.
  bool next(Line& line) {
    line.text.clear();
    line.complete = false;
    line.too_long = false;
    line.bytes = 0;
    bool any = false;
    for (;;) {
      if (pos_ == end_) {
        in_.read(buf_, sizeof buf_);
        end_ = static_cast<size_t>(in_.gcount());
        pos_ = 0;
        if (in_.bad()) throw InvalidArgument("reading failed (an I/O error)");
        if (end_ == 0) return any;
      }
      any = true;
      const char* start = buf_ + pos_;
      const void* nl = std::memchr(start, '\n', end_ - pos_);
      const size_t n = nl ? static_cast<size_t>(static_cast<const char*>(nl) - start) : end_ - pos_;
      line.bytes += n;
      if (!line.too_long && line.text.size() + n <= max_bytes_) {
        line.text.append(start, n);
      } else {
        line.too_long = true;
        line.text.clear();
      }
      pos_ += n;
      if (nl) {
        ++pos_;
        line.complete = true;
        return true;
      }
    }
  }

 private:
  std::istream& in_;
  const size_t max_bytes_;
  char buf_[1 << 16];
  size_t pos_ = 0, end_ = 0;
};

}  // namespace encore::util
