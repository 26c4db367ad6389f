// Paged KV cache (see include/encore/kv_cache.h).
#include "encore/kv_cache.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>

#include "encore/error.h"

namespace encore {
namespace {

constexpr std::align_val_t kAlign{64};  // cache-line aligned rows for SIMD kernels

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

size_t elem_bytes(DType t) { return t == DType::F16 ? 2 : 4; }

void validate_layout(const KvLayout& l) {
  if (l.n_layer <= 0 || l.n_kv_heads <= 0 || l.head_dim <= 0 || l.block_tokens <= 0) {
    throw InvalidArgument(fmt::format(
        "KV cache layout needs positive sizes, got n_layer={} n_kv_heads={} head_dim={} "
        "block_tokens={}",
        l.n_layer, l.n_kv_heads, l.head_dim, l.block_tokens));
  }
  if (l.elem_type != DType::F32 && l.elem_type != DType::F16) {
    throw InvalidArgument(fmt::format("KV cache element type {} is not supported (F32 or F16)",
                                      dtype_name(l.elem_type)));
  }
}

}  // namespace

BlockHash prefix_root(std::string_view system_fingerprint, std::string_view tenant) {
  // Length-prefixed fields: ("ab", "c") and ("a", "bc") must not collide.
  std::string bytes = "encore-prefix-v1";
  for (std::string_view field : {system_fingerprint, tenant}) {
    const uint64_t n = field.size();
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(n >> (8 * i)));
    bytes.append(field);
  }
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return BlockHash{h.low64, h.high64};
}

BlockHash block_hash(const BlockHash& parent, std::span<const int32_t> tokens) {
  std::vector<uint8_t> bytes;  // parent lo, hi, then each id, all little-endian
  bytes.reserve(16 + 4 * tokens.size());
  for (uint64_t w : {parent.lo, parent.hi}) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(w >> (8 * i)));
  }
  for (int32_t id : tokens) {
    const auto u = static_cast<uint32_t>(id);
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(u >> (8 * i)));
  }
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return BlockHash{h.low64, h.high64};
}

size_t KvLayout::block_bytes() const {
  return static_cast<size_t>(n_layer) * 2 * static_cast<size_t>(block_tokens) *
         static_cast<size_t>(row_elems()) * elem_bytes(elem_type);
}

uint64_t kv_bytes_for_tokens(const KvLayout& layout, int64_t n_tokens) {
  if (n_tokens <= 0 || layout.block_tokens <= 0) return 0;
  const uint64_t blocks =
      static_cast<uint64_t>((n_tokens + layout.block_tokens - 1) / layout.block_tokens);
  return blocks * layout.block_bytes();
}

void KvBlockPool::AlignedFree::operator()(uint8_t* p) const { ::operator delete[](p, kAlign); }

KvBlockPool::KvBlockPool(const KvLayout& layout, uint64_t budget_bytes) : layout_(layout) {
  validate_layout(layout);
  block_bytes_ = layout.block_bytes();
  const uint64_t fit = budget_bytes / block_bytes_;
  if (fit == 0) {
    throw InvalidArgument(fmt::format(
        "KV cache budget of {} bytes ({:.2f} MiB) cannot hold one block of {} tokens "
        "({} bytes: {} layers x K+V x {} tokens x {} KV heads x {} dims x {} bytes); "
        "raise the KV cache budget",
        budget_bytes, mib(budget_bytes), layout.block_tokens, block_bytes_, layout.n_layer,
        layout.block_tokens, layout.n_kv_heads, layout.head_dim, elem_bytes(layout.elem_type)));
  }
  n_blocks_ = static_cast<int32_t>(
      std::min<uint64_t>(fit, static_cast<uint64_t>(std::numeric_limits<int32_t>::max())));
  const uint64_t total = static_cast<uint64_t>(n_blocks_) * block_bytes_;
  try {
    // Deliberately not value-initialised: untouched pages are never committed.
    data_.reset(static_cast<uint8_t*>(::operator new[](total, kAlign)));
  } catch (const std::bad_alloc&) {
    throw ResourceExhausted(fmt::format(
        "could not allocate {:.1f} MiB for the KV cache ({} blocks); lower the KV cache budget "
        "or the context size",
        mib(total), n_blocks_));
  }
  refcounts_.assign(static_cast<size_t>(n_blocks_), 0);
  free_.reserve(static_cast<size_t>(n_blocks_));
  // Pushed in reverse so that a fresh pool hands out 0, 1, 2, ...
  for (int32_t b = n_blocks_ - 1; b >= 0; --b) free_.push_back(b);
}

KvBlockPool::~KvBlockPool() = default;

void KvBlockPool::check_id(int32_t block, const char* what) const {
  if (block < 0 || block >= n_blocks_) {
    throw std::logic_error(
        fmt::format("KvBlockPool::{}: block id {} outside [0, {})", what, block, n_blocks_));
  }
}

int32_t KvBlockPool::allocate() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {  // evict the least recently released cached block
    b = lru_.front();
    lru_.pop_front();
    const auto it = entries_.find(b);
    assert(it != entries_.end());
    by_hash_.erase(it->second.key.hash);
    entries_.erase(it);
    ++evictions_;
  } else {
    throw ResourceExhausted(
        fmt::format("KV cache full: all {} blocks ({:.1f} MiB) in use; raise the KV cache budget "
                    "or lower the context size",
                    n_blocks_, mib(static_cast<uint64_t>(n_blocks_) * block_bytes_)));
  }
  refcounts_[static_cast<size_t>(b)] = 1;
  return b;
}

void KvBlockPool::retain(int32_t block) {
  check_id(block, "retain");
  int32_t& rc = refcounts_[static_cast<size_t>(block)];
  if (rc <= 0) {
    throw std::logic_error(fmt::format("KvBlockPool::retain: block {} is not allocated", block));
  }
  ++rc;
}

void KvBlockPool::release(int32_t block) {
  check_id(block, "release");
  int32_t& rc = refcounts_[static_cast<size_t>(block)];
  if (rc <= 0) {
    throw std::logic_error(
        fmt::format("KvBlockPool::release: block {} is not allocated (double release?)", block));
  }
  if (--rc > 0) return;
  const auto it = entries_.find(block);
  if (it == entries_.end()) {
    free_.push_back(block);
  } else {
    it->second.lru = lru_.insert(lru_.end(), block);
  }
}

void KvBlockPool::publish(int32_t block, const BlockKey& key, std::span<const int32_t> tokens) {
  check_id(block, "publish");
  if (refcounts_[static_cast<size_t>(block)] <= 0) {
    throw std::logic_error(fmt::format("KvBlockPool::publish: block {} is not allocated", block));
  }
  if (tokens.size() != static_cast<size_t>(layout_.block_tokens)) {
    throw std::logic_error(fmt::format("KvBlockPool::publish: {} tokens for a block of {}",
                                       tokens.size(), layout_.block_tokens));
  }
  if (entries_.count(block) != 0 || by_hash_.count(key.hash) != 0) return;
  by_hash_.emplace(key.hash, block);
  entries_.emplace(block,
                   Entry{key, std::vector<int32_t>(tokens.begin(), tokens.end()), lru_.end()});
}

int32_t KvBlockPool::lookup(const BlockKey& key, std::span<const int32_t> tokens) {
  const auto h = by_hash_.find(key.hash);
  if (h == by_hash_.end()) return -1;
  const int32_t block = h->second;
  Entry& e = entries_.at(block);
  if (!(e.key == key) ||
      !std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end())) {
    return -1;  // a hash collision: not the same prefix
  }
  int32_t& rc = refcounts_[static_cast<size_t>(block)];
  if (rc == 0) {  // evictable: back in use
    lru_.erase(e.lru);
    e.lru = lru_.end();
  }
  ++rc;
  return block;
}

int32_t KvBlockPool::refcount(int32_t block) const {
  check_id(block, "refcount");
  return refcounts_[static_cast<size_t>(block)];
}

void KvBlockPool::copy_block(int32_t from, int32_t to) {
  if (refcount(from) <= 0 || refcount(to) <= 0) {
    throw std::logic_error(
        fmt::format("KvBlockPool::copy_block: block {} or {} is not allocated", from, to));
  }
  if (published(to)) {
    throw std::logic_error(
        fmt::format("KvBlockPool::copy_block: block {} is in the prefix cache", to));
  }
  if (from == to) return;
  std::memcpy(data_.get() + static_cast<size_t>(to) * block_bytes_,
              data_.get() + static_cast<size_t>(from) * block_bytes_, block_bytes_);
}

std::span<const uint8_t> KvBlockPool::block_data(int32_t block) const {
  check_id(block, "block_data");
  return {data_.get() + static_cast<size_t>(block) * block_bytes_, block_bytes_};
}

std::span<uint8_t> KvBlockPool::writable_block_data(int32_t block) {
  if (refcount(block) != 1 || published(block)) {
    throw std::logic_error(fmt::format(
        "KvBlockPool::writable_block_data: block {} is shared, free or published", block));
  }
  return {data_.get() + static_cast<size_t>(block) * block_bytes_, block_bytes_};
}

uint8_t* KvBlockPool::layer_base(int32_t block, int layer) const {
  check_id(block, "k/v");
  assert(layer >= 0 && layer < layout_.n_layer);
  const size_t plane = static_cast<size_t>(layout_.block_tokens) *
                       static_cast<size_t>(layout_.row_elems()) * elem_bytes(layout_.elem_type);
  return data_.get() + static_cast<size_t>(block) * block_bytes_ +
         static_cast<size_t>(layer) * 2 * plane;
}

uint8_t* KvBlockPool::k(int32_t block, int layer) { return layer_base(block, layer); }

uint8_t* KvBlockPool::v(int32_t block, int layer) { return k(block, layer) + plane_bytes(); }

const uint8_t* KvBlockPool::k(int32_t block, int layer) const { return layer_base(block, layer); }

const uint8_t* KvBlockPool::v(int32_t block, int layer) const {
  return k(block, layer) + plane_bytes();
}

size_t KvBlockPool::plane_bytes() const {
  return static_cast<size_t>(layout_.block_tokens) * static_cast<size_t>(layout_.row_elems()) *
         elem_bytes(layout_.elem_type);
}

void KvSequence::reserve(KvBlockPool& pool, int32_t new_total_tokens) {
  const int64_t bt = pool.layout().block_tokens;
  const size_t need = static_cast<size_t>((static_cast<int64_t>(new_total_tokens) + bt - 1) / bt);
  const size_t had = blocks.size();
  if (need <= had) return;
  blocks.reserve(need);  // so push_back below cannot throw and leak a block
  try {
    while (blocks.size() < need) blocks.push_back(pool.allocate());
  } catch (...) {
    while (blocks.size() > had) {
      pool.release(blocks.back());
      blocks.pop_back();
    }
    throw;
  }
}

void KvSequence::release(KvBlockPool& pool) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) pool.release(*it);
  blocks.clear();
  n_tokens = 0;
}

KvSequence KvSequence::fork(KvBlockPool& pool) const {
  const int32_t bt = pool.layout().block_tokens;
  const size_t used = static_cast<size_t>((n_tokens + bt - 1) / bt);
  assert(used <= blocks.size());
  const bool partial = n_tokens % bt != 0;
  KvSequence out;
  out.blocks.reserve(used);
  if (partial) {  // allocate first: on failure nothing has been retained
    const int32_t fresh = pool.allocate();
    pool.copy_block(blocks[used - 1], fresh);
    for (size_t i = 0; i + 1 < used; ++i) {
      pool.retain(blocks[i]);
      out.blocks.push_back(blocks[i]);
    }
    out.blocks.push_back(fresh);
  } else {
    for (size_t i = 0; i < used; ++i) {
      pool.retain(blocks[i]);
      out.blocks.push_back(blocks[i]);
    }
  }
  out.n_tokens = n_tokens;
  return out;
}

int64_t KvSequence::capacity(const KvBlockPool& pool) const {
  return static_cast<int64_t>(blocks.size()) * pool.layout().block_tokens;
}

KvSequence::Slot KvSequence::slot(int32_t pos, int block_tokens) const {
  assert(pos >= 0 && static_cast<size_t>(pos / block_tokens) < blocks.size());
  return Slot{blocks[static_cast<size_t>(pos / block_tokens)], pos % block_tokens};
}

}  // namespace encore
