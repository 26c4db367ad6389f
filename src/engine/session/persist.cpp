#include "engine/session/persist.h"

#include <fmt/format.h>

#include <cstring>

#include "encore/error.h"
#include "engine/job.h"
#include "store/snapshot.h"
#include "util/little_endian.h"

namespace encore {
namespace {

constexpr uint32_t kBlockMagic = 0x4b4c4245;  // "EBLK" little-endian
constexpr uint32_t kBlockVersion = 1;
constexpr size_t kBlockFixed = 4 * 6 + 16 + 16;  // six u32, parent, root

// Writes waiting for a slow or absent tier are dropped (oldest first) past
// this: they are only a cache, and memory is not.
constexpr size_t kMaxQueuedBytes = size_t{256} << 20;

std::string block_name(const BlockHash& h) {
  return fmt::format("block/{:016x}{:016x}", h.hi, h.lo);
}

// The layout fields a block record must agree on (besides its key).
uint32_t layout_word(const KvLayout& l, int which) {
  switch (which) {
    case 0:
      return static_cast<uint32_t>(l.block_tokens);
    case 1:
      return static_cast<uint32_t>(l.n_layer);
    case 2:
      return static_cast<uint32_t>(l.row_elems());
    default:
      return static_cast<uint32_t>(l.elem_type);
  }
}

}  // namespace

Persistence::Persistence(std::unique_ptr<TieredStore> store, std::string system_fingerprint,
                         KvBlockPool& pool, std::chrono::milliseconds ttl, StoreLog log)
    : store_(std::move(store)),
      fingerprint_(std::move(system_fingerprint)),
      pool_(pool),
      ttl_(ttl),
      log_(std::move(log)) {
  writer_ = std::thread([this] { writer_main(); });
}

Persistence::~Persistence() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  writer_.join();
}

StoreKey Persistence::key(const std::string& tenant, std::string name) const {
  return StoreKey{fingerprint_, tenant, std::move(name)};
}

int32_t Persistence::restore(const std::string& tenant, const BlockKey& bk,
                             std::span<const int32_t> tokens) {
  const StoreKey k = key(tenant, block_name(bk.hash));
  std::optional<TieredStore::Hit> hit;
  try {
    hit = store_->get(k);
  } catch (const std::exception& e) {  // out of memory reading a record: recompute instead
    if (log_) log_(fmt::format("state: reading {} failed: {}", k.name, e.what()));
    return -1;
  }
  if (!hit) return -1;
  const std::string_view p = hit->payload;
  const KvLayout& l = pool_.layout();
  const size_t bt = static_cast<size_t>(l.block_tokens);
  const size_t want = kBlockFixed + 4 * bt + l.block_bytes();
  std::string why;
  if (p.size() != want) {
    why = fmt::format("{} bytes, a block of this layout has {}", p.size(), want);
  } else if (le::get(p, 0, 4) != kBlockMagic || le::get(p, 4, 4) != kBlockVersion) {
    why = "not a KV block record of this version";
  } else {
    for (int w = 0; w < 4 && why.empty(); ++w) {
      if (le::get(p, 8 + 4 * static_cast<size_t>(w), 4) != layout_word(l, w)) {
        why = "another KV layout";
      }
    }
    const BlockHash parent{le::get(p, 24, 8), le::get(p, 32, 8)};
    const BlockHash root{le::get(p, 40, 8), le::get(p, 48, 8)};
    if (why.empty() && (!(parent == bk.parent) || !(root == bk.root))) why = "another prefix";
    for (size_t i = 0; i < bt && why.empty(); ++i) {
      if (static_cast<int32_t>(le::get(p, kBlockFixed + 4 * i, 4)) != tokens[i]) {
        why = "other token ids";
      }
    }
  }
  if (!why.empty()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++c_.block_fallbacks;
    }
    if (log_)
      log_(fmt::format("state: ignoring {} from {} ({}); recomputing it", block_name(bk.hash),
                       hit->tier, why));
    return -1;
  }
  int32_t block = -1;
  try {
    block = pool_.allocate();
  } catch (const ResourceExhausted&) {
    return -1;  // the pool is full of blocks in use: recompute later
  }
  const std::span<uint8_t> dst = pool_.writable_block_data(block);
  std::memcpy(dst.data(), p.data() + kBlockFixed + 4 * bt, dst.size());
  pool_.publish(block, bk, tokens);
  promote(*hit, k);
  std::lock_guard<std::mutex> lock(mu_);
  ++c_.blocks_restored;
  ++c_.restored_from[hit->tier == "redis" ? 1 : 0];
  return block;
}

void Persistence::capture(const Job& job, int i) {
  const SampleRun& s = job.samples[static_cast<size_t>(i)];
  const KvLayout& l = pool_.layout();
  const int bt = l.block_tokens;
  // Before the fork (a sample that ended on the token it drew from the
  // prompt's logits) the sample's KV is the prompt's.
  const bool forked = job.phase == Job::Phase::Decode;
  const KvSequence& seq = forked ? s.seq : job.base;
  const std::span<const BlockHash> hashes =
      forked ? std::span<const BlockHash>(s.hashes)
             : std::span<const BlockHash>(job.prompt_hashes)
                   .first(std::min(job.prompt_hashes.size(),
                                   static_cast<size_t>(job.base.n_tokens / bt)));
  Write w;
  for (size_t b = 0; b < hashes.size() && b < seq.blocks.size(); ++b) {
    std::string name = block_name(hashes[b]);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (written_.size() > (1u << 20)) written_.clear();
      if (!written_.insert(name).second) continue;
    }
    const BlockHash parent = b == 0 ? job.root : hashes[b - 1];
    std::string p;
    p.reserve(kBlockFixed + 4 * static_cast<size_t>(bt) + l.block_bytes());
    le::put_u32(p, kBlockMagic);
    le::put_u32(p, kBlockVersion);
    for (int word = 0; word < 4; ++word) le::put_u32(p, layout_word(l, word));
    le::put_u64(p, parent.lo);
    le::put_u64(p, parent.hi);
    le::put_u64(p, job.root.lo);
    le::put_u64(p, job.root.hi);
    for (int k = 0; k < bt; ++k) {
      le::put_u32(p, static_cast<uint32_t>(job.token_at(s, static_cast<int64_t>(b) * bt + k)));
    }
    const std::span<const uint8_t> data = pool_.block_data(seq.blocks[b]);
    p.append(reinterpret_cast<const char*>(data.data()), data.size());
    w.items.emplace_back(key(job.tenant, std::move(name)), std::move(p));
  }
  if (w.items.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c_.blocks_saved += static_cast<int64_t>(w.items.size());
  }
  enqueue(std::move(w));
}

void Persistence::save_session(const std::string& tenant, const std::string& session,
                               RunState state, std::function<void()> on_written) {
  state.saved_ms = store::unix_ms_now();  // the newest record of a session wins (load_session)
  Write w;
  w.items.emplace_back(key(tenant, "session/" + session), run_state_json(state));
  w.done = std::move(on_written);
  w.session = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++c_.sessions_saved;
  }
  enqueue(std::move(w));
}

void Persistence::promote(const TieredStore::Hit& hit, const StoreKey& key) {
  if (hit.tier_index == 0) return;
  Write w;
  w.above = hit.tier_index;
  if (hit.expires_ms != 0) {
    const uint64_t now = store::unix_ms_now();
    if (hit.expires_ms <= now + 1) return;  // about to expire: not worth a copy
    w.ttl = std::chrono::milliseconds(hit.expires_ms - now);
  }
  w.items.emplace_back(key, hit.payload);
  enqueue(std::move(w));
}

std::string SessionLoad::why(const std::string& id) const {
  switch (absent) {
    case Absent::Missing:
      return fmt::format("no saved session '{}' for this tenant (expired, removed, or never saved)",
                         id);
    case Absent::Expired:
      return fmt::format("the saved session '{}' has expired", id);
    case Absent::Unusable:
      return fmt::format("the saved session '{}' cannot be used ({})", id, detail);
    case Absent::OtherModel:
      return fmt::format(
          "the session '{}' was saved by another model, build or numerics (KV type, the kernels' "
          "canonical order; system fingerprint {}) and cannot continue on this one",
          id, detail);
  }
  return {};
}

SessionLoad Persistence::load_session(const std::string& tenant, const std::string& session,
                                      bool look_elsewhere) {
  const StoreKey k = key(tenant, "session/" + session);
  SessionLoad out;
  // A record served from the queue may still fail to reach the tiers (then
  // a later continuation finds none, as for any loss). Otherwise every tier
  // is asked: a session that went on on another replica and came back has
  // its newest turn in Redis and an older one in this replica's directory.
  std::vector<TieredStore::Hit> hits;
  std::optional<StoreMiss> rejected;
  std::optional<std::string> queued = pending(k);
  if (queued) {
    hits.push_back(TieredStore::Hit{std::move(*queued), "write queue", 0, 0});
  } else {
    hits = store_->get_each(k, &rejected);
  }
  if (hits.empty() && rejected) {  // the tier logged it
    out.absent = *rejected == StoreMiss::Expired ? SessionLoad::Absent::Expired
                                                 : SessionLoad::Absent::Unusable;
    out.detail = fmt::format("its record is {}", store_miss_name(*rejected));
    return out;
  }
  if (hits.empty() && look_elsewhere) {
    // Saved under another model, build or numerics setting: never used.
    const std::vector<std::string> others = store_->elsewhere(k);
    if (!others.empty()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++c_.session_fallbacks;
      }
      out.absent = SessionLoad::Absent::OtherModel;
      out.detail = others.front();
      if (log_) log_(fmt::format("state: {}", out.why(session)));
    }
    return out;
  }
  if (hits.empty()) return out;
  // The newest usable record wins: the most saves, then the latest (ties:
  // the faster tier; RunState::generation); one that does not
  // parse is counted and logged, and used by nobody.
  const TieredStore::Hit* best_hit = nullptr;
  for (const TieredStore::Hit& hit : hits) {
    try {
      RunState s = parse_run_state(hit.payload, "session " + session);
      if (s.system_fingerprint != fingerprint_) throw InvalidArgument("another system fingerprint");
      if (!out.state || std::pair(s.generation, s.saved_ms) >
                            std::pair(out.state->generation, out.state->saved_ms)) {
        out.state = std::move(s);
        best_hit = &hit;
      }
    } catch (const InvalidArgument& e) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++c_.session_fallbacks;
      }
      if (log_)
        log_(fmt::format("state: ignoring session {} from {}: {}", session, hit.tier, e.what()));
      out.detail =
          fmt::format("its record in {} does not hold a usable session: {}", hit.tier, e.what());
    }
  }
  if (!out.state) {
    out.absent = SessionLoad::Absent::Unusable;
    return out;
  }
  out.detail.clear();
  // A newer record than a faster tier's is copied over it.
  if (!queued) promote(*best_hit, k);
  std::lock_guard<std::mutex> lock(mu_);
  ++c_.sessions_loaded;
  return out;
}

std::optional<std::string> Persistence::pending(const StoreKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Promotions (above != SIZE_MAX) only copy what a tier holds, maybe older
  // than a save behind them: only saves count.
  for (auto w = queue_.rbegin(); w != queue_.rend(); ++w) {
    if (w->above != SIZE_MAX) continue;
    for (const auto& item : w->items) {
      if (item.first == key) return item.second;
    }
  }
  if (writing_ && current_.above == SIZE_MAX) {
    for (const auto& item : current_.items) {
      if (item.first == key) return item.second;
    }
  }
  return std::nullopt;
}

void Persistence::enqueue(Write w) {
  if (w.ttl.count() == 0) w.ttl = ttl_;
  for (const auto& item : w.items) w.bytes += item.second.size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The tiers cannot keep up: the oldest KV block writes go (recomputed
    // if needed). Session records are never dropped: they are small, and a
    // lost one would let a later turn continue from an older one.
    auto old = queue_.begin();
    while (queued_bytes_ + w.bytes > kMaxQueuedBytes && old != queue_.end()) {
      if (old->session) {
        ++old;
        continue;
      }
      ++c_.write_errors;
      for (const auto& item : old->items) written_.erase(item.first.name);
      queued_bytes_ -= old->bytes;
      old = queue_.erase(old);
    }
    queued_bytes_ += w.bytes;
    queue_.push_back(std::move(w));
  }
  wake_.notify_all();
}

void Persistence::writer_main() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left to write
      current_ = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= current_.bytes;
      writing_ = true;
    }
    const Write& w = current_;
    try {
      if (w.above == SIZE_MAX) {
        store_->put_many(w.items, w.ttl);
      } else {
        store_->put_above(w.above, w.items, w.ttl);
      }
    } catch (const std::exception& e) {  // StoreError, or out of memory compressing
      // What failed is recomputed when needed; tell it (the tiers count it).
      if (log_) log_(fmt::format("state: {}", e.what()));
      std::lock_guard<std::mutex> lock(mu_);
      ++c_.write_errors;
      for (const auto& item : w.items) written_.erase(item.first.name);
    }
    // Before the write counts as done, so that flush() also waits for the
    // answers it releases. Nothing else touches current_.done.
    if (w.done) {
      try {
        w.done();
      } catch (const std::exception& e) {  // e.g. out of memory: that answer only
        if (log_) log_(fmt::format("state: after a session write: {}", e.what()));
      }
    }
    Write done;  // freed after the lock is released (it may hold many KV blocks)
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      done = std::move(current_);
      current_ = Write{};
    }
    idle_.notify_all();
  }
}

void Persistence::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

PersistCounters Persistence::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  PersistCounters c = c_;
  c.bytes_pending = static_cast<int64_t>(queued_bytes_ + (writing_ ? current_.bytes : 0));
  return c;
}

std::vector<std::pair<std::string, StoreCounters>> Persistence::tier_counters() const {
  std::vector<std::pair<std::string, StoreCounters>> v;
  for (const auto& t : store_->tiers()) v.emplace_back(std::string(t->name()), t->counters());
  return v;
}

}  // namespace encore
