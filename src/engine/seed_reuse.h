// Seed reuse (the /metrics counter encore_seed_reuse_total): a tenant that
// gives the same seed with different prompts makes its outputs predictable
// from each other, so such requests are counted (never refused).
//
// Bounded memory: per tenant the last kSeedReuseWindow distinct (seed,
// prompt) pairs it gave, the oldest dropped; at most kSeedReuseTenants
// tenants, the least recently seen one dropped. At most about 64 MiB in
// all (16 bytes a pair), allocated as tenants give seeds.
// Thread-safety: every method may be called from any thread (one mutex).
// Cost: O(kSeedReuseWindow) compares per given seed (a scan of 64 KiB).
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace encore {

inline constexpr size_t kSeedReuseWindow = 4096;  // (seed, prompt) pairs per tenant
inline constexpr size_t kSeedReuseTenants = 1024;

class SeedReuse {
 public:
  // Records that `tenant` gave `seed` with a prompt whose ids hash to
  // `prompt_hash`; true when its window holds the same seed with another
  // prompt (a reuse).
  bool given(const std::string& tenant, uint64_t seed, uint64_t prompt_hash);
  // Tenants tracked now (tests).
  size_t tenants() const;

 private:
  struct Pair {
    uint64_t seed = 0;
    uint64_t prompt = 0;
  };
  struct Window {
    std::vector<Pair> pairs;  // a ring once full: `next` is the oldest
    size_t next = 0;
    std::list<std::string>::iterator seen;  // its place in lru_
  };
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // tenants, the most recently seen first
  std::unordered_map<std::string, Window> windows_;
};

}  // namespace encore
