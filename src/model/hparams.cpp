// Hyper-parameter and tensor loading helpers shared by the architectures.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "encore/error.h"
#include "kernels/quants.h"
#include "model/loader.h"
#include "util/text.h"

namespace encore::model_detail {
namespace {

// Generous upper bounds: they only exist so that absurd values from an
// untrusted file fail here with a clear message instead of overflowing a
// size computation later.
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // n_embd, n_ff
constexpr int64_t kMaxHeads = 4096;              // n_head, n_head_kv, head_dim
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxCtx = INT32_MAX;

int checked(const gguf::File& file, const std::string& key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    throw ModelError(
        fmt::format("{}: {} = {} is out of range [{}, {}]", file.path(), key, v, lo, hi));
  }
  return static_cast<int>(v);
}

int required_int(const gguf::File& file, const std::string& key, int64_t lo, int64_t hi) {
  return checked(file, key, file.get_u32(key), lo, hi);
}

std::optional<int> optional_int(const gguf::File& file, const std::string& key, int64_t lo,
                                int64_t hi) {
  const std::optional<uint32_t> v = file.opt_u32(key);
  if (!v) return std::nullopt;
  return checked(file, key, *v, lo, hi);
}

}  // namespace

HParams read_common_hparams(const gguf::File& file, const std::string& arch) {
  const std::string p = arch + ".";
  HParams hp;
  hp.arch = arch;
  hp.n_ctx_train = required_int(file, p + "context_length", 1, kMaxCtx);
  hp.n_embd = required_int(file, p + "embedding_length", 1, kMaxWidth);
  hp.n_layer = required_int(file, p + "block_count", 1, kMaxLayers);
  hp.n_ff = required_int(file, p + "feed_forward_length", 1, kMaxWidth);
  hp.n_head = required_int(file, p + "attention.head_count", 1, kMaxHeads);
  hp.n_head_kv =
      optional_int(file, p + "attention.head_count_kv", 1, kMaxHeads).value_or(hp.n_head);
  if (hp.n_head % hp.n_head_kv != 0) {
    throw ModelError(fmt::format(
        "{}: {}attention.head_count = {} is not a multiple of {}attention.head_count_kv = {}",
        file.path(), p, hp.n_head, p, hp.n_head_kv));
  }

  // head_dim: explicit key_length, else n_embd / n_head (llama.cpp's rule).
  if (const std::optional<int> k = optional_int(file, p + "attention.key_length", 1, kMaxHeads)) {
    hp.head_dim = *k;
  } else {
    if (hp.n_embd % hp.n_head != 0) {
      throw ModelError(fmt::format(
          "{}: {}embedding_length = {} is not a multiple of {}attention.head_count = {} and "
          "{}attention.key_length is absent",
          file.path(), p, hp.n_embd, p, hp.n_head, p));
    }
    hp.head_dim = hp.n_embd / hp.n_head;
  }
  if (const std::optional<int> v = optional_int(file, p + "attention.value_length", 1, kMaxHeads)) {
    if (*v != hp.head_dim) {
      throw ModelError(fmt::format(
          "{}: {}attention.value_length = {} differs from the key length {}; not supported",
          file.path(), p, *v, hp.head_dim));
    }
  }

  hp.n_rot = optional_int(file, p + "rope.dimension_count", 1, kMaxHeads).value_or(hp.head_dim);
  if (hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0) {
    throw ModelError(
        fmt::format("{}: {}rope.dimension_count = {} must be even and <= the head "
                    "size {}",
                    file.path(), p, hp.n_rot, hp.head_dim));
  }

  hp.rms_eps = file.opt_f32(p + "attention.layer_norm_rms_epsilon").value_or(1e-5f);
  if (!std::isfinite(hp.rms_eps) || hp.rms_eps < 0.0f) {
    throw ModelError(fmt::format("{}: {}attention.layer_norm_rms_epsilon = {} must be >= 0",
                                 file.path(), p, hp.rms_eps));
  }
  hp.rope_freq_base = file.opt_f32(p + "rope.freq_base").value_or(10000.0f);
  if (!std::isfinite(hp.rope_freq_base) || hp.rope_freq_base <= 0.0f) {
    throw ModelError(
        fmt::format("{}: {}rope.freq_base = {} must be > 0", file.path(), p, hp.rope_freq_base));
  }
  // RoPE scaling changes every angle; computing without it would silently
  // give other logits than the model was trained for. As in llama.cpp, the
  // factor comes from rope.scaling.factor, else the older rope.scale_linear;
  // 0 (or absent) means none, and an absent type means "linear". Type "none"
  // means no scaling whatever the factor says (llama.cpp: "never scale if
  // scaling type is none"); the factor is still range-checked. YaRN,
  // LongRoPE & co. change more than the positions and are refused. (Llama 3.1's "llama3" scaling is
  // no type here: converters bake it into the rope_freqs.weight tensor, see read_rope_freqs.)
  const std::optional<std::string> scaling = file.opt_string(p + "rope.scaling.type");
  if (scaling && *scaling != "none" && *scaling != "linear") {
    throw ModelError(
        fmt::format("{}: {}rope.scaling.type = '{}' is not supported (supported: none, linear)",
                    file.path(), p, util::printable(*scaling)));
  }
  std::string factor_key = p + "rope.scaling.factor";
  std::optional<float> factor = file.opt_f32(factor_key);
  if (!factor) {
    factor_key = p + "rope.scale_linear";
    factor = file.opt_f32(factor_key);
  }
  if (factor && *factor != 0.0f) {
    // Bounded so that the scaled angles stay meaningful floats.
    if (!std::isfinite(*factor) || *factor < 1e-3f || *factor > 1e6f) {
      throw ModelError(fmt::format("{}: {} = {} is out of range [0.001, 1e6] (or 0 for none)",
                                   file.path(), factor_key, *factor));
    }
    if (!scaling || *scaling == "linear") hp.rope_freq_scale = 1.0f / *factor;
  }

  // Vocabulary size: explicit key, else the tokenizer's token list, else the
  // embedding matrix (validated against token_embd by the architecture).
  if (const std::optional<int> v = optional_int(file, p + "vocab_size", 1, kMaxVocab)) {
    hp.n_vocab = *v;
  } else if (const gguf::Value* tokens = file.find("tokenizer.ggml.tokens");
             tokens != nullptr && tokens->type == gguf::ValueType::ARRAY) {
    hp.n_vocab = checked(file, "length of tokenizer.ggml.tokens",
                         static_cast<int64_t>(tokens->arr.size()), 1, kMaxVocab);
  } else {
    const gguf::TensorInfo& emb = file.tensor("token_embd.weight");
    const int64_t rows = emb.dims.size() >= 2 ? static_cast<int64_t>(emb.dims[1]) : 0;
    hp.n_vocab = checked(file, "rows of token_embd.weight", rows, 1, kMaxVocab);
  }
  return hp;
}

const gguf::TensorInfo& TensorReader::find(const std::string& name) const {
  const gguf::TensorInfo* t = file_.find_tensor(name);
  if (t == nullptr) {
    throw ModelError(fmt::format("{}: missing tensor '{}'", file_.path(), name));
  }
  return *t;
}

void TensorReader::check_shape(const gguf::TensorInfo& t, const std::vector<int64_t>& expected,
                               const char* what) const {
  bool ok = t.dims.size() == expected.size();
  for (size_t i = 0; ok && i < expected.size(); ++i) {
    ok = static_cast<int64_t>(t.dims[i]) == expected[i];
  }
  if (!ok) {
    const std::vector<uint64_t> want(expected.begin(), expected.end());  // all >= 1
    throw ModelError(fmt::format("{}: tensor '{}' has shape {}, expected {} = {}", file_.path(),
                                 t.name, gguf::shape_string(t.dims), what,
                                 gguf::shape_string(want)));
  }
}

void TensorReader::check_type(const gguf::TensorInfo& t) const {
  const DTypeInfo& info = dtype_info(t.type);
  if (!info.can_dequantize || !kernels::row_conversion_supported(t.type)) {
    throw ModelError(fmt::format("{}: tensor '{}' has type {}, which Encore cannot compute with",
                                 file_.path(), t.name, info.name));
  }
  if (!t.dims.empty() && t.dims[0] % info.block_elems != 0) {
    throw ModelError(
        fmt::format("{}: tensor '{}' rows of {} values are not a multiple of the {} "
                    "block size {}",
                    file_.path(), t.name, t.dims[0], info.name, info.block_elems));
  }
}

kernels::WeightView TensorReader::matrix(const std::string& name, int64_t cols, int64_t rows,
                                         const char* what) {
  const gguf::TensorInfo& t = find(name);
  check_shape(t, {cols, rows}, what);
  check_type(t);
  // A file may declare general.alignment 1 or 2; F32 matrices are still
  // required to be float-aligned (they were once read in place as floats,
  // and other readers of the file may do so).
  if (t.type == DType::F32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) != 0) {
    throw ModelError(fmt::format(
        "{}: tensor '{}' (F32) starts at byte {}, which is not a multiple of 4 "
        "(general.alignment = {}); F32 weights must be 4-byte aligned: rewrite the file with "
        "the default alignment of 32",
        file_.path(), t.name, file_.data_section_offset() + t.data_offset, file_.alignment()));
  }
  used_.insert(name);
  kernels::WeightView w;
  w.type = t.type;
  w.data = t.data;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = static_cast<size_t>(dtype_row_bytes(t.type, static_cast<uint64_t>(cols)));
  return w;
}

kernels::WeightView TensorReader::optional_matrix(const std::string& name, int64_t cols,
                                                  int64_t rows, const char* what) {
  if (file_.find_tensor(name) == nullptr) return {};
  return matrix(name, cols, rows, what);
}

std::vector<float> TensorReader::vector(const std::string& name, int64_t n, const char* what) {
  const gguf::TensorInfo& t = find(name);
  check_shape(t, {n}, what);
  check_type(t);
  used_.insert(name);
  std::vector<float> out(static_cast<size_t>(n));
  kernels::dequantize_row(t.type, t.data, out.data(), n);
  return out;
}

std::vector<float> TensorReader::optional_vector(const std::string& name, int64_t n,
                                                 const char* what) {
  if (file_.find_tensor(name) == nullptr) return {};
  return vector(name, n, what);
}

void TensorReader::check_all_used(const std::string& arch) const {
  for (const gguf::TensorInfo& t : file_.tensors()) {
    if (used_.find(t.name) == used_.end()) {
      throw ModelError(fmt::format(
          "{}: tensor '{}' is not part of the '{}' architecture as Encore implements it "
          "(an unsupported variant of the model?)",
          file_.path(), util::printable(t.name), arch));
    }
  }
}

std::unique_ptr<ModelWeights> read_llama_like_weights(TensorReader& tr, HParams* hp) {
  const int64_t n_embd = hp->n_embd;
  const int64_t n_q = static_cast<int64_t>(hp->n_head) * hp->head_dim;
  const int64_t n_kv = static_cast<int64_t>(hp->n_head_kv) * hp->head_dim;
  const int64_t n_ff = hp->n_ff;

  auto w = std::make_unique<ModelWeights>();
  w->token_embd = tr.matrix("token_embd.weight", n_embd, hp->n_vocab, "[n_embd, n_vocab]");
  w->output_norm = tr.vector("output_norm.weight", n_embd, "[n_embd]");
  w->output = tr.optional_matrix("output.weight", n_embd, hp->n_vocab, "[n_embd, n_vocab]");
  hp->tied_output = w->output.data == nullptr;
  if (hp->tied_output) w->output = w->token_embd;

  w->layers.resize(static_cast<size_t>(hp->n_layer));
  for (int i = 0; i < hp->n_layer; ++i) {
    LayerWeights& l = w->layers[static_cast<size_t>(i)];
    const std::string p = fmt::format("blk.{}.", i);
    l.attn_norm = tr.vector(p + "attn_norm.weight", n_embd, "[n_embd]");
    l.wq = tr.matrix(p + "attn_q.weight", n_embd, n_q, "[n_embd, n_head * head_dim]");
    l.wk = tr.matrix(p + "attn_k.weight", n_embd, n_kv, "[n_embd, n_head_kv * head_dim]");
    l.wv = tr.matrix(p + "attn_v.weight", n_embd, n_kv, "[n_embd, n_head_kv * head_dim]");
    l.wo = tr.matrix(p + "attn_output.weight", n_q, n_embd, "[n_head * head_dim, n_embd]");
    l.ffn_norm = tr.vector(p + "ffn_norm.weight", n_embd, "[n_embd]");
    l.w_gate = tr.matrix(p + "ffn_gate.weight", n_embd, n_ff, "[n_embd, n_ff]");
    l.w_up = tr.matrix(p + "ffn_up.weight", n_embd, n_ff, "[n_embd, n_ff]");
    l.w_down = tr.matrix(p + "ffn_down.weight", n_ff, n_embd, "[n_ff, n_embd]");
  }
  return w;
}

std::vector<float> read_rope_freqs(TensorReader& tr, const HParams& hp) {
  const char* name = "rope_freqs.weight";
  std::vector<float> f = tr.optional_vector(name, hp.n_rot / 2, "[n_rot / 2]");
  for (size_t i = 0; i < f.size(); ++i) {
    // Each is a divisor of a rotation frequency: 0, negative or NaN would
    // give infinite or meaningless angles.
    if (!std::isfinite(f[i]) || f[i] <= 0.0f) {
      throw ModelError(fmt::format("{}: tensor '{}' value {} at index {} must be finite and > 0",
                                   tr.file().path(), name, f[i], i));
    }
  }
  return f;
}

}  // namespace encore::model_detail
