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
#include <memory>
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
  int32_t n_free() const { return static_cast<int32_t>(free_.size()); }

  // Takes a free block (refcount becomes 1). Freed blocks are reused most
  // recently freed first; a fresh pool hands out 0, 1, 2, ... Contents are
  // unspecified. Throws ResourceExhausted when no block is free.
  int32_t allocate();
  // Adds a reference to an allocated block (prefix sharing).
  void retain(int32_t block);
  // Drops a reference; at 0 the block goes back to the free list.
  void release(int32_t block);
  // Current reference count (0 = free).
  int32_t refcount(int32_t block) const;
  // Copies the whole contents of block `from` into block `to` (both
  // allocated; std::logic_error otherwise). Cost: one block_bytes() memcpy.
  void copy_block(int32_t from, int32_t to);

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
  // Releases every block reference and empties the sequence.
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
