// The disk tier of the state store (store.h) and the record format
// (src/store/snapshot.h): round trips, isolation by fingerprint and tenant,
// TTL, every kind of damage rejected by reason (never a wrong payload), the
// size cap, kill -9 in the middle of a write, and a full disk.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli_runner.h"
#include "encore/store.h"
#include "store/snapshot.h"

namespace encore {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

const StoreKey kKey{"fp_0123456789abcdef0123456789abcdef", "tenant-a", "block/00ff"};

std::string payload_of(size_t n, uint32_t seed, bool compressible) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    s[i] = compressible ? static_cast<char>("abcab"[i % 5]) : static_cast<char>(rng());
  }
  return s;
}

std::vector<std::string> snap_files(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".snap") v.push_back(e.path().string());
  }
  return v;
}

std::string read_bytes(const std::string& path) { return test::read_file(path); }
void write_bytes(const std::string& path, const std::string& b) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
}

class DiskStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<StoreTier> open(uint64_t max_bytes = 1ull << 30, TenantShares shares = {}) {
    DiskStoreOptions o;
    o.dir = dir_.path.string() + "/state";
    o.max_bytes = max_bytes;
    o.shares = std::move(shares);
    o.log = [this](std::string_view line) { log_.emplace_back(line); };
    return open_disk_store(o);
  }
  // The bytes of a tenant's record files, as `encore cache` lists them.
  uint64_t tenant_bytes(const std::string& tenant) const {
    uint64_t total = 0;
    for (const DiskRecord& r : list_disk_records(dir(), false)) {
      if (r.key.tenant == tenant) total += r.file_bytes;
    }
    return total;
  }
  std::string dir() const { return dir_.path.string() + "/state"; }
  test::TempDir dir_;
  std::vector<std::string> log_;
};

TEST_F(DiskStoreTest, RoundTripsAnyBytesCompressedOrNot) {
  auto s = open();
  for (bool compressible : {true, false}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{4096}, size_t{300000}}) {
      const std::string p = payload_of(n, 7, compressible);
      s->put(kKey, p, milliseconds(0));
      const std::optional<std::string> got = s->get(kKey);
      ASSERT_TRUE(got.has_value()) << n;
      EXPECT_EQ(*got, p) << n;
    }
  }
  const StoreCounters c = s->counters();
  EXPECT_EQ(c.hits, 8);
  EXPECT_EQ(c.puts, 8);
  EXPECT_GT(c.bytes_written, 0u);
  // Compressible payloads are stored compressed.
  s->put(kKey, payload_of(300000, 1, true), milliseconds(0));
  EXPECT_LT(fs::file_size(snap_files(dir()).at(0)), 10000u);
}

TEST_F(DiskStoreTest, AnotherTenantFingerprintOrNameIsAMiss) {
  auto s = open();
  s->put(kKey, "alice's state", milliseconds(0));
  StoreKey other = kKey;
  other.tenant = "tenant-b";
  EXPECT_FALSE(s->get(other).has_value()) << "tenant B read tenant A's record";
  other = kKey;
  other.system_fingerprint = "fp_ffffffffffffffffffffffffffffffff";
  EXPECT_FALSE(s->get(other).has_value());
  other = kKey;
  other.name = "block/00fe";
  EXPECT_FALSE(s->get(other).has_value());
  EXPECT_EQ(s->get(kKey).value_or(""), "alice's state");
  // Names outside [A-Za-z0-9_./-] are refused; names are hashed into file
  // names, so none can reach outside the folder.
  other.name = "bad name\n";
  EXPECT_THROW(s->put(other, "x", milliseconds(0)), StoreError);
  EXPECT_FALSE(s->get(other).has_value());
  other.name = "../../../../etc/passwd";
  s->put(other, "inside", milliseconds(0));
  EXPECT_EQ(s->get(other).value_or(""), "inside");
  for (const std::string& f : snap_files(dir())) EXPECT_EQ(f.rfind(dir(), 0), 0u) << f;
}

TEST_F(DiskStoreTest, ExpiredRecordsAreGone) {
  auto s = open();
  s->put(kKey, "short-lived", milliseconds(1));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(s->get(kKey).has_value());
  EXPECT_EQ(s->counters().rejected[static_cast<int>(StoreMiss::Expired)], 1);
  EXPECT_TRUE(snap_files(dir()).empty()) << "an expired record stays on disk";
  s->put(kKey, "forever", milliseconds(0));
  EXPECT_EQ(s->get(kKey).value_or(""), "forever");
}

// Every single-byte flip and every truncation of a record is rejected with a
// reason; none returns a payload other than the one written.
TEST_F(DiskStoreTest, DamagedRecordsAreRejectedNeverWrong) {
  auto s = open();
  const std::string p = payload_of(2000, 3, false);
  s->put(kKey, p, milliseconds(0));
  const std::string path = snap_files(dir()).at(0);
  const std::string good = read_bytes(path);
  int rejected = 0;
  for (size_t at = 0; at < good.size(); at += good.size() / 97 + 1) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x5a);
    write_bytes(path, bad);
    const std::optional<std::string> got = s->get(kKey);
    EXPECT_FALSE(got.has_value()) << "a flip at byte " << at << " went unnoticed";
    rejected += got.has_value() ? 0 : 1;
  }
  for (size_t len : {size_t{0}, size_t{7}, size_t{40}, good.size() / 2, good.size() - 1}) {
    write_bytes(path, good.substr(0, len));
    EXPECT_FALSE(s->get(kKey).has_value()) << "truncated to " << len;
  }
  write_bytes(path, good + "extra");
  EXPECT_FALSE(s->get(kKey).has_value()) << "bytes after the payload";
  const StoreCounters c = s->counters();
  EXPECT_GT(c.rejected[static_cast<int>(StoreMiss::Corrupt)], 0);
  EXPECT_GT(c.rejected[static_cast<int>(StoreMiss::Truncated)], 0);
  EXPECT_FALSE(log_.empty());
  EXPECT_NE(log_.back().find("will be recomputed"), std::string::npos) << log_.back();
  // The good bytes still load.
  write_bytes(path, good);
  EXPECT_EQ(s->get(kKey).value_or(""), p);
}

TEST_F(DiskStoreTest, OtherVersionsAndKeysAtThePathAreRejectedByReason) {
  const std::string p = "payload";
  std::string rec = store::encode_record(kKey, p, store::unix_ms_now(), 0, 1);
  store::Decoded d = store::decode_record(rec, kKey, store::unix_ms_now(), 1 << 20);
  ASSERT_TRUE(d.payload.has_value());
  StoreKey other = kKey;
  other.system_fingerprint = "fp_1";
  EXPECT_EQ(store::decode_record(rec, other, 0, 1 << 20).why, StoreMiss::Fingerprint);
  other = kKey;
  other.tenant = "b";
  EXPECT_EQ(store::decode_record(rec, other, 0, 1 << 20).why, StoreMiss::Tenant);
  other = kKey;
  other.name = "x";
  EXPECT_EQ(store::decode_record(rec, other, 0, 1 << 20).why, StoreMiss::Key);
  EXPECT_EQ(store::decode_record(rec, kKey, 0, 3).why, StoreMiss::TooLarge);
  rec[8] = 2;  // format version 2
  EXPECT_EQ(store::decode_record(rec, kKey, 0, 1 << 20).why, StoreMiss::Version);
}

TEST_F(DiskStoreTest, TheSizeCapRemovesTheLeastRecentlyUsed) {
  auto s = open(/*max_bytes=*/200000);
  std::vector<StoreKey> keys;
  for (int i = 0; i < 12; ++i) {
    StoreKey k = kKey;
    k.name = "block/" + std::to_string(i);
    keys.push_back(k);
    s->put(k, payload_of(30000, static_cast<uint32_t>(i), false), milliseconds(0));
    if (i >= 1) {
      // Keep record 0 in use: read it after every write (mtime resolution
      // is fine enough on every filesystem this runs on; the sleep makes
      // sure of it).
      std::this_thread::sleep_for(milliseconds(5));
      ASSERT_TRUE(s->get(keys[0]).has_value()) << "the most recently used was evicted";
    }
  }
  uint64_t total = 0;
  for (const std::string& f : snap_files(dir())) total += fs::file_size(f);
  EXPECT_LE(total, 200000u);
  EXPECT_GT(s->counters().evictions, 0);
  EXPECT_FALSE(s->get(keys[1]).has_value()) << "the least recently used should be gone";
  EXPECT_TRUE(s->get(keys[11]).has_value());
}

StoreKey key_of(const std::string& tenant, const std::string& name,
                const std::string& fp = kKey.system_fingerprint) {
  return StoreKey{fp, tenant, name};
}

// Tenant A's writes past its share remove A's own least recently used
// records (never B's, which is older still), keep A within its share, and
// are not the size cap's evictions.
TEST_F(DiskStoreTest, ATenantFillingItsShareEvictsOnlyItsOwnRecords) {
  auto s = open(1ull << 30, TenantShares{{{"a", 200000}}, 0});
  s->put(key_of("b", "session/b"), payload_of(30000, 99, false), milliseconds(0));
  std::this_thread::sleep_for(milliseconds(5));
  for (int i = 0; i < 12; ++i) {
    s->put(key_of("a", "block/" + std::to_string(i)), payload_of(30000, i, false), milliseconds(0));
    std::this_thread::sleep_for(milliseconds(5));
    if (i >= 1) ASSERT_TRUE(s->get(key_of("a", "block/0")).has_value()) << "A's most used went";
    EXPECT_LE(tenant_bytes("a"), 200000u) << "after write " << i;
  }
  EXPECT_EQ(s->get(key_of("b", "session/b")).value_or(""), payload_of(30000, 99, false))
      << "A's writes evicted B's session";
  EXPECT_FALSE(s->get(key_of("a", "block/1")).has_value()) << "A's least recently used stays";
  EXPECT_TRUE(s->get(key_of("a", "block/11")).has_value());
  const StoreCounters c = s->counters();
  EXPECT_GT(c.share_evictions, 0);
  EXPECT_EQ(c.evictions, 0);
  EXPECT_EQ(c.put_errors, 0);
}

// A record larger than the tenant's whole share is refused (a StoreError,
// counted) and evicts nothing; other tenants are unaffected.
TEST_F(DiskStoreTest, AWriteLargerThanTheShareIsRefusedAndCounted) {
  auto s = open(1ull << 30, TenantShares{{{"a", 50000}}, 0});
  s->put(key_of("a", "session/small"), "small", milliseconds(0));
  try {
    s->put(key_of("a", "block/big"), payload_of(100000, 1, false), milliseconds(0));
    FAIL() << "a record larger than the share was stored";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("share of 50000 bytes"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(s->get(key_of("a", "block/big")).has_value());
  EXPECT_EQ(s->get(key_of("a", "session/small")).value_or(""), "small") << "evicted for nothing";
  s->put(key_of("b", "block/big"), payload_of(100000, 1, false), milliseconds(0));  // no share
  EXPECT_TRUE(s->get(key_of("b", "block/big")).has_value());
  const StoreCounters c = s->counters();
  EXPECT_EQ(c.share_refused, 1);
  EXPECT_EQ(c.put_errors, 1);
  EXPECT_EQ(c.share_evictions, 0);
}

// The usage is counted from the files at open (a restart, or records of
// another process) and over every fingerprint: the share holds across them.
TEST_F(DiskStoreTest, ASharesUsageSurvivesARestartAndSpansFingerprints) {
  const TenantShares shares{{}, 200000};  // every tenant's default
  {
    auto s = open(1ull << 30, shares);
    for (int i = 0; i < 5; ++i) {
      s->put(key_of("a", "block/" + std::to_string(i), "fp_old"), payload_of(30000, i, false),
             milliseconds(0));
      std::this_thread::sleep_for(milliseconds(2));  // an order of use to go by
    }
  }
  auto s = open(1ull << 30, shares);
  for (int i = 5; i < 10; ++i) {
    s->put(key_of("a", "block/" + std::to_string(i)), payload_of(30000, i, false), milliseconds(0));
    EXPECT_LE(tenant_bytes("a"), 200000u) << "after write " << i;
  }
  EXPECT_GT(s->counters().share_evictions, 0);
  EXPECT_FALSE(s->get(key_of("a", "block/0", "fp_old")).has_value())
      << "the old model's records of A, least recently used, should go first";
  EXPECT_TRUE(s->get(key_of("a", "block/9")).has_value());
}

// Over the size cap, the records of tenants without a share go first: a
// tenant within its share keeps its records.
TEST_F(DiskStoreTest, TheSizeCapTakesFromTenantsWithoutAShareFirst) {
  auto s = open(/*max_bytes=*/250000, TenantShares{{{"a", 100000}}, 0});
  for (int i = 0; i < 3; ++i) {  // A's, the least recently used of all
    s->put(key_of("a", "session/" + std::to_string(i)), payload_of(30000, i, false),
           milliseconds(0));
  }
  std::this_thread::sleep_for(milliseconds(5));
  for (int i = 0; i < 8; ++i) {
    s->put(key_of("b", "block/" + std::to_string(i)), payload_of(30000, 10 + i, false),
           milliseconds(0));
    std::this_thread::sleep_for(milliseconds(2));
  }
  EXPECT_GT(s->counters().evictions, 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(s->get(key_of("a", "session/" + std::to_string(i))).has_value())
        << "the size cap took A's record " << i;
  }
  EXPECT_LE(tenant_bytes("a") + tenant_bytes("b"), 250000u);
}

// A writer killed with SIGKILL at an arbitrary moment leaves the previous
// record (or the new one) loadable, never a broken one.
TEST_F(DiskStoreTest, KillNineDuringAWriteLeavesAValidRecord) {
  const std::string a = payload_of(3 << 20, 1, false), b = payload_of(3 << 20, 2, false);
  {
    auto s = open();
    s->put(kKey, a, milliseconds(0));
  }
  for (int round = 0; round < 5; ++round) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      DiskStoreOptions o;
      o.dir = dir();
      o.zstd_level = 0;
      auto s = open_disk_store(o);
      for (int i = 0;; ++i) s->put(kKey, i % 2 ? a : b, milliseconds(0));
    }
    std::this_thread::sleep_for(milliseconds(20 + 37 * round));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    auto s = open();
    const std::optional<std::string> got = s->get(kKey);
    ASSERT_TRUE(got.has_value()) << "round " << round << ": no valid record after kill -9";
    EXPECT_TRUE(*got == a || *got == b) << "round " << round;
  }
}

// A full disk (here a file size limit) is a clear StoreError; what was
// stored before stays valid.
TEST_F(DiskStoreTest, AFullDiskIsAClearErrorAndLosesNothing) {
  auto s = open();
  s->put(kKey, "committed", milliseconds(0));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of killing us
    rlimit lim{64 * 1024, 64 * 1024};
    setrlimit(RLIMIT_FSIZE, &lim);
    DiskStoreOptions o;
    o.dir = dir();
    o.zstd_level = 0;
    auto cs = open_disk_store(o);
    try {
      cs->put(kKey, payload_of(1 << 20, 5, false), milliseconds(0));
      _exit(3);  // not refused
    } catch (const StoreError& e) {
      _exit(std::string(e.what()).find("File too large") != std::string::npos ? 0 : 4);
    }
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: accepted, 4: an unclear error";
  EXPECT_EQ(s->get(kKey).value_or(""), "committed");
  for (const auto& e : fs::recursive_directory_iterator(dir())) {
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "left " << e.path();
  }
}

}  // namespace
}  // namespace encore
