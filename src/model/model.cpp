// Model loading (architecture dispatch) and the architecture-independent
// part of ForwardContext: argument checks, KV block reservation, batching.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/model.h"
#include "encore/thread_pool.h"
#include "model/loader.h"
#include "model/weights.h"

namespace encore {

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> kArchs = {"llama"};
  return kArchs;
}

Model::Model(HParams hparams, std::string path, std::unique_ptr<ModelWeights> weights)
    : hparams_(std::move(hparams)), path_(std::move(path)), weights_(std::move(weights)) {}

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const gguf::File& file) {
  const std::string& arch = file.get_string("general.architecture");
  HParams hp;
  std::unique_ptr<ModelWeights> weights;
  if (arch == "llama") {
    weights = model_detail::load_llama(file, &hp);
  } else {
    throw ModelError(fmt::format("{}: architecture '{}' is not supported (supported: {})",
                                 file.path(), arch, fmt::join(supported_architectures(), ", ")));
  }
  return std::unique_ptr<Model>(new Model(std::move(hp), file.path(), std::move(weights)));
}

KvLayout kv_layout_for(const HParams& hparams, int block_tokens) {
  KvLayout layout;
  layout.n_layer = hparams.n_layer;
  layout.n_kv_heads = hparams.n_head_kv;
  layout.head_dim = hparams.head_dim;
  layout.block_tokens = block_tokens;
  layout.elem_type = DType::F32;
  return layout;
}

ForwardContext::ForwardContext(const Model& model, KvBlockPool& pool, ThreadPool& threads,
                               int n_ctx)
    : model_(model), pool_(pool), threads_(threads), n_ctx_(n_ctx) {
  const HParams& hp = model.hparams();
  if (n_ctx < 1) {
    throw InvalidArgument(fmt::format("context size {} must be at least 1", n_ctx));
  }
  const KvLayout& l = pool.layout();
  if (l.n_layer != hp.n_layer || l.n_kv_heads != hp.n_head_kv || l.head_dim != hp.head_dim ||
      l.elem_type != DType::F32) {
    throw InvalidArgument(fmt::format(
        "KV pool layout (layers {}, KV heads {}, head size {}, {}) does not fit the model "
        "{} (layers {}, KV heads {}, head size {}, F32)",
        l.n_layer, l.n_kv_heads, l.head_dim, dtype_name(l.elem_type), model.path(), hp.n_layer,
        hp.n_head_kv, hp.head_dim));
  }
  scores_.resize(static_cast<size_t>(threads.size()) * static_cast<size_t>(n_ctx));
  const size_t max_blocks = static_cast<size_t>((n_ctx + l.block_tokens - 1) / l.block_tokens);
  k_blocks_.reserve(max_blocks);
  v_blocks_.reserve(max_blocks);
}

ForwardContext::~ForwardContext() = default;

void ForwardContext::eval(KvSequence& seq, std::span<const int32_t> tokens,
                          std::span<float> logits_last) {
  const HParams& hp = model_.hparams();
  if (tokens.empty()) throw InvalidArgument("eval: no tokens to evaluate");
  if (logits_last.size() != static_cast<size_t>(hp.n_vocab)) {
    throw InvalidArgument(
        fmt::format("eval: the logits buffer has {} entries, expected n_vocab = {}",
                    logits_last.size(), hp.n_vocab));
  }
  const int64_t total = static_cast<int64_t>(seq.n_tokens) + static_cast<int64_t>(tokens.size());
  if (total > n_ctx_) {
    throw InvalidArgument(
        fmt::format("prompt of {} token{} + {} cached exceeds the context size {}", tokens.size(),
                    tokens.size() == 1 ? "" : "s", seq.n_tokens, n_ctx_));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= hp.n_vocab) {
      throw InvalidArgument(
          fmt::format("token id {} at index {} is out of range [0, {})", tokens[i], i, hp.n_vocab));
    }
  }

  // On any failure below, give back the blocks reserved here so that the
  // sequence is left as it was.
  const size_t blocks_before = seq.blocks.size();
  auto undo_reserve = [&] {
    while (seq.blocks.size() > blocks_before) {
      pool_.release(seq.blocks.back());
      seq.blocks.pop_back();
    }
  };
  seq.reserve(pool_, static_cast<int32_t>(total));

  // Writing K/V into a block another sequence also references would change
  // that sequence's past.
  const int bt = pool_.layout().block_tokens;
  for (size_t b = static_cast<size_t>(seq.n_tokens / bt); b < seq.blocks.size(); ++b) {
    if (pool_.refcount(seq.blocks[b]) != 1) {
      const std::string msg = fmt::format(
          "eval: KV block {} (positions from {}) is shared by {} sequences; writing to a "
          "shared block needs copy-on-write",
          seq.blocks[b], b * static_cast<size_t>(bt), pool_.refcount(seq.blocks[b]));
      undo_reserve();
      throw std::logic_error(msg);
    }
  }

  try {
    const int64_t n = static_cast<int64_t>(tokens.size());
    for (int64_t start = 0; start < n; start += kMaxBatch) {
      const int count = static_cast<int>(std::min<int64_t>(kMaxBatch, n - start));
      const bool last = start + count == n;
      eval_batch(seq, tokens.data() + start, count, static_cast<int32_t>(seq.n_tokens + start),
                 last ? logits_last.data() : nullptr);
    }
  } catch (...) {
    undo_reserve();
    throw;
  }
  seq.n_tokens = static_cast<int32_t>(total);
}

}  // namespace encore
