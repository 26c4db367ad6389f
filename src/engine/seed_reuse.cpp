#include "engine/seed_reuse.h"

namespace encore {

bool SeedReuse::given(const std::string& tenant, uint64_t seed, uint64_t prompt_hash) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = windows_.find(tenant);
  if (it == windows_.end()) {
    if (windows_.size() >= kSeedReuseTenants) {  // forget the least recently seen tenant
      windows_.erase(lru_.back());
      lru_.pop_back();
    }
    lru_.push_front(tenant);
    it = windows_.emplace(tenant, Window{}).first;
    it->second.seen = lru_.begin();
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.seen);
  }
  Window& w = it->second;
  bool reused = false;
  bool known = false;  // this very pair is in the window already
  for (const Pair& p : w.pairs) {
    if (p.seed != seed) continue;
    if (p.prompt == prompt_hash) {
      known = true;
    } else {
      reused = true;
    }
  }
  // A retried request (same seed, same prompt) takes no second place, so it
  // cannot push other pairs out of the window.
  if (!known) {
    if (w.pairs.size() < kSeedReuseWindow) {
      w.pairs.push_back({seed, prompt_hash});
    } else {
      w.pairs[w.next] = {seed, prompt_hash};
      w.next = (w.next + 1) % kSeedReuseWindow;
    }
  }
  return reused;
}

size_t SeedReuse::tenants() const {
  std::lock_guard<std::mutex> lock(mu_);
  return windows_.size();
}

}  // namespace encore
