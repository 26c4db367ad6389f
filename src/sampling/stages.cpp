// The sampler stages (sampler.h has their semantics and the ordering
// invariant of Candidates), the stage-order parser and parameter checks.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "encore/error.h"
#include "encore/sampler.h"
#include "kernels/ops.h"
#include "kernels/ops_math.h"
#include "util/text.h"

namespace encore {
namespace {

// Position of `id` in a set, or -1. Binary search in id order, else a scan.
ptrdiff_t find_id(const Candidates& cur, TokenId id) {
  if (!cur.sorted) {
    auto it = std::lower_bound(cur.items.begin(), cur.items.end(), id,
                               [](const TokenData& t, TokenId v) { return t.id < v; });
    return it != cur.items.end() && it->id == id ? it - cur.items.begin() : -1;
  }
  for (size_t i = 0; i < cur.items.size(); ++i) {
    if (cur.items[i].id == id) return static_cast<ptrdiff_t>(i);
  }
  return -1;
}

// w = exp_f32(l - max), and exactly 1 where l == max (an all -inf set is
// then uniform instead of 0/0). Scalar exp_f32 and exp_shifted give the
// same bits.
float weight(float l, float max) { return l == max ? 1.0f : kernels::exp_f32(l - max); }

// The canonical softmax total of a set (sampler.h): the sum of the weights
// of all items in ascending id order, in double. A sorted set is re-ordered
// by id for the sum (sorted sets are small: they follow top_k in the
// default chain).
double weight_total(const Candidates& cur, float max, Isa isa) {
  std::vector<float> w(cur.items.size());  // [n] weights in id order
  if (!cur.sorted) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = cur.items[i].logit;
  } else {
    std::vector<TokenData> byid(cur.items);
    std::sort(byid.begin(), byid.end(),
              [](const TokenData& a, const TokenData& b) { return a.id < b.id; });
    for (size_t i = 0; i < w.size(); ++i) w[i] = byid[i].logit;
  }
  std::vector<float> l(w);  // [n] the logits, to spot l == max
  kernels::exp_shifted(w.data(), w.data(), max, static_cast<int64_t>(w.size()), isa);
  double total = 0.0;
  for (size_t i = 0; i < w.size(); ++i) total += l[i] == max ? 1.0 : static_cast<double>(w[i]);
  return total;
}

// Weights of a sorted set in its order (w[0] = 1); returns weight_total.
double sorted_weights(const Candidates& cur, std::vector<float>& w, Isa isa) {
  const size_t n = cur.items.size();
  w.resize(n);
  for (size_t i = 0; i < n; ++i) w[i] = cur.items[i].logit;
  const float max = cur.items[0].logit;
  kernels::exp_shifted(w.data(), w.data(), max, static_cast<int64_t>(n), isa);
  for (size_t i = 0; i < n; ++i) {
    if (cur.items[i].logit == max) w[i] = 1.0f;
  }
  return weight_total(cur, max, isa);
}

class LogitBias final : public SamplerStage {
 public:
  explicit LogitBias(std::vector<std::pair<TokenId, float>> b) : bias_(std::move(b)) {}
  std::string_view name() const override { return "logit_bias"; }
  void apply(Candidates& cur, const SamplerState&) const override {
    for (const auto& [id, b] : bias_) {
      const ptrdiff_t i = find_id(cur, id);
      if (i >= 0) cur.items[static_cast<size_t>(i)].logit += b;
    }
    if (cur.sorted) {
      cur.sorted = false;
      cur.sort();
    }
  }
  std::unique_ptr<SamplerStage> clone() const override {
    return std::make_unique<LogitBias>(*this);
  }

 private:
  std::vector<std::pair<TokenId, float>> bias_;
};

class Penalties final : public SamplerStage {
 public:
  Penalties(float repeat, float frequency, float presence)
      : repeat_(repeat), frequency_(frequency), presence_(presence) {}
  std::string_view name() const override { return "penalties"; }
  void apply(Candidates& cur, const SamplerState& state) const override {
    if (state.recent.empty()) return;
    std::vector<TokenId> ids(state.recent);  // [window] sorted, then counted in runs
    std::sort(ids.begin(), ids.end());
    for (size_t a = 0; a < ids.size();) {
      size_t b = a;
      while (b < ids.size() && ids[b] == ids[a]) ++b;
      const ptrdiff_t i = find_id(cur, ids[a]);
      if (i >= 0) {
        float& l = cur.items[static_cast<size_t>(i)].logit;
        l = l > 0.0f ? l / repeat_ : l * repeat_;  // llama.cpp's sign rule
        l -= static_cast<float>(b - a) * frequency_ + presence_;
      }
      a = b;
    }
    if (cur.sorted) {
      cur.sorted = false;
      cur.sort();
    }
  }
  std::unique_ptr<SamplerStage> clone() const override {
    return std::make_unique<Penalties>(*this);
  }

 private:
  float repeat_, frequency_, presence_;
};

class TopK final : public SamplerStage {
 public:
  explicit TopK(int32_t k) : k_(k) {}
  std::string_view name() const override { return "top_k"; }
  void apply(Candidates& cur, const SamplerState&) const override {
    cur.keep_top(static_cast<size_t>(k_));
  }
  std::unique_ptr<SamplerStage> clone() const override { return std::make_unique<TopK>(*this); }

 private:
  int32_t k_;
};

// Nucleus: the shortest sorted head whose weight reaches p of the total.
class TopP final : public SamplerStage {
 public:
  TopP(float p, Isa isa) : p_(p), isa_(isa) {}
  std::string_view name() const override { return "top_p"; }
  void apply(Candidates& cur, const SamplerState&) const override {
    float max = -std::numeric_limits<float>::infinity();
    for (const TokenData& t : cur.items) max = std::max(max, t.logit);
    const double target = static_cast<double>(p_) * weight_total(cur, max, isa_);
    // Walk the canonical order until the cumulative weight reaches the
    // target. Without a top_k before, sorting the whole vocabulary would
    // dominate, so the order is built in growing chunks: a partial_sort of
    // the rest puts exactly the next items of the global order in front,
    // so the walk (and the result) is the same as after a full sort.
    auto& it = cur.items;
    const size_t n = it.size();
    size_t done = cur.sorted ? n : 0;  // items [0, done) are in final order
    size_t chunk = 64;
    double cum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      if (i == done) {
        const size_t end = std::min(n, done + chunk);
        std::partial_sort(it.begin() + static_cast<ptrdiff_t>(done),
                          it.begin() + static_cast<ptrdiff_t>(end), it.end(), canonical_before);
        done = end;
        chunk *= 4;
      }
      cum += weight(it[i].logit, max);
      if (cum >= target) {
        it.resize(i + 1);
        break;
      }
    }
    cur.sorted = true;
  }
  std::unique_ptr<SamplerStage> clone() const override { return std::make_unique<TopP>(*this); }

 private:
  float p_;
  Isa isa_;
};

// Locally typical sampling (Meister et al. 2022, llama.cpp's typ_p): keep the
// tokens whose surprisal is closest to the entropy until their probability
// exceeds p. log p_i = (l_i - l_max) - log(total): no per-token log needed.
class Typical final : public SamplerStage {
 public:
  Typical(float p, Isa isa) : p_(p), isa_(isa) {}
  std::string_view name() const override { return "typ_p"; }
  void apply(Candidates& cur, const SamplerState&) const override {
    cur.sort();
    std::vector<float> w;
    const double total = sorted_weights(cur, w, isa_);
    const double log_total = kernels::log_f64(total);
    const double max = cur.items[0].logit;
    const size_t n = w.size();
    std::vector<double> logp(n);  // [n] log p_i (-inf where w = 0)
    double entropy = 0.0;
    for (size_t i = 0; i < n; ++i) {
      // A logit equal to l_max has offset 0 (and w = 1) even when l_max is
      // infinite: -inf - -inf (everything banned) would be NaN, and NaN
      // scores would defeat the tie rule of the sort below.
      const double offset =
          cur.items[i].logit == cur.items[0].logit ? 0.0 : cur.items[i].logit - max;
      logp[i] = w[i] > 0.0f ? offset - log_total : -std::numeric_limits<double>::infinity();
      if (w[i] > 0.0f) entropy -= (w[i] / total) * logp[i];
    }
    std::vector<size_t> order(n);  // by |surprisal - entropy|, ties by id
    for (size_t i = 0; i < n; ++i) order[i] = i;
    auto score = [&](size_t i) { return std::fabs(-logp[i] - entropy); };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const double sa = score(a), sb = score(b);
      return sa < sb || (sa == sb && cur.items[a].id < cur.items[b].id);
    });
    double cum = 0.0;
    size_t keep = n;
    for (size_t j = 0; j < n; ++j) {
      cum += w[order[j]] / total;
      if (cum > static_cast<double>(p_)) {
        keep = j + 1;
        break;
      }
    }
    std::vector<TokenData> kept;
    kept.reserve(keep);
    for (size_t j = 0; j < keep; ++j) kept.push_back(cur.items[order[j]]);
    cur.items = std::move(kept);
    cur.sorted = false;
    cur.sort();  // back to the canonical order
  }
  std::unique_ptr<SamplerStage> clone() const override { return std::make_unique<Typical>(*this); }

 private:
  float p_;
  Isa isa_;
};

// Keeps l >= l_max + ln(p), i.e. probability >= p * the top probability.
class MinP final : public SamplerStage {
 public:
  explicit MinP(float p) : log_p_(kernels::log_f64(p)) {}
  std::string_view name() const override { return "min_p"; }
  void apply(Candidates& cur, const SamplerState&) const override {
    float max = -std::numeric_limits<float>::infinity();
    for (const TokenData& t : cur.items) max = std::max(max, t.logit);
    const double threshold = static_cast<double>(max) + log_p_;
    std::erase_if(cur.items, [&](const TokenData& t) {
      return t.logit != max && static_cast<double>(t.logit) < threshold;
    });
  }
  std::unique_ptr<SamplerStage> clone() const override { return std::make_unique<MinP>(*this); }

 private:
  double log_p_;
};

class Temperature final : public SamplerStage {
 public:
  explicit Temperature(float t) : temp_(t) {}
  std::string_view name() const override { return "temperature"; }
  void apply(Candidates& cur, const SamplerState&) const override {
    if (temp_ <= 0.0f) {  // greedy: the highest logit, ties to the lowest id
      cur.keep_top(1);
      return;
    }
    for (TokenData& t : cur.items) t.logit /= temp_;
    // Division keeps the logit order but not its strictness: two close
    // logits can round to one quotient (or overflow to inf), and such a new
    // tie must go to the lowest id for the stages after this one.
    if (cur.sorted) {
      for (size_t i = 1; i < cur.items.size(); ++i) {
        if (cur.items[i - 1].logit == cur.items[i].logit && cur.items[i - 1].id > cur.items[i].id) {
          cur.sorted = false;
          cur.sort();
          break;
        }
      }
    }
  }
  std::unique_ptr<SamplerStage> clone() const override {
    return std::make_unique<Temperature>(*this);
  }

 private:
  float temp_;
};

struct StageName {
  const char* name;
  StageKind kind;
};
constexpr StageName kStageNames[] = {
    {"penalties", StageKind::Penalties}, {"top_k", StageKind::TopK},
    {"typ_p", StageKind::TypicalP},      {"typical", StageKind::TypicalP},
    {"typical_p", StageKind::TypicalP},  {"top_p", StageKind::TopP},
    {"min_p", StageKind::MinP},          {"temperature", StageKind::Temperature},
    {"temp", StageKind::Temperature},
};

}  // namespace

std::unique_ptr<SamplerStage> make_logit_bias(std::vector<std::pair<TokenId, float>> bias) {
  if (bias.empty()) return nullptr;
  return std::make_unique<LogitBias>(std::move(bias));
}

std::unique_ptr<SamplerStage> make_penalties(float repeat, int32_t last_n, float frequency,
                                             float presence) {
  if (last_n == 0 || (repeat == 1.0f && frequency == 0.0f && presence == 0.0f)) return nullptr;
  return std::make_unique<Penalties>(repeat, frequency, presence);
}

std::unique_ptr<SamplerStage> make_top_k(int32_t k) {
  return k > 0 ? std::make_unique<TopK>(k) : nullptr;
}
std::unique_ptr<SamplerStage> make_typical(float p, Isa isa) {
  return p < 1.0f ? std::make_unique<Typical>(p, isa) : nullptr;
}
std::unique_ptr<SamplerStage> make_top_p(float p, Isa isa) {
  return p < 1.0f ? std::make_unique<TopP>(p, isa) : nullptr;
}
std::unique_ptr<SamplerStage> make_min_p(float p) {
  return p > 0.0f ? std::make_unique<MinP>(p) : nullptr;
}
std::unique_ptr<SamplerStage> make_temperature(float temp) {
  return std::make_unique<Temperature>(temp);
}

std::vector<StageKind> parse_sampler_order(std::string_view text) {
  std::vector<StageKind> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find_first_of(";,", pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view name = text.substr(pos, end - pos);
    if (!name.empty()) {
      const StageName* hit = nullptr;
      for (const StageName& s : kStageNames) {
        if (name == s.name) hit = &s;
      }
      if (!hit) {
        throw InvalidArgument(
            "samplers",
            fmt::format("unknown stage '{}' (known: penalties, top_k, typ_p, top_p, min_p, "
                        "temperature)",
                        util::printable(name, 40)));  // the text may be a client's megabyte
      }
      if (std::find(out.begin(), out.end(), hit->kind) != out.end()) {
        throw InvalidArgument("samplers", fmt::format("stage '{}' is named twice", name));
      }
      out.push_back(hit->kind);
    }
    pos = end + 1;
  }
  return out;
}

std::string sampler_order_string(const std::vector<StageKind>& order) {
  std::string s;
  for (StageKind k : order) {
    for (const StageName& n : kStageNames) {
      if (n.kind == k) {
        if (!s.empty()) s += ';';
        s += n.name;
        break;  // the first name of a kind is its canonical one
      }
    }
  }
  return s;
}

// The defaults of the table are the values SamplingParams always had, bit for bit.
static_assert(settings::kTemperature.float_default() == 0.8f);
static_assert(settings::kTopP.float_default() == 0.95f);
static_assert(settings::kMinP.float_default() == 0.05f);
static_assert(settings::kTypicalP.float_default() == 1.0f);
static_assert(settings::kRepeatPenalty.float_default() == 1.0f);

void SamplingParams::validate(int n_vocab) const {
  visit_settings(*this, [](const settings::Setting& s, auto v) {
    settings::check(s, static_cast<double>(v));
  });
  auto check = [](bool ok, const char* field, const std::string& what) {
    if (!ok) throw InvalidArgument(field, what);
  };
  for (const auto& [id, b] : logit_bias) {
    check(id >= 0 && id < n_vocab, "logit_bias",
          fmt::format("the logit bias token {} is outside the vocabulary [0, {})", id, n_vocab));
    check(!std::isnan(b) && b != std::numeric_limits<float>::infinity(), "logit_bias",
          fmt::format("the logit bias {} of token {} must be a number or -inf", b, id));
  }
  // Every token banned: the draw would fall back to a uniform pick among
  // banned tokens. Only -inf bans (a finite bias, however low, shifts).
  // Counted per distinct id (entries may repeat one); O(n_vocab) memory, and
  // only when there are enough entries to ban them all.
  if (n_vocab > 0 && logit_bias.size() >= static_cast<size_t>(n_vocab)) {
    std::vector<bool> banned(static_cast<size_t>(n_vocab));  // [n_vocab]
    int n_banned = 0;
    for (const auto& [id, b] : logit_bias) {
      if (b != -std::numeric_limits<float>::infinity() || banned[static_cast<size_t>(id)]) continue;
      banned[static_cast<size_t>(id)] = true;
      ++n_banned;
    }
    check(n_banned < n_vocab, "logit_bias",
          fmt::format("the logit bias bans every token of the vocabulary ({} of {} at -inf; -100 "
                      "through the API): nothing is left to sample; ban fewer tokens",
                      n_banned, n_vocab));
  }
  for (size_t i = 0; i < order.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      check(order[i] != order[j], "samplers", "the sampler order names a stage twice");
    }
  }
}

}  // namespace encore
