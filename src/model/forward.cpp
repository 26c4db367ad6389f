// The forward pass shared by the supported architectures (llama, qwen2,
// qwen3), and ForwardContext's batching around it.
//
// One token, followed through a step (x is its residual stream, [n_embd]):
//   x = token_embd[id]
//   for each layer:
//     xb = rmsnorm(x) * attn_norm
//     q = Wq xb (+ bq), k = Wk xb (+ bk), v = Wv xb (+ bv)      qwen2: biases
//     q_h = rmsnorm(q_h) * q_norm, k_h = rmsnorm(k_h) * k_norm   qwen3: per head
//     rotate q and k by the token's position (RoPE)
//     append k, v to its sequence's KV blocks (converted to the KV type)
//     per query head h (KV head h / (n_head / n_head_kv)):
//       att_h = softmax(q_h . k_j / sqrt(head_dim), j <= pos) . v_j
//     x += Wo att
//     xb = rmsnorm(x) * ffn_norm
//     x += W_down (silu(W_gate xb) * (W_up xb))
//   logits = W_out (rmsnorm(x) * output_norm)      only where asked for
// A step runs each stage for all its tokens at once (of any mix of
// sequences), so every weight row is read once per step, not once per token.
//
// Invariance: every stage computes each token's values from that token's own
// inputs with kernels whose results do not depend on the batch (matmul rows
// are independent, attention reads only the token's own sequence, up to its
// own position, from the KV cache, which holds exactly what an earlier step
// or this one wrote). So a token's logits and K/V are the same whichever
// other tokens share the step and however a prompt was cut into steps.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

#include "encore/error.h"
#include "encore/model.h"
#include "encore/thread_pool.h"
#include "kernels/fp16.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/weights.h"

namespace encore {

// One token of a step: where it goes and whether its logits are wanted.
struct ForwardContext::TokenRef {
  KvSequence* seq;
  int32_t token;
  int32_t pos;
  float* logits;  // [n_vocab] or null
};

namespace {

Isa checked_isa(std::optional<Isa> isa) {
  const Isa chosen = isa ? *isa : isa_from_env();
  if (!isa_supported(chosen)) {
    throw InvalidArgument(fmt::format("this CPU does not support the {} kernels (best here: {})",
                                      isa_name(chosen), isa_name(detect_best_isa())));
  }
  return chosen;
}

// Grow-only scratch: decode-only contexts never pay for prompt-sized buffers.
float* ensure(std::vector<float>& buf, int64_t n, int64_t per_token) {
  const size_t need = static_cast<size_t>(n * per_token);
  if (buf.size() < need) buf.resize(need);
  return buf.data();
}

// Stores one token's K or V row ([row_elems] floats) into the cache in its
// element type (F16: round to nearest even, the same on every CPU).
void store_row(uint8_t* dst, const float* src, int64_t n, DType type) {
  if (type == DType::F16) {
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = kernels::f32_to_fp16(src[i]);
  } else {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
}

}  // namespace

Model::TokenCost Model::token_cost() const {
  TokenCost c;
  auto add = [&c](const kernels::WeightView& m) {
    const uint64_t macs = static_cast<uint64_t>(m.rows) * static_cast<uint64_t>(m.cols);
    c.weight_bytes += static_cast<uint64_t>(m.rows) * m.row_bytes;
    c.macs += macs;
    if (!kernels::matmul_uses_int8(m.type)) c.float_macs += macs;
  };
  for (const LayerWeights& l : weights_->layers) {
    for (const kernels::WeightView* m :
         {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      add(*m);
    }
  }
  add(weights_->output);
  c.weight_bytes += weights_->token_embd.row_bytes;
  return c;
}

ForwardContext::ForwardContext(const Model& model, KvBlockPool& pool, ThreadPool& threads,
                               int n_ctx, std::optional<Isa> isa)
    : model_(model),
      pool_(pool),
      threads_(threads),
      n_ctx_(n_ctx),
      isa_(checked_isa(isa)),
      mm_scratch_(std::make_unique<kernels::MatmulScratch>()) {
  const HParams& hp = model.hparams();
  if (n_ctx < 1) {
    throw InvalidArgument(fmt::format("context size {} must be at least 1", n_ctx));
  }
  const KvLayout& l = pool.layout();
  if (l.n_layer != hp.n_layer || l.n_kv_heads != hp.n_head_kv || l.head_dim != hp.head_dim) {
    throw InvalidArgument(fmt::format(
        "KV pool layout (layers {}, KV heads {}, head size {}) does not fit the model "
        "{} (layers {}, KV heads {}, head size {})",
        l.n_layer, l.n_kv_heads, l.head_dim, model.path(), hp.n_layer, hp.n_head_kv, hp.head_dim));
  }
}

ForwardContext::~ForwardContext() = default;

void ForwardContext::eval(KvSequence& seq, std::span<const int32_t> tokens,
                          std::span<float> logits_last) {
  const HParams& hp = model_.hparams();
  if (logits_last.size() != static_cast<size_t>(hp.n_vocab)) {
    throw InvalidArgument(
        fmt::format("eval: the logits buffer has {} entries, expected n_vocab = {}",
                    logits_last.size(), hp.n_vocab));
  }
  const SeqTokens one{&seq, tokens, logits_last};
  step(std::span<const SeqTokens>(&one, 1));
}

void ForwardContext::step(std::span<const SeqTokens> batch) {
  const HParams& hp = model_.hparams();
  const int bt = pool_.layout().block_tokens;

  // Validate everything before touching any sequence.
  std::unordered_set<const KvSequence*> seen;
  int64_t n_total = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const SeqTokens& st = batch[e];
    if (st.seq == nullptr) throw InvalidArgument(fmt::format("step: entry {} has no sequence", e));
    if (!seen.insert(st.seq).second) {
      throw InvalidArgument(fmt::format("step: entry {} repeats a sequence of the same step", e));
    }
    if (st.tokens.empty()) throw InvalidArgument(fmt::format("step: entry {} has no tokens", e));
    if (!st.logits.empty() && st.logits.size() != static_cast<size_t>(hp.n_vocab)) {
      throw InvalidArgument(
          fmt::format("step: entry {}: the logits buffer has {} entries, expected n_vocab = {}", e,
                      st.logits.size(), hp.n_vocab));
    }
    const int64_t total = int64_t{st.seq->n_tokens} + static_cast<int64_t>(st.tokens.size());
    if (total > n_ctx_) {
      throw InvalidArgument(fmt::format(
          "prompt of {} token{} + {} cached exceeds the context size {}", st.tokens.size(),
          st.tokens.size() == 1 ? "" : "s", st.seq->n_tokens, n_ctx_));
    }
    for (size_t i = 0; i < st.tokens.size(); ++i) {
      if (st.tokens[i] < 0 || st.tokens[i] >= hp.n_vocab) {
        throw InvalidArgument(fmt::format("token id {} at index {} is out of range [0, {})",
                                          st.tokens[i], i, hp.n_vocab));
      }
    }
    n_total += static_cast<int64_t>(st.tokens.size());
  }
  if (batch.empty()) return;

  // Reserve KV blocks for every entry; on any failure give back exactly the
  // blocks reserved here, so that every sequence is left as it was.
  std::vector<size_t> blocks_before(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) blocks_before[e] = batch[e].seq->blocks.size();
  auto undo_reserve = [&] {
    for (size_t e = 0; e < batch.size(); ++e) {
      KvSequence& seq = *batch[e].seq;
      while (seq.blocks.size() > blocks_before[e]) {
        pool_.release(seq.blocks.back());
        seq.blocks.pop_back();
      }
    }
  };
  try {
    for (const SeqTokens& st : batch) {
      st.seq->reserve(pool_, static_cast<int32_t>(st.seq->n_tokens + st.tokens.size()));
      // Writing K/V into a block another sequence also references would
      // change that sequence's past.
      KvSequence& seq = *st.seq;
      for (size_t b = static_cast<size_t>(seq.n_tokens / bt); b < seq.blocks.size(); ++b) {
        if (pool_.refcount(seq.blocks[b]) != 1 || pool_.published(seq.blocks[b])) {
          throw std::logic_error(fmt::format(
              "step: KV block {} (positions from {}) is shared by {} sequences or published in "
              "the prefix cache; writing to it needs copy-on-write",
              seq.blocks[b], b * static_cast<size_t>(bt), pool_.refcount(seq.blocks[b])));
        }
      }
    }

    std::vector<TokenRef> toks;
    toks.reserve(static_cast<size_t>(n_total));
    for (const SeqTokens& st : batch) {
      for (size_t i = 0; i < st.tokens.size(); ++i) {
        const bool last = i + 1 == st.tokens.size();
        toks.push_back(TokenRef{st.seq, st.tokens[i],
                                static_cast<int32_t>(st.seq->n_tokens + static_cast<int64_t>(i)),
                                last && !st.logits.empty() ? st.logits.data() : nullptr});
      }
    }
    // A sequence's tokens stay in position order across the sub-steps, so
    // each one finds the K/V of all earlier positions already in the cache.
    for (int64_t start = 0; start < n_total; start += kMaxBatch) {
      const int count = static_cast<int>(std::min<int64_t>(kMaxBatch, n_total - start));
      run_tokens(toks.data() + start, count);
    }
  } catch (...) {
    undo_reserve();
    throw;
  }
  for (const SeqTokens& st : batch) {
    st.seq->n_tokens = static_cast<int32_t>(st.seq->n_tokens + st.tokens.size());
  }
}

void ForwardContext::run_tokens(const TokenRef* toks, int n) {
  const HParams& hp = model_.hparams();
  const ModelWeights& w = model_.weights();
  const int64_t n_embd = hp.n_embd;
  const int64_t n_q = static_cast<int64_t>(hp.n_head) * hp.head_dim;
  const int64_t n_kv = static_cast<int64_t>(hp.n_head_kv) * hp.head_dim;
  const int64_t n_ff = hp.n_ff;
  const int half_rot = hp.n_rot / 2;
  const KvLayout& kvl = pool_.layout();
  ThreadPool* pool = &threads_;
  const Isa isa = isa_;

  float* x = ensure(x_, n, n_embd);            // [n, n_embd]
  float* xb = ensure(xb_, n, n_embd);          // [n, n_embd]
  float* xb2 = ensure(xb2_, n, n_embd);        // [n, n_embd]
  float* q = ensure(q_, n, n_q);               // [n, n_head * head_dim]
  float* k = ensure(k_, n, n_kv);              // [n, n_head_kv * head_dim]
  float* v = ensure(v_, n, n_kv);              // [n, n_head_kv * head_dim]
  ensure(att_, n, n_q);                        // [n, n_head * head_dim]
  float* gate = ensure(gate_, n, n_ff);        // [n, n_ff]
  float* up = ensure(up_, n, n_ff);            // [n, n_ff]
  float* rc = ensure(rope_cos_, n, half_rot);  // [n, n_rot / 2]
  float* rs = ensure(rope_sin_, n, half_rot);  // [n, n_rot / 2]
  const float* freq_factors = w.rope_freqs.empty() ? nullptr : w.rope_freqs.data();

  // Token embeddings, and the RoPE angles of each token's position (shared
  // by all layers and by q and k).
  for (int t = 0; t < n; ++t) {
    kernels::get_row(w.token_embd, toks[t].token, x + t * n_embd);
    kernels::rope_cos_sin(toks[t].pos, hp.n_rot, hp.rope_freq_base, hp.rope_freq_scale,
                          freq_factors, rc + t * half_rot, rs + t * half_rot);
  }

  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(l)];

    // Attention sub-layer.
    for (int t = 0; t < n; ++t) {
      kernels::rmsnorm(xb + t * n_embd, x + t * n_embd, lw.attn_norm.data(), n_embd, hp.rms_eps,
                       isa);
    }
    // One input: its activations are prepared once for the three.
    const kernels::MatmulOut qkv[] = {{&lw.wq, q}, {&lw.wk, k}, {&lw.wv, v}};
    kernels::matmul_many(qkv, xb, n, pool, isa, mm_scratch_.get());
    for (int t = 0; t < n; ++t) {
      float* qt = q + t * n_q;
      float* kt = k + t * n_kv;
      if (hp.has_qkv_bias) {
        kernels::add_inplace(qt, lw.bq.data(), n_q);
        kernels::add_inplace(kt, lw.bk.data(), n_kv);
        kernels::add_inplace(v + t * n_kv, lw.bv.data(), n_kv);
      }
      if (hp.has_qk_norm) {
        for (int h = 0; h < hp.n_head; ++h) {
          float* qh = qt + static_cast<int64_t>(h) * hp.head_dim;
          kernels::rmsnorm(qh, qh, lw.q_norm.data(), hp.head_dim, hp.rms_eps, isa);
        }
        for (int h = 0; h < hp.n_head_kv; ++h) {
          float* kh = kt + static_cast<int64_t>(h) * hp.head_dim;
          kernels::rmsnorm(kh, kh, lw.k_norm.data(), hp.head_dim, hp.rms_eps, isa);
        }
      }
      const float* c = rc + t * half_rot;
      const float* s = rs + t * half_rot;
      if (hp.rope_layout == RopeLayout::Normal) {
        kernels::rope_adjacent(qt, hp.n_head, hp.head_dim, hp.n_rot, c, s);
        kernels::rope_adjacent(kt, hp.n_head_kv, hp.head_dim, hp.n_rot, c, s);
      } else {
        kernels::rope_neox(qt, hp.n_head, hp.head_dim, hp.n_rot, c, s);
        kernels::rope_neox(kt, hp.n_head_kv, hp.head_dim, hp.n_rot, c, s);
      }
      // Append this position's K/V to the cache before attending, so that
      // every token (including itself) reads positions [0, pos] from there:
      // the same values whether they were written now or by an earlier step.
      const KvSequence::Slot slot = toks[t].seq->slot(toks[t].pos, kvl.block_tokens);
      const size_t row_bytes = static_cast<size_t>(n_kv) * dtype_info(kvl.elem_type).block_bytes;
      store_row(pool_.k(slot.block, l) + slot.offset * row_bytes, kt, n_kv, kvl.elem_type);
      store_row(pool_.v(slot.block, l) + slot.offset * row_bytes, v + t * n_kv, n_kv,
                kvl.elem_type);
    }
    attention(toks, n, l);
    kernels::matmul(lw.wo, att_.data(), xb2, n, pool, isa, mm_scratch_.get());
    kernels::add_inplace(x, xb2, n * n_embd);

    // Feed-forward sub-layer (SwiGLU).
    for (int t = 0; t < n; ++t) {
      kernels::rmsnorm(xb + t * n_embd, x + t * n_embd, lw.ffn_norm.data(), n_embd, hp.rms_eps,
                       isa);
    }
    const kernels::MatmulOut gate_up[] = {{&lw.w_gate, gate}, {&lw.w_up, up}};
    kernels::matmul_many(gate_up, xb, n, pool, isa, mm_scratch_.get());
    kernels::swiglu(gate, gate, up, n * n_ff, isa);
    kernels::matmul(lw.w_down, gate, xb2, n, pool, isa, mm_scratch_.get());
    kernels::add_inplace(x, xb2, n * n_embd);
  }

  // Logits only for the tokens that asked (the classifier is by far the
  // widest matmul): gather their final rows, one matmul, scatter.
  int n_out = 0;
  for (int t = 0; t < n; ++t) n_out += toks[t].logits != nullptr;
  if (n_out == 0) return;
  float* ox = ensure(out_x_, n_out, n_embd);           // [n_out, n_embd]
  float* ol = ensure(out_logits_, n_out, hp.n_vocab);  // [n_out, n_vocab]
  for (int t = 0, o = 0; t < n; ++t) {
    if (toks[t].logits == nullptr) continue;
    kernels::rmsnorm(ox + o * n_embd, x + t * n_embd, w.output_norm.data(), n_embd, hp.rms_eps,
                     isa);
    ++o;
  }
  kernels::matmul(w.output, ox, ol, n_out, pool, isa, mm_scratch_.get());
  for (int t = 0, o = 0; t < n; ++t) {
    if (toks[t].logits == nullptr) continue;
    std::memcpy(toks[t].logits, ol + static_cast<int64_t>(o) * hp.n_vocab,
                static_cast<size_t>(hp.n_vocab) * sizeof(float));
    ++o;
  }
}

void ForwardContext::attention(const TokenRef* toks, int n, int layer) {
  const HParams& hp = model_.hparams();
  const KvLayout& kvl = pool_.layout();
  const int64_t n_q = static_cast<int64_t>(hp.n_head) * hp.head_dim;
  const int group = hp.n_head / hp.n_head_kv;  // query heads per KV head
  const float scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim));

  // Block pointer tables of this layer, one per distinct sequence in the
  // step (tokens of one sequence are adjacent in toks).
  std::vector<kernels::PagedKv> kvs;  // [n_seqs]
  std::vector<int> seq_of(static_cast<size_t>(n));
  size_t n_ptrs = 0;
  for (int t = 0; t < n; ++t) {
    if (t == 0 || toks[t].seq != toks[t - 1].seq) n_ptrs += toks[t].seq->blocks.size();
  }
  k_blocks_.resize(n_ptrs);
  v_blocks_.resize(n_ptrs);
  size_t at = 0;
  for (int t = 0; t < n; ++t) {
    if (t == 0 || toks[t].seq != toks[t - 1].seq) {
      const KvSequence& seq = *toks[t].seq;
      kernels::PagedKv kv;
      kv.k_blocks = k_blocks_.data() + at;
      kv.v_blocks = v_blocks_.data() + at;
      kv.type = kvl.elem_type;
      kv.block_tokens = kvl.block_tokens;
      kv.row_stride = kvl.row_elems();
      for (int32_t b : seq.blocks) {
        k_blocks_[at] = pool_.k(b, layer);
        v_blocks_[at] = pool_.v(b, layer);
        ++at;
      }
      kvs.push_back(kv);
    }
    seq_of[static_cast<size_t>(t)] = static_cast<int>(kvs.size()) - 1;
  }

  std::vector<int64_t> n_visible(static_cast<size_t>(n));  // [n] causal: positions [0, pos]
  int64_t max_visible = 1;
  int64_t work = 0;  // roughly 2 multiply-adds per visible position, head dim and query head
  for (int t = 0; t < n; ++t) {
    const int64_t v = n_visible[static_cast<size_t>(t)] = int64_t{toks[t].pos} + 1;
    max_visible = std::max(max_visible, v);
    work += v * n_q * 2;
  }
  // Work items: runs of up to run_max adjacent tokens of one sequence (a
  // prefill chunk's tokens share each K/V read) times KV heads; up to 16
  // tokens, as far as 2 MiB of scores per thread allows (long contexts take
  // fewer). Speed only: no head's order depends on the runs.
  const int64_t per_token = int64_t{group} * max_visible;  // scores of one token
  const int run_max = static_cast<int>(std::clamp<int64_t>((int64_t{1} << 19) / per_token, 1, 16));
  const size_t per_thread = static_cast<size_t>(run_max * per_token);
  if (scores_.size() < per_thread * static_cast<size_t>(threads_.size())) {
    scores_.resize(per_thread * static_cast<size_t>(threads_.size()));
  }
  std::vector<int> runs;  // [n_runs + 1] first token of each run, then n
  for (int t = 0; t < n; ++t) {
    if (t == 0 || toks[t].seq != toks[t - 1].seq || t - runs.back() == run_max) runs.push_back(t);
  }
  runs.push_back(n);
  const float* q = q_.data();  // [n, n_head * head_dim]
  float* att = att_.data();    // [n, n_head * head_dim]
  const int64_t n_items = static_cast<int64_t>(runs.size() - 1) * hp.n_head_kv;
  const Isa isa = isa_;
  auto run = [&](int64_t begin, int64_t end, int thread) {
    // [run_max, group, max_visible] probabilities of this thread
    float* scores = scores_.data() + static_cast<size_t>(thread) * per_thread;
    for (int64_t item = begin; item < end; ++item) {
      const size_t r = static_cast<size_t>(item / hp.n_head_kv);
      const int g = static_cast<int>(item % hp.n_head_kv);
      const int t = runs[r];
      const int64_t off = t * n_q + static_cast<int64_t>(g) * group * hp.head_dim;
      kernels::attention_tokens(q + off, n_q, runs[r + 1] - t, &n_visible[static_cast<size_t>(t)],
                                group, kvs[static_cast<size_t>(seq_of[t])], g, hp.head_dim, scale,
                                scores, att + off, isa);
    }
  };
  if (work < kernels::kMinParallelWork) {
    run(0, n_items, 0);
  } else {
    // Later tokens see more rows: several chunks per thread even out the
    // causal triangle's uneven items.
    threads_.parallel_for(n_items, run, 8);
  }
}

}  // namespace encore
