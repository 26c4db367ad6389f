// Token selection: a chain of small sampler stages, then one draw from the
// request's counter-based RNG stream (rng.h).
//
// Stages (llama.cpp's names and semantics; `--samplers` picks the order):
//   logit bias    (always first)  l += bias; -inf bans a token
//   penalties     over the last repeat_last_n ids (prompt included, as llama.cpp):
//                 l = l > 0 ? l / repeat : l * repeat; l -= count * frequency + (count > 0) *
//                 presence
//   top_k         keep the k highest logits (k <= 0: off)
//   typ_p         locally typical sampling (p >= 1: off)
//   top_p         nucleus: the smallest top set whose probability reaches p (p >= 1: off)
//   min_p         keep l >= l_max + ln(p) (p <= 0: off)
//   temperature   l /= temp; temp <= 0 keeps only the highest logit (greedy)
// Default order: penalties;top_k;typ_p;top_p;min_p;temperature (llama.cpp's,
// without the stages we do not have).
//
// Determinism (the one place it is written down): every stage orders
// candidates by (logit descending, id ascending), a strict total order, so
// ties always go to the lowest id whatever the sort algorithm. Softmax
// totals are summed over all candidates in ascending id order, cumulative
// sums (top_p, typ_p) in the stage's walking order, all in double. Weights are w_i = exp_f32(l_i -
// l_max), Encore's own float exp (kernels/ops.h: identical bits on every ISA and machine), never
// libm's; logs are log_f64 (kernels/ops_math.h). The result of sample() is a pure function of the
// logits, the params, the sampler state and (seed, stream). A candidate whose logit equals l_max
// gets w = 1 exactly, so a set of only -inf logits (everything banned) draws uniformly instead of
// dividing 0/0.
//
// Draw (the categorical draw, specified here so that any port can follow it):
//   w_i as above for each surviving candidate;
//   total = sum of w in ascending token id order;
//   u = uniform_double(random_words(seed, stream, state.t, 0)) in [0, 1);
//   the token is the first id, ascending, whose running sum exceeds u * total
//   (the last surviving id if rounding leaves none).
//
// Thread-safety: a Sampler is used by one thread at a time; stages are
// immutable after construction and may be shared.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "encore/isa.h"
#include "encore/settings.h"

namespace encore {

using TokenId = int32_t;

// ---- Pure helpers --------------------------------------------------------

// Index of the largest logit; ties go to the lowest id. NaN logits never win;
// -1 if every logit is NaN (callers treat that as a broken model).
int32_t argmax(std::span<const float> logits);

// The chosen token's log-probability under the model's own distribution
// (log-softmax of the raw logits: before bias, penalties, temperature and
// truncation, as vLLM and the OpenAI API report them) and the top_n most
// likely tokens (ties by lowest id), most likely first.
struct TokenLogprob {
  TokenId id = -1;
  float logprob = 0.0f;
  std::string text;  // the token as listings show it (special tokens rendered); set by the
                     // engine (token_logprobs leaves it empty)
};
struct LogprobEntry {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // [top_n]
};
// log Z = l_max + log_f64(sum w_i), w_i = exp_f32(l_i - l_max) summed in
// ascending id order in double; logprob_i = float(l_i - log Z). NaN logits
// count as -inf. Cost: O(n_vocab).
LogprobEntry token_logprobs(std::span<const float> logits, TokenId chosen, int top_n, Isa isa);

// ---- Candidates and stages -----------------------------------------------

struct TokenData {
  TokenId id;
  float logit;
};

// The canonical order: logit descending, ties by id ascending. Strict and
// total (ids are unique), so any sort algorithm gives the same sequence.
inline bool canonical_before(const TokenData& a, const TokenData& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// The set a chain narrows down. Starts as every non-NaN token in id order.
// Invariant kept by every stage: items are in ascending id order when
// !sorted, and in (logit desc, id asc) order when sorted.
struct Candidates {
  std::vector<TokenData> items;
  bool sorted = false;

  void reset(std::span<const float> logits);
  void sort();  // establishes `sorted` (no-op if already)
  // Keeps the first n of the sorted order (n >= 1).
  void keep_top(size_t n);
};

// What stages may read besides the candidates: the sampler state.
struct SamplerState {
  uint64_t t = 0;               // generated tokens so far = counter of the next draw
  std::vector<TokenId> recent;  // penalty window, oldest first (prompt ids included)
};

class SamplerStage {
 public:
  virtual ~SamplerStage() = default;
  virtual std::string_view name() const = 0;
  // Narrows or reshapes `cur`; never leaves it empty.
  virtual void apply(Candidates& cur, const SamplerState& state) const = 0;
  virtual std::unique_ptr<SamplerStage> clone() const = 0;
};

enum class StageKind { Penalties, TopK, TypicalP, TopP, MinP, Temperature };

// "penalties;top_k;typ_p;top_p;min_p;temperature" (also accepts ',' and the
// names typical, typical_p, temp). Throws InvalidArgument naming the bad entry.
std::vector<StageKind> parse_sampler_order(std::string_view text);
std::string sampler_order_string(const std::vector<StageKind>& order);

// Defaults, ranges and help: the settings table (settings.h).
struct SamplingParams {
  float temp = settings::kTemperature.float_default();
  int32_t top_k = settings::kTopK.int_default();
  float top_p = settings::kTopP.float_default();
  float min_p = settings::kMinP.float_default();
  float typical_p = settings::kTypicalP.float_default();
  float repeat_penalty = settings::kRepeatPenalty.float_default();  // 1: off
  int32_t repeat_last_n = settings::kRepeatLastN.int_default();     // 0: off; -1: the whole
                                                                 // context (resolved by the caller)
  float presence_penalty = settings::kPresencePenalty.float_default();
  float frequency_penalty = settings::kFrequencyPenalty.float_default();
  // Added to the logits in this order. -inf is a ban (the token is never
  // drawn while another one is left); a finite bias, even -100, only shifts
  // (llama.cpp's semantics; the OpenAI parser maps OpenAI's -100 to -inf).
  std::vector<std::pair<TokenId, float>> logit_bias;
  std::vector<StageKind> order = {StageKind::Penalties, StageKind::TopK, StageKind::TypicalP,
                                  StageKind::TopP,      StageKind::MinP, StageKind::Temperature};

  // Throws InvalidArgument with field() naming the setting: a value outside
  // its range in the settings table (NaN included), a logit bias id outside
  // [0, n_vocab) or NaN/+inf bias ("logit_bias"), a logit bias that bans
  // (-inf) every id in [0, n_vocab), a stage named twice ("samplers"). Cost:
  // O(entries), plus O(n_vocab) when logit_bias has >= n_vocab entries.
  void validate(int n_vocab) const;
};

// Stages built from params (null when the setting turns the stage off).
std::unique_ptr<SamplerStage> make_logit_bias(std::vector<std::pair<TokenId, float>> bias);
std::unique_ptr<SamplerStage> make_penalties(float repeat, int32_t last_n, float frequency,
                                             float presence);
std::unique_ptr<SamplerStage> make_top_k(int32_t k);
std::unique_ptr<SamplerStage> make_typical(float p, Isa isa);
std::unique_ptr<SamplerStage> make_top_p(float p, Isa isa);
std::unique_ptr<SamplerStage> make_min_p(float p);
std::unique_ptr<SamplerStage> make_temperature(float temp);

// A chain is itself a stage: it applies its stages in order.
class SamplerChain final : public SamplerStage {
 public:
  SamplerChain() = default;
  void add(std::unique_ptr<SamplerStage> stage);  // null is ignored
  size_t size() const { return stages_.size(); }
  std::string_view name() const override { return "chain"; }
  void apply(Candidates& cur, const SamplerState& state) const override;
  std::unique_ptr<SamplerStage> clone() const override;

 private:
  std::vector<std::unique_ptr<SamplerStage>> stages_;
};

// The categorical draw specified at the top of this file.
TokenId draw(const Candidates& cur, double u, Isa isa);

// Uniform double in [0, 1) from two words: 53 random bits, every value a
// multiple of 2^-53, identical on every platform.
double uniform_double(uint32_t hi, uint32_t lo);

// ---- The sampler of one sample of one request ------------------------------

// Ownership: owns its chain and state. Cost of sample(): O(n_vocab) for a
// plain greedy argmax; otherwise O(n_vocab) to build the candidates plus
// O(n_vocab log k) for top_k (partial_sort), then the later stages on what
// survives. Without top_k, top_p sorts as much of the vocabulary as its
// nucleus needs and typ_p sorts all of it (O(n_vocab log n_vocab)).
class Sampler {
 public:
  // params must be validated and repeat_last_n resolved (>= 0).
  // isa: kernels for the exp (speed only: every ISA gives the same bits).
  Sampler(const SamplingParams& params, uint64_t seed, uint32_t stream, Isa isa);
  Sampler(const Sampler& other);
  Sampler& operator=(const Sampler&) = delete;

  // Runs the chain over `logits` ([n_vocab]) and draws with counter
  // state().t. Does not change the state (call accept()). Requires at least
  // one non-NaN logit (returns -1 otherwise).
  TokenId sample(std::span<const float> logits);
  // Prompt ids enter the penalty window only.
  void accept_prompt(std::span<const TokenId> ids);
  // A generated id: enters the window and advances t.
  void accept(TokenId id);
  void reset();  // empty window, t = 0

  const SamplerState& state() const { return state_; }
  // Throws InvalidArgument if the window is longer than repeat_last_n.
  void restore(SamplerState state);
  uint64_t seed() const { return seed_; }
  uint32_t stream() const { return stream_; }

 private:
  void push_recent(TokenId id);

  SamplingParams params_;
  uint64_t seed_;
  uint32_t stream_;
  Isa isa_;
  bool plain_greedy_ = false;  // the chain reduces to argmax (see the constructor)
  SamplerChain chain_;
  SamplerState state_;
  Candidates cur_;  // scratch
};

}  // namespace encore
