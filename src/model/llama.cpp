// The Llama architecture: loading and the forward pass.
//
// Per token (x is the residual stream, [n_embd]):
//   x = token_embd[id]
//   for each layer:
//     xb = rmsnorm(x) * attn_norm
//     q = Wq xb, k = Wk xb, v = Wv xb; rotate q and k by position (RoPE)
//     append k, v to the sequence's KV blocks
//     per query head h (KV head h / (n_head / n_head_kv)):
//       att_h = softmax(q_h . k_j / sqrt(head_dim), j <= pos) . v_j
//     x += Wo att
//     xb = rmsnorm(x) * ffn_norm
//     x += W_down (silu(W_gate xb) * (W_up xb))
//   logits = W_out (rmsnorm(x) * output_norm)
// A batch of n tokens runs each step for all n at once so that every weight
// row is read (and dequantised) once per batch, not once per token.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "encore/gguf.h"
#include "encore/thread_pool.h"
#include "kernels/ops.h"
#include "model/loader.h"

namespace encore {
namespace model_detail {

std::unique_ptr<ModelWeights> load_llama(const gguf::File& file, HParams* hparams) {
  HParams hp = read_common_hparams(file, "llama");
  hp.rope_layout = RopeLayout::Normal;

  const int64_t n_embd = hp.n_embd;
  const int64_t n_q = static_cast<int64_t>(hp.n_head) * hp.head_dim;
  const int64_t n_kv = static_cast<int64_t>(hp.n_head_kv) * hp.head_dim;
  const int64_t n_ff = hp.n_ff;

  TensorReader tr(file);
  auto w = std::make_unique<ModelWeights>();
  w->token_embd = tr.matrix("token_embd.weight", n_embd, hp.n_vocab, "[n_embd, n_vocab]");
  w->output_norm = tr.vector("output_norm.weight", n_embd, "[n_embd]");
  w->output = tr.optional_matrix("output.weight", n_embd, hp.n_vocab, "[n_embd, n_vocab]");
  hp.tied_output = w->output.data == nullptr;
  if (hp.tied_output) w->output = w->token_embd;

  w->layers.resize(static_cast<size_t>(hp.n_layer));
  for (int i = 0; i < hp.n_layer; ++i) {
    LayerWeights& l = w->layers[static_cast<size_t>(i)];
    const std::string p = fmt::format("blk.{}.", i);
    l.attn_norm = tr.vector(p + "attn_norm.weight", n_embd, "[n_embd]");
    l.wq = tr.matrix(p + "attn_q.weight", n_embd, n_q, "[n_embd, n_head * head_dim]");
    l.wk = tr.matrix(p + "attn_k.weight", n_embd, n_kv, "[n_embd, n_head_kv * head_dim]");
    l.wv = tr.matrix(p + "attn_v.weight", n_embd, n_kv, "[n_embd, n_head_kv * head_dim]");
    l.wo = tr.matrix(p + "attn_output.weight", n_q, n_embd, "[n_head * head_dim, n_embd]");
    l.ffn_norm = tr.vector(p + "ffn_norm.weight", n_embd, "[n_embd]");
    l.w_gate = tr.matrix(p + "ffn_gate.weight", n_embd, n_ff, "[n_embd, n_ff]");
    l.w_up = tr.matrix(p + "ffn_up.weight", n_embd, n_ff, "[n_embd, n_ff]");
    l.w_down = tr.matrix(p + "ffn_down.weight", n_ff, n_embd, "[n_ff, n_embd]");
  }
  tr.check_all_used("llama");
  *hparams = std::move(hp);
  return w;
}

}  // namespace model_detail

void ForwardContext::eval_batch(KvSequence& seq, const int32_t* tokens, int n, int32_t pos0,
                                float* logits_last) {
  const HParams& hp = model_.hparams();
  const ModelWeights& w = model_.weights();
  const int64_t n_embd = hp.n_embd;
  const int64_t n_q = static_cast<int64_t>(hp.n_head) * hp.head_dim;
  const int64_t n_kv = static_cast<int64_t>(hp.n_head_kv) * hp.head_dim;
  const int64_t n_ff = hp.n_ff;
  const int half_rot = hp.n_rot / 2;
  const int block_tokens = pool_.layout().block_tokens;
  ThreadPool* pool = &threads_;

  // Grow-only scratch: decode-only contexts never pay for prompt-sized buffers.
  auto ensure = [n](std::vector<float>& buf, int64_t per_token) {
    const size_t need = static_cast<size_t>(n * per_token);
    if (buf.size() < need) buf.resize(need);
  };
  ensure(x_, n_embd);
  ensure(xb_, n_embd);
  ensure(xb2_, n_embd);
  ensure(q_, n_q);
  ensure(k_, n_kv);
  ensure(v_, n_kv);
  ensure(att_, n_q);
  ensure(gate_, n_ff);
  ensure(up_, n_ff);
  ensure(rope_cos_, half_rot);
  ensure(rope_sin_, half_rot);
  float* x = x_.data();        // [n, n_embd]
  float* xb = xb_.data();      // [n, n_embd]
  float* xb2 = xb2_.data();    // [n, n_embd]
  float* q = q_.data();        // [n, n_head * head_dim]
  float* k = k_.data();        // [n, n_head_kv * head_dim]
  float* v = v_.data();        // [n, n_head_kv * head_dim]
  float* att = att_.data();    // [n, n_head * head_dim]
  float* gate = gate_.data();  // [n, n_ff]
  float* up = up_.data();      // [n, n_ff]

  // Token embeddings, and the RoPE angles of each position (shared by all
  // layers and by q and k).
  for (int t = 0; t < n; ++t) {
    kernels::get_row(w.token_embd, tokens[t], x + t * n_embd);
    kernels::rope_cos_sin(pos0 + t, hp.n_rot, hp.rope_freq_base, &rope_cos_[t * half_rot],
                          &rope_sin_[t * half_rot]);
  }

  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(l)];

    // Attention sub-layer.
    for (int t = 0; t < n; ++t) {
      kernels::rmsnorm(xb + t * n_embd, x + t * n_embd, lw.attn_norm.data(), n_embd, hp.rms_eps);
    }
    kernels::matmul(lw.wq, xb, q, n, pool);
    kernels::matmul(lw.wk, xb, k, n, pool);
    kernels::matmul(lw.wv, xb, v, n, pool);
    for (int t = 0; t < n; ++t) {
      const float* c = &rope_cos_[t * half_rot];
      const float* s = &rope_sin_[t * half_rot];
      if (hp.rope_layout == RopeLayout::Normal) {
        kernels::rope_adjacent(q + t * n_q, hp.n_head, hp.head_dim, hp.n_rot, c, s);
        kernels::rope_adjacent(k + t * n_kv, hp.n_head_kv, hp.head_dim, hp.n_rot, c, s);
      } else {
        kernels::rope_neox(q + t * n_q, hp.n_head, hp.head_dim, hp.n_rot, c, s);
        kernels::rope_neox(k + t * n_kv, hp.n_head_kv, hp.head_dim, hp.n_rot, c, s);
      }
      // Append this position's K/V to the cache before attending, so that
      // every token (including itself) sees positions [0, pos] there.
      const KvSequence::Slot slot = seq.slot(pos0 + t, block_tokens);
      std::memcpy(pool_.k(slot.block, l) + slot.offset * n_kv, k + t * n_kv,
                  static_cast<size_t>(n_kv) * sizeof(float));
      std::memcpy(pool_.v(slot.block, l) + slot.offset * n_kv, v + t * n_kv,
                  static_cast<size_t>(n_kv) * sizeof(float));
    }
    attention(seq, l, n, pos0);
    kernels::matmul(lw.wo, att, xb2, n, pool);
    kernels::add_inplace(x, xb2, n * n_embd);

    // Feed-forward sub-layer (SwiGLU).
    for (int t = 0; t < n; ++t) {
      kernels::rmsnorm(xb + t * n_embd, x + t * n_embd, lw.ffn_norm.data(), n_embd, hp.rms_eps);
    }
    kernels::matmul(lw.w_gate, xb, gate, n, pool);
    kernels::matmul(lw.w_up, xb, up, n, pool);
    kernels::swiglu(gate, gate, up, n * n_ff);
    kernels::matmul(lw.w_down, gate, xb2, n, pool);
    kernels::add_inplace(x, xb2, n * n_embd);
  }

  if (logits_last != nullptr) {
    // Only the last token's logits are needed: the classifier is by far the
    // widest matmul, so it runs for one row of x.
    kernels::rmsnorm(xb, x + (n - 1) * n_embd, w.output_norm.data(), n_embd, hp.rms_eps);
    kernels::matmul(w.output, xb, logits_last, 1, pool);
  }
}

void ForwardContext::attention(KvSequence& seq, int layer, int n, int32_t pos0) {
  const HParams& hp = model_.hparams();
  const int64_t n_q = static_cast<int64_t>(hp.n_head) * hp.head_dim;
  const int group = hp.n_head / hp.n_head_kv;  // query heads per KV head
  const float scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim));

  k_blocks_.clear();
  v_blocks_.clear();
  for (int32_t b : seq.blocks) {
    k_blocks_.push_back(pool_.k(b, layer));
    v_blocks_.push_back(pool_.v(b, layer));
  }
  kernels::PagedKv kv;
  kv.k_blocks = k_blocks_.data();
  kv.v_blocks = v_blocks_.data();
  kv.block_tokens = pool_.layout().block_tokens;
  kv.row_stride = pool_.layout().row_elems();

  const float* q = q_.data();  // [n, n_head * head_dim]
  float* att = att_.data();    // [n, n_head * head_dim]
  const int64_t n_items = static_cast<int64_t>(n) * hp.n_head;
  auto run = [&](int64_t begin, int64_t end, int thread) {
    float* scores = scores_.data() + static_cast<size_t>(thread) * n_ctx_;  // [n_ctx]
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / hp.n_head;
      const int h = static_cast<int>(item % hp.n_head);
      const int64_t n_visible = pos0 + t + 1;  // causal: positions [0, pos0 + t]
      const int64_t off = t * n_q + static_cast<int64_t>(h) * hp.head_dim;
      kernels::attention_head(q + off, kv, h / group, n_visible, hp.head_dim, scale, scores,
                              att + off);
    }
  };
  // Roughly 2 multiply-adds per visible position and head dim per item.
  const int64_t work = n_items * (pos0 + n) * hp.head_dim * 2;
  if (work < kernels::kMinParallelWork) {
    run(0, n_items, 0);
  } else {
    threads_.parallel_for(n_items, run);
  }
}

}  // namespace encore
