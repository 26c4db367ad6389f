// Paged KV cache: a pool of fixed-size blocks and per-sequence block tables.
//
// A block holds the keys and values of `block_tokens` consecutive positions
// for every layer. Sequences own lists of block ids (KvSequence::blocks), so
// memory is committed per 16 tokens instead of per context, and blocks are
// reference counted so that sequences can share a common prefix (fork()
// copies a partially filled last block instead of sharing it).
//
// Block memory layout (block_bytes() bytes per block):
//   for layer in [0, n_layer): K [block_tokens, n_kv_heads * head_dim]
//                              V [block_tokens, n_kv_heads * head_dim]
// Entries are F32 or F16 (`elem_type`; F16 halves the memory, like
// llama.cpp's default). The element type is part of the numerics: the same
// tokens give different logits under F32 and F16 KV, identical ones under
// either setting every time.
//
// Prefix cache: a full block (all block_tokens positions written) can be
// published under a content key, the hash chain value of its tokens and of
// everything before them (BlockKey). A later sequence with the same prefix
// looks the key up and shares the block instead of recomputing it. A hit is
// verified, not trusted: the entry's tokens, parent hash and root (system
// fingerprint and tenant) must equal the asker's. When the last reference to
// a published block goes, the block stays cached (evictable); allocate()
// takes never-used and freed blocks first and evicts cached ones only when
// there are none, least recently released first.
//
// Ownership: a KvBlockPool owns one allocation of n_blocks() blocks, made once
// in the constructor (pages are touched only when blocks are first written).
// KvSequence only holds block ids; it must be release()d into the pool that
// filled it (its destructor does not do that, it has no pool pointer).
// Thread-safety: none. A pool and its sequences belong to one owner thread
// (the thread that runs the forward pass); the forward pass may read and
// write block *contents* from its worker threads, but allocate/retain/release
// must not run concurrently with anything else on the same pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "encore/dtype.h"

namespace encore {

struct KvLayout {
  int n_layer = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 16;
  DType elem_type = DType::F32;  // F32 or F16

  // Elements per token per layer for K (and for V): n_kv_heads * head_dim.
  int64_t row_elems() const { return static_cast<int64_t>(n_kv_heads) * head_dim; }
  // Bytes of one block: K and V of block_tokens tokens for every layer.
  size_t block_bytes() const;
};

// Bytes of the blocks needed to hold n_tokens tokens of one sequence
// (n_tokens rounded up to whole blocks). Use it to size a pool for a context size.
uint64_t kv_bytes_for_tokens(const KvLayout& layout, int64_t n_tokens);
// Blocks of block_tokens positions needed for n_tokens positions.
inline int64_t kv_blocks_for_tokens(int64_t n_tokens, int64_t block_tokens) {
  return (n_tokens + block_tokens - 1) / block_tokens;
}

// A 128-bit content hash (XXH3-128).
struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const BlockHash&) const = default;
};

// The root of a hash chain: XXH3-128 of the system fingerprint (model, build,
// KV type and other numerics) and the tenant. Requests of different tenants
// or numerics never meet in the cache.
BlockHash prefix_root(std::string_view system_fingerprint, std::string_view tenant);
// The hash of a full block: XXH3-128 of the parent's hash (the root for the
// first block) and the block's token ids as little-endian int32.
BlockHash block_hash(const BlockHash& parent, std::span<const int32_t> tokens);

// What a cached block is found by and verified against.
struct BlockKey {
  BlockHash hash;    // block_hash(parent, tokens)
  BlockHash parent;  // the previous block's hash, or root
  BlockHash root;    // prefix_root(...)
  bool operator==(const BlockKey&) const = default;
};

class KvBlockPool {
 public:
  // Sizes the pool to floor(budget_bytes / layout.block_bytes()) blocks
  // (capped at INT32_MAX) and allocates them in one piece.
  // Throws InvalidArgument for an invalid layout (non-positive sizes, an
  // element type other than F32/F16) or when the budget cannot hold one block.
  KvBlockPool(const KvLayout& layout, uint64_t budget_bytes);
  ~KvBlockPool();
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  int32_t n_blocks() const { return n_blocks_; }
  // Blocks allocate() can hand out: unused ones plus evictable cached ones.
  int32_t n_free() const { return static_cast<int32_t>(free_.size() + lru_.size()); }
  // Blocks with no reference and no cached content.
  int32_t n_unused() const { return static_cast<int32_t>(free_.size()); }
  // Published blocks nobody references (evictable).
  int32_t n_evictable() const { return static_cast<int32_t>(lru_.size()); }
  // Blocks referenced by at least one sequence.
  int32_t n_used() const { return n_blocks_ - n_free(); }
  // Published blocks, referenced or not.
  int32_t n_cached() const { return static_cast<int32_t>(entries_.size()); }
  // Whether `block` is published (its contents must never change again).
  bool published(int32_t block) const { return entries_.count(block) != 0; }
  // Cached blocks allocate() has taken back so far.
  int64_t evictions() const { return evictions_; }

  // Takes a block (refcount becomes 1): an unused one if there is one (freed
  // blocks are reused most recently freed first; a fresh pool hands out 0, 1,
  // 2, ...), else the least recently released cached block, whose entry is
  // dropped. Contents are unspecified. Throws ResourceExhausted when every
  // block is referenced.
  int32_t allocate();
  // Adds a reference to an allocated block (prefix sharing).
  void retain(int32_t block);
  // Drops a reference; at 0 the block goes back to the free list, or, if it
  // is published, stays cached (evictable).
  void release(int32_t block);

  // Publishes `block` (referenced; all its positions written and never to be
  // written again) as holding `tokens` ([block_tokens]) after the prefix
  // key.parent. Does nothing if the block is already published or another
  // block holds key.hash. Cost: two hash-map inserts.
  void publish(int32_t block, const BlockKey& key, std::span<const int32_t> tokens);
  // The cached block with key.hash whose tokens, parent and root equal the
  // asker's (a hash is not a proof), retained (an evictable block comes back
  // into use); -1 when there is none. Cost: one hash-map lookup and a
  // block_tokens compare.
  int32_t lookup(const BlockKey& key, std::span<const int32_t> tokens);
  // Current reference count (0 = free).
  int32_t refcount(int32_t block) const;
  // Copies the whole contents of block `from` into block `to` (both
  // allocated; std::logic_error otherwise). Cost: one block_bytes() memcpy.
  void copy_block(int32_t from, int32_t to);

  // The whole of `block` ([block_bytes()]: every layer's K and V): what a
  // snapshot stores and restores. Writing is only for a block that is
  // allocated, referenced once and not published (std::logic_error otherwise).
  std::span<const uint8_t> block_data(int32_t block) const;
  std::span<uint8_t> writable_block_data(int32_t block);

  // Keys / values of `layer` in `block`: [block_tokens, n_kv_heads * head_dim]
  // elements of layout().elem_type (the pool is 64-byte aligned; blocks and
  // planes start wherever their sizes put them).
  // retain/release/refcount/k/v throw std::logic_error for an id outside
  // [0, n_blocks()) or, for retain/release, a block that is not allocated:
  // those are programmer errors, but silently corrupting the cache is worse.
  uint8_t* k(int32_t block, int layer);
  uint8_t* v(int32_t block, int layer);
  const uint8_t* k(int32_t block, int layer) const;
  const uint8_t* v(int32_t block, int layer) const;

 private:
  void check_id(int32_t block, const char* what) const;
  uint8_t* layer_base(int32_t block, int layer) const;
  size_t plane_bytes() const;  // bytes of one layer's K (or V) in a block

  KvLayout layout_;
  size_t block_bytes_ = 0;
  int32_t n_blocks_ = 0;
  struct AlignedFree {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t[], AlignedFree> data_;  // [n_blocks, block_bytes]
  std::vector<int32_t> refcounts_;                // [n_blocks]
  std::vector<int32_t> free_;                     // stack of free ids, top = back()

  // Prefix cache. Only published blocks have an entry.
  struct BlockHashFn {
    size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ h.hi); }
  };
  struct Entry {
    BlockKey key;
    std::vector<int32_t> tokens;       // [block_tokens]
    std::list<int32_t>::iterator lru;  // into lru_ while evictable, else lru_.end()
  };
  std::unordered_map<int32_t, Entry> entries_;                   // block id -> entry
  std::unordered_map<BlockHash, int32_t, BlockHashFn> by_hash_;  // key.hash -> block id
  std::list<int32_t> lru_;  // evictable published blocks, least recently released first
  int64_t evictions_ = 0;
};

// One sequence's block table: position p lives in blocks[p / block_tokens]
// at row p % block_tokens. Plain data plus helpers; see the ownership note
// at the top of this file.
struct KvSequence {
  std::vector<int32_t> blocks;  // [ceil(capacity / block_tokens)] block ids
  int32_t n_tokens = 0;         // positions [0, n_tokens) hold valid K/V

  struct Slot {
    int32_t block;   // block id in the pool
    int32_t offset;  // row inside the block
  };

  // Makes sure blocks cover positions [0, new_total_tokens), allocating
  // blocks as needed; n_tokens is not changed (the forward pass advances it
  // after writing). On ResourceExhausted the blocks allocated by this call
  // are released again, leaving the sequence as it was.
  void reserve(KvBlockPool& pool, int32_t new_total_tokens);
  // Releases every block reference and empties the sequence, last block
  // first: cached blocks of a chain then age from the leaf, so the pool
  // evicts a chain's end before its start (a block is only ever found
  // through the blocks before it).
  void release(KvBlockPool& pool);
  // A second sequence with the same n_tokens positions (n samples of one
  // prompt): the full blocks are shared (retained), a partially filled last
  // block is copied into a fresh block, since the fork writes its next
  // positions there and a block with refcount > 1 is never written.
  // Throws ResourceExhausted (retaining nothing) when no block is free.
  KvSequence fork(KvBlockPool& pool) const;
  // Tokens the current blocks can hold.
  int64_t capacity(const KvBlockPool& pool) const;
  // Where position `pos` lives (pos must be < capacity; asserted).
  Slot slot(int32_t pos, int block_tokens) const;
};

}  // namespace encore
