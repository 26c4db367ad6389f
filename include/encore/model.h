// Transformer models read from GGUF files, and their forward pass.
//
// Model::load() reads the hyper-parameters and checks every tensor (presence,
// dtype, shape) once, so the forward pass never meets a surprise.
// Supported architectures: "llama" (Llama 1/2/3 and look-alikes: Mistral,
// TinyLlama, SmolLM), "qwen2" (Q/K/V biases) and "qwen3" (per-head Q/K norms).
//
// Ownership: a Model's weights are views into the gguf::File it was loaded
// from; the File must outlive the Model (and every ForwardContext on it).
// Norm vectors are copied, and repack_weights() adds a repacked copy of the
// weight matrices (owned by the Model, about the size of those tensors; the
// File's copy may then be released).
// Thread-safety: a Model is immutable after load() and repack_weights() or
// adopt_panels(); any
// number of ForwardContexts on any threads may then share it. A
// ForwardContext is used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "encore/dtype.h"
#include "encore/isa.h"
#include "encore/kv_cache.h"

namespace encore {

namespace gguf {
class File;
}
class ThreadPool;
struct ModelWeights;  // src/model/weights.h
namespace kernels {
struct MatmulScratch;  // src/kernels/matmul.h
struct WeightView;     // src/kernels/matmul.h
}  // namespace kernels

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
  // Linear RoPE scaling: positions are multiplied by this (1 / scaling factor).
  float rope_freq_scale = 1.0f;
  RopeLayout rope_layout = RopeLayout::Normal;
  bool has_qkv_bias = false;  // qwen2: biases on the Q, K and V projections
  bool has_qk_norm = false;   // qwen3: RMSNorm of each q and k head before RoPE
  bool tied_output = false;   // no output.weight: logits use token_embd
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

  // Repacks the weight matrices the forward pass multiplies (quantised,
  // F32, F16, BF16; not the token embeddings, unless they are the tied
  // output head) into row panels (src/kernels/panel.h, float_panel.h),
  // owned by the Model. Without it every
  // matmul repacks its weights on the fly: the same bits, much slower.
  // `release`, if given, is called on this thread with each matrix's bytes
  // in the File once its panels are written, except bytes the forward pass
  // still reads (the token embeddings, when they are a tied quantised output
  // head; a tied float head's lookups read its panels):
  // an owner that is the File's only user lets the File give them back
  // (gguf::File::release), so the weights are held once, not twice (at the
  // peak of loading: once, plus one matrix).
  // Cost: reads those weights once and writes panels of about their size;
  // runs on `pool` (not concurrently with other work on it). Call once,
  // before any ForwardContext uses the Model; a second call does nothing.
  void repack_weights(ThreadPool& pool,
                      const std::function<void(std::span<const uint8_t>)>& release = {});
  // Where each matrix repack_weights repacks sits in its block of panels:
  // the plain data a panel cache file (src/model/panel_file.h) records.
  struct PanelMatrix {
    DType type = DType::F32;
    int64_t rows = 0;
    int64_t cols = 0;
    size_t offset = 0;  // from the block's start, a multiple of 64
    size_t bytes = 0;   // kernels::repacked_bytes(type, rows, cols)
  };
  std::vector<PanelMatrix> panel_layout() const;
  size_t panel_block_bytes() const;  // the block's size (0: nothing to repack)
  // Uses `block` ([panel_block_bytes()] laid out as panel_layout() says,
  // e.g. a mapped panel cache file) as the panels, instead of repacking or
  // in place of what repack_weights made. Call before any ForwardContext
  // uses the Model. Throws std::logic_error if `bytes` is not the block's size.
  void adopt_panels(std::shared_ptr<const uint8_t> block, size_t bytes);
  // The panels in use ([repacked_bytes()]; nullptr before repack_weights or
  // adopt_panels), and their size.
  const uint8_t* panels() const { return repacked_.get(); }
  size_t repacked_bytes() const { return repacked_bytes_; }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const HParams& hparams() const { return hparams_; }
  const std::string& path() const { return path_; }
  const ModelWeights& weights() const { return *weights_; }

  // What one token costs at batch 1: the bytes of every weight matrix a
  // decode step reads (all layer matrices, the output head, one embedding
  // row) and the multiply-adds of those matrices (attention excluded).
  struct TokenCost {
    uint64_t weight_bytes = 0;
    uint64_t macs = 0;
    uint64_t float_macs = 0;  // of those, on weights matmul multiplies in float (FMA, not int8)
  };
  TokenCost token_cost() const;

 private:
  Model(HParams hparams, std::string path, std::unique_ptr<ModelWeights> weights);

  HParams hparams_;
  std::string path_;
  std::unique_ptr<ModelWeights> weights_;
  // What repack_weights repacks, in order (views of weights_, which a const
  // Model does not make const: only repack and adopt write through them).
  std::vector<kernels::WeightView*> panel_views() const;
  // True when the output head is the token embeddings (tied) and of a float
  // type: embedding lookups can then read its panels instead of the File.
  bool tied_float_head() const;
  std::shared_ptr<const uint8_t>
      repacked_;  // [repacked_bytes_] the panels of every matrix (mmap'd)
  size_t repacked_bytes_ = 0;
};

// The KV layout a model needs, with entries of kv_type (F32 or F16).
KvLayout kv_layout_for(const HParams& hparams, DType kv_type, int block_tokens = 16);

// One sequence's share of a forward step: `tokens` go at positions
// [seq->n_tokens, seq->n_tokens + tokens.size()).
struct SeqTokens {
  KvSequence* seq = nullptr;
  std::span<const int32_t> tokens;
  // [n_vocab] receives the logits after the last of `tokens`; empty = none
  // wanted (e.g. a prefill chunk that is not the prompt's last).
  std::span<float> logits;
};

// Runs the forward pass of one model over KV sequences in a pool.
//
// Invariance (docs/invariance.md): the logits and K/V of a token depend only
// on the model, the KV element type, and the token ids and positions of its
// own sequence: not on the thread count, the ISA, the other sequences of a
// step, or how a prompt was split into steps. Every kernel computes each
// value in one canonical order, and work is split along independent outputs.
//
// Owns scratch activations sized for at most kMaxBatch tokens per internal
// step (longer inputs are processed kMaxBatch tokens at a time).
// Borrows the model, the pool and the thread pool; all must outlive it.
// Not thread-safe: one thread drives a ForwardContext at a time.
class ForwardContext {
 public:
  static constexpr int kMaxBatch = 512;

  // n_ctx: the most positions a sequence may reach (>= 1). isa: the kernels
  // to use (default: isa_from_env(), i.e. ENCORE_ISA or the best the CPU
  // has). Throws InvalidArgument if n_ctx < 1, the ISA is unsupported here or
  // the pool's layout does not match the model (layers, KV heads, head size).
  ForwardContext(const Model& model, KvBlockPool& pool, ThreadPool& threads, int n_ctx,
                 std::optional<Isa> isa = std::nullopt);
  ~ForwardContext();
  ForwardContext(const ForwardContext&) = delete;
  ForwardContext& operator=(const ForwardContext&) = delete;

  int32_t n_ctx() const { return n_ctx_; }
  Isa isa() const { return isa_; }
  const Model& model() const { return model_; }
  KvBlockPool& pool() const { return pool_; }

  // One step over several sequences at once (continuous batching: some may
  // be prefilling, some decoding). Appends each entry's K/V to its sequence
  // (allocating blocks from the pool), advances seq->n_tokens and fills the
  // requested logits.
  // Throws InvalidArgument (an entry without tokens, the same sequence twice,
  // positions past n_ctx, token id out of range, logits of the wrong size) or
  // ResourceExhausted (KV pool full); in every case all sequences are left as
  // they were (the logits buffers of entries may have been written). The blocks that receive new
  // positions must not be shared with another sequence (refcount 1; std::logic_error otherwise).
  void step(std::span<const SeqTokens> batch);

  // step() for one sequence, with the last token's logits in logits_last.
  void eval(KvSequence& seq, std::span<const int32_t> tokens, std::span<float> logits_last);

 private:
  struct TokenRef;
  void run_tokens(const TokenRef* toks, int n);
  void attention(const TokenRef* toks, int n, int layer);

  const Model& model_;
  KvBlockPool& pool_;
  ThreadPool& threads_;
  const int32_t n_ctx_;
  const Isa isa_;

  // Scratch, reused by every call (grown to the largest step seen).
  std::vector<float> x_;                  // [n, n_embd] residual stream
  std::vector<float> xb_;                 // [n, n_embd] normed input of a sub-layer
  std::vector<float> xb2_;                // [n, n_embd] output of a sub-layer
  std::vector<float> q_;                  // [n, n_head * head_dim]
  std::vector<float> k_;                  // [n, n_head_kv * head_dim]
  std::vector<float> v_;                  // [n, n_head_kv * head_dim]
  std::vector<float> att_;                // [n, n_head * head_dim] attention output
  std::vector<float> gate_;               // [n, n_ff]
  std::vector<float> up_;                 // [n, n_ff]
  std::vector<float> scores_;             // [threads, run, group, visible] probabilities
  std::vector<float> rope_cos_;           // [n, n_rot / 2] RoPE angles per token
  std::vector<float> rope_sin_;           // [n, n_rot / 2]
  std::vector<float> out_x_;              // [n_out, n_embd] final normed rows needing logits
  std::vector<float> out_logits_;         // [n_out, n_vocab]
  std::vector<const uint8_t*> k_blocks_;  // [n_seq_in_step, max blocks] K block pointers of a layer
  std::vector<const uint8_t*> v_blocks_;  // [n_seq_in_step, max blocks] V block pointers
  std::unique_ptr<kernels::MatmulScratch> mm_scratch_;  // the matmuls' buffers
};

}  // namespace encore
