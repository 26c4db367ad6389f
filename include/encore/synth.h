// Synthetic model files: a real architecture's shapes and a real vocabulary,
// with random weights. Used by tests and benchmarks where no trained model
// of that size is at hand, and by the README's main job on a fresh clone.
//
// Weights are uniform in [-a, a] with std = scale / sqrt(fan_in), so
// activations stay finite and the logits are neither flat nor one-hot; norm
// weights are 1 (the newer presets: 1 + small noise, so that a norm applied
// to the wrong vector shows in tests), Q/K/V biases have std 0.5. Element
// (r, c) of tensor k is a pure function of (seed, k, r, c): the file is
// byte-identical for the same options, whatever the thread count.
//
// The file carries `encore.synthetic = true` so tools can say plainly that
// its output is noise.
//
// Ownership: synth_model() keeps nothing after it returns; it borrows the
// ThreadPool for the call. Cost: one pass over every weight, written to disk
// as it is produced; memory is about the largest single tensor (plus the
// vocab_from file's metadata), not the whole model. Thread-safety: the
// functions are reentrant, but synth_model() runs its work on `pool`, so the
// pool must not be used by anything else during the call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "encore/dtype.h"

namespace encore {

class ThreadPool;

struct SynthShape {
  std::string preset;
  int n_vocab = 0;  // replaced by the vocabulary's size with vocab_from
  int n_ctx = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int n_ff = 0;
  bool tied_output = false;
  std::string arch = "llama";  // general.architecture: llama, qwen2 or qwen3
  int head_dim = 0;            // 0 = n_embd / n_head; else written as attention.key_length
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  // rope_freqs.weight as Llama 3.1's converter writes it for "llama3" RoPE
  // scaling (factor 8, low/high frequency factors 1 and 4, original context
  // 8192).
  bool llama3_rope_freqs = false;
  bool noisy_norms = false;  // norm weights 1 + uniform noise of std 0.1 instead of 1
  int effective_head_dim() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
};

struct SynthOptions {
  std::string arch;             // "" = the preset's; otherwise must be the preset's
  std::string preset = "tiny";  // see synth_presets()
  DType type = DType::F16;      // type of the 2-D weights (norms, biases, rope_freqs stay F32)
  // The K-quant mixes of llama-quantize's Q4_K_M / Q5_K_M (type is then
  // Q4_K / Q5_K): output.weight (token_embd.weight when the output is tied
  // to it) and, in the layers its use_more_bits picks (the first and last
  // eighth, every third between), attn_v and ffn_down are Q6_K; the rest is
  // `type`.
  bool k_m_mix = false;
  std::string vocab_from;  // GGUF whose tokenizer.* keys are copied; "" = built-in
  uint64_t seed = 0;
  // Linear RoPE scaling written as <arch>.rope.scaling.{type,factor}; 0 = none.
  float rope_scaling_factor = 0.0f;
};

// Sets options.type and options.k_m_mix from a type name as `encore synth
// --type` takes it: a DType name (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K
// Q5_K Q6_K) or a mix (Q4_K_M, Q5_K_M). Throws InvalidArgument naming the
// accepted ones.
void set_synth_type(SynthOptions& options, const std::string& name);

// Preset names: the default "tiny" and its per-architecture siblings
// "tiny-qwen2", "tiny-qwen3" and "tiny-llama3" (under 3M parameters, for
// tests), then real shapes by size: "125m", "qwen3-0.6b" (Qwen3-0.6B), "1b"
// (TinyLlama-1.1B), "llama3-1b" (Llama-3.2-1B).
std::vector<std::string> synth_presets();
// Throws InvalidArgument for an unknown preset, naming the known ones.
SynthShape synth_shape(const std::string& preset);

struct SynthSummary {
  SynthShape shape;
  uint64_t n_params = 0;
  uint64_t file_bytes = 0;
};

// Writes the model to `path` (atomically). Throws InvalidArgument for bad
// options (unknown arch or one that is not the preset's, a type whose block
// size does not divide a row length, a vocab file without tokenizer keys, a
// negative or non-finite rope_scaling_factor) and Error for I/O failures.
SynthSummary synth_model(const SynthOptions& options, const std::string& path, ThreadPool& pool);

}  // namespace encore
