// Derived seeds (seed.h) and the secret they come from.
#include "encore/seed.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "encore/error.h"

namespace encore {
namespace {

// Domain separation: a later change of the encoding gets another label, so
// it can never yield the seed of another input under the old one.
constexpr std::string_view kLabel{"encore-seed-v1\0", 15};

void put_u64le(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A file descriptor closed on every path out.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

[[noreturn]] void refuse(std::string_view option, const std::string& path, const std::string& why) {
  throw InvalidArgument(fmt::format("{} {}: {}", option, path, why));
}

// Creates `path` with fresh random bytes unless it exists. link(2) puts the
// fully written temporary file in place only if nothing is there yet: a
// secret some other process created first is kept, never replaced.
void create_secret(const std::string& path, std::string_view option) {
  unsigned char secret[kMinSeedSecretBytes];
  size_t got = 0;
  while (got < sizeof secret) {
    const ssize_t r = getrandom(secret + got, sizeof secret - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) refuse(option, path, fmt::format("getrandom: {}", std::strerror(errno)));
    got += static_cast<size_t>(r);
  }
  std::string tmp = path + ".tmp.XXXXXX";
  {
    const Fd f(::mkstemp(tmp.data()));  // O_EXCL, mode 0600
    if (f.fd < 0) {
      refuse(option, path, fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
    }
    size_t done = 0;
    while (done < sizeof secret) {
      const ssize_t w = ::write(f.fd, secret + done, sizeof secret - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = w < 0 ? errno : ENOSPC;
        ::unlink(tmp.c_str());
        refuse(option, path, fmt::format("cannot write {}: {}", tmp, std::strerror(err)));
      }
      done += static_cast<size_t>(w);
    }
    if (::fsync(f.fd) != 0) {  // the secret is on disk before its name is
      const int err = errno;
      ::unlink(tmp.c_str());
      refuse(option, path, fmt::format("cannot write {}: {}", tmp, std::strerror(err)));
    }
  }
  std::memset(secret, 0, sizeof secret);
  const int linked = ::link(tmp.c_str(), path.c_str());
  const int err = errno;
  ::unlink(tmp.c_str());
  if (linked != 0 && err != EEXIST) {
    refuse(option, path, fmt::format("cannot create it: {}", std::strerror(err)));
  }
}

}  // namespace

uint64_t derive_seed(std::string_view secret, std::string_view tenant,
                     std::span<const TokenId> ids) {
  std::string msg;
  msg.reserve(kLabel.size() + 16 + tenant.size() + 4 * ids.size());
  msg.append(kLabel);
  put_u64le(msg, tenant.size());
  msg.append(tenant);
  put_u64le(msg, ids.size());
  for (const TokenId id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int i = 0; i < 4; ++i) msg.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac,
           &mac_len) == nullptr ||
      mac_len < 8) {
    throw Error("derive_seed: HMAC-SHA256 failed in libcrypto");
  }
  uint64_t seed = 0;
  for (int i = 0; i < 8; ++i) seed |= uint64_t{mac[i]} << (8 * i);
  return seed & kSeedMask;
}

std::string load_seed_secret(const std::string& path, std::string_view option) {
  if (path.empty()) refuse(option, path, "no file named");
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    create_secret(path, option);
    fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  }
  if (fd < 0) refuse(option, path, fmt::format("cannot open it: {}", std::strerror(errno)));
  const Fd f(fd);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) refuse(option, path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse(option, path, "not a regular file");
  // Whoever can read the secret can predict every derived seed; whoever can
  // write it can choose them.
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    refuse(option, path,
           fmt::format("mode {:04o} lets group or others read or write the secret; chmod 600 it",
                       st.st_mode & 07777));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < kMinSeedSecretBytes || size > kMaxSeedSecretBytes) {
    refuse(option, path,
           fmt::format("{} bytes; a secret has {} to {} (e.g. head -c 32 /dev/urandom > FILE, "
                       "or name a missing file and it is created)",
                       size, kMinSeedSecretBytes, kMaxSeedSecretBytes));
  }
  std::string secret(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < secret.size()) {
    const ssize_t r = ::read(f.fd, secret.data() + done, secret.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) refuse(option, path, fmt::format("cannot read it: {}", std::strerror(errno)));
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  if (done < kMinSeedSecretBytes) {
    refuse(option, path,
           fmt::format("{} bytes read; a secret has at least {}", done, kMinSeedSecretBytes));
  }
  secret.resize(done);
  return secret;
}

std::string sha256_hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr) != 1) {
    throw Error("SHA-256 failed (OpenSSL EVP_Digest)");
  }
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) out += fmt::format("{:02x}", digest[i]);
  return out;
}

}  // namespace encore
