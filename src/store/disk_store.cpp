// DiskStore (store.h): one file per record under
//   DIR/<system fingerprint>/<XXH3-64 of the tenant, hex>/<XXH3-128 of the name, hex>.snap
// written atomically (a temporary file in the same folder, fsync, rename,
// fsync of the folder), so a crash or kill at any moment leaves either the
// previous record or the new one, never a mix. Reads touch the file's mtime:
// the size cap removes the least recently used records first.
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "store/snapshot.h"

namespace encore {
namespace {

namespace fs = std::filesystem;

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

// A file descriptor closed however the scope ends.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

class DiskStore final : public StoreTier {
 public:
  explicit DiskStore(const DiskStoreOptions& o) : o_(o) {
    std::error_code ec;
    fs::create_directories(o_.dir, ec);
    if (ec || !fs::is_directory(o_.dir)) {
      throw StoreError(fmt::format("state directory {}: cannot create it: {}", o_.dir,
                                   ec ? ec.message() : "not a directory"));
    }
    if (::access(o_.dir.c_str(), W_OK) != 0) {
      throw StoreError(
          fmt::format("state directory {}: not writable: {}", o_.dir, std::strerror(errno)));
    }
    total_bytes_ = scan_bytes();
  }

  std::string_view name() const override { return "disk"; }

  std::optional<std::string> get(const StoreKey& key, uint64_t* expires_ms,
                                 std::optional<StoreMiss>* rejected) override {
    bump(&StoreCounters::gets);
    if (!store::valid_name(key.name)) return none();
    const std::string path = path_of(key);
    const Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (f.fd < 0) {
      if (errno != ENOENT) io_error(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
      return none();
    }
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) {
      io_error(fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
      return none();
    }
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size > o_.max_record_bytes + (1u << 16)) {
      return reject(path, key, st, StoreMiss::TooLarge, fmt::format("{} bytes", size), rejected);
    }
    std::string bytes(size, '\0');
    size_t got = 0;
    while (got < size) {
      const ssize_t r = ::read(f.fd, bytes.data() + got, size - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;  // shorter than fstat said: the decode calls it truncated
      got += static_cast<size_t>(r);
    }
    bytes.resize(got);
    store::Decoded d = store::decode_record(bytes, key, store::unix_ms_now(), o_.max_record_bytes);
    if (!d.payload) return reject(path, key, st, d.why, d.detail, rejected);
    if (expires_ms) *expires_ms = d.header.expires_ms;
    ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // most recently used
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++c_.hits;
      c_.bytes_read += bytes.size();
    }
    return std::move(d.payload);
  }

  void put(const StoreKey& key, std::string_view payload, std::chrono::milliseconds ttl) override {
    bump(&StoreCounters::puts);
    if (!store::valid_name(key.name)) {
      put_error(fmt::format("disk store: '{}' is not a valid record name", key.name));
    }
    if (payload.size() > o_.max_record_bytes) {
      put_error(fmt::format("disk store: a record of {} bytes exceeds the {} byte limit",
                            payload.size(), o_.max_record_bytes));
    }
    const uint64_t now = store::unix_ms_now();
    const std::string bytes = store::encode_record(
        key, payload, now, ttl.count() > 0 ? now + ttl.count() : 0, o_.zstd_level);
    const std::string path = path_of(key);
    const std::string dir = fs::path(path).parent_path().string();
    make_private_dirs(dir);
    // A unique temporary name (mkstemp: O_EXCL, mode 0600): writers in other
    // processes, or leftovers of a killed one, never collide with it.
    std::string tmp = path + ".tmp.XXXXXX";
    uint64_t old_size = 0;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) old_size = static_cast<uint64_t>(st.st_size);
    {
      const Fd f(::mkstemp(tmp.data()));
      if (f.fd < 0)
        put_error(fmt::format("disk store: cannot create {}: {}", tmp, std::strerror(errno)));
      size_t done = 0;
      while (done < bytes.size()) {
        const ssize_t w = ::write(f.fd, bytes.data() + done, bytes.size() - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          const int err = w < 0 ? errno : ENOSPC;
          ::unlink(tmp.c_str());
          put_error(fmt::format("disk store: cannot write {} ({} bytes): {}", tmp, bytes.size(),
                                std::strerror(err)));
        }
        done += static_cast<size_t>(w);
      }
      if (::fsync(f.fd) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        put_error(fmt::format("disk store: fsync of {}: {}", tmp, std::strerror(err)));
      }
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      put_error(
          fmt::format("disk store: cannot rename {} to {}: {}", tmp, path, std::strerror(err)));
    }
    const Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (d.fd >= 0) ::fsync(d.fd);  // the rename itself is durable
    bool over = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      c_.bytes_written += bytes.size();
      total_bytes_ = total_bytes_ - std::min(total_bytes_, old_size) + bytes.size();
      over = total_bytes_ > o_.max_bytes;
    }
    if (over) collect();
  }

  bool remove(const StoreKey& key) override {
    bump(&StoreCounters::deletes);
    if (!store::valid_name(key.name)) return false;
    return remove_file(path_of(key));
  }

  StoreCounters counters() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return c_;
  }

  std::vector<std::string> elsewhere(const StoreKey& key) override {
    std::vector<std::string> out;
    if (!store::valid_name(key.name)) return out;
    const fs::path mine = fs::path(path_of(key));
    const fs::path rest = mine.parent_path().filename() / mine.filename();  // tenant/name
    std::error_code ec;
    for (const auto& d : fs::directory_iterator(o_.dir, ec)) {
      if (!d.is_directory(ec) || d.path() == mine.parent_path().parent_path()) continue;
      const fs::path p = d.path() / rest;
      if (!fs::exists(p, ec)) continue;
      std::ifstream in(p, std::ios::binary);
      std::string head(1 << 16, '\0');
      in.read(head.data(), static_cast<std::streamsize>(head.size()));
      head.resize(static_cast<size_t>(in.gcount()));
      StoreMiss why{};
      std::string detail;
      const std::optional<store::RecordHeader> h = store::parse_header(head, &why, &detail);
      if (h && h->key.tenant == key.tenant && h->key.name == key.name) {
        out.push_back(h->key.system_fingerprint);
      }
    }
    return out;
  }

 private:
  std::string path_of(const StoreKey& key) const {
    const XXH128_hash_t n = XXH3_128bits(key.name.data(), key.name.size());
    // The fingerprint is "fp_" + hex in practice; anything else is hashed
    // so that no key can name a path outside the folder.
    const bool plain_fp = store::valid_name(key.system_fingerprint) &&
                          key.system_fingerprint.find('/') == std::string::npos &&
                          key.system_fingerprint.find("..") == std::string::npos;
    const std::string fp = plain_fp ? key.system_fingerprint
                                    : "h" + hex64(XXH3_64bits(key.system_fingerprint.data(),
                                                              key.system_fingerprint.size()));
    return fmt::format("{}/{}/{}/{}{}.snap", o_.dir, fp,
                       hex64(XXH3_64bits(key.tenant.data(), key.tenant.size())), hex64(n.high64),
                       hex64(n.low64));
  }

  uint64_t scan_bytes() const {
    uint64_t total = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(o_.dir, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_regular_file(ec) && it->path().extension() == ".snap") total += it->file_size(ec);
    }
    return total;
  }

  void collect() {
    const GcResult g = collect_disk_garbage(o_.dir, o_.max_bytes);
    const uint64_t total = scan_bytes();
    std::lock_guard<std::mutex> lock(mu_);
    total_bytes_ = total;
    c_.evictions += g.removed;
  }

  bool remove_file(const std::string& path) {
    std::error_code ec;
    const uint64_t size = fs::exists(path, ec) ? fs::file_size(path, ec) : 0;
    if (!fs::remove(path, ec)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    total_bytes_ -= std::min(total_bytes_, size);
    return true;
  }

  void bump(int64_t StoreCounters::*field) {
    std::lock_guard<std::mutex> lock(mu_);
    ++(c_.*field);
  }
  std::optional<std::string> none() {
    bump(&StoreCounters::misses);
    return std::nullopt;
  }
  // A record that is there but unusable: counted, told, and removed (a
  // good copy is written again by whoever recomputes it).
  std::optional<std::string> reject(const std::string& path, const StoreKey& key,
                                    const struct stat& read, StoreMiss why,
                                    const std::string& detail, std::optional<StoreMiss>* rejected) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++c_.misses;
      ++c_.rejected[static_cast<int>(why)];
    }
    if (rejected) *rejected = why;
    if (o_.log) {
      o_.log(fmt::format("disk store: ignoring {} ({}: {}: {}); {}", path, key.name,
                         store_miss_name(why), detail, store::when_rejected(key.name)));
    }
    // Removed unless the file was replaced since it was read (another
    // writer's good record), or belongs to another format version (its build).
    struct stat now {};
    if (why != StoreMiss::Version && ::stat(path.c_str(), &now) == 0 && now.st_ino == read.st_ino &&
        now.st_dev == read.st_dev) {
      remove_file(path);
    }
    return std::nullopt;
  }

  // Creates dir and its missing parents below the state directory, readable
  // by the owner only: records hold conversations.
  void make_private_dirs(const std::string& dir) {
    std::error_code ec;
    if (fs::is_directory(dir, ec)) return;
    fs::create_directories(dir, ec);
    if (ec) put_error(fmt::format("disk store: cannot create {}: {}", dir, ec.message()));
    for (fs::path p = dir; p.string().size() > o_.dir.size(); p = p.parent_path()) {
      fs::permissions(p, fs::perms::owner_all, fs::perm_options::replace, ec);
    }
  }
  void io_error(const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++c_.get_errors;
    }
    if (o_.log) o_.log("disk store: " + what);
  }
  [[noreturn]] void put_error(const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++c_.put_errors;
    }
    throw StoreError(what);
  }

  DiskStoreOptions o_;
  mutable std::mutex mu_;
  StoreCounters c_;
  uint64_t total_bytes_ = 0;  // of the .snap files, as far as this process knows
  std::atomic<uint64_t> tmp_counter_{0};
};

int64_t unix_ms(fs::file_time_type t) {
  const auto sys = std::chrono::time_point_cast<std::chrono::milliseconds>(
      t - fs::file_time_type::clock::now() + std::chrono::system_clock::now());
  return sys.time_since_epoch().count();
}

}  // namespace

std::vector<DiskRecord> list_disk_records(const std::string& dir, bool verify) {
  std::vector<DiskRecord> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->path().extension() != ".snap") continue;
    DiskRecord r;
    r.path = it->path().string();
    r.file_bytes = it->file_size(ec);
    r.last_used_ms = unix_ms(it->last_write_time(ec));
    const std::string bytes = [&] {
      std::ifstream in(r.path, std::ios::binary);
      std::string b(verify ? r.file_bytes : std::min<uint64_t>(r.file_bytes, 1 << 16), '\0');
      in.read(b.data(), static_cast<std::streamsize>(b.size()));
      b.resize(static_cast<size_t>(in.gcount()));
      return b;
    }();
    StoreMiss why{};
    std::string detail;
    if (const std::optional<store::RecordHeader> h = store::parse_header(bytes, &why, &detail)) {
      r.key = h->key;
      r.created_ms = h->created_ms;
      r.expires_ms = h->expires_ms;
      r.payload_bytes = h->payload_bytes;
      if (verify) {
        const store::Decoded d = store::decode_record(bytes, h->key, store::unix_ms_now(),
                                                      std::max<uint64_t>(h->payload_bytes, 1));
        if (!d.payload) {
          r.problem = d.why;
          r.detail = d.detail;
        }
      } else if (h->expires_ms != 0 && h->expires_ms <= store::unix_ms_now()) {
        r.problem = StoreMiss::Expired;
        r.detail = "expired";
      }
    } else {
      r.problem = why;
      r.detail = detail;
    }
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const DiskRecord& a, const DiskRecord& b) {
    return a.last_used_ms < b.last_used_ms;
  });
  return out;
}

GcResult collect_disk_garbage(const std::string& dir, uint64_t max_bytes, bool verify) {
  GcResult g;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string p = it->path().string();
    if (p.find(".snap.tmp.") != std::string::npos &&
        now - it->last_write_time(ec) > std::chrono::minutes(10)) {
      const uint64_t size = it->file_size(ec);
      if (fs::remove(it->path(), ec)) {  // an interrupted write
        ++g.removed;
        g.bytes_freed += size;
      }
    }
  }
  std::vector<DiskRecord> records = list_disk_records(dir, verify);
  uint64_t total = 0;
  for (const DiskRecord& r : records) total += r.file_bytes;
  const uint64_t target = max_bytes / 10 * 9;
  const bool over = total > max_bytes;
  for (const DiskRecord& r : records) {  // oldest use first
    if (!r.problem && !(over && total > target)) continue;
    if (fs::remove(r.path, ec)) {
      ++g.removed;
      g.bytes_freed += r.file_bytes;
      total -= r.file_bytes;
    }
  }
  return g;
}

std::unique_ptr<StoreTier> open_disk_store(const DiskStoreOptions& options) {
  return std::make_unique<DiskStore>(options);
}

}  // namespace encore
