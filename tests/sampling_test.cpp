#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "encore/rng.h"
#include "encore/sampler.h"

namespace encore {
namespace {

// Known-answer vectors of Random123's kat_vectors for philox4x32 with 10 rounds.
TEST(Philox, KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Philox4x32Counter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (Philox4x32Counter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
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
}

TEST(Uniform, RangeAndResolution) {
  EXPECT_EQ(uniform_from_word(0), 0.0f);
  EXPECT_LT(uniform_from_word(0xffffffffu), 1.0f);
  EXPECT_EQ(uniform_from_word(0x80000000u), 0.5f);
  EXPECT_EQ(uniform_from_word(0x100u), 1.0f / 16777216.0f);
}

TEST(Argmax, TiesGoToLowestIdAndNaNNeverWins) {
  EXPECT_EQ(argmax(std::vector<float>{1, 3, 3, 2}), 1);
  EXPECT_EQ(argmax(std::vector<float>{NAN, 0.5f, NAN, 0.5f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{-INFINITY, -INFINITY}), 0);
  EXPECT_EQ(argmax(std::vector<float>{NAN, NAN}), -1);
}

TEST(SampleSoftmax, FollowsTheDistribution) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  EXPECT_EQ(sample_softmax(logits, 1.0f, 0.0f), 0);
  EXPECT_EQ(sample_softmax(logits, 1.0f, 0.2499f), 0);
  EXPECT_EQ(sample_softmax(logits, 1.0f, 0.2501f), 1);
  EXPECT_EQ(sample_softmax(logits, 1.0f, 0.9999f), 1);
  // Empirical frequency over a fixed stream is close to 3/4.
  int ones = 0;
  const int n = 20000;
  for (int t = 0; t < n; ++t) {
    ones += sample_softmax(logits, 1.0f, uniform_from_word(random_words(9, 0, t)[0]));
  }
  EXPECT_NEAR(ones / static_cast<double>(n), 0.75, 0.01);
}

TEST(SampleSoftmax, LowTemperatureApproachesArgmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 1.5f};
  for (float u : {0.0f, 0.3f, 0.9f}) EXPECT_EQ(sample_softmax(logits, 1e-3f, u), 1);
}

}  // namespace
}  // namespace encore
