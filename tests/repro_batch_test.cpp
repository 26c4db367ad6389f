// The reproducibility contract (docs/reproducibility.md) under batching: a
// sample is the same whatever other sequences share its forward steps, when
// they join, how their prompts are chunked and whether they sit out steps.
// A manual scheduler (Sampler + ForwardContext::step) drives the mixes.

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "repro_test_util.h"

namespace encore::repro_test {
namespace {

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

}  // namespace
}  // namespace encore::repro_test
