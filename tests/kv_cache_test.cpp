// Paged KV cache: sizing from a budget, exhaustion, reference counts, reuse.
#include "encore/kv_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "encore/error.h"

namespace encore {
namespace {

KvLayout small_layout() {
  KvLayout l;
  l.n_layer = 2;
  l.n_kv_heads = 3;
  l.head_dim = 4;
  l.block_tokens = 16;
  return l;
}

TEST(KvCache, BlockBytesAndBytesForTokens) {
  const KvLayout l = small_layout();
  EXPECT_EQ(l.row_elems(), 12);
  EXPECT_EQ(l.block_bytes(), 2u * 2 * 16 * 12 * 4);  // layers x (K,V) x tokens x row x f32
  EXPECT_EQ(kv_bytes_for_tokens(l, 0), 0u);
  EXPECT_EQ(kv_bytes_for_tokens(l, 1), l.block_bytes());
  EXPECT_EQ(kv_bytes_for_tokens(l, 16), l.block_bytes());
  EXPECT_EQ(kv_bytes_for_tokens(l, 17), 2 * l.block_bytes());
  EXPECT_EQ(kv_bytes_for_tokens(l, 512), 32 * l.block_bytes());
}

TEST(KvCache, BudgetDeterminesBlockCount) {
  const KvLayout l = small_layout();
  EXPECT_EQ(KvBlockPool(l, l.block_bytes()).n_blocks(), 1);
  EXPECT_EQ(KvBlockPool(l, 10 * l.block_bytes() + l.block_bytes() - 1).n_blocks(), 10);
  KvBlockPool pool(l, kv_bytes_for_tokens(l, 512));
  EXPECT_EQ(pool.n_blocks(), 32);
  EXPECT_EQ(pool.n_free(), 32);
}

TEST(KvCache, TooSmallBudgetOrBadLayoutIsInvalidArgument) {
  const KvLayout l = small_layout();
  try {
    KvBlockPool pool(l, l.block_bytes() - 1);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(l.block_bytes() - 1)), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(l.block_bytes())), std::string::npos) << msg;
  }
  KvLayout bad = l;
  bad.head_dim = 0;
  EXPECT_THROW(KvBlockPool(bad, 1 << 20), InvalidArgument);
  bad = l;
  bad.elem_type = DType::Q8_0;
  EXPECT_THROW(KvBlockPool(bad, 1 << 20), InvalidArgument);
}

TEST(KvCache, ExhaustionSaysHowManyBlocksAndWhatToDo) {
  const KvLayout l = small_layout();
  KvBlockPool pool(l, 3 * l.block_bytes());
  EXPECT_EQ(pool.allocate(), 0);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_EQ(pool.n_free(), 0);
  try {
    pool.allocate();
    FAIL() << "expected ResourceExhausted";
  } catch (const ResourceExhausted& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("KV cache full: all 3 blocks"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("raise the KV cache budget"), std::string::npos) << msg;
  }
}

TEST(KvCache, RefcountsAndReuseOfFreedBlocks) {
  const KvLayout l = small_layout();
  KvBlockPool pool(l, 4 * l.block_bytes());
  const int32_t a = pool.allocate();
  const int32_t b = pool.allocate();
  EXPECT_EQ(pool.refcount(a), 1);
  pool.retain(a);
  EXPECT_EQ(pool.refcount(a), 2);
  pool.release(a);
  EXPECT_EQ(pool.refcount(a), 1);
  EXPECT_EQ(pool.n_free(), 2);
  pool.release(a);
  EXPECT_EQ(pool.refcount(a), 0);
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_EQ(pool.allocate(), a);  // most recently freed first
  EXPECT_EQ(pool.refcount(b), 1);

  EXPECT_THROW(pool.release(3), std::logic_error);  // never allocated
  EXPECT_THROW(pool.retain(3), std::logic_error);
  EXPECT_THROW(pool.refcount(4), std::logic_error);
  EXPECT_THROW(pool.refcount(-1), std::logic_error);
}

TEST(KvCache, BlocksAreDisjointAndLayersDoNotOverlap) {
  const KvLayout l = small_layout();
  KvBlockPool pool(l, 3 * l.block_bytes());
  const int64_t plane = l.block_tokens * l.row_elems();  // floats of K (or V) of one layer
  std::set<const uint8_t*> starts;
  for (int32_t b = 0; b < 3; ++b) {
    for (int layer = 0; layer < l.n_layer; ++layer) {
      EXPECT_EQ(pool.v(b, layer), pool.k(b, layer) + plane * sizeof(float));
      starts.insert(pool.k(b, layer));
      starts.insert(pool.v(b, layer));
      for (int64_t i = 0; i < plane; ++i) {
        reinterpret_cast<float*>(pool.k(b, layer))[i] =
            static_cast<float>(b * 100 + layer * 10 + 1);
        reinterpret_cast<float*>(pool.v(b, layer))[i] =
            static_cast<float>(b * 100 + layer * 10 + 2);
      }
    }
  }
  EXPECT_EQ(starts.size(), 3u * 2 * 2);
  for (int32_t b = 0; b < 3; ++b) {
    for (int layer = 0; layer < l.n_layer; ++layer) {
      EXPECT_EQ(reinterpret_cast<float*>(pool.k(b, layer))[0], b * 100 + layer * 10 + 1);
      EXPECT_EQ(reinterpret_cast<float*>(pool.v(b, layer))[plane - 1], b * 100 + layer * 10 + 2);
    }
  }
}

TEST(KvCache, SequenceReserveReleaseAndSlots) {
  const KvLayout l = small_layout();
  KvBlockPool pool(l, 5 * l.block_bytes());
  KvSequence seq;
  seq.reserve(pool, 1);
  EXPECT_EQ(seq.blocks.size(), 1u);
  EXPECT_EQ(seq.n_tokens, 0);  // reserve does not advance n_tokens
  seq.reserve(pool, 16);
  EXPECT_EQ(seq.blocks.size(), 1u);
  seq.reserve(pool, 40);
  EXPECT_EQ(seq.blocks.size(), 3u);
  EXPECT_EQ(seq.capacity(pool), 48);
  EXPECT_EQ(pool.n_free(), 2);
  seq.reserve(pool, 10);  // never shrinks
  EXPECT_EQ(seq.blocks.size(), 3u);

  const KvSequence::Slot s = seq.slot(33, l.block_tokens);
  EXPECT_EQ(s.block, seq.blocks[2]);
  EXPECT_EQ(s.offset, 1);
  EXPECT_EQ(seq.slot(15, l.block_tokens).offset, 15);
  EXPECT_EQ(seq.slot(16, l.block_tokens).block, seq.blocks[1]);

  // Exhaustion leaves the sequence and the pool as they were.
  seq.n_tokens = 40;
  EXPECT_THROW(seq.reserve(pool, 200), ResourceExhausted);
  EXPECT_EQ(seq.blocks.size(), 3u);
  EXPECT_EQ(pool.n_free(), 2);

  // A second sequence sharing the first one's first block (prefix sharing).
  KvSequence other;
  other.blocks.push_back(seq.blocks[0]);
  pool.retain(seq.blocks[0]);
  other.n_tokens = 16;
  seq.release(pool);
  EXPECT_TRUE(seq.blocks.empty());
  EXPECT_EQ(seq.n_tokens, 0);
  EXPECT_EQ(pool.n_free(), 4);  // the shared block is still held by `other`
  EXPECT_EQ(pool.refcount(other.blocks[0]), 1);
  other.release(pool);
  EXPECT_EQ(pool.n_free(), 5);
}

// Fills every K and V byte of `block` with a pattern that depends on `tag`.
void fill_block(KvBlockPool& pool, int32_t block, uint8_t tag) {
  const size_t plane =
      pool.layout().block_bytes() / (2 * static_cast<size_t>(pool.layout().n_layer));
  for (int layer = 0; layer < pool.layout().n_layer; ++layer) {
    for (size_t i = 0; i < plane; ++i) {
      pool.k(block, layer)[i] = static_cast<uint8_t>(tag + 3 * layer + i);
      pool.v(block, layer)[i] = static_cast<uint8_t>(tag + 7 * layer + 2 * i + 1);
    }
  }
}

bool same_bytes(const KvBlockPool& pool, int32_t a, int32_t b) {
  const size_t plane =
      pool.layout().block_bytes() / (2 * static_cast<size_t>(pool.layout().n_layer));
  for (int layer = 0; layer < pool.layout().n_layer; ++layer) {
    if (std::memcmp(pool.k(a, layer), pool.k(b, layer), plane) != 0) return false;
    if (std::memcmp(pool.v(a, layer), pool.v(b, layer), plane) != 0) return false;
  }
  return true;
}

TEST(KvCache, ForkSharesFullBlocks) {
  const KvLayout l = small_layout();
  KvBlockPool pool(l, 6 * l.block_bytes());
  KvSequence seq;
  seq.reserve(pool, 32);
  seq.n_tokens = 32;  // two full blocks
  const KvSequence f = seq.fork(pool);
  EXPECT_EQ(f.n_tokens, 32);
  EXPECT_EQ(f.blocks, seq.blocks);
  for (int32_t b : seq.blocks) EXPECT_EQ(pool.refcount(b), 2);
  EXPECT_EQ(pool.n_free(), 4);  // nothing allocated

  // Blocks reserved past n_tokens are not part of the fork.
  KvSequence roomy;
  roomy.reserve(pool, 64);  // four blocks, only the first one used
  roomy.n_tokens = 16;
  const KvSequence g = roomy.fork(pool);
  ASSERT_EQ(g.blocks.size(), 1u);
  EXPECT_EQ(g.blocks[0], roomy.blocks[0]);
  EXPECT_EQ(g.capacity(pool), 16);
  EXPECT_EQ(pool.refcount(roomy.blocks[0]), 2);
  EXPECT_EQ(pool.refcount(roomy.blocks[1]), 1);
  EXPECT_EQ(pool.n_free(), 0);

  // With no block free, a fork that copies nothing still succeeds.
  const KvSequence h = seq.fork(pool);
  for (int32_t b : seq.blocks) EXPECT_EQ(pool.refcount(b), 3);

  // An empty sequence forks into an empty one.
  const KvSequence e = KvSequence{}.fork(pool);
  EXPECT_TRUE(e.blocks.empty());
  EXPECT_EQ(e.n_tokens, 0);
}

TEST(KvCache, ForkCopiesAPartialLastBlock) {
  const KvLayout l = small_layout();
  KvBlockPool pool(l, 5 * l.block_bytes());
  KvSequence seq;
  seq.reserve(pool, 40);
  seq.n_tokens = 40;  // blocks 0, 1 full; block 2 holds 8 of 16 positions
  for (size_t i = 0; i < seq.blocks.size(); ++i) {
    fill_block(pool, seq.blocks[i], static_cast<uint8_t>(10 * i + 1));
  }
  KvSequence f = seq.fork(pool);
  EXPECT_EQ(f.n_tokens, 40);
  ASSERT_EQ(f.blocks.size(), 3u);
  EXPECT_EQ(f.blocks[0], seq.blocks[0]);
  EXPECT_EQ(f.blocks[1], seq.blocks[1]);
  EXPECT_EQ(pool.refcount(seq.blocks[0]), 2);
  EXPECT_EQ(pool.refcount(seq.blocks[1]), 2);
  // The partial block: a new id with the same bytes, each copy owned once.
  EXPECT_NE(f.blocks[2], seq.blocks[2]);
  EXPECT_EQ(pool.refcount(f.blocks[2]), 1);
  EXPECT_EQ(pool.refcount(seq.blocks[2]), 1);
  EXPECT_TRUE(same_bytes(pool, f.blocks[2], seq.blocks[2]));
  EXPECT_EQ(pool.n_free(), 1);
  // Writing the fork's copy leaves the original alone.
  pool.k(f.blocks[2], 0)[0] ^= 0xff;
  EXPECT_FALSE(same_bytes(pool, f.blocks[2], seq.blocks[2]));

  // Release both: every block returns.
  f.release(pool);
  EXPECT_EQ(pool.refcount(seq.blocks[0]), 1);
  EXPECT_EQ(pool.n_free(), 2);
  seq.release(pool);
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
  for (int32_t b = 0; b < pool.n_blocks(); ++b) EXPECT_EQ(pool.refcount(b), 0);
}

TEST(KvCache, ForkWithoutAFreeBlockThrowsAndRetainsNothing) {
  const KvLayout l = small_layout();
  KvBlockPool pool(l, 3 * l.block_bytes());
  KvSequence seq;
  seq.reserve(pool, 40);
  seq.n_tokens = 40;  // the last block is partial: the fork needs one more block
  ASSERT_EQ(pool.n_free(), 0);
  EXPECT_THROW(seq.fork(pool), ResourceExhausted);
  for (int32_t b : seq.blocks) EXPECT_EQ(pool.refcount(b), 1);
  EXPECT_EQ(pool.n_free(), 0);
  seq.release(pool);
  EXPECT_EQ(pool.n_free(), 3);
}

TEST(KvCache, ForkOfAForkAndReleaseInAnyOrder) {
  const KvLayout l = small_layout();
  KvBlockPool pool(l, 8 * l.block_bytes());
  KvSequence a;
  a.reserve(pool, 35);
  a.n_tokens = 35;
  KvSequence b = a.fork(pool);
  b.reserve(pool, 40);
  b.n_tokens = 40;
  KvSequence c = b.fork(pool);
  EXPECT_EQ(pool.refcount(a.blocks[0]), 3);
  EXPECT_EQ(pool.refcount(a.blocks[1]), 3);
  EXPECT_EQ(pool.refcount(a.blocks[2]), 1);
  EXPECT_EQ(pool.refcount(b.blocks[2]), 1);
  EXPECT_EQ(pool.refcount(c.blocks[2]), 1);
  EXPECT_EQ(pool.n_free(), 3);
  b.release(pool);
  a.release(pool);
  EXPECT_EQ(pool.refcount(c.blocks[0]), 1);
  c.release(pool);
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
}

// ---- Prefix cache ------------------------------------------------------------

std::vector<int32_t> block_tokens(int32_t first) {
  std::vector<int32_t> t(16);
  for (int i = 0; i < 16; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

BlockKey key_for(const BlockHash& root, const BlockHash& parent, const std::vector<int32_t>& t) {
  return BlockKey{block_hash(parent, t), parent, root};
}

TEST(KvPrefixCache, HashesDependOnEveryInput) {
  const BlockHash r = prefix_root("fp_a", "tenant");
  EXPECT_FALSE(r == prefix_root("fp_b", "tenant"));
  EXPECT_FALSE(r == prefix_root("fp_a", "other"));
  EXPECT_FALSE(prefix_root("ab", "c") == prefix_root("a", "bc"));
  EXPECT_TRUE(r == prefix_root("fp_a", "tenant"));
  const std::vector<int32_t> t = block_tokens(5);
  std::vector<int32_t> u = t;
  u[15] = 99;
  EXPECT_FALSE(block_hash(r, t) == block_hash(r, u));
  EXPECT_FALSE(block_hash(r, t) == block_hash(prefix_root("fp_a", "other"), t));
  EXPECT_TRUE(block_hash(r, t) == block_hash(r, t));
}

TEST(KvPrefixCache, PublishedBlocksAreFoundVerifiedAndStayCachedWhenReleased) {
  const KvLayout l = small_layout();
  KvBlockPool pool(l, 4 * l.block_bytes());
  const BlockHash root = prefix_root("fp", "t");
  const std::vector<int32_t> t0 = block_tokens(0), t1 = block_tokens(100);
  const BlockKey k0 = key_for(root, root, t0), k1 = key_for(root, k0.hash, t1);
  EXPECT_EQ(pool.lookup(k0, t0), -1);
  const int32_t b0 = pool.allocate(), b1 = pool.allocate();
  pool.publish(b0, k0, t0);
  pool.publish(b1, k1, t1);
  EXPECT_EQ(pool.n_cached(), 2);
  // A hit is retained.
  EXPECT_EQ(pool.lookup(k0, t0), b0);
  EXPECT_EQ(pool.refcount(b0), 2);
  pool.release(b0);
  // Released to zero: cached and evictable, still counted as free.
  pool.release(b0);
  pool.release(b1);
  EXPECT_EQ(pool.n_evictable(), 2);
  EXPECT_EQ(pool.n_free(), 4);
  EXPECT_EQ(pool.n_used(), 0);
  // A hit brings an evictable block back.
  EXPECT_EQ(pool.lookup(k1, t1), b1);
  EXPECT_EQ(pool.refcount(b1), 1);
  EXPECT_EQ(pool.n_evictable(), 1);
  // Same hash, other tokens / parent / root: not a hit (a hash is not a proof).
  std::vector<int32_t> wrong = t0;
  wrong[3] = 7;
  EXPECT_EQ(pool.lookup(k0, wrong), -1);
  BlockKey other_root = k0;
  other_root.root = prefix_root("fp", "u");
  EXPECT_EQ(pool.lookup(other_root, t0), -1);
  BlockKey other_parent = k0;
  other_parent.parent = k1.hash;
  EXPECT_EQ(pool.lookup(other_parent, t0), -1);
  pool.release(b1);
}

TEST(KvPrefixCache, UnusedBlocksGoFirstThenLeastRecentlyReleased) {
  const KvLayout l = small_layout();
  KvBlockPool pool(l, 3 * l.block_bytes());
  const BlockHash root = prefix_root("fp", "t");
  std::vector<int32_t> blocks;
  std::vector<BlockKey> keys;
  std::vector<std::vector<int32_t>> toks;
  for (int i = 0; i < 3; ++i) {
    toks.push_back(block_tokens(i * 16));
    keys.push_back(key_for(root, i == 0 ? root : keys.back().hash, toks.back()));
    blocks.push_back(pool.allocate());
    pool.publish(blocks.back(), keys.back(), toks.back());
  }
  // Released in the order 2, 0, 1: evicted in that order.
  for (int i : {2, 0, 1}) pool.release(blocks[static_cast<size_t>(i)]);
  EXPECT_EQ(pool.n_unused(), 0);
  EXPECT_EQ(pool.allocate(), blocks[2]);
  EXPECT_EQ(pool.evictions(), 1);
  EXPECT_EQ(pool.lookup(keys[2], toks[2]), -1) << "an evicted block is no longer found";
  EXPECT_EQ(pool.lookup(keys[1], toks[1]), blocks[1]);  // now in use: not evictable
  EXPECT_EQ(pool.allocate(), blocks[0]);
  EXPECT_THROW(pool.allocate(), ResourceExhausted);
  EXPECT_EQ(pool.n_cached(), 1);
  // A block freed without an entry goes to the unused list and is taken first.
  pool.release(blocks[0]);  // evicted earlier: no entry any more
  pool.release(blocks[1]);  // cached
  EXPECT_EQ(pool.n_unused(), 1);
  EXPECT_EQ(pool.n_evictable(), 1);
  EXPECT_EQ(pool.allocate(), blocks[0]);
  EXPECT_EQ(pool.evictions(), 2);
}

TEST(KvPrefixCache, PublishIsIdempotentAndKeepsTheFirstBlockForAHash) {
  const KvLayout l = small_layout();
  KvBlockPool pool(l, 3 * l.block_bytes());
  const BlockHash root = prefix_root("fp", "t");
  const std::vector<int32_t> t = block_tokens(1);
  const BlockKey k = key_for(root, root, t);
  const int32_t a = pool.allocate(), b = pool.allocate();
  pool.publish(a, k, t);
  pool.publish(a, k, t);
  pool.publish(b, k, t);  // same content computed twice: the first stays
  EXPECT_EQ(pool.n_cached(), 1);
  EXPECT_EQ(pool.lookup(k, t), a);
  pool.release(a);
  pool.release(a);
  pool.release(b);
  EXPECT_EQ(pool.n_unused(), 2);
  EXPECT_EQ(pool.n_evictable(), 1);
  EXPECT_THROW(pool.publish(b, k, t), std::logic_error) << "b is not allocated";
}

}  // namespace
}  // namespace encore
