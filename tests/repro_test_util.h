// Shared by the reproducibility suite (repro_test.cpp, repro_batch_test.cpp):
// the models it runs on, engines and forward contexts on them, comparisons
// bit for bit, the sampler settings every test runs and the Repro fixture.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "encore/engine.h"
#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/isa.h"
#include "encore/model.h"
#include "encore/sampler.h"
#include "encore/thread_pool.h"
#include "encore/tokenizer.h"
#include "shared_data.h"
#include "synth_test_util.h"

namespace encore::repro_test {

inline constexpr int kCtx = 256;
inline constexpr int32_t kN = 32;  // tokens per sample of most requests
inline constexpr uint64_t kSeed = 0x5eed1234abcdull;

inline constexpr const char* kPromptText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park with her friends. One day, she saw a big red ball under a tall tree. She ran to get "
    "it, but a small brown dog took it first. Lily was sad, so she";
inline constexpr const char* kOtherText =
    "Tom and his dog Max went to the beach. The sun was hot and the water was cold, so they "
    "sat on the sand and ate apples and bread until the birds came to";

// ---- Models ---------------------------------------------------------------

struct ModelCase {
  std::string name;    // test name part
  std::string preset;  // "" = stories260K from the shared folder
  DType type = DType::F32;
};

inline void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }

// A loaded model, its tokenizer and the prompts used on it.
struct Lm {
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::vector<TokenId> prompt;  // ~70+ tokens: chunk 64 splits it
  std::vector<TokenId> other;   // a second, different text
};

inline std::vector<TokenId> encode_with_bos(const Tokenizer& tok, const std::string& text) {
  Tokenizer::EncodeOptions o;
  o.add_bos = true;
  return tok.encode(text, o);
}

inline std::unique_ptr<Lm> make_lm(gguf::File file) {
  auto lm = std::make_unique<Lm>();
  lm->file = std::make_shared<const gguf::File>(std::move(file));
  lm->model = Model::load(*lm->file);
  ThreadPool repack_pool(2);
  lm->model->repack_weights(repack_pool);  // as the engine runs it
  lm->tok = Tokenizer::create(vocab_from_gguf(*lm->file));
  lm->prompt = encode_with_bos(*lm->tok, kPromptText);
  lm->other = encode_with_bos(*lm->tok, kOtherText);
  return lm;
}

// Models are loaded once per process.
inline const Lm* stories_lm(const std::string& path) {
  static std::unique_ptr<Lm> lm;
  if (!lm) lm = make_lm(gguf::File::open(path));
  return lm.get();
}

inline const Lm* synth_lm(const std::string& preset, DType type) {
  static std::map<std::string, std::unique_ptr<Lm>> cache;
  const std::string key = preset + "/" + dtype_name(type);
  auto it = cache.find(key);
  if (it == cache.end()) {
    it = cache
             .emplace(key, make_lm(gguf::File::from_bytes(test::synth_bytes(preset, type),
                                                          key + ".gguf")))
             .first;
  }
  return it->second.get();
}

// Another ISA than the default one where the CPU has one (else scalar):
// runs that must agree with a reference on another schedule use it.
inline Isa other_isa() {
  for (Isa i : supported_isas()) {  // a SIMD one first: faster than scalar
    if (i != Isa::Scalar && i != detect_best_isa()) return i;
  }
  return Isa::Scalar;
}

// A ForwardContext with its own thread pool and KV pool (room for
// `seqs` sequences of the whole context): the manual scheduler's.
struct Forward {
  ThreadPool threads;
  KvBlockPool pool;
  ForwardContext ctx;
  Forward(const Model& m, int n_threads, Isa isa, int n_ctx = kCtx, int seqs = 10,
          DType kv = DType::F16)
      : threads(n_threads),
        pool(kv_layout_for(m.hparams(), kv),
             kv_bytes_for_tokens(kv_layout_for(m.hparams(), kv), n_ctx) * seqs),
        ctx(m, pool, threads, n_ctx, isa) {}
};

// An Engine on the test's model with its own threads, kernels, KV pool
// (room for `seqs` sequences of the whole context) and step size.
struct Rig {
  std::unique_ptr<Engine> engine;
  Rig(const Lm& lm, int n_threads, Isa isa, int n_ctx = kCtx, int seqs = 10,
      int32_t batch_tokens = 512) {
    EngineOptions o;
    o.threads = n_threads;
    o.isa = isa;
    o.n_ctx = n_ctx;
    o.kv_bytes = kv_bytes_for_tokens(kv_layout_for(lm.model->hparams(), DType::F16), n_ctx) * seqs;
    o.batch_tokens = batch_tokens;
    o.fingerprint_cache_dir = "/nonexistent";  // never the user's cache
    engine = Engine::open(lm.file, o);
  }
};

inline std::vector<Isa> isas() { return supported_isas(); }

// The request through the engine: its streamed text must equal each
// sample's text, and no KV block may stay in use afterwards.
inline Response run(const Lm& lm, Rig& e, const Request& p,
                    const std::vector<SampleState>* resume = nullptr,
                    const std::vector<TokenId>* prompt = nullptr) {
  Request q = p;
  q.prompt_ids = prompt ? *prompt : lm.prompt;
  if (resume) q.resume = *resume;
  q.stream = true;
  RequestHandle h = e.engine->submit(q);
  std::vector<std::string> streamed(static_cast<size_t>(p.n));
  while (std::optional<Event> ev = h.next()) {
    if (ev->kind != Event::Kind::Done) streamed.at(static_cast<size_t>(ev->sample)) += ev->text;
  }
  Response r = h.wait();
  EXPECT_EQ(r.status, Response::Status::Ok) << r.error;
  EXPECT_EQ(r.samples.size(), static_cast<size_t>(p.n));
  EXPECT_EQ(r.states.size(), static_cast<size_t>(p.n));
  for (size_t i = 0; i < r.samples.size(); ++i) {
    EXPECT_EQ(streamed[i], r.samples[i].text) << "sample " << i << ": streamed text";
  }
  e.engine->drain();
  EXPECT_EQ(e.engine->stats().kv_blocks_used, 0) << "the engine kept KV blocks";
  return r;
}

// ---- Comparisons ------------------------------------------------------------

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

inline ::testing::AssertionResult same_logprobs(const std::vector<LogprobEntry>& a,
                                                const std::vector<LogprobEntry>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "logprob counts " << a.size() << " vs " << b.size();
  }
  for (size_t t = 0; t < a.size(); ++t) {
    const LogprobEntry &x = a[t], &y = b[t];
    if (x.chosen.id != y.chosen.id || !same_bits(x.chosen.logprob, y.chosen.logprob)) {
      return ::testing::AssertionFailure()
             << "token " << t << ": chosen (" << x.chosen.id << ", " << x.chosen.logprob << ") vs ("
             << y.chosen.id << ", " << y.chosen.logprob << ")";
    }
    if (x.top.size() != y.top.size()) {
      return ::testing::AssertionFailure() << "token " << t << ": top sizes differ";
    }
    for (size_t k = 0; k < x.top.size(); ++k) {
      if (x.top[k].id != y.top[k].id || !same_bits(x.top[k].logprob, y.top[k].logprob)) {
        return ::testing::AssertionFailure()
               << "token " << t << " top " << k << ": (" << x.top[k].id << ", " << x.top[k].logprob
               << ") vs (" << y.top[k].id << ", " << y.top[k].logprob << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

inline std::string ids_str(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) s += std::to_string(id) + " ";
  return s;
}

inline ::testing::AssertionResult same_sample(const SampleResult& a, const SampleResult& b) {
  if (a.ids != b.ids) {
    return ::testing::AssertionFailure()
           << "ids differ:\n  " << ids_str(a.ids) << "\n  " << ids_str(b.ids);
  }
  if (auto r = same_logprobs(a.logprobs, b.logprobs); !r) return r;
  if (a.text != b.text) {
    return ::testing::AssertionFailure() << "text '" << a.text << "' vs '" << b.text << "'";
  }
  if (a.finish != b.finish) {
    return ::testing::AssertionFailure()
           << "finish " << finish_reason_name(a.finish) << " vs " << finish_reason_name(b.finish);
  }
  return ::testing::AssertionSuccess();
}

inline void expect_same(const Response& a, const Response& b, const std::string& what) {
  ASSERT_EQ(a.samples.size(), b.samples.size()) << what;
  for (size_t i = 0; i < a.samples.size(); ++i) {
    EXPECT_TRUE(same_sample(a.samples[i], b.samples[i])) << what << ", sample " << i;
  }
}

// ---- Sampler settings ---------------------------------------------------------

struct Combo {
  std::string name;
  Request p;
};

inline Request base_params() {
  Request p;
  p.max_tokens = kN;
  p.seed = kSeed;
  p.logprobs = 3;
  return p;
}

inline Request pure(float temp) {
  Request p = base_params();
  p.sampling.temp = temp;
  p.sampling.top_k = 0;
  p.sampling.top_p = 1.0f;
  p.sampling.min_p = 0.0f;
  return p;
}

// A stop string that spans the boundary between generated tokens j and j+1
// of `s` (two bytes each side where there are), so that a generation with it
// holds back a partial match for at least one token.
inline std::string stop_spanning(const Lm& lm, const SampleResult& s, bool strip_leading_space) {
  StreamDecoder dec(*lm.tok, strip_leading_space);
  std::vector<std::string> pieces;
  for (TokenId id : s.ids) pieces.push_back(dec.push(id));
  std::string before;
  for (size_t j = 0; j + 1 < pieces.size(); ++j) {
    before += pieces[j];
    if (j >= 8 && before.size() >= 2 && !pieces[j + 1].empty()) {
      return before.substr(before.size() - 2) + pieces[j + 1].substr(0, 2);
    }
  }
  return "e";  // a degenerate output; still a valid stop string
}

// The settings every test runs, at temperatures 0.7 and 1.0. Some depend on
// the model (the logit bias bans the likeliest first token, the stop string
// comes from a run without it).
inline std::vector<Combo> combos(const Lm& lm) {
  std::vector<Combo> v;
  {
    Request p = base_params();
    p.sampling.temp = 0.7f;
    p.sampling.top_k = 40;
    p.sampling.top_p = 0.9f;
    p.sampling.min_p = 0.05f;
    v.push_back({"t0.7 top_k top_p min_p", p});
  }
  v.push_back({"t1.0 full distribution", pure(1.0f)});
  {
    Request p = pure(1.0f);
    p.sampling.typical_p = 0.9f;
    v.push_back({"t1.0 typical", p});
  }
  {
    Request p = pure(0.7f);
    p.sampling.top_p = 0.95f;
    p.sampling.repeat_penalty = 1.3f;
    p.sampling.repeat_last_n = 16;
    p.sampling.presence_penalty = 0.4f;
    p.sampling.frequency_penalty = 0.2f;
    v.push_back({"t0.7 penalties", p});
  }
  {
    // The likeliest first token is banned; another gets +2.5.
    Rig e(lm, 2, detect_best_isa());
    const Response r = run(lm, e, pure(1.0f));
    const std::vector<TokenLogprob>& top = r.samples[0].logprobs.at(0).top;
    Request p = pure(1.0f);
    p.sampling.top_k = 50;
    p.sampling.min_p = 0.02f;
    p.sampling.repeat_penalty = 1.1f;
    p.sampling.repeat_last_n = -1;
    p.sampling.logit_bias = {{top.at(0).id, -std::numeric_limits<float>::infinity()},
                             {top.at(2).id, 2.5f},
                             {(top.at(1).id + 7) % lm.model->hparams().n_vocab, -1.0f}};
    p.sampling.order = parse_sampler_order("temperature;top_k;min_p;penalties");
    v.push_back({"t1.0 logit bias, stage order", p});
  }
  {
    Request p = base_params();
    p.sampling.temp = 0.7f;
    p.sampling.top_k = 40;
    p.sampling.top_p = 0.95f;
    Rig e(lm, 2, detect_best_isa());
    const Response r = run(lm, e, p);
    p.stop = {stop_spanning(lm, r.samples[0], false), "\x01never"};
    v.push_back({"t0.7 stop strings", p});
  }
  return v;
}

// ---- The parameterised suite ----------------------------------------------------

class Repro : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    const ModelCase& c = GetParam();
    if (c.preset.empty()) {
      ENCORE_SHARED_FILE(path, "models/stories260K.gguf");
      lm_ = stories_lm(path);
    } else {
      lm_ = synth_lm(c.preset, c.type);
    }
    ASSERT_GE(lm_->prompt.size(), 65u) << "the prompt must be longer than a chunk of 64";
    static std::map<const Lm*, std::vector<Combo>> cache;
    auto it = cache.find(lm_);
    if (it == cache.end()) it = cache.emplace(lm_, combos(*lm_)).first;
    combos_ = &it->second;
  }

  const Lm& lm() const { return *lm_; }
  const Model& model() const { return *lm_->model; }

  const Lm* lm_ = nullptr;
  const std::vector<Combo>* combos_ = nullptr;
};

}  // namespace encore::repro_test
