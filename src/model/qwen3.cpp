// The Qwen3 architecture (dense Qwen3 models): loading. Llama's block with:
//   - no QKV biases (unlike Qwen2), but each head of q and of k goes through
//     its own RMSNorm (weights attn_q_norm / attn_k_norm, [head_dim], eps =
//     rms_eps) after the projection and before RoPE;
//   - NeoX RoPE layout (llama.cpp LLAMA_ROPE_TYPE_NEOX for LLM_ARCH_QWEN3);
//   - an explicit head size (attention.key_length, 128 in every released
//     model) that is usually not n_embd / n_head: Qwen3-0.6B has n_embd 1024
//     and 16 heads of 128, so Wq maps 1024 -> 2048 and Wo 2048 -> 1024.
#include <fmt/format.h>

#include <string>

#include "encore/gguf.h"
#include "model/loader.h"

namespace encore::model_detail {

std::unique_ptr<ModelWeights> load_qwen3(const gguf::File& file, HParams* hparams) {
  HParams hp = read_common_hparams(file, "qwen3");
  hp.rope_layout = RopeLayout::NeoX;
  hp.has_qk_norm = true;

  TensorReader tr(file);
  std::unique_ptr<ModelWeights> w = read_llama_like_weights(tr, &hp);
  for (int i = 0; i < hp.n_layer; ++i) {
    LayerWeights& l = w->layers[static_cast<size_t>(i)];
    const std::string p = fmt::format("blk.{}.", i);
    l.q_norm = tr.vector(p + "attn_q_norm.weight", hp.head_dim, "[head_dim]");
    l.k_norm = tr.vector(p + "attn_k_norm.weight", hp.head_dim, "[head_dim]");
  }
  tr.check_all_used("qwen3");
  *hparams = std::move(hp);
  return w;
}

}  // namespace encore::model_detail
