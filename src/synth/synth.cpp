#include "encore/synth.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/thread_pool.h"
#include "kernels/quants.h"
#include "synth/builtin_vocab.h"

namespace encore {
namespace {

// SplitMix64's finaliser: a bijective 64-bit mix, the building block of the
// per-element random function below.
uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct TensorPlan {
  std::string name;
  DType type;
  int64_t cols;  // row length (dims[0])
  int64_t rows;  // 1 for vectors
  float scale;   // std of the weights = scale / sqrt(cols); 0 = all ones (norms)
};

// Weights of one tensor, quantised row by row, in parallel over rows.
// Element (r, c) = uniform(-a, a) from mix64(key + r * cols + c), so the bytes
// do not depend on the thread count.
void fill_tensor(const TensorPlan& t, uint64_t key, ThreadPool& pool, uint8_t* dst) {
  const uint64_t row_bytes = dtype_row_bytes(t.type, static_cast<uint64_t>(t.cols));
  // sqrt(3) turns a uniform's half-width into its standard deviation.
  const float a = t.scale * std::sqrt(3.0f) / std::sqrt(static_cast<float>(t.cols));
  pool.parallel_for(t.rows, [&](int64_t begin, int64_t end, int) {
    std::vector<float> row(static_cast<size_t>(t.cols));  // [cols]
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t c = 0; c < t.cols; ++c) {
        if (t.scale == 0.0f) {
          row[c] = 1.0f;
          continue;
        }
        const uint64_t bits = mix64(key + static_cast<uint64_t>(r * t.cols + c));
        const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        row[c] = (2.0f * u - 1.0f) * a;
      }
      kernels::quantize_row(t.type, row.data(), dst + static_cast<uint64_t>(r) * row_bytes, t.cols);
    }
  });
}

std::vector<TensorPlan> plan_llama(const SynthShape& s, DType type) {
  const int head_dim = s.n_embd / s.n_head;
  const int64_t n_embd_kv = static_cast<int64_t>(head_dim) * s.n_head_kv;
  std::vector<TensorPlan> plan;
  // Embedding rows feed an RMSNorm, so their scale is free; 1.0 also gives
  // tied-output logits of unit spread. A separate head gets 2.0 so the
  // next-token distribution is peaked enough to be interesting.
  plan.push_back({"token_embd.weight", type, s.n_embd, s.n_vocab, 1.0f});
  plan.push_back({"output_norm.weight", DType::F32, s.n_embd, 1, 0.0f});
  if (!s.tied_output) plan.push_back({"output.weight", type, s.n_embd, s.n_vocab, 2.0f});
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    plan.push_back({p + "attn_norm.weight", DType::F32, s.n_embd, 1, 0.0f});
    plan.push_back({p + "attn_q.weight", type, s.n_embd, s.n_embd, 1.0f});
    plan.push_back({p + "attn_k.weight", type, s.n_embd, n_embd_kv, 1.0f});
    plan.push_back({p + "attn_v.weight", type, s.n_embd, n_embd_kv, 1.0f});
    plan.push_back({p + "attn_output.weight", type, s.n_embd, s.n_embd, 1.0f});
    plan.push_back({p + "ffn_norm.weight", DType::F32, s.n_embd, 1, 0.0f});
    plan.push_back({p + "ffn_gate.weight", type, s.n_embd, s.n_ff, 1.0f});
    plan.push_back({p + "ffn_down.weight", type, s.n_ff, s.n_embd, 1.0f});
    plan.push_back({p + "ffn_up.weight", type, s.n_embd, s.n_ff, 1.0f});
  }
  return plan;
}

}  // namespace

std::vector<std::string> synth_presets() { return {"tiny", "125m", "1b"}; }

SynthShape synth_shape(const std::string& preset) {
  // Row lengths (n_embd, n_ff) are multiples of 256 so every K-quant fits.
  if (preset == "tiny") return {"tiny", 512, 512, 256, 2, 4, 2, 768, true};
  // GPT-2-small scale with Llama's GQA layout.
  if (preset == "125m") return {"125m", 32000, 2048, 768, 12, 12, 4, 2048, false};
  // TinyLlama-1.1B.
  if (preset == "1b") return {"1b", 32000, 2048, 2048, 22, 32, 4, 5632, false};
  throw InvalidArgument(fmt::format("unknown synth preset '{}' (known: {})", preset,
                                    fmt::join(synth_presets(), ", ")));
}

SynthSummary synth_model(const SynthOptions& options, const std::string& path, ThreadPool& pool) {
  if (options.arch != "llama") {
    throw InvalidArgument(
        fmt::format("encore synth: unknown --arch '{}' (supported: llama)", options.arch));
  }
  const DTypeInfo& info = dtype_info(options.type);
  if (!info.can_dequantize) {
    throw InvalidArgument(fmt::format(
        "encore synth: --type {} is not supported (use F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
        "Q5_1, Q4_K, Q5_K or Q6_K)",
        info.name));
  }
  SynthShape shape = synth_shape(options.preset);

  gguf::Writer writer;
  std::vector<std::pair<std::string, gguf::Value>> vocab_kv;
  if (options.vocab_from.empty()) {
    vocab_kv = synth::builtin_vocab_metadata(shape.n_vocab);
  } else {
    gguf::File vocab_file = gguf::File::open(options.vocab_from, gguf::LoadMode::Mmap);
    for (const gguf::KeyValue& kv : vocab_file.metadata()) {
      if (kv.key.rfind("tokenizer.", 0) == 0) vocab_kv.emplace_back(kv.key, kv.value);
    }
    const gguf::Value* tokens = vocab_file.find("tokenizer.ggml.tokens");
    if (tokens == nullptr || tokens->type != gguf::ValueType::ARRAY || tokens->arr.empty()) {
      throw InvalidArgument(fmt::format(
          "encore synth: --vocab-from {} has no tokenizer.ggml.tokens array to copy",
          options.vocab_from));
    }
    shape.n_vocab = static_cast<int>(tokens->arr.size());
  }

  const std::vector<TensorPlan> plan = plan_llama(shape, options.type);
  for (const TensorPlan& t : plan) {
    if (t.cols % info.block_elems != 0) {
      throw InvalidArgument(fmt::format(
          "encore synth: type {} needs row lengths divisible by {}, but {} has rows of {}",
          info.name, info.block_elems, t.name, t.cols));
    }
  }

  const int head_dim = shape.n_embd / shape.n_head;
  writer.set("general.architecture", gguf::Value::make_string("llama"));
  writer.set("general.name", gguf::Value::make_string("encore-synth-" + shape.preset));
  writer.set("general.description",
             gguf::Value::make_string("random weights made by `encore synth`: its text is noise"));
  writer.set("encore.synthetic", gguf::Value::make_bool(true));
  writer.set("encore.synth.preset", gguf::Value::make_string(shape.preset));
  writer.set("encore.synth.seed", gguf::Value::make_u64(options.seed));
  writer.set("llama.vocab_size", gguf::Value::make_u32(shape.n_vocab));
  writer.set("llama.context_length", gguf::Value::make_u32(shape.n_ctx));
  writer.set("llama.embedding_length", gguf::Value::make_u32(shape.n_embd));
  writer.set("llama.block_count", gguf::Value::make_u32(shape.n_layer));
  writer.set("llama.feed_forward_length", gguf::Value::make_u32(shape.n_ff));
  writer.set("llama.attention.head_count", gguf::Value::make_u32(shape.n_head));
  writer.set("llama.attention.head_count_kv", gguf::Value::make_u32(shape.n_head_kv));
  writer.set("llama.attention.layer_norm_rms_epsilon", gguf::Value::make_f32(1e-5f));
  writer.set("llama.rope.freq_base", gguf::Value::make_f32(10000.0f));
  writer.set("llama.rope.dimension_count", gguf::Value::make_u32(head_dim));
  for (auto& [key, value] : vocab_kv) writer.set(key, std::move(value));

  SynthSummary summary;
  summary.shape = shape;
  const uint64_t seed_key = mix64(options.seed);
  for (size_t k = 0; k < plan.size(); ++k) {
    const TensorPlan& t = plan[k];
    summary.n_params += static_cast<uint64_t>(t.cols) * static_cast<uint64_t>(t.rows);
    std::vector<uint64_t> dims = {static_cast<uint64_t>(t.cols)};
    if (t.rows > 1) dims.push_back(static_cast<uint64_t>(t.rows));
    const uint64_t key = mix64(seed_key ^ mix64(k + 1));
    writer.add_tensor(t.name, t.type, dims, [t, key, &pool](uint8_t* dst, uint64_t) {
      fill_tensor(t, key, pool, dst);
    });
  }
  writer.write(path);
  summary.file_bytes = std::filesystem::file_size(path);
  return summary;
}

}  // namespace encore
