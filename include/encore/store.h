// Persistent state tiers: snapshots of KV blocks and session records that
// outlive the process, on a local disk and in Redis, behind one small
// interface.
//
// A record is addressed by a StoreKey: the system fingerprint (model content,
// build, KV type, RoPE settings), the tenant and a name ("block/<hash>",
// "session/<id>"). Every record carries a self-describing header (snapshot.h:
// magic, format version, the key, creation and expiry times, lengths,
// XXH3-128 of the payload); a load checks all of it and treats anything that
// does not match — truncated, bit-flipped, another model, another tenant,
// another format version, expired — as absent: counted by reason, reported
// through the log callback (and to the caller, get()'s `rejected`), never an
// error and never wrong state. The caller recomputes (a KV block) or treats
// the record as absent (a session).
//
// Tiers: a local directory (DiskStore: one file per record, zstd payload,
// atomic writes, a size cap with least-recently-used collection, TTL) and
// Redis (RedisStore: `SET key value PX ttl`, pipelined writes; a server that
// is down, slow or flushed only costs misses, counted and logged once per
// burst, and service resumes by itself). TieredStore looks a record up tier
// by tier and copies a hit into the tiers above it.
//
// Tenants' shares (TenantShares): in each tier, the records of a tenant
// with a share (sessions and KV blocks, of every system fingerprint) use at
// most that many bytes; a write that would pass it first removes that
// tenant's own least recently used records, never another tenant's.
//
// Ownership: a tier owns its connection or directory handle. Thread-safety:
// every method of every tier may be called from any thread (each tier
// serialises what needs it).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "encore/error.h"

namespace encore {

// A store could not do something the caller must know about (a write that
// failed: disk full, unwritable directory). Reads never throw it.
class StoreError : public Error {
 public:
  using Error::Error;
};

struct StoreKey {
  std::string system_fingerprint;
  std::string tenant;
  std::string name;  // [A-Za-z0-9_./-], at most 200 bytes
  bool operator==(const StoreKey&) const = default;
};

// Why a record that was there could not be used (counted per reason).
enum class StoreMiss {
  Truncated,    // shorter than its header says, or no complete header
  Corrupt,      // bad magic, header checksum, payload checksum or compressed data
  Version,      // another format version
  Fingerprint,  // another model, build or numerics setting
  Tenant,       // written for another tenant (only a hash collision could do this)
  Key,          // another name at this place
  Expired,      // older than its time to live
  TooLarge,     // lengths beyond the configured bound
};
inline constexpr int kStoreMissReasons = 8;
const char* store_miss_name(StoreMiss m);

struct StoreCounters {
  int64_t gets = 0;
  int64_t hits = 0;
  int64_t misses = 0;                        // absent, or unusable (see rejected)
  int64_t rejected[kStoreMissReasons] = {};  // by StoreMiss
  int64_t puts = 0;
  int64_t put_errors = 0;
  int64_t get_errors = 0;  // the tier could not be read (I/O error, Redis down)
  int64_t deletes = 0;
  int64_t evictions = 0;        // removed by the size cap
  int64_t share_evictions = 0;  // removed to keep their tenant within its share
  int64_t share_refused = 0;    // writes larger than their tenant's whole share (also put_errors)
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
};

// Receives one line per event worth telling a person (a rejected record and
// why; the first error of a burst). Called from the thread that hit it.
using StoreLog = std::function<void(std::string_view)>;

class StoreTier {
 public:
  virtual ~StoreTier() = default;
  virtual std::string_view name() const = 0;
  // The record's payload, or nullopt: absent, expired or unusable. With
  // expires_ms, also its expiry (ms since the epoch, 0: never), so a copy
  // elsewhere can keep the same deadline. With rejected, also why a record
  // that was there could not be used (left empty when there was none).
  virtual std::optional<std::string> get(const StoreKey& key, uint64_t* expires_ms = nullptr,
                                         std::optional<StoreMiss>* rejected = nullptr) = 0;
  // Stores a payload that expires after ttl (0: never). Throws StoreError
  // when it could not be stored (what was stored before stays valid).
  virtual void put(const StoreKey& key, std::string_view payload,
                   std::chrono::milliseconds ttl) = 0;
  // Several at once (Redis pipelines them). Throws StoreError after trying
  // all of them if any failed (the valid ones are stored).
  virtual void put_many(const std::vector<std::pair<StoreKey, std::string>>& items,
                        std::chrono::milliseconds ttl);
  // True if a record was removed.
  virtual bool remove(const StoreKey& key) = 0;
  // System fingerprints other than key's under which this tier holds the
  // same tenant and name (a record of another model or build): what a
  // model change left behind.
  virtual std::vector<std::string> elsewhere(const StoreKey& key) = 0;
  virtual StoreCounters counters() const = 0;
};

// Each tenant's share of a tier. A tenant with a share (> 0) keeps its
// records (all of them: sessions and KV blocks of every system fingerprint,
// counted by their stored size) within it: a write that would pass it first
// removes that tenant's own least recently used records (down to 90 % of
// the share, making room for the new one), never another tenant's; a record
// larger than the whole share is refused (StoreError, counted in
// share_refused and put_errors) and removes nothing. A tenant without a
// share is bounded only by the tier's own cap (disk: max_bytes, which
// removes the records of tenants without a share first; Redis: its
// maxmemory policy).
struct TenantShares {
  std::map<std::string, uint64_t> bytes;  // tenant -> its share in bytes (> 0)
  uint64_t default_bytes = 0;             // every other tenant's; 0: none
  // The share of `tenant` (0: none).
  uint64_t of(const std::string& tenant) const {
    const auto it = bytes.find(tenant);
    return it != bytes.end() ? it->second : default_bytes;
  }
};

struct DiskStoreOptions {
  std::string dir;                         // created if missing
  uint64_t max_bytes = 8ull << 30;         // size cap of all records (least recently used go first)
  uint64_t max_record_bytes = 1ull << 30;  // larger records are refused (writes) or rejected
  int zstd_level = 1;
  // Counted per tenant from the files at open and on every write; several
  // processes sharing the directory each see the others' records when they
  // count a tenant afresh (whenever its share looks full).
  TenantShares shares;
  StoreLog log;
};
// util::cache_dir(): $XDG_CACHE_HOME/encore, else $HOME/.cache/encore (absolute
// values only), else "" (none).
std::string default_state_dir();

struct RedisStoreOptions {
  std::string url;  // redis://host:port[/db]
  std::chrono::milliseconds connect_timeout{500};
  std::chrono::milliseconds command_timeout{500};
  // After a failure the tier answers misses without trying for this long,
  // then reconnects.
  std::chrono::milliseconds retry_after{1000};
  uint64_t max_record_bytes = 512ull << 20;  // Redis' own limit for a string
  // Usage is kept in Redis, per tenant (keys encore:usage:v1:<tenant
  // tag>:{bytes,sizes,lru}: the byte count, each record's size, its last
  // use), updated by Lua scripts run atomically by the server, so several
  // engines sharing one Redis count and evict correctly (they should give a
  // tenant the same share). Needs a standalone Redis (not Cluster): a
  // script touches the tenant's records besides the keys it declares.
  TenantShares shares;
  StoreLog log;
};

// Throws StoreError when the directory cannot be created or written.
std::unique_ptr<StoreTier> open_disk_store(const DiskStoreOptions& options);
// Throws InvalidArgument for a malformed URL. Never fails for an unreachable
// server: it is tried on use (and counted as errors while down).
std::unique_ptr<StoreTier> open_redis_store(const RedisStoreOptions& options);

// ---- The tiers as an operator sees them (`encore cache`) ----------------------

struct DiskRecord {
  std::string path;
  uint64_t file_bytes = 0;
  int64_t last_used_ms = 0;  // the file's mtime: reads touch it
  StoreKey key;              // from the header (empty when the header is damaged)
  uint64_t created_ms = 0;
  uint64_t expires_ms = 0;  // 0: never
  uint64_t payload_bytes = 0;
  std::optional<StoreMiss> problem;  // why it would not load (with verify: payload checked too)
  std::string detail;
};
// Every record file under dir, oldest use first. verify: read and check every
// payload (checksums, decompression), not only the headers.
std::vector<DiskRecord> list_disk_records(const std::string& dir, bool verify);
struct GcResult {
  int64_t removed = 0;
  uint64_t bytes_freed = 0;
};
// Removes expired and damaged records (verify: payloads checked too, not
// only headers), leftovers of interrupted writes older than ten minutes and,
// while the records exceed max_bytes, the least recently used (down to 90 %
// of it).
GcResult collect_disk_garbage(const std::string& dir, uint64_t max_bytes, bool verify = false);

struct RedisRecord {
  std::string key;  // encore:v1:<fingerprint>:<tenant hash>:<name>
  int64_t bytes = 0;
  int64_t ttl_ms = -1;  // -1: none
};
// Every Encore key of the server (SCAN). Throws StoreError when unreachable.
std::vector<RedisRecord> list_redis_records(const std::string& url);
// What stands for a tenant in stored records (16 hex digits of its XXH3-64):
// the folder of the state directory, the tenant part of a Redis key
// ("encore:v1:<fp>:<this>:<name>"), the unit of the tenants' shares.
std::string tenant_tag(std::string_view tenant);
// The key's record name (after the tenant part).
std::string redis_record_name(std::string_view key);
// Deletes the given keys (and their entries in their tenant's usage);
// returns how many existed. Throws StoreError.
int64_t remove_redis_records(const std::string& url, const std::vector<std::string>& keys);
// Bytes per tenant tag as the usage keys count them (RedisStoreOptions::shares),
// by tag. Throws StoreError.
std::vector<std::pair<std::string, int64_t>> redis_tenant_usage(const std::string& url);

// Tiers from fastest to slowest. get() asks each in turn; the caller
// promotes a hit (copies it into the tiers before the one that had it, with
// the time it has left) with put_above(), typically off its hot path.
// put() writes to all (errors of one tier are counted there and do not stop
// the others; the first is rethrown after).
class TieredStore {
 public:
  explicit TieredStore(std::vector<std::unique_ptr<StoreTier>> tiers);
  // The payload, the tier that had it and its expiry.
  struct Hit {
    std::string payload;
    std::string tier;
    size_t tier_index = 0;
    uint64_t expires_ms = 0;  // 0: never
  };
  // With rejected: on a miss, why the last tier that held an unusable
  // record rejected it (empty: no tier held one).
  std::optional<Hit> get(const StoreKey& key, std::optional<StoreMiss>* rejected = nullptr);
  // Every tier's record of key, fastest tier first: for records that change
  // under one key (sessions), where a slower tier may hold a newer one.
  // rejected as for get(), when no tier has one.
  std::vector<Hit> get_each(const StoreKey& key, std::optional<StoreMiss>* rejected = nullptr);
  // Writes to the tiers before tier_index only; ttl as put().
  void put_above(size_t tier_index, const std::vector<std::pair<StoreKey, std::string>>& items,
                 std::chrono::milliseconds ttl);
  void put(const StoreKey& key, std::string_view payload, std::chrono::milliseconds ttl);
  void put_many(const std::vector<std::pair<StoreKey, std::string>>& items,
                std::chrono::milliseconds ttl);
  bool remove(const StoreKey& key);
  std::vector<std::string> elsewhere(const StoreKey& key);
  const std::vector<std::unique_ptr<StoreTier>>& tiers() const { return tiers_; }

 private:
  // Tier t's record of key; a rejection is written to *rejected (if given).
  std::optional<Hit> get_from(size_t t, const StoreKey& key, std::optional<StoreMiss>* rejected);

  std::vector<std::unique_ptr<StoreTier>> tiers_;
};

}  // namespace encore
