// Sampling (include/encore/sampler.h, include/encore/rng.h): the Philox
// stream, the uniform conversions, every stage against hand-computed values,
// the stage order, parameter checks, the Sampler state and the categorical
// draw spec. Faithfulness and ISA independence: sampler_faithfulness_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "encore/error.h"
#include "encore/isa.h"
#include "encore/rng.h"
#include "encore/sampler.h"
#include "sampling_test_util.h"

namespace encore {
namespace {

using test::busy_params;
using test::plain;
using test::varied_logits;

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- helpers ---------------------------------------------------------------

std::vector<TokenId> ids_of(const Candidates& c) {
  std::vector<TokenId> out;
  for (const TokenData& t : c.items) out.push_back(t.id);
  return out;
}

Candidates candidates(const std::vector<float>& logits) {
  Candidates c;
  c.reset(logits);
  return c;
}

// True if the candidates are in the canonical order (logit desc, id asc).
bool canonical(const Candidates& c) {
  for (size_t i = 1; i < c.items.size(); ++i) {
    const TokenData& a = c.items[i - 1];
    const TokenData& b = c.items[i];
    if (!(a.logit > b.logit || (a.logit == b.logit && a.id < b.id))) return false;
  }
  return true;
}

// ---- Philox, uniforms, argmax ------------------------------------------------

// Known-answer vectors of Random123's kat_vectors for philox4x32 with 10 rounds.
TEST(Philox, KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Philox4x32Counter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(
      philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
      (Philox4x32Counter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
      (Philox4x32Counter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, StreamLayoutSeparatesSeedSampleTokenAndPurpose) {
  const auto base = random_words(42, 0, 7, 0);
  EXPECT_EQ(base, random_words(42, 0, 7, 0));
  EXPECT_NE(base, random_words(43, 0, 7, 0));
  EXPECT_NE(base, random_words(42, 1, 7, 0));
  EXPECT_NE(base, random_words(42, 0, 8, 0));
  EXPECT_NE(base, random_words(42, 0, 7, 1));
  EXPECT_NE(random_words(1, 0, 0), random_words(1ull << 32, 0, 0));  // both seed halves count
  EXPECT_NE(random_words(1, 0, 1), random_words(1, 0, 1ull << 32));  // both t halves count
  // The layout itself: key = seed halves, counter = (t_lo, t_hi, sample, purpose).
  EXPECT_EQ(random_words(0x0123456789abcdefull, 5, 0x0000000700000009ull, 3),
            philox4x32_10({9, 7, 5, 3}, {0x89abcdef, 0x01234567}));
}

TEST(Uniform, RangeAndResolution) {
  EXPECT_EQ(uniform_from_word(0), 0.0f);
  EXPECT_LT(uniform_from_word(0xffffffffu), 1.0f);
  EXPECT_EQ(uniform_from_word(0x80000000u), 0.5f);
  EXPECT_EQ(uniform_from_word(0x100u), 1.0f / 16777216.0f);
}

TEST(UniformDouble, RangeEndpoints) {
  EXPECT_EQ(uniform_double(0, 0), 0.0);
  EXPECT_EQ(uniform_double(0xffffffffu, 0xffffffffu), 1.0 - 0x1p-53);  // the largest value, < 1
  EXPECT_LT(uniform_double(0xffffffffu, 0xffffffffu), 1.0);
  EXPECT_EQ(uniform_double(0x80000000u, 0), 0.5);
}

TEST(UniformDouble, ResolutionIsTwoToTheMinus53) {
  EXPECT_EQ(uniform_double(0, 1u << 11), 0x1p-53);    // the lowest bit that counts
  EXPECT_EQ(uniform_double(0, (1u << 11) - 1), 0.0);  // the 11 low bits of lo are dropped
  // Every value is a multiple of 2^-53 below 1 (exact: 53 bits fit a double).
  for (uint64_t t = 0; t < 2000; ++t) {
    const Philox4x32Counter w = random_words(77, 0, t);
    const double u = uniform_double(w[0], w[1]);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const double scaled = std::ldexp(u, 53);
    ASSERT_EQ(scaled, std::floor(scaled)) << t;
  }
}

TEST(UniformDouble, UsesBothWords) {
  // hi supplies the top 32 bits, the top 21 bits of lo the rest.
  EXPECT_EQ(uniform_double(1, 0), 0x1p-32);
  EXPECT_EQ(uniform_double(0, 0x80000000u), 0x1p-33);
  EXPECT_EQ(uniform_double(0, 0xffffffffu), 0x1p-32 - 0x1p-53);
  EXPECT_NE(uniform_double(5, 0x12345678u), uniform_double(5, 0x92345678u));
  EXPECT_NE(uniform_double(5, 0x12345678u), uniform_double(6, 0x12345678u));
  // Same hi, different lo: values differ below 2^-32 only.
  const double a = uniform_double(0xdeadbeefu, 0);
  const double b = uniform_double(0xdeadbeefu, 0xfffff800u);
  EXPECT_GT(b, a);
  EXPECT_LT(b - a, 0x1p-32);
}

TEST(Argmax, TiesGoToLowestIdAndNaNNeverWins) {
  EXPECT_EQ(argmax(std::vector<float>{1, 3, 3, 2}), 1);
  EXPECT_EQ(argmax(std::vector<float>{NAN, 0.5f, NAN, 0.5f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{-INFINITY, -INFINITY}), 0);
  EXPECT_EQ(argmax(std::vector<float>{NAN, NAN}), -1);
}

// ---- Candidates and the draw ---------------------------------------------------

TEST(Candidates, ResetSkipsNaNAndKeepTopSorts) {
  Candidates c = candidates({1.0f, NAN, 3.0f, 3.0f, -kInf, 2.0f});
  EXPECT_EQ(ids_of(c), (std::vector<TokenId>{0, 2, 3, 4, 5}));
  EXPECT_FALSE(c.sorted);
  c.sort();
  EXPECT_TRUE(c.sorted);
  EXPECT_EQ(ids_of(c), (std::vector<TokenId>{2, 3, 5, 0, 4}));
  Candidates d = candidates({1.0f, NAN, 3.0f, 3.0f, -kInf, 2.0f});
  d.keep_top(2);
  EXPECT_TRUE(d.sorted);
  EXPECT_EQ(ids_of(d), (std::vector<TokenId>{2, 3}));
  d.keep_top(10);
  EXPECT_EQ(ids_of(d), (std::vector<TokenId>{2, 3}));
}

TEST(Draw, RunningSumInIdOrderExceedsUTimesTotal) {
  // Four equal weights (logit == l_max: w = 1 exactly): total 4.
  Candidates c = candidates({0.0f, 0.0f, 0.0f, 0.0f});
  EXPECT_EQ(draw(c, 0.0, Isa::Scalar), 0);
  EXPECT_EQ(draw(c, 0.2499, Isa::Scalar), 0);
  EXPECT_EQ(draw(c, 0.25, Isa::Scalar), 1);  // running 1 > 1 fails: strictly exceeds
  EXPECT_EQ(draw(c, 0.4999, Isa::Scalar), 1);
  EXPECT_EQ(draw(c, 0.5, Isa::Scalar), 2);
  EXPECT_EQ(draw(c, 1.0 - 0x1p-53, Isa::Scalar), 3);
  // A sorted set draws the same (the sum runs in id order either way).
  Candidates s = candidates({0.0f, 1.0f, -1.0f, 0.5f});
  Candidates u = s;
  s.sort();
  for (double x = 0.0; x < 1.0; x += 0.01) {
    ASSERT_EQ(draw(s, x, Isa::Scalar), draw(u, x, Isa::Scalar)) << x;
  }
  // A banned token (weight 0) is never drawn, even at u = 0.
  Candidates b = candidates({-kInf, 0.0f, 0.0f});
  EXPECT_EQ(draw(b, 0.0, Isa::Scalar), 1);
  // Everything banned: uniform.
  Candidates all = candidates({-kInf, -kInf, -kInf, -kInf});
  EXPECT_EQ(draw(all, 0.0, Isa::Scalar), 0);
  EXPECT_EQ(draw(all, 0.3, Isa::Scalar), 1);
  EXPECT_EQ(draw(all, 0.9, Isa::Scalar), 3);
}

TEST(Draw, SamplerFollowsTheSpecifiedDraw) {
  // p = 1/4, 3/4: token 0 exactly when u * total < w_0, i.e. u < ~1/4, with
  // u = uniform_double(words[0], words[1]) of (seed, stream, t, purpose 0).
  const std::vector<float> logits = {0.0f, std::log(3.0f)};
  Sampler s(plain(), 9, 4, Isa::Scalar);
  int ones = 0;
  const int n = 4000;
  for (int t = 0; t < n; ++t) {
    s.restore({static_cast<uint64_t>(t), {}});
    const Philox4x32Counter w = random_words(9, 4, static_cast<uint64_t>(t), 0);
    const double u = uniform_double(w[0], w[1]);
    const TokenId tok = s.sample(logits);
    ones += tok;
    if (std::fabs(u - 0.25) > 1e-6) {
      ASSERT_EQ(tok, u < 0.25 ? 0 : 1) << "t=" << t << " u=" << u;
    }
    Candidates c = candidates(logits);
    ASSERT_EQ(tok, draw(c, u, Isa::Scalar));
  }
  EXPECT_NEAR(ones / static_cast<double>(n), 0.75, 0.03);
}

// ---- token_logprobs --------------------------------------------------------------

TEST(TokenLogprobs, ValuesTopOrderAndNaN) {
  const std::vector<float> logits = {0.0f, std::log(3.0f), NAN, std::log(3.0f), -kInf};
  const LogprobEntry e = token_logprobs(logits, 1, 5, Isa::Scalar);
  EXPECT_EQ(e.chosen.id, 1);
  EXPECT_NEAR(e.chosen.logprob, std::log(3.0 / 7.0), 1e-6);
  ASSERT_EQ(e.top.size(), 5u);
  // Most likely first, the tie (1, 3) by id, NaN and -inf last (NaN counts as -inf).
  EXPECT_EQ(e.top[0].id, 1);
  EXPECT_EQ(e.top[1].id, 3);
  EXPECT_EQ(e.top[2].id, 0);
  EXPECT_EQ(e.top[3].id, 2);
  EXPECT_EQ(e.top[4].id, 4);
  EXPECT_EQ(e.top[0].logprob, e.top[1].logprob);
  EXPECT_NEAR(e.top[2].logprob, std::log(1.0 / 7.0), 1e-6);
  EXPECT_EQ(e.top[3].logprob, -kInf);
  EXPECT_EQ(e.top[4].logprob, -kInf);
  EXPECT_EQ(token_logprobs(logits, 0, 0, Isa::Scalar).top.size(), 0u);
  EXPECT_EQ(token_logprobs(logits, 0, 99, Isa::Scalar).top.size(), 5u);
}

// ---- stages ------------------------------------------------------------------

TEST(Stages, LogitBiasAddsAndMinusInfBans) {
  const SamplerState st;
  auto bias = make_logit_bias({{0, 2.5f}, {3, -kInf}, {0, 0.5f}});
  Candidates c = candidates({1.0f, 2.0f, 3.0f, 4.0f});
  bias->apply(c, st);
  ASSERT_EQ(c.items.size(), 4u);
  EXPECT_EQ(c.items[0].logit, 4.0f);  // 1 + 2.5 + 0.5, in order
  EXPECT_EQ(c.items[1].logit, 2.0f);
  EXPECT_EQ(c.items[2].logit, 3.0f);
  EXPECT_EQ(c.items[3].logit, -kInf);
  EXPECT_FALSE(c.sorted);
  // On a sorted set the canonical order is restored.
  Candidates s = candidates({1.0f, 2.0f, 3.0f, 4.0f});
  s.sort();
  bias->apply(s, st);
  EXPECT_TRUE(s.sorted);
  EXPECT_TRUE(canonical(s));
  EXPECT_EQ(ids_of(s), (std::vector<TokenId>{0, 2, 1, 3}));  // 4, 3, 2, -inf
  EXPECT_EQ(make_logit_bias({}), nullptr);

  // A banned token is never sampled; if all are banned the draw is uniform.
  SamplingParams p = plain();
  p.logit_bias = {{1, -kInf}};
  Sampler sm(p, 3, 0, Isa::Scalar);
  const std::vector<float> logits = {0.0f, 5.0f, 0.0f};
  for (uint64_t t = 0; t < 300; ++t) {
    sm.restore({t, {}});
    ASSERT_NE(sm.sample(logits), 1);
  }
  p.logit_bias = {{0, -kInf}, {1, -kInf}, {2, -kInf}};
  Sampler all(p, 3, 0, Isa::Scalar);
  std::set<TokenId> seen;
  for (uint64_t t = 0; t < 300; ++t) {
    all.restore({t, {}});
    seen.insert(all.sample(logits));
  }
  EXPECT_EQ(seen, (std::set<TokenId>{0, 1, 2}));
}

TEST(Stages, PenaltiesFollowLlamaCppSignRule) {
  // Window: id 0 three times, ids 1, 2, 4 once. repeat 2, frequency 0.5, presence 0.25.
  SamplerState st;
  st.recent = {0, 0, 1, 2, 0, 4};
  auto pen = make_penalties(2.0f, 64, 0.5f, 0.25f);
  ASSERT_NE(pen, nullptr);
  Candidates c = candidates({2.0f, -1.0f, 0.0f, 3.0f, 1.0f});
  pen->apply(c, st);
  ASSERT_EQ(c.items.size(), 5u);
  EXPECT_EQ(c.items[0].logit, 2.0f / 2 - (3 * 0.5f + 0.25f));   // l > 0: divided; -0.75
  EXPECT_EQ(c.items[1].logit, -1.0f * 2 - (1 * 0.5f + 0.25f));  // l <= 0: multiplied; -2.75
  EXPECT_EQ(c.items[2].logit, 0.0f * 2 - (1 * 0.5f + 0.25f));   // -0.75
  EXPECT_EQ(c.items[3].logit, 3.0f);                            // not in the window
  EXPECT_EQ(c.items[4].logit, 1.0f / 2 - (1 * 0.5f + 0.25f));   // -0.25
  EXPECT_EQ(c.items[0].logit, -0.75f);
  EXPECT_EQ(c.items[1].logit, -2.75f);
  EXPECT_EQ(c.items[4].logit, -0.25f);
  // Sorted in, sorted (canonically) out.
  Candidates s = candidates({2.0f, -1.0f, 0.0f, 3.0f, 1.0f});
  s.sort();
  pen->apply(s, st);
  EXPECT_TRUE(s.sorted);
  EXPECT_TRUE(canonical(s));
  EXPECT_EQ(ids_of(s), (std::vector<TokenId>{3, 4, 0, 2, 1}));
  // An empty window changes nothing; the stage is off when it would be a no-op.
  Candidates e = candidates({2.0f, -1.0f});
  pen->apply(e, SamplerState{});
  EXPECT_EQ(e.items[0].logit, 2.0f);
  EXPECT_EQ(make_penalties(1.0f, 64, 0.0f, 0.0f), nullptr);
  EXPECT_EQ(make_penalties(2.0f, 0, 0.5f, 0.5f), nullptr);
  EXPECT_NE(make_penalties(1.0f, 64, 0.0f, 0.1f), nullptr);
}

TEST(Stages, TopKTiesAtTheBoundaryGoToLowestId) {
  const SamplerState st;
  const std::vector<float> logits = {1.0f, 5.0f, 3.0f, 5.0f, 3.0f, 0.0f};
  Candidates c = candidates(logits);
  make_top_k(3)->apply(c, st);
  EXPECT_TRUE(c.sorted);
  EXPECT_EQ(ids_of(c), (std::vector<TokenId>{1, 3, 2}));  // 2 and 4 tie at 3: 2 stays
  Candidates one = candidates(logits);
  make_top_k(1)->apply(one, st);
  EXPECT_EQ(ids_of(one), (std::vector<TokenId>{1}));
  Candidates big = candidates(logits);
  make_top_k(100)->apply(big, st);  // k > vocab: everything, sorted
  EXPECT_EQ(ids_of(big), (std::vector<TokenId>{1, 3, 2, 4, 0, 5}));
  EXPECT_TRUE(big.sorted);
  EXPECT_EQ(make_top_k(0), nullptr);
  EXPECT_EQ(make_top_k(-1), nullptr);
}

TEST(Stages, TopPKeepsTheSmallestHeadReachingP) {
  const SamplerState st;
  // Equal logits: every weight is exactly 1 (logit == l_max), total 4.
  auto run = [&](float p) {
    Candidates c = candidates({0.0f, 0.0f, 0.0f, 0.0f});
    make_top_p(p, Isa::Scalar)->apply(c, st);
    return ids_of(c);
  };
  EXPECT_EQ(run(0.5f), (std::vector<TokenId>{0, 1}));  // cum 2 >= 0.5 * 4: reaching counts
  EXPECT_EQ(run(0.75f), (std::vector<TokenId>{0, 1, 2}));
  EXPECT_EQ(run(0.74f), (std::vector<TokenId>{0, 1, 2}));
  EXPECT_EQ(run(0.76f), (std::vector<TokenId>{0, 1, 2, 3}));
  EXPECT_EQ(run(0.0f), (std::vector<TokenId>{0}));
  EXPECT_EQ(make_top_p(1.0f, Isa::Scalar), nullptr);
  // p = softmax of {0.5, 2, -1, 1.5, 3, 0, -0.5, 2.2, 1, -2}: sorted cum
  // 0.4232 (id 4), 0.6134 (7), 0.7691 (1), 0.8635 (3): p = 0.8 keeps four.
  Candidates c = candidates({0.5f, 2.0f, -1.0f, 1.5f, 3.0f, 0.0f, -0.5f, 2.2f, 1.0f, -2.0f});
  make_top_p(0.8f, Isa::Scalar)->apply(c, st);
  EXPECT_EQ(ids_of(c), (std::vector<TokenId>{4, 7, 1, 3}));
  EXPECT_TRUE(c.sorted);
}

TEST(Stages, MinPKeepsLogitsAboveMaxPlusLnP) {
  const SamplerState st;
  // ln 0.5 = -0.6931: -0.69 stays, -0.70 goes.
  Candidates c = candidates({-0.70f, 0.0f, -0.69f, -5.0f});
  make_min_p(0.5f)->apply(c, st);
  EXPECT_EQ(ids_of(c), (std::vector<TokenId>{1, 2}));  // unsorted in, id order out
  EXPECT_FALSE(c.sorted);
  // p = 1: only the maximum (all of its ties).
  Candidates t = candidates({1.0f, 2.0f, 2.0f, 0.0f});
  make_min_p(1.0f)->apply(t, st);
  EXPECT_EQ(ids_of(t), (std::vector<TokenId>{1, 2}));
  // Sorted in, sorted out. Threshold 3 + ln 0.1 = 0.6974.
  Candidates s = candidates({0.5f, 2.0f, -1.0f, 1.5f, 3.0f, 0.0f, -0.5f, 2.2f, 1.0f, -2.0f});
  s.sort();
  make_min_p(0.1f)->apply(s, st);
  EXPECT_EQ(ids_of(s), (std::vector<TokenId>{4, 7, 1, 3, 8}));
  EXPECT_TRUE(canonical(s));
  EXPECT_EQ(make_min_p(0.0f), nullptr);
}

// Locally typical sampling computed directly in double: p_i = softmax,
// H = -sum p log p, order by |-log p_i - H| (ties by id), keep until the
// cumulative probability exceeds p. Returns the kept ids, ascending.
std::vector<TokenId> typical_reference(const std::vector<float>& logits, double p) {
  const size_t n = logits.size();
  double max = -INFINITY;
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  std::vector<double> pr(n);
  double z = 0.0;
  for (size_t i = 0; i < n; ++i) z += (pr[i] = std::exp(logits[i] - max));
  double h = 0.0;
  for (size_t i = 0; i < n; ++i) {
    pr[i] /= z;
    h -= pr[i] * std::log(pr[i]);
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const double sa = std::fabs(-std::log(pr[a]) - h), sb = std::fabs(-std::log(pr[b]) - h);
    return sa < sb || (sa == sb && a < b);
  });
  std::vector<TokenId> kept;
  double cum = 0.0;
  for (size_t i : order) {
    kept.push_back(static_cast<TokenId>(i));
    cum += pr[i];
    if (cum > p) break;
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

TEST(Stages, TypicalMatchesADirectDoubleComputation) {
  const SamplerState st;
  // p = 0.5537 0.2037 0.1235 0.0276 0.0915, H = 1.2276; by score: 1 (0.364),
  // 0 (0.636), 2 (0.864), 4 (1.164), 3 (2.364); cum 0.2037 0.7574 0.8809 ...
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f, 0.2f};
  const std::vector<std::pair<float, std::vector<TokenId>>> cases = {
      {0.15f, {1}},  // the most likely token is not the most typical one
      {0.5f, {0, 1}},
      {0.8f, {0, 1, 2}},
      {0.95f, {0, 1, 2, 4}},
  };
  for (const auto& [p, want] : cases) {
    EXPECT_EQ(typical_reference(logits, p), want) << p;
    Candidates c = candidates(logits);
    make_typical(p, Isa::Scalar)->apply(c, st);
    EXPECT_TRUE(c.sorted);
    EXPECT_TRUE(canonical(c));
    std::vector<TokenId> got = ids_of(c);
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want) << p;
  }
  EXPECT_EQ(make_typical(1.0f, Isa::Scalar), nullptr);
}

TEST(Stages, TypicalWithEverythingBannedKeepsTheLowestIds) {
  // All 40 logits -inf: equal probabilities, equal scores, so the tie rule
  // keeps ids 0..4 (cum 5/40 > 0.11). (Formerly -inf - -inf gave NaN scores
  // and the kept set depended on std::sort's internals.)
  SamplingParams p = plain();
  p.typical_p = 0.11f;
  std::vector<float> logits(40);
  for (int i = 0; i < 40; ++i) {
    logits[static_cast<size_t>(i)] = static_cast<float>(i);
    p.logit_bias.push_back({i, -kInf});
  }
  Sampler s(p, 1, 0, Isa::Scalar);
  std::set<TokenId> seen;
  for (uint64_t t = 0; t < 500; ++t) {
    s.restore({t, {}});
    seen.insert(s.sample(logits));
  }
  EXPECT_EQ(seen, (std::set<TokenId>{0, 1, 2, 3, 4}));
}

TEST(Stages, TemperatureScalesAndZeroIsGreedy) {
  const SamplerState st;
  Candidates c = candidates({1.0f, -2.0f, 4.0f});
  make_temperature(2.0f)->apply(c, st);
  EXPECT_EQ(c.items[0].logit, 0.5f);
  EXPECT_EQ(c.items[1].logit, -1.0f);
  EXPECT_EQ(c.items[2].logit, 2.0f);
  Candidates g = candidates({1.0f, 4.0f, 4.0f, 0.0f});
  make_temperature(0.0f)->apply(g, st);
  EXPECT_EQ(ids_of(g), (std::vector<TokenId>{1}));  // ties: the lowest id
  // Greedy through the Sampler, also when the order leaves temperature out.
  SamplingParams p = plain();
  p.temp = 0.0f;
  const std::vector<float> logits = {1.0f, 4.0f, 4.0f, 0.0f};
  Sampler a(p, 1, 0, Isa::Scalar);
  p.order = {StageKind::TopK};
  p.top_k = 3;
  Sampler b(p, 1, 0, Isa::Scalar);
  for (uint64_t t = 0; t < 20; ++t) {
    a.restore({t, {}});
    b.restore({t, {}});
    EXPECT_EQ(a.sample(logits), 1);
    EXPECT_EQ(b.sample(logits), 1);
  }
}

TEST(Stages, TemperatureKeepsTheCanonicalOrderWhenDivisionMakesTies) {
  // a and b differ by one ulp; divided by 3.98 they round to one float, and
  // the new tie must go to the lowest id (b, id 0) for the stages after.
  const float a = 1.9999999f;
  const float b = std::nextafter(a, 0.0f);
  ASSERT_LT(b, a);
  ASSERT_EQ(a / 3.98f, b / 3.98f);
  const SamplerState st;
  Candidates c = candidates({b, a});
  c.sort();
  EXPECT_EQ(ids_of(c), (std::vector<TokenId>{1, 0}));
  make_temperature(3.98f)->apply(c, st);
  EXPECT_TRUE(c.sorted);
  EXPECT_TRUE(canonical(c));
  EXPECT_EQ(ids_of(c), (std::vector<TokenId>{0, 1}));
  // Through a chain: top_p 0 after temperature keeps the first in canonical order.
  SamplingParams p = plain();
  p.order = parse_sampler_order("top_k;temperature;top_p");
  p.top_k = 2;
  p.temp = 3.98f;
  p.top_p = 0.0f;
  Sampler s(p, 1, 0, Isa::Scalar);
  EXPECT_EQ(s.sample(std::vector<float>{b, a}), 0);
}

// ---- the chain and its order -----------------------------------------------------

TEST(Chain, ParseAndPrintTheOrder) {
  const SamplingParams def;
  const std::string canon = "penalties;top_k;typ_p;top_p;min_p;temperature";
  EXPECT_EQ(sampler_order_string(def.order), canon);
  EXPECT_EQ(parse_sampler_order(canon), def.order);
  EXPECT_EQ(parse_sampler_order("temp,typical,top_k"),
            (std::vector<StageKind>{StageKind::Temperature, StageKind::TypicalP, StageKind::TopK}));
  EXPECT_EQ(parse_sampler_order("typical_p;min_p"),
            (std::vector<StageKind>{StageKind::TypicalP, StageKind::MinP}));
  EXPECT_EQ(parse_sampler_order(""), std::vector<StageKind>{});
  const std::vector<StageKind> odd = {StageKind::MinP, StageKind::Temperature,
                                      StageKind::Penalties};
  EXPECT_EQ(parse_sampler_order(sampler_order_string(odd)), odd);
  EXPECT_EQ(sampler_order_string(parse_sampler_order("temp,typical")), "temperature;typ_p");
}

TEST(Chain, UnknownOrDuplicateNamesAreInvalidArgument) {
  try {
    parse_sampler_order("top_k;top_x");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("top_x"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_sampler_order("top_k;top_k"), InvalidArgument);
  EXPECT_THROW(parse_sampler_order("typ_p,typical"), InvalidArgument);  // one stage, two names
  EXPECT_THROW(parse_sampler_order("temp;temperature"), InvalidArgument);
  EXPECT_THROW(parse_sampler_order("Top_K"), InvalidArgument);
  // The order may be a client's megabyte: the message quotes it clipped and escaped.
  try {
    parse_sampler_order("top_k;" + std::string(1 << 20, 'z') + "\x1b");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u);
    EXPECT_NE(std::string(e.what()).find("zzz"), std::string::npos) << e.what();
  }
}

TEST(Chain, AppliesStagesInOrder) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.5f, 3.0f, 0.0f, -0.5f, 2.2f, 1.0f, -2.0f};
  const SamplerState st;
  // top_p 0.8 on the logits / 2 keeps six; on the raw logits four.
  SamplerChain scaled_first;
  scaled_first.add(make_temperature(2.0f));
  scaled_first.add(make_top_p(0.8f, Isa::Scalar));
  scaled_first.add(nullptr);  // ignored
  EXPECT_EQ(scaled_first.size(), 2u);
  Candidates a = candidates(logits);
  scaled_first.apply(a, st);
  EXPECT_EQ(ids_of(a), (std::vector<TokenId>{4, 7, 1, 3, 8, 0}));
  SamplerChain cut_first;
  cut_first.add(make_top_p(0.8f, Isa::Scalar));
  cut_first.add(make_temperature(2.0f));
  Candidates b = candidates(logits);
  cut_first.apply(b, st);
  EXPECT_EQ(ids_of(b), (std::vector<TokenId>{4, 7, 1, 3}));
  EXPECT_EQ(b.items[0].logit, 1.5f);
  // A clone applies the same stages.
  auto clone = scaled_first.clone();
  Candidates c = candidates(logits);
  clone->apply(c, st);
  EXPECT_EQ(ids_of(c), ids_of(a));
}

// ---- parameter checks ----------------------------------------------------------

TEST(Params, ValidateNamesTheBadField) {
  EXPECT_NO_THROW(SamplingParams{}.validate(10));
  EXPECT_NO_THROW(plain().validate(10));
  auto expect_bad = [](SamplingParams p, const std::string& word) {
    try {
      p.validate(10);
      ADD_FAILURE() << "expected InvalidArgument mentioning " << word;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  SamplingParams p;
  p.temp = NAN;
  expect_bad(p, "temperature");
  p = {};
  p.temp = -0.1f;
  expect_bad(p, "temperature");
  p = {};
  p.temp = kInf;
  expect_bad(p, "temperature");
  p = {};
  p.top_p = 1.5f;
  expect_bad(p, "top_p");
  p = {};
  p.top_p = NAN;
  expect_bad(p, "top_p");
  p = {};
  p.min_p = -0.1f;
  expect_bad(p, "min_p");
  p = {};
  p.min_p = NAN;
  expect_bad(p, "min_p");
  p = {};
  p.typical_p = 2.0f;
  expect_bad(p, "typical_p");
  p = {};
  p.typical_p = NAN;
  expect_bad(p, "typical_p");
  p = {};
  p.repeat_penalty = 0.0f;
  expect_bad(p, "repeat_penalty");
  p = {};
  p.repeat_penalty = NAN;
  expect_bad(p, "repeat_penalty");
  p = {};
  p.repeat_last_n = -2;
  expect_bad(p, "repeat_last_n");
  p = {};
  p.presence_penalty = NAN;
  expect_bad(p, "presence_penalty");
  p = {};
  p.frequency_penalty = kInf;
  expect_bad(p, "frequency_penalty");
  p = {};
  p.top_k = -5;  // the settings table's range: [0, 2147483647]
  expect_bad(p, "top_k");
  p = {};
  p.logit_bias = {{10, 1.0f}};
  expect_bad(p, "logit bias");
  p = {};
  p.logit_bias = {{-1, 1.0f}};
  expect_bad(p, "logit bias");
  p = {};
  p.logit_bias = {{3, NAN}};
  expect_bad(p, "logit bias");
  p = {};
  p.logit_bias = {{3, kInf}};
  expect_bad(p, "logit bias");
  p = {};
  p.order = {StageKind::TopK, StageKind::MinP, StageKind::TopK};
  expect_bad(p, "twice");
  // Allowed edges.
  p = {};
  p.logit_bias = {{0, -kInf}, {9, 100.0f}};
  p.temp = 0.0f;
  p.top_p = 0.0f;
  p.min_p = 1.0f;
  p.repeat_last_n = -1;
  p.top_k = 0;
  p.order = {};
  EXPECT_NO_THROW(p.validate(10));
}

// ---- the Sampler's state -----------------------------------------------------------

TEST(SamplerState, AcceptAndTheWindow) {
  SamplingParams p = plain();
  p.repeat_last_n = 3;
  Sampler s(p, 1, 0, Isa::Scalar);
  const std::vector<TokenId> prompt = {1, 2, 3, 4};
  s.accept_prompt(prompt);
  EXPECT_EQ(s.state().t, 0u);  // the prompt does not advance t
  EXPECT_EQ(s.state().recent, (std::vector<TokenId>{2, 3, 4}));
  s.accept(5);
  EXPECT_EQ(s.state().t, 1u);
  EXPECT_EQ(s.state().recent, (std::vector<TokenId>{3, 4, 5}));
  s.accept(6);
  EXPECT_EQ(s.state().recent, (std::vector<TokenId>{4, 5, 6}));
  EXPECT_EQ(s.state().t, 2u);
  // sample() does not change the state.
  (void)s.sample(std::vector<float>{0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f});
  EXPECT_EQ(s.state().t, 2u);
  EXPECT_EQ(s.state().recent, (std::vector<TokenId>{4, 5, 6}));
  s.reset();
  EXPECT_EQ(s.state().t, 0u);
  EXPECT_TRUE(s.state().recent.empty());
  EXPECT_EQ(s.seed(), 1u);
  EXPECT_EQ(s.stream(), 0u);
  // repeat_last_n 0: no window at all, t still counts.
  p.repeat_last_n = 0;
  Sampler z(p, 1, 0, Isa::Scalar);
  z.accept_prompt(prompt);
  z.accept(7);
  EXPECT_TRUE(z.state().recent.empty());
  EXPECT_EQ(z.state().t, 1u);
}

TEST(SamplerState, RestoreChecksTheWindow) {
  SamplingParams p = plain();
  p.repeat_last_n = 3;
  Sampler s(p, 1, 0, Isa::Scalar);
  EXPECT_THROW(s.restore({5, {1, 2, 3, 4}}), InvalidArgument);
  EXPECT_EQ(s.state().t, 0u);  // unchanged on failure
  s.restore({5, {1, 2, 3}});
  EXPECT_EQ(s.state().t, 5u);
  EXPECT_EQ(s.state().recent, (std::vector<TokenId>{1, 2, 3}));
  p.repeat_last_n = 0;
  Sampler z(p, 1, 0, Isa::Scalar);
  EXPECT_THROW(z.restore({0, {1}}), InvalidArgument);
}

TEST(SamplerState, RestoredAndCopiedSamplersDrawTheSameTokens) {
  const SamplingParams p = busy_params();
  const std::vector<float> logits = varied_logits(50, 5);
  Sampler a(p, 1234, 2, Isa::Scalar);
  const std::vector<TokenId> prompt = {3, 4, 5};
  a.accept_prompt(prompt);
  std::vector<TokenId> first;
  for (int i = 0; i < 10; ++i) {
    const TokenId t = a.sample(logits);
    first.push_back(t);
    a.accept(t);
  }
  const SamplerState saved = a.state();
  Sampler copy(a);
  std::vector<TokenId> rest_a, rest_copy, rest_restored;
  for (int i = 0; i < 30; ++i) {
    const TokenId t = a.sample(logits);
    rest_a.push_back(t);
    a.accept(t);
  }
  for (int i = 0; i < 30; ++i) {
    const TokenId t = copy.sample(logits);
    rest_copy.push_back(t);
    copy.accept(t);
  }
  Sampler restored(p, 1234, 2, Isa::Scalar);
  restored.restore(saved);
  for (int i = 0; i < 30; ++i) {
    const TokenId t = restored.sample(logits);
    rest_restored.push_back(t);
    restored.accept(t);
  }
  EXPECT_EQ(rest_copy, rest_a);
  EXPECT_EQ(rest_restored, rest_a);
  // The draws do vary (the test would be vacuous otherwise) and the stream counts.
  EXPECT_GT(std::set<TokenId>(rest_a.begin(), rest_a.end()).size(), 3u);
  Sampler other(p, 1234, 3, Isa::Scalar);
  other.restore(saved);
  std::vector<TokenId> rest_other;
  for (int i = 0; i < 30; ++i) {
    const TokenId t = other.sample(logits);
    rest_other.push_back(t);
    other.accept(t);
  }
  EXPECT_NE(rest_other, rest_a);
}

}  // namespace
}  // namespace encore
