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
#include "kernels/ops.h"
#include "model/weights.h"

namespace encore::model_detail {

// Reads the hyper-parameters every decoder-only architecture shares, from
// "<arch>.*" keys (arch = general.architecture), with llama.cpp's defaults.
// n_vocab comes from <arch>.vocab_size, else the length of
// tokenizer.ggml.tokens, else the rows of token_embd.weight.
// rope_layout and tied_output are left for the architecture to set.
HParams read_common_hparams(const gguf::File& file, const std::string& arch);

// Looks tensors up, checks them against expected shapes and records which
// tensors were used, so that a file with extra tensors (an unsupported
// variant: biases, rope scaling factors, experts ...) is rejected instead of
// silently computing something else.
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

// Architecture entry points (one file each).
std::unique_ptr<ModelWeights> load_llama(const gguf::File& file, HParams* hparams);

}  // namespace encore::model_detail
