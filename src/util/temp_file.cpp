// util::TempFile (temp_file.h).
#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <random>

#include "encore/error.h"
#include "util/temp_file.h"
#include "util/text.h"

namespace encore::util {

TempFile::TempFile(const std::string& dest) : dest_(dest) {
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    tmp_ = fmt::format("{}.tmp-{:08x}{:08x}", dest, rd(), rd());
    // 0666 so the process umask applies, as for any newly created file.
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0 || errno != EEXIST) break;
  }
  if (fd_ < 0) {
    throw Error(
        fmt::format("{}: cannot create the temporary file {}: {}", dest, tmp_, errno_text(errno)));
  }
}

TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void TempFile::write(const uint8_t* p, uint64_t n) {
  while (n > 0) {
    const size_t chunk = std::min<uint64_t>(n, uint64_t{1} << 30);
    const ssize_t w = ::write(fd_, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("{}: write failed: {}", tmp_, errno_text(errno)));
    }
    p += w;
    n -= static_cast<uint64_t>(w);
  }
}

void TempFile::commit() {
  // fsync before rename: otherwise a crash can leave `dest` renamed but empty.
  if (::fsync(fd_) != 0) {
    throw Error(fmt::format("{}: fsync failed: {}", tmp_, errno_text(errno)));
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    throw Error(fmt::format("{}: close failed: {}", tmp_, errno_text(errno)));
  }
  if (::rename(tmp_.c_str(), dest_.c_str()) != 0) {
    throw Error(fmt::format("{}: cannot rename {} to it: {}", dest_, tmp_, errno_text(errno)));
  }
  committed_ = true;
}

}  // namespace encore::util
