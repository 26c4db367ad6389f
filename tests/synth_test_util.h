// Helpers for tests on synth presets: a preset's file as bytes, and edited
// copies of a GGUF (tensors dropped, keys or tensors added or replaced).
// Header-only; each helper is reentrant and owns what it returns.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "encore/gguf.h"
#include "encore/model.h"
#include "encore/synth.h"
#include "encore/thread_pool.h"

namespace encore::test {

// The bytes of a synth preset (seed 11; F32 matrices unless asked otherwise;
// linear RoPE scaling by rope_scaling_factor when not 0).
inline std::vector<uint8_t> synth_bytes(const std::string& preset, DType type = DType::F32,
                                        float rope_scaling_factor = 0.0f) {
  TempDir tmp;
  SynthOptions o;
  o.preset = preset;
  o.type = type;
  o.seed = 11;
  o.rope_scaling_factor = rope_scaling_factor;
  ThreadPool pool(2);
  synth_model(o, tmp.file("m.gguf"), pool);
  const std::string s = read_file(tmp.file("m.gguf"));
  return std::vector<uint8_t>(s.begin(), s.end());
}

// Edits of a copy of a file: tensors for which keep_tensor is false are
// dropped, then `extra` may add or replace keys and add tensors.
struct Edit {
  std::function<bool(const std::string& tensor)> keep_tensor = [](const std::string&) {
    return true;
  };
  std::function<void(gguf::Writer&)> extra = [](gguf::Writer&) {};
};

inline std::vector<uint8_t> edited(const std::vector<uint8_t>& bytes, const Edit& e) {
  const gguf::File f = gguf::File::from_bytes(bytes, "in.gguf");
  gguf::Writer w;
  for (const gguf::KeyValue& kv : f.metadata()) w.set(kv.key, kv.value);
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (!e.keep_tensor(t.name)) continue;
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  }
  e.extra(w);
  return w.to_bytes();
}

// The raw bytes of F32 values, for Writer::add_tensor.
inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// An F32 copy of every 1-D tensor whose name contains `part`, with all
// values set to `value` (e.g. biases to 0, norms or rope_freqs to 1).
inline std::vector<uint8_t> with_vectors_set(const std::vector<uint8_t>& bytes,
                                             const std::string& part, float value) {
  const gguf::File f = gguf::File::from_bytes(bytes, "in.gguf");
  std::vector<std::pair<std::string, uint64_t>> hits;
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.dims.size() == 1 && t.name.find(part) != std::string::npos) {
      hits.emplace_back(t.name, t.dims[0]);
    }
  }
  return edited(bytes, {.keep_tensor =
                            [&](const std::string& name) {
                              for (const auto& h : hits) {
                                if (h.first == name) return false;
                              }
                              return true;
                            },
                        .extra =
                            [&](gguf::Writer& w) {
                              for (const auto& [name, n] : hits) {
                                w.add_tensor(name, DType::F32, {n},
                                             f32_bytes(std::vector<float>(n, value)));
                              }
                            }});
}

// A loaded model with the File it points into.
struct Loaded {
  gguf::File file;
  std::unique_ptr<Model> model;
  explicit Loaded(std::vector<uint8_t> bytes)
      : file(gguf::File::from_bytes(std::move(bytes), "synthetic.gguf")),
        model(Model::load(file)) {}
  const HParams& hp() const { return model->hparams(); }
  const ModelWeights& w() const { return model->weights(); }
};

}  // namespace encore::test
