// The tier-independent parts of store.h: miss names, TieredStore, the
// default state directory.
#include "encore/store.h"
#include "util/text.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <exception>

namespace encore {

const char* store_miss_name(StoreMiss m) {
  // In the order of StoreMiss (as StoreCounters::rejected and the metrics
  // count them).
  static constexpr const char* kNames[kStoreMissReasons] = {
      "truncated", "corrupt", "version", "fingerprint", "tenant", "key", "expired", "too_large"};
  const auto k = static_cast<int>(m);
  return k >= 0 && k < kStoreMissReasons ? kNames[k] : "?";
}

void StoreTier::put_many(const std::vector<std::pair<StoreKey, std::string>>& items,
                         std::chrono::milliseconds ttl) {
  std::exception_ptr first;
  for (const auto& [key, payload] : items) {
    try {
      put(key, payload, ttl);
    } catch (const StoreError&) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

std::string tenant_tag(std::string_view tenant) {
  return fmt::format("{:016x}", XXH3_64bits(tenant.data(), tenant.size()));
}

std::string default_state_dir() { return util::cache_dir(); }

TieredStore::TieredStore(std::vector<std::unique_ptr<StoreTier>> tiers)
    : tiers_(std::move(tiers)) {}

std::optional<TieredStore::Hit> TieredStore::get_from(size_t t, const StoreKey& key,
                                                      std::optional<StoreMiss>* rejected) {
  uint64_t expires = 0;
  std::optional<StoreMiss> why;
  std::optional<std::string> payload = tiers_[t]->get(key, &expires, &why);
  if (why && rejected) *rejected = why;
  if (!payload) return std::nullopt;
  return Hit{std::move(*payload), std::string(tiers_[t]->name()), t, expires};
}

std::optional<TieredStore::Hit> TieredStore::get(const StoreKey& key,
                                                 std::optional<StoreMiss>* rejected) {
  if (rejected) rejected->reset();
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (std::optional<Hit> hit = get_from(t, key, rejected)) {
      if (rejected) rejected->reset();
      return hit;
    }
  }
  return std::nullopt;
}

std::vector<TieredStore::Hit> TieredStore::get_each(const StoreKey& key,
                                                    std::optional<StoreMiss>* rejected) {
  if (rejected) rejected->reset();
  std::vector<Hit> hits;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (std::optional<Hit> hit = get_from(t, key, rejected)) hits.push_back(std::move(*hit));
  }
  if (!hits.empty() && rejected) rejected->reset();
  return hits;
}

void TieredStore::put_above(size_t tier_index,
                            const std::vector<std::pair<StoreKey, std::string>>& items,
                            std::chrono::milliseconds ttl) {
  std::exception_ptr first;
  for (size_t t = 0; t < tier_index && t < tiers_.size(); ++t) {
    try {
      tiers_[t]->put_many(items, ttl);
    } catch (const StoreError&) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void TieredStore::put(const StoreKey& key, std::string_view payload,
                      std::chrono::milliseconds ttl) {
  put_many({{key, std::string(payload)}}, ttl);
}

void TieredStore::put_many(const std::vector<std::pair<StoreKey, std::string>>& items,
                           std::chrono::milliseconds ttl) {
  std::exception_ptr first;
  for (const auto& tier : tiers_) {
    try {
      tier->put_many(items, ttl);
    } catch (const StoreError&) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

std::vector<std::string> TieredStore::elsewhere(const StoreKey& key) {
  std::vector<std::string> all;
  for (const auto& tier : tiers_) {
    for (std::string& fp : tier->elsewhere(key)) {
      if (std::find(all.begin(), all.end(), fp) == all.end()) all.push_back(std::move(fp));
    }
  }
  return all;
}

bool TieredStore::remove(const StoreKey& key) {
  bool any = false;
  for (const auto& tier : tiers_) any = tier->remove(key) || any;
  return any;
}

}  // namespace encore
