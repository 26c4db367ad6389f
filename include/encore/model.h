// Transformer models read from GGUF files, and their forward pass.
//
// Model::load() reads the hyper-parameters and checks every tensor (presence,
// dtype, shape) once, so the forward pass never meets a surprise.
// Supported architectures: "llama" (Llama 1/2/3 and look-alikes).
//
// Ownership: a Model's weights are zero-copy views into the gguf::File it was
// loaded from; the File must outlive the Model (and every ForwardContext on
// it). Only tiny tensors (norm vectors) are copied.
// Thread-safety: a Model is immutable after load(); any number of
// ForwardContexts on any threads may share it. A ForwardContext is used by
// one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "encore/kv_cache.h"

namespace encore {

namespace gguf {
class File;
}
class ThreadPool;
struct ModelWeights;  // src/model/weights.h

// How rotary embeddings pair up the dimensions of a head.
enum class RopeLayout {
  Normal,  // adjacent pairs (2i, 2i+1): llama.cpp LLAMA_ROPE_TYPE_NORM, llama2.c
  NeoX,    // pairs (i, i + n_rot/2): GPT-NeoX, Qwen, ...
};

struct HParams {
  std::string arch;     // general.architecture
  int n_vocab = 0;      // vocabulary size (rows of token_embd)
  int n_ctx_train = 0;  // context length the model was trained with
  int n_embd = 0;       // residual stream width
  int n_layer = 0;      // transformer blocks
  int n_head = 0;       // query heads
  int n_head_kv = 0;    // key/value heads (GQA when < n_head)
  int head_dim = 0;     // dims per head
  int n_rot = 0;        // leading dims of each head that RoPE rotates
  int n_ff = 0;         // feed-forward hidden width
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  RopeLayout rope_layout = RopeLayout::Normal;
  bool tied_output = false;  // no output.weight: logits use token_embd
};

// Architectures Model::load() accepts.
const std::vector<std::string>& supported_architectures();

class Model {
 public:
  // Reads hyper-parameters and validates every tensor. Throws ModelError
  // (unsupported architecture, missing tensor, wrong shape or dtype, with
  // the file and tensor named) or GgufError (missing/mistyped keys).
  // Cost: O(number of tensors); no weight data is read (except norms).
  static std::unique_ptr<Model> load(const gguf::File& file);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const HParams& hparams() const { return hparams_; }
  const std::string& path() const { return path_; }
  const ModelWeights& weights() const { return *weights_; }

 private:
  Model(HParams hparams, std::string path, std::unique_ptr<ModelWeights> weights);

  HParams hparams_;
  std::string path_;
  std::unique_ptr<ModelWeights> weights_;
};

// The KV layout a model needs (F32 entries).
KvLayout kv_layout_for(const HParams& hparams, int block_tokens = 16);

// Runs the forward pass of one model over KV sequences in a pool.
//
// Owns scratch activations sized for at most kMaxBatch tokens (longer
// prompts are processed kMaxBatch tokens at a time, with identical results
// since every token's math is independent of its batch-mates).
// Borrows the model, the pool and the thread pool; all must outlive it.
// Not thread-safe: one thread drives a ForwardContext at a time.
class ForwardContext {
 public:
  static constexpr int kMaxBatch = 256;

  // n_ctx: the most positions a sequence may reach (>= 1). Throws
  // InvalidArgument if n_ctx < 1 or the pool's layout does not match the
  // model (layers, KV heads, head size).
  ForwardContext(const Model& model, KvBlockPool& pool, ThreadPool& threads, int n_ctx);
  ~ForwardContext();
  ForwardContext(const ForwardContext&) = delete;
  ForwardContext& operator=(const ForwardContext&) = delete;

  int32_t n_ctx() const { return n_ctx_; }
  const Model& model() const { return model_; }
  KvBlockPool& pool() const { return pool_; }

  // Runs `tokens` at positions [seq.n_tokens, seq.n_tokens + tokens.size()):
  // appends their K/V to seq (allocating blocks from the pool), advances
  // seq.n_tokens and writes the last token's logits to logits_last
  // ([n_vocab]). A whole prompt goes in one call (batched matmuls).
  // Throws InvalidArgument (no tokens, positions past n_ctx, token id out of
  // range, logits_last of the wrong size) or ResourceExhausted (KV pool
  // full); in every case seq is left as it was. The blocks that receive the
  // new positions must not be shared with another sequence (refcount 1;
  // std::logic_error otherwise): copy-on-write comes with prefix sharing.
  void eval(KvSequence& seq, std::span<const int32_t> tokens, std::span<float> logits_last);

 private:
  void eval_batch(KvSequence& seq, const int32_t* tokens, int n, int32_t pos0, float* logits_last);
  void attention(KvSequence& seq, int layer, int n, int32_t pos0);

  const Model& model_;
  KvBlockPool& pool_;
  ThreadPool& threads_;
  const int32_t n_ctx_;

  // Scratch, reused by every call (sized for kMaxBatch tokens or fewer).
  std::vector<float> x_;                // [n, n_embd] residual stream
  std::vector<float> xb_;               // [n, n_embd] normed input of a sub-layer
  std::vector<float> xb2_;              // [n, n_embd] output of a sub-layer
  std::vector<float> q_;                // [n, n_head * head_dim]
  std::vector<float> k_;                // [n, n_head_kv * head_dim]
  std::vector<float> v_;                // [n, n_head_kv * head_dim]
  std::vector<float> att_;              // [n, n_head * head_dim] attention output
  std::vector<float> gate_;             // [n, n_ff]
  std::vector<float> up_;               // [n, n_ff]
  std::vector<float> scores_;           // [threads, n_ctx] attention probabilities
  std::vector<float> rope_cos_;         // [n, n_rot / 2] RoPE angles per position
  std::vector<float> rope_sin_;         // [n, n_rot / 2]
  std::vector<const float*> k_blocks_;  // [blocks of seq] one layer's K block pointers
  std::vector<const float*> v_blocks_;  // [blocks of seq] one layer's V block pointers
};

}  // namespace encore
