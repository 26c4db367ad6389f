// Loading the llama, qwen2 and qwen3 architectures and RoPE scaling: the
// synth presets of each load with the right hyper-parameters and weights,
// and broken or unsupported variants are clear ModelErrors that name the
// file and the key or tensor. (The forward pass on them: arch_forward_test.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/model.h"
#include "encore/synth.h"
#include "encore/thread_pool.h"
#include "model/weights.h"
#include "synth_test_util.h"

namespace encore {
namespace {

using test::edited;
using test::f32_bytes;
using test::Loaded;
using test::synth_bytes;
using test::TempDir;

// The ModelError of loading `bytes` (as "synthetic.gguf"), or "<loaded>".
std::string load_error(const std::vector<uint8_t>& bytes) {
  const gguf::File f = gguf::File::from_bytes(bytes, "synthetic.gguf");
  try {
    Model::load(f);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "<loaded>";
}

// The load error of `good` without tensor `name`.
std::string without_tensor(const std::vector<uint8_t>& good, const std::string& name) {
  return load_error(edited(good, {.keep_tensor = [&](const std::string& t) { return t != name; }}));
}

// The load error of `good` with tensor `name` replaced by an F32 vector of
// `values`.
std::string with_tensor_replaced(const std::vector<uint8_t>& good, const std::string& name,
                                 const std::vector<float>& values) {
  return load_error(edited(good, {.keep_tensor = [&](const std::string& t) { return t != name; },
                                  .extra =
                                      [&](gguf::Writer& w) {
                                        w.add_tensor(name, DType::F32, {values.size()},
                                                     f32_bytes(values));
                                      }}));
}

TEST(Arch, SupportedArchitecturesAreListed) {
  EXPECT_EQ(supported_architectures(), (std::vector<std::string>{"llama", "qwen2", "qwen3"}));
  const std::string err =
      load_error(edited(synth_bytes("tiny"), {.extra = [](gguf::Writer& w) {
                          w.set("general.architecture", gguf::Value::make_string("gpt2"));
                        }}));
  EXPECT_NE(err.find("synthetic.gguf: architecture 'gpt2' is not supported (supported: llama, "
                     "qwen2, qwen3)"),
            std::string::npos)
      << err;
}

uint64_t n_params(const SynthShape& s) {
  const uint64_t hd = static_cast<uint64_t>(s.effective_head_dim());
  const uint64_t embd = static_cast<uint64_t>(s.n_embd);
  return static_cast<uint64_t>(s.n_vocab) * embd * (s.tied_output ? 1 : 2) +
         static_cast<uint64_t>(s.n_layer) *
             (embd * hd * (2 * s.n_head + 2 * s.n_head_kv) + 3 * embd * s.n_ff);
}

TEST(Arch, PresetsAreListedSmallFirst) {
  const std::vector<std::string> p = synth_presets();
  ASSERT_EQ(p.front(), "tiny");  // the default
  for (const char* name : {"tiny-qwen2", "tiny-qwen3", "tiny-llama3", "qwen3-0.6b", "llama3-1b"}) {
    EXPECT_NE(std::find(p.begin(), p.end(), name), p.end()) << name;
  }
  uint64_t last = 0;
  for (const std::string& name : p) {
    const SynthShape s = synth_shape(name);
    EXPECT_EQ(s.preset, name);
    const uint64_t params = n_params(s);
    if (name.rfind("tiny", 0) == 0) {
      EXPECT_LT(params, 3000000u) << name;  // small enough for unit tests
    } else {
      EXPECT_GE(params, last) << name;  // the others by size
      last = params;
    }
    // Every K-quant needs whole 256-blocks in every row.
    EXPECT_EQ(s.n_embd % 256, 0) << name;
    EXPECT_EQ(s.n_ff % 256, 0) << name;
    EXPECT_EQ(s.effective_head_dim() * s.n_head % 256, 0) << name;
  }
}

// What tells the architectures' attention apart, as a preset must load it.
struct Attention {
  std::string arch;
  int n_embd, n_head, n_head_kv, head_dim, n_rot;
  RopeLayout rope_layout;
  bool qkv_bias, qk_norm, tied_output;
};

void expect_attention(const HParams& hp, const Attention& want) {
  EXPECT_EQ(hp.arch, want.arch);
  EXPECT_EQ(hp.n_embd, want.n_embd) << want.arch;
  EXPECT_EQ(hp.n_head, want.n_head) << want.arch;
  EXPECT_EQ(hp.n_head_kv, want.n_head_kv) << want.arch;
  EXPECT_EQ(hp.head_dim, want.head_dim) << want.arch;
  EXPECT_EQ(hp.n_rot, want.n_rot) << want.arch;
  EXPECT_EQ(hp.rope_layout, want.rope_layout) << want.arch;
  EXPECT_EQ(hp.has_qkv_bias, want.qkv_bias) << want.arch;
  EXPECT_EQ(hp.has_qk_norm, want.qk_norm) << want.arch;
  EXPECT_EQ(hp.tied_output, want.tied_output) << want.arch;
}

TEST(Arch, TinyQwen2Loads) {
  const Loaded m(synth_bytes("tiny-qwen2"));
  const HParams& hp = m.hp();
  // n_embd, n_head, n_head_kv, head_dim, n_rot
  expect_attention(hp, {"qwen2", 256, 8, 2, 32, 32, RopeLayout::NeoX, /*qkv_bias=*/true,
                        /*qk_norm=*/false, /*tied_output=*/true});
  EXPECT_FLOAT_EQ(hp.rope_freq_base, 1e6f);
  EXPECT_FLOAT_EQ(hp.rope_freq_scale, 1.0f);
  EXPECT_FLOAT_EQ(hp.rms_eps, 1e-6f);
  EXPECT_EQ(m.w().output.data, m.w().token_embd.data);
  EXPECT_TRUE(m.w().rope_freqs.empty());
  ASSERT_EQ(m.w().layers.size(), 2u);
  for (const LayerWeights& l : m.w().layers) {
    ASSERT_EQ(l.bq.size(), 256u);
    ASSERT_EQ(l.bk.size(), 64u);
    ASSERT_EQ(l.bv.size(), 64u);
    EXPECT_TRUE(l.q_norm.empty());
    EXPECT_TRUE(l.k_norm.empty());
    // Random biases, not zeros: a forward pass that ignored them would show.
    double ss = 0.0;
    for (float b : l.bk) ss += b * b;
    EXPECT_NEAR(std::sqrt(ss / 64.0), 0.5, 0.15);
  }
}

TEST(Arch, TinyQwen3LoadsWithHeadsWiderThanEmbdOverHeads) {
  const Loaded m(synth_bytes("tiny-qwen3"));
  const HParams& hp = m.hp();
  // n_embd, n_head, n_head_kv, head_dim (96, not 256 / 8), n_rot
  expect_attention(hp, {"qwen3", 256, 8, 4, 96, 96, RopeLayout::NeoX, /*qkv_bias=*/false,
                        /*qk_norm=*/true, /*tied_output=*/true});
  const KvLayout kv = kv_layout_for(hp, DType::F32);
  EXPECT_EQ(kv.head_dim, 96);
  EXPECT_EQ(kv.n_kv_heads, 4);
  for (const LayerWeights& l : m.w().layers) {
    EXPECT_EQ(l.wq.cols, 256);
    EXPECT_EQ(l.wq.rows, 8 * 96);
    EXPECT_EQ(l.wk.rows, 4 * 96);
    EXPECT_EQ(l.wo.cols, 8 * 96);
    EXPECT_EQ(l.wo.rows, 256);
    ASSERT_EQ(l.q_norm.size(), 96u);
    ASSERT_EQ(l.k_norm.size(), 96u);
    EXPECT_TRUE(l.bq.empty());
    // Noisy norms (1 +- ~0.17), and q's differ from k's.
    EXPECT_NE(l.q_norm, l.k_norm);
    for (float x : l.q_norm) EXPECT_NEAR(x, 1.0f, 0.2f);
  }
}

TEST(Arch, TinyLlama3LoadsItsRopeFreqs) {
  const Loaded m(synth_bytes("tiny-llama3"));
  const HParams& hp = m.hp();
  EXPECT_EQ(hp.arch, "llama");
  EXPECT_EQ(hp.head_dim, 64);
  EXPECT_EQ(hp.n_head_kv, 1);
  EXPECT_EQ(hp.rope_layout, RopeLayout::Normal);
  EXPECT_FALSE(hp.tied_output);
  EXPECT_FLOAT_EQ(hp.rope_freq_base, 500000.0f);
  const std::vector<float>& f = m.w().rope_freqs;
  ASSERT_EQ(f.size(), 32u);
  // Llama 3.1's scaling: high frequencies kept (1), low ones divided by the
  // factor 8, a smooth band between.
  EXPECT_EQ(f.front(), 1.0f);
  EXPECT_EQ(f.back(), 8.0f);
  int between = 0;
  for (size_t i = 1; i < f.size(); ++i) {
    EXPECT_GE(f[i], f[i - 1]);
    if (f[i] > 1.0f && f[i] < 8.0f) ++between;
  }
  EXPECT_GT(between, 0);
  // Pair i has wavelength 2 pi * 500000^(2i / 64); the band is wavelengths
  // in [8192 / 4, 8192].
  for (int i = 0; i < 32; ++i) {
    const double wavelen = 2.0 * std::numbers::pi * std::pow(500000.0, 2.0 * i / 64);
    if (wavelen < 2048.0) {
      EXPECT_EQ(f[i], 1.0f) << i;
    } else if (wavelen > 8192.0) {
      EXPECT_EQ(f[i], 8.0f) << i;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
      EXPECT_NEAR(f[i], 1.0 / ((1.0 - smooth) / 8.0 + smooth), 1e-5) << i;
    }
  }
}

TEST(Arch, OriginalTinyPresetIsUnchanged) {
  const Loaded m(synth_bytes("tiny"));
  const HParams& hp = m.hp();
  EXPECT_EQ(hp.arch, "llama");
  EXPECT_EQ(hp.head_dim, 64);
  EXPECT_TRUE(hp.tied_output);
  EXPECT_TRUE(m.w().rope_freqs.empty());
  for (float x : m.w().layers[0].attn_norm) ASSERT_EQ(x, 1.0f);
}

TEST(Arch, EveryTypeOfEveryTinyPresetLoads) {
  for (const char* preset : {"tiny-qwen2", "tiny-qwen3", "tiny-llama3"}) {
    for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                    DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
      const Loaded m(synth_bytes(preset, t));
      EXPECT_EQ(m.w().layers[1].wq.type, t) << preset;
      // Norms, biases and rope_freqs stay F32 in the file.
      for (const gguf::TensorInfo& ti : m.file.tensors()) {
        if (ti.dims.size() == 1) {
          EXPECT_EQ(ti.type, DType::F32) << ti.name;
        }
      }
    }
  }
}

TEST(Arch, SynthRefusesAnArchThatIsNotThePresets) {
  TempDir tmp;
  ThreadPool pool(1);
  SynthOptions o;
  o.preset = "tiny-qwen3";
  o.arch = "llama";
  try {
    synth_model(o, tmp.file("x.gguf"), pool);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("preset 'tiny-qwen3' is a qwen3 model"), std::string::npos)
        << e.what();
  }
  o.arch = "qwen3";
  synth_model(o, tmp.file("x.gguf"), pool);
  o.arch = "gpt2";
  EXPECT_THROW(synth_model(o, tmp.file("x.gguf"), pool), InvalidArgument);
}

// ---- Broken files ----------------------------------------------------------

TEST(ArchErrors, Qwen2WithoutABiasNamesTheTensor) {
  const std::vector<uint8_t> good = synth_bytes("tiny-qwen2");
  for (const char* name : {"blk.0.attn_q.bias", "blk.1.attn_k.bias", "blk.1.attn_v.bias"}) {
    const std::string err = without_tensor(good, name);
    EXPECT_NE(err.find(std::string("synthetic.gguf: missing tensor '") + name + "'"),
              std::string::npos)
        << err;
  }
  // A bias of the wrong length.
  const std::string err =
      with_tensor_replaced(good, "blk.0.attn_k.bias", std::vector<float>(256, 0.0f));
  EXPECT_NE(err.find("tensor 'blk.0.attn_k.bias' has shape [256], expected [n_head_kv * "
                     "head_dim] = [64]"),
            std::string::npos)
      << err;
}

TEST(ArchErrors, Qwen3NormsUseTheHeadDim) {
  const std::vector<uint8_t> good = synth_bytes("tiny-qwen3");
  std::string err = without_tensor(good, "blk.1.attn_k_norm.weight");
  EXPECT_NE(err.find("synthetic.gguf: missing tensor 'blk.1.attn_k_norm.weight'"),
            std::string::npos)
      << err;
  // n_embd / n_head = 32 is not this model's head size.
  err = with_tensor_replaced(good, "blk.0.attn_q_norm.weight", std::vector<float>(32, 1.0f));
  EXPECT_NE(err.find("tensor 'blk.0.attn_q_norm.weight' has shape [32], expected [head_dim] = "
                     "[96]"),
            std::string::npos)
      << err;
}

TEST(ArchErrors, ExtraTensorsOfAnotherVariantAreRefused) {
  const auto with_tensor = [](const std::string& preset, const std::string& name, uint64_t n) {
    return load_error(edited(synth_bytes(preset), {.extra = [=](gguf::Writer& w) {
                               w.add_tensor(name, DType::F32, {n},
                                            f32_bytes(std::vector<float>(n, 1.0f)));
                             }}));
  };
  // Biases belong to qwen2, QK-norm to qwen3, rope_freqs to llama only (as
  // in llama.cpp).
  std::string err = with_tensor("tiny-qwen3", "blk.0.attn_q.bias", 768);
  EXPECT_NE(err.find("tensor 'blk.0.attn_q.bias' is not part of the 'qwen3' architecture"),
            std::string::npos)
      << err;
  err = with_tensor("tiny-qwen2", "blk.0.attn_q_norm.weight", 32);
  EXPECT_NE(err.find("tensor 'blk.0.attn_q_norm.weight' is not part of the 'qwen2' architecture"),
            std::string::npos)
      << err;
  err = with_tensor("tiny-qwen2", "rope_freqs.weight", 16);
  EXPECT_NE(err.find("tensor 'rope_freqs.weight' is not part of the 'qwen2' architecture"),
            std::string::npos)
      << err;
}

TEST(ArchErrors, BadRopeFreqsAreRefused) {
  const std::vector<uint8_t> good = synth_bytes("tiny-llama3");
  const auto with_freqs = [&](const std::vector<float>& f) {
    return with_tensor_replaced(good, "rope_freqs.weight", f);
  };
  std::vector<float> f(32, 1.0f);
  EXPECT_EQ(with_freqs(f), "<loaded>");
  f[7] = 0.0f;
  std::string err = with_freqs(f);
  EXPECT_NE(err.find("synthetic.gguf: tensor 'rope_freqs.weight' value 0 at index 7 must be "
                     "finite and > 0"),
            std::string::npos)
      << err;
  f[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(with_freqs(f).find("at index 7 must be finite and > 0"), std::string::npos);
  f[7] = -2.0f;
  EXPECT_NE(with_freqs(f).find("at index 7 must be finite and > 0"), std::string::npos);
  err = with_freqs(std::vector<float>(64, 1.0f));
  EXPECT_NE(err.find("tensor 'rope_freqs.weight' has shape [64], expected [n_rot / 2] = [32]"),
            std::string::npos)
      << err;
}

// ---- RoPE scaling keys ------------------------------------------------------

// rope_freq_scale after setting `keys` on a copy of `preset`, or the error.
struct ScaleResult {
  float scale = 0.0f;
  std::string error;
};
ScaleResult scale_with(const std::string& preset, std::function<void(gguf::Writer&)> keys) {
  const std::vector<uint8_t> b = edited(synth_bytes(preset), {.extra = keys});
  const gguf::File f = gguf::File::from_bytes(b, "synthetic.gguf");
  try {
    return {Model::load(f)->hparams().rope_freq_scale, ""};
  } catch (const ModelError& e) {
    return {0.0f, e.what()};
  }
}

gguf::Value f32(float v) { return gguf::Value::make_f32(v); }
gguf::Value str(const char* v) { return gguf::Value::make_string(v); }

TEST(RopeScaling, LinearFactorScalesPositionsInEveryArchitecture) {
  for (const char* preset : {"tiny", "tiny-qwen2", "tiny-qwen3"}) {
    const std::string a = synth_shape(preset).arch + ".";
    ScaleResult r = scale_with(preset, [&](gguf::Writer& w) {
      w.set(a + "rope.scaling.type", str("linear"));
      w.set(a + "rope.scaling.factor", f32(4.0f));
    });
    EXPECT_EQ(r.error, "");
    EXPECT_FLOAT_EQ(r.scale, 0.25f) << preset;
    // No type: llama.cpp's default is linear.
    r = scale_with(preset, [&](gguf::Writer& w) { w.set(a + "rope.scaling.factor", f32(2.0f)); });
    EXPECT_FLOAT_EQ(r.scale, 0.5f) << preset;
    // The older key.
    r = scale_with(preset, [&](gguf::Writer& w) { w.set(a + "rope.scale_linear", f32(8.0f)); });
    EXPECT_FLOAT_EQ(r.scale, 0.125f) << preset;
  }
}

TEST(RopeScaling, FollowsLlamaCppForEdgeCases) {
  // rope.scaling.factor wins over rope.scale_linear.
  ScaleResult r = scale_with("tiny", [](gguf::Writer& w) {
    w.set("llama.rope.scaling.factor", f32(2.0f));
    w.set("llama.rope.scale_linear", f32(8.0f));
  });
  EXPECT_FLOAT_EQ(r.scale, 0.5f);
  // Factors 0 and 1 are no scaling.
  for (float factor : {0.0f, 1.0f}) {
    r = scale_with("tiny", [&](gguf::Writer& w) {
      w.set("llama.rope.scaling.type", str("linear"));
      w.set("llama.rope.scaling.factor", f32(factor));
    });
    EXPECT_EQ(r.error, "");
    EXPECT_FLOAT_EQ(r.scale, 1.0f);
  }
  r = scale_with("tiny", [](gguf::Writer& w) { w.set("llama.rope.scaling.type", str("none")); });
  EXPECT_FLOAT_EQ(r.scale, 1.0f);
  // Type "none" never scales, whatever the factor (llama.cpp does the same).
  r = scale_with("tiny", [](gguf::Writer& w) {
    w.set("llama.rope.scaling.type", str("none"));
    w.set("llama.rope.scaling.factor", f32(2.0f));
  });
  EXPECT_EQ(r.error, "");
  EXPECT_FLOAT_EQ(r.scale, 1.0f);
}

TEST(RopeScaling, UnsupportedTypesAndBadFactorsAreClearErrors) {
  for (const char* type : {"yarn", "longrope", "llama3", "dynamic"}) {
    const ScaleResult r = scale_with("tiny-qwen2", [&](gguf::Writer& w) {
      w.set("qwen2.rope.scaling.type", str(type));
      w.set("qwen2.rope.scaling.factor", f32(4.0f));
    });
    EXPECT_NE(r.error.find(std::string("synthetic.gguf: qwen2.rope.scaling.type = '") + type +
                           "' is not supported (supported: none, linear)"),
              std::string::npos)
        << r.error;
  }
  for (float bad : {-2.0f, std::numeric_limits<float>::infinity(), 1e-9f}) {
    const ScaleResult r = scale_with(
        "tiny-qwen3", [&](gguf::Writer& w) { w.set("qwen3.rope.scaling.factor", f32(bad)); });
    EXPECT_NE(r.error.find("synthetic.gguf: qwen3.rope.scaling.factor = "), std::string::npos)
        << r.error;
    EXPECT_NE(r.error.find("is out of range"), std::string::npos) << r.error;
  }
  const ScaleResult r =
      scale_with("tiny", [&](gguf::Writer& w) { w.set("llama.rope.scale_linear", f32(-1.0f)); });
  EXPECT_NE(r.error.find("llama.rope.scale_linear = -1 is out of range"), std::string::npos)
      << r.error;
}

TEST(RopeScaling, SynthWritesTheLinearFactor) {
  TempDir tmp;
  ThreadPool pool(1);
  SynthOptions o;
  o.preset = "tiny-qwen2";
  o.rope_scaling_factor = 4.0f;
  synth_model(o, tmp.file("s.gguf"), pool);
  const gguf::File f = gguf::File::open(tmp.file("s.gguf"));
  EXPECT_EQ(f.get_string("qwen2.rope.scaling.type"), "linear");
  EXPECT_FLOAT_EQ(Model::load(f)->hparams().rope_freq_scale, 0.25f);
  o.rope_scaling_factor = -1.0f;
  EXPECT_THROW(synth_model(o, tmp.file("t.gguf"), pool), InvalidArgument);
}

}  // namespace
}  // namespace encore
