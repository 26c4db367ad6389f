// Weights of a loaded model (internal to src/model and its tests).
//
// Matrices are WeightViews into the gguf::File's tensor data (the File must
// outlive the Model), plus, once Model::repack_weights ran, their repacked
// panels (WeightView::panels, owned by the Model). A view of GGUF dims [cols, rows] has `rows`
// output features of `cols` inputs each, so "[n_embd -> n_q]" below means
// rows = n_q, cols = n_embd. Norm vectors are small and kept as float copies.
// Thread-safety: immutable after loading.
#pragma once

#include <string>
#include <vector>

#include "encore/model.h"
#include "kernels/matmul.h"

namespace encore {

struct LayerWeights {
  std::vector<float> attn_norm;  // [n_embd]
  kernels::WeightView wq;        // [n_embd -> n_head * head_dim]
  kernels::WeightView wk;        // [n_embd -> n_head_kv * head_dim]
  kernels::WeightView wv;        // [n_embd -> n_head_kv * head_dim]
  std::vector<float> bq;         // [n_head * head_dim] qwen2 Q bias; empty when absent
  std::vector<float> bk;         // [n_head_kv * head_dim] qwen2 K bias; empty when absent
  std::vector<float> bv;         // [n_head_kv * head_dim] qwen2 V bias; empty when absent
  std::vector<float> q_norm;     // [head_dim] qwen3 per-head Q RMSNorm; empty when absent
  std::vector<float> k_norm;     // [head_dim] qwen3 per-head K RMSNorm; empty when absent
  kernels::WeightView wo;        // [n_head * head_dim -> n_embd]
  std::vector<float> ffn_norm;   // [n_embd]
  kernels::WeightView w_gate;    // [n_embd -> n_ff]
  kernels::WeightView w_up;      // [n_embd -> n_ff]
  kernels::WeightView w_down;    // [n_ff -> n_embd]
};

struct ModelWeights {
  kernels::WeightView token_embd;    // [n_vocab rows of n_embd]
  std::vector<LayerWeights> layers;  // [n_layer]
  std::vector<float> output_norm;    // [n_embd]
  kernels::WeightView output;        // [n_embd -> n_vocab]; == token_embd when tied
  // RoPE frequency divisors (GGUF rope_freqs.weight, Llama 3.1+ "llama3"
  // scaling baked by the converter); empty when absent.
  std::vector<float> rope_freqs;  // [n_rot / 2]
};

}  // namespace encore
