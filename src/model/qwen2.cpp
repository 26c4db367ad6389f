// The Qwen2 architecture (Qwen1.5, Qwen2, Qwen2.5 dense models): loading.
// Llama's block with two differences the forward pass handles:
//   - the Q, K and V projections have biases: q = Wq xb + bq, and so on;
//   - RoPE rotates the pairs (i, i + n_rot / 2) (NeoX layout; llama.cpp
//     LLAMA_ROPE_TYPE_NEOX for LLM_ARCH_QWEN2).
// The small models tie the output head to token_embd (no output.weight).
#include <fmt/format.h>

#include <string>

#include "encore/gguf.h"
#include "model/loader.h"

namespace encore::model_detail {

std::unique_ptr<ModelWeights> load_qwen2(const gguf::File& file, HParams* hparams) {
  HParams hp = read_common_hparams(file, "qwen2");
  hp.rope_layout = RopeLayout::NeoX;
  hp.has_qkv_bias = true;

  const int64_t n_q = static_cast<int64_t>(hp.n_head) * hp.head_dim;
  const int64_t n_kv = static_cast<int64_t>(hp.n_head_kv) * hp.head_dim;

  TensorReader tr(file);
  std::unique_ptr<ModelWeights> w = read_llama_like_weights(tr, &hp);
  for (int i = 0; i < hp.n_layer; ++i) {
    LayerWeights& l = w->layers[static_cast<size_t>(i)];
    const std::string p = fmt::format("blk.{}.", i);
    // Required, as in llama.cpp: a Qwen2 file without them is broken, and
    // computing without them would silently give other logits.
    l.bq = tr.vector(p + "attn_q.bias", n_q, "[n_head * head_dim]");
    l.bk = tr.vector(p + "attn_k.bias", n_kv, "[n_head_kv * head_dim]");
    l.bv = tr.vector(p + "attn_v.bias", n_kv, "[n_head_kv * head_dim]");
  }
  tr.check_all_used("qwen2");
  *hparams = std::move(hp);
  return w;
}

}  // namespace encore::model_detail
