// Model loading: architecture dispatch.
#include <fmt/format.h>

#include <sys/mman.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/model.h"
#include "encore/thread_pool.h"
#include "model/loader.h"
#include "model/weights.h"
#include "util/text.h"

namespace encore {

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> kArchs = {"llama", "qwen2", "qwen3"};
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
  } else if (arch == "qwen2") {
    weights = model_detail::load_qwen2(file, &hp);
  } else if (arch == "qwen3") {
    weights = model_detail::load_qwen3(file, &hp);
  } else {
    throw ModelError(fmt::format("{}: architecture '{}' is not supported (supported: {})",
                                 file.path(), util::printable(arch),
                                 fmt::join(supported_architectures(), ", ")));
  }
  return std::unique_ptr<Model>(new Model(std::move(hp), file.path(), std::move(weights)));
}

void Model::repack_weights(ThreadPool& pool) {
  if (repacked_ != nullptr) return;  // once: views in use must not move
  std::vector<kernels::WeightView*> views;
  for (LayerWeights& l : weights_->layers) {
    for (kernels::WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      views.push_back(v);
    }
  }
  views.push_back(&weights_->output);
  // Each matrix's panels start on a 64-byte boundary (a cache line).
  auto aligned = [](size_t n) { return (n + 63) / 64 * 64; };
  size_t total = 0;
  for (const kernels::WeightView* v : views) {
    total += aligned(kernels::repacked_bytes(v->type, v->rows, v->cols));
  }
  if (total == 0) return;
  // Anonymous pages, in huge pages where the kernel allows: the first touch
  // of ~1 GB in 4 KiB pages was most of the load time (page faults and the
  // kernel zeroing each page).
  void* mem = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    throw ModelError(fmt::format("{}: cannot allocate {} MiB for the repacked weights: {}", path_,
                                 total >> 20, std::strerror(errno)));
  }
  ::madvise(mem, total, MADV_HUGEPAGE);  // advice only: without it, 4 KiB pages
  repacked_ = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(mem),
                                       [total](uint8_t* p) { ::munmap(p, total); });
  repacked_bytes_ = total;
  uint8_t* dst = repacked_.get();
  for (kernels::WeightView* v : views) {
    const size_t n = kernels::repacked_bytes(v->type, v->rows, v->cols);
    if (n == 0) continue;
    const int64_t n_panels = (v->rows + 15) / 16;
    pool.parallel_for(
        n_panels, [&](int64_t p0, int64_t p1, int) { kernels::repack_panels(*v, dst, p0, p1); });
    v->panels = dst;
    dst += aligned(n);
  }
}

KvLayout kv_layout_for(const HParams& hparams, DType kv_type, int block_tokens) {
  KvLayout layout;
  layout.n_layer = hparams.n_layer;
  layout.n_kv_heads = hparams.n_head_kv;
  layout.head_dim = hparams.head_dim;
  layout.block_tokens = block_tokens;
  layout.elem_type = kv_type;
  return layout;
}

}  // namespace encore
