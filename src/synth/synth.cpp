#include "encore/synth.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string_view>

#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/thread_pool.h"
#include "kernels/ops_math.h"
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

// How a tensor's elements are made.
enum class Fill {
  Ones,     // all 1 (norms of the original presets)
  FanIn,    // uniform, std = scale / sqrt(cols) (matrices)
  Fixed,    // uniform, std = scale (biases)
  NearOne,  // 1 + uniform, std = scale (norms of the newer presets)
  Values,   // TensorPlan::values (rope_freqs)
};

struct TensorPlan {
  std::string name;
  DType type;
  int64_t cols;  // row length (dims[0])
  int64_t rows;  // 1 for vectors
  Fill fill;
  float scale;                // see Fill
  std::vector<float> values;  // [rows * cols] for Fill::Values
};

// Weights of one tensor, quantised row by row, in parallel over rows.
// Element (r, c) = uniform(-a, a) from mix64(key + r * cols + c), so the bytes
// do not depend on the thread count.
void fill_tensor(const TensorPlan& t, uint64_t key, ThreadPool& pool, uint8_t* dst) {
  const uint64_t row_bytes = dtype_row_bytes(t.type, static_cast<uint64_t>(t.cols));
  // sqrt(3) turns a uniform's half-width into its standard deviation.
  const float a = t.fill == Fill::FanIn
                      ? t.scale * std::sqrt(3.0f) / std::sqrt(static_cast<float>(t.cols))
                      : t.scale * std::sqrt(3.0f);
  const float offset = t.fill == Fill::NearOne ? 1.0f : 0.0f;
  pool.parallel_for(t.rows, [&](int64_t begin, int64_t end, int) {
    std::vector<float> row(static_cast<size_t>(t.cols));  // [cols]
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t c = 0; c < t.cols; ++c) {
        if (t.fill == Fill::Ones) {
          row[c] = 1.0f;
          continue;
        }
        if (t.fill == Fill::Values) {
          row[c] = t.values[static_cast<size_t>(r * t.cols + c)];
          continue;
        }
        const uint64_t bits = mix64(key + static_cast<uint64_t>(r * t.cols + c));
        const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        row[c] = offset + (2.0f * u - 1.0f) * a;
      }
      kernels::quantize_row(t.type, row.data(), dst + static_cast<uint64_t>(r) * row_bytes, t.cols);
    }
  });
}

// The divisors of the RoPE frequencies that Llama 3.1's "llama3" scaling
// amounts to (Meta's reference code; GGUF converters store them as
// rope_freqs.weight): wavelengths shorter than original_ctx / 4 are kept,
// longer than original_ctx are stretched by the factor 8, and the band
// between is interpolated smoothly.
std::vector<float> llama3_rope_freqs(int n_rot, double freq_base) {
  constexpr double kFactor = 8.0, kLowFreqFactor = 1.0, kHighFreqFactor = 4.0;
  constexpr double kOriginalCtx = 8192.0;
  constexpr double kPi = 3.14159265358979323846;
  const double low_freq_wavelen = kOriginalCtx / kLowFreqFactor;
  const double high_freq_wavelen = kOriginalCtx / kHighFreqFactor;
  std::vector<float> out(static_cast<size_t>(n_rot / 2));  // [n_rot / 2]
  for (int i = 0; i < n_rot / 2; ++i) {
    // Our pow, not libm's: the file must be the same bytes on every machine.
    const double freq = kernels::pow_f64(freq_base, -2.0 * i / n_rot);
    const double wavelen = 2.0 * kPi / freq;
    double divisor;
    if (wavelen < high_freq_wavelen) {
      divisor = 1.0;
    } else if (wavelen > low_freq_wavelen) {
      divisor = kFactor;
    } else {
      const double smooth =
          (kOriginalCtx / wavelen - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
      divisor = 1.0 / ((1.0 - smooth) / kFactor + smooth);
    }
    out[static_cast<size_t>(i)] = static_cast<float>(divisor);
  }
  return out;
}

// llama-quantize's use_more_bits(i_layer, n_layer): the layers whose
// attn_v and ffn_down get Q6_K in the *_K_M mixes.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// Tensors in llama.cpp's names and shapes for llama, qwen2 and qwen3.
std::vector<TensorPlan> plan_tensors(const SynthShape& s, DType type, bool k_m_mix) {
  const int head_dim = s.effective_head_dim();
  const int64_t n_q = static_cast<int64_t>(head_dim) * s.n_head;
  const int64_t n_kv = static_cast<int64_t>(head_dim) * s.n_head_kv;
  const Fill norm = s.noisy_norms ? Fill::NearOne : Fill::Ones;
  const float norm_scale = s.noisy_norms ? 0.1f : 0.0f;
  std::vector<TensorPlan> plan;
  if (s.llama3_rope_freqs) {
    plan.push_back({"rope_freqs.weight", DType::F32, head_dim / 2, 1, Fill::Values, 0.0f,
                    llama3_rope_freqs(head_dim, s.rope_freq_base)});
  }
  // Embedding rows feed an RMSNorm, so their scale is free; 1.0 also gives
  // tied-output logits of unit spread. A separate head gets 2.0 so the
  // next-token distribution is peaked enough to be interesting.
  // In the _K_M mixes a tied embedding is the output matrix, and is Q6_K.
  const DType embd_type = k_m_mix && s.tied_output ? DType::Q6_K : type;
  plan.push_back({"token_embd.weight", embd_type, s.n_embd, s.n_vocab, Fill::FanIn, 1.0f, {}});
  plan.push_back({"output_norm.weight", DType::F32, s.n_embd, 1, norm, norm_scale, {}});
  if (!s.tied_output) {
    plan.push_back({"output.weight",
                    k_m_mix ? DType::Q6_K : type,
                    s.n_embd,
                    s.n_vocab,
                    Fill::FanIn,
                    2.0f,
                    {}});
  }
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    const bool more_bits = k_m_mix && use_more_bits(l, s.n_layer);
    const auto matrix = [&](const char* name, int64_t cols, int64_t rows) {
      const bool q6 = more_bits && (std::string_view(name) == "attn_v.weight" ||
                                    std::string_view(name) == "ffn_down.weight");
      plan.push_back({p + name, q6 ? DType::Q6_K : type, cols, rows, Fill::FanIn, 1.0f, {}});
    };
    const auto vec = [&](const char* name, int64_t n, Fill fill, float scale) {
      plan.push_back({p + name, DType::F32, n, 1, fill, scale, {}});
    };
    vec("attn_norm.weight", s.n_embd, norm, norm_scale);
    matrix("attn_q.weight", s.n_embd, n_q);
    matrix("attn_k.weight", s.n_embd, n_kv);
    matrix("attn_v.weight", s.n_embd, n_kv);
    if (s.arch == "qwen2") {
      // The projections give values of std ~1; biases of 0.5 shift them
      // visibly without swamping them.
      vec("attn_q.bias", n_q, Fill::Fixed, 0.5f);
      vec("attn_k.bias", n_kv, Fill::Fixed, 0.5f);
      vec("attn_v.bias", n_kv, Fill::Fixed, 0.5f);
    }
    if (s.arch == "qwen3") {
      vec("attn_q_norm.weight", head_dim, norm, norm_scale);
      vec("attn_k_norm.weight", head_dim, norm, norm_scale);
    }
    matrix("attn_output.weight", n_q, s.n_embd);
    vec("ffn_norm.weight", s.n_embd, norm, norm_scale);
    matrix("ffn_gate.weight", s.n_embd, s.n_ff);
    matrix("ffn_down.weight", s.n_ff, s.n_embd);
    matrix("ffn_up.weight", s.n_embd, s.n_ff);
  }
  return plan;
}

const std::vector<std::string>& synth_archs() {
  static const std::vector<std::string> kArchs = {"llama", "qwen2", "qwen3"};
  return kArchs;
}

}  // namespace

void set_synth_type(SynthOptions& options, const std::string& name) {
  // Q4_K_M / Q5_K_M: llama-quantize's mixes of Q4_K / Q5_K with Q6_K.
  const bool k_m = name == "Q4_K_M" || name == "Q5_K_M";
  const std::optional<DType> type = dtype_from_name(k_m ? name.substr(0, 4) : name);
  if (!type || !dtype_info(*type).can_dequantize) {
    throw InvalidArgument(fmt::format(
        "encore synth: unknown --type '{}' (use F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
        "Q4_K, Q5_K, Q6_K, Q4_K_M or Q5_K_M)",
        name));
  }
  options.type = *type;
  options.k_m_mix = k_m;
}

std::vector<std::string> synth_presets() {
  return {"tiny", "tiny-qwen2", "tiny-qwen3", "tiny-llama3",
          "125m", "qwen3-0.6b", "1b",         "llama3-1b"};
}

SynthShape synth_shape(const std::string& preset) {
  // Row lengths (n_embd, n_head * head_dim, n_ff) are multiples of 256 so
  // every K-quant fits.
  if (preset == "tiny") return {"tiny", 512, 512, 256, 2, 4, 2, 768, true};
  // Qwen2.5's layout: QKV biases, NeoX RoPE, 4 query heads per KV head, tied.
  if (preset == "tiny-qwen2") {
    return {.preset = "tiny-qwen2",
            .n_vocab = 512,
            .n_ctx = 512,
            .n_embd = 256,
            .n_layer = 2,
            .n_head = 8,
            .n_head_kv = 2,
            .n_ff = 768,
            .tied_output = true,
            .arch = "qwen2",
            .rope_freq_base = 1000000.0f,
            .rms_eps = 1e-6f,
            .noisy_norms = true};
  }
  // Qwen3's: QK-norm, NeoX RoPE, and heads wider than n_embd / n_head (96
  // vs 32; not a power of two on purpose).
  if (preset == "tiny-qwen3") {
    return {.preset = "tiny-qwen3",
            .n_vocab = 512,
            .n_ctx = 512,
            .n_embd = 256,
            .n_layer = 2,
            .n_head = 8,
            .n_head_kv = 4,
            .n_ff = 768,
            .tied_output = true,
            .arch = "qwen3",
            .head_dim = 96,
            .rope_freq_base = 1000000.0f,
            .rms_eps = 1e-6f,
            .noisy_norms = true};
  }
  // Llama 3.1's: rope_freqs, base 500000, 4 query heads per KV head; untied.
  if (preset == "tiny-llama3") {
    return {.preset = "tiny-llama3",
            .n_vocab = 512,
            .n_ctx = 512,
            .n_embd = 256,
            .n_layer = 2,
            .n_head = 4,
            .n_head_kv = 1,
            .n_ff = 768,
            .tied_output = false,
            .rope_freq_base = 500000.0f,
            .llama3_rope_freqs = true,
            .noisy_norms = true};
  }
  // GPT-2-small scale with Llama's GQA layout.
  if (preset == "125m") return {"125m", 32000, 2048, 768, 12, 12, 4, 2048, false};
  // Qwen3-0.6B.
  if (preset == "qwen3-0.6b") {
    return {.preset = "qwen3-0.6b",
            .n_vocab = 151936,
            .n_ctx = 40960,
            .n_embd = 1024,
            .n_layer = 28,
            .n_head = 16,
            .n_head_kv = 8,
            .n_ff = 3072,
            .tied_output = true,
            .arch = "qwen3",
            .head_dim = 128,
            .rope_freq_base = 1000000.0f,
            .rms_eps = 1e-6f,
            .noisy_norms = true};
  }
  // TinyLlama-1.1B.
  if (preset == "1b") return {"1b", 32000, 2048, 2048, 22, 32, 4, 5632, false};
  // Llama-3.2-1B.
  if (preset == "llama3-1b") {
    return {.preset = "llama3-1b",
            .n_vocab = 128256,
            .n_ctx = 131072,
            .n_embd = 2048,
            .n_layer = 16,
            .n_head = 32,
            .n_head_kv = 8,
            .n_ff = 8192,
            .tied_output = true,
            .rope_freq_base = 500000.0f,
            .llama3_rope_freqs = true,
            .noisy_norms = true};
  }
  throw InvalidArgument(fmt::format("unknown synth preset '{}' (known: {})", preset,
                                    fmt::join(synth_presets(), ", ")));
}

SynthSummary synth_model(const SynthOptions& options, const std::string& path, ThreadPool& pool) {
  const std::vector<std::string>& archs = synth_archs();
  if (!options.arch.empty() && std::find(archs.begin(), archs.end(), options.arch) == archs.end()) {
    throw InvalidArgument(fmt::format("encore synth: unknown --arch '{}' (supported: {})",
                                      options.arch, fmt::join(archs, ", ")));
  }
  if (!std::isfinite(options.rope_scaling_factor) || options.rope_scaling_factor < 0.0f) {
    throw InvalidArgument(fmt::format("encore synth: RoPE scaling factor {} must be >= 0",
                                      options.rope_scaling_factor));
  }
  const DTypeInfo& info = dtype_info(options.type);
  if (!info.can_dequantize) {
    throw InvalidArgument(fmt::format(
        "encore synth: --type {} is not supported (use F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
        "Q5_1, Q4_K, Q5_K or Q6_K)",
        info.name));
  }
  SynthShape shape = synth_shape(options.preset);
  if (!options.arch.empty() && options.arch != shape.arch) {
    throw InvalidArgument(fmt::format(
        "encore synth: preset '{}' is a {} model; --arch {} does not match (leave --arch out)",
        shape.preset, shape.arch, options.arch));
  }

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
      throw InvalidArgument(
          fmt::format("encore synth: --vocab-from {} has no tokenizer.ggml.tokens array to copy",
                      options.vocab_from));
    }
    shape.n_vocab = static_cast<int>(tokens->arr.size());
  }

  if (options.k_m_mix && options.type != DType::Q4_K && options.type != DType::Q5_K) {
    throw InvalidArgument(
        fmt::format("encore synth: the _K_M mix is made of Q4_K or Q5_K, not {}", info.name));
  }
  const std::vector<TensorPlan> plan = plan_tensors(shape, options.type, options.k_m_mix);
  for (const TensorPlan& t : plan) {
    // Vectors (norms, biases, rope_freqs) are F32 whatever the type.
    const DTypeInfo& ti = dtype_info(t.type);
    if (t.type != DType::F32 && t.cols % ti.block_elems != 0) {
      throw InvalidArgument(fmt::format(
          "encore synth: type {} needs row lengths divisible by {}, but {} has rows of {}", ti.name,
          ti.block_elems, t.name, t.cols));
    }
  }

  const int head_dim = shape.effective_head_dim();
  const std::string a = shape.arch + ".";
  const auto u32 = [](int v) { return gguf::Value::make_u32(static_cast<uint32_t>(v)); };
  writer.set("general.architecture", gguf::Value::make_string(shape.arch));
  writer.set("general.name", gguf::Value::make_string("encore-synth-" + shape.preset));
  writer.set("general.description",
             gguf::Value::make_string("random weights made by `encore synth`: its text is noise"));
  writer.set("encore.synthetic", gguf::Value::make_bool(true));
  writer.set("encore.synth.preset", gguf::Value::make_string(shape.preset));
  writer.set("encore.synth.seed", gguf::Value::make_u64(options.seed));
  writer.set(a + "vocab_size", u32(shape.n_vocab));
  writer.set(a + "context_length", u32(shape.n_ctx));
  writer.set(a + "embedding_length", u32(shape.n_embd));
  writer.set(a + "block_count", u32(shape.n_layer));
  writer.set(a + "feed_forward_length", u32(shape.n_ff));
  writer.set(a + "attention.head_count", u32(shape.n_head));
  writer.set(a + "attention.head_count_kv", u32(shape.n_head_kv));
  if (shape.head_dim > 0) {
    writer.set(a + "attention.key_length", u32(head_dim));
    writer.set(a + "attention.value_length", u32(head_dim));
  }
  writer.set(a + "attention.layer_norm_rms_epsilon", gguf::Value::make_f32(shape.rms_eps));
  writer.set(a + "rope.freq_base", gguf::Value::make_f32(shape.rope_freq_base));
  writer.set(a + "rope.dimension_count", u32(head_dim));
  if (options.rope_scaling_factor != 0.0f) {
    writer.set(a + "rope.scaling.type", gguf::Value::make_string("linear"));
    writer.set(a + "rope.scaling.factor", gguf::Value::make_f32(options.rope_scaling_factor));
  }
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
    writer.add_tensor(t.name, t.type, dims,
                      [t, key, &pool](uint8_t* dst, uint64_t) { fill_tensor(t, key, pool, dst); });
  }
  writer.write(path);
  summary.file_bytes = std::filesystem::file_size(path);
  return summary;
}

}  // namespace encore
