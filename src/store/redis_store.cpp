// RedisStore (store.h) over hiredis' blocking API, one connection guarded by
// a mutex. Keys: encore:v1:<system fingerprint>:<XXH3-64 of the tenant,
// hex>:<name>; values: the same records as on disk (snapshot.h), so a value
// is verified the same way (a flushed or overwritten key is a miss, a wrong
// value is rejected).
//
// Failures never reach a request: a command that errs or times out marks the
// server down; for retry_after every call answers a miss (reads) or a
// StoreError (writes) at once, then the next call reconnects. Errors are
// counted one by one and told once per burst (the first failure after a
// success), and the return is told too.
#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
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
    const char* argv[] = {"GET", k.c_str()};
    const size_t lens[] = {3, k.size()};
    Reply r(static_cast<redisReply*>(redisCommandArgv(ctx_.get(), 2, argv, lens)));
    if (!r || r->type == REDIS_REPLY_ERROR) {
      failed(r ? r->str : ctx_->errstr, &StoreCounters::get_errors);
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
    // Pipelined: every SET is sent, then every reply read.
    const uint64_t now = store::unix_ms_now();
    const std::string px = std::to_string(ttl.count());
    std::vector<std::string> values;
    values.reserve(valid.size());
    for (size_t i : valid) {
      const auto& [key, payload] = items[i];
      values.push_back(
          store::encode_record(key, payload, now, ttl.count() > 0 ? now + ttl.count() : 0, 1));
      const std::string k = redis_key(key);
      const char* argv[] = {"SET", k.c_str(), values.back().data(), "PX", px.c_str()};
      const size_t lens[] = {3, k.size(), values.back().size(), 2, px.size()};
      redisAppendCommandArgv(ctx_.get(), ttl.count() > 0 ? 5 : 3, argv, lens);
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
    const char* argv[] = {"DEL", k.c_str()};
    const size_t lens[] = {3, k.size()};
    Reply r(static_cast<redisReply*>(redisCommandArgv(ctx_.get(), 2, argv, lens)));
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
    const std::string pattern = fmt::format(
        "encore:v1:*:{:016x}:{}", XXH3_64bits(key.tenant.data(), key.tenant.size()), key.name);
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
    return fmt::format("encore:v1:{}:{}:{}", key.system_fingerprint, redis_tenant_tag(key.tenant),
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

 private:
  std::string url_;
  std::unique_ptr<redisContext, ContextFree> c_;
};

}  // namespace

std::vector<RedisRecord> list_redis_records(const std::string& url) {
  AdminConnection c(url);
  std::vector<RedisRecord> out;
  std::string cursor = "0";
  do {
    Reply r = c.command({"SCAN", cursor, "MATCH", "encore:v1:*", "COUNT", "1000"});
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) throw StoreError("redis: bad SCAN reply");
    cursor.assign(r->element[0]->str, r->element[0]->len);
    for (size_t i = 0; i < r->element[1]->elements; ++i) {
      const redisReply* k = r->element[1]->element[i];
      out.push_back({std::string(k->str, k->len), 0, -1});
    }
  } while (cursor != "0");
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

std::string redis_tenant_tag(std::string_view tenant) {
  return fmt::format("{:016x}", XXH3_64bits(tenant.data(), tenant.size()));
}

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
  for (const std::string& k : keys) removed += c.command({"DEL", k})->integer;
  return removed;
}

}  // namespace encore
