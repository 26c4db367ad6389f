// The reproducibility contract (docs/reproducibility.md) end to end through
// generate(): sample i of a request -- its token ids, the bits of every
// logprob (top alternatives included), its text and finish reason -- is the
// same on repeated runs and whatever the thread count, the prefill chunk
// size, the ISA, the other sequences sharing its forward steps, the number
// of samples n, and whether it was paused and resumed. Identical, not close.
//
// Every check runs on stories260K (a trained model, peaked distributions)
// and on synthetic models of two weight types (random weights, flat-ish
// distributions), under several sampler settings at temperatures 0.7 and
// 1.0: truncation (top-k, top-p, min-p), typical, penalties, logit bias
// with another stage order, and stop strings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
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

namespace encore {
namespace {

constexpr int kCtx = 256;
constexpr int32_t kN = 32;  // tokens per sample of most requests
constexpr uint64_t kSeed = 0x5eed1234abcdull;

const char* const kPromptText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park with her friends. One day, she saw a big red ball under a tall tree. She ran to get "
    "it, but a small brown dog took it first. Lily was sad, so she";
const char* const kOtherText =
    "Tom and his dog Max went to the beach. The sun was hot and the water was cold, so they "
    "sat on the sand and ate apples and bread until the birds came to";

// ---- Models ---------------------------------------------------------------

struct ModelCase {
  std::string name;    // test name part
  std::string preset;  // "" = stories260K from the shared folder
  DType type = DType::F32;
};

void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }

// A loaded model, its tokenizer and the prompts used on it.
struct Lm {
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::vector<TokenId> prompt;  // ~70+ tokens: chunk 64 splits it
  std::vector<TokenId> other;   // a second, different text
};

std::vector<TokenId> encode_with_bos(const Tokenizer& tok, const std::string& text) {
  Tokenizer::EncodeOptions o;
  o.add_bos = true;
  return tok.encode(text, o);
}

std::unique_ptr<Lm> make_lm(gguf::File file) {
  auto lm = std::make_unique<Lm>();
  lm->file = std::make_shared<const gguf::File>(std::move(file));
  lm->model = Model::load(*lm->file);
  lm->tok = Tokenizer::create(vocab_from_gguf(*lm->file));
  lm->prompt = encode_with_bos(*lm->tok, kPromptText);
  lm->other = encode_with_bos(*lm->tok, kOtherText);
  return lm;
}

// Models are loaded once per process.
const Lm* stories_lm(const std::string& path) {
  static std::unique_ptr<Lm> lm;
  if (!lm) lm = make_lm(gguf::File::open(path));
  return lm.get();
}

const Lm* synth_lm(const std::string& preset, DType type) {
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
Isa other_isa() {
  for (Isa i : {Isa::Avx2, Isa::Avx512, Isa::Scalar}) {
    if (isa_supported(i) && i != detect_best_isa()) return i;
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

std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (isa_supported(i)) v.push_back(i);
  }
  return v;
}

// The request through the engine: its streamed text must equal each
// sample's text, and no KV block may stay in use afterwards.
Response run(const Lm& lm, Rig& e, const Request& p,
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

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

::testing::AssertionResult same_logprobs(const std::vector<LogprobEntry>& a,
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

std::string ids_str(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) s += std::to_string(id) + " ";
  return s;
}

::testing::AssertionResult same_sample(const SampleResult& a, const SampleResult& b) {
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

void expect_same(const Response& a, const Response& b, const std::string& what) {
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

Request base_params() {
  Request p;
  p.max_tokens = kN;
  p.seed = kSeed;
  p.logprobs = 3;
  return p;
}

Request pure(float temp) {
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
std::string stop_spanning(const Lm& lm, const SampleResult& s, bool strip_leading_space) {
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
std::vector<Combo> combos(const Lm& lm) {
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

TEST_P(Repro, RepeatedRunsAndFreshContextsAgree) {
  Rig e(lm(), 2, detect_best_isa());
  for (const Combo& c : *combos_) {
    const Response a = run(lm(), e, c.p);
    ASSERT_FALSE(a.samples[0].ids.empty()) << c.name;
    expect_same(a, run(lm(), e, c.p), c.name + ": second run, same context");
    expect_same(a, run(lm(), e, c.p), c.name + ": third run, same context");
    Rig fresh(lm(), 2, detect_best_isa());
    expect_same(a, run(lm(), fresh, c.p), c.name + ": fresh context and KV pool");
    // Another seed gives another output.
    Request q = c.p;
    q.seed = *c.p.seed + 1;
    EXPECT_NE(run(lm(), e, q).samples[0].ids, a.samples[0].ids) << c.name << ": seed + 1";
  }
}

TEST_P(Repro, ThreadCountsDoNotMatter) {
  Rig ref(lm(), 2, detect_best_isa());
  for (const Combo& c : *combos_) {
    const Response want = run(lm(), ref, c.p);
    for (int t : {1, 2, 3}) {
      Rig e(lm(), t, detect_best_isa());
      expect_same(want, run(lm(), e, c.p), c.name + ": " + std::to_string(t) + " threads");
    }
  }
}

TEST_P(Repro, PrefillChunksDoNotMatter) {
  Rig e(lm(), 2, detect_best_isa());
  std::vector<std::unique_ptr<Rig>> chunked;
  const std::vector<int> chunks = {1, 7, 64, static_cast<int>(lm().prompt.size())};
  for (int chunk : chunks) {
    chunked.push_back(std::make_unique<Rig>(lm(), 2, detect_best_isa(), kCtx, 10, chunk));
  }
  for (const Combo& c : *combos_) {
    const Response want = run(lm(), e, c.p);
    for (size_t k = 0; k < chunks.size(); ++k) {
      expect_same(want, run(lm(), *chunked[k], c.p),
                  c.name + ": steps of " + std::to_string(chunks[k]) + " tokens");
    }
  }
}

TEST_P(Repro, IsasDoNotMatter) {
  Rig ref(lm(), 2, Isa::Scalar);
  const std::vector<Isa> all = isas();
  for (const Combo& c : *combos_) {
    const Response want = run(lm(), ref, c.p);
    for (Isa isa : all) {
      if (isa == Isa::Scalar) continue;
      Rig e(lm(), 2, isa);
      expect_same(want, run(lm(), e, c.p), c.name + ": " + isa_name(isa) + " vs scalar");
    }
  }
  if (all.size() < 3) std::printf("note: only %zu ISA(s) on this CPU\n", all.size());
}

TEST_P(Repro, SamplesOfNEightEqualThoseOfNThree) {
  Rig e(lm(), 2, detect_best_isa());
  for (const Combo& c : *combos_) {
    Request p = c.p;
    p.n = 3;
    const Response three = run(lm(), e, p);
    p.n = 8;
    const Response eight = run(lm(), e, p);
    p.n = 1;
    const Response one = run(lm(), e, p);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(same_sample(three.samples[i], eight.samples[i]))
          << c.name << ": sample " << i << " of n=3 vs n=8";
    }
    EXPECT_TRUE(same_sample(one.samples[0], three.samples[0])) << c.name << ": n=1 vs n=3";
    // The samples are different draws, not copies.
    std::set<std::vector<TokenId>> distinct;
    for (const SampleResult& s : eight.samples) distinct.insert(s.ids);
    EXPECT_GE(distinct.size(), 4u) << c.name << ": 8 samples, few distinct";
  }
}

// ---- Batch composition: a manual scheduler --------------------------------------

// One sample of one request in the manual driver: what generate() does for
// it, written out with Sampler and ForwardContext::step.
struct Stream {
  const std::vector<TokenId>* prompt = nullptr;
  Request p;
  int sample = 0;
  int start_step = 0;   // joins the batch at this step
  int chunk = 1;        // prefill tokens per step
  int pause_every = 0;  // sits out steps where (step % pause_every) == 0 (0: never)
  KvSequence seq;
  std::unique_ptr<Sampler> sampler;
  size_t prefilled = 0;
  std::vector<float> logits;
  bool have_logits = false;
  TokenId next = -1;
  bool done = false;
  SampleResult out;
};

// Samples the next token of `s` from its logits, as generate() does.
void advance(Stream& s, const Tokenizer& tok, const ForwardContext& ctx) {
  s.have_logits = false;
  if (s.p.max_tokens >= 0 && s.out.ids.size() >= static_cast<size_t>(s.p.max_tokens)) {
    s.done = true;
    s.out.finish = FinishReason::Length;
    return;
  }
  const TokenId id = s.sampler->sample(s.logits);
  ASSERT_GE(id, 0);
  if (tok.is_eog(id)) {
    s.done = true;
    s.out.finish = FinishReason::Eog;
    return;
  }
  if (s.p.logprobs >= 0)
    s.out.logprobs.push_back(token_logprobs(s.logits, id, s.p.logprobs, ctx.isa()));
  s.sampler->accept(id);
  s.out.ids.push_back(id);
  if (s.seq.n_tokens >= ctx.n_ctx()) {
    s.done = true;
    s.out.finish = FinishReason::Context;
    return;
  }
  s.next = id;
}

// Runs every stream to completion on one context, many sequences per step,
// in an order that changes every step; streams join late, prefill in chunks
// while others decode, and sit out steps.
void drive(ForwardContext& ctx, const Tokenizer& tok, std::vector<Stream>& streams) {
  const size_t n_vocab = static_cast<size_t>(ctx.model().hparams().n_vocab);
  for (Stream& s : streams) {
    SamplingParams sp = s.p.sampling;
    if (sp.repeat_last_n < 0) sp.repeat_last_n = ctx.n_ctx();
    s.sampler =
        std::make_unique<Sampler>(sp, *s.p.seed, static_cast<uint32_t>(s.sample), ctx.isa());
    s.sampler->accept_prompt(*s.prompt);
    s.logits.assign(n_vocab, 0.0f);
  }
  for (int step = 0;; ++step) {
    ASSERT_LT(step, 10000);
    bool any_left = false;
    std::vector<Stream*> order;
    for (Stream& s : streams) order.push_back(&s);
    std::rotate(order.begin(), order.begin() + step % order.size(), order.end());
    if (step % 2) std::reverse(order.begin(), order.end());
    std::vector<SeqTokens> batch;
    std::vector<Stream*> in_batch;
    for (Stream* s : order) {
      if (s->done) continue;
      any_left = true;
      if (step < s->start_step) continue;
      if (s->pause_every > 0 && step % s->pause_every == 0) continue;
      if (s->prefilled < s->prompt->size()) {
        const size_t count =
            std::min<size_t>(static_cast<size_t>(s->chunk), s->prompt->size() - s->prefilled);
        const bool last = s->prefilled + count == s->prompt->size();
        batch.push_back({&s->seq, std::span<const TokenId>(*s->prompt).subspan(s->prefilled, count),
                         last ? std::span<float>(s->logits) : std::span<float>()});
        s->prefilled += count;
        if (last) in_batch.push_back(s);
      } else {
        batch.push_back({&s->seq, std::span<const TokenId>(&s->next, 1), s->logits});
        in_batch.push_back(s);
      }
    }
    if (!any_left) break;
    if (batch.empty()) continue;
    ctx.step(batch);
    for (Stream* s : in_batch) {
      advance(*s, tok, ctx);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  for (Stream& s : streams) s.seq.release(ctx.pool());
}

TEST_P(Repro, BatchCompositionDoesNotMatter) {
  const std::vector<TokenId> short_a(lm().other.begin(), lm().other.begin() + 5);
  const std::vector<TokenId> short_b(lm().other.begin(), lm().other.begin() + 23);
  const std::vector<TokenId>& long_c = lm().other;
  for (const Combo& c : *combos_) {
    if (!c.p.stop.empty()) continue;  // the driver has no stop strings
    // The request under test: 2 samples of the main prompt. Alone (generate(),
    // prompt prefilled once and forked) it is the reference.
    Request main = c.p;
    main.n = 2;
    Rig ref(lm(), 2, detect_best_isa());
    const Response want = run(lm(), ref, main);
    // Companions: other prompts, lengths, settings and seeds.
    Request comp_a = pure(1.0f);
    comp_a.seed = 7;
    comp_a.max_tokens = 50;
    Request comp_b = combos_->front().p;
    comp_b.seed = 99;
    comp_b.max_tokens = 9;
    Request comp_c = pure(0.7f);
    comp_c.seed = 3;
    comp_c.max_tokens = 20;
    comp_c.logprobs = 0;

    for (int variant = 0; variant < 2; ++variant) {
      Forward e(model(), variant == 0 ? 3 : 1, variant == 0 ? detect_best_isa() : other_isa());
      std::vector<Stream> streams(6);
      auto set = [&](Stream& s, const std::vector<TokenId>& prompt, const Request& p, int sample,
                     int start, int chunk, int pause) {
        s.prompt = &prompt;
        s.p = p;
        s.sample = sample;
        s.start_step = start;
        s.chunk = chunk;
        s.pause_every = pause;
      };
      // Each sample of the main request recomputes the prompt itself (no
      // fork), in chunks of its own, while the companions come and go.
      set(streams[0], lm().prompt, main, 0, variant == 0 ? 0 : 4, variant == 0 ? 5 : 64, 0);
      set(streams[1], lm().prompt, main, 1, variant == 0 ? 6 : 0, variant == 0 ? 17 : 1, 7);
      set(streams[2], short_a, comp_a, 0, 0, 1, 3);
      set(streams[3], short_b, comp_b, 0, 2, 7, 0);
      set(streams[4], long_c, comp_c, 0, variant == 0 ? 30 : 1, 64, 0);
      set(streams[5], short_b, comp_b, 1, 11, 23, 5);
      drive(e.ctx, *lm().tok, streams);
      if (HasFatalFailure()) return;
      const std::string what =
          c.name + (variant == 0 ? " (3 threads)"
                                 : " (1 thread, " + std::string(isa_name(other_isa())) + ")");
      for (int i = 0; i < 2; ++i) {
        const SampleResult& w = want.samples[static_cast<size_t>(i)];
        const SampleResult& g = streams[static_cast<size_t>(i)].out;
        EXPECT_EQ(g.ids, w.ids) << what << ": sample " << i << " batched vs alone";
        EXPECT_TRUE(same_logprobs(g.logprobs, w.logprobs)) << what << ": sample " << i;
        EXPECT_EQ(g.finish, w.finish) << what << ": sample " << i;
      }
      // The companions equal their own requests run alone.
      struct Companion {
        size_t stream;
        const std::vector<TokenId>* prompt;
        Request p;
      };
      for (const Companion& k : {Companion{2, &short_a, comp_a}, Companion{3, &short_b, comp_b},
                                 Companion{4, &long_c, comp_c}, Companion{5, &short_b, comp_b}}) {
        Request p = k.p;
        p.n = streams[k.stream].sample + 1;
        const Response alone = run(lm(), ref, p, nullptr, k.prompt);
        const SampleResult& w = alone.samples.back();
        const SampleResult& g = streams[k.stream].out;
        EXPECT_EQ(g.ids, w.ids) << what << ": companion stream " << k.stream;
        EXPECT_TRUE(same_logprobs(g.logprobs, w.logprobs)) << what << ": companion " << k.stream;
        EXPECT_EQ(g.finish, w.finish) << what << ": companion " << k.stream;
      }
    }
  }
}

// ---- Pause and resume -------------------------------------------------------------

// Text of a paused-then-resumed sample: the first call, ending at -n, shows
// all its text (engine.h, SampleState::held_shown), so when it paused inside
// a partial stop-string match that the continuation completes, the shown
// part of the stop string stays in the concatenation. Otherwise the
// concatenation is exactly the uninterrupted text.
void expect_resumed_text(const std::string& concat, const SampleResult& full,
                         const SampleState& paused, const std::vector<std::string>& stops,
                         const std::string& what) {
  ASSERT_EQ(concat.compare(0, full.text.size(), full.text), 0)
      << what << ": resumed text '" << concat << "' does not start with '" << full.text << "'";
  const std::string extra = concat.substr(full.text.size());
  if (extra.empty()) return;
  EXPECT_EQ(full.finish, FinishReason::Stop) << what << ": extra text '" << extra << "'";
  EXPECT_FALSE(paused.held_text.empty()) << what << ": extra text without a held partial match";
  bool prefix_of_stop = false;
  for (const std::string& s : stops) {
    prefix_of_stop |= extra.size() < s.size() && s.compare(0, extra.size(), extra) == 0;
  }
  EXPECT_TRUE(prefix_of_stop) << what << ": extra text '" << extra
                              << "' is not the start of a stop string";
}

void expect_same_state(const SampleState& a, const SampleState& b, const std::string& what) {
  EXPECT_EQ(a.ids, b.ids) << what;
  EXPECT_EQ(a.sampler.t, b.sampler.t) << what;
  EXPECT_EQ(a.sampler.recent, b.sampler.recent) << what;
  EXPECT_EQ(a.finished, b.finished) << what;
  EXPECT_EQ(a.decoder.pending, b.decoder.pending) << what;
}

TEST_P(Repro, ResumeEqualsUninterrupted) {
  Rig e(lm(), 2, detect_best_isa());
  // The continuation runs on another schedule: another ISA, 1 thread, chunk 7.
  Rig other(lm(), 1, other_isa(), kCtx, 10, 7);
  Rig e7(lm(), 2, detect_best_isa(), kCtx, 10, 7);
  int paused_inside_stop = 0;
  for (const Combo& c : *combos_) {
    Request p = c.p;
    p.n = 2;
    const Response full = run(lm(), e, p);
    std::set<int32_t> ks = {0, 1, 5, kN - 1, kN};
    for (const SampleResult& s : full.samples) {
      const auto m = static_cast<int32_t>(s.ids.size());
      if (s.finish == FinishReason::Stop) {
        // Right inside the partial match (before the token completing it),
        // and right after the stop.
        if (m >= 2) ks.insert(m - 2);
        ks.insert(m - 1);
        ks.insert(m);
      }
    }
    for (int32_t k : ks) {
      const std::string what = c.name + ", pause after " + std::to_string(k);
      Request first = p;
      first.max_tokens = k;
      const Response a = run(lm(), e, first);
      Request rest = p;
      rest.max_tokens = kN - k;
      const Response b = run(lm(), k % 2 ? other : e7, rest, &a.states);
      for (size_t i = 0; i < 2; ++i) {
        const std::string w = what + ", sample " + std::to_string(i);
        std::vector<TokenId> ids = a.samples[i].ids;
        ids.insert(ids.end(), b.samples[i].ids.begin(), b.samples[i].ids.end());
        EXPECT_EQ(ids, full.samples[i].ids) << w;
        std::vector<LogprobEntry> lps = a.samples[i].logprobs;
        lps.insert(lps.end(), b.samples[i].logprobs.begin(), b.samples[i].logprobs.end());
        EXPECT_TRUE(same_logprobs(lps, full.samples[i].logprobs)) << w;
        EXPECT_EQ(b.samples[i].finish, full.samples[i].finish) << w;
        expect_resumed_text(a.samples[i].text + b.samples[i].text, full.samples[i], a.states[i],
                            p.stop, w);
        expect_same_state(b.states[i], full.states[i], w + ": final state");
        if (a.samples[i].finish == FinishReason::Length && !a.states[i].held_text.empty() &&
            full.samples[i].finish == FinishReason::Stop) {
          ++paused_inside_stop;
        }
      }
    }
  }
  EXPECT_GT(paused_inside_stop, 0) << "no pause landed inside a partial stop-string match";
}

TEST_P(Repro, ResumeInSeveralPausesEqualsUninterrupted) {
  Rig e(lm(), 2, detect_best_isa());
  for (const Combo& c : *combos_) {
    Request p = c.p;
    p.n = 2;
    const Response full = run(lm(), e, p);
    std::vector<SampleResult> acc(2);
    std::vector<SampleState> states;
    int done = 0;
    for (int32_t part : {3, 0, 8, 1, kN - 12}) {
      Request q = p;
      q.max_tokens = part;
      const Response r = run(lm(), e, q, states.empty() ? nullptr : &states);
      for (size_t i = 0; i < 2; ++i) {
        acc[i].ids.insert(acc[i].ids.end(), r.samples[i].ids.begin(), r.samples[i].ids.end());
        acc[i].logprobs.insert(acc[i].logprobs.end(), r.samples[i].logprobs.begin(),
                               r.samples[i].logprobs.end());
        acc[i].finish = r.samples[i].finish;
      }
      states = r.states;
      done += part;
    }
    ASSERT_EQ(done, kN);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(acc[i].ids, full.samples[i].ids) << c.name << ", sample " << i;
      EXPECT_TRUE(same_logprobs(acc[i].logprobs, full.samples[i].logprobs)) << c.name;
      EXPECT_EQ(acc[i].finish, full.samples[i].finish) << c.name << ", sample " << i;
    }
  }
}

TEST_P(Repro, SeedsGiveDistinctOutputs) {
  Rig e(lm(), 2, detect_best_isa());
  Request p = pure(1.0f);
  std::set<std::vector<TokenId>> seen;
  std::map<uint64_t, std::vector<TokenId>> by_seed;
  // Seeds that differ in one low bit, one high bit (the key's second word),
  // and the top bit.
  const std::vector<uint64_t> seeds = {0,          1,    2, 3, 42, 1ull << 32, (1ull << 32) + 1,
                                       1ull << 63, ~0ull};
  for (uint64_t seed : seeds) {
    p.seed = seed;
    const std::vector<TokenId> ids = run(lm(), e, p).samples[0].ids;
    EXPECT_TRUE(seen.insert(ids).second) << "seed " << seed << " repeats another seed's output";
    by_seed[seed] = ids;
  }
  for (uint64_t seed : {0ull, 1ull << 32, ~0ull}) {
    p.seed = seed;
    EXPECT_EQ(run(lm(), e, p).samples[0].ids, by_seed[seed]) << "seed " << seed;
  }
}

std::vector<ModelCase> model_cases() {
  return {{"stories260K", "", DType::F32},
          {"synth_tiny_Q8_0", "tiny", DType::Q8_0},
          {"synth_qwen2_Q4_K", "tiny-qwen2", DType::Q4_K},
          {"synth_llama3_F16", "tiny-llama3", DType::F16}};
}

INSTANTIATE_TEST_SUITE_P(Models, Repro, ::testing::ValuesIn(model_cases()),
                         [](const ::testing::TestParamInfo<ModelCase>& info) {
                           return info.param.name;
                         });

// ---- Single-model checks ------------------------------------------------------------

// At temperature 1 over the whole distribution, different seeds explore:
// nearly every seed gives its own completion.
TEST(ReproDiversity, HundredSeedsGiveManyDistinctCompletions) {
  ENCORE_SHARED_FILE(path, "models/stories260K.gguf");
  const Lm& lm = *stories_lm(path);
  Rig e(lm, 2, detect_best_isa());
  Request p = pure(1.0f);
  p.logprobs = -1;
  const std::vector<TokenId> prompt = encode_with_bos(*lm.tok, "Once upon a time");
  std::set<std::vector<TokenId>> distinct;
  std::vector<TokenId> seed7;
  size_t total_tokens = 0;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    p.seed = seed;
    const Response r = run(lm, e, p, nullptr, &prompt);
    distinct.insert(r.samples[0].ids);
    total_tokens += r.samples[0].ids.size();
    if (seed == 7) seed7 = r.samples[0].ids;
  }
  std::printf(
      "distinct completions: %zu / 100 (stories260K, temperature 1.0, %d tokens, %zu "
      "tokens in all)\n",
      distinct.size(), kN, total_tokens);
  RecordProperty("distinct_completions", static_cast<int>(distinct.size()));
  EXPECT_GE(distinct.size(), 90u);
  p.seed = 7;
  EXPECT_EQ(run(lm, e, p, nullptr, &prompt).samples[0].ids, seed7) << "same seed, same output";
}

// A sample that ended because the context filled up resumes as finished
// (nothing more to generate), like one that ended at a stop string or EOG.
TEST(ReproResume, ContextFullAcrossAPause) {
  const Lm& lm = *synth_lm("tiny", DType::Q8_0);
  constexpr int kSmallCtx = 40;
  Rig e(lm, 2, detect_best_isa(), kSmallCtx);
  const std::vector<TokenId> prompt(lm.prompt.begin(), lm.prompt.begin() + 20);
  Request p = pure(1.0f);
  p.max_tokens = -1;
  p.n = 2;
  const Response full = run(lm, e, p, nullptr, &prompt);
  for (const SampleResult& s : full.samples) {
    ASSERT_EQ(s.finish, FinishReason::Context);
    ASSERT_EQ(s.ids.size(), static_cast<size_t>(kSmallCtx - 20 + 1));
  }
  const int32_t n_full = static_cast<int32_t>(full.samples[0].ids.size());
  for (int32_t k : {0, 5, n_full - 1, n_full}) {
    Request first = p;
    first.max_tokens = k;
    const Response a = run(lm, e, first, nullptr, &prompt);
    Request rest = p;  // -1: until the context is full
    const Response b = run(lm, e, rest, &a.states, &prompt);
    for (size_t i = 0; i < 2; ++i) {
      std::vector<TokenId> ids = a.samples[i].ids;
      ids.insert(ids.end(), b.samples[i].ids.begin(), b.samples[i].ids.end());
      EXPECT_EQ(ids, full.samples[i].ids) << "pause after " << k << ", sample " << i;
      EXPECT_EQ(b.samples[i].finish, FinishReason::Context) << "pause after " << k;
      EXPECT_EQ(a.samples[i].text + b.samples[i].text, full.samples[i].text) << "pause after " << k;
    }
  }
}

}  // namespace
}  // namespace encore
