// Model loading: architecture dispatch.
#include <fmt/format.h>

#include <algorithm>
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
