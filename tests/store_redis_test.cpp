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
  std::unique_ptr<StoreTier> open() {
    RedisStoreOptions o;
    o.url = server_.url();
    o.retry_after = milliseconds(50);
    o.command_timeout = milliseconds(300);
    o.log = [this](std::string_view line) { log_.emplace_back(line); };
    return open_redis_store(o);
  }
  test::RedisServer server_;
  std::vector<std::string> log_;
};

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
