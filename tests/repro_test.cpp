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

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "repro_test_util.h"

namespace encore::repro_test {
namespace {

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
  EXPECT_EQ(a.decoder_pending, b.decoder_pending) << what;
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
}  // namespace encore::repro_test
