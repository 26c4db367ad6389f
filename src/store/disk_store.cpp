// DiskStore (store.h): one file per record under
//   DIR/<system fingerprint>/<XXH3-64 of the tenant, hex>/<XXH3-128 of the name, hex>.snap
// written atomically (a temporary file in the same folder, fsync, rename,
// fsync of the folder), so a crash or kill at any moment leaves either the
// previous record or the new one, never a mix. Reads touch the file's mtime:
// the size cap removes the least recently used records first (those of
// tenants without a share before the others).
//
// Tenants' shares: a tenant's records are the files in its folder (the
// tenant tag) under every fingerprint. Their bytes are counted per tag at
// open and kept up to date on every write and removal; when a write would
// pass the tenant's share, its folders are counted afresh (other processes
// may have written or removed records) and its least recently used files
// are removed until the new record fits in 90 % of the share.
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
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "store/snapshot.h"

namespace encore {
namespace {

namespace fs = std::filesystem;

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

// collect_disk_garbage(), removing over the cap the records `first` picks
// (oldest use first) before the others (null: none picked).
GcResult collect_garbage(const std::string& dir, uint64_t max_bytes, bool verify,
                         const std::function<bool(const fs::path&)>& first);

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
    for (const auto& [tenant, bytes] : o_.shares.bytes) share_by_tag_[tenant_tag(tenant)] = bytes;
    rescan();
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
    const std::string tag = tenant_tag(key.tenant);
    if (const uint64_t share = share_of(tag); share > 0) {
      if (bytes.size() > share) {
        bump(&StoreCounters::share_refused);
        put_error(fmt::format(
            "disk store: {} ({} bytes stored) is larger than tenant '{}''s whole share of {} "
            "bytes; not stored",
            key.name, bytes.size(), key.tenant, share));
      }
      make_room(tag, share, path, bytes.size());
    }
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
      uint64_t& mine = tenant_bytes_[tag];
      mine = mine - std::min(mine, old_size) + bytes.size();
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
    return fmt::format("{}/{}/{}/{}{}.snap", o_.dir, fp, tenant_tag(key.tenant), hex64(n.high64),
                       hex64(n.low64));
  }

  // The tenant tag of a record file (its folder's name).
  static std::string tag_of_path(const fs::path& p) { return p.parent_path().filename().string(); }
  uint64_t share_of(const std::string& tag) const {
    const auto it = share_by_tag_.find(tag);
    return it != share_by_tag_.end() ? it->second : o_.shares.default_bytes;
  }

  // Counts the .snap files afresh: in all and per tenant tag.
  void rescan() {
    uint64_t total = 0;
    std::unordered_map<std::string, uint64_t> by_tag;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(o_.dir, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file(ec) || it->path().extension() != ".snap") continue;
      const uint64_t size = it->file_size(ec);
      total += size;
      by_tag[tag_of_path(it->path())] += size;
    }
    std::lock_guard<std::mutex> lock(mu_);
    total_bytes_ = total;
    tenant_bytes_ = std::move(by_tag);
  }

  void collect() {
    const GcResult g = collect_garbage(o_.dir, o_.max_bytes, false, [this](const fs::path& p) {
      return share_of(tag_of_path(p)) == 0;
    });
    rescan();
    std::lock_guard<std::mutex> lock(mu_);
    c_.evictions += g.removed;
  }

  // Before a write of `incoming` bytes to `path` by the tenant of `tag`:
  // when its records (as far as this process knows) would pass its share,
  // counts them afresh and removes its least recently used ones (not `path`,
  // which the write replaces) until they and the new record fit in 90 % of
  // the share.
  void make_room(const std::string& tag, uint64_t share, const std::string& path,
                 uint64_t incoming) {
    const std::lock_guard<std::mutex> one_at_a_time(share_mu_);
    std::error_code ec;
    struct stat st {};
    const uint64_t replaced =
        ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const uint64_t mine = tenant_bytes_[tag];
      if (mine - std::min(mine, replaced) + incoming <= share) return;
    }
    struct File {
      fs::path path;
      uint64_t bytes;
      fs::file_time_type used;
    };
    std::vector<File> files;
    uint64_t others = 0;  // the tenant's bytes but `path`'s
    for (const auto& fp : fs::directory_iterator(o_.dir, ec)) {
      std::error_code e2;
      for (const auto& f : fs::directory_iterator(fp.path() / tag, e2)) {
        if (!f.is_regular_file(e2) || f.path().extension() != ".snap") continue;
        File file{f.path(), f.file_size(e2), f.last_write_time(e2)};
        if (file.path == fs::path(path)) continue;
        others += file.bytes;
        files.push_back(std::move(file));
      }
    }
    std::sort(files.begin(), files.end(),
              [](const File& a, const File& b) { return a.used < b.used; });
    const uint64_t goal = share - share / 10;
    int64_t removed = 0;
    uint64_t freed = 0;
    if (others + incoming > share) {
      for (const File& f : files) {
        if (others + incoming <= goal) break;
        if (!fs::remove(f.path, ec)) continue;
        others -= f.bytes;
        freed += f.bytes;
        ++removed;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    tenant_bytes_[tag] = others + replaced;
    total_bytes_ -= std::min(total_bytes_, freed);
    c_.share_evictions += removed;
  }

  bool remove_file(const std::string& path) {
    std::error_code ec;
    const uint64_t size = fs::exists(path, ec) ? fs::file_size(path, ec) : 0;
    if (!fs::remove(path, ec)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    total_bytes_ -= std::min(total_bytes_, size);
    uint64_t& mine = tenant_bytes_[tag_of_path(path)];
    mine -= std::min(mine, size);
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
  // The same per tenant tag (all fingerprints); guarded by mu_.
  std::unordered_map<std::string, uint64_t> tenant_bytes_;
  std::unordered_map<std::string, uint64_t> share_by_tag_;  // fixed after construction
  std::mutex share_mu_;                                     // one make_room() at a time
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

namespace {

GcResult collect_garbage(const std::string& dir, uint64_t max_bytes, bool verify,
                         const std::function<bool(const fs::path&)>& first) {
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
  std::vector<bool> gone(records.size(), false);
  const auto drop = [&](size_t i) {
    if (!fs::remove(records[i].path, ec)) return;
    gone[i] = true;
    ++g.removed;
    g.bytes_freed += records[i].file_bytes;
    total -= records[i].file_bytes;
  };
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i].problem) drop(i);
  }
  // Over the cap: oldest use first, those `first` picks before the others.
  for (int pass = first ? 0 : 1; over && pass < 2; ++pass) {
    for (size_t i = 0; i < records.size() && total > target; ++i) {
      if (!gone[i] && (pass == 1 || first(fs::path(records[i].path)))) drop(i);
    }
  }
  return g;
}

}  // namespace

GcResult collect_disk_garbage(const std::string& dir, uint64_t max_bytes, bool verify) {
  return collect_garbage(dir, max_bytes, verify, nullptr);
}

std::unique_ptr<StoreTier> open_disk_store(const DiskStoreOptions& options) {
  return std::make_unique<DiskStore>(options);
}

}  // namespace encore
