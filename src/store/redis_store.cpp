// RedisStore (store.h) over hiredis' blocking API, one connection guarded by
// a mutex. Keys: encore:v1:<system fingerprint>:<XXH3-64 of the tenant,
// hex>:<name>; values: the same records as on disk (snapshot.h), so a value
// is verified the same way (a flushed or overwritten key is a miss, a wrong
// value is rejected).
//
// Tenants' shares: per tenant tag, encore:usage:v1:<tag>:bytes (the bytes of
// its records), :sizes (a hash: record key -> bytes) and :lru (a sorted set:
// record key -> last use, µs since the epoch). Writes and removals are Lua scripts (kPut,
// kRemove) that update records and usage together, atomically, and do the
// evicting; a hit bumps its record's last use in the same round trip.
// Entries of records that expired or were removed behind the index's back
// (another tool) are dropped on each write among the 8 least recently used,
// and all of them before a write evicts anything (they free their bytes
// without counting as evictions). The usage keys expire with the
// longest-lived record of the tenant; FLUSHALL takes them with the records.
//
// Failures never reach a request: a command that errs or times out marks the
// server down; for retry_after every call answers a miss (reads) or a
// StoreError (writes) at once, then the next call reconnects. Errors are
// counted one by one and told once per burst (the first failure after a
// success), and the return is told too.
#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <initializer_list>
#include <mutex>

#include "store/snapshot.h"

namespace encore {
namespace {

using SteadyClock = std::chrono::steady_clock;

struct ReplyFree {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

struct ContextFree {
  void operator()(redisContext* c) const {
    if (c) redisFree(c);
  }
};

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

struct Url {
  std::string host;
  int port = 6379;
  int db = 0;
};

Url parse_url(const std::string& url) {
  const auto bad = [&](const char* why) {
    return InvalidArgument(fmt::format(
        "redis URL '{}': {} (expected redis://HOST[:PORT][/DB], e.g. redis://127.0.0.1:6379/0)",
        url, why));
  };
  const std::string scheme = "redis://";
  if (url.rfind(scheme, 0) != 0) throw bad("it does not start with redis://");
  std::string rest = url.substr(scheme.size());
  if (rest.find('@') != std::string::npos) throw bad("passwords are not supported");
  Url u;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (!db.empty()) {
      if (db.size() > 4 || db.find_first_not_of("0123456789") != std::string::npos) {
        throw bad("the database is not a number");
      }
      u.db = std::stoi(db);
    }
  }
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    if (port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
        std::stoi(port) > 65535) {
      throw bad("the port is not a number in [1, 65535]");
    }
    u.port = std::stoi(port);
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) throw bad("no host");
  u.host = rest;
  return u;
}

// KEYS: the record, its tenant's :sizes, :lru, :bytes. ARGV: the value, PX
// ms (0: none), the share (0: none), the eviction goal, now (µs; a write is
// made the newest use even when clocks or microseconds tie).
// Returns {records evicted, 1}, or {-1, 0}: larger than the whole share.
constexpr const char* kPut = R"lua(
local key, sizes, lru, used_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local value, px, share, goal = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local size = string.len(value)
if share > 0 and size > share then return {-1, 0} end
local fresh = redis.call('EXISTS', lru) == 0
local before = tonumber(redis.call('GET', used_key) or '0')
local used = before
local function forget(k)
  used = used - tonumber(redis.call('HGET', sizes, k) or '0')
  redis.call('HDEL', sizes, k)
  redis.call('ZREM', lru, k)
end
forget(key)
for _, k in ipairs(redis.call('ZRANGE', lru, 0, 7)) do
  if redis.call('EXISTS', k) == 0 then forget(k) end
end
local evicted = 0
if share > 0 and used + size > share then
  for _, k in ipairs(redis.call('ZRANGE', lru, 0, -1)) do
    if redis.call('EXISTS', k) == 0 then forget(k) end
  end
  while used + size > goal do
    local oldest = redis.call('ZRANGE', lru, 0, 0)
    if #oldest == 0 then break end
    forget(oldest[1])
    evicted = evicted + redis.call('DEL', oldest[1])
  end
end
if used < 0 or redis.call('ZCARD', lru) == 0 then used = 0 end
if px > 0 then
  redis.call('SET', key, value, 'PX', px)
else
  redis.call('SET', key, value)
end
redis.call('HSET', sizes, key, size)
local now = tonumber(ARGV[5])
local newest = redis.call('ZRANGE', lru, -1, -1, 'WITHSCORES')
if newest[2] and tonumber(newest[2]) >= now then now = tonumber(newest[2]) + 1 end
redis.call('ZADD', lru, now, key)
redis.call('INCRBY', used_key, used + size - before)
if px == 0 then
  for _, k in ipairs({sizes, lru, used_key}) do redis.call('PERSIST', k) end
else
  local t = redis.call('PTTL', used_key)
  if fresh or (t >= 0 and t < px) then
    for _, k in ipairs({sizes, lru, used_key}) do redis.call('PEXPIRE', k, px) end
  end
end
return {evicted, 1}
)lua";

// KEYS: the record, its tenant's :sizes, :lru, :bytes. Returns 1 if the
// record existed.
constexpr const char* kRemove = R"lua(
local n = redis.call('DEL', KEYS[1])
local s = redis.call('HGET', KEYS[2], KEYS[1])
if s then
  redis.call('HDEL', KEYS[2], KEYS[1])
  redis.call('ZREM', KEYS[3], KEYS[1])
  redis.call('DECRBY', KEYS[4], s)
end
return n
)lua";

// One command's arguments as hiredis takes them: pointers and lengths, built
// from views that must outlive the call.
struct Args {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  Args(std::initializer_list<std::string_view> args) {
    for (std::string_view a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
  }
  int argc() const { return static_cast<int>(argv.size()); }
};
void append(redisContext* c, Args&& a) {
  redisAppendCommandArgv(c, a.argc(), a.argv.data(), a.lens.data());
}
void* call(redisContext* c, Args&& a) {
  return redisCommandArgv(c, a.argc(), a.argv.data(), a.lens.data());
}

uint64_t unix_us_now() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// The usage keys of a tenant tag: :sizes, :lru, :bytes.
std::array<std::string, 3> usage_keys(std::string_view tag) {
  const std::string base = fmt::format("encore:usage:v1:{}:", tag);
  return {base + "sizes", base + "lru", base + "bytes"};
}

// The tenant tag of a record key ("encore:v1:<fp>:<tag>:<name>"); "" if none.
std::string tag_of_key(std::string_view key) {
  size_t at = 0;
  for (int colon = 0; colon < 3; ++colon) {
    at = key.find(':', at);
    if (at == std::string_view::npos) return {};
    ++at;
  }
  const size_t end = key.find(':', at);
  return end == std::string_view::npos ? std::string() : std::string(key.substr(at, end - at));
}

class RedisStore final : public StoreTier {
 public:
  explicit RedisStore(const RedisStoreOptions& o) : o_(o), url_(parse_url(o.url)) {}

  std::string_view name() const override { return "redis"; }

  std::optional<std::string> get(const StoreKey& key, uint64_t* expires_ms,
                                 std::optional<StoreMiss>* rejected) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++c_.gets;
    if (!store::valid_name(key.name) || !connected()) return miss();
    const std::string k = redis_key(key);
    append(ctx_.get(), {"GET", k});
    // The same round trip marks it used (XX: only a record the index holds).
    const std::string lru = usage_keys(tenant_tag(key.tenant))[1];
    const std::string now = std::to_string(unix_us_now());
    append(ctx_.get(), {"ZADD", lru, "XX", now, k});
    void* raw = nullptr;
    void* raw_touch = nullptr;
    const bool got = redisGetReply(ctx_.get(), &raw) == REDIS_OK &&
                     redisGetReply(ctx_.get(), &raw_touch) == REDIS_OK;
    Reply r(static_cast<redisReply*>(raw));
    const Reply touched(static_cast<redisReply*>(raw_touch));
    if (!got || !r || r->type == REDIS_REPLY_ERROR) {
      failed(got && r ? r->str : ctx_->errstr, &StoreCounters::get_errors);
      return miss();
    }
    recovered();
    if (r->type == REDIS_REPLY_NIL) return miss();
    if (r->type != REDIS_REPLY_STRING) return miss();
    const std::string_view bytes(r->str, r->len);
    store::Decoded d = store::decode_record(bytes, key, store::unix_ms_now(), o_.max_record_bytes);
    c_.bytes_read += bytes.size();
    if (!d.payload) {
      ++c_.misses;
      ++c_.rejected[static_cast<int>(d.why)];
      if (rejected) *rejected = d.why;
      if (o_.log) {
        o_.log(fmt::format("redis store: ignoring {} ({}: {}); {}", k, store_miss_name(d.why),
                           d.detail, store::when_rejected(key.name)));
      }
      return std::nullopt;
    }
    ++c_.hits;
    if (expires_ms) *expires_ms = d.header.expires_ms;
    return std::move(d.payload);
  }

  void put(const StoreKey& key, std::string_view payload, std::chrono::milliseconds ttl) override {
    put_many({{key, std::string(payload)}}, ttl);
  }

  void put_many(const std::vector<std::pair<StoreKey, std::string>>& items,
                std::chrono::milliseconds ttl) override {
    std::lock_guard<std::mutex> lock(mu_);
    c_.puts += static_cast<int64_t>(items.size());
    std::string error;
    std::vector<size_t> valid;
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& [key, payload] = items[i];
      if (store::valid_name(key.name) && payload.size() <= o_.max_record_bytes) {
        valid.push_back(i);
      } else {
        ++c_.put_errors;
        error = fmt::format("record '{}' of {} bytes cannot be stored", key.name, payload.size());
      }
    }
    if (!valid.empty() && !connected()) {
      c_.put_errors += static_cast<int64_t>(valid.size());
      throw StoreError(fmt::format("redis store: {} is unreachable", o_.url));
    }
    // Pipelined: every script call is sent, then every reply read.
    const uint64_t now = store::unix_ms_now();
    const std::string px = std::to_string(std::max<int64_t>(ttl.count(), 0));
    const std::string now_text = std::to_string(unix_us_now());
    std::vector<std::string> values;
    std::vector<uint64_t> shares;
    values.reserve(valid.size());
    for (size_t i : valid) {
      const auto& [key, payload] = items[i];
      values.push_back(
          store::encode_record(key, payload, now, ttl.count() > 0 ? now + ttl.count() : 0, 1));
      shares.push_back(o_.shares.of(key.tenant));
      const std::string k = redis_key(key);
      const auto usage = usage_keys(tenant_tag(key.tenant));
      const std::string share = std::to_string(shares.back());
      const std::string goal = std::to_string(shares.back() - shares.back() / 10);
      append(ctx_.get(), {"EVAL", kPut, "4", k, usage[0], usage[1], usage[2], values.back(), px,
                          share, goal, now_text});
    }
    bool connection_failed = false;
    for (size_t v = 0; v < values.size(); ++v) {
      void* raw = nullptr;
      if (redisGetReply(ctx_.get(), &raw) != REDIS_OK) {
        error = ctx_->errstr;
        c_.put_errors += static_cast<int64_t>(values.size() - v);
        connection_failed = true;
        break;
      }
      Reply r(static_cast<redisReply*>(raw));
      if (r->type == REDIS_REPLY_ERROR) {  // e.g. OOM: this value only
        ++c_.put_errors;
        error = r->str;
        continue;
      }
      const auto& [key, payload] = items[valid[v]];
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
          r->element[0]->type != REDIS_REPLY_INTEGER) {
        ++c_.put_errors;
        error = "unexpected reply to the write script";
        continue;
      }
      if (r->element[0]->integer < 0) {
        ++c_.put_errors;
        ++c_.share_refused;
        error = fmt::format(
            "{} ({} bytes stored) is larger than tenant '{}''s whole share of {} "
            "bytes; not stored",
            key.name, values[v].size(), key.tenant, shares[v]);
        continue;
      }
      c_.share_evictions += r->element[0]->integer;
      c_.bytes_written += values[v].size();
    }
    if (connection_failed) failed(error, nullptr);
    if (!error.empty()) throw StoreError(fmt::format("redis store: {}: {}", o_.url, error));
    if (!values.empty()) recovered();
  }

  bool remove(const StoreKey& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++c_.deletes;
    if (!store::valid_name(key.name) || !connected()) return false;
    const std::string k = redis_key(key);
    const auto usage = usage_keys(tenant_tag(key.tenant));
    Reply r(static_cast<redisReply*>(
        call(ctx_.get(), {"EVAL", kRemove, "4", k, usage[0], usage[1], usage[2]})));
    if (!r || r->type == REDIS_REPLY_ERROR) {
      failed(r ? r->str : ctx_->errstr, nullptr);
      return false;
    }
    recovered();
    return r->type == REDIS_REPLY_INTEGER && r->integer > 0;
  }

  StoreCounters counters() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return c_;
  }

  std::vector<std::string> elsewhere(const StoreKey& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    if (!store::valid_name(key.name) || !connected()) return out;
    const std::string pattern = fmt::format("encore:v1:*:{}:{}", tenant_tag(key.tenant), key.name);
    std::string cursor = "0";
    for (int pages = 0; pages < 64; ++pages) {  // bounded: a model change is a rare event
      const char* argv[] = {"SCAN", cursor.c_str(), "MATCH", pattern.c_str(), "COUNT", "1000"};
      const size_t lens[] = {4, cursor.size(), 5, pattern.size(), 5, 4};
      Reply r(static_cast<redisReply*>(redisCommandArgv(ctx_.get(), 6, argv, lens)));
      if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
        failed(r && r->type == REDIS_REPLY_ERROR ? r->str
               : ctx_                            ? ctx_->errstr
                                                 : "SCAN failed",
               &StoreCounters::get_errors);
        return out;
      }
      cursor.assign(r->element[0]->str, r->element[0]->len);
      for (size_t i = 0; i < r->element[1]->elements; ++i) {
        const std::string k(r->element[1]->element[i]->str, r->element[1]->element[i]->len);
        const std::string fp = k.substr(10, k.find(':', 10) - 10);  // after "encore:v1:"
        if (fp != key.system_fingerprint) out.push_back(fp);
      }
      if (cursor == "0") break;
    }
    recovered();
    return out;
  }

 private:
  static std::string redis_key(const StoreKey& key) {
    return fmt::format("encore:v1:{}:{}:{}", key.system_fingerprint, tenant_tag(key.tenant),
                       key.name);
  }

  // A usable connection, or false (down: within retry_after of a failure,
  // or the connection attempt failed).
  bool connected() {
    if (ctx_ && !down_) return true;
    if (down_ && SteadyClock::now() < retry_at_) {
      ++c_.get_errors;
      return false;
    }
    ctx_.reset(
        redisConnectWithTimeout(url_.host.c_str(), url_.port, to_timeval(o_.connect_timeout)));
    if (!ctx_ || ctx_->err) {
      failed(ctx_ ? ctx_->errstr : "cannot allocate a context", &StoreCounters::get_errors);
      ctx_.reset();
      return false;
    }
    redisSetTimeout(ctx_.get(), to_timeval(o_.command_timeout));
    if (url_.db != 0) {
      Reply r(static_cast<redisReply*>(redisCommand(ctx_.get(), "SELECT %d", url_.db)));
      if (!r || r->type == REDIS_REPLY_ERROR) {
        failed(r ? r->str : ctx_->errstr, &StoreCounters::get_errors);
        ctx_.reset();
        return false;
      }
    }
    down_ = false;
    return true;
  }

  void failed(const std::string& what, int64_t StoreCounters::*counter) {
    if (counter) ++(c_.*counter);
    down_ = true;
    ctx_.reset();  // a timed-out connection may still deliver the old reply: never reuse it
    retry_at_ = SteadyClock::now() + o_.retry_after;
    if (!in_burst_ && o_.log) {
      o_.log(fmt::format("redis store: {}: {}; serving from the other tiers, retrying every {} ms",
                         o_.url, what, o_.retry_after.count()));
    }
    in_burst_ = true;
  }

  void recovered() {
    if (in_burst_ && o_.log) o_.log(fmt::format("redis store: {} is back", o_.url));
    in_burst_ = false;
  }

  std::optional<std::string> miss() {
    ++c_.misses;
    return std::nullopt;
  }

  RedisStoreOptions o_;
  Url url_;
  mutable std::mutex mu_;
  std::unique_ptr<redisContext, ContextFree> ctx_;
  bool down_ = false;
  bool in_burst_ = false;
  SteadyClock::time_point retry_at_{};
  StoreCounters c_;
};

}  // namespace

std::unique_ptr<StoreTier> open_redis_store(const RedisStoreOptions& options) {
  return std::make_unique<RedisStore>(options);
}

}  // namespace encore

namespace encore {
namespace {

// A short-lived connection for the `encore cache` commands: connected (2 s),
// with a 5 s timeout per command and the URL's database selected; a failed
// command throws naming the URL.
class AdminConnection {
 public:
  explicit AdminConnection(const std::string& url) : url_(url) {
    const Url u = parse_url(url);
    c_.reset(redisConnectWithTimeout(u.host.c_str(), u.port,
                                     to_timeval(std::chrono::milliseconds(2000))));
    if (!c_ || c_->err) {
      throw StoreError(fmt::format("redis {}: {}", url, c_ ? c_->errstr : "cannot connect"));
    }
    redisSetTimeout(c_.get(), to_timeval(std::chrono::milliseconds(5000)));
    if (u.db != 0) command({"SELECT", std::to_string(u.db)});
  }
  Reply command(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.c_str());
      lens.push_back(a.size());
    }
    Reply r(static_cast<redisReply*>(
        redisCommandArgv(c_.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (!r || r->type == REDIS_REPLY_ERROR) {
      throw StoreError(fmt::format("redis {}: {}", url_, r ? r->str : c_->errstr));
    }
    return r;
  }
  // Every key matching `pattern`, by SCAN (a key present from start to end
  // of the scan is listed, possibly more than once).
  std::vector<std::string> scan(const std::string& pattern) {
    std::vector<std::string> keys;
    std::string cursor = "0";
    do {
      Reply r = command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
        throw StoreError("redis: bad SCAN reply");
      }
      cursor.assign(r->element[0]->str, r->element[0]->len);
      for (size_t i = 0; i < r->element[1]->elements; ++i) {
        const redisReply* k = r->element[1]->element[i];
        keys.emplace_back(k->str, k->len);
      }
    } while (cursor != "0");
    return keys;
  }

 private:
  std::string url_;
  std::unique_ptr<redisContext, ContextFree> c_;
};

}  // namespace

std::vector<RedisRecord> list_redis_records(const std::string& url) {
  AdminConnection c(url);
  std::vector<RedisRecord> out;
  for (std::string& key : c.scan("encore:v1:*")) out.push_back({std::move(key), 0, -1});
  for (RedisRecord& rec : out) {
    rec.bytes = c.command({"STRLEN", rec.key})->integer;
    const long long ttl = c.command({"PTTL", rec.key})->integer;
    rec.ttl_ms = ttl >= 0 ? ttl : -1;
  }
  std::sort(out.begin(), out.end(),
            [](const RedisRecord& a, const RedisRecord& b) { return a.key < b.key; });
  return out;
}

}  // namespace encore

namespace encore {

std::string redis_record_name(std::string_view key) {
  size_t at = std::string_view::npos;
  for (int colon = 0; colon < 4; ++colon) {  // encore:v1:<fp>:<tenant tag>:<name>
    at = key.find(':', at == std::string_view::npos ? 0 : at + 1);
    if (at == std::string_view::npos) return {};
  }
  return std::string(key.substr(at + 1));
}

int64_t remove_redis_records(const std::string& url, const std::vector<std::string>& keys) {
  AdminConnection c(url);
  int64_t removed = 0;
  for (const std::string& k : keys) {  // through the script: the tenant's usage follows
    const auto usage = usage_keys(tag_of_key(k));
    removed += c.command({"EVAL", kRemove, "4", k, usage[0], usage[1], usage[2]})->integer;
  }
  return removed;
}

std::vector<std::pair<std::string, int64_t>> redis_tenant_usage(const std::string& url) {
  AdminConnection c(url);
  std::vector<std::pair<std::string, int64_t>> out;
  for (const std::string& key : c.scan("encore:usage:v1:*:bytes")) {
    const Reply v = c.command({"GET", key});
    const std::string tag = key.substr(16, key.size() - 16 - 6);  // between the prefix and ":bytes"
    out.emplace_back(tag,
                     v->type == REDIS_REPLY_STRING ? std::stoll(std::string(v->str, v->len)) : 0);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace encore
