// Candidates, the chain, the draw, logprobs and the Sampler (sampler.h).
// The stages themselves are in stages.cpp.
#include "encore/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "encore/error.h"
#include "encore/rng.h"
#include "kernels/ops.h"
#include "kernels/ops_math.h"

namespace encore {
namespace {

float nan_to_neg_inf(float l) {
  return std::isnan(l) ? -std::numeric_limits<float>::infinity() : l;
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  assert(!logits.empty());
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

double uniform_double(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (static_cast<uint64_t>(hi) << 21) | (lo >> 11);  // 53 bits
  return static_cast<double>(bits) * 0x1p-53;
}

void Candidates::reset(std::span<const float> logits) {
  items.clear();
  items.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isnan(logits[i])) items.push_back({static_cast<TokenId>(i), logits[i]});
  }
  sorted = false;
}

void Candidates::sort() {
  if (sorted) return;
  std::sort(items.begin(), items.end(), canonical_before);
  sorted = true;
}

void Candidates::keep_top(size_t n) {
  assert(n >= 1);
  if (n >= items.size()) {
    sort();
    return;
  }
  if (!sorted) {
    // O(size log n): only the kept head needs ordering.
    std::partial_sort(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(n), items.end(),
                      canonical_before);
    sorted = true;
  }
  items.resize(n);
}

void SamplerChain::add(std::unique_ptr<SamplerStage> stage) {
  if (stage) stages_.push_back(std::move(stage));
}

void SamplerChain::apply(Candidates& cur, const SamplerState& state) const {
  for (const auto& s : stages_) s->apply(cur, state);
}

std::unique_ptr<SamplerStage> SamplerChain::clone() const {
  auto c = std::make_unique<SamplerChain>();
  for (const auto& s : stages_) c->add(s->clone());
  return c;
}

TokenId draw(const Candidates& cur, double u, Isa isa) {
  assert(!cur.items.empty() && u >= 0.0 && u < 1.0);
  // Ascending id order (the spec in sampler.h); a sorted set is re-ordered.
  std::vector<TokenData> byid(cur.items);
  if (cur.sorted) {
    std::sort(byid.begin(), byid.end(),
              [](const TokenData& a, const TokenData& b) { return a.id < b.id; });
  }
  float max = byid[0].logit;
  for (const TokenData& t : byid) max = std::max(max, t.logit);
  std::vector<float> w(byid.size());  // [n candidates] exp weights, id order
  for (size_t i = 0; i < byid.size(); ++i) w[i] = byid[i].logit;
  kernels::exp_shifted(w.data(), w.data(), max, static_cast<int64_t>(w.size()), isa);
  double total = 0.0;
  for (size_t i = 0; i < byid.size(); ++i) {
    if (byid[i].logit == max) w[i] = 1.0f;  // also makes an all -inf set uniform
    total += w[i];
  }
  const double target = u * total;
  double running = 0.0;
  for (size_t i = 0; i < byid.size(); ++i) {
    running += w[i];
    if (running > target) return byid[i].id;
  }
  return byid.back().id;  // only through rounding at u -> 1
}

LogprobEntry token_logprobs(std::span<const float> logits, TokenId chosen, int top_n, Isa isa) {
  assert(!logits.empty() && chosen >= 0 && static_cast<size_t>(chosen) < logits.size());
  const size_t n = logits.size();
  std::vector<float> l(n);  // [n_vocab] logits with NaN as -inf
  float max = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) {
    l[i] = nan_to_neg_inf(logits[i]);
    max = std::max(max, l[i]);
  }
  std::vector<float> w(n);  // [n_vocab]
  kernels::exp_shifted(w.data(), l.data(), max, static_cast<int64_t>(n), isa);
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += l[i] == max ? 1.0 : static_cast<double>(w[i]);
  const double log_z = static_cast<double>(max) + kernels::log_f64(total);
  auto lp = [&](size_t i) { return static_cast<float>(static_cast<double>(l[i]) - log_z); };

  LogprobEntry e;
  e.chosen = {chosen, lp(static_cast<size_t>(chosen)), {}};
  const size_t k = std::min(n, static_cast<size_t>(std::max(top_n, 0)));
  if (k > 0) {
    // The k best in canonical order, kept sorted by insertion: O(n k) worst
    // case, O(n) in practice (most logits lose to the current k-th at once).
    std::vector<TokenData> best;
    best.reserve(k + 1);
    for (size_t i = 0; i < n; ++i) {
      const TokenData t{static_cast<TokenId>(i), l[i]};
      if (best.size() == k && !canonical_before(t, best.back())) continue;
      auto pos = std::upper_bound(best.begin(), best.end(), t, canonical_before);
      best.insert(pos, t);
      if (best.size() > k) best.pop_back();
    }
    e.top.reserve(k);
    for (const TokenData& t : best) e.top.push_back({t.id, lp(static_cast<size_t>(t.id)), {}});
  }
  return e;
}

Sampler::Sampler(const SamplingParams& params, uint64_t seed, uint32_t stream, Isa isa)
    : params_(params), seed_(seed), stream_(stream), isa_(isa) {
  assert(params.repeat_last_n >= 0);
  chain_.add(make_logit_bias(params.logit_bias));
  for (StageKind k : params.order) {
    switch (k) {
      case StageKind::Penalties:
        chain_.add(make_penalties(params.repeat_penalty, params.repeat_last_n,
                                  params.frequency_penalty, params.presence_penalty));
        break;
      case StageKind::TopK:
        chain_.add(make_top_k(params.top_k));
        break;
      case StageKind::TypicalP:
        chain_.add(make_typical(params.typical_p, isa));
        break;
      case StageKind::TopP:
        chain_.add(make_top_p(params.top_p, isa));
        break;
      case StageKind::MinP:
        chain_.add(make_min_p(params.min_p));
        break;
      case StageKind::Temperature:
        chain_.add(make_temperature(params.temp));
        break;
    }
  }
  // Greedy without bias, penalties or typical: every other stage keeps the
  // top token, so the chain's answer is the plain argmax (ties to the lowest
  // id) and the O(n_vocab) candidate set is skipped.
  const auto in_order = [&](StageKind k) {
    return std::find(params.order.begin(), params.order.end(), k) != params.order.end();
  };
  plain_greedy_ = params.temp <= 0.0f && params.logit_bias.empty() &&
                  (!in_order(StageKind::Penalties) ||
                   !make_penalties(params.repeat_penalty, params.repeat_last_n,
                                   params.frequency_penalty, params.presence_penalty)) &&
                  (!in_order(StageKind::TypicalP) || params.typical_p >= 1.0f);
  // Temperature 0 means greedy even when the order leaves the stage out.
  if (params.temp <= 0.0f && std::find(params.order.begin(), params.order.end(),
                                       StageKind::Temperature) == params.order.end()) {
    chain_.add(make_temperature(0.0f));
  }
}

Sampler::Sampler(const Sampler& o)
    : params_(o.params_),
      seed_(o.seed_),
      stream_(o.stream_),
      isa_(o.isa_),
      plain_greedy_(o.plain_greedy_),
      state_(o.state_) {
  chain_.add(o.chain_.clone());
}

TokenId Sampler::sample(std::span<const float> logits) {
  if (plain_greedy_) return argmax(logits);
  cur_.reset(logits);
  if (cur_.items.empty()) return -1;
  chain_.apply(cur_, state_);
  assert(!cur_.items.empty());
  if (cur_.items.size() == 1) return cur_.items[0].id;
  const Philox4x32Counter w = random_words(seed_, stream_, state_.t, 0);
  return draw(cur_, uniform_double(w[0], w[1]), isa_);
}

void Sampler::push_recent(TokenId id) {
  const size_t cap = static_cast<size_t>(params_.repeat_last_n);
  if (cap == 0) return;
  if (state_.recent.size() == cap) state_.recent.erase(state_.recent.begin());
  state_.recent.push_back(id);
}

void Sampler::accept_prompt(std::span<const TokenId> ids) {
  for (TokenId id : ids) push_recent(id);
}

void Sampler::accept(TokenId id) {
  push_recent(id);
  ++state_.t;
}

void Sampler::reset() { state_ = SamplerState{}; }

void Sampler::restore(SamplerState state) {
  if (state.recent.size() > static_cast<size_t>(params_.repeat_last_n)) {
    throw InvalidArgument(
        fmt::format("sampler state: the penalty window holds {} ids but repeat_last_n is {}",
                    state.recent.size(), params_.repeat_last_n));
  }
  state_ = std::move(state);
}

}  // namespace encore
