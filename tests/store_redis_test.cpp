// The Redis tier (store.h) against a real redis-server: round trips with
// pipelining, PX expiry, tenant-separated keys (redis-cli --scan shows
// them), a flushed server, a value that is not a record, and an outage: the
// server killed and restarted while the store is in use. Then the tiered
// store: a Redis hit is copied to disk.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cli_runner.h"
#include "encore/store.h"
#include "redis_server.h"
#include "store/snapshot.h"

namespace encore {
namespace {

using std::chrono::milliseconds;

const StoreKey kKey{"fp_0123456789abcdef0123456789abcdef", "tenant-a", "session/chat-1"};

class RedisStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<StoreTier> open(TenantShares shares = {}) {
    RedisStoreOptions o;
    o.shares = std::move(shares);
    o.url = server_.url();
    o.retry_after = milliseconds(50);
    o.command_timeout = milliseconds(300);
    o.log = [this](std::string_view line) { log_.emplace_back(line); };
    return open_redis_store(o);
  }
  // The bytes of a tenant's record values in Redis.
  int64_t tenant_bytes(const std::string& tenant) const {
    int64_t total = 0;
    for (const RedisRecord& r : list_redis_records(server_.url())) {
      if (r.key.find(":" + tenant_tag(tenant) + ":") != std::string::npos) total += r.bytes;
    }
    return total;
  }
  // What the usage keys say of it.
  int64_t counted_bytes(const std::string& tenant) const {
    for (const auto& [tag, bytes] : redis_tenant_usage(server_.url())) {
      if (tag == tenant_tag(tenant)) return bytes;
    }
    return 0;
  }
  test::RedisServer server_;
  std::vector<std::string> log_;
};

std::string noise(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : s) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

StoreKey key_of(const std::string& tenant, const std::string& name) {
  return StoreKey{kKey.system_fingerprint, tenant, name};
}

TEST_F(RedisStoreTest, RoundTripsAndPipelines) {
  auto s = open();
  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  s->put(kKey, big, milliseconds(0));
  EXPECT_EQ(s->get(kKey).value_or(""), big);
  std::vector<std::pair<StoreKey, std::string>> items;
  for (int i = 0; i < 50; ++i) {
    StoreKey k = kKey;
    k.name = "block/" + std::to_string(i);
    items.emplace_back(k, "payload " + std::to_string(i));
  }
  s->put_many(items, milliseconds(0));
  for (const auto& [k, v] : items) EXPECT_EQ(s->get(k).value_or(""), v);
  EXPECT_EQ(s->counters().hits, 51);
  EXPECT_EQ(s->counters().put_errors, 0);
}

TEST_F(RedisStoreTest, TtlIsSetWithPxAndEntriesExpire) {
  auto s = open();
  // 1 s: long enough that spawning redis-cli on a loaded machine (a 100 ms
  // TTL once expired before the PTTL below ran) cannot outlive it.
  s->put(kKey, "short-lived", milliseconds(1000));
  const std::string keys = server_.cli("--scan --pattern 'encore:v1:*'");
  ASSERT_FALSE(keys.empty());
  const std::string key = keys.substr(0, keys.find('\n'));
  const long pttl = std::stol(server_.cli("PTTL " + key));
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 1000);
  std::this_thread::sleep_for(milliseconds(1300));
  EXPECT_FALSE(s->get(kKey).has_value());
  EXPECT_EQ(server_.cli("EXISTS " + key), "0\n") << "Redis kept an expired key";
}

TEST_F(RedisStoreTest, TenantsGetDifferentKeys) {
  auto s = open();
  StoreKey b = kKey;
  b.tenant = "tenant-b";
  s->put(kKey, "alice", milliseconds(0));
  EXPECT_FALSE(s->get(b).has_value()) << "tenant B read tenant A's record";
  s->put(b, "bob", milliseconds(0));
  EXPECT_EQ(s->get(kKey).value_or(""), "alice");
  EXPECT_EQ(s->get(b).value_or(""), "bob");
  const std::string keys = server_.cli("--scan --pattern 'encore:v1:*'");
  EXPECT_EQ(std::count(keys.begin(), keys.end(), '\n'), 2) << keys;
  EXPECT_NE(keys.find(kKey.system_fingerprint), std::string::npos) << keys;
}

TEST_F(RedisStoreTest, FlushedOrForeignValuesAreMisses) {
  auto s = open();
  s->put(kKey, "state", milliseconds(0));
  server_.cli("FLUSHALL");
  EXPECT_FALSE(s->get(kKey).has_value());
  s->put(kKey, "state", milliseconds(0));
  const std::string keys = server_.cli("--scan --pattern 'encore:v1:*'");
  server_.cli("SET " + keys.substr(0, keys.find('\n')) + " not-a-snapshot-record-at-all");
  EXPECT_FALSE(s->get(kKey).has_value());
  EXPECT_EQ(s->counters().rejected[static_cast<int>(StoreMiss::Corrupt)], 1);
}

TEST_F(RedisStoreTest, AnOutageCostsMissesAndServiceResumesByItself) {
  auto s = open();
  s->put(kKey, "before", milliseconds(0));
  server_.stop();
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(s->get(kKey).has_value());
  EXPECT_THROW(s->put(kKey, "during", milliseconds(0)), StoreError);
  const StoreCounters down = s->counters();
  EXPECT_GT(down.get_errors, 0);
  size_t told = 0;
  for (const std::string& l : log_) told += l.find("retrying") != std::string::npos ? 1 : 0;
  EXPECT_EQ(told, 1u) << "an outage is told once per burst";
  server_.start();  // empty again: no persistence
  std::this_thread::sleep_for(milliseconds(60));
  s->put(kKey, "after", milliseconds(0));
  EXPECT_EQ(s->get(kKey).value_or(""), "after");
  EXPECT_NE(log_.back().find("is back"), std::string::npos) << log_.back();
}

// A server that stops answering (CLIENT PAUSE) costs one command timeout
// (a miss, counted), then misses at once until it answers again.
TEST_F(RedisStoreTest, ASlowServerTimesOutAndComesBack) {
  auto s = open();
  s->put(kKey, "state", milliseconds(0));
  std::thread pause([&] { server_.cli("CLIENT PAUSE 1500 ALL"); });
  pause.join();
  EXPECT_FALSE(s->get(kKey).has_value());  // times out: a miss, not a wait for the pause
  EXPECT_FALSE(s->get(kKey).has_value());  // marked down: a miss at once
  EXPECT_GT(s->counters().get_errors, 0);
  std::this_thread::sleep_for(milliseconds(1600));
  EXPECT_EQ(s->get(kKey).value_or(""), "state");
}

TEST_F(RedisStoreTest, BadUrlsAreClearErrors) {
  for (const char* bad : {"http://x", "redis://", "redis://h:0", "redis://h:99999", "redis://h/x",
                          "redis://user:pw@h"}) {
    RedisStoreOptions o;
    o.url = bad;
    EXPECT_THROW(open_redis_store(o), InvalidArgument) << bad;
  }
}

// Tenant A's writes past its share remove A's own least recently used
// records (a read counts as a use), never B's; the usage kept in Redis
// matches the values there.
TEST_F(RedisStoreTest, ATenantFillingItsShareEvictsOnlyItsOwnRecords) {
  auto s = open(TenantShares{{{"a", 200000}}, 0});
  s->put(key_of("b", "session/b"), noise(30000, 99), milliseconds(0));
  for (int i = 0; i < 12; ++i) {
    s->put(key_of("a", "block/" + std::to_string(i)), noise(30000, i), milliseconds(0));
    if (i >= 1) ASSERT_TRUE(s->get(key_of("a", "block/0")).has_value()) << "A's most used went";
    EXPECT_LE(tenant_bytes("a"), 200000) << "after write " << i;
    EXPECT_EQ(counted_bytes("a"), tenant_bytes("a")) << "after write " << i;
  }
  EXPECT_EQ(s->get(key_of("b", "session/b")).value_or(""), noise(30000, 99))
      << "A's writes evicted B's session";
  EXPECT_FALSE(s->get(key_of("a", "block/1")).has_value()) << "A's least recently used stays";
  EXPECT_TRUE(s->get(key_of("a", "block/11")).has_value());
  EXPECT_GT(s->counters().share_evictions, 0);
  EXPECT_EQ(s->counters().put_errors, 0);
  // A removal is counted out of the usage too.
  EXPECT_TRUE(s->remove(key_of("a", "block/11")));
  EXPECT_EQ(counted_bytes("a"), tenant_bytes("a"));
  EXPECT_EQ(counted_bytes("b"), tenant_bytes("b"));
}

TEST_F(RedisStoreTest, AWriteLargerThanTheShareIsRefusedAndCounted) {
  auto s = open(TenantShares{{}, 50000});  // every tenant's default
  s->put(key_of("a", "session/small"), "small", milliseconds(0));
  try {
    s->put(key_of("a", "block/big"), noise(100000, 1), milliseconds(0));
    FAIL() << "a record larger than the share was stored";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("share of 50000 bytes"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(s->get(key_of("a", "block/big")).has_value());
  EXPECT_EQ(s->get(key_of("a", "session/small")).value_or(""), "small") << "evicted for nothing";
  EXPECT_EQ(s->counters().share_refused, 1);
  EXPECT_EQ(s->counters().put_errors, 1);
  EXPECT_EQ(s->counters().share_evictions, 0);
}

// Two engines (two stores, two connections) writing for the same tenant
// keep it within its share together: the usage lives in Redis.
TEST_F(RedisStoreTest, StoresSharingOneRedisKeepTheShareTogether) {
  const TenantShares shares{{{"a", 200000}}, 0};
  auto s1 = open(shares), s2 = open(shares);
  for (int i = 0; i < 16; ++i) {
    StoreTier& s = i % 2 ? *s2 : *s1;
    s.put(key_of("a", "block/" + std::to_string(i)), noise(30000, i), milliseconds(0));
    EXPECT_LE(tenant_bytes("a"), 200000) << "after write " << i;
  }
  EXPECT_GT(s1->counters().share_evictions + s2->counters().share_evictions, 0);
}

// Records that expired free their bytes (no live record is evicted for
// them, and they are not counted as evictions).
TEST_F(RedisStoreTest, ExpiredRecordsFreeTheirShare) {
  auto s = open(TenantShares{{{"a", 200000}}, 0});
  s->put(key_of("a", "session/kept"), noise(30000, 0), milliseconds(0));
  for (int i = 0; i < 5; ++i) {
    s->put(key_of("a", "block/short" + std::to_string(i)), noise(30000, i + 1), milliseconds(200));
  }
  std::this_thread::sleep_for(milliseconds(400));
  for (int i = 0; i < 5; ++i) {
    s->put(key_of("a", "block/" + std::to_string(i)), noise(30000, i + 10), milliseconds(0));
  }
  EXPECT_TRUE(s->get(key_of("a", "session/kept")).has_value()) << "evicted for expired records";
  EXPECT_EQ(s->counters().share_evictions, 0);
  EXPECT_EQ(counted_bytes("a"), tenant_bytes("a"));
}

// A hit in Redis is copied to the disk tier with the time it has left (a
// promotion never makes a record live longer than it was written for).
TEST_F(RedisStoreTest, TieredStorePromotesARedisHitToDiskKeepingItsExpiry) {
  test::TempDir dir;
  DiskStoreOptions d;
  d.dir = dir.file("state");
  std::vector<std::unique_ptr<StoreTier>> tiers;
  tiers.push_back(open_disk_store(d));
  tiers.push_back(open());
  TieredStore t(std::move(tiers));
  t.tiers()[1]->put(kKey, "from redis", milliseconds(60000));
  const std::optional<TieredStore::Hit> first = t.get(kKey);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->tier, "redis");
  EXPECT_EQ(first->tier_index, 1u);
  ASSERT_GT(first->expires_ms, 0u);
  t.put_above(first->tier_index, {{kKey, first->payload}},
              milliseconds(first->expires_ms - store::unix_ms_now()));
  server_.cli("FLUSHALL");
  const std::optional<TieredStore::Hit> second = t.get(kKey);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->tier, "disk");
  EXPECT_EQ(second->payload, "from redis");
  EXPECT_GT(second->expires_ms, 0u) << "the copy lives for ever";
  EXPECT_LE(second->expires_ms, first->expires_ms + 50);
}

}  // namespace
}  // namespace encore
