// Shared helpers for reading hyper-parameters and tensors of any
// architecture (internal to src/model). Every failure is a ModelError or
// GgufError that names the file and the key or tensor.
//
// Ownership: a TensorReader borrows the gguf::File (which must outlive it
// and every WeightView it hands out: they point into the File's data) and
// owns only the set of names used so far. Cost: lookups and checks are
// O(log n_tensors); vector() copies and converts n floats; matrix() copies
// nothing. Thread-safety: read_common_hparams is reentrant; a TensorReader
// is used by one thread (it records names as they are asked for).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "encore/gguf.h"
#include "encore/model.h"
#include "kernels/matmul.h"
#include "model/weights.h"

namespace encore::model_detail {

// Reads the hyper-parameters every decoder-only architecture shares, from
// "<arch>.*" keys (arch = general.architecture), with llama.cpp's defaults.
// n_vocab comes from <arch>.vocab_size, else the length of
// tokenizer.ggml.tokens, else the rows of token_embd.weight. RoPE scaling:
// rope_freq_scale = 1 / rope.scaling.factor (else rope.scale_linear) for type
// "linear" (or no type); "none" never scales; other types are refused. rope_layout,
// tied_output and the has_* flags are left for the architecture to set.
HParams read_common_hparams(const gguf::File& file, const std::string& arch);

// Looks tensors up, checks them against expected shapes and records which
// tensors were used, so that a file with extra tensors (an unsupported
// variant: biases on an architecture without them, experts ...) is rejected
// instead of silently computing something else.
class TensorReader {
 public:
  explicit TensorReader(const gguf::File& file) : file_(file) {}

  // A 2-D tensor of GGUF dims [cols, rows] in a dequantisable type.
  // `what` describes the expected shape in words for the error message,
  // e.g. "[n_embd, n_head * head_dim]".
  kernels::WeightView matrix(const std::string& name, int64_t cols, int64_t rows, const char* what);
  // Same, but returns nullopt-like {data == nullptr} when the tensor is absent.
  kernels::WeightView optional_matrix(const std::string& name, int64_t cols, int64_t rows,
                                      const char* what);
  // A 1-D tensor of n values, converted to floats.
  std::vector<float> vector(const std::string& name, int64_t n, const char* what);
  // Same, but returns an empty vector when the tensor is absent.
  std::vector<float> optional_vector(const std::string& name, int64_t n, const char* what);

  const gguf::File& file() const { return file_; }

  // Throws ModelError naming the first tensor of the file that no call above
  // asked for.
  void check_all_used(const std::string& arch) const;

 private:
  const gguf::TensorInfo& find(const std::string& name) const;
  void check_shape(const gguf::TensorInfo& t, const std::vector<int64_t>& expected,
                   const char* what) const;
  void check_type(const gguf::TensorInfo& t) const;

  const gguf::File& file_;
  std::set<std::string, std::less<>> used_;
};

// The tensors llama, qwen2 and qwen3 share, with llama.cpp's names and
// shapes (head sizes from hp->head_dim, which need not be n_embd / n_head):
// token_embd, output_norm, output (absent = tied to token_embd; sets
// hp->tied_output) and per layer attn_norm, attn_q/k/v/output, ffn_norm,
// ffn_gate/up/down. The architecture adds its own extras and then calls
// check_all_used().
std::unique_ptr<ModelWeights> read_llama_like_weights(TensorReader& tr, HParams* hp);

// rope_freqs.weight when present ([n_rot / 2] divisors of the RoPE
// frequencies, written by converters for Llama 3.1+ "llama3" scaling), else
// empty. Throws ModelError for a wrong shape or a value that is not finite
// and > 0.
std::vector<float> read_rope_freqs(TensorReader& tr, const HParams& hp);

// Architecture entry points (one file each).
std::unique_ptr<ModelWeights> load_llama(const gguf::File& file, HParams* hparams);
std::unique_ptr<ModelWeights> load_qwen2(const gguf::File& file, HParams* hparams);
std::unique_ptr<ModelWeights> load_qwen3(const gguf::File& file, HParams* hparams);

}  // namespace encore::model_detail
