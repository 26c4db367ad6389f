// Sampling faithfulness and ISA independence (include/encore/sampler.h):
// over many fixed-seed draws, each stage's empirical token frequencies match
// its target distribution computed independently in double (chi-square, so
// every run draws the same numbers and the verdict never flakes), tokens
// outside the surviving set never appear, and every ISA draws the same
// tokens and reports the same logprob bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

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

// ---- faithfulness: empirical frequencies against the exact distribution ----------

// Chi-square critical values at p = 0.001 for df = 1..11 (standard tables,
// e.g. NIST/SEMATECH e-Handbook 1.3.6.7.4): a correct sampler exceeds them
// with probability 1/1000, and with fixed seeds the outcome never changes.
constexpr double kChi2Crit001[] = {0.0,    10.828, 13.816, 16.266, 18.467, 20.515,
                                   22.458, 24.322, 26.124, 27.877, 29.588, 31.264};

// The target distribution computed independently, in double, with libm's
// exp and log, straight from the definitions in sampler.h.
struct Ref {
  std::vector<std::pair<TokenId, double>> c;  // surviving (id, logit)

  void sort() {
    std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
      return a.second > b.second || (a.second == b.second && a.first < b.first);
    });
  }
  std::vector<double> probs() const {  // in the current item order
    double max = -INFINITY;
    for (const auto& x : c) max = std::max(max, x.second);
    std::vector<double> p;
    double z = 0.0;
    for (const auto& x : c) {
      p.push_back(std::exp(x.second - max));
      z += p.back();
    }
    for (double& v : p) v /= z;
    return p;
  }
  void penalties(const std::vector<TokenId>& window, double repeat, double freq, double pres) {
    for (auto& [id, l] : c) {
      const auto n = std::count(window.begin(), window.end(), id);
      if (n == 0) continue;
      l = l > 0 ? l / repeat : l * repeat;
      l -= static_cast<double>(n) * freq + pres;
    }
  }
  void top_k(size_t k) {
    sort();
    if (c.size() > k) c.resize(k);
  }
  void top_p(double p) {
    sort();
    const std::vector<double> pr = probs();
    double cum = 0.0;
    for (size_t i = 0; i < pr.size(); ++i) {
      cum += pr[i];
      if (cum >= p) {
        c.resize(i + 1);
        return;
      }
    }
  }
  void min_p(double p) {
    double max = -INFINITY;
    for (const auto& x : c) max = std::max(max, x.second);
    std::erase_if(c, [&](const auto& x) { return x.second < max + std::log(p); });
  }
  void typical(double p) {
    sort();
    const std::vector<double> pr = probs();
    double h = 0.0;
    for (double v : pr) h -= v * std::log(v);
    std::vector<size_t> order(c.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const double sa = std::fabs(-std::log(pr[a]) - h), sb = std::fabs(-std::log(pr[b]) - h);
      return sa < sb || (sa == sb && c[a].first < c[b].first);
    });
    std::vector<std::pair<TokenId, double>> kept;
    double cum = 0.0;
    for (size_t i : order) {
      kept.push_back(c[i]);
      cum += pr[i];
      if (cum > p) break;
    }
    c = kept;
  }
  void temperature(double t) {
    for (auto& x : c) x.second /= t;
  }
  // Target probability per id (0 outside the surviving set).
  std::vector<double> target(size_t n_vocab) const {
    std::vector<double> out(n_vocab, 0.0);
    const std::vector<double> pr = probs();
    for (size_t i = 0; i < c.size(); ++i) out[static_cast<size_t>(c[i].first)] = pr[i];
    return out;
  }
};

const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 1.5f, 3.0f, 0.0f, -0.5f, 2.2f, 1.0f, -2.0f};
const std::vector<TokenId> kWindow = {4, 4, 1, 9, 2};

Ref ref_start() {
  Ref r;
  for (size_t i = 0; i < kLogits.size(); ++i) r.c.push_back({static_cast<TokenId>(i), kLogits[i]});
  return r;
}

// Draws n tokens with (seed, stream) at t = 0..n-1 and the fixed window.
std::vector<int> draw_counts(const SamplingParams& p, const std::vector<TokenId>& window,
                             uint64_t seed, uint32_t stream, int n) {
  Sampler s(p, seed, stream, detect_best_isa());
  std::vector<int> counts(kLogits.size(), 0);
  for (int t = 0; t < n; ++t) {
    s.restore({static_cast<uint64_t>(t), window});
    const TokenId tok = s.sample(kLogits);
    EXPECT_GE(tok, 0);
    if (tok < 0 || static_cast<size_t>(tok) >= counts.size()) continue;
    ++counts[static_cast<size_t>(tok)];
  }
  return counts;
}

void expect_faithful(const SamplingParams& p, const std::vector<TokenId>& window, const Ref& ref,
                     const std::vector<TokenId>& want_set, uint32_t stream) {
  // The reference itself must agree with the hand-computed surviving set.
  std::vector<TokenId> ref_set;
  for (const auto& x : ref.c) ref_set.push_back(x.first);
  std::sort(ref_set.begin(), ref_set.end());
  ASSERT_EQ(ref_set, want_set);

  const int n = 20000;
  const std::vector<int> counts = draw_counts(p, window, 20240601, stream, n);
  const std::vector<double> target = ref.target(kLogits.size());
  double chi2 = 0.0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (target[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " is outside the surviving set";
      continue;
    }
    const double e = target[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  ASSERT_GE(cells, 1);
  ASSERT_LT(static_cast<size_t>(cells), std::size(kChi2Crit001));
  if (cells == 1) return;  // a single survivor: the count check above is the test
  EXPECT_LT(chi2, kChi2Crit001[cells - 1]) << "df=" << cells - 1;
}

TEST(Faithfulness, Temperature1) {
  expect_faithful(plain(), {}, ref_start(), {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 0);
}

TEST(Faithfulness, Temperature07) {
  SamplingParams p = plain();
  p.temp = 0.7f;
  Ref r = ref_start();
  r.temperature(0.7f);
  expect_faithful(p, {}, r, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 1);
}

TEST(Faithfulness, TopK) {
  SamplingParams p = plain();
  p.top_k = 4;
  Ref r = ref_start();
  r.top_k(4);
  expect_faithful(p, {}, r, {1, 3, 4, 7}, 2);
}

TEST(Faithfulness, TopP) {
  SamplingParams p = plain();
  p.top_p = 0.8f;
  Ref r = ref_start();
  r.top_p(0.8f);  // sorted cum 0.4232 0.6134 0.7691 0.8635
  expect_faithful(p, {}, r, {1, 3, 4, 7}, 3);
}

TEST(Faithfulness, MinP) {
  SamplingParams p = plain();
  p.min_p = 0.1f;
  Ref r = ref_start();
  r.min_p(0.1f);  // threshold 3 + ln 0.1 = 0.697
  expect_faithful(p, {}, r, {1, 3, 4, 7, 8}, 4);
}

TEST(Faithfulness, Typical) {
  SamplingParams p = plain();
  p.typical_p = 0.4f;
  Ref r = ref_start();
  r.typical(0.4f);  // by score: 7 1 3 4 ...; cum 0.190 0.346 0.440: the top token 4 is cut
  expect_faithful(p, {}, r, {1, 3, 7}, 5);
}

TEST(Faithfulness, PenaltiesAndTemperature) {
  SamplingParams p = plain();
  p.repeat_penalty = 1.3f;
  p.frequency_penalty = 0.2f;
  p.presence_penalty = 0.3f;
  p.temp = 0.9f;
  Ref r = ref_start();
  r.penalties(kWindow, 1.3f, 0.2f, 0.3f);
  r.temperature(0.9f);
  expect_faithful(p, kWindow, r, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 6);
}

TEST(Faithfulness, CombinedDefaultOrder) {
  // penalties -> top_k 7 (cuts 2 6 9) -> typ_p 0.95 (cuts 5) -> top_p 0.9
  // (cuts 0) -> min_p 0.35 (cuts 1 8) -> temperature 0.8.
  SamplingParams p = plain();
  p.repeat_penalty = 1.3f;
  p.frequency_penalty = 0.2f;
  p.presence_penalty = 0.3f;
  p.top_k = 7;
  p.typical_p = 0.95f;
  p.top_p = 0.9f;
  p.min_p = 0.35f;
  p.temp = 0.8f;
  Ref r = ref_start();
  r.penalties(kWindow, 1.3f, 0.2f, 0.3f);
  r.top_k(7);
  r.typical(0.95f);
  r.top_p(0.9f);
  r.min_p(0.35f);
  r.temperature(0.8f);
  expect_faithful(p, kWindow, r, {3, 4, 7}, 7);
}

TEST(Faithfulness, TemperatureBeforeTopP) {
  SamplingParams p = plain();
  p.order = parse_sampler_order("temperature;top_p;min_p");
  p.temp = 2.0f;
  p.top_p = 0.8f;
  p.min_p = 0.2f;  // on the scaled logits: threshold 1.5 + ln 0.2 = -0.109 cuts none of the six
  Ref r = ref_start();
  r.temperature(2.0f);
  r.top_p(0.8f);
  r.min_p(0.2f);
  expect_faithful(p, {}, r, {0, 1, 3, 4, 7, 8}, 8);
}

TEST(Faithfulness, LogitBias) {
  SamplingParams p = plain();
  p.logit_bias = {{4, -kInf}, {9, 4.0f}};
  p.top_k = 5;
  Ref r = ref_start();
  std::erase_if(r.c, [](const auto& x) { return x.first == 4; });
  for (auto& x : r.c) {
    if (x.first == 9) x.second += 4.0;
  }
  r.top_k(5);  // 7 (2.2), 9 (2.0), 1 (2.0), 3 (1.5), 8 (1.0)
  expect_faithful(p, {}, r, {1, 3, 7, 8, 9}, 9);
}

// ---- every ISA draws the same tokens and reports the same logprobs ----------------

TEST(Isa, EveryIsaSamplesAndScoresIdentically) {
  const std::vector<Isa> isas = supported_isas();
  const Isa best = detect_best_isa();
  EXPECT_TRUE(std::find(isas.begin(), isas.end(), best) != isas.end());
  if (isas.size() == 1) GTEST_LOG_(INFO) << "only the scalar ISA on this CPU: nothing to compare";

  // 1000 tokens (long enough for the SIMD bodies and tails), some NaN and -inf.
  std::vector<float> logits = varied_logits(1000, 11);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] *= 3.0f;
  logits[17] = NAN;
  logits[500] = -kInf;
  logits[501] = logits[502];  // a tie
  SamplingParams p = busy_params();
  p.top_k = 0;  // let top_p / typical see the whole vocabulary
  p.top_p = 0.9f;
  p.min_p = 0.02f;
  p.repeat_last_n = 16;

  std::vector<std::vector<TokenId>> tokens(isas.size());
  for (size_t k = 0; k < isas.size(); ++k) {
    Sampler s(p, 99, 1, isas[k]);
    for (int i = 0; i < 150; ++i) {
      const TokenId t = s.sample(logits);
      tokens[k].push_back(t);
      s.accept(t);
    }
  }
  for (size_t k = 1; k < isas.size(); ++k) EXPECT_EQ(tokens[k], tokens[0]) << isa_name(isas[k]);
  EXPECT_GT(std::set<TokenId>(tokens[0].begin(), tokens[0].end()).size(), 10u);

  const int n = static_cast<int>(logits.size());
  std::vector<LogprobEntry> e;
  for (Isa isa : isas) e.push_back(token_logprobs(logits, 502, n, isa));
  // Normalised: every id appears once in the full top list.
  ASSERT_EQ(e[0].top.size(), logits.size());
  double sum = 0.0;
  std::set<TokenId> ids;
  for (const TokenLogprob& t : e[0].top) {
    sum += std::exp(static_cast<double>(t.logprob));
    ids.insert(t.id);
  }
  EXPECT_EQ(ids.size(), logits.size());
  EXPECT_NEAR(sum, 1.0, 1e-5);
  // Ordered: logprob descending, ties by id.
  for (size_t i = 1; i < e[0].top.size(); ++i) {
    const TokenLogprob& a = e[0].top[i - 1];
    const TokenLogprob& b = e[0].top[i];
    ASSERT_TRUE(a.logprob > b.logprob || (a.logprob == b.logprob && a.id < b.id)) << i;
  }
  EXPECT_EQ(e[0].chosen.id, 502);
  // The tie 501 == 502 is listed 501 first with the same logprob.
  for (size_t i = 0; i < e[0].top.size(); ++i) {
    if (e[0].top[i].id == 501) {
      ASSERT_LT(i + 1, e[0].top.size());
      EXPECT_EQ(e[0].top[i + 1].id, 502);
      EXPECT_EQ(e[0].top[i + 1].logprob, e[0].top[i].logprob);
      EXPECT_EQ(e[0].chosen.logprob, e[0].top[i].logprob);
    }
  }
  // Bit-identical across ISAs.
  for (size_t k = 1; k < isas.size(); ++k) {
    EXPECT_EQ(std::memcmp(&e[k].chosen.logprob, &e[0].chosen.logprob, sizeof(float)), 0);
    ASSERT_EQ(e[k].top.size(), e[0].top.size());
    for (size_t i = 0; i < e[0].top.size(); ++i) {
      ASSERT_EQ(e[k].top[i].id, e[0].top[i].id) << isa_name(isas[k]) << " " << i;
      ASSERT_EQ(std::memcmp(&e[k].top[i].logprob, &e[0].top[i].logprob, sizeof(float)), 0)
          << isa_name(isas[k]) << " " << i;
    }
  }
}

}  // namespace
}  // namespace encore
