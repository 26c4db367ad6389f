// The Llama architecture (Llama 1/2/3 and look-alikes): loading. The forward
// pass (src/model/forward.cpp) computes, per token (x is the residual
// stream, [n_embd]):
//   x = token_embd[id]
//   for each layer:
//     xb = rmsnorm(x) * attn_norm
//     q = Wq xb, k = Wk xb, v = Wv xb; rotate q and k by position (RoPE,
//       adjacent pairs; angles scaled by rope_freq_scale and divided by
//       rope_freqs when the file has them)
//     per query head h (KV head h / (n_head / n_head_kv)):
//       att_h = softmax(q_h . k_j / sqrt(head_dim), j <= pos) . v_j
//     x += Wo att
//     xb = rmsnorm(x) * ffn_norm
//     x += W_down (silu(W_gate xb) * (W_up xb))
//   logits = W_out (rmsnorm(x) * output_norm)
#include "encore/gguf.h"
#include "model/loader.h"

namespace encore::model_detail {

std::unique_ptr<ModelWeights> load_llama(const gguf::File& file, HParams* hparams) {
  HParams hp = read_common_hparams(file, "llama");
  // llama.cpp: LLAMA_ROPE_TYPE_NORM for LLM_ARCH_LLAMA.
  hp.rope_layout = RopeLayout::Normal;

  TensorReader tr(file);
  std::unique_ptr<ModelWeights> w = read_llama_like_weights(tr, &hp);
  // Llama 3.1+ GGUFs carry their "llama3" RoPE scaling as this tensor.
  w->rope_freqs = read_rope_freqs(tr, hp);
  tr.check_all_used("llama");
  *hparams = std::move(hp);
  return w;
}

}  // namespace encore::model_detail
