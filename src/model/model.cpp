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
#include "kernels/panel.h"
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

std::vector<kernels::WeightView*> Model::panel_views() const {
  std::vector<kernels::WeightView*> views;
  for (LayerWeights& l : weights_->layers) {
    for (kernels::WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      if (kernels::repacked_bytes(v->type, v->rows, v->cols) > 0) views.push_back(v);
    }
  }
  kernels::WeightView& out = weights_->output;
  if (kernels::repacked_bytes(out.type, out.rows, out.cols) > 0) views.push_back(&out);
  return views;
}

namespace {

// Each matrix's panels start on a 64-byte boundary (a cache line).
size_t cache_lines(size_t n) { return (n + 63) / 64 * 64; }

// The size of a block of panels laid out as `layout` says.
size_t block_bytes(const std::vector<Model::PanelMatrix>& layout) {
  return layout.empty() ? 0 : layout.back().offset + cache_lines(layout.back().bytes);
}

}  // namespace

std::vector<Model::PanelMatrix> Model::panel_layout() const {
  std::vector<PanelMatrix> layout;
  size_t offset = 0;
  for (const kernels::WeightView* v : panel_views()) {
    PanelMatrix p;
    p.type = v->type;
    p.rows = v->rows;
    p.cols = v->cols;
    p.offset = offset;
    p.bytes = kernels::repacked_bytes(v->type, v->rows, v->cols);
    offset += cache_lines(p.bytes);
    layout.push_back(p);
  }
  return layout;
}

size_t Model::panel_block_bytes() const { return block_bytes(panel_layout()); }

bool Model::tied_float_head() const {
  const kernels::WeightView &embd = weights_->token_embd, &out = weights_->output;
  return out.data == embd.data && kernels::repacked_bytes(out.type, out.rows, out.cols) > 0 &&
         !kernels::matmul_uses_int8(out.type);
}

void Model::adopt_panels(std::shared_ptr<const uint8_t> block, size_t bytes) {
  const std::vector<PanelMatrix> layout = panel_layout();
  const size_t want = block_bytes(layout);
  if (bytes != want || (want > 0 && block == nullptr)) {
    throw std::logic_error(
        fmt::format("{}: a block of {} bytes of panels, expected {}", path_, bytes, want));
  }
  const std::vector<kernels::WeightView*> views = panel_views();
  for (size_t i = 0; i < views.size(); ++i) views[i]->panels = block.get() + layout[i].offset;
  // A tied float head's embedding lookups read its panels (exact copies), so
  // its file bytes can be given back like any other matrix's.
  if (tied_float_head()) weights_->token_embd.panels = weights_->output.panels;
  repacked_ = std::move(block);
  repacked_bytes_ = bytes;
}

void Model::repack_weights(ThreadPool& pool,
                           const std::function<void(std::span<const uint8_t>)>& release) {
  if (repacked_ != nullptr) return;  // once: views in use must not move
  const std::vector<PanelMatrix> layout = panel_layout();
  const size_t total = block_bytes(layout);
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
  std::shared_ptr<const uint8_t> block(static_cast<uint8_t*>(mem), [total](const uint8_t* p) {
    ::munmap(const_cast<uint8_t*>(p), total);
  });
  const std::vector<kernels::WeightView*> views = panel_views();
  const uint8_t* embd = weights_->token_embd.data;
  for (size_t i = 0; i < views.size(); ++i) {
    const kernels::WeightView& v = *views[i];
    uint8_t* dst = static_cast<uint8_t*>(mem) + layout[i].offset;
    pool.parallel_for(kernels::panel_count(v.rows),
                      [&](int64_t p0, int64_t p1, int) { kernels::repack_panels(v, dst, p0, p1); });
    // A tied quantised head's bytes are the embeddings, which lookups still
    // read (a float one's lookups read its panels: adopt_panels).
    if (release && (v.data != embd || tied_float_head())) {
      release({v.data, static_cast<size_t>(v.rows) * v.row_bytes});
    }
  }
  adopt_panels(std::move(block), total);
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
